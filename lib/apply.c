/*
 * apply.c - the host-side checks every forward/backward call passes before
 * anything is written, and the dispatch to the OpenMP or CUDA backend.
 * Forward and backward (and their _qk forms) differ only in `sgn`.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

typedef long long ll;

/* One strided dimension of a view: `n` steps of `stride` elements. */
typedef struct { int64_t stride, n; } dim;

/* Sufficient test that blocks of `width` elements placed on the lattice
 * spanned by dims never share an element: sorted by stride, each stride must
 * clear everything the smaller dimensions cover. */
static int lattice_disjoint(dim *d, int nd, int64_t width)
{
    for (int i = 1; i < nd; i++)
        for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; j--) {
            dim t = d[j];
            d[j] = d[j - 1];
            d[j - 1] = t;
        }
    for (int i = 0; i < nd; i++) {
        if (d[i].n <= 1)
            continue;
        if (d[i].stride < width)
            return 0;
        width += (d[i].n - 1) * d[i].stride; /* fits: the extent was checked */
    }
    return 1;
}

static int tokens_empty(const fusedrope_tensor *t)
{
    return t->seq_len == 0 || t->batch == 0 || t->heads == 0;
}

/* The descriptor with the stride of every dimension of size 1 set to 0.  Such
 * a stride never addresses memory (the one index is 0), so it must not decide
 * anything either: a decode call's y may differ from its x only there and is
 * still in place, and a stride there may be any value, negative or huge.
 * Every rule below sees only these canonical strides. */
static fusedrope_tensor canonical(const fusedrope_tensor *t)
{
    fusedrope_tensor c = *t;
    if (c.seq_len == 1)
        c.stride_seq = 0;
    if (c.batch == 1)
        c.stride_batch = 0;
    if (c.heads == 1)
        c.stride_head = 0;
    return c;
}

/* Shape, strides, pointer and extent of one descriptor; *bytes gets the
 * number of bytes from data to one past its last element. */
static fusedrope_status check_tensor(const fusedrope_tensor *t, const char *name, int rot_dim,
                                     int64_t *bytes)
{
    const int64_t size[4] = { t->seq_len, t->batch, t->heads, t->head_dim };
    const int64_t stride[3] = { t->stride_seq, t->stride_batch, t->stride_head };
    static const char *const size_name[4] = { "seq_len", "batch", "heads", "head_dim" };
    static const char *const stride_name[3] = { "stride_seq", "stride_batch", "stride_head" };
    int64_t last = 0, es;

    *bytes = 0;
    if ((unsigned)t->dtype > FUSEDROPE_BFLOAT16)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s->dtype is %d, not a fusedrope_dtype (0 float32, 1 float16, 2 bfloat16)", name,
                       (int)t->dtype);
    for (int i = 0; i < 4; i++)
        if (size[i] < 0)
            return fr_fail(FUSEDROPE_ERR_INVALID, "%s->%s is %lld; it must be >= 0", name,
                           size_name[i], (ll)size[i]);
    for (int i = 0; i < 3; i++)
        if (stride[i] < 0)
            return fr_fail(FUSEDROPE_ERR_INVALID, "%s->%s is %lld; strides must be >= 0", name,
                           stride_name[i], (ll)stride[i]);
    if (tokens_empty(t))
        return FUSEDROPE_OK;
    if (t->head_dim < rot_dim)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s->head_dim is %lld, smaller than the cache's rot_dim %d", name,
                       (ll)t->head_dim, rot_dim);
    if (!t->data)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s->data is NULL for a non-empty tensor", name);
    es = (int64_t)fr_dtype_size(t->dtype);
    if ((uintptr_t)t->data % (uintptr_t)es)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s->data (%p) is not aligned to its %d-byte elements",
                       name, t->data, (int)es);
    for (int i = 0; i < 3; i++) {
        int64_t step;
        if (__builtin_mul_overflow(size[i] - 1, stride[i], &step) ||
            __builtin_add_overflow(last, step, &last))
            goto overflow;
    }
    if (__builtin_add_overflow(last, t->head_dim, &last) ||
        __builtin_mul_overflow(last, es, bytes) || (uint64_t)*bytes > SIZE_MAX ||
        (uintptr_t)t->data + (uint64_t)*bytes < (uintptr_t)t->data)
        goto overflow;
    return FUSEDROPE_OK;
overflow:
    return fr_fail(FUSEDROPE_ERR_RANGE,
                   "%s spans more memory than can be addressed (seq_len %lld x stride %lld, "
                   "batch %lld x stride %lld, heads %lld x stride %lld, head_dim %lld)",
                   name, (ll)t->seq_len, (ll)t->stride_seq, (ll)t->batch, (ll)t->stride_batch,
                   (ll)t->heads, (ll)t->stride_head, (ll)t->head_dim);
}

