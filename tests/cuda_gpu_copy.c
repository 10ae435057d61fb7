/*
 * cuda_gpu_copy.c - the device mirror and cache twin of tests/cuda_gpu_copy.h,
 * and the skip of a GPU test program on a machine without a CUDA device.
 */
#include "cuda_gpu_copy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * The suites linked with this file run through tu_main (tests/util.c),
 * whose libcheck runner forks a process per test unless CK_FORK=no, and
 * CUDA cannot be used in a child forked after the parent initialised it.
 * So:
 *  - "is there a device?" is asked before main in a child process of its
 *    own, which leaves the parent free of CUDA whatever the fork mode.  No
 *    device (or no driver): the program exits 77, which automake's harness
 *    reports as skipped;
 *  - CK_FORK defaults to "no" (the environment's own value wins): the
 *    ~900 tests of the three suites would otherwise each create a CUDA
 *    context of their own, minutes of device time for nothing.  In one
 *    process a wrong result still stops the run (the wraps abort with a
 *    message), and a failed check still fails its test; only libcheck's
 *    per-test timeouts need fork mode (CK_FORK=yes brings it back).
 */
__attribute__((constructor)) static void gpu_present_or_skip(void)
{
    int status = 0;
    pid_t pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        int n = 0;
        /* _exit: the child leaves no CUDA teardown or stdio buffers behind */
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        perror("cuda_gpu_copy: probing for a CUDA device in a child process");
        exit(99); /* a hard error for the harness, not a skip */
    }
    if (!WIFEXITED(status)) { /* a driver that kills its caller is a failure, not a skip */
        fprintf(stderr, "cuda_gpu_copy: the child probing for a CUDA device died (signal %d)\n",
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        exit(99);
    }
    if (WEXITSTATUS(status) != 0) {
        printf("no CUDA device (cudaGetDeviceCount in a child process found none); skipping\n");
        exit(77);
    }
    setenv("CK_FORK", "no", 0);
}

void gpu_check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorName(err), cudaGetErrorString(err));
        abort();
    }
}

/* ------------------------------------------------------------------ mirror */

void gpu_mirror_init(gpu_mirror *m)
{
    memset(m, 0, sizeof *m);
}

void gpu_mirror_add(gpu_mirror *m, const void *p, size_t bytes, int written)
{
    gpu_region *r;
    if (p == NULL || bytes == 0)
        return;
    if (m->uploaded) {
        fprintf(stderr, "gpu_mirror_add after gpu_mirror_upload\n");
        abort();
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        gpu_region *nr = realloc(m->r, sizeof *nr * (size_t)cap);
        if (nr == NULL) {
            fprintf(stderr, "gpu_mirror_add: out of memory\n");
            abort();
        }
        m->r = nr;
        m->cap = cap;
    }
    r = &m->r[m->n++];
    memset(r, 0, sizeof *r);
    r->lo = (uintptr_t)p;
    r->hi = r->lo + bytes;
    r->written = written;
}

static int by_start(const void *a, const void *b)
{
    const gpu_region *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Poisoned bytes around each region's allocation (gpu_mirror_upload). */
#define GPU_GUARD 256
#define GPU_GUARD_BYTE 0x5a

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "cuda_gpu_copy: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return p;
}

void gpu_mirror_upload(gpu_mirror *m)
{
    int n = 0;

    /* spans sorted by start; each one that starts inside (or right at the
     * end of) the region before it joins that region */
    if (m->n > 1)
        qsort(m->r, (size_t)m->n, sizeof *m->r, by_start);
    for (int i = 0; i < m->n; i++) {
        if (n > 0 && m->r[i].lo <= m->r[n - 1].hi) {
            gpu_region *last = &m->r[n - 1];
            if (m->r[i].hi > last->hi)
                last->hi = m->r[i].hi;
            last->written |= m->r[i].written;
        } else {
            m->r[n++] = m->r[i];
        }
    }
    m->n = n;
    m->uploaded = 1;

    for (int i = 0; i < m->n; i++) {
        gpu_region *r = &m->r[i];
        const size_t bytes = r->hi - r->lo;
        /* the allocation's origin stands for a host address 256 to 511
         * bytes below lo, a multiple of 256, so every rebased pointer keeps
         * its host alignment (up to cudaMalloc's 256); the bytes below lo
         * and GPU_GUARD bytes past hi are a guard band, poisoned, that the
         * call must leave alone (gpu_mirror_download) */
        r->base = (r->lo & ~(uintptr_t)255) - 256;
        gpu_check(cudaMalloc((void **)&r->dev, r->hi - r->base + GPU_GUARD),
                  "cudaMalloc of a mirror region");
        gpu_check(cudaMemset(r->dev, GPU_GUARD_BYTE, r->lo - r->base),
                  "cudaMemset of a mirror region's guard");
        gpu_check(cudaMemset(r->dev + (r->hi - r->base), GPU_GUARD_BYTE, GPU_GUARD),
                  "cudaMemset of a mirror region's guard");
        gpu_check(cudaMemcpy(r->dev + (r->lo - r->base), (const void *)r->lo, bytes,
                             cudaMemcpyHostToDevice),
                  "cudaMemcpy of a mirror region to the device");
        if (r->written) {
            r->start = xmalloc(bytes);
            r->result = xmalloc(bytes);
            memcpy(r->start, (const void *)r->lo, bytes);
        }
    }
    /* a copy from pageable memory may return before its DMA lands */
    gpu_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the uploads");
}

