/* cuda_stub.c - the CUDA backend's entry points in a build without CUDA. */
#include "internal.h"

static fusedrope_status no_cuda(void)
{
    return fr_fail(FUSEDROPE_ERR_UNSUPPORTED, "libfusedrope was built without CUDA");
}

int fr_cuda_device_present(void)
{
    return 0;
}

fusedrope_status fr_cuda_cache_upload(fusedrope_cache *cache)
{
    (void)cache;
    return no_cuda();
}

fusedrope_status fr_cuda_cache_download(const fusedrope_cache *cache, float *cos, float *sin)
{
    (void)cache, (void)cos, (void)sin;
    return no_cuda();
}

void fr_cuda_cache_release(fusedrope_cache *cache)
{
    (void)cache;
}

fusedrope_status fr_cuda_cache_check(const fusedrope_cache *cache, void *stream)
{
    (void)cache, (void)stream;
    return no_cuda();
}

/* Without CUDA every pointer is host memory. */
int fr_cuda_is_device_pointer(const void *p)
{
    (void)p;
    return 0;
}

fusedrope_status fr_cuda_apply(const fr_apply_args *args)
{
    (void)args;
    return no_cuda();
}
