/*
 * cpu_norm.c - the OpenMP backend of the fused RMSNorm + RoPE
 * (fusedrope_norm_forward_qk(3)).  A row is one (token, head) of head_dim
 * channels; it is widened to floats in per-thread scratch, reduced in
 * norm_math.h's order (32 partial sums and a tree, which the CUDA kernels
 * follow), turned into the rotation's input as the rounding mode says,
 * rotated with rope_math.h's fr_rotate and narrowed once.  Every loop is a
 * simple one over floats the compiler vectorises; where the CPU has AVX2
 * and F16C the forward's rows instead take two intrinsic passes (nv_*;
 * with AVX-512 F/BW/VL 16 channels a step, n5_*), and
 * the backward's rows of whole vectors three (nb_pass_a, the dot,
 * nb_pass_b; nb5_* with AVX-512), the same bits.
 *
 * The forward splits the (token, head) rows evenly over the threads.  The
 * backward works in chunks of FUSEDROPE_NORM_DW_CHUNK tokens: a chunk's
 * rows, tokens in order and heads in order within a token, add g * n into
 * the chunk's partial weight gradient, and the partials are summed in chunk
 * order afterwards, so dw has the same bits for any thread count (and the
 * CUDA kernels', which use the same chunks and orders).
 */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "internal.h"
#include "norm_math.h"

/* ------------------------------------------------------------- row loops */

FR_CLONES static void widen(const void *x, fusedrope_dtype dt, float *f, int64_t n)
{
    if (dt == FUSEDROPE_FLOAT32) {
        memcpy(f, x, (size_t)n * sizeof(float));
    } else if (dt == FUSEDROPE_FLOAT16) {
        const uint16_t *h = x;
        for (int64_t i = 0; i < n; i++)
            f[i] = fr_half_to_float(h[i]);
    } else {
        const uint16_t *h = x;
        for (int64_t i = 0; i < n; i++)
            f[i] = fr_bf16_to_float(h[i]);
    }
}

FR_CLONES static void narrow(const float *f, void *y, fusedrope_dtype dt, int64_t n)
{
    if (dt == FUSEDROPE_FLOAT32) {
        memmove(y, f, (size_t)n * sizeof(float));
    } else if (dt == FUSEDROPE_FLOAT16) {
        uint16_t *h = y;
        for (int64_t i = 0; i < n; i++)
            h[i] = fr_float_to_half(f[i]);
    } else {
        uint16_t *h = y;
        for (int64_t i = 0; i < n; i++)
            h[i] = fr_float_to_bf16(f[i]);
    }
}

/*
 * The row sums' partial sums in norm_math.h's order, with vectors of L
 * floats (L 1: floats): s is an array of 32 / L of them (zeroed by the
 * caller), partial sum l is lane l % L of s[l / L], and it adds the terms
 * of channels l, l + 32, l + 64, ... in that order.  VTERM(c) is the vector
 * of the terms of channels c .. c + L - 1, STERM(c) the term of channel c
 * (for the row's last hd % 32).  Every CPU row sum comes through here
 * (row_dot, nv_sum, n5_sum, nb_dot8, nb5_dot16); the tree over s is the
 * caller's (fr_norm_tree32, nv_tree, n5_tree).  The partials stay in
 * registers (as an array of 32 floats gcc keeps them in memory, and the
 * loop waits on it).
 */
#define FR_ROW_PARTIALS(L, s, n, VTERM, STERM)                                                 \
    do {                                                                                       \
        int64_t c_ = 0;                                                                        \
        for (; c_ + 32 <= (n); c_ += 32)                                                       \
            for (int j_ = 0; j_ < 32 / (L); j_++)                                              \
                (s)[j_] = (s)[j_] + VTERM(c_ + j_ * (L));                                      \
        if (c_ < (n)) {                                                                        \
            float p_[32];                                                                      \
            memcpy(p_, (s), sizeof p_);                                                        \
            for (int l_ = 0; c_ + l_ < (n); l_++)                                              \
                p_[l_] = p_[l_] + STERM(c_ + l_);                                              \
            memcpy((s), p_, sizeof p_);                                                        \
        }                                                                                      \
    } while (0)

/* Sum of a[c] * b[c] over n channels in norm_math.h's order. */
#if defined(__GNUC__)
typedef float v8f __attribute__((vector_size(32)));
/* 8 floats at p (unaligned) as a v8f. */
#define V8F_LOAD(p) ({ v8f r_; memcpy(&r_, (p), sizeof r_); r_; })

FR_CLONES static float row_dot(const float *a, const float *b, int64_t n)
{
    v8f s[4] = { { 0 } };
    float p[32];
#define ROW_DOT_V(c) (V8F_LOAD(a + (c)) * V8F_LOAD(b + (c)))
#define ROW_DOT_S(c) (a[c] * b[c])
    FR_ROW_PARTIALS(8, s, n, ROW_DOT_V, ROW_DOT_S);
    memcpy(p, s, sizeof p);
    return fr_norm_tree32(p);
}
#else
static float row_dot(const float *a, const float *b, int64_t n)
{
    float p[32] = { 0 };
#define ROW_DOT_S(c) (a[c] * b[c])
    FR_ROW_PARTIALS(1, p, n, ROW_DOT_S, ROW_DOT_S);
    return fr_norm_tree32(p);
}
#endif
#undef ROW_DOT_V
#undef ROW_DOT_S

/* v[c] = the rotation's input of channel c (in place over the widened x). */
FR_CLONES static void row_values(float *v, const float *wf, float rstd, int rounding, int dt,
                                 int64_t n)
{
    switch (rounding * 3 + dt) {
#define CASE(R, D)                                              \
    case R * 3 + D:                                             \
        for (int64_t c = 0; c < n; c++)                         \
            v[c] = fr_norm_value(v[c], rstd, wf[c], R, D);      \
        break;
    CASE(0, 0) CASE(0, 1) CASE(0, 2)
    CASE(1, 0) CASE(1, 1) CASE(1, 2)
    CASE(2, 0) CASE(2, 1) CASE(2, 2)
#undef CASE
    }
}

/* The rot_dim leading channels of a float row rotated in place by the
 * token's cos/sin (sgn +1 forward, -1 the transpose). */
FR_CLONES static void row_rotate(float *v, const float *cs, const float *sn, int64_t half,
                                 int interleaved, float sgn)
{
    if (interleaved) {
        for (int64_t i = 0; i < half; i++) {
            float a, b;
            fr_rotate(v[2 * i], v[2 * i + 1], cs[i], sn[i], sgn, &a, &b);
            v[2 * i] = a;
            v[2 * i + 1] = b;
        }
    } else {
        for (int64_t i = 0; i < half; i++) {
            float a, b;
            fr_rotate(v[i], v[half + i], cs[i], sn[i], sgn, &a, &b);
            v[i] = a;
            v[half + i] = b;
        }
    }
}

/* ------------------------------------------------- AVX2 + F16C forward row */

/*
 * The forward of one row in two passes over it with x86 AVX2 and F16C, for
 * CPUs that have both (fr_avx2_usable): the first widens the row into the
 * float scratch while squaring and adding it into four 8-float accumulators
 * (partial sum l is lane l % 8 of accumulator l / 8: norm_math.h's order,
 * channel by channel); the second reads each rotation pair back, forms its
 * values, rotates and narrows them to memory, without storing a float
 * again.  The portable loops above make five passes, and their 16-bit
 * conversions cost a dozen to twenty operations per element; here fp16 is
 * one instruction per 8 and bf16 a few (as in cpu_avx2.c).
 *
 * Every result is the portable path's to the bit: each operation is the
 * portable one's in the same order, in float, without FMA (the library is
 * built with -ffp-contract=off and these are separate intrinsics); the
 * roundings are fr_norm_round_bf16's and fr_float_to_bf16's integer
 * arithmetic, and for fp16 the IEEE round-to-nearest-even conversion
 * (explicitly, whatever MXCSR says) with a NaN replaced by the converters'
 * quiet NaN of its sign first; tails shorter than a vector use
 * norm_math.h's scalar functions.  tests/test_norm.c compares both paths
 * byte for byte.
 */
#ifdef FR_HAVE_AVX2
#include <immintrin.h>

#define FR_AVX2_TARGET __attribute__((target("avx2,f16c")))
#define FR_AVX2_INLINE FR_AVX2_TARGET static inline __attribute__((always_inline))

