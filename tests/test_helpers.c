/*
 * test_helpers.c - the host conveniences: fusedrope_tensor_qkv's views of a
 * packed QKV buffer (every element of q, k and v addressed where the packed
 * row puts it, a forward_qk through them judged by the float64 reference with
 * v untouched, its refusals), and the 16-bit conversions against the
 * reference's codecs (tests/ref.c): every one of the 65536 values widened,
 * and narrowing of every 16-bit value, of the midpoints between neighbours
 * (ties), of their neighbours one float ulp away, of random float bit
 * patterns (the run's seed) and of the edges (overflow, subnormals, NaN).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "fusedrope.h"
#include "ref.h"
#include "util.h"

/* ------------------------------------------------------------- QKV views */

static const fusedrope_dtype dtypes[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                           FUSEDROPE_BFLOAT16 };

/* Element index, in the packed buffer, of channel c of head h of part
 * (0 q, 1 k, 2 v) at (s, b), written from the row layout alone. */
static int64_t packed_index(fusedrope_layout lay, int64_t S, int64_t B, int64_t hq,
                            int64_t hkv, int64_t d, int part, int64_t s, int64_t b, int64_t h,
                            int64_t c)
{
    const int64_t row = (hq + 2 * hkv) * d;
    const int64_t token = lay == FUSEDROPE_LAYOUT_BSHD ? b * S + s : s * B + b;
    const int64_t head0 = part == 0 ? 0 : part == 1 ? hq : hq + hkv;
    return token * row + (head0 + h) * d + c;
}

/* _i: layout (3) x dtype (3).  Odd sizes; GQA (5 q heads, 2 kv heads). */
START_TEST(test_qkv_views)
{
    const fusedrope_layout lay = (fusedrope_layout)(_i / 3);
    const fusedrope_dtype dt = dtypes[_i % 3];
    const int64_t S = lay == FUSEDROPE_LAYOUT_THD ? 13 : 7, B = lay == FUSEDROPE_LAYOUT_THD ? 1 : 3;
    const int64_t hq = 5, hkv = 2, d = 24, rot = 16;
    const int64_t n = S * B * (hq + 2 * hkv) * d;
    const size_t es = ref_dtype_size(dt);
    tu_buf buf = tu_buf_new(dt, n), orig;
    fusedrope_tensor q, k, v, parts[3];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache = NULL;
    ref_rope rr;
    int64_t *positions;
    char msg[512];
    tu_rng r;

    tu_rng_init(&r, 7000 + (uint64_t)_i);
    tu_fill_random(&buf, &r, -3, 3);
    orig = tu_buf_copy(&buf);
    memset(&v, 0x5a, sizeof v);
    ck_assert_int_eq(fusedrope_tensor_qkv(buf.p, dt, lay, S, B, hq, hkv, d, &q, &k, &v),
                     FUSEDROPE_OK);
    parts[0] = q;
    parts[1] = k;
    parts[2] = v;

    /* every element of each view is where the packed row puts it */
    for (int part = 0; part < 3; part++) {
        const fusedrope_tensor *t = &parts[part];
        const int64_t heads = part ? hkv : hq;
        ck_assert(t->dtype == dt && t->seq_len == S && t->batch == B && t->heads == heads &&
                  t->head_dim == d);
        for (int64_t s = 0; s < S; s++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < heads; h++)
                    for (int64_t c = 0; c < d; c += d - 1) { /* first and last channel */
                        const unsigned char *got =
                            (const unsigned char *)t->data + (size_t)ref_offset(t, s, b, h, c) * es;
                        const unsigned char *want =
                            buf.p + (size_t)packed_index(lay, S, B, hq, hkv, d, part, s, b, h, c) * es;
                        ck_assert_msg(got == want,
                                      "layout %d part %d (s %lld, b %lld, h %lld, c %lld): "
                                      "element %td, want %td",
                                      (int)lay, part, (long long)s, (long long)b, (long long)h,
                                      (long long)c, (got - buf.p) / (ptrdiff_t)es,
                                      (want - buf.p) / (ptrdiff_t)es);
                    }
    }

    /* rotate q and k in place through the views: judged by the reference;
     * v and the channels past rot_dim untouched */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)rot, 64, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    ck_assert_msg(fusedrope_forward_qk(cache, FUSEDROPE_NEOX, NULL, &q, &q, &k, &k, NULL) ==
                      FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    ck_assert_int_eq(ref_rope_from_config(&rr, &cfg), 0);
    positions = tu_positions(NULL, S, B);
    for (int part = 0; part < 2; part++) {
        fusedrope_tensor x = tu_rebase(&parts[part], &buf, &orig);
        ck_assert_msg(ref_check_apply(&rr, FUSEDROPE_NEOX, positions, &x, &parts[part], 0, msg,
                                      sizeof msg) == 0,
                      "layout %d dtype %d part %d: %s", (int)lay, (int)dt, part, msg);
    }
    ref_rope_free(&rr);
    {
        unsigned char *mask = tu_alloc(buf.nbytes);
        size_t first = 0;
        tu_mask_view(&buf, &q, mask);
        tu_mask_view(&buf, &k, mask);
        ck_assert_msg(tu_changed_outside(&buf, &orig, mask, &first) == 0,
                      "bytes outside q and k changed (first at %zu): v or the guard", first);
    }
    tu_free_all();
}
END_TEST

