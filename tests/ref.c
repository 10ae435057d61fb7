/*
 * ref.c - the tests' independent float64 reference (see ref.h).
 *
 * Nothing here comes from lib/: the 16-bit conversions are done with frexp and
 * ldexp on doubles, the rope formulas are transcribed from DESIGN.md.
 */
#include "ref.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_PI 3.14159265358979323846

/* ------------------------------------------------------------ random numbers */

uint64_t ref_splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ------------------------------------------------------------ dtype helpers */

typedef struct {
    int prec;      /* significand bits, implicit one included */
    int qmin;      /* exponent of the smallest subnormal */
    int emin;      /* frexp exponent of the smallest normal (2^(emin-1)) */
    int bias;
    double maxv;
} fmt_info;

static const fmt_info fmt_f32 = {24, -149, -125, 127, 0x1.fffffep127};
static const fmt_info fmt_f16 = {11, -24, -13, 15, 65504.0};
static const fmt_info fmt_bf16 = {8, -133, -125, 127, 0x1.fep127};

static const fmt_info *fmtp(fusedrope_dtype dt)
{
    return dt == FUSEDROPE_FLOAT16 ? &fmt_f16 : dt == FUSEDROPE_BFLOAT16 ? &fmt_bf16 : &fmt_f32;
}
#define fmt(dt) (*fmtp(dt))

size_t ref_dtype_size(fusedrope_dtype dt)
{
    return dt == FUSEDROPE_FLOAT32 ? 4 : 2;
}

const char *ref_dtype_name(fusedrope_dtype dt)
{
    switch (dt) {
    case FUSEDROPE_FLOAT32: return "f32";
    case FUSEDROPE_FLOAT16: return "f16";
    case FUSEDROPE_BFLOAT16: return "bf16";
    }
    return "?";
}

double ref_max_finite(fusedrope_dtype dt)
{
    return fmt(dt).maxv;
}

/* 2^e for -1022 <= e <= 1023, exactly, from the bits of a double. */
static double pow2(int e)
{
    uint64_t u = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &u, 8);
    return d;
}

double ref_round(double v, fusedrope_dtype dt)
{
    fmt_info f = fmt(dt);
    int e, q;
    double r;
    if (v == 0 || !isfinite(v))
        return v;
    frexp(v, &e);                 /* |v| in [2^(e-1), 2^e) */
    q = e - f.prec;
    if (q < f.qmin)
        q = f.qmin;
    /* here -149 <= q <= 1016: 2^q and 2^-q are normal doubles */
    /* v * 2^-q and back are exact (powers of two); nearbyint rounds to even */
    r = nearbyint(v * pow2(-q)) * pow2(q);
    if (fabs(r) > f.maxv)
        r = copysign(INFINITY, v);
    return r;
}

double ref_ulp(double v, fusedrope_dtype dt)
{
    fmt_info f = fmt(dt);
    int e, q;
    if (v == 0 || !isfinite(v))
        return pow2(f.qmin);
    frexp(v, &e);
    q = e - f.prec;
    if (q < f.qmin)
        q = f.qmin;
    if (q > 1023)
        return INFINITY;
    return pow2(q);
}

static double decode16(uint16_t h, int mbits, int ebits, fusedrope_dtype dt)
{
    fmt_info f = fmt(dt);
    int emax = (1 << ebits) - 1;
    int E = (h >> mbits) & emax;
    int m = h & ((1 << mbits) - 1);
    double v;
    if (E == 0)
        v = ldexp((double)m, f.qmin);
    else if (E == emax)
        v = m ? NAN : INFINITY;
    else
        v = ldexp((double)(m + (1 << mbits)), E - f.bias - mbits);
    return (h & 0x8000) ? -v : v;
}

static uint16_t encode16(double v, int mbits, int ebits, fusedrope_dtype dt)
{
    fmt_info f = fmt(dt);
    int emax = (1 << ebits) - 1;
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    double r, a;
    int e;
    if (isnan(v))
        return (uint16_t)(sign | (emax << mbits) | (1 << (mbits - 1)));
    r = ref_round(v, dt);
    a = fabs(r);
    if (isinf(a))
        return (uint16_t)(sign | (emax << mbits));
    if (a == 0)
        return sign;
    frexp(a, &e);
    if (e >= f.emin) {
        /* normal: a = 1.m * 2^(e-1) */
        int E = e - 1 + f.bias;
        long m = (long)ldexp(a, mbits + 1 - e) - (1L << mbits);
        return (uint16_t)(sign | (E << mbits) | m);
    }
    return (uint16_t)(sign | (long)ldexp(a, -f.qmin));
}

