/*
 * test_norm_kernel_emu.c - what only the fused RMSNorm + RoPE's CUDA kernels
 * do, run on the CPU through the host build of kernels/cuda_norm_*.cu
 * (kernels/cuda_norm_*_emu.cc, kernels/cuda_emu.h): positions that live on the
 * device are checked by the kernels, not on the host, so a token without a
 * position in the table (an id >= max_positions, a negative id, a THD token
 * outside every sequence) gets NaN and raises the range flag
 * (fusedrope_norm_forward_qk(3)).  The library's host checks refuse such
 * positions on a CPU cache before any backend runs, so, as test_kernel_emu
 * does for the plain kernels, each case calls the emulated entry points
 * (fr_emu_cuda_norm_forward / _backward) directly with an fr_norm_args built
 * as lib/norm.c builds it, a CPU cache standing in for the device's
 * (tests/cuda_norm_emu_wrap.c).
 *
 * Each case (q with 3 heads and k with 2; dtype, head_dim, rot_dim, head
 * stride and positions as the table below says) runs on the register-row
 * kernels (norm_forward_rows, norm_backward_heads: 16-bit, head_dim 64/128,
 * full rotary, rows on 16 bytes; the forward also on norm_forward_warp, in
 * items of 4 rows across q and k, 2 at a time, and on norm_forward_half, in
 * items of 3 rows, two at a time; the backward over half-warps, q's third
 * head beside a copy of its first, its tokens as the build keeps them in
 * flight and through shared memory three at a time, and over warps) or the
 * generic ones
 * (norm_forward, norm_dx, and the backward's dw kernels: the rows' terms,
 * norm_dw_chunks, norm_dw_fold), in both
 * styles, in and out of place, from x or from the saved y, in each rounding
 * mode (WEIGHT, or PLUS_ONE with the Gemma rounding), with and without dw.
 * Each call runs twice: with the case's positions, and with every bad
 * token's position replaced by 0 (the reference; it must raise nothing).
 * Checked, element by element:
 *   forward   a bad token's rows: NaN in every rotated channel (c < rot_dim);
 *             its channels past rot_dim only normalised: the reference's
 *             bytes, not NaN.  Every other token's rows: the reference's
 *             bytes.  rstd: the reference's bytes (it does not depend on the
 *             position).  The padding between heads: never written.
 *   backward  a bad token's dx rows: NaN in every channel: the rotated ones
 *             through their NaN angle, the others through the row's mean
 *             sum(dn * n) / head_dim, to which the rotated channels add NaN
 *             (the man page: "its dq_in row").  Every other token's rows: the
 *             reference's bytes.  dw (a bad token contributes g * n to every
 *             channel's chunk sum): NaN in every channel c < rot_dim (g is
 *             R^T dy with a NaN angle); channels past rot_dim use no angle,
 *             so they are the reference's bytes, finite.
 *   the flag  the cache's range flag (range_flag_dev) is 1 after a call with
 *             a bad token, 0 after the reference.  With the call's own word
 *             (fr_apply_args.range_status, pos->range_status) that word is
 *             raised instead, and the cache's flag is left 0
 *             (test_out_of_table_range_status).
 * The dx kernels raise the flag (with dw too: the rows' terms carry the NaN
 * angle into dw).  48 random cases do the same over random shapes and
 * device positions, an invalid cu_seqlens among them, each token's fate from
 * the test reference's position model (test_random_device_positions).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedrope.h"
#include "internal.h"
#include "ref.h"
#include "util.h"

fusedrope_status fr_emu_cuda_norm_forward(const fr_norm_args *a);
fusedrope_status fr_emu_cuda_norm_backward(const fr_norm_args *a);
extern int fr_emu_sms; /* kernels/cuda_emu_sms.cc */
/* kernels/cuda_norm_*.cu, emulated: the forward's warp kernels, their
 * items' rows and rows at a time, the backward's layouts */
extern int fr_emu_norm_warp, fr_emu_norm_warp_heads, fr_emu_norm_warp_rpw, fr_emu_norm_bwd_heads,
    fr_emu_norm_warp_half, fr_emu_norm_bwd_half, fr_emu_norm_bwd_pipe, fr_emu_norm_warp_blocks;

enum { M = 32, MAXT = 64 }; /* table rows; most tokens of a case */
/* q's and k's heads: odd and even, a warp's item of several heads short;
 * some random cases take 8 and 4 (two pairs of rows a step over
 * half-warps: full_steps) */
static int64_t heads[2] = { 3, 2 };

/* ids of S 12 x B 3 tokens ([b][s]): all in the table but token 5 (at
 * max_positions), 14 (-1), 22 (far past), 27 (2^40), 33 (INT64_MIN). */
static int64_t ids_bad[36];
static void make_ids(void)
{
    for (int t = 0; t < 36; t++)
        ids_bad[t] = (t * 7) % M;
    ids_bad[5] = M;
    ids_bad[14] = -1;
    ids_bad[22] = M + 1000;
    ids_bad[27] = (int64_t)1 << 40;
    ids_bad[33] = INT64_MIN;
}
/* THD, 14 tokens: sequences [0, 5) and [5, 11); tokens 11-13 in none. */
static const int32_t cu_short[3] = { 0, 5, 11 };

