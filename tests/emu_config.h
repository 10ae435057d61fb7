/*
 * emu_config.h - which launch configurations an emulated-kernel wrapper
 * (tests/cuda_emu_wrap.c, tests/cuda_norm_emu_wrap.c) runs on a call.
 */
#ifndef FUSEDROPE_TESTS_EMU_CONFIG_H
#define FUSEDROPE_TESTS_EMU_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "under_valgrind.h"

/* Whether to run configuration i of n on call a: all of them; but under
 * valgrind (tu_under_valgrind) or a sanitizer (TU_SANITIZED) one, in turn
 * from the count of calls and the call's shape, since the emulated kernels
 * took most of those stages' time (bench/RESULTS.md).  The memory checkers
 * look for memory errors and undefined behaviour, which one configuration's
 * run shows; that the configurations give the same bytes is checked where
 * all of them run (make check, make distcheck).  The wrapper asks for i =
 * 0, 1, ..., n - 1 in turn on each call. */
static inline int emu_config_runs(size_t i, size_t n, const fr_apply_args *a)
{
    static uint64_t calls;
    if (i == 0)
        calls++;
    const uint64_t key = (uint64_t)(a->seq_len * 31 + a->batch * 7 + a->io[0].heads * 3 +
                                    a->io[0].head_dim + (int64_t)a->dtype);
    return !(TU_SANITIZED || tu_under_valgrind()) || i == (size_t)((calls + key) % n);
}

#endif
