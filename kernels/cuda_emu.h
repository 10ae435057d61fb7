/*
 * cuda_emu.h - just enough of CUDA for a host C++ compiler to build
 * kernels/cuda_apply.cu and kernels/cuda_norm_*.cu (with FR_CUDA_EMULATE
 * defined) and run their kernels on the CPU, one thread after another.  This is how CI, which has no GPU, runs
 * the kernels' code: their indexing, launch shapes, path choice and
 * arithmetic (tests/test_apply_emu).  It cannot stand in for a GPU run: no
 * memory model, no concurrency, no sanitizer (tests/test_cuda and
 * compute-sanitizer on a device do that).
 *
 * What it relies on: a thread depends on no other but through warp
 * shuffles and static shared memory behind __syncthreads, or a block on
 * the others only where the last of a group to arrive (an atomic count)
 * reads what all wrote (norm_dw_fold: what it computes is the same
 * whichever block is last), so running the threads in sequence gives what
 * the device gives (asynchronous copies to shared memory land when waited
 * for, below); the fp16/bf16 conversion intrinsics of cuda_fp16.h and
 * cuda_bf16.h have host definitions.  A kernel that shuffles or synchronises is launched
 * with fr_emu_launch_lockstep (below): each block's threads run as fibers
 * that meet at every shuffle (a warp's lanes) and every __syncthreads (the
 * block's threads), so each reads what its partner had there, as on the
 * device.
 */
#ifndef FUSEDROPE_CUDA_EMU_H
#define FUSEDROPE_CUDA_EMU_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

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
template <typename T> static inline T __ldcg(const T *p) { return *p; }

/* One thread runs at a time: an atomic is a plain update, and every write
 * is seen by the threads after it. */
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
    const unsigned old = *p;
    *p = old + v;
    return old;
}
static inline void __threadfence() {}

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
 * is refused too, but for the one that allows a programmatic dependent
 * launch, which running each launch to its end before the next honours.
 * The stream is ignored. */
