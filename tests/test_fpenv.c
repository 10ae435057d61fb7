/*
 * test_fpenv.c - results must not depend on the calling thread's
 * floating-point environment.  A caller with x86 MXCSR's FTZ and DAZ set
 * (subnormals flushed, as some inference engines run) and rounding upward
 * (fesetround) must get the bytes of a caller in the default environment,
 * within DESIGN's bound of the float64 reference, from the apply calls and
 * from the cache build, and the same bytes from the fused norm's forward
 * and backward; and must find its environment as it left it.
 *
 * The OpenMP workers have their own control register (MXCSR, FPCR),
 * inherited when the runtime
 * starts them, at a process's first parallel region: each test runs in
 * both orders, the workers born in the altered environment (the calling
 * thread's environment reaches them) or in the default one (only the
 * calling thread's share of the work sees it).
 *
 * On AArch64 the same with FPCR: FZ (subnormals flushed) and DN (every NaN
 * result the default NaN, which would change NaN outputs' bits: the
 * test_nan_fpenv case) for x86's FTZ and DAZ.  Elsewhere the rounding mode
 * alone.
 */
#include <fenv.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__SSE2__)
#include <xmmintrin.h>
/* MXCSR: FTZ (bit 15) flushes subnormal results, DAZ (bit 6) reads
 * subnormal inputs as zero; bits 0-5 are the exception flags */
#define FP_FLUSH 0x8040ul
#define FP_FLAG_BITS 0x3ful
#define FP_REG "MXCSR"
#define FP_FLUSH_NAME "FTZ/DAZ"
static unsigned long fp_control(void)
{
    return _mm_getcsr();
}
static void fp_set_control(unsigned long v)
{
    _mm_setcsr((unsigned int)v);
}
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
/* FPCR: FZ (bit 24) flushes subnormals, DN (bit 25) makes every NaN result
 * the default NaN; the flags are FPSR's */
#define FP_FLUSH 0x3000000ul
#define FP_FLAG_BITS 0ul
#define FP_REG "FPCR"
#define FP_FLUSH_NAME "FZ/DN"
static unsigned long fp_control(void)
{
    uint64_t v;
    __asm__ volatile("mrs %0, fpcr" : "=r"(v) : : "memory");
    return (unsigned long)v;
}
static void fp_set_control(unsigned long v)
{
    __asm__ volatile("msr fpcr, %0" : : "r"((uint64_t)v) : "memory");
}
#else
/* Elsewhere (ppc64le, s390x) the library's bracket is fegetenv and
 * fesetenv(FE_DFL_ENV): the caller's rounding mode, through <fenv.h>, is
 * what this test can set there (POWER's FPSCR.NI flush, for one, is
 * optional in the architecture and qemu-user ignores it). */
#define FP_FLUSH 0ul
#define FP_FLAG_BITS 0ul
#define FP_REG "the rounding mode"
#define FP_FLUSH_NAME "(no flush)"
static unsigned long fp_control(void)
{
    return (unsigned long)fegetround();
}
static void fp_set_control(unsigned long v)
{
    ck_assert_int_eq(fesetround((int)v), 0);
}
#endif

#define CPU FUSEDROPE_DEVICE_CPU
#define MSG 2048

static const fusedrope_dtype dtypes[3] = {FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                          FUSEDROPE_BFLOAT16};

/* A caller's environment: rounding `mode` (fesetround's), and where
 * `flush`, FP_FLUSH's bits set (x86: FTZ and DAZ; AArch64: FZ and DN).
 * Returns the control register the call must leave. */
static unsigned long set_env(int mode, int flush)
{
    ck_assert_int_eq(fesetround(mode), 0);
    if (flush)
        fp_set_control(fp_control() | FP_FLUSH);
    return fp_control();
}

/* The environment under test: FP_FLUSH, rounding toward +Inf. */
static unsigned long set_hostile(void)
{
    return set_env(FE_UPWARD, 1);
}

static void set_default(void)
{
    ck_assert_int_eq(fesetround(FE_TONEAREST), 0);
    fp_set_control(fp_control() & ~FP_FLUSH);
}

/* Checks the caller's environment is what it set before the call. */
static void check_restored(const char *what, unsigned long ctl)
{
    const unsigned long now = fp_control();
    /* the exception flags may be anything: compare the controls */
    ck_assert_msg((now & ~FP_FLAG_BITS) == (ctl & ~FP_FLAG_BITS),
                  "%s: " FP_REG " is %#lx after the call, was %#lx", what, now, ctl);
    ck_assert_msg(fegetround() == FE_UPWARD, "%s: the rounding mode was not restored", what);
}

