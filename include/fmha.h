/* fmha.h: the public interface of fmha, fused multi-head attention on CPUs.
 *
 * Computes exact attention, O = softmax(scale * Q K^T (+ mask)) V, and its
 * gradients, in memory that grows linearly with the sequence length (the
 * `tiled` strategy). This is the only header a user includes.
 *
 * Conventions used throughout:
 *   B  = batch, Hq = query heads, Hkv = key/value heads (Hq % Hkv == 0; query
 *   head h reads key/value head h / (Hq / Hkv): MHA, GQA and MQA),
 *   Sq = query length, Skv = key/value length, D = head dim of Q and K,
 *   Dv = head dim of V and O.
 *   Q  [B, Sq,  Hq,  D ]   K [B, Skv, Hkv, D ]   V [B, Skv, Hkv, Dv]
 *   O  [B, Sq,  Hq,  Dv]   lse [B, Hq, Sq] (float32, contiguous)
 *   Every tensor is addressed through four element strides in the order
 *   [batch, seq, head, dim], so [B, S, H, D] and [B, H, S, D] layouts (and any
 *   other permutation or padding) work without copies. Strides are counted in
 *   elements, not bytes, and must be >= 0; an input stride of 0 broadcasts.
 *   Pointers need only the alignment of their element type.
 *
 * Causal masking (fmha_causal):
 *   FMHA_CAUSAL_TOP_LEFT     query i sees key j iff j <= i
 *                            (PyTorch is_causal, jax.nn.dot_product_attention)
 *   FMHA_CAUSAL_BOTTOM_RIGHT query i of batch element b sees key j iff
 *                            j <= i + (kv_len[b] - q_len[b])
 *                            (FlashAttention >= 2.1 and its cache_seqlens; the
 *                            last query of each sequence sees every key of it,
 *                            as in decoding with a KV cache). kv_len[b] is
 *                            masks.kv_lengths[b], or Skv when kv_lengths is
 *                            NULL; q_len[b] is masks.q_lengths[b], or Sq when
 *                            q_lengths is NULL. Without length arrays this is
 *                            j <= i + (Skv - Sq).
 *   When q_len[b] > kv_len[b] with bottom-right alignment the first
 *   q_len[b] - kv_len[b] queries of b see no key at all.
 *
 * Fully masked rows: a query that sees no key gets O = 0 and lse = -inf (its
 * head's sink with attention sinks, see fmha_problem.sinks), and contributes
 * zero to every gradient. No NaN is ever produced by masking.
 *
 * Huge finite scores: lse is one float32, so where a row's largest score is
 * large in magnitude its log-sum part keeps only ulp(lse) of precision
 * (2^-6 at 2^17, 64 at 1e9), and the backward's P = exp(s - lse) errs by up
 * to that much in the exponent. A row that a finite bias pushes down on
 * every key it sees (an additive mask of -1e9 or -FLT_MAX everywhere) gets
 * the right O and lse from the forward (P uniform over its keys) but P = 1
 * per key in the backward: its gradients are S times too large (S its keys).
 * Hide keys with a mask (fmha_masks, a boolean mask, or a bias of -inf):
 * the scores a row sees then stay finite and small, and a row that sees no
 * key is a fully masked row (above).
 *
 * NaN and infinity follow IEEE arithmetic, the same on every instruction set
 * and strategy: a NaN score a row can see (from Q, K, a bias) makes that
 * row's O and lse NaN; a NaN in V makes the O columns it reaches NaN (every
 * row that sees its key, even where that key's P underflows to 0: 0 x NaN);
 * a +inf score makes its row NaN (exp(inf - inf)) and a -inf score hides
 * its key.
 * In the backward a NaN reaches the gradients that depend on it. Keys at or
 * past kv_lengths[b] are never read, so whatever they hold changes nothing.
 * A value a mask hides from a row never reaches that row's results: the
 * forward recomputes a row whose output is not finite while its softmax sum
 * is, without the 0 * V terms of hidden keys; the backward, for key blocks
 * holding a NaN or inf, keeps dS = 0 wherever P = 0 and sums dQ over the
 * entries with dS != 0. Finite inputs never give NaN.
 *
 * Errors: every entry point returns an fmha_status; fmha_status_string()
 * explains it. On any error nothing is written to any output. The library
 * never aborts or exits on a caller's mistake.
 *
 * Threads: a persistent pool, created on first use. The count is, in order:
 * fmha_set_num_threads(n) if called with n > 0, else the environment variable
 * FMHA_NUM_THREADS, else the CPUs this process may run on. Results are bitwise
 * identical for every thread count. Calls from several user threads are safe
 * and run one after another; a mask or bias callback must not call fmha or
 * fork. The workspace size depends on the thread count: query it after
 * setting it. Between jobs the pool's threads spin for FMHA_SPIN_US
 * microseconds (environment, read once; default 200, 0 never spins; a value
 * that is not an integer in 0..1000000 means 200) before they sleep, so a
 * call's phases and calls made back to back start without a wake-up; a
 * spinning thread yields its CPU every microsecond (another runtime's threads
 * that want it get it), there is no spinning while the pool has more threads
 * than the CPUs this process may use (counted when the pool first grows), and
 * a thread the last call did not need sleeps at once. After fork() the child
 * gets a new pool on its next call (the parent's workers do not exist there,
 * and locks another thread held are reset) and keeps the thread count setting.
 * A call that another thread is running at the fork does not continue in the
 * child (only the forking thread does): the child's copy of its outputs is
 * incomplete.
 *
 * Instruction sets: the best microkernels this CPU supports are chosen once
 * at first use (cpuid, or the aarch64 hwcaps); the environment variable
 * FMHA_ISA=scalar|avx2|avx2vnni|avx512|avx512vnni|avx512bf16|amx|neon|
 * neondot|neonbf16|sve forces a set (falling back to the best supported one
 * if the CPU lacks it); the *vnni and neondot sets add integer dot products
 * for quantized caches (see fmha_precision); avx512bf16 needs AVX512_BF16
 * and AVX512-VBMI (Zen 4, Zen 5; Cooper Lake runs avx512vnni). The float32 tile shape is
 * not a set of its own but a field of the tuning (tile_mr, tile_nr below).
 * FMHA_ISA=amx_emu runs the amx set's kernels on a software tile unit, on
 * any CPU with AVX512_BF16: for testing the AMX code where no AMX is (much
 * slower than amx; never chosen without FMHA_ISA). Only the project's test
 * builds have it; the installed library and the Python package fall back
 * as for a set the CPU lacks.
 * Each set runs with a tuning (the float32 tile shape, keys per tile,
 * K's copy, the AUTO strategy's dense crossover, the decode driver's split
 * and prefetch, the AMX schedule), the first found of, in order:
 *   1. FMHA_TUNING (below), over the tuning the next ones give;
 *   2. the wisdom file FMHA_WISDOM=path names;
 *   3. the per-user wisdom file, $XDG_CACHE_HOME/fmha/wisdom.json, or
 *      $HOME/.cache/fmha/wisdom.json when XDG_CACHE_HOME is unset;
 *   4. the tunings compiled in for the CPUs the project measured;
 *   5. a heuristic from this CPU's L1D and L2 sizes (cpuid, or sysfs);
 *   6. "generic".
 * Wisdom files (JSON, keyed by the CPU's vendor, family and model and the
 * set's name) are written by fmha_tune; an unreadable or malformed one is
 * not used at all, and the reason is in fmha_tuning_status() (the library
 * prints nothing). fmha_plan_describe names the tuning in use and where it
 * came from (tuning=, tuning_source=).
 * FMHA_TUNING=generic (every field at its default) or a comma-separated
 * list of key=N pairs, each over the tuning found: tile_mr=N (1..16) and
 * tile_nr=N (16..64, a multiple of 16): float32 calls run on the set's
 * float32 tiles of MR x NR among the shapes it has (the avx512-based sets:
 * 6 x 64, their own, 12 x 32 and 14 x 32; a shape the set lacks: its own;
 * default the set's own), block_kv=N (a multiple of 32,
 * 32..1024; default the set's), k_copy_bytes=N (the float32 forward copies
 * K once per call, rows contiguous, when one head's K holds N bytes or
 * more; 0, the default: never), dense_max_scores=N (AUTO runs dense while
 * Sq * Skv <= N; default 9216), decode_prefetch_bytes=N (decode prefetches
 * K and V past N bytes where they are neither both float32 nor both bf16
 * or f16: the quantized formats; default 8 MiB), decode_prefetch_f32_bytes=N (the
 * same where K and V are both float32; default 8 MiB),
 * decode_prefetch_h16_bytes=N (the same where K and V are both bf16 or
 * f16; default 8 MiB), decode_prefetch_ahead_bytes=N (how far decode's
 * prefetch runs ahead of its reads, bytes of K and V over the heads a
 * task walks together, 0..64 MiB; default 64 KiB), decode_split_keys=N (decode's key
 * splits hold at least N keys, a multiple of 128; default 256),
 * decode_split_keys_16rows=N (the same where a kv head's rows, group x
 * Sq, in a unit reach 16: steps of several positions; default 256),
 * matrix_decode_rows=N (decoding on AMX tiles from N rows a kv head, N >=
 * 1; default 8), matrix_backward_split=0|1 (the backward of float16 and of
 * float32 at BF16X3 or BF16 on AMX tiles, operands split into bf16 hi + lo
 * or rounded, when 1; on the float32 FMA path when 0; default 1),
 * matrix_backward_accurate=0|1 (the bf16 ACCURATE backward on AMX tiles, P
 * and dS with their bf16 residuals, when 1; on the float32 FMA path when
 * 0; default 1), and the
 * bf16 attention on AMX tiles' schedule:
 * matrix_block_kv=N (keys per step, a multiple of 32 up to 512; default
 * 128), matrix_rescale_log2=N (0..16: a row's reference maximum moves only
 * when scores pass it by more than 2^N; 0: at every new maximum; default
 * 8) and matrix_overlap=0|1 (the next block's tile products during this
 * block's softmax; default 1)
 * changes it for every set. The environment and the files are read once at
 * first use; an invalid FMHA_TUNING changes nothing. Results stay within
 * each function's stated accuracy under any tuning, and are bitwise the
 * same for every thread count under one tuning, but their bits may differ
 * between tunings (sums run over different tiles).
 */
