/*
 * cuda_index.cuh - the kernels' index arithmetic, one place for both kernel
 * files (kernels/cuda_apply.cu, kernels/cuda_norm_*.cu).  Included inside each
 * file's anonymous namespace, after cuda_emu.h or the CUDA headers.
 */
#ifndef FUSEDROPE_CUDA_INDEX_CUH
#define FUSEDROPE_CUDA_INDEX_CUH

/* q = a / d and r = a % d for a >= 0, d >= 1: in 32 bits when both fit, a
 * few instructions instead of the 64-bit division's call. */
__device__ __forceinline__ void divmod(int64_t a, int64_t d, int64_t *q, int64_t *r)
{
    if (((uint64_t)a | (uint64_t)d) <= UINT32_MAX) {
        const uint32_t q32 = (uint32_t)a / (uint32_t)d;
        *q = (int64_t)q32;
        *r = a - (int64_t)q32 * d;
    } else {
        *q = a / d;
        *r = a - *q * d;
    }
}

/*
 * The rules on THD's cu_seqlens that no token's position shows (DESIGN:
 * errors), checked on the device because the array lives there: its two
 * ends (fr_cu_ends_bad) by the launch's first thread, and its steps
 * (fr_cu_step_bad) spread over the whole launch, step i by the thread of
 * rank i (and every that many further), so each thread loads two entries
 * or none and a launch sees the whole array.  A wrong array raises the
 * flag; nothing else changes.  Before any barrier or shuffle in a kernel,
 * and none inside, so a thread that leaves the loop early diverges from
 * nothing.
 */
__device__ __forceinline__ void check_cu_seqlens(const fr_pos_args &pos, int64_t tokens, int *flag)
{
    if (flag == nullptr || pos.cu_seqlens == nullptr)
        return;
    const int64_t block = (int64_t)blockDim.x * blockDim.y * blockDim.z;
    const int64_t all = block * gridDim.x * gridDim.y * gridDim.z;
    const int64_t rank =
        (((int64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * block +
        ((int64_t)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    if (rank == 0 && fr_cu_ends_bad(&pos, tokens))
        *flag = 1;
    for (int64_t i = rank; i < pos.num_seqs; i += all)
        if (fr_cu_step_bad(&pos, i)) {
            *flag = 1;
            break;
        }
}

#endif
