# fusedrope-bench: the installed benchmark-and-verify program, and a quick
# smoke test of it on the CPU.  bench/ holds the peer comparison script.
bin_PROGRAMS += tools/fusedrope-bench
tools_fusedrope_bench_SOURCES = tools/fusedrope-bench.c
tools_fusedrope_bench_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tools_fusedrope_bench_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS)
tools_fusedrope_bench_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

TESTS += tools/bench-smoke.sh
EXTRA_DIST += tools/bench-smoke.sh bench/peers.py
