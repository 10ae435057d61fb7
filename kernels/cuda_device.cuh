/*
 * cuda_device.cuh - the current-device rule of every CUDA call (plain and
 * norm), and a tuning knob's value in either build (FR_CHOICE), for
 * kernels/cuda_apply.cu and kernels/cuda_norm_*.cu in both their builds:
 * after cuda_util.cuh (a GPU build) or cuda_emu.h (the host emulation, whose
 * one device is 0), which give fr_cuda_fail.
 */
#ifndef FUSEDROPE_CUDA_DEVICE_CUH
#define FUSEDROPE_CUDA_DEVICE_CUH

#include <string.h>

#include "internal.h"

/* The build's choice `build`, or where emulated a test's `emu` (-1: the
 * build's). */
#ifdef FR_CUDA_EMULATE
#define FR_CHOICE(emu, build) ((emu) >= 0 ? (emu) : (build))
#else
#define FR_CHOICE(emu, build) (build)
#endif

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

#ifndef FR_CUDA_EMULATE
/* Device attribute attr of device dev (> 0), asked of the runtime once per
 * device and kept in kept[64] (each kernel file keeps its own copies, which
 * is harmless: the same answers); `otherwise` when the query fails. */
static inline int fr_cuda_attribute_kept(int dev, cudaDeviceAttr attr, int *kept, int otherwise)
{
    int n = 0;
    if (dev >= 0 && dev < 64 && (n = __atomic_load_n(&kept[dev], __ATOMIC_RELAXED)) > 0)
        return n;
    const cudaError_t err = cudaDeviceGetAttribute(&n, attr, dev);
    if (err != cudaSuccess || n <= 0) {
        fr_cuda_forget(err);
        return otherwise;
    }
    if (dev >= 0 && dev < 64)
        __atomic_store_n(&kept[dev], n, __ATOMIC_RELAXED);
    return n;
}
#endif

/* Streaming multiprocessors of device dev, which pick launch shapes (never
 * results); 132 (an H100) when the query fails.  The emulation's count is
 * the tests' fr_emu_sms. */
static inline int fr_cuda_sm_count(int dev)
{
#ifdef FR_CUDA_EMULATE
    (void)dev;
    return fr_emu_sms;
#else
    static int kept[64];
    return fr_cuda_attribute_kept(dev, cudaDevAttrMultiProcessorCount, kept, 132);
#endif
}

/* The compute capability's major number of device dev; 0 when the query
 * fails (no feature of a later architecture is then used).  The
 * emulation's is 9. */
static inline int fr_cuda_cc_major(int dev)
{
#ifdef FR_CUDA_EMULATE
    (void)dev;
    return 9;
#else
    static int kept[64];
    return fr_cuda_attribute_kept(dev, cudaDevAttrComputeCapabilityMajor, kept, 0);
#endif
}

/* The virtual architecture (cudaFuncAttributes.ptxVersion: 90 for
 * compute_90) of the code that device dev (the current one) runs for kernel
 * func, asked once per device and kept in kept[64]; 0 when the query fails.
 * A build with compute_80 code alone runs on an H100 JIT-compiled from that
 * PTX and reports 80: code that exists only from sm_90 on (griddepcontrol)
 * is not in it, whatever the device's compute capability.  The emulation's
 * is 90, as its fr_cuda_cc_major is 9. */
static inline int fr_cuda_code_arch(int dev, const void *func, int *kept)
{
#ifdef FR_CUDA_EMULATE
    (void)dev;
    (void)func;
    (void)kept;
    return 90;
#else
    int n = 0;
    cudaFuncAttributes fa;
    if (dev >= 0 && dev < 64 && (n = __atomic_load_n(&kept[dev], __ATOMIC_RELAXED)) > 0)
        return n;
    const cudaError_t err = cudaFuncGetAttributes(&fa, func);
    if (err != cudaSuccess || fa.ptxVersion <= 0) {
        fr_cuda_forget(err);
        return 0;
    }
    if (dev >= 0 && dev < 64)
        __atomic_store_n(&kept[dev], fa.ptxVersion, __ATOMIC_RELAXED);
    return fa.ptxVersion;
#endif
}

/* Programmatic dependent launch (compute capability 9.0 and later): a
 * kernel launched with fr_cuda_pdl_attr's attribute may start while the
 * kernel before it in the stream ends, so before its first read of global
 * memory it waits (fr_pdl_wait) for that kernel's end and writes; the
 * kernel before it may let it launch early (fr_pdl_launch_dependents).
 * Without the attribute, or before sm_90, or emulated (one launch after
 * another), both are nothing. */
static __device__ __forceinline__ void fr_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void fr_pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
#ifdef FR_CUDA_EMULATE
/* A test's judge of each emulated prefetch (fr_prefetch_l2): nonzero where
 * [p, p + bytes) is a row the call reads; NULL: none.  (Defined with the
 * norm kernels' emulation: kernels/cuda_norm_forward.cu.) */
extern "C" int (*fr_emu_prefetch_check)(const void *p, unsigned bytes);
#endif

/* A hint that the `bytes` at p will be read soon: on sm_90 and later one
 * bulk prefetch into L2 (cp.async.bulk.prefetch.L2), which holds no
 * register and on which no result depends, so a warp can have rows on their
 * way from DRAM beyond those its registers wait for; before sm_90 nothing.
 * p must be 16-byte aligned and bytes a multiple of 16, as the device asks.
 * Emulated, it refuses what the device refuses, asks the test's judge
 * (fr_emu_prefetch_check) whether the bytes are a row of the call, and reads
 * them, so that ASan and valgrind flag a prefetch past what it may read. */
static __device__ __forceinline__ void fr_prefetch_l2(const void *p, unsigned bytes)
{
#ifdef FR_CUDA_EMULATE
    if (((uintptr_t)p & 15u) != 0 || bytes % 16 != 0) {
        fprintf(stderr, "cuda_emu: a bulk prefetch of %u bytes at %p: refused\n", bytes, p);
        abort();
    }
    if (fr_emu_prefetch_check != nullptr && !fr_emu_prefetch_check(p, bytes)) {
        fprintf(stderr, "cuda_emu: a prefetch of %u bytes at %p: not a row the call reads\n",
                bytes, p);
        abort();
    }
    unsigned char sum = 0;
    for (unsigned i = 0; i < bytes; i++)
        sum = (unsigned char)(sum + ((const volatile unsigned char *)p)[i]);
    (void)sum;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* no memory clobber: it changes no byte, and the loads around it may
     * move past it */
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(p)),
                 "r"(bytes));
#else
    (void)p;
    (void)bytes;
#endif
}

/* cfg's attributes: the one in *a, allowing a programmatic dependent
 * launch, where on (else none). */
static inline void fr_cuda_pdl_attr(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *a, bool on)
{
    if (!on)
        return;
    memset(a, 0, sizeof *a);
    a->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a->val.programmaticStreamSerializationAllowed = 1;
    cfg->attrs = a;
    cfg->numAttrs = 1;
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
