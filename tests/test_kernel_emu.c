/*
 * test_kernel_emu.c - what only the CUDA kernels do, run on the CPU through
 * the host build of kernels/cuda_apply.cu (kernels/cuda_emu.h): positions
 * that live on the device are checked by the kernels, not on the host, so a
 * token without a position in the table gets NaN in its rotated channels
 * and raises the cache's range flag (DESIGN.md, errors; fusedrope_forward(3)).
 *
 * Each case calls the emulated backend directly with device-style positions
 * (ids past the table or negative, offsets that run past it, cu_seqlens
 * that leave tokens outside every sequence, end past the last token or
 * decrease between its ends), in
 * every dtype, both styles, in and out of place, on the vector and the
 * scalar paths and under two launch shapes (132 SMs: a head per thread;
 * 1 SM: several heads per thread where the call is large enough, the NeoX
 * lanes' narrow and wide head groups), and checks every element:
 *   - a token without a position: NaN in each rotated channel of each head;
 *     the pass-through channels copied (out of place) or untouched (in
 *     place); the flag raised;
 *   - every other token: the bytes the CPU backend writes for it.
 * Each case runs again with a per-call pos->range_status word, which must
 * be raised instead of the cache's flag.  96 random cases do the same over
 * random shapes and device positions (invalid cu_seqlens among them), each
 * token's fate from the test reference's position model
 * (test_random_device_positions).  Further tests: two calls with two
 * words each report their own; the host-side rules on the word (alignment,
 * no overlap, never written on a CPU cache); a cache of another device.
 * The same for caches with position axes (multimodal rope): ids rows whose
 * axis-1 or axis-2 position is outside the table, or negative with a table,
 * make that token NaN and raise the flag; a table-less cache with axes takes
 * negative positions, raising nothing, with the CPU backend's values.
 * On a GPU, tests/test_cuda makes such checks for bfloat16 on the vector
 * path.
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

fusedrope_status fr_emu_cuda_apply(const fr_apply_args *a);
extern int fr_emu_sms; /* kernels/cuda_emu_sms.cc */
extern int fr_emu_neox_wide; /* kernels/cuda_apply.cu */

enum { R = 64, M = 32 }; /* rot_dim, table rows */

static const fusedrope_dtype dtypes[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                           FUSEDROPE_BFLOAT16 };

/* One case: tensor [S, B, H, D] in sbhd order, element stride `pad` between
 * heads (D or D + 1: the latter makes the call take the scalar path). */
typedef struct {
    int64_t S, B, H, D, pad;
    fusedrope_dtype dt;
    int interleaved, in_place, backward;
    fr_pos_args pos;
    const int *bad; /* per token, at b * S + s (the order of ids): no position */
    /* position axes: the layout (NONE: 1D rope) and its sections; rows 0
     * gives a table of M rows, 1 none (table-less) */
    fusedrope_axes axes;
    int sections[FUSEDROPE_MAX_AXES];
    int tableless;
    int flag;       /* the flag the kernel must leave: 1 raised, 0 not */
    /* an invalid cu_seqlens (test_random_device_positions): which tokens
     * the kernels place where is their search's, so only the flag, the
     * padding and the pass-through channels are checked */
    int garbage;
} kcase;

/* Random values in [-2, 2), rounded to the dtype; seed from tu_seed, which
 * tu_main prints and FUSEDROPE_TEST_SEED sets. */
static void fill(unsigned char *x, size_t n, fusedrope_dtype dt, uint64_t seed)
{
    tu_rng r;
    tu_rng_init(&r, seed);
    tu_fill(x, (int64_t)n, dt, &r, -2.0, 2.0);
}

static fr_apply_args make_args(const kcase *k, const fusedrope_cache *cache, const void *x,
                               void *y)
{
    fr_apply_args a;
    memset(&a, 0, sizeof a);
    a.cache = cache;
    a.sgn = k->backward ? -1.0f : 1.0f;
    a.interleaved = k->interleaved;
    a.dtype = k->dt;
    a.seq_len = k->S;
    a.batch = k->B;
    a.pos = k->pos;
    a.pos.seq_len = k->S;
    a.count = 1;
    a.io[0].in = x;
    a.io[0].out = y;
    a.io[0].heads = k->H;
    a.io[0].head_dim = k->D;
    a.io[0].in_sh = a.io[0].out_sh = k->pad;
    a.io[0].in_sb = a.io[0].out_sb = k->H * k->pad;
    a.io[0].in_ss = a.io[0].out_ss = k->B * k->H * k->pad;
    a.io[0].in_place = x == y;
    return a;
}

