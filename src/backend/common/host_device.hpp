#pragma once
// MPT_HOST_DEVICE marks the functions in src/backend/common that both backends run: compiled for
// the GPU as well under nvcc, plain host functions otherwise (the CPU backend and the tests).
#if defined(__CUDACC__)
#define MPT_HOST_DEVICE __host__ __device__
#else
#define MPT_HOST_DEVICE
#endif
#if defined(__CUDA_ARCH__)  // nvcc's device pass (the host pass hands pragmas to the host compiler)
#define MPT_UNROLL _Pragma("unroll")
#else
#define MPT_UNROLL
#endif
// MPT_UNROLL before a loop of a compile-time trip count: nvcc unrolls it, so that a small array
// indexed by the loop's counter stays in registers (the host compilers choose for themselves).
