/*
 * cuda_norm_backward.cu - the CUDA backend of the fused per-head RMSNorm +
 * RoPE's backward (fusedrope_norm_backward_qk(3)): fr_cuda_norm_backward.
 * What it shares with the forward is in kernels/cuda_norm.cuh, whose
 * comment gives the rule of both.
 *
 * A row: its sum of dn * n in the contract's order, then dx pair by pair;
 * dw sums each head's terms g * n per chunk of FUSEDROPE_NORM_DW_CHUNK
 * tokens (the chunk's tokens in order) into a (chunk, head) partial, a
 * chunk's heads' partials in head order, then the chunks in order
 * (norm_dw_fold, a launch a segment).  The generic kernel (norm_dx, a
 * thread per row) writes the terms to a stream-ordered scratch array,
 * which one thread per (chunk, head, channel) sums (norm_dw_chunks); the
 * common shapes (rows_hd) take norm_backward_heads, a warp per chunk of
 * two heads (over its halves) or of one head (or a few: a row over a
 * warp's lanes; FR_CUDA_NORM_BWD_HALF chooses) adding the terms in
 * registers as it goes.
 * A long call runs in segments of whole chunks (the scratch of a segment
 * at most TERMS_BYTES).  An earlier dw pass that read dy and the saved
 * tensor again, one thread per (chunk, channel), took about 1 ms whatever
 * the call's size (bench/RESULTS.md).
 *
 * With FR_CUDA_EMULATE (kernels/cuda_norm_backward_emu.cc) the host C++
 * compiler builds it and kernels/cuda_emu.h runs the kernels on the CPU:
 * threads share nothing but the warp kernels' shuffles (the shared memory
 * of norm_backward_heads' asynchronous copies is each lane's own words)
 * and norm_dw_fold's shared memory (between barriers) and chunk sums (read
 * by the last of their blocks to arrive, whichever it is), so running them
 * one after another, a warp's lanes or a block's threads in lockstep for
 * those kernels, gives what the device gives.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef FR_CUDA_EMULATE
#include "cuda_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include "internal.h"
#include "cuda_util.cuh"
#endif
#include "cuda_device.cuh"
#include "norm_math.h"

#ifdef FR_CUDA_EMULATE
/* Emulated, a test chooses: the segment (chunks of tokens; 0: TERMS_BYTES
 * decides), so that the small calls of the tests run in several segments
 * too, and norm_backward_heads' heads a warp at a token (0: bwd_heads
 * decides; 1 to 4 are built) and layout (1: half-warps, 0: warps, -1:
 * FR_CUDA_NORM_BWD_HALF decides) and, over half-warps, its tokens in
 * flight through shared memory (0, 1, 3; -1: FR_CUDA_NORM_BWD_PIPE);
 * with tokens in registers, how many (FR_CUDA_NORM_BWD_AHEAD); and
 * whether the launches carry the programmatic-dependent attribute
 * (FR_CUDA_NORM_BWD_PDL); its tokens prefetched ahead
 * (FR_CUDA_NORM_BWD_PREFETCH). */
extern "C" {
int fr_emu_norm_seg_chunks = 0;
int fr_emu_norm_bwd_heads = 0;
int fr_emu_norm_bwd_half = -1;
int fr_emu_norm_bwd_pipe = -1;
int fr_emu_norm_bwd_ahead = 0; /* 1 to 4, 0: FR_CUDA_NORM_BWD_AHEAD */
int fr_emu_norm_bwd_pdl = -1;  /* 0, 1; -1: FR_CUDA_NORM_BWD_PDL */
int fr_emu_norm_bwd_prefetch = -1; /* tokens ahead; -1: FR_CUDA_NORM_BWD_PREFETCH */
}
#endif

/* The token ring's loops, unrolled on the device, where their count is a
 * constant; emulated, it is a test's run-time choice, and clang warned for
 * each instantiation that it could not unroll them. */
#ifdef FR_CUDA_EMULATE
#define FR_RING_UNROLL
#else
#define FR_RING_UNROLL _Pragma("unroll")
#endif