#ifndef FMHA_H
#define FMHA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FMHA_API __attribute__((visibility("default")))
#else
#define FMHA_API
#endif

/* FMHA_VERSION_MAJOR, _MINOR, _PATCH and FMHA_VERSION_STRING (generated). */
#include "fmha_version.h"

/* Largest supported D and Dv (576: the D of DeepSeek's MLA decode, Dv 512). */
#define FMHA_MAX_HEAD_DIM 576

typedef enum fmha_status {
    FMHA_OK = 0,
    FMHA_ERR_NULL_POINTER,          /* a required pointer is NULL */
    FMHA_ERR_BAD_SIZE,              /* batch, heads or a sequence length is < 1, or sizes overflow */
    FMHA_ERR_BAD_HEADS,             /* heads_q is not a multiple of heads_kv */
    FMHA_ERR_BAD_HEAD_DIM,          /* head_dim or head_dim_v outside 1..FMHA_MAX_HEAD_DIM */
    FMHA_ERR_BAD_SCALE,             /* scale is NaN or infinite, or a cache scale (k_scales, v_scales)
                                       a call reads is not finite and >= 0 */
    FMHA_ERR_BAD_STRIDE,            /* a negative stride (any tensor, mask or bias), an output whose elements
                                       overlap each other, or a bias gradient that broadcasts where the
                                       bias does not (or the reverse) */
    FMHA_ERR_OVERLAP,               /* an output's memory overlaps an input's */
    FMHA_ERR_BAD_OPTION,            /* an unknown strategy, causal alignment, dtype or precision value */
    FMHA_ERR_UNSUPPORTED,           /* a valid request this build cannot serve (e.g. a dtype not yet implemented) */
    FMHA_ERR_WORKSPACE_TOO_SMALL,   /* the caller's workspace is smaller than the size query returned */
    FMHA_ERR_OUT_OF_MEMORY,         /* the library could not allocate its workspace or threads */
    FMHA_ERR_BAD_THREAD_COUNT,      /* fmha_set_num_threads got a negative count or one above 1024 */
    FMHA_ERR_BAD_MASK,              /* a mask or bias argument is invalid (lengths out of range, one
                                       segment array without the other, bad buckets or softcap, ...) */
    FMHA_ERR_CALLBACK,              /* a mask callback returned an invalid tile class */
    FMHA_ERR_STRUCT_SIZE,           /* problem->struct_size is not one this library knows: the problem
                                       was not filled by fmha_problem_init (see "ABI" below) */
    FMHA_ERR_BAD_PAGE,              /* a paged KV cache's page size, page count or table width is < 1,
                                       the table is too narrow for seq_kv, or an entry a sequence uses
                                       is outside [0, num_pages) */
    FMHA_ERR_BAD_FILE               /* fmha_tune's wisdom file holds something else, or cannot be
                                       written */
} fmha_status;

/* A sentence describing a status; never NULL (unknown codes get a generic text). */
FMHA_API const char *fmha_status_string(fmha_status status);

/* What made the calling thread's last fmha call fail: one sentence naming
 * the argument, what it must be and what it was, e.g.
 *   "head_dim must lie in 1..576, got 1000"
 *   "masks.kv_lengths[2] must lie in 0..seq_kv = 16, got 20"
 * "" when that call succeeded (every call that returns a status clears it
 * first). Never NULL; the text is the thread's own and stays valid until
 * its next fmha call. */
FMHA_API const char *fmha_last_error_message(void);

typedef enum fmha_strategy {
    FMHA_STRATEGY_AUTO = 0,   /* dense for small problems, tiled otherwise (crossover measured, see
                                 src/plan/plan.c); the forward of few queries against many keys
                                 (Sq <= 16, Skv >= 8 Sq: decoding) runs the decode driver,
                                 split over the keys (docs/design.md, "Decode"); one query
                                 of 64 or more heads on one kv head (MLA, MQA) runs the
                                 tiled forward with the heads as its queries ("fold");
                                 on a matrix engine (AMX), bf16 decoding at precision FAST
                                 (or a float32 query against a bf16 cache at precision
                                 BF16) with 8 or more query rows a kv head (group x Sq), D a
                                 multiple of 32, contiguous cache rows (or pages of 128
                                 keys or more) and no bias, dropout, segments or mask
                                 callback runs on the tiles ("matrix_decode", before
                                 both) */
    FMHA_STRATEGY_TILED,      /* online softmax over query x key tiles; workspace O(threads x tile),
                                 plus K and V in the kernels' layout per call where the dtype's
                                 path copies them (float32: V only, at most 64 MiB) */
    FMHA_STRATEGY_DENSE,      /* scores of one head materialised: workspace O(threads x Sq x Skv) */
    FMHA_STRATEGY_PORTABLE    /* tiled with the plain-C scalar microkernels only (the reference kernels) */
} fmha_strategy;

