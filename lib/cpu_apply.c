/*
 * cpu_apply.c - the OpenMP backend.  The work is a flat range of
 * (token, head) items split evenly over the threads, so prefill (many tokens)
 * and decode (few tokens, many heads) both use every core; tokens are
 * numbered in the order they lie in memory, so each thread streams through
 * one contiguous range of a dense tensor.  A head's rotated
 * channels are rotated by one float loop over pairs that the compiler
 * vectorises; an iteration reads both elements of its pair before writing
 * either, which makes in place safe.  16-bit heads go through cpu_avx2.c's
 * one-pass rotations where the CPU has AVX2 and F16C, written straight to
 * memory when the output is streamed; elsewhere they are widened to a row
 * of floats, rotated by the float loop and narrowed, interleaved ones
 * reordered to NeoX order on the way (a few simple loops the compiler
 * vectorises run faster than one that converts, rotates and converts:
 * bench/RESULTS.md).
 */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "internal.h"

int fr_beyond_cache_all;

/* Iterations of the pair loops touch disjoint elements even when x == y
 * (in place), so they may run as vectors: tell gcc, which cannot prove it. */
#if defined(__GNUC__) && !defined(__clang__)
#define FR_IVDEP _Pragma("GCC ivdep")
#else
#define FR_IVDEP
#endif


/* Rotates m float pairs by cs[i]/sn[i]: interleaved (x[2i], x[2i+1]), else
 * NeoX (x[i], x[bofs + i]); x may equal y.  Inlined into each caller's
 * clones. */
static inline __attribute__((always_inline)) void rotate_f32_loop(const float *x, float *y,
                                                                 const float *cs, const float *sn,
                                                                 int64_t m, int64_t bofs,
                                                                 int interleaved, float sgn)
{
    if (interleaved) {
        FR_IVDEP for (int64_t i = 0; i < m; i++)
        {
            float a, b;
            fr_rotate(x[2 * i], x[2 * i + 1], cs[i], sn[i], sgn, &a, &b);
            y[2 * i] = a;
            y[2 * i + 1] = b;
        }
    } else {
        FR_IVDEP for (int64_t i = 0; i < m; i++)
        {
            float a, b;
            fr_rotate(x[i], x[bofs + i], cs[i], sn[i], sgn, &a, &b);
            y[i] = a;
            y[bofs + i] = b;
        }
    }
}

FR_CLONES static void rotate_f32(const float *x, float *y, const float *cs, const float *sn,
                                 int64_t m, int64_t bofs, int interleaved, float sgn)
{
    rotate_f32_loop(x, y, cs, sn, m, bofs, interleaved, sgn);
}

/* A float head of `half` pairs whose cos/sin come in steps of 8 pairs (see
 * the steps below): pair i's are c8[i / 8][i % 8] and s8[i / 8][i % 8]. */
FR_CLONES static void rotate_f32_steps(const float *x, float *y, const float *const *c8,
                                       const float *const *s8, int64_t half, int interleaved,
                                       float sgn)
{
    const int64_t w = interleaved ? 16 : 8; /* floats a step of 8 pairs starts after the last */
    int64_t k = 0;
    for (; 8 * k + 8 <= half; k++)
        rotate_f32_loop(x + w * k, y + w * k, c8[k], s8[k], 8, half, interleaved, sgn);
    if (8 * k < half)
        rotate_f32_loop(x + w * k, y + w * k, c8[k], s8[k], half - 8 * k, half, interleaved, sgn);
}

/* The portable row conversions (rope_math.h's converters, vectorised). */
#define DEFINE_ROW(NAME, TIN, TOUT, CONVERT)                                  \
    FR_CLONES static void NAME(const TIN *in, TOUT *out, int64_t n)           \
    {                                                                         \
        FR_IVDEP for (int64_t i = 0; i < n; i++) out[i] = CONVERT(in[i]);     \
    }

DEFINE_ROW(widen_bf16, uint16_t, float, fr_bf16_to_float)
DEFINE_ROW(narrow_bf16, float, uint16_t, fr_float_to_bf16)
DEFINE_ROW(widen_f16, uint16_t, float, fr_half_to_float)
DEFINE_ROW(narrow_f16, float, uint16_t, fr_float_to_half)

/* An interleaved head's 16-bit channels reordered to NeoX order (the pair
 * members a and b apart) and back, so that its floats rotate in the
 * contiguous loop; on 16-bit data, so one pair of loops serves both types. */
