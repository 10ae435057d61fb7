/*
 * test_determinism.c - forward and backward give the same bytes from run to
 * run and whatever the OpenMP thread count (1, 2 and 7), for every dtype,
 * layout (sbhd, bshd, thd) and position mode (implicit, offsets, ids,
 * cu_seqlens, context parallelism, a table-less cache).  Also: the same
 * bytes in place and out of place, through *_qk and through two single
 * calls, with a table-less cache and a table one, and through the
 * non-temporal store path (a large aligned output) and the plain one.
 * A cache's num_threads: the team each call gets, the same bytes.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <check.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fusedrope.h"
#include "internal.h" /* fr_cpu_team: the team size of this thread's last call */
#include "util.h"

enum { POS_IMPLICIT, POS_OFFSETS, POS_IDS, POS_CU, POS_CP, POS_TABLELESS, POS_N };
static const char *const pos_name[POS_N] = { "implicit", "offsets", "ids", "cu_seqlens", "cp",
                                             "table-less" };
static const char *const lay_name[3] = { "sbhd", "bshd", "thd" };
static const int thread_counts[] = { 1, 2, 7 };

static fusedrope_cache *cache_table, *cache_free;
static int64_t S, B, H;       /* B tokens per batch entry x S (thd: S*B tokens, batch 1) */
enum { D = 128, ROT = 96 };   /* channels past rot_dim are copied */

/* Values in [-4, 4] from the run's seed (FUSEDROPE_TEST_SEED), stream `stream`. */
static void fill(unsigned char *p, size_t bytes, fusedrope_dtype dt, uint64_t stream)
{
    tu_rng r;
    tu_rng_init(&r, stream);
    tu_fill(p, (int64_t)(bytes / ref_dtype_size(dt)), dt, &r, -4, 4);
}

typedef struct {
    fusedrope_dtype dt;
    int lay, mode;
    int64_t ids[1024];
    int64_t offsets[4];
    int32_t cu[5];
    fusedrope_positions pos;
    const fusedrope_positions *pp;
    const fusedrope_cache *cache;
} ctx;

static fusedrope_tensor view(const ctx *c, void *data, int64_t heads)
{
    if (c->lay == 0)
        return fusedrope_tensor_sbhd(data, c->dt, S, B, heads, D);
    if (c->lay == 1)
        return fusedrope_tensor_bshd(data, c->dt, B, S, heads, D);
    return fusedrope_tensor_thd(data, c->dt, S * B, heads, D);
}

static void make_ctx(ctx *c, fusedrope_dtype dt, int lay, int mode)
{
    int64_t tokens = S * B;
    memset(c, 0, sizeof *c);
    c->dt = dt;
    c->lay = lay;
    c->mode = mode;
    c->cache = mode == POS_TABLELESS ? cache_free : cache_table;
    fusedrope_positions_init(&c->pos);
    c->pos.cp_size = 1;
    c->pp = &c->pos;
    switch (mode) {
    case POS_IMPLICIT:
    case POS_TABLELESS:
        c->pp = NULL;
        break;
    case POS_OFFSETS:
        for (int i = 0; i < 4; i++)
            c->offsets[i] = 100 + 37 * i;
        c->pos.offsets = c->offsets;
        if (lay == 2) { /* per sequence: two sequences */
            c->cu[0] = 0;
            c->cu[1] = (int32_t)(tokens / 3);
            c->cu[2] = (int32_t)tokens;
            c->pos.cu_seqlens = c->cu;
            c->pos.num_seqs = 2;
        }
        break;
    case POS_IDS:
        for (int64_t i = 0; i < tokens; i++)
            c->ids[i] = (i * 131 + 7) % 1000;
        c->pos.ids = c->ids;
        break;
    case POS_CU: /* four sequences, one of them empty (thd); sbhd/bshd: batch 1 view */
        c->cu[0] = 0;
        c->cu[1] = (int32_t)(tokens / 4 * 2);
        c->cu[2] = c->cu[1];
        c->cu[3] = (int32_t)(tokens / 4 * 3);
        c->cu[4] = (int32_t)tokens;
        c->pos.cu_seqlens = c->cu;
        c->pos.num_seqs = 4;
        break;
    case POS_CP:
        c->pos.cp_size = 3;
        c->pos.cp_rank = 1;
        if (lay == 2) { /* even local lengths */
            c->cu[0] = 0;
            c->cu[1] = (int32_t)(tokens / 2);
            c->cu[2] = (int32_t)tokens;
            c->pos.cu_seqlens = c->cu;
            c->pos.num_seqs = 2;
        }
        break;
    }
}

