# libcheck suites and the float64 reference they share.  Each suite is its own
# program so that `make -j check` runs them in parallel.
TEST_COMMON_SOURCES = tests/ref.c tests/ref.h tests/util.c tests/util.h

if HAVE_CHECK
check_PROGRAMS += tests/test_cache tests/test_apply tests/test_errors tests/test_cpu_rows
TESTS += tests/test_cache tests/test_apply tests/test_errors tests/test_cpu_rows

tests_test_cache_SOURCES = tests/test_cache.c $(TEST_COMMON_SOURCES)
tests_test_cache_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cache_LDADD = $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_cache_DEPENDENCIES = libfusedrope.a

tests_test_apply_SOURCES = tests/test_apply.c $(TEST_COMMON_SOURCES)
tests_test_apply_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_apply_LDADD = $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_apply_DEPENDENCIES = libfusedrope.a

tests_test_errors_SOURCES = tests/test_errors.c $(TEST_COMMON_SOURCES)
tests_test_errors_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -pthread
tests_test_errors_LDFLAGS = -pthread
tests_test_errors_LDADD = $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_errors_DEPENDENCIES = libfusedrope.a

tests_test_cpu_rows_SOURCES = tests/test_cpu_rows.c
tests_test_cpu_rows_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cpu_rows_LDADD = $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_cpu_rows_DEPENDENCIES = libfusedrope.a
else
check_SCRIPTS = tests/no-libcheck.sh
TESTS += tests/no-libcheck.sh
CLEANFILES += tests/no-libcheck.sh

tests/no-libcheck.sh:
	@$(MKDIR_P) tests
	$(AM_V_GEN)printf '%s\n' '#!/bin/sh' \
	  'echo "libcheck not found; install it (Debian: apt-get install check) and rerun configure" >&2' \
	  'exit 1' > $@ && chmod +x $@
endif
