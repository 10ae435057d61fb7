/*
 * decode.c - the fuzz targets' shared decoding and plain-call model
 * (decode.h).  Moved from fuzz_apply.c unchanged, so its corpus decodes as
 * before.
 *
 * Later additions read their bytes only where the old decoder had stopped
 * (after the last call's decode, fz_ext_call; after every call, the cache
 * variant of fz_ext_cache), and a 0 byte, which is also what reading past
 * the end gives, keeps the old behaviour: every older input decodes to the
 * same cache and calls.
 *
 * FUSEDROPE_FUZZ_STATS=1 prints at exit (both targets): the conservative
 * refusals tolerated (an output whose elements the harness finds disjoint,
 * refused with the library's documented "may overlap each other" sentence
 * for its strides; two views whose byte ranges meet but which share no
 * element, refused with its "may (partially) overlap ... not provably
 * apart" sentence), the extension checks that ran, and the longest
 * fusedrope_last_error() sentence seen.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

int strict_mode = -1, verbose_mode = -1;
unsigned long conservative_refusals;
int fz_last_call;

/* The last_error buffer is char[512] (lib/status.c, vsnprintf): a sentence
 * that did not fit is cut to 511 characters, so one that long is taken as
 * cut. */
#define FZ_ERR_MAX 511

static struct {
    unsigned long rs[6], sizes[8], idsx, reruns, rerun_bytes, cache_ext[3], getters, longest;
} xst;

static void fz_print_xstats(void)
{
    fprintf(stderr,
            "%s stats: conservative overlap refusals tolerated %lu; range_status none/own/"
            "misaligned/in-input/in-output/in-array %lu/%lu/%lu/%lu/%lu/%lu; pos struct_size "
            "kinds 0..5 %lu/%lu/%lu/%lu/%lu/%lu; ids_axes/stride without ids %lu; SIMD-off "
            "re-runs %lu (%lu output bytes compared); cache re-creates num_threads/struct_size/"
            "freq %lu/%lu/%lu; getter checks %lu; longest error %lu chars\n",
            fz_name, conservative_refusals, xst.rs[0], xst.rs[1], xst.rs[2], xst.rs[3], xst.rs[4],
            xst.rs[5], xst.sizes[0], xst.sizes[1], xst.sizes[2], xst.sizes[3], xst.sizes[4],
            xst.sizes[5], xst.idsx, xst.reruns, xst.rerun_bytes, xst.cache_ext[0],
            xst.cache_ext[1], xst.cache_ext[2], xst.getters, xst.longest);
}

static void check_error_len(const char *what)
{
    size_t l = strlen(fusedrope_last_error());
    if (l > xst.longest)
        xst.longest = l;
    CHECK(l < FZ_ERR_MAX, "%s: fusedrope_last_error() is %zu characters: the 512-byte buffer is "
          "full, the sentence was most likely cut", what, l);
}

void fz_env(void)
{
    if (strict_mode < 0) {
        const char *e = getenv("FUSEDROPE_FUZZ_LENIENT");
        const char *v = getenv("FUSEDROPE_FUZZ_VERBOSE");
        const char *st = getenv("FUSEDROPE_FUZZ_STATS");
        strict_mode = !(e && *e && *e != '0');
        verbose_mode = v && *v && *v != '0';
        if (st && *st && *st != '0')
            atexit(fz_print_xstats);
    }
}

/* ------------------------------------------------------------ diagnostics */

char trace[4096];
size_t trace_len;

void note(const char *fmt, ...)
{
    va_list ap;
    int n;
    if (trace_len >= sizeof trace - 1)
        return;
    va_start(ap, fmt);
    n = vsnprintf(trace + trace_len, sizeof trace - trace_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        trace_len += (size_t)n < sizeof trace - trace_len ? (size_t)n : sizeof trace - 1 - trace_len;
}

void finding(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "\n=== %s FINDING: ", fz_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n--- call trace:\n%s\n--- fusedrope_last_error(): \"%s\"\n", trace,
            fusedrope_last_error());
    abort();
}

/* ------------------------------------------------------------ byte source */

unsigned u8(src_t *s)
{
    return s->i < s->n ? s->p[s->i++] : 0;
}
unsigned u16(src_t *s)
{
    unsigned a = u8(s);
    return a | u8(s) << 8;
}
uint32_t u32(src_t *s)
{
    uint32_t a = u16(s);
    return a | (uint32_t)u16(s) << 16;
}
uint64_t u64(src_t *s)
{
    uint64_t a = u32(s);
    return a | (uint64_t)u32(s) << 32;
}

static const int64_t interesting_i64[] = {
    0, 1, 2, 3, 4, 7, 8, 16, 33, 255, 4096, 65536, -1, -2, -3, -4096,
    INT32_MAX, (int64_t)INT32_MAX + 1, UINT32_MAX, (int64_t)1 << 32, (int64_t)1 << 40,
    (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX / 2, INT64_MAX / 3, INT64_MAX / 4 + 1,
    INT64_MAX - 1, INT64_MAX, INT64_MIN, INT64_MIN + 1, -((int64_t)1 << 62), INT64_MIN / 2,
};
#define N_I64 (sizeof interesting_i64 / sizeof interesting_i64[0])

int64_t any_i64(src_t *s)
{
    unsigned b = u8(s);
    if (b < 200)
        return interesting_i64[b % N_I64];
    if (b < 230)
        return (int64_t)(u16(s) % 1024) - 512;
    return (int64_t)u64(s);
}

/* lo + (b % span) most of the time, an interesting value otherwise. */
int64_t dim(src_t *s, int64_t lo, int64_t span)
{
    unsigned b = u8(s);
    if (b < 232)
        return lo + (int64_t)(b % (unsigned)span);
    return any_i64(s);
}

static const int interesting_int[] = { 0, 1, 2, 3, 4, 8, -1, -2, INT_MAX, INT_MIN,
                                       1 << 30, (1 << 30) + 1, INT_MAX - 1, 16, 7, 64 };
#define N_INT (sizeof interesting_int / sizeof interesting_int[0])

int any_int(src_t *s)
{
    unsigned b = u8(s);
    if (b < 200)
        return interesting_int[b % N_INT];
    return (int)u32(s);
}

double any_double(src_t *s, double dflt)
{
    static const double v[] = { 1.0, 2.0, 4.0, 8.0, 32.0, 0.5, 0.25, 0.0, -0.0, -1.0, 1e-300,
                                5e-324, 1e300, DBL_MAX, 1.0000001, 10000.0, 500000.0, 0.1,
                                3.0, 16.0, 64.0, 1e10, -1e300, 40.0, 0.75 };
    unsigned b = u8(s);
    uint64_t bits;
    double d;
    if (b < 96)
        return dflt;
    if (b < 200)
        return v[b % (sizeof v / sizeof v[0])];
    if (b < 215)
        return NAN;
    if (b < 225)
        return b & 1 ? INFINITY : -INFINITY;
    if (b < 240)
        return dflt * (1.0 + (double)(u8(s) % 64) / 16.0);
    bits = u64(s);
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* -------------------------------------------------------- random contents */
uint64_t rnext(rng_t *r)
{
    return ref_splitmix(&r->s);
}

size_t dtype_size(int dt)
{
    return ref_dtype_size((fusedrope_dtype)dt);
}

int dtype_ok(int dt)
{
    return dt == FUSEDROPE_FLOAT32 || dt == FUSEDROPE_FLOAT16 || dt == FUSEDROPE_BFLOAT16;
}

/* Fills n bytes with elements of dtype dt: mostly finite values below 4 in
 * magnitude (subnormals included), with `specials` arbitrary bit patterns
 * (NaN, Inf, huge) one time in 32. */
void fill(unsigned char *p, size_t n, int dt, rng_t *r, int specials)
{
    size_t es = dtype_ok(dt) ? dtype_size(dt) : 1, i = 0;
    for (; i + es <= n; i += es) {
        uint64_t x = rnext(r);
        if (es == 1 || (specials && (x & 31) == 0)) {
            memcpy(p + i, &x, es);
            continue;
        }
        if (es == 4) {
            uint32_t v = (uint32_t)(x >> 32) & 0x807fffffu;
            v |= (uint32_t)(100 + (x >> 8) % 29) << 23;  /* 2^-27 .. 2^1 */
            memcpy(p + i, &v, 4);
        } else if (dt == FUSEDROPE_FLOAT16) {
            uint16_t v = (uint16_t)((x >> 32) & 0x83ffu);
            v |= (uint16_t)(((x >> 8) % 17) << 10);        /* 0 (subnormal) .. 2^1 */
            memcpy(p + i, &v, 2);
        } else {
            uint16_t v = (uint16_t)((x >> 32) & 0x807fu);
            v |= (uint16_t)((100 + (x >> 8) % 29) << 7);
            memcpy(p + i, &v, 2);
        }
    }
    for (; i < n; i++)
        p[i] = (unsigned char)rnext(r);
}

double load(const unsigned char *p, int dt)
{
    return ref_load(p, (fusedrope_dtype)dt, 0);
}

/* ------------------------------------------------------------------ cache */
int known_issue(int which)
{
    fz_env();
    (void)which;
    return !strict_mode;
}

/* Whether DESIGN's formulas give an attention factor in (0, FLT_MAX]
 * and finite angles for a config that passes every field check:
 * 1 yes, 0 no (the library must refuse it), 2 the angles stay finite up to
 * the last position the cache serves but not up to INT64_MAX (the library
 * may refuse: it bounds every inverse frequency by DBL_MAX / 2^63).
 * Fields can each be in range and the model still not be computable
 * (longrope with original_max_positions 1: ln 1 = 0; a denormal factor:
 * base^-e / factor = Inf, or p * inv = Inf at a position the cache serves;
 * yarn with mscale_all_dim = DBL_MAX: attention factor 0); the library must
 * refuse those. */
int derived_finite(const fusedrope_cache_config *c)
{
    static double inv[FUSEDROPE_MAX_ROT_DIM / 2];
    double attn;
    int maybe = 0;
    if (ref_inv_freq(c, inv, &attn) != 0)
        return 0;
    if (!(attn > 0 && attn <= FLT_MAX)) /* e.g. yarn m(s, k) / m(s, Inf) = 0 */
        return 0;
    for (int i = 0; i < c->rot_dim / 2; i++) {
        /* every angle p * inv the cache serves: p up to its last row, or any int64 */
        if (!isfinite(inv[i]) ||
            !isfinite(inv[i] * (c->max_positions > 0 ? (double)(c->max_positions - 1) : 0x1p63)))
            return 0;
        if (!isfinite(inv[i] * 0x1p63))
            maybe = 1;
    }
    return maybe ? 2 : 1;
}

/* The statuses a create may return for cfg/device, per the decisions. */
unsigned config_allowed(const fusedrope_cache_config *c, int device, int have_cfg,
                               int have_out)
{
    unsigned bad = 0;
    int t = (int)c->type, d = c->rot_dim;
#define FIN(x) isfinite(x)
    if (!have_out || !have_cfg)
        return 1u << FUSEDROPE_ERR_INVALID;
    if (t < 0 || t > FUSEDROPE_ROPE_PROPORTIONAL)
        bad = 1;
    if (d < 2 || d > FUSEDROPE_MAX_ROT_DIM || d % 2)
        bad = 1;
    if (c->max_positions < 0)
        bad = 1;
    if (!(FIN(c->theta) && c->theta > 1))
        bad = 1;
    if (!bad) {
        if (t == FUSEDROPE_ROPE_LINEAR || t == FUSEDROPE_ROPE_DYNAMIC || t == FUSEDROPE_ROPE_YARN ||
            t == FUSEDROPE_ROPE_LLAMA3 || t == FUSEDROPE_ROPE_PROPORTIONAL)
            if (!(FIN(c->factor) && c->factor > 0))
                bad = 1;
        if (t == FUSEDROPE_ROPE_PROPORTIONAL &&
            !(c->partial_rotary_factor >= 0 && c->partial_rotary_factor <= 1))
            bad = 1;
        if (t == FUSEDROPE_ROPE_LONGROPE && !(FIN(c->factor) && c->factor >= 0))
            bad = 1;
        if (t >= FUSEDROPE_ROPE_DYNAMIC && t <= FUSEDROPE_ROPE_LLAMA3 &&
            c->original_max_positions <= 0)
            bad = 1;
        /* dynamic's exponent F/(F-2): F is the frequency dimension
         * (freq_dim, or rot_dim, whose half for VISION_2D) */
        if (t == FUSEDROPE_ROPE_DYNAMIC && (ref_freq_dim(c) < 4 || c->seq_len < 0))
            bad = 1;
        if (t == FUSEDROPE_ROPE_LONGROPE && c->seq_len < 0)
            bad = 1;
        if (t == FUSEDROPE_ROPE_YARN &&
            (!(FIN(c->beta_fast) && c->beta_fast > 0) || !(FIN(c->beta_slow) && c->beta_slow > 0) ||
             !(FIN(c->attention_factor) && c->attention_factor >= 0) ||
             !(FIN(c->mscale) && c->mscale >= 0) ||
             !(FIN(c->mscale_all_dim) && c->mscale_all_dim >= 0) ||
             (c->truncate != 0 && c->truncate != 1)))
            bad = 1;
        if (t == FUSEDROPE_ROPE_LONGROPE) {
            if (!(FIN(c->attention_factor) && c->attention_factor >= 0) || !c->short_factor ||
                !c->long_factor)
                bad = 1;
            else
                for (int i = 0; i < d / 2; i++)
                    if (!(FIN(c->short_factor[i]) && c->short_factor[i] > 0) ||
                        !(FIN(c->long_factor[i]) && c->long_factor[i] > 0))
                        bad = 1;
        }
        if (t == FUSEDROPE_ROPE_LLAMA3 &&
            !(FIN(c->low_freq_factor) && FIN(c->high_freq_factor) && c->low_freq_factor > 0 &&
              c->low_freq_factor <= c->high_freq_factor))
            bad = 1;
        /* position axes: the layouts' rules (ref_axes_map refuses what the
         * library must); the harness only makes freq_dim 0 or even <= rot_dim
         * and partial_rotary_factor in [0, 1] */
        /* freq_dim: 0 or in [2, 16384] (fusedrope_cache_create(3)) */
        if (c->freq_dim < 0 || c->freq_dim == 1 || c->freq_dim > 2 * FUSEDROPE_MAX_ROT_DIM)
            bad = 1;
        if ((int)c->axes < FUSEDROPE_AXES_NONE || (int)c->axes > FUSEDROPE_AXES_CUSTOM) {
            bad = 1;
        } else if (c->axes != FUSEDROPE_AXES_NONE) {
            static unsigned char ax[FUSEDROPE_MAX_ROT_DIM / 2];
            static int col[FUSEDROPE_MAX_ROT_DIM / 2];
            int n;
            if (ref_axes_map(c, ax, col, &n) != 0)
                bad = 1;
        }
    }
#undef FIN
    {
        unsigned must = 0, may = 0; /* statuses of broken rules; of open ones */
        if (bad)
            must |= 1u << FUSEDROPE_ERR_INVALID;
        if (device < 0 || device > FUSEDROPE_DEVICE_CUDA)
            must |= 1u << FUSEDROPE_ERR_INVALID;
        if (device == FUSEDROPE_DEVICE_CUDA && !fusedrope_cuda_available())
            must |= 1u << FUSEDROPE_ERR_UNSUPPORTED;
        if (!bad && c->max_positions > 0 &&
            (uint64_t)c->max_positions > SIZE_MAX / (2 * sizeof(float)) / (uint64_t)(d / 2))
            must |= 1u << FUSEDROPE_ERR_RANGE;
        if (!bad) {
            int fin = derived_finite(c);
            if (fin == 0 && !known_issue(KI_NONFINITE_TABLE))
                must |= 1u << FUSEDROPE_ERR_INVALID;
            else if (fin != 1)
                may |= 1u << FUSEDROPE_ERR_INVALID;
        }
        return (must ? must : 1u << FUSEDROPE_OK) | may;
    }
}


/* Whether an accepted config's table may hold non-finite values: the open
 * issue KI_NONFINITE_TABLE (attention factor or inverse frequency not finite,
 * or cos * attention factor past FLT_MAX). */
int table_all_finite(const float *c, const float *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(c[i]) || !isfinite(s[i]))
            return 0;
    return 1;
}

void free_cache_t(cache_t *ct)
{
    fusedrope_cache_destroy(ct->cache);
    free(ct->tcos);
    free(ct->tsin);
    free(ct->sf);
    free(ct->lf);
    free(ct->pair_axis);
    free(ct->pair_col);
    memset(ct, 0, sizeof *ct);
}

int64_t pick_positions(src_t *s, int half)
{
    unsigned b = u8(s);
    int64_t p;
    static const int64_t huge[] = { -1, -2, INT64_MIN, (int64_t)1 << 62, INT64_MAX, INT64_MAX - 1,
                                    ((int64_t)1 << 62) + 1, -((int64_t)1 << 62) };
    if (b < 40)
        return 0;
    if (b < 200)
        p = 64 + (b - 40) % 97; /* 64 .. 160 */
    else if (b < 232)
        p = 1 + u16(s) % 4096;
    else
        return huge[b % (sizeof huge / sizeof huge[0])];
    if (half > 0 && p * half > FZ_MAX_TABLE)
        p = FZ_MAX_TABLE / half;
    return p < 1 ? 1 : p;
}

int pick_rot_dim(src_t *s)
{
    static const int common[] = { 2, 4, 8, 16, 6, 32, 64, 10, 12, 128 };
    /* the rarer draws: invalid sizes, the largest, and the mid-range
     * (Phi-3's 96, Gemma's 256 and 512, vector tails of 65 and 129 pairs)
     * that the common list leaves out; 20 entries, so each of the 20 bytes
     * 236..255 picks a different one */
    static const int odd[] = { 0, -2, 1, 3, FUSEDROPE_MAX_ROT_DIM, FUSEDROPE_MAX_ROT_DIM + 2,
                               INT_MAX, INT_MIN, 4096, 8190, 2, 4,
                               80, 96, 130, 192, 256, 258, 512, 1026 };
    unsigned b = u8(s);
    if (b < 236)
        return common[b % (sizeof common / sizeof common[0])];
    return odd[b % (sizeof odd / sizeof odd[0])];
}

int pick_device(src_t *s)
{
    unsigned b = u8(s);
    if (b < 220)
        return FUSEDROPE_DEVICE_CPU;
    if (b < 236)
        return FUSEDROPE_DEVICE_AUTO;
    if (b < 246)
        return FUSEDROPE_DEVICE_CUDA;
    return b & 1 ? -1 : 3 + (int)(b % 5);
}

/* Position axes and the 0.2 rope fields for a config (a valid rot_dim):
 * a preset with sections that fit or not, or a custom map, sometimes the
 * proportional type and a freq_dim. */
void gen_axes(src_t *s, fusedrope_cache_config *cfg, cache_t *ct, rng_t *r)
{
    unsigned b = u8(s), sb = u8(s), tb = u8(s);
    int half = cfg->rot_dim / 2;
    int ax = b < 240 ? (int)(b % 6) : (b & 1 ? -1 : 6 + (int)(b % 3));
    cfg->axes = (fusedrope_axes)ax;
    if (sb < 160) { /* sections that sum to half, as the preset wants them */
        int s1 = (int)(u8(s) % (unsigned)(half / 3 + 1)), s2 = s1;
        if (ax == FUSEDROPE_AXES_SECTIONS && (sb & 1))
            s2 = (int)(u8(s) % (unsigned)(half - s1 + 1));
        cfg->sections[1] = s1;
        cfg->sections[2] = s2;
        cfg->sections[0] = half - s1 - s2;
        if (ax == FUSEDROPE_AXES_SECTIONS && (sb & 2) && cfg->sections[0] > 0) {
            cfg->sections[3] = (int)(u8(s) % (unsigned)(cfg->sections[0] + 1));
            cfg->sections[0] -= cfg->sections[3];
        }
    } else { /* anything */
        for (int a = 0; a < FUSEDROPE_MAX_AXES; a++)
            cfg->sections[a] = u8(s) < 240 ? (int)(u8(s) % 40) : any_int(s);
    }
    if (ax == FUSEDROPE_AXES_CUSTOM && !(sb & 0x80 && sb & 0x40)) {
        ct->pair_axis = malloc((size_t)half);
        if (!ct->pair_axis)
            abort();
        for (int j = 0; j < half; j++)
            ct->pair_axis[j] = (unsigned char)(rnext(r) % 4);
        if (sb & 4)
            ct->pair_axis[u8(s) % (unsigned)half] = (unsigned char)(u8(s) % 8);
        cfg->pair_axis = ct->pair_axis;
        if (sb & 8) {
            ct->pair_col = malloc(sizeof(int) * (size_t)half);
            if (!ct->pair_col)
                abort();
            for (int j = 0; j < half; j++)
                ct->pair_col[j] = (int)(rnext(r) % (uint64_t)half);
            if (sb & 16)
                ct->pair_col[u8(s) % (unsigned)half] = u8(s) & 1 ? half : -1;
            cfg->pair_col = ct->pair_col;
        }
    }
    if (tb & 1) {
        /* (shares whose floor(partial * rot_dim/2) no rounding can move
         * for the harness's rot_dims, or 0.3) */
        static const double partial[] = { 0, 0.25, 0.5, 1, 0.3, 0.75 };
        cfg->type = FUSEDROPE_ROPE_PROPORTIONAL;
        cfg->partial_rotary_factor = partial[(tb >> 1) % 6];
        cfg->factor = tb & 0x10 ? 1.0 : any_double(s, 1.0);
    }
    if ((tb & 0x20) && half >= 2) /* an even F in [4, rot_dim] */
        cfg->freq_dim = 2 * (2 + (int)(u8(s) % (unsigned)(half - 1)));
}

static void *dup_mem(const void *p, size_t n)
{
    void *q;
    if (!p)
        return NULL;
    q = malloc(n ? n : 1);
    if (!q)
        abort();
    memcpy(q, p, n);
    return q;
}

static void poison_free(void *p, size_t n)
{
    if (p)
        memset(p, 0xff, n);
    free(p);
}

static int all_bytes(const void *p, size_t n, unsigned char v)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != v)
            return 0;
    return 1;
}