/* One call of `dir` (0 forward, 1 backward) into y; in place when y == x. */
static void call(const ctx *c, int dir, void *x, void *y)
{
    fusedrope_tensor tx = view(c, x, H), ty = view(c, y, H);
    fusedrope_status st = dir ? fusedrope_backward(c->cache, FUSEDROPE_NEOX, c->pp, &tx, &ty, NULL)
                              : fusedrope_forward(c->cache, FUSEDROPE_NEOX, c->pp, &tx, &ty, NULL);
    ck_assert_msg(st == FUSEDROPE_OK, "%s %s %s %s: %s", dir ? "backward" : "forward",
                  lay_name[c->lay], pos_name[c->mode], c->dt == 0 ? "f32" : c->dt == 1 ? "f16" : "bf16",
                  fusedrope_last_error());
}

static void setup(void)
{
    fusedrope_cache_config cfg;
    int small = tu_under_valgrind();
    S = small ? 16 : 64;
    B = 2;
    H = small ? 2 : 8; /* 64 x 2 x 8 x 128 = 131072 elements: past the OpenMP threshold */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, ROT, 4096, 10000.0);
    cfg.factor = 4;
    cfg.original_max_positions = 256;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache_table), FUSEDROPE_OK);
    cfg.max_positions = 0;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache_free), FUSEDROPE_OK);
}

static void teardown(void)
{
    fusedrope_cache_destroy(cache_table);
    fusedrope_cache_destroy(cache_free);
    cache_table = cache_free = NULL;
    tu_threads(1);
}

/* _i = dtype (0..2) x layout (0..2) */
START_TEST(thread_counts_and_reruns)
{
    fusedrope_dtype dt = (fusedrope_dtype)(_i / 3);
    int lay = _i % 3;
    size_t bytes = (size_t)(S * B * H * D) * ref_dtype_size(dt);
    unsigned char *x = malloc(bytes), *ref = malloc(bytes), *y = malloc(bytes), *ip = malloc(bytes);
    ck_assert(x && ref && y && ip);
    fill(x, bytes, dt, (uint64_t)_i + 1);
    for (int mode = 0; mode < POS_N; mode++) {
        ctx c;
        if (mode == POS_CU && lay != 2)
            continue; /* cu_seqlens needs the packed layout */
        make_ctx(&c, dt, lay, mode);
        for (int dir = 0; dir < 2; dir++) {
            tu_threads(1);
            memset(ref, 0x5A, bytes);
            call(&c, dir, x, ref);
            for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++)
                for (int rep = 0; rep < 2; rep++) {
                    tu_threads(thread_counts[t]);
                    memset(y, rep ? 0x00 : 0xFF, bytes);
                    call(&c, dir, x, y);
                    ck_assert_msg(memcmp(y, ref, bytes) == 0,
                                  "%s %s %s dtype %d: %d threads (run %d) differ from 1 thread",
                                  dir ? "backward" : "forward", lay_name[lay], pos_name[mode], dt,
                                  thread_counts[t], rep + 1);
                    /* in place: the same bytes */
                    memcpy(ip, x, bytes);
                    call(&c, dir, ip, ip);
                    ck_assert_msg(memcmp(ip, ref, bytes) == 0,
                                  "%s %s %s dtype %d, %d threads: in place differs from out of place",
                                  dir ? "backward" : "forward", lay_name[lay], pos_name[mode], dt,
                                  thread_counts[t]);
                }
        }
    }
    free(x);
    free(ref);
    free(y);
    free(ip);
}
END_TEST

