/*
 * c99_main.c - a C99 program using the installed library (with wrap.c, both
 * built with -std=c99 -pedantic -Wall -Wextra -Werror); also the program of
 * the two CMake consumer projects.
 */
#include "consumer.h"
#include "wrap.h"

#ifndef CONSUMER_NAME
#define CONSUMER_NAME "c99"
#endif

int main(void)
{
    printf("%s: libfusedrope %s\n", CONSUMER_NAME, wrap_rope_version());
    return consumer_check(CONSUMER_NAME, wrap_rope_forward) ? 1 : 0;
}
