/*
 * cuda_norm.cuh - what the fused per-head RMSNorm + RoPE's CUDA kernels
 * share, forward (kernels/cuda_norm_forward.cu) and backward
 * (kernels/cuda_norm_backward.cu); included inside each one's anonymous
 * namespace, after cuda_elem.cuh and cuda_index.cuh.
 *
 * The rule of both: a row (token, head) is a thread's, a warp's or a
 * half-warp's, its items grid-stride, so the launch shape never changes a
 * result; a row follows lib/cpu_norm.c's arithmetic operation for
 * operation (lib/norm_math.h, rope_math.h's fr_rotate; -fmad=false as for
 * the plain kernels), so the two backends agree to the bit.  Here: the
 * call's parameters (NParams), the generic kernels' row walk (walk_rows), a
 * token's position and angles, the warp kernels' lane weights and angles
 * (lane_weights, LaneAngles), the half-warp tree (half_tree), and on the
 * host the grid-stride launch, the parameters from the call, and which
 * calls take the register-row kernels (rows_hd).
 */
#ifndef FUSEDROPE_CUDA_NORM_CUH
#define FUSEDROPE_CUDA_NORM_CUH

/* Out of line (not a macro named __noinline__ in the emulation: glibc's
 * headers spell that attribute's name). */
#ifdef FR_CUDA_EMULATE
#define FR_NOINLINE __attribute__((noinline))
#else
#define FR_NOINLINE __noinline__
#endif

