/*
 * cuda_stub.c - the CUDA backend's entry points in a build without CUDA:
 * no device is ever present, and everything that would need one says so.
 */
#include "internal.h"

int fr_cuda_device_present(void)
{
    return 0;
}

int fr_cuda_pointer_kind(const void *p, int *device)
{
    (void)p;
    *device = -1;
    return FR_PTR_HOST;
}

fusedrope_status fr_cuda_cache_upload(fusedrope_cache *cache)
{
    (void)cache;
    return fr_fail(FUSEDROPE_ERR_UNSUPPORTED,
                   "a CUDA cache was requested but libfusedrope was built without CUDA");
}

fusedrope_status fr_cuda_cache_download(const fusedrope_cache *cache, float *cos, float *sin)
{
    (void)cache;
    (void)cos;
    (void)sin;
    return fr_fail(FUSEDROPE_ERR_UNSUPPORTED,
                   "copying a CUDA table is impossible: libfusedrope was built without CUDA");
}

void fr_cuda_cache_release(fusedrope_cache *cache)
{
    (void)cache;
}

fusedrope_status fr_cuda_cache_check(const fusedrope_cache *cache, void *stream)
{
    (void)cache;
    (void)stream;
    return fr_fail(FUSEDROPE_ERR_UNSUPPORTED,
                   "fusedrope_cache_check on a CUDA cache: libfusedrope was built without CUDA");
}

/* Every launch entry point: unreachable through the API, which needs a CUDA
 * cache first, but each says why if reached. */
static fusedrope_status no_launch(void)
{
    return fr_fail(FUSEDROPE_ERR_UNSUPPORTED,
                   "a CUDA launch was requested but libfusedrope was built without CUDA");
}

fusedrope_status fr_cuda_apply(const fr_apply_args *args)
{
    (void)args;
    return no_launch();
}

fusedrope_status fr_cuda_norm_forward(const fr_norm_args *args)
{
    (void)args;
    return no_launch();
}

fusedrope_status fr_cuda_norm_backward(const fr_norm_args *args)
{
    (void)args;
    return no_launch();
}
