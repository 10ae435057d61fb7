/*
 * norm_math.h - the fused RMSNorm's arithmetic that both backends must
 * perform identically (gcc builds lib/cpu_norm.c from it, nvcc
 * kernels/cuda_norm_*.cu); fusedrope_norm_forward_qk(3) states the contract.
 *
 * Row sums (sum of x^2 in the forward, of dn*n in the backward) over the
 * head_dim channels of a row, in float32: 32 partial sums, p[l] adding the
 * terms of channels l, l+32, l+64, ... in that order starting from 0.0f,
 * then the fixed tree p[l] += p[l + off] for off = 16, 8, 4, 2, 1; the sum
 * is p[0].  A warp of 32 lanes follows it with a butterfly (a + b == b + a
 * in IEEE arithmetic, so every lane gets p[0]'s bits), one thread with a
 * loop, a vector unit with four 8-wide or two 16-wide accumulators.
 */
#ifndef FUSEDROPE_NORM_MATH_H
#define FUSEDROPE_NORM_MATH_H

#include <math.h>
#include <stdint.h>

#include "rope_math.h"

/* The tree over the 32 partial sums (p is clobbered). */
FR_HD float fr_norm_tree32(float *p)
{
    for (int off = 16; off >= 1; off /= 2)
        for (int l = 0; l < off; l++)
            p[l] = p[l] + p[l + off];
    return p[0];
}

/* mean = sum / head_dim, rounded to float.  For a power-of-two head_dim
 * (every model's) it is the product with 1 / head_dim, which is exact: both
 * operations round the same real number, so the bits are the division's, and
 * a multiplication is one instruction where the GPU's IEEE division is a
 * few dozen (a row kernel's largest per-row cost after its rotations).  The
 * reciprocal 2^-k is built from its exponent bits: nvcc does not fold
 * __fdiv_rn(1, 128), and computed it on every row. */
FR_HD float fr_norm_mean(float sum, int64_t head_dim)
{
    if ((head_dim & (head_dim - 1)) == 0) {
#ifdef __CUDA_ARCH__
        const int k = __ffsll(head_dim) - 1;
        return __fmul_rn(sum, fr_u2f((uint32_t)(127 - k) << 23));
#else
        const int k = __builtin_ctzll((unsigned long long)head_dim);
        return sum * fr_u2f((uint32_t)(127 - k) << 23);
#endif
    }
#ifdef __CUDA_ARCH__
    return __fdiv_rn(sum, (float)head_dim);
#else
    return sum / (float)head_dim;
#endif
}

/* rstd = 1 / sqrt(sum / head_dim + eps), each operation rounded to float
 * (IEEE division and square root on the GPU too, never rsqrt).  On the GPU
 * the division is the IEEE reciprocal (rcp.rn: 1 / s rounded to nearest,
 * the same float as the division's by definition; its code skips the
 * division's numerator checks). */
FR_HD float fr_norm_rstd(float sum, int64_t head_dim, float eps)
{
#ifdef __CUDA_ARCH__
    return __frcp_rn(__fsqrt_rn(__fadd_rn(fr_norm_mean(sum, head_dim), eps)));
#else
    return 1.0f / sqrtf(fr_norm_mean(sum, head_dim) + eps);
#endif
}

/* Rounding modes (fusedrope_norm_rounding's values). */
enum { FR_ROUND_ONCE = 0, FR_ROUND_LLAMA = 1, FR_ROUND_GEMMA = 2 };

/* fr_bf16_to_float(fr_float_to_bf16(v)), bit for bit, without leaving
 * 32-bit lanes (a vector loop then needs no packing). */
FR_HD float fr_norm_round_bf16(float v)
{
    const uint32_t u = fr_f2u(v);
    const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return fr_u2f(nan ? (u & 0xffff0000u) | 0x00400000u : rounded);
}

/* v rounded to the tensors' dtype (0 float32, 1 float16, 2 bfloat16), as a float. */
FR_HD float fr_norm_round(float v, int dt)
{
    return dt == 1 ? fr_half_to_float(fr_float_to_half(v))
         : dt == 2 ? fr_norm_round_bf16(v) : v;
}

/* The value a channel enters the rotation with, into y: n = x * rstd, then
 * the weight wf (w, 1 + w, or 1) as the rounding mode says; ROUND(v, dt)
 * is v rounded to dtype dt as a float: fr_norm_round, or a backend's exact
 * equivalent (the CPU's vector rows, lib/cpu_norm_avx2.h nv_value8 and
 * lib/cpu_norm_avx512.c n5_value16; the CUDA kernels' conversions,
 * kernels/cuda_norm_forward.cu norm_value2).  x, rstd and wf may be floats,
 * vectors of floats (GCC's vector operators) or pairs (norm_value2's Two). */
#define FR_NORM_VALUE(y, x, rstd, wf, rounding, dt, ROUND)                                \
    do {                                                                                  \
        if ((rounding) == FR_ROUND_LLAMA)                                                 \
            (y) = ROUND(ROUND((x) * (rstd), dt) * (wf), dt);                              \
        else if ((rounding) == FR_ROUND_GEMMA)                                            \
            (y) = ROUND((x) * (rstd) * (wf), dt);                                         \
        else                                                                              \
            (y) = (x) * (rstd) * (wf);                                                    \
    } while (0)

FR_HD float fr_norm_value(float x, float rstd, float wf, int rounding, int dt)
{
    float y;
    FR_NORM_VALUE(y, x, rstd, wf, rounding, dt, fr_norm_round);
    return y;
}

/* The weight factor w' of channel c: weight kind 0 (none) 1, 1 (w) w, 2 (1 + w) 1 + w. */
FR_HD float fr_norm_wf(int kind, float w)
{
    return kind == 0 ? 1.0f : kind == 1 ? w : 1.0f + w;
}

#endif /* FUSEDROPE_NORM_MATH_H */
