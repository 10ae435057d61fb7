/*
 * test_cuda.c - the CUDA backend against the CPU backend.
 *
 * Every case runs the same call twice: on the CPU with a CPU cache and host
 * buffers, and on the GPU with a CUDA cache of the same configuration and
 * device buffers holding the same bytes (outputs poisoned first).  The whole
 * buffers, padding, leads and guard tails included, must come back
 * bit-identical (table caches) or within one unit in the last place of the
 * dtype (table-less caches: glibc's and CUDA's double sin/cos may differ in
 * the last bit of a double, which can move a float by one ulp).  A NaN
 * result (only Inf - Inf from extreme inputs) must be NaN on both; its bits
 * are the hardware's (x86's default NaN is negative, the GPU's positive).
 *
 * Exits 77 (skipped) where no CUDA device is present.  CUDA cannot be used in
 * a child forked after the parent touched it, so the suite runs with
 * CK_NOFORK.  FUSEDROPE_TEST_SEED fixes the random data (default 1).
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <cuda_runtime.h>

#include "fusedrope.h"
#include "util.h"

#define CUDA_OK(call)                                                                     \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));        \
    } while (0)

#define FR_OK(call)                                                                       \
    do {                                                                                  \
        fusedrope_status s_ = (call);                                                     \
        ck_assert_msg(s_ == FUSEDROPE_OK, "%s: %s (%s)", #call, fusedrope_status_string(s_), \
                      fusedrope_last_error());                                            \
    } while (0)

/* The generator, dtype sizes, names and loads are the test library's
 * (tests/util.h, tests/ref.h); the run's seed is tu_seed. */

/* Bit pattern of element i mapped to a monotonic integer line. */
static int64_t elem_ordinal(const unsigned char *p, fusedrope_dtype dt, size_t i)
{
    if (dt == FUSEDROPE_FLOAT32) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        return (u & 0x80000000u) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
    } else {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return (h & 0x8000u) ? -(int64_t)(h & 0x7fffu) : (int64_t)h;
    }
}

/* Random finite values of moderate size, |v| < 8; or, with `extreme`, any
 * finite bit pattern of the dtype (subnormals and values near the largest
 * included, so results also underflow and overflow). */
static void fill_values(unsigned char *p, fusedrope_dtype dt, size_t n, tu_rng *r, int extreme)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t x = tu_next(r);
        if (extreme) {
            if (dt == FUSEDROPE_FLOAT32) {
                uint32_t u = (uint32_t)x;
                if ((u & 0x7f800000u) == 0x7f800000u)
                    u &= 0xff7fffffu; /* Inf/NaN -> a finite value */
                memcpy(p + 4 * i, &u, 4);
            } else {
                uint16_t h = (uint16_t)x;
                const uint16_t em = dt == FUSEDROPE_FLOAT16 ? 0x7c00u : 0x7f80u;
                if ((h & em) == em)
                    h &= 0xbfffu; /* Inf/NaN -> a finite value */
                memcpy(p + 2 * i, &h, 2);
            }
            continue;
        }
        if (dt == FUSEDROPE_FLOAT32) {
            float f = (float)(((double)(x >> 11) * 0x1p-53) * 16.0 - 8.0);
            memcpy(p + 4 * i, &f, 4);
        } else if (dt == FUSEDROPE_BFLOAT16) {
            float f = (float)(((double)(x >> 11) * 0x1p-53) * 16.0 - 8.0);
            uint32_t u;
            uint16_t h;
            memcpy(&u, &f, 4);
            h = (uint16_t)(u >> 16);
            memcpy(p + 2 * i, &h, 2);
        } else {
            /* sign, exponent 2^-6..2^2, any mantissa */
            uint16_t h = (uint16_t)(((x & 1) << 15) | ((uint64_t)(9 + (x >> 1) % 9) << 10) |
                                    ((x >> 8) & 1023));
            memcpy(p + 2 * i, &h, 2);
        }
    }
}

static void fill_random(unsigned char *p, fusedrope_dtype dt, size_t n, tu_rng *r)
{
    fill_values(p, dt, n, r, 0);
}

/* ------------------------------------------------------------------ caches */

static void config_for(fusedrope_cache_config *cfg, fusedrope_rope_type type, int rot_dim,
                       int64_t max_positions, double *factors)
{
    fusedrope_cache_config_init(cfg, type, rot_dim, max_positions, 10000.0);
    if (type != FUSEDROPE_ROPE_DEFAULT) {
        cfg->factor = type == FUSEDROPE_ROPE_LONGROPE ? 0.0 : 4.0;
        cfg->original_max_positions = 64;
    }
    if (type == FUSEDROPE_ROPE_DYNAMIC)
        cfg->seq_len = 300;
    if (type == FUSEDROPE_ROPE_LONGROPE) {
        for (int i = 0; i < rot_dim / 2; i++)
            factors[i] = 1.0 + 0.05 * i;
        cfg->short_factor = factors;
        cfg->long_factor = factors;
    }
}

static fusedrope_cache *make_cache(fusedrope_rope_type type, int rot_dim, int64_t max_positions,
                                   fusedrope_device dev)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    double *factors = calloc((size_t)rot_dim / 2 + 1, sizeof(double));
    ck_assert(factors != NULL);
    config_for(&cfg, type, rot_dim, max_positions, factors);
    FR_OK(fusedrope_cache_create(&cfg, dev, &c));
    free(factors);
    ck_assert_int_eq(fusedrope_cache_device(c), dev);
    return c;
}

/* A small memo of cache pairs, so a grid does not rebuild them per case. */
typedef struct {
    fusedrope_rope_type type;
    int rot_dim;
    int64_t max_positions;
    fusedrope_cache *cpu, *gpu;
} cache_pair;
static cache_pair memo[32];
static int memo_n;

static cache_pair *get_caches(fusedrope_rope_type type, int rot_dim, int64_t max_positions)
{
    for (int i = 0; i < memo_n; i++)
        if (memo[i].type == type && memo[i].rot_dim == rot_dim &&
            memo[i].max_positions == max_positions)
            return &memo[i];
    if (memo_n == (int)(sizeof memo / sizeof memo[0])) {
        for (int i = 0; i < memo_n; i++) {
            fusedrope_cache_destroy(memo[i].cpu);
            fusedrope_cache_destroy(memo[i].gpu);
        }
        memo_n = 0;
    }
    memo[memo_n].type = type;
    memo[memo_n].rot_dim = rot_dim;
    memo[memo_n].max_positions = max_positions;
    memo[memo_n].cpu = make_cache(type, rot_dim, max_positions, FUSEDROPE_DEVICE_CPU);
    memo[memo_n].gpu = make_cache(type, rot_dim, max_positions, FUSEDROPE_DEVICE_CUDA);
    return &memo[memo_n++];
}

static void free_caches(void)
{
    for (int i = 0; i < memo_n; i++) {
        fusedrope_cache_destroy(memo[i].cpu);
        fusedrope_cache_destroy(memo[i].gpu);
    }
    memo_n = 0;
}

/* -------------------------------------------------------------- the cases */

enum { OP_FWD, OP_BWD, OP_FWD_QK, OP_BWD_QK, OP_NUM };
enum { CL_SBHD, CL_BSHD, CL_THD, CL_NUM };
enum { PM_NONE, PM_OFFSETS, PM_IDS, PM_CP0, PM_CP1, PM_CP_OFFSETS, PM_NUM };

static const char *const op_names[] = { "forward", "backward", "forward_qk", "backward_qk" };
static const char *const lay_names[] = { "sbhd", "bshd", "thd" };
static const char *const pm_names[] = { "implicit", "offsets", "ids", "cp2/rank0", "cp2/rank1",
                                        "cp2+offsets" };

typedef struct {
    fusedrope_dtype dt;
    fusedrope_style style;
    int op, layout, qkv, pm, in_place, misalign, tableless;
    fusedrope_rope_type type;
    int rot_dim;
    int64_t head_dim;
    int64_t s, b;    /* THD: s = tokens, b = 1 */
    int64_t hq, hk;  /* single-tensor calls use hq heads (hk with qkv views) */
    int64_t max_positions; /* table rows; 0 means 512 (table-less caches have none) */
    int extreme;           /* inputs: any finite bit pattern instead of |v| < 8 */
} tcase;

static void describe(const tcase *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "%s %s %s %s%s pos=%s %s rot=%d/%lld s=%lld b=%lld hq=%lld hk=%lld%s%s type=%d",
             op_names[c->op], ref_dtype_name(c->dt), c->style == FUSEDROPE_NEOX ? "neox" : "interleaved",
             lay_names[c->layout], c->qkv ? "+qkv-views" : "", pm_names[c->pm],
             c->in_place ? "in-place" : "out-of-place", c->rot_dim, (long long)c->head_dim,
             (long long)c->s, (long long)c->b, (long long)c->hq, (long long)c->hk,
             c->misalign ? " misaligned" : "", c->tableless ? " table-less" : "", (int)c->type);
}

#define GUARD 24 /* elements after every buffer's last view element */

typedef struct {
    int64_t heads;        /* heads per token stored in the buffer */
    int64_t nel;          /* elements, lead and guard included */
    int is_input;
    unsigned char *init, *cpu, *gpu;
    void *dev;
} tbuf;

typedef struct {
    int buf;
    int64_t head0, heads;
} tview;

typedef struct {
    tbuf bufs[4];
    int nb;
    tview in[2], out[2];
    int count;
    /* positions, host and device */
    int64_t *ids, *offsets;
    int32_t *cu;
    int64_t n_ids, n_off, num_seqs;
    void *d_ids, *d_off, *d_cu;
    fusedrope_positions pos_h, pos_d;
    int pos_null;
} tsetup;

static int add_buf(tsetup *u, const tcase *c, int64_t heads, int is_input, tu_rng *r)
{
    tbuf *b = &u->bufs[u->nb];
    size_t es = ref_dtype_size(c->dt);
    b->heads = heads;
    b->nel = (c->misalign ? 1 : 0) + c->s * c->b * heads * c->head_dim + GUARD;
    b->is_input = is_input;
    b->init = malloc((size_t)b->nel * es);
    b->cpu = malloc((size_t)b->nel * es);
    b->gpu = malloc((size_t)b->nel * es);
    ck_assert(b->init && b->cpu && b->gpu);
    if (is_input)
        fill_values(b->init, c->dt, (size_t)b->nel, r, c->extreme);
    else
        memset(b->init, 0xa5, (size_t)b->nel * es); /* poison */
    b->dev = NULL;
    return u->nb++;
}

static void layout_strides(const tcase *c, int64_t H, int64_t *ss, int64_t *sb)
{
    const int64_t d = c->head_dim;
    switch (c->layout) {
    case CL_SBHD:
        *ss = c->b * H * d;
        *sb = H * d;
        break;
    case CL_BSHD:
        *ss = H * d;
        *sb = c->s * H * d;
        break;
    default: /* THD */
        *ss = H * d;
        *sb = 0;
        break;
    }
}

static fusedrope_tensor make_view(const tsetup *u, const tcase *c, const tview *v, int on_gpu)
{
    const tbuf *b = &u->bufs[v->buf];
    const size_t es = ref_dtype_size(c->dt);
    unsigned char *base = on_gpu ? (unsigned char *)b->dev : b->cpu;
    fusedrope_tensor t;
    memset(&t, 0, sizeof t);
    t.data = base + ((c->misalign ? 1 : 0) + v->head0 * c->head_dim) * (int64_t)es;
    t.dtype = c->dt;
    t.seq_len = c->s;
    t.batch = c->b;
    t.heads = v->heads;
    t.head_dim = c->head_dim;
    layout_strides(c, b->heads, &t.stride_seq, &t.stride_batch);
    t.stride_head = c->head_dim;
    return t;
}

/* Sequence lengths of a THD case: num_seqs sequences (one of them empty)
 * adding up to `total`; even lengths when `even`. */
static void thd_lengths(int32_t *cu, int64_t num_seqs, int64_t total, int even, tu_rng *r)
{
    const int64_t unit = even ? 2 : 1, units = total / unit;
    int64_t left = units;
    cu[0] = 0;
    for (int64_t i = 0; i < num_seqs; i++) {
        int64_t n;
        if (i == num_seqs - 1)
            n = left;
        else if (i == 1)
            n = 0;
        else
            n = tu_int(r, 0, left);
        left -= n;
        cu[i + 1] = cu[i] + (int32_t)(n * unit);
    }
}

