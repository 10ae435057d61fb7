/*
 * test_cache.c - the cache module: config defaults, every rope type's table
 * against the float64 reference, user tables, table-less caches, getters,
 * every bad configuration, status strings and the version.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "fusedrope.h"
#include "ref.h"
#include "util.h"

#define CPU FUSEDROPE_DEVICE_CPU

static const char *st_name(fusedrope_status s)
{
    return fusedrope_status_string(s);
}

static const char *dev_name(fusedrope_device d)
{
    return d == CPU ? "cpu" : "cuda";
}

/* ------------------------------------------------------------ common bits */

START_TEST(test_version)
{
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", FUSEDROPE_VERSION_MAJOR, FUSEDROPE_VERSION_MINOR,
             FUSEDROPE_VERSION_PATCH);
    ck_assert_ptr_nonnull(fusedrope_version());
    ck_assert_str_eq(fusedrope_version(), "0.2.0");
    ck_assert_str_eq(fusedrope_version(), want);
}
END_TEST

START_TEST(test_status_strings)
{
    ck_assert_str_eq(fusedrope_status_string(FUSEDROPE_OK), "success");
    ck_assert_str_eq(fusedrope_status_string(FUSEDROPE_ERR_INVALID), "invalid argument");
    ck_assert_str_eq(fusedrope_status_string(FUSEDROPE_ERR_RANGE), "out of range");
    ck_assert_str_eq(fusedrope_status_string(FUSEDROPE_ERR_NOMEM), "out of memory");
    ck_assert_str_eq(fusedrope_status_string(FUSEDROPE_ERR_UNSUPPORTED), "unsupported");
    ck_assert_str_eq(fusedrope_status_string(FUSEDROPE_ERR_CUDA), "CUDA error");
    ck_assert_str_eq(fusedrope_status_string((fusedrope_status)6), "unknown status");
    ck_assert_str_eq(fusedrope_status_string((fusedrope_status)99), "unknown status");
    ck_assert_str_eq(fusedrope_status_string((fusedrope_status)-1), "unknown status");
    ck_assert_int_eq(FUSEDROPE_OK, 0);
}
END_TEST

START_TEST(test_last_error_initially_empty)
{
    /* Each test runs in a fresh child: no library call has failed yet. */
    ck_assert_ptr_nonnull(fusedrope_last_error());
    ck_assert_str_eq(fusedrope_last_error(), "");
}
END_TEST

START_TEST(test_last_error_kept_on_success)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL, *bad = NULL;
    char saved[512];
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 7, 16, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &bad), FUSEDROPE_ERR_INVALID);
    ck_assert_ptr_null(bad);
    ck_assert_str_ne(fusedrope_last_error(), "");
    snprintf(saved, sizeof saved, "%s", fusedrope_last_error());
    cfg.rot_dim = 8;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
    tu_track(c);
    ck_assert_str_eq(fusedrope_last_error(), saved);
    tu_free_all();
}
END_TEST

START_TEST(test_cuda_available_and_auto)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    int avail = fusedrope_cuda_available();
    ck_assert_msg(avail == 0 || avail == 1, "fusedrope_cuda_available() = %d", avail);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 8, 16, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_AUTO, &c), FUSEDROPE_OK);
    tu_track(c);
    ck_assert_int_eq(fusedrope_cache_device(c),
                     avail ? FUSEDROPE_DEVICE_CUDA : FUSEDROPE_DEVICE_CPU);
    if (!avail) {
        fusedrope_cache *d = (fusedrope_cache *)&cfg;
        ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CUDA, &d),
                         FUSEDROPE_ERR_UNSUPPORTED);
        ck_assert_ptr_null(d);
        ck_assert_str_ne(fusedrope_last_error(), "");
        d = (fusedrope_cache *)&cfg;
        {
            float t[4] = {1, 1, 0, 0};
            ck_assert_int_eq(fusedrope_cache_create_from_table(t, t + 2, 2, 2,
                                                               FUSEDROPE_DEVICE_CUDA, &d),
                             FUSEDROPE_ERR_UNSUPPORTED);
            ck_assert_ptr_null(d);
        }
    }
    tu_free_all();
}
END_TEST

/* --------------------------------------------------------- config defaults */

START_TEST(test_config_init_defaults)
{
    fusedrope_rope_type type = (fusedrope_rope_type)_i;
    fusedrope_cache_config cfg;
    memset(&cfg, 0xab, sizeof cfg);
    fusedrope_cache_config_init(&cfg, type, 96, 4096, 500000.0);
    ck_assert_int_eq(cfg.type, type);
    ck_assert_int_eq(cfg.rot_dim, 96);
    ck_assert_int_eq(cfg.max_positions, 4096);
    ck_assert(cfg.theta == 500000.0);
    ck_assert_msg(cfg.factor == (type == FUSEDROPE_ROPE_LONGROPE ? 0.0 : 1.0),
                  "type %d: factor %g", (int)type, cfg.factor);
    ck_assert_int_eq(cfg.original_max_positions, 0);
    ck_assert_int_eq(cfg.seq_len, 0);
    ck_assert(cfg.attention_factor == 0.0);
    ck_assert(cfg.beta_fast == 32.0);
    ck_assert(cfg.beta_slow == 1.0);
    ck_assert(cfg.mscale == 0.0);
    ck_assert(cfg.mscale_all_dim == 0.0);
    ck_assert_int_eq(cfg.truncate, 1);
    ck_assert(cfg.low_freq_factor == 1.0);
    ck_assert(cfg.high_freq_factor == 4.0);
    ck_assert_ptr_null(cfg.short_factor);
    ck_assert_ptr_null(cfg.long_factor);
    /* the 0.2 fields: zero, which keeps 0.1's behaviour */
    ck_assert_uint_eq(cfg.struct_size, sizeof cfg);
    ck_assert(cfg.partial_rotary_factor == 0.0);
    ck_assert_int_eq(cfg.axes, FUSEDROPE_AXES_NONE);
    for (int a = 0; a < FUSEDROPE_MAX_AXES; a++)
        ck_assert_int_eq(cfg.sections[a], 0);
    ck_assert_ptr_null(cfg.pair_axis);
    ck_assert_ptr_null(cfg.pair_col);
    ck_assert_int_eq(cfg.freq_dim, 0);
    ck_assert_int_eq(cfg.num_threads, 0);
    fusedrope_cache_config_init(NULL, type, 96, 4096, 500000.0); /* a no-op */
}
END_TEST

/* ---------------------------------------------------------- rope-type tables */

static double short_f[64], long_f[64];

static void init_factors(void)
{
    int i;
    for (i = 0; i < 64; i++) {
        short_f[i] = 1.0 + 0.05 * i;       /* 1 .. 4.15 */
        long_f[i] = 1.0 + 0.75 * i + 0.1 * (i % 3);
    }
}

typedef struct table_case {
    const char *name;
    fusedrope_rope_type type;
    int rot_dim;
    int64_t max_positions;
    double theta, factor;
    int64_t original, seq_len;
    double attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
    int truncate;
    double low_freq_factor, high_freq_factor;
    double expect_attn; /* > 0: the attention factor DESIGN gives, computed by hand */
    int freq_dim;       /* F of the exponents (0: rot_dim) */
    double partial_rotary_factor; /* proportional */
} table_case;

