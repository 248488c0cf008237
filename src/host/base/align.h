/*
 * align.h - rounding sizes and offsets up to a multiple (internal; host code).
 */
#ifndef MACO_ALIGN_H
#define MACO_ALIGN_H

#include <stddef.h>

/** `v` rounded up to a multiple of `a` (a > 0; the caller keeps v + a - 1 within size_t). */
static inline size_t maco__align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

#endif /* MACO_ALIGN_H */
