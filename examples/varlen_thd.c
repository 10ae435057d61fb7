/* varlen_thd.c: packed variable-length sequences (THD), GLM-4's partial
 * interleaved rotation. */
#include <math.h>
#include <stdio.h>
#include <fusedrope.h>

/* Three sequences of 3, 1 and 4 tokens packed into x[T][H][D]; the first
 * R = D/2 channels of each head are rotated (partial_rotary_factor 0.5). */
enum { T = 8, H = 2, D = 32, R = D / 2, N = T * H * D };

int main(void)
{
    static float x[N], y[N];
    const int32_t cu_seqlens[] = {0, 3, 4, 8};
    const int pos_of[T] = {0, 1, 2, 0, 0, 1, 2, 3}; /* index in own sequence */
    fusedrope_cache_config cfg;
    fusedrope_cache *cache = NULL;
    fusedrope_positions pos;
    fusedrope_tensor tx, ty;
    int bad = 0;

    for (int e = 0; e < N; e++)
        x[e] = (float)((e * 29 % 97) - 48) / 48;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, R, 0, 10000.0);
    tx = fusedrope_tensor_thd(x, FUSEDROPE_FLOAT32, T, H, D);
    ty = fusedrope_tensor_thd(y, FUSEDROPE_FLOAT32, T, H, D);
    fusedrope_positions_init(&pos);
    pos.cu_seqlens = cu_seqlens;
    pos.num_seqs = 3;
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache) ||
        fusedrope_forward(cache, FUSEDROPE_INTERLEAVED, &pos, &tx, &ty, NULL)) {
        fprintf(stderr, "%s\n", fusedrope_last_error());
        fusedrope_cache_destroy(cache); /* NULL if creation failed: a no-op */
        return 1;
    }
    fusedrope_cache_destroy(cache);

    for (int e = 0; e < N; e++) {
        int t = e / (H * D), c = e % D, i = c / 2;
        double ang = pos_of[t] * pow(10000.0, -2.0 * i / R), a, b, want;
        if (c >= R) { /* past rot_dim: copied */
            bad += y[e] != x[e];
            continue;
        }
        a = x[e - c + 2 * i];
        b = x[e - c + 2 * i + 1];
        want = c % 2 == 0 ? a * cos(ang) - b * sin(ang) : b * cos(ang) + a * sin(ang);
        bad += fabs(y[e] - want) > 1e-6 * (1 + fabs(a) + fabs(b));
    }
    printf("%d bad elements\n", bad);
    return bad != 0;
}
