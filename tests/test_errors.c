/*
 * test_errors.c - every bad input forward/backward/_qk can receive: the exact
 * status (decisions on errors), a non-empty fusedrope_last_error() naming the
 * argument, and not one byte written to any buffer.  Also the successful
 * borders of each rule and zero-size no-ops.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "fusedrope.h"
#include "ref.h"
#include "util.h"

#define CPU FUSEDROPE_DEVICE_CPU
#define INV FUSEDROPE_ERR_INVALID
#define RNG FUSEDROPE_ERR_RANGE
#define OK FUSEDROPE_OK

/* ------------------------------------------------------------- the context */

enum { V_SBHD, V_THD, V_TABLELESS, V_QK, V_QK_THD, V_ODD };

#define ROT 16
#define ROWS 64
#define S0 8
#define B0 2
#define H0 3
#define D0 20
#define KH0 2
#define KD0 16
#define SLACK 4 /* buffers hold SLACK times what the baseline view needs */

typedef struct ectx {
    int variant, qk;
    fusedrope_cache *cache;
    int style;
    fusedrope_positions pos;
    const fusedrope_positions *pp;
    fusedrope_tensor x, y, kx, ky;                /* q_in/q_out, k_in/k_out for _qk */
    const fusedrope_tensor *px, *py, *pkx, *pky;
    tu_buf b[4];                                  /* buffers of x, y, kx, ky */
    int64_t ids[128], offsets[8];
    int32_t cu[8];
    void *stream;
} ectx;

static void setup(ectx *c, int variant)
{
    fusedrope_cache_config cfg;
    tu_rng r;
    int64_t S = variant == V_THD || variant == V_QK_THD ? 10 : variant == V_ODD ? 7 : S0;
    int64_t B = variant == V_THD || variant == V_QK_THD ? 1 : B0;
    int k;
    memset(c, 0, sizeof *c);
    c->variant = variant;
    c->qk = variant == V_QK || variant == V_QK_THD;
    tu_rng_init(&r, 42);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, ROT,
                                variant == V_TABLELESS ? 0 : ROWS, 10000);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c->cache), OK);
    tu_track(c->cache);
    c->style = FUSEDROPE_NEOX;

    c->b[0] = tu_buf_new(FUSEDROPE_FLOAT32, SLACK * S * B * H0 * D0);
    c->b[1] = tu_buf_new(FUSEDROPE_FLOAT32, SLACK * S * B * H0 * D0);
    c->b[2] = tu_buf_new(FUSEDROPE_FLOAT32, SLACK * S * B * KH0 * KD0);
    c->b[3] = tu_buf_new(FUSEDROPE_FLOAT32, SLACK * S * B * KH0 * KD0);
    tu_fill_random(&c->b[0], &r, -2, 2);
    tu_fill_random(&c->b[2], &r, -2, 2);
    c->x = tu_view(LAY_SBHD, &c->b[0], S, B, H0, D0);
    c->y = tu_view(LAY_SBHD, &c->b[1], S, B, H0, D0);
    c->kx = tu_view(LAY_SBHD, &c->b[2], S, B, KH0, KD0);
    c->ky = tu_view(LAY_SBHD, &c->b[3], S, B, KH0, KD0);
    c->px = &c->x;
    c->py = &c->y;
    c->pkx = &c->kx;
    c->pky = &c->ky;

    fusedrope_positions_init(&c->pos);
    c->pos.cp_size = 1;
    c->pos.cp_rank = 0;
    c->pp = &c->pos;
    if (variant == V_THD || variant == V_QK_THD) {
        c->cu[0] = 0;
        c->cu[1] = 4;
        c->cu[2] = 4;
        c->cu[3] = 10; /* lengths 4 0 6 */
        c->pos.cu_seqlens = c->cu;
        c->pos.num_seqs = 3;
    }
    for (k = 0; k < 128; k++)
        c->ids[k] = (k * 7) % ROWS;
    for (k = 0; k < 8; k++)
        c->offsets[k] = k;
}

static fusedrope_status do_call(ectx *c, int backward)
{
    if (c->qk)
        return backward ? fusedrope_backward_qk(c->cache, (fusedrope_style)c->style, c->pp,
                                                c->px, c->py, c->pkx, c->pky, c->stream)
                        : fusedrope_forward_qk(c->cache, (fusedrope_style)c->style, c->pp,
                                               c->px, c->py, c->pkx, c->pky, c->stream);
    return backward ? fusedrope_backward(c->cache, (fusedrope_style)c->style, c->pp, c->px,
                                         c->py, c->stream)
                    : fusedrope_forward(c->cache, (fusedrope_style)c->style, c->pp, c->px,
                                        c->py, c->stream);
}

/* ----------------------------------------------------------------- the cases */

typedef struct ecase {
    const char *name;
    int variant;
    fusedrope_status want;
    const char *names; /* '|'-separated; last_error must contain one; "" = any */
    int noop;          /* OK and nothing may be written (zero-size) */
} ecase;

enum {
    /* NULLs and enums */
    E_NULL_CACHE, E_NULL_X, E_NULL_Y, E_STYLE_2, E_STYLE_NEG, E_DTYPE_3, E_DTYPE_NEG,
    E_DTYPE_MISMATCH, E_BF16_F16_MISMATCH,
    /* sizes */
    E_NEG_SEQ, E_NEG_BATCH, E_NEG_HEADS, E_NEG_HEAD_DIM, E_NEG_SEQ_X_ONLY,
    E_SEQ_MISMATCH, E_BATCH_MISMATCH, E_HEADS_MISMATCH, E_HEAD_DIM_MISMATCH,
    E_HEAD_DIM_LT_ROT, E_HEAD_DIM_ODD_LT_ROT, E_DATA_NULL_X, E_DATA_NULL_Y,
    E_MISALIGNED_X, E_MISALIGNED_Y, E_MISALIGNED_BF16,
    /* strides and overflow */
    E_NEG_STRIDE_SEQ_X, E_NEG_STRIDE_BATCH_X, E_NEG_STRIDE_HEAD_X, E_NEG_STRIDE_SEQ_Y,
    E_NEG_STRIDE_BATCH_Y, E_NEG_STRIDE_HEAD_Y,
    E_OVF_SEQ, E_OVF_HEADS, E_OVF_STRIDE, E_OVF_BATCH, E_OVF_BYTES, E_OVF_ADDRESS,
    /* overlap */
    E_Y_SELF_HEAD, E_Y_SELF_SEQ0, E_Y_SELF_BATCH_EQ_HEAD, E_Y_SELF_BATCH0, E_Y_SELF_HEAD0,
    E_INPLACE_SELF_OVERLAP, E_PARTIAL_OVERLAP, E_SAME_DATA_OTHER_STRIDES, E_OVERLAP_LAST,
    /* context parallelism and position modes */
    E_CP_RANK_EQ_SIZE, E_CP_RANK_NEG, E_CP_SIZE_NEG, E_CP0_RANK1, E_CP_ODD, E_CP_THD_ODD,
    E_CP_GLOBAL_OVERFLOW,
    E_IDS_OFFSETS, E_IDS_CP, E_THD_IDS_OFFSETS,
    /* cu_seqlens */
    E_CU0, E_CU_NONMONO, E_CU_LAST_SHORT, E_CU_LAST_LONG, E_NUM_SEQS_0, E_NUM_SEQS_NEG,
    E_NUM_SEQS_FEWER, E_CU_BATCH2, E_CU_NEG, E_CU_LAST_IN_Y,
    /* positions outside the table */
    E_IDS_HIGH, E_IDS_NEG, E_OFFSETS_HIGH, E_OFFSETS_NEG, E_OFFSETS_HUGE, E_CP_BEYOND,
    E_THD_OFFSETS_HIGH, E_THD_IDS_HIGH, E_TL_IDS_NEG, E_TL_OFFSETS_NEG, E_IDS_LAST_TOKEN,
    /* _qk */
    E_QK_NULL_QIN, E_QK_NULL_QOUT, E_QK_NULL_KIN, E_QK_NULL_KOUT, E_QK_SEQ, E_QK_BATCH,
    E_QK_K_HEAD_DIM, E_QK_OUT_SAME, E_QK_QOUT_ON_KIN, E_QK_KOUT_ON_QIN, E_QK_K_DTYPE,
    E_QK_K_NEG_STRIDE, E_QK_K_SELF_OVERLAP, E_QK_K_OVERFLOW, E_QK_K_BAD_IDS, E_QK_THD_CU,
    E_QK_K_SHAPE, E_QK_OUTS_SEQ_STRIDES, E_QK_OUTS_K_PAST_TOKEN, E_QK_OUTS_Q_PAST_TOKEN,
    E_HEADS_SWEEP_BOUND,
    /* successful borders and no-ops */
    S_BASE, S_INPLACE, S_IDS_MAX, S_OFFSETS_MAX, S_CP8_R7, S_TL_HUGE_IDS, S_CP0,
    S_NUM_SEQS_IGNORED, S_STREAM_IGNORED, S_BATCH1_STRIDE0, S_THD_EMPTY_SEQS, S_HEAD_DIM_ODD,
    S_ZERO_SEQ, S_ZERO_BATCH, S_ZERO_HEADS, S_ZERO_SEQ_DATA, S_ZERO_THD, S_ZERO_QK,
    S_POS_NULL, S_QK_INTERLEAVED, S_QK_OUTS_ONE_BUFFER, S_QK_OUTS_BATCH1_STRIDES,
    E_NUM
};

