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

/* The precision contract (fusedrope(3), Precision; bit-identical backends, NaN and Inf
 * kept, subnormals, signed zeros) rests on IEEE arithmetic as written: a*c
 * and b*s rounded apart, no reassociation, no reciprocals, NaN tests that
 * are not folded away.  Flags that give these up would break it without a
 * word, so a build with them stops here.  (-ffp-contract=off is the build's
 * own choice; -fno-trapping-math, which changes no result, is allowed.) */
#if defined(__FAST_MATH__)
#error "libfusedrope must not be built with -ffast-math: it breaks the precision contract (rounding, NaN/Inf, signed zeros); remove it from CFLAGS"
#elif defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "libfusedrope must not be built with -ffinite-math-only: NaN and Inf inputs must give NaN and Inf; remove it from CFLAGS"
#elif defined(__ASSOCIATIVE_MATH__) || defined(__RECIPROCAL_MATH__) || defined(__NO_SIGNED_ZEROS__)
#error "libfusedrope must not be built with -funsafe-math-optimizations, -fassociative-math, -freciprocal-math or -fno-signed-zeros: they change results the precision contract fixes; remove them from CFLAGS"
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
    double attention_factor;  /* 1 for a user table (its entries carry any factor) */
    int longrope_long;        /* longrope: 1 long_factor, 0 short_factor; else -1 */
    int num_threads;          /* CPU: the OpenMP team of a large call; 0 = the default */
    int *range_flag;          /* CUDA: mapped host word the kernels raise */
    int *range_flag_dev;      /* its device address */
    /* Position axes (lib/axes.c): num_axes 1 and no map for 1D rope. */
    int num_axes;
    int32_t *pair_map;        /* [rot_dim/2] (col << 2) | axis on the host, or NULL */
    int32_t *pair_map_dev;    /* the same on the GPU (in dev_block), or NULL */
    int negative_ok;          /* table-less with axes: positions may be negative */
    int cuda_device;          /* CUDA: the ordinal current when the cache was created, where
                                 its memory lives and its calls must be made */
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
    int32_t *range_status;    /* CUDA: the caller's word the kernels raise instead of the
                                 cache's flag, or NULL (pos->range_status) */
} fr_apply_args;

/* The word a call's CUDA kernels raise for a position outside the table: the
 * call's range_status, else the cache's flag (its device address); one rule
 * for the plain and the norm kernels. */
static inline int *fr_range_word(const fr_apply_args *a)
{
    return a->range_status != NULL ? (int *)a->range_status : a->cache->range_flag_dev;
}

/* Elements of pos->ids a call of `tokens` tokens reads: its last row starts
 * ids_rows - 1 row strides in (fr_apply_prepare checks that this is a
 * number before any caller uses it). */
static inline int64_t fr_ids_elems(const fr_pos_args *pa, int64_t tokens)
{
    return (int64_t)(pa->ids_rows - 1) * pa->ids_row_stride + tokens;
}

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
/* "float32", "float16", "bfloat16" (for messages). */
const char *fr_dtype_name(fusedrope_dtype dtype);

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

/* The per-pair axis map of a config (lib/axes.c): *map NULL and 1 axis
 * for 1D rope, else rot_dim/2 words (col << 2) | axis (malloc'd) and the
 * number of axes; FUSEDROPE_ERR_INVALID for a bad layout. */
fusedrope_status fr_axes_map(const fusedrope_cache_config *config, int32_t **map, int *num_axes);

/* CPU backends (cpu_apply.c, cpu_norm.c): on x86-64 also build an AVX2
 * clone of a vectorisable loop, picked at load time.  Not under
 * ThreadSanitizer: its instrumented ifunc resolver would run before the
 * TSan runtime is up, and crash the program at load.  Only with glibc
 * (<stdint.h> above defines __GLIBC__): the pick is an ifunc, which musl's
 * loader does not resolve (a musl-gcc build crashed at its first call). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && \
    defined(__GLIBC__) && !defined(__SANITIZE_THREAD__)
#define FR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FR_CLONES
#endif

/* CPU backends: large outputs are written with non-temporal stores: out of
 * place, a plain store first reads the line it fills, a third memory
 * transfer per element that memcpy does not pay.  Outputs smaller than
 * FR_STREAM_MIN_BYTES stay in the cache for the next op. */
#define FR_STREAM_MIN_BYTES ((uint64_t)1 << 22)

