/*
 * test_stack.c - the CPU backend on small thread stacks: every OpenMP worker
 * runs with 32 KiB of stack past what a new thread uses before its start
 * routine (OMP_STACKSIZE: the program re-executes itself with it, since the
 * OpenMP runtime reads it at load), and some calls come from a thread with
 * as much.  man/fusedrope_forward.3 promises that 16 KiB of stack
 * per thread is enough for the library's frames (20 KiB with the dynamic
 * loader's on a process's first calls); a frame beyond 32 KiB crashes here.  The calls take
 * the paths whose scratch is on the stack: table-less caches whose rot_dim
 * exceeds one piece of angles (FUSEDROPE_MAX_ROT_DIM, 2050), 16-bit heads on
 * the portable path (fr_avx2_off) and on cpu_avx2.c's, streamed outputs
 * assembled in the row buffer or written directly.  Results are checked
 * against the float64 reference, and table-less ones against the table's to
 * the byte.
 *
 * Under sanitizers, whose frames are larger, and in a build without
 * optimization, the stacks stay the default (the results are still
 * checked): at -O0 every temporary of the forced-inline vector steps keeps
 * its own stack slot, 185-505 KiB a frame (gcc and clang, a reviewer's
 * -fstack-usage, 2026-11-30), and the promise is an optimized build's.
 */
#define _GNU_SOURCE 1 /* pthread_getattr_np */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "internal.h"
#include "util.h"

#define CPU FUSEDROPE_DEVICE_CPU
#if TU_SANITIZED || !defined(__OPTIMIZE__)
#define DEFAULT_STACKS 1 /* (the test is built as the library is) */
#else
#define DEFAULT_STACKS 0
#endif
#define MSG 2048

#define SMALL_STACK (32 * 1024)

/* Under valgrind (its preload in LD_PRELOAD) the cases are 20 times slower,
 * and the stacks are the default ones: a quarter of them run there. */
static int under_valgrind;

static const fusedrope_dtype dtypes[3] = {FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                          FUSEDROPE_BFLOAT16};

typedef struct {
    int rot_dim;
    int64_t S, B, H, D;
    fusedrope_dtype dt;
    fusedrope_style style;
    int backward, inplace, tableless, portable;
} stack_case;

static void set_portable(int on)
{
#ifdef FR_HAVE_AVX2
    __atomic_store_n(&fr_avx2_off, on, __ATOMIC_RELAXED);
#else
    (void)on;
#endif
}

/*
 * A fault says where it fell: the faulting address against the stack of
 * the thread that took it (on a stack of its own, installed on the caller's
 * thread and on each OpenMP worker before every case), so that a crash on a
 * machine no one here can reach tells an overflow of the small stack from
 * any other fault.  On the NVIDIA H100 host (Xeon with AMX, Ubuntu 24.04,
 * glibc 2.39, gcc 13) every case crashed once, and on no machine here; the
 * workers then had a flat OMP_STACKSIZE=32K, which the static CUDA runtime's
 * TLS leaves ~14 KiB of (see main).
 */
static void report_fault(int sig, siginfo_t *si, void *uc)
{
    pthread_attr_t at;
    void *base = NULL;
    size_t size = 0;
    char line[320];
    const char *sp = NULL;
    int n;
#if defined(__x86_64__) && defined(REG_RSP)
    sp = (const char *)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RSP];
#else
    (void)uc;