static void *to_device(const void *h, size_t bytes)
{
    void *d = NULL;
    if (!h)
        return NULL;
    CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* used from non-blocking streams */
    return d;
}

static void setup_positions(tsetup *u, const tcase *c, int64_t max_positions, tu_rng *r)
{
    const int thd = c->layout == CL_THD;
    const int cp = c->pm == PM_CP0 || c->pm == PM_CP1 || c->pm == PM_CP_OFFSETS;
    fusedrope_positions_init(&u->pos_h);
    u->pos_null = !thd && c->pm == PM_NONE;
    u->num_seqs = thd ? 4 : c->b;
    if (thd) {
        u->cu = malloc((size_t)(u->num_seqs + 1) * sizeof(int32_t));
        thd_lengths(u->cu, u->num_seqs, c->s, cp, r);
        u->pos_h.cu_seqlens = u->cu;
        u->pos_h.num_seqs = u->num_seqs;
    }
    if (c->pm == PM_IDS) {
        u->n_ids = c->s * c->b;
        u->ids = malloc((size_t)u->n_ids * sizeof(int64_t));
        for (int64_t i = 0; i < u->n_ids; i++)
            u->ids[i] = tu_int(r, 0, (max_positions > 0 ? max_positions : 1 << 20) - 1);
        u->pos_h.ids = u->ids;
    }
    if (c->pm == PM_OFFSETS || c->pm == PM_CP_OFFSETS) {
        u->n_off = u->num_seqs;
        u->offsets = malloc((size_t)u->n_off * sizeof(int64_t));
        for (int64_t i = 0; i < u->n_off; i++)
            u->offsets[i] = tu_int(r, 0, 100);
        u->pos_h.offsets = u->offsets;
    }
    if (cp) {
        u->pos_h.cp_size = 2;
        u->pos_h.cp_rank = c->pm == PM_CP1 ? 1 : c->pm == PM_CP0 ? 0 : (int)tu_int(r, 0, 1);
    }
    u->pos_d = u->pos_h;
    u->d_ids = to_device(u->ids, (size_t)u->n_ids * sizeof(int64_t));
    u->d_off = to_device(u->offsets, (size_t)u->n_off * sizeof(int64_t));
    u->d_cu = to_device(u->cu, (size_t)(u->num_seqs + 1) * sizeof(int32_t));
    u->pos_d.ids = u->d_ids;
    u->pos_d.offsets = u->d_off;
    u->pos_d.cu_seqlens = u->d_cu;
}

static void setup_case(tsetup *u, const tcase *c, int64_t max_positions, tu_rng *r)
{
    const int qk = c->op == OP_FWD_QK || c->op == OP_BWD_QK;
    memset(u, 0, sizeof *u);
    if (c->qkv) {
        const int64_t H = c->hq + 2 * c->hk; /* q, k and v heads of one projection */
        int p = add_buf(u, c, H, 1, r);
        int po = c->in_place ? p : add_buf(u, c, H, 0, r);
        if (qk) {
            u->in[0] = (tview){ p, 0, c->hq };
            u->in[1] = (tview){ p, c->hq, c->hk };
            u->out[0] = (tview){ po, 0, c->hq };
            u->out[1] = (tview){ po, c->hq, c->hk };
            u->count = 2;
        } else {
            u->in[0] = (tview){ p, c->hq, c->hk };
            u->out[0] = (tview){ po, c->hq, c->hk };
            u->count = 1;
        }
    } else {
        int q = add_buf(u, c, c->hq, 1, r);
        int qo = c->in_place ? q : add_buf(u, c, c->hq, 0, r);
        u->in[0] = (tview){ q, 0, c->hq };
        u->out[0] = (tview){ qo, 0, c->hq };
        u->count = 1;
        if (qk) {
            int k = add_buf(u, c, c->hk, 1, r);
            int ko = c->in_place ? k : add_buf(u, c, c->hk, 0, r);
            u->in[1] = (tview){ k, 0, c->hk };
            u->out[1] = (tview){ ko, 0, c->hk };
            u->count = 2;
        }
    }
    setup_positions(u, c, max_positions, r);
}

static void teardown_case(tsetup *u)
{
    for (int i = 0; i < u->nb; i++) {
        free(u->bufs[i].init);
        free(u->bufs[i].cpu);
        free(u->bufs[i].gpu);
        if (u->bufs[i].dev)
            cudaFree(u->bufs[i].dev);
    }
    free(u->ids);
    free(u->offsets);
    free(u->cu);
    if (u->d_ids)
        cudaFree(u->d_ids);
    if (u->d_off)
        cudaFree(u->d_off);
    if (u->d_cu)
        cudaFree(u->d_cu);
    memset(u, 0, sizeof *u);
}

static fusedrope_status call_op(const tcase *c, const tsetup *u, const fusedrope_cache *cache,
                                int on_gpu, void *stream)
{
    const fusedrope_positions *pos = u->pos_null ? NULL : on_gpu ? &u->pos_d : &u->pos_h;
    fusedrope_tensor x0 = make_view(u, c, &u->in[0], on_gpu);
    fusedrope_tensor y0 = make_view(u, c, &u->out[0], on_gpu);
    fusedrope_tensor x1, y1;
    if (u->count == 2) {
        x1 = make_view(u, c, &u->in[1], on_gpu);
        y1 = make_view(u, c, &u->out[1], on_gpu);
    }
    switch (c->op) {
    case OP_FWD:
        return fusedrope_forward(cache, c->style, pos, &x0, &y0, stream);
    case OP_BWD:
        return fusedrope_backward(cache, c->style, pos, &x0, &y0, stream);
    case OP_FWD_QK:
        return fusedrope_forward_qk(cache, c->style, pos, &x0, &y0, &x1, &y1, stream);
    default:
        return fusedrope_backward_qk(cache, c->style, pos, &x0, &y0, &x1, &y1, stream);
    }
}

/* Runs the case on the GPU into bufs[].gpu; the caller checks the status. */
static fusedrope_status run_gpu(const tcase *c, tsetup *u, const fusedrope_cache *gpu,
                                cudaStream_t stream)
{
    const size_t es = ref_dtype_size(c->dt);
    fusedrope_status st;
    for (int i = 0; i < u->nb; i++) {
        tbuf *b = &u->bufs[i];
        if (!b->dev)
            CUDA_OK(cudaMalloc(&b->dev, (size_t)b->nel * es));
        CUDA_OK(cudaMemcpy(b->dev, b->init, (size_t)b->nel * es, cudaMemcpyHostToDevice));
    }
    /* A copy from pageable memory may return before its DMA lands, and the
     * grid's stream does not wait for the legacy default stream: without
     * this the kernel could read last case's bytes (seen under load). */
    CUDA_OK(cudaDeviceSynchronize());
    st = call_op(c, u, gpu, 1, stream);
    if (st != FUSEDROPE_OK)
        return st;
    st = fusedrope_cache_check(gpu, stream);
    for (int i = 0; i < u->nb; i++)
        CUDA_OK(cudaMemcpy(u->bufs[i].gpu, u->bufs[i].dev, (size_t)u->bufs[i].nel * es,
                           cudaMemcpyDeviceToHost));
    return st;
}

static void run_cpu(const tcase *c, tsetup *u, const fusedrope_cache *cpu)
{
    const size_t es = ref_dtype_size(c->dt);
    for (int i = 0; i < u->nb; i++)
        memcpy(u->bufs[i].cpu, u->bufs[i].init, (size_t)u->bufs[i].nel * es);
    FR_OK(call_op(c, u, cpu, 0, NULL));
}

/* Compares every buffer, CPU against GPU. */
static void compare(const tcase *c, const tsetup *u)
{
    const size_t es = ref_dtype_size(c->dt);
    char desc[512];
    for (int i = 0; i < u->nb; i++) {
        const tbuf *b = &u->bufs[i];
        if (memcmp(b->cpu, b->gpu, (size_t)b->nel * es) == 0)
            continue;
        for (int64_t k = 0; k < b->nel; k++) {
            double vc, vg, tol;
            if (memcmp(b->cpu + k * (int64_t)es, b->gpu + k * (int64_t)es, es) == 0)
                continue;
            vc = ref_load(b->cpu, c->dt, k);
            vg = ref_load(b->gpu, c->dt, k);
            /* Inf - Inf (extreme inputs): a NaN on both, but x86's default
             * NaN is negative and the GPU's canonical one positive. */
            if (isnan(vc) && isnan(vg))
                continue;
            /* Table-less: one ulp of the dtype, or the float32 arithmetic's
             * own slack where a*c - b*s cancels (|a|, |b| < 8, attention
             * factor below 2). */
            tol = 0x1p-22 * 16.0 * 2.0;
            if (c->tableless && !isnan(vc) && !isnan(vg) &&
                (llabs(elem_ordinal(b->cpu, c->dt, (size_t)k) -
                       elem_ordinal(b->gpu, c->dt, (size_t)k)) <= 1 ||
                 fabs(vc - vg) <= tol))
                continue;
            describe(c, desc, sizeof desc);
            ck_abort_msg("%s: buffer %d element %lld (of %lld, lead %d): CPU %.9g, GPU %.9g", desc,
                         i, (long long)k, (long long)b->nel, c->misalign, vc, vg);
        }
    }
}

static void run_case(const tcase *c, cudaStream_t stream)
{
    const int64_t max_positions = c->tableless ? 0 : c->max_positions ? c->max_positions : 512;
    cache_pair *cp = get_caches(c->type, c->rot_dim, max_positions);
    tu_rng r;
    tsetup u;
    fusedrope_status st;
    char desc[512];

    tu_rng_init(&r, (uint64_t)c->op * 1000003u + (uint64_t)c->pm * 7919u + (uint64_t)c->s);
    setup_case(&u, c, max_positions, &r);
    run_cpu(c, &u, cp->cpu);
    st = run_gpu(c, &u, cp->gpu, stream);
    if (st != FUSEDROPE_OK) {
        describe(c, desc, sizeof desc);
        ck_abort_msg("%s: GPU call: %s (%s)", desc, fusedrope_status_string(st),
                     fusedrope_last_error());
    }
    compare(c, &u);
    teardown_case(&u);
}

/* ------------------------------------------------------------- the grid */

static const struct { int64_t head_dim; int full, partial; } dims[] = {
    { 128, 128, 64 }, /* vector path for every dtype and style when aligned */
    { 80, 80, 48 },   /* odd head_dim, 16-byte rows */
    { 72, 72, 40 },   /* NeoX 16-bit: half = 36 channels, not whole 16-byte chunks */
    { 66, 66, 64 },   /* rows not a multiple of 16 bytes: scalar path; 2-channel tail */
};

/* One loop iteration per (dtype, style, op); inside it every layout, view
 * kind and position mode, with the remaining properties (in place, partial
 * rotation, head_dim, misalignment, table-less, rope type) rotated so each
 * value meets each of the others. */
START_TEST(test_grid)
{
    const fusedrope_dtype dts[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16, FUSEDROPE_BFLOAT16 };
    const fusedrope_rope_type types[6] = { FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_ROPE_YARN,
                                           FUSEDROPE_ROPE_LLAMA3, FUSEDROPE_ROPE_LINEAR,
                                           FUSEDROPE_ROPE_LONGROPE, FUSEDROPE_ROPE_DYNAMIC };
    cudaStream_t stream;
    int n = 0;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int lay = 0; lay < CL_NUM; lay++)
        for (int qkv = 0; qkv < 2; qkv++)
            for (int pm = 0; pm < PM_NUM; pm++)
                for (int v = 0; v < 4; v++, n++) {
                    const int k = _i * 7 + n;
                    tcase c;
                    memset(&c, 0, sizeof c);
                    c.dt = dts[_i / 8];
                    c.style = (_i / 4) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
                    c.op = _i % 4;
                    c.layout = lay;
                    c.qkv = qkv;
                    c.pm = pm;
                    c.in_place = v & 1;
                    c.head_dim = dims[(v / 2 + k) % 4].head_dim;
                    c.rot_dim = (v / 2) ? dims[(v / 2 + k) % 4].partial : dims[(v / 2 + k) % 4].full;
                    c.misalign = k % 3 == 0;
                    c.tableless = k % 5 == 2;
                    c.type = types[k % 6];
                    if (c.type == FUSEDROPE_ROPE_DYNAMIC && c.rot_dim < 4)
                        c.type = FUSEDROPE_ROPE_DEFAULT;
                    c.hq = 4;
                    c.hk = 2;
                    if (lay == CL_THD) {
                        c.b = 1;
                        c.s = 30 + (pm >= PM_CP0 ? 0 : k % 2);
                    } else {
                        c.b = 3;
                        c.s = 14 - (pm >= PM_CP0 ? 0 : k % 2);
                    }
                    run_case(&c, stream);
                }
    CUDA_OK(cudaStreamDestroy(stream));
    free_caches();
}
END_TEST

