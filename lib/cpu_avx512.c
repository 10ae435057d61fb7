/*
 * cpu_avx512.c - cpu_avx2.c's rotations of 16-bit heads with 512-bit
 * vectors (AVX-512 F, BW and VL), for CPUs that have them: 16 pairs a step,
 * and the pieces shorter than 16 pairs (a row's tail; in a long streamed
 * row, the start that puts the non-temporal stores on their alignment) done
 * by the same code under a lane mask instead of a scalar loop.  The 16-bit rotations were bound by
 * instructions, not by memory (bench/RESULTS.md): AVX-512's masks and
 * two-source word permutes do with one instruction what AVX2 does with
 * several (bf16 rounding, NaN fix-ups, the packing of results), on twice
 * the lanes.
 *
 * Every result is cpu_avx2.c's, and so the portable path's, by the same
 * argument, lane by lane: exact widening; fr_rotate's four products,
 * difference and sum in float, without FMA (this file is not built for it:
 * the build has -ffp-contract=off and the products are separate
 * instructions); fp16 narrowing by vcvtps2ph told round-to-nearest-even;
 * bf16 narrowing by fr_float_to_bf16's integer arithmetic (not vcvtneps2bf16,
 * which flushes subnormals to zero); a NaN result written as the converters
 * write it (fp16 0x7e00 with its sign, bf16 the float's top half with the
 * quiet bit).  Interleaved heads are split into a and b vectors like
 * cpu_avx2.c's rather than rotated in place with duplicated cos/sin: the
 * split is one or two instructions, the in-place form needs four permutes
 * of cos/sin per 16 pairs and a swap per 8 (26 instructions per 16 pairs
 * against 20 for fp16).  tests/test_cpu_rows.c compares both files' functions with
 * the portable arithmetic.
 */
#include "internal.h"

#ifdef FR_HAVE_AVX512
#include <cpuid.h>
#include <immintrin.h>

#define FR_AVX512_TARGET __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl")))
/* for the loop bodies, specialised on their constant arguments */
#define FR_AVX512_INLINE FR_AVX512_TARGET static inline __attribute__((always_inline))

int fr_avx512_off;

/* AVX-512 F/BW/VL (with AVX2 and F16C) in the CPU, and the opmask and ZMM
 * state saved by the OS (valgrind's CPUID says no: under it the AVX2
 * rotations run): XCR0 bits 1-2 (XMM, YMM) and 5-7 (opmask, the
 * upper halves of ZMM0-15, ZMM16-31). */
static int cpu_has_avx512(void)
{
    return fr_x86_has(0xe6u, bit_AVX2 | bit_AVX512F | bit_AVX512BW | bit_AVX512VL);
}

