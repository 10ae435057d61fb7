/*
 * test_unit_dims.c - the stride of a dimension of size 1 (seq_len, batch or
 * heads equal to 1, as in decode) addresses nothing and must decide nothing:
 * an output that differs from its input only there is in place, any value
 * there (negative, INT64_MAX, INT64_MIN) is accepted without an overflow,
 * and the bytes written are those of the same call with ordinary strides,
 * within DESIGN's bound of the float64 reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define CPU FUSEDROPE_DEVICE_CPU
#define MSG 2048

static const fusedrope_dtype dtypes[3] = {FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                          FUSEDROPE_BFLOAT16};

/* Shapes with one or more dimensions of size 1: S, B, H. */
static const int64_t shapes[][3] = {
    {1, 3, 5}, /* decode: one token per batch entry */
    {7, 1, 3}, /* one batch entry */
    {4, 2, 1}, /* one head (the k of multi-query attention) */
    {1, 1, 4}, /* single-sequence decode */
    {1, 1, 1},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* Values a caller may leave in an unused stride. */
static const int64_t odd_strides[] = {0, -1, -12345, 7, INT64_MAX, INT64_MIN, 1LL << 62};
#define NODD ((int)(sizeof odd_strides / sizeof odd_strides[0]))

/* t with the strides of its size-1 dimensions replaced by odd values. */
static fusedrope_tensor oddify(fusedrope_tensor t, tu_rng *r)
{
    if (t.seq_len == 1)
        t.stride_seq = odd_strides[tu_int(r, 0, NODD - 1)];
    if (t.batch == 1)
        t.stride_batch = odd_strides[tu_int(r, 0, NODD - 1)];
    if (t.heads == 1)
        t.stride_head = odd_strides[tu_int(r, 0, NODD - 1)];
    return t;
}

static fusedrope_status call1(const fusedrope_cache *cache, fusedrope_style style,
                              const fusedrope_positions *pos, const fusedrope_tensor *x,
                              const fusedrope_tensor *y, int backward)
{
    return backward ? fusedrope_backward(cache, style, pos, x, y, NULL)
                    : fusedrope_forward(cache, style, pos, x, y, NULL);
}

typedef struct {
    fusedrope_cache *cache;
    ref_rope ref;
} cache_ref;

static void make_cache(cache_ref *c, int rot_dim, int tableless)
{
    fusedrope_cache_config cfg;
    fusedrope_status st;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, rot_dim, tableless ? 0 : 64,
                                10000.0);
    st = fusedrope_cache_create(&cfg, CPU, &c->cache);
    ck_assert_msg(st == FUSEDROPE_OK, "cache_create: %s (%s)", fusedrope_status_string(st),
                  fusedrope_last_error());
    tu_track(c->cache);
    ck_assert_int_eq(ref_rope_from_config(&c->ref, &cfg), 0);
}

static void check_ref(const char *what, const cache_ref *c, fusedrope_style style,
                      const int64_t *positions, const fusedrope_tensor *xorig,
                      const fusedrope_tensor *y, int backward)
{
    char msg[MSG];
    int64_t bad = ref_check_apply(&c->ref, style, positions, xorig, y, backward, msg, sizeof msg);
    ck_assert_msg(bad == 0, "%s: %lld bad elements: %s", what, (long long)bad, msg);
}

/* One shape, dtype, style and direction: in place and out of place, each
 * with ordinary strides and with odd strides on the size-1 dimensions (of
 * the input, the output or both); all must give the same bytes. */