/* Launch shapes off the grid: decode (few tokens, many heads), enough tokens
 * that threads take several heads (partial head batches with 7 + 3 heads),
 * and rows wider than a block. */
START_TEST(test_shapes)
{
    cudaStream_t stream;
    tcase c;
    CUDA_OK(cudaStreamCreate(&stream));

    /* decode: batch 64, one token, 32 q heads + 8 k heads, offsets */
    memset(&c, 0, sizeof c);
    c.dt = FUSEDROPE_BFLOAT16;
    c.style = FUSEDROPE_NEOX;
    c.op = OP_FWD_QK;
    c.layout = CL_BSHD;
    c.pm = PM_OFFSETS;
    c.in_place = 1;
    c.rot_dim = 128;
    c.head_dim = 128;
    c.s = 1;
    c.b = 64;
    c.hq = 32;
    c.hk = 8;
    c.type = FUSEDROPE_ROPE_LLAMA3;
    run_case(&c, stream);
    c.qkv = 1;
    c.in_place = 0;
    c.op = OP_BWD_QK;
    run_case(&c, stream);

    /* prefill-sized: several heads per thread, heads 7 + 3 */
    memset(&c, 0, sizeof c);
    c.dt = FUSEDROPE_BFLOAT16;
    c.style = FUSEDROPE_NEOX;
    c.op = OP_FWD_QK;
    c.layout = CL_SBHD;
    c.pm = PM_IDS;
    c.in_place = 1;
    c.rot_dim = 128;
    c.head_dim = 128;
    c.s = 8192;
    c.b = 4;
    c.hq = 7;
    c.hk = 3;
    c.type = FUSEDROPE_ROPE_YARN;
    run_case(&c, stream);

    /* the same with pass-through lanes, fp32 interleaved, qkv views, backward */
    c.dt = FUSEDROPE_FLOAT32;
    c.style = FUSEDROPE_INTERLEAVED;
    c.op = OP_BWD_QK;
    c.layout = CL_THD;
    c.qkv = 1;
    c.pm = PM_CP_OFFSETS;
    c.in_place = 0;
    c.rot_dim = 64;
    c.head_dim = 80;
    c.s = 16384;
    c.b = 1;
    c.max_positions = 2 * 16384 + 128; /* cp 2: global positions up to twice the length */
    c.type = FUSEDROPE_ROPE_DEFAULT;
    run_case(&c, stream);

    /* table-less, several heads per thread */
    c.dt = FUSEDROPE_FLOAT16;
    c.style = FUSEDROPE_NEOX;
    c.op = OP_FWD_QK;
    c.layout = CL_BSHD;
    c.qkv = 0;
    c.pm = PM_NONE;
    c.tableless = 1;
    c.rot_dim = 64;
    c.head_dim = 64;
    c.s = 4096;
    c.b = 8;
    c.type = FUSEDROPE_ROPE_YARN;
    run_case(&c, stream);

    /* wide rows: more lanes than a block holds, vector and scalar */
    memset(&c, 0, sizeof c);
    c.dt = FUSEDROPE_FLOAT32;
    c.style = FUSEDROPE_NEOX;
    c.op = OP_FWD;
    c.layout = CL_SBHD;
    c.pm = PM_OFFSETS;
    c.rot_dim = 4096;
    c.head_dim = 4100;
    c.s = 3;
    c.b = 2;
    c.hq = 3;
    c.hk = 1;
    run_case(&c, stream);
    c.misalign = 1;
    c.in_place = 1;
    c.op = OP_BWD;
    run_case(&c, stream);

    CUDA_OK(cudaStreamDestroy(stream));
    free_caches();
}
END_TEST

/* Extreme values: subnormal inputs and results, overflow to Inf.  The GPU
 * converts with the hardware's round-to-nearest-even instructions; they must
 * give rope_math.h's bits for every finite input (both paths). */
START_TEST(test_extreme_values)
{
    const fusedrope_dtype dts[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16, FUSEDROPE_BFLOAT16 };
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    for (int d = 0; d < 3; d++)
        for (int style = 0; style < 2; style++)
            for (int mis = 0; mis < 2; mis++)
                for (int op = 0; op < OP_NUM; op++) {
                    tcase c;
                    memset(&c, 0, sizeof c);
                    c.dt = dts[d];
                    c.style = style ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
                    c.op = op;
                    c.layout = op % 2 ? CL_SBHD : CL_BSHD;
                    c.qkv = op >= OP_FWD_QK;
                    c.pm = PM_IDS;
                    c.in_place = op % 2;
                    c.misalign = mis;
                    c.extreme = 1;
                    c.rot_dim = 128;
                    c.head_dim = 136;
                    c.s = 64;
                    c.b = 4;
                    c.hq = 4;
                    c.hk = 2;
                    c.type = FUSEDROPE_ROPE_YARN; /* attention factor > 1 */
                    run_case(&c, stream);
                }
    CUDA_OK(cudaStreamDestroy(stream));
    free_caches();
}
END_TEST

/* ------------------------------------------------------------ the table */

START_TEST(test_copy_table)
{
    const fusedrope_rope_type types[6] = { FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_ROPE_LINEAR,
                                           FUSEDROPE_ROPE_DYNAMIC, FUSEDROPE_ROPE_YARN,
                                           FUSEDROPE_ROPE_LONGROPE, FUSEDROPE_ROPE_LLAMA3 };
    const int rot_dim = 96;
    const int64_t maxpos = 3000, n = maxpos * rot_dim / 2;
    float *c1 = malloc((size_t)n * 4), *s1 = malloc((size_t)n * 4);
    float *c2 = malloc((size_t)n * 4), *s2 = malloc((size_t)n * 4);
    fusedrope_cache *tab;
    ck_assert(c1 && s1 && c2 && s2);

    for (int t = 0; t < 6; t++) {
        fusedrope_cache *cpu = make_cache(types[t], rot_dim, maxpos, FUSEDROPE_DEVICE_CPU);
        fusedrope_cache *gpu = make_cache(types[t], rot_dim, maxpos, FUSEDROPE_DEVICE_CUDA);
        memset(c2, 0, (size_t)n * 4);
        memset(s2, 0, (size_t)n * 4);
        FR_OK(fusedrope_cache_copy_table(cpu, c1, s1));
        FR_OK(fusedrope_cache_copy_table(gpu, c2, s2));
        ck_assert_msg(memcmp(c1, c2, (size_t)n * 4) == 0, "rope type %d: cos tables differ", t);
        ck_assert_msg(memcmp(s1, s2, (size_t)n * 4) == 0, "rope type %d: sin tables differ", t);
        ck_assert_int_eq(fusedrope_cache_rot_dim(gpu), rot_dim);
        ck_assert_int_eq(fusedrope_cache_max_positions(gpu), maxpos);
        FR_OK(fusedrope_cache_check(gpu, NULL));
        fusedrope_cache_destroy(cpu);
        fusedrope_cache_destroy(gpu);
    }

    /* a user table goes up and comes back unchanged */
    FR_OK(fusedrope_cache_create_from_table(c1, s1, maxpos, rot_dim, FUSEDROPE_DEVICE_CUDA, &tab));
    memset(c2, 0, (size_t)n * 4);
    memset(s2, 0, (size_t)n * 4);
    FR_OK(fusedrope_cache_copy_table(tab, c2, s2));
    ck_assert(memcmp(c1, c2, (size_t)n * 4) == 0 && memcmp(s1, s2, (size_t)n * 4) == 0);
    fusedrope_cache_destroy(tab);

    /* table-less CUDA cache: no table to copy */
    tab = make_cache(FUSEDROPE_ROPE_DEFAULT, rot_dim, 0, FUSEDROPE_DEVICE_CUDA);
    ck_assert_int_eq(fusedrope_cache_copy_table(tab, c2, s2), FUSEDROPE_ERR_INVALID);
    fusedrope_cache_destroy(tab);
    free(c1);
    free(s1);
    free(c2);
    free(s2);
}
END_TEST

/* ------------------------------------------------- positions off the table */

static uint16_t bf16_bits(const unsigned char *p, int64_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return h;
}

/* sbhd [S, B, H, 80], rot_dim 64, bf16, out of place, device ids with some
 * positions off a 64-row table: NaN over exactly those tokens' rotated
 * channels, their pass-through copied, every other token as on the CPU, and
 * the flag raised once.  Leaves the device buffers to the caller. */
static void out_of_table_case(int64_t S, int64_t B, int64_t H, fusedrope_cache *cpu,
                              fusedrope_cache *gpu, void **dx_out, void **dy_out)
{
    const int64_t D = 80, R = 64, n = S * B * H * D, T = S * B;
    int64_t *ids = malloc((size_t)T * sizeof *ids), *ids_ok = malloc((size_t)T * sizeof *ids_ok);
    unsigned char *x = malloc((size_t)n * 2), *yc = malloc((size_t)n * 2),
                  *yg = malloc((size_t)n * 2);
    void *dx, *dy, *dids;
    fusedrope_positions ph, pd;
    fusedrope_tensor tx, ty;
    tu_rng r;

    ck_assert(ids && ids_ok && x && yc && yg);
    tu_rng_init(&r, 77 + (uint64_t)T);
    fill_random(x, FUSEDROPE_BFLOAT16, (size_t)n, &r);
    for (int64_t i = 0; i < T; i++) {
        ids[i] = (i * 3) % 64;
        ids_ok[i] = ids[i];
    }
    for (int64_t i = 3; i < T; i += 11) { /* one past the table, far past, negative */
        ids[i] = i % 3 == 0 ? 64 : i % 3 == 1 ? 1000000 : -5;
        ids_ok[i] = 0;
    }
    fusedrope_positions_init(&ph);
    ph.ids = ids_ok;
    tx = fusedrope_tensor_sbhd(x, FUSEDROPE_BFLOAT16, S, B, H, D);
    ty = fusedrope_tensor_sbhd(yc, FUSEDROPE_BFLOAT16, S, B, H, D);
    FR_OK(fusedrope_forward(cpu, FUSEDROPE_NEOX, &ph, &tx, &ty, NULL));

    /* the CPU refuses the bad ids at the call, writing nothing */
    ph.ids = ids;
    memset(yg, 0x5a, (size_t)n * 2);
    ty.data = yg;
    ck_assert_int_eq(fusedrope_forward(cpu, FUSEDROPE_NEOX, &ph, &tx, &ty, NULL),
                     FUSEDROPE_ERR_RANGE);
    for (int64_t i = 0; i < n; i++) /* (a ck_assert per element is slow under CK_NOFORK) */
        if (bf16_bits(yg, i) != 0x5a5a)
            ck_abort_msg("element %lld written by a refused call", (long long)i);

    CUDA_OK(cudaMalloc(&dx, (size_t)n * 2));
    CUDA_OK(cudaMalloc(&dy, (size_t)n * 2));
    CUDA_OK(cudaMalloc(&dids, (size_t)T * sizeof *ids));
    CUDA_OK(cudaMemcpy(dx, x, (size_t)n * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dy, 0xa5, (size_t)n * 2));
    CUDA_OK(cudaMemcpy(dids, ids, (size_t)T * sizeof *ids, cudaMemcpyHostToDevice));
    pd = ph;
    pd.ids = dids;
    tx.data = dx;
    ty.data = dy;
    FR_OK(fusedrope_cache_check(gpu, NULL)); /* nothing raised yet */
    FR_OK(fusedrope_forward(gpu, FUSEDROPE_NEOX, &pd, &tx, &ty, NULL));
    ck_assert_int_eq(fusedrope_cache_check(gpu, NULL), FUSEDROPE_ERR_RANGE);
    ck_assert(strlen(fusedrope_last_error()) > 0);
    FR_OK(fusedrope_cache_check(gpu, NULL)); /* cleared */
    CUDA_OK(cudaMemcpy(yg, dy, (size_t)n * 2, cudaMemcpyDeviceToHost));
    for (int64_t s = 0; s < S; s++)
        for (int64_t b = 0; b < B; b++) {
            const int bad = ids[b * S + s] < 0 || ids[b * S + s] >= 64;
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t i = ((s * B + b) * H + h) * D + d;
                    const uint16_t g = bf16_bits(yg, i);
                    const uint16_t want = bad ? bf16_bits(x, i) /* pass-through copied */
                                              : bf16_bits(yc, i);
                    if (bad && d < R) {
                        if (!((g & 0x7f80) == 0x7f80 && (g & 0x7f)))
                            ck_abort_msg("token (%lld, %lld) channel %lld: 0x%04x is not NaN",
                                         (long long)b, (long long)s, (long long)d, g);
                    } else if (g != want) {
                        ck_abort_msg("token (%lld, %lld) head %lld channel %lld: 0x%04x, "
                                     "expected 0x%04x",
                                     (long long)b, (long long)s, (long long)h, (long long)d, g,
                                     want);
                    }
                }
        }
    cudaFree(dids);
    free(ids);
    free(ids_ok);
    free(x);
    free(yc);
    free(yg);
    *dx_out = dx;
    *dy_out = dy;
}

