/*
 * cpu_f16c.c - half <-> float conversion of a row of channels with the x86
 * F16C instructions, for the OpenMP backend's fp16 heads.  rope_math.h's
 * portable converters cost ~20 integer and float operations per element
 * and kept fp16 at about half of bf16's speed; a hardware conversion is one
 * instruction per 8 elements.
 *
 * The results are rope_math.h's to the bit:
 *   - half -> float is exact both ways (a signalling NaN comes back quiet,
 *     and a NaN only ever reaches the output through arithmetic, which
 *     yields NaN either way);
 *   - float -> half of a non-NaN is IEEE round-to-nearest-even in both
 *     (the instruction is told so explicitly, whatever MXCSR says), with
 *     subnormals and overflow to Inf;
 *   - a NaN becomes 0x7e00 with its sign, as fr_float_to_half writes it:
 *     NaN lanes are first replaced by the float NaN that converts to that.
 * tests/test_f16c.c compares the two over every half and a dense sample
 * of floats.
 */
#include "internal.h"

#ifdef FR_HAVE_F16C
#include <cpuid.h>
#include <immintrin.h>

#define FR_F16C_TARGET __attribute__((target("avx2,f16c")))

int fr_f16c_off;

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

int fr_f16c_usable(void)
{
    static int state; /* 0 unknown, 1 no, 2 yes; racing first callers agree */
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (s == 0) {
        s = cpu_has_avx2_f16c() ? 2 : 1;
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    return s == 2 && !__atomic_load_n(&fr_f16c_off, __ATOMIC_RELAXED);
}

FR_F16C_TARGET void fr_f16c_widen(const uint16_t *h, float *f, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++)
        f[i] = fr_half_to_float(h[i]);
}

FR_F16C_TARGET void fr_f16c_narrow(const float *f, uint16_t *h, int64_t n)
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

#else
typedef int fr_no_f16c; /* ISO C: a translation unit declares something */
#endif
