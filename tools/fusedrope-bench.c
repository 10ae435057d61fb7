/*
 * fusedrope-bench - time libfusedrope's forward and backward and verify every
 * result against an independent float64 reference.
 *
 * For each shape: random input, a poisoned output, one call checked against
 * the tests' float64 reference (tests/ref.c in tests/libfrtest.a: default
 * rope, theta 10000, cos/sin in double, the rotation and precision bound that
 * fusedrope_forward(3) states under Rotation, the same position model), a scan of the whole output for
 * elements the call did not write, then a warm-up and N timed calls (median),
 * and a plain copy of the same number of bytes timed in the same run.
 *
 * Uses only the public API, plus, when built with CUDA, the CUDA runtime's C
 * API for device buffers, events and the device-to-device copy.
 */
#define _POSIX_C_SOURCE 200809L
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "fusedrope.h"
#include "internal.h" /* fr_cpu_team: the team of the library's last CPU call */
#include "../tests/ref.h"

#define PROG "fusedrope-bench"
#define MAX_SHAPES 64
#define MAX_SAMPLED_TOKENS 2048
#define MAX_SETS 65536
#define ALIGN 256 /* every tensor of a buffer set starts on this boundary */
#define OFFSET_POSITIONS 8192 /* table rows at least, with --offsets: a decode step's cache */
#define OFFSET_STRIDE 7919    /* prime: b * stride mod span is distinct while span is coprime */
#define MiB (1024.0 * 1024.0)

enum layout { L_SBHD, L_BSHD, L_THD };
enum op { OP_FWD, OP_BWD };

typedef struct { int64_t s, b, h, d; } shape;

static struct {
    shape shapes[MAX_SHAPES];
    int nshapes;
    fusedrope_dtype dtype;
    enum layout layout;
    fusedrope_style style;
    fusedrope_device device;
    int iters, warmup;         /* -1: the device's default */
    int64_t rot_dim;           /* 0: head_dim (rounded down to even) */
    int inplace;
    int offsets;               /* pos.offsets[b]: each batch entry at its own start */
    fusedrope_axes axes;       /* --axes: the cache's position axes (NONE: 1D rope) */
    int sections[FUSEDROPE_MAX_AXES];
    char axes_str[64];         /* --axes as given, for the header */
    int ids_rows;              /* --ids-rows: explicit ids, a row per axis */
    int qk;
    int64_t hq, hk;
    int norm;                  /* --norm: 1 + the kind's index in norm_kinds */
    uint64_t seed;
    double working_set_mb;     /* 0: chosen from the device's cache size */
    int graph;                 /* --graph N: also time N calls replayed in one CUDA graph */
} opt = {
    .nshapes = 0, .dtype = FUSEDROPE_BFLOAT16, .layout = L_SBHD, .style = FUSEDROPE_NEOX,
    .device = FUSEDROPE_DEVICE_AUTO, .iters = -1, .warmup = -1, .seed = 1,
};

/* --norm KIND: the fused per-head RMSNorm + RoPE (fusedrope_norm_forward_qk)
 * with these weight kinds and rounding modes. */
static const struct {
    const char *name;
    fusedrope_norm_weight weight;
    fusedrope_norm_rounding rounding;
} norm_kinds[] = {
    { "qwen3", FUSEDROPE_NORM_WEIGHT, FUSEDROPE_NORM_ROUND_LLAMA },
    { "gemma", FUSEDROPE_NORM_WEIGHT_PLUS_ONE, FUSEDROPE_NORM_ROUND_GEMMA },
    { "once", FUSEDROPE_NORM_WEIGHT, FUSEDROPE_NORM_ROUND_ONCE },
    { "none", FUSEDROPE_NORM_WEIGHT_NONE, FUSEDROPE_NORM_ROUND_ONCE },
};

static int g_cuda;             /* this run uses the CUDA device */
static size_t g_cache_bytes;   /* GPU L2, or CPU last-level cache */
#ifdef HAVE_CUDA
static cudaStream_t g_stream;
static cudaEvent_t *g_ev0, *g_ev1;
#endif

/* ------------------------------------------------------------ small helpers */

static const char *dtype_name(fusedrope_dtype t)
{
    return t == FUSEDROPE_FLOAT32 ? "fp32" : t == FUSEDROPE_FLOAT16 ? "fp16" : "bf16";
}

static const char *layout_name(enum layout l)
{
    return l == L_SBHD ? "sbhd" : l == L_BSHD ? "bshd" : "thd";
}


static _Noreturn void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, PROG ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* A bad option or option value (exit status 2); defined with the parser. */
static _Noreturn void bad_option(const char *fmt, ...);

static void lib_check(fusedrope_status st, const char *what)
{
    if (st != FUSEDROPE_OK) {
        const char *detail = fusedrope_last_error();
        die("%s failed: %s%s%s", what, fusedrope_status_string(st),
            detail && *detail ? ": " : "", detail ? detail : "");
    }
}

#ifdef HAVE_CUDA
#define CK(call) cuda_check((call), #call, __LINE__)
static void cuda_check(cudaError_t e, const char *what, int line)
{
    if (e != cudaSuccess) {
        const char *detail = fusedrope_last_error();
        die("%s (line %d) failed: %s: %s; last library error: %s", what, line,
            cudaGetErrorName(e), cudaGetErrorString(e), detail && *detail ? detail : "(none)");
    }
}
#endif

static void *xmalloc(size_t n)
{
    void *p = NULL;
    if (n == 0)
        n = 1;
    if (posix_memalign(&p, 4096, n) != 0 || !p)
        die("out of host memory (%.1f MiB)", n / MiB);
    return p;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}


/* ------------------------------------------- buffers on the run's device */

static void *buf_alloc(size_t n)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        void *p = NULL;
        CK(cudaMalloc(&p, n ? n : 1));
        return p;
    }
#endif
    return xmalloc(n);
}

static void buf_free(void *p)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        if (p)
            CK(cudaFree(p));
        return;
    }
#endif
    free(p);
}

static void buf_upload(void *dst, const void *src, size_t n)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        CK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
        return;
    }
#endif
    memcpy(dst, src, n);
}

static void buf_download(void *dst, const void *src, size_t n)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
        return;
    }
#endif
    memcpy(dst, src, n);
}

static void buf_copy(void *dst, const void *src, size_t n)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice));
        return;
    }
#endif
    memcpy(dst, src, n);
}

static void buf_fill(void *dst, int byte, size_t n)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        CK(cudaMemset(dst, byte, n));
        CK(cudaDeviceSynchronize());
        return;
    }
#endif
    memset(dst, byte, n);
}

static void dev_sync(void)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaGetLastError());
    }
#endif
}

/* Waits for everything on the device (the setup's copies and memsets). */
static void dev_barrier(void)
{
#ifdef HAVE_CUDA
    if (g_cuda)
        CK(cudaDeviceSynchronize());
#endif
}

static void *stream_arg(void)
{
#ifdef HAVE_CUDA
    if (g_cuda)
        return (void *)g_stream;
#endif
    return NULL;
}

/* ------------------------------------------------------------ random input */

/* Uniform in [-1, 1), rounded to the dtype (fp16: to multiples of 2^-11). */
static void fill_random(void *buf, size_t n, uint64_t seed)
{
    uint64_t st = seed * 0x2545f4914f6cdd1dULL + 0x1234567ULL;
    for (size_t i = 0; i < n; i++) {
        double x = (double)(ref_splitmix(&st) >> 11) * 0x1p-53 * 2.0 - 1.0;
        if (opt.dtype == FUSEDROPE_FLOAT16)
            x = nearbyint(x * 2048.0) / 2048.0;
        ref_store(buf, opt.dtype, (int64_t)i, x);
    }
}

static double load_elem(const void *buf, size_t i)
{
    return ref_load(buf, opt.dtype, (int64_t)i);
}

/* ------------------------------------------------------------------ a case */

typedef struct {
    shape sh;
    int64_t tokens;            /* S*B (THD: packed tokens) */
    int64_t rot;               /* rot_dim */
    int nparts;                /* 1, or 2 for q and k */
    int64_t heads[2];
    size_t elems[2], bytes[2]; /* one tensor of each part */
    size_t in_off[2], out_off[2];
    size_t dy_off[2];          /* --norm: the backward's dy, its own region of each set */
    size_t set_bytes;
    int nsets;
    char *base;                /* nsets buffer sets, on the run's device */
    fusedrope_tensor *tin, *tout; /* [nsets][2] */
    fusedrope_tensor *tdy;     /* --norm: [nsets][2] */
    fusedrope_cache *cache;
    fusedrope_positions pos;
    const fusedrope_positions *ppos;
    int32_t *cu_host, *cu_dev;
    int64_t *off_host, *off_dev; /* [batch], with --offsets */
    int64_t *ids_host, *ids_dev; /* [rows][tokens], with --ids-rows */
    int ids_nrows;             /* rows of ids: the cache's axes, or 1 without axes */
    int64_t nseqs, max_len;
    int64_t table_rows;        /* the cache's max_positions */
    fusedrope_positions hpos;  /* the positions, host arrays (for the reference) */
    ref_rope ref;              /* the reference's inv_freq and attention factor */
    void *h_in[2], *h_out[2];  /* host copies for verification */
    void *h_dy[2];             /* --norm: the backward's dy */
    double bytes_moved[2];     /* by enum op */
    size_t copy_bytes[2];
    char shape_str[96];
    /* --norm: weights ([head_dim] of the dtype), rstd ([tokens][heads]) and
     * weight gradients per part, on the device; their host copies */
    fusedrope_norm norm;
    void *w_dev[2];
    float *rstd_dev[2], *dw_dev[2];
    double *w_host[2];
} bcase;

