/*
 * cuda_apply.cu - the forward and backward kernels (one kernel: they differ
 * only in the sign of sin) and fr_cuda_apply, which picks a path and a launch
 * shape on the host and enqueues ONE launch per call, q and k together.
 *
 * Work decomposition.  A call is a set of tokens (batch x seq_len, or the
 * packed THD tokens) times a set of heads (q's heads, then k's heads for the
 * *_qk calls) times a set of "lanes" per head:
 *
 *   lanes [0, nc)        rotary lanes.  Vector NeoX path: one 16-byte chunk
 *                        of the first half and the matching chunk of the
 *                        second half.  Vector interleaved path: two 16-byte
 *                        chunks of whole pairs (chunk c and c + nc).  Scalar
 *                        path: one pair.
 *   lanes [nc, lanes)    pass-through lanes: 16 bytes of channels
 *                        [rot_dim, head_dim), copied when out of place (one
 *                        16-byte copy when the chunk is whole and the call is
 *                        on the vector path, element by element otherwise).
 *
 * The block is three-dimensional: threadIdx.x = lane, threadIdx.y = head
 * group, threadIdx.z = token within the block; blockIdx.y selects a range of
 * head groups and blockIdx.x a range of tokens (grid-stride over tokens,
 * walked in memory order).  A thread owns one lane of one token and the
 * heads g, g + G, g + 2G, ... (G = head groups in the grid): it computes the
 * position and loads cos/sin for its lane once per token, then reuses them
 * for all its heads, issuing the loads of U heads (two 16-byte loads each on
 * the vector paths) before any of their stores.  Heads per thread (1..8) and
 * the block shape follow the amount of work: decode-sized calls get one head
 * per thread and blocks small enough to reach every SM, prefill-sized calls
 * several heads per thread (fewer cos/sin loads, fewer threads to start).
 *
 * Paths (chosen per call on the host, for both tensors of a *_qk call):
 * vector when every data pointer is 16-byte aligned, every stride along a
 * dimension of extent > 1 is a multiple of 16 bytes, and the rotated part
 * splits into whole chunks (NeoX: (rot_dim/2)*elemsize % 16 == 0,
 * interleaved: rot_dim*elemsize % 16 == 0); scalar otherwise.  Each path is
 * its own kernel (3 dtypes x {scalar, NeoX vector, NeoX vector with one
 * group of heads per thread, interleaved vector}), so each gets its own
 * register budget.
 *
 * Every element offset is int64.  The per-element math and the position
 * rules are rope_math.h's, shared with the CPU backend; with -fmad=false the
 * two backends agree to the bit.
 *
 * With FR_CUDA_EMULATE defined (kernels/cuda_apply_emu.cc) the host C++
 * compiler builds this file and the kernels run on the CPU, one thread after
 * another (kernels/cuda_emu.h), for the tests that check them without a GPU.
 */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#ifdef FR_CUDA_EMULATE
#include "cuda_emu.h" /* a host build that runs the kernels on the CPU */
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "internal.h"
#include "cuda_util.cuh"
#endif
#include "cuda_device.cuh"

#ifdef FR_CUDA_EMULATE
/* Emulated, a test chooses the wide NeoX kernel (1) or the narrow one (0)
 * wherever a general NeoX launch asks wide_pays, or (2) as the device would
 * with the H200's register counts. */
extern "C" {
int fr_emu_neox_wide = 0;
}
#endif

