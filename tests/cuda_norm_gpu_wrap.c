/*
 * cuda_norm_gpu_wrap.c - linked into test_norm_gpu with
 * -Wl,--wrap=fusedrope__cpu_norm_forward,--wrap=fusedrope__cpu_norm_backward:
 * every norm call the library would run on its OpenMP backend runs first on
 * a real CUDA device, through kernels/cuda_norm_*.cu's launchers
 * (fr_cuda_norm_forward, fr_cuda_norm_backward), and test_norm's checks
 * judge the device's output.  The GPU counterpart of
 * tests/cuda_norm_emu_wrap.c, as tests/cuda_gpu_wrap.c is of
 * tests/cuda_emu_wrap.c (see there, and tests/cuda_gpu_copy.h, for how
 * the call's memory and the CPU cache are mirrored on the device).
 *
 * Besides the views and positions, a norm call reads the weights w (head_dim
 * elements of the weight dtype per tensor) and, backward, the saved tensors
 * x (the views' shape, strides of their own) and rstd; it writes y or dx,
 * rstd (forward, tokens x heads floats per tensor, where asked), dw
 * (backward, head_dim floats per tensor) and dw_zero (backward: the weight
 * gradients of tensors without rows, dw_zero_n zeros).  All of these are
 * mirrored; the device's and the OpenMP backend's y, rstd, dx, dw and
 * dw_zero must be the same bits (a NaN need only be NaN), and the device's
 * stay for the suite.  A backward call may come with no tensor rows at all
 * (count 0), only weight gradients to zero.
 *
 * Where the OpenMP backend itself fails (out of scratch memory, before it
 * writes), its status is returned and the host memory is left as it was:
 * the wrapped call behaves as the real one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_gpu_copy.h"
#include "ref.h"

fusedrope_status __real_fusedrope__cpu_norm_forward(const fr_norm_args *a);
fusedrope_status __real_fusedrope__cpu_norm_backward(const fr_norm_args *a);
fusedrope_status __wrap_fusedrope__cpu_norm_forward(const fr_norm_args *a);
fusedrope_status __wrap_fusedrope__cpu_norm_backward(const fr_norm_args *a);

/* n elements of dtype dt at cpu (the host's) and gpu (the device's result)
 * must be the same bits, or both NaN. */
static void same(const unsigned char *cpu, const unsigned char *gpu, int64_t n,
                 fusedrope_dtype dt, int backward, const char *what, int k, int64_t row)
{
    const size_t es = fr_dtype_size(dt);
    if (memcmp(cpu, gpu, (size_t)n * es) == 0)
        return;
    for (int64_t i = 0; i < n; i++) {
        const double vc = ref_load(cpu, dt, i), vg = ref_load(gpu, dt, i);
        if (memcmp(cpu + i * (int64_t)es, gpu + i * (int64_t)es, es) == 0 ||
            (isnan(vc) && isnan(vg)))
            continue;
        fprintf(stderr,
                "CUDA device and OpenMP backend differ: norm %s, %s of io slot %d, row %lld, "
                "element %lld: CPU %.9g, GPU %.9g\n",
                backward ? "backward" : "forward", what, k, (long long)row, (long long)i, vc,
                vg);
        abort();
    }
}

static void compare(const fr_norm_args *na, const gpu_mirror *m, int backward)
{
    const fr_apply_args *a = &na->a;
    const size_t es = fr_dtype_size(a->dtype);
    const int64_t tokens = a->seq_len * a->batch;

    for (int k = 0; k < a->count; k++) {
        const fr_io *io = &a->io[k];
        for (int64_t b = 0; b < a->batch; b++)
            for (int64_t s = 0; s < a->seq_len; s++)
                for (int64_t h = 0; h < io->heads; h++) {
                    const unsigned char *cpu =
                        (const unsigned char *)io->out +
                        (b * io->out_sb + s * io->out_ss + h * io->out_sh) * (int64_t)es;
                    same(cpu, gpu_mirror_result(m, cpu), io->head_dim, a->dtype, backward,
                         backward ? "dx" : "y", k, (b * a->seq_len + s) * io->heads + h);
                }
        if (!backward && na->rstd[k] != NULL)
            same((const unsigned char *)na->rstd[k], gpu_mirror_result(m, na->rstd[k]),
                 tokens * io->heads, FUSEDROPE_FLOAT32, backward, "rstd", k, 0);
        if (backward && na->dw[k] != NULL)
            same((const unsigned char *)na->dw[k], gpu_mirror_result(m, na->dw[k]),
                 io->head_dim, FUSEDROPE_FLOAT32, backward, "dw", k, 0);
    }
    for (int k = 0; k < 2 && backward; k++)
        if (na->dw_zero[k] != NULL && na->dw_zero_n[k] > 0)
            same((const unsigned char *)na->dw_zero[k], gpu_mirror_result(m, na->dw_zero[k]),
                 na->dw_zero_n[k], FUSEDROPE_FLOAT32, backward, "dw_zero", k, 0);
}