double ref_half_to_double(uint16_t h) { return decode16(h, 10, 5, FUSEDROPE_FLOAT16); }
double ref_bf16_to_double(uint16_t h) { return decode16(h, 7, 8, FUSEDROPE_BFLOAT16); }

/* The two decodings above, tabulated once (loads are the tests' hot path). */
static double *decode_table(fusedrope_dtype dt);

void ref_init(void)
{
    decode_table(FUSEDROPE_FLOAT16);
    decode_table(FUSEDROPE_BFLOAT16);
}

static double *decode_table(fusedrope_dtype dt)
{
    static double *tab[2];
    int k = dt == FUSEDROPE_BFLOAT16;
    if (!tab[k]) {
        double *t = malloc(65536 * sizeof(double));
        unsigned h;
        if (!t)
            return NULL;
        for (h = 0; h < 65536; h++)
            t[h] = k ? ref_bf16_to_double((uint16_t)h) : ref_half_to_double((uint16_t)h);
        tab[k] = t;
    }
    return tab[k];
}
uint16_t ref_double_to_half(double v) { return encode16(v, 10, 5, FUSEDROPE_FLOAT16); }
uint16_t ref_double_to_bf16(double v) { return encode16(v, 7, 8, FUSEDROPE_BFLOAT16); }

double ref_load(const void *base, fusedrope_dtype dt, int64_t index)
{
    const unsigned char *p = (const unsigned char *)base + (size_t)index * ref_dtype_size(dt);
    if (dt == FUSEDROPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    } else {
        uint16_t h;
        const double *t = decode_table(dt);
        memcpy(&h, p, 2);
        if (t)
            return t[h];
        return dt == FUSEDROPE_FLOAT16 ? ref_half_to_double(h) : ref_bf16_to_double(h);
    }
}

void ref_store(void *base, fusedrope_dtype dt, int64_t index, double v)
{
    unsigned char *p = (unsigned char *)base + (size_t)index * ref_dtype_size(dt);
    if (dt == FUSEDROPE_FLOAT32) {
        float f = (float)ref_round(v, dt);
        memcpy(p, &f, 4);
    } else {
        uint16_t h = dt == FUSEDROPE_FLOAT16 ? ref_double_to_half(v) : ref_double_to_bf16(v);
        memcpy(p, &h, 2);
    }
}

double ref_tolerance(double ref, double a, double b, double attn, fusedrope_dtype dt)
{
    double m = attn > 1 ? attn : 1;
    return ref_ulp(ref, dt) + ldexp(fabs(a) + fabs(b), -22) * m;
}

double ref_angle_slack(double angle)
{
    return ldexp(fabs(angle), -49);
}

int ref_within(double y, double ref, double a, double b, double attn, fusedrope_dtype dt,
               double *tol)
{
    double t = ref_tolerance(ref, a, b, attn, dt);
    if (tol)
        *tol = t;
    return fabs(y - ref) <= t; /* false for NaN */
}

/* ---------------------------------------------------------------- rope types */

double ref_yarn_mscale(double s, double k)
{
    if (s <= 1)
        return 1.0;
    return 0.1 * k * log(s) + 1.0;
}

static double yarn_corr(double d, double orig, double base, double r)
{
    return d * log(orig / (2.0 * REF_PI * r)) / (2.0 * log(base));
}

int ref_freq_dim(const fusedrope_cache_config *cfg)
{
    if (cfg->freq_dim > 0)
        return cfg->freq_dim;
    if (cfg->axes == FUSEDROPE_AXES_VISION_2D)
        return cfg->rot_dim / 2;
    return cfg->rot_dim;
}

void ref_yarn_range(const fusedrope_cache_config *cfg, double *low, double *high)
{
    double d = ref_freq_dim(cfg), orig = (double)cfg->original_max_positions;
    double lo = yarn_corr(d, orig, cfg->theta, cfg->beta_fast);
    double hi = yarn_corr(d, orig, cfg->theta, cfg->beta_slow);
    if (cfg->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0)
        lo = 0;
    if (hi > d - 1)
        hi = d - 1;
    if (lo == hi)
        hi += 0.001;
    *low = lo;
    *high = hi;
}

