/* Times fusedrope_cache_create for a 128k-position x 64-pair table (Llama-3
 * parameters) on the CPU and, when present, on the GPU: median of 11.
 * Then, on the CPU, what the table saves: a 2048-token q+k forward (bf16,
 * 32 q and 8 k heads of 128, in place, NeoX) with that table and with a
 * cache of max_positions 0 (angles at apply time), 21 alternated pairs, and
 * whether the two give the same bytes.
 * cc bench/cache-build-time.c $(pkg-config --cflags --libs fusedrope)
 * With -DRUNTIME_PARTS -I<cuda>/include it also times the CUDA runtime calls
 * a build is made of (allocation, pinning), to say where the time goes. */
#include <fusedrope.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timing.h"

#ifdef RUNTIME_PARTS
#include <cuda_runtime.h>

/* Median of 11 of one runtime call pair, in ms. */
#define TIME_PART(label, body)                                              \
    do {                                                                    \
        double t_[11];                                                      \
        for (int i_ = 0; i_ < 11; i_++) {                                   \
            double t0_ = bench_now();                                             \
            body;                                                           \
            t_[i_] = bench_now() - t0_;                                           \
        }                                                                   \
        qsort(t_, 11, sizeof t_[0], bench_cmp_double);                                   \
        printf("  %-44s median %.3f ms\n", label, t_[5] * 1e3);            \
    } while (0)

static void runtime_parts(void)
{
    void *a, *b;
    const size_t half_table = (size_t)131072 * 64 * sizeof(float);
    TIME_PART("cudaMalloc + cudaFree, two 32 MiB", cudaMalloc(&a, half_table);
              cudaMalloc(&b, half_table); cudaFree(a); cudaFree(b));
    TIME_PART("cudaMalloc + cudaFree, one 64 MiB", cudaMalloc(&a, 2 * half_table); cudaFree(a));
    TIME_PART("cudaHostAlloc(mapped) + cudaFreeHost, 4 KiB",
              cudaHostAlloc(&a, 4096, cudaHostAllocMapped); cudaFreeHost(a));
    TIME_PART("cudaStreamSynchronize(0), idle", cudaStreamSynchronize(0));
}
#endif

/* One in-place forward_qk on copies of q0/k0 into q/k; returns its time. */
static double one_qk(const fusedrope_cache *c, const uint16_t *q0, const uint16_t *k0,
                     uint16_t *q, uint16_t *k, size_t nq, size_t nk)
{
    fusedrope_tensor tq = fusedrope_tensor_sbhd(q, FUSEDROPE_BFLOAT16, 2048, 1, 32, 128);
    fusedrope_tensor tk = fusedrope_tensor_sbhd(k, FUSEDROPE_BFLOAT16, 2048, 1, 8, 128);
    double t0;
    memcpy(q, q0, nq * 2);
    memcpy(k, k0, nk * 2);
    t0 = bench_now();
    if (fusedrope_forward_qk(c, FUSEDROPE_NEOX, NULL, &tq, &tq, &tk, &tk, NULL) != FUSEDROPE_OK) {
        fprintf(stderr, "cache-build-time: %s\n", fusedrope_last_error());
        exit(1);
    }
    return bench_now() - t0;
}

/* The same call with the table and without (max_positions 0), alternated so
 * that a busy machine slows both alike: 21 pairs after a warm-up pair;
 * min and median of each. */
static int tableless_call(const fusedrope_cache_config *table_cfg)
{
    const size_t nq = (size_t)2048 * 32 * 128, nk = (size_t)2048 * 8 * 128;
    fusedrope_cache_config cfg = *table_cfg;
    fusedrope_cache *with, *without;
    uint16_t *q0 = malloc(nq * 2), *k0 = malloc(nk * 2), *q1 = malloc(nq * 2), *k1 = malloc(nk * 2);
    uint16_t *q2 = malloc(nq * 2), *k2 = malloc(nk * 2);
    uint64_t r = 1;
    double a[21], b[21];
    if (!q0 || !k0 || !q1 || !k1 || !q2 || !k2)
        return 1;
    for (size_t i = 0; i < nq + nk; i++) { /* bf16 values in about [-2, 2] */
        uint16_t v;
        r = r * 6364136223846793005u + 1442695040888963407u;
        v = (uint16_t)((0x3c00u + (r >> 56)) | ((r >> 40) & 0x8000u));
        if (i < nq)
            q0[i] = v;
        else
            k0[i - nq] = v;
    }
    cfg.max_positions = 131072;
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &with) != FUSEDROPE_OK)
        return 1;
    cfg.max_positions = 0;
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &without) != FUSEDROPE_OK)
        return 1;
    for (int i = -1; i < 21; i++) {
        double ta = one_qk(with, q0, k0, q1, k1, nq, nk);
        double tb = one_qk(without, q0, k0, q2, k2, nq, nk);
        if (i >= 0)
            a[i] = ta, b[i] = tb;
    }
    qsort(a, 21, sizeof a[0], bench_cmp_double);
    qsort(b, 21, sizeof b[0], bench_cmp_double);
    printf("forward_qk 2048 tokens, 32+8 heads x 128 bf16, in place, CPU: table min %.3f ms "
           "(median %.3f), max_positions 0 min %.3f ms (median %.3f): %+.0f%% (min), "
           "outputs %s\n",
           a[0] * 1e3, a[10] * 1e3, b[0] * 1e3, b[10] * 1e3, (b[0] / a[0] - 1) * 100,
           memcmp(q1, q2, nq * 2) == 0 && memcmp(k1, k2, nk * 2) == 0 ? "bit-identical"
                                                                      : "DIFFER");
    fusedrope_cache_destroy(with);
    fusedrope_cache_destroy(without);
    free(q0), free(k0), free(q1), free(k1), free(q2), free(k2);
    return 0;
}

int main(void)
{
    fusedrope_cache_config cfg;
    fusedrope_device devs[2] = { FUSEDROPE_DEVICE_CPU, FUSEDROPE_DEVICE_CUDA };
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LLAMA3, 128, 131072, 500000.0);
    cfg.factor = 8;
    cfg.original_max_positions = 8192;
    for (int d = 0; d < 2; d++) {
        double t[11];
        if (devs[d] == FUSEDROPE_DEVICE_CUDA && !fusedrope_cuda_available())
            break;
        for (int i = 0; i < 11; i++) {
            fusedrope_cache *c;
            double t0 = bench_now();
            if (fusedrope_cache_create(&cfg, devs[d], &c) != FUSEDROPE_OK) {
                fprintf(stderr, "cache-build-time: %s\n", fusedrope_last_error());
                return 1;
            }
            t[i] = bench_now() - t0;
            fusedrope_cache_destroy(c);
        }
        qsort(t, 11, sizeof t[0], bench_cmp_double);
        printf("cache build 131072 x 64 pairs, %s: median %.3f ms (min %.3f)\n",
               d ? "CUDA" : "CPU", t[5] * 1e3, t[0] * 1e3);
#ifdef RUNTIME_PARTS
        if (d)
            runtime_parts();
#endif
    }
    return tableless_call(&cfg);
}
