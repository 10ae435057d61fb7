/*
 * fuzz_apply.c - libFuzzer harness for libfusedrope's public API.
 *
 * The input bytes choose a cache (every rope type, fusedrope_cache_create or
 * _create_from_table; odd, huge, NaN and negative values) and one forward,
 * backward, forward_qk or backward_qk call: sizes including 0, negative and
 * near INT64_MAX; standard, padded, arbitrary, zero and negative strides; in
 * place, partial overlap, q and k as views of one packed buffer; NULLs,
 * out-of-range enums; positions through ids, offsets, cu_seqlens and context
 * parallelism, inside and outside the table.
 *
 * Memory: every tensor whose extent (bytes from its data pointer to one past
 * its last element) is computable and at most FZ_LIMIT bytes gets a buffer of
 * exactly that extent (ASan flags any access past it).  A tensor whose extent
 * is larger gets a small real buffer, and the call is then made to fail for
 * a reason the contract names (a position below 0 through offsets, or a bad
 * style), so any accepted call touches only memory the harness allocated.
 *
 * Sometimes the cache has position axes (multimodal rope: a random preset
 * with valid or broken sections, or a custom per-pair axis and column map)
 * or is of the proportional type, and the positions carry ids rows
 * ([ids_axes][tokens] with a row stride, valid or a wrong row count); the
 * model then holds the axes rules (ref_axes_map's refusals, ids_axes 0, 1
 * or the cache's axis count, every axis's position inside the table,
 * negatives allowed on a table-less cache with axes) and the reference
 * rotates pair j by p[axis(j)] * inv[col(j)].
 *
 * Every call is checked against an independent model of the contract
 * (DESIGN.md and the lead's decisions):
 *   - the status is one the model allows (OK when no rule is broken; one of
 *     the broken rules' statuses otherwise);
 *   - on failure: fusedrope_last_error() is non-empty and no byte of any
 *     buffer changed;
 *   - on success: fusedrope_last_error() is unchanged, no byte outside the
 *     output elements changed, channels past rot_dim are copied (out of
 *     place) or untouched (in place), and the rotated channels match a
 *     float64 reference within DESIGN's bound
 *       |y - ref| <= ulp(ref) + 2^-22 (|a| + |b|) max(1, attention factor).
 * Any disagreement calls abort(), which libFuzzer reports as a crash.
 *
 * The reference is the tests' (tests/ref.c, in tests/libfrtest.a, written
 * from DESIGN.md and sharing no code with lib/): cos/sin from ref_inv_freq in
 * double for every rope type (default, linear, dynamic, yarn, longrope,
 * llama3), the user's table for _create_from_table; its codecs, ulp and
 * bound; its per-token position model (ref_token_position).  Since both the
 * library and the reference compute inv_i in double by their own operation
 * order, the bound gets ref_angle_slack(p * inv_i) on top (the fuzzed configs
 * reach angles far past the tests').
 *
 * Environment: FUSEDROPE_FUZZ_LENIENT=1 steers around the library defects
 * listed in decode.h's KI_ enum (each fixed one has a regression test in
 * tests/fuzz/test_regress.c), so that fuzzing an old library can go on past
 * them; by default they are findings like any other.
 * FUSEDROPE_FUZZ_VERBOSE=1 prints every call's status and the trace.
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedrope.h"


#include "decode.h"

const char *fz_name = "fuzz_apply";

enum { API_FWD, API_BWD, API_FWD_QK, API_BWD_QK };

/* The reference for pair k of an accepted call: checks every output element
 * of up to FZ_MAX_ITEMS (token, head) items. */