int ref_inv_freq(const fusedrope_cache_config *cfg, double *inv, double *attn)
{
    /* d is F, the exponent's denominator (rot_dim unless freq_dim or a vision
     * layout says otherwise); there are always rot_dim/2 columns */
    int d = ref_freq_dim(cfg), half = cfg->rot_dim / 2, i;
    double base = cfg->theta;
    double orig = (double)cfg->original_max_positions;
    *attn = 1.0;
    switch (cfg->type) {
    case FUSEDROPE_ROPE_DEFAULT:
        for (i = 0; i < half; i++)
            inv[i] = pow(base, -(2.0 * i) / d);
        return 0;
    case FUSEDROPE_ROPE_LINEAR:
        for (i = 0; i < half; i++)
            inv[i] = pow(base, -(2.0 * i) / d) / cfg->factor;
        return 0;
    case FUSEDROPE_ROPE_DYNAMIC: {
        double L = cfg->seq_len ? (double)cfg->seq_len : (double)cfg->max_positions;
        double b2;
        if (L < orig)
            L = orig;
        b2 = base * pow(cfg->factor * L / orig - (cfg->factor - 1.0), (double)d / (d - 2));
        if (!isfinite(b2)) /* past double: no frequencies to compare */
            return -1;
        for (i = 0; i < half; i++)
            inv[i] = pow(b2, -(2.0 * i) / d);
        return 0;
    }
    case FUSEDROPE_ROPE_YARN: {
        double low, high;
        if (cfg->attention_factor != 0)
            *attn = cfg->attention_factor;
        else if (cfg->mscale != 0 && cfg->mscale_all_dim != 0)
            *attn = ref_yarn_mscale(cfg->factor, cfg->mscale) /
                    ref_yarn_mscale(cfg->factor, cfg->mscale_all_dim);
        else
            *attn = ref_yarn_mscale(cfg->factor, 1.0);
        ref_yarn_range(cfg, &low, &high);
        for (i = 0; i < half; i++) {
            double ramp = (i - low) / (high - low);
            double ext = pow(base, -(2.0 * i) / d);
            if (ramp < 0)
                ramp = 0;
            if (ramp > 1)
                ramp = 1;
            /* left to right as DESIGN writes it: ramp * ext / factor is 0,
             * not 0 * Inf, where ramp is 0 and ext / factor overflows */
            inv[i] = (1.0 - ramp) * ext + ramp * ext / cfg->factor;
        }
        return 0;
    }
    case FUSEDROPE_ROPE_LONGROPE: {
        /* the long factors for a length past the original one: the length is
         * seq_len where set (a table-less cache's way to say it), else the
         * table's rows */
        int64_t L = cfg->seq_len > 0 ? cfg->seq_len : cfg->max_positions;
        const double *f = L > cfg->original_max_positions ? cfg->long_factor : cfg->short_factor;
        double s = cfg->factor != 0 ? cfg->factor : (double)cfg->max_positions / orig;
        for (i = 0; i < half; i++)
            inv[i] = pow(base, -(2.0 * i) / d) / f[i];
        if (cfg->attention_factor != 0)
            *attn = cfg->attention_factor;
        else if (s <= 1)
            *attn = 1.0;
        else
            *attn = sqrt(1.0 + log(s) / log(orig));
        return 0;
    }
    case FUSEDROPE_ROPE_LLAMA3: {
        double lo = orig / cfg->low_freq_factor, hi = orig / cfg->high_freq_factor;
        for (i = 0; i < half; i++) {
            double v = pow(base, -(2.0 * i) / d);
            double w = 2.0 * REF_PI / v;
            if (w < hi || (w <= lo && lo == hi)) { /* equal factors: no band */
                inv[i] = v;
            } else if (w > lo) {
                inv[i] = v / cfg->factor;
            } else {
                double t = (orig / w - cfg->low_freq_factor) /
                           (cfg->high_freq_factor - cfg->low_freq_factor);
                inv[i] = (1.0 - t) * v / cfg->factor + t * v;
            }
        }
        return 0;
    }
    case FUSEDROPE_ROPE_PROPORTIONAL: {
        /* Gemma 4: the first floor(partial * rot_dim/2) columns rotate, the
         * rest have frequency 0 (angle 0: their pairs pass unchanged) */
        double part = cfg->partial_rotary_factor != 0 ? cfg->partial_rotary_factor : 1.0;
        int nrot = (int)floor(part * half);
        for (i = 0; i < half; i++)
            inv[i] = i < nrot ? pow(base, -(2.0 * i) / d) / cfg->factor : 0.0;
        return 0;
    }
    }
    return -1;
}

/* ------------------------------------------------------------------- axes */