START_TEST(test_qkv_refusals)
{
    float data[64];
    fusedrope_tensor q, k, v, keep;
    memset(&keep, 0x33, sizeof keep);
    q = k = v = keep;
#define REFUSED(st, want, sentence)                                                   \
    do {                                                                              \
        ck_assert_int_eq((st), (want));                                               \
        ck_assert_str_eq(fusedrope_last_error(), (sentence));                         \
        ck_assert(memcmp(&q, &keep, sizeof q) == 0 && memcmp(&k, &keep, sizeof k) == 0 && \
                  memcmp(&v, &keep, sizeof v) == 0);                                  \
    } while (0)
    REFUSED(fusedrope_tensor_qkv(NULL, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 1, 1, 1, 1, 4,
                                 &q, &k, &v),
            FUSEDROPE_ERR_INVALID, "data is NULL");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 1, 1, 1, 1, 4,
                                 &q, NULL, &v),
            FUSEDROPE_ERR_INVALID, "k is NULL");
    REFUSED(fusedrope_tensor_qkv(data, (fusedrope_dtype)3, FUSEDROPE_LAYOUT_SBHD, 1, 1, 1, 1, 4,
                                 &q, &k, &v),
            FUSEDROPE_ERR_INVALID,
            "dtype is 3, not a fusedrope_dtype (0 float32, 1 float16, 2 bfloat16)");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, (fusedrope_layout)3, 1, 1, 1, 1, 4, &q,
                                 &k, &v),
            FUSEDROPE_ERR_INVALID, "layout is 3, not a fusedrope_layout (0 SBHD, 1 BSHD, 2 THD)");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_BSHD, 1, 1, 1, -2, 4,
                                 &q, &k, &v),
            FUSEDROPE_ERR_INVALID, "heads_kv is -2; it must be >= 0");
    /* q NULL: k and v (given) are left as they are */
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 1, 1, 1, 1, 4,
                                 NULL, &k, &v),
            FUSEDROPE_ERR_INVALID, "q is NULL");
    /* each other size negative, in each layout (the others valid) */
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_BSHD, -1, 1, 1, 1, 4,
                                 &q, &k, &v),
            FUSEDROPE_ERR_INVALID, "s is -1; it must be >= 0");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 1, -3, 1, 1, 4,
                                 &q, &k, &v),
            FUSEDROPE_ERR_INVALID, "b is -3; it must be >= 0");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_THD, 2, 1, -1, 1, 4,
                                 &q, &k, &v),
            FUSEDROPE_ERR_INVALID, "heads_q is -1; it must be >= 0");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 1, 1, 1, 1,
                                 INT64_MIN, &q, &k, &v),
            FUSEDROPE_ERR_INVALID, "head_dim is -9223372036854775808; it must be >= 0");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_THD, 4, 2, 1, 1, 4,
                                 &q, &k, &v),
            FUSEDROPE_ERR_INVALID,
            "b is 2 for FUSEDROPE_LAYOUT_THD; packed sequences have b = 1 (s is the token count)");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_BFLOAT16, FUSEDROPE_LAYOUT_SBHD, 2,
                                 INT64_MAX / 64, 8, 4, 128, &q, &k, &v),
            FUSEDROPE_ERR_RANGE,
            "a QKV buffer of s 2, b 144115188075855871, heads_q 8 + 2 x heads_kv 4, head_dim "
            "128: its strides overflow");
    /* the token stride fits in elements but not in bytes (2^58 x 24 floats) */
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 2,
                                 (int64_t)1 << 58, 1, 1, 8, &q, &k, &v),
            FUSEDROPE_ERR_RANGE,
            "a QKV buffer of s 2, b 288230376151711744, heads_q 1 + 2 x heads_kv 1, head_dim "
            "8: its strides overflow");
    /* heads x head_dim past int64_t (its wrapped product, 0, would fit in
     * bytes), and a token row that fits in elements but not in bytes where
     * b = 0 leaves the outer stride 0 */
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 1, 1,
                                 (int64_t)1 << 61, 0, 8, &q, &k, &v),
            FUSEDROPE_ERR_RANGE,
            "a QKV buffer of s 1, b 1, heads_q 2305843009213693952 + 2 x heads_kv 0, head_dim "
            "8: its strides overflow");
    REFUSED(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_SBHD, 1, 0,
                                 (int64_t)1 << 59, 0, 8, &q, &k, &v),
            FUSEDROPE_ERR_RANGE,
            "a QKV buffer of s 1, b 0, heads_q 576460752303423488 + 2 x heads_kv 0, head_dim "
            "8: its strides overflow");
