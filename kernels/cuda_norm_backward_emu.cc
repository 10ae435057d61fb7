/*
 * cuda_norm_backward_emu.cc - kernels/cuda_norm_backward.cu built by the host C++
 * compiler, its kernels run on the CPU (kernels/cuda_emu.h), for tests
 * without a GPU.  Not part of the library.
 */
#define FR_CUDA_EMULATE 1
#include "cuda_norm_backward.cu"