static fusedrope_status check_output_layout(const fusedrope_tensor *t, const char *name)
{
    dim d[3] = { { t->stride_seq, t->seq_len }, { t->stride_batch, t->batch },
                 { t->stride_head, t->heads } };
    if (!lattice_disjoint(d, 3, t->head_dim))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s's elements may overlap each other (strides seq %lld, batch %lld, head "
                       "%lld with head_dim %lld: taken smallest first, each stride of a dimension "
                       "of more than one element must clear what the smaller ones span); the "
                       "elements of an output must not share memory",
                       name, (ll)t->stride_seq, (ll)t->stride_batch, (ll)t->stride_head,
                       (ll)t->head_dim);
    return FUSEDROPE_OK;
}

/* What each refusal of views that views_disjoint cannot prove apart says. */
#define NOT_PROVABLY_APART "(not provably apart: the test is conservative, fusedrope_forward(3))"

/* Whether two non-empty views provably share no byte: their address ranges
 * are apart, or they share one token lattice (same seq and batch strides) and
 * their heads never meet inside a token -- q and k as views into one packed
 * QKV buffer, grouped by head or interleaved head by head.  The views are
 * canonical(): a dimension of size 1 has stride 0 in both. */
static int views_disjoint(const fusedrope_tensor *a, int64_t abytes, const fusedrope_tensor *b,
                          int64_t bbytes)
{
    uintptr_t pa = (uintptr_t)a->data, pb = (uintptr_t)b->data;
    int64_t es = (int64_t)fr_dtype_size(a->dtype), delta, ha = 0, hb = 0, lo, hi;
    dim d[2] = { { a->stride_seq, a->seq_len }, { a->stride_batch, a->batch } };

    if (pa + (uint64_t)abytes <= pb || pb + (uint64_t)bbytes <= pa)
        return 1;
    if (a->dtype != b->dtype || a->seq_len != b->seq_len || a->batch != b->batch ||
        a->stride_seq != b->stride_seq || a->stride_batch != b->stride_batch)
        return 0;
    if (pb >= pa ? (pb - pa) % (uint64_t)es : (pa - pb) % (uint64_t)es)
        return 0;
    delta = pb >= pa ? (int64_t)((pb - pa) / (uint64_t)es) : -(int64_t)((pa - pb) / (uint64_t)es);
    /* Heads of one token are intervals [h*stride_head, +head_dim), sorted by
     * start in each view: sweep both lists for a meeting.  Bounded so that a
     * descriptor with absurd head counts cannot stall the call. */
    if (a->heads + b->heads > (1 << 20))
        return 0;
    while (ha < a->heads && hb < b->heads) {
        int64_t a0 = ha * a->stride_head, a1 = a0 + a->head_dim;
        int64_t b0 = delta + hb * b->stride_head, b1 = b0 + b->head_dim;
        if (a1 <= b0)
            ha++;
        else if (b1 <= a0)
            hb++;
        else
            return 0;
    }
    /* ...and tokens must stay apart: one token's span of both views against
     * the seq/batch lattice. */
    lo = delta < 0 ? delta : 0;
    hi = (a->heads - 1) * a->stride_head + a->head_dim;
    if (delta + (b->heads - 1) * b->stride_head + b->head_dim > hi)
        hi = delta + (b->heads - 1) * b->stride_head + b->head_dim;
    return lattice_disjoint(d, 2, hi - lo);
}

/* Device memory on a CPU cache, host memory on a CUDA cache, another GPU's
 * memory on a CUDA cache (the kernels run on the cache's device, which
 * without peer access faults on it); managed memory serves every device. */
static fusedrope_status check_pointer_device(const void *p, const char *name,
                                             const fusedrope_cache *cache)
{
    int kind, on;
    if (!p)
        return FUSEDROPE_OK;
    kind = fr_cuda_pointer_kind(p, &on);
    if (kind == FR_PTR_ERROR)
        return FUSEDROPE_ERR_CUDA;
    if (cache->device == FUSEDROPE_DEVICE_CUDA && (kind == FR_PTR_HOST || kind == FR_PTR_PINNED))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s is host memory but the cache is on the CUDA device", name);
    if (cache->device == FUSEDROPE_DEVICE_CPU && kind == FR_PTR_DEVICE)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s is CUDA device memory but the cache is on the CPU",
                       name);
    if (cache->device == FUSEDROPE_DEVICE_CUDA && kind == FR_PTR_DEVICE &&
        on != cache->cuda_device)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s is memory of CUDA device %d but the cache is on CUDA device %d", name,
                       on, cache->cuda_device);
    return FUSEDROPE_OK;
}