/* Random values of the dtype in three classes: its subnormals, its
 * smallest normals (rotated, they often give subnormals), and ordinary
 * values.  Stored through ref_store in the default environment. */
static void fill_tiny(tu_buf *b, tu_rng *r)
{
    const fusedrope_dtype dt = b->dt;
    const int64_t n = (int64_t)(b->nbytes / ref_dtype_size(dt));
    /* smallest normal of the dtype: 2^-126 (float32, bfloat16), 2^-14 (fp16) */
    const double min_normal = dt == FUSEDROPE_FLOAT16 ? 0x1p-14 : 0x1p-126;
    const double min_sub = dt == FUSEDROPE_FLOAT32 ? 0x1p-149
                           : dt == FUSEDROPE_FLOAT16 ? 0x1p-24 : 0x1p-133;
    for (int64_t i = 0; i < n; i++) {
        const int cls = (int)tu_int(r, 0, 2);
        const double sign = tu_int(r, 0, 1) ? -1.0 : 1.0;
        double v;
        if (cls == 0)
            v = min_sub * (double)tu_int(r, 1, (int64_t)(min_normal / min_sub) - 1);
        else if (cls == 1)
            v = min_normal * tu_uniform(r, 1.0, 64.0);
        else
            v = tu_uniform(r, 0.0, 4.0);
        ref_store(b->p, dt, i, sign * v);
    }
}

/* A cache whose high pairs have tiny angles: theta 1e60 gives inverse
 * frequencies down to 1e-58, so sin is subnormal in float (and their
 * products smaller still). */
static void tiny_config(fusedrope_cache_config *cfg, int rot_dim, int64_t rows)
{
    fusedrope_cache_config_init(cfg, FUSEDROPE_ROPE_DEFAULT, rot_dim, rows, 1e60);
}

typedef struct {
    tu_buf out;
    fusedrope_tensor y;
} result;

/* One forward/backward call of the case on x; the output's buffer. */
static void run_call(const fusedrope_cache *cache, fusedrope_style style,
                     const fusedrope_positions *pos, const fusedrope_tensor *x, int inplace,
                     const tu_buf *xb, int backward, result *res)
{
    fusedrope_status st;
    if (inplace) {
        res->out = tu_buf_copy(xb);
        res->y = tu_rebase(x, xb, &res->out);
    } else {
        res->y = tu_tensor(LAY_BSHD_PAD, x->dtype, x->seq_len, x->batch, x->heads, x->head_dim,
                           &res->out);
    }
    {
        const fusedrope_tensor *in = inplace ? &res->y : x;
        st = backward ? fusedrope_backward(cache, style, pos, in, &res->y, NULL)
                      : fusedrope_forward(cache, style, pos, in, &res->y, NULL);
    }
    ck_assert_msg(st == FUSEDROPE_OK, "call: %s (%s)", fusedrope_status_string(st),
                  fusedrope_last_error());
}

/* _i: order (workers born hostile or default), dtype, style, direction,
 * table or table-less, in place or not. */
static void apply_case(int i)
{
    const int hostile_first = i % 2, dti = i / 2 % 3, style_i = i / 6 % 2, backward = i / 12 % 2,
              tableless = i / 24 % 2, inplace = (i / 2 + i / 48) % 2;
    const fusedrope_dtype dt = dtypes[dti];
    const fusedrope_style style = style_i ? FUSEDROPE_INTERLEAVED : FUSEDROPE_NEOX;
    const int64_t S = 67, B = 2, H = 5, D = 136; /* 91120 elements: the threaded path */
    const int rot_dim = 128;
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    ref_rope ref;
    tu_rng r;
    tu_buf xb, xsnap;
    fusedrope_tensor x, xorig;
    int64_t offsets[2] = {0, 40};
    fusedrope_positions P;
    int64_t *positions;
    result res[2]; /* [0] default environment, [1] hostile */
    unsigned long ctl;
    char what[256], msg[MSG];
    size_t first = 0, n;

    snprintf(what, sizeof what, "[seed %llu case %d] %s %s %s %s %s, workers born %s",
             (unsigned long long)tu_seed, i, ref_dtype_name(dt),
             style_i ? "interleaved" : "neox", backward ? "backward" : "forward",
             tableless ? "table-less" : "table", inplace ? "in place" : "out of place",
             hostile_first ? FP_FLUSH_NAME ", upward" : "default");
    tu_threads(3);
    tu_rng_init(&r, 300 + (uint64_t)i);
    tiny_config(&cfg, rot_dim, tableless ? 0 : S + 41);
    ck_assert_int_eq(ref_rope_from_config(&ref, &cfg), 0);
    fusedrope_positions_init(&P);
    P.offsets = offsets;
    positions = tu_positions(&P, S, B);
    x = tu_tensor(LAY_SBHD_PAD, dt, S, B, H, D, &xb);
    fill_tiny(&xb, &r);
    xsnap = tu_buf_copy(&xb);
    xorig = tu_rebase(&x, &xb, &xsnap);

    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    for (int pass = 0; pass < 2; pass++) {
        const int hostile = pass == 0 ? hostile_first : !hostile_first;
        if (hostile) {
            ctl = set_hostile();
            run_call(cache, style, &P, &x, inplace, &xb, backward, &res[1]);
            check_restored(what, ctl);
            set_default();
        } else {
            run_call(cache, style, &P, &x, inplace, &xb, backward, &res[0]);
        }
    }
    n = tu_changed(&res[1].out, &res[0].out, &first);
    ck_assert_msg(n == 0, "%s: %zu bytes differ between the default and the " FP_FLUSH_NAME "/upward "
                  "caller (first at byte %zu)", what, n, first);
    {
        int64_t bad = ref_check_apply(&ref, style, positions, &xorig, &res[0].y, backward, msg,
                                      sizeof msg);
        ck_assert_msg(bad == 0, "%s: %lld bad elements: %s", what, (long long)bad, msg);
    }
    ref_rope_free(&ref);
    tu_free_all();
}