FR_CLONES static void split_pairs(const uint16_t *in, uint16_t *out, int64_t half)
{
    FR_IVDEP for (int64_t i = 0; i < half; i++)
    {
        out[i] = in[2 * i];
        out[half + i] = in[2 * i + 1];
    }
}

FR_CLONES static void merge_pairs(const uint16_t *in, uint16_t *out, int64_t half)
{
    FR_IVDEP for (int64_t i = 0; i < half; i++)
    {
        out[2 * i] = in[i];
        out[2 * i + 1] = in[half + i];
    }
}

/* The row operations of a call's 16-bit type, chosen once per call: where
 * the CPU has AVX-512 (F, BW, VL), cpu_avx512.c's one-pass rotations of
 * 16-bit pairs (rotate, rotate_pairs), else where it has AVX2 and F16C,
 * cpu_avx2.c's (the same results, 8 pairs a step); rotate_steps rotates
 * the heads of an axes table straight from per-step table rows, in the same
 * file's width; without AVX2 the portable conversions around rotate_f32
 * (those three NULL). */
typedef struct {
    void (*widen)(const uint16_t *, float *, int64_t);
    void (*narrow)(const float *, uint16_t *, int64_t);
    void (*rotate)(const uint16_t *, const uint16_t *, uint16_t *, uint16_t *, const float *,
                   const float *, int64_t, float, int);
    void (*rotate_pairs)(const uint16_t *, uint16_t *, const float *, const float *, int64_t,
                         float, int);
    void (*rotate_steps)(const uint16_t *, uint16_t *, int64_t, int, const float *const *,
                         const float *const *, float, int);
    /* a token's run of heads at once (cpu_avx512.c, halves it fits; else NULL) */
    void (*rotate_heads)(const uint16_t *, int64_t, uint16_t *, int64_t, int64_t, int64_t, int,
                         const float *const *, const float *const *, float, int);
} row_conv;

static row_conv pick_rows(fusedrope_dtype dt, int64_t half)
{
    const int f16 = dt == FUSEDROPE_FLOAT16;
    row_conv r = { f16 ? widen_f16 : widen_bf16, f16 ? narrow_f16 : narrow_bf16, NULL, NULL, NULL,
                   NULL };
#ifdef FR_HAVE_AVX2
    if (fr_avx2_usable()) {
        r.rotate = f16 ? fr_avx2_rotate_f16 : fr_avx2_rotate_bf16;
        r.rotate_pairs = f16 ? fr_avx2_rotate_pairs_f16 : fr_avx2_rotate_pairs_bf16;
        r.rotate_steps = f16 ? fr_avx2_rotate_steps_f16 : fr_avx2_rotate_steps_bf16;
    }
#endif
#ifdef FR_HAVE_AVX512
    if (fr_avx512_usable()) { /* off with fr_avx2_off too */
        r.rotate = f16 ? fr_avx512_rotate_f16 : fr_avx512_rotate_bf16;
        r.rotate_pairs = f16 ? fr_avx512_rotate_pairs_f16 : fr_avx512_rotate_pairs_bf16;
        r.rotate_steps = f16 ? fr_avx512_rotate_steps_f16 : fr_avx512_rotate_steps_bf16;
        if (fr_avx512_heads_fit(half))
            r.rotate_heads = f16 ? fr_avx512_rotate_heads_f16 : fr_avx512_rotate_heads_bf16;
    }
#else
    (void)half; /* only the AVX-512 heads' fit depends on it */
#endif
    return r;
}

/*
 * Every OpenMP thread, the caller's included, holds its scratch on its own
 * stack, whose size the embedding program chooses (OMP_STACKSIZE, its
 * threads' attributes): the deepest frame chain of the parallel region stays
 * under 16 KiB (man/fusedrope_forward.3, NOTES), whatever rot_dim and
 * head_dim are.  Hence scratch rows of bounded length, larger heads going
 * through them piece by piece:
 *   ROW_PAIRS: a 16-bit head on the portable path is converted and rotated
 *     this many pairs at a time (1.5 KiB of rows);
 *   ANGLE_PAIRS: a table-less cache's angles are computed this many pairs
 *     at a time (2 KiB), once per token for every head of it the thread has;
 *   STREAM_ROW_BYTES: the largest head assembled in a row buffer (8 KiB)
 *     before its non-temporal store.
 */
enum {
    ROW_PAIRS = 128,
    ANGLE_PAIRS = 256,
    STREAM_ROW_BYTES = 8192,      /* heads streamed without cpu_avx2.c: up to this */
    STREAM_DIRECT_BYTES = 16384   /* heads streamed straight from cpu_avx2.c: up to this */
};

