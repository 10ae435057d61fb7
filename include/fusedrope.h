/*
 * fusedrope.h - rotary position embeddings (RoPE) for transformer q/k tensors,
 * forward and backward, on NVIDIA GPUs (CUDA) and on the CPU (OpenMP).
 *
 * The whole public API of libfusedrope.  No CUDA type appears here: streams
 * are passed as `void *` (a cudaStream_t, or NULL for the default stream).
 * Every function that can fail returns a fusedrope_status; nothing aborts,
 * prints or exits.  See fusedrope(3).
 */
#ifndef FUSEDROPE_H
#define FUSEDROPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FUSEDROPE_VERSION_MAJOR 0
#define FUSEDROPE_VERSION_MINOR 1
#define FUSEDROPE_VERSION_PATCH 0

/* Largest rot_dim a cache accepts. */
#define FUSEDROPE_MAX_ROT_DIM 8192

/* ------------------------------------------------------------------ common */

typedef enum {
    FUSEDROPE_OK = 0,
    FUSEDROPE_ERR_INVALID,     /* a bad argument: NULL, bad size, stride, enum, overlap */
    FUSEDROPE_ERR_RANGE,       /* a size product overflows, or a position is outside the table */
    FUSEDROPE_ERR_NOMEM,       /* host or device allocation failed */
    FUSEDROPE_ERR_UNSUPPORTED, /* asked for CUDA where it is not built or no device is present */
    FUSEDROPE_ERR_CUDA         /* the CUDA runtime reported an error */
} fusedrope_status;

const char *fusedrope_status_string(fusedrope_status status);
/* Thread-local sentence describing the last failure in this thread ("" if none). */
const char *fusedrope_last_error(void);
const char *fusedrope_version(void);
/* 1 when the library was built with CUDA and a CUDA device is present, else 0. */
int fusedrope_cuda_available(void);

typedef enum { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16, FUSEDROPE_BFLOAT16 } fusedrope_dtype;
typedef enum { FUSEDROPE_DEVICE_AUTO, FUSEDROPE_DEVICE_CPU, FUSEDROPE_DEVICE_CUDA } fusedrope_device;
typedef enum {
    FUSEDROPE_NEOX,        /* rotate_half: channel i pairs with i + rot_dim/2 */
    FUSEDROPE_INTERLEAVED  /* GPT-J: channel 2i pairs with 2i+1 */
} fusedrope_style;

/* ------------------------------------------------------------ cache module */

typedef enum {
    FUSEDROPE_ROPE_DEFAULT,
    FUSEDROPE_ROPE_LINEAR,
    FUSEDROPE_ROPE_DYNAMIC,
    FUSEDROPE_ROPE_YARN,
    FUSEDROPE_ROPE_LONGROPE,
    FUSEDROPE_ROPE_LLAMA3
} fusedrope_rope_type;

typedef struct fusedrope_cache_config {
    fusedrope_rope_type type;
    int      rot_dim;                /* rotated channels per head, even, 2..FUSEDROPE_MAX_ROT_DIM */
    int64_t  max_positions;          /* table rows; 0 = no table, angles computed at apply time */
    double   theta;                  /* base, e.g. 10000; > 1 */
    double   factor;                 /* linear, dynamic, yarn, longrope, llama3 */
    int64_t  original_max_positions; /* dynamic, yarn, longrope, llama3 */
    int64_t  seq_len;                /* dynamic: sequence length the table is built for; 0 = max_positions */
    double   attention_factor;       /* yarn, longrope: 0 = derive it as the model's reference does */
    double   beta_fast, beta_slow;   /* yarn: 32 and 1 by default */
    double   mscale, mscale_all_dim; /* yarn: 0 = unset */
    int      truncate;               /* yarn: 1 (default) floor/ceil the correction range, 0 keeps it fractional */
    double   low_freq_factor, high_freq_factor; /* llama3: 1 and 4 by default */
    const double *short_factor, *long_factor;   /* longrope: rot_dim/2 each, copied at create */
} fusedrope_cache_config;

/* Fills every field with the reference models' defaults for `type`. */
void fusedrope_cache_config_init(fusedrope_cache_config *config, fusedrope_rope_type type,
                                 int rot_dim, int64_t max_positions, double theta);

