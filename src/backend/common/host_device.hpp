#pragma once
// MPT_HOST_DEVICE marks the functions in src/backend/common that both backends run: compiled for
// the GPU as well under nvcc, plain host functions otherwise (the CPU backend and the tests).
#if defined(__CUDACC__)
#define MPT_HOST_DEVICE __host__ __device__
#else
#define MPT_HOST_DEVICE
#endif