/* 8 channels of type dt (0 float32, 1 float16, 2 bfloat16) as floats, exactly. */
FR_AVX2_INLINE __m256 nv_widen8(const void *p, int dt)
{
    if (dt == 0)
        return _mm256_loadu_ps((const float *)p);
    if (dt == 1)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* A NaN lane replaced by the quiet NaN of its sign, the one fr_float_to_half
 * writes (0x7e00 | sign), so that the conversion gives the converters' bits. */
FR_AVX2_INLINE __m256 nv_nan_for_half(__m256 v)
{
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    return _mm256_blendv_ps(v, _mm256_or_ps(_mm256_and_ps(v, sign), qnan),
                            _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/* fr_norm_round(v, dt) on 8 floats none of which is a NaN: for bfloat16
 * fr_norm_round_bf16's rounding without its NaN case (an infinity and a
 * finite value that rounds past the largest both come out infinite, as
 * there). */
FR_AVX2_INLINE __m256 nv_round8(__m256 v, int dt)
{
    const __m256i u = _mm256_castps_si256(v);
    if (dt == 0)
        return v;
    if (dt == 1)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    return _mm256_castsi256_ps(_mm256_and_si256(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))),
        _mm256_set1_epi32((int)0xffff0000u)));
}

/* fr_float_to_bf16 on 8 floats, in the low halves of the 32-bit lanes: the
 * rounded value, or for a NaN its top half with the quiet bit; fin: no lane
 * is a NaN (the caller knows), so no NaN case. */
FR_AVX2_INLINE __m256i nv_bf16_bits(__m256 v, int fin)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i rounded =
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    if (fin)
        return _mm256_srli_epi32(rounded, 16);
    return _mm256_srli_epi32(
        _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                                             _mm256_castsi256_ps(quiet),
                                             _mm256_cmp_ps(v, v, _CMP_UNORD_Q))),
        16);
}

/* fp16 bits of 8 floats (fin: none is a NaN). */
FR_AVX2_INLINE __m128i nv_half_bits(__m256 v, int fin)
{
    return _mm256_cvtps_ph(fin ? v : nv_nan_for_half(v), _MM_FROUND_TO_NEAREST_INT);
}

/* 8 channels narrowed to dt: the 16-bit types' in a 128-bit vector. */
FR_AVX2_INLINE __m128i nv_narrow8(__m256 v, int dt, int fin)
{
    if (dt == 1)
        return nv_half_bits(v, fin);
    {
        const __m256i b = nv_bf16_bits(v, fin);
        return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    }
}

/* 16 channels narrowed to a 16-bit dt: channels 0-7 in a, 8-15 in b. */
FR_AVX2_INLINE __m256i nv_narrow16(__m256 a, __m256 b, int dt, int fin)
{
    if (dt == 1)
        return _mm256_set_m128i(nv_half_bits(b, fin), nv_half_bits(a, fin));
    return _mm256_permute4x64_epi64(
        _mm256_packus_epi32(nv_bf16_bits(a, fin), nv_bf16_bits(b, fin)), 0xd8);
}

/* The same where the channels lie across 128-bit halves: 0-3 in l's low
 * half, 4-7 in h's low half, 8-11 in l's high half, 12-15 in h's high
 * half (an unpacklo/unpackhi pair's order: no permutation for bfloat16). */
FR_AVX2_INLINE __m256i nv_narrow16_lanes(__m256 l, __m256 h, int dt, int fin)
{
    if (dt == 1) {
        const __m128i a = nv_half_bits(l, fin), b = nv_half_bits(h, fin);
        return _mm256_set_m128i(_mm_unpackhi_epi64(a, b), _mm_unpacklo_epi64(a, b));
    }
    return _mm256_packus_epi32(nv_bf16_bits(l, fin), nv_bf16_bits(h, fin));
}

/* 16 narrowed 16-bit channels stored at p: unaligned, or with nt
 * non-temporal (p 16-byte aligned). */
FR_AVX2_INLINE void nv_store16(void *p, __m256i b, int nt)
{
    if (nt) {
        _mm_stream_si128((__m128i *)p, _mm256_castsi256_si128(b));
        _mm_stream_si128((__m128i *)p + 1, _mm256_extracti128_si256(b, 1));
    } else {
        _mm256_storeu_si256((__m256i *)p, b);
    }
}

/* 8 channels narrowed to dt and stored at p: unaligned, or with nt
 * non-temporal (p 16-byte aligned). */
FR_AVX2_INLINE void nv_store8(void *p, __m256 v, int dt, int nt, int fin)
{
    if (dt == 0 && nt) {
        _mm_stream_ps((float *)p, _mm256_castps256_ps128(v));
        _mm_stream_ps((float *)p + 4, _mm256_extractf128_ps(v, 1));
    } else if (dt == 0) {
        _mm256_storeu_ps((float *)p, v);
    } else if (nt) {
        _mm_stream_si128((__m128i *)p, nv_narrow8(v, dt, fin));
    } else {
        _mm_storeu_si128((__m128i *)p, nv_narrow8(v, dt, fin));
    }
}

/* fr_norm_value on 8 channels, for a row whose rstd and weight factors
 * are finite (the caller's condition): then no value is a NaN at any of its
 * roundings.  |n| <= sqrt(head_dim) (1 + a few ulps), or below 1 where the
 * sum is 0 (each x^2 then rounded to 0, |x| < 2^-75, and
 * rstd = 1/sqrt(eps) < 2^75), so n and its rounding are finite, even in
 * float16; a finite n times a finite w' is finite or infinite, never NaN.
 * The roundings need no NaN case. */
FR_AVX2_INLINE __m256 nv_value8(__m256 x, __m256 rstd, __m256 wf, int rounding, int dt)
{
    __m256 y;
    FR_NORM_VALUE(y, x, rstd, wf, rounding, dt, nv_round8);
    return y;
}

/* NAME: fr_rotate with sgn SGN on the pairs (a, b) of vectors of type V:
 * -1 (the backward) multiplies s by -1.0f as fr_rotate does; 1 (the
 * forward) leaves s as it is (fr_rotate's s * 1.0f is s, but for a
 * signalling NaN, which the products it enters quieten just the same).
 * The same products and sums, with GCC's vector operators (FMA contraction
 * off), for the forward's and the backward's rows at either width. */
#define FR_DEFINE_ROTATE(ATTR, NAME, V, LOAD, SET1, SGN)                                      \
    ATTR void NAME(V *a, V *b, const float *cs, const float *sn)                              \
    {                                                                                         \
        const V c = LOAD(cs);                                                                 \
        V ss = LOAD(sn);                                                                      \
        if ((SGN) < 0)                                                                        \
            ss = ss * SET1(-1.0f);                                                            \
        const V ra = *a * c - *b * ss, rb = *b * c + *a * ss;                                 \
        *a = ra;                                                                              \
        *b = rb;                                                                              \
    }
FR_DEFINE_ROTATE(FR_AVX2_INLINE, nv_rotate8, __m256, _mm256_loadu_ps, _mm256_set1_ps, 1)

/* Scalar tails: channel c's value, narrowed and stored. */
FR_AVX2_INLINE void nv_store1(void *y, int64_t c, float v, int dt)
{
    if (dt == 0)
        ((float *)y)[c] = v;
    else if (dt == 1)
        ((uint16_t *)y)[c] = fr_float_to_half(v);
    else
        ((uint16_t *)y)[c] = fr_float_to_bf16(v);
}

FR_AVX2_INLINE float nv_widen1(const void *x, int64_t c, int dt)
{
    return dt == 0 ? ((const float *)x)[c]
         : dt == 1 ? fr_half_to_float(((const uint16_t *)x)[c])
                   : fr_bf16_to_float(((const uint16_t *)x)[c]);
}

/* fr_norm_tree32 over the partial sums in four accumulators (partial sum l
 * lane l % 8 of accumulator l / 8): off 16 (p[l] + p[l + 16]) and 8 as
 * whole vectors, then 4, 2 and 1 within one. */
FR_AVX2_INLINE float nv_tree(__m256 s0, __m256 s1, __m256 s2, __m256 s3)
{
    const __m256 t = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    u = _mm_add_ss(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 1, 1, 1)));
    return _mm_cvtss_f32(u);
}

/* Pass 1 of a row of hd channels of dt: x widened into v, and the sum of
 * the squares in norm_math.h's order. */
FR_AVX2_INLINE float nv_sum(const void *x, float *v, int64_t hd, int dt)
{
    const int64_t es = dt == 0 ? 4 : 2;
    const char *xb = x;
    __m256 s[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                    _mm256_setzero_ps() };
#define NV_SQ(c) ({ const __m256 x_ = nv_widen8(xb + (c) * es, dt); \
                    _mm256_storeu_ps(v + (c), x_);                  \
                    _mm256_mul_ps(x_, x_); })
