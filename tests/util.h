/*
 * util.h - helpers shared by the libcheck suites: a seeded random generator,
 * tracked allocations, tensor layouts, poisoning and byte snapshots.
 */
#ifndef FUSEDROPE_TEST_UTIL_H
#define FUSEDROPE_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <check.h>

/* libcheck's ck_assert_msg (every ck_assert* is built on it) without the
 * mark point a passing check leaves: in fork mode each one was a write(2) to
 * the parent process, millions of them where a test checks element by
 * element (test_kernel_emu 4.9 M, test_fpenv 2.9 M, test_norm 1.8 M), and
 * under ASan the parent's freed message buffers filled its quarantine, which
 * LeakSanitizer then walked at every forked test's exit (bench/RESULTS.md).
 * A failure is reported as before; a crash is reported at the test's start
 * instead of after its last passing check (the sanitizers and valgrind give
 * the stack). */
#undef ck_assert_msg
#define ck_assert_msg(expr, ...)                                                                 \
    ((expr) ? (void)0                                                                            \
            : _ck_assert_failed(__FILE__, __LINE__, "Assertion '" #expr "' failed", ##__VA_ARGS__))

#include "fusedrope.h"
#include "ref.h"
#include "under_valgrind.h"

/* ------------------------------------------------------------------ seeding */

/* The run's seed: FUSEDROPE_TEST_SEED if set, else time ^ pid.  Set by tu_main. */
extern uint64_t tu_seed;

typedef struct { uint64_t s; } tu_rng;
/* A generator for one test: the run's seed mixed with a test-specific stream. */
void tu_rng_init(tu_rng *r, uint64_t stream);
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r, double lo, double hi);
int64_t tu_int(tu_rng *r, int64_t lo, int64_t hi); /* inclusive */
/* Device-style positions for the emulated kernels' random cases
 * (test_kernel_emu, test_norm_kernel_emu): a position in a table of `rows`
 * rows, one in six outside it (negative, just past, far past, an int64
 * end); and a cu_seqlens of n sequences over `tokens` tokens: a valid split
 * (sequences maybe empty), the right ends with an entry inside below the one
 * before it (n >= 2), or anything near the tokens with the int32 ends.
 * tu_cu_seqlens returns whether cu is valid (cu[0] 0, never decreasing,
 * cu[n] the tokens). */
int64_t tu_position(tu_rng *r, int64_t rows);
/* An offset for a batch entry of S tokens: tu_position less up to S (the
 * int64 ends as they are, where s + offset passes them). */
int64_t tu_offset(tu_rng *r, int64_t rows, int64_t S);
int tu_cu_seqlens(tu_rng *r, int32_t *cu, int n, int64_t tokens);
/* Which tokens of a call (bad[b * S + s]; THD: the packed index, B 1) have
 * no position in a table of `rows` rows on some of naxes axes, by tests/ref.c's
 * position model (ref_axis_positions; a cu_seqlens must be valid); returns
 * whether any has none. */
int tu_bad_tokens(const fusedrope_positions *pos, int naxes, int64_t S, int64_t B,
                   int64_t rows, int *bad);

/* OpenMP threads for the library's calls in this test: n, or (n <= 0) at least
 * two, so that the threaded paths run.  A no-op without OpenMP. */
void tu_threads(int n);


/* Runs a suite (CK_FORK default) after printing the seed; returns the exit status. */
int tu_main(Suite *s, const char *name);

/* ------------------------------------------------------------- allocations */

/* Zero-initialised allocation freed by tu_free_all() (fails the test on ENOMEM). */
void *tu_alloc(size_t n);
void *tu_dup(const void *p, size_t n);
/* Registers a cache to be destroyed by tu_free_all(); returns it. */
fusedrope_cache *tu_track(fusedrope_cache *c);
void tu_free_all(void);

/* ----------------------------------------------------------------- tensors */

enum {
    LAY_SBHD,     /* fusedrope_tensor_sbhd */
    LAY_BSHD,     /* fusedrope_tensor_bshd */
    LAY_SBHD_PAD, /* sbhd with padding between heads, batches and tokens; misaligned start */
    LAY_BSHD_PAD, /* bshd with padding; misaligned start */
    LAY_HSBD,     /* heads outermost: stride_head > stride_seq > stride_batch */
    LAY_THD,      /* fusedrope_tensor_thd (batch must be 1) */
    LAY_NUM
};
const char *tu_layout_name(int kind);

/* A buffer and a view into it. */
typedef struct tu_buf {
    unsigned char *p;
    size_t nbytes;
    fusedrope_dtype dt;
} tu_buf;

/* Allocates a buffer of n elements (plus a guard tail), poisoned. */
tu_buf tu_buf_new(fusedrope_dtype dt, int64_t n);
/* A view of layout `kind` at the buffer's start (plus the layout's lead). */
fusedrope_tensor tu_view(int kind, tu_buf *buf, int64_t s, int64_t b, int64_t h, int64_t d);
/* Elements a layout needs, lead included. */
int64_t tu_layout_elems(int kind, int64_t s, int64_t b, int64_t h, int64_t d);
/* A buffer sized for layout `kind` and the view into it. */
fusedrope_tensor tu_tensor(int kind, fusedrope_dtype dt, int64_t s, int64_t b, int64_t h,
                           int64_t d, tu_buf *buf);

/* Fills n elements at p with random values of the dtype in [lo, hi]. */
void tu_fill(void *p, int64_t n, fusedrope_dtype dt, tu_rng *r, double lo, double hi);
/* Fills every element of a buffer with random values of the dtype in [lo, hi]. */
void tu_fill_random(tu_buf *b, tu_rng *r, double lo, double hi);
/* Fills the view's elements with random values (the rest of the buffer is kept). */
void tu_fill_view(const fusedrope_tensor *t, tu_rng *r, double lo, double hi);
/* 0xff in every byte: a NaN in all three dtypes. */
void tu_poison(tu_buf *b);
/* A copy of a buffer. */
tu_buf tu_buf_copy(const tu_buf *b);
/* The same view, moved from buffer `from` to buffer `to` (same offset). */
fusedrope_tensor tu_rebase(const fusedrope_tensor *t, const tu_buf *from, const tu_buf *to);

/* Marks in mask[nbytes] (1) the bytes of buf that the view's elements occupy. */
void tu_mask_view(const tu_buf *buf, const fusedrope_tensor *t, unsigned char *mask);
/* Number of bytes outside the mask that differ between buf and snapshot. */
size_t tu_changed_outside(const tu_buf *buf, const tu_buf *snap, const unsigned char *mask,
                          size_t *first);
/* Number of bytes that differ. */
size_t tu_changed(const tu_buf *buf, const tu_buf *snap, size_t *first);

/* Positions for a case, filled by ref_positions. */
int64_t *tu_positions(const fusedrope_positions *pos, int64_t seq_len, int64_t batch);

/* One forked test running name##_body(_i * k + v) for v < k: forks are the
 * costly part of a test under valgrind and the sanitizers. */
#define TU_GROUPED_TEST(name, k)                                                          \
    START_TEST(name)                                                                      \
    {                                                                                     \
        for (int v_ = 0; v_ < (k); v_++)                                                  \
            name##_body(_i * (k) + v_);                                                   \
    }                                                                                     \
    END_TEST

/* Case-insensitive substring test. */
int tu_contains(const char *hay, const char *needle);

/* Whether a test comparing the CPU backend's paths (the library's choice,
 * AVX2 alone, portable) may leave the first out: under valgrind, which
 * hides AVX-512 from the CPU-feature check, the library's choice is the
 * AVX2 path, which the test runs anyway. */
int tu_skip_default_path(void);

/* The CPU backend's path for the calls that follow: 0 the library's choice
 * (AVX-512 where the CPU has it), 1 AVX2 alone (fr_avx512_off), 2 the
 * portable loops (fr_avx2_off, which turns AVX-512 off too). */
void tu_cpu_path(int p);

#endif /* FUSEDROPE_TEST_UTIL_H */
