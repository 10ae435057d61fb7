/*
 * downstream.c - a user's program, built by `make installcheck` against the
 * installed library with nothing but `pkg-config --cflags --libs fusedrope`.
 * Rotates a small tensor on the CPU forward and back and checks the result.
 */
#include <fusedrope.h>
#include <math.h>
#include <stdio.h>

int main(void)
{
    enum { S = 9, B = 2, H = 3, D = 64 };
    static float x[S * B * H * D], y[S * B * H * D], z[S * B * H * D];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_tensor tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, S, B, H, D);
    fusedrope_tensor ty = fusedrope_tensor_sbhd(y, FUSEDROPE_FLOAT32, S, B, H, D);
    fusedrope_tensor tz = fusedrope_tensor_sbhd(z, FUSEDROPE_FLOAT32, S, B, H, D);
    double worst = 0;

    for (int i = 0; i < S * B * H * D; i++)
        x[i] = (float)sin(0.37 * i);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LLAMA3, D, 4 * S, 500000.0);
    cfg.factor = 8;
    cfg.original_max_positions = 8192;
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache) != FUSEDROPE_OK ||
        fusedrope_forward(cache, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL) != FUSEDROPE_OK ||
        fusedrope_backward(cache, FUSEDROPE_NEOX, NULL, &ty, &tz, NULL) != FUSEDROPE_OK) {
        fprintf(stderr, "downstream: %s\n", fusedrope_last_error());
        return 1;
    }
    for (int i = 0; i < S * B * H * D; i++)
        worst = fmax(worst, fabs(z[i] - x[i]));
    fusedrope_cache_destroy(cache);
    printf("downstream: libfusedrope %s, cuda %d, round trip error %g\n", fusedrope_version(),
           fusedrope_cuda_available(), worst);
    return worst < 1e-5 ? 0 : 1;
}
