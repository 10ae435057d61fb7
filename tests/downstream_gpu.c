/*
 * downstream_gpu.c - a user's program on a machine with a GPU, built with
 * `cc downstream_gpu.c $(pkg-config --cflags --libs fusedrope)` plus the CUDA
 * include directory for cudaMalloc.  Runs forward and backward on device
 * memory and checks the GPU bytes against the CPU library's, forward and
 * backward (bit for bit: both backends share one float32 recipe).
 */
#include <cuda_runtime.h>
#include <fusedrope.h>
#include <stdio.h>
#include <string.h>

enum { S = 300, B = 2, H = 8, D = 128, N = S * B * H * D };

static int fail(const char *what)
{
    fprintf(stderr, "downstream_gpu: %s: %s\n", what, fusedrope_last_error());
    return 1;
}

int main(void)
{
    static float x[N], y_cpu[N], z_cpu[N], y_gpu[N], z_gpu[N];
    fusedrope_cache_config cfg;
    fusedrope_cache *cpu, *gpu;
    float *dx, *dy, *dz;
    fusedrope_tensor tx, ty, tz;

    if (!fusedrope_cuda_available()) {
        printf("downstream_gpu: no CUDA device\n");
        return 77;
    }
    for (int i = 0; i < N; i++)
        x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_YARN, D, S, 10000.0);
    cfg.factor = 4;
    cfg.original_max_positions = 64;
    if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cpu) ||
        fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CUDA, &gpu))
        return fail("cache");
    if (cudaMalloc((void **)&dx, sizeof x) || cudaMalloc((void **)&dy, sizeof x) ||
        cudaMalloc((void **)&dz, sizeof x) ||
        cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice))
        return fail("cuda allocation");
    tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, S, B, H, D);
    ty = fusedrope_tensor_sbhd(y_cpu, FUSEDROPE_FLOAT32, S, B, H, D);
    tz = fusedrope_tensor_sbhd(z_cpu, FUSEDROPE_FLOAT32, S, B, H, D);
    if (fusedrope_forward(cpu, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL) ||
        fusedrope_backward(cpu, FUSEDROPE_NEOX, NULL, &ty, &tz, NULL))
        return fail("cpu forward/backward");
    tx.data = dx;
    ty.data = dy;
    tz = fusedrope_tensor_sbhd(dz, FUSEDROPE_FLOAT32, S, B, H, D);
    if (fusedrope_forward(gpu, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL) ||
        fusedrope_backward(gpu, FUSEDROPE_NEOX, NULL, &ty, &tz, NULL) ||
        fusedrope_cache_check(gpu, NULL))
        return fail("gpu forward/backward");
    if (cudaMemcpy(y_gpu, dy, sizeof x, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(z_gpu, dz, sizeof x, cudaMemcpyDeviceToHost))
        return fail("cuda copy");
    if (memcmp(y_gpu, y_cpu, sizeof x) || memcmp(z_gpu, z_cpu, sizeof x)) {
        fprintf(stderr, "downstream_gpu: GPU %s differs from the CPU's\n",
                memcmp(y_gpu, y_cpu, sizeof x) ? "forward" : "backward");
        return 1;
    }
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dz);
    fusedrope_cache_destroy(cpu);
    fusedrope_cache_destroy(gpu);
    printf("downstream_gpu: forward and backward on the GPU bit-identical to the CPU\n");
    return 0;
}
