/*
 * test_cpu_rows.c - the OpenMP backend's AVX2/F16C rotations of 16-bit heads
 * (lib/cpu_avx2.c) and its AVX-512 ones (lib/cpu_avx512.c) against the
 * portable path's arithmetic: rope_math.h's converters around fr_rotate.
 * Every non-NaN result must be identical to the bit; a NaN result must be
 * NaN (which input NaN an operation passes on is the compiler's operand
 * order, on either path).  The first four tests run for each of the two
 * files' functions:
 *
 *   - every value: each of the 65536 values of each 16-bit type as the a and
 *     as the b member of a pair, against random and special cos/sin, both
 *     signs (forward, backward), both styles (two rows, interleaved pairs),
 *     plain and non-temporal stores, a length with a scalar tail;
 *   - rounding: a = 1, b = 0, sin = 0 makes the rotated a equal to cos, so
 *     cos carries every float whose dropped low bits (13 for fp16, 16 for
 *     bf16) are one of the patterns that decide rounding, for every value
 *     of the other bits, plus fresh random floats: the narrowing of each;
 *   - steps: heads whose cos/sin come in 8-pair steps from anywhere (an
 *     axes table's rows), every head length 0..40 and some up to 256,
 *     both styles, plain, in-place and non-temporal stores;
 *   - heads: AVX-512's runs of heads sharing cos/sin, with gaps between
 *     the heads, plain, in-place and non-temporal stores;
 *   - tails: every length 0..33 and some over 127, plain and non-temporal
 *     stores, outputs at each 16-byte offset in a 64-byte line (the AVX-512
 *     functions' masked first step that aligns long streamed rows), rows 16
 *     bytes out of step with each other, in place: every result, and
 *     nothing written outside the output;
 *   - whole calls: both styles, forward and backward, in place and out of
 *     place, partial rotary, odd sizes, rot_dim 2050 (the portable path in
 *     pieces), outputs large enough to be streamed (the AVX2 rotation then
 *     writes straight to memory), a streamed q+k call in bshd, on random
 *     data salted with NaN, Inf, subnormals and values that overflow: the
 *     output bytes with the AVX2 rotations equal the output bytes through
 *     the portable path, and with the AVX-512 rotations equal those with
 *     AVX2 alone (fr_avx512_off).
 * Skipped (exit 77) where the library has no AVX2 code (not x86-64); on an
 * x86-64 CPU without AVX2/F16C (AVX-512 F/BW/VL) the first four return at
 * once for those functions, the calls test compares the paths the CPU has,
 * and the test says so.
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

/* The library's portable converters, not the reference: this file holds the
 * vector rows to the portable rows bit for bit; the converters are tied to
 * tests/ref.c exhaustively by test_helpers, and the rotation to the float64
 * reference by test_apply. */
static uint16_t portable_narrow_f16(float f) { return fr_float_to_half(f); }
static uint16_t portable_narrow_bf16(float f) { return fr_float_to_bf16(f); }
static float portable_widen_f16(uint16_t h) { return fr_half_to_float(h); }
static float portable_widen_bf16(uint16_t h) { return fr_bf16_to_float(h); }

typedef void (*rows_fn)(const uint16_t *, const uint16_t *, uint16_t *, uint16_t *,
                        const float *, const float *, int64_t, float, int);
typedef void (*pairs_fn)(const uint16_t *, uint16_t *, const float *, const float *, int64_t,
                         float, int);
typedef void (*steps_fn)(const uint16_t *, uint16_t *, int64_t, int, const float *const *,
                         const float *const *, float, int);

/* One 16-bit type: its portable converters, its layout. */
typedef struct {
    const char *name;
    fusedrope_dtype dt;
    float (*ref_widen)(uint16_t);
    uint16_t (*ref_narrow)(float);
    int dropped;        /* float bits a normal value loses */
    uint16_t exp_mask;  /* all-ones exponent: Inf or NaN */
    uint16_t one;       /* 1.0 */
} row_type;

