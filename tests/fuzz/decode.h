/*
 * decode.h - what the libFuzzer targets share (tests/fuzz/decode.c): the
 * byte source, the decoding of input bytes into a cache and into the tensors,
 * buffers and positions of one call, the model of the plain calls' rules
 * (forward_qk's: the fused norm adds its own on top), and the checks of a
 * call's status and of the bytes it wrote.
 *
 * fuzz_apply.c (the plain calls) and fuzz_norm.c (the fused RMSNorm + RoPE)
 * each define LLVMFuzzerTestOneInput on top of it.  See fuzz_apply.c's
 * opening comment for what the decoding covers and for the model.
 */
#ifndef FUSEDROPE_FUZZ_DECODE_H
#define FUSEDROPE_FUZZ_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "fusedrope.h"
#include "../ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_LIMIT ((size_t)1 << 20) /* largest buffer the harness allocates */
#define FZ_SMALL ((size_t)64)      /* buffer behind a tensor too large to allocate */
#define FZ_MAX_ARRAY 65536         /* largest position array */
#define FZ_MAX_TABLE 65536         /* largest table (positions x rot_dim/2) */
#define FZ_MAX_ITEMS 4096          /* (token, head) items value-checked per tensor */

typedef __int128 i128;

/* ------------------------------------------------------------ diagnostics */

extern const char *fz_name;                /* the target's name, for its reports */
extern int strict_mode, verbose_mode;
extern unsigned long conservative_refusals; /* disjoint views refused as overlapping */
extern int fz_last_call;                   /* the run is the input's last call (fz_ext_call) */
extern char trace[4096];
extern size_t trace_len;

