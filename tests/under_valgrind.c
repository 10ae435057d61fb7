/*
 * under_valgrind.c - tu_under_valgrind (see under_valgrind.h), in an object
 * of its own so that programs without libcheck link it from libfrtest.a.
 */
#include "under_valgrind.h"

#include <stdlib.h>

int tu_under_valgrind(void)
{
    const char *v = getenv("VALGRIND");
    return v && *v;
}

int tu_valgrind_skips(int index_sum, int n)
{
    return tu_under_valgrind() && index_sum % n != 0;
}
