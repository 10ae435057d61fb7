/*
 * cache.c - the cache module: rope type -> inverse frequencies and attention
 * factor (in double), the cos/sin table rounded once to float32, and its
 * placement on the CPU or the GPU.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define FR_PI 3.14159265358979323846

void fusedrope_cache_config_init_sized(fusedrope_cache_config *config, size_t struct_size,
                                       fusedrope_rope_type type, int rot_dim,
                                       int64_t max_positions, double theta)
{
    fusedrope_cache_config c;
    memset(&c, 0, sizeof c);
    c.type = type;
    c.rot_dim = rot_dim;
    c.max_positions = max_positions;
    c.theta = theta;
    c.factor = type == FUSEDROPE_ROPE_LONGROPE ? 0.0 : 1.0;
    c.beta_fast = 32.0;
    c.beta_slow = 1.0;
    c.truncate = 1;
    c.low_freq_factor = 1.0;
    c.high_freq_factor = 4.0;
    fr_struct_give(config, struct_size, &c, sizeof c);
}

/* The sizes fusedrope_cache_config has had (fr_struct_take). */
static const size_t config_layouts[] = {
    FR_LAYOUT_SIZE(fusedrope_cache_config, long_factor), /* 0.1 */
    FR_LAYOUT_SIZE(fusedrope_cache_config, num_threads), /* 0.2 */
};

static const char *type_name(fusedrope_rope_type t)
{
    switch (t) {
    case FUSEDROPE_ROPE_DEFAULT: return "default";
    case FUSEDROPE_ROPE_LINEAR: return "linear";
    case FUSEDROPE_ROPE_DYNAMIC: return "dynamic";
    case FUSEDROPE_ROPE_YARN: return "yarn";
    case FUSEDROPE_ROPE_LONGROPE: return "longrope";
    case FUSEDROPE_ROPE_LLAMA3: return "llama3";
    case FUSEDROPE_ROPE_PROPORTIONAL: return "proportional";
    }
    return "?";
}

static fusedrope_status check_rot_dim(int rot_dim)
{
    if (rot_dim < 2 || rot_dim > FUSEDROPE_MAX_ROT_DIM || rot_dim % 2)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "rot_dim is %d; it must be even and in [2, %d]", rot_dim,
                       FUSEDROPE_MAX_ROT_DIM);
    return FUSEDROPE_OK;
}

/* value must be finite and > lo (or >= lo when `inclusive`). */
static fusedrope_status check_real(const char *name, double value, double lo, int inclusive,
                                   const char *type)
{
    if (!isfinite(value) || value < lo || (!inclusive && value == lo))
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s is %g for rope type %s; it must be finite and %s %g",
                       name, value, type, inclusive ? ">=" : ">", lo);
    return FUSEDROPE_OK;
}

/* F, the dimension in every rope type's exponent 2i/F: freq_dim, or rot_dim
 * (half of it for vision towers' 2D layout). */
static int freq_dim(const fusedrope_cache_config *c)
{
    if (c->freq_dim)
        return c->freq_dim;
    return c->axes == FUSEDROPE_AXES_VISION_2D ? c->rot_dim / 2 : c->rot_dim;
}