#endif
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        pthread_attr_getstack(&at, &base, &size);
        pthread_attr_destroy(&at);
    }
    n = snprintf(line, sizeof line,
                 "test_stack: signal %d at %p; this thread's stack [%p, %p), %zu bytes: the "
                 "fault %s; the stack pointer %p\n",
                 sig, si->si_addr, base, (void *)((char *)base + size), size,
                 (char *)si->si_addr >= (char *)base - 65536 && (char *)si->si_addr < (char *)base
                     ? "is just below it (an overflow)"
                     : ((char *)si->si_addr >= (char *)base &&
                        (char *)si->si_addr < (char *)base + size)
                           ? "is inside it"
                           : "is elsewhere",
                 (const void *)sp);
    if (n > 0)
        (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The signal stack of this thread, once (a thread-local flag; the stack
 * lives as long as the thread: the workers' and the test's threads last
 * until the test ends).  Not where the stacks are the default ones
 * (DEFAULT_STACKS, valgrind). */
static void arm_fault_report(void)
{
    static _Thread_local int armed;
    stack_t ss;
    if (DEFAULT_STACKS || under_valgrind || armed)
        return;
    memset(&ss, 0, sizeof ss);
    ss.ss_size = 64 * 1024;
    ss.ss_sp = malloc(ss.ss_size);
    armed = ss.ss_sp != NULL && sigaltstack(&ss, NULL) == 0;
}

static void arm_fault_report_all(void)
{
    arm_fault_report();
#ifdef _OPENMP
#pragma omp parallel
    arm_fault_report();
#endif
}

/* The size of the XSAVE area for the features the OS enabled (CPUID 0xD):
 * what a full save of the register state takes on the stack. */
static unsigned xsave_bytes(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) >= 0xD && __get_cpuid_count(0xD, 0, &a, &b, &c, &d))
        return b;
#endif
    return 0;
}

/* Runs one case with the table cache and the table-less one: both must be
 * within the reference's bound, and equal to the byte. */
static void run_case(const stack_case *c, uint64_t stream)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *ct, *cn;
    ref_rope ref;
    tu_rng r;
    tu_buf xb, xsnap, yb[2];
    fusedrope_tensor x, xorig, y[2];
    int64_t offsets[4] = {3, 70, 64, 100};
    fusedrope_positions P;
    int64_t *positions;
    char what[256], msg[MSG];

    snprintf(what, sizeof what,
             "[seed %llu stream %llu] rot %d S=%lld B=%lld H=%lld D=%lld %s %s %s %s%s",
             (unsigned long long)tu_seed, (unsigned long long)stream, c->rot_dim,
             (long long)c->S, (long long)c->B, (long long)c->H, (long long)c->D,
             ref_dtype_name(c->dt), c->style ? "interleaved" : "neox",
             c->backward ? "backward" : "forward", c->inplace ? "in place" : "out of place",
             c->portable ? " portable rows" : "");
    tu_rng_init(&r, stream);
    arm_fault_report_all();
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, c->rot_dim, 101 + c->S, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &ct), FUSEDROPE_OK);
    tu_track(ct);
    cfg.max_positions = 0;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cn), FUSEDROPE_OK);
    tu_track(cn);
    ck_assert_int_eq(ref_rope_from_config(&ref, &cfg), 0);

    fusedrope_positions_init(&P);
    P.offsets = offsets;
    positions = tu_positions(&P, c->S, c->B);
    x = tu_tensor(LAY_SBHD, c->dt, c->S, c->B, c->H, c->D, &xb);
    tu_fill_random(&xb, &r, -4, 4);
    xsnap = tu_buf_copy(&xb);
    xorig = tu_rebase(&x, &xb, &xsnap);
    set_portable(c->portable);
    for (int k = 0; k < 2; k++) {
        const fusedrope_cache *cache = k ? cn : ct;
        fusedrope_status st;
        int64_t bad;
        if (c->inplace) {
            memcpy(xb.p, xsnap.p, xb.nbytes);
            y[k] = x;
        } else {
            y[k] = tu_tensor(LAY_BSHD, c->dt, c->S, c->B, c->H, c->D, &yb[k]);
        }
        st = c->backward ? fusedrope_backward(cache, c->style, &P, &x, &y[k], NULL)
                         : fusedrope_forward(cache, c->style, &P, &x, &y[k], NULL);
        ck_assert_msg(st == FUSEDROPE_OK, "%s: %s (%s)", what, fusedrope_status_string(st),
                      fusedrope_last_error());
        bad = ref_check_apply(&ref, c->style, positions, &xorig, &y[k], c->backward, msg,
                              sizeof msg);
        ck_assert_msg(bad == 0, "%s, %s cache: %lld bad elements: %s", what,
                      k ? "table-less" : "table", (long long)bad, msg);
        if (c->inplace)
            yb[k] = tu_buf_copy(&xb);
    }
    set_portable(0);
    ck_assert_msg(yb[0].nbytes == yb[1].nbytes && memcmp(yb[0].p, yb[1].p, yb[0].nbytes) == 0,
                  "%s: the table-less cache's output differs from the table's", what);
    ref_rope_free(&ref);
    tu_free_all();
}

