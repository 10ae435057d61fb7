/*
 * test_nomem.c - allocation failure inside the cache constructors and the
 * fused norm's calls.
 *
 * Linked with -Wl,--wrap= for malloc, calloc, realloc, aligned_alloc (the
 * tables') and free (tests/hardening.mk), so every allocation the static
 * library makes goes through the wrappers below, which count them, can make
 * the n-th one fail, and keep the set of blocks still live.  The C library,
 * libgomp and the sanitizer runtimes are not affected (their references are
 * not wrapped), which is what makes this work unchanged under ASan, TSan and
 * valgrind.
 *
 * For each constructor and config: a clean run counts its N allocations;
 * then for n = 1..N the n-th allocation fails, and the call must return
 * FUSEDROPE_ERR_NOMEM with *out NULL, a non-empty detail and no block left
 * live; with n = N + 1 it succeeds, and destroying the cache frees
 * everything.
 *
 * Exit status: 0 pass, 1 fail, 77 skip (the wrappers were not linked in).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedrope.h"
#include "under_valgrind.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);
void __wrap_free(void *p);

#define MAX_LIVE 4096

/* Volatile: the library calls malloc and free, which a compiler takes to
 * touch none of this program's variables, and under link-time optimisation
 * it sees both sides of the call: gcc's LTO (Ubuntu's packaging flags) then
 * dropped `armed = 1` before a destroy as a dead store, and every block the
 * destroy freed stayed in the live set. */
static volatile int armed;            /* counting on */
static volatile long fail_at;         /* the allocation (1-based) that fails; 0: none */
static volatile long count;           /* allocations seen while armed */
static void *volatile live[MAX_LIVE]; /* blocks allocated while armed and not freed */
static volatile int nlive;
static volatile int overflow;

static void add_live(void *p)
{
    if (nlive < MAX_LIVE)
        live[nlive++] = p;
    else
        overflow = 1;
}

static void drop_live(void *p)
{
    for (int i = 0; i < nlive; i++)
        if (live[i] == p) {
            live[i] = live[--nlive];
            return;
        }
}

static int should_fail(void)
{
    return armed && ++count == fail_at;
}

/* A new block p (or NULL), kept in the live set while armed. */
static void *tracked(void *p)
{
    if (armed && p)
        add_live(p);
    return p;
}

void *__wrap_malloc(size_t n)
{
    return should_fail() ? NULL : tracked(__real_malloc(n));
}

void *__wrap_calloc(size_t n, size_t m)
{
    return should_fail() ? NULL : tracked(__real_calloc(n, m));
}

void *__wrap_realloc(void *q, size_t n)
{
    void *p;
    if (should_fail())
        return NULL;
    p = __real_realloc(q, n);
    if (armed && p && q)
        drop_live(q);
    return tracked(p);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    return should_fail() ? NULL : tracked(__real_aligned_alloc(a, n));
}

void __wrap_free(void *p)
{
    if (p && armed)
        drop_live(p);
    __real_free(p);
}

/* ------------------------------------------------------------------ cases */

static double short_f[64], long_f[64];
static float tcos[32 * 16], tsin[32 * 16];

typedef struct {
    const char *name;
    fusedrope_cache_config cfg; /* type < 0: fusedrope_cache_create_from_table */
    int from_table;
} nm_case;

static fusedrope_status create(const nm_case *c, fusedrope_cache **out)
{
    if (c->from_table)
        return fusedrope_cache_create_from_table(tcos, tsin, 32, 32, FUSEDROPE_DEVICE_CPU, out);
    return fusedrope_cache_create(&c->cfg, FUSEDROPE_DEVICE_CPU, out);
}

static int failures;

#define FAIL(...)                              \
    do {                                       \
        fprintf(stderr, "FAIL: " __VA_ARGS__); \
        fputc('\n', stderr);                   \
        failures++;                            \
    } while (0)

