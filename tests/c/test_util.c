/* test_util.c: seeded randomness, tolerance checks and the tally shared by
 * the C tests (see test_util.h). */
#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t tu_state;
static int tu_seeded;
static int tu_passed, tu_failed;

uint64_t tu_seed(void) {
    if (!tu_seeded) {
        const char *env = getenv("FMHA_TEST_SEED");
        tu_state = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
        printf("seed: FMHA_TEST_SEED=%llu\n", (unsigned long long)tu_state);
        fflush(stdout);
        tu_seeded = 1;
    }
    return tu_state;
}

uint64_t tu_next(void) { /* splitmix64 */
    tu_seed();
    uint64_t z = (tu_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(tu_next() >> 11) * 0x1.0p-53);
}

int64_t tu_int(int64_t lo, int64_t hi) { return lo + (int64_t)(tu_next() % (uint64_t)(hi - lo + 1)); }

void tu_fill(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)tu_uniform(lo, hi);
}

double tu_worst_ratio(const float *x, const double *r, size_t n, double atol, double rtol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(r[i]) ? !isnan(x[i]) : (isinf(r[i]) ? x[i] != r[i] : !isfinite(x[i])))
            return INFINITY;
        if (!isfinite(r[i])) continue;
        double ratio = fabs((double)x[i] - r[i]) / (atol + rtol * fabs(r[i]));
        if (ratio > worst) worst = ratio;
    }
    return worst;
}

double tu_rel_l2(const float *x, const double *r, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(r[i])) continue;
        double d = (double)x[i] - r[i];
        num += d * d;
        den += r[i] * r[i];
    }
    return den == 0.0 ? sqrt(num) : sqrt(num / den);
}

int tu_check(int cond, const char *fmt, ...) {
    if (cond) {
        tu_passed++;
    } else {
        tu_failed++;
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL: ");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        fflush(stdout);
    }
    return cond;
}

int tu_finish(void) {
    printf("%d passed, %d failed\n", tu_passed, tu_failed);
    return tu_failed ? 1 : 0;
}