/* cos/sin of pairs [i0, i0 + m) of a token whose position on axis a is
 * pax[a]: pair j takes the table's entry (or the angle, table-less) at the
 * position of its axis and its frequency column (rope_math.h's map entry;
 * axis 0 and column j without axes). */
static void token_angles(const fusedrope_cache *cache, const int64_t *pax, int64_t i0,
                         int64_t m, float *c, float *s)
{
    const int64_t half = cache->rot_dim / 2;
    if (cache->cos && cache->pair_map) {
        /* A table: four pairs on one axis with consecutive columns (map
         * entries 4 apart: inside a section) are four adjacent floats of
         * that axis's row, copied as one vector; other pairs (INTERLEAVED's
         * T H W T H W ...) are gathered one by one, each axis's row offset
         * computed once.  The same values either way; callgrind counts in
         * bench/RESULTS.md. */
        const int32_t *map = cache->pair_map + i0;
        const float *tc = cache->cos, *ts = cache->sin;
        int64_t row[FUSEDROPE_MAX_AXES], i = 0;
        for (int a = 0; a < FUSEDROPE_MAX_AXES; a++)
            row[a] = pax[a] * half;
#ifdef __SSE2__
        for (; i + 4 <= m; i += 4) {
            const int32_t e = map[i];
            const __m128i want = _mm_add_epi32(_mm_set1_epi32(e), _mm_setr_epi32(0, 4, 8, 12));
            if (_mm_movemask_epi8(_mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(map + i)),
                                                  want)) == 0xffff) {
                const int64_t at = row[fr_map_axis(e)] + fr_map_col(e);
                _mm_storeu_ps(c + i, _mm_loadu_ps(tc + at));
                _mm_storeu_ps(s + i, _mm_loadu_ps(ts + at));
                continue;
            }
            for (int64_t k = i; k < i + 4; k++) {
                const int64_t at = row[fr_map_axis(map[k])] + fr_map_col(map[k]);
                c[k] = tc[at];
                s[k] = ts[at];
            }
        }
#endif
        for (; i < m; i++) {
            const int64_t at = row[fr_map_axis(map[i])] + fr_map_col(map[i]);
            c[i] = tc[at];
            s[i] = ts[at];
        }
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        const int32_t e = cache->pair_map ? cache->pair_map[i0 + i] : (int32_t)((i0 + i) << 2);
        fr_pair_cos_sin(cache->cos, cache->sin, cache->inv_freq, cache->attention_factor, half,
                        pax[fr_map_axis(e)], fr_map_col(e), &c[i], &s[i]);
    }
}

/* Rotates pairs [i0, i0 + m) of one head whose pairs are `half` apart (NeoX)
 * or adjacent (interleaved); cs[j]/sn[j] belong to pair i0 + j.  rc: the
 * 16-bit type's row operations, NULL for float32; tmp: 2 * ROW_PAIRS floats,
 * tmp16: 2 * ROW_PAIRS 16-bit values of scratch.  nt_stores: y is streamed
 * (non-temporal stores; only with cpu_avx2.c's rotations). */
static void rotate_head(const row_conv *rc, const void *x, void *y, const float *cs,
                        const float *sn, int64_t half, int64_t i0, int64_t m, int interleaved,
                        float sgn, int nt_stores, float *tmp, uint16_t *tmp16)
{
    const uint16_t *x16 = x;
    uint16_t *y16 = y;

    if (rc == NULL) {
        const int64_t o = interleaved ? 2 * i0 : i0;
        rotate_f32((const float *)x + o, (float *)y + o, cs, sn, m, half, interleaved, sgn);
        return;
    }
    if (rc->rotate != NULL) {
        if (interleaved)
            rc->rotate_pairs(x16 + 2 * i0, y16 + 2 * i0, cs, sn, m, sgn, nt_stores);
        else
            rc->rotate(x16 + i0, x16 + half + i0, y16 + i0, y16 + half + i0, cs, sn, m, sgn,
                       nt_stores);
        return;
    }
    /* pairs [i, i + k): tmp holds their a values, then their b values, as
     * floats; an interleaved piece is put in NeoX order in tmp16 first */
    for (int64_t j = 0; j < m; j += ROW_PAIRS) {
        const int64_t i = i0 + j, k = m - j < ROW_PAIRS ? m - j : ROW_PAIRS;
        if (interleaved) {
            split_pairs(x16 + 2 * i, tmp16, k);
            rc->widen(tmp16, tmp, 2 * k);
        } else {
            rc->widen(x16 + i, tmp, k);
            rc->widen(x16 + half + i, tmp + k, k);
        }
        rotate_f32(tmp, tmp, cs + j, sn + j, k, k, 0, sgn);
        if (interleaved) {
            rc->narrow(tmp, tmp16, 2 * k);
            merge_pairs(tmp16, y16 + 2 * i, k);
        } else {
            rc->narrow(tmp, y16 + i, k);
            rc->narrow(tmp + k, y16 + half + i, k);
        }
    }
}

