/*
 * test_apply.c - forward, backward and their _qk forms against the float64
 * reference: every layout x style x dtype x position mode x in/out of place,
 * poisoned outputs (every element checked, bytes outside the view untouched),
 * odd sizes, partial rotary, packed QKV views, round trips, table-less caches,
 * context parallelism.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "fusedrope.h"
#include "ref.h"
#include "util.h"

#define CPU FUSEDROPE_DEVICE_CPU
#define MSG 2048

static const fusedrope_dtype dtypes[3] = {FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                          FUSEDROPE_BFLOAT16};
static const char *style_name(fusedrope_style s)
{
    return s == FUSEDROPE_NEOX ? "neox" : "interleaved";
}

/* ------------------------------------------------------------------ caches */

enum { K_DEFAULT, K_TABLELESS, K_YARN, K_USER, K_NUM };
static const char *kind_names[K_NUM] = {"default", "table-less", "yarn", "user-table"};
#define USER_ROWS 600
/* Rows of the default and YaRN tables (a test may raise it before make_cache). */
static int64_t table_rows = 512;

/* test_apply_emu (TU_EMULATED) under valgrind leaves out the large cases:
 * what they add at their sizes is the OpenMP backend's (its threads, its
 * streamed stores) or the host's overlap sweep, which test_apply checks
 * under valgrind; the kernels run the same code at the small sizes.  They
 * were 56 of test_apply_emu's 178 s there (bench/RESULTS.md). */
static int large_left_out(void)
{
#ifdef TU_EMULATED
    return tu_under_valgrind();
#else
    return 0;
#endif
}

typedef struct cache_pair {
    fusedrope_cache *cache;
    ref_rope ref;
    int64_t rows; /* table rows (0: table-less, any position valid) */
} cache_pair;

/* Caches made in this test, reused by later cases of the same test. */
static struct { int kind, rot_dim; int64_t rows; cache_pair cp; } memo[16];
static int nmemo;

/* Ends a test: destroys its caches and frees its allocations. */
static void end_test(void)
{
    nmemo = 0;
    tu_free_all();
}

static void make_cache_new(cache_pair *cp, int kind, int rot_dim, tu_rng *r);

static void make_cache(cache_pair *cp, int kind, int rot_dim, tu_rng *r)
{
    int k;
    for (k = 0; k < nmemo; k++)
        if (memo[k].kind == kind && memo[k].rot_dim == rot_dim && memo[k].rows == table_rows) {
            *cp = memo[k].cp;
            return;
        }
    make_cache_new(cp, kind, rot_dim, r);
    if (nmemo < 16) {
        memo[nmemo].kind = kind;
        memo[nmemo].rot_dim = rot_dim;
        memo[nmemo].rows = table_rows;
        memo[nmemo].cp = *cp;
        nmemo++;
    }
}

static void make_cache_new(cache_pair *cp, int kind, int rot_dim, tu_rng *r)
{
    fusedrope_cache_config cfg;
    fusedrope_status st;
    memset(cp, 0, sizeof *cp);
    if (kind == K_USER) {
        int64_t n = (int64_t)USER_ROWS * (rot_dim / 2), k;
        float *c = tu_alloc(sizeof(float) * (size_t)n), *s = tu_alloc(sizeof(float) * (size_t)n);
        for (k = 0; k < n; k++) {
            double ang = tu_uniform(r, -3.2, 3.2);
            c[k] = (float)(1.1 * cos(ang)); /* a folded-in attention factor 1.1 */
            s[k] = (float)(1.1 * sin(ang));
        }
        st = fusedrope_cache_create_from_table(c, s, USER_ROWS, rot_dim, CPU, &cp->cache);
        ck_assert_msg(st == FUSEDROPE_OK, "create_from_table: %s (%s)",
                      fusedrope_status_string(st), fusedrope_last_error());
        ref_rope_from_table(&cp->ref, c, s, USER_ROWS, rot_dim);
        cp->rows = USER_ROWS;
        tu_track(cp->cache);
        return;
    }
    fusedrope_cache_config_init(&cfg, kind == K_YARN ? FUSEDROPE_ROPE_YARN
                                                     : FUSEDROPE_ROPE_DEFAULT,
                                rot_dim, kind == K_TABLELESS ? 0 : table_rows, 10000.0);
    if (kind == K_YARN) {
        cfg.factor = 8;
        cfg.original_max_positions = 256; /* a = 1 + 0.1 ln 8 */
    }
    st = fusedrope_cache_create(&cfg, CPU, &cp->cache);
    ck_assert_msg(st == FUSEDROPE_OK, "cache_create: %s (%s)", fusedrope_status_string(st),
                  fusedrope_last_error());
    tu_track(cp->cache);
    ck_assert_int_eq(ref_rope_from_config(&cp->ref, &cfg), 0);
    cp->rows = cfg.max_positions;
    /* ref's inv_freq is freed with the test (tracked by hand below) */
    {
        double *keep = tu_dup(cp->ref.inv_freq, sizeof(double) * (size_t)(rot_dim / 2));
        ref_rope_free(&cp->ref);
        cp->ref.inv_freq = keep;
    }
}

/* --------------------------------------------------------------- positions */

enum {
    PM_NULL,        /* pos pointer NULL */
    PM_ZERO,        /* a zeroed struct: cp_size 0 counts as 1; num_seqs ignored w/o cu */
    PM_OFFSETS,
    PM_IDS,
    PM_CP2R0, PM_CP2R1, PM_CP4R0, PM_CP4R1, PM_CP4R2, PM_CP4R3,
    PM_CP4R2_OFFSETS,
    PM_NUM
};
static const char *pm_names[PM_NUM] = {"NULL", "zeroed", "offsets", "ids", "cp2r0", "cp2r1",
                                       "cp4r0", "cp4r1", "cp4r2", "cp4r3", "cp4r2+offsets"};
static int pm_cp(int pm, int *rank)
{
    switch (pm) {
    case PM_CP2R0: *rank = 0; return 2;
    case PM_CP2R1: *rank = 1; return 2;
    case PM_CP4R0: *rank = 0; return 4;
    case PM_CP4R1: *rank = 1; return 4;
    case PM_CP4R2: case PM_CP4R2_OFFSETS: *rank = 2; return 4;
    case PM_CP4R3: *rank = 3; return 4;
    }
    *rank = 0;
    return 1;
}

/*
 * Fills *p for mode pm (cu/nseq: THD, else NULL/0) and returns the pointer to
 * pass (NULL for PM_NULL).  Offsets and ids are drawn so that every position
 * is inside the table (any non-negative value for a table-less cache).
 */
static const fusedrope_positions *make_positions(fusedrope_positions *p, int pm, int64_t S,
                                                 int64_t B, const int32_t *cu, int64_t nseq,
                                                 int64_t rows, tu_rng *r)
{
    int64_t k, maxp = 0, *tmp;
    int64_t limit = rows ? rows : 1000000;
    fusedrope_positions_init(p);
    if (pm == PM_NULL && !cu)
        return NULL;
    p->cu_seqlens = cu;
    p->num_seqs = cu ? nseq : -7; /* ignored without cu_seqlens */
    p->cp_size = pm == PM_ZERO ? 0 : pm_cp(pm, &p->cp_rank);
    if (pm == PM_ZERO)
        p->cp_rank = 0;
    tmp = tu_alloc(sizeof(int64_t) * (size_t)(S * B + 1));
    ref_positions(p, S, B, tmp);
    for (k = 0; k < S * B; k++)
        if (tmp[k] > maxp)
            maxp = tmp[k];
    if (pm == PM_OFFSETS || pm == PM_CP4R2_OFFSETS) {
        int64_t n = cu ? nseq : B, hi = limit - 1 - maxp;
        int64_t *off = tu_alloc(sizeof(int64_t) * (size_t)n);
        ck_assert(hi >= 0);
        for (k = 0; k < n; k++)
            off[k] = tu_int(r, 0, hi);
        off[0] = hi; /* the last row of the table is reached */
        p->offsets = off;
    }
    if (pm == PM_IDS) {
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(S * B + 1));
        for (k = 0; k < S * B; k++)
            ids[k] = tu_int(r, 0, limit - 1);
        if (S * B > 1) {
            ids[0] = limit - 1;
            ids[1] = 0;
        }
        p->ids = ids;
    }
    return p;
}

/* ----------------------------------------------------------- generic runner */