static const struct {
    const char *name;
    fusedrope_dtype dt;
    int64_t D, R, pad; /* head_dim, rot_dim, head stride - D (1: rows off 16 bytes) */
    int64_t S, B;
    const int32_t *cu; /* THD (B 1, two sequences), else ids_bad */
    int bad[6];        /* tokens (b * S + s, the order of ids) without a position, -1 ends */
    int rows;          /* the register-row kernels take it (rows_hd) */
} cases[] = {
    { "bf16 hd128 full rotary", FUSEDROPE_BFLOAT16, 128, 128, 0, 12, 3, NULL,
      { 5, 14, 22, 27, 33, -1 }, 1 },
    { "bf16 hd128 rot64", FUSEDROPE_BFLOAT16, 128, 64, 0, 12, 3, NULL,
      { 5, 14, 22, 27, 33, -1 }, 0 },
    { "fp32 hd128 full rotary", FUSEDROPE_FLOAT32, 128, 128, 0, 12, 3, NULL,
      { 5, 14, 22, 27, 33, -1 }, 0 },
    { "fp32 hd128 rot64", FUSEDROPE_FLOAT32, 128, 64, 0, 12, 3, NULL,
      { 5, 14, 22, 27, 33, -1 }, 0 },
    { "fp16 hd64 full rotary", FUSEDROPE_FLOAT16, 64, 64, 0, 12, 3, NULL,
      { 5, 14, 22, 27, 33, -1 }, 1 },
    { "bf16 hd128 full rotary, rows off 16 bytes", FUSEDROPE_BFLOAT16, 128, 128, 1, 12, 3, NULL,
      { 5, 14, 22, 27, 33, -1 }, 0 },
    { "bf16 hd128 full rotary, THD outside the sequences", FUSEDROPE_BFLOAT16, 128, 128, 0, 14,
      1, cu_short, { 11, 12, 13, -1 }, 1 },
    { "fp32 hd128 rot64, THD outside the sequences", FUSEDROPE_FLOAT32, 128, 64, 0, 14, 1,
      cu_short, { 11, 12, 13, -1 }, 0 },
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* _i % VARIANTS: style x in place x saved y x dw x rounding */
typedef struct {
    int interleaved, in_place, saved_y, dw, rounding, weight;
} variant;
#define VARIANTS (2 * 2 * 2 * 2 * 3)
static variant decode(int i)
{
    variant v;
    v.interleaved = i % 2;
    i /= 2;
    v.in_place = i % 2;
    i /= 2;
    v.saved_y = i % 2;
    i /= 2;
    v.dw = i % 2;
    i /= 2;
    v.rounding = i % 3;
    v.weight = v.rounding == FUSEDROPE_NORM_ROUND_GEMMA ? FUSEDROPE_NORM_WEIGHT_PLUS_ONE
                                                        : FUSEDROPE_NORM_WEIGHT;
    return v;
}

/* A case as run_case takes it: a row of the table above, or a random one
 * (test_random_device_positions). */
typedef struct {
    const char *name;
    fusedrope_dtype dt;
    int64_t D, R, pad, S, B;
    fr_pos_args pos; /* the case's positions (what fr_apply_prepare derives) */
    int bad[MAXT];   /* per token (b * S + s): no position */
    int flag;        /* the flag the case's call raises: a bad token, or garbage */
    int garbage;     /* an invalid cu_seqlens: which tokens the kernels place where is
                      * their search's, so only the padding, the channels past rot_dim
                      * (forward), rstd and dw past rot_dim are checked */
    int rows;        /* the register-row kernels take it (rows_hd) */
    uint64_t seed;
} ncase;

/* One tensor's buffers ([S, B, H, D + pad] in sbhd order); [0]: the
 * reference call's output, [1]: the case's. */
typedef struct {
    int64_t H, sh, sb, ss;
    size_t n, bytes;
    unsigned char *x, *dy, *w, *y[2], *dx[2];
    float *rstd[2], *dw[2];
} tens;

static void *alloc64(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    ck_assert(p != NULL);
    return p;
}

/* Row c of the table as a case (positions as fr_apply_prepare derives them). */
static void table_case(int c, ncase *nc)
{
    memset(nc, 0, sizeof *nc);
    nc->name = cases[c].name;
    nc->dt = cases[c].dt;
    nc->D = cases[c].D;
    nc->R = cases[c].R;
    nc->pad = cases[c].pad;
    nc->S = cases[c].S;
    nc->B = cases[c].B;
    if (cases[c].cu) {
        nc->pos.cu_seqlens = cases[c].cu;
        nc->pos.num_seqs = 2;
    } else {
        nc->pos.ids = ids_bad;
    }
    nc->pos.seq_len = cases[c].S;
    nc->pos.cp_size = 1;
    nc->pos.num_axes = 1;
    nc->pos.ids_rows = 1;
    nc->pos.ids_row_stride = cases[c].S * cases[c].B;
    for (int j = 0; j < 6 && cases[c].bad[j] >= 0; j++)
        nc->bad[cases[c].bad[j]] = 1;
    nc->flag = 1;
    nc->rows = cases[c].rows;
    nc->seed = 1000 * (uint64_t)c;
}

typedef struct {
    const ncase *nc;
    variant v;
    fusedrope_dtype dt, wdt;
    int64_t S, B, D, R;
    tens t[2];
    const fusedrope_cache *cache;
    fr_pos_args pos[2]; /* [0]: every position made valid, [1]: the case's */
} ctx;

static fr_norm_args make_args(const ctx *x, fusedrope_cache *emu, int backward, int which)
{
    fr_norm_args na;
    memset(&na, 0, sizeof na);
    na.a.cache = emu;
    na.a.sgn = backward ? -1.0f : 1.0f;
    na.a.interleaved = x->v.interleaved;
    na.a.dtype = x->dt;
    na.a.seq_len = x->S;
    na.a.batch = x->B;
    na.a.pos = x->pos[which];
    na.a.count = 2;
    na.weight = x->v.weight;
    na.rounding = x->v.rounding;
    na.saved_y = backward && x->v.saved_y;
    na.eps = 1e-6f;
    na.wdtype = x->wdt;
    for (int k = 0; k < 2; k++) {
        const tens *t = &x->t[k];
        fr_io *io = &na.a.io[k];
        unsigned char *out = backward ? t->dx[which] : t->y[which];
        const unsigned char *in = backward ? t->dy : t->x;
        if (x->v.in_place)
            memcpy(out, in, t->bytes);
        else
            memset(out, 0xa5, t->bytes);
        io->in = x->v.in_place ? out : in;
        io->out = out;
        io->heads = t->H;
        io->head_dim = x->D;
        io->in_ss = io->out_ss = t->ss;
        io->in_sb = io->out_sb = t->sb;
        io->in_sh = io->out_sh = t->sh;
        io->in_place = x->v.in_place;
        na.w[k] = t->w;
        if (!backward) {
            memset(t->rstd[which], 0xa5, (size_t)(x->S * x->B * t->H) * sizeof(float));
            na.rstd[k] = t->rstd[which];
        } else {
            na.rstd[k] = t->rstd[0]; /* the forward's (the same for both calls) */
            na.x[k] = x->v.saved_y ? t->y[0] : t->x;
            na.x_ss[k] = t->ss;
            na.x_sb[k] = t->sb;
            na.x_sh[k] = t->sh;
            if (x->v.dw) {
                memset(t->dw[which], 0xa5, (size_t)x->D * sizeof(float));
                na.dw[k] = t->dw[which];
            }
        }
    }
    return na;
}

/* One emulated call; the flag and the word it must leave: raised by the
 * case's positions, not by the reference's. */
static void call(const ctx *x, int backward, int which, int status, const char *what)
{
    fusedrope_cache emu = *x->cache;
    int flag = 0;
    int32_t word = 0;
    fr_norm_args na;
    emu.inv_freq_dev = emu.inv_freq;
    emu.pair_map_dev = emu.pair_map;
    emu.range_flag = emu.range_flag_dev = &flag;
    na = make_args(x, &emu, backward, which);
    na.a.range_status = status ? &word : NULL;
    ck_assert_int_eq(backward ? fr_emu_cuda_norm_backward(&na) : fr_emu_cuda_norm_forward(&na),
                     FUSEDROPE_OK);
    const int want = which ? x->nc->flag : 0;
    if (status)
        ck_assert_msg(word == want && flag == 0,
                      "%s, %s %s: range_status is %d (want %d), the cache's flag %d (want 0)",
                      x->nc->name, backward ? "backward" : "forward", what, (int)word, want,
                      flag);
    else
        ck_assert_msg(flag == want, "%s, %s %s: the range flag is %d, not %d", x->nc->name,
                      backward ? "backward" : "forward", what, flag, want);
}

/* An element's check: libcheck sends every passing ck_assert_* down its
 * pipe (a write each), which for millions of elements takes most of the
 * run; this reaches libcheck only when it fails. */
#define CHECK(cond, ...)                  \
    do {                                  \
        if (!(cond))                      \
            ck_abort_msg(__VA_ARGS__);    \
    } while (0)

static int nan_at(const unsigned char *p, fusedrope_dtype dt)
{
    return isnan(ref_load(p, dt, 0));
}

/* y (forward) or dx (backward) against the reference, element by element. */
static void check_rows(const ctx *x, int backward, const int *bad)
{
    const size_t es = ref_dtype_size(x->dt);
    const char *name = x->nc->name;
    for (int k = 0; k < 2; k++) {
        const tens *t = &x->t[k];
        const unsigned char *got = backward ? t->dx[1] : t->y[1],
                            *ref = backward ? t->dx[0] : t->y[0],
                            *in = backward ? t->dy : t->x;
        for (int64_t s = 0; s < x->S; s++)
            for (int64_t b = 0; b < x->B; b++)
                for (int64_t h = 0; h < t->H; h++)
                    for (int64_t c = 0; c < t->sh; c++) {
                        const size_t o = (size_t)(s * t->ss + b * t->sb + h * t->sh + c) * es;
                        const int bt = bad[b * x->S + s];
                        if (c >= x->D) { /* between heads: never written */
                            for (size_t j = 0; j < es; j++)
                                CHECK(got[o + j] == (x->v.in_place ? in[o + j] : 0xa5) &&
                                                  ref[o + j] == got[o + j],
                                              "%s: padding written at s %lld b %lld h %lld",
                                              name, (long long)s, (long long)b, (long long)h);
                            continue;
                        }
                        CHECK(!nan_at(ref + o, x->dt),
                                      "%s %s: the reference is NaN at tensor %d s %lld b %lld "
                                      "h %lld c %lld", name, backward ? "dx" : "y", k,
                                      (long long)s, (long long)b, (long long)h, (long long)c);
                        if (x->nc->garbage && (backward || c < x->R)) {
                            continue; /* placed by the kernels' search */
                        } else if (bt && (backward || c < x->R)) {
                            CHECK(nan_at(got + o, x->dt),
                                          "%s %s: token (s %lld, b %lld) has no position but "
                                          "tensor %d head %lld channel %lld is not NaN", name,
                                          backward ? "dx" : "y", (long long)s, (long long)b, k,
                                          (long long)h, (long long)c);
                        } else {
                            CHECK(memcmp(got + o, ref + o, es) == 0,
                                          "%s %s: token (s %lld, b %lld%s) tensor %d head %lld "
                                          "channel %lld differs from the call with valid ids",
                                          name, backward ? "dx" : "y", (long long)s,
                                          (long long)b, bt ? ", no position" : "", k,
                                          (long long)h, (long long)c);
                        }
                    }
        if (!backward)
            CHECK(memcmp(t->rstd[1], t->rstd[0],
                                 (size_t)(x->S * x->B * t->H) * sizeof(float)) == 0,
                          "%s: rstd of tensor %d differs from the call with valid ids", name, k);
        else if (x->v.dw)
            for (int64_t c = 0; c < x->D; c++) {
                CHECK(isfinite(t->dw[0][c]), "%s: the reference dw[%lld] is %g", name,
                              (long long)c, (double)t->dw[0][c]);
                if (c < x->R && x->nc->garbage)
                    continue;
                if (c < x->R && x->nc->flag) /* (not garbage: a bad token) */
                    CHECK(isnan(t->dw[1][c]),
                                  "%s: tensor %d dw[%lld] (rotated) is %g, not NaN", name, k,
                                  (long long)c, (double)t->dw[1][c]);
                else
                    CHECK(memcmp(&t->dw[1][c], &t->dw[0][c], sizeof(float)) == 0,
                                  "%s: tensor %d dw[%lld] (past rot_dim) is %g, not the "
                                  "reference's %g", name, k, (long long)c,
                                  (double)t->dw[1][c], (double)t->dw[0][c]);
            }
    }
}

static void run_case(const ncase *nc, int vi, int status)
{
    const size_t es = ref_dtype_size(nc->dt);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    int64_t good_ids[MAXT];
    const int *bad = nc->bad;
    ctx x;
    tu_rng r;

    memset(&x, 0, sizeof x);
    x.nc = nc;
    x.v = decode(vi);
    x.dt = nc->dt;
    /* a 16-bit weight in the tensors' dtype in half of the variants */
    x.wdt = x.dt != FUSEDROPE_FLOAT32 && x.v.saved_y ? x.dt : FUSEDROPE_FLOAT32;
    x.S = nc->S;
    x.B = nc->B;
    x.D = nc->D;
    x.R = nc->R;
    ck_assert(x.S * x.B <= MAXT);
    /* rows_hd's rule (kernels/cuda_norm.cuh), the case's claim about its kernels */
    ck_assert_int_eq(nc->rows, x.dt != FUSEDROPE_FLOAT32 && (x.D == 64 || x.D == 128) &&
                                   x.R == x.D && nc->pad == 0);

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)x.R, M, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    x.cache = cache;

    /* positions: the case's, and the reference's (each token's explicit
     * position; a bad token's 0), with a check of which tokens are bad */
    x.pos[1] = nc->pos;
    for (int64_t b = 0; b < x.B; b++)
        for (int64_t s = 0; s < x.S; s++) {
            int bt = 0;
            const int64_t p = fr_token_position(&x.pos[1], b, s, &bt);
            bt |= p >= M;
            ck_assert_msg(nc->garbage || bt == bad[b * x.S + s],
                          "%s: token %lld is %s, the case says otherwise", nc->name,
                          (long long)(b * x.S + s), bt ? "bad" : "good");
            good_ids[b * x.S + s] = bt ? 0 : p;
        }
    memset(&x.pos[0], 0, sizeof x.pos[0]);
    x.pos[0].ids = good_ids;
    x.pos[0].seq_len = x.S;
    x.pos[0].cp_size = 1;
    x.pos[0].num_axes = 1;
    x.pos[0].ids_rows = 1;
    x.pos[0].ids_row_stride = x.S * x.B;

    tu_rng_init(&r, nc->seed + (uint64_t)vi + (status ? 500 : 0));
    for (int k = 0; k < 2; k++) {
        tens *t = &x.t[k];
        t->H = heads[k];
        t->sh = x.D + nc->pad;
        t->sb = t->H * t->sh;
        t->ss = x.B * t->sb;
        t->n = (size_t)(x.S * t->ss);
        t->bytes = t->n * es;
        t->x = alloc64(t->bytes);
        t->dy = alloc64(t->bytes);
        t->w = alloc64((size_t)x.D * ref_dtype_size(x.wdt));
        tu_fill(t->x, (int64_t)t->n, x.dt, &r, -2.0, 2.0);
        tu_fill(t->dy, (int64_t)t->n, x.dt, &r, -2.0, 2.0);
        if (x.v.weight == FUSEDROPE_NORM_WEIGHT_PLUS_ONE)
            tu_fill(t->w, x.D, x.wdt, &r, -0.5, 0.5);
        else
            tu_fill(t->w, x.D, x.wdt, &r, 0.5, 1.5);
        for (int w = 0; w < 2; w++) {
            t->y[w] = alloc64(t->bytes);
            t->dx[w] = alloc64(t->bytes);
            t->rstd[w] = alloc64((size_t)(x.S * x.B * t->H) * sizeof(float));
            t->dw[w] = alloc64((size_t)x.D * sizeof(float));
        }
    }

    /* forward: the reference (its y and rstd feed the backward), then the
     * case's positions */
    call(&x, 0, 0, status, "with valid ids");
    if (nc->rows) {
        /* the register-row cases also with rows over warps (2 at a time,
         * items of 4), over half-warps (items of 3: a pair short), with few
         * warps, each stepping through items (1 block: 4 warps, 2 tokens of
         * the 2 groups; 7: 28 warps, 9 tokens and 1 group of the 3 that
         * items of 2 rows make), and two pairs of rows a step (where the
         * heads are multiples of 4; else a pair) */
        static const struct {
            int half, heads, rpw, blocks;
            const char *what;
        } warps[] = {
            { 0, 4, 2, 0, "rows over warps" },
            { 1, 3, 2, 0, "rows over half-warps" },
            { 1, 3, 2, 1, "half-warps, 4 warps" },
            { 1, 2, 2, 7, "half-warps, 28 warps" },
            { 0, 2, 2, 7, "rows over warps, 28 warps" },
            { 2, 4, 0, 1, "two pairs a step, 4 warps" },
            { 2, 8, 0, 0, "two pairs a step" },
        };
        char what[96];
        fr_emu_norm_warp = 1;
        for (size_t i = 0; i < sizeof warps / sizeof warps[0]; i++) {
            fr_emu_norm_warp_half = warps[i].half;
            fr_emu_norm_warp_heads = warps[i].heads;
            fr_emu_norm_warp_rpw = warps[i].rpw;
            fr_emu_norm_warp_blocks = warps[i].blocks;
            snprintf(what, sizeof what, "with the case's positions, %s", warps[i].what);
            call(&x, 0, 1, status, what);
            check_rows(&x, 0, bad);
        }
        fr_emu_norm_warp = 0;
        fr_emu_norm_warp_half = -1;
        fr_emu_norm_warp_heads = 0;
        fr_emu_norm_warp_rpw = 0;
        fr_emu_norm_warp_blocks = 0;
    }
    call(&x, 0, 1, status, "with the case's positions");
    check_rows(&x, 0, bad);
    call(&x, 1, 0, status, "with valid ids");
    call(&x, 1, 1, status, "with the case's positions");
    check_rows(&x, 1, bad);
    if (nc->rows) { /* the register-row cases also with rows over warps, and over half-warps
                       with three tokens in flight through shared memory */
        fr_emu_norm_bwd_half = 0;
        call(&x, 1, 1, status, "with the case's positions, rows over warps");
        fr_emu_norm_bwd_half = -1;
        check_rows(&x, 1, bad);
        fr_emu_norm_bwd_pipe = 3;
        call(&x, 1, 1, status, "with the case's positions, three tokens through shared memory");
        fr_emu_norm_bwd_pipe = -1;
        check_rows(&x, 1, bad);
    }

    for (int k = 0; k < 2; k++) {
        tens *t = &x.t[k];
        free(t->x);
        free(t->dy);
        free(t->w);
        for (int w = 0; w < 2; w++) {
            free(t->y[w]);
            free(t->dx[w]);
            free(t->rstd[w]);
            free(t->dw[w]);
        }
    }
    fusedrope_cache_destroy(cache);
}