static fusedrope_status check_config(const fusedrope_cache_config *c)
{
    const char *tn = type_name(c->type);
    int uses_factor, uses_original;

    if ((unsigned)c->type > FUSEDROPE_ROPE_PROPORTIONAL)
        return fr_fail(FUSEDROPE_ERR_INVALID, "config->type is %d, not a fusedrope_rope_type",
                       (int)c->type);
    TRY(check_rot_dim(c->rot_dim));
    if (c->num_threads < 0 || c->num_threads > FUSEDROPE_MAX_THREADS)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "num_threads is %d; it must be 0..%d (FUSEDROPE_MAX_THREADS; 0 means the "
                       "OpenMP default)", c->num_threads, FUSEDROPE_MAX_THREADS);
    if (c->max_positions < 0)
        return fr_fail(FUSEDROPE_ERR_INVALID, "max_positions is %lld; it must be >= 0",
                       (long long)c->max_positions);
    TRY(check_real("theta", c->theta, 1.0, 0, tn));

    uses_factor = c->type != FUSEDROPE_ROPE_DEFAULT;
    uses_original = c->type != FUSEDROPE_ROPE_DEFAULT && c->type != FUSEDROPE_ROPE_LINEAR &&
                    c->type != FUSEDROPE_ROPE_PROPORTIONAL;
    if (c->freq_dim < 0 || c->freq_dim == 1 || c->freq_dim > 2 * FUSEDROPE_MAX_ROT_DIM)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "freq_dim is %d; it must be 0 (rot_dim) or in [2, %d]", c->freq_dim,
                       2 * FUSEDROPE_MAX_ROT_DIM);
    if (c->type == FUSEDROPE_ROPE_PROPORTIONAL &&
        !(c->partial_rotary_factor >= 0 && c->partial_rotary_factor <= 1))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "partial_rotary_factor is %g for rope type proportional; it must be in "
                       "(0, 1], or 0 for 1", c->partial_rotary_factor);
    if (uses_factor)
        TRY(check_real("factor", c->factor, 0.0, c->type == FUSEDROPE_ROPE_LONGROPE, tn));
    if (uses_original && c->original_max_positions <= 0)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "original_max_positions is %lld for rope type %s; it must be > 0",
                       (long long)c->original_max_positions, tn);

    switch (c->type) {
    case FUSEDROPE_ROPE_DYNAMIC:
        if (freq_dim(c) < 4)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "the frequency dimension F is %d (rot_dim %d, freq_dim %d%s); rope "
                           "type dynamic needs F >= 4", freq_dim(c), c->rot_dim, c->freq_dim,
                           c->axes == FUSEDROPE_AXES_VISION_2D ? ", VISION_2D: rot_dim/2" : "");
        if (c->seq_len < 0)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "seq_len is %lld for rope type dynamic; it must be >= 0 (0 means "
                           "max_positions)",
                           (long long)c->seq_len);
        break;
    case FUSEDROPE_ROPE_YARN:
        TRY(check_real("beta_fast", c->beta_fast, 0.0, 0, tn));
        TRY(check_real("beta_slow", c->beta_slow, 0.0, 0, tn));
        TRY(check_real("attention_factor", c->attention_factor, 0.0, 1, tn));
        TRY(check_real("mscale", c->mscale, 0.0, 1, tn));
        TRY(check_real("mscale_all_dim", c->mscale_all_dim, 0.0, 1, tn));
        if (c->truncate != 0 && c->truncate != 1)
            return fr_fail(FUSEDROPE_ERR_INVALID, "truncate is %d; it must be 0 or 1", c->truncate);
        break;
    case FUSEDROPE_ROPE_LONGROPE:
        if (c->seq_len < 0)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "seq_len is %lld for rope type longrope; it must be >= 0 (0 means "
                           "max_positions chooses the factors)", (long long)c->seq_len);
        TRY(check_real("attention_factor", c->attention_factor, 0.0, 1, tn));
        if (!c->short_factor || !c->long_factor)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "%s is NULL; rope type longrope needs short_factor and long_factor",
                           c->short_factor ? "long_factor" : "short_factor");
        for (int i = 0; i < c->rot_dim / 2; i++) {
            if (!(isfinite(c->short_factor[i]) && c->short_factor[i] > 0))
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "short_factor[%d] is %g; it must be finite and > 0", i,
                               c->short_factor[i]);
            if (!(isfinite(c->long_factor[i]) && c->long_factor[i] > 0))
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "long_factor[%d] is %g; it must be finite and > 0", i,
                               c->long_factor[i]);
        }
        break;
    case FUSEDROPE_ROPE_LLAMA3:
        TRY(check_real("low_freq_factor", c->low_freq_factor, 0.0, 0, tn));
        TRY(check_real("high_freq_factor", c->high_freq_factor, 0.0, 0, tn));
        if (!(c->low_freq_factor <= c->high_freq_factor))
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "low_freq_factor %g is above high_freq_factor %g",
                           c->low_freq_factor, c->high_freq_factor);
        break;
    default:
        break;
    }
    return FUSEDROPE_OK;
}

/* Yarn's attention scale: m(s, k) = 1 if s <= 1, else 0.1 k ln(s) + 1. */
static double yarn_m(double s, double k)
{
    return s <= 1.0 ? 1.0 : 0.1 * k * log(s) + 1.0;
}

/* Dimension index at which a wavelength makes `rotations` turns over the
 * original context. */