#define LN(x) log(x)
static table_case tcases[] = {
    {"default d64", FUSEDROPE_ROPE_DEFAULT, 64, 2048, 10000, 1, 0, 0, 0, 32, 1, 0, 0, 1, 1, 4, 1,
     0, 0},
    {"default d2", FUSEDROPE_ROPE_DEFAULT, 2, 100, 10000, 1, 0, 0, 0, 32, 1, 0, 0, 1, 1, 4, 1, 0,
     0},
    {"default d128 theta5e5", FUSEDROPE_ROPE_DEFAULT, 128, 1024, 500000, 1, 0, 0, 0, 32, 1, 0,
     0, 1, 1, 4, 1, 0, 0},
    {"default attn ignored", FUSEDROPE_ROPE_DEFAULT, 16, 256, 10000, 1, 0, 0, 7.5, 32, 1, 0, 0,
     1, 1, 4, 1, 0, 0},
    {"linear x4", FUSEDROPE_ROPE_LINEAR, 64, 1024, 10000, 4, 0, 0, 0, 32, 1, 0, 0, 1, 1, 4, 1, 0,
     0},
    {"linear x0.5 attn ignored", FUSEDROPE_ROPE_LINEAR, 32, 512, 10000, 0.5, 0, 0, 3, 32, 1, 0,
     0, 1, 1, 4, 1, 0, 0},
    {"dynamic seq=max", FUSEDROPE_ROPE_DYNAMIC, 64, 2048, 10000, 2, 512, 0, 0, 32, 1, 0, 0, 1,
     1, 4, 1, 0, 0},
    {"dynamic seq 3000", FUSEDROPE_ROPE_DYNAMIC, 64, 1024, 10000, 2, 512, 3000, 0, 32, 1, 0, 0,
     1, 1, 4, 1, 0, 0},
    {"dynamic seq<orig", FUSEDROPE_ROPE_DYNAMIC, 64, 1024, 10000, 3, 2048, 100, 0, 32, 1, 0, 0,
     1, 1, 4, 1, 0, 0},
    {"dynamic d4 attn ignored", FUSEDROPE_ROPE_DYNAMIC, 4, 512, 10000, 4, 128, 0, 2, 32, 1, 0,
     0, 1, 1, 4, 1, 0, 0},
    {"yarn x40", FUSEDROPE_ROPE_YARN, 64, 2048, 10000, 40, 4096, 0, 0, 32, 1, 0, 0, 1, 1, 4,
     0, 0, 0},
    {"yarn deepseek mscale 1/1", FUSEDROPE_ROPE_YARN, 64, 2048, 10000, 40, 4096, 0, 0, 32, 1,
     1, 1, 1, 1, 4, 1, 0, 0},
    {"yarn mscale 1/0.707", FUSEDROPE_ROPE_YARN, 64, 1024, 10000, 40, 4096, 0, 0, 32, 1, 1,
     0.707, 1, 1, 4, 0, 0, 0},
    {"yarn mscale only", FUSEDROPE_ROPE_YARN, 64, 1024, 10000, 16, 4096, 0, 0, 32, 1, 0.707, 0,
     1, 1, 4, 0, 0, 0},
    {"yarn gpt-oss truncate 0", FUSEDROPE_ROPE_YARN, 64, 2048, 150000, 32, 4096, 0, 0, 32, 1,
     0, 0, 0, 1, 4, 0, 0, 0},
    {"yarn attn 0.8 explicit", FUSEDROPE_ROPE_YARN, 32, 1024, 10000, 8, 2048, 0, 0.8, 32, 1, 0,
     0, 1, 1, 4, 0.8, 0, 0},
    {"yarn attn 1.5 + mscale", FUSEDROPE_ROPE_YARN, 32, 1024, 10000, 8, 2048, 0, 1.5, 32, 1, 1,
     0.5, 1, 1, 4, 1.5, 0, 0},
    {"yarn factor 1", FUSEDROPE_ROPE_YARN, 64, 1024, 10000, 1, 4096, 0, 0, 32, 1, 0, 0, 1, 1,
     4, 1, 0, 0},
    {"yarn low==high", FUSEDROPE_ROPE_YARN, 8, 512, 10000, 4, 64, 0, 0, 32, 11, 0, 0, 1, 1, 4,
     0, 0, 0},
    {"yarn betas 64/2 truncate 0", FUSEDROPE_ROPE_YARN, 128, 512, 1000000, 8, 8192, 0, 0, 64,
     2, 0, 0, 0, 1, 4, 0, 0, 0},
    /* corr(beta_slow) past the last pair (15.3 for d 16, theta 10, original 512):
     * high is clamped to d - 1 = 15 while low (3) still lies inside the pairs */
    {"yarn theta 10 high clamped", FUSEDROPE_ROPE_YARN, 16, 512, 10, 4, 512, 0, 0, 32, 1, 0, 0,
     1, 1, 4, 0, 0, 0},
    {"yarn theta 10 high clamped truncate 0", FUSEDROPE_ROPE_YARN, 16, 512, 10, 4, 512, 0, 0, 32,
     1, 0, 0, 0, 1, 4, 0, 0, 0},
    {"llama3.1", FUSEDROPE_ROPE_LLAMA3, 128, 512, 500000, 8, 8192, 0, 0, 32, 1, 0, 0, 1, 1, 4,
     1, 0, 0},
    {"llama3 d16 131072 rows", FUSEDROPE_ROPE_LLAMA3, 16, 131072, 500000, 8, 8192, 0, 0, 32, 1,
     0, 0, 1, 1, 4, 1, 0, 0},
    {"llama3 2/8 x32 attn ignored", FUSEDROPE_ROPE_LLAMA3, 64, 1024, 10000, 32, 1024, 0, 9,
     32, 1, 0, 0, 1, 2, 8, 1, 0, 0},
    /* Llama 4 Scout's config.json: low_freq_factor = high_freq_factor = 1
     * (no band between the divided and the unchanged wavelengths) */
    {"llama3 low == high (Llama 4 Scout)", FUSEDROPE_ROPE_LLAMA3, 128, 512, 500000, 16, 8192, 0,
     0, 32, 1, 0, 0, 1, 1, 1, 1, 0, 0},
    /* equal factors with pair 0's wavelength (2 pi) on lo = hi exactly:
     * unchanged (fusedrope_cache_create(3)), not the smoothing's 0/0 */
    {"llama3 low == high, a wavelength on both", FUSEDROPE_ROPE_LLAMA3, 2, 16, 10000, 8, 8192,
     0, 0, 32, 1, 0, 0, 1, 8192 / (2 * 3.14159265358979323846),
     8192 / (2 * 3.14159265358979323846), 1, 0, 0},
    /* F = freq_dim other than rot_dim in every rope type: odd (an odd
     * partial rotary dimension, rot_dim F + 1) and larger than rot_dim */
    {"default freq_dim 21", FUSEDROPE_ROPE_DEFAULT, 22, 300, 10000, 1, 0, 0, 0, 32, 1, 0, 0, 1,
     1, 4, 1, 21, 0},
    {"linear x4 freq_dim 40", FUSEDROPE_ROPE_LINEAR, 32, 512, 10000, 4, 0, 0, 0, 32, 1, 0, 0, 1,
     1, 4, 1, 40, 0},
    {"dynamic seq 3000 freq_dim 21", FUSEDROPE_ROPE_DYNAMIC, 22, 1024, 10000, 2, 512, 3000, 0,
     32, 1, 0, 0, 1, 1, 4, 1, 21, 0},
    {"dynamic freq_dim 96", FUSEDROPE_ROPE_DYNAMIC, 64, 2048, 10000, 4, 512, 0, 0, 32, 1, 0, 0,
     1, 1, 4, 1, 96, 0},
    {"yarn x40 freq_dim 63", FUSEDROPE_ROPE_YARN, 64, 2048, 10000, 40, 4096, 0, 0, 32, 1, 0, 0,
     1, 1, 4, 0, 63, 0},
    {"yarn x8 freq_dim 96 truncate 0", FUSEDROPE_ROPE_YARN, 64, 1024, 1000000, 8, 8192, 0, 0, 32,
     1, 0, 0, 0, 1, 4, 0, 96, 0},
    {"llama3.1 freq_dim 127", FUSEDROPE_ROPE_LLAMA3, 128, 512, 500000, 8, 8192, 0, 0, 32, 1, 0,
     0, 1, 1, 4, 1, 127, 0},
    {"proportional 0.25", FUSEDROPE_ROPE_PROPORTIONAL, 128, 512, 1000000, 1, 0, 0, 0, 32, 1, 0,
     0, 1, 1, 4, 1, 0, 0.25},
    {"proportional x2 0.5 freq_dim 100", FUSEDROPE_ROPE_PROPORTIONAL, 64, 512, 10000, 2, 0, 0, 0,
     32, 1, 0, 0, 1, 1, 4, 1, 100, 0.5},
};
#define NTCASES ((int)(sizeof tcases / sizeof tcases[0]))

static void config_of(const table_case *t, fusedrope_cache_config *cfg)
{
    fusedrope_cache_config_init(cfg, t->type, t->rot_dim, t->max_positions, t->theta);
    cfg->factor = t->factor;
    cfg->original_max_positions = t->original;
    cfg->seq_len = t->seq_len;
    cfg->attention_factor = t->attention_factor;
    cfg->beta_fast = t->beta_fast;
    cfg->beta_slow = t->beta_slow;
    cfg->mscale = t->mscale;
    cfg->mscale_all_dim = t->mscale_all_dim;
    cfg->truncate = t->truncate;
    cfg->low_freq_factor = t->low_freq_factor;
    cfg->high_freq_factor = t->high_freq_factor;
    cfg->freq_dim = t->freq_dim;
    cfg->partial_rotary_factor = t->partial_rotary_factor;
}

/*
 * The getters of what a cache derived (fusedrope_cache_inv_freq,
 * _attention_factor, _longrope_long) against the reference's ref_inv_freq
 * and DESIGN's longrope choice: both are double evaluations of one formula in
 * another order, so they agree to a few double ulps (2^-46 relative is far
 * below any formula slip: a wrong exponent or factor moves inv_i by > 1e-3).
 * The output array is poisoned first and must be filled exactly.
 */
static void check_derived(const fusedrope_cache *c, const fusedrope_cache_config *cfg,
                          const char *name)
{
    int half = cfg->rot_dim / 2, i, want_long;
    double *inv = tu_alloc(sizeof(double) * (size_t)(half + 1));
    double *got = tu_alloc(sizeof(double) * (size_t)(half + 1));
    double attn, a;

    ck_assert_int_eq(ref_inv_freq(cfg, inv, &attn), 0);
    memset(got, 0xff, sizeof(double) * (size_t)(half + 1));
    ck_assert_msg(fusedrope_cache_inv_freq(c, got) == FUSEDROPE_OK, "%s: inv_freq: %s", name,
                  fusedrope_last_error());
    for (i = 0; i < half; i++)
        ck_assert_msg(fabs(got[i] - inv[i]) <= 0x1p-46 * inv[i],
                      "%s: inv_freq[%d] = %.17g, reference %.17g", name, i, got[i], inv[i]);
    {
        unsigned char poison[sizeof(double)];
        memset(poison, 0xff, sizeof poison);
        ck_assert_msg(memcmp(&got[half], poison, sizeof poison) == 0,
                      "%s: inv_freq wrote past rot_dim/2 entries", name);
    }
    a = fusedrope_cache_attention_factor(c);
    ck_assert_msg(fabs(a - attn) <= 0x1p-46 * attn, "%s: attention factor %.17g, reference %.17g",
                  name, a, attn);
    want_long = cfg->type != FUSEDROPE_ROPE_LONGROPE ? -1
                : cfg->max_positions > cfg->original_max_positions ? 1 : 0;
    ck_assert_msg(fusedrope_cache_longrope_long(c) == want_long, "%s: longrope_long %d, want %d",
                  name, fusedrope_cache_longrope_long(c), want_long);
}