int ref_axes_map(const fusedrope_cache_config *cfg, unsigned char *axis, int *col, int *naxes)
{
    const int half = cfg->rot_dim / 2, *s = cfg->sections;
    int j, a, sum = 0, count[FUSEDROPE_MAX_AXES] = {0, 0, 0, 0};
    *naxes = 1;
    for (j = 0; j < half; j++) {
        axis[j] = 0;
        col[j] = j;
    }
    switch (cfg->axes) {
    case FUSEDROPE_AXES_NONE:
        return 0;
    case FUSEDROPE_AXES_SECTIONS:
    case FUSEDROPE_AXES_INTERLEAVED:
    case FUSEDROPE_AXES_ALTERNATING:
        for (a = 0; a < FUSEDROPE_MAX_AXES; a++) {
            if (s[a] < 0 || s[a] > half)
                return -1;
            sum += s[a];
        }
        if (sum != half)
            return -1;
        if (cfg->axes != FUSEDROPE_AXES_SECTIONS && s[3] != 0)
            return -1;
        if (cfg->axes == FUSEDROPE_AXES_ALTERNATING && s[1] != s[2])
            return -1;
        for (j = 0; j < half; j++) {
            if (cfg->axes == FUSEDROPE_AXES_SECTIONS) {
                int end = 0;
                for (a = 0; a < FUSEDROPE_MAX_AXES; a++) {
                    end += s[a];
                    if (j < end)
                        break;
                }
                axis[j] = (unsigned char)a;
            } else if (cfg->axes == FUSEDROPE_AXES_INTERLEAVED) {
                axis[j] = j % 3 == 1 && j < 3 * s[1] ? 1 : j % 3 == 2 && j < 3 * s[2] ? 2 : 0;
            } else {
                axis[j] = j < 2 * s[1] ? (j % 2 == 0 ? 1 : 2) : 0;
            }
            count[axis[j]]++;
        }
        /* the preset must give each axis exactly its section */
        for (a = 0; a < FUSEDROPE_MAX_AXES; a++)
            if (count[a] != s[a])
                return -1;
        *naxes = s[3] > 0 ? 4 : 3;
        return 0;
    case FUSEDROPE_AXES_VISION_2D:
        if (cfg->rot_dim % 4 != 0)
            return -1;
        for (j = 0; j < half; j++) {
            axis[j] = j < cfg->rot_dim / 4 ? 0 : 1;
            col[j] = j < cfg->rot_dim / 4 ? j : j - cfg->rot_dim / 4;
        }
        *naxes = 2;
        return 0;
    case FUSEDROPE_AXES_CUSTOM:
        if (!cfg->pair_axis)
            return -1;
        for (j = 0; j < half; j++) {
            if (cfg->pair_axis[j] >= FUSEDROPE_MAX_AXES)
                return -1;
            if (cfg->pair_col && (cfg->pair_col[j] < 0 || cfg->pair_col[j] >= half))
                return -1;
            axis[j] = cfg->pair_axis[j];
            col[j] = cfg->pair_col ? cfg->pair_col[j] : j;
            if (axis[j] + 1 > *naxes)
                *naxes = axis[j] + 1;
        }
        return 0;
    }
    return -1;
}

int ref_rope_from_config(ref_rope *r, const fusedrope_cache_config *cfg)
{
    memset(r, 0, sizeof *r);
    r->rot_dim = cfg->rot_dim;
    r->inv_freq = malloc(sizeof(double) * (size_t)(cfg->rot_dim / 2 + 1));
    if (!r->inv_freq)
        return -1;
    if (cfg->axes != FUSEDROPE_AXES_NONE) {
        r->axis = malloc((size_t)(cfg->rot_dim / 2 + 1));
        r->col = malloc(sizeof(int) * (size_t)(cfg->rot_dim / 2 + 1));
        if (!r->axis || !r->col || ref_axes_map(cfg, r->axis, r->col, &r->naxes) != 0) {
            ref_rope_free(r);
            return -1;
        }
    }
    return ref_inv_freq(cfg, r->inv_freq, &r->attn);
}

void ref_rope_from_table(ref_rope *r, const float *cos, const float *sin, int64_t rows,
                         int rot_dim)
{
    int64_t k, n = rows * (rot_dim / 2);
    memset(r, 0, sizeof *r);
    r->rot_dim = rot_dim;
    r->tcos = cos;
    r->tsin = sin;
    r->rows = rows;
    r->attn = 1.0;
    for (k = 0; k < n; k++) {
        if (fabs(cos[k]) > r->attn)
            r->attn = fabs(cos[k]);
        if (fabs(sin[k]) > r->attn)
            r->attn = fabs(sin[k]);
    }
}