#define NV_SQ1(c) ({ const float f_ = nv_widen1(x, c, dt); v[c] = f_; f_ * f_; })
    FR_ROW_PARTIALS(8, s, hd, NV_SQ, NV_SQ1);
#undef NV_SQ
    return nv_tree(s[0], s[1], s[2], s[3]);
}

/* Pass 2 of a row: the values of v's channels for rstd, the first 2 * half
 * rotated, narrowed to y (which may be the row's input: pass 1 has read it).
 * Only for rows that nv_value8 takes (finite rstd and weight factors).
 * nt: y is streamed, 16-byte aligned, and the row has no scalar tail
 * (nt_whole).  fin: no rotated value is a NaN (fwd_fin), so the 16-bit
 * narrowings need no NaN case.  16-bit types narrow 16 channels at a time
 * (one pack and one 32-byte store). */
FR_AVX2_INLINE void nv_out(const float *v, void *y, const float *wf, const float *cs,
                           const float *sn, int64_t hd, int64_t half, float rstd, int rounding,
                           int dt, int interleaved, int nt, int fin)
{
    const int64_t es = dt == 0 ? 4 : 2, rot = 2 * half;
    const __m256 vr = _mm256_set1_ps(rstd);
    char *yb = y;
    int64_t c, i = 0;

    if (interleaved) {
        for (; 2 * i + 16 <= rot; i += 8) {
            const __m256 lo = nv_value8(_mm256_loadu_ps(v + 2 * i), vr,
                                        _mm256_loadu_ps(wf + 2 * i), rounding, dt);
            const __m256 hi = nv_value8(_mm256_loadu_ps(v + 2 * i + 8), vr,
                                        _mm256_loadu_ps(wf + 2 * i + 8), rounding, dt);
            /* even channels to a, odd to b, in pair order */
            __m256 a = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8));
            __m256 b = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), 0xd8));
            __m256 l, h;
            nv_rotate8(&a, &b, cs + i, sn + i);
            l = _mm256_unpacklo_ps(a, b);
            h = _mm256_unpackhi_ps(a, b);
            if (dt == 0) {
                nv_store8(yb + 2 * i * es, _mm256_permute2f128_ps(l, h, 0x20), dt, nt, fin);
                nv_store8(yb + (2 * i + 8) * es, _mm256_permute2f128_ps(l, h, 0x31), dt, nt, fin);
            } else {
                nv_store16(yb + 2 * i * es, nv_narrow16_lanes(l, h, dt, fin), nt);
            }
        }
        for (; i < half; i++) {
            float ra, rb;
            fr_rotate(fr_norm_value(v[2 * i], rstd, wf[2 * i], rounding, dt),
                      fr_norm_value(v[2 * i + 1], rstd, wf[2 * i + 1], rounding, dt), cs[i],
                      sn[i], 1.0f, &ra, &rb);
            nv_store1(y, 2 * i, ra, dt);
            nv_store1(y, 2 * i + 1, rb, dt);
        }
    } else {
        for (; dt != 0 && i + 16 <= half; i += 16) {
            __m256 a0 = nv_value8(_mm256_loadu_ps(v + i), vr, _mm256_loadu_ps(wf + i), rounding, dt);
            __m256 b0 = nv_value8(_mm256_loadu_ps(v + half + i), vr, _mm256_loadu_ps(wf + half + i),
                                  rounding, dt);
            __m256 a1 = nv_value8(_mm256_loadu_ps(v + i + 8), vr, _mm256_loadu_ps(wf + i + 8),
                                  rounding, dt);
            __m256 b1 = nv_value8(_mm256_loadu_ps(v + half + i + 8), vr,
                                  _mm256_loadu_ps(wf + half + i + 8), rounding, dt);
            nv_rotate8(&a0, &b0, cs + i, sn + i);
            nv_rotate8(&a1, &b1, cs + i + 8, sn + i + 8);
            nv_store16(yb + i * es, nv_narrow16(a0, a1, dt, fin), nt);
            nv_store16(yb + (half + i) * es, nv_narrow16(b0, b1, dt, fin), nt);
        }
        for (; i + 8 <= half; i += 8) {
            __m256 a = nv_value8(_mm256_loadu_ps(v + i), vr, _mm256_loadu_ps(wf + i), rounding, dt);
            __m256 b = nv_value8(_mm256_loadu_ps(v + half + i), vr, _mm256_loadu_ps(wf + half + i),
                                 rounding, dt);
            nv_rotate8(&a, &b, cs + i, sn + i);
            nv_store8(yb + i * es, a, dt, nt, fin);
            nv_store8(yb + (half + i) * es, b, dt, nt, fin);
        }
        for (; i < half; i++) {
            float ra, rb;
            fr_rotate(fr_norm_value(v[i], rstd, wf[i], rounding, dt),
                      fr_norm_value(v[half + i], rstd, wf[half + i], rounding, dt), cs[i], sn[i],
                      1.0f, &ra, &rb);
            nv_store1(y, i, ra, dt);
            nv_store1(y, half + i, rb, dt);
        }
    }
    /* the channels past rot_dim: values only */
    for (c = rot; c + 8 <= hd; c += 8)
        nv_store8(yb + c * es,
                  nv_value8(_mm256_loadu_ps(v + c), vr, _mm256_loadu_ps(wf + c), rounding, dt), dt,
                  nt, fin);
    for (; c < hd; c++)
        nv_store1(y, c, fr_norm_value(v[c], rstd, wf[c], rounding, dt), dt);
}

/* Whether a row's rotation pairs and other channels come in whole vectors:
 * nv_out can then stream it (every store a whole vector at a multiple of 8
 * channels), and the backward's AVX2 rows take it. */
static int nt_whole(int64_t hd, int64_t half, int interleaved)
{
    return (interleaved ? (2 * half) % 16 == 0 : half % 8 == 0) && (hd - 2 * half) % 8 == 0;
}
#endif /* FR_HAVE_AVX2 */

/* ---------------------------------------------- AVX-512 forward row (n5_*) */

/*
 * The AVX2 forward row's two passes with 512-bit vectors, for CPUs with
 * AVX-512 F, BW and VL (fr_avx512_usable), on rows whose rotation pairs and
 * other channels come in whole 16-channel vectors (n5_whole; the others of
 * such a call take the AVX2 rows).  The bits are the AVX2 rows', lane by
 * lane: the same operations in the same order, in float, without FMA.  The
 * row sum keeps norm_math.h's 32 partial sums: partial l is lane l % 16 of
 * accumulator l / 16 (the AVX2 rows' accumulators 0-1 and 2-3 side by
 * side), and the tree adds the two (off 16), then the 256-bit halves (off
 * 8), then as nv_tree.  The bf16 roundings keep the integer arithmetic (not
 * vcvtneps2bf16, which flushes subnormal inputs to zero); a mask adds the
 * rounding's odd bit (cpu_avx512.c's bf16_high).
 */
#ifdef FR_HAVE_AVX512
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

/* Whether a row's rotation pairs and other channels come in whole 16-channel
 * vectors (n5_out's rows). */
static int n5_whole(int64_t hd, int64_t half, int interleaved)
{
    return (interleaved ? (2 * half) % 32 == 0 : half % 16 == 0) && (hd - 2 * half) % 16 == 0;
}
#endif /* FR_HAVE_AVX512 */

/* wf[c] = w' of channel c for a weight array of dtype wdt (or 1). */
static void weight_factors(const fr_norm_args *na, int slot, int64_t hd, float *wf)
{
    if (na->weight == FUSEDROPE_NORM_WEIGHT_NONE) {
        for (int64_t c = 0; c < hd; c++)
            wf[c] = 1.0f;
        return;
    }
    widen(na->w[slot], na->wdtype, wf, hd);
    for (int64_t c = 0; c < hd; c++)
        wf[c] = fr_norm_wf(na->weight, wf[c]);
}

/* cos/sin of token (b, s): a 1D table's row, or gathered (position axes:
 * each pair at its axis's position and its frequency column) or computed
 * into row_c/row_s, pair by pair as rope_math.h's fr_pair_cos_sin says. */