typedef enum fmha_causal {
    FMHA_CAUSAL_NONE = 0,
    FMHA_CAUSAL_TOP_LEFT,
    FMHA_CAUSAL_BOTTOM_RIGHT
} fmha_causal;

/* fmha_problem.alignment: where queries and keys meet for windows, ALiBi
 * and the relative-position table when no causal mask sets it. */
typedef enum fmha_alignment {
    FMHA_ALIGN_CAUSAL = 0,      /* causal's (top-left without causal masking) */
    FMHA_ALIGN_TOP_LEFT,        /* off = 0 */
    FMHA_ALIGN_BOTTOM_RIGHT     /* off = kv_len[b] - q_len[b] (FlashAttention) */
} fmha_alignment;

/* Element type of Q, K, V, O, dO and dQ, dK, dV. Softmax statistics, lse,
 * accumulators, biases and bias gradients are always float32. */
typedef enum fmha_dtype {
    FMHA_DTYPE_F32 = 0,       /* float32 */
    FMHA_DTYPE_BF16,          /* bfloat16 (uint16_t storage), float32 accumulation */
    FMHA_DTYPE_F16            /* IEEE half (uint16_t storage), float32 accumulation */
} fmha_dtype;

/* Element type of K and V when it differs from Q and O (fmha_problem.kv_dtype,
 * a KV cache in bf16 or f16 beside float32 queries). Zero means "the
 * problem's dtype", so the encoding is fmha_dtype + 1. */
typedef enum fmha_kv_dtype {
    FMHA_KV_DTYPE_SAME = 0,   /* K and V have the problem's dtype */
    FMHA_KV_DTYPE_F32,
    FMHA_KV_DTYPE_BF16,
    FMHA_KV_DTYPE_F16
} fmha_kv_dtype;

/* How K or V rows are stored (fmha_problem.k_format / v_format), each
 * tensor in its own format. Values are x = scale * stored, with:
 *   INT8      int8_t elements, symmetric; one float32 scale per (key, kv
 *             head): k_scales[b * s0 + j * s1 + h * s2] (s = k_scale_strides;
 *             with a block table the scales are a pool beside the values,
 *             [num_pages, page_size, Hkv]: page, row in page, head)
 *   FP8_E4M3  OCP 8-bit floats (uint8 bits) E4M3FN: no infinities, S.1111.111
 *             is NaN, largest finite 448; one float32 scale per kv head,
 *             k_scales[h * s2] (NULL: 1)
 *   FP8_E5M2  OCP E5M2 (the top byte of an IEEE half: inf and NaN); scales
 *             as FP8_E4M3
 *   Q8_0      GGUF blocks of 32 values, ggml's block_q8_0 bit for bit: an
 *             IEEE half scale d then 32 int8 q, value d * q (34 bytes)
 *   Q4_0      GGUF block_q4_0: a half d then 16 bytes whose low nibbles are
 *             values 0..15 and high nibbles 16..31, value d * (nibble - 8)
 *             (18 bytes); Q8_0 and Q4_0 carry their scales (no k_scales)
 * The element strides of K and V then count bytes, the storage unit of these
 * formats; a GGUF row is D / 32 blocks (D a multiple of 32, dim stride 1),
 * so K [B, Skv, Hkv, D / 32 * 34] bytes for Q8_0. F32, BF16 and F16 name the
 * dtypes; DTYPE (0) takes kv_dtype's. Scales must be finite and >= 0
 * (FMHA_ERR_BAD_SCALE at run time, naming the first bad one, nothing
 * written); a NaN or inf stored in a float8 or a block's d is data and follows
 * the IEEE rules above, as the per-element products d * q would: under
 * FMHA_PRECISION_FAST the integer scores (d times an exact integer sum)
 * cannot follow them, so a key whose integer score comes out NaN or inf
 * (only a non-finite d does that) is scored again in float32 from its
 * dequantised values, and every strategy gives the same NaN and inf.
 * Forward only; fmha_kv_quantize writes every format. */
typedef enum fmha_kv_format {
    FMHA_KV_FORMAT_DTYPE = 0,
    FMHA_KV_FORMAT_F32,
    FMHA_KV_FORMAT_BF16,
    FMHA_KV_FORMAT_F16,
    FMHA_KV_FORMAT_INT8,
    FMHA_KV_FORMAT_FP8_E4M3,
    FMHA_KV_FORMAT_FP8_E5M2,
    FMHA_KV_FORMAT_Q8_0,
    FMHA_KV_FORMAT_Q4_0
} fmha_kv_format;

/* ---- masks and biases ------------------------------------------------------
 * Scores are s = softcap(scale * q.k) + bias, where bias is the sum of every
 * bias source present, then every mask present is applied (a key is visible
 * only if all masks allow it: composed by AND). Tiles no mask touches take
 * the unmasked path; tiles every mask rules out are skipped entirely.
 *
 * Query i and key j of batch element b are compared in the causal
 * alignment's coordinates: a = i + off - j, off = kv_len[b] - q_len[b] for
 * FMHA_CAUSAL_BOTTOM_RIGHT (each sequence's own lengths, as defined in the
 * header comment: Skv - Sq when no length array is given), else 0 (also
 * when causal is NONE, unless fmha_problem.alignment asks for bottom-right).
 * Windows, ALiBi and the relative-position table measure a. */

/* What a tile callback is asked about: queries [q0, q0 + nq) x keys
 * [k0, k0 + nk) of (batch, head_q). Element (query q0 + i, key k0 + r) of a
 * tile buffer is at tile[i * q_stride + r * k_stride]. Callbacks run on the
 * library's threads, concurrently for different tiles; `thread` (0 .. number
 * of threads - 1) lets them keep per-thread state. */
typedef struct fmha_tile {
    int64_t batch, head_q, q0, nq, k0, nk;
    ptrdiff_t q_stride, k_stride;
    int thread;
} fmha_tile;

/* Tile classes a mask callback returns. */
typedef enum fmha_tile_class_public {
    FMHA_TILE_CLASS_EMPTY = 0,  /* every score masked: the tile is skipped */
    FMHA_TILE_CLASS_FULL = 1,   /* nothing masked: fill is not called */
    FMHA_TILE_CLASS_PARTIAL = 2 /* fill decides per score */
} fmha_tile_class_public;

typedef struct fmha_mask_callback {
    /* Returns an fmha_tile_class_public value; anything else fails the call
     * with FMHA_ERR_CALLBACK. NULL classify means every tile is PARTIAL. */
    int (*classify)(void *ctx, const fmha_tile *tile);
    /* Sets visible[...] (laid out as the tile says) to 0 for hidden scores;
     * entries arrive as 1. Required when the callback is used. */
    void (*fill)(void *ctx, const fmha_tile *tile, uint8_t *visible);
    void *ctx;
} fmha_mask_callback;