/* cpu_apply.c: set by tests only (the fuzz harness, whose tensors stay far
 * under FR_STREAM_MIN_BYTES): every size is taken to lie past the caches,
 * so small calls take the large ones' paths (same bytes). */
extern int fr_beyond_cache_all;

/* Whether data of `bytes` is taken to lie past the caches (streamed outputs,
 * the norm's prefetched inputs), else to stay in them. */
static inline int fr_beyond_cache(uint64_t bytes)
{
    return bytes >= FR_STREAM_MIN_BYTES || __atomic_load_n(&fr_beyond_cache_all, __ATOMIC_RELAXED);
}
#if !defined(__cplusplus)
#ifdef __SSE2__
#include <emmintrin.h>
/* bytes (a multiple of 16) from src (any alignment) to dst (16-byte aligned). */
static inline void fr_stream_row(void *dst, const void *src, size_t bytes)
{
    for (size_t i = 0; i < bytes; i += 16)
        _mm_stream_si128((__m128i *)((char *)dst + i),
                         _mm_loadu_si128((const __m128i *)((const char *)src + i)));
}
#define FR_STREAM_FENCE() _mm_sfence()
#else
#define FR_STREAM_FENCE() ((void)0)
#endif

/* Whether every output row of io (tokens of it, head rows of at most
 * max_row bytes) can be written by fr_stream_row. */
static inline int fr_streamable(const fr_io *io, size_t es, int64_t tokens, size_t max_row)
{
#ifdef __SSE2__
    const size_t row = (size_t)io->head_dim * es;
    return !io->in_place && row % 16 == 0 && row <= max_row &&
           (uintptr_t)io->out % 16 == 0 && (io->out_ss * es) % 16 == 0 &&
           (io->out_sb * es) % 16 == 0 && (io->out_sh * es) % 16 == 0 &&
           fr_beyond_cache((uint64_t)tokens * (uint64_t)io->heads * row);
#else
    (void)io, (void)es, (void)tokens, (void)max_row;
    return 0;
#endif
}

/* Thread id's share [*n0, *n1) of `items` split over `threads`: the first
 * items % threads threads one item more (both OpenMP backends). */
static inline void fr_thread_share(int64_t items, int threads, int id, int64_t *n0, int64_t *n1)
{
    const int64_t base = items / threads, rem = items % threads;
    *n0 = id * base + (id < rem ? id : rem);
    *n1 = *n0 + base + (id < rem);
}
#endif /* !__cplusplus */

/* The four public calls, each a direction (forward, backward) and a count
 * (one tensor, or q and k). */
typedef enum {
    FR_CALL_FORWARD,
    FR_CALL_FORWARD_QK,
    FR_CALL_BACKWARD,
    FR_CALL_BACKWARD_QK
} fr_call;

/* The forward and backward modules' entry: fr_apply with the call's sign,
 * tensor count and argument names (for error messages).  a_in/a_out: x/y,
 * dy/dx, q or dq; b_in/b_out: k or dk (NULL for one tensor). */
fusedrope_status fr_apply_call(const fusedrope_cache *cache, fusedrope_style style, fr_call call,
                               const fusedrope_positions *pos, const fusedrope_tensor *a_in,
                               const fusedrope_tensor *a_out, const fusedrope_tensor *b_in,
                               const fusedrope_tensor *b_out, void *stream);

/* Forward and backward modules both end here: checks every argument, then
 * runs the call on the cache's device.  names: in[0], out[0], in[1], out[1]
 * as the caller calls them, for error messages. */
fusedrope_status fr_apply(const fusedrope_cache *cache, fusedrope_style style, float sgn,
                          const fusedrope_positions *pos, int count,
                          const fusedrope_tensor *const in[2],
                          const fusedrope_tensor *const out[2], const char *const names[4],
                          void *stream);

/* ------------------------------------------------ floating-point environment
 *
 * The CPU computations run in one floating-point environment, whatever the
 * calling thread's.  A caller that flushes subnormals (x86
 * MXCSR FTZ/DAZ, as some inference engines set), rounds upward or unmasks
 * an exception would otherwise get other bytes than DESIGN's promise, or a
 * trap.  Every CPU entry that computes in floating point (the OpenMP
 * backend, the cache build) brackets each thread's part with
 * fr_fpenv_enter/fr_fpenv_leave: the IEEE default environment (round to
 * nearest even, subnormals kept, exceptions masked), then the thread's own
 * again, exactly as it was: its modes and its exception flags (flags raised
 * by the library's arithmetic are dropped).  Once per thread per call, never
 * per element: an MXCSR read and two writes on x86-64, FPCR's and FPSR's on
 * AArch64, fegetenv/fesetenv elsewhere.  OpenMP workers have their own
 * registers, so the bracket goes
 * inside the parallel region; and around it on the calling thread too, for
 * the team's start (lib/cpu_team.c). */