/* A whole head (pairs [0, half)): rotate_head, with its AVX2 case called
 * straight, since per head of 128 channels going through rotate_head cost
 * 0.37 instructions per element (bench/RESULTS.md, "CPU roofline"). */
static inline void rotate_whole_head(const row_conv *rc, const void *x, void *y, const float *cs,
                                     const float *sn, int64_t half, int interleaved, float sgn,
                                     int nt_stores, float *tmp, uint16_t *tmp16)
{
    if (rc != NULL && rc->rotate != NULL) {
        const uint16_t *x16 = x;
        uint16_t *y16 = y;
        if (interleaved)
            rc->rotate_pairs(x16, y16, cs, sn, half, sgn, nt_stores);
        else
            rc->rotate(x16, x16 + half, y16, y16 + half, cs, sn, half, sgn, nt_stores);
        return;
    }
    rotate_head(rc, x, y, cs, sn, half, 0, half, interleaved, sgn, nt_stores, tmp, tmp16);
}


/*
 * An axes table's pairs in steps of 8 (the AVX2 rotation's step; the
 * AVX-512 one takes two steps a vector): a step
 * whose pairs are on one axis with consecutive columns (inside a SECTIONS
 * run, a VISION_2D half) is rotated straight from that axis's table row,
 * its cos/sin never copied; other steps (INTERLEAVED's T H W T H W ...,
 * a step across a section boundary) are gathered into row_c/row_s.
 * Gathering every step cost a bf16 prefill +20% wall time for +4%
 * instructions: the rotation read back at once what the gather had just
 * stored (bench/RESULTS.md, "Position axes").  Only for heads of at most
 * ANGLE_PAIRS pairs (the pointers' stack rows); others gather.
 */
enum { STEP_MAX = ANGLE_PAIRS / 8 };

/* Each step's axis and first column into axis[]/col[] (axis -1: gathered);
 * 1 when some step is read in place, else 0 (the plain gather then). */
static int plan_steps(const fusedrope_cache *cache, int axis[STEP_MAX], int64_t col[STEP_MAX])
{
    const int64_t half = cache->rot_dim / 2;
    const int32_t *map = cache->pair_map;
    int any = 0;

    if (map == NULL || cache->cos == NULL || half > ANGLE_PAIRS)
        return 0;
    for (int64_t k = 0; 8 * k < half; k++) {
        const int64_t i0 = 8 * k, m = half - i0 < 8 ? half - i0 : 8;
        int64_t j = 1;
        while (j < m && map[i0 + j] == map[i0] + 4 * (int32_t)j) /* same axis, next columns */
            j++;
        axis[k] = j == m ? fr_map_axis(map[i0]) : -1;
        col[k] = fr_map_col(map[i0]);
        any |= j == m;
    }
    return any;
}

/* A whole head whose cos/sin come in steps (c8/s8 as rotate_f32_steps). */
static inline void rotate_steps(const row_conv *rc, const void *x, void *y,
                                const float *const *c8, const float *const *s8, int64_t half,
                                int interleaved, float sgn, int nt_stores, float *tmp,
                                uint16_t *tmp16)
{
    if (rc == NULL) {
        rotate_f32_steps(x, y, c8, s8, half, interleaved, sgn);
        return;
    }
    if (rc->rotate_steps != NULL) {
        rc->rotate_steps(x, y, half, interleaved, c8, s8, sgn, nt_stores);
        return;
    }
    for (int64_t k = 0; 8 * k < half; k++)
        rotate_head(rc, x, y, c8[k], s8[k], half, 8 * k, half - 8 * k < 8 ? half - 8 * k : 8,
                    interleaved, sgn, nt_stores, tmp, tmp16);
}


