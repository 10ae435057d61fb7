# CUDA backend.  nvcc compiles each .cu once per build into an object that
# goes into libfusedrope.a; without CUDA, lib/cuda_stub.c answers instead.
CUDA_SRCS = \
	kernels/runtime.cu \
	kernels/cache.cu \
	kernels/forward.cu \
	kernels/backward.cu
CUDA_HDRS = \
	kernels/apply_kernel.cuh \
	kernels/cuda_util.cuh

EXTRA_DIST += $(CUDA_SRCS) $(CUDA_HDRS) lib/cuda_stub.c

if HAVE_CUDA
CUDA_OBJS = $(CUDA_SRCS:.cu=.$(OBJEXT))
libfusedrope_a_LIBADD = $(CUDA_OBJS)
libfusedrope_a_DEPENDENCIES = $(CUDA_OBJS)
CLEANFILES += $(CUDA_OBJS)

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
