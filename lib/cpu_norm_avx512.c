/*
 * cpu_norm_avx512.c - the fused norm's rows with 512-bit vectors (AVX-512
 * F, BW and VL, fr_avx512_usable), for calls whose rows are whole
 * 16-channel vectors (n5_whole): the forward's (n5_*, on
 * cpu_norm_avx2.h's macros) and the backward's (nb5_*), which cpu_norm.c
 * picks.
 */
#include "cpu_norm_avx2.h"

#ifdef FR_HAVE_AVX512
/*
 * The AVX2 forward row's two passes with 512-bit vectors, for CPUs with
 * AVX-512 F, BW and VL (fr_avx512_usable), on rows whose rotation pairs and
 * other channels come in whole 16-channel vectors (n5_whole, every slot of
 * the call; other calls take the AVX2 rows).  The bits are the AVX2 rows',
 * lane by lane: the same operations in the same order, in float, without
 * FMA.  The row sum keeps norm_math.h's 32 partial sums: partial l is lane
 * l % 16 of accumulator l / 16 (the AVX2 rows' accumulators 0-1 and 2-3
 * side by side), and the tree adds the two (off 16), then the 256-bit
 * halves (off 8), then as nv_tree.  The bf16 roundings keep the integer
 * arithmetic (not vcvtneps2bf16, which flushes subnormal inputs to zero); a
 * mask adds the rounding's odd bit (cpu_avx512.c's bf16_high).
 */
#define FR_N5_TARGET __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl")))
#define FR_N5_INLINE FR_N5_TARGET static inline __attribute__((always_inline))

/* Lane indices of the two-source permutes (0-15 the first source's, 16-31
 * the second's; for words 0-31 and 32-63). */
static const int32_t n5_even[16] = { 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30 };
static const int32_t n5_odd[16] = { 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31 };
static const int32_t n5_zip_lo[16] = { 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23 };
static const int32_t n5_zip_hi[16] = { 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31 };
static const uint16_t n5_high_words[32] = { /* the high halves of a's lanes, then b's */
    1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63
};
static const uint16_t n5_zip_high_words[32] = { /* a's high half i, b's high half i, ... */
    1,  33, 3,  35, 5,  37, 7,  39, 9,  41, 11, 43, 13, 45, 15, 47,
    17, 49, 19, 51, 21, 53, 23, 55, 25, 57, 27, 59, 29, 61, 31, 63
};
static const uint16_t n5_zip_words[32] = { /* a's word i, b's word i, ... */
    0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47
};

/* 16 channels of type dt as floats, exactly. */
FR_N5_INLINE __m512 n5_widen16(const void *p, int dt)
{
    if (dt == 0)
        return _mm512_loadu_ps(p);
    if (dt == 1)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* fr_float_to_bf16's rounding of 16 floats, in the high halves: u + 0x7fff
 * + (bit 16 of u); with fin 0, a NaN lane u with the quiet bit. */
FR_N5_INLINE __m512i n5_bf16_high(__m512 v, int fin)
{
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
    __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
    r = _mm512_mask_add_epi32(r, odd, u, _mm512_set1_epi32(0x8000));
    if (fin)
        return r;
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u,
                                _mm512_set1_epi32(0x400000));
}

/* fp16 bits of 16 floats (fin 0: a NaN first made the quiet NaN of its
 * sign, as nv_nan_for_half). */
FR_N5_INLINE __m256i n5_half_bits(__m512 v, int fin)
{
    if (!fin)
        v = _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(
            _mm512_castps_si512(v), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
            _mm512_set1_epi32((int)0x80000000u), _mm512_set1_epi32(0x7fc00000), 0xea));
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

/* nv_round8 on 16 floats. */
FR_N5_INLINE __m512 n5_round16(__m512 v, int dt)
{
    if (dt == 0)
        return v;
    if (dt == 1)
        return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    return _mm512_castsi512_ps(
        _mm512_and_si512(n5_bf16_high(v, 1), _mm512_set1_epi32((int)0xffff0000u)));
}

/* nv_value8 on 16 channels. */
FR_N5_INLINE __m512 n5_value16(const float *v, __m512 rstd, const float *wf, int rounding, int dt)
{
    const __m512 x = _mm512_loadu_ps(v), w = _mm512_loadu_ps(wf);
    __m512 y;
    FR_NORM_VALUE(y, x, rstd, w, rounding, dt, n5_round16);
    return y;
}

/* nv_rotate8 on 16 pairs. */
FR_DEFINE_ROTATE(FR_N5_INLINE, n5_rotate16, __m512, _mm512_loadu_ps, _mm512_set1_ps, 1)

