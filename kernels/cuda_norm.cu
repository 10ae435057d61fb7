/*
 * cuda_norm.cu - the CUDA backend of the fused RMSNorm + RoPE.  Not written
 * yet: a CUDA cache's norm calls are refused (fusedrope_norm_forward_qk(3)).
 */
#include "internal.h"

extern "C" fusedrope_status fr_cuda_norm_forward(const fr_norm_args *args)
{
    (void)args;
    return fr_fail(FUSEDROPE_ERR_UNSUPPORTED,
                   "the fused norm has no CUDA kernels in this version; use a CPU cache");
}

extern "C" fusedrope_status fr_cuda_norm_backward(const fr_norm_args *args)
{
    (void)args;
    return fr_fail(FUSEDROPE_ERR_UNSUPPORTED,
                   "the fused norm has no CUDA kernels in this version; use a CPU cache");
}