namespace {

#include "cuda_elem.cuh"
#include "cuda_index.cuh"
#include "cuda_norm.cuh"

/* g and n of channel ch of the row at token (b, s): g = (R^T dy)[ch]; n =
 * x[ch] * rstd, or (R^T y)[ch] / w'[ch].  The pair's rotation (its angle
 * from angle()) is computed whole and one member taken: the same operations
 * as the CPU's row rotation. */
__device__ __forceinline__ void g_n(const NParams &P, const void *dy, const void *xs, int64_t b,
                                    int64_t s, int64_t ch, float rstd, float wf, float *g,
                                    float *n)
{
    if (ch < P.rot_dim) {
        int64_t ca, cb;
        const int64_t i = fr_channel_pair(P.interleaved, ch, P.half);
        float c, sn, ga, gb, ta, tb;
        angle(P, b, s, i, &c, &sn);
        fr_pair_channels(P.interleaved, i, P.half, &ca, &cb);
        fr_rotate(load_f(dy, P.dt, ca), load_f(dy, P.dt, cb), c, sn, -1.0f, &ga, &gb);
        *g = ch == ca ? ga : gb;
        if (P.saved_y) {
            fr_rotate(load_f(xs, P.dt, ca), load_f(xs, P.dt, cb), c, sn, -1.0f, &ta, &tb);
            *n = (ch == ca ? ta : tb) / wf;
        } else {
            *n = load_f(xs, P.dt, ch) * rstd;
        }
    } else {
        *g = load_f(dy, P.dt, ch);
        *n = P.saved_y ? load_f(xs, P.dt, ch) / wf : load_f(xs, P.dt, ch) * rstd;
    }
}

/* Where the row kernel of head h at token t puts the row's g * n terms for
 * dw (norm_dw_chunks sums them), or NULL when this tensor's dw is not asked
 * for. */
__device__ __forceinline__ float *term_row(const NParams &P, const NIo &io, int64_t t, int64_t h)
{
    return io.terms != nullptr ? io.terms + ((t - P.t0) * io.heads + h) * io.hd : nullptr;
}

/* p[0] + p[stride] + ... + p[(n - 1) stride], added in that order from 0,
 * in batches of B loads written apart from the adds (the next batch's
 * before this one's): so ptxas issues a batch's loads together, a round
 * trip a batch (cuobjdump).  A plain loop kept 3 to 4 loads in flight, a
 * batch loaded then added 8: the compilers place loads beside the adds that
 * use them. */
__device__ __forceinline__ float sum_in_order(const float *p, int64_t n, int64_t stride)
{
    constexpr int B = 32;
    float sum = 0.0f, cur[B], next[B];
    int64_t j = 0;
    if (n >= B) {
#pragma unroll
        for (int i = 0; i < B; i++)
            cur[i] = p[i * stride];
    }
    for (; j + B <= n; j += B) {
        const bool more = j + 2 * B <= n;
        if (more) {
#pragma unroll
            for (int i = 0; i < B; i++)
                next[i] = p[(j + B + i) * stride];
        }
#pragma unroll
        for (int i = 0; i < B; i++)
            sum = sum + cur[i];
        if (more) {
#pragma unroll
            for (int i = 0; i < B; i++)
                cur[i] = next[i];
        }
    }
    for (; j < n; j++)
        sum = sum + p[j * stride];
    return sum;
}

/* 1: norm_backward_heads and norm_dw_fold launched as programmatic
 * dependents on devices of compute capability 9.0 and later
 * (fr_cuda_pdl_attr): each waits at its start for the kernel before it
 * (fr_pdl_wait, before any read), and the row kernel's blocks let the fold
 * launch as they start, so the fold's launch and blocks are placed while
 * the row kernel's last blocks run.  On the H200 a call at 4096 tokens
 * took 5.3 us outside its two kernels (ncu against the event-timed call;
 * bench/RESULTS.md, 2026-11-30).  0 until measured. */
#ifndef FR_CUDA_NORM_BWD_PDL
#define FR_CUDA_NORM_BWD_PDL 0
#endif

/* Tokens ahead of the one it works whose rows (dy and the saved row) a
 * warp of norm_backward_heads prefetches into L2 (fr_prefetch_l2; sm_90
 * and later), 0 for none: a unit's tokens are a chain, each token's loads
 * issued a token ahead, and ncu on the H200 found the kernel's warps
 * waiting on those loads 5.3 of the 9.5 cycles between their issues at 20
 * warps an SM (bench/RESULTS.md, 2026-11-30); prefetched, they wait on L2
 * rather than DRAM.  The prefetches take their addresses from the row
 * pointers the warp holds anyway: a first version that kept each lane's
 * token's own took 96 -> 111 registers (ptxas, bf16 NeoX 128 from x), a
 * block an SM less.  0 until measured.  (Not with FR_CUDA_NORM_BWD_PIPE,
 * whose copies are in flight already.) */
#ifndef FR_CUDA_NORM_BWD_PREFETCH
#define FR_CUDA_NORM_BWD_PREFETCH 0
#endif
static_assert(FR_CUDA_NORM_BWD_PREFETCH >= 0 && FR_CUDA_NORM_BWD_PREFETCH < 32,
              "FR_CUDA_NORM_BWD_PREFETCH: 0 to 31 tokens ahead");
/* whether the kernels hold the prefetch's code (the emulation's, for the
 * tests' choices, always) */
#if defined FR_CUDA_EMULATE || FR_CUDA_NORM_BWD_PREFETCH > 0
#define FR_BWD_PREFETCH_BUILT 1
#else
#define FR_BWD_PREFETCH_BUILT 0
#endif

/* The arrival counts of the segment's norm_dw_fold zeroed, by the row
 * kernels before it (stream order: the fold of the segment before has
 * ended). */
__device__ __forceinline__ void fold_counts_zero(const NParams &P)
{
    if (blockIdx.x == 0)
        for (int64_t i = threadIdx.x; i < P.fold_n; i += blockDim.x)
            P.fold_count[i] = 0;
}

/* The chunks of the segment P.t0..P.t1 (t0 a multiple of the chunk). */
__host__ __device__ inline int64_t seg_chunks(const NParams &P)
{
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK;
    return (P.t1 - P.t0 + C - 1) / C;
}

/* (1) one thread per (tensor, chunk of tokens t0..t1, head, channel): the
 * head's terms of the chunk, its tokens in order, into the (chunk, head)
 * partial; t0 is a multiple of the chunk. */
__global__ void norm_dw_chunks(const __grid_constant__ NParams P)
{
    fold_counts_zero(P);
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK, nk = seg_chunks(P);
    const int64_t n0 = P.io[0].terms ? nk * P.io[0].heads * P.io[0].hd : 0;
    const int64_t n1 = P.io[1].terms ? nk * P.io[1].heads * P.io[1].hd : 0;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n0 + n1;
         q += (int64_t)gridDim.x * blockDim.x) {
        const int k = q >= n0;
        const NIo &io = P.io[k];
        const int64_t e = q - (k ? n0 : 0), ch = e / (io.heads * io.hd);
        const int64_t hc = e % (io.heads * io.hd); /* h * hd + c */
        const int64_t ta = P.t0 + ch * C, tb = ta + C < P.t1 ? ta + C : P.t1;
        const float *tp = io.terms + (ta - P.t0) * io.heads * io.hd + hc;
        io.hp[e] = sum_in_order(tp, tb - ta, io.heads * io.hd);
    }
}

/* (2) per segment t0..t1, a block per (tensor, FOLD_LANES of its channels,
 * FOLD_WARPS chunks): a warp a chunk, a lane a channel, adds the chunk's
 * heads' partials in head order from 0 (its loads a line a warp) into the
 * chunk's sum; the last block of a (tensor, channels) to arrive (an atomic
 * count, its blocks' sums written and fenced first) then adds the
 * segment's chunk sums in chunk order onto each channel's running sum (0
 * at the call's first segment, else dw as the segment before left it),
 * written to dw: its warps load a round of FOLD_WARPS * FOLD_RPW chunks'
 * sums into shared memory together, its first warp adds them.  So the
 * contract's order, whichever block is last.  The fold this replaced (a
 * block per 2 channels adding every chunk's heads: 16 scattered sectors a
 * warp's load) took 6.78 us at 4096 tokens on the H200, 3.36 at 64
 * (bench/RESULTS.md, 2026-11-30). */
constexpr int FOLD_LANES = 32;
#ifdef FR_CUDA_EMULATE
/* emulated, 2 warps, 2 rows a round: the tests' calls of a few chunks run
 * several blocks a group of channels and several rounds */
constexpr int FOLD_WARPS = 2, FOLD_RPW = 2;
#else
constexpr int FOLD_WARPS = 8, FOLD_RPW = 16;
#endif
constexpr int FOLD_THREADS = 32 * FOLD_WARPS, FOLD_ROUND = FOLD_WARPS * FOLD_RPW;

/* norm_dw_fold's groups of channels of tensor io (none where its dw is not
 * asked for), and its blocks a group for nk chunks */
__host__ __device__ inline int64_t fold_groups(const NIo &io)
{
    return io.dw != nullptr ? (io.hd + FOLD_LANES - 1) / FOLD_LANES : 0;
}
__host__ __device__ inline int64_t fold_ranges(int64_t nk)
{
    return (nk + FOLD_WARPS - 1) / FOLD_WARPS;
}

__global__ void __launch_bounds__(FOLD_THREADS) norm_dw_fold(const __grid_constant__ NParams P)
{
    __shared__ float part[FOLD_ROUND][FOLD_LANES];
    __shared__ int last;
    if constexpr (FR_CUDA_NORM_BWD_PDL != 0)
        fr_pdl_wait(); /* the row kernel's partials and counts */
    const int64_t nk = seg_chunks(P);
    const int64_t R = fold_ranges(nk), g0 = fold_groups(P.io[0]);
    const int k = (int64_t)blockIdx.x >= g0 * R;
    const NIo &io = P.io[k];
    const int64_t b = (int64_t)blockIdx.x - (k ? g0 * R : 0), g = b / R, r = b % R;
    const int lane = (int)(threadIdx.x % 32), w = (int)(threadIdx.x / 32);
    const int64_t c = g * FOLD_LANES + lane, ch = r * FOLD_WARPS + w;
    const bool on = c < io.hd;
    if (ch < nk && on)
        io.cs[ch * io.hd + c] = sum_in_order(io.hp + ch * io.heads * io.hd + c, io.heads, io.hd);
    /* the block's sums ordered before its count by the barrier and one
     * thread's fence (as cooperative groups' grid barrier), and the other
     * blocks' sums seen after the count by the fence after it */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&P.fold_count[(k ? g0 : 0) + g], 1u) == (unsigned)(R - 1);
        __threadfence();
    }
    __syncthreads();
    if (!last)
        return;
    float run = 0.0f;
    if (w == 0 && on && P.t0 > 0)
        run = io.dw[c];
    for (int64_t r0 = 0; r0 < nk; r0 += FOLD_ROUND) {
        float v[FOLD_RPW];
#pragma unroll
        for (int i = 0; i < FOLD_RPW; i++) { /* the other blocks' sums: from L2 */
            const int64_t row = r0 + i * FOLD_WARPS + w;
            v[i] = row < nk && on ? __ldcg(io.cs + row * io.hd + c) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < FOLD_RPW; i++)
            part[i * FOLD_WARPS + w][lane] = v[i];
        __syncthreads();
        if (w == 0 && on) {
            const int n = nk - r0 < FOLD_ROUND ? (int)(nk - r0) : FOLD_ROUND;
            for (int q = 0; q < n; q++)
                run = run + part[q][lane];
        }
        __syncthreads();
    }
    if (w == 0 && on)
        io.dw[c] = run;
}

