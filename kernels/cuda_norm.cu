/*
 * cuda_norm.cu - the CUDA backend of the fused per-head RMSNorm + RoPE
 * (fusedrope_norm_forward_qk(3)): fr_cuda_norm_forward and
 * fr_cuda_norm_backward.
 *
 * One thread per (token, head) row, grid-stride, so the launch shape never
 * changes a result.  A thread follows lib/cpu_norm.c's arithmetic operation
 * for operation (lib/norm_math.h, rope_math.h's fr_rotate; -fmad=false as
 * for the plain kernels), so the two backends agree to the bit:
 *   forward   the row's sum of squares in the contract's order (32 partial
 *             sums, channel c into sum c % 32, then the tree), rstd, then
 *             pair by pair: both channels read, scaled as the rounding mode
 *             says, rotated, written (in place safe: a pair is read before it
 *             is written); channels past rot_dim scaled and written.
 *   backward  per row: sum of dn * n in the contract's order, then dx pair
 *             by pair; dw sums each head's terms g * n per chunk of
 *             FUSEDROPE_NORM_DW_CHUNK tokens (the chunk's tokens in order)
 *             into a (chunk, head) partial, a chunk's heads' partials in
 *             head order (norm_dw_heads), then the chunks in order
 *             (norm_dw_sum).  The generic kernel (norm_dx, a thread per row)
 *             writes the terms to a stream-ordered scratch array, which one
 *             thread per (chunk, head, channel) sums (norm_dw_chunks); the
 *             common shapes take norm_backward_heads, a warp per chunk of
 *             two heads (over its halves) or of one head (or a few) adding
 *             the terms in registers as it goes.  A long call
 *             runs in segments of whole chunks (the scratch of a segment at
 *             most TERMS_BYTES).  An earlier dw pass that read dy and the
 *             saved tensor again, one thread per (chunk, channel), took
 *             about 1 ms whatever the call's size (bench/RESULTS.md).
 * The generic kernels (any shape) read a row again in each pass (L1/L2)
 * with scalar loads; the common shapes (16-bit, head_dim 64 or 128, full
 * rotary, a table cache, 1D positions, rows on 16 bytes: rows_hd) take
 * kernels that hold a row in registers: the forward's norm_forward_half (a
 * pair of rows over a warp's halves, a warp taking up to
 * FR_CUDA_NORM_WARP_HEADS rows of a token) or norm_forward_warp (a row over
 * a warp's lanes; FR_CUDA_NORM_WARP_HALF chooses) or, where
 * FR_CUDA_NORM_WARP_ROWS is set to say so, norm_forward_rows (a thread per
 * row, 16-byte loads; the same bytes), and the backward's
 * norm_backward_heads (a row over a half-warp's lanes, or over a warp's:
 * FR_CUDA_NORM_BWD_HALF chooses).
 *
 * With FR_CUDA_EMULATE (kernels/cuda_norm_emu.cc) the host C++ compiler
 * builds it and kernels/cuda_emu.h runs the kernels on the CPU: threads
 * share nothing but the warp kernels' shuffles (no shared memory, no
 * atomics), so running them one after another, a warp's lanes in lockstep
 * for those kernels, gives what the device gives.
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

/* Out of line (not a macro named __noinline__ in the emulation: glibc's
 * headers spell that attribute's name). */
#ifdef FR_CUDA_EMULATE
#define FR_NOINLINE __attribute__((noinline))
#else
#define FR_NOINLINE __noinline__
#endif

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
 * over its halves in 32-bit words (1), or norm_forward_warp, a row over
 * the warp in 16-bit elements (0).  Not yet measured. */
#ifndef FR_CUDA_NORM_WARP_HALF
#define FR_CUDA_NORM_WARP_HALF 1
#endif
static_assert(FR_CUDA_NORM_WARP_RPW >= 1 && FR_CUDA_NORM_WARP_RPW <= 4,
              "FR_CUDA_NORM_WARP_RPW: 1 to 4 rows a warp");

/* The most rows (heads of one token) a warp of norm_forward_warp takes as
 * one item: the token's position, cos/sin and the weights are found once an
 * item, so the rows after the first cost only their own loads, sums and
 * rotations.  A call of few rows takes fewer a warp (warp_heads), so that
 * its warps still fill the device. */
#ifndef FR_CUDA_NORM_WARP_HEADS
#define FR_CUDA_NORM_WARP_HEADS 8
#endif
static_assert(FR_CUDA_NORM_WARP_HEADS >= 1, "FR_CUDA_NORM_WARP_HEADS: at least 1 row an item");

/* The blocks of 128 threads norm_forward_warp asks ptxas to fit an SM (0:
 * none asked): what the H100 measured followed the warps an SM holds, which
 * the registers set (FR_CUDA_NORM_WARP_RPW's numbers), so fewer registers
 * may pay even for a few spilled to L1; 10 blocks allow 48 registers, 12
 * allow 40 (ptxas's counts: bench/RESULTS.md).  Not yet measured. */
#ifndef FR_CUDA_NORM_WARP_MINB
#define FR_CUDA_NORM_WARP_MINB 0
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

#ifdef FR_CUDA_EMULATE
/* Emulated, a test chooses: the forward's row kernel (1: the warp's, 0: the
 * thread's, -1: FR_CUDA_NORM_WARP_ROWS decides) and the warp's rows at a time
 * (0: FR_CUDA_NORM_WARP_RPW) and its items' rows (0: warp_heads decides),
 * the backward's segment (chunks of tokens;
 * 0: TERMS_BYTES decides), so that the small calls of the tests run in
 * several segments too, and norm_backward_heads' heads a warp at a token
 * (0: bwd_heads decides; 1 to 4 are built) and layout (1: half-warps, 0:
 * warps, -1: FR_CUDA_NORM_BWD_HALF decides) and, over half-warps, its
 * tokens in flight through shared memory (0, 1; -1: FR_CUDA_NORM_BWD_PIPE). */
extern "C" {
int fr_emu_norm_warp = -1;
int fr_emu_norm_warp_rpw = 0;
int fr_emu_norm_warp_heads = 0;
int fr_emu_norm_warp_half = -1;
int fr_emu_norm_seg_chunks = 0;
int fr_emu_norm_bwd_heads = 0;
int fr_emu_norm_bwd_half = -1;
int fr_emu_norm_bwd_pipe = -1;
}
#endif

