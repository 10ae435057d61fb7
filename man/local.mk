# Manual pages: fusedrope(3) and one page per public function or family;
# the other names of a family are one-line ".so man3/PAGE.3" link pages;
# fusedrope-bench(1) for the installed benchmark.
dist_man_MANS += \
	man/fusedrope-bench.1 \
	man/fusedrope.3 \
	man/fusedrope-models.7 \
	man/fusedrope_cache_create.3 \
	man/fusedrope_cache_create_from_table.3 \
	man/fusedrope_cache_destroy.3 \
	man/fusedrope_cache_config_init.3 \
	man/fusedrope_cache_config_init_sized.3 \
	man/fusedrope_cache_copy_table.3 \
	man/fusedrope_cache_rot_dim.3 \
	man/fusedrope_cache_max_positions.3 \
	man/fusedrope_cache_device.3 \
	man/fusedrope_cache_attention_factor.3 \
	man/fusedrope_cache_inv_freq.3 \
	man/fusedrope_cache_longrope_long.3 \
	man/fusedrope_cache_check.3 \
	man/fusedrope_forward.3 \
	man/fusedrope_backward.3 \
	man/fusedrope_forward_qk.3 \
	man/fusedrope_backward_qk.3 \
	man/fusedrope_positions_init.3 \
	man/fusedrope_positions_init_sized.3 \
	man/fusedrope_tensor_sbhd.3 \
	man/fusedrope_tensor_bshd.3 \
	man/fusedrope_tensor_thd.3 \
	man/fusedrope_tensor_qkv.3 \
	man/fusedrope_status_string.3 \
	man/fusedrope_last_error.3 \
	man/fusedrope_version.3 \
	man/fusedrope_version_number.3 \
	man/fusedrope_cuda_available.3 \
	man/fusedrope_float_to_bf16.3 \
	man/fusedrope_bf16_to_float.3 \
	man/fusedrope_float_to_half.3 \
	man/fusedrope_half_to_float.3 \
	man/fusedrope_norm_forward_qk.3 \
	man/fusedrope_norm_backward_qk.3 \
	man/fusedrope_norm_init.3 \
	man/fusedrope_norm_init_sized.3

# mandoc -Tlint on every page; skips (77) where mandoc is not installed.
TESTS += man/lint.sh
EXTRA_DIST += man/lint.sh
