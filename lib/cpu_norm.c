/*
 * cpu_norm.c - the OpenMP backend of the fused RMSNorm + RoPE
 * (fusedrope_norm_forward_qk(3)).  A row is one (token, head) of head_dim
 * channels; it is widened to floats in per-thread scratch, reduced in
 * norm_math.h's order (32 partial sums and a tree, which the CUDA kernels
 * follow), turned into the rotation's input as the rounding mode says,
 * rotated with rope_math.h's fr_rotate and narrowed once.  Every loop is a
 * simple one over floats the compiler vectorises.
 *
 * The forward splits the (token, head) rows evenly over the threads.  The
 * backward works in chunks of FUSEDROPE_NORM_DW_CHUNK tokens: a chunk's
 * rows, tokens in order and heads in order within a token, add g * n into
 * the chunk's partial weight gradient, and the partials are summed in chunk
 * order afterwards, so dw has the same bits for any thread count (and the
 * CUDA kernels', which use the same chunks and orders).
 */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"
#include "norm_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && \
    !defined(__SANITIZE_THREAD__)
#define FR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FR_CLONES
#endif

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

/* Sum of a[c] * b[c] over n channels in norm_math.h's order: partial sum
 * l is lane l % 8 of accumulator l / 8, which stay in registers (as an
 * array of 32 floats gcc keeps them in memory, and the loop waits on it). */
#if defined(__GNUC__)
typedef float v8f __attribute__((vector_size(32)));
FR_CLONES static float row_dot(const float *a, const float *b, int64_t n)
{
    v8f s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 }, x[4], y[4];
    float p[32];
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        memcpy(x, a + c, sizeof x);
        memcpy(y, b + c, sizeof y);
        s0 = s0 + x[0] * y[0];
        s1 = s1 + x[1] * y[1];
        s2 = s2 + x[2] * y[2];
        s3 = s3 + x[3] * y[3];
    }
    memcpy(p, &s0, sizeof s0);
    memcpy(p + 8, &s1, sizeof s1);
    memcpy(p + 16, &s2, sizeof s2);
    memcpy(p + 24, &s3, sizeof s3);
    for (int l = 0; c + l < n; l++)
        p[l] = p[l] + a[c + l] * b[c + l];
    return fr_norm_tree32(p);
}
#else
static float row_dot(const float *a, const float *b, int64_t n)
{
    float p[32];
    int64_t c = 0;
    for (int l = 0; l < 32; l++)
        p[l] = 0.0f;
    for (; c + 32 <= n; c += 32)
        for (int l = 0; l < 32; l++)
            p[l] = p[l] + a[c + l] * b[c + l];
    for (int l = 0; c + l < n; l++)
        p[l] = p[l] + a[c + l] * b[c + l];
    return fr_norm_tree32(p);
}
#endif

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

/* cos/sin of token (b, s): a table row, or computed into row_c/row_s. */
static void token_angles(const fusedrope_cache *cache, const fr_pos_args *pos, int64_t b,
                         int64_t s, float *row_c, float *row_s, const float **cs,
                         const float **sn)
{
    const int64_t half = cache->rot_dim / 2;
    int bad = 0;
    const int64_t p = fr_token_position(pos, b, s, &bad); /* checked on the host */
    if (cache->max_positions > 0) {
        *cs = cache->cos + p * half;
        *sn = cache->sin + p * half;
        return;
    }
    for (int64_t i = 0; i < half; i++)
        fr_angle(p, cache->inv_freq[i], cache->attention_factor, &row_c[i], &row_s[i]);
    *cs = row_c;
    *sn = row_s;
}

static int threads_max(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* ----------------------------------------------------------------- forward */

fusedrope_status fr_cpu_norm_forward(const fr_norm_args *na)
{
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    const int64_t half = cache->rot_dim / 2;
    const size_t es = fr_dtype_size(a->dtype);
    const int64_t tokens = a->seq_len * a->batch;
    const int64_t heads0 = a->io[0].heads;
    const int64_t heads = heads0 + (a->count > 1 ? a->io[1].heads : 0);
    const int64_t items = tokens * heads;
    int64_t hdmax = 0, elems = 0;
    const int nth = threads_max();
    float *wf[2] = { NULL, NULL }, *scratch;
    size_t per;

    for (int k = 0; k < a->count; k++) {
        hdmax = a->io[k].head_dim > hdmax ? a->io[k].head_dim : hdmax;
        elems += tokens * a->io[k].heads * a->io[k].head_dim;
    }
    /* per thread: a row of floats and a table-less token's cos and sin */
    per = (size_t)hdmax + (size_t)cache->rot_dim;
    scratch = malloc(((size_t)nth * per + 2 * (size_t)hdmax) * sizeof(float));
    if (!scratch)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "the norm's row scratch (%zu bytes) could not be "
                       "allocated", ((size_t)nth * per + 2 * (size_t)hdmax) * sizeof(float));
    for (int k = 0; k < a->count; k++) {
        wf[k] = scratch + (size_t)nth * per + (size_t)k * hdmax;
        weight_factors(na, k, a->io[k].head_dim, wf[k]);
    }

#pragma omp parallel if (elems > (1 << 15))
    {
        int threads = 1;
        const int id = thread_id();
        int64_t n0, n1, base, rem, t, hh, b = 0, s = 0, token = -1;
        float *v = scratch + (size_t)id * per, *row_c = v + hdmax, *row_s = row_c + half;
        const float *cs = NULL, *sn = NULL;
#ifdef _OPENMP
        threads = omp_get_num_threads();
#endif
        base = items / threads;
        rem = items % threads;
        n0 = id * base + (id < rem ? id : rem);
        n1 = n0 + base + (id < rem);
        t = heads ? n0 / heads : 0;
        hh = heads ? n0 % heads : 0;
        for (int64_t n = n0; n < n1; n++, hh = hh + 1 < heads ? hh + 1 : (t++, 0)) {
            const int k = hh >= heads0;
            const fr_io *io = &a->io[k];
            const int64_t h = hh - (k ? heads0 : 0), hd = io->head_dim;
            float rstd;
            if (t != token) {
                b = t / a->seq_len;
                s = t % a->seq_len;
                token_angles(cache, &a->pos, b, s, row_c, row_s, &cs, &sn);
                token = t;
            }
            widen((const char *)io->in + (size_t)(s * io->in_ss + b * io->in_sb + h * io->in_sh) * es,
                  a->dtype, v, hd);
            rstd = fr_norm_rstd(row_dot(v, v, hd), hd, na->eps);
            if (na->rstd[k])
                na->rstd[k][t * io->heads + h] = rstd;
            row_values(v, wf[k], rstd, na->rounding, (int)a->dtype, hd);
            row_rotate(v, cs, sn, half, a->interleaved, 1.0f);
            narrow(v, (char *)io->out + (size_t)(s * io->out_ss + b * io->out_sb + h * io->out_sh) * es,
                   a->dtype, hd);
        }
    }
    free(scratch);
    return FUSEDROPE_OK;
}

