/*
 * test_bigindex.c - element offsets past 2^31 and 2^32: the library promises
 * 64-bit indexing (DESIGN.md: peers that index with int overflow there), and
 * this is where it is exercised, cheaply.
 *
 * Each tensor lives in a sparse mapping of 8 to 16 GiB reserved with
 * PROT_NONE and MAP_NORESERVE (no memory, no commit charge); only the pages
 * of the rows a call should touch are made readable and writable.  A
 * stride of 2^31 + 64 elements between batch entries (or tokens) puts entry
 * 1 past element 2^31 and entry 2 past 2^32, so an offset computed in 32
 * bits lands on a page that is still PROT_NONE and the test dies with
 * SIGSEGV (a failure in libcheck's fork mode), and a row the call skipped
 * keeps its poison.  The results are compared with the float64 reference
 * (tests/ref.h: rotated channels within DESIGN's bound, the rest copied bit
 * for bit).
 *
 * Cases: two layouts (the huge stride on the batch, or on the sequence:
 * the kernels' seq-major walk), three dtypes, both styles, in and out of
 * place, forward and backward, the vector path and the scalar one (an odd
 * head stride), positions with per-batch offsets; and the fused norm's
 * forward and backward (test_norm_offsets_past_2_32).
 *
 * Built twice from this file: tests/test_bigindex runs the OpenMP backend;
 * tests/test_bigindex_emu (where the CUDA headers are) is linked with
 * tests/cuda_emu_wrap.c and tests/cuda_norm_emu_wrap.c, so every call also
 * runs the CUDA launchers and kernels built for the host, which must match
 * the OpenMP backend to the bit.
 *
 * If the mapping is refused (valgrind limits the address space it manages;
 * a system may cap virtual memory with ulimit -v), the test says so and
 * skips (exit 77).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <check.h>

#include "fusedrope.h"
#include "ref.h"
#include "util.h"

enum { S = 3, B = 3, H = 3, D = 80, ROT = 64, MAXPOS = 4200 };
/* The huge stride, in elements: a multiple of 16 bytes for every dtype. */
#define BIG (((int64_t)1 << 31) + 64)

static const fusedrope_dtype dtypes[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                           FUSEDROPE_BFLOAT16 };

/* A PROT_NONE reservation of `bytes`, or NULL. */
static void *reserve(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Makes the pages under [p, p + n) readable and writable. */
static void open_range(unsigned char *p, size_t n)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)p & ~(pg - 1), hi = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);
    ck_assert_msg(mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) == 0,
                  "mprotect: %s", strerror(errno));
}

/* The tensor of case `layout` over base, of `hd` channels a head: the big
 * stride on the batch (layout 0) or on the sequence (layout 1); heads `hs`
 * elements apart. */
static fusedrope_tensor view_hd(void *base, fusedrope_dtype dt, int layout, int64_t hs,
                                int64_t hd)
{
    fusedrope_tensor t;
    memset(&t, 0, sizeof t);
    t.data = base;
    t.dtype = dt;
    t.seq_len = S;
    t.batch = B;
    t.heads = H;
    t.head_dim = hd;
    t.stride_head = hs;
    if (layout == 0) {
        t.stride_seq = H * hs;
        t.stride_batch = BIG;
    } else {
        t.stride_batch = H * hs;
        t.stride_seq = BIG;
    }
    return t;
}

static fusedrope_tensor view(void *base, fusedrope_dtype dt, int layout, int64_t hs)
{
    return view_hd(base, dt, layout, hs, D);
}

static size_t span_bytes(const fusedrope_tensor *t)
{
    return (size_t)(ref_offset(t, S - 1, B - 1, H - 1, t->head_dim - 1) + 1) *
           ref_dtype_size(t->dtype);
}

