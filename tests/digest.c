/*
 * digest.c - prints an FNV-1a digest of the bytes of a fixed set of library
 * calls, so that a refactoring can show it changed no output byte: run it
 * before and after and compare (bench/RESULTS.md keeps the record).
 *
 * The set: every rope type (and a user table, and a cache without a table),
 * every dtype, both styles, SBHD, BSHD, a padded strided layout and THD,
 * implicit positions, offsets, ids, cu_seqlens and context parallelism,
 * forward and backward, out of place and in place, and the _qk entry points
 * (GQA head counts), in two geometries (a partial rotation with rows that are
 * not a multiple of 16 bytes, and a full rotation long enough for the
 * vectorised paths).  Each digest covers the whole output buffer, so a byte
 * written outside the view shows too, and the call's status.
 *
 * Inputs come from a fixed generator written here (not the test library's),
 * so that what the digest measures cannot move with the test support code.
 *
 *   tests/digest          one line per call, then a line per rope type and ALL
 *   tests/digest -s       only the per-rope-type lines and ALL
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedrope.h"

static uint64_t gen_state;
static uint64_t gen_next(void)
{
    uint64_t z = (gen_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a over n bytes held as values of `size` bytes each, each value's
 * bytes taken least significant first: a big-endian host (s390x) digests
 * the same values to the same number as a little-endian one. */
static uint64_t fnv(uint64_t h, const void *p, size_t n, size_t size)
{
    const unsigned char *b = p;
    const uint16_t one = 1;
    const int big = *(const unsigned char *)&one == 0;
    for (size_t i = 0; i < n; i++) {
        const size_t j = big ? i - i % size + (size - 1 - i % size) : i;
        h = (h ^ b[j]) * 0x100000001b3ull;
    }
    return h;
}
#define FNV0 0xcbf29ce484222325ull

static size_t dsize(fusedrope_dtype dt) { return dt == FUSEDROPE_FLOAT32 ? 4 : 2; }

/* Finite values in about [-2, 2] of the dtype, built from bits (no rounding code). */
static void fill(unsigned char *p, size_t n, fusedrope_dtype dt)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = gen_next();
        if (dt == FUSEDROPE_FLOAT32) {
            uint32_t bits = (uint32_t)((r >> 63) << 31) | (uint32_t)(120 + r % 8) << 23 |
                            (uint32_t)((r >> 8) & 0x7fffff);
            memcpy(p + 4 * i, &bits, 4);
        } else if (dt == FUSEDROPE_FLOAT16) {
            uint16_t bits = (uint16_t)((r >> 63) << 15 | (10 + r % 6) << 10 | ((r >> 8) & 0x3ff));
            memcpy(p + 2 * i, &bits, 2);
        } else {
            uint16_t bits = (uint16_t)((r >> 63) << 15 | (120 + r % 8) << 7 | ((r >> 8) & 0x7f));
            memcpy(p + 2 * i, &bits, 2);
        }
    }
}

enum { LAY_SBHD, LAY_BSHD, LAY_PAD, LAY_THD, LAY_N };
static const char *lay_name[] = {"sbhd", "bshd", "pad", "thd"};
enum { POS_IMPLICIT, POS_OFFSETS, POS_IDS, POS_CP, POS_N };
static const char *pos_name[] = {"implicit", "offsets", "ids", "cp"};
enum { OP_FWD, OP_FWD_INPLACE, OP_BWD, OP_BWD_INPLACE, OP_FWD_QK, OP_BWD_QK, OP_N };
static const char *op_name[] = {"fwd", "fwd-inplace", "bwd", "bwd-inplace", "fwd-qk", "bwd-qk"};

typedef struct {
    unsigned char *p;
    size_t bytes;
    fusedrope_tensor t;
} buf;

/* A view of layout `lay` in a fresh buffer; the padded layout has gaps between
 * heads, batch entries and tokens and starts 3 elements in. */