/* pos->range_status: for a CUDA cache any word the device writes at that
 * address (device, managed, or page-locked host memory such as
 * cudaHostAlloc's, which the host then reads without a copy); for a CPU
 * cache host memory, never written (a CPU call reports range errors in its
 * status). */
static fusedrope_status check_status_word_device(const int32_t *w, const fusedrope_cache *cache)
{
    const fusedrope_device dev = cache->device;
    int kind, on;
    if (!w)
        return FUSEDROPE_OK;
    kind = fr_cuda_pointer_kind(w, &on);
    if (kind == FR_PTR_ERROR)
        return FUSEDROPE_ERR_CUDA;
    if (dev == FUSEDROPE_DEVICE_CUDA && kind == FR_PTR_HOST)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "pos->range_status is pageable host memory, which the CUDA device "
                       "cannot write: use device, managed or page-locked (cudaHostAlloc) memory");
    if (dev == FUSEDROPE_DEVICE_CPU && kind == FR_PTR_DEVICE)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "pos->range_status is CUDA device memory but the cache is on the CPU");
    if (dev == FUSEDROPE_DEVICE_CUDA && kind == FR_PTR_DEVICE && on != cache->cuda_device)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "pos->range_status is memory of CUDA device %d but the cache is on CUDA "
                       "device %d", on, cache->cuda_device);
    return FUSEDROPE_OK;
}

/* The sizes fusedrope_positions has had (fr_struct_take). */
static const size_t positions_layouts[] = {
    FR_LAYOUT_SIZE(fusedrope_positions, cp_rank), /* 0.1 */
    FR_LAYOUT_SIZE(fusedrope_positions, range_status), /* 0.2 */
};

/* Position rules that need no look at the arrays' contents. */
static fusedrope_status check_positions(const fusedrope_positions *user_pos,
                                        const fusedrope_tensor *t, const char *name,
                                        const fusedrope_cache *cache, fr_pos_args *pa,
                                        int32_t **range_status)
{
    fusedrope_positions pos_copy, *pos = &pos_copy;

    memset(pa, 0, sizeof *pa);
    *range_status = NULL;
    pa->seq_len = t->seq_len;
    pa->cp_size = 1;
    pa->num_axes = cache->num_axes;
    pa->ids_rows = 1;
    pa->negative_ok = cache->negative_ok;
    if (!user_pos)
        return FUSEDROPE_OK;
    TRY(fr_struct_take(&pos_copy, sizeof pos_copy, user_pos, positions_layouts,
                       (int)(sizeof positions_layouts / sizeof positions_layouts[0]), "pos"));
    if (pos->ids_axes < 0 || pos->ids_axes > FUSEDROPE_MAX_AXES ||
        (pos->ids_axes > 1 && pos->ids_axes != cache->num_axes))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "pos->ids_axes is %d; it must be 0 or 1 (one position per token for "
                       "every axis) or the cache's number of position axes, %d",
                       pos->ids_axes, cache->num_axes);
    if (pos->ids_axes > 1 && !pos->ids)
        return fr_fail(FUSEDROPE_ERR_INVALID, "pos->ids_axes is %d but pos->ids is NULL",
                       pos->ids_axes);
    if (pos->ids_axis_stride < 0)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "pos->ids_axis_stride is %lld; it must be >= 0 (0: rows of batch x "
                       "seq_len positions one after the other)", (ll)pos->ids_axis_stride);
    if (pos->ids) {
        int64_t row;
        /* an empty tensor's sizes are not range-checked: one of 0 heads may
         * have batch x seq_len past int64; the ids' size and walk, here and
         * below, count batch x seq_len entries */
        if (__builtin_mul_overflow(t->batch, t->seq_len, &row))
            return fr_fail(FUSEDROPE_ERR_RANGE,
                           "%s->batch x %s->seq_len (%lld x %lld) overflows int64: ids of "
                           "that many positions cannot exist",
                           name, name, (ll)t->batch, (ll)t->seq_len);
        if (pos->ids_axes > 1) {
            if (pos->ids_axis_stride != 0 && pos->ids_axis_stride < row)
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "pos->ids_axis_stride is %lld; rows of ids hold batch x seq_len "
                               "= %lld positions, so it must be 0 (dense) or >= %lld",
                               (ll)pos->ids_axis_stride, (ll)row, (ll)row);
            pa->ids_rows = pos->ids_axes;
            pa->ids_row_stride = pos->ids_axis_stride ? pos->ids_axis_stride : row;
        }
    }
    *range_status = pos->range_status;
    pa->ids = pos->ids;
    pa->offsets = pos->offsets;
    pa->cu_seqlens = pos->cu_seqlens;
    pa->num_seqs = pos->cu_seqlens ? pos->num_seqs : 0;
    if (pos->cp_size < 0)
        return fr_fail(FUSEDROPE_ERR_INVALID, "pos->cp_size is %d; it must be >= 1 (0 means 1)",
                       pos->cp_size);
    pa->cp_size = pos->cp_size ? pos->cp_size : 1;
    if (pos->cp_rank < 0 || pos->cp_rank >= pa->cp_size)
        return fr_fail(FUSEDROPE_ERR_INVALID, "pos->cp_rank is %d; it must be in [0, %d)",
                       pos->cp_rank, pa->cp_size);
    pa->cp_rank = pos->cp_rank;
    if (pos->ids && (pos->offsets || pa->cp_size > 1))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "pos->ids are absolute positions and cannot be combined with %s",
                       pos->offsets ? "pos->offsets" : "context parallelism (pos->cp_size > 1)");
    if (pos->cu_seqlens) {
        if (t->batch != 1)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "pos->cu_seqlens is given (packed THD) but %s->batch is %lld, not 1",
                           name, (ll)t->batch);
        if (pos->num_seqs < 1 || pos->num_seqs == INT64_MAX)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "pos->num_seqs is %lld; it must be in [1, INT64_MAX)",
                           (ll)pos->num_seqs);
    } else if (pa->cp_size > 1 && t->seq_len % 2) {
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s->seq_len is %lld; context parallelism (pos->cp_size %d) needs an "
                       "even local length",
                       name, (ll)t->seq_len, pa->cp_size);
    } else if (t->seq_len > INT64_MAX / pa->cp_size) {
        return fr_fail(FUSEDROPE_ERR_RANGE,
                       "%s->seq_len %lld x pos->cp_size %d: the global sequence length "
                       "overflows",
                       name, (ll)t->seq_len, pa->cp_size);
    }
    return FUSEDROPE_OK;
}