void ref_rope_free(ref_rope *r)
{
    free(r->inv_freq);
    free(r->axis);
    free(r->col);
    r->inv_freq = NULL;
    r->axis = NULL;
    r->col = NULL;
}

void ref_cos_sin(const ref_rope *r, int64_t p, int i, double *c, double *s)
{
    if (r->inv_freq) {
        double ang = (double)p * r->inv_freq[i];
        *c = cos(ang) * r->attn;
        *s = sin(ang) * r->attn;
    } else {
        *c = r->tcos[p * (r->rot_dim / 2) + i];
        *s = r->tsin[p * (r->rot_dim / 2) + i];
    }
}

void ref_cos_sin_axes(const ref_rope *r, const int64_t *p, int64_t stride, int i, double *c,
                      double *s)
{
    double ang;
    if (!r->naxes || !r->inv_freq) {
        ref_cos_sin(r, p[0], i, c, s);
        return;
    }
    ang = (double)p[r->axis[i] * stride] * r->inv_freq[r->col[i]];
    *c = cos(ang) * r->attn;
    *s = sin(ang) * r->attn;
}

/* ---------------------------------------------------------------- positions */

/* DESIGN: the global sequence is 2 * cp_size chunks of len / 2 tokens; this
 * rank holds two of them, in order: held[0] = chunk cp_rank, held[1] =
 * chunk 2 * cp_size - 1 - cp_rank (in int64: 2 * cp_size overflows int for
 * cp_size >= 2^30).  Local token j is token j - k * half of held[k]. */
int64_t ref_cp_position(int64_t j, int64_t len, int cp_size, int cp_rank)
{
    const int64_t half = len / 2;
    int64_t held[2];
    int k;
    if (cp_size <= 1)
        return j;
    held[0] = cp_rank;
    held[1] = 2 * (int64_t)cp_size - 1 - cp_rank;
    k = j >= half;
    return held[k] * half + (j - k * half);
}

int ref_token_position(const fusedrope_positions *pos, int64_t ids_index, int64_t seq, int64_t j,
                       int64_t len, int64_t *out)
{
    int64_t p;
    if (!pos) {
        *out = j;
        return 0;
    }
    if (pos->ids) {
        *out = pos->ids[ids_index];
        return 0;
    }
    p = ref_cp_position(j, len, pos->cp_size < 1 ? 1 : pos->cp_size, pos->cp_rank);
    if (!pos->offsets) {
        *out = p;
        return 0;
    }
    *out = (int64_t)((uint64_t)p + (uint64_t)pos->offsets[seq]);
    return (pos->offsets[seq] > 0 && p > INT64_MAX - pos->offsets[seq]) ||
           (pos->offsets[seq] < 0 && p < INT64_MIN - pos->offsets[seq]);
}

void ref_positions(const fusedrope_positions *pos, int64_t seq_len, int64_t batch,
                   int64_t *out)
{
    int64_t b, s, n, j;
    if (pos && pos->cu_seqlens) {
        for (n = 0; n < pos->num_seqs; n++) {
            int64_t start = pos->cu_seqlens[n], len = pos->cu_seqlens[n + 1] - start;
            for (j = 0; j < len; j++)
                ref_token_position(pos, start + j, n, j, len, &out[start + j]);
        }
        return;
    }
    for (b = 0; b < batch; b++)
        for (s = 0; s < seq_len; s++)
            ref_token_position(pos, b * seq_len + s, b, s, seq_len, &out[b * seq_len + s]);
}

void ref_axis_positions(const fusedrope_positions *pos, int naxes, int64_t seq_len,
                        int64_t batch, int64_t *out)
{
    const int64_t n = seq_len * batch;
    int64_t k, a;
    if (pos && pos->ids && pos->ids_axes > 1) {
        /* rows of ids: [ids_axes][batch][seq] (THD: [ids_axes][tokens]) */
        int64_t stride = pos->ids_axis_stride ? pos->ids_axis_stride : n;
        for (a = 0; a < naxes; a++)
            for (k = 0; k < n; k++)
                out[a * n + k] = pos->ids[a * stride + k];
        return;
    }
    /* one position per token, the same on every axis */
    ref_positions(pos, seq_len, batch, out);
    for (a = 1; a < naxes; a++)
        for (k = 0; k < n; k++)
            out[a * n + k] = out[k];
}

/* ----------------------------------------------------------------- rotation */

