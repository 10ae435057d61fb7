/*
 * test_abi.c - what a program built against one header meets in another
 * build of the library: the version (configure, header and run time agree),
 * fixed enum values, and the growing structs (fusedrope_cache_config,
 * fusedrope_positions) read exactly struct_size bytes: each struct here
 * ends at a page the process may not touch, so a read or write past it
 * kills the (forked) test.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util.h"

/* ------------------------------------------------------------------ version */

START_TEST(test_version_one_source)
{
    char header[64];
    int maj = -1, min = -1, pat = -1;

    /* configure's version (AC_INIT, through config.h) */
    ck_assert_int_eq(sscanf(PACKAGE_VERSION, "%d.%d.%d", &maj, &min, &pat), 3);
    /* the header's macros, generated from it */
    ck_assert_int_eq(FUSEDROPE_VERSION_MAJOR, maj);
    ck_assert_int_eq(FUSEDROPE_VERSION_MINOR, min);
    ck_assert_int_eq(FUSEDROPE_VERSION_PATCH, pat);
    ck_assert_int_eq(FUSEDROPE_VERSION_NUMBER, maj * 10000 + min * 100 + pat);
    snprintf(header, sizeof header, "%d.%d.%d", FUSEDROPE_VERSION_MAJOR,
             FUSEDROPE_VERSION_MINOR, FUSEDROPE_VERSION_PATCH);
    /* the library at run time */
    ck_assert_str_eq(fusedrope_version(), PACKAGE_VERSION);
    ck_assert_str_eq(fusedrope_version(), header);
    ck_assert_int_eq(fusedrope_version_number(), maj * 10000 + min * 100 + pat);
}
END_TEST

/* The numbers are the ABI: a binding or an older program passes them as ints. */
START_TEST(test_enum_values)
{
    ck_assert_int_eq(FUSEDROPE_OK, 0);
    ck_assert_int_eq(FUSEDROPE_ERR_INVALID, 1);
    ck_assert_int_eq(FUSEDROPE_ERR_RANGE, 2);
    ck_assert_int_eq(FUSEDROPE_ERR_NOMEM, 3);
    ck_assert_int_eq(FUSEDROPE_ERR_UNSUPPORTED, 4);
    ck_assert_int_eq(FUSEDROPE_ERR_CUDA, 5);
    ck_assert_int_eq(FUSEDROPE_FLOAT32, 0);
    ck_assert_int_eq(FUSEDROPE_FLOAT16, 1);
    ck_assert_int_eq(FUSEDROPE_BFLOAT16, 2);
    ck_assert_int_eq(FUSEDROPE_DEVICE_AUTO, 0);
    ck_assert_int_eq(FUSEDROPE_DEVICE_CPU, 1);
    ck_assert_int_eq(FUSEDROPE_DEVICE_CUDA, 2);
    ck_assert_int_eq(FUSEDROPE_NEOX, 0);
    ck_assert_int_eq(FUSEDROPE_INTERLEAVED, 1);
    ck_assert_int_eq(FUSEDROPE_ROPE_DEFAULT, 0);
    ck_assert_int_eq(FUSEDROPE_ROPE_LINEAR, 1);
    ck_assert_int_eq(FUSEDROPE_ROPE_DYNAMIC, 2);
    ck_assert_int_eq(FUSEDROPE_ROPE_YARN, 3);
    ck_assert_int_eq(FUSEDROPE_ROPE_LONGROPE, 4);
    ck_assert_int_eq(FUSEDROPE_ROPE_LLAMA3, 5);
    ck_assert_int_eq(FUSEDROPE_ROPE_PROPORTIONAL, 6);
    ck_assert_int_eq(FUSEDROPE_LAYOUT_SBHD, 0);
    ck_assert_int_eq(FUSEDROPE_LAYOUT_BSHD, 1);
    ck_assert_int_eq(FUSEDROPE_LAYOUT_THD, 2);
    ck_assert_int_eq(FUSEDROPE_AXES_NONE, 0);
    ck_assert_int_eq(FUSEDROPE_AXES_SECTIONS, 1);
    ck_assert_int_eq(FUSEDROPE_AXES_INTERLEAVED, 2);
    ck_assert_int_eq(FUSEDROPE_AXES_ALTERNATING, 3);
    ck_assert_int_eq(FUSEDROPE_AXES_VISION_2D, 4);
    ck_assert_int_eq(FUSEDROPE_AXES_CUSTOM, 5);
    ck_assert_int_eq(FUSEDROPE_NORM_WEIGHT_NONE, 0);
    ck_assert_int_eq(FUSEDROPE_NORM_WEIGHT, 1);
    ck_assert_int_eq(FUSEDROPE_NORM_WEIGHT_PLUS_ONE, 2);
    ck_assert_int_eq(FUSEDROPE_NORM_ROUND_ONCE, 0);
    ck_assert_int_eq(FUSEDROPE_NORM_ROUND_LLAMA, 1);
    ck_assert_int_eq(FUSEDROPE_NORM_ROUND_GEMMA, 2);
    /* limits a caller sizes its arrays by */
    ck_assert_int_eq(FUSEDROPE_MAX_ROT_DIM, 8192);
    ck_assert_int_eq(FUSEDROPE_MAX_AXES, 4);
    ck_assert_int_eq(FUSEDROPE_NORM_DW_CHUNK, 32);
}
END_TEST