START_TEST(test_apply_fpenv)
{
    for (int v = 0; v < 4; v++)
        apply_case(_i * 4 + v);
}
END_TEST

/* The table built by a hostile caller (workers born hostile or not) equals
 * the default caller's, subnormal entries included. */
START_TEST(test_cache_fpenv)
{
    const int hostile_first = _i % 2;
    fusedrope_cache_config cfg;
    fusedrope_cache *c[2]; /* [0] default, [1] hostile */
    const int rot_dim = 64;
    const int64_t rows = 4096; /* 131072 entries: built by the threads */
    const size_t n = (size_t)rows * (size_t)(rot_dim / 2);
    float *cs[2], *sn[2];
    size_t subnormal = 0;
    unsigned long ctl;

    tu_threads(3);
    tiny_config(&cfg, rot_dim, rows);
    for (int pass = 0; pass < 2; pass++) {
        const int hostile = pass == 0 ? hostile_first : !hostile_first;
        fusedrope_status st;
        if (hostile)
            ctl = set_hostile();
        st = fusedrope_cache_create(&cfg, CPU, &c[hostile]);
        if (hostile) {
            check_restored("cache_create", ctl);
            set_default();
        }
        ck_assert_int_eq(st, FUSEDROPE_OK);
        tu_track(c[hostile]);
    }
    for (int k = 0; k < 2; k++) {
        cs[k] = tu_alloc(n * sizeof(float));
        sn[k] = tu_alloc(n * sizeof(float));
        ck_assert_int_eq(fusedrope_cache_copy_table(c[k], cs[k], sn[k]), FUSEDROPE_OK);
    }
    for (size_t j = 0; j < n; j++)
        subnormal += fpclassify(sn[0][j]) == FP_SUBNORMAL;
    ck_assert_msg(subnormal > 0, "the table has no subnormal sin: the test checks nothing");
    ck_assert_msg(memcmp(cs[0], cs[1], n * sizeof(float)) == 0,
                  "cos tables differ between the default and the hostile caller");
    ck_assert_msg(memcmp(sn[0], sn[1], n * sizeof(float)) == 0,
                  "sin tables differ between the default and the hostile caller (%zu subnormal "
                  "entries)", subnormal);
    /* and against the reference's double values, rounded once to float */
    {
        ref_rope ref;
        ck_assert_int_eq(ref_rope_from_config(&ref, &cfg), 0);
        for (int64_t p = 0; p < rows; p += 37)
            for (int i = 0; i < rot_dim / 2; i++) {
                double rc, rs;
                const size_t j = (size_t)p * (size_t)(rot_dim / 2) + (size_t)i;
                ref_cos_sin(&ref, p, i, &rc, &rs);
                ck_assert_msg(fabs(sn[0][j] - rs) <= ref_ulp(rs, FUSEDROPE_FLOAT32) &&
                                  fabs(cs[0][j] - rc) <= ref_ulp(rc, FUSEDROPE_FLOAT32),
                              "table (%lld, %d): %a %a, reference %a %a", (long long)p, i,
                              cs[0][j], sn[0][j], rc, rs);
            }
        ref_rope_free(&ref);
    }
    tu_free_all();
}
END_TEST