/* 32 or 64 bytes stored at p: unaligned, or with nt non-temporal in
 * 16-byte pieces (p 16-byte aligned). */
FR_N5_INLINE void n5_store32(void *p, __m256i b, int nt)
{
    if (nt) {
        _mm_stream_si128((__m128i *)p, _mm256_castsi256_si128(b));
        _mm_stream_si128((__m128i *)p + 1, _mm256_extracti128_si256(b, 1));
    } else {
        _mm256_storeu_si256((__m256i *)p, b);
    }
}

FR_N5_INLINE void n5_store64(void *p, __m512i b, int nt)
{
    if (nt) {
        _mm_stream_si128((__m128i *)p, _mm512_castsi512_si128(b));
        _mm_stream_si128((__m128i *)p + 1, _mm512_extracti32x4_epi32(b, 1));
        _mm_stream_si128((__m128i *)p + 2, _mm512_extracti32x4_epi32(b, 2));
        _mm_stream_si128((__m128i *)p + 3, _mm512_extracti32x4_epi32(b, 3));
    } else {
        _mm512_storeu_si512(p, b);
    }
}

/* 16 channels narrowed to dt and stored at p. */
FR_N5_INLINE void n5_store16(void *p, __m512 v, int dt, int nt, int fin)
{
    if (dt == 0)
        n5_store64(p, _mm512_castps_si512(v), nt);
    else if (dt == 1)
        n5_store32(p, n5_half_bits(v, fin), nt);
    else
        n5_store32(p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(n5_bf16_high(v, fin), 16)), nt);
}

/* fr_norm_tree32 over partial sums in two accumulators: off 16 (the two),
 * off 8 (their 256-bit halves), then 4, 2 and 1 as nv_tree. */
FR_N5_INLINE float n5_tree(__m512 s0, __m512 s1)
{
    const __m512 t = _mm512_add_ps(s0, s1);
    const __m256 e = _mm256_add_ps(_mm512_castps512_ps256(t),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1)));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    u = _mm_add_ss(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 1, 1, 1)));
    return _mm_cvtss_f32(u);
}

/* nv_sum with 16-channel vectors. */
FR_N5_INLINE float n5_sum(const void *x, float *v, int64_t hd, int dt)
{
    const int64_t es = dt == 0 ? 4 : 2;
    const char *xb = x;
    __m512 s[2] = { _mm512_setzero_ps(), _mm512_setzero_ps() };
#define N5_SQ(c) ({ const __m512 x_ = n5_widen16(xb + (c) * es, dt); \
                    _mm512_storeu_ps(v + (c), x_);                   \
                    _mm512_mul_ps(x_, x_); })
    FR_ROW_PARTIALS(16, s, hd, N5_SQ, NV_SQ1);
#undef N5_SQ
    return n5_tree(s[0], s[1]);
}

/* nv_out with 16-channel vectors, for n5_whole rows (no tails). */
FR_N5_INLINE void n5_out(const float *v, void *y, const float *wf, const float *cs,
                         const float *sn, int64_t hd, int64_t half, float rstd, int rounding,
                         int dt, int interleaved, int nt, int fin)
{
    const int64_t es = dt == 0 ? 4 : 2, rot = 2 * half;
    const __m512 vr = _mm512_set1_ps(rstd);
    char *yb = y;
    int64_t c, i;

    if (interleaved) {
        for (i = 0; 2 * i < rot; i += 16) {
            const __m512 lo = n5_value16(v + 2 * i, vr, wf + 2 * i, rounding, dt);
            const __m512 hi = n5_value16(v + 2 * i + 16, vr, wf + 2 * i + 16, rounding, dt);
            __m512 a = _mm512_permutex2var_ps(lo, _mm512_loadu_si512(n5_even), hi);
            __m512 b = _mm512_permutex2var_ps(lo, _mm512_loadu_si512(n5_odd), hi);
            n5_rotate16(&a, &b, cs + i, sn + i);
            if (dt == 0) {
                n5_store64(yb + 2 * i * es,
                           _mm512_castps_si512(_mm512_permutex2var_ps(a, _mm512_loadu_si512(n5_zip_lo), b)), nt);
                n5_store64(yb + (2 * i + 16) * es,
                           _mm512_castps_si512(_mm512_permutex2var_ps(a, _mm512_loadu_si512(n5_zip_hi), b)), nt);
            } else if (dt == 1) {
                n5_store64(yb + 2 * i * es,
                           _mm512_permutex2var_epi16(_mm512_castsi256_si512(n5_half_bits(a, fin)),
                                                     _mm512_loadu_si512(n5_zip_words),
                                                     _mm512_castsi256_si512(n5_half_bits(b, fin))),
                           nt);
            } else {
                n5_store64(yb + 2 * i * es,
                           _mm512_permutex2var_epi16(n5_bf16_high(a, fin),
                                                     _mm512_loadu_si512(n5_zip_high_words),
                                                     n5_bf16_high(b, fin)),
                           nt);
            }
        }
    } else {
        for (i = 0; i < half; i += 16) {
            __m512 a = n5_value16(v + i, vr, wf + i, rounding, dt);
            __m512 b = n5_value16(v + half + i, vr, wf + half + i, rounding, dt);
            n5_rotate16(&a, &b, cs + i, sn + i);
            if (dt == 2) {
                /* a's 16 bfloat16 in the low half, b's in the high */
                const __m512i ab = _mm512_permutex2var_epi16(
                    n5_bf16_high(a, fin), _mm512_loadu_si512(n5_high_words), n5_bf16_high(b, fin));
                n5_store32(yb + i * es, _mm512_castsi512_si256(ab), nt);
                n5_store32(yb + (half + i) * es, _mm512_extracti64x4_epi64(ab, 1), nt);
            } else {
                n5_store16(yb + i * es, a, dt, nt, fin);
                n5_store16(yb + (half + i) * es, b, dt, nt, fin);
            }
        }
    }
    /* the channels past rot_dim: values only */
    for (c = rot; c < hd; c += 16)
        n5_store16(yb + c * es, n5_value16(v + c, vr, wf + c, rounding, dt), dt, nt, fin);
}