typedef struct apply_case {
    int lx, ly;              /* layouts of x and y */
    fusedrope_dtype dt;
    fusedrope_style style;
    int pm;
    int inplace, backward;
    int kind;                /* cache kind */
    int rot_dim;
    int64_t S, B, H, D;
    const int32_t *cu;       /* THD sequences (layout THD), or NULL */
    int64_t nseq;
    double lo, hi;           /* input range */
    uint64_t stream;
} apply_case;

static void describe(const apply_case *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "[seed %llu stream %llu] x=%s y=%s %s %s pos=%s %s %s cache=%s rot=%d "
             "S=%lld B=%lld H=%lld D=%lld%s",
             (unsigned long long)tu_seed, (unsigned long long)c->stream, tu_layout_name(c->lx),
             c->inplace ? "(in place)" : tu_layout_name(c->ly), ref_dtype_name(c->dt),
             style_name(c->style), pm_names[c->pm], c->inplace ? "in-place" : "out-of-place",
             c->backward ? "backward" : "forward", kind_names[c->kind], c->rot_dim,
             (long long)c->S, (long long)c->B, (long long)c->H, (long long)c->D,
             c->cu ? " thd" : "");
}

static fusedrope_status call1(const fusedrope_cache *cache, fusedrope_style style,
                              const fusedrope_positions *pos, const fusedrope_tensor *in,
                              const fusedrope_tensor *out, int backward)
{
    return backward ? fusedrope_backward(cache, style, pos, in, out, NULL)
                    : fusedrope_forward(cache, style, pos, in, out, NULL);
}

/* Checks y (a view of ybuf) against the reference applied to xorig; bytes of
 * ybuf outside the view must equal ysnap. */
static void verify(const char *what, const ref_rope *ref, fusedrope_style style,
                   const int64_t *positions, const fusedrope_tensor *xorig,
                   const fusedrope_tensor *y, const tu_buf *ybuf, const tu_buf *ysnap,
                   int backward)
{
    char msg[MSG];
    int64_t bad = ref_check_apply(ref, style, positions, xorig, y, backward, msg, sizeof msg);
    ck_assert_msg(bad == 0, "%s: %lld bad elements: %s", what, (long long)bad, msg);
    if (ybuf) {
        unsigned char *mask = tu_alloc(ybuf->nbytes);
        size_t first = 0, n;
        tu_mask_view(ybuf, y, mask);
        n = tu_changed_outside(ybuf, ysnap, mask, &first);
        ck_assert_msg(n == 0, "%s: %zu bytes outside the output view were written (first at "
                      "byte %zu)", what, n, first);
    }
}

static void run_case(const apply_case *c)
{
    cache_pair cp;
    tu_rng r;
    tu_buf xb, yb, xsnap, ysnap;
    fusedrope_tensor x, y, xorig;
    fusedrope_positions P;
    const fusedrope_positions *pos;
    int64_t *positions;
    fusedrope_status st;
    char what[512];

    describe(c, what, sizeof what);
    tu_rng_init(&r, c->stream);
    make_cache(&cp, c->kind, c->rot_dim, &r);

    x = tu_tensor(c->lx, c->dt, c->S, c->B, c->H, c->D, &xb);
    tu_fill_random(&xb, &r, c->lo, c->hi);
    if (c->inplace) {
        yb = xb;
        y = x;
    } else {
        y = tu_tensor(c->ly, c->dt, c->S, c->B, c->H, c->D, &yb);
    }
    xsnap = tu_buf_copy(&xb);
    ysnap = tu_buf_copy(&yb);
    xorig = tu_rebase(&x, &xb, &xsnap);

    pos = make_positions(&P, c->pm, c->S, c->B, c->cu, c->nseq, cp.rows, &r);
    positions = tu_positions(pos, c->S, c->B);

    st = call1(cp.cache, c->style, pos, &x, &y, c->backward);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: returned %s (%s)", what, fusedrope_status_string(st),
                  fusedrope_last_error());
    verify(what, &cp.ref, c->style, positions, &xorig, &y, &yb, &ysnap, c->backward);
    if (!c->inplace) {
        size_t first = 0, n = tu_changed(&xb, &xsnap, &first);
        ck_assert_msg(n == 0, "%s: the input was modified (%zu bytes, first %zu)", what, n,
                      first);
    }
}

/* ---------------------------------------------------------------- the matrix */

static const int32_t thd_cu[] = {0, 5, 5, 12, 13, 13, 17};      /* lengths 5 0 7 1 0 4 */
static const int32_t thd_cu_even[] = {0, 4, 4, 10, 12, 12, 16}; /* lengths 4 0 6 2 0 4 */
static const int64_t head_dims[LAY_NUM] = {80, 96, 72, 66, 64, 80};

/* layouts x 2 styles x PM_NUM; each runs 3 dtypes x in/out of place x fwd/bwd */
#define MATRIX_N (LAY_NUM * 2 * PM_NUM)

START_TEST(test_matrix)
{
    apply_case c;
    int i = _i, cp_size, rank, v;
    memset(&c, 0, sizeof c);
    c.pm = i % PM_NUM; i /= PM_NUM;
    c.style = (fusedrope_style)(i % 2); i /= 2;
    c.lx = i % LAY_NUM;
    c.kind = (c.lx + c.pm + (int)c.style) % K_NUM;
    c.rot_dim = 64;
    c.D = head_dims[c.lx];
    c.H = 2;
    cp_size = pm_cp(c.pm, &rank);
    if (c.lx == LAY_THD) {
        c.B = 1;
        c.cu = cp_size > 1 ? thd_cu_even : thd_cu;
        c.nseq = 6;
        c.S = c.cu[6];
        c.ly = (c.pm % 3 == 0) ? LAY_THD : (c.pm % 3 == 1 ? LAY_SBHD_PAD : LAY_HSBD);
    } else {
        c.B = 2;
        c.S = cp_size > 1 ? 16 : 17;
        c.ly = (c.lx + 2 + c.pm) % (LAY_NUM - 1); /* any layout but THD */
    }
    c.lo = -4;
    c.hi = 4;
    for (v = 0; v < 12; v++) {
        c.backward = v % 2;
        c.inplace = (v / 2) % 2;
        c.dt = dtypes[v / 4];
        c.stream = 1000 + 12 * (uint64_t)_i + (uint64_t)v;
        /* under valgrind each direction and placement once, the dtype
         * turning with _i */
        if (tu_valgrind_skips(c.backward + c.inplace + v / 4 + _i, 3))
            continue;
        run_case(&c);
    }
    end_test();
}
END_TEST

/* --------------------------------------------- rot_dim / head_dim variants */

static void test_rot_dims_body(int _i)
{
    static const struct { int rot; int64_t d; } rd[] = {
        {2, 64}, {8, 9}, {32, 96}, {64, 72}, {72, 72}, {80, 80}, {96, 96}, {16, 17}, {128, 130},
        /* wider than the CPU backend's 512-pair rows: several, and a 1-pair tail */
        {2050, 2056}, {FUSEDROPE_MAX_ROT_DIM, FUSEDROPE_MAX_ROT_DIM},
    };
    int i = _i;
    apply_case c;
    memset(&c, 0, sizeof c);
    c.style = (fusedrope_style)(i % 2); i /= 2;
    c.dt = dtypes[i % 3]; i /= 3;
    c.backward = i % 2; i /= 2;
    /* under valgrind the two widest rows (most of this test's time there)
     * in 4 of their 12 variants, every style, dtype and direction among
     * them; memcheck watches the same code paths */
    if (rd[i].rot > 512 && tu_valgrind_skips((int)c.style + (_i / 2) % 3 + c.backward, 3))
        return;
    c.rot_dim = rd[i].rot;
    c.D = rd[i].d;
    c.lx = LAY_SBHD_PAD;
    c.ly = LAY_BSHD;
    c.inplace = (i + _i) % 2;
    c.pm = PM_OFFSETS;
    c.kind = i % 2 ? K_YARN : K_DEFAULT;
    c.S = 7;
    c.B = 2;
    c.H = 3;
    c.lo = -2;
    c.hi = 2;
    c.stream = 5000 + (uint64_t)_i;
    run_case(&c);
    end_test();
}
TU_GROUPED_TEST(test_rot_dims, 3)

