/*
 * cpu_team.c - the OpenMP teams of the CPU calls and of the cache build:
 * how many threads a call asks for, and what the calling thread does around
 * a parallel region.
 *
 * Around a region, the calling thread computes in the default
 * floating-point environment too (internal.h's bracket): libgomp sizes a
 * team under OMP_DYNAMIC from the load average, in floating point, on that
 * thread, before any worker runs.
 *
 * Two things GNU libgomp does not survive, which a plugin host does:
 * - fork(2): its thread pool is not recreated in the child, whose first
 *   team waits forever for the parent's threads.  The pool may be the
 *   library's, the host's, or another copy of the library's (a second
 *   plugin, or this one closed and loaded again), so a handler registered
 *   when this copy loads looks at the parent as it forks: a child of a
 *   process that ran more than one thread runs every call, and builds every
 *   table, on its calling thread (the same bytes, without a team).
 * - dlclose of the object that loaded it while its pool threads live: they
 *   run on in unmapped code (a plugin closed after a call with a team
 *   crashes its host).  So this copy, as it loads, keeps the OpenMP runtime
 *   loaded for the life of the process (RTLD_NODELETE), as a host linked
 *   with it would.
 */
#define _GNU_SOURCE 1 /* dladdr, RTLD_NODELETE */
#include "internal.h"

#ifdef _OPENMP
#include <dlfcn.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

/* Weak: a static executable has no dynamic loader to ask (and no runtime to
 * unload), and a link that does not bring dlopen in otherwise keeps without
 * it rather than draw glibc's static-dlopen warning. */
#pragma weak dladdr
#pragma weak dlopen

static int forked_child;   /* a child of a process that ran other threads */
static int parent_threads; /* the forking process's threads (the prepare handler's) */

/* The process's threads, from /proc/self/stat (the 18th field after the
 * command name); 0 where it cannot be read (taken for many).  Only
 * async-signal-safe calls: it runs as fork(2) begins. */
static int process_threads(void)
{
    char buf[1024];
    ssize_t n;
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC), field = 0, threads = 0;
    const char *p;
    if (fd < 0)
        return 0;
    n = read(fd, buf, sizeof buf - 1);
    (void)close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
    if (!p)
        return 0;
    for (p++; *p && field < 18; p++)
        if (*p == ' ')
            field++;
    for (; *p >= '0' && *p <= '9'; p++)
        threads = threads * 10 + (*p - '0');
    return field == 18 ? threads : 0;
}

static void on_fork_prepare(void)
{
    __atomic_store_n(&parent_threads, process_threads(), __ATOMIC_RELAXED);
}

static void on_fork_child(void)
{
    if (__atomic_load_n(&parent_threads, __ATOMIC_RELAXED) != 1)
        __atomic_store_n(&forked_child, 1, __ATOMIC_RELAXED);
}

/* As this copy loads (a constructor of the archive's object that every
 * call needs, or of the shared library). */
__attribute__((constructor)) static void fr_team_load(void)
{
    /* glibc unregisters it when a dlopen'ed object holding the archive is
     * closed (pthread_atfork passes that object's __dso_handle) */
    (void)pthread_atfork(on_fork_prepare, NULL, on_fork_child);
    if (dladdr && dlopen) {
        int (*const fn)(void) = omp_get_max_threads;
        void *addr;
        Dl_info info;
        memcpy(&addr, &fn, sizeof addr); /* (ISO C has no function-to-object cast) */
        if (dladdr(addr, &info) && info.dli_fname && info.dli_fname[0])
            (void)dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    }
}
#endif

_Thread_local int fr_cpu_team;
int fr_team_all;

int fr_cpu_team_size(const fusedrope_cache *cache, int64_t elems)
{
#ifdef _OPENMP
    const int all = __atomic_load_n(&fr_team_all, __ATOMIC_RELAXED);
    if (__atomic_load_n(&forked_child, __ATOMIC_RELAXED))
        return 1;
    if (all > 0)
        return all;
    if (elems >= FR_TEAM_MIN_ELEMS)
        return cache->num_threads > 0 ? cache->num_threads : omp_get_max_threads();
#else
    (void)cache;
#endif
    (void)elems;
    return 1;
}

int fr_cpu_needs_team(int nth)
{
#ifdef _OPENMP
    return nth > 1 || omp_in_parallel();
#else
    (void)nth;
    return 0;
#endif
}