/* A position array: aligned to its elements, and outside every output (a
 * backend reads positions while it writes). */
static fusedrope_status check_position_array(const void *p, const char *name, size_t es,
                                             int64_t count, const fusedrope_tensor *const out[2],
                                             const int64_t bytes_out[2], int nout,
                                             const char *const names[4])
{
    int64_t bytes = 0; /* set where fr_check_array succeeds; gcc 16 cannot see it */
    if (!p)
        return FUSEDROPE_OK;
    TRY(fr_check_array(p, count, es, name, &bytes));
    for (int k = 0; k < nout; k++) {
        uintptr_t o = (uintptr_t)out[k]->data, a = (uintptr_t)p;
        if (!tokens_empty(out[k]) && a < o + (uint64_t)bytes_out[k] && o < a + (uint64_t)bytes)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "%s may overlap the output %s (the test takes the tensor as its "
                           "whole span, fusedrope_forward(3)); the call writes it while "
                           "reading positions, so they must not share memory",
                           name, names[2 * k + 1]);
    }
    return FUSEDROPE_OK;
}

/* pos->range_status: one aligned word that the kernels may write while
 * they read the inputs and positions and write the outputs, so it must
 * share no byte with any of them. */
static fusedrope_status check_range_status(const int32_t *w, const fusedrope_tensor *const in[2],
                                           const int64_t bytes_in[2],
                                           const fusedrope_tensor *const out[2],
                                           const int64_t bytes_out[2], int count,
                                           const fr_pos_args *pa)
{
    const uintptr_t a = (uintptr_t)w;
    /* span: the entry's bytes are a whole span with gaps (a strided tensor,
     * rows of ids), so a word among them may lie in a gap */
    struct { uintptr_t p; uint64_t n; const char *name; int span; } other[7];
    int n = 0;

    if (!w)
        return FUSEDROPE_OK;
    if (a % sizeof *w)
        return fr_fail(FUSEDROPE_ERR_INVALID, "pos->range_status (%p) is not 4-byte aligned",
                       (const void *)w);
    for (int k = 0; k < count; k++) {
        if (tokens_empty(in[k]))
            continue;
        other[n].p = (uintptr_t)in[k]->data;
        other[n].n = (uint64_t)bytes_in[k];
        other[n].span = 1;
        other[n++].name = k ? "the k/dk input tensor" : "the input tensor";
        other[n].p = (uintptr_t)out[k]->data;
        other[n].n = (uint64_t)bytes_out[k];
        other[n].span = 1;
        other[n++].name = k ? "the k/dk output tensor" : "the output tensor";
    }
    if (pa->ids) { /* every row of it */
        other[n].p = (uintptr_t)pa->ids;
        other[n].n = (uint64_t)fr_ids_elems(pa, in[0]->batch * in[0]->seq_len) * sizeof(int64_t);
        other[n].span = pa->ids_rows > 1;
        other[n++].name = "pos->ids";
    }
    if (pa->offsets) {
        other[n].p = (uintptr_t)pa->offsets;
        other[n].n = (uint64_t)(pa->cu_seqlens ? pa->num_seqs : in[0]->batch) * sizeof(int64_t);
        other[n].span = 0;
        other[n++].name = "pos->offsets";
    }
    if (pa->cu_seqlens) {
        other[n].p = (uintptr_t)pa->cu_seqlens;
        other[n].n = (uint64_t)(pa->num_seqs + 1) * sizeof(int32_t);
        other[n].span = 0;
        other[n++].name = "pos->cu_seqlens";
    }
    for (int i = 0; i < n; i++)
        if (a < other[i].p + other[i].n && other[i].p < a + sizeof *w)
            return fr_fail(FUSEDROPE_ERR_INVALID, "pos->range_status (%p) %s %s%s",
                           (const void *)w, other[i].span ? "may lie inside" : "lies inside",
                           other[i].name,
                           other[i].span ? " (the test takes it as its whole span, "
                                           "fusedrope_forward(3))" : "");
    return FUSEDROPE_OK;
}

