/*
 * test_cpu_rows.c - the OpenMP backend's AVX2/F16C rotations of 16-bit heads
 * (lib/cpu_avx2.c) against the portable path's arithmetic: rope_math.h's
 * converters around fr_rotate.  Every non-NaN result must be identical to
 * the bit; a NaN result must be NaN (which input NaN an operation passes on
 * is the compiler's operand order, on either path).
 *
 *   - every value: each of the 65536 values of each 16-bit type as the a and
 *     as the b member of a pair, against random and special cos/sin, both
 *     signs (forward, backward), both styles (two rows, interleaved pairs),
 *     plain and non-temporal stores, a length with a scalar tail;
 *   - rounding: a = 1, b = 0, sin = 0 makes the rotated a equal to cos, so
 *     cos carries every float whose dropped low bits (13 for fp16, 16 for
 *     bf16) are one of the patterns that decide rounding, for every value
 *     of the other bits, plus fresh random floats: the narrowing of each;
 *   - whole calls: both styles, forward and backward, in place and out of
 *     place, partial rotary, odd sizes, rot_dim 2050 (the portable path in
 *     pieces), outputs large enough to be streamed (the AVX2 rotation then
 *     writes straight to memory), a streamed q+k call in bshd, on random
 *     data salted with NaN, Inf, subnormals and values that overflow: the
 *     output bytes with the AVX2 rotations equal the output bytes through
 *     the portable path.
 * Skipped (exit 77) where the library has no AVX2 code (not x86-64); on an
 * x86-64 CPU without AVX2/F16C the first two return at once and both paths
 * of the calls test are the portable ones, and the test says so.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedrope.h"
#include "internal.h"
#include "util.h"

#ifdef FR_HAVE_AVX2



static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t ref_narrow_f16(float f) { return fr_float_to_half(f); }
static uint16_t ref_narrow_bf16(float f) { return fr_float_to_bf16(f); }
static float ref_widen_f16(uint16_t h) { return fr_half_to_float(h); }
static float ref_widen_bf16(uint16_t h) { return fr_bf16_to_float(h); }

typedef void (*rows_fn)(const uint16_t *, const uint16_t *, uint16_t *, uint16_t *,
                        const float *, const float *, int64_t, float, int);
typedef void (*pairs_fn)(const uint16_t *, uint16_t *, const float *, const float *, int64_t,
                         float, int);

/* One 16-bit type: its AVX2 rotations, its portable converters, its layout. */
typedef struct {
    const char *name;
    fusedrope_dtype dt;
    rows_fn rows;
    pairs_fn pairs;
    float (*ref_widen)(uint16_t);
    uint16_t (*ref_narrow)(float);
    int dropped;        /* float bits a normal value loses */
    uint16_t exp_mask;  /* all-ones exponent: Inf or NaN */
    uint16_t one;       /* 1.0 */
} row_type;

static const row_type types[2] = {
    { "fp16", FUSEDROPE_FLOAT16, fr_avx2_rotate_f16, fr_avx2_rotate_pairs_f16, ref_widen_f16,
      ref_narrow_f16, 13, 0x7c00, 0x3c00 },
    { "bf16", FUSEDROPE_BFLOAT16, fr_avx2_rotate_bf16, fr_avx2_rotate_pairs_bf16,
      ref_widen_bf16, ref_narrow_bf16, 16, 0x7f80, 0x3f80 },
};

static int is_nan16(const row_type *t, uint16_t h)
{
    return (h & t->exp_mask) == t->exp_mask && (h & ~t->exp_mask & 0x7fffu) != 0;
}

/* The rule: the same bits, or NaN on both sides. */
static int same16(const row_type *t, uint16_t got, uint16_t want)
{
    return got == want || (is_nan16(t, got) && is_nan16(t, want));
}

