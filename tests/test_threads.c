/*
 * test_threads.c - one cache used at once from 8 threads.
 *
 * Every thread runs the same forward, backward, forward_qk and backward_qk
 * calls (every dtype, sbhd/bshd/thd, implicit/offsets/ids/cu_seqlens/CP
 * positions, in place and out of place, a table cache and a table-less one)
 * into its own outputs, several times over, and compares the bytes with a
 * single-threaded run made first; once with OpenMP as configured in every
 * thread, once with omp_set_num_threads(1) in every thread.  A third test
 * checks that fusedrope_last_error() is per thread: each thread fails with
 * its own bad value, and no thread ever sees another thread's detail.
 *
 * The ThreadSanitizer build runs this test too (README, "Reliability").
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fusedrope.h"
#include "internal.h" /* fr_cpu_team: the team of this thread's last call */
#include "util.h"

#define NTHREADS 8

enum { J_FWD, J_BWD, J_FWD_QK, J_BWD_QK };

typedef struct {
    int kind;
    const fusedrope_cache *cache;
    fusedrope_style style;
    fusedrope_dtype dt;
    int layout;            /* 0 sbhd, 1 bshd, 2 thd */
    int64_t s, b, hq, hk, d;
    int in_place;
    fusedrope_positions pos;
    int has_pos;
    unsigned char *in[2];  /* shared, read-only (out of place) */
    size_t bytes[2];
    unsigned char *want[2];/* the single-threaded result */
} job;

static fusedrope_cache *cache_table, *cache_free;
static job jobs[8];
static int njobs;
static int iters;
static int64_t ids_buf[256], offs_buf[4];
static int32_t cu_buf[4] = { 0, 40, 40, 128 };

static fusedrope_tensor view(const job *j, int k, void *data)
{
    int64_t h = k ? j->hk : j->hq;
    if (j->layout == 0)
        return fusedrope_tensor_sbhd(data, j->dt, j->s, j->b, h, j->d);
    if (j->layout == 1)
        return fusedrope_tensor_bshd(data, j->dt, j->b, j->s, h, j->d);
    return fusedrope_tensor_thd(data, j->dt, j->s, h, j->d);
}

/* Runs job j into out[0..1] (which hold a copy of the input when in place). */
static fusedrope_status run(const job *j, unsigned char *out[2])
{
    fusedrope_tensor x0 = view(j, 0, j->in_place ? out[0] : j->in[0]);
    fusedrope_tensor y0 = view(j, 0, out[0]);
    fusedrope_tensor x1 = view(j, 1, j->in_place ? out[1] : j->in[1]);
    fusedrope_tensor y1 = view(j, 1, out[1]);
    const fusedrope_positions *p = j->has_pos ? &j->pos : NULL;
    switch (j->kind) {
    case J_FWD: return fusedrope_forward(j->cache, j->style, p, &x0, &y0, NULL);
    case J_BWD: return fusedrope_backward(j->cache, j->style, p, &x0, &y0, NULL);
    case J_FWD_QK: return fusedrope_forward_qk(j->cache, j->style, p, &x0, &y0, &x1, &y1, NULL);
    default: return fusedrope_backward_qk(j->cache, j->style, p, &x0, &y0, &x1, &y1, NULL);
    }
}

static void prepare(job *j)
{
    int n = j->kind >= J_FWD_QK ? 2 : 1;
    tu_rng r;
    tu_rng_init(&r, (uint64_t)(j - jobs + 1));
    for (int k = 0; k < n; k++) {
        int64_t h = k ? j->hk : j->hq;
        j->bytes[k] = (size_t)(j->s * j->b * h * j->d) * ref_dtype_size(j->dt);
        j->in[k] = malloc(j->bytes[k]);
        j->want[k] = malloc(j->bytes[k]);
        ck_assert(j->in[k] && j->want[k]);
        /* values in [-2, 2] from the run's seed, a stream per job */
        tu_fill(j->in[k], (int64_t)(j->bytes[k] / ref_dtype_size(j->dt)), j->dt, &r, -2, 2);
    }
}

