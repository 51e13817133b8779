#include <cstdio>

#include "config_values.hpp"
#include "mpt/layers/conv.hpp"
#include "mpt/nn_ops.hpp"

namespace mpt::layers {
namespace {

class ZeroPadding2DLayer : public Layer {
 public:
  ZeroPadding2DLayer(Padding2D p, LayerOptions o) : Layer("ZeroPadding2D", o.dtype, o.name), p_(p) {
    if (p.top < 0 || p.bottom < 0 || p.left < 0 || p.right < 0) error("padding must be >= 0, got ", padding_text());
  }
  Tensor call(const Tensor& x, bool) override {
    if (x.dim() != 4) error("expected an input of rank 4 (batch, height, width, channels), got shape ", to_string(x.shape()));
    return ops::zero_pad2d(x, p_.top, p_.bottom, p_.left, p_.right);
  }
  nlohmann::json config() const override {
    return {{"padding", {{p_.top, p_.bottom}, {p_.left, p_.right}}}, {"data_format", "channels_last"}};
  }

 private:
  std::string padding_text() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "[[%lld, %lld], [%lld, %lld]]", static_cast<long long>(p_.top),
                  static_cast<long long>(p_.bottom), static_cast<long long>(p_.left), static_cast<long long>(p_.right));
    return buf;
  }
  Padding2D p_;
};

const bool registered = [] {
  register_layer("ZeroPadding2D", [](const LayerConfig& c) {
    c.expect("data_format", "channels_last");
    Padding2D p;
    if (c.has("padding")) {
      // [[top, bottom], [left, right]], [h, w] or one number
      const std::string w = "layer config of ZeroPadding2D '" + c.name + "', 'padding'";
      std::vector<std::int64_t> v;
      const nlohmann::json& j = c.at("padding");
      auto add = [&](const nlohmann::json& x) {
        MPT_CHECK(x.is_number_integer(), w, " must hold integers, got ", j.dump());
        v.push_back(x.get<std::int64_t>());
      };
      if (j.is_array()) {
        for (const auto& x : j)
          if (x.is_array()) {
            for (const auto& y : x) add(y);
          } else {
            add(x);
          }
      } else {
        add(j);
      }
      MPT_CHECK(v.size() == 1 || v.size() == 2 || v.size() == 4, w, " must hold 1, 2 or 4 integers, got ", j.dump());
      p = v.size() == 1 ? Padding2D(v[0]) : v.size() == 2 ? Padding2D(v[0], v[1]) : Padding2D({v[0], v[1]}, {v[2], v[3]});
    }
    return ZeroPadding2D(p, {.dtype = c.dtype, .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef ZeroPadding2D(Padding2D padding, LayerOptions o) { return std::make_shared<ZeroPadding2DLayer>(padding, std::move(o)); }

}  // namespace mpt::layers