/*
 * Table rows read ahead.  With explicit ids a token's rows lie anywhere in
 * the table, and with axes each token reads a row on each axis: the first
 * head of a token waited for them (on one thread an axes prefill took 1.6x
 * the time of the 1D call, bench/RESULTS.md, "Position axes").  While a
 * token is rotated the next token's rows are prefetched, the columns
 * [lo[a], hi[a]) of each axis a's row (all of a 1D row).  Positions in
 * sequence need none of this: the hardware prefetchers follow them.
 */
typedef struct {
    int on;
    int64_t lo[FUSEDROPE_MAX_AXES], hi[FUSEDROPE_MAX_AXES];
} row_span;

static void plan_read_ahead(const fusedrope_cache *cache, const fr_pos_args *pos, row_span *sp)
{
    const int64_t half = cache->rot_dim / 2;
    sp->on = cache->cos != NULL && pos->ids != NULL && half > 0;
    for (int a = 0; a < FUSEDROPE_MAX_AXES; a++) {
        sp->lo[a] = cache->pair_map ? half : 0;
        sp->hi[a] = cache->pair_map || a > 0 ? 0 : half;
    }
    for (int64_t i = 0; cache->pair_map && i < half; i++) {
        const int a = fr_map_axis(cache->pair_map[i]);
        const int64_t c = fr_map_col(cache->pair_map[i]);
        sp->lo[a] = c < sp->lo[a] ? c : sp->lo[a];
        sp->hi[a] = c + 1 > sp->hi[a] ? c + 1 : sp->hi[a];
    }
}

static inline void read_ahead(const fusedrope_cache *cache, const row_span *sp,
                              const int64_t *pax)
{
#if defined(__GNUC__)
    const int64_t half = cache->rot_dim / 2;
    for (int a = 0; a < FUSEDROPE_MAX_AXES; a++) {
        const float *c = cache->cos + pax[a] * half, *s = cache->sin + pax[a] * half;
        if (sp->hi[a] <= sp->lo[a])
            continue;
        /* every 64-byte line of the span: a step of 16 floats, and its end */
        for (int64_t j = sp->lo[a]; j < sp->hi[a]; j += 16) {
            __builtin_prefetch(c + j);
            __builtin_prefetch(s + j);
        }
        __builtin_prefetch(c + sp->hi[a] - 1);
        __builtin_prefetch(s + sp->hi[a] - 1);
    }
#else
    (void)cache;
    (void)sp;
    (void)pax;
#endif
}

/* Token t's batch entry and position in its sequence, in the walk's order
 * (cpu_share), and its position on each axis. */
static inline void token_pax(const fr_apply_args *args, int s_outer, int64_t t, int64_t *b,
                             int64_t *s, int64_t pax[FUSEDROPE_MAX_AXES])
{
    int bad = 0; /* positions were checked before the call (apply.c) */
    if (s_outer) {
        *s = t / args->batch;
        *b = t % args->batch;
    } else {
        *b = t / args->seq_len;
        *s = t % args->seq_len;
    }
    pax[0] = fr_token_position(&args->pos, *b, *s, &bad);
    for (int a = 1; a < args->pos.num_axes; a++)
        pax[a] = fr_token_axis_position(&args->pos, *b, *s, a, pax[0], &bad);
}

#ifdef FR_HAVE_AVX512
/* Whether an axes table's map has fr_gather_plan's form (and the plan):
 * within each 16-pair step, each axis's lanes on consecutive columns, none
 * before its row's start. */
static int gather_plan_init(const fusedrope_cache *cache, fr_gather_plan *g)
{
    const int64_t half = cache->rot_dim / 2;
    if (cache->cos == NULL || cache->pair_map == NULL || half > 16 * 16 || half > ANGLE_PAIRS)
        return 0;
    memset(g, 0, sizeof *g);
    g->nsteps = (int)((half + 15) / 16);
    for (int64_t i = 0; i < half; i++) {
        const int k = (int)(i / 16), lane = (int)(i % 16), a = fr_map_axis(cache->pair_map[i]);
        const int64_t base = fr_map_col(cache->pair_map[i]) - lane;
        if (base < 0 || (g->mask[k][a] && g->base[k][a] != base))
            return 0;
        g->mask[k][a] |= (uint16_t)(1u << lane);
        g->base[k][a] = (int32_t)base;
    }
    return 1;
}
#endif

/* One thread's share of a call's (token, head) items: all of them on the
 * calling thread, or the thread's slice inside a team. */