typedef struct fmha_bias_callback {
    /* Adds the bias to scores[...] (laid out as the tile says). Required. */
    void (*fill)(void *ctx, const fmha_tile *tile, float *scores);
    /* Backward: receives dL/dbias for the tile (d_scores, laid out as the
     * tile says) to accumulate into the callback's parameters. May be NULL. */
    void (*accumulate_grad)(void *ctx, const fmha_tile *tile, const float *d_scores);
    void *ctx;
} fmha_bias_callback;

/* Every optional mask and bias; fmha_problem_init leaves all of them off. */
typedef struct fmha_masks {
    /* Sliding window: key j visible iff -window_right <= a <= window_left,
     * with a as above; -1 leaves that side unbounded. Causal masking is
     * independent and ANDs with it (it alone means window_right = 0). */
    int64_t window_left, window_right;
    /* Padding: kv_lengths[b] in 0..Skv hides keys j >= kv_lengths[b];
     * q_lengths[b] in 0..Sq makes rows i >= q_lengths[b] fully masked
     * (O = 0, lse = -inf, zero gradient). int32 [B] each, NULL = off. */
    const int32_t *kv_lengths;
    const int32_t *q_lengths;
    /* Segments (packed sequences): key j visible from query i iff
     * q_segment_ids[b, i] == kv_segment_ids[b, j]. int32 [B, Sq] and
     * [B, Skv] contiguous; both or neither. */
    const int32_t *q_segment_ids;
    const int32_t *kv_segment_ids;
    /* Dense boolean mask [B, Hq, Sq, Skv] (uint8, nonzero = visible), with
     * element strides [batch, head, query, key]; a stride of 0 broadcasts
     * (so [Sq, Skv] or [B, 1, 1, Skv] masks need no copies). NULL = off. */
    const uint8_t *dense;
    int64_t dense_strides[4];
    fmha_mask_callback callback; /* off when callback.fill is NULL */
} fmha_masks;

typedef struct fmha_biases {
    /* Dense additive bias [B, Hq, Sq, Skv] float32 with element strides
     * [batch, head, query, key]; 0 strides broadcast. Its gradient has the
     * same (broadcast) shape: see fmha_param_grads. NULL = off. */
    const float *dense;
    int64_t dense_strides[4];
    /* ALiBi: bias = -alibi_slopes[h] * |a|, float32 [Hq]. NULL = off. */
    const float *alibi_slopes;
    /* Relative-position table [Hq, rel_num_buckets] float32 with T5
     * bucketing of the distance j - (i + off): bidirectional or not,
     * exact buckets below half of the (per-side) buckets, logarithmic up to
     * rel_max_distance. NULL = off; rel_num_buckets >= 1 and
     * rel_max_distance >= 1 when on. */
    const float *rel_table;
    int32_t rel_num_buckets;
    int32_t rel_max_distance;
    int32_t rel_bidirectional;
    /* Logit softcap: scale * q.k becomes softcap * tanh(scale * q.k / softcap)
     * before biases are added. 0 = off; must be > 0 and finite when on. */
    float softcap;
    fmha_bias_callback callback; /* off when callback.fill is NULL */
} fmha_biases;

/* The T5 bucket of relative position rel = j - (i + off) (key minus query),
 * as the rel_table bias uses it: in [0, num_buckets) for every rel (INT64_MIN
 * and INT64_MAX included) when num_buckets >= 1; -1 when num_buckets < 1
 * (there is no bucket). bidirectional: 0 or not. Exposed so that callers
 * can build the same bias densely. */
FMHA_API int32_t fmha_rel_bucket(int64_t rel, int32_t num_buckets, int32_t max_distance,
                                 int bidirectional);

/* Gradients of the bias parameters, written by fmha_backward when non-NULL:
 *   d_dense     the dense bias's shape [B, Hq, Sq, Skv], with d_dense_strides
 *               (0 where the bias broadcasts: the gradient is summed there)
 *   d_alibi     [Hq]                   d_rel_table [Hq, rel_num_buckets]
 * Each is reduced in a fixed order, so it is bitwise identical for every
 * thread count. */
typedef struct fmha_param_grads {
    float *d_dense;
    int64_t d_dense_strides[4];
    float *d_alibi;
    float *d_rel_table;
} fmha_param_grads;

/* How bf16 products round, and how a decode step reads a quantized cache
 * (float32 and f16 problems ignore it otherwise).
 * FAST (fmha_problem_init's default): P enters the P V product as bf16
 *   alone (half the P V work on AVX-512 BF16), which leaves O up to about
 *   1.6x the error of rounding the exact O to bf16 (on AVX-512 BF16 the
 *   forward's exp for P is good to 3e-6, not to float32's last bit, since
 *   P is rounded to bf16 right after); the backward's dV, dK
 *   and dQ products take P and dS as bf16 too (each gradient about 1.45x
 *   the error of rounding it to bf16).
 * ACCURATE: P enters as bf16 plus its bf16 rounding residual, so O stays
 *   within 1.5x that error; the gradient products stay float32 (on a
 *   matrix engine P and dS enter them as bf16 plus their residuals, within
 *   2^-16 of each: each gradient within 1.01x the error of rounding it to
 *   bf16, as the float32 products).
 * FAST is the default because it is no less accurate than the fused CPU
 * kernel bf16 users run today: relative L2 error against float64 on the
 * same bf16 inputs (B = 1, 8 heads, D = 64, causal, S = 2048; PyTorch 2.15
 * scaled_dot_product_attention on CPU):
 *              O        dQ       dK       dV
 *   PyTorch    2.0e-3   2.7e-3   4.7e-3   4.7e-3
 *   FAST       2.0e-3   2.4e-3   2.4e-3   2.4e-3
 *   ACCURATE   1.6e-3   1.8e-3   1.8e-3   1.7e-3
 * On a matrix engine (AMX tiles: the matrix driver) the forward's O,
 * relative L2 against float64 on the same inputs (B = 1, 8 heads, D = 64,
 * causal, S = 2048; a Xeon with AMX):
 *   bf16 FAST 2.1e-3, bf16 ACCURATE 1.6e-3 (O stored as bf16);
 *   float16 (any precision: split into bf16 hi + lo, P too) 2.0e-4 (O
 *   stored as float16, whose own rounding dominates; the backward split
 *   alike, each gradient within 1.09x the error of rounding it to
 *   float16);
 *   float32 FAST or ACCURATE (IEEE FMA) 3.1e-7, BF16X3 4.2e-6, BF16 2.1e-3.
 *
 * Quantized caches (k_format / v_format), on the decode driver: ACCURATE
 * takes the float32 query against the cache's values (float32 products).
 * FAST quantizes each query row once a call as llama.cpp does for its
 * q8_0 and q4_0 caches (blocks of 32, scale max|x| / 127, kept in float32
 * where a q8_0 block rounds it to a half) and takes the scores of int8,
 * q8_0 and q4_0 keys in integer dot products (VNNI, AVX-VNNI, SDOT),
 * and P V of int8, q8_0 and q4_0 values on P quantized to 16 bits per
 * block of 32 columns and 64 keys; float8 keys meet the query rounded to
 * bf16 where the table's bf16 dot product pays (the avx512bf16 table). A
 * query row holding a NaN or inf, and a head dim that is not a multiple
 * of 32, keep ACCURATE's arithmetic. FAST takes a format's integer path
 * only because its error is no worse than llama.cpp's own arithmetic on
 * the same cache (the query as q8_0 blocks, integer products): relative
 * L2 error of O against float64 on the values each cache holds (Hq 32 /
 * Hkv 8, D 128, Skv 4096, Sq 1, Q, K, V uniform in [-1, 1); test_kvformat
 * prints it):
 *              ACCURATE  FAST     llama.cpp  FAST vs ACCURATE
 *   int8       1.6e-7    1.27e-3  1.27e-3    1.27e-3
 *   q8_0       1.5e-7    1.27e-3  1.27e-3    1.27e-3
 *   q4_0       1.6e-7    1.26e-3  1.26e-3    1.26e-3
 *   fp8_e4m3   1.6e-7    5.1e-4   1.27e-3    5.1e-4   (bf16 query)
 *   fp8_e5m2   1.6e-7    5.1e-4   1.27e-3    5.1e-4   (bf16 query)
 * FAST's error over llama.cpp's is 0.998-1.001 (the same integers, scales
 * in float32 against halves); 16-bit P adds no measurable error to it. */