/* -------------------------------------------------------- guarded structs */

/* The published layouts, written from the header as a caller of each
 * version would have compiled it (the first member to the last one of that
 * version, padded to the struct's alignment). */
#define LAYOUT(type, last) \
    ((offsetof(type, last) + sizeof(((type *)0)->last) + _Alignof(type) - 1) / \
     _Alignof(type) * _Alignof(type))
static const size_t positions_v0_1 = LAYOUT(fusedrope_positions, cp_rank);
static const size_t config_v0_1 = LAYOUT(fusedrope_cache_config, long_factor);

static long page;

/* `size` bytes that end where a PROT_NONE page begins. */
static void *guarded(size_t size)
{
    unsigned char *p;
    page = sysconf(_SC_PAGESIZE);
    p = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(p != MAP_FAILED);
    ck_assert_int_eq(mprotect(p + page, (size_t)page, PROT_NONE), 0);
    return p + page - size;
}

static void unguard(void *q)
{
    unsigned char *p = (unsigned char *)((uintptr_t)q & ~(uintptr_t)(page - 1));
    munmap(p, (size_t)page * 2);
}

/* What an *_init_sized of a struct of `size` bytes, `known` of them this
 * library's, leaves: struct_size (the first member) `size`, the tail zero. */
static void assert_sized_init(const unsigned char *raw, size_t known, size_t size)
{
    size_t struct_size;
    memcpy(&struct_size, raw, sizeof struct_size);
    ck_assert_uint_eq(struct_size, size);
    for (size_t i = known; i < size; i++)
        ck_assert_int_eq(raw[i], 0);
}

/* A small CPU forward with offsets {3, 7}: y for the given positions struct. */
typedef struct {
    fusedrope_cache *cache;
    float x[2 * 2 * 1 * 8], y[2 * 2 * 1 * 8];
    int64_t offsets[2];
    fusedrope_tensor tx, ty;
} small_call;

static void small_init(small_call *c)
{
    fusedrope_cache_config cfg;
    tu_rng r;
    tu_rng_init(&r, 1);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 8, 64, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c->cache), FUSEDROPE_OK);
    for (int i = 0; i < 32; i++)
        c->x[i] = (float)tu_uniform(&r, -1, 1);
    c->offsets[0] = 3;
    c->offsets[1] = 7;
    c->tx = fusedrope_tensor_sbhd(c->x, FUSEDROPE_FLOAT32, 2, 2, 1, 8);
    c->ty = fusedrope_tensor_sbhd(c->y, FUSEDROPE_FLOAT32, 2, 2, 1, 8);
}

static fusedrope_status small_run(small_call *c, const fusedrope_positions *pos)
{
    memset(c->y, 0xff, sizeof c->y);
    return fusedrope_forward(c->cache, FUSEDROPE_NEOX, pos, &c->tx, &c->ty, NULL);
}

/* Token (s, b) of sbhd [2][2][1][8] at position s + offsets[b], against the
 * float64 reference of the default rope type (theta 10000, rot_dim 8). */
static void small_check(const small_call *c)
{
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < 2; b++) {
            const float *x = c->x + (s * 2 + b) * 8, *y = c->y + (s * 2 + b) * 8;
            double p = (double)(s + c->offsets[b]);
            for (int i = 0; i < 4; i++) {
                double ang = p * pow(10000.0, -2.0 * i / 8.0), cs = cos(ang), sn = sin(ang);
                double a = x[i], bb = x[i + 4];
                double ra = a * cs - bb * sn, rb = bb * cs + a * sn;
                ck_assert_double_eq_tol(y[i], ra, 1e-6);
                ck_assert_double_eq_tol(y[i + 4], rb, 1e-6);
            }
        }
}

