/*
 * cuda_cache.cu - the CUDA backend's runtime side: device presence, pointer
 * classification, and the device half of a cache (table upload, download,
 * release, and the out-of-table flag the kernels raise).
 *
 * A rope type's table is built here on the device by the same double
 * fr_angle lib/cache.c uses on the host, so a CUDA cache holds exactly the
 * float32 values a CPU cache holds.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "internal.h"
#include "cuda_util.cuh"

/* 0: not asked yet, 1: no usable device, 2: a device is present. */
static int device_state;

extern "C" int fr_cuda_device_present(void)
{
    int state = __atomic_load_n(&device_state, __ATOMIC_ACQUIRE);
    if (state == 0) {
        int n = 0;
        cudaError_t err = cudaGetDeviceCount(&n);
        if (err != cudaSuccess) {
            /* No driver, no device, driver too old: all mean "no CUDA". */
            fr_cuda_forget(err);
            n = 0;
        }
        state = n > 0 ? 2 : 1;
        /* Racing first callers compute the same answer; either store wins. */
        __atomic_store_n(&device_state, state, __ATOMIC_RELEASE);
    }
    return state == 2;
}

/* Set once this process has a CUDA cache: 1, or 2 when the environment
 * said FUSEDROPE_CUDA_POINTER_CHECKS=0 at that moment.  Until then no
 * pointer is asked about: a program that uses only CPU caches never
 * initialises CUDA (no context, no cost, no trouble after fork). */
static int cuda_in_use;

/* What the first CUDA cache of the process sets cuda_in_use to.  Each query
 * (cudaPointerGetAttributes, up to 7 per call) costs host time on every
 * decode step (bench/RESULTS.md); a caller whose pointers are right by
 * construction may skip them, losing only the "host memory on a CUDA cache"
 * and "device memory on a CPU cache" errors (fusedrope_forward(3)). */
static int in_use_state(void)
{
    const char *v = getenv("FUSEDROPE_CUDA_POINTER_CHECKS");
    return v != NULL && v[0] == '0' && v[1] == '\0' ? 2 : 1;
}

extern "C" int fr_cuda_pointer_kind(const void *p, int *device)
{
    cudaPointerAttributes attr;
    cudaError_t err;
    int state;

    *device = -1;
    if (p == NULL || !(state = __atomic_load_n(&cuda_in_use, __ATOMIC_ACQUIRE)))
        return FR_PTR_HOST;
    if (state == 2)
        return FR_PTR_UNCHECKED;
    err = cudaPointerGetAttributes(&attr, p);
    if (err == cudaErrorInvalidValue) {
        /* Older runtimes report plain host memory this way. */
        fr_cuda_forget(err);
        return FR_PTR_HOST;
    }
    if (err != cudaSuccess) {
        fr_cuda_forget(err);
        fr_fail(FUSEDROPE_ERR_CUDA, "cudaPointerGetAttributes: %s", cudaGetErrorString(err));
        return FR_PTR_ERROR;
    }
    if (attr.type == cudaMemoryTypeManaged)
        return FR_PTR_MANAGED;
    if (attr.type == cudaMemoryTypeHost && attr.devicePointer == p)
        return FR_PTR_PINNED; /* registered memory may have another device address */
    if (attr.type != cudaMemoryTypeDevice)
        return FR_PTR_HOST;
    *device = attr.device;
    return FR_PTR_DEVICE;
}

/*
 * A cache's memory belongs to the device that was current when it was made
 * (cache->cuda_device).  The calls that only manage that memory or wait for
 * it (copy_table, destroy, cache_check) make that device current for their
 * runtime calls and give the caller's back (copy_table and check fail if
 * they cannot; destroy, which has no status, goes on), so they work from
 * any thread whatever device it has selected; forward and backward, which
 * enqueue on the caller's stream, refuse a different current device
 * instead (fr_cuda_apply).  enter_device returns the caller's device in
 * *prev.
 */
static cudaError_t enter_device(int dev, int *prev)
{
    cudaError_t err = cudaGetDevice(prev);
    if (err == cudaSuccess && *prev != dev)
        err = cudaSetDevice(dev);
    return err;
}

static cudaError_t restore_device(int dev, int prev)
{
    return prev == dev ? cudaSuccess : cudaSetDevice(prev);
}

/* restore_device for a call with a status: one that could not give the
 * caller's device back fails with it (the thread is left on a device it
 * did not choose), unless it had already failed. */
static fusedrope_status leave_device(int dev, int prev, fusedrope_status st, const char *call)
{
    const cudaError_t err = restore_device(dev, prev);
    char what[96];
    if (err == cudaSuccess)
        return st;
    if (st != FUSEDROPE_OK) {
        fr_cuda_forget(err);
        return st;
    }
    snprintf(what, sizeof what, "%s: making device %d current again (cudaSetDevice)", call, prev);
    return fr_cuda_fail(err, what);
}

