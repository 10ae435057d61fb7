/*
 * cpu_norm_avx2.c - the fused norm's rows with AVX2 and F16C, for CPUs
 * that have both (fr_avx2_usable): the forward's (nv_rows, on
 * cpu_norm_avx2.h's passes) and the backward's (nb_*), one function per
 * rounding mode, dtype, style and saved tensor, which cpu_norm.c picks.
 */
#include "cpu_norm_avx2.h"

#ifdef FR_HAVE_AVX2
FR_DEFINE_ROWS(FR_AVX2_INLINE, nv_rows, nv_run)
FR_DEFINE_FWD_PICK(FR_AVX2_TARGET, nv, fr_norm_avx2_rows)

/*
 * The backward's rows with AVX2 and F16C (fr_avx2_usable), for rows
 * whose rotation pairs and other channels come in whole vectors (nt_whole):
 * pass A widens dy and the saved row, rotates them back (fr_rotate with sgn
 * -1: its s * -1.0f, then the same products and sums), forms n, adds g * n
 * into the chunk's dw partial and stores dn = g * w' and n as floats; the
 * dot of dn and n in norm_math.h's order (nv_tree); pass B forms
 * dx = rstd * (dn - n * mean) and narrows it (with the NaN case).  Each
 * operation is the portable loops' in the same order, in float, without
 * FMA: the same bits (tests/test_norm.c compares the two).
 */

FR_DEFINE_ROTATE(FR_AVX2_INLINE, nb_rotate8, __m256, _mm256_loadu_ps, _mm256_set1_ps, -1)

/* 16 interleaved channels (lo: 0-7, hi: 8-15) to pair order (a even, b
 * odd), and back. */
FR_AVX2_INLINE void nb_split(__m256 lo, __m256 hi, __m256 *a, __m256 *b)
{
    *a = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8));
    *b = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), 0xd8));
}

FR_AVX2_INLINE void nb_join(__m256 a, __m256 b, __m256 *lo, __m256 *hi)
{
    const __m256 l = _mm256_unpacklo_ps(a, b), h = _mm256_unpackhi_ps(a, b);
    *lo = _mm256_permute2f128_ps(l, h, 0x20);
    *hi = _mm256_permute2f128_ps(l, h, 0x31);
}

/* nb_split, nb_rotate8 and nb_join: 16 interleaved channels rotated back in
 * place. */
FR_AVX2_INLINE void nb_rotate_il8(__m256 *lo, __m256 *hi, const float *cs, const float *sn)
{
    __m256 a, b;
    nb_split(*lo, *hi, &a, &b);
    nb_rotate8(&a, &b, cs, sn);
    nb_join(a, b, lo, hi);
}

/* The dot of dn and n over a row (row_dot's order: partial l is lane l % 8
 * of accumulator l / 8; nv_tree). */
FR_AVX2_INLINE float nb_dot8(const float *dn, const float *nn, int64_t hd)
{
    __m256 s[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                    _mm256_setzero_ps() };
#define NB_DOT(c) _mm256_mul_ps(_mm256_loadu_ps(dn + (c)), _mm256_loadu_ps(nn + (c)))
    FR_ROW_PARTIALS(8, s, hd, NB_DOT, NB_DOT1);
#undef NB_DOT
    return nv_tree(s[0], s[1], s[2], s[3]);
}

FR_AVX2_INLINE void nb_store8(void *p, __m256 v, int dt)
{
    nv_store8(p, v, dt, 0, 0);
}

FR_DEFINE_NB_PASSES(FR_AVX2_INLINE, nb, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
                    _mm256_set1_ps, nv_widen8, nb_store8, nb_rotate8, nb_rotate_il8, nb_dot8)

FR_DEFINE_BRUN(FR_AVX2_INLINE, nb_run, nb_pass_a, nb_pass_b)

FR_DEFINE_NB_PICK(FR_AVX2_TARGET, nb, fr_norm_avx2_brun)
#else
typedef int fr_no_avx2_norm; /* ISO C: a translation unit declares something */
#endif
