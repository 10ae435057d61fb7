/* Times fusedrope_cache_create for a 128k-position x 64-pair table (Llama-3
 * parameters) on the CPU and, when present, on the GPU: median of 11.
 * cc bench/cache-build-time.c $(pkg-config --cflags --libs fusedrope) */
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
    }
    return 0;
}