/*
 * The reference's inv_freq differs from the library's by a few double ulps,
 * which at large p moves an angle enough to flip a float rounding: hence
 * check_table_on's 99%.  With the library's own inv_freq and attention
 * factor (checked against the reference by check_derived), libm's cos and sin
 * give what every table entry must be, the correctly rounded float of
 * cos(p inv_i) a, except where that double lies within 2^-44 of a rounding
 * boundary.  DESIGN's sin and cos (lib/rope_math.h: a reduction by pi/2 and
 * Taylor polynomials) are far more accurate than that window, so a slip in
 * any term above it shows here.
 */
static void check_table_libm(const fusedrope_cache *c, const float *tc, const float *ts,
                             const char *name, fusedrope_device dev)
{
    int half = fusedrope_cache_rot_dim(c) / 2, i, k;
    int64_t rows = fusedrope_cache_max_positions(c), p, ties = 0;
    double *inv = tu_alloc(sizeof(double) * (size_t)half);
    double a = fusedrope_cache_attention_factor(c);

    ck_assert_int_eq(fusedrope_cache_inv_freq(c, inv), FUSEDROPE_OK);
    for (p = 0; p < rows; p++)
        for (i = 0; i < half; i++) {
            double ang = (double)p * inv[i];
            for (k = 0; k < 2; k++) {
                double v = (k ? sin(ang) : cos(ang)) * a, w = 0x1p-44 * fabs(v);
                float got = (k ? ts : tc)[p * half + i];
                if ((float)(v - w) != (float)(v + w)) {
                    ties++;
                    continue;
                }
                ck_assert_msg(got == (float)v,
                              "%s (%s): %s[%lld][%d] = %.9g, libm's rounded %.9g (%.17g)",
                              name, dev_name(dev), k ? "sin" : "cos", (long long)p, i, got,
                              (float)v, v);
            }
        }
    /* a window of 2^-44 leaves about 2^-20 of entries undecided, not more */
    ck_assert_msg(ties <= 2 * rows * half / 4096 + 8, "%s: %lld entries near a tie", name,
                  (long long)ties);
}

/* The table of cfg on one device, copied back, against the float64 angles:
   within one float ulp everywhere and the correctly rounded float almost
   everywhere (at least 99% of entries; row 0 exactly (float)a and 0), then
   against libm (check_table_libm); on a CUDA cache this judges the upload
   and copy_table's way back as well as the table. */
static void check_table_on(const fusedrope_cache_config *cfg, const char *name,
                           double expect_attn, fusedrope_device dev)
{
    fusedrope_cache *c = NULL;
    fusedrope_status st;
    int half = cfg->rot_dim / 2, i;
    int64_t rows = cfg->max_positions, p, n = rows * half, exact = 0, bad = 0;
    float *tc, *ts;
    double *inv, attn;
    char first[256] = "";

    st = fusedrope_cache_create(cfg, dev, &c);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: create: %s (%s)", name, st_name(st),
                  fusedrope_last_error());
    ck_assert_ptr_nonnull(c);
    tu_track(c);
    ck_assert_int_eq(fusedrope_cache_rot_dim(c), cfg->rot_dim);
    ck_assert_int_eq(fusedrope_cache_max_positions(c), rows);
    ck_assert_int_eq(fusedrope_cache_device(c), dev);
    ck_assert_int_eq(fusedrope_cache_check(c, NULL), FUSEDROPE_OK);
    check_derived(c, cfg, name);

    tc = tu_alloc(sizeof(float) * (size_t)n);
    ts = tu_alloc(sizeof(float) * (size_t)n);
    memset(tc, 0xff, sizeof(float) * (size_t)n);
    memset(ts, 0xff, sizeof(float) * (size_t)n);
    st = fusedrope_cache_copy_table(c, tc, ts);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: copy_table: %s", name, st_name(st));

    inv = tu_alloc(sizeof(double) * (size_t)half);
    ck_assert_int_eq(ref_inv_freq(cfg, inv, &attn), 0);
    if (expect_attn > 0)
        ck_assert_msg(fabs(attn - expect_attn) <= 1e-15 * expect_attn,
                      "%s: test's own attention factor %.17g vs %.17g", name, attn,
                      expect_attn);

    for (i = 0; i < half; i++) {
        ck_assert_msg(tc[i] == (float)attn, "%s (%s): cos[0][%d] = %.9g, want (float)%.17g",
                      name, dev_name(dev), i, tc[i], attn);
        ck_assert_msg(ts[i] == 0.0f, "%s: sin[0][%d] = %.9g, want 0", name, i, ts[i]);
    }
    for (p = 0; p < rows; p++)
        for (i = 0; i < half; i++) {
            double ang = (double)p * inv[i];
            double rc = cos(ang) * attn, rs = sin(ang) * attn;
            float gc = tc[p * half + i], gs = ts[p * half + i];
            int ok = fabs(gc - rc) <= ref_ulp(rc, FUSEDROPE_FLOAT32) &&
                     fabs(gs - rs) <= ref_ulp(rs, FUSEDROPE_FLOAT32);
            if (!ok && bad++ == 0)
                snprintf(first, sizeof first,
                         "row %lld pair %d: cos %.9g sin %.9g, want %.12g %.12g (inv %.17g)",
                         (long long)p, i, gc, gs, rc, rs, inv[i]);
            exact += (gc == (float)rc) + (gs == (float)rs);
        }
    ck_assert_msg(bad == 0, "%s (%s): %lld of %lld entries more than 1 float ulp off; first: %s",
                  name, dev_name(dev), (long long)bad, (long long)n, first);
    ck_assert_msg(exact >= 2 * n - (2 * n) / 100,
                  "%s (%s): only %lld of %lld entries are the correctly rounded float", name,
                  dev_name(dev), (long long)exact, (long long)(2 * n));
    check_table_libm(c, tc, ts, name, dev);
}

/* On the CPU, and on the GPU too where the build and the machine have one. */
static void check_table(const fusedrope_cache_config *cfg, const char *name, double expect_attn)
{
    check_table_on(cfg, name, expect_attn, CPU);
    if (fusedrope_cuda_available())
        check_table_on(cfg, name, expect_attn, FUSEDROPE_DEVICE_CUDA);
}

START_TEST(test_table_types)
{
    fusedrope_cache_config cfg;
    const table_case *t = &tcases[_i];
    init_factors();
    config_of(t, &cfg);
    check_table(&cfg, t->name, t->expect_attn);
    tu_free_all();
}
END_TEST

/* Hand-computed attention factors (independent of ref_inv_freq's code path). */
START_TEST(test_yarn_attention_factors)
{
    ck_assert(fabs(ref_yarn_mscale(40, 1) - (1 + 0.1 * LN(40.0))) < 1e-15);
    ck_assert(ref_yarn_mscale(1, 5) == 1.0);
    ck_assert(ref_yarn_mscale(0.5, 5) == 1.0);
    {
        fusedrope_cache_config cfg;
        double inv[32], a;
        config_of(&tcases[10], &cfg); /* yarn x40 */
        ref_inv_freq(&cfg, inv, &a);
        ck_assert(fabs(a - 1.3688879454113936) < 1e-15);
        config_of(&tcases[12], &cfg); /* 1/0.707 */
        ref_inv_freq(&cfg, inv, &a);
        ck_assert(fabs(a - (1 + 0.1 * LN(40.0)) / (1 + 0.0707 * LN(40.0))) < 1e-15);
    }
}
END_TEST

/* YaRN's correction range: the literal formulas, checked on known numbers. */
START_TEST(test_yarn_range)
{
    fusedrope_cache_config cfg;
    double lo, hi;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, 64, 16, 10000);
    cfg.factor = 40;
    cfg.original_max_positions = 4096;
    ref_yarn_range(&cfg, &lo, &hi);
    /* corr(32) = 64 ln(4096/(64 pi)) / (2 ln 1e4) = 10.47.., corr(1) = 22.51.. */
    ck_assert(lo == 10.0 && hi == 23.0);
    cfg.truncate = 0;
    ref_yarn_range(&cfg, &lo, &hi);
    ck_assert(fabs(lo - 64 * LN(4096 / (64 * 3.14159265358979323846)) / (2 * LN(1e4))) < 1e-12);
    ck_assert(lo > 10.47 && lo < 10.48 && hi > 22.51 && hi < 22.52);
    /* the +0.001 rule */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, 8, 16, 10000);
    cfg.factor = 4;
    cfg.original_max_positions = 64;
    cfg.beta_slow = 11;
    ref_yarn_range(&cfg, &lo, &hi);
    ck_assert(lo == 0.0 && hi == 0.001);
    /* the clamp of high to d - 1: corr(1) = 16 ln(512/(2 pi)) / (2 ln 10) = 15.29.. */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, 16, 16, 10);
    cfg.factor = 4;
    cfg.original_max_positions = 512;
    ref_yarn_range(&cfg, &lo, &hi);
    ck_assert(lo == 3.0 && hi == 15.0);
}
END_TEST

