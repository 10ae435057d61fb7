/*
 * rope_math.h - the per-element math and the position rules, once, for both
 * compilers: gcc builds the OpenMP backend from it, nvcc the CUDA kernels.
 * Forward and backward differ only in the sign of sin, passed in as `sgn`.
 *
 * Bit-identical results on CPU and GPU depend on both compilers evaluating
 * a*c - b*s as two rounded products and a rounded difference: the library is
 * built with -ffp-contract=off (gcc) and -fmad=false (nvcc).
 */
#ifndef FUSEDROPE_ROPE_MATH_H
#define FUSEDROPE_ROPE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FR_HD __host__ __device__ __forceinline__
#else
#define FR_HD static inline
#endif

/* ------------------------------------------------------- dtype conversion */

FR_HD uint32_t fr_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
FR_HD float fr_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

FR_HD float fr_bf16_to_float(uint16_t h) { return fr_u2f((uint32_t)h << 16); }

/* Round to nearest even; NaN stays NaN (quietened). */
FR_HD uint16_t fr_float_to_bf16(float f)
{
    uint32_t u = fr_f2u(f);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? ((u >> 16) | 0x40u) : rounded);
}

/* Exact: every binary16 value is a float.  All three cases are computed and
 * one is selected, so a loop of conversions vectorises. */
FR_HD float fr_half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    const uint32_t exp = em & 0x0f800000u;
    const uint32_t normal = em + (112u << 23);   /* rebias exponent 15 -> 127 */
    const uint32_t infnan = em + (224u << 23);   /* exponent 31 -> 255 */
    /* zero or subnormal: the 10-bit significand times 2^-24, both steps
     * exact in any rounding mode (a difference x - x would be -0 rounding
     * downward) and with normal results (FTZ has nothing to flush) */
    const uint32_t tiny = fr_f2u((float)(int32_t)(em >> 13) * 0x1p-24f);
    const uint32_t mag = exp == 0x0f800000u ? infnan : exp == 0 ? tiny : normal;
    return fr_u2f(mag | sign);
}

/* Round to nearest even, overflow to Inf, NaN to a quiet NaN; branch-free
 * like fr_half_to_float, and in integers only, so that the caller's rounding
 * mode and MXCSR (fusedrope_float_to_half runs in them) do not matter. */
FR_HD uint16_t fr_float_to_half(float f)
{
    const uint32_t u = fr_f2u(f);
    const uint32_t sign = u & 0x80000000u;
    const uint32_t a = u ^ sign;
    const uint32_t big = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
    /* subnormal result (|f| < 2^-14, biased exponent e < 113): the
     * significand with its implicit bit is the value in units of 2^(e-150);
     * shifted right by 126 - e it is in binary16 ulps (2^-24), rounded to
     * nearest even (a carry into 0x400 is the smallest normal).  Below
     * e = 101 the value is under a quarter ulp: 25 gives 0; the clamp at 14
     * only keeps the shift defined where the result is not selected. */
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t sh = e < 101u ? 25u : e > 112u ? 14u : 126u - e;
    const uint32_t tiny = (m + (1u << (sh - 1)) - 1u + ((m >> sh) & 1u)) >> sh;
    /* normal: rebias exponent 127 -> 15 and round to nearest even */
    const uint32_t normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    const uint32_t o = a >= (143u << 23) ? big : a < (113u << 23) ? tiny : normal;
    return (uint16_t)(o | (sign >> 16));
}

/* ---------------------------------------------------------------- rotation */

/* y = rotation of the pair (a, b) by the angle whose cos/sin are c/s;
 * sgn = +1 forward, -1 backward (the transpose). */
FR_HD void fr_rotate(float a, float b, float c, float s, float sgn, float *ya, float *yb)
{
    float ss = s * sgn;
    float ac = a * c, bs = b * ss, bc = b * c, as = a * ss;
    *ya = ac - bs;
    *yb = bc + as;
}

/* Channel indices of pair i in a head: NeoX pairs i with i + half,
 * interleaved pairs 2i with 2i+1. */
FR_HD void fr_pair_channels(int interleaved, int64_t i, int64_t half, int64_t *ca, int64_t *cb)
{
    *ca = interleaved ? 2 * i : i;
    *cb = interleaved ? 2 * i + 1 : i + half;
}

/* The pair of rotated channel ch (ch < 2 * half): fr_pair_channels inverted. */
FR_HD int64_t fr_channel_pair(int interleaved, int64_t ch, int64_t half)
{
    return interleaved ? ch / 2 : (ch < half ? ch : ch - half);
}

/* ---------------------------------------------------------------- positions */

/*
 * Context parallelism (Megatron / Transformer Engine): a sequence is cut into
 * 2*cp_size equal chunks; rank r holds chunks r and 2*cp_size-1-r, so a local
 * index j of a local length len (even) maps to the global position below.
 */
