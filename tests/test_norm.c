/*
 * test_norm.c - the fused per-head RMSNorm + RoPE (fusedrope_norm_forward_qk,
 * fusedrope_norm_backward_qk) against the float64 reference of tests/ref.c
 * (ref_norm_forward, ref_norm_backward, themselves checked by finite
 * differences here), against a literal unfused evaluation in the dtype for
 * each rounding mode (bit for bit), with poisoned outputs, odd sizes,
 * strides, packed QKV views, in place, partial rotary, GQA head counts,
 * table-less caches and THD; dw and dx the same bytes for 1, 2 and 7
 * threads; every refusal.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fusedrope.h"
#include "internal.h" /* fr_avx2_usable */
#include "ref.h"
#include "util.h"

#define CPU FUSEDROPE_DEVICE_CPU
#define MSG 1024

static const fusedrope_dtype dtypes[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                           FUSEDROPE_BFLOAT16 };

/* ------------------------------------------------------------------ a case */

typedef struct ncase {
    fusedrope_dtype dt;
    fusedrope_style style;
    int weight;          /* fusedrope_norm_weight */
    int rounding;        /* fusedrope_norm_rounding */
    int w_f32;           /* weights in float32 (else the tensors' dtype) */
    int layout;          /* LAY_*; LAY_THD: packed, cu_seqlens */
    int64_t s, b, hq, hk, hd;
    int rot_dim;
    int tableless;
    int ids;             /* explicit positions */
    int in_place;
    int k_present;
    int rope;            /* ROPE_*: the cache's rope type or position axes */
    int posmode;         /* POS_*: implicit positions, plain or moved */
    int out_layout;      /* 1 + the outputs' LAY_* (y, dx apart), 0 the input's: out_layout() */
    int dy_layout;       /* 1 + the backward's dy's LAY_*, 0 the input's: dy_layout() */
} ncase;

/* The layouts of the outputs (the forward's y, the backward's dx apart from
 * dy) and of the backward's dy, drawn apart from the input's, so that a
 * kernel that takes one tensor's strides for another's fails (a warp
 * kernel's output stepped by the input's head stride passed every test
 * while all a case's tensors had one layout); THD's are THD, and a case
 * that draws none (zeroed) has the input's. */
static int layout_apart(const ncase *c, int drawn)
{
    return c->layout == LAY_THD || drawn == 0 ? c->layout : drawn - 1;
}

static int out_layout(const ncase *c)
{
    return layout_apart(c, c->out_layout);
}

static int dy_layout(const ncase *c)
{
    return layout_apart(c, c->dy_layout);
}

/* Implicit positions (no ids): from 0, from per-sequence offsets, or a
 * context-parallel rank's two chunks (not THD: its sequences may be odd). */
enum { POS_PLAIN, POS_OFFSETS, POS_CP };
static const char *const pos_names[] = { "", " offsets", " context-parallel" };

/* The caches of test_rope_types_and_axes (0, the default, elsewhere). */
enum {
    ROPE_DEFAULT, ROPE_LINEAR, ROPE_DYNAMIC, ROPE_YARN, ROPE_LONGROPE, ROPE_LLAMA3,
    ROPE_PROPORTIONAL, AXES_SECTIONS, AXES_INTERLEAVED, AXES_ALTERNATING, AXES_VISION,
    AXES_CUSTOM, AXES_INTERLEAVED_YARN, ROPE_KINDS
};
static const char *const rope_names[ROPE_KINDS] = {
    "default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional",
    "sections", "interleaved", "alternating", "vision_2d", "custom", "interleaved+yarn"
};

typedef struct run {
    fusedrope_cache *cache;
    ref_rope ref;
    fusedrope_positions pos;
    const fusedrope_positions *posp;
    int64_t *positions;  /* per token, for the reference */
    fusedrope_norm norm;
    tu_buf qb, kb, qob, kob, qsave, ksave;
    fusedrope_tensor q, k, qo, ko, qx, kx; /* qx/kx: copies of the inputs */
    double *wq, *wk;     /* the weights' values */
    int64_t tokens;
} run;

/* cfg for c->rope (c->rot_dim suits it: test_rope_types_and_axes sees to
 * that); arrays the config points to are tu_alloc'ed. */
static void rope_config(const ncase *c, tu_rng *r, fusedrope_cache_config *cfg)
{
    static const fusedrope_rope_type types[] = {
        FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_ROPE_LINEAR, FUSEDROPE_ROPE_DYNAMIC,
        FUSEDROPE_ROPE_YARN,    FUSEDROPE_ROPE_LONGROPE, FUSEDROPE_ROPE_LLAMA3,
        FUSEDROPE_ROPE_PROPORTIONAL
    };
    const int half = c->rot_dim / 2;
    fusedrope_cache_config_init(cfg, c->rope < AXES_SECTIONS ? types[c->rope]
                                     : c->rope == AXES_INTERLEAVED_YARN ? FUSEDROPE_ROPE_YARN
                                                                        : FUSEDROPE_ROPE_DEFAULT,
                                c->rot_dim, c->tableless ? 0 : 256, 10000.0);
    switch (c->rope) {
    case ROPE_LINEAR:
        cfg->factor = 2.0;
        break;
    case ROPE_DYNAMIC:
        cfg->factor = 2.0;
        cfg->original_max_positions = 64;
        cfg->seq_len = 300;
        break;
    case ROPE_YARN:
    case AXES_INTERLEAVED_YARN:
        cfg->factor = 4.0; /* attention factor 0.1 ln 4 + 1 */
        cfg->original_max_positions = 64;
        break;
    case ROPE_LONGROPE: {
        double *sf = tu_alloc(sizeof(double) * (size_t)half),
               *lf = tu_alloc(sizeof(double) * (size_t)half);
        for (int i = 0; i < half; i++) {
            sf[i] = tu_uniform(r, 1.0, 1.5);
            lf[i] = tu_uniform(r, 1.0, 8.0);
        }
        cfg->short_factor = sf;
        cfg->long_factor = lf;
        cfg->original_max_positions = 64;
        cfg->seq_len = 200; /* past the original context: the long factors */
        break;
    }
    case ROPE_LLAMA3:
        cfg->factor = 8.0;
        cfg->original_max_positions = 64;
        break;
    case ROPE_PROPORTIONAL:
        cfg->partial_rotary_factor = 0.5;
        break;
    default:
        break;
    }
    if (c->rope >= AXES_SECTIONS) {
        const int a = half / 4, t = half - 2 * (half / 3);
        switch (c->rope) {
        case AXES_SECTIONS: /* Qwen2-VL's proportions [16, 24, 24] */
            cfg->axes = FUSEDROPE_AXES_SECTIONS;
            cfg->sections[0] = a;
            cfg->sections[1] = (half - a) / 2;
            cfg->sections[2] = half - a - (half - a) / 2;
            break;
        case AXES_INTERLEAVED:
        case AXES_INTERLEAVED_YARN: /* Qwen3-VL, Qwen3.5 */
            cfg->axes = FUSEDROPE_AXES_INTERLEAVED;
            cfg->sections[0] = t;
            cfg->sections[1] = cfg->sections[2] = half / 3;
            break;
        case AXES_ALTERNATING: /* Ernie-4.5-VL */
            cfg->axes = FUSEDROPE_AXES_ALTERNATING;
            cfg->sections[1] = cfg->sections[2] = half / 4;
            cfg->sections[0] = half - 2 * (half / 4);
            break;
        case AXES_VISION:
            cfg->axes = FUSEDROPE_AXES_VISION_2D;
            break;
        default: { /* any map: every pair its own axis and column */
            unsigned char *ax = tu_alloc((size_t)half);
            int *col = tu_alloc(sizeof(int) * (size_t)half);
            for (int i = 0; i < half; i++) {
                ax[i] = (unsigned char)tu_int(r, 0, 3);
                col[i] = (int)tu_int(r, 0, half - 1);
            }
            cfg->axes = FUSEDROPE_AXES_CUSTOM;
            cfg->pair_axis = ax;
            cfg->pair_col = col;
        }
        }
    }
}

static void make_cache(run *R, const ncase *c, tu_rng *r)
{
    fusedrope_cache_config cfg;
    rope_config(c, r, &cfg);
    ck_assert_msg(fusedrope_cache_create(&cfg, CPU, &R->cache) == FUSEDROPE_OK, "%s: %s",
                  rope_names[c->rope], fusedrope_last_error());
    tu_track(R->cache);
    ck_assert_int_eq(ref_rope_from_config(&R->ref, &cfg), 0);
}

static double *make_weight(tu_rng *r, const ncase *c, fusedrope_dtype wdt, const void **out)
{
    double *w = tu_alloc(sizeof(double) * (size_t)c->hd);
    void *p = tu_alloc(ref_dtype_size(wdt) * (size_t)c->hd);
    for (int64_t i = 0; i < c->hd; i++) {
        const double v = c->weight == 2 ? tu_uniform(r, -0.6, 0.6) : tu_uniform(r, 0.4, 1.7);
        ref_store(p, wdt, i, v);
        w[i] = ref_load(p, wdt, i);
    }
    *out = p;
    return w;
}

/* Builds tensors, weights, positions and the norm of a case (inputs filled). */
static void setup(run *R, const ncase *c, tu_rng *r)
{
    const fusedrope_dtype wdt = c->w_f32 ? FUSEDROPE_FLOAT32 : c->dt;
    const int64_t b = c->layout == LAY_THD ? 1 : c->b;
    memset(R, 0, sizeof *R);
    make_cache(R, c, r);
    R->q = tu_tensor(c->layout, c->dt, c->s, b, c->hq, c->hd, &R->qb);
    tu_fill_view(&R->q, r, -2.5, 2.5);
    R->qsave = tu_buf_copy(&R->qb);
    R->qx = tu_rebase(&R->q, &R->qb, &R->qsave);
    if (c->in_place) {
        R->qo = R->q;
    } else {
        R->qo = tu_tensor(out_layout(c), c->dt, c->s, b, c->hq, c->hd, &R->qob);
    }
    if (c->k_present) {
        R->k = tu_tensor(c->layout, c->dt, c->s, b, c->hk, c->hd, &R->kb);
        tu_fill_view(&R->k, r, -0.01, 0.01); /* small: eps matters */
        R->ksave = tu_buf_copy(&R->kb);
        R->kx = tu_rebase(&R->k, &R->kb, &R->ksave);
        if (c->in_place)
            R->ko = R->k;
        else
            R->ko = tu_tensor(out_layout(c), c->dt, c->s, b, c->hk, c->hd, &R->kob);
    }
    R->tokens = c->s * b;
    fusedrope_norm_init(&R->norm);
    R->norm.weight = (fusedrope_norm_weight)c->weight;
    R->norm.rounding = (fusedrope_norm_rounding)c->rounding;
    R->norm.weight_dtype = wdt;
    R->norm.eps = 1e-5;
    if (c->weight) {
        R->wq = make_weight(r, c, wdt, &R->norm.q_weight);
        if (c->k_present)
            R->wk = make_weight(r, c, wdt, &R->norm.k_weight);
    }
    fusedrope_positions_init(&R->pos);
    R->posp = NULL;
    if (c->layout == LAY_THD) {
        /* two or three packed sequences */
        int32_t *cu = tu_alloc(4 * sizeof(int32_t));
        int64_t n = c->s >= 3 ? 3 : 1;
        cu[0] = 0;
        for (int64_t i = 1; i < n; i++)
            cu[i] = (int32_t)(c->s * i / n);
        cu[n] = (int32_t)c->s;
        R->pos.cu_seqlens = cu;
        R->pos.num_seqs = n;
        R->posp = &R->pos;
    }
    if (R->ref.naxes > 1) {
        /* a row of positions per axis, rows 3 tokens further apart than
         * they are long (an engine's persistent [axes][max_tokens] buffer) */
        const int64_t stride = R->tokens + 3;
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(stride * R->ref.naxes));
        for (int64_t i = 0; i < stride * R->ref.naxes; i++)
            ids[i] = tu_int(r, 0, 255);
        R->pos.ids = ids;
        R->pos.ids_axes = R->ref.naxes;
        R->pos.ids_axis_stride = stride;
        R->posp = &R->pos;
        R->positions = tu_alloc(sizeof(int64_t) * (size_t)(R->tokens * R->ref.naxes));
        ref_axis_positions(R->posp, R->ref.naxes, c->s, b, R->positions);
        return;
    }
    if (c->ids) {
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)R->tokens);
        for (int64_t i = 0; i < R->tokens; i++)
            ids[i] = tu_int(r, 0, 255);
        R->pos.ids = ids;
        R->posp = &R->pos;
    } else if (c->posmode == POS_OFFSETS) {
        /* one offset a batch entry, or a packed sequence, inside the table */
        const int64_t n = c->layout == LAY_THD ? R->pos.num_seqs : b;
        int64_t *off = tu_alloc(sizeof(int64_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            off[i] = tu_int(r, 0, 256 - c->s);
        R->pos.offsets = off;
        R->posp = &R->pos;
    } else if (c->posmode == POS_CP) {
        R->pos.cp_size = c->tableless || c->s * 4 <= 256 ? 4 : 2;
        R->pos.cp_rank = (int)tu_int(r, 0, R->pos.cp_size - 1);
        R->posp = &R->pos;
    }
    R->positions = tu_positions(R->posp, c->s, b);
}

static float *poisoned_floats(int64_t n)
{
    float *p = tu_alloc(sizeof(float) * (size_t)(n + 1));
    memset(p, 0xff, sizeof(float) * (size_t)(n + 1));
    return p;
}

static fusedrope_status forward(run *R, const ncase *c)
{
    return fusedrope_norm_forward_qk(R->cache, c->style, R->posp, &R->norm, &R->q, &R->qo,
                                     c->k_present ? &R->k : NULL, c->k_present ? &R->ko : NULL,
                                     NULL);
}

static void describe(const ncase *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "%s %s weight %d rounding %d w_f32 %d %s s %lld b %lld hq %lld hk %lld hd %lld "
             "rot %d %s%s%s%s%s, y/dx %s, dy %s (seed %llu)",
             ref_dtype_name(c->dt), c->style == FUSEDROPE_NEOX ? "neox" : "interleaved",
             c->weight, c->rounding, c->w_f32, tu_layout_name(c->layout), (long long)c->s,
             (long long)c->b, (long long)c->hq, (long long)c->hk, (long long)c->hd, c->rot_dim,
             rope_names[c->rope], c->tableless ? " table-less" : "", c->ids ? " ids" : "",
             pos_names[c->posmode], c->in_place ? " in place" : "", tu_layout_name(out_layout(c)),
             tu_layout_name(dy_layout(c)), (unsigned long long)tu_seed);
}