static void cpu_share(const fr_apply_args *args, const row_conv *rc, const int stream[2],
                      const int direct[2], int steps, const int *step_axis,
                      const int64_t *step_col, const void *gp)
{
    const fusedrope_cache *cache = args->cache;
    const int64_t half = cache->rot_dim / 2;
    const size_t es = fr_dtype_size(args->dtype);
    const int64_t heads0 = args->io[0].heads;
    const int64_t heads = heads0 + (args->count > 1 ? args->io[1].heads : 0);
    const int64_t items = args->seq_len * args->batch * heads;
    /* Tokens are walked in the order they lie in memory: sbhd's batch
     * entries inside each position (its threads then stream through
     * contiguous memory, not through a token's few KiB every seq stride;
     * bench/RESULTS.md, "CPU roofline"), bshd's positions inside each entry. */
    const int s_outer = args->batch > 1 && args->io[0].in_sb < args->io[0].in_ss;
#ifndef FR_HAVE_AVX512
    (void)gp; /* the AVX-512 gather's plan: never one without it */
#endif
    /* a 1D table's row is used in place, an axes table's rows in place
     * step by step (steps); otherwise each token's cos/sin are gathered per
     * pair (other axes maps) or computed (no table) into row_c/row_s */
    const int gather = !steps && (cache->max_positions == 0 || cache->pair_map != NULL);

    (void)direct; /* read only where there is SSE2, as on every CPU with AVX2 */
    {
        int threads = 1, id = 0;
        int64_t n0, n1;
        int64_t pax[FUSEDROPE_MAX_AXES] = { 0, 0, 0, 0 }; /* the token's position per axis */
        /* the next token's, found when its rows are read ahead */
        int64_t pax_next[FUSEDROPE_MAX_AXES] = { 0, 0, 0, 0 }, t_next = -1, b_next = 0,
                s_next = 0;
        row_span ahead;
        const float *cs = NULL, *sn = NULL;
        /* with steps: each step's cos/sin; with rotate_heads and a 1D row,
         * the row's steps */
        const float *c8[STEP_MAX], *s8[STEP_MAX];
        /* Gathered or computed: this token's cos/sin (ANGLE_PAIRS of them at a time). */
        _Alignas(64) float row_c[ANGLE_PAIRS];
        _Alignas(64) float row_s[ANGLE_PAIRS];
        _Alignas(16) char row[STREAM_ROW_BYTES];
        float frow[2 * ROW_PAIRS];    /* a 16-bit head's channels as floats */
        uint16_t hrow[2 * ROW_PAIRS]; /* an interleaved one's, in NeoX order */
        fr_fpenv fpenv; /* this thread's, restored at the end (internal.h) */
        fr_fpenv_enter(&fpenv);
#ifdef _OPENMP
        threads = omp_get_num_threads();
        id = omp_get_thread_num();
#endif
        fr_thread_share(items, threads, id, &n0, &n1);
        plan_read_ahead(cache, &args->pos, &ahead);

        /* Items n0..n1-1, one token's run of heads [hh, hh + run) at a time:
         * the token's position and cos/sin once per run, each tensor's head
         * pointers stepped by its head stride. */
        for (int64_t n = n0; n < n1;) {
            const int64_t t = n / heads, hh = n % heads;
            const int64_t run = n1 - n < heads - hh ? n1 - n : heads - hh;
            int64_t b, s;

            if (t == t_next) { /* found when its rows were read ahead */
                b = b_next;
                s = s_next;
                memcpy(pax, pax_next, sizeof pax);
            } else {
                token_pax(args, s_outer, t, &b, &s, pax);
            }
            n += run;
            if (ahead.on && n < n1) {
                t_next = t + 1;
                token_pax(args, s_outer, t_next, &b_next, &s_next, pax_next);
                read_ahead(cache, &ahead, pax_next);
            }
            if (steps) {
                for (int64_t k = 0; 8 * k < half; k++) {
                    if (step_axis[k] >= 0) {
                        const int64_t at = pax[step_axis[k]] * half + step_col[k];
                        c8[k] = cache->cos + at;
                        s8[k] = cache->sin + at;
                    } else {
                        token_angles(cache, pax, 8 * k, half - 8 * k < 8 ? half - 8 * k : 8,
                                     row_c + 8 * k, row_s + 8 * k);
                        c8[k] = row_c + 8 * k;
                        s8[k] = row_s + 8 * k;
                    }
                }
            } else if (!gather) {
                cs = cache->cos + pax[0] * half;
                sn = cache->sin + pax[0] * half;
            } else if (half <= ANGLE_PAIRS) {
#ifdef FR_HAVE_AVX512
                if (gp != NULL) /* gp: the map's vector gather (fr_avx512_gather) */
                    fr_avx512_gather(gp, cache->cos, cache->sin, pax, half, row_c, row_s);
                else
#endif
                    token_angles(cache, pax, 0, half, row_c, row_s);
                cs = row_c;
                sn = row_s;
            } else {
                /* A table-less cache with more angles than row_c holds: the
                 * run's heads are rotated ANGLE_PAIRS pairs at a time, each
                 * piece's angles computed once for all of them; plain stores. */
                for (int64_t i0 = 0; i0 < half; i0 += ANGLE_PAIRS) {
                    const int64_t m = half - i0 < ANGLE_PAIRS ? half - i0 : ANGLE_PAIRS;
                    token_angles(cache, pax, i0, m, row_c, row_s);
                    for (int64_t j = hh; j < hh + run; j++) {
                        const int kj = j >= heads0;
                        const fr_io *ioj = &args->io[kj];
                        const int64_t hj = j - (kj ? heads0 : 0);
                        const size_t o =
                            (size_t)(s * ioj->in_ss + b * ioj->in_sb + hj * ioj->in_sh) * es;
                        const size_t oo =
                            (size_t)(s * ioj->out_ss + b * ioj->out_sb + hj * ioj->out_sh) * es;
                        rotate_head(rc, (const char *)ioj->in + o, (char *)ioj->out + oo, row_c,
                                    row_s, half, i0, m, args->interleaved, args->sgn, 0, frow,
                                    hrow);
                    }
                }
                for (int64_t j = hh; j < hh + run; j++) {
                    const int kj = j >= heads0;
                    const fr_io *ioj = &args->io[kj];
                    const int64_t hj = j - (kj ? heads0 : 0);
                    const size_t rot = (size_t)cache->rot_dim * es;
                    if (!ioj->in_place && ioj->head_dim > cache->rot_dim)
                        memcpy((char *)ioj->out +
                                   (size_t)(s * ioj->out_ss + b * ioj->out_sb + hj * ioj->out_sh) *
                                       es + rot,
                               (const char *)ioj->in +
                                   (size_t)(s * ioj->in_ss + b * ioj->in_sb + hj * ioj->in_sh) *
                                       es + rot,
                               (size_t)(ioj->head_dim - cache->rot_dim) * es);
                }
                continue;
            }
            if (rc != NULL && rc->rotate_heads != NULL && !steps)
                for (int64_t k = 0; 8 * k < half; k++) {
                    c8[k] = cs + 8 * k;
                    s8[k] = sn + 8 * k;
                }
            /* each tensor's share of the run: its heads [h0, h1) */
            for (int k = 0; k < args->count; k++) {
                const fr_io *io = &args->io[k];
                const int64_t lo = k ? heads0 : 0;
                const int64_t h0 = hh > lo ? hh - lo : 0;
                const int64_t h1 = hh + run - lo < io->heads ? hh + run - lo : io->heads;
                const size_t rot = (size_t)cache->rot_dim * es;
                const size_t pass = (size_t)(io->head_dim - cache->rot_dim) * es;
                const size_t xstep = (size_t)io->in_sh * es, ystep = (size_t)io->out_sh * es;
                const char *x;
                char *y;

                if (h0 >= h1)
                    continue;
                x = (const char *)io->in + (size_t)(s * io->in_ss + b * io->in_sb + h0 * io->in_sh) * es;
                y = (char *)io->out + (size_t)(s * io->out_ss + b * io->out_sb + h0 * io->out_sh) * es;
#ifdef __SSE2__
                if (rc != NULL && rc->rotate_heads != NULL && (direct[k] || !stream[k])) {
                    /* the run's heads in one call, streamed (direct) or plain */
                    rc->rotate_heads((const uint16_t *)x, io->in_sh, (uint16_t *)y, io->out_sh,
                                     h1 - h0, half, args->interleaved, c8, s8, args->sgn,
                                     direct[k]);
                    for (int64_t h = h0; pass && h < h1; h++, x += xstep, y += ystep) {
                        if (direct[k])
                            fr_stream_row(y + rot, x + rot, pass);
                        else if (!io->in_place)
                            memcpy(y + rot, x + rot, pass);
                    }
                    continue;
                }
                if (direct[k]) {
                    /* direct[k]: rc->rotate is there (rotate_whole_head's
                     * AVX2 case without its test, 5 instructions a head) */
                    for (int64_t h = h0; h < h1; h++, x += xstep, y += ystep) {
                        const uint16_t *x16 = (const uint16_t *)x;
                        uint16_t *y16 = (uint16_t *)y;
                        if (steps)
                            rc->rotate_steps(x16, y16, half, args->interleaved, c8, s8,
                                             args->sgn, 1);
                        else if (args->interleaved)
                            rc->rotate_pairs(x16, y16, cs, sn, half, args->sgn, 1);
                        else
                            rc->rotate(x16, x16 + half, y16, y16 + half, cs, sn, half, args->sgn,
                                       1);
                        if (pass)
                            fr_stream_row(y + rot, x + rot, pass);
                    }
                    continue;
                }
#endif
                for (int64_t h = h0; h < h1; h++, x += xstep, y += ystep) {
                    /* A streamed head is assembled in `row`, then written past the cache. */
                    char *dst = stream[k] ? row : y;
                    if (steps)
                        rotate_steps(rc, x, dst, c8, s8, half, args->interleaved, args->sgn, 0,
                                     frow, hrow);
                    else
                        rotate_whole_head(rc, x, dst, cs, sn, half, args->interleaved, args->sgn,
                                          0, frow, hrow);
                    if (!io->in_place && pass)
                        memcpy(dst + rot, x + rot, pass);
#ifdef __SSE2__
                    if (stream[k])
                        fr_stream_row(y, row, (size_t)io->head_dim * es);
#endif
                }
            }
        }
        FR_STREAM_FENCE();
        fr_fpenv_leave(&fpenv);
    }
}

