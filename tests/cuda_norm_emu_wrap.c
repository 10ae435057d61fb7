/*
 * cuda_norm_emu_wrap.c - linked into test_norm_emu with
 * -Wl,--wrap=fusedrope__cpu_norm_forward,--wrap=fusedrope__cpu_norm_backward:
 * every norm call the library would run on its OpenMP backend runs instead
 * through the CUDA backend's launcher and kernels built for the host
 * (kernels/cuda_norm_*_emu.cc), and test_norm's checks judge their output.
 *
 * Each call runs with the launcher planning for 132, 1, 5, 3, 1 and 2 SMs
 * (other grids: the kernels are grid-stride), the second to fourth with the
 * backward's tokens in segments of 1, 2 and 3 chunks (the second and third
 * with its half-warps' next tokens in flight through shared memory, one
 * and three of them)
 * (kernels/cuda_norm_backward.cu, segment_tokens), the last three with the
 * forward's rows spread over warps (its lanes in lockstep:
 * norm_forward_warp's items of 4 rows taken 3 a warp at a time, then
 * norm_forward_half's items as warp_heads sizes them for one SM, two rows a
 * warp, then its items of 4 rows, two pairs of rows a step where the heads
 * are multiples of 4), the backward's warps taking heads as the launcher
 * decides in the first three and the last (one a token with 132 SMs,
 * FR_CUDA_NORM_BWD_HEADS with fewer), 3 a token in the fourth and 1 in the
 * fifth (norm_backward_heads; the last two holding two tokens in
 * registers), the second and fifth launching the backward's kernels with
 * the programmatic-dependent attribute, the last two prefetching the
 * forward's items' rows and the second, fourth, fifth and sixth the
 * backward's rows 2, 3, 31 and 4 tokens ahead (each prefetch must be a
 * whole row of the call's inputs: prefetch_is_row), from the same starting bytes,
 * which must give the same output bytes (y and rstd; dx and dw); then the
 * real OpenMP backend runs from the same bytes, and its output must be the
 * kernels' to the bit (a NaN need only be NaN).  The kernels' output
 * stays.  The CPU cache serves as the device's, as in cuda_emu_wrap.c.
 * Under valgrind or a sanitizer a call runs one of the six
 * configurations, in turn (tests/emu_config.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "ref.h"
#include "emu_config.h"

fusedrope_status fr_emu_cuda_norm_forward(const fr_norm_args *a);
fusedrope_status fr_emu_cuda_norm_backward(const fr_norm_args *a);
fusedrope_status __real_fusedrope__cpu_norm_forward(const fr_norm_args *a);
fusedrope_status __real_fusedrope__cpu_norm_backward(const fr_norm_args *a);
fusedrope_status __wrap_fusedrope__cpu_norm_forward(const fr_norm_args *a);
fusedrope_status __wrap_fusedrope__cpu_norm_backward(const fr_norm_args *a);

extern int fr_emu_sms; /* kernels/cuda_emu_sms.cc */
/* kernels/cuda_norm_forward.cu and _backward.cu, emulated */
extern int fr_emu_norm_seg_chunks, fr_emu_norm_warp, fr_emu_norm_warp_rpw, fr_emu_norm_warp_heads,
    fr_emu_norm_bwd_heads, fr_emu_norm_warp_half, fr_emu_norm_bwd_half, fr_emu_norm_bwd_pipe,
    fr_emu_norm_bwd_ahead, fr_emu_norm_bwd_pdl;

extern int fr_emu_norm_warp_prefetch, fr_emu_norm_bwd_prefetch;
extern int (*fr_emu_prefetch_check)(const void *p, unsigned bytes);

/* The first byte of row (b, s, h) of a tensor at base with element strides
 * ss, sb, sh and es-byte elements. */
static unsigned char *row_at(const void *base, int64_t b, int64_t s, int64_t h, int64_t ss,
                             int64_t sb, int64_t sh, size_t es)
{
    return (unsigned char *)base + (size_t)(b * sb + s * ss + h * sh) * es;
}

/* The rows the emulated call may prefetch (its inputs' rows: the forward's
 * x, the backward's dy and saved rows) as their first bytes, sorted, for
 * prefetch_is_row; filled at the call's first prefetch. */
static const fr_norm_args *pf_call;
static int pf_backward;
static const unsigned char **pf_rows;
static size_t pf_n;

static int cmp_ptr(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t)*(const unsigned char *const *)a,
                    y = (uintptr_t)*(const unsigned char *const *)b;
    return x < y ? -1 : x > y;
}