static const row_type types[2] = {
    { "fp16", FUSEDROPE_FLOAT16, portable_widen_f16, portable_narrow_f16, 13, 0x7c00, 0x3c00 },
    { "bf16", FUSEDROPE_BFLOAT16, portable_widen_bf16, portable_narrow_bf16, 16, 0x7f80, 0x3f80 },
};

/* One file's rotations: whether the CPU runs them, each type's functions
 * (types' order). */
typedef struct {
    const char *name;
    int (*usable)(void);
    rows_fn rows[2];
    pairs_fn pairs[2];
    steps_fn steps[2];
} impl;

static const impl impls[2] = {
    { "AVX2", fr_avx2_usable, { fr_avx2_rotate_f16, fr_avx2_rotate_bf16 },
      { fr_avx2_rotate_pairs_f16, fr_avx2_rotate_pairs_bf16 },
      { fr_avx2_rotate_steps_f16, fr_avx2_rotate_steps_bf16 } },
    { "AVX-512", fr_avx512_usable, { fr_avx512_rotate_f16, fr_avx512_rotate_bf16 },
      { fr_avx512_rotate_pairs_f16, fr_avx512_rotate_pairs_bf16 },
      { fr_avx512_rotate_steps_f16, fr_avx512_rotate_steps_bf16 } },
};

/* The loop tests' index: type _i % 2 of impl _i / 2. */
#define TYPE_OF(i) (&types[(i) % 2])
#define IMPL_OF(i) (&impls[(i) / 2])

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

/* m pairs (xa[i], xb[i]) through v's rotation of a style, into ya/yb
 * (poisoned first); inter: interleaved pairs, through the scratch x2/y2 of
 * 2m values. */
static void vec_rotate(const row_type *t, const impl *v, int inter, const uint16_t *xa,
                       const uint16_t *xb, uint16_t *ya, uint16_t *yb, const float *cs,
                       const float *sn, int64_t m, float sgn, int nt, uint16_t *x2, uint16_t *y2)
{
    memset(ya, 0xa5, (size_t)m * 2);
    memset(yb, 0xa5, (size_t)m * 2);
    if (!inter) {
        v->rows[t - types](xa, xb, ya, yb, cs, sn, m, sgn, nt);
    } else {
        memset(y2, 0xa5, (size_t)m * 4);
        for (int64_t i = 0; i < m; i++) {
            x2[2 * i] = xa[i];
            x2[2 * i + 1] = xb[i];
        }
        v->pairs[t - types](x2, y2, cs, sn, m, sgn, nt);
        for (int64_t i = 0; i < m; i++) {
            ya[i] = y2[2 * i];
            yb[i] = y2[2 * i + 1];
        }
    }
    __builtin_ia32_sfence(); /* after non-temporal stores */
}

/* Every pair's result against portable_pair; `what` names the case. */
static void check_pairs(const row_type *t, const impl *v, const char *what, const uint16_t *xa,
                        const uint16_t *xb, const uint16_t *ya, const uint16_t *yb,
                        const float *cs, const float *sn, int64_t m, float sgn)
{
    for (int64_t i = 0; i < m; i++) {
        uint16_t wa, wb;
        portable_pair(t, xa[i], xb[i], cs[i], sn[i], sgn, &wa, &wb);
        if (!same16(t, ya[i], wa) || !same16(t, yb[i], wb)) /* (a ck_assert per value is slow) */
            ck_abort_msg("%s %s pair %lld: (0x%04x, 0x%04x) by cos 0x%08x sin 0x%08x sgn %g: "
                         "%s (0x%04x, 0x%04x), portable (0x%04x, 0x%04x)",
                         t->name, what, (long long)i, xa[i], xb[i], bits(cs[i]), bits(sn[i]),
                         (double)sgn, v->name, ya[i], yb[i], wa, wb);
    }
}

