/*
 * cxx_main.cc - a C++11 program calling the installed library directly
 * (built with -std=c++11 -Wall -Wextra -pedantic -Werror): fusedrope.h must
 * compile as C++ and link with C linkage.
 */
#include <fusedrope.h>

#include <cstdio>

#include "consumer.h"

namespace {

int forward(int bf16, const void *x, void *y, int64_t s, int64_t b, int64_t h, int64_t d,
            int rot_dim, double theta)
{
    const fusedrope_dtype dt = bf16 ? FUSEDROPE_BFLOAT16 : FUSEDROPE_FLOAT32;
    const fusedrope_tensor tx = fusedrope_tensor_sbhd(const_cast<void *>(x), dt, s, b, h, d);
    const fusedrope_tensor ty = fusedrope_tensor_sbhd(y, dt, s, b, h, d);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache = nullptr;

    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, rot_dim, s, theta);
    fusedrope_status st = fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &cache);
    if (st == FUSEDROPE_OK) {
        st = fusedrope_forward(cache, FUSEDROPE_NEOX, nullptr, &tx, &ty, nullptr);
        fusedrope_cache_destroy(cache);
    }
    if (st != FUSEDROPE_OK) {
        std::fprintf(stderr, "c++11: %s: %s\n", fusedrope_status_string(st),
                     fusedrope_last_error());
        return -1;
    }
    return 0;
}

} // namespace

int main()
{
    std::printf("c++11: libfusedrope %s\n", fusedrope_version());
    return consumer_check("c++11", forward) ? 1 : 0;
}