static void setup(void)
{
    fusedrope_cache_config cfg;
    int big = !tu_under_valgrind();
    /* token counts: 64 x 2 (sbhd/bshd), 128 (thd); 8 q heads x 128 channels
     * = 131072 elements per tensor, past the OpenMP backend's threshold */
    int64_t s = big ? 64 : 16, hq = big ? 8 : 2;
    iters = big ? 3 : 1;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, 96, 512, 10000.0);
    cfg.factor = 8;
    cfg.original_max_positions = 128;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache_table), FUSEDROPE_OK);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LLAMA3, 128, 0, 500000.0);
    cfg.factor = 8;
    cfg.original_max_positions = 64;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache_free), FUSEDROPE_OK);
    for (int i = 0; i < 256; i++)
        ids_buf[i] = (i * 37) % 500;
    offs_buf[0] = 7;
    offs_buf[1] = 300;
    offs_buf[2] = 11;
    cu_buf[3] = (int32_t)(2 * s);
    cu_buf[1] = cu_buf[2] = (int32_t)(s / 2 + 8);

    njobs = 0;
    /* forward, f32, sbhd, implicit, table */
    jobs[njobs++] = (job){ J_FWD, cache_table, FUSEDROPE_NEOX, FUSEDROPE_FLOAT32, 0, s, 2, hq, 0, 128,
                           0, { 0 }, 0, { 0 }, { 0 }, { 0 } };
    /* backward, bf16, bshd, offsets, in place */
    jobs[njobs] = (job){ J_BWD, cache_table, FUSEDROPE_INTERLEAVED, FUSEDROPE_BFLOAT16, 1, s, 2, hq,
                         0, 128, 1, { 0 }, 1, { 0 }, { 0 }, { 0 } };
    jobs[njobs].pos = (fusedrope_positions){
        .struct_size = sizeof(fusedrope_positions), .offsets = offs_buf };
    njobs++;
    /* forward_qk, f16, thd with cu_seqlens (an empty sequence too), GQA */
    jobs[njobs] = (job){ J_FWD_QK, cache_table, FUSEDROPE_NEOX, FUSEDROPE_FLOAT16, 2, 2 * s, 1, hq,
                         2, 128, 0, { 0 }, 1, { 0 }, { 0 }, { 0 } };
    jobs[njobs].pos = (fusedrope_positions){
        .struct_size = sizeof(fusedrope_positions), .cu_seqlens = cu_buf, .num_seqs = 3 };
    njobs++;
    /* backward_qk, f32, sbhd, ids */
    jobs[njobs] = (job){ J_BWD_QK, cache_table, FUSEDROPE_NEOX, FUSEDROPE_FLOAT32, 0, s, 2, hq, 4,
                         128, 0, { 0 }, 1, { 0 }, { 0 }, { 0 } };
    jobs[njobs].pos = (fusedrope_positions){
        .struct_size = sizeof(fusedrope_positions), .ids = ids_buf };
    njobs++;
    /* forward, bf16, bshd, context parallelism 4 rank 1, table-less cache, in place */
    jobs[njobs] = (job){ J_FWD, cache_free, FUSEDROPE_INTERLEAVED, FUSEDROPE_BFLOAT16, 1, s, 2, hq,
                         0, 128, 1, { 0 }, 1, { 0 }, { 0 }, { 0 } };
    jobs[njobs].pos = (fusedrope_positions){
        .struct_size = sizeof(fusedrope_positions), .cp_size = 4, .cp_rank = 1 };
    njobs++;
    /* backward_qk, f16, thd, table-less, implicit */
    jobs[njobs++] = (job){ J_BWD_QK, cache_free, FUSEDROPE_NEOX, FUSEDROPE_FLOAT16, 2, 2 * s, 1, hq,
                           1, 128, 0, { 0 }, 0, { 0 }, { 0 }, { 0 } };

    /* the single-threaded reference */
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    for (int i = 0; i < njobs; i++) {
        job *j = &jobs[i];
        fusedrope_status st;
        prepare(j);
        if (j->in_place)
            for (int k = 0; k < 2; k++)
                if (j->in[k])
                    memcpy(j->want[k], j->in[k], j->bytes[k]);
        st = run(j, j->want);
        ck_assert_msg(st == FUSEDROPE_OK, "job %d: %s", i, fusedrope_last_error());
    }
}

static void teardown(void)
{
    for (int i = 0; i < njobs; i++)
        for (int k = 0; k < 2; k++) {
            free(jobs[i].in[k]);
            free(jobs[i].want[k]);
        }
    memset(jobs, 0, sizeof jobs);
    fusedrope_cache_destroy(cache_table);
    fusedrope_cache_destroy(cache_free);
    cache_table = cache_free = NULL;
}

