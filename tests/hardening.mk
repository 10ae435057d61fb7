# Hardening (issue 7): the fuzz harness and its corpus replay, shared use
# from many threads, determinism, allocation failure in the cache, and the
# valgrind run's settings.  Included from the top Makefile.am; paths are
# relative to the top directory.

# ------------------------------------------------------ threads, determinism
if HAVE_CHECK
check_PROGRAMS += tests/test_threads tests/test_determinism tests/fuzz/test_regress
TESTS += tests/test_threads tests/test_determinism tests/fuzz/test_regress

tests_test_threads_SOURCES = tests/test_threads.c
tests_test_threads_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -pthread
tests_test_threads_LDFLAGS = -pthread
tests_test_threads_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_threads_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

tests_test_determinism_SOURCES = tests/test_determinism.c
tests_test_determinism_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_determinism_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_determinism_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# Regression tests for library defects the hardening work found.
tests_fuzz_test_regress_SOURCES = tests/fuzz/test_regress.c
tests_fuzz_test_regress_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_fuzz_test_regress_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_fuzz_test_regress_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# make check-threads: the test programs whose threads run the library at
# the same time (test_threads: 8 threads on one cache, their errors too), for
# the ThreadSanitizer build (README, "Reliability"; .ci/run).  That build has
# no OpenMP (libgomp is not instrumented), so every other program runs the
# library on one thread and gives ThreadSanitizer nothing to watch: in CI
# they took most of the stage (bench/RESULTS.md).  Only these programs are
# built.  A test source that starts threads must be in one of the two lists,
# or the target fails; THREAD_TESTS_APART: those whose threads never overlap
# (test_errors and test_stack start one and join it before going on: the
# per-thread error message, the stack's size, which the sanitizers change)
# or that a --without-cuda build lacks (test_cuda).  make check runs all of
# them in every build.
THREAD_TESTS = tests/test_threads
THREAD_TESTS_APART = tests/test_errors tests/test_stack tests/test_cuda
check-threads:
	@for f in `grep -l pthread_create $(srcdir)/tests/*.c`; do \
	  t=tests/`basename $$f .c`; \
	  case " $(THREAD_TESTS) $(THREAD_TESTS_APART) " in *" $$t "*) ;; \
	  *) echo "check-threads: $$f starts threads: list $$t in THREAD_TESTS (tests/hardening.mk)" >&2; exit 1 ;; esac; \
	done
	$(MAKE) $(AM_MAKEFLAGS) check TESTS="$(THREAD_TESTS)" check_PROGRAMS="$(THREAD_TESTS:=$(EXEEXT))"
else
check-threads:
	@echo "make check-threads needs libcheck, which configure did not find" >&2; exit 1
endif

# ------------------------------------------------------- allocation failure
# The wraps route the static library's malloc, calloc, realloc,
# aligned_alloc and free through the test's counting wrappers; libc, libgomp
# and sanitizer runtimes keep their own (so the test runs the same under
# ASan, TSan and valgrind).
check_PROGRAMS += tests/test_nomem
TESTS += tests/test_nomem
tests_test_nomem_SOURCES = tests/test_nomem.c
tests_test_nomem_LDFLAGS = -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc \
	-Wl,--wrap=aligned_alloc -Wl,--wrap=free
tests_test_nomem_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
tests_test_nomem_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# ---------------------------------------------------------------- fuzzing
# tests/fuzz/fuzz_apply.c is a libFuzzer target.  Every build runs it over
# the seed corpus, the regression inputs and a few hundred pseudo-random
# inputs through a plain main (tests/fuzz/replay.c), so the harness and what
# it has found stay tested under make check, the sanitizer build and
# valgrind.  With ./configure CC=clang --enable-fuzzing it is also linked
# with libFuzzer, and `make fuzz` runs it for $(FUZZ_TIME) seconds.
# decode.c: the decoding and plain-call model both targets share.
FUZZ_DECODE = tests/fuzz/decode.c tests/fuzz/decode.h
check_PROGRAMS += tests/fuzz/fuzz_replay
TESTS += tests/fuzz/fuzz_replay
tests_fuzz_fuzz_replay_SOURCES = tests/fuzz/fuzz_apply.c tests/fuzz/replay.c $(FUZZ_DECODE)
tests_fuzz_fuzz_replay_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
tests_fuzz_fuzz_replay_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# The same replay with test_apply_emu's wrap (tests/local.mk): every
# call of the corpus, the regression inputs and the pseudo-random inputs
# that the library accepts runs on the emulated kernels, judged by the
# harness's model of the rules.
if HAVE_CUDA_EMU
check_PROGRAMS += tests/fuzz/fuzz_replay_emu
TESTS += tests/fuzz/fuzz_replay_emu
tests_fuzz_fuzz_replay_emu_SOURCES = tests/fuzz/fuzz_apply.c tests/fuzz/replay.c $(FUZZ_DECODE) \
	tests/cuda_emu_wrap.c