static void run_case(const kcase *k, const char *name, uint64_t seed)
{
    const size_t es = ref_dtype_size(k->dt);
    const size_t n = (size_t)(k->S * k->B * k->H * k->pad), bytes = n * es;
    unsigned char *x = malloc(bytes), *y = malloc(bytes), *ref = malloc(bytes);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache, emu;
    int64_t ids[FUSEDROPE_MAX_AXES * 64];
    fr_pos_args good = k->pos;
    fr_apply_args a;
    int flag;
    int32_t word;

    ck_assert(x && y && ref && k->S * k->B <= 64);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, R, k->tableless ? 0 : M, 10000.0);
    cfg.axes = k->axes;
    memcpy(cfg.sections, k->sections, sizeof cfg.sections);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    ck_assert_int_eq(cache->negative_ok, k->tableless && k->axes != FUSEDROPE_AXES_NONE);
    fill(x, n, k->dt, seed);

    /* The reference: the CPU backend, with every position made explicit (a
     * row per axis) and a bad token's replaced by 0 on every axis. */
    good.seq_len = k->S;
    good.num_axes = cache->num_axes;
    good.negative_ok = cache->negative_ok;
    for (int64_t s = 0; s < k->S; s++)
        for (int64_t b = 0; b < k->B; b++) {
            const int64_t t = b * k->S + s, rows = k->S * k->B;
            int bad = 0;
            const int64_t p0 = fr_token_position(&good, b, s, &bad);
            for (int ax = 0; ax < cache->num_axes; ax++) {
                const int64_t p = fr_token_axis_position(&good, b, s, ax, p0, &bad);
                ids[ax * rows + t] = p;
                if (!k->tableless && p >= M)
                    bad = 1;
            }
            ck_assert_msg(k->garbage || bad == k->bad[t],
                          "%s: token %lld is %s, the case says otherwise", name, (long long)t,
                          bad ? "bad" : "good");
            for (int ax = 0; ax < cache->num_axes; ax++)
                if (bad)
                    ids[ax * rows + t] = 0;
        }
    memset(&good, 0, sizeof good);
    good.ids = ids;
    good.seq_len = k->S;
    good.cp_size = 1;
    good.num_axes = cache->num_axes;
    good.negative_ok = cache->negative_ok;
    good.ids_rows = cache->num_axes;
    good.ids_row_stride = k->S * k->B;
    memcpy(ref, x, bytes);
    a = make_args(k, cache, k->in_place ? ref : x, ref);
    a.pos = good;
    fr_cpu_apply(&a);

    /* shape: 132 or 1 SM; status: the call's range_status word instead of
     * the cache's flag (raised instead of it, the flag left alone); the
     * last run takes the wide NeoX kernel where the general one would run */
    for (int run = 0; run < 4; run++) {
        const int shape = run & 1, status = run >> 1;
        memcpy(y, x, bytes);
        if (!k->in_place)
            memset(y, 0xa5, bytes);
        emu = *cache;
        emu.inv_freq_dev = emu.inv_freq;
        emu.pair_map_dev = emu.pair_map;
        flag = 0;
        word = 0;
        emu.range_flag = emu.range_flag_dev = &flag;
        a = make_args(k, &emu, k->in_place ? y : x, y);
        a.range_status = status ? &word : NULL;
        fr_emu_sms = shape ? 1 : 132;
        fr_emu_neox_wide = run == 3;
        ck_assert_int_eq(fr_emu_cuda_apply(&a), FUSEDROPE_OK);
        if (status)
            ck_assert_msg(word == k->flag && flag == 0,
                          "%s: range_status is %d (want %d), the cache's flag %d (want 0)", name,
                          (int)word, k->flag, flag);
        else
            ck_assert_msg(flag == k->flag, "%s: the range flag is %d, not %d", name, flag,
                          k->flag);

        for (int64_t s = 0; s < k->S; s++)
            for (int64_t b = 0; b < k->B; b++)
                for (int64_t h = 0; h < k->H; h++)
                    for (int64_t c = 0; c < k->pad; c++) {
                        const size_t o = (size_t)(((s * k->B + b) * k->H + h) * k->pad + c) * es;
                        const int bad = k->bad[b * k->S + s];
                        if (c >= k->D) { /* between heads: never written */
                            const int same = k->in_place ? !memcmp(y + o, x + o, es)
                                                         : y[o] == 0xa5;
                            ck_assert_msg(same, "%s: padding written at s %lld b %lld h %lld",
                                          name, (long long)s, (long long)b, (long long)h);
                        } else if (k->garbage && c < R) {
                            continue; /* placed by the kernels' search */
                        } else if (bad && c < R) {
                            ck_assert_msg(isnan(ref_load(y + o, k->dt, 0)),
                                          "%s: token (s %lld, b %lld) head %lld channel %lld: "
                                          "not NaN", name, (long long)s, (long long)b,
                                          (long long)h, (long long)c);
                        } else if (memcmp(y + o, ref + o, es) != 0) {
                            ck_abort_msg("%s: token (s %lld, b %lld%s) head %lld channel %lld: "
                                         "the emulated kernel and the CPU backend differ", name,
                                         (long long)s, (long long)b, bad ? ", no position" : "",
                                         (long long)h, (long long)c);
                        }
                    }
    }
    fusedrope_cache_destroy(cache);
    free(x);
    free(y);
    free(ref);
}

