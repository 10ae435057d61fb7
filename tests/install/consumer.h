/*
 * consumer.h - the check every installed-library consumer of `make
 * installcheck` runs (tests/install/run.sh): a CPU forward, NeoX style, in
 * float32 and bfloat16, compared with a float64 reference written here.
 *
 * The reference is independent of the library: it does not include
 * fusedrope.h and computes, in double, the angle p * theta^(-2i/rot_dim) of
 * position p (0..s-1, the implicit positions) and pair i, then
 *     a' = a cos - b sin,  b' = b cos + a sin
 * with a = x[i], b = x[i + rot_dim/2] (rotate_half).  Channels from rot_dim
 * on must be copied bit for bit.
 *
 * Tolerance (the README's precision promise, in the output dtype):
 *     |y - ref| <= ulp(ref) + 2^-22 * (|a| + |b|)
 * where ulp is that of the output dtype (float32: 24-bit significand,
 * bfloat16: 8-bit), subnormal ulp below the smallest normal; a NaN never
 * passes.  The inputs are bfloat16 values (exact in both dtypes).
 *
 * Outputs are poisoned (all bits set: NaN) before each call, so a channel the
 * library skips fails.  Data come from a seed printed on stdout and settable
 * with FUSEDROPE_TEST_SEED.
 *
 * Clean C99 and C++11 (with -Wall -Wextra -pedantic -Werror): it is compiled
 * into each consumer program, which passes the forward to check as a function
 * pointer (a direct call, or one found with dlsym).
 */
#ifndef FR_CONSUMER_H
#define FR_CONSUMER_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* bf16: 0 for float32 data, 1 for bfloat16 (uint16_t) data; sbhd layout,
 * contiguous; returns 0 on success. */
typedef int (*consumer_forward_fn)(int bf16, const void *x, void *y, int64_t s, int64_t b,
                                   int64_t h, int64_t d, int rot_dim, double theta);

/* Odd sizes: head_dim 80 with rot_dim 64 leaves 16 channels to copy. */
enum { CONSUMER_S = 37, CONSUMER_B = 2, CONSUMER_H = 3, CONSUMER_D = 80, CONSUMER_ROT = 64 };
#define CONSUMER_N ((size_t)CONSUMER_S * CONSUMER_B * CONSUMER_H * CONSUMER_D)
#define CONSUMER_THETA 10000.0

static inline uint64_t consumer_next(uint64_t *state)
{
    /* xorshift64* */
    uint64_t z = *state;
    z ^= z >> 12;
    z ^= z << 25;
    z ^= z >> 27;
    *state = z;
    return z * 2685821657736338717ULL;
}

static inline float consumer_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t consumer_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ulp of v in a format with a p-bit significand and smallest normal 2^-126. */
static inline double consumer_ulp(double v, int p)
{
    int e = -125;
    if (v != 0) {
        (void)frexp(v, &e); /* |v| = m 2^e, m in [0.5, 1) */
        if (e < -125)
            e = -125;
    }
    return ldexp(1.0, e - p);
}

/* Returns the number of failures and prints one line. */
static inline int consumer_check(const char *who, consumer_forward_fn forward)
{
    const int half = CONSUMER_ROT / 2;
    const char *env = getenv("FUSEDROPE_TEST_SEED");
    uint64_t seed, state;
    float *xf = (float *)malloc(CONSUMER_N * sizeof *xf);
    float *yf = (float *)malloc(CONSUMER_N * sizeof *yf);
    uint16_t *xb = (uint16_t *)malloc(CONSUMER_N * sizeof *xb);
    uint16_t *yb = (uint16_t *)malloc(CONSUMER_N * sizeof *yb);
    int fails = 0, checked = 0, bf16;
    double worst = 0; /* largest |y - ref| / tolerance (NaN if any is) */

    if (env && *env)
        seed = strtoull(env, NULL, 0);
    else
        seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)clock();
    printf("%s: FUSEDROPE_TEST_SEED=%llu\n", who, (unsigned long long)seed);
    state = seed ? seed : 1;
    if (!xf || !yf || !xb || !yb) {
        printf("%s: out of memory\n", who);
        free(xf), free(yf), free(xb), free(yb);
        return 1;
    }
    for (size_t i = 0; i < CONSUMER_N; i++) {
        /* uniform in [-4, 4), truncated to bfloat16 so both dtypes get it exactly */
        double u = (double)(consumer_next(&state) >> 11) * ldexp(1.0, -53);
        uint32_t bits = consumer_float_bits((float)(8 * u - 4)) & 0xffff0000u;
        xf[i] = consumer_bits_float(bits);
        xb[i] = (uint16_t)(bits >> 16);
    }
    for (bf16 = 0; bf16 <= 1; bf16++) {
        const int p = bf16 ? 8 : 24;
        memset(yf, 0xff, CONSUMER_N * sizeof *yf);
        memset(yb, 0xff, CONSUMER_N * sizeof *yb);
        if (forward(bf16, bf16 ? (const void *)xb : (const void *)xf,
                    bf16 ? (void *)yb : (void *)yf, CONSUMER_S, CONSUMER_B, CONSUMER_H,
                    CONSUMER_D, CONSUMER_ROT, CONSUMER_THETA) != 0) {
            printf("%s: %s forward failed\n", who, bf16 ? "bfloat16" : "float32");
            fails++;
            continue;
        }
        for (int s = 0; s < CONSUMER_S; s++)
            for (int r = 0; r < CONSUMER_B * CONSUMER_H; r++) {
                size_t row = ((size_t)s * CONSUMER_B * CONSUMER_H + (size_t)r) * CONSUMER_D;
                const float *x = xf + row;
                for (int c = 0; c < CONSUMER_D; c++) {
                    double got = bf16 ? (double)consumer_bits_float((uint32_t)yb[row + c] << 16)
                                      : (double)yf[row + c];
                    double ref, tol, a, b;
                    if (c >= CONSUMER_ROT) {
                        /* copied bit for bit */
                        int same = bf16 ? yb[row + c] == xb[row + c]
                                        : consumer_float_bits(yf[row + c]) ==
                                              consumer_float_bits(x[c]);
                        if (!same && fails++ < 5)
                            printf("%s: %s s=%d row=%d c=%d: pass-through %.9g != %.9g\n", who,
                                   bf16 ? "bf16" : "f32", s, r, c, got, (double)x[c]);
                        checked++;
                        continue;
                    }
                    {
                        int i = c % half;
                        double ang = (double)s * pow(CONSUMER_THETA, -2.0 * i / CONSUMER_ROT);
                        a = x[i];
                        b = x[i + half];
                        ref = c < half ? a * cos(ang) - b * sin(ang) : b * cos(ang) + a * sin(ang);
                    }
                    tol = consumer_ulp(ref, p) + ldexp(fabs(a) + fabs(b), -22);
                    checked++;
                    if (!(fabs(got - ref) <= tol) && fails++ < 5)
                        printf("%s: %s s=%d row=%d c=%d: got %.9g, reference %.9g, "
                               "tolerance %.3g\n",
                               who, bf16 ? "bf16" : "f32", s, r, c, got, ref, tol);
                    if (!(fabs(got - ref) / tol <= worst))
                        worst = fabs(got - ref) / tol; /* NaN stays */
                }
            }
    }
    printf("%s: %d values checked against the float64 reference, %d failed, "
           "worst error %.2f of the tolerance%s\n",
           who, checked, fails, worst, fails ? "; rerun with the seed above" : "");
    free(xf), free(yf), free(xb), free(yb);
    return fails;
}

#endif /* FR_CONSUMER_H */
