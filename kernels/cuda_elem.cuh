/*
 * cuda_elem.cuh - the kernels' element codecs, one place for both kernel
 * files (kernels/cuda_apply.cu, kernels/cuda_norm_*.cu): the dtypes' numbers,
 * float <-> element conversions (Elem) and 16-byte chunks of elements
 * (Chunk, ld16, st16).  Included inside each file's anonymous namespace,
 * after cuda_emu.h or the CUDA headers, and rope_math.h.
 */
#ifndef FUSEDROPE_CUDA_ELEM_CUH
#define FUSEDROPE_CUDA_ELEM_CUH

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

template <int DT> struct Elem;
template <> struct Elem<DT_F32> {
    typedef float T;
    static __device__ __forceinline__ float to_f(float v) { return v; }
    static __device__ __forceinline__ float from_f(float f) { return f; }
};
/*
 * The 16-bit conversions.  rope_math.h's converters define the results; on
 * the GPU the hardware's round-to-nearest-even conversions (one instruction
 * per pair of values instead of about seven per value) give the same bits
 * for every value the kernels convert:
 *   - widening half/bfloat16 -> float is exact both ways (NaN inputs only
 *     ever produce NaN results, see below);
 *   - narrowing float -> bfloat16 or half of a non-NaN value is the same
 *     IEEE rounding (subnormals and overflow to Inf included);
 *   - a NaN the kernels narrow is the result of float arithmetic, which the
 *     GPU always returns as the canonical 0x7fffffff: fr_float_to_bf16 and
 *     the hardware both give 0x7fff; for half, fr_float_to_half gives 0x7e00
 *     and the hardware 0x7fff, so half NaNs go through fr_float_to_half.
 * FR_CUDA_SOFT_CVT=1 builds the kernels with rope_math.h's converters only.
 */
#ifndef FR_CUDA_SOFT_CVT
#define FR_CUDA_SOFT_CVT 0
#endif

template <> struct Elem<DT_F16> {
    typedef uint16_t T;
    static __device__ __forceinline__ float to_f(uint16_t v)
    {
#if FR_CUDA_SOFT_CVT
        return fr_half_to_float(v);
#else
        return __half2float(__ushort_as_half(v));
#endif
    }
    static __device__ __forceinline__ uint16_t from_f(float f)
    {
#if FR_CUDA_SOFT_CVT
        return fr_float_to_half(f);
#else
        /* a NaN here is the GPU's canonical positive one: fr_float_to_half
         * makes it 0x7e00; a select, not a branch, keeps the loop straight */
        const uint16_t h = __half_as_ushort(__float2half_rn(f));
        return f != f ? (uint16_t)0x7e00u : h;
#endif
    }
    /* (lo, hi) packed into one word, a NaN as some NaN (for values that
     * are only widened again and enter float arithmetic) */
    static __device__ __forceinline__ uint32_t from_f2_any_nan(float lo, float hi)
    {
#if FR_CUDA_SOFT_CVT
        return (uint32_t)from_f(lo) | ((uint32_t)from_f(hi) << 16);
#else
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
#endif
    }
    /* (lo, hi) packed into one word */
    static __device__ __forceinline__ uint32_t from_f2(float lo, float hi)
    {
        uint32_t w = from_f2_any_nan(lo, hi);
#if !FR_CUDA_SOFT_CVT
        w = lo != lo ? (w & 0xffff0000u) | 0x7e00u : w;
        w = hi != hi ? (w & 0x0000ffffu) | 0x7e000000u : w;
#endif
        return w;
    }
};
template <> struct Elem<DT_BF16> {
    typedef uint16_t T;
    static __device__ __forceinline__ float to_f(uint16_t v) { return fr_bf16_to_float(v); }
    static __device__ __forceinline__ uint16_t from_f(float f)
    {
#if FR_CUDA_SOFT_CVT
        return fr_float_to_bf16(f);
#else
        return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
    }
    static __device__ __forceinline__ uint32_t from_f2(float lo, float hi)
    {
#if FR_CUDA_SOFT_CVT
        return (uint32_t)from_f(lo) | ((uint32_t)from_f(hi) << 16);
#else
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
#endif
    }
    /* from_f2: its NaNs are fr_float_to_bf16's already */
    static __device__ __forceinline__ uint32_t from_f2_any_nan(float lo, float hi)
    {
        return from_f2(lo, hi);
    }
};

/* ------------------------------------------------------------ 16-byte chunks */

template <int DT> struct Chunk {
    typedef typename Elem<DT>::T T;
    static constexpr int E = 16 / (int)sizeof(T); /* elements per chunk */

    static __device__ __forceinline__ void unpack(const uint4 v, float *f)
    {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        if constexpr (DT == DT_F32) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                f[k] = fr_u2f(w[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++)
                f[k] = Elem<DT>::to_f((T)(uint16_t)(w[k >> 1] >> ((k & 1) * 16)));
        }
    }
    static __device__ __forceinline__ uint4 pack(const float *f)
    {
        uint32_t w[4];
        if constexpr (DT == DT_F32) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                w[k] = fr_f2u(f[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++)
                w[k] = Elem<DT>::from_f2(f[2 * k], f[2 * k + 1]);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

__device__ __forceinline__ uint4 ld16(const void *p) { return *(const uint4 *)p; }
__device__ __forceinline__ void st16(void *p, uint4 v) { *(uint4 *)p = v; }

#endif /* FUSEDROPE_CUDA_ELEM_CUH */
