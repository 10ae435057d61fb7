/*
 * cuda_gpu_copy.h - what tests/cuda_gpu_wrap.c and tests/cuda_norm_gpu_wrap.c
 * share: a device mirror of the host memory one backend call touches, the
 * device twin of a CPU cache, and, before main, the skip (exit 77) of a
 * program whose wrapped calls need a CUDA device where there is none, and
 * CK_FORK=no unless the environment says otherwise (cuda_gpu_copy.c says
 * why).
 *
 * A mirror collects the byte spans a call reads or writes (tensor views,
 * position arrays, the norm's extra arrays, the cache's table), merges the
 * ones that overlap into one region, and gives each region one device
 * allocation holding the host's bytes.  A pointer anywhere inside a span is
 * then rebased into its region's allocation, which keeps the pointer's
 * offset modulo 256: the device call sees the alignment the host call saw,
 * so it takes the path (vector or scalar) the same layout in cudaMalloc'd
 * memory would take.  Poisoned guard bands of at least 256 bytes before
 * and after each region catch a device write just outside it.  Views that
 * share memory (q and k inside one packed QKV buffer, in place, a saved
 * tensor over dx) share a region, so the device call sees the same aliasing
 * as the host call.
 *
 * The host memory is left as it was until gpu_mirror_commit: the call's
 * device results come back into copies of their own (gpu_mirror_result), so
 * the OpenMP backend can run on the untouched host bytes and the two
 * results be compared before the device's are put in place.
 *
 * Every CUDA failure aborts with a message: these are test programs, and a
 * failed copy must not pass for a result.
 */
#ifndef FUSEDROPE_TEST_CUDA_GPU_COPY_H
#define FUSEDROPE_TEST_CUDA_GPU_COPY_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "internal.h"

typedef struct gpu_region {
    uintptr_t lo, hi;      /* host bytes [lo, hi) */
    uintptr_t base;        /* the allocation's host-side origin, 256 to 511 below lo */
    unsigned char *dev;    /* cudaMalloc'd: guard [base, lo), the host's bytes, guard */
    unsigned char *start;  /* written regions: the host bytes before the call */
    unsigned char *result; /* written regions: the device's bytes after the call */
    int written;
} gpu_region;

typedef struct gpu_mirror {
    gpu_region *r;
    int n, cap;
    int uploaded;
} gpu_mirror;

/* An empty mirror. */
void gpu_mirror_init(gpu_mirror *m);
/* Adds the span [p, p + bytes); written: the call may write it.  Nothing for
 * a NULL p or no bytes.  Only before gpu_mirror_upload. */
void gpu_mirror_add(gpu_mirror *m, const void *p, size_t bytes, int written);
/* Merges the spans, allocates the device memory, copies every region's host
 * bytes to it and snapshots the written ones, then waits for the copies. */
void gpu_mirror_upload(gpu_mirror *m);
/* The device address of host address p (NULL for NULL); p must lie in a span. */
void *gpu_mirror_dev(const gpu_mirror *m, const void *p);
/* Copies every written region's device bytes into its result copy, after
 * checking that the guard bands around every region kept their poison (a
 * write just outside what the call may touch aborts with a message). */
void gpu_mirror_download(gpu_mirror *m);
/* Where the device's result (after gpu_mirror_download) and the starting
 * bytes of host address p are kept: the region's copies for a written
 * region, p itself for a region the call only reads. */
const unsigned char *gpu_mirror_result(const gpu_mirror *m, const void *p);
const unsigned char *gpu_mirror_start(const gpu_mirror *m, const void *p);
/* Copies the device's results into the host memory of every written region. */
void gpu_mirror_commit(gpu_mirror *m);
/* Frees the device memory and the copies; the mirror is empty again. */
void gpu_mirror_free(gpu_mirror *m);

/* Host byte span of a view of `heads` heads of head_dim elements of es
 * bytes over seq_len x batch tokens, element strides ss, sb, sh (>= 0, as a
 * validated call has them): from p to one past its last element; 0 for an
 * empty view. */
size_t gpu_view_bytes(int64_t seq_len, int64_t batch, int64_t heads, int64_t head_dim,
                      int64_t ss, int64_t sb, int64_t sh, size_t es);

/* Adds to m the position arrays of pa (ids with every row, offsets,
 * cu_seqlens) for a call of `batch` entries of pa->seq_len tokens. */
void gpu_mirror_add_positions(gpu_mirror *m, const fr_pos_args *pa, int64_t batch);
/* pa with its arrays rebased into m. */
fr_pos_args gpu_positions_on_device(const gpu_mirror *m, const fr_pos_args *pa);

/* Adds to m the CPU cache's arrays a CUDA cache keeps on the device: the
 * cos/sin table, the inverse frequencies and the axes map. */
void gpu_mirror_add_cache(gpu_mirror *m, const fusedrope_cache *cpu);
/*
 * The device twin of CPU cache `cpu` in *twin: the same struct with the
 * device's fields as kernels/cuda_cache.cu sets them (cos/sin, inv_freq_dev,
 * pair_map_dev rebased into m, which gpu_mirror_add_cache filled; device
 * CUDA; cuda_device the current device), and its range flag at the device
 * word `flag_dev`.  The host-mapped range_flag is left NULL: only
 * fusedrope_cache_check reads it, and the twin never reaches it.
 */
void gpu_cache_twin(const gpu_mirror *m, const fusedrope_cache *cpu, int *flag_dev,
                    fusedrope_cache *twin);

/* Adds to m what every backend call touches: each tensor view's span (the
 * inputs read, the outputs written), the position arrays and the cache's
 * arrays. */
void gpu_mirror_add_apply(gpu_mirror *m, const fr_apply_args *a);
/* a's arguments for the device, after gpu_mirror_upload: the cache's twin in
 * *twin (its flag at words[0]), positions and tensors rebased into m, a
 * device word of its own (words[1]) for a CPU call's range_status, which is
 * a host word the call never writes, and the legacy default stream (a CPU
 * call's stream means nothing on the device). */
fr_apply_args gpu_apply_on_device(const gpu_mirror *m, const fr_apply_args *a, int *words,
                                  fusedrope_cache *twin);

/* Two zeroed device words: [0] the twin's range flag, [1] the call's
 * pos->range_status where it has one.  gpu_words_check aborts, naming
 * `what`, unless both are still 0 (the host checks passed every position,
 * so the kernels must raise neither), then frees them. */
int *gpu_words_new(void);
void gpu_words_check(int *words, const char *what);

/* Aborts with a message naming `what` unless err is cudaSuccess. */
void gpu_check(cudaError_t err, const char *what);

#endif /* FUSEDROPE_TEST_CUDA_GPU_COPY_H */