/* A getter's double against the harness's reference: equal, or within
 * 1e-9 relative (the reference's own formulas in another order). */
static int near_ref(double got, double ref)
{
    return got == ref || fabs(got - ref) <= 1e-9 * fabs(ref);
}

/* fusedrope_cache_inv_freq, _attention_factor and _longrope_long against
 * what the harness derived (fusedrope_cache_copy_table(3)). */
static void check_getters(const cache_t *ct)
{
    double inv[FUSEDROPE_MAX_ROT_DIM / 2 + 1];
    int ll = fusedrope_cache_longrope_long(ct->cache);
    double a = fusedrope_cache_attention_factor(ct->cache);
    fusedrope_status st;
    xst.getters++;
    for (int i = 0; i <= ct->half; i++)
        inv[i] = -777.0;
    st = fusedrope_cache_inv_freq(ct->cache, inv);
    CHECK(fusedrope_cache_attention_factor(NULL) == 0 && fusedrope_cache_longrope_long(NULL) == -1,
          "attention_factor/longrope_long of a NULL cache");
    CHECK(fusedrope_cache_inv_freq(ct->cache, NULL) == FUSEDROPE_ERR_INVALID &&
              fusedrope_cache_inv_freq(NULL, inv + 1) == FUSEDROPE_ERR_INVALID,
          "inv_freq with a NULL argument must be INVALID");
    CHECK(inv[ct->half] == -777.0, "inv_freq wrote past rot_dim/2 doubles");
    if (ct->type < 0) {
        CHECK(st == FUSEDROPE_ERR_INVALID && inv[0] == -777.0,
              "inv_freq of a user-table cache gave %d (must be INVALID, writing nothing)", st);
        CHECK(a == 0 && ll == -1, "a user-table cache: attention_factor %g (0), longrope_long %d (-1)",
              a, ll);
        return;
    }
    CHECK(st == FUSEDROPE_OK, "inv_freq of a config cache gave %d", st);
    for (int i = 0; i < ct->half; i++)
        CHECK(near_ref(inv[i], ct->inv[i]),
              "inv_freq[%d] is %.17g, the reference %.17g", i, inv[i], ct->inv[i]);
    CHECK(near_ref(a, ct->attn),
          "attention_factor %.17g, the reference %.17g", a, ct->attn);
    if (ct->type == FUSEDROPE_ROPE_LONGROPE) {
        const fusedrope_cache_config *c = &ct->cfg;
        int want = c->seq_len > 0 ? c->seq_len > c->original_max_positions
                                  : c->max_positions > c->original_max_positions;
        CHECK(ll == want, "longrope_long %d, expected %d (seq_len %lld, max_positions %lld, "
              "original %lld)", ll, want, (long long)c->seq_len, (long long)c->max_positions,
              (long long)c->original_max_positions);
    } else {
        CHECK(ll == -1, "longrope_long %d for rope type %d", ll, ct->type);
    }
}

/* Builds the cache the input describes and checks the create call.  Returns
 * 1 with ct->cache set (a CPU cache), or 0 when there is none. */
