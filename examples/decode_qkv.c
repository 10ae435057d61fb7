/* decode_qkv.c: one decode step on a packed QKV projection output. */
#include <math.h>
#include <stdio.h>
#include <fusedrope.h>
#ifdef EXAMPLE_CUDA
#include <cuda_runtime.h>
#endif

/* qkv[B][1][ROW]: per token HQ query heads, then HK key and HK value heads. */
enum { B = 3, HQ = 4, HK = 2, D = 64, ROW = (HQ + 2 * HK) * D, N = B * ROW };

/* Rotates q and k of qkv in place, token b at position len[b] (its sequence's
 * KV-cache length).  qkv and len live on the cache's device. */
static fusedrope_status step(const fusedrope_cache *cache, float *qkv,
                             const int64_t *len)
{
    fusedrope_positions pos;
    fusedrope_tensor q = fusedrope_tensor_bshd(qkv, FUSEDROPE_FLOAT32, B, 1, HQ, D);
    fusedrope_tensor k = q;

    q.stride_batch = q.stride_seq = k.stride_batch = k.stride_seq = ROW;
    k.data = qkv + HQ * D; /* views of one buffer: no copy */
    k.heads = HK;
    fusedrope_positions_init(&pos);
    pos.offsets = len;
    return fusedrope_forward_qk(cache, FUSEDROPE_NEOX, &pos, &q, &q, &k, &k, NULL);
}

/* Checks every element against the rotation computed here in double. */
static int check(const float *in, const float *out, const int64_t *len)
{
    int bad = 0;
    for (int e = 0; e < N; e++) {
        int b = e / ROW, h = e % ROW / D, c = e % D, i = c % (D / 2);
        double ang = len[b] * pow(10000.0, -2.0 * i / D), a, o, want;
        if (h >= HQ + HK) { /* v: not touched */
            bad += out[e] != in[e];
            continue;
        }
        a = in[e - c + i];
        o = in[e - c + i + D / 2];
        want = c < D / 2 ? a * cos(ang) - o * sin(ang) : o * cos(ang) + a * sin(ang);
        bad += fabs(out[e] - want) > 1e-6 * (1 + fabs(a) + fabs(o));
    }
    return bad;
}

int main(void)
{
    static float in[N], qkv[N];
    const int64_t len[B] = {7, 100, 4095};
    fusedrope_cache_config cfg;
    fusedrope_cache *cache = NULL;
    int bad;

    for (int e = 0; e < N; e++)
        in[e] = qkv[e] = (float)((e * 37 % 101) - 50) / 50;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, 4096, 10000.0);
    /* Host buffers: a CPU cache (AUTO would pick CUDA where a GPU is). */
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache) ||
        step(cache, qkv, len)) {
        fprintf(stderr, "cpu: %s\n", fusedrope_last_error());
        fusedrope_cache_destroy(cache); /* NULL if creation failed: a no-op */
        return 1;
    }
    fusedrope_cache_destroy(cache);
    bad = check(in, qkv, len);
    printf("cpu: %d bad elements\n", bad);
#ifdef EXAMPLE_CUDA
    if (fusedrope_cuda_available()) { /* the same step on device buffers */
        static float out[N];
        float *d_qkv = NULL;
        int64_t *d_len = NULL;
        int failed = 1;
        cache = NULL;
        if (cudaMalloc((void **)&d_qkv, sizeof in) != cudaSuccess ||
            cudaMalloc((void **)&d_len, sizeof len) != cudaSuccess ||
            cudaMemcpy(d_qkv, in, sizeof in, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(d_len, len, sizeof len, cudaMemcpyHostToDevice) != cudaSuccess)
            fprintf(stderr, "cuda: could not set up the device buffers\n");
        else if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CUDA, &cache) ||
                 step(cache, d_qkv, d_len) || fusedrope_cache_check(cache, NULL))
            fprintf(stderr, "cuda: %s\n", fusedrope_last_error());
        else if (cudaMemcpy(out, d_qkv, sizeof out, cudaMemcpyDeviceToHost) != cudaSuccess)
            fprintf(stderr, "cuda: could not copy the result back\n");
        else
            failed = 0;
        fusedrope_cache_destroy(cache);
        cudaFree(d_qkv); /* cudaFree(NULL) is a no-op */
        cudaFree(d_len);
        if (failed)
            return 1;
        for (int e = 0; e < N; e++) /* CPU and GPU agree to the bit */
            bad += out[e] != qkv[e];
        printf("cuda: %d bad elements in all\n", bad);
    } else {
        printf("cuda: no device, skipped\n");
    }
#endif
    return bad != 0;
}