#if !defined(__cplusplus)
#if defined(__x86_64__) && defined(__SSE2__)
/* x86-64 does its float and double arithmetic (the library's and libm's) in
 * SSE, under MXCSR alone; the x87 unit is not used. */
#include <xmmintrin.h>
#define FR_FPENV_MXCSR 1
typedef struct { unsigned int mxcsr; } fr_fpenv;
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
/* AArch64: FPCR holds the modes, FPSR the flags.  glibc's
 * fesetenv(FE_DFL_ENV) keeps the caller's FPCR.DN (every NaN result the
 * default NaN: other NaN bits than DESIGN's propagation), AHP and FZ16;
 * FPCR 0 is the architecture's default (round to nearest, no flush, NaNs
 * propagated, traps off), the one a Linux process starts in. */
#define FR_FPENV_FPCR 1
typedef struct { uint64_t fpcr, fpsr; } fr_fpenv;
#else
#include <fenv.h>
typedef struct { fenv_t env; } fr_fpenv;
#endif

/* MXCSR's default: every exception masked, round to nearest, FTZ and DAZ
 * clear, no flag raised. */
#define FR_MXCSR_DEFAULT 0x1f80u

static inline void fr_fpenv_enter(fr_fpenv *saved)
{
#ifdef FR_FPENV_MXCSR
    saved->mxcsr = _mm_getcsr();
    if (saved->mxcsr != FR_MXCSR_DEFAULT)
        _mm_setcsr(FR_MXCSR_DEFAULT);
#elif defined(FR_FPENV_FPCR)
    /* "memory": no load of the computation's data moves across a switch
     * (an opaque call, as fesetenv is, orders them so too) */
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved->fpcr) : : "memory");
    __asm__ volatile("mrs %0, fpsr" : "=r"(saved->fpsr) : : "memory");
    if (saved->fpcr != 0)
        __asm__ volatile("msr fpcr, %0" : : "r"((uint64_t)0) : "memory");
#else
    /* FE_DFL_ENV: round to nearest, exceptions masked, and (glibc, musl)
     * flush-to-zero off where the architecture has it (AArch64 FPCR.FZ) */
    fegetenv(&saved->env);
    fesetenv(FE_DFL_ENV);
#endif
}

static inline void fr_fpenv_leave(const fr_fpenv *saved)
{
#ifdef FR_FPENV_MXCSR
    _mm_setcsr(saved->mxcsr);
#elif defined(FR_FPENV_FPCR)
    __asm__ volatile("msr fpcr, %0" : : "r"(saved->fpcr) : "memory");
    __asm__ volatile("msr fpsr, %0" : : "r"(saved->fpsr) : "memory");
#else
    fesetenv(&saved->env);
#endif
}

#endif /* !__cplusplus: the kernels compute on the GPU */

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
fusedrope_status fr_check_pointer(const void *p, const char *name, const fusedrope_cache *cache);
/* An array of n elements of es bytes at p (not NULL): aligned to its
 * elements and its extent addressable; *bytes = n * es. */
fusedrope_status fr_check_array(const void *p, int64_t n, size_t es, const char *name,
                                int64_t *bytes);

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
 * (kernels/cuda_norm_*.cu, or lib/cuda_stub.c).  The CPU ones return
 * FUSEDROPE_ERR_NOMEM where scratch memory cannot be had, before writing. */
fusedrope_status fr_cpu_norm_forward(const fr_norm_args *args);
fusedrope_status fr_cpu_norm_backward(const fr_norm_args *args);
fusedrope_status fr_cuda_norm_forward(const fr_norm_args *args);
fusedrope_status fr_cuda_norm_backward(const fr_norm_args *args);

/* OpenMP backend (lib/cpu_apply.c). */
void fr_cpu_apply(const fr_apply_args *args);