namespace {

#include "cuda_elem.cuh"
#include "cuda_index.cuh"

/*
 * Tuning knobs (NVCCFLAGS=-DFR_CUDA_...=N); the defaults won the H100 sweeps
 * in bench/RESULTS.md, which also keeps what else was tried:
 *   FR_CUDA_U, FR_CUDA_U_INTER, FR_CUDA_U_NEOX
 *                              heads whose loads a thread issues before their
 *                              stores (the scalar kernel's lanes and the
 *                              NeoX kernels' pass-through lanes; the
 *                              interleaved kernel's lanes, its pass-through
 *                              ones too; NeoX lanes): more loads in flight
 *                              per lane, paid for in registers, which decide
 *                              how many blocks an SM holds (see the kernel).
 *                              U_INTER 4 is the one U=4 build's interleaved
 *                              kernel, 0.922 of a copy on the H200 where 2
 *                              gave 0.876 (bench/RESULTS.md, 2026-11-30);
 *                              that build's NeoX kernels lost, so the others
 *                              keep 2.
 *   FR_CUDA_U_NEOX_WIDE        the NeoX lanes' wider group (default 4; 0 or
 *                              at most FR_CUDA_U_NEOX: none), taken per launch
 *                              where the SM holds as many of its blocks as
 *                              of FR_CUDA_U_NEOX's (wide_pays, below).
 *   FR_CUDA_MAX_HPT            most heads per thread (cos/sin reuse).
 *   FR_CUDA_WAVES              heads per thread grow only while the grid keeps
 *                              this many waves of 2048 threads per SM.
 *   FR_CUDA_MAXNREG            unset: registers as ptxas likes (see the
 *                              kernel); N: an experimental cap.
 */
#ifndef FR_CUDA_U
#define FR_CUDA_U 2
#endif
#ifndef FR_CUDA_U_INTER
#define FR_CUDA_U_INTER 4
#endif
#ifndef FR_CUDA_U_NEOX
#define FR_CUDA_U_NEOX 2
#endif
#ifndef FR_CUDA_U_NEOX_WIDE
#define FR_CUDA_U_NEOX_WIDE 4
#endif
#ifndef FR_CUDA_MAX_HPT
#define FR_CUDA_MAX_HPT 8
#endif
#ifndef FR_CUDA_WAVES
#define FR_CUDA_WAVES 1
#endif
constexpr int U = FR_CUDA_U;
/* Largest block the launcher builds (and the kernels are compiled for). */
constexpr int MAX_BLOCK = 512;

/* Quiet NaN as rope_math.h's converters write it: what an out-of-table
 * token's rotated channels get. */
template <int DT> __device__ __forceinline__ uint32_t nan_word()
{
    return DT == DT_F32 ? 0x7fc00000u : DT == DT_F16 ? 0x7e007e00u : 0x7fc07fc0u;
}

struct KIo {
    const void *in;
    void *out;
    int64_t heads, head_dim;
    int64_t in_ss, in_sb, in_sh, out_ss, out_sb, out_sh;
    int64_t np;   /* pass-through lanes this tensor needs (0 in place) */
};

struct KParams {
    KIo io[2];
    fr_pos_args pos;
    const float *cos, *sin;  /* device table, or NULL: angles from inv_freq */
    const double *inv_freq;
    const int32_t *pair_map; /* device axes map (lib/axes.c), NULL for 1D rope */
    double attn;
    int *flag;               /* device address of the word to raise: the call's
                                range_status, or the cache's range flag */
    int64_t tokens, seq_len, batch, max_positions;
    int64_t heads0, heads;   /* q's heads; q's + k's heads */
    int64_t gtotal;          /* head groups in the grid: a thread's head stride */
    int64_t nc, lanes;       /* rotary lanes; rotary + pass-through lanes */
    int64_t half, rot_dim;
    int interleaved;
    int seq_major;           /* token t is (s = t / batch, b = t % batch): sbhd order */
    float sgn;
};


/* n consecutive floats of the table from p, 4n-byte aligned (n = 1, 2, 4, 8). */
template <int N>
__device__ __forceinline__ void load_row(const float *p, float *v)
{
    if (N >= 4) {
#pragma unroll
        for (int k = 0; k < N; k += 4) {
            float4 t = __ldg((const float4 *)(p + k));
            v[k] = t.x; v[k + 1] = t.y; v[k + 2] = t.z; v[k + 3] = t.w;
        }
    } else if (N == 2) {
        float2 t = __ldg((const float2 *)p);
        v[0] = t.x; v[1] = t.y;
    } else {
        v[0] = __ldg(p);
    }
}

/* A token's position on each of the cache's axes (p[0] only for 1D rope). */
struct TokPos {
    int64_t p[FUSEDROPE_MAX_AXES];
    /* by selects, not an index: an indexed array would live in local memory */
    __device__ __forceinline__ int64_t on(int a) const
    {
        return a == 0 ? p[0] : a == 1 ? p[1] : a == 2 ? p[2] : p[3];
    }
};

/* cos/sin of pairs [i0, i0 + N) of a token at tp: a table row, or computed
 * in double; with position axes, each pair's entry at its axis's position
 * and its frequency column (rope_math.h's map entry), as the CPU gathers. */
template <int N, bool AX>
__device__ __forceinline__ void cos_sin(const KParams &P, const TokPos &tp, int64_t i0, float *c,
                                        float *s)
{
    if constexpr (AX) {
#pragma unroll
        for (int k = 0; k < N; k++) {
            const int32_t e = __ldg(P.pair_map + i0 + k);
            const int64_t p = tp.on(fr_map_axis(e)), col = fr_map_col(e);
            if (P.cos != nullptr) {
                c[k] = __ldg(P.cos + p * P.half + col);
                s[k] = __ldg(P.sin + p * P.half + col);
            } else {
                fr_angle(p, __ldg(P.inv_freq + col), P.attn, &c[k], &s[k]);
            }
        }
    } else if (P.cos != nullptr) {
        load_row<N>(P.cos + tp.p[0] * P.half + i0, c);
        load_row<N>(P.sin + tp.p[0] * P.half + i0, s);
    } else {
#pragma unroll
        for (int k = 0; k < N; k++)
            fr_angle(tp.p[0], __ldg(P.inv_freq + i0 + k), P.attn, &c[k], &s[k]);
    }
}

/* Position of token (b, s) on each axis (AX: the cache has position axes;
 * the 1D kernels are built without their code, which costs registers); the
 * range flag is raised (by the caller) when one has none in the table. */
template <bool AX>
__device__ __forceinline__ TokPos token_position(const KParams &P, int64_t b, int64_t s, int *bad)
{
    TokPos tp;
    tp.p[0] = fr_token_position(&P.pos, b, s, bad);
    if (!*bad && P.max_positions > 0 && tp.p[0] >= P.max_positions)
        *bad = 1;
#pragma unroll
    for (int a = 1; a < FUSEDROPE_MAX_AXES; a++) {
        tp.p[a] = tp.p[0];
        if (AX && a < P.pos.num_axes) {
            tp.p[a] = fr_token_axis_position(&P.pos, b, s, a, tp.p[0], bad);
            if (P.max_positions > 0 && tp.p[a] >= P.max_positions)
                *bad = 1;
        }
    }
    return tp;
}

__device__ __forceinline__ void raise_flag(const KParams &P, int64_t lane, int64_t g)
{
    if (lane == 0 && g == 0 && P.flag != nullptr)
        *P.flag = 1;
}

/* Token base pointers of the (up to) two tensors. */
template <typename T> struct TokenPtrs {
    const T *in0, *in1;
    T *out0, *out1;

    /* Head h of the combined head list; returns which tensor it belongs to. */
    __device__ __forceinline__ int head(const KParams &P, int64_t h, const T **src, T **dst) const
    {
        if (h < P.heads0) {
            *src = in0 + h * P.io[0].in_sh;
            *dst = out0 + h * P.io[0].out_sh;
            return 0;
        }
        h -= P.heads0;
        *src = in1 + h * P.io[1].in_sh;
        *dst = out1 + h * P.io[1].out_sh;
        return 1;
    }
};

/* ------------------------------------------------------ the head-group loop */

/*
 * The head-group loop.  A lane walks the heads this thread owns (g, g + G,
 * g + 2G, ...; G = P.gtotal) in groups of UG, the group's loads all issued
 * before any of its stores.  What differs per kind of lane is its Op, a
 * small value built from what the lane already holds:
 *   Op::V                        what one head's load keeps
 *   Op::SKIPS                    whether a load may leave its head nothing to
 *                                store (it then clears dst); otherwise the
 *                                store is guarded by the head's index, which
 *                                costs fewer registers than testing dst
 *                                (bench/RESULTS.md, "One head-group loop,
 *                                second attempt")
 *   op.load(P, sel, src, dst, v) head (src, dst) of tensor sel into v
 *   op.store(dst, v)             computes and stores one head
 * A group of one needs no guard: the loop's test is the head's.
 */
template <int UG, typename T, typename Op>
__device__ __forceinline__ void each_group(const KParams &P, const TokenPtrs<T> &t, int64_t g,
                                           const Op op)
{
    for (int64_t h0 = g; h0 < P.heads; h0 += UG * P.gtotal) {
        typename Op::V v[UG];
        T *dst[UG];
        if constexpr (UG == 1) {
            const T *src;
            const int sel = t.head(P, h0, &src, &dst[0]);
            op.load(P, sel, src, dst[0], v[0]);
            if (!Op::SKIPS || dst[0] != nullptr)
                op.store(dst[0], v[0]);
        } else {
#pragma unroll
            for (int u = 0; u < UG; u++) {
                const int64_t h = h0 + u * P.gtotal;
                if (Op::SKIPS)
                    dst[u] = nullptr;
                if (h < P.heads) {
                    const T *src;
                    const int sel = t.head(P, h, &src, &dst[u]);
                    op.load(P, sel, src, dst[u], v[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < UG; u++)
                if (Op::SKIPS ? dst[u] != nullptr : h0 + u * P.gtotal < P.heads)
                    op.store(dst[u], v[u]);
        }
    }
}

/* Op::V of a lane that loads nothing (the NaN stores) */
struct NoLoad {};

/* --------------------------------------------------------------- rotary lanes */

/* A token without a position: NaN over its rotated chunks at offsets o0 and,
 * when `two`, o1 (vector paths), or over channels o0 and o1 (scalar path,
 * one element each), in every head this thread owns; the flag says why. */
template <int DT, bool VEC> struct NanOp {
    typedef typename Elem<DT>::T T;
    typedef NoLoad V;
    static constexpr bool SKIPS = false;
    int64_t o0, o1;
    int two;
    __device__ __forceinline__ void load(const KParams &, int, const T *, T *&, V &) const {}
    __device__ __forceinline__ void store(T *dst, const V &) const
    {
        const uint32_t nw = nan_word<DT>();
        if constexpr (VEC) {
            const uint4 nv = make_uint4(nw, nw, nw, nw);
            st16(dst + o0, nv);
            if (two)
                st16(dst + o1, nv);
        } else {
            /* the word's bytes, not its value ((float)0x7fc00000u is 2.1e9);
             * a 16-bit T takes one of its two equal halves */
            T nv;
            memcpy(&nv, &nw, sizeof nv);
            dst[o0] = nv;
            dst[o1] = nv;
        }
    }
};

template <int DT, bool VEC>
__device__ __forceinline__ void nan_lane(const KParams &P, const TokenPtrs<typename Elem<DT>::T> &t,
                                         int64_t lane, int64_t g, int64_t o0, int64_t o1, int two)
{
    raise_flag(P, lane, g);
    each_group<1>(P, t, g, NanOp<DT, VEC>{o0, o1, two});
}

/* Vector NeoX: chunk `lane` of the first half (channels ca) pairs with the
 * same chunk of the second half (cb); E pairs, UN heads per group, or UNW
 * in the wide kernel: twice the loads in flight, for about 30 registers more
 * (ptxas, sm_90: 95 and 126 for bfloat16), which cost resident blocks of
 * some launch shapes and not of others (bench/RESULTS.md: on the H200 the
 * wide group gained 4.6 points of copy on [4096,1,128,128], 256-thread
 * blocks, two an SM either way, and lost 10 on [512,32,24,128], 288-thread
 * blocks, two an SM narrow but one wide). */
constexpr int UN = FR_CUDA_U_NEOX;
constexpr int UNW = FR_CUDA_U_NEOX_WIDE > UN ? FR_CUDA_U_NEOX_WIDE : UN;

/* The NeoX lanes keep a group loop of their own (neox_load, neox_store), not
 * each_group: written as an op of each_group (either half alone is harmless,
 * both together are not) every NeoX kernel took 7 to 22 more registers, the
 * PTX computing the token's base pointers ahead of the lane loop and keeping
 * them (bench/RESULTS.md, "One head-group loop, second attempt").
 * One group of UN heads h0, h0 + G, ...: the loads (two 16-byte chunks per
 * head, at channels ca and cb), then the rotations and stores. */
template <int DT, int N>
__device__ __forceinline__ void neox_load(const KParams &P, const TokenPtrs<typename Elem<DT>::T> &t,
                                          int64_t h0, int64_t ca, int64_t cb, uint4 *va, uint4 *vb,
                                          typename Elem<DT>::T **dst)
{
    typedef typename Elem<DT>::T T;
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int64_t h = h0 + u * P.gtotal;
        if (h < P.heads) {
            const T *src;
            t.head(P, h, &src, &dst[u]);
            va[u] = ld16(src + ca);
            vb[u] = ld16(src + cb);
        }
    }
}

template <int DT, int N>
__device__ __forceinline__ void neox_store(const KParams &P, int64_t h0, int64_t ca, int64_t cb,
                                           const uint4 *va, const uint4 *vb,
                                           typename Elem<DT>::T *const *dst, const float *c,
                                           const float *sn)
{
    typedef Chunk<DT> C;
    constexpr int E = C::E;
#pragma unroll
    for (int u = 0; u < N; u++) {
        if (h0 + u * P.gtotal < P.heads) {
            float fa[E], fb[E], ya[E], yb[E];
            C::unpack(va[u], fa);
            C::unpack(vb[u], fb);
#pragma unroll
            for (int k = 0; k < E; k++)
                fr_rotate(fa[k], fb[k], c[k], sn[k], P.sgn, &ya[k], &yb[k]);
            st16(dst[u] + ca, C::pack(ya));
            st16(dst[u] + cb, C::pack(yb));
        }
    }
}

/* ONE_GROUP: the launcher's promise that every thread owns at most UN heads
 * (decode-sized calls).  The heads' loads then go out before the token's
 * position is known, since they do not depend on it: the data comes back in
 * the same memory round trip as the position and the table row behind it,
 * not after them.  Not done in the general loop's first group: there the
 * same order costs registers, and with them resident blocks of a
 * prefill-sized call; as a kernel of its own (no loop, fewer registers) it
 * costs decode-sized calls nothing (the wide kernel doing it in its first
 * group lost 8.5 points on the H200: bench/RESULTS.md, 2026-11-30). */
template <int DT, bool ONE_GROUP, bool AX, int N>
__device__ __forceinline__ void rotary_neox_vec(const KParams &P, const TokenPtrs<typename Elem<DT>::T> &t,
                                                int64_t b, int64_t s, int64_t lane, int64_t g)
{
    typedef typename Elem<DT>::T T;
    constexpr int E = Chunk<DT>::E;
    const int64_t i0 = lane * E;
    int64_t ca, cb;
    int bad;
    uint4 va[N], vb[N];
    T *dst[N];
    fr_pair_channels(0, i0, P.half, &ca, &cb);
    if constexpr (ONE_GROUP)
        neox_load<DT, N>(P, t, g, ca, cb, va, vb, dst);
    const TokPos p = token_position<AX>(P, b, s, &bad);

    if (bad) {
        nan_lane<DT, true>(P, t, lane, g, ca, cb, 1);
        return;
    }

    float c[E], sn[E];
    cos_sin<E, AX>(P, p, i0, c, sn);

    if constexpr (ONE_GROUP) {
        neox_store<DT, N>(P, g, ca, cb, va, vb, dst, c, sn);
    } else {
        for (int64_t h0 = g; h0 < P.heads; h0 += N * P.gtotal) {
            neox_load<DT, N>(P, t, h0, ca, cb, va, vb, dst);
            neox_store<DT, N>(P, h0, ca, cb, va, vb, dst, c, sn);
        }
    }
}

/* Vector interleaved: a chunk holds E/2 whole pairs.  Lane c owns chunk c
 * and, when there is one, chunk c + nc (nc = half the head's chunks, rounded
 * up), so it has two independent loads per head like a NeoX lane. */
template <int DT> struct InterOp {
    typedef typename Elem<DT>::T T;
    typedef Chunk<DT> C;
    static constexpr int E = C::E, NP = E / 2, K = 2;
    struct V { uint4 v[K]; };
    static constexpr bool SKIPS = false;
    int64_t ca[K];
    int second;
    float sgn;
    float c[K][NP], sn[K][NP];
    __device__ __forceinline__ void load(const KParams &, int, const T *src, T *&, V &v) const
    {
        v.v[0] = ld16(src + ca[0]);
        if (second)
            v.v[1] = ld16(src + ca[1]);
    }
    __device__ __forceinline__ void store(T *dst, const V &v) const
    {
#pragma unroll
        for (int k = 0; k < K; k++) {
            float f[E], y[E];
            if (k == 1 && !second)
                break;
            C::unpack(v.v[k], f);
#pragma unroll
            for (int j = 0; j < NP; j++)
                fr_rotate(f[2 * j], f[2 * j + 1], c[k][j], sn[k][j], sgn, &y[2 * j], &y[2 * j + 1]);
            st16(dst + ca[k], C::pack(y));
        }
    }
};

template <int DT, bool AX, int UG>
__device__ __forceinline__ void rotary_inter_vec(const KParams &P, const TokenPtrs<typename Elem<DT>::T> &t,
                                                 int64_t b, int64_t s, int64_t lane, int64_t g)
{
    typedef InterOp<DT> Op;
    constexpr int NP = Op::NP, K = Op::K;
    Op op;
    int64_t cb;
    int bad;
    op.second = (lane + P.nc) * Op::E < P.rot_dim; /* this lane has a second chunk */
    op.sgn = P.sgn;
#pragma unroll
    for (int k = 0; k < K; k++) /* ca = 2*i0: the chunk's first channel */
        fr_pair_channels(1, (lane + k * P.nc) * NP, P.half, &op.ca[k], &cb);
    const TokPos p = token_position<AX>(P, b, s, &bad);

    if (bad) {
        nan_lane<DT, true>(P, t, lane, g, op.ca[0], op.ca[1], op.second);
        return;
    }

    cos_sin<NP, AX>(P, p, lane * NP, op.c[0], op.sn[0]);
    if (op.second)
        cos_sin<NP, AX>(P, p, (lane + P.nc) * NP, op.c[1], op.sn[1]);
    each_group<UG>(P, t, g, op);
}

/* Scalar: lane = pair index, either style. */
template <int DT> struct ScalarOp {
    typedef typename Elem<DT>::T T;
    struct V { T a, b; };
    static constexpr bool SKIPS = false;
    int64_t ca, cb;
    float c, sn, sgn;
    __device__ __forceinline__ void load(const KParams &, int, const T *src, T *&, V &v) const
    {
        v.a = src[ca];
        v.b = src[cb];
    }
    __device__ __forceinline__ void store(T *dst, const V &v) const
    {
        float ya, yb;
        fr_rotate(Elem<DT>::to_f(v.a), Elem<DT>::to_f(v.b), c, sn, sgn, &ya, &yb);
        dst[ca] = Elem<DT>::from_f(ya);
        dst[cb] = Elem<DT>::from_f(yb);
    }
};

template <int DT, bool AX>
__device__ __forceinline__ void rotary_scalar(const KParams &P, const TokenPtrs<typename Elem<DT>::T> &t,
                                              int64_t b, int64_t s, int64_t lane, int64_t g)
{
    ScalarOp<DT> op;
    int bad;
    fr_pair_channels(P.interleaved, lane, P.half, &op.ca, &op.cb);
    op.sgn = P.sgn;
    const TokPos p = token_position<AX>(P, b, s, &bad);

    if (bad) {
        nan_lane<DT, false>(P, t, lane, g, op.ca, op.cb, 1);
        return;
    }

    cos_sin<1, AX>(P, p, lane, &op.c, &op.sn);
    each_group<U>(P, t, g, op);
}

/* --------------------------------------------------------- pass-through lanes */

/* Lane j copies channels [rot_dim + jE, rot_dim + (j+1)E) of every head of a
 * tensor computed out of place: one 16-byte copy on the vector path when the
 * chunk is whole, element by element otherwise (then nothing to store). */
template <int DT, bool VEC> struct PassOp {
    typedef typename Elem<DT>::T T;
    static constexpr int E = Chunk<DT>::E;
    typedef uint4 V;
    static constexpr bool SKIPS = true;
    int64_t j, c0;
    __device__ __forceinline__ void load(const KParams &P, int sel, const T *src, T *&dst, V &v) const
    {
        const int64_t np = sel ? P.io[1].np : P.io[0].np;
        const int64_t hd = sel ? P.io[1].head_dim : P.io[0].head_dim;
        T *const d = dst;
        dst = nullptr;
        if (j >= np)
            return;
        if (VEC && c0 + E <= hd) {
            v = ld16(src + c0);
            dst = d;
        } else {
            const int64_t c1 = c0 + E < hd ? c0 + E : hd;
            for (int64_t c = c0; c < c1; c++)
                d[c] = src[c];
        }
    }
    /* called only where load kept dst, so only on the vector path: without it
     * (VEC false) nothing is stored here, and v is never read unset (gcc 16
     * warned of that, unable to see dst null) */
    __device__ __forceinline__ void store(T *dst, const V &v) const
    {
        if constexpr (VEC)
            st16(dst + c0, v);
        else
            (void)dst, (void)v;
    }
};

template <int DT, bool VEC, int UG>
__device__ __forceinline__ void pass_lane(const KParams &P, const TokenPtrs<typename Elem<DT>::T> &t,
                                          int64_t j, int64_t g)
{
    each_group<UG>(P, t, g, PassOp<DT, VEC>{j, P.rot_dim + j * Chunk<DT>::E});
}

/* ---------------------------------------------------------------- the kernel */

/* MODE: the path, one kernel each so each gets its own register budget. */
enum { MODE_SCALAR, MODE_NEOX_VEC, MODE_INTER_VEC, MODE_NEOX_ONE, MODE_NEOX_WIDE };

/* Registers decide how many blocks of nine or ten warps an SM holds (warps
 * are placed four at a time: at 104 registers or more, only 16 warps fit,
 * and a 288-thread block runs alone).  So the rotary lanes' code must stay
 * under 104 registers; bench/RESULTS.md has what crossing it cost.  The
 * wide NeoX kernel (MODE_NEOX_WIDE) is the exception that is chosen per
 * launch, only where an SM holds as many of its blocks (wide_pays).
 *
 * The explicit minimum of 1 block per SM matters: with __launch_bounds__(512)
 * alone ptxas squeezes some kernels into fewer registers with spills.
 *
 * FR_CUDA_MAXNREG=N (an experiment for bench/sweep-knobs.sh, not a default)
 * caps every kernel at N registers instead: fewer registers fit more blocks
 * per SM, paid for with spills to L1.  nvcc does not accept both qualifiers
 * on one kernel. */
#ifdef FR_CUDA_MAXNREG
#define FR_KERNEL_BOUNDS __maxnreg__(FR_CUDA_MAXNREG)
#else
#define FR_KERNEL_BOUNDS __launch_bounds__(MAX_BLOCK, 1)
#endif
template <int DT, int MODE, bool AX>
__global__ void FR_KERNEL_BOUNDS rope_kernel(const __grid_constant__ KParams P)
{
    constexpr bool VEC = MODE != MODE_SCALAR;
    /* the heads a group of the kernel's lanes other than NeoX rotary ones */
    constexpr int UK = MODE == MODE_INTER_VEC ? FR_CUDA_U_INTER : U;
    typedef typename Elem<DT>::T T;
    const int64_t g = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    /* tokens outside every sequence are caught per token; cu_seqlens' ends
     * and steps only here */
    check_cu_seqlens(P.pos, P.tokens, P.flag);
    if (g >= P.gtotal)
        return;
    const int64_t tstride = (int64_t)gridDim.x * blockDim.z;

    for (int64_t tok = (int64_t)blockIdx.x * blockDim.z + threadIdx.z; tok < P.tokens;
         tok += tstride) {
        int64_t b = 0, s = tok;
        if (P.batch > 1) {
            if (P.seq_major)
                divmod(tok, P.batch, &s, &b);
            else
                divmod(tok, P.seq_len, &b, &s);
        }
        TokenPtrs<T> t;
        t.in0 = (const T *)P.io[0].in + b * P.io[0].in_sb + s * P.io[0].in_ss;
        t.out0 = (T *)P.io[0].out + b * P.io[0].out_sb + s * P.io[0].out_ss;
        t.in1 = (const T *)P.io[1].in + b * P.io[1].in_sb + s * P.io[1].in_ss;
        t.out1 = (T *)P.io[1].out + b * P.io[1].out_sb + s * P.io[1].out_ss;

        for (int64_t lane = threadIdx.x; lane < P.lanes; lane += blockDim.x) {
            if (lane < P.nc) {
                if (MODE == MODE_SCALAR)
                    rotary_scalar<DT, AX>(P, t, b, s, lane, g);
                else if (MODE == MODE_INTER_VEC)
                    rotary_inter_vec<DT, AX, UK>(P, t, b, s, lane, g);
                else
                    rotary_neox_vec<DT, MODE == MODE_NEOX_ONE, AX,
                                    MODE == MODE_NEOX_WIDE ? UNW : UN>(P, t, b, s, lane, g);
            } else {
                pass_lane<DT, VEC, UK>(P, t, lane - P.nc, g);
            }
        }
    }
}

/* ---------------------------------------------------------------- host side */

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* A stride only matters along a dimension with more than one index. */
bool stride_ok(int64_t stride, int64_t extent, int64_t es)
{
    return extent <= 1 || (stride * es) % 16 == 0;
}

bool io_vector_ok(const fr_io *io, const fr_apply_args *a, int64_t es)
{
    if (io->heads == 0)
        return true;
    return aligned16(io->in) && aligned16(io->out) &&
           stride_ok(io->in_ss, a->seq_len, es) && stride_ok(io->out_ss, a->seq_len, es) &&
           stride_ok(io->in_sb, a->batch, es) && stride_ok(io->out_sb, a->batch, es) &&
           stride_ok(io->in_sh, io->heads, es) && stride_ok(io->out_sh, io->heads, es);
}

/* Fraction of a block's last warp left idle. */
double warp_waste(int64_t n) { return (double)(ceil_div(n, 32) * 32 - n) / (double)n; }

struct Shape {
    dim3 grid, block;
    int64_t gtotal;
};

/* The most tokens a block of per_tok threads a token takes (MAX_BLOCK
 * threads, 64 tokens, the call's tokens; at least 1). */
int64_t block_tokens_max(int64_t per_tok, int64_t tokens)
{
    int64_t tmax = MAX_BLOCK / per_tok;
    if (tmax > 64)
        tmax = 64;
    if (tmax > tokens)
        tmax = tokens;
    return tmax < 1 ? 1 : tmax;
}

/* A block of n threads' distance from 256, the size the shapes lean to. */
int64_t off_256(int64_t n) { return n > 256 ? n - 256 : 256 - n; }

/* The grid's x for tz tokens a block: at most INT_MAX blocks (the kernels
 * walk tokens grid-stride). */
unsigned grid_x(int64_t tokens, int64_t tz)
{
    const int64_t gx = ceil_div(tokens, tz);
    return (unsigned)(gx < INT_MAX ? gx : INT_MAX);
}

/*
 * Block and grid from the work: `lanes` threads per head group and token,
 * `heads` heads per token, `tokens` tokens.  Heads per thread grow (up to 8,
 * reusing a token's cos/sin) only while the grid still holds a couple of
 * full waves of threads; small calls (decode) keep one head per thread and
 * are cut into enough blocks to reach every SM.
 */
Shape choose_shape(int64_t tokens, int64_t heads, int64_t lanes, int sms)
{
    Shape sh;
    const int64_t bx = lanes < MAX_BLOCK ? lanes : MAX_BLOCK;
    const double wave = (double)sms * 2048.0;
    int64_t hpt = 1;
    while (hpt < FR_CUDA_MAX_HPT && hpt * 2 <= heads &&
           (double)tokens * (double)bx * (double)ceil_div(heads, hpt * 2) >= FR_CUDA_WAVES * wave)
        hpt *= 2;
    int64_t gtotal = ceil_div(heads, hpt);
    int64_t gb = MAX_BLOCK / bx;
    if (gb > gtotal)
        gb = gtotal;

    /* Tokens per block: blocks of 128..512 threads with as little of the last
     * warp idle as possible, near 256. */
    int64_t per_tok = bx * gb;
    const int64_t tmax = block_tokens_max(per_tok, tokens);
    int64_t tz = 256 / per_tok;
    if (tz < 1)
        tz = 1;
    if (tz > tmax)
        tz = tmax;
    for (int64_t t = 1; t <= tmax; t++) {
        const int64_t n = t * per_tok, best = tz * per_tok;
        if (n < 128 && t != tmax)
            continue;
        const double w = warp_waste(n), bw = warp_waste(best);
        if (w < bw - 1e-9 ||
            (w <= bw + 1e-9 && off_256(n) < off_256(best)))
            tz = t;
    }

    /* Small calls: fewer tokens, then fewer head groups per block, until
     * there are blocks for every SM (two each) or blocks are two warps. */
    for (;;) {
        const double blocks = (double)ceil_div(tokens, tz) * (double)ceil_div(gtotal, gb);
        if (blocks >= 2.0 * sms)
            break;
        if (tz > 1)
            tz = ceil_div(tz, 2);
        else if (gb > 1 && bx * ceil_div(gb, 2) >= 64)
            gb = ceil_div(gb, 2);
        else
            break;
    }

    int64_t gy = ceil_div(gtotal, gb);
    if (gy > 65535) {
        gy = 65535; /* threads take more heads: the head loop strides by gtotal */
        gtotal = gy * gb;
    }
    sh.block = dim3((unsigned)bx, (unsigned)gb, (unsigned)tz);
    sh.grid = dim3(grid_x(tokens, tz), (unsigned)gy, 1);
    sh.gtotal = gtotal;
    return sh;
}

/* The launch's own error (cuda_util.cuh: the caller's last error is left alone). */
template <int DT, int MODE>
cudaError_t launch_mode(const Shape &sh, const KParams &P, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = sh.grid;
    cfg.blockDim = sh.block;
    cfg.stream = stream;
    if (P.pair_map != nullptr) /* position axes: the kernels that gather per pair */
        return cudaLaunchKernelEx(&cfg, rope_kernel<DT, MODE, true>, P);
    return cudaLaunchKernelEx(&cfg, rope_kernel<DT, MODE, false>, P);
}

#ifndef FR_CUDA_EMULATE
/* Blocks of `threads` threads an SM of device dev holds of rope_kernel<DT,
 * MODE, AX>: the runtime's occupancy calculator, asked once per device,
 * kernel and block size in warps, and kept; 0 when the query fails. */
template <int DT, int MODE, bool AX> int resident_blocks(int dev, int threads)
{
    static int cached[64][MAX_BLOCK / 32 + 1]; /* blocks + 1; 0: not asked yet */
    const int w = (threads + 31) / 32;
    const bool keep = dev >= 0 && dev < 64 && w <= MAX_BLOCK / 32;
    int n = keep ? __atomic_load_n(&cached[dev][w], __ATOMIC_RELAXED) : 0;
    if (n > 0)
        return n - 1;
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, rope_kernel<DT, MODE, AX>, threads, 0);
    if (err != cudaSuccess) {
        fr_cuda_forget(err);
        return 0; /* asked again next time */
    }
    if (keep)
        __atomic_store_n(&cached[dev][w], n + 1, __ATOMIC_RELAXED);
    return n;
}
#else
/* Emulated: the H200's counts for the bfloat16 kernels (ptxas, sm_90: the
 * narrow group's 95 registers fit 20 warps an SM, the wide group's 126
 * fit 16; at most 32 blocks), so that wide_pays chooses in the tests as it
 * would there. */
template <int DT, int MODE, bool AX> int resident_blocks(int, int threads)
{
    const int w = (threads + 31) / 32, n = (MODE == MODE_NEOX_WIDE ? 16 : 20) / w;
    return n < 32 ? n : 32;
}
#endif

/* Whether a general NeoX launch of shape sh on device dev takes the wide
 * group (built: UNW > UN): when an SM holds as many of its blocks as of the
 * narrow kernel's.  Results never depend on it (the same rotation of the
 * same elements).  Where it held half as many ([512,32,24,128] in bf16, one
 * 288-thread block an SM), another block of tokens for it (240 threads, two
 * an SM) lost 8.6 points on the H200 (bench/RESULTS.md, 2026-11-30).
 * Emulated: fr_emu_neox_wide 1 takes the wide kernel, 0 never, 2 as the
 * device would with the counts above. */
template <int DT, bool AX> bool wide_pays(const Shape &sh, int dev)
{
#ifdef FR_CUDA_EMULATE
    if (fr_emu_neox_wide != 2)
        return fr_emu_neox_wide != 0;
#endif
    const int threads = (int)(sh.block.x * sh.block.y * sh.block.z);
    const int wide = resident_blocks<DT, MODE_NEOX_WIDE, AX>(dev, threads);
    return wide > 0 && wide >= resident_blocks<DT, MODE_NEOX_VEC, AX>(dev, threads);
}

template <int DT>
cudaError_t launch(bool vec, const Shape &sh, const KParams &P, int dev, cudaStream_t stream)
{
    if (!vec)
        return launch_mode<DT, MODE_SCALAR>(sh, P, stream);
    if (P.interleaved)
        return launch_mode<DT, MODE_INTER_VEC>(sh, P, stream);
    if (ceil_div(P.heads, P.gtotal) <= UN) /* every thread has one group of heads */
        return launch_mode<DT, MODE_NEOX_ONE>(sh, P, stream);
    if constexpr (UNW > UN) {
        if (P.pair_map != nullptr ? wide_pays<DT, true>(sh, dev) : wide_pays<DT, false>(sh, dev))
            return launch_mode<DT, MODE_NEOX_WIDE>(sh, P, stream);
    }
    return launch_mode<DT, MODE_NEOX_VEC>(sh, P, stream);
}

} /* namespace */

extern "C" fusedrope_status fr_cuda_apply(const fr_apply_args *a)
{
    const fusedrope_cache *cache = a->cache;
    const int64_t es = a->dtype == FUSEDROPE_FLOAT32 ? 4 : 2;
    const int64_t E = 16 / es;
    const int64_t rot_dim = cache->rot_dim, half = rot_dim / 2;
    const int64_t tokens = a->seq_len * a->batch;
    KParams P;
    int i, dev = 0;

    /* the one cudaGetDevice per call also picks the SM count below */
    TRY(fr_cuda_check_device(cache, &dev));

    memset(&P, 0, sizeof P);
    for (i = 0; i < a->count && i < 2; i++) {
        const fr_io *io = &a->io[i];
        KIo *k = &P.io[i];
        k->in = io->in;
        k->out = io->out;
        k->heads = io->heads;
        k->head_dim = io->head_dim;
        k->in_ss = io->in_ss;
        k->in_sb = io->in_sb;
        k->in_sh = io->in_sh;
        k->out_ss = io->out_ss;
        k->out_sb = io->out_sb;
        k->out_sh = io->out_sh;
        k->np = (!io->in_place && io->heads > 0 && io->head_dim > rot_dim)
                    ? ceil_div(io->head_dim - rot_dim, E)
                    : 0;
    }
    P.heads0 = P.io[0].heads;
    P.heads = P.io[0].heads + P.io[1].heads;
    if (tokens <= 0 || P.heads <= 0)
        return FUSEDROPE_OK;

    bool vec = (a->interleaved ? (rot_dim * es) % 16 : (half * es) % 16) == 0;
    for (i = 0; i < a->count && i < 2 && vec; i++)
        vec = io_vector_ok(&a->io[i], a, es);

    P.pos = a->pos;
    P.cos = cache->max_positions > 0 ? cache->cos : nullptr;
    P.sin = cache->max_positions > 0 ? cache->sin : nullptr;
    P.inv_freq = cache->inv_freq_dev;
    P.pair_map = cache->pair_map_dev;
    P.attn = cache->attention_factor;
    /* The caller's per-call word, else the cache's flag: the kernels raise
     * whichever they are given. */
    static_assert(sizeof(int) == sizeof(int32_t), "range_status is an int32_t word");
    P.flag = fr_range_word(a);
    P.tokens = tokens;
    P.seq_len = a->seq_len;
    P.batch = a->batch;
    P.max_positions = cache->max_positions;
    P.half = half;
    P.rot_dim = rot_dim;
    P.interleaved = a->interleaved;
    /* Walk tokens in memory order: sbhd-like strides put the batch inside the sequence. */
    P.seq_major = a->batch > 1 && a->seq_len > 1 && a->io[0].in_ss > a->io[0].in_sb;
    P.sgn = a->sgn;
    /* rotary lanes: scalar, one pair each; NeoX, a chunk of each half;
     * interleaved, two chunks (the last lane one when the count is odd) */
    P.nc = !vec ? half : a->interleaved ? ceil_div(rot_dim / E, 2) : half / E;
    P.lanes = P.nc + (P.io[0].np > P.io[1].np ? P.io[0].np : P.io[1].np);
    if (P.cos == nullptr && P.inv_freq == nullptr)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "fr_cuda_apply: the cache has neither a device table nor frequencies");

    const int sms = fr_cuda_sm_count(dev);
    const Shape sh = choose_shape(tokens, P.heads, P.lanes, sms);
    P.gtotal = sh.gtotal;

    cudaStream_t stream = (cudaStream_t)a->stream;
    cudaError_t err;
    switch (a->dtype) {
    case FUSEDROPE_FLOAT32:
        err = launch<DT_F32>(vec, sh, P, dev, stream);
        break;
    case FUSEDROPE_FLOAT16:
        err = launch<DT_F16>(vec, sh, P, dev, stream);
        break;
    default:
        err = launch<DT_BF16>(vec, sh, P, dev, stream);
        break;
    }
    if (err != cudaSuccess)
        return fr_cuda_fail(err, "the RoPE kernel launch");
    return FUSEDROPE_OK;
}