typedef enum fmha_precision {
    FMHA_PRECISION_ACCURATE = 0,
    FMHA_PRECISION_FAST,
    /* float32 inputs on a matrix engine (AMX tiles): each of Q, K, V and P
     * split into bf16 hi + lo and three products (hi hi + hi lo + lo hi)
     * per GEMM, about 2^-16 of each product's magnitude; the backward
     * likewise (dO and dS split too, five GEMMs): gradients' relative L2
     * error at most 6.3e-5 where the FMA path gives 3-6e-7 (B 1, H 2-4,
     * D 33-128, S 61-300, Q and K uniform in [-2, 2), V and dO in [-1, 1)).
     * Elsewhere (no matrix engine, or FMHA_TUNING=matrix_backward_split=0
     * for the backward) float32 runs its IEEE FMA path. bf16 problems read
     * it as ACCURATE. */
    FMHA_PRECISION_BF16X3,
    /* float32 inputs on a matrix engine: Q, K, V and P rounded to bf16 (at
     * most 2^-8 of each), one product per GEMM, the backward's dO and dS
     * too (gradients' relative L2 3-5e-3 on the problems above). On a
     * table with bf16 pair products off the matrix driver (AVX512-BF16:
     * the avx512bf16 table; Arm's BF16: neonbf16; on a matrix engine where
     * its driver does not serve, as with a bias), the same rounding as Q, K, V and
     * dO are packed, then the bf16 path of a bf16 problem at FAST: O (in
     * float32) rounded to bf16 and lse are that problem's bits on the
     * rounded inputs; relative L2 against float64 of O 3.0-3.2e-3, of the
     * gradients 3.2-4.1e-3 (B 1, H 4-8, D 64, S 150-1024, the inputs
     * above). Elsewhere as BF16X3. bf16
     * problems read it as FAST. A decode step of a float32 query against a
     * bf16 cache (kv_dtype BF16) on a matrix engine, 8 or more rows a kv
     * head: the query rounded to bf16 as llama.cpp rounds it for its bf16
     * and f16 caches, the step on the tiles ("matrix_decode"); relative L2
     * error of O about 1.7e-3 (Hq 32 / Hkv 8, D 128, Skv 16384, Sq 4, Q,
     * K, V uniform in [-1, 1)), against 3e-7 for FAST's float32 query,
     * which such a step keeps. Without a matrix engine, on AVX512-BF16
     * (the avx512bf16 table), the decode driver rounds the query and P
     * the same way and takes both products in vdpbf16ps, any row count,
     * D a multiple of 32: 1.8e-3 (Skv 4096, the rest as above). A bf16
     * problem at FAST decodes a bf16 cache there the same way (P in bf16,
     * FAST's rule above): 2.4e-3 with O stored as bf16, 1.44x the 1.65e-3
     * of rounding the float32 path's O to bf16. Float8 caches there
     * likewise: a float32 query at BF16 rounded to bf16 and P too, both
     * products in vdpbf16ps: 1.76e-3 (Skv 4096, Sq 1, the rest as above),
     * against FAST's 5.0e-4, which keeps P in float32 (P in bf16 would err
     * more than llama.cpp's 1.24e-3, FAST's bound for quantized caches);
     * a bf16 problem at FAST takes float8 values on bf16 P (FAST's rule). */
    FMHA_PRECISION_BF16
} fmha_precision;

/* Strides filled in by fmha_problem_init for contiguous tensors. */
typedef enum fmha_layout {
    FMHA_LAYOUT_BSHD = 0,     /* [batch, seq, head, dim] (JAX, FlashAttention) */
    FMHA_LAYOUT_BHSD          /* [batch, head, seq, dim] (PyTorch) */
} fmha_layout;

/* One attention problem: sizes, options and the strides of every tensor.
 * Fill it with fmha_problem_init, then change what differs.
 *
 * ABI: struct_size (set by fmha_problem_init to sizeof(fmha_problem) of the
 * header the caller compiled against) lets the struct grow without breaking
 * built callers. New fields are only ever appended at the end, with zero
 * meaning "off", and the library reads a smaller problem as its prefix with
 * the rest zero; a struct_size it does not know is FMHA_ERR_STRUCT_SIZE.
 * fmha_param_grads, fmha_tile and the callback structs never change; new
 * gradients or callback arguments come as new types. libfmha.so's SOVERSION
 * is the major version. */