/* one token, one head; many THD sequences with empty ones */
static void test_one_token_body(int _i)
{
    int i = _i;
    apply_case c;
    memset(&c, 0, sizeof c);
    c.style = (fusedrope_style)(i % 2); i /= 2;
    c.dt = dtypes[i % 3]; i /= 3;
    c.inplace = i % 2; i /= 2;
    c.backward = i % 2;
    c.lx = LAY_SBHD;
    c.ly = LAY_BSHD_PAD;
    c.pm = PM_OFFSETS;
    c.kind = K_DEFAULT;
    c.rot_dim = 64;
    c.S = 1;
    c.B = 1;
    c.H = 1;
    c.D = 64;
    c.lo = -3;
    c.hi = 3;
    c.stream = 6000 + (uint64_t)_i;
    run_case(&c);
    end_test();
}
TU_GROUPED_TEST(test_one_token, 4)

static void test_thd_many_body(int _i)
{
    int i = _i, k, n = 40, cp2;
    apply_case c;
    int32_t *cu;
    tu_rng r;
    memset(&c, 0, sizeof c);
    tu_rng_init(&r, 7000 + (uint64_t)_i);
    c.style = (fusedrope_style)(i % 2); i /= 2;
    c.dt = dtypes[i % 3]; i /= 3;
    c.pm = (int[]){PM_ZERO, PM_OFFSETS, PM_IDS, PM_CP2R1, PM_CP4R3}[i % 5]; i /= 5;
    c.inplace = i % 2;
    c.backward = !c.inplace;
    cp2 = c.pm == PM_CP2R1 || c.pm == PM_CP4R3;
    cu = tu_alloc(sizeof(int32_t) * (size_t)(n + 1));
    cu[0] = 0;
    for (k = 0; k < n; k++) {
        int len = (int)tu_int(&r, 0, 5);
        if (k == 0 || k == n - 1 || k % 7 == 3)
            len = 0; /* empty first, last and some middle sequences */
        if (cp2)
            len &= ~1;
        cu[k + 1] = cu[k] + len;
    }
    c.cu = cu;
    c.nseq = n;
    c.S = cu[n];
    c.B = 1;
    c.H = 2;
    c.D = 40;
    c.rot_dim = 32;
    c.lx = LAY_THD;
    c.ly = LAY_SBHD_PAD;
    c.kind = (int)(_i % K_NUM);
    c.lo = -4;
    c.hi = 4;
    c.stream = 7100 + (uint64_t)_i;
    run_case(&c);
    end_test();
}
TU_GROUPED_TEST(test_thd_many, 3)

/* tiny and huge magnitudes: fp16 subnormal outputs (the ulp floor), bf16 range */
static void test_magnitudes_body(int _i)
{
    static const struct { fusedrope_dtype dt; double lo, hi; } m[] = {
        {FUSEDROPE_FLOAT16, -2e-5, 2e-5},      /* subnormal fp16 (< 6.1e-5) */
        {FUSEDROPE_FLOAT16, -20000, 20000},    /* large, no overflow */
        {FUSEDROPE_BFLOAT16, -1e-30, 1e-30},
        {FUSEDROPE_BFLOAT16, -1e30, 1e30},
        {FUSEDROPE_FLOAT32, -1e-20, 1e-20},
        {FUSEDROPE_FLOAT32, -1e30, 1e30},
        {FUSEDROPE_FLOAT16, -0.01, 0.01},
        {FUSEDROPE_FLOAT32, -2e-38, 2e-38},    /* float32 subnormals among the inputs */
    };
    int i = _i;
    apply_case c;
    memset(&c, 0, sizeof c);
    c.style = (fusedrope_style)(i % 2); i /= 2;
    c.backward = i % 2; i /= 2;
    c.dt = m[i].dt;
    c.lo = m[i].lo;
    c.hi = m[i].hi;
    c.lx = LAY_BSHD;
    c.ly = LAY_SBHD;
    c.pm = PM_IDS;
    c.kind = i % 2 ? K_YARN : K_DEFAULT;
    c.rot_dim = 64;
    c.S = 9;
    c.B = 2;
    c.H = 2;
    c.D = 64;
    c.stream = 8000 + (uint64_t)_i;
    run_case(&c);
    end_test();
}
TU_GROUPED_TEST(test_magnitudes, 4)

/* ------------------------------------------------- inputs that overlap etc. */

/* An input that overlaps itself (stride_batch 0: one sequence broadcast over
 * the batch) is fine; the output is a plain tensor. */
static void test_broadcast_input_body(int _i)
{
    int i = _i;
    fusedrope_dtype dt = dtypes[i % 3];
    fusedrope_style style = (fusedrope_style)((i / 3) % 2);
    int backward = i / 6;
    cache_pair cp;
    tu_rng r;
    tu_buf xb, yb, ysnap;
    fusedrope_tensor x, y;
    fusedrope_positions P;
    int64_t *positions, S = 6, B = 3, H = 2, D = 20;
    char what[128];
    tu_rng_init(&r, 9000 + (uint64_t)_i);
    make_cache(&cp, K_DEFAULT, 16, &r);
    xb = tu_buf_new(dt, S * H * D);
    tu_fill_random(&xb, &r, -2, 2);
    x = tu_view(LAY_SBHD, &xb, S, B, H, D);
    x.stride_batch = 0;
    x.stride_seq = H * D;
    y = tu_tensor(LAY_SBHD, dt, S, B, H, D, &yb);
    ysnap = tu_buf_copy(&yb);
    fusedrope_positions_init(&P);
    P.cp_size = 1;
    P.offsets = (int64_t[]){0, 100, 505};
    positions = tu_positions(&P, S, B);
    snprintf(what, sizeof what, "broadcast input %s %s %s [seed %llu]", ref_dtype_name(dt),
             style_name(style), backward ? "backward" : "forward",
             (unsigned long long)tu_seed);
    ck_assert_int_eq(call1(cp.cache, style, &P, &x, &y, backward), FUSEDROPE_OK);
    verify(what, &cp.ref, style, positions, &x, &y, &yb, &ysnap, backward);
    end_test();
}
TU_GROUPED_TEST(test_broadcast_input, 3)

/* x and y interleaved in one buffer without sharing a byte: allowed.  The
 * views: [s][b][h][2][d], x = slot 0, y = slot 1. */
static void interleaved_xy(fusedrope_dtype dt, fusedrope_style style, int64_t S, int64_t B,
                           int64_t H, int64_t D, int rot_dim, uint64_t stream)
{
    cache_pair cp;
    tu_rng r;
    tu_buf b, snap;
    fusedrope_tensor x, y, xorig;
    int64_t *positions;
    fusedrope_status st;
    char what[160];
    tu_rng_init(&r, stream);
    make_cache(&cp, K_DEFAULT, rot_dim, &r);
    b = tu_buf_new(dt, S * B * H * 2 * D);
    tu_fill_random(&b, &r, -2, 2);
    snap = tu_buf_copy(&b);
    x = tu_view(LAY_SBHD, &b, S, B, H, D);
    x.stride_head = 2 * D;
    x.stride_batch = H * 2 * D;
    x.stride_seq = B * H * 2 * D;
    y = x;
    y.data = (unsigned char *)x.data + (size_t)D * ref_dtype_size(dt);
    xorig = tu_rebase(&x, &b, &snap);
    positions = tu_positions(NULL, S, B);
    snprintf(what, sizeof what, "interleaved x/y views of %lld heads %s %s [seed %llu]",
             (long long)H, ref_dtype_name(dt), style_name(style), (unsigned long long)tu_seed);
    st = fusedrope_forward(cp.cache, style, NULL, &x, &y, NULL);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: %s (%s)", what, fusedrope_status_string(st),
                  fusedrope_last_error());
    /* y right, and x (outside y's view) unchanged */
    verify(what, &cp.ref, style, positions, &xorig, &y, &b, &snap, 0);
    end_test();
}

static void test_interleaved_xy_views_body(int _i)
{
    interleaved_xy(dtypes[_i % 3], (fusedrope_style)((_i / 3) % 2), 5, 2, 3, 24, 24,
                   9100 + (uint64_t)_i);
}
TU_GROUPED_TEST(test_interleaved_xy_views, 3)

/* The same at the bound of the overlap sweep: x and y of 2^19 heads each
 * (2^20 in all, the largest count the library still sweeps): allowed, not
 * refused as overlapping. */
START_TEST(test_interleaved_views_heads_limit)
{
    if (large_left_out())
        return;
    interleaved_xy(dtypes[_i % 3], FUSEDROPE_NEOX, 1, 1, (int64_t)1 << 19, 2, 2,
                   9150 + (uint64_t)_i);
}
END_TEST

