/*
 * cuda_norm_forward.cu - the CUDA backend of the fused per-head RMSNorm +
 * RoPE's forward (fusedrope_norm_forward_qk(3)): fr_cuda_norm_forward.
 * What it shares with the backward is in kernels/cuda_norm.cuh, whose
 * comment gives the rule of both.
 *
 * A row: its sum of squares in the contract's order (32 partial sums,
 * channel c into sum c % 32, then the tree), rstd, then pair by pair: both
 * channels read, scaled as the rounding mode says, rotated, written (in
 * place safe: a pair is read before it is written); channels past rot_dim
 * scaled and written.  The generic kernel (norm_forward, a thread per row,
 * any shape) reads a row again in each pass (L1/L2) with scalar loads; the
 * common shapes (16-bit, head_dim 64 or 128, full rotary, a table cache, 1D
 * positions, rows on 16 bytes: rows_hd) take kernels that hold a row in
 * registers: norm_forward_half (a pair of rows over a warp's halves, one or
 * two pairs a step, a warp taking up to FR_CUDA_NORM_WARP_HEADS rows of a
 * token) or
 * norm_forward_warp (a row over a warp's lanes; FR_CUDA_NORM_WARP_HALF
 * chooses) or, where FR_CUDA_NORM_WARP_ROWS is set to say so,
 * norm_forward_rows (a thread per row, 16-byte loads; the same bytes).
 *
 * With FR_CUDA_EMULATE (kernels/cuda_norm_forward_emu.cc) the host C++
 * compiler builds it and kernels/cuda_emu.h runs the kernels on the CPU:
 * threads share nothing but the warp kernels' shuffles, so running them
 * one after another, a warp's lanes in lockstep for those kernels, gives
 * what the device gives.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#ifdef FR_CUDA_EMULATE
#include "cuda_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "internal.h"
#include "cuda_util.cuh"
#endif
#include "cuda_device.cuh"
#include "norm_math.h"

/* The forward's common rows take norm_forward_warp, rows over a warp, in a
 * call of at most this many rows, and norm_forward_rows, a thread per row,
 * in a larger one.  By default every call takes the warp kernel: on the H100
 * it was faster at every size measured, 64 to 4096 tokens of 32 + 8 heads
 * (2560 to 163840 rows; 0.563 of a copy against 0.357 at 4096 tokens, 2.9x
 * at 64; bench/RESULTS.md, 2026-11-27).  The thread-per-row kernel stays for
 * a device where that is not so: NVCCFLAGS=-DFR_CUDA_NORM_WARP_ROWS=0 always
 * takes it, a row count takes it above that count. */
#ifndef FR_CUDA_NORM_WARP_ROWS
#define FR_CUDA_NORM_WARP_ROWS INT64_MAX
#endif

/* Rows a warp of norm_forward_warp holds at a time (1 to 4; an item of
 * fewer rows takes 1): 1.  While each load was waited for where it was
 * issued (its widening came right after it), the H100 ran the kernel at the
 * speed of the warps an SM holds, which its registers set: 4 rows sharing
 * one tree and rstd (92 registers, 20 warps an SM) 0.42 of a copy, 2 rows
 * (70, 28 warps) 0.47, 1 row with the next one's loads "ahead" (64, 32
 * warps) 0.52, 1 row (56, 36 warps) 0.56 (bench/RESULTS.md, 2026-11-27);
 * not yet measured since the loads stay in flight. */
#ifndef FR_CUDA_NORM_WARP_RPW
#define FR_CUDA_NORM_WARP_RPW 1
#endif

/* Whether a warp of norm_forward_warp issues its item's next rows' loads
 * before it works the current ones (1) or after (0).  Measured on the H100
 * only while the loads' widening waited for them (0.0617 ms against 0.0574
 * without, bench/RESULTS.md, 2026-11-27): overlapping nothing, it cost
 * registers alone; now the bits stay unwidened until used. */
#ifndef FR_CUDA_NORM_WARP_AHEAD
#define FR_CUDA_NORM_WARP_AHEAD 1
#endif

/* Whether the warp kernel's calls take norm_forward_half, two rows a warp
 * over its halves in 32-bit words, one pair of rows a step (1) or two (2),
 * or norm_forward_warp, a row over the warp in 16-bit elements (0).  Two
 * pairs a step, with FR_CUDA_NORM_WARP_HEADS 16 and FR_CUDA_NORM_WARP_MINB
 * 7, was the fastest the H200 measured (bf16 Qwen3 [4096, 32 + 8 heads]
 * 0.797 of a copy; one pair a step 0.744, a row a warp 0.631:
 * bench/RESULTS.md, 2026-11-29). */
#ifndef FR_CUDA_NORM_WARP_HALF
#define FR_CUDA_NORM_WARP_HALF 2
#endif
static_assert(FR_CUDA_NORM_WARP_HALF >= 0 && FR_CUDA_NORM_WARP_HALF <= 2,
              "FR_CUDA_NORM_WARP_HALF: 0 (rows over warps), 1 or 2 (pairs over half-warps)");
static_assert(FR_CUDA_NORM_WARP_RPW >= 1 && FR_CUDA_NORM_WARP_RPW <= 4,
              "FR_CUDA_NORM_WARP_RPW: 1 to 4 rows a warp");

/* The most rows (heads of one token) a warp of norm_forward_warp takes as
 * one item: the token's position, cos/sin and the weights are found once an
 * item, so the rows after the first cost only their own loads, sums and
 * rotations.  A call of few rows takes fewer a warp (warp_heads), so that
 * its warps still fill the device.  16 (8 before): with two pairs a step
 * and FR_CUDA_NORM_WARP_MINB 7, 0.797 of a copy at [4096, 32 + 8 heads],
 * where 8 rows and no bound took 0.744; with one pair a step 16 and 8
 * measured alike (bench/RESULTS.md, 2026-11-29). */
#ifndef FR_CUDA_NORM_WARP_HEADS
#define FR_CUDA_NORM_WARP_HEADS 16
#endif
static_assert(FR_CUDA_NORM_WARP_HEADS >= 1, "FR_CUDA_NORM_WARP_HEADS: at least 1 row an item");