int fr_avx512_usable(void)
{
    static int state; /* 0 unknown, 1 no, 2 yes; racing first callers agree */
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (s == 0) {
        s = cpu_has_avx512() ? 2 : 1;
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    /* fr_avx2_off turns this file off too: it means the portable path */
    return s == 2 && !__atomic_load_n(&fr_avx512_off, __ATOMIC_RELAXED) && fr_avx2_usable();
}

/* How a full step's results are stored: plainly, or non-temporally in
 * 16-byte pieces, or in whole vectors (32 bytes for a row's half of a step,
 * 64 for interleaved pairs) where the output is aligned to them.  A streamed
 * output on 16 bytes only (the backend's promise; malloc's large blocks) is
 * put on its alignment by a masked first step where the row is long enough
 * to repay it: that step costs about 40 instructions, the 16-byte pieces 4
 * (rows) or 6 (pairs) per step, so from 8 steps on. */
enum { ST_PLAIN, ST_NT16, ST_NT_WIDE, PEEL_MIN_PAIRS = 8 * 16 };

/* Word indices for the two-source permutes (vpermt2w: 0-31 the first
 * source's words, 32-63 the second's). */
static const uint16_t odd_words[32] = { /* word 2i+1 of the pair: the high halves */
    1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63
};
static const uint16_t split_words[32] = { /* a's 16 halves, then b's */
    0, 2, 4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
    1, 3, 5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
};
static const uint16_t zip_words[32] = { /* a's word i, b's word i, ... */
    0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47
};
static const uint16_t zip_high_words[32] = { /* a's high half i, b's high half i, ... */
    1,  33, 3,  35, 5,  37, 7,  39, 9,  41, 11, 43, 13, 45, 15, 47,
    17, 49, 19, 51, 21, 53, 23, 55, 25, 57, 27, 59, 29, 61, 31, 63
};

FR_AVX512_INLINE __m512i words(const uint16_t *w)
{
    return _mm512_loadu_si512((const void *)w);
}

/* fr_float_to_bf16 on 16 floats, the bfloat16 in the high half of each
 * lane (the low half is left over): u + 0x7fff + (bit 16 of u), or for a
 * NaN u with the quiet bit. */
FR_AVX512_INLINE __m512i bf16_high(__m512 y)
{
    const __m512i u = _mm512_castps_si512(y);
    const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
    r = _mm512_mask_add_epi32(r, odd, u, _mm512_set1_epi32(0x8000));
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
}

/* 16 floats to binary16, round to nearest even; a NaN becomes its sign with
 * 0x7fc00000 first, which narrows to 0x7e00 (ternary-logic 0xea: (u & sign)
 * | qnan, in the NaN lanes only). */
FR_AVX512_INLINE __m256i narrow_f16(__m512 y)
{
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    const __m512i f = _mm512_mask_ternarylogic_epi32(_mm512_castps_si512(y), nan,
                                                     _mm512_set1_epi32((int)0x80000000u), _mm512_set1_epi32(0x7fc00000), 0xea);
    return _mm512_cvtps_ph(_mm512_castsi512_ps(f), _MM_FROUND_TO_NEAREST_INT);
}

/* fr_rotate on 16 pairs: its operations in its order. */
FR_AVX512_INLINE void rotate(__m512 a, __m512 b, __m512 c, __m512 s, __m512 vsgn, __m512 *ra,
                             __m512 *rb)
{
    const __m512 ss = _mm512_mul_ps(s, vsgn);
    *ra = _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, ss));
    *rb = _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, ss));
}