/* The forward's output against ref_norm_forward; rstd against its rstd.
 * The library rounds rstd and n in float32 (a few 2^-24 relative, times the
 * reduction's depth), and where the mode rounds v to the dtype a value that
 * close to a tie may round the other way: one dtype ulp of each input. */
static int64_t check_forward_tensor(run *R, const ncase *c, const fusedrope_tensor *x,
                                    const fusedrope_tensor *y, const double *w, const float *rstd,
                                    char *msg)
{
    const int64_t rows = R->tokens * x->heads, n = rows * x->head_dim;
    double *out = tu_alloc(sizeof(double) * (size_t)n), *v = tu_alloc(sizeof(double) * (size_t)n);
    double *rs = tu_alloc(sizeof(double) * (size_t)rows);
    int64_t bad = 0;
    const int half = c->rot_dim / 2;
    ref_norm_forward(&R->ref, c->style, R->positions, x, c->weight, w, R->norm.eps, c->rounding,
                     out, v, rs);
    for (int64_t s = 0; s < x->seq_len; s++)
        for (int64_t b = 0; b < x->batch; b++)
            for (int64_t h = 0; h < x->heads; h++) {
                const int64_t row = (s * x->batch + b) * x->heads + h;
                const double *o = out + row * x->head_dim, *vv = v + row * x->head_dim;
                if (rstd) {
                    const double got = rstd[(b * x->seq_len + s) * x->heads + h],
                                 want = rs[(b * x->seq_len + s) * x->heads + h];
                    if (!(fabs(got - want) <= ref_norm_rstd_tolerance(want)) && bad++ < 3)
                        snprintf(msg + strlen(msg), MSG - strlen(msg),
                                 " rstd(s %lld b %lld h %lld) %.9g want %.9g;", (long long)s,
                                 (long long)b, (long long)h, got, want);
                }
                for (int64_t ch = 0; ch < x->head_dim; ch++) {
                    const double got = ref_load(y->data, y->dtype, ref_offset(y, s, b, h, ch));
                    double mag, flip, tol;
                    if (ch < c->rot_dim) {
                        const int64_t i = c->style == FUSEDROPE_NEOX ? ch % half : ch / 2;
                        int64_t ca, cb;
                        ref_pair(c->style, c->rot_dim, (int)i, &ca, &cb);
                        mag = fabs(vv[ca]) + fabs(vv[cb]);
                        flip = ref_ulp(vv[ca], c->dt) + ref_ulp(vv[cb], c->dt);
                    } else {
                        mag = fabs(vv[ch]);
                        flip = ref_ulp(vv[ch], c->dt);
                    }
                    /* ref.h: the rotation's bound, the norm's float32 steps
                     * and, where the mode rounds v, a tie going the other way */
                    tol = ref_norm_y_tolerance(o[ch], mag, flip, R->ref.attn, c->rounding, c->dt);
                    if (!(fabs(got - o[ch]) <= tol) && bad++ < 3)
                        snprintf(msg + strlen(msg), MSG - strlen(msg),
                                 " y(s %lld b %lld h %lld c %lld) %.9g want %.9g tol %.3g;",
                                 (long long)s, (long long)b, (long long)h, (long long)ch, got,
                                 o[ch], tol);
                }
            }
    return bad;
}

static void check_forward(run *R, const ncase *c)
{
    char msg[MSG] = "", what[256];
    float *rq = poisoned_floats(R->tokens * c->hq), *rk = NULL;
    int64_t bad;
    size_t first = 0;
    tu_buf qsnap;
    unsigned char *mask;

    R->norm.q_rstd = rq;
    if (c->k_present)
        R->norm.k_rstd = rk = poisoned_floats(R->tokens * c->hk);
    qsnap = tu_buf_copy(c->in_place ? &R->qb : &R->qob);
    describe(c, what, sizeof what);
    ck_assert_msg(forward(R, c) == FUSEDROPE_OK, "%s: %s", what, fusedrope_last_error());
    bad = check_forward_tensor(R, c, &R->qx, &R->qo, R->wq, rq, msg);
    if (c->k_present)
        bad += check_forward_tensor(R, c, &R->kx, &R->ko, R->wk, rk, msg);
    ck_assert_msg(bad == 0, "%s: %lld bad:%s", what, (long long)bad, msg);
    /* nothing outside q's output view written, nor past the rstd arrays */
    mask = tu_alloc(qsnap.nbytes);
    tu_mask_view(c->in_place ? &R->qb : &R->qob, &R->qo, mask);
    ck_assert_msg(tu_changed_outside(c->in_place ? &R->qb : &R->qob, &qsnap, mask, &first) == 0,
                  "%s: q's buffer changed outside the view at byte %zu", what, first);
    ck_assert_msg(isnan(rq[R->tokens * c->hq]), "%s: written past q_rstd", what);
}

/* ---------------------------------------------------------------- forward */

/* A case's layout and seq_len made fit for its position mode. */
static void pos_fit(ncase *c)
{
    if (c->posmode == POS_CP && c->layout == LAY_THD)
        c->posmode = POS_OFFSETS;
    if (c->posmode == POS_CP)
        c->s += c->s % 2;
}

static void random_case(ncase *c, tu_rng *r, int i)
{
    static const int64_t hds[] = { 64, 128, 40, 6, 96, 34 };
    memset(c, 0, sizeof *c);
    c->dt = dtypes[i % 3];
    c->style = (i / 3) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    c->weight = (i / 6) % 3;
    c->rounding = (i / 18) % 3;
    c->w_f32 = (int)tu_int(r, 0, 1);
    c->layout = (int)tu_int(r, 0, LAY_NUM - 1);
    c->s = tu_int(r, 1, 9);
    c->b = tu_int(r, 1, 3);
    c->hq = tu_int(r, 1, 6);
    c->hk = tu_int(r, 1, 3);
    c->hd = hds[tu_int(r, 0, 5)];
    /* full or partial rotary (GLM-4.5: half; Qwen3.5: a quarter) */
    c->rot_dim = (int)(tu_int(r, 0, 1) ? c->hd : (c->hd / 4 > 1 ? c->hd / 4 / 2 * 2 : 2));
    c->tableless = tu_int(r, 0, 4) == 0;
    c->ids = c->layout != LAY_THD && tu_int(r, 0, 2) == 0;
    c->in_place = (int)tu_int(r, 0, 1);
    c->k_present = tu_int(r, 0, 5) != 0;
    c->posmode = c->ids ? POS_PLAIN : (int)tu_int(r, 0, 2);
    pos_fit(c);
    c->out_layout = 1 + (int)tu_int(r, 0, LAY_THD - 1);
    c->dy_layout = 1 + (int)tu_int(r, 0, LAY_THD - 1);
}

/* 54 combinations of dtype x style x weight x rounding, random shapes. */
START_TEST(test_forward_matrix)
{
    tu_rng r;
    ncase c;
    run R;
    tu_rng_init(&r, 100 + (uint64_t)_i);
    for (int rep = 0; rep < 3; rep++) {
        random_case(&c, &r, _i);
        setup(&R, &c, &r);
        check_forward(&R, &c);
        ref_rope_free(&R.ref);
    }
    tu_free_all();
}
END_TEST

/* q, k and v as views of one packed [tokens][(hq + 2 hk) * hd] buffer, in place. */
START_TEST(test_forward_packed_qkv)
{
    tu_rng r;
    const int64_t T = 13, hq = 4, hk = 2, hd = 64, W = (hq + 2 * hk) * hd;
    const fusedrope_dtype dt = dtypes[_i % 3];
    fusedrope_cache *cache;
    fusedrope_cache_config cfg;
    ref_rope ref;
    tu_buf buf, save;
    fusedrope_tensor q, k, qx, kx;
    fusedrope_norm nm;
    const void *wq, *wk;
    double *dwq, *dwk, *out;
    int64_t *positions;
    ncase c;
    char msg[MSG] = "";
    run R;

    tu_rng_init(&r, 200 + (uint64_t)_i);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, hd, 64, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    ck_assert_int_eq(ref_rope_from_config(&ref, &cfg), 0);
    buf = tu_buf_new(dt, T * W);
    tu_fill_random(&buf, &r, -2, 2);
    save = tu_buf_copy(&buf);
    q = fusedrope_tensor_thd(buf.p, dt, T, hq, hd);
    q.stride_seq = W;
    k = q;
    k.heads = hk;
    k.data = buf.p + (size_t)(hq * hd) * ref_dtype_size(dt);
    qx = tu_rebase(&q, &buf, &save);
    kx = tu_rebase(&k, &buf, &save);
    memset(&c, 0, sizeof c);
    c.dt = dt;
    c.style = FUSEDROPE_NEOX;
    c.weight = 1;
    c.rounding = 1;
    c.hd = hd;
    dwq = make_weight(&r, &c, dt, &wq);
    dwk = make_weight(&r, &c, dt, &wk);
    fusedrope_norm_init(&nm);
    nm.weight = FUSEDROPE_NORM_WEIGHT;
    nm.rounding = FUSEDROPE_NORM_ROUND_LLAMA;
    nm.weight_dtype = dt;
    nm.q_weight = wq;
    nm.k_weight = wk;
    ck_assert_msg(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &q, &k, &k,
                                            NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    /* v untouched */
    ck_assert(memcmp(buf.p + (size_t)((hq + hk) * hd) * ref_dtype_size(dt),
                     save.p + (size_t)((hq + hk) * hd) * ref_dtype_size(dt),
                     (size_t)(hk * hd) * ref_dtype_size(dt)) == 0);
    memset(&R, 0, sizeof R);
    R.ref = ref;
    R.tokens = T;
    R.norm = nm;
    positions = tu_positions(NULL, T, 1);
    R.positions = positions;
    c.rot_dim = (int)hd;
    ck_assert_msg(check_forward_tensor(&R, &c, &qx, &q, dwq, NULL, msg) == 0, "q:%s", msg);
    ck_assert_msg(check_forward_tensor(&R, &c, &kx, &k, dwk, NULL, msg) == 0, "k:%s", msg);
    (void)out;
    ref_rope_free(&ref);
    tu_free_all();
}
END_TEST

/* ------------------------------------------- literal unfused evaluation */

/*
 * Each rounding mode against the unfused model evaluated literally in the
 * dtype with the ref.h codecs, bit for bit: rstd in float32 with the
 * documented reduction order (32 partial sums, then the tree), n = x * rstd
 * in float32; ONCE: v = n * w'; LLAMA: v = dtype(dtype(n) * w'); GEMMA:
 * v = dtype(n * w'); then the rotation a*c - b*s, b*c + a*s in float32 with
 * the user table's entries, rounded once to the dtype.
 */
static float lit_sum_sq(const float *x, int64_t hd)
{
    float p[32];
    for (int l = 0; l < 32; l++) {
        p[l] = 0.0f;
        for (int64_t ch = l; ch < hd; ch += 32)
            p[l] = p[l] + x[ch] * x[ch];
    }
    for (int off = 16; off >= 1; off /= 2)
        for (int l = 0; l < off; l++)
            p[l] = p[l] + p[l + off];
    return p[0];
}

static float to_dt(float v, fusedrope_dtype dt)
{
    return (float)ref_round((double)v, dt);
}

START_TEST(test_unfused_literal)
{
    const fusedrope_dtype dt = dtypes[_i % 3];
    const int weight = (_i / 3) % 3;
    const fusedrope_style style = (_i / 9) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const int64_t T = 7, H = 3, hd = 72, rot = 48, half = rot / 2, rows = 16;
    const float eps = 1e-6f;
    tu_rng r;
    float *tc = tu_alloc(sizeof(float) * rows * half), *ts = tu_alloc(sizeof(float) * rows * half);
    fusedrope_cache *cache;
    tu_buf xb, yb[3];
    fusedrope_tensor x, y[3];
    fusedrope_norm nm;
    void *wp;
    int64_t differ = 0;

    tu_rng_init(&r, 300 + (uint64_t)_i);
    for (int64_t i = 0; i < rows * half; i++) {
        const double a = tu_uniform(&r, 0, 6.3);
        tc[i] = (float)cos(a);
        ts[i] = (float)sin(a);
    }
    ck_assert_int_eq(fusedrope_cache_create_from_table(tc, ts, rows, (int)rot, CPU, &cache),
                     FUSEDROPE_OK);
    tu_track(cache);
    x = tu_tensor(LAY_BSHD, dt, T, 1, H, hd, &xb);
    tu_fill_view(&x, &r, -3, 3);
    wp = tu_alloc(ref_dtype_size(dt) * hd);
    tu_fill(wp, hd, dt, &r, weight == 2 ? -0.7 : 0.3, weight == 2 ? 0.7 : 1.9);
    fusedrope_norm_init(&nm);
    nm.weight = (fusedrope_norm_weight)weight;
    nm.weight_dtype = dt;
    nm.eps = eps;
    nm.q_weight = weight ? wp : NULL;
    for (int mode = 0; mode < 3; mode++) {
        y[mode] = tu_tensor(LAY_BSHD, dt, T, 1, H, hd, &yb[mode]);
        nm.rounding = (fusedrope_norm_rounding)mode;
        ck_assert_msg(fusedrope_norm_forward_qk(cache, style, NULL, &nm, &x, &y[mode], NULL,
                                                NULL, NULL) == FUSEDROPE_OK,
                      "%s", fusedrope_last_error());
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                float xs[72], v[72], want[72], rs;
                for (int64_t ch = 0; ch < hd; ch++)
                    xs[ch] = (float)ref_load(x.data, dt, ref_offset(&x, t, 0, h, ch));
                rs = 1.0f / sqrtf(lit_sum_sq(xs, hd) / (float)hd + eps);
                for (int64_t ch = 0; ch < hd; ch++) {
                    const float wv = (float)ref_load(wp, dt, ch);
                    const float wf = weight == 0 ? 1.0f : weight == 1 ? wv : 1.0f + wv;
                    const float n = xs[ch] * rs;
                    v[ch] = mode == 0 ? n * wf
                          : mode == 1 ? to_dt(to_dt(n, dt) * wf, dt) : to_dt(n * wf, dt);
                    want[ch] = v[ch];
                }
                for (int64_t i = 0; i < half; i++) {
                    int64_t ca, cb;
                    const float cs = tc[t * half + i], sn = ts[t * half + i];
                    ref_pair(style, (int)rot, (int)i, &ca, &cb);
                    want[ca] = v[ca] * cs - v[cb] * sn;
                    want[cb] = v[cb] * cs + v[ca] * sn;
                }
                for (int64_t ch = 0; ch < hd; ch++) {
                    const double got = ref_load(y[mode].data, dt, ref_offset(&y[mode], t, 0, h, ch));
                    ck_assert_msg(got == ref_round(want[ch], dt),
                                  "%s weight %d mode %d t %lld h %lld c %lld: %.9g, the unfused "
                                  "evaluation gives %.9g (seed %llu)",
                                  ref_dtype_name(dt), weight, mode, (long long)t, (long long)h,
                                  (long long)ch, got, ref_round(want[ch], dt),
                                  (unsigned long long)tu_seed);
                }
            }
    }
    /* the modes are not the same computation: in a 16-bit dtype, with a
     * weight, rounding n first changes some outputs */
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t ch = 0; ch < hd; ch++)
                differ += ref_load(y[0].data, dt, ref_offset(&y[0], t, 0, h, ch)) !=
                          ref_load(y[1].data, dt, ref_offset(&y[1], t, 0, h, ch));
    if (dt != FUSEDROPE_FLOAT32 && weight != 0)
        ck_assert_msg(differ > 0, "ROUND_ONCE and ROUND_LLAMA gave the same bytes");
    if (dt == FUSEDROPE_FLOAT32)
        ck_assert_msg(differ == 0, "float32: the modes must agree");
    tu_free_all();
}
END_TEST