/* The cache's flag, every case in every variant; under valgrind (which
 * looks for memory errors) a sixth of the variants a case, case c those
 * of residue c % 6: every variant at least once. */
START_TEST(test_out_of_table_positions)
{
    ncase nc;
    if (tu_under_valgrind() && (_i % VARIANTS) % 6 != (_i / VARIANTS) % 6)
        return;
    table_case(_i / VARIANTS, &nc);
    run_case(&nc, _i % VARIANTS, 0);
}
END_TEST

/* The call's own word instead of the cache's flag: every case, both styles,
 * with and without dw (variant bits 0 and 3).  The kernels' NParams.flag must
 * be a->range_status where the call names one (fr_range_word, lib/internal.h,
 * the plain kernels' rule too). */
START_TEST(test_out_of_table_range_status)
{
    const int j = _i % 4;
    ncase nc;
    table_case(_i / 4, &nc);
    run_case(&nc, (j & 1) + 8 * (j >> 1), 1);
}
END_TEST

/*
 * Random calls with device-style positions nobody checked: ids (one row),
 * offsets (near the int64 ends too) or cu_seqlens (tests/util.c's
 * tu_cu_seqlens: valid splits, sequences longer than the table, a decrease
 * inside, anything), over random dtypes, head_dim 64 or 128, full or half
 * rotary, rows on or off 16 bytes, token counts, variants and the flag or
 * the call's word; which tokens are bad comes from the test reference's
 * position model (tu_bad_tokens), the flag from them and the cu_seqlens'
 * validity (tu_cu_seqlens), and run_case checks the rest.
 */
