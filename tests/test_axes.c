/*
 * test_axes.c - multimodal rope (position axes: mRoPE, interleaved,
 * alternating, vision 2D, custom maps) and the proportional rope type,
 * against the float64 reference (tests/ref.c: ref_axes_map,
 * ref_axis_positions, ref_check_apply with per-axis positions), which is
 * written from the layouts' formulas, never from lib/.
 *
 *   - the matrix: every layout x dtype x sbhd/bshd/thd x position source
 *     (ids rows dense or in a wider persistent buffer, one row, none) x in
 *     and out of place x forward/backward/_qk x table/table-less, poisoned
 *     outputs, bytes outside the views untouched;
 *   - each layout's axis string, seen through behaviour: moving one axis's
 *     positions moves exactly the pairs the model's layout gives that axis
 *     (the strings are written here from the model descriptions, e.g.
 *     Qwen3-VL [24,20,20] = "THW" x 20 + "TTTT");
 *   - every axis at the same position == a 1D cache of the same rope type,
 *     byte for byte (ids rows all equal, one row, or no ids);
 *   - per-axis additivity rope(rope(x, p), q) = rope(x, p + q) and
 *     backward(forward(x)) = x, within the bound;
 *   - the small vectors computed from the Hugging Face code paths;
 *   - refused configurations and positions, nothing written on failure.
 *
 * Built twice: test_axes runs the OpenMP backend; test_axes_emu wraps it so
 * that every call runs the CUDA kernels built for the host and must equal
 * the OpenMP backend byte for byte (tests/cuda_emu_wrap.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "fusedrope.h"
#include "internal.h" /* fr_avx2_off */
#include "ref.h"
#include "util.h"

#define CPU FUSEDROPE_DEVICE_CPU
#define MSG 2048
#define ROWS 300 /* table rows of the table caches */

static const fusedrope_dtype dtypes[3] = {FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT16,
                                          FUSEDROPE_BFLOAT16};

/* ----------------------------------------------------------------- layouts */

/* CUSTOM maps: a 4-axis one with repeated and permuted columns, a 2-axis one
 * with col(j) = j. */
static const unsigned char custom4_axis[20] = {3, 0, 1, 2, 0, 0, 3, 1, 1, 2,
                                               2, 0, 3, 3, 1, 0, 2, 1, 0, 3};
static const int custom4_col[20] = {0, 0, 19, 3, 4, 17, 6, 7, 1, 9,
                                    10, 11, 2, 13, 14, 5, 16, 5, 18, 8};
static const unsigned char custom2_axis[12] = {0, 1, 0, 1, 0, 1, 0, 0, 0, 1, 1, 1};
static const double long_f[16] = {1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
                                  6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0};
static const double short_f[16] = {1.0, 1.0, 1.1, 1.1, 1.2, 1.2, 1.3, 1.3,
                                   1.4, 1.4, 1.5, 1.5, 1.6, 1.6, 1.7, 1.7};

typedef struct spec {
    const char *name;
    fusedrope_rope_type type;
    fusedrope_axes axes;
    int s[4];
    int rot;
    int64_t D;
    fusedrope_style style; /* the model's */
    double theta;
    const unsigned char *pair_axis;
    const int *pair_col;
    double partial;
    int freq_dim;
    /* the axis of each pair, written from the model's description:
     * "chars*count" pieces joined by '+', axis numbers as digits */
    const char *pattern;
} spec;

#define NEOX FUSEDROPE_NEOX
#define GPTJ FUSEDROPE_INTERLEAVED
static const spec specs[] = {
    {"Qwen2-VL [16,24,24]", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_SECTIONS, {16, 24, 24, 0},
     128, 128, NEOX, 1e6, NULL, NULL, 0, 0, "0*16+1*24+2*24"},
    {"Qwen3-VL [24,20,20] interleaved", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_INTERLEAVED,
     {24, 20, 20, 0}, 128, 128, NEOX, 5e6, NULL, NULL, 0, 0, "012*20+0*4"},
    {"Qwen3.5 [11,11,10] rot 64/256 yarn", FUSEDROPE_ROPE_YARN, FUSEDROPE_AXES_INTERLEAVED,
     {11, 11, 10, 0}, 64, 256, NEOX, 1e7, NULL, NULL, 0, 0, "012*10+01"},
    {"GLM-4.1V [8,12,12] 64/128 GPT-J", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_SECTIONS,
     {8, 12, 12, 0}, 64, 128, GPTJ, 1e4, NULL, NULL, 0, 0, "0*8+1*12+2*12"},
    {"GLM-4.5V [8,12,12] 64/128 NeoX", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_SECTIONS,
     {8, 12, 12, 0}, 64, 128, NEOX, 1e4, NULL, NULL, 0, 0, "0*8+1*12+2*12"},
    {"Ernie-4.5-VL [20,22,22] alternating GPT-J", FUSEDROPE_ROPE_DEFAULT,
     FUSEDROPE_AXES_ALTERNATING, {20, 22, 22, 0}, 128, 128, GPTJ, 5e5, NULL, NULL, 0, 0,
     "12*22+0*20"},
    {"vision 2D head 80", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_VISION_2D, {0, 0, 0, 0}, 80, 80,
     NEOX, 1e4, NULL, NULL, 0, 0, "0*20+1*20"},
    {"vision 2D head 72", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_VISION_2D, {0, 0, 0, 0}, 72, 72,
     NEOX, 1e4, NULL, NULL, 0, 0, "0*18+1*18"},
    {"custom 4-axis map, columns", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_CUSTOM, {0, 0, 0, 0},
     40, 44, GPTJ, 1e4, custom4_axis, custom4_col, 0, 0, "30120031122033102103"},
    {"custom 2-axis map, linear", FUSEDROPE_ROPE_LINEAR, FUSEDROPE_AXES_CUSTOM, {0, 0, 0, 0}, 24,
     24, NEOX, 1e4, custom2_axis, NULL, 0, 0, "010101000111"},
    {"proportional 512 partial 0.25", FUSEDROPE_ROPE_PROPORTIONAL, FUSEDROPE_AXES_NONE,
     {0, 0, 0, 0}, 512, 512, NEOX, 1e6, NULL, NULL, 0.25, 0, "0*256"},
    {"proportional rot 38 [7,6,6] partial 0.5", FUSEDROPE_ROPE_PROPORTIONAL,
     FUSEDROPE_AXES_SECTIONS, {7, 6, 6, 0}, 38, 40, GPTJ, 1e4, NULL, NULL, 0.5, 0,
     "0*7+1*6+2*6"},
    {"sections [5,8,8] rot 42/46", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_SECTIONS,
     {5, 8, 8, 0}, 42, 46, NEOX, 1e4, NULL, NULL, 0, 0, "0*5+1*8+2*8"},
    {"interleaved [5,5,5] rot 30", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_INTERLEAVED,
     {5, 5, 5, 0}, 30, 30, GPTJ, 1e4, NULL, NULL, 0, 0, "012*5"},
    {"sections [0,10,6,4] four axes", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_SECTIONS,
     {0, 10, 6, 4}, 40, 40, NEOX, 1e4, NULL, NULL, 0, 0, "1*10+2*6+3*4"},
    {"longrope [4,6,6] seq_len 256", FUSEDROPE_ROPE_LONGROPE, FUSEDROPE_AXES_SECTIONS,
     {4, 6, 6, 0}, 32, 36, NEOX, 1e4, NULL, NULL, 0, 0, "0*4+1*6+2*6"},
    {"1D default rot 64/72 (no axes)", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_NONE,
     {0, 0, 0, 0}, 64, 72, GPTJ, 1e4, NULL, NULL, 0, 0, "0*32"},
    {"vision 2D rot 64 freq_dim 40", FUSEDROPE_ROPE_DEFAULT, FUSEDROPE_AXES_VISION_2D,
     {0, 0, 0, 0}, 64, 64, NEOX, 1e4, NULL, NULL, 0, 40, "0*16+1*16"},
};
#define NSPECS (int)(sizeof specs / sizeof specs[0])

/* The expanded pattern: axis of pair j as a digit. */
static void expand(const char *pat, char *out, size_t n)
{
    size_t len = 0;
    while (*pat) {
        const char *plus = strchr(pat, '+'), *star = strchr(pat, '*');
        size_t piece = plus ? (size_t)(plus - pat) : strlen(pat), k;
        size_t chars = star && (!plus || star < plus) ? (size_t)(star - pat) : piece;
        int count = chars < piece ? atoi(pat + chars + 1) : 1, c;
        for (c = 0; c < count; c++)
            for (k = 0; k < chars && len + 1 < n; k++)
                out[len++] = pat[k];
        pat += piece + (plus ? 1 : 0);
    }
    out[len] = 0;
}