START_TEST(test_every_value)
{
    const row_type *t = TYPE_OF(_i);
    const impl *vi = IMPL_OF(_i);
    enum { M = 65536 + 5 }; /* every value, and a scalar tail */
    uint16_t *v = malloc(M * 2), *r = malloc(M * 2), *ya = malloc(M * 2), *yb = malloc(M * 2),
             *x2 = malloc(M * 4), *y2 = malloc(M * 4);
    float *cs = malloc(M * sizeof *cs), *sn = malloc(M * sizeof *sn);
    uint64_t st = tu_seed ^ 0xa11;
    if (!vi->usable()) /* the rotations would raise SIGILL; the calls test still runs */
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
                    vec_rotate(t, vi, inter, xa, xb, ya, yb, cs, sn, M, sgn, nt, x2, y2);
                    check_pairs(t, vi, what, xa, xb, ya, yb, cs, sn, M, sgn);
                }
out:
    free(v); free(r); free(ya); free(yb); free(x2); free(y2); free(cs); free(sn);
}
END_TEST

START_TEST(test_narrow_rounding_patterns)
{
    const row_type *t = TYPE_OF(_i);
    const impl *vi = IMPL_OF(_i);
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
    if (!vi->usable())
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
            vec_rotate(t, vi, inter, xa, xb, ya, yb, cs, sn, M, 1.0f, 0, x2, y2);
            check_pairs(t, vi, inter ? "interleaved, rounding" : "rows, rounding", xa, xb, ya,
                        yb, cs, sn, M, 1.0f);
        }
        /* random floats, in a length that leaves a scalar tail */
        for (int64_t i = 0; i < M; i++)
            cs[i] = from_bits((uint32_t)ref_splitmix(&s));
        vec_rotate(t, vi, inter, xa, xb, ya, yb, cs, sn, M - 5, 1.0f, 0, x2, y2);
        check_pairs(t, vi, "random floats", xa, xb, ya, yb, cs, sn, M - 5, 1.0f);
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

/* Tails and alignments: m pairs (m = 0..33, and lengths around the 128 pairs
 * from which the AVX-512 rows align streamed stores first) of random data salted with
 * specials through v's rotation, the output (a row or interleaved pairs)
 * starting `oa` values past a 64-byte boundary, the second row `ob` past
 * one, inside poisoned guards; every result against the portable one, and
 * the guards untouched.  nt: non-temporal stores, the outputs then on 16
 * bytes (offsets multiples of 8 values), as the backend calls them. */
enum { TAIL_MAX = 160, TAIL_GUARD = 64, TAIL_SPAN = TAIL_GUARD + 2 * TAIL_MAX + 64 + TAIL_GUARD };

