# The example programs of fusedrope-models(7): each checks its own results
# against values it computes in double and exits 0 or 1, so make check runs
# them as tests; check-page.sh keeps the page's copies equal to these files.
FR_EXAMPLES = examples/decode_qkv examples/varlen_thd examples/explicit_ids \
	examples/model_cache
check_PROGRAMS += $(FR_EXAMPLES)
TESTS += $(FR_EXAMPLES) examples/check-page.sh
EXTRA_DIST += examples/check-page.sh

examples_decode_qkv_SOURCES = examples/decode_qkv.c
examples_decode_qkv_LDADD = $(FUSEDROPE_LIBS)
examples_decode_qkv_DEPENDENCIES = $(FUSEDROPE_DEPS)
# With the CUDA backend built, decode_qkv also runs its step on the GPU
# (where fusedrope_cuda_available() says one is present).
if HAVE_CUDA
examples_decode_qkv_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) -DEXAMPLE_CUDA
else
examples_decode_qkv_CPPFLAGS = $(AM_CPPFLAGS)
endif

examples_varlen_thd_SOURCES = examples/varlen_thd.c
examples_varlen_thd_LDADD = $(FUSEDROPE_LIBS)
examples_varlen_thd_DEPENDENCIES = $(FUSEDROPE_DEPS)

examples_explicit_ids_SOURCES = examples/explicit_ids.c
examples_explicit_ids_LDADD = $(FUSEDROPE_LIBS)
examples_explicit_ids_DEPENDENCIES = $(FUSEDROPE_DEPS)

examples_model_cache_SOURCES = examples/model_cache.c
examples_model_cache_LDADD = $(FUSEDROPE_LIBS)
examples_model_cache_DEPENDENCIES = $(FUSEDROPE_DEPS)
