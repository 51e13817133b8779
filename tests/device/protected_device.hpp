#pragma once
// The test device (mpt::Device::test()): the CPU kernels behind a backend whose memory host
// code cannot touch. Its tensors live in an arena that is PROT_NONE except while a backend call
// runs, so host code that reads or writes device memory outside the backend faults (a SIGSEGV
// that names the address); it counts transfers to and from the host so tests can bound the
// host reads of a code path. Registered by the test suite only.
#include <cstdint>

namespace mpt::test {

struct TransferCounts {
  std::int64_t to_host = 0;    ///< device-to-host copies and values handed back (has_nonfinite)
  std::int64_t from_host = 0;  ///< host-to-device copies
};

/// True once the test device's backend is registered (it registers itself at start-up).
bool test_device_registered();
TransferCounts transfers();
void reset_transfers();

}  // namespace mpt::test
