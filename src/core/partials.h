/* partials.h: the one rule by which results over disjoint key sets
 * combine (fmha.h, "merging partial results"): fmha_merge and every
 * split-KV merge (the decode driver's, matrix_decode's) follow it, so a
 * NaN or inf reaches a row the same way whichever path split its keys.
 *   - a partial that saw no key (max -inf) adds nothing; its O is not read
 *   - a NaN max (a NaN or +inf score it saw) makes the row's max NaN, so
 *     its O and lse come out NaN
 *   - every other partial is weighted by exp(m - max), also when that
 *     weight underflows to 0: a NaN or inf in its O still reaches O */
#ifndef FMHA_PARTIALS_H
#define FMHA_PARTIALS_H
#include <math.h>

/* The running max over partials' maxima: NaN once any is NaN. */
static inline float fmha_partials_max(float acc, float m) { return isnan(acc) || isnan(m) ? NAN : fmaxf(acc, m); }

/* 1 when a partial of max m takes part in the merge (it saw a key). */
static inline int fmha_partial_counts(double m) { return m != -INFINITY; }

#endif /* FMHA_PARTIALS_H */