/* Positions that come from no array (implicit, maybe context-parallel) are
 * known on the host whatever the device: the largest is the last local
 * token's (rank r's second chunk, 2*cp_size-1-r, never precedes its first,
 * r, since r < cp_size). */
static fusedrope_status check_implicit_positions(const fr_pos_args *pa, int64_t max_positions)
{
    int64_t last;
    if (pa->ids || pa->offsets || pa->cu_seqlens || max_positions == 0 || pa->seq_len == 0)
        return FUSEDROPE_OK;
    last = fr_cp_position(pa->seq_len - 1, pa->seq_len, pa->cp_size, pa->cp_rank);
    if (last >= max_positions)
        return fr_fail(FUSEDROPE_ERR_RANGE,
                       "the implicit positions reach %lld, outside the table's [0, %lld) "
                       "(seq_len %lld, cp_size %d, cp_rank %d)",
                       (ll)last, (ll)max_positions, (ll)pa->seq_len, pa->cp_size, pa->cp_rank);
    return FUSEDROPE_OK;
}

/* FUSEDROPE_OK when token (b, s) has a valid position on every axis of the
 * cache, else its refusal (RANGE) naming the first bad axis. */
static fusedrope_status token_check(const fr_pos_args *pa, int64_t b, int64_t s,
                                    int64_t max_positions)
{
    int bad = 0;
    const int64_t p0 = fr_token_position(pa, b, s, &bad);
    for (int a = 0; a < pa->num_axes; a++) {
        const int64_t p = fr_token_axis_position(pa, b, s, a, p0, &bad);
        char axis[24] = "", token[64];
        if (!bad && (max_positions == 0 || p < max_positions))
            continue;
        if (pa->num_axes > 1)
            snprintf(axis, sizeof axis, " on axis %d", a);
        /* THD's s is the packed token's index, not a place in its sequence */
        if (pa->cu_seqlens)
            snprintf(token, sizeof token, "token %lld of the packed tokens", (ll)s);
        else
            snprintf(token, sizeof token, "token (batch %lld, seq %lld)", (ll)b, (ll)s);
        /* bad without a negative position: the offset's sum left int64
         * (the host has checked cu_seqlens, so no token is outside a
         * sequence) */
        if (bad && p >= 0)
            return fr_fail(FUSEDROPE_ERR_RANGE,
                           "%s: its position plus pos->offsets lies outside int64_t", token);
        if (max_positions > 0)
            return fr_fail(FUSEDROPE_ERR_RANGE,
                           "%s has position %lld%s, outside the table's [0, %lld)", token,
                           (ll)p, axis, (ll)max_positions);
        return fr_fail(FUSEDROPE_ERR_RANGE, "%s has position %lld%s; positions must be >= 0",
                       token, (ll)p, axis);
    }
    return FUSEDROPE_OK;
}