static char *in_ptr(const bcase *c, int set, int p)
{
    return c->base + (size_t)set * c->set_bytes + c->in_off[p];
}

static char *out_ptr(const bcase *c, int set, int p)
{
    return opt.inplace ? in_ptr(c, set, p) : c->base + (size_t)set * c->set_bytes + c->out_off[p];
}

static char *dy_ptr(const bcase *c, int set, int p)
{
    return c->base + (size_t)set * c->set_bytes + c->dy_off[p];
}

/* Where op writes: the output region, but the norm's backward in place
 * writes dx over dy (x is the saved input, which it must not change). */
static char *result_ptr(const bcase *c, enum op op, int set, int p)
{
    return opt.norm && op == OP_BWD && opt.inplace ? dy_ptr(c, set, p) : out_ptr(c, set, p);
}

static fusedrope_tensor make_tensor(const bcase *c, void *data, int64_t heads)
{
    switch (opt.layout) {
    case L_SBHD: return fusedrope_tensor_sbhd(data, opt.dtype, c->sh.s, c->sh.b, heads, c->sh.d);
    case L_BSHD: return fusedrope_tensor_bshd(data, opt.dtype, c->sh.b, c->sh.s, heads, c->sh.d);
    default: return fusedrope_tensor_thd(data, opt.dtype, c->tokens, heads, c->sh.d);
    }
}

/* A few uneven sequences (weights from the digits of pi) summing to T, each
 * at least one token long. */
static void make_cu_seqlens(bcase *c)
{
    static const int w[8] = { 3, 1, 4, 1, 5, 9, 2, 6 };
    int64_t n = c->tokens < 8 ? c->tokens : 8, W = 0, acc = 0;
    for (int64_t k = 0; k < n; k++)
        W += w[k];
    c->nseqs = n;
    c->cu_host = xmalloc((size_t)(n + 1) * sizeof(int32_t));
    c->cu_host[0] = 0;
    c->max_len = 0;
    for (int64_t k = 0; k < n; k++) {
        acc += w[k];
        c->cu_host[k + 1] = (int32_t)(k + 1 + (c->tokens - n) * acc / W);
        if (c->cu_host[k + 1] - c->cu_host[k] > c->max_len)
            c->max_len = c->cu_host[k + 1] - c->cu_host[k];
    }
}

/* Deterministic, distinct starts for the B batch entries, spread over a table
 * of at least OFFSET_POSITIONS rows, as in a decode step where every sequence
 * has a different length so far. Offsets stay in [0, span) with span =
 * rows - S + 1, so every position of every entry is inside the table. */
static void make_offsets(bcase *c)
{
    int64_t S = c->sh.s, B = c->sh.b, rows, span;
    rows = S + B - 1 > OFFSET_POSITIONS ? S + B - 1 : OFFSET_POSITIONS; /* span >= B */
    span = rows - S + 1;
    if (span % OFFSET_STRIDE == 0) { /* a multiple of the stride: every offset the same */
        span++;
        rows++;
    }
    c->table_rows = rows;
    c->off_host = xmalloc((size_t)B * sizeof(int64_t));
    for (int64_t b = 0; b < B; b++)
        c->off_host[b] = (b * OFFSET_STRIDE + 17) % span;
}

/* Position of token t, t counted in memory order over the S*B tokens: the
 * reference's model (ref_token_position) of this case's positions. */
static int64_t token_position(const bcase *c, int64_t t)
{
    int64_t S = c->sh.s, B = c->sh.b, p;
    switch (opt.layout) {
    case L_SBHD: /* t = s*B + b */
        ref_token_position(&c->hpos, (t % B) * S + t / B, t % B, t / B, S, &p);
        return p;
    case L_BSHD: /* t = b*S + s */
        ref_token_position(&c->hpos, t, t / S, t % S, S, &p);
        return p;
    default: {
        int64_t k = 0;
        while (k + 1 < c->nseqs && c->cu_host[k + 1] <= t)
            k++;
        ref_token_position(&c->hpos, t, k, t - c->cu_host[k], c->cu_host[k + 1] - c->cu_host[k],
                           &p);
        return p;
    }
    }
}

/* Row index of token t (memory order) in a row of ids: b * S + s, or the
 * packed token for THD. */
static int64_t ids_index(const bcase *c, int64_t t)
{
    return opt.layout == L_SBHD ? (t % c->sh.b) * c->sh.s + t / c->sh.b : t;
}

/* Position of token t on every axis of the cache: its row of ids per axis
 * with --ids-rows on a cache with axes, else its one position on each. */
static void token_axes(const bcase *c, int64_t t, int64_t pax[FUSEDROPE_MAX_AXES])
{
    for (int a = 0; a < FUSEDROPE_MAX_AXES; a++)
        pax[a] = c->ids_nrows > 1 && a < c->ids_nrows
                     ? c->ids_host[(size_t)a * (size_t)c->tokens + (size_t)ids_index(c, t)]
                     : token_position(c, t);
}

/* Explicit positions for --ids-rows: a row per axis of the cache (one row
 * without axes), uniform in the table's [0, rows), built once. */
static void make_ids(bcase *c, int nrows)
{
    uint64_t st = opt.seed * 0x9e3779b97f4a7c15u + 12345u;
    size_t n = (size_t)nrows * (size_t)c->tokens;
    c->ids_nrows = nrows;
    c->ids_host = xmalloc(n * sizeof(int64_t));
    for (size_t k = 0; k < n; k++)
        c->ids_host[k] = (int64_t)(ref_splitmix(&st) % (uint64_t)c->table_rows);
}

static size_t working_set_target(void)
{
    double t;
    if (opt.working_set_mb > 0)
        return (size_t)(opt.working_set_mb * 1e6);
    if (g_cuda)
        return 4 * g_cache_bytes;
    t = 2.0 * (double)g_cache_bytes;
    if (t < 64 * MiB)
        t = 64 * MiB;
    if (t > 256 * MiB)
        t = 256 * MiB;
    return (size_t)t;
}

/* --norm: rstd's floats of part p in one buffer set, [tokens][heads] */
static size_t rstd_floats(const bcase *c, int p)
{
    return (size_t)(c->tokens * c->heads[p]);
}

/* part p's rstd in buffer set `set` (NULL for an absent part) */
static float *rstd_at(const bcase *c, int set, int p)
{
    return c->rstd_dev[p] ? c->rstd_dev[p] + (size_t)set * rstd_floats(c, p) : NULL;
}

/* --norm: weights in the dtype (w near 1, or near 0 for 1 + w), rstd and
 * dw arrays, each its own allocation (the library refuses them inside a
 * tensor's buffer). */
static void norm_setup(bcase *c)
{
    const size_t es = ref_dtype_size(opt.dtype), D = (size_t)c->sh.d;
    fusedrope_norm_init(&c->norm);
    c->norm.weight = norm_kinds[opt.norm - 1].weight;
    c->norm.rounding = norm_kinds[opt.norm - 1].rounding;
    c->norm.weight_dtype = opt.dtype;
    for (int p = 0; p < c->nparts; p++) {
        void *w = xmalloc(D * es);
        uint64_t st = opt.seed * 7u + (uint64_t)p;
        c->w_host[p] = xmalloc(D * sizeof(double));
        for (size_t i = 0; i < D; i++) {
            const double u = (double)(ref_splitmix(&st) >> 11) * 0x1p-53;
            ref_store(w, opt.dtype, (int64_t)i,
                      c->norm.weight == FUSEDROPE_NORM_WEIGHT_PLUS_ONE ? u - 0.5 : 0.5 + u);
            c->w_host[p][i] = ref_load(w, opt.dtype, (int64_t)i);
        }
        if (c->norm.weight != FUSEDROPE_NORM_WEIGHT_NONE) {
            c->w_dev[p] = buf_alloc(D * es);
            buf_upload(c->w_dev[p], w, D * es);
            c->dw_dev[p] = buf_alloc(D * sizeof(float));
        }
        free(w);
        /* an rstd a buffer set, as the tensors rotate (rstd_at) */
        c->rstd_dev[p] = buf_alloc((size_t)c->nsets * rstd_floats(c, p) * sizeof(float));
        buf_fill(c->rstd_dev[p], 0, (size_t)c->nsets * rstd_floats(c, p) * sizeof(float));
    }
    c->norm.q_weight = c->w_dev[0];
    c->norm.k_weight = c->w_dev[1];
    c->norm.dq_weight = c->dw_dev[0];
    c->norm.dk_weight = c->dw_dev[1];
}

/* The rotated channels of a case of shape sh: --rot-dim, else head_dim
 * (its even part). */
static int64_t case_rot(shape sh)
{
    return opt.rot_dim ? opt.rot_dim : (sh.d & ~(int64_t)1);
}

/* A case's cache configuration: rot rotated channels, rows table rows, the
 * --axes layout. */
static void rope_config(fusedrope_cache_config *cfg, int64_t rot, int64_t rows)
{
    fusedrope_cache_config_init(cfg, FUSEDROPE_ROPE_DEFAULT, (int)rot, rows, 10000.0);
    cfg->axes = opt.axes;
    memcpy(cfg->sections, opt.sections, sizeof cfg->sections);
}

