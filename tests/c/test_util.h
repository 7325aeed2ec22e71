/* test_util.h: what every C test shares: a seeded random generator (the seed
 * is printed so a failure can be replayed with FMHA_TEST_SEED), tolerance
 * checks against the float64 reference, and a pass/fail tally. */
#ifndef FMHA_TEST_UTIL_H
#define FMHA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Seed from FMHA_TEST_SEED or the clock; printed once. */
uint64_t tu_seed(void);
uint64_t tu_next(void);                          /* 64 random bits */
double tu_uniform(double lo, double hi);         /* uniform in [lo, hi) */
int64_t tu_int(int64_t lo, int64_t hi);          /* uniform integer in [lo, hi] */
void tu_fill(float *x, size_t n, double lo, double hi);

/* Largest |x - r| / (atol + rtol |r|) over n elements (<= 1 passes); NaN or
 * inf in x where r is finite counts as a failure (returns +inf). */
double tu_worst_ratio(const float *x, const double *r, size_t n, double atol, double rtol);
/* Relative L2 error ||x - r|| / ||r|| (0 when both are zero). */
double tu_rel_l2(const float *x, const double *r, size_t n);

/* Records one check; prints the message on failure. Returns cond. */
int tu_check(int cond, const char *fmt, ...);
/* Prints "N passed, N failed" and returns the process exit status. */
int tu_finish(void);

#endif /* FMHA_TEST_UTIL_H */