void fr_cpu_apply(const fr_apply_args *args)
{
    const fusedrope_cache *cache = args->cache;
    const int64_t half = cache->rot_dim / 2;
    const size_t es = fr_dtype_size(args->dtype);
    const int64_t tokens = args->seq_len * args->batch;
    int64_t elems = 0;
    int stream[2] = { 0, 0 }, direct[2] = { 0, 0 };
    const row_conv rows = pick_rows(args->dtype, cache->rot_dim / 2);
    const row_conv *rc = args->dtype == FUSEDROPE_FLOAT32 ? NULL : &rows;
    int step_axis[STEP_MAX];
    int64_t step_col[STEP_MAX];
#ifdef FR_HAVE_AVX512
    /* With AVX-512 a map that has the vector gather's form takes it rather
     * than the steps: the gathered row, read back whole, cost a bf16
     * SECTIONS prefill on one thread -4% against 1D, the steps +38%
     * (bench/RESULTS.md, "Position axes") */
    fr_gather_plan gplan;
    const fr_gather_plan *gp = fr_avx512_usable() && gather_plan_init(cache, &gplan) ? &gplan
                                                                                   : NULL;
#else
    const void *gp = NULL;
#endif
    const int steps = gp != NULL ? 0 : plan_steps(cache, step_axis, step_col);

    for (int k = 0; k < args->count; k++) {
        elems += tokens * args->io[k].heads * args->io[k].head_dim;
        /* a streamed head goes from the AVX2 rotations straight to memory,
         * without the row buffer, when its stores fall on 16 bytes: both
         * halves of a NeoX head, the pass-through channels of either style;
         * others through the row buffer, if they fit */
        direct[k] = rc != NULL && rc->rotate != NULL &&
                    ((size_t)(args->interleaved ? cache->rot_dim : half) * es) % 16 == 0 &&
                    fr_streamable(&args->io[k], es, tokens, STREAM_DIRECT_BYTES);
        stream[k] = direct[k] || fr_streamable(&args->io[k], es, tokens, STREAM_ROW_BYTES);
    }

    {
        /* Small calls run on the calling thread (fr_cpu_needs_team); larger
         * ones use the cache's bound, or the OpenMP default. */
        const int nthreads = fr_cpu_team_size(cache, elems);
#ifdef _OPENMP
        if (fr_cpu_needs_team(nthreads)) {
            fr_fpenv outer; /* the team's start (cpu_team.c) */
            fr_fpenv_enter(&outer);
#pragma omp parallel num_threads(nthreads)
            {
                cpu_share(args, rc, stream, direct, steps, step_axis, step_col, gp);
                if (omp_get_thread_num() == 0)
                    fr_cpu_team = omp_get_num_threads();
            }
            fr_fpenv_leave(&outer);
            return;
        }
#else
        (void)nthreads; /* 1 */
#endif
    }
    fr_cpu_team = 0;
    cpu_share(args, rc, stream, direct, steps, step_axis, step_col, gp);
}
