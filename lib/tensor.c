/* tensor.c - descriptors for the common contiguous layouts. */
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