static void tail_case(const row_type *t, const impl *v, int inter, int nt, int in_place,
                      int64_t m, int oa, int ob, float sgn, uint64_t *st, uint16_t *ybuf,
                      uint16_t *ybuf2, uint16_t *xbuf, float *cs, float *sn)
{
    const int ti = (int)(t - types);
    uint16_t *ya = ybuf + TAIL_GUARD + oa, *yb = ybuf2 + TAIL_GUARD + ob;
    uint16_t xa[TAIL_MAX], xb[TAIL_MAX];
    fill(t, xa, m, st);
    fill(t, xb, m, st);
    for (int64_t i = 0; i < m; i++) {
        cs[i] = (float)((double)(ref_splitmix(st) >> 11) * 0x1p-53 * 3.0 - 1.5);
        sn[i] = (float)((double)(ref_splitmix(st) >> 11) * 0x1p-53 * 3.0 - 1.5);
    }
    memset(ybuf, 0xa5, TAIL_SPAN * 2);
    memset(ybuf2, 0xa5, TAIL_SPAN * 2);
    if (inter) {
        /* the pairs in ya, 2m values; x a copy of them elsewhere, or ya itself */
        uint16_t *x = in_place ? ya : xbuf + 3 + oa;
        for (int64_t i = 0; i < m; i++) {
            x[2 * i] = xa[i];
            x[2 * i + 1] = xb[i];
        }
        v->pairs[ti](x, ya, cs, sn, m, sgn, nt);
    } else {
        const uint16_t *x0 = xa, *x1 = xb;
        if (in_place) {
            memcpy(ya, xa, (size_t)m * 2);
            memcpy(yb, xb, (size_t)m * 2);
            x0 = ya;
            x1 = yb;
        }
        v->rows[ti](x0, x1, ya, yb, cs, sn, m, sgn, nt);
    }
    __builtin_ia32_sfence();
    for (int64_t i = 0; i < m; i++) {
        uint16_t wa, wb;
        const uint16_t ga = inter ? ya[2 * i] : ya[i], gb = inter ? ya[2 * i + 1] : yb[i];
        portable_pair(t, xa[i], xb[i], cs[i], sn[i], sgn, &wa, &wb);
        if (!same16(t, ga, wa) || !same16(t, gb, wb))
            ck_abort_msg("%s %s %s, %s stores%s, m %lld, offsets %d %d, pair %lld: (0x%04x, "
                         "0x%04x) by cos 0x%08x sin 0x%08x sgn %g: (0x%04x, 0x%04x), portable "
                         "(0x%04x, 0x%04x)",
                         v->name, t->name, inter ? "interleaved" : "rows",
                         nt ? "non-temporal" : "plain", in_place ? ", in place" : "",
                         (long long)m, oa, ob, (long long)i, xa[i], xb[i], bits(cs[i]),
                         bits(sn[i]), (double)sgn, ga, gb, wa, wb);
    }
    /* nothing outside the output: ya's m (rows) or 2m (pairs) values, yb's m */
    for (int k = 0; k < 2; k++) {
        const uint16_t *buf = k ? ybuf2 : ybuf, *out = k ? yb : ya;
        const int64_t len = k ? (inter ? 0 : m) : (inter ? 2 * m : m);
        for (int64_t j = 0; j < TAIL_SPAN; j++) {
            const int64_t rel = (buf + j) - out;
            if ((rel < 0 || rel >= len) && buf[j] != 0xa5a5)
                ck_abort_msg("%s %s %s, %s stores, m %lld, offsets %d %d: value %lld %s the "
                             "output written (0x%04x)",
                             v->name, t->name, inter ? "interleaved" : "rows",
                             nt ? "non-temporal" : "plain", (long long)m, oa, ob,
                             (long long)(rel < 0 ? -rel : rel - len + 1),
                             rel < 0 ? "before" : "after", buf[j]);
        }
    }
}

START_TEST(test_tails)
{
    const row_type *t = TYPE_OF(_i);
    const impl *vi = IMPL_OF(_i);
    static const int plain_off[] = { 0, 1, 3, 8, 13, 16, 24, 31 };
    const size_t bytes = (TAIL_SPAN * 2 + 63) / 64 * 64; /* aligned_alloc: a multiple */
    uint16_t *ybuf = aligned_alloc(64, bytes), *ybuf2 = aligned_alloc(64, bytes),
             *xbuf = aligned_alloc(64, bytes);
    float cs[TAIL_MAX], sn[TAIL_MAX];
    uint64_t st = tu_seed ^ 0x7a1;
    int64_t cases = 0;
    if (!vi->usable())
        goto out;
    ck_assert(ybuf && ybuf2 && xbuf);
    for (int inter = 0; inter < 2; inter++)
        for (int nt = 0; nt < 2; nt++)
            for (int in_place = 0; in_place < 2 - nt; in_place++)
                for (int64_t m = 0; m <= TAIL_MAX; m = m < 33 ? m + 1 : m < 127 ? 127 : m + 11)
                    for (int k = 0; k < 8; k++) {
                        /* nt: ya at each 16-byte step of a line, yb with it
                         * (k even) or 16 bytes out of step (k odd) */
                        const int oa = nt ? 8 * (k / 2) : plain_off[k];
                        const int ob = nt ? (oa + 8 * (k & 1)) % 32 : plain_off[(k + 3) % 8];
                        tail_case(t, vi, inter, nt, in_place, m, oa, ob, m & 1 ? -1.0f : 1.0f,
                                  &st, ybuf, ybuf2, xbuf, cs, sn);
                        cases++;
                    }
    ck_assert_int_eq(cases, 2 * 3 * (34 + 4) * 8); /* 0..33, 127, 138, 149, 160 */
out:
    free(ybuf); free(ybuf2); free(xbuf);
}
END_TEST