int make_cache(src_t *s, cache_t *ct, rng_t *r)
{
    unsigned how = u8(s);
    int device = pick_device(s);
    fusedrope_status st;
    fusedrope_cache *out = (fusedrope_cache *)(uintptr_t)0x10; /* must become NULL on failure */
    unsigned allowed;
    char before[600];

    memset(ct, 0, sizeof *ct);
    snprintf(before, sizeof before, "%s", fusedrope_last_error());

    if (how % 8 == 7) {
        /* fusedrope_cache_create_from_table */
        int rot = pick_rot_dim(s), half = rot / 2;
        int good = rot >= 2 && rot <= FUSEDROPE_MAX_ROT_DIM && rot % 2 == 0;
        int64_t pos = pick_positions(s, good ? half : 1);
        unsigned nullness = u8(s);
        int ok_size = good && pos >= 1 && (i128)pos * half <= FZ_MAX_TABLE;
        size_t n = ok_size ? (size_t)pos * (size_t)half : 4;
        float *c = malloc(n * sizeof(float)), *sn = malloc(n * sizeof(float));
        if (!c || !sn)
            abort();
        for (size_t i = 0; i < n; i++) {
            uint64_t x = rnext(r);
            c[i] = (float)((double)(x & 0xffffff) / 0xffffff * 3.0 - 1.5);
            sn[i] = (float)((double)((x >> 24) & 0xffffff) / 0xffffff * 3.0 - 1.5);
            if ((nullness & 0x40) && (x >> 58) == 0)
                c[i] = (x >> 57) & 1 ? NAN : INFINITY; /* garbage in a user table is used as is */
        }
        note("create_from_table(%s, %s, positions %lld, rot_dim %d, device %d)\n",
             nullness % 16 == 1 ? "NULL" : "cos", nullness % 16 == 2 ? "NULL" : "sin",
             (long long)pos, rot, device);
        /* the library gets copies, poisoned (NaN) right after the create: the
         * man page says the table is copied */
        float *lc = dup_mem(c, n * sizeof(float)), *ls = dup_mem(sn, n * sizeof(float));
        if (nullness % 16 == 3) {
            st = fusedrope_cache_create_from_table(lc, ls, pos, rot, (fusedrope_device)device, NULL);
            CHECK(st == FUSEDROPE_ERR_INVALID, "create_from_table with out NULL gave %d", st);
            out = NULL;
        } else {
            st = fusedrope_cache_create_from_table(nullness % 16 == 1 ? NULL : lc,
                                                   nullness % 16 == 2 ? NULL : ls, pos, rot,
                                                   (fusedrope_device)device, &out);
        }
        poison_free(lc, n * sizeof(float));
        poison_free(ls, n * sizeof(float));
        if (nullness % 16 == 1 || nullness % 16 == 2 || nullness % 16 == 3 || pos < 1 || !good ||
            device < 0 || device > 2)
            allowed = 1u << FUSEDROPE_ERR_INVALID;
        else if (device == FUSEDROPE_DEVICE_CUDA && !fusedrope_cuda_available())
            allowed = 1u << FUSEDROPE_ERR_UNSUPPORTED;
        else if ((uint64_t)pos > SIZE_MAX / (2 * sizeof(float)) / (uint64_t)half)
            allowed = 1u << FUSEDROPE_ERR_RANGE;
        else
            allowed = 1u << FUSEDROPE_OK;
        if (allowed & (1u << FUSEDROPE_ERR_INVALID)) /* several reasons: any of the statuses */
            allowed |= (1u << FUSEDROPE_ERR_UNSUPPORTED) | (1u << FUSEDROPE_ERR_RANGE);
        CHECK(allowed & (1u << st), "create_from_table returned %d (%s); allowed mask 0x%x", st,
              fusedrope_status_string(st), allowed);
        if (st != FUSEDROPE_OK) {
            CHECK(out == NULL, "failed create_from_table left *out = %p", (void *)out);
            CHECK(fusedrope_last_error()[0], "failed create_from_table left no error detail");
            check_error_len("create_from_table");
            free(c);
            free(sn);
            return 0;
        }
        CHECK(strcmp(before, fusedrope_last_error()) == 0, "successful create changed last_error");
        ct->cache = out;
        ct->type = -1;
        ct->rot_dim = rot;
        ct->half = half;
        ct->max_positions = pos;
        ct->tcos = c;
        ct->tsin = sn;
        ct->trows = pos;
    } else {
        fusedrope_cache_config *cfg = &ct->cfg;
        unsigned tb = u8(s);
        int type = tb < 240 ? (int)(tb % 6) : (tb & 1 ? -1 : 6 + (int)(tb % 7));
        int rot = pick_rot_dim(s);
        int good_rot = rot >= 2 && rot <= FUSEDROPE_MAX_ROT_DIM && rot % 2 == 0;
        int64_t maxpos = pick_positions(s, good_rot ? rot / 2 : 1);
        double theta = any_double(s, 10000.0);
        unsigned fields = u8(s), nullness = u8(s);
        fusedrope_cache_config_init(NULL, FUSEDROPE_ROPE_DEFAULT, 2, 1, 10.0); /* no-op */
        fusedrope_cache_config_init(cfg, (fusedrope_rope_type)type, rot, maxpos, theta);
        /* the documented defaults */
        CHECK(cfg->type == (fusedrope_rope_type)type && cfg->rot_dim == rot &&
                  cfg->max_positions == maxpos && (cfg->theta == theta || isnan(theta)) &&
                  cfg->factor == (type == FUSEDROPE_ROPE_LONGROPE ? 0.0 : 1.0) &&
                  cfg->original_max_positions == 0 && cfg->seq_len == 0 &&
                  cfg->attention_factor == 0 && cfg->beta_fast == 32 && cfg->beta_slow == 1 &&
                  cfg->mscale == 0 && cfg->mscale_all_dim == 0 && cfg->truncate == 1 &&
                  cfg->low_freq_factor == 1 && cfg->high_freq_factor == 4 &&
                  !cfg->short_factor && !cfg->long_factor,
              "fusedrope_cache_config_init did not set the documented defaults");
        if (type >= FUSEDROPE_ROPE_DYNAMIC) {
            static const int64_t orig[] = { 64, 32, 4096, 16, 8192, 1, 2, 131072 };
            unsigned b = u8(s);
            cfg->original_max_positions = b < 224 ? orig[b % 8] : any_i64(s);
        }
        if (type != FUSEDROPE_ROPE_DEFAULT)
            cfg->factor = any_double(s, type == FUSEDROPE_ROPE_LONGROPE ? 0.0 : 4.0);
        if (fields & 1)
            cfg->seq_len = any_i64(s);
        if (fields & 2)
            cfg->attention_factor = any_double(s, 0.0);
        if (fields & 4) {
            cfg->beta_fast = any_double(s, 32.0);
            cfg->beta_slow = any_double(s, 1.0);
        }
        if (fields & 8) {
            cfg->mscale = any_double(s, 1.0);
            cfg->mscale_all_dim = any_double(s, 0.707);
        }
        if (fields & 16)
            cfg->truncate = u8(s) < 200 ? 0 : any_int(s);
        if (fields & 32) {
            cfg->low_freq_factor = any_double(s, 1.0);
            cfg->high_freq_factor = any_double(s, 4.0);
        }
        if (type == FUSEDROPE_ROPE_LONGROPE || (fields & 64)) {
            /* rot_dim/2 entries each, when rot_dim is valid (a bad rot_dim must
             * be refused before the arrays are read) */
            size_t n = good_rot ? (size_t)rot / 2 : 1;
            ct->sf = malloc(n * sizeof(double));
            ct->lf = malloc(n * sizeof(double));
            if (!ct->sf || !ct->lf)
                abort();
            for (size_t i = 0; i < n; i++) {
                ct->sf[i] = 1.0 + (double)(rnext(r) % 1000) / 100.0;
                ct->lf[i] = 1.0 + (double)(rnext(r) % 4000) / 100.0;
            }
            if (nullness & 4)
                ct->sf[u8(s) % n] = any_double(s, 2.0);
            if (nullness & 8)
                ct->lf[u8(s) % n] = any_double(s, 2.0);
            cfg->short_factor = nullness % 4 == 1 ? NULL : ct->sf;
            cfg->long_factor = nullness % 4 == 2 ? NULL : ct->lf;
        }
        if ((nullness & 0xe0) == 0xe0 && good_rot)
            gen_axes(s, cfg, ct, r);
        allowed = config_allowed(cfg, device, 1, 1);
        if (nullness % 32 == 19) {
            st = fusedrope_cache_create(NULL, (fusedrope_device)device, &out);
            allowed = 1u << FUSEDROPE_ERR_INVALID;
            note("create(NULL config)\n");
        } else if (nullness % 32 == 27) {
            st = fusedrope_cache_create(cfg, (fusedrope_device)device, NULL);
            CHECK(st == FUSEDROPE_ERR_INVALID, "create with out NULL gave %d", st);
            out = NULL;
            allowed = 1u << FUSEDROPE_ERR_INVALID;
            note("create(out NULL)\n");
        } else {
            note("create(type %d, rot_dim %d, max_positions %lld, theta %g, factor %g, orig %lld, "
                 "seq_len %lld, attn %g, beta %g/%g, mscale %g/%g, truncate %d, llama3 %g/%g, "
                 "longrope %p/%p, axes %d [%d %d %d %d] map %p/%p, partial %g, freq_dim %d; "
                 "device %d)\n",
                 (int)cfg->type, rot, (long long)maxpos, theta, cfg->factor,
                 (long long)cfg->original_max_positions, (long long)cfg->seq_len,
                 cfg->attention_factor, cfg->beta_fast, cfg->beta_slow, cfg->mscale,
                 cfg->mscale_all_dim, cfg->truncate, cfg->low_freq_factor, cfg->high_freq_factor,
                 (const void *)cfg->short_factor, (const void *)cfg->long_factor,
                 (int)cfg->axes, cfg->sections[0], cfg->sections[1], cfg->sections[2],
                 cfg->sections[3], (const void *)cfg->pair_axis, (const void *)cfg->pair_col,
                 cfg->partial_rotary_factor, cfg->freq_dim, device);
            /* the arrays the man page says are copied at create: the
             * library gets copies, poisoned right after */
            fusedrope_cache_config lcfg = *cfg;
            size_t nf = good_rot ? (size_t)rot / 2 : 1;
            lcfg.short_factor = dup_mem(cfg->short_factor, nf * sizeof(double));
            lcfg.long_factor = dup_mem(cfg->long_factor, nf * sizeof(double));
            lcfg.pair_axis = dup_mem(cfg->pair_axis, nf);
            lcfg.pair_col = dup_mem(cfg->pair_col, nf * sizeof(int));
            st = fusedrope_cache_create(&lcfg, (fusedrope_device)device, &out);
            poison_free((void *)lcfg.short_factor, nf * sizeof(double));
            poison_free((void *)lcfg.long_factor, nf * sizeof(double));
            poison_free((void *)lcfg.pair_axis, nf);
            poison_free((void *)lcfg.pair_col, nf * sizeof(int));
        }
        if (verbose_mode)
            fprintf(stderr, "create: %d %s\n", st, fusedrope_last_error());
        CHECK(allowed & (1u << st), "cache_create returned %d (%s); allowed mask 0x%x", st,
              fusedrope_status_string(st), allowed);
        if (st != FUSEDROPE_OK) {
            CHECK(out == NULL, "failed cache_create left *out = %p", (void *)out);
            CHECK(fusedrope_last_error()[0], "failed cache_create left no error detail");
            check_error_len("cache_create");
            return 0;
        }
        CHECK(strcmp(before, fusedrope_last_error()) == 0, "successful create changed last_error");
        ct->cache = out;
        ct->type = (int)cfg->type;
        ct->rot_dim = rot;
        ct->half = rot / 2;
        ct->max_positions = maxpos;
        CHECK(ref_axes_map(cfg, ct->axis, ct->col, &ct->naxes) == 0,
              "an accepted config's axes are refused by the reference");
        ct->has_axes = cfg->axes != FUSEDROPE_AXES_NONE;
        /* a config the library accepted is one the reference can compute:
         * config_allowed gave OK only where derived_finite did */
        CHECK(ref_inv_freq(cfg, ct->inv, &ct->attn) == 0, "no reference for rope type %d", type);
        ct->formula = 1;
    }

    /* getters, and the table itself */
    CHECK(fusedrope_cache_rot_dim(ct->cache) == ct->rot_dim, "rot_dim getter");
    CHECK(fusedrope_cache_max_positions(ct->cache) == ct->max_positions, "max_positions getter");
    if (fusedrope_cache_device(ct->cache) != FUSEDROPE_DEVICE_CPU) {
        /* AUTO on a machine with a GPU: host buffers are refused; nothing to do here */
        CHECK(fusedrope_cache_device(ct->cache) == FUSEDROPE_DEVICE_CUDA, "device getter");
        return 0;
    }
    CHECK(fusedrope_cache_check(ct->cache, NULL) == FUSEDROPE_OK, "cache_check on a CPU cache");
    check_getters(ct);
    if (ct->max_positions == 0) {
        float dummy[2] = { 12345.0f, -6789.0f };
        CHECK(fusedrope_cache_copy_table(ct->cache, dummy, dummy) == FUSEDROPE_ERR_INVALID,
              "copy_table of a table-less cache must be INVALID");
        CHECK(dummy[0] == 12345.0f && dummy[1] == -6789.0f,
              "a refused copy_table (table-less cache) wrote its arrays");
    } else if (ct->type >= 0) {
        size_t n = (size_t)ct->max_positions * (size_t)ct->half;
        int identity = 1;
        for (int j = 0; j < ct->half; j++)
            identity &= ct->col[j] == j;
        float *c = malloc(n * sizeof(float)), *sn = malloc(n * sizeof(float));
        if (!c || !sn)
            abort();
        /* refused copies write nothing: poisoned arrays stay poisoned */
        memset(c, 0xa5, n * sizeof(float));
        memset(sn, 0x5a, n * sizeof(float));
        CHECK(fusedrope_cache_copy_table(ct->cache, NULL, sn) == FUSEDROPE_ERR_INVALID,
              "copy_table(cos NULL)");
        CHECK(fusedrope_cache_copy_table(ct->cache, c, NULL) == FUSEDROPE_ERR_INVALID,
              "copy_table(sin NULL)");
        CHECK(fusedrope_cache_copy_table(NULL, c, sn) == FUSEDROPE_ERR_INVALID,
              "copy_table(cache NULL)");
        CHECK(all_bytes(c, n * sizeof(float), 0xa5) && all_bytes(sn, n * sizeof(float), 0x5a),
              "a refused copy_table wrote its arrays");
        CHECK(fusedrope_cache_copy_table(ct->cache, c, sn) == FUSEDROPE_OK, "copy_table failed");
        if (!table_all_finite(c, sn, n))
            CHECK(known_issue(KI_NONFINITE_TABLE),
                  "an accepted config gave a table with non-finite entries");
        /* the table against the reference, on a sample of rows: DESIGN's
         * cos(p inv_i) a and sin(p inv_i) a rounded once to float32 */
        /* (row p, pair i) holds column i's angle; a map with other columns
         * leaves the table's layout to the library */
        for (int64_t p = 0; p < ct->max_positions && identity; p += 1 + ct->max_positions / 16)
            for (int i = 0; i < ct->half; i++) {
                double a = (double)p * ct->inv[i];
                double ec = cos(a) * ct->attn, es = sin(a) * ct->attn;
                float gc = c[(size_t)p * ct->half + i], gs = sn[(size_t)p * ct->half + i];
                double tol = ldexp(ref_ulp(ct->attn, FUSEDROPE_FLOAT32), -1) +
                             ref_angle_slack(a) * ct->attn;
                if (!isfinite(ec) || !isfinite(es)) {
                    CHECK(known_issue(KI_NONFINITE_TABLE),
                          "an accepted config has a non-finite angle at row %lld pair %d",
                          (long long)p, i);
                    continue;
                }
                CHECK(fabs(gc - ec) <= tol && fabs(gs - es) <= tol,
                      "table row %lld pair %d: cos %.9g sin %.9g, expected %.17g %.17g "
                      "(tolerance %.3g)",
                      (long long)p, i, gc, gs, ec, es, tol);
            }
        free(c);
        free(sn);
    }
    return 1;
}

/* --------------------------------------------------------------- tensors */
int64_t smul(int64_t a, int64_t b)
{
    i128 r = (i128)a * b;
    if (r > INT64_MAX)
        return INT64_MAX;
    if (r < INT64_MIN)
        return INT64_MIN;
    return (int64_t)r;
}