static void check_values(const cache_t *ct, const buf_t *bufs, const tspec *x, const tspec *y,
                         const char *name, int sgn, int interleaved, const i128 *tokpos,
                         int64_t S, int64_t ntok)
{
    const fusedrope_tensor *tx = &x->t, *ty = &y->t;
    const int dt = (int)tx->dtype;
    const size_t es = dtype_size(dt);
    const int64_t items = tx->seq_len * tx->batch * tx->heads;
    const int64_t step = items > FZ_MAX_ITEMS ? items / FZ_MAX_ITEMS : 1;
    const int half = ct->half;
    const unsigned char *in = bufs[x->buf].snap + x->off;
    const unsigned char *out = bufs[y->buf].p + y->off;

    for (int64_t n = 0; n < items; n += step) {
        int64_t h = n % tx->heads, tok = n / tx->heads, b = tok % tx->batch, s = tok / tx->batch;
        const i128 *pt = &tokpos[b * S + s];
        i128 p = pt[0];
        const unsigned char *xi = in + (size_t)(s * tx->stride_seq + b * tx->stride_batch +
                                                h * tx->stride_head) * es;
        const unsigned char *yo = out + (size_t)(s * ty->stride_seq + b * ty->stride_batch +
                                                 h * ty->stride_head) * es;
        /* channels past rot_dim: copied bytes (in place: the same bytes, untouched) */
        CHECK(memcmp(xi + (size_t)ct->rot_dim * es, yo + (size_t)ct->rot_dim * es,
                     (size_t)(tx->head_dim - ct->rot_dim) * es) == 0,
              "%s: token (batch %lld, seq %lld) head %lld: channels past rot_dim %d changed", name,
              (long long)b, (long long)s, (long long)h, ct->rot_dim);
        for (int i = 0; i < half; i++) {
            int64_t ca = interleaved ? 2 * i : i, cb = interleaved ? 2 * i + 1 : i + half;
            double a = load(xi + ca * es, dt), bb = load(xi + cb * es, dt);
            double ya = load(yo + ca * es, dt), yb = load(yo + cb * es, dt);
            double c, sn, attn = 1.0, ra, rb, ta, tb, slack = 0;
            if (ct->formula) {
                double ang;
                if (ct->has_axes) /* pair i: its axis's position, its column */
                    p = pt[(int64_t)ct->axis[i] * ntok];
                if (p >= ((i128)1 << 40) || p <= -((i128)1 << 40))
                    continue; /* the reference's angle is not exact enough there */
                ang = (double)(int64_t)p * ct->inv[ct->has_axes ? ct->col[i] : i];
                attn = ct->attn;
                c = cos(ang) * attn;
                sn = sin(ang) * attn;
                slack = ref_angle_slack(ang) * attn * (fabs(a) + fabs(bb));
            } else {
                if (!ct->tcos || p >= ct->trows)
                    return; /* no reference for this cache: status checks only */
                c = ct->tcos[(size_t)p * half + i];
                sn = ct->tsin[(size_t)p * half + i];
                attn = sqrt(c * c + sn * sn) * 1.0001;
            }
            if (!isfinite(a) || !isfinite(bb) || !isfinite(c) || !isfinite(sn))
                continue;
            ra = a * c - sgn * bb * sn;
            rb = bb * c + sgn * a * sn;
            if (fabs(ra) > ref_max_finite(dt) / 2 || fabs(rb) > ref_max_finite(dt) / 2)
                continue;
            ta = ref_tolerance(ra, a, bb, attn, dt) + slack;
            tb = ref_tolerance(rb, a, bb, attn, dt) + slack;
            CHECK(fabs(ya - ra) <= ta && fabs(yb - rb) <= tb,
                  "%s: token (batch %lld, seq %lld) position %lld head %lld pair %d: "
                  "in (%.9g, %.9g) cos %.9g sin %.9g -> (%.9g, %.9g), reference (%.9g, %.9g), "
                  "tolerance (%.3g, %.3g)",
                  name, (long long)b, (long long)s, (long long)p, (long long)h, i, a, bb, c, sn,
                  ya, yb, ra, rb, ta, tb);
        }
    }
}

static fusedrope_status do_call(unsigned api, const fusedrope_cache *c, fz_call *fc)
{
    const fusedrope_positions *pp = fz_pos(fc);
    const fusedrope_style style = (fusedrope_style)fc->style;
    const fusedrope_tensor *d[4];
    for (int k = 0; k < 4; k++)
        d[k] = k < 2 * fc->count && fc->ts[k].present ? &fc->ts[k].t : NULL;
    switch (api) {
    case API_FWD:
        return fusedrope_forward(c, style, pp, d[0], d[1], fc->stream);
    case API_BWD:
        return fusedrope_backward(c, style, pp, d[0], d[1], fc->stream);
    case API_FWD_QK:
        return fusedrope_forward_qk(c, style, pp, d[0], d[1], d[2], d[3], fc->stream);
    default:
        return fusedrope_backward_qk(c, style, pp, d[0], d[1], d[2], d[3], fc->stream);
    }
}

static void run_call(src_t *s, cache_t *ct, rng_t *r, int null_cache)
{
    unsigned api = u8(s) % 4;
    int qk = api >= API_FWD_QK;
    int sgn = (api == API_FWD || api == API_FWD_QK) ? 1 : -1;
    fz_call call, *fc = &call;
    fusedrope_status st;

    fz_setup(s, ct, r, null_cache, qk, fc);
    if (fz_last_call)
        fz_ext_call(s, ct, fc);
    fz_model_done(fc, api == API_FWD ? "forward" : api == API_BWD ? "backward"
                      : api == API_FWD_QK ? "forward_qk" : "backward_qk");

    /* ---- the call */
    fz_snapshot(fc);
    st = do_call(api, null_cache ? NULL : ct->cache, fc);

    /* ---- verdict */
    fz_verdict(fc, st);
    fz_after_call(fc, st);
    if (st == FUSEDROPE_OK && fc->tokpos && !null_cache) {
        const tspec *ts = fc->ts;
        for (int k = 0; k < fc->count; k++)
            if (mappable(&ts[2 * k]) && mappable(&ts[2 * k + 1]))
                check_values(ct, fc->bufs, &ts[2 * k], &ts[2 * k + 1], k ? "k" : "q", sgn,
                             fc->style == FUSEDROPE_INTERLEAVED, fc->tokpos, ts[0].t.seq_len,
                             ts[0].t.seq_len * ts[0].t.batch);
    }
    if (st == FUSEDROPE_OK && !null_cache) {
        /* again on the AVX2 rows alone, on the portable path, with
         * streamed outputs and on a team of threads, from the same inputs:
         * the same bytes (a NaN may change its payload) */
        for (int path = 1; path < FZ_CPU_PATHS; path++) {
            unsigned char **first = fz_rerun_begin(fc);
            fusedrope_status again;
            fz_cpu_path(path);
            again = do_call(api, ct->cache, fc);
            fz_cpu_path(0);
            fz_rerun_end(fc, first, again);
        }
    }
    fz_call_free(fc);
}


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_env();
    return fz_input(data, size, run_call);
}
