/*
 * test_cpu_rows.c - the OpenMP backend's AVX2/F16C row conversions
 * (lib/cpu_avx2.c) against rope_math.h's portable converters, and fp16 and
 * bf16 forward/backward calls with and without them.
 *
 *   - widen: every one of the 65536 values of each 16-bit type; bit-identical,
 *     except that F16C may return a signalling half NaN quiet (same sign,
 *     still a NaN);
 *   - narrow: every float whose dropped low bits (13 for fp16, 16 for bf16)
 *     are one of the patterns that decide rounding, for every value of the
 *     other bits, plus fresh random floats; bit-identical, NaNs included;
 *   - whole calls: both styles, forward and backward, in place and out of
 *     place, partial rotary, odd sizes, on random data salted with NaN, Inf,
 *     subnormals and values that overflow: the output bytes with the AVX2
 *     rows equal the output bytes through the portable converters.
 * Skipped (exit 77) where the library has no AVX2 code (not x86-64); on an
 * x86-64 CPU without AVX2/F16C the row tests return at once and both paths
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
#include <time.h>

#include "fusedrope.h"
#include "internal.h"

#ifdef FR_HAVE_AVX2

static uint64_t seed;

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

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

/* One 16-bit type: its rows, its portable converters, its layout. */
typedef struct {
    const char *name;
    fusedrope_dtype dt;
    void (*widen)(const uint16_t *, float *, int64_t);
    void (*narrow)(const float *, uint16_t *, int64_t);
    float (*ref_widen)(uint16_t);
    uint16_t (*ref_narrow)(float);
    int dropped;        /* float bits a normal value loses */
    uint16_t exp_mask;  /* all-ones exponent: Inf or NaN */
} row_type;

static const row_type types[2] = {
    { "fp16", FUSEDROPE_FLOAT16, fr_avx2_widen_f16, fr_avx2_narrow_f16, ref_widen_f16,
      ref_narrow_f16, 13, 0x7c00 },
    { "bf16", FUSEDROPE_BFLOAT16, fr_avx2_widen_bf16, fr_avx2_narrow_bf16, ref_widen_bf16,
      ref_narrow_bf16, 16, 0x7f80 },
};

START_TEST(test_widen_every_value)
{
    const row_type *t = &types[_i];
    if (!fr_avx2_usable()) /* the rows would raise SIGILL; the calls test still runs */
        return;
    uint16_t *h = malloc(65536 * sizeof *h);
    float *f = malloc(65536 * sizeof *f);
    ck_assert(h && f);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    t->widen(h, f, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        const uint32_t want = bits(t->ref_widen(h[i])), got = bits(f[i]);
        const int nan = (i & t->exp_mask) == t->exp_mask && (i & ~t->exp_mask & 0x7fffu);
        if (nan) { /* may come back quiet */
            if (!((got & 0x7f800000u) == 0x7f800000u && (got & 0x7fffffu) &&
                  (got >> 31) == (want >> 31)))
                ck_abort_msg("%s 0x%04x: 0x%08x is not the NaN 0x%08x", t->name, i, got, want);
        } else if (got != want) { /* (a ck_assert per value would be slow) */
            ck_abort_msg("%s 0x%04x: AVX2 0x%08x, portable 0x%08x", t->name, i, got, want);
        }
    }
    free(h);
    free(f);
}
END_TEST

START_TEST(test_narrow_rounding_patterns)
{
    const row_type *t = &types[_i];
    if (!fr_avx2_usable()) /* the rows would raise SIGILL; the calls test still runs */
        return;
    const uint32_t half = 1u << (t->dropped - 1), all = (1u << t->dropped) - 1;
    /* the dropped bits: zero, one ulp, just under/at/over the halfway point,
     * all ones, and one random pattern */
    const uint32_t low[6] = { 0, 1, half - 1, half, half + 1, all };
    enum { NLOW = 7, BLOCK = 2048 };
    const uint32_t nhigh = 1u << (32 - t->dropped);
    float *f = malloc(BLOCK * NLOW * sizeof *f);
    uint16_t *h = malloc(BLOCK * NLOW * sizeof *h);
    uint64_t s = seed;
    ck_assert(f && h);
    for (uint32_t hi0 = 0; hi0 < nhigh; hi0 += BLOCK) {
        int64_t n = 0;
        for (uint32_t hi = hi0; hi < hi0 + BLOCK; hi++)
            for (int k = 0; k < NLOW; k++)
                f[n++] = from_bits(hi << t->dropped |
                                   (k < NLOW - 1 ? low[k] : (uint32_t)next(&s) & all));
        t->narrow(f, h, n);
        for (int64_t i = 0; i < n; i++)
            if (h[i] != t->ref_narrow(f[i]))
                ck_abort_msg("%s from float 0x%08x: AVX2 0x%04x, portable 0x%04x", t->name,
                             bits(f[i]), h[i], t->ref_narrow(f[i]));
    }
    /* random floats, in a length that leaves a tail for the scalar loop */
    for (int64_t i = 0; i < BLOCK * NLOW - 5; i++)
        f[i] = from_bits((uint32_t)next(&s));
    t->narrow(f, h, BLOCK * NLOW - 5);
    for (int64_t i = 0; i < BLOCK * NLOW - 5; i++)
        if (h[i] != t->ref_narrow(f[i]))
            ck_abort_msg("%s from float 0x%08x: AVX2 0x%04x, portable 0x%04x", t->name,
                         bits(f[i]), h[i], t->ref_narrow(f[i]));
    free(f);
    free(h);
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
        const uint64_t r = next(s);
        x[i] = r % 17 == 0 ? special[(r >> 8) % (sizeof special / sizeof special[0])]
                           : (uint16_t)(r >> 16);
    }
}

START_TEST(test_calls_match_portable)
{
    /* sbhd [S, B, H, D], rot_dim R: odd sizes, pass-through channels, and
     * rot_dims (42, 26) that are no multiple of 16, so the conversions'
     * scalar tails run too */
    static const struct { int64_t s, b, h, d, r; } shapes[] = {
        { 7, 3, 5, 128, 128 }, { 9, 2, 3, 96, 42 }, { 33, 1, 2, 64, 64 }, { 5, 4, 1, 30, 26 },
    };
    const row_type *t = &types[_i];
    uint64_t st = seed ^ 0x5eed;
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
                        if (y[0][i] != y[1][i])
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

int main(void)
{
    Suite *s = suite_create("cpu_rows");
    TCase *tc = tcase_create("cpu_rows");
    SRunner *sr;
    int failed;

    seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_cpu_rows: seed %llu (%s)\n", (unsigned long long)seed,
           fr_avx2_usable() ? "AVX2 and F16C in use"
                            : "this CPU lacks AVX2 or F16C: both paths are the portable ones");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_widen_every_value, 0, 2);
    tcase_add_loop_test(tc, test_narrow_rounding_patterns, 0, 2);
    tcase_add_loop_test(tc, test_calls_match_portable, 0, 2);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#else /* FR_HAVE_AVX2 */

int main(void)
{
    printf("test_cpu_rows: the library has no AVX2 code on this architecture, skipping\n");
    return 77;
}

#endif
