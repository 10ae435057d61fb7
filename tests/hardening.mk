# Hardening (issue 7): the fuzz harness and its corpus replay, shared use
# from many threads, determinism, allocation failure in the cache, and the
# valgrind run's settings.  Included from the top Makefile.am; paths are
# relative to the top directory.

# ---------------------------------------------------------------- fuzzing
# tests/fuzz/fuzz_apply.c is a libFuzzer target.  Every build runs it over
# the seed corpus, the regression inputs and a few hundred pseudo-random
# inputs through a plain main (tests/fuzz/replay.c), so the harness and what
# it has found stay tested under make check, the sanitizer build and
# valgrind.  With ./configure CC=clang --enable-fuzzing it is also linked
# with libFuzzer, and `make fuzz` runs it for $(FUZZ_TIME) seconds.
check_PROGRAMS += tests/fuzz/fuzz_replay
TESTS += tests/fuzz/fuzz_replay
tests_fuzz_fuzz_replay_SOURCES = tests/fuzz/fuzz_apply.c tests/fuzz/replay.c
tests_fuzz_fuzz_replay_LDADD = $(FUSEDROPE_LIBS)
tests_fuzz_fuzz_replay_DEPENDENCIES = libfusedrope.a

EXTRA_PROGRAMS = tests/fuzz/fuzz_apply
tests_fuzz_fuzz_apply_SOURCES = tests/fuzz/fuzz_apply.c
tests_fuzz_fuzz_apply_LDADD = $(FUSEDROPE_LIBS)
tests_fuzz_fuzz_apply_DEPENDENCIES = libfusedrope.a
CLEANFILES += tests/fuzz/fuzz_apply$(EXEEXT)

EXTRA_DIST += tests/fuzz/corpus tests/fuzz/regress tests/fuzz/README

FUZZ_TIME = 60
FUZZ_FLAGS =
if ENABLE_FUZZING
tests_fuzz_fuzz_apply_LDFLAGS = -fsanitize=fuzzer

# Runs on a temporary copy of the corpus (new inputs are not kept); a crash,
# leak, timeout or sanitizer report is written to tests/fuzz/crash-* (etc.)
# and makes the target fail.
fuzz: tests/fuzz/fuzz_apply$(EXEEXT)
	@tmp=`mktemp -d` || exit 1; \
	cp $(srcdir)/tests/fuzz/corpus/* "$$tmp"/ && \
	echo "fuzzing for $(FUZZ_TIME) s on a copy of $(srcdir)/tests/fuzz/corpus in $$tmp"; \
	ASAN_OPTIONS=$${ASAN_OPTIONS:-detect_leaks=1} \
	UBSAN_OPTIONS=$${UBSAN_OPTIONS:-print_stacktrace=1} \
	./tests/fuzz/fuzz_apply$(EXEEXT) -max_total_time=$(FUZZ_TIME) -timeout=30 \
	  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=tests/fuzz/ \
	  $(FUZZ_FLAGS) "$$tmp"; \
	rc=$$?; rm -rf "$$tmp"; \
	if test $$rc -ne 0; then echo "make fuzz: a finding (exit $$rc); see tests/fuzz/crash-* and the log above" >&2; fi; \
	exit $$rc
else
fuzz:
	@echo "make fuzz needs a build configured with: ./configure CC=clang --enable-fuzzing" >&2; \
	exit 1
endif
.PHONY: fuzz
