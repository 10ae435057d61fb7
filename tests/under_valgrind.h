/*
 * under_valgrind.h - whether a test program runs under valgrind, for every
 * test program, with libcheck (through util.h) or without it (the fuzz
 * replays, test_nomem, the emulated-kernel wrappers): tests/under_valgrind.c.
 */
#ifndef FUSEDROPE_TESTS_UNDER_VALGRIND_H
#define FUSEDROPE_TESTS_UNDER_VALGRIND_H

/* Whether the run is under valgrind (make check-valgrind sets VALGRIND): tests
 * then use smaller sizes and longer timeouts. */
int tu_under_valgrind(void);

#endif
