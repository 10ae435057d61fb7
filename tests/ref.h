/*
 * ref.h - an independent float64 reference for libfusedrope's tests.
 *
 * Written from DESIGN.md's formulas only: it shares no code with lib/.  All
 * arithmetic is in double; cos and sin are exact double values (the library
 * rounds its table to float32, which the precision bound allows for).
 */
#ifndef FUSEDROPE_TEST_REF_H
#define FUSEDROPE_TEST_REF_H

#include <stddef.h>
#include <stdint.h>

#include "fusedrope.h"

/* ------------------------------------------------------------ random numbers */

/* splitmix64: the generator of every test, the fuzz harness and the benchmark
 * (one step; *state advances). */
uint64_t ref_splitmix(uint64_t *state);

/* ------------------------------------------------------------ dtype helpers */

/* Builds the reference's lookup tables (optional; call before forking to share them). */
void ref_init(void);

size_t ref_dtype_size(fusedrope_dtype dt);
const char *ref_dtype_name(fusedrope_dtype dt);

/* Exact conversions of the 16-bit formats to double (NaN and Inf kept). */
double ref_half_to_double(uint16_t h);
double ref_bf16_to_double(uint16_t h);
/* Round to nearest, ties to even; overflow gives Inf; NaN gives a quiet NaN. */
uint16_t ref_double_to_half(double v);
uint16_t ref_double_to_bf16(double v);

/* v rounded (to nearest, ties to even) to the dtype's grid, as a double;
 * values beyond the largest finite one round to +-Inf. */
double ref_round(double v, fusedrope_dtype dt);
/* Spacing of the dtype's numbers at |v|: 2^(exponent - precision + 1), never
 * below the dtype's smallest subnormal (so ulp(0) is that subnormal). */
double ref_ulp(double v, fusedrope_dtype dt);
/* Largest finite value of the dtype. */
double ref_max_finite(fusedrope_dtype dt);

/* Element `index` of an array of dtype at base, as a double. */
double ref_load(const void *base, fusedrope_dtype dt, int64_t index);
/* Stores v rounded to the dtype. */
void ref_store(void *base, fusedrope_dtype dt, int64_t index, double v);

/*
 * DESIGN's precision bound:
 *   |y - ref| <= ulp(ref) + 2^-22 * (|a| + |b|) * max(1, attn)
 * where ref is the float64 result, a and b the pair's inputs.  Returns 1 when
 * y is within it (a NaN y never is); *tol receives the tolerance.
 */
int ref_within(double y, double ref, double a, double b, double attn, fusedrope_dtype dt,
               double *tol);
double ref_tolerance(double ref, double a, double b, double attn, fusedrope_dtype dt);
/*
 * What two double implementations of the same DESIGN formula for inv_i may
 * differ by, seen in an angle p * inv_i: a few ulps of inv_i (the order of
 * the operations differs), i.e. |angle| * 2^-49.  The fuzz harness, whose
 * configs reach angles of 2^40 and more, adds it (times (|a|+|b|) * attn) to
 * the bound; at the tests' angles it is far below it.
 */
double ref_angle_slack(double angle);

/* ---------------------------------------------------------------- rope types */

/* F, the denominator of every rope type's exponent 2c/F: freq_dim, or (0)
 * rot_dim, or rot_dim/2 for the VISION_2D layout. */
int ref_freq_dim(const fusedrope_cache_config *cfg);

/* YaRN's m(s, k) = 1 if s <= 1 else 0.1 k ln s + 1. */
double ref_yarn_mscale(double s, double k);
/* YaRN's correction range (low, high) after clamping and the +0.001 rule. */
/* F in every rope type's exponent 2i/F (freq_dim, or rot_dim; vision 2D: rot_dim/2). */
int ref_freq_dim(const fusedrope_cache_config *cfg);
void ref_yarn_range(const fusedrope_cache_config *cfg, double *low, double *high);

/*
 * inv_freq[rot_dim/2] (one per frequency column c, exponent 2c/F) and the
 * attention factor of a (valid) configuration, following DESIGN.md "Rope
 * types" (PROPORTIONAL: columns past floor(partial_rotary_factor * rot_dim/2)
 * have frequency 0; LONGROPE: the long factors when seq_len, or max_positions
 * where seq_len is 0, exceeds original_max_positions).  Returns 0, or -1 for
 * an unknown type.
 */
int ref_inv_freq(const fusedrope_cache_config *cfg, double *inv_freq, double *attn);