static void spec_config(const spec *sp, fusedrope_cache_config *cfg, int64_t rows)
{
    fusedrope_cache_config_init(cfg, sp->type, sp->rot, rows, sp->theta);
    cfg->axes = sp->axes;
    memcpy(cfg->sections, sp->s, sizeof sp->s);
    cfg->pair_axis = sp->pair_axis;
    cfg->pair_col = sp->pair_col;
    cfg->partial_rotary_factor = sp->partial;
    cfg->freq_dim = sp->freq_dim;
    switch (sp->type) {
    case FUSEDROPE_ROPE_YARN:
        cfg->factor = 4;
        cfg->original_max_positions = 256;
        break;
    case FUSEDROPE_ROPE_LINEAR:
        cfg->factor = 2;
        break;
    case FUSEDROPE_ROPE_PROPORTIONAL:
        cfg->factor = sp->rot == 512 ? 1 : 2;
        break;
    case FUSEDROPE_ROPE_LONGROPE:
        cfg->factor = 4;
        cfg->original_max_positions = 64;
        cfg->seq_len = 256; /* past 64: the long factors, table or not */
        cfg->short_factor = short_f;
        cfg->long_factor = long_f;
        break;
    default:
        break;
    }
}

/* The number of position axes a layout has, from its description. */
static int spec_naxes(const spec *sp)
{
    char str[FUSEDROPE_MAX_ROT_DIM];
    int n = 1;
    size_t k;
    expand(sp->pattern, str, sizeof str);
    for (k = 0; str[k]; k++)
        if (str[k] - '0' + 1 > n)
            n = str[k] - '0' + 1;
    if (sp->axes == FUSEDROPE_AXES_SECTIONS || sp->axes == FUSEDROPE_AXES_INTERLEAVED ||
        sp->axes == FUSEDROPE_AXES_ALTERNATING)
        n = sp->s[3] > 0 ? 4 : 3;
    if (sp->axes == FUSEDROPE_AXES_NONE)
        n = 1;
    return n;
}

typedef struct cache_pair {
    fusedrope_cache *cache;
    ref_rope ref;
    int64_t rows;
    int naxes;
} cache_pair;

static void end_test(void)
{
    tu_free_all();
}

/* The reference's arrays, freed with the test. */
static void keep_ref(ref_rope *r)
{
    size_t half = (size_t)(r->rot_dim / 2);
    double *inv = r->inv_freq ? tu_dup(r->inv_freq, sizeof(double) * half) : NULL;
    unsigned char *ax = r->axis ? tu_dup(r->axis, half) : NULL;
    int *col = r->col ? tu_dup(r->col, sizeof(int) * half) : NULL;
    ref_rope_free(r);
    r->inv_freq = inv;
    r->axis = ax;
    r->col = col;
}

static void make_cache_cfg(cache_pair *cp, const fusedrope_cache_config *cfg, const char *name)
{
    fusedrope_status st = fusedrope_cache_create(cfg, CPU, &cp->cache);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: cache_create: %s (%s)", name,
                  fusedrope_status_string(st), fusedrope_last_error());
    tu_track(cp->cache);
    ck_assert_msg(ref_rope_from_config(&cp->ref, cfg) == 0, "%s: the reference refuses it",
                  name);
    keep_ref(&cp->ref);
    cp->rows = cfg->max_positions;
    cp->naxes = cp->ref.naxes ? cp->ref.naxes : 1;
}

static void make_cache(cache_pair *cp, const spec *sp, int64_t rows)
{
    fusedrope_cache_config cfg;
    spec_config(sp, &cfg, rows);
    make_cache_cfg(cp, &cfg, sp->name);
    ck_assert_msg(cp->naxes == spec_naxes(sp), "%s: the reference has %d axes, the layout %d",
                  sp->name, cp->naxes, spec_naxes(sp));
}

/* --------------------------------------------------------------- positions */

enum {
    PM_ROWS,        /* ids [naxes][tokens], dense */
    PM_ROWS_STRIDE, /* ids rows in a persistent [naxes][max_tokens] buffer */
    PM_ONE_ROW,     /* ids_axes 1: one position per token */
    PM_IDS0,        /* ids_axes 0 with ids: the same */
    PM_OFFSETS,     /* no ids: offsets (and THD sequences) */
    PM_NULL,        /* no positions at all (THD: cu_seqlens only) */
    PM_NUM
};
static const char *pm_names[PM_NUM] = {"ids rows", "ids rows, wide stride", "ids_axes 1",
                                       "ids_axes 0", "offsets", "implicit"};

/* A position for a table of `rows` (0: table-less, where a cache with axes
 * takes negatives: axis positions carry a model's rope delta). */
static int neg_ok;
static int64_t draw_pos(tu_rng *r, int64_t rows)
{
    return rows ? tu_int(r, 0, rows - 1) : tu_int(r, neg_ok ? -40 : 0, 100000);
}

/*
 * Fills *p for mode pm; returns the pointer to pass.  n = tokens (S * B).
 * Unused columns of a wide buffer hold values outside every table (the
 * library must not read them).
 */
static const fusedrope_positions *make_positions(fusedrope_positions *p, int pm, int naxes,
                                                 int64_t S, int64_t B, const int32_t *cu,
                                                 int64_t nseq, int64_t rows, tu_rng *r)
{
    int64_t n = S * B, k, a;
    fusedrope_positions_init(p);
    p->cu_seqlens = cu;
    p->num_seqs = cu ? nseq : 0;
    switch (pm) {
    case PM_ROWS:
    case PM_ROWS_STRIDE: {
        int64_t stride = pm == PM_ROWS ? n : n + 5;
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(stride * naxes + 1));
        for (k = 0; k < stride * naxes; k++)
            ids[k] = INT64_MIN / 3; /* never read */
        for (a = 0; a < naxes; a++)
            for (k = 0; k < n; k++)
                ids[a * stride + k] = draw_pos(r, rows);
        if (rows && n > 1) /* the table's ends on some axis */
            ids[(naxes - 1) * stride] = rows - 1, ids[1] = 0;
        p->ids = ids;
        p->ids_axes = naxes;
        p->ids_axis_stride = pm == PM_ROWS ? (tu_next(r) % 2 ? n : 0) : stride;
        break;
    }
    case PM_ONE_ROW:
    case PM_IDS0: {
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(n + 1));
        for (k = 0; k < n; k++)
            ids[k] = draw_pos(r, rows);
        p->ids = ids;
        p->ids_axes = pm == PM_ONE_ROW;
        break;
    }
    case PM_OFFSETS: {
        int64_t m = cu ? nseq : B, *off = tu_alloc(sizeof(int64_t) * (size_t)(m + 1));
        /* the largest offset puts a sequence's last token on the table's last row */
        int64_t hi = (rows ? rows : 100000) - S;
        for (k = 0; k < m; k++)
            off[k] = k == 0 ? hi : tu_int(r, 0, hi);
        p->offsets = off;
        break;
    }
    case PM_NULL:
        if (!cu)
            return NULL;
        break;
    }
    return p;
}

static int64_t *axis_positions(const fusedrope_positions *pos, int naxes, int64_t S, int64_t B)
{
    int64_t *out = tu_alloc(sizeof(int64_t) * (size_t)(naxes * S * B + 1));
    ref_axis_positions(pos, naxes, S, B, out);
    return out;
}

/* ----------------------------------------------------------------- checks */

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

static fusedrope_status call1(const fusedrope_cache *cache, fusedrope_style style,
                              const fusedrope_positions *pos, const fusedrope_tensor *in,
                              const fusedrope_tensor *out, int backward)
{
    return backward ? fusedrope_backward(cache, style, pos, in, out, NULL)
                    : fusedrope_forward(cache, style, pos, in, out, NULL);
}

/* ------------------------------------------------------------------ matrix */

enum { TL_SBHD, TL_BSHD, TL_THD, TL_NUM };
static const int tl_layout[TL_NUM] = {LAY_SBHD_PAD, LAY_BSHD, LAY_THD};
static const int32_t thd_cu[] = {0, 5, 5, 12, 13, 13, 17}; /* lengths 5 0 7 1 0 4 */

/* spec x tensor layout x table/table-less; each: 3 dtypes x in/out of place x
 * forward/backward/forward_qk/backward_qk */
#define MATRIX_N (NSPECS * TL_NUM * 2)