/* (3) one thread per row: dx. */
__global__ void norm_dx(const __grid_constant__ NParams P)
{
    check_cu_seqlens(P.pos, P.tokens, P.flag);
    const NIo *io = nullptr;
    const void *dy = nullptr, *xs = nullptr;
    void *dx = nullptr;
    float *tr = nullptr;
    int64_t b = 0, s = 0;
    float rstd = 0.0f, m = 0.0f;
    walk_rows(
        P,
        [&](const NIo &o, int64_t t, int64_t h, int64_t b_, int64_t s_) {
            io = &o;
            b = b_;
            s = s_;
            dy = row_ptr(o.in, s, b, h, o.in_ss, o.in_sb, o.in_sh, P.dt);
            xs = row_ptr(o.x, s, b, h, o.x_ss, o.x_sb, o.x_sh, P.dt);
            dx = (void *)row_ptr(o.out, s, b, h, o.out_ss, o.out_sb, o.out_sh, P.dt);
            rstd = o.rstd[t * o.heads + h];
            tr = term_row(P, o, t, h);
        },
        [&](int64_t c) {
            const float wf = weight_factor(P, *io, c);
            float g, n;
            g_n(P, dy, xs, b, s, c, rstd, wf, &g, &n);
            if (tr != nullptr)
                tr[c] = g * n;
            const float dn = g * wf;
            return dn * n;
        },
        [&](float sum) { m = fr_norm_mean(sum, io->hd); },
        [&](int64_t, int64_t ca, int64_t cb) {
            float ga, na, gb, nb;
            const float wa = weight_factor(P, *io, ca), wb = weight_factor(P, *io, cb);
            g_n(P, dy, xs, b, s, ca, rstd, wa, &ga, &na);
            g_n(P, dy, xs, b, s, cb, rstd, wb, &gb, &nb);
            const float dna = ga * wa, dnb = gb * wb;
            store_f(dx, P.dt, ca, rstd * (dna - na * m));
            store_f(dx, P.dt, cb, rstd * (dnb - nb * m));
        },
        [&](int64_t ch) {
            const float wf = weight_factor(P, *io, ch);
            float g, n;
            g_n(P, dy, xs, b, s, ch, rstd, wf, &g, &n);
            const float dn = g * wf;
            store_f(dx, P.dt, ch, rstd * (dn - n * m));
        });
}

/*
 * The backward of the common rows (see norm_forward_rows), rows over a
 * warp as in norm_forward_warp (lane l holds channels l, l + 32, ...: the
 * contract's partial sum l; the butterfly is fr_norm_tree32) or, by
 * default (FR_CUDA_NORM_BWD_HALF), over half-warps as in norm_forward_half
 * (lane h of a half holds the 32-bit words h, h + 16, ...: the partial sums
 * 2h and 2h + 1; half_tree).  A warp's item is a unit of tokens (a chunk of
 * FUSEDROPE_NORM_DW_CHUNK where dw is asked for) of G heads of one tensor
 * (over warps G = 1, or FR_CUDA_NORM_BWD_HEADS when the call has more units
 * than a wave: bwd_heads; over half-warps two heads, one a half), which it
 * walks token by token, each token's heads in order; a lane adds its
 * channels' terms g * n of each head in token order in registers, which is the
 * contract's (chunk, head) partial, written to scratch at the unit's end
 * (norm_dw_fold then adds a chunk's heads in order, and the chunks in
 * order).  So no warp waits for another: the partials' order is the
 * contract's whatever the launch shape.  (The block a chunk this replaced
 * had to add a chunk's 1024 q terms in row order, a barrier every 16 rows,
 * one 16-warp block an SM: 0.30 of a copy on the H200; bench/RESULTS.md.)
 * A row's dx takes norm_dx's operations in their order.  Per unit the
 * lanes find the positions of its tokens (lane j token j: a unit is at
 * most 32 tokens) and each token's table row comes by shuffle; the rows
 * and angles of the next tokens are in flight while this token's are
 * worked: over half-warps FR_CUDA_NORM_BWD_PIPE tokens' as asynchronous
 * copies to shared memory (each lane reading back only its own), else
 * FR_CUDA_NORM_BWD_AHEAD tokens' in registers, the bits widened only when
 * worked (so the loads stay in flight until then).  Every lane reads only
 * its own channels (a partner's come by shuffle), and a row's loads come
 * before its stores (in registers, where the next tokens are past the
 * unit, its last token's rows are loaded again, before that token's
 * stores, and never used), so a row in place is safe.  Over half-warps a
 * tensor's odd last head leaves the second half a copy of the first half's
 * row, loaded and worked (its shuffles stay in its half) but neither
 * stored nor summed into dw; its loads of a token feed its tree before the
 * first half's stores of that token, so in place they read the row before
 * it is written.
 */
/* Heads a warp of norm_backward_heads takes at each token (1 to 4) where
 * the call has more units of one head than FR_CUDA_NORM_BWD_WAVE warps an
 * SM (below that, 1): several rows at a time give a warp independent
 * chains and fewer, longer units, at more registers (ptxas, bf16 NeoX 128,
 * one token ahead: 95 for one head; 117 for two in a first version that
 * took 72 for one).  1 until measured otherwise. */
#ifndef FR_CUDA_NORM_BWD_HEADS
#define FR_CUDA_NORM_BWD_HEADS 1
#endif
/* Whether the backward's common rows go over half-warps, a unit of two
 * heads with one row a half-warp in 32-bit words (1), or over warps, a row
 * a warp in 16-bit elements and FR_CUDA_NORM_BWD_HEADS (0): a warp's
 * instruction moves two rows' words, the tree is 5 shuffles for two rows,
 * and a warp has two rows' bytes in flight where it had one.  ptxas and
 * cuobjdump (nvcc 13.0, sm_90; bf16 NeoX 128 from x): with
 * FR_CUDA_NORM_BWD_PIPE 3, 96 registers (20 warps an SM) and ~265
 * instructions a token's two rows; in registers one token ahead, 96 and 8
 * bytes spilled; over warps, 72 (24 warps) and ~150 a row.  The H200:
 * half-warps 0.618 of a copy, warps 0.486 (FR_CUDA_NORM_BWD_PIPE). */
#ifndef FR_CUDA_NORM_BWD_HALF
#define FR_CUDA_NORM_BWD_HALF 1
#endif
/* Tokens a warp of norm_backward_heads over half-warps keeps in flight as
 * asynchronous copies to shared memory (cp.async; 1 to 4), or 0: in
 * registers (FR_CUDA_NORM_BWD_AHEAD).  A unit's 32 tokens are a chain (its
 * dw partials add in token order), so a warp's bytes in flight set its
 * pace; in shared memory they take no registers (ptxas, bf16 NeoX 128 from
 * x: 96 with 1 to 3 tokens in flight, 96 and 8 bytes spilled with one in
 * registers) and PIPE 3 takes 38 KB a block of 4 warps.  Yet the H200 ran
 * the registers fastest: bf16 Qwen3 [4096, 32 + 8 heads] with dw 0.618 of
 * a copy, PIPE 2 0.529, PIPE 3 0.517 (ncu: 36% of its cycles between
 * issues waiting on shared memory), rows over warps 0.486; at 16384 tokens
 * 0.670, 0.570, 0.556, 0.551 (bench/RESULTS.md, 2026-11-29). */