static void unit_case(int i)
{
    const int shape = i % NSHAPES, dti = i / NSHAPES % 3, style_i = i / NSHAPES / 3 % 2,
              backward = i / NSHAPES / 6 % 2, tableless = i / NSHAPES / 12 % 2;
    const fusedrope_dtype dt = dtypes[dti];
    const fusedrope_style style = style_i ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const int64_t S = shapes[shape][0], B = shapes[shape][1], H = shapes[shape][2], D = 40;
    const int rot_dim = 32;
    int64_t offsets[3] = {5, 17, 30};
    fusedrope_positions P;
    const fusedrope_positions *pos = NULL;
    int64_t *positions;
    cache_ref c;
    tu_rng r;
    tu_buf xb, xsnap, yb, yplain;
    fusedrope_tensor x, xorig, y;
    fusedrope_status st;
    char what[256];

    tu_rng_init(&r, 100 + (uint64_t)i);
    snprintf(what, sizeof what, "[seed %llu case %d] S=%lld B=%lld H=%lld %s %s %s %s",
             (unsigned long long)tu_seed, i, (long long)S, (long long)B, (long long)H,
             ref_dtype_name(dt), style_i ? "interleaved" : "neox",
             backward ? "backward" : "forward", tableless ? "table-less" : "table");
    make_cache(&c, rot_dim, tableless);
    if (S == 1) { /* decode: each batch entry at its own offset */
        fusedrope_positions_init(&P);
        P.offsets = offsets;
        pos = &P;
    }
    positions = tu_positions(pos, S, B);

    x = tu_tensor(LAY_SBHD_PAD, dt, S, B, H, D, &xb);
    tu_fill_random(&xb, &r, -4, 4);
    xsnap = tu_buf_copy(&xb);
    xorig = tu_rebase(&x, &xb, &xsnap);

    /* in place, identical descriptors: the bytes every other form must give */
    st = call1(c.cache, style, pos, &x, &x, backward);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: in place: %s (%s)", what, fusedrope_status_string(st),
                  fusedrope_last_error());
    check_ref(what, &c, style, positions, &xorig, &x, backward);
    yplain = tu_buf_copy(&xb); /* the in-place result */

    for (int form = 0; form < 3; form++) {
        /* in place; odd strides on y (0), x (1) or both, different (2) */
        fusedrope_tensor xi = form >= 1 ? oddify(x, &r) : x;
        fusedrope_tensor yi = form != 1 ? oddify(x, &r) : x;
        size_t first = 0, n;
        memcpy(xb.p, xsnap.p, xb.nbytes);
        st = call1(c.cache, style, pos, &xi, &yi, backward);
        ck_assert_msg(st == FUSEDROPE_OK,
                      "%s: in place with odd size-1 strides (x %lld %lld %lld, y %lld %lld %lld) "
                      "refused: %s (%s)",
                      what, (long long)xi.stride_seq, (long long)xi.stride_batch,
                      (long long)xi.stride_head, (long long)yi.stride_seq,
                      (long long)yi.stride_batch, (long long)yi.stride_head,
                      fusedrope_status_string(st), fusedrope_last_error());
        n = tu_changed(&xb, &yplain, &first);
        ck_assert_msg(n == 0, "%s: in place form %d: %zu bytes differ from the plain in-place "
                      "call (first at %zu)", what, form, n, first);
    }

    /* out of place: plain, then odd strides on x, y or both */
    y = tu_tensor(LAY_BSHD_PAD, dt, S, B, H, D, &yb);
    {
        tu_buf ysnap = tu_buf_copy(&yb), yref;
        unsigned char *mask = tu_alloc(yb.nbytes);
        size_t first = 0, n;
        memcpy(xb.p, xsnap.p, xb.nbytes);
        st = call1(c.cache, style, pos, &x, &y, backward);
        ck_assert_msg(st == FUSEDROPE_OK, "%s: out of place: %s (%s)", what,
                      fusedrope_status_string(st), fusedrope_last_error());
        check_ref(what, &c, style, positions, &xorig, &y, backward);
        tu_mask_view(&yb, &y, mask);
        n = tu_changed_outside(&yb, &ysnap, mask, &first);
        ck_assert_msg(n == 0, "%s: %zu bytes outside the output view written", what, n);
        yref = tu_buf_copy(&yb);
        for (int form = 0; form < 3; form++) {
            fusedrope_tensor xo = form != 1 ? oddify(x, &r) : x;
            fusedrope_tensor yo = form >= 1 ? oddify(y, &r) : y;
            memcpy(yb.p, ysnap.p, yb.nbytes);
            st = call1(c.cache, style, pos, &xo, &yo, backward);
            ck_assert_msg(st == FUSEDROPE_OK,
                          "%s: out of place with odd size-1 strides refused: %s (%s)", what,
                          fusedrope_status_string(st), fusedrope_last_error());
            n = tu_changed(&yb, &yref, &first);
            ck_assert_msg(n == 0, "%s: out of place form %d: %zu bytes differ (first at %zu)",
                          what, form, n, first);
            n = tu_changed(&xb, &xsnap, &first);
            ck_assert_msg(n == 0, "%s: the input was modified", what);
        }
    }
    ref_rope_free(&c.ref);
    tu_free_all();
}

START_TEST(test_unit_dims)
{
    for (int v = 0; v < 4; v++)
        unit_case(_i * 4 + v);
}
END_TEST

/* forward_qk with one k head (multi-query decode): k in place with an odd
 * k_out stride_head, q out of place with odd seq strides. */
