/*
 * cuda_util.cuh - small helpers shared by the CUDA backend's translation
 * units (kernels/cuda_cache.cu, kernels/cuda_apply.cu, kernels/cuda_norm_*.cu).
 * Host side only; the emulated builds take kernels/cuda_emu.h instead.
 */
#ifndef FUSEDROPE_CUDA_UTIL_CUH
#define FUSEDROPE_CUDA_UTIL_CUH

#include <cuda_runtime.h>

#include "internal.h"

/*
 * The runtime records each failed call's error as the host thread's "last
 * error" (what cudaGetLastError returns and clears), replacing whatever was
 * recorded before.  That record belongs to the caller: the library takes
 * each runtime call's own return value (kernels are launched with
 * cudaLaunchKernelEx, whose return value is that launch's own, never
 * checked with cudaGetLastError, which would report and erase a caller's
 * earlier, unrelated error as the library's), and reports failures through
 * its status.  Only right after one of its own calls has failed, when the
 * record holds that call's error (the caller's earlier one already
 * replaced), does it take the record back, so that no error of the
 * library's is left behind for the caller's next cudaGetLastError.
 */
static inline void fr_cuda_forget(cudaError_t err)
{
    if (err != cudaSuccess)
        (void)cudaGetLastError();
}

/* Turns a failed runtime call into a library status: allocation failures
 * become FUSEDROPE_ERR_NOMEM, everything else FUSEDROPE_ERR_CUDA. */
static inline fusedrope_status fr_cuda_fail(cudaError_t err, const char *what)
{
    fr_cuda_forget(err);
    if (err == cudaErrorMemoryAllocation)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "%s: out of device memory (%s)", what,
                       cudaGetErrorString(err));
    return fr_fail(FUSEDROPE_ERR_CUDA, "%s failed: %s (%s)", what, cudaGetErrorName(err),
                   cudaGetErrorString(err));
}

#endif /* FUSEDROPE_CUDA_UTIL_CUH */