/* _i: dtype x style x in place x backward x vector/scalar */
static void variant(kcase *k, int i)
{
    k->dt = dtypes[i % 3];
    i /= 3;
    k->interleaved = i % 2;
    i /= 2;
    k->in_place = i % 2;
    i /= 2;
    k->backward = i % 2;
    i /= 2;
    k->pad = k->D + (i % 2); /* an odd head stride: the scalar path */
}
#define VARIANTS (3 * 2 * 2 * 2 * 2)

/* The cases: a tensor, device-style positions, and which tokens (index
 * b * S + s, the order of ids) have no position in the table. */
static const int64_t ids_bad[18] = { 0, 1, 2, 3, 4, M, 6, 7, -1, 9, 10, 31, 12, M + 100, 14, 15,
                                     16, 17 }; /* (b 0, s 5) past, (1, 2) negative, (2, 1) far */
static const int64_t offsets_past[2] = { 3, M - 4 }; /* batch 1 leaves the table at s = 4 */
static const int64_t ids_many[64] = {
    0, 7, 14, M, 28, 3, 10, 17, 24, 31, 6, 13, 20, 27, 2, 9,
    16, -1, 30, 5, 12, 19, 26, 1, 8, 15, 22, 29, 4, 11, 18, 25,
    0, 7, 14, 21, 28, 3, 10, 17, M + 9, 31, 6, 13, 20, 27, 2, 9,
    16, 23, 30, 5, 12, 19, 26, 1, 8, 15, 22, 29, 4, 11, 18, 2 * M,
}; /* 64 tokens: 3 and 40 past the table, 17 negative, 63 far past */
static const int32_t cu_short[3] = { 0, 3, 7 };  /* tokens 7 and 8 of 9 in no sequence */
static const int32_t cu_long[3] = { 0, 4, 12 };  /* ends past the 9 tokens: only the flag */
/* 3 sequences whose second runs backwards (6 -> 2): every token still lands
 * in some sequence (0-5 in the first, 6-8 in the third), only the flag;
 * and one decrease among 40 steps (1 -> 0 at step 34; tokens 1-8 in
 * sequence 38), which some thread of each launch shape must find. */
static const int32_t cu_back[4] = { 0, 6, 2, 9 };
static int32_t cu_back_many[41];
static void make_cu_back_many(void)
{
    for (int i = 0; i <= 40; i++)
        cu_back_many[i] = i < 1 ? 0 : i < 39 ? 1 : 9;
    cu_back_many[35] = 0; /* 1 -> 0 at step 34 */
}
/* Three rows of ids 20 apart (a persistent buffer wider than the 18 tokens):
 * axis 0 always in the table; token 4 past it on axis 1, token 9 negative
 * on axis 2, token 16 far past it on axis 2 and negative on axis 1. */
