/*
 * test_regress.c - regression tests for the library defects that the fuzz
 * harness (tests/fuzz/fuzz_apply.c, FUSEDROPE_FUZZ_STRICT=1) and the
 * hardening review found.  Each test is the smallest call that shows one
 * defect; it fails until the defect is fixed.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <check.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedrope.h"

static fusedrope_cache *make_default(int rot_dim, int64_t max_positions)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, rot_dim, max_positions, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c), FUSEDROPE_OK);
    return c;
}

static void fill_floats(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(i % 13) * 0.25f - 1.5f;
}

/*
 * lib/rope_math.h fr_cp_position: (2 * cp_size - 1 - cp_rank) is computed in
 * int, which overflows (undefined behaviour) for cp_size >= 2^30.  With
 * cp_size = INT_MAX, rank 0 and a local length of 2, the second token's
 * position is (2 * INT_MAX - 1) * 1 = 4294967293, valid for a table-less
 * cache; the call must give the bytes of the same call with that position
 * as an id.  Today: -fsanitize=undefined reports the overflow; without it
 * the wrapped int gives position -3 and the call fails with RANGE.
 */
START_TEST(cp_size_above_2_30)
{
    static const int sizes[][2] = { { INT_MAX, 0 }, { INT_MAX, INT_MAX - 1 }, { 1 << 30, 5 } };
    fusedrope_cache *c = make_default(4, 0);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int cp = sizes[k][0], r = sizes[k][1];
        float x[2 * 4], y1[2 * 4], y2[2 * 4];
        int64_t ids[2];
        fusedrope_tensor tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, 2, 1, 1, 4);
        fusedrope_tensor t1 = fusedrope_tensor_sbhd(y1, FUSEDROPE_FLOAT32, 2, 1, 1, 4);
        fusedrope_tensor t2 = fusedrope_tensor_sbhd(y2, FUSEDROPE_FLOAT32, 2, 1, 1, 4);
        fusedrope_positions pcp = {
            .struct_size = sizeof(fusedrope_positions), .cp_size = cp, .cp_rank = r };
        fusedrope_positions pid = { .struct_size = sizeof(fusedrope_positions), .ids = ids };
        fusedrope_status st;
        ids[0] = (int64_t)r;                          /* chunk 1: r * 1 + 0 */
        ids[1] = 2 * (int64_t)cp - 1 - (int64_t)r;    /* (2 cp - 1 - r) * 1 + 0 */
        fill_floats(x, 8);
        memset(y1, 0, sizeof y1);
        memset(y2, 0, sizeof y2);
        ck_assert_int_eq(fusedrope_forward(c, FUSEDROPE_NEOX, &pid, &tx, &t2, NULL), FUSEDROPE_OK);
        st = fusedrope_forward(c, FUSEDROPE_NEOX, &pcp, &tx, &t1, NULL);
        ck_assert_msg(st == FUSEDROPE_OK, "cp_size %d, cp_rank %d: status %d (%s): %s", cp, r, st,
                      fusedrope_status_string(st), fusedrope_last_error());
        ck_assert_msg(memcmp(y1, y2, sizeof y1) == 0,
                      "cp_size %d, cp_rank %d: output differs from ids {%lld, %lld}", cp, r,
                      (long long)ids[0], (long long)ids[1]);
    }
    fusedrope_cache_destroy(c);
}
END_TEST

/*
 * lib/cache.c fusedrope_cache_create / compute_frequencies: configs that
 * pass every check of the decisions yield a non-finite attention factor or
 * inverse frequency, so the cache silently holds Inf/NaN and every output
 * is garbage.  The realistic one: longrope with original_max_positions 1
 * (ln 1 = 0 in sqrt(1 + ln s / ln original); Hugging Face raises
 * ZeroDivisionError there).  The others: a denormal factor (linear, yarn,
 * llama3: base^-e / factor = Inf), an attention factor past FLT_MAX.
 * Expected: create refuses (a non-OK status) or the table is finite.
 *
 * The refusal must also not touch the freed cache: the first fix read
 * c->attention_factor for its message after fusedrope_cache_destroy(c)
 * (lib/cache.c fusedrope_cache_create, heap-use-after-free; this test shows
 * it under ASan and valgrind, tests/fuzz/fuzz_replay too).
 */
