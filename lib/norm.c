/*
 * norm.c - the norm module: per-head RMSNorm fused with RoPE, forward and
 * backward (fusedrope_norm_forward_qk(3)).  The tensors and positions pass
 * fr_apply's own checks (fr_apply_prepare); this file adds the norm's
 * parameters, weights, rstd and weight-gradient buffers, and their overlaps
 * with everything else, then runs the cache's backend.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

typedef long long ll;

/* The sizes fusedrope_norm has had (fr_struct_take). */
static const size_t norm_layouts[] = {
    FR_LAYOUT_SIZE(fusedrope_norm, saved_output), /* 0.2 */
};

void fusedrope_norm_init_sized(fusedrope_norm *norm, size_t struct_size)
{
    fusedrope_norm n;
    memset(&n, 0, sizeof n);
    n.eps = 1e-6;
    fr_struct_give(norm, struct_size, &n, sizeof n);
}

/* A byte range one call reads or writes, for the overlap rules. */
typedef struct {
    uintptr_t lo, hi; /* [lo, hi); empty when lo == hi */
    const char *name;
    int tensor;       /* a tensor view: its overlaps with other views are fr_apply_prepare's */
    int alone;        /* written by the call, or an rstd array (read by the backward): shares
                         no byte with anything else the call touches */
} range;

/* Bytes from a validated (fr_apply_prepare) tensor's data to one past its
 * last element; nothing for an empty one. */
static range tensor_range(const fusedrope_tensor *t, const char *name, int alone)
{
    range r = { 0, 0, name, 1, alone };
    if (t && t->data && t->seq_len > 0 && t->batch > 0 && t->heads > 0) {
        const int64_t last = (t->seq_len - 1) * t->stride_seq + (t->batch - 1) * t->stride_batch +
                             (t->heads - 1) * t->stride_head + t->head_dim;
        r.lo = (uintptr_t)t->data;
        r.hi = r.lo + (uintptr_t)last * fr_dtype_size(t->dtype);
    }
    return r;
}

/* A float/weight/position array of n elements of es bytes: aligned, its
 * extent addressable, living on the cache's device. */
static fusedrope_status array_range(const void *p, int64_t n, size_t es, const char *name,
                                    int alone, const fusedrope_cache *cache, range *r)
{
    int64_t bytes = 0; /* set where fr_check_array succeeds; gcc's LTO cannot see it */
    r->lo = r->hi = 0;
    r->name = name;
    r->tensor = 0;
    r->alone = alone;
    if (!p || n <= 0)
        return FUSEDROPE_OK;
    TRY(fr_check_array(p, n, es, name, &bytes));
    TRY(fr_check_pointer(p, name, cache));
    r->lo = (uintptr_t)p;
    r->hi = r->lo + (uintptr_t)bytes;
    return FUSEDROPE_OK;
}

/* Nothing written, and no rstd array, may share a byte with anything else
 * the call touches (two tensor views: fr_apply_prepare's rules, in place
 * included). */
static fusedrope_status check_overlaps(const range *r, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j || !r[i].alone || (r[i].tensor && r[j].tensor) ||
                (r[j].alone && j < i))
                continue;
            if (r[i].lo < r[i].hi && r[j].lo < r[j].hi && r[i].lo < r[j].hi &&
                r[j].lo < r[i].hi) {
                const int span = r[i].tensor || r[j].tensor;
                return fr_fail(FUSEDROPE_ERR_INVALID, "%s %s %s%s; the norm call's outputs, "
                               "rstd arrays and range word must share no memory with anything "
                               "else it reads or writes", r[i].name,
                               span ? "may overlap" : "overlaps", r[j].name,
                               span ? " (a tensor is taken as its whole span, from its first "
                                      "byte to its last: the test is conservative, "
                                      "fusedrope_norm_forward_qk(3))"
                                    : "");
            }
        }
    return FUSEDROPE_OK;
}

/* eps as the float32 the norm adds (*eps), and whether it is valid (> 0
 * and finite, as a double and as a float32): the conversion and the tests
 * in the IEEE default environment, whatever the caller's rounding mode and
 * flush-to-zero, and the caller's exception flags left as they were
 * (fusedrope_forward(3), CAVEATS).  The volatile read and
 * writes keep the arithmetic between the two MXCSR writes, which the
 * compiler does not order floating-point operations against. */