static double yarn_corr(double rotations, int d, double base, double original)
{
    return d * log(original / (2.0 * FR_PI * rotations)) / (2.0 * log(base));
}

/* The sequence length the frequencies are derived for (dynamic's scaled
 * base, LongRoPE's choice of factors): seq_len when given (as Hugging Face
 * scales for the current length), else the table's length. */
static int64_t derived_length(const fusedrope_cache_config *c)
{
    return c->seq_len > 0 ? c->seq_len : c->max_positions;
}

/* LongRoPE takes the long factors past the original context. */
static int longrope_long(const fusedrope_cache_config *c)
{
    return derived_length(c) > c->original_max_positions;
}

/* Dynamic NTK's theta, scaled for the length the table is built for. */
static double dynamic_base(const fusedrope_cache_config *c)
{
    const int d = freq_dim(c);
    const double orig = (double)c->original_max_positions;
    double len = (double)derived_length(c);
    if (len < orig)
        len = orig;
    return c->theta * pow(c->factor * len / orig - (c->factor - 1.0), (double)d / (d - 2));
}

/* inv[i] for i < d/2 and the attention factor, as fusedrope_cache_create(3) writes them. */
static void compute_frequencies(const fusedrope_cache_config *c, double *inv, double *attn)
{
    const int d = freq_dim(c), n = c->rot_dim / 2;
    /* proportional: pairs from `rotated` on have angle 0 */
    const int rotated = c->type != FUSEDROPE_ROPE_PROPORTIONAL ? n
                        : c->partial_rotary_factor == 0 ? n
                        : (int)floor(c->partial_rotary_factor * c->rot_dim / 2);
    const double orig = (double)c->original_max_positions;
    double base = c->theta;
    double low = 0, high = 0, s;
    *attn = 1.0;

    if (c->type == FUSEDROPE_ROPE_DYNAMIC)
        base = dynamic_base(c);
    if (c->type == FUSEDROPE_ROPE_YARN) {
        low = yarn_corr(c->beta_fast, d, base, orig);
        high = yarn_corr(c->beta_slow, d, base, orig);
        if (c->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0)
            low = 0;
        if (high > d - 1)
            high = d - 1;
        if (low == high)
            high += 0.001;
        if (c->attention_factor > 0)
            *attn = c->attention_factor;
        else if (c->mscale > 0 && c->mscale_all_dim > 0)
            *attn = yarn_m(c->factor, c->mscale) / yarn_m(c->factor, c->mscale_all_dim);
        else
            *attn = yarn_m(c->factor, 1.0);
    }
    if (c->type == FUSEDROPE_ROPE_LONGROPE) {
        s = c->factor > 0 ? c->factor : (double)c->max_positions / orig;
        if (c->attention_factor > 0)
            *attn = c->attention_factor;
        else if (s > 1.0)
            *attn = sqrt(1.0 + log(s) / log(orig));
    }

    for (int i = 0; i < n; i++) {
        double f = pow(base, -2.0 * i / d);
        switch (c->type) {
        case FUSEDROPE_ROPE_LINEAR:
            f /= c->factor;
            break;
        case FUSEDROPE_ROPE_YARN: {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            f = (1.0 - ramp) * f + ramp * f / c->factor;
            break;
        }
        case FUSEDROPE_ROPE_LONGROPE:
            f /= longrope_long(c) ? c->long_factor[i] : c->short_factor[i];
            break;
        case FUSEDROPE_ROPE_PROPORTIONAL:
            f = i < rotated ? f / c->factor : 0.0;
            break;
        case FUSEDROPE_ROPE_LLAMA3: {
            double w = 2.0 * FR_PI / f;
            double lo = orig / c->low_freq_factor, hi = orig / c->high_freq_factor;
            if (w > lo) {
                f /= c->factor;
            } else if (w >= hi && lo > hi) { /* (equal factors: no band between) */
                double t = (orig / w - c->low_freq_factor) /
                           (c->high_freq_factor - c->low_freq_factor);
                f = (1.0 - t) * f / c->factor + t * f;
            }
            break;
        }
        default:
            break;
        }
        inv[i] = f;
    }
}