typedef struct fmha_problem {
    size_t struct_size;       /* sizeof(fmha_problem), set by fmha_problem_init */
    fmha_dtype dtype;
    int64_t batch;            /* B   >= 1 */
    int64_t heads_q;          /* Hq  >= 1, a multiple of heads_kv */
    int64_t heads_kv;         /* Hkv >= 1 */
    int64_t seq_q;            /* Sq  >= 1 */
    int64_t seq_kv;           /* Skv >= 1 */
    int64_t head_dim;         /* D,  1..FMHA_MAX_HEAD_DIM */
    int64_t head_dim_v;       /* Dv, 1..FMHA_MAX_HEAD_DIM */
    float scale;              /* multiplies Q K^T once the dot products are summed (so a large
                                 scale cannot overflow Q); +0.0 selects 1/sqrt(head_dim); any
                                 other finite value is used as given: -0.0 is a zero scale
                                 (equal weights over the visible keys); NaN/inf is an error */
    fmha_causal causal;
    fmha_strategy strategy;
    fmha_precision precision;
    /* Element strides, each in the order [batch, seq, head, dim]. The
     * gradients dQ, dK, dV, dO use the strides of Q, K, V, O respectively. */
    int64_t q_strides[4];
    int64_t k_strides[4];
    int64_t v_strides[4];
    int64_t o_strides[4];
    fmha_masks masks;
    fmha_biases biases;
    /* Attention sinks (appended after the first release: struct_size tells
     * them apart). One logit per query head, float32 [Hq], that joins the
     * softmax denominator of every row of that head without a value row:
     *   P[i, j] = exp(s_ij) / (sum_k exp(s_ik) + exp(sinks[h]))
     * lse includes it (log(sum_k exp(s_ik) + exp(sinks[h]))), so a row that
     * sees no key gets O = 0 and lse = sinks[h]. Must be finite. NULL = off.
     * The backward gives dQ, dK, dV with sinks; the sinks' own gradient
     * comes from fmha_sinks_backward. */
    const float *sinks;
    /* Paged KV cache (appended after sinks; FlashAttention's block_table,
     * vLLM's layout). With block_table non-NULL, k and v are page pools,
     *   K [num_pages, page_size, Hkv, D]   V [num_pages, page_size, Hkv, Dv]
     * with k_strides/v_strides in the order [page, row in page, head, dim],
     * and key j of batch element b is row j % page_size of page
     *   block_table[b * block_table_stride + j / page_size].
     * seq_kv is the most keys a sequence can hold (at most
     * block_table_stride * page_size); masks.kv_lengths[b] (Skv when NULL)
     * the keys it holds, and only the entries of its first
     * ceil(kv_len[b] / page_size) pages are read (and must be in
     * [0, num_pages): FMHA_ERR_BAD_PAGE otherwise, checked at every run).
     * Pages may be shared and in any order. Forward only (the backward
     * answers FMHA_ERR_UNSUPPORTED), served by the decode driver for every
     * strategy and query length (on a matrix engine, pages of 128 keys or
     * more under matrix_decode's rule, by matrix_decode, page by page); masks other than causal, windows and
     * lengths, and biases other than softcap and ALiBi, are
     * FMHA_ERR_UNSUPPORTED with a block table.
     * NULL = off (K and V as above). */
    const int32_t *block_table;   /* [B, block_table_stride] int32 page indices */
    int64_t block_table_stride;   /* entries per batch element, >= ceil(seq_kv / page_size) */
    int64_t page_size;            /* keys per page, >= 1 */
    int64_t num_pages;            /* pages in each pool, >= 1 */
    /* Dropout on the attention weights (appended after the paged cache).
     * With dropout_p in (0, 1): O = (P * Z) V, where Z[b, h, i, j] is 0 with
     * probability dropout_p and 1 / (1 - dropout_p) otherwise, drawn by a
     * counter-based hash of dropout_seed and the score's index
     *   dropout_offset + ((b * Hq + h) * Sq + i) * Skv + j
     * (fmha_dropout_keep tells which are kept). The backward draws the same
     * Z again, so nothing of size Sq x Skv is stored, and Z is the same for
     * every thread count, strategy and instruction set. lse is P's (before
     * dropout). Successive calls with the same seed take fresh numbers by
     * advancing dropout_offset by B * Hq * Sq * Skv. The tiled forward and
     * the backward serve it (auto and dense plan tiled; a paged cache is
     * FMHA_ERR_UNSUPPORTED). 0 = off; outside [0, 1) or NaN is
     * FMHA_ERR_BAD_OPTION. */
    float dropout_p;
    uint64_t dropout_seed;
    uint64_t dropout_offset;
    /* Element type of K and V (appended after dropout): FMHA_KV_DTYPE_SAME
     * (0, fmha_problem_init's) for the problem's dtype; bf16 or f16 with a
     * float32 problem keeps Q and O float32 and widens K and V as they are
     * read (the decode driver, paged or not, and the tiled and dense
     * forwards). A kv_dtype differing from a bf16 or f16 problem's dtype,
     * and the backward of a problem whose K and V differ from Q, are
     * FMHA_ERR_UNSUPPORTED; an unknown value is FMHA_ERR_BAD_OPTION. */
    fmha_kv_dtype kv_dtype;
    /* Alignment of windows, ALiBi and the relative-position table
     * (appended after kv_dtype; an fmha_alignment value, int64 so that it
     * lies past the earlier struct's end): where query i and key j meet,
     * a = i + off - j (see "masks and biases"). FMHA_ALIGN_CAUSAL (0) takes
     * causal's alignment: off = kv_len[b] - q_len[b] with
     * FMHA_CAUSAL_BOTTOM_RIGHT, else 0. FMHA_ALIGN_BOTTOM_RIGHT gives
     * bottom-right's off without causal masking, as FlashAttention measures
     * windows and ALiBi on every call (a decode step with a sliding window
     * and no causal mask); FMHA_ALIGN_TOP_LEFT off = 0. An alignment that
     * contradicts causal's, or an unknown value, is FMHA_ERR_BAD_OPTION. */
    int64_t alignment;
    /* Storage formats of K and V (appended after alignment; fmha_kv_format
     * values, 0 = kv_dtype's) and their scales (see fmha_kv_format): float32,
     * strides [batch or page, key or row in page, head] in elements,
     * fmha_problem_init's for a contiguous [B, Skv, Hkv] array ([B, Hkv,
     * Skv] with FMHA_LAYOUT_BHSD). A format
     * other than the dtypes' serves the forward only (the decode driver,
     * paged or not, and the tiled and dense forwards, which widen K and V
     * once a call), with Q and O of any dtype; the backward answers
     * FMHA_ERR_UNSUPPORTED. Scales given to a format without them, or
     * missing for INT8, are FMHA_ERR_BAD_OPTION / FMHA_ERR_NULL_POINTER. */
    int64_t k_format, v_format;
    const float *k_scales, *v_scales;
    int64_t k_scale_strides[3], v_scale_strides[3];
} fmha_problem;

/* Fills *p: struct_size, float32, the given sizes, contiguous strides for
 * `layout` (the same layout for Q, K, V and O), scale 0 (= 1/sqrt(head_dim)),
 * no causal mask, no other mask or bias (windows unbounded), strategy auto.
 * Does not validate; the entry points do. */
FMHA_API void fmha_problem_init(fmha_problem *p, int64_t batch, int64_t heads_q, int64_t heads_kv,
                       int64_t seq_q, int64_t seq_kv, int64_t head_dim, int64_t head_dim_v,
                       fmha_layout layout);

/* Checks a problem without running it: the status the entry points would give
 * for its sizes, options, strides, masks and biases. The tensor pointers are
 * not checked; the mask and bias arrays it names (lengths, slopes) are read. */
FMHA_API fmha_status fmha_problem_check(const fmha_problem *p);

/* ---- forward ------------------------------------------------------------ */

/* Library workspace. A call given no workspace (NULL here, and always for
 * fmha_forward_backward) uses one block the library keeps between calls, so
 * repeated calls do not fault in fresh pages: it grows to the largest size
 * such a call has needed, up to 64 MiB, and is held until the process exits.
 * Larger needs are allocated and freed within the call, as is the block of
 * a call made while another thread's call holds the kept one. Plans keep
 * their own (fmha_plan_create). */

/* Bytes of workspace fmha_forward needs for this problem with the current
 * thread count and instruction set. *bytes is written only on success. */
FMHA_API fmha_status fmha_forward_workspace_size(const fmha_problem *p, size_t *bytes);

/* O = softmax(scale * Q K^T, masked) V.
 *   q, k, v   inputs (dtype of p), shapes and strides as in the header comment
 *   o         output [B, Sq, Hq, Dv] with p->o_strides; must not overlap q, k, v
 *   lse       optional output [B, Hq, Sq] float32 contiguous, the natural log of
 *             the row sum of exp(scores); -inf for a fully masked row. NULL skips it.
 *   workspace optional; NULL lets the library provide it (outside the hot
 *             loop; see "Library workspace" below); otherwise at least
 *             fmha_forward_workspace_size bytes, any alignment. */
