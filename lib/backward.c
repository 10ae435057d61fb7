/* backward.c - the backward module: dx = rotation of dy by -angle, the
 * transpose of forward (fr_apply_call). */
#include "internal.h"

fusedrope_status fusedrope_backward(const fusedrope_cache *cache, fusedrope_style style,
                                    const fusedrope_positions *pos, const fusedrope_tensor *dy,
                                    const fusedrope_tensor *dx, void *stream)
{
    return fr_apply_call(cache, style, FR_CALL_BACKWARD, pos, dy, dx, NULL, NULL, stream);
}

/* dq_out, dk_out: the gradients of forward_qk's outputs (read); dq_in,
 * dk_in: those of its inputs (written). */
fusedrope_status fusedrope_backward_qk(const fusedrope_cache *cache, fusedrope_style style,
                                       const fusedrope_positions *pos,
                                       const fusedrope_tensor *dq_out, const fusedrope_tensor *dq_in,
                                       const fusedrope_tensor *dk_out, const fusedrope_tensor *dk_in,
                                       void *stream)
{
    return fr_apply_call(cache, style, FR_CALL_BACKWARD_QK, pos, dq_out, dq_in, dk_out, dk_in,
                         stream);
}