START_TEST(test_out_of_table)
{
    const int64_t S = 8, B = 2, H = 2, D = 80, R = 64, n = S * B * H * D;
    fusedrope_cache *cpu = make_cache(FUSEDROPE_ROPE_DEFAULT, (int)R, 64, FUSEDROPE_DEVICE_CPU);
    fusedrope_cache *gpu = make_cache(FUSEDROPE_ROPE_DEFAULT, (int)R, 64, FUSEDROPE_DEVICE_CUDA);
    unsigned char *yg = malloc((size_t)n * 2);
    void *dx, *dy;
    fusedrope_positions pd;

    ck_assert(yg != NULL);
    /* a prefill-sized call first: 4 or more heads per thread on any GPU of
     * up to ~380 SMs, so the general kernel, not the one-group one that
     * decode-sized calls get */
    out_of_table_case(2048, 8, 32, cpu, gpu, &dx, &dy);
    cudaFree(dx);
    cudaFree(dy);
    out_of_table_case(S, B, H, cpu, gpu, &dx, &dy);

    /* THD with a cu_seqlens that leaves the last tokens outside every
     * sequence (device arrays are not checked on the host) */
    {
        int32_t cu[4] = { 0, 4, 12, 0 }; /* the last entry for the third case */
        void *dcu;
        fusedrope_tensor t = fusedrope_tensor_thd(dx, FUSEDROPE_BFLOAT16, S * B, H, D);
        fusedrope_tensor o = fusedrope_tensor_thd(dy, FUSEDROPE_BFLOAT16, S * B, H, D);
        CUDA_OK(cudaMalloc(&dcu, sizeof cu));
        CUDA_OK(cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice));
        fusedrope_positions_init(&pd);
        pd.cu_seqlens = dcu;
        pd.num_seqs = 2;
        pd.cp_size = 1;
        FR_OK(fusedrope_forward(gpu, FUSEDROPE_INTERLEAVED, &pd, &t, &o, NULL));
        ck_assert_int_eq(fusedrope_cache_check(gpu, NULL), FUSEDROPE_ERR_RANGE);
        FR_OK(fusedrope_cache_check(gpu, NULL));
        CUDA_OK(cudaMemcpy(yg, dy, (size_t)n * 2, cudaMemcpyDeviceToHost));
        for (int64_t tok = 12; tok < S * B; tok++)
            for (int64_t d = 0; d < R; d++) {
                const uint16_t g = bf16_bits(yg, (tok * H) * D + d);
                ck_assert_msg((g & 0x7f80) == 0x7f80 && (g & 0x7f), "token %lld not NaN",
                              (long long)tok);
            }
        for (int64_t tok = 0; tok < 12; tok++)
            for (int64_t d = 0; d < D; d++) {
                const uint16_t g = bf16_bits(yg, (tok * H) * D + d);
                ck_assert_msg((g & 0x7f80) != 0x7f80, "token %lld channel %lld is NaN",
                              (long long)tok, (long long)d);
            }
        /* a last entry past the token count: every token has a position,
         * the array is still wrong, and the flag says so */
        cu[2] = 40;
        CUDA_OK(cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice));
        FR_OK(fusedrope_forward(gpu, FUSEDROPE_NEOX, &pd, &t, &o, NULL));
        ck_assert_int_eq(fusedrope_cache_check(gpu, NULL), FUSEDROPE_ERR_RANGE);
        FR_OK(fusedrope_cache_check(gpu, NULL));
        /* three sequences with right ends: good, then decreasing between
         * them (2 after 6), which only the flag can report */
        cu[1] = 2;
        cu[2] = 6;
        cu[3] = (int32_t)(S * B);
        pd.num_seqs = 3;
        CUDA_OK(cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice));
        FR_OK(fusedrope_forward(gpu, FUSEDROPE_NEOX, &pd, &t, &o, NULL));
        FR_OK(fusedrope_cache_check(gpu, NULL));
        cu[1] = 6;
        cu[2] = 2;
        CUDA_OK(cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice));
        FR_OK(fusedrope_backward(gpu, FUSEDROPE_INTERLEAVED, &pd, &t, &o, NULL));
        ck_assert_int_eq(fusedrope_cache_check(gpu, NULL), FUSEDROPE_ERR_RANGE);
        FR_OK(fusedrope_cache_check(gpu, NULL));
        cudaFree(dcu);
    }

    cudaFree(dx);
    cudaFree(dy);
    free(yg);
    fusedrope_cache_destroy(cpu);
    fusedrope_cache_destroy(gpu);
}
END_TEST

/* ------------------------------------------- range flags of many caches */

/* One forward on cache c of its one token at device id *dids: raises c's
 * flag when that id is past the table. */
static void raise_range_flag(fusedrope_cache *c, void *dx, void *dids)
{
    fusedrope_positions p;
    fusedrope_tensor t = fusedrope_tensor_sbhd(dx, FUSEDROPE_BFLOAT16, 1, 1, 1, 64);
    fusedrope_positions_init(&p);
    p.ids = dids;
    p.cp_size = 1;
    FR_OK(fusedrope_forward(c, FUSEDROPE_NEOX, &p, &t, &t, NULL));
}

/* Each cache reports only its own kernels' out-of-table positions, and a
 * cache created after one whose flag was raised and never checked starts
 * clear (its flag may reuse the same pinned memory). */
START_TEST(test_flag_per_cache)
{
    enum { N = 40 };
    fusedrope_cache **c = calloc(N, sizeof *c);
    const int64_t bad_id = 1000;
    void *dx, *dids;
    ck_assert(c != NULL);
    CUDA_OK(cudaMalloc(&dx, 64 * 2));
    CUDA_OK(cudaMemset(dx, 0, 64 * 2));
    CUDA_OK(cudaMalloc(&dids, sizeof bad_id));
    CUDA_OK(cudaMemcpy(dids, &bad_id, sizeof bad_id, cudaMemcpyHostToDevice));
    for (int i = 0; i < N; i++)
        c[i] = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CUDA);

    const int probe[4] = { 0, 1, N / 2, N - 1 };
    for (int k = 0; k < 4; k++) {
        raise_range_flag(c[probe[k]], dx, dids);
        for (int i = 0; i < N; i++)
            ck_assert_int_eq(fusedrope_cache_check(c[i], NULL),
                             i == probe[k] ? FUSEDROPE_ERR_RANGE : FUSEDROPE_OK);
    }

    /* raised and never checked, then destroyed: the next cache's word is clear */
    raise_range_flag(c[7], dx, dids);
    CUDA_OK(cudaDeviceSynchronize());
    fusedrope_cache_destroy(c[7]);
    c[7] = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CUDA);
    FR_OK(fusedrope_cache_check(c[7], NULL));

    for (int i = 0; i < N; i++)
        fusedrope_cache_destroy(c[i]);
    free(c);
    cudaFree(dx);
    cudaFree(dids);
}
END_TEST

/* pos->range_status: a device word and a page-locked host word, each on
 * its own stream, report only their own call's positions, never the
 * cache's flag; a pageable host word is refused before any launch. */
START_TEST(test_range_status_word)
{
    const int64_t ids[2] = { 1000, 3 }; /* the first outside a 16-row table */
    fusedrope_cache *c = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CUDA);
    cudaStream_t s1, s2;
    int32_t *dword, *pinned, hword = 0, got = -1;
    void *dx, *dids;
    fusedrope_positions p;
    fusedrope_tensor t;

    CUDA_OK(cudaStreamCreate(&s1));
    CUDA_OK(cudaStreamCreate(&s2));
    CUDA_OK(cudaMalloc(&dx, 2 * 64 * 2));
    CUDA_OK(cudaMemset(dx, 0, 2 * 64 * 2));
    CUDA_OK(cudaMalloc(&dids, sizeof ids));
    CUDA_OK(cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&dword, sizeof *dword));
    CUDA_OK(cudaMemset(dword, 0, sizeof *dword));
    CUDA_OK(cudaHostAlloc((void **)&pinned, sizeof *pinned, cudaHostAllocMapped));
    *pinned = 0;
    t = fusedrope_tensor_sbhd(dx, FUSEDROPE_BFLOAT16, 1, 1, 1, 64);
    fusedrope_positions_init(&p);

    p.ids = dids;                         /* id 1000: out of the table */
    p.range_status = dword;
    FR_OK(fusedrope_forward(c, FUSEDROPE_NEOX, &p, &t, &t, s1));
    p.ids = (const int64_t *)dids + 1;    /* id 3: inside */
    p.range_status = pinned;
    FR_OK(fusedrope_forward(c, FUSEDROPE_NEOX, &p, &t, &t, s2));
    CUDA_OK(cudaStreamSynchronize(s1));
    CUDA_OK(cudaStreamSynchronize(s2));
    CUDA_OK(cudaMemcpy(&got, dword, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(got, 1);
    ck_assert_int_eq(*pinned, 0);
    FR_OK(fusedrope_cache_check(c, NULL)); /* the cache's flag was not raised */

    p.ids = dids;
    FR_OK(fusedrope_forward(c, FUSEDROPE_NEOX, &p, &t, &t, s2));
    CUDA_OK(cudaStreamSynchronize(s2));
    ck_assert_int_eq(__atomic_load_n(pinned, __ATOMIC_SEQ_CST), 1);
    FR_OK(fusedrope_cache_check(c, NULL));

    p.range_status = &hword;
    ck_assert_int_eq(fusedrope_forward(c, FUSEDROPE_NEOX, &p, &t, &t, s1),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_msg(strstr(fusedrope_last_error(), "pageable"), "%s", fusedrope_last_error());

    fusedrope_cache_destroy(c);
    cudaFreeHost(pinned);
    cudaFree(dword);
    cudaFree(dids);
    cudaFree(dx);
    CUDA_OK(cudaStreamDestroy(s1));
    CUDA_OK(cudaStreamDestroy(s2));
}
END_TEST

/* Tables too large for the device: a size that wraps when rounded up is
 * refused before anything is launched, one that merely does not fit fails
 * its allocation; neither leaves a cache or a broken CUDA context behind. */
START_TEST(test_huge_table_refused)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *c = (fusedrope_cache *)&cfg;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 2, (int64_t)(SIZE_MAX / 4), 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CUDA, &c), FUSEDROPE_ERR_RANGE);
    ck_assert_ptr_null(c);
    cfg.max_positions = (int64_t)1 << 40; /* 4 TiB of cos and as much of sin */
    c = (fusedrope_cache *)&cfg;
    ck_assert_int_ne(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CUDA, &c), FUSEDROPE_OK);
    ck_assert_ptr_null(c);
    ck_assert(strlen(fusedrope_last_error()) > 0);

    /* the context still works */
    {
        const int64_t id = 3;
        void *dx, *dids;
        c = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CUDA);
        CUDA_OK(cudaMalloc(&dx, 64 * 2));
        CUDA_OK(cudaMemset(dx, 0, 64 * 2));
        CUDA_OK(cudaMalloc(&dids, sizeof id));
        CUDA_OK(cudaMemcpy(dids, &id, sizeof id, cudaMemcpyHostToDevice));
        raise_range_flag(c, dx, dids); /* id 3 is inside this table: nothing raised */
        FR_OK(fusedrope_cache_check(c, NULL));
        CUDA_OK(cudaDeviceSynchronize());
        fusedrope_cache_destroy(c);
        cudaFree(dx);
        cudaFree(dids);
    }
}
END_TEST