/* --------------------------------------------------------------- backward */

static int64_t check_backward_tensor(run *R, const ncase *c, const fusedrope_tensor *saved,
                                     int saved_y, const fusedrope_tensor *dy,
                                     const fusedrope_tensor *dx, const double *w,
                                     const float *rstd, const float *dw, char *msg)
{
    const int64_t rows = R->tokens * dy->heads, n = rows * dy->head_dim;
    double *want = tu_alloc(sizeof(double) * (size_t)n), *scale = tu_alloc(sizeof(double) * rows);
    double *dwr = tu_alloc(sizeof(double) * (size_t)dy->head_dim),
           *dwa = tu_alloc(sizeof(double) * (size_t)dy->head_dim);
    int64_t bad = 0;
    ref_norm_backward(&R->ref, c->style, R->positions, saved, saved_y, dy, c->weight, w,
                      R->norm.eps, saved_y ? rstd : NULL, want, dwr, dwa, scale);
    for (int64_t s = 0; s < dy->seq_len; s++)
        for (int64_t b = 0; b < dy->batch; b++)
            for (int64_t h = 0; h < dy->heads; h++) {
                const int64_t row = (s * dy->batch + b) * dy->heads + h;
                for (int64_t ch = 0; ch < dy->head_dim; ch++) {
                    const double got = ref_load(dx->data, dx->dtype, ref_offset(dx, s, b, h, ch));
                    const double wv = want[row * dy->head_dim + ch];
                    const double tol = ref_norm_dx_tolerance(wv, scale[row], c->dt);
                    if (!(fabs(got - wv) <= tol) && bad++ < 3)
                        snprintf(msg + strlen(msg), MSG - strlen(msg),
                                 " dx(s %lld b %lld h %lld c %lld) %.9g want %.9g tol %.3g;",
                                 (long long)s, (long long)b, (long long)h, (long long)ch, got, wv,
                                 tol);
                }
            }
    if (dw)
        for (int64_t ch = 0; ch < dy->head_dim; ch++) {
            const double tol = ref_norm_dw_tolerance(dwa[ch]);
            if (!(fabs(dw[ch] - dwr[ch]) <= tol) && bad++ < 6)
                snprintf(msg + strlen(msg), MSG - strlen(msg), " dw[%lld] %.9g want %.9g tol %.3g;",
                         (long long)ch, (double)dw[ch], dwr[ch], tol);
        }
    return bad;
}

/* dst's elements set to src's (one shape, any layouts). */
static void copy_view(const fusedrope_tensor *src, const fusedrope_tensor *dst)
{
    for (int64_t s = 0; s < src->seq_len; s++)
        for (int64_t b = 0; b < src->batch; b++)
            for (int64_t h = 0; h < src->heads; h++)
                for (int64_t ch = 0; ch < src->head_dim; ch++)
                    ref_store(dst->data, dst->dtype, ref_offset(dst, s, b, h, ch),
                              ref_load(src->data, src->dtype, ref_offset(src, s, b, h, ch)));
}

/* Forward (rstd, y), then backward from the saved x or the saved y, dx in
 * place over dy or not, dw for both weights; against ref_norm_backward.
 * dy is random, or (dy_is_y) the forward's y.  c->in_place is cleared: the
 * forward's input is the saved one. */
static void backward_case(ncase *c, tu_rng *r, int saved_y, int in_place_dx, int dy_is_y)
{
    run R;
    char msg[MSG] = "", what[256];
    tu_buf dqb, dkb, dxqb, dxkb;
    fusedrope_tensor dq, dk, dxq, dxk;
    float *rq, *rk = NULL, *dwq = NULL, *dwk = NULL;
    int64_t bad;
    c->in_place = 0;
    setup(&R, c, r);
    rq = poisoned_floats(R.tokens * c->hq);
    R.norm.q_rstd = rq;
    if (c->k_present)
        R.norm.k_rstd = rk = poisoned_floats(R.tokens * c->hk);
    ck_assert_msg(forward(&R, c) == FUSEDROPE_OK, "%s", fusedrope_last_error());
    if (saved_y && c->weight == 2) {
        /* n = R^T y / (1 + w): keep 1 + w away from 0 */
        for (int64_t i = 0; i < c->hd; i++)
            ck_assert(fabs(1 + R.wq[i]) > 0.3);
    }
    dq = tu_tensor(dy_layout(c), c->dt, c->s, R.q.batch, c->hq, c->hd, &dqb);
    tu_fill_view(&dq, r, -1, 1);
    dxq = in_place_dx ? dq
                      : tu_tensor(out_layout(c), c->dt, c->s, R.q.batch, c->hq, c->hd, &dxqb);
    if (c->k_present) {
        dk = tu_tensor(dy_layout(c), c->dt, c->s, R.q.batch, c->hk, c->hd, &dkb);
        tu_fill_view(&dk, r, -1, 1);
        dxk = in_place_dx ? dk
                          : tu_tensor(out_layout(c), c->dt, c->s, R.q.batch, c->hk, c->hd, &dxkb);
    }
    if (dy_is_y) {
        copy_view(&R.qo, &dq);
        if (c->k_present)
            copy_view(&R.ko, &dk);
    }
    {
        /* keep dy: in place it is overwritten */
        tu_buf dqs = tu_buf_copy(&dqb), dks;
        fusedrope_tensor dqx = tu_rebase(&dq, &dqb, &dqs), dkx = dq;
        if (c->k_present) {
            dks = tu_buf_copy(&dkb);
            dkx = tu_rebase(&dk, &dkb, &dks);
        }
        if (c->weight) {
            R.norm.dq_weight = dwq = poisoned_floats(c->hd);
            if (c->k_present)
                R.norm.dk_weight = dwk = poisoned_floats(c->hd);
        }
        R.norm.saved_output = saved_y;
        describe(c, what, sizeof what);
        ck_assert_msg(fusedrope_norm_backward_qk(R.cache, c->style, R.posp, &R.norm,
                                                 saved_y ? &R.qo : &R.q, &dq, &dxq,
                                                 c->k_present ? (saved_y ? &R.ko : &R.k) : NULL,
                                                 c->k_present ? &dk : NULL,
                                                 c->k_present ? &dxk : NULL,
                                                 NULL) == FUSEDROPE_OK,
                      "%s: %s", what, fusedrope_last_error());
        bad = check_backward_tensor(&R, c, saved_y ? &R.qo : &R.q, saved_y, &dqx, &dxq, R.wq, rq,
                                    dwq, msg);
        if (c->k_present)
            bad += check_backward_tensor(&R, c, saved_y ? &R.ko : &R.k, saved_y, &dkx, &dxk,
                                         R.wk, rk, dwk, msg);
        ck_assert_msg(bad == 0, "%s saved %s dx %s: %lld bad:%s", what, saved_y ? "y" : "x",
                      in_place_dx ? "in place" : "apart", (long long)bad, msg);
    }
    ref_rope_free(&R.ref);
    tu_free_all();
}

START_TEST(test_backward_matrix)
{
    tu_rng r;
    ncase c;
    tu_rng_init(&r, 400 + (uint64_t)_i);
    for (int rep = 0; rep < 2; rep++) {
        const int saved_y = (_i + rep) % 2;
        const int in_place_dx = (int)tu_int(&r, 0, 1);
        random_case(&c, &r, _i);
        backward_case(&c, &r, saved_y, in_place_dx, 0);
    }
}
END_TEST

/* dw over several FUSEDROPE_NORM_DW_CHUNK chunks of tokens (the matrix's
 * cases stay under one), every layout (THD's sequences cross the chunks'
 * borders), judged by ref_norm_backward; the last four in the shape
 * norm_backward_heads takes, with many heads in q and a few in k, as a
 * model's 32 + 8 are (odd counts too: a warp's last group of heads short),
 * the last two of them with dx apart and dy in a layout of its own. */
START_TEST(test_backward_dw_chunks)
{
    tu_rng r;
    ncase c;
    tu_rng_init(&r, 450 + (uint64_t)_i);
    random_case(&c, &r, 18 * (1 + _i % 2) + 6 + _i % 6); /* a weight: dw is written */
    c.layout = _i % LAY_NUM;
    c.s = tu_int(&r, 2 * FUSEDROPE_NORM_DW_CHUNK + 1, 3 * FUSEDROPE_NORM_DW_CHUNK + 7);
    c.b = tu_int(&r, 1, 2);
    c.hq = tu_int(&r, 1, 3);
    c.hk = 1;
    if (_i >= 6) { /* and the shape norm_backward_heads takes */
        c.hq = tu_int(&r, 17, 24);
        c.hk = tu_int(&r, 4, 8);
        c.b = 1;
        c.dt = _i % 2 ? FUSEDROPE_FLOAT16 : FUSEDROPE_BFLOAT16;
        c.hd = c.rot_dim = _i % 2 ? 64 : 128;
        c.tableless = 0;
        c.k_present = 1;
        c.layout = _i % 2 ? LAY_BSHD : LAY_SBHD;
    }
    if (_i >= 8) {
        /* dx apart, and each of x, dy and dx with a stride of its own
         * (the 16-byte-aligned layouts have two head strides: head_dim and
         * HSBD's): dy's head stride unlike x's, dx's unlike dy's */
        c.dy_layout = 1 + LAY_HSBD;
        c.out_layout = 1 + (_i % 2 ? LAY_SBHD : LAY_BSHD);
    }
    c.ids = 0;
    pos_fit(&c);
    backward_case(&c, &r, _i % 2, _i >= 8 ? 0 : (int)tu_int(&r, 0, 1), 0);
}
END_TEST

/* dy = y without a weight: the norm's output does not change with its
 * input's scale, so dx = rstd (dn - n mean(dn n)), dn = g ~ n, nearly
 * cancels (to dy's 16-bit rounding), and dx's bits follow the last bits of
 * the row's mean: a backend that sums dn * n in another order than the
 * contract's gives other dx bytes than the CPU (test_norm_emu and
 * test_norm_gpu compare them), where with random dy a swapped tree level of
 * norm_backward_heads passed (dx's 16-bit rounding hid it).  Judged by
 * ref_norm_backward as every backward; 16-bit, both styles, two roundings,
 * in the shape norm_backward_heads takes, over several dw chunks. */
START_TEST(test_backward_cancelling)
{
    tu_rng r;
    ncase c;
    tu_rng_init(&r, 470 + (uint64_t)_i);
    /* dtypes 1 and 2, style, no weight, rounding once or Llama */
    random_case(&c, &r, 1 + _i % 2 + 3 * (_i / 2 % 2) + 18 * (_i / 4 % 2));
    c.s = tu_int(&r, FUSEDROPE_NORM_DW_CHUNK + 1, 2 * FUSEDROPE_NORM_DW_CHUNK);
    c.b = 1;
    c.hq = tu_int(&r, 17, 24);
    c.hk = tu_int(&r, 4, 8);
    c.hd = c.rot_dim = (_i + _i / 2) % 2 ? 64 : 128;
    c.tableless = 0;
    c.k_present = 1;
    c.ids = 0;
    c.layout = _i % 2 ? LAY_BSHD : LAY_SBHD;
    pos_fit(&c);
    backward_case(&c, &r, _i / 4 % 2, (int)tu_int(&r, 0, 1), 1);
}
END_TEST

/* Every rope type and position-axes layout (Qwen2-VL's sections, Qwen3-VL's
 * interleaved, Ernie's alternating, the vision towers' 2D, any custom map,
 * Qwen3.5's interleaved with YaRN), with a row of positions per axis:
 * forward and backward against the reference, the kernels' copy too in
 * test_norm_emu. */