START_TEST(accepted_config_gives_finite_table)
{
    static double ones[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    struct { const char *name; fusedrope_rope_type type; double factor, attn; int64_t orig; } k[] = {
        { "longrope, original_max_positions 1, factor 2", FUSEDROPE_ROPE_LONGROPE, 2, 0, 1 },
        { "longrope, original_max_positions 1, factor 0 (s = 64)", FUSEDROPE_ROPE_LONGROPE, 0, 0, 1 },
        { "linear, factor 5e-324", FUSEDROPE_ROPE_LINEAR, 5e-324, 0, 0 },
        { "linear, factor 1.76e-307 (p * inv_freq = Inf)", FUSEDROPE_ROPE_LINEAR, 1.76e-307, 0, 0 },
        { "yarn, factor 6.5e-315", FUSEDROPE_ROPE_YARN, 6.5e-315, 0, 64 },
        { "llama3, factor 5e-324", FUSEDROPE_ROPE_LLAMA3, 5e-324, 0, 64 },
        { "yarn, attention_factor 1e300", FUSEDROPE_ROPE_YARN, 4, 1e300, 64 },
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        for (int tableless = 0; tableless < 2; tableless++) {
            fusedrope_cache_config cfg;
            fusedrope_cache *c = NULL;
            fusedrope_status st;
            fusedrope_cache_config_init(&cfg, k[i].type, 8, tableless ? 0 : 64, 10000.0);
            cfg.factor = k[i].factor;
            cfg.attention_factor = k[i].attn;
            cfg.original_max_positions = k[i].orig;
            cfg.short_factor = cfg.long_factor = ones;
            st = fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c);
            if (st != FUSEDROPE_OK) {
                ck_assert_ptr_null(c);
                ck_assert_msg(fusedrope_last_error()[0], "%s: refused with no detail", k[i].name);
                continue;
            }
            {
                /* positions 0..63 through a forward of ones: every output finite */
                enum { S = 64, D = 8 };
                float x[S * D], y[S * D];
                fusedrope_tensor tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, S, 1, 1, D);
                fusedrope_tensor ty = fusedrope_tensor_sbhd(y, FUSEDROPE_FLOAT32, S, 1, 1, D);
                for (int j = 0; j < S * D; j++)
                    x[j] = 1.0f;
                ck_assert_int_eq(fusedrope_forward(c, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL),
                                 FUSEDROPE_OK);
                for (int j = 0; j < S * D; j++)
                    ck_assert_msg(isfinite(y[j]),
                                  "%s%s: accepted, but position %d channel %d gives %g", k[i].name,
                                  tableless ? " (table-less)" : "", j / D, j % D, y[j]);
            }
            fusedrope_cache_destroy(c);
        }
}
END_TEST

/*
 * lib/apply.c fr_apply + lib/cpu_apply.c fr_cpu_apply: a position array
 * (ids, offsets, cu_seqlens) that lies inside an output tensor is validated
 * before the call and then re-read while the output is being written, so
 * later tokens read float bits as positions and index the table far out of
 * bounds (a segfault in the -O2 build; UBSan: signed overflow in
 * cpu_apply.c p * half).  Expected: INVALID (the arrays are inputs; an
 * output must not share memory with them), output untouched.
 */
