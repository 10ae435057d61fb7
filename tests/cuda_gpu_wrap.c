/*
 * cuda_gpu_wrap.c - linked into test_apply_gpu and test_axes_gpu with
 * -Wl,--wrap=fusedrope__cpu_apply: every call the library would run on its
 * OpenMP backend runs first on a real CUDA device, through the CUDA
 * backend's own launcher (fr_cuda_apply) and kernels, and the suite's
 * checks (the float64 reference, poisoned outputs, untouched channels and
 * bytes) then judge the device's bytes.  tests/cuda_emu_wrap.c does the
 * same with the kernels built for the host; this is the hardware: its
 * conversions, its memory system, its launch shapes (the launcher plans for
 * the device's own SM count).
 *
 * Each wrapped call:
 *  - mirrors on the device everything the call reads or writes (the
 *    views, the position arrays, the cache's table, frequencies and axes
 *    map: tests/cuda_gpu_copy.h), each region holding the host's bytes, so
 *    bytes between and around the views start as they were and an in-place
 *    call or q and k packed in one buffer alias on the device as on the host;
 *  - runs fr_cuda_apply on a copy of the validated call with every pointer
 *    rebased, on a device twin of the CPU cache whose range flag, and the
 *    call's pos->range_status where it has one, are device words that must
 *    stay 0: the library's host checks already passed every position (a CPU
 *    cache's positions are checked before the backend runs), as in the emu
 *    wrap;
 *  - brings the device's output back into copies, runs the real OpenMP
 *    backend on the host bytes (which the device run left as they were, so
 *    both start from the same bytes, in place included) and compares:
 *    table caches to the bit, a NaN needing only to be NaN (each path makes
 *    its own NaN bits); table-less caches to one ulp of the dtype, or the
 *    bound below, since their angles past 2^28 come from glibc's and CUDA's
 *    own double sin/cos (lib/rope_math.h, fr_sincos), which may differ in
 *    the last bit;
 *  - puts the device's output in the host tensors, for the suite to judge.
 *
 * A stream of the caller's means nothing on the device (a CPU call's stream
 * is ignored), so the call runs on the legacy default stream.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_gpu_copy.h"
#include "ref.h"

void __real_fusedrope__cpu_apply(const fr_apply_args *a);
void __wrap_fusedrope__cpu_apply(const fr_apply_args *a);

/* A table-less result's bound.  The two backends' float cos and sin of a
 * pair may be one float32 ulp apart, at most 2^-23 max(1, attn) since
 * |cos|, |sin| <= attn; a*c and b*s (float32, rounded apart) then move by
 * up to that times |a| and |b|, plus an ulp of their rounding each, and the
 * sum and its conversion to the dtype round once more each: within
 * 2^-22 (|a| + |b|) max(1, attn) + 2 ulp(y).  Twice the first term for
 * margin; a cancelling a*c - b*s makes the ulp term alone too tight. */
static int tableless_close(double vc, double vg, double xa, double xb, double attn,
                           fusedrope_dtype dt)
{
    const double big = fabs(vc) > fabs(vg) ? fabs(vc) : fabs(vg);
    if (!isfinite(vc) || !isfinite(vg))
        return 0;
    if (fabs(vc - vg) <= ref_ulp(big, dt))
        return 1;
    return fabs(vc - vg) <=
           0x1p-21 * (fabs(xa) + fabs(xb)) * (attn > 1 ? attn : 1) + 2 * ref_ulp(big, dt);
}

static void differ(const fr_apply_args *a, int k, int64_t b, int64_t s, int64_t h, int64_t c,
                   double vc, double vg)
{
    fprintf(stderr,
            "CUDA device and OpenMP backend differ: %s %s, %s cache (rot_dim %d, %lld rows), "
            "tensor %d (of %d), batch %lld, seq %lld, head %lld, channel %lld (of %lld): "
            "CPU %.9g, GPU %.9g\n",
            a->sgn > 0 ? "forward" : "backward", a->interleaved ? "interleaved" : "neox",
            a->cache->max_positions > 0 ? "table" : "table-less", a->cache->rot_dim,
            (long long)a->cache->max_positions, k, a->count, (long long)b, (long long)s,
            (long long)h, (long long)c, (long long)a->io[k].head_dim, vc, vg);
    abort();
}