/* Opens the pages of every row of t (a view over a reservation). */
static void open_rows(const fusedrope_tensor *t)
{
    const size_t es = ref_dtype_size(t->dtype);
    for (int64_t s = 0; s < S; s++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                open_range((unsigned char *)t->data + ref_offset(t, s, b, h, 0) * es,
                           (size_t)t->head_dim * es);
}

/* Copies the rows of src into dst (same sizes and dtype, any strides). */
static void copy_rows(const fusedrope_tensor *src, const fusedrope_tensor *dst)
{
    const size_t es = ref_dtype_size(src->dtype);
    for (int64_t s = 0; s < S; s++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                memcpy((unsigned char *)dst->data + ref_offset(dst, s, b, h, 0) * es,
                       (const unsigned char *)src->data + ref_offset(src, s, b, h, 0) * es,
                       (size_t)src->head_dim * es);
}

/* Whether the rows of a and b hold the same bytes. */
static int same_rows(const fusedrope_tensor *a, const fusedrope_tensor *b)
{
    const size_t es = ref_dtype_size(a->dtype);
    for (int64_t s = 0; s < S; s++)
        for (int64_t bt = 0; bt < B; bt++)
            for (int64_t h = 0; h < H; h++)
                if (memcmp((const unsigned char *)a->data + ref_offset(a, s, bt, h, 0) * es,
                           (const unsigned char *)b->data + ref_offset(b, s, bt, h, 0) * es,
                           (size_t)a->head_dim * es))
                    return 0;
    return 1;
}

/* _i: layout x dtype x style x in place x scalar path x backward. */
START_TEST(test_offsets_past_2_32)
{
    int v = _i;
    /* valgrind tracks the multi-GB mappings page by page (minutes a case):
     * under it, every 13th case, which still covers every layout, dtype,
     * style, path and direction */
    if (tu_valgrind_skips(_i, 13))
        return;
    const int layout = v % 2;
    const fusedrope_dtype dt = dtypes[(v /= 2) % 3];
    const fusedrope_style style = (v /= 3) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const int in_place = (v /= 2) % 2;
    const int scalar = (v /= 2) % 2;
    const int backward = (v /= 2) % 2;
    const size_t es = ref_dtype_size(dt);
    const int64_t hs = scalar ? D + 1 : D + 8;
    static const int64_t offsets[B] = { 0, 1234, 4000 };
    int64_t positions[S * B];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_positions pos;
    fusedrope_tensor x, y;
    ref_rope r;
    unsigned char *xm, *ym;
    size_t bytes;
    char msg[2048];
    int64_t bad;
    tu_rng rng;

    x = view(NULL, dt, layout, hs);
    bytes = span_bytes(&x);
    ck_assert_msg(ref_offset(&x, S - 1, B - 1, H - 1, D - 1) > ((int64_t)1 << 32),
                  "the last element is not past 2^32");
    xm = reserve(bytes);
    ym = reserve(bytes);
    ck_assert_msg(xm && ym, "the reservation worked in main() but not here");
    x = view(xm, dt, layout, hs);
    y = view(ym, dt, layout, hs);

    /* x: random values in the rows; y: the same (in place) or poison */
    tu_rng_init(&rng, (uint64_t)_i);
    for (int64_t s = 0; s < S; s++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t o = ref_offset(&x, s, b, h, 0);
                open_range(xm + o * es, D * es);
                open_range(ym + o * es, D * es);
                for (int64_t c = 0; c < D; c++)
                    ref_store(xm, dt, o + c, tu_uniform(&rng, -2.0, 2.0));
                if (in_place)
                    memcpy(ym + o * es, xm + o * es, D * es);
                else
                    memset(ym + o * es, 0xa5, D * es);
            }

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, ROT, MAXPOS, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    ck_assert_int_eq(ref_rope_from_config(&r, &cfg), 0);
    fusedrope_positions_init(&pos);
    pos.offsets = offsets;
    ref_positions(&pos, S, B, positions);

    {
        const fusedrope_tensor *in = in_place ? &y : &x;
        fusedrope_status st = backward ? fusedrope_backward(cache, style, &pos, in, &y, NULL)
                                       : fusedrope_forward(cache, style, &pos, in, &y, NULL);
        ck_assert_msg(st == FUSEDROPE_OK, "%s", fusedrope_last_error());
    }
    bad = ref_check_apply(&r, style, positions, &x, &y, backward, msg, sizeof msg);
    ck_assert_msg(bad == 0, "layout %d %s %s%s%s %s: %lld bad elements: %s", layout,
                  ref_dtype_name(dt), style == FUSEDROPE_NEOX ? "neox" : "interleaved",
                  in_place ? " in place" : "", scalar ? " scalar" : "",
                  backward ? "backward" : "forward", (long long)bad, msg);

    ref_rope_free(&r);
    fusedrope_cache_destroy(cache);
    munmap(xm, bytes);
    munmap(ym, bytes);
}
END_TEST

/*
 * The fused norm at the same offsets: forward (y and rstd) and backward (dx
 * and dw, from the saved x and the forward's rstd) on tensors whose rows lie
 * past 2^31 and 2^32 elements must give the bytes the same calls give on
 * dense copies of the rows (test_norm judges those against the float64
 * reference; here the question is the indexing).  In test_bigindex_emu the
 * calls run the norm kernels built for the host (tests/cuda_norm_emu_wrap.c),
 * which must also equal the OpenMP backend to the bit.  Two shapes: 80
 * channels with 64 rotated (the kernels' generic rows) and 128 (a register
 * row a warp), each on the SIMD paths with rows aligned for them, and on
 * the portable path (tu_cpu_path) with an odd head stride.  _i: layout x
 * dtype x style x shape x portable path.
 */
START_TEST(test_norm_offsets_past_2_32)
{
    int v = _i;
    if (tu_valgrind_skips(_i, 7))
        return;
    const int layout = v % 2;
    const fusedrope_dtype dt = dtypes[(v /= 2) % 3];
    const fusedrope_style style = (v /= 3) % 2 ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const int wide = (v /= 2) % 2;
    const int scalar = (v /= 2) % 2;
    const int64_t hd = wide ? 128 : D, rot = wide ? 128 : ROT, hs = hd + (scalar ? 1 : 8);
    static const int64_t offsets[B] = { 7, 1234, 4000 };
    float rstd_big[S * B * H], rstd_dense[S * B * H], dw_big[128], dw_dense[128];
    float w[128];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_positions pos;
    fusedrope_norm nb, nd;
    fusedrope_tensor x, y, dy, dx, xd, yd, dyd, dxd;
    unsigned char *m[4];
    tu_buf dense[4];
    size_t bytes;
    tu_rng rng;

    x = view_hd(NULL, dt, layout, hs, hd);
    bytes = span_bytes(&x);
    ck_assert_msg(ref_offset(&x, S - 1, B - 1, H - 1, hd - 1) > ((int64_t)1 << 32),
                  "the last element is not past 2^32");
    for (int i = 0; i < 4; i++) {
        m[i] = reserve(bytes);
        ck_assert_msg(m[i] != NULL, "the reservation worked in main() but not here");
    }
    x = view_hd(m[0], dt, layout, hs, hd);
    y = view_hd(m[1], dt, layout, hs, hd);
    dy = view_hd(m[2], dt, layout, hs, hd);
    dx = view_hd(m[3], dt, layout, hs, hd);
    xd = tu_tensor(LAY_SBHD, dt, S, B, H, hd, &dense[0]);
    yd = tu_tensor(LAY_SBHD, dt, S, B, H, hd, &dense[1]);
    dyd = tu_tensor(LAY_SBHD, dt, S, B, H, hd, &dense[2]);
    dxd = tu_tensor(LAY_SBHD, dt, S, B, H, hd, &dense[3]);

    tu_rng_init(&rng, (uint64_t)_i + 1000);
    open_rows(&x);
    open_rows(&y);
    open_rows(&dy);
    open_rows(&dx);
    for (int64_t s = 0; s < S; s++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t c = 0; c < hd; c++) {
                    ref_store(x.data, dt, ref_offset(&x, s, b, h, c), tu_uniform(&rng, -2, 2));
                    ref_store(dy.data, dt, ref_offset(&dy, s, b, h, c),
                              tu_uniform(&rng, -1, 1));
                }
    copy_rows(&x, &xd);
    copy_rows(&dy, &dyd);
    for (int64_t c = 0; c < hd; c++)
        w[c] = (float)tu_uniform(&rng, 0.5, 1.5);

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)rot, MAXPOS, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    fusedrope_positions_init(&pos);
    pos.offsets = offsets;
    tu_cpu_path(scalar ? 2 : 0);
    fusedrope_norm_init(&nb);
    nb.weight = FUSEDROPE_NORM_WEIGHT;
    nb.rounding = FUSEDROPE_NORM_ROUND_LLAMA;
    nb.weight_dtype = FUSEDROPE_FLOAT32;
    nb.q_weight = w;
    nd = nb;
    nb.q_rstd = rstd_big;
    nd.q_rstd = rstd_dense;
    nb.dq_weight = dw_big;
    nd.dq_weight = dw_dense;

    ck_assert_msg(fusedrope_norm_forward_qk(cache, style, &pos, &nb, &x, &y, NULL, NULL,
                                            NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    ck_assert_msg(fusedrope_norm_forward_qk(cache, style, &pos, &nd, &xd, &yd, NULL, NULL,
                                            NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    ck_assert_msg(same_rows(&y, &yd) && !memcmp(rstd_big, rstd_dense, sizeof rstd_big),
                  "layout %d %s hd %lld%s: the forward past 2^32 differs from the dense one",
                  layout, ref_dtype_name(dt), (long long)hd, scalar ? " scalar" : "");
    ck_assert_msg(fusedrope_norm_backward_qk(cache, style, &pos, &nb, &x, &dy, &dx, NULL, NULL,
                                             NULL, NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    ck_assert_msg(fusedrope_norm_backward_qk(cache, style, &pos, &nd, &xd, &dyd, &dxd, NULL,
                                             NULL, NULL, NULL) == FUSEDROPE_OK,
                  "%s", fusedrope_last_error());
    ck_assert_msg(same_rows(&dx, &dxd) && !memcmp(dw_big, dw_dense, (size_t)hd * sizeof(float)),
                  "layout %d %s hd %lld%s: the backward past 2^32 differs from the dense one",
                  layout, ref_dtype_name(dt), (long long)hd, scalar ? " scalar" : "");

    tu_cpu_path(0);
    fusedrope_cache_destroy(cache);
    for (int i = 0; i < 4; i++)
        munmap(m[i], bytes);
    tu_free_all();
}
END_TEST

int main(void)
{
    /* the largest case: float32, odd head stride */
    const fusedrope_tensor t = view(NULL, FUSEDROPE_FLOAT32, 1, D + 8);
    const size_t bytes = span_bytes(&t);
    void *a = reserve(bytes), *b = reserve(bytes);
    Suite *s;
    TCase *tc;

    if (!a || !b) {
        printf("test_bigindex: a %zu-byte PROT_NONE, MAP_NORESERVE reservation was refused "
               "(%s%s); skipping\n",
               bytes, strerror(errno),
               tu_under_valgrind() ? ", under valgrind, which limits the address space" : "");
        return 77;
    }
    munmap(a, bytes);
    munmap(b, bytes);

    s = suite_create("bigindex");
    tc = tcase_create("bigindex");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_offsets_past_2_32, 0, 2 * 3 * 2 * 2 * 2 * 2);
    tcase_add_loop_test(tc, test_norm_offsets_past_2_32, 0, 2 * 3 * 2 * 2 * 2);
    suite_add_tcase(s, tc);
    return tu_main(s, "test_bigindex");
}