START_TEST(test_positions_published_layout)
{
    small_call c;
    fusedrope_positions *p = guarded(positions_v0_1);
    small_init(&c);
    memset(p, 0xa5, positions_v0_1);
    fusedrope_positions_init_sized(p, positions_v0_1);
    ck_assert_uint_eq(p->struct_size, positions_v0_1);
    ck_assert_ptr_null(p->ids);
    ck_assert_int_eq(p->cp_size, 0);
    p->offsets = c.offsets;
    ck_assert_int_eq(small_run(&c, p), FUSEDROPE_OK);
    small_check(&c);
    unguard(p);
    fusedrope_cache_destroy(c.cache);
}
END_TEST

START_TEST(test_positions_refused_sizes)
{
    small_call c;
    size_t bad[] = { 0, sizeof(size_t), positions_v0_1 - 8, positions_v0_1 - 1 };
    small_init(&c);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        size_t n = bad[k] < sizeof(size_t) ? sizeof(size_t) : bad[k];
        fusedrope_positions *p = guarded(n);
        memset(p, 0, n);
        memcpy(p, &bad[k], sizeof bad[k]);
        ck_assert_int_eq(small_run(&c, p), FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(), "pos->struct_size is") != NULL, "%s",
                      fusedrope_last_error());
        if (bad[k] == 0) /* the sentence for a struct never initialised */
            ck_assert_msg(strstr(fusedrope_last_error(), "pos->struct_size is 0: initialise") !=
                              NULL,
                          "%s", fusedrope_last_error());
        for (size_t i = 0; i < 32; i++) /* nothing written */
            ck_assert_msg(c.y[i] != c.y[i], "y[%zu] written on a refused call", i);
        unguard(p);
    }
    fusedrope_cache_destroy(c.cache);
}
END_TEST

/* A program built against a newer header, with this (older) library. */
START_TEST(test_positions_newer_header)
{
    small_call c;
    size_t n = sizeof(fusedrope_positions) + 24;
    unsigned char *raw = guarded(n);
    fusedrope_positions *p = (fusedrope_positions *)raw;
    small_init(&c);
    memset(raw, 0x5a, n);
    fusedrope_positions_init_sized(p, n);
    assert_sized_init(raw, sizeof *p, n);
    p->offsets = c.offsets;
    ck_assert_int_eq(small_run(&c, p), FUSEDROPE_OK); /* unknown fields zero: fine */
    small_check(&c);
    raw[sizeof *p + 5] = 1; /* a field this library does not have is set */
    ck_assert_int_eq(small_run(&c, p), FUSEDROPE_ERR_INVALID);
    ck_assert_msg(strstr(fusedrope_last_error(), "does not have") != NULL, "%s",
                  fusedrope_last_error());
    {
        char byte[64]; /* the sentence names the byte that is set */
        snprintf(byte, sizeof byte, "and byte %zu past it is set", sizeof *p + 5);
        ck_assert_msg(strstr(fusedrope_last_error(), byte) != NULL, "%s", fusedrope_last_error());
    }
    unguard(p);
    fusedrope_cache_destroy(c.cache);
}
END_TEST

/* init_sized writes exactly the caller's bytes, whatever their number, and
 * struct_size is n wherever it fits (a size field alone, n = 8, too). */
static void assert_struct_size(const unsigned char *p, size_t n)
{
    size_t got;
    if (n < sizeof got)
        return;
    memcpy(&got, p, sizeof got);
    ck_assert_uint_eq(got, n);
}

START_TEST(test_init_sized_stays_inside)
{
    for (size_t n = 0; n <= sizeof(fusedrope_cache_config) + 16; n++) {
        unsigned char *p = guarded(n ? n : 1);
        fusedrope_cache_config_init_sized((fusedrope_cache_config *)(void *)p, n,
                                          FUSEDROPE_ROPE_YARN, 64, 0, 10000.0);
        assert_struct_size(p, n);
        unguard(p);
        p = guarded(n ? n : 1);
        fusedrope_positions_init_sized((fusedrope_positions *)(void *)p, n);
        assert_struct_size(p, n);
        unguard(p);
        p = guarded(n ? n : 1);
        fusedrope_norm_init_sized((fusedrope_norm *)(void *)p, n);
        assert_struct_size(p, n);
        unguard(p);
    }
    fusedrope_cache_config_init_sized(NULL, sizeof(fusedrope_cache_config), FUSEDROPE_ROPE_DEFAULT,
                                      8, 0, 10000.0);
    fusedrope_positions_init_sized(NULL, sizeof(fusedrope_positions));
    fusedrope_norm_init_sized(NULL, sizeof(fusedrope_norm));
}
END_TEST

