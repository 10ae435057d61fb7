/*
 * internal.h - what the host modules and the two backends share: the cache's
 * layout, a validated apply call, and the backend entry points.  C only; the
 * CUDA backend (kernels/) includes it inside extern "C".
 */
#ifndef FUSEDROPE_INTERNAL_H
#define FUSEDROPE_INTERNAL_H

#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <stddef.h>
#include <stdint.h>

#include "symbols.h"
#include "fusedrope.h"
#include "rope_math.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fusedrope_cache {
    fusedrope_device device;  /* CPU or CUDA */
    int rot_dim;
    int64_t max_positions;    /* 0: no table, angles from inv_freq at apply time */
    float *cos, *sin;         /* [max_positions][rot_dim/2] on `device`, or NULL */
    double *inv_freq;         /* [rot_dim/2] on the host, NULL for a user table */
    double *inv_freq_dev;     /* the same on the GPU (CUDA table-less caches) */
    void *dev_block;          /* CUDA: the one allocation that holds the three above */
    double attention_factor;
    int *range_flag;          /* CUDA: mapped host word the kernels raise */
    int *range_flag_dev;      /* its device address */
};

/* One tensor of a validated call: in and out views of the same shape. */
typedef struct fr_io {
    const void *in;
    void *out;
    int64_t heads, head_dim;
    int64_t in_ss, in_sb, in_sh;    /* element strides of in: seq, batch, head */
    int64_t out_ss, out_sb, out_sh; /* element strides of out */
    int in_place;
} fr_io;

/* A forward or backward call that passed every host-side check. */
typedef struct fr_apply_args {
    const fusedrope_cache *cache;
    float sgn;                /* +1 forward, -1 backward */
    int interleaved;
    fusedrope_dtype dtype;
    int64_t seq_len, batch;   /* batch = 1 for THD */
    fr_pos_args pos;
    int count;                /* 1, or 2 for *_qk */
    fr_io io[2];
    void *stream;
} fr_apply_args;

/* Returns from the calling function with a check's status unless it is OK. */
#define TRY(expr)                                   \
    do {                                            \
        fusedrope_status st_ = (expr);              \
        if (st_ != FUSEDROPE_OK)                    \
            return st_;                             \
    } while (0)

