#pragma once
// The loss-scale rule as one host-and-device function: the CPU backend runs this body, the
// CUDA backend runs it in a one-thread kernel, so the scale evolves identically on every device.
#include <cstdint>

#include "backend/common/host_device.hpp"

namespace mpt::kernels {

/// One step of dynamic loss scaling (Keras's rule; hysteresis 1 is Keras): a step with a
/// non-finite gradient resets the good-step count and, after `hysteresis` such steps in a row,
/// halves the scale (not below min_scale); `growth_steps` finite steps in a row double it (not
/// above max_scale). `dynamic` false leaves the scale as it is. inv_scale is kept as 1 / scale.
MPT_HOST_DEVICE inline void loss_scale_step(float& scale, float& inv_scale, std::int64_t& good_steps,
                                            std::int64_t& overflows, bool found_nonfinite, bool dynamic,
                                            std::int64_t growth_steps, std::int64_t hysteresis,
                                            double min_scale, double max_scale) {
  double s = scale;
  if (found_nonfinite) {
    good_steps = 0;
    if (dynamic && ++overflows >= hysteresis) {
      s = s / 2 < min_scale ? min_scale : s / 2;
      overflows = 0;
    }
  } else {
    overflows = 0;
    if (dynamic && ++good_steps >= growth_steps) {
      s = s * 2 > max_scale ? max_scale : s * 2;
      good_steps = 0;
    }
  }
  scale = static_cast<float>(s);
  inv_scale = static_cast<float>(1.0 / s);
}

}  // namespace mpt::kernels