static void token_angles(const fusedrope_cache *cache, const fr_pos_args *pos, int64_t b,
                         int64_t s, float *row_c, float *row_s, const float **cs,
                         const float **sn)
{
    const int64_t half = cache->rot_dim / 2;
    int64_t pax[FUSEDROPE_MAX_AXES];
    int bad = 0; /* positions are checked on the host */
    pax[0] = fr_token_position(pos, b, s, &bad);
    if (cache->max_positions > 0 && !cache->pair_map) {
        *cs = cache->cos + pax[0] * half;
        *sn = cache->sin + pax[0] * half;
        return;
    }
    for (int a = 1; a < FUSEDROPE_MAX_AXES; a++)
        pax[a] = a < pos->num_axes ? fr_token_axis_position(pos, b, s, a, pax[0], &bad) : pax[0];
    for (int64_t i = 0; i < half; i++) {
        const int32_t e = cache->pair_map ? cache->pair_map[i] : (int32_t)(i << 2);
        fr_pair_cos_sin(cache->max_positions > 0 ? cache->cos : NULL, cache->sin,
                        cache->inv_freq, cache->attention_factor, half, pax[fr_map_axis(e)],
                        fr_map_col(e), &row_c[i], &row_s[i]);
    }
    *cs = row_c;
    *sn = row_s;
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Large outputs are streamed (internal.h, fr_streamable): the norm's rows
 * are assembled in L1, then written past the cache. */

/* ----------------------------------------------------------------- forward */

/* A forward call's constants, shared by its threads. */
typedef struct {
    const fr_norm_args *na;
    float *scratch;          /* per thread `per` floats, then the weight factors */
    size_t per, es;
    int64_t hdmax, half, heads0, heads, items;
    const float *wf[2];      /* per io slot: the weight factors */
    int stream[2];           /* its output is streamed (fr_streamable) */
    int direct[2];           /* ... by nv_out itself, from the registers (else via `stage`) */
    int wf_ok[2];            /* its weight factors are finite */
    int fin[2];              /* fwd_fin: no AVX2 row of it rotates to a NaN */
    int w16[2];              /* its rows take the AVX-512 passes (n5_whole) */
    uintptr_t ahead[2];      /* bytes from a row's input to the one prefetched (FWD_AHEAD_BYTES) */
} fwd_call;

/* Rows of floats in a thread's scratch: the vector rows' three in flight
 * (FR_DEFINE_RUN; the portable rows use two of them). */
enum { FWD_V_ROWS = 3 };
_Static_assert(FWD_V_ROWS == 3, "FR_DEFINE_RUN's rows v, v1 and v2 are the scratch's FWD_V_ROWS");

/* The vector rows prefetch the input of the same head of a later token,
 * at least this many bytes of the slot's tokens ahead, with each row's first
 * pass, in calls whose inputs lie past the caches (fr_beyond_cache).  The
 * hardware prefetchers alone left the fused rows ~30% slower than the plain
 * rotation of the same bytes on two threads (bench/RESULTS.md). */
enum { FWD_AHEAD_BYTES = 8192 };

/* A row between its two passes. */
typedef struct {
    const float *cs, *sn; /* its token's angles */
    float *v;             /* its channels as floats */
    const char *x;        /* its input */
    char *y;              /* its output */
    float *rstd;          /* where its rstd goes, or NULL */
    int64_t hd;           /* its head_dim */
    int k;                /* its io slot */
    float sum;            /* its sum of squares */
} fwd_row;

/* A thread's walk over its rows: the next row's token t and head hh, and
 * the token whose angles are in its buffers. */
typedef struct {
    int64_t t, hh, b, s, token;
    float *mine;  /* the thread's scratch */
    char *stage;  /* a streamed row, assembled before fr_stream_row */
} fwd_walk;

/* The next row's addresses and angles into r (prev: the row before it, whose
 * angles r shares when of the same token); the walk moves on a row. */
static inline __attribute__((always_inline)) void fwd_begin(const fwd_call *fc, fwd_walk *w, int64_t n, fwd_row *r,
                             const fwd_row *prev)
{
    const fr_apply_args *a = &fc->na->a;
    const int k = w->hh >= fc->heads0;
    const fr_io *io = &a->io[k];
    const int64_t h = w->hh - (k ? fc->heads0 : 0);
    if (w->t != w->token) {
        /* token t's angles in buffer t % 2: row n - 1 is of token t - 1 or
         * t, whose buffer stays */
        float *row_c = w->mine + FWD_V_ROWS * fc->hdmax + (w->t & 1) * a->cache->rot_dim;
        w->b = w->t / a->seq_len;
        w->s = w->t % a->seq_len;
        token_angles(a->cache, &a->pos, w->b, w->s, row_c, row_c + fc->half, &r->cs, &r->sn);
        w->token = w->t;
    } else {
        r->cs = prev->cs;
        r->sn = prev->sn;
    }
    r->k = k;
    r->hd = io->head_dim;
    r->v = w->mine + (n & 1) * fc->hdmax;
    r->rstd = fc->na->rstd[k] ? &fc->na->rstd[k][w->t * io->heads + h] : NULL;
    r->x = (const char *)io->in + (size_t)(w->s * io->in_ss + w->b * io->in_sb + h * io->in_sh) * fc->es;
    r->y = (char *)io->out + (size_t)(w->s * io->out_ss + w->b * io->out_sb + h * io->out_sh) * fc->es;
    if (++w->hh == fc->heads) {
        w->hh = 0;
        w->t++;
    }
}

/* Pass 2 of a row on the portable loops, into dst. */
static void fwd_out_portable(const fwd_call *fc, const fwd_row *r, float rstd, char *dst)
{
    const fr_norm_args *na = fc->na;
    row_values(r->v, fc->wf[r->k], rstd, na->rounding, (int)na->a.dtype, r->hd);
    row_rotate(r->v, r->cs, r->sn, fc->half, na->a.interleaved, 1.0f);
    narrow(r->v, dst, na->a.dtype, r->hd);
}

/* After pass 2 into dst: a staged row streamed out, and the rstd stored. */
static inline __attribute__((always_inline)) void fwd_end(const fwd_call *fc, const fwd_row *r, float rstd, const char *dst)
{
#ifdef __SSE2__
    if (dst != r->y)
        fr_stream_row(r->y, dst, (size_t)r->hd * fc->es);
#else
    (void)fc;
    (void)dst;
#endif
    if (r->rstd)
        *r->rstd = rstd;
}

/*
 * Each thread's rows are software-pipelined: row n's first pass (widen,
 * sum of squares) is done before row n - 1's second pass (values,
 * rotation, narrowing).  Between a row's sum and its rstd lie a chain of
 * dependent additions, a division and a square root (~60 cycles) that
 * the second pass waits on; issued a row earlier, they are done by then
 * (one pass after the other costs ~45% more time on a 128-channel row,
 * bench/RESULTS.md).
 */
static void fwd_rows_portable(const fwd_call *fc, fwd_walk *w, int64_t n0, int64_t n1)
{
    fwd_row rows[2];
    for (int64_t n = n0; n <= n1; n++) {
        if (n < n1) {
            fwd_row *r = &rows[n & 1];
            fwd_begin(fc, w, n, r, &rows[(n - 1) & 1]);
            widen(r->x, fc->na->a.dtype, r->v, r->hd);
            r->sum = row_dot(r->v, r->v, r->hd);
        }
        if (n > n0) {
            const fwd_row *r = &rows[(n - 1) & 1];
            const float rstd = fr_norm_rstd(r->sum, r->hd, fc->na->eps);
            char *dst = fc->stream[r->k] ? w->stage : r->y;
            fwd_out_portable(fc, r, rstd, dst);
            fwd_end(fc, r, rstd, dst);
        }
    }
}

#ifdef FR_HAVE_AVX2
/* NAME: rows h0..h1-1 of io slot k of one token (b, s, t) with the passes
 * SUM and OUT (nv_run: the AVX2 ones; n5_run: the AVX-512 ones); its mode
 * and types constants.  Within the run the first pass and the rstd run two
 * rows ahead of the second pass (row h + 2's before row h's): the chain from
 * a row's loads through its sum's tree, the division and the square root
 * (~75 cycles) is longer than a row's work with vector rows, so one row
 * ahead left the second pass waiting (bench/RESULTS.md).  Rows with a NaN
 * or an infinity on the way take the portable loops: the same bits.  A
 * macro, as the two targets' functions cannot inline into each other's
 * shared body. */
#define FR_DEFINE_RUN(ATTR, NAME, SUM, OUT)                                                       \
ATTR void NAME(const fwd_call *fc, float *mine, char *stage, int k, int64_t b,                    \
               int64_t s, int64_t t, int64_t h0, int64_t h1, const float *cs,                     \
               const float *sn, int R, int D, int I)                                              \
{                                                                                                 \
    const fr_norm_args *na = fc->na;                                                              \
    const fr_io *io = &na->a.io[k];                                                               \
    const int64_t hd = io->head_dim, half = fc->half, es = D == 0 ? 4 : 2;                        \
    const float eps = na->eps, *wf = fc->wf[k];                                                   \
    const int direct = fc->direct[k], stream = fc->stream[k], fin = D != 0 && fc->fin[k];         \
    const int ok = fc->wf_ok[k];                                                                  \
    const int64_t xstep = io->in_sh * es, ystep = io->out_sh * es;                                \
    const uintptr_t ahead = fc->ahead[k];                                                         \
    const char *x = (const char *)io->in + (s * io->in_ss + b * io->in_sb + h0 * io->in_sh) * es; \
    char *y = (char *)io->out + (s * io->out_ss + b * io->out_sb + h0 * io->out_sh) * es;         \
    float *rp = na->rstd[k] ? na->rstd[k] + t * io->heads + h0 : NULL;                            \
    float *v = mine, *v1 = mine + fc->hdmax, *v2 = mine + 2 * fc->hdmax; /* FWD_V_ROWS rows */   \
    float sum = SUM(x, v, hd, D), sum1 = 0.0f;                                                    \
    float rstd = fr_norm_rstd(sum, hd, eps), rstd1 = 0.0f;                                        \
                                                                                                  \
    if (h0 + 1 < h1) {                                                                            \
        sum1 = SUM(x + xstep, v1, hd, D);                                                         \
        rstd1 = fr_norm_rstd(sum1, hd, eps);                                                      \
    }                                                                                             \
    for (int64_t h = h0; h < h1; h++) {                                                           \
        char *dst = stream && !direct ? stage : y;                                                \
        float sum2 = 0.0f, rstd2 = 0.0f, *tmp;                                                    \
        if (h + 2 < h1) { /* row h + 2's first pass before row h's second */                      \
            sum2 = SUM(x + 2 * xstep, v2, hd, D);                                                 \
            rstd2 = fr_norm_rstd(sum2, hd, eps);                                                  \
        }                                                                                         \
        /* a later token's row h (an address: it may lie past the tensor) */                      \
        if (ahead)                                                                                \
            for (int64_t l = 0; l < hd * es; l += FR_LINE_BYTES)                                  \
                __builtin_prefetch((const void *)((uintptr_t)x + ahead + (uintptr_t)l));          \
        /* a finite sum makes a finite rstd (eps > 0) */                                          \
        if (__builtin_expect(isfinite(sum) && ok, 1)) {                                           \
            if (fin) {                                                                            \
                if (direct)                                                                       \
                    OUT(v, dst, wf, cs, sn, hd, half, rstd, R, D, I, 1, 1);                       \
                else                                                                              \
                    OUT(v, dst, wf, cs, sn, hd, half, rstd, R, D, I, 0, 1);                       \
            } else {                                                                              \
                if (direct)                                                                       \
                    OUT(v, dst, wf, cs, sn, hd, half, rstd, R, D, I, 1, 0);                       \
                else                                                                              \
                    OUT(v, dst, wf, cs, sn, hd, half, rstd, R, D, I, 0, 0);                       \
            }                                                                                     \
        } else {                                                                                  \
            fwd_row r;                                                                            \
            r.cs = cs;                                                                            \
            r.sn = sn;                                                                            \
            r.v = v;                                                                              \
            r.hd = hd;                                                                            \
            r.k = k;                                                                              \
            if (stream)                                                                           \
                dst = stage;                                                                      \
            fwd_out_portable(fc, &r, rstd, dst);                                                  \
        }                                                                                         \
        if (dst != y)                                                                             \
            fr_stream_row(y, dst, (size_t)hd * (size_t)es);                                       \
        if (rp)                                                                                   \
            *rp++ = rstd;                                                                         \
        x += xstep;                                                                               \
        y += ystep;                                                                               \
        sum = sum1;                                                                               \
        rstd = rstd1;                                                                             \
        sum1 = sum2;                                                                              \
        rstd1 = rstd2;                                                                            \
        tmp = v;                                                                                  \
        v = v1;                                                                                   \
        v1 = v2;                                                                                  \
        v2 = tmp;                                                                                 \
    }                                                                                             \
}
FR_DEFINE_RUN(FR_AVX2_INLINE, nv_run, nv_sum, nv_out)

/* NAME: a thread's rows n0..n1-1 (row n: head n % heads of token n / heads)
 * in runs of one token and one io slot, each by RUN. */
#define FR_DEFINE_ROWS(ATTR, NAME, RUN)                                                          \
ATTR void NAME(const fwd_call *fc, fwd_walk *w, int64_t n0, int64_t n1, int R, int D, int I)     \
{                                                                                                \
    const fr_apply_args *a = &fc->na->a;                                                         \
    const int64_t heads = fc->heads, heads0 = fc->heads0;                                        \
    float *row_c = w->mine + FWD_V_ROWS * fc->hdmax;                                             \
    int64_t n = n0, hh = w->hh, t = w->t;                                                        \
    while (n < n1) {                                                                             \
        const int64_t b = t / a->seq_len, s = t % a->seq_len;                                    \
        const int64_t end = heads - hh < n1 - n ? heads : hh + (n1 - n);                         \
        const float *cs, *sn;                                                                    \
        token_angles(a->cache, &a->pos, b, s, row_c, row_c + fc->half, &cs, &sn);                \
        if (hh < heads0)                                                                         \
            RUN(fc, w->mine, w->stage, 0, b, s, t, hh, end < heads0 ? end : heads0, cs, sn, R,   \
                   D, I);                                                                        \
        if (end > heads0)                                                                        \
            RUN(fc, w->mine, w->stage, 1, b, s, t, (hh > heads0 ? hh : heads0) - heads0,         \
                   end - heads0, cs, sn, R, D, I);                                               \
        n += end - hh;                                                                           \
        hh = 0;                                                                                  \
        t++;                                                                                     \
    }                                                                                            \
}
FR_DEFINE_ROWS(FR_AVX2_INLINE, nv_rows, nv_run)

typedef void (*nv_rows_fn)(const fwd_call *, fwd_walk *, int64_t, int64_t);

/* PFX##_rows_RDI (rounding R, dtype D, interleaved I): PFX##_rows with
 * TARGET and its modes constants, and PFX##_pick_rows, which picks one. */
#define FR_FWD_ROWS1(TARGET, PFX, R, D, I)                                                    \
    TARGET static void PFX##_rows_##R##D##I(const fwd_call *fc, fwd_walk *w, int64_t n0,      \
                                            int64_t n1)                                       \
    {                                                                                         \
        PFX##_rows(fc, w, n0, n1, R, D, I);                                                   \
    }