static void matrix_case(const spec *sp, const cache_pair *cp, int tl, int v, uint64_t stream)
{
    const fusedrope_dtype dt = dtypes[v % 3];
    const int inplace = (v / 3) % 2, dir = v / 6, backward = dir % 2, qk = dir >= 2;
    const fusedrope_style style = (fusedrope_style)((v + tl) % 2); /* both, every layout */
    const int thd = tl == TL_THD, lay = tl_layout[tl];
    const int pm = (int)(stream % PM_NUM);
    const int64_t S = thd ? thd_cu[6] : 7, B = thd ? 1 : 2, H = 3, Hk = 1, D = sp->D;
    tu_rng r;
    tu_buf qb, qob, kb, kob, qsnap, ksnap, qosnap, kosnap;
    fusedrope_tensor q, qo, k, ko, qorig, korig;
    fusedrope_positions P;
    const fusedrope_positions *pos;
    int64_t *positions;
    fusedrope_status st;
    char what[512];

    tu_rng_init(&r, stream);
    neg_ok = cp->ref.naxes > 0;
    q = tu_tensor(lay, dt, S, B, H, D, &qb);
    tu_fill_random(&qb, &r, -4, 4);
    k = tu_tensor(lay, dt, S, B, Hk, D, &kb);
    tu_fill_random(&kb, &r, -4, 4);
    if (inplace) {
        qob = qb, qo = q, kob = kb, ko = k;
    } else {
        qo = tu_tensor(thd ? LAY_SBHD : LAY_BSHD, dt, S, B, H, D, &qob);
        ko = tu_tensor(thd ? LAY_SBHD : LAY_BSHD, dt, S, B, Hk, D, &kob);
    }
    qsnap = tu_buf_copy(&qb);
    ksnap = tu_buf_copy(&kb);
    qosnap = tu_buf_copy(&qob);
    kosnap = tu_buf_copy(&kob);
    qorig = tu_rebase(&q, &qb, &qsnap);
    korig = tu_rebase(&k, &kb, &ksnap);
    pos = make_positions(&P, pm, cp->naxes, S, B, thd ? thd_cu : NULL, 6, cp->rows, &r);
    positions = axis_positions(pos, cp->naxes, S, B);
    snprintf(what, sizeof what,
             "[seed %llu stream %llu] %s, %s %s %s pos=%s %s %s%s cache=%s", 
             (unsigned long long)tu_seed, (unsigned long long)stream, sp->name,
             tu_layout_name(lay), ref_dtype_name(dt), style == NEOX ? "neox" : "gpt-j",
             pm_names[pm], inplace ? "in place" : "out of place",
             backward ? "backward" : "forward", qk ? "_qk" : "",
             cp->rows ? "table" : "table-less");
    if (qk)
        st = backward ? fusedrope_backward_qk(cp->cache, style, pos, &q, &qo, &k, &ko, NULL)
                      : fusedrope_forward_qk(cp->cache, style, pos, &q, &qo, &k, &ko, NULL);
    else
        st = call1(cp->cache, style, pos, &q, &qo, backward);
    ck_assert_msg(st == FUSEDROPE_OK, "%s: returned %s (%s)", what, fusedrope_status_string(st),
                  fusedrope_last_error());
    verify(what, &cp->ref, style, positions, &qorig, &qo, &qob, &qosnap, backward);
    if (qk) {
        verify(what, &cp->ref, style, positions, &korig, &ko, &kob, &kosnap, backward);
    } else {
        size_t first = 0, n = tu_changed(&kob, &kosnap, &first);
        ck_assert_msg(n == 0, "%s: k written by a q-only call", what);
    }
    if (!inplace) {
        size_t first = 0;
        ck_assert_msg(tu_changed(&qb, &qsnap, &first) == 0, "%s: input modified", what);
        ck_assert_msg(tu_changed(&kb, &ksnap, &first) == 0, "%s: input modified", what);
    }
}

START_TEST(test_matrix)
{
    int i = _i, v;
    const int table = i % 2, tl = (i / 2) % TL_NUM;
    const spec *sp = &specs[i / (2 * TL_NUM)];
    cache_pair cp;
    make_cache(&cp, sp, table ? ROWS : 0);
    for (v = 0; v < 24; v++) {
        /* under valgrind each placement and call once (v / 3), the dtype
         * (v % 3) turning with them and _i */
        if (tu_valgrind_skips(v % 3 + v / 3 + _i, 3))
            continue;
        matrix_case(sp, &cp, tl, v, 100000 + 24 * (uint64_t)_i + (uint64_t)v);
    }
    end_test();
}
END_TEST

/* ------------------------------------------------------------ axis strings */

/*
 * One token, float32, table-less: all axes at position P, then axis a moved
 * to P + 777.  The pairs whose two channels change must be exactly those the
 * layout's string gives axis a.  The rope type is DEFAULT here so that every
 * column has a frequency (proportional's zero columns never move).
 */
START_TEST(test_axis_string)
{
    const spec *sp = &specs[_i];
    const int half = sp->rot / 2;
    char str[FUSEDROPE_MAX_ROT_DIM], got[FUSEDROPE_MAX_ROT_DIM];
    fusedrope_cache_config cfg;
    cache_pair cp;
    tu_rng r;
    tu_buf xb, y0b, y1b;
    fusedrope_tensor x, y0, y1;
    fusedrope_positions P;
    int64_t ids[4];
    int a, j, naxes;
    unsigned char max[FUSEDROPE_MAX_ROT_DIM / 2];
    int col[FUSEDROPE_MAX_ROT_DIM / 2];

    expand(sp->pattern, str, sizeof str);
    ck_assert_msg((int)strlen(str) == half, "%s: test bug: pattern of %d pairs, not %d",
                  sp->name, (int)strlen(str), half);
    spec_config(sp, &cfg, 0);
    cfg.type = FUSEDROPE_ROPE_DEFAULT;
    cfg.partial_rotary_factor = 0;
    cfg.factor = 1;
    /* the reference agrees with the model's string */
    ck_assert_int_eq(ref_axes_map(&cfg, max, col, &naxes), 0);
    for (j = 0; j < half; j++)
        ck_assert_msg(max[j] == str[j] - '0', "%s: ref_axes_map gives pair %d axis %d, the "
                      "model %c", sp->name, j, max[j], str[j]);
    if (sp->axes == FUSEDROPE_AXES_NONE)
        return; /* nothing to move */
    make_cache_cfg(&cp, &cfg, sp->name);
    tu_rng_init(&r, 200 + (uint64_t)_i);
    x = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 1, 1, 1, sp->D, &xb);
    tu_fill_random(&xb, &r, 0.5, 2); /* no zero: every rotation shows */
    y0 = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 1, 1, 1, sp->D, &y0b);
    y1 = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 1, 1, 1, sp->D, &y1b);
    fusedrope_positions_init(&P);
    P.ids = ids;
    P.ids_axes = cp.naxes;
    for (a = 0; a < cp.naxes; a++)
        ids[a] = 1234;
    ck_assert_int_eq(fusedrope_forward(cp.cache, sp->style, &P, &x, &y0, NULL), FUSEDROPE_OK);
    for (a = 0; a < cp.naxes; a++) {
        int b;
        for (b = 0; b < cp.naxes; b++)
            ids[b] = b == a ? 1234 + 777 : 1234;
        ck_assert_msg(fusedrope_forward(cp.cache, sp->style, &P, &x, &y1, NULL) ==
                      FUSEDROPE_OK, "%s: %s", sp->name, fusedrope_last_error());
        for (j = 0; j < half; j++) {
            int64_t ca, cb;
            float u0, u1, w0, w1;
            ref_pair(sp->style, sp->rot, j, &ca, &cb);
            memcpy(&u0, (float *)y0.data + ca, 4);
            memcpy(&u1, (float *)y1.data + ca, 4);
            memcpy(&w0, (float *)y0.data + cb, 4);
            memcpy(&w1, (float *)y1.data + cb, 4);
            got[j] = (u0 != u1 || w0 != w1) ? (char)('0' + a) : '.';
        }
        got[half] = 0;
        for (j = 0; j < half; j++)
            if ((got[j] != '.') != (str[j] == '0' + a))
                ck_abort_msg("%s: moving axis %d moved the pairs %s; the layout's axis string "
                             "is %s", sp->name, a, got, str);
    }
    end_test();
}
END_TEST

/* ------------------------------------------------- all axes equal == 1D */

static int cols_identity(const spec *sp)
{
    return sp->axes != FUSEDROPE_AXES_VISION_2D && !sp->pair_col;
}

/*
 * Every axis at the token's position gives what a 1D cache of the same rope
 * type (axes NONE) gives, byte for byte: ids rows all equal (dense and wide),
 * one row, no ids (offsets, implicit, THD).  Layouts with col(j) = j.
 */