/* The AVX-512 walk: every run with n5_sum and n5_out. */
FR_DEFINE_RUN(FR_N5_INLINE, n5_run, n5_sum, n5_out)
FR_DEFINE_ROWS(FR_N5_INLINE, n5_rows, n5_run)

FR_DEFINE_FWD_PICK(FR_N5_TARGET, n5, fr_norm_avx512_rows)

/*
 * The backward's passes (FR_DEFINE_NB_PASSES) with 512-bit vectors, for
 * CPUs with AVX-512 F, BW and VL (fr_avx512_usable), on rows whose rotation
 * pairs and other channels come in whole 16-channel vectors (n5_whole; the
 * others of such a call take the AVX2 rows where nt_whole, else the portable
 * loops).
 */

FR_DEFINE_ROTATE(FR_N5_INLINE, nb5_rotate16, __m512, _mm512_loadu_ps, _mm512_set1_ps, -1)

/* 32 interleaved channels (lo: 0-15, hi: 16-31) rotated back in place. */
FR_N5_INLINE void nb5_rotate32(__m512 *lo, __m512 *hi, const float *cs, const float *sn)
{
    __m512 a = _mm512_permutex2var_ps(*lo, _mm512_loadu_si512(n5_even), *hi);
    __m512 b = _mm512_permutex2var_ps(*lo, _mm512_loadu_si512(n5_odd), *hi);
    nb5_rotate16(&a, &b, cs, sn);
    *lo = _mm512_permutex2var_ps(a, _mm512_loadu_si512(n5_zip_lo), b);
    *hi = _mm512_permutex2var_ps(a, _mm512_loadu_si512(n5_zip_hi), b);
}

/* nb_dot8 with 16-channel vectors (partial l is lane l % 16 of accumulator
 * l / 16, as n5_sum's; n5_tree). */
FR_N5_INLINE float nb5_dot16(const float *dn, const float *nn, int64_t hd)
{
    __m512 s[2] = { _mm512_setzero_ps(), _mm512_setzero_ps() };
#define NB5_DOT(c) _mm512_mul_ps(_mm512_loadu_ps(dn + (c)), _mm512_loadu_ps(nn + (c)))
    FR_ROW_PARTIALS(16, s, hd, NB5_DOT, NB_DOT1);
#undef NB5_DOT
    return n5_tree(s[0], s[1]);
}

FR_N5_INLINE void nb5_store16(void *p, __m512 v, int dt)
{
    n5_store16(p, v, dt, 0, 0);
}

FR_DEFINE_NB_PASSES(FR_N5_INLINE, nb5, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
                    _mm512_set1_ps, n5_widen16, nb5_store16, nb5_rotate16, nb5_rotate32, nb5_dot16)

FR_DEFINE_BRUN(FR_N5_INLINE, nb5_run, nb5_pass_a, nb5_pass_b)

FR_DEFINE_NB_PICK(FR_N5_TARGET, nb5, fr_norm_avx512_brun)
#else
typedef int fr_no_avx512_norm; /* ISO C: a translation unit declares something */
#endif
