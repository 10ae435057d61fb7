/*
 * small-call.c - time of one tiny forward call (1 token, H heads of 128
 * float32, in place, table cache): what a decode step pays per call besides
 * the rotation itself.  Best of 5 runs of N calls.
 *
 * cc -O2 bench/small-call.c $(pkg-config --cflags --libs fusedrope)
 * ./a.out [N=200000] [H=8] [num_threads=0]
 */
#include <fusedrope.h>
#include <stdio.h>
#include <stdlib.h>

#include "timing.h"

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 200000;
    const int heads = argc > 2 ? atoi(argv[2]) : 8;
    fusedrope_cache_config cfg;
    fusedrope_cache *c;
    fusedrope_tensor t;
    float *q;
    double best = 1e9;

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 128, 4096, 10000);
    if (argc > 3)
        cfg.num_threads = atoi(argv[3]);
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c)) {
        puts(fusedrope_last_error());
        return 1;
    }
    q = calloc((size_t)heads * 128, sizeof *q);
    if (!q)
        return 1;
    t = fusedrope_tensor_sbhd(q, FUSEDROPE_FLOAT32, 1, 1, heads, 128);
    for (int r = 0; r < 5; r++) {
        const double t0 = bench_now();
        double dt;
        for (int i = 0; i < n; i++)
            fusedrope_forward(c, FUSEDROPE_NEOX, NULL, &t, &t, NULL);
        dt = (bench_now() - t0) / n;
        if (dt < best)
            best = dt;
    }
    printf("%.1f ns/call (1 token, %d heads x 128 f32)\n", best * 1e9, heads);
    fusedrope_cache_destroy(c);
    free(q);
    return 0;
}
