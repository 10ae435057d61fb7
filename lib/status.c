/* status.c - status strings, the thread-local error detail, version, device probe. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char last_error[512];

fusedrope_status fr_fail(fusedrope_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *fusedrope_last_error(void)
{
    return last_error;
}

const char *fusedrope_status_string(fusedrope_status status)
{
    switch (status) {
    case FUSEDROPE_OK: return "success";
    case FUSEDROPE_ERR_INVALID: return "invalid argument";
    case FUSEDROPE_ERR_RANGE: return "out of range";
    case FUSEDROPE_ERR_NOMEM: return "out of memory";
    case FUSEDROPE_ERR_UNSUPPORTED: return "unsupported";
    case FUSEDROPE_ERR_CUDA: return "CUDA error";
    }
    return "unknown status";
}

#define FR_STR2(x) #x
#define FR_STR(x) FR_STR2(x)

const char *fusedrope_version(void)
{
    return FR_STR(FUSEDROPE_VERSION_MAJOR) "." FR_STR(FUSEDROPE_VERSION_MINOR) "."
        FR_STR(FUSEDROPE_VERSION_PATCH);
}

int fusedrope_version_number(void)
{
    return FUSEDROPE_VERSION_NUMBER;
}

int fusedrope_cuda_available(void)
{
    return fr_cuda_device_present();
}

const char *fr_dtype_name(fusedrope_dtype dtype)
{
    switch (dtype) {
    case FUSEDROPE_FLOAT32: return "float32";
    case FUSEDROPE_FLOAT16: return "float16";
    case FUSEDROPE_BFLOAT16: return "bfloat16";
    }
    return "not a fusedrope_dtype";
}

size_t fr_dtype_size(fusedrope_dtype dtype)
{
    switch (dtype) {
    case FUSEDROPE_FLOAT32: return 4;
    case FUSEDROPE_FLOAT16:
    case FUSEDROPE_BFLOAT16: return 2;
    }
    return 0;
}