/* Heads rotated in steps (an axes table's, cpu_apply.c): half = 0..40 and
 * some longer heads up to 256 pairs, each 8-pair step's cos/sin from its own
 * place in a pool (any alignment, steps overlapping or out of order, as
 * table rows of different axes are), NeoX or interleaved, plain stores
 * (out of place or in place) and non-temporal ones where the backend uses
 * them (16-byte aligned halves); every result against the portable one, and
 * nothing written outside the head. */
START_TEST(test_steps)
{
    const row_type *t = TYPE_OF(_i);
    const impl *vi = IMPL_OF(_i);
    enum { MAXH = 256, GUARD = 64, POOL = 4096 };
    static const int64_t longer[] = { 48, 56, 64, 68, 100, 128, 200, 256 };
    _Alignas(64) uint16_t ybuf[GUARD + 2 * MAXH + GUARD];
    uint16_t x[2 * MAXH];
    float cpool[POOL], spool[POOL];
    const float *c8[MAXH / 8], *s8[MAXH / 8];
    uint64_t st = tu_seed ^ 0x57e9;
    int64_t cases = 0;
    if (!vi->usable())
        return;
    for (int i = 0; i < POOL; i++) {
        cpool[i] = (float)((double)(ref_splitmix(&st) >> 11) * 0x1p-53 * 3.0 - 1.5);
        spool[i] = (float)((double)(ref_splitmix(&st) >> 11) * 0x1p-53 * 3.0 - 1.5);
    }
    for (int li = 0; li < 41 + (int)(sizeof longer / sizeof longer[0]); li++) {
        const int64_t half = li <= 40 ? li : longer[li - 41];
        for (int inter = 0; inter < 2; inter++)
            for (int mode = 0; mode < 3; mode++) { /* out of place, in place, non-temporal */
                const int nt = mode == 2;
                uint16_t *y = ybuf + GUARD;
                const uint16_t *xin = x;
                if (nt && half % 8 != 0)
                    continue; /* the backend streams only 16-byte aligned halves */
                for (int64_t k = 0; 8 * k < half; k++) {
                    const int64_t at = (int64_t)(ref_splitmix(&st) % (POOL - 8));
                    c8[k] = cpool + at;
                    s8[k] = spool + (k % 3 == 2 ? at : (int64_t)(ref_splitmix(&st) % (POOL - 8)));
                }
                fill(t, x, 2 * half, &st);
                memset(ybuf, 0xa5, sizeof ybuf);
                if (mode == 1) {
                    memcpy(y, x, (size_t)half * 4);
                    xin = y;
                }
                vi->steps[t - types](xin, y, half, inter, c8, s8, mode ? -1.0f : 1.0f, nt);
                __builtin_ia32_sfence();
                for (int64_t i = 0; i < half; i++) {
                    const int64_t ia = inter ? 2 * i : i, ib = inter ? 2 * i + 1 : half + i;
                    uint16_t wa, wb;
                    portable_pair(t, x[ia], x[ib], c8[i / 8][i % 8], s8[i / 8][i % 8],
                                  mode ? -1.0f : 1.0f, &wa, &wb);
                    if (!same16(t, y[ia], wa) || !same16(t, y[ib], wb))
                        ck_abort_msg("%s %s steps, %s, half %lld, %s, pair %lld: (0x%04x, "
                                     "0x%04x): (0x%04x, 0x%04x), portable (0x%04x, 0x%04x)",
                                     vi->name, t->name, inter ? "interleaved" : "neox",
                                     (long long)half,
                                     mode == 0 ? "out of place" : mode == 1 ? "in place"
                                                                            : "non-temporal",
                                     (long long)i, x[ia], x[ib], y[ia], y[ib], wa, wb);
                }
                for (int64_t j = 0; j < (int64_t)(sizeof ybuf / 2); j++)
                    if ((j < GUARD || j >= GUARD + 2 * half) && ybuf[j] != 0xa5a5)
                        ck_abort_msg("%s %s steps, half %lld: value %lld outside the head "
                                     "written",
                                     vi->name, t->name, (long long)half, (long long)j - GUARD);
                cases++;
            }
    }
    ck_assert_int_gt(cases, 200);
}
END_TEST