/* Needles several cases share (forward's names | backward's). */
#define N_SPANS "spans more memory than can be addressed"
#define N_SELF_OVERLAP "y's elements may overlap each other|dx's elements may overlap each other"
#define N_SHAPE "differ in dtype or shape"
#define N_PARTIAL "y may partially overlap x|dx may partially overlap dy"

static const ecase ecases[E_NUM] = {
    [E_NULL_CACHE] = {"NULL cache", V_SBHD, INV, "cache", 0},
    [E_NULL_X] = {"NULL input tensor", V_SBHD, INV, "x is NULL|dy is NULL", 0},
    [E_NULL_Y] = {"NULL output tensor", V_SBHD, INV, "y is NULL|dx is NULL", 0},
    [E_STYLE_2] = {"style 2", V_SBHD, INV, "style", 0},
    [E_STYLE_NEG] = {"style -1", V_SBHD, INV, "style", 0},
    [E_DTYPE_3] = {"dtype 3", V_SBHD, INV, "dtype", 0},
    [E_DTYPE_NEG] = {"dtype -1", V_SBHD, INV, "dtype", 0},
    [E_DTYPE_MISMATCH] = {"x f32, y f16", V_SBHD, INV, "dtype", 0},
    [E_BF16_F16_MISMATCH] = {"x bf16, y f16", V_SBHD, INV, "dtype", 0},
    [E_NEG_SEQ] = {"seq_len -1", V_SBHD, INV, "seq_len", 0},
    [E_NEG_BATCH] = {"batch -1", V_SBHD, INV, "batch", 0},
    [E_NEG_HEADS] = {"heads -1", V_SBHD, INV, "heads", 0},
    [E_NEG_HEAD_DIM] = {"head_dim -4", V_SBHD, INV, "head_dim", 0},
    [E_NEG_SEQ_X_ONLY] = {"x seq_len -8, y 8", V_SBHD, INV,
                          "x->seq_len is -8|dy->seq_len is -8", 0},
    [E_SEQ_MISMATCH] = {"y seq_len 7", V_SBHD, INV, N_SHAPE, 0},
    [E_BATCH_MISMATCH] = {"y batch 1", V_SBHD, INV, N_SHAPE, 0},
    [E_HEADS_MISMATCH] = {"y heads 2", V_SBHD, INV, N_SHAPE, 0},
    [E_HEAD_DIM_MISMATCH] = {"y head_dim 18", V_SBHD, INV, N_SHAPE, 0},
    [E_HEAD_DIM_LT_ROT] = {"head_dim 14 < rot_dim 16", V_SBHD, INV, "head_dim|rot_dim", 0},
    [E_HEAD_DIM_ODD_LT_ROT] = {"head_dim 15 < rot_dim 16", V_SBHD, INV, "head_dim|rot_dim", 0},
    [E_DATA_NULL_X] = {"x data NULL", V_SBHD, INV, "data", 0},
    [E_DATA_NULL_Y] = {"y data NULL", V_SBHD, INV, "data", 0},
    [E_MISALIGNED_X] = {"x data 1 byte off its float32 alignment", V_SBHD, INV,
                        "x->data (|dy->data (", 0},
    [E_MISALIGNED_Y] = {"y data 2 bytes off its float32 alignment", V_SBHD, INV,
                        "is not aligned to its 4-byte elements", 0},
    [E_MISALIGNED_BF16] = {"bfloat16 x data 1 byte off", V_SBHD, INV,
                           "is not aligned to its 2-byte elements", 0},
    [E_NEG_STRIDE_SEQ_X] = {"x stride_seq < 0", V_SBHD, INV, "stride", 0},
    [E_NEG_STRIDE_BATCH_X] = {"x stride_batch < 0", V_SBHD, INV, "stride", 0},
    [E_NEG_STRIDE_HEAD_X] = {"x stride_head < 0", V_SBHD, INV, "stride", 0},
    [E_NEG_STRIDE_SEQ_Y] = {"y stride_seq < 0", V_SBHD, INV, "stride", 0},
    [E_NEG_STRIDE_BATCH_Y] = {"y stride_batch < 0", V_SBHD, INV, "stride", 0},
    [E_NEG_STRIDE_HEAD_Y] = {"y stride_head < 0", V_SBHD, INV, "stride", 0},
    [E_OVF_SEQ] = {"seq_len INT64_MAX/2, stride 16 (in place)", V_TABLELESS, RNG, N_SPANS, 0},
    [E_OVF_HEADS] = {"heads INT64_MAX/2 (in place)", V_TABLELESS, RNG, N_SPANS, 0},
    [E_OVF_STRIDE] = {"stride_seq INT64_MAX/2 (in place)", V_TABLELESS, RNG, N_SPANS, 0},
    [E_OVF_BATCH] = {"batch 2^40 x stride_batch 2^30 (in place)", V_TABLELESS, RNG, N_SPANS, 0},
    [E_OVF_BYTES] = {"offsets fit, bytes 2^64 (in place)", V_TABLELESS, RNG, N_SPANS, 0},
    [E_OVF_ADDRESS] = {"bytes fit, data + bytes past the address space (in place)",
                       V_TABLELESS, RNG, N_SPANS, 0},
    [E_Y_SELF_HEAD] = {"y stride_head < head_dim", V_SBHD, INV, N_SELF_OVERLAP, 0},
    [E_Y_SELF_SEQ0] = {"y stride_seq 0", V_SBHD, INV, N_SELF_OVERLAP, 0},
    [E_Y_SELF_BATCH_EQ_HEAD] = {"y stride_batch == stride_head", V_SBHD, INV, N_SELF_OVERLAP, 0},
    [E_Y_SELF_BATCH0] = {"y stride_batch 0", V_SBHD, INV, N_SELF_OVERLAP, 0},
    [E_Y_SELF_HEAD0] = {"y stride_head 0", V_SBHD, INV, N_SELF_OVERLAP, 0},
    [E_INPLACE_SELF_OVERLAP] = {"in place, stride_head 0", V_SBHD, INV, N_SELF_OVERLAP, 0},
    [E_PARTIAL_OVERLAP] = {"y = x + 4 elements", V_SBHD, INV, N_PARTIAL, 0},
    [E_SAME_DATA_OTHER_STRIDES] = {"y.data == x.data, other strides", V_SBHD, INV,
                                   "same data pointer", 0},
    [E_OVERLAP_LAST] = {"y's first element is x's last", V_SBHD, INV, N_PARTIAL, 0},
    [E_CP_RANK_EQ_SIZE] = {"cp_rank 2 of 2", V_SBHD, INV, "cp_rank", 0},
    [E_CP_RANK_NEG] = {"cp_rank -1", V_SBHD, INV, "cp_rank", 0},
    [E_CP_SIZE_NEG] = {"cp_size -2", V_SBHD, INV, "cp_size", 0},
    [E_CP0_RANK1] = {"cp_size 0 (=1), cp_rank 1", V_SBHD, INV, "cp_rank", 0},
    [E_CP_ODD] = {"cp 2, seq_len 7", V_ODD, INV, "needs an even local length", 0},
    [E_CP_THD_ODD] = {"cp 2, THD sequence of 3", V_THD, INV,
                      "context parallelism needs even lengths", 0},
    [E_CP_GLOBAL_OVERFLOW] = {"cp_size INT32_MAX x seq_len 2^32 + 4 (in place)", V_TABLELESS,
                              RNG, "the global sequence length overflows", 0},
    [E_IDS_OFFSETS] = {"ids and offsets", V_SBHD, INV, "ids|offsets", 0},
    [E_IDS_CP] = {"ids and cp_size 2", V_SBHD, INV, "ids|cp", 0},
    [E_THD_IDS_OFFSETS] = {"THD ids and offsets", V_THD, INV, "ids|offsets", 0},
    [E_CU0] = {"cu_seqlens[0] = 1", V_THD, INV, "cu_seqlens", 0},
    [E_CU_NONMONO] = {"cu_seqlens 0 6 4 10", V_THD, INV, "cu_seqlens", 0},
    [E_CU_LAST_SHORT] = {"cu_seqlens[3] = 9 != tokens", V_THD, INV, "cu_seqlens|seq_len|token", 0},
    [E_CU_LAST_LONG] = {"cu_seqlens[3] = 11 != tokens", V_THD, INV, "cu_seqlens|seq_len|token", 0},
    [E_NUM_SEQS_0] = {"num_seqs 0", V_THD, INV, "num_seqs", 0},
    [E_NUM_SEQS_NEG] = {"num_seqs -1", V_THD, INV, "num_seqs", 0},
    [E_NUM_SEQS_FEWER] = {"num_seqs 2 (cu[2] = 4 != 10)", V_THD, INV,
                          "but the tensor has 10 tokens", 0},
    [E_CU_BATCH2] = {"cu_seqlens with batch 2", V_SBHD, INV, "batch", 0},
    [E_CU_NEG] = {"cu_seqlens 0 -2 4 10", V_THD, INV, "cu_seqlens", 0},
    [E_CU_LAST_IN_Y] = {"cu_seqlens[num_seqs] is y's first element", V_THD, INV,
                        "pos->cu_seqlens may overlap the output y|pos->cu_seqlens may overlap "
                        "the output dx", 0},
    [E_IDS_HIGH] = {"ids[last] = max_positions", V_SBHD, RNG, "position|ids", 0},
    [E_IDS_NEG] = {"ids[0] = -1", V_SBHD, RNG, "position|ids", 0},
    [E_OFFSETS_HIGH] = {"offsets[1] = 57 (57 + 7 = 64)", V_SBHD, RNG, "position|offsets", 0},
    [E_OFFSETS_NEG] = {"offsets[0] = -1", V_SBHD, RNG, "position|offsets", 0},
    [E_OFFSETS_HUGE] = {"offsets[1] = INT64_MAX", V_SBHD, RNG, "position|offsets", 0},
    [E_CP_BEYOND] = {"cp 16 rank 15: second half at 64", V_SBHD, RNG, "position", 0},
    [E_THD_OFFSETS_HIGH] = {"THD offsets[2] = 59 (len 6)", V_THD, RNG, "position|offsets", 0},
    [E_THD_IDS_HIGH] = {"THD ids[9] = 64", V_THD, RNG, "position|ids", 0},
    [E_TL_IDS_NEG] = {"table-less ids -1", V_TABLELESS, RNG, "position|ids", 0},
    [E_TL_OFFSETS_NEG] = {"table-less offsets -5", V_TABLELESS, RNG, "position|offsets", 0},
    [E_IDS_LAST_TOKEN] = {"only the very last token out of range", V_SBHD, RNG, "position|ids", 0},
    [E_QK_NULL_QIN] = {"_qk q_in NULL", V_QK, INV, "q_in is NULL|dq_out is NULL", 0},
    [E_QK_NULL_QOUT] = {"_qk q_out NULL", V_QK, INV, "q_out is NULL|dq_in is NULL", 0},
    [E_QK_NULL_KIN] = {"_qk k_in NULL", V_QK, INV, "k_in is NULL|dk_out is NULL", 0},
    [E_QK_NULL_KOUT] = {"_qk k_out NULL", V_QK, INV, "k_out is NULL|dk_in is NULL", 0},
    [E_QK_SEQ] = {"_qk k seq_len 7 vs q 8", V_QK, INV, "seq_len", 0},
    [E_QK_BATCH] = {"_qk k batch 1 vs q 2", V_QK, INV, "batch", 0},
    [E_QK_K_HEAD_DIM] = {"_qk k head_dim 14 < rot_dim", V_QK, INV, "head_dim|rot_dim", 0},
    [E_QK_OUT_SAME] = {"_qk k_out == q_out", V_QK, INV, "the two outputs must not share memory", 0},
    [E_QK_QOUT_ON_KIN] = {"_qk q_out on k_in", V_QK, INV,
                          "q_out may overlap k_in|dq_in may overlap dk_out", 0},
    [E_QK_KOUT_ON_QIN] = {"_qk k_out overlaps q_in", V_QK, INV,
                          "k_out may overlap q_in|dk_in may overlap dq_out", 0},
    [E_QK_K_DTYPE] = {"_qk k_in f16, k_out f32", V_QK, INV, "dtype", 0},
    [E_QK_K_NEG_STRIDE] = {"_qk k_in stride_head < 0", V_QK, INV, "stride", 0},
    [E_QK_K_SELF_OVERLAP] = {"_qk k_out overlaps itself", V_QK, INV,
                             "k_out's elements may overlap each other|dk_in's elements may "
                             "overlap each other", 0},
    [E_QK_K_OVERFLOW] = {"_qk k extent overflows", V_QK, RNG,
                         "k_in spans more memory|dk_out spans more memory", 0},
    [E_QK_K_BAD_IDS] = {"_qk ids out of range", V_QK, RNG, "position|ids", 0},
    [E_QK_THD_CU] = {"_qk THD cu_seqlens[3] = 9", V_QK_THD, INV, "cu_seqlens|seq_len|token", 0},
    [E_QK_K_SHAPE] = {"_qk k_out heads 1 vs k_in 2", V_QK, INV, N_SHAPE, 0},
    [E_QK_OUTS_SEQ_STRIDES] = {"_qk outputs in one buffer, k's seq stride 190 vs q's 200",
                               V_QK, INV, "the two outputs must not share memory", 0},
    [E_QK_OUTS_K_PAST_TOKEN] = {"_qk outputs in one buffer, k's heads past the token stride",
                                V_QK, INV, "the two outputs must not share memory", 0},
    [E_QK_OUTS_Q_PAST_TOKEN] = {"_qk outputs in one buffer, k first, q's heads past the token "
                                "stride", V_QK, INV, "the two outputs must not share memory", 0},
    [E_HEADS_SWEEP_BOUND] = {"2^40 heads, x broadcast over them, y one head on", V_SBHD, INV,
                             N_PARTIAL, 0},
    [S_BASE] = {"baseline", V_SBHD, OK, "", 0},
    [S_INPLACE] = {"in place", V_SBHD, OK, "", 0},
    [S_IDS_MAX] = {"ids = max_positions - 1", V_SBHD, OK, "", 0},
    [S_OFFSETS_MAX] = {"offsets[1] = 56 (last row)", V_SBHD, OK, "", 0},
    [S_CP8_R7] = {"cp 8 rank 7", V_SBHD, OK, "", 0},
    [S_TL_HUGE_IDS] = {"table-less ids 10^9", V_TABLELESS, OK, "", 0},
    [S_CP0] = {"cp_size 0 counts as 1", V_SBHD, OK, "", 0},
    [S_NUM_SEQS_IGNORED] = {"num_seqs -3 without cu_seqlens", V_SBHD, OK, "", 0},
    [S_STREAM_IGNORED] = {"stream ignored on the CPU", V_SBHD, OK, "", 0},
    [S_BATCH1_STRIDE0] = {"batch 1 with stride_batch 0", V_SBHD, OK, "", 0},
    [S_THD_EMPTY_SEQS] = {"THD cu 0 0 10 10", V_THD, OK, "", 0},
    [S_HEAD_DIM_ODD] = {"head_dim 17 (> rot_dim)", V_SBHD, OK, "", 0},
    [S_ZERO_SEQ] = {"seq_len 0, data NULL", V_SBHD, OK, "", 1},
    [S_ZERO_BATCH] = {"batch 0, data NULL", V_SBHD, OK, "", 1},
    [S_ZERO_HEADS] = {"heads 0, data NULL", V_SBHD, OK, "", 1},
    [S_ZERO_SEQ_DATA] = {"seq_len 0, data set", V_SBHD, OK, "", 1},
    [S_ZERO_THD] = {"THD 0 tokens, cu 0 0", V_THD, OK, "", 1},
    [S_ZERO_QK] = {"_qk seq_len 0", V_QK, OK, "", 1},
    [S_POS_NULL] = {"positions NULL", V_SBHD, OK, "", 0},
    [S_QK_INTERLEAVED] = {"_qk q/k disjoint interleaved views", V_QK, OK, "", 0},
    [S_QK_OUTS_ONE_BUFFER] = {"_qk outputs in one buffer, k beside q in each token", V_QK, OK,
                              "", 0},
    [S_QK_OUTS_BATCH1_STRIDES] = {"_qk outputs in one buffer, batch 1, other stride_batch",
                                  V_QK, OK, "", 0},
};