enum { NRANDOM = 48 };

START_TEST(test_random_device_positions)
{
    static const fusedrope_dtype dts[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                            FUSEDROPE_BFLOAT16 };
    char name[160];
    const int mode = _i % 3; /* 0 ids, 1 offsets, 2 cu_seqlens */
    int64_t ids[MAXT], offsets[4];
    int32_t cu[8];
    ncase nc;
    fusedrope_positions P; /* the same positions, for the reference's model */
    tu_rng r;

    /* under valgrind a quarter (_i 0, 4, 8, ...: every mode, _i % 3) */
    if (tu_valgrind_skips(_i, 4))
        return;
    tu_rng_init(&r, tu_seed * 7919 + 4243 + (uint64_t)_i);
    memset(&nc, 0, sizeof nc);
    nc.dt = dts[tu_int(&r, 0, 2)];
    nc.D = tu_int(&r, 0, 1) ? 128 : 64;
    nc.R = tu_int(&r, 0, 1) ? nc.D : nc.D / 2;
    nc.pad = tu_int(&r, 0, 3) == 0;
    nc.B = mode == 2 ? 1 : tu_int(&r, 1, 4);
    nc.S = mode == 2 ? tu_int(&r, 1, 48) : tu_int(&r, 1, 16);
    nc.pos.seq_len = nc.S;
    nc.pos.cp_size = 1;
    nc.pos.num_axes = 1;
    nc.pos.ids_rows = 1;
    nc.pos.ids_row_stride = nc.S * nc.B;
    fusedrope_positions_init(&P);
    if (mode == 0) {
        for (int64_t t = 0; t < nc.S * nc.B; t++)
            ids[t] = tu_position(&r, M);
        nc.pos.ids = P.ids = ids;
    } else if (mode == 1) {
        for (int64_t b = 0; b < nc.B; b++)
            offsets[b] = tu_offset(&r, M, nc.S);
        nc.pos.offsets = P.offsets = offsets;
    } else {
        const int n = (int)tu_int(&r, 1, 6);
        nc.garbage = !tu_cu_seqlens(&r, cu, n, nc.S);
        nc.pos.cu_seqlens = P.cu_seqlens = cu;
        nc.pos.num_seqs = P.num_seqs = n;
    }
    nc.flag = nc.garbage || tu_bad_tokens(&P, 1, nc.S, nc.B, M, nc.bad);
    nc.rows = nc.dt != FUSEDROPE_FLOAT32 && nc.R == nc.D && nc.pad == 0;
    nc.seed = tu_seed + 90000 + 1000 * (uint64_t)_i;
    snprintf(name, sizeof name, "random case %d (%s, [%lld, %lld] hd %lld rot %lld%s, %s%s)",
             _i, mode == 0 ? "ids" : mode == 1 ? "offsets" : "cu_seqlens", (long long)nc.S,
             (long long)nc.B, (long long)nc.D, (long long)nc.R, nc.pad ? " padded" : "",
             ref_dtype_name(nc.dt), nc.garbage ? ", invalid cu_seqlens" : "");
    nc.name = name;
    if (_i % 2 == 1) { /* heads for two pairs of rows a step */
        heads[0] = 8;
        heads[1] = 4;
    }
    run_case(&nc, (int)tu_int(&r, 0, VARIANTS - 1), (int)tu_int(&r, 0, 1));
    heads[0] = 3;
    heads[1] = 2;
}
END_TEST

