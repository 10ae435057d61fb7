/*
 * cuda_emu.h - just enough of CUDA for a host C++ compiler to build
 * kernels/cuda_apply.cu and kernels/cuda_norm.cu (with FR_CUDA_EMULATE
 * defined) and run their kernels on the CPU, one thread after another.  This is how CI, which has no GPU, runs
 * the kernels' code: their indexing, launch shapes, path choice and
 * arithmetic (tests/test_apply_emu).  It cannot stand in for a GPU run: no
 * memory model, no concurrency, no sanitizer (tests/test_cuda and
 * compute-sanitizer on a device do that).
 *
 * What it relies on: the kernels use no shared memory, barriers or atomics,
 * so a thread depends on no other but through warp shuffles, and running the
 * threads in sequence gives what the device gives; the fp16/bf16 conversion
 * intrinsics of cuda_fp16.h and cuda_bf16.h have host definitions.  A kernel
 * that shuffles is launched with fr_emu_launch_lockstep (below): each warp's
 * 32 threads run as fibers that meet at every shuffle, so each reads the
 * value its partner had there, as on the device.
 */
#ifndef FUSEDROPE_CUDA_EMU_H
#define FUSEDROPE_CUDA_EMU_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

#include <ucontext.h>
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define FR_EMU_VALGRIND 1
#endif
#endif

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
static bool fr_emu_refused(const cudaLaunchConfig_t *config)
{
    const dim3 grid = config->gridDim, block = config->blockDim;
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 512 ||
        block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u ||
        config->dynamicSmemBytes != 0 || config->numAttrs != 0) {
        fprintf(stderr, "cuda_emu: a launch the device would refuse: grid (%u, %u, %u), block "
                        "(%u, %u, %u)\n", grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return true;
    }
    return false;
}

template <typename... ExpTypes, typename... ActTypes>
static cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config,
                                      void (*kernel)(ExpTypes...), ActTypes &&...args)
{
    const dim3 grid = config->gridDim, block = config->blockDim;
    if (fr_emu_refused(config))
        return cudaErrorInvalidConfiguration;
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

/* ------------------------------------------------- warps in lockstep */

/*
 * A fiber's context and the switch between two.  On x86-64, the registers
 * the ABI has a callee keep (rbx, rbp, r12-r15, the SSE and x87 control
 * words) pushed on the fiber's own stack and its stack pointer saved: a
 * switch is a few instructions, where ucontext's swapcontext also makes a
 * system call (the signal mask), which made a lockstep test run 7 times
 * slower.  Elsewhere, ucontext.
 */
#if defined(__x86_64__)
struct FrEmuCtx {
    void *sp;
};
extern "C" void fr_emu_ctx_switch(FrEmuCtx *from, FrEmuCtx *to) __asm__("fr_emu_ctx_switch_x64");
__asm__(".text\n"
        ".p2align 4\n"
        ".type fr_emu_ctx_switch_x64, @function\n"
        "fr_emu_ctx_switch_x64:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq (%rsi), %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size fr_emu_ctx_switch_x64, .-fr_emu_ctx_switch_x64\n");

/* A context that, switched to, calls entry() on the stack [base, base + n):
 * the frame fr_emu_ctx_switch pops, returning into entry as if called (the
 * stack 16-byte aligned at the call), with this thread's control words. */
static void fr_emu_ctx_init(FrEmuCtx *c, char *base, size_t n, void (*entry)())
{
    uintptr_t top = ((uintptr_t)base + n) & ~(uintptr_t)15;
    void **f = (void **)(top - 16); /* entry's return address slot; top - 8: unused */
    uint32_t cw[2] = { 0, 0 };
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(cw[0]), "=m"(cw[1]));
    f[0] = (void *)entry;
    for (int r = 1; r <= 6; r++)
        f[-r] = nullptr; /* rbp, rbx, r12-r15 */
    memcpy(&f[-7], cw, sizeof cw);
    c->sp = &f[-7];
}
#else
struct FrEmuCtx {
    ucontext_t uc;
};
static void fr_emu_ctx_switch(FrEmuCtx *from, FrEmuCtx *to) { swapcontext(&from->uc, &to->uc); }
static void fr_emu_ctx_init(FrEmuCtx *c, char *base, size_t n, void (*entry)())
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = base;
    c->uc.uc_stack.ss_size = n;
    c->uc.uc_link = nullptr; /* entry never returns */
    makecontext(&c->uc, entry, 0);
}
#endif

/*
 * The 32 threads of a warp as fibers on the calling host thread.
 * The scheduler resumes each lane in turn; a lane runs until it reaches a
 * shuffle (it parks) or the kernel's end.  When all 32 have parked, each
 * has put its value in the shuffle's slots and takes its partner's; slots
 * alternate between two sets, so a lane that runs ahead to the next shuffle
 * cannot overwrite a value another lane has yet to read.  A warp whose lanes
 * part ways (some at a shuffle, some at the end) is a kernel bug: abort.
 */
