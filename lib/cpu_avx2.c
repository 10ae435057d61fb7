/*
 * cpu_avx2.c - the OpenMP backend's rotation of 16-bit heads with x86 AVX2
 * and F16C, for CPUs that have both: 8 pairs at a time are widened to
 * float, rotated and narrowed in one pass, with no float row in between.
 * rope_math.h's portable converters, even vectorised by the compiler, cost
 * ~20 operations per fp16 element and a dozen per bf16 one; here fp16 is one
 * instruction per 8 elements and bf16 a few.
 *
 * Every non-NaN result is the portable path's to the bit (widen with
 * rope_math.h's converters, fr_rotate, narrow):
 *   - widening is exact both ways;
 *   - the rotation is fr_rotate's four products, difference and sum, in
 *     float, without FMA (this file is not built for it);
 *   - fp16 narrowing of a non-NaN is IEEE round-to-nearest-even in both
 *     (the instruction is told so explicitly, whatever MXCSR says), with
 *     subnormals and overflow to Inf;
 *   - bf16 narrowing is fr_float_to_bf16's integer arithmetic, 8 lanes at
 *     a time.
 * A NaN result is NaN, written as the converters write it (fp16 0x7e00 with
 * its sign, bf16 the float's top half with the quiet bit); which input NaN
 * an operation passes on, and so its sign and payload, is the compiler's
 * operand order, in this file as in the portable loop.
 * tests/test_cpu_rows.c compares both ways over every 16-bit value, the
 * floats whose rounding is hardest, and whole calls.
 */
#include "internal.h"

#ifdef FR_HAVE_AVX2
#include <cpuid.h>
#include <immintrin.h>

#define FR_AVX2_TARGET __attribute__((target("avx2,f16c")))
/* The rotation loops, inlined into every entry point (also the step
 * pointers' ones), so that each is specialised as the one-entry file was. */
#define FR_AVX2_INLINE __attribute__((always_inline))

int fr_avx2_off;

/* AVX and F16C in the CPU, the register state of xcr0_bits saved by the OS
 * (XGETBV) and every bit of leaf7_ebx in CPUID leaf 7's EBX: both SIMD
 * files' test (CPUID and XGETBV directly: clang's __builtin_cpu_supports
 * knows no "f16c"). */
int fr_x86_has(unsigned xcr0_bits, unsigned leaf7_ebx)
{
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    if (!(c & bit_F16C) || !(c & bit_AVX) || !(c & bit_OSXSAVE))
        return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & xcr0_bits) != xcr0_bits)
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b & leaf7_ebx) == leaf7_ebx;
}

/* AVX2 and F16C, XMM and YMM state (XCR0 bits 1-2). */
static int cpu_has_avx2_f16c(void)
{
    return fr_x86_has(6u, bit_AVX2);
}

