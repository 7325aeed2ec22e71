/* tuning.h: parameters a kernel table runs with that are chosen per
 * microarchitecture, not per ISA: the float32 tile variant, keys per tile,
 * whether K is copied, the AUTO strategy's dense crossover, the decode
 * driver's split and prefetch, the matrix driver's schedule. One ISA can
 * carry several tunings; at first use the registry (cpu.c) gives each
 * composed table the first tuning found, in this order:
 *   1. FMHA_TUNING (its fields over the tuning found below; source env)
 *   2. the wisdom file FMHA_WISDOM names (wisdom.c)
 *   3. the per-user wisdom file (fmha_wisdom_user_path)
 *   4. the entries compiled in for CPUs the project measured (cpu_<arch>.c)
 *   5. the cache-size heuristic (fmha_tuning_heuristic)
 *   6. generic
 * so tuning for one core cannot slow another. Internal. */
#ifndef FMHA_TUNING_H
#define FMHA_TUNING_H

#include <stddef.h>
#include <stdint.h>

/* Where a table's tuning came from (fmha_plan_describe's tuning_source). */
typedef enum fmha_tuning_source {
    FMHA_TUNING_GENERIC = 0,
    FMHA_TUNING_HEURISTIC,
    FMHA_TUNING_BUILTIN,
    FMHA_TUNING_WISDOM,
    FMHA_TUNING_ENV,
} fmha_tuning_source;

/* "generic", "heuristic", "builtin", "wisdom", "env" */
const char *fmha_tuning_source_name(fmha_tuning_source s);

typedef struct fmha_tuning {
    const char *name;         /* "generic", "zen4", ...; fmha_plan_describe prints it */
    fmha_tuning_source source;
    /* float32 plans run on the registered variant of the table's float32
     * tiles with this MR x NR (e.g. 12 x 32: the table avx512_12x32); 0 or
     * a shape no variant has: the table's own tiles */
    int64_t tile_mr, tile_nr;
    int64_t block_kv;         /* keys per tile (tiled forward, backward, masks); 0: the table's */
    /* the float32 tiled forward reads K from a copy made once per call
     * (rows contiguous) when one head's K holds at least this many bytes;
     * 0: K in place */
    int64_t k_copy_bytes;
    int64_t dense_max_scores; /* AUTO runs dense up to Sq * Skv this large; 0: the library's default */
    int64_t decode_prefetch_bytes; /* the decode driver prefetches when a call's K and V hold more
                                    * bytes than this; 0: the library's default */
    int64_t decode_split_keys; /* the decode driver's splits hold at least this many keys; 0: its default */
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

/* A field of fmha_tuning as FMHA_TUNING and wisdom files name it: its
 * key, its place and the values it takes (lo..hi, a multiple of
 * `multiple`). */
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
/* The field named by key[0..len), or NULL. */
const fmha_tuning_field *fmha_tuning_field_named(const char *key, size_t len);

/* A tuning of an architecture: the ISA it applies to and the CPUs it was
 * measured on (vendor string as cpuid spells it, family, models lo..hi). */
typedef struct fmha_arch_tuning {
    const char *isa;
    const char *vendor;
    unsigned family, model_lo, model_hi;
    fmha_tuning tuning;
} fmha_arch_tuning;

/* The tunings every ISA runs when nothing else is found. */
extern const fmha_tuning fmha_tuning_generic;

/* This CPU's caches (bytes; 0 where unknown), read once: cpuid on x86,
 * /sys/devices/system/cpu/cpu0/cache on Linux elsewhere (cpu_<arch>.c). */
typedef struct fmha_cache_sizes {
    int64_t l1d, l2;
} fmha_cache_sizes;
void fmha_arch_cache_sizes(fmha_cache_sizes *c);

/* The cache-size heuristic: 1 and *out filled (over generic) when the
 * cache sizes are known, else 0. */
int fmha_tuning_heuristic(const fmha_cache_sizes *c, fmha_tuning *out);

/* The tuning for `isa` on this CPU before FMHA_TUNING: wisdom (FMHA_WISDOM's
 * file, then the per-user one), the architecture's first matching entry,
 * the heuristic, else generic; the result's name points at static storage
 * or at `name` (name_size bytes). */
void fmha_tuning_lookup(const char *isa, fmha_tuning *out, char *name, size_t name_size);

/* Applies FMHA_TUNING's text to a copy of `base`: "generic" gives
 * fmha_tuning_generic; otherwise comma-separated key=value pairs of
 * fmha_tuning_fields (tile_mr=N, tile_nr=N, a multiple of 16 up to 64;
 * block_kv=N, a multiple of 32 in 32..1024; k_copy_bytes=N >= 0;
 * dense_max_scores=N >= 0; decode_prefetch_bytes=N >= 0;
 * decode_split_keys=N, 0 or a multiple of 128; matrix_block_kv=N, 0 or a
 * multiple of 32 in 32..512; matrix_rescale_log2=N in 0..16;
 * matrix_overlap=0|1; matrix_decode_rows=N >= 0) replace those fields.
 * Returns 0, or -1 (nothing applied) on an unknown key or a value out of
 * range. `name` receives the tuning's new name; the source becomes env. */
int fmha_tuning_parse(const char *text, const fmha_tuning *base, fmha_tuning *out, char *name, size_t name_size);

/* The status line fmha_tuning_status() returns (fmha.h): set by the
 * registry's first use and by fmha_tune. */
void fmha_tuning_set_status(const char *line);

#endif /* FMHA_TUNING_H */
