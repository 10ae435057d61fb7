/*
 * axes.c - position axes (multimodal rope): the per-pair map of a cache
 * config.  Pair j of rot_dim/2 takes its position from axis(j) and its
 * frequency from column col(j); the map holds both as (col << 2) | axis,
 * one 32-bit word a pair, which the backends read (fr_pair_axis, fr_pair_col
 * in rope_math.h).  Each layout's rule is written here and nowhere else.
 */
#include <stdlib.h>

#include "internal.h"

static const char *axes_name(fusedrope_axes a)
{
    switch (a) {
    case FUSEDROPE_AXES_NONE: return "NONE";
    case FUSEDROPE_AXES_SECTIONS: return "SECTIONS";
    case FUSEDROPE_AXES_INTERLEAVED: return "INTERLEAVED";
    case FUSEDROPE_AXES_ALTERNATING: return "ALTERNATING";
    case FUSEDROPE_AXES_VISION_2D: return "VISION_2D";
    case FUSEDROPE_AXES_CUSTOM: return "CUSTOM";
    }
    return "?";
}

/* Sections of a preset layout: each >= 0 and their sum the pair count. */
static fusedrope_status check_sections(const fusedrope_cache_config *c, int n)
{
    long sum = 0;
    for (int a = 0; a < FUSEDROPE_MAX_AXES; a++) {
        if (c->sections[a] < 0)
            return fr_fail(FUSEDROPE_ERR_INVALID, "sections[%d] is %d; it must be >= 0", a,
                           c->sections[a]);
        sum += c->sections[a];
    }
    if (sum != n)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "sections {%d, %d, %d, %d} sum to %ld, but axes %s needs rot_dim/2 = %d",
                       c->sections[0], c->sections[1], c->sections[2], c->sections[3], sum,
                       axes_name(c->axes), n);
    return FUSEDROPE_OK;
}

/* The axis of pair j under a preset layout (not CUSTOM), n pairs. */
static int preset_axis(const fusedrope_cache_config *c, int n, int j)
{
    const int *s = c->sections;
    switch (c->axes) {
    case FUSEDROPE_AXES_SECTIONS: {
        int end = 0;
        for (int a = 0; a < FUSEDROPE_MAX_AXES; a++) {
            end += s[a];
            if (j < end)
                return a;
        }
        return FUSEDROPE_MAX_AXES - 1;
    }
    case FUSEDROPE_AXES_INTERLEAVED:
        if (j % 3 == 1 && j < 3 * s[1])
            return 1;
        if (j % 3 == 2 && j < 3 * s[2])
            return 2;
        return 0;
    case FUSEDROPE_AXES_ALTERNATING:
        return j < 2 * s[1] ? 1 + (j & 1) : 0;
    case FUSEDROPE_AXES_VISION_2D:
        return j < n / 2 ? 0 : 1;
    default:
        return 0;
    }
}

fusedrope_status fr_axes_map(const fusedrope_cache_config *c, int32_t **map_out, int *num_axes)
{
    const int n = c->rot_dim / 2;
    int32_t *map;
    int count[FUSEDROPE_MAX_AXES] = { 0, 0, 0, 0 }, axes = 1;

    *map_out = NULL;
    *num_axes = 1;
    if (c->axes == FUSEDROPE_AXES_NONE)
        return FUSEDROPE_OK;
    if ((unsigned)c->axes > FUSEDROPE_AXES_CUSTOM)
        return fr_fail(FUSEDROPE_ERR_INVALID, "config->axes is %d, not a fusedrope_axes",
                       (int)c->axes);
    if (c->axes == FUSEDROPE_AXES_SECTIONS || c->axes == FUSEDROPE_AXES_INTERLEAVED ||
        c->axes == FUSEDROPE_AXES_ALTERNATING)
        TRY(check_sections(c, n));
    if (c->axes == FUSEDROPE_AXES_INTERLEAVED && c->sections[3] != 0)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "sections[3] is %d; axes INTERLEAVED has three axes", c->sections[3]);
    if (c->axes == FUSEDROPE_AXES_ALTERNATING &&
        (c->sections[1] != c->sections[2] || c->sections[3] != 0))
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "sections {%d, %d, %d, %d}: axes ALTERNATING needs sections[1] == "
                       "sections[2] and sections[3] == 0",
                       c->sections[0], c->sections[1], c->sections[2], c->sections[3]);
    if (c->axes == FUSEDROPE_AXES_VISION_2D && n % 2)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "rot_dim is %d; axes VISION_2D splits the pairs in two halves, so "
                       "rot_dim must be a multiple of 4", c->rot_dim);
    if (c->axes == FUSEDROPE_AXES_CUSTOM && !c->pair_axis)
        return fr_fail(FUSEDROPE_ERR_INVALID, "pair_axis is NULL; axes CUSTOM needs it");

    map = malloc((size_t)n * sizeof *map);
    if (!map)
        return fr_fail(FUSEDROPE_ERR_NOMEM, "cannot allocate the axes map of %d pairs", n);
    for (int j = 0; j < n; j++) {
        int axis, col;
        if (c->axes == FUSEDROPE_AXES_CUSTOM) {
            axis = c->pair_axis[j];
            col = c->pair_col ? c->pair_col[j] : j;
        } else {
            axis = preset_axis(c, n, j);
            col = c->axes == FUSEDROPE_AXES_VISION_2D ? j % (n / 2) : j;
        }
        if (axis >= FUSEDROPE_MAX_AXES || col < 0 || col >= n) {
            free(map);
            return axis >= FUSEDROPE_MAX_AXES
                       ? fr_fail(FUSEDROPE_ERR_INVALID,
                                 "pair_axis[%d] is %d; it must be < FUSEDROPE_MAX_AXES (%d)", j,
                                 axis, FUSEDROPE_MAX_AXES)
                       : fr_fail(FUSEDROPE_ERR_INVALID,
                                 "pair_col[%d] is %d; it must be in [0, rot_dim/2 = %d)", j, col,
                                 n);
        }
        map[j] = (int32_t)((uint32_t)col << 2 | (uint32_t)axis);
        count[axis]++;
        if (axis + 1 > axes)
            axes = axis + 1;
    }
    /* the preset layouts must give each axis exactly its section */
    if (c->axes != FUSEDROPE_AXES_CUSTOM && c->axes != FUSEDROPE_AXES_VISION_2D)
        for (int a = 0; a < FUSEDROPE_MAX_AXES; a++)
            if (count[a] != c->sections[a]) {
                free(map);
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "sections {%d, %d, %d, %d} do not fit axes %s over %d pairs: axis "
                               "%d gets %d pairs, not %d",
                               c->sections[0], c->sections[1], c->sections[2], c->sections[3],
                               axes_name(c->axes), n, a, count[a], c->sections[a]);
            }
    if (c->axes == FUSEDROPE_AXES_SECTIONS || c->axes == FUSEDROPE_AXES_INTERLEAVED ||
        c->axes == FUSEDROPE_AXES_ALTERNATING)
        axes = c->sections[3] ? 4 : 3;
    *map_out = map;
    *num_axes = axes;
    return FUSEDROPE_OK;
}
