/*
 * cuda_util.cuh - small helpers shared by the CUDA backend's translation
 * units (kernels/cuda_cache.cu, kernels/cuda_apply.cu).  Host side only.
 */
#ifndef FUSEDROPE_CUDA_UTIL_CUH
#define FUSEDROPE_CUDA_UTIL_CUH

#include <cuda_runtime.h>

#include "internal.h"

/* Turns a failed runtime call into a library status: allocation failures
 * become FUSEDROPE_ERR_NOMEM, everything else FUSEDROPE_ERR_CUDA.  Clears the
 * runtime's (non-sticky) last error so the next call starts clean. */
static inline fusedrope_status fr_cuda_fail(cudaError_t err, const char *what)
{
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "%s: out of device memory (%s)", what,
                       cudaGetErrorString(err));
    return fr_fail(FUSEDROPE_ERR_CUDA, "%s failed: %s (%s)", what, cudaGetErrorName(err),
                   cudaGetErrorString(err));
}

#endif /* FUSEDROPE_CUDA_UTIL_CUH */
