/*
 * cuda_emu_wrap.c - linked into test_apply_emu with -Wl,--wrap=fusedrope__cpu_apply:
 * every call the library would run on its OpenMP backend runs instead
 * through the CUDA backend's launcher and kernels, built for the host by
 * kernels/cuda_apply_emu.cc.  test_apply's checks (an independent float64
 * reference, poisoned outputs, untouched channels and bytes) then judge the
 * kernels' code without a GPU.
 *
 * Each call runs four times, with the launcher planning for 132 SMs (an
 * H100), for 1 (the most heads per thread, the general NeoX kernel), for 5
 * choosing the wide NeoX kernel as an H200 would (kernels/cuda_apply.cu's
 * wide_pays), and for 1 with the wide kernel wherever the general one would
 * run, from the same starting bytes (saved and put back, so in place
 * works too): the four outputs must be identical.  The real OpenMP backend
 * then runs from the same bytes, and its output must be the kernels' to the
 * bit (the backends' promise; a NaN need only be NaN, its bits being each
 * path's own).  The kernels' output stays for test_apply to check.
 * Under valgrind (make check-valgrind) or a sanitizer a call runs one of
 * the four plans, in turn (tests/emu_config.h).
 *
 * The cache is the CPU one, used as if it lived on the device: its table,
 * and its frequencies for a table-less cache, are host arrays, which the
 * emulated kernels read directly.  Positions reach the kernels only after
 * the library's host checks (a CPU cache's positions are checked before
 * the backend runs), so every call must succeed with the range flag down.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "ref.h"
#include "emu_config.h"

fusedrope_status fr_emu_cuda_apply(const fr_apply_args *a);
void __real_fusedrope__cpu_apply(const fr_apply_args *a);
void __wrap_fusedrope__cpu_apply(const fr_apply_args *a);

extern int fr_emu_sms; /* kernels/cuda_emu_sms.cc */
extern int fr_emu_neox_wide; /* kernels/cuda_apply.cu */

/* A launch plan: the SMs the launcher plans for, the wide NeoX kernel
 * (fr_emu_neox_wide: 0 never, 1 always, 2 as the device would). */
typedef struct {
    int sms, wide;
} plan;

/* Copies every element of the call's outputs to buf (save) or back from it. */
static size_t outputs(const fr_apply_args *a, unsigned char *buf, int save)
{
    const size_t es = fr_dtype_size(a->dtype);
    size_t n = 0;
    for (int k = 0; k < a->count; k++) {
        const fr_io *io = &a->io[k];
        for (int64_t b = 0; b < a->batch; b++)
            for (int64_t s = 0; s < a->seq_len; s++)
                for (int64_t h = 0; h < io->heads; h++) {
                    unsigned char *row = (unsigned char *)io->out +
                                         (size_t)(b * io->out_sb + s * io->out_ss +
                                                  h * io->out_sh) * es;
                    const size_t bytes = (size_t)io->head_dim * es;
                    if (buf != NULL) {
                        if (save)
                            memcpy(buf + n, row, bytes);
                        else
                            memcpy(row, buf + n, bytes);
                    }
                    n += bytes;
                }
    }
    return n;
}

static void run(const fr_apply_args *a, plan p)
{
    fusedrope_cache c = *a->cache;
    fr_apply_args e = *a;
    fusedrope_status st;
    int flag = 0;

    c.inv_freq_dev = c.inv_freq;
    c.pair_map_dev = c.pair_map;
    c.range_flag = c.range_flag_dev = &flag;
    e.cache = &c;
    fr_emu_sms = p.sms;
    fr_emu_neox_wide = p.wide;
    st = fr_emu_cuda_apply(&e);
    if (st != FUSEDROPE_OK || flag != 0) {
        fprintf(stderr, "emulated CUDA backend, %d SMs%s: status %d, range flag %d (%s)\n",
                p.sms, p.wide ? ", wide" : "", (int)st, flag, fusedrope_last_error());
        abort();
    }
}

void __wrap_fusedrope__cpu_apply(const fr_apply_args *a)
{
    static const plan plans[] = { { 132, 0 }, { 1, 0 }, { 5, 2 }, { 1, 1 } };
    const size_t np = sizeof plans / sizeof plans[0];
    const size_t n = outputs(a, NULL, 0);
    unsigned char *start = malloc(n ? n : 1), *first = malloc(n ? n : 1),
                  *now = malloc(n ? n : 1);

    if (start == NULL || first == NULL || now == NULL) {
        fprintf(stderr, "cuda_emu_wrap: out of memory\n");
        abort();
    }
    outputs(a, start, 1);
    for (size_t i = 0, f = SIZE_MAX; i < np; i++) {
        if (!emu_config_runs(i, np, a))
            continue;
        if (f != SIZE_MAX) /* f: the first that ran */
            outputs(a, start, 0);
        run(a, plans[i]);
        outputs(a, f == SIZE_MAX ? first : now, 1);
        if (f != SIZE_MAX && memcmp(first, now, n) != 0) {
            size_t j = 0;
            while (first[j] == now[j])
                j++;
            fprintf(stderr,
                    "emulated CUDA backend: plans %zu (%d SMs) and %zu (%d SMs%s) differ at "
                    "output byte %zu\n",
                    f, plans[f].sms, i, plans[i].sms, plans[i].wide ? ", wide" : "", j);
            abort();
        }
        if (f == SIZE_MAX)
            f = i;
    }
    outputs(a, start, 0);
    __real_fusedrope__cpu_apply(a);
    outputs(a, now, 1);
    for (size_t j = 0, es = fr_dtype_size(a->dtype); j < n; j += es)
        if (memcmp(first + j, now + j, es) != 0 &&
            !(isnan(ref_load(first + j, a->dtype, 0)) && isnan(ref_load(now + j, a->dtype, 0)))) {
            fprintf(stderr, "emulated CUDA backend and OpenMP backend differ at output byte %zu\n",
                    j);
            abort();
        }
    outputs(a, first, 0);
    free(start);
    free(first);
    free(now);
}