/* A host cos or sin table of `floats`, on a cache line boundary: the vector
 * rows load a token's row in whole 64-byte vectors, and with malloc's 16-byte
 * alignment each of them spanned two lines (~15% of the fused forward's time
 * a row, bench/RESULTS.md).  Whole lines, as aligned_alloc asks; freed with
 * free(). */
static float *alloc_table(size_t floats)
{
    if (floats > SIZE_MAX / sizeof(float) - FR_LINE_BYTES)
        return NULL;
    return aligned_alloc(FR_LINE_BYTES, (size_t)fr_line_floats((int64_t)floats) * sizeof(float));
}

/* Allocates an empty cache of `positions` rows, with host memory for the
 * table when `host_table` (a CUDA cache of a rope type builds its table on
 * the device from inv_freq instead); `positions_arg` names the caller's
 * argument for the message. */
static fusedrope_status alloc_cache(int rot_dim, int64_t positions, const char *positions_arg,
                                    int with_inv, int host_table, fusedrope_cache **out)
{
    const size_t half = (size_t)rot_dim / 2;
    fusedrope_cache *c;

    /* the table's size as fusedrope_cache_create(3) gives it: cos and sin,
     * max_positions x rot_dim/2 floats each */
    if (positions > 0 && (uint64_t)positions > SIZE_MAX / (2 * sizeof(float)) / half)
        return fr_fail(FUSEDROPE_ERR_RANGE,
                       "%s %lld x rot_dim %d: the table's size in bytes overflows",
                       positions_arg, (long long)positions, rot_dim);
    c = calloc(1, sizeof *c);
    if (!c)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "cannot allocate the cache");
    c->device = FUSEDROPE_DEVICE_CPU;
    c->rot_dim = rot_dim;
    c->max_positions = positions;
    c->attention_factor = 1.0;
    c->num_axes = 1;
    c->longrope_long = -1;
    if (positions > 0 && host_table) {
        c->cos = alloc_table((size_t)positions * half);
        c->sin = alloc_table((size_t)positions * half);
    }
    if (with_inv)
        c->inv_freq = malloc(half * sizeof(double));
    if ((positions > 0 && host_table && (!c->cos || !c->sin)) || (with_inv && !c->inv_freq)) {
        fusedrope_cache_destroy(c);
        return fr_fail(FUSEDROPE_ERR_NOMEM,
                       "cannot allocate the cache's cos/sin table (%lld positions x %d floats)",
                       (long long)positions, rot_dim);
    }
    *out = c;
    return FUSEDROPE_OK;
}

static fusedrope_status resolve_device(fusedrope_device *device)
{
    switch (*device) {
    case FUSEDROPE_DEVICE_AUTO:
        *device = fr_cuda_device_present() ? FUSEDROPE_DEVICE_CUDA : FUSEDROPE_DEVICE_CPU;
        return FUSEDROPE_OK;
    case FUSEDROPE_DEVICE_CPU:
        return FUSEDROPE_OK;
    case FUSEDROPE_DEVICE_CUDA:
        if (!fr_cuda_device_present())
            return fr_fail(FUSEDROPE_ERR_UNSUPPORTED,
                           "device is FUSEDROPE_DEVICE_CUDA but %s",
#ifdef HAVE_CUDA
                           "no CUDA device is present"
#else
                           "the library was built without CUDA"
#endif
            );
        return FUSEDROPE_OK;
    }
    return fr_fail(FUSEDROPE_ERR_INVALID, "device is %d, not a fusedrope_device", (int)*device);
}

/* Moves a host-built cache to its device, or frees it on failure. */
static fusedrope_status place(fusedrope_cache *c, fusedrope_device device, fusedrope_cache **out)
{
    if (device == FUSEDROPE_DEVICE_CUDA) {
        fusedrope_status st = fr_cuda_cache_upload(c);
        if (st != FUSEDROPE_OK) {
            fusedrope_cache_destroy(c);
            return st;
        }
    }
    *out = c;
    return FUSEDROPE_OK;
}