FMHA_API fmha_status fmha_forward(const fmha_problem *p, const void *q, const void *k, const void *v,
                         void *o, float *lse, void *workspace, size_t workspace_bytes);

/* ---- backward ------------------------------------------------------------ */

/* Bytes of workspace fmha_backward needs (current thread count and ISA). */
FMHA_API fmha_status fmha_backward_workspace_size(const fmha_problem *p, size_t *bytes);

/* Gradients of O = attention(Q, K, V) given dO = dL/dO.
 *   q, k, v, o  the forward's inputs and output (o with p->o_strides)
 *   d_o         dL/dO, shape and strides of o
 *   lse         the forward's lse [B, Hq, Sq] float32 (required)
 *   dq, dk, dv  outputs with the shapes and strides of q, k, v; dk and dv are
 *               summed over the query heads that share a key/value head.
 *               They must not overlap any input or each other.
 *   grads       optional gradients of the bias parameters (NULL: none)
 *   workspace   as for fmha_forward. */
FMHA_API fmha_status fmha_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                          const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                          void *dv, const fmha_param_grads *grads, void *workspace,
                          size_t workspace_bytes);

/* 1 if dropout keeps score (b, h, i, j) of problem p (see dropout_p), 0 if
 * it drops it; 1 when p has no dropout. No checks: indices in range. */
FMHA_API int fmha_dropout_keep(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);

/* Gradient of the attention sinks (p->sinks required), from the forward's
 * output and lse and dO = dL/dO:
 *   d_sinks[h] = -sum_{b, i} exp(sinks[h] - lse[b, h, i]) * sum_e dO[b, i, h, e] O[b, i, h, e]
 * over the rows i < q_lengths[b] (all rows without q_lengths); a row that
 * sees no key (O = 0) adds 0. o and d_o have p->dtype and p->o_strides, lse
 * is [B, Hq, Sq] float32, d_sinks [Hq] float32 (must not overlap any
 * input). Summed in a fixed order in double: bitwise identical for every
 * thread count. The same problem (and sinks) as the forward that gave o. */
FMHA_API fmha_status fmha_sinks_backward(const fmha_problem *p, const void *o, const void *d_o,
                                         const float *lse, float *d_sinks);

/* Forward then backward in one call (o and lse are written, as by fmha_forward;
 * lse is required). Workspace is the library's ("Library workspace" above). */
FMHA_API fmha_status fmha_forward_backward(const fmha_problem *p, const void *q, const void *k,
                                  const void *v, const void *d_o, void *o, float *lse, void *dq,
                                  void *dk, void *dv, const fmha_param_grads *grads);

/* ---- merging partial results ------------------------------------------------
 * Attention over the union of two disjoint key sets from the results over
 * each (ring attention, split-KV decoding):
 *   lse = log(exp(lse_a) + exp(lse_b))
 *   O   = exp(lse_a - lse) O_a + exp(lse_b - lse) O_b
 *   o_a, o_b, o  float32 [B, Sq, Hq, Dv], element strides o_strides in the
 *                order [batch, seq, head, dim] (>= 0), shared by all three
 *   lse_a, lse_b, lse  float32 [B, Hq, Sq] contiguous
 * A side with lse -inf (no key seen) contributes nothing (its O is not
 * read); both -inf gives O = 0, lse = -inf. A NaN lse makes the row's O and
 * lse NaN; a NaN or inf in O_a or O_b reaches O (IEEE: a weight that
 * underflows to 0 still multiplies it). The library's own split-KV merges
 * follow the same rule, so a split never hides a NaN. o may be the same pointer as o_a
 * or o_b, and lse as lse_a or lse_b (merging in place); other overlaps are
 * not allowed. Errors: a NULL pointer, sizes < 1 or overflowing, Dv outside
 * 1..FMHA_MAX_HEAD_DIM, a negative stride; nothing is written then. */
FMHA_API fmha_status fmha_merge(int64_t batch, int64_t heads_q, int64_t seq_q, int64_t head_dim_v,
                                const int64_t o_strides[4], const float *o_a, const float *lse_a,
                                const float *o_b, const float *lse_b, float *o, float *lse);

/* ---- writing a quantized cache --------------------------------------------
 * Quantizes rows of float32 into a cache format, as the format's reference
 * does, so that a cache can be appended to without another library:
 *   x       float32 [tokens, heads, dim], element strides x_strides
 *           [token, head, dim]
 *   values  the format's rows [tokens, heads, row], strides values_strides
 *           in the format's storage units (bytes for INT8, FP8, Q8_0, Q4_0;
 *           elements for F32, BF16, F16); GGUF rows need dim a multiple of
 *           32 and values_strides[2] == 1
 *   scales  float32, strides scale_strides [token, head]:
 *           INT8     written: max |x| of the row / 127; q = round(x / scale)
 *                    (half away from zero; a zero row gets scale 0, q 0)
 *           FP8_*    read (one per head: scale_strides {0, 1} for [Hkv];
 *                    NULL: 1; finite and >= 0, as attention reads them): x /
 *                    scale rounded to nearest even, saturated to the largest
 *                    finite value (448, 57344); NaN stays NaN; a scale of 0
 *                    holds only 0, so every other x is stored as 0
 *           Q8_0, Q4_0  NULL: ggml's quantize_row_q8_0_ref /
 *                    quantize_row_q4_0_ref bit for bit
 *           F32, BF16, F16  NULL: rounded to nearest even
 * A NaN or inf in x is FMHA_ERR_BAD_SCALE for INT8, Q8_0 and Q4_0 (a row's
 * or block's scale would be neither finite nor meaningful), data for the
 * float formats (F32, BF16, F16, FP8_*). Outputs must
 * not overlap x; nothing is written on an error. */
FMHA_API fmha_status fmha_kv_quantize(fmha_kv_format format, int64_t tokens, int64_t heads, int64_t dim,
                                      const float *x, const int64_t x_strides[3], void *values,
                                      const int64_t values_strides[3], float *scales,
                                      const int64_t scale_strides[2]);

/* Bytes of one row of dim values in a format (dim a multiple of 32 for
 * Q8_0 and Q4_0), 0 for a bad format or dim. */
FMHA_API size_t fmha_kv_format_row_bytes(fmha_kv_format format, int64_t dim);

/* ---- plans ----------------------------------------------------------------
 * A plan is a problem validated and resolved once (strategy, microkernels,
 * operand path, workspace sizes, mask callback answers checked), to run many
 * times on new tensors of the same shapes and strides: training steps, or
 * one plan per layer shape. A run checks only the tensor pointers (NULL,
 * overlaps: O(1) each) and the O(B) length arrays, and allocates nothing
 * after the first run of each direction (the plan owns its workspace, grown
 * when the thread count grows). Results are bitwise identical to the
 * one-shot calls, which are this same path with a plan on the stack.
 *
 * The plan copies the problem; the arrays it names (lengths, segment ids,
 * dense mask and bias, slopes, table, callbacks and their contexts) are
 * read at every run, so they must stay valid for the plan's life, and their
 * contents may change between runs (lengths, block table entries, slopes and
 * sinks are re-checked at every run). Calls on one plan from several
 * threads are safe and run one after another. */
typedef struct fmha_plan fmha_plan;

/* Validates *p (every check fmha_problem_check makes, plus a mask callback's
 * classify answers) and returns a new plan in *plan (untouched on error). */
