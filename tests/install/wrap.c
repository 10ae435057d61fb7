/*
 * wrap.c - a plugin (or a binding's extension module) built on libfusedrope:
 * tests/install/run.sh links it into a shared object from the installed
 * static archive (which must therefore be PIC) and from the installed shared
 * library, and compiles it as strict C99 for the C consumer.
 */
#include "wrap.h"

#include <fusedrope.h>
#include <stdio.h>

int wrap_rope_forward(int bf16, const void *x, void *y, int64_t s, int64_t b, int64_t h,
                      int64_t d, int rot_dim, double theta)
{
    fusedrope_dtype dt = bf16 ? FUSEDROPE_BFLOAT16 : FUSEDROPE_FLOAT32;
    fusedrope_tensor tx = fusedrope_tensor_sbhd((void *)x, dt, s, b, h, d);
    fusedrope_tensor ty = fusedrope_tensor_sbhd(y, dt, s, b, h, d);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_status st;

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, rot_dim, s, theta);
    st = fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache);
    if (st == FUSEDROPE_OK) {
        st = fusedrope_forward(cache, FUSEDROPE_NEOX, NULL, &tx, &ty, NULL);
        fusedrope_cache_destroy(cache);
    }
    if (st != FUSEDROPE_OK) {
        fprintf(stderr, "wrap: %s: %s\n", fusedrope_status_string(st), fusedrope_last_error());
        return -1;
    }
    return 0;
}

const char *wrap_rope_version(void)
{
    return fusedrope_version();
}
