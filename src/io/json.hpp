#pragma once
// A small JSON reader/writer for checkpoint configs. Numbers keep their source text, so
// uint64 seeds and %.17g doubles round-trip exactly; the parser bounds nesting depth and
// reports malformed text as mpt::Error instead of crashing.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mpt::io::json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;  ///< a number's source text, or a string's content
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;

  // Out of line: members holds pairs of this (then incomplete) type, which clang's library
  // checks cannot instantiate inline.
  Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;
  ~Value();

  bool is_null() const { return kind == Kind::Null; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Number; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  /// The member `key`, or null when absent (or this is not an object).
  const Value* find(const std::string& key) const;
  /// The member `key`; mpt::Error "<where>: missing '<key>'" when absent.
  const Value& at(const std::string& key, const std::string& where) const;
  const std::string& as_string(const std::string& where) const;
  double as_double(const std::string& where) const;
  std::int64_t as_int(const std::string& where) const;
  std::uint64_t as_uint(const std::string& where) const;
  bool as_bool(const std::string& where) const;
  const std::vector<Value>& as_array(const std::string& where) const;
};

/// Parses a whole document; mpt::Error naming `what` on malformed text or nesting over 64.
Value parse(std::string_view text, const std::string& what);
/// Whether `text` is exactly one JSON value (surrounding spaces allowed).
bool is_json(std::string_view text);
/// Compact text of a value ("[3, 3]", "{\"a\": 1}").
std::string dump(const Value& v);

/// A JSON string literal.
std::string quote(std::string_view s);
/// Exact text of numbers (%.17g; non-finite values become null).
std::string number(double v);
std::string number(std::int64_t v);
std::string number(std::uint64_t v);
inline std::string number(int v) { return number(static_cast<std::int64_t>(v)); }
inline std::string boolean(bool v) { return v ? "true" : "false"; }

/// Builds an object's text member by member: {"a": 1, "b": "x"}.
class ObjectWriter {
 public:
  ObjectWriter& raw(const std::string& key, const std::string& json_text);
  ObjectWriter& str(const std::string& key, const std::string& value) { return raw(key, quote(value)); }
  std::string done() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace mpt::io::json