/* The device's output (in the mirror's result copies) against the OpenMP
 * backend's (in the host tensors), every element of every output row. */
static void compare(const fr_apply_args *a, const gpu_mirror *m)
{
    const fusedrope_dtype dt = a->dtype;
    const size_t es = fr_dtype_size(dt);
    const int rot = a->cache->rot_dim;
    const int tableless = a->cache->max_positions == 0;
    const fusedrope_style style = a->interleaved ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;

    for (int k = 0; k < a->count; k++) {
        const fr_io *io = &a->io[k];
        for (int64_t b = 0; b < a->batch; b++)
            for (int64_t s = 0; s < a->seq_len; s++)
                for (int64_t h = 0; h < io->heads; h++) {
                    const int64_t oo = b * io->out_sb + s * io->out_ss + h * io->out_sh;
                    const int64_t oi = b * io->in_sb + s * io->in_ss + h * io->in_sh;
                    const unsigned char *cpu = (const unsigned char *)io->out + oo * (int64_t)es;
                    const unsigned char *gpu = gpu_mirror_result(m, cpu);
                    /* the inputs as they were before either backend ran */
                    const unsigned char *x =
                        gpu_mirror_start(m, (const unsigned char *)io->in + oi * (int64_t)es);
                    if (memcmp(cpu, gpu, (size_t)io->head_dim * es) == 0)
                        continue;
                    for (int i = 0; i < rot / 2; i++) {
                        int64_t ch[2];
                        ref_pair(style, rot, i, &ch[0], &ch[1]);
                        for (int j = 0; j < 2; j++) {
                            const double vc = ref_load(cpu, dt, ch[j]), vg = ref_load(gpu, dt, ch[j]);
                            if (memcmp(cpu + ch[j] * (int64_t)es, gpu + ch[j] * (int64_t)es, es) == 0 ||
                                (isnan(vc) && isnan(vg)))
                                continue;
                            if (tableless && tableless_close(vc, vg, ref_load(x, dt, ch[0]),
                                                             ref_load(x, dt, ch[1]),
                                                             a->cache->attention_factor, dt))
                                continue;
                            differ(a, k, b, s, h, ch[j], vc, vg);
                        }
                    }
                    /* pass-through channels are copies: the same bits */
                    for (int64_t c = rot; c < io->head_dim; c++) {
                        const double vc = ref_load(cpu, dt, c), vg = ref_load(gpu, dt, c);
                        if (memcmp(cpu + c * (int64_t)es, gpu + c * (int64_t)es, es) != 0 &&
                            !(isnan(vc) && isnan(vg)))
                            differ(a, k, b, s, h, c, vc, vg);
                    }
                }
    }
}

void __wrap_fusedrope__cpu_apply(const fr_apply_args *a)
{
    fusedrope_cache twin;
    fr_apply_args e;
    gpu_mirror m;
    fusedrope_status st;
    int *words = gpu_words_new();

    gpu_mirror_init(&m);
    gpu_mirror_add_apply(&m, a);
    gpu_mirror_upload(&m);
    e = gpu_apply_on_device(&m, a, words, &twin);

    st = fr_cuda_apply(&e);
    if (st != FUSEDROPE_OK) {
        fprintf(stderr, "fr_cuda_apply on the device: status %d (%s)\n", (int)st,
                fusedrope_last_error());
        abort();
    }
    gpu_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after fr_cuda_apply");
    gpu_words_check(words, "fr_cuda_apply on the device");
    gpu_mirror_download(&m);

    __real_fusedrope__cpu_apply(a);
    compare(a, &m);
    gpu_mirror_commit(&m);
    gpu_mirror_free(&m);
}