#ifndef FR_CUDA_NORM_BWD_PIPE
#define FR_CUDA_NORM_BWD_PIPE 0
#endif
static_assert(FR_CUDA_NORM_BWD_PIPE >= 0 && FR_CUDA_NORM_BWD_PIPE <= 4,
              "FR_CUDA_NORM_BWD_PIPE: 0 to 4 tokens in flight");
#ifndef FR_CUDA_NORM_BWD_WAVE
#define FR_CUDA_NORM_BWD_WAVE 36
#endif
/* The most blocks of 128 threads an SM in norm_backward_heads' grid (its
 * warps take the units beyond them grid-stride), as FR_CUDA_NORM_WARP_GRID. */
#ifndef FR_CUDA_NORM_BWD_GRID
#define FR_CUDA_NORM_BWD_GRID 16
#endif
/* Tokens a warp of norm_backward_heads holds loaded or in flight (1 to 4):
 * token j + D's loads are issued when token j is widened, so D tokens'
 * bytes are in flight through D tokens' work.  ptxas (bf16 NeoX 128, from
 * x, over warps): 1 takes 95 registers and ~150 instructions a token, 2 114 and ~214
 * (it moves the ring's registers about); over half-warps 96 and 144: 2
 * measured 0.440 of a copy where 1 0.634 on the H200, and 0.410 with
 * the held tokens' angles loaded only when worked (120-126 registers; that
 * knob, FR_CUDA_NORM_BWD_LATE_ANGLES, taken out; bench/RESULTS.md,
 * 2026-11-30). */
#ifndef FR_CUDA_NORM_BWD_AHEAD
#define FR_CUDA_NORM_BWD_AHEAD 1
#endif
/* the most tokens held (the emulation's ring holds this many) */
constexpr int BWD_AHEAD_MAX = 4;
static_assert(FR_CUDA_NORM_BWD_AHEAD >= 1 && FR_CUDA_NORM_BWD_AHEAD <= BWD_AHEAD_MAX,
              "FR_CUDA_NORM_BWD_AHEAD: 1 to 4 tokens held");
/* The blocks of 128 threads norm_backward_heads asks ptxas to fit an SM
 * (0: none asked; 8 allow 64 registers, 9 allow 56), as
 * FR_CUDA_NORM_WARP_MINB. */
#ifndef FR_CUDA_NORM_BWD_MINB
#define FR_CUDA_NORM_BWD_MINB 0
#endif
#if FR_CUDA_NORM_BWD_MINB > 0
#define FR_NORM_BWD_BOUNDS __launch_bounds__(128, FR_CUDA_NORM_BWD_MINB)
#else
#define FR_NORM_BWD_BOUNDS __launch_bounds__(128)
#endif
static_assert(FR_CUDA_NORM_BWD_HEADS >= 1 && FR_CUDA_NORM_BWD_HEADS <= 4,
              "FR_CUDA_NORM_BWD_HEADS: 1 to 4 heads a warp");
static_assert(FR_CUDA_NORM_BWD_GRID >= 1, "FR_CUDA_NORM_BWD_GRID: blocks an SM");

/* One row's dx over a warp or (HALF) a half-warp: dy and the saved row
 * (this lane's channels, lane_channel's order, widened), wf their weight
 * factors, an the token's angles; the terms g * n added into acc; dx's bits
 * into d, a word each of the lane's words of the row (HALF: two channels,
 * else one in its low half).  The row's sum of dn * n: over a warp the
 * lane's partial (its channels in order: the contract's partial lane) and
 * the butterfly; over a half-warp the lane's partials 2 lane and 2 lane + 1
 * and half_tree. */
template <int DT, int HD, bool IL, bool SY, bool HALF>
__device__ __forceinline__ void row_dx(const float *wf, const LaneAngles<HD, IL, HALF> &an,
                                       float rstd, int lane, const float *dy, const float *xs,
                                       float *acc, uint32_t *d)
{
    constexpr int C = HALF ? HD / 16 : HD / 32; /* the lane's channels */
    float g[C], n[C];
    /* the lane's pair of channels a and b, angle q */
    auto pair = [&](int a, int b, int q) {
        fr_rotate(dy[a], dy[b], an.c[q], an.sn[q], -1.0f, &g[a], &g[b]);
        if (SY) {
            float ta, tb;
            fr_rotate(xs[a], xs[b], an.c[q], an.sn[q], -1.0f, &ta, &tb);
            n[a] = ta / wf[a];
            n[b] = tb / wf[b];
        } else {
            n[a] = xs[a] * rstd;
            n[b] = xs[b] * rstd;
        }
    };
    if constexpr (IL && !HALF) {
        /* the pair's other channel in lane ^ 1: both lanes rotate it whole */
        const bool first = (lane & 1) == 0;
#pragma unroll
        for (int k = 0; k < C; k++) {
            const float c = an.c[k], sn = an.sn[k];
            float ga, gb;
            const float od = __shfl_xor_sync(0xffffffffu, dy[k], 1);
            fr_rotate(first ? dy[k] : od, first ? od : dy[k], c, sn, -1.0f, &ga, &gb);
            g[k] = first ? ga : gb;
            if (SY) {
                float ta, tb;
                const float ox = __shfl_xor_sync(0xffffffffu, xs[k], 1);
                fr_rotate(first ? xs[k] : ox, first ? ox : xs[k], c, sn, -1.0f, &ta, &tb);
                n[k] = (first ? ta : tb) / wf[k];
            } else {
                n[k] = xs[k] * rstd;
            }
        }
    } else if constexpr (IL) {
#pragma unroll
        for (int w = 0; w < C / 2; w++)
            pair(2 * w, 2 * w + 1, w); /* word w: pair lane + 16 w */
    } else {
#pragma unroll
        for (int c = 0; c < C / 2; c++)
            pair(c, c + C / 2, c); /* channel and channel + HD / 2 */
    }
    float p[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int e = 0; e < C; e++) {
        acc[e] = acc[e] + g[e] * n[e];
        const float dn = g[e] * wf[e];
        p[HALF ? e & 1 : 0] = p[HALF ? e & 1 : 0] + dn * n[e];
    }
    float sum;
    if constexpr (HALF) {
        sum = half_tree(p[0], p[1], lane);
    } else {
        sum = p[0];
#pragma unroll
        for (int off = 16; off >= 1; off /= 2)
            sum = sum + __shfl_xor_sync(0xffffffffu, sum, off);
    }
    const float m = fr_norm_mean(sum, HD);
    float v[C];
#pragma unroll
    for (int e = 0; e < C; e++) {
        const float dn = g[e] * wf[e];
        v[e] = rstd * (dn - n[e] * m);
    }
#pragma unroll
    for (int w = 0; w < HD / 32; w++) {
        if constexpr (HALF)
            d[w] = Elem<DT>::from_f2(v[2 * w], v[2 * w + 1]);
        else
            d[w] = Elem<DT>::from_f(v[w]);
    }
}

/* The lane's unit of a row's bits: a 16-bit element over a warp, a 32-bit
 * word over a half-warp. */
template <bool HALF> struct LaneWord {
    using T = uint16_t;
};
template <> struct LaneWord<true> {
    using T = uint32_t;
};

/* A token's rows of a unit as loaded: this lane's words of each row (a
 * 16-bit element in a word of its own over a warp: halves of shared words
 * took a PRMT a load and a copy), widened only when worked; their rstd; the
 * token's angles and the lane's first element of its dx row. */
template <int HD, bool IL, int G, bool HALF> struct BwdTok {
    uint32_t dy[G][HD / 32], xs[G][HD / 32];
    float rstd[G];
    LaneAngles<HD, IL, HALF> an;
    uint16_t *dx;
};

