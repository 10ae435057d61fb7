/*
 * run_seed.c - tu_run_seed (see run_seed.h), in an object of its own so that
 * programs without libcheck link it from libfrtest.a.
 */
#include "run_seed.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int tu_run_seed(const char *prog, uint64_t *seed)
{
    const char *env = getenv("FUSEDROPE_TEST_SEED");
    char *end;
    if (!env || !*env) {
        *seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
        return 0;
    }
    errno = 0;
    *seed = strtoull(env, &end, 0);
    if (*end || errno || *env == '-') {
        fprintf(stderr, "%s: FUSEDROPE_TEST_SEED=%s is not a seed (an unsigned 64-bit number)\n",
                prog, env);
        return -1;
    }
    return 0;
}
