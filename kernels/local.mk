# CUDA backend.  nvcc compiles each .cu once per build into an object that
# goes into libfusedrope.a; without CUDA, lib/cuda_stub.c answers instead.
#   kernels/cuda_cache.cu   device presence, pointer queries, the cache's device side
#   kernels/cuda_apply.cu   the forward/backward kernel (12 instantiations per arch:
#                           3 dtypes x 4 paths) and fr_cuda_apply
#   kernels/cuda_apply_emu.cc, kernels/cuda_emu.h
#                           the same file built for the host, its kernels run on
#                           the CPU: only for tests (tests/local.mk)
CUDA_SRCS = \
	kernels/cuda_cache.cu \
	kernels/cuda_apply.cu
CUDA_HDRS = \
	kernels/cuda_util.cuh

# kernels/cuda_emu.h: the host emulation of the kernels (tests/test_apply_emu)
EXTRA_DIST += $(CUDA_SRCS) $(CUDA_HDRS) lib/cuda_stub.c kernels/cuda_emu.h

if HAVE_CUDA
CUDA_OBJS = $(CUDA_SRCS:.cu=.$(OBJEXT))
libfusedrope_a_LIBADD = $(CUDA_OBJS)
libfusedrope_a_DEPENDENCIES = $(CUDA_OBJS)
CLEANFILES += $(CUDA_OBJS)

# -fmad=false: no FMA contraction, so the rotation rounds exactly as the CPU
# backend's (built with -ffp-contract=off) does; the two agree to the bit.
NVCC_ALLFLAGS = $(CUDA_GENCODE) -O3 -std=c++17 -fmad=false -Xcompiler -fPIC \
	$(DEFS) -I$(top_builddir) $(AM_CPPFLAGS) $(NVCCFLAGS)
AM_V_NVCC = $(am__v_NVCC_@AM_V@)
am__v_NVCC_ = $(am__v_NVCC_@AM_DEFAULT_V@)
am__v_NVCC_0 = @echo "  NVCC    " $@;
am__v_NVCC_1 =

$(CUDA_OBJS): $(CUDA_HDRS) lib/internal.h lib/rope_math.h include/fusedrope.h

SUFFIXES = .cu
.cu.$(OBJEXT):
	@$(MKDIR_P) $(@D)
	$(AM_V_NVCC)$(NVCC) $(NVCC_ALLFLAGS) -c -o $@ $<
else
libfusedrope_a_SOURCES += lib/cuda_stub.c
endif
