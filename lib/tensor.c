/* tensor.c - descriptors for the common contiguous layouts and for q, k and
 * v in one packed QKV buffer; the host conversions of the 16-bit dtypes. */
#include "internal.h"

static fusedrope_tensor make(void *data, fusedrope_dtype dtype, int64_t s, int64_t b, int64_t h,
                             int64_t d, int64_t ss, int64_t sb)
{
    fusedrope_tensor t;
    t.data = data;
    t.dtype = dtype;
    t.seq_len = s;
    t.batch = b;
    t.heads = h;
    t.head_dim = d;
    t.stride_seq = ss;
    t.stride_batch = sb;
    t.stride_head = d;
    return t;
}

/* Stride products saturate instead of overflowing: a call that receives such
 * a descriptor finds its extent too large and returns FUSEDROPE_ERR_RANGE. */
static int64_t mul(int64_t a, int64_t b)
{
    int64_t r;
    if (a < 0 || b < 0)
        return -1; /* a negative size: the call reports the size itself */
    if (__builtin_mul_overflow(a, b, &r))
        return INT64_MAX;
    return r;
}

fusedrope_tensor fusedrope_tensor_sbhd(void *data, fusedrope_dtype dtype, int64_t s, int64_t b,
                                       int64_t h, int64_t d)
{
    return make(data, dtype, s, b, h, d, mul(mul(b, h), d), mul(h, d));
}

fusedrope_tensor fusedrope_tensor_bshd(void *data, fusedrope_dtype dtype, int64_t b, int64_t s,
                                       int64_t h, int64_t d)
{
    return make(data, dtype, s, b, h, d, mul(h, d), mul(mul(s, h), d));
}

fusedrope_tensor fusedrope_tensor_thd(void *data, fusedrope_dtype dtype, int64_t t, int64_t h,
                                      int64_t d)
{
    return make(data, dtype, t, 1, h, d, mul(h, d), mul(mul(t, h), d));
}

/* a * b into *r, or 0 when it overflows int64 (a, b >= 0) */
static int mul_ok(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}

fusedrope_status fusedrope_tensor_qkv(void *data, fusedrope_dtype dtype, fusedrope_layout layout,
                                      int64_t s, int64_t b, int64_t heads_q, int64_t heads_kv,
                                      int64_t head_dim, fusedrope_tensor *q, fusedrope_tensor *k,
                                      fusedrope_tensor *v)
{
    const int64_t size[5] = { s, b, heads_q, heads_kv, head_dim };
    static const char *const size_name[5] = { "s", "b", "heads_q", "heads_kv", "head_dim" };
    const size_t es = fr_dtype_size(dtype);
    int64_t heads, row, row_bytes, outer, outer_bytes, ss, sb;
    fusedrope_tensor t;

    if (!data || !q || !k)
        return fr_fail(FUSEDROPE_ERR_INVALID, "%s is NULL", !data ? "data" : !q ? "q" : "k");
    if (es == 0)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "dtype is %d, not a fusedrope_dtype (0 float32, 1 float16, 2 bfloat16)",
                       (int)dtype);
    if (layout != FUSEDROPE_LAYOUT_SBHD && layout != FUSEDROPE_LAYOUT_BSHD &&
        layout != FUSEDROPE_LAYOUT_THD)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "layout is %d, not a fusedrope_layout (0 SBHD, 1 BSHD, 2 THD)",
                       (int)layout);
    for (int i = 0; i < 5; i++)
        if (size[i] < 0)
            return fr_fail(FUSEDROPE_ERR_INVALID, "%s is %lld; it must be >= 0", size_name[i],
                           (long long)size[i]);
    if (layout == FUSEDROPE_LAYOUT_THD && b != 1)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "b is %lld for FUSEDROPE_LAYOUT_THD; packed sequences have b = 1 (s is "
                       "the token count)",
                       (long long)b);
    /* a token row holds heads_q + 2 heads_kv heads; the strides of the two
     * token dimensions are multiples of it, and v starts inside the row */
    if (!mul_ok(heads_kv, 2, &heads) || __builtin_add_overflow(heads, heads_q, &heads) ||
        !mul_ok(heads, head_dim, &row) || !mul_ok(row, (int64_t)es, &row_bytes) ||
        !mul_ok(row, layout == FUSEDROPE_LAYOUT_SBHD ? b : s, &outer) ||
        !mul_ok(outer, (int64_t)es, &outer_bytes))
        return fr_fail(FUSEDROPE_ERR_RANGE,
                       "a QKV buffer of s %lld, b %lld, heads_q %lld + 2 x heads_kv %lld, "
                       "head_dim %lld: its strides overflow",
                       (long long)s, (long long)b, (long long)heads_q, (long long)heads_kv,
                       (long long)head_dim);
    /* row_bytes fits, so the byte offsets of k and v below do */
    ss = layout == FUSEDROPE_LAYOUT_SBHD ? outer : row;
    sb = layout == FUSEDROPE_LAYOUT_SBHD ? row : outer;

    t = make(data, dtype, s, b, heads_q, head_dim, ss, sb);
    *q = t;
    t.heads = heads_kv;
    t.data = (char *)data + (size_t)(heads_q * head_dim) * es;
    *k = t;
    if (v) {
        t.data = (char *)data + (size_t)((heads_q + heads_kv) * head_dim) * es;
        *v = t;
    }
    return FUSEDROPE_OK;
}

/* The one rule for each conversion is rope_math.h's, which the backends use. */
uint16_t fusedrope_float_to_bf16(float f)
{
    return fr_float_to_bf16(f);
}

float fusedrope_bf16_to_float(uint16_t h)
{
    return fr_bf16_to_float(h);
}

uint16_t fusedrope_float_to_half(float f)
{
    return fr_float_to_half(f);
}

float fusedrope_half_to_float(uint16_t h)
{
    return fr_half_to_float(h);
}
