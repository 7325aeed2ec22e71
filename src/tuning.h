/* tuning.h: parameters a kernel table runs with that are chosen per
 * microarchitecture, not per ISA: keys per tile, the AUTO strategy's dense
 * crossover. One ISA can carry several tunings; the registry (cpu.c) picks
 * one by the CPU's vendor, family and model (cpu_<arch>.c) and applies it
 * to the composed table, so tuning for one core cannot slow another.
 * FMHA_TUNING overrides the choice (fmha.h). Internal. */
#ifndef FMHA_TUNING_H
#define FMHA_TUNING_H

#include <stddef.h>
#include <stdint.h>

typedef struct fmha_tuning {
    const char *name;         /* "generic", "zen4", ...; fmha_plan_describe prints it */
    size_t block_kv;          /* keys per tile (tiled forward, backward, masks); 0: the table's */
    int64_t dense_max_scores; /* AUTO runs dense up to Sq * Skv this large; 0: the library's default */
    int64_t decode_prefetch_bytes; /* the decode driver prefetches when a call's K and V hold more
                                    * bytes than this; 0: the library's default */
} fmha_tuning;

/* A tuning of an architecture: the ISA it applies to and the CPUs it was
 * measured on (vendor string as cpuid spells it, family, models lo..hi). */
typedef struct fmha_arch_tuning {
    const char *isa;
    const char *vendor;
    unsigned family, model_lo, model_hi;
    fmha_tuning tuning;
} fmha_arch_tuning;

/* The tunings every ISA runs when no entry matches this CPU. */
extern const fmha_tuning fmha_tuning_generic;

/* The tuning for `isa` on this CPU: the architecture's first matching
 * entry, else fmha_tuning_generic. */
const fmha_tuning *fmha_arch_tuning_for(const char *isa);

/* Applies FMHA_TUNING's text to a copy of `base`: "generic" gives
 * fmha_tuning_generic; otherwise comma-separated key=value pairs
 * (block_kv=N, a multiple of 32 in 32..1024; dense_max_scores=N >= 0;
 * decode_prefetch_bytes=N >= 0)
 * replace those fields. Returns 0, or -1 (nothing applied) on an unknown
 * key or a value out of range. `name` receives the tuning's new name. */
int fmha_tuning_parse(const char *text, const fmha_tuning *base, fmha_tuning *out, char *name, size_t name_size);

#endif /* FMHA_TUNING_H */
