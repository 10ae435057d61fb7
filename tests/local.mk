# libcheck suites and the float64 reference they share.  Each suite is its own
# program so that `make -j check` runs them in parallel.
#
# tests/libfrtest.a: the test-support library of every test program, the
# fuzz harness and fusedrope-bench: the float64 reference of every rope type,
# the dtype codecs, the tolerance rule, the position model and the random
# generator (tests/ref.c, never calling lib/), and, where libcheck is found,
# the suites' helpers (tests/util.c).  Built once; a program links only the
# members it uses, so fuzz and bench never need libcheck.
noinst_LIBRARIES = tests/libfrtest.a
tests_libfrtest_a_SOURCES = tests/ref.c tests/ref.h tests/under_valgrind.c tests/under_valgrind.h \
	tests/run_seed.c tests/run_seed.h
tests_libfrtest_a_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
if HAVE_CHECK
tests_libfrtest_a_SOURCES += tests/util.c tests/util.h
endif
FRTEST_LIBS = tests/libfrtest.a

# The tests that run the CUDA kernels on the CPU compile kernels/cuda_apply.cu
# with the host C++ compiler (kernels/cuda_apply_emu.cc, kernels/cuda_emu.h).
# -fno-strict-aliasing: the kernels read 16-bit and float arrays as uint4,
# which the device allows and a host optimiser may not.
EMU_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_EMU_CPPFLAGS) -I$(srcdir)/kernels
EMU_CXXFLAGS = -std=c++17 -ffp-contract=off -fno-strict-aliasing -Wall -Wextra \
	-Wno-unknown-pragmas
# TU_EMULATED: a suite built again around the emulated kernels (test_apply_emu,
# test_axes_emu, test_norm_emu), which leaves out under valgrind what only the CPU backend
# does differently (streamed outputs, its vector paths).

# Those kernels (kernels/cuda_apply_emu.cc, kernels/cuda_norm_*_emu.cc) are
# compiled once, into tests/libfremu.a, for every program that runs them: a
# program links the members it uses, with the C++ linker (a C++ source
# named in its nodist_EXTRA_..._SOURCES, never built, makes automake pick it).
if HAVE_CUDA_EMU
check_LIBRARIES = tests/libfremu.a
tests_libfremu_a_SOURCES = kernels/cuda_apply_emu.cc kernels/cuda_norm_forward_emu.cc \
	kernels/cuda_norm_backward_emu.cc kernels/cuda_emu_sms.cc
tests_libfremu_a_CPPFLAGS = $(EMU_CPPFLAGS)
tests_libfremu_a_CXXFLAGS = $(EMU_CXXFLAGS)
endif
EMU_LIBS = tests/libfremu.a

if HAVE_CHECK
check_PROGRAMS += tests/test_cache tests/test_apply tests/test_errors tests/test_cpu_rows \
	tests/test_axes
TESTS += tests/test_cache tests/test_apply tests/test_errors tests/test_cpu_rows tests/test_axes

tests_test_cache_SOURCES = tests/test_cache.c
tests_test_cache_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cache_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_cache_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

tests_test_apply_SOURCES = tests/test_apply.c
tests_test_apply_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_apply_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_apply_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

tests_test_axes_SOURCES = tests/test_axes.c
tests_test_axes_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_axes_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_axes_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

tests_test_errors_SOURCES = tests/test_errors.c
tests_test_errors_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -pthread
tests_test_errors_LDFLAGS = -pthread
tests_test_errors_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_errors_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# Every global symbol prefixed, the shared library's exports (nm).
TESTS += tests/test_symbols.sh tests/test_version.sh
EXTRA_DIST += tests/test_symbols.sh tests/test_version.sh

# Version, enum values and the growing structs' sizes (tests/test_abi.c).
check_PROGRAMS += tests/test_abi
TESTS += tests/test_abi
tests_test_abi_SOURCES = tests/test_abi.c
tests_test_abi_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_abi_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_abi_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# The host conveniences: fusedrope_tensor_qkv and the 16-bit conversions.
check_PROGRAMS += tests/test_helpers
TESTS += tests/test_helpers
tests_test_helpers_SOURCES = tests/test_helpers.c
tests_test_helpers_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_helpers_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_helpers_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

check_PROGRAMS += tests/test_unit_dims
TESTS += tests/test_unit_dims
tests_test_unit_dims_SOURCES = tests/test_unit_dims.c
tests_test_unit_dims_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_unit_dims_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_unit_dims_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# The CPU backend on 32 KiB thread stacks (workers and caller).
check_PROGRAMS += tests/test_stack
TESTS += tests/test_stack
tests_test_stack_SOURCES = tests/test_stack.c
tests_test_stack_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -pthread
tests_test_stack_LDFLAGS = -pthread
tests_test_stack_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_stack_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# Results independent of the caller's floating-point environment (x86 FTZ/DAZ, rounding).
check_PROGRAMS += tests/test_fpenv
TESTS += tests/test_fpenv
tests_test_fpenv_SOURCES = tests/test_fpenv.c
tests_test_fpenv_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_fpenv_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_fpenv_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# Element offsets past 2^31 and 2^32 (sparse mappings), OpenMP backend.
check_PROGRAMS += tests/test_bigindex
TESTS += tests/test_bigindex
tests_test_bigindex_SOURCES = tests/test_bigindex.c
tests_test_bigindex_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_bigindex_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_bigindex_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# The fused per-head RMSNorm + RoPE (lib/norm.c, lib/cpu_norm.c).
check_PROGRAMS += tests/test_norm
TESTS += tests/test_norm
tests_test_norm_SOURCES = tests/test_norm.c
tests_test_norm_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_norm_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_norm_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