/* -------------------------------------------------------------- round trip */

/* forward then backward gives attn^2 x, within the bound applied twice. */
static void test_round_trip_body(int _i)
{
    int i = _i;
    fusedrope_dtype dt = dtypes[i % 3];
    fusedrope_style style = (fusedrope_style)((i / 3) % 2);
    int inplace = (i / 6) % 2;
    int kind = (i / 12) % 3; /* default, table-less, yarn */
    cache_pair cp;
    tu_rng r;
    tu_buf xb, yb, zb, xsnap;
    fusedrope_tensor x, y, z;
    fusedrope_positions P;
    const fusedrope_positions *pos;
    int64_t *positions, S = 8, B = 3, H = 3, D = 72, s, b, h, bad = 0;
    int rot = 64, half = 32, k;
    double a2;
    char first[512] = "";
    tu_rng_init(&r, 9200 + (uint64_t)_i);
    make_cache(&cp, kind, rot, &r);
    a2 = cp.ref.attn * cp.ref.attn;
    x = tu_tensor(LAY_SBHD_PAD, dt, S, B, H, D, &xb);
    tu_fill_random(&xb, &r, -4, 4);
    xsnap = tu_buf_copy(&xb);
    pos = make_positions(&P, PM_CP2R1, S, B, NULL, 0, cp.rows, &r);
    positions = tu_positions(pos, S, B);
    if (inplace) {
        y = x;
        yb = xb;
        z = x;
        zb = xb;
    } else {
        y = tu_tensor(LAY_BSHD, dt, S, B, H, D, &yb);
        z = tu_tensor(LAY_HSBD, dt, S, B, H, D, &zb);
    }
    (void)zb;
    (void)yb;
    ck_assert_int_eq(fusedrope_forward(cp.cache, style, pos, &x, &y, NULL), FUSEDROPE_OK);
    {
        /* keep the intermediate for the bound */
        tu_buf ysave = tu_buf_copy(inplace ? &xb : &yb);
        fusedrope_tensor yk = tu_rebase(&y, inplace ? &xb : &yb, &ysave);
        fusedrope_tensor xo = tu_rebase(&x, &xb, &xsnap);
        ck_assert_int_eq(fusedrope_backward(cp.cache, style, pos, &y, &z, NULL), FUSEDROPE_OK);
        for (s = 0; s < S; s++)
            for (b = 0; b < B; b++)
                for (h = 0; h < H; h++) {
                    int64_t p = positions[b * S + s];
                    for (k = 0; k < half; k++) {
                        int64_t ca, cb;
                        double c, sn, xa, xb_, ya, yb_, za, zb_, ra, rb, ta, tb, rza, rzb;
                        ref_pair(style, rot, k, &ca, &cb);
                        ref_cos_sin(&cp.ref, p, k, &c, &sn);
                        xa = ref_load(xo.data, dt, ref_offset(&xo, s, b, h, ca));
                        xb_ = ref_load(xo.data, dt, ref_offset(&xo, s, b, h, cb));
                        ya = ref_load(yk.data, dt, ref_offset(&yk, s, b, h, ca));
                        yb_ = ref_load(yk.data, dt, ref_offset(&yk, s, b, h, cb));
                        za = ref_load(z.data, dt, ref_offset(&z, s, b, h, ca));
                        zb_ = ref_load(z.data, dt, ref_offset(&z, s, b, h, cb));
                        /* first pass's tolerance */
                        ra = xa * c - xb_ * sn;
                        rb = xb_ * c + xa * sn;
                        ta = ref_tolerance(ra, xa, xb_, cp.ref.attn, dt);
                        tb = ref_tolerance(rb, xa, xb_, cp.ref.attn, dt);
                        /* second pass: exact transpose of what the first produced */
                        rza = ya * c + yb_ * sn;
                        rzb = yb_ * c - ya * sn;
                        {
                            double tol_a = ref_tolerance(rza, ya, yb_, cp.ref.attn, dt) +
                                           cp.ref.attn * (ta + tb);
                            double tol_b = ref_tolerance(rzb, ya, yb_, cp.ref.attn, dt) +
                                           cp.ref.attn * (ta + tb);
                            if (!(fabs(za - a2 * xa) <= tol_a) || !(fabs(zb_ - a2 * xb_) <= tol_b)) {
                                if (bad++ == 0)
                                    snprintf(first, sizeof first,
                                             "[s%lld b%lld h%lld pair %d] x=(%.9g, %.9g) "
                                             "z=(%.9g, %.9g) want attn^2 x = (%.9g, %.9g), "
                                             "tol (%.3g, %.3g)",
                                             (long long)s, (long long)b, (long long)h, k, xa,
                                             xb_, za, zb_, a2 * xa, a2 * xb_, tol_a, tol_b);
                            }
                        }
                    }
                    for (k = rot; k < D; k++) {
                        size_t es = ref_dtype_size(dt);
                        if (memcmp((unsigned char *)xo.data + es * (size_t)ref_offset(&xo, s, b, h, k),
                                   (unsigned char *)z.data + es * (size_t)ref_offset(&z, s, b, h, k),
                                   es) != 0 && bad++ == 0)
                            snprintf(first, sizeof first, "pass-through channel %d changed", k);
                    }
                }
    }
    ck_assert_msg(bad == 0, "round trip %s %s %s cache %s [seed %llu]: %lld bad; first %s",
                  ref_dtype_name(dt), style_name(style), inplace ? "in place" : "out of place",
                  kind_names[kind], (unsigned long long)tu_seed, (long long)bad, first);
    end_test();
}
TU_GROUPED_TEST(test_round_trip, 3)

/* ---------------------------------------- table-less equals the table, bit for bit */

static void test_tableless_equals_table_body(int _i)
{
    int i = _i;
    fusedrope_dtype dt = dtypes[i % 3];
    fusedrope_style style = (fusedrope_style)((i / 3) % 2);
    int type = (i / 6) % 3; /* yarn, llama3, longrope */
    int backward = i / 18;
    fusedrope_cache_config cfg;
    fusedrope_cache *ct = NULL, *cn = NULL;
    tu_rng r;
    tu_buf xb, y1b, y2b;
    fusedrope_tensor x, y1, y2;
    fusedrope_positions P;
    int64_t S = 11, B = 2, H = 3, D = 64, k;
    double sf[32], lf[32];
    tu_rng_init(&r, 9300 + (uint64_t)_i);
    for (k = 0; k < 32; k++) {
        sf[k] = 1 + 0.1 * (double)k;
        lf[k] = 1 + 0.9 * (double)k;
    }
    /* LongRoPE picks long_factor when max_positions > original: keep the table at
     * 1024 rows (short) so that the table-less cache (0 rows: short) matches. */
    fusedrope_cache_config_init(&cfg, type == 0 ? FUSEDROPE_ROPE_YARN
                                      : type == 1 ? FUSEDROPE_ROPE_LLAMA3
                                                  : FUSEDROPE_ROPE_LONGROPE,
                                64, type == 2 ? 1024 : 5000, 500000);
    cfg.original_max_positions = 1024;
    cfg.factor = type == 2 ? 4 : 16;
    cfg.short_factor = sf;
    cfg.long_factor = lf;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &ct), FUSEDROPE_OK);
    tu_track(ct);
    cfg.max_positions = 0;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cn), FUSEDROPE_OK);
    tu_track(cn);
    x = tu_tensor(LAY_SBHD, dt, S, B, H, D, &xb);
    tu_fill_random(&xb, &r, -4, 4);
    y1 = tu_tensor(LAY_SBHD, dt, S, B, H, D, &y1b);
    y2 = tu_tensor(LAY_SBHD, dt, S, B, H, D, &y2b);
    fusedrope_positions_init(&P);
    P.cp_size = 1;
    {
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(S * B));
        int64_t rows = fusedrope_cache_max_positions(ct);
        for (k = 0; k < S * B; k++)
            ids[k] = tu_int(&r, 0, rows - 1);
        ids[0] = rows - 1;
        P.ids = ids;
    }
    ck_assert_int_eq(call1(ct, style, &P, &x, &y1, backward), FUSEDROPE_OK);
    ck_assert_int_eq(call1(cn, style, &P, &x, &y2, backward), FUSEDROPE_OK);
    ck_assert_msg(memcmp(y1b.p, y2b.p, y1b.nbytes) == 0,
                  "type %d %s %s: table-less output differs from the table's", type,
                  ref_dtype_name(dt), style_name(style));
    end_test();
}
TU_GROUPED_TEST(test_tableless_equals_table, 3)