/* The shared memory of norm_backward_heads' pipeline (PIPE > 0): per warp
 * of a 128-thread block, S slots of a token's loads: lane l's 4 K words (dy,
 * the saved row, cos, sin: K each) as K 16-byte groups [slot][group][lane]
 * (a warp's 16-byte reads of a group fall on distinct banks), its rstd
 * [slot][lane], and the slot's token's dx row for the lane [slot][lane] (a
 * store and a load a token, where 4 pointers in registers took 18 more:
 * bench/RESULTS.md).  A lane reads only what its own copies and stores
 * wrote. */
template <int K, int S> struct BwdPipe {
    uint4 rows[4][S][K][32];
    float rstd[4][S][32];
    uint16_t *dx[4][S][32];
};

template <int K, int S> __device__ __forceinline__ BwdPipe<K, S> &bwd_pipe()
{
    static_assert(sizeof(BwdPipe<K, S>) <= 48 * 1024, "BwdPipe: a block's static shared memory");
    __shared__ BwdPipe<K, S> p;
    return p;
}

/* A tensor index V as a type's value, for norm_backward_heads' units: an
 * int where one is read (std::integral_constant's conversion is host code
 * to nvcc). */
template <int V> struct TensorK {
    __host__ __device__ constexpr operator int() const { return V; }
};