/*
 * What the norm calls check before their kernels, and what the kernels check
 * that the host cannot: a cache of another device than the current one (the
 * emulation's current device is 0) is refused, with nothing written, dw of
 * an empty tensor not zeroed either; cu_seqlens whose ends are wrong, or
 * that decrease, while every token lies in some sequence ({0, 4, 12},
 * {-2, 4, 8} or {0, 6, 2, 8} over 8 tokens) raise the flag
 * (check_cu_seqlens).  _i: the forward's three
 * kernels (thread per row, rows in registers, rows over a warp) and the
 * backward's two (norm_dx, norm_backward_heads).
 */
/* A q-only call's arguments as lib/norm.c builds them, on emu (a copy of
 * cache standing in for the device's, its flag the given one): T tokens of
 * H heads of D channels, x in and y out, weight w (WEIGHT, in the tensors'
 * dtype), rstd; from x for a backward. */
static void one_tensor_args(fr_norm_args *na, fusedrope_cache *emu, const fusedrope_cache *cache,
                            int *flag, int backward, fusedrope_dtype dt, int64_t T, int64_t H,
                            int64_t D, void *x, void *y, void *w, float *rstd)
{
    *emu = *cache;
    emu->inv_freq_dev = emu->inv_freq;
    emu->pair_map_dev = emu->pair_map;
    emu->range_flag = emu->range_flag_dev = flag;
    memset(na, 0, sizeof *na);
    na->a.cache = emu;
    na->a.sgn = backward ? -1.0f : 1.0f;
    na->a.dtype = dt;
    na->a.seq_len = T;
    na->a.batch = 1;
    na->a.pos.seq_len = T;
    na->a.pos.cp_size = 1;
    na->a.pos.num_axes = 1;
    na->a.pos.ids_rows = 1;
    na->a.count = 1;
    na->a.io[0].in = x;
    na->a.io[0].out = y;
    na->a.io[0].heads = H;
    na->a.io[0].head_dim = D;
    na->a.io[0].in_ss = na->a.io[0].out_ss = H * D;
    na->a.io[0].in_sh = na->a.io[0].out_sh = D;
    na->w[0] = w;
    na->wdtype = dt;
    na->weight = FUSEDROPE_NORM_WEIGHT;
    na->eps = 1e-6f;
    na->rstd[0] = rstd;
    if (backward) {
        na->x[0] = x;
        na->x_ss[0] = H * D;
        na->x_sh[0] = D;
    }
}