/* Whether the --axes layout is one for rot rotated channels: the
 * reference's map of it refuses what the library must refuse. */
static int axes_fit(int64_t rot)
{
    fusedrope_cache_config cfg;
    ref_rope r;
    rope_config(&cfg, rot, 1);
    if (ref_rope_from_config(&r, &cfg) != 0)
        return 0;
    ref_rope_free(&r);
    return 1;
}

static void case_setup(bcase *c, shape sh)
{
    size_t es = ref_dtype_size(opt.dtype), off = 0, target;
    fusedrope_cache_config cfg;
    fusedrope_device dev = g_cuda ? FUSEDROPE_DEVICE_CUDA : FUSEDROPE_DEVICE_CPU;
    double moved = 0, moved_bwd = 0;

    memset(c, 0, sizeof *c);
    c->sh = sh;
    c->tokens = sh.s * sh.b;
    c->rot = case_rot(sh);
    c->nparts = opt.qk ? 2 : 1;
    c->heads[0] = opt.qk ? opt.hq : sh.h;
    c->heads[1] = opt.qk ? opt.hk : 0;
    if (opt.qk)
        snprintf(c->shape_str, sizeof c->shape_str, "%lldx%lldx%lld+%lldx%lld", (long long)sh.s,
                 (long long)sh.b, (long long)opt.hq, (long long)opt.hk, (long long)sh.d);
    else
        snprintf(c->shape_str, sizeof c->shape_str, "%lldx%lldx%lldx%lld", (long long)sh.s,
                 (long long)sh.b, (long long)sh.h, (long long)sh.d);

    for (int p = 0; p < c->nparts; p++) {
        c->elems[p] = (size_t)(c->tokens * c->heads[p] * sh.d);
        c->bytes[p] = c->elems[p] * es;
        c->in_off[p] = off;
        off += align_up(c->bytes[p]);
        if (!opt.inplace) {
            c->out_off[p] = off;
            off += align_up(c->bytes[p]);
        }
        if (opt.norm) {
            /* The backward reads dy and the saved x, and writes dx: three
             * tensors (dy in place or not), as in training, where dy is never
             * the saved input; the norm writes every channel, rotated or
             * not; rstd (a float a row) written forward, read backward.
             * (Before 2026-11-27 dy was the saved input, and two tensors
             * were counted without rstd.) */
            const double rstd = 4.0 * (double)c->tokens * (double)c->heads[p];
            c->dy_off[p] = off;
            off += align_up(c->bytes[p]);
            moved += 2.0 * (double)c->bytes[p] + rstd;
            moved_bwd += 3.0 * (double)c->bytes[p] + rstd;
        } else if (opt.inplace) {
            /* Bytes that must move: in place, only the rotated channels. */
            moved += 2.0 * (double)c->tokens * (double)c->heads[p] * (double)c->rot * (double)es;
        } else {
            moved += 2.0 * (double)c->bytes[p];
        }
    }
    c->bytes_moved[OP_FWD] = moved;
    c->bytes_moved[OP_BWD] = opt.norm ? moved_bwd : moved;
    for (int o = 0; o < 2; o++)
        c->copy_bytes[o] = (size_t)(c->bytes_moved[o] / 2);
    c->set_bytes = off;

    target = working_set_target();
    c->nsets = (int)((target + c->set_bytes - 1) / c->set_bytes);
    if (c->nsets < 1)
        c->nsets = 1;
    if (c->nsets > MAX_SETS)
        c->nsets = MAX_SETS;
#ifdef HAVE_CUDA
    if (g_cuda) {
        size_t free_b = 0, total_b = 0;
        CK(cudaMemGetInfo(&free_b, &total_b));
        while (c->nsets > 1 && (double)c->nsets * (double)c->set_bytes > 0.4 * (double)free_b)
            c->nsets--;
    }
#endif

    /* Host data: the verified input and room for the downloaded output. */
    for (int p = 0; p < c->nparts; p++) {
        c->h_in[p] = xmalloc(c->bytes[p]);
        c->h_out[p] = xmalloc(c->bytes[p]);
        fill_random(c->h_in[p], c->elems[p], opt.seed * 1000003u + (uint64_t)p * 7919u +
                                                  (uint64_t)(sh.s * 31 + sh.b * 17 + sh.h * 5 + sh.d));
        if (opt.norm) {
            c->h_dy[p] = xmalloc(c->bytes[p]);
            fill_random(c->h_dy[p], c->elems[p], opt.seed * 2000003u + (uint64_t)p * 7919u + 1u);
        }
    }

    /* Device buffer sets: everything written once (no page faults while
     * timing), every input a copy of the random data. */
    c->base = buf_alloc(c->set_bytes * (size_t)c->nsets);
    buf_fill(c->base, 0xff, c->set_bytes * (size_t)c->nsets);
    for (int p = 0; p < c->nparts; p++) {
        buf_upload(in_ptr(c, 0, p), c->h_in[p], c->bytes[p]);
        for (int s = 1; s < c->nsets; s++)
            buf_copy(in_ptr(c, s, p), in_ptr(c, 0, p), c->bytes[p]);
        if (opt.norm) {
            buf_upload(dy_ptr(c, 0, p), c->h_dy[p], c->bytes[p]);
            for (int s = 1; s < c->nsets; s++)
                buf_copy(dy_ptr(c, s, p), dy_ptr(c, 0, p), c->bytes[p]);
        }
    }
    c->tin = xmalloc((size_t)c->nsets * 2 * sizeof *c->tin);
    c->tout = xmalloc((size_t)c->nsets * 2 * sizeof *c->tout);
    c->tdy = xmalloc((size_t)c->nsets * 2 * sizeof *c->tdy);
    for (int s = 0; s < c->nsets; s++)
        for (int p = 0; p < c->nparts; p++) {
            c->tin[2 * s + p] = make_tensor(c, in_ptr(c, s, p), c->heads[p]);
            c->tout[2 * s + p] = make_tensor(c, out_ptr(c, s, p), c->heads[p]);
            if (opt.norm)
                c->tdy[2 * s + p] = make_tensor(c, dy_ptr(c, s, p), c->heads[p]);
        }
    dev_barrier();

    /* Positions and cache. */
    /* Implicit positions (ppos NULL) unless THD's cu_seqlens or --offsets,
     * which exclude each other (parse_args). */
    c->ppos = NULL;
    c->max_len = sh.s;
    fusedrope_positions_init(&c->pos);
    c->pos.cp_size = 1;
    if (opt.layout == L_THD) {
        make_cu_seqlens(c);
        c->cu_dev = buf_alloc((size_t)(c->nseqs + 1) * sizeof(int32_t));
        buf_upload(c->cu_dev, c->cu_host, (size_t)(c->nseqs + 1) * sizeof(int32_t));
        c->pos.cu_seqlens = c->cu_dev;
        c->pos.num_seqs = c->nseqs;
        c->ppos = &c->pos;
    }
    c->table_rows = c->max_len;
    if (opt.offsets) {
        /* Its own allocation, not part of a buffer set: the library rejects
         * position arrays that overlap an output. */
        make_offsets(c);
        c->off_dev = buf_alloc((size_t)sh.b * sizeof(int64_t));
        buf_upload(c->off_dev, c->off_host, (size_t)sh.b * sizeof(int64_t));
        c->pos.offsets = c->off_dev;
        c->ppos = &c->pos;
    }
    if (opt.ids_rows && c->table_rows < OFFSET_POSITIONS)
        c->table_rows = OFFSET_POSITIONS; /* random positions over a decode-sized table */
    rope_config(&cfg, c->rot, c->table_rows);
    /* The reference's map of the layout tells the number of axes (parse_args
     * refused the layouts it does not map: axes_fit). */
    if (ref_rope_from_config(&c->ref, &cfg) != 0)
        die("the reference refuses the cache of rot_dim %lld", (long long)c->rot);
    if (opt.ids_rows) {
        /* Its own allocation, like the offsets; the dense rows of all axes. */
        make_ids(c, c->ref.naxes > 1 ? c->ref.naxes : 1);
        c->ids_dev = buf_alloc((size_t)c->ids_nrows * (size_t)c->tokens * sizeof(int64_t));
        buf_upload(c->ids_dev, c->ids_host,
                   (size_t)c->ids_nrows * (size_t)c->tokens * sizeof(int64_t));
        c->pos.ids = c->ids_dev;
        c->pos.ids_axes = c->ids_nrows > 1 ? c->ids_nrows : 0;
        c->ppos = &c->pos;
    }
    lib_check(fusedrope_cache_create(&cfg, dev, &c->cache), "fusedrope_cache_create");
    if (fusedrope_cache_device(c->cache) != dev)
        die("fusedrope_cache_device() is %d, asked for %d", (int)fusedrope_cache_device(c->cache),
            (int)dev);

    /* The reference's frequencies and attention factor (above, for the same
     * config); its positions: the same as the call's, from the host arrays. */
    if (opt.norm)
        norm_setup(c);
    c->hpos = c->pos;
    c->hpos.ids = c->ids_host;
    c->hpos.cu_seqlens = c->cu_host;
    c->hpos.offsets = c->off_host;
}

