/*
 * util.c - helpers shared by the libcheck suites (see util.h).
 */
#include "util.h"
#include "run_seed.h"
#include "internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Under AddressSanitizer, let an impossible allocation return NULL (the
 * out-of-memory tests ask the library for petabytes) instead of aborting. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

uint64_t tu_seed;

void tu_rng_init(tu_rng *r, uint64_t stream)
{
    uint64_t s = tu_seed ^ (stream * 0xd1342543de82ef95ull);
    r->s = ref_splitmix(&s);
}

uint64_t tu_next(tu_rng *r)
{
    return ref_splitmix(&r->s);
}

double tu_uniform(tu_rng *r, double lo, double hi)
{
    double u = (double)(tu_next(r) >> 11) * 0x1.0p-53;
    return lo + (hi - lo) * u;
}

int64_t tu_int(tu_rng *r, int64_t lo, int64_t hi)
{
    uint64_t span = (uint64_t)(hi - lo) + 1;
    if (span == 0)
        return (int64_t)tu_next(r);
    return lo + (int64_t)(tu_next(r) % span);
}

int64_t tu_position(tu_rng *r, int64_t rows)
{
    const int64_t outside[6] = { -1, rows, rows + 7, -1000, INT64_MAX, INT64_MIN };
    return tu_int(r, 0, 5) == 0 ? outside[tu_int(r, 0, 5)] : tu_int(r, 0, rows - 1);
}

int64_t tu_offset(tu_rng *r, int64_t rows, int64_t S)
{
    const int64_t o = tu_position(r, rows);
    return o == INT64_MAX || o == INT64_MIN ? o : o - tu_int(r, 0, S);
}

int tu_cu_seqlens(tu_rng *r, int32_t *cu, int n, int64_t tokens)
{
    const int kind = (int)tu_int(r, 0, 2);
    int valid;
    if (kind < 2 || n < 2) {
        cu[0] = 0;
        for (int i = 1; i < n; i++)
            cu[i] = (int32_t)tu_int(r, cu[i - 1], tokens);
        cu[n] = (int32_t)tokens;
        if (kind == 1 && n >= 2) {
            const int i = (int)tu_int(r, 1, n - 1);
            cu[i] = cu[i - 1] - (int32_t)tu_int(r, 1, 5);
        }
    } else {
        for (int i = 0; i <= n; i++)
            cu[i] = tu_int(r, 0, 9) == 0 ? (tu_int(r, 0, 1) ? INT32_MAX : INT32_MIN)
                                         : (int32_t)tu_int(r, -3, tokens + 4);
    }
    valid = cu[0] == 0 && cu[n] == tokens;
    for (int i = 0; i < n; i++)
        valid = valid && cu[i + 1] >= cu[i];
    return valid;
}

int tu_bad_tokens(const fusedrope_positions *pos, int naxes, int64_t S, int64_t B,
                  int64_t rows, int *bad)
{
    /* an offset's sum past int64 wraps (ref_token_position) to a value past
     * every small table: negative, or far from it */
    const int64_t n = S * B;
    int64_t *p = malloc(sizeof *p * (size_t)(n * naxes) + 1);
    int any = 0;
    if (!p)
        abort();
    ref_axis_positions(pos, naxes, S, B, p);
    for (int64_t k = 0; k < n; k++) {
        bad[k] = 0;
        for (int a = 0; a < naxes; a++)
            bad[k] |= p[a * n + k] < 0 || p[a * n + k] >= rows;
        any |= bad[k];
    }
    free(p);
    return any;
}

#ifdef _OPENMP
/* LLVM's (and Intel's) OpenMP runtime, present where the library's OpenMP
 * code calls it; NULL under GNU libgomp.  Its address is all that is used. */
#pragma weak __kmpc_fork_call
extern void __kmpc_fork_call(void);

/* LLVM's runtime starts again in a forked child, from the environment
 * (omp_set_num_threads of the parent is lost there); GNU libgomp read its
 * environment as it loaded, and keeps the parent's settings. */
static void tu_threads_env(int n)
{
    char v[16];
    snprintf(v, sizeof v, "%d", n);
    if (setenv("OMP_NUM_THREADS", v, 1) != 0)
        abort();
}
#endif

void tu_threads(int n)
{
#ifdef _OPENMP
    if (n <= 0) {
        n = omp_get_num_procs();
        if (n < 2)
            n = 2; /* the threaded paths, even on one core */
    }
    omp_set_num_threads(n);
    if (&__kmpc_fork_call != NULL)
        tu_threads_env(n); /* for the children this process forks */
#else
    (void)n;
#endif
}

/* tu_main's one thread for each forked test.  LLVM 16's libomp hangs the
 * exit of a child forked after the parent started it (configure.ac's fork
 * check, llvm-project issue 63908), and libcheck forks every test: under
 * LLVM's runtime the parent leaves it unstarted, and each test's own start
 * reads the one thread from the environment. */