/* The fused norm: y and rstd of the forward, dx and dw of the backward, of
 * a hostile caller (workers born hostile or not) are the default caller's
 * bytes.  _i: order, dtype, rounding mode; weights 1 + w (1 + w rounds
 * differently upward), tiny rows (their sums, n and products subnormal). */
START_TEST(test_norm_fpenv)
{
    const int hostile_first = _i % 2;
    const fusedrope_dtype dt = dtypes[_i / 2 % 3];
    const fusedrope_norm_rounding rounding = (fusedrope_norm_rounding)(_i / 6);
    const int64_t S = 131, H = 5, D = 128; /* 83840 elements: the threaded path */
    const size_t es = ref_dtype_size(dt), n = (size_t)(S * H * D);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    void *x = tu_alloc(n * es), *dy = tu_alloc(n * es), *w = tu_alloc((size_t)D * es);
    void *y[2], *dx[2];
    float *rs[2], *dw[2];
    tu_rng r;

    tu_threads(3);
    tu_rng_init(&r, 700 + (uint64_t)_i);
    for (size_t j = 0; j < n; j++) {
        const double scale = (j / (size_t)D) % 3 == 0 ? 0x1p-120 : 1.0; /* a tiny row in 3 */
        ref_store(x, dt, (int64_t)j, dt == FUSEDROPE_FLOAT16 ? tu_uniform(&r, -3.0, 3.0)
                                                             : scale * tu_uniform(&r, -3.0, 3.0));
        ref_store(dy, dt, (int64_t)j, tu_uniform(&r, -2.0, 2.0));
    }
    for (int64_t c = 0; c < D; c++)
        ref_store(w, dt, c, tu_uniform(&r, -0.3, 0.3));
    tiny_config(&cfg, (int)D, S + 3);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    for (int k = 0; k < 2; k++) {
        y[k] = tu_alloc(n * es);
        dx[k] = tu_alloc(n * es);
        rs[k] = tu_alloc(sizeof(float) * (size_t)(S * H));
        dw[k] = tu_alloc(sizeof(float) * (size_t)D);
    }
    for (int pass = 0; pass < 2; pass++) {
        const int hostile = pass == 0 ? hostile_first : !hostile_first;
        const fusedrope_tensor tx = fusedrope_tensor_bshd(x, dt, 1, S, H, D);
        const fusedrope_tensor ty = fusedrope_tensor_bshd(y[hostile], dt, 1, S, H, D);
        const fusedrope_tensor tdy = fusedrope_tensor_bshd(dy, dt, 1, S, H, D);
        const fusedrope_tensor tdx = fusedrope_tensor_bshd(dx[hostile], dt, 1, S, H, D);
        fusedrope_norm nm;
        fusedrope_status st;
        unsigned long ctl = 0;
        fusedrope_norm_init(&nm);
        nm.weight = FUSEDROPE_NORM_WEIGHT_PLUS_ONE;
        nm.rounding = rounding;
        nm.weight_dtype = dt;
        nm.eps = 1e-6;
        nm.q_weight = w;
        nm.q_rstd = rs[hostile];
        nm.dq_weight = dw[hostile];
        if (hostile)
            ctl = set_hostile();
        st = fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &tx, &ty, NULL, NULL,
                                       NULL);
        if (st == FUSEDROPE_OK)
            st = fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &tx, &tdy, &tdx,
                                            NULL, NULL, NULL, NULL);
        if (hostile) {
            check_restored("norm", ctl);
            set_default();
        }
        ck_assert_msg(st == FUSEDROPE_OK, "%s", fusedrope_last_error());
    }
    ck_assert_msg(memcmp(y[0], y[1], n * es) == 0 && memcmp(rs[0], rs[1], sizeof(float) * (size_t)(S * H)) == 0,
                  "%s rounding %d: the forward's y or rstd differ between the default and the "
                  FP_FLUSH_NAME "/upward caller", ref_dtype_name(dt), (int)rounding);
    ck_assert_msg(memcmp(dx[0], dx[1], n * es) == 0 && memcmp(dw[0], dw[1], sizeof(float) * (size_t)D) == 0,
                  "%s rounding %d: the backward's dx or dw differ between the default and the "
                  FP_FLUSH_NAME "/upward caller", ref_dtype_name(dt), (int)rounding);
    tu_free_all();
}
END_TEST

/* The norm's eps in a hostile caller's environment: _i picks it (rounding
 * upward, downward, toward zero, or to nearest with FTZ and DAZ).  eps is
 * a double the library narrows to float32 once a call; rows whose mean
 * square is near eps make rstd depend on every bit of it.  y and rstd must
 * be the default caller's bytes, an eps that is a float32 subnormal (1e-39)
 * must be accepted under FTZ too, and no exception flag may be left raised
 * (fusedrope_forward(3): flags raised by the library's arithmetic are not
 * kept; the narrowing of eps 1e-6 is inexact). */