static int eps_float(double user_eps, float *eps)
{
    volatile double in = user_eps;
    volatile float out;
    volatile int ok;
    fr_fpenv saved;
    fr_fpenv_enter(&saved);
    {
        const double d = in;
        const float f = (float)d;
        out = f;
        ok = d > 0 && f > 0 && !isinf(f);
    }
    fr_fpenv_leave(&saved);
    *eps = out;
    return ok;
}

/* The norm's own parameters; *eps: its eps as a float32. */
static fusedrope_status take_norm(const fusedrope_norm *user, fusedrope_norm *nm, float *eps)
{
    if (!user)
        return fr_fail(FUSEDROPE_ERR_INVALID, "norm is NULL");
    TRY(fr_struct_take(nm, sizeof *nm, user, norm_layouts,
                       (int)(sizeof norm_layouts / sizeof norm_layouts[0]), "norm"));
    if ((unsigned)nm->weight > FUSEDROPE_NORM_WEIGHT_PLUS_ONE)
        return fr_fail(FUSEDROPE_ERR_INVALID, "norm->weight is %d, not a fusedrope_norm_weight",
                       (int)nm->weight);
    if ((unsigned)nm->rounding > FUSEDROPE_NORM_ROUND_GEMMA)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "norm->rounding is %d, not a fusedrope_norm_rounding", (int)nm->rounding);
    if (!eps_float(nm->eps, eps))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "norm->eps is %g; it must be > 0 and finite as a float32", nm->eps);
    if ((unsigned)nm->weight_dtype > FUSEDROPE_BFLOAT16)
        return fr_fail(FUSEDROPE_ERR_INVALID, "norm->weight_dtype is %d, not a fusedrope_dtype",
                       (int)nm->weight_dtype);
    if (nm->saved_output != 0 && nm->saved_output != 1)
        return fr_fail(FUSEDROPE_ERR_INVALID, "norm->saved_output is %d; it must be 0 or 1",
                       nm->saved_output);
    return FUSEDROPE_OK;
}

static int tensor_empty(const fusedrope_tensor *t)
{
    return t->seq_len == 0 || t->batch == 0 || t->heads == 0;
}

/* The checks both directions share.  tin/tout: the two tensor pairs as the
 * caller passed them (RoPE input and output), count 1 or 2; extra: the saved
 * tensors (backward) or NULL.  Fills *na except the backend-specific parts. */