#define F16 FUSEDROPE_FLOAT16

/* The overflow cases' in-place view: seq_len tokens of one 16-channel head
 * (batch 1) at x's data, stride_seq apart. */
static void one_head_tokens(ectx *c, int64_t seq_len, int64_t stride_seq)
{
    c->x.seq_len = seq_len;
    c->x.batch = 1;
    c->x.heads = 1;
    c->x.head_dim = 16;
    c->x.stride_seq = stride_seq;
    c->y = c->x;
}

static void mutate(ectx *c, int id)
{
    size_t es = 4;
    switch (id) {
    case E_NULL_CACHE: c->cache = NULL; break;
    case E_NULL_X: c->px = NULL; break;
    case E_NULL_Y: c->py = NULL; break;
    case E_STYLE_2: c->style = 2; break;
    case E_STYLE_NEG: c->style = -1; break;
    case E_DTYPE_3: c->x.dtype = c->y.dtype = (fusedrope_dtype)3; break;
    case E_DTYPE_NEG: c->x.dtype = c->y.dtype = (fusedrope_dtype)-1; break;
    case E_DTYPE_MISMATCH: c->y.dtype = F16; break;
    case E_BF16_F16_MISMATCH: c->x.dtype = FUSEDROPE_BFLOAT16; c->y.dtype = F16; break;
    case E_NEG_SEQ: c->x.seq_len = c->y.seq_len = -1; break;
    case E_NEG_BATCH: c->x.batch = c->y.batch = -1; break;
    case E_NEG_HEADS: c->x.heads = c->y.heads = -1; break;
    case E_NEG_HEAD_DIM: c->x.head_dim = c->y.head_dim = -4; break;
    case E_NEG_SEQ_X_ONLY: c->x.seq_len = -8; break;
    case E_SEQ_MISMATCH: c->y.seq_len = 7; break;
    case E_BATCH_MISMATCH: c->y.batch = 1; break;
    case E_HEADS_MISMATCH: c->y.heads = 2; break;
    case E_HEAD_DIM_MISMATCH: c->y.head_dim = 18; break;
    case E_HEAD_DIM_LT_ROT: c->x.head_dim = c->y.head_dim = 14; break;
    case E_HEAD_DIM_ODD_LT_ROT: c->x.head_dim = c->y.head_dim = 15; break;
    case E_DATA_NULL_X: c->x.data = NULL; break;
    case E_DATA_NULL_Y: c->y.data = NULL; break;
    case E_MISALIGNED_X: c->x.data = (char *)c->x.data + 1; break;
    case E_MISALIGNED_Y: c->y.data = (char *)c->y.data + 2; break;
    case E_MISALIGNED_BF16:
        c->x.dtype = c->y.dtype = FUSEDROPE_BFLOAT16;
        c->x.data = (char *)c->x.data + 1;
        break;
    case E_NEG_STRIDE_SEQ_X:
        /* pointing at the last token so that |stride| would stay in bounds */
        c->x.data = (float *)c->x.data + (S0 - 1) * c->x.stride_seq;
        c->x.stride_seq = -c->x.stride_seq;
        break;
    case E_NEG_STRIDE_BATCH_X:
        c->x.data = (float *)c->x.data + (B0 - 1) * c->x.stride_batch;
        c->x.stride_batch = -c->x.stride_batch;
        break;
    case E_NEG_STRIDE_HEAD_X:
        c->x.data = (float *)c->x.data + (H0 - 1) * c->x.stride_head;
        c->x.stride_head = -c->x.stride_head;
        break;
    case E_NEG_STRIDE_SEQ_Y:
        c->y.data = (float *)c->y.data + (S0 - 1) * c->y.stride_seq;
        c->y.stride_seq = -c->y.stride_seq;
        break;
    case E_NEG_STRIDE_BATCH_Y:
        c->y.data = (float *)c->y.data + (B0 - 1) * c->y.stride_batch;
        c->y.stride_batch = -c->y.stride_batch;
        break;
    case E_NEG_STRIDE_HEAD_Y:
        c->y.data = (float *)c->y.data + (H0 - 1) * c->y.stride_head;
        c->y.stride_head = -c->y.stride_head;
        break;
    case E_OVF_SEQ: one_head_tokens(c, INT64_MAX / 2, 16); break;
    case E_OVF_HEADS:
        c->x.seq_len = 1;
        c->x.batch = 1;
        c->x.heads = INT64_MAX / 2;
        c->x.head_dim = 16;
        c->x.stride_head = 16;
        c->y = c->x;
        break;
    case E_OVF_STRIDE: one_head_tokens(c, 3, INT64_MAX / 2); break;
    case E_OVF_BATCH:
        c->x.seq_len = 1;
        c->x.batch = (int64_t)1 << 40;
        c->x.heads = 1;
        c->x.head_dim = 16;
        c->x.stride_batch = (int64_t)1 << 30;
        c->y = c->x;
        break;
    case E_OVF_BYTES:
        /* largest element offset ~2^62 fits int64; times 4 bytes it does not */
        one_head_tokens(c, (int64_t)1 << 58, 16);
        break;
    case E_OVF_ADDRESS:
        /* 64 MiB from 256 bytes below the top of the address space: never
         * dereferenced, the call refuses it first */
        c->x.data = (void *)(UINTPTR_MAX - 255);
        one_head_tokens(c, (int64_t)1 << 20, 16);
        break;
    case E_CP_GLOBAL_OVERFLOW:
        /* a tensor that fits (2^36 elements, never touched: refused first)
         * whose global length, seq_len x cp_size, passes int64_t */
        one_head_tokens(c, ((int64_t)1 << 32) + 4, 16); /* + 2 fits: 2^63 - 2 */
        c->pos.cp_size = INT32_MAX;
        c->pos.cp_rank = 0;
        break;
    case E_Y_SELF_HEAD: c->y.stride_head = D0 - 1; break;
    case E_Y_SELF_SEQ0: c->y.stride_seq = 0; break;
    case E_Y_SELF_BATCH_EQ_HEAD: c->y.stride_batch = c->y.stride_head; break;
    case E_Y_SELF_BATCH0: c->y.stride_batch = 0; break;
    case E_Y_SELF_HEAD0: c->y.stride_head = 0; break;
    case E_INPLACE_SELF_OVERLAP:
        c->x.stride_head = 0;
        c->y = c->x;
        break;
    case E_PARTIAL_OVERLAP:
        c->y = c->x;
        c->y.data = (float *)c->x.data + 4;
        break;
    case E_SAME_DATA_OTHER_STRIDES:
        c->y = c->x;
        c->y.stride_head = D0 + 1;
        c->y.stride_batch = H0 * (D0 + 1);
        c->y.stride_seq = B0 * H0 * (D0 + 1);
        break;
    case E_OVERLAP_LAST:
        c->y = c->x;
        c->y.data = (float *)c->x.data + (S0 * B0 * H0 * D0 - 1);
        break;
    case E_CP_RANK_EQ_SIZE: c->pos.cp_size = 2; c->pos.cp_rank = 2; break;
    case E_CP_RANK_NEG: c->pos.cp_size = 2; c->pos.cp_rank = -1; break;
    case E_CP_SIZE_NEG: c->pos.cp_size = -2; c->pos.cp_rank = 0; break;
    case E_CP0_RANK1: c->pos.cp_size = 0; c->pos.cp_rank = 1; break;
    case E_CP_ODD: c->pos.cp_size = 2; c->pos.cp_rank = 1; break;
    case E_CP_THD_ODD:
        c->cu[1] = 3; /* lengths 3 1 6 */
        c->pos.cp_size = 2;
        break;
    case E_IDS_OFFSETS: c->pos.ids = c->ids; c->pos.offsets = c->offsets; break;
    case E_IDS_CP: c->pos.ids = c->ids; c->pos.cp_size = 2; c->pos.cp_rank = 0; break;
    case E_THD_IDS_OFFSETS: c->pos.ids = c->ids; c->pos.offsets = c->offsets; break;
    case E_CU0: c->cu[0] = 1; break;
    case E_CU_NONMONO: c->cu[1] = 6; break;
    case E_CU_LAST_SHORT: c->cu[3] = 9; break;
    case E_CU_LAST_LONG: c->cu[3] = 11; break;
    case E_NUM_SEQS_0: c->pos.num_seqs = 0; break;
    case E_NUM_SEQS_NEG: c->pos.num_seqs = -1; break;
    case E_NUM_SEQS_FEWER: c->pos.num_seqs = 2; break;
    case E_CU_BATCH2:
        c->cu[0] = 0;
        c->cu[1] = S0;
        c->pos.cu_seqlens = c->cu;
        c->pos.num_seqs = 1;
        break;
    case E_CU_NEG: c->cu[1] = -2; break;
    case E_IDS_HIGH: c->pos.ids = c->ids; c->ids[S0 * B0 - 1] = ROWS; break;
    case E_IDS_NEG: c->pos.ids = c->ids; c->ids[0] = -1; break;
    case E_OFFSETS_HIGH: c->pos.offsets = c->offsets; c->offsets[1] = ROWS - S0 + 1; break;
    case E_OFFSETS_NEG: c->pos.offsets = c->offsets; c->offsets[0] = -1; break;
    case E_OFFSETS_HUGE: c->pos.offsets = c->offsets; c->offsets[1] = INT64_MAX; break;
    case E_CP_BEYOND: c->pos.cp_size = 16; c->pos.cp_rank = 15; break;
    case E_THD_OFFSETS_HIGH: c->pos.offsets = c->offsets; c->offsets[2] = ROWS - 6 + 1; break;
    case E_THD_IDS_HIGH: c->pos.ids = c->ids; c->ids[9] = ROWS; break;
    case E_TL_IDS_NEG: c->pos.ids = c->ids; c->ids[5] = -1; break;
    case E_TL_OFFSETS_NEG: c->pos.offsets = c->offsets; c->offsets[1] = -5; break;
    case E_CU_LAST_IN_Y: {
        /* a copy of cu_seqlens (0 4 4 10) in y's buffer, y starting at its
         * last entry: the test must count num_seqs + 1 entries */
        int32_t *cu = (int32_t *)c->y.data + 1;
        memcpy(cu, c->cu, 4 * sizeof *cu);
        c->pos.cu_seqlens = cu;
        c->y.data = cu + 3;
        break;
    }
    case E_IDS_LAST_TOKEN:
        /* batch 1, token 7: the last one processed in any natural order */
        c->pos.ids = c->ids;
        c->ids[1 * S0 + S0 - 1] = ROWS + 1000;
        break;
    case E_QK_NULL_QIN: c->px = NULL; break;
    case E_QK_NULL_QOUT: c->py = NULL; break;
    case E_QK_NULL_KIN: c->pkx = NULL; break;
    case E_QK_NULL_KOUT: c->pky = NULL; break;
    case E_QK_SEQ: c->kx.seq_len = c->ky.seq_len = 7; break;
    case E_QK_BATCH: c->kx.batch = c->ky.batch = 1; break;
    case E_QK_K_HEAD_DIM: c->kx.head_dim = c->ky.head_dim = 14; break;
    case E_QK_OUT_SAME:
        c->ky.data = c->y.data;
        break;
    case E_QK_QOUT_ON_KIN:
        /* q_out's bytes are k_in's (k buffers are large enough: SLACK) */
        c->y.data = c->kx.data;
        break;
    case E_QK_KOUT_ON_QIN:
        c->ky.data = (float *)c->x.data + 3;
        break;
    case E_QK_K_DTYPE: c->kx.dtype = F16; break;
    case E_QK_K_NEG_STRIDE:
        c->kx.data = (float *)c->kx.data + (KH0 - 1) * c->kx.stride_head;
        c->kx.stride_head = -c->kx.stride_head;
        break;
    case E_QK_K_SELF_OVERLAP: c->ky.stride_head = KD0 / 2; break;
    case E_QK_K_OVERFLOW:
        c->kx.stride_seq = INT64_MAX / 4;
        c->ky.stride_seq = INT64_MAX / 4;
        break;
    case E_QK_K_BAD_IDS: c->pos.ids = c->ids; c->ids[3] = ROWS; break;
    case E_QK_THD_CU: c->cu[3] = 9; break;
    case E_QK_K_SHAPE: c->ky.heads = 1; break;
    /* successes */
    case S_BASE: break;
    case S_INPLACE: c->y = c->x; break;
    case S_IDS_MAX: c->pos.ids = c->ids; c->ids[0] = ROWS - 1; c->ids[S0 * B0 - 1] = ROWS - 1; break;
    case S_OFFSETS_MAX: c->pos.offsets = c->offsets; c->offsets[1] = ROWS - S0; break;
    case S_CP8_R7: c->pos.cp_size = 8; c->pos.cp_rank = 7; break;
    case S_TL_HUGE_IDS: c->pos.ids = c->ids; c->ids[2] = 1000000000; break;
    case S_CP0: c->pos.cp_size = 0; c->pos.cp_rank = 0; break;
    case S_NUM_SEQS_IGNORED: c->pos.num_seqs = -3; break;
    case S_STREAM_IGNORED: c->stream = (void *)c; break;
    case S_BATCH1_STRIDE0:
        c->x.batch = c->y.batch = 1;
        c->x.stride_batch = c->y.stride_batch = 0;
        break;
    case S_THD_EMPTY_SEQS: c->cu[1] = 0; c->cu[2] = 10; break;
    case S_HEAD_DIM_ODD: c->x.head_dim = c->y.head_dim = 17; break;
    case S_ZERO_SEQ:
        c->x.seq_len = c->y.seq_len = 0;
        c->x.data = c->y.data = NULL;
        break;
    case S_ZERO_BATCH:
        c->x.batch = c->y.batch = 0;
        c->x.data = c->y.data = NULL;
        break;
    case S_ZERO_HEADS:
        c->x.heads = c->y.heads = 0;
        c->x.data = c->y.data = NULL;
        break;
    case S_ZERO_SEQ_DATA: c->x.seq_len = c->y.seq_len = 0; break;
    case S_ZERO_THD:
        c->x.seq_len = c->y.seq_len = 0;
        c->cu[0] = c->cu[1] = 0;
        c->pos.num_seqs = 1;
        break;
    case S_ZERO_QK: c->x.seq_len = c->y.seq_len = c->kx.seq_len = c->ky.seq_len = 0; break;
    case S_POS_NULL: c->pp = NULL; break;
    case S_QK_INTERLEAVED: {
        /* [s][b][h][2][d]: q = slot 0, k = slot 1 of one buffer, in place */
        fusedrope_tensor q = c->x;
        q.head_dim = KD0;
        q.heads = KH0;
        q.stride_head = 2 * KD0;
        q.stride_batch = KH0 * 2 * KD0;
        q.stride_seq = B0 * KH0 * 2 * KD0;
        c->x = c->y = q;
        c->kx = c->ky = q;
        c->kx.data = c->ky.data = (float *)q.data + KD0;
        break;
    }
    /* q_out and k_out in the one buffer of q_out: a token of 100 elements
     * holds q's 3 x 20 then k's 2 x 16 (ending at 92); the views share one
     * token lattice, so the call can prove them apart.  Each refused
     * variation makes a token of one view reach into a token of the other */
    case S_QK_OUTS_ONE_BUFFER:
    case E_QK_OUTS_SEQ_STRIDES:
    case E_QK_OUTS_K_PAST_TOKEN:
    case E_QK_OUTS_Q_PAST_TOKEN:
    case S_QK_OUTS_BATCH1_STRIDES: {
        float *base = c->y.data;
        int64_t token = id == E_QK_OUTS_Q_PAST_TOKEN ? 90 : 100;
        if (id == S_QK_OUTS_BATCH1_STRIDES)
            c->x.batch = c->y.batch = c->kx.batch = c->ky.batch = 1;
        c->ky.data = base + 60;
        c->y.stride_batch = c->ky.stride_batch = token;
        c->y.stride_seq = c->ky.stride_seq = 2 * token;
        if (id == E_QK_OUTS_SEQ_STRIDES) /* k's token 1 at 250, in q's [200, 260) */
            c->ky.stride_seq = 190;
        if (id == E_QK_OUTS_K_PAST_TOKEN) /* k's [80, 112), in q's next [100, 160) */
            c->ky.data = base + 80;
        /* tokens 90 apart: k at [0, 32), q at [40, 100), in k's next [90, 122) */
        if (id == E_QK_OUTS_Q_PAST_TOKEN) {
            c->ky.data = base;
            c->y.data = base + 40;
        }
        if (id == S_QK_OUTS_BATCH1_STRIDES) /* one batch entry: canonical() ignores it */
            c->ky.stride_batch = 7;
        break;
    }
    case E_HEADS_SWEEP_BOUND: {
        /* x broadcasts a head to 2^40 (stride 0); y's heads start one head
         * past x's data in the same lattice, a token of y ending where x's
         * next begins: the address ranges meet, no byte is shared, and a
         * sweep head by head would run 2^40 steps.  More than 2^20 heads are
         * refused unswept (fusedrope_forward(3): the test is conservative),
         * at once, touching nothing */
        const int64_t heads = (int64_t)1 << 40;
        c->x.heads = c->y.heads = heads;
        c->x.seq_len = c->y.seq_len = 2;
        c->x.batch = c->y.batch = 1;
        c->x.stride_head = 0;
        c->y.stride_head = D0;
        c->x.stride_seq = c->y.stride_seq = (heads + 1) * D0;
        c->y.data = (float *)c->x.data + D0;
        break;
    }
    }
    (void)es;
}