void ref_pair(fusedrope_style style, int rot_dim, int i, int64_t *ca, int64_t *cb)
{
    if (style == FUSEDROPE_INTERLEAVED) {
        *ca = 2 * i;
        *cb = 2 * i + 1;
    } else {
        *ca = i;
        *cb = i + rot_dim / 2;
    }
}

int64_t ref_offset(const fusedrope_tensor *t, int64_t s, int64_t b, int64_t h, int64_t c)
{
    return s * t->stride_seq + b * t->stride_batch + h * t->stride_head + c;
}

void ref_rotate(double a, double b, double c, double s, int backward, double *ya, double *yb)
{
    if (!backward) {
        *ya = a * c - b * s;
        *yb = b * c + a * s;
    } else {
        *ya = a * c + b * s;
        *yb = b * c - a * s;
    }
}

void ref_rotate_size(double a, double b, double c, double s, double *ya, double *yb)
{
    *ya = fabs(c) * a + fabs(s) * b;
    *yb = fabs(c) * b + fabs(s) * a;
}

void ref_apply(const ref_rope *r, fusedrope_style style, const int64_t *positions,
               const fusedrope_tensor *x, int backward, double *out)
{
    int64_t s, b, h, c, ntok = x->seq_len * x->batch;
    int i, half = r->rot_dim / 2;
    for (s = 0; s < x->seq_len; s++)
        for (b = 0; b < x->batch; b++) {
            const int64_t *p = &positions[b * x->seq_len + s];
            for (h = 0; h < x->heads; h++) {
                double *o = out + ((s * x->batch + b) * x->heads + h) * x->head_dim;
                for (c = r->rot_dim; c < x->head_dim; c++)
                    o[c] = ref_load(x->data, x->dtype, ref_offset(x, s, b, h, c));
                for (i = 0; i < half; i++) {
                    int64_t ca, cb;
                    double cs, sn, a, bb;
                    ref_pair(style, r->rot_dim, i, &ca, &cb);
                    ref_cos_sin_axes(r, p, ntok, i, &cs, &sn);
                    a = ref_load(x->data, x->dtype, ref_offset(x, s, b, h, ca));
                    bb = ref_load(x->data, x->dtype, ref_offset(x, s, b, h, cb));
                    ref_rotate(a, bb, cs, sn, backward, &o[ca], &o[cb]);
                }
            }
        }
}

static void appendf(char *msg, size_t len, const char *fmt, ...)
{
    size_t used;
    va_list ap;
    if (!msg || !len)
        return;
    used = strlen(msg);
    if (used + 1 >= len)
        return;
    va_start(ap, fmt);
    vsnprintf(msg + used, len - used, fmt, ap);
    va_end(ap);
}