/* LongRoPE: which factor list, and the derived attention factor, seen in the table. */
START_TEST(test_longrope)
{
    static const struct {
        int64_t max_positions;
        double factor, attention_factor;
        int use_long;
        double attn; /* 0: sqrt(1 + ln s / ln original) */
    } lc[] = {
        {8192, 0, 0, 1, 0},      /* s = 2, long */
        {4096, 0, 0, 0, 1},      /* s = 1: a = 1; max == original: short */
        {2048, 4, 0, 0, 0},      /* explicit factor, short */
        {8192, 0, 1.25, 1, 1.25},
        {2048, 0.5, 0, 0, 1},
        {4097, 0, 0, 1, 0},
        {0, 0, 0, 0, 1},         /* table-less: short, a = 1 */
    };
    int k = _i, i, half = 16;
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    double want_attn = lc[k].attn, got_attn, inv_ref[16];
    init_factors();
    if (want_attn == 0) {
        double s = lc[k].factor ? lc[k].factor : lc[k].max_positions / 4096.0;
        want_attn = sqrt(1 + log(s) / log(4096.0));
    }
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LONGROPE, 32, lc[k].max_positions,
                                10000);
    cfg.original_max_positions = 4096;
    cfg.factor = lc[k].factor;
    cfg.attention_factor = lc[k].attention_factor;
    cfg.short_factor = short_f;
    cfg.long_factor = long_f;
    /* the reference agrees with the hand-written choice */
    ref_inv_freq(&cfg, inv_ref, &got_attn);
    ck_assert(fabs(got_attn - want_attn) <= 1e-15 * want_attn);
    for (i = 0; i < half; i++) {
        const double *f = lc[k].use_long ? long_f : short_f;
        ck_assert(inv_ref[i] == pow(10000.0, -(2.0 * i) / 32) / f[i]);
    }
    if (lc[k].max_positions > 0) {
        /* row 1 of the table: angle inv_i, with the chosen list */
        int64_t n = lc[k].max_positions * half;
        float *tc = tu_alloc(sizeof(float) * (size_t)n), *ts = tu_alloc(sizeof(float) * (size_t)n);
        check_table(&cfg, "longrope", want_attn);
        ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
        tu_track(c);
        ck_assert_int_eq(fusedrope_cache_copy_table(c, tc, ts), FUSEDROPE_OK);
        for (i = 0; i < half; i++) {
            const double *f = lc[k].use_long ? long_f : short_f;
            const double *g = lc[k].use_long ? short_f : long_f;
            double inv = pow(10000.0, -(2.0 * i) / 32) / f[i];
            double other = pow(10000.0, -(2.0 * i) / 32) / g[i];
            ck_assert_msg(fabs(ts[half + i] - sin(inv) * want_attn) <=
                              ref_ulp(sin(inv) * want_attn, FUSEDROPE_FLOAT32),
                          "case %d pair %d: sin[1] %.9g want %.9g (%s factors; other list "
                          "gives %.9g)",
                          k, i, ts[half + i], sin(inv) * want_attn,
                          lc[k].use_long ? "long" : "short", sin(other) * want_attn);
        }
    } else {
        ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
        tu_track(c);
    }
    /* the getters name the hand-written choice and factor */
    ck_assert_int_eq(fusedrope_cache_longrope_long(c), lc[k].use_long);
    ck_assert(fabs(fusedrope_cache_attention_factor(c) - want_attn) <= 1e-15 * want_attn);
    tu_free_all();
}
END_TEST

/* Llama-3: each pair's regime, seen through the table's row 1 (angle = inv_i). */
START_TEST(test_llama3_ramps)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    int half = 64, i, nhigh = 0, nlow = 0, nmid = 0;
    float *tc = tu_alloc(sizeof(float) * 2 * 64), *ts = tu_alloc(sizeof(float) * 2 * 64);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LLAMA3, 128, 2, 500000);
    cfg.factor = 8;
    cfg.original_max_positions = 8192;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
    tu_track(c);
    ck_assert_int_eq(fusedrope_cache_copy_table(c, tc, ts), FUSEDROPE_OK);
    for (i = 0; i < half; i++) {
        double v = pow(500000.0, -(2.0 * i) / 128), w = 2 * 3.14159265358979323846 / v, want;
        if (w < 8192.0 / 4) {
            want = v;
            nhigh++;
        } else if (w > 8192.0) {
            want = v / 8;
            nlow++;
        } else {
            double t = (8192.0 / w - 1) / 3;
            ck_assert(t >= 0 && t <= 1);
            want = (1 - t) * v / 8 + t * v;
            nmid++;
        }
        ck_assert_msg(fabs(ts[half + i] - sin(want)) <= ref_ulp(sin(want), FUSEDROPE_FLOAT32),
                      "pair %d: sin[1] = %.9g, want sin(%.17g) = %.9g", i, ts[half + i], want,
                      sin(want));
    }
    /* the three regimes are all exercised */
    ck_assert(nhigh > 0 && nlow > 0 && nmid > 0);
    tu_free_all();
}
END_TEST

/* Dynamic NTK with seq_len below original is the default table. */
START_TEST(test_dynamic_equals_default_below_original)
{
    fusedrope_cache_config cd, cn;
    fusedrope_cache *a = NULL, *b = NULL;
    int64_t n = 300 * 32;
    float *ac = tu_alloc(4 * n), *as = tu_alloc(4 * n), *bc = tu_alloc(4 * n),
          *bs = tu_alloc(4 * n);
    fusedrope_cache_config_init(&cd, FUSEDROPE_ROPE_DYNAMIC, 64, 300, 10000);
    cd.factor = 4;
    cd.original_max_positions = 1024; /* L = max(300, 1024) = original: base unchanged */
    fusedrope_cache_config_init(&cn, FUSEDROPE_ROPE_DEFAULT, 64, 300, 10000);
    ck_assert_int_eq(fusedrope_cache_create(&cd, CPU, &a), FUSEDROPE_OK);
    tu_track(a);
    ck_assert_int_eq(fusedrope_cache_create(&cn, CPU, &b), FUSEDROPE_OK);
    tu_track(b);
    ck_assert_int_eq(fusedrope_cache_copy_table(a, ac, as), FUSEDROPE_OK);
    ck_assert_int_eq(fusedrope_cache_copy_table(b, bc, bs), FUSEDROPE_OK);
    {
        int64_t k, diff = 0;
        for (k = 0; k < n; k++)
            diff += fabsf(ac[k] - bc[k]) > ref_ulp(bc[k], FUSEDROPE_FLOAT32) ||
                    fabsf(as[k] - bs[k]) > ref_ulp(bs[k], FUSEDROPE_FLOAT32);
        ck_assert_msg(diff == 0, "%lld entries differ from the default table", (long long)diff);
    }
    /* seq_len = 0 means max_positions: with max_positions > original the base grows */
    {
        fusedrope_cache_config c3 = cd;
        fusedrope_cache *d = NULL;
        c3.max_positions = 4096;
        c3.seq_len = 0;
        check_table(&c3, "dynamic seq_len 0 -> max_positions", 1);
        c3.seq_len = 4096;
        ck_assert_int_eq(fusedrope_cache_create(&c3, CPU, &d), FUSEDROPE_OK);
        tu_track(d);
    }
    tu_free_all();
}
END_TEST

/* ------------------------------------------------------------- user tables */

START_TEST(test_from_table_round_trip)
{
    static const struct { int64_t rows; int rot; } sz[] = {{37, 12}, {1, 2}, {5, 8192}, {300, 64}};
    int64_t rows = sz[_i].rows, n = rows * (sz[_i].rot / 2), k;
    float *c0 = malloc(sizeof(float) * (size_t)n), *s0 = malloc(sizeof(float) * (size_t)n);
    float *c1 = tu_alloc(sizeof(float) * (size_t)n), *s1 = tu_alloc(sizeof(float) * (size_t)n);
    float *keep_c = tu_alloc(sizeof(float) * (size_t)n), *keep_s = tu_alloc(sizeof(float) * (size_t)n);
    fusedrope_cache *c = NULL;
    tu_rng r;
    tu_rng_init(&r, 100 + _i);
    ck_assert(c0 && s0);
    for (k = 0; k < n; k++) {
        c0[k] = (float)tu_uniform(&r, -1.5, 1.5); /* attention factor folded in: > 1 allowed */
        s0[k] = (float)tu_uniform(&r, -1.5, 1.5);
    }
    c0[0] = -0.0f;
    memcpy(keep_c, c0, sizeof(float) * (size_t)n);
    memcpy(keep_s, s0, sizeof(float) * (size_t)n);
    ck_assert_int_eq(fusedrope_cache_create_from_table(c0, s0, rows, sz[_i].rot, CPU, &c),
                     FUSEDROPE_OK);
    ck_assert_ptr_nonnull(c);
    tu_track(c);
    /* the cache is immutable once built: it does not keep the caller's arrays */
    memset(c0, 0x5a, sizeof(float) * (size_t)n);
    memset(s0, 0x5a, sizeof(float) * (size_t)n);
    free(c0);
    free(s0);
    ck_assert_int_eq(fusedrope_cache_rot_dim(c), sz[_i].rot);
    ck_assert_int_eq(fusedrope_cache_max_positions(c), rows);
    ck_assert_int_eq(fusedrope_cache_device(c), FUSEDROPE_DEVICE_CPU);
    ck_assert_int_eq(fusedrope_cache_copy_table(c, c1, s1), FUSEDROPE_OK);
    ck_assert_msg(memcmp(c1, keep_c, sizeof(float) * (size_t)n) == 0, "cos not bit-identical");
    ck_assert_msg(memcmp(s1, keep_s, sizeof(float) * (size_t)n) == 0, "sin not bit-identical");
    /* nothing was derived: no inverse frequencies (output untouched), factor 0, no longrope */
    {
        double inv[2] = { 7.0, 7.0 };
        ck_assert_int_eq(fusedrope_cache_inv_freq(c, inv), FUSEDROPE_ERR_INVALID);
        ck_assert_str_eq(fusedrope_last_error(),
                         "the cache was made from a user table (fusedrope_cache_create_from_table): "
                         "it has no inverse frequencies");
        ck_assert(inv[0] == 7.0 && inv[1] == 7.0);
        ck_assert(fusedrope_cache_attention_factor(c) == 0.0);
        ck_assert_int_eq(fusedrope_cache_longrope_long(c), -1);
    }
    tu_free_all();
}
END_TEST

