/*
 * cpu_norm.h - what the CPU files of the fused RMSNorm + RoPE share:
 * cpu_norm.c (the calls and the portable rows), cpu_norm_avx2.c and
 * cpu_norm_avx512.c (the vector rows, each in a file of its own so that a
 * parallel build compiles them side by side: as one file they were the
 * longest step of every build, bench/RESULTS.md).  The row sums' order, a
 * forward call's and a backward run's descriptions, a token's angles, and
 * the vector rows' entry points.
 */
#ifndef FUSEDROPE_CPU_NORM_H
#define FUSEDROPE_CPU_NORM_H

#include <string.h>

#include "internal.h"
#include "norm_math.h"

/*
 * The row sums' partial sums in norm_math.h's order, with vectors of L
 * floats (L 1: floats): s is an array of 32 / L of them (zeroed by the
 * caller), partial sum l is lane l % L of s[l / L], and it adds the terms
 * of channels l, l + 32, l + 64, ... in that order.  VTERM(c) is the vector
 * of the terms of channels c .. c + L - 1, STERM(c) the term of channel c
 * (for the row's last hd % 32).  Every CPU row sum comes through here
 * (row_dot, nv_sum, n5_sum, nb_dot8, nb5_dot16); the tree over s is the
 * caller's (fr_norm_tree32, nv_tree, n5_tree).  The partials stay in
 * registers (as an array of 32 floats gcc keeps them in memory, and the
 * loop waits on it).
 */
#define FR_ROW_PARTIALS(L, s, n, VTERM, STERM)                                                 \
    do {                                                                                       \
        int64_t c_ = 0;                                                                        \
        for (; c_ + 32 <= (n); c_ += 32)                                                       \
            for (int j_ = 0; j_ < 32 / (L); j_++)                                              \
                (s)[j_] = (s)[j_] + VTERM(c_ + j_ * (L));                                      \
        if (c_ < (n)) {                                                                        \
            float p_[32];                                                                      \
            memcpy(p_, (s), sizeof p_);                                                        \
            for (int l_ = 0; c_ + l_ < (n); l_++)                                              \
                p_[l_] = p_[l_] + STERM(c_ + l_);                                              \
            memcpy((s), p_, sizeof p_);                                                        \
        }                                                                                      \
    } while (0)

/* A forward call's constants, shared by its threads. */
typedef struct {
    const fr_norm_args *na;
    float *scratch;          /* per thread `per` floats, then the weight factors */
    size_t per, es;
    int64_t hdmax, half, heads0, heads, items;
    const float *wf[2];      /* per io slot: the weight factors */
    int stream[2];           /* its output is streamed (fr_streamable) */
    int direct[2];           /* ... by nv_out itself, from the registers (else via `stage`) */
    int wf_ok[2];            /* its weight factors are finite */
    int fin[2];              /* any NaN its vector rows make is the default one (cpu_norm.c) */
    uintptr_t ahead[2];      /* bytes from a row's input to the one prefetched (FWD_AHEAD_BYTES) */
} fwd_call;

/* Rows of floats in a thread's scratch: the vector rows' three in flight
 * (FR_DEFINE_RUN; the portable rows use two of them). */
enum { FWD_V_ROWS = 3 };
_Static_assert(FWD_V_ROWS == 3, "FR_DEFINE_RUN's rows v, v1 and v2 are the scratch's FWD_V_ROWS");

/* The vector rows prefetch the input of the same head of a later token,
 * at least this many bytes of the slot's tokens ahead, with each row's first
 * pass, in calls whose inputs lie past the caches (fr_beyond_cache).  The
 * hardware prefetchers alone left the fused rows ~30% slower than the plain
 * rotation of the same bytes on two threads (bench/RESULTS.md). */
enum { FWD_AHEAD_BYTES = 8192 };

/* A row between its two passes. */
typedef struct {
    const float *cs, *sn; /* its token's angles */
    float *v;             /* its channels as floats */
    const char *x;        /* its input */
    char *y;              /* its output */
    float *rstd;          /* where its rstd goes, or NULL */
    int64_t hd;           /* its head_dim */
    int k;                /* its io slot */
    float sum;            /* its sum of squares */
} fwd_row;

/* A thread's walk over its rows: the next row's token t and head hh, and
 * the token whose angles are in its buffers. */
typedef struct {
    int64_t t, hh, b, s, token;
    float *mine;  /* the thread's scratch */
    char *stage;  /* a streamed row, assembled before fr_stream_row */
} fwd_walk;

