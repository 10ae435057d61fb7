/*
 * fuzz_norm.c - libFuzzer target for the fused per-head RMSNorm + RoPE:
 * fusedrope_norm_forward_qk and fusedrope_norm_backward_qk (the contract is
 * man/fusedrope_norm_forward_qk.3).
 *
 * The input bytes choose, through tests/fuzz/decode.c (the decoding of
 * fuzz_apply.c): a cache (every rope type, a user table, position axes),
 * q and optionally k tensors (in place, out of place, strides, partial
 * overlaps, packed views, bad shapes) and positions (ids, ids rows, offsets,
 * cu_seqlens, context parallelism); decode.c's model gives the statuses the
 * plain rules allow.  Then a fusedrope_norm: weight kind NONE / WEIGHT /
 * WEIGHT_PLUS_ONE or an unknown one, rounding ONCE / LLAMA / GEMMA or an
 * unknown one, eps (1e-6, 0, negative, NaN, +-Inf, tiny, 0 or Inf as a
 * float32), weight dtype (the tensors', float32, another, unknown), weights
 * present or missing or given with NONE, rstd arrays present or missing, in
 * their own memory, inside a tensor buffer (overlapping an input or an
 * output, or not), overlapping a weight or each other, misaligned; a poisoned
 * dq_weight the forward must ignore; struct_size right or not.  The model
 * adds the norm's rules (ERRORS in the man page) to the plain ones.
 *
 * Forward: a refused call must leave every tensor byte, weight, rstd and dw
 * array untouched; an accepted one writes only the outputs' elements and
 * rstd, and each row is judged against ref_norm_forward (tests/ref.c,
 * float64, axes-aware) within ref_norm_y_tolerance / _rstd_tolerance, the
 * bounds of tests/test_norm.c.  Rows the float32 contract sends elsewhere
 * are judged by IEEE rules: a NaN in the row gives rstd NaN and a NaN row; an
 * infinity, or a sum of squares past FLT_MAX, gives rstd 0 and outputs that
 * are 0 or NaN (NaN in each pair holding the infinity), and so does mean +
 * eps past FLT_MAX (a huge eps).  Rows at the float32 edges (sum of squares
 * or mean + eps near FLT_MAX, mean + eps below 2^-100) and elements beyond a
 * quarter of the dtype's range are not value-checked.  An accepted forward
 * runs again on each other CPU path (fz_cpu_path: the AVX2 rows alone, the
 * portable loops, streamed outputs, a team of threads), from the same
 * inputs, and must give the same bytes and rstd (a NaN element NaN in both;
 * not where rstd lies in a tensor buffer).
 *
 * Backward (after an accepted forward, 3 times in 4): the saved x (a copy of
 * the forward's input) or y (saved_output 1), a random dq_out, dq_in in place
 * over dq_out, over the saved tensor, in its own buffer, partially overlapping
 * the saved tensor, or of another shape or dtype; rstd from the forward or
 * missing; dq_weight / dk_weight or not; saved_output 0, 1 or bad.  Accepted:
 * dq_in against ref_norm_backward (with the forward's rstd) within
 * ref_norm_dx_tolerance, dw within ref_norm_dw_tolerance; with the saved y
 * and a weight w' = 0 in a channel the row's dq_in must be NaN and that
 * channel's dw not finite (the man page: "become NaN").  An accepted
 * backward runs again on each other CPU path: dq_in and dw the same bytes
 * (a NaN element NaN in both), nothing else written.
 *
 * Any disagreement aborts (a libFuzzer crash).  FUSEDROPE_FUZZ_VERBOSE=1
 * prints each call's status and trace.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

const char *fz_name = "fuzz_norm";

/* What the inputs reached (FUSEDROPE_FUZZ_STATS=1 prints it at exit). */
static struct {
    unsigned long fwd, fwd_ok, fwd_rows, nan_rows, inf_rows, bwd, bwd_ok, bwd_rows, nan_dx_rows,
        dw_checked, bwd_reruns;
} stats;

static void print_stats(void)
{
    fprintf(stderr, "fuzz_norm: %lu forward calls, %lu accepted, %lu rows value-checked (%lu NaN "
            "rows, %lu rows past FLT_MAX); %lu backward calls, %lu accepted, %lu rows "
            "value-checked, %lu NaN rows (w' = 0), %lu dw arrays checked, %lu reruns on "
            "other CPU paths\n", stats.fwd, stats.fwd_ok, stats.fwd_rows, stats.nan_rows,
            stats.inf_rows, stats.bwd, stats.bwd_ok, stats.bwd_rows, stats.nan_dx_rows,
            stats.dw_checked, stats.bwd_reruns);
}

/* ------------------------------------------------------------ memory */

#define OWN_BASE 16 /* regions: tensor buffers 0..MAXBUF-1, own allocations OWN_BASE + i */
#define MAX_OWN 8

typedef struct {
    unsigned char *p, *snap;
    size_t size;
} own_t;

/* An array of the norm: a weight (read), rstd (written by the forward), dw. */
typedef struct {
    const char *name;
    unsigned char *p; /* NULL: not given */
    size_t bytes, es;
    int region;
    size_t off;
    int written;
    int stand_in; /* its real extent is too large (or not a size): FZ_SMALL bytes */
} extra_t;

enum { EX_QW, EX_KW, EX_QR, EX_KR, EX_FDW, EX_N };

typedef struct {
    own_t own[MAX_OWN];
    int nown;
    extra_t ex[EX_N];
    fusedrope_norm nm;
    unsigned char *nmbuf; /* the struct as passed (a larger zeroed block) */
    int nm_null;
    int kind, rounding, wdt;
    double eps;
    size_t wes;
} nrun;

static unsigned char *own_new(nrun *R, size_t n, int *region)
{
    own_t *o;
    if (R->nown >= MAX_OWN)
        abort();
    o = &R->own[R->nown];
    o->size = n;
    o->p = malloc(n ? n : 1);
    o->snap = malloc(n ? n : 1);
    if (!o->p || !o->snap)
        abort();
    memset(o->p, 0xff, n); /* poison: NaN floats */
    *region = OWN_BASE + R->nown++;
    return o->p;
}

static unsigned char *region_base(const fz_call *fc, const nrun *R, int region)
{
    return region >= OWN_BASE ? R->own[region - OWN_BASE].p : fc->bufs[region].p;
}

static size_t region_size(const fz_call *fc, const nrun *R, int region)
{
    return region >= OWN_BASE ? R->own[region - OWN_BASE].size : fc->bufs[region].size;
}

/* Places extra e (bytes of es-byte elements): own memory (how 0), inside a
 * tensor buffer (1), onto another extra's memory (2); misaligned when asked. */
static void place(src_t *s, fz_call *fc, nrun *R, extra_t *e, unsigned how, int misalign,
                  const extra_t *onto)
{
    if (how == 1 && fc->nbuf > 0) {
        int b = (int)(u8(s) % (unsigned)fc->nbuf);
        size_t room = fc->bufs[b].size;
        if (e->bytes + e->es <= room) {
            e->region = b;
            e->off = ((size_t)u16(s) * e->es) % (room - e->bytes - e->es + 1);
            e->off -= e->off % e->es;
            if (misalign && e->es > 1)
                e->off += 1;
            e->p = fc->bufs[b].p + e->off;
            return;
        }
    }
    if (how == 2 && onto && onto->p && onto->bytes >= e->bytes + e->es) {
        e->region = onto->region;
        e->off = onto->off + (size_t)(u8(s) % 4) * e->es;
        if (misalign && e->es > 1)
            e->off += 1;
        if (e->off + e->bytes > region_size(fc, R, e->region))
            e->off = onto->off;
        e->p = region_base(fc, R, e->region) + e->off;
        return;
    }
    e->p = own_new(R, e->bytes + e->es + (misalign ? 1 : 0), &e->region);
    e->off = 0;
    if (misalign && e->es > 1) {
        e->off = 1;
        e->p += 1;
    }
}

/* ------------------------------------------------------------- decoding */

static double pick_eps(src_t *s)
{
    static const double v[] = { 1e-5, 1e-6, 0.0, -1e-6, NAN, INFINITY, -INFINITY,
                                1e-45, /* a float32 subnormal */
                                1e-46, /* 0 as a float32 */
                                1e-300, 1e39 /* Inf as a float32 */, 3e38, 0.5, 1e-12,
                                DBL_MIN, 5e-324, -0.0, 1.0 };
    unsigned b = u8(s);
    if (b < 160)
        return 1e-6;
    return v[b % (sizeof v / sizeof v[0])];
}