static void case_free(bcase *c)
{
    fusedrope_cache_destroy(c->cache);
    buf_free(c->base);
    if (c->cu_dev)
        buf_free(c->cu_dev);
    free(c->cu_host);
    if (c->off_dev)
        buf_free(c->off_dev);
    free(c->off_host);
    if (c->ids_dev)
        buf_free(c->ids_dev);
    free(c->ids_host);
    free(c->tin);
    free(c->tout);
    free(c->tdy);
    ref_rope_free(&c->ref);
    for (int p = 0; p < c->nparts; p++) {
        free(c->h_in[p]);
        free(c->h_out[p]);
        free(c->h_dy[p]);
        free(c->w_host[p]);
        if (c->w_dev[p])
            buf_free(c->w_dev[p]);
        if (c->dw_dev[p])
            buf_free(c->dw_dev[p]);
        if (c->rstd_dev[p])
            buf_free(c->rstd_dev[p]);
    }
}

static fusedrope_status run_op(const bcase *c, enum op op, int set)
{
    const fusedrope_tensor *ti = &c->tin[2 * set], *to = &c->tout[2 * set];
    void *stream = stream_arg();
    if (opt.norm) {
        /* backward: the saved x is the input region (the forward's x, whose
         * rstd the forward saved), dy its own region, dx the output or, in
         * place, over dy.  Timed in place, dx becomes the next call's dy and
         * grows (about rstd x w a call), towards Inf over many calls: only
         * their time counts, and verify() uploads fresh data. */
        const int two = c->nparts == 2;
        const fusedrope_tensor *td = &c->tdy[2 * set], *tx = opt.inplace ? td : to;
        fusedrope_norm nm = c->norm;
        nm.q_rstd = rstd_at(c, set, 0);
        nm.k_rstd = rstd_at(c, set, 1);
        if (op == OP_FWD)
            return fusedrope_norm_forward_qk(c->cache, opt.style, c->ppos, &nm, &ti[0],
                                             &to[0], two ? &ti[1] : NULL, two ? &to[1] : NULL,
                                             stream);
        return fusedrope_norm_backward_qk(c->cache, opt.style, c->ppos, &nm, &ti[0], &td[0],
                                          &tx[0], two ? &ti[1] : NULL, two ? &td[1] : NULL,
                                          two ? &tx[1] : NULL, stream);
    }
    if (c->nparts == 1)
        return op == OP_FWD
                   ? fusedrope_forward(c->cache, opt.style, c->ppos, &ti[0], &to[0], stream)
                   : fusedrope_backward(c->cache, opt.style, c->ppos, &ti[0], &to[0], stream);
    return op == OP_FWD ? fusedrope_forward_qk(c->cache, opt.style, c->ppos, &ti[0], &to[0],
                                               &ti[1], &to[1], stream)
                        : fusedrope_backward_qk(c->cache, opt.style, c->ppos, &ti[0], &to[0],
                                                &ti[1], &to[1], stream);
}

/* ----------------------------------------------------------- verification */

typedef struct {
    double max_ulp, max_ratio;
    int64_t checked, bad, poison, nonfinite, passthrough_bad;
    int reported;
} vstats;

/* One element's error err against its bound tol, counted in v; returns
 * whether to print it (a failure among the first five). */
static int tally(vstats *v, double err, double tol)
{
    v->checked++;
    if (err / tol > v->max_ratio)
        v->max_ratio = err / tol;
    if (err <= tol)
        return 0;
    v->bad++;
    return v->reported++ < 5;
}

static void check_value(vstats *v, double y, double ref, double a, double b, const bcase *c,
                        int p, int64_t t, int64_t h, int64_t ch)
{
    double err = isnan(y) ? INFINITY : fabs(y - ref);
    double ulp = ref_ulp(ref, opt.dtype);
    double tol = ref_tolerance(ref, a, b, c->ref.attn, opt.dtype);
    double ulps = err / ulp;
    if (ulps > v->max_ulp)
        v->max_ulp = ulps;
    if (tally(v, err, tol))
        fprintf(stderr,
                "  mismatch: %s token %lld (position %lld) head %lld channel %lld: got %.9g, "
                "reference %.9g (%.3g ulp, bound %.3g)\n",
                c->nparts == 2 ? (p ? "k" : "q") : "x", (long long)t,
                (long long)token_position(c, t), (long long)h, (long long)ch, y, ref, ulps,
                tol / ulp);
}

static void verify_part(const bcase *c, enum op op, int p, vstats *v)
{
    const int64_t H = c->heads[p], D = c->sh.d, R = c->rot, half = R / 2, T = c->tokens;
    const int64_t ns = T < MAX_SAMPLED_TOKENS ? T : MAX_SAMPLED_TOKENS;
    const void *in = c->h_in[p], *out = c->h_out[p];
    double *cs = xmalloc((size_t)half * sizeof(double)), *sn = xmalloc((size_t)half * sizeof(double));
    size_t es = ref_dtype_size(opt.dtype);

    /* Sampled tokens: all heads, all channels. */
    for (int64_t k = 0; k < ns; k++) {
        int64_t t = ns == 1 ? 0 : k * (T - 1) / (ns - 1);
        int64_t pax[FUSEDROPE_MAX_AXES];
        token_axes(c, t, pax);
        for (int64_t i = 0; i < half; i++)
            ref_cos_sin_axes(&c->ref, pax, 1, (int)i, &cs[i], &sn[i]);
        for (int64_t h = 0; h < H; h++) {
            size_t base = (size_t)((t * H + h) * D); /* every layout is token-major, dense */
            for (int64_t i = 0; i < half; i++) {
                int64_t ca, cb;
                double a, b, ra, rb;
                ref_pair(opt.style, (int)R, (int)i, &ca, &cb);
                a = load_elem(in, base + (size_t)ca);
                b = load_elem(in, base + (size_t)cb);
                ref_rotate(a, b, cs[i], sn[i], op != OP_FWD, &ra, &rb);
                check_value(v, load_elem(out, base + (size_t)ca), ra, a, b, c, p, t, h, ca);
                check_value(v, load_elem(out, base + (size_t)cb), rb, a, b, c, p, t, h, cb);
            }
            /* Channels past rot_dim: copied (out of place) or untouched (in place). */
            for (int64_t ch = R; ch < D; ch++) {
                size_t i = base + (size_t)ch;
                v->checked++;
                if (memcmp((const char *)in + i * es, (const char *)out + i * es, es) != 0) {
                    v->bad++;
                    v->passthrough_bad++;
                    if (v->reported++ < 5)
                        fprintf(stderr,
                                "  mismatch: token %lld head %lld channel %lld (past rot_dim): "
                                "got %.9g, input %.9g\n",
                                (long long)t, (long long)h, (long long)ch, load_elem(out, i),
                                load_elem(in, i));
                }
            }
        }
    }
    free(cs);
    free(sn);

    /* The whole output: poison left (unwritten) and non-finite values. */
    if (es == 2) {
        const uint16_t *o = out;
        uint16_t mask = opt.dtype == FUSEDROPE_BFLOAT16 ? 0x7f80 : 0x7c00;
        for (size_t i = 0; i < c->elems[p]; i++) {
            if (o[i] == 0xffff)
                v->poison++;
            else if ((o[i] & mask) == mask)
                v->nonfinite++;
        }
    } else {
        const uint32_t *o = out;
        for (size_t i = 0; i < c->elems[p]; i++) {
            if (o[i] == 0xffffffffu)
                v->poison++;
            else if ((o[i] & 0x7f800000u) == 0x7f800000u)
                v->nonfinite++;
        }
    }
}

/* --norm: the whole output against tests/ref.c's float64 ref_norm_forward
 * (the tolerance of tests/test_norm.c: float32 rstd and n, and a value the
 * mode rounds to the dtype may round the other way near a tie) or
 * ref_norm_backward (saved x = the input, dy its own data; float32
 * arithmetic against the size of dx's terms), and the backward's dw_got
 * (head_dim floats, NULL without a weight) against its dw.  'err/tol' is
 * over those tolerances. */
