/* Times fusedrope_cache_create for a 128k-position x 64-pair table (Llama-3
 * parameters) on the CPU and, when present, on the GPU: median of 11.
 * cc bench/cache-build-time.c $(pkg-config --cflags --libs fusedrope)
 * With -DRUNTIME_PARTS -I<cuda>/include it also times the CUDA runtime calls
 * a build is made of (allocation, pinning), to say where the time goes. */
#include <fusedrope.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#ifdef RUNTIME_PARTS
#include <cuda_runtime.h>

/* Median of 11 of one runtime call pair, in ms. */
#define TIME_PART(label, body)                                              \
    do {                                                                    \
        double t_[11];                                                      \
        for (int i_ = 0; i_ < 11; i_++) {                                   \
            double t0_ = now();                                             \
            body;                                                           \
            t_[i_] = now() - t0_;                                           \
        }                                                                   \
        qsort(t_, 11, sizeof t_[0], cmp);                                   \
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
            double t0 = now();
            if (fusedrope_cache_create(&cfg, devs[d], &c) != FUSEDROPE_OK) {
                fprintf(stderr, "cache-build-time: %s\n", fusedrope_last_error());
                return 1;
            }
            t[i] = now() - t0;
            fusedrope_cache_destroy(c);
        }
        qsort(t, 11, sizeof t[0], cmp);
        printf("cache build 131072 x 64 pairs, %s: median %.3f ms (min %.3f)\n",
               d ? "CUDA" : "CPU", t[5] * 1e3, t[0] * 1e3);
#ifdef RUNTIME_PARTS
        if (d)
            runtime_parts();
#endif
    }
    return 0;
}