/* forward_qk(q, k) == forward(q), forward(k); the same for backward. */
START_TEST(qk_equals_two_calls)
{
    fusedrope_dtype dt = (fusedrope_dtype)(_i % 3);
    int lay = _i / 3;
    const int64_t hk = 2;
    size_t bq = (size_t)(S * B * H * D) * ref_dtype_size(dt), bk = (size_t)(S * B * hk * D) * ref_dtype_size(dt);
    unsigned char *q = malloc(bq), *k = malloc(bk), *q1 = malloc(bq), *k1 = malloc(bk);
    unsigned char *q2 = malloc(bq), *k2 = malloc(bk);
    ctx c;
    ck_assert(q && k && q1 && k1 && q2 && k2);
    fill(q, bq, dt, 11);
    fill(k, bk, dt, 12);
    make_ctx(&c, dt, lay, lay == 2 ? POS_CU : POS_OFFSETS);
    for (int dir = 0; dir < 2; dir++)
        for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
            fusedrope_tensor tq = view(&c, q, H), tk = view(&c, k, hk);
            fusedrope_tensor tq1 = view(&c, q1, H), tk1 = view(&c, k1, hk);
            fusedrope_tensor tq2 = view(&c, q2, H), tk2 = view(&c, k2, hk);
            tu_threads(thread_counts[t]);
            if (dir) {
                ck_assert_int_eq(fusedrope_backward_qk(c.cache, FUSEDROPE_INTERLEAVED, c.pp, &tq, &tq1,
                                                       &tk, &tk1, NULL), FUSEDROPE_OK);
                ck_assert_int_eq(fusedrope_backward(c.cache, FUSEDROPE_INTERLEAVED, c.pp, &tq, &tq2, NULL),
                                 FUSEDROPE_OK);
                ck_assert_int_eq(fusedrope_backward(c.cache, FUSEDROPE_INTERLEAVED, c.pp, &tk, &tk2, NULL),
                                 FUSEDROPE_OK);
            } else {
                ck_assert_int_eq(fusedrope_forward_qk(c.cache, FUSEDROPE_INTERLEAVED, c.pp, &tq, &tq1,
                                                      &tk, &tk1, NULL), FUSEDROPE_OK);
                ck_assert_int_eq(fusedrope_forward(c.cache, FUSEDROPE_INTERLEAVED, c.pp, &tq, &tq2, NULL),
                                 FUSEDROPE_OK);
                ck_assert_int_eq(fusedrope_forward(c.cache, FUSEDROPE_INTERLEAVED, c.pp, &tk, &tk2, NULL),
                                 FUSEDROPE_OK);
            }
            ck_assert_msg(memcmp(q1, q2, bq) == 0 && memcmp(k1, k2, bk) == 0,
                          "%s_qk %s dtype %d, %d threads: differs from two single calls",
                          dir ? "backward" : "forward", lay_name[lay], dt, thread_counts[t]);
        }
    free(q);
    free(k);
    free(q1);
    free(k1);
    free(q2);
    free(k2);
}
END_TEST

/* A table-less cache gives the bytes of the table (the decisions: "exactly
 * the value the table would hold"). */