/* AVX-512's runs of heads sharing cos/sin (fr_avx512_rotate_heads_*): 1 to 5
 * heads of each half it takes, both styles, head strides with gaps between
 * the heads (8 and 16 values: outputs on 16 or 32 bytes, so both kinds of
 * non-temporal stores), out of place, in place and streamed; every result
 * against the portable one, and the gaps and guards untouched. */
START_TEST(test_heads)
{
    const row_type *t = &types[_i];
    enum { MAXN = 5, MAXSTEP = 128 + 16, GUARD = 64 };
    static const int64_t halves[] = { 16, 32, 48, 64 };
    _Alignas(64) uint16_t ybuf[GUARD + MAXN * MAXSTEP + GUARD], xbuf[MAXN * MAXSTEP];
    float cpool[512], spool[512];
    const float *c8[8], *s8[8];
    uint64_t st = tu_seed ^ 0x4ead;
    int64_t cases = 0;
    if (!fr_avx512_usable())
        return;
    for (int i = 0; i < 512; i++) {
        cpool[i] = (float)((double)(ref_splitmix(&st) >> 11) * 0x1p-53 * 3.0 - 1.5);
        spool[i] = (float)((double)(ref_splitmix(&st) >> 11) * 0x1p-53 * 3.0 - 1.5);
    }
    for (size_t hi = 0; hi < sizeof halves / sizeof halves[0]; hi++)
        for (int inter = 0; inter < 2; inter++)
            for (int mode = 0; mode < 3; mode++) /* out of place, in place, streamed */
                for (int64_t gap = 0; gap <= 16; gap += 8)
                    for (int64_t n = 1; n <= MAXN; n++) {
                        const int64_t half = halves[hi], step = 2 * half + gap;
                        uint16_t *y = ybuf + GUARD;
                        const uint16_t *x = mode == 1 ? y : xbuf;
                        const float sgn = (n & 1) ? 1.0f : -1.0f;
                        for (int64_t k = 0; 8 * k < half; k++) {
                            c8[k] = cpool + ref_splitmix(&st) % (512 - 8);
                            s8[k] = spool + ref_splitmix(&st) % (512 - 8);
                        }
                        fill(t, xbuf, MAXN * MAXSTEP, &st);
                        memset(ybuf, 0xa5, sizeof ybuf);
                        if (mode == 1)
                            for (int64_t h = 0; h < n; h++)
                                memcpy(y + h * step, xbuf + h * step, (size_t)half * 4);
                        (t->dt == FUSEDROPE_FLOAT16 ? fr_avx512_rotate_heads_f16
                                                    : fr_avx512_rotate_heads_bf16)(
                            x, step, y, step, n, half, inter, c8, s8, sgn, mode == 2);
                        __builtin_ia32_sfence();
                        for (int64_t j = 0; j < (int64_t)(sizeof ybuf / 2); j++) {
                            const int64_t rel = j - GUARD, h = rel / step, c = rel % step;
                            if (rel < 0 || h >= n || c >= 2 * half) {
                                if (ybuf[j] != 0xa5a5)
                                    ck_abort_msg("%s heads, half %lld, n %lld, gap %lld: value "
                                                 "%lld outside the heads written",
                                                 t->name, (long long)half, (long long)n,
                                                 (long long)gap, (long long)rel);
                                continue;
                            }
                            if (c < half) { /* pair c of head h: its a's place */
                                const int64_t ia = inter ? 2 * c : c, ib = inter ? 2 * c + 1 : half + c;
                                const uint16_t *xh = xbuf + h * step, *yh = y + h * step;
                                uint16_t wa, wb;
                                portable_pair(t, xh[ia], xh[ib], c8[c / 8][c % 8], s8[c / 8][c % 8],
                                              sgn, &wa, &wb);
                                if (!same16(t, yh[ia], wa) || !same16(t, yh[ib], wb))
                                    ck_abort_msg("%s heads, %s, half %lld, n %lld, gap %lld, mode "
                                                 "%d, head %lld pair %lld: (0x%04x, 0x%04x), "
                                                 "portable (0x%04x, 0x%04x)",
                                                 t->name, inter ? "interleaved" : "neox",
                                                 (long long)half, (long long)n, (long long)gap,
                                                 mode, (long long)h, (long long)c, yh[ia], yh[ib],
                                                 wa, wb);
                            }
                        }
                        cases++;
                    }
    ck_assert_int_eq(cases, 4 * 2 * 3 * 3 * MAXN);
}
END_TEST