tests_test_cpu_rows_SOURCES = tests/test_cpu_rows.c
tests_test_cpu_rows_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cpu_rows_LDADD = $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
tests_test_cpu_rows_DEPENDENCIES = $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# test_apply again, with the OpenMP backend's entry point wrapped so that
# every call runs the CUDA launcher and kernels built for the host
# (kernels/cuda_apply_emu.cc, kernels/cuda_emu.h; tests/cuda_emu_wrap.c).
EXTRA_DIST += tests/emu_config.h
if HAVE_CUDA_EMU
check_PROGRAMS += tests/test_apply_emu
TESTS += tests/test_apply_emu
tests_test_apply_emu_SOURCES = tests/test_apply.c tests/cuda_emu_wrap.c
tests_test_apply_emu_CPPFLAGS = $(EMU_CPPFLAGS) -DTU_EMULATED
tests_test_apply_emu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_apply_emu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_apply
tests_test_apply_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
nodist_EXTRA_tests_test_apply_emu_SOURCES = emu_link.cc
tests_test_apply_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# test_axes the same way: multimodal positions through the emulated kernels.
check_PROGRAMS += tests/test_axes_emu
TESTS += tests/test_axes_emu
tests_test_axes_emu_SOURCES = tests/test_axes.c tests/cuda_emu_wrap.c
tests_test_axes_emu_CPPFLAGS = $(EMU_CPPFLAGS) -DTU_EMULATED
tests_test_axes_emu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_axes_emu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_apply
tests_test_axes_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
nodist_EXTRA_tests_test_axes_emu_SOURCES = emu_link.cc
tests_test_axes_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# Element offsets past 2^31 and 2^32 in sparse mappings (tests/test_bigindex.c),
# through the emulated kernels as well as the OpenMP backend.
check_PROGRAMS += tests/test_bigindex_emu
TESTS += tests/test_bigindex_emu
tests_test_bigindex_emu_SOURCES = tests/test_bigindex.c tests/cuda_emu_wrap.c \
	tests/cuda_norm_emu_wrap.c
tests_test_bigindex_emu_CPPFLAGS = $(EMU_CPPFLAGS)
tests_test_bigindex_emu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_bigindex_emu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_apply \
	-Wl,--wrap=fusedrope__cpu_norm_forward -Wl,--wrap=fusedrope__cpu_norm_backward
tests_test_bigindex_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
nodist_EXTRA_tests_test_bigindex_emu_SOURCES = emu_link.cc
tests_test_bigindex_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# test_norm again with the norm's OpenMP backend wrapped: every call runs
# kernels/cuda_norm_*.cu's launcher and kernels built for the host, with three
# launch shapes, and must match the OpenMP backend to the bit
# (tests/cuda_norm_emu_wrap.c).
check_PROGRAMS += tests/test_norm_emu
TESTS += tests/test_norm_emu
tests_test_norm_emu_SOURCES = tests/test_norm.c tests/cuda_norm_emu_wrap.c
tests_test_norm_emu_CPPFLAGS = $(EMU_CPPFLAGS) -DTU_EMULATED
tests_test_norm_emu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_norm_emu_LDFLAGS = -Wl,--wrap=fusedrope__cpu_norm_forward \
	-Wl,--wrap=fusedrope__cpu_norm_backward
tests_test_norm_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
nodist_EXTRA_tests_test_norm_emu_SOURCES = emu_link.cc
tests_test_norm_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# The kernels' own checks of device-side positions (NaN and the range flag),
# on the same host build of the kernels.
check_PROGRAMS += tests/test_kernel_emu
TESTS += tests/test_kernel_emu
tests_test_kernel_emu_SOURCES = tests/test_kernel_emu.c
tests_test_kernel_emu_CPPFLAGS = $(EMU_CPPFLAGS)
tests_test_kernel_emu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_kernel_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
nodist_EXTRA_tests_test_kernel_emu_SOURCES = emu_link.cc
tests_test_kernel_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)

# The same for the fused RMSNorm + RoPE's kernels (kernels/cuda_norm_*.cu):
# out-of-table device positions give NaN rows and raise the range flag or
# the call's range_status word (tests/test_norm_kernel_emu.c).
check_PROGRAMS += tests/test_norm_kernel_emu
TESTS += tests/test_norm_kernel_emu
tests_test_norm_kernel_emu_SOURCES = tests/test_norm_kernel_emu.c
tests_test_norm_kernel_emu_CPPFLAGS = $(EMU_CPPFLAGS)
tests_test_norm_kernel_emu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_norm_kernel_emu_LDADD = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_LIBS) $(CHECK_LIBS)
nodist_EXTRA_tests_test_norm_kernel_emu_SOURCES = emu_link.cc
tests_test_norm_kernel_emu_DEPENDENCIES = $(EMU_LIBS) $(FRTEST_LIBS) $(FUSEDROPE_DEPS)
endif
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

# tests/digest: an FNV digest of a fixed set of calls' output bytes, to show
# that a change kept every byte (run before and after; bench/RESULTS.md).
# Built by make check, not run by it.
check_PROGRAMS += tests/digest
tests_digest_SOURCES = tests/digest.c
tests_digest_LDADD = $(FUSEDROPE_LIBS)
tests_digest_DEPENDENCIES = $(FUSEDROPE_DEPS)