static void tu_threads_of_forked_tests(void)
{
#ifdef _OPENMP
    if (&__kmpc_fork_call != NULL) {
        tu_threads_env(1);
        return;
    }
#endif
    tu_threads(1);
}

int tu_main(Suite *s, const char *name)
{
    SRunner *sr;
    int failed;
    if (tu_run_seed(name, &tu_seed) != 0)
        return 1;
    printf("%s: FUSEDROPE_TEST_SEED=%" PRIu64 "\n", name, tu_seed);
    /* Small tests run the library on one thread (their calls are below any
     * sensible threading threshold anyway; this spares each forked test the
     * start of a thread team).  Tests of the threaded paths call tu_threads(0). */
    tu_threads_of_forked_tests();
    ref_init();
    fflush(stdout);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed)
        printf("%s: %d failed; rerun with FUSEDROPE_TEST_SEED=%" PRIu64 "\n", name, failed,
               tu_seed);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ------------------------------------------------------------- allocations */

#define TU_MAX_TRACK 4096
static void *tracked[TU_MAX_TRACK];
static int ntracked;
static fusedrope_cache *tracked_caches[256];
static int ncaches;

void *tu_alloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    /* ck_abort_msg, not ck_assert_msg, in helpers that run often: an assertion
     * that holds still costs libcheck a message to the parent process */
    if (!p)
        ck_abort_msg("out of memory allocating %zu bytes", n);
    if (ntracked >= TU_MAX_TRACK)
        ck_abort_msg("too many tracked allocations");
    tracked[ntracked++] = p;
    return p;
}

void *tu_dup(const void *p, size_t n)
{
    void *q = tu_alloc(n);
    if (n)
        memcpy(q, p, n);
    return q;
}

fusedrope_cache *tu_track(fusedrope_cache *c)
{
    if (ncaches >= 256)
        ck_abort_msg("too many tracked caches");
    if (c)
        tracked_caches[ncaches++] = c;
    return c;
}

void tu_free_all(void)
{
    while (ntracked > 0)
        free(tracked[--ntracked]);
    while (ncaches > 0)
        fusedrope_cache_destroy(tracked_caches[--ncaches]);
}

/* ----------------------------------------------------------------- tensors */

const char *tu_layout_name(int kind)
{
    static const char *names[LAY_NUM] = {"sbhd", "bshd", "sbhd-padded", "bshd-padded",
                                         "hsbd", "thd"};
    return kind >= 0 && kind < LAY_NUM ? names[kind] : "?";
}

/* Strides and lead of a layout. */
static fusedrope_tensor layout(int kind, int64_t s, int64_t b, int64_t h, int64_t d,
                               int64_t *lead)
{
    fusedrope_tensor t;
    memset(&t, 0, sizeof t);
    *lead = 0;
    switch (kind) {
    case LAY_SBHD:
        t = fusedrope_tensor_sbhd(NULL, FUSEDROPE_FLOAT32, s, b, h, d);
        break;
    case LAY_BSHD:
        t = fusedrope_tensor_bshd(NULL, FUSEDROPE_FLOAT32, b, s, h, d);
        break;
    case LAY_THD:
        t = fusedrope_tensor_thd(NULL, FUSEDROPE_FLOAT32, s, h, d);
        break;
    case LAY_SBHD_PAD:
        t.seq_len = s; t.batch = b; t.heads = h; t.head_dim = d;
        t.stride_head = d + 3;
        t.stride_batch = h * (d + 3) + 5;
        t.stride_seq = b * t.stride_batch + 7;
        *lead = 1;
        break;
    case LAY_BSHD_PAD:
        t.seq_len = s; t.batch = b; t.heads = h; t.head_dim = d;
        t.stride_head = d + 2;
        t.stride_seq = h * (d + 2) + 1;
        t.stride_batch = s * t.stride_seq + 3;
        *lead = 3;
        break;
    case LAY_HSBD:
        t.seq_len = s; t.batch = b; t.heads = h; t.head_dim = d;
        t.stride_batch = d;
        t.stride_seq = b * d;
        t.stride_head = s * b * d;
        break;
    }
    return t;
}

int64_t tu_layout_elems(int kind, int64_t s, int64_t b, int64_t h, int64_t d)
{
    int64_t lead;
    fusedrope_tensor t = layout(kind, s, b, h, d, &lead);
    if (s == 0 || b == 0 || h == 0 || d == 0)
        return lead;
    return lead + (s - 1) * t.stride_seq + (b - 1) * t.stride_batch +
           (h - 1) * t.stride_head + d;
}

tu_buf tu_buf_new(fusedrope_dtype dt, int64_t n)
{
    tu_buf b;
    b.dt = dt;
    b.nbytes = (size_t)(n + 8) * ref_dtype_size(dt); /* a poisoned guard tail */
    b.p = tu_alloc(b.nbytes);
    tu_poison(&b);
    return b;
}