static void test_equal_axes_1d_body(int _i)
{
    int i = _i;
    const spec *sp = &specs[i % NSPECS];
    const int table = (i / NSPECS) % 2, thd = (i / NSPECS / 2) % 2;
    fusedrope_cache_config cfg;
    cache_pair ca, c1;
    int v;
    if (!cols_identity(sp) || sp->axes == FUSEDROPE_AXES_NONE)
        return;
    make_cache(&ca, sp, table ? ROWS : 0);
    spec_config(sp, &cfg, table ? ROWS : 0);
    cfg.axes = FUSEDROPE_AXES_NONE;
    memset(cfg.sections, 0, sizeof cfg.sections);
    cfg.pair_axis = NULL;
    cfg.pair_col = NULL;
    make_cache_cfg(&c1, &cfg, sp->name);
    for (v = 0; v < 3 * 2 * 2 * 4; v++) {
        const fusedrope_dtype dt = dtypes[v % 3];
        const fusedrope_style style = (fusedrope_style)((v / 3) % 2);
        const int backward = (v / 6) % 2, mode = v / 12;
        const int64_t S = thd ? thd_cu[6] : 9, B = thd ? 1 : 2, H = 2, D = sp->D, n = S * B;
        const int lay = thd ? LAY_THD : LAY_BSHD_PAD;
        tu_rng r;
        tu_buf xb, yab, y1b;
        fusedrope_tensor x, ya, y1;
        fusedrope_positions Pa, P1;
        const fusedrope_positions *pa = &Pa, *p1 = &P1;
        int64_t *ids1 = tu_alloc(sizeof(int64_t) * (size_t)n), *rows, k, a, stride;
        size_t first = 0;
        fusedrope_status st;
        tu_rng_init(&r, 300000 + 100 * (uint64_t)_i + (uint64_t)v);
        x = tu_tensor(lay, dt, S, B, H, D, &xb);
        tu_fill_random(&xb, &r, -4, 4);
        ya = tu_tensor(LAY_SBHD, dt, S, B, H, D, &yab);
        y1 = tu_tensor(LAY_SBHD, dt, S, B, H, D, &y1b);
        for (k = 0; k < n; k++)
            ids1[k] = table ? tu_int(&r, 0, ROWS - 1) : tu_int(&r, 0, 50000);
        stride = mode == 1 ? n + 3 : n;
        rows = tu_alloc(sizeof(int64_t) * (size_t)(stride * ca.naxes));
        for (a = 0; a < ca.naxes; a++)
            for (k = 0; k < n; k++)
                rows[a * stride + k] = ids1[k];
        fusedrope_positions_init(&Pa);
        fusedrope_positions_init(&P1);
        if (thd) {
            Pa.cu_seqlens = P1.cu_seqlens = thd_cu;
            Pa.num_seqs = P1.num_seqs = 6;
        }
        switch (mode) {
        case 0: /* ids rows, all equal; a 1D cache with the 1D ids */
        case 1:
            Pa.ids = rows;
            Pa.ids_axes = ca.naxes;
            Pa.ids_axis_stride = mode == 1 ? stride : 0;
            P1.ids = ids1;
            break;
        case 2: /* one row */
            Pa.ids = ids1;
            Pa.ids_axes = 1;
            P1.ids = ids1;
            break;
        case 3: /* no ids: offsets, or implicit */
            if (v % 2) {
                int64_t *off = tu_alloc(sizeof(int64_t) * 6);
                for (k = 0; k < 6; k++)
                    off[k] = tu_int(&r, 0, (table ? ROWS : 50000) - S - 1);
                Pa.offsets = P1.offsets = off;
            } else if (!thd) {
                pa = p1 = NULL;
            }
            break;
        }
        st = call1(ca.cache, style, pa, &x, &ya, backward);
        ck_assert_msg(st == FUSEDROPE_OK, "%s mode %d: %s (%s)", sp->name, mode,
                      fusedrope_status_string(st), fusedrope_last_error());
        ck_assert_int_eq(call1(c1.cache, style, p1, &x, &y1, backward), FUSEDROPE_OK);
        ck_assert_msg(tu_changed(&yab, &y1b, &first) == 0,
                      "[seed %llu] %s, %s %s %s %s, mode %d (0 rows, 1 wide rows, 2 one row, "
                      "3 no ids): all axes equal differs from the 1D cache at byte %zu",
                      (unsigned long long)tu_seed, sp->name, table ? "table" : "table-less",
                      thd ? "thd" : "bshd", ref_dtype_name(dt), backward ? "backward" : "forward",
                      mode, first);
    }
    end_test();
}
TU_GROUPED_TEST(test_equal_axes_1d, 2)

/* --------------------------------------------- additivity and round trips */

/* |y - z| within k bounds of a pair of inputs of magnitude 4 (the inputs
 * are in [-2, 2]: one rotation keeps a pair's magnitude under 2 sqrt 2) */
static void close_enough(const char *what, const fusedrope_tensor *x, const fusedrope_tensor *y,
                         const fusedrope_tensor *z, int rot_dim, double attn, double k)
{
    int64_t s, b, h, c;
    for (s = 0; s < x->seq_len; s++)
        for (b = 0; b < x->batch; b++)
            for (h = 0; h < x->heads; h++)
                for (c = 0; c < x->head_dim; c++) {
                    double gy = ref_load(y->data, y->dtype, ref_offset(y, s, b, h, c));
                    double gz = ref_load(z->data, z->dtype, ref_offset(z, s, b, h, c));
                    double tol = k * ref_tolerance(4, 4, 4, attn, y->dtype);
                    if (c >= rot_dim)
                        tol = 0;
                    if (!(fabs(gy - gz) <= tol))
                        ck_abort_msg("%s: [s %lld b %lld h %lld c %lld] %.9g vs %.9g (tol %.3g)",
                                     what, (long long)s, (long long)b, (long long)h,
                                     (long long)c, gy, gz, tol);
                }
}

/* rope(rope(x, p), q) = rope(x, p + q) per axis, table-less (q may be
 * negative: a rope delta), float32 */
static void test_additivity_body(int _i)
{
    const spec *sp = &specs[_i % NSPECS];
    const fusedrope_style style = (fusedrope_style)(_i / NSPECS % 2);
    const int64_t S = 5, B = 2, H = 2, D = sp->D, n = S * B;
    cache_pair cp;
    tu_rng r;
    tu_buf xb, y1b, y2b, zb;
    fusedrope_tensor x, y1, y2, z;
    fusedrope_positions Pp, Pq, Ps;
    int64_t *p, *q, *sum, k;
    char what[256];
    make_cache(&cp, sp, 0);
    if (cp.ref.attn != 1)
        return; /* two calls scale by attn twice */
    tu_rng_init(&r, 400 + (uint64_t)_i);
    p = tu_alloc(sizeof(int64_t) * (size_t)(n * cp.naxes));
    q = tu_alloc(sizeof(int64_t) * (size_t)(n * cp.naxes));
    sum = tu_alloc(sizeof(int64_t) * (size_t)(n * cp.naxes));
    for (k = 0; k < n * cp.naxes; k++) {
        p[k] = tu_int(&r, 0, 3000);
        q[k] = cp.ref.naxes ? tu_int(&r, -2000, 2000) : tu_int(&r, 0, 2000);
        sum[k] = p[k] + q[k];
    }
    x = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, B, H, D, &xb);
    tu_fill_random(&xb, &r, -2, 2);
    y1 = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, B, H, D, &y1b);
    y2 = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, B, H, D, &y2b);
    z = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, B, H, D, &zb);
    fusedrope_positions_init(&Pp);
    Pp.ids_axes = cp.naxes;
    Pq = Ps = Pp;
    Pp.ids = p;
    Pq.ids = q;
    Ps.ids = sum;
    ck_assert_msg(fusedrope_forward(cp.cache, style, &Pp, &x, &y1, NULL) == FUSEDROPE_OK, "%s",
                  fusedrope_last_error());
    ck_assert_msg(fusedrope_forward(cp.cache, style, &Pq, &y1, &y2, NULL) == FUSEDROPE_OK,
                  "%s: negative positions on a table-less cache with axes: %s", sp->name,
                  fusedrope_last_error());
    ck_assert_int_eq(fusedrope_forward(cp.cache, style, &Ps, &x, &z, NULL), FUSEDROPE_OK);
    snprintf(what, sizeof what, "[seed %llu] %s %s: rope(rope(x,p),q) vs rope(x,p+q)",
             (unsigned long long)tu_seed, sp->name, style == NEOX ? "neox" : "gpt-j");
    close_enough(what, &x, &y2, &z, sp->rot, 1, 3);
    end_test();
}
TU_GROUPED_TEST(test_additivity, 2)

/* backward(forward(x)) = x, every dtype, table and table-less */
static void test_round_trip_body(int _i)
{
    int i = _i;
    const spec *sp = &specs[i % NSPECS];
    const fusedrope_dtype dt = dtypes[(i / NSPECS) % 3];
    const int table = (i / NSPECS / 3) % 2;
    const fusedrope_style style = sp->style;
    const int64_t S = 6, B = 2, H = 2, D = sp->D;
    cache_pair cp;
    tu_rng r;
    tu_buf xb, yb, zb;
    fusedrope_tensor x, y, z;
    fusedrope_positions P;
    char what[256];
    make_cache(&cp, sp, table ? ROWS : 0);
    if (cp.ref.attn != 1)
        return; /* backward is the transpose, not the inverse, when attn != 1 */
    tu_rng_init(&r, 500 + (uint64_t)_i);
    neg_ok = cp.ref.naxes > 0;
    x = tu_tensor(LAY_BSHD, dt, S, B, H, D, &xb);
    tu_fill_random(&xb, &r, -2, 2);
    y = tu_tensor(LAY_SBHD, dt, S, B, H, D, &yb);
    z = tu_tensor(LAY_BSHD, dt, S, B, H, D, &zb);
    make_positions(&P, PM_ROWS_STRIDE, cp.naxes, S, B, NULL, 0, cp.rows, &r);
    ck_assert_int_eq(fusedrope_forward(cp.cache, style, &P, &x, &y, NULL), FUSEDROPE_OK);
    ck_assert_int_eq(fusedrope_backward(cp.cache, style, &P, &y, &z, NULL), FUSEDROPE_OK);
    snprintf(what, sizeof what, "[seed %llu] %s %s %s: backward(forward(x))",
             (unsigned long long)tu_seed, sp->name, ref_dtype_name(dt),
             table ? "table" : "table-less");
    close_enough(what, &x, &z, &x, sp->rot, 1, 3);
    end_test();
}
TU_GROUPED_TEST(test_round_trip, 2)

/* ---------------------------------------------------- proportional columns */

