#pragma once
// JSON through nlohmann-json for checkpoint configs: parsing with a nesting bound, and typed
// reads whose mpt::Error names the file and key (nlohmann's own messages name neither).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mpt/error.hpp"

namespace mpt::io {

/// Documents mpt writes keep Keras's key order (module, class_name, config, ...).
using Json = nlohmann::ordered_json;

constexpr int kMaxJsonDepth = 64;

/// Parses a whole document; mpt::Error naming `what` on malformed text or nesting over 64.
inline Json parse_json(std::string_view text, const std::string& what) {
  try {
    return Json::parse(text, [&](int depth, nlohmann::json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) fail(what, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    fail(what, ": malformed JSON (", e.what(), ")");
  }
}

/// mpt::Error naming `what`, the key path and the innermost enclosing "name" (a layer's) when a
/// number in v is NaN or infinite: JSON has neither (nlohmann writes null, which then fails to load).
template <class J>
void check_json_finite(const J& v, const std::string& what, const std::string& path = "", const std::string& owner = "") {
  if (v.is_number_float()) {
    const double d = v.template get<double>();
    if (!std::isfinite(d))
      fail(what, ": ", path.empty() ? std::string("the value") : "'" + path + "'",
           owner.empty() ? std::string() : " (of '" + owner + "')", " is ", d,
           ", which JSON cannot hold; give it a finite value");
    return;
  }
  if (v.is_object()) {
    std::string name = owner;
    if (const auto it = v.find("name"); it != v.end() && it->is_string()) name = it->template get<std::string>();
    for (auto it = v.begin(); it != v.end(); ++it)
      check_json_finite(it.value(), what, path.empty() ? it.key() : path + "." + it.key(), name);
  } else if (v.is_array()) {
    for (std::size_t i = 0; i < v.size(); ++i) check_json_finite(v[i], what, path + "[" + std::to_string(i) + "]", owner);
  }
}

/// Compact text; mpt::Error naming `what` when a string is not valid UTF-8.
template <class J>
std::string dump_json(const J& v, const std::string& what, int indent = -1) {
  try {
    return v.dump(indent);
  } catch (const nlohmann::json::exception& e) {
    fail(what, ": cannot write JSON (", e.what(), ")");
  }
}

/// The member `key`, or null when absent (or `v` is not an object).
template <class J>
const J* find(const J& v, const std::string& key) {
  if (!v.is_object()) return nullptr;
  auto it = v.find(key);
  return it == v.end() ? nullptr : &*it;
}

/// The member `key`; mpt::Error "<where>: missing '<key>'" when absent.
template <class J>
const J& at(const J& v, const std::string& key, const std::string& where) {
  MPT_CHECK(v.is_object(), where, ": expected an object holding '", key, "', found ", v.type_name());
  const J* m = find(v, key);
  MPT_CHECK(m != nullptr, where, ": missing '", key, "'");
  return *m;
}

template <class J>
const std::string& as_string(const J& v, const std::string& where) {
  MPT_CHECK(v.is_string(), where, ": expected a string, found ", v.type_name());
  return v.template get_ref<const typename J::string_t&>();
}

template <class J>
double as_double(const J& v, const std::string& where) {
  MPT_CHECK(v.is_number(), where, ": expected a number, found ", v.type_name());
  return v.template get<double>();
}

template <class J>
std::int64_t as_int(const J& v, const std::string& where) {
  if (v.is_number_unsigned()) {
    const auto u = v.template get<std::uint64_t>();
    MPT_CHECK(u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), where, ": ", u,
              " is out of range");
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.template get<std::int64_t>();
  if (v.is_number_float()) {  // 3.0 as some writers print integers
    const double d = v.template get<double>();
    MPT_CHECK(std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e18, where, ": expected an integer, found ", d);
    return static_cast<std::int64_t>(d);
  }
  fail(where, ": expected an integer, found ", v.type_name());
}

template <class J>
std::uint64_t as_uint(const J& v, const std::string& where) {
  if (v.is_number_unsigned()) return v.template get<std::uint64_t>();
  const std::int64_t i = as_int(v, where);
  MPT_CHECK(i >= 0, where, ": expected a non-negative integer, found ", i);
  return static_cast<std::uint64_t>(i);
}

template <class J>
bool as_bool(const J& v, const std::string& where) {
  MPT_CHECK(v.is_boolean(), where, ": expected true or false, found ", v.type_name());
  return v.template get<bool>();
}

template <class J>
const J& as_array(const J& v, const std::string& where) {
  MPT_CHECK(v.is_array(), where, ": expected an array, found ", v.type_name());
  return v;
}

/// Loads nothing silently (as Keras's from_config, which passes every field to a constructor):
/// each entry of the config object `c` is one the reader honours, is null, or holds the value
/// `inert` gives it (a field that changes nothing at that value); anything else is an
/// mpt::Error naming `who` and the field.
template <class J>
void check_fields(const J& c, const std::vector<std::string_view>& honoured, const J& inert, const std::string& who) {
  if (!c.is_object()) return;
  for (const auto& [k, v] : c.items()) {
    if (v.is_null() || std::find(honoured.begin(), honoured.end(), k) != honoured.end()) continue;
    const J* at_inert = inert.is_object() ? find(inert, k) : nullptr;
    if (at_inert && *at_inert == v) continue;
    fail(who, ": field ", k, " = ", v.dump(), " is not supported by mpt",
         at_inert ? " (only " + at_inert->dump() + ")" : std::string(" (loading would drop it)"));
  }
}

}  // namespace mpt::io