static fusedrope_status prepare(const fusedrope_cache *cache, fusedrope_style style, float sgn,
                                const fusedrope_positions *pos, const fusedrope_norm *user,
                                int count, const fusedrope_tensor *const tin[2],
                                const fusedrope_tensor *const tout[2],
                                const char *const names[4], const fusedrope_tensor *const saved[2],
                                const char *const saved_names[4], void *stream,
                                fusedrope_norm *nm, fr_norm_args *na)
{
    const int backward = sgn < 0;
    const void *weights[2];
    float *rstd[2], *dw[2];
    static const char *const wname[2] = { "norm->q_weight", "norm->k_weight" };
    static const char *const rname[2] = { "norm->q_rstd", "norm->k_rstd" };
    static const char *const dwname[2] = { "norm->dq_weight", "norm->dk_weight" };
    range r[16]; /* per tensor weight, rstd, dw, in, out, saved; 3 position arrays; the range word */
    int nr = 0, slot = 0;
    fusedrope_dtype dt;
    float eps = 0.0f;

    memset(na, 0, sizeof *na);
    TRY(take_norm(user, nm, &eps));
    if (!cache)
        return fr_fail(FUSEDROPE_ERR_INVALID, "cache is NULL");
    TRY(fr_apply_prepare(cache, style, sgn, pos, count, tin, tout, names, stream, &na->a));
    na->a.cache = cache; /* also when there is nothing to do but zero dw */
    if (backward) {
        /* The saved tensors are inputs of the same shape as dx: the same
         * rules against dx (in place over dx allowed: each row is read
         * before it is written). */
        fr_apply_args xa;
        TRY(fr_apply_prepare(cache, style, sgn, pos, count, saved, tout, saved_names, stream,
                             &xa));
        for (int j = 0; j < xa.count; j++) {
            na->x[j] = xa.io[j].in;
            na->x_ss[j] = xa.io[j].in_ss;
            na->x_sb[j] = xa.io[j].in_sb;
            na->x_sh[j] = xa.io[j].in_sh;
        }
    }
    dt = tin[0]->dtype;
    if (nm->weight_dtype != dt && nm->weight_dtype != FUSEDROPE_FLOAT32)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "norm->weight_dtype is %s; it must be the tensors' dtype (%s) or float32",
                       fr_dtype_name(nm->weight_dtype), fr_dtype_name(dt));

    weights[0] = nm->q_weight;
    weights[1] = nm->k_weight;
    rstd[0] = nm->q_rstd;
    rstd[1] = nm->k_rstd;
    dw[0] = backward ? nm->dq_weight : NULL;
    dw[1] = backward ? nm->dk_weight : NULL;
    for (int k = 0; k < 2; k++) {
        const fusedrope_tensor *t = k < count ? tin[k] : NULL;
        const int64_t hd = t ? t->head_dim : 0;
        int64_t rows = 0;
        if (!t) {
            if (weights[k] || rstd[k] || dw[k])
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "%s is set but the call has no k tensor",
                               weights[k] ? wname[k] : rstd[k] ? rname[k] : dwname[k]);
            continue;
        }
        if (nm->weight == FUSEDROPE_NORM_WEIGHT_NONE) {
            if (weights[k] || dw[k])
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "%s is set but norm->weight is FUSEDROPE_NORM_WEIGHT_NONE",
                               weights[k] ? wname[k] : dwname[k]);
        } else if (!weights[k]) {
            return fr_fail(FUSEDROPE_ERR_INVALID, "%s is NULL; norm->weight %s needs a weight",
                           wname[k], nm->weight == FUSEDROPE_NORM_WEIGHT
                                         ? "FUSEDROPE_NORM_WEIGHT"
                                         : "FUSEDROPE_NORM_WEIGHT_PLUS_ONE");
        }
        /* NULL serves for no rows, as it does for an empty tensor's data
         * (PyTorch exports an empty tensor so) */
        if (backward && !rstd[k] && !tensor_empty(t))
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "%s is NULL; the backward needs the forward's rstd", rname[k]);
        /* an empty tensor has no rows (its seq_len x batch may not even be a
         * number: the plain calls accept any empty shape) */
        if (!tensor_empty(t) && (__builtin_mul_overflow(t->seq_len, t->batch, &rows) ||
                                 __builtin_mul_overflow(rows, t->heads, &rows)))
            return fr_fail(FUSEDROPE_ERR_RANGE, "%s: tokens x heads overflows", rname[k]);
        TRY(array_range(weights[k], hd, fr_dtype_size(nm->weight_dtype), wname[k], 0, cache,
                        &r[nr++]));
        TRY(array_range(rstd[k], rows, sizeof(float), rname[k], 1, cache, &r[nr++]));
        TRY(array_range(dw[k], hd, sizeof(float), dwname[k], 1, cache, &r[nr++]));
        r[nr++] = tensor_range(tin[k], names[2 * k], 0);
        r[nr++] = tensor_range(tout[k], names[2 * k + 1], 1);
        if (backward)
            r[nr++] = tensor_range(saved[k], saved_names[2 * k], 0);
    }
    if (!tensor_empty(tin[0]) || (count > 1 && !tensor_empty(tin[1]))) {
        /* tokens of a non-empty tensor (both share seq_len and batch):
         * no overflow, its extent was checked */
        const fr_pos_args *pa = &na->a.pos;
        const fusedrope_tensor *tt = tensor_empty(tin[0]) ? tin[1] : tin[0];
        const int64_t tokens = tt->seq_len * tt->batch;
        /* extents as fr_apply_prepare checked them (ids: every row of it) */
        TRY(array_range(pa->ids, fr_ids_elems(pa, tokens), sizeof(int64_t), "pos->ids", 0, cache,
                        &r[nr++]));
        TRY(array_range(pa->offsets, pa->cu_seqlens ? pa->num_seqs : tin[0]->batch,
                        sizeof(int64_t), "pos->offsets", 0, cache, &r[nr++]));
        TRY(array_range(pa->cu_seqlens, pa->num_seqs + 1, sizeof(int32_t), "pos->cu_seqlens", 0,
                        cache, &r[nr++]));
    }
    if (na->a.range_status) {
        /* the word the CUDA kernels may write (fr_apply_prepare checked its
         * alignment, device, and the tensors and positions) */
        r[nr].lo = (uintptr_t)na->a.range_status;
        r[nr].hi = r[nr].lo + sizeof *na->a.range_status;
        r[nr].name = "pos->range_status";
        r[nr].tensor = 0;
        r[nr++].alone = 1;
    }
    TRY(check_overlaps(r, nr));

    na->weight = (int)nm->weight;
    na->rounding = (int)nm->rounding;
    na->saved_y = backward && nm->saved_output;
    na->eps = eps;
    na->wdtype = nm->weight_dtype;
    /* fr_apply_prepare's io slots hold the non-empty tensors in order */
    for (int k = 0; k < count; k++) {
        if (tensor_empty(tin[k])) {
            na->dw_zero[k] = dw[k];
            na->dw_zero_n[k] = dw[k] ? tin[k]->head_dim : 0;
            continue;
        }
        if (slot >= na->a.count)
            break;
        na->w[slot] = weights[k];
        na->rstd[slot] = rstd[k];
        na->dw[slot] = dw[k];
        slot++;
    }
    return FUSEDROPE_OK;
}

