/*
 * test_f16c.c - the OpenMP backend's F16C row conversions (lib/cpu_f16c.c)
 * against rope_math.h's portable converters, and fp16 forward/backward with
 * and without them.
 *
 *   - widen: every one of the 65536 halves; bit-identical, except that a
 *     signalling NaN may come back quiet (same sign, still a NaN);
 *   - narrow: every float whose low 13 bits (those a half drops) are one of
 *     the patterns that decide rounding, for every value of the other 19
 *     bits, plus fresh random floats; bit-identical, NaNs included;
 *   - whole calls: fp16, both styles, in place and out of place, partial
 *     rotary, on random data salted with NaN, Inf, subnormals and values
 *     that overflow binary16: the output bytes with F16C equal the output
 *     bytes through the portable converters.
 * Skipped (exit 77) where the library has no F16C code (not x86-64); on an
 * x86-64 CPU without F16C both paths are the portable converters, and the
 * test says so.
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

#ifdef FR_HAVE_F16C

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

START_TEST(test_widen_every_half)
{
    uint16_t *h = malloc(65536 * sizeof *h);
    float *f = malloc(65536 * sizeof *f);
    ck_assert(h && f);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    fr_f16c_widen(h, f, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        const uint32_t want = bits(fr_half_to_float(h[i])), got = bits(f[i]);
        if ((i & 0x7c00u) == 0x7c00u && (i & 0x3ffu)) { /* NaN: may be quieted */
            if (!((got & 0x7f800000u) == 0x7f800000u && (got & 0x7fffffu) &&
                  (got >> 31) == (want >> 31)))
                ck_abort_msg("half 0x%04x: 0x%08x is not the NaN 0x%08x", i, got, want);
        } else if (got != want) {
            ck_abort_msg("half 0x%04x: F16C 0x%08x, portable 0x%08x", i, got, want);
        }
    }
    free(h);
    free(f);
}
END_TEST

START_TEST(test_narrow_rounding_patterns)
{
    /* the dropped bits: zero, ulp, just under/at/over the halfway point, all
     * ones, and one random pattern per block */
    static const uint32_t low[] = { 0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff };
    enum { NLOW = sizeof low / sizeof low[0] + 1, BLOCK = 4096 };
    float *f = malloc(BLOCK * NLOW * sizeof *f);
    uint16_t *h = malloc(BLOCK * NLOW * sizeof *h);
    uint64_t s = seed;
    ck_assert(f && h);
    for (uint32_t hi0 = 0; hi0 < (1u << 19); hi0 += BLOCK) {
        int64_t n = 0;
        for (uint32_t hi = hi0; hi < hi0 + BLOCK; hi++)
            for (int k = 0; k < NLOW; k++)
                f[n++] = from_bits(hi << 13 | (k < NLOW - 1 ? low[k] : (uint32_t)next(&s) & 0x1fffu));
        fr_f16c_narrow(f, h, n);
        for (int64_t i = 0; i < n; i++)
            if (h[i] != fr_float_to_half(f[i])) /* (a ck_assert per value would be slow) */
                ck_abort_msg("float 0x%08x: F16C 0x%04x, portable 0x%04x", bits(f[i]), h[i],
                             fr_float_to_half(f[i]));
    }
    /* random floats, in a length that leaves a tail for the scalar loop */
    for (int64_t i = 0; i < BLOCK * NLOW - 5; i++)
        f[i] = from_bits((uint32_t)next(&s));
    fr_f16c_narrow(f, h, BLOCK * NLOW - 5);
    for (int64_t i = 0; i < BLOCK * NLOW - 5; i++)
        if (h[i] != fr_float_to_half(f[i]))
            ck_abort_msg("float 0x%08x: F16C 0x%04x, portable 0x%04x", bits(f[i]), h[i],
                         fr_float_to_half(f[i]));
    free(f);
    free(h);
}
END_TEST

/* fp16 values with the specials salted in */
static void fill(uint16_t *x, int64_t n, uint64_t *s)
{
    static const uint16_t special[] = { 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7d55, 0x0001,
                                        0x83ff, 0x7bff, 0xfbff, 0x0000, 0x8000 };
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = next(s);
        x[i] = r % 17 == 0 ? special[(r >> 8) % (sizeof special / sizeof special[0])]
                           : (uint16_t)(r >> 16);
    }
}

START_TEST(test_calls_match_portable)
{
    /* sbhd [S, B, H, D], rot_dim R: odd sizes, pass-through channels, and
     * rot_dims (42, 26) that are no multiple of 8, so the conversions' scalar
     * tails run too */
    static const struct { int64_t s, b, h, d, r; } shapes[] = {
        { 7, 3, 5, 128, 128 }, { 9, 2, 3, 96, 42 }, { 33, 1, 2, 64, 64 }, { 5, 4, 1, 30, 26 },
    };
    uint64_t st = seed ^ 0x5eed;
    if (!fr_f16c_usable())
        printf("test_f16c: this CPU has no F16C; both paths are the portable converters\n");
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t S = shapes[k].s, B = shapes[k].b, H = shapes[k].h, D = shapes[k].d,
                      R = shapes[k].r, n = S * B * H * D;
        fusedrope_cache_config cfg;
        fusedrope_cache *c;
        uint16_t *x = malloc((size_t)n * 2), *y[2] = { malloc((size_t)n * 2), malloc((size_t)n * 2) };
        ck_assert(x && y[0] && y[1]);
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)R, S, 10000.0);
        ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c), FUSEDROPE_OK);
        fill(x, n, &st);
        for (int style = 0; style < 2; style++)
            for (int op = 0; op < 2; op++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    for (int off = 0; off < 2; off++) {
                        fusedrope_tensor tin, tout;
                        fusedrope_status rc;
                        __atomic_store_n(&fr_f16c_off, off, __ATOMIC_RELAXED);
                        memset(y[off], 0xa5, (size_t)n * 2);
                        if (in_place)
                            memcpy(y[off], x, (size_t)n * 2);
                        tin = fusedrope_tensor_sbhd(in_place ? y[off] : x, FUSEDROPE_FLOAT16, S, B,
                                                    H, D);
                        tout = fusedrope_tensor_sbhd(y[off], FUSEDROPE_FLOAT16, S, B, H, D);
                        rc = op ? fusedrope_backward(c, (fusedrope_style)style, NULL, &tin, &tout, NULL)
                                : fusedrope_forward(c, (fusedrope_style)style, NULL, &tin, &tout, NULL);
                        ck_assert_int_eq(rc, FUSEDROPE_OK);
                    }
                    __atomic_store_n(&fr_f16c_off, 0, __ATOMIC_RELAXED);
                    for (int64_t i = 0; i < n; i++)
                        if (y[0][i] != y[1][i])
                            ck_abort_msg("shape %zu style %d op %d in place %d element %lld: "
                                         "F16C 0x%04x, portable 0x%04x (input 0x%04x)",
                                         k, style, op, in_place, (long long)i, y[0][i], y[1][i],
                                         x[i]);
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
    Suite *s = suite_create("f16c");
    TCase *tc = tcase_create("f16c");
    SRunner *sr;
    int failed;

    seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_f16c: seed %llu (F16C %s)\n", (unsigned long long)seed,
           fr_f16c_usable() ? "in use" : "absent");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_widen_every_half);
    tcase_add_test(tc, test_narrow_rounding_patterns);
    tcase_add_test(tc, test_calls_match_portable);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#else /* FR_HAVE_F16C */

int main(void)
{
    printf("test_f16c: the library has no F16C code on this architecture, skipping\n");
    return 77;
}

#endif