/* ------------------------------------------------------------------- runner */

static int contains_any(const char *msg, const char *alts)
{
    char buf[128], *tok, *save = NULL;
    if (!alts[0])
        return 1;
    snprintf(buf, sizeof buf, "%s", alts);
    for (tok = strtok_r(buf, "|", &save); tok; tok = strtok_r(NULL, "|", &save))
        if (tu_contains(msg, tok))
            return 1;
    return 0;
}

START_TEST(test_error_case)
{
    int id = _i / 2, backward = _i % 2, k;
    const ecase *e = &ecases[id];
    ectx base, c;
    tu_buf snap[4];
    int64_t ids0[128], off0[8];
    int32_t cu0[8];
    fusedrope_status st;
    const char *kind = backward ? "backward" : "forward";
    char before[512];

    ck_assert_msg(e->name != NULL, "case %d has no entry", id);
    /* the unmodified call of this variant succeeds */
    setup(&base, e->variant);
    st = do_call(&base, backward);
    ck_assert_msg(st == OK, "%s (%s): baseline failed: %s (%s)", e->name, kind,
                  fusedrope_status_string(st), fusedrope_last_error());

    setup(&c, e->variant);
    mutate(&c, id);
    for (k = 0; k < 4; k++)
        snap[k] = tu_buf_copy(&c.b[k]);
    memcpy(ids0, c.ids, sizeof ids0);
    memcpy(off0, c.offsets, sizeof off0);
    memcpy(cu0, c.cu, sizeof cu0);
    snprintf(before, sizeof before, "%s", fusedrope_last_error());
    st = do_call(&c, backward);
    ck_assert_msg(st == e->want, "%s (%s): got %s, want %s (last_error \"%s\")", e->name, kind,
                  fusedrope_status_string(st), fusedrope_status_string(e->want),
                  fusedrope_last_error());
    if (e->want != OK) {
        ck_assert_msg(fusedrope_last_error() != NULL && fusedrope_last_error()[0] != 0,
                      "%s (%s): empty last_error", e->name, kind);
        ck_assert_msg(contains_any(fusedrope_last_error(), e->names),
                      "%s (%s): last_error \"%s\" names none of %s", e->name, kind,
                      fusedrope_last_error(), e->names);
    } else {
        ck_assert_msg(strcmp(fusedrope_last_error(), before) == 0,
                      "%s (%s): a successful call changed last_error to \"%s\"", e->name,
                      kind, fusedrope_last_error());
    }
    if (e->want != OK || e->noop) {
        /* nothing written, anywhere */
        for (k = 0; k < 4; k++) {
            size_t first = 0, n = tu_changed(&c.b[k], &snap[k], &first);
            ck_assert_msg(n == 0, "%s (%s): %zu bytes of buffer %d written (first at %zu)",
                          e->name, kind, n, k, first);
        }
    } else {
        /* a success: the output views were written (no poison left) */
        int64_t s, b, h, ch;
        const fusedrope_tensor *outs[2] = {&c.y, &c.ky};
        for (k = 0; k < (c.qk ? 2 : 1); k++) {
            const fusedrope_tensor *t = outs[k];
            for (s = 0; s < t->seq_len; s++)
                for (b = 0; b < t->batch; b++)
                    for (h = 0; h < t->heads; h++)
                        for (ch = 0; ch < t->head_dim; ch++) {
                            double v = ref_load(t->data, t->dtype, ref_offset(t, s, b, h, ch));
                            ck_assert_msg(isfinite(v), "%s (%s): output %d [%lld %lld %lld "
                                          "%lld] not written", e->name, kind, k, (long long)s,
                                          (long long)b, (long long)h, (long long)ch);
                        }
        }
    }
    ck_assert_msg(memcmp(ids0, c.ids, sizeof ids0) == 0 &&
                      memcmp(off0, c.offsets, sizeof off0) == 0 &&
                      memcmp(cu0, c.cu, sizeof cu0) == 0,
                  "%s (%s): position arrays modified", e->name, kind);
    tu_free_all();
}
END_TEST