START_TEST(test_from_table_errors)
{
    float t[8] = {1, 1, 1, 1, 0, 0, 0, 0};
    static const struct {
        int null_cos, null_sin;
        int64_t rows;
        int rot, dev;
        const char *what;
    } ec[] = {
        {1, 0, 2, 2, CPU, "cos"}, {0, 1, 2, 2, CPU, "sin"},
        {0, 0, 0, 2, CPU, "positions"}, {0, 0, -1, 2, CPU, "positions"},
        {0, 0, INT64_MIN, 2, CPU, "positions"},
        {0, 0, 2, 3, CPU, "rot_dim"}, {0, 0, 2, 0, CPU, "rot_dim"},
        {0, 0, 2, -2, CPU, "rot_dim"}, {0, 0, 2, 8194, CPU, "rot_dim"},
        {0, 0, 2, 2, 3, "device"}, {0, 0, 2, 2, -1, "device"},
    };
    int k = _i;
    fusedrope_cache *c = (fusedrope_cache *)t;
    fusedrope_status st = fusedrope_cache_create_from_table(
        ec[k].null_cos ? NULL : t, ec[k].null_sin ? NULL : t + 4, ec[k].rows, ec[k].rot,
        (fusedrope_device)ec[k].dev, &c);
    ck_assert_msg(st == FUSEDROPE_ERR_INVALID, "case %d (%s): %s", k, ec[k].what, st_name(st));
    ck_assert_ptr_null(c);
    ck_assert_msg(tu_contains(fusedrope_last_error(), ec[k].what),
                  "case %d: last_error \"%s\" does not name %s", k, fusedrope_last_error(),
                  ec[k].what);
    /* NULL out */
    st = fusedrope_cache_create_from_table(t, t + 4, 2, 2, CPU, NULL);
    ck_assert_int_eq(st, FUSEDROPE_ERR_INVALID);
    ck_assert_str_ne(fusedrope_last_error(), "");
}
END_TEST

/* ------------------------------------------------------ table-less caches */

START_TEST(test_tableless)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    float tc[4], ts[4];
    fusedrope_cache_config_init(&cfg, (fusedrope_rope_type)_i, 16, 0, 10000);
    init_factors();
    cfg.factor = _i == FUSEDROPE_ROPE_LONGROPE ? 0 : 2;
    cfg.original_max_positions = 256;
    cfg.short_factor = short_f;
    cfg.long_factor = long_f;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
    tu_track(c);
    ck_assert_int_eq(fusedrope_cache_max_positions(c), 0);
    ck_assert_int_eq(fusedrope_cache_rot_dim(c), 16);
    ck_assert_int_eq(fusedrope_cache_device(c), FUSEDROPE_DEVICE_CPU);
    ck_assert_int_eq(fusedrope_cache_check(c, NULL), FUSEDROPE_OK);
    check_derived(c, &cfg, "table-less");
    memset(tc, 0x77, sizeof tc);
    memset(ts, 0x77, sizeof ts);
    ck_assert_int_eq(fusedrope_cache_copy_table(c, tc, ts), FUSEDROPE_ERR_INVALID);
    ck_assert_str_ne(fusedrope_last_error(), "");
    {
        unsigned char want[sizeof tc];
        memset(want, 0x77, sizeof want);
        ck_assert(memcmp(tc, want, sizeof tc) == 0 && memcmp(ts, want, sizeof ts) == 0);
    }
    tu_free_all();
}
END_TEST

/* ------------------------------------------------------------------ getters */

START_TEST(test_getters_null)
{
    ck_assert_int_eq(fusedrope_cache_rot_dim(NULL), 0);
    ck_assert_int_eq(fusedrope_cache_max_positions(NULL), 0);
    ck_assert_int_eq(fusedrope_cache_device(NULL), FUSEDROPE_DEVICE_CPU);
    ck_assert(fusedrope_cache_attention_factor(NULL) == 0.0);
    ck_assert_int_eq(fusedrope_cache_longrope_long(NULL), -1);
    {
        double inv[1] = { 7.0 };
        fusedrope_cache_config cfg;
        fusedrope_cache *c = NULL;
        ck_assert_int_eq(fusedrope_cache_inv_freq(NULL, inv), FUSEDROPE_ERR_INVALID);
        ck_assert_str_eq(fusedrope_last_error(), "cache is NULL");
        ck_assert(inv[0] == 7.0);
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 2, 4, 10000);
        ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
        tu_track(c);
        ck_assert_int_eq(fusedrope_cache_inv_freq(c, NULL), FUSEDROPE_ERR_INVALID);
        ck_assert_str_eq(fusedrope_last_error(), "inv_freq is NULL");
        /* rot_dim 2: the one pair's inv_0 = theta^0 = 1 exactly */
        ck_assert_int_eq(fusedrope_cache_inv_freq(c, inv), FUSEDROPE_OK);
        ck_assert(inv[0] == 1.0);
        ck_assert(fusedrope_cache_attention_factor(c) == 1.0);
        tu_free_all();
    }
    fusedrope_cache_destroy(NULL);
}
END_TEST

START_TEST(test_copy_table_errors)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    float tc[8 * 4], ts[8 * 4];
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 8, 8, 10000);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
    tu_track(c);
    memset(tc, 0x33, sizeof tc);
    memset(ts, 0x33, sizeof ts);
    ck_assert_int_eq(fusedrope_cache_copy_table(NULL, tc, ts), FUSEDROPE_ERR_INVALID);
    ck_assert_str_ne(fusedrope_last_error(), "");
    ck_assert_int_eq(fusedrope_cache_copy_table(c, NULL, ts), FUSEDROPE_ERR_INVALID);
    ck_assert_int_eq(fusedrope_cache_copy_table(c, tc, NULL), FUSEDROPE_ERR_INVALID);
    {
        unsigned char want[sizeof tc];
        memset(want, 0x33, sizeof want);
        ck_assert(memcmp(tc, want, sizeof tc) == 0 && memcmp(ts, want, sizeof ts) == 0);
    }
    ck_assert_int_eq(fusedrope_cache_copy_table(c, tc, ts), FUSEDROPE_OK);
    ck_assert(tc[0] == 1.0f && ts[0] == 0.0f);
    tu_free_all();
}
END_TEST

/* -------------------------------------------------------- bad configurations */

typedef void (*mutator)(fusedrope_cache_config *);

typedef struct bad_case {
    const char *label;
    fusedrope_rope_type type;
    int field;    /* which field to set */
    double value; /* its value */
    fusedrope_status want;
    const char *names; /* last_error must contain this */
} bad_case;

enum {
    F_ROT, F_MAXPOS, F_THETA, F_FACTOR, F_ORIG, F_SEQ, F_ATTN, F_BFAST, F_BSLOW, F_MSCALE,
    F_MSCALE_ALL, F_TRUNC, F_LOWF, F_HIGHF, F_SHORT_NULL, F_LONG_NULL, F_SHORT_AT, F_LONG_AT,
    F_TYPE, F_DEVICE, F_FREQ, F_PRF, F_NONE
};

#define INV FUSEDROPE_ERR_INVALID
#define RNG FUSEDROPE_ERR_RANGE
#define D FUSEDROPE_ROPE_DEFAULT
#define LI FUSEDROPE_ROPE_LINEAR
#define DY FUSEDROPE_ROPE_DYNAMIC
#define YA FUSEDROPE_ROPE_YARN
#define LR FUSEDROPE_ROPE_LONGROPE
#define L3 FUSEDROPE_ROPE_LLAMA3
#define PR FUSEDROPE_ROPE_PROPORTIONAL