/* The blocks of 128 threads the warp kernels ask ptxas to fit an SM (0:
 * none asked): what the H100 measured followed the warps an SM holds, which
 * the registers set (FR_CUDA_NORM_WARP_RPW's numbers), so fewer registers
 * may pay even for a few spilled to L1.  7 holds norm_forward_half's two
 * pairs a step at 72 registers (24 bytes spilled in bf16, 48 in fp16;
 * 77-80 without), 28 warps an SM (its one pair a step takes 66-68 where
 * 64): with items of 16 rows the H200's fastest (FR_CUDA_NORM_WARP_HALF;
 * ptxas of nvcc 13.0, sm_90, head_dim 128). */
#ifndef FR_CUDA_NORM_WARP_MINB
#define FR_CUDA_NORM_WARP_MINB 7
#endif
#if FR_CUDA_NORM_WARP_MINB > 0
#define FR_NORM_WARP_BOUNDS __launch_bounds__(128, FR_CUDA_NORM_WARP_MINB)
#else
#define FR_NORM_WARP_BOUNDS __launch_bounds__(128)
#endif

/* The most blocks of 128 threads an SM in norm_forward_warp's grid (its
 * warps take the items beyond them grid-stride); 0: no bound, a warp an
 * item, the hardware handing blocks to SMs as they free up.  16 asks for
 * more blocks than an SM holds at 51 registers (9), so a long call runs a
 * full wave and a partial one (ncu at 4096 tokens: 1.78 waves, 47% of the
 * 56% occupancy reached: bench/RESULTS.md).  Not yet measured otherwise. */
#ifndef FR_CUDA_NORM_WARP_GRID
#define FR_CUDA_NORM_WARP_GRID 16
#endif
static_assert(FR_CUDA_NORM_WARP_GRID >= 0, "FR_CUDA_NORM_WARP_GRID: 0 or blocks an SM");

/* Whether a warp of norm_forward_half prefetches its item's rows into L2
 * at the item's start (fr_prefetch_l2; sm_90 and later), lane j row j, the
 * rows after its first step's: its registers hold at most two steps' rows
 * (ncu on the H200: DRAM 53% busy, issue slots 60%, 34% occupancy:
 * bench/RESULTS.md, 2026-11-30), and prefetched, the later steps' loads
 * wait on L2 rather than DRAM, for no register more.  0 until measured. */
#ifndef FR_CUDA_NORM_WARP_PREFETCH
#define FR_CUDA_NORM_WARP_PREFETCH 0
#endif
/* whether the kernel holds the prefetch's code (the emulation's, for the
 * tests' choices, always) */
#if defined FR_CUDA_EMULATE || FR_CUDA_NORM_WARP_PREFETCH != 0
#define FR_WARP_PREFETCH_BUILT 1
#else
#define FR_WARP_PREFETCH_BUILT 0
#endif

#ifdef FR_CUDA_EMULATE
/* Emulated, a test chooses: the row kernel (1: the warp's, 0: the
 * thread's, -1: FR_CUDA_NORM_WARP_ROWS decides), the warp kernel's layout
 * (1 or 2: half-warps, a pair or two a step, 0: warps, -1:
 * FR_CUDA_NORM_WARP_HALF decides), its rows
 * at a time (0: FR_CUDA_NORM_WARP_RPW), its items' rows (0: warp_heads
 * decides), its grid's blocks (so that each warp steps through
 * several items) and whether its items' rows are prefetched
 * (FR_CUDA_NORM_WARP_PREFETCH). */
extern "C" {
int fr_emu_norm_warp = -1;
int fr_emu_norm_warp_rpw = 0;
int fr_emu_norm_warp_heads = 0;
int fr_emu_norm_warp_half = -1;
int fr_emu_norm_warp_blocks = 0; /* the warp kernels' grid: at most this many blocks (0: no bound) */
int fr_emu_norm_warp_prefetch = -1; /* 0, 1; -1: FR_CUDA_NORM_WARP_PREFETCH */
int (*fr_emu_prefetch_check)(const void *p, unsigned bytes) = nullptr; /* cuda_device.cuh */
}
#endif