static int pick_enum(src_t *s, int n)
{
    unsigned b = u8(s);
    if (b < 244)
        return (int)(b % (unsigned)n);
    return b & 1 ? -1 : n + (int)(b % 5);
}

/* ------------------------------------------------------------- the model */

static int ranges_meet(size_t a0, size_t an, size_t b0, size_t bn)
{
    return an && bn && a0 < b0 + bn && b0 < a0 + an;
}

/* The norm's arrays against the tensors, the position arrays and each other
 * (written arrays share no byte with anything; weights no byte with an
 * output); alignment.  hard: whether a broken rule must refuse the call. */
static void extras_model(fz_call *fc, nrun *R, int hard)
{
    const int mapped = fc->any_nonempty && fc->all_valid && !fc->forced;
    for (int i = 0; i < EX_N; i++) {
        extra_t *e = &R->ex[i];
        if (!e->p || !e->bytes || i == EX_FDW)
            continue;
        if ((uintptr_t)e->p % e->es)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "%s misaligned", e->name);
        if (e->region < OWN_BASE) {
            const buf_t *bf = &fc->bufs[e->region];
            unsigned bits = e->written ? 0xf : 0xa;
            int hit = 0, near = 0;
            if (!mapped) {
                near = 1; /* the views' bytes are not known: either answer */
            } else {
                for (size_t j = e->off; j < e->off + e->bytes; j++)
                    if (bf->map[j] & bits)
                        hit = 1;
                for (int k = 0; k < 2 * fc->count; k++) {
                    const tspec *t = &fc->ts[k];
                    if (t->buf == e->region && ((1u << k) & bits) && mappable(t) &&
                        ranges_meet(t->off, (size_t)t->ext, e->off, e->bytes))
                        near = 1;
                }
                if (hit)
                    reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "%s shares bytes with a tensor%s",
                           e->name, e->written ? "" : " output");
            }
            if (near && !hit) /* inside a view's address range only: either answer */
                fc->v.soft |= 1u << FUSEDROPE_ERR_INVALID;
            for (int a = 0; a < 3; a++)
                if (e->written && fc->ps.in_buf[a] == e->region + 1 &&
                    ranges_meet(fc->ps.in_off[a], fc->ps.in_bytes[a], e->off, e->bytes))
                    reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "%s over position array %d",
                           e->name, a);
        }
        for (int j = 0; j < i; j++) {
            const extra_t *o = &R->ex[j];
            if (!o->p || j == EX_FDW || o->region != e->region || !(e->written || o->written))
                continue;
            if (ranges_meet(o->off, o->bytes, e->off, e->bytes))
                reason(&fc->v, FUSEDROPE_ERR_INVALID, hard, "%s overlaps %s", e->name, o->name);
        }
    }
}

/* --------------------------------------------------------- forward values */

typedef struct {
    ref_rope rr;
    int ok;
    int64_t *pos; /* [naxes][ntok] */
    int64_t ntok;
} refctx;

static void refctx_init(refctx *X, const cache_t *ct, const fz_call *fc)
{
    const int rows = fc->naxes;
    memset(X, 0, sizeof *X);
    X->ntok = fc->ts[0].t.seq_len * fc->ts[0].t.batch;
    if (ct->type >= 0) {
        if (ref_rope_from_config(&X->rr, &ct->cfg) != 0)
            return;
    } else {
        ref_rope_from_table(&X->rr, ct->tcos, ct->tsin, ct->trows, ct->rot_dim);
    }
    X->pos = malloc(sizeof(int64_t) * (size_t)(X->ntok * rows > 0 ? X->ntok * rows : 1));
    if (!X->pos)
        abort();
    for (int64_t i = 0; i < X->ntok * rows; i++) {
        if (fc->tokpos[i] > INT64_MAX || fc->tokpos[i] < INT64_MIN) {
            free(X->pos);
            X->pos = NULL;
            ref_rope_free(&X->rr);
            return;
        }
        X->pos[i] = (int64_t)fc->tokpos[i];
    }
    X->ok = 1;
}

static void refctx_free(refctx *X)
{
    if (X->ok) {
        ref_rope_free(&X->rr);
        free(X->pos);
    }
}

/* Angle slack for pair i of token k (formula caches; 0 for a table), or -1
 * where the angle is too large for the reference (|p| >= 2^40). */
static double pair_slack(const cache_t *ct, const refctx *X, int64_t k, int i)
{
    int64_t p;
    if (!ct->formula)
        return 0;
    p = X->pos[(ct->has_axes ? (int64_t)ct->axis[i] * X->ntok : 0) + k];
    if (p >= ((int64_t)1 << 40) || p <= -((int64_t)1 << 40))
        return -1;
    return ref_angle_slack((double)p * ct->inv[ct->has_axes ? ct->col[i] : i]);
}

/* The attention factor in the bound: the reference's (for a user table,
 * its largest entry), or where a garbage table makes that infinite, this
 * pair's own entries (at least 1). */
static double pair_attn(const refctx *X, int64_t k, int i)
{
    double c, sn, a = 1;
    if (isfinite(X->rr.attn))
        return X->rr.attn;
    ref_cos_sin_axes(&X->rr, X->pos + k, X->ntok, i, &c, &sn);
    if (fabs(c) > a)
        a = fabs(c);
    if (fabs(sn) > a)
        a = fabs(sn);
    return a;
}

/* The largest |R^T t| a row of t (dy, or a saved y) can give before any
 * cancellation: |cos| |a| + |sin| |b| per pair, |t| past rot_dim.  The
 * backward computes R^T t in float32 first, so where this passes FLT_MAX
 * it overflows although the float64 reference, and even the row's result,
 * may be finite (a tiny weight w' then scales it back). */
static double row_rotated_size(const refctx *X, const fusedrope_tensor *t, int style, int64_t s,
                               int64_t b, int64_t h, int64_t tok)
{
    const int rot = X->rr.rot_dim;
    double m = 0;
    for (int64_t c = rot; c < t->head_dim; c++)
        m = fmax(m, fabs(ref_load(t->data, t->dtype, ref_offset(t, s, b, h, c))));
    for (int i = 0; i < rot / 2; i++) {
        int64_t ca, cb;
        double cs, sn, ma, mb;
        ref_pair((fusedrope_style)style, rot, i, &ca, &cb);
        ref_cos_sin_axes(&X->rr, X->pos + tok, X->ntok, i, &cs, &sn);
        ref_rotate_size(fabs(ref_load(t->data, t->dtype, ref_offset(t, s, b, h, ca))),
                        fabs(ref_load(t->data, t->dtype, ref_offset(t, s, b, h, cb))), cs, sn,
                        &ma, &mb);
        m = fmax(m, fmax(ma, mb));
    }
    return m;
}

static int is_zero_or_nan(double v)
{
    return v == 0 || isnan(v);
}

static double wprime(int kind, const double *w, int64_t c)
{
    return kind == 0 ? 1 : kind == 1 ? w[c] : 1 + w[c];
}

static void load_weights(const nrun *R, int k, int64_t hd, double *w)
{
    const extra_t *e = &R->ex[k ? EX_KW : EX_QW];
    for (int64_t c = 0; c < hd; c++)
        w[c] = R->kind == FUSEDROPE_NORM_WEIGHT_NONE ? 0 : load(e->p + (size_t)c * R->wes, R->wdt);
}