START_TEST(test_rope_types_and_axes)
{
    static const int64_t hds[] = { 64, 128, 40, 96, 72, 80 };
    tu_rng r;
    ncase c;
    run R;
    /* under valgrind (CI's slowest stage) the first of the four rounds: each
     * rope kind and layout once, on one random shape */
    if (tu_under_valgrind() && _i >= ROPE_KINDS - 1)
        return;
    tu_rng_init(&r, 900 + (uint64_t)_i);
    random_case(&c, &r, _i);
    c.rope = 1 + _i % (ROPE_KINDS - 1);
    c.hd = hds[tu_int(&r, 0, 5)];
    c.rot_dim = (int)(tu_int(&r, 0, 1) ? c.hd : c.hd / 2); /* rot_dim % 4 == 0: VISION_2D */
    setup(&R, &c, &r);
    check_forward(&R, &c);
    ref_rope_free(&R.ref);
    tu_free_all();
    backward_case(&c, &r, (int)tu_int(&r, 0, 1), (int)tu_int(&r, 0, 1), 0);
}
END_TEST

/* ------------------------------------------- the reference's gradients */

/* L = sum(y * dy) of ref_norm_forward; its derivatives by central
 * differences against ref_norm_backward's dx and dw. */
START_TEST(test_reference_finite_differences)
{
    const int weight = _i % 3;
    const fusedrope_style style = (_i / 3) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const int64_t S = 2, H = 2, hd = 10;
    const int rot = (_i / 6) % 2 ? 6 : 10;
    fusedrope_cache_config cfg;
    ref_rope ref;
    tu_rng r;
    tu_buf xb, dyb;
    fusedrope_tensor x, dy;
    double w[10], dx[40], dw[10] = { 0 }, y[40], yp[40];
    int64_t *positions;
    const double eps = 1e-3;

    tu_rng_init(&r, 500 + (uint64_t)_i);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, rot, 16, 100.0);
    ck_assert_int_eq(ref_rope_from_config(&ref, &cfg), 0);
    x = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, 1, H, hd, &xb);
    dy = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, 1, H, hd, &dyb);
    tu_fill_view(&x, &r, -1, 1);
    tu_fill_view(&dy, &r, -1, 1);
    for (int i = 0; i < hd; i++)
        w[i] = tu_uniform(&r, -0.8, 0.8);
    positions = tu_positions(NULL, S, 1);
    positions[1] = 5;
    ref_norm_backward(&ref, style, positions, &x, 0, &dy, weight, w, eps, NULL, dx, dw, NULL,
                      NULL);
    for (int64_t e = 0; e < S * H * hd; e++) {
        /* perturb one element of x (stored as float: use the stored values) */
        float *px = (float *)x.data + e;
        const float x0 = *px, xp = x0 + 1e-3f, xm = x0 - 1e-3f;
        double lp = 0, lm = 0, fd;
        *px = xp;
        ref_norm_forward(&ref, style, positions, &x, weight, w, eps, 0, y, NULL, NULL);
        for (int64_t i = 0; i < S * H * hd; i++)
            lp += y[i] * ref_load(dy.data, FUSEDROPE_FLOAT32, i);
        *px = xm;
        ref_norm_forward(&ref, style, positions, &x, weight, w, eps, 0, yp, NULL, NULL);
        for (int64_t i = 0; i < S * H * hd; i++)
            lm += yp[i] * ref_load(dy.data, FUSEDROPE_FLOAT32, i);
        *px = x0;
        fd = (lp - lm) / ((double)xp - (double)xm);
        ck_assert_msg(fabs(fd - dx[e]) <= 1e-5 * (1 + fabs(fd)),
                      "weight %d rot %d: dx[%lld] %.10g, finite differences %.10g", weight, rot,
                      (long long)e, dx[e], fd);
    }
    for (int c = 0; c < hd && weight; c++) {
        const double w0 = w[c], h = 1e-5;
        double lp = 0, lm = 0, fd;
        w[c] = w0 + h;
        ref_norm_forward(&ref, style, positions, &x, weight, w, eps, 0, y, NULL, NULL);
        w[c] = w0 - h;
        ref_norm_forward(&ref, style, positions, &x, weight, w, eps, 0, yp, NULL, NULL);
        w[c] = w0;
        for (int64_t i = 0; i < S * H * hd; i++) {
            lp += y[i] * ref_load(dy.data, FUSEDROPE_FLOAT32, i);
            lm += yp[i] * ref_load(dy.data, FUSEDROPE_FLOAT32, i);
        }
        fd = (lp - lm) / (2 * h);
        ck_assert_msg(fabs(fd - dw[c]) <= 1e-6 * (1 + fabs(fd)),
                      "weight %d: dw[%d] %.10g, finite differences %.10g", weight, c, dw[c], fd);
    }
    ref_rope_free(&ref);
    tu_free_all();
}
END_TEST

/* ------------------------------------------------- AVX2 and portable rows */

#ifdef FR_HAVE_AVX2
/* Whether element i of a dtype buffer is a NaN as the library writes one:
 * quiet (float16: 0x7e00 and the sign, as fr_float_to_half writes every
 * NaN).  Which NaN an operation passes on, and so the payload, may differ
 * between the two paths (operand order), not this. */
static int nan_at(const void *p, fusedrope_dtype dt, int64_t i)
{
    uint32_t u = 0;
    if (dt == FUSEDROPE_FLOAT32) {
        memcpy(&u, (const float *)p + i, 4);
        return (u & 0x7fffffffu) > 0x7f800000u && (u & 0x400000u);
    }
    u = ((const uint16_t *)p)[i];
    if (dt == FUSEDROPE_FLOAT16)
        return (u & 0x7fffu) == 0x7e00u;
    return (u & 0x7fffu) > 0x7f80u && (u & 0x40u);
}

/* A value for the AVX2-vs-portable comparison: mostly ordinary, some
 * hard cases (zeros, huge, tiny, subnormal, Inf, NaN) that send a row down
 * the portable loops or test the roundings' edges. */
static double odd_value(tu_rng *r, fusedrope_dtype dt)
{
    static const double f32[] = { 0.0, -0.0, 3e38, -1e30, 1e-30, 1e-42, INFINITY, NAN, 65519.0 };
    static const double f16[] = { 0.0, -0.0, 65504.0, -6e-8, 3e-5, INFINITY, -INFINITY, NAN };
    const int64_t u = tu_int(r, 0, 199);
    if (u >= 3)
        return tu_uniform(r, -3.0, 3.0) * (u < 20 ? 1e4 : 1.0);
    if (dt == FUSEDROPE_FLOAT16)
        return f16[tu_int(r, 0, 7)];
    return f32[tu_int(r, 0, 8)];
}

/* fusedrope_norm_forward_qk through the library's choice (the AVX-512
 * rows where the CPU has them), through the AVX2 rows (tu_cpu_path 1) and
 * through the portable loops (tu_cpu_path 2): the same bytes for y and rstd
 * (a NaN need only be NaN in each), over every dtype, style, weight kind
 * and rounding mode; head_dim with and without scalar tails, with and
 * without whole 16-channel vectors (the AVX-512 rows' condition), partial
 * rotary, special values in some rows, a weight with an infinity, weights
 * so large that rotated values are NaN, and outputs large enough to be
 * streamed (non-temporal stores), out of place and in place. */
START_TEST(test_avx2_rows_match_portable)
{
    static const struct { int64_t s, h, hd, rot; } shapes[] = {
        { 5, 3, 128, 128 }, { 7, 2, 96, 48 }, { 3, 5, 34, 10 }, { 4, 2, 256, 64 },
        { 2, 3, 6, 6 }, { 3, 4, 80, 64 }, { 6, 2, 160, 32 }, { 4, 3, 64, 48 },
        { 1024, 16, 128, 128 }, /* 4 MiB in 16 bits, streamed from the registers */
        { 1024, 16, 136, 10 },  /* 4.25 MiB, streamed from a staged row (5 pairs; the
                                 * last shape, left out under valgrind, CI's slowest stage:
                                 * ASan and the plain run cover it) */
    };
#ifdef TU_EMULATED
    /* test_norm_emu under valgrind: the small shapes (the kernels do not
     * stream, and these calls run them once per path, whose toggles only
     * the OpenMP backend sees; test_norm takes the streamed shape there) */
    const size_t nshapes = sizeof shapes / sizeof shapes[0] - (tu_under_valgrind() ? 2 : 0);
#else
    const size_t nshapes = sizeof shapes / sizeof shapes[0] - (tu_under_valgrind() ? 1 : 0);
#endif
    static const char *const path[3] = { "default", "AVX2", "portable" };
    const int first = tu_skip_default_path();
    const fusedrope_dtype dt = dtypes[_i % 3];
    const fusedrope_style style = (_i / 3) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const size_t es = ref_dtype_size(dt);
    tu_rng r;

    if (!fr_avx2_usable())
        return; /* nothing to compare on this CPU */
    tu_rng_init(&r, 900 + (uint64_t)_i);
    for (size_t si = 0; si < nshapes; si++) {
        const int64_t S = shapes[si].s, H = shapes[si].h, D = shapes[si].hd, n = S * H * D;
        const int big = S * H * D * (int64_t)es >= (1 << 22);
        fusedrope_cache_config cfg;
        fusedrope_cache *cache;
        void *x = tu_alloc((size_t)n * es), *w = tu_alloc((size_t)D * es);
        void *y[3] = { tu_alloc((size_t)n * es), tu_alloc((size_t)n * es),
                       tu_alloc((size_t)n * es) };
        float *rs[3] = { tu_alloc(sizeof(float) * (size_t)(S * H)),
                         tu_alloc(sizeof(float) * (size_t)(S * H)),
                         tu_alloc(sizeof(float) * (size_t)(S * H)) };

        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)shapes[si].rot, S, 10000.0);
        ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
        tu_track(cache);
        for (int64_t row = 0; row < S * H; row++) {
            /* one row in 8 with hard values, one in 16 all zeros */
            const int64_t kind = tu_int(&r, 0, 15);
            for (int64_t c = 0; c < D; c++)
                ref_store(x, dt, row * D + c,
                          kind == 0 ? 0.0 : kind == 1 || kind == 2 ? odd_value(&r, dt)
                                                                   : tu_uniform(&r, -3.0, 3.0));
        }
        for (int weight = 0; weight < 3; weight++)
            for (int rounding = 0; rounding < 3; rounding++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    fusedrope_norm nm;
                    if (big && (weight != 1 || (rounding != 1 && in_place)))
                        continue; /* the streamed shape: fewer combinations */
                    /* and under valgrind one of those four an iteration (each
                     * at least once over the six; the four were 40 of
                     * test_norm's 110 s there) */
                    if (big && tu_valgrind_skips((in_place ? 3 : rounding) + 4 - _i % 4, 4))
                        continue;
                    for (int64_t c = 0; c < D; c++)
                        ref_store(w, dt, c,
                                  weight == 2 && c == D / 2 && in_place ? INFINITY
                                  /* finite, but n * w overflows (float16: its
                                   * rounding does): the rotation makes NaNs,
                                   * the default NaN, which the vector rows
                                   * narrow without their NaN case */
                                  : weight == 1 && in_place && !big
                                      ? (dt == FUSEDROPE_FLOAT16 ? (c % 3 ? 6e4 : -6e4)
                                                                 : (c % 3 ? 3e38 : -3e38))
                                  : weight == 2 ? tu_uniform(&r, -0.6, 0.6)
                                                : tu_uniform(&r, 0.4, 1.7));
                    fusedrope_norm_init(&nm);
                    nm.weight = (fusedrope_norm_weight)weight;
                    nm.rounding = (fusedrope_norm_rounding)rounding;
                    nm.weight_dtype = dt;
                    nm.eps = 1e-6;
                    nm.q_weight = weight ? w : NULL;
                    for (int off = first; off < 3; off++) {
                        fusedrope_tensor tin, tout;
                        nm.q_rstd = rs[off];
                        memset(y[off], 0xa5, (size_t)n * es);
                        if (in_place)
                            memcpy(y[off], x, (size_t)n * es);
                        tin = fusedrope_tensor_bshd(in_place ? y[off] : x, dt, S, 1, H, D);
                        tout = fusedrope_tensor_bshd(y[off], dt, S, 1, H, D);
                        tu_cpu_path(off);
                        ck_assert_msg(fusedrope_norm_forward_qk(cache, style, NULL, &nm, &tin, &tout,
                                                                NULL, NULL, NULL) == FUSEDROPE_OK,
                                      "%s", fusedrope_last_error());
                        tu_cpu_path(0);
                    }
                    for (int p = first; p < 2; p++) {
                        for (int64_t i = 0; i < n; i++)
                            if (memcmp((char *)y[p] + i * es, (char *)y[2] + i * es, es) != 0 &&
                                !(nan_at(y[p], dt, i) && nan_at(y[2], dt, i)))
                                ck_abort_msg("%s %s shape %zu weight %d rounding %d in place %d: "
                                             "y[%lld] %s %.9g, portable %.9g (x %.9g)",
                                             ref_dtype_name(dt), style ? "interleaved" : "neox",
                                             si, weight, rounding, in_place, (long long)i, path[p],
                                             ref_load(y[p], dt, i), ref_load(y[2], dt, i),
                                             ref_load(x, dt, i));
                        for (int64_t i = 0; i < S * H; i++)
                            ck_assert_msg(memcmp(&rs[p][i], &rs[2][i], 4) == 0 ||
                                              (isnan(rs[p][i]) && isnan(rs[2][i])),
                                          "rstd[%lld]: %s %.9g, portable %.9g", (long long)i,
                                          path[p], rs[p][i], rs[2][i]);
                    }
                }
    }
    tu_free_all();
}
END_TEST