void fz_env(void);
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void finding(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#define CHECK(cond, ...)            \
    do {                            \
        if (!(cond))                \
            finding(__VA_ARGS__);   \
    } while (0)

/* ------------------------------------------------------------ byte source */

typedef struct {
    const uint8_t *p;
    size_t n, i;
} src_t;

unsigned u8(src_t *s);
unsigned u16(src_t *s);
uint32_t u32(src_t *s);
uint64_t u64(src_t *s);
int64_t any_i64(src_t *s);
int64_t dim(src_t *s, int64_t lo, int64_t span);
int any_int(src_t *s);
double any_double(src_t *s, double dflt);

/* -------------------------------------------------------- random contents */

typedef struct { uint64_t s; } rng_t;

uint64_t rnext(rng_t *r);
size_t dtype_size(int dt);
int dtype_ok(int dt);
void fill(unsigned char *p, size_t n, int dt, rng_t *r, int specials);
double load(const unsigned char *p, int dt);

/* ------------------------------------------------------------------ cache */

typedef struct {
    fusedrope_cache *cache;
    int type;                 /* rope type, -1 for a user table */
    int rot_dim, half;
    int64_t max_positions;
    double inv[FUSEDROPE_MAX_ROT_DIM / 2]; /* ref_inv_freq's inverse frequencies */
    double attn;              /* and attention factor */
    int formula;              /* 1: cos/sin from inv[] and attn in double (every rope type) */
    float *tcos, *tsin;       /* else: the user's float table [trows][half] */
    int64_t trows;
    fusedrope_cache_config cfg;
    double *sf, *lf;          /* longrope factors */
    /* position axes (ref_axes_map): naxes 1 and the identity without */
    int has_axes, naxes;
    unsigned char axis[FUSEDROPE_MAX_ROT_DIM / 2];
    int col[FUSEDROPE_MAX_ROT_DIM / 2];
    unsigned char *pair_axis; /* a CUSTOM map given to the cache */
    int *pair_col;
} cache_t;

/* Library defects the harness found (fixed; regression tests in
 * tests/fuzz/test_regress.c).  With FUSEDROPE_FUZZ_LENIENT=1 the harness
 * steers around them, to fuzz a library from before the fixes. */
enum {
    KI_NONFINITE_TABLE = 1, /* an accepted config gives a non-finite attention factor or inv_freq */
    KI_CP_INT_OVERFLOW,     /* fr_cp_position computes 2 * cp_size in int: UB for cp_size >= 2^30 */
    KI_POS_IN_OUTPUT,       /* a position array inside an output is re-read after being written */
    KI_MISALIGNED,          /* data not aligned to its element size is accepted (UB, GPU fault) */
};

int known_issue(int which);
/* Builds the cache the input describes and checks the create call.  Returns
 * 1 with ct->cache set (a CPU cache), or 0 when there is none. */
int make_cache(src_t *s, cache_t *ct, rng_t *r);
void free_cache_t(cache_t *ct);
/* One fuzz input: the trace reset, the RNG seeded from its first bytes, the
 * process settings (misc), a cache, then one or two calls of `run` on it
 * (or, where no cache could be made, one call on a stand-in with null_cache
 * 1); the trace printed in verbose mode.  Both targets' entry point. */
typedef void (*fz_run_fn)(src_t *s, cache_t *ct, rng_t *r, int null_cache);
int fz_input(const uint8_t *data, size_t size, fz_run_fn run);

/* --------------------------------------------------------------- tensors */

enum { BUF_NONE = -1 };

typedef struct {
    int present;           /* the descriptor pointer is non-NULL */
    fusedrope_tensor t;
    int buf;               /* buffer index, or BUF_NONE */
    size_t off;            /* byte offset of data in the buffer */
    int data_kind;         /* 0 buffer, 1 NULL, 2 a bogus address (empty tensors only) */
    int shape_ok;          /* dtype valid, sizes and strides >= 0 */
    int empty;
    int overflow;          /* extent past INT64_MAX bytes */
    int oversize;          /* extent in (FZ_LIMIT, INT64_MAX]: small buffer, call forced to fail */
    int arbitrary;         /* strides not from a standard or padded layout */
    i128 ext;              /* extent in bytes (shape_ok && !empty) */
} tspec;

int64_t smul(int64_t a, int64_t b);
int64_t sadd(int64_t a, int64_t b);
void gen_strides(src_t *s, fusedrope_tensor *t, int family, int *arbitrary);
void classify(tspec *ts);
int mappable(const tspec *ts);
size_t esize_or1(int dt);
void copy_strides(fusedrope_tensor *y, const fusedrope_tensor *x);

/* ------------------------------------------------------------- positions */

typedef struct {
    int given;                  /* pointer non-NULL */
    int in_buf[3];              /* ids, offsets, cu_seqlens inside buffer in_buf - 1 (0: own) */
    size_t in_off[3], in_bytes[3];
    fusedrope_positions p;
    int64_t *ids, *offsets;
    int32_t *cu;
    int64_t n_ids, n_offsets, n_cu;
    int rows;                   /* ids rows the model reads: ids_axes when it is > 1, else 1 */
    int64_t row_stride;         /* elements between them */
} pspec;

void free_pspec(pspec *ps);

/* -------------------------------------------------------------- the call */

typedef struct {
    unsigned char *p, *snap;
    unsigned char *map;  /* per byte: bit k for tensor k (in0, out0, in1, out1); 0x10 up: the target's */
    size_t size;
} buf_t;

#define MAXBUF 4

typedef struct {
    unsigned allowed;    /* statuses the model allows (computed last) */
    unsigned hard, soft; /* statuses of broken rules; of rules the library may or may not apply */
    int must_fail;
    int conservative_ok; /* bit k: output k's documented conservative self-overlap refusal is tolerated */
    int pair_ok;         /* two views (an output and an input, or the outputs) whose byte ranges
                          * meet without a shared element: the library's conservative
                          * "may overlap" refusal is tolerated */
    char why[512];
} verdict;

void reason(verdict *v, fusedrope_status st, int hard, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int mark(buf_t *bufs, const tspec *ts, unsigned bit, int stop_at_self);
int shares(const buf_t *bufs, const tspec *a, unsigned ba, const tspec *b, unsigned bb);
int same_view(const tspec *x, const tspec *y);

/* One decoded call: q (and, for a _qk call, k) input and output tensors in
 * up to MAXBUF buffers, the positions, and the model's verdict on the plain
 * rules.  tokpos[a * S*B + b * S + s]: the position of token (b, s) on axis
 * a (naxes rows), exactly, when the model computed it. */
typedef struct {
    int qk, count, family, style, dt, rot, packed, null_cache;
    unsigned layout, rel[2];
    size_t es;
    tspec ts[4];           /* in0, out0, in1, out1 */
    buf_t bufs[MAXBUF];
    int nbuf;
    pspec ps;
    verdict v;
    int64_t S, B, heads[2], hd[2];
    void *stream;
    i128 *tokpos;
    int forced, any_nonempty, all_valid, pos_struct_ok, naxes;
    int forced_how;        /* 1 offsets INT64_MIN, 2 style 77 */
    int forced_other;      /* the model had a hard reason besides the forcing */
    /* fz_ext_call: inputs the plain decoding never makes (bytes after the
     * last call's decode, each 0 = as before) */
    int rs_kind;           /* range_status: 0 NULL, 1 own word, 2 misaligned, 3..5 inside */
    int32_t *rs_word;      /* the own word (sentinel, never written by a CPU call) */
    unsigned char *rs_mem; /* its memory */
    int size_kind;         /* pos struct_size: 0 sizeof, else what fz_ext_call chose */
    const char *expect;    /* the single new rule broken: a word its refusal must name */
    unsigned char pos_big[sizeof(fusedrope_positions) + 16]; /* pos with another struct_size */
    void *pos_copy[3];     /* the own position arrays before the call */
    unsigned written_mask; /* map bits a successful call may write (0xa: the outputs) */
    char before[600];      /* fusedrope_last_error() before the call */
} fz_call;

/* Decodes a call after its first byte (the caller's choice of API: qk 0 for
 * one tensor pair, 1 for q and k) and applies the plain rules to it. */
void fz_setup(src_t *s, cache_t *ct, rng_t *r, int null_cache, int qk, fz_call *fc);
/* Computes fc->v.allowed from the reasons given so far and traces the call. */
void fz_model_done(fz_call *fc, const char *name);
/* Snapshots the buffers and fusedrope_last_error() just before the call. */
void fz_snapshot(fz_call *fc);
/* The status against the model; a refused call changed no buffer byte, an
 * accepted one no byte outside fc->written_mask nor last_error. */
void fz_verdict(fz_call *fc, fusedrope_status st);
void fz_call_free(fz_call *fc);

/* The positions the call passes: NULL, &fc->ps.p or fc->pos_big. */
const fusedrope_positions *fz_pos(fz_call *fc);
/* After fz_setup, for the input's last call: reads the extension bytes (0 or
 * past the end: nothing) and adds their rules to the model. */
void fz_ext_call(src_t *s, const cache_t *ct, fz_call *fc);
/* After the call, whatever its status: range_status and the own position
 * arrays unchanged. */
void fz_after_call(fz_call *fc, fusedrope_status st);
/* Before and after a re-run of an accepted call on another of the CPU's
 * paths: fz_rerun_begin restores the inputs and keeps the first results,
 * fz_rerun_end compares (same bytes; NaN stays NaN) and frees them.
 * fz_cpu_path: 0 the library's choice (AVX-512 where the CPU has it), 1
 * the AVX2 rows alone, 2 the portable loops, 3 the library's choice with
 * every call taken for one past the caches (streamed outputs: the
 * harness's tensors stay under FR_STREAM_MIN_BYTES), 4 the library's
 * choice on a team of FZ_TEAM threads (the harness's calls stay under the
 * size that starts a team); FZ_CPU_PATHS - 1 others to rerun on. */
#define FZ_CPU_PATHS 5
#define FZ_TEAM 3
unsigned char **fz_rerun_begin(fz_call *fc);
void fz_rerun_end(fz_call *fc, unsigned char **first, fusedrope_status st);
void fz_cpu_path(int path);

/* Status strings, version and NULL getters. */
void misc(src_t *s);

#endif /* FUSEDROPE_FUZZ_DECODE_H */