namespace {

#include "cuda_elem.cuh"
#include "cuda_index.cuh"
#include "cuda_norm.cuh"

/* Whether a forward of `rows` common rows takes the warp kernel. */
bool warp_rows(int64_t rows)
{
    return FR_CHOICE(fr_emu_norm_warp, rows <= FR_CUDA_NORM_WARP_ROWS) != 0;
}

/* Whether the warp kernel's calls take norm_forward_half (0: no; 1 or 2:
 * its pairs of rows a step). */
int warp_half()
{
    return FR_CHOICE(fr_emu_norm_warp_half, FR_CUDA_NORM_WARP_HALF);
}

/* The rows a warp of norm_forward_warp holds at a time. */
int warp_rpw()
{
#ifdef FR_CUDA_EMULATE
    if (fr_emu_norm_warp_rpw > 0)
        return fr_emu_norm_warp_rpw;
#endif
    return FR_CUDA_NORM_WARP_RPW;
}

/* norm_forward_warp's items a token: each tensor's heads in groups of
 * P.warp_heads (its last fewer), q's groups then k's, so that an item's
 * rows are of one tensor (the launcher sizes its grid by them, the kernel
 * walks them); warp_groups0: q's. */
int64_t warp_groups0(const NParams &P)
{
    return (P.heads0 + P.warp_heads - 1) / P.warp_heads;
}

int64_t warp_groups(const NParams &P)
{
    return warp_groups0(P) + (P.heads - P.heads0 + P.warp_heads - 1) / P.warp_heads;
}

/* An item of the forward's warp kernels (warp_groups' groups a token):
 * its token t = (b, s), tensor k, first head h0 and rows n (P.warp_heads,
 * the tensor's last group fewer). */
struct WarpItem {
    int64_t t, h0, b, s;
    int k, n;
};

/* f(m) for each item m of the forward's warp kernels, a warp an item,
 * grid-stride: item it is group it % groups of token P.t0 + it / groups.
 * The divisions are the warp's first item's alone; each later item is the
 * last one stepped by the grid's warps, step_t tokens and step_g groups
 * (the host's division: launch_warps), carried, and its (b, s) likewise
 * (two 64-bit divisions an item took ~55 of its ~280 instructions:
 * bench/RESULTS.md). */
template <typename F> __device__ __forceinline__ void each_warp_item(const NParams &P, F f)
{
    const int64_t g0 = P.groups_q, groups = P.groups, G = P.warp_heads;
    const int64_t it = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    WarpItem m;
    int64_t g = it % groups;
    m.t = P.t0 + it / groups;
    m.b = m.t / P.seq_len;
    m.s = m.t % P.seq_len;
    /* the items are the tokens' up to P.t1, which is where the walk ends */
    while (m.t < P.t1) {
        m.k = g >= g0;
        m.h0 = (m.k ? g - g0 : g) * G;
        m.n = (int)(m.h0 + G < P.io[m.k].heads ? G : P.io[m.k].heads - m.h0);
        f(m);
        g += P.step_g;
        m.t += P.step_t;
        m.b += P.step_b;
        m.s += P.step_s;
        if (g >= groups) {
            g -= groups;
            m.t++;
            m.s++;
        }
        if (m.s >= P.seq_len) {
            m.s -= P.seq_len;
            m.b++;
        }
    }
}

/* The generic kernel: a thread per row of any shape (walk_rows). */
__global__ void norm_forward(const __grid_constant__ NParams P)
{
    check_cu_seqlens(P.pos, P.tokens, P.flag);
    const NIo *io = nullptr;
    const void *x = nullptr;
    void *y = nullptr;
    int64_t t = 0, h = 0, b = 0, s = 0;
    float rstd = 0.0f;
    walk_rows(
        P,
        [&](const NIo &o, int64_t t_, int64_t h_, int64_t b_, int64_t s_) {
            io = &o;
            t = t_;
            h = h_;
            b = b_;
            s = s_;
            x = row_ptr(o.in, s, b, h, o.in_ss, o.in_sb, o.in_sh, P.dt);
            y = (void *)row_ptr(o.out, s, b, h, o.out_ss, o.out_sb, o.out_sh, P.dt);
        },
        [&](int64_t c) {
            const float v = load_f(x, P.dt, c);
            return v * v;
        },
        [&](float sum) {
            rstd = fr_norm_rstd(sum, io->hd, P.eps);
            if (io->rstd != nullptr)
                io->rstd[t * io->heads + h] = rstd;
        },
        [&](int64_t i, int64_t ca, int64_t cb) {
            float c, sn, ya, yb;
            const float va = fr_norm_value(load_f(x, P.dt, ca), rstd, weight_factor(P, *io, ca),
                                           P.rounding, P.dt);
            const float vb = fr_norm_value(load_f(x, P.dt, cb), rstd, weight_factor(P, *io, cb),
                                           P.rounding, P.dt);
            angle(P, b, s, i, &c, &sn);
            fr_rotate(va, vb, c, sn, 1.0f, &ya, &yb);
            store_f(y, P.dt, ca, ya);
            store_f(y, P.dt, cb, yb);
        },
        [&](int64_t ch) {
            store_f(y, P.dt, ch,
                    fr_norm_value(load_f(x, P.dt, ch), rstd, weight_factor(P, *io, ch),
                                  P.rounding, P.dt));
        });
}

/* ------------------------------------------------- rows held in registers */

/*
 * The common shapes take kernels of their own: 16-bit dtypes, a table cache,
 * 1D positions, full rotary (rot_dim = head_dim), head_dim HD of 64 or 128, every row
 * starting on 16 bytes (wider rows and float32 spilled registers in the
 * thread-per-row backward this replaced, and each instantiation cost the
 * build about 20 s of nvcc).  Still one thread per row, so no launch
 * shape changes a result, but the row arrives in 16-byte loads and stays in
 * registers, the pairs fully unrolled, and the token's position is found
 * once per row.  The arithmetic is the generic walk's (walk_rows with
 * norm_forward's or norm_dx's functions) operation for operation; the
 * conversions are the plain kernels' (cuda_elem.cuh), which give the bits
 * of rope_math.h's for every value a kernel narrows (each is the result of
 * float arithmetic: a NaN is the canonical one).  The generic kernels'
 * scalar loads, each pass reading the row again, ran at 0.037 of a copy
 * (forward) on an H200 (bench/RESULTS.md).
 */
template <int DT, int N> struct Row {
    static constexpr int W = N * (DT == DT_F32 ? 4 : 2) / 4; /* 32-bit words */
    uint32_t w[W];

    __device__ __forceinline__ void load(const void *p)
    {
#pragma unroll
        for (int j = 0; j < W / 4; j++) {
            const uint4 v = ld16((const char *)p + 16 * j);
            w[4 * j] = v.x;
            w[4 * j + 1] = v.y;
            w[4 * j + 2] = v.z;
            w[4 * j + 3] = v.w;
        }
    }
    __device__ __forceinline__ void store(void *p) const
    {
#pragma unroll
        for (int j = 0; j < W / 4; j++)
            st16((char *)p + 16 * j, make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]));
    }
    __device__ __forceinline__ float get(int c) const
    {
        if constexpr (DT == DT_F32)
            return fr_u2f(w[c]);
        else
            return Elem<DT>::to_f((uint16_t)(w[c >> 1] >> ((c & 1) * 16)));
    }
    __device__ __forceinline__ void set(int c, float f)
    {
        if constexpr (DT == DT_F32) {
            w[c] = fr_f2u(f);
        } else {
            const uint32_t h = Elem<DT>::from_f(f);
            w[c >> 1] = (c & 1) ? (w[c >> 1] & 0x0000ffffu) | (h << 16)
                                : (w[c >> 1] & 0xffff0000u) | h;
        }
    }
};

/* The weight factor of channel c alone (norm_forward_rows). */
template <int DT>
__device__ __forceinline__ float row_weight(const NParams &P, const NIo &io, int c)
{
    float wf[1];
    lane_weights<DT>(P, io, c, wf);
    return wf[0];
}

/* Two channels' values, for norm_value2: FR_NORM_VALUE's operations on each. */
struct Two {
    float a, b;
};
__device__ __forceinline__ Two operator*(Two u, float s) { return {u.a * s, u.b * s}; }
__device__ __forceinline__ Two operator*(Two u, Two v) { return {u.a * v.a, u.b * v.b}; }