typedef struct {
    int id, omp_one;
    pthread_barrier_t *bar;
    char failure[1024];
} targ;

static void *worker(void *p)
{
    targ *a = p;
    unsigned char *out[8][2];
#ifdef _OPENMP
    if (a->omp_one)
        omp_set_num_threads(1);
#endif
    for (int i = 0; i < njobs; i++)
        for (int k = 0; k < 2; k++)
            out[i][k] = jobs[i].bytes[k] ? malloc(jobs[i].bytes[k]) : NULL;
    pthread_barrier_wait(a->bar); /* all threads call at once */
    for (int it = 0; it < iters && !a->failure[0]; it++)
        for (int n = 0; n < njobs && !a->failure[0]; n++) {
            int i = (n + a->id) % njobs; /* threads run different jobs at a time */
            const job *j = &jobs[i];
            fusedrope_status st;
            for (int k = 0; k < 2; k++) {
                if (!j->bytes[k])
                    continue;
                if (j->in_place)
                    memcpy(out[i][k], j->in[k], j->bytes[k]);
                else
                    memset(out[i][k], 0xA5, j->bytes[k]);
            }
            st = run(j, out[i]);
            if (st != FUSEDROPE_OK)
                snprintf(a->failure, sizeof a->failure, "thread %d job %d: status %d (%s)", a->id,
                         i, st, fusedrope_last_error());
            for (int k = 0; k < 2 && !a->failure[0]; k++)
                if (j->bytes[k] && memcmp(out[i][k], j->want[k], j->bytes[k]) != 0)
                    snprintf(a->failure, sizeof a->failure,
                             "thread %d iteration %d job %d tensor %d: bytes differ from the "
                             "single-threaded run",
                             a->id, it, i, k);
        }
    for (int i = 0; i < njobs; i++)
        for (int k = 0; k < 2; k++)
            free(out[i][k]);
    return NULL;
}

