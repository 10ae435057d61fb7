/*
 * run_seed.h - the seed of a test run's random cases, for every test
 * program, with libcheck (tu_main) or without it (the fuzz replays):
 * tests/run_seed.c.
 */
#ifndef FUSEDROPE_TESTS_RUN_SEED_H
#define FUSEDROPE_TESTS_RUN_SEED_H

#include <stdint.h>

/* *seed = FUSEDROPE_TEST_SEED where it is set, else a new seed from the
 * time and the process id.  -1 (and a sentence on stderr naming prog)
 * when the variable is not an unsigned 64-bit number. */
int tu_run_seed(const char *prog, uint64_t *seed);

#endif
