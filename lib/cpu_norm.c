/*
 * cpu_norm.c - the OpenMP backend of the fused RMSNorm + RoPE
 * (fusedrope_norm_forward_qk(3)).  A row is one (token, head) of head_dim
 * channels; it is widened to floats in per-thread scratch, reduced in
 * norm_math.h's order (32 partial sums and a tree, which the CUDA kernels
 * follow), turned into the rotation's input as the rounding mode says,
 * rotated with rope_math.h's fr_rotate and narrowed once.  Every loop is a
 * simple one over floats the compiler vectorises; where the CPU has AVX2
 * and F16C the forward's rows instead take two intrinsic passes (nv_*,
 * cpu_norm_avx2.c; with AVX-512 F/BW/VL 16 channels a step, n5_*,
 * cpu_norm_avx512.c), and the backward's rows of whole vectors three
 * (nb_pass_a, the dot, nb_pass_b; nb5_* with AVX-512), the same bits.
 *
 * The forward splits the (token, head) rows evenly over the threads.  The
 * backward works in chunks of FUSEDROPE_NORM_DW_CHUNK tokens: each head's
 * rows of a chunk add g * n in token order into the head's partial (a
 * thread's scratch), the chunk's partial is its heads' partials added in
 * head order, and the chunks' partials are summed in chunk order
 * afterwards, so dw has the same bits for any thread count (and the CUDA
 * kernels', which use the same chunks and orders).
 */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "cpu_norm.h"

/* ------------------------------------------------------------- row loops */

FR_CLONES static void widen(const void *x, fusedrope_dtype dt, float *f, int64_t n)
{
    if (dt == FUSEDROPE_FLOAT32) {
        memcpy(f, x, (size_t)n * sizeof(float));
    } else if (dt == FUSEDROPE_FLOAT16) {
        const uint16_t *h = x;
        for (int64_t i = 0; i < n; i++)
            f[i] = fr_half_to_float(h[i]);
    } else {
        const uint16_t *h = x;
        for (int64_t i = 0; i < n; i++)
            f[i] = fr_bf16_to_float(h[i]);
    }
}

FR_CLONES static void narrow(const float *f, void *y, fusedrope_dtype dt, int64_t n)
{
    if (dt == FUSEDROPE_FLOAT32) {
        memmove(y, f, (size_t)n * sizeof(float));
    } else if (dt == FUSEDROPE_FLOAT16) {
        uint16_t *h = y;
        for (int64_t i = 0; i < n; i++)
            h[i] = fr_float_to_half(f[i]);
    } else {
        uint16_t *h = y;
        for (int64_t i = 0; i < n; i++)
            h[i] = fr_float_to_bf16(f[i]);
    }
}

/* Sum of a[c] * b[c] over n channels in norm_math.h's order. */
#if defined(__GNUC__)
typedef float v8f __attribute__((vector_size(32)));
/* 8 floats at p (unaligned) as a v8f. */
#define V8F_LOAD(p) ({ v8f r_; memcpy(&r_, (p), sizeof r_); r_; })

FR_CLONES static float row_dot(const float *a, const float *b, int64_t n)
{
    v8f s[4] = { { 0 } };
    float p[32];
#define ROW_DOT_V(c) (V8F_LOAD(a + (c)) * V8F_LOAD(b + (c)))
#define ROW_DOT_S(c) (a[c] * b[c])
    FR_ROW_PARTIALS(8, s, n, ROW_DOT_V, ROW_DOT_S);
    memcpy(p, s, sizeof p);
    return fr_norm_tree32(p);
}
#else
static float row_dot(const float *a, const float *b, int64_t n)
{
    float p[32] = { 0 };
#define ROW_DOT_S(c) (a[c] * b[c])
    FR_ROW_PARTIALS(1, p, n, ROW_DOT_S, ROW_DOT_S);
    return fr_norm_tree32(p);
}
#endif
#undef ROW_DOT_V
#undef ROW_DOT_S

