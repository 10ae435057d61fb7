/*
 * check-overhead.c - host time of one forward_qk call of a decode step, and
 * how many pointer-kind queries (cudaPointerGetAttributes) it makes.
 *
 * Call: q [1, 8, 32, 128] and k [1, 8, 8, 128] bf16, in place, one offset
 * per batch entry (positions from a device array, as in decode), or with
 * -thd: packed q/k of 8 tokens with ids and cu_seqlens, out of place, and a
 * range_status word (the most queries a call makes: 7).
 *
 * Two builds:
 *
 *   CHECK_PATH_ONLY (no GPU needed): the library's host checks up to the
 *   backend, on a CPU cache, with the backend and the pointer query
 *   replaced by no-ops that count (-Wl,--wrap): what the checks cost
 *   besides the queries, and how many queries a CUDA call would make.
 *     cc -O2 -DCHECK_PATH_ONLY -Iinclude -I. bench/check-overhead.c \
 *        -Wl,--wrap=fusedrope__cpu_apply -Wl,--wrap=fusedrope__cuda_pointer_kind \
 *        .libs/libfusedrope_core.a <the CUDA runtime flags of the build> -fopenmp -lm
 *
 *   GPU: a CUDA cache and device buffers; host time per call (launch
 *   included, no synchronisation in the timed loop), median of 21 runs of
 *   2000 calls.  Run it twice, with and without FUSEDROPE_CUDA_POINTER_CHECKS=0:
 *     cc -O2 bench/check-overhead.c $(pkg-config --cflags --libs fusedrope) \
 *        -I/usr/local/cuda/include
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timing.h"

#include <fusedrope.h>

#ifndef CHECK_PATH_ONLY
#include <cuda_runtime.h>
#endif

enum { B = 8, HQ = 32, HK = 8, D = 128, REPS = 21, CALLS = 2000 };

#ifdef CHECK_PATH_ONLY
static long queries;
struct fr_apply_args;
void __wrap_fusedrope__cpu_apply(const struct fr_apply_args *a);
void __wrap_fusedrope__cpu_apply(const struct fr_apply_args *a) { (void)a; }
int __wrap_fusedrope__cuda_pointer_kind(const void *p);
int __wrap_fusedrope__cuda_pointer_kind(const void *p)
{
    (void)p;
    queries++;
    return 0; /* FR_PTR_HOST: right for the CPU cache used here */
}
#define DEVICE FUSEDROPE_DEVICE_CPU
static void *dev_alloc(size_t n) { return calloc(1, n); }
static void sync_all(void) {}
#else
#define DEVICE FUSEDROPE_DEVICE_CUDA
static void *dev_alloc(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess || cudaMemset(p, 0, n) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        exit(1);
    }
    return p;
}
static void sync_all(void) { cudaDeviceSynchronize(); }
#endif

int main(int argc, char **argv)
{
    const int thd = argc > 1 && strcmp(argv[1], "-thd") == 0;
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_positions pos;
    fusedrope_tensor q, k, qo, ko;
    double t[REPS];
    int64_t offsets[B] = { 100, 200, 300, 400, 500, 600, 700, 800 };
    int64_t ids[B] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    int32_t cu[3] = { 0, 3, 8 };
    void *dq = dev_alloc((size_t)B * HQ * D * 2), *dk = dev_alloc((size_t)B * HK * D * 2);
    void *dqo = dev_alloc((size_t)B * HQ * D * 2), *dko = dev_alloc((size_t)B * HK * D * 2);
    void *doff = dev_alloc(sizeof offsets), *dids = dev_alloc(sizeof ids), *dcu = dev_alloc(sizeof cu);
    int32_t *dstatus = dev_alloc(4);

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, 8192, 500000.0);
    if (fusedrope_cache_create(&cfg, DEVICE, &cache) != FUSEDROPE_OK) {
        fprintf(stderr, "cache: %s\n", fusedrope_last_error());
        return 1;
    }
#ifdef CHECK_PATH_ONLY
    memcpy(doff, offsets, sizeof offsets);
    memcpy(dids, ids, sizeof ids);
    memcpy(dcu, cu, sizeof cu);
#else
    cudaMemcpy(doff, offsets, sizeof offsets, cudaMemcpyHostToDevice);
    cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice);
    cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice);
#endif
    fusedrope_positions_init(&pos);
    if (thd) {
        q = fusedrope_tensor_thd(dq, FUSEDROPE_BFLOAT16, B, HQ, D);
        k = fusedrope_tensor_thd(dk, FUSEDROPE_BFLOAT16, B, HK, D);
        qo = fusedrope_tensor_thd(dqo, FUSEDROPE_BFLOAT16, B, HQ, D);
        ko = fusedrope_tensor_thd(dko, FUSEDROPE_BFLOAT16, B, HK, D);
        pos.ids = dids;
        pos.cu_seqlens = dcu;
        pos.num_seqs = 2;
        pos.range_status = dstatus;
    } else {
        q = qo = fusedrope_tensor_sbhd(dq, FUSEDROPE_BFLOAT16, 1, B, HQ, D);
        k = ko = fusedrope_tensor_sbhd(dk, FUSEDROPE_BFLOAT16, 1, B, HK, D);
        pos.offsets = doff;
    }
    for (int r = -1; r < REPS; r++) { /* r = -1: warm-up */
        double t0;
        sync_all();
        t0 = bench_now();
        for (int i = 0; i < CALLS; i++)
            if (fusedrope_forward_qk(cache, FUSEDROPE_NEOX, &pos, &q, &qo, &k, &ko, NULL) !=
                FUSEDROPE_OK) {
                fprintf(stderr, "forward_qk: %s\n", fusedrope_last_error());
                return 1;
            }
        if (r >= 0)
            t[r] = (bench_now() - t0) * 1e9 / CALLS;
    }
    sync_all();
    qsort(t, REPS, sizeof t[0], bench_cmp_double);
    printf("%s, %s: host time per forward_qk call: median %.0f ns (min %.0f, max %.0f)",
           thd ? "thd ids+cu_seqlens+range_status, out of place" : "decode offsets, in place",
#ifdef CHECK_PATH_ONLY
           "checks only (CPU cache, backend and pointer query stubbed)",
#else
           getenv("FUSEDROPE_CUDA_POINTER_CHECKS") ? "FUSEDROPE_CUDA_POINTER_CHECKS set" : "CUDA",
#endif
           t[REPS / 2], t[0], t[REPS - 1]);
#ifdef CHECK_PATH_ONLY
    printf("; pointer queries per call: %ld", queries / ((long)(REPS + 1) * CALLS));
#endif
    printf("\n");
    fusedrope_cache_destroy(cache);
    return 0;
}