/* ------------------------------------------------------ wrong-device data */

START_TEST(test_device_mismatch)
{
    const int64_t n = 4 * 2 * 64;
    fusedrope_cache *cpu = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CPU);
    fusedrope_cache *gpu = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CUDA);
    float *h = calloc((size_t)n, 4), *h2 = calloc((size_t)n, 4);
    int64_t ids[4] = { 0, 1, 2, 3 };
    void *d, *d2;
    fusedrope_tensor th, th2, td, td2;
    fusedrope_positions pos;

    CUDA_OK(cudaMalloc(&d, (size_t)n * 4));
    CUDA_OK(cudaMalloc(&d2, (size_t)n * 4));
    CUDA_OK(cudaMemset(d, 0, (size_t)n * 4)); /* compute-sanitizer initcheck */
    th = fusedrope_tensor_sbhd(h, FUSEDROPE_FLOAT32, 4, 1, 2, 64);
    th2 = fusedrope_tensor_sbhd(h2, FUSEDROPE_FLOAT32, 4, 1, 2, 64);
    td = fusedrope_tensor_sbhd(d, FUSEDROPE_FLOAT32, 4, 1, 2, 64);
    td2 = fusedrope_tensor_sbhd(d2, FUSEDROPE_FLOAT32, 4, 1, 2, 64);

    ck_assert_int_eq(fusedrope_forward(cpu, FUSEDROPE_NEOX, NULL, &td, &td2, NULL),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_int_eq(fusedrope_forward(cpu, FUSEDROPE_NEOX, NULL, &th, &td2, NULL),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_int_eq(fusedrope_forward(gpu, FUSEDROPE_NEOX, NULL, &th, &th2, NULL),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_int_eq(fusedrope_forward(gpu, FUSEDROPE_NEOX, NULL, &td, &th2, NULL),
                     FUSEDROPE_ERR_INVALID);
    ck_assert_int_eq(fusedrope_backward_qk(gpu, FUSEDROPE_NEOX, NULL, &td, &td, &th, &th, NULL),
                     FUSEDROPE_ERR_INVALID);
    /* position arrays too */
    fusedrope_positions_init(&pos);
    pos.ids = ids;
    ck_assert_int_eq(fusedrope_forward(gpu, FUSEDROPE_NEOX, &pos, &td, &td2, NULL),
                     FUSEDROPE_ERR_INVALID);
    FR_OK(fusedrope_forward(cpu, FUSEDROPE_NEOX, &pos, &th, &th2, NULL));
    FR_OK(fusedrope_forward(gpu, FUSEDROPE_NEOX, NULL, &td, &td2, NULL));
    FR_OK(fusedrope_cache_check(gpu, NULL));

    cudaFree(d);
    cudaFree(d2);
    free(h);
    free(h2);
    fusedrope_cache_destroy(cpu);
    fusedrope_cache_destroy(gpu);
}
END_TEST

/* ------------------------------------------- threads, streams, repeatability */

#define NTHREADS 8

typedef struct {
    const fusedrope_cache *cache;
    const unsigned char *q, *k;
    const int64_t *d_ids;
    int64_t s, b, hq, hk, d;
    unsigned char *q_out, *k_out; /* host results */
    int reps;
    fusedrope_status st;
    cudaError_t err;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    const size_t nq = (size_t)(a->s * a->b * a->hq * a->d) * 2;
    const size_t nk = (size_t)(a->s * a->b * a->hk * a->d) * 2;
    cudaStream_t st = NULL;
    void *dq = NULL, *dk = NULL;
    fusedrope_positions pos;
    fusedrope_tensor tq, tk;

    a->st = FUSEDROPE_OK;
    if ((a->err = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) != cudaSuccess ||
        (a->err = cudaMalloc(&dq, nq)) != cudaSuccess ||
        (a->err = cudaMalloc(&dk, nk)) != cudaSuccess)
        goto out;
    fusedrope_positions_init(&pos);
    pos.ids = a->d_ids;
    tq = fusedrope_tensor_sbhd(dq, FUSEDROPE_BFLOAT16, a->s, a->b, a->hq, a->d);
    tk = fusedrope_tensor_sbhd(dk, FUSEDROPE_BFLOAT16, a->s, a->b, a->hk, a->d);
    for (int rep = 0; rep < a->reps; rep++) {
        /* in place, so each repetition starts from the input again */
        if ((a->err = cudaMemcpyAsync(dq, a->q, nq, cudaMemcpyHostToDevice, st)) != cudaSuccess ||
            (a->err = cudaMemcpyAsync(dk, a->k, nk, cudaMemcpyHostToDevice, st)) != cudaSuccess)
            goto out;
        a->st = fusedrope_forward_qk(a->cache, FUSEDROPE_INTERLEAVED, &pos, &tq, &tq, &tk, &tk, st);
        if (a->st != FUSEDROPE_OK)
            goto out;
        a->st = fusedrope_cache_check(a->cache, st);
        if (a->st != FUSEDROPE_OK)
            goto out;
        if ((a->err = cudaMemcpyAsync(a->q_out, dq, nq, cudaMemcpyDeviceToHost, st)) !=
                cudaSuccess ||
            (a->err = cudaMemcpyAsync(a->k_out, dk, nk, cudaMemcpyDeviceToHost, st)) !=
                cudaSuccess ||
            (a->err = cudaStreamSynchronize(st)) != cudaSuccess)
            goto out;
    }
out:
    if (dq)
        cudaFree(dq);
    if (dk)
        cudaFree(dk);
    if (st)
        cudaStreamDestroy(st);
    return NULL;
}

START_TEST(test_threads)
{
    const int64_t S = 256, B = 2, HQ = 8, HK = 2, D = 128;
    const size_t nq = (size_t)(S * B * HQ * D) * 2, nk = (size_t)(S * B * HK * D) * 2;
    fusedrope_cache *cache = make_cache(FUSEDROPE_ROPE_LLAMA3, 128, 4096, FUSEDROPE_DEVICE_CUDA);
    unsigned char *q = malloc(nq), *k = malloc(nk);
    int64_t *ids = malloc((size_t)(S * B) * sizeof(int64_t));
    void *d_ids;
    worker_arg ref, args[NTHREADS];
    pthread_t th[NTHREADS];
    tu_rng r;

    tu_rng_init(&r, 4242);
    fill_random(q, FUSEDROPE_BFLOAT16, nq / 2, &r);
    fill_random(k, FUSEDROPE_BFLOAT16, nk / 2, &r);
    for (int64_t i = 0; i < S * B; i++)
        ids[i] = tu_int(&r, 0, 4095);
    d_ids = to_device(ids, (size_t)(S * B) * sizeof(int64_t));

    /* one thread, twice: repeatable to the bit */
    memset(&ref, 0, sizeof ref);
    ref.cache = cache;
    ref.q = q;
    ref.k = k;
    ref.d_ids = d_ids;
    ref.s = S;
    ref.b = B;
    ref.hq = HQ;
    ref.hk = HK;
    ref.d = D;
    ref.reps = 1;
    ref.q_out = malloc(nq);
    ref.k_out = malloc(nk);
    worker(&ref);
    ck_assert_msg(ref.err == cudaSuccess, "%s", cudaGetErrorString(ref.err));
    FR_OK(ref.st);
    {
        worker_arg again = ref;
        again.q_out = malloc(nq);
        again.k_out = malloc(nk);
        worker(&again);
        FR_OK(again.st);
        ck_assert(memcmp(again.q_out, ref.q_out, nq) == 0);
        ck_assert(memcmp(again.k_out, ref.k_out, nk) == 0);
        free(again.q_out);
        free(again.k_out);
    }

    for (int t = 0; t < NTHREADS; t++) {
        args[t] = ref;
        args[t].reps = 4;
        args[t].q_out = malloc(nq);
        args[t].k_out = malloc(nk);
        ck_assert_int_eq(pthread_create(&th[t], NULL, worker, &args[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        ck_assert_int_eq(pthread_join(th[t], NULL), 0);
    for (int t = 0; t < NTHREADS; t++) {
        ck_assert_msg(args[t].err == cudaSuccess, "thread %d: %s", t,
                      cudaGetErrorString(args[t].err));
        ck_assert_msg(args[t].st == FUSEDROPE_OK, "thread %d: %s", t,
                      fusedrope_status_string(args[t].st));
        ck_assert_msg(memcmp(args[t].q_out, ref.q_out, nq) == 0, "thread %d: q differs", t);
        ck_assert_msg(memcmp(args[t].k_out, ref.k_out, nk) == 0, "thread %d: k differs", t);
        free(args[t].q_out);
        free(args[t].k_out);
    }

    /* and the CPU agrees */
    {
        fusedrope_cache *cpu = make_cache(FUSEDROPE_ROPE_LLAMA3, 128, 4096, FUSEDROPE_DEVICE_CPU);
        unsigned char *qc = malloc(nq), *kc = malloc(nk);
        fusedrope_positions pos;
        fusedrope_tensor tq, tk;
        memcpy(qc, q, nq);
        memcpy(kc, k, nk);
        fusedrope_positions_init(&pos);
        pos.ids = ids;
        tq = fusedrope_tensor_sbhd(qc, FUSEDROPE_BFLOAT16, S, B, HQ, D);
        tk = fusedrope_tensor_sbhd(kc, FUSEDROPE_BFLOAT16, S, B, HK, D);
        FR_OK(fusedrope_forward_qk(cpu, FUSEDROPE_INTERLEAVED, &pos, &tq, &tq, &tk, &tk, NULL));
        ck_assert(memcmp(qc, ref.q_out, nq) == 0);
        ck_assert(memcmp(kc, ref.k_out, nk) == 0);
        free(qc);
        free(kc);
        fusedrope_cache_destroy(cpu);
    }

    free(ref.q_out);
    free(ref.k_out);
    cudaFree(d_ids);
    free(ids);
    free(q);
    free(k);
    fusedrope_cache_destroy(cache);
}
END_TEST

/* ------------------------------------------------------- device ordinal */

/* A cache belongs to the device current at its creation.  forward and
 * backward with another device current are refused, naming both devices,
 * and write nothing; copy_table, cache_check and destroy work from any
 * device and leave the caller's current device as it was.  With one device
 * only the last part can be checked. */
START_TEST(test_cache_device_ordinal)
{
    const int64_t n = 2 * 64;
    int ndev = 0, cur = -1;
    float *c1 = malloc(16 * 32 * 4), *s1 = malloc(16 * 32 * 4);
    float *c2 = malloc(16 * 32 * 4), *s2 = malloc(16 * 32 * 4);
    fusedrope_cache *on0, *cpu = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CPU);
    ck_assert(c1 && s1 && c2 && s2);
    CUDA_OK(cudaGetDeviceCount(&ndev));
    CUDA_OK(cudaSetDevice(0));
    on0 = make_cache(FUSEDROPE_ROPE_DEFAULT, 64, 16, FUSEDROPE_DEVICE_CUDA);
    FR_OK(fusedrope_cache_copy_table(cpu, c1, s1));

    if (ndev >= 2) {
        uint16_t poison[2 * 64];
        void *dx, *d1;
        float *rstd;
        fusedrope_tensor t, t1;
        fusedrope_norm nm;
        const char *want = "created on CUDA device 0 but device 1 is current";
        /* the cache's device's memory, called with device 1 current: every
         * call, plain and norm, refuses before it launches */
        CUDA_OK(cudaMalloc(&dx, (size_t)n * 2));
        CUDA_OK(cudaMemset(dx, 0x5a, (size_t)n * 2));
        CUDA_OK(cudaMalloc((void **)&rstd, 2 * sizeof(float)));
        CUDA_OK(cudaMemset(rstd, 0, 2 * sizeof(float)));
        t = fusedrope_tensor_sbhd(dx, FUSEDROPE_BFLOAT16, 2, 1, 1, 64);
        fusedrope_norm_init(&nm);
        nm.q_rstd = rstd;
        CUDA_OK(cudaSetDevice(1));
        ck_assert_int_eq(fusedrope_forward(on0, FUSEDROPE_NEOX, NULL, &t, &t, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(), want) != NULL, "%s", fusedrope_last_error());
        ck_assert_int_eq(fusedrope_backward(on0, FUSEDROPE_NEOX, NULL, &t, &t, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_int_eq(fusedrope_norm_forward_qk(on0, FUSEDROPE_NEOX, NULL, &nm, &t, &t, NULL,
                                                   NULL, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(), want) != NULL, "%s", fusedrope_last_error());
        ck_assert_int_eq(fusedrope_norm_backward_qk(on0, FUSEDROPE_NEOX, NULL, &nm, &t, &t, &t,
                                                    NULL, NULL, NULL, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(), want) != NULL, "%s", fusedrope_last_error());
        /* device 1's memory with the cache's device current: refused as
         * another GPU's memory */
        CUDA_OK(cudaMalloc(&d1, (size_t)n * 2));
        t1 = fusedrope_tensor_sbhd(d1, FUSEDROPE_BFLOAT16, 2, 1, 1, 64);
        CUDA_OK(cudaSetDevice(0));
        ck_assert_int_eq(fusedrope_forward(on0, FUSEDROPE_NEOX, NULL, &t1, &t1, NULL),
                         FUSEDROPE_ERR_INVALID);
        ck_assert_msg(strstr(fusedrope_last_error(),
                             "memory of CUDA device 1 but the cache is on CUDA device 0") != NULL,
                      "%s", fusedrope_last_error());
        CUDA_OK(cudaMemcpy(poison, dx, sizeof poison, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 2 * 64; i++)
            ck_assert_uint_eq(poison[i], 0x5a5a);
        cudaFree(dx);
        cudaFree(rstd);
        CUDA_OK(cudaSetDevice(1));
        cudaFree(d1);
    }

    /* from device 1 (or 0): the table comes back, the check waits on device
     * 0's default stream, and the caller's device is unchanged after each */
    CUDA_OK(cudaSetDevice(ndev - 1));
    memset(c2, 0, 16 * 32 * 4);
    memset(s2, 0, 16 * 32 * 4);
    FR_OK(fusedrope_cache_copy_table(on0, c2, s2));
    ck_assert(memcmp(c1, c2, 16 * 32 * 4) == 0 && memcmp(s1, s2, 16 * 32 * 4) == 0);
    CUDA_OK(cudaGetDevice(&cur));
    ck_assert_int_eq(cur, ndev - 1);
    FR_OK(fusedrope_cache_check(on0, NULL));
    CUDA_OK(cudaGetDevice(&cur));
    ck_assert_int_eq(cur, ndev - 1);
    fusedrope_cache_destroy(on0);
    CUDA_OK(cudaGetDevice(&cur));
    ck_assert_int_eq(cur, ndev - 1);
    CUDA_OK(cudaSetDevice(0));
    fusedrope_cache_destroy(cpu);
    free(c1);
    free(s1);
    free(c2);
    free(s2);
}
END_TEST

/* ------------------------------------------------------------ graph replay */

#define GRAPH_REPLAYS 1000
#define GRAPH_CHECK_EVERY 100

/* One device tensor of the graph test: random input bytes, or an output. */
typedef struct {
    void *dev;
    size_t bytes;
    unsigned char *host; /* input: its bytes; output: the direct call's result */
} gbuf;

static void gbuf_input(gbuf *g, size_t bytes, tu_rng *r)
{
    g->bytes = bytes;
    g->host = malloc(bytes);
    ck_assert(g->host != NULL);
    fill_random(g->host, FUSEDROPE_BFLOAT16, bytes / 2, r);
    CUDA_OK(cudaMalloc(&g->dev, bytes));
    CUDA_OK(cudaMemcpy(g->dev, g->host, bytes, cudaMemcpyHostToDevice));
}

static void gbuf_output(gbuf *g, size_t bytes)
{
    g->bytes = bytes;
    g->host = malloc(bytes);
    ck_assert(g->host != NULL);
    CUDA_OK(cudaMalloc(&g->dev, bytes));
    CUDA_OK(cudaMemset(g->dev, 0xa5, bytes));
}

static void gbuf_free(gbuf *g)
{
    cudaFree(g->dev);
    free(g->host);
}

/* The n outputs o[] poisoned on stream st: what a graph leaves there, it wrote. */
static void gbuf_poison(gbuf *const *o, int n, cudaStream_t st)
{
    for (int i = 0; i < n; i++)
        CUDA_OK(cudaMemsetAsync(o[i]->dev, 0xa5, o[i]->bytes, st));
}

/* GRAPH_REPLAYS launches of exec on st; after every GRAPH_CHECK_EVERY-th,
 * each of the n outputs o[j] (named names[j]) must hold the direct calls'
 * bytes (o[j]->host), and is poisoned again, so that the next replays must
 * write every byte.  Returns with the stream synchronised. */
static void graph_replays_check(cudaGraphExec_t exec, cudaStream_t st, gbuf *const *o,
                                const char *const *names, int n)
{
    for (int rep = 1; rep <= GRAPH_REPLAYS; rep++) {
        CUDA_OK(cudaGraphLaunch(exec, st));
        if (rep % GRAPH_CHECK_EVERY != 0)
            continue;
        CUDA_OK(cudaStreamSynchronize(st));
        for (int j = 0; j < n; j++) {
            unsigned char *got = malloc(o[j]->bytes);
            ck_assert(got != NULL);
            CUDA_OK(cudaMemcpy(got, o[j]->dev, o[j]->bytes, cudaMemcpyDeviceToHost));
            if (memcmp(got, o[j]->host, o[j]->bytes) != 0) {
                size_t k = 0;
                while (got[k] == o[j]->host[k])
                    k++;
                free(got);
                ck_abort_msg("replay %d: %s differs from the direct call's at byte %zu", rep,
                             names[j], k);
            }
            free(got);
        }
        gbuf_poison(o, n, st);
    }
    CUDA_OK(cudaStreamSynchronize(st));
}

/* The graph's three calls on the stream: forward x -> y, backward dy -> dx,
 * forward_qk (q, k) -> (qo, ko), all out of place, bf16 at b[] (x, y, dy,
 * dx, q, k, qo, ko: pointers on the cache's device) and the positions pos.
 * Returns the first failure's status, and its message in err (the calls
 * may be under capture, where the test must not stop before the capture
 * ends). */
static fusedrope_status graph_calls(const fusedrope_cache *c, const fusedrope_positions *pos,
                                    void *const *b, int64_t S, int64_t B, int64_t HQ, int64_t HK,
                                    int64_t D, cudaStream_t st, char *err, size_t nerr)
{
    const fusedrope_dtype dt = FUSEDROPE_BFLOAT16;
    fusedrope_tensor x = fusedrope_tensor_sbhd(b[0], dt, S, B, HQ, D);
    fusedrope_tensor y = fusedrope_tensor_sbhd(b[1], dt, S, B, HQ, D);
    fusedrope_tensor dy = fusedrope_tensor_sbhd(b[2], dt, S, B, HQ, D);
    fusedrope_tensor dx = fusedrope_tensor_sbhd(b[3], dt, S, B, HQ, D);
    fusedrope_tensor q = fusedrope_tensor_sbhd(b[4], dt, S, B, HQ, D);
    fusedrope_tensor k = fusedrope_tensor_sbhd(b[5], dt, S, B, HK, D);
    fusedrope_tensor qo = fusedrope_tensor_sbhd(b[6], dt, S, B, HQ, D);
    fusedrope_tensor ko = fusedrope_tensor_sbhd(b[7], dt, S, B, HK, D);
    fusedrope_status s = fusedrope_forward(c, FUSEDROPE_NEOX, pos, &x, &y, st);
    const char *which = "fusedrope_forward";
    if (s == FUSEDROPE_OK) {
        s = fusedrope_backward(c, FUSEDROPE_NEOX, pos, &dy, &dx, st);
        which = "fusedrope_backward";
    }
    if (s == FUSEDROPE_OK) {
        s = fusedrope_forward_qk(c, FUSEDROPE_NEOX, pos, &q, &qo, &k, &ko, st);
        which = "fusedrope_forward_qk";
    }
    if (s != FUSEDROPE_OK)
        snprintf(err, nerr, "%s: %s (%s)", which, fusedrope_status_string(s),
                 fusedrope_last_error());
    return s;
}

/* cudaGetDevice and cudaSetDevice as the library sees them (the link's
 * --wrap, tests/cuda.mk): the real calls, except that while fake_current is
 * >= 0 that device is reported current, and a cudaSetDevice to it fails as
 * for a device that has gone.  One GPU is enough to make the library leave
 * a device it cannot give back. */
cudaError_t __real_cudaGetDevice(int *device);
cudaError_t __real_cudaSetDevice(int device);
static int fake_current = -1;
cudaError_t __wrap_cudaGetDevice(int *device);
cudaError_t __wrap_cudaSetDevice(int device);
cudaError_t __wrap_cudaGetDevice(int *device)
{
    if (fake_current < 0)
        return __real_cudaGetDevice(device);
    *device = fake_current;
    return cudaSuccess;
}
cudaError_t __wrap_cudaSetDevice(int device)
{
    if (fake_current >= 0 && device == fake_current)
        return cudaErrorInvalidDevice;
    return __real_cudaSetDevice(device);
}

/* copy_table and cache_check that cannot make the caller's device current
 * again fail with FUSEDROPE_ERR_CUDA, naming it, rather than leave the
 * thread on the cache's device unannounced; the check then leaves a raised
 * flag for the next check; destroy, with no status, frees the cache. */
START_TEST(test_device_restore_fails)
{
    const int64_t R = 64, S = 4, D = 64, n = S * D;
    fusedrope_cache *gpu = make_cache(FUSEDROPE_ROPE_DEFAULT, (int)R, 16, FUSEDROPE_DEVICE_CUDA);
    float *c = malloc(16 * 32 * 4), *sn = malloc(16 * 32 * 4);
    int64_t ids[4] = { 0, 1, 99, 3 }; /* 99: past the 16 rows */
    void *dx, *dids;
    fusedrope_positions pd;
    fusedrope_tensor t;
    const char *want = "making device 7 current again (cudaSetDevice) failed";

    ck_assert(c && sn);
    CUDA_OK(cudaMalloc(&dx, (size_t)n * 2));
    CUDA_OK(cudaMemset(dx, 0, (size_t)n * 2));
    CUDA_OK(cudaMalloc(&dids, sizeof ids));
    CUDA_OK(cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice));
    fusedrope_positions_init(&pd);
    pd.ids = dids;
    t = fusedrope_tensor_sbhd(dx, FUSEDROPE_BFLOAT16, S, 1, 1, D);
    FR_OK(fusedrope_forward(gpu, FUSEDROPE_NEOX, &pd, &t, &t, NULL)); /* raises the flag */

    fake_current = 7;
    ck_assert_int_eq(fusedrope_cache_copy_table(gpu, c, sn), FUSEDROPE_ERR_CUDA);
    ck_assert_msg(strstr(fusedrope_last_error(), want) != NULL, "%s", fusedrope_last_error());
    ck_assert_int_eq(fusedrope_cache_check(gpu, NULL), FUSEDROPE_ERR_CUDA);
    ck_assert_msg(strstr(fusedrope_last_error(), want) != NULL, "%s", fusedrope_last_error());
    fake_current = -1;
    CUDA_OK(cudaSetDevice(0));
    ck_assert_int_eq(fusedrope_cache_check(gpu, NULL), FUSEDROPE_ERR_RANGE); /* kept */
    FR_OK(fusedrope_cache_check(gpu, NULL));
    FR_OK(fusedrope_cache_copy_table(gpu, c, sn));
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);

    fake_current = 7;
    fusedrope_cache_destroy(gpu);
    fake_current = -1;
    CUDA_OK(cudaSetDevice(0));
    cudaFree(dx);
    cudaFree(dids);
    free(c);
    free(sn);
}
END_TEST

/* A graph test's calls (graph_calls, norm_graph_calls): on cache c at
 * positions pos, the tensors' pointers b[], the shape, the stream; the
 * first failure's message in err. */
typedef fusedrope_status (*graph_calls_fn)(const fusedrope_cache *c, const fusedrope_positions *pos,
                                           void *const *b, int64_t S, int64_t B, int64_t HQ,
                                           int64_t HK, int64_t D, cudaStream_t st, char *err,
                                           size_t nerr);

/* The graph tests' direct calls: run on gpu at dpos over the buffers b[0
 * .. nb) (inputs with their host bytes, outputs, the n outputs also in o[],
 * named names[]), each output's bytes copied to its host side; the same
 * calls on cpu at hpos over host copies must give the same bytes. */
static void direct_calls_match_cpu(graph_calls_fn calls, const fusedrope_cache *gpu,
                                   const fusedrope_cache *cpu, const fusedrope_positions *dpos,
                                   const fusedrope_positions *hpos, gbuf *b, int nb,
                                   gbuf *const *o, const char *const *names, int n,
                                   const int64_t *shape, cudaStream_t st)
{
    void *dev[16], *host[16];
    char err[1024] = "";
    fusedrope_status s;
    ck_assert(nb <= 16);
    for (int i = 0; i < nb; i++) {
        dev[i] = b[i].dev;
        host[i] = b[i].host;
    }
    s = calls(gpu, dpos, dev, shape[0], shape[1], shape[2], shape[3], shape[4], st, err,
              sizeof err);
    ck_assert_msg(s == FUSEDROPE_OK, "direct calls: %s", err);
    CUDA_OK(cudaStreamSynchronize(st));
    for (int j = 0; j < n; j++)
        CUDA_OK(cudaMemcpy(o[j]->host, o[j]->dev, o[j]->bytes, cudaMemcpyDeviceToHost));
    /* the CPU's outputs in buffers of their own (the host sides keep the GPU's) */
    for (int j = 0; j < n; j++) {
        host[o[j] - b] = malloc(o[j]->bytes);
        ck_assert(host[o[j] - b] != NULL);
    }
    s = calls(cpu, hpos, host, shape[0], shape[1], shape[2], shape[3], shape[4], NULL, err,
              sizeof err);
    ck_assert_msg(s == FUSEDROPE_OK, "CPU calls: %s", err);
    for (int j = 0; j < n; j++) {
        ck_assert_msg(memcmp(host[o[j] - b], o[j]->host, o[j]->bytes) == 0,
                      "%s: GPU and CPU differ", names[j]);
        free(host[o[j] - b]);
    }
}

/* The calls captured on st into a graph and instantiated, the n outputs
 * o[] poisoned first, so that what a replay leaves there it wrote. */
static cudaGraphExec_t graph_capture(graph_calls_fn calls, const fusedrope_cache *gpu,
                                     const fusedrope_positions *pos, gbuf *b, int nb,
                                     gbuf *const *o, int n, const int64_t *shape, cudaStream_t st)
{
    void *dev[16];
    char err[1024] = "";
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t cerr;
    fusedrope_status s;
    ck_assert(nb <= 16);
    for (int i = 0; i < nb; i++)
        dev[i] = b[i].dev;
    gbuf_poison(o, n, st);
    CUDA_OK(cudaStreamSynchronize(st));
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    s = calls(gpu, pos, dev, shape[0], shape[1], shape[2], shape[3], shape[4], st, err,
              sizeof err);
    cerr = cudaStreamEndCapture(st, &graph); /* ended whatever happened inside */
    ck_assert_msg(s == FUSEDROPE_OK, "under capture: %s", err);
    ck_assert_msg(cerr == cudaSuccess, "cudaStreamEndCapture: %s", cudaGetErrorString(cerr));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
    return exec;
}

/*
 * forward, backward and forward_qk (bf16, out of place, 384 tokens, device
 * ids, a table cache) captured on a non-blocking stream into one CUDA graph
 * and replayed 1000 times: the launcher must record nothing that a replay
 * cannot repeat (no host-side state between its calls, no synchronisation
 * in capture), so every replay writes the direct calls' bytes.  The outputs
 * are poisoned after each check, so each batch of 100 replays must write
 * them again.  The positions' range word is a device word (range_status),
 * which needs no host sync and must stay 0: every id is inside the table.
 * The direct calls themselves must match the CPU backend.  capture_first:
 * the capture comes before the direct calls (test_capture_first).
 */
static void graph_replay_case(int capture_first)
{
    const int64_t S = 192, B = 2, HQ = 8, HK = 2, D = 128, T = S * B;
    const int64_t shape[5] = { S, B, HQ, HK, D };
    const size_t nq = (size_t)(T * HQ * D) * 2, nk = (size_t)(T * HK * D) * 2;
    fusedrope_cache *gpu = make_cache(FUSEDROPE_ROPE_LLAMA3, 128, 4096, FUSEDROPE_DEVICE_CUDA);
    fusedrope_cache *cpu = make_cache(FUSEDROPE_ROPE_LLAMA3, 128, 4096, FUSEDROPE_DEVICE_CPU);
    int64_t *ids = malloc((size_t)T * sizeof *ids);
    /* b[]: x, y, dy, dx, q, k, q out, k out; outs: the outputs among them */
    static const int outs[4] = { 1, 3, 6, 7 };
    static const char *const out_names[4] = { "forward's y", "backward's dx",
                                              "forward_qk's q out", "forward_qk's k out" };
    gbuf b[8], *ob[4];
    void *d_ids;
    int32_t *dword, word = -1;
    fusedrope_positions pos, ph;
    cudaStream_t st;
    cudaGraphExec_t exec;
    tu_rng r;

    ck_assert(ids != NULL);
    tu_rng_init(&r, 9191);
    memset(b, 0, sizeof b);
    gbuf_input(&b[0], nq, &r); /* x */
    gbuf_output(&b[1], nq);    /* y */
    gbuf_input(&b[2], nq, &r); /* dy */
    gbuf_output(&b[3], nq);    /* dx */
    gbuf_input(&b[4], nq, &r); /* q */
    gbuf_input(&b[5], nk, &r); /* k */
    gbuf_output(&b[6], nq);    /* q out */
    gbuf_output(&b[7], nk);    /* k out */
    for (int j = 0; j < 4; j++)
        ob[j] = &b[outs[j]];
    for (int64_t i = 0; i < T; i++)
        ids[i] = tu_int(&r, 0, 4095);
    ids[0] = 4095; /* the table's last row */
    d_ids = to_device(ids, (size_t)T * sizeof *ids);
    CUDA_OK(cudaMalloc((void **)&dword, sizeof *dword));
    CUDA_OK(cudaMemset(dword, 0, sizeof *dword));
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaDeviceSynchronize()); /* the copies and memsets above, before the stream runs */
    fusedrope_positions_init(&pos);
    pos.ids = d_ids;
    pos.range_status = dword;
    fusedrope_positions_init(&ph);
    ph.ids = ids;

    if (capture_first)
        exec = graph_capture(graph_calls, gpu, &pos, b, 8, ob, 4, shape, st);
    /* the direct calls: their bytes are the reference, and the CPU
     * backend's (otherwise they also load the kernels, so that the capture
     * records only launches) */
    direct_calls_match_cpu(graph_calls, gpu, cpu, &pos, &ph, b, 8, ob, out_names, 4, shape, st);
    CUDA_OK(cudaMemcpy(&word, dword, sizeof word, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(word, 0);
    FR_OK(fusedrope_cache_check(gpu, st));

    if (!capture_first)
        exec = graph_capture(graph_calls, gpu, &pos, b, 8, ob, 4, shape, st);
    graph_replays_check(exec, st, ob, out_names, 4);
    CUDA_OK(cudaMemcpy(&word, dword, sizeof word, cudaMemcpyDeviceToHost));
    ck_assert_msg(word == 0, "range_status raised (%d) by in-table ids", word);
    FR_OK(fusedrope_cache_check(gpu, st)); /* the cache's own flag: never given, never raised */

    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaStreamDestroy(st));
    for (int i = 0; i < 8; i++)
        gbuf_free(&b[i]);
    cudaFree(dword);
    cudaFree(d_ids);
    free(ids);
    fusedrope_cache_destroy(gpu);
    fusedrope_cache_destroy(cpu);
}

START_TEST(test_graph_replay)
{
    graph_replay_case(0);
}
END_TEST

/* The norm graph test's two calls on the stream: fusedrope_norm_forward_qk
 * (q, k) -> (qo, ko) with rstd, then fusedrope_norm_backward_qk from the
 * saved inputs, (dq, dk) -> (dxq, dxk) with both weights' gradients, Qwen3's
 * rule (weight w, the LLAMA rounding) in bf16 at the positions pos.  b[]:
 * q, k, dq, dk, wq, wk, then the outputs qo, ko, rstd q, rstd k, dxq, dxk,
 * dwq, dwk; pointers on the cache's device.  Returns the first failure's
 * status, its message in err. */
static fusedrope_status norm_graph_calls(const fusedrope_cache *c, const fusedrope_positions *pos,
                                         void *const *b, int64_t S, int64_t B, int64_t HQ,
                                         int64_t HK, int64_t D, cudaStream_t st, char *err,
                                         size_t nerr)
{
    const fusedrope_dtype dt = FUSEDROPE_BFLOAT16;
    fusedrope_tensor q = fusedrope_tensor_sbhd(b[0], dt, S, B, HQ, D);
    fusedrope_tensor k = fusedrope_tensor_sbhd(b[1], dt, S, B, HK, D);
    fusedrope_tensor dq = fusedrope_tensor_sbhd(b[2], dt, S, B, HQ, D);
    fusedrope_tensor dk = fusedrope_tensor_sbhd(b[3], dt, S, B, HK, D);
    fusedrope_tensor qo = fusedrope_tensor_sbhd(b[6], dt, S, B, HQ, D);
    fusedrope_tensor ko = fusedrope_tensor_sbhd(b[7], dt, S, B, HK, D);
    fusedrope_tensor dxq = fusedrope_tensor_sbhd(b[10], dt, S, B, HQ, D);
    fusedrope_tensor dxk = fusedrope_tensor_sbhd(b[11], dt, S, B, HK, D);
    fusedrope_norm nm;
    fusedrope_status s;
    const char *which = "fusedrope_norm_forward_qk";
    fusedrope_norm_init(&nm);
    nm.weight = FUSEDROPE_NORM_WEIGHT;
    nm.rounding = FUSEDROPE_NORM_ROUND_LLAMA;
    nm.weight_dtype = dt;
    nm.q_weight = b[4];
    nm.k_weight = b[5];
    nm.q_rstd = b[8];
    nm.k_rstd = b[9];
    s = fusedrope_norm_forward_qk(c, FUSEDROPE_NEOX, pos, &nm, &q, &qo, &k, &ko, st);
    if (s == FUSEDROPE_OK) {
        nm.dq_weight = b[12];
        nm.dk_weight = b[13];
        s = fusedrope_norm_backward_qk(c, FUSEDROPE_NEOX, pos, &nm, &q, &dq, &dxq, &k, &dk, &dxk,
                                       st);
        which = "fusedrope_norm_backward_qk";
    }
    if (s != FUSEDROPE_OK)
        snprintf(err, nerr, "%s: %s (%s)", which, fusedrope_status_string(s),
                 fusedrope_last_error());
    return s;
}

/* The fused norm's forward and backward (whose dw takes a scratch
 * allocation and two kernels a call) captured in a CUDA graph, as
 * test_graph_replay: the direct calls' bytes are the CPU backend's, and
 * 1000 replays, their outputs poisoned between checks, give them;
 * capture_first as there. */
static void norm_graph_replay_case(int capture_first)
{
    const int64_t S = 160, B = 2, HQ = 8, HK = 2, D = 128, T = S * B;
    const int64_t shape[5] = { S, B, HQ, HK, D };
    const size_t nq = (size_t)(T * HQ * D) * 2, nk = (size_t)(T * HK * D) * 2;
    static const char *const names[8] = { "forward's q out",    "forward's k out",
                                          "q's rstd",           "k's rstd",
                                          "backward's dq in",   "backward's dk in",
                                          "q's weight gradient", "k's weight gradient" };
    /* b[]: q, k, dq, dk, wq, wk (inputs), then the 8 outputs */
    const size_t bytes[14] = { nq, nk, nq, nk, (size_t)D * 2, (size_t)D * 2, nq, nk,
                               (size_t)(T * HQ) * 4, (size_t)(T * HK) * 4, nq, nk,
                               (size_t)D * 4, (size_t)D * 4 };
    fusedrope_cache *gpu = make_cache(FUSEDROPE_ROPE_DEFAULT, 128, 1024, FUSEDROPE_DEVICE_CUDA);
    fusedrope_cache *cpu = make_cache(FUSEDROPE_ROPE_DEFAULT, 128, 1024, FUSEDROPE_DEVICE_CPU);
    int64_t *ids = malloc((size_t)T * sizeof *ids);
    gbuf b[14], *ob[8];
    void *d_ids;
    fusedrope_positions pos, ph;
    cudaStream_t st;
    cudaGraphExec_t exec;
    tu_rng r;

    ck_assert(ids != NULL);
    tu_rng_init(&r, 9292);
    memset(b, 0, sizeof b);
    for (int i = 0; i < 14; i++) {
        if (i < 6)
            gbuf_input(&b[i], bytes[i], &r);
        else
            gbuf_output(&b[i], bytes[i]);
    }
    for (int j = 0; j < 8; j++)
        ob[j] = &b[6 + j];
    for (int64_t i = 0; i < T; i++)
        ids[i] = tu_int(&r, 0, 1023);
    d_ids = to_device(ids, (size_t)T * sizeof *ids);
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaDeviceSynchronize());
    fusedrope_positions_init(&pos);
    pos.ids = d_ids;
    fusedrope_positions_init(&ph);
    ph.ids = ids;

    if (capture_first)
        exec = graph_capture(norm_graph_calls, gpu, &pos, b, 14, ob, 8, shape, st);
    direct_calls_match_cpu(norm_graph_calls, gpu, cpu, &pos, &ph, b, 14, ob, names, 8, shape, st);
    FR_OK(fusedrope_cache_check(gpu, st));
    if (!capture_first)
        exec = graph_capture(norm_graph_calls, gpu, &pos, b, 14, ob, 8, shape, st);
    graph_replays_check(exec, st, ob, names, 8);
    FR_OK(fusedrope_cache_check(gpu, st));

    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaStreamDestroy(st));
    for (int i = 0; i < 14; i++)
        gbuf_free(&b[i]);
    cudaFree(d_ids);
    free(ids);
    fusedrope_cache_destroy(gpu);
    fusedrope_cache_destroy(cpu);
}

START_TEST(test_norm_graph_replay)
{
    norm_graph_replay_case(0);
}
END_TEST

/*
 * An engine may capture a call before any call has run in its process (a
 * warm-up inside the capture): the first launch of each kernel then loads
 * it (CUDA's lazy loading) and the launcher sizes its grid
 * (cudaOccupancyMaxActiveBlocksPerMultiprocessor) under capture, which
 * must record launches only.  This process has run every kernel already
 * (CK_NOFORK), so the check runs in a fresh one: this program again, with
 * FUSEDROPE_TEST_CAPTURE_FIRST=1, whose suite is test_capture_first_here
 * alone (plain and norm calls captured first, then as their graph tests).
 */
START_TEST(test_capture_first_here)
{
    graph_replay_case(1);
    norm_graph_replay_case(1);
}
END_TEST

extern char **environ;

/* The fresh process's time: its two graph tests take seconds. */
enum { CAPTURE_FIRST_LIMIT_S = 300 };

START_TEST(test_capture_first)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    char *argv[2] = { self, NULL };
    char **envp;
    size_t ne = 0, k = 0;
    pid_t pid, done = 0;
    int status = 0;
    ck_assert_msg(n > 0, "readlink /proc/self/exe failed");
    self[n] = 0;
    /* this environment without libcheck's log files (the child's runner
     * would write over this one's), with the child's switch */
    while (environ[ne])
        ne++;
    envp = malloc((ne + 2) * sizeof *envp);
    ck_assert(envp != NULL);
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "CK_", 3) != 0 || !strstr(environ[i], "_FILE_NAME="))
            envp[k++] = environ[i];
    envp[k++] = "FUSEDROPE_TEST_CAPTURE_FIRST=1";
    envp[k] = NULL;
    ck_assert_int_eq(posix_spawn(&pid, self, NULL, NULL, argv, envp), 0);
    free(envp);
    for (int t = 0; t < CAPTURE_FIRST_LIMIT_S * 10 && (done = waitpid(pid, &status, WNOHANG)) == 0;
         t++) {
        const struct timespec tenth = { 0, 100000000 };
        nanosleep(&tenth, NULL);
    }
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ck_abort_msg("the fresh process's captured-first calls did not end in %d s",
                     (int)CAPTURE_FIRST_LIMIT_S);
    }
    ck_assert_int_eq(done, pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the fresh process's captured-first calls failed (status %#x; its output above)",
                  (unsigned)status);
}
END_TEST