/*
 * Position axes (multimodal rope): pair j of rot_dim/2 takes the position of
 * axis[j] and the frequency of column col[j]; *naxes receives the number of
 * position axes (3 for the section layouts, 4 when sections[3] > 0, 2 for
 * VISION_2D, the largest pair_axis + 1 for CUSTOM, 1 for NONE).  Written
 * from the layouts' formulas:
 *   SECTIONS     the a with s0+..+s(a-1) <= j < s0+..+sa
 *   INTERLEAVED  1 if j%3 == 1 && j < 3*s1; 2 if j%3 == 2 && j < 3*s2; else 0
 *   ALTERNATING  j < 2*s1: 1 for even j, 2 for odd j; else 0
 *   VISION_2D    j < rot_dim/4: (0, j); else (1, j - rot_dim/4)
 *   CUSTOM       (pair_axis[j], pair_col[j] or j)
 * Returns 0, or -1 where the library must refuse the configuration
 * (INVALID): sections negative or not summing to rot_dim/2, a preset that
 * does not give each axis exactly its section, sections[3] for INTERLEAVED
 * or ALTERNATING, s1 != s2 for ALTERNATING, rot_dim % 4 for VISION_2D, a
 * missing or out-of-range CUSTOM map.
 */
int ref_axes_map(const fusedrope_cache_config *cfg, unsigned char *axis, int *col, int *naxes);

/* Where cos/sin come from: a rope configuration or a user table. */
typedef struct ref_rope {
    int rot_dim;
    double attn;          /* the attention factor (for a user table: max |entry|, >= 1) */
    double *inv_freq;     /* [rot_dim/2], or NULL for a user table */
    const float *tcos, *tsin; /* user table [rows][rot_dim/2] */
    int64_t rows;
    /* position axes (a config with axes != NONE), else naxes 0 and NULL */
    int naxes;
    unsigned char *axis;  /* [rot_dim/2] */
    int *col;             /* [rot_dim/2] */
} ref_rope;

int ref_rope_from_config(ref_rope *r, const fusedrope_cache_config *cfg);
void ref_rope_from_table(ref_rope *r, const float *cos, const float *sin, int64_t rows,
                         int rot_dim);
void ref_rope_free(ref_rope *r);
/* cos(p * inv_i) * attn and sin(p * inv_i) * attn in double (or the table's values). */
void ref_cos_sin(const ref_rope *r, int64_t p, int i, double *c, double *s);
/* The same for pair i of a rope with axes: the position p[axis[i] * stride]
 * and column col[i] (without axes: ref_cos_sin(r, p[0], i)). */
void ref_cos_sin_axes(const ref_rope *r, const int64_t *p, int64_t stride, int i, double *c,
                      double *s);

/* ---------------------------------------------------------------- positions */

/* Context parallelism: local index j of a local sequence of (even) length len. */
int64_t ref_cp_position(int64_t j, int64_t len, int cp_size, int cp_rank);

/*
 * The position of one token (pos may be NULL): ids[ids_index] if ids are
 * given, else its context-parallel position (local index j of a local
 * sequence of length len) plus offsets[seq].  seq is the batch entry, or the
 * THD sequence; ids_index is b * seq_len + s, or the packed token index.
 * Returns 0, or 1 when the offset's sum overflows int64: *out then holds the
 * sum wrapped modulo 2^64 (the true value is out of every table).
 */
int ref_token_position(const fusedrope_positions *pos, int64_t ids_index, int64_t seq, int64_t j,
                       int64_t len, int64_t *out);

/*
 * The position of every token of a (valid) call: out[b * seq_len + s] (for THD,
 * batch is 1 and s is the packed token index).  pos may be NULL.
 */
void ref_positions(const fusedrope_positions *pos, int64_t seq_len, int64_t batch,
                   int64_t *out);

/*
 * The position of every token on every axis: out[a * batch * seq_len + k],
 * k = b * seq_len + s (THD: the packed token index).  With ids rows
 * (pos->ids_axes > 1) axis a of token k is ids[a * stride + k], stride =
 * ids_axis_stride or (0) batch * seq_len; otherwise every axis holds the
 * token's one position (ref_positions).
 */
void ref_axis_positions(const fusedrope_positions *pos, int naxes, int64_t seq_len,
                        int64_t batch, int64_t *out);

/* ----------------------------------------------------------------- rotation */

/* Channels of pair i for a style. */
void ref_pair(fusedrope_style style, int rot_dim, int i, int64_t *ca, int64_t *cb);

/* The float64 rotation of one pair (a, b) by (c, s), forward or backward (the transpose). */
void ref_rotate(double a, double b, double c, double s, int backward, double *ya, double *yb);

/* The sizes of that rotation's results before any cancellation, either
 * direction: |c| |a| + |s| |b| and |c| |b| + |s| |a| (a and b themselves
 * sizes, >= 0).  A float32 rotation's error is relative to these. */
void ref_rotate_size(double a, double b, double c, double s, double *ya, double *yb);

/* Element offset of (s, b, h, c) in a tensor view. */
int64_t ref_offset(const fusedrope_tensor *t, int64_t s, int64_t b, int64_t h, int64_t c);