/* 16 values of a row to binary16/bfloat16 widened; lanes outside k zero. */
FR_AVX512_INLINE __m512 widen_row(const uint16_t *p, __mmask16 k, int full, int f16)
{
    const __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(k, p);
    if (f16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

FR_AVX512_INLINE void store_row(uint16_t *p, __m256i v, __mmask16 k, int full, int mode)
{
    if (!full)
        _mm256_mask_storeu_epi16(p, k, v);
    else if (mode == ST_PLAIN)
        _mm256_storeu_si256((__m256i *)p, v);
    else if (mode == ST_NT_WIDE)
        _mm256_stream_si256((__m256i *)p, v);
    else {
        _mm_stream_si128((__m128i *)p, _mm256_castsi256_si128(v));
        _mm_stream_si128((__m128i *)p + 1, _mm256_extracti128_si256(v, 1));
    }
}

/* One step of two-row heads with its cos/sin in c and s: pairs (xa[j],
 * xb[j]) for the lanes j of k (all 16 when full). */
FR_AVX512_INLINE void rows_cs(const uint16_t *xa, const uint16_t *xb, uint16_t *ya, uint16_t *yb,
                              __m512 c, __m512 s, __m512 vsgn, __mmask16 k, int full, int mode,
                              int f16)
{
    const __m512 a = widen_row(xa, k, full, f16), b = widen_row(xb, k, full, f16);
    __m512 ra, rb;
    __m256i na, nb;
    rotate(a, b, c, s, vsgn, &ra, &rb);
    if (f16) {
        na = narrow_f16(ra);
        nb = narrow_f16(rb);
    } else {
        /* both rows' high halves in one vector: a's 16, then b's */
        const __m512i n =
            _mm512_permutex2var_epi16(bf16_high(ra), words(odd_words), bf16_high(rb));
        na = _mm512_castsi512_si256(n);
        nb = _mm512_extracti64x4_epi64(n, 1);
    }
    store_row(ya, na, k, full, mode);
    store_row(yb, nb, k, full, mode);
}

/* cs[j], sn[j] for the lanes j of k (all 16 when full), the others zero */
FR_AVX512_INLINE __m512 load_cs(const float *cs, __mmask16 k, int full)
{
    return full ? _mm512_loadu_ps(cs) : _mm512_maskz_loadu_ps(k, cs);
}

FR_AVX512_INLINE void rows_step(const uint16_t *xa, const uint16_t *xb, uint16_t *ya, uint16_t *yb,
                                const float *cs, const float *sn, __m512 vsgn, __mmask16 k,
                                int full, int mode, int f16)
{
    rows_cs(xa, xb, ya, yb, load_cs(cs, k, full), load_cs(sn, k, full), vsgn, k, full, mode, f16);
}

FR_AVX512_INLINE void rows(const uint16_t *xa, const uint16_t *xb, uint16_t *ya, uint16_t *yb,
                           const float *cs, const float *sn, int64_t m, float sgn, int nt, int f16)
{
    const __m512 vsgn = _mm512_set1_ps(sgn);
    int64_t i = 0, end;
    int mode = ST_PLAIN;
    if (nt) {
        /* ya and yb fall on 16 bytes: a masked first step of 8 pairs puts
         * ya on 32, and yb with it when the two are as far from 32 */
        if ((uintptr_t)ya % 32 != 0 && ((uintptr_t)ya ^ (uintptr_t)yb) % 32 == 0 &&
            m >= PEEL_MIN_PAIRS) {
            rows_step(xa, xb, ya, yb, cs, sn, vsgn, 0xff, 0, ST_PLAIN, f16);
            i = 8;
        }
        mode = ((uintptr_t)(ya + i) | (uintptr_t)(yb + i)) % 32 == 0 ? ST_NT_WIDE : ST_NT16;
    }
    end = i + ((m - i) & ~(int64_t)15); /* the full steps' */
#define FR_ROWS_LOOP(MODE)                                                                    \
    for (; i < end; i += 16)                                                                  \
    rows_step(xa + i, xb + i, ya + i, yb + i, cs + i, sn + i, vsgn, 0xffff, 1, MODE, f16)
    if (mode == ST_NT_WIDE)
        FR_ROWS_LOOP(ST_NT_WIDE);
    else if (mode == ST_NT16)
        FR_ROWS_LOOP(ST_NT16);
    else
        FR_ROWS_LOOP(ST_PLAIN);
#undef FR_ROWS_LOOP
    if (i < m)
        rows_step(xa + i, xb + i, ya + i, yb + i, cs + i, sn + i, vsgn,
                  (__mmask16)((1u << (m - i)) - 1), 0, ST_PLAIN, f16);
}

/* One step of interleaved pairs (x[2j], x[2j+1]) for the lanes j of k, its
 * cos/sin in c and s: a pair is one 32-bit word, a in its low half. */
FR_AVX512_INLINE void pairs_cs(const uint16_t *x, uint16_t *y, __m512 c, __m512 s, __m512 vsgn,
                               __mmask16 k, int full, int mode, int f16)
{
    const __m512i w = full ? _mm512_loadu_si512((const void *)x) : _mm512_maskz_loadu_epi32(k, x);
    __m512 a, b, ra, rb;
    __m512i r;
    if (f16) {
        const __m512i ab = _mm512_permutexvar_epi16(words(split_words), w);
        a = _mm512_cvtph_ps(_mm512_castsi512_si256(ab));
        b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(ab, 1));
    } else {
        a = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
        b = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
    }
    rotate(a, b, c, s, vsgn, &ra, &rb);
    if (f16)
        r = _mm512_permutex2var_epi16(_mm512_castsi256_si512(narrow_f16(ra)), words(zip_words),
                                      _mm512_castsi256_si512(narrow_f16(rb)));
    else
        r = _mm512_permutex2var_epi16(bf16_high(ra), words(zip_high_words), bf16_high(rb));
    if (!full)
        _mm512_mask_storeu_epi32(y, k, r);
    else if (mode == ST_PLAIN)
        _mm512_storeu_si512((void *)y, r);
    else if (mode == ST_NT_WIDE)
        _mm512_stream_si512((void *)y, r);
    else {
        _mm_stream_si128((__m128i *)y, _mm512_castsi512_si128(r));
        _mm_stream_si128((__m128i *)y + 1, _mm512_extracti32x4_epi32(r, 1));
        _mm_stream_si128((__m128i *)y + 2, _mm512_extracti32x4_epi32(r, 2));
        _mm_stream_si128((__m128i *)y + 3, _mm512_extracti32x4_epi32(r, 3));
    }
}

FR_AVX512_INLINE void pairs_step(const uint16_t *x, uint16_t *y, const float *cs, const float *sn,
                                 __m512 vsgn, __mmask16 k, int full, int mode, int f16)
{
    pairs_cs(x, y, load_cs(cs, k, full), load_cs(sn, k, full), vsgn, k, full, mode, f16);
}

FR_AVX512_INLINE void pairs(const uint16_t *x, uint16_t *y, const float *cs, const float *sn,
                            int64_t m, float sgn, int nt, int f16)
{
    const __m512 vsgn = _mm512_set1_ps(sgn);
    int64_t i = 0, end;
    if (nt && ((uintptr_t)y % 64 == 0 || m >= PEEL_MIN_PAIRS)) {
        /* y falls on 16 bytes: a masked first step of up to 12 pairs (4
         * bytes each) puts it on 64, for whole-vector streams */
        const int64_t p0 = (int64_t)((64 - (uintptr_t)y % 64) % 64 / 4); /* 0 where m < 128 */
        if (p0 > 0)
            pairs_step(x, y, cs, sn, vsgn, (__mmask16)((1u << p0) - 1), 0, ST_PLAIN, f16);
        i = p0;
        for (end = i + ((m - i) & ~(int64_t)15); i < end; i += 16)
            pairs_step(x + 2 * i, y + 2 * i, cs + i, sn + i, vsgn, 0xffff, 1, ST_NT_WIDE, f16);
    } else if (nt) {
        for (end = m & ~(int64_t)15; i < end; i += 16)
            pairs_step(x + 2 * i, y + 2 * i, cs + i, sn + i, vsgn, 0xffff, 1, ST_NT16, f16);
    } else {
        for (end = m & ~(int64_t)15; i < end; i += 16)
            pairs_step(x + 2 * i, y + 2 * i, cs + i, sn + i, vsgn, 0xffff, 1, ST_PLAIN, f16);
    }
    if (i < m)
        pairs_step(x + 2 * i, y + 2 * i, cs + i, sn + i, vsgn, (__mmask16)((1u << (m - i)) - 1),
                   0, ST_PLAIN, f16);
}

/*
 * Heads of an axes table rotated in steps (cpu_apply.c's plan_steps): the
 * cos/sin of pairs 8j..8j+7 are p8[j][0..7], a run of some axis's table row
 * (or of the token's gathered angles).  A 16-lane step at pair i (a
 * multiple of 8) puts p8[i/8] in its low lanes and p8[i/8 + 1] in its high
 * ones: two 32-byte loads, one of them into the upper half (vinsertf64x4,
 * which AVX-512 F has; vinsertf32x8 would need DQ).  The rotation is
 * rows_cs/pairs_cs, so each result is the one-row rotation's to the bit.
 * Output alignment as in rows()/pairs() but without their peeled first
 * step, which would break the steps' 8-pair grid (these heads have at most
 * 256 pairs; the peel pays from 128).
 */
FR_AVX512_INLINE __m512 step_load(const float *const *p8, int64_t i, int64_t m)
{
    const float *lo = p8[i >> 3];
    if (m - i >= 16) {
        const __m512d l = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(lo)));
        return _mm512_castpd_ps(
            _mm512_insertf64x4(l, _mm256_castps_pd(_mm256_loadu_ps(p8[(i >> 3) + 1])), 1));
    }
    if (m - i <= 8)
        return _mm512_maskz_loadu_ps((__mmask16)((1u << (m - i)) - 1), lo);
    {
        const __m256 hi = _mm256_maskz_loadu_ps((__mmask8)((1u << (m - i - 8)) - 1),
                                                p8[(i >> 3) + 1]);
        const __m512d l = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(lo)));
        return _mm512_castpd_ps(_mm512_insertf64x4(l, _mm256_castps_pd(hi), 1));
    }
}