/* v[c] = the rotation's input of channel c (in place over the widened x). */
FR_CLONES static void row_values(float *v, const float *wf, float rstd, int rounding, int dt,
                                 int64_t n)
{
    switch (rounding * 3 + dt) {
#define CASE(R, D)                                              \
    case R * 3 + D:                                             \
        for (int64_t c = 0; c < n; c++)                         \
            v[c] = fr_norm_value(v[c], rstd, wf[c], R, D);      \
        break;
    CASE(0, 0) CASE(0, 1) CASE(0, 2)
    CASE(1, 0) CASE(1, 1) CASE(1, 2)
    CASE(2, 0) CASE(2, 1) CASE(2, 2)
#undef CASE
    }
}

/* The rot_dim leading channels of a float row rotated in place by the
 * token's cos/sin (sgn +1 forward, -1 the transpose). */
FR_CLONES static void row_rotate(float *v, const float *cs, const float *sn, int64_t half,
                                 int interleaved, float sgn)
{
    if (interleaved) {
        for (int64_t i = 0; i < half; i++) {
            float a, b;
            fr_rotate(v[2 * i], v[2 * i + 1], cs[i], sn[i], sgn, &a, &b);
            v[2 * i] = a;
            v[2 * i + 1] = b;
        }
    } else {
        for (int64_t i = 0; i < half; i++) {
            float a, b;
            fr_rotate(v[i], v[half + i], cs[i], sn[i], sgn, &a, &b);
            v[i] = a;
            v[half + i] = b;
        }
    }
}