static buf make(int lay, fusedrope_dtype dt, int64_t s, int64_t b, int64_t h, int64_t d)
{
    buf r;
    int64_t elems, lead = 0;
    if (lay == LAY_THD)
        b = 1;
    if (lay == LAY_PAD) {
        int64_t sh = d + 3, sb = h * sh + 5, ss = b * sb + 7;
        lead = 3;
        elems = lead + ss * s;
        r.bytes = (size_t)elems * dsize(dt);
        r.p = malloc(r.bytes);
        r.t = fusedrope_tensor_sbhd(r.p + lead * dsize(dt), dt, s, b, h, d);
        r.t.stride_head = sh;
        r.t.stride_batch = sb;
        r.t.stride_seq = ss;
    } else {
        elems = s * b * h * d;
        r.bytes = (size_t)elems * dsize(dt);
        r.p = malloc(r.bytes);
        if (lay == LAY_SBHD)
            r.t = fusedrope_tensor_sbhd(r.p, dt, s, b, h, d);
        else if (lay == LAY_BSHD)
            r.t = fusedrope_tensor_bshd(r.p, dt, b, s, h, d);
        else
            r.t = fusedrope_tensor_thd(r.p, dt, s, h, d);
    }
    return r;
}

#define NCACHE 8
static const char *cache_name[NCACHE] = {"default", "linear",  "dynamic", "yarn",
                                         "longrope", "llama3", "table",   "notable"};

static fusedrope_cache *make_cache(int k, int rot_dim)
{
    static double sf[FUSEDROPE_MAX_ROT_DIM / 2], lf[FUSEDROPE_MAX_ROT_DIM / 2];
    fusedrope_cache_config c;
    fusedrope_cache *out = NULL;
    const int64_t rows = 64;
    fusedrope_rope_type type[NCACHE] = {FUSEDROPE_ROPE_DEFAULT,  FUSEDROPE_ROPE_LINEAR,
                                        FUSEDROPE_ROPE_DYNAMIC,  FUSEDROPE_ROPE_YARN,
                                        FUSEDROPE_ROPE_LONGROPE, FUSEDROPE_ROPE_LLAMA3,
                                        FUSEDROPE_ROPE_DEFAULT,  FUSEDROPE_ROPE_DEFAULT};
    if (k == 6) {
        float *tc = malloc(sizeof(float) * rows * rot_dim / 2);
        float *ts = malloc(sizeof(float) * rows * rot_dim / 2);
        for (int64_t i = 0; i < rows * rot_dim / 2; i++) {
            tc[i] = (float)((int64_t)(gen_next() % 2001) - 1000) / 1000.0f;
            ts[i] = (float)((int64_t)(gen_next() % 2001) - 1000) / 1000.0f;
        }
        if (fusedrope_cache_create_from_table(tc, ts, rows, rot_dim, FUSEDROPE_DEVICE_CPU,
                                              &out) != FUSEDROPE_OK)
            out = NULL;
        free(tc);
        free(ts);
        return out;
    }
    fusedrope_cache_config_init(&c, type[k], rot_dim, k == 7 ? 0 : rows, 10000.0);
    switch (type[k]) {
    case FUSEDROPE_ROPE_LINEAR: c.factor = 2.5; break;
    case FUSEDROPE_ROPE_DYNAMIC: c.factor = 2; c.original_max_positions = 16; break;
    case FUSEDROPE_ROPE_YARN: c.factor = 4; c.original_max_positions = 16; break;
    case FUSEDROPE_ROPE_LONGROPE:
        c.original_max_positions = 32;
        for (int i = 0; i < rot_dim / 2; i++) {
            sf[i] = 1.0 + 0.05 * i;
            lf[i] = 1.5 + 0.25 * i;
        }
        c.short_factor = sf;
        c.long_factor = lf;
        break;
    case FUSEDROPE_ROPE_LLAMA3: c.factor = 8; c.original_max_positions = 16; break;
    default: break;
    }
    if (fusedrope_cache_create(&c, FUSEDROPE_DEVICE_CPU, &out) != FUSEDROPE_OK)
        out = NULL;
    return out;
}