static const bad_case bad_cases[] = {
    /* rot_dim: even, 2..8192, every type */
    {"rot_dim odd", D, F_ROT, 7, INV, "rot_dim"},
    {"rot_dim 1", D, F_ROT, 1, INV, "rot_dim"},
    {"rot_dim 0", D, F_ROT, 0, INV, "rot_dim"},
    {"rot_dim -2", D, F_ROT, -2, INV, "rot_dim"},
    {"rot_dim 8194", D, F_ROT, 8194, INV, "rot_dim"},
    {"rot_dim 8193", LI, F_ROT, 8193, INV, "rot_dim"},
    {"yarn rot_dim odd", YA, F_ROT, 63, INV, "rot_dim"},
    {"longrope rot_dim 0", LR, F_ROT, 0, INV, "rot_dim"},
    {"llama3 rot_dim odd", L3, F_ROT, 5, INV, "rot_dim"},
    {"dynamic rot_dim 2", DY, F_ROT, 2, INV, "rot_dim"},
    /* freq_dim: 0 or 2..2 * FUSEDROPE_MAX_ROT_DIM; dynamic needs F >= 4 */
    {"freq_dim 1", D, F_FREQ, 1, INV, "freq_dim is 1"},
    {"freq_dim -2", YA, F_FREQ, -2, INV, "freq_dim is -2"},
    {"freq_dim 16386", LI, F_FREQ, 16386, INV, "freq_dim is 16386"},
    {"dynamic freq_dim 3", DY, F_FREQ, 3, INV, "F is 3"},
    {"dynamic freq_dim 2", DY, F_FREQ, 2, INV, "F is 2"},
    /* proportional: partial_rotary_factor in [0, 1] */
    {"proportional factor 1.5", PR, F_PRF, 1.5, INV, "partial_rotary_factor is 1.5"},
    {"proportional factor -0.25", PR, F_PRF, -0.25, INV, "partial_rotary_factor is -0.25"},
    {"proportional factor NaN", PR, F_PRF, NAN, INV, "partial_rotary_factor is nan"},
    /* theta finite > 1 */
    {"theta 1", D, F_THETA, 1, INV, "theta"},
    {"theta 0.5", D, F_THETA, 0.5, INV, "theta"},
    {"theta 0", LI, F_THETA, 0, INV, "theta"},
    {"theta -10", DY, F_THETA, -10, INV, "theta"},
    {"theta NaN", YA, F_THETA, NAN, INV, "theta"},
    {"theta Inf", LR, F_THETA, INFINITY, INV, "theta"},
    {"theta -Inf", L3, F_THETA, -INFINITY, INV, "theta"},
    /* max_positions */
    {"max_positions -1", D, F_MAXPOS, -1, INV, "max_positions"},
    {"max_positions -1 yarn", YA, F_MAXPOS, -1, INV, "max_positions"},
    {"max_positions 2^62 (table bytes overflow)", D, F_MAXPOS, 0x1p62, RNG, "max_positions"},
    {"max_positions 2^61 d64 (overflow)", LI, F_MAXPOS, 0x1p61, RNG, "max_positions"},
    /* factor */
    {"linear factor 0", LI, F_FACTOR, 0, INV, "factor"},
    {"linear factor -1", LI, F_FACTOR, -1, INV, "factor"},
    {"linear factor NaN", LI, F_FACTOR, NAN, INV, "factor"},
    {"linear factor Inf", LI, F_FACTOR, INFINITY, INV, "factor"},
    {"dynamic factor 0", DY, F_FACTOR, 0, INV, "factor"},
    {"dynamic factor -2", DY, F_FACTOR, -2, INV, "factor"},
    {"dynamic factor NaN", DY, F_FACTOR, NAN, INV, "factor"},
    /* theta (factor + 1)^(16/14) = 1e343: past double, pairs 1.. would get 0 */
    {"dynamic factor 1e300 (scaled theta overflows)", DY, F_FACTOR, 1e300, INV,
     "past the double range"},
    {"yarn factor 0", YA, F_FACTOR, 0, INV, "factor"},
    {"yarn factor Inf", YA, F_FACTOR, INFINITY, INV, "factor"},
    {"yarn factor -0.5", YA, F_FACTOR, -0.5, INV, "factor"},
    {"llama3 factor 0", L3, F_FACTOR, 0, INV, "factor"},
    {"llama3 factor NaN", L3, F_FACTOR, NAN, INV, "factor"},
    {"longrope factor -1", LR, F_FACTOR, -1, INV, "factor"},
    {"longrope factor NaN", LR, F_FACTOR, NAN, INV, "factor"},
    {"longrope factor Inf", LR, F_FACTOR, INFINITY, INV, "factor"},
    /* original_max_positions */
    {"dynamic original 0", DY, F_ORIG, 0, INV, "original_max_positions"},
    {"yarn original 0", YA, F_ORIG, 0, INV, "original_max_positions"},
    {"yarn original -5", YA, F_ORIG, -5, INV, "original_max_positions"},
    {"longrope original 0", LR, F_ORIG, 0, INV, "original_max_positions"},
    {"llama3 original 0", L3, F_ORIG, 0, INV, "original_max_positions"},
    {"llama3 original -1", L3, F_ORIG, -1, INV, "original_max_positions"},
    /* dynamic seq_len */
    {"dynamic seq_len -1", DY, F_SEQ, -1, INV, "seq_len"},
    /* yarn */
    {"yarn beta_fast 0", YA, F_BFAST, 0, INV, "beta_fast"},
    {"yarn beta_fast -1", YA, F_BFAST, -1, INV, "beta_fast"},
    {"yarn beta_fast NaN", YA, F_BFAST, NAN, INV, "beta_fast"},
    {"yarn beta_fast Inf", YA, F_BFAST, INFINITY, INV, "beta_fast"},
    {"yarn beta_slow 0", YA, F_BSLOW, 0, INV, "beta_slow"},
    {"yarn beta_slow -3", YA, F_BSLOW, -3, INV, "beta_slow"},
    {"yarn beta_slow NaN", YA, F_BSLOW, NAN, INV, "beta_slow"},
    {"yarn beta_slow Inf", YA, F_BSLOW, INFINITY, INV, "beta_slow"},
    {"yarn attention_factor -1", YA, F_ATTN, -1, INV, "attention_factor"},
    {"yarn attention_factor NaN", YA, F_ATTN, NAN, INV, "attention_factor"},
    {"yarn attention_factor Inf", YA, F_ATTN, INFINITY, INV, "attention_factor"},
    {"yarn mscale -1", YA, F_MSCALE, -1, INV, "mscale"},
    {"yarn mscale NaN", YA, F_MSCALE, NAN, INV, "mscale"},
    {"yarn mscale Inf", YA, F_MSCALE, INFINITY, INV, "mscale"},
    {"yarn mscale_all_dim -1", YA, F_MSCALE_ALL, -1, INV, "mscale_all_dim"},
    {"yarn mscale_all_dim NaN", YA, F_MSCALE_ALL, NAN, INV, "mscale_all_dim"},
    {"yarn mscale_all_dim Inf", YA, F_MSCALE_ALL, INFINITY, INV, "mscale_all_dim"},
    {"yarn truncate 2", YA, F_TRUNC, 2, INV, "truncate"},
    {"yarn truncate -1", YA, F_TRUNC, -1, INV, "truncate"},
    /* longrope */
    {"longrope attention_factor -1", LR, F_ATTN, -1, INV, "attention_factor"},
    {"longrope attention_factor NaN", LR, F_ATTN, NAN, INV, "attention_factor"},
    {"longrope attention_factor Inf", LR, F_ATTN, INFINITY, INV, "attention_factor"},
    {"longrope short_factor NULL", LR, F_SHORT_NULL, 0, INV, "short_factor"},
    {"longrope long_factor NULL", LR, F_LONG_NULL, 0, INV, "long_factor"},
    {"longrope short_factor[last] 0", LR, F_SHORT_AT, 0, INV, "short_factor"},
    {"longrope short_factor[last] -1", LR, F_SHORT_AT, -1, INV, "short_factor"},
    {"longrope short_factor[last] NaN", LR, F_SHORT_AT, NAN, INV, "short_factor"},
    {"longrope short_factor[last] Inf", LR, F_SHORT_AT, INFINITY, INV, "short_factor"},
    {"longrope long_factor[last] 0", LR, F_LONG_AT, 0, INV, "long_factor"},
    {"longrope long_factor[last] -2", LR, F_LONG_AT, -2, INV, "long_factor"},
    {"longrope long_factor[last] NaN", LR, F_LONG_AT, NAN, INV, "long_factor"},
    {"longrope long_factor[last] Inf", LR, F_LONG_AT, INFINITY, INV, "long_factor"},
    /* llama3: 0 < low <= high, finite */
    {"llama3 low 0", L3, F_LOWF, 0, INV, "low_freq_factor"},
    {"llama3 low -1", L3, F_LOWF, -1, INV, "low_freq_factor"},
    {"llama3 low NaN", L3, F_LOWF, NAN, INV, "low_freq_factor"},
    {"llama3 low > high", L3, F_LOWF, 5, INV, "freq_factor"},
    {"llama3 high < low", L3, F_HIGHF, 0.5, INV, "freq_factor"},
    {"llama3 high Inf", L3, F_HIGHF, INFINITY, INV, "high_freq_factor"},
    {"llama3 high NaN", L3, F_HIGHF, NAN, INV, "high_freq_factor"},
    /* enums */
    {"type 7", D, F_TYPE, 7, INV, "type"},
    {"type -1", D, F_TYPE, -1, INV, "type"},
    {"device 3", D, F_DEVICE, 3, INV, "device"},
    {"device -1", D, F_DEVICE, -1, INV, "device"},
};
#define NBAD ((int)(sizeof bad_cases / sizeof bad_cases[0]))

/* A valid configuration of each type. */
static void good_config(fusedrope_cache_config *cfg, fusedrope_rope_type type)
{
    init_factors();
    fusedrope_cache_config_init(cfg, type, 16, 64, 10000);
    if (type != FUSEDROPE_ROPE_DEFAULT)
        cfg->original_max_positions = 32;
    if (type != FUSEDROPE_ROPE_DEFAULT && type != FUSEDROPE_ROPE_LONGROPE)
        cfg->factor = 2;
    cfg->short_factor = short_f;
    cfg->long_factor = long_f;
}

static double bad_short[8], bad_long[8];

