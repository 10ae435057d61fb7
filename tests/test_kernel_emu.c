/*
 * test_kernel_emu.c - what only the CUDA kernels do, run on the CPU through
 * the host build of kernels/cuda_apply.cu (kernels/cuda_emu.h): positions
 * that live on the device are checked by the kernels, not on the host, so a
 * token without a position in the table gets NaN in its rotated channels
 * and raises the cache's range flag (DESIGN.md, errors; fusedrope_forward(3)).
 *
 * Each case calls the emulated backend directly with device-style positions
 * (ids past the table or negative, offsets that run past it, cu_seqlens
 * that leave tokens outside every sequence or end past the last token), in
 * every dtype, both styles, in and out of place, on the vector and the
 * scalar paths and under two launch shapes, and checks every element:
 *   - a token without a position: NaN in each rotated channel of each head;
 *     the pass-through channels copied (out of place) or untouched (in
 *     place); the flag raised;
 *   - every other token: the bytes the CPU backend writes for it.
 * tests/test_cuda makes the same checks on a GPU.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedrope.h"
#include "internal.h"

fusedrope_status fr_emu_cuda_apply(const fr_apply_args *a);
int fr_emu_sms = 132;

enum { R = 64, M = 32 }; /* rot_dim, table rows */

static const fusedrope_dtype dtypes[3] = { FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                           FUSEDROPE_BFLOAT16 };

/* One case: tensor [S, B, H, D] in sbhd order, element stride `pad` between
 * heads (D or D + 1: the latter makes the call take the scalar path). */
typedef struct {
    int64_t S, B, H, D, pad;
    fusedrope_dtype dt;
    int interleaved, in_place, backward;
    fr_pos_args pos;
    const int *bad; /* per token, at b * S + s (the order of ids): no position */
} kcase;

static size_t es_of(fusedrope_dtype dt) { return dt == FUSEDROPE_FLOAT32 ? 4 : 2; }

static int is_nan(fusedrope_dtype dt, const unsigned char *p)
{
    if (dt == FUSEDROPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return dt == FUSEDROPE_FLOAT16 ? (h & 0x7c00) == 0x7c00 && (h & 0x3ff)
                                   : (h & 0x7f80) == 0x7f80 && (h & 0x7f);
}

static void fill(unsigned char *x, size_t n, fusedrope_dtype dt, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const float f = (float)((double)(seed >> 40) / (1 << 24) * 4.0 - 2.0);
        if (dt == FUSEDROPE_FLOAT32) {
            memcpy(x + 4 * i, &f, 4);
        } else {
            const uint16_t h = dt == FUSEDROPE_FLOAT16 ? fr_float_to_half(f) : fr_float_to_bf16(f);
            memcpy(x + 2 * i, &h, 2);
        }
    }
}

static fr_apply_args make_args(const kcase *k, const fusedrope_cache *cache, const void *x,
                               void *y)
{
    fr_apply_args a;
    memset(&a, 0, sizeof a);
    a.cache = cache;
    a.sgn = k->backward ? -1.0f : 1.0f;
    a.interleaved = k->interleaved;
    a.dtype = k->dt;
    a.seq_len = k->S;
    a.batch = k->B;
    a.pos = k->pos;
    a.pos.seq_len = k->S;
    a.count = 1;
    a.io[0].in = x;
    a.io[0].out = y;
    a.io[0].heads = k->H;
    a.io[0].head_dim = k->D;
    a.io[0].in_sh = a.io[0].out_sh = k->pad;
    a.io[0].in_sb = a.io[0].out_sb = k->H * k->pad;
    a.io[0].in_ss = a.io[0].out_ss = k->B * k->H * k->pad;
    a.io[0].in_place = x == y;
    return a;
}

static void run_case(const kcase *k, uint64_t seed)
{
    const size_t es = es_of(k->dt);
    const size_t n = (size_t)(k->S * k->B * k->H * k->pad), bytes = n * es;
    unsigned char *x = malloc(bytes), *y = malloc(bytes), *ref = malloc(bytes);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache, emu;
    int64_t ids[64];
    fr_pos_args good = k->pos;
    fr_apply_args a;
    int flag;

    ck_assert(x && y && ref && k->S * k->B <= 64);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, R, M, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache), FUSEDROPE_OK);
    fill(x, n, k->dt, seed);

    /* The reference: the CPU backend, with every position made explicit and
     * the bad ones replaced by 0. */
    good.seq_len = k->S;
    for (int64_t s = 0; s < k->S; s++)
        for (int64_t b = 0; b < k->B; b++) {
            int bad = 0;
            const int64_t p = fr_token_position(&good, b, s, &bad);
            ids[b * k->S + s] = k->bad[b * k->S + s] || bad || p >= M ? 0 : p;
        }
    memset(&good, 0, sizeof good);
    good.ids = ids;
    good.seq_len = k->S;
    good.cp_size = 1;
    memcpy(ref, x, bytes);
    a = make_args(k, cache, k->in_place ? ref : x, ref);
    a.pos = good;
    fr_cpu_apply(&a);

    for (int shape = 0; shape < 2; shape++) {
        memcpy(y, x, bytes);
        if (!k->in_place)
            memset(y, 0xa5, bytes);
        emu = *cache;
        emu.inv_freq_dev = emu.inv_freq;
        flag = 0;
        emu.range_flag = emu.range_flag_dev = &flag;
        a = make_args(k, &emu, k->in_place ? y : x, y);
        fr_emu_sms = shape ? 1 : 132;
        ck_assert_int_eq(fr_emu_cuda_apply(&a), FUSEDROPE_OK);
        ck_assert_msg(flag == 1, "the range flag is %d, not raised", flag);

        for (int64_t s = 0; s < k->S; s++)
            for (int64_t b = 0; b < k->B; b++)
                for (int64_t h = 0; h < k->H; h++)
                    for (int64_t c = 0; c < k->pad; c++) {
                        const size_t o = (size_t)(((s * k->B + b) * k->H + h) * k->pad + c) * es;
                        const int bad = k->bad[b * k->S + s];
                        if (c >= k->D) { /* between heads: never written */
                            const int same = k->in_place ? !memcmp(y + o, x + o, es)
                                                         : y[o] == 0xa5;
                            ck_assert_msg(same, "padding written at s %lld b %lld h %lld",
                                          (long long)s, (long long)b, (long long)h);
                        } else if (bad && c < R) {
                            ck_assert_msg(is_nan(k->dt, y + o),
                                          "token (s %lld, b %lld) head %lld channel %lld: not NaN",
                                          (long long)s, (long long)b, (long long)h, (long long)c);
                        } else if (memcmp(y + o, ref + o, es) != 0) {
                            ck_abort_msg("token (s %lld, b %lld%s) head %lld channel %lld: the "
                                         "emulated kernel and the CPU backend differ",
                                         (long long)s, (long long)b, bad ? ", no position" : "",
                                         (long long)h, (long long)c);
                        }
                    }
    }
    fusedrope_cache_destroy(cache);
    free(x);
    free(y);
    free(ref);
}