static void check_forward(const cache_t *ct, const fz_call *fc, const nrun *R, const refctx *X,
                          int k)
{
    const tspec *xs = &fc->ts[2 * k], *ys = &fc->ts[2 * k + 1];
    fusedrope_tensor x = xs->t, y = ys->t;
    const int dt = (int)x.dtype, half = ct->half, rot = ct->rot_dim;
    const int64_t hd = x.head_dim, H = x.heads, S = x.seq_len, B = x.batch;
    const int64_t rows = S * B * H;
    const double eps32 = (double)(float)R->eps;
    const double lim = (ref_max_finite(dt) < FLT_MAX ? ref_max_finite(dt) : FLT_MAX) / 4;
    const float *rstd = (const float *)R->ex[k ? EX_KR : EX_QR].p;
    double *out, *v, *rs, *w, *xr;
    const int64_t step = rows > FZ_MAX_ITEMS ? rows / FZ_MAX_ITEMS : 1;

    x.data = fc->bufs[xs->buf].snap + xs->off;
    y.data = fc->bufs[ys->buf].p + ys->off;
    out = malloc(sizeof(double) * (size_t)(rows * hd));
    v = malloc(sizeof(double) * (size_t)(rows * hd));
    rs = malloc(sizeof(double) * (size_t)rows);
    w = malloc(sizeof(double) * (size_t)hd);
    xr = malloc(sizeof(double) * (size_t)hd);
    if (!out || !v || !rs || !w || !xr)
        abort();
    load_weights(R, k, hd, w);
    ref_norm_forward(&X->rr, (fusedrope_style)fc->style, X->pos, &x, R->kind, w, eps32,
                     R->rounding, out, v, rs);

    for (int64_t n = 0; n < rows; n += step) {
        const int64_t h = n % H, tok = n / H, b = tok % B, s = tok / B;
        const int64_t row = (s * B + b) * H + h, ri = (b * S + s) * H + h;
        const double *o = out + row * hd, *vv = v + row * hd;
        int anynan = 0, anyinf = 0;
        double ss = 0, got_r = rstd ? rstd[ri] : 0;
        for (int64_t c = 0; c < hd; c++) {
            xr[c] = ref_load(x.data, x.dtype, ref_offset(&x, s, b, h, c));
            anynan |= isnan(xr[c]);
            anyinf |= isinf(xr[c]);
            ss += xr[c] * xr[c];
        }
#define YAT(c) ref_load(y.data, y.dtype, ref_offset(&y, s, b, h, (c)))
        if (anynan) { /* rstd NaN, every output NaN */
            stats.nan_rows++;
            CHECK(!rstd || isnan(got_r), "%s row (s %lld b %lld h %lld) holds a NaN: rstd %.9g",
                  k ? "k" : "q", (long long)s, (long long)b, (long long)h, got_r);
            for (int64_t c = 0; c < hd; c++)
                CHECK(isnan(YAT(c)), "%s row (s %lld b %lld h %lld) holds a NaN: y[%lld] = %.9g",
                      k ? "k" : "q", (long long)s, (long long)b, (long long)h, (long long)c,
                      YAT(c));
            continue;
        }
        /* mean + eps, which overflows float32 too with a huge eps */
        const double me = ss / (double)hd + eps32;
        if (anyinf || ss >= FLT_MAX * (1 + 0x1p-10) || me >= FLT_MAX * (1 + 0x1p-10)) {
            /* sum of squares or mean + eps Inf: rstd 0, n = x * 0 (NaN where x is Inf) */
            stats.inf_rows++;
            CHECK(!rstd || got_r == 0, "%s row (s %lld b %lld h %lld): sum of squares or mean "
                  "+ eps past FLT_MAX, rstd %.9g (want 0)", k ? "k" : "q", (long long)s,
                  (long long)b, (long long)h, got_r);
            for (int64_t c = 0; c < hd; c++) {
                int inf_pair = isinf(xr[c]);
                if (c < rot) {
                    int i = fc->style == FUSEDROPE_NEOX ? (int)(c % half) : (int)(c / 2);
                    int64_t ca, cb;
                    ref_pair((fusedrope_style)fc->style, rot, i, &ca, &cb);
                    inf_pair = isinf(xr[ca]) || isinf(xr[cb]);
                }
                CHECK(inf_pair ? isnan(YAT(c)) : is_zero_or_nan(YAT(c)),
                      "%s row (s %lld b %lld h %lld): sum of squares or mean + eps past "
                      "FLT_MAX, y[%lld] = %.9g (want %s)", k ? "k" : "q", (long long)s,
                      (long long)b, (long long)h, (long long)c, YAT(c),
                      inf_pair ? "NaN" : "0 or NaN");
            }
            continue;
        }
        if (ss > FLT_MAX * (1 - 0x1p-10) || me > FLT_MAX * (1 - 0x1p-10) || me < 0x1p-100)
            continue; /* float32's edges: either answer */
        stats.fwd_rows++;
        if (rstd)
            CHECK(fabs(got_r - rs[ri]) <= ref_norm_rstd_tolerance(rs[ri]),
                  "%s row (s %lld b %lld h %lld): rstd %.9g, reference %.9g", k ? "k" : "q",
                  (long long)s, (long long)b, (long long)h, got_r, rs[ri]);
        for (int64_t c = 0; c < hd; c++) {
            double mag, flip, slack = 0, tol, got = YAT(c), attn = 1;
            int skip = !isfinite(o[c]) || fabs(o[c]) > lim || !isfinite(vv[c]) ||
                       fabs(vv[c]) > lim;
            if (c < rot) {
                int i = fc->style == FUSEDROPE_NEOX ? (int)(c % half) : (int)(c / 2);
                int64_t ca, cb;
                ref_pair((fusedrope_style)fc->style, rot, i, &ca, &cb);
                skip |= !isfinite(vv[ca]) || !isfinite(vv[cb]) || fabs(vv[ca]) > lim ||
                        fabs(vv[cb]) > lim || !isfinite(o[ca]) || !isfinite(o[cb]);
                mag = fabs(vv[ca]) + fabs(vv[cb]);
                flip = ref_ulp(vv[ca], (fusedrope_dtype)dt) + ref_ulp(vv[cb], (fusedrope_dtype)dt);
                if (!skip) {
                    attn = pair_attn(X, b * S + s, i);
                    slack = pair_slack(ct, X, b * S + s, i);
                    if (slack < 0)
                        continue;
                    if (slack > 0)
                        slack *= attn * mag;
                }
            } else {
                mag = fabs(vv[c]);
                flip = ref_ulp(vv[c], (fusedrope_dtype)dt);
            }
            if (skip)
                continue;
            /* n = x * rstd and v = n * w' are float32s: where they are
             * subnormal their rounding (2^-150 absolute) is no longer
             * relative, and w' (n's) and the rotation scale it.  LLAMA rounds
             * n to the dtype, where a tie may go the other way (test_norm's
             * 3 ulp(v) assume |w'| <= 2 and a normal n): |w'| ulp(n). */
            {
                double sub = 0, llama = 0;
                int64_t ch[2] = { c, -1 };
                if (c < rot) {
                    int i = fc->style == FUSEDROPE_NEOX ? (int)(c % half) : (int)(c / 2);
                    ref_pair((fusedrope_style)fc->style, rot, i, &ch[0], &ch[1]);
                }
                for (int j = 0; j < 2 && ch[j] >= 0; j++) {
                    double wf = fabs(wprime(R->kind, w, ch[j]));
                    sub += (wf + 1) * 0x1p-149;
                    llama += wf * ref_ulp(xr[ch[j]] * rs[ri], (fusedrope_dtype)dt);
                }
                slack += (sub + (R->rounding == FUSEDROPE_NORM_ROUND_LLAMA ? llama : 0)) *
                         (c < rot ? attn : 1);
            }
            tol = ref_norm_y_tolerance(o[c], mag, flip, attn, R->rounding,
                                       (fusedrope_dtype)dt) + slack;
            CHECK(fabs(got - o[c]) <= tol,
                  "%s row (s %lld b %lld h %lld) position %lld channel %lld: y %.9g, reference "
                  "%.9g (v %.9g, rstd %.9g, tolerance %.3g)", k ? "k" : "q", (long long)s,
                  (long long)b, (long long)h, (long long)X->pos[b * S + s], (long long)c, got,
                  o[c], vv[c], rs[ri], tol);
        }
#undef YAT
    }
    free(out);
    free(v);
    free(rs);
    free(w);
    free(xr);
}

/* -------------------------------------------------------------- backward */

typedef struct {
    unsigned char *p, *snap, *map;
    size_t size;
} bbuf;

typedef struct {
    tspec saved, dout, din; /* .buf indexes bb[] */
} bpair;

static int bnew(bbuf *bb, int *n, size_t size)
{
    bbuf *b = &bb[*n];
    b->size = size;
    b->p = malloc(size ? size : 1);
    b->snap = malloc(size ? size : 1);
    b->map = calloc(size ? size : 1, 1);
    if (!b->p || !b->snap || !b->map)
        abort();
    return (*n)++;
}