static void run_case(const nm_case *c)
{
    fusedrope_cache *cache = (fusedrope_cache *)(uintptr_t)1;
    fusedrope_status st;
    long n_alloc;

    /* clean run: count */
    armed = 1, fail_at = 0, count = 0, nlive = 0, overflow = 0;
    st = create(c, &cache);
    n_alloc = count;
    if (st != FUSEDROPE_OK) {
        armed = 0;
        FAIL("%s: a clean create failed: %s", c->name, fusedrope_last_error());
        return;
    }
    if (n_alloc == 0) {
        armed = 0;
        fusedrope_cache_destroy(cache);
        FAIL("%s: the library made no allocation through the wrapped allocators", c->name);
        return;
    }
    fusedrope_cache_destroy(cache);
    if (nlive != 0 || overflow)
        FAIL("%s: %d block(s) still live after destroy", c->name, nlive);

    for (long n = 1; n <= n_alloc + 1; n++) {
        armed = 1, fail_at = n, count = 0, nlive = 0;
        cache = (fusedrope_cache *)(uintptr_t)1;
        st = create(c, &cache);
        armed = 0;
        if (n <= n_alloc) {
            if (st != FUSEDROPE_ERR_NOMEM)
                FAIL("%s: allocation %ld of %ld failing gave status %d (%s), not NOMEM", c->name, n,
                     n_alloc, st, fusedrope_status_string(st));
            if (cache != NULL)
                FAIL("%s: allocation %ld failing left *out = %p, not NULL", c->name, n,
                     (void *)cache);
            if (!fusedrope_last_error()[0])
                FAIL("%s: allocation %ld failing left no error detail", c->name, n);
            if (nlive != 0)
                FAIL("%s: allocation %ld failing leaked %d block(s)", c->name, n, nlive);
            if (st == FUSEDROPE_OK && cache)
                fusedrope_cache_destroy(cache);
        } else {
            if (st != FUSEDROPE_OK) {
                FAIL("%s: with no failure (n = %ld) create gave %d", c->name, n, st);
                continue;
            }
            armed = 1;
            fusedrope_cache_destroy(cache);
            armed = 0;
            if (nlive != 0)
                FAIL("%s: %d block(s) live after destroy", c->name, nlive);
        }
    }
    printf("%-40s %ld allocation(s), each failing in turn: %s\n", c->name, n_alloc,
           failures ? "see above" : "NOMEM, *out NULL, nothing leaked");
}

/* ------------------------------------------------------------ norm calls */

/* The fused norm's calls allocate their scratch: each allocation failing in
 * turn must give NOMEM, a detail, no block live and not one byte written
 * (fusedrope(3), Errors: on the CPU nothing is written when a call fails).
 * q_heads 0 makes q empty, whose dw the backward zeroes: after the scratch,
 * so that a failed call leaves it as it was. */
enum { CT = 3, CKH = 2, CD = 32 }; /* tokens, k's heads, head_dim */
static float c_x[2][CT * 4 * CD], c_y[2][CT * 4 * CD], c_dy[2][CT * 4 * CD], c_w[2][CD],
    c_rstd[2][CT * 4], c_dw[2][CD];

typedef struct {
    const char *name;
    int backward, q_heads;
} call_case;

static fusedrope_status norm_call(fusedrope_cache *cache, const call_case *c)
{
    fusedrope_tensor q_in = fusedrope_tensor_bshd(c_x[0], FUSEDROPE_FLOAT32, 1, CT, c->q_heads, CD);
    fusedrope_tensor q_out = fusedrope_tensor_bshd(c->backward ? c_dy[0] : c_y[0], FUSEDROPE_FLOAT32,
                                                   1, CT, c->q_heads, CD);
    fusedrope_tensor q_dx = fusedrope_tensor_bshd(c_y[0], FUSEDROPE_FLOAT32, 1, CT, c->q_heads, CD);
    fusedrope_tensor k_in = fusedrope_tensor_bshd(c_x[1], FUSEDROPE_FLOAT32, 1, CT, CKH, CD);
    fusedrope_tensor k_out = fusedrope_tensor_bshd(c->backward ? c_dy[1] : c_y[1], FUSEDROPE_FLOAT32,
                                                   1, CT, CKH, CD);
    fusedrope_tensor k_dx = fusedrope_tensor_bshd(c_y[1], FUSEDROPE_FLOAT32, 1, CT, CKH, CD);
    fusedrope_norm nm;

    fusedrope_norm_init(&nm);
    nm.weight = FUSEDROPE_NORM_WEIGHT;
    nm.q_weight = c_w[0];
    nm.k_weight = c_w[1];
    nm.q_rstd = c_rstd[0];
    nm.k_rstd = c_rstd[1];
    if (!c->backward)
        return fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q_in, &q_out,
                                         &k_in, &k_out, NULL);
    nm.dq_weight = c_dw[0];
    nm.dk_weight = c_dw[1];
    return fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q_in, &q_out, &q_dx,
                                      &k_in, &k_out, &k_dx, NULL);
}