/* wf[c] = w' of channel c for a weight array of dtype wdt (or 1). */
static void weight_factors(const fr_norm_args *na, int slot, int64_t hd, float *wf)
{
    if (na->weight == FUSEDROPE_NORM_WEIGHT_NONE) {
        for (int64_t c = 0; c < hd; c++)
            wf[c] = 1.0f;
        return;
    }
    widen(na->w[slot], na->wdtype, wf, hd);
    for (int64_t c = 0; c < hd; c++)
        wf[c] = fr_norm_wf(na->weight, wf[c]);
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int thread_count(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* Large outputs are streamed (internal.h, fr_streamable): the norm's rows
 * are assembled in L1, then written past the cache. */

/* ----------------------------------------------------------------- forward */

/* The next row's addresses and angles into r (prev: the row before it, whose
 * angles r shares when of the same token); the walk moves on a row. */
static inline __attribute__((always_inline)) void fwd_begin(const fwd_call *fc, fwd_walk *w, int64_t n, fwd_row *r,
                             const fwd_row *prev)
{
    const fr_apply_args *a = &fc->na->a;
    const int k = w->hh >= fc->heads0;
    const fr_io *io = &a->io[k];
    const int64_t h = w->hh - (k ? fc->heads0 : 0);
    if (w->t != w->token) {
        /* token t's angles in buffer t % 2: row n - 1 is of token t - 1 or
         * t, whose buffer stays */
        float *row_c = w->mine + FWD_V_ROWS * fc->hdmax + (w->t & 1) * a->cache->rot_dim;
        w->b = w->t / a->seq_len;
        w->s = w->t % a->seq_len;
        token_angles(a->cache, &a->pos, w->b, w->s, row_c, row_c + fc->half, &r->cs, &r->sn);
        w->token = w->t;
    } else {
        r->cs = prev->cs;
        r->sn = prev->sn;
    }
    r->k = k;
    r->hd = io->head_dim;
    r->v = w->mine + (n & 1) * fc->hdmax;
    r->rstd = fc->na->rstd[k] ? &fc->na->rstd[k][w->t * io->heads + h] : NULL;
    r->x = (const char *)io->in + (size_t)(w->s * io->in_ss + w->b * io->in_sb + h * io->in_sh) * fc->es;
    r->y = (char *)io->out + (size_t)(w->s * io->out_ss + w->b * io->out_sb + h * io->out_sh) * fc->es;
    if (++w->hh == fc->heads) {
        w->hh = 0;
        w->t++;
    }
}

/* Pass 2 of a row on the portable loops, into dst (cpu_norm.h). */
void fr_norm_out_portable(const fwd_call *fc, const fwd_row *r, float rstd, char *dst)
{
    const fr_norm_args *na = fc->na;
    row_values(r->v, fc->wf[r->k], rstd, na->rounding, (int)na->a.dtype, r->hd);
    row_rotate(r->v, r->cs, r->sn, fc->half, na->a.interleaved, 1.0f);
    narrow(r->v, dst, na->a.dtype, r->hd);
}

/* After pass 2 into dst: a staged row streamed out, and the rstd stored. */
static inline __attribute__((always_inline)) void fwd_end(const fwd_call *fc, const fwd_row *r, float rstd, const char *dst)
{
#ifdef __SSE2__
    if (dst != r->y)
        fr_stream_row(r->y, dst, (size_t)r->hd * fc->es);
#else
    (void)fc;
    (void)dst;
#endif
    if (r->rstd)
        *r->rstd = rstd;
}

/*
 * Each thread's rows are software-pipelined: row n's first pass (widen,
 * sum of squares) is done before row n - 1's second pass (values,
 * rotation, narrowing).  Between a row's sum and its rstd lie a chain of
 * dependent additions, a division and a square root (~60 cycles) that
 * the second pass waits on; issued a row earlier, they are done by then
 * (one pass after the other costs ~45% more time on a 128-channel row,
 * bench/RESULTS.md).
 */
static void fwd_rows_portable(const fwd_call *fc, fwd_walk *w, int64_t n0, int64_t n1)
{
    fwd_row rows[2];
    for (int64_t n = n0; n <= n1; n++) {
        if (n < n1) {
            fwd_row *r = &rows[n & 1];
            fwd_begin(fc, w, n, r, &rows[(n - 1) & 1]);
            widen(r->x, fc->na->a.dtype, r->v, r->hd);
            r->sum = row_dot(r->v, r->v, r->hd);
        }
        if (n > n0) {
            const fwd_row *r = &rows[(n - 1) & 1];
            const float rstd = fr_norm_rstd(r->sum, r->hd, fc->na->eps);
            char *dst = fc->stream[r->k] ? w->stage : r->y;
            fr_norm_out_portable(fc, r, rstd, dst);
            fwd_end(fc, r, rstd, dst);
        }
    }
}

/* A thread's share of a forward call's rows, in the team of nth (or, for
 * nth 1 outside a parallel region, on the calling thread alone). */
static void fwd_share(const fwd_call *fc, fr_norm_rows_fn rows, int nth)
{
    const int threads = thread_count(), id = thread_id();
    int64_t n0, n1;
    fwd_walk w;
    fr_fpenv fpenv; /* this thread's, restored at the end (internal.h) */
    fr_fpenv_enter(&fpenv);
    if (id == 0) /* the tests' and the bench's hook, as fr_cpu_apply sets it */
        fr_cpu_team = nth > 1 ? threads : 0;
    fr_thread_share(fc->items, threads, id, &n0, &n1);
    w.mine = fc->scratch + (size_t)id * fc->per;
    w.stage = (char *)(w.mine + FWD_V_ROWS * fc->hdmax + 2 * fc->na->a.cache->rot_dim);
    w.t = fc->heads ? n0 / fc->heads : 0;
    w.hh = fc->heads ? n0 % fc->heads : 0;
    w.b = w.s = 0;
    w.token = -1;
    if (rows)
        rows(fc, &w, n0, n1);
    else
        fwd_rows_portable(fc, &w, n0, n1);
    FR_STREAM_FENCE();
    fr_fpenv_leave(&fpenv);
}

fusedrope_status fr_cpu_norm_forward(const fr_norm_args *na)
{
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    const int64_t tokens = a->seq_len * a->batch;
    int64_t elems = 0;
    int nth;
    fwd_call fc;
    float *wf[2] = { NULL, NULL };
    void *block;
    size_t bytes;
    fr_fpenv outer;
#ifdef FR_HAVE_AVX2
    fr_norm_rows_fn avx2_rows =
        fr_avx2_usable() ? fr_norm_avx2_rows(na->rounding, (int)a->dtype, a->interleaved) : NULL;
#endif
#ifdef FR_HAVE_AVX512
    int all16 = fr_avx512_usable(); /* every slot's rows whole 16-channel vectors */
#endif

    memset(&fc, 0, sizeof fc);
    fc.na = na;
    fc.half = cache->rot_dim / 2;
    fc.es = fr_dtype_size(a->dtype);
    fc.heads0 = a->io[0].heads;
    fc.heads = fc.heads0 + (a->count > 1 ? a->io[1].heads : 0);
    fc.items = tokens * fc.heads;
    for (int k = 0; k < a->count; k++) {
        fc.hdmax = a->io[k].head_dim > fc.hdmax ? a->io[k].head_dim : fc.hdmax;
        elems += tokens * a->io[k].heads * a->io[k].head_dim;
        fc.stream[k] = fr_streamable(&a->io[k], fc.es, tokens, SIZE_MAX);
#ifdef FR_HAVE_AVX2
        fc.direct[k] = avx2_rows && fc.stream[k] && nt_whole(a->io[k].head_dim, fc.half, a->interleaved);
#endif
#ifdef FR_HAVE_AVX512
        all16 = all16 && n5_whole(a->io[k].head_dim, fc.half, a->interleaved);
#endif
        {
            /* the walk's next token is s + 1, or the next batch entry's where
             * seq_len is 1; prefetches never fault, so a last token's may
             * point past the tensor (unsigned: the address may wrap) */
            const int64_t tb = a->io[k].heads * a->io[k].head_dim * (int64_t)fc.es;
            const int64_t n = a->seq_len > 1 ? a->seq_len : a->batch;
            int64_t ahead = tb ? (FWD_AHEAD_BYTES + tb - 1) / tb : 1;
            ahead = ahead < n ? ahead : n;
            fc.ahead[k] = (uintptr_t)ahead * (uintptr_t)fc.es *
                          (uintptr_t)(a->seq_len > 1 ? a->io[k].in_ss : a->io[k].in_sb);
        }
    }
#ifdef FR_HAVE_AVX512
    /* the AVX-512 rows where every slot's are whole 16-channel vectors (a
     * call whose q and k differ in head_dim may mix: it takes the AVX2 rows,
     * the same bits, rather than a function for both widths) */
    if (all16)
        avx2_rows = fr_norm_avx512_rows(na->rounding, (int)a->dtype, a->interleaved);
#endif
    /* a call's input in the cache needs no prefetches (they cost ~4% a row) */
    if (!fr_beyond_cache((uint64_t)elems * fc.es))
        fc.ahead[0] = fc.ahead[1] = 0;
    /* per thread: FWD_V_ROWS rows of floats and two tokens' cos and sin
     * (table-less caches), for the rows in flight, and a streamed output row
     * (hdmax elements of at most 4 bytes) */
    fc.per = (size_t)fr_line_floats((FWD_V_ROWS + 1) * fc.hdmax + 2 * cache->rot_dim); /* (see the backward) */
    nth = fr_cpu_team_size(cache, elems);
    bytes = ((size_t)nth * fc.per + 2 * (size_t)fr_line_floats(fc.hdmax)) * sizeof(float) +
            FR_LINE_BYTES;
    block = malloc(bytes);
    if (!block)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "the norm's row scratch (%zu bytes) could not be "
                       "allocated", bytes);
    fc.scratch = fr_line_start(block);
    /* the calling thread's from here to the team's end (internal.h): 1 + w
     * rounds as the default environment says, and the team's start
     * (cpu_team.c) leaves the caller's exception flags as they were */
    fr_fpenv_enter(&outer);
    for (int k = 0; k < a->count; k++) {
        wf[k] = fc.scratch + (size_t)nth * fc.per + (size_t)k * (size_t)fr_line_floats(fc.hdmax);
        weight_factors(na, k, a->io[k].head_dim, wf[k]);
        fc.wf[k] = wf[k];
        fc.wf_ok[k] = 1;
        for (int64_t c = 0; c < a->io[k].head_dim; c++)
            fc.wf_ok[k] &= isfinite(wf[k][c]) != 0;
        /* A vector row has a finite input and rstd (else it takes the
         * portable loops), so with finite weight factors and a table built
         * from a config (cos and sin times a finite attention factor: no
         * NaN) no operand of its arithmetic is a NaN.  Overflow can still
         * make NaNs (inf - inf in the rotation, inf * 0), but only x86's
         * default NaN, 0xffc00000, which the narrowings without their NaN
         * case give the same bits as with it (bf16 0xffc0, fp16 0xfe00).
         * A caller's table may hold a NaN of any payload, one that the
         * rounding's carry would turn into -0 (test_norm). */
        fc.fin[k] = fc.wf_ok[k] && cache->inv_freq != NULL;
    }

    {
        fr_norm_rows_fn rows = NULL; /* the portable rows */
#ifdef FR_HAVE_AVX2
        rows = avx2_rows;
#endif
#ifdef _OPENMP
        if (fr_cpu_needs_team(nth)) {
#pragma omp parallel num_threads(nth)
            fwd_share(&fc, rows, nth);
        } else
#endif
            fwd_share(&fc, rows, nth);
    }
    fr_fpenv_leave(&outer);
    free(block);
    return FUSEDROPE_OK;
}

/* ---------------------------------------------------------------- backward */

/* dw of a tensor without rows: zero (its gradient is an empty sum). */
static void zero_empty_dw(const fr_norm_args *na)
{
    for (int k = 0; k < 2; k++)
        if (na->dw_zero[k])
            memset(na->dw_zero[k], 0, (size_t)na->dw_zero_n[k] * sizeof(float));
}

/* A backward call's constants, shared by its threads. */
typedef struct {
    const fr_norm_args *na;
    float *scratch;      /* per thread `per` floats, then the weight factors */
    float *partial;      /* the chunks' dw partials, slot k's from pbase[k] */
    float *heads_part;   /* per thread `hper` floats: its chunk's heads' partials */
    float *wf[2];        /* per io slot: the weight factors (the team's master's) */
    size_t per;
    int64_t hdmax, hper, chunks, items, pbase[2], pstride[2];
    int nth;
    fr_norm_brun_fn vrun[2]; /* slot k's runs' vector function, or NULL */
} bwd_call;

/* A thread's share of a backward call's chunks, in the team of nth (or, for
 * nth 1 outside a parallel region, on the calling thread alone: its
 * worksharing then binds to no team and runs every chunk). */
static void bwd_share(bwd_call *bc)
{
    const fr_norm_args *na = bc->na;
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    const int64_t half = cache->rot_dim / 2, C = FUSEDROPE_NORM_DW_CHUNK;
    const int64_t tokens = a->seq_len * a->batch, chunks = bc->chunks, hdmax = bc->hdmax;
    const int64_t *pbase = bc->pbase, *pstride = bc->pstride;
    const size_t es = fr_dtype_size(a->dtype), per = bc->per;
    const int nth = bc->nth;
    float *scratch = bc->scratch, *partial = bc->partial, *heads_part = bc->heads_part;
    float **wf = bc->wf;
#ifdef FR_HAVE_AVX2
    fr_norm_brun_fn *vrun = bc->vrun;
#endif
    fr_fpenv fpenv;
    fr_fpenv_enter(&fpenv);
    /* thread 0 alone, and the barrier below publishes what it wrote: a test of
     * the thread number, as `omp master` (deprecated since OpenMP 5.1; gcc 16
     * warns) does, and not `omp masked`, which gcc 11 ignores */
    if (thread_id() == 0) {
        fr_cpu_team = nth > 1 ? thread_count() : 0; /* the tests' and the bench's hook */
        for (int k = 0; k < a->count; k++) {
            wf[k] = scratch + (size_t)nth * per + (size_t)k * (size_t)fr_line_floats(hdmax);
            weight_factors(na, k, a->io[k].head_dim, wf[k]);
        }
    }
#ifdef _OPENMP
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t it = 0; it < bc->items; it++) {
        const int k = (int)(it / chunks);
        const int64_t ch = it % chunks;
        const fr_io *io = &a->io[k];
        const int64_t hd = io->head_dim, rot = cache->rot_dim;
        float *g = scratch + (size_t)thread_id() * per, *nv = g + hdmax, *xs = nv + hdmax;
        float *row_c = xs + 2 * hdmax, *row_s = row_c + half;
        /* the chunk's heads' partials, head h's at hacc + h * pstride[k] */
        float *hacc = na->dw[k] ? heads_part + (size_t)thread_id() * (size_t)bc->hper : NULL;
        const int64_t t1 = (ch + 1) * C < tokens ? (ch + 1) * C : tokens;

        if (hacc)
            memset(hacc, 0, (size_t)(io->heads * pstride[k]) * sizeof(float));
        for (int64_t t = ch * C; t < t1; t++) {
            const int64_t b = t / a->seq_len, s = t % a->seq_len;
            const float *cs, *sn;
            token_angles(cache, &a->pos, b, s, row_c, row_s, &cs, &sn);
#ifdef FR_HAVE_AVX2
            if (vrun[k]) {
                nb_run_args ra;
                ra.dy = (const char *)io->in + (size_t)(s * io->in_ss + b * io->in_sb) * es;
                ra.sv = (const char *)na->x[k] + (size_t)(s * na->x_ss[k] + b * na->x_sb[k]) * es;
                ra.dx = (char *)io->out + (size_t)(s * io->out_ss + b * io->out_sb) * es;
                ra.dy_step = io->in_sh * (int64_t)es;
                ra.sv_step = na->x_sh[k] * (int64_t)es;
                ra.dx_step = io->out_sh * (int64_t)es;
                ra.rstd = na->rstd[k] + t * io->heads;
                ra.heads = io->heads;
                ra.wf = wf[k];
                ra.cs = cs;
                ra.sn = sn;
                ra.acc = hacc;
                ra.acc_step = pstride[k];
                ra.hd = hd;
                ra.half = half;
                ra.rows = g;
                vrun[k](&ra);
                continue;
            }
#endif
            for (int64_t h = 0; h < io->heads; h++) {
                const float r = na->rstd[k][t * io->heads + h];
                float m;
                /* g = R^T dy */
                widen((const char *)io->in +
                          (size_t)(s * io->in_ss + b * io->in_sb + h * io->in_sh) * es,
                      a->dtype, g, hd);
                row_rotate(g, cs, sn, half, a->interleaved, -1.0f);
                /* n = x * rstd, or R^T y / w' */
                widen((const char *)na->x[k] +
                          (size_t)(s * na->x_ss[k] + b * na->x_sb[k] + h * na->x_sh[k]) * es,
                      a->dtype, xs, hd);
                if (na->saved_y) {
                    row_rotate(xs, cs, sn, half, a->interleaved, -1.0f);
                    for (int64_t c = 0; c < hd; c++)
                        nv[c] = xs[c] / wf[k][c];
                } else {
                    for (int64_t c = 0; c < hd; c++)
                        nv[c] = xs[c] * r;
                }
                if (hacc) {
                    float *acc = hacc + h * pstride[k];
                    for (int64_t c = 0; c < hd; c++)
                        acc[c] = acc[c] + g[c] * nv[c];
                }
                /* dn = g * w' (in g); dx = rstd * (dn - n * mean(dn * n)) */
                for (int64_t c = 0; c < hd; c++)
                    g[c] = g[c] * wf[k][c];
                m = fr_norm_mean(row_dot(g, nv, hd), hd);
                for (int64_t c = 0; c < hd; c++)
                    nv[c] = r * (g[c] - nv[c] * m);
                narrow(nv, (char *)io->out +
                               (size_t)(s * io->out_ss + b * io->out_sb + h * io->out_sh) * es,
                       a->dtype, hd);
            }
        }
        /* the chunk's partial: its heads' in head order (each channel's
         * own sum; the loop over channels innermost, in vectors) */
        if (hacc) {
            float *acc = partial + pbase[k] + ch * pstride[k];
            for (int64_t c = 0; c < hd; c++)
                acc[c] = 0.0f;
            for (int64_t h = 0; h < io->heads; h++)
                for (int64_t c = 0; c < hd; c++)
                    acc[c] = acc[c] + hacc[h * pstride[k] + c];
        }
        (void)rot;
    }
    /* dw[c]: the chunks' partials in chunk order (after the loop's barrier), by
     * thread 0 alone (as above, not `omp master`) */
    if (thread_id() == 0)
        for (int k = 0; k < a->count; k++) {
            if (!na->dw[k])
                continue;
            for (int64_t c = 0; c < a->io[k].head_dim; c++) {
                float sum = 0.0f;
                for (int64_t ch = 0; ch < chunks; ch++)
                    sum = sum + partial[pbase[k] + ch * pstride[k] + c];
                na->dw[k][c] = sum;
            }
        }
    fr_fpenv_leave(&fpenv);
}

