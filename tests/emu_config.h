/*
 * emu_config.h - which launch configurations an emulated-kernel wrapper
 * (tests/cuda_emu_wrap.c, tests/cuda_norm_emu_wrap.c) runs on a call.
 */
#ifndef FUSEDROPE_TESTS_EMU_CONFIG_H
#define FUSEDROPE_TESTS_EMU_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "under_valgrind.h"

/* Whether to run configuration i of n on a call whose shape gives key: all
 * of them; but under valgrind (tu_under_valgrind) the
 * first and one of the others, in turn from the call's count and key, since
 * the emulated kernels took most of that stage's time.  The wrapper asks
 * for i = 0 first on each call. */
static inline int emu_config_runs(size_t i, size_t n, uint64_t key)
{
    static uint64_t calls;
    if (i == 0) {
        calls++;
        return 1;
    }
    return !tu_under_valgrind() || i == 1 + (size_t)((calls + key) % (n - 1));
}

#endif