static const gpu_region *region_of(const gpu_mirror *m, const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < m->n; i++)
        if (a >= m->r[i].lo && a < m->r[i].hi)
            return &m->r[i];
    fprintf(stderr, "cuda_gpu_copy: host address %p lies in no mirrored span\n", p);
    abort();
}

void *gpu_mirror_dev(const gpu_mirror *m, const void *p)
{
    const gpu_region *r;
    if (p == NULL)
        return NULL;
    r = region_of(m, p);
    return r->dev + ((uintptr_t)p - r->base);
}

/* Aborts unless the n bytes at device address d still hold the guard's poison. */
static void check_guard(const unsigned char *d, size_t n, const gpu_region *r, const char *where)
{
    unsigned char buf[512 + GPU_GUARD];
    gpu_check(cudaMemcpy(buf, d, n, cudaMemcpyDeviceToHost), "cudaMemcpy of a guard band");
    for (size_t i = 0; i < n; i++)
        if (buf[i] != GPU_GUARD_BYTE) {
            fprintf(stderr,
                    "the device call wrote %s the host span [%p, %p) it may touch (%s byte "
                    "%zu of the guard band: 0x%02x)\n",
                    where, (void *)r->lo, (void *)r->hi, where, i, buf[i]);
            abort();
        }
}

void gpu_mirror_download(gpu_mirror *m)
{
    for (int i = 0; i < m->n; i++) {
        gpu_region *r = &m->r[i];
        check_guard(r->dev, r->lo - r->base, r, "before");
        check_guard(r->dev + (r->hi - r->base), GPU_GUARD, r, "after");
        if (r->written)
            gpu_check(cudaMemcpy(r->result, r->dev + (r->lo - r->base), r->hi - r->lo,
                                 cudaMemcpyDeviceToHost),
                      "cudaMemcpy of a mirror region to the host");
    }
}

const unsigned char *gpu_mirror_result(const gpu_mirror *m, const void *p)
{
    const gpu_region *r = region_of(m, p);
    return r->written ? r->result + ((uintptr_t)p - r->lo) : (const unsigned char *)p;
}

const unsigned char *gpu_mirror_start(const gpu_mirror *m, const void *p)
{
    const gpu_region *r = region_of(m, p);
    return r->written ? r->start + ((uintptr_t)p - r->lo) : (const unsigned char *)p;
}

void gpu_mirror_commit(gpu_mirror *m)
{
    for (int i = 0; i < m->n; i++)
        if (m->r[i].written)
            memcpy((void *)m->r[i].lo, m->r[i].result, m->r[i].hi - m->r[i].lo);
}

void gpu_mirror_free(gpu_mirror *m)
{
    for (int i = 0; i < m->n; i++) {
        if (m->r[i].dev)
            gpu_check(cudaFree(m->r[i].dev), "cudaFree of a mirror region");
        free(m->r[i].start);
        free(m->r[i].result);
    }
    free(m->r);
    gpu_mirror_init(m);
}

size_t gpu_view_bytes(int64_t seq_len, int64_t batch, int64_t heads, int64_t head_dim,
                      int64_t ss, int64_t sb, int64_t sh, size_t es)
{
    if (seq_len <= 0 || batch <= 0 || heads <= 0 || head_dim <= 0)
        return 0;
    /* the host checks bounded this extent (fr_apply_prepare) */
    return (size_t)((seq_len - 1) * ss + (batch - 1) * sb + (heads - 1) * sh + head_dim) * es;
}

/* --------------------------------------------------------------- positions */

void gpu_mirror_add_positions(gpu_mirror *m, const fr_pos_args *pa, int64_t batch)
{
    /* lengths as fr_apply_prepare checks them: ids has batch x seq_len
     * entries per row (THD: batch 1, seq_len the packed tokens), its last
     * row ids_rows - 1 strides in; offsets one per sequence (THD) or batch
     * entry; cu_seqlens num_seqs + 1 */
    if (pa->ids != NULL) {
        const int64_t rows = pa->ids_rows > 1 ? pa->ids_rows : 1;
        const int64_t n = (rows - 1) * pa->ids_row_stride + batch * pa->seq_len;
        gpu_mirror_add(m, pa->ids, (size_t)n * sizeof(int64_t), 0);
    }
    if (pa->offsets != NULL)
        gpu_mirror_add(m, pa->offsets,
                       (size_t)(pa->cu_seqlens ? pa->num_seqs : batch) * sizeof(int64_t), 0);
    if (pa->cu_seqlens != NULL)
        gpu_mirror_add(m, pa->cu_seqlens, (size_t)(pa->num_seqs + 1) * sizeof(int32_t), 0);
}