/* The pairs past floor(partial * rot_dim/2) pass unchanged, bit for bit. */
START_TEST(test_proportional_passes)
{
    static const struct { int rot; double partial; int nrot; } pc[] = {
        {512, 0.25, 64}, {38, 0.5, 9}, {30, 0.3, 4}, {64, 0, 32}, {24, 0.5, 6},
    };
    const int half = pc[_i].rot / 2;
    const fusedrope_style style = (fusedrope_style)(_i % 2);
    fusedrope_cache_config cfg;
    cache_pair cp;
    tu_rng r;
    tu_buf xb, yb;
    fusedrope_tensor x, y, xorig;
    int64_t *pos, S = 4, B = 1, H = 2, j, s, h;
    char what[128];
    tu_buf snap;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_PROPORTIONAL, pc[_i].rot, 0, 1e4);
    cfg.factor = 1;
    cfg.partial_rotary_factor = pc[_i].partial;
    make_cache_cfg(&cp, &cfg, "proportional");
    tu_rng_init(&r, 600 + (uint64_t)_i);
    x = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, B, H, pc[_i].rot, &xb);
    tu_fill_random(&xb, &r, -3, 3);
    snap = tu_buf_copy(&xb);
    xorig = tu_rebase(&x, &xb, &snap);
    y = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, S, B, H, pc[_i].rot, &yb);
    ck_assert_int_eq(fusedrope_forward(cp.cache, style, NULL, &x, &y, NULL), FUSEDROPE_OK);
    pos = axis_positions(NULL, 1, S, B);
    snprintf(what, sizeof what, "[seed %llu] proportional rot %d partial %g",
             (unsigned long long)tu_seed, pc[_i].rot, pc[_i].partial);
    verify(what, &cp.ref, style, pos, &xorig, &y, NULL, NULL, 0);
    for (j = 0; j < half; j++) {
        int64_t ca, cb;
        ck_assert_msg((cp.ref.inv_freq[j] != 0) == (j < pc[_i].nrot), "%s: the reference "
                      "rotates pair %lld", what, (long long)j);
        ref_pair(style, pc[_i].rot, (int)j, &ca, &cb);
        for (s = 1; s < S; s++)
            for (h = 0; h < H; h++) {
                int64_t oa = ref_offset(&x, s, 0, h, ca), ob = ref_offset(&x, s, 0, h, cb);
                int same = !memcmp((float *)y.data + oa, (float *)xorig.data + oa, 4) &&
                           !memcmp((float *)y.data + ob, (float *)xorig.data + ob, 4);
                /* (a rotating pair is judged by the reference above: a tiny
                 * partner can leave it unchanged at a small angle) */
                if (j >= pc[_i].nrot)
                    ck_assert_msg(same, "%s: pair %lld at s %lld changed; past the partial "
                                  "share it must pass unchanged", what, (long long)j,
                                  (long long)s);
            }
    }
    end_test();
}
END_TEST

/* --------------------------------------------------------------- HF vectors */

/* Small vectors computed from the Hugging Face code paths (shared notes):
 * theta 1e4, head_dim 16, x[i] = (i+1)/8 - 1, (t, h, w) = (3, 5, 7), fp32,
 * table-less. */
START_TEST(test_hf_vectors)
{
    static const double want[2][16] = {
        {0.848603434, -0.640227432, -0.707905383, -0.545114733, -0.405768328, -0.261826798,
         -0.131121887, -0.002213593, -0.247229069, -0.463798270, 0.173551054, 0.450388641,
         0.605476724, 0.745953570, 0.874103570, 0.999997550},
        {0.848603434, -0.242229890, -0.719608000, -0.545114733, -0.405768328, -0.266539354,
         -0.127624434, -0.001581138, -0.247229069, -0.752545467, -0.115820234, 0.450388641,
         0.605476724, 0.744282724, 0.874621063, 0.999998750},
    };
    static const int sec[2][4] = {{4, 2, 2, 0}, {3, 3, 2, 0}};
    static const int64_t ids[3] = {3, 5, 7};
    const int k = _i;
    fusedrope_cache_config cfg;
    fusedrope_cache *c;
    fusedrope_positions P;
    float x[16], y[16];
    fusedrope_tensor tx, ty;
    int i;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 16, 0, 1e4);
    cfg.axes = k ? FUSEDROPE_AXES_INTERLEAVED : FUSEDROPE_AXES_SECTIONS;
    memcpy(cfg.sections, sec[k], sizeof cfg.sections);
    ck_assert_msg(fusedrope_cache_create(&cfg, CPU, &c) == FUSEDROPE_OK, "%s",
                  fusedrope_last_error());
    tu_track(c);
    for (i = 0; i < 16; i++)
        x[i] = (float)((i + 1) / 8.0 - 1);
    memset(y, 0xff, sizeof y);
    tx = fusedrope_tensor_sbhd(x, FUSEDROPE_FLOAT32, 1, 1, 1, 16);
    ty = fusedrope_tensor_sbhd(y, FUSEDROPE_FLOAT32, 1, 1, 1, 16);
    fusedrope_positions_init(&P);
    P.ids = ids;
    P.ids_axes = 3;
    ck_assert_int_eq(fusedrope_forward(c, FUSEDROPE_NEOX, &P, &tx, &ty, NULL), FUSEDROPE_OK);
    for (i = 0; i < 16; i++)
        ck_assert_msg(fabs(y[i] - want[k][i]) <= 1e-6, "%s: y[%d] = %.9f, HF gives %.9f",
                      k ? "Qwen3-VL [3,3,2] interleaved" : "Qwen2-VL [4,2,2] sections", i, y[i],
                      want[k][i]);
    /* and the reference agrees with HF */
    {
        ref_rope rr;
        tu_buf xb;
        fusedrope_tensor t;
        double out[16];
        int64_t p3[3] = {3, 5, 7};
        ck_assert_int_eq(ref_rope_from_config(&rr, &cfg), 0);
        xb = tu_buf_new(FUSEDROPE_FLOAT32, 16);
        memcpy(xb.p, x, sizeof x);
        t = tu_view(LAY_SBHD, &xb, 1, 1, 1, 16);
        ref_apply(&rr, FUSEDROPE_NEOX, p3, &t, 0, out);
        for (i = 0; i < 16; i++)
            ck_assert_msg(fabs(out[i] - want[k][i]) <= 1e-6, "the reference: y[%d] = %.9f, HF "
                          "gives %.9f", i, out[i], want[k][i]);
        ref_rope_free(&rr);
    }
    end_test();
}
END_TEST

/* ------------------------------------------------------------- bad configs */

START_TEST(test_bad_configs)
{
    static const unsigned char ax_bad[8] = {0, 1, 2, 4, 0, 1, 2, 3};
    static const unsigned char ax_ok[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    static const int col_big[8] = {0, 1, 2, 3, 4, 5, 6, 8};
    static const int col_neg[8] = {0, 1, 2, 3, -1, 5, 6, 7};
    static const struct {
        const char *what;
        fusedrope_axes axes;
        int rot;
        int s[4];
        const unsigned char *pa;
        const int *pc;
        const char *names; /* last_error contains it */
    } bad[] = {
        {"sections short of rot_dim/2", FUSEDROPE_AXES_SECTIONS, 32, {4, 4, 4, 0}, NULL, NULL,
         "sum to 12, but axes SECTIONS needs rot_dim/2 = 16"},
        {"sections past rot_dim/2", FUSEDROPE_AXES_SECTIONS, 32, {8, 8, 8, 0}, NULL, NULL,
         "sum to 24, but axes SECTIONS needs rot_dim/2 = 16"},
        {"a negative section", FUSEDROPE_AXES_SECTIONS, 32, {10, -2, 8, 0}, NULL, NULL,
         "sections[1] is -2"},
        {"a section of -1", FUSEDROPE_AXES_SECTIONS, 32, {10, -1, 7, 0}, NULL, NULL,
         "sections[1] is -1; it must be >= 0"},
        {"interleaved with sections[3]", FUSEDROPE_AXES_INTERLEAVED, 32, {4, 4, 4, 4}, NULL,
         NULL, "sections[3] is 4; axes INTERLEAVED has three axes"},
        {"interleaved sections the preset cannot give", FUSEDROPE_AXES_INTERLEAVED, 32,
         {2, 7, 7, 0}, NULL, NULL, "do not fit axes INTERLEAVED"},
        {"interleaved, short", FUSEDROPE_AXES_INTERLEAVED, 32, {5, 5, 5, 0}, NULL, NULL,
         "sum to 15, but axes INTERLEAVED needs rot_dim/2 = 16"},
        {"alternating s1 != s2", FUSEDROPE_AXES_ALTERNATING, 32, {4, 6, 6 - 1, 1}, NULL, NULL,
         "axes ALTERNATING needs sections[1] == sections[2]"},
        {"alternating unequal", FUSEDROPE_AXES_ALTERNATING, 32, {5, 6, 5, 0}, NULL, NULL,
         "axes ALTERNATING needs sections[1] == sections[2]"},
        {"alternating with sections[3]", FUSEDROPE_AXES_ALTERNATING, 32, {2, 6, 6, 2}, NULL,
         NULL, "axes ALTERNATING needs sections[1] == sections[2]"},
        {"vision 2D with rot_dim % 4", FUSEDROPE_AXES_VISION_2D, 70, {0, 0, 0, 0}, NULL, NULL,
         "rot_dim is 70; axes VISION_2D"},
        {"custom without a map", FUSEDROPE_AXES_CUSTOM, 16, {0, 0, 0, 0}, NULL, NULL,
         "pair_axis is NULL"},
        {"custom axis 4", FUSEDROPE_AXES_CUSTOM, 16, {0, 0, 0, 0}, ax_bad, NULL,
         "pair_axis[3] is 4"},
        {"custom column rot_dim/2", FUSEDROPE_AXES_CUSTOM, 16, {0, 0, 0, 0}, ax_ok, col_big,
         "pair_col[7] is 8"},
        {"custom column -1", FUSEDROPE_AXES_CUSTOM, 16, {0, 0, 0, 0}, ax_ok, col_neg,
         "pair_col[4] is -1"},
        {"axes enum 6", (fusedrope_axes)6, 16, {8, 0, 0, 0}, NULL, NULL,
         "config->axes is 6"},
        {"axes enum -1", (fusedrope_axes)-1, 16, {8, 0, 0, 0}, NULL, NULL,
         "config->axes is -1"},
    };
    int k, rows;
    for (k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++)
        for (rows = 0; rows < 2; rows++) {
            fusedrope_cache_config cfg;
            fusedrope_cache *c = NULL;
            fusedrope_status st;
            unsigned char m[64];
            int col[64], n;
            fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, bad[k].rot,
                                        rows ? 64 : 0, 1e4);
            cfg.axes = bad[k].axes;
            memcpy(cfg.sections, bad[k].s, sizeof cfg.sections);
            cfg.pair_axis = bad[k].pa;
            cfg.pair_col = bad[k].pc;
            ck_assert_msg(ref_axes_map(&cfg, m, col, &n) != 0, "%s: the reference accepts it",
                          bad[k].what);
            st = fusedrope_cache_create(&cfg, CPU, &c);
            if (st == FUSEDROPE_OK)
                fusedrope_cache_destroy(c);
            ck_assert_msg(st == FUSEDROPE_ERR_INVALID, "%s (%s): %s, not INVALID", bad[k].what,
                          rows ? "table" : "table-less", fusedrope_status_string(st));
            ck_assert_msg(tu_contains(fusedrope_last_error(), bad[k].names),
                          "%s: last_error \"%s\" lacks \"%s\"", bad[k].what,
                          fusedrope_last_error(), bad[k].names);
        }
}
END_TEST