fusedrope_status fr_cpu_norm_backward(const fr_norm_args *na)
{
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    const int64_t half = cache->rot_dim / 2;
    const int64_t tokens = a->seq_len * a->batch;
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK;
    int64_t elems = 0, ptotal = 0;
    bwd_call bc;
    void *block;
    size_t total;
    fr_fpenv outer;
#ifdef FR_HAVE_AVX2
    const fr_norm_brun_fn avx2_run =
        fr_avx2_usable() ? fr_norm_avx2_brun((int)a->dtype, a->interleaved, na->saved_y) : NULL;
#endif
#ifdef FR_HAVE_AVX512
    const fr_norm_brun_fn avx512_run =
        fr_avx512_usable() ? fr_norm_avx512_brun((int)a->dtype, a->interleaved, na->saved_y) : NULL;
#endif

    if (a->count == 0) {
        zero_empty_dw(na);
        return FUSEDROPE_OK;
    }
    memset(&bc, 0, sizeof bc);
    bc.na = na;
    bc.chunks = (tokens + C - 1) / C;
    for (int k = 0; k < a->count; k++) {
        bc.hdmax = a->io[k].head_dim > bc.hdmax ? a->io[k].head_dim : bc.hdmax;
        elems += tokens * a->io[k].heads * a->io[k].head_dim;
        bc.pbase[k] = ptotal;
        bc.pstride[k] = fr_line_floats(a->io[k].head_dim);
        if (na->dw[k]) {
            ptotal += bc.chunks * bc.pstride[k];
            if (a->io[k].heads * bc.pstride[k] > bc.hper)
                bc.hper = a->io[k].heads * bc.pstride[k];
        }
#ifdef FR_HAVE_AVX2
        if (avx2_run && nt_whole(a->io[k].head_dim, half, a->interleaved))
            bc.vrun[k] = avx2_run;
#else
        (void)half; /* only the vector runs' fit depends on it */
#endif
#ifdef FR_HAVE_AVX512
        if (avx512_run && n5_whole(a->io[k].head_dim, half, a->interleaved))
            bc.vrun[k] = avx512_run;
#endif
    }
    /* per thread: g, n (then dx), the saved row and one more (the vector
     * runs' two rows of dn and n), a table-less token's cos/sin; then after
     * the weight factors and the chunks' partials, each thread's heads'
     * partials of its chunk.
     * Each thread's rows and each chunk's partial start on a cache line of
     * their own: chunks next to each other are summed by different threads,
     * and a line they shared made two threads slower than one (a bf16 q+k
     * backward 4.7 ms on two threads against 3.9 on one, bench/RESULTS.md). */
    bc.nth = fr_cpu_team_size(cache, elems);
    bc.per = (size_t)fr_line_floats(4 * bc.hdmax + cache->rot_dim);
    total = (size_t)bc.nth * (bc.per + (size_t)bc.hper) + 2 * (size_t)fr_line_floats(bc.hdmax) +
            (size_t)ptotal;
    block = malloc(total * sizeof(float) + FR_LINE_BYTES);
    if (!block)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "the norm backward's scratch (%zu bytes) could not "
                       "be allocated", total * sizeof(float) + FR_LINE_BYTES);
    zero_empty_dw(na); /* after the one thing that can fail: a failed call writes nothing */
    bc.scratch = fr_line_start(block);
    bc.partial = bc.scratch + (size_t)bc.nth * bc.per + 2 * (size_t)fr_line_floats(bc.hdmax);
    bc.heads_part = bc.partial + ptotal;
    bc.items = bc.chunks * a->count;

    /* every thread's part, and the caller's weight factors and dw sums, in
     * the default floating-point environment, and the team's start
     * (cpu_team.c) */
    fr_fpenv_enter(&outer);
#ifdef _OPENMP
    if (fr_cpu_needs_team(bc.nth)) {
#pragma omp parallel num_threads(bc.nth)
        bwd_share(&bc);
    } else
#endif
        bwd_share(&bc);
    fr_fpenv_leave(&outer);
    free(block);
    return FUSEDROPE_OK;
}