/* The team a CPU call of `elems` elements (its tensors together) asks for,
 * both OpenMP backends' rule and the table build's (lib/cpu_team.c;
 * fusedrope_cache_create(3), num_threads): a call under FR_TEAM_MIN_ELEMS
 * runs on the calling thread (starting a team cost 1.3-2 us a call, the
 * work ~0.2 ns an element on one core: 2 threads broke even at 10-20K
 * elements and saved >= 15% from 30K on, decode calls in bench/RESULTS.md);
 * larger ones the cache's num_threads, or the OpenMP default.  1 without
 * OpenMP, and in a child forked from a process that ran more than one
 * thread (cpu_team.c). */
#define FR_TEAM_MIN_ELEMS ((int64_t)1 << 15)
int fr_cpu_team_size(const fusedrope_cache *cache, int64_t elems);
/* Whether a call on nth threads (fr_cpu_team_size) opens a parallel region,
 * as all three CPU backends decide (OpenMP builds): for a team, or inside
 * the caller's active region, where the call's thread numbers and
 * worksharing must be its own nested region's of one.  Otherwise it runs on
 * the calling thread: even an inactive region (a false if clause) costs
 * 0.3-0.5 us, more than a small call (bench/RESULTS.md). */
int fr_cpu_needs_team(int nth);
/* Set by tests only (the fuzz harness, whose calls stay under
 * FR_TEAM_MIN_ELEMS): when > 0, every call and table build, however small,
 * asks for a team of this many threads (the same bytes: no result depends
 * on the team). */
extern int fr_team_all;
/* For tests, and for fusedrope-bench's copy (the same team as the call it
 * is set beside): the size of the OpenMP team of this thread's last CPU
 * forward or backward call, plain or norm, or 0 when it ran on the calling
 * thread without a parallel region. */
#ifndef __cplusplus
extern _Thread_local int fr_cpu_team;
#endif

/* cpu_avx2.c (x86-64): fp16/bf16 heads rotated with AVX2 and F16C, for CPUs
 * that have both; every non-NaN result is the portable path's to the bit.
 * fr_avx2_off, set by tests only, makes fr_avx2_usable() say no. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FR_HAVE_AVX2 1
int fr_avx2_usable(void);
int fr_x86_has(unsigned xcr0_bits, unsigned leaf7_ebx); /* cpu_avx2.c, for both SIMD files */
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
/* A whole head of `half` pairs, NeoX (x[i], x[half + i]) or interleaved,
 * whose cos/sin come in steps of 8 pairs: those of pair i are
 * cs8[i / 8][i % 8] and sn8[i / 8][i % 8] (an axes map's pairs rotated
 * straight from their axis's table row, cpu_apply.c). */
void fr_avx2_rotate_steps_f16(const uint16_t *x, uint16_t *y, int64_t half, int interleaved,
                              const float *const *cs8, const float *const *sn8, float sgn, int nt);
void fr_avx2_rotate_steps_bf16(const uint16_t *x, uint16_t *y, int64_t half, int interleaved,
                               const float *const *cs8, const float *const *sn8, float sgn,
                               int nt);
extern int fr_avx2_off;

/* cpu_avx512.c (x86-64): the same six rotations with AVX-512 F/BW/VL, and
 * runs of heads sharing cos/sin, for CPUs that have it, each result the
 * AVX2 one's to the bit.  fr_avx512_off,
 * set by tests only, makes fr_avx512_usable() say no, as fr_avx2_off does
 * too (which so still means the portable path). */
#define FR_HAVE_AVX512 1
int fr_avx512_usable(void);
void fr_avx512_rotate_f16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya, uint16_t *yb,
                          const float *cs, const float *sn, int64_t m, float sgn, int nt);
void fr_avx512_rotate_bf16(const uint16_t *xa, const uint16_t *xb, uint16_t *ya, uint16_t *yb,
                           const float *cs, const float *sn, int64_t m, float sgn, int nt);
void fr_avx512_rotate_pairs_f16(const uint16_t *x, uint16_t *y, const float *cs,
                                const float *sn, int64_t m, float sgn, int nt);
void fr_avx512_rotate_pairs_bf16(const uint16_t *x, uint16_t *y, const float *cs,
                                 const float *sn, int64_t m, float sgn, int nt);
void fr_avx512_rotate_steps_f16(const uint16_t *x, uint16_t *y, int64_t half, int interleaved,
                                const float *const *c8, const float *const *s8, float sgn, int nt);