/* fusedrope_norm_backward_qk through the library's choice (the AVX-512 rows
 * where the CPU has them), through the AVX2 rows (tu_cpu_path 1) and
 * through the portable loops (tu_cpu_path 2): the same bytes for dx and dw (a
 * NaN need only be NaN in each), over every dtype, style and weight kind,
 * from saved x and from saved y, out of place, in place over dy and over
 * the saved tensor; head_dim with
 * and without whole 8- and 16-channel vectors (the AVX2 and AVX-512 rows'
 * conditions; the others take the portable loops or the AVX2 rows),
 * partial rotary, several dw chunks, and
 * special values in some rows of dy, the saved tensor and rstd (zero,
 * infinite, NaN) and a weight 1 + w of 0 (saved y divides by it). */
START_TEST(test_avx2_backward_rows_match_portable)
{
    static const struct { int64_t s, h, hd, rot; } shapes[] = {
        { 5, 3, 128, 128 }, { 70, 2, 96, 48 }, { 3, 5, 34, 10 }, { 4, 2, 256, 64 },
        { 2, 3, 6, 6 },     { 40, 2, 72, 64 }, { 33, 1, 48, 32 }, { 9, 2, 80, 64 },
        { 37, 3, 64, 32 },
    };
    static const char *const path[3] = { "default", "AVX2", "portable" };
    const int first = tu_skip_default_path();
    const fusedrope_dtype dt = dtypes[_i % 3];
    const fusedrope_style style = (_i / 3) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const size_t es = ref_dtype_size(dt);
    tu_rng r;

    if (!fr_avx2_usable())
        return; /* nothing to compare on this CPU */
    tu_rng_init(&r, 950 + (uint64_t)_i);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t S = shapes[si].s, H = shapes[si].h, D = shapes[si].hd, n = S * H * D;
        fusedrope_cache_config cfg;
        fusedrope_cache *cache;
        void *sv = tu_alloc((size_t)n * es), *dy = tu_alloc((size_t)n * es);
        void *w = tu_alloc((size_t)D * es);
        void *dx[3] = { tu_alloc((size_t)n * es), tu_alloc((size_t)n * es),
                        tu_alloc((size_t)n * es) };
        float *rs = tu_alloc(sizeof(float) * (size_t)(S * H));
        float *dw[3] = { tu_alloc(sizeof(float) * (size_t)D), tu_alloc(sizeof(float) * (size_t)D),
                         tu_alloc(sizeof(float) * (size_t)D) };

        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)shapes[si].rot, S, 10000.0);
        ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
        tu_track(cache);
        for (int64_t row = 0; row < S * H; row++) {
            /* one row in 8 with hard values in dy or the saved row, one
             * rstd in 16 special */
            const int64_t kind = tu_int(&r, 0, 15);
            static const float odd_rstd[] = { 0.0f, INFINITY, NAN, 1e30f };
            for (int64_t c = 0; c < D; c++) {
                ref_store(sv, dt, row * D + c,
                          kind == 1 ? odd_value(&r, dt) : tu_uniform(&r, -3.0, 3.0));
                ref_store(dy, dt, row * D + c,
                          kind == 2 ? odd_value(&r, dt) : tu_uniform(&r, -2.0, 2.0));
            }
            rs[row] = kind == 3 ? odd_rstd[tu_int(&r, 0, 3)] : (float)tu_uniform(&r, 0.1, 4.0);
        }
        for (int weight = 0; weight < 3; weight++)
            for (int saved_y = 0; saved_y < 2; saved_y++)
                for (int in_place = 0; in_place < 3; in_place++) { /* 2: dx over the saved */
                    fusedrope_norm nm;
                    for (int64_t c = 0; c < D; c++)
                        ref_store(w, dt, c,
                                  weight == 2 && c == D / 3 ? -1.0
                                  : weight == 2 ? tu_uniform(&r, -0.6, 0.6)
                                                : tu_uniform(&r, 0.4, 1.7));
                    fusedrope_norm_init(&nm);
                    nm.weight = (fusedrope_norm_weight)weight;
                    nm.weight_dtype = dt;
                    nm.q_weight = weight ? w : NULL;
                    nm.q_rstd = rs;
                    nm.saved_output = saved_y;
                    for (int off = first; off < 3; off++) {
                        fusedrope_tensor ts, tdy, tdx;
                        nm.dq_weight = weight ? dw[off] : NULL;
                        memset(dx[off], 0xa5, (size_t)n * es);
                        memset(dw[off], 0xa5, sizeof(float) * (size_t)D);
                        if (in_place)
                            memcpy(dx[off], in_place == 1 ? dy : sv, (size_t)n * es);
                        ts = fusedrope_tensor_bshd(in_place == 2 ? dx[off] : sv, dt, S, 1, H, D);
                        tdy = fusedrope_tensor_bshd(in_place == 1 ? dx[off] : dy, dt, S, 1, H, D);
                        tdx = fusedrope_tensor_bshd(dx[off], dt, S, 1, H, D);
                        tu_cpu_path(off);
                        ck_assert_msg(fusedrope_norm_backward_qk(cache, style, NULL, &nm, &ts, &tdy,
                                                                 &tdx, NULL, NULL, NULL,
                                                                 NULL) == FUSEDROPE_OK,
                                      "%s", fusedrope_last_error());
                        tu_cpu_path(0);
                    }
                    for (int p = first; p < 2; p++) {
                        for (int64_t i = 0; i < n; i++)
                            if (memcmp((char *)dx[p] + i * es, (char *)dx[2] + i * es, es) != 0 &&
                                !(nan_at(dx[p], dt, i) && nan_at(dx[2], dt, i)))
                                ck_abort_msg("%s %s shape %zu weight %d saved_y %d in place %d: "
                                             "dx[%lld] %s %.9g, portable %.9g", ref_dtype_name(dt),
                                             style ? "interleaved" : "neox", si, weight, saved_y,
                                             in_place, (long long)i, path[p],
                                             ref_load(dx[p], dt, i), ref_load(dx[2], dt, i));
                        for (int64_t c = 0; weight && c < D; c++)
                            ck_assert_msg(memcmp(&dw[p][c], &dw[2][c], 4) == 0 ||
                                              (isnan(dw[p][c]) && isnan(dw[2][c])),
                                          "%s shape %zu weight %d saved_y %d: dw[%lld]: %s %.9g, "
                                          "portable %.9g", ref_dtype_name(dt), si, weight, saved_y,
                                          (long long)c, path[p], dw[p][c], dw[2][c]);
                    }
                }
    }
    tu_free_all();
}
END_TEST
#endif

/* ------------------------------------------------------------ determinism */

/* dx and dw the same bytes for 1, 2 and 7 threads (more than one chunk of
 * FUSEDROPE_NORM_DW_CHUNK tokens, more than the threshold for threads). */
START_TEST(test_threads_determinism)
{
    const fusedrope_dtype dt = dtypes[_i % 3];
    static const int nthreads[3] = { 1, 2, 7 };
    tu_rng r;
    ncase c;
    run R;
    unsigned char *first_dx = NULL, *first_y = NULL;
    float first_dw[2][128];
    tu_buf dqb, dxqb;
    fusedrope_tensor dq, dxq;

    tu_rng_init(&r, 600 + (uint64_t)_i);
    memset(&c, 0, sizeof c);
    c.dt = dt;
    c.style = FUSEDROPE_NEOX;
    c.weight = 1 + _i % 2;
    c.rounding = 1;
    c.layout = LAY_BSHD;
    c.s = 150;
    c.b = 2;
    c.hq = 5;
    c.hk = 2;
    c.hd = 128;
    c.rot_dim = 64;
    c.k_present = 1;
    setup(&R, &c, &r);
    R.norm.q_rstd = tu_alloc(sizeof(float) * (size_t)(R.tokens * c.hq));
    R.norm.k_rstd = tu_alloc(sizeof(float) * (size_t)(R.tokens * c.hk));
    R.norm.dq_weight = tu_alloc(sizeof(float) * 128);
    R.norm.dk_weight = tu_alloc(sizeof(float) * 128);
    dq = tu_tensor(LAY_BSHD, dt, c.s, c.b, c.hq, c.hd, &dqb);
    tu_fill_view(&dq, &r, -1, 1);
    dxq = tu_tensor(LAY_BSHD, dt, c.s, c.b, c.hq, c.hd, &dxqb);
    for (int i = 0; i < 3; i++) {
        tu_threads(nthreads[i]);
        ck_assert_int_eq(forward(&R, &c), FUSEDROPE_OK);
        ck_assert_msg(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &dq,
                                                 &dxq, &R.k, &R.ko, &R.ko, NULL) ==
                          FUSEDROPE_OK,
                      "%s", fusedrope_last_error());
        if (i == 0) {
            first_dx = tu_dup(dxqb.p, dxqb.nbytes);
            first_y = tu_dup(R.qob.p, R.qob.nbytes);
            memcpy(first_dw[0], R.norm.dq_weight, sizeof first_dw[0]);
            memcpy(first_dw[1], R.norm.dk_weight, sizeof first_dw[1]);
        } else {
            ck_assert_msg(memcmp(first_dx, dxqb.p, dxqb.nbytes) == 0,
                          "dx differs between 1 and %d threads", nthreads[i]);
            ck_assert_msg(memcmp(first_y, R.qob.p, R.qob.nbytes) == 0,
                          "y differs between 1 and %d threads", nthreads[i]);
            ck_assert_msg(memcmp(first_dw[0], R.norm.dq_weight, sizeof first_dw[0]) == 0,
                          "dq_weight differs between 1 and %d threads", nthreads[i]);
            ck_assert_msg(memcmp(first_dw[1], R.norm.dk_weight, sizeof first_dw[1]) == 0,
                          "dk_weight differs between 1 and %d threads", nthreads[i]);
        }
        /* the next round's backward reads k's forward output again */
        ck_assert_int_eq(forward(&R, &c), FUSEDROPE_OK);
    }
    ref_rope_free(&R.ref);
    tu_free_all();
}
END_TEST

/* --------------------------------------------------------------- refusals */

static void expect(fusedrope_status got, fusedrope_status want, const char *needle,
                   const char *what)
{
    ck_assert_msg(got == want, "%s: status %d, want %d (%s)", what, (int)got, (int)want,
                  fusedrope_last_error());
    ck_assert_msg(tu_contains(fusedrope_last_error(), needle), "%s: message '%s' lacks '%s'",
                  what, fusedrope_last_error(), needle);
}

/* The norm's OpenMP team, forward and backward, is the cache's num_threads
 * (fusedrope_cache_create(3)), small calls none, as for the plain calls; the
 * bytes the same for each. */
START_TEST(test_cache_num_threads)
{
#ifdef _OPENMP
    static const int want[3][2] = { { 1, 0 }, { 3, 3 }, { 2, 2 } };
    const int64_t S = 64, H = 8, D = 64; /* 32768 elements: a team */
    tu_rng r;
    tu_buf xb, yb[3], sb, dyb, dxb[3];
    fusedrope_tensor x, y[3], small, dy, dx[3];
    fusedrope_norm nm;
    float *rs = tu_alloc(sizeof(float) * (size_t)(S * H));
    tu_rng_init(&r, 1200);
    x = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &xb);
    tu_fill_view(&x, &r, -2, 2);
    dy = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &dyb);
    tu_fill_view(&dy, &r, -2, 2);
    small = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, 2, 1, H, D, &sb);
    tu_fill_view(&small, &r, -2, 2);
    fusedrope_norm_init(&nm);
    nm.q_rstd = rs; /* for the backward */
    for (int i = 0; i < 3; i++) {
        fusedrope_cache_config cfg;
        fusedrope_cache *cache;
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)D, S, 10000.0);
        cfg.num_threads = want[i][0];
        ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
        tu_track(cache);
        y[i] = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &yb[i]);
        fr_cpu_team = -1;
        ck_assert_int_eq(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &x, &y[i],
                                                   NULL, NULL, NULL), FUSEDROPE_OK);
        ck_assert_msg(fr_cpu_team == want[i][1], "num_threads %d: team %d, want %d",
                      want[i][0], fr_cpu_team, want[i][1]);
        ck_assert_msg(memcmp(yb[i].p, yb[0].p, yb[0].nbytes) == 0,
                      "num_threads %d changed the bytes", want[i][0]);
        /* the backward's team, by the same rule (rs: x's, from the call above) */
        dx[i] = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &dxb[i]);
        fr_cpu_team = -1;
        ck_assert_int_eq(fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &x, &dy,
                                                    &dx[i], NULL, NULL, NULL, NULL),
                         FUSEDROPE_OK);
        ck_assert_msg(fr_cpu_team == want[i][1], "backward, num_threads %d: team %d, want %d",
                      want[i][0], fr_cpu_team, want[i][1]);
        ck_assert_msg(memcmp(dxb[i].p, dxb[0].p, dxb[0].nbytes) == 0,
                      "num_threads %d changed the backward's bytes", want[i][0]);
        fr_cpu_team = -1;
        ck_assert_int_eq(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &small,
                                                   &small, NULL, NULL, NULL), FUSEDROPE_OK);
        ck_assert_msg(fr_cpu_team == 0, "a small call started a team of %d", fr_cpu_team);
    }
    tu_free_all();
#endif
}
END_TEST

/* A norm call made inside the caller's active parallel region runs in its
 * own nested region (of one, or of the cache's team where nesting is
 * allowed), even a small one that otherwise runs on the calling thread
 * without a region: the backward's chunks must not be shared out over the
 * caller's team.  Each outer thread's forward and backward (three dw chunks)
 * give the bytes of the same calls made outside any region. */