static const int64_t ids_rows_bad[60] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 99, 99,
    3, 5, 7, 9, M, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 0, -2, 4, 99, 99,
    6, 5, 4, 3, 2, 1, 0, 31, 30, -1, 28, 27, 26, 25, 24, 23, M + 50, 21, 99, 99,
};
/* 64 tokens, dense rows: token 5 past the table on axis 1, 22 on axis 2,
 * 47 negative on axis 2, 60 past on both. */
static int64_t ids_rows_many[3 * 64];
static void make_ids_rows_many(void)
{
    for (int t = 0; t < 64; t++) {
        ids_rows_many[t] = (t * 7) % M;
        ids_rows_many[64 + t] = (t * 11 + 3) % M;
        ids_rows_many[128 + t] = (t * 5 + 1) % M;
    }
    ids_rows_many[64 + 5] = M;
    ids_rows_many[128 + 22] = M + 3;
    ids_rows_many[128 + 47] = -7;
    ids_rows_many[64 + 60] = 2 * M;
    ids_rows_many[128 + 60] = 3 * M;
}
/* Table-less: negative positions on every axis are valid. */
static const int64_t ids_rows_negative[3 * 12] = {
    -1, 0, 5, -300, 7, 1000000, -8, 9, 2, -11, 40, 3,
    -5, 2, -9, 12, -1000000, 3, 0, -1, 33, 8, -2, 1,
    4, -3, 0, -77, 6, -6, 123456789, -8, 9, 0, -1, -2,
};
static const int64_t offsets_negative[2] = { -5, -100 }; /* every axis below 0 */