/* Bytes of view t in its buffer marked with bit; returns whether any was set. */
static int bmark(bbuf *bb, const tspec *t, unsigned bit)
{
    buf_t tmp;
    tspec one = *t; /* mark() indexes its buffer array by buf */
    tmp.map = bb[t->buf].map;
    tmp.p = bb[t->buf].p;
    tmp.snap = NULL;
    tmp.size = bb[t->buf].size;
    one.buf = 0;
    return mark(&tmp, &one, bit, 0);
}

/* From the saved y, n = (R^T y) / w' in float32: the rotation's rounding,
 * 2^-23 (|y_a| + |y_b|) attn per pair, is divided by |w'|, which the
 * fuzzed weights make as small as 2^-27; test_norm's dx bound (for
 * moderate weights) does not hold that.  The bound gets this row's share:
 * en[c] the error of n[c], through dq_in[c] = rstd (dn[c] - n[c] mean) and
 * mean = sum(dn n) / head_dim, with a factor 4 to spare. */
static void saved_y_row(const refctx *X, const fusedrope_tensor *sv, const fusedrope_tensor *dy,
                        int style, int kind, const double *w, int64_t s, int64_t b, int64_t h,
                        int64_t tok, double *en, double *n, double *dn, double *mean_out,
                        double *dmean_out)
{
    const int64_t hd = dy->head_dim;
    const int rot = X->rr.rot_dim, half = rot / 2;
    double mean = 0, dmean = 0;
    for (int64_t c = 0; c < hd; c++) {
        double wf = kind == 0 ? 1 : kind == 1 ? w[c] : 1 + w[c];
        double y = ref_load(sv->data, sv->dtype, ref_offset(sv, s, b, h, c));
        double g = ref_load(dy->data, dy->dtype, ref_offset(dy, s, b, h, c));
        n[c] = y / wf;
        en[c] = fabs(y) * 0x1p-23 / fabs(wf);
        dn[c] = g * wf;
    }
    for (int i = 0; i < half; i++) {
        int64_t ca, cb;
        double cs, sn, ya, yb, ga, gb, wa, wb, e;
        ref_pair((fusedrope_style)style, rot, i, &ca, &cb);
        ref_cos_sin_axes(&X->rr, X->pos + tok, X->ntok, i, &cs, &sn);
        wa = kind == 0 ? 1 : kind == 1 ? w[ca] : 1 + w[ca];
        wb = kind == 0 ? 1 : kind == 1 ? w[cb] : 1 + w[cb];
        ya = n[ca] * wa;
        yb = n[cb] * wb;
        ga = dn[ca] / wa;
        gb = dn[cb] / wb;
        e = (fabs(ya) + fabs(yb)) * 0x1p-22 * (fabs(cs) + fabs(sn));
        n[ca] = (ya * cs + yb * sn) / wa;
        n[cb] = (yb * cs - ya * sn) / wb;
        en[ca] = e / fabs(wa);
        en[cb] = e / fabs(wb);
        dn[ca] = (ga * cs + gb * sn) * wa;
        dn[cb] = (gb * cs - ga * sn) * wb;
    }
    for (int64_t c = 0; c < hd; c++) {
        mean += dn[c] * n[c];
        dmean += fabs(dn[c]) * en[c];
    }
    *mean_out = mean / (double)hd;
    *dmean_out = dmean / (double)hd;
}

/* Before a rerun: the own arrays' first results kept in own_first[] (each
 * to free), and their bytes from before the first run put back. */
static void own_rerun_begin(nrun *R, unsigned char **own_first)
{
    for (int i = 0; i < R->nown; i++) {
        own_first[i] = malloc(R->own[i].size ? R->own[i].size : 1);
        if (!own_first[i])
            abort();
        memcpy(own_first[i], R->own[i].p, R->own[i].size);
        memcpy(R->own[i].p, R->own[i].snap, R->own[i].size);
    }
}

/* The decoded fusedrope_norm_backward_qk (its fusedrope_norm in R->nmbuf). */
static fusedrope_status backward_call(const cache_t *ct, const fz_call *fc, const nrun *R,
                                      const bpair *bp)
{
    return fusedrope_norm_backward_qk(ct->cache, (fusedrope_style)fc->style,
                                      fc->ps.given ? &fc->ps.p : NULL,
                                      (const fusedrope_norm *)(void *)R->nmbuf, &bp[0].saved.t,
                                      &bp[0].dout.t, &bp[0].din.t,
                                      fc->count == 2 ? &bp[1].saved.t : NULL,
                                      fc->count == 2 ? &bp[1].dout.t : NULL,
                                      fc->count == 2 ? &bp[1].din.t : NULL, fc->stream);
}

/* Whether a and b (float32 at p and q, or of dtype dt) are the same bytes or
 * both NaN (a NaN may change its payload between paths). */
static int same_or_nans(const unsigned char *p, const unsigned char *q, size_t es, int dt)
{
    return memcmp(p, q, es) == 0 || (isnan(load(p, dt)) && isnan(load(q, dt)));
}

/* After an accepted backward (on CPU path `path`): every byte of the
 * backward buffers outside dq_in/dk_in (map bit 1) as it was before. */
static void only_din_written(const bbuf *bb, int nb, int path)
{
    for (int i = 0; i < nb; i++)
        for (size_t j = 0; j < bb[i].size; j++)
            CHECK((bb[i].map[j] & 1) || bb[i].p[j] == bb[i].snap[j],
                  "norm_backward_qk (CPU path %d) wrote byte %zu of backward buffer %d, "
                  "outside dq_in", path, j, i);
}

/*
 * An accepted backward again on another CPU path (fz_cpu_path), from the
 * same inputs: dq_in/dk_in and dw the same bytes (dw is a reduction across
 * tokens: its order may depend on neither the SIMD path nor the team,
 * fusedrope_norm_backward_qk(3)), a NaN element a NaN in both runs.
 */
static void rerun_backward(const cache_t *ct, const fz_call *fc, nrun *R, const bpair *bp,
                           bbuf *bb, int nb, int path)
{
    unsigned char *first[8], *own_first[MAX_OWN];
    fusedrope_status st;

    for (int i = 0; i < nb; i++) {
        first[i] = malloc(bb[i].size);
        if (!first[i])
            abort();
        memcpy(first[i], bb[i].p, bb[i].size);
        memcpy(bb[i].p, bb[i].snap, bb[i].size);
    }
    own_rerun_begin(R, own_first);
    fz_cpu_path(path);
    st = backward_call(ct, fc, R, bp);
    fz_cpu_path(0);
    stats.bwd_reruns++;
    CHECK(st == FUSEDROPE_OK, "norm_backward_qk was accepted, but refused (%d) on CPU path %d",
          st, path);
    only_din_written(bb, nb, path);
    for (int k = 0; k < fc->count; k++) {
        /* dq_in's elements */
        const bbuf *b = &bb[bp[k].din.buf];
        const size_t es = (size_t)dtype_size((int)bp[k].din.t.dtype);
        for (size_t j = 0; j + es <= b->size; j++) {
            if (!(b->map[j] & 1) || (j - bp[k].din.off) % es != 0)
                continue;
            CHECK(same_or_nans(first[bp[k].din.buf] + j, b->p + j, es, (int)bp[k].din.t.dtype),
                  "%s backward: dq_in element at byte %zu: %.9g on the first run, %.9g on CPU "
                  "path %d", k ? "k" : "q", j, load(first[bp[k].din.buf] + j,
                  (int)bp[k].din.t.dtype), load(b->p + j, (int)bp[k].din.t.dtype), path);
        }
    }
    for (int i = 0; i < R->nown; i++)
        for (size_t j = 0; j + 4 <= R->own[i].size; j += 4)
            CHECK(same_or_nans(own_first[i] + j, R->own[i].p + j, 4, FUSEDROPE_FLOAT32),
                  "norm_backward_qk own array %d (dw) float %zu: %.9g on the first run, %.9g "
                  "on CPU path %d", i, j / 4, load(own_first[i] + j, FUSEDROPE_FLOAT32),
                  load(R->own[i].p + j, FUSEDROPE_FLOAT32), path);
    for (int i = 0; i < nb; i++)
        free(first[i]);
    for (int i = 0; i < R->nown; i++)
        free(own_first[i]);
}