#define FR_FWD_ROWS2(TARGET, PFX, R, D)                                                       \
    FR_FWD_ROWS1(TARGET, PFX, R, D, 0) FR_FWD_ROWS1(TARGET, PFX, R, D, 1)
#define FR_FWD_ROWS6(TARGET, PFX, R)                                                          \
    FR_FWD_ROWS2(TARGET, PFX, R, 0) FR_FWD_ROWS2(TARGET, PFX, R, 1)                           \
    FR_FWD_ROWS2(TARGET, PFX, R, 2)
#define FR_FWD_FNS2(PFX, R, D) { PFX##_rows_##R##D##0, PFX##_rows_##R##D##1 }
#define FR_FWD_FNS6(PFX, R) { FR_FWD_FNS2(PFX, R, 0), FR_FWD_FNS2(PFX, R, 1), FR_FWD_FNS2(PFX, R, 2) }
#define FR_DEFINE_FWD_PICK(TARGET, PFX)                                                       \
    FR_FWD_ROWS6(TARGET, PFX, 0) FR_FWD_ROWS6(TARGET, PFX, 1) FR_FWD_ROWS6(TARGET, PFX, 2)    \
    static nv_rows_fn PFX##_pick_rows(int rounding, int dt, int interleaved)                  \
    {                                                                                         \
        static const nv_rows_fn fns[3][3][2] = { FR_FWD_FNS6(PFX, 0), FR_FWD_FNS6(PFX, 1),    \
                                                 FR_FWD_FNS6(PFX, 2) };                       \
        return fns[rounding][dt][!!interleaved];                                              \
    }
FR_DEFINE_FWD_PICK(FR_AVX2_TARGET, nv)
#endif /* FR_HAVE_AVX2 */

#ifdef FR_HAVE_AVX512
/* The AVX-512 walk: n5_whole slots' runs with n5_sum and n5_out, the
 * others' with the AVX2 passes. */
FR_DEFINE_RUN(FR_N5_INLINE, n5_run, n5_sum, n5_out)
#define N5_RUN(fc, mine, stage, k, ...)                                                      \
    ((fc)->w16[k] ? n5_run(fc, mine, stage, k, __VA_ARGS__)                                  \
                  : nv_run(fc, mine, stage, k, __VA_ARGS__))