START_TEST(tableless_equals_table)
{
    fusedrope_dtype dt = (fusedrope_dtype)_i;
    size_t bytes = (size_t)(S * B * H * D) * ref_dtype_size(dt);
    unsigned char *x = malloc(bytes), *y1 = malloc(bytes), *y2 = malloc(bytes);
    ctx c;
    ck_assert(x && y1 && y2);
    fill(x, bytes, dt, 21);
    make_ctx(&c, dt, 0, POS_IDS);
    for (int dir = 0; dir < 2; dir++) {
        c.cache = cache_table;
        call(&c, dir, x, y1);
        c.cache = cache_free;
        call(&c, dir, x, y2);
        ck_assert_msg(memcmp(y1, y2, bytes) == 0, "%s dtype %d: table-less cache differs from table",
                      dir ? "backward" : "forward", dt);
    }
    free(x);
    free(y1);
    free(y2);
}
END_TEST

/* A large output takes the backend's non-temporal store path when it is
 * 16-byte aligned and the plain path when not: the same bytes either way,
 * for every thread count. */
START_TEST(store_paths_agree)
{
    const int64_t s = tu_under_valgrind() ? 128 : 512, b = 2, h = 8; /* 8 MiB of float32 */
    size_t n = (size_t)(s * b * h * D), bytes = n * 4;
    float *x = malloc(bytes), *ref = malloc(bytes);
    unsigned char *raw = malloc(bytes + 64);
    float *aligned = (float *)(void *)(raw + (16 - (uintptr_t)raw % 16) % 16);
    float *shifted = (float *)(void *)((unsigned char *)aligned + 4);
    ck_assert(x && ref && raw);
    fill((unsigned char *)x, bytes, FUSEDROPE_FLOAT32, 31);
    for (int dir = 0; dir < 2; dir++) {
        fusedrope_tensor tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, s, b, h, D);
        fusedrope_tensor tr = fusedrope_tensor_sbhd(ref, FUSEDROPE_FLOAT32, s, b, h, D);
        tu_threads(1);
        ck_assert_int_eq(dir ? fusedrope_backward(cache_table, FUSEDROPE_NEOX, NULL, &tx, &tr, NULL)
                             : fusedrope_forward(cache_table, FUSEDROPE_NEOX, NULL, &tx, &tr, NULL),
                         FUSEDROPE_OK);
        for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++)
            for (int a = 0; a < 2; a++) {
                float *out = a ? shifted : aligned;
                fusedrope_tensor ty = fusedrope_tensor_sbhd(out, FUSEDROPE_FLOAT32, s, b, h, D);
                tu_threads(thread_counts[t]);
                memset(out, 0x77, bytes);
                ck_assert_int_eq(dir ? fusedrope_backward(cache_table, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL)
                                     : fusedrope_forward(cache_table, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL),
                                 FUSEDROPE_OK);
                ck_assert_msg(memcmp(out, ref, bytes) == 0,
                              "%s, %s output, %d threads: differs from the 1-thread run",
                              dir ? "backward" : "forward", a ? "4-byte-shifted" : "16-byte-aligned",
                              thread_counts[t]);
            }
    }
    free(x);
    free(ref);
    free(raw);
}
END_TEST

/* ------------------------------------------------- fusedrope_cache_config.num_threads */

static fusedrope_cache *nt_cache(int num_threads, int64_t max_positions)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, ROT, max_positions, 10000.0);
    cfg.factor = 4;
    cfg.original_max_positions = 256;
    cfg.num_threads = num_threads;
    ck_assert_msg(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c) == FUSEDROPE_OK, "%s",
                  fusedrope_last_error());
    return c;
}

/* Forward of x into y (q, and k for _qk) with `c`; returns fr_cpu_team. */
static int nt_call(const fusedrope_cache *c, fusedrope_dtype dt, int64_t s, int64_t h, void *x,
                   void *y, int qk)
{
    fusedrope_tensor tx = fusedrope_tensor_sbhd(x, dt, s, 1, h, D);
    fusedrope_tensor ty = fusedrope_tensor_sbhd(y, dt, s, 1, h, D);
    fusedrope_status st;
    if (qk) { /* the same rows as q (h - 1 heads) and k (1 head), as strided views */
        fusedrope_tensor qx = tx, qy = ty, kx = tx, ky = ty;
        qx.heads = qy.heads = h - 1;
        kx.heads = ky.heads = 1;
        kx.data = (char *)x + (size_t)((h - 1) * D) * ref_dtype_size(dt);
        ky.data = (char *)y + (size_t)((h - 1) * D) * ref_dtype_size(dt);
        st = fusedrope_forward_qk(c, FUSEDROPE_NEOX, NULL, &qx, &qy, &kx, &ky, NULL);
    } else {
        st = fusedrope_forward(c, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL);
    }
    ck_assert_msg(st == FUSEDROPE_OK, "%s", fusedrope_last_error());
    return fr_cpu_team;
}