/* ------------------------------------------------ offsets past 2^31, 2^32 */

/*
 * A device tensor whose element offsets pass 2^31 and 2^32: token t of a
 * [3, 1, 2, 128] bf16 view starts t * (2^31 + 4096) elements in, so an
 * offset computed in 32 bits lands elsewhere (or faults) for tokens 1 and
 * 2.  One cudaMalloc of a little over 2^32 elements (8.6 GB) holds the
 * input view and an output view 1024 elements after it (the same token
 * lattice, heads apart: disjoint), and only their rows are written.  The
 * CUDA cache is the twin of a CPU one (same config), and each result must
 * be the CPU backend's on a compact host tensor at the same positions, to
 * the bit: NeoX out of place, then interleaved in place.  The 16 elements
 * after each output row must keep their poison.  Skipped, with a note,
 * where the device cannot give the 8.6 GB.  tests/test_bigindex.c does the
 * same for the OpenMP backend in sparse host mappings.
 */
START_TEST(test_offsets_past_2_32)
{
    enum { GS = 3, GH = 2, GD = 128, OUT_AT = 1024, GUARD_AFTER = 16 };
    const int64_t stride = ((int64_t)1 << 31) + 4096; /* a multiple of 16 bytes */
    const int64_t row = GH * GD;                         /* elements of one token */
    const int64_t nel = (GS - 1) * stride + OUT_AT + row + GUARD_AFTER;
    const size_t rb = (size_t)row * 2;
    const int64_t offset = 1000; /* positions 1000..1002 of a 4096-row table */
    fusedrope_cache *cpu = make_cache(FUSEDROPE_ROPE_DEFAULT, GD, 4096, FUSEDROPE_DEVICE_CPU);
    fusedrope_cache *gpu = make_cache(FUSEDROPE_ROPE_DEFAULT, GD, 4096, FUSEDROPE_DEVICE_CUDA);
    unsigned char x[GS * GH * GD * 2], y[GS * GH * GD * 2], got[(GH * GD + GUARD_AFTER) * 2];
    unsigned char *base = NULL;
    void *d_off = NULL;
    fusedrope_positions ph, pd;
    fusedrope_tensor hx, hy, dx, dy;
    cudaError_t err;
    tu_rng r;

    ck_assert((GS - 1) * stride > ((int64_t)1 << 32));
    err = cudaMalloc((void **)&base, (size_t)nel * 2);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        printf("test_offsets_past_2_32: cudaMalloc of %.2f GB failed (%s); not run\n",
               (double)nel * 2 / 1e9, cudaGetErrorString(err));
        fusedrope_cache_destroy(cpu);
        fusedrope_cache_destroy(gpu);
        return;
    }

    tu_rng_init(&r, 23232);
    fill_random(x, FUSEDROPE_BFLOAT16, (size_t)(GS * row), &r);
    for (int64_t t = 0; t < GS; t++) {
        unsigned char *at = base + (size_t)(t * stride) * 2;
        CUDA_OK(cudaMemcpy(at, x + (size_t)t * rb, rb, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(at + (size_t)OUT_AT * 2, 0xa5, rb + GUARD_AFTER * 2));
    }
    d_off = to_device(&offset, sizeof offset);

    fusedrope_positions_init(&ph);
    ph.offsets = &offset;
    pd = ph;
    pd.offsets = d_off;
    memset(&dx, 0, sizeof dx);
    dx.data = base;
    dx.dtype = FUSEDROPE_BFLOAT16;
    dx.seq_len = GS;
    dx.batch = 1;
    dx.heads = GH;
    dx.head_dim = GD;
    dx.stride_seq = stride;
    dx.stride_batch = 0; /* batch 1 */
    dx.stride_head = GD;
    dy = dx;
    dy.data = base + (size_t)OUT_AT * 2;
    hx = fusedrope_tensor_sbhd(x, FUSEDROPE_BFLOAT16, GS, 1, GH, GD);
    hy = fusedrope_tensor_sbhd(y, FUSEDROPE_BFLOAT16, GS, 1, GH, GD);

    /* NeoX, out of place */
    FR_OK(fusedrope_forward(cpu, FUSEDROPE_NEOX, &ph, &hx, &hy, NULL));
    FR_OK(fusedrope_forward(gpu, FUSEDROPE_NEOX, &pd, &dx, &dy, NULL));
    FR_OK(fusedrope_cache_check(gpu, NULL));
    for (int64_t t = 0; t < GS; t++) {
        CUDA_OK(cudaMemcpy(got, base + (size_t)(t * stride + OUT_AT) * 2, sizeof got,
                           cudaMemcpyDeviceToHost));
        ck_assert_msg(memcmp(got, y + (size_t)t * rb, rb) == 0,
                      "out of place: token %lld (element offset %lld) differs from the CPU's",
                      (long long)t, (long long)(t * stride + OUT_AT));
        for (size_t j = rb; j < sizeof got; j++)
            ck_assert_msg(got[j] == 0xa5, "out of place: token %lld: byte %zu after its row "
                          "written", (long long)t, j - rb);
    }

    /* interleaved, in place on the input rows */
    FR_OK(fusedrope_forward(cpu, FUSEDROPE_INTERLEAVED, &ph, &hx, &hx, NULL));
    FR_OK(fusedrope_forward(gpu, FUSEDROPE_INTERLEAVED, &pd, &dx, &dx, NULL));
    FR_OK(fusedrope_cache_check(gpu, NULL));
    for (int64_t t = 0; t < GS; t++) {
        CUDA_OK(cudaMemcpy(got, base + (size_t)(t * stride) * 2, rb, cudaMemcpyDeviceToHost));
        ck_assert_msg(memcmp(got, x + (size_t)t * rb, rb) == 0,
                      "in place: token %lld (element offset %lld) differs from the CPU's",
                      (long long)t, (long long)(t * stride));
    }

    cudaFree(d_off);
    cudaFree(base);
    fusedrope_cache_destroy(cpu);
    fusedrope_cache_destroy(gpu);
}
END_TEST

