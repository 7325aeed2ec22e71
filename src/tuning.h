/* tuning.h: parameters a kernel table runs with that are chosen per
 * microarchitecture, not per ISA: keys per tile, the AUTO strategy's dense
 * crossover, the decode prefetch threshold, the matrix driver's schedule. One ISA can carry several tunings; the registry (cpu.c) picks
 * one by the CPU's vendor, family and model (cpu_<arch>.c) and applies it
 * to the composed table, so tuning for one core cannot slow another.
 * FMHA_TUNING overrides the choice (fmha.h). Internal. */
#ifndef FMHA_TUNING_H
#define FMHA_TUNING_H

#include <stddef.h>
#include <stdint.h>

typedef struct fmha_tuning {
    const char *name;         /* "generic", "zen4", ...; fmha_plan_describe prints it */
    int64_t block_kv;         /* keys per tile (tiled forward, backward, masks); 0: the table's */
    int64_t dense_max_scores; /* AUTO runs dense up to Sq * Skv this large; 0: the library's default */
    int64_t decode_prefetch_bytes; /* the decode driver prefetches when a call's K and V hold more
                                    * bytes than this; 0: the library's default */
    /* The matrix driver (AMX tiles, driver/matrix.c): keys per step of its
     * forward (a multiple of 32; 0: its default), the lazy-rescale threshold
     * in log2 units (a row's reference maximum moves only when the scores
     * pass it by more; 0: whenever they do), and 1 to issue the next key
     * block's Q K^T before this block's softmax. */
    int64_t matrix_block_kv;
    int64_t matrix_rescale_log2;
    int64_t matrix_overlap;
    /* Decoding runs on the matrix driver when a KV head's query rows
     * (group * Sq) reach this many; 0: the default, 8. */
    int64_t matrix_decode_rows;
} fmha_tuning;

/* A field of fmha_tuning as FMHA_TUNING (and wisdom) names it: its key, its
 * place and the values it takes (lo..hi, a multiple of `multiple`). */
typedef struct fmha_tuning_field {
    const char *key;
    size_t offset;
    int64_t lo, hi, multiple;
} fmha_tuning_field;

/* Every field, in fmha_tuning's order; *n receives their count. */
const fmha_tuning_field *fmha_tuning_fields(size_t *n);
static inline int64_t *fmha_tuning_at(fmha_tuning *t, const fmha_tuning_field *f) {
    return (int64_t *)((char *)t + f->offset);
}

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
 * fmha_tuning_generic; otherwise comma-separated key=value pairs of
 * fmha_tuning_fields (block_kv=N, a multiple of 32 in 32..1024;
 * dense_max_scores=N >= 0; decode_prefetch_bytes=N >= 0;
 * matrix_block_kv=N, 0 or a multiple of 32 in 32..512;
 * matrix_rescale_log2=N in 0..16; matrix_overlap=0|1;
 * matrix_decode_rows=N >= 0) replace those
 * fields. Returns 0, or -1 (nothing applied) on an unknown key or a value
 * out of range. `name` receives the tuning's new name. */
int fmha_tuning_parse(const char *text, const fmha_tuning *base, fmha_tuning *out, char *name, size_t name_size);

#endif /* FMHA_TUNING_H */
