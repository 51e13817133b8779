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
#include "mpt/tensor.hpp"