static const struct {
    const char *name;
    int64_t S, B, H, D;
    const int64_t *ids, *offsets;
    const int32_t *cu;
    int bad[4]; /* the tokens without a position, -1 ends */
    /* position axes: layout, sections, ids rows and their stride (0: dense),
     * a table-less cache, and no flag expected */
    fusedrope_axes axes;
    int sections[FUSEDROPE_MAX_AXES];
    int ids_rows;
    int64_t ids_stride;
    int tableless, no_flag;
    int num_seqs; /* cu's sequences */
} cases[] = {
    { "ids outside the table", 6, 3, 5, 80, ids_bad, NULL, NULL, { 5, 8, 13, -1 }, FUSEDROPE_AXES_NONE, { 0, 0, 0, 0 }, 0, 0, 0, 0, 0 },
    { "offsets past the table", 6, 2, 3, 64, NULL, offsets_past, NULL, { 10, 11, -1 }, FUSEDROPE_AXES_NONE, { 0, 0, 0, 0 }, 0, 0, 0, 0, 0 },
    { "cu_seqlens short of the tokens", 9, 1, 4, 96, NULL, NULL, cu_short, { 7, 8, -1 }, FUSEDROPE_AXES_NONE, { 0, 0, 0, 0 }, 0, 0, 0, 0, 2 },
    { "cu_seqlens past the tokens", 9, 1, 2, 64, NULL, NULL, cu_long, { -1 }, FUSEDROPE_AXES_NONE, { 0, 0, 0, 0 }, 0, 0, 0, 0, 2 },
    { "cu_seqlens decreasing", 9, 1, 3, 64, NULL, NULL, cu_back, { -1 }, FUSEDROPE_AXES_NONE, { 0, 0, 0, 0 }, 0, 0, 0, 0, 3 },
    { "cu_seqlens decreasing at step 34 of 40", 9, 1, 2, 64, NULL, NULL, cu_back_many, { -1 }, FUSEDROPE_AXES_NONE, { 0, 0, 0, 0 }, 0, 0, 0, 0, 40 },
    /* enough heads and tokens that at 1 SM each thread takes several heads:
     * the general NeoX kernel's path for tokens without a position */
    { "ids outside the table, many heads", 16, 4, 40, 80, ids_many, NULL, NULL,
      { 3, 17, 40, 63 }, FUSEDROPE_AXES_NONE, { 0, 0, 0, 0 }, 0, 0, 0, 0, 0 },
    { "ids rows off the table on axes 1 and 2", 6, 3, 5, 80, ids_rows_bad, NULL, NULL,
      { 4, 9, 16, -1 }, FUSEDROPE_AXES_SECTIONS, { 8, 12, 12, 0 }, 3, 20, 0, 0, 0 },
    { "ids rows off the table, many heads", 16, 4, 40, 80, ids_rows_many, NULL, NULL,
      { 5, 22, 47, 60 }, FUSEDROPE_AXES_INTERLEAVED, { 12, 10, 10, 0 }, 3, 0, 0, 0, 0 },
    { "table-less axes, negative ids rows", 4, 3, 5, 72, ids_rows_negative, NULL, NULL,
      { -1 }, FUSEDROPE_AXES_ALTERNATING, { 12, 10, 10, 0 }, 3, 0, 1, 1, 0 },
    { "table-less axes, negative offsets", 6, 2, 3, 64, NULL, offsets_negative, NULL,
      { -1 }, FUSEDROPE_AXES_SECTIONS, { 8, 12, 12, 0 }, 0, 0, 1, 1, 0 },
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static void test_positions_the_kernels_check_body(int _i)
{
    const int c = _i / VARIANTS;
    int bad[64] = { 0 };
    kcase k;
    /* under valgrind a third: each setting of the other variants in one
     * dtype, the dtype turning (a fork runs the three dtypes of one: the
     * 528 cases forked one by one took 79 s there, half of it the forks) */
    if (tu_valgrind_skips(_i % 3 + _i / 3, 3))
        return;
    memset(&k, 0, sizeof k);
    k.S = cases[c].S;
    k.B = cases[c].B;
    k.H = cases[c].H;
    k.D = cases[c].D;
    k.pos.ids = cases[c].ids;
    k.pos.offsets = cases[c].offsets;
    k.pos.cu_seqlens = cases[c].cu;
    k.pos.num_seqs = cases[c].num_seqs;
    k.pos.cp_size = 1;
    for (int j = 0; j < 4 && cases[c].bad[j] >= 0; j++)
        bad[cases[c].bad[j]] = 1;
    k.bad = bad;
    k.axes = cases[c].axes;
    memcpy(k.sections, cases[c].sections, sizeof k.sections);
    k.tableless = cases[c].tableless;
    k.flag = !cases[c].no_flag;
    /* what check_positions (lib/apply.c) derives from the cache and pos */
    k.pos.num_axes = k.axes == FUSEDROPE_AXES_NONE ? 1 : 3;
    k.pos.negative_ok = k.tableless && k.axes != FUSEDROPE_AXES_NONE;
    k.pos.ids_rows = cases[c].ids_rows ? cases[c].ids_rows : 1;
    k.pos.ids_row_stride = cases[c].ids_stride ? cases[c].ids_stride : k.S * k.B;
    variant(&k, _i % VARIANTS);
    run_case(&k, cases[c].name, tu_seed + 1000 * (uint64_t)c + (uint64_t)_i);
}
TU_GROUPED_TEST(test_positions_the_kernels_check, 3)

/* ------------------------------------------ random device-side positions */

/*
 * Random calls with device-style positions nobody checked: ids (a row, or a
 * row per axis with a stride wider than the tokens), offsets (near the ends
 * of int64 too, where s + offset passes them) or cu_seqlens (a valid split,
 * sequences longer than the table; the right ends with a decrease inside; or
 * anything: entries out of range, ends that are not 0 and the tokens), over random
 * shapes and the variants.  Which tokens are bad comes from the test
 * reference's position model (tu_bad_tokens: tests/ref.c's
 * ref_axis_positions, a position negative or past the table's M rows on
 * some axis); a call with a bad token or an invalid cu_seqlens raises the
 * flag.  The run and checks are run_case's (an invalid cu_seqlens: the
 * flag, the padding and the pass-through channels; ASan and valgrind watch
 * every read the kernels make of the arrays).
 */
enum { NRANDOM = 96 };

static void test_random_device_positions_body(int _i)
{
    static const int64_t dims[4] = { 64, 72, 80, 96 };
    int64_t ids[FUSEDROPE_MAX_AXES * 80], offsets[4];
    int32_t cu[8];
    int bad[64] = { 0 };
    char name[160];
    kcase k;
    fusedrope_positions P; /* the same positions, for the reference's model */
    tu_rng r;
    int mode;

    /* under valgrind a fifth (_i 0, 5, 10, ...: every mode, _i % 4) */
    if (tu_valgrind_skips(_i, 5))
        return;
    tu_rng_init(&r, tu_seed * 7919 + 31 + (uint64_t)_i);
    memset(&k, 0, sizeof k);
    mode = _i % 4; /* 0 ids, 1 offsets, 2 cu_seqlens, 3 ids rows per axis */
    k.D = dims[tu_int(&r, 0, 3)];
    k.B = mode == 2 ? 1 : tu_int(&r, 1, 4);
    k.S = mode == 2 ? tu_int(&r, 1, 48) : tu_int(&r, 1, 16);
    /* several heads a thread at 1 SM where the call is large enough */
    k.H = tu_int(&r, 0, 3) == 0 && k.S * k.B <= 16 ? 40 : tu_int(&r, 1, 6);
    k.pos.cp_size = 1;
    k.pos.num_axes = 1;
    k.pos.ids_rows = 1;
    k.pos.ids_row_stride = k.S * k.B;
    k.axes = FUSEDROPE_AXES_NONE;
    fusedrope_positions_init(&P);
    if (mode == 0 || mode == 3) {
        const int rows = mode == 3 ? 3 : 1;
        const int64_t stride = k.S * k.B + tu_int(&r, 0, 3);
        for (int64_t i = 0; i < rows * stride; i++)
            ids[i] = i % stride < k.S * k.B ? tu_position(&r, M) : -777; /* never read */
        k.pos.ids = P.ids = ids;
        P.ids_axes = rows;
        P.ids_axis_stride = stride;
        if (mode == 3) {
            static const int sections[FUSEDROPE_MAX_AXES] = { 8, 12, 12, 0 };
            k.axes = FUSEDROPE_AXES_SECTIONS;
            memcpy(k.sections, sections, sizeof k.sections);
            k.pos.num_axes = 3;
            k.pos.ids_rows = 3;
            k.pos.ids_row_stride = stride;
        }
    } else if (mode == 1) {
        for (int64_t b = 0; b < k.B; b++)
            offsets[b] = tu_offset(&r, M, k.S);
        k.pos.offsets = P.offsets = offsets;
    } else {
        const int n = (int)tu_int(&r, 1, 6);
        k.garbage = !tu_cu_seqlens(&r, cu, n, k.S);
        k.pos.cu_seqlens = P.cu_seqlens = cu;
        k.pos.num_seqs = P.num_seqs = n;
    }
    k.bad = bad;
    k.flag = k.garbage || tu_bad_tokens(&P, mode == 3 ? 3 : 1, k.S, k.B, M, bad);
    variant(&k, (int)tu_int(&r, 0, VARIANTS - 1));
    snprintf(name, sizeof name, "random case %d (%s, [%lld, %lld, %lld, %lld] pad %lld, %s%s)", _i,
             mode == 0 ? "ids" : mode == 1 ? "offsets" : mode == 2 ? "cu_seqlens" : "ids rows",
             (long long)k.S, (long long)k.B, (long long)k.H, (long long)k.D, (long long)k.pad,
             ref_dtype_name(k.dt), k.garbage ? ", invalid cu_seqlens" : "");
    run_case(&k, name, tu_seed + 77000 + (uint64_t)_i);
}
TU_GROUPED_TEST(test_random_device_positions, 4)

/* ---------------------------------------------------- range_status words */

/* One emulated call of a [4, 1, 2, 64] float tensor at ids, raising `word`
 * (or the cache's flag when NULL). */
static void status_call(const fusedrope_cache *cache, int *flag, const int64_t *ids,
                        int32_t *word, const float *x, float *y)
{
    fusedrope_cache emu = *cache;
    kcase k;
    fr_apply_args a;
    memset(&k, 0, sizeof k);
    k.S = 4;
    k.B = 1;
    k.H = 2;
    k.D = k.pad = R;
    k.dt = FUSEDROPE_FLOAT32;
    k.pos.ids = ids;
    k.pos.cp_size = 1;
    emu.inv_freq_dev = emu.inv_freq;
    emu.range_flag = emu.range_flag_dev = flag;
    a = make_args(&k, &emu, x, y);
    a.range_status = word;
    ck_assert_int_eq(fr_emu_cuda_apply(&a), FUSEDROPE_OK);
}

/* Two calls, two words (as on two streams): each word reports only its own
 * call's positions; the library never clears a word nor writes anything but
 * 1; the cache's flag stays clear throughout. */
START_TEST(test_range_status_per_call)
{
    static const int64_t good[4] = { 0, 5, 31, 2 }, bad[4] = { 0, M, 3, 1 };
    float x[4 * 2 * R], y[4 * 2 * R];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    int flag = 0;
    int32_t w1 = 0, w2 = 0;

    fill((unsigned char *)x, 4 * 2 * R, FUSEDROPE_FLOAT32, tu_seed);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, R, M, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);

    status_call(cache, &flag, bad, &w1, x, y);
    status_call(cache, &flag, good, &w2, x, y);
    ck_assert_int_eq(w1, 1);
    ck_assert_int_eq(w2, 0);
    ck_assert_int_eq(flag, 0);

    /* the other way round; a raised word stays raised after a good call */
    status_call(cache, &flag, good, &w1, x, y);
    status_call(cache, &flag, bad, &w2, x, y);
    ck_assert_int_eq(w1, 1);
    ck_assert_int_eq(w2, 1);
    ck_assert_int_eq(flag, 0);

    /* a word the caller set to another value is left as it is by a good call */
    w1 = 7;
    status_call(cache, &flag, good, &w1, x, y);
    ck_assert_int_eq(w1, 7);

    /* without a word, the cache's flag again */
    status_call(cache, &flag, bad, NULL, x, y);
    ck_assert_int_eq(flag, 1);
    fusedrope_cache_destroy(cache);
}
END_TEST

