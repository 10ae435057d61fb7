/* backward.c - the backward module: dx = rotation of dy by -angle, the
 * transpose of forward. */
#include "internal.h"

fusedrope_status fusedrope_backward(const fusedrope_cache *cache, fusedrope_style style,
                                    const fusedrope_positions *pos, const fusedrope_tensor *dy,
                                    const fusedrope_tensor *dx, void *stream)
{
    static const char *const names[4] = { "dy", "dx", "", "" };
    const fusedrope_tensor *in[2] = { dy, 0 }, *out[2] = { dx, 0 };
    return fr_apply(cache, style, -1.0f, pos, 1, in, out, names, stream);
}

fusedrope_status fusedrope_backward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                       const fusedrope_positions *pos,
                                       const fusedrope_tensor *dq_out, const fusedrope_tensor *dq_in,
                                       const fusedrope_tensor *dk_out, const fusedrope_tensor *dk_in,
                                       void *stream)
{
    static const char *const names[4] = { "dq_out", "dq_in", "dk_out", "dk_in" };
    const fusedrope_tensor *in[2] = { dq_out, dk_out }, *out[2] = { dq_in, dk_in };
    return fr_apply(cache, style, -1.0f, pos, 2, in, out, names, stream);
}