/* Table row p, pair i: the same fr_angle as the CPU's build, so the same bits. */
static __global__ void build_table(const double *inv, double attn, int64_t positions, int64_t half,
                            float *cos, float *sin)
{
    const int64_t n = positions * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = e / half, i = e - p * half;
        fr_angle(p, inv[i], attn, &cos[e], &sin[e]);
    }
}

/* n rounded up to a multiple of 256; 0 when that does not fit in size_t. */
static size_t round256(size_t n) { return n > SIZE_MAX - 255 ? 0 : (n + 255) & ~(size_t)255; }

/*
 * The device half of a cache is one allocation (cudaMalloc of large blocks
 * costs more than building the table in them, bench/RESULTS.md): the inverse
 * frequencies, then cos, then sin, then the axes map, each 256-byte aligned.  A user table is
 * copied in; a rope type's table is built in place by build_table, in
 * double, like the CPU's.  The range flag is a word of mapped pinned host
 * memory of its own, which the kernels raise and the host reads without a
 * copy.
 */
extern "C" fusedrope_status fr_cuda_cache_upload(fusedrope_cache *cache)
{
    const size_t half = (size_t)(cache->rot_dim / 2);
    const size_t table_bytes = (size_t)cache->max_positions * half * sizeof(float);
    const int user_table = cache->max_positions > 0 && cache->cos != NULL && cache->sin != NULL;
    const int built_table = cache->max_positions > 0 && cache->cos == NULL && cache->inv_freq != NULL;
    const size_t inv_bytes = cache->inv_freq != NULL ? round256(half * sizeof(double)) : 0;
    const size_t tab = user_table || built_table ? round256(table_bytes) : 0;
    const size_t map_bytes = cache->pair_map != NULL ? round256(half * sizeof(int32_t)) : 0;
    char *block = NULL;
    float *dcos = NULL, *dsin = NULL;
    double *dinv = NULL;
    int32_t *dmap = NULL;
    int *flag = NULL, *flag_dev = NULL;
    int dev = 0;
    fusedrope_status st;
    cudaError_t err;

    if ((err = cudaGetDevice(&dev)) != cudaSuccess)
        return fr_cuda_fail(err, "cudaGetDevice");
    if ((user_table || built_table) &&
        (tab == 0 || tab > (SIZE_MAX - inv_bytes - map_bytes) / 2))
        return fr_fail(FUSEDROPE_ERR_RANGE, "a cos/sin table of %zu bytes does not fit in memory",
                       table_bytes);
    if (inv_bytes + 2 * tab + map_bytes > 0) {
        if ((err = cudaMalloc((void **)&block, inv_bytes + 2 * tab + map_bytes)) != cudaSuccess) {
            block = NULL;
            st = fr_cuda_fail(err, "cudaMalloc of the cache's device memory");
            goto fail;
        }
        if (inv_bytes)
            dinv = (double *)block;
        if (tab) {
            dcos = (float *)(block + inv_bytes);
            dsin = (float *)(block + inv_bytes + tab);
        }
        if (map_bytes)
            dmap = (int32_t *)(block + inv_bytes + 2 * tab);
    }
    if (dmap != NULL &&
        (err = cudaMemcpy(dmap, cache->pair_map, half * sizeof(int32_t), cudaMemcpyHostToDevice)) !=
            cudaSuccess) {
        st = fr_cuda_fail(err, "cudaMemcpy of the axes map to the device");
        goto fail;
    }
    if (dinv != NULL &&
        (err = cudaMemcpy(dinv, cache->inv_freq, half * sizeof(double), cudaMemcpyHostToDevice)) !=
            cudaSuccess) {
        st = fr_cuda_fail(err, "cudaMemcpy of the inverse frequencies to the device");
        goto fail;
    }
    if (user_table &&
        ((err = cudaMemcpy(dcos, cache->cos, table_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
         (err = cudaMemcpy(dsin, cache->sin, table_bytes, cudaMemcpyHostToDevice)) != cudaSuccess)) {
        st = fr_cuda_fail(err, "cudaMemcpy of the cos/sin table to the device");
        goto fail;
    }
    if (built_table) {
        const int64_t n = cache->max_positions * (int64_t)half;
        const int64_t blocks = (n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)blocks);
        cfg.blockDim = dim3(256);
        cfg.stream = 0;
        if ((err = cudaLaunchKernelEx(&cfg, build_table, (const double *)dinv,
                                      cache->attention_factor, cache->max_positions,
                                      (int64_t)half, dcos, dsin)) != cudaSuccess) {
            st = fr_cuda_fail(err, "building the cos/sin table on the device");
            goto fail;
        }
    }
    /* A cudaMemcpy from pageable memory may return before its DMA has
     * landed (CUDA's "API synchronization behavior"), and a caller's kernel
     * on a non-blocking stream is not ordered after the legacy stream: the
     * cache is complete on the device only after this wait, for the user
     * table, the frequencies and the axes map as for the built table. */
    if (block != NULL && (err = cudaStreamSynchronize(0)) != cudaSuccess) {
        st = fr_cuda_fail(err, built_table ? "building the cos/sin table on the device"
                                           : "waiting for the cache's uploads to the device");
        goto fail;
    }
    if ((err = cudaHostAlloc((void **)&flag, sizeof(int), cudaHostAllocMapped)) !=
        cudaSuccess) {
        flag = NULL;
        st = fr_cuda_fail(err, "cudaHostAlloc of the range flag");
        goto fail;
    }
    *flag = 0;
    if ((err = cudaHostGetDevicePointer((void **)&flag_dev, flag, 0)) != cudaSuccess) {
        st = fr_cuda_fail(err, "cudaHostGetDevicePointer of the range flag");
        goto fail;
    }

    free(cache->cos);
    free(cache->sin);
    cache->dev_block = block;
    cache->cos = dcos;
    cache->sin = dsin;
    cache->inv_freq_dev = dinv;
    cache->pair_map_dev = dmap;
    cache->range_flag = flag;
    cache->range_flag_dev = flag_dev;
    cache->device = FUSEDROPE_DEVICE_CUDA;
    cache->cuda_device = dev;
    if (!__atomic_load_n(&cuda_in_use, __ATOMIC_ACQUIRE))
        __atomic_store_n(&cuda_in_use, in_use_state(), __ATOMIC_RELEASE);
    return FUSEDROPE_OK;

fail:
    if (block)
        fr_cuda_forget(cudaFree(block));
    if (flag)
        fr_cuda_forget(cudaFreeHost(flag));
    return st;
}

extern "C" fusedrope_status fr_cuda_cache_download(const fusedrope_cache *cache, float *cos,
                                                   float *sin)
{
    size_t bytes = (size_t)cache->max_positions * (size_t)(cache->rot_dim / 2) * sizeof(float);
    fusedrope_status st = FUSEDROPE_OK;
    cudaError_t err;
    int prev;

    if (bytes == 0 || cache->cos == NULL || cache->sin == NULL)
        return FUSEDROPE_OK;
    if ((err = enter_device(cache->cuda_device, &prev)) != cudaSuccess)
        return fr_cuda_fail(err, "selecting the cache's device for fusedrope_cache_copy_table");
    if ((err = cudaMemcpy(cos, cache->cos, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (err = cudaMemcpy(sin, cache->sin, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
        st = fr_cuda_fail(err, "cudaMemcpy of the cos/sin table to the host");
    return leave_device(cache->cuda_device, prev, st, "fusedrope_cache_copy_table");
}

extern "C" void fr_cuda_cache_release(fusedrope_cache *cache)
{
    /* Freed on their own device; if it cannot be selected, freeing anyway
     * is the best left to do (the runtime finds a pointer's device itself
     * where it can). */
    int prev = cache->cuda_device;
    cudaError_t err = enter_device(cache->cuda_device, &prev);
    if (err != cudaSuccess) {
        fr_cuda_forget(err);
        prev = cache->cuda_device;
    }
    if (cache->dev_block)
        fr_cuda_forget(cudaFree(cache->dev_block));
    if (cache->range_flag)
        fr_cuda_forget(cudaFreeHost(cache->range_flag));
    fr_cuda_forget(restore_device(cache->cuda_device, prev)); /* destroy has no status */
    cache->dev_block = NULL;
    cache->cos = cache->sin = NULL;
    cache->inv_freq_dev = NULL;
    cache->range_flag = cache->range_flag_dev = NULL;
    cache->pair_map_dev = NULL;
}

extern "C" fusedrope_status fr_cuda_cache_check(const fusedrope_cache *cache, void *stream)
{
    /* On the cache's device: a NULL stream is that device's default stream. */
    int prev;
    fusedrope_status st;
    cudaError_t err = enter_device(cache->cuda_device, &prev);
    if (err != cudaSuccess)
        return fr_cuda_fail(err, "selecting the cache's device for fusedrope_cache_check");
    err = cudaStreamSynchronize((cudaStream_t)stream);
    st = err == cudaSuccess ? FUSEDROPE_OK
                            : fr_cuda_fail(err, "cudaStreamSynchronize in fusedrope_cache_check");
    /* on failure the flag stays as it is, for the next check */
    if ((st = leave_device(cache->cuda_device, prev, st, "fusedrope_cache_check")) != FUSEDROPE_OK)
        return st;
    if (cache->range_flag == NULL)
        return FUSEDROPE_OK;
    /* Read and clear in one step: a second check reports OK. */
    if (__atomic_exchange_n(cache->range_flag, 0, __ATOMIC_SEQ_CST) != 0)
        return fr_fail(FUSEDROPE_ERR_RANGE,
                       "fusedrope_cache_check: a kernel met a position outside the table "
                       "(max_positions %lld) or a token outside every sequence; its rotated "
                       "channels were written as NaN",
                       (long long)cache->max_positions);
    return FUSEDROPE_OK;
}