/* The host-side rules on pos->range_status, through the public API on a CPU
 * cache: 4-byte aligned, no byte shared with a tensor or a position array;
 * a CPU call reports range errors in its status and never writes the word. */
START_TEST(test_range_status_rules)
{
    enum { S = 4, H = 2 };
    static float x[S * H * R + 4], y[S * H * R + 4];
    int64_t ids[S + 1] = { 0, 1, 2, 3, 0 };
    int32_t words[2] = { 5, 5 };
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_positions pos;
    fusedrope_tensor tx, ty;

    fill((unsigned char *)x, S * H * R, FUSEDROPE_FLOAT32, tu_seed);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, R, M, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, S, 1, H, R);
    ty = fusedrope_tensor_sbhd(y, FUSEDROPE_FLOAT32, S, 1, H, R);
    fusedrope_positions_init(&pos);
    pos.ids = ids;

    pos.range_status = &words[0];
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                     FUSEDROPE_OK);
    ck_assert_int_eq(words[0], 5);
    ids[2] = M; /* out of the table: the status says so, the word is not written */
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                     FUSEDROPE_ERR_RANGE);
    ck_assert_int_eq(words[0], 5);
    ids[2] = 2;

    pos.range_status = (int32_t *)((char *)words + 2);
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_msg(strstr(fusedrope_last_error(), "not 4-byte aligned"), "%s",
                  fusedrope_last_error());

    static const struct { const char *where; size_t idx; int in_x, in_ids; } inside[] = {
        { "the output tensor", 0, 0, 0 },
        { "the output tensor", S * H * R - 1, 0, 0 },
        { "the input tensor", 17, 1, 0 },
        { "pos->ids", 0, 0, 1 },
    };
    for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++) {
        pos.range_status = inside[i].in_ids ? (int32_t *)&ids[S - 1]
                           : inside[i].in_x ? (int32_t *)&x[inside[i].idx]
                                            : (int32_t *)&y[inside[i].idx];
        ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(), inside[i].where), "%s: %s",
                      inside[i].where, fusedrope_last_error());
    }
    /* just past the output and past ids: accepted */
    pos.range_status = (int32_t *)&y[S * H * R];
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                     FUSEDROPE_OK);
    pos.range_status = (int32_t *)&ids[S];
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                     FUSEDROPE_OK);
    /* in place: the word inside the one tensor is refused as well */
    pos.range_status = (int32_t *)&y[3];
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &ty, &ty, NULL),
                     FUSEDROPE_ERR_INVALID);
    {
        /* inside pos->offsets (either half of an entry) and inside
         * pos->cu_seqlens (its last entry): refused, the array named,
         * nothing written; just past each array: accepted */
        int64_t off[3] = { 1, 2, 0 };
        int32_t cu[4] = { 0, 1, S, 0 };
        const int64_t off_keep[3] = { 1, 2, 0 };
        const int32_t cu_keep[4] = { 0, 1, S, 0 };
        unsigned char ysnap[sizeof y];
        memset(y, 0xa5, sizeof y);
        memcpy(ysnap, y, sizeof y);
        fusedrope_positions_init(&pos);
        pos.offsets = off; /* batch 1: one entry */
        for (int half = 0; half < 2; half++) {
            pos.range_status = (int32_t *)&off[0] + half;
            ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                             FUSEDROPE_ERR_INVALID);
            ck_assert_msg(strstr(fusedrope_last_error(), "lies inside pos->offsets"),
                          "word in offsets[0], half %d: %s", half, fusedrope_last_error());
        }
        pos.cu_seqlens = cu; /* two sequences: offsets has an entry each */
        pos.num_seqs = 2;
        pos.range_status = (int32_t *)&off[1];
        ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(), "lies inside pos->offsets"),
                      "word in offsets[1] of a THD call: %s", fusedrope_last_error());
        pos.offsets = NULL;
        pos.range_status = &cu[2]; /* cu_seqlens[num_seqs] */
        ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(), "lies inside pos->cu_seqlens"),
                      "word in cu_seqlens[2]: %s", fusedrope_last_error());
        ck_assert_msg(memcmp(y, ysnap, sizeof y) == 0, "a refused call wrote the output");
        ck_assert(memcmp(off, off_keep, sizeof off) == 0 && memcmp(cu, cu_keep, sizeof cu) == 0);
        pos.range_status = &cu[3];
        ck_assert_msg(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL) ==
                          FUSEDROPE_OK,
                      "word past cu_seqlens: %s", fusedrope_last_error());
        pos.offsets = off;
        pos.range_status = (int32_t *)&off[2];
        ck_assert_msg(fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL) ==
                          FUSEDROPE_OK,
                      "word past offsets: %s", fusedrope_last_error());
        ck_assert_int_eq(cu[3], 0);
        ck_assert_int_eq(off[2], 0);
    }
    fusedrope_cache_destroy(cache);
}
END_TEST