template <int DT, int HD, bool IL, bool SY, int G, bool HALF, int PIPE>
__global__ void FR_NORM_BWD_BOUNDS norm_backward_heads(const __grid_constant__ NParams P)
{
    static_assert(!HALF || G == 1, "norm_backward_heads: one row a half-warp");
    static_assert(PIPE == 0 || HALF, "norm_backward_heads: the pipeline over half-warps only");
    using E = typename LaneWord<HALF>::T;
    if constexpr (FR_CUDA_NORM_BWD_PDL != 0) {
        fr_pdl_wait(); /* before every read: the kernel before may write what this reads */
        fr_pdl_launch_dependents();
    }
    check_cu_seqlens(P.pos, P.tokens, P.flag);
    fold_counts_zero(P);
    constexpr int K = HD / 32;          /* the lane's words of a row */
    constexpr int C = HALF ? 2 * K : K; /* and its channels */
    constexpr int STEP = HALF ? 16 : 32; /* words from one of the lane's to the next */
    constexpr int RU = HALF ? 2 : G;     /* a unit's heads */
    constexpr int EW = HALF ? 2 : 1;     /* elements a word */
    const int lane = (int)(threadIdx.x & 31), ln = HALF ? lane & 15 : lane;
    const int64_t U = P.unit_tokens, nu = (P.t1 - P.t0 + U - 1) / U;
    const int64_t gq = (P.io[0].heads + RU - 1) / RU, gk = (P.io[1].heads + RU - 1) / RU;
    const int64_t items = nu * (gq + gk), warps = (int64_t)gridDim.x * blockDim.x / 32;
    /* the lane's weight factors, of tensor wslot's weights */
    int wslot = -1;
    float wf[C] = {};
    for (int64_t it = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; it < items;
         it += warps) {
        /* unit u of heads h0 .. h0 + RU - 1 of tensor k: units in token
         * order, each unit's head groups in order (neighbouring warps read
         * neighbouring rows) */
        const bool kq = it < nu * gq;
        /* the unit's tensor k a constant: the loop then reads its NIo's
         * fields (strides, pointers) as operands of the parameter bank,
         * where a k known only at run time kept them in registers (ptxas,
         * bf16 NeoX 128 from x, the dx pointers in shared memory: 112 ->
         * 96; bench/RESULTS.md) */
        auto unit = [&](auto kc) {
            const int k = kc;
            const NIo &io = P.io[k];
            const int64_t e = it - (k ? nu * gq : 0), groups = k ? gk : gq;
            const int64_t u = e / groups, h0 = e % groups * RU;
            /* the lane's rows: heads hl .. hl + n - 1; over half-warps half j's
             * row is head h0 + j, or where that is past the tensor's heads h0's
             * again, loaded and worked but not stored (mine false) */
            const bool mine = !HALF || h0 + (lane >> 4) < io.heads;
            const int64_t hl = HALF && mine ? h0 + (lane >> 4) : h0;
            const int n = HALF ? 1 : (int)(h0 + G < io.heads ? G : io.heads - h0);
            const int64_t ta = P.t0 + u * U, tb = ta + U < P.t1 ? ta + U : P.t1;
            const int nt = (int)(tb - ta);
            const int64_t in_ss = io.in_ss, x_ss = io.x_ss, out_ss = io.out_ss;
            const int64_t in_sh = io.in_sh, x_sh = io.x_sh, out_sh = io.out_sh;
            int64_t b, s;
            /* lane j < nt: the table offset of token ta + j's row (-1: no
             * position there; the launcher takes tables of fewer than 2^31
             * floats), shuffled to the lanes at its token */
            int toff = -1;
            if (lane < nt) {
                int bad = 0;
                divmod(ta + lane, P.seq_len, &b, &s);
                const int64_t pos = row_position(P, b, s, &bad);
                toff = bad ? -1 : (int)(pos * (HD / 2));
            }
            /* the lane's first element of head hl's row at the token (b, s),
             * stepped in elements (word strides, halved from the element ones
             * in the loop, took 21 instructions a token where these take 9) */
            const uint16_t *dyp, *xsp;
            uint16_t *dxp;
            auto rows_at = [&]() {
                dyp = (const uint16_t *)row_ptr(io.in, s, b, hl, in_ss, io.in_sb, in_sh, DT) + EW * ln;
                xsp = (const uint16_t *)row_ptr(io.x, s, b, hl, x_ss, io.x_sb, x_sh, DT) + EW * ln;
                dxp = (uint16_t *)row_ptr(io.out, s, b, hl, out_ss, io.out_sb, out_sh, DT) + EW * ln;
            };
            const float *rp = io.rstd + ta * io.heads + hl;
            /* whether row r of a token is past the unit's (never loaded): row 0
             * never is (n >= 1, which the compiler cannot see) */
            auto past = [&](int r) { return r > 0 && r >= n; };
            /* token j's loads into w: dyp, xsp, dxp and rp are at its rows */
            auto load_tok = [&](int j, BwdTok<HD, IL, G, HALF> &w) {
#pragma unroll
                for (int r = 0; r < G; r++) {
                    if (past(r))
                        break;
#pragma unroll
                    for (int c = 0; c < K; c++) {
                        w.dy[r][c] = ((const E *)(dyp + r * in_sh))[STEP * c];
                        w.xs[r][c] = ((const E *)(xsp + r * x_sh))[STEP * c];
                    }
                    w.rstd[r] = rp[r];
                }
                w.an.load(P, __shfl_sync(0xffffffffu, toff, j), ln);
                w.dx = dxp;
            };
            /* the pointers one token on */
            auto next_token = [&]() {
                if (++s == P.seq_len) {
                    s = 0;
                    b++;
                    rows_at();
                } else {
                    dyp += in_ss;
                    xsp += x_ss;
                    dxp += out_ss;
                }
                rp += io.heads;
            };
            auto weights = [&]() {
                if (k != wslot) {
                    wslot = k;
                    if constexpr (HALF)
                        lane_weights<DT, true>(P, io, ln, wf);
                    else
                        lane_weights<DT>(P, io, lane, wf);
                }
            };
            float acc[G][C] = {};
            /* a token's loaded bits widened */
            auto widen = [&](const BwdTok<HD, IL, G, HALF> &w, float (&dy)[G][C], float (&xs)[G][C],
                             float (&rs)[G]) {
#pragma unroll
                for (int r = 0; r < G; r++) {
                    if (past(r))
                        break;
#pragma unroll
                    for (int c = 0; c < C; c++) {
                        const int sh = HALF ? 16 * (c & 1) : 0;
                        dy[r][c] = Elem<DT>::to_f((uint16_t)(w.dy[r][HALF ? c / 2 : c] >> sh));
                        xs[r][c] = Elem<DT>::to_f((uint16_t)(w.xs[r][HALF ? c / 2 : c] >> sh));
                    }
                    rs[r] = w.rstd[r];
                }
            };
            /* a token's rows worked: dx stored at dxt, the terms into acc */
            auto work = [&](const LaneAngles<HD, IL, HALF> &an, uint16_t *dxt, const float (&dy)[G][C],
                            const float (&xs)[G][C], const float (&rs)[G]) {
#pragma unroll
                for (int r = 0; r < G; r++) {
                    if (past(r))
                        break;
                    uint32_t dxw[K];
                    row_dx<DT, HD, IL, SY, HALF>(wf, an, rs[r], ln, dy[r], xs[r], acc[r], dxw);
                    if (mine) {
#pragma unroll
                        for (int c = 0; c < K; c++)
                            ((E *)(dxt + r * out_sh))[STEP * c] = (E)dxw[c];
                    }
                }
            };
            divmod(ta, P.seq_len, &b, &s);
            rows_at();
            if constexpr (PIPE == 0) {
                /* the ring of tokens loaded or in flight: token j in slot j %
                 * D; the first D tokens' loads in flight while the weights
                 * are found */
#ifdef FR_CUDA_EMULATE
                /* emulated, a test's choice (host code: a count at run time) */
                const int D = fr_emu_norm_bwd_ahead > 0 && fr_emu_norm_bwd_ahead <= BWD_AHEAD_MAX
                                  ? fr_emu_norm_bwd_ahead
                                  : FR_CUDA_NORM_BWD_AHEAD;
                BwdTok<HD, IL, G, HALF> ring[BWD_AHEAD_MAX];
#else
                constexpr int D = FR_CUDA_NORM_BWD_AHEAD;
                BwdTok<HD, IL, G, HALF> ring[D];
#endif
                FR_RING_UNROLL
                for (int d = 0; d < D; d++) {
                    if (d >= nt)
                        break;
                    if (d > 0)
                        next_token();
                    load_tok(d, ring[d]);
                }
                /* FR_CUDA_NORM_BWD_PREFETCH: tokens pf ahead of the one
                 * worked prefetched, each half's (or warp's) rows by its
                 * lane 0 from the pointers, which are D - 1 tokens on here
                 * and D in the loop; one not in the pointers' sequence is
                 * left alone (a later row of the unit would need its own
                 * (b, s)).  Here the tokens D .. pf - 1, lane l (1 <= l <=
                 * pf - D) token D - 1 + l.  (rows_hd: each row 16-byte
                 * aligned, 128 or 256 bytes.) */
                const int pf = FR_BWD_PREFETCH_BUILT ? P.prefetch : 0;
                auto prefetch_at = [&](int64_t ahead) {
                    const uint16_t *r0 = dyp - EW * ln, *x0 = xsp - EW * ln;
#pragma unroll
                    for (int r = 0; r < RU; r++) {
                        if (past(r))
                            break;
                        fr_prefetch_l2(r0 + ahead * in_ss + r * in_sh, HD * 2);
                        fr_prefetch_l2(x0 + ahead * x_ss + r * x_sh, HD * 2);
                    }
                };
                if (pf > D && ln >= 1 && ln <= pf - D && D - 1 + ln < nt &&
                    s + ln < P.seq_len)
                    prefetch_at(ln);
                weights();
                for (int j0 = 0; j0 < nt; j0 += D) {
                    FR_RING_UNROLL
                    for (int d = 0; d < D; d++) {
                        const int j = j0 + d;
                        if (j >= nt)
                            break;
                        /* token j widened out of its slot, then token j + D's
                         * loads into it, in flight during the next D tokens'
                         * work */
                        BwdTok<HD, IL, G, HALF> &w = ring[d];
                        float dy[G][C], xs[G][C], rs[G];
                        widen(w, dy, xs, rs);
                        const LaneAngles<HD, IL, HALF> an = w.an;
                        uint16_t *dxt = w.dx;
                        /* past the unit's last token, that token's rows again
                         * (in L1): loads under a condition kept the slot's old
                         * bits alive beside them, ~30 moves a token
                         * (cuobjdump) */
                        if (j + D < nt)
                            next_token();
                        load_tok(j + D < nt ? j + D : nt - 1, w);
                        if (pf > D && ln == 0 && j + pf < nt && s + (pf - D) < P.seq_len)
                            prefetch_at(pf - D);
                        work(an, dxt, dy, xs, rs);
                    }
                }
            } else {
                /* PIPE tokens' loads in flight as asynchronous copies to
                 * shared memory, each token's a commit group: token j in slot
                 * j % S, S = PIPE + 1, so that token j + PIPE's copies go to
                 * the slot token j - 1 was read from (and worked: its reads
                 * are done) */
                constexpr int S = PIPE + 1;
                BwdPipe<K, S> &pp = bwd_pipe<K, S>();
                const int wi = (int)(threadIdx.x / 32);
                bool badq[S]; /* each slot's token: whether it has no position */
                auto word = [&](int q, int i) { return (uint32_t *)&pp.rows[wi][q][i / 4][lane] + i % 4; };
                /* token j's copies into slot q: dyp, xsp, dxp and rp are at
                 * its rows */
                auto issue = [&](int j, int q) {
                    using A = LaneAngles<HD, IL, HALF>;
                    const int o = __shfl_sync(0xffffffffu, toff, j);
                    const float *cr, *sr;
                    A::at(P, o, ln, &cr, &sr);
#pragma unroll
                    for (int c = 0; c < K; c++) {
                        __pipeline_memcpy_async(word(q, c), (const E *)dyp + STEP * c, 4);
                        __pipeline_memcpy_async(word(q, K + c), (const E *)xsp + STEP * c, 4);
                    }
#pragma unroll
                    for (int c = 0; c < K; c++) {
                        __pipeline_memcpy_async(word(q, 2 * K + c), cr + A::col(c, ln), 4);
                        __pipeline_memcpy_async(word(q, 3 * K + c), sr + A::col(c, ln), 4);
                    }
                    __pipeline_memcpy_async(&pp.rstd[wi][q][lane], rp, 4);
                    pp.dx[wi][q][lane] = dxp;
                    badq[q] = o < 0;
                };
#pragma unroll
                for (int d = 0; d < PIPE; d++) {
                    if (d < nt) {
                        if (d > 0)
                            next_token();
                        issue(d, d);
                    }
                    __pipeline_commit();
                }
                weights();
                for (int j0 = 0; j0 < nt; j0 += S) {
#pragma unroll
                    for (int d = 0; d < S; d++) {
                        const int j = j0 + d;
                        if (j >= nt)
                            break;
                        if (j + PIPE < nt) {
                            next_token();
                            issue(j + PIPE, (d + PIPE) % S);
                        }
                        __pipeline_commit(); /* empty past the unit: one group a token */
                        __pipeline_wait_prior(PIPE);
                        BwdTok<HD, IL, G, HALF> w;
                        uint32_t v[4 * K];
#pragma unroll
                        for (int i = 0; i < K; i++) {
                            const uint4 g4 = pp.rows[wi][d][i][lane];
                            v[4 * i] = g4.x;
                            v[4 * i + 1] = g4.y;
                            v[4 * i + 2] = g4.z;
                            v[4 * i + 3] = g4.w;
                        }
#pragma unroll
                        for (int c = 0; c < K; c++) {
                            w.dy[0][c] = v[c];
                            w.xs[0][c] = v[K + c];
                            w.an.c[c] = fr_u2f(v[2 * K + c]);
                            w.an.sn[c] = fr_u2f(v[3 * K + c]);
                        }
                        w.an.nan_if(badq[d]);
                        w.rstd[0] = pp.rstd[wi][d][lane];
                        float dy[G][C], xs[G][C], rs[G];
                        widen(w, dy, xs, rs);
                        work(w.an, pp.dx[wi][d][lane], dy, xs, rs);
                    }
                }
            }
            /* the (chunk, head) partials: the unit is the segment's chunk u */
            if (io.hp != nullptr && mine) {
#pragma unroll
                for (int r = 0; r < G; r++) {
                    if (past(r))
                        break;
                    float *o = io.hp + (u * io.heads + hl + r) * HD;
#pragma unroll
                    for (int c = 0; c < C; c++)
                        o[lane_channel<HALF>(ln, c)] = acc[r][c];
                }
            }
        };
#ifdef FR_CUDA_EMULATE
        /* emulated, one copy of the unit's code, k a variable: the same
         * operations (the constant only frees registers), and the
         * emulation's compile 55 -> 33 s (gcc 12, -O2) */
        unit(kq ? 0 : 1);
#else
        if (kq)
            unit(TensorK<0>());
        else
            unit(TensorK<1>());
#endif
    }
}

