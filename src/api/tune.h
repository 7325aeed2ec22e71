/* tune.h: fmha_tune's internal entry (tune.c), for the tests: the same
 * measuring and the same wisdom file on problems whose sequence lengths
 * are divided by `shrink` (at least 16 keys), so that a test runs the whole
 * planner in about a second. fmha_tune is fmha_tune_shrunk(..., 1).
 * Internal. */
#ifndef FMHA_TUNE_H
#define FMHA_TUNE_H

#include <stdint.h>

#include "fmha.h"

fmha_status fmha_tune_shrunk(const char *path, double budget_s, fmha_tune_progress_fn progress, void *user,
                             int64_t shrink);

#endif /* FMHA_TUNE_H */