/*
 * A cache's num_threads bounds the OpenMP team of its large calls: 3 gives a
 * team of 3 whatever omp_set_num_threads says, 1 and small calls run on the
 * calling thread with no team at all (fr_cpu_team 0), 0 takes the OpenMP
 * default; the bytes equal the default cache's and are within the float64
 * reference's bound; a cache built with 3 threads has the same table.
 * _i: dtype.  Without OpenMP only the bytes are checked.
 */
START_TEST(cache_num_threads)
{
    const fusedrope_dtype dt = (fusedrope_dtype)_i;
    const int64_t s = 32, h = 17; /* 32 x 17 x 128 = 69632 elements: past the team threshold */
    const size_t bytes = (size_t)(s * h * D) * ref_dtype_size(dt);
    static const int counts[] = { 0, 1, 3 };
    unsigned char *x = malloc(bytes), *want = malloc(bytes), *y = malloc(bytes);
    fusedrope_cache *c[3], *tl, *neg = (fusedrope_cache *)x;
    fusedrope_cache_config cfg;
    ref_rope rr;
    int64_t *positions;
    char msg[512];
    ck_assert(x && want && y);
    fill(x, bytes, dt, 41);
    for (int k = 0; k < 3; k++)
        c[k] = nt_cache(counts[k], 4096);
    tl = nt_cache(3, 0);
#ifdef _OPENMP
    omp_set_dynamic(0);
    omp_set_max_active_levels(1);
#endif
    tu_threads(2);

    /* the default cache's result, judged by the reference */
    memset(want, 0xff, bytes);
    nt_call(c[0], dt, s, h, x, want, 0);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, ROT, 4096, 10000.0);
    cfg.factor = 4;
    cfg.original_max_positions = 256;
    ck_assert_int_eq(ref_rope_from_config(&rr, &cfg), 0);
    positions = tu_positions(NULL, s, 1);
    {
        fusedrope_tensor tx = fusedrope_tensor_sbhd(x, dt, s, 1, h, D);
        fusedrope_tensor ty = fusedrope_tensor_sbhd(want, dt, s, 1, h, D);
        ck_assert_msg(ref_check_apply(&rr, FUSEDROPE_NEOX, positions, &tx, &ty, 0, msg, sizeof msg) == 0,
                      "%s", msg);
    }
    ref_rope_free(&rr);

    for (int qk = 0; qk < 2; qk++)
        for (int k = 0; k < 4; k++) {
            const fusedrope_cache *cc = k < 3 ? c[k] : tl;
            const int n = k < 3 ? counts[k] : 3;
            int team;
            memset(y, qk ? 0x00 : 0xff, bytes);
            team = nt_call(cc, dt, s, h, x, y, qk);
            ck_assert_msg(memcmp(y, want, bytes) == 0,
                          "num_threads %d%s%s: bytes differ from the default cache's", n,
                          k == 3 ? " (table-less)" : "", qk ? " (_qk)" : "");
#ifdef _OPENMP
            ck_assert_msg(team == (n == 0 ? 2 : n == 1 ? 0 : n),
                          "num_threads %d%s: a team of %d (0: none) with omp_set_num_threads(2)",
                          n, qk ? " (_qk)" : "", team);
#else
            (void)team;
#endif
        }