static bool fr_emu_refused(const cudaLaunchConfig_t *config)
{
    const dim3 grid = config->gridDim, block = config->blockDim;
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    bool attrs_ok = config->numAttrs == 0 || config->attrs != nullptr;
    for (unsigned i = 0; attrs_ok && i < config->numAttrs; i++)
        attrs_ok = config->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 512 ||
        block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u ||
        config->dynamicSmemBytes != 0 || !attrs_ok) {
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

/* ------------------------------------------------- blocks in lockstep */

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
/* from in rdi, to in rsi.  A naked function (no prologue: the asm is the
 * whole body) rather than a top-level asm statement: each file that includes
 * this gets a function of its own, which link-time optimisation handles,
 * where the top-level asm's label was defined twice once two such files met
 * in one LTO partition (Ubuntu's packaging flags, -flto=auto). */
__attribute__((naked, noinline)) static void fr_emu_ctx_switch(FrEmuCtx *, FrEmuCtx *)
{
    __asm__("pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
            "subq $8, %rsp\n\tstmxcsr (%rsp)\n\tfnstcw 4(%rsp)\n\t"
            "movq %rsp, (%rdi)\n\tmovq (%rsi), %rsp\n\t"
            "ldmxcsr (%rsp)\n\tfldcw 4(%rsp)\n\taddq $8, %rsp\n\t"
            "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\t"
            "ret");
}

/* A context that, switched to, calls entry() on the stack [base, base + n):
 * the frame fr_emu_ctx_switch pops, returning into entry as if called (the
 * stack 16-byte aligned at the call), with this thread's control words. */
static inline void fr_emu_ctx_init(FrEmuCtx *c, char *base, size_t n, void (*entry)())
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
static inline void fr_emu_ctx_init(FrEmuCtx *c, char *base, size_t n, void (*entry)())
{
#if defined(__powerpc64__) && defined(__ALTIVEC__)
    /* glibc's powerpc swapcontext restores the vector registers only where
     * the context's VRSAVE is not 0, and ELFv2 code leaves VRSAVE 0: the
     * scheduler's v20-v31, which calls keep, came back as a fiber left
     * them (under qemu-ppc64le a warp's count of lanes at a shuffle was
     * 0).  Marked all live here, before this getcontext and the
     * scheduler's switches save VRSAVE, every switch restores them; the
     * thread keeps that value, which ELFv2 code never reads. */
    __asm__ volatile("mtvrsave %0" : : "r"(-1));
#endif
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = base;
    c->uc.uc_stack.ss_size = n;
    c->uc.uc_link = nullptr; /* entry never returns */
    makecontext(&c->uc, entry, 0);
}
#endif

/*
 * A block's threads as fibers on the calling host thread.  The scheduler
 * resumes each runnable thread in turn; a thread runs until it reaches a
 * shuffle or __syncthreads (it parks) or the kernel's end.  When no thread
 * is runnable: a warp whose 32 lanes all wait at a shuffle exchanges (each
 * lane has put its value in the warp's slots and takes its partner's) and
 * runs on; failing that, a block whose threads all wait at __syncthreads
 * runs on.  Slots alternate between two sets per warp, so a lane that runs
 * ahead to the next shuffle cannot overwrite a value another lane has yet to
 * read.  Anything else is a kernel bug the device would hang or misbehave
 * on (a warp's lanes parted between a shuffle and elsewhere, a barrier some
 * threads never reach): abort.
 */
enum { FR_EMU_RUN, FR_EMU_SHFL, FR_EMU_BAR, FR_EMU_DONE };
/* An asynchronous copy to shared memory a thread has issued and not yet
 * waited for: where to, from, the source's bytes when issued, and its
 * commit group. */
struct FrEmuCopy {
    void *dst;
    const void *src;
    size_t n;
    unsigned long long group;
    unsigned char bytes[16];
};
struct FrEmuBlock {
    FrEmuCtx sched, *th;
    int *state, n;
    unsigned long long (*slot)[2][32]; /* per warp */
    unsigned *wround;                  /* per warp: its shuffles so far */
    std::vector<FrEmuCopy> *copies;    /* per thread: its copies in flight */
    unsigned long long *groups;        /* per thread: the groups it has committed */
    void (*body)(void *);
    void *arg;
};
static thread_local FrEmuBlock *fr_emu_block;
static thread_local int fr_emu_thread;

/* A thread's fiber: the kernel, then back to the scheduler for good. */
static inline void fr_emu_thread_main()
{
    FrEmuBlock *k = fr_emu_block;
    const int i = fr_emu_thread;
    k->body(k->arg);
    k->state[i] = FR_EMU_DONE;
    fr_emu_ctx_switch(&k->th[i], &k->sched);
    abort(); /* a finished thread is never resumed */
}

/* A shuffle on a full warp: value v of lane src (of this lane l: the
 * function of l the caller's intrinsic names; each lane offers its v, waits
 * until the warp's 32 have, and reads its source's). */
template <typename T, typename Src> static T fr_emu_shfl(const char *name, unsigned mask, T v, Src src)
{
    static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffle moves 8 bytes at most");
    FrEmuBlock *k = fr_emu_block;
    const int i = fr_emu_thread, w = i / 32, l = i % 32;
    const int from = src(l);
    if (k == nullptr || mask != 0xffffffffu || from < 0 || from > 31) {
        fprintf(stderr, "cuda_emu: %s outside a lockstep launch, on part of a warp or "
                        "from no lane\n", name);
        abort();
    }
    const unsigned set = k->wround[w] & 1;
    T r;
    memcpy(&k->slot[w][set][l], &v, sizeof v);
    k->state[i] = FR_EMU_SHFL;
    fr_emu_ctx_switch(&k->th[i], &k->sched);
    memcpy(&r, &k->slot[w][set][from], sizeof r);
    return r;
}

/* __shfl_xor_sync on a full warp: value v of lane (this lane ^ m). */
template <typename T> static T __shfl_xor_sync(unsigned mask, T v, int m)
{
    return fr_emu_shfl("__shfl_xor_sync", mask, v,
                       [m](int l) { return m < 0 || m > 31 ? -1 : l ^ m; });
}

/* __shfl_sync on a full warp: value v of lane src (0 to 31: this
 * emulation's callers name a lane, never one past the warp). */
template <typename T> static T __shfl_sync(unsigned mask, T v, int src)
{
    return fr_emu_shfl("__shfl_sync", mask, v, [src](int) { return src; });
}

/* __syncthreads: every thread of the block arrives before any goes on. */
static inline void __syncthreads()
{
    FrEmuBlock *k = fr_emu_block;
    const int i = fr_emu_thread;
    if (k == nullptr) {
        fprintf(stderr, "cuda_emu: __syncthreads outside a lockstep launch\n");
        abort();
    }
    k->state[i] = FR_EMU_BAR;
    fr_emu_ctx_switch(&k->th[i], &k->sched);
}

/* Static shared memory: one copy per host thread, which the blocks of a
 * launch (run one after another) reuse, so a block starts with the bytes the
 * last one left; a kernel that must not depend on them poisons its arrays
 * first when emulated (compute-sanitizer's racecheck judges this on a
 * device). */
#undef __shared__
#define __shared__ static thread_local

/*
 * cuda_pipeline.h's asynchronous copies from global to shared memory
 * (cp.async), in a lockstep launch.  A copy's source is read when it is
 * issued, and lands in shared memory only when the thread waits for its
 * group (__pipeline_wait_prior): until then the destination keeps its old
 * bytes, as on the device, where the copy may land any time before the
 * wait, so a kernel that reads it early reads what the emulation leaves
 * there.  A source written between the copy and its wait (the device may
 * have read either bytes) and the device's refusals (a size other than 4,
 * 8 or 16 bytes, addresses not aligned to it, zero fill) abort.
 */
static inline FrEmuBlock *fr_emu_pipeline_block(const char *name)
{
    FrEmuBlock *k = fr_emu_block;
    if (k == nullptr) {
        fprintf(stderr, "cuda_emu: %s outside a lockstep launch\n", name);
        abort();
    }
    return k;
}

static inline void __pipeline_memcpy_async(void *dst, const void *src, size_t n, size_t zfill = 0)
{
    FrEmuBlock *k = fr_emu_pipeline_block("__pipeline_memcpy_async");
    const int i = fr_emu_thread;
    if ((n != 4 && n != 8 && n != 16) || zfill != 0 || (uintptr_t)dst % n != 0 ||
        (uintptr_t)src % n != 0) {
        fprintf(stderr, "cuda_emu: __pipeline_memcpy_async of %zu bytes (zero fill %zu) from %p "
                        "to %p: refused\n", n, zfill, src, dst);
        abort();
    }
    FrEmuCopy c;
    c.dst = dst;
    c.src = src;
    c.n = n;
    c.group = k->groups[i];
    memcpy(c.bytes, src, n);
    k->copies[i].push_back(c);
}

static inline void __pipeline_commit()
{
    FrEmuBlock *k = fr_emu_pipeline_block("__pipeline_commit");
    k->groups[fr_emu_thread]++;
}

/* Every committed group but the `prior` last lands. */
static inline void __pipeline_wait_prior(size_t prior)
{
    FrEmuBlock *k = fr_emu_pipeline_block("__pipeline_wait_prior");
    const int i = fr_emu_thread;
    std::vector<FrEmuCopy> &v = k->copies[i];
    size_t kept = 0;
    for (size_t j = 0; j < v.size(); j++) {
        const FrEmuCopy &c = v[j];
        if (c.group + prior < k->groups[i]) {
            if (memcmp(c.src, c.bytes, c.n) != 0) {
                fprintf(stderr, "cuda_emu: the source of a copy to shared memory (%p) written "
                                "before the copy was waited for\n", c.src);
                abort();
            }
            memcpy(c.dst, c.bytes, c.n);
        } else {
            v[kept++] = c;
        }
    }
    v.resize(kept);
}

/* Runs the block's threads to the end (above); false on a kernel bug
 * (reported). */
static inline bool fr_emu_run_block(FrEmuBlock *k, unsigned bx)
{
    for (;;) {
        for (int i = 0; i < k->n; i++)
            if (k->state[i] == FR_EMU_RUN) {
                fr_emu_thread = i;
                blockIdx = make_uint3(bx, 0, 0);
                threadIdx = make_uint3((unsigned)i, 0, 0);
                fr_emu_ctx_switch(&k->sched, &k->th[i]);
            }
        int released = 0, done = 0, bar = 0;
        for (int w = 0; w < k->n / 32; w++) {
            int shfl = 0;
            for (int l = 0; l < 32; l++)
                shfl += k->state[32 * w + l] == FR_EMU_SHFL;
            if (shfl == 32) {
                for (int l = 0; l < 32; l++)
                    k->state[32 * w + l] = FR_EMU_RUN;
                k->wround[w]++;
                released = 1;
            } else if (shfl != 0) {
                fprintf(stderr, "cuda_emu: warp %d's lanes parted: %d at a shuffle, the rest "
                                "ended or at a barrier\n", w, shfl);
                return false;
            }
        }
        if (released)
            continue;
        for (int i = 0; i < k->n; i++) {
            done += k->state[i] == FR_EMU_DONE;
            bar += k->state[i] == FR_EMU_BAR;
        }
        if (done == k->n)
            return true;
        if (bar != k->n) {
            fprintf(stderr, "cuda_emu: %d threads at __syncthreads, %d ended: a barrier not "
                            "every thread reaches\n", bar, done);
            return false;
        }
        for (int i = 0; i < k->n; i++)
            k->state[i] = FR_EMU_RUN;
    }
}

/* cudaLaunchKernelEx for a kernel that shuffles or synchronises its block:
 * 1D blocks of whole warps, each block's threads run as fibers (above), the
 * blocks one after another. */
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
    const int n = (int)block.x, warps = n / 32;
    FrEmuBlock *k = (FrEmuBlock *)calloc(1, sizeof *k);
    char *stacks = (char *)malloc((size_t)n * stack);
    if (k != nullptr) {
        k->th = (FrEmuCtx *)calloc((size_t)n, sizeof *k->th);
        k->state = (int *)calloc((size_t)n, sizeof *k->state);
        k->slot = (unsigned long long(*)[2][32])calloc((size_t)warps, sizeof *k->slot);
        k->wround = (unsigned *)calloc((size_t)warps, sizeof *k->wround);
        /* block.x, not n: from an int, gcc's LTO warned of a negative size */
        k->copies = new std::vector<FrEmuCopy>[block.x];
        k->groups = (unsigned long long *)calloc((size_t)n, sizeof *k->groups);
    }
    bool ok = k != nullptr && stacks != nullptr && k->th != nullptr && k->state != nullptr &&
              k->slot != nullptr && k->wround != nullptr && k->groups != nullptr;
    if (ok) {
#ifdef FR_EMU_VALGRIND
        unsigned *vg = (unsigned *)calloc((size_t)n, sizeof *vg);
        for (int i = 0; vg != nullptr && i < n; i++)
            vg[i] = VALGRIND_STACK_REGISTER(stacks + i * stack, stacks + (i + 1) * stack);
#endif
        gridDim = grid;
        blockDim = block;
        k->n = n;
        k->body = &Call::run;
        k->arg = &call;
        fr_emu_block = k;
        for (unsigned bx = 0; bx < grid.x && ok; bx++) {
            for (int i = 0; i < n; i++) {
                fr_emu_ctx_init(&k->th[i], stacks + i * stack, stack, fr_emu_thread_main);
                k->state[i] = FR_EMU_RUN;
                k->copies[i].clear(); /* a thread's copies never waited for: gone with it */
                k->groups[i] = 0;
            }
            ok = fr_emu_run_block(k, bx);
        }
        fr_emu_block = nullptr;
#ifdef FR_EMU_VALGRIND
        for (int i = 0; vg != nullptr && i < n; i++)
            VALGRIND_STACK_DEREGISTER(vg[i]);
        free(vg);
#endif
        if (!ok)
            abort();
    }
    if (k != nullptr) {
        free(k->th);
        free(k->state);
        free(k->slot);
        free(k->wround);
        delete[] k->copies;
        free(k->groups);
    }
    free(k);
    free(stacks);
    return ok ? cudaSuccess : cudaErrorMemoryAllocation;
}

/* kernels/cuda_util.cuh's fr_cuda_fail without the runtime's error names:
 * the same statuses (a failed allocation, here the emulated scratch's
 * malloc, is FUSEDROPE_ERR_NOMEM, as fusedrope_norm_forward_qk(3) says). */
static inline fusedrope_status fr_cuda_fail(cudaError_t err, const char *what)
{
    if (err == cudaErrorMemoryAllocation)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "%s: out of (emulated device) memory", what);
    return fr_fail(FUSEDROPE_ERR_CUDA, "%s failed (emulated error %d)", what, err);
}

#endif /* FUSEDROPE_CUDA_EMU_H */