int64_t sadd(int64_t a, int64_t b)
{
    i128 r = (i128)a + b;
    return r > INT64_MAX ? INT64_MAX : r < INT64_MIN ? INT64_MIN : (int64_t)r;
}

int64_t any_stride(src_t *s)
{
    unsigned b = u8(s);
    if (b < 160)
        return (int64_t)(b % 80);
    return any_i64(s);
}

/* Strides for a layout family (0 sbhd, 1 bshd, 2 thd) chosen by the input. */
void gen_strides(src_t *s, fusedrope_tensor *t, int family, int *arbitrary)
{
    unsigned mode = u8(s) % 10;
    int64_t S = t->seq_len, B = t->batch, H = t->heads, D = t->head_dim;
    int64_t ph = u8(s) % 4, pb = u8(s) % 4, ps = u8(s) % 4;
    fusedrope_tensor std;
    *arbitrary = 0;
    switch (mode) {
    case 0: case 1: case 2: case 3:
        std = family == 0 ? fusedrope_tensor_sbhd(NULL, t->dtype, S, B, H, D)
              : family == 1 ? fusedrope_tensor_bshd(NULL, t->dtype, B, S, H, D)
                            : fusedrope_tensor_thd(NULL, t->dtype, S, H, D);
        t->stride_seq = std.stride_seq;
        t->stride_batch = std.stride_batch;
        t->stride_head = std.stride_head;
        CHECK(std.seq_len == S && std.heads == H && std.head_dim == D &&
                  std.batch == (family == 2 ? 1 : B) && std.dtype == t->dtype,
              "tensor constructor shape");
        break;
    case 4: case 5: case 6: /* padded */
        t->stride_head = sadd(D, ph);
        if (family == 1) {
            t->stride_seq = sadd(smul(H, t->stride_head), ps);
            t->stride_batch = sadd(smul(S, t->stride_seq), pb);
        } else {
            t->stride_batch = sadd(smul(H, t->stride_head), pb);
            t->stride_seq = sadd(smul(B, t->stride_batch), ps);
        }
        break;
    case 7: /* heads outermost */
        t->stride_batch = sadd(D, pb);
        t->stride_seq = sadd(smul(B, t->stride_batch), ps);
        t->stride_head = sadd(smul(S, t->stride_seq), ph);
        break;
    case 8: /* arbitrary */
        t->stride_seq = any_stride(s);
        t->stride_batch = any_stride(s);
        t->stride_head = any_stride(s);
        *arbitrary = 1;
        break;
    default: /* padded, one stride replaced */
        t->stride_head = sadd(D, ph);
        t->stride_batch = sadd(smul(H, t->stride_head), pb);
        t->stride_seq = sadd(smul(B, t->stride_batch), ps);
        switch (u8(s) % 3) {
        case 0: t->stride_seq = any_stride(s); break;
        case 1: t->stride_batch = any_stride(s); break;
        default: t->stride_head = any_stride(s); break;
        }
        *arbitrary = 1;
        break;
    }
}

/* Products and sums of non-negative 64-bit values, saturating at 2^100 (far
 * past anything the library may accept). */
#define SAT ((i128)1 << 100)
i128 sat(i128 a)
{
    return a > SAT ? SAT : a;
}
i128 sat_mul(i128 a, i128 b)
{
    if (a == 0 || b == 0)
        return 0;
    if (a >= SAT || b >= SAT || a > SAT / b)
        return SAT;
    return a * b;
}

void classify(tspec *ts)
{
    const fusedrope_tensor *t = &ts->t;
    /* the stride of a dimension of size 1 is ignored, whatever its value */
    ts->shape_ok = dtype_ok((int)t->dtype) && t->seq_len >= 0 && t->batch >= 0 && t->heads >= 0 &&
                   t->head_dim >= 0 && (t->seq_len == 1 || t->stride_seq >= 0) &&
                   (t->batch == 1 || t->stride_batch >= 0) && (t->heads == 1 || t->stride_head >= 0);
    ts->empty = t->seq_len == 0 || t->batch == 0 || t->heads == 0;
    ts->overflow = ts->oversize = 0;
    ts->ext = 0;
    if (!ts->present || !ts->shape_ok || ts->empty)
        return;
    {
        /* (n - 1) * stride is 0 for a dimension of size 1, whatever the stride */
        i128 e = sat(sat((i128)(t->seq_len - 1) * t->stride_seq) +
                     sat((i128)(t->batch - 1) * t->stride_batch) +
                     sat((i128)(t->heads - 1) * t->stride_head) + t->head_dim);
        e = sat_mul(e, (i128)dtype_size((int)t->dtype));
        ts->ext = e;
        if (e > INT64_MAX)
            ts->overflow = 1;
        else if (e > (i128)FZ_LIMIT)
            ts->oversize = 1;
    }
}

/* Small, element-aligned, or oversize/overflowing: whether the harness can
 * enumerate its elements. */
int mappable(const tspec *ts)
{
    return ts->present && ts->shape_ok && !ts->empty && !ts->overflow && !ts->oversize &&
           ts->data_kind == 0;
}

/* ------------------------------------------------------------- positions */
void free_pspec(pspec *ps)
{
    free(ps->ids);
    free(ps->offsets);
    free(ps->cu);
}

/* A position value inside [0, room) mostly, else an interesting one. */
int64_t pos_value(src_t *s, int64_t room)
{
    unsigned b = u8(s);
    if (b < 220 && room > 0)
        return (int64_t)(u32(s) % (uint64_t)room);
    if (b < 236)
        return room + (int64_t)(b % 3) - 1; /* at and around the table's end */
    return any_i64(s);
}

void gen_positions(src_t *s, pspec *ps, int64_t S, int64_t B, int thd, int64_t maxpos,
                          int naxes)
{
    unsigned mode = u8(s), mut = u8(s);
    int64_t room = maxpos > 0 ? maxpos : 1 << 20;
    memset(ps, 0, sizeof *ps);
    if (mode % 8 == 0)
        return;
    ps->given = 1;
    fusedrope_positions_init(&ps->p);
    ps->p.cp_size = (mode & 8) ? 1 : 0;
    if (mode % 8 == 5 || mode % 8 == 7 || (mode % 8 == 6 && (mut & 1))) {
        unsigned b = u8(s);
        ps->p.cp_size = b < 200 ? 1 + (int)(b % 4) : any_int(s);
        b = u8(s);
        ps->p.cp_rank = b < 200 && ps->p.cp_size > 0 ? (int)(b % (unsigned)ps->p.cp_size)
                                                     : any_int(s);
        if (ps->p.cp_size >= 1 << 30 && known_issue(KI_CP_INT_OVERFLOW)) {
            ps->p.cp_size = (1 << 30) - 1;
            if (ps->p.cp_rank > ps->p.cp_size)
                ps->p.cp_rank = ps->p.cp_size - (ps->p.cp_rank & 1);
        }
    }
    /* cu_seqlens: THD, or on purpose with a batched tensor */
    if ((thd || (mut & 0x40)) && (mode % 8 == 4 || mode % 8 == 7 || (mode % 8 == 6 && (mut & 2)))) {
        unsigned b = u8(s);
        int64_t n = b < 220 ? 1 + (int64_t)(b % 5) : any_i64(s);
        ps->p.num_seqs = n;
        if (n >= 1 && n < FZ_MAX_ARRAY) {
            int even = ps->p.cp_size > 1 && !(mut & 0x80);
            int64_t left = S >= 0 ? S : 0;
            ps->n_cu = n + 1;
            ps->cu = calloc((size_t)ps->n_cu, sizeof(int32_t));
            if (!ps->cu)
                abort();
            /* random split of the S tokens, even parts when asked */
            for (int64_t i = 1; i < n; i++) {
                int64_t len = left > 0 ? (int64_t)(u8(s) % (uint64_t)((left < 255 ? left : 255) + 1)) : 0;
                if (even)
                    len &= ~(int64_t)1;
                left -= len;
                ps->cu[i] = (int32_t)((int64_t)ps->cu[i - 1] + len);
            }
            ps->cu[n] = (int32_t)(S <= INT32_MAX ? S : INT32_MAX);
            if (mut & 4) { /* mutate one entry */
                int64_t i = (int64_t)(u8(s) % (unsigned)ps->n_cu);
                ps->cu[i] = (int32_t)any_int(s);
            }
        } else if (n < 1) {
            ps->n_cu = 1;
            ps->cu = calloc(1, sizeof(int32_t)); /* a num_seqs < 1 must be refused anyway */
            if (!ps->cu)
                abort();
        }
        ps->p.cu_seqlens = ps->cu;
    }
    if (mode % 8 == 3 || (mode % 8 == 6 && (mut & 8))) {
        i128 n = (i128)S * B;
        if (S >= 0 && B >= 0 && n <= FZ_MAX_ARRAY) {
            int rows = 1;
            int64_t stride = (int64_t)n;
            ps->n_ids = (int64_t)n;
            if (naxes > 1) {
                /* a cache with axes: one row, or a row per axis (dense, or a
                 * wider persistent buffer), or a wrong number of rows */
                static const int wrong[] = { -1, 2, 3, 4, 5, 1000 };
                unsigned ab = u8(s);
                if (ab >= 240)
                    ps->p.ids_axes = wrong[ab % 6] == naxes ? naxes + 1 : wrong[ab % 6];
                else if (ab % 4 < 2)
                    ps->p.ids_axes = (int)(ab % 4);
                else
                    ps->p.ids_axes = rows = naxes;
                if (ab < 240 && ab % 4 >= 2 && (ab & 4)) {
                    stride = (int64_t)n + 1 + (int64_t)((ab >> 3) % 9);
                    ps->p.ids_axis_stride = stride;
                }
                ps->n_ids = (int64_t)(rows - 1) * stride + (int64_t)n;
            }
            ps->rows = rows;
            ps->row_stride = stride;
            ps->ids = malloc((size_t)(ps->n_ids ? ps->n_ids : 1) * sizeof(int64_t));
            if (!ps->ids)
                abort();
            rng_t ir = { ((uint64_t)mode << 8 | mut) * 0x9e3779b97f4a7c15ull };
            for (int64_t i = 0; i < ps->n_ids; i++)
                ps->ids[i] = i % stride < (int64_t)n ? (int64_t)(rnext(&ir) % (uint64_t)room)
                                                     : INT64_MIN; /* between rows: never read */
            if (mut & 16) {
                if (ps->n_ids)
                    ps->ids[u16(s) % (unsigned)ps->n_ids] = sadd(pos_value(s, room + 4), -2);
            }
            ps->p.ids = ps->ids;
        }
    }
    if (mode % 8 == 2 || mode % 8 == 4 || (mode % 8 == 6 && (mut & 32)) ||
        (mode % 8 == 5 && (mut & 64))) {
        int64_t n = ps->p.cu_seqlens ? ps->p.num_seqs : B;
        if (n >= 0 && n <= FZ_MAX_ARRAY) {
            int64_t span = smul(ps->p.cp_size > 1 ? ps->p.cp_size : 1, S > 0 ? S : 0);
            ps->n_offsets = n;
            ps->offsets = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
            if (!ps->offsets)
                abort();
            for (int64_t i = 0; i < n; i++)
                ps->offsets[i] = room > span ? (int64_t)(u16(s) % (uint64_t)(room - span + 1)) : 0;
            if ((mut & 16) && n)
                ps->offsets[u8(s) % (unsigned)n] = sadd(pos_value(s, room), mut & 2 ? 0 : -span);
            ps->p.offsets = ps->offsets;
        }
    }
}

/* The global position of token (b, s) on an axis as the decisions define
 * it, exactly (128-bit): the row of ids for that axis where ids has rows,
 * else the reference's model (ref_token_position), with an int64 overflow
 * of the offset's sum undone.  THD: seq, j and len give the token's
 * sequence, index in it and length. */
i128 ref_position(const pspec *ps, int64_t S, int64_t b, int64_t s, int64_t seq, int64_t j,
                         int64_t len, int axis)
{
    int64_t v;
    int wrapped;
    if (ps->given && ps->p.ids && ps->rows > 1) /* axis `axis`'s row */
        return ps->p.ids[axis * ps->row_stride + b * S + s];
    wrapped = ref_token_position(ps->given ? &ps->p : NULL, b * S + s, seq, j, len, &v);
    if (!wrapped)
        return v;
    /* the true sum is v + 2^64 (positive overflow, v < 0) or v - 2^64 */
    return v < 0 ? (i128)v + ((i128)1 << 64) : (i128)v - ((i128)1 << 64);
}

/* -------------------------------------------------------------- the call */

void reason(verdict *v, fusedrope_status st, int hard, const char *fmt, ...)
{
    va_list ap;
    size_t l = strlen(v->why);
    if (hard) {
        v->must_fail = 1;
        v->hard |= 1u << st;
    } else {
        v->soft |= 1u << st;
    }
    if (l < sizeof v->why - 2) {
        va_start(ap, fmt);
        vsnprintf(v->why + l, sizeof v->why - l, fmt, ap);
        va_end(ap);
        l = strlen(v->why);
        if (l < sizeof v->why - 2) {
            v->why[l] = ';';
            v->why[l + 1] = 0;
        }
    }
}

/* Marks the bytes of ts's elements (all channels) in its buffer's map with
 * `bit`; returns 1 if one of them already had it (the view overlaps itself). */
int mark(buf_t *bufs, const tspec *ts, unsigned bit, int stop_at_self)
{
    const fusedrope_tensor *t = &ts->t;
    buf_t *bf = &bufs[ts->buf];
    size_t es = dtype_size((int)t->dtype);
    int self = 0;
    for (int64_t s = 0; s < t->seq_len; s++)
        for (int64_t b = 0; b < t->batch; b++)
            for (int64_t h = 0; h < t->heads; h++) {
                size_t o = ts->off + (size_t)(s * t->stride_seq + b * t->stride_batch +
                                              h * t->stride_head) * es;
                unsigned char *m = bf->map + o;
                size_t n = (size_t)t->head_dim * es;
                for (size_t i = 0; i < n; i++) {
                    if (m[i] & bit)
                        self = 1;
                    m[i] |= (unsigned char)bit;
                }
                if (self && stop_at_self)
                    return 1;
            }
    return self;
}