#ifdef _OPENMP
    /* a small call (one token) on the 3-thread cache: no team */
    ck_assert_int_eq(nt_call(c[2], dt, 1, h, x, y, 0), 0);
    /* from inside the caller's parallel region: the nested region is
     * inactive (max-active-levels 1), a team of one; with nesting allowed,
     * each outer thread's call gets the cache's 3 threads */
    for (int levels = 1; levels <= 2; levels++) {
        int teams[2] = { -1, -1 }, same[2] = { 0, 0 };
        unsigned char *ys[2] = { y, malloc(bytes) };
        ck_assert(ys[1] != NULL);
        omp_set_max_active_levels(levels);
#pragma omp parallel num_threads(2)
        {
            int me = omp_get_thread_num();
            teams[me] = nt_call(c[2], dt, s, h, x, ys[me], 0);
            same[me] = memcmp(ys[me], want, bytes) == 0;
        }
        for (int t = 0; t < 2; t++) {
            ck_assert_msg(teams[t] == (levels == 1 ? 1 : 3),
                          "max-active-levels %d, outer thread %d: a team of %d", levels, t,
                          teams[t]);
            ck_assert_msg(same[t], "max-active-levels %d, outer thread %d: bytes differ", levels, t);
        }
        free(ys[1]);
    }
    omp_set_max_active_levels(1);
#endif

    /* the table built by 3 threads is the default's */
    {
        size_t n = (size_t)4096 * (ROT / 2) * sizeof(float);
        float *c0 = malloc(n), *s0 = malloc(n), *c3 = malloc(n), *s3 = malloc(n);
        ck_assert(c0 && s0 && c3 && s3);
        ck_assert_int_eq(fusedrope_cache_copy_table(c[0], c0, s0), FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_cache_copy_table(c[2], c3, s3), FUSEDROPE_OK);
        ck_assert(memcmp(c0, c3, n) == 0 && memcmp(s0, s3, n) == 0);
        free(c0), free(s0), free(c3), free(s3);
    }

    /* a negative count and one past FUSEDROPE_MAX_THREADS are refused (a
     * table of 32768 entries or more with num_threads INT_MAX ended the
     * process in libgomp before 2026-11-30), FUSEDROPE_MAX_THREADS itself
     * accepted (a table too small for a team) */
    {
        static const int bad[3] = { -1, FUSEDROPE_MAX_THREADS + 1, INT_MAX };
        for (int b = 0; b < 3; b++) {
            char want_msg[160];
            fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, ROT, 4096, 10000.0);
            cfg.num_threads = bad[b];
            neg = (fusedrope_cache *)x;
            ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &neg),
                             FUSEDROPE_ERR_INVALID);
            ck_assert_ptr_null(neg);
            snprintf(want_msg, sizeof want_msg, "num_threads is %d; it must be 0..%d "
                     "(FUSEDROPE_MAX_THREADS; 0 means the OpenMP default)", bad[b],
                     FUSEDROPE_MAX_THREADS);
            ck_assert_str_eq(fusedrope_last_error(), want_msg);
        }
        fusedrope_cache_destroy(nt_cache(FUSEDROPE_MAX_THREADS, 16));
    }

    for (int k = 0; k < 3; k++)
        fusedrope_cache_destroy(c[k]);
    fusedrope_cache_destroy(tl);
    free(x);
    free(want);
    free(y);
    tu_free_all();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("determinism");
    TCase *tc = tcase_create("bytes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, tu_under_valgrind() ? 900 : 60);
    tcase_add_loop_test(tc, thread_counts_and_reruns, 0, 9);
    tcase_add_loop_test(tc, qk_equals_two_calls, 0, 9);
    tcase_add_loop_test(tc, tableless_equals_table, 0, 3);
    tcase_add_test(tc, store_paths_agree);
    tcase_add_loop_test(tc, cache_num_threads, 0, 3);
    suite_add_tcase(s, tc);
    return tu_main(s, "test_determinism");
}
