#pragma once
// config() values (see Layer::config) shared by the layer files.
#include <cstdio>
#include <string>

#include "mpt/layers/conv.hpp"

namespace mpt::layers::detail {

/// [h, w], as Keras writes kernel_size, strides and pool_size.
inline nlohmann::json json(const IntPair& p) { return nlohmann::json::array({p.h, p.w}); }
/// "[3, 3]" for messages.
inline std::string text(const IntPair& p) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "[%lld, %lld]", static_cast<long long>(p.h), static_cast<long long>(p.w));
  return buf;
}

/// An (h, w) pair read back from a config entry written by json(IntPair) (or a single number).
inline IntPair pair_of(const LayerConfig& c, const std::string& key) {
  auto v = c.get_ints(key);
  MPT_CHECK(v.size() == 1 || v.size() == 2, "layer config of ", c.class_name, " '", c.name, "': '", key,
            "' must hold one or two integers, got ", v.size());
  return v.size() == 1 ? IntPair(v[0]) : IntPair(v[0], v[1]);
}

/// One axis (or dimension), given as a number or a one-element list: Keras's axis=-1 and
/// axis=[-1] are the same; several axes are refused, not cut to the first.
inline std::int64_t one_axis(const LayerConfig& c, const std::string& key) {
  auto v = c.get_ints(key);
  MPT_CHECK(v.size() == 1, c.class_name, " '", c.name, "': ", key, " = ", c.at(key).dump(),
            " is not supported by mpt's ", c.class_name, " (one ", key == "axis" ? "axis" : "entry", ")");
  return v[0];
}

}  // namespace mpt::layers::detail