FR_AVX512_INLINE void rows_steps(const uint16_t *xa, const uint16_t *xb, uint16_t *ya,
                                 uint16_t *yb, const float *const *c8, const float *const *s8,
                                 int64_t m, float sgn, int nt, int f16)
{
    const __m512 vsgn = _mm512_set1_ps(sgn);
    const int64_t end = m & ~(int64_t)15;
    int64_t i = 0;
#define FR_STEPS_LOOP(MODE)                                                                    \
    for (; i < end; i += 16)                                                                  \
    rows_cs(xa + i, xb + i, ya + i, yb + i, step_load(c8, i, m), step_load(s8, i, m), vsgn,   \
            0xffff, 1, MODE, f16)
    if (!nt)
        FR_STEPS_LOOP(ST_PLAIN);
    else if (((uintptr_t)ya | (uintptr_t)yb) % 32 == 0)
        FR_STEPS_LOOP(ST_NT_WIDE);
    else
        FR_STEPS_LOOP(ST_NT16);
#undef FR_STEPS_LOOP
    if (i < m)
        rows_cs(xa + i, xb + i, ya + i, yb + i, step_load(c8, i, m), step_load(s8, i, m), vsgn,
                (__mmask16)((1u << (m - i)) - 1), 0, ST_PLAIN, f16);
}