/* CPU only: the contents of the position arrays, every token, before any write. */
static fusedrope_status check_position_values(const fr_pos_args *pa, int64_t batch,
                                              int64_t max_positions)
{
    if (pa->cu_seqlens) {
        const int32_t *cu = pa->cu_seqlens;
        if (cu[0] != 0)
            return fr_fail(FUSEDROPE_ERR_INVALID, "pos->cu_seqlens[0] is %d; it must be 0",
                           (int)cu[0]);
        for (int64_t i = 0; i < pa->num_seqs; i++) {
            if (fr_cu_step_bad(pa, i))
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "pos->cu_seqlens is not monotonic: cu_seqlens[%lld] = %d < "
                               "cu_seqlens[%lld] = %d",
                               (ll)(i + 1), (int)cu[i + 1], (ll)i, (int)cu[i]);
            if (pa->cp_size > 1 && (cu[i + 1] - cu[i]) % 2)
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "sequence %lld has local length %d; context parallelism needs "
                               "even lengths",
                               (ll)i, (int)(cu[i + 1] - cu[i]));
        }
        if ((int64_t)cu[pa->num_seqs] != pa->seq_len)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "pos->cu_seqlens[num_seqs = %lld] is %d but the tensor has %lld tokens",
                           (ll)pa->num_seqs, (int)cu[pa->num_seqs], (ll)pa->seq_len);
    }
    if (pa->seq_len == 0) /* no token, whatever the batch (an empty call's may be any) */
        return FUSEDROPE_OK;
    for (int64_t b = 0; b < batch; b++) {
        if (pa->ids) { /* an array entry a token: each is read */
            for (int64_t s = 0; s < pa->seq_len; s++)
                TRY(token_check(pa, b, s, max_positions));
            continue;
        }
        /* Without ids a sequence's positions increase with its tokens
         * (fr_cp_position, plus one offset): a prefix of them may be
         * negative, a suffix past the table or int64, so its first and last
         * tokens tell whether one is bad, and bisection finds the first bad
         * one, the token the full walk would name.  The work follows the
         * arrays (batch entries, sequences), not the tokens: an empty call
         * (no heads) may give any seq_len. */
        for (int64_t i = 0; i < (pa->cu_seqlens ? pa->num_seqs : 1); i++) {
            int64_t lo = pa->cu_seqlens ? pa->cu_seqlens[i] : 0;
            int64_t hi = (pa->cu_seqlens ? pa->cu_seqlens[i + 1] : pa->seq_len) - 1;
            if (hi < lo)
                continue;
            TRY(token_check(pa, b, lo, max_positions));
            if (hi == lo || token_check(pa, b, hi, max_positions) == FUSEDROPE_OK)
                continue; /* (one token: every decode step's sequence) */
            while (hi - lo > 1) { /* lo good, hi bad (a refusal sets the message only) */
                const int64_t mid = lo + (hi - lo) / 2;
                if (token_check(pa, b, mid, max_positions) != FUSEDROPE_OK)
                    hi = mid;
                else
                    lo = mid;
            }
            return token_check(pa, b, hi, max_positions);
        }
    }
    return FUSEDROPE_OK;
}