FR_HD int64_t fr_cp_position(int64_t j, int64_t len, int cp_size, int cp_rank)
{
    int64_t chunk;
    if (cp_size <= 1)
        return j;
    chunk = len / 2;
    if (j < chunk)
        return (int64_t)cp_rank * chunk + j;
    return (2 * (int64_t)cp_size - 1 - cp_rank) * chunk + (j - chunk);
}

/* The sequence that packed token t belongs to: the last s with
 * cu_seqlens[s] <= t, in [0, num_seqs).  Stays in bounds for any array
 * contents, monotonic or not. */
FR_HD int64_t fr_thd_sequence(const int32_t *cu_seqlens, int64_t num_seqs, int64_t t)
{
    int64_t lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if ((int64_t)cu_seqlens[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Where a call's positions come from; arrays on the backend's device. */
typedef struct fr_pos_args {
    const int64_t *ids;
    const int64_t *offsets;
    const int32_t *cu_seqlens; /* non-NULL: packed THD, batch is 1 */
    int64_t num_seqs;
    int64_t seq_len;           /* tokens per batch entry (THD: all tokens) */
    int cp_size, cp_rank;
    int num_axes;              /* the cache's position axes: 1 for 1D rope */
    int ids_rows;              /* rows of ids: 1 (every axis the same), or num_axes */
    int64_t ids_row_stride;    /* elements from one row of ids to the next */
    int negative_ok;           /* table-less cache with axes: negative positions are valid */
} fr_pos_args;

/* Index of token (b, s) in a row of ids ([batch][seq], THD: [tokens]). */
FR_HD int64_t fr_ids_index(const fr_pos_args *pa, int64_t b, int64_t s)
{
    return pa->cu_seqlens ? s : b * pa->seq_len + s;
}

/* Whether a THD call's cu_seqlens has a bad end: a first entry other than 0,
 * or a last one other than the call's token count.  (Tokens outside every
 * sequence are fr_token_position's to catch; lib/apply.c refuses all of
 * these on the host where the array is in host memory.) */
FR_HD int fr_cu_ends_bad(const fr_pos_args *pa, int64_t tokens)
{
    return pa->cu_seqlens != NULL &&
           (pa->cu_seqlens[0] != 0 || (int64_t)pa->cu_seqlens[pa->num_seqs] != tokens);
}

/* Whether a THD call's cu_seqlens decreases from entry i to entry i + 1
 * (i < num_seqs).  No token's position shows it (fr_thd_sequence still
 * places every token somewhere), so it is checked entry by entry: by
 * lib/apply.c on the host, by every launch of the kernels on the device. */
FR_HD int fr_cu_step_bad(const fr_pos_args *pa, int64_t i)
{
    return pa->cu_seqlens[i + 1] < pa->cu_seqlens[i];
}

/*
 * Position of token (b, s); for THD, s is the packed token index.  Sets *bad
 * when the position arrays describe no valid position for it (a token outside
 * every sequence, a negative result, a sum past int64); the caller then
 * skips the token.  No sum overflows, so garbage in device memory is never
 * UB.
 *
 * The one position rule, for every caller.  Where host and device differ is
 * only in when the rule's verdict is taken: lib/apply.c runs it over every
 * token of a CPU call before anything is written (and checks cu_seqlens'
 * shape there), so the OpenMP backend never meets a bad token; a CUDA call's
 * arrays are in device memory, so the kernels run it per token and write NaN
 * plus the range flag (or pos->range_status) for a bad one, and check
 * cu_seqlens' two ends and its steps once a launch (fr_cu_ends_bad,
 * fr_cu_step_bad: check_cu_seqlens in kernels/cuda_index.cuh).
 */
FR_HD int64_t fr_token_position(const fr_pos_args *pa, int64_t b, int64_t s, int *bad)
{
    int64_t j = s, len = pa->seq_len, seq = b, p;
    if (pa->cu_seqlens) {
        int64_t start;
        seq = fr_thd_sequence(pa->cu_seqlens, pa->num_seqs, s);
        start = pa->cu_seqlens[seq];
        len = (int64_t)pa->cu_seqlens[seq + 1] - start;
        j = s - start;
        if (j < 0 || j >= len || (pa->cp_size > 1 && len % 2)) {
            *bad = 1;
            return 0;
        }
    }
    if (pa->ids) {
        p = pa->ids[fr_ids_index(pa, b, s)];
    } else {
        p = fr_cp_position(j, len, pa->cp_size, pa->cp_rank);
        if (pa->offsets) {
            const int64_t off = pa->offsets[seq];
            /* a sum past int64 is no position, even where negatives are
             * (a cache with axes): wrapped, it would pass for one */
            if (off > 0 ? p > INT64_MAX - off : p < INT64_MIN - off) {
                *bad = 1;
                return 0;
            }
            p += off;
        }
    }
    *bad = p < 0 && !pa->negative_ok;
    return p;
}

/*
 * Position of token (b, s) on axis a of a cache with position axes, given
 * p0, its position on axis 0 (fr_token_position): row a of ids when ids has
 * a row per axis; else p0 (without ids, or with one row, every axis is at
 * the 1D position).  Sets *bad for a negative position unless allowed.
 */
FR_HD int64_t fr_token_axis_position(const fr_pos_args *pa, int64_t b, int64_t s, int a,
                                     int64_t p0, int *bad)
{
    int64_t p = p0;
    if (a > 0 && pa->ids && pa->ids_rows > 1)
        p = pa->ids[(int64_t)a * pa->ids_row_stride + fr_ids_index(pa, b, s)];
    if (p < 0 && !pa->negative_ok)
        *bad = 1;
    return p;
}

/* A pair's entry in a cache's axes map (lib/axes.c): (col << 2) | axis. */
FR_HD int fr_map_axis(int32_t m) { return (int)(m & 3); }
FR_HD int64_t fr_map_col(int32_t m) { return (int64_t)((uint32_t)m >> 2); }

/*
 * sin and cos of x in double, by the same operations on the CPU and the GPU,
 * so that a table built on either is bit-identical (the libraries' own sin
 * and cos agree only to an ulp).  Cody-Waite reduction by pi/2 in four parts
 * of 24 bits, exact for |x| < 2^28, then Taylor polynomials on |r| <= pi/4,
 * whose first omitted terms are below 1e-20 relative.  Larger or non-finite
 * angles (positions past 2^28 at the fastest frequency) fall back to the
 * platform's sin and cos.
 */
FR_HD void fr_sincos(double x, double *sn, double *cs)
{
    const double p1 = 0x1.921fb4p+0, p2 = 0x1.4442dp-24, p3 = 0x1.846988p-48,
                 p4 = 0x1.8cc51701b839ap-72;
    double k, r, r2, sr, cr;
    int64_t q;
    if (!(x > -0x1p28 && x < 0x1p28)) {
#ifdef __CUDA_ARCH__
        sincos(x, sn, cs);
#else
        *sn = sin(x);
        *cs = cos(x);
#endif
        return;
    }
    k = rint(x * 0x1.45f306dc9c883p-1); /* x * 2/pi */
    r = x - k * p1;
    r = r - k * p2;
    r = r - k * p3;
    r = r - k * p4;
    r2 = r * r;
    sr = r + r * r2 * (-1.0 / 6 + r2 * (1.0 / 120 + r2 * (-1.0 / 5040 + r2 * (1.0 / 362880 +
         r2 * (-1.0 / 39916800 + r2 * (1.0 / 6227020800.0 + r2 * (-1.0 / 1307674368000.0 +
         r2 * (1.0 / 355687428096000.0 + r2 * (-1.0 / 121645100408832000.0)))))))));
    cr = 1.0 + r2 * (-1.0 / 2 + r2 * (1.0 / 24 + r2 * (-1.0 / 720 + r2 * (1.0 / 40320 +
         r2 * (-1.0 / 3628800 + r2 * (1.0 / 479001600 + r2 * (-1.0 / 87178291200.0 +
         r2 * (1.0 / 20922789888000.0 + r2 * (-1.0 / 6402373705728000.0)))))))));
    q = (int64_t)k & 3; /* two's complement: also right for negative k */
    *sn = q == 0 ? sr : q == 1 ? cr : q == 2 ? -sr : -cr;
    *cs = q == 0 ? cr : q == 1 ? -sr : q == 2 ? -cr : sr;
}

/* cos/sin of p * inv_freq, in double, times the attention factor, rounded
 * once to float: a table entry, or the table-less mode's equivalent. */
FR_HD void fr_angle(int64_t p, double inv_freq, double attn, float *c, float *s)
{
    double sv, cv;
    fr_sincos((double)p * inv_freq, &sv, &cv);
    *c = (float)(cv * attn);
    *s = (float)(sv * attn);
}

/* cos/sin of a rotation pair whose position (on its axis) is p and whose
 * frequency column is col (rope_math.h's map entry; col = the pair without
 * axes): the table's entry at row p, column col, or (table NULL) computed
 * from inv_freq[col].  How every backend turns a pair into its cos/sin. */
FR_HD void fr_pair_cos_sin(const float *cos, const float *sin, const double *inv_freq,
                           double attn, int64_t half, int64_t p, int64_t col, float *c, float *s)
{
    if (cos) {
        *c = cos[p * half + col];
        *s = sin[p * half + col];
    } else {
        fr_angle(p, inv_freq[col], attn, c, s);
    }
}

#endif /* FUSEDROPE_ROPE_MATH_H */