/* Two values rounded to the dtype DT, as floats, by cuda_elem.cuh's
 * conversions there and back: on a GPU one packed conversion (F2FP) for the
 * two and a widening each, where fr_norm_round takes integer steps and a
 * conversion a value took an F2F each; the same bits for every non-NaN
 * value, and NaN for NaN.  A NaN's payload and sign do not matter here:
 * what is rounded only enters float arithmetic, and the store's conversion
 * writes the dtype's own NaN (Elem::from_f2_any_nan: float16 without
 * fr_float_to_half's NaN select). */
template <int DT> __device__ __forceinline__ Two elem_round2(Two v, int)
{
    if constexpr (DT == DT_F32) {
        return v;
    } else {
        const uint32_t w = Elem<DT>::from_f2_any_nan(v.a, v.b);
        return {Elem<DT>::to_f((uint16_t)w), Elem<DT>::to_f((uint16_t)(w >> 16))};
    }
}

/* fr_norm_value for the register-row kernels, of channels a and b (the
 * same rstd), their roundings together */
template <int DT>
__device__ __forceinline__ void norm_value2(float xa, float xb, float rstd, float wa, float wb,
                                            int rounding, float *ya, float *yb)
{
    Two y;
    FR_NORM_VALUE(y, (Two{xa, xb}), rstd, (Two{wa, wb}), rounding, DT, elem_round2<DT>);
    *ya = y.a;
    *yb = y.b;
}

/* Pair i's channels in a row of HD channels, all rotated (rope_math.h's
 * rules; constants once the loops are unrolled). */
template <int HD, bool IL> __device__ __forceinline__ void pair_ab(int i, int *ca, int *cb)
{
    int64_t a, b;
    fr_pair_channels(IL, i, HD / 2, &a, &b);
    *ca = (int)a;
    *cb = (int)b;
}

/* The forward's pairs of a row held in v: normalised as rounding mode RND
 * says, rotated, back into v. */
template <int DT, int HD, bool IL, int RND>
__device__ __forceinline__ void rotate_row(const NParams &P, const NIo &io, const RowAngles &a,
                                           float rstd, Row<DT, HD> &v)
{
#pragma unroll
    for (int i = 0; i < HD / 2; i++) {
        int ca, cb;
        pair_ab<HD, IL>(i, &ca, &cb);
        float c, sn, ya, yb;
        pair_angle(a, i, &c, &sn);
        float va, vb;
        norm_value2<DT>(v.get(ca), v.get(cb), rstd, row_weight<DT>(P, io, ca),
                        row_weight<DT>(P, io, cb), RND, &va, &vb);
        fr_rotate(va, vb, c, sn, 1.0f, &ya, &yb);
        v.set(ca, ya);
        v.set(cb, yb);
    }
}

template <int DT, int HD, bool IL>
__global__ void __launch_bounds__(128) norm_forward_rows(const __grid_constant__ NParams P)
{
    check_cu_seqlens(P.pos, P.tokens, P.flag);
    each_row(P, [&](const NIo &io, int64_t t, int64_t h, int64_t b, int64_t s) {
        Row<DT, HD> v;
        v.load(row_ptr(io.in, s, b, h, io.in_ss, io.in_sb, io.in_sh, DT));
        float p[32];
#pragma unroll
        for (int l = 0; l < 32; l++)
            p[l] = 0.0f;
#pragma unroll
        for (int c0 = 0; c0 < HD; c0 += 32)
#pragma unroll
            for (int l = 0; l < 32; l++) {
                const float e = v.get(c0 + l);
                p[l] = p[l] + e * e;
            }
        const float rstd = fr_norm_rstd(fr_norm_tree32(p), HD, P.eps);
        if (io.rstd != nullptr)
            io.rstd[t * io.heads + h] = rstd;
        int bad = 0;
        const int64_t pos = row_position(P, b, s, &bad);
        const RowAngles a = row_angles<HD>(P, pos, bad);
        /* one unrolled copy of the pairs per rounding mode: a warp runs only
         * its own, so the code it streams through is a third of a loop that
         * switched at each element (bench/RESULTS.md) */
        if (P.rounding == FR_ROUND_LLAMA)
            rotate_row<DT, HD, IL, FR_ROUND_LLAMA>(P, io, a, rstd, v);
        else if (P.rounding == FR_ROUND_GEMMA)
            rotate_row<DT, HD, IL, FR_ROUND_GEMMA>(P, io, a, rstd, v);
        else
            rotate_row<DT, HD, IL, FR_ROUND_ONCE>(P, io, a, rstd, v);
        v.store((void *)row_ptr(io.out, s, b, h, io.out_ss, io.out_sb, io.out_sh, DT));
    });
}

/*
 * The sums of R rows over a warp (R <= 4; the emulated tests run 1, 2 and
 * 3), each in the contract's order (fr_norm_tree32: lane l's partial is
 * p[l], then p[l] += p[l + off] for off 16, 8, 4, 2, 1), for a per-row value
 * (rstd) evaluated once for all of them.  The rows are padded to N, a power
 * of two.  While a lane carries more than one row, a level trades half of
 * them: lanes l and l ^ off each send the rows the other keeps and add what
 * they receive to their own (lane l's p[l] + p[l + off] is lane l + off's
 * p[l + off] + p[l]: the same float), so each level is the tree's level on
 * half the rows; the last levels are the one-row butterfly.  Lane l ends
 * with the sum of row (l >> (5 - log2 N)) & (N - 1), and of_row gives row
 * j's value to every lane from lane j x 32 / N.  At R = 1 this is the plain
 * butterfly; at R = 4 one rstd serves four rows (its registers cost warps
 * an SM: FR_CUDA_NORM_WARP_RPW).
 */
template <int R> struct RowsTree {
    static_assert(R >= 1 && R <= 4, "RowsTree: 1 to 4 rows");
    static constexpr int N = R == 1 ? 1 : R == 2 ? 2 : 4;

    static __device__ __forceinline__ float sum(float (&p)[N], int lane)
    {
        float q[N];
#pragma unroll
        for (int j = 0; j < N; j++)
            q[j] = p[j];
#pragma unroll
        for (int off = 16, n = N; off >= 1; off /= 2) {
            if (n > 1) {
                const bool hi = (lane & off) != 0;
#pragma unroll
                for (int j = 0; j < n / 2; j++) {
                    const float send = hi ? q[j] : q[j + n / 2];
                    const float keep = hi ? q[j + n / 2] : q[j];
                    q[j] = keep + __shfl_xor_sync(0xffffffffu, send, off);
                }
                n /= 2;
            } else {
                q[0] = q[0] + __shfl_xor_sync(0xffffffffu, q[0], off);
            }
        }
        return q[0];
    }

    static __device__ __forceinline__ float of_row(float lane_value, int j)
    {
        return N == 1 ? lane_value : __shfl_sync(0xffffffffu, lane_value, j * (32 / N));
    }
};

