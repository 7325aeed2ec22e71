/* tuning.h: the parameters a kernel table runs with that are chosen per
 * microarchitecture, not per ISA: the float32 tile shape, keys per tile,
 * whether K is copied, the AUTO strategy's dense crossover, the decode
 * driver's split and prefetch, the matrix driver's schedule.
 *
 * Each field is defined once, in FMHA_TUNING_FIELDS: its key, its default,
 * its range and the values fmha_tune tries. Every source of a tuning
 * (FMHA_TUNING, a wisdom file, a compiled-in entry, the cache heuristic)
 * is key=value text that fmha_tuning_apply checks and applies over the
 * defaults, so a tuning in use has every field set. Adding a field is one
 * row below and its consumer. Which source a table takes is the config
 * layer's business (config.c). This file depends on nothing. Internal. */
#ifndef FMHA_TUNING_H
#define FMHA_TUNING_H

#include <stddef.h>
#include <stdint.h>

/* A default taken from the composed kernel table (its own tile shape and
 * keys per tile) when the config layer resolves a tuning for it. */
#define FMHA_TUNING_OF_TABLE (-1)

/* Which problems fmha_tune times a field on (tune.c): float32 tiled rows,
 * every tiled row (float32 only where a matrix engine takes bf16), bf16
 * rows on a matrix engine (tuned only where the table has one), the dense
 * crossover's rows, decode rows (a bf16 cache), decode rows of a float32
 * cache, decode rows of a quantized cache (q8_0), decode rows of 16 rows a
 * kv head (4 positions, GQA 4), a float32 forward + backward at BF16X3
 * and a bf16 one at ACCURATE (both tuned only where the table has a
 * matrix backward); NONE: not tuned
 * field by field. */
typedef enum fmha_tune_rows {
    FMHA_TUNE_NONE,
    FMHA_TUNE_F32,
    FMHA_TUNE_TILED,
    FMHA_TUNE_MATRIX,
    FMHA_TUNE_DENSE,
    FMHA_TUNE_DECODE,
    FMHA_TUNE_DECODE_F32,
    FMHA_TUNE_DECODE_QUANT,
    FMHA_TUNE_DECODE_ROWS,
    FMHA_TUNE_MATRIX_BWD,
    FMHA_TUNE_MATRIX_BWD_BF16
} fmha_tune_rows;

/* X(key, default, lo, hi, multiple, rows, candidates): every field, in
 * order. Values lie in lo..hi and are multiples of `multiple`; candidates
 * (parenthesised) are what fmha_tune tries against the incumbent.
 *   tile_mr, tile_nr   float32 plans run on the table's float32 tile of
 *                      this MR x NR (the table's own, or another shape its
 *                      tile part lists: avx512's 12 x 32, 14 x 32)
 *   block_kv           keys per tile (tiled forward, backward, masks)
 *   k_copy_bytes       the float32 tiled forward reads K from a copy made
 *                      once per call when one head's K holds at least this
 *                      many bytes; 0: never
 *   dense_max_scores   AUTO runs dense up to Sq * Skv this large (plan.c)
 *   decode_prefetch_bytes  the decode driver prefetches when a call's K
 *                      and V hold more bytes than this (decode.c), unless
 *                      both are float32 or both 2-byte caches (tuned on
 *                      a q8_0 step past the caches: on or never):
 *   decode_prefetch_f32_bytes  the same for float32 K and V, whose rows a
 *                      CPU's hardware prefetchers may follow on their own
 *                      (design.md, "Decode")
 *   decode_prefetch_h16_bytes  the same for bf16 or f16 K and V
 *   decode_prefetch_ahead_bytes  how far a decode task's prefetch runs
 *                      ahead of its reads, in bytes of K and V over a
 *                      unit's heads (decode.c, dec_prefetch_stream)
 *   decode_split_keys  the decode driver's chunks hold at least this many
 *                      keys (decode.c)
 *   decode_split_keys_16rows  the same where a unit serves 16 rows or more
 *                      (a step of several positions: a task's fixed cost,
 *                      its partial O and query, grows with its rows)
 *   matrix_block_kv    keys per step of the matrix driver's forward
 *   matrix_rescale_log2  its lazy rescale: a row's reference maximum moves
 *                      only when the scores pass it by more (log2 units):
 *                      P stays <= 256, far inside bf16's range
 *   matrix_overlap     1: the next key block's Q K^T issued before this
 *                      block's softmax (design.md, "The matrix driver")
 *   matrix_decode_rows decoding runs on the matrix driver when a kv head's
 *                      query rows (group x Sq) reach this many
 *   matrix_backward_split  1: float16 and float32 (BF16X3, BF16) backwards
 *                      on the tiles (matrix_bwd.c); 0: on the float32 FMA
 *                      path (bf16 at FAST takes the tiles either way)
 *   matrix_backward_accurate  1: the bf16 ACCURATE backward on the tiles (P
 *                      and dS with their bf16 residuals); 0: on the
 *                      float32 FMA path */