/* ----------------------------------------------------------- bad positions */

/* One position rule that needs no look at the values, under two forms
 * (forward out of place, backward_qk in place): the exact status, the
 * sentence naming the field (strstr), and nothing written. */
static void expect_pos_status(const cache_pair *cp, const spec *sp, const fusedrope_positions *P,
                              fusedrope_status want, const char *needle, const char *what,
                              tu_rng *r)
{
    const int64_t S = 4, B = 2, H = 2, D = sp->D;
    for (int form = 0; form < 2; form++) {
        const fusedrope_dtype dt = dtypes[form ? 2 : 0];
        tu_buf qb, kb, qob, qs, ks, qos;
        fusedrope_tensor q, k, qo;
        fusedrope_status st;
        size_t first = 0;
        q = tu_tensor(LAY_BSHD, dt, S, B, H, D, &qb);
        tu_fill_random(&qb, r, -2, 2);
        k = tu_tensor(LAY_BSHD, dt, S, B, 1, D, &kb);
        tu_fill_random(&kb, r, -2, 2);
        qo = tu_tensor(LAY_SBHD, dt, S, B, H, D, &qob);
        qs = tu_buf_copy(&qb);
        ks = tu_buf_copy(&kb);
        qos = tu_buf_copy(&qob);
        st = form ? fusedrope_backward_qk(cp->cache, sp->style, P, &q, &q, &k, &k, NULL)
                  : call1(cp->cache, sp->style, P, &q, &qo, 0);
        ck_assert_msg(st == want, "[seed %llu] %s, %s (%s): %s, not %s (%s)",
                      (unsigned long long)tu_seed, sp->name, what,
                      form ? "backward_qk, in place" : "forward", fusedrope_status_string(st),
                      fusedrope_status_string(want), fusedrope_last_error());
        if (want == FUSEDROPE_OK)
            continue;
        ck_assert_msg(strstr(fusedrope_last_error(), needle), "%s, %s: message '%s' lacks '%s'",
                      sp->name, what, fusedrope_last_error(), needle);
        ck_assert_msg(tu_changed(&qob, &qos, &first) == 0, "%s, %s: output written (byte %zu)",
                      sp->name, what, first);
        ck_assert_msg(tu_changed(&qb, &qs, &first) == 0, "%s, %s: q written (byte %zu)",
                      sp->name, what, first);
        ck_assert_msg(tu_changed(&kb, &ks, &first) == 0, "%s, %s: k written (byte %zu)",
                      sp->name, what, first);
    }
}

/*
 * Calls that must fail, with nothing written (poisoned outputs keep their
 * bytes; in place, the input keeps its): ids_axes other than 0, 1 or the
 * cache's axis count (INVALID); a position outside the table on any axis,
 * or negative with a table (RANGE); negative positions on a table-less 1D
 * cache (RANGE, as before).  Every call form.  Then the rules on ids rows
 * that need no look at the values, each with its sentence: rows without
 * ids, a negative ids_axis_stride (with rows or one), a stride below
 * batch x seq_len with rows, rows whose span passes int64 (RANGE).
 */