/* A row's pairs over a warp, from the lane's channels v, weight factors wf
 * (channel lane + 32 k) and angles: normalised as RND says, rotated, stored
 * at yl, the lane's first channel (lane) of the row. */
template <int DT, int HD, bool IL, int RND>
__device__ __forceinline__ void warp_pairs(float rstd, int lane, const float *v, const float *wf,
                                           const LaneAngles<HD, IL> &an, uint16_t *yl)
{
    constexpr int K = HD / 32;
    if constexpr (IL) {
        static_assert(K % 2 == 0, "warp_pairs: head_dim 64 or 128");
        float vn[K]; /* the lane's channels' values, rounded two at a time */
#pragma unroll
        for (int k = 0; k < K; k += 2)
            norm_value2<DT>(v[k], v[k + 1], rstd, wf[k], wf[k + 1], RND, &vn[k], &vn[k + 1]);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const float mine = vn[k];
            const float other = __shfl_xor_sync(0xffffffffu, mine, 1);
            const bool first = (lane & 1) == 0;
            float ya, yb;
            fr_rotate(first ? mine : other, first ? other : mine, an.c[k], an.sn[k], 1.0f, &ya,
                      &yb);
            yl[32 * k] = (uint16_t)Elem<DT>::from_f(first ? ya : yb);
        }
    } else {
#pragma unroll
        for (int k = 0; k < K / 2; k++) {
            float ya, yb;
            float va, vb;
            norm_value2<DT>(v[k], v[k + K / 2], rstd, wf[k], wf[k + K / 2], RND, &va, &vb);
            fr_rotate(va, vb, an.c[k], an.sn[k], 1.0f, &ya, &yb);
            yl[32 * k] = (uint16_t)Elem<DT>::from_f(ya);
            yl[32 * k + HD / 2] = (uint16_t)Elem<DT>::from_f(yb);
        }
    }
}

/*
 * The forward's rows spread over a warp (calls of at most
 * FR_CUDA_NORM_WARP_ROWS rows: all, by default).  Lane l holds channels l,
 * l + 32, ... of the row, which are the contract's partial sum l, so the
 * lane adds its own in order, and the tree of the 32 partials is a
 * butterfly of shuffles: fr_norm_tree32 adds p[l] + p[l + off] for off 16, 8, 4, 2, 1, and after
 * each xor-shuffle every lane holds one of those sums (a + b and b + a are
 * the same float), so all end with the total.  A NeoX pair (i, i + HD/2)
 * lies in one lane; an interleaved pair (2i, 2i + 1) in lanes l and l ^ 1,
 * which trade their normalised values and each rotate the pair whole (the
 * same operations in both) and keep their own member.  The row's loads are
 * 64 contiguous bytes a warp instruction, its stores too; the operations
 * are rotate_row's.  The shuffles come before any store, so a row in place
 * is read whole first.  kernels/cuda_emu.h runs it as 32 fibers per warp.
 */
/* A warp's item is P.warp_heads rows (heads) of one tensor at one token
 * (the tensor's last item of a token fewer: warp_groups); the items
 * grid-stride.  Per item the token's position, the lane's cos/sin and the
 * rows' first addresses are found once, and the weights when the tensor
 * changes (found per row, they made the warp kernel's rows several hundred
 * instructions each: bench/RESULTS.md); its rows are taken R at a time, all
 * R rows' loads issued before any row's sum, their trees one RowsTree whose
 * rstd is evaluated once for them all, and (FR_CUDA_NORM_WARP_AHEAD) the
 * next R rows' loads issued before these rows' work; the loaded bits are
 * widened only where they are worked, so the loads stay in flight until then
 * (FR_CUDA_NORM_WARP_RPW: what the H100 measured while they did not).  Each
 * row's operations are the same whatever the item and R: no launch shape
 * changes a result.  The rounding mode RND is the kernel's own (a branch at
 * each row took 5 of its 136 instructions: bench/RESULTS.md). */