START_TEST(test_norm_eps_fpenv)
{
    static const int modes[4] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO, FE_TONEAREST};
    static const double epss[4] = {1e-6, 1e-5, 0.7, 1e-39};
    const int64_t S = 7, H = 3, D = 64;
    const size_t n = (size_t)(S * H * D), nr = (size_t)(S * H);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    float *x = tu_alloc(n * sizeof(float)), *y[2], *rs[2];
    tu_rng r;

    tu_rng_init(&r, 900 + (uint64_t)_i);
    tiny_config(&cfg, (int)D, S + 1);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    for (int k = 0; k < 2; k++) {
        y[k] = tu_alloc(n * sizeof(float));
        rs[k] = tu_alloc(nr * sizeof(float));
    }
    for (int e = 0; e < 4; e++) {
        const fusedrope_tensor tx = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, 1, S, H, D);
        for (size_t j = 0; j < n; j++)
            x[j] = (float)(sqrt(epss[e]) * tu_uniform(&r, -2.0, 2.0));
        for (int hostile = 0; hostile < 2; hostile++) {
            const fusedrope_tensor ty = fusedrope_tensor_bshd(y[hostile], FUSEDROPE_FLOAT32, 1, S,
                                                              H, D);
            fusedrope_norm nm;
            fusedrope_status st;
            int flags;
            fusedrope_norm_init(&nm);
            nm.weight = FUSEDROPE_NORM_WEIGHT_NONE;
            nm.eps = epss[e];
            nm.q_rstd = rs[hostile];
            if (hostile)
                set_env(modes[_i], _i == 3);
            feclearexcept(FE_ALL_EXCEPT);
            st = fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &tx, &ty, NULL,
                                           NULL, NULL);
            flags = fetestexcept(FE_ALL_EXCEPT);
            set_default();
            ck_assert_msg(st == FUSEDROPE_OK, "eps %g, %s caller: %s", epss[e],
                          hostile ? "hostile" : "default", fusedrope_last_error());
            ck_assert_msg(flags == 0, "eps %g, %s caller (environment %d): exception flags 0x%x "
                          "left raised", epss[e], hostile ? "hostile" : "default", (int)_i, flags);
        }
        ck_assert_msg(memcmp(y[0], y[1], n * sizeof(float)) == 0 &&
                          memcmp(rs[0], rs[1], nr * sizeof(float)) == 0,
                      "eps %g: y or rstd differ between the default caller and environment %d",
                      epss[e], (int)_i);
    }
    tu_free_all();
}
END_TEST

/* No call leaves an exception flag raised (fusedrope_forward(3), CAVEATS:
 * flags raised by the library's arithmetic are not kept): every rope
 * type's cache build, table and table-less (_i: the type), then on that
 * cache each dtype's forward, backward, forward_qk and backward_qk, and the
 * fused norm's forward and backward in every weight kind and rounding,
 * threaded, at head_dim 128 and 96 (sqrt(head_dim), for one, is inexact
 * there: the norm's forward left FE_INEXACT raised until 2026-11-30), with
 * OpenMP's dynamic teams (OMP_DYNAMIC: libgomp sizes each team from the load
 * average, in floating point, on the calling thread, which left FE_INEXACT
 * raised by every threaded call until 2026-11-30). */
static void flags_after(const char *what, fusedrope_status st)
{
    const int flags = fetestexcept(FE_ALL_EXCEPT);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: %s", what, fusedrope_last_error());
    ck_assert_msg(flags == 0, "%s: exception flags 0x%x left raised", what, flags);
}

