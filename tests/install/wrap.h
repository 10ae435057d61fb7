/*
 * wrap.h - the entry points of tests/install/wrap.c: what a plugin or a
 * binding built on libfusedrope exports.  Plain C types only, so a program
 * that loads the plugin with dlopen needs no fusedrope.h.
 */
#ifndef FR_WRAP_H
#define FR_WRAP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rotates a contiguous [s][b][h][d] tensor (bf16: 0 float32, 1 bfloat16) on
 * the CPU, NeoX style, positions 0..s-1, default RoPE; returns 0 on success. */
int wrap_rope_forward(int bf16, const void *x, void *y, int64_t s, int64_t b, int64_t h,
                      int64_t d, int rot_dim, double theta);
/* fusedrope_version() of the library the plugin was linked with. */
const char *wrap_rope_version(void);

#ifdef __cplusplus
}
#endif

#endif /* FR_WRAP_H */