/* Cases: i selects dtype, style, direction, placement and shape. */
static void stack_case_of(int i, stack_case *c)
{
    static const struct { int rot; int64_t S, B, H, D; } shp[] = {
        {FUSEDROPE_MAX_ROT_DIM, 3, 2, 3, FUSEDROPE_MAX_ROT_DIM}, /* 16 pieces of angles */
        {2050, 5, 2, 7, 2056},                                   /* several, a 1-pair tail */
        {128, 64, 4, 5, 136},      /* one piece; below the streaming threshold */
        {128, 512, 2, 8, 128},     /* streamed out of place (>= 4 MiB in float32) */
        {1024, 32, 2, 8, 2048},    /* streamed, 8 KiB float32 rows: the row buffer */
    };
    memset(c, 0, sizeof *c);
    c->dt = dtypes[i % 3]; i /= 3;
    c->style = (fusedrope_style)(i % 2); i /= 2;
    c->inplace = i % 2; i /= 2;
    c->backward = (c->inplace + (int)c->style + (int)c->dt) % 2; /* both, over the dtypes */
    c->portable = i % 2; i /= 2;
    c->rot_dim = shp[i % 5].rot;
    c->S = shp[i % 5].S;
    c->B = shp[i % 5].B;
    c->H = shp[i % 5].H;
    c->D = shp[i % 5].D;
}
#define NCASES (3 * 2 * 2 * 2 * 5)

START_TEST(test_workers_small_stack)
{
    stack_case c;
    /* under valgrind, where main does not start the program again with
     * OMP_STACKSIZE and the workers keep their default stacks (this test
     * then checks memory only), one case of each shape */
    if (under_valgrind && _i % 6 != _i / 6)
        return;
    tu_threads(3); /* items split inside tokens */
    for (int v = 0; v < (under_valgrind ? 1 : 4); v++) {
        const int k = _i * 4 + (v + _i) % 4; /* under valgrind: each group's k differs */
        stack_case_of(k, &c);
        run_case(&c, 100 + (uint64_t)k);
    }
}
END_TEST

typedef struct {
    int first;
    int done;
} thread_arg;

static void *caller(void *p)
{
    thread_arg *a = p;
    stack_case c;
    tu_threads(2);
    for (int v = 0; v < 6; v += under_valgrind ? 4 : 1) {
        stack_case_of(a->first + 2 * v, &c); /* every other case: all shapes */
        run_case(&c, 5000 + (uint64_t)(a->first + 2 * v));
    }
    a->done = 1;
    return NULL;
}

/* glibc carves a thread's static TLS (and its descriptor) out of the stack
 * size it is given, and the library may be linked with runtimes that have
 * a lot of it (the static CUDA runtime): what a new thread has used before
 * its start routine runs, measured on a thread of known stack size. */
static void *probe(void *p)
{
    pthread_attr_t at;
    void *base;
    size_t size;
    char here;
    if (pthread_getattr_np(pthread_self(), &at) != 0)
        return NULL;
    if (pthread_attr_getstack(&at, &base, &size) == 0)
        *(size_t *)p = (size_t)((char *)base + size - &here);
    pthread_attr_destroy(&at);
    return NULL;
}