struct FrEmuWarp {
    FrEmuCtx sched, lane[32];
    unsigned long long slot[2][32];
    int parked[32], done[32], round;
    void (*body)(void *);
    void *arg;
};
static thread_local FrEmuWarp *fr_emu_warp;
static thread_local int fr_emu_lane;

/* A lane's fiber: the kernel, then back to the scheduler for good. */
static void fr_emu_lane_main()
{
    FrEmuWarp *w = fr_emu_warp;
    const int l = fr_emu_lane;
    w->body(w->arg);
    w->done[l] = 1;
    fr_emu_ctx_switch(&w->lane[l], &w->sched);
    abort(); /* a finished lane is never resumed */
}

/* __shfl_xor_sync on a full warp: value v of lane (this lane ^ m). */
template <typename T> static T __shfl_xor_sync(unsigned mask, T v, int m)
{
    static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffle moves 8 bytes at most");
    FrEmuWarp *w = fr_emu_warp;
    const int l = fr_emu_lane;
    if (w == nullptr || mask != 0xffffffffu || m < 0 || m > 31) {
        fprintf(stderr, "cuda_emu: __shfl_xor_sync outside a lockstep launch or on part of a warp\n");
        abort();
    }
    const int set = w->round & 1;
    T r;
    memcpy(&w->slot[set][l], &v, sizeof v);
    w->parked[l] = 1;
    fr_emu_ctx_switch(&w->lane[l], &w->sched);
    memcpy(&r, &w->slot[set][l ^ m], sizeof r);
    return r;
}

/* cudaLaunchKernelEx for a kernel that shuffles: blocks of whole warps,
 * each warp run as fibers (above), warps and blocks one after another. */
template <typename... ExpTypes, typename... ActTypes>
static cudaError_t fr_emu_launch_lockstep(const cudaLaunchConfig_t *config,
                                          void (*kernel)(ExpTypes...), ActTypes &&...args)
{
    const dim3 grid = config->gridDim, block = config->blockDim;
    const size_t stack = (size_t)1 << 16;
    if (block.y != 1 || block.z != 1 || block.x % 32 != 0 || grid.y != 1 || grid.z != 1) {
        fprintf(stderr, "cuda_emu: a lockstep launch takes 1D grids of 1D blocks of whole warps\n");
        return cudaErrorInvalidConfiguration;
    }
    if (fr_emu_refused(config))
        return cudaErrorInvalidConfiguration;
    struct Call {
        void (*kernel)(ExpTypes...);
        std::tuple<ExpTypes...> params;
        static void run(void *p)
        {
            Call *c = (Call *)p;
            std::apply(c->kernel, c->params);
        }
    } call{ kernel, std::tuple<ExpTypes...>(std::forward<ActTypes>(args)...) };
    FrEmuWarp *w = (FrEmuWarp *)calloc(1, sizeof *w);
    char *stacks = (char *)malloc(32 * stack);
    if (w == nullptr || stacks == nullptr) {
        free(w);
        free(stacks);
        return cudaErrorMemoryAllocation;
    }
#ifdef FR_EMU_VALGRIND
    unsigned vg[32];
    for (int l = 0; l < 32; l++)
        vg[l] = VALGRIND_STACK_REGISTER(stacks + l * stack, stacks + (l + 1) * stack);
#endif
    gridDim = grid;
    blockDim = block;
    w->body = &Call::run;
    w->arg = &call;
    fr_emu_warp = w;
    for (unsigned bx = 0; bx < grid.x; bx++)
        for (unsigned warp = 0; warp < block.x / 32; warp++) {
            for (int l = 0; l < 32; l++) {
                fr_emu_ctx_init(&w->lane[l], stacks + l * stack, stack, fr_emu_lane_main);
                w->done[l] = 0;
            }
            for (w->round = 0;; w->round++) {
                int parked = 0, done = 0;
                for (int l = 0; l < 32; l++) {
                    if (w->done[l])
                        continue;
                    w->parked[l] = 0;
                    fr_emu_lane = l;
                    blockIdx = make_uint3(bx, 0, 0);
                    threadIdx = make_uint3(warp * 32 + (unsigned)l, 0, 0);
                    fr_emu_ctx_switch(&w->sched, &w->lane[l]);
                }
                for (int l = 0; l < 32; l++) {
                    parked += w->parked[l] && !w->done[l];
                    done += w->done[l];
                }
                if (done == 32)
                    break;
                if (parked != 32) {
                    fprintf(stderr, "cuda_emu: a warp's lanes parted: %d at a shuffle, %d ended\n",
                            parked, done);
                    abort();
                }
            }
        }
    fr_emu_warp = nullptr;
#ifdef FR_EMU_VALGRIND
    for (int l = 0; l < 32; l++)
        VALGRIND_STACK_DEREGISTER(vg[l]);
#endif
    free(stacks);
    free(w);
    return cudaSuccess;
}

static inline fusedrope_status fr_cuda_fail(cudaError_t err, const char *what)
{
    return fr_fail(FUSEDROPE_ERR_CUDA, "%s failed (emulated error %d)", what, err);
}

#endif /* FUSEDROPE_CUDA_EMU_H */
