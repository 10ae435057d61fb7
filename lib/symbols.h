/*
 * symbols.h - link names of the library's internal functions and variables.
 *
 * The source calls them by short fr_ names; in the archive and the shared
 * library they carry the reserved prefix fusedrope__ (two underscores), so
 * that every global symbol starts with fusedrope_ and nothing clashes in a
 * large link line.  Every translation unit of lib/ and kernels/ sees this
 * first, through internal.h.  tests/test_symbols.sh fails on a global symbol
 * without the prefix: add a line here for each new internal global.
 */
#ifndef FUSEDROPE_SYMBOLS_H
#define FUSEDROPE_SYMBOLS_H

#define fr_apply fusedrope__apply
#define fr_apply_call fusedrope__apply_call
#define fr_fail fusedrope__fail
#define fr_clear_error fusedrope__clear_error
#define fr_dtype_size fusedrope__dtype_size
#define fr_dtype_name fusedrope__dtype_name
#define fr_struct_take fusedrope__struct_take
#define fr_struct_give fusedrope__struct_give
#define fr_axes_map fusedrope__axes_map
#define fr_cpu_apply fusedrope__cpu_apply
#define fr_cpu_team fusedrope__cpu_team
#define fr_cpu_team_size fusedrope__cpu_team_size
#define fr_cpu_needs_team fusedrope__cpu_needs_team
#define fr_team_all fusedrope__team_all
#define fr_avx2_usable fusedrope__avx2_usable
#define fr_x86_has fusedrope__x86_has
#define fr_avx2_off fusedrope__avx2_off
#define fr_beyond_cache_all fusedrope__beyond_cache_all
#define fr_avx2_rotate_f16 fusedrope__avx2_rotate_f16
#define fr_avx2_rotate_bf16 fusedrope__avx2_rotate_bf16
#define fr_avx2_rotate_pairs_f16 fusedrope__avx2_rotate_pairs_f16
#define fr_avx2_rotate_pairs_bf16 fusedrope__avx2_rotate_pairs_bf16
#define fr_avx512_usable fusedrope__avx512_usable
#define fr_avx512_off fusedrope__avx512_off
#define fr_avx512_rotate_f16 fusedrope__avx512_rotate_f16
#define fr_avx512_rotate_bf16 fusedrope__avx512_rotate_bf16
#define fr_avx512_rotate_pairs_f16 fusedrope__avx512_rotate_pairs_f16
#define fr_avx512_rotate_pairs_bf16 fusedrope__avx512_rotate_pairs_bf16
#define fr_avx512_rotate_steps_f16 fusedrope__avx512_rotate_steps_f16
#define fr_avx512_rotate_heads_f16 fusedrope__avx512_rotate_heads_f16
#define fr_avx512_gather fusedrope__avx512_gather
#define fr_avx512_rotate_heads_bf16 fusedrope__avx512_rotate_heads_bf16
#define fr_avx512_rotate_steps_bf16 fusedrope__avx512_rotate_steps_bf16
#define fr_avx2_rotate_steps_f16 fusedrope__avx2_rotate_steps_f16
#define fr_avx2_rotate_steps_bf16 fusedrope__avx2_rotate_steps_bf16
#define fr_cuda_device_present fusedrope__cuda_device_present
#define fr_cuda_cache_upload fusedrope__cuda_cache_upload
#define fr_cuda_cache_download fusedrope__cuda_cache_download
#define fr_cuda_cache_release fusedrope__cuda_cache_release
#define fr_cuda_cache_check fusedrope__cuda_cache_check
#define fr_cuda_pointer_kind fusedrope__cuda_pointer_kind
#define fr_cuda_apply fusedrope__cuda_apply
#define fr_apply_prepare fusedrope__apply_prepare
#define fr_check_array fusedrope__check_array
#define fr_check_pointer fusedrope__check_pointer
#define fr_cpu_norm_forward fusedrope__cpu_norm_forward
#define fr_cpu_norm_backward fusedrope__cpu_norm_backward
#define fr_norm_out_portable fusedrope__norm_out_portable
#define fr_norm_avx2_rows fusedrope__norm_avx2_rows
#define fr_norm_avx2_brun fusedrope__norm_avx2_brun
#define fr_norm_avx512_rows fusedrope__norm_avx512_rows
#define fr_norm_avx512_brun fusedrope__norm_avx512_brun
#define fr_cuda_norm_forward fusedrope__cuda_norm_forward
#define fr_cuda_norm_backward fusedrope__cuda_norm_backward

#endif /* FUSEDROPE_SYMBOLS_H */