static void run_backward(src_t *s, const cache_t *ct, fz_call *fc, nrun *R, const refctx *X,
                         rng_t *r)
{
    bbuf bb[8];
    int nb = 0;
    bpair bp[2];
    verdict v;
    unsigned sel = u8(s), dwsel = u8(s);
    int saved_output = sel < 250 ? (int)(sel & 1) : (sel & 1 ? -1 : 2);
    int so = saved_output == 1;
    float *dw[2] = { NULL, NULL };
    int dw_region[2] = { -1, -1 };
    size_t dw_bytes[2] = { 0, 0 };
    fusedrope_norm nm = R->nm;
    fusedrope_status st;
    char before[600];
    int hard_mismatch = 0;
    const int dt = fc->dt;
    const size_t es = fc->es;

    memset(&v, 0, sizeof v);
    memset(bp, 0, sizeof bp);
    for (int k = 0; k < fc->count; k++) {
        const tspec *src = &fc->ts[2 * k + (so ? 1 : 0)];
        const buf_t *sb = &fc->bufs[src->buf];
        size_t size = src->off + (size_t)src->ext + 16 * es;
        unsigned m = u8(s);
        bpair *p = &bp[k];
        p->saved = *src;
        p->saved.buf = bnew(bb, &nb, size);
        memset(bb[p->saved.buf].p, 0, size);
        /* the saved x: the bytes before the forward; y: after */
        memcpy(bb[p->saved.buf].p + src->off, (so ? sb->p : sb->snap) + src->off, (size_t)src->ext);
        p->saved.t.data = bb[p->saved.buf].p + p->saved.off;
        p->dout = p->saved;
        p->dout.buf = bnew(bb, &nb, size);
        fill(bb[p->dout.buf].p, size, dt, r, (fc->layout & 0x20) != 0);
        p->dout.t.data = bb[p->dout.buf].p + p->dout.off;
        switch (m % 8) {
        case 0: case 1: case 2: /* in place over dq_out */
            p->din = p->dout;
            break;
        case 3: /* over the saved tensor */
            p->din = p->saved;
            break;
        case 6: { /* in the saved tensor's buffer, shifted */
            size_t d = (size_t)(1 + u8(s) % 8) * es;
            p->din = p->saved;
            p->din.off += d;
            p->din.t.data = bb[p->din.buf].p + p->din.off;
            break;
        }
        case 7: /* another dtype or fewer heads */
            p->din = p->dout;
            p->din.buf = bnew(bb, &nb, size);
            if ((m & 8) && p->din.t.heads > 1) {
                p->din.t.heads--;
            } else {
                p->din.t.dtype = (fusedrope_dtype)((dt + 1) % 3);
                /* strides in elements: a buffer of the same element count, in bytes */
                free(bb[p->din.buf].p);
                free(bb[p->din.buf].snap);
                free(bb[p->din.buf].map);
                nb--;
                p->din.buf = bnew(bb, &nb, size / es * 4 + 64);
                p->din.off = p->din.off / es * dtype_size((int)p->din.t.dtype);
            }
            fill(bb[p->din.buf].p, bb[p->din.buf].size, dt, r, 0);
            p->din.t.data = bb[p->din.buf].p + p->din.off;
            hard_mismatch = 1;
            reason(&v, FUSEDROPE_ERR_INVALID, 1, "dq_in %d of another shape or dtype", k);
            break;
        default: /* its own buffer */
            p->din = p->dout;
            p->din.buf = bnew(bb, &nb, size);
            memset(bb[p->din.buf].p, 0xff, size);
            p->din.t.data = bb[p->din.buf].p + p->din.off;
            break;
        }
        if (!hard_mismatch) {
            /* written elements (bit 1); the saved view (bit 2) against a shifted dq_in */
            if (bmark(bb, &p->din, 1))
                reason(&v, FUSEDROPE_ERR_INVALID, 1, "dq_in %d overlaps itself", k);
            else if (p->din.arbitrary) /* the library's lattice test may refuse it */
                v.soft |= 1u << FUSEDROPE_ERR_INVALID;
            if (p->din.buf == p->saved.buf && !same_view(&p->din, &p->saved)) {
                bbuf *sb = &bb[p->saved.buf];
                int hit = 0;
                bmark(bb, &p->saved, 2);
                for (size_t j = 0; j < sb->size; j++)
                    if ((sb->map[j] & 3) == 3)
                        hit = 1;
                if (hit)
                    reason(&v, FUSEDROPE_ERR_INVALID, 1, "dq_in %d partially overlaps the saved "
                           "tensor", k);
                else
                    v.soft |= 1u << FUSEDROPE_ERR_INVALID;
                for (size_t j = 0; j < sb->size; j++)
                    sb->map[j] &= 1;
            }
        }
    }
    nm.saved_output = saved_output;
    if (saved_output != 0 && saved_output != 1)
        reason(&v, FUSEDROPE_ERR_INVALID, 1, "saved_output %d", saved_output);
    /* (a tensor without rows may go without: NULL as its data may be) */
    for (int k = 0; k < fc->count; k++)
        if (!R->ex[k ? EX_KR : EX_QR].p && !(fc->ts[2 * k].shape_ok && fc->ts[2 * k].empty))
            reason(&v, FUSEDROPE_ERR_INVALID, 1, "%s rstd missing", k ? "k" : "q");
    if (dwsel % 4 != 0) {
        for (int k = 0; k < fc->count; k++) {
            int64_t hd = fc->ts[2 * k].t.head_dim;
            dw_bytes[k] = (size_t)hd * 4;
            dw[k] = (float *)(void *)own_new(R, dw_bytes[k] + 4, &dw_region[k]);
        }
        if (R->kind == FUSEDROPE_NORM_WEIGHT_NONE)
            reason(&v, FUSEDROPE_ERR_INVALID, 1, "dw with weight NONE");
    }
    nm.dq_weight = dw[0];
    nm.dk_weight = dw[1];
    v.allowed = (v.must_fail ? v.hard : 1u << FUSEDROPE_OK) | v.soft;
    note("norm_backward_qk(saved_output %d, dq_in 0x%x, dw %s): allowed 0x%x: %s\n",
         saved_output, sel, dw[0] ? "given" : "NULL", v.allowed, v.why);

    for (int i = 0; i < nb; i++)
        memcpy(bb[i].snap, bb[i].p, bb[i].size);
    for (int i = 0; i < R->nown; i++)
        memcpy(R->own[i].snap, R->own[i].p, R->own[i].size);
    for (int i = 0; i < fc->nbuf; i++)
        memcpy(fc->bufs[i].snap, fc->bufs[i].p, fc->bufs[i].size); /* rstd may live there */
    snprintf(before, sizeof before, "%s", fusedrope_last_error());
    stats.bwd++;
    memcpy(R->nmbuf, &nm, sizeof nm); /* (struct_size may say more: a zero tail) */
    st = backward_call(ct, fc, R, bp);
    if (verbose_mode)
        fprintf(stderr, "backward: %d %s | model 0x%x %s\n", st, fusedrope_last_error(),
                v.allowed, v.why);
    CHECK(v.allowed & (1u << st), "norm_backward_qk returned %d (%s) but the model allows 0x%x (%s)",
          st, fusedrope_status_string(st), v.allowed, v.why[0] ? v.why : "no rule broken");
    for (int i = 0; i < fc->nbuf; i++)
        CHECK(memcmp(fc->bufs[i].snap, fc->bufs[i].p, fc->bufs[i].size) == 0,
              "norm_backward_qk wrote the forward's buffer %d", i);
    for (int i = 0; i < R->nown; i++) {
        int is_dw = (i + OWN_BASE == dw_region[0] || i + OWN_BASE == dw_region[1]);
        size_t n = st == FUSEDROPE_OK && is_dw ? R->own[i].size - 4 : 0;
        CHECK(memcmp(R->own[i].snap + n, R->own[i].p + n, R->own[i].size - n) == 0,
              "norm_backward_qk wrote own array %d (past dw, or a refused call)", i);
    }
    if (st != FUSEDROPE_OK) {
        CHECK(fusedrope_last_error()[0] != 0, "a failed norm_backward_qk left no error detail");
        for (int i = 0; i < nb; i++)
            CHECK(memcmp(bb[i].p, bb[i].snap, bb[i].size) == 0,
                  "a refused norm_backward_qk changed backward buffer %d", i);
        goto out;
    }
    stats.bwd_ok++;
    CHECK(strcmp(before, fusedrope_last_error()) == 0, "a successful norm_backward_qk changed "
          "fusedrope_last_error()");
    only_din_written(bb, nb, 0);

    /* values; not where the table's float32 entries are subnormal (attention
     * factor below 2^-100: the table holds cos * attn with an absolute error
     * of 2^-150, which the gradient g = R^T dq_out scales by |dq_out|, past
     * test_norm's bound, which is relative to g) */
    for (int k = 0; k < fc->count && X->rr.attn >= 0x1p-100; k++) {
        bpair *p = &bp[k];
        fusedrope_tensor sv = p->saved.t, dy = p->dout.t, dx = p->din.t;
        const int64_t hd = dy.head_dim, H = dy.heads, S = dy.seq_len, B = dy.batch;
        const int64_t rows = S * B * H;
        const float *rstd = (const float *)R->ex[k ? EX_KR : EX_QR].p;
        const double lim = (ref_max_finite(dt) < FLT_MAX ? ref_max_finite(dt) : FLT_MAX) / 16;
        double *want = malloc(sizeof(double) * (size_t)(rows * hd)), *scale = malloc(sizeof(double) * (size_t)rows);
        double *dwr = calloc((size_t)hd, sizeof(double)), *dwa = calloc((size_t)hd, sizeof(double));
        double *w = malloc(sizeof(double) * (size_t)hd), *en = malloc(sizeof(double) * 3 * (size_t)hd);
        double *nn = en + hd, *dnn = en + 2 * hd, ymean = 0, ydmean = 0, row_slack = 0;
        double *dwy = calloc((size_t)hd + 1, sizeof(double));
        int dw_ok = 1, wfinite = 1, wzero = 0;
        if (!want || !scale || !dwr || !dwa || !w || !en || !dwy)
            abort();
        load_weights(R, k, hd, w);
        for (int64_t c = 0; c < hd; c++) {
            double wf = R->kind == 0 ? 1 : R->kind == 1 ? w[c] : 1 + w[c];
            wfinite &= isfinite(wf);
            wzero |= wf == 0;
        }
        sv.data = bb[p->saved.buf].snap + p->saved.off;
        dy.data = bb[p->dout.buf].snap + p->dout.off;
        ref_norm_backward(&X->rr, (fusedrope_style)fc->style, X->pos, &sv, so, &dy, R->kind, w,
                          (double)(float)R->eps, rstd, want, dwr, dwa, scale);
        for (int64_t s2 = 0; s2 < S; s2++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++) {
                    const int64_t row = (s2 * B + b) * H + h;
                    const double rsv = rstd[(b * S + s2) * H + h];
                    int clean = isfinite(rsv) && rsv > 0 && wfinite;
                    for (int64_t c = 0; c < hd && clean; c++)
                        clean = isfinite(ref_load(sv.data, sv.dtype, ref_offset(&sv, s2, b, h, c))) &&
                                isfinite(ref_load(dy.data, dy.dtype, ref_offset(&dy, s2, b, h, c)));
                    if (!clean) {
                        dw_ok = 0;
                        continue;
                    }
                    if (so && wzero) {
                        /* n = (R^T y) / 0: the row's dq_in is NaN */
                        stats.nan_dx_rows++;
                        for (int64_t c = 0; c < hd; c++) {
                            double got = ref_load(dx.data, dx.dtype, ref_offset(&dx, s2, b, h, c));
                            CHECK(isnan(got), "%s backward from y, a weight w' = 0: dq_in row "
                                  "(s %lld b %lld h %lld) channel %lld is %.9g, not NaN",
                                  k ? "k" : "q", (long long)s2, (long long)b, (long long)h,
                                  (long long)c, got);
                        }
                        continue;
                    }
                    /* float32 intermediates past FLT_MAX (R^T dy and R^T y, n * mean,
                     * dn * n, and the row's sum of dn * n, up to head_dim max|dn|
                     * max|n| with |n| <= sqrt(head_dim) from a saved x; from y,
                     * below): not checked */
                    if (!(scale[row] <= lim) || !(scale[row] / rsv <= FLT_MAX / 64) ||
                        !(so || (double)hd * sqrt((double)hd) * (scale[row] / rsv) <=
                                    FLT_MAX / 4) ||
                        !(row_rotated_size(X, &dy, fc->style, s2, b, h, b * S + s2) <=
                          FLT_MAX / 4) ||
                        !(!so || row_rotated_size(X, &sv, fc->style, s2, b, h, b * S + s2) <=
                                     FLT_MAX / 4)) {
                        dw_ok = 0;
                        continue;
                    }
                    if (so) { /* (and dw[c] = sum g n gets sum |g| en) */
                        double maxn = 0, maxdn = 0;
                        saved_y_row(X, &sv, &dy, fc->style, R->kind, w, s2, b, h, b * S + s2, en,
                                    nn, dnn, &ymean, &ydmean);
                        for (int64_t c = 0; c < hd; c++) {
                            maxn = fabs(nn[c]) > maxn ? fabs(nn[c]) : maxn;
                            maxdn = fabs(dnn[c]) > maxdn ? fabs(dnn[c]) : maxdn;
                        }
                        if (!(maxn * maxdn * (double)hd <= FLT_MAX / 64)) {
                            dw_ok = 0;
                            continue;
                        }
                        for (int64_t c = 0; c < hd; c++) {
                            double wf = R->kind == 0 ? 1 : R->kind == 1 ? w[c] : 1 + w[c];
                            dwy[c] += 4 * fabs(dnn[c] / wf) * en[c];
                        }
                    }
                    stats.bwd_rows++;
                    row_slack = 0;
                    if (ct->formula) /* the angles' slack, every pair's, on the whole row */
                        for (int i = 0; i < ct->half; i++) {
                            double sl = pair_slack(ct, X, b * S + s2, i);
                            if (sl < 0) {
                                row_slack = INFINITY;
                                break;
                            }
                            if (sl > 0)
                                row_slack += sl * pair_attn(X, b * S + s2, i) * scale[row] * 4;
                        }
                    for (int64_t c = 0; c < hd; c++) {
                        double got = ref_load(dx.data, dx.dtype, ref_offset(&dx, s2, b, h, c));
                        double wv = want[row * hd + c], tol;
                        if (!(fabs(wv) <= lim)) {
                            dw_ok = 0;
                            continue;
                        }
                        tol = ref_norm_dx_tolerance(wv, scale[row], (fusedrope_dtype)dt);
                        if (so)
                            tol += 4 * rsv * (en[c] * fabs(ymean) + (fabs(nn[c]) + en[c]) * ydmean);
                        tol += row_slack;
                        CHECK(fabs(got - wv) <= tol,
                              "%s backward (saved_output %d) row (s %lld b %lld h %lld) channel "
                              "%lld: dq_in %.9g, reference %.9g (tolerance %.3g)", k ? "k" : "q",
                              so, (long long)s2, (long long)b, (long long)h, (long long)c, got,
                              wv, tol);
                    }
                }
        if (dw[k]) {
            stats.dw_checked += dw_ok;
            CHECK(isnan(dw[k][hd]), "%s backward: written past dw", k ? "k" : "q");
            for (int64_t c = 0; c < hd; c++) {
                double wf = R->kind == 1 ? w[c] : 1 + w[c];
                if (so && wf == 0 && rows > 0 && dw_ok)
                    CHECK(!isfinite(dw[k][c]), "%s backward from y, w'[%lld] = 0: dw %.9g, not "
                          "NaN", k ? "k" : "q", (long long)c, (double)dw[k][c]);
                else if (dw_ok && !(so && wzero) && isfinite(dwr[c]) && fabs(dwr[c]) <= lim)
                    CHECK(fabs(dw[k][c] - dwr[c]) <= ref_norm_dw_tolerance(dwa[c]) + dwy[c],
                          "%s backward (saved_output %d): dw[%lld] %.9g, reference %.9g "
                          "(tolerance %.3g)", k ? "k" : "q", so, (long long)c, (double)dw[k][c],
                          dwr[c], ref_norm_dw_tolerance(dwa[c]) + dwy[c]);
            }
        }
        free(want);
        free(scale);
        free(dwr);
        free(dwa);
        free(w);
        free(en);
        free(dwy);
    }
    for (int path = 1; path < FZ_CPU_PATHS; path++)
        rerun_backward(ct, fc, R, bp, bb, nb, path);
out:
    for (int i = 0; i < nb; i++) {
        free(bb[i].p);
        free(bb[i].snap);
        free(bb[i].map);
    }
}