START_TEST(test_calls_in_caller_region)
{
    /* (the OpenMP backend's rule: test_norm_emu's wraps replace that
     * backend, one call at a time) */
#if defined(_OPENMP) && !defined(TU_EMULATED)
    const int64_t S = 70, H = 2, D = 64; /* 8960 elements: no team of its own */
    tu_rng r;
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    tu_buf xb, dyb, yb[3], dxb[3];
    fusedrope_tensor x, dy, y[3], dx[3];
    fusedrope_norm nm[3];
    float w[64];
    int ok[2][2];

    tu_rng_init(&r, 1300);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)D, S, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    x = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &xb);
    tu_fill_view(&x, &r, -2, 2);
    dy = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &dyb);
    tu_fill_view(&dy, &r, -1, 1);
    for (int64_t c = 0; c < D; c++)
        w[c] = (float)tu_uniform(&r, 0.5, 1.5);
    for (int i = 0; i < 3; i++) { /* 0: outside; 1, 2: the outer threads' */
        y[i] = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &yb[i]);
        dx[i] = tu_tensor(LAY_SBHD, FUSEDROPE_BFLOAT16, S, 1, H, D, &dxb[i]);
        fusedrope_norm_init(&nm[i]);
        nm[i].weight = FUSEDROPE_NORM_WEIGHT;
        nm[i].weight_dtype = FUSEDROPE_FLOAT32;
        nm[i].q_weight = w;
        nm[i].q_rstd = tu_alloc(sizeof(float) * (size_t)(S * H));
        nm[i].dq_weight = tu_alloc(sizeof(float) * (size_t)D);
    }
    for (int levels = 1; levels <= 2; levels++) {
        omp_set_max_active_levels(levels);
        for (int i = 1; i < 3; i++) { /* poisoned */
            memset(yb[i].p, 0xff, yb[i].nbytes);
            memset(dxb[i].p, 0xff, dxb[i].nbytes);
            memset(nm[i].dq_weight, 0xff, sizeof(float) * (size_t)D);
            memset(nm[i].q_rstd, 0xff, sizeof(float) * (size_t)(S * H));
        }
#pragma omp parallel num_threads(3)
        {
            const int i = omp_get_thread_num(); /* thread 0 first, alone, then 1 and 2 */
            if (i == 0 && levels == 1)
                ok[0][0] = fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm[0], &x,
                                                     &y[0], NULL, NULL, NULL) == FUSEDROPE_OK &&
                           fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm[0], &x,
                                                      &dy, &dx[0], NULL, NULL, NULL,
                                                      NULL) == FUSEDROPE_OK;
#pragma omp barrier
            if (i > 0)
                ok[levels - 1][i - 1] =
                    fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm[i], &x, &y[i],
                                              NULL, NULL, NULL) == FUSEDROPE_OK &&
                    fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm[i], &x, &dy,
                                               &dx[i], NULL, NULL, NULL, NULL) == FUSEDROPE_OK;
        }
        for (int i = 1; i < 3; i++) {
            ck_assert_msg(ok[levels - 1][i - 1], "max-active-levels %d, thread %d: a call failed",
                          levels, i);
            ck_assert_msg(memcmp(yb[i].p, yb[0].p, yb[0].nbytes) == 0 &&
                              memcmp(dxb[i].p, dxb[0].p, dxb[0].nbytes) == 0 &&
                              memcmp(nm[i].q_rstd, nm[0].q_rstd, sizeof(float) * (size_t)(S * H)) == 0 &&
                              memcmp(nm[i].dq_weight, nm[0].dq_weight, sizeof(float) * (size_t)D) == 0,
                          "max-active-levels %d, thread %d: bytes differ from a call outside",
                          levels, i);
        }
    }
    omp_set_max_active_levels(1);
    tu_free_all();
#endif
}
END_TEST

START_TEST(test_refusals)
{
    tu_rng r;
    ncase c;
    run R;
    fusedrope_norm saved;
    tu_buf snap;
    float *rq;
    fusedrope_tensor bad;

    tu_rng_init(&r, 700);
    memset(&c, 0, sizeof c);
    c.dt = FUSEDROPE_BFLOAT16;
    c.weight = 1;
    c.rounding = 1;
    c.layout = LAY_BSHD;
    c.s = 4;
    c.b = 2;
    c.hq = 4;
    c.hk = 2;
    c.hd = 64;
    c.rot_dim = 64;
    c.k_present = 1;
    setup(&R, &c, &r);
    rq = tu_alloc(sizeof(float) * (size_t)(R.tokens * c.hq));
    R.norm.q_rstd = rq;
    saved = R.norm;
    snap = tu_buf_copy(&R.qob);

    R.norm.eps = 0;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "eps", "eps 0");
    R.norm.eps = -1e-6;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "eps", "eps < 0");
    R.norm.eps = NAN;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "eps", "eps NaN");
    R.norm.eps = 1e-300; /* 0 as a float32 */
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "eps", "eps underflowing");
    R.norm.eps = INFINITY;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "eps", "eps Inf");
    R.norm = saved;
    R.norm.k_weight = NULL;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID,
           "k_weight is NULL; norm->weight FUSEDROPE_NORM_WEIGHT needs", "NULL k weight");
    R.norm = saved;
    R.norm.weight = FUSEDROPE_NORM_WEIGHT_PLUS_ONE;
    R.norm.q_weight = NULL;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID,
           "q_weight is NULL; norm->weight FUSEDROPE_NORM_WEIGHT_PLUS_ONE needs",
           "NULL q weight, 1 + w");
    R.norm = saved;
    R.norm.weight = FUSEDROPE_NORM_WEIGHT_NONE;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "WEIGHT_NONE", "weights with WEIGHT_NONE");
    R.norm = saved;
    R.norm.weight_dtype = FUSEDROPE_FLOAT16;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "weight_dtype", "weight dtype f16 on bf16");
    R.norm.weight_dtype = (fusedrope_dtype)7;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "weight_dtype", "weight dtype 7");
    R.norm = saved;
    R.norm.weight = (fusedrope_norm_weight)3;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "weight", "weight kind 3");
    R.norm = saved;
    R.norm.rounding = (fusedrope_norm_rounding)-1;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "rounding", "rounding -1");
    R.norm = saved;
    R.norm.struct_size = 0;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "struct_size", "struct_size 0");
    R.norm = saved;
    R.norm.struct_size = 12;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "struct_size", "struct_size 12");
    R.norm = saved;
    expect(fusedrope_norm_forward_qk(R.cache, c.style, NULL, NULL, &R.q, &R.qo, NULL, NULL, NULL),
           FUSEDROPE_ERR_INVALID, "norm", "norm NULL");
    /* rstd overlapping an output, an input, the other rstd */
    R.norm.q_rstd = (float *)R.qo.data;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "q_rstd may overlap q_out", "rstd over q_out");
    /* a tensor is taken as its span: the sentence says so (a gap of a
     * strided tensor is refused alike) */
    ck_assert_msg(strstr(fusedrope_last_error(), "may overlap") &&
                      strstr(fusedrope_last_error(), "conservative"),
                  "rstd over q_out: %s", fusedrope_last_error());
    R.norm.q_rstd = (float *)R.k.data;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "q_rstd may overlap k_in", "rstd over k_in");
    R.norm.q_rstd = (float *)R.ko.data;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "q_rstd may overlap k_out", "rstd over k_out");
    R.norm.q_rstd = rq;
    R.norm.k_rstd = rq + 3;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "rstd", "rstd over rstd");
    ck_assert_msg(strstr(fusedrope_last_error(), "k_rstd overlaps norm->q_rstd") ||
                      strstr(fusedrope_last_error(), "q_rstd overlaps norm->k_rstd"),
                  "rstd over rstd: %s", fusedrope_last_error());
    R.norm.k_rstd = NULL;
    R.norm.q_rstd = (float *)((char *)rq + 2);
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "aligned", "misaligned rstd");
    {
        /* rstd over the second row of ids (a multimodal cache reads every
         * row while the call writes rstd) */
        fusedrope_cache_config cfg;
        fusedrope_cache *mm;
        fusedrope_positions P;
        const int64_t stride = R.tokens * c.hq + 5;
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(3 * stride));
        for (int64_t i = 0; i < 3 * stride; i++)
            ids[i] = i % 64;
        fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 64, 64, 10000.0);
        cfg.axes = FUSEDROPE_AXES_SECTIONS;
        cfg.sections[0] = 8;
        cfg.sections[1] = cfg.sections[2] = 12;
        ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &mm), FUSEDROPE_OK);
        tu_track(mm);
        fusedrope_positions_init(&P);
        P.ids = ids;
        P.ids_axes = 3;
        P.ids_axis_stride = stride;
        R.norm.q_rstd = (float *)(ids + stride + 1);
        expect(fusedrope_norm_forward_qk(mm, c.style, &P, &R.norm, &R.q, &R.qo, &R.k, &R.ko,
                                         NULL),
               FUSEDROPE_ERR_INVALID, "overlaps", "rstd over the second row of ids");
        R.norm.q_rstd = rq;
        ck_assert_msg(fusedrope_norm_forward_qk(mm, c.style, &P, &R.norm, &R.q, &R.qo, &R.k,
                                                &R.ko, NULL) == FUSEDROPE_OK,
                      "%s", fusedrope_last_error());
        memcpy(R.qob.p, snap.p, snap.nbytes); /* expect() compares q_out with snap */
    }
    {
        /* rstd over pos->offsets (the call reads them while it writes
         * rstd), then over a THD call's cu_seqlens */
        fusedrope_positions P;
        int64_t *area = tu_alloc(sizeof(int64_t) * (size_t)(R.tokens * c.hq + 8));
        fusedrope_positions_init(&P);
        memset(area, 0, sizeof(int64_t) * (size_t)(R.tokens * c.hq + 8));
        P.offsets = area + 2;
        R.norm.q_rstd = (float *)area;
        expect(fusedrope_norm_forward_qk(R.cache, c.style, &P, &R.norm, &R.q, &R.qo, &R.k,
                                         &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "overlaps pos->offsets", "rstd over pos->offsets");
        R.norm.q_rstd = rq;
        ck_assert_msg(fusedrope_norm_forward_qk(R.cache, c.style, &P, &R.norm, &R.q, &R.qo,
                                                &R.k, &R.ko, NULL) == FUSEDROPE_OK,
                      "%s", fusedrope_last_error());
        memcpy(R.qob.p, snap.p, snap.nbytes);
        {
            /* q and k as THD views of the same buffers (batch 1, seq_len
             * s x b): two sequences whose cu_seqlens lie inside q_rstd */
            fusedrope_tensor tq = R.q, tqo = R.qo, tk = R.k, tko = R.ko;
            int32_t *cu = (int32_t *)rq + 3;
            const float keep[3] = { rq[3], rq[4], rq[5] };
            tq.seq_len = tqo.seq_len = tk.seq_len = tko.seq_len = c.s * c.b;
            tq.batch = tqo.batch = tk.batch = tko.batch = 1;
            tq.stride_batch = tqo.stride_batch = tk.stride_batch = tko.stride_batch = 0;
            fusedrope_positions_init(&P);
            cu[0] = 0, cu[1] = 3, cu[2] = (int32_t)(c.s * c.b);
            P.cu_seqlens = cu;
            P.num_seqs = 2;
            expect(fusedrope_norm_forward_qk(R.cache, c.style, &P, &R.norm, &tq, &tqo, &tk,
                                             &tko, NULL),
                   FUSEDROPE_ERR_INVALID, "overlaps pos->cu_seqlens",
                   "rstd over pos->cu_seqlens");
            memcpy(rq + 3, keep, sizeof keep);
        }
    }
    {
        /* an empty q (no heads) whose seq_len x batch is no int64: no
         * undefined behaviour (there was), and the positions' rules hold as
         * for any call, as for the plain calls: its implicit positions run
         * past the table */
        fusedrope_tensor eq = R.q;
        fusedrope_norm nq = saved;
        eq.heads = 0;
        eq.seq_len = INT64_MAX / 2;
        eq.batch = 4;
        nq.q_rstd = rq;
        nq.k_weight = NULL;
        ck_assert_msg(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &nq, &eq, &eq, NULL, NULL,
                                                NULL) == FUSEDROPE_ERR_RANGE &&
                          strstr(fusedrope_last_error(), "implicit positions reach"),
                      "empty q with a huge shape: %s", fusedrope_last_error());
        eq.seq_len = 1;
        ck_assert_msg(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &nq, &eq, &eq, NULL, NULL,
                                                NULL) == FUSEDROPE_OK,
                      "empty q: %s", fusedrope_last_error());
    }
    R.norm = saved;
    /* a weight inside an output */
    R.norm.q_weight = R.ko.data;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "q_weight", "weight inside k_out");
    R.norm = saved;
    R.norm.q_weight = (const char *)saved.q_weight + 1;
    expect(forward(&R, &c), FUSEDROPE_ERR_INVALID, "aligned", "misaligned weight");
    R.norm = saved;
    /* partial overlap of q_out with q_in (fr_apply's rule) */
    bad = R.q;
    bad.data = (char *)R.q.data + 2;
    expect(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &bad, &R.k, &R.ko,
                                     NULL),
           FUSEDROPE_ERR_INVALID, "overlap", "partial overlap");
    /* what the plain calls check: style, head_dim < rot_dim, k without k_out */
    expect(fusedrope_norm_forward_qk(R.cache, (fusedrope_style)5, NULL, &R.norm, &R.q, &R.qo,
                                     &R.k, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "style", "style 5");
    expect(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.k, NULL,
                                     NULL),
           FUSEDROPE_ERR_INVALID, "k_out", "k_out NULL");
    expect(fusedrope_norm_forward_qk(NULL, c.style, NULL, &R.norm, &R.q, &R.qo, &R.k, &R.ko,
                                     NULL),
           FUSEDROPE_ERR_INVALID, "cache", "cache NULL");
    {
        /* the range word the CUDA kernels may write, inside an rstd or a
         * weight (fr_apply_prepare checks it against the tensors and the
         * positions; the norm's own arrays are the norm's) */
        fusedrope_positions P;
        fusedrope_positions_init(&P);
        P.range_status = (int32_t *)rq + 5;
        expect(fusedrope_norm_forward_qk(R.cache, c.style, &P, &R.norm, &R.q, &R.qo, &R.k,
                                         &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "range_status", "range word inside q_rstd");
        P.range_status = (int32_t *)saved.k_weight;
        expect(fusedrope_norm_forward_qk(R.cache, c.style, &P, &R.norm, &R.q, &R.qo, &R.k,
                                         &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "range_status", "range word inside k_weight");
        /* a k array on a q-only call */
        expect(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, NULL,
                                         NULL, NULL),
               FUSEDROPE_ERR_INVALID, "k_weight", "k_weight on a q-only call");
    }
    {
        /* a NULL q tensor, with k given (named; nothing written, k_out
         * included); then tokens x heads past int64: q_in 2^32 x 2^32
         * tokens of 4 heads (ERR_RANGE, q_in named; the tensor's extent
         * rule refuses it before the norm's own product could) */
        tu_buf ksnap = tu_buf_copy(&R.kob);
        fusedrope_tensor hq, hqo;
        fusedrope_norm nq = saved;
        expect(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &R.norm, NULL, &R.qo, &R.k,
                                         &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "q_in is NULL", "q_in NULL");
        expect(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &R.norm, &R.q, NULL, &R.k,
                                         &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "q_out is NULL", "q_out NULL");
        ck_assert(tu_changed(&R.kob, &ksnap, NULL) == 0);
        hq = fusedrope_tensor_sbhd(R.q.data, c.dt, (int64_t)1 << 32, (int64_t)1 << 32, 4, 64);
        hqo = fusedrope_tensor_sbhd(R.qo.data, c.dt, (int64_t)1 << 32, (int64_t)1 << 32, 4, 64);
        nq.k_weight = NULL;
        nq.q_rstd = rq;
        expect(fusedrope_norm_forward_qk(R.cache, c.style, NULL, &nq, &hq, &hqo, NULL, NULL,
                                         NULL),
               FUSEDROPE_ERR_RANGE, "q_in spans more memory", "tokens x heads past int64");
        expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &nq, &hq, &hq, &hqo, NULL,
                                          NULL, NULL, NULL),
               FUSEDROPE_ERR_RANGE, "dq_out spans more memory",
               "backward: tokens x heads past int64");
    }
    /* nothing written by any refused call */
    ck_assert(tu_changed(&R.qob, &snap, NULL) == 0);

    /* backward: rstd required, dw without a weight, dw overlapping */
    R.norm.q_rstd = NULL;
    expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo, &R.k,
                                      &R.ko, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "rstd", "backward without rstd");
    R.norm.q_rstd = rq;
    R.norm.k_rstd = tu_alloc(sizeof(float) * (size_t)(R.tokens * c.hk));
    R.norm.dq_weight = rq;
    expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo, &R.k,
                                      &R.ko, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "dq_weight", "dw over rstd");
    R.norm.dq_weight = (float *)R.qo.data;
    expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo, &R.k,
                                      &R.ko, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "dq_weight", "dw over dy");
    R.norm.dq_weight = tu_alloc(sizeof(float) * 64);
    R.norm.dk_weight = R.norm.dq_weight + 8;
    expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo, &R.k,
                                      &R.ko, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "weight", "dw over dw");
    R.norm.dk_weight = NULL;
    {
        /* the backward reads rstd, but an rstd array still shares no byte
         * with anything else (the man page's rule, as in the forward): the
         * other rstd, a saved tensor, dy, the range word */
        float *krs = R.norm.k_rstd;
        fusedrope_positions P;
        R.norm.k_rstd = rq + 1;
        expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo,
                                          &R.k, &R.ko, &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "rstd", "backward: rstd over rstd");
        R.norm.k_rstd = krs;
        R.norm.q_rstd = (float *)R.q.data;
        expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo,
                                          &R.k, &R.ko, &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "q_rstd", "backward: rstd inside q_saved");
        R.norm.q_rstd = (float *)R.ko.data;
        expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo,
                                          &R.k, &R.ko, &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "q_rstd", "backward: rstd inside dk");
        R.norm.q_rstd = rq;
        fusedrope_positions_init(&P);
        P.range_status = (int32_t *)R.norm.dq_weight + 3;
        expect(fusedrope_norm_backward_qk(R.cache, c.style, &P, &R.norm, &R.q, &R.qo, &R.qo,
                                          &R.k, &R.ko, &R.ko, NULL),
               FUSEDROPE_ERR_INVALID, "range_status", "backward: range word inside dq_weight");
    }
    {
        /* a NULL saved, dy or dx tensor, and k_saved NULL where dk is
         * given: named, nothing written (dx, dk, dw) */
        static const char *const which[4] = { "q_saved is NULL", "dq_out is NULL",
                                               "dq_in is NULL", "k_saved is NULL" };
        float *dwq = R.norm.dq_weight;
        const float dw_keep = 3.5f;
        tu_buf qsnap, ksnap;
        for (int i = 0; i < 64; i++)
            dwq[i] = dw_keep;
        qsnap = tu_buf_copy(&R.qob);
        ksnap = tu_buf_copy(&R.kob);
        for (int i = 0; i < 4; i++)
            expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm,
                                              i == 0 ? NULL : &R.q, i == 1 ? NULL : &R.qo,
                                              i == 2 ? NULL : &R.qo, i == 3 ? NULL : &R.k,
                                              &R.ko, &R.ko, NULL),
                   FUSEDROPE_ERR_INVALID, which[i], which[i]);
        ck_assert(tu_changed(&R.qob, &qsnap, NULL) == 0);
        ck_assert(tu_changed(&R.kob, &ksnap, NULL) == 0);
        for (int i = 0; i < 64; i++)
            ck_assert_msg(dwq[i] == dw_keep, "dq_weight[%d] written", i);
    }
    R.norm.saved_output = 2;
    expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo, &R.k,
                                      &R.ko, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "saved_output", "saved_output 2");
    R.norm.saved_output = 0;
    /* the saved tensor partially overlapping dx */
    bad = R.qo;
    bad.data = (char *)R.qo.data + 2;
    expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &bad, &R.q, &R.qo, &R.k,
                                      &R.ko, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "overlap", "saved over dx");
    R.norm.weight = FUSEDROPE_NORM_WEIGHT_NONE;
    R.norm.q_weight = R.norm.k_weight = NULL;
    expect(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &R.qo, &R.qo, &R.k,
                                      &R.ko, &R.ko, NULL),
           FUSEDROPE_ERR_INVALID, "WEIGHT_NONE", "dw without a weight");
    ref_rope_free(&R.ref);
    tu_free_all();
}
END_TEST