/* fusedrope_norm_init's defaults, as its page and the header state them,
 * over a struct full of garbage; a size of part of the struct fills that
 * part only. */
START_TEST(test_norm_init_defaults)
{
    fusedrope_norm nm;
    unsigned char raw[sizeof(fusedrope_norm)];
    memset(&nm, 0xab, sizeof nm);
    fusedrope_norm_init(&nm);
    ck_assert_uint_eq(nm.struct_size, sizeof nm);
    ck_assert_int_eq(nm.weight, FUSEDROPE_NORM_WEIGHT_NONE);
    ck_assert_int_eq(nm.rounding, FUSEDROPE_NORM_ROUND_ONCE);
    ck_assert(nm.eps == 1e-6);
    ck_assert_int_eq(nm.weight_dtype, FUSEDROPE_FLOAT32);
    ck_assert_ptr_null(nm.q_weight);
    ck_assert_ptr_null(nm.k_weight);
    ck_assert_ptr_null(nm.q_rstd);
    ck_assert_ptr_null(nm.k_rstd);
    ck_assert_ptr_null(nm.dq_weight);
    ck_assert_ptr_null(nm.dk_weight);
    ck_assert_int_eq(nm.saved_output, 0);
    memset(raw, 0xab, sizeof raw);
    fusedrope_norm_init_sized((fusedrope_norm *)(void *)raw, offsetof(fusedrope_norm, eps));
    for (size_t i = offsetof(fusedrope_norm, eps); i < sizeof raw; i++)
        ck_assert_msg(raw[i] == 0xab, "byte %zu past the size written", i);
}
END_TEST

