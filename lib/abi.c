/*
 * abi.c - the public structs that may grow (fusedrope_cache_config,
 * fusedrope_positions).  Each starts with struct_size, the sizeof of the
 * caller's header, set by its _init function.  The library reads exactly
 * that many bytes, never more: a caller built against an older header gets
 * the newer fields' zero defaults, one built against a newer header is
 * accepted when the fields this library does not know are all zero.
 */
#include <string.h>

#include "internal.h"

fusedrope_status fr_struct_take(void *dst, size_t dst_size, const void *src,
                                const size_t *layouts, int nlayouts, const char *name)
{
    size_t size;
    int known = 0;

    memcpy(&size, src, sizeof size);
    if (size == 0)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s->struct_size is 0: initialise the struct with its _init function "
                       "(see STABILITY in fusedrope(3))", name);
    for (int i = 0; i < nlayouts; i++)
        known |= size == layouts[i];
    if (size > dst_size) {
        /* Built against a newer header: fine while it uses nothing newer. */
        const unsigned char *tail = (const unsigned char *)src + dst_size;
        for (size_t i = 0; i < size - dst_size; i++)
            if (tail[i])
                return fr_fail(FUSEDROPE_ERR_INVALID,
                               "%s->struct_size is %zu, larger than this library's %zu, and "
                               "byte %zu past it is set: the caller uses a field this version "
                               "of the library does not have", name, size, dst_size,
                               dst_size + i);
        known = 1;
        size = dst_size;
    }
    if (!known)
        return fr_fail(FUSEDROPE_ERR_INVALID,
                       "%s->struct_size is %zu, which is no published layout of the struct "
                       "(this library's is %zu): initialise it with its _init function",
                       name, size, dst_size);
    memset(dst, 0, dst_size);
    memcpy(dst, src, size);
    return FUSEDROPE_OK;
}

void fr_struct_give(void *dst, size_t dst_size, const void *full, size_t full_size)
{
    if (!dst)
        return;
    if (dst_size <= full_size) {
        memcpy(dst, full, dst_size);
    } else {
        memcpy(dst, full, full_size);
        memset((unsigned char *)dst + full_size, 0, dst_size - full_size);
    }
    if (dst_size >= sizeof(size_t))
        memcpy(dst, &dst_size, sizeof dst_size);
}

void fusedrope_positions_init_sized(fusedrope_positions *pos, size_t struct_size)
{
    fusedrope_positions p;
    memset(&p, 0, sizeof p);
    fr_struct_give(pos, struct_size, &p, sizeof p);
}