/* A q-only norm forward the library must refuse (INVALID, its sentence
 * naming `needle`). */
static void refused_forward(const fusedrope_cache *cache, const fusedrope_positions *pos,
                            const fusedrope_norm *nm, const fusedrope_tensor *q,
                            const fusedrope_tensor *qo, const char *needle, const char *what)
{
    expect(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, pos, nm, q, qo, NULL, NULL, NULL),
           FUSEDROPE_ERR_INVALID, needle, what);
}

/* The hand-written small cases' cache (head_dim d, 16 positions, CPU) and
 * float32 inputs: x[i] = i % 7 - 3, w[i] = 1 + i / 64. */
static fusedrope_cache *small_case(float *x, int64_t n, float *w, int64_t d)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)d, 16, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(i % 7) - 3.0f;
    for (int64_t i = 0; i < d; i++)
        w[i] = 1.0f + (float)i / 64.0f;
    return cache;
}

/* Every overlap the norm refuses is refused where only one element of
 * each range is shared (the first of one, the last of the other), every
 * enum's both ends, and every k array of a call without k: a mutation run
 * found each of these checks one element short, or missing, with every
 * other test passing. */
START_TEST(test_refusals_at_range_ends)
{
    enum { B = 2, S = 3, H = 2, D = 64, N = B * S * H * D, ROWS = B * S * H };
    fusedrope_cache *cache;
    fusedrope_norm nm;
    fusedrope_positions P;
    fusedrope_tensor q, qo, tdy, tdx;
    float *x = tu_alloc(sizeof(float) * N), *w = tu_alloc(sizeof(float) * D);
    float *rq = tu_alloc(sizeof(float) * ROWS), *dqw = tu_alloc(sizeof(float) * D);
    float *dkw = tu_alloc(sizeof(float) * D);
    float *buf = tu_alloc(sizeof(float) * (N + ROWS + 2 * D));
    uint16_t *hb = tu_alloc(2 * (size_t)(N + 2 * D));
    uint16_t *hx = tu_alloc(2 * (size_t)N);
    int64_t *area = tu_alloc(sizeof(int64_t) * (B * S + ROWS + 8));

    cache = small_case(x, N, w, D);
    for (int i = 0; i < N; i++)
        hx[i] = ref_double_to_bf16(x[i]);
    q = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, B, S, H, D);
    fusedrope_norm_init(&nm);
    nm.weight = FUSEDROPE_NORM_WEIGHT;
    nm.q_weight = w;

    /* rstd from q_out's last element on; q_out from rstd's last on */
    qo = fusedrope_tensor_bshd(buf, FUSEDROPE_FLOAT32, B, S, H, D);
    nm.q_rstd = buf + N - 1;
    refused_forward(cache, NULL, &nm, &q, &qo, "q_rstd",
                    "rstd from q_out's last element");
    nm.q_rstd = buf;
    qo.data = buf + ROWS - 1;
    refused_forward(cache, NULL, &nm, &q, &qo, "q_rstd",
                    "q_out from rstd's last element");
    /* a weight's last element q_out's first, and the other way round */
    nm.q_rstd = rq;
    qo.data = buf + D;
    nm.q_weight = buf + 1;
    refused_forward(cache, NULL, &nm, &q, &qo, "q_weight",
                    "weight's last element q_out's first");
    qo.data = buf;
    nm.q_weight = buf + N - 1;
    refused_forward(cache, NULL, &nm, &q, &qo, "q_weight",
                    "weight from q_out's last element");
    nm.q_weight = w;
    /* 16-bit weights: the same, a half-size element */
    {
        fusedrope_tensor hq = fusedrope_tensor_bshd(hx, FUSEDROPE_BFLOAT16, B, S, H, D);
        fusedrope_tensor hqo = fusedrope_tensor_bshd(hb + D, FUSEDROPE_BFLOAT16, B, S, H, D);
        fusedrope_norm hn = nm;
        int32_t *word = (int32_t *)(void *)area;
        hn.weight_dtype = FUSEDROPE_BFLOAT16;
        hn.q_weight = hb + 1;
        hn.q_rstd = rq;
        refused_forward(cache, NULL, &hn, &hq, &hqo, "q_weight",
                    "bf16 weight's last element q_out's first");
        /* a weight from byte 2 of the range word the CUDA kernels may write */
        hqo.data = hb;
        hn.q_weight = (uint16_t *)(void *)word + 1;
        fusedrope_positions_init(&P);
        P.range_status = word;
        refused_forward(cache, &P, &hn, &hq, &hqo, "range_status",
                    "bf16 weight from the range word's byte 2");
    }
    /* rstd from the last id, the last offset, cu_seqlens[num_seqs] on */
    qo.data = buf;
    memset(area, 0, sizeof(int64_t) * (B * S + ROWS + 8));
    fusedrope_positions_init(&P);
    P.ids = area;
    nm.q_rstd = (float *)(void *)(area + B * S - 1);
    refused_forward(cache, &P, &nm, &q, &qo, "pos->ids",
                    "rstd from the last id");
    fusedrope_positions_init(&P);
    P.offsets = area;
    nm.q_rstd = (float *)(void *)(area + B - 1);
    refused_forward(cache, &P, &nm, &q, &qo, "pos->offsets",
                    "rstd from the last offset");
    {
        /* the rows in k, q of no heads: the positions are k's */
        fusedrope_tensor eq = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, B, S, 0, D);
        fusedrope_norm kn = nm;
        fusedrope_positions_init(&P);
        P.ids = area;
        kn.q_rstd = NULL;
        kn.k_weight = w;
        kn.k_rstd = (float *)(void *)(area + B * S - 1);
        expect(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, &P, &kn, &eq, &eq, &q, &qo, NULL),
               FUSEDROPE_ERR_INVALID, "k_rstd overlaps pos->ids", "k_rstd from the last id");
    }
    {
        fusedrope_tensor tq = fusedrope_tensor_thd(x, FUSEDROPE_FLOAT32, B * S, H, D);
        fusedrope_tensor tqo = fusedrope_tensor_thd(buf, FUSEDROPE_FLOAT32, B * S, H, D);
        int32_t *cu = (int32_t *)(void *)area;
        cu[0] = 0, cu[1] = S, cu[2] = B * S;
        fusedrope_positions_init(&P);
        P.cu_seqlens = cu;
        P.num_seqs = 2;
        nm.q_rstd = (float *)(void *)(cu + 2);
        refused_forward(cache, &P, &nm, &tq, &tqo, "pos->cu_seqlens",
                    "rstd from cu_seqlens[num_seqs]");
        ck_assert_int_eq(cu[2], B * S);
    }
    /* the enums past either end */
    nm.q_rstd = rq;
    nm.weight = (fusedrope_norm_weight)-1;
    refused_forward(cache, NULL, &nm, &q, &qo, "norm->weight is -1",
                    "weight kind -1");
    nm.weight = FUSEDROPE_NORM_WEIGHT;
    nm.rounding = (fusedrope_norm_rounding)(FUSEDROPE_NORM_ROUND_GEMMA + 1);
    refused_forward(cache, NULL, &nm, &q, &qo, "norm->rounding",
                    "rounding past ROUND_GEMMA");
    nm.rounding = FUSEDROPE_NORM_ROUND_ONCE;

    /* k arrays of a call without k, a k_out without k_in, a dk_in alone, a
     * k_saved alone */
    ck_assert_msg(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, NULL, NULL,
                                            NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    nm.k_rstd = rq; /* the check names k_rstd before any overlap */
    expect(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, NULL, NULL, NULL),
           FUSEDROPE_ERR_INVALID, "k_rstd is set but the call has no k tensor",
           "k_rstd on a q-only forward");
    nm.k_rstd = NULL;
    expect(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, NULL, &qo, NULL),
           FUSEDROPE_ERR_INVALID, "k_in", "k_out without k_in");
    tdy = fusedrope_tensor_bshd(buf + N, FUSEDROPE_FLOAT32, 1, 1, 1, D); /* unused: refused first */
    tdx = q;
    nm.dq_weight = dqw;
    for (int i = 0; i < D; i++)
        dkw[i] = 12345.0f;
    nm.dk_weight = dkw;
    expect(fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, &tdx, NULL, NULL,
                                      NULL, NULL),
           FUSEDROPE_ERR_INVALID, "dk_weight is set but the call has no k tensor",
           "dk_weight on a q-only backward");
    for (int i = 0; i < D; i++)
        ck_assert(dkw[i] == 12345.0f);
    nm.dk_weight = NULL;
    expect(fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, &tdx, NULL, NULL,
                                      &tdy, NULL),
           FUSEDROPE_ERR_INVALID, "k_saved is NULL", "dk_in alone");
    expect(fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, &tdx, &q, NULL,
                                      NULL, NULL),
           FUSEDROPE_ERR_INVALID, "dk_out", "k_saved alone");
    tu_free_all();
}
END_TEST