template <int DT, int HD, bool IL, int R, int RND>
__global__ void FR_NORM_WARP_BOUNDS norm_forward_warp(const __grid_constant__ NParams P)
{
    check_cu_seqlens(P.pos, P.tokens, P.flag);
    constexpr int K = HD / 32;
    const int lane = (int)(threadIdx.x & 31);
    /* the lane's weight factors, of tensor wslot's weights (kept from item
     * to item: they are the same for every row of a tensor) */
    int wslot = -1;
    float wf[K] = {};
    each_warp_item(P, [&](const WarpItem &m) {
        const int64_t t = m.t, h0 = m.h0, b = m.b, s = m.s;
        const int k = m.k, n = m.n;
        const NIo &io = P.io[k];
        int bad = 0;
        LaneAngles<HD, IL> an;
        /* rows j0 .. j0 + R - 1 (those before n): their bits into u, widened
         * only where they are used, so that the loads stay in flight until
         * then (widened here, each row's loads were waited for at once); the
         * lane's first channel of the next row to load at xn, one head
         * stride on from the last (the item's rows are heads h0, h0 + 1, ...
         * of one tensor: a row's address from its head took ~45
         * instructions of its ~185), and of the next row to store at yl (the
         * lane's offset added once an item, not at each row's loads and
         * stores: bench/RESULTS.md) */
        const int64_t in_sh = io.in_sh, out_sh = io.out_sh;
        /* whether row j is past the item's: never at one row at a time (R =
         * 1: each row the loop works or loads ahead is before n), which the
         * compiler cannot see (it tested and branched at each row) */
        auto past = [&](int j) { return R > 1 && j >= n; };
        const uint16_t *xn =
            (const uint16_t *)row_ptr(io.in, s, b, h0, io.in_ss, io.in_sb, in_sh, DT) + lane;
        auto load_rows = [&](int j0, uint16_t (&u)[R][K]) {
#pragma unroll
            for (int j = 0; j < R; j++) {
                if (past(j0 + j))
                    break;
#pragma unroll
                for (int c = 0; c < K; c++)
                    u[j][c] = xn[32 * c];
                xn += in_sh;
            }
        };
        /* rows past the item stay unused */
        uint16_t raw[R][K] = {};
        /* the first rows' loads in flight while the position and angles are
         * found (two dependent round trips), and the angles' and the rows'
         * while the weights are (found at the item's first row, they took a
         * round trip of their own an item) */
        load_rows(0, raw);
        const int64_t pos = row_position(P, b, s, &bad);
        an.load(row_angles<HD>(P, pos, bad), lane);
        if (k != wslot) {
            wslot = k;
            lane_weights<DT>(P, io, lane, wf);
        }
        uint16_t *yl =
            (uint16_t *)row_ptr(io.out, s, b, h0, io.out_ss, io.out_sb, out_sh, DT) + lane;
        float *r = io.rstd != nullptr ? io.rstd + t * io.heads + h0 : nullptr;
        for (int j0 = 0; j0 < n; j0 += R) {
            float v[R][K], p[RowsTree<R>::N] = {}; /* rows past the item (or R) sum to 0 */
#pragma unroll
            for (int j = 0; j < R; j++)
#pragma unroll
                for (int c = 0; c < K; c++)
                    v[j][c] = Elem<DT>::to_f(raw[j][c]);
            /* the next rows' loads in flight during these rows' work, into
             * raw, which v now holds (a second buffer took 8 more registers
             * in the interleaved kernels: bench/RESULTS.md) */
            const bool more = FR_CUDA_NORM_WARP_AHEAD && j0 + R < n;
            if (more)
                load_rows(j0 + R, raw);
#pragma unroll
            for (int j = 0; j < R; j++) {
                if (past(j0 + j))
                    break;
#pragma unroll
                for (int c = 0; c < K; c++)
                    p[j] = p[j] + v[j][c] * v[j][c];
            }
            /* every row's rstd from one evaluation: the lane's row's */
            const float rstd_lane = fr_norm_rstd(RowsTree<R>::sum(p, lane), HD, P.eps);
#pragma unroll
            for (int j = 0; j < R; j++) {
                if (past(j0 + j))
                    break;
                const float rstd = RowsTree<R>::of_row(rstd_lane, j);
                if (lane == 0 && r != nullptr)
                    r[j0 + j] = rstd;
                warp_pairs<DT, HD, IL, RND>(rstd, lane, v[j], wf, an, yl);
                yl += out_sh;
            }
            if (!more && j0 + R < n)
                load_rows(j0 + R, raw);
        }
    });
}

/*
 * The forward's rows over half-warps (FR_CUDA_NORM_WARP_HALF): lanes
 * 16 r .. 16 r + 15 hold row r of a pair of rows, lane h of a half the
 * 32-bit words h + 16 w (w < HD / 32) of its row, channels 2h + 32w and
 * 2h + 32w + 1: the contract's partial sums 2h and 2h + 1, which the lane
 * adds in order, and half_tree sums them.  A NeoX pair
 * (i, i + HD/2) is words w and w + HD/64 of one lane; an interleaved pair
 * is one word.  So a warp instruction loads, converts and stores two rows'
 * words where norm_forward_warp's loaded one row's 16-bit elements, and
 * the tree is 5 shuffles for two rows: fewer instructions a row in a
 * kernel ncu found bound by issue (bench/RESULTS.md).  An item's rows go
 * PAIRS pairs at a time (FR_CUDA_NORM_WARP_HALF 1 or 2): rows j0 + 2q +
 * half, q < PAIRS.  At one pair a row past the item (its last odd row's
 * pair) is the pair's first row again, loaded and worked but not stored.
 * At two pairs one tree (half_tree2) and one rstd evaluation serve the
 * four rows (they took a quarter of the instructions a pair:
 * bench/RESULTS.md), for 8 words more a lane in flight, and the launcher
 * gives this kernel only items of a multiple of four rows (full_steps):
 * no row past the item, no test of one.  A warp keeps the next step's
 * loads in flight while it works one (the next two lost 3 to 5 points on
 * the H200: bench/RESULTS.md, 2026-11-30).  The operations of a row are
 * norm_forward_warp's.
 */