int fr_avx2_usable(void)
{
    static int state; /* 0 unknown, 1 no, 2 yes; racing first callers agree */
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (s == 0) {
        s = cpu_has_avx2_f16c() ? 2 : 1;
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    return s == 2 && !__atomic_load_n(&fr_avx2_off, __ATOMIC_RELAXED);
}

/* fr_float_to_bf16's integer arithmetic on 8 floats (as bits): the
 * bfloat16 in the low half of each 32-bit lane. */
FR_AVX2_TARGET static __m256i narrow8_bf16(__m256i u)
{
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(hi, _mm256_set1_epi32(1))),
        16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

/* Pairs of a 16-bit head rotated without a float row: 8 pairs at a time are
 * widened, rotated by fr_rotate's operations in fr_rotate's order (no FMA:
 * this file is not built for it), and narrowed.  One pass instead of five
 * over the row, since the 16-bit types' CPU loop was bound by instructions,
 * not by memory (bench/RESULTS.md); with nt, the 16-byte stores are
 * non-temporal, straight to a streamed output. */
FR_AVX2_TARGET static inline __m256 widen8(const uint16_t *p, int f16)
{
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (f16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* ya and yb narrowed to 16 bits: ya's 8 in the low half, yb's in the high. */
FR_AVX2_TARGET static inline __m256i narrow16(__m256 ya, __m256 yb, int f16)
{
    if (f16) {
        const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
        const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
        const __m256 na = _mm256_cmp_ps(ya, ya, _CMP_UNORD_Q);
        const __m256 nb = _mm256_cmp_ps(yb, yb, _CMP_UNORD_Q);
        ya = _mm256_blendv_ps(ya, _mm256_or_ps(_mm256_and_ps(ya, sign), qnan), na);
        yb = _mm256_blendv_ps(yb, _mm256_or_ps(_mm256_and_ps(yb, sign), qnan), nb);
        return _mm256_set_m128i(_mm256_cvtps_ph(yb, _MM_FROUND_TO_NEAREST_INT),
                                _mm256_cvtps_ph(ya, _MM_FROUND_TO_NEAREST_INT));
    }
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(narrow8_bf16(_mm256_castps_si256(ya)),
                                                        narrow8_bf16(_mm256_castps_si256(yb))),
                                    0xd8);
}

/* fr_rotate on 8 pairs (a, b) by cs/sn, narrowed: a's results in the low
 * 128 bits, b's in the high. */
FR_AVX2_TARGET static inline __m256i rotate8(__m256 a, __m256 b, const float *cs, const float *sn,
                                            __m256 vsgn, int f16)
{
    const __m256 c = _mm256_loadu_ps(cs);
    const __m256 ss = _mm256_mul_ps(_mm256_loadu_ps(sn), vsgn);
    const __m256 ra = _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, ss));
    const __m256 rb = _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, ss));
    return narrow16(ra, rb, f16);
}

/* One pair the scalar way (the loops' tails): the portable path's arithmetic. */
FR_AVX2_TARGET static inline void rotate1(uint16_t xa, uint16_t xb, float c, float s, float sgn,
                                          int f16, uint16_t *ya, uint16_t *yb)
{
    float ra, rb;
    fr_rotate(f16 ? fr_half_to_float(xa) : fr_bf16_to_float(xa),
              f16 ? fr_half_to_float(xb) : fr_bf16_to_float(xb), c, s, sgn, &ra, &rb);
    *ya = f16 ? fr_float_to_half(ra) : fr_float_to_bf16(ra);
    *yb = f16 ? fr_float_to_half(rb) : fr_float_to_bf16(rb);
}

/* 16 bytes to p, past the cache when nt (p then 16-byte aligned). */
FR_AVX2_TARGET static inline void store16(uint16_t *p, __m128i v, int nt)
{
    if (nt)
        _mm_stream_si128((__m128i *)p, v);
    else
        _mm_storeu_si128((__m128i *)p, v);
}

/* The cos (C) and sin (S) of pair i: cs[i], or with step pointers cs8 (a
 * head rotated in steps, see fr_avx2_rotate_steps_bf16) cs8[i / 8][i % 8];
 * `stepped`, a constant in each inlined copy, says which. */
#define STEP_C(i) (stepped ? cs8[(i) >> 3] + ((i)&7) : cs + (i))
#define STEP_S(i) (stepped ? sn8[(i) >> 3] + ((i)&7) : sn + (i))

FR_AVX2_TARGET static inline FR_AVX2_INLINE void rotate16(const uint16_t *xa, const uint16_t *xb,
                                                          uint16_t *ya, uint16_t *yb,
                                                          const float *cs, const float *sn,
                                                          const float *const *cs8,
                                                          const float *const *sn8, int stepped,
                                                          int64_t m,
                                                          float sgn, int nt, int f16)
{
    const __m256 vsgn = _mm256_set1_ps(sgn);
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
        const __m256i y =
            rotate8(widen8(xa + i, f16), widen8(xb + i, f16), STEP_C(i), STEP_S(i), vsgn, f16);
        store16(ya + i, _mm256_castsi256_si128(y), nt);
        store16(yb + i, _mm256_extracti128_si256(y, 1), nt);
    }
    for (; i < m; i++)
        rotate1(xa[i], xb[i], *STEP_C(i), *STEP_S(i), sgn, f16, &ya[i], &yb[i]);
}