FR_AVX512_INLINE void pairs_steps(const uint16_t *x, uint16_t *y, const float *const *c8,
                                  const float *const *s8, int64_t m, float sgn, int nt, int f16)
{
    const __m512 vsgn = _mm512_set1_ps(sgn);
    const int64_t end = m & ~(int64_t)15;
    int64_t i = 0;
#define FR_STEPS_LOOP(MODE)                                                                    \
    for (; i < end; i += 16)                                                                  \
    pairs_cs(x + 2 * i, y + 2 * i, step_load(c8, i, m), step_load(s8, i, m), vsgn, 0xffff, 1, \
             MODE, f16)
    if (!nt)
        FR_STEPS_LOOP(ST_PLAIN);
    else if ((uintptr_t)y % 64 == 0)
        FR_STEPS_LOOP(ST_NT_WIDE);
    else
        FR_STEPS_LOOP(ST_NT16);
#undef FR_STEPS_LOOP
    if (i < m)
        pairs_cs(x + 2 * i, y + 2 * i, step_load(c8, i, m), step_load(s8, i, m), vsgn,
                 (__mmask16)((1u << (m - i)) - 1), 0, ST_PLAIN, f16);
}

/*
 * A token's run of heads, one rotation for all: heads of 16, 32, 48 or 64
 * pairs (fr_avx512_heads_fit) hold their cos/sin in registers, loaded once
 * for the run (from the step pointers, as above) instead of once a head;
 * with 16-bit data the rotation was bound by instructions, and those loads
 * (and their inserts, for an axes table) were a quarter of them
 * (bench/RESULTS.md, "Position axes").  Each step is rows_cs/pairs_cs, so
 * every result is the one-head rotation's.  nst (steps a head) and the
 * store mode are constants in each inlined copy: the cos/sin arrays become
 * registers.
 */
FR_AVX512_INLINE void heads_body(const uint16_t *x, int64_t xstep, uint16_t *y, int64_t ystep,
                                 int64_t n, const __m512 *c, const __m512 *s, __m512 vsgn,
                                 int nst, int inter, int mode, int f16)
{
    const int64_t half = 16 * (int64_t)nst;
    for (int64_t h = 0; h < n; h++, x += xstep, y += ystep)
        for (int j = 0; j < nst; j++) {
            if (inter)
                pairs_cs(x + 32 * j, y + 32 * j, c[j], s[j], vsgn, 0xffff, 1, mode, f16);
            else
                rows_cs(x + 16 * j, x + half + 16 * j, y + 16 * j, y + half + 16 * j, c[j], s[j],
                        vsgn, 0xffff, 1, mode, f16);
        }
}

FR_AVX512_INLINE void heads_n(const uint16_t *x, int64_t xstep, uint16_t *y, int64_t ystep,
                              int64_t n, int inter, const float *const *c8,
                              const float *const *s8, float sgn, int nt, int nst, int f16)
{
    const __m512 vsgn = _mm512_set1_ps(sgn);
    __m512 c[4], s[4];
    for (int j = 0; j < nst; j++) {
        c[j] = step_load(c8, 16 * j, 16 * nst);
        s[j] = step_load(s8, 16 * j, 16 * nst);
    }
    /* whole-vector streams where every head's output is on their size */
    if (!nt)
        heads_body(x, xstep, y, ystep, n, c, s, vsgn, nst, inter, ST_PLAIN, f16);
    else if (((uintptr_t)y | (uintptr_t)(ystep * 2)) % (inter ? 64 : 32) == 0)
        heads_body(x, xstep, y, ystep, n, c, s, vsgn, nst, inter, ST_NT_WIDE, f16);
    else
        heads_body(x, xstep, y, ystep, n, c, s, vsgn, nst, inter, ST_NT16, f16);
}

FR_AVX512_INLINE void heads(const uint16_t *x, int64_t xstep, uint16_t *y, int64_t ystep,
                            int64_t n, int64_t half, int inter, const float *const *c8,
                            const float *const *s8, float sgn, int nt, int f16)
{
    switch (half) {
    case 16: heads_n(x, xstep, y, ystep, n, inter, c8, s8, sgn, nt, 1, f16); break;
    case 32: heads_n(x, xstep, y, ystep, n, inter, c8, s8, sgn, nt, 2, f16); break;
    case 48: heads_n(x, xstep, y, ystep, n, inter, c8, s8, sgn, nt, 3, f16); break;
    default: heads_n(x, xstep, y, ystep, n, inter, c8, s8, sgn, nt, 4, f16); break; /* 64 */
    }
}