template <int DT, int HD, bool IL, int RND, int PAIRS>
__global__ void FR_NORM_WARP_BOUNDS norm_forward_half(const __grid_constant__ NParams P)
{
    static_assert(PAIRS == 1 || PAIRS == 2, "norm_forward_half: one or two pairs of rows a step");
    check_cu_seqlens(P.pos, P.tokens, P.flag);
    constexpr int W = HD / 32; /* a lane's words of its row */
    const int lane = (int)(threadIdx.x & 31), half = lane >> 4, h = lane & 15;
    /* the lane's weight factors (channels 2h + 32w, 2h + 32w + 1), of
     * tensor wslot's weights */
    int wslot = -1;
    float wf[2 * W] = {};
    each_warp_item(P, [&](const WarpItem &m) {
        const int64_t t = m.t, h0 = m.h0, b = m.b, s = m.s;
        const int k = m.k, n = m.n;
        const NIo &io = P.io[k];
        const int64_t in_sh = io.in_sh, out_sh = io.out_sh;
        int bad = 0;
        /* xn: the lane's first word of the next step's row j0 + half, which
         * steps 2 PAIRS heads (strides in words: even element counts,
         * rows_on_16); one pair a step, a row past the item loads row j0
         * (xn - in_w) instead */
        const int64_t in_w = in_sh / 2, out_w = out_sh / 2;
        const uint32_t *xn =
            (const uint32_t *)row_ptr(io.in, s, b, h0, io.in_ss, io.in_sb, in_sh, DT) + h + half * in_w;
        uint32_t *yl =
            (uint32_t *)row_ptr(io.out, s, b, h0, io.out_ss, io.out_sb, out_sh, DT) + h + half * out_w;
        auto load_step = [&](int j0, uint32_t (&u)[PAIRS][W]) {
#pragma unroll
            for (int q = 0; q < PAIRS; q++) {
                const uint32_t *x = PAIRS == 2 ? xn + 2 * q * in_w : j0 + half < n ? xn : xn - in_w;
#pragma unroll
                for (int w = 0; w < W; w++)
                    u[q][w] = x[16 * w];
            }
            xn += 2 * PAIRS * in_w;
        };
        /* the item's rows after its first step's on their way to L2
         * (rows_hd: each row 16-byte aligned, 128 or 256 bytes) */
        if (FR_WARP_PREFETCH_BUILT && P.prefetch && lane >= 2 * PAIRS && lane < n)
            fr_prefetch_l2((const char *)row_ptr(io.in, s, b, h0 + lane, io.in_ss, io.in_sb, in_sh,
                                                 DT),
                           HD * 2);
        uint32_t raw[PAIRS][W];
        /* the first step's loads in flight while the angles and weights are
         * found */
        load_step(0, raw);
        const int64_t pos = row_position(P, b, s, &bad);
        LaneAngles<HD, IL, true> an;
        an.load(row_angles<HD>(P, pos, bad), h);
        if (k != wslot) {
            wslot = k;
            lane_weights<DT, true>(P, io, h, wf);
        }
        /* the half's rstd of the pair at j0 at r[j0], stored by its lane 0 */
        float *r = io.rstd != nullptr && h == 0 ? io.rstd + t * io.heads + h0 + half : nullptr;
        for (int j0 = 0; j0 < n; j0 += 2 * PAIRS) {
            float v[PAIRS][2 * W];
#pragma unroll
            for (int q = 0; q < PAIRS; q++)
#pragma unroll
                for (int w = 0; w < W; w++) {
                    v[q][2 * w] = Elem<DT>::to_f((uint16_t)raw[q][w]);
                    v[q][2 * w + 1] = Elem<DT>::to_f((uint16_t)(raw[q][w] >> 16));
                }
            if (j0 + 2 * PAIRS < n)
                load_step(j0 + 2 * PAIRS, raw);
            /* partial sums 2h (even channels) and 2h + 1 of each row, words
             * in order (from the first square: 0.0f + x * x is x * x, which
             * is never -0.0f) */
            float p[PAIRS][2];
#pragma unroll
            for (int q = 0; q < PAIRS; q++) {
                p[q][0] = v[q][0] * v[q][0];
                p[q][1] = v[q][1] * v[q][1];
#pragma unroll
                for (int w = 1; w < W; w++) {
                    p[q][0] = p[q][0] + v[q][2 * w] * v[q][2 * w];
                    p[q][1] = p[q][1] + v[q][2 * w + 1] * v[q][2 * w + 1];
                }
            }
            float rstd[PAIRS];
            if constexpr (PAIRS == 1) {
                rstd[0] = fr_norm_rstd(half_tree(p[0][0], p[0][1], h), HD, P.eps);
            } else {
                /* the lane's row's rstd (pair 0's where h & 4 is clear),
                 * then each pair's from a lane that has it */
                const float own = fr_norm_rstd(half_tree2(p[0][0], p[0][1], p[1][0], p[1][1], h),
                                               HD, P.eps);
                rstd[0] = __shfl_sync(0xffffffffu, own, lane & ~4);
                rstd[1] = __shfl_sync(0xffffffffu, own, lane | 4);
            }
#pragma unroll
            for (int q = 0; q < PAIRS; q++) {
                const bool mine = PAIRS == 2 || j0 + half < n;
                if (mine && r != nullptr)
                    r[j0 + 2 * q] = rstd[q];
                float y[2 * W];
                if constexpr (IL) {
#pragma unroll
                    for (int w = 0; w < W; w++) {
                        float va, vb;
                        norm_value2<DT>(v[q][2 * w], v[q][2 * w + 1], rstd[q], wf[2 * w],
                                        wf[2 * w + 1], RND, &va, &vb);
                        fr_rotate(va, vb, an.c[w], an.sn[w], 1.0f, &y[2 * w], &y[2 * w + 1]);
                    }
                } else {
#pragma unroll
                    for (int c = 0; c < W; c++) {
                        /* pair 2h + 32 (c / 2) + (c & 1): v[c] (word c / 2)
                         * and its partner v[c + W] (word c / 2 + W / 2) */
                        float va, vb;
                        norm_value2<DT>(v[q][c], v[q][c + W], rstd[q], wf[c], wf[c + W], RND,
                                        &va, &vb);
                        fr_rotate(va, vb, an.c[c], an.sn[c], 1.0f, &y[c], &y[c + W]);
                    }
                }
                if (mine) {
#pragma unroll
                    for (int w = 0; w < W; w++)
                        yl[2 * q * out_w + 16 * w] = Elem<DT>::from_f2(y[2 * w], y[2 * w + 1]);
                }
            }
            yl += 2 * PAIRS * out_w;
        }
    });
}

/* ---------------------------------------------------------------- host side */

/* The warps an SM holds at most (2048 threads), for warp_heads' items. */
enum { WARPS_PER_SM = 2048 / 32 };

/* A grid-stride launch of a warp for each item (P.warp_heads' groups of
 * each token's heads), at most FR_CUDA_NORM_WARP_GRID blocks of 128
 * threads an SM (0: a block for each 4 warps, at most 2^20 an SM);
 * emulated, each warp's lanes run in lockstep. */
template <typename K> cudaError_t launch_warps(K kernel, const NParams &P, cudaStream_t stream)
{
    NParams Q = P;
    Q.groups = warp_groups(P);
    Q.groups_q = warp_groups0(P);
    const int64_t warps = (P.t1 - P.t0) * Q.groups;
    if (warps <= 0)
        return cudaSuccess;
    const int per_sm = FR_CUDA_NORM_WARP_GRID > 0 ? FR_CUDA_NORM_WARP_GRID : 1 << 20;
    cudaLaunchConfig_t cfg = grid_of(32 * warps, per_sm, P.sms, stream);
#ifdef FR_CUDA_EMULATE
    if (fr_emu_norm_warp_blocks > 0 && cfg.gridDim.x > (unsigned)fr_emu_norm_warp_blocks)
        cfg.gridDim.x = (unsigned)fr_emu_norm_warp_blocks;
#endif
    /* each_warp_item's step: the grid's warps in tokens and groups, the
     * tokens in sequences and positions */
    const int64_t step = (int64_t)cfg.gridDim.x * cfg.blockDim.x / 32;
    Q.step_t = step / Q.groups;
    Q.step_g = step % Q.groups;
    Q.step_b = Q.step_t / P.seq_len;
    Q.step_s = Q.step_t % P.seq_len;
#ifdef FR_CUDA_EMULATE
    return fr_emu_launch_lockstep(&cfg, kernel, Q);
#else
    return cudaLaunchKernelEx(&cfg, kernel, Q);
#endif
}