/* Interleaved heads: 8 pairs are 8 32-bit words, a in the low half. */
FR_AVX2_TARGET static inline FR_AVX2_INLINE void rotate16_pairs(const uint16_t *x, uint16_t *y,
                                                                const float *cs, const float *sn,
                                                                const float *const *cs8,
                                                                const float *const *sn8, int stepped,
                                                          int64_t m,
                                                                float sgn, int nt, int f16)
{
    const __m256 vsgn = _mm256_set1_ps(sgn);
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(x + 2 * i));
        __m256 a, b;
        __m256i r;
        __m128i ra, rb; /* the narrowed a's and b's */
        if (f16) {
            /* a's 8 halves in the low 128 bits, b's in the high */
            const __m256i ab = _mm256_permute4x64_epi64(
                _mm256_packus_epi32(_mm256_and_si256(w, lo16), _mm256_srli_epi32(w, 16)), 0xd8);
            a = _mm256_cvtph_ps(_mm256_castsi256_si128(ab));
            b = _mm256_cvtph_ps(_mm256_extracti128_si256(ab, 1));
        } else {
            a = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            b = _mm256_castsi256_ps(_mm256_andnot_si256(lo16, w));
        }
        r = rotate8(a, b, STEP_C(i), STEP_S(i), vsgn, f16);
        ra = _mm256_castsi256_si128(r);
        rb = _mm256_extracti128_si256(r, 1);
        store16(y + 2 * i, _mm_unpacklo_epi16(ra, rb), nt); /* back to pairs 0-3 */
        store16(y + 2 * i + 8, _mm_unpackhi_epi16(ra, rb), nt); /* and 4-7 */
    }
    for (; i < m; i++)
        rotate1(x[2 * i], x[2 * i + 1], *STEP_C(i), *STEP_S(i), sgn, f16, &y[2 * i],
                &y[2 * i + 1]);
}

FR_AVX2_TARGET void fr_avx2_rotate_steps_f16(const uint16_t *x, uint16_t *y, int64_t half,
                                             int interleaved, const float *const *cs8,
                                             const float *const *sn8, float sgn, int nt)
{
    if (interleaved)
        rotate16_pairs(x, y, NULL, NULL, cs8, sn8, 1, half, sgn, nt, 1);
    else
        rotate16(x, x + half, y, y + half, NULL, NULL, cs8, sn8, 1, half, sgn, nt, 1);
}

FR_AVX2_TARGET void fr_avx2_rotate_steps_bf16(const uint16_t *x, uint16_t *y, int64_t half,
                                              int interleaved, const float *const *cs8,
                                              const float *const *sn8, float sgn, int nt)
{
    if (interleaved)
        rotate16_pairs(x, y, NULL, NULL, cs8, sn8, 1, half, sgn, nt, 0);
    else
        rotate16(x, x + half, y, y + half, NULL, NULL, cs8, sn8, 1, half, sgn, nt, 0);
}

FR_AVX2_TARGET void fr_avx2_rotate_pairs_f16(const uint16_t *x, uint16_t *y, const float *cs,
                                             const float *sn, int64_t m, float sgn, int nt)
{
    rotate16_pairs(x, y, cs, sn, NULL, NULL, 0, m, sgn, nt, 1);
}

FR_AVX2_TARGET void fr_avx2_rotate_pairs_bf16(const uint16_t *x, uint16_t *y, const float *cs,
                                              const float *sn, int64_t m, float sgn, int nt)
{
    rotate16_pairs(x, y, cs, sn, NULL, NULL, 0, m, sgn, nt, 0);
}

FR_AVX2_TARGET void fr_avx2_rotate_f16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya,
                                       uint16_t *yb, const float *cs, const float *sn, int64_t m,
                                       float sgn, int nt)
{
    rotate16(xa, xb, ya, yb, cs, sn, NULL, NULL, 0, m, sgn, nt, 1);
}

FR_AVX2_TARGET void fr_avx2_rotate_bf16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya,
                                        uint16_t *yb, const float *cs, const float *sn, int64_t m,
                                        float sgn, int nt)
{
    rotate16(xa, xb, ya, yb, cs, sn, NULL, NULL, 0, m, sgn, nt, 0);
}

#else
typedef int fr_no_avx2; /* ISO C: a translation unit declares something */
#endif