static void rstd_ones(void)
{
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < CT * 4; i++)
            c_rstd[k][i] = 1.0f;
}

/* Every array the calls may write, as they are now. */
static void snapshot(unsigned char *buf)
{
    memcpy(buf, c_y, sizeof c_y);
    memcpy(buf + sizeof c_y, c_rstd, sizeof c_rstd);
    memcpy(buf + sizeof c_y + sizeof c_rstd, c_dw, sizeof c_dw);
}

static void run_call(fusedrope_cache *cache, const call_case *c)
{
    static unsigned char before[sizeof c_y + sizeof c_rstd + sizeof c_dw],
        after[sizeof c_y + sizeof c_rstd + sizeof c_dw];
    fusedrope_status st;
    long n_alloc;

    armed = 1, fail_at = 0, count = 0, nlive = 0, overflow = 0;
    st = norm_call(cache, c);
    armed = 0;
    n_alloc = count;
    if (st != FUSEDROPE_OK) {
        FAIL("%s: a clean call failed: %s", c->name, fusedrope_last_error());
        return;
    }
    if (n_alloc == 0) {
        FAIL("%s: the call made no allocation through the wrapped allocators", c->name);
        return;
    }
    if (nlive != 0 || overflow)
        FAIL("%s: %d block(s) live after a clean call", c->name, nlive);
    for (long n = 1; n <= n_alloc; n++) {
        /* poison what the call may write, so that any write shows */
        memset(c_y, 0x5a, sizeof c_y);
        memset(c_dw, 0x5a, sizeof c_dw);
        if (!c->backward)
            memset(c_rstd, 0x5a, sizeof c_rstd);
        snapshot(before);
        armed = 1, fail_at = n, count = 0, nlive = 0;
        st = norm_call(cache, c);
        armed = 0;
        snapshot(after);
        if (st != FUSEDROPE_ERR_NOMEM)
            FAIL("%s: allocation %ld of %ld failing gave status %d (%s), not NOMEM", c->name, n,
                 n_alloc, st, fusedrope_status_string(st));
        if (!fusedrope_last_error()[0])
            FAIL("%s: allocation %ld failing left no error detail", c->name, n);
        if (nlive != 0)
            FAIL("%s: allocation %ld failing leaked %d block(s)", c->name, n, nlive);
        if (memcmp(before, after, sizeof before) != 0)
            FAIL("%s: allocation %ld failing, the call wrote to its outputs", c->name, n);
        if (!c->backward)
            rstd_ones(); /* the backward's input */
    }
    printf("%-40s %ld allocation(s), each failing in turn: %s\n", c->name, n_alloc,
           failures ? "see above" : "NOMEM, nothing written, nothing leaked");
}

static void run_calls(void)
{
    static const call_case calls[] = {
        { "norm forward, q and k", 0, 4 },
        { "norm backward, q and k, dw", 1, 4 },
        { "norm backward, q empty (its dw zeroed)", 1, 0 },
    };
    fusedrope_cache_config cfg;
    fusedrope_cache *cache = NULL;

    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < CT * 4 * CD; i++) {
            c_x[k][i] = (float)((i * 37 + k) % 101) / 50.0f - 1.0f;
            c_dy[k][i] = (float)((i * 53 + k) % 97) / 48.0f - 1.0f;
        }
        for (int i = 0; i < CD; i++)
            c_w[k][i] = 1.0f + (float)i / CD;
    }
    rstd_ones();
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, CD, 16, 10000.0);
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache) != FUSEDROPE_OK) {
        FAIL("norm calls: the cache: %s", fusedrope_last_error());
        return;
    }
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
        run_call(cache, &calls[i]);
    fusedrope_cache_destroy(cache);
}