static fusedrope_status run(const fr_norm_args *na, int backward)
{
    const fr_apply_args *a = &na->a;
    const size_t es = fr_dtype_size(a->dtype), wes = fr_dtype_size(na->wdtype);
    const int64_t tokens = a->seq_len * a->batch;
    const char *what = backward ? "fr_cuda_norm_backward on the device"
                                : "fr_cuda_norm_forward on the device";
    fr_norm_args e = *na;
    fusedrope_cache twin;
    gpu_mirror m;
    fusedrope_status st;
    int *words = gpu_words_new();

    gpu_mirror_init(&m);
    gpu_mirror_add_apply(&m, a); /* the cache even without rows (lib/norm.c sets it) */
    for (int k = 0; k < a->count; k++) {
        const int64_t heads = a->io[k].heads, hd = a->io[k].head_dim;
        if (backward)
            gpu_mirror_add(&m, na->x[k],
                           gpu_view_bytes(a->seq_len, a->batch, heads, hd, na->x_ss[k],
                                          na->x_sb[k], na->x_sh[k], es),
                           0);
        gpu_mirror_add(&m, na->w[k], (size_t)hd * wes, 0);
        /* rstd: written forward, the forward's read backward */
        gpu_mirror_add(&m, na->rstd[k], (size_t)(tokens * heads) * sizeof(float), !backward);
        if (backward)
            gpu_mirror_add(&m, na->dw[k], (size_t)hd * sizeof(float), 1);
    }
    for (int k = 0; k < 2 && backward; k++)
        if (na->dw_zero_n[k] > 0)
            gpu_mirror_add(&m, na->dw_zero[k], (size_t)na->dw_zero_n[k] * sizeof(float), 1);
    gpu_mirror_upload(&m);

    e.a = gpu_apply_on_device(&m, a, words, &twin);
    for (int k = 0; k < 2; k++) {
        e.x[k] = gpu_mirror_dev(&m, na->x[k]);
        e.w[k] = gpu_mirror_dev(&m, na->w[k]);
        e.rstd[k] = gpu_mirror_dev(&m, na->rstd[k]);
        e.dw[k] = gpu_mirror_dev(&m, na->dw[k]);
        e.dw_zero[k] = na->dw_zero_n[k] > 0 ? gpu_mirror_dev(&m, na->dw_zero[k]) : NULL;
    }

    st = backward ? fr_cuda_norm_backward(&e) : fr_cuda_norm_forward(&e);
    if (st != FUSEDROPE_OK) {
        fprintf(stderr, "%s: status %d (%s)\n", what, (int)st, fusedrope_last_error());
        abort();
    }
    gpu_check(cudaDeviceSynchronize(), what);
    gpu_words_check(words, what);
    gpu_mirror_download(&m);

    st = backward ? __real_fusedrope__cpu_norm_backward(na) : __real_fusedrope__cpu_norm_forward(na);
    if (st == FUSEDROPE_OK) {
        compare(na, &m, backward);
        gpu_mirror_commit(&m);
    }
    gpu_mirror_free(&m);
    return st;
}

fusedrope_status __wrap_fusedrope__cpu_norm_forward(const fr_norm_args *a)
{
    return run(a, 0);
}

fusedrope_status __wrap_fusedrope__cpu_norm_backward(const fr_norm_args *a)
{
    return run(a, 1);
}