fusedrope_status fusedrope_cache_create(const fusedrope_cache_config *user_config,
                                        fusedrope_device device, fusedrope_cache **out)
{
    fusedrope_cache_config config_copy, *config = &config_copy;
    fusedrope_cache *c;
    fusedrope_status st;
    int32_t *map;
    int num_axes;
    size_t half;
    int base_finite;

    if (!out)
        return fr_fail(FUSEDROPE_ERR_INVALID, "out is NULL");
    *out = NULL;
    if (!user_config)
        return fr_fail(FUSEDROPE_ERR_INVALID, "config is NULL");
    TRY(fr_struct_take(&config_copy, sizeof config_copy, user_config, config_layouts,
                       (int)(sizeof config_layouts / sizeof config_layouts[0]), "config"));
    TRY(check_config(config));
    TRY(fr_axes_map(config, &map, &num_axes));
    st = resolve_device(&device);
    if (st == FUSEDROPE_OK)
        st = alloc_cache(config->rot_dim, config->max_positions, "max_positions", 1,
                         device == FUSEDROPE_DEVICE_CPU, &c);
    if (st != FUSEDROPE_OK) {
        free(map);
        return st;
    }
    c->pair_map = map;
    c->num_axes = num_axes;
    c->negative_ok = map != NULL && config->max_positions == 0;
    c->num_threads = config->num_threads;

    {
        fr_fpenv fpenv; /* the thread's own environment must not change the table */
        fr_fpenv_enter(&fpenv);
        compute_frequencies(config, c->inv_freq, &c->attention_factor);
        base_finite = config->type != FUSEDROPE_ROPE_DYNAMIC || isfinite(dynamic_base(config));
        fr_fpenv_leave(&fpenv);
    }
    if (config->type == FUSEDROPE_ROPE_LONGROPE)
        c->longrope_long = longrope_long(config);
    /* Parameters that each pass their own range can still combine into
     * nonsense (a longrope scale with original_max_positions 1 divides by
     * ln 1; a dynamic base that goes negative; an attention factor whose
     * products overflow float; a frequency whose angles overflow double):
     * refuse what would not give finite cos/sin. */
    if (!(c->attention_factor > 0 && c->attention_factor <= FLT_MAX)) {
        double a = c->attention_factor;
        fusedrope_cache_destroy(c);
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "the config gives attention factor %g for rope type %s (factor %g, "
                       "original_max_positions %lld); it must be > 0 and finite in float32",
                       a, type_name(config->type), config->factor,
                       (long long)config->original_max_positions);
    }
    /* A scaled base past DBL_MAX would leave pair 0's frequency at 1 and
     * every other at pow(Inf, -e) = 0, which passes the check below. */
    if (!base_finite) {
        fusedrope_cache_destroy(c);
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "rope type dynamic scales theta %g past the double range (factor %g, "
                       "length %lld, original_max_positions %lld)",
                       config->theta, config->factor,
                       (long long)derived_length(config),
                       (long long)config->original_max_positions);
    }
    /* DBL_MAX / 2^63: the angle p * inv_freq stays finite for every int64 p. */
    for (int i = 0; i < config->rot_dim / 2; i++)
        if (!(c->inv_freq[i] >= 0 && c->inv_freq[i] <= DBL_MAX / 0x1p63)) {
            double f = c->inv_freq[i];
            fusedrope_cache_destroy(c);
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "the config gives inverse frequency %g for pair %d, rope type %s "
                           "(theta %g, factor %g, original_max_positions %lld); it must be "
                           ">= 0 and small enough that every position's angle is finite",
                           f, i, type_name(config->type), config->theta, config->factor,
                           (long long)config->original_max_positions);
        }
    half = (size_t)config->rot_dim / 2;
    /* fr_angle is the same arithmetic on both devices, so a CUDA cache builds
     * its table on the GPU (fr_cuda_cache_upload) and still equals this one. */
    if (c->cos) {
        /* the team of a call on as many elements (cpu_team.c) */
        const int nth = fr_cpu_team_size(c, (int64_t)((uint64_t)c->max_positions * half));
        fr_fpenv outer;
        fr_fpenv_enter(&outer);
#ifdef _OPENMP
#pragma omp parallel num_threads(nth) if (nth > 1)
#else
        (void)nth; /* 1 */
#endif
        {
            fr_fpenv fpenv; /* each thread's, as in cpu_apply.c */
            fr_fpenv_enter(&fpenv);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t p = 0; p < c->max_positions; p++)
                for (size_t i = 0; i < half; i++)
                    fr_angle(p, c->inv_freq[i], c->attention_factor,
                             &c->cos[(size_t)p * half + i], &c->sin[(size_t)p * half + i]);
            fr_fpenv_leave(&fpenv);
        }
        fr_fpenv_leave(&outer);
    }
    return place(c, device, out);
}