static void verify_norm_part(const bcase *c, enum op op, int p, const float *dw_got, vstats *v)
{
    const int64_t H = c->heads[p], D = c->sh.d, R = c->rot, half = R / 2, T = c->tokens;
    const int thd = opt.layout == L_THD;
    const int64_t S = thd ? T : c->sh.s, B = thd ? 1 : c->sh.b;
    fusedrope_tensor x = make_tensor(c, c->h_in[p], H), y = make_tensor(c, c->h_out[p], H);
    fusedrope_tensor dy = make_tensor(c, c->h_dy[p], H);
    double *ref = xmalloc((size_t)(T * H * D) * sizeof(double));
    double *aux = xmalloc((size_t)(T * H * D) * sizeof(double));
    /* a cache with axes takes each token's position on every axis
     * ([naxes][T], tests/ref.h), from its row of ids or its one position */
    const int naxes = c->ref.naxes > 1 ? c->ref.naxes : 1;
    int64_t *positions = xmalloc((size_t)(naxes * T) * sizeof(int64_t));
    double *dw = xmalloc((size_t)D * sizeof(double)), *dw_abs = xmalloc((size_t)D * sizeof(double));
    const int kind = (int)c->norm.weight, rounding = (int)c->norm.rounding;
    const double *w = kind ? c->w_host[p] : NULL;
    size_t es = ref_dtype_size(opt.dtype);

    ref_axis_positions(&c->hpos, naxes, S, B, positions);
    memset(dw, 0, (size_t)D * sizeof(double)); /* ref_norm_backward adds to them */
    memset(dw_abs, 0, (size_t)D * sizeof(double));
    if (op == OP_FWD)
        ref_norm_forward(&c->ref, opt.style, positions, &x, kind, w, c->norm.eps, rounding, ref,
                         aux, NULL);
    else
        ref_norm_backward(&c->ref, opt.style, positions, &x, 0, &dy, kind, w, c->norm.eps, NULL,
                          ref, dw, dw_abs, aux);
    for (int64_t s = 0; s < S; s++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t row = (s * B + b) * H + h;
                for (int64_t ch = 0; ch < D; ch++) {
                    const double want = ref[row * D + ch];
                    const double got = ref_load(y.data, opt.dtype, ref_offset(&y, s, b, h, ch));
                    double tol, err = isnan(got) ? INFINITY : fabs(got - want), ulp;
                    if (op == OP_FWD) {
                        const double *vv = aux + row * D;
                        double mag, flip;
                        if (ch < R) {
                            int64_t ca, cb;
                            const int64_t i = opt.style == FUSEDROPE_NEOX ? ch % half : ch / 2;
                            ref_pair(opt.style, (int)R, (int)i, &ca, &cb);
                            mag = fabs(vv[ca]) + fabs(vv[cb]);
                            flip = ref_ulp(vv[ca], opt.dtype) + ref_ulp(vv[cb], opt.dtype);
                        } else {
                            mag = fabs(vv[ch]);
                            flip = ref_ulp(vv[ch], opt.dtype);
                        }
                        tol = ref_norm_y_tolerance(want, mag, flip, c->ref.attn, rounding,
                                                   opt.dtype);
                    } else {
                        tol = ref_norm_dx_tolerance(want, aux[row], opt.dtype);
                    }
                    ulp = ref_ulp(want, opt.dtype);
                    if (err / ulp > v->max_ulp)
                        v->max_ulp = err / ulp;
                    if (tally(v, err, tol))
                        fprintf(stderr, "  mismatch: %s seq %lld batch %lld head %lld "
                                "channel %lld: got %.9g, reference %.9g (tolerance %.3g)\n",
                                p ? "k" : "q", (long long)s, (long long)b, (long long)h,
                                (long long)ch, got, want, tol);
                }
            }
    for (int64_t ch = 0; dw_got && ch < D; ch++) {
        const double got = dw_got[ch], tol = ref_norm_dw_tolerance(dw_abs[ch]);
        const double err = isnan(got) ? INFINITY : fabs(got - dw[ch]);
        if (tally(v, err, tol))
            fprintf(stderr, "  mismatch: d%s_weight channel %lld: got %.9g, reference %.9g "
                    "(tolerance %.3g)\n", p ? "k" : "q", (long long)ch, got, dw[ch], tol);
    }
    (void)es;
    free(ref);
    free(aux);
    free(positions);
    free(dw);
    free(dw_abs);
}

/* One call on buffer set 0 with a poisoned output, checked. Returns 1 if ok. */
static int verify(bcase *c, enum op op, vstats *v)
{
    memset(v, 0, sizeof *v);
    if (opt.norm && op == OP_BWD) {
        /* the backward reads the rstd its forward saved: that of the data
         * verified (the forward's timed calls left the last one's, which in
         * place had rewritten its input many times) */
        for (int p = 0; p < c->nparts; p++)
            buf_upload(in_ptr(c, 0, p), c->h_in[p], c->bytes[p]);
        dev_barrier();
        lib_check(run_op(c, OP_FWD, 0), "forward");
        dev_sync();
    }
    for (int p = 0; p < c->nparts; p++) {
        buf_upload(in_ptr(c, 0, p), c->h_in[p], c->bytes[p]);
        if (opt.norm)
            buf_upload(dy_ptr(c, 0, p), c->h_dy[p], c->bytes[p]);
        if (!opt.inplace)
            buf_fill(out_ptr(c, 0, p), 0xff, c->bytes[p]);
        if (opt.norm && c->dw_dev[p]) /* NaN: a dw left unwritten fails */
            buf_fill(c->dw_dev[p], 0xff, (size_t)c->sh.d * sizeof(float));
    }
    dev_barrier();
    lib_check(run_op(c, op, 0), op == OP_FWD ? "forward" : "backward");
    dev_sync();
    lib_check(fusedrope_cache_check(c->cache, stream_arg()), "fusedrope_cache_check");
    for (int p = 0; p < c->nparts; p++) {
        buf_download(c->h_out[p], result_ptr(c, op, 0, p), c->bytes[p]);
        if (opt.norm) {
            float *dw = NULL;
            if (op == OP_BWD && c->dw_dev[p]) {
                dw = xmalloc((size_t)c->sh.d * sizeof(float));
                buf_download(dw, c->dw_dev[p], (size_t)c->sh.d * sizeof(float));
            }
            verify_norm_part(c, op, p, dw, v);
            free(dw);
        } else
            verify_part(c, op, p, v);
    }
    if (v->poison)
        fprintf(stderr, "  %lld output elements never written (poison left)\n",
                (long long)v->poison);
    if (v->nonfinite)
        fprintf(stderr, "  %lld output elements are NaN or Inf\n", (long long)v->nonfinite);
    return v->bad == 0 && v->poison == 0 && v->nonfinite == 0;
}

/* ----------------------------------------------------------------- timing */

#ifdef HAVE_CUDA
/* The median of the event pairs g_ev0[i]..g_ev1[i] (i < iters, the stream
 * synchronised), in seconds over per (the calls each pair encloses);
 * times[] gets each pair's. */
static double events_median(int iters, int per, double *times)
{
    for (int i = 0; i < iters; i++) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, g_ev0[i], g_ev1[i]));
        times[i] = 1e-3 * ms / per;
    }
    return median(times, iters);
}
#endif

/* Median seconds of one call, rotating through the buffer sets. */
static double time_op(const bcase *c, enum op op, int iters, int warm, double *times)
{
    const char *what = op == OP_FWD ? "forward" : "backward";
    int set = 0;
    for (int i = 0; i < warm; i++, set = (set + 1) % c->nsets)
        lib_check(run_op(c, op, set), what);
    dev_sync();
#ifdef HAVE_CUDA
    if (g_cuda) {
        for (int i = 0; i < iters; i++, set = (set + 1) % c->nsets) {
            CK(cudaEventRecord(g_ev0[i], g_stream));
            lib_check(run_op(c, op, set), what);
            CK(cudaEventRecord(g_ev1[i], g_stream));
        }
        dev_sync();
        return events_median(iters, 1, times);
    }
#endif
    for (int i = 0; i < iters; i++, set = (set + 1) % c->nsets) {
        double t0 = now_s();
        lib_check(run_op(c, op, set), what);
        times[i] = now_s() - t0;
    }
    return median(times, iters);
}

/* --graph: the per-call cost of n calls in a row, three ways (seconds per
 * call, medians over iters): replayed from one CUDA graph (the kernel time
 * plus the graph's launch gaps), issued one by one on the stream (events
 * around all n: the stream's throughput, host-bound for small calls), and
 * the host's time to issue one call (the argument checks and the launch). */
typedef struct {
    double graph_s, stream_s, host_s;
} graph_times;

#ifdef HAVE_CUDA
static void time_graph(const bcase *c, enum op op, int n, int iters, int warm, double *times,
                       graph_times *g)
{
    const char *what = op == OP_FWD ? "forward" : "backward";
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaError_t cerr;
    fusedrope_status st = FUSEDROPE_OK;

    dev_sync();
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n && st == FUSEDROPE_OK; i++)
        st = run_op(c, op, i % c->nsets);
    cerr = cudaStreamEndCapture(g_stream, &graph); /* end the capture whatever happened */
    lib_check(st, what);
    CK(cerr);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < warm; i++)
        CK(cudaGraphLaunch(exec, g_stream));
    dev_sync();
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(g_ev0[i], g_stream));
        CK(cudaGraphLaunch(exec, g_stream));
        CK(cudaEventRecord(g_ev1[i], g_stream));
    }
    dev_sync();
    g->graph_s = events_median(iters, n, times);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    lib_check(fusedrope_cache_check(c->cache, stream_arg()), "fusedrope_cache_check");

    for (int i = 0; i < iters; i++) {
        double t0;
        CK(cudaEventRecord(g_ev0[i], g_stream));
        t0 = now_s();
        for (int k = 0; k < n; k++)
            lib_check(run_op(c, op, k % c->nsets), what);
        times[iters + i] = (now_s() - t0) / n;
        CK(cudaEventRecord(g_ev1[i], g_stream));
        dev_sync(); /* each round from an idle stream, as the graph's */
    }
    g->stream_s = events_median(iters, n, times);
    g->host_s = median(times + iters, iters);
}
#endif

/* The CPU's copy: memcpy of n bytes over the team the library's call used
 * (`team`: its fr_cpu_team, 0 for the calling thread alone), each thread one
 * contiguous, 64-byte aligned piece.  A single-threaded memcpy would flatter
 * a multi-threaded library on any machine where one core cannot draw the
 * socket's bandwidth; a team where the call had none (the library runs
 * small calls on the calling thread) would charge the copy a team's start
 * (1.3-2 us) the call did not pay. */
static void cpu_copy(char *dst, const char *src, size_t n, int team)
{
#ifdef _OPENMP
    if (team > 0) {
#pragma omp parallel num_threads(team)
        {
            const size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
            const size_t piece = ((n + nt - 1) / nt + 63) & ~(size_t)63;
            const size_t a = id * piece < n ? id * piece : n;
            const size_t b = a + piece < n ? a + piece : n;
            memcpy(dst + a, src + a, b - a);
        }
        return;
    }
#else
    (void)team;
#endif
    memcpy(dst, src, n);
}