/*
 * The float64 result of forward (backward = 0) or backward (1) applied to x:
 * out[((s * batch + b) * heads + h) * head_dim + c], channels >= rot_dim copied.
 * positions: [batch * seq_len], or for a rope with axes (r->naxes > 0)
 * [naxes][batch * seq_len] as ref_axis_positions writes them (also for
 * ref_check_apply).
 */
void ref_apply(const ref_rope *r, fusedrope_style style, const int64_t *positions,
               const fusedrope_tensor *x, int backward, double *out);

/*
 * Compares the library's output y with the reference applied to x (x holds the
 * original input; y may have other strides).  Rotated channels must be within
 * the bound; channels >= rot_dim must equal x's bit for bit.  Returns the
 * number of bad elements; msg gets a description of the first few.
 */
int64_t ref_check_apply(const ref_rope *r, fusedrope_style style, const int64_t *positions,
                        const fusedrope_tensor *x, const fusedrope_tensor *y, int backward,
                        char *msg, size_t msglen);

/* ------------------------------------------- fused per-head RMSNorm + RoPE */

/*
 * fusedrope_norm_forward_qk's formula in float64, per (token, head) row of x:
 * rstd = 1/sqrt(mean(x^2) + eps), n = x * rstd, v = n * w' with w' = 1
 * (weight_kind 0), w (1) or 1 + w (2), w[head_dim] the weight's values (NULL
 * for kind 0); rounding 1 (Llama/Qwen3) rounds n to x's dtype and then
 * n * w' to it, 2 (Gemma) rounds n * w' to it, 0 rounds nothing; then the
 * rotation of v (channels >= rot_dim: v).  positions as for ref_apply
 * (with axes: [naxes][batch * seq_len]).  out and v_out (may be NULL) in
 * ref_apply's order, rstd_out (may be NULL) at [(b * seq_len + s) * heads + h].
 */
void ref_norm_forward(const ref_rope *r, fusedrope_style style, const int64_t *positions,
                      const fusedrope_tensor *x, int weight_kind, const double *w, double eps,
                      int rounding, double *out, double *v_out, double *rstd_out);

/*
 * The gradients of the (unrounded) forward above for the loss sum(y * dy):
 * g = R^T dy, dn = g * w', dx = rstd * (dn - n * mean(dn * n)), and
 * dw[c] += sum over rows of g[c] * n[c] (dw may be NULL; the caller zeroes
 * it).  n = saved * rstd when saved holds the forward's input; with
 * saved_is_y, saved holds its output and n = R^T saved / w'.  rstd: the
 * given float32 values at [(b * seq_len + s) * heads + h], or NULL to compute
 * it from saved (an input).  dw_abs (may be NULL) accumulates |g[c]| |n[c]|,
 * each the size before the un-rotation's cancellation (|cos| |a| + |sin| |b|,
 * which a float32 value's error is relative to).  dx in ref_apply's order;
 * scale (may be NULL), per row: rstd * (max |dn| + max |n| * |mean(dn * n)|)
 * with those sizes, the size of dx's terms, for tolerances.
 */
void ref_norm_backward(const ref_rope *r, fusedrope_style style, const int64_t *positions,
                       const fusedrope_tensor *saved, int saved_is_y,
                       const fusedrope_tensor *dy, int weight_kind, const double *w, double eps,
                       const float *rstd, double *dx, double *dw, double *dw_abs,
                       double *scale);

/*
 * The bounds tests/test_norm.c holds the fused norm to, for every test that
 * judges it (test_norm, the fuzz target tests/fuzz/fuzz_norm.c):
 *   rstd: |got - ref| <= ref * 2^-20 (float32 roundings of the sum, mean,
 *     sqrt and division, times the reduction's depth);
 *   y:    ulp(ref) + mag * 2^-19 * max(1, attn) (the max as in
 *     fusedrope(3)'s bound: a table entry cos * attn that is a float32
 *     subnormal is off by up to 2^-150, no longer relative), plus, where the
 *     rounding mode rounds to the dtype before the rotation, a value at a
 *     tie may go the other way: GEMMA one ulp of v (flip * attn), LLAMA three
 *     (3 * flip * attn: n rounded, then n * w', |w'| up to 2); mag is
 *     |v_a| + |v_b| of the pair (|v| past rot_dim), flip ulp(v_a) + ulp(v_b)
 *     (ulp(v) past rot_dim), in the dtype;
 *   dx:   ulp(ref) + scale * 2^-16, scale from ref_norm_backward;
 *   dw:   dw_abs * 2^-15 + 1e-30, dw_abs from ref_norm_backward.
 */
double ref_norm_rstd_tolerance(double ref);
double ref_norm_y_tolerance(double ref, double mag, double flip, double attn, int rounding,
                            fusedrope_dtype dt);
double ref_norm_dx_tolerance(double ref, double scale, fusedrope_dtype dt);
double ref_norm_dw_tolerance(double dw_abs);

#endif /* FUSEDROPE_TEST_REF_H */
