/*
 * cuda_device.cuh - the current-device rule of every CUDA call (plain and
 * norm), for kernels/cuda_apply.cu and kernels/cuda_norm.cu in both their
 * builds: after cuda_util.cuh (a GPU build) or cuda_emu.h (the host
 * emulation, whose one device is 0), which give fr_cuda_fail.
 */
#ifndef FUSEDROPE_CUDA_DEVICE_CUH
#define FUSEDROPE_CUDA_DEVICE_CUH

#include "internal.h"

/* The calling thread's current device: the runtime's (a host-side read of
 * the thread's state, no device round trip), or 0 in the emulation, whose one
 * device is 0. */
static inline cudaError_t fr_cuda_current_device(int *dev)
{
#ifdef FR_CUDA_EMULATE
    *dev = 0;
    return cudaSuccess;
#else
    return cudaGetDevice(dev);
#endif
}

/* A call's launches go to the current device, while the cache's memory is on
 * its own: every call (plain and norm) refuses another current device before
 * it launches or writes anything.  *dev: the current device. */
static inline fusedrope_status fr_cuda_check_device(const fusedrope_cache *cache, int *dev)
{
    const cudaError_t err = fr_cuda_current_device(dev);
    if (err != cudaSuccess)
        return fr_cuda_fail(err, "cudaGetDevice");
    if (*dev != cache->cuda_device)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "the cache was created on CUDA device %d but device %d is current in this "
                       "thread; call cudaSetDevice(%d) before using it",
                       cache->cuda_device, *dev, cache->cuda_device);
    return FUSEDROPE_OK;
}

#endif /* FUSEDROPE_CUDA_DEVICE_CUH */