FR_DEFINE_ROWS(FR_N5_INLINE, n5_rows, N5_RUN)
#undef N5_RUN

FR_DEFINE_FWD_PICK(FR_N5_TARGET, n5)
#endif /* FR_HAVE_AVX512 */

/* Whether no AVX2 row of slot k can rotate to a NaN, so that nv_out's
 * narrowings may leave out their NaN case.  Such a row has a finite sum and
 * rstd, so |n| <= sqrt(head_dim) (1 + a few ulps) < 2 sqrt(head_dim) (see
 * nv_value8); with |w'| <= wmax every value before the rotation is at most
 * 2 sqrt(head_dim) wmax (1 + 2^-7 per rounding) and finite if that is below
 * 2^100, or below 32768 where it is rounded to float16 (whose largest is
 * 65504).  The angles of a cache built from a config are cos and sin times
 * its attention factor, at most 2^20 here (a user's table may hold
 * anything), so each rotated value is below 2^122: finite, never NaN. */
static int fwd_fin(const fr_norm_args *na, const float *wf, int64_t hd)
{
    const fusedrope_cache *cache = na->a.cache;
    double wmax = 0.0;
    for (int64_t c = 0; c < hd; c++)
        wmax = fabs((double)wf[c]) > wmax ? fabs((double)wf[c]) : wmax;
    if (!cache->inv_freq || !(cache->attention_factor <= 0x1p20) || !(wmax < 0x1p100))
        return 0;
    return 2.0 * sqrt((double)hd) * wmax <
           (na->a.dtype == FUSEDROPE_FLOAT16 && na->rounding != FR_ROUND_ONCE ? 32768.0
                                                                               : 0x1p100);
}

fusedrope_status fr_cpu_norm_forward(const fr_norm_args *na)
{
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    const int64_t tokens = a->seq_len * a->batch;
    int64_t elems = 0;
    int nth;
    fwd_call fc;
    float *wf[2] = { NULL, NULL };
    void *block;
    size_t bytes;
#ifdef FR_HAVE_AVX2
    nv_rows_fn avx2_rows =
        fr_avx2_usable() ? nv_pick_rows(na->rounding, (int)a->dtype, a->interleaved) : NULL;
#endif
#ifdef FR_HAVE_AVX512
    const int avx512 = fr_avx512_usable();
    if (avx512)
        avx2_rows = n5_pick_rows(na->rounding, (int)a->dtype, a->interleaved);
#endif

    memset(&fc, 0, sizeof fc);
    fc.na = na;
    fc.half = cache->rot_dim / 2;
    fc.es = fr_dtype_size(a->dtype);
    fc.heads0 = a->io[0].heads;
    fc.heads = fc.heads0 + (a->count > 1 ? a->io[1].heads : 0);
    fc.items = tokens * fc.heads;
    for (int k = 0; k < a->count; k++) {
        fc.hdmax = a->io[k].head_dim > fc.hdmax ? a->io[k].head_dim : fc.hdmax;
        elems += tokens * a->io[k].heads * a->io[k].head_dim;
        fc.stream[k] = fr_streamable(&a->io[k], fc.es, tokens, SIZE_MAX);
#ifdef FR_HAVE_AVX2
        fc.direct[k] = avx2_rows && fc.stream[k] && nt_whole(a->io[k].head_dim, fc.half, a->interleaved);
#endif
#ifdef FR_HAVE_AVX512
        fc.w16[k] = avx512 && n5_whole(a->io[k].head_dim, fc.half, a->interleaved);
#endif
        {
            /* the walk's next token is s + 1, or the next batch entry's where
             * seq_len is 1; prefetches never fault, so a last token's may
             * point past the tensor (unsigned: the address may wrap) */
            const int64_t tb = a->io[k].heads * a->io[k].head_dim * (int64_t)fc.es;
            const int64_t n = a->seq_len > 1 ? a->seq_len : a->batch;
            int64_t ahead = tb ? (FWD_AHEAD_BYTES + tb - 1) / tb : 1;
            ahead = ahead < n ? ahead : n;
            fc.ahead[k] = (uintptr_t)ahead * (uintptr_t)fc.es *
                          (uintptr_t)(a->seq_len > 1 ? a->io[k].in_ss : a->io[k].in_sb);
        }
    }
    /* a call's input in the cache needs no prefetches (they cost ~4% a row) */
    if (!fr_beyond_cache((uint64_t)elems * fc.es))
        fc.ahead[0] = fc.ahead[1] = 0;
    /* per thread: FWD_V_ROWS rows of floats and two tokens' cos and sin
     * (table-less caches), for the rows in flight, and a streamed output row
     * (hdmax elements of at most 4 bytes) */
    fc.per = (size_t)fr_line_floats((FWD_V_ROWS + 1) * fc.hdmax + 2 * cache->rot_dim); /* (see the backward) */
    nth = fr_cpu_team_size(cache, elems);
    bytes = ((size_t)nth * fc.per + 2 * (size_t)fr_line_floats(fc.hdmax)) * sizeof(float) +
            FR_LINE_BYTES;
    block = malloc(bytes);
    if (!block)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "the norm's row scratch (%zu bytes) could not be "
                       "allocated", bytes);
    fc.scratch = fr_line_start(block);
    for (int k = 0; k < a->count; k++) {
        fr_fpenv fpenv; /* 1 + w rounds as the default environment says */
        wf[k] = fc.scratch + (size_t)nth * fc.per + (size_t)k * (size_t)fr_line_floats(fc.hdmax);
        fr_fpenv_enter(&fpenv);
        weight_factors(na, k, a->io[k].head_dim, wf[k]);
        fr_fpenv_leave(&fpenv);
        fc.wf[k] = wf[k];
        fc.wf_ok[k] = 1;
        for (int64_t c = 0; c < a->io[k].head_dim; c++)
            fc.wf_ok[k] &= isfinite(wf[k][c]) != 0;
        fc.fin[k] = fc.wf_ok[k] && fwd_fin(na, wf[k], a->io[k].head_dim);
    }

#ifdef _OPENMP
#pragma omp parallel num_threads(nth) if (nth > 1)
#endif
    {
        int threads = 1;
        const int id = thread_id();
        int64_t n0, n1;
        fwd_walk w;
        fr_fpenv fpenv; /* this thread's, restored at the end (internal.h) */
        fr_fpenv_enter(&fpenv);
#ifdef _OPENMP
        threads = omp_get_num_threads();
#endif
        if (id == 0) /* the test hook, as fr_cpu_apply sets it */
            fr_cpu_team = nth > 1 ? threads : 0;
        fr_thread_share(fc.items, threads, id, &n0, &n1);
        w.mine = fc.scratch + (size_t)id * fc.per;
        w.stage = (char *)(w.mine + FWD_V_ROWS * fc.hdmax + 2 * cache->rot_dim);
        w.t = fc.heads ? n0 / fc.heads : 0;
        w.hh = fc.heads ? n0 % fc.heads : 0;
        w.b = w.s = 0;
        w.token = -1;
#ifdef FR_HAVE_AVX2
        if (avx2_rows)
            avx2_rows(&fc, &w, n0, n1);
        else
#endif
            fwd_rows_portable(&fc, &w, n0, n1);
        FR_STREAM_FENCE();
        fr_fpenv_leave(&fpenv);
    }
    free(block);
    return FUSEDROPE_OK;
}

/* ---------------------------------------------------------------- backward */

#ifdef FR_HAVE_AVX2
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
#define NB_DOT1(c) (dn[c] * nn[c])
    FR_ROW_PARTIALS(8, s, hd, NB_DOT, NB_DOT1);
#undef NB_DOT
    return nv_tree(s[0], s[1], s[2], s[3]);
}

FR_AVX2_INLINE void nb_store8(void *p, __m256 v, int dt)
{
    nv_store8(p, v, dt, 0, 0);
}

/*
 * The backward's passes for a vector unit of W floats (type V), written once
 * for the AVX2 rows (nb_*, W 8) and the AVX-512 rows (nb5_*, W 16) from the
 * width's helpers: LOAD and STORE of floats, SET1, WIDEN (W channels of dt
 * as floats), NARROW (W floats stored as dt, with the NaN case), ROT
 * (fr_rotate with sgn -1 on W NeoX pairs), ROT_IL (2W interleaved channels
 * rotated back in place) and DOT (row_dot's order).  The arithmetic is
 * GCC's vector operators, lane by lane the portable loops' operations in
 * their order (FMA contraction off): the same bits.
 *
 * PFX##_pass_a: g = R^T dy, n (x * rstd, or R^T y / w'), the dw partial's
 * g * n, dn = g * w' and n stored as floats; returns the dot of dn and n.
 * PFX##_pass_b: dx = rstd * (dn - n * mean), narrowed.
 */
