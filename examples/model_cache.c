/* model_cache.c: the caches of Llama 3.1 8B and gpt-oss from their
 * config.json values, checked against Hugging Face's formulas in double. */
#include <math.h>
#include <stdio.h>
#include <fusedrope.h>

#define PI 3.14159265358979323846

/* Rotates (1, 0) pairs at three positions and compares the outputs, the
 * table's cos and sin times the attention factor, with inv[] and attn. */
static int check(const char *name, const fusedrope_cache_config *cfg,
                 const double *inv, double attn)
{
    enum { S = 3, MAXD = 128 };
    static float x[S * MAXD], y[S * MAXD];
    const int d = cfg->rot_dim, half = d / 2;
    const int64_t ids[S] = {1, 4321, cfg->max_positions - 1};
    fusedrope_cache *cache = NULL;
    fusedrope_positions pos;
    fusedrope_tensor tx = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, 1, S, 1, d);
    fusedrope_tensor ty = fusedrope_tensor_bshd(y, FUSEDROPE_FLOAT32, 1, S, 1, d);
    int bad = 0;

    if (d > MAXD) { /* x and y hold heads of up to MAXD channels */
        fprintf(stderr, "%s: rot_dim %d > %d\n", name, d, MAXD);
        return 1;
    }
    for (int e = 0; e < S * d; e++)
        x[e] = e % d < half;
    fusedrope_positions_init(&pos);
    pos.ids = ids;
    if (fusedrope_cache_create(cfg, FUSEDROPE_DEVICE_CPU, &cache) ||
        fusedrope_forward(cache, FUSEDROPE_NEOX, &pos, &tx, &ty, NULL)) {
        fprintf(stderr, "%s: %s\n", name, fusedrope_last_error());
        fusedrope_cache_destroy(cache); /* NULL if creation failed: a no-op */
        return 1;
    }
    fusedrope_cache_destroy(cache);
    for (int s = 0; s < S; s++)
        for (int i = 0; i < half; i++) {
            double ang = ids[s] * inv[i];
            bad += fabs(y[s * d + i] - cos(ang) * attn) > 1e-6;
            bad += fabs(y[s * d + half + i] - sin(ang) * attn) > 1e-6;
        }
    printf("%s: %d bad values\n", name, bad);
    return bad;
}

int main(void)
{
    fusedrope_cache_config cfg;
    double inv[64], lo, hi;
    int bad;

    /* Llama 3.1 8B: head_dim 128, rope_theta 500000, max_position_embeddings
     * 131072, rope_scaling llama3: factor 8, low_freq_factor 1,
     * high_freq_factor 4, original_max_position_embeddings 8192. */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LLAMA3, 128, 131072, 500000.0);
    cfg.factor = 8.0;
    cfg.original_max_positions = 8192;
    for (int i = 0; i < 64; i++) {
        double f = pow(500000.0, -2.0 * i / 128), w = 2 * PI / f;
        double t = (8192 / w - 1.0) / (4.0 - 1.0);
        inv[i] = w < 8192 / 4.0 ? f : w > 8192 / 1.0 ? f / 8 : (1 - t) * f / 8 + t * f;
    }
    bad = check("llama-3.1", &cfg, inv, 1.0);

    /* gpt-oss: head_dim 64, rope_theta 150000, max_position_embeddings
     * 131072, rope_scaling yarn: factor 32, beta_fast 32, beta_slow 1,
     * original_max_position_embeddings 4096, truncate false. */
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, 64, 131072, 150000.0);
    cfg.factor = 32.0;
    cfg.original_max_positions = 4096;
    cfg.truncate = 0;
    lo = 64 * log(4096 / (2 * PI * 32)) / (2 * log(150000.0));
    hi = 64 * log(4096 / (2 * PI * 1)) / (2 * log(150000.0));
    for (int i = 0; i < 32; i++) {
        double f = pow(150000.0, -2.0 * i / 64);
        double r = fmin(fmax((i - lo) / (hi - lo), 0), 1);
        inv[i] = f / 32 * r + f * (1 - r);
    }
    bad += check("gpt-oss", &cfg, inv, 0.1 * log(32.0) + 1);
    return bad != 0;
}
