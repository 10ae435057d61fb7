/*
 * cuda_index.cuh - the kernels' index arithmetic, one place for both kernel
 * files (kernels/cuda_apply.cu, kernels/cuda_norm.cu).  Included inside each
 * file's anonymous namespace, after cuda_emu.h or the CUDA headers.
 */
#ifndef FUSEDROPE_CUDA_INDEX_CUH
#define FUSEDROPE_CUDA_INDEX_CUH

/* q = a / d and r = a % d for a >= 0, d >= 1: in 32 bits when both fit, a
 * few instructions instead of the 64-bit division's call. */
__device__ __forceinline__ void divmod(int64_t a, int64_t d, int64_t *q, int64_t *r)
{
    if (((uint64_t)a | (uint64_t)d) <= UINT32_MAX) {
        const uint32_t q32 = (uint32_t)a / (uint32_t)d;
        *q = (int64_t)q32;
        *r = a - (int64_t)q32 * d;
    } else {
        *q = a / d;
        *r = a - *q * d;
    }
}

#endif