#define FR_DEFINE_NB_PASSES(ATTR, PFX, V, W, LOAD, STORE, SET1, WIDEN, NARROW, ROT, ROT_IL, DOT) \
ATTR void PFX##_chan(V g, V xs, int64_t c, const float *wf, V vr, float *acc, float *dn,         \
                     float *nn, int saved_y)                                                     \
{                                                                                                \
    const V w = LOAD(wf + c);                                                                    \
    const V n = saved_y ? xs / w : xs * vr;                                                      \
    if (acc)                                                                                     \
        STORE(acc + c, LOAD(acc + c) + g * n);                                                   \
    STORE(dn + c, g * w);                                                                        \
    STORE(nn + c, n);                                                                            \
}                                                                                                \
                                                                                                 \
ATTR float PFX##_pass_a(const void *dy, const void *sv, const float *wf, const float *cs,        \
                        const float *sn, float *acc, float r, int64_t hd, int64_t half,          \
                        float *dn, float *nn, int dt, int interleaved, int saved_y)              \
{                                                                                                \
    const int64_t es = dt == 0 ? 4 : 2, rot = 2 * half;                                          \
    const char *db = dy, *sb = sv;                                                               \
    const V vr = SET1(r);                                                                        \
    int64_t c, i;                                                                                \
    if (interleaved) {                                                                           \
        for (i = 0; 2 * i < rot; i += W) {                                                       \
            V g0 = WIDEN(db + 2 * i * es, dt), g1 = WIDEN(db + (2 * i + W) * es, dt);            \
            V x0 = WIDEN(sb + 2 * i * es, dt), x1 = WIDEN(sb + (2 * i + W) * es, dt);            \
            ROT_IL(&g0, &g1, cs + i, sn + i);                                                    \
            if (saved_y)                                                                         \
                ROT_IL(&x0, &x1, cs + i, sn + i);                                                \
            PFX##_chan(g0, x0, 2 * i, wf, vr, acc, dn, nn, saved_y);                             \
            PFX##_chan(g1, x1, 2 * i + W, wf, vr, acc, dn, nn, saved_y);                         \
        }                                                                                        \
    } else {                                                                                     \
        for (i = 0; i < half; i += W) {                                                          \
            V ga = WIDEN(db + i * es, dt), gb = WIDEN(db + (half + i) * es, dt);                 \
            V xa = WIDEN(sb + i * es, dt), xb = WIDEN(sb + (half + i) * es, dt);                 \
            ROT(&ga, &gb, cs + i, sn + i);                                                       \
            if (saved_y)                                                                         \
                ROT(&xa, &xb, cs + i, sn + i);                                                   \
            PFX##_chan(ga, xa, i, wf, vr, acc, dn, nn, saved_y);                                 \
            PFX##_chan(gb, xb, half + i, wf, vr, acc, dn, nn, saved_y);                          \
        }                                                                                        \
    }                                                                                            \
    for (c = rot; c < hd; c += W)                                                                \
        PFX##_chan(WIDEN(db + c * es, dt), WIDEN(sb + c * es, dt), c, wf, vr, acc, dn, nn,       \
                   saved_y);                                                                     \
    return DOT(dn, nn, hd);                                                                      \
}                                                                                                \
                                                                                                 \
ATTR void PFX##_pass_b(void *out, const float *dn, const float *nn, float r, float mean,         \
                       int64_t hd, int dt)                                                       \
{                                                                                                \
    const int64_t es = dt == 0 ? 4 : 2;                                                          \
    const V vr = SET1(r), vm = SET1(mean);                                                       \
    for (int64_t c = 0; c < hd; c += W)                                                          \
        NARROW((char *)out + c * es, vr * (LOAD(dn + c) - LOAD(nn + c) * vm), dt);               \
}
FR_DEFINE_NB_PASSES(FR_AVX2_INLINE, nb, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
                    _mm256_set1_ps, nv_widen8, nb_store8, nb_rotate8, nb_rotate_il8, nb_dot8)

/* The rows of one token of one io slot (a run), for the vector rows. */
typedef struct {
    const char *dy, *sv;       /* the run's first row of dy and of the saved tensor */
    char *dx;                  /* ... and of dx */
    int64_t dy_step, sv_step, dx_step; /* bytes from a head's row to the next's */
    const float *rstd;         /* the run's rstd */
    int64_t heads;
    const float *wf, *cs, *sn; /* weight factors, the token's angles */
    float *acc;                /* the chunk's dw partial, or NULL */
    int64_t hd, half;
    float *rows;               /* the thread's scratch: 2 rows of dn and n (4 hd floats) */
} nb_run_args;

/*
 * NAME: a run's rows with the passes PASS_A and PASS_B.  Row h's pass A
 * comes before row h - 1's pass B, whose mean waits on the dot's tree, the
 * mean's division and the pass A stores of dn and n: one row after the
 * other left that chain exposed (bench/RESULTS.md).  Pass A keeps the row
 * order, so the dw partial's sums are the same.
 */
#define FR_DEFINE_BRUN(ATTR, NAME, PASS_A, PASS_B)                                               \
ATTR void NAME(const nb_run_args *ra, int D, int I, int Y)                                       \
{                                                                                                \
    const int64_t hd = ra->hd;                                                                   \
    float *dn[2] = { ra->rows, ra->rows + 2 * hd }, *nn[2] = { ra->rows + hd, ra->rows + 3 * hd }; \
    float mean = 0.0f;                                                                           \
    for (int64_t h = 0; h <= ra->heads; h++) {                                                   \
        float next = 0.0f;                                                                       \
        if (h < ra->heads)                                                                       \
            next = fr_norm_mean(PASS_A(ra->dy + h * ra->dy_step, ra->sv + h * ra->sv_step, ra->wf, \
                                       ra->cs, ra->sn, ra->acc, ra->rstd[h], hd, ra->half,       \
                                       dn[h & 1], nn[h & 1], D, I, Y), hd);                      \
        if (h > 0)                                                                               \
            PASS_B(ra->dx + (h - 1) * ra->dx_step, dn[(h - 1) & 1], nn[(h - 1) & 1],             \
                   ra->rstd[h - 1], mean, hd, D);                                                \
        mean = next;                                                                             \
    }                                                                                            \
}
FR_DEFINE_BRUN(FR_AVX2_INLINE, nb_run, nb_pass_a, nb_pass_b)

typedef void (*nb_run_fn)(const nb_run_args *);

/* PFX##_run_DIY (dtype D, interleaved I, saved y Y), PFX##_run with TARGET
 * and its modes constants, and PFX##_pick_run, which picks one. */
#define FR_NB_RUN1(TARGET, PFX, D, I, Y)                                                      \
    TARGET static void PFX##_run_##D##I##Y(const nb_run_args *ra)                             \
    {                                                                                         \
        PFX##_run(ra, D, I, Y);                                                               \
    }
#define FR_NB_RUN4(TARGET, PFX, D)                                                            \
    FR_NB_RUN1(TARGET, PFX, D, 0, 0) FR_NB_RUN1(TARGET, PFX, D, 0, 1)                         \
    FR_NB_RUN1(TARGET, PFX, D, 1, 0) FR_NB_RUN1(TARGET, PFX, D, 1, 1)