static void pf_rows_fill(void)
{
    const fr_apply_args *a = &pf_call->a;
    const size_t es = fr_dtype_size(a->dtype);
    size_t n = 0;
    for (int k = 0; k < a->count; k++)
        n += (size_t)(a->batch * a->seq_len * a->io[k].heads) * (pf_backward ? 2 : 1);
    pf_rows = malloc(sizeof *pf_rows * (n ? n : 1));
    if (!pf_rows)
        abort();
    for (int k = 0; k < a->count; k++) {
        const fr_io *io = &a->io[k];
        for (int64_t b = 0; b < a->batch; b++)
            for (int64_t s = 0; s < a->seq_len; s++)
                for (int64_t h = 0; h < io->heads; h++) {
                    pf_rows[pf_n++] = row_at(io->in, b, s, h, io->in_ss, io->in_sb, io->in_sh, es);
                    if (pf_backward)
                        pf_rows[pf_n++] = row_at(pf_call->x[k], b, s, h, pf_call->x_ss[k],
                                                 pf_call->x_sb[k], pf_call->x_sh[k], es);
                }
    }
    qsort(pf_rows, pf_n, sizeof *pf_rows, cmp_ptr);
}

/* fr_emu_prefetch_check: a prefetch must be one whole row of the call's
 * inputs, found from the call's description (not the kernels' indexing) */
static int prefetch_is_row(const void *p, unsigned bytes)
{
    const unsigned char *q = p;
    if (!pf_call || bytes != (unsigned)(pf_call->a.io[0].head_dim * fr_dtype_size(pf_call->a.dtype)))
        return 0;
    if (!pf_rows)
        pf_rows_fill();
    return bsearch(&q, pf_rows, pf_n, sizeof *pf_rows, cmp_ptr) != NULL;
}

/* The call's outputs as (pointer, bytes, element size) pieces. */
typedef struct { unsigned char *p; size_t n, es; } piece;

static int pieces(const fr_norm_args *na, int backward, piece *pc, int max)
{
    const fr_apply_args *a = &na->a;
    const size_t es = fr_dtype_size(a->dtype);
    int n = 0;
    for (int k = 0; k < a->count; k++) {
        const fr_io *io = &a->io[k];
        for (int64_t b = 0; b < a->batch; b++)
            for (int64_t s = 0; s < a->seq_len; s++)
                for (int64_t h = 0; h < io->heads; h++) {
                    if (n == max)
                        abort();
                    pc[n].p = row_at(io->out, b, s, h, io->out_ss, io->out_sb, io->out_sh, es);
                    pc[n].n = (size_t)io->head_dim * es;
                    pc[n++].es = es;
                }
        if (!backward && na->rstd[k]) {
            pc[n].p = (unsigned char *)na->rstd[k];
            pc[n].n = (size_t)(a->seq_len * a->batch * io->heads) * sizeof(float);
            pc[n++].es = sizeof(float);
        }
        if (backward && na->dw[k]) {
            pc[n].p = (unsigned char *)na->dw[k];
            pc[n].n = (size_t)io->head_dim * sizeof(float);
            pc[n++].es = sizeof(float);
        }
    }
    for (int k = 0; k < 2 && backward; k++)
        if (na->dw_zero[k]) {
            pc[n].p = (unsigned char *)na->dw_zero[k];
            pc[n].n = (size_t)na->dw_zero_n[k] * sizeof(float);
            pc[n++].es = sizeof(float);
        }
    return n;
}

static void save(const piece *pc, int n, unsigned char *buf, int out)
{
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        if (out)
            memcpy(buf + o, pc[i].p, pc[i].n);
        else
            memcpy(pc[i].p, buf + o, pc[i].n);
        o += pc[i].n;
    }
}

static int is_nan(const unsigned char *p, size_t es, fusedrope_dtype dt)
{
    return isnan(ref_load(p, es == 4 ? FUSEDROPE_FLOAT32 : dt, 0));
}