/* The portable path's result for one pair. */
static void portable_pair(const row_type *t, uint16_t a, uint16_t b, float c, float s,
                          float sgn, uint16_t *ya, uint16_t *yb)
{
    float ra, rb;
    fr_rotate(t->ref_widen(a), t->ref_widen(b), c, s, sgn, &ra, &rb);
    *ya = t->ref_narrow(ra);
    *yb = t->ref_narrow(rb);
}

/* m pairs (xa[i], xb[i]) through the AVX2 rotation of a style, into ya/yb
 * (poisoned first); inter: interleaved pairs, through the scratch x2/y2 of
 * 2m values. */
static void avx2_rotate(const row_type *t, int inter, const uint16_t *xa, const uint16_t *xb,
                        uint16_t *ya, uint16_t *yb, const float *cs, const float *sn, int64_t m,
                        float sgn, int nt, uint16_t *x2, uint16_t *y2)
{
    memset(ya, 0xa5, (size_t)m * 2);
    memset(yb, 0xa5, (size_t)m * 2);
    if (!inter) {
        t->rows(xa, xb, ya, yb, cs, sn, m, sgn, nt);
    } else {
        memset(y2, 0xa5, (size_t)m * 4);
        for (int64_t i = 0; i < m; i++) {
            x2[2 * i] = xa[i];
            x2[2 * i + 1] = xb[i];
        }
        t->pairs(x2, y2, cs, sn, m, sgn, nt);
        for (int64_t i = 0; i < m; i++) {
            ya[i] = y2[2 * i];
            yb[i] = y2[2 * i + 1];
        }
    }
    __builtin_ia32_sfence(); /* after non-temporal stores */
}

/* Every pair's result against portable_pair; `what` names the case. */
static void check_pairs(const row_type *t, const char *what, const uint16_t *xa,
                        const uint16_t *xb, const uint16_t *ya, const uint16_t *yb,
                        const float *cs, const float *sn, int64_t m, float sgn)
{
    for (int64_t i = 0; i < m; i++) {
        uint16_t wa, wb;
        portable_pair(t, xa[i], xb[i], cs[i], sn[i], sgn, &wa, &wb);
        if (!same16(t, ya[i], wa) || !same16(t, yb[i], wb)) /* (a ck_assert per value is slow) */
            ck_abort_msg("%s %s pair %lld: (0x%04x, 0x%04x) by cos 0x%08x sin 0x%08x sgn %g: "
                         "AVX2 (0x%04x, 0x%04x), portable (0x%04x, 0x%04x)",
                         t->name, what, (long long)i, xa[i], xb[i], bits(cs[i]), bits(sn[i]),
                         (double)sgn, ya[i], yb[i], wa, wb);
    }
}

START_TEST(test_every_value)
{
    const row_type *t = &types[_i];
    enum { M = 65536 + 5 }; /* every value, and a scalar tail */
    uint16_t *v = malloc(M * 2), *r = malloc(M * 2), *ya = malloc(M * 2), *yb = malloc(M * 2),
             *x2 = malloc(M * 4), *y2 = malloc(M * 4);
    float *cs = malloc(M * sizeof *cs), *sn = malloc(M * sizeof *sn);
    uint64_t st = tu_seed ^ 0xa11;
    if (!fr_avx2_usable()) /* the rotations would raise SIGILL; the calls test still runs */
        goto out;
    ck_assert(v && r && ya && yb && x2 && y2 && cs && sn);
    for (int64_t i = 0; i < M; i++) {
        /* cos/sin: random in (-1.5, 1.5) (attention factors above 1), with
         * exact 1, 0, -0 and -1 salted in */
        static const float special[] = { 1.0f, 0.0f, -0.0f, -1.0f };
        const uint64_t q = ref_splitmix(&st);
        v[i] = (uint16_t)i;
        r[i] = (uint16_t)(q >> 8);
        cs[i] = q % 11 == 0 ? special[(q >> 40) & 3] : (float)((double)(q >> 11) * 0x1p-53 * 3.0 - 1.5);
        sn[i] = q % 13 == 0 ? special[(q >> 44) & 3] : (float)((double)(ref_splitmix(&st) >> 11) * 0x1p-53 * 3.0 - 1.5);
    }
    for (int inter = 0; inter < 2; inter++)
        for (int nt = 0; nt < 2; nt++)
            for (int neg = 0; neg < 2; neg++)
                for (int as_b = 0; as_b < 2; as_b++) {
                    const float sgn = neg ? -1.0f : 1.0f;
                    const uint16_t *xa = as_b ? r : v, *xb = as_b ? v : r;
                    char what[64];
                    snprintf(what, sizeof what, "%s, %s stores, every value as %s",
                             inter ? "interleaved" : "rows", nt ? "non-temporal" : "plain",
                             as_b ? "b" : "a");
                    avx2_rotate(t, inter, xa, xb, ya, yb, cs, sn, M, sgn, nt, x2, y2);
                    check_pairs(t, what, xa, xb, ya, yb, cs, sn, M, sgn);
                }
out:
    free(v); free(r); free(ya); free(yb); free(x2); free(y2); free(cs); free(sn);
}
END_TEST