/* Median seconds of a plain copy of n bytes (device to device on the GPU,
 * cpu_copy over `team` on the CPU), rotating through enough buffers. */
static double time_copy(size_t n, int team, int iters, int warm, double *times)
{
    size_t slot = align_up(n ? n : 1), target = working_set_target();
    int nsets = (int)((target + 2 * slot - 1) / (2 * slot)), set = 0;
    char *buf;
    if (nsets < 1)
        nsets = 1;
    if (nsets > MAX_SETS)
        nsets = MAX_SETS;
#ifdef HAVE_CUDA
    if (g_cuda) {
        size_t free_b = 0, total_b = 0;
        CK(cudaMemGetInfo(&free_b, &total_b));
        while (nsets > 1 && 2.0 * (double)nsets * (double)slot > 0.4 * (double)free_b)
            nsets--;
    }
#endif
    buf = buf_alloc(2 * slot * (size_t)nsets);
    buf_fill(buf, 0x5a, 2 * slot * (size_t)nsets);
#define SRC(s) (buf + 2 * slot * (size_t)(s))
#define DST(s) (buf + 2 * slot * (size_t)(s) + slot)
#ifdef HAVE_CUDA
    if (g_cuda) {
        for (int i = 0; i < warm; i++, set = (set + 1) % nsets)
            CK(cudaMemcpyAsync(DST(set), SRC(set), n, cudaMemcpyDeviceToDevice, g_stream));
        dev_sync();
        for (int i = 0; i < iters; i++, set = (set + 1) % nsets) {
            CK(cudaEventRecord(g_ev0[i], g_stream));
            CK(cudaMemcpyAsync(DST(set), SRC(set), n, cudaMemcpyDeviceToDevice, g_stream));
            CK(cudaEventRecord(g_ev1[i], g_stream));
        }
        dev_sync();
        buf_free(buf);
        return events_median(iters, 1, times);
    }
#endif
    for (int i = 0; i < warm; i++, set = (set + 1) % nsets)
        cpu_copy(DST(set), SRC(set), n, team);
    for (int i = 0; i < iters; i++, set = (set + 1) % nsets) {
        double t0 = now_s();
        cpu_copy(DST(set), SRC(set), n, team);
        times[i] = now_s() - t0;
    }
#undef SRC
#undef DST
    buf_free(buf);
    return median(times, iters);
}

/* ------------------------------------------------------------------ options */

static void usage(FILE *f)
{
    fprintf(f,
"Usage: " PROG " [OPTION]...\n"
"Time libfusedrope's forward and backward RoPE and verify each result against\n"
"a float64 reference (default rope, theta 10000).\n"
"\n"
"  --shape S,B,H,D     seq_len, batch, heads, head_dim (repeatable; default the\n"
"                      reference shapes 4096,1,128,128 and 512,32,24,128)\n"
"  --dtype T           bf16 (default), fp16 or fp32\n"
"  --layout L          sbhd (default), bshd, or thd (S*B tokens packed into a\n"
"                      few uneven sequences given by cu_seqlens)\n"
"  --style S           neox (default, rotate_half) or interleaved (GPT-J)\n"
"  --device D          auto (default: CUDA when available, else CPU), cpu, cuda\n"
"  --iters N           timed calls per case (default 100 on the GPU, 20 on the CPU)\n"
"  --warmup N          untimed calls first (default 10 on the GPU, 3 on the CPU)\n"
"  --rot-dim R         rotated channels per head, even (default head_dim, rounded\n"
"                      down to even)\n"
"  --inplace           write the output over the input\n"
"  --offsets           start each batch entry at its own position, as a decode\n"
"                      step does: pos.offsets[b], distinct, with a table of at\n"
"                      least %d positions (not with --layout thd)\n"
"  --axes A            position axes (multimodal rope): sections:T,H,W[,X],\n"
"                      interleaved:T,H,W, alternating:T,H,W (pairs per axis,\n"
"                      summing to rot_dim/2) or vision (VISION_2D); without\n"
"                      --ids-rows every axis takes the token's one position\n"
"  --ids-rows          explicit positions: pos.ids with a row per axis of the\n"
"                      cache (one row without --axes), random in a table of at\n"
"                      least %d positions, built once (not with --offsets)\n"
"  --qk HQ,HK          time forward_qk/backward_qk with HQ query and HK key heads\n"
"                      (the H of --shape, still >= 1, is ignored)\n"
"  --norm KIND         time the fused per-head RMSNorm + RoPE\n"
"                      (fusedrope_norm_forward_qk / _backward_qk, rstd saved,\n"
"                      backward from x and a dy of its own, with dw) instead:\n"
"                      qwen3 (w, Llama rounding), gemma (1 + w, Gemma\n"
"                      rounding), once (w, one rounding) or none (no weight);\n"
"                      every element of the output, and dw, verified against\n"
"                      the float64 reference of the norm with test_norm's bounds\n"
"  --graph N           (CUDA) also time N calls captured in one CUDA graph and\n"
"                      replayed (--iters replays), beside the same N calls issued\n"
"                      one by one on the stream and the host's time to issue one\n"
"  --seed N            seed of the random input (default 1)\n"
"  --working-set MB    rotate through buffer sets until they hold at least this\n"
"                      much (default: 4x the GPU's L2; on the CPU 2x the last-level\n"
"                      cache, between 64 and 256 MiB)\n"
"  -h, --help          show this and exit\n"
"\n"
"GB/s counts the bytes that must move: input + output (in place with rot_dim <\n"
"head_dim: only the rotated channels, read and written; --norm: rstd too, and\n"
"its backward reads dy and the saved x, dx over dy in place). 'of copy' is that\n"
"rate over a copy of the same bytes timed in the same run (GPU: device-to-device\n"
"cudaMemcpyAsync; CPU: memcpy split over the library's OpenMP threads). Times\n"
"are medians. Each case is verified first on up to %d tokens spread over the\n"
"tensor (all heads and channels of each): 'max ulp' is max |y - ref| / ulp(ref)\n"
"in the output dtype; 'err/tol' is the error over the library's precision bound,\n"
"ulp(ref) + 2^-22 (|a| + |b|) max(1, attention factor) (stated in\n"
"fusedrope_forward(3), Rotation; the default rope's attention factor is 1),\n"
"which must be <= 1; the whole output is scanned for non-finite values and, out\n"
"of place, for elements left unwritten (the output is poisoned with NaN bytes\n"
"before the call).  --norm: every element of the output and of dw against the\n"
"float64 reference of the norm within the bounds of tests/ref.h (those of\n"
"tests/test_norm); a NaN or an element left unwritten fails.\n"
"Exit status: 0 all verified, 1 a verification or a call failed, 2 bad options.\n",
            OFFSET_POSITIONS, OFFSET_POSITIONS, MAX_SAMPLED_TOKENS);
}

static _Noreturn void bad_option(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, PROG ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '" PROG " --help'.\n");
    exit(2);
}

/* parse_ints' refusal of text that is not n integers of its kind (min 0:
 * non-negative, else positive) */
static void ints_expected(const char *opt_name, int n, int64_t min, const char *s)
{
    const char *kind = min >= 1 ? "positive" : "non-negative";
    if (n == 1)
        bad_option("%s: expected a %s integer, got '%s'", opt_name, kind, s);
    bad_option("%s: expected %d comma-separated %s integers, got '%s'", opt_name, n, kind, s);
}

/* Comma-separated integers in min..max (min >= 0), exactly n of them. */
static void parse_ints(const char *opt_name, const char *s, int64_t *out, int n, int64_t min,
                       int64_t max)
{
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        long long v;
        if (*p < '0' || *p > '9')
            ints_expected(opt_name, n, min, s);
        errno = 0;
        v = strtoll(p, &end, 10);
        if (errno == ERANGE)
            bad_option("%s: a number in '%s' does not fit 64 bits", opt_name, s);
        if (v < min || v > max)
            bad_option("%s: %lld is out of range %lld..%lld in '%s'", opt_name, v, (long long)min,
                       (long long)max, s);
        out[i] = v;
        p = end;
        if (i + 1 < n) {
            if (*p != ',')
                ints_expected(opt_name, n, min, s);
            p++;
        }
    }
    if (*p)
        ints_expected(opt_name, n, min, s);
}

static int64_t parse_int(const char *opt_name, const char *s, int64_t min, int64_t max)
{
    int64_t v;
    parse_ints(opt_name, s, &v, 1, min, max);
    return v;
}

/* The index of val among an option's n names; anything else is refused with
 * the list. */
static int parse_choice(const char *opt_name, const char *val, const char *const *names, int n)
{
    char list[128] = "";
    for (int k = 0; k < n; k++) {
        if (!strcmp(val, names[k]))
            return k;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? (k + 1 < n ? ", " : " or ") : "",
                 names[k]);
    }
    bad_option("%s: expected %s, got '%s'", opt_name, list, val);
    return 0;
}