/* An error of a failing call is recorded per thread. */
static void *thread_fail(void *arg)
{
    char *out = arg;
    fusedrope_tensor t = fusedrope_tensor_sbhd(out, FUSEDROPE_FLOAT32, 1, 1, 1, 16);
    fusedrope_status st = fusedrope_forward(NULL, FUSEDROPE_NEOX, NULL, &t, &t, NULL);
    snprintf(out, 256, "%d|%s", (int)st, fusedrope_last_error());
    return NULL;
}

START_TEST(test_last_error_thread_local)
{
    pthread_t th;
    char msg[256];
    char saved[256];
    ectx c;
    setup(&c, V_SBHD);
    /* this thread fails first with one message */
    c.style = 7;
    ck_assert_int_eq(do_call(&c, 0), INV);
    snprintf(saved, sizeof saved, "%s", fusedrope_last_error());
    ck_assert_str_ne(saved, "");
    memset(msg, 0, sizeof msg);
    ck_assert_int_eq(pthread_create(&th, NULL, thread_fail, msg), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    /* the other thread saw its own failure, and ours is unchanged */
    ck_assert_msg(strncmp(msg, "1|", 2) == 0 && msg[2] != 0, "thread: \"%s\"", msg);
    ck_assert_msg(strcmp(msg + 2, saved) != 0, "both threads report \"%s\"", saved);
    ck_assert_str_eq(fusedrope_last_error(), saved);
    tu_free_all();
}
END_TEST

START_TEST(test_last_error_names_value)
{
    /* "a sentence naming the argument and value" */
    ectx c;
    setup(&c, V_SBHD);
    c.pos.cp_size = 2;
    c.pos.cp_rank = 5;
    ck_assert_int_eq(do_call(&c, 0), INV);
    ck_assert_msg(tu_contains(fusedrope_last_error(), "cp_rank") &&
                      tu_contains(fusedrope_last_error(), "5"),
                  "last_error \"%s\"", fusedrope_last_error());
    setup(&c, V_SBHD);
    c.x.seq_len = c.y.seq_len = -123;
    ck_assert_int_eq(do_call(&c, 1), INV);
    ck_assert_msg(tu_contains(fusedrope_last_error(), "seq_len") &&
                      tu_contains(fusedrope_last_error(), "-123"),
                  "last_error \"%s\"", fusedrope_last_error());
    setup(&c, V_SBHD);
    c.pos.ids = c.ids;
    c.ids[5] = 4242;
    ck_assert_int_eq(do_call(&c, 0), RNG);
    ck_assert_msg(tu_contains(fusedrope_last_error(), "4242"), "last_error \"%s\"",
                  fusedrope_last_error());
    tu_free_all();
}
END_TEST

/* Some sentences word for word, values included (DESIGN: "a sentence naming
 * the argument and value"; a sentence that prints the wrong entry's value
 * passes any substring test that only looks for the name). */
static void expect_sentence(fusedrope_status got, fusedrope_status want, const char *sentence)
{
    ck_assert_msg(got == want, "status %s (%s), want %s", fusedrope_status_string(got),
                  fusedrope_last_error(), fusedrope_status_string(want));
    ck_assert_msg(strcmp(fusedrope_last_error(), sentence) == 0, "last_error \"%s\", want \"%s\"",
                  fusedrope_last_error(), sentence);
}

/* A call whose tensors are all empty (here 0 heads) passes the positions'
 * rules too (fusedrope_forward(3), Tensors): cu_seqlens must end at the
 * token count, start at 0 and be aligned; implicit positions must lie in
 * the table; valid positions succeed, writing nothing; a batch of 0 has no
 * token and so no position. */
START_TEST(test_empty_call_positions)
{
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_positions p;
    static int32_t cu[4];
    fusedrope_tensor te = fusedrope_tensor_thd(NULL, FUSEDROPE_FLOAT32, 4, 0, ROT);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, ROT, ROWS, 10000);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), OK);
    tu_track(cache);
    fusedrope_positions_init(&p);
    p.cu_seqlens = cu;
    p.num_seqs = 1;
    cu[0] = 0, cu[1] = 5;
    expect_sentence(fusedrope_forward(cache, FUSEDROPE_NEOX, &p, &te, &te, NULL), INV,
                    "pos->cu_seqlens[num_seqs = 1] is 5 but the tensor has 4 tokens");
    cu[0] = 7, cu[1] = 4;
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &p, &te, &te, NULL), INV);
    ck_assert_msg(strstr(fusedrope_last_error(), "cu_seqlens[0]"), "%s", fusedrope_last_error());
    cu[0] = 0, cu[1] = 4;
    ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, &p, &te, &te, NULL), OK);
    p.cu_seqlens = (const int32_t *)((const char *)cu + 2);
    ck_assert_int_eq(fusedrope_backward(cache, FUSEDROPE_NEOX, &p, &te, &te, NULL), INV);
    ck_assert_msg(strstr(fusedrope_last_error(), "aligned"), "%s", fusedrope_last_error());
    {
        fusedrope_tensor long_seq = fusedrope_tensor_sbhd(NULL, FUSEDROPE_FLOAT32, 100, 1, 0, ROT);
        ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, NULL, &long_seq, &long_seq, NULL),
                         FUSEDROPE_ERR_RANGE);
        long_seq.seq_len = ROWS;
        ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, NULL, &long_seq, &long_seq, NULL),
                         OK);
        /* batch 0: no token, so no position, whatever seq_len */
        long_seq = fusedrope_tensor_bshd(NULL, FUSEDROPE_FLOAT32, 0, (int64_t)1 << 40, 1, ROT);
        ck_assert_msg(fusedrope_forward(cache, FUSEDROPE_NEOX, NULL, &long_seq, &long_seq, NULL) ==
                          OK, "%s", fusedrope_last_error());
    }
    {
        /* An empty call's positions take work in its arrays' sizes, not its
         * tokens' (each case walked ~2^60 tokens before 2026-11-30: libFuzzer
         * timed out): seq_len 0 with any batch and ids has no token; with
         * offsets and no ids, a sequence of 2^40 tokens is judged by its ends
         * and the first bad token named, found by bisection. */
        static int64_t ids[1], off[2];
        fusedrope_tensor t = fusedrope_tensor_bshd(NULL, FUSEDROPE_FLOAT32, (int64_t)1 << 60, 0, 0,
                                                   ROT);
        char want[160];
        fusedrope_positions_init(&p);
        p.ids = ids;
        ck_assert_msg(fusedrope_forward(cache, FUSEDROPE_NEOX, &p, &t, &t, NULL) == OK, "%s",
                      fusedrope_last_error());
        fusedrope_positions_init(&p);
        p.offsets = off;
        t = fusedrope_tensor_bshd(NULL, FUSEDROPE_FLOAT32, 2, (int64_t)1 << 40, 0, ROT);
        off[0] = 0, off[1] = -(((int64_t)1 << 40) - ROWS); /* batch 1's last ROWS tokens are in */
        snprintf(want, sizeof want, "token (batch 0, seq %d) has position %d, outside the "
                 "table's [0, %d)", ROWS, ROWS, ROWS);
        expect_sentence(fusedrope_forward(cache, FUSEDROPE_NEOX, &p, &t, &t, NULL),
                        FUSEDROPE_ERR_RANGE, want);
        off[0] = off[1];
        snprintf(want, sizeof want, "token (batch 0, seq 0) has position %lld, outside the "
                 "table's [0, %d)", (long long)off[1], ROWS);
        expect_sentence(fusedrope_forward(cache, FUSEDROPE_NEOX, &p, &t, &t, NULL),
                        FUSEDROPE_ERR_RANGE, want);
        off[0] = off[1] = 0;
        t.seq_len = ROWS;
        ck_assert_msg(fusedrope_forward(cache, FUSEDROPE_NEOX, &p, &t, &t, NULL) == OK, "%s",
                      fusedrope_last_error());
    }
}
END_TEST