START_TEST(test_narrow_rounding_patterns)
{
    const row_type *t = &types[_i];
    const uint32_t half = 1u << (t->dropped - 1), all = (1u << t->dropped) - 1;
    /* the dropped bits: zero, one ulp, just under/at/over the halfway point,
     * all ones, and one random pattern */
    const uint32_t low[6] = { 0, 1, half - 1, half, half + 1, all };
    enum { NLOW = 7, BLOCK = 2048, M = BLOCK * NLOW };
    const uint32_t nhigh = 1u << (32 - t->dropped);
    float *cs = malloc(M * sizeof *cs), *sn = calloc(M, sizeof *sn);
    uint16_t *xa = malloc(M * 2), *xb = calloc(M, 2), *ya = malloc(M * 2), *yb = malloc(M * 2),
             *x2 = malloc(M * 4), *y2 = malloc(M * 4);
    uint64_t s = tu_seed;
    if (!fr_avx2_usable())
        goto out;
    ck_assert(cs && sn && xa && xb && ya && yb && x2 && y2);
    for (int64_t i = 0; i < M; i++)
        xa[i] = t->one; /* a' = 1 * cos - 0 * sin: the narrowing of cos */
    for (int inter = 0; inter < 2; inter++) {
        for (uint32_t hi0 = 0; hi0 < nhigh; hi0 += BLOCK) {
            int64_t n = 0;
            for (uint32_t hi = hi0; hi < hi0 + BLOCK; hi++)
                for (int k = 0; k < NLOW; k++)
                    cs[n++] = from_bits(hi << t->dropped |
                                        (k < NLOW - 1 ? low[k] : (uint32_t)ref_splitmix(&s) & all));
            avx2_rotate(t, inter, xa, xb, ya, yb, cs, sn, M, 1.0f, 0, x2, y2);
            check_pairs(t, inter ? "interleaved, rounding" : "rows, rounding", xa, xb, ya, yb,
                        cs, sn, M, 1.0f);
        }
        /* random floats, in a length that leaves a scalar tail */
        for (int64_t i = 0; i < M; i++)
            cs[i] = from_bits((uint32_t)ref_splitmix(&s));
        avx2_rotate(t, inter, xa, xb, ya, yb, cs, sn, M - 5, 1.0f, 0, x2, y2);
        check_pairs(t, "random floats", xa, xb, ya, yb, cs, sn, M - 5, 1.0f);
    }
out:
    free(cs); free(sn); free(xa); free(xb); free(ya); free(yb); free(x2); free(y2);
}
END_TEST

/* 16-bit values with the type's specials salted in: +-Inf, quiet and
 * signalling NaNs of both signs, the smallest subnormals, the largest
 * finite values, zeros. */
