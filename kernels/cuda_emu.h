/*
 * cuda_emu.h - just enough of CUDA for a host C++ compiler to build
 * kernels/cuda_apply.cu and kernels/cuda_norm.cu (with FR_CUDA_EMULATE
 * defined) and run their kernels on the CPU, one thread after another.  This is how CI, which has no GPU, runs
 * the kernels' code: their indexing, launch shapes, path choice and
 * arithmetic (tests/test_apply_emu).  It cannot stand in for a GPU run: no
 * memory model, no concurrency, no sanitizer (tests/test_cuda and
 * compute-sanitizer on a device do that).
 *
 * What it relies on: the kernels use no shared memory, barriers, warp
 * intrinsics or atomics, so every thread is independent and running them in
 * sequence gives what the device gives; the fp16/bf16 conversion intrinsics
 * of cuda_fp16.h and cuda_bf16.h have host definitions.
 */
#ifndef FUSEDROPE_CUDA_EMU_H
#define FUSEDROPE_CUDA_EMU_H

#include <cstdio>
#include <cstdlib>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include "internal.h"

/* The emulated backend's entry point gets its own name, so that a test can
 * link it next to the library's real (or stub) fr_cuda_apply (whose link
 * name lib/symbols.h sets). */
#undef fr_cuda_apply
#define fr_cuda_apply fr_emu_cuda_apply
#undef fr_cuda_norm_forward
#define fr_cuda_norm_forward fr_emu_cuda_norm_forward
#undef fr_cuda_norm_backward
#define fr_cuda_norm_backward fr_emu_cuda_norm_backward

/* The CUDA headers give a host compiler attribute spellings of these; here
 * they mean nothing.  (Their types, cudaStream_t, cudaError_t and
 * cudaLaunchConfig_t, stay; the one runtime function called,
 * cudaLaunchKernelEx, is defined below, so nothing links against the
 * runtime.) */
#undef __global__
#undef __device__
#undef __forceinline__
#undef __grid_constant__
#undef __launch_bounds__
#undef __maxnreg__
#define __global__
#define __device__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __maxnreg__(n)

template <typename T> static inline T __ldg(const T *p) { return *p; }

/* The built-in variables, per host thread (tests may call from several). */
static thread_local uint3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;

/* Streaming multiprocessors the launcher plans for: a test sets it to see
 * other launch shapes (the real backend asks the device). */
extern "C" int fr_emu_sms;

/* The launch cuda_apply.cu uses, with the typed signature of cuda_runtime.h's
 * cudaLaunchKernelEx (the arguments converted to the kernel's parameter
 * types once, as the launch copies them): the kernel runs to the end, one
 * thread at a time, before it returns.  A launch the device would refuse
 * (the limits of compute capability 8.0 and later, and the kernels'
 * 512-thread launch bounds) runs nothing and returns an error, as the
 * device's launch does (the code is cudaErrorInvalidConfiguration here
 * whatever the reason; a device may name some reasons otherwise).  Dynamic
 * shared memory and launch attributes are not emulated: a launch with them
 * is refused too.  The stream is ignored. */
template <typename... ExpTypes, typename... ActTypes>
static cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config,
                                      void (*kernel)(ExpTypes...), ActTypes &&...args)
{
    const dim3 grid = config->gridDim, block = config->blockDim;
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 512 ||
        block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u ||
        config->dynamicSmemBytes != 0 || config->numAttrs != 0) {
        fprintf(stderr, "cuda_emu: a launch the device would refuse: grid (%u, %u, %u), block "
                        "(%u, %u, %u)\n", grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return cudaErrorInvalidConfiguration;
    }
    return [&](ExpTypes... params) {
        gridDim = grid;
        blockDim = block;
        for (unsigned bz = 0; bz < grid.z; bz++)
            for (unsigned by = 0; by < grid.y; by++)
                for (unsigned bx = 0; bx < grid.x; bx++)
                    for (unsigned tz = 0; tz < block.z; tz++)
                        for (unsigned ty = 0; ty < block.y; ty++)
                            for (unsigned tx = 0; tx < block.x; tx++) {
                                blockIdx = make_uint3(bx, by, bz);
                                threadIdx = make_uint3(tx, ty, tz);
                                kernel(params...);
                            }
        return cudaSuccess;
    }(std::forward<ActTypes>(args)...);
}

static inline fusedrope_status fr_cuda_fail(cudaError_t err, const char *what)
{
    return fr_fail(FUSEDROPE_ERR_CUDA, "%s failed (emulated error %d)", what, err);
}

#endif /* FUSEDROPE_CUDA_EMU_H */
