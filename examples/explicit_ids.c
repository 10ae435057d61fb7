/* explicit_ids.c: a position per token, forward and backward on q and k. */
#include <math.h>
#include <stdio.h>
#include <fusedrope.h>

/* q[B][S][HQ][D] and k[B][S][HK][D], bshd. */
enum { B = 2, S = 4, HQ = 4, HK = 1, D = 16, NQ = B * S * HQ * D, NK = B * S * HK * D };

static float q[NQ], k[NK], qy[NQ], ky[NK], qr[NQ], kr[NK];

/* Elements of x rotated into y at ids[token], against a double rotation. */
static int check(const float *x, const float *y, int n, int heads, const int64_t *ids)
{
    int bad = 0;
    for (int e = 0; e < n; e++) {
        int c = e % D, i = c % (D / 2);
        double ang = ids[e / (heads * D)] * pow(500000.0, -2.0 * i / D);
        double a = x[e - c + i], b = x[e - c + i + D / 2];
        double want = c < D / 2 ? a * cos(ang) - b * sin(ang) : b * cos(ang) + a * sin(ang);
        bad += fabs(y[e] - want) > 1e-6 * (1 + fabs(a) + fabs(b));
    }
    return bad;
}

int main(void)
{
    /* Row b of ids is batch entry b: a prompt, and a speculative tree whose
     * two candidates share position 12. */
    const int64_t ids[B * S] = {0, 1, 2, 3, 10, 11, 12, 12};
    fusedrope_cache_config cfg;
    fusedrope_cache *cache = NULL;
    fusedrope_positions pos;
    fusedrope_tensor tq, tk, tqy, tky, tqr, tkr;
    int bad;

    for (int e = 0; e < NQ; e++)
        q[e] = (float)((e * 13 % 53) - 26) / 26;
    for (int e = 0; e < NK; e++)
        k[e] = (float)((e * 17 % 59) - 29) / 29;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, 64, 500000.0);
    tq = fusedrope_tensor_bshd(q, FUSEDROPE_FLOAT32, B, S, HQ, D);
    tqy = fusedrope_tensor_bshd(qy, FUSEDROPE_FLOAT32, B, S, HQ, D);
    tqr = fusedrope_tensor_bshd(qr, FUSEDROPE_FLOAT32, B, S, HQ, D);
    tk = fusedrope_tensor_bshd(k, FUSEDROPE_FLOAT32, B, S, HK, D);
    tky = fusedrope_tensor_bshd(ky, FUSEDROPE_FLOAT32, B, S, HK, D);
    tkr = fusedrope_tensor_bshd(kr, FUSEDROPE_FLOAT32, B, S, HK, D);
    fusedrope_positions_init(&pos);
    pos.ids = ids; /* ids[b * S + s], whatever the strides */
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache) ||
        fusedrope_forward_qk(cache, FUSEDROPE_NEOX, &pos, &tq, &tqy, &tk, &tky, NULL) ||
        /* backward of y gives x back: the rotation is orthogonal */
        fusedrope_backward_qk(cache, FUSEDROPE_NEOX, &pos, &tqy, &tqr, &tky, &tkr, NULL)) {
        fprintf(stderr, "%s\n", fusedrope_last_error());
        fusedrope_cache_destroy(cache); /* NULL if creation failed: a no-op */
        return 1;
    }
    fusedrope_cache_destroy(cache);
    bad = check(q, qy, NQ, HQ, ids) + check(k, ky, NK, HK, ids);
    for (int e = 0; e < NQ; e++)
        bad += fabs(qr[e] - q[e]) > 1e-6;
    for (int e = 0; e < NK; e++)
        bad += fabs(kr[e] - k[e]) > 1e-6;
    printf("%d bad elements\n", bad);
    return bad != 0;
}