/* Table-less caches at large positions (angles in double, up to 2^40 + 3),
 * LongRoPE with its factor arrays freed right after create (they are
 * copied). */
static void test_tableless_large_positions_body(int _i)
{
    int i = _i;
    fusedrope_dtype dt = dtypes[i % 3];
    fusedrope_style style = (fusedrope_style)((i / 3) % 2);
    int type = (i / 6) % 3;
    fusedrope_cache_config cfg;
    fusedrope_cache *c = NULL;
    ref_rope ref;
    tu_rng r;
    tu_buf xb, yb, ysnap;
    fusedrope_tensor x, y;
    fusedrope_positions P;
    int64_t S = 6, B = 2, H = 2, D = 128, k, *positions;
    double *sf = malloc(64 * sizeof(double)), *lf = malloc(64 * sizeof(double));
    char what[256];
    ck_assert(sf && lf);
    tu_rng_init(&r, 9400 + (uint64_t)_i);
    for (k = 0; k < 64; k++) {
        sf[k] = 1 + 0.02 * (double)k;
        lf[k] = 1 + 0.5 * (double)k;
    }
    /* Llama-3.1, YaRN (DeepSeek-like), LongRoPE (Phi-3-like) */
    fusedrope_cache_config_init(&cfg, type == 0 ? FUSEDROPE_ROPE_LLAMA3
                                      : type == 1 ? FUSEDROPE_ROPE_YARN
                                                  : FUSEDROPE_ROPE_LONGROPE,
                                128, 0, type == 0 ? 500000 : 10000);
    cfg.original_max_positions = type == 0 ? 8192 : 4096;
    cfg.factor = type == 0 ? 8 : type == 1 ? 40 : 32;
    if (type == 1) {
        cfg.mscale = 1;
        cfg.mscale_all_dim = 0.5;
    }
    cfg.short_factor = sf;
    cfg.long_factor = lf;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &c), FUSEDROPE_OK);
    tu_track(c);
    ck_assert_int_eq(ref_rope_from_config(&ref, &cfg), 0);
    free(sf); /* the cache copied them */
    free(lf);
    cfg.short_factor = cfg.long_factor = NULL;
    x = tu_tensor(LAY_BSHD, dt, S, B, H, D, &xb);
    tu_fill_random(&xb, &r, -4, 4);
    y = tu_tensor(LAY_SBHD_PAD, dt, S, B, H, D, &yb);
    ysnap = tu_buf_copy(&yb);
    fusedrope_positions_init(&P);
    P.cp_size = 1;
    {
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(S * B));
        for (k = 0; k < S * B; k++)
            ids[k] = tu_int(&r, 0, 1000000);
        ids[0] = 131071;
        ids[1] = 65535;
        ids[2] = 1000000;
        ids[3] = 0;
        /* past float32's exact integers: the angle must be formed from the
         * integer position in double (DESIGN.md), not a float of it */
        ids[4] = ((int64_t)1 << 24) + 1;
        ids[5] = ((int64_t)1 << 32) - 2;
        ids[6] = ((int64_t)1 << 40) + 3;
        P.ids = ids;
    }
    positions = tu_positions(&P, S, B);
    snprintf(what, sizeof what, "table-less type %d large positions %s %s [seed %llu]", type,
             ref_dtype_name(dt), style_name(style), (unsigned long long)tu_seed);
    ck_assert_int_eq(fusedrope_forward(c, style, &P, &x, &y, NULL), FUSEDROPE_OK);
    verify(what, &ref, style, positions, &x, &y, &yb, &ysnap, 0);
    ref_rope_free(&ref);
    end_test();
}
TU_GROUPED_TEST(test_tableless_large_positions, 3)

/* ------------------------------------------------------ context parallelism */

/* Each rank's output equals the matching rows of the whole sequence's output,
 * bit for bit (same table, same arithmetic). */
static void test_cp_reassembly_body(int _i)
{
    int i = _i;
    fusedrope_dtype dt = dtypes[i % 3];
    fusedrope_style style = (fusedrope_style)((i / 3) % 2);
    int cp = (i / 6) % 2 ? 4 : 2;
    int thd = i / 12;
    cache_pair cpair;
    tu_rng r;
    int64_t G = 8 * cp, L = G / cp, chunk = L / 2, H = 2, D = 32, B = thd ? 1 : 2;
    int64_t rk, j, b;
    tu_buf gx, gy, lx, ly;
    fusedrope_tensor X, Y, x, y;
    size_t es = ref_dtype_size(dt), row = (size_t)(H * D) * es;
    tu_rng_init(&r, 9500 + (uint64_t)_i);
    make_cache(&cpair, K_YARN, 32, &r);
    /* the whole sequence(s) without CP */
    X = tu_tensor(LAY_BSHD, dt, G, B, H, D, &gx);
    tu_fill_random(&gx, &r, -4, 4);
    Y = tu_tensor(LAY_BSHD, dt, G, B, H, D, &gy);
    ck_assert_int_eq(fusedrope_forward(cpair.cache, style, NULL, &X, &Y, NULL), FUSEDROPE_OK);
    for (rk = 0; rk < cp; rk++) {
        fusedrope_positions P;
        int32_t cu[3];
        fusedrope_positions_init(&P);
        P.cp_size = cp;
        P.cp_rank = (int)rk;
        x = tu_tensor(LAY_BSHD, dt, L, B, H, D, &lx);
        y = tu_tensor(LAY_BSHD, dt, L, B, H, D, &ly);
        /* gather chunks rk and 2cp-1-rk of each sequence */
        for (b = 0; b < B; b++)
            for (j = 0; j < L; j++) {
                int64_t g = j < chunk ? rk * chunk + j : (2 * cp - 1 - rk) * chunk + (j - chunk);
                memcpy((unsigned char *)x.data + (size_t)ref_offset(&x, j, b, 0, 0) * es,
                       (unsigned char *)X.data + (size_t)ref_offset(&X, g, b, 0, 0) * es, row);
            }
        if (thd) {
            /* the same as one THD sequence */
            cu[0] = 0;
            cu[1] = (int32_t)L;
            P.cu_seqlens = cu;
            P.num_seqs = 1;
        }
        ck_assert_int_eq(fusedrope_forward(cpair.cache, style, &P, &x, &y, NULL), FUSEDROPE_OK);
        for (b = 0; b < B; b++)
            for (j = 0; j < L; j++) {
                int64_t g = j < chunk ? rk * chunk + j : (2 * cp - 1 - rk) * chunk + (j - chunk);
                ck_assert_msg(memcmp((unsigned char *)y.data + (size_t)ref_offset(&y, j, b, 0, 0) * es,
                                     (unsigned char *)Y.data + (size_t)ref_offset(&Y, g, b, 0, 0) * es,
                                     row) == 0,
                              "cp %d rank %lld local %lld (global %lld) batch %lld differs "
                              "from the whole-sequence output (%s %s)",
                              cp, (long long)rk, (long long)j, (long long)g, (long long)b,
                              ref_dtype_name(dt), style_name(style));
            }
    }
    end_test();
}
TU_GROUPED_TEST(test_cp_reassembly, 3)

/* ---------------------------------------------------------------- q and k */

enum {
    QK_SEPARATE,         /* four separate tensors, different head counts and dims */
    QK_SEPARATE_INPLACE, /* q and k each in place */
    QK_PACKED_INPLACE,   /* [s][b][(hq + 2hk) d]: q and k views, v untouched */
    QK_PACKED_OUT,       /* from one packed buffer into another */
    QK_INTERLEAVED,      /* [s][b][h][3][d]: q, k, v interleaved per head, in place */
    QK_INTERLEAVED_OUT,
    QK_SAME_INPUT,       /* q_in == k_in, two outputs */
    QK_MIXED,            /* q out of place, k in place */
    QK_NUM
};
static const char *qk_names[QK_NUM] = {"separate", "separate in place", "packed QKV in place",
                                       "packed QKV out of place", "interleaved QKV in place",
                                       "interleaved QKV out of place", "same input",
                                       "q out of place, k in place"};

