/*
 * cpu_avx2.c - the OpenMP backend's row conversions of 16-bit channels to
 * float and back, with x86 AVX2 and F16C, for CPUs that have both.
 * rope_math.h's portable converters, even vectorised by the compiler, cost
 * ~20 operations per fp16 element and a dozen per bf16 one; here fp16 is one
 * instruction per 8 elements and bf16 a few.
 *
 * The results are rope_math.h's to the bit:
 *   - widening is exact both ways (F16C returns a signalling half NaN
 *     quiet; a NaN only reaches an output through arithmetic, which yields
 *     NaN either way, and the narrowing then writes it as below);
 *   - fp16 narrowing of a non-NaN is IEEE round-to-nearest-even in both
 *     (the instruction is told so explicitly, whatever MXCSR says), with
 *     subnormals and overflow to Inf; a NaN becomes 0x7e00 with its sign,
 *     as fr_float_to_half writes it: NaN lanes are first replaced by the
 *     float NaN that converts to that;
 *   - bf16 narrowing is fr_float_to_bf16's integer arithmetic, 8 lanes at
 *     a time.
 * tests/test_cpu_rows.c compares both ways over every 16-bit value, a
 * dense sample of floats and whole calls.
 */
#include "internal.h"

#ifdef FR_HAVE_AVX2
#include <cpuid.h>
#include <immintrin.h>

#define FR_AVX2_TARGET __attribute__((target("avx2,f16c")))

int fr_avx2_off;

/* AVX2 and F16C in the CPU, and YMM state saved by the OS (CPUID and XGETBV
 * directly: clang's __builtin_cpu_supports knows no "f16c"). */
static int cpu_has_avx2_f16c(void)
{
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    if (!(c & bit_F16C) || !(c & bit_AVX) || !(c & bit_OSXSAVE))
        return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) /* XMM and YMM state */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b & bit_AVX2) != 0;
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

FR_AVX2_TARGET void fr_avx2_widen_f16(const uint16_t *h, float *f, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++)
        f[i] = fr_half_to_float(h[i]);
}

FR_AVX2_TARGET void fr_avx2_narrow_f16(const float *f, uint16_t *h, int64_t n)
{
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(f + i);
        const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        const __m256 canon = _mm256_or_ps(_mm256_and_ps(v, sign), qnan);
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_blendv_ps(v, canon, nan), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        h[i] = fr_float_to_half(f[i]);
}

/* bfloat16 rows with AVX2 integer operations: the same arithmetic as
 * fr_bf16_to_float / fr_float_to_bf16, 16 elements at a time. */
FR_AVX2_TARGET void fr_avx2_widen_bf16(const uint16_t *h, float *f, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_si256((__m256i *)(f + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; i++)
        f[i] = fr_bf16_to_float(h[i]);
}

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

FR_AVX2_TARGET void fr_avx2_narrow_bf16(const float *f, uint16_t *h, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i a = narrow8_bf16(_mm256_loadu_si256((const __m256i *)(f + i)));
        const __m256i b = narrow8_bf16(_mm256_loadu_si256((const __m256i *)(f + i + 8)));
        /* packus works within 128-bit lanes: put the quarters back in order */
        _mm256_storeu_si256((__m256i *)(h + i),
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
    }
    for (; i < n; i++)
        h[i] = fr_float_to_bf16(f[i]);
}

#else
typedef int fr_no_avx2; /* ISO C: a translation unit declares something */
#endif