/* The rows of norm_forward_warp's items: FR_CUDA_NORM_WARP_HEADS, fewer
 * where the call has less than that many rows for each warp of one wave
 * (WARPS_PER_SM an SM), at most a token's heads (the decode step's 2560
 * rows: one row an item on a Hopper). */
int64_t warp_heads(const NParams &P, int64_t rows)
{
    int64_t g = rows / (WARPS_PER_SM * (int64_t)P.sms);
    g = g < FR_CUDA_NORM_WARP_HEADS ? g : FR_CUDA_NORM_WARP_HEADS;
#ifdef FR_CUDA_EMULATE
    if (fr_emu_norm_warp_heads > 0)
        g = fr_emu_norm_warp_heads;
#endif
    g = g < P.heads ? g : P.heads;
    return g > 1 ? g : 1;
}

#if defined FR_CUDA_EMULATE || FR_CUDA_NORM_WARP_HALF == 2
/* Whether every item of norm_forward_half's is a multiple of four rows
 * (each tensor's heads and the items' heads P.warp_heads), as its two
 * pairs a step ask (built where they are). */
bool full_steps(const NParams &P)
{
    return P.warp_heads % 4 == 0 && P.heads0 % 4 == 0 && (P.heads - P.heads0) % 4 == 0;
}
#endif

/* f(rnd) with the call's rounding mode as rnd's type's value, a constant
 * (the kernels' template parameter RND) */
template <typename F> cudaError_t with_rounding(int rounding, F f)
{
    if (rounding == FR_ROUND_LLAMA)
        return f(std::integral_constant<int, FR_ROUND_LLAMA>());
    if (rounding == FR_ROUND_GEMMA)
        return f(std::integral_constant<int, FR_ROUND_GEMMA>());
    return f(std::integral_constant<int, FR_ROUND_ONCE>());
}

template <int DT, int HD> cudaError_t launch_rows(const NParams &P0, cudaStream_t stream)
{
    const int64_t n = (P0.t1 - P0.t0) * P0.heads;
    if (warp_rows(n)) {
        NParams P = P0;
        P.warp_heads = warp_heads(P, n);
        const int half = warp_half();
        if (half) {
            /* items of two rows at least, one a half; at two pairs a step,
             * a multiple of four (full_steps) */
            if (P.warp_heads < 2 && P.heads >= 2)
                P.warp_heads = 2;
            if (half == 2 && P.warp_heads >= 4)
                P.warp_heads -= P.warp_heads % 4;
        }
        /* the launch of kernel_of(rnd, il): the kernel of the call's
         * rounding mode and style (as types' values, constants) */
        auto go = [&](auto kernel_of) {
            return with_rounding(P.rounding, [&](auto rnd) {
                return P.interleaved ? launch_warps(kernel_of(rnd, std::true_type()), P, stream)
                                     : launch_warps(kernel_of(rnd, std::false_type()), P, stream);
            });
        };
        if (half) {
            auto halves = [&](auto pairs) {
                return go([](auto rnd, auto il) {
                    return norm_forward_half<DT, HD, decltype(il)::value, decltype(rnd)::value,
                                             decltype(pairs)::value>;
                });
            };
#if defined FR_CUDA_EMULATE || FR_CUDA_NORM_WARP_HALF == 2
            if (half == 2 && full_steps(P))
                return halves(std::integral_constant<int, 2>());
#endif
            return halves(std::integral_constant<int, 1>());
        }
        /* items of fewer rows than R at a time (the decode step's one row)
         * take one row at a time: no padded rows' work */
        const int r = P.warp_heads < warp_rpw() ? 1 : warp_rpw();
        auto rows = [&](auto rpw) {
            return go([](auto rnd, auto il) {
                return norm_forward_warp<DT, HD, decltype(il)::value, decltype(rpw)::value,
                                         decltype(rnd)::value>;
            });
        };
#ifdef FR_CUDA_EMULATE
        /* every count a test may choose, the default among them */
        switch (r) {
        case 4:
            return rows(std::integral_constant<int, 4>());
        case 3:
            return rows(std::integral_constant<int, 3>());
        case 2:
            return rows(std::integral_constant<int, 2>());
        default:
            return rows(std::integral_constant<int, 1>());
        }
#else
        return r == 1 ? rows(std::integral_constant<int, 1>())
                      : rows(std::integral_constant<int, FR_CUDA_NORM_WARP_RPW>());
#endif
    }
    return P0.interleaved ? launch(norm_forward_rows<DT, HD, true>, n, P0, stream)
                          : launch(norm_forward_rows<DT, HD, false>, n, P0, stream);
}

/* The forward's row kernel: a register-row kernel where one takes the call,
 * else the generic walk. */
cudaError_t launch_forward(const NParams &P, int count, cudaStream_t stream)
{
    const int64_t hd = rows_hd(P, count, false);
    if (hd == 0)
        return launch(norm_forward, (P.t1 - P.t0) * P.heads, P, stream);
    if (P.dt == DT_F16)
        return hd == 64 ? launch_rows<DT_F16, 64>(P, stream) : launch_rows<DT_F16, 128>(P, stream);
    return hd == 64 ? launch_rows<DT_BF16, 64>(P, stream) : launch_rows<DT_BF16, 128>(P, stream);
}

} /* namespace */

extern "C" fusedrope_status fr_cuda_norm_forward(const fr_norm_args *na)
{
    NParams P;
    cudaError_t err;
    int dev;
    TRY(fr_cuda_check_device(na->a.cache, &dev));
    params(na, &P);
    P.sms = fr_cuda_sm_count(dev);
    P.prefetch = FR_CHOICE(fr_emu_norm_warp_prefetch, FR_CUDA_NORM_WARP_PREFETCH) != 0 &&
                 fr_cuda_cc_major(dev) >= 9;
    if (P.cos == nullptr && P.inv_freq == nullptr)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "fr_cuda_norm_forward: the cache has neither a device table nor frequencies");
    err = launch_forward(P, na->a.count, (cudaStream_t)na->a.stream);
    if (err != cudaSuccess)
        return fr_cuda_fail(err, "the norm forward kernel launch");
    return FUSEDROPE_OK;
}

