#include <cstdio>

#include "mpt/layers/core.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class DropoutLayer : public Layer {
 public:
  DropoutLayer(double rate, DropoutOptions o)
      : Layer("Dropout", o.dtype, o.name), rate_(rate), seed_(o.seed ? *o.seed : detail::next_seed()) {
    if (!(rate >= 0.0 && rate < 1.0)) error("rate must be in [0, 1), got ", rate);
  }
  Tensor call(const Tensor& x, bool training) override {
    if (!training || rate_ == 0.0) return x;
    // A new mask per call, drawn on x's device: the layer's seed, the call count as the offset.
    Tensor u = Tensor::random_uniform(x.shape(), 0.0, 1.0, seed_, float32, x.device(), calls_++);
    Tensor keep = ops::greater_equal(u, Tensor::scalar(rate_, float32, x.device()));
    Tensor zero = Tensor::scalar(0.0, x.dtype(), x.device());
    return ops::where(keep, ops::mul(x, Tensor::scalar(1.0 / (1.0 - rate_), x.dtype(), x.device())), zero);
  }
  nlohmann::json config() const override { return {{"rate", rate_}, {"seed", seed_}, {"noise_shape", nullptr}}; }
  std::vector<std::uint64_t> rng_state() const override { return {calls_}; }
  void set_rng_state(const std::vector<std::uint64_t>& s) override {
    if (s.size() != 1) error("expected 1 random-state value, got ", s.size());
    calls_ = s[0];
  }

 private:
  double rate_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
};

}  // namespace

LayerRef Dropout(double rate, DropoutOptions o) { return std::make_shared<DropoutLayer>(rate, std::move(o)); }

}  // namespace mpt::layers
