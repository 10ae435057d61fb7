/*
 * cpu_norm_avx2.h - the fused norm's forward row passes with AVX2 and F16C
 * (nv_*), and the macros that write a vector width's row functions, for the
 * two vector files: cpu_norm_avx2.c builds its rows from them, and
 * cpu_norm_avx512.c its own on the same macros.  Everything here is
 * static (all but nv_value1 inline) or a macro.
 */
#ifndef FUSEDROPE_CPU_NORM_AVX2_H
#define FUSEDROPE_CPU_NORM_AVX2_H

#include "cpu_norm.h"

/*
 * The forward of one row in two passes over it with x86 AVX2 and F16C, for
 * CPUs that have both (fr_avx2_usable): the first widens the row into the
 * float scratch while squaring and adding it into four 8-float accumulators
 * (partial sum l is lane l % 8 of accumulator l / 8: norm_math.h's order,
 * channel by channel); the second reads each rotation pair back, forms its
 * values, rotates and narrows them to memory, without storing a float
 * again.  cpu_norm.c's portable loops make five passes, and their 16-bit
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
 * is a NaN but x86's default one, 0xffc00000, whose rounding is that top
 * half (the caller knows), so no NaN case. */
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

/* fp16 bits of 8 floats (fin: none is a NaN but the default one, which
 * the conversion makes 0xfe00 as it does nv_nan_for_half's). */
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

/* fr_norm_value for the rows' scalar tails, out of line: inlined at each
 * tail it made the vector files' rows a third larger, and their compile
 * slower, for channels that few rows have (head_dim or rot_dim not a
 * multiple of 8). */
static __attribute__((noinline, unused)) float nv_value1(float x, float rstd, float wf,
                                                          int rounding, int dt)
{
    return fr_norm_value(x, rstd, wf, rounding, dt);
}

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
 * (nt_whole).  fin: a rotated value that is a NaN is the default NaN
 * (fr_cpu_norm_forward), so the 16-bit narrowings need no NaN case.
 * 16-bit types narrow 16 channels at a time (one pack and one 32-byte
 * store). */
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
            fr_rotate(nv_value1(v[2 * i], rstd, wf[2 * i], rounding, dt),
                      nv_value1(v[2 * i + 1], rstd, wf[2 * i + 1], rounding, dt), cs[i],
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
            fr_rotate(nv_value1(v[i], rstd, wf[i], rounding, dt),
                      nv_value1(v[half + i], rstd, wf[half + i], rounding, dt), cs[i], sn[i],
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
        nv_store1(y, c, nv_value1(v[c], rstd, wf[c], rounding, dt), dt);
}

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
            fr_norm_out_portable(fc, &r, rstd, dst);                                              \
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
        /* slot 0's rows of the token, then slot 1's: one RUN in a loop,                         \
         * not a call for each, is half the code inlined (and compiled) */                       \
        for (int k = hh < heads0 ? 0 : 1; k < 2; k++) {                                          \
            const int64_t lo = k ? (hh > heads0 ? hh : heads0) - heads0 : hh;                    \
            const int64_t hi = k ? end - heads0 : (end < heads0 ? end : heads0);                 \
            if (lo < hi)                                                                         \
                RUN(fc, w->mine, w->stage, k, b, s, t, lo, hi, cs, sn, R, D, I);                 \
        }                                                                                        \
        n += end - hh;                                                                           \
        hh = 0;                                                                                  \
        t++;                                                                                     \
    }                                                                                            \
}

/* PFX##_rows_RDI (rounding R, dtype D, interleaved I): PFX##_rows with
 * TARGET and its modes constants, and PICK, which picks one (cpu_norm.h). */
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
#define FR_DEFINE_FWD_PICK(TARGET, PFX, PICK)                                                 \
    FR_FWD_ROWS6(TARGET, PFX, 0) FR_FWD_ROWS6(TARGET, PFX, 1) FR_FWD_ROWS6(TARGET, PFX, 2)    \
    fr_norm_rows_fn PICK(int rounding, int dt, int interleaved)                               \
    {                                                                                         \
        static const fr_norm_rows_fn fns[3][3][2] = { FR_FWD_FNS6(PFX, 0), FR_FWD_FNS6(PFX, 1),    \
                                                      FR_FWD_FNS6(PFX, 2) };                  \
        return fns[rounding][dt][!!interleaved];                                              \
    }

/* A row dot's scalar term (nb_dot8, nb5_dot16: the row's last hd % 32). */
#define NB_DOT1(c) (dn[c] * nn[c])

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

/*
 * NAME: a run's rows with the passes PASS_A and PASS_B.  Row h's pass A
 * comes before row h - 1's pass B, whose mean waits on the dot's tree, the
 * mean's division and the pass A stores of dn and n: one row after the
 * other left that chain exposed (bench/RESULTS.md).  Row h adds into head
 * h's dw partial (the runs come in token order).
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
                                       ra->cs, ra->sn, ra->acc ? ra->acc + h * ra->acc_step : NULL, \
                                       ra->rstd[h], hd, ra->half,                                \
                                       dn[h & 1], nn[h & 1], D, I, Y), hd);                      \
        if (h > 0)                                                                               \
            PASS_B(ra->dx + (h - 1) * ra->dx_step, dn[(h - 1) & 1], nn[(h - 1) & 1],             \
                   ra->rstd[h - 1], mean, hd, D);                                                \
        mean = next;                                                                             \
    }                                                                                            \
}

/* PFX##_run_DIY (dtype D, interleaved I, saved y Y), PFX##_run with TARGET
 * and its modes constants, and PICK, which picks one (cpu_norm.h). */
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
#define FR_DEFINE_NB_PICK(TARGET, PFX, PICK)                                                  \
    FR_NB_RUN4(TARGET, PFX, 0) FR_NB_RUN4(TARGET, PFX, 1) FR_NB_RUN4(TARGET, PFX, 2)          \
    fr_norm_brun_fn PICK(int dt, int interleaved, int saved_y)                                \
    {                                                                                         \
        static const fr_norm_brun_fn fns[3][2][2] = { FR_NB_FNS4(PFX, 0), FR_NB_FNS4(PFX, 1), \
                                                      FR_NB_FNS4(PFX, 2) };                   \
        return fns[dt][!!interleaved][!!saved_y];                                             \
    }
#endif /* FR_HAVE_AVX2 */

#endif /* FUSEDROPE_CPU_NORM_AVX2_H */