START_TEST(test_flags_fpenv)
{
    const fusedrope_rope_type type = (fusedrope_rope_type)_i;
    static const fusedrope_dtype dts[3] = {FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                           FUSEDROPE_BFLOAT16};
    const int64_t S = 64, H = 8, HK = 2;
    double sf[64], lf[64];
    char what[160];
    tu_rng r;

    tu_threads(3);
#ifdef _OPENMP
    omp_set_dynamic(1); /* this forked test's own process */
#endif
    tu_rng_init(&r, 9500 + (uint64_t)_i);
    for (int i = 0; i < 64; i++) {
        sf[i] = 1.0 + 0.01 * i;
        lf[i] = 1.0 + 0.37 * i;
    }
    for (int hd = 0; hd < 2; hd++) {
        const int D = hd ? 96 : 128;
        fusedrope_cache *c[2];
        for (int table = 0; table < 2; table++) {
            fusedrope_cache_config cfg;
            fusedrope_cache_config_init(&cfg, type, D, table ? 2048 : 0, 500000.0); /* a threaded build */
            cfg.factor = type == FUSEDROPE_ROPE_PROPORTIONAL ? 0.25 : 8.0;
            cfg.original_max_positions = 16;
            if (type == FUSEDROPE_ROPE_LONGROPE) {
                cfg.short_factor = sf;
                cfg.long_factor = lf;
                cfg.seq_len = 32;
            }
            if (type == FUSEDROPE_ROPE_PROPORTIONAL)
                cfg.partial_rotary_factor = 0.25;
            snprintf(what, sizeof what, "cache_create type %d, rot_dim %d, %s", (int)type, D,
                     table ? "table" : "table-less");
            feclearexcept(FE_ALL_EXCEPT);
            flags_after(what, fusedrope_cache_create(&cfg, CPU, &c[table]));
            tu_track(c[table]);
        }
        for (int d = 0; d < 3; d++) {
            const fusedrope_dtype dt = dts[d];
            const fusedrope_cache *cache = c[d % 2];
            const size_t es = ref_dtype_size(dt), nq = (size_t)(S * H * D), nk = (size_t)(S * HK * D);
            void *q = tu_alloc(nq * es), *k = tu_alloc(nk * es), *yq = tu_alloc(nq * es),
                 *yk = tu_alloc(nk * es), *dq = tu_alloc(nq * es), *dk = tu_alloc(nk * es),
                 *w = tu_alloc((size_t)D * es);
            float *rq = tu_alloc(sizeof(float) * (size_t)(S * H)),
                  *rk = tu_alloc(sizeof(float) * (size_t)(S * HK)),
                  *dwq = tu_alloc(sizeof(float) * (size_t)D), *dwk = tu_alloc(sizeof(float) * (size_t)D);
            const fusedrope_tensor tq = fusedrope_tensor_bshd(q, dt, 1, S, H, D),
                                   tk = fusedrope_tensor_bshd(k, dt, 1, S, HK, D),
                                   tyq = fusedrope_tensor_bshd(yq, dt, 1, S, H, D),
                                   tyk = fusedrope_tensor_bshd(yk, dt, 1, S, HK, D),
                                   tdq = fusedrope_tensor_bshd(dq, dt, 1, S, H, D),
                                   tdk = fusedrope_tensor_bshd(dk, dt, 1, S, HK, D);
            tu_fill(q, (int64_t)nq, dt, &r, -2.0, 2.0);
            tu_fill(k, (int64_t)nk, dt, &r, -2.0, 2.0);
            tu_fill(dq, (int64_t)nq, dt, &r, -1.0, 1.0);
            tu_fill(dk, (int64_t)nk, dt, &r, -1.0, 1.0);
            tu_fill(w, D, dt, &r, 0.1, 0.9);
            snprintf(what, sizeof what, "type %d, head_dim %d, %s, %s cache: ", (int)type, D,
                     ref_dtype_name(dt), d % 2 ? "table" : "table-less");
#define FLAGS_CALL(name, call)                                                        \
    do {                                                                              \
        char w_[256];                                                                 \
        snprintf(w_, sizeof w_, "%s%s", what, name);                                  \
        feclearexcept(FE_ALL_EXCEPT);                                                 \
        flags_after(w_, call);                                                        \
    } while (0)
            FLAGS_CALL("forward", fusedrope_forward(cache, FUSEDROPE_NEOX, NULL, &tq, &tyq, NULL));
            FLAGS_CALL("backward",
                       fusedrope_backward(cache, FUSEDROPE_INTERLEAVED, NULL, &tq, &tyq, NULL));
            FLAGS_CALL("forward_qk", fusedrope_forward_qk(cache, FUSEDROPE_NEOX, NULL, &tq, &tyq,
                                                          &tk, &tyk, NULL));
            FLAGS_CALL("backward_qk", fusedrope_backward_qk(cache, FUSEDROPE_NEOX, NULL, &tq,
                                                            &tyq, &tk, &tyk, NULL));
            for (int wk = 0; wk < 3; wk++)
                for (int rm = 0; rm < 3; rm++) {
                    fusedrope_norm nm;
                    char name[64];
                    fusedrope_norm_init(&nm);
                    nm.weight = (fusedrope_norm_weight)wk;
                    nm.rounding = (fusedrope_norm_rounding)rm;
                    nm.weight_dtype = dt;
                    if (nm.weight != FUSEDROPE_NORM_WEIGHT_NONE) {
                        nm.q_weight = nm.k_weight = w;
                        nm.dq_weight = dwq;
                        nm.dk_weight = dwk;
                    }
                    nm.q_rstd = rq;
                    nm.k_rstd = rk;
                    snprintf(name, sizeof name, "norm forward, weight %d, rounding %d", wk, rm);
                    FLAGS_CALL(name, fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm,
                                                               &tq, &tyq, &tk, &tyk, NULL));
                    snprintf(name, sizeof name, "norm backward, weight %d, rounding %d", wk, rm);
                    FLAGS_CALL(name, fusedrope_norm_backward_qk(cache, FUSEDROPE_NEOX, NULL, &nm,
                                                                &tq, &tdq, &tyq, &tk, &tdk, &tyk,
                                                                NULL));
                }
#undef FLAGS_CALL
        }
    }
    tu_free_all();
}
END_TEST