START_TEST(test_bad_positions)
{
    const spec *sp = &specs[_i % NSPECS];
    const int S = 4, B = 2, n = S * B;
    const int64_t H = 2, D = sp->D;
    cache_pair ct, cl;
    tu_rng r;
    int a, form, kase;
    make_cache(&ct, sp, ROWS);
    make_cache(&cl, sp, 0);
    tu_rng_init(&r, 700 + (uint64_t)_i);
    for (kase = 0; kase < 7 + 2 * FUSEDROPE_MAX_AXES; kase++)
        for (form = 0; form < 6; form++) {
            const fusedrope_dtype dt = dtypes[(kase + form) % 3];
            const int inplace = form % 2, qk = form >= 4, backward = form == 2 || form == 5;
            const cache_pair *cp = &ct;
            tu_buf qb, kb, qob, kob, qs, ks, qos, kos;
            fusedrope_tensor q, k, qo, ko;
            fusedrope_positions P;
            int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(n * FUSEDROPE_MAX_AXES + 1));
            fusedrope_status st, want = FUSEDROPE_ERR_RANGE;
            char what[256];
            int64_t t;
            size_t first = 0;
            for (t = 0; t < n * FUSEDROPE_MAX_AXES; t++)
                ids[t] = tu_int(&r, 0, ROWS - 1);
            fusedrope_positions_init(&P);
            P.ids = ids;
            P.ids_axes = ct.naxes;
            a = kase >= 7 ? (kase - 7) / 2 : 0;
            if (kase == 0) { /* ids_axes one short */
                P.ids_axes = ct.naxes == 1 ? 2 : ct.naxes - 1;
                want = FUSEDROPE_ERR_INVALID;
                if (ct.naxes == 2)
                    P.ids_axes = 3;
            } else if (kase == 1) {
                P.ids_axes = ct.naxes + 1;
                want = FUSEDROPE_ERR_INVALID;
            } else if (kase == 2) {
                P.ids_axes = -1;
                want = FUSEDROPE_ERR_INVALID;
            } else if (kase == 3) {
                P.ids_axes = FUSEDROPE_MAX_AXES + 1;
                want = FUSEDROPE_ERR_INVALID;
            } else if (kase == 4) { /* one row: past the table */
                P.ids_axes = 1;
                ids[n - 1] = ROWS;
            } else if (kase == 5) { /* one row: negative with a table */
                P.ids_axes = 0;
                ids[3] = -1;
            } else if (kase == 6) { /* no ids: offsets past the table */
                int64_t *off = tu_alloc(sizeof(int64_t) * 2);
                off[0] = 0;
                off[1] = ROWS - S + 1;
                P.ids = NULL;
                P.ids_axes = 0;
                P.offsets = off;
            } else if (a >= ct.naxes) {
                continue;
            } else if ((kase - 7) % 2 == 0) { /* axis a past the table, one token */
                ids[a * n + (a + 3) % n] = ROWS + a;
            } else { /* axis a negative */
                ids[a * n + (a + 5) % n] = -1 - a;
            }
            q = tu_tensor(LAY_BSHD, dt, S, B, H, D, &qb);
            tu_fill_random(&qb, &r, -2, 2);
            k = tu_tensor(LAY_BSHD, dt, S, B, 1, D, &kb);
            tu_fill_random(&kb, &r, -2, 2);
            if (inplace) {
                qo = q, ko = k, qob = qb, kob = kb;
            } else {
                qo = tu_tensor(LAY_SBHD, dt, S, B, H, D, &qob);
                ko = tu_tensor(LAY_SBHD, dt, S, B, 1, D, &kob);
            }
            qs = tu_buf_copy(&qb);
            ks = tu_buf_copy(&kb);
            qos = tu_buf_copy(&qob);
            kos = tu_buf_copy(&kob);
            if (qk)
                st = backward ? fusedrope_backward_qk(cp->cache, sp->style, &P, &q, &qo, &k,
                                                      &ko, NULL)
                              : fusedrope_forward_qk(cp->cache, sp->style, &P, &q, &qo, &k, &ko,
                                                     NULL);
            else
                st = call1(cp->cache, sp->style, &P, &q, &qo, backward);
            snprintf(what, sizeof what, "[seed %llu] %s case %d (axis %d) form %d (%s%s%s) %s",
                     (unsigned long long)tu_seed, sp->name, kase, a, form,
                     backward ? "backward" : "forward", qk ? "_qk" : "",
                     inplace ? ", in place" : "", ref_dtype_name(dt));
            ck_assert_msg(st == want, "%s: %s, not %s", what, fusedrope_status_string(st),
                          fusedrope_status_string(want));
            if (kase >= 7 && ct.naxes > 1) { /* the sentence names the axis */
                char on_axis[32];
                snprintf(on_axis, sizeof on_axis, "on axis %d", a);
                ck_assert_msg(strstr(fusedrope_last_error(), on_axis), "%s: '%s' lacks '%s'",
                              what, fusedrope_last_error(), on_axis);
            }
            ck_assert_msg(tu_changed(&qob, &qos, &first) == 0, "%s: output written (byte %zu)",
                          what, first);
            ck_assert_msg(tu_changed(&kob, &kos, &first) == 0, "%s: k output written", what);
            ck_assert_msg(tu_changed(&qb, &qs, &first) == 0, "%s: input written", what);
            ck_assert_msg(tu_changed(&kb, &ks, &first) == 0, "%s: k input written", what);

            /* the same positions on the table-less cache: only a bad
             * ids_axes fails; negatives are fine with axes */
            if (kase >= 4 && form == 0) {
                int neg = kase == 5 || (kase >= 7 && (kase - 7) % 2 == 1);
                st = call1(cl.cache, sp->style, &P, &q, &qo, 0);
                if (sp->axes == FUSEDROPE_AXES_NONE && neg)
                    ck_assert_msg(st == FUSEDROPE_ERR_RANGE, "%s, table-less 1D: negative "
                                  "position gives %s", what, fusedrope_status_string(st));
                else
                    ck_assert_msg(st == FUSEDROPE_OK, "%s, table-less: %s (%s)", what,
                                  fusedrope_status_string(st), fusedrope_last_error());
            } else if (kase < 4 && form == 0) {
                st = call1(cl.cache, sp->style, &P, &q, &qo, 0);
                ck_assert_msg(st == FUSEDROPE_ERR_INVALID, "%s, table-less: %s", what,
                              fusedrope_status_string(st));
            }
            /* offsets whose sum with a position passes INT64_MAX: no position,
             * with axes too (wrapped, the sum would be a negative one, which
             * a table-less cache with axes takes), nothing written */
            if (kase == 6 && form == 0) {
                qos = tu_buf_copy(&qob); /* the call above wrote it */
                ((int64_t *)P.offsets)[1] = INT64_MAX - 1; /* tokens 2 and 3 past */
                st = call1(cl.cache, sp->style, &P, &q, &qo, 0);
                ck_assert_msg(st == FUSEDROPE_ERR_RANGE && strstr(fusedrope_last_error(), "int64"),
                              "%s, table-less, offsets past INT64_MAX: %s (%s)", what,
                              fusedrope_status_string(st), fusedrope_last_error());
                ck_assert_msg(tu_changed(&qob, &qos, &first) == 0, "%s: output written (byte "
                              "%zu)", what, first);
                /* the last token exactly at INT64_MAX: a position, not past it */
                ((int64_t *)P.offsets)[1] = INT64_MAX - 3;
                st = call1(cl.cache, sp->style, &P, &q, &qo, 0);
                ck_assert_msg(st == FUSEDROPE_OK, "%s, table-less, last token at INT64_MAX: "
                              "%s (%s)", what, fusedrope_status_string(st),
                              fusedrope_last_error());
            }
        }
    {
        /* the rules on ids and the stride between its rows
         * (fusedrope_positions_init(3)): rows need ids; the stride is never
         * negative, and with rows 0 or >= batch x seq_len (8 here); rows
         * whose span passes int64 are ERR_RANGE.  With one row (ids_axes 0
         * or 1) the stride is ignored, but still not negative. */
        int64_t *ids = tu_alloc(sizeof(int64_t) * (size_t)(n * FUSEDROPE_MAX_AXES));
        fusedrope_positions P;
        for (int64_t t = 0; t < n * FUSEDROPE_MAX_AXES; t++)
            ids[t] = tu_int(&r, 0, ROWS - 1);
        fusedrope_positions_init(&P);
        if (ct.naxes > 1) {
            char span[96];
            P.ids_axes = ct.naxes;
            expect_pos_status(&ct, sp, &P, FUSEDROPE_ERR_INVALID, "but pos->ids is NULL",
                              "rows without ids", &r);
            P.ids = ids;
            P.ids_axis_stride = -1;
            expect_pos_status(&ct, sp, &P, FUSEDROPE_ERR_INVALID,
                              "pos->ids_axis_stride is -1; it must be >= 0", "stride -1", &r);
            P.ids_axis_stride = 1;
            expect_pos_status(&ct, sp, &P, FUSEDROPE_ERR_INVALID,
                              "ids_axis_stride is 1; rows of ids hold batch x seq_len = 8 "
                              "positions, so it must be 0 (dense) or >= 8",
                              "stride 1", &r);
            P.ids_axis_stride = n - 1;
            expect_pos_status(&ct, sp, &P, FUSEDROPE_ERR_INVALID,
                              "so it must be 0 (dense) or >= 8", "stride 7", &r);
            P.ids_axis_stride = INT64_MAX;
            snprintf(span, sizeof span, "pos->ids: %d rows %lld apart span more memory",
                     ct.naxes, (long long)INT64_MAX);
            expect_pos_status(&ct, sp, &P, FUSEDROPE_ERR_RANGE, span, "stride INT64_MAX", &r);
            P.ids_axis_stride = n; /* the boundary: dense rows */
            expect_pos_status(&ct, sp, &P, FUSEDROPE_OK, "", "stride 8", &r);
        }
        P.ids = ids;
        for (int rows = 0; rows <= 1; rows++) {
            P.ids_axes = rows;
            P.ids_axis_stride = -5;
            expect_pos_status(&ct, sp, &P, FUSEDROPE_ERR_INVALID,
                              "pos->ids_axis_stride is -5; it must be >= 0",
                              rows ? "one row, stride -5" : "ids_axes 0, stride -5", &r);
            P.ids_axis_stride = 1; /* ignored */
            expect_pos_status(&ct, sp, &P, FUSEDROPE_OK, "",
                              rows ? "one row, stride 1" : "ids_axes 0, stride 1", &r);
        }
    }
    end_test();
}
END_TEST

/* pos->range_status, the word the CUDA kernels write, shares no byte with
 * any row of ids (fusedrope_forward(3)): it was checked against the first
 * row only.  A CPU cache applies the same host rules. */
START_TEST(test_range_status_in_ids_rows)
{
    enum { S = 3, B = 2, H = 2, D = 64, N = S * B, STRIDE = N + 2 };
    static float x[S * B * H * D], y[S * B * H * D];
    int64_t ids[3 * STRIDE];
    fusedrope_cache_config cfg;
    fusedrope_cache *cache;
    fusedrope_positions P;
    fusedrope_tensor tx, ty;
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, D, ROWS, 10000.0);
    cfg.axes = FUSEDROPE_AXES_SECTIONS;
    cfg.sections[0] = 8;
    cfg.sections[1] = cfg.sections[2] = 12;
    ck_assert_int_eq(fusedrope_cache_create(&cfg, CPU, &cache), FUSEDROPE_OK);
    for (int i = 0; i < 3 * STRIDE; i++)
        ids[i] = i % 7;
    tx = fusedrope_tensor_bshd(x, FUSEDROPE_FLOAT32, S, B, H, D);
    ty = fusedrope_tensor_bshd(y, FUSEDROPE_FLOAT32, S, B, H, D);
    fusedrope_positions_init(&P);
    P.ids = ids;
    P.ids_axes = 3;
    P.ids_axis_stride = STRIDE;
    for (int row = 0; row < 3; row++)
        for (int at = 0; at < N; at += N - 1) {
            P.range_status = (int32_t *)&ids[row * STRIDE + at];
            ck_assert_msg(fusedrope_forward(cache, FUSEDROPE_NEOX, &P, &tx, &ty, NULL) ==
                              FUSEDROPE_ERR_INVALID &&
                              strstr(fusedrope_last_error(), "pos->ids"),
                          "range word in ids row %d, token %d: %s", row, at,
                          fusedrope_last_error());
        }
    P.range_status = (int32_t *)&ids[2 * STRIDE + N]; /* past the last row's tokens */
    ck_assert_msg(fusedrope_forward(cache, FUSEDROPE_NEOX, &P, &tx, &ty, NULL) == FUSEDROPE_OK,
                  "range word past ids: %s", fusedrope_last_error());
    fusedrope_cache_destroy(cache);
}
END_TEST

/* ---------------------------------------------------- a persistent buffer */

/*
 * An engine's [3][max_tokens] buffer used as it is: ids_axis_stride =
 * max_tokens, far wider than the call's tokens; the columns past them hold
 * positions outside every table, which the library must not read.  THD
 * tokens, then the same rows on a bshd tensor.
 */
