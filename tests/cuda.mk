# CUDA backend tests: the GPU against the CPU backend, bit for bit.  A C
# program using libcheck and the CUDA runtime's C API; it exits 77 (skipped)
# where no CUDA device is present.
if HAVE_CUDA
if HAVE_CHECK
check_PROGRAMS += tests/test_cuda
TESTS += tests/test_cuda
tests_test_cuda_SOURCES = tests/test_cuda.c
tests_test_cuda_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_cuda_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -pthread
tests_test_cuda_LDFLAGS = -pthread
tests_test_cuda_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_cuda_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)
endif
endif
