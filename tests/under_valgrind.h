/*
 * under_valgrind.h - whether a test program runs under a memory checker:
 * valgrind (at run time) or a sanitizer (built in), for every test program,
 * with libcheck (through util.h) or without it (the fuzz replays,
 * test_nomem, the emulated-kernel wrappers): tests/under_valgrind.c.
 */
#ifndef FUSEDROPE_TESTS_UNDER_VALGRIND_H
#define FUSEDROPE_TESTS_UNDER_VALGRIND_H

/* Whether the run is under valgrind (make check-valgrind sets VALGRIND): tests
 * then use smaller sizes and longer timeouts. */
int tu_under_valgrind(void);

/* Under valgrind (CI's slowest stage), whether to leave out a variant of a
 * test's matrix: all but those whose parameter indices add up to a multiple
 * of n.  Where one of the summed indices takes n consecutive values for each
 * setting of the others, every setting of the others still runs, once, with
 * that index turning from setting to setting.  make check, distcheck and the
 * sanitizer builds run every variant. */
int tu_valgrind_skips(int index_sum, int n);

/* TU_SANITIZED: 1 in a build with AddressSanitizer, ThreadSanitizer or
 * MemorySanitizer (gcc's macros, clang's __has_feature), else 0. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TU_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TU_SANITIZED 1
#endif
#endif
#ifndef TU_SANITIZED
#define TU_SANITIZED 0
#endif

#endif