static fusedrope_device apply_field(fusedrope_cache_config *cfg, const bad_case *b)
{
    fusedrope_device dev = CPU;
    switch (b->field) {
    case F_ROT: cfg->rot_dim = (int)b->value; break;
    case F_MAXPOS:
        cfg->max_positions = (int64_t)b->value;
        if (b->value == 0x1p61)
            cfg->rot_dim = 64;
        break;
    case F_THETA: cfg->theta = b->value; break;
    case F_FACTOR: cfg->factor = b->value; break;
    case F_ORIG: cfg->original_max_positions = (int64_t)b->value; break;
    case F_SEQ: cfg->seq_len = (int64_t)b->value; break;
    case F_ATTN: cfg->attention_factor = b->value; break;
    case F_BFAST: cfg->beta_fast = b->value; break;
    case F_BSLOW: cfg->beta_slow = b->value; break;
    case F_MSCALE: cfg->mscale = b->value; break;
    case F_MSCALE_ALL: cfg->mscale_all_dim = b->value; break;
    case F_TRUNC: cfg->truncate = (int)b->value; break;
    case F_LOWF: cfg->low_freq_factor = b->value; break;
    case F_HIGHF: cfg->high_freq_factor = b->value; break;
    case F_SHORT_NULL: cfg->short_factor = NULL; break;
    case F_LONG_NULL: cfg->long_factor = NULL; break;
    case F_SHORT_AT:
        memcpy(bad_short, short_f, sizeof bad_short);
        bad_short[cfg->rot_dim / 2 - 1] = b->value;
        cfg->short_factor = bad_short;
        break;
    case F_LONG_AT:
        memcpy(bad_long, long_f, sizeof bad_long);
        bad_long[cfg->rot_dim / 2 - 1] = b->value;
        cfg->long_factor = bad_long;
        break;
    case F_TYPE: cfg->type = (fusedrope_rope_type)(int)b->value; break;
    case F_DEVICE: dev = (fusedrope_device)(int)b->value; break;
    case F_FREQ: cfg->freq_dim = (int)b->value; break;
    case F_PRF: cfg->partial_rotary_factor = b->value; break;
    }
    return dev;
}

START_TEST(test_bad_config)
{
    const bad_case *b = &bad_cases[_i];
    fusedrope_cache_config cfg;
    fusedrope_cache *c = (fusedrope_cache *)&cfg; /* must be reset to NULL */
    fusedrope_device dev;
    fusedrope_status st;
    good_config(&cfg, b->type);
    /* the unmodified configuration is fine */
    st = fusedrope_cache_create(&cfg, CPU, &c);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: baseline failed: %s (%s)", b->label, st_name(st),
                  fusedrope_last_error());
    fusedrope_cache_destroy(c);
    c = (fusedrope_cache *)&cfg;
    dev = apply_field(&cfg, b);
    st = fusedrope_cache_create(&cfg, dev, &c);
    ck_assert_msg(st == b->want, "%s: got %s, want %s (last_error: %s)", b->label, st_name(st),
                  st_name(b->want), fusedrope_last_error());
    ck_assert_msg(c == NULL, "%s: *out not set to NULL on failure", b->label);
    ck_assert_msg(fusedrope_last_error()[0] != 0, "%s: empty last_error", b->label);
    ck_assert_msg(tu_contains(fusedrope_last_error(), b->names),
                  "%s: last_error \"%s\" does not name %s", b->label, fusedrope_last_error(),
                  b->names);
}
END_TEST

/* Values that are valid: the border of each rule, and fields each type ignores. */
static const bad_case ok_cases[] = {
    {"llama3 low == high", L3, F_LOWF, 4, FUSEDROPE_OK, ""},
    {"rot_dim 2", D, F_ROT, 2, FUSEDROPE_OK, ""},
    {"rot_dim 8192", D, F_ROT, 8192, FUSEDROPE_OK, ""},
    {"dynamic rot_dim 4", DY, F_ROT, 4, FUSEDROPE_OK, ""},
    {"theta 1.0000001", D, F_THETA, 1.0000001, FUSEDROPE_OK, ""},
    {"default factor NaN (ignored)", D, F_FACTOR, NAN, FUSEDROPE_OK, ""},
    {"default factor -1 (ignored)", D, F_FACTOR, -1, FUSEDROPE_OK, ""},
    {"default attention_factor NaN (ignored)", D, F_ATTN, NAN, FUSEDROPE_OK, ""},
    {"linear attention_factor -1 (ignored)", LI, F_ATTN, -1, FUSEDROPE_OK, ""},
    {"dynamic attention_factor Inf (ignored)", DY, F_ATTN, INFINITY, FUSEDROPE_OK, ""},
    {"llama3 attention_factor NaN (ignored)", L3, F_ATTN, NAN, FUSEDROPE_OK, ""},
    {"default original 0", D, F_ORIG, 0, FUSEDROPE_OK, ""},
    {"linear original 0", LI, F_ORIG, 0, FUSEDROPE_OK, ""},
    {"longrope factor 0", LR, F_FACTOR, 0, FUSEDROPE_OK, ""},
    {"longrope factor 3", LR, F_FACTOR, 3, FUSEDROPE_OK, ""},
    {"yarn truncate 0", YA, F_TRUNC, 0, FUSEDROPE_OK, ""},
    {"yarn mscale 0", YA, F_MSCALE, 0, FUSEDROPE_OK, ""},
    {"yarn attention_factor 0", YA, F_ATTN, 0, FUSEDROPE_OK, ""},
    {"dynamic seq_len 0", DY, F_SEQ, 0, FUSEDROPE_OK, ""},
    {"dynamic factor 1e200 (scaled theta 1e233)", DY, F_FACTOR, 1e200, FUSEDROPE_OK, ""},
    {"max_positions 0", YA, F_MAXPOS, 0, FUSEDROPE_OK, ""},
    {"max_positions 1", L3, F_MAXPOS, 1, FUSEDROPE_OK, ""},
    {"llama3 low 3.9", L3, F_LOWF, 3.9, FUSEDROPE_OK, ""},
    {"device AUTO", D, F_DEVICE, FUSEDROPE_DEVICE_AUTO, FUSEDROPE_OK, ""},
    {"freq_dim 2", D, F_FREQ, 2, FUSEDROPE_OK, ""},
    {"freq_dim 16384", LI, F_FREQ, 16384, FUSEDROPE_OK, ""},
    {"dynamic freq_dim 4", DY, F_FREQ, 4, FUSEDROPE_OK, ""},
    {"proportional factor 1", PR, F_PRF, 1, FUSEDROPE_OK, ""},
    {"proportional factor 0 (1)", PR, F_PRF, 0, FUSEDROPE_OK, ""},
    {"proportional factor 0.01 (no pair rotates)", PR, F_PRF, 0.01, FUSEDROPE_OK, ""},
    {"default partial_rotary_factor 5 (ignored)", D, F_PRF, 5, FUSEDROPE_OK, ""},
};
#define NOK ((int)(sizeof ok_cases / sizeof ok_cases[0]))

START_TEST(test_ok_config)
{
    char before[512];
    const bad_case *b = &ok_cases[_i];
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    fusedrope_device dev;
    fusedrope_status st;
    good_config(&cfg, b->type);
    dev = apply_field(&cfg, b);
    snprintf(before, sizeof before, "%s", fusedrope_last_error());
    st = fusedrope_cache_create(&cfg, dev, &c);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: got %s (%s)", b->label, st_name(st),
                  fusedrope_last_error());
    ck_assert_ptr_nonnull(c);
    tu_track(c);
    ck_assert_str_eq(fusedrope_last_error(), before); /* successes leave it alone */
    ck_assert_int_eq(fusedrope_cache_rot_dim(c), cfg.rot_dim);
    ck_assert_int_eq(fusedrope_cache_max_positions(c), cfg.max_positions);
    /* the ignored attention factor really is ignored: row 0 is cos = 1 */
    if (b->field == F_ATTN && b->type != YA && cfg.max_positions > 0) {
        float *tc = tu_alloc(sizeof(float) * (size_t)(cfg.max_positions * cfg.rot_dim / 2));
        float *ts = tu_alloc(sizeof(float) * (size_t)(cfg.max_positions * cfg.rot_dim / 2));
        ck_assert_int_eq(fusedrope_cache_copy_table(c, tc, ts), FUSEDROPE_OK);
        ck_assert_msg(tc[0] == 1.0f, "%s: cos[0][0] = %g", b->label, tc[0]);
    }
    tu_free_all();
}
END_TEST

START_TEST(test_create_null_args)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = (fusedrope_cache *)&cfg;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 8, 8, 10000);
    ck_assert_int_eq(fusedrope_cache_create(NULL, CPU, &c), FUSEDROPE_ERR_INVALID);
    ck_assert_ptr_null(c);
    ck_assert_str_ne(fusedrope_last_error(), "");
    ck_assert_msg(tu_contains(fusedrope_last_error(), "config"), "last_error \"%s\"",
                  fusedrope_last_error());
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, NULL), FUSEDROPE_ERR_INVALID);
    ck_assert_str_ne(fusedrope_last_error(), "");
}
END_TEST

START_TEST(test_create_nomem)
{
    /* 2^40 rows x 4096 pairs x 4 bytes = 2^54 bytes per table: no overflow, no memory */
    fusedrope_cache_config cfg;
    fusedrope_cache *c = (fusedrope_cache *)&cfg;
    fusedrope_status st;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 8192, (int64_t)1 << 40, 10000);
    st = fusedrope_cache_create(&cfg, CPU, &c);
    ck_assert_msg(st == FUSEDROPE_ERR_NOMEM, "got %s (%s)", st_name(st), fusedrope_last_error());
    ck_assert_ptr_null(c);
    ck_assert_str_ne(fusedrope_last_error(), "");
}
END_TEST

/* The table's size in bytes is max_positions x rot_dim/2 x 8 (cos and sin,
 * fusedrope_cache_create(3)): rot_dim 2 at 2^61 and 2^62 - 1 rows is 2^64
 * bytes or more, an overflow (RANGE), where one array's 2^63 bytes would
 * not overflow (these once got NOMEM from the allocation). */