/* --axes: sections:T,H,W[,X], interleaved:T,H,W, alternating:T,H,W or vision. */
static void parse_axes(const char *val)
{
    static const struct { const char *name; fusedrope_axes axes; int nmin, nmax; } kinds[] = {
        { "sections:", FUSEDROPE_AXES_SECTIONS, 3, 4 },
        { "interleaved:", FUSEDROPE_AXES_INTERLEAVED, 3, 3 },
        { "alternating:", FUSEDROPE_AXES_ALTERNATING, 3, 3 },
    };
    snprintf(opt.axes_str, sizeof opt.axes_str, "%s", val);
    memset(opt.sections, 0, sizeof opt.sections);
    if (!strcmp(val, "vision")) {
        opt.axes = FUSEDROPE_AXES_VISION_2D;
        return;
    }
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t len = strlen(kinds[k].name);
        const char *list = val + len;
        int64_t v[FUSEDROPE_MAX_AXES];
        int n = 1;
        if (strncmp(val, kinds[k].name, len))
            continue;
        for (const char *q = list; *q; q++)
            n += *q == ',';
        if (n < kinds[k].nmin || n > kinds[k].nmax)
            bad_option("--axes %s: expected %d%s pair counts after '%s'", val, kinds[k].nmin,
                       kinds[k].nmax > kinds[k].nmin ? " or 4" : "", kinds[k].name);
        /* sections may be 0: parse each as a count >= 0 */
        for (int a = 0; a < n; a++) {
            char *end;
            long long x;
            if (*list < '0' || *list > '9')
                bad_option("--axes %s: expected non-negative pair counts", val);
            x = strtoll(list, &end, 10);
            if (x > FUSEDROPE_MAX_ROT_DIM / 2)
                bad_option("--axes %s: %lld pairs is more than rot_dim allows", val, x);
            v[a] = x;
            list = *end == ',' ? end + 1 : end;
            if (*end && *end != ',')
                bad_option("--axes %s: expected non-negative pair counts", val);
        }
        opt.axes = kinds[k].axes;
        for (int a = 0; a < n; a++)
            opt.sections[a] = (int)v[a];
        return;
    }
    bad_option("--axes: expected sections:T,H,W[,X], interleaved:T,H,W, alternating:T,H,W or "
               "vision, got '%s'", val);
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL, *eq;
        char name[32];
        size_t len;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0)
            bad_option("unexpected argument '%s'", arg);
        eq = strchr(arg, '=');
        len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (len >= sizeof name)
            bad_option("unknown option '%s'", arg);
        memcpy(name, arg, len);
        name[len] = '\0';
        if (!strcmp(name, "--inplace")) {
            if (eq)
                bad_option("--inplace takes no value");
            opt.inplace = 1;
            continue;
        }
        if (!strcmp(name, "--offsets")) {
            if (eq)
                bad_option("--offsets takes no value");
            opt.offsets = 1;
            continue;
        }
        if (!strcmp(name, "--ids-rows")) {
            if (eq)
                bad_option("--ids-rows takes no value");
            opt.ids_rows = 1;
            continue;
        }
        if (strcmp(name, "--shape") && strcmp(name, "--dtype") && strcmp(name, "--layout") &&
            strcmp(name, "--style") && strcmp(name, "--device") && strcmp(name, "--iters") &&
            strcmp(name, "--warmup") && strcmp(name, "--rot-dim") && strcmp(name, "--qk") &&
            strcmp(name, "--seed") && strcmp(name, "--working-set") && strcmp(name, "--norm") &&
            strcmp(name, "--axes") && strcmp(name, "--graph"))
            bad_option("unknown option '%s'", arg);
        if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            bad_option("%s needs a value", name);

        if (!strcmp(name, "--shape")) {
            int64_t v[4];
            if (opt.nshapes == MAX_SHAPES)
                bad_option("at most %d --shape options", MAX_SHAPES);
            parse_ints(name, val, v, 4, 1, (int64_t)1 << 31);
            if (v[3] < 2)
                bad_option("--shape %s: head_dim must be at least 2", val);
            opt.shapes[opt.nshapes++] = (shape){ v[0], v[1], v[2], v[3] };
        } else if (!strcmp(name, "--dtype")) {
            static const char *const names[] = { "bf16", "fp16", "fp32" };
            static const fusedrope_dtype values[] = { FUSEDROPE_BFLOAT16, FUSEDROPE_FLOAT16,
                                                      FUSEDROPE_FLOAT32 };
            opt.dtype = values[parse_choice(name, val, names, 3)];
        } else if (!strcmp(name, "--layout")) {
            static const char *const names[] = { "sbhd", "bshd", "thd" };
            static const enum layout values[] = { L_SBHD, L_BSHD, L_THD };
            opt.layout = values[parse_choice(name, val, names, 3)];
        } else if (!strcmp(name, "--style")) {
            static const char *const names[] = { "neox", "interleaved" };
            static const fusedrope_style values[] = { FUSEDROPE_NEOX, FUSEDROPE_INTERLEAVED };
            opt.style = values[parse_choice(name, val, names, 2)];
        } else if (!strcmp(name, "--device")) {
            static const char *const names[] = { "auto", "cpu", "cuda" };
            static const fusedrope_device values[] = { FUSEDROPE_DEVICE_AUTO, FUSEDROPE_DEVICE_CPU,
                                                       FUSEDROPE_DEVICE_CUDA };
            opt.device = values[parse_choice(name, val, names, 3)];
        } else if (!strcmp(name, "--iters")) {
            opt.iters = (int)parse_int(name, val, 1, 1000000);
        } else if (!strcmp(name, "--warmup")) {
            opt.warmup = (int)parse_int(name, val, 0, 1000000);
        } else if (!strcmp(name, "--rot-dim")) {
            opt.rot_dim = parse_int(name, val, 2, FUSEDROPE_MAX_ROT_DIM);
            if (opt.rot_dim % 2)
                bad_option("--rot-dim: %lld is odd", (long long)opt.rot_dim);
        } else if (!strcmp(name, "--qk")) {
            int64_t v[2];
            parse_ints(name, val, v, 2, 1, (int64_t)1 << 31);
            opt.qk = 1;
            opt.hq = v[0];
            opt.hk = v[1];
        } else if (!strcmp(name, "--norm")) {
            opt.norm = 0;
            for (size_t k = 0; k < sizeof norm_kinds / sizeof norm_kinds[0]; k++)
                if (!strcmp(val, norm_kinds[k].name))
                    opt.norm = (int)k + 1;
            if (!opt.norm)
                bad_option("--norm: expected qwen3, gemma, once or none, got '%s'", val);
        } else if (!strcmp(name, "--seed")) {
            opt.seed = (uint64_t)parse_int(name, val, 0, INT64_MAX);
        } else if (!strcmp(name, "--working-set")) {
            opt.working_set_mb = (double)parse_int(name, val, 1, 1 << 20);
        } else if (!strcmp(name, "--axes")) {
            parse_axes(val);
        } else if (!strcmp(name, "--graph")) {
            opt.graph = (int)parse_int(name, val, 1, 10000);
        }
    }

    /* THD positions restart at every cu_seqlens boundary; the library would
     * add offsets per packed sequence, which the reference does not model. */
    if (opt.offsets && opt.ids_rows)
        bad_option("--ids-rows gives absolute positions; it cannot be used with --offsets");
    if (opt.graph && opt.device == FUSEDROPE_DEVICE_CPU)
        bad_option("--graph times CUDA graphs; it cannot be used with --device cpu");
    if (opt.offsets && opt.layout == L_THD)
        bad_option("--offsets is per batch entry (sbhd, bshd); it cannot be used with --layout thd");
    if (opt.nshapes == 0) {
        opt.shapes[0] = (shape){ 4096, 1, 128, 128 };
        opt.shapes[1] = (shape){ 512, 32, 24, 128 };
        opt.nshapes = 2;
    }
    for (int i = 0; i < opt.nshapes; i++) {
        shape s = opt.shapes[i];
        int64_t heads = opt.qk ? (opt.hq > opt.hk ? opt.hq : opt.hk) : s.h;
        double elems = (double)s.s * (double)s.b * (double)heads * (double)s.d;
        if (opt.rot_dim > s.d)
            bad_option("--rot-dim %lld exceeds head_dim %lld of shape %lld,%lld,%lld,%lld",
                       (long long)opt.rot_dim, (long long)s.d, (long long)s.s, (long long)s.b,
                       (long long)s.h, (long long)s.d);
        if (opt.axes != FUSEDROPE_AXES_NONE && !axes_fit(case_rot(s)))
            bad_option("--axes %s: not a valid layout for rot_dim %lld (shape "
                       "%lld,%lld,%lld,%lld)", opt.axes_str, (long long)case_rot(s),
                       (long long)s.s, (long long)s.b, (long long)s.h, (long long)s.d);
        if (elems * 4 > 0x1p62 || (double)s.s * (double)s.b > 2147483647.0)
            bad_option("shape %lld,%lld,%lld,%lld is too large", (long long)s.s, (long long)s.b,
                       (long long)s.h, (long long)s.d);
    }
}

/* ----------------------------------------------------------------- device */