FR_AVX512_TARGET void fr_avx512_rotate_heads_f16(const uint16_t *x, int64_t xstep, uint16_t *y,
                                                 int64_t ystep, int64_t n, int64_t half,
                                                 int interleaved, const float *const *c8,
                                                 const float *const *s8, float sgn, int nt)
{
    heads(x, xstep, y, ystep, n, half, interleaved, c8, s8, sgn, nt, 1);
}

FR_AVX512_TARGET void fr_avx512_rotate_heads_bf16(const uint16_t *x, int64_t xstep, uint16_t *y,
                                                  int64_t ystep, int64_t n, int64_t half,
                                                  int interleaved, const float *const *c8,
                                                  const float *const *s8, float sgn, int nt)
{
    heads(x, xstep, y, ystep, n, half, interleaved, c8, s8, sgn, nt, 0);
}

FR_AVX512_TARGET void fr_avx512_gather(const fr_gather_plan *g, const float *tc, const float *ts,
                                       const int64_t *pax, int64_t half, float *c, float *s)
{
    for (int k = 0; k < g->nsteps; k++) {
        __m512 vc = _mm512_setzero_ps(), vs = _mm512_setzero_ps();
        for (int a = 0; a < FUSEDROPE_MAX_AXES; a++) {
            const __mmask16 m = (__mmask16)g->mask[k][a];
            if (m) {
                const int64_t at = pax[a] * half + g->base[k][a];
                vc = _mm512_mask_loadu_ps(vc, m, tc + at);
                vs = _mm512_mask_loadu_ps(vs, m, ts + at);
            }
        }
        _mm512_store_ps(c + 16 * k, vc);
        _mm512_store_ps(s + 16 * k, vs);
    }
}

FR_AVX512_INLINE void steps(const uint16_t *x, uint16_t *y, int64_t half, int interleaved,
                            const float *const *c8, const float *const *s8, float sgn, int nt,
                            int f16)
{
    if (interleaved)
        pairs_steps(x, y, c8, s8, half, sgn, nt, f16);
    else
        rows_steps(x, x + half, y, y + half, c8, s8, half, sgn, nt, f16);
}

FR_AVX512_TARGET void fr_avx512_rotate_steps_f16(const uint16_t *x, uint16_t *y, int64_t half,
                                                 int interleaved, const float *const *c8,
                                                 const float *const *s8, float sgn, int nt)
{
    steps(x, y, half, interleaved, c8, s8, sgn, nt, 1);
}

FR_AVX512_TARGET void fr_avx512_rotate_steps_bf16(const uint16_t *x, uint16_t *y, int64_t half,
                                                  int interleaved, const float *const *c8,
                                                  const float *const *s8, float sgn, int nt)
{
    steps(x, y, half, interleaved, c8, s8, sgn, nt, 0);
}

FR_AVX512_TARGET void fr_avx512_rotate_pairs_f16(const uint16_t *x, uint16_t *y, const float *cs,
                                                 const float *sn, int64_t m, float sgn, int nt)
{
    pairs(x, y, cs, sn, m, sgn, nt, 1);
}

FR_AVX512_TARGET void fr_avx512_rotate_pairs_bf16(const uint16_t *x, uint16_t *y, const float *cs,
                                                  const float *sn, int64_t m, float sgn, int nt)
{
    pairs(x, y, cs, sn, m, sgn, nt, 0);
}

FR_AVX512_TARGET void fr_avx512_rotate_f16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya,
                                           uint16_t *yb, const float *cs, const float *sn,
                                           int64_t m, float sgn, int nt)
{
    rows(xa, xb, ya, yb, cs, sn, m, sgn, nt, 1);
}

FR_AVX512_TARGET void fr_avx512_rotate_bf16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya,
                                            uint16_t *yb, const float *cs, const float *sn,
                                            int64_t m, float sgn, int nt)
{
    rows(xa, xb, ya, yb, cs, sn, m, sgn, nt, 0);
}

#else
typedef int fr_no_avx512; /* ISO C: a translation unit declares something */
#endif