struct NIo {
    const void *in;   /* forward: x; backward: dy */
    void *out;        /* forward: y; backward: dx */
    const void *x;    /* backward: the saved tensor */
    const void *w;    /* [head_dim] weight, or NULL */
    float *rstd;      /* [tokens][heads] */
    float *dw;        /* backward: [head_dim], or NULL */
    float *hp;        /* backward with dw: [chunks of t0..t1][heads][head_dim] scratch, each
                         (chunk, head)'s partial; NULL: none */
    float *terms;     /* backward with dw: [t1 - t0][heads][head_dim] scratch, g * n of the
                         rows of tokens t0..t1 as the row kernel found them; NULL: none */
    float *cs;        /* backward with dw: [chunks of t0..t1][head_dim] scratch, each chunk's
                         heads' partials added (norm_dw_fold) */
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
    int64_t tokens, seq_len, max_positions, half, rot_dim, heads0, heads;
    int64_t t0, t1; /* the row kernels' tokens: t0 <= t < t1 */
    int64_t warp_heads; /* norm_forward_warp: the rows (heads of a token) of a warp's item */
    /* the forward's warp kernels (launch_warps): a token's groups of heads
     * (items), groups_q of them q's; the grid's warps as a step through
     * the items, step_t tokens and step_g groups, and step_t tokens as
     * step_b sequences and step_s positions */
    int64_t groups, groups_q, step_t, step_g, step_b, step_s;
    int64_t unit_tokens; /* norm_backward_heads: the tokens of a warp's unit */
    /* backward with dw: norm_dw_fold's arrivals, a count a (tensor, group
     * of its channels), zeroed by the segment's row kernels */
    unsigned *fold_count;
    int64_t fold_n;
    int interleaved, dt, wdt, weight, rounding, saved_y;
    float eps;
    int sms; /* host side: the device's SM count, for the launch shapes */
    bool pdl; /* host side: launch the backward's kernels as programmatic dependents */
    /* the row kernels' bulk prefetches into L2 (fr_prefetch_l2): the
     * forward's (norm_forward_half) 1 or 0, the backward's
     * (norm_backward_heads) tokens ahead, 0 for none */
    int prefetch;
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
            fr_pair_cos_sin(cr, sr, nullptr, 1.0, 0, 0, col(k, lane), &c[k], &sn[k]);
        nan_if(o < 0);
    }

    /* the lane's first pair's cos and sin in the table row at offset o (o <
     * 0: row 0); pair k's are col(k, lane) on, a constant (as one 64-bit
     * address and offsets, where the columns' own sums took ~4
     * instructions a pair) */
    static __device__ __forceinline__ void at(const NParams &P, int o, int lane, const float **cr,
                                              const float **sr)
    {
        const int r = (o < 0 ? 0 : o) + pair(0, lane);
        *cr = P.cos + r;
        *sr = P.sin + r;
    }

    /* pair k's column past at()'s addresses */
    static __device__ __forceinline__ int col(int k, int lane)
    {
        return pair(k, lane) - pair(0, lane);
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

/* fr_norm_tree32 of a row over a half-warp (lane h of the half holds the
 * contract's partial sums 2h, p0, and 2h + 1, p1): the tree's first level
 * (p[l] + p[l + 16]) pairs lanes h and h ^ 8, each sending the partial the
 * other keeps (2h + 1 from h < 8, 2h + 16 from h + 8), so lane h < 8 holds
 * the level's sum 2h and lane h + 8 its sum 2h + 1; the levels off 8, 4, 2
 * are then xor-shuffles 4, 2, 1 and off 1 (sums 0 and 1) xor 8, each lane
 * adding what it receives to its own (a + b and b + a are the same float):
 * the tree of norm_math.h to the bit, every lane of the half ending with its
 * row's total, in 5 shuffles for the warp's two rows (half_tree; its first
 * level half_tree_first, its last three half_tree_last). */
__device__ __forceinline__ float half_tree_first(float p0, float p1, int h)
{
    const bool hi8 = (h & 8) != 0;
    return (hi8 ? p1 : p0) + __shfl_xor_sync(0xffffffffu, hi8 ? p0 : p1, 8);
}

/* the levels off 4, 2, 1 from the lane's sum q of the level off 8 */
__device__ __forceinline__ float half_tree_last(float q)
{
    q = q + __shfl_xor_sync(0xffffffffu, q, 2);
    q = q + __shfl_xor_sync(0xffffffffu, q, 1);
    return q + __shfl_xor_sync(0xffffffffu, q, 8);
}

__device__ __forceinline__ float half_tree(float p0, float p1, int h)
{
    const float q = half_tree_first(p0, p1, h);
    return half_tree_last(q + __shfl_xor_sync(0xffffffffu, q, 4));
}

/* half_tree of two rows a half (row a's partial sums a0, a1 and row b's
 * b0, b1 in each lane), sharing the shuffles from the second level on:
 * after each row's first level (half_tree's), lanes h and h ^ 4 trade so
 * that lane h with h & 4 clear adds row a's sums of the level off 8 and
 * lane h | 4 row b's (row b's partials then lie in the lanes ^ 4 of row
 * a's); the levels off 4, 2, 1 are half_tree's, for both rows at once.
 * The lane's row's total: a's where h & 4 is clear, b's where it is set;
 * 6 shuffles for the warp's four rows where two half_trees took 10. */
__device__ __forceinline__ float half_tree2(float a0, float a1, float b0, float b1, int h)
{
    const bool hi4 = (h & 4) != 0;
    const float qa = half_tree_first(a0, a1, h), qb = half_tree_first(b0, b1, h);
    return half_tree_last((hi4 ? qb : qa) + __shfl_xor_sync(0xffffffffu, hi4 ? qa : qb, 4));
}

/* ---------------------------------------------------------------- host side */

/* The grid of a grid-stride launch of n threads: blocks of 128, at most
 * per_sm of them per SM, on a device of sms SMs. */
inline cudaLaunchConfig_t grid_of(int64_t n, int per_sm, int sms, cudaStream_t stream)
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

inline void params(const fr_norm_args *na, NParams *P)
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
inline bool rows_on_16(const void *base, int64_t ss, int64_t sb, int64_t sh, int64_t es)
{
    return ((uintptr_t)base & 15u) == 0 && (ss * es) % 16 == 0 && (sb * es) % 16 == 0 &&
           (sh * es) % 16 == 0;
}

/* The head_dim of the register-row kernels that take this call, or 0 for
 * the generic walk (see norm_forward_rows); the backward's also needs a
 * table of fewer than 2^31 floats (norm_backward_heads' int offsets). */
inline int64_t rows_hd(const NParams &P, int count, bool backward)
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

#endif /* FUSEDROPE_CUDA_NORM_CUH */