typedef struct fusedrope_cache fusedrope_cache; /* opaque, immutable once built */

fusedrope_status fusedrope_cache_create(const fusedrope_cache_config *config,
                                        fusedrope_device device, fusedrope_cache **out);
/* cos and sin: host arrays [positions][rot_dim/2], used as they are (attention factor included). */
fusedrope_status fusedrope_cache_create_from_table(const float *cos, const float *sin,
                                                   int64_t positions, int rot_dim,
                                                   fusedrope_device device, fusedrope_cache **out);
/* Copies the table into host arrays [max_positions][rot_dim/2], whatever the cache's device. */
fusedrope_status fusedrope_cache_copy_table(const fusedrope_cache *cache, float *cos, float *sin);
void fusedrope_cache_destroy(fusedrope_cache *cache);

int              fusedrope_cache_rot_dim(const fusedrope_cache *cache);
int64_t          fusedrope_cache_max_positions(const fusedrope_cache *cache);
fusedrope_device fusedrope_cache_device(const fusedrope_cache *cache); /* CPU or CUDA, never AUTO */

/*
 * Positions held in device memory cannot be checked before a CUDA launch; a
 * kernel that meets one outside the table writes NaN to that token's rotated
 * channels and raises a flag in the cache.  This waits for `stream`, returns
 * FUSEDROPE_ERR_RANGE if the flag was raised since the last check, and clears
 * it.  CPU caches report range errors at the call itself and always return OK.
 */
fusedrope_status fusedrope_cache_check(const fusedrope_cache *cache, void *stream);

/* ------------------------------------------------- forward/backward modules */

typedef struct fusedrope_tensor {
    void *data;
    fusedrope_dtype dtype;
    int64_t seq_len, batch, heads, head_dim;       /* packed THD: seq_len = tokens, batch = 1 */
    int64_t stride_seq, stride_batch, stride_head; /* in elements; channels are contiguous */
} fusedrope_tensor;

fusedrope_tensor fusedrope_tensor_sbhd(void *data, fusedrope_dtype dtype,
                                       int64_t s, int64_t b, int64_t h, int64_t d);
fusedrope_tensor fusedrope_tensor_bshd(void *data, fusedrope_dtype dtype,
                                       int64_t b, int64_t s, int64_t h, int64_t d);
fusedrope_tensor fusedrope_tensor_thd(void *data, fusedrope_dtype dtype,
                                      int64_t t, int64_t h, int64_t d);

/* A NULL pointer to it means positions 0..seq_len-1 for every batch entry.
 * The arrays live on the cache's device. */
typedef struct fusedrope_positions {
    const int64_t *ids;        /* NULL, or a position per [batch][seq] (per token for THD) */
    const int64_t *offsets;    /* NULL, or a start per sequence (batch entry, or THD sequence) */
    const int32_t *cu_seqlens; /* THD: num_seqs+1 prefix sums of local sequence lengths */
    int64_t num_seqs;          /* THD: number of sequences */
    int cp_size, cp_rank;      /* context parallelism; 1 (or 0) and 0 when unused */
} fusedrope_positions;

fusedrope_status fusedrope_forward(const fusedrope_cache *cache, fusedrope_style style,
                                   const fusedrope_positions *pos,
                                   const fusedrope_tensor *x, const fusedrope_tensor *y,
                                   void *stream);
fusedrope_status fusedrope_backward(const fusedrope_cache *cache, fusedrope_style style,
                                    const fusedrope_positions *pos,
                                    const fusedrope_tensor *dy, const fusedrope_tensor *dx,
                                    void *stream);
/* q and k in one pass (one launch on the GPU); head counts may differ (GQA). */
fusedrope_status fusedrope_forward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                      const fusedrope_positions *pos,
                                      const fusedrope_tensor *q_in, const fusedrope_tensor *q_out,
                                      const fusedrope_tensor *k_in, const fusedrope_tensor *k_out,
                                      void *stream);
fusedrope_status fusedrope_backward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                       const fusedrope_positions *pos,
                                       const fusedrope_tensor *dq_out, const fusedrope_tensor *dq_in,
                                       const fusedrope_tensor *dk_out, const fusedrope_tensor *dk_in,
                                       void *stream);

#ifdef __cplusplus
}
#endif

#endif /* FUSEDROPE_H */
