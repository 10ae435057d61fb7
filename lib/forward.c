/* forward.c - the forward module: y = rotation of x by +angle (fr_apply_call). */
#include "internal.h"

fusedrope_status fusedrope_forward(const fusedrope_cache *cache, fusedrope_style style,
                                   const fusedrope_positions *pos, const fusedrope_tensor *x,
                                   const fusedrope_tensor *y, void *stream)
{
    return fr_apply_call(cache, style, FR_CALL_FORWARD, pos, x, y, NULL, NULL, stream);
}

fusedrope_status fusedrope_forward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                      const fusedrope_positions *pos,
                                      const fusedrope_tensor *q_in, const fusedrope_tensor *q_out,
                                      const fusedrope_tensor *k_in, const fusedrope_tensor *k_out,
                                      void *stream)
{
    return fr_apply_call(cache, style, FR_CALL_FORWARD_QK, pos, q_in, q_out, k_in, k_out, stream);
}