/* Whether the elements of a and b (mapped with bits ba and bb) share a byte. */
int shares(const buf_t *bufs, const tspec *a, unsigned ba, const tspec *b, unsigned bb)
{
    const buf_t *bf;
    if (a->buf != b->buf)
        return 0;
    bf = &bufs[a->buf];
    for (size_t i = 0; i < bf->size; i++)
        if ((bf->map[i] & ba) && (bf->map[i] & bb))
            return 1;
    return 0;
}

/* Whether two mapped views' byte ranges [off, off + ext) in one buffer
 * meet: the library proves views apart by their ranges first, and only
 * views whose ranges meet can get its conservative "may overlap". */
static int ranges_meet(const tspec *a, const tspec *b)
{
    return a->buf == b->buf && (i128)a->off < (i128)b->off + b->ext &&
           (i128)b->off < (i128)a->off + a->ext;
}

int same_view(const tspec *x, const tspec *y)
{
    /* strides of dimensions of size 1 do not count (the sizes are equal here) */
    return x->t.data == y->t.data &&
           (x->t.seq_len == 1 || x->t.stride_seq == y->t.stride_seq) &&
           (x->t.batch == 1 || x->t.stride_batch == y->t.stride_batch) &&
           (x->t.heads == 1 || x->t.stride_head == y->t.stride_head);
}

size_t esize_or1(int dt)
{
    return dtype_ok(dt) ? dtype_size(dt) : 1;
}

void copy_strides(fusedrope_tensor *y, const fusedrope_tensor *x)
{
    y->stride_seq = x->stride_seq;
    y->stride_batch = x->stride_batch;
    y->stride_head = x->stride_head;
}

/* Whether cu_seqlens (p->num_seqs + 1 entries) is the library's rule for
 * S0 tokens: from 0 to S0, never decreasing, each sequence even under
 * context parallelism. */
static int cu_contents_ok(const fusedrope_positions *p, int64_t S0)
{
    const int32_t *cu = p->cu_seqlens;
    if (cu[0] != 0 || (int64_t)cu[p->num_seqs] != S0)
        return 0;
    for (int64_t i = 0; i < p->num_seqs; i++)
        if (cu[i + 1] < cu[i] || (p->cp_size > 1 && (cu[i + 1] - cu[i]) % 2))
            return 0;
    return 1;
}