START_TEST(test_unit_dims_qk)
{
    const fusedrope_dtype dt = dtypes[_i % 3];
    const int64_t S = 1, B = 2, HQ = 6, D = 64;
    cache_ref c;
    tu_rng r;
    tu_buf qb, qob, kb, ksnap, qsnap, kplain, qoplain;
    fusedrope_tensor q, qo, k, ko;
    fusedrope_status st;
    int64_t offsets[2] = {9, 40};
    fusedrope_positions P;
    size_t first = 0;

    fusedrope_positions_init(&P);
    P.offsets = offsets;
    tu_rng_init(&r, 900 + (uint64_t)_i);
    make_cache(&c, 64, 0);
    q = tu_tensor(LAY_SBHD, dt, S, B, HQ, D, &qb);
    qo = tu_tensor(LAY_BSHD_PAD, dt, S, B, HQ, D, &qob);
    k = tu_tensor(LAY_SBHD_PAD, dt, S, B, 1, D, &kb);
    tu_fill_random(&qb, &r, -3, 3);
    tu_fill_random(&kb, &r, -3, 3);
    qsnap = tu_buf_copy(&qb);
    ksnap = tu_buf_copy(&kb);

    st = fusedrope_forward_qk(c.cache, FUSEDROPE_NEOX, &P, &q, &qo, &k, &k, NULL);
    ck_assert_msg(st == FUSEDROPE_OK, "[seed %llu] plain qk: %s (%s)",
                  (unsigned long long)tu_seed, fusedrope_status_string(st),
                  fusedrope_last_error());
    {
        int64_t *positions = tu_positions(&P, S, B);
        fusedrope_tensor korig = tu_rebase(&k, &kb, &ksnap), qorig = tu_rebase(&q, &qb, &qsnap);
        check_ref("qk: k", &c, FUSEDROPE_NEOX, positions, &korig, &k, 0);
        check_ref("qk: q", &c, FUSEDROPE_NEOX, positions, &qorig, &qo, 0);
    }
    kplain = tu_buf_copy(&kb);
    qoplain = tu_buf_copy(&qob);

    memcpy(kb.p, ksnap.p, kb.nbytes);
    tu_poison(&qob);
    ko = k;
    ko.stride_head = 3; /* would overlap the next token's head if it mattered */
    k.stride_head = -5;
    q.stride_seq = INT64_MIN;
    qo.stride_seq = INT64_MAX;
    st = fusedrope_forward_qk(c.cache, FUSEDROPE_NEOX, &P, &q, &qo, &k, &ko, NULL);
    ck_assert_msg(st == FUSEDROPE_OK, "[seed %llu] qk with odd size-1 strides refused: %s (%s)",
                  (unsigned long long)tu_seed, fusedrope_status_string(st),
                  fusedrope_last_error());
    ck_assert_msg(tu_changed(&kb, &kplain, &first) == 0, "qk: k differs (first byte %zu)", first);
    /* qo was poisoned as when the plain call ran: every byte must be the same */
    ck_assert_msg(tu_changed(&qob, &qoplain, &first) == 0, "qk: q_out differs (first byte %zu)",
                  first);
    ref_rope_free(&c.ref);
    tu_free_all();
}
END_TEST

/* The rules that remain: a negative stride on a dimension of size > 1 is
 * refused, as is an output overlapping itself through such a dimension. */
START_TEST(test_still_refused)
{
    cache_ref c;
    tu_buf xb, yb;
    fusedrope_tensor x, y;
    fusedrope_status st;
    make_cache(&c, 32, 0);
    x = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 1, 2, 3, 32, &xb);
    y = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 1, 2, 3, 32, &yb);
    y.stride_batch = -96;
    st = fusedrope_forward(c.cache, FUSEDROPE_NEOX, NULL, &x, &y, NULL);
    ck_assert_int_eq(st, FUSEDROPE_ERR_INVALID);
    ck_assert_msg(tu_contains(fusedrope_last_error(), "stride_batch"), "%s",
                  fusedrope_last_error());
    y = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 1, 2, 3, 32, &yb);
    y.stride_head = 8; /* heads overlap */
    st = fusedrope_forward(c.cache, FUSEDROPE_NEOX, NULL, &x, &y, NULL);
    ck_assert_int_eq(st, FUSEDROPE_ERR_INVALID);
    /* same data, seq and batch strides swapped (both dimensions of size 2):
     * a partial overlap, not in place */
    x = tu_tensor(LAY_BSHD, FUSEDROPE_FLOAT32, 2, 2, 3, 32, &xb);
    y = x;
    y.stride_seq = x.stride_batch;
    y.stride_batch = x.stride_seq;
    st = fusedrope_forward(c.cache, FUSEDROPE_NEOX, NULL, &x, &y, NULL);
    ck_assert_int_eq(st, FUSEDROPE_ERR_INVALID);
    ck_assert_msg(tu_contains(fusedrope_last_error(), "same data pointer as x but different strides"),
                  "%s", fusedrope_last_error());
    ref_rope_free(&c.ref);
    tu_free_all();
}
END_TEST

static Suite *unit_dims_suite(void)
{
    Suite *s = suite_create("unit_dims");
    TCase *tc = tcase_create("unit_dims");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_unit_dims, 0, NSHAPES * 3 * 2 * 2 * 2 / 4);
    tcase_add_loop_test(tc, test_unit_dims_qk, 0, 3);
    tcase_add_test(tc, test_still_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_main(unit_dims_suite(), "test_unit_dims");
}