/* _i: dtype x style x in place x backward x vector/scalar */
static void variant(kcase *k, int i)
{
    k->dt = dtypes[i % 3];
    i /= 3;
    k->interleaved = i % 2;
    i /= 2;
    k->in_place = i % 2;
    i /= 2;
    k->backward = i % 2;
    i /= 2;
    k->pad = k->D + (i % 2); /* an odd head stride: the scalar path */
}
#define VARIANTS (3 * 2 * 2 * 2 * 2)

START_TEST(test_ids_outside_the_table)
{
    /* ids[b * S + s]: (b 0, s 5) past the table, (1, 2) negative, (2, 1) far past it */
    static const int64_t id[18] = { 0, 1, 2, 3, 4, M, 6, 7, -1, 9, 10, 31, 12, M + 100, 14, 15,
                                    16, 17 };
    int bad[18] = { 0 };
    kcase k;
    memset(&k, 0, sizeof k);
    k.S = 6;
    k.B = 3;
    k.H = 5;
    k.D = 80; /* 16 pass-through channels */
    k.pos.ids = id;
    k.pos.cp_size = 1;
    bad[5] = bad[8] = bad[13] = 1;
    k.bad = bad;
    variant(&k, _i);
    run_case(&k, 100 + (uint64_t)_i);
}
END_TEST

START_TEST(test_offsets_past_the_table)
{
    static const int64_t off[2] = { 3, M - 4 }; /* batch 1 runs past row M-1 at s = 4 */
    int bad[12] = { 0 };
    kcase k;
    memset(&k, 0, sizeof k);
    k.S = 6;
    k.B = 2;
    k.H = 3;
    k.D = 64;
    k.pos.offsets = off;
    k.pos.cp_size = 1;
    bad[1 * 6 + 4] = bad[1 * 6 + 5] = 1;
    k.bad = bad;
    variant(&k, _i);
    run_case(&k, 200 + (uint64_t)_i);
}
END_TEST

START_TEST(test_cu_seqlens_wrong)
{
    /* 9 packed tokens; the sequences cover only the first 7: the last entry
     * is not the token count (the flag), tokens 7 and 8 have no sequence */
    static const int32_t cu[3] = { 0, 3, 7 };
    int bad[9] = { 0, 0, 0, 0, 0, 0, 0, 1, 1 };
    kcase k;
    memset(&k, 0, sizeof k);
    k.S = 9;
    k.B = 1;
    k.H = 4;
    k.D = 96;
    k.pos.cu_seqlens = cu;
    k.pos.num_seqs = 2;
    k.pos.cp_size = 1;
    k.bad = bad;
    variant(&k, _i);
    run_case(&k, 300 + (uint64_t)_i);
}
END_TEST

START_TEST(test_cu_seqlens_past_the_tokens)
{
    /* 9 packed tokens, the last sequence said to end at 12: every token has
     * a position, only the kernel's check of the ends raises the flag */
    static const int32_t cu[3] = { 0, 4, 12 };
    int bad[9] = { 0 };
    kcase k;
    memset(&k, 0, sizeof k);
    k.S = 9;
    k.B = 1;
    k.H = 2;
    k.D = 64;
    k.pos.cu_seqlens = cu;
    k.pos.num_seqs = 2;
    k.pos.cp_size = 1;
    k.bad = bad;
    variant(&k, _i);
    run_case(&k, 400 + (uint64_t)_i);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernel_emu");
    TCase *tc = tcase_create("kernel_emu");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_ids_outside_the_table, 0, VARIANTS);
    tcase_add_loop_test(tc, test_offsets_past_the_table, 0, VARIANTS);
    tcase_add_loop_test(tc, test_cu_seqlens_wrong, 0, VARIANTS);
    tcase_add_loop_test(tc, test_cu_seqlens_past_the_tokens, 0, VARIANTS);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
