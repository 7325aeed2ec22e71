/* strided.h: the reach of a strided tensor and whether its elements are
 * distinct (strided.c). Internal. */
#ifndef FMHA_STRIDED_H
#define FMHA_STRIDED_H

#include <stdint.h>

/* Largest element offset of a tensor of extents ext and strides st (>= 0),
 * or -1 past 2^60; 1 when no two of its elements share an offset. */
int64_t fmha_strided_span(const int64_t ext[4], const int64_t st[4]);
int fmha_strided_injective(const int64_t ext[4], const int64_t st[4]);

#endif /* FMHA_STRIDED_H */