/* ------------------------------------------------------------------- main */

int main(void)
{
    const char *env = getenv("FUSEDROPE_TEST_SEED");
    Suite *s;
    TCase *tc;
    SRunner *sr;
    int failed;

    if (!fusedrope_cuda_available()) {
        printf("test_cuda: no CUDA device, skipping\n");
        return 77;
    }
    tu_seed = env && *env ? strtoull(env, NULL, 0) : 1;
    printf("test_cuda: seed %llu (FUSEDROPE_TEST_SEED)\n", (unsigned long long)tu_seed);
    ref_init();

    s = suite_create("cuda");
    tc = tcase_create("backend");
    tcase_set_timeout(tc, 600);
    if (getenv("FUSEDROPE_TEST_CAPTURE_FIRST")) { /* test_capture_first's process */
        tcase_add_test(tc, test_capture_first_here);
        goto run;
    }
    tcase_add_test(tc, test_copy_table);
    tcase_add_test(tc, test_device_mismatch);
    tcase_add_test(tc, test_out_of_table);
    tcase_add_test(tc, test_flag_per_cache);
    tcase_add_test(tc, test_range_status_word);
    tcase_add_test(tc, test_huge_table_refused);
    tcase_add_test(tc, test_cache_device_ordinal);
    tcase_add_test(tc, test_device_restore_fails);
    tcase_add_loop_test(tc, test_grid, 0, 24);
    tcase_add_test(tc, test_shapes);
    tcase_add_test(tc, test_extreme_values);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_graph_replay);
    tcase_add_test(tc, test_norm_graph_replay);
    tcase_add_test(tc, test_capture_first);
    tcase_add_test(tc, test_offsets_past_2_32);
run:
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork() */
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
