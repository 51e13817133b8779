// cuDNN's fused attention forward (src/backend/cuda/attention_plans.hpp) planned for the H100 of
// tests/data/cuda/h100_sm90.json (cuDNN's own serialization of an H100 80GB HBM3): for the
// attention shapes of the char_transformer example, the GPT-mini of issue 26 and the head dims
// transformers use, causal and not, float16 and bfloat16, forward and backward. cuDNN's fused
// attention engines (global index 1 and 2 for the forward, 6 and 7 for the backward on 9.19)
// compile their kernels at run time through the driver, so on a machine without one (CI) the proof is that cuDNN's support checks all pass
// and only the missing driver stops the plan (CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_
// MISSING, where a graph they do not take stops at GRAPH_PATTERN, DATA_TYPE or ARCH_MISMATCH);
// where a driver is present (the GPU machine) execution plans must finalize. Negative controls:
// an sm_75 (T4) description, float32 and head dims mpt does not send to cuDNN.
// Holds for any cuDNN >= 9.8 (device descriptions); an older runtime says so and skips.
#include <dlfcn.h>

#include <string>
#include <vector>

#include "backend/cuda/attention_plans.hpp"
#include "cuda/device_descriptions.hpp"

using namespace mpt;
using namespace mpt::test;
using namespace mpt::cuda::attention;
namespace cudnn = mpt::cuda::cudnn;

namespace {

bool have_device_descriptions() {
  const std::size_t v = cudnn::runtime_version();
  if (v >= cudnn::kDevicePropVersion) return true;
  MESSAGE("cuDNN ", cudnn::version_string(v), " loaded (< 9.8): no device descriptions, checks skipped");
  return false;
}

/// Whether the CUDA driver library loads here (cuDNN's runtime-compiled engines need it).
bool have_driver() {
  static const bool yes = [] {
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h) dlclose(h);
    return h != nullptr;
  }();
  return yes;
}

/// Whether one of cuDNN's fused attention engines plans k (9.19: the forward on global index 1,
/// Ampere and later, and 2, Hopper; the backward on 6 and 7): planned, or (without a driver)
/// stopped only by the missing driver.
bool fused_engine_takes(const SdpaKey& k, const std::string& device_json) {
  bool takes = false;
  for (std::int64_t engine : k.backward ? std::vector<std::int64_t>{6, 7} : std::vector<std::int64_t>{1, 2}) {
    const cudnnStatus_t s = sdpa_engine_status(k, {nullptr, cudnn::device_properties(device_json)}, engine);
    MESSAGE(describe(k), ": cuDNN engine ", engine, " says ", std::string(cudnnGetErrorString(s)));
    takes = takes || s == CUDNN_STATUS_SUCCESS ||
            (!have_driver() && s == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING);
  }
  return takes;
}


}  // namespace

TEST_CASE("cuda attention plans: cuDNN plans the fused SDPA forward and backward for an H100, causal or not, 16-bit") {
  if (!have_device_descriptions()) return;
  struct Case {
    const char* where;
    std::int64_t b, h, sq, skv, d;
  };
  const Case cases[] = {
      {"GPT-mini (issue 26)", 16, 4, 256, 256, 64},
      {"char_transformer", 32, 4, 128, 128, 32},
      {"cross-attention, Tq != Tk", 2, 8, 64, 96, 64},
      {"head dim 128", 4, 8, 512, 512, 128},
  };
  // float16 on the first shape only: the engines take both 16-bit types alike, and each key
  // costs cuDNN most of a second to plan (a third of this test's time went to float16 repeats).
  for (const auto& c : cases)
    for (DType dt : {DType::BFloat16, DType::Float16})
      if (dt == DType::BFloat16 || &c == &cases[0])
      for (bool causal : {false, true})
      for (int pass : {0, 1, 2}) {  // forward, deterministic backward, backward with a dQ accumulator
        SdpaKey k{.batch = c.b, .heads = c.h, .q_len = c.sq, .kv_len = c.skv, .head_dim = c.d, .value_dim = c.d,
                  .dtype = dt, .causal = causal, .deterministic = pass != 2, .backward = pass > 0};
        CAPTURE(describe(k));
        REQUIRE(sdpa_candidate(k));
        CHECK(fused_engine_takes(k, h100()));
        if (have_driver()) {
          const int n = sdpa_plan_count(k, h100());
          MESSAGE(c.where, ": ", describe(k), ": ", n, " plans on the H100");
          CHECK(n >= 1);
        }
      }
}

TEST_CASE("cuda attention plans: negative controls (bfloat16 on sm_75; what mpt does not ask cuDNN for)") {
  if (!have_device_descriptions()) return;
  SdpaKey k{.batch = 2, .heads = 2, .q_len = 64, .kv_len = 64, .head_dim = 64, .value_dim = 64,
            .dtype = DType::BFloat16, .causal = true};
  CHECK(sdpa_plan_count(k, kT4) == 0);
  CHECK_FALSE(fused_engine_takes(k, kT4));
  CHECK(fused_engine_takes(k, h100()));
  SdpaKey odd = k;
  odd.head_dim = odd.value_dim = 20;  // not a multiple of 8: own kernels
  CHECK_FALSE(sdpa_candidate(odd));
  SdpaKey f32 = k;
  f32.dtype = DType::Float32;
  CHECK_FALSE(sdpa_candidate(f32));
  CHECK(contains(error_of([&] { sdpa_plan_count(f32, h100()); }), "float16 or bfloat16"));
}