static void shared_cache(int omp_one)
{
    pthread_t th[NTHREADS];
    targ a[NTHREADS];
    pthread_barrier_t bar;
    ck_assert_int_eq(pthread_barrier_init(&bar, NULL, NTHREADS), 0);
    for (int t = 0; t < NTHREADS; t++) {
        a[t] = (targ){ t, omp_one, &bar, "" };
        ck_assert_int_eq(pthread_create(&th[t], NULL, worker, &a[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    for (int t = 0; t < NTHREADS; t++)
        ck_assert_msg(a[t].failure[0] == 0, "%s", a[t].failure);
}

START_TEST(shared_cache_openmp)
{
    shared_cache(0);
}
END_TEST

START_TEST(shared_cache_one_omp_thread)
{
    shared_cache(1);
}
END_TEST

/* ------------------------------------------------- per-thread error detail */

static void *err_worker(void *p)
{
    targ *a = p;
    char mine[64], got[600];
    float buf[4 * 128];
    fusedrope_tensor t = fusedrope_tensor_sbhd(buf, FUSEDROPE_FLOAT32, 4, 1, 1, 128);
    fusedrope_status st;
    memset(buf, 0, sizeof buf);
    snprintf(mine, sizeof mine, "%d", 1000 + a->id);
    /* a fresh thread has no detail */
    if (fusedrope_last_error()[0])
        snprintf(a->failure, sizeof a->failure, "thread %d starts with detail \"%s\"", a->id,
                 fusedrope_last_error());
    pthread_barrier_wait(a->bar);
    for (int round = 0; round < 50 && !a->failure[0]; round++) {
        if (a->id != 0) {
            /* a failure naming this thread's own value */
            st = fusedrope_forward(cache_table, (fusedrope_style)(1000 + a->id), NULL, &t, &t, NULL);
            if (st != FUSEDROPE_ERR_INVALID || !strstr(fusedrope_last_error(), mine))
                snprintf(a->failure, sizeof a->failure,
                         "thread %d: style %s gave status %d, detail \"%s\"", a->id, mine, st,
                         fusedrope_last_error());
        }
        if (round == 0)
            pthread_barrier_wait(a->bar); /* every thread has failed once */
        /* successful calls leave the detail as it was */
        st = fusedrope_forward(cache_table, FUSEDROPE_NEOX, NULL, &t, &t, NULL);
        snprintf(got, sizeof got, "%s", fusedrope_last_error());
        if (st != FUSEDROPE_OK)
            snprintf(a->failure, sizeof a->failure, "thread %d: a good call failed: %.600s", a->id, got);
        else if (a->id == 0 && got[0])
            snprintf(a->failure, sizeof a->failure,
                     "thread 0 never failed but sees the detail \"%.600s\"", got);
        else if (a->id != 0 && !strstr(got, mine))
            snprintf(a->failure, sizeof a->failure,
                     "thread %d failed with style %s but sees the detail \"%.600s\"", a->id, mine, got);
    }
    return NULL;
}

START_TEST(last_error_is_per_thread)
{
    pthread_t th[NTHREADS];
    targ a[NTHREADS];
    pthread_barrier_t bar;
    ck_assert_int_eq(pthread_barrier_init(&bar, NULL, NTHREADS), 0);
    for (int t = 0; t < NTHREADS; t++) {
        a[t] = (targ){ t, 0, &bar, "" };
        ck_assert_int_eq(pthread_create(&th[t], NULL, err_worker, &a[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    for (int t = 0; t < NTHREADS; t++)
        ck_assert_msg(a[t].failure[0] == 0, "%s", a[t].failure);
}
END_TEST

/* A process forks after the library ran teams (the table build and the
 * calls below): libgomp's pool does not survive fork(2), and the child's
 * first team waited forever for the parent's threads (a reviewer's
 * reproducer, 2026-11-30).  The child must build the same table and get
 * the same bytes, on its calling thread (fr_cpu_team 0); the parent's teams
 * go on as before.  alarm() turns a hang into a failure. */
typedef struct {
    fusedrope_cache *cache;
    unsigned char *y, *yn;    /* the forward's and the norm's outputs, n bytes each */
    float *table;             /* cos then sin, nt floats */
    size_t n, nt;
    int team_call, team_norm;
} fork_run;

static void fork_calls(fork_run *r)
{
    enum { S = 64, B = 2, H = 8, D = 128, ROWS = 4096 }; /* 131072 elements; 262144 entries */
    const size_t n = (size_t)S * B * H * D * 2;
    fusedrope_cache_config cfg;
    fusedrope_norm nm;
    uint16_t *x = tu_alloc(n);
    tu_rng g;
    r->n = n;
    r->nt = (size_t)ROWS * D;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, ROWS, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &r->cache), FUSEDROPE_OK);
    tu_track(r->cache);
    r->table = tu_alloc(r->nt * sizeof(float));
    ck_assert_int_eq(fusedrope_cache_copy_table(r->cache, r->table, r->table + r->nt / 2),
                     FUSEDROPE_OK);
    tu_rng_init(&g, 77);
    tu_fill(x, (int64_t)(n / 2), FUSEDROPE_BFLOAT16, &g, -1.0, 1.0);
    r->y = tu_alloc(n);
    r->yn = tu_alloc(n);
    {
        const fusedrope_tensor tx = fusedrope_tensor_sbhd(x, FUSEDROPE_BFLOAT16, S, B, H, D);
        const fusedrope_tensor ty = fusedrope_tensor_sbhd(r->y, FUSEDROPE_BFLOAT16, S, B, H, D);
        const fusedrope_tensor tn = fusedrope_tensor_sbhd(r->yn, FUSEDROPE_BFLOAT16, S, B, H, D);
        ck_assert_int_eq(fusedrope_forward(r->cache, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL),
                         FUSEDROPE_OK);
        r->team_call = fr_cpu_team;
        fusedrope_norm_init(&nm);
        ck_assert_int_eq(fusedrope_norm_forward_qk(r->cache, FUSEDROPE_NEOX, NULL, &nm, &tx, &tn,
                                                   NULL, NULL, NULL),
                         FUSEDROPE_OK);
        r->team_norm = fr_cpu_team;
    }
}

/* Whether this process runs one thread now (the /proc/self/task entries). */
static int one_thread(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    if (!d)
        return 0;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n == 1;
}

/* The child of a fork (under child_alarm): fork_calls, its bytes against
 * want's and its teams against team (0: on the calling thread); exits with
 * the verdict. */
static void child_calls(const fork_run *want, int team)
{
    fork_run child;
    fork_calls(&child);
    if (memcmp(child.table, want->table, want->nt * sizeof(float)) != 0 ||
        memcmp(child.y, want->y, want->n) != 0 || memcmp(child.yn, want->yn, want->n) != 0) {
        fprintf(stderr, "the forked child's table or outputs differ from the parent's\n");
        _exit(1);
    }
    if (child.team_call != team || child.team_norm != team) {
        fprintf(stderr, "the forked child's calls ran on teams of %d and %d, not %d\n",
                child.team_call, child.team_norm, team);
        _exit(2);
    }
    _exit(0);
}

/* A child's first step: a hang becomes SIGALRM. */
static void child_alarm(void)
{
    alarm(tu_under_valgrind() ? 300 : 30);
}

static void wait_child(pid_t pid)
{
    int status = 0;
    ck_assert_int_ge(pid, 0);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(!WIFSIGNALED(status), "the forked child died of signal %d%s", WTERMSIG(status),
                  WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
    ck_assert_msg(WEXITSTATUS(status) == 0, "the forked child failed (exit %d)",
                  WEXITSTATUS(status));
}

/* Forks; the child (under child_alarm) runs child_calls against want's
 * bytes (NULL: against a first run of its own) and team; the parent waits
 * for its verdict. */
static void fork_check(const fork_run *want, int team)
{
    pid_t pid;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        fork_run first;
        child_alarm();
        if (!want) {
            fork_calls(&first);
            want = &first;
        }
        child_calls(want, team);
    }
    wait_child(pid);
}

START_TEST(calls_after_fork)
{
    fork_run parent, again;
    tu_threads(2);
    fork_calls(&parent);
#ifdef _OPENMP
    ck_assert_msg(parent.team_call == 2 && parent.team_norm == 2,
                  "the parent's calls ran on teams of %d and %d, not 2: the test would fork a "
                  "process without a thread pool", parent.team_call, parent.team_norm);
#endif
    fork_check(&parent, 0);
    /* and the parent's teams still run */
    fork_calls(&again);
#ifdef _OPENMP
    ck_assert_int_eq(again.team_call, 2);
#endif
    ck_assert(memcmp(again.y, parent.y, parent.n) == 0);
    tu_free_all();
}
END_TEST

/* The thread pool a child cannot use may be the host's, or another copy's
 * of the library (a second plugin, or this one closed and loaded again):
 * here the test program's own team, before this process's library started
 * any (in libcheck's fork mode; without it, earlier tests' teams are
 * there too).  The child hung on its first team (a reviewer's reproducer,
 * two plugins and a fork, 2026-11-30). */
START_TEST(calls_after_host_team_fork)
{
    fork_run want;
    tu_threads(2);
#ifdef _OPENMP
    int team = 0;
#pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 0) /* not `omp master`: deprecated in OpenMP 5.1 */
            team = omp_get_num_threads();
    }
    ck_assert_int_eq(team, 2);
#endif
    fork_check(NULL, 0); /* the parent's bytes: computed in the child too */
    fork_calls(&want);      /* and the parent's teams still run */
#ifdef _OPENMP
    ck_assert_int_eq(want.team_call, 2);
#endif
    tu_free_all();
}
END_TEST

/* A process that runs one thread as it forks has no pool to lose: its
 * child keeps its teams. */
START_TEST(single_thread_fork_keeps_teams)
{
    tu_threads(2);
    if (!one_thread()) {
        printf("single_thread_fork_keeps_teams: this process runs other threads (libcheck's "
               "no-fork mode, or valgrind); skipped\n");
        return;
    }
#ifdef _OPENMP
    fork_check(NULL, 2);
#else
    fork_check(NULL, 0);
#endif
    tu_free_all();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("threads");
    TCase *tf = tcase_create("fork");
    TCase *tc = tcase_create("shared cache");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, tu_under_valgrind() ? 600 : 60);
    tcase_add_test(tc, shared_cache_openmp);
    tcase_add_test(tc, shared_cache_one_omp_thread);
    tcase_add_test(tc, last_error_is_per_thread);
    suite_add_tcase(s, tc);
    tcase_set_timeout(tf, tu_under_valgrind() ? 600 : 60);
    tcase_add_test(tf, calls_after_fork);
    tcase_add_test(tf, calls_after_host_team_fork);
    tcase_add_test(tf, single_thread_fork_keeps_teams);
    suite_add_tcase(s, tf);
    return tu_main(s, "test_threads");
}