void fz_setup(src_t *s, cache_t *ct, rng_t *r, int null_cache, int qk, fz_call *fc)
{
    unsigned stb, dtb;
    memset(fc, 0, sizeof *fc);
    stb = u8(s);
    dtb = u8(s);
    fc->layout = u8(s);
    fc->null_cache = null_cache;
    fc->qk = qk;
    fc->count = qk ? 2 : 1;
    fc->family = fc->layout % 3;
    fc->style = stb < 240 ? (int)(stb & 1) : (stb & 1 ? -1 : 2 + (int)(stb % 9));
    fc->dt = dtb < 245 ? (int)(dtb % 3) : (dtb & 1 ? -1 : 3 + (int)(dtb % 3));
    fc->es = esize_or1(fc->dt);
    fc->rot = ct->rot_dim;
    fc->packed = qk && (fc->layout & 0x40);
    fc->stream = (void *)(uintptr_t)(u8(s) < 128 ? 0 : 0xdeadbeef);
    fc->all_valid = 1;
    fc->pos_struct_ok = 1;
    fc->naxes = ct->has_axes ? ct->naxes : 1; /* rows of tokpos */
    fc->written_mask = 0xa;

    memset(fc->ts, 0, sizeof fc->ts);
    memset(fc->bufs, 0, sizeof fc->bufs);
    memset(&fc->v, 0, sizeof fc->v);
    memset(&fc->ps, 0, sizeof fc->ps);

    /* ---- shapes */
    fc->S = dim(s, 1, 9);
    fc->B = fc->family == 2 ? 1 : dim(s, 1, 3);
    for (int k = 0; k < fc->count; k++) {
        fc->heads[k] = dim(s, k ? 0 : 1, 4);
        fc->hd[k] = u8(s) < 232 ? fc->rot + (int64_t)(u8(s) % 6) : any_i64(s);
        fc->rel[k] = u8(s);
    }
    if (fc->packed)
        fc->hd[1] = fc->hd[0];
    for (int k = 0; k < fc->count; k++) {
        tspec *x = &fc->ts[2 * k];
        x->present = 1;
        x->t.dtype = (fusedrope_dtype)fc->dt;
        x->t.seq_len = fc->S;
        x->t.batch = fc->B;
        x->t.heads = fc->heads[k];
        x->t.head_dim = fc->hd[k];
        gen_strides(s, &x->t, fc->family, &x->arbitrary);
    }
    if (fc->packed) {
        /* q and k as views of one packed [token][q heads | k heads | v heads] buffer */
        int64_t row = sadd(smul(fc->heads[0], fc->hd[0]), smul(smul(2, fc->heads[1]), fc->hd[0]));
        for (int k = 0; k < 2; k++) {
            fusedrope_tensor *t = &fc->ts[2 * k].t;
            t->stride_head = fc->hd[0];
            if (fc->family == 1) {
                t->stride_seq = row;
                t->stride_batch = smul(row, fc->S);
            } else {
                t->stride_batch = row;
                t->stride_seq = smul(row, fc->B);
            }
            fc->ts[2 * k].arbitrary = 0;
        }
    }
    if (fc->qk && (fc->layout & 0x80)) { /* k disagrees with q */
        switch (u8(s) % 3) {
        case 0: fc->ts[2].t.seq_len = dim(s, 0, 9); break;
        case 1: fc->ts[2].t.batch = dim(s, 0, 3); break;
        default: fc->ts[2].t.dtype = (fusedrope_dtype)((fc->dt + 1) % 3); break;
        }
    }

    /* ---- outputs: shape, strides and where they live */
    for (int k = 0; k < fc->count; k++) {
        tspec *x = &fc->ts[2 * k], *y = &fc->ts[2 * k + 1];
        unsigned rk = fc->packed ? (fc->rel[0] & 1 ? 3 : 0) : fc->rel[k];
        y->present = 1;
        y->t = x->t;
        y->arbitrary = x->arbitrary;
        if (rk % 8 == 2 || rk % 8 == 6) /* own strides */
            gen_strides(s, &y->t, fc->family, &y->arbitrary);
        if (!fc->packed && (rk & 0x80)) { /* a shape or dtype mismatch with the input */
            switch (u8(s) % 5) {
            case 0: y->t.seq_len = dim(s, 0, 9); break;
            case 1: y->t.batch = dim(s, 0, 3); break;
            case 2: y->t.heads = dim(s, 0, 4); break;
            case 3: y->t.head_dim = dim(s, fc->rot, 4); break;
            default: y->t.dtype = (fusedrope_dtype)((fc->dt + 1 + (int)(u8(s) % 2)) % 3); break;
            }
        }
    }
    /* inputs' buffers (in1 inside in0's when packed) */
    for (int k = 0; k < fc->count; k++) {
        tspec *x = &fc->ts[2 * k];
        if (fc->packed && k == 1) {
            i128 qw = fc->heads[0] > 0 && fc->hd[0] > 0 ? (i128)fc->heads[0] * fc->hd[0] : 0;
            x->buf = fc->ts[0].buf;
            x->off = fc->ts[0].off + (size_t)(qw < (i128)FZ_LIMIT ? qw : (i128)FZ_LIMIT) * fc->es;
        } else {
            unsigned lb = u8(s);
            x->buf = fc->nbuf++;
            x->off = (size_t)(lb % 16) * fc->es;
            if ((lb & 0x80) && fc->es > 1 && !known_issue(KI_MISALIGNED))
                x->off += 1 + (lb >> 4) % (fc->es - 1); /* not a multiple of the element size */
        }
    }
    for (int k = 0; k < fc->count; k++) {
        tspec *x = &fc->ts[2 * k], *y = &fc->ts[2 * k + 1];
        unsigned rk = fc->rel[k];
        if (fc->packed) {
            /* in place, or their own packed buffer */
            copy_strides(&y->t, &x->t);
            y->off = x->off;
            if (fc->rel[0] & 1)
                y->buf = x->buf;
            else
                y->buf = k == 0 ? fc->nbuf++ : fc->ts[1].buf;
            continue;
        }
        switch (rk % 8) {
        case 3: case 4: /* in place */
            copy_strides(&y->t, &x->t);
            y->arbitrary = x->arbitrary;
            y->buf = x->buf;
            y->off = x->off;
            break;
        case 5: { /* same buffer, shifted by a few elements: partial overlap, or disjoint */
            int64_t delta = (int64_t)(u8(s) % 64) - 16;
            int64_t o = (int64_t)x->off + delta * (int64_t)fc->es;
            y->buf = x->buf;
            y->off = o >= 0 ? (size_t)o : 0;
            if (u8(s) & 1) { /* or just past the whole input */
                classify(x);
                y->off = x->off + (x->ext > 0 && x->ext <= (i128)FZ_LIMIT ? (size_t)x->ext : 0);
            }
            break;
        }
        case 6: /* same buffer, same pointer, other strides */
            y->buf = x->buf;
            y->off = x->off;
            break;
        case 7:
            if (fc->qk && k == 1 && (rk & 0x20)) { /* k_out next to (or onto) q_out */
                y->buf = fc->ts[1].buf;
                y->off = fc->ts[1].off + (size_t)(u8(s) % 32) * fc->es;
                break;
            }
            if (fc->qk && k == 1 && (rk & 0x40)) { /* k_out onto q_in */
                y->buf = fc->ts[0].buf;
                y->off = fc->ts[0].off;
                break;
            }
            /* fall through */
        default:
            y->buf = fc->nbuf++;
            y->off = (size_t)(u8(s) % 4) * fc->es;
            break;
        }
    }
    for (int k = 0; k < 2 * fc->count; k++)
        fc->ts[k].present = 1;
    /* NULL descriptors, NULL data, bogus pointers of empty tensors */
    {
        unsigned nb = u8(s);
        if (nb >= 248)
            fc->ts[nb % (unsigned)(2 * fc->count)].present = 0;
        for (int k = 0; k < 2 * fc->count; k++) {
            unsigned b = u8(s);
            classify(&fc->ts[k]);
            if (b >= 250)
                fc->ts[k].data_kind = 1;
            else if (b >= 244 && fc->ts[k].empty)
                fc->ts[k].data_kind = 2;
        }
    }
    /* buffer sizes: the extent of every mappable view, FZ_SMALL past other pointers */
    for (int k = 0; k < 2 * fc->count; k++) {
        tspec *t = &fc->ts[k];
        size_t need;
        if (t->data_kind != 0)
            continue;
        need = t->off + (mappable(t) ? (size_t)t->ext : FZ_SMALL);
        if (need > fc->bufs[t->buf].size)
            fc->bufs[t->buf].size = need;
    }
    for (int i = 0; i < fc->nbuf; i++) {
        size_t n = fc->bufs[i].size ? fc->bufs[i].size : 1;
        fc->bufs[i].p = malloc(n);
        fc->bufs[i].snap = malloc(n);
        fc->bufs[i].map = calloc(n, 1);
        if (!fc->bufs[i].p || !fc->bufs[i].snap || !fc->bufs[i].map)
            abort();
        fill(fc->bufs[i].p, fc->bufs[i].size, fc->dt, r, (fc->layout & 0x20) != 0);
    }
    for (int k = 0; k < 2 * fc->count; k++) {
        tspec *t = &fc->ts[k];
        t->t.data = t->data_kind == 1 ? NULL
                    : t->data_kind == 2 ? (void *)(uintptr_t)0x40
                                        : fc->bufs[t->buf].p + t->off;
        if (t->present && t->shape_ok && !t->empty && t->oversize && t->data_kind == 0)
            fc->forced = 1; /* a tensor past its buffer: the call must fail for a named reason */
    }

    /* ---- positions */
    if (fc->forced) {
        /* a position below 0 fails on every cache but a table-less one with
         * axes, which accepts negative positions: there a bad style (the
         * byte is read as before, so older inputs decode the same) */
        int neg_ok = !fc->null_cache && ct->max_positions == 0 && ct->has_axes;
        if (fc->ts[0].t.batch >= 0 && fc->ts[0].t.batch <= FZ_MAX_ARRAY && (u8(s) & 3) &&
            !neg_ok) {
            int64_t n = fc->ts[0].t.batch;
            fc->ps.given = 1;
            fusedrope_positions_init(&fc->ps.p);
            fc->forced_how = 1;
            fc->ps.offsets = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
            if (!fc->ps.offsets)
                abort();
            for (int64_t i = 0; i < n; i++)
                fc->ps.offsets[i] = INT64_MIN; /* every position below 0 */
            fc->ps.n_offsets = n;
            fc->ps.p.offsets = fc->ps.offsets;
            fc->ps.p.cp_size = 1;
            note("forced failure: offsets INT64_MIN\n");
        } else {
            fc->style = 77;
            fc->forced_how = 2;
            note("forced failure: style 77\n");
        }
    } else {
        gen_positions(s, &fc->ps, fc->ts[0].t.seq_len, fc->ts[0].t.batch, fc->family == 2, ct->max_positions,
                      ct->has_axes ? ct->naxes : 1);
    }

    /* ---- position arrays inside a tensor buffer (inputs only, unless strict) */
    if (fc->ps.given && !fc->forced && fc->nbuf > 0) {
        unsigned where = u8(s);
        if (where >= 192) {
            int host = (int)(where % (unsigned)fc->nbuf), has_out = 0;
            for (int k = 1; k < 2 * fc->count; k += 2)
                if (fc->ts[k].buf == host && fc->ts[k].data_kind == 0)
                    has_out = 1;
            if (!has_out || !known_issue(KI_POS_IN_OUTPUT)) {
                struct { const void **field; size_t bytes; } arr[3] = {
                    { (const void **)&fc->ps.p.ids, (size_t)fc->ps.n_ids * 8 },
                    { (const void **)&fc->ps.p.offsets, (size_t)fc->ps.n_offsets * 8 },
                    { (const void **)&fc->ps.p.cu_seqlens, (size_t)fc->ps.n_cu * 4 },
                };
                for (int a = 0; a < 3; a++) {
                    size_t room = fc->bufs[host].size, off;
                    if (!*arr[a].field || !arr[a].bytes || arr[a].bytes > room || !(where & (1u << a)))
                        continue;
                    off = ((size_t)u16(s) * 8) % (room - arr[a].bytes + 1) & ~(size_t)7;
                    memcpy(fc->bufs[host].p + off, *arr[a].field, arr[a].bytes);
                    *arr[a].field = fc->bufs[host].p + off;
                    fc->ps.in_buf[a] = host + 1;
                    fc->ps.in_off[a] = off;
                    fc->ps.in_bytes[a] = arr[a].bytes;
                    note("  position array %d moved into buffer %d at %zu\n", a, host, off);
                }
            }
        }
    }

    /* ---- the model's verdict */
    if (fc->null_cache)
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "cache NULL");
    if (fc->style != 0 && fc->style != 1)
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "style %d", fc->style);
    for (int k = 0; k < 2 * fc->count; k++) {
        const tspec *t = &fc->ts[k];
        if (!t->present) {
            reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "descriptor %d NULL", k);
            fc->all_valid = 0;
        } else if (!t->shape_ok) {
            reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "tensor %d dtype/size/stride", k);
            fc->all_valid = 0;
        } else if (t->empty) {
            if (t->t.head_dim < fc->rot) /* the decisions leave this open for empty tensors */
                reason(&fc->v, FUSEDROPE_ERR_INVALID, 0, "empty tensor %d head_dim < rot_dim", k);
        } else {
            fc->any_nonempty = 1;
            if (t->t.head_dim < fc->rot)
                reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "tensor %d head_dim %lld < rot_dim", k,
                       (long long)t->t.head_dim), fc->all_valid = 0;
            if (t->data_kind == 1)
                reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "tensor %d data NULL", k), fc->all_valid = 0;
            if (t->overflow)
                reason(&fc->v, FUSEDROPE_ERR_RANGE, 1, "tensor %d extent overflows", k), fc->all_valid = 0;
        }
    }
    for (int k = 0; k < fc->count; k++) {
        const fusedrope_tensor *x = &fc->ts[2 * k].t, *y = &fc->ts[2 * k + 1].t;
        if (!fc->ts[2 * k].present || !fc->ts[2 * k + 1].present)
            continue;
        if (x->dtype != y->dtype || x->seq_len != y->seq_len || x->batch != y->batch ||
            x->heads != y->heads || x->head_dim != y->head_dim)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "pair %d shape/dtype mismatch", k), fc->all_valid = 0;
    }
    if (fc->qk && fc->ts[0].present && fc->ts[2].present &&
        (fc->ts[0].t.seq_len != fc->ts[2].t.seq_len || fc->ts[0].t.batch != fc->ts[2].t.batch ||
         fc->ts[0].t.dtype != fc->ts[2].t.dtype))
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "q/k seq_len/batch/dtype mismatch"), fc->all_valid = 0;

    /* positions: structure (checked even for empty calls by the library; the
     * decisions call empty calls no-ops, so either is allowed there) */
    if (fc->ps.given && !fc->forced) {
        const fusedrope_positions *p = &fc->ps.p;
        int cp = p->cp_size == 0 ? 1 : p->cp_size, hard = fc->any_nonempty;
        int64_t S0 = fc->ts[0].t.seq_len, B0 = fc->ts[0].t.batch;
        if (p->cp_size < 0)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "cp_size < 0"), fc->pos_struct_ok = 0;
        else if (p->cp_rank < 0 || p->cp_rank >= cp)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "cp_rank"), fc->pos_struct_ok = 0;
        if (p->ids && (p->offsets || cp > 1))
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "ids with offsets/cp"), fc->pos_struct_ok = 0;
        if (p->ids && p->ids_axes != 0 && p->ids_axes != 1 &&
            (!ct->has_axes || p->ids_axes != ct->naxes))
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard && !fc->null_cache, "ids_axes %d, the cache has "
                   "%d axes", p->ids_axes, ct->has_axes ? ct->naxes : 1), fc->pos_struct_ok = 0;
        if (p->cu_seqlens && B0 != 1)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "cu_seqlens with batch %lld",
                   (long long)B0), fc->pos_struct_ok = 0;
        if (p->cu_seqlens && p->num_seqs < 1)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "num_seqs < 1"), fc->pos_struct_ok = 0;
        if (!p->cu_seqlens && cp > 1 && S0 % 2)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "cp with odd seq_len"), fc->pos_struct_ok = 0;
        else if (!p->cu_seqlens && cp > 1 && S0 > INT64_MAX / cp)
            reason(&fc->v, FUSEDROPE_ERR_RANGE, hard, "seq_len x cp_size overflows"), fc->pos_struct_ok = 0;
    }

    /* overlap, exactly, on byte maps: bit 2k = in k, bit 2k+1 = out k */
    if (fc->any_nonempty && fc->all_valid && !fc->forced) {
        int mapped[4] = { 0, 0, 0, 0 };
        for (int k = 0; k < 2 * fc->count; k++) {
            tspec *t = &fc->ts[k];
            i128 bytes;
            if (!mappable(t))
                continue;
            bytes = sat_mul(sat_mul(sat_mul(t->t.seq_len, t->t.batch), sat_mul(t->t.heads, t->t.head_dim)),
                            (i128)dtype_size((int)t->t.dtype));
            if (k % 2 == 1 && bytes > t->ext) { /* more elements than room: overlaps itself */
                reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "output %d overlaps itself (count)", k);
                continue;
            }
            if (bytes > (i128)8 * FZ_LIMIT) { /* an input that overlaps itself many times */
                fc->v.soft |= 1u << FUSEDROPE_ERR_INVALID;
                continue;
            }
            if (mark(fc->bufs, t, 1u << k, k % 2 == 1) && k % 2 == 1)
                reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "output %d overlaps itself", k);
            else
                mapped[k] = 1;
        }
        for (int k = 0; k < fc->count; k++) {
            tspec *y = &fc->ts[2 * k + 1];
            if (!mapped[2 * k + 1])
                continue;
            for (int j = 0; j < fc->count; j++) {
                tspec *x = &fc->ts[2 * j];
                if (fc->ts[2 * j].empty || (j == k && same_view(x, y)))
                    continue;
                if (!mapped[2 * j])
                    fc->v.soft |= 1u << FUSEDROPE_ERR_INVALID;
                else if (shares(fc->bufs, y, 1u << (2 * k + 1), x, 1u << (2 * j)))
                    reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "out %d overlaps in %d", k, j);
                else if (ranges_meet(x, y))
                    fc->v.pair_ok = 1;
            }
        }
        if (fc->count == 2 && mapped[1] && mapped[3]) {
            if (shares(fc->bufs, &fc->ts[1], 2, &fc->ts[3], 8))
                reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "outputs overlap");
            else if (ranges_meet(&fc->ts[1], &fc->ts[3]))
                fc->v.pair_ok = 1;
        }
        /* The library's self-overlap test of an output is conservative by
         * design (fusedrope_forward(3): taken smallest stride first, each
         * must clear what the smaller ones span), which every standard,
         * padded or packed layout passes: an output with arbitrary strides
         * whose elements the byte map above found disjoint may be refused
         * with that sentence (fz_verdict matches it to the output's strides).
         * Any other refusal of views the map finds disjoint is a finding. */
        for (int k = 0; k < fc->count; k++)
            if (mapped[2 * k + 1] && fc->ts[2 * k + 1].arbitrary)
                fc->v.conservative_ok |= 1 << k;
    }

    /* position arrays that share bytes with an output's elements */
    if (fc->any_nonempty && fc->all_valid && !fc->forced)
        for (int a = 0; a < 3; a++) {
            if (!fc->ps.in_buf[a])
                continue;
            for (int k = 1; k < 2 * fc->count; k += 2) {
                const tspec *y = &fc->ts[k];
                int hit = 0;
                if (y->buf != fc->ps.in_buf[a] - 1 || !mappable(y))
                    continue;
                for (size_t i = fc->ps.in_off[a]; i < fc->ps.in_off[a] + fc->ps.in_bytes[a]; i++)
                    if (fc->bufs[y->buf].map[i] & (1u << k))
                        hit = 1;
                if (hit)
                    reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "position array %d inside output %d", a, k);
                else if (fc->ps.in_off[a] < y->off + (size_t)y->ext && y->off < fc->ps.in_off[a] + fc->ps.in_bytes[a])
                    fc->v.soft |= 1u << FUSEDROPE_ERR_INVALID; /* inside its address range only */
            }
        }

    /* misaligned data (strict mode only) */
    for (int k = 0; k < 2 * fc->count; k++)
        if (fc->ts[k].present && fc->ts[k].shape_ok && !fc->ts[k].empty && fc->ts[k].data_kind == 0 &&
            ((uintptr_t)fc->ts[k].t.data % fc->es) != 0)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "tensor %d data misaligned", k);

    /* positions: every token's, in an all-empty call too (fusedrope_forward(3):
     * it passes the positions' rules before it succeeds doing nothing) */
    if (!fc->forced && fc->pos_struct_ok && fc->ts[0].present && fc->ts[0].shape_ok) {
        int64_t S0 = fc->ts[0].t.seq_len, B0 = fc->ts[0].t.batch;
        const fusedrope_positions *p = fc->ps.given ? &fc->ps.p : NULL;
        if (S0 == 0 || B0 == 0) {
            /* no tokens (q without tokens and a non-empty k is refused as
             * a mismatch besides): cu_seqlens must still hold zero tokens */
            if (p && p->cu_seqlens && !cu_contents_ok(p, S0))
                reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "cu_seqlens contents");
        } else if ((i128)S0 * B0 <= (i128)4 * FZ_LIMIT) {
            int cu_ok = 1;
            fc->tokpos = malloc((size_t)(S0 * B0 > 0 ? S0 * B0 : 1) * (size_t)fc->naxes * sizeof(i128));
            if (!fc->tokpos)
                abort();
            if (p && p->cu_seqlens) {
                const int32_t *cu = p->cu_seqlens;
                cu_ok = cu_contents_ok(p, S0);
                if (!cu_ok)
                    reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "cu_seqlens contents");
                else
                    for (int a = 0; a < fc->naxes; a++)
                        for (int64_t q = 0; q < p->num_seqs; q++)
                            for (int64_t t = cu[q]; t < cu[q + 1]; t++)
                                fc->tokpos[a * S0 + t] = ref_position(&fc->ps, S0, 0, t, q, t - cu[q],
                                                                  cu[q + 1] - cu[q], a);
            } else {
                for (int a = 0; a < fc->naxes; a++)
                    for (int64_t b = 0; b < B0; b++)
                        for (int64_t t = 0; t < S0; t++)
                            fc->tokpos[a * S0 * B0 + b * S0 + t] =
                                ref_position(&fc->ps, S0, b, t, b, t, S0, a);
            }
            if (cu_ok) {
                /* a table: every axis's position in it; table-less: in int64,
                 * and not negative unless the cache has axes (a rope delta).
                 * Negatives from offsets or cp on a table-less cache with axes:
                 * the decisions name ids; either answer is allowed. */
                int from_ids = p && p->ids;
                for (int64_t i = 0; i < S0 * B0 * fc->naxes; i++) {
                    int past = fc->tokpos[i] > INT64_MAX || fc->tokpos[i] < INT64_MIN ||
                               (ct->max_positions > 0 &&
                                (fc->tokpos[i] < 0 || fc->tokpos[i] >= ct->max_positions));
                    if (!past && fc->tokpos[i] < 0 && ct->max_positions == 0) {
                        if (!ct->has_axes)
                            past = 1;
                        else if (!from_ids)
                            fc->v.soft |= 1u << FUSEDROPE_ERR_RANGE;
                    }
                    if (past) {
                        reason(&fc->v, FUSEDROPE_ERR_RANGE, 1, "token %lld axis %lld position %lld%s",
                               (long long)(i % (S0 * B0)), (long long)(i / (S0 * B0)),
                               (long long)(int64_t)fc->tokpos[i],
                               fc->tokpos[i] > INT64_MAX ? " (past INT64_MAX)" : "");
                        break;
                    }
                }
            } else {
                free(fc->tokpos);
                fc->tokpos = NULL;
            }
        } else {
            fc->v.soft |= (1u << FUSEDROPE_ERR_INVALID) | (1u << FUSEDROPE_ERR_RANGE);
        }
    }
    if (fc->forced) {
        fc->forced_other = fc->v.must_fail;
        fc->v.must_fail = 1;
        fc->v.hard |= (1u << FUSEDROPE_ERR_RANGE) | (1u << FUSEDROPE_ERR_INVALID);
    }
}