/* The public conversions in a hostile environment: _i picks the rounding
 * mode (upward, downward, toward zero), with FTZ and DAZ set.  Narrowing
 * every binary16 / bfloat16 value, the midpoints between neighbours and a
 * float ulp either side, the float subnormals and the range that narrows to
 * a binary16 subnormal, and random bits, must give the default caller's
 * bits; widening every 16-bit pattern too (fusedrope_float_to_bf16(3):
 * "They read no state").  Before the codec's subnormal rounding was done in
 * integers, fusedrope_float_to_half rounded 3e-6f to 0x0033 upward. */
START_TEST(test_conversions_fpenv)
{
    static const int modes[3] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    const size_t cap = 4 * 65536 + 65536 + 65536 + 100000;
    float *v = tu_alloc(cap * sizeof *v);
    uint16_t *want = tu_alloc(cap * sizeof *want), *got = tu_alloc(cap * sizeof *got);
    float *wide[2] = {tu_alloc(65536 * sizeof(float)), tu_alloc(65536 * sizeof(float))};
    tu_rng r;
    tu_rng_init(&r, 9300 + (uint64_t)_i);
    for (int k = 0; k < 2; k++) {
        const int half = k == 0;
        uint16_t (*narrow16)(float) = half ? fusedrope_float_to_half : fusedrope_float_to_bf16;
        float (*widen16)(uint16_t) = half ? fusedrope_half_to_float : fusedrope_bf16_to_float;
        size_t n = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            const float f = widen16((uint16_t)h), g = widen16((uint16_t)(h + 1));
            v[n++] = f;
            if (isfinite(f) && isfinite(g) && ((h + 1) & 0x7fff) != 0) {
                const float m = (float)(((double)f + (double)g) / 2);
                v[n++] = m;
                v[n++] = nextafterf(m, INFINITY);
                v[n++] = nextafterf(m, -INFINITY);
            }
        }
        for (uint32_t i = 0; i < 65536; i++) {     /* float subnormals, both signs */
            const uint32_t u = (i & 0x7fffu) * 0xffu + 1u + (i >> 15 ? 0x80000000u : 0u);
            memcpy(&v[n++], &u, 4);
        }
        for (uint32_t i = 0; i < 65536; i++) {     /* |f| < 2^-14, both signs */
            const uint32_t u = (i & 0x7fffu) * ((113u << 23) / 0x8000u) + (i >> 15 ? 0x80000000u : 0u);
            memcpy(&v[n++], &u, 4);
        }
        for (int i = 0; i < 100000; i++) {
            const uint32_t u = (uint32_t)tu_next(&r);
            memcpy(&v[n++], &u, 4);
        }
        ck_assert(n <= cap);
        if (tu_under_valgrind()) { /* every 37th value: memcheck has the arrays, and
                                    * its float emulation need not follow the mode */
            size_t m = 0;
            for (size_t i = 0; i < n; i += 37)
                v[m++] = v[i];
            n = m;
        }
        for (size_t i = 0; i < n; i++)
            want[i] = narrow16(v[i]);
        for (uint32_t h = 0; h < 65536; h++)
            wide[0][h] = widen16((uint16_t)h);
        set_env(modes[_i], 1);
        for (size_t i = 0; i < n; i++)
            got[i] = narrow16(v[i]);
        for (uint32_t h = 0; h < 65536; h++)
            wide[1][h] = widen16((uint16_t)h);
        set_default();
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(got[i] == want[i], "%s rounding mode %d with " FP_FLUSH_NAME ": %a gave 0x%04x, "
                          "0x%04x in the default environment", half ? "float16" : "bfloat16", _i,
                          (double)v[i], got[i], want[i]);
        ck_assert_msg(memcmp(wide[0], wide[1], 65536 * sizeof(float)) == 0,
                      "%s rounding mode %d with " FP_FLUSH_NAME ": a widening differs from the default "
                      "environment's", half ? "float16" : "bfloat16", _i);
    }
    tu_free_all();
}
END_TEST

