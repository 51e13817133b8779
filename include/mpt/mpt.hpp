#pragma once
/// mpt: Keras's training API in C++, built around mixed precision. The umbrella header.
///
///   #include <mpt/mpt.hpp>
///   auto x = mpt::Tensor::random_normal({4, 8}, 0, 1, /*seed=*/1, mpt::bfloat16);
#include "mpt/autograd.hpp"
#include "mpt/device.hpp"
#include "mpt/dtype.hpp"
#include "mpt/error.hpp"
#include "mpt/half.hpp"
#include "mpt/memory.hpp"
#include "mpt/ops.hpp"
#include "mpt/nn_ops.hpp"
#include "mpt/tensor.hpp"
#include "mpt/variable.hpp"
#include "mpt/mixed_precision/policy.hpp"
#include "mpt/mixed_precision/loss_scale_optimizer.hpp"
#include "mpt/optimizers/optimizers.hpp"
#include "mpt/optimizers/schedules.hpp"
#include "mpt/losses/losses.hpp"
#include "mpt/metrics/metrics.hpp"
#include "mpt/data/data.hpp"
#include "mpt/layers/layer.hpp"
#include "mpt/layers/core.hpp"
#include "mpt/layers/conv.hpp"
#include "mpt/layers/merge.hpp"
#include "mpt/functional.hpp"
#include "mpt/model.hpp"
#include "mpt/callbacks.hpp"