void fz_model_done(fz_call *fc, const char *name)
{
    fc->v.allowed = (fc->v.must_fail ? fc->v.hard : 1u << FUSEDROPE_OK) | fc->v.soft;

    note("%s(style %d, dtype %d, family %d, layout 0x%x, rel 0x%x/0x%x, pos %s, stream %p)\n",
         name,
         fc->style, fc->dt, fc->family, fc->layout, fc->rel[0], fc->qk ? fc->rel[1] : 0, fc->ps.given ? "given" : "NULL", fc->stream);
    for (int k = 0; k < 2 * fc->count; k++) {
        const fusedrope_tensor *t = &fc->ts[k].t;
        note("  %s%d: %sdtype %d [%lld %lld %lld %lld] strides (%lld %lld %lld) buf %d off %zu "
             "ext %lld%s%s\n",
             k % 2 ? "out" : "in", k / 2, fc->ts[k].present ? "" : "(NULL descriptor) ", (int)t->dtype,
             (long long)t->seq_len, (long long)t->batch, (long long)t->heads,
             (long long)t->head_dim, (long long)t->stride_seq, (long long)t->stride_batch,
             (long long)t->stride_head, fc->ts[k].buf, fc->ts[k].off,
             fc->ts[k].ext > INT64_MAX ? -1LL : (long long)fc->ts[k].ext, fc->ts[k].oversize ? " oversize" : "",
             fc->ts[k].data_kind == 1 ? " data NULL" : fc->ts[k].data_kind == 2 ? " data bogus" : "");
    }
    if (fc->ps.given)
        note("  pos: ids %p (%lld, ids_axes %d, stride %lld) offsets %p (%lld) cu %p (num_seqs "
             "%lld) cp %d/%d\n",
             (const void *)fc->ps.p.ids, (long long)fc->ps.n_ids, fc->ps.p.ids_axes,
             (long long)fc->ps.p.ids_axis_stride, (const void *)fc->ps.p.offsets,
             (long long)fc->ps.n_offsets, (const void *)fc->ps.p.cu_seqlens, (long long)fc->ps.p.num_seqs,
             fc->ps.p.cp_size, fc->ps.p.cp_rank);
    note("  model: allowed 0x%x must_fail %d: %s\n", fc->v.allowed, fc->v.must_fail, fc->v.why);
}

/* The call's position arrays (ids, offsets, cu_seqlens) and their bytes. */
static void pos_arrays(const fz_call *fc, const void *arr[3], size_t bytes[3])
{
    arr[0] = fc->ps.p.ids;
    arr[1] = fc->ps.p.offsets;
    arr[2] = fc->ps.p.cu_seqlens;
    bytes[0] = (size_t)fc->ps.n_ids * sizeof(int64_t);
    bytes[1] = (size_t)fc->ps.n_offsets * sizeof(int64_t);
    bytes[2] = (size_t)fc->ps.n_cu * sizeof(int32_t);
}

void fz_snapshot(fz_call *fc)
{
    const void *arr[3];
    size_t bytes[3];
    pos_arrays(fc, arr, bytes);
    for (int i = 0; i < fc->nbuf; i++)
        memcpy(fc->bufs[i].snap, fc->bufs[i].p, fc->bufs[i].size);
    /* the own position arrays (those inside a tensor buffer are in its snapshot) */
    for (int a = 0; a < 3; a++) {
        free(fc->pos_copy[a]);
        fc->pos_copy[a] = NULL;
        if (fc->ps.given && arr[a] && !fc->ps.in_buf[a])
            fc->pos_copy[a] = dup_mem(arr[a], bytes[a]);
    }
    snprintf(fc->before, sizeof fc->before, "%s", fusedrope_last_error());
}

/* Whether the refusal is the library's conservative self-overlap sentence
 * for an output fz_setup found disjoint (conservative_ok bit k for output
 * k), with that output's strides as the library sees them (a dimension of
 * size 1 has stride 0). */
static int self_overlap_refusal(const fz_call *fc)
{
    const char *e = fusedrope_last_error();
    size_t el = strlen(e);
    for (int k = 0; k < fc->count; k++) {
        const fusedrope_tensor *t = &fc->ts[2 * k + 1].t;
        char want[400];
        size_t wl;
        if (!(fc->v.conservative_ok & (1 << k)))
            continue;
        snprintf(want, sizeof want,
                 "'s elements may overlap each other (strides seq %lld, batch %lld, head %lld "
                 "with head_dim %lld: taken smallest first, each stride of a dimension of more "
                 "than one element must clear what the smaller ones span); the elements of an "
                 "output must not share memory",
                 (long long)(t->seq_len == 1 ? 0 : t->stride_seq),
                 (long long)(t->batch == 1 ? 0 : t->stride_batch),
                 (long long)(t->heads == 1 ? 0 : t->stride_head), (long long)t->head_dim);
        wl = strlen(want);
        if (el > wl && strcmp(e + el - wl, want) == 0)
            return 1;
    }
    return 0;
}

/* Whether the refusal is the library's conservative sentence for two views
 * (an output and an input, or the two outputs: lib/apply.c, fusedrope_forward(3)
 * "In place") where fz_setup found such a pair sharing no element. */
static int pair_overlap_refusal(const fz_call *fc)
{
    static const char *const tails[2] = {
        " (not provably apart: the test is conservative, fusedrope_forward(3)); an output must "
        "be the same view as its input (in place) or share no memory with any input",
        " (not provably apart: the test is conservative, fusedrope_forward(3)); the two outputs "
        "must not share memory",
    };
    const char *e = fusedrope_last_error();
    size_t el = strlen(e);
    if (!fc->v.pair_ok || (!strstr(e, " may overlap ") && !strstr(e, " may partially overlap ")))
        return 0;
    for (int i = 0; i < 2; i++) {
        size_t tl = strlen(tails[i]);
        if (el > tl && strcmp(e + el - tl, tails[i]) == 0)
            return 1;
    }
    return 0;
}

void fz_verdict(fz_call *fc, fusedrope_status st)
{
    if (verbose_mode)
        fprintf(stderr, "call: %d %s | model 0x%x %s\n", st, fusedrope_last_error(),
                fc->v.allowed, fc->v.why);
    if (!(fc->v.allowed & (1u << st))) {
        int tolerated = st == FUSEDROPE_ERR_INVALID &&
                        (self_overlap_refusal(fc) || pair_overlap_refusal(fc));
        CHECK(tolerated, "call returned %d (%s) but the model allows 0x%x (%s)", st,
              fusedrope_status_string(st), fc->v.allowed, fc->v.why[0] ? fc->v.why : "no rule broken");
        conservative_refusals++;
    }
    if (st != FUSEDROPE_OK && fc->forced && !fc->forced_other && !fc->v.why[0] && !fc->v.soft) {
        /* nothing else broken (no reason given, here or by the target's own
         * rules, e.g. the norm's): refused for the forcing (a negative position,
         * the bad style) or for an overlap (or an output on its input's
         * pointer with other strides), which the model does not judge for a
         * tensor past its buffer (its extent reaches other memory) */
        const char *e = fusedrope_last_error();
        int overlap = st == FUSEDROPE_ERR_INVALID &&
                      (strstr(e, "overlap") || strstr(e, "same data pointer"));
        if (fc->forced_how == 1)
            CHECK(overlap || (st == FUSEDROPE_ERR_RANGE && strstr(e, "position")),
                  "forced failure (offsets INT64_MIN) refused with %d for another reason", st);
        else
            CHECK(overlap || (st == FUSEDROPE_ERR_INVALID && strstr(e, "style")),
                  "forced failure (style 77) refused with %d for another reason", st);
    }
    if (st != FUSEDROPE_OK && fc->expect) {
        /* (set by fz_ext_call when its rule was the only one broken) */
        CHECK(strstr(fusedrope_last_error(), fc->expect) != NULL,
              "the call broke only the rule about %s but was refused with %d for another reason",
              fc->expect, st);
    }
    if (st != FUSEDROPE_OK) {
        CHECK(fusedrope_last_error()[0] != 0, "a failed call left fusedrope_last_error() empty");
        check_error_len("the call");
        for (int i = 0; i < fc->nbuf; i++)
            CHECK(memcmp(fc->bufs[i].p, fc->bufs[i].snap, fc->bufs[i].size) == 0,
                  "a failed call changed buffer %d", i);
    } else {
        CHECK(strcmp(fc->before, fusedrope_last_error()) == 0,
              "a successful call changed fusedrope_last_error() from \"%s\"", fc->before);
        CHECK(!fc->forced, "a call with a tensor past the harness's buffer succeeded");
        /* every byte outside the outputs' elements unchanged */
        for (int i = 0; i < fc->nbuf; i++)
            for (size_t j = 0; j < fc->bufs[i].size; j++)
                if (!(fc->bufs[i].map[j] & fc->written_mask))
                    CHECK(fc->bufs[i].p[j] == fc->bufs[i].snap[j],
                          "a successful call wrote byte %zu of buffer %d, outside every output", j,
                          i);
    }
}

void fz_call_free(fz_call *fc)
{
    for (int a = 0; a < 3; a++)
        free(fc->pos_copy[a]);
    free(fc->rs_mem);
    free(fc->tokpos);
    free_pspec(&fc->ps);
    for (int i = 0; i < fc->nbuf; i++) {
        free(fc->bufs[i].p);
        free(fc->bufs[i].snap);
        free(fc->bufs[i].map);
    }
}

/* ------------------------------------------------------------ extensions */

const fusedrope_positions *fz_pos(fz_call *fc)
{
    if (!fc->ps.given)
        return NULL;
    return fc->size_kind ? (const fusedrope_positions *)(const void *)fc->pos_big : &fc->ps.p;
}

/* Where the 0.1 layout of fusedrope_positions ends (STABILITY in fusedrope(3):
 * a published layout; the 0.2 fields take their zero defaults). */
#define POS_V01_SIZE (offsetof(fusedrope_positions, cp_rank) + sizeof(int))

void fz_ext_call(src_t *s, const cache_t *ct, fz_call *fc)
{
    unsigned rb = u8(s), sb = u8(s), ib = u8(s);
    /* a refusal must name the rule when it is the only one broken */
    int clean = !fc->v.must_fail && !fc->v.soft && !fc->v.conservative_ok && !fc->v.pair_ok &&
                fc->any_nonempty;
    int hard = fc->any_nonempty, rules = 0;
    const char *word = NULL;
    fusedrope_positions *p = &fc->ps.p;

    if (fc->forced || fc->null_cache || !(rb % 8 || sb % 8 || ib % 8))
        return;
    if (!fc->ps.given) { /* the same as NULL */
        fc->ps.given = 1;
        fusedrope_positions_init(p);
    }
#define RULE(w, ...)                                                \
    do {                                                            \
        reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, __VA_ARGS__);   \
        rules++;                                                    \
        word = w;                                                   \
    } while (0)

    /* ids_axes and ids_axis_stride without ids (fusedrope_forward(3)) */
    if (ib % 8 && !p->ids) {
        int naxes = ct->has_axes ? ct->naxes : 1;
        xst.idsx++;
        switch (ib % 8) {
        case 1: p->ids_axes = naxes; break;
        case 2: p->ids_axes = 2 + (int)((ib >> 3) % 4); break;
        case 3: p->ids_axes = -1 - (int)((ib >> 3) % 2); break;
        case 4: p->ids_axes = FUSEDROPE_MAX_AXES + 1 + (int)(ib >> 3); break;
        case 5: p->ids_axis_stride = -1 - (int64_t)(ib >> 3); break;
        case 6: p->ids_axis_stride = 1 + (int64_t)(ib >> 3); break; /* ignored: one row */
        default: p->ids_axes = 1; break;
        }
        if (p->ids_axes > 1 || p->ids_axes < 0)
            RULE("ids_axes", "ids_axes %d without ids", p->ids_axes);
        else if (p->ids_axis_stride < 0)
            RULE("ids_axis_stride", "ids_axis_stride %lld", (long long)p->ids_axis_stride);
        note("  ext: ids_axes %d ids_axis_stride %lld without ids\n", p->ids_axes,
             (long long)p->ids_axis_stride);
    }

    /* range_status on a CPU cache: never written; aligned, outside the
     * tensors and the position arrays */
    if (rb % 8) {
        static const int kinds[8] = { 0, 1, 2, 3, 4, 5, 1, 1 };
        int kind = kinds[rb % 8];
        unsigned char *at = NULL;
        if (kind == 3 || kind == 4) { /* the first element of a non-empty input / output */
            for (int k = kind - 3; k < 2 * fc->count && !at; k += 2)
                if (mappable(&fc->ts[k]))
                    at = (unsigned char *)fc->ts[k].t.data;
        } else if (kind == 5) { /* the start of a position array the library counts */
            int64_t S0 = fc->ts[0].t.seq_len, B0 = fc->ts[0].t.batch;
            if (p->ids && S0 > 0 && B0 > 0 && fc->ps.n_ids > 0)
                at = (unsigned char *)(uintptr_t)p->ids;
            else if (p->offsets && fc->ps.n_offsets > 0 &&
                     (p->cu_seqlens ? p->num_seqs : B0) >= 1)
                at = (unsigned char *)(uintptr_t)p->offsets;
            else if (p->cu_seqlens && p->num_seqs >= 0 && fc->ps.n_cu > 0)
                at = (unsigned char *)(uintptr_t)p->cu_seqlens;
        }
        if (kind >= 3 && !at)
            kind = 1;
        xst.rs[kind]++;
        if (kind <= 2) {
            fc->rs_mem = malloc(16);
            if (!fc->rs_mem)
                abort();
            memset(fc->rs_mem, rb & 8 ? 0 : 0x5a, 16);
            at = fc->rs_mem + (kind == 2 ? 1 + (rb >> 4) % 3 : 4 * ((rb >> 4) % 3));
            fc->rs_word = (int32_t *)(void *)(fc->rs_mem + 4 * ((rb >> 4) % 3));
            if (kind == 1)
                fc->rs_kind = 1;
        }
        p->range_status = (int32_t *)(void *)at;
        if (kind >= 2)
            RULE("range_status", "range_status kind %d (%p)", kind, (void *)at);
        note("  ext: range_status kind %d at %p\n", kind, (void *)at);
    }

    /* struct_size (STABILITY in fusedrope(3)) */
    if (sb % 8 && sb % 8 < 6) {
        int kind = (int)(sb % 8);
        size_t size = sizeof *p;
        unsigned char *big = fc->pos_big;
        if (kind == 2 && !(p->ids_axes <= 1 && p->ids_axes >= 0 && p->ids_axis_stride == 0 &&
                           !p->range_status))
            kind = 3; /* the 0.2 fields in use: the old layout would change the call */
        xst.sizes[kind]++;
        memset(big, 0, sizeof fc->pos_big);
        memcpy(big, p, sizeof *p);
        switch (kind) {
        case 1: size = 0; break;
        case 2: /* 0.1: the library must not read past it */
            size = POS_V01_SIZE;
            memset(big + size, 0xff, sizeof fc->pos_big - size);
            break;
        case 3: size = sizeof *p + 8; break;
        case 4:
            size = sizeof *p + 8;
            big[sizeof *p + (sb >> 3) % 8] = (unsigned char)(1 + (sb >> 6));
            break;
        default: size = (sb >> 3) & 1 ? 12 : sizeof *p - 4; break;
        }
        memcpy(big, &size, sizeof size);
        fc->size_kind = kind;
        if (kind == 1 || kind >= 4)
            RULE("struct_size", "pos->struct_size %zu (kind %d)", size, kind);
        note("  ext: pos struct_size %zu (kind %d)\n", size, kind);
    }