/* The call's fusedrope_norm_forward_qk, as decoded (cache NULL for null_cache). */
static fusedrope_status norm_forward(const cache_t *ct, fz_call *fc, const nrun *R,
                                     int null_cache)
{
    const fusedrope_positions *pp = fc->ps.given ? &fc->ps.p : NULL;
    const fusedrope_tensor *d[4];
    for (int k = 0; k < 4; k++)
        d[k] = k < 2 * fc->count && fc->ts[k].present ? &fc->ts[k].t : NULL;
    return fusedrope_norm_forward_qk(null_cache ? NULL : ct->cache, (fusedrope_style)fc->style,
                                     pp, R->nm_null ? NULL : (const fusedrope_norm *)(void *)R->nmbuf,
                                     d[0], d[1], d[2], d[3], fc->stream);
}

/*
 * An accepted forward again on another CPU path (fz_cpu_path: the AVX2 rows
 * alone, the portable loops, streamed outputs and prefetched inputs, or a
 * team of threads),
 * from the same inputs: every byte the same, a NaN element a NaN in both
 * runs; rstd in own memory compared the same way, float by float.  The AVX2
 * and AVX-512 rows promise the portable loops' bits.
 */
static void rerun_path(const cache_t *ct, fz_call *fc, nrun *R, int path)
{
    unsigned char **first = fz_rerun_begin(fc), *own_first[MAX_OWN];
    fusedrope_status st;

    own_rerun_begin(R, own_first);
    fz_cpu_path(path);
    st = norm_forward(ct, fc, R, 0);
    fz_cpu_path(0);
    fz_rerun_end(fc, first, st);
    for (int i = 0; i < R->nown; i++) {
        for (size_t j = 0; j < R->own[i].size; j++) {
            const extra_t *in = NULL;
            float a, b;
            if (own_first[i][j] == R->own[i].p[j])
                continue;
            for (int k = 0; k < 2; k++) {
                const extra_t *e = &R->ex[k ? EX_KR : EX_QR];
                if (e->p && e->region == i + OWN_BASE && j >= e->off && j < e->off + e->bytes)
                    in = e;
            }
            CHECK(in, "own array %d byte %zu differs between the first forward and path %d's, "
                  "outside q_rstd and k_rstd", i, j, path);
            {
                const size_t e0 = in->off + (j - in->off) / 4 * 4;
                memcpy(&a, own_first[i] + e0, 4);
                memcpy(&b, R->own[i].p + e0, 4);
                CHECK(isnan(a) && isnan(b), "%s at byte %zu: %.9g on the first run, %.9g on "
                      "path %d", in->name, e0 - in->off, (double)a, (double)b, path);
            }
        }
        free(own_first[i]);
    }
}