fr_pos_args gpu_positions_on_device(const gpu_mirror *m, const fr_pos_args *pa)
{
    fr_pos_args d = *pa;
    d.ids = gpu_mirror_dev(m, pa->ids);
    d.offsets = gpu_mirror_dev(m, pa->offsets);
    d.cu_seqlens = gpu_mirror_dev(m, pa->cu_seqlens);
    return d;
}

/* ------------------------------------------------------------------- cache */

/* Whether the CPU cache has a table: the kernels read cos/sin only then
 * (kernels/cuda_apply.cu: max_positions > 0). */
static int has_table(const fusedrope_cache *c)
{
    return c->max_positions > 0 && c->cos != NULL && c->sin != NULL;
}

void gpu_mirror_add_cache(gpu_mirror *m, const fusedrope_cache *cpu)
{
    const size_t half = (size_t)(cpu->rot_dim / 2);
    if (has_table(cpu)) {
        const size_t bytes = (size_t)cpu->max_positions * half * sizeof(float);
        gpu_mirror_add(m, cpu->cos, bytes, 0);
        gpu_mirror_add(m, cpu->sin, bytes, 0);
    }
    /* kernels/cuda_cache.cu keeps the rot_dim/2 inverse frequencies on the
     * device whenever the cache has them (every rope type, table or not;
     * a user table has none), and the axes map where there is one */
    gpu_mirror_add(m, cpu->inv_freq, half * sizeof(double), 0);
    gpu_mirror_add(m, cpu->pair_map, half * sizeof(int32_t), 0);
}

void gpu_cache_twin(const gpu_mirror *m, const fusedrope_cache *cpu, int *flag_dev,
                    fusedrope_cache *twin)
{
    int dev = 0;
    gpu_check(cudaGetDevice(&dev), "cudaGetDevice");
    *twin = *cpu;
    twin->device = FUSEDROPE_DEVICE_CUDA;
    twin->cos = has_table(cpu) ? gpu_mirror_dev(m, cpu->cos) : NULL;
    twin->sin = has_table(cpu) ? gpu_mirror_dev(m, cpu->sin) : NULL;
    twin->inv_freq_dev = gpu_mirror_dev(m, cpu->inv_freq);
    twin->pair_map_dev = gpu_mirror_dev(m, cpu->pair_map);
    twin->dev_block = NULL; /* the mirror owns the memory; only a release frees dev_block */
    twin->range_flag = NULL;
    twin->range_flag_dev = flag_dev;
    twin->cuda_device = dev;
}

void gpu_mirror_add_apply(gpu_mirror *m, const fr_apply_args *a)
{
    const size_t es = fr_dtype_size(a->dtype);
    for (int k = 0; k < a->count; k++) {
        const fr_io *io = &a->io[k];
        gpu_mirror_add(m, io->in,
                       gpu_view_bytes(a->seq_len, a->batch, io->heads, io->head_dim, io->in_ss,
                                      io->in_sb, io->in_sh, es),
                       0);
        gpu_mirror_add(m, io->out,
                       gpu_view_bytes(a->seq_len, a->batch, io->heads, io->head_dim, io->out_ss,
                                      io->out_sb, io->out_sh, es),
                       1);
    }
    gpu_mirror_add_positions(m, &a->pos, a->batch);
    gpu_mirror_add_cache(m, a->cache);
}

fr_apply_args gpu_apply_on_device(const gpu_mirror *m, const fr_apply_args *a, int *words,
                                  fusedrope_cache *twin)
{
    fr_apply_args e = *a;
    gpu_cache_twin(m, a->cache, &words[0], twin);
    e.cache = twin;
    e.pos = gpu_positions_on_device(m, &a->pos);
    for (int k = 0; k < a->count; k++) {
        e.io[k].in = gpu_mirror_dev(m, a->io[k].in);
        e.io[k].out = gpu_mirror_dev(m, a->io[k].out);
    }
    e.range_status = a->range_status != NULL ? (int32_t *)&words[1] : NULL;
    e.stream = NULL;
    return e;
}

/* ------------------------------------------------------------ range words */

int *gpu_words_new(void)
{
    int *w = NULL;
    gpu_check(cudaMalloc((void **)&w, 2 * sizeof *w), "cudaMalloc of the range words");
    gpu_check(cudaMemset(w, 0, 2 * sizeof *w), "cudaMemset of the range words");
    return w;
}

void gpu_words_check(int *words, const char *what)
{
    int got[2] = { -1, -1 };
    gpu_check(cudaMemcpy(got, words, sizeof got, cudaMemcpyDeviceToHost),
              "cudaMemcpy of the range words");
    gpu_check(cudaFree(words), "cudaFree of the range words");
    if (got[0] != 0 || got[1] != 0) {
        fprintf(stderr,
                "%s: the kernels raised the range flag (%d) or pos->range_status (%d) for "
                "positions the host checks had passed\n",
                what, got[0], got[1]);
        abort();
    }
}