START_TEST(test_device_and_cu_seqlens)
{
    enum { T = 8, D = 64 };
    static const int32_t cu_ok[3] = { 0, 4, 8 }, cu_long[3] = { 0, 4, 12 }, cu_neg[3] = { -2, 4, 8 },
                         cu_back[4] = { 0, 6, 2, 8 };
    const int backward = _i >= 3, bf16 = _i % 3 != 0;
    const fusedrope_dtype dt = bf16 ? FUSEDROPE_BFLOAT16 : FUSEDROPE_FLOAT32;
    const size_t es = bf16 ? 2 : 4, bytes = (size_t)(T * heads[0] * D) * es;
    unsigned char *x = alloc64(bytes), *y = alloc64(bytes), *w = alloc64((size_t)D * es);
    float *rstd = alloc64((size_t)(T * heads[0]) * sizeof(float)), dwz[D];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache, emu;
    fr_norm_args na;
    int flag = 0;

    for (size_t i = 0; i < bytes; i++)
        x[i] = (unsigned char)(i * 37 % 61 + (i % es == es - 1 ? 0x3c : 0)); /* finite values */
    for (int c = 0; c < D; c++)
        if (bf16)
            ((uint16_t *)w)[c] = fusedrope_float_to_bf16(1.0f + (float)c / D);
        else
            ((float *)w)[c] = 1.0f + (float)c / D;
    for (int i = 0; i < T * heads[0]; i++)
        rstd[i] = 0.5f;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, M, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    one_tensor_args(&na, &emu, cache, &flag, backward, dt, T, heads[0], D, x, y, w, rstd);
    na.a.pos.cu_seqlens = cu_ok;
    na.a.pos.num_seqs = 2;
    na.rounding = FUSEDROPE_NORM_ROUND_LLAMA;
    if (backward) {
        for (int c = 0; c < D; c++)
            dwz[c] = 7.0f;
        na.dw_zero[0] = dwz; /* an empty k's dw, which a refused call leaves */
        na.dw_zero_n[0] = D;
    }
    fr_emu_norm_warp = _i % 3 == 2; /* the forward's third: rows over a warp */
    fr_emu_norm_bwd_heads = 0;
#define RUN() (backward ? fr_emu_cuda_norm_backward(&na) : fr_emu_cuda_norm_forward(&na))

    memset(y, 0xa5, bytes);
    emu.cuda_device = 1;
    ck_assert_int_eq(RUN(), FUSEDROPE_ERR_INVALID);
    ck_assert_msg(strstr(fusedrope_last_error(), "created on CUDA device 1 but device 0 is current"),
                  "%s", fusedrope_last_error());
    for (size_t i = 0; i < bytes; i++)
        ck_assert_uint_eq(y[i], 0xa5);
    for (int c = 0; c < D && backward; c++)
        ck_assert(dwz[c] == 7.0f);
    ck_assert_int_eq(flag, 0);
    emu.cuda_device = 0;

    ck_assert_int_eq(RUN(), FUSEDROPE_OK);
    ck_assert_msg(flag == 0, "call %d: good cu_seqlens raised the flag", _i);
    na.a.pos.cu_seqlens = cu_long;
    ck_assert_int_eq(RUN(), FUSEDROPE_OK);
    ck_assert_msg(flag == 1, "call %d: cu_seqlens ending past the tokens left the flag down", _i);
    flag = 0;
    na.a.pos.cu_seqlens = cu_neg;
    ck_assert_int_eq(RUN(), FUSEDROPE_OK);
    ck_assert_msg(flag == 1, "call %d: cu_seqlens starting at -2 left the flag down", _i);
    flag = 0;
    na.a.pos.cu_seqlens = cu_back;
    na.a.pos.num_seqs = 3;
    ck_assert_int_eq(RUN(), FUSEDROPE_OK);
    ck_assert_msg(flag == 1, "call %d: cu_seqlens decreasing from 6 to 2 left the flag down", _i);
#undef RUN
    fr_emu_norm_warp = -1;
    fusedrope_cache_destroy(cache);
    free(x);
    free(y);
    free(w);
    free(rstd);
}
END_TEST

