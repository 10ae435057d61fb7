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
# cudaGetDevice and cudaSetDevice wrapped: test_device_restore_fails
tests_test_cuda_LDFLAGS = -pthread -Wl,--wrap=cudaGetDevice -Wl,--wrap=cudaSetDevice
tests_test_cuda_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_cuda_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# test_apply, test_axes and test_norm whole on the device: the OpenMP
# backend's entry points wrapped, as for the *_emu programs (tests/local.mk),
# so that every call also runs the CUDA launcher and kernels on a real GPU,
# must agree with the OpenMP backend, and leaves the device's bytes for the
# suite's float64 checks (tests/cuda_gpu_wrap.c, tests/cuda_norm_gpu_wrap.c,
# tests/cuda_gpu_copy.c).  Each exits 77 (skipped) before main where no CUDA
# device is present.
GPU_WRAP_SOURCES = tests/cuda_gpu_copy.c tests/cuda_gpu_copy.h
check_PROGRAMS += tests/test_apply_gpu tests/test_axes_gpu tests/test_norm_gpu
TESTS += tests/test_apply_gpu tests/test_axes_gpu tests/test_norm_gpu

tests_test_apply_gpu_SOURCES = tests/test_apply.c tests/cuda_gpu_wrap.c $(GPU_WRAP_SOURCES)
tests_test_apply_gpu_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_apply_gpu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_apply_gpu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_apply
tests_test_apply_gpu_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_apply_gpu_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

tests_test_axes_gpu_SOURCES = tests/test_axes.c tests/cuda_gpu_wrap.c $(GPU_WRAP_SOURCES)
tests_test_axes_gpu_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_axes_gpu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_axes_gpu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_apply
tests_test_axes_gpu_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_axes_gpu_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

tests_test_norm_gpu_SOURCES = tests/test_norm.c tests/cuda_norm_gpu_wrap.c $(GPU_WRAP_SOURCES)
tests_test_norm_gpu_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_test_norm_gpu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_norm_gpu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_norm_forward \
	-Wl,--wrap=fusedrope__cpu_norm_backward
tests_test_norm_gpu_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_norm_gpu_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)
endif
endif
