/*
 * cpu_team.c - the OpenMP teams of the CPU calls and of the cache build:
 * how many threads a call asks for, and what the calling thread does around
 * a parallel region.
 *
 * Around a region, the calling thread computes in the default
 * floating-point environment too (internal.h's bracket): libgomp sizes a
 * team under OMP_DYNAMIC from the load average, in floating point, on that
 * thread, before any worker runs.  And the first team registers a fork
 * handler: libgomp's thread pool does not survive fork(2) (a child's first
 * team waits forever for the parent's threads), so a child forked after
 * this process started a team runs every call, and builds every table, on
 * its calling thread: the same bytes, without a team.
 */
#include "internal.h"

#ifdef _OPENMP
#include <omp.h>
#include <pthread.h>

static int forked_child; /* this process was forked after a team ran */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
    __atomic_store_n(&forked_child, 1, __ATOMIC_RELAXED);
}

static void register_fork_handler(void)
{
    /* glibc unregisters it when a dlopen'ed object holding the archive is
     * closed (pthread_atfork passes that object's __dso_handle) */
    (void)pthread_atfork(NULL, NULL, on_fork_child);
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

void fr_team_enter(fr_fpenv *outer, int nth)
{
#ifdef _OPENMP
    if (nth > 1)
        (void)pthread_once(&fork_once, register_fork_handler);
#else
    (void)nth;
#endif
    fr_fpenv_enter(outer);
}