START_TEST(test_sentences_verbatim)
{
    ectx c;
    fusedrope_cache_config cfg;
    fusedrope_cache *cache = NULL;

    setup(&c, V_THD); /* cu_seqlens 0 4 4 10 */
    c.cu[0] = 3;
    expect_sentence(do_call(&c, 0), INV, "pos->cu_seqlens[0] is 3; it must be 0");
    setup(&c, V_THD);
    c.cu[2] = 2;
    expect_sentence(do_call(&c, 0), INV,
                    "pos->cu_seqlens is not monotonic: cu_seqlens[2] = 2 < cu_seqlens[1] = 4");
    setup(&c, V_THD);
    c.cu[3] = 9;
    expect_sentence(do_call(&c, 1), INV,
                    "pos->cu_seqlens[num_seqs = 3] is 9 but the tensor has 10 tokens");
    setup(&c, V_THD);
    c.cu[1] = 3;
    c.pos.cp_size = 2;
    expect_sentence(do_call(&c, 0), INV,
                    "sequence 0 has local length 3; context parallelism needs even lengths");
    setup(&c, V_SBHD);
    c.pos.ids = c.ids;
    c.ids[1 * S0 + 5] = 4242;
    expect_sentence(do_call(&c, 0), RNG,
                    "token (batch 1, seq 5) has position 4242, outside the table's [0, 64)");
    setup(&c, V_THD); /* a packed token is named by its index, not as a (batch, seq) place */
    c.pos.ids = c.ids;
    c.ids[7] = 4242;
    expect_sentence(do_call(&c, 0), RNG,
                    "token 7 of the packed tokens has position 4242, outside the table's [0, 64)");

    /* context parallelism: the second local half of rank 0 of 8 ends at the
     * global position (2 * 8 - 1) * 4 + 3 = 63 (S0 = 8 local tokens, chunk 4),
     * the table's last row; one row fewer and it is outside */
    setup(&c, V_SBHD);
    c.pos.cp_size = 8;
    c.pos.cp_rank = 0;
    ck_assert_int_eq(do_call(&c, 0), OK);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, ROT, ROWS - 1, 10000);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), OK);
    c.cache = tu_track(cache);
    expect_sentence(do_call(&c, 0), RNG,
                    "the implicit positions reach 63, outside the table's [0, 63) "
                    "(seq_len 8, cp_size 8, cp_rank 0)");

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, ROT, ROWS, 0.5);
    expect_sentence(fusedrope_cache_create(&cfg, CPU, &cache), INV,
                    "theta is 0.5 for rope type default; it must be finite and > 1");

    /* dtypes by name, with the shape's order */
    setup(&c, V_SBHD);
    c.y.dtype = FUSEDROPE_FLOAT16;
    expect_sentence(do_call(&c, 0), INV,
                    "x (float32, 8 x 2 x 3 x 20) and y (float16, 8 x 2 x 3 x 20) differ in "
                    "dtype or shape (seq_len x batch x heads x head_dim)");
    setup(&c, V_QK);
    c.kx.dtype = c.ky.dtype = FUSEDROPE_BFLOAT16;
    expect_sentence(do_call(&c, 1), INV,
                    "dq_out (seq_len 8, batch 2, float32) and dk_out (seq_len 8, batch 2, "
                    "bfloat16) must agree in seq_len, batch and dtype");
    setup(&c, V_SBHD);
    c.x.dtype = c.y.dtype = (fusedrope_dtype)3;
    expect_sentence(do_call(&c, 0), INV,
                    "x->dtype is 3, not a fusedrope_dtype (0 float32, 1 float16, 2 bfloat16)");
    setup(&c, V_SBHD);
    c.style = 2;
    expect_sentence(do_call(&c, 0), INV,
                    "style is 2, not a fusedrope_style (0 FUSEDROPE_NEOX, 1 "
                    "FUSEDROPE_INTERLEAVED)");

    /* the same data pointer with other strides: a failed in-place call */
    setup(&c, V_SBHD);
    c.y = c.x;
    c.y.stride_head = D0 + 1;
    c.y.stride_batch = H0 * (D0 + 1);
    c.y.stride_seq = B0 * H0 * (D0 + 1);
    expect_sentence(do_call(&c, 1), INV,
                    "dx has the same data pointer as dy but different strides (dy: seq 120, "
                    "batch 60, head 20; dx: seq 126, batch 63, head 21): not in place; give the "
                    "output the input's strides for in place, or a separate buffer");
    setup(&c, V_SBHD);
    c.y = c.x;
    c.y.data = (float *)c.x.data + 4;
    expect_sentence(do_call(&c, 0), INV,
                    "y may partially overlap x (not provably apart: the test is conservative, "
                    "fusedrope_forward(3)); an output must be the same view as its input (in "
                    "place) or share no memory with any input");
    setup(&c, V_QK);
    c.ky = c.x; /* the same view as the other tensor's input: not in place */
    c.ky.heads = KH0;
    c.ky.head_dim = KD0;
    expect_sentence(do_call(&c, 0), INV,
                    "k_out may overlap q_in (not provably apart: the test is conservative, "
                    "fusedrope_forward(3)); an output must be the same view as its input (in "
                    "place) or share no memory with any input");
    setup(&c, V_SBHD);
    c.y.stride_head = D0 - 1;
    expect_sentence(do_call(&c, 0), INV,
                    "y's elements may overlap each other (strides seq 120, batch 60, head 19 "
                    "with head_dim 20: taken smallest first, each stride of a dimension of more "
                    "than one element must clear what the smaller ones span); the elements of "
                    "an output must not share memory");
    setup(&c, V_QK);
    c.ky = c.y;
    c.ky.heads = KH0;
    c.ky.head_dim = KD0;
    expect_sentence(do_call(&c, 0), INV,
                    "q_out and k_out may overlap (not provably apart: the test is "
                    "conservative, fusedrope_forward(3)); the two outputs must not share "
                    "memory");
    setup(&c, V_SBHD);
    c.pos.ids = (const int64_t *)c.y.data;
    expect_sentence(do_call(&c, 0), INV,
                    "pos->ids may overlap the output y (the test takes the tensor as its "
                    "whole span, fusedrope_forward(3)); the call writes it while reading "
                    "positions, so they must not share memory");

    /* positions */
    setup(&c, V_ODD);
    c.pos.cp_size = 2;
    c.pos.cp_rank = 1;
    expect_sentence(do_call(&c, 1), INV,
                    "dy->seq_len is 7; context parallelism (pos->cp_size 2) needs an even "
                    "local length");
    setup(&c, V_THD);
    c.pos.num_seqs = 0;
    expect_sentence(do_call(&c, 0), INV, "pos->num_seqs is 0; it must be in [1, INT64_MAX)");

    /* the cache module */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DYNAMIC, ROT, ROWS, 10000);
    cfg.factor = 2;
    cfg.original_max_positions = 32;
    cfg.seq_len = -1;
    expect_sentence(fusedrope_cache_create(&cfg, CPU, &cache), INV,
                    "seq_len is -1 for rope type dynamic; it must be >= 0 (0 means "
                    "max_positions)");
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LONGROPE, ROT, ROWS, 10000);
    cfg.original_max_positions = 32;
    cfg.seq_len = -2;
    expect_sentence(fusedrope_cache_create(&cfg, CPU, &cache), INV,
                    "seq_len is -2 for rope type longrope; it must be >= 0 (0 means "
                    "max_positions chooses the factors)");
    /* an empty call (0 heads) is not range-checked, so its batch x seq_len
     * may pass int64; with rows of ids the product is refused, not wrapped */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 32, ROWS, 10000);
    cfg.axes = FUSEDROPE_AXES_SECTIONS;
    cfg.sections[0] = 4, cfg.sections[1] = 6, cfg.sections[2] = 6;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), OK);
    tu_track(cache);
    {
        static int64_t ids3[3];
        static float e[4];
        fusedrope_positions p3;
        fusedrope_tensor te = fusedrope_tensor_bshd(e, FUSEDROPE_FLOAT32, (int64_t)1 << 32,
                                                    (int64_t)1 << 32, 0, 32);
        fusedrope_positions_init(&p3);
        p3.ids = ids3, p3.ids_axes = 3, p3.ids_axis_stride = 1;
        expect_sentence(fusedrope_forward(cache, FUSEDROPE_NEOX, &p3, &te, &te, NULL),
                        FUSEDROPE_ERR_RANGE,
                        "x->batch x x->seq_len (4294967296 x 4294967296) overflows int64: ids "
                        "of that many positions cannot exist");
        /* one row of ids: batch 4 x seq_len 2^62 wraps to 0 in int64, an
         * array that once passed its size check and was then walked for
         * 2^64 tokens (a segfault) */
        te = fusedrope_tensor_bshd(e, FUSEDROPE_FLOAT32, 4, (int64_t)1 << 62, 0, 32);
        for (int axes = 0; axes <= 1; axes++) {
            fusedrope_positions_init(&p3);
            p3.ids = ids3, p3.ids_axes = axes;
            expect_sentence(fusedrope_forward(cache, FUSEDROPE_NEOX, &p3, &te, &te, NULL),
                            FUSEDROPE_ERR_RANGE,
                            "x->batch x x->seq_len (4 x 4611686018427387904) overflows int64: "
                            "ids of that many positions cannot exist");
            expect_sentence(fusedrope_backward_qk(cache, FUSEDROPE_NEOX, &p3, &te, &te, &te,
                                                  &te, NULL),
                            FUSEDROPE_ERR_RANGE,
                            "dq_out->batch x dq_out->seq_len (4 x 4611686018427387904) "
                            "overflows int64: ids of that many positions cannot exist");
        }
    }
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, ROT, 0, 10000);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), OK);
    tu_track(cache);
    {
        float t[ROT / 2];
        expect_sentence(fusedrope_cache_copy_table(cache, t, t), INV,
                        "the cache has no table to copy (max_positions is 0: angles are "
                        "computed at apply time)");
    }
    tu_free_all();
}
END_TEST

static Suite *errors_suite(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("apply");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_error_case, 0, 2 * E_NUM);
    tcase_add_test(tc, test_last_error_thread_local);
    tcase_add_test(tc, test_last_error_names_value);
    tcase_add_test(tc, test_sentences_verbatim);
    tcase_add_test(tc, test_empty_call_positions);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_main(errors_suite(), "test_errors");
}