#define FR_NB_FNS4(PFX, D)                                                                    \
    { { PFX##_run_##D##00, PFX##_run_##D##01 }, { PFX##_run_##D##10, PFX##_run_##D##11 } }
#define FR_DEFINE_NB_PICK(TARGET, PFX)                                                        \
    FR_NB_RUN4(TARGET, PFX, 0) FR_NB_RUN4(TARGET, PFX, 1) FR_NB_RUN4(TARGET, PFX, 2)          \
    static nb_run_fn PFX##_pick_run(int dt, int interleaved, int saved_y)                     \
    {                                                                                         \
        static const nb_run_fn fns[3][2][2] = { FR_NB_FNS4(PFX, 0), FR_NB_FNS4(PFX, 1),       \
                                                FR_NB_FNS4(PFX, 2) };                         \
        return fns[dt][!!interleaved][!!saved_y];                                             \
    }
FR_DEFINE_NB_PICK(FR_AVX2_TARGET, nb)
#endif /* FR_HAVE_AVX2 */

#ifdef FR_HAVE_AVX512
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

FR_DEFINE_NB_PICK(FR_N5_TARGET, nb5)
#endif /* FR_HAVE_AVX512 */


/* dw of a tensor without rows: zero (its gradient is an empty sum). */
static void zero_empty_dw(const fr_norm_args *na)
{
    for (int k = 0; k < 2; k++)
        if (na->dw_zero[k])
            memset(na->dw_zero[k], 0, (size_t)na->dw_zero_n[k] * sizeof(float));
}

fusedrope_status fr_cpu_norm_backward(const fr_norm_args *na)
{
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    const int64_t half = cache->rot_dim / 2;
    const size_t es = fr_dtype_size(a->dtype);
    const int64_t tokens = a->seq_len * a->batch;
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK;
    const int64_t chunks = (tokens + C - 1) / C;
    int nth;
    int64_t hdmax = 0, elems = 0, pbase[2] = { 0, 0 }, pstride[2] = { 0, 0 }, ptotal = 0, items;
    float *wf[2] = { NULL, NULL }, *scratch, *partial;
    void *block;
    size_t per, total;
#ifdef FR_HAVE_AVX2
    const nb_run_fn avx2_run =
        fr_avx2_usable() ? nb_pick_run((int)a->dtype, a->interleaved, na->saved_y) : NULL;
    nb_run_fn vrun[2] = { NULL, NULL }; /* slot k's runs' vector function, or NULL */
#endif
#ifdef FR_HAVE_AVX512
    const nb_run_fn avx512_run =
        fr_avx512_usable() ? nb5_pick_run((int)a->dtype, a->interleaved, na->saved_y) : NULL;
#endif

    if (a->count == 0) {
        zero_empty_dw(na);
        return FUSEDROPE_OK;
    }
    for (int k = 0; k < a->count; k++) {
        hdmax = a->io[k].head_dim > hdmax ? a->io[k].head_dim : hdmax;
        elems += tokens * a->io[k].heads * a->io[k].head_dim;
        pbase[k] = ptotal;
        pstride[k] = fr_line_floats(a->io[k].head_dim);
        if (na->dw[k])
            ptotal += chunks * pstride[k];
#ifdef FR_HAVE_AVX2
        if (avx2_run && nt_whole(a->io[k].head_dim, half, a->interleaved))
            vrun[k] = avx2_run;
#endif
#ifdef FR_HAVE_AVX512
        if (avx512_run && n5_whole(a->io[k].head_dim, half, a->interleaved))
            vrun[k] = avx512_run;
#endif
    }
    /* per thread: g, n (then dx), the saved row and one more (the vector
     * runs' two rows of dn and n), a table-less token's cos/sin.
     * Each thread's rows and each chunk's partial start on a cache line of
     * their own: chunks next to each other are summed by different threads,
     * and a line they shared made two threads slower than one (a bf16 q+k
     * backward 4.7 ms on two threads against 3.9 on one, bench/RESULTS.md). */
    nth = fr_cpu_team_size(cache, elems);
    per = (size_t)fr_line_floats(4 * hdmax + cache->rot_dim);
    total = (size_t)nth * per + 2 * (size_t)fr_line_floats(hdmax) + (size_t)ptotal;
    block = malloc(total * sizeof(float) + FR_LINE_BYTES);
    if (!block)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "the norm backward's scratch (%zu bytes) could not "
                       "be allocated", total * sizeof(float) + FR_LINE_BYTES);
    zero_empty_dw(na); /* after the one thing that can fail: a failed call writes nothing */
    scratch = fr_line_start(block);
    partial = scratch + (size_t)nth * per + 2 * (size_t)fr_line_floats(hdmax);
    items = chunks * a->count;

    /* every thread's part, and the caller's weight factors and dw sums, in
     * the default floating-point environment (internal.h) */
#ifdef _OPENMP
#pragma omp parallel num_threads(nth) if (nth > 1)
#endif
    {
        fr_fpenv fpenv;
        fr_fpenv_enter(&fpenv);
#ifdef _OPENMP
#pragma omp master
#endif
        for (int k = 0; k < a->count; k++) {
            wf[k] = scratch + (size_t)nth * per + (size_t)k * (size_t)fr_line_floats(hdmax);
            weight_factors(na, k, a->io[k].head_dim, wf[k]);
        }
#ifdef _OPENMP
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t it = 0; it < items; it++) {
            const int k = (int)(it / chunks);
            const int64_t ch = it % chunks;
            const fr_io *io = &a->io[k];
            const int64_t hd = io->head_dim, rot = cache->rot_dim;
            float *g = scratch + (size_t)thread_id() * per, *nv = g + hdmax, *xs = nv + hdmax;
            float *row_c = xs + 2 * hdmax, *row_s = row_c + half;
            float *acc = na->dw[k] ? partial + pbase[k] + ch * pstride[k] : NULL;
            const int64_t t1 = (ch + 1) * C < tokens ? (ch + 1) * C : tokens;

            if (acc)
                for (int64_t c = 0; c < hd; c++)
                    acc[c] = 0.0f;
            for (int64_t t = ch * C; t < t1; t++) {
                const int64_t b = t / a->seq_len, s = t % a->seq_len;
                const float *cs, *sn;
                token_angles(cache, &a->pos, b, s, row_c, row_s, &cs, &sn);
#ifdef FR_HAVE_AVX2
                if (vrun[k]) {
                    nb_run_args ra;
                    ra.dy = (const char *)io->in + (size_t)(s * io->in_ss + b * io->in_sb) * es;
                    ra.sv = (const char *)na->x[k] + (size_t)(s * na->x_ss[k] + b * na->x_sb[k]) * es;
                    ra.dx = (char *)io->out + (size_t)(s * io->out_ss + b * io->out_sb) * es;
                    ra.dy_step = io->in_sh * (int64_t)es;
                    ra.sv_step = na->x_sh[k] * (int64_t)es;
                    ra.dx_step = io->out_sh * (int64_t)es;
                    ra.rstd = na->rstd[k] + t * io->heads;
                    ra.heads = io->heads;
                    ra.wf = wf[k];
                    ra.cs = cs;
                    ra.sn = sn;
                    ra.acc = acc;
                    ra.hd = hd;
                    ra.half = half;
                    ra.rows = g;
                    vrun[k](&ra);
                    continue;
                }
#endif
                for (int64_t h = 0; h < io->heads; h++) {
                    const float r = na->rstd[k][t * io->heads + h];
                    float m;
                    /* g = R^T dy */
                    widen((const char *)io->in +
                              (size_t)(s * io->in_ss + b * io->in_sb + h * io->in_sh) * es,
                          a->dtype, g, hd);
                    row_rotate(g, cs, sn, half, a->interleaved, -1.0f);
                    /* n = x * rstd, or R^T y / w' */
                    widen((const char *)na->x[k] +
                              (size_t)(s * na->x_ss[k] + b * na->x_sb[k] + h * na->x_sh[k]) * es,
                          a->dtype, xs, hd);
                    if (na->saved_y) {
                        row_rotate(xs, cs, sn, half, a->interleaved, -1.0f);
                        for (int64_t c = 0; c < hd; c++)
                            nv[c] = xs[c] / wf[k][c];
                    } else {
                        for (int64_t c = 0; c < hd; c++)
                            nv[c] = xs[c] * r;
                    }
                    if (acc)
                        for (int64_t c = 0; c < hd; c++)
                            acc[c] = acc[c] + g[c] * nv[c];
                    /* dn = g * w' (in g); dx = rstd * (dn - n * mean(dn * n)) */
                    for (int64_t c = 0; c < hd; c++)
                        g[c] = g[c] * wf[k][c];
                    m = fr_norm_mean(row_dot(g, nv, hd), hd);
                    for (int64_t c = 0; c < hd; c++)
                        nv[c] = r * (g[c] - nv[c] * m);
                    narrow(nv, (char *)io->out +
                                   (size_t)(s * io->out_ss + b * io->out_sb + h * io->out_sh) * es,
                           a->dtype, hd);
                }
            }
            (void)rot;
        }
        /* dw[c]: the chunks' partials in chunk order (after the loop's barrier) */
#ifdef _OPENMP
#pragma omp master
#endif
        for (int k = 0; k < a->count; k++) {
            if (!na->dw[k])
                continue;
            for (int64_t c = 0; c < a->io[k].head_dim; c++) {
                float sum = 0.0f;
                for (int64_t ch = 0; ch < chunks; ch++)
                    sum = sum + partial[pbase[k] + ch * pstride[k] + c];
                na->dw[k][c] = sum;
            }
        }
        fr_fpenv_leave(&fpenv);
    }
    free(block);
    return FUSEDROPE_OK;
}