/* The build's choice `build`, or where emulated a test's `emu` (-1: the
 * build's). */
#ifdef FR_CUDA_EMULATE
#define FR_CHOICE(emu, build) ((emu) >= 0 ? (emu) : (build))
#else
#define FR_CHOICE(emu, build) (build)
#endif

namespace {

#include "cuda_elem.cuh"
#include "cuda_index.cuh"

/* Whether a forward of `rows` common rows takes the warp kernel. */
bool warp_rows(int64_t rows)
{
    return FR_CHOICE(fr_emu_norm_warp, rows <= FR_CUDA_NORM_WARP_ROWS) != 0;
}

/* Whether the warp kernel's calls take norm_forward_half. */
bool warp_half()
{
    return FR_CHOICE(fr_emu_norm_warp_half, FR_CUDA_NORM_WARP_HALF) != 0;
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

struct NIo {
    const void *in;   /* forward: x; backward: dy */
    void *out;        /* forward: y; backward: dx */
    const void *x;    /* backward: the saved tensor */
    const void *w;    /* [head_dim] weight, or NULL */
    float *rstd;      /* [tokens][heads] */
    float *dw;        /* backward: [head_dim], or NULL */
    float *part;      /* backward: [chunks][head_dim] scratch, or NULL */
    float *hp;        /* backward with dw: [chunks of t0..t1][heads][head_dim] scratch, each
                         (chunk, head)'s partial; NULL: none */
    float *terms;     /* backward with dw: [t1 - t0][heads][head_dim] scratch, g * n of the
                         rows of tokens t0..t1 as the row kernel found them; NULL: none */
    int64_t heads, hd;
    int64_t in_ss, in_sb, in_sh, out_ss, out_sb, out_sh, x_ss, x_sb, x_sh;
};

struct NParams {
    NIo io[2];
    fr_pos_args pos;
    const float *cos, *sin;
    const double *inv_freq;
    const int32_t *pair_map; /* position axes: each pair's (col << 2) | axis; NULL: 1D */
    double attn;
    int *flag;
    int64_t tokens, seq_len, max_positions, half, rot_dim, heads0, heads, chunks;
    int64_t t0, t1; /* the row kernels' tokens: t0 <= t < t1 */
    int64_t warp_heads; /* norm_forward_warp: the rows (heads of a token) of a warp's item */
    int64_t unit_tokens; /* norm_backward_heads: the tokens of a warp's unit */
    int interleaved, dt, wdt, weight, rounding, saved_y;
    float eps;
    int sms; /* host side: the device's SM count, for the launch shapes */
};

__device__ __forceinline__ float load_f(const void *p, int dt, int64_t i)
{
    if (dt == 0)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == 1 ? fr_half_to_float(h) : fr_bf16_to_float(h);
}

__device__ __forceinline__ void store_f(void *p, int dt, int64_t i, float v)
{
    if (dt == 0)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = dt == 1 ? fr_float_to_half(v) : fr_float_to_bf16(v);
}

__device__ __forceinline__ float weight_factor(const NParams &P, const NIo &io, int64_t c)
{
    return fr_norm_wf(P.weight, P.weight ? load_f(io.w, P.wdt, c) : 1.0f);
}

/* A table-less cache's cos/sin, out of line: the double-precision sine and
 * cosine inlined at every pair of an unrolled row made the kernels' code
 * 0.4-1 MB each, far past the instruction caches (bench/RESULTS.md). */
__device__ FR_NOINLINE void angle_from_freq(const NParams &P, int64_t p, int64_t col, float *c,
                                             float *sn)
{
    fr_pair_cos_sin(nullptr, nullptr, P.inv_freq, P.attn, P.half, p, col, c, sn);
}

/* cos/sin of pair i at token (b, s): with position axes, the position on
 * the pair's axis and its frequency column (the map entry).  NaN (and the
 * range flag) for a token without a position in the table on some axis, as
 * the plain kernels: all its rotated channels become NaN. */
__device__ __forceinline__ void angle(const NParams &P, int64_t b, int64_t s, int64_t i, float *c,
                                      float *sn)
{
    int bad = 0;
    const int64_t p0 = fr_token_position(&P.pos, b, s, &bad);
    const int32_t e = P.pair_map != nullptr ? P.pair_map[i] : (int32_t)(i << 2);
    int64_t p = p0;
    bad |= P.max_positions > 0 && p0 >= P.max_positions;
    for (int a = 1; P.pair_map != nullptr && a < P.pos.num_axes; a++) {
        const int64_t pa = fr_token_axis_position(&P.pos, b, s, a, p0, &bad);
        bad |= P.max_positions > 0 && pa >= P.max_positions;
        if (a == fr_map_axis(e))
            p = pa;
    }
    if (bad) {
        if (P.flag != nullptr)
            *P.flag = 1;
        *c = *sn = fr_u2f(0x7fc00000u);
        return;
    }
    if (P.cos != nullptr)
        fr_pair_cos_sin(P.cos, P.sin, nullptr, P.attn, P.half, p, fr_map_col(e), c, sn);
    else
        angle_from_freq(P, p, fr_map_col(e), c, sn);
}

/* Head hh of q's then k's heads: its tensor (0 q, 1 k) and its head h there. */
__device__ __forceinline__ int head_of(const NParams &P, int64_t hh, int64_t *h)
{
    const int k = hh >= P.heads0;
    *h = hh - (k ? P.heads0 : 0);
    return k;
}

/* norm_forward_warp's items a token: each tensor's heads in groups of
 * P.warp_heads (its last fewer), q's groups then k's, so that an item's
 * rows are of one tensor (the launcher sizes its grid by them, the kernel
 * walks them); warp_groups0: q's. */
FR_HD int64_t warp_groups0(const NParams &P)
{
    return (P.heads0 + P.warp_heads - 1) / P.warp_heads;
}

FR_HD int64_t warp_groups(const NParams &P)
{
    return warp_groups0(P) + (P.heads - P.heads0 + P.warp_heads - 1) / P.warp_heads;
}

/* Item it of the forward's warp kernels (warp_groups' groups a token, g0
 * of them q's): its token t = (b, s), tensor k, first head h0 and rows n
 * (P.warp_heads, the tensor's last group fewer). */
struct WarpItem {
    int64_t t, h0, b, s;
    int k, n;
};

__device__ __forceinline__ WarpItem warp_item(const NParams &P, int64_t it, int64_t groups,
                                              int64_t g0)
{
    WarpItem m;
    const int64_t g = it % groups, G = P.warp_heads;
    m.t = P.t0 + it / groups;
    m.k = g >= g0;
    m.h0 = (m.k ? g - g0 : g) * G;
    m.n = (int)(m.h0 + G < P.io[m.k].heads ? G : P.io[m.k].heads - m.h0);
    m.b = m.t / P.seq_len;
    m.s = m.t % P.seq_len;
    return m;
}

/* f(m) for each item m (warp_item) of the forward's warp kernels, a warp an
 * item, grid-stride. */
template <typename F> __device__ __forceinline__ void each_warp_item(const NParams &P, F f)
{
    const int64_t g0 = warp_groups0(P), groups = warp_groups(P);
    const int64_t items = (P.t1 - P.t0) * groups, warps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t it = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; it < items;
         it += warps)
        f(warp_item(P, it, groups, g0));
}

/* Row r = (token t, head hh of q's then k's heads). */
__device__ __forceinline__ const NIo &row_io(const NParams &P, int64_t r, int64_t *t, int64_t *h,
                                             int64_t *b, int64_t *s)
{
    *t = r / P.heads;
    *b = *t / P.seq_len;
    *s = *t % P.seq_len;
    return P.io[head_of(P, r % P.heads, h)];
}

/* Row (s, b, h) of a tensor at base with element strides ss, sb, sh. */
__device__ __forceinline__ const void *row_ptr(const void *base, int64_t s, int64_t b, int64_t h,
                                               int64_t ss, int64_t sb, int64_t sh, int dt)
{
    return (const char *)base + (size_t)(s * ss + b * sb + h * sh) * (dt ? 2 : 4);
}

/* Each row of tokens t0..t1, grid-stride, a thread per row, so no launch
 * shape changes a result: f(io, t, h, b, s), head h of io at token t = (b, s).
 * (norm_forward_warp walks its own way: R rows a warp.) */
template <typename F> __device__ __forceinline__ void each_row(const NParams &P, F f)
{
    const int64_t rows = P.t1 * P.heads;
    for (int64_t r = P.t0 * P.heads + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
         r += (int64_t)gridDim.x * blockDim.x) {
        int64_t t, h, b, s;
        const NIo &io = row_io(P, r, &t, &h, &b, &s);
        f(io, t, h, b, s);
    }
}

/* -------------------------------------------------------------- the row walk */

/*
 * The walk of both row kernels (the forward, the backward's dx): one thread
 * per row, grid-stride; per row, a sum over its channels in the contract's
 * order (32 partial sums, channel c into sum c % 32, then the tree), then
 * its pairs in order, each read whole before either member is written (in
 * place safe), then the channels past rot_dim.  What the kernels differ in
 * comes as functions of the kernel's own:
 *   start(io, t, h, b, s)   the row (head h of io at token t = (b, s))
 *   term(c)                 channel c's term of the sum
 *   after(sum)              what the sum gives (rstd, or the backward's mean)
 *   pair(i, ca, cb)         pair i at channels ca and cb
 *   rest(ch)                channel ch >= rot_dim
 */
template <typename Start, typename Term, typename After, typename Pair, typename Rest>
__device__ __forceinline__ void walk_rows(const NParams &P, Start start, Term term, After after,
                                          Pair pair, Rest rest)
{
    each_row(P, [&](const NIo &io, int64_t t, int64_t h, int64_t b, int64_t s) {
        start(io, t, h, b, s);
        float p[32];
#pragma unroll
        for (int l = 0; l < 32; l++)
            p[l] = 0.0f;
        for (int64_t c0 = 0; c0 < io.hd; c0 += 32) {
#pragma unroll
            for (int l = 0; l < 32; l++)
                if (c0 + l < io.hd)
                    p[l] = p[l] + term(c0 + l);
        }
        after(fr_norm_tree32(p));
        for (int64_t i = 0; i < P.half; i++) {
            int64_t ca, cb;
            fr_pair_channels(P.interleaved, i, P.half, &ca, &cb);
            pair(i, ca, cb);
        }
        for (int64_t ch = P.rot_dim; ch < io.hd; ch++)
            rest(ch);
    });
}

/* ------------------------------------------------------------------ forward */

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

/* The row's position, once: NaN angles (and the range flag) for a token
 * without one in the table, as angle() gives each pair. */
__device__ __forceinline__ int64_t row_position(const NParams &P, int64_t b, int64_t s, int *bad)
{
    const int64_t p = fr_token_position(&P.pos, b, s, bad);
    *bad |= P.max_positions > 0 && p >= P.max_positions;
    if (*bad && P.flag != nullptr)
        *P.flag = 1;
    return p;
}

/* The row's cos/sin table rows (the register-row kernels take table caches
 * only: a table-less pair's double-precision angle, even out of line, cost
 * each unrolled pair a call through local memory), or NULL for a token
 * without a position in the table: its pairs' angles are NaN, as angle()
 * gives them. */
struct RowAngles {
    const float *cos, *sin;
};

template <int HD>
__device__ __forceinline__ RowAngles row_angles(const NParams &P, int64_t pos, int bad)
{
    RowAngles a;
    a.cos = bad ? nullptr : P.cos + pos * (HD / 2);
    a.sin = bad ? nullptr : P.sin + pos * (HD / 2);
    return a;
}

/* fr_pair_cos_sin's table entry, column i of the row. */
__device__ __forceinline__ void pair_angle(const RowAngles &a, int i, float *c, float *sn)
{
    if (a.cos == nullptr) {
        *c = *sn = fr_u2f(0x7fc00000u);
        return;
    }
    fr_pair_cos_sin(a.cos, a.sin, nullptr, 1.0, 0, 0, i, c, sn);
}

/* The channel of a row a lane holds as its e-th: over a warp (HALF false)
 * lane + 32 e, over a half-warp (HALF true; lane is the lane in its half,
 * which holds the 32-bit words lane + 16 w) 2 lane + 32 (e / 2) + (e & 1). */
template <bool HALF> __device__ __forceinline__ int lane_channel(int lane, int e)
{
    return HALF ? 2 * lane + 32 * (e / 2) + (e & 1) : lane + 32 * e;
}

/* weight_factor's value for the register-row kernels, the lane's channels
 * (lane_channel<HALF>(lane, k), k < K) of a warp row kernel into wf (a
 * weight may start on any element: loaded element by element, once a
 * tensor): a 16-bit weight is in the tensors'
 * dtype, so the one conversion of cuda_elem.cuh replaces load_f's three (the
 * same value: widening is exact).  The K loads are issued before any is
 * widened, so they make one round trip (a load and its widening per channel
 * made K: the widening came right after its load, in the same basic block,
 * and waited for it).  The float and 16-bit loads stay apart: through one
 * 32-bit word the kernels took 2-7 more registers. */
template <int DT, bool HALF = false, int K>
__device__ __forceinline__ void lane_weights(const NParams &P, const NIo &io, int lane,
                                             float (&wf)[K])
{
    if (P.weight == 0) {
#pragma unroll
        for (int k = 0; k < K; k++)
            wf[k] = 1.0f;
    } else if (P.wdt == 0) {
        float w[K];
#pragma unroll
        for (int k = 0; k < K; k++)
            w[k] = ((const float *)io.w)[lane_channel<HALF>(lane, k)];
#pragma unroll
        for (int k = 0; k < K; k++)
            wf[k] = fr_norm_wf(P.weight, w[k]);
    } else {
        uint16_t w[K];
#pragma unroll
        for (int k = 0; k < K; k++)
            w[k] = ((const uint16_t *)io.w)[lane_channel<HALF>(lane, k)];
#pragma unroll
        for (int k = 0; k < K; k++)
            wf[k] = fr_norm_wf(P.weight, Elem<DT>::to_f(w[k]));
    }
}

/* The weight factor of channel c alone (norm_forward_rows). */
template <int DT>
__device__ __forceinline__ float row_weight(const NParams &P, const NIo &io, int c)
{
    float wf[1];
    lane_weights<DT>(P, io, c, wf);
    return wf[0];
}

/* fr_norm_value for the register-row kernels: the rounding to the dtype DT
 * by cuda_elem.cuh's conversions there and back (the hardware's on a GPU,
 * one instruction each way instead of fr_norm_round's integer steps; the
 * same bits for every non-NaN value, and NaN for NaN). */
template <int DT> __device__ __forceinline__ float elem_round(float v, int)
{
    return Elem<DT>::to_f(Elem<DT>::from_f(v));
}

template <int DT>
__device__ __forceinline__ float norm_value(float x, float rstd, float wf, int rounding)
{
    float y;
    FR_NORM_VALUE(y, x, rstd, wf, rounding, DT, elem_round<DT>);
    return y;
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
        const float va = norm_value<DT>(v.get(ca), rstd, row_weight<DT>(P, io, ca), RND);
        const float vb = norm_value<DT>(v.get(cb), rstd, row_weight<DT>(P, io, cb), RND);
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

/* The lane's cos/sin of a warp row kernel's pairs.  A row over a warp
 * (HALF false): NeoX pair lane + 32 k (k < HD / 64: the lane's channels
 * lane + 32 k and HD / 2 + lane + 32 k), interleaved pair (lane + 32 k) / 2
 * (k < HD / 32: the lane's channel lane + 32 k, whose partner is in lane ^
 * 1).  A row over a half-warp (HALF true; lane is h, the lane in its half,
 * which holds the 32-bit words h + 16 w, channels 2h + 32w and 2h + 32w + 1):
 * NeoX pair 2h + 32 (k / 2) + (k & 1) (k < HD / 32), interleaved pair h +
 * 16 k (word k).  NaN without a position. */
template <int HD, bool IL, bool HALF = false> struct LaneAngles {
    static constexpr int N = IL || HALF ? HD / 32 : HD / 64;
    float c[N], sn[N];

    static __device__ __forceinline__ int pair(int k, int lane)
    {
        if (HALF)
            return IL ? lane + 16 * k : 2 * lane + 32 * (k / 2) + (k & 1);
        return IL ? (lane + 32 * k) / 2 : lane + 32 * k;
    }

    __device__ __forceinline__ void load(const RowAngles &a, int lane)
    {
#pragma unroll
        for (int k = 0; k < N; k++)
            pair_angle(a, pair(k, lane), &c[k], &sn[k]);
    }

    /* from the table row at offset o of the table (o < 0: none, NaN): the
     * loads from row 0 there, then NaN selected, so that they are not
     * predicated on o (each predicated load took a move of its default) */
    __device__ __forceinline__ void load(const NParams &P, int o, int lane)
    {
        const float *cr, *sr;
        at(P, o, lane, &cr, &sr);
        /* a table there (rows_hd): without this fr_pair_cos_sin's test of
         * it stayed, and the frequency path's registers counted */
        if (cr == nullptr || sr == nullptr)
            __builtin_unreachable();
#pragma unroll
        for (int k = 0; k < N; k++)
            fr_pair_cos_sin(cr, sr, nullptr, 1.0, 0, 0, pair(k, lane) - pair(0, lane), &c[k],
                            &sn[k]);
        nan_if(o < 0);
    }

    /* the lane's first pair's cos and sin in the table row at offset o (o <
     * 0: row 0); pair k's are pair(k, lane) - pair(0, lane) on, a constant
     * (as one 64-bit address and offsets, where the columns' own sums took
     * ~4 instructions a pair) */
    static __device__ __forceinline__ void at(const NParams &P, int o, int lane, const float **cr,
                                              const float **sr)
    {
        const int r = (o < 0 ? 0 : o) + pair(0, lane);
        *cr = P.cos + r;
        *sr = P.sin + r;
    }

    /* a token without a position: NaN */
    __device__ __forceinline__ void nan_if(bool bad)
    {
        if (bad) {
#pragma unroll
            for (int k = 0; k < N; k++)
                c[k] = sn[k] = fr_u2f(0x7fc00000u);
        }
    }
};

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
#pragma unroll
        for (int k = 0; k < K; k++) {
            const float mine = norm_value<DT>(v[k], rstd, wf[k], RND);
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
            const float va = norm_value<DT>(v[k], rstd, wf[k], RND);
            const float vb = norm_value<DT>(v[k + K / 2], rstd, wf[k + K / 2], RND);
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

/* fr_norm_tree32 of a row over a half-warp (lane h of the half holds the
 * contract's partial sums 2h, p0, and 2h + 1, p1): the tree's first level
 * (p[l] + p[l + 16]) pairs lanes h and h ^ 8, each sending the partial the
 * other keeps (2h + 1 from h < 8, 2h + 16 from h + 8), so lane h < 8 holds
 * the level's sum 2h and lane h + 8 its sum 2h + 1; the levels off 8, 4, 2
 * are then xor-shuffles 4, 2, 1 and off 1 (sums 0 and 1) xor 8, each lane
 * adding what it receives to its own (a + b and b + a are the same float):
 * the tree of norm_math.h to the bit, every lane of the half ending with its
 * row's total, in 5 shuffles for the warp's two rows. */
__device__ __forceinline__ float half_tree(float p0, float p1, int h)
{
    const bool hi8 = (h & 8) != 0;
    float q = (hi8 ? p1 : p0) + __shfl_xor_sync(0xffffffffu, hi8 ? p0 : p1, 8);
    q = q + __shfl_xor_sync(0xffffffffu, q, 4);
    q = q + __shfl_xor_sync(0xffffffffu, q, 2);
    q = q + __shfl_xor_sync(0xffffffffu, q, 1);
    return q + __shfl_xor_sync(0xffffffffu, q, 8);
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
 * two at a time (the item's last odd row with a copy of its first in the
 * other half, not stored); the operations of a row are norm_forward_warp's.
 */
template <int DT, int HD, bool IL, int RND>
__global__ void FR_NORM_WARP_BOUNDS norm_forward_half(const __grid_constant__ NParams P)
{
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
        /* this half's row of the pair at j0 is j0 + half, or (past the
         * item) j0, loaded but not stored; xn: the lane's first word of the
         * next pair's row j0 + half, which steps two heads a pair (strides
         * in words: even element counts, rows_on_16) */
        const int64_t in_w = in_sh / 2, out_w = out_sh / 2;
        const uint32_t *xn =
            (const uint32_t *)row_ptr(io.in, s, b, h0, io.in_ss, io.in_sb, in_sh, DT) + h + half * in_w;
        uint32_t *yl =
            (uint32_t *)row_ptr(io.out, s, b, h0, io.out_ss, io.out_sb, out_sh, DT) + h + half * out_w;
        auto load_pair = [&](int j0, uint32_t (&u)[W]) {
            const uint32_t *x = j0 + half < n ? xn : xn - in_w;
#pragma unroll
            for (int w = 0; w < W; w++)
                u[w] = x[16 * w];
            xn += 2 * in_w;
        };
        uint32_t raw[W];
        /* the first pair's loads in flight while the angles and weights are
         * found */
        load_pair(0, raw);
        const int64_t pos = row_position(P, b, s, &bad);
        LaneAngles<HD, IL, true> an;
        an.load(row_angles<HD>(P, pos, bad), h);
        if (k != wslot) {
            wslot = k;
            lane_weights<DT, true>(P, io, h, wf);
        }
        float *r = io.rstd != nullptr ? io.rstd + t * io.heads + h0 : nullptr;
        for (int j0 = 0; j0 < n; j0 += 2) {
            float v[2 * W];
#pragma unroll
            for (int w = 0; w < W; w++) {
                v[2 * w] = Elem<DT>::to_f((uint16_t)raw[w]);
                v[2 * w + 1] = Elem<DT>::to_f((uint16_t)(raw[w] >> 16));
            }
            const bool mine = j0 + half < n;
            if (j0 + 2 < n)
                load_pair(j0 + 2, raw);
            /* partial sums 2h (even channels) and 2h + 1, words in order */
            float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
            for (int w = 0; w < W; w++) {
                p0 = p0 + v[2 * w] * v[2 * w];
                p1 = p1 + v[2 * w + 1] * v[2 * w + 1];
            }
            const float rstd = fr_norm_rstd(half_tree(p0, p1, h), HD, P.eps);
            if (h == 0 && mine && r != nullptr)
                r[j0 + half] = rstd;
            float y[2 * W];
            if constexpr (IL) {
#pragma unroll
                for (int w = 0; w < W; w++) {
                    const float va = norm_value<DT>(v[2 * w], rstd, wf[2 * w], RND);
                    const float vb = norm_value<DT>(v[2 * w + 1], rstd, wf[2 * w + 1], RND);
                    fr_rotate(va, vb, an.c[w], an.sn[w], 1.0f, &y[2 * w], &y[2 * w + 1]);
                }
            } else {
#pragma unroll
                for (int c = 0; c < W; c++) {
                    /* pair 2h + 32 (c / 2) + (c & 1): v[c] (word c / 2) and
                     * its partner v[c + W] (word c / 2 + W / 2) */
                    const float va = norm_value<DT>(v[c], rstd, wf[c], RND);
                    const float vb = norm_value<DT>(v[c + W], rstd, wf[c + W], RND);
                    fr_rotate(va, vb, an.c[c], an.sn[c], 1.0f, &y[c], &y[c + W]);
                }
            }
            if (mine) {
#pragma unroll
                for (int w = 0; w < W; w++)
                    yl[16 * w] = Elem<DT>::from_f2(y[2 * w], y[2 * w + 1]);
            }
            yl += 2 * out_w;
        }
    });
}

/* ----------------------------------------------------------------- backward */

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

/* (1) one thread per (tensor, chunk of tokens t0..t1, head, channel): the
 * head's terms of the chunk, its tokens in order, into the (chunk, head)
 * partial; t0 is a multiple of the chunk. */
__global__ void norm_dw_chunks(const __grid_constant__ NParams P)
{
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK, nk = (P.t1 - P.t0 + C - 1) / C;
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

/* (2) one thread per (tensor, chunk of tokens t0..t1, channel): the chunk's
 * heads' partials in head order, into the chunk's partial. */
__global__ void norm_dw_heads(const __grid_constant__ NParams P)
{
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK, k0 = P.t0 / C, nk = (P.t1 - P.t0 + C - 1) / C;
    const int64_t n0 = P.io[0].hp ? nk * P.io[0].hd : 0;
    const int64_t n1 = P.io[1].hp ? nk * P.io[1].hd : 0;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n0 + n1;
         q += (int64_t)gridDim.x * blockDim.x) {
        const int k = q >= n0;
        const NIo &io = P.io[k];
        const int64_t e = q - (k ? n0 : 0), ch = e / io.hd, c = e % io.hd;
        io.part[(k0 + ch) * io.hd + c] = sum_in_order(io.hp + ch * io.heads * io.hd + c,
                                                      io.heads, io.hd);
    }
}

/* (3) one thread per (tensor, channel): the partials in chunk order (a
 * few loads in flight at a time made this pass a tenth of the backward's
 * time at 4096 tokens: bench/RESULTS.md). */
__global__ void norm_dw_sum(const __grid_constant__ NParams P)
{
    const int64_t n0 = P.io[0].part ? P.io[0].hd : 0, n1 = P.io[1].part ? P.io[1].hd : 0;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n0 + n1;
         q += (int64_t)gridDim.x * blockDim.x) {
        const int k = q >= n0;
        const NIo &io = P.io[k];
        const int64_t c = q - (k ? n0 : 0);
        io.dw[c] = sum_in_order(io.part + c, P.chunks, io.hd);
    }
}

/* (4) one thread per row: dx. */
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
 * (norm_dw_heads then adds a chunk's heads in order, norm_dw_sum the
 * chunks).  So no warp waits for another: the partials' order is the
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
 * FR_CUDA_NORM_BWD_PIPE 3, 116 registers (16 warps an SM) and ~210
 * instructions a token's two rows on the loop's common path; in registers
 * one token ahead, 122 and ~224; over warps, 96 (20 warps) and ~150 a row.
 * Not yet measured. */
#ifndef FR_CUDA_NORM_BWD_HALF
#define FR_CUDA_NORM_BWD_HALF 1
#endif
/* Tokens a warp of norm_backward_heads over half-warps keeps in flight as
 * asynchronous copies to shared memory (cp.async; 1 to 4), or 0: in
 * registers (FR_CUDA_NORM_BWD_AHEAD).  A unit's 32 tokens are a chain (its
 * dw partials add in token order), so a warp's bytes in flight set its
 * pace; in shared memory they take no registers (ptxas, bf16 NeoX 128 from
 * x: 116 with 3 tokens in flight, 122 with one in registers) and PIPE 3
 * takes 35 KB a block of 4 warps.  Not yet measured. */
#ifndef FR_CUDA_NORM_BWD_PIPE
#define FR_CUDA_NORM_BWD_PIPE 3
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
 * (it moves the ring's registers about).  Not yet measured. */
#ifndef FR_CUDA_NORM_BWD_AHEAD
#define FR_CUDA_NORM_BWD_AHEAD 1
#endif
static_assert(FR_CUDA_NORM_BWD_AHEAD >= 1 && FR_CUDA_NORM_BWD_AHEAD <= 4,
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
 * (a warp's 16-byte reads of a group fall on distinct banks), and its rstd
 * [slot][lane].  A lane reads only what its own copies wrote. */
template <int K, int S> struct BwdPipe {
    uint4 rows[4][S][K][32];
    float rstd[4][S][32];
};

template <int K, int S> __device__ __forceinline__ BwdPipe<K, S> &bwd_pipe()
{
    static_assert(sizeof(BwdPipe<K, S>) <= 48 * 1024, "BwdPipe: a block's static shared memory");
    __shared__ BwdPipe<K, S> p;
    return p;
}

template <int DT, int HD, bool IL, bool SY, int G, bool HALF, int PIPE>
__global__ void FR_NORM_BWD_BOUNDS norm_backward_heads(const __grid_constant__ NParams P)
{
    static_assert(!HALF || G == 1, "norm_backward_heads: one row a half-warp");
    static_assert(PIPE == 0 || HALF, "norm_backward_heads: the pipeline over half-warps only");
    using E = typename LaneWord<HALF>::T;
    check_cu_seqlens(P.pos, P.tokens, P.flag);
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
        const int k = it >= nu * gq;
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
            constexpr int D = FR_CUDA_NORM_BWD_AHEAD;
            BwdTok<HD, IL, G, HALF> ring[D];
#pragma unroll
            for (int d = 0; d < D; d++) {
                if (d >= nt)
                    break;
                if (d > 0)
                    next_token();
                load_tok(d, ring[d]);
            }
            weights();
            for (int j0 = 0; j0 < nt; j0 += D) {
#pragma unroll
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
            uint16_t *dxq[S]; /* each slot's token's dx row */
            bool badq[S];     /* and whether it has no position */
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
                    const int col = A::pair(c, ln) - A::pair(0, ln);
                    __pipeline_memcpy_async(word(q, 2 * K + c), cr + col, 4);
                    __pipeline_memcpy_async(word(q, 3 * K + c), sr + col, 4);
                }
                __pipeline_memcpy_async(&pp.rstd[wi][q][lane], rp, 4);
                dxq[q] = dxp;
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
                    work(w.an, dxq[d], dy, xs, rs);
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
    }
}

/* ---------------------------------------------------------------- host side */

/* The grid of a grid-stride launch of n threads: blocks of 128, at most
 * per_sm of them per SM, on a device of sms SMs. */
cudaLaunchConfig_t grid_of(int64_t n, int per_sm, int sms, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    const int64_t blocks = (n + 127) / 128, cap = per_sm * (int64_t)sms;
    cfg.gridDim = dim3((unsigned)(blocks < cap ? blocks : cap), 1, 1);
    cfg.blockDim = dim3(128, 1, 1);
    cfg.stream = stream;
    return cfg;
}

/* A grid-stride launch of n threads, at most 8 blocks per SM. */
template <typename K>
cudaError_t launch(K kernel, int64_t n, const NParams &P, cudaStream_t stream)
{
    if (n <= 0)
        return cudaSuccess;
    const cudaLaunchConfig_t cfg = grid_of(n, 8, P.sms, stream);
    return cudaLaunchKernelEx(&cfg, kernel, P);
}

/* The warps an SM holds at most (2048 threads), for warp_heads' items. */
enum { WARPS_PER_SM = 2048 / 32 };

/* A grid-stride launch of `warps` warps, at most FR_CUDA_NORM_WARP_GRID
 * blocks of 128 threads an SM (0: a block for each 4 warps, at most 2^20 an
 * SM); emulated, each warp's lanes run in lockstep. */
template <typename K>
cudaError_t launch_warps(K kernel, int64_t warps, const NParams &P, cudaStream_t stream)
{
    if (warps <= 0)
        return cudaSuccess;
    const int per_sm = FR_CUDA_NORM_WARP_GRID > 0 ? FR_CUDA_NORM_WARP_GRID : 1 << 20;
    const cudaLaunchConfig_t cfg = grid_of(32 * warps, per_sm, P.sms, stream);
#ifdef FR_CUDA_EMULATE
    return fr_emu_launch_lockstep(&cfg, kernel, P);
#else
    return cudaLaunchKernelEx(&cfg, kernel, P);
#endif
}

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

void params(const fr_norm_args *na, NParams *P)
{
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    memset(P, 0, sizeof *P);
    for (int k = 0; k < a->count && k < 2; k++) {
        const fr_io *io = &a->io[k];
        NIo *o = &P->io[k];
        o->in = io->in;
        o->out = io->out;
        o->x = na->x[k];
        o->w = na->w[k];
        o->rstd = na->rstd[k];
        o->dw = na->dw[k];
        o->heads = io->heads;
        o->hd = io->head_dim;
        o->in_ss = io->in_ss;
        o->in_sb = io->in_sb;
        o->in_sh = io->in_sh;
        o->out_ss = io->out_ss;
        o->out_sb = io->out_sb;
        o->out_sh = io->out_sh;
        o->x_ss = na->x_ss[k];
        o->x_sb = na->x_sb[k];
        o->x_sh = na->x_sh[k];
    }
    P->pos = a->pos;
    P->cos = cache->max_positions > 0 ? cache->cos : nullptr;
    P->sin = cache->max_positions > 0 ? cache->sin : nullptr;
    P->inv_freq = cache->inv_freq_dev;
    P->pair_map = cache->pair_map_dev;
    P->attn = cache->attention_factor;
    P->flag = fr_range_word(a); /* the call's range_status, else the cache's flag */
    P->tokens = a->seq_len * a->batch;
    P->seq_len = a->seq_len;
    P->max_positions = cache->max_positions;
    P->half = cache->rot_dim / 2;
    P->rot_dim = cache->rot_dim;
    P->heads0 = P->io[0].heads;
    P->heads = P->io[0].heads + P->io[1].heads;
    P->chunks = (P->tokens + FUSEDROPE_NORM_DW_CHUNK - 1) / FUSEDROPE_NORM_DW_CHUNK;
    P->t0 = 0;
    P->t1 = P->tokens;
    P->interleaved = a->interleaved;
    P->dt = (int)a->dtype;
    P->wdt = (int)na->wdtype;
    P->weight = na->weight;
    P->rounding = na->rounding;
    P->saved_y = na->saved_y;
    P->eps = na->eps;
}

/* A 16-byte boundary at every row of a tensor: base and strides (elements of es bytes). */
bool rows_on_16(const void *base, int64_t ss, int64_t sb, int64_t sh, int64_t es)
{
    return ((uintptr_t)base & 15u) == 0 && (ss * es) % 16 == 0 && (sb * es) % 16 == 0 &&
           (sh * es) % 16 == 0;
}

/* The head_dim of the register-row kernels that take this call, or 0 for
 * the generic walk (see norm_forward_rows); the backward's also needs a
 * table of fewer than 2^31 floats (norm_backward_heads' int offsets). */
int64_t rows_hd(const NParams &P, int count, bool backward)
{
    const int64_t es = P.dt == 0 ? 4 : 2, hd = P.io[0].hd;
    if (P.pair_map != nullptr || P.cos == nullptr || P.rot_dim != hd || P.dt == DT_F32 ||
        !(hd == 64 || hd == 128) || (backward && P.max_positions > INT_MAX / (hd / 2)))
        return 0;
    for (int k = 0; k < count; k++) {
        const NIo &o = P.io[k];
        if (o.hd != hd || !rows_on_16(o.in, o.in_ss, o.in_sb, o.in_sh, es) ||
            !rows_on_16(o.out, o.out_ss, o.out_sb, o.out_sh, es) ||
            (backward && !rows_on_16(o.x, o.x_ss, o.x_sb, o.x_sh, es)))
            return 0;
    }
    return hd;
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

template <int DT, int HD> cudaError_t launch_rows(const NParams &P0, cudaStream_t stream)
{
    const int64_t n = (P0.t1 - P0.t0) * P0.heads;
    if (warp_rows(n)) {
        NParams P = P0;
        P.warp_heads = warp_heads(P, n);
        if (warp_half()) {
            /* items of two rows at least, one a half */
            if (P.warp_heads < 2 && P.heads >= 2)
                P.warp_heads = 2;
            const int64_t warps = (P.t1 - P.t0) * warp_groups(P);
#define FR_HALF_IL(RND)                                                                       \
    (P.interleaved ? launch_warps(norm_forward_half<DT, HD, true, RND>, warps, P, stream)       \
                   : launch_warps(norm_forward_half<DT, HD, false, RND>, warps, P, stream))
            return P.rounding == FR_ROUND_LLAMA   ? FR_HALF_IL(FR_ROUND_LLAMA)
                   : P.rounding == FR_ROUND_GEMMA ? FR_HALF_IL(FR_ROUND_GEMMA)
                                                  : FR_HALF_IL(FR_ROUND_ONCE);
#undef FR_HALF_IL
        }
        const int64_t warps = (P.t1 - P.t0) * warp_groups(P);
        /* items of fewer rows than R at a time (the decode step's one row)
         * take one row at a time: no padded rows' work */
        const int r = P.warp_heads < warp_rpw() ? 1 : warp_rpw();
#define FR_WARP_IL(R, RND)                                                                    \
    (P.interleaved ? launch_warps(norm_forward_warp<DT, HD, true, R, RND>, warps, P, stream)    \
                   : launch_warps(norm_forward_warp<DT, HD, false, R, RND>, warps, P, stream))
#define FR_WARP_RPW(R)                                                                        \
    (P.rounding == FR_ROUND_LLAMA   ? FR_WARP_IL(R, FR_ROUND_LLAMA)                            \
     : P.rounding == FR_ROUND_GEMMA ? FR_WARP_IL(R, FR_ROUND_GEMMA)                            \
                                    : FR_WARP_IL(R, FR_ROUND_ONCE))
#ifdef FR_CUDA_EMULATE
        /* every count a test may choose, the default among them */
        return r == 4 ? FR_WARP_RPW(4) : r == 3 ? FR_WARP_RPW(3) : r == 2 ? FR_WARP_RPW(2)
                                                                  : FR_WARP_RPW(1);
#else
        return r == 1 ? FR_WARP_RPW(1) : FR_WARP_RPW(FR_CUDA_NORM_WARP_RPW);
#endif
#undef FR_WARP_RPW
#undef FR_WARP_IL
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
 * choice: 0, 1 or the build's). */
template <int DT, int HD>
cudaError_t launch_half(const cudaLaunchConfig_t &cfg, const NParams &P)
{
#ifdef FR_CUDA_EMULATE
    const int pipe = FR_CHOICE(fr_emu_norm_bwd_pipe, FR_CUDA_NORM_BWD_PIPE);
    return pipe == 0   ? launch_heads_g<DT, HD, 1, true, 0>(cfg, P)
           : pipe == 1 ? launch_heads_g<DT, HD, 1, true, 1>(cfg, P)
                       : launch_heads_g<DT, HD, 1, true, FR_CUDA_NORM_BWD_PIPE>(cfg, P);
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
    const cudaLaunchConfig_t cfg = grid_of(32 * units, FR_CUDA_NORM_BWD_GRID, P.sms, stream);
    if (g == 0)
        return launch_half<DT, HD>(cfg, P);
#ifdef FR_CUDA_EMULATE
    /* every count a test may choose, the default among them */
    return g == 4   ? launch_heads_g<DT, HD, 4>(cfg, P)
           : g == 3 ? launch_heads_g<DT, HD, 3>(cfg, P)
           : g == 2 ? launch_heads_g<DT, HD, 2>(cfg, P)
                    : launch_heads_g<DT, HD, 1>(cfg, P);
#else
    /* 1, and the build's other count where it has one */
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

} /* namespace */

extern "C" fusedrope_status fr_cuda_norm_forward(const fr_norm_args *na)
{
    NParams P;
    cudaError_t err;
    int dev;
    TRY(fr_cuda_check_device(na->a.cache, &dev));
    params(na, &P);
    P.sms = fr_cuda_sm_count(dev);
    if (P.cos == nullptr && P.inv_freq == nullptr)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "fr_cuda_norm_forward: the cache has neither a device table nor frequencies");
    err = launch_forward(P, na->a.count, (cudaStream_t)na->a.stream);
    if (err != cudaSuccess)
        return fr_cuda_fail(err, "the norm forward kernel launch");
    return FUSEDROPE_OK;
}

namespace {

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

/* dx, and dw where asked for, per segment of tokens: the common rows by
 * norm_backward_heads, which leaves each (chunk, head)'s partial, the
 * others by the row kernel, which leaves each row's g * n terms, and
 * norm_dw_chunks, which sums a (chunk, head)'s terms; then norm_dw_heads,
 * each chunk's heads' partials in head order; then the chunks' partials
 * summed in chunk order.  Without dw, the row kernel over all tokens. */
cudaError_t backward_launches(NParams &P, int count, cudaStream_t stream)
{
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK, hd = rows_hd(P, count, true);
    /* the scratch floats a chunk: each (chunk, head)'s partial, and the
     * generic row kernel's terms */
    int64_t hpf[2] = { 0, 0 }, tf[2] = { 0, 0 };
    size_t pf[2] = { 0, 0 };
    for (int k = 0; k < count; k++)
        if (P.io[k].dw != nullptr) {
            hpf[k] = P.io[k].heads * P.io[k].hd;
            tf[k] = hd == 0 ? C * hpf[k] : 0;
            pf[k] = (size_t)(P.chunks * P.io[k].hd);
        }
    void *scratch = nullptr;
    cudaError_t err = cudaSuccess;
    if (pf[0] + pf[1] == 0)
        return hd != 0 ? launch_heads_all(P, hd, stream)
                       : launch(norm_dx, P.tokens * P.heads, P, stream);
    const int64_t seg = segment_tokens(P.tokens, hpf[0] + hpf[1] + tf[0] + tf[1]), nks = seg / C;
    if ((err = scratch_alloc(&scratch,
                             (pf[0] + pf[1] + (size_t)(nks * (hpf[0] + hpf[1] + tf[0] + tf[1]))) *
                                 sizeof(float),
                             stream)) != cudaSuccess)
        return err;
    float *f = (float *)scratch;
    for (int k = 0; k < 2; k++) {
        P.io[k].part = pf[k] ? f : nullptr;
        f += pf[k];
    }
    for (int k = 0; k < 2; k++) {
        P.io[k].hp = hpf[k] ? f : nullptr;
        f += nks * hpf[k];
        P.io[k].terms = tf[k] ? f : nullptr;
        f += nks * tf[k];
    }
    for (int64_t t0 = 0; t0 < P.tokens && err == cudaSuccess; t0 += seg) {
        P.t0 = t0;
        P.t1 = t0 + seg < P.tokens ? t0 + seg : P.tokens;
        const int64_t nk = (P.t1 - t0 + C - 1) / C;
        if (hd != 0) {
            err = launch_heads_all(P, hd, stream);
        } else {
            err = launch(norm_dx, (P.t1 - P.t0) * P.heads, P, stream);
            if (err == cudaSuccess)
                err = launch(norm_dw_chunks, nk * (hpf[0] + hpf[1]), P, stream);
        }
        if (err == cudaSuccess)
            err = launch(norm_dw_heads, nk * ((hpf[0] ? P.io[0].hd : 0) + (hpf[1] ? P.io[1].hd : 0)),
                         P, stream);
    }
    if (err == cudaSuccess)
        err = launch(norm_dw_sum, (pf[0] ? P.io[0].hd : 0) + (pf[1] ? P.io[1].hd : 0), P, stream);
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
    if (P.cos == nullptr && P.inv_freq == nullptr)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "fr_cuda_norm_backward: the cache has neither a device table nor frequencies");
    err = backward_launches(P, na->a.count, stream);
    if (err != cudaSuccess)
        return fr_cuda_fail(err, "the norm backward's kernels or their dw scratch");
    return FUSEDROPE_OK;
}