/* i = mode + QK_NUM * (dtype + 3 * (style + 2 * pmsel)) */
static void qk_case(int i, int backward)
{
    int mode = i % QK_NUM;
    fusedrope_dtype dt = dtypes[(i / QK_NUM) % 3];
    fusedrope_style style = (fusedrope_style)((i / (QK_NUM * 3)) % 2);
    int pmsel = (i / (QK_NUM * 6)) % 4; /* implicit, offsets, cp2 r1, thd */
    int _i = 2 * i + backward;
    cache_pair cp;
    tu_rng r;
    int64_t S = 10, B = pmsel == 3 ? 1 : 2, hq = 6, hk = 2, dq = 80, dk = 72, *positions;
    int rot = 64;
    tu_buf inb[2], outb[2], insnap[2], outsnap[2];
    int nin = 2, nout = 2, k;
    fusedrope_tensor qi, qo, ki, ko, qorig, korig;
    fusedrope_positions P;
    const fusedrope_positions *pos;
    static const int32_t cu[] = {0, 4, 4, 10};
    fusedrope_status st;
    char what[512];
    size_t es = ref_dtype_size(dt);

    /* under valgrind each mode, style and kind of positions once, the dtype
     * turning among them */
    if (tu_valgrind_skips(mode + (i / QK_NUM) % 3 + (int)style + pmsel, 3))
        return;
    tu_rng_init(&r, 9600 + (uint64_t)_i);
    make_cache(&cp, (int)(_i % K_NUM), rot, &r);
    snprintf(what, sizeof what, "qk %s %s %s %s pos %d cache %s [seed %llu]", qk_names[mode],
             ref_dtype_name(dt), style_name(style), backward ? "backward" : "forward", pmsel,
             kind_names[_i % K_NUM], (unsigned long long)tu_seed);
    if (mode == QK_SAME_INPUT)
        hk = hq, dk = dq;
    if (mode >= QK_PACKED_INPLACE && mode <= QK_INTERLEAVED_OUT)
        dk = dq;
    if (mode == QK_INTERLEAVED || mode == QK_INTERLEAVED_OUT)
        hk = hq;

    switch (mode) {
    case QK_SEPARATE:
    case QK_SAME_INPUT:
    case QK_MIXED:
        qi = tu_tensor(LAY_SBHD, dt, S, B, hq, dq, &inb[0]);
        ki = mode == QK_SAME_INPUT ? qi : tu_tensor(LAY_BSHD_PAD, dt, S, B, hk, dk, &inb[1]);
        if (mode == QK_SAME_INPUT)
            inb[1] = inb[0], nin = 1;
        qo = tu_tensor(LAY_HSBD, dt, S, B, hq, dq, &outb[0]);
        if (mode == QK_MIXED) {
            ko = ki;
            outb[1] = inb[1];
        } else {
            ko = tu_tensor(LAY_SBHD_PAD, dt, S, B, hk, dk, &outb[1]);
        }
        break;
    case QK_SEPARATE_INPLACE:
        qi = tu_tensor(LAY_SBHD_PAD, dt, S, B, hq, dq, &inb[0]);
        ki = tu_tensor(LAY_BSHD, dt, S, B, hk, dk, &inb[1]);
        qo = qi;
        ko = ki;
        outb[0] = inb[0];
        outb[1] = inb[1];
        break;
    case QK_PACKED_INPLACE:
    case QK_PACKED_OUT: {
        int64_t w = (hq + 2 * hk) * dq; /* one token's q, k, v */
        int t;
        for (t = 0; t < (mode == QK_PACKED_OUT ? 2 : 1); t++) {
            tu_buf *bb = t ? &outb[0] : &inb[0];
            fusedrope_tensor *q = t ? &qo : &qi, *kk = t ? &ko : &ki;
            *bb = tu_buf_new(dt, S * B * w);
            *q = tu_view(LAY_SBHD, bb, S, B, hq, dq);
            q->stride_batch = w;
            q->stride_seq = B * w;
            *kk = *q;
            kk->heads = hk;
            kk->data = (unsigned char *)q->data + (size_t)(hq * dq) * es;
        }
        inb[1] = inb[0];
        nin = 1;
        if (mode == QK_PACKED_INPLACE) {
            qo = qi;
            ko = ki;
            outb[0] = inb[0];
        }
        outb[1] = outb[0];
        nout = 1;
        break;
    }
    case QK_INTERLEAVED:
    case QK_INTERLEAVED_OUT: {
        int t;
        for (t = 0; t < (mode == QK_INTERLEAVED_OUT ? 2 : 1); t++) {
            tu_buf *bb = t ? &outb[0] : &inb[0];
            fusedrope_tensor *q = t ? &qo : &qi, *kk = t ? &ko : &ki;
            *bb = tu_buf_new(dt, S * B * hq * 3 * dq);
            *q = tu_view(LAY_BSHD, bb, S, B, hq, dq);
            q->stride_head = 3 * dq;
            q->stride_seq = hq * 3 * dq;
            q->stride_batch = S * hq * 3 * dq;
            *kk = *q;
            kk->data = (unsigned char *)q->data + (size_t)dq * es;
        }
        inb[1] = inb[0];
        nin = 1;
        if (mode == QK_INTERLEAVED) {
            qo = qi;
            ko = ki;
            outb[0] = inb[0];
        }
        outb[1] = outb[0];
        nout = 1;
        break;
    }
    }
    for (k = 0; k < nin; k++)
        tu_fill_random(&inb[k], &r, -4, 4);
    for (k = 0; k < nin; k++)
        insnap[k] = tu_buf_copy(&inb[k]);
    for (k = 0; k < nout; k++)
        outsnap[k] = tu_buf_copy(&outb[k]);
    qorig = tu_rebase(&qi, &inb[0], &insnap[0]);
    korig = tu_rebase(&ki, &inb[nin - 1], &insnap[nin - 1]);

    if (pmsel == 3)
        pos = make_positions(&P, PM_CP2R1, S, 1, cu, 3, cp.rows, &r);
    else
        pos = make_positions(&P, pmsel == 0 ? PM_NULL : pmsel == 1 ? PM_OFFSETS : PM_CP2R1, S, B,
                             NULL, 0, cp.rows, &r);
    positions = tu_positions(pos, S, B);

    if (backward) /* dq_out (input), dq_in (output), dk_out (input), dk_in (output) */
        st = fusedrope_backward_qk(cp.cache, style, pos, &qi, &qo, &ki, &ko, NULL);
    else
        st = fusedrope_forward_qk(cp.cache, style, pos, &qi, &qo, &ki, &ko, NULL);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: %s (%s)", what, fusedrope_status_string(st),
                  fusedrope_last_error());

    {
        char m[MSG];
        int64_t bad = ref_check_apply(&cp.ref, style, positions, &qorig, &qo, backward, m,
                                      sizeof m);
        ck_assert_msg(bad == 0, "%s: q: %lld bad: %s", what, (long long)bad, m);
        bad = ref_check_apply(&cp.ref, style, positions, &korig, &ko, backward, m, sizeof m);
        ck_assert_msg(bad == 0, "%s: k: %lld bad: %s", what, (long long)bad, m);
    }
    /* bytes outside the two output views: untouched (v, padding, guards) */
    for (k = 0; k < nout; k++) {
        unsigned char *mask = tu_alloc(outb[k].nbytes);
        size_t first = 0, n;
        if (nout == 1 || k == 0)
            tu_mask_view(&outb[k], &qo, mask);
        if (nout == 1 || k == 1)
            tu_mask_view(&outb[k], &ko, mask);
        n = tu_changed_outside(&outb[k], &outsnap[k], mask, &first);
        ck_assert_msg(n == 0, "%s: %zu bytes outside the output views written (buffer %d, "
                      "first byte %zu)", what, n, k, first);
    }
    /* inputs that are not outputs: unchanged */
    for (k = 0; k < nin; k++) {
        int is_out = inb[k].p == outb[0].p || inb[k].p == outb[nout - 1].p;
        size_t first = 0, n;
        if (is_out)
            continue;
        n = tu_changed(&inb[k], &insnap[k], &first);
        ck_assert_msg(n == 0, "%s: input buffer %d modified (%zu bytes)", what, k, n);
    }
}

static void test_qk_body(int _i)
{
    qk_case(_i, 0);
    qk_case(_i, 1);
    end_test();
}
TU_GROUPED_TEST(test_qk, 3)