#undef RULE
    if (clean && rules == 1)
        fc->expect = word;
}

void fz_after_call(fz_call *fc, fusedrope_status st)
{
    const void *arr[3];
    size_t bytes[3];
    pos_arrays(fc, arr, bytes);
    if (fc->rs_kind == 1) {
        int32_t w;
        memcpy(&w, fc->rs_word, 4);
        CHECK(w == (fc->rs_mem[0] == 0 ? 0 : 0x5a5a5a5a),
              "a call on a CPU cache (status %d) wrote pos->range_status (now %d)", st, (int)w);
    }
    for (int a = 0; a < 3; a++)
        if (fc->pos_copy[a])
            CHECK(memcmp(fc->pos_copy[a], arr[a], bytes[a]) == 0,
                  "a call (status %d) changed position array %d", st, a);
}

/* The CPU backend's SIMD switches (tests/test_cpu_rows.c; internal, so
 * weak: absent where the library has no AVX2 code).  fr_avx512_off leaves
 * the AVX2 rows; fr_avx2_off turns the AVX-512 paths off too
 * (lib/cpu_avx512.c): the portable path.  fr_beyond_cache_all
 * (lib/internal.h) takes the harness's small tensors for large ones:
 * streamed outputs, the norm's prefetches; fr_team_all gives them a team
 * of threads, as a large call has. */
extern int fusedrope__avx2_off __attribute__((weak));
extern int fusedrope__avx512_off __attribute__((weak));
extern int fusedrope__beyond_cache_all;
extern int fusedrope__team_all;
extern _Thread_local int fusedrope__cpu_team;

void fz_cpu_path(int path)
{
    static int now;
#ifdef _OPENMP
    /* back from the team path: a call that ran (the backend wrote
     * fr_cpu_team) ran on the team fr_team_all asked for (the hook could
     * stop working with every replay passing: a mutation run) */
    if (now == 4 && path == 0 && fusedrope__cpu_team != -1)
        CHECK(fusedrope__cpu_team == FZ_TEAM, "the rerun on a team of %d threads ran on %d",
              FZ_TEAM, fusedrope__cpu_team);
#endif
    if (path == 4)
        fusedrope__cpu_team = -1;
    now = path;
    if (&fusedrope__avx512_off)
        __atomic_store_n(&fusedrope__avx512_off, path == 1, __ATOMIC_RELAXED);
    if (&fusedrope__avx2_off)
        __atomic_store_n(&fusedrope__avx2_off, path == 2, __ATOMIC_RELAXED);
    __atomic_store_n(&fusedrope__beyond_cache_all, path == 3, __ATOMIC_RELAXED);
    __atomic_store_n(&fusedrope__team_all, path == 4 ? FZ_TEAM : 0, __ATOMIC_RELAXED);
}

unsigned char **fz_rerun_begin(fz_call *fc)
{
    unsigned char **first = calloc(MAXBUF, sizeof *first);
    if (!first)
        abort();
    for (int i = 0; i < fc->nbuf; i++) {
        first[i] = dup_mem(fc->bufs[i].p, fc->bufs[i].size);
        memcpy(fc->bufs[i].p, fc->bufs[i].snap, fc->bufs[i].size);
    }
    return first;
}

void fz_rerun_end(fz_call *fc, unsigned char **first, fusedrope_status st)
{
    xst.reruns++;
    CHECK(st == FUSEDROPE_OK, "the call was accepted, but refused (%d) on another CPU path", st);
    for (int i = 0; i < fc->nbuf; i++) {
        const buf_t *bf = &fc->bufs[i];
        xst.rerun_bytes += bf->size;
        if (memcmp(first[i], bf->p, bf->size) == 0) {
            free(first[i]);
            continue;
        }
        for (size_t j = 0; j < bf->size; j++) {
            int k, nan1, nan2;
            size_t e0;
            if (first[i][j] == bf->p[j])
                continue;
            /* an output element (the rest is checked unchanged by fz_verdict):
             * both runs must give NaN there */
            for (k = 1; k < 2 * fc->count; k += 2)
                if ((bf->map[j] & (1u << k)) && fc->ts[k].buf == i)
                    break;
            CHECK(k < 2 * fc->count, "buffer %d byte %zu differs between the first run and "
                  "another CPU path's, outside every output", i, j);
            e0 = fc->ts[k].off + (j - fc->ts[k].off) / fc->es * fc->es;
            nan1 = isnan(load(first[i] + e0, fc->dt));
            nan2 = isnan(load(bf->p + e0, fc->dt));
            CHECK(nan1 && nan2, "buffer %d element at byte %zu: %.9g on the first run, %.9g "
                  "on another CPU path (output %d)", i, e0, load(first[i] + e0, fc->dt),
                  load(bf->p + e0, fc->dt), k);
        }
        free(first[i]);
    }
    free(first);
}

/* After the input's calls (bytes the old decoder never read): the same
 * config again with another num_threads, struct_size, or freq_dim and
 * partial_rotary_factor; the status the man pages give, and where accepted
 * the same table and inverse frequencies. */
static void fz_ext_cache(src_t *s, const cache_t *ct)
{
    unsigned e = u8(s), kind = e % 4;
    static const int threads[8] = { 0, 1, 2, 3, 64, -1, INT_MAX, FUSEDROPE_MAX_THREADS + 1 };
    union { fusedrope_cache_config c; unsigned char b[sizeof(fusedrope_cache_config) + 16]; } u;
    fusedrope_cache_config z;
    fusedrope_cache *c2 = NULL;
    fusedrope_status st;
    unsigned allowed;
    const char *word = NULL;
    int same = 0; /* the same table, bit for bit */
    size_t size = sizeof u.c;
    char what[96];

    if (!kind || ct->type < 0)
        return;
    memset(&u, 0, sizeof u);
    u.c = ct->cfg;
    z = ct->cfg;
    if (kind == 1) {
        u.c.num_threads = threads[(e >> 2) % 8];
        z.num_threads = u.c.num_threads;
        allowed = u.c.num_threads < 0 || u.c.num_threads > FUSEDROPE_MAX_THREADS
                      ? 1u << FUSEDROPE_ERR_INVALID : 1u << FUSEDROPE_OK;
        word = "num_threads";
        same = 1;
        snprintf(what, sizeof what, "num_threads %d", u.c.num_threads);
    } else if (kind == 2) {
        unsigned k = (e >> 2) % 5;
        size_t v01 = offsetof(fusedrope_cache_config, long_factor) + sizeof(const double *);
        word = "struct_size";
        allowed = 1u << FUSEDROPE_ERR_INVALID;
        if (k == 0) {
            size = 0;
        } else if (k == 1) { /* 0.1: the 0.2 fields read as zero, and never past it */
            size = v01;
            memset(u.b + v01, 0xff, sizeof u.b - v01);
            memset((unsigned char *)&z + v01, 0, sizeof z - v01);
            z.axes = FUSEDROPE_AXES_NONE;
            allowed = config_allowed(&z, FUSEDROPE_DEVICE_CPU, 1, 1);
            same = memcmp(&z, &ct->cfg, sizeof z) == 0; /* the 0.2 fields were unset */
        } else if (k == 2) {
            size = sizeof u.c + 8;
            allowed = 1u << FUSEDROPE_OK;
            same = 1;
        } else if (k == 3) {
            size = sizeof u.c + 8;
            u.b[sizeof u.c + (e >> 5) % 8] = 1;
        } else {
            size = sizeof u.c - 4;
        }
        snprintf(what, sizeof what, "config struct_size %zu", size);
    } else {
        static const int fd[8] = { -1, 1, 3, 16384, 16385, INT_MAX, INT_MIN, 2 };
        unsigned b = u8(s);
        u.c.freq_dim = b < 200 ? fd[b % 8] : any_int(s);
        u.c.partial_rotary_factor = any_double(s, u.c.partial_rotary_factor);
        z = u.c;
        allowed = config_allowed(&z, FUSEDROPE_DEVICE_CPU, 1, 1);
        snprintf(what, sizeof what, "freq_dim %d partial_rotary_factor %g", u.c.freq_dim,
                 u.c.partial_rotary_factor);
    }
    u.c.struct_size = size;
    if (kind == 2 && size < sizeof u.c.struct_size)
        memset(&u.c.struct_size, 0, sizeof u.c.struct_size);
    xst.cache_ext[kind - 1]++;
    note("cache again: %s\n", what);
    st = fusedrope_cache_create(&u.c, FUSEDROPE_DEVICE_CPU, &c2);
    CHECK(allowed & (1u << st), "cache_create with %s returned %d (%s); allowed 0x%x", what, st,
          fusedrope_status_string(st), allowed);
    if (st != FUSEDROPE_OK) {
        CHECK(c2 == NULL, "a failed cache_create left *out set");
        check_error_len("cache_create");
        if (word && allowed == 1u << FUSEDROPE_ERR_INVALID && kind != 3 &&
            !(kind == 2 && (e >> 2) % 5 == 1))
            CHECK(strstr(fusedrope_last_error(), word) != NULL,
                  "cache_create with %s refused for another reason", what);
        return;
    }
    if (same) {
        double i1[FUSEDROPE_MAX_ROT_DIM / 2], i2[FUSEDROPE_MAX_ROT_DIM / 2];
        CHECK(fusedrope_cache_inv_freq(ct->cache, i1) == FUSEDROPE_OK &&
                  fusedrope_cache_inv_freq(c2, i2) == FUSEDROPE_OK &&
                  memcmp(i1, i2, sizeof(double) * (size_t)ct->half) == 0 &&
                  fusedrope_cache_attention_factor(ct->cache) ==
                      fusedrope_cache_attention_factor(c2),
              "cache_create with %s: other inverse frequencies or attention factor", what);
        if (ct->max_positions > 0) {
            size_t n = (size_t)ct->max_positions * (size_t)ct->half;
            float *a = malloc(n * 4), *b = malloc(n * 4), *a2 = malloc(n * 4), *b2 = malloc(n * 4);
            if (!a || !b || !a2 || !b2)
                abort();
            CHECK(fusedrope_cache_copy_table(ct->cache, a, b) == FUSEDROPE_OK &&
                      fusedrope_cache_copy_table(c2, a2, b2) == FUSEDROPE_OK,
                  "copy_table");
            CHECK(memcmp(a, a2, n * 4) == 0 && memcmp(b, b2, n * 4) == 0,
                  "cache_create with %s built another table", what);
            free(a);
            free(b);
            free(a2);
            free(b2);
        }
    } else if (kind == 3) {
        /* the getters against the reference for the new fields */
        double inv[FUSEDROPE_MAX_ROT_DIM / 2], ref[FUSEDROPE_MAX_ROT_DIM / 2], attn;
        CHECK(ref_inv_freq(&z, ref, &attn) == 0, "no reference for an accepted config");
        CHECK(fusedrope_cache_inv_freq(c2, inv) == FUSEDROPE_OK, "inv_freq");
        for (int i = 0; i < ct->half; i++)
            CHECK(near_ref(inv[i], ref[i]),
                  "cache with %s: inv_freq[%d] %.17g, the reference %.17g", what, i, inv[i],
                  ref[i]);
    }
    fusedrope_cache_destroy(c2);
}

/* ---------------------------------------------------------- small things */

void misc(src_t *s)
{
    unsigned b = u8(s);
    int v = b < 128 ? (int)(b % 8) - 1 : any_int(s);
    const char *str = fusedrope_status_string((fusedrope_status)v);
    CHECK(str && str[0], "status_string(%d) empty", v);
    if (v < 0 || v > FUSEDROPE_ERR_CUDA)
        CHECK(strcmp(str, "unknown status") == 0, "status_string(%d) = %s", v, str);
    CHECK(strcmp(fusedrope_version(), "0.2.0") == 0, "version");
    CHECK(fusedrope_cache_rot_dim(NULL) == 0 && fusedrope_cache_max_positions(NULL) == 0 &&
              fusedrope_cache_device(NULL) == FUSEDROPE_DEVICE_CPU,
          "getters on NULL");
    fusedrope_cache_destroy(NULL);
    CHECK(fusedrope_cache_check(NULL, NULL) == FUSEDROPE_ERR_INVALID, "cache_check(NULL)");
}

int fz_input(const uint8_t *data, size_t size, fz_run_fn run)
{
    src_t s = { data, size, 0 };
    rng_t r;
    cache_t ct;
    int have;

    trace_len = 0;
    trace[0] = 0;
    r.s = 0x243f6a8885a308d3ull ^ (uint64_t)size;
    for (size_t i = 0; i < size && i < 16; i++)
        r.s = r.s * 1099511628211ull + data[i];

    misc(&s);
    have = make_cache(&s, &ct, &r);
    if (have) {
        unsigned calls = 1 + u8(&s) % 2;
        for (unsigned i = 0; i < calls; i++) {
            fz_last_call = i + 1 == calls;
            run(&s, &ct, &r, 0);
        }
        fz_last_call = 0;
        fz_ext_cache(&s, &ct);
    } else if (u8(&s) & 1) {
        cache_t dummy;
        memset(&dummy, 0, sizeof dummy);
        dummy.rot_dim = 2;
        dummy.half = 1;
        fz_last_call = 0;
        run(&s, &dummy, &r, 1);
    }
    if (verbose_mode)
        fprintf(stderr, "%s", trace);
    free_cache_t(&ct);
    return 0;
}