/* The rows of one token of one io slot (a run), for the vector rows. */
typedef struct {
    const char *dy, *sv;       /* the run's first row of dy and of the saved tensor */
    char *dx;                  /* ... and of dx */
    int64_t dy_step, sv_step, dx_step; /* bytes from a head's row to the next's */
    const float *rstd;         /* the run's rstd */
    int64_t heads;
    const float *wf, *cs, *sn; /* weight factors, the token's angles */
    float *acc;                /* the run's first head's dw partial of the chunk, or NULL */
    int64_t acc_step;          /* floats from a head's partial to the next's */
    int64_t hd, half;
    float *rows;               /* the thread's scratch: 2 rows of dn and n (4 hd floats) */
} nb_run_args;

/* A thread's forward rows n0..n1-1 (a vector file's function for one
 * rounding mode, dtype and style), and a backward run's. */
typedef void (*fr_norm_rows_fn)(const fwd_call *, fwd_walk *, int64_t, int64_t);
typedef void (*fr_norm_brun_fn)(const nb_run_args *);

/* cos/sin of token (b, s): a 1D table's row, or gathered (position axes:
 * each pair at its axis's position and its frequency column) or computed
 * into row_c/row_s, pair by pair as rope_math.h's fr_pair_cos_sin says. */
static inline void token_angles(const fusedrope_cache *cache, const fr_pos_args *pos,
                                int64_t b, int64_t s, float *row_c, float *row_s,
                                const float **cs, const float **sn)
{
    const int64_t half = cache->rot_dim / 2;
    int64_t pax[FUSEDROPE_MAX_AXES];
    int bad = 0; /* positions are checked on the host */
    pax[0] = fr_token_position(pos, b, s, &bad);
    if (cache->max_positions > 0 && !cache->pair_map) {
        *cs = cache->cos + pax[0] * half;
        *sn = cache->sin + pax[0] * half;
        return;
    }
    for (int a = 1; a < FUSEDROPE_MAX_AXES; a++)
        pax[a] = a < pos->num_axes ? fr_token_axis_position(pos, b, s, a, pax[0], &bad) : pax[0];
    for (int64_t i = 0; i < half; i++) {
        const int32_t e = cache->pair_map ? cache->pair_map[i] : (int32_t)(i << 2);
        fr_pair_cos_sin(cache->max_positions > 0 ? cache->cos : NULL, cache->sin,
                        cache->inv_freq, cache->attention_factor, half, pax[fr_map_axis(e)],
                        fr_map_col(e), &row_c[i], &row_s[i]);
    }
    *cs = row_c;
    *sn = row_s;
}

/* Pass 2 of a forward row on the portable loops, into dst (cpu_norm.c):
 * also the vector rows' way for a row with a NaN or an infinity on the way. */
void fr_norm_out_portable(const fwd_call *fc, const fwd_row *r, float rstd, char *dst);

#ifdef FR_HAVE_AVX2
/* Whether a row's rotation pairs and other channels come in whole vectors:
 * nv_out can then stream it (every store a whole vector at a multiple of 8
 * channels), and the backward's AVX2 rows take it. */
static inline int nt_whole(int64_t hd, int64_t half, int interleaved)
{
    return (interleaved ? (2 * half) % 16 == 0 : half % 8 == 0) && (hd - 2 * half) % 8 == 0;
}

/* cpu_norm_avx2.c: the forward's rows and the backward's runs with AVX2 and
 * F16C, for a call's rounding mode, dtype (0 float32, 1 float16, 2
 * bfloat16), style and (backward) saved tensor. */
fr_norm_rows_fn fr_norm_avx2_rows(int rounding, int dt, int interleaved);
fr_norm_brun_fn fr_norm_avx2_brun(int dt, int interleaved, int saved_y);
#endif

#ifdef FR_HAVE_AVX512
/* Whether a row's rotation pairs and other channels come in whole 16-channel
 * vectors (n5_out's rows). */
static inline int n5_whole(int64_t hd, int64_t half, int interleaved)
{
    return (interleaved ? (2 * half) % 32 == 0 : half % 16 == 0) && (hd - 2 * half) % 16 == 0;
}

/* cpu_norm_avx512.c: the same with AVX-512 F, BW and VL, for calls (the
 * forward) or slots (the backward) whose rows are n5_whole. */
fr_norm_rows_fn fr_norm_avx512_rows(int rounding, int dt, int interleaved);
fr_norm_brun_fn fr_norm_avx512_brun(int dt, int interleaved, int saved_y);
#endif

#endif /* FUSEDROPE_CPU_NORM_H */