/* The calls tests' three paths: 0 the library's choice (AVX-512 where the
 * CPU has it), 1 AVX2 alone, 2 the portable one (tu_cpu_path). */
static const char *const path_name[3] = { "default (AVX-512 where usable)", "AVX2 only",
                                          "portable" };

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
    const int first = tu_skip_default_path();
    uint64_t st = tu_seed ^ 0x5eed;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t S = shapes[k].s, B = shapes[k].b, H = shapes[k].h, D = shapes[k].d,
                      R = shapes[k].r, n = S * B * H * D;
        fusedrope_cache_config cfg;
        fusedrope_cache *c;
        uint16_t *x = malloc((size_t)n * 2),
                 *y[3] = { malloc((size_t)n * 2), malloc((size_t)n * 2), malloc((size_t)n * 2) };
        ck_assert(x && y[0] && y[1] && y[2]);
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)R, S, 10000.0);
        ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c), FUSEDROPE_OK);
        fill(t, x, n, &st);
        for (int style = 0; style < 2; style++)
            for (int op = 0; op < 2; op++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    for (int off = first; off < 3; off++) {
                        fusedrope_tensor tin, tout;
                        fusedrope_status rc;
                        tu_cpu_path(off);
                        memset(y[off], 0xa5, (size_t)n * 2);
                        if (in_place)
                            memcpy(y[off], x, (size_t)n * 2);
                        tin = fusedrope_tensor_sbhd(in_place ? y[off] : x, t->dt, S, B, H, D);
                        tout = fusedrope_tensor_sbhd(y[off], t->dt, S, B, H, D);
                        rc = op ? fusedrope_backward(c, (fusedrope_style)style, NULL, &tin, &tout, NULL)
                                : fusedrope_forward(c, (fusedrope_style)style, NULL, &tin, &tout, NULL);
                        ck_assert_int_eq(rc, FUSEDROPE_OK);
                    }
                    tu_cpu_path(0);
                    for (int64_t i = 0; i < n; i++)
                        for (int p = first; p < 2; p++)
                            if (!same16(t, y[p][i], y[2][i]))
                                ck_abort_msg("%s shape %zu style %d op %d in place %d element "
                                             "%lld: %s 0x%04x, portable 0x%04x (input 0x%04x)",
                                             t->name, k, style, op, in_place, (long long)i,
                                             path_name[p], y[p][i], y[2][i], x[i]);
                }
        fusedrope_cache_destroy(c);
        free(x);
        free(y[0]);
        free(y[1]);
        free(y[2]);
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
    const int first = tu_skip_default_path();
    const int64_t nq = (int64_t)B * S * HQ * D, nk = (int64_t)B * S * HK * D;
    uint16_t *q = malloc((size_t)nq * 2), *k = malloc((size_t)nk * 2),
             *yq[3] = { malloc((size_t)nq * 2), malloc((size_t)nq * 2), malloc((size_t)nq * 2) },
             *yk[3] = { malloc((size_t)nk * 2), malloc((size_t)nk * 2), malloc((size_t)nk * 2) };
    uint64_t st = tu_seed ^ 0x9c;
    fusedrope_cache_config cfg;
    fusedrope_cache *c;
    ck_assert(q && k && yq[0] && yq[1] && yq[2] && yk[0] && yk[1] && yk[2]);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, R, S, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c), FUSEDROPE_OK);
    fill(t, q, nq, &st);
    fill(t, k, nk, &st);
    for (int style = 0; style < 2; style++)
        for (int op = 0; op < 2; op++) {
            for (int off = first; off < 3; off++) {
                fusedrope_tensor qi = fusedrope_tensor_bshd(q, t->dt, B, S, HQ, D),
                                 qo = fusedrope_tensor_bshd(yq[off], t->dt, B, S, HQ, D),
                                 ki = fusedrope_tensor_bshd(k, t->dt, B, S, HK, D),
                                 ko = fusedrope_tensor_bshd(yk[off], t->dt, B, S, HK, D);
                fusedrope_status rc;
                tu_cpu_path(off);
                memset(yq[off], 0xa5, (size_t)nq * 2);
                memset(yk[off], 0xa5, (size_t)nk * 2);
                rc = op ? fusedrope_backward_qk(c, (fusedrope_style)style, NULL, &qi, &qo, &ki, &ko, NULL)
                        : fusedrope_forward_qk(c, (fusedrope_style)style, NULL, &qi, &qo, &ki, &ko, NULL);
                ck_assert_int_eq(rc, FUSEDROPE_OK);
            }
            tu_cpu_path(0);
            for (int64_t i = 0; i < nq + nk; i++)
                for (int w = first; w < 2; w++) {
                    const uint16_t a = i < nq ? yq[w][i] : yk[w][i - nq],
                                   p = i < nq ? yq[2][i] : yk[2][i - nq];
                    if (!same16(t, a, p))
                        ck_abort_msg("%s q+k style %d op %d %s element %lld: %s 0x%04x, portable "
                                     "0x%04x",
                                     t->name, style, op, i < nq ? "q" : "k",
                                     (long long)(i < nq ? i : i - nq), path_name[w], a, p);
                }
        }
    fusedrope_cache_destroy(c);
    free(q); free(k); free(yq[0]); free(yq[1]); free(yq[2]); free(yk[0]); free(yk[1]); free(yk[2]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu_rows");
    TCase *tc = tcase_create("cpu_rows");

    printf("test_cpu_rows: %s\n",
           fr_avx2_usable() ? "AVX2 and F16C in use"
                            : "this CPU lacks AVX2 or F16C: every path is the portable one");
    printf("test_cpu_rows: %s\n",
           fr_avx512_usable()
               ? "AVX-512 F/BW/VL in use"
               : "this CPU (or its OS, or valgrind) lacks AVX-512 F/BW/VL: skipping the AVX-512 "
                 "functions' tests; the calls' default path is the AVX2 one");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_every_value, 0, 4);
    tcase_add_loop_test(tc, test_narrow_rounding_patterns, 0, 4);
    tcase_add_loop_test(tc, test_tails, 0, 4);
    tcase_add_loop_test(tc, test_steps, 0, 4);
    tcase_add_loop_test(tc, test_heads, 0, 2);
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