static void fill(const row_type *t, uint16_t *x, int64_t n, uint64_t *s)
{
    const uint16_t e = t->exp_mask;
    const uint16_t special[] = { e, (uint16_t)(0x8000u | e), (uint16_t)(e | (e >> 1 & ~e)),
                                 (uint16_t)(0x8000u | e | 1u), (uint16_t)(e | 1u), 0x0001,
                                 0x8001, (uint16_t)(e - 1u), (uint16_t)(0x8000u | (e - 1u)),
                                 0x0000, 0x8000 };
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = ref_splitmix(s);
        x[i] = r % 17 == 0 ? special[(r >> 8) % (sizeof special / sizeof special[0])]
                           : (uint16_t)(r >> 16);
    }
}

START_TEST(test_calls_match_portable)
{
    /* sbhd [S, B, H, D], rot_dim R: odd sizes, pass-through channels, and
     * rot_dims (42, 26) that are no multiple of 16, so the scalar tails run
     * too; rot_dim 2050, which the portable path takes in pieces; and 5 MiB
     * outputs, over the 4 MiB from which the backend streams its output:
     * straight from the rotation (rot_dim 128, 96 with pass-through channels,
     * interleaved 104 with a scalar tail) or through the row buffer (NeoX
     * 104: a half of 52 elements is no multiple of 16 bytes) */
    static const struct { int64_t s, b, h, d, r; } shapes[] = {
        { 7, 3, 5, 128, 128 },  { 9, 2, 3, 96, 42 },    { 33, 1, 2, 64, 64 },
        { 5, 4, 1, 30, 26 },    { 3, 2, 2, 2050, 2050 }, { 320, 4, 16, 128, 128 },
        { 320, 4, 16, 128, 96 }, { 320, 4, 16, 128, 104 },
    };
    const row_type *t = &types[_i];
    uint64_t st = tu_seed ^ 0x5eed;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t S = shapes[k].s, B = shapes[k].b, H = shapes[k].h, D = shapes[k].d,
                      R = shapes[k].r, n = S * B * H * D;
        fusedrope_cache_config cfg;
        fusedrope_cache *c;
        uint16_t *x = malloc((size_t)n * 2), *y[2] = { malloc((size_t)n * 2), malloc((size_t)n * 2) };
        ck_assert(x && y[0] && y[1]);
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)R, S, 10000.0);
        ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c), FUSEDROPE_OK);
        fill(t, x, n, &st);
        for (int style = 0; style < 2; style++)
            for (int op = 0; op < 2; op++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    for (int off = 0; off < 2; off++) {
                        fusedrope_tensor tin, tout;
                        fusedrope_status rc;
                        __atomic_store_n(&fr_avx2_off, off, __ATOMIC_RELAXED);
                        memset(y[off], 0xa5, (size_t)n * 2);
                        if (in_place)
                            memcpy(y[off], x, (size_t)n * 2);
                        tin = fusedrope_tensor_sbhd(in_place ? y[off] : x, t->dt, S, B, H, D);
                        tout = fusedrope_tensor_sbhd(y[off], t->dt, S, B, H, D);
                        rc = op ? fusedrope_backward(c, (fusedrope_style)style, NULL, &tin, &tout, NULL)
                                : fusedrope_forward(c, (fusedrope_style)style, NULL, &tin, &tout, NULL);
                        ck_assert_int_eq(rc, FUSEDROPE_OK);
                    }
                    __atomic_store_n(&fr_avx2_off, 0, __ATOMIC_RELAXED);
                    for (int64_t i = 0; i < n; i++)
                        if (!same16(t, y[0][i], y[1][i]))
                            ck_abort_msg("%s shape %zu style %d op %d in place %d element %lld: "
                                         "AVX2 0x%04x, portable 0x%04x (input 0x%04x)",
                                         t->name, k, style, op, in_place, (long long)i, y[0][i],
                                         y[1][i], x[i]);
                }
        fusedrope_cache_destroy(c);
        free(x);
        free(y[0]);
        free(y[1]);
    }
}
END_TEST