/* The norm forward of x (S tokens of H heads of D channels, float32 values)
 * in bfloat16 and float16, each rounding, weight w (float32) or none: pair
 * `pair`'s two channels are NaN in every row of the positions in
 * nan_positions (a bit each) and in no other. */
static void nan_pair_forward(const fusedrope_cache *cache, const float *x, const float *w,
                             int S, int H, int D, int pair, unsigned nan_positions,
                             const char *what)
{
    const int N = S * H * D;
    uint16_t *hx = tu_alloc(2 * (size_t)N), *hy = tu_alloc(2 * (size_t)N);
    for (int dt = 0; dt < 2; dt++) {
        const fusedrope_dtype t = dt ? FUSEDROPE_FLOAT16 : FUSEDROPE_BFLOAT16;
        fusedrope_tensor hq = fusedrope_tensor_bshd(hx, t, 1, S, H, D);
        fusedrope_tensor hqo = fusedrope_tensor_bshd(hy, t, 1, S, H, D);
        for (int i = 0; i < N; i++)
            hx[i] = dt ? ref_double_to_half(x[i]) : ref_double_to_bf16(x[i]);
        for (int rnd = 0; rnd < 3; rnd++) {
            fusedrope_norm hn;
            fusedrope_norm_init(&hn);
            if (w) {
                hn.weight = FUSEDROPE_NORM_WEIGHT;
                hn.weight_dtype = FUSEDROPE_FLOAT32;
                hn.q_weight = w;
            }
            hn.rounding = (fusedrope_norm_rounding)rnd;
            ck_assert_msg(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &hn, &hq, &hqo,
                                                    NULL, NULL, NULL) == FUSEDROPE_OK,
                          "%s: %s", what, fusedrope_last_error());
            for (int r = 0; r < S * H; r++)
                for (int c = pair; c < D; c += D / 2) {
                    const uint16_t v = hy[r * D + c];
                    const double f = dt ? ref_half_to_double(v) : ref_bf16_to_double(v);
                    const int want = (nan_positions >> (r / H) & 1u) != 0;
                    ck_assert_msg((isnan(f) != 0) == want,
                                  "%s, %s rounding %d row %d channel %d: 0x%04x, want %s", what,
                                  dt ? "fp16" : "bf16", rnd, r, c, (unsigned)v,
                                  want ? "NaN" : "no NaN");
                }
        }
    }
}

/* A k of no heads beside a q with rows: k's weight gradient is an empty
 * sum, 0, written (the general path's zeroing; only both tensors empty was
 * tested).  A NaN weight whose payload fills the mantissa (0x7fffffff, a
 * float32 weight beside 16-bit tensors) gives NaN in its channel pair, in
 * each rounding: the vector rows' narrowing without a NaN case once gave
 * -0 there (the rounding's carry into the sign), which only the check of
 * the weights' finiteness keeps from them; the same NaN in a caller's cos
 * table; and in every weight. */
START_TEST(test_empty_k_and_nan_weight)
{
    enum { S = 4, H = 4, D = 64, N = S * H * D };
    fusedrope_cache *cache;
    fusedrope_norm nm;
    float *x = tu_alloc(sizeof(float) * N), *y = tu_alloc(sizeof(float) * N);
    float *dy = tu_alloc(sizeof(float) * N), *dx = tu_alloc(sizeof(float) * N);
    float *w = tu_alloc(sizeof(float) * D), *rq = tu_alloc(sizeof(float) * S * H);
    float *dqw = tu_alloc(sizeof(float) * D), *dkw = tu_alloc(sizeof(float) * D);
    float *kx = tu_alloc(sizeof(float) * D);
    const uint32_t nan_bits = 0x7fffffffu;
    fusedrope_tensor q, qo, tdy, tdx, k;

    cache = small_case(x, N, w, D);
    for (int i = 0; i < N; i++)
        dy[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < D; i++)
        dkw[i] = 12345.0f;
    q = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, 1, S, H, D);
    qo = fusedrope_tensor_bshd(y, FUSEDROPE_FLOAT32, 1, S, H, D);
    tdy = fusedrope_tensor_bshd(dy, FUSEDROPE_FLOAT32, 1, S, H, D);
    tdx = fusedrope_tensor_bshd(dx, FUSEDROPE_FLOAT32, 1, S, H, D);
    k = fusedrope_tensor_bshd(kx, FUSEDROPE_FLOAT32, 1, S, 0, D);
    fusedrope_norm_init(&nm);
    nm.weight = FUSEDROPE_NORM_WEIGHT;
    nm.q_weight = nm.k_weight = w;
    nm.q_rstd = rq;
    ck_assert_msg(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, &k, &k,
                                            NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    nm.dq_weight = dqw;
    nm.dk_weight = dkw;
    ck_assert_msg(fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &tdy, &tdx, &k,
                                             &k, &k, NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    for (int i = 0; i < D; i++)
        ck_assert_msg(dkw[i] == 0.0f && !signbit(dkw[i]), "dk_weight[%d] = %g, want 0", i,
                      (double)dkw[i]);

    memcpy(&w[5], &nan_bits, sizeof nan_bits);
    nan_pair_forward(cache, x, w, S, H, D, 5, ~0u, "weight NaN");
    {
        /* the same NaN in a caller's table (fusedrope_cache_create_from_table):
         * its cos of pair 0 at positions 0 and 2; the rows' test of a
         * NaN-free cache must not take it for one (which gave -0) */
        enum { HALF = D / 2 };
        float *cs = tu_alloc(sizeof(float) * S * HALF), *sn = tu_alloc(sizeof(float) * S * HALF);
        fusedrope_cache *tc;
        for (int p = 0; p < S; p++)
            for (int i = 0; i < HALF; i++) {
                cs[p * HALF + i] = 1.0f;
                sn[p * HALF + i] = 0.0f;
            }
        memcpy(&cs[0], &nan_bits, sizeof nan_bits);
        memcpy(&cs[2 * HALF], &nan_bits, sizeof nan_bits);
        ck_assert_int_eq(fusedrope_cache_create_from_table(cs, sn, S, D, CPU, &tc), FUSEDROPE_OK);
        tu_track(tc);
        nan_pair_forward(tc, x, NULL, S, H, D, 0, 1u << 0 | 1u << 2, "table NaN");
    }
    /* and in every weight: no finite weight factor for the vector rows'
     * test of finite weights to find */
    for (int i = 0; i < D; i++)
        memcpy(&w[i], &nan_bits, sizeof nan_bits);
    nan_pair_forward(cache, x, w, S, H, D, 0, (1u << S) - 1, "every weight NaN");
    nan_pair_forward(cache, x, w, S, H, D, D / 2 - 1, (1u << S) - 1, "every weight NaN");
    tu_free_all();
}
END_TEST

/* No tokens: nothing to do, and a weight gradient is zero. */
START_TEST(test_empty)
{
    tu_rng r;
    ncase c;
    run R;
    float dw[64];
    fusedrope_tensor dq;
    tu_rng_init(&r, 800);
    memset(&c, 0, sizeof c);
    c.dt = FUSEDROPE_FLOAT32;
    c.weight = 1;
    c.layout = LAY_BSHD;
    c.s = 0;
    c.b = 2;
    c.hq = 4;
    c.hd = 64;
    c.rot_dim = 64;
    setup(&R, &c, &r);
    ck_assert_int_eq(forward(&R, &c), FUSEDROPE_OK);
    memset(dw, 0xff, sizeof dw);
    R.norm.q_rstd = (float *)dw; /* never read: no rows */
    R.norm.dq_weight = dw;
    R.norm.q_rstd = tu_alloc(4);
    dq = R.q;
    ck_assert_msg(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &dq, &dq,
                                             NULL, NULL, NULL, NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    for (int i = 0; i < 64; i++)
        ck_assert(dw[i] == 0.0f && !signbit(dw[i]));
    /* no rows, no rstd: NULL serves, as for an empty tensor's data */
    memset(dw, 0xff, sizeof dw);
    R.norm.q_rstd = NULL;
    ck_assert_msg(fusedrope_norm_backward_qk(R.cache, c.style, NULL, &R.norm, &R.q, &dq, &dq,
                                             NULL, NULL, NULL, NULL) == FUSEDROPE_OK,
                  "NULL rstd of no rows: %s", fusedrope_last_error());
    for (int i = 0; i < 64; i++)
        ck_assert(dw[i] == 0.0f && !signbit(dw[i]));
    ref_rope_free(&R.ref);
    tu_free_all();
}
END_TEST

/* An empty view touches no memory, whatever its data pointer and strides
 * (as for the plain calls), so it takes no part in the overlap test: each
 * empty view here points into an array the call writes (q_rstd) or reads
 * (the weight), with strides whose span, were it taken, would cover it.  A
 * k of no heads beside a q with rows; q with no tokens (seq_len 0, then
 * batch 0).  Nothing is written. */
START_TEST(test_empty_views_touch_nothing)
{
    enum { S = 4, H = 4, D = 64, N = S * H * D };
    fusedrope_cache *cache;
    fusedrope_norm nm;
    float *x = tu_alloc(sizeof(float) * N), *y = tu_alloc(sizeof(float) * N);
    float *w = tu_alloc(sizeof(float) * D), *w0 = tu_alloc(sizeof(float) * D);
    float *rq = tu_alloc(sizeof(float) * S * H);
    fusedrope_tensor q, qo, k;

    cache = small_case(x, N, w, D);
    memcpy(w0, w, sizeof(float) * D);
    fusedrope_norm_init(&nm);
    nm.weight = FUSEDROPE_NORM_WEIGHT;
    nm.q_weight = nm.k_weight = w;
    nm.q_rstd = rq;
    q = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, 1, S, H, D);
    qo = fusedrope_tensor_bshd(y, FUSEDROPE_FLOAT32, 1, S, H, D);
    /* its span would be q_rstd's first byte and (S - 1) * D floats on */
    k = fusedrope_tensor_bshd(rq, FUSEDROPE_FLOAT32, 1, S, 0, D);
    k.stride_seq = D;
    ck_assert_msg(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &q, &qo, &k, &k,
                                            NULL) == FUSEDROPE_OK,
                  "a k of no heads over q_rstd: %s", fusedrope_last_error());
    nm.k_weight = NULL;
    for (int e = 0; e < 2; e++) {
        /* q_out's span would be 3 * D floats from the weight's first */
        const int64_t b = e ? 0 : 1, s = e ? S : 0;
        fusedrope_tensor eq = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, b, s, H, D);
        fusedrope_tensor eo = fusedrope_tensor_bshd(w, FUSEDROPE_FLOAT32, b, s, H, D);
        eo.stride_head = 2 * D;
        ck_assert_msg(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &eq, &eo, NULL,
                                                NULL, NULL) == FUSEDROPE_OK,
                      "q with %s 0 over the weight: %s", e ? "batch" : "seq_len",
                      fusedrope_last_error());
        ck_assert_msg(memcmp(w, w0, sizeof(float) * D) == 0, "the weight was written");
    }
    tu_free_all();
}
END_TEST

static Suite *norm_suite(void)
{
    Suite *s = suite_create("norm");
    TCase *tc = tcase_create("forward");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_forward_matrix, 0, 54);
    tcase_add_loop_test(tc, test_forward_packed_qkv, 0, 3);
    tcase_add_loop_test(tc, test_unfused_literal, 0, 18);
#ifdef FR_HAVE_AVX2
    tcase_add_loop_test(tc, test_avx2_rows_match_portable, 0, 6);
    tcase_add_loop_test(tc, test_avx2_backward_rows_match_portable, 0, 6);
#endif
    suite_add_tcase(s, tc);
    tc = tcase_create("backward");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_backward_matrix, 0, 54);
    tcase_add_loop_test(tc, test_backward_dw_chunks, 0, 10);
    tcase_add_loop_test(tc, test_backward_cancelling, 0, 8);
    tcase_add_loop_test(tc, test_rope_types_and_axes, 0, 4 * (ROPE_KINDS - 1));
    tcase_add_loop_test(tc, test_reference_finite_differences, 0, 12);
    tcase_add_loop_test(tc, test_threads_determinism, 0, 6);
    suite_add_tcase(s, tc);
    tc = tcase_create("refusals");
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_cache_num_threads);
    tcase_add_test(tc, test_calls_in_caller_region);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_empty_views_touch_nothing);
    tcase_add_test(tc, test_refusals_at_range_ends);
    tcase_add_test(tc, test_empty_k_and_nan_weight);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
#ifdef FR_HAVE_AVX2
    printf("test_norm: %s\n",
           fr_avx512_usable()
               ? "AVX-512 F/BW/VL in use: the norm's rows compared on three paths"
               : "this CPU (or its OS, or valgrind) lacks AVX-512 F/BW/VL: the norm's "
                 "AVX-512 rows are not compared (their default path is the AVX2 one)");
#endif
    return tu_main(norm_suite(), "test_norm");
}