fusedrope_status fusedrope_norm_forward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                           const fusedrope_positions *pos,
                                           const fusedrope_norm *norm,
                                           const fusedrope_tensor *q_in,
                                           const fusedrope_tensor *q_out,
                                           const fusedrope_tensor *k_in,
                                           const fusedrope_tensor *k_out, void *stream)
{
    static const char *const names[4] = { "q_in", "q_out", "k_in", "k_out" };
    const fusedrope_tensor *in[2] = { q_in, k_in }, *out[2] = { q_out, k_out };
    const int count = k_in || k_out ? 2 : 1;
    fusedrope_norm nm;
    fr_norm_args na;

    if (!q_in || !q_out)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s is NULL", q_in ? "q_out" : "q_in");
    TRY(prepare(cache, style, 1.0f, pos, norm, count, in, out, names, NULL, NULL, stream, &nm,
                &na));
    if (na.a.count == 0)
        return FUSEDROPE_OK;
    if (cache->device == FUSEDROPE_DEVICE_CUDA)
        return fr_cuda_norm_forward(&na);
    return fr_cpu_norm_forward(&na);
}

fusedrope_status fusedrope_norm_backward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                            const fusedrope_positions *pos,
                                            const fusedrope_norm *norm,
                                            const fusedrope_tensor *q_saved,
                                            const fusedrope_tensor *dq_out,
                                            const fusedrope_tensor *dq_in,
                                            const fusedrope_tensor *k_saved,
                                            const fusedrope_tensor *dk_out,
                                            const fusedrope_tensor *dk_in, void *stream)
{
    static const char *const names[4] = { "dq_out", "dq_in", "dk_out", "dk_in" };
    static const char *const saved_names[4] = { "q_saved", "dq_in", "k_saved", "dk_in" };
    const fusedrope_tensor *in[2] = { dq_out, dk_out }, *out[2] = { dq_in, dk_in },
                           *saved[2] = { q_saved, k_saved };
    const int count = k_saved || dk_out || dk_in ? 2 : 1;
    fusedrope_norm nm;
    fr_norm_args na;

    if (!q_saved || !dq_out || !dq_in)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s is NULL",
                       !q_saved ? "q_saved" : !dq_out ? "dq_out" : "dq_in");
    if (count == 2 && !k_saved)
        return fr_fail(FUSEDROPE_ERR_INVALID, "k_saved is NULL");
    TRY(prepare(cache, style, -1.0f, pos, norm, count, in, out, names, saved, saved_names,
                stream, &nm, &na));
    if (cache->device == FUSEDROPE_DEVICE_CUDA)
        return fr_cuda_norm_backward(&na);
    return fr_cpu_norm_backward(&na);
}