/* A cache of another device than the current one (the emulation's current
 * device is 0): refused, both devices named, nothing written. */
START_TEST(test_wrong_device_refused)
{
    enum { S = 3, H = 2, D = 64 };
    float x[S * H * D], y[S * H * D];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache, emu;
    kcase k;
    fr_apply_args a;
    int flag = 0;

    memset(&k, 0, sizeof k);
    k.S = S;
    k.B = 1;
    k.H = H;
    k.D = D;
    k.pad = D;
    k.dt = FUSEDROPE_FLOAT32;
    k.pos.cp_size = 1;
    fill((unsigned char *)x, S * H * D, FUSEDROPE_FLOAT32, tu_seed);
    memset(y, 0xa5, sizeof y);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, M, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    emu = *cache;
    emu.inv_freq_dev = emu.inv_freq;
    emu.range_flag = emu.range_flag_dev = &flag;
    emu.cuda_device = 1;
    a = make_args(&k, &emu, x, y);
    ck_assert_int_eq(fr_emu_cuda_apply(&a), FUSEDROPE_ERR_INVALID);
    ck_assert_msg(strstr(fusedrope_last_error(),
                         "created on CUDA device 1 but device 0 is current") != NULL,
                  "%s", fusedrope_last_error());
    for (size_t i = 0; i < sizeof y; i++)
        ck_assert_uint_eq(((unsigned char *)y)[i], 0xa5);
    ck_assert_int_eq(flag, 0);

    emu.cuda_device = 0; /* the same call on the right device runs */
    ck_assert_int_eq(fr_emu_cuda_apply(&a), FUSEDROPE_OK);
    ck_assert(memcmp(x, y, sizeof y) != 0);
    fusedrope_cache_destroy(cache);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernel_emu");
    TCase *tc = tcase_create("kernel_emu");

    make_ids_rows_many();
    make_cu_back_many();
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_positions_the_kernels_check, 0, NCASES * VARIANTS / 3);
    tcase_add_loop_test(tc, test_random_device_positions, 0, NRANDOM / 4);
    tcase_add_test(tc, test_wrong_device_refused);
    tcase_add_test(tc, test_range_status_per_call);
    tcase_add_test(tc, test_range_status_rules);
    suite_add_tcase(s, tc);
    return tu_main(s, "test_kernel_emu");
}