fusedrope_tensor tu_view(int kind, tu_buf *buf, int64_t s, int64_t b, int64_t h, int64_t d)
{
    int64_t lead;
    fusedrope_tensor t = layout(kind, s, b, h, d, &lead);
    t.dtype = buf->dt;
    t.data = buf->p + (size_t)lead * ref_dtype_size(buf->dt);
    return t;
}

fusedrope_tensor tu_tensor(int kind, fusedrope_dtype dt, int64_t s, int64_t b, int64_t h,
                           int64_t d, tu_buf *buf)
{
    *buf = tu_buf_new(dt, tu_layout_elems(kind, s, b, h, d));
    return tu_view(kind, buf, s, b, h, d);
}

void tu_fill(void *p, int64_t n, fusedrope_dtype dt, tu_rng *r, double lo, double hi)
{
    int64_t i;
    for (i = 0; i < n; i++)
        ref_store(p, dt, i, tu_uniform(r, lo, hi));
}

void tu_fill_random(tu_buf *b, tu_rng *r, double lo, double hi)
{
    tu_fill(b->p, (int64_t)(b->nbytes / ref_dtype_size(b->dt)), b->dt, r, lo, hi);
}

void tu_fill_view(const fusedrope_tensor *t, tu_rng *r, double lo, double hi)
{
    int64_t s, b, h, c;
    for (s = 0; s < t->seq_len; s++)
        for (b = 0; b < t->batch; b++)
            for (h = 0; h < t->heads; h++)
                for (c = 0; c < t->head_dim; c++)
                    ref_store(t->data, t->dtype, ref_offset(t, s, b, h, c),
                              tu_uniform(r, lo, hi));
}

void tu_poison(tu_buf *b)
{
    memset(b->p, 0xff, b->nbytes);
}

tu_buf tu_buf_copy(const tu_buf *b)
{
    tu_buf c = *b;
    c.p = tu_dup(b->p, b->nbytes);
    return c;
}

fusedrope_tensor tu_rebase(const fusedrope_tensor *t, const tu_buf *from, const tu_buf *to)
{
    fusedrope_tensor r = *t;
    r.data = to->p + ((const unsigned char *)t->data - from->p);
    return r;
}

void tu_mask_view(const tu_buf *buf, const fusedrope_tensor *t, unsigned char *mask)
{
    int64_t s, b, h;
    size_t es = ref_dtype_size(t->dtype);
    for (s = 0; s < t->seq_len; s++)
        for (b = 0; b < t->batch; b++)
            for (h = 0; h < t->heads; h++) {
                size_t off = (size_t)((const unsigned char *)t->data - buf->p) +
                             (size_t)ref_offset(t, s, b, h, 0) * es;
                if (off + (size_t)t->head_dim * es > buf->nbytes)
                    ck_abort_msg("test bug: view outside its buffer");
                memset(mask + off, 1, (size_t)t->head_dim * es);
            }
}

size_t tu_changed_outside(const tu_buf *buf, const tu_buf *snap, const unsigned char *mask,
                          size_t *first)
{
    size_t i, n = 0;
    for (i = 0; i < buf->nbytes; i++)
        if (!mask[i] && buf->p[i] != snap->p[i]) {
            if (n++ == 0 && first)
                *first = i;
        }
    return n;
}

size_t tu_changed(const tu_buf *buf, const tu_buf *snap, size_t *first)
{
    size_t i, n = 0;
    for (i = 0; i < buf->nbytes; i++)
        if (buf->p[i] != snap->p[i]) {
            if (n++ == 0 && first)
                *first = i;
        }
    return n;
}

int64_t *tu_positions(const fusedrope_positions *pos, int64_t seq_len, int64_t batch)
{
    int64_t *p = tu_alloc(sizeof(int64_t) * (size_t)(seq_len * batch + 1));
    ref_positions(pos, seq_len, batch, p);
    return p;
}

int tu_contains(const char *hay, const char *needle)
{
    size_t i, j, n = strlen(needle);
    if (!hay)
        return 0;
    for (i = 0; hay[i]; i++) {
        for (j = 0; j < n && hay[i + j]; j++)
            if (tolower((unsigned char)hay[i + j]) != tolower((unsigned char)needle[j]))
                break;
        if (j == n)
            return 1;
    }
    return n == 0;
}

int tu_skip_default_path(void)
{
#ifdef FR_HAVE_AVX512
    return tu_under_valgrind() && !fr_avx512_usable();
#else
    return 0; /* no vector rows: the default path is the portable one */
#endif
}

void tu_cpu_path(int p)
{
#ifdef FR_HAVE_AVX2
    __atomic_store_n(&fr_avx512_off, p == 1, __ATOMIC_RELAXED);
    __atomic_store_n(&fr_avx2_off, p == 2, __ATOMIC_RELAXED);
#else
    (void)p; /* the portable path is the only one */
#endif
}