tests_fuzz_fuzz_replay_emu_CPPFLAGS = $(EMU_CPPFLAGS)
tests_fuzz_fuzz_replay_emu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_apply
tests_fuzz_fuzz_replay_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
nodist_EXTRA_tests_fuzz_fuzz_replay_emu_SOURCES = emu_link.cc
tests_fuzz_fuzz_replay_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)
endif

# The second target, tests/fuzz/fuzz_norm.c: the fused RMSNorm + RoPE
# (fusedrope_norm_forward_qk / _backward_qk), on decode.c's calls.  Its
# replay runs tests/fuzz/corpus_norm and tests/fuzz/regress_norm.
FUZZ_NORM_REPLAY = -DFUZZ_CORPUS='"corpus_norm"' -DFUZZ_REGRESS='"regress_norm"'
check_PROGRAMS += tests/fuzz/fuzz_norm_replay
TESTS += tests/fuzz/fuzz_norm_replay
tests_fuzz_fuzz_norm_replay_SOURCES = tests/fuzz/fuzz_norm.c tests/fuzz/replay.c $(FUZZ_DECODE)
tests_fuzz_fuzz_norm_replay_CPPFLAGS = $(AM_CPPFLAGS) $(FUZZ_NORM_REPLAY)
tests_fuzz_fuzz_norm_replay_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
tests_fuzz_fuzz_norm_replay_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# ... and with test_norm_emu's wraps (tests/local.mk): every norm call the
# library accepts runs on the emulated kernels (which must also match the
# OpenMP backend to the bit), judged by the harness's model.
if HAVE_CUDA_EMU
check_PROGRAMS += tests/fuzz/fuzz_norm_replay_emu
TESTS += tests/fuzz/fuzz_norm_replay_emu
tests_fuzz_fuzz_norm_replay_emu_SOURCES = tests/fuzz/fuzz_norm.c tests/fuzz/replay.c \
	$(FUZZ_DECODE) tests/cuda_norm_emu_wrap.c
tests_fuzz_fuzz_norm_replay_emu_CPPFLAGS = $(EMU_CPPFLAGS) $(FUZZ_NORM_REPLAY)
tests_fuzz_fuzz_norm_replay_emu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_norm_forward \
	-Wl,--wrap=fusedrope__cpu_norm_backward
tests_fuzz_fuzz_norm_replay_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
nodist_EXTRA_tests_fuzz_fuzz_norm_replay_emu_SOURCES = emu_link.cc
tests_fuzz_fuzz_norm_replay_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)
endif

EXTRA_PROGRAMS = tests/fuzz/fuzz_apply tests/fuzz/fuzz_norm
tests_fuzz_fuzz_apply_SOURCES = tests/fuzz/fuzz_apply.c $(FUZZ_DECODE)
tests_fuzz_fuzz_apply_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
tests_fuzz_fuzz_apply_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)
tests_fuzz_fuzz_norm_SOURCES = tests/fuzz/fuzz_norm.c $(FUZZ_DECODE)
tests_fuzz_fuzz_norm_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
tests_fuzz_fuzz_norm_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)
CLEANFILES += tests/fuzz/fuzz_apply$(EXEEXT) tests/fuzz/fuzz_norm$(EXEEXT)

EXTRA_DIST += tests/fuzz/corpus tests/fuzz/regress tests/fuzz/README tests/fuzz/lsan.supp \
	tests/fuzz/corpus_norm tests/fuzz/regress_norm