/* Records the detail of a failure for fusedrope_last_error() and returns status. */
fusedrope_status fr_fail(fusedrope_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fr_clear_error(void);
size_t fr_dtype_size(fusedrope_dtype dtype);

/* The growing public structs (lib/abi.c).  fr_struct_take copies the
 * caller's struct (whose struct_size is one of `layouts`, the sizes the
 * struct has had, or larger with a zero tail) into dst, zero past the
 * caller's size; FUSEDROPE_ERR_INVALID naming `name` otherwise.  It reads
 * nothing past the caller's struct_size.  fr_struct_give writes the first
 * dst_size bytes of a full struct to a caller's struct of that size (zero
 * past full_size) and sets its struct_size. */
fusedrope_status fr_struct_take(void *dst, size_t dst_size, const void *src,
                                const size_t *layouts, int nlayouts, const char *name);
void fr_struct_give(void *dst, size_t dst_size, const void *full, size_t full_size);
/* Size of a layout of `type` that ends with member `last` (padded as the
 * compiler pads the struct): one entry of fr_struct_take's `layouts`. */
#define FR_LAYOUT_SIZE(type, last)                                              \
    ((offsetof(type, last) + sizeof(((type *)0)->last) + _Alignof(type) - 1) / \
     _Alignof(type) * _Alignof(type))

/* Forward and backward modules both end here: checks every argument, then
 * runs the call on the cache's device.  names: in[0], out[0], in[1], out[1]
 * as the caller calls them, for error messages. */
fusedrope_status fr_apply(const fusedrope_cache *cache, fusedrope_style style, float sgn,
                          const fusedrope_positions *pos, int count,
                          const fusedrope_tensor *const in[2],
                          const fusedrope_tensor *const out[2], const char *const names[4],
                          void *stream);

/* fr_apply's checks alone (lib/apply.c): on success *args is the validated
 * call, args->count 0 when it has nothing to do; nothing is run.  The norm
 * module (lib/norm.c) validates its tensors and positions with it. */
fusedrope_status fr_apply_prepare(const fusedrope_cache *cache, fusedrope_style style, float sgn,
                                  const fusedrope_positions *pos, int count,
                                  const fusedrope_tensor *const in[2],
                                  const fusedrope_tensor *const out[2],
                                  const char *const names[4], void *stream,
                                  fr_apply_args *args);
/* fr_apply's rule for where a pointer may live given the cache's device. */
fusedrope_status fr_check_pointer(const void *p, const char *name, fusedrope_device dev);

/* A fused RMSNorm + RoPE call that passed every host-side check (lib/norm.c).
 * a: the RoPE part, as fr_apply_prepare made it (forward: in = x, out = y;
 * backward: in = dy, out = dx, sgn -1); io slot j of a holds tensor q or k
 * as src[j] says. */
typedef struct fr_norm_args {
    fr_apply_args a;
    int weight;               /* fusedrope_norm_weight */
    int rounding;             /* fusedrope_norm_rounding */
    int saved_y;              /* backward: saved tensors are y */
    float eps;
    fusedrope_dtype wdtype;   /* the weights' dtype */
    const void *w[2];         /* per io slot: [head_dim] weight, NULL for WEIGHT_NONE */
    float *rstd[2];           /* per io slot: [tokens][heads], or NULL (forward) */
    float *dw[2];             /* backward, per io slot: [head_dim], or NULL */
    const void *x[2];         /* backward, per io slot: the saved tensor ... */
    int64_t x_ss[2], x_sb[2], x_sh[2]; /* ... and its element strides */
    float *dw_zero[2];        /* backward: weight gradients of tensors without rows, ... */
    int64_t dw_zero_n[2];     /* ... set to dw_zero_n[k] zeros */
} fr_norm_args;

/* The norm's OpenMP backend (lib/cpu_norm.c) and CUDA backend
 * (kernels/cuda_norm.cu, or lib/cuda_stub.c).  The CPU ones return
 * FUSEDROPE_ERR_NOMEM where scratch memory cannot be had, before writing. */
fusedrope_status fr_cpu_norm_forward(const fr_norm_args *args);
fusedrope_status fr_cpu_norm_backward(const fr_norm_args *args);
fusedrope_status fr_cuda_norm_forward(const fr_norm_args *args);
fusedrope_status fr_cuda_norm_backward(const fr_norm_args *args);

/* OpenMP backend (lib/cpu_apply.c). */
void fr_cpu_apply(const fr_apply_args *args);

/* cpu_avx2.c (x86-64): fp16/bf16 heads rotated with AVX2 and F16C, for CPUs
 * that have both; every non-NaN result is the portable path's to the bit.
 * fr_avx2_off, set by tests only, makes fr_avx2_usable() say no. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FR_HAVE_AVX2 1
int fr_avx2_usable(void);
/* m pairs (xa[i], xb[i]) -> (ya[i], yb[i]), fr_rotate on the widened values,
 * narrowed; ya/yb may be xa/xb (in place), no other overlap.  nt: stores
 * that bypass the cache (ya and yb 16-byte aligned; the caller fences). */
void fr_avx2_rotate_f16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya, uint16_t *yb,
                        const float *cs, const float *sn, int64_t m, float sgn, int nt);
void fr_avx2_rotate_bf16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya, uint16_t *yb,
                         const float *cs, const float *sn, int64_t m, float sgn, int nt);
/* The same for m interleaved pairs (x[2i], x[2i+1]) -> (y[2i], y[2i+1]); y
 * may be x.  nt: y 16-byte aligned. */
void fr_avx2_rotate_pairs_f16(const uint16_t *x, uint16_t *y, const float *cs, const float *sn,
                              int64_t m, float sgn, int nt);
void fr_avx2_rotate_pairs_bf16(const uint16_t *x, uint16_t *y, const float *cs, const float *sn,
                               int64_t m, float sgn, int nt);
extern int fr_avx2_off;
#endif

/* CUDA backend (the kernels directory, or lib/cuda_stub.c without CUDA).  Every one
 * returns a status and records its detail with fr_fail. */
int fr_cuda_device_present(void);
fusedrope_status fr_cuda_cache_upload(fusedrope_cache *cache);  /* host cos/sin/inv_freq -> device */
fusedrope_status fr_cuda_cache_download(const fusedrope_cache *cache, float *cos, float *sin);
void fr_cuda_cache_release(fusedrope_cache *cache);
fusedrope_status fr_cuda_cache_check(const fusedrope_cache *cache, void *stream);
/* Where p points, once the process has a CUDA cache (before that, and
 * without CUDA, always FR_PTR_HOST); FR_PTR_ERROR records its detail. */
enum { FR_PTR_ERROR = -1, FR_PTR_HOST, FR_PTR_DEVICE, FR_PTR_MANAGED };
int fr_cuda_pointer_kind(const void *p);
fusedrope_status fr_cuda_apply(const fr_apply_args *args);

#ifdef __cplusplus
}
#endif

#endif /* FUSEDROPE_INTERNAL_H */