fusedrope_status fusedrope_cache_create_from_table(const float *cos, const float *sin,
                                                   int64_t positions, int rot_dim,
                                                   fusedrope_device device, fusedrope_cache **out)
{
    fusedrope_cache *c;
    size_t bytes;

    if (!out)
        return fr_fail(FUSEDROPE_ERR_INVALID, "out is NULL");
    *out = NULL;
    if (!cos || !sin)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s is NULL", cos ? "sin" : "cos");
    if (positions < 1)
        return fr_fail(FUSEDROPE_ERR_INVALID, "positions is %lld; it must be >= 1",
                       (long long)positions);
    TRY(check_rot_dim(rot_dim));
    TRY(resolve_device(&device));
    TRY(alloc_cache(rot_dim, positions, "positions", 0, 1, &c));
    bytes = (size_t)positions * (size_t)(rot_dim / 2) * sizeof(float);
    memcpy(c->cos, cos, bytes);
    memcpy(c->sin, sin, bytes);
    return place(c, device, out);
}

fusedrope_status fusedrope_cache_copy_table(const fusedrope_cache *cache, float *cos, float *sin)
{
    if (!cache)
        return fr_fail(FUSEDROPE_ERR_INVALID, "cache is NULL");
    if (!cos || !sin)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s is NULL", cos ? "sin" : "cos");
    if (cache->max_positions == 0)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "the cache has no table to copy (max_positions is 0: angles are "
                       "computed at apply time)");
    if (cache->device == FUSEDROPE_DEVICE_CUDA)
        return fr_cuda_cache_download(cache, cos, sin);
    memcpy(cos, cache->cos, (size_t)cache->max_positions * (size_t)(cache->rot_dim / 2) * sizeof(float));
    memcpy(sin, cache->sin, (size_t)cache->max_positions * (size_t)(cache->rot_dim / 2) * sizeof(float));
    return FUSEDROPE_OK;
}

void fusedrope_cache_destroy(fusedrope_cache *cache)
{
    if (!cache)
        return;
    if (cache->device == FUSEDROPE_DEVICE_CUDA) {
        fr_cuda_cache_release(cache);
    } else {
        free(cache->cos);
        free(cache->sin);
    }
    free(cache->inv_freq);
    free(cache->pair_map);
    free(cache);
}

int fusedrope_cache_rot_dim(const fusedrope_cache *cache)
{
    return cache ? cache->rot_dim : 0;
}

int64_t fusedrope_cache_max_positions(const fusedrope_cache *cache)
{
    return cache ? cache->max_positions : 0;
}

fusedrope_device fusedrope_cache_device(const fusedrope_cache *cache)
{
    return cache ? cache->device : FUSEDROPE_DEVICE_CPU;
}

double fusedrope_cache_attention_factor(const fusedrope_cache *cache)
{
    /* a user table's factor, if any, is inside its entries: nothing derived */
    return cache && cache->inv_freq ? cache->attention_factor : 0.0;
}

fusedrope_status fusedrope_cache_inv_freq(const fusedrope_cache *cache, double *inv_freq)
{
    if (!cache)
        return fr_fail(FUSEDROPE_ERR_INVALID, "cache is NULL");
    if (!inv_freq)
        return fr_fail(FUSEDROPE_ERR_INVALID, "inv_freq is NULL");
    if (!cache->inv_freq)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "the cache was made from a user table (fusedrope_cache_create_from_table): "
                       "it has no inverse frequencies");
    memcpy(inv_freq, cache->inv_freq, (size_t)(cache->rot_dim / 2) * sizeof(double));
    return FUSEDROPE_OK;
}

int fusedrope_cache_longrope_long(const fusedrope_cache *cache)
{
    return cache ? cache->longrope_long : -1;
}

fusedrope_status fusedrope_cache_check(const fusedrope_cache *cache, void *stream)
{
    if (!cache)
        return fr_fail(FUSEDROPE_ERR_INVALID, "cache is NULL");
    if (cache->device == FUSEDROPE_DEVICE_CUDA)
        return fr_cuda_cache_check(cache, stream);
    return FUSEDROPE_OK;
}