FMHA_API fmha_status fmha_plan_create(const fmha_problem *p, fmha_plan **plan);

/* fmha_forward, fmha_backward and fmha_forward_backward on a plan's problem
 * (tensors as documented there; the plan owns the workspace). */
FMHA_API fmha_status fmha_plan_forward(fmha_plan *plan, const void *q, const void *k, const void *v,
                                       void *o, float *lse);
FMHA_API fmha_status fmha_plan_backward(fmha_plan *plan, const void *q, const void *k, const void *v,
                                        const void *o, const void *d_o, const float *lse, void *dq,
                                        void *dk, void *dv, const fmha_param_grads *grads);
FMHA_API fmha_status fmha_plan_forward_backward(fmha_plan *plan, const void *q, const void *k,
                                                const void *v, const void *d_o, void *o, float *lse,
                                                void *dq, void *dk, void *dv,
                                                const fmha_param_grads *grads);

/* The problem a plan runs (its copy), or NULL for a NULL plan. */
FMHA_API const fmha_problem *fmha_plan_problem(const fmha_plan *plan);

/* Bytes of workspace the plan holds now (0 before its first run). */
FMHA_API size_t fmha_plan_workspace_held(const fmha_plan *plan);

/* What a plan runs, as one line of space-separated key=value fields:
 *   driver     the forward's driver: "matrix_decode" (decoding on a
 *              matrix engine, K and V read in place), "fold" (one query
 *              of many heads on one kv head), "decode" (few queries, many
 *              keys; paged caches), "matrix" (Q, K, V and P on a matrix
 *              engine: AMX tiles), "dense" (small problems) or "tiled"
 *   isa        the kernel table ("avx512bf16", "avx2", "scalar", ...)
 *   path       how the products read their operands: "f32", "bf16"
 *              (bf16 pairs on the bf16 dot-product instructions),
 *              "widened" (bf16/f16 widened to float32) or "matrix" (the
 *              matrix driver's tile layouts)
 *   precision  "float32"; for the bf16 pair path and bf16 on the matrix
 *              driver "fast"/"accurate"; for f16 and float32 on the
 *              matrix driver "bf16x3" (hi + lo splits) or "bf16"
 *   k_format, v_format  the cache formats of K and V ("f32", "bf16", "f16",
 *              "int8", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0")
 *   block_q, block_kv, mr (rows of the path's GEMM: 16 on AMX tiles)
 *              (tiled, dense) or decode_units, rows_per_unit,
 *              heads_per_unit, keys_per_split, splits (decode; the same
 *              but heads_per_unit on matrix_decode)
 *   threads    the thread count a run would use now
 *   cpu        in double quotes: vendor, family, model and the instruction
 *              sets the CPU and OS allow (AMX included)
 *   tuning     the table's tuning: "generic", a microarchitecture's name,
 *              "wisdom", "heuristic", or any of them with "+FMHA_TUNING"
 *              when the environment changed it
 *   backward   the backward's driver: "matrix" (on a matrix engine, AMX
 *              tiles: bf16 at FAST or ACCURATE, float16, float32 at
 *              BF16X3 or BF16) or "tiled"
 *   scores     how Q K^T is taken: "float32" (the query in float32 against
 *              the cache's values), "integer" (decode under precision
 *              FAST: the query quantized as q8_0 against int8, q8_0 or q4_0
 *              keys in integer dot products) or "bf16" (decode under FAST:
 *              the query rounded to bf16 against float8 keys; a bf16
 *              query against a bf16 cache in vdpbf16ps; and a float32
 *              query at precision BF16 against a bf16 cache, on
 *              matrix_decode or in vdpbf16ps); see fmha_precision
 *   values     how P V is taken: "float32", "integer" (decode under
 *              precision FAST: P quantized to 16 bits against int8, q8_0
 *              or q4_0 values) or "bf16" (decode in vdpbf16ps: P rounded
 *              to bf16 against bf16 values, where scores is "bf16" on a
 *              bf16 cache)
 *   tuning_source  where the tuning came from: "env" (FMHA_TUNING),
 *              "wisdom" (a wisdom file), "builtin" (measured and compiled
 *              in), "heuristic" (from the cache sizes) or "generic"
 * Writes at most buf_size bytes, NUL-terminated (buf may be NULL when
 * buf_size is 0) and returns the length of the whole line, as snprintf. A
 * NULL plan describes the CPU alone. Fields may be added at the end. */
FMHA_API size_t fmha_plan_describe(const fmha_plan *plan, char *buf, size_t buf_size);

/* Frees the plan and its workspace; NULL is a no-op. */
FMHA_API void fmha_plan_destroy(fmha_plan *plan);

/* ---- threads and instruction set ------------------------------------------ */

/* n > 0 fixes the thread count; n == 0 returns to the default. */
FMHA_API fmha_status fmha_set_num_threads(int n);
FMHA_API int fmha_get_num_threads(void);

/* The name of the kernel table in use (the best this CPU runs, or FMHA_ISA's choice): "amx", "avx512vnni",
 * "avx512bf16", "avx512", "avx2", "scalar", ... (fmha_plan_describe tells the CPU's instruction sets). */
FMHA_API const char *fmha_isa_name(void);

/* Where the kernel table in use took its tuning, and what became of the
 * wisdom files, in one line: "amx: tuning xeon-6-167 (source builtin),
 * float32 on amx; FMHA_WISDOM: none; user wisdom /home/u/.cache/fmha/
 * wisdom.json: not found; caches L1d 48 KiB, L2 2048 KiB". A refused file
 * says "refused, nothing of it used: " and why (the byte or entry, the key,
 * the range). The string is the library's, valid until the next fmha_tune. */
FMHA_API const char *fmha_tuning_status(void);

/* fmha_tune's progress: one line (no newline) per step measured. */
typedef void (*fmha_tune_progress_fn)(void *user, const char *line);

/* Measures this CPU: times the kernel table in use under the tunings worth
 * trying (its float32 tile variants, keys per tile, K's copy, the dense
 * crossover, the decode split and prefetch, the AMX schedule and the AMX
 * backward of split float32 on a CPU with AMX) on float32 and bf16 problems of 8 heads (S 128..2048, D 64 and 128,
 * forward and forward+backward, decode), keeps for each field the value
 * that ran fastest (a change must win by 3% over alternating repetitions,
 * its results within tolerance of the generic ones), and writes them with
 * the times measured into the wisdom file at `path` (NULL: the per-user
 * one, its directory created), keyed by this CPU and the table's name;
 * entries of other CPUs or tables already in the file are kept. Runs
 * within about budget_s seconds (<= 0: 90) on the current thread count,
 * calling progress (when not NULL) as it goes. Measuring happens only
 * here, never inside an attention call. The tunings of this process stay
 * as they were; processes started afterwards read the file (as FMHA_WISDOM
 * or the per-user file). Call it when no other fmha call runs: the
 * timings would mean nothing. Returns FMHA_OK, FMHA_ERR_BAD_FILE (path
 * holds a file that is not a wisdom file, or cannot be written: nothing
 * written) or FMHA_ERR_OUT_OF_MEMORY. */
FMHA_API fmha_status fmha_tune(const char *path, double budget_s, fmha_tune_progress_fn progress, void *user);

/* "major.minor.patch" */
FMHA_API const char *fmha_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* FMHA_H */