fusedrope_status fr_apply_prepare(const fusedrope_cache *cache, fusedrope_style style, float sgn,
                                  const fusedrope_positions *pos, int count,
                                  const fusedrope_tensor *const user_in[2],
                                  const fusedrope_tensor *const user_out[2],
                                  const char *const names[4], void *stream,
                                  fr_apply_args *prepared)
{
    int64_t bytes_in[2] = { 0, 0 }, bytes_out[2] = { 0, 0 };
    fusedrope_tensor canon[4];
    const fusedrope_tensor *in[2] = { NULL, NULL }, *out[2] = { NULL, NULL };
    fr_apply_args args;

    memset(prepared, 0, sizeof *prepared); /* count 0: nothing to do */

    if (!cache)
        return fr_fail(FUSEDROPE_ERR_INVALID, "cache is NULL");
    if (style != FUSEDROPE_NEOX && style != FUSEDROPE_INTERLEAVED)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "style is %d, not a fusedrope_style (0 FUSEDROPE_NEOX, 1 "
                       "FUSEDROPE_INTERLEAVED)",
                       (int)style);

    for (int k = 0; k < count; k++) {
        if (!user_in[k] || !user_out[k])
            return fr_fail(FUSEDROPE_ERR_INVALID, "%s is NULL",
                           names[user_in[k] ? 2 * k + 1 : 2 * k]);
        canon[2 * k] = canonical(user_in[k]);
        canon[2 * k + 1] = canonical(user_out[k]);
        in[k] = &canon[2 * k];
        out[k] = &canon[2 * k + 1];
    }
    for (int k = 0; k < count; k++) {
        const fusedrope_tensor *x = in[k], *y = out[k];
        const char *xn = names[2 * k], *yn = names[2 * k + 1];
        TRY(check_tensor(x, xn, cache->rot_dim, &bytes_in[k]));
        TRY(check_tensor(y, yn, cache->rot_dim, &bytes_out[k]));
        if (x->dtype != y->dtype || x->seq_len != y->seq_len || x->batch != y->batch ||
            x->heads != y->heads || x->head_dim != y->head_dim)
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "%s (%s, %lld x %lld x %lld x %lld) and %s (%s, "
                           "%lld x %lld x %lld x %lld) differ in dtype or shape "
                           "(seq_len x batch x heads x head_dim)",
                           xn, fr_dtype_name(x->dtype), (ll)x->seq_len, (ll)x->batch,
                           (ll)x->heads, (ll)x->head_dim, yn, fr_dtype_name(y->dtype),
                           (ll)y->seq_len, (ll)y->batch,
                           (ll)y->heads, (ll)y->head_dim);
    }
    if (count == 2 && (in[0]->seq_len != in[1]->seq_len || in[0]->batch != in[1]->batch ||
                       in[0]->dtype != in[1]->dtype))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s (seq_len %lld, batch %lld, %s) and %s (seq_len %lld, batch "
                       "%lld, %s) must agree in seq_len, batch and dtype",
                       names[0], (ll)in[0]->seq_len, (ll)in[0]->batch, fr_dtype_name(in[0]->dtype),
                       names[2], (ll)in[1]->seq_len, (ll)in[1]->batch,
                       fr_dtype_name(in[1]->dtype));

    memset(&args, 0, sizeof args);
    /* A call whose tensors are all empty passes every check below too (the
     * empty tensors drop out of them) and ends with args.count 0: the
     * positions' rules hold for it as for any call. */
    TRY(check_positions(pos, in[0], names[0], cache, &args.pos, &args.range_status));

    /* Overlap: each output against itself, its own input (equal = in place)
     * and, for _qk, the other pair's input and output. */
    for (int k = 0; k < count; k++) {
        const fusedrope_tensor *y = out[k];
        if (tokens_empty(y))
            continue;
        TRY(check_output_layout(y, names[2 * k + 1]));
        for (int j = 0; j < count; j++) {
            const fusedrope_tensor *x = in[j];
            int same = x->data == y->data && x->stride_seq == y->stride_seq &&
                       x->stride_batch == y->stride_batch && x->stride_head == y->stride_head;
            if (tokens_empty(x) || (j == k && same))
                continue;
            /* the first element is shared, so this is never disjoint: the
             * caller most likely meant in place */
            if (j == k && x->data == y->data)
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "%s has the same data pointer as %s but different strides (%s: "
                               "seq %lld, batch %lld, head %lld; %s: seq %lld, batch %lld, head "
                               "%lld): not in place; give the output the input's strides for in "
                               "place, or a separate buffer",
                               names[2 * k + 1], names[2 * j], names[2 * j],
                               (ll)user_in[j]->stride_seq, (ll)user_in[j]->stride_batch,
                               (ll)user_in[j]->stride_head, names[2 * k + 1],
                               (ll)user_out[k]->stride_seq, (ll)user_out[k]->stride_batch,
                               (ll)user_out[k]->stride_head);
            if (!views_disjoint(y, bytes_out[k], x, bytes_in[j]))
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "%s may %s %s " NOT_PROVABLY_APART "; an output must be the "
                               "same view as its input (in place) or share no memory with any "
                               "input",
                               names[2 * k + 1], j == k ? "partially overlap" : "overlap",
                               names[2 * j]);
        }
        if (k == 1 && !tokens_empty(out[0]) &&
            !views_disjoint(out[0], bytes_out[0], out[1], bytes_out[1]))
            return fr_fail(FUSEDROPE_ERR_INVALID,
                           "%s and %s may overlap " NOT_PROVABLY_APART
                           "; the two outputs must not share memory",
                           names[1], names[3]);
    }

    if (args.pos.ids) {
        /* the last row starts rows-1 strides in */
        int64_t n = in[0]->batch * in[0]->seq_len, lead = 0;
        if (args.pos.ids_rows > 1 &&
            (__builtin_mul_overflow((int64_t)(args.pos.ids_rows - 1), args.pos.ids_row_stride,
                                    &lead) ||
             __builtin_add_overflow(lead, n, &n)))
            return fr_fail(FUSEDROPE_ERR_RANGE,
                           "pos->ids: %d rows %lld apart span more memory than can be addressed",
                           args.pos.ids_rows, (ll)args.pos.ids_row_stride);
        TRY(check_position_array(args.pos.ids, "pos->ids", sizeof(int64_t), n, out, bytes_out,
                                 count, names));
    }
    TRY(check_position_array(args.pos.offsets, "pos->offsets", sizeof(int64_t),
                             args.pos.cu_seqlens ? args.pos.num_seqs : in[0]->batch, out,
                             bytes_out, count, names));
    TRY(check_position_array(args.pos.cu_seqlens, "pos->cu_seqlens", sizeof(int32_t),
                             args.pos.num_seqs + 1, out, bytes_out, count, names));
    TRY(check_range_status(args.range_status, in, bytes_in, out, bytes_out, count, &args.pos));

    /* Every pointer must live where the cache does. */
    for (int k = 0; k < count; k++) {
        if (tokens_empty(in[k]))
            continue;
        TRY(check_pointer_device(in[k]->data, names[2 * k], cache));
        if (out[k]->data != in[k]->data) /* in place: one query (each costs, RESULTS.md) */
            TRY(check_pointer_device(out[k]->data, names[2 * k + 1], cache));
    }
    TRY(check_pointer_device(args.pos.ids, "pos->ids", cache));
    TRY(check_pointer_device(args.pos.offsets, "pos->offsets", cache));
    TRY(check_pointer_device(args.pos.cu_seqlens, "pos->cu_seqlens", cache));
    TRY(check_status_word_device(args.range_status, cache));
    if (in[0]->batch > 0) /* else no token, so no position (seq_len may be anything) */
        TRY(check_implicit_positions(&args.pos, cache->max_positions));
    if (cache->device == FUSEDROPE_DEVICE_CPU &&
        (args.pos.ids || args.pos.offsets || args.pos.cu_seqlens))
        TRY(check_position_values(&args.pos, in[0]->batch, cache->max_positions));

    args.cache = cache;
    args.sgn = sgn;
    args.interleaved = style == FUSEDROPE_INTERLEAVED;
    args.dtype = in[0]->dtype;
    args.seq_len = in[0]->seq_len;
    args.batch = in[0]->batch;
    args.stream = stream;
    for (int k = 0; k < count; k++) {
        const fusedrope_tensor *x = in[k], *y = out[k];
        fr_io *io = &args.io[args.count];
        if (tokens_empty(x))
            continue;
        io->in = x->data;
        io->out = y->data;
        io->heads = x->heads;
        io->head_dim = x->head_dim;
        io->in_ss = x->stride_seq;
        io->in_sb = x->stride_batch;
        io->in_sh = x->stride_head;
        io->out_ss = y->stride_seq;
        io->out_sb = y->stride_batch;
        io->out_sh = y->stride_head;
        io->in_place = x->data == y->data;
        args.count++;
    }
    *prepared = args;
    return FUSEDROPE_OK;
}