/* ------------------------------------------------------------ the calls */

static void run_norm(src_t *s, cache_t *ct, rng_t *r, int null_cache)
{
    unsigned api = u8(s);
    int qk = api & 1, want_bwd = (api >> 1) & 3;
    fz_call call, *fc = &call;
    nrun R;
    fusedrope_status st;
    unsigned wsel, rsel, ssel, fsel, zsel;
    int hard;

    memset(&R, 0, sizeof R);
    fz_setup(s, ct, r, null_cache, qk, fc);
    hard = fc->any_nonempty;

    /* ---- the norm */
    R.kind = pick_enum(s, 3);
    R.rounding = pick_enum(s, 3);
    R.eps = pick_eps(s);
    {
        unsigned b = u8(s);
        R.wdt = b < 200 ? fc->dt : b < 230 ? FUSEDROPE_FLOAT32
                : b < 250 ? (fc->dt + 1 + (int)(b % 2)) % 3 : (b & 1 ? -1 : 3 + (int)(b % 4));
    }
    R.wes = dtype_ok(R.wdt) ? dtype_size(R.wdt) : 4;
    wsel = u8(s);
    rsel = u8(s);
    ssel = u8(s);
    fsel = u8(s);
    zsel = u8(s);
    R.nmbuf = calloc(1, sizeof(fusedrope_norm) + 64);
    if (!R.nmbuf)
        abort();
    fusedrope_norm_init(&R.nm);
    CHECK(R.nm.struct_size == sizeof R.nm && R.nm.weight == FUSEDROPE_NORM_WEIGHT_NONE &&
              R.nm.rounding == FUSEDROPE_NORM_ROUND_ONCE && R.nm.eps == 1e-6 &&
              !R.nm.q_weight && !R.nm.k_weight && !R.nm.q_rstd && !R.nm.k_rstd &&
              !R.nm.dq_weight && !R.nm.dk_weight && R.nm.saved_output == 0,
          "fusedrope_norm_init did not set the documented defaults");
    R.nm.weight = (fusedrope_norm_weight)R.kind;
    R.nm.rounding = (fusedrope_norm_rounding)R.rounding;
    R.nm.eps = R.eps;
    R.nm.weight_dtype = (fusedrope_dtype)R.wdt;

    /* weights: head_dim elements each, as the kind needs them, or not */
    for (int k = 0; k < 2; k++) {
        extra_t *e = &R.ex[k ? EX_KW : EX_QW];
        int64_t hd = k < fc->count ? fc->ts[2 * k].t.head_dim : fc->ts[0].t.head_dim;
        int want = R.kind != FUSEDROPE_NORM_WEIGHT_NONE && k < fc->count;
        e->name = k ? "k_weight" : "q_weight";
        e->es = R.wes;
        if (wsel >= 224 && wsel < 232 && (wsel & 1) == (unsigned)k)
            want = 0; /* missing */
        if (wsel >= 232 && wsel < 240 && (wsel & 1) == (unsigned)k)
            want = 1; /* given with NONE, or without a k tensor */
        if (!want)
            continue;
        e->stand_in = !(hd > 0 && (uint64_t)hd <= 4 * FZ_LIMIT / R.wes);
        e->bytes = e->stand_in ? FZ_SMALL : (size_t)hd * R.wes;
        place(s, fc, &R, e, wsel >= 240 ? 1 + (wsel & 1) : 0, wsel >= 248 && (wsel & 2), NULL);
        if (e->region >= OWN_BASE) {
            fill(e->p, e->bytes, dtype_ok(R.wdt) ? R.wdt : FUSEDROPE_FLOAT32, r,
                 (fc->layout & 0x20) != 0);
            if ((zsel & 3) == 1 && hd > 0 && e->bytes >= R.wes) {
                /* a channel with w' = 0 (NaN rule of the backward from y) */
                size_t c = (size_t)(zsel >> 2) % (e->bytes / R.wes);
                unsigned char z[4];
                uint32_t one = 0xbf800000u; /* -1.0f */
                uint16_t oneh = R.wdt == FUSEDROPE_FLOAT16 ? 0xbc00 : 0xbf80;
                memset(z, 0, sizeof z);
                if (R.kind == FUSEDROPE_NORM_WEIGHT_PLUS_ONE) {
                    if (R.wes == 4)
                        memcpy(z, &one, 4);
                    else
                        memcpy(z, &oneh, 2);
                }
                memcpy(e->p + c * R.wes, z, R.wes);
            }
        }
    }
    R.nm.q_weight = R.ex[EX_QW].p;
    R.nm.k_weight = R.ex[EX_KW].p;

    /* rstd: [tokens][heads] floats, or not */
    for (int k = 0; k < 2; k++) {
        extra_t *e = &R.ex[k ? EX_KR : EX_QR];
        const fusedrope_tensor *t = &fc->ts[k < fc->count ? 2 * k : 0].t;
        const int64_t big = (int64_t)1 << 40;
        i128 rows = t->seq_len >= 0 && t->batch >= 0 && t->heads >= 0 && t->seq_len < big &&
                            t->batch < big && t->heads < big
                        ? (i128)t->seq_len * t->batch * t->heads
                        : -1;
        int want = rsel < 160 ? k < fc->count : rsel < 200 ? 0 : rsel < 215 ? k == 0 : k < fc->count;
        e->name = k ? "k_rstd" : "q_rstd";
        e->es = 4;
        e->written = 1;
        if (rsel >= 250 && k == 1)
            want = 1; /* without a k tensor too */
        if (!want)
            continue;
        e->stand_in = !(rows >= 0 && rows <= (i128)FZ_LIMIT);
        e->bytes = e->stand_in ? FZ_SMALL : (size_t)rows * 4;
        if (rsel >= 215 && rsel < 236 && (rsel & 1) == (unsigned)k)
            place(s, fc, &R, e, 1, rsel & 2, NULL);
        else if (rsel >= 236 && rsel < 246 && k == 1)
            place(s, fc, &R, e, 2, 0, rsel & 1 ? &R.ex[EX_QR] : &R.ex[EX_KW]);
        else if (rsel >= 236 && rsel < 246 && k == 0 && (rsel & 2))
            place(s, fc, &R, e, 2, 0, &R.ex[EX_QW]);
        else
            place(s, fc, &R, e, 0, rsel >= 246 && (rsel & 4), NULL);
        if (e->region < OWN_BASE) {
            /* bytes the accepted call writes */
            for (size_t j = e->off; j < e->off + e->bytes; j++)
                fc->bufs[e->region].map[j] |= 0x10;
            fc->written_mask |= 0x10;
        }
    }
    R.nm.q_rstd = (float *)(void *)R.ex[EX_QR].p;
    R.nm.k_rstd = (float *)(void *)R.ex[EX_KR].p;
    if (fsel & 1) { /* dq_weight: the forward ignores it */
        extra_t *e = &R.ex[EX_FDW];
        e->name = "dq_weight";
        e->es = 4;
        e->bytes = 16;
        place(s, fc, &R, e, 0, 0, NULL);
        R.nm.dq_weight = (float *)(void *)e->p;
    }

    /* ---- the model's norm rules */
    if (ssel >= 250) {
        static const size_t sizes[] = { 0, 3, sizeof(fusedrope_norm) - 8, sizeof(fusedrope_norm) + 8 };
        R.nm.struct_size = sizes[ssel % 4];
        if (R.nm.struct_size > sizeof(fusedrope_norm)) /* a newer caller: zero tail */
            fc->v.soft |= 1u << FUSEDROPE_ERR_INVALID;
        else
            reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "struct_size %zu", R.nm.struct_size);
    }
    R.nm_null = ssel >= 244 && ssel < 250;
    if (R.nm_null)
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "norm NULL");
    if (R.kind < 0 || R.kind > 2)
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "weight kind %d", R.kind);
    if (R.rounding < 0 || R.rounding > 2)
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "rounding %d", R.rounding);
    if (!(R.eps > 0) || !isfinite(R.eps) || !((float)R.eps > 0) || isinf((float)R.eps))
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "eps %g (float32 %g)", R.eps, (double)(float)R.eps);
    if (!dtype_ok(R.wdt))
        reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "weight dtype %d", R.wdt);
    else if (R.wdt != fc->dt && R.wdt != FUSEDROPE_FLOAT32)
        reason(&fc->v, FUSEDROPE_ERR_INVALID, dtype_ok(fc->dt) && fc->ts[0].present,
               "weight dtype %d with tensors of %d", R.wdt, fc->dt);
    for (int k = 0; k < 2; k++) {
        const extra_t *wt = &R.ex[k ? EX_KW : EX_QW], *rs = &R.ex[k ? EX_KR : EX_QR];
        int has_t = k < fc->count && fc->ts[2 * k].present;
        if (k >= fc->count) {
            if (wt->p || rs->p) /* the man page does not say: either answer */
                fc->v.soft |= 1u << FUSEDROPE_ERR_INVALID;
            continue;
        }
        if (R.kind == FUSEDROPE_NORM_WEIGHT_NONE && wt->p)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, 1, "%s with weight NONE", wt->name);
        if (R.kind > 0 && R.kind <= 2 && !wt->p)
            reason(&fc->v, FUSEDROPE_ERR_INVALID, has_t, "%s missing", wt->name);
    }
    extras_model(fc, &R, hard);
    /* an array whose extent the harness did not allocate: a non-empty call
     * with it fails for its tensors' size; an empty one may be refused for
     * the array's extent (RANGE: past what can be addressed) */
    for (int i = 0; i < EX_N; i++)
        if (R.ex[i].p && R.ex[i].stand_in)
            fc->v.soft |= (1u << FUSEDROPE_ERR_INVALID) | (1u << FUSEDROPE_ERR_RANGE);
    fz_model_done(fc, qk ? "norm_forward_qk" : "norm_forward_qk(k NULL)");
    note("  norm: %s struct_size %zu kind %d rounding %d eps %g wdt %d q_weight %p k_weight %p "
         "q_rstd %p k_rstd %p (sel 0x%x/0x%x/0x%x)\n", R.nm_null ? "NULL" : "", R.nm.struct_size,
         R.kind, R.rounding, R.eps, R.wdt, (const void *)R.nm.q_weight,
         (const void *)R.nm.k_weight, (void *)R.nm.q_rstd, (void *)R.nm.k_rstd, wsel, rsel, ssel);
    note("  model with the norm: allowed 0x%x: %s\n", fc->v.allowed, fc->v.why);

    /* ---- the forward */
    memcpy(R.nmbuf, &R.nm, sizeof R.nm);
    fz_snapshot(fc);
    for (int i = 0; i < R.nown; i++)
        memcpy(R.own[i].snap, R.own[i].p, R.own[i].size);
    st = norm_forward(ct, fc, &R, null_cache);
    stats.fwd++;
    stats.fwd_ok += st == FUSEDROPE_OK;
    fz_verdict(fc, st);
    fz_after_call(fc, st);
    for (int i = 0; i < R.nown; i++) {
        /* own arrays: rstd may change on success (within its elements) */
        int rstd_region = (i + OWN_BASE == R.ex[EX_QR].region && R.ex[EX_QR].p) ||
                          (i + OWN_BASE == R.ex[EX_KR].region && R.ex[EX_KR].p);
        if (st == FUSEDROPE_OK && rstd_region) {
            for (size_t j = 0; j < R.own[i].size; j++) {
                int inside = 0; /* one of the rstd arrays in this memory */
                for (int k = 0; k < 2; k++) {
                    const extra_t *e = &R.ex[k ? EX_KR : EX_QR];
                    inside |= e->p && e->region == i + OWN_BASE && j >= e->off &&
                              j < e->off + e->bytes;
                }
                CHECK(inside || R.own[i].p[j] == R.own[i].snap[j],
                      "norm_forward_qk wrote byte %zu of own array %d, outside q_rstd and k_rstd",
                      j, i);
            }
            continue;
        }
        CHECK(memcmp(R.own[i].p, R.own[i].snap, R.own[i].size) == 0,
              "norm_forward_qk %s own array %d (a weight, a refused call's rstd, or dq_weight)",
              st == FUSEDROPE_OK ? "wrote" : "refused, but wrote", i);
    }
    /* (rstd in a tensor buffer: fz_rerun_end would take a NaN's other
     * payload there for a stray write) */
    if (st == FUSEDROPE_OK && !null_cache && (!R.ex[EX_QR].p || R.ex[EX_QR].region >= OWN_BASE) &&
        (!R.ex[EX_KR].p || R.ex[EX_KR].region >= OWN_BASE))
        for (int path = 1; path < FZ_CPU_PATHS; path++)
            rerun_path(ct, fc, &R, path);
    if (st == FUSEDROPE_OK && fc->tokpos && !null_cache && fc->any_nonempty) {
        refctx X;
        int all = 1;
        for (int k = 0; k < fc->count; k++)
            all &= mappable(&fc->ts[2 * k]) && mappable(&fc->ts[2 * k + 1]);
        refctx_init(&X, ct, fc);
        if (X.ok && all) {
            for (int k = 0; k < fc->count; k++)
                check_forward(ct, fc, &R, &X, k);
            /* (rstd in its own memory: the backward's model knows no other) */
            if (want_bwd && (!R.ex[EX_QR].p || R.ex[EX_QR].region >= OWN_BASE) &&
                (!R.ex[EX_KR].p || R.ex[EX_KR].region >= OWN_BASE) &&
                !(R.ex[EX_QR].p && R.ex[EX_KR].p && R.ex[EX_QR].region == R.ex[EX_KR].region))
                run_backward(s, ct, fc, &R, &X, r);
        }
        refctx_free(&X);
    }

    for (int i = 0; i < R.nown; i++) {
        free(R.own[i].p);
        free(R.own[i].snap);
    }
    free(R.nmbuf);
    fz_call_free(fc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_env();
    {
        static int once;
        const char *e = getenv("FUSEDROPE_FUZZ_STATS");
        if (!once++ && e && *e && *e != '0')
            atexit(print_stats);
    }
    return fz_input(data, size, run_norm);
}
