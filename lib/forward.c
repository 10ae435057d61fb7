/* forward.c - the forward module: y = rotation of x by +angle. */
#include "internal.h"

fusedrope_status fusedrope_forward(const fusedrope_cache *cache, fusedrope_style style,
                                   const fusedrope_positions *pos, const fusedrope_tensor *x,
                                   const fusedrope_tensor *y, void *stream)
{
    static const char *const names[4] = { "x", "y", "", "" };
    const fusedrope_tensor *in[2] = { x, 0 }, *out[2] = { y, 0 };
    return fr_apply(cache, style, 1.0f, pos, 1, in, out, names, stream);
}

fusedrope_status fusedrope_forward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                      const fusedrope_positions *pos,
                                      const fusedrope_tensor *q_in, const fusedrope_tensor *q_out,
                                      const fusedrope_tensor *k_in, const fusedrope_tensor *k_out,
                                      void *stream)
{
    static const char *const names[4] = { "q_in", "q_out", "k_in", "k_out" };
    const fusedrope_tensor *in[2] = { q_in, k_in }, *out[2] = { q_out, k_out };
    return fr_apply(cache, style, 1.0f, pos, 2, in, out, names, stream);
}