/* forward_qk gives what two forward calls give, bit for bit */
static void test_qk_equals_two_calls_body(int _i)
{
    int i = _i;
    fusedrope_dtype dt = dtypes[i % 3];
    fusedrope_style style = (fusedrope_style)((i / 3) % 2);
    int backward = i / 6;
    cache_pair cp;
    tu_rng r;
    tu_buf qb, kb, q1, k1, q2, k2;
    fusedrope_tensor qi, ki, qa, ka, qc, kc;
    int64_t S = 9, B = 2;
    tu_rng_init(&r, 9700 + (uint64_t)_i);
    make_cache(&cp, K_YARN, 32, &r);
    qi = tu_tensor(LAY_SBHD, dt, S, B, 4, 48, &qb);
    ki = tu_tensor(LAY_SBHD, dt, S, B, 1, 32, &kb);
    tu_fill_random(&qb, &r, -3, 3);
    tu_fill_random(&kb, &r, -3, 3);
    qa = tu_tensor(LAY_SBHD, dt, S, B, 4, 48, &q1);
    ka = tu_tensor(LAY_SBHD, dt, S, B, 1, 32, &k1);
    qc = tu_tensor(LAY_SBHD, dt, S, B, 4, 48, &q2);
    kc = tu_tensor(LAY_SBHD, dt, S, B, 1, 32, &k2);
    if (backward) {
        ck_assert_int_eq(fusedrope_backward_qk(cp.cache, style, NULL, &qi, &qa, &ki, &ka, NULL),
                         FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_backward(cp.cache, style, NULL, &qi, &qc, NULL), FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_backward(cp.cache, style, NULL, &ki, &kc, NULL), FUSEDROPE_OK);
    } else {
        ck_assert_int_eq(fusedrope_forward_qk(cp.cache, style, NULL, &qi, &qa, &ki, &ka, NULL),
                         FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_forward(cp.cache, style, NULL, &qi, &qc, NULL), FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_forward(cp.cache, style, NULL, &ki, &kc, NULL), FUSEDROPE_OK);
    }
    ck_assert(memcmp(q1.p, q2.p, q1.nbytes) == 0);
    ck_assert(memcmp(k1.p, k2.p, k1.nbytes) == 0);
    end_test();
}
TU_GROUPED_TEST(test_qk_equals_two_calls, 3)

/* Many heads per token: the CUDA launcher then gives a thread several heads
 * (tests/test_apply_emu runs this on the kernels' code), and the CPU
 * backend's work items cross token boundaries inside a thread. */
static void test_many_heads_body(int _i)
{
    static const int64_t heads[] = {5, 24, 40, 130};
    int i = _i;
    apply_case c;
    memset(&c, 0, sizeof c);
    c.style = (fusedrope_style)(i % 2); i /= 2;
    c.dt = dtypes[i % 3]; i /= 3;
    c.inplace = i % 2; i /= 2;
    c.backward = i % 2; i /= 2;
    /* under valgrind half the variants (style, in place and direction
     * of even parity), every value of each among them */
    if (tu_valgrind_skips((int)c.style + c.inplace + c.backward, 2))
        return;
    c.H = heads[i % 4];
    c.lx = (int[]){LAY_SBHD, LAY_BSHD, LAY_SBHD_PAD, LAY_HSBD}[i % 4];
    c.ly = (int[]){LAY_BSHD, LAY_SBHD, LAY_SBHD, LAY_BSHD_PAD}[(i + _i) % 4];
    c.pm = (int[]){PM_NULL, PM_OFFSETS, PM_IDS}[_i % 3];
    c.kind = _i % 5 == 4 ? K_TABLELESS : K_DEFAULT;
    c.rot_dim = _i % 2 ? 96 : 128;
    c.S = 9;
    c.B = 3;
    c.D = 128;
    c.lo = -4;
    c.hi = 4;
    c.stream = 9600 + (uint64_t)_i;
    run_case(&c);
    end_test();
}
TU_GROUPED_TEST(test_many_heads, 4)

/* Large enough for the multi-threaded path (and, out of place with 16-byte
 * aligned rows of >= 4 MiB in all, whatever bulk-store path a backend has). */
START_TEST(test_large)
{
    static const struct { fusedrope_dtype dt; int64_t S; int lx, ly, inplace, pm; } lc[] = {
        {FUSEDROPE_FLOAT32, 256, LAY_SBHD, LAY_SBHD, 0, PM_OFFSETS},
        {FUSEDROPE_FLOAT32, 256, LAY_BSHD, LAY_BSHD, 1, PM_IDS},
        {FUSEDROPE_FLOAT16, 64, LAY_SBHD, LAY_BSHD, 0, PM_CP2R1},
        {FUSEDROPE_BFLOAT16, 64, LAY_BSHD, LAY_SBHD, 0, PM_NULL},
        {FUSEDROPE_BFLOAT16, 64, LAY_SBHD_PAD, LAY_SBHD, 0, PM_CP4R2_OFFSETS},
        {FUSEDROPE_FLOAT16, 64, LAY_SBHD, LAY_SBHD, 1, PM_ZERO},
    };
    int i = _i;
    apply_case c;
    if (large_left_out())
        return;
    memset(&c, 0, sizeof c);
    c.style = (fusedrope_style)(i % 2);
    c.backward = (i / 2) % 2;
    c.dt = lc[i].dt;
    c.S = lc[i].S;
    c.lx = lc[i].lx;
    c.ly = lc[i].ly;
    c.inplace = lc[i].inplace;
    c.pm = lc[i].pm;
    c.B = 4;
    c.H = 8;
    c.D = 128;
    c.rot_dim = i % 2 ? 128 : 96;
    c.kind = i % 3 == 2 ? K_TABLELESS : i % 3 == 1 ? K_YARN : K_DEFAULT;
    c.lo = -4;
    c.hi = 4;
    c.stream = 9800 + (uint64_t)_i;
    table_rows = 4096; /* CP 4 over 256 local tokens reaches position 1023 */
    tu_threads(0);
    run_case(&c);
    end_test();
}
END_TEST

/* Out of place, 16-byte aligned output rows padded to a multiple of 16
 * bytes whose elements are not one (head_dim 20 of 24; 40 or 80 bytes of 48
 * or 96), >= 4 MiB in all: whatever bulk-store path serves large outputs
 * must write each row's elements and not the padding between them. */
START_TEST(test_large_padded_rows)
{
    fusedrope_dtype dt = dtypes[_i % 3];
    fusedrope_style style = (fusedrope_style)((_i / 3) % 2);
    cache_pair cp;
    tu_rng r;
    tu_buf xb, yb, ysnap;
    fusedrope_tensor x, y;
    int64_t *positions, S = 1024, H = 103, D = 20, P = 24;
    char what[128];
    if (large_left_out() || (tu_under_valgrind() && (_i % 3) % 2 != (int)style))
        return; /* under valgrind each dtype in one style: 4 MiB rows each */
    tu_rng_init(&r, 9900 + (uint64_t)_i);
    table_rows = 1024;
    make_cache(&cp, K_DEFAULT, 16, &r);
    x = tu_tensor(LAY_SBHD, dt, S, 1, H, D, &xb);
    tu_fill_random(&xb, &r, -2, 2);
    yb = tu_buf_new(dt, S * H * P);
    y = tu_view(LAY_SBHD, &yb, S, 1, H, D);
    y.stride_head = P;
    y.stride_batch = y.stride_seq = H * P;
    ck_assert_msg((uintptr_t)y.data % 16 == 0, "test bug: output not 16-byte aligned");
    ysnap = tu_buf_copy(&yb);
    positions = tu_positions(NULL, S, 1);
    snprintf(what, sizeof what, "padded %lld-byte rows %s %s [seed %llu]",
             (long long)(D * (int64_t)ref_dtype_size(dt)), ref_dtype_name(dt),
             style_name(style), (unsigned long long)tu_seed);
    tu_threads(0);
    ck_assert_int_eq(call1(cp.cache, style, NULL, &x, &y, 0), FUSEDROPE_OK);
    verify(what, &cp.ref, style, positions, &x, &y, &yb, &ysnap, 0);
    end_test();
}
END_TEST