/* ---------------------------------------------------------------- host side */

/* Stream-ordered scratch and zeroing (plain host memory when emulated). */
cudaError_t scratch_alloc(void **p, size_t n, cudaStream_t stream)
{
#ifdef FR_CUDA_EMULATE
    (void)stream;
    *p = malloc(n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
#else
    return cudaMallocAsync(p, n, stream);
#endif
}

cudaError_t scratch_free(void *p, cudaStream_t stream)
{
#ifdef FR_CUDA_EMULATE
    (void)stream;
    free(p);
    return cudaSuccess;
#else
    return cudaFreeAsync(p, stream);
#endif
}

cudaError_t zero(void *p, size_t n, cudaStream_t stream)
{
#ifdef FR_CUDA_EMULATE
    (void)stream;
    memset(p, 0, n);
    return cudaSuccess;
#else
    return cudaMemsetAsync(p, 0, n, stream);
#endif
}

/* Whether the backward's common rows take norm_backward_heads over
 * half-warps. */
bool bwd_half()
{
    return FR_CHOICE(fr_emu_norm_bwd_half, FR_CUDA_NORM_BWD_HALF) != 0;
}

/* The heads a warp of norm_backward_heads over a warp takes at a token,
 * for a call of `units` units of one head. */
int bwd_heads(const NParams &P, int64_t units)
{
#ifdef FR_CUDA_EMULATE
    if (fr_emu_norm_bwd_heads > 0)
        return fr_emu_norm_bwd_heads;
#endif
    return units <= (int64_t)FR_CUDA_NORM_BWD_WAVE * P.sms ? 1 : FR_CUDA_NORM_BWD_HEADS;
}

/* norm_backward_heads over tokens t0..t1 in units of g heads, or (HALF) of
 * two heads over half-warps, at most FR_CUDA_NORM_BWD_GRID blocks an SM. */
template <int DT, int HD, int G, bool HALF, int PIPE, bool IL>
cudaError_t launch_heads_g(const cudaLaunchConfig_t &cfg, const NParams &P)
{
#define FR_BWD_KERNEL(SY) norm_backward_heads<DT, HD, IL, SY, G, HALF, PIPE>
#ifdef FR_CUDA_EMULATE
    return P.saved_y ? fr_emu_launch_lockstep(&cfg, FR_BWD_KERNEL(true), P)
                     : fr_emu_launch_lockstep(&cfg, FR_BWD_KERNEL(false), P);
#else
    return P.saved_y ? cudaLaunchKernelEx(&cfg, FR_BWD_KERNEL(true), P)
                     : cudaLaunchKernelEx(&cfg, FR_BWD_KERNEL(false), P);
#endif
#undef FR_BWD_KERNEL
}

template <int DT, int HD, int G, bool HALF = false, int PIPE = 0>
cudaError_t launch_heads_g(const cudaLaunchConfig_t &cfg, const NParams &P)
{
    return P.interleaved ? launch_heads_g<DT, HD, G, HALF, PIPE, true>(cfg, P)
                         : launch_heads_g<DT, HD, G, HALF, PIPE, false>(cfg, P);
}

/* The half-warp kernel with the build's pipeline (emulated, a test's
 * choice: 0, 1, 3 or the build's; a deeper one than 1 is built as the
 * build's where that is deeper, else as 3, so the tests run a pipeline
 * whose slots wrap whatever the default). */
template <int DT, int HD>
cudaError_t launch_half(const cudaLaunchConfig_t &cfg, const NParams &P)
{
#ifdef FR_CUDA_EMULATE
    constexpr int deep = FR_CUDA_NORM_BWD_PIPE > 1 ? FR_CUDA_NORM_BWD_PIPE : 3;
    const int pipe = FR_CHOICE(fr_emu_norm_bwd_pipe, FR_CUDA_NORM_BWD_PIPE);
    return pipe == 0   ? launch_heads_g<DT, HD, 1, true, 0>(cfg, P)
           : pipe == 1 ? launch_heads_g<DT, HD, 1, true, 1>(cfg, P)
                       : launch_heads_g<DT, HD, 1, true, deep>(cfg, P);
#else
    return launch_heads_g<DT, HD, 1, true, FR_CUDA_NORM_BWD_PIPE>(cfg, P);
#endif
}

/* g heads a unit, 0 for two over half-warps */
template <int DT, int HD>
cudaError_t launch_heads(const NParams &P, int g, cudaStream_t stream)
{
    const int64_t nu = (P.t1 - P.t0 + P.unit_tokens - 1) / P.unit_tokens, ru = g > 0 ? g : 2;
    const int64_t units = nu * ((P.io[0].heads + ru - 1) / ru + (P.io[1].heads + ru - 1) / ru);
    if (units == 0)
        return cudaSuccess;
    cudaLaunchConfig_t cfg = grid_of(32 * units, FR_CUDA_NORM_BWD_GRID, P.sms, stream);
    cudaLaunchAttribute attr;
    fr_cuda_pdl_attr(&cfg, &attr, P.pdl);
#ifdef FR_CUDA_EMULATE
    if (g == 0)
        return launch_half<DT, HD>(cfg, P);
    /* every count a test may choose, the default among them */
    return g == 4   ? launch_heads_g<DT, HD, 4>(cfg, P)
           : g == 3 ? launch_heads_g<DT, HD, 3>(cfg, P)
           : g == 2 ? launch_heads_g<DT, HD, 2>(cfg, P)
                    : launch_heads_g<DT, HD, 1>(cfg, P);
#else
    /* the build's layout only (g is 0 exactly where it is half-warps): the
     * other's kernels took a fifth of this file's nvcc time */
    if constexpr (FR_CUDA_NORM_BWD_HALF != 0)
        return launch_half<DT, HD>(cfg, P);
    else /* 1, and the build's other count where it has one */
        return g == 1 ? launch_heads_g<DT, HD, 1>(cfg, P)
                      : launch_heads_g<DT, HD, FR_CUDA_NORM_BWD_HEADS>(cfg, P);
#endif
}

/* norm_backward_heads over tokens t0..t1: units of a chunk where dw is
 * asked for (hp set), else of as many tokens as fill a wave of units (at
 * most a chunk: a unit's tokens are a warp's lanes). */
cudaError_t launch_heads_all(NParams &P, int64_t hd, cudaStream_t stream)
{
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK, tokens = P.t1 - P.t0;
    const int64_t wave = (int64_t)FR_CUDA_NORM_BWD_WAVE * P.sms;
    const bool half = bwd_half();
    /* the units of one head, or of two, a token */
    const int64_t per_token =
        half ? (P.io[0].heads + 1) / 2 + (P.io[1].heads + 1) / 2 : P.heads;
    int64_t u = C;
    if (P.io[0].hp == nullptr && P.io[1].hp == nullptr) {
        u = (tokens * per_token + wave - 1) / wave;
        u = u < 1 ? 1 : u > C ? C : u;
    }
    P.unit_tokens = u;
    const int g = half ? 0 : bwd_heads(P, (tokens + u - 1) / u * P.heads);
    if (P.dt == DT_F16)
        return hd == 64 ? launch_heads<DT_F16, 64>(P, g, stream)
                        : launch_heads<DT_F16, 128>(P, g, stream);
    return hd == 64 ? launch_heads<DT_BF16, 64>(P, g, stream)
                    : launch_heads<DT_BF16, 128>(P, g, stream);
}

/* The backward's dw scratch a segment (the (chunk, head) partials, and the
 * generic row kernel's terms) takes at most this much: a longer call runs
 * in segments of whole chunks of tokens. */
constexpr int64_t TERMS_BYTES = (int64_t)128 << 20;

/* The tokens of one segment: whole chunks, the scratch of all within
 * TERMS_BYTES (one chunk at least), no more than the call has. */
int64_t segment_tokens(int64_t tokens, int64_t floats_per_chunk)
{
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK;
    int64_t seg = TERMS_BYTES / (4 * floats_per_chunk) * C;
#ifdef FR_CUDA_EMULATE
    if (fr_emu_norm_seg_chunks > 0)
        seg = fr_emu_norm_seg_chunks * C;
#endif
    if (seg < C)
        seg = C;
    return seg < tokens ? seg : (tokens + C - 1) / C * C;
}

/* norm_dw_fold over the segment P.t0..P.t1, its blocks fold_ranges a
 * group of the P.fold_n groups of channels: they meet at barriers
 * (emulated, as fibers in lockstep) */
cudaError_t launch_fold(const NParams &P, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(P.fold_n * fold_ranges(seg_chunks(P))), 1, 1);
    cfg.blockDim = dim3(FOLD_THREADS, 1, 1);
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    fr_cuda_pdl_attr(&cfg, &attr, P.pdl);
#ifdef FR_CUDA_EMULATE
    return fr_emu_launch_lockstep(&cfg, norm_dw_fold, P);
#else
    return cudaLaunchKernelEx(&cfg, norm_dw_fold, P);
#endif
}