START_TEST(test_create_table_bytes_overflow)
{
    static const int64_t rows[2] = { (int64_t)1 << 61, ((int64_t)1 << 62) - 1 };
    for (int i = 0; i < 2; i++) {
        fusedrope_cache_config cfg;
        fusedrope_cache *c = (fusedrope_cache *)&cfg;
        fusedrope_status st;
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 2, rows[i], 10000);
        st = fusedrope_cache_create(&cfg, CPU, &c);
        ck_assert_msg(st == FUSEDROPE_ERR_RANGE && strstr(fusedrope_last_error(), "overflows"),
                      "rot_dim 2, %lld rows: got %s (%s)", (long long)rows[i], st_name(st),
                      fusedrope_last_error());
        ck_assert_ptr_null(c);
    }
    /* from a table, the message names that call's argument, positions */
    {
        static const float one[1] = { 1.0f };
        fusedrope_cache *c = (fusedrope_cache *)one;
        fusedrope_status st =
            fusedrope_cache_create_from_table(one, one, INT64_MAX, 2, CPU, &c);
        ck_assert_msg(st == FUSEDROPE_ERR_RANGE
                          && strncmp(fusedrope_last_error(), "positions ", 10) == 0
                          && strstr(fusedrope_last_error(), "overflows"),
                      "from_table, INT64_MAX rows: got %s (%s)", st_name(st),
                      fusedrope_last_error());
        ck_assert_ptr_null(c);
    }
}
END_TEST

/* -------------------------------------------- the reference's own dtype code */

static double f32_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

START_TEST(test_ref_dtypes)
{
    unsigned h;
    int bad = 0;
    /* every 16-bit pattern survives decode -> encode (NaNs stay NaN) */
    for (h = 0; h < 65536; h++) {
        double v = ref_half_to_double((uint16_t)h), w = ref_bf16_to_double((uint16_t)h);
        if (isnan(v) ? !isnan(ref_half_to_double(ref_double_to_half(v)))
                     : ref_double_to_half(v) != h)
            bad++;
        if (isnan(w) ? !isnan(ref_bf16_to_double(ref_double_to_bf16(w)))
                     : ref_double_to_bf16(w) != h)
            bad++;
        /* bf16 is the top half of a float */
        if (!isnan(w) && w != f32_bits((uint32_t)h << 16))
            bad++;
    }
    ck_assert_int_eq(bad, 0);
#ifdef __FLT16_MAX__
    /* cross-check fp16 rounding with the compiler's _Float16 where it has one */
    {
        tu_rng r;
        int k;
        tu_rng_init(&r, 7);
        for (k = 0; k < 200000; k++) {
            float v = (float)ldexp(tu_uniform(&r, -1, 1), (int)tu_int(&r, -30, 17));
            _Float16 f = (_Float16)v;
            uint16_t bits;
            memcpy(&bits, &f, 2);
            if (ref_double_to_half(v) != bits)
                bad++;
        }
        ck_assert_int_eq(bad, 0);
    }
#endif
    /* bf16 rounding against integer round-to-nearest-even on the float's bits */
    {
        tu_rng r;
        int k;
        tu_rng_init(&r, 8);
        for (k = 0; k < 200000; k++) {
            float v = (float)ldexp(tu_uniform(&r, -1, 1), (int)tu_int(&r, -140, 120));
            uint32_t u;
            memcpy(&u, &v, 4);
            u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            if (ref_double_to_bf16(v) != (uint16_t)u)
                bad++;
        }
        ck_assert_int_eq(bad, 0);
    }
    /* ties to even, overflow, subnormals */
    ck_assert(ref_round(1 + 0x1p-11, FUSEDROPE_FLOAT16) == 1.0);
    ck_assert(ref_round(1 + 3 * 0x1p-11, FUSEDROPE_FLOAT16) == 1 + 0x1p-9);
    ck_assert(ref_round(1 + 0x1p-8, FUSEDROPE_BFLOAT16) == 1.0);
    ck_assert(ref_round(1 + 3 * 0x1p-8, FUSEDROPE_BFLOAT16) == 1 + 0x1p-6);
    ck_assert(ref_round(65520, FUSEDROPE_FLOAT16) == INFINITY);
    ck_assert(ref_round(65519.99, FUSEDROPE_FLOAT16) == 65504);
    ck_assert(ref_round(0x1p-25, FUSEDROPE_FLOAT16) == 0);
    ck_assert(ref_round(0x1.8p-25, FUSEDROPE_FLOAT16) == 0x1p-24);
    ck_assert(ref_round(0.1, FUSEDROPE_FLOAT32) == (double)0.1f);
    ck_assert(ref_ulp(1.0, FUSEDROPE_FLOAT32) == 0x1p-23);
    ck_assert(ref_ulp(1.0, FUSEDROPE_FLOAT16) == 0x1p-10);
    ck_assert(ref_ulp(1.0, FUSEDROPE_BFLOAT16) == 0x1p-7);
    ck_assert(ref_ulp(0.75, FUSEDROPE_FLOAT16) == 0x1p-11);
    ck_assert(ref_ulp(0, FUSEDROPE_FLOAT16) == 0x1p-24);
    ck_assert(ref_ulp(1e-6, FUSEDROPE_FLOAT16) == 0x1p-24);
    ck_assert(ref_ulp(0, FUSEDROPE_BFLOAT16) == 0x1p-133);
    ck_assert(ref_ulp(0, FUSEDROPE_FLOAT32) == 0x1p-149);
    ck_assert(ref_ulp(-3.0, FUSEDROPE_FLOAT32) == 0x1p-22);
    ck_assert(ref_double_to_half(1.0) == 0x3c00 && ref_double_to_half(-2.0) == 0xc000);
    ck_assert(ref_double_to_bf16(1.0) == 0x3f80 && ref_double_to_bf16(-2.0) == 0xc000);
    ck_assert(ref_double_to_half(0x1p-24) == 0x0001 && ref_double_to_half(65504) == 0x7bff);
    ck_assert(ref_half_to_double(0x0400) == 0x1p-14 && ref_bf16_to_double(0x0080) == 0x1p-126);
    /* the bound: within 1 ulp plus the float32 term */
    ck_assert(ref_within(1.0 + 0x1p-10, 1.0, 0.5, 0.5, 1, FUSEDROPE_FLOAT16, NULL));
    ck_assert(!ref_within(1.0 + 0x1p-9, 1.0, 0.5, 0.5, 1, FUSEDROPE_FLOAT16, NULL));
    ck_assert(!ref_within(NAN, 1.0, 0.5, 0.5, 1, FUSEDROPE_FLOAT32, NULL));
}
END_TEST

START_TEST(test_ref_positions)
{
    /* CP: the ranks' local positions together cover 0..global-1 once each */
    int cp, r;
    for (cp = 1; cp <= 8; cp *= 2) {
        int64_t global = 8 * cp, len = global / cp, j;
        unsigned char seen[64] = {0};
        for (r = 0; r < cp; r++)
            for (j = 0; j < len; j++) {
                int64_t p = ref_cp_position(j, len, cp, r);
                ck_assert(p >= 0 && p < global);
                seen[p]++;
            }
        for (j = 0; j < global; j++)
            ck_assert_int_eq(seen[j], 1);
    }
    /* the example of the contract: rank 1 of 2, local length 8 -> 2 3 4 5? no: */
    /* chunk = 4; rank 1 holds chunks 1 and 2: 4..7 and 8..11 */
    ck_assert_int_eq(ref_cp_position(0, 8, 2, 1), 4);
    ck_assert_int_eq(ref_cp_position(3, 8, 2, 1), 7);
    ck_assert_int_eq(ref_cp_position(4, 8, 2, 1), 8);
    ck_assert_int_eq(ref_cp_position(4, 8, 2, 0), 12);
    ck_assert_int_eq(ref_cp_position(7, 8, 2, 0), 15);
}
END_TEST

static Suite *cache_suite(void)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("common");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_version);
    tcase_add_test(tc, test_status_strings);
    tcase_add_test(tc, test_last_error_initially_empty);
    tcase_add_test(tc, test_last_error_kept_on_success);
    tcase_add_test(tc, test_cuda_available_and_auto);
    tcase_add_test(tc, test_ref_dtypes);
    tcase_add_test(tc, test_ref_positions);
    suite_add_tcase(s, tc);

    tc = tcase_create("config");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_config_init_defaults, 0, FUSEDROPE_ROPE_PROPORTIONAL + 1);
    tcase_add_loop_test(tc, test_bad_config, 0, NBAD);
    tcase_add_loop_test(tc, test_ok_config, 0, NOK);
    tcase_add_test(tc, test_create_null_args);
    tcase_add_test(tc, test_create_nomem);
    tcase_add_test(tc, test_create_table_bytes_overflow);
    suite_add_tcase(s, tc);

    tc = tcase_create("tables");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_table_types, 0, NTCASES);
    tcase_add_test(tc, test_yarn_attention_factors);
    tcase_add_test(tc, test_yarn_range);
    tcase_add_loop_test(tc, test_longrope, 0, 7);
    tcase_add_test(tc, test_llama3_ramps);
    tcase_add_test(tc, test_dynamic_equals_default_below_original);
    tcase_add_loop_test(tc, test_from_table_round_trip, 0, 4);
    tcase_add_loop_test(tc, test_from_table_errors, 0, 11);
    tcase_add_loop_test(tc, test_tableless, 0, 6);
    tcase_add_test(tc, test_getters_null);
    tcase_add_test(tc, test_copy_table_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_main(cache_suite(), "test_cache");
}