/* NaN inputs with payloads (quiet and signalling, both signs) through the
 * forward, the backward and the fused norm in float32, where the NaN
 * results come from the arithmetic: the hostile caller's bytes must be the
 * default caller's (AArch64's FPCR.DN, which glibc's fesetenv(FE_DFL_ENV)
 * keeps, turned every one into the default NaN 0x7fc00000). */
START_TEST(test_nan_fpenv)
{
    const int64_t S = 5, B = 2, H = 3, D = 64;
    const size_t n = (size_t)(S * B * H * D);
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    float *x = tu_alloc(n * sizeof(float)), *y[2][3];
    float *rs[2] = {tu_alloc((size_t)(S * B * H) * sizeof(float)),
                    tu_alloc((size_t)(S * B * H) * sizeof(float))};
    tu_rng r;

    tu_rng_init(&r, 9700);
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, (int)D, S + 1, 10000.0);
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    tu_track(cache);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)tu_uniform(&r, -2.0, 2.0);
        if (tu_int(&r, 0, 7) == 0) {
            const uint32_t sign = tu_int(&r, 0, 1) ? 0x80000000u : 0u;
            const uint32_t quiet = tu_int(&r, 0, 1) ? 0x00400000u : 0u;
            const uint32_t payload = (uint32_t)tu_int(&r, 1, 0x3fffff);
            const uint32_t u = sign | 0x7f800000u | quiet | payload;
            memcpy(&x[i], &u, 4);
        }
    }
    for (int hostile = 0; hostile < 2; hostile++) {
        const fusedrope_tensor tx = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, B, S, H, D);
        fusedrope_tensor ty[3];
        fusedrope_norm nm;
        unsigned long ctl = 0;
        for (int k = 0; k < 3; k++) {
            y[hostile][k] = tu_alloc(n * sizeof(float));
            ty[k] = fusedrope_tensor_bshd(y[hostile][k], FUSEDROPE_FLOAT32, B, S, H, D);
        }
        fusedrope_norm_init(&nm);
        nm.weight = FUSEDROPE_NORM_WEIGHT_NONE;
        nm.q_rstd = rs[hostile];
        if (hostile)
            ctl = set_hostile();
        ck_assert_int_eq(fusedrope_forward(cache, FUSEDROPE_NEOX, NULL, &tx, &ty[0], NULL),
                         FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_backward(cache, FUSEDROPE_INTERLEAVED, NULL, &tx, &ty[1],
                                            NULL),
                         FUSEDROPE_OK);
        ck_assert_int_eq(fusedrope_norm_forward_qk(cache, FUSEDROPE_NEOX, NULL, &nm, &tx, &ty[2],
                                                   NULL, NULL, NULL),
                         FUSEDROPE_OK);
        if (hostile) {
            check_restored("NaN inputs", ctl);
            set_default();
        }
    }
    for (int k = 0; k < 3; k++) {
        const tu_buf def = {(unsigned char *)y[0][k], n * sizeof(float), FUSEDROPE_FLOAT32};
        const tu_buf hos = {(unsigned char *)y[1][k], n * sizeof(float), FUSEDROPE_FLOAT32};
        size_t first = 0;
        if (tu_changed(&hos, &def, &first) != 0) {
            const size_t i = first / sizeof(float);
            uint32_t a, b;
            memcpy(&a, &y[0][k][i], 4);
            memcpy(&b, &y[1][k][i], 4);
            ck_assert_msg(0, "%s: element %zu is 0x%08x for the default caller, 0x%08x for the "
                          FP_FLUSH_NAME "/upward one",
                          k == 0 ? "forward" : k == 1 ? "backward" : "norm forward", i, a, b);
        }
    }
    ck_assert(memcmp(rs[0], rs[1], (size_t)(S * B * H) * sizeof(float)) == 0);
    tu_free_all();
}
END_TEST

static Suite *fpenv_suite(void)
{
    Suite *s = suite_create("fpenv");
    TCase *tc = tcase_create("fpenv");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_apply_fpenv, 0, 96 / 4);
    tcase_add_loop_test(tc, test_cache_fpenv, 0, 2);
    tcase_add_loop_test(tc, test_norm_fpenv, 0, 18);
    tcase_add_loop_test(tc, test_norm_eps_fpenv, 0, 4);
    tcase_add_loop_test(tc, test_conversions_fpenv, 0, 3);
    tcase_add_test(tc, test_nan_fpenv);
    tcase_add_loop_test(tc, test_flags_fpenv, 0, FUSEDROPE_ROPE_PROPORTIONAL + 1);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_main(fpenv_suite(), "test_fpenv");
}