#define FMHA_TUNING_FIELDS(X)                                                                                 \
    X(tile_mr, FMHA_TUNING_OF_TABLE, 1, 16, 1, FMHA_TUNE_NONE, ())                                            \
    X(tile_nr, FMHA_TUNING_OF_TABLE, 16, 64, 16, FMHA_TUNE_NONE, ())                                          \
    X(block_kv, FMHA_TUNING_OF_TABLE, 32, 1024, 32, FMHA_TUNE_TILED, (64, 192, 256))                          \
    X(k_copy_bytes, 0, 0, (int64_t)1 << 40, 1, FMHA_TUNE_F32, (1, 192 << 10, 768 << 10))                      \
    X(dense_max_scores, 96 * 96, 0, (int64_t)1 << 40, 1, FMHA_TUNE_DENSE, (1, 128 * 128, 192 * 192))          \
    X(decode_prefetch_bytes, 8 << 20, 0, (int64_t)1 << 50, 1, FMHA_TUNE_DECODE_QUANT, ((int64_t)1 << 50))      \
    X(decode_prefetch_f32_bytes, 8 << 20, 0, (int64_t)1 << 50, 1, FMHA_TUNE_DECODE_F32, ((int64_t)1 << 50))     \
    X(decode_prefetch_h16_bytes, 8 << 20, 0, (int64_t)1 << 50, 1, FMHA_TUNE_DECODE, ((int64_t)1 << 50, 4 << 20)) \
    X(decode_prefetch_ahead_bytes, 64 << 10, 0, 64 << 20, 1, FMHA_TUNE_NONE, ())                             \
    X(decode_split_keys, 256, 128, (int64_t)1 << 20, 128, FMHA_TUNE_DECODE, (1024, 4096))                     \
    X(decode_split_keys_16rows, 256, 128, (int64_t)1 << 20, 128, FMHA_TUNE_DECODE_ROWS, (1024, 4096))         \
    X(matrix_block_kv, 128, 32, 512, 32, FMHA_TUNE_MATRIX, (64, 256))                                         \
    X(matrix_rescale_log2, 8, 0, 16, 1, FMHA_TUNE_MATRIX, (0))                                                \
    X(matrix_overlap, 1, 0, 1, 1, FMHA_TUNE_MATRIX, (0))                                                      \
    X(matrix_decode_rows, 8, 1, (int64_t)1 << 20, 1, FMHA_TUNE_NONE, ())                                     \
    X(matrix_backward_split, 1, 0, 1, 1, FMHA_TUNE_MATRIX_BWD, (0))                                            \
    X(matrix_backward_accurate, 1, 0, 1, 1, FMHA_TUNE_MATRIX_BWD_BF16, (0))

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
#define FMHA_TUNING_MEMBER(key, ...) int64_t key;
    FMHA_TUNING_FIELDS(FMHA_TUNING_MEMBER)
#undef FMHA_TUNING_MEMBER
} fmha_tuning;

/* A field of fmha_tuning: its key, place, default, range and fmha_tune's
 * candidates (n_candidates of them). */
typedef struct fmha_tuning_field {
    const char *key;
    size_t offset;
    int64_t dflt, lo, hi, multiple;
    fmha_tune_rows rows;
    const int64_t *candidates;
    size_t n_candidates;
} fmha_tuning_field;

/* Every field, in fmha_tuning's order; *n receives their count. */
const fmha_tuning_field *fmha_tuning_fields(size_t *n);
static inline int64_t *fmha_tuning_at(fmha_tuning *t, const fmha_tuning_field *f) {
    return (int64_t *)((char *)t + f->offset);
}
static inline int64_t fmha_tuning_get(const fmha_tuning *t, const fmha_tuning_field *f) {
    return *(const int64_t *)((const char *)t + f->offset);
}
/* The field named by key[0..len), or NULL. */
const fmha_tuning_field *fmha_tuning_field_named(const char *key, size_t len);

/* Every field at its default (FMHA_TUNING_OF_TABLE where the table's),
 * named "generic", source generic. */
extern const fmha_tuning fmha_tuning_generic;

/* The one check of every source: applies text, comma-separated key=value
 * pairs of fmha_tuning_fields (decimal values in range), over *t; ""
 * applies nothing and "generic" sets every field to its default. Name and
 * source are the caller's. Returns 0, or -1 with *t unchanged and the
 * reason (naming the pair) in err. */
int fmha_tuning_apply(const char *text, fmha_tuning *t, char *err, size_t err_size);

/* t's fields that differ from `base`, as key=value text (written by
 * fmha_tune into wisdom, shown in fmha_tuning_status). */
void fmha_tuning_text(const fmha_tuning *t, const fmha_tuning *base, char *buf, size_t size);

#endif /* FMHA_TUNING_H */