/* ---- the plain calls: checks, then the backend (fr_apply_prepare is
 * shared with lib/norm.c, which runs its own backends) ---- */

fusedrope_status fr_apply(const fusedrope_cache *cache, fusedrope_style style, float sgn,
                          const fusedrope_positions *pos, int count,
                          const fusedrope_tensor *const in[2],
                          const fusedrope_tensor *const out[2], const char *const names[4],
                          void *stream)
{
    fr_apply_args args;
    TRY(fr_apply_prepare(cache, style, sgn, pos, count, in, out, names, stream, &args));
    if (args.count == 0)
        return FUSEDROPE_OK;
    if (cache->device == FUSEDROPE_DEVICE_CUDA)
        return fr_cuda_apply(&args);
    fr_cpu_apply(&args);
    return FUSEDROPE_OK;
}

fusedrope_status fr_apply_call(const fusedrope_cache *cache, fusedrope_style style, fr_call call,
                               const fusedrope_positions *pos, const fusedrope_tensor *a_in,
                               const fusedrope_tensor *a_out, const fusedrope_tensor *b_in,
                               const fusedrope_tensor *b_out, void *stream)
{
    /* the names the man pages give the arguments, per call */
    static const char *const names[4][4] = {
        { "x", "y", "", "" },
        { "q_in", "q_out", "k_in", "k_out" },
        { "dy", "dx", "", "" },
        { "dq_out", "dq_in", "dk_out", "dk_in" },
    };
    const int qk = call == FR_CALL_FORWARD_QK || call == FR_CALL_BACKWARD_QK;
    const int backward = call == FR_CALL_BACKWARD || call == FR_CALL_BACKWARD_QK;
    const fusedrope_tensor *const in[2] = { a_in, b_in }, *const out[2] = { a_out, b_out };
    return fr_apply(cache, style, backward ? -1.0f : 1.0f, pos, qk ? 2 : 1, in, out, names[call],
                    stream);
}

fusedrope_status fr_check_pointer(const void *p, const char *name, const fusedrope_cache *cache)
{
    return check_pointer_device(p, name, cache);
}

fusedrope_status fr_check_array(const void *p, int64_t n, size_t es, const char *name,
                                int64_t *bytes)
{
    if ((uintptr_t)p % es)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s (%p) is not aligned to its %d-byte elements",
                       name, p, (int)es);
    if (__builtin_mul_overflow(n, (int64_t)es, bytes) ||
        (uintptr_t)p + (uint64_t)*bytes < (uintptr_t)p)
        return fr_fail(FUSEDROPE_ERR_RANGE, "%s: %lld entries span more memory than can be addressed",
                       name, (ll)n);
    return FUSEDROPE_OK;
}