/*
 * Outputs of >= 4 MiB (streamed by the CPU backend, out of place, aligned),
 * 16-bit ones with and without the AVX2 rotations: maps whose pairs are read
 * in steps of 8 straight from the table rows (Qwen2-VL), steps gathered
 * among them (GLM's [8,12,12] crosses a boundary inside a step, both
 * styles, pass-through channels), and heads of 80 and 72 channels (a tail
 * of 4 pairs, a head not whole 16-byte halves), forward and backward.
 */
static const int streamed_specs[5] = {0, 3, 4, 6, 7};

static void test_streamed_body(int _i)
{
    const spec *sp = &specs[streamed_specs[_i / 3]];
    int runs = 0;
    const fusedrope_dtype dt = dtypes[_i % 3];
    /* under valgrind (CI's slowest stage; 4 MiB verified in float64 is
     * slow under memcheck) each map in one dtype, every dtype among them,
     * and one call of the map's, in turn (below) */
    if (tu_valgrind_skips(_i / 3 + _i % 3, 3))
        return;
    const int64_t B = 1, H = 32, D = sp->D;
    const int64_t S = ((int64_t)4 << 20) / (H * D * (int64_t)ref_dtype_size(dt)) + 3;
    cache_pair cp;
    tu_rng r;
    make_cache(&cp, sp, ROWS);
    tu_rng_init(&r, 300000 + (uint64_t)_i);
    neg_ok = 0;
    for (int off = 0; off < (dt == FUSEDROPE_FLOAT32 ? 1 : 2); off++) {
        for (int backward = 0; backward < 2; backward++) {
            tu_buf xb, yb, ysnap;
            if (tu_under_valgrind() && runs++ != _i / 3 % (dt == FUSEDROPE_FLOAT32 ? 2 : 4))
                continue;
            fusedrope_tensor x = tu_tensor(LAY_SBHD, dt, S, B, H, D, &xb);
            fusedrope_tensor y = tu_tensor(LAY_SBHD, dt, S, B, H, D, &yb);
            fusedrope_positions P;
            const fusedrope_positions *pos =
                make_positions(&P, PM_ROWS, cp.naxes, S, B, NULL, 0, ROWS, &r);
            const int64_t *positions = axis_positions(pos, cp.naxes, S, B);
            fusedrope_status st;
            char what[512];
            tu_fill_random(&xb, &r, -4, 4);
            ysnap = tu_buf_copy(&yb);
            ck_assert_msg(yb.nbytes >= ((size_t)4 << 20), "not a streamed size");
            snprintf(what, sizeof what, "[seed %llu] %s, %s %s %s%s, streamed",
                     (unsigned long long)tu_seed, sp->name, ref_dtype_name(dt),
                     sp->style == NEOX ? "neox" : "gpt-j", backward ? "backward" : "forward",
                     off ? ", AVX2 off" : "");
#ifdef FR_HAVE_AVX2
            __atomic_store_n(&fr_avx2_off, off, __ATOMIC_RELAXED);
#endif
            st = call1(cp.cache, sp->style, pos, &x, &y, backward);
#ifdef FR_HAVE_AVX2
            __atomic_store_n(&fr_avx2_off, 0, __ATOMIC_RELAXED);
#endif
            ck_assert_msg(st == FUSEDROPE_OK, "%s: returned %s (%s)", what,
                          fusedrope_status_string(st), fusedrope_last_error());
            verify(what, &cp.ref, sp->style, positions, &x, &y, &yb, &ysnap, backward);
        }
    }
    end_test();
}

START_TEST(test_streamed)
{
#ifdef TU_EMULATED
    /* the kernels do not stream: under valgrind, test_axes covers the CPU's
     * streamed rows, and these sizes through the emulated kernels were a
     * third of test_axes_emu's time there */
    if (tu_under_valgrind())
        return;
#endif
    test_streamed_body(_i);
}
END_TEST

START_TEST(test_persistent_buffer)
{
    const spec *sp = &specs[_i];
    const int64_t max_tokens = 1000, T = thd_cu[6], H = 4, D = sp->D;
    cache_pair cp;
    tu_rng r;
    int64_t *buf, k, a, *positions;
    int thd;
    make_cache(&cp, sp, ROWS);
    tu_rng_init(&r, 800 + (uint64_t)_i);
    buf = tu_alloc(sizeof(int64_t) * (size_t)(max_tokens * cp.naxes));
    for (k = 0; k < max_tokens * cp.naxes; k++)
        buf[k] = k % 2 ? -1 : ROWS + k;
    for (a = 0; a < cp.naxes; a++)
        for (k = 0; k < T + 1; k++)
            buf[a * max_tokens + k] = tu_int(&r, 0, ROWS - 1);
    for (thd = 0; thd < 2; thd++) {
        const int64_t S = thd ? T : 8, B = thd ? 1 : 2;
        tu_buf xb, yb, xs, ys;
        fusedrope_tensor x, y, xo;
        fusedrope_positions P;
        char what[256];
        if (!thd && S * B > T + 1)
            ck_abort_msg("test bug");
        x = tu_tensor(thd ? LAY_THD : LAY_BSHD, FUSEDROPE_BFLOAT16, S, B, H, D, &xb);
        tu_fill_random(&xb, &r, -3, 3);
        y = tu_tensor(LAY_SBHD_PAD, FUSEDROPE_BFLOAT16, S, B, H, D, &yb);
        xs = tu_buf_copy(&xb);
        ys = tu_buf_copy(&yb);
        xo = tu_rebase(&x, &xb, &xs);
        fusedrope_positions_init(&P);
        P.ids = buf;
        P.ids_axes = cp.naxes;
        P.ids_axis_stride = max_tokens;
        if (thd) {
            P.cu_seqlens = thd_cu;
            P.num_seqs = 6;
        }
        positions = axis_positions(&P, cp.naxes, S, B);
        snprintf(what, sizeof what, "[seed %llu] %s, persistent [%d][1000] buffer, %s",
                 (unsigned long long)tu_seed, sp->name, cp.naxes, thd ? "thd" : "bshd");
        ck_assert_msg(fusedrope_forward(cp.cache, sp->style, &P, &x, &y, NULL) == FUSEDROPE_OK,
                      "%s: %s", what, fusedrope_last_error());
        verify(what, &cp.ref, sp->style, positions, &xo, &y, &yb, &ys, 0);
    }
    end_test();
}
END_TEST

/* ------------------------------------------------------- longrope's length */

/* seq_len decides between the factors, table or not: seq_len past the
 * original length takes the long ones even where the table is short, and
 * seq_len within it the short ones even where the table is long. */
START_TEST(test_longrope_seq_len)
{
    static const struct { int64_t rows, seq_len; } lc[] = {
        {0, 256}, {0, 32}, {32, 256}, {128, 16}, {128, 0}, {32, 0},
    };
    fusedrope_cache_config cfg;
    cache_pair cp;
    tu_rng r;
    tu_buf xb, yb;
    fusedrope_tensor x, y;
    int64_t *pos;
    char what[128];
    fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_LONGROPE, 32, lc[_i].rows, 1e4);
    cfg.factor = 4;
    cfg.original_max_positions = 64;
    cfg.seq_len = lc[_i].seq_len;
    cfg.short_factor = short_f;
    cfg.long_factor = long_f;
    make_cache_cfg(&cp, &cfg, "longrope");
    tu_rng_init(&r, 900 + (uint64_t)_i);
    x = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 16, 1, 2, 32, &xb);
    tu_fill_random(&xb, &r, -2, 2);
    y = tu_tensor(LAY_SBHD, FUSEDROPE_FLOAT32, 16, 1, 2, 32, &yb);
    ck_assert_int_eq(fusedrope_forward(cp.cache, NEOX, NULL, &x, &y, NULL), FUSEDROPE_OK);
    pos = axis_positions(NULL, 1, 16, 1);
    snprintf(what, sizeof what, "[seed %llu] longrope rows %lld seq_len %lld",
             (unsigned long long)tu_seed, (long long)lc[_i].rows, (long long)lc[_i].seq_len);
    verify(what, &cp.ref, NEOX, pos, &x, &y, NULL, NULL, 0);
    end_test();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("axes");
    TCase *tc = tcase_create("axes");
    tcase_set_timeout(tc, tu_under_valgrind() ? 3000 : 300);
    tcase_add_loop_test(tc, test_matrix, 0, MATRIX_N);
    tcase_add_loop_test(tc, test_axis_string, 0, NSPECS);
    tcase_add_loop_test(tc, test_equal_axes_1d, 0, NSPECS * 4 / 2);
    tcase_add_loop_test(tc, test_additivity, 0, NSPECS * 2 / 2);
    tcase_add_loop_test(tc, test_round_trip, 0, NSPECS * 6 / 2);
    tcase_add_loop_test(tc, test_proportional_passes, 0, 5);
    tcase_add_loop_test(tc, test_hf_vectors, 0, 2);
    tcase_add_test(tc, test_bad_configs);
    tcase_add_loop_test(tc, test_bad_positions, 0, NSPECS);
    tcase_add_test(tc, test_range_status_in_ids_rows);
    tcase_add_loop_test(tc, test_persistent_buffer, 0, NSPECS);
    tcase_add_loop_test(tc, test_streamed, 0, 15);
    tcase_add_loop_test(tc, test_longrope_seq_len, 0, 6);
    suite_add_tcase(s, tc);
    return tu_main(s, "test_axes");
}