/* A large THD _qk call (GQA), through the threaded path. */
START_TEST(test_large_qk_thd)
{
    int i = _i;
    fusedrope_dtype dt = dtypes[i % 3];
    fusedrope_style style = (fusedrope_style)((i / 3) % 2);
    cache_pair cp;
    tu_rng r;
    int64_t T, hq = 16, hk = 4, d = 64, *positions;
    int32_t cu[34];
    int k;
    tu_buf qb, kb, qob, kob, qs, ks, qos, kos;
    fusedrope_tensor qi, ki, qo, ko, qorig, korig;
    fusedrope_positions P;
    char m[MSG];
    int64_t bad;
    if (large_left_out())
        return;
    tu_rng_init(&r, 9900 + (uint64_t)_i);
    tu_threads(0);
    make_cache(&cp, i % 2 ? K_TABLELESS : K_DEFAULT, 64, &r);
    cu[0] = 0;
    for (k = 0; k < 33; k++)
        cu[k + 1] = cu[k] + (int32_t)tu_int(&r, 0, 60);
    T = cu[33];
    qi = tu_tensor(LAY_THD, dt, T, 1, hq, d, &qb);
    ki = tu_tensor(LAY_THD, dt, T, 1, hk, d, &kb);
    qo = tu_tensor(LAY_THD, dt, T, 1, hq, d, &qob);
    ko = tu_tensor(LAY_THD, dt, T, 1, hk, d, &kob);
    tu_fill_random(&qb, &r, -4, 4);
    tu_fill_random(&kb, &r, -4, 4);
    qs = tu_buf_copy(&qb);
    ks = tu_buf_copy(&kb);
    qos = tu_buf_copy(&qob);
    kos = tu_buf_copy(&kob);
    qorig = tu_rebase(&qi, &qb, &qs);
    korig = tu_rebase(&ki, &kb, &ks);
    fusedrope_positions_init(&P);
    P.cu_seqlens = cu;
    P.num_seqs = 33;
    P.cp_size = 1;
    {
        int64_t *off = tu_alloc(sizeof(int64_t) * 33);
        for (k = 0; k < 33; k++)
            off[k] = tu_int(&r, 0, 400);
        P.offsets = off;
    }
    positions = tu_positions(&P, T, 1);
    ck_assert_int_eq(fusedrope_forward_qk(cp.cache, style, &P, &qi, &qo, &ki, &ko, NULL),
                     FUSEDROPE_OK);
    bad = ref_check_apply(&cp.ref, style, positions, &qorig, &qo, 0, m, sizeof m);
    ck_assert_msg(bad == 0, "large qk thd q %s %s [seed %llu]: %s", ref_dtype_name(dt),
                  style_name(style), (unsigned long long)tu_seed, m);
    bad = ref_check_apply(&cp.ref, style, positions, &korig, &ko, 0, m, sizeof m);
    ck_assert_msg(bad == 0, "large qk thd k %s %s [seed %llu]: %s", ref_dtype_name(dt),
                  style_name(style), (unsigned long long)tu_seed, m);
    (void)qos;
    (void)kos;
    ck_assert(memcmp(qb.p, qs.p, qb.nbytes) == 0 && memcmp(kb.p, ks.p, kb.nbytes) == 0);
    end_test();
}
END_TEST

/* ------------------------------------------------------------ constructors */

START_TEST(test_tensor_constructors)
{
    int dummy;
    fusedrope_tensor t = fusedrope_tensor_sbhd(&dummy, FUSEDROPE_FLOAT16, 7, 3, 5, 80);
    ck_assert_ptr_eq(t.data, &dummy);
    ck_assert_int_eq(t.dtype, FUSEDROPE_FLOAT16);
    ck_assert_int_eq(t.seq_len, 7);
    ck_assert_int_eq(t.batch, 3);
    ck_assert_int_eq(t.heads, 5);
    ck_assert_int_eq(t.head_dim, 80);
    ck_assert_int_eq(t.stride_head, 80);
    ck_assert_int_eq(t.stride_batch, 5 * 80);
    ck_assert_int_eq(t.stride_seq, 3 * 5 * 80);

    t = fusedrope_tensor_bshd(&dummy, FUSEDROPE_BFLOAT16, 3, 7, 5, 80);
    ck_assert_ptr_eq(t.data, &dummy);
    ck_assert_int_eq(t.dtype, FUSEDROPE_BFLOAT16);
    ck_assert_int_eq(t.seq_len, 7);
    ck_assert_int_eq(t.batch, 3);
    ck_assert_int_eq(t.heads, 5);
    ck_assert_int_eq(t.head_dim, 80);
    ck_assert_int_eq(t.stride_head, 80);
    ck_assert_int_eq(t.stride_seq, 5 * 80);
    ck_assert_int_eq(t.stride_batch, 7 * 5 * 80);

    t = fusedrope_tensor_thd(&dummy, FUSEDROPE_FLOAT32, 11, 4, 64);
    ck_assert_ptr_eq(t.data, &dummy);
    ck_assert_int_eq(t.dtype, FUSEDROPE_FLOAT32);
    ck_assert_int_eq(t.seq_len, 11);
    ck_assert_int_eq(t.batch, 1);
    ck_assert_int_eq(t.heads, 4);
    ck_assert_int_eq(t.head_dim, 64);
    ck_assert_int_eq(t.stride_head, 64);
    ck_assert_int_eq(t.stride_seq, 4 * 64);
    ck_assert_int_eq(t.stride_batch, 11 * 4 * 64); /* the page's t*h*d (batch 1: unused) */

    /* the page's saturation: a stride with a negative size among its
     * factors is -1 (whatever the signs of the others), a product past
     * int64_t is stored as INT64_MAX; the others are still products */
    t = fusedrope_tensor_sbhd(&dummy, FUSEDROPE_FLOAT32, 7, -1, 5, 80);
    ck_assert_int_eq(t.stride_seq, -1);
    ck_assert_int_eq(t.stride_batch, 5 * 80);
    t = fusedrope_tensor_bshd(&dummy, FUSEDROPE_FLOAT32, 3, 7, -2, -3);
    ck_assert_int_eq(t.stride_seq, -1);
    ck_assert_int_eq(t.stride_batch, -1);
    ck_assert_int_eq(t.stride_head, -3);
    t = fusedrope_tensor_thd(&dummy, FUSEDROPE_FLOAT32, -11, 4, 64);
    ck_assert_int_eq(t.stride_seq, 4 * 64);
    ck_assert_int_eq(t.stride_batch, -1);
    t = fusedrope_tensor_sbhd(&dummy, FUSEDROPE_FLOAT32, 2, INT64_MAX / 4, 5, 80);
    ck_assert_int_eq(t.stride_seq, INT64_MAX);
    ck_assert_int_eq(t.stride_batch, 5 * 80);
}
END_TEST

/* ------------------------------------------------------------------- suite */

static Suite *apply_suite(void)
{
    Suite *s = suite_create("apply");
    TCase *tc = tcase_create("matrix");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matrix, 0, MATRIX_N);
    suite_add_tcase(s, tc);

    tc = tcase_create("shapes");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tensor_constructors);
    tcase_add_loop_test(tc, test_rot_dims, 0, 2 * 3 * 2 * 11 / 3);
    tcase_add_loop_test(tc, test_one_token, 0, 2 * 3 * 2 * 2 / 4);
    tcase_add_loop_test(tc, test_thd_many, 0, 2 * 3 * 5 * 2 / 3);
    tcase_add_loop_test(tc, test_magnitudes, 0, 2 * 2 * 8 / 4);
    tcase_add_loop_test(tc, test_broadcast_input, 0, 12 / 3);
    tcase_add_loop_test(tc, test_interleaved_xy_views, 0, 6 / 3);
    suite_add_tcase(s, tc);

    tc = tcase_create("semantics");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_round_trip, 0, 36 / 3);
    tcase_add_loop_test(tc, test_tableless_equals_table, 0, 36 / 3);
    tcase_add_loop_test(tc, test_tableless_large_positions, 0, 18 / 3);
    tcase_add_loop_test(tc, test_cp_reassembly, 0, 24 / 3);
    suite_add_tcase(s, tc);

    tc = tcase_create("large");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_many_heads, 0, 2 * 3 * 2 * 2 * 4 / 4);
    tcase_add_loop_test(tc, test_large, 0, 6);
    tcase_add_loop_test(tc, test_large_qk_thd, 0, 6);
    tcase_add_loop_test(tc, test_large_padded_rows, 0, 6);
    tcase_add_loop_test(tc, test_interleaved_views_heads_limit, 0, 3);
    suite_add_tcase(s, tc);

    tc = tcase_create("qk");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_qk, 0, QK_NUM * 3 * 2 * 4 / 3);
    tcase_add_loop_test(tc, test_qk_equals_two_calls, 0, 12 / 3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_main(apply_suite(), "test_apply");
}