/* 0 where it cannot be measured (then the stacks are SMALL_STACK). */
static size_t thread_overhead(void)
{
    pthread_t th;
    size_t used = 0;
    if (pthread_create(&th, NULL, probe, &used) != 0 || pthread_join(th, NULL) != 0)
        return 0;
    return used;
}

/* A small-stack thread's stack: SMALL_STACK past what a thread uses before
 * its start routine, or the platform's least where that is more
 * (PTHREAD_STACK_MIN: 128 KiB on AArch64 Linux, whose pthread_attr_setstacksize
 * and libgomp refuse less; there the frames' promise is not tested at 32 KiB). */
static size_t small_stack_size(void)
{
    size_t size = SMALL_STACK + thread_overhead();
    const long least = sysconf(_SC_THREAD_STACK_MIN);
    if (least > 0 && (size_t)least > size)
        size = (size_t)least;
    return size;
}

/* The caller's own thread has SMALL_STACK bytes of stack for its frames
 * (plus what the thread uses before them): it runs a share of the items as
 * OpenMP's master thread. */
START_TEST(test_caller_small_stack)
{
    pthread_attr_t attr;
    pthread_t th;
    thread_arg a = {_i * 12, 0};
    int e;
    if (under_valgrind && _i % 2) /* two cases of each shape */
        return;
    ck_assert_int_eq(pthread_attr_init(&attr), 0);
    if (!DEFAULT_STACKS) {
        const size_t size = small_stack_size();
        e = pthread_attr_setstacksize(&attr, size);
        ck_assert_msg(e == 0, "pthread_attr_setstacksize(%zu): %s", size, strerror(e));
    }
    ck_assert_int_eq(pthread_create(&th, &attr, caller, &a), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    pthread_attr_destroy(&attr);
    ck_assert(a.done); /* a failed check in the thread exits the forked test */
}
END_TEST

static Suite *stack_suite(void)
{
    Suite *s = suite_create("stack");
    TCase *tc = tcase_create("stack");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_workers_small_stack, 0, NCASES / 4);
    tcase_add_loop_test(tc, test_caller_small_stack, 0, NCASES / 6 / 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    (void)argc;
    /* The OpenMP runtime reads OMP_STACKSIZE when it loads: set it, then start
     * this program again. */
    /* Not under valgrind (its preload in LD_PRELOAD): the new image would run
     * outside it. */
    const char *preload = getenv("LD_PRELOAD");
    under_valgrind = preload && strstr(preload, "vgpreload");
    if (!DEFAULT_STACKS && !getenv("FUSEDROPE_TEST_STACK_CHILD") && !under_valgrind) {
        /* the workers' stacks too leave SMALL_STACK past what a thread uses
         * before its start routine (the static CUDA runtime's TLS alone is
         * 8 KiB on 4 KiB alignment): 32K flat crashed on the H100 host */
        char kib[32];
        snprintf(kib, sizeof kib, "%zuK", (small_stack_size() + 1023) / 1024);
        setenv("OMP_STACKSIZE", kib, 1);
        setenv("FUSEDROPE_TEST_STACK_CHILD", "1", 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "test_stack: cannot re-execute itself (%s); default stacks\n",
                strerror(errno));
    }
    if (!DEFAULT_STACKS) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = report_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
    }
    printf("test_stack: XSAVE area %u bytes (CPUID 0xD)\n", xsave_bytes());
    printf("test_stack: OMP_STACKSIZE=%s, caller threads of %s; a new thread uses %zu bytes "
           "of its stack before its start routine; small stacks of %zu bytes\n",
           getenv("OMP_STACKSIZE") ? getenv("OMP_STACKSIZE") : "(default)",
           TU_SANITIZED ? "default stack (sanitizer build)"
           : DEFAULT_STACKS ? "default stack (a build without optimization)" : "32 KiB past that",
           thread_overhead(), small_stack_size());
    if (under_valgrind)
        printf("test_stack: under valgrind, a twelfth of the cases\n");
    return tu_main(stack_suite(), "test_stack");
}
