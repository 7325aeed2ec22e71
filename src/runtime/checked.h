/* checked.h: arithmetic on caller-supplied int64 values (windows, offsets,
 * lengths, strides, page counts, bucket distances) that cannot overflow.
 * The rule (docs/design.md, "Overflow"): every sum or product of such values
 * goes through these or a __builtin_*_overflow check; the sanitizer build
 * (UBSan, no recovery) fails the tests on any signed overflow left. */
#ifndef FMHA_CHECKED_H
#define FMHA_CHECKED_H

#include <stdint.h>

/* a + b, saturated to [INT64_MIN, INT64_MAX]. */
static inline int64_t fmha_sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (!__builtin_add_overflow(a, b, &r)) return r;
    return a < 0 ? INT64_MIN : INT64_MAX;
}

/* a * b, saturated to [INT64_MIN, INT64_MAX]. */
static inline int64_t fmha_sat_mul(int64_t a, int64_t b) {
    int64_t r;
    if (!__builtin_mul_overflow(a, b, &r)) return r;
    return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
}

#endif /* FMHA_CHECKED_H */
