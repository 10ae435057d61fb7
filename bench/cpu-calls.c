/* A fixed number of CPU forward or backward calls on one shape, for
 * instruction counts (valgrind --tool=callgrind) and per-call timing of
 * small calls, where fusedrope-bench's verification and buffer rotation
 * would dominate a profile.
 *   cc -O2 -fopenmp -Iinclude bench/cpu-calls.c .libs/libfusedrope.a -lm -o cpu-calls
 *   ./cpu-calls S,B,H,D [dtype bf16|fp16|fp32] [style neox|interleaved]
 *               [op fwd|bwd] [calls N] [qk HK] [offsets] [sets N]
 * qk HK: forward_qk/backward_qk with H query and HK key heads.  offsets:
 * per-batch-entry start positions (a decode step).  sets: distinct buffer
 * sets the calls rotate through (1: the same buffers, cache-resident when
 * small).  Prints the median and minimum time per call. */
#include <fusedrope.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timing.h"

int main(int argc, char **argv)
{
    long long S, B, H, D, HK = 0;
    fusedrope_dtype dt = FUSEDROPE_BFLOAT16;
    fusedrope_style st = FUSEDROPE_NEOX;
    int bwd = 0, calls = 20, offsets = 0, sets = 1;
    size_t es = 2, nq, nk;
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_positions pos;
    int64_t *offs;
    double *t;

    if (argc < 2 || sscanf(argv[1], "%lld,%lld,%lld,%lld", &S, &B, &H, &D) != 4) {
        fprintf(stderr, "usage: %s S,B,H,D [dtype T] [style S] [op fwd|bwd] [calls N] "
                        "[qk HK] [offsets] [sets N]\n", argv[0]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "dtype")) {
            dt = !strcmp(v, "fp16") ? FUSEDROPE_FLOAT16
                 : !strcmp(v, "fp32") ? FUSEDROPE_FLOAT32 : FUSEDROPE_BFLOAT16;
            es = dt == FUSEDROPE_FLOAT32 ? 4 : 2;
            i++;
        } else if (!strcmp(a, "style")) {
            st = !strcmp(v, "interleaved") ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
            i++;
        } else if (!strcmp(a, "op")) {
            bwd = !strcmp(v, "bwd");
            i++;
        } else if (!strcmp(a, "calls")) {
            calls = atoi(v);
            i++;
        } else if (!strcmp(a, "qk")) {
            HK = atoll(v);
            i++;
        } else if (!strcmp(a, "sets")) {
            sets = atoi(v);
            i++;
        } else if (!strcmp(a, "offsets")) {
            offsets = 1;
        }
    }
    if (calls < 1 || sets < 1)
        return 2;
    nq = (size_t)(S * B * H * D);
    nk = (size_t)(S * B * HK * D);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)D, 8192 > S ? 8192 : S, 10000);
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache) != FUSEDROPE_OK) {
        fprintf(stderr, "cache: %s\n", fusedrope_last_error());
        return 1;
    }
    fusedrope_positions_init(&pos);
    offs = malloc((size_t)B * sizeof *offs);
    for (long long b = 0; b < B; b++)
        offs[b] = (b * 97) % 4096;
    if (offsets)
        pos.offsets = offs;
    {
        unsigned char **buf = malloc((size_t)sets * 4 * sizeof *buf);
        unsigned r = 12345;
        for (int s = 0; s < sets; s++)
            for (int j = 0; j < 4; j++) {
                const size_t n = (j < 2 ? nq : nk) * es;
                buf[4 * s + j] = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
                /* small finite values in every dtype: a random 64 KiB block,
                 * repeated (cheap under valgrind) */
                for (size_t i = 0; i < n && i < 65536; i++) {
                    r = r * 1103515245u + 12345u;
                    buf[4 * s + j][i] = (i % es == es - 1) ? 0x3c : (unsigned char)(r >> 16);
                }
                for (size_t i = 65536; i < n; i += 65536)
                    memcpy(buf[4 * s + j] + i, buf[4 * s + j], n - i < 65536 ? n - i : 65536);
            }
        t = malloc((size_t)calls * sizeof *t);
        for (int c = 0; c < calls; c++) {
            unsigned char **b = buf + 4 * (c % sets);
            fusedrope_tensor x = fusedrope_tensor_sbhd(b[0], dt, S, B, H, D);
            fusedrope_tensor y = fusedrope_tensor_sbhd(b[1], dt, S, B, H, D);
            fusedrope_tensor kx = fusedrope_tensor_sbhd(b[2], dt, S, B, HK, D);
            fusedrope_tensor ky = fusedrope_tensor_sbhd(b[3], dt, S, B, HK, D);
            fusedrope_status rc;
            const double t0 = bench_now();
            if (HK)
                rc = bwd ? fusedrope_backward_qk(cache, st, &pos, &x, &y, &kx, &ky, NULL)
                         : fusedrope_forward_qk(cache, st, &pos, &x, &y, &kx, &ky, NULL);
            else
                rc = bwd ? fusedrope_backward(cache, st, &pos, &x, &y, NULL)
                         : fusedrope_forward(cache, st, &pos, &x, &y, NULL);
            t[c] = bench_now() - t0;
            if (rc != FUSEDROPE_OK) {
                fprintf(stderr, "call: %s\n", fusedrope_last_error());
                return 1;
            }
        }
        qsort(t, (size_t)calls, sizeof *t, bench_cmp_double);
        printf("%lld,%lld,%lld,%lld qk %lld: %d calls, median %.3f us, min %.3f us\n", S, B, H, D,
               HK, calls, 1e6 * t[calls / 2], 1e6 * t[0]);
        for (int s = 0; s < 4 * sets; s++)
            free(buf[s]);
        free(buf);
    }
    free(t);
    free(offs);
    fusedrope_cache_destroy(cache);
    return 0;
}