int64_t ref_check_apply(const ref_rope *r, fusedrope_style style, const int64_t *positions,
                        const fusedrope_tensor *x, const fusedrope_tensor *y, int backward,
                        char *msg, size_t msglen)
{
    int64_t s, b, h, c, bad = 0, ntok = x->seq_len * x->batch;
    int i, half = r->rot_dim / 2;
    size_t es = ref_dtype_size(x->dtype);
    /* cos/sin per (token, pair), computed once per token */
    double *cs = malloc(sizeof(double) * (size_t)(half > 0 ? half : 1));
    double *sn = malloc(sizeof(double) * (size_t)(half > 0 ? half : 1));
    if (msg && msglen)
        msg[0] = 0;
    if (!cs || !sn) {
        free(cs);
        free(sn);
        appendf(msg, msglen, "out of memory in ref_check_apply");
        return 1;
    }
    for (s = 0; s < x->seq_len; s++)
        for (b = 0; b < x->batch; b++) {
            const int64_t *pp = &positions[b * x->seq_len + s];
            int64_t p = pp[0];
            for (i = 0; i < half; i++)
                ref_cos_sin_axes(r, pp, ntok, i, &cs[i], &sn[i]);
            for (h = 0; h < x->heads; h++) {
                for (c = r->rot_dim; c < x->head_dim; c++) {
                    const unsigned char *px = (const unsigned char *)x->data +
                                              (size_t)ref_offset(x, s, b, h, c) * es;
                    const unsigned char *py = (const unsigned char *)y->data +
                                              (size_t)ref_offset(y, s, b, h, c) * es;
                    if (memcmp(px, py, es) != 0) {
                        if (bad++ < 4)
                            appendf(msg, msglen,
                                    "[s=%lld b=%lld h=%lld c=%lld] pass-through channel "
                                    "changed: x=%.9g y=%.9g; ",
                                    (long long)s, (long long)b, (long long)h, (long long)c,
                                    ref_load(x->data, x->dtype, ref_offset(x, s, b, h, c)),
                                    ref_load(y->data, y->dtype, ref_offset(y, s, b, h, c)));
                    }
                }
                for (i = 0; i < half; i++) {
                    int64_t ca, cb, k;
                    double a, bb, ra, rb;
                    ref_pair(style, r->rot_dim, i, &ca, &cb);
                    a = ref_load(x->data, x->dtype, ref_offset(x, s, b, h, ca));
                    bb = ref_load(x->data, x->dtype, ref_offset(x, s, b, h, cb));
                    ref_rotate(a, bb, cs[i], sn[i], backward, &ra, &rb);
                    for (k = 0; k < 2; k++) {
                        int64_t ch = k ? cb : ca;
                        double want = k ? rb : ra, tol;
                        double got = ref_load(y->data, y->dtype, ref_offset(y, s, b, h, ch));
                        if (!ref_within(got, want, a, bb, r->attn, y->dtype, &tol)) {
                            if (bad++ < 4)
                                appendf(msg, msglen,
                                        "[s=%lld b=%lld h=%lld c=%lld pos=%lld pair=%d "
                                        "axis=%d col=%d] "
                                        "got %.9g want %.12g (|err| %.3g > tol %.3g; a=%.9g "
                                        "b=%.9g); ",
                                        (long long)s, (long long)b, (long long)h,
                                        (long long)ch,
                                        (long long)(r->naxes ? pp[r->axis[i] * ntok] : p), i,
                                        r->naxes ? r->axis[i] : 0, r->col ? r->col[i] : i,
                                        got, want,
                                        fabs(got - want), tol, a, bb);
                        }
                    }
                }
            }
        }
    if (bad > 4)
        appendf(msg, msglen, "... %lld bad elements in all", (long long)bad);
    free(cs);
    free(sn);
    return bad;
}

/* ------------------------------------------- fused per-head RMSNorm + RoPE */

static double norm_wf(int kind, const double *w, int64_t c)
{
    return kind == 0 ? 1.0 : kind == 1 ? w[c] : 1.0 + w[c];
}

void ref_norm_forward(const ref_rope *r, fusedrope_style style, const int64_t *positions,
                      const fusedrope_tensor *x, int weight_kind, const double *w, double eps,
                      int rounding, double *out, double *v_out, double *rstd_out)
{
    const int64_t hd = x->head_dim, ntok = x->seq_len * x->batch;
    const int half = r->rot_dim / 2;
    double *v = malloc(sizeof(double) * (size_t)(hd > 0 ? hd : 1));
    if (!v)
        abort();
    for (int64_t s = 0; s < x->seq_len; s++)
        for (int64_t b = 0; b < x->batch; b++) {
            const int64_t *p = &positions[b * x->seq_len + s];
            for (int64_t h = 0; h < x->heads; h++) {
                const int64_t row = ((s * x->batch + b) * x->heads + h) * hd;
                double ss = 0, rstd;
                for (int64_t c = 0; c < hd; c++) {
                    const double xv = ref_load(x->data, x->dtype, ref_offset(x, s, b, h, c));
                    v[c] = xv;
                    ss += xv * xv;
                }
                rstd = 1.0 / sqrt(ss / (double)hd + eps);
                if (rstd_out)
                    rstd_out[(b * x->seq_len + s) * x->heads + h] = rstd;
                for (int64_t c = 0; c < hd; c++) {
                    double n = v[c] * rstd;
                    if (rounding == 1)
                        v[c] = ref_round(ref_round(n, x->dtype) * norm_wf(weight_kind, w, c),
                                         x->dtype);
                    else if (rounding == 2)
                        v[c] = ref_round(n * norm_wf(weight_kind, w, c), x->dtype);
                    else
                        v[c] = n * norm_wf(weight_kind, w, c);
                    if (v_out)
                        v_out[row + c] = v[c];
                    out[row + c] = v[c];
                }
                for (int i = 0; i < half; i++) {
                    int64_t ca, cb;
                    double cs, sn;
                    ref_pair(style, r->rot_dim, i, &ca, &cb);
                    ref_cos_sin_axes(r, p, ntok, i, &cs, &sn);
                    ref_rotate(v[ca], v[cb], cs, sn, 0, &out[row + ca], &out[row + cb]);
                }
            }
        }
    free(v);
}