/* ---------------------------------------------------------------- backward */

fusedrope_status fr_cpu_norm_backward(const fr_norm_args *na)
{
    const fr_apply_args *a = &na->a;
    const fusedrope_cache *cache = a->cache;
    const int64_t half = cache->rot_dim / 2;
    const size_t es = fr_dtype_size(a->dtype);
    const int64_t tokens = a->seq_len * a->batch;
    const int64_t C = FUSEDROPE_NORM_DW_CHUNK;
    const int64_t chunks = (tokens + C - 1) / C;
    const int nth = threads_max();
    int64_t hdmax = 0, elems = 0, pbase[2] = { 0, 0 }, ptotal = 0, items;
    float *wf[2] = { NULL, NULL }, *scratch, *partial;
    size_t per, total;

    for (int k = 0; k < 2; k++)
        if (na->dw_zero[k])
            memset(na->dw_zero[k], 0, (size_t)na->dw_zero_n[k] * sizeof(float));
    if (a->count == 0)
        return FUSEDROPE_OK;
    for (int k = 0; k < a->count; k++) {
        hdmax = a->io[k].head_dim > hdmax ? a->io[k].head_dim : hdmax;
        elems += tokens * a->io[k].heads * a->io[k].head_dim;
        pbase[k] = ptotal;
        if (na->dw[k])
            ptotal += chunks * a->io[k].head_dim;
    }
    /* per thread: g, n (then dx), the saved row, a table-less token's cos/sin */
    per = 3 * (size_t)hdmax + (size_t)cache->rot_dim;
    total = (size_t)nth * per + 2 * (size_t)hdmax + (size_t)ptotal;
    scratch = malloc(total * sizeof(float));
    if (!scratch)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "the norm backward's scratch (%zu bytes) could not "
                       "be allocated", total * sizeof(float));
    partial = scratch + (size_t)nth * per + 2 * (size_t)hdmax;
    for (int k = 0; k < a->count; k++) {
        wf[k] = scratch + (size_t)nth * per + (size_t)k * hdmax;
        weight_factors(na, k, a->io[k].head_dim, wf[k]);
    }
    items = chunks * a->count;

#pragma omp parallel for schedule(dynamic, 1) if (elems > (1 << 15))
    for (int64_t it = 0; it < items; it++) {
        const int k = (int)(it / chunks);
        const int64_t ch = it % chunks;
        const fr_io *io = &a->io[k];
        const int64_t hd = io->head_dim, rot = cache->rot_dim;
        float *g = scratch + (size_t)thread_id() * per, *nv = g + hdmax, *xs = nv + hdmax;
        float *row_c = xs + hdmax, *row_s = row_c + half;
        float *acc = na->dw[k] ? partial + pbase[k] + ch * hd : NULL;
        const int64_t t1 = (ch + 1) * C < tokens ? (ch + 1) * C : tokens;

        if (acc)
            for (int64_t c = 0; c < hd; c++)
                acc[c] = 0.0f;
        for (int64_t t = ch * C; t < t1; t++) {
            const int64_t b = t / a->seq_len, s = t % a->seq_len;
            const float *cs, *sn;
            token_angles(cache, &a->pos, b, s, row_c, row_s, &cs, &sn);
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
                if (acc)
                    for (int64_t c = 0; c < hd; c++)
                        acc[c] = acc[c] + g[c] * nv[c];
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
        (void)rot;
    }
    /* dw[c]: the chunks' partials in chunk order */
    for (int k = 0; k < a->count; k++) {
        if (!na->dw[k])
            continue;
        for (int64_t c = 0; c < a->io[k].head_dim; c++) {
            float sum = 0.0f;
            for (int64_t ch = 0; ch < chunks; ch++)
                sum = sum + partial[pbase[k] + ch * a->io[k].head_dim + c];
            na->dw[k][c] = sum;
        }
    }
    free(scratch);
    return FUSEDROPE_OK;
}