/* Device positions on a cache with position axes (SECTIONS {8, 12, 12}):
 * a token inside the table on axis 0 but past it on axis 1 (M + 4 of M rows)
 * or below it on axis 2 (-1) is as bad as one past it on axis 0: NaN in its
 * rows (forward: y; backward: dx) and the flag up; the other tokens finite
 * and the flag down when every axis is inside (the kernels' angle check
 * once tested axis 0 alone with every test passing: a mutation run).
 * _i: forward / backward, each over the row kernel and the warp kernel. */
START_TEST(test_axes_device_positions)
{
    enum { T = 4, D = 64, H = 2 };
    static const int64_t ids_ok[3 * T] = { 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3 };
    static const int64_t ids_past[3 * T] = { 0, 1, 2, 3, 0, 1, M + 4, 3, 0, 1, 2, 3 };
    static const int64_t ids_below[3 * T] = { 0, 1, 2, 3, 0, 1, 2, 3, 0, -1, 2, 3 };
    const int backward = _i >= 2;
    float *x = alloc64(sizeof(float) * T * H * D), *y = alloc64(sizeof(float) * T * H * D);
    float *w = alloc64(sizeof(float) * D), *rstd = alloc64(sizeof(float) * T * H);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache, emu;
    fr_norm_args na;
    int flag = 0;

    for (int i = 0; i < T * H * D; i++)
        x[i] = 0.25f + (float)(i % 7) / 8.0f;
    for (int c = 0; c < D; c++)
        w[c] = 1.0f + (float)c / D;
    for (int i = 0; i < T * H; i++)
        rstd[i] = 0.5f;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, M, 10000.0);
    cfg.axes = FUSEDROPE_AXES_SECTIONS;
    cfg.sections[0] = 8;
    cfg.sections[1] = cfg.sections[2] = 12;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    ck_assert_int_eq(cache->num_axes, 3);
    one_tensor_args(&na, &emu, cache, &flag, backward, FUSEDROPE_FLOAT32, T, H, D, x, y, w,
                    rstd);
    na.a.pos.num_axes = cache->num_axes;
    na.a.pos.ids_rows = 3;
    na.a.pos.ids_row_stride = T;
    na.rounding = FUSEDROPE_NORM_ROUND_ONCE;
    fr_emu_norm_warp = _i % 2;
    fr_emu_norm_bwd_heads = 0;
    for (int run = 0; run < 3; run++) {
        const int64_t *ids = run == 0 ? ids_ok : run == 1 ? ids_past : ids_below;
        const int bad_token = run == 0 ? -1 : run == 1 ? 2 : 1;
        na.a.pos.ids = ids;
        flag = 0;
        ck_assert_int_eq(backward ? fr_emu_cuda_norm_backward(&na) : fr_emu_cuda_norm_forward(&na),
                         FUSEDROPE_OK);
        ck_assert_msg(flag == (run > 0), "call %d, run %d: the range flag is %d", _i, run, flag);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < H * D; c++)
                CHECK(!isnan(y[t * H * D + c]) == (t != bad_token),
                      "call %d, run %d: token %d channel %d is %g", _i, run, t, c,
                      (double)y[t * H * D + c]);
    }
    fr_emu_norm_warp = -1;
    fusedrope_cache_destroy(cache);
    free(x);
    free(y);
    free(w);
    free(rstd);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("norm_kernel_emu");
    TCase *tc = tcase_create("norm_kernel_emu");

    make_ids();
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_out_of_table_positions, 0, NCASES * VARIANTS);
    tcase_add_loop_test(tc, test_out_of_table_range_status, 0, NCASES * 4);
    tcase_add_loop_test(tc, test_device_and_cu_seqlens, 0, 6);
    tcase_add_loop_test(tc, test_axes_device_positions, 0, 4);
    tcase_add_loop_test(tc, test_random_device_positions, 0, NRANDOM);
    suite_add_tcase(s, tc);
    return tu_main(s, "test_norm_kernel_emu");
}
