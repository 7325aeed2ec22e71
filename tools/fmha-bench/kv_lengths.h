/* kv_lengths.h: fmha-bench's generator (splitmix64) and its draw of
 * uneven decode lengths (--kv-lengths uniform:F), header-only so that
 * tools/ggml-batch times ggml on exactly the lengths fmha-bench's rows
 * use. */
#ifndef FMHA_BENCH_KV_LENGTHS_H
#define FMHA_BENCH_KV_LENGTHS_H

#include <math.h>
#include <stdint.h>

/* The seed of fmha-bench's inputs; the lengths draw from their own. */
#define BENCH_INPUT_SEED 0x5eed5eedULL
#define BENCH_LENGTHS_SEED (BENCH_INPUT_SEED ^ 0x1e9617ULL)

static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The length of sequence b, drawn in order b = 0, 1, .. from *state (set
 * to BENCH_LENGTHS_SEED first): sequence 0 holds seq keys, each other one
 * a length uniform in [ceil(frac seq), seq]; frac <= 0: seq. The same
 * every run. */
static inline int64_t bench_kv_length(uint64_t *state, int64_t b, int64_t seq, double frac)
{
    if (frac <= 0 || b == 0) return seq;
    const int64_t lo = (int64_t)ceil(frac * (double)seq);
    return lo + (int64_t)(splitmix64(state) % (uint64_t)(seq - lo + 1));
}

#endif /* FMHA_BENCH_KV_LENGTHS_H */