#undef REFUSED
    /* v may be NULL; zero heads are views with no elements */
    ck_assert_int_eq(fusedrope_tensor_qkv(data, FUSEDROPE_FLOAT32, FUSEDROPE_LAYOUT_BSHD, 2, 1,
                                          1, 0, 4, &q, &k, NULL),
                     FUSEDROPE_OK);
    ck_assert(q.data == (void *)data && k.data == (void *)(data + 4) && k.heads == 0 &&
              q.stride_seq == 4 && q.stride_batch == 8);
}
END_TEST

/* --------------------------------------------------------- 16-bit codecs */

static int is_nan16(uint16_t h, fusedrope_dtype dt)
{
    return dt == FUSEDROPE_BFLOAT16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

static uint16_t narrow(float f, fusedrope_dtype dt)
{
    return dt == FUSEDROPE_BFLOAT16 ? fusedrope_float_to_bf16(f) : fusedrope_float_to_half(f);
}

static float widen(uint16_t h, fusedrope_dtype dt)
{
    return dt == FUSEDROPE_BFLOAT16 ? fusedrope_bf16_to_float(h) : fusedrope_half_to_float(h);
}

/* f narrowed by the library and by the reference (one rounding of the exact
 * value): the same bits, or, for NaN, a quiet NaN of f's sign. */
static void expect_narrow(float f, fusedrope_dtype dt, const char *what)
{
    uint16_t got = narrow(f, dt);
    if (isnan(f)) {
        uint16_t quiet = dt == FUSEDROPE_BFLOAT16 ? 0x0040 : 0x0200;
        ck_assert_msg(is_nan16(got, dt) && (got & quiet) && !!(got & 0x8000) == !!signbit(f),
                      "%s %s: NaN %a gave 0x%04x, not a quiet NaN of its sign", ref_dtype_name(dt),
                      what, (double)f, got);
    } else {
        uint16_t want = dt == FUSEDROPE_BFLOAT16 ? ref_double_to_bf16(f) : ref_double_to_half(f);
        ck_assert_msg(got == want, "%s %s: %a gave 0x%04x, reference 0x%04x", ref_dtype_name(dt),
                      what, (double)f, got, want);
    }
}

/* _i: 0 bfloat16, 1 float16 */
START_TEST(test_widen_all)
{
    const fusedrope_dtype dt = _i ? FUSEDROPE_FLOAT16 : FUSEDROPE_BFLOAT16;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = dt == FUSEDROPE_BFLOAT16 ? ref_bf16_to_double((uint16_t)h)
                                               : ref_half_to_double((uint16_t)h);
        float got = widen((uint16_t)h, dt);
        if (isnan(want))
            ck_assert_msg(isnan(got) && !!signbit(got) == !!(h & 0x8000),
                          "%s 0x%04x: %a, want a NaN of its sign", ref_dtype_name(dt), h,
                          (double)got);
        else
            ck_assert_msg((double)got == want && !!signbit(got) == !!signbit(want),
                          "%s 0x%04x: %a, reference %a", ref_dtype_name(dt), h, (double)got, want);
    }
}
END_TEST

START_TEST(test_narrow_sample)
{
    const fusedrope_dtype dt = _i ? FUSEDROPE_FLOAT16 : FUSEDROPE_BFLOAT16;
    static const float edges[] = { 0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f,
                                   65520.0f, -65520.0f, 3.3895314e38f, 3.4028235e38f,
                                   1e-45f, -1e-45f, 5.9604645e-8f, 2.9802322e-8f,
                                   2.9802326e-8f, 1.1754942e-38f, 6.1035156e-5f, 6.1035153e-5f };
    tu_rng r;
    tu_rng_init(&r, 9100 + (uint64_t)_i);
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        expect_narrow(edges[i], dt, "edge");
    expect_narrow(NAN, dt, "NaN");
    expect_narrow(-NAN, dt, "-NaN");
    for (uint32_t h = 0; h < 65536; h++) {
        float f = widen((uint16_t)h, dt);
        /* every value round-trips; the midpoint to the next value is a tie
         * (exact in float), and one float ulp either side of it is not */
        expect_narrow(f, dt, "value");
        if (isfinite(f) && !is_nan16((uint16_t)(h + 1), dt) && ((h + 1) & 0x7fff) != 0 &&
            isfinite(widen((uint16_t)(h + 1), dt))) {
            float m = (float)(((double)f + (double)widen((uint16_t)(h + 1), dt)) / 2);
            expect_narrow(m, dt, "midpoint");
            expect_narrow(nextafterf(m, INFINITY), dt, "above midpoint");
            expect_narrow(nextafterf(m, -INFINITY), dt, "below midpoint");
        }
    }
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)tu_next(&r);
        float f;
        memcpy(&f, &u, 4);
        expect_narrow(f, dt, "random bits");
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("helpers");
    TCase *tc = tcase_create("helpers");
    tcase_set_timeout(tc, tu_under_valgrind() ? 600 : 60);
    tcase_add_loop_test(tc, test_qkv_views, 0, 9);
    tcase_add_test(tc, test_qkv_refusals);
    tcase_add_loop_test(tc, test_widen_all, 0, 2);
    tcase_add_loop_test(tc, test_narrow_sample, 0, 2);
    suite_add_tcase(s, tc);
    return tu_main(s, "test_helpers");
}