/* A q+k call in bshd, q and k with different head counts in buffers of
 * their own, each over the 4 MiB from which the backend streams (the two
 * tensors are judged apart), with pass-through channels. */
START_TEST(test_qk_streamed_matches_portable)
{
    enum { B = 4, S = 640, HQ = 16, HK = 8, D = 128, R = 96 };
    const row_type *t = &types[_i];
    const int64_t nq = (int64_t)B * S * HQ * D, nk = (int64_t)B * S * HK * D;
    uint16_t *q = malloc((size_t)nq * 2), *k = malloc((size_t)nk * 2),
             *yq[2] = { malloc((size_t)nq * 2), malloc((size_t)nq * 2) },
             *yk[2] = { malloc((size_t)nk * 2), malloc((size_t)nk * 2) };
    uint64_t st = tu_seed ^ 0x9c;
    fusedrope_cache_config cfg;
    fusedrope_cache *c;
    ck_assert(q && k && yq[0] && yq[1] && yk[0] && yk[1]);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, R, S, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c), FUSEDROPE_OK);
    fill(t, q, nq, &st);
    fill(t, k, nk, &st);
    for (int style = 0; style < 2; style++)
        for (int op = 0; op < 2; op++) {
            for (int off = 0; off < 2; off++) {
                fusedrope_tensor qi = fusedrope_tensor_bshd(q, t->dt, B, S, HQ, D),
                                 qo = fusedrope_tensor_bshd(yq[off], t->dt, B, S, HQ, D),
                                 ki = fusedrope_tensor_bshd(k, t->dt, B, S, HK, D),
                                 ko = fusedrope_tensor_bshd(yk[off], t->dt, B, S, HK, D);
                fusedrope_status rc;
                __atomic_store_n(&fr_avx2_off, off, __ATOMIC_RELAXED);
                memset(yq[off], 0xa5, (size_t)nq * 2);
                memset(yk[off], 0xa5, (size_t)nk * 2);
                rc = op ? fusedrope_backward_qk(c, (fusedrope_style)style, NULL, &qi, &qo, &ki, &ko, NULL)
                        : fusedrope_forward_qk(c, (fusedrope_style)style, NULL, &qi, &qo, &ki, &ko, NULL);
                ck_assert_int_eq(rc, FUSEDROPE_OK);
            }
            __atomic_store_n(&fr_avx2_off, 0, __ATOMIC_RELAXED);
            for (int64_t i = 0; i < nq + nk; i++) {
                const uint16_t a = i < nq ? yq[0][i] : yk[0][i - nq],
                               p = i < nq ? yq[1][i] : yk[1][i - nq];
                if (!same16(t, a, p))
                    ck_abort_msg("%s q+k style %d op %d %s element %lld: AVX2 0x%04x, portable 0x%04x",
                                 t->name, style, op, i < nq ? "q" : "k",
                                 (long long)(i < nq ? i : i - nq), a, p);
            }
        }
    fusedrope_cache_destroy(c);
    free(q); free(k); free(yq[0]); free(yq[1]); free(yk[0]); free(yk[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu_rows");
    TCase *tc = tcase_create("cpu_rows");

    printf("test_cpu_rows: %s\n",
           fr_avx2_usable() ? "AVX2 and F16C in use"
                            : "this CPU lacks AVX2 or F16C: both paths are the portable ones");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_every_value, 0, 2);
    tcase_add_loop_test(tc, test_narrow_rounding_patterns, 0, 2);
    tcase_add_loop_test(tc, test_calls_match_portable, 0, 2);
    tcase_add_loop_test(tc, test_qk_streamed_matches_portable, 0, 2);
    suite_add_tcase(s, tc);
    return tu_main(s, "test_cpu_rows");
}

#else /* FR_HAVE_AVX2 */

int main(void)
{
    printf("test_cpu_rows: the library has no AVX2 code on this architecture, skipping\n");
    return 77;
}

#endif