START_TEST(test_config_layouts)
{
    fusedrope_cache *cache = NULL;
    fusedrope_cache_config *cfg = guarded(config_v0_1), full;
    float cs[4 * 16], sn[4 * 16], cs2[4 * 16], sn2[4 * 16];

    memset(cfg, 0xa5, config_v0_1);
    fusedrope_cache_config_init_sized(cfg, config_v0_1, FUSEDROPE_ROPE_YARN, 8, 16, 10000.0);
    ck_assert_uint_eq(cfg->struct_size, config_v0_1);
    ck_assert_double_eq(cfg->beta_fast, 32.0);
    cfg->factor = 4.0;
    cfg->original_max_positions = 8;
    ck_assert_int_eq(fusedrope_cache_create(cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    ck_assert_int_eq(fusedrope_cache_copy_table(cache, cs, sn), FUSEDROPE_OK);
    fusedrope_cache_destroy(cache);

    /* the same settings through this header's inline init give the same table */
    fusedrope_cache_config_init(&full, FUSEDROPE_ROPE_YARN, 8, 16, 10000.0);
    full.factor = 4.0;
    full.original_max_positions = 8;
    ck_assert_int_eq(fusedrope_cache_create(&full, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    ck_assert_int_eq(fusedrope_cache_copy_table(cache, cs2, sn2), FUSEDROPE_OK);
    fusedrope_cache_destroy(cache);
    ck_assert_int_eq(memcmp(cs, cs2, sizeof cs), 0);
    ck_assert_int_eq(memcmp(sn, sn2, sizeof sn), 0);

    /* an uninitialised config (memset 0) and a size of no layout are refused */
    cfg->struct_size = 0;
    ck_assert_int_eq(fusedrope_cache_create(cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_ERR_INVALID);
    ck_assert_ptr_null(cache);
    ck_assert_msg(strstr(fusedrope_last_error(), "config->struct_size is 0: initialise") != NULL,
                  "%s", fusedrope_last_error());
    cfg->struct_size = config_v0_1 - 8;
    ck_assert_int_eq(fusedrope_cache_create(cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_ERR_INVALID);
    unguard(cfg);
}
END_TEST

/* A program built against a newer header, with this (older) library: a
 * config and a norm struct larger than this library's, their unknown tail
 * zero (accepted, the same results) or not (refused, naming the struct). */
START_TEST(test_config_and_norm_newer_header)
{
    const size_t nc = sizeof(fusedrope_cache_config) + 24, nn = sizeof(fusedrope_norm) + 24;
    unsigned char *rc = guarded(nc), *rn = guarded(nn);
    fusedrope_cache_config *cfg = (fusedrope_cache_config *)(void *)rc;
    fusedrope_norm *nm = (fusedrope_norm *)(void *)rn;
    fusedrope_cache *cache = (fusedrope_cache *)(uintptr_t)1, *ref_cache;
    float cs[16 * 4], sn[16 * 4], cs2[16 * 4], sn2[16 * 4], x[3 * 8], y[3 * 8], y2[3 * 8],
        rstd[3];
    fusedrope_tensor tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, 3, 1, 1, 8);
    fusedrope_tensor ty = fusedrope_tensor_sbhd(y, FUSEDROPE_FLOAT32, 3, 1, 1, 8);
    fusedrope_tensor ty2 = fusedrope_tensor_sbhd(y2, FUSEDROPE_FLOAT32, 3, 1, 1, 8);
    fusedrope_norm plain;

    memset(rc, 0x5a, nc);
    fusedrope_cache_config_init_sized(cfg, nc, FUSEDROPE_ROPE_DEFAULT, 8, 16, 10000.0);
    assert_sized_init(rc, sizeof *cfg, nc);
    ck_assert_int_eq(fusedrope_cache_create(cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    ck_assert_int_eq(fusedrope_cache_copy_table(cache, cs, sn), FUSEDROPE_OK);
    rc[sizeof *cfg + 3] = 1;
    ck_assert_int_eq(fusedrope_cache_create(cfg, FUSEDROPE_DEVICE_CPU, &ref_cache),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_ptr_null(ref_cache);
    ck_assert_msg(strstr(fusedrope_last_error(), "does not have") != NULL, "%s",
                  fusedrope_last_error());
    {
        fusedrope_cache_config full;
        fusedrope_cache_config_init(&full, FUSEDROPE_ROPE_DEFAULT, 8, 16, 10000.0);
        ck_assert_int_eq(fusedrope_cache_create(&full, FUSEDROPE_DEVICE_CPU, &ref_cache),
                         FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_cache_copy_table(ref_cache, cs2, sn2), FUSEDROPE_OK);
        fusedrope_cache_destroy(ref_cache);
        ck_assert_int_eq(memcmp(cs, cs2, sizeof cs), 0);
        ck_assert_int_eq(memcmp(sn, sn2, sizeof sn), 0);
    }

    for (int i = 0; i < 3 * 8; i++)
        x[i] = (float)(i % 7) - 2.5f;
    fusedrope_norm_init(&plain);
    memset(rn, 0x5a, nn);
    fusedrope_norm_init_sized(nm, nn);
    assert_sized_init(rn, sizeof *nm, nn);
    nm->q_rstd = rstd;
    ck_assert_int_eq(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, nm, &tx, &ty, NULL,
                                               NULL, NULL),
                     FUSEDROPE_OK);
    ck_assert_int_eq(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &plain, &tx, &ty2,
                                               NULL, NULL, NULL),
                     FUSEDROPE_OK);
    ck_assert_int_eq(memcmp(y, y2, sizeof y), 0);
    rn[sizeof *nm + 7] = 1;
    memset(y, 0xff, sizeof y);
    ck_assert_int_eq(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, nm, &tx, &ty, NULL,
                                               NULL, NULL),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_msg(strstr(fusedrope_last_error(), "does not have") != NULL, "%s",
                  fusedrope_last_error());
    for (int i = 0; i < 3 * 8; i++) /* nothing written */
        ck_assert_msg(y[i] != y[i], "y[%d] written on a refused call", i);
    fusedrope_cache_destroy(cache);
    unguard(rc);
    unguard(rn);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("abi");
    TCase *tc = tcase_create("abi");
    tcase_add_test(tc, test_version_one_source);
    tcase_add_test(tc, test_enum_values);
    tcase_add_test(tc, test_positions_published_layout);
    tcase_add_test(tc, test_positions_refused_sizes);
    tcase_add_test(tc, test_positions_newer_header);
    tcase_add_test(tc, test_init_sized_stays_inside);
    tcase_add_test(tc, test_norm_init_defaults);
    tcase_add_test(tc, test_config_layouts);
    tcase_add_test(tc, test_config_and_norm_newer_header);
    suite_add_tcase(s, tc);
    return tu_main(s, "abi");
}