void ref_norm_backward(const ref_rope *r, fusedrope_style style, const int64_t *positions,
                       const fusedrope_tensor *saved, int saved_is_y,
                       const fusedrope_tensor *dy, int weight_kind, const double *w, double eps,
                       const float *rstd, double *dx, double *dw, double *dw_abs,
                       double *scale)
{
    const int64_t hd = dy->head_dim, ntok = dy->seq_len * dy->batch;
    const int half = r->rot_dim / 2;
    /* g, n and, for the tolerances, their sizes before the un-rotation's
     * cancellation: |cos| |a| + |sin| |b| (a float32 g or n carries an error
     * relative to that, not to its own value, which may be far smaller) */
    double *g = malloc(sizeof(double) * 4 * (size_t)(hd > 0 ? hd : 1));
    if (!g)
        abort();
    double *n = g + hd, *gm = n + hd, *nm = gm + hd;
    for (int64_t s = 0; s < dy->seq_len; s++)
        for (int64_t b = 0; b < dy->batch; b++) {
            const int64_t *p = &positions[b * dy->seq_len + s];
            for (int64_t h = 0; h < dy->heads; h++) {
                const int64_t row = ((s * dy->batch + b) * dy->heads + h) * hd;
                double rs, dot = 0, mean, maxdn = 0, maxn = 0;
                for (int64_t c = 0; c < hd; c++) {
                    g[c] = ref_load(dy->data, dy->dtype, ref_offset(dy, s, b, h, c));
                    n[c] = ref_load(saved->data, saved->dtype, ref_offset(saved, s, b, h, c));
                    gm[c] = fabs(g[c]);
                    nm[c] = fabs(n[c]);
                }
                for (int i = 0; i < half; i++) {
                    int64_t ca, cb;
                    double cs, sn;
                    ref_pair(style, r->rot_dim, i, &ca, &cb);
                    ref_cos_sin_axes(r, p, ntok, i, &cs, &sn);
                    ref_rotate(g[ca], g[cb], cs, sn, 1, &g[ca], &g[cb]);
                    ref_rotate_size(gm[ca], gm[cb], cs, sn, &gm[ca], &gm[cb]);
                    if (saved_is_y) {
                        ref_rotate(n[ca], n[cb], cs, sn, 1, &n[ca], &n[cb]);
                        ref_rotate_size(nm[ca], nm[cb], cs, sn, &nm[ca], &nm[cb]);
                    }
                }
                if (rstd) {
                    rs = rstd[(b * dy->seq_len + s) * dy->heads + h];
                } else {
                    double ss = 0;
                    for (int64_t c = 0; c < hd; c++)
                        ss += n[c] * n[c];
                    rs = 1.0 / sqrt(ss / (double)hd + eps);
                }
                for (int64_t c = 0; c < hd; c++) {
                    const double wf = norm_wf(weight_kind, w, c);
                    n[c] = saved_is_y ? n[c] / wf : n[c] * rs;
                    nm[c] = saved_is_y ? nm[c] / fabs(wf) : fabs(n[c]);
                    if (dw)
                        dw[c] += g[c] * n[c];
                    if (dw_abs)
                        dw_abs[c] += gm[c] * nm[c];
                    g[c] *= wf; /* dn */
                    gm[c] *= fabs(wf);
                    dot += g[c] * n[c];
                    maxdn = gm[c] > maxdn ? gm[c] : maxdn;
                    maxn = nm[c] > maxn ? nm[c] : maxn;
                }
                mean = dot / (double)hd;
                for (int64_t c = 0; c < hd; c++)
                    dx[row + c] = rs * (g[c] - n[c] * mean);
                if (scale)
                    scale[row / hd] = rs * (maxdn + maxn * fabs(mean));
            }
        }
    free(g);
}

double ref_norm_rstd_tolerance(double ref)
{
    return fabs(ref) * 0x1p-20;
}

double ref_norm_y_tolerance(double ref, double mag, double flip, double attn, int rounding,
                            fusedrope_dtype dt)
{
    return ref_ulp(ref, dt) + mag * 0x1p-19 * (attn > 1 ? attn : 1) +
           (rounding == FUSEDROPE_NORM_ROUND_LLAMA   ? 3 * flip * attn
            : rounding == FUSEDROPE_NORM_ROUND_GEMMA ? flip * attn
                                                     : 0);
}

double ref_norm_dx_tolerance(double ref, double scale, fusedrope_dtype dt)
{
    return ref_ulp(ref, dt) + scale * 0x1p-16;
}

double ref_norm_dw_tolerance(double dw_abs)
{
    return dw_abs * 0x1p-15 + 1e-30;
}