static fusedrope_status both(const fr_norm_args *na, int backward)
{
    static const int sms[] = { 132, 1, 5, 3, 1, 2 }, seg_chunks[] = { 0, 1, 2, 3, 0, 0 },
                     warp[] = { 0, 0, 0, 1, 1, 1 }, warp_rpw[] = { 0, 0, 0, 3, 0, 0 },
                     warp_heads[] = { 0, 0, 0, 4, 0, 4 }, bwd_heads[] = { 0, 0, 0, 3, 1, 0 },
                     warp_half[] = { -1, -1, -1, 0, 1, 2 }, bwd_half[] = { -1, -1, -1, 0, 0, -1 },
                     bwd_pipe[] = { -1, 1, 3, -1, -1, -1 }, bwd_ahead[] = { 0, 0, 0, 0, 2, 2 },
                     bwd_pdl[] = { -1, 1, 0, 0, 1, 0 }, warp_prefetch[] = { -1, 0, 0, 0, 1, 1 },
                     bwd_prefetch[] = { -1, 2, 0, 3, 31, 4 };
    const int max = 4 + 2 * (int)(na->a.seq_len * na->a.batch *
                                  (na->a.io[0].heads + (na->a.count > 1 ? na->a.io[1].heads : 0)));
    piece *pc = malloc(sizeof *pc * (size_t)max);
    int n;
    size_t total = 0;
    unsigned char *start, *first, *now;
    fusedrope_cache c = *na->a.cache;
    fr_norm_args e = *na;
    fusedrope_status st;
    int flag = 0;

    if (!pc)
        abort();
    n = pieces(na, backward, pc, max);
    for (int i = 0; i < n; i++)
        total += pc[i].n;
    start = malloc(total + 1);
    first = malloc(total + 1);
    now = malloc(total + 1);
    if (!start || !first || !now)
        abort();
    save(pc, n, start, 1);
    c.inv_freq_dev = c.inv_freq;
    c.pair_map_dev = c.pair_map;
    c.range_flag = c.range_flag_dev = &flag;
    e.a.cache = &c;
    for (size_t i = 0, f = SIZE_MAX; i < sizeof sms / sizeof sms[0]; i++) {
        if (!emu_config_runs(i, sizeof sms / sizeof sms[0], &na->a))
            continue;
        if (f != SIZE_MAX) /* f: the first that ran */
            save(pc, n, start, 0);
        fr_emu_sms = sms[i];
        fr_emu_norm_seg_chunks = seg_chunks[i];
        fr_emu_norm_warp = warp[i];
        fr_emu_norm_warp_rpw = warp_rpw[i];
        fr_emu_norm_warp_heads = warp_heads[i];
        fr_emu_norm_bwd_heads = bwd_heads[i];
        fr_emu_norm_warp_half = warp_half[i];
        fr_emu_norm_bwd_half = bwd_half[i];
        fr_emu_norm_bwd_pipe = bwd_pipe[i];
        fr_emu_norm_bwd_ahead = bwd_ahead[i];
        fr_emu_norm_bwd_pdl = bwd_pdl[i];
        fr_emu_norm_warp_prefetch = warp_prefetch[i];
        fr_emu_norm_bwd_prefetch = bwd_prefetch[i];
        pf_call = &e;
        pf_backward = backward;
        fr_emu_prefetch_check = prefetch_is_row;
        st = backward ? fr_emu_cuda_norm_backward(&e) : fr_emu_cuda_norm_forward(&e);
        if (st != FUSEDROPE_OK || flag) {
            fprintf(stderr, "emulated CUDA norm %s, %d SMs: status %d, flag %d (%s)\n",
                    backward ? "backward" : "forward", sms[i], (int)st, flag,
                    fusedrope_last_error());
            abort();
        }
        save(pc, n, f == SIZE_MAX ? first : now, 1);
        if (f != SIZE_MAX && memcmp(first, now, total) != 0) {
            fprintf(stderr, "emulated CUDA norm: configurations %zu and %zu (%d SMs, segments of "
                            "%d chunks, warp rows %d, %d at a time, %d an item, half-warps %d, "
                            "backward heads %d a warp, half-warps %d, pipeline %d, %d tokens "
                            "held) differ\n",
                    f, i, sms[i], seg_chunks[i], warp[i], warp_rpw[i], warp_heads[i],
                    warp_half[i], bwd_heads[i], bwd_half[i], bwd_pipe[i], bwd_ahead[i]);
            abort();
        }
        if (f == SIZE_MAX)
            f = i;
    }
    fr_emu_prefetch_check = NULL;
    pf_call = NULL;
    free(pf_rows);
    pf_rows = NULL;
    pf_n = 0;
    save(pc, n, start, 0);
    st = backward ? __real_fusedrope__cpu_norm_backward(na) : __real_fusedrope__cpu_norm_forward(na);
    if (st != FUSEDROPE_OK)
        abort();
    save(pc, n, now, 1);
    {
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            for (size_t j = 0; j < pc[i].n; j += pc[i].es)
                if (memcmp(first + o + j, now + o + j, pc[i].es) != 0 &&
                    !(is_nan(first + o + j, pc[i].es, na->a.dtype) &&
                      is_nan(now + o + j, pc[i].es, na->a.dtype))) {
                    fprintf(stderr, "emulated CUDA norm %s and the OpenMP backend differ in "
                            "output piece %d byte %zu\n", backward ? "backward" : "forward", i, j);
                    abort();
                }
            o += pc[i].n;
        }
    }
    save(pc, n, first, 0);
    free(start);
    free(first);
    free(now);
    free(pc);
    return FUSEDROPE_OK;
}

fusedrope_status __wrap_fusedrope__cpu_norm_forward(const fr_norm_args *a)
{
    return both(a, 0);
}

fusedrope_status __wrap_fusedrope__cpu_norm_backward(const fr_norm_args *a)
{
    return both(a, 1);
}