int main(void)
{
    nm_case cases[8];
    int n = 0;
    void *probe;

    /* Are the wrappers in?  A malloc from this file goes through them too
     * (called through a volatile pointer, which the compiler cannot elide). */
    {
        void *(*volatile m)(size_t) = malloc;
        armed = 1, fail_at = 1, count = 0;
        probe = m(16);
        armed = 0;
    }
    if (probe != NULL || count != 1) {
        free(probe);
        printf("SKIP: malloc is not wrapped (link with -Wl,--wrap=malloc ...)\n");
        return 77;
    }

    for (int i = 0; i < 64; i++)
        short_f[i] = 1.0 + i * 0.01, long_f[i] = 1.0 + i * 0.5;
    for (int i = 0; i < 32 * 16; i++)
        tcos[i] = 1.0f, tsin[i] = 0.0f;

    memset(cases, 0, sizeof cases);
    cases[n].name = "default, 4096-row table";
    fusedrope_cache_config_init(&cases[n++].cfg, FUSEDROPE_ROPE_DEFAULT, 128, 4096, 10000.0);
    cases[n].name = "default, table-less";
    fusedrope_cache_config_init(&cases[n++].cfg, FUSEDROPE_ROPE_DEFAULT, 64, 0, 10000.0);
    cases[n].name = "yarn, 512-row table";
    fusedrope_cache_config_init(&cases[n].cfg, FUSEDROPE_ROPE_YARN, 64, 512, 10000.0);
    cases[n].cfg.factor = 4;
    cases[n++].cfg.original_max_positions = 128;
    cases[n].name = "longrope, 256-row table";
    fusedrope_cache_config_init(&cases[n].cfg, FUSEDROPE_ROPE_LONGROPE, 128, 256, 10000.0);
    cases[n].cfg.original_max_positions = 64;
    cases[n].cfg.short_factor = short_f;
    cases[n++].cfg.long_factor = long_f;
    cases[n].name = "dynamic, table-less";
    fusedrope_cache_config_init(&cases[n].cfg, FUSEDROPE_ROPE_DYNAMIC, 32, 0, 10000.0);
    cases[n].cfg.factor = 2;
    cases[n].cfg.seq_len = 4096;
    cases[n++].cfg.original_max_positions = 1024;
    cases[n].name = "create_from_table, 32 x 32";
    cases[n++].from_table = 1;
    cases[n].name = "mrope sections, 512-row table";
    fusedrope_cache_config_init(&cases[n].cfg, FUSEDROPE_ROPE_DEFAULT, 64, 512, 10000.0);
    cases[n].cfg.axes = FUSEDROPE_AXES_SECTIONS;
    cases[n].cfg.sections[0] = 16;
    cases[n].cfg.sections[1] = 8;
    cases[n++].cfg.sections[2] = 8;

    for (int i = 0; i < n; i++)
        run_case(&cases[i]);

    /* a huge table: the allocation itself fails (no injection) */
    {
        fusedrope_cache_config cfg;
        fusedrope_cache *c = (fusedrope_cache *)(uintptr_t)1;
        fusedrope_status st;
        const char *asan = getenv("ASAN_OPTIONS");
        (void)asan;
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 2, (int64_t)1 << 60, 10000.0);
        /* 2^60 rows x 1 pair x 8 bytes (cos and sin) = 2^63 bytes: within
         * SIZE_MAX, so no RANGE; malloc must fail.  Not run under sanitizers or valgrind,
         * which abort or warn on such a request instead of returning NULL. */
#if !TU_SANITIZED
        if (!tu_under_valgrind()) {
            armed = 1, fail_at = 0, count = 0, nlive = 0;
            st = fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c);
            armed = 0;
            if (st != FUSEDROPE_ERR_NOMEM || c != NULL || nlive != 0)
                FAIL("a 2^63-byte table: status %d, *out %p, %d block(s) live (want NOMEM, NULL, 0)",
                     st, (void *)c, nlive);
            else
                printf("%-40s NOMEM, *out NULL, nothing leaked\n", "default, 2^60-row table");
        }
#else
        (void)cfg, (void)c, (void)st;
#endif
    }

    run_calls();

    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    return 0;
}
