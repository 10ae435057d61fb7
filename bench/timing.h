/*
 * timing.h - the clock and the sort order the small benchmark programs in
 * bench/ share (header-only: each program is one file built by hand, as its
 * comment says, with this directory on the include path by being its own).
 */
#ifndef FR_BENCH_TIMING_H
#define FR_BENCH_TIMING_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* qsort's comparison for doubles, ascending (for medians and minima). */
static inline int bench_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