static void describe_device(char *buf, size_t n)
{
#ifdef HAVE_CUDA
    if (g_cuda) {
        int dev = 0;
        struct cudaDeviceProp prop;
        CK(cudaGetDevice(&dev));
        CK(cudaGetDeviceProperties(&prop, dev));
        g_cache_bytes = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : (size_t)(50 * 1000 * 1000);
        snprintf(buf, n, "%s (CUDA device %d, compute capability %d.%d, %d SMs, %.0f MB L2, %.1f GiB)",
                 prop.name, dev, prop.major, prop.minor, prop.multiProcessorCount,
                 prop.l2CacheSize / 1e6, (double)prop.totalGlobalMem / (MiB * 1024));
        return;
    }
#endif
    {
        char model[128] = "";
        long llc = -1;
        FILE *f = fopen("/proc/cpuinfo", "r");
        if (f) {
            char line[512];
            while (fgets(line, sizeof line, f)) {
                if (!strncmp(line, "model name", 10)) {
                    char *p = strchr(line, ':');
                    if (p) {
                        p++;
                        while (*p == ' ')
                            p++;
                        p[strcspn(p, "\n")] = '\0';
                        snprintf(model, sizeof model, ", %s", p);
                    }
                    break;
                }
            }
            fclose(f);
        }
#ifdef _SC_LEVEL3_CACHE_SIZE
        llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
        g_cache_bytes = llc > 0 ? (size_t)llc : (size_t)(32 * MiB);
#ifdef _OPENMP
        snprintf(buf, n, "cpu, %d OpenMP threads%s", omp_get_max_threads(), model);
#else
        snprintf(buf, n, "cpu, 1 thread (built without OpenMP)%s", model);
#endif
    }
}

static void choose_device(void)
{
    int avail = fusedrope_cuda_available();
    switch (opt.device) {
    case FUSEDROPE_DEVICE_CPU:
        g_cuda = 0;
        break;
    case FUSEDROPE_DEVICE_CUDA:
        if (!avail)
            bad_option("--device cuda: no CUDA device available (fusedrope_cuda_available() is "
                       "0: the library was built without CUDA or no GPU is present)");
        g_cuda = 1;
        break;
    default:
        g_cuda = avail;
        break;
    }
#ifndef HAVE_CUDA
    if (g_cuda)
        die("the library reports CUDA, but this program was built without it");
#endif
}

/* ------------------------------------------------------------------- main */

typedef struct {
    const char *op;
    char shape[96];
    double mb, ms, gbs, copy_gbs, max_ulp, ratio;
    int ok;
    graph_times graph; /* --graph */
} row;

int main(int argc, char **argv)
{
    char devdesc[512];
    row *rows;
    double *times;
    int nrows = 0, nfail = 0, total;

    parse_args(argc, argv);
    choose_device();
    if (opt.graph && !g_cuda)
        bad_option("--graph times CUDA graphs; this run has no CUDA device");
    if (opt.iters < 0)
        opt.iters = g_cuda ? 100 : 20;
    if (opt.warmup < 0)
        opt.warmup = g_cuda ? 10 : 3;
    describe_device(devdesc, sizeof devdesc);

#ifdef HAVE_CUDA
    if (g_cuda) {
        /* A blocking stream: it orders itself after the synchronous copies and
         * memsets this program issues on the legacy default stream. */
        CK(cudaStreamCreate(&g_stream));
        g_ev0 = xmalloc((size_t)opt.iters * sizeof *g_ev0);
        g_ev1 = xmalloc((size_t)opt.iters * sizeof *g_ev1);
        for (int i = 0; i < opt.iters; i++) {
            CK(cudaEventCreate(&g_ev0[i]));
            CK(cudaEventCreate(&g_ev1[i]));
        }
    }
#endif

    printf("libfusedrope %s, device: %s\n", fusedrope_version(), devdesc);
    {
        char rot[48];
        if (opt.rot_dim)
            snprintf(rot, sizeof rot, "rot_dim %lld", (long long)opt.rot_dim);
        else
            snprintf(rot, sizeof rot, "rot_dim = head_dim (rounded down to even)");
        printf("style %s, %s, %s, %s%s%s%s%s, %d timed calls after %d warm-up (medians), "
               "seed %llu\n",
               opt.style == FUSEDROPE_NEOX ? "neox" : "interleaved", rot,
               opt.inplace ? "in place" : "out of place",
               opt.qk ? "q and k in one call (*_qk)" : "one tensor per call",
               opt.offsets ? ", positions offset per batch entry (--offsets)" : "",
               opt.axes ? ", axes " : "", opt.axes ? opt.axes_str : "",
               opt.ids_rows ? ", random ids per axis (--ids-rows)" : "", opt.iters,
               opt.warmup, (unsigned long long)opt.seed);
    }
    fflush(stdout);

    total = 2 * opt.nshapes;
    rows = xmalloc((size_t)total * sizeof *rows);
    times = xmalloc(2 * (size_t)opt.iters * sizeof *times);

    for (int si = 0; si < opt.nshapes; si++) {
        bcase c;
        double copy_s = 0;
        case_setup(&c, opt.shapes[si]);
        for (int o = 0; o < 2; o++) {
            enum op op = o ? OP_BWD : OP_FWD;
            row *r = &rows[nrows++];
            vstats v;
            double t;
            const char *opname = opt.norm ? (o ? "norm_bwd" : "norm_fwd")
                                 : opt.qk ? (o ? "backward_qk" : "forward_qk")
                                          : (o ? "backward" : "forward");

            fprintf(stderr, "[%d/%d] %s %s %s %s%s%s%s%s ...\n", nrows, total, opname,
                    dtype_name(opt.dtype), layout_name(opt.layout), c.shape_str,
                    opt.offsets ? " offsets" : "", opt.axes ? " axes " : "",
                    opt.axes ? opt.axes_str : "", opt.ids_rows ? " ids-rows" : "");
            r->op = opname;
            snprintf(r->shape, sizeof r->shape, "%s", c.shape_str);
            r->ok = verify(&c, op, &v);
            if (!r->ok)
                nfail++;
            r->max_ulp = v.max_ulp;
            r->ratio = v.max_ratio;

            t = time_op(&c, op, opt.iters, opt.warmup, times);
            copy_s = time_copy(c.copy_bytes[op], fr_cpu_team, opt.iters, opt.warmup, times);
            r->mb = c.bytes_moved[op] / 1e6;
            r->ms = 1e3 * t;
            r->gbs = c.bytes_moved[op] / t / 1e9;
            r->copy_gbs = 2.0 * (double)c.copy_bytes[op] / copy_s / 1e9;
#ifdef HAVE_CUDA
            if (opt.graph)
                time_graph(&c, op, opt.graph, opt.iters, opt.warmup, times, &r->graph);
#endif
        }
        case_free(&c);
    }

    printf("\n%-12s %-6s %-5s %-20s %9s %10s %9s %9s %7s %8s %7s  %s\n", "op", "layout", "dtype",
           "shape", "MB", "median ms", "GB/s", "copy GB/s", "of copy", "max ulp", "err/tol",
           "check");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        printf("%-12s %-6s %-5s %-20s %9.2f %10.4f %9.1f %9.1f %7.3f %8.3g %7.3f  %s\n", r->op,
               layout_name(opt.layout), dtype_name(opt.dtype), r->shape, r->mb, r->ms, r->gbs,
               r->copy_gbs, r->gbs / r->copy_gbs, r->max_ulp, r->ratio, r->ok ? "ok" : "FAIL");
    }
    printf("\nGB/s = bytes that must move (MB) / median time; 'of copy' = that over a %s\n"
           "of the same bytes in this run.", g_cuda ? "device-to-device cudaMemcpyAsync"
                                                  : "memcpy on the library's threads");
    if (opt.norm)
        printf("\nEvery element of the output (and of the backward's dw) is checked against\n"
               "the float64 reference of the norm within the bounds of tests/ref.h\n"
               "(those of tests/test_norm); err/tol = max |y - ref| / bound, which must be <= 1;\n"
               "max ulp = max |y - ref| / ulp(ref); a NaN or an element left unwritten fails.\n");
    else
        printf(" max ulp = max |y - ref| / ulp(ref) and err/tol = max\n"
               "|y - ref| / (ulp(ref) + 2^-22 (|a| + |b|) max(1, attention factor)), the bound\n"
               "of fusedrope_forward(3) (Rotation; attention factor 1 here), which must be <= 1\n"
               "(max ulp may be large where a*cos - b*sin cancels), over all heads and channels\n"
               "of up to %d sampled tokens; every output element is checked for poison and NaN.\n",
               MAX_SAMPLED_TOKENS);
    if (opt.graph) {
        printf("\n%d calls in a row, microseconds per call (medians of %d rounds):\n"
               "%-12s %-20s %10s %10s %10s %10s\n", opt.graph, opt.iters, "op", "shape",
               "one call", "graph", "stream", "host");
        for (int i = 0; i < nrows; i++)
            printf("%-12s %-20s %10.2f %10.2f %10.2f %10.2f\n", rows[i].op, rows[i].shape,
                   1e3 * rows[i].ms, 1e6 * rows[i].graph.graph_s, 1e6 * rows[i].graph.stream_s,
                   1e6 * rows[i].graph.host_s);
        printf("one call: the median above (events around each call); graph: one CUDA graph\n"
               "of the %d calls replayed, over %d; stream: the same calls issued one by one,\n"
               "events around all; host: the host's time to issue one (checks and launch).\n",
               opt.graph, opt.graph);
    }
    if (nfail)
        printf("FAIL: %d of %d cases did not verify\n", nfail, nrows);
    else
        printf("all %d cases verified\n", nrows);

#ifdef HAVE_CUDA
    if (g_cuda) {
        for (int i = 0; i < opt.iters; i++) {
            CK(cudaEventDestroy(g_ev0[i]));
            CK(cudaEventDestroy(g_ev1[i]));
        }
        CK(cudaStreamDestroy(g_stream));
        free(g_ev0);
        free(g_ev1);
    }
#endif
    free(rows);
    free(times);
    return nfail ? 1 : 0;
}