FUZZ_TIME = 60
FUZZ_FLAGS =
if ENABLE_FUZZING
tests_fuzz_fuzz_apply_LDFLAGS = -fsanitize=fuzzer
tests_fuzz_fuzz_norm_LDFLAGS = -fsanitize=fuzzer

# make check in this (clang) build: LeakSanitizer reports LLVM libomp's
# per-thread blocks at the exit of every forked test, and its tracer can
# crash there; leaks are checked by make check-valgrind and the gcc ASan
# build instead.  (make fuzz keeps libFuzzer's leak detection.)
AM_TESTS_ENVIRONMENT = ASAN_OPTIONS="detect_leaks=0$${ASAN_OPTIONS:+:$$ASAN_OPTIONS}"; export ASAN_OPTIONS;

# Runs each target (fuzz_apply on tests/fuzz/corpus, fuzz_norm on
# tests/fuzz/corpus_norm) for $(FUZZ_TIME) seconds on a temporary copy of its
# corpus (new inputs are not kept); a crash, leak, timeout or sanitizer
# report is written to tests/fuzz/crash-* (etc.) and makes the target fail.
# FUZZ_TARGETS="norm" runs one.
FUZZ_TARGETS = apply norm
fuzz: tests/fuzz/fuzz_apply$(EXEEXT) tests/fuzz/fuzz_norm$(EXEEXT)
	@fail=0; for t in $(FUZZ_TARGETS); do \
	  case $$t in apply) corpus=corpus ;; *) corpus=corpus_$$t ;; esac; \
	  tmp=`mktemp -d` || exit 1; \
	  cp $(srcdir)/tests/fuzz/$$corpus/* "$$tmp"/ && \
	  echo "fuzz_$$t: fuzzing for $(FUZZ_TIME) s on a copy of $(srcdir)/tests/fuzz/$$corpus in $$tmp"; \
	  ASAN_OPTIONS=$${ASAN_OPTIONS:-detect_leaks=1} \
	  LSAN_OPTIONS=$${LSAN_OPTIONS:-suppressions=$(srcdir)/tests/fuzz/lsan.supp} \
	  UBSAN_OPTIONS=$${UBSAN_OPTIONS:-print_stacktrace=1} \
	  ./tests/fuzz/fuzz_$$t$(EXEEXT) -max_total_time=$(FUZZ_TIME) -timeout=30 \
	    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=tests/fuzz/ \
	    $(FUZZ_FLAGS) "$$tmp"; \
	  rc=$$?; rm -rf "$$tmp"; \
	  if test $$rc -ne 0; then echo "make fuzz: fuzz_$$t: a finding (exit $$rc); see tests/fuzz/crash-* and the log above" >&2; fail=$$rc; fi; \
	done; exit $$fail
else
fuzz:
	@echo "make fuzz needs a build configured with: ./configure CC=clang --enable-fuzzing" >&2; \
	exit 1
endif
.PHONY: fuzz check-threads

# ---------------------------------------------------------------- valgrind
# make check-valgrind (= check-valgrind-memcheck): every test program under
# memcheck; an error or a definitely lost block fails the test.  Blocks that
# are only "possibly lost" (libgomp's thread pool, alive at exit) are
# reported but are not errors.
#
# Test scripts (*.sh) run through SH_LOG_COMPILER, which check-valgrind
# leaves alone, so valgrind checks the programs and never the shell.
#
# No --track-origins: it finds no more errors, it only says where an
# uninitialised value came from, and it slows memcheck down by more than half
# again (CI's slowest stage); to trace a reported error, rerun that test with
#   make check-valgrind TESTS=tests/test_x VALGRIND_FLAGS=--track-origins=yes
TEST_EXTENSIONS = .sh
SH_LOG_COMPILER = $(SHELL)
VALGRIND_memcheck_FLAGS = --leak-check=full --show-leak-kinds=definite \
	--errors-for-leak-kinds=definite
VALGRIND_SUPPRESSIONS_FILES = $(srcdir)/tests/valgrind.supp
EXTRA_DIST += tests/valgrind.supp