int main(int argc, char **argv)
{
    int summary = argc > 1 && strcmp(argv[1], "-s") == 0;
    uint64_t all = FNV0, ncalls = 0;
    static const struct { int64_t s, b, h, hk, d, rot; } geo[2] = {{10, 2, 3, 1, 20, 16},
                                                                    {34, 2, 2, 2, 64, 64}};
    gen_state = 0x5eed;
    for (int k = 0; k < NCACHE; k++) {
        uint64_t per = FNV0;
        for (int g = 0; g < 2; g++) {
            fusedrope_cache *cache = make_cache(k, (int)geo[g].rot);
            if (!cache) {
                fprintf(stderr, "digest: cache %s: %s\n", cache_name[k], fusedrope_last_error());
                return 1;
            }
            for (int dt = 0; dt < 3; dt++)
            for (int st = 0; st < 2; st++)
            for (int lay = 0; lay < LAY_N; lay++)
            for (int pm = 0; pm < POS_N; pm++)
            for (int op = 0; op < OP_N; op++) {
                int64_t s = geo[g].s, b = lay == LAY_THD ? 1 : geo[g].b, h = geo[g].h,
                        hk = geo[g].hk, d = geo[g].d;
                int64_t offsets[4] = {7, 3, 2, 5}, ids[256];
                int32_t cu[3] = {0, 4, (int32_t)s};
                fusedrope_positions pos;
                fusedrope_positions_init(&pos);
                pos.cp_size = 1;
                if (lay == LAY_THD) {
                    pos.cu_seqlens = cu;
                    pos.num_seqs = 2;
                }
                if (pm == POS_OFFSETS)
                    pos.offsets = offsets;
                if (pm == POS_IDS) {
                    for (int64_t i = 0; i < s * b; i++)
                        ids[i] = (int64_t)(gen_next() % 64);
                    pos.ids = ids;
                }
                if (pm == POS_CP) {
                    pos.cp_size = 2;
                    pos.cp_rank = 1;
                }
                fusedrope_dtype dtype = (fusedrope_dtype)dt;
                int inplace = op == OP_FWD_INPLACE || op == OP_BWD_INPLACE;
                int qk = op == OP_FWD_QK || op == OP_BWD_QK;
                buf x = make(lay, dtype, s, b, h, d), y = make(lay, dtype, s, b, h, d);
                buf kx = make(lay, dtype, s, b, hk, d), ky = make(lay, dtype, s, b, hk, d);
                fill(x.p, x.bytes / dsize(dtype), dtype);
                fill(kx.p, kx.bytes / dsize(dtype), dtype);
                memset(y.p, 0x5a, y.bytes);
                memset(ky.p, 0x5a, ky.bytes);
                const fusedrope_tensor *out = inplace ? &x.t : &y.t;
                const fusedrope_positions *pp = (lay != LAY_THD && pm == POS_IMPLICIT) ? NULL : &pos;
                fusedrope_status rc;
                switch (op) {
                case OP_FWD: case OP_FWD_INPLACE:
                    rc = fusedrope_forward(cache, (fusedrope_style)st, pp, &x.t, out, NULL);
                    break;
                case OP_BWD: case OP_BWD_INPLACE:
                    rc = fusedrope_backward(cache, (fusedrope_style)st, pp, &x.t, out, NULL);
                    break;
                case OP_FWD_QK:
                    rc = fusedrope_forward_qk(cache, (fusedrope_style)st, pp, &x.t, &y.t, &kx.t,
                                              &ky.t, NULL);
                    break;
                default:
                    rc = fusedrope_backward_qk(cache, (fusedrope_style)st, pp, &x.t, &y.t, &kx.t,
                                               &ky.t, NULL);
                    break;
                }
                uint64_t hsh = fnv(FNV0, &rc, sizeof rc, sizeof rc);
                hsh = fnv(hsh, inplace ? x.p : y.p, inplace ? x.bytes : y.bytes, dsize(dtype));
                if (qk)
                    hsh = fnv(hsh, ky.p, ky.bytes, dsize(dtype));
                per = fnv(per, &hsh, sizeof hsh, sizeof hsh);
                all = fnv(all, &hsh, sizeof hsh, sizeof hsh);
                ncalls++;
                if (!summary)
                    printf("%s g%d %s %s %s %s %s rc=%d %016llx\n", cache_name[k], g,
                           dtype == FUSEDROPE_FLOAT32 ? "f32" : dtype == FUSEDROPE_FLOAT16 ? "f16" : "bf16",
                           st ? "interleaved" : "neox", lay_name[lay], pos_name[pm], op_name[op],
                           (int)rc, (unsigned long long)hsh);
                free(x.p);
                free(y.p);
                free(kx.p);
                free(ky.p);
            }
            fusedrope_cache_destroy(cache);
        }
        printf("%-8s %016llx\n", cache_name[k], (unsigned long long)per);
    }
    printf("ALL      %016llx (%llu calls)\n", (unsigned long long)all, (unsigned long long)ncalls);
    return 0;
}