START_TEST(position_arrays_inside_output)
{
    enum { S = 8, D = 8 };
    fusedrope_cache *c = make_default(D, 16);
    for (int which = 0; which < 3; which++) {
        float x[S * D];
        float *y = aligned_alloc(64, S * D * sizeof(float) + 64);
        float *snap = malloc(S * D * sizeof(float));
        fusedrope_tensor tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, S, 1, 1, D);
        fusedrope_tensor ty = fusedrope_tensor_sbhd(y, FUSEDROPE_FLOAT32, S, 1, 1, D);
        fusedrope_positions pos = { .struct_size = sizeof(fusedrope_positions) };
        const char *what = which == 0 ? "ids" : which == 1 ? "offsets" : "cu_seqlens";
        fusedrope_status st;
        ck_assert_ptr_nonnull(y);
        memset(y, 0, S * D * sizeof(float) + 64);
        fill_floats(x, S * D);
        if (which == 0) { /* ids[t] at y[6 + 2t]: token 0's row overwrites ids[1] */
            int64_t *ids = (int64_t *)(void *)(y + 6);
            for (int t = 0; t < S; t++)
                ids[t] = t;
            pos.ids = ids;
        } else if (which == 1) { /* two sequences (THD): offsets[1] in token 0's row */
            int64_t *off = (int64_t *)(void *)(y + 4);
            int32_t cu[3] = { 0, 1, S };
            static int32_t cu_s[3];
            memcpy(cu_s, cu, sizeof cu);
            off[0] = 0;
            off[1] = 0;
            pos.offsets = off;
            pos.cu_seqlens = cu_s;
            pos.num_seqs = 2;
        } else { /* cu_seqlens in token 0's row */
            int32_t *cu = (int32_t *)(void *)(y + 4);
            cu[0] = 0;
            cu[1] = 1;
            cu[2] = S;
            pos.cu_seqlens = cu;
            pos.num_seqs = 2;
        }
        memcpy(snap, y, S * D * sizeof(float));
        st = fusedrope_forward(c, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL);
        ck_assert_msg(st == FUSEDROPE_ERR_INVALID,
                      "pos->%s inside the output y: status %d (%s), expected INVALID", what, st,
                      fusedrope_status_string(st));
        ck_assert_msg(memcmp(snap, y, S * D * sizeof(float)) == 0, "a refused call wrote y");
        free(y);
        free(snap);
    }
    fusedrope_cache_destroy(c);
}
END_TEST

/*
 * lib/apply.c check_tensor: a data pointer that is not a multiple of its
 * element size is accepted, and the backends then load and store through
 * misaligned float / uint16_t pointers (undefined behaviour: the ASan/UBSan
 * build reports "load of misaligned address" in cpu_apply.c; on a GPU a
 * misaligned global access is a sticky cudaErrorMisalignedAddress that
 * kills the context).  Proposed rule: INVALID, naming the pointer.  The
 * same holds for ids/offsets (int64_t) and cu_seqlens (int32_t).
 */
START_TEST(misaligned_pointers)
{
    enum { S = 4, D = 8 };
    fusedrope_cache *c = make_default(D, 16);
    static _Alignas(16) unsigned char xb[S * D * 4 + 16], yb[S * D * 4 + 16];
    static _Alignas(16) unsigned char pb[64];
    for (int dt = 0; dt < 3; dt++) {
        fusedrope_tensor tx = fusedrope_tensor_sbhd(xb + 1, (fusedrope_dtype)dt, S, 1, 1, D);
        fusedrope_tensor ty = fusedrope_tensor_sbhd(yb + 1, (fusedrope_dtype)dt, S, 1, 1, D);
        fusedrope_status st = fusedrope_forward(c, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL);
        if (st != FUSEDROPE_ERR_INVALID)
            fusedrope_cache_destroy(c); /* no leak report on top of the failure */
        ck_assert_msg(st == FUSEDROPE_ERR_INVALID,
                      "dtype %d data at an odd address: status %d (%s), expected INVALID", dt, st,
                      fusedrope_status_string(st));
    }
    {
        fusedrope_tensor tx = fusedrope_tensor_sbhd(xb, FUSEDROPE_FLOAT32, S, 1, 1, D);
        fusedrope_tensor ty = fusedrope_tensor_sbhd(yb, FUSEDROPE_FLOAT32, S, 1, 1, D);
        int64_t ids[S] = { 0, 1, 2, 3 };
        fusedrope_positions pos = {
            .struct_size = sizeof(fusedrope_positions), .ids = (const int64_t *)(const void *)(pb + 4) };
        fusedrope_status st;
        memcpy(pb + 4, ids, sizeof ids);
        st = fusedrope_forward(c, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL);
        if (st != FUSEDROPE_ERR_INVALID)
            fusedrope_cache_destroy(c);
        ck_assert_msg(st == FUSEDROPE_ERR_INVALID,
                      "pos->ids at an address that is 4 mod 8: status %d (%s), expected INVALID",
                      st, fusedrope_status_string(st));
    }
    fusedrope_cache_destroy(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("regress");
    TCase *tc = tcase_create("found by hardening");
    SRunner *sr;
    int failed;
    tcase_add_test(tc, cp_size_above_2_30);
    tcase_add_test(tc, accepted_config_gives_finite_table);
    tcase_add_test(tc, position_arrays_inside_output);
    tcase_add_test(tc, misaligned_pointers);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