/* dx, and dw where asked for, per segment of tokens: the common rows by
 * norm_backward_heads, which leaves each (chunk, head)'s partial, the
 * others by the row kernel, which leaves each row's g * n terms, and
 * norm_dw_chunks, which sums a (chunk, head)'s terms; then norm_dw_fold,
 * each chunk's heads' partials in head order, the chunks' in chunk order
 * onto dw.  Without dw, the row kernel over all tokens. */
cudaError_t backward_launches(NParams &P, int count, cudaStream_t stream)
{
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK, hd = rows_hd(P, count, true);
    /* the scratch floats a chunk: each (chunk, head)'s partial, the
     * generic row kernel's terms, and the chunk's sum (norm_dw_fold) */
    int64_t hpf[2] = { 0, 0 }, tf[2] = { 0, 0 }, csf[2] = { 0, 0 };
    for (int k = 0; k < count; k++)
        if (P.io[k].dw != nullptr) {
            hpf[k] = P.io[k].heads * P.io[k].hd;
            tf[k] = hd == 0 ? C * hpf[k] : 0;
            csf[k] = P.io[k].hd;
        }
    void *scratch = nullptr;
    cudaError_t err = cudaSuccess;
    if (hpf[0] + hpf[1] == 0)
        return hd != 0 ? launch_heads_all(P, hd, stream)
                       : launch(norm_dx, P.tokens * P.heads, P, stream);
    const int64_t per_chunk = hpf[0] + hpf[1] + tf[0] + tf[1] + csf[0] + csf[1];
    const int64_t seg = segment_tokens(P.tokens, per_chunk), nks = seg / C;
    /* the floats, then the fold's counts (as many 32-bit words) */
    const size_t floats = (size_t)(nks * per_chunk);
    P.fold_n = fold_groups(P.io[0]) + fold_groups(P.io[1]);
    if ((err = scratch_alloc(&scratch, (floats + (size_t)P.fold_n) * 4, stream)) != cudaSuccess)
        return err;
    float *f = (float *)scratch;
    for (int k = 0; k < 2; k++) {
        P.io[k].hp = hpf[k] ? f : nullptr;
        f += nks * hpf[k];
        P.io[k].terms = tf[k] ? f : nullptr;
        f += nks * tf[k];
        P.io[k].cs = csf[k] ? f : nullptr;
        f += nks * csf[k];
    }
    P.fold_count = (unsigned *)f;
    for (int64_t t0 = 0; t0 < P.tokens && err == cudaSuccess; t0 += seg) {
        P.t0 = t0;
        P.t1 = t0 + seg < P.tokens ? t0 + seg : P.tokens;
        if (hd != 0) {
            err = launch_heads_all(P, hd, stream);
        } else {
            err = launch(norm_dx, (P.t1 - P.t0) * P.heads, P, stream);
            if (err == cudaSuccess)
                err = launch(norm_dw_chunks, seg_chunks(P) * (hpf[0] + hpf[1]), P, stream);
        }
        if (err == cudaSuccess)
            err = launch_fold(P, stream);
    }
    const cudaError_t e2 = scratch_free(scratch, stream);
    return err != cudaSuccess ? err : e2;
}

} /* namespace */

extern "C" fusedrope_status fr_cuda_norm_backward(const fr_norm_args *na)
{
    cudaStream_t stream = (cudaStream_t)na->a.stream;
    NParams P;
    cudaError_t err = cudaSuccess;
    int dev;

    TRY(fr_cuda_check_device(na->a.cache, &dev)); /* before dw is zeroed */
    for (int k = 0; k < 2; k++)
        if (na->dw_zero[k] != nullptr &&
            (err = zero(na->dw_zero[k], (size_t)na->dw_zero_n[k] * sizeof(float), stream)) !=
                cudaSuccess)
            return fr_cuda_fail(err, "zeroing a weight gradient");
    if (na->a.count == 0)
        return FUSEDROPE_OK;
    params(na, &P);
    P.sms = fr_cuda_sm_count(dev);
    {
        /* the attribute only where the kernels wait (fr_pdl_wait: sm_90 code) */
        static int code_arch[64];
        P.pdl = FR_CHOICE(fr_emu_norm_bwd_pdl, FR_CUDA_NORM_BWD_PDL) != 0 &&
                fr_cuda_cc_major(dev) >= 9 &&
                fr_cuda_code_arch(dev, (const void *)norm_dw_fold, code_arch) >= 90;
    }
    P.prefetch = fr_cuda_cc_major(dev) >= 9 ? FR_CHOICE(fr_emu_norm_bwd_prefetch,
                                                        FR_CUDA_NORM_BWD_PREFETCH) : 0;
    if (P.cos == nullptr && P.inv_freq == nullptr)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "fr_cuda_norm_backward: the cache has neither a device table nor frequencies");
    err = backward_launches(P, na->a.count, stream);
    if (err != cudaSuccess)
        return fr_cuda_fail(err, "the norm backward's kernels or their dw scratch");
    return FUSEDROPE_OK;
}