void fr_avx512_rotate_steps_bf16(const uint16_t *x, uint16_t *y, int64_t half, int interleaved,
                                 const float *const *c8, const float *const *s8, float sgn, int nt);
/* n heads at x + h xstep (output y + h ystep; elements), each of `half`
 * pairs rotated with the same cos/sin in 8-pair steps (c8/s8, as the steps
 * above; a 1D row's steps are cs + 8 k), for halves that
 * fr_avx512_heads_fit; nt: every head's output 16-byte aligned. */
static inline int fr_avx512_heads_fit(int64_t half)
{
    return half == 16 || half == 32 || half == 48 || half == 64;
}
/* An axes table's pairs in 16-pair steps whose lanes on each axis a take
 * consecutive columns of its row: in step k, the lanes of mask[k][a] take
 * column base[k][a] + lane (INTERLEAVED's T H W T H W ..., ALTERNATING,
 * SECTIONS).  fr_gather_plan_init (cpu_apply.c) says whether a map has that
 * form; fr_avx512_gather then builds a token's cos/sin row from masked
 * loads of its axes' rows, 64-byte stores c[16 k ..] and s[16 k ..]
 * (nsteps * 16 floats each, 64-byte aligned). */
typedef struct {
    int nsteps;
    uint16_t mask[16][FUSEDROPE_MAX_AXES];
    int32_t base[16][FUSEDROPE_MAX_AXES];
} fr_gather_plan;
void fr_avx512_gather(const fr_gather_plan *g, const float *tc, const float *ts,
                      const int64_t *pax, int64_t half, float *c, float *s);
void fr_avx512_rotate_heads_f16(const uint16_t *x, int64_t xstep, uint16_t *y, int64_t ystep,
                                int64_t n, int64_t half, int interleaved, const float *const *c8,
                                const float *const *s8, float sgn, int nt);
void fr_avx512_rotate_heads_bf16(const uint16_t *x, int64_t xstep, uint16_t *y, int64_t ystep,
                                 int64_t n, int64_t half, int interleaved, const float *const *c8,
                                 const float *const *s8, float sgn, int nt);
extern int fr_avx512_off;
#endif

/* A cache line, and n floats rounded up to whole lines: scratch that
 * threads write side by side is laid out in lines of its own, from the
 * first line boundary inside a block malloc'ed FR_LINE_BYTES longer
 * (fr_line_start). */
#define FR_LINE_BYTES 64
static inline int64_t fr_line_floats(int64_t n)
{
    const int64_t per = FR_LINE_BYTES / (int64_t)sizeof(float);
    return (n + per - 1) / per * per;
}
static inline float *fr_line_start(void *block)
{
    return (float *)((char *)block + (FR_LINE_BYTES - (uintptr_t)block % FR_LINE_BYTES));
}

/* CUDA backend (the kernels directory, or lib/cuda_stub.c without CUDA).  Every one
 * returns a status and records its detail with fr_fail. */
int fr_cuda_device_present(void);
fusedrope_status fr_cuda_cache_upload(fusedrope_cache *cache);  /* host cos/sin/inv_freq -> device */
fusedrope_status fr_cuda_cache_download(const fusedrope_cache *cache, float *cos, float *sin);
void fr_cuda_cache_release(fusedrope_cache *cache);
fusedrope_status fr_cuda_cache_check(const fusedrope_cache *cache, void *stream);
/* Where p points, once the process has a CUDA cache (before that, and
 * without CUDA, always FR_PTR_HOST); FR_PTR_ERROR records its detail.
 * FR_PTR_PINNED: page-locked host memory the device reaches at the same
 * address (cudaMallocHost, cudaHostAlloc; host memory for everything but
 * pos->range_status). */
/* FR_PTR_UNCHECKED: not asked, the caller opted out of the queries
 * (FUSEDROPE_CUDA_POINTER_CHECKS=0); every device accepts it. */
enum { FR_PTR_ERROR = -1, FR_PTR_HOST, FR_PTR_DEVICE, FR_PTR_MANAGED, FR_PTR_PINNED,
       FR_PTR_UNCHECKED };
/* *device: for FR_PTR_DEVICE the ordinal of the device the memory is on,
 * else -1. */
int fr_cuda_pointer_kind(const void *p, int *device);
fusedrope_status fr_cuda_apply(const fr_apply_args *args);

#ifdef __cplusplus
}
#endif

#endif /* FUSEDROPE_INTERNAL_H */
