/* decode.c: the forward for few queries against many keys (decoding with a
 * KV cache), at the speed memory streams K and V.
 *
 * The tiled forward gives each task NR queries of one head; with Sq = 1 a
 * task fills one lane of NR and reads K and V once per query head. Here the
 * rows of one kv head (its group of query heads x the Sq queries, row
 * rho = i * group + g) are served together from one pass over that head's K
 * and V, streamed from the caller's memory (2-byte caches are widened a
 * sub-block at a time, in cache), with keys in the vector lanes. When the
 * cache interleaves the kv heads within a key ([B, S, H, D]), a unit serves
 * several kv heads, and a tile's scores and values run in sub-blocks of
 * DEC_SUB keys, every head of a sub-block in turn, so that memory is read
 * in address order (head by head over a whole tile, each key row of 4 KiB
 * was read 512 bytes at a time, 32 pages apart: half the stream's speed).
 *
 * Split-KV: the keys are cut into drv.dec.splits chunks of drv.dec.chunk keys, a
 * count fixed by the problem's shape (never by the thread count). A task
 * (unit of heads x rows, chunk) runs the online softmax over its chunk's tiles and
 * leaves an unnormalised partial O, its max m and sum l; a merge pass then
 * combines the chunks of each row in chunk order:
 *   M = max_c m_c, w_c = exp(m_c - M), O = sum_c w_c O_c / sum_c w_c l_c,
 *   lse = M + log(sum_c w_c l_c),
 * so results are bitwise identical for every thread count.
 *
 * Masks: each row sees one contiguous key range (the causal/window band at
 * its batch element's alignment, key lengths, query lengths), so a tile's
 * scores outside a row's range are set to -inf and tiles outside every
 * row's range are skipped. Softcap and ALiBi are applied to the score tile
 * row by row (fmha_bias_row, the tiled epilogue's definitions). Problems with other
 * masks or biases, strided head dims or no decode kernels run on the tiled
 * forward (fmha_decode_plan).
 *
 * Paged caches (block_table): key j's row is found through the table
 * (fmha_kv_row_at). A sub-block inside one page is read in place as from a
 * contiguous cache; one that crosses pages (page sizes not a multiple of
 * DEC_SUB) is first gathered into the scratch the 2-byte caches widen into
 * (dec_rows). Either way the kernels see the same values in the same order,
 * so a paged cache gives the contiguous cache's bits. */
#include <math.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "format/format.h"
#include "core/partials.h"
#include "runtime/pool.h"
#include "config/tuning.h"

/* Most rows of one kv head served from one pass over its K and V, keys per
 * tile, and most rows (all heads) of a unit. */
enum { DEC_MAX_ROWS = 64, DEC_TILE = 128, DEC_MAX_UNIT_ROWS = 256 };

/* Keys a sub-block: a tile's scores and values run sub-block by sub-block,
 * every head of the unit in turn, so that a cache interleaving the kv heads
 * is read in address order; pages of a multiple of DEC_SUB keys are read in
 * place. The most heads of a unit. */
enum { DEC_SUB = 16, DEC_MAX_HEADS = DEC_MAX_UNIT_ROWS };

/* Keys a call of the integer P V (values_int, its most): each call
 * quantizes P per row and block and scales O once, which at DEC_SUB keys
 * cost as much as the products. */
enum { DEC_VINT_SUB = 64 };

/* Keys a call of the bf16 pairs' P V (values_bf16) from DEC_QBT_ROWS rows
 * a unit: a call rounds P to pairs and puts O's columns back in order once,
 * which at DEC_SUB keys took a third of the kernel (Zen 4, 16 rows, D 128,
 * L1: 29.5 ns a key at 16 keys a call, 20.5 at 64; a bf16 problem's Sq 3
 * step, 12 rows, Skv 16384: 0.95-0.97x the time, 8 rows the same). Fewer
 * rows keep DEC_SUB: their steps read the cache at the memory's rate, and
 * 64 keys a head before the next head's reads the cache out of order
 * (1-position step 1.09x the time). Float8 values, whose widening and
 * products bound the step, take 64 at any rows (a bf16 problem, e4m3
 * cache, 4 rows, Skv 65536: 0.94x the time of 16). */
enum { DEC_VBF_SUB = 64 };

/* Rows a unit from which the bf16 scores run on the query's pair tiles
 * (dec_qbt): a tile of 16 rows costs the same whatever its rows, and the
 * 4 x 4 blocks grow with them (Zen 4, bf16 keys, D 128, 16 keys, L1, ns a
 * key, blocks / tile): 8 rows 17.8 / 21.5, 10 23.2 / 21.8, 12 26.6 /
 * 21.7, 16 36.2 / 23.8. */
enum { DEC_QBT_ROWS = 10 };

/* Both kernels take V's rows by address (dec_v_rows), so a call that
 * crosses pages reads them in place and a paged cache keeps the
 * contiguous one's bits; the most keys a call of either. */
enum { DEC_BY_ADDRESS_SUB = 64 };
_Static_assert((int)DEC_BY_ADDRESS_SUB >= (int)DEC_VINT_SUB && (int)DEC_BY_ADDRESS_SUB >= (int)DEC_VBF_SUB,
               "a call's rows by address");

/* Crossover (fmha_plan_decode_shape): queries at most 16 and keys at least 8
 * per query. Measured with fmha-bench (B = 1, Hq = 32, D = 128, float32,
 * 2 threads, AVX-512, ms auto(decode) / tiled / dense): Sq = 1, Hkv = 8:
 * Skv = 8 0.054/0.12/0.19, 64 0.12/1.2/1.2, 256 0.41/5.3/8.0; Sq = 16,
 * Hkv = 8: Skv = 64 1.63/1.09/0.70, 128 0.97/0.99/1.53, 256 3.8/5.0/7.5,
 * 2048 31/76/128; Hkv = 32: Skv = 64 0.67/0.62/0.59, 128 2.4/2.8/1.8,
 * 512 4.4/14/32 (a busy machine: +-30%). Decode loses at 4 keys a query. */

/* Split-KV: aim for DEC_TASKS tasks in all, chunks of at least the
 * tuning's decode_split_keys (default 256; decode_split_keys_16rows where
 * a unit serves 16 rows or more). The split follows the
 * problem's shape and the tuning, never the thread count, so results are
 * bitwise the same for every thread count under one tuning. */
enum { DEC_TASKS = 64 };

/* Software prefetch (dec_prefetch_head) pays where K and V stream from
 * memory and costs where they sit in cache: it is on when a call's K and V
 * hold more bytes than the tuning's decode_prefetch_bytes, for float32 K
 * and V its decode_prefetch_f32_bytes, for bf16 or f16 K and V its
 * decode_prefetch_h16_bytes (default 8 MiB each, from these
 * figures; design.md, "Decode", has a Xeon's, where float32 loses).
 * Zen 4 (1 MiB L2 a core, 32 MiB L3), Hq 32 / Hkv 8, D 128, 2 threads,
 * ms off / on, alternating: float32 Skv 512 (4 MiB) 0.10-0.13 / 0.15-0.19,
 * 1024 (8 MiB) 0.25-0.29 / 0.28-0.36, 2048 0.51-0.60 / 0.51-0.65, 4096
 * 1.40-1.54 / 1.12-1.23; bf16 1024 0.17-0.23 / 0.19-0.26, 2048 0.33-0.49 /
 * 0.38-0.47, 4096 1.06-1.46 / 0.78-1.05. */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* dst [n] float32 = the n elements of K or V (format f) from element `at`:
 * the format's load kernel (a copy for float32, a widening for 2 bytes). */
static void dec_stage_row(const fmha_cache_format *f, const fmha_uk_cache *kern, int64_t n, const void *src,
                          int64_t at, float *dst) {
    kern->load((size_t)n, (const char *)src + (size_t)at * f->unit_bytes, dst);
}

/* One row (or a key's side-by-side heads) of `values` elements from
 * element `at` of x into dst: its stored bytes (raw) or the format's load
 * into float32 (dec_stage_row). */
static void dec_gather_row(const fmha_cache_format *f, const fmha_uk_cache *kern, int raw, int64_t values,
                           size_t bytes, const void *x, int64_t at, char *dst) {
    if (raw) memcpy(dst, (const char *)x + (size_t)at * f->unit_bytes, bytes);
    else dec_stage_row(f, kern, values, x, at, (float *)(void *)dst);
}

/* 1 if keys [k0, k0 + nk) lie in one page (always without a block table). */
static int dec_one_page(const fmha_problem *p, int64_t k0, int64_t nk) {
    return !p->block_table || k0 / p->page_size == (k0 + nk - 1) / p->page_size;
}

/* Keys a head's prefetch runs ahead of its reads: the tuning's
 * decode_prefetch_ahead_bytes over the unit's heads, in rows of K and V
 * (their mean), whole sub-blocks, at least one. */
static int64_t dec_prefetch_keys(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    const int64_t row = (fmha_format_row_bytes(fmha_cache_format_at(plan->k_format), p->head_dim) +
                         fmha_format_row_bytes(fmha_cache_format_at(plan->v_format), p->head_dim_v) + 1) / 2;
    const int64_t keys = ceil_div(plan->uk->tuning->decode_prefetch_ahead_bytes / plan->drv.dec.heads, row);
    return keys < DEC_SUB ? DEC_SUB : ceil_div(keys, DEC_SUB) * DEC_SUB;
}

int fmha_decode_plan(fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    const fmha_ukernels *uk = plan->uk;
    /* a paged cache takes this driver whatever the strategy and shape */
    if (!p->block_table && (p->strategy != FMHA_STRATEGY_AUTO || !fmha_plan_decode_shape(plan))) return 0;
    if (!uk->decode.softmax) return 0; /* with it, the float32 format's scores and values */
    if (!fmha_plan_rows_contiguous(plan)) return 0;
    const fmha_biases *bs = &p->biases;
    if (bs->dense || bs->rel_table || bs->callback.fill) return 0; /* softcap and ALiBi: fmha_bias_row */
    if (plan->dropout || !fmha_plan_keys_one_range(plan)) return 0;

    int64_t rows = plan->group * p->seq_q;
    plan->drv.dec.units = ceil_div(rows, DEC_MAX_ROWS);
    plan->drv.dec.rows = ceil_div(rows, plan->drv.dec.units);
    /* Caches that interleave the kv heads within a key ([B, S, H, D]) hold
     * one head's key rows a page apart: a unit then takes several heads
     * (a divisor of Hkv), so that a tile reads whole pages, in order. */
    plan->drv.dec.heads = 1;
    if (plan->drv.dec.units == 1 && p->k_strides[2] < p->k_strides[1] && p->v_strides[2] < p->v_strides[1])
        for (int64_t hb = p->heads_kv; hb > 1; hb--)
            if (p->heads_kv % hb == 0 && hb * plan->drv.dec.rows <= DEC_MAX_UNIT_ROWS) {
                plan->drv.dec.heads = hb;
                break;
            }
    int64_t units = p->batch * p->heads_kv / plan->drv.dec.heads * plan->drv.dec.units;
    int64_t splits = ceil_div(DEC_TASKS, units);
    const int64_t min_chunk =
        plan->drv.dec.rows >= 16 ? uk->tuning->decode_split_keys_16rows : uk->tuning->decode_split_keys;
    int64_t most = ceil_div(p->seq_kv, min_chunk);
    if (splits > most) splits = most;
    if (splits < 1) splits = 1;
    plan->drv.dec.chunk = ceil_div(ceil_div(p->seq_kv, splits), DEC_TILE) * DEC_TILE;
    plan->drv.dec.splits = ceil_div(p->seq_kv, plan->drv.dec.chunk);
    const fmha_cache_format *kf = fmha_cache_format_at(plan->k_format), *vf = fmha_cache_format_at(plan->v_format);
    const int64_t kv_bytes = p->batch * p->seq_kv * p->heads_kv *
                             (fmha_format_row_bytes(kf, p->head_dim) + fmha_format_row_bytes(vf, p->head_dim_v));
    const int f32_cache = plan->k_format == FMHA_FORMAT_F32 && plan->v_format == FMHA_FORMAT_F32;
    const int h16_cache = (plan->k_format == FMHA_FORMAT_BF16 || plan->k_format == FMHA_FORMAT_F16) &&
                          (plan->v_format == FMHA_FORMAT_BF16 || plan->v_format == FMHA_FORMAT_F16);
    plan->drv.dec.prefetch = kv_bytes > (f32_cache   ? uk->tuning->decode_prefetch_f32_bytes
                                         : h16_cache ? uk->tuning->decode_prefetch_h16_bytes
                                                     : uk->tuning->decode_prefetch_bytes);
    plan->drv.dec.prefetch_keys = dec_prefetch_keys(plan);
    /* integer dot products: precision FAST, a format that allows them
     * (format.h) and a kernel for it; scores in whole blocks of 32 */
    const int fast = p->precision == FMHA_PRECISION_FAST, blocks = p->head_dim % 32 == 0;
    const fmha_uk_cache *kc = &uk->cache[plan->k_format];
    /* bf16 pairs on a bf16 cache: the query's and P's rounding to bf16 is
     * what a bf16 problem at FAST (P) and a float32 one at BF16 (Q and
     * P) allow, as the tiles of a matrix engine round them */
    const int pairs_allowed = (p->dtype == FMHA_DTYPE_BF16 && plan->precision == FMHA_PRECISION_FAST) ||
                              (p->dtype == FMHA_DTYPE_F32 && plan->precision == FMHA_PRECISION_BF16);
    const int bf16_pairs = pairs_allowed && blocks && plan->k_format == FMHA_FORMAT_BF16 &&
                           plan->v_format == FMHA_FORMAT_BF16 && kc->scores_bf16 &&
                           uk->cache[FMHA_FORMAT_BF16].values_bf16;
    /* float8 keys meet the query rounded to bf16 at FAST (fmha.h) and where
     * the precision rounds it anyway */
    const int fp8_scores = (fast || pairs_allowed) && blocks && kf->fast_bf16 && kc->scores_bf16;
    plan->drv.dec.scores = fast && blocks && kf->fast_integer && kc->scores_q8 ? FMHA_DEC_SCORES_Q8
                       : fp8_scores || bf16_pairs                            ? FMHA_DEC_SCORES_BF16
                                                                             : FMHA_DEC_SCORES_F32;
    plan->drv.dec.vint = fast && vf->fast_integer && uk->cache[plan->v_format].values_int != NULL;
    /* P V on bf16 P: the bf16 pairs, and float8 values where the precision
     * rounds P (a float32 problem's FAST does not: P rounded to bf16 errs
     * more than llama.cpp's q8_0 query, FAST's bound for these caches) */
    plan->drv.dec.vbf16 = bf16_pairs || (pairs_allowed && vf->fast_bf16 && uk->cache[plan->v_format].values_bf16);
    return 1;
}

/* One thread's scratch:
 *   qf [heads][rows][D] float32 query rows, s [heads][rows][TILE] scores / P,
 *   qt [heads][groups of 16 rows][D][16] the query rows transposed (scores_qt),
 *   kf [heads][SUB][D], vf [heads][SUB][Dv] staged sub-blocks (2-byte dtypes, paged caches),
 *   alpha [heads][rows] the tile's rescale, ones [rows] 1s, lo/hi [rows] each
 *   row's visible keys [lo, hi), acc [Dv] the merge's sum */
typedef struct dec_scratch {
    float *qf, *qt, *s, *kf, *vf, *alpha, *ones, *acc;
    int64_t *lo, *hi;
} dec_scratch;

/* Partials in the shared area, per (unit, chunk):
 *   po [units][splits][heads x rows][Dv], pm and pl [units][splits][heads x rows];
 * with integer scores each unit's query rows quantized once a call
 * (fmha_q8_rows): qi [units][heads x rows][D], qd and qsum [units][heads x
 * rows][D / 32]; with bf16 scores rounded, qb [units][heads x rows][D / 2]
 * bf16 pairs; q_ok [units]: 0 when a row holds a NaN or inf (the float32
 * kernels serve); where K's kernel reads them, the integer query's tiles
 * qt [units][heads][groups of 16 rows][fmha_q8_tiles_group_bytes(D)],
 * and where it reads the bf16 pairs with the rows in the lanes, their
 * tiles qbt [units][heads][groups of 16 rows][D / 2][16] */
typedef struct dec_partials {
    float *po, *pm, *pl, *qd;
    int8_t *qi;
    int32_t *qsum, *q_ok;
    uint32_t *qb, *qbt;
    uint8_t *qt;
} dec_partials;

/* Keys a values call: DEC_VINT_SUB for the integer P V, DEC_VBF_SUB for
 * the bf16 pairs' from DEC_QBT_ROWS rows a unit and float8 values on bf16
 * P at any rows, else DEC_SUB. */
static int64_t dec_values_keys(const fmha_plan *plan) {
    if (plan->drv.dec.vint) return DEC_VINT_SUB;
    const int fp8 = fmha_cache_format_at(plan->v_format)->fast_bf16; /* kernels bound these at any rows */
    return plan->drv.dec.vbf16 && (plan->drv.dec.rows >= DEC_QBT_ROWS || fp8) ? DEC_VBF_SUB : DEC_SUB;
}

/* 1 when n rows a call widen rows of format fmt once into float32 rows
 * (fmha_uk_cache.widen_rows) rather than reading them in place. */
static int dec_widen(const fmha_plan *plan, fmha_cache_format_id fmt, int64_t n) {
    const int from = plan->uk->cache[fmt].widen_rows;
    return from > 0 && n >= from;
}

/* 1 when n rows a call take the float32 query's scores with rows in the
 * lanes (fmha_uk_decode.scores_qt) on float32 K rows: read in place from a
 * float32 cache, others widened a sub-block at a time. */
static int dec_qt(const fmha_plan *plan, int64_t n) {
    const fmha_uk_decode *dk = &plan->uk->decode;
    return dk->scores_qt && dk->qt_rows > 0 && n >= dk->qt_rows && plan->drv.dec.scores == FMHA_DEC_SCORES_F32;
}

static void dec_carve(const fmha_plan *plan, fmha_carver *c, dec_scratch *s) {
    size_t rows = (size_t)plan->drv.dec.rows, D = (size_t)plan->p.head_dim, Dv = (size_t)plan->p.head_dim_v;
    /* sub-blocks staged in scratch: formats without in-place kernels,
     * sub-blocks that cross pages, many rows (dec_widen) */
    const fmha_ukernels *uk = plan->uk;
    int staged = !uk->cache[plan->k_format].scores || !uk->cache[plan->v_format].values || plan->p.block_table ||
                 dec_widen(plan, plan->k_format, (int64_t)rows) || dec_widen(plan, plan->v_format, (int64_t)rows) ||
                 dec_qt(plan, (int64_t)rows);
    s->qf = fmha_carve(c, (size_t)plan->drv.dec.heads * rows * D * sizeof(float));
    size_t heads = (size_t)plan->drv.dec.heads;
    s->qt = fmha_carve(c, dec_qt(plan, (int64_t)rows) ? heads * (rows + 15) / 16 * D * 16 * sizeof(float) : 0);
    s->s = fmha_carve(c, heads * rows * DEC_TILE * sizeof(float));
    s->kf = fmha_carve(c, staged ? heads * DEC_SUB * D * sizeof(float) : 0);
    /* [heads][DEC_SUB][Dv] float32 */
    s->vf = fmha_carve(c, staged ? heads * DEC_SUB * Dv * sizeof(float) : 0);
    s->alpha = fmha_carve(c, heads * rows * sizeof(float));
    s->ones = fmha_carve(c, rows * sizeof(float));
    s->lo = fmha_carve(c, rows * sizeof(int64_t));
    s->hi = fmha_carve(c, rows * sizeof(int64_t));
    s->acc = fmha_carve(c, Dv * sizeof(float));
}

/* 1 when the integer scores' kernel reads the query's tiles: kernels
 * that take them from 16 rows a call (AMX tiles, AVX-512 rows in lanes). */
static int dec_q8_tiles(const fmha_plan *plan) {
    return plan->drv.dec.scores == FMHA_DEC_SCORES_Q8 && plan->uk->cache[plan->k_format].q8_tiles &&
           plan->drv.dec.rows >= 16;
}

/* 1 when the bf16 scores run with 16 rows in the lanes on the query's
 * pair tiles (scores_bf16_qt: float8 and bf16 keys, from DEC_QBT_ROWS rows
 * a unit, a tile's rows past them zeros). */
static int dec_qbt(const fmha_plan *plan) {
    return plan->drv.dec.scores == FMHA_DEC_SCORES_BF16 && plan->uk->cache[plan->k_format].scores_bf16_qt &&
           plan->drv.dec.rows >= DEC_QBT_ROWS;
}

/* Words of a unit's pair tiles: [heads][groups of 16 rows][D / 2][16]. */
static size_t dec_qbt_words(const fmha_plan *plan) {
    return (size_t)plan->drv.dec.heads * (size_t)((plan->drv.dec.rows + 15) / 16) * (size_t)(plan->p.head_dim / 2) * 16;
}

/* Unit u's pair tile of head hh, rows [16 g, 16 g + 16). */
static uint32_t *dec_qbt_tile(const fmha_plan *plan, uint32_t *qbt, size_t u, int64_t hh, int64_t g) {
    const size_t groups = (size_t)(plan->drv.dec.rows + 15) / 16, tile = (size_t)(plan->p.head_dim / 2) * 16;
    return qbt + u * dec_qbt_words(plan) + ((size_t)hh * groups + (size_t)g) * tile;
}

/* Bytes of a unit's query tiles (every head's rows in groups of 16). */
static size_t dec_tiles_bytes(const fmha_plan *plan) {
    const size_t groups = (size_t)(plan->drv.dec.rows + 15) / 16;
    return (size_t)plan->drv.dec.heads * groups * fmha_q8_tiles_group_bytes((size_t)plan->p.head_dim);
}

static void dec_carve_shared(const fmha_plan *plan, fmha_carver *c, dec_partials *pt) {
    size_t n = (size_t)(plan->p.batch * plan->p.heads_kv * plan->drv.dec.units * plan->drv.dec.splits) *
               (size_t)plan->drv.dec.rows; /* units x heads = B x Hkv x dec_units */
    pt->po = fmha_carve(c, n * (size_t)plan->p.head_dim_v * sizeof(float));
    pt->pm = fmha_carve(c, n * sizeof(float));
    pt->pl = fmha_carve(c, n * sizeof(float));
    const size_t units = plan->drv.dec.scores ? (size_t)(plan->p.batch * plan->p.heads_kv / plan->drv.dec.heads * plan->drv.dec.units)
                                          : 0;
    const size_t q_rows = units * (size_t)(plan->drv.dec.heads * plan->drv.dec.rows), D = (size_t)plan->p.head_dim;
    const size_t q8 = plan->drv.dec.scores == FMHA_DEC_SCORES_Q8 ? q_rows : 0;
    pt->qi = fmha_carve(c, q8 * D);
    pt->qd = fmha_carve(c, q8 * (D / 32) * sizeof(float));
    pt->qsum = fmha_carve(c, q8 * (D / 32) * sizeof(int32_t));
    pt->qb = fmha_carve(c, (plan->drv.dec.scores == FMHA_DEC_SCORES_BF16 ? q_rows : 0) * (D / 2) * sizeof(uint32_t));
    pt->qt = fmha_carve(c, dec_q8_tiles(plan) ? dec_tiles_bytes(plan) * units : 0);
    pt->qbt = fmha_carve(c, dec_qbt(plan) ? dec_qbt_words(plan) * units * sizeof(uint32_t) : 0);
    pt->q_ok = fmha_carve(c, units * sizeof(int32_t));
}

fmha_ws_size fmha_decode_workspace(const fmha_plan *plan) {
    fmha_carver t = {0}, sh = {0};
    dec_scratch s;
    dec_partials pt;
    dec_carve(plan, &t, &s);
    dec_carve_shared(plan, &sh, &pt);
    return (fmha_ws_size){t.used, sh.used};
}

typedef struct dec_ctx {
    const fmha_plan *plan;
    const void *q, *k, *v;
    void *o;
    float *lse;
    char *ws;
    dec_partials pt;
} dec_ctx;

/* Unit u -> (batch b, first kv head hk of drv.dec.heads, first row rho0, rows n). */
static void dec_unit(const fmha_plan *plan, int64_t u, int64_t *b, int64_t *hk, int64_t *rho0,
                     int64_t *n) {
    int64_t per_b = plan->p.heads_kv / plan->drv.dec.heads * plan->drv.dec.units;
    *b = u / per_b;
    *hk = u % per_b / plan->drv.dec.units * plan->drv.dec.heads;
    *rho0 = u % plan->drv.dec.units * plan->drv.dec.rows;
    int64_t left = plan->group * plan->p.seq_q - *rho0;
    *n = left < plan->drv.dec.rows ? left : plan->drv.dec.rows;
}

/* Keys [lo, hi) query i of batch b sees under the band, key and query
 * lengths. This and dec_scale_columns stay inlined: out of line (GCC's
 * choice once a second caller or the scales' check came) they moved the
 * prefetch functions after them, and the float32 and bf16 steps, whose
 * code had not changed, took 1.08-1.10x the time (Zen 4, code layout). */
static inline __attribute__((always_inline)) void dec_row_range(const fmha_plan *plan, int64_t b, int64_t i,
                                                                int64_t *lo, int64_t *hi) {
    const fmha_masks *m = &plan->p.masks;
    int64_t first, end;
    fmha_band_kv_range(plan, b, i, i, &first, &end);
    if (m->kv_lengths && m->kv_lengths[b] < end) end = m->kv_lengths[b];
    if (m->q_lengths && i >= m->q_lengths[b]) end = first;
    *lo = first;
    *hi = end > first ? end : first;
}

/* The rows of keys [k0, k0 + nj) of K or V (x in format fmt, strides st in
 * its storage units, rows of len values), heads [hk0, hk0 + heads), as the kernels read
 * them: rows[hh] for head hk0 + hh, rows ld elements apart (returned).
 * Rows inside one page of a format with scores/values kernels (unless
 * `widen`: many rows, dec_widen), or read by a kernel of the format's bytes
 * (`raw`: the integer scores), are read in place (*in_place = 1: the
 * caller runs the format's kernels); raw rows
 * that cross pages are gathered as they are stored into buf [nj][heads]
 * [row bytes], so the kernel reads the same bytes. The rest is
 * loaded into buf [nj][heads][len] float32 (the format's load kernel,
 * gathered across pages) in address order: the whole sub-block in one run
 * when it is one in memory (the unit's heads and the keys adjacent, one
 * page), else page run by page run, a key's heads in one copy or row by
 * row (the raw gather's walk); the caller then runs the float32 format's
 * kernels. */
static size_t dec_rows(const dec_ctx *c, fmha_cache_format_id fmt, const int64_t *st, const void *x, int64_t len,
                       int64_t b, int64_t hk0, int64_t heads, int64_t k0, int64_t nj, int raw, int widen, float *buf,
                       const void **rows, int *in_place) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const fmha_cache_format *f = fmha_cache_format_at(fmt);
    const fmha_uk_cache *kern = &plan->uk->cache[fmt];
    const int one_page = dec_one_page(p, k0, nj);
    const int64_t w = heads * len, units = fmha_format_row_units(f, len); /* one staged key; a row stored */
    const int heads_adjacent = heads == 1 || st[2] == units; /* a key's rows of the unit's heads side by side */
    *in_place = one_page && (raw || (kern->scores && !widen));
    if (*in_place) {
        for (int64_t hh = 0; hh < heads; hh++)
            rows[hh] = (const char *)x + (size_t)fmha_kv_row_at(p, st, b, hk0 + hh, k0) * f->unit_bytes;
        return (size_t)st[1];
    }
    /* gathered page run by page run: the stored bytes (raw: [nj][heads]
     * [row bytes], which the format's kernels read as they read the
     * cache) or the format's load into float32 ([nj][heads][len]); a key's
     * heads in one copy when side by side, the whole sub-block in one load
     * when it is one in memory */
    const size_t bytes = (size_t)units * f->unit_bytes;
    const size_t key_out = raw ? (size_t)heads * bytes : (size_t)w * sizeof(float);
    const size_t head_out = raw ? bytes : (size_t)len * sizeof(float);
    char *to = (char *)buf;
    if (!raw && heads_adjacent && st[1] == heads * units && one_page) {
        dec_stage_row(f, kern, nj * w, x, fmha_kv_row_at(p, st, b, hk0, k0), buf);
    } else {
        for (int64_t j = 0; j < nj;) {
            int64_t first;
            const int64_t run = fmha_kv_run_at(p, st, b, k0 + j, nj - j, &first);
            for (int64_t t = 0; t < run; t++, j++) {
                const int64_t at = first + t * st[1] + hk0 * st[2]; /* head hk0's row of key k0 + j */
                char *key_to = to + (size_t)j * key_out;
                if (heads_adjacent) {
                    dec_gather_row(f, kern, raw, w, (size_t)heads * bytes, x, at, key_to);
                    continue;
                }
                for (int64_t hh = 0; hh < heads; hh++)
                    dec_gather_row(f, kern, raw, len, bytes, x, at + hh * st[2], key_to + (size_t)hh * head_out);
            }
        }
    }
    *in_place = raw;
    for (int64_t hh = 0; hh < heads; hh++) rows[hh] = to + (size_t)hh * head_out;
    return raw ? (size_t)(heads * units) : (size_t)w;
}

/* rows[j] = V's row of key k0 + j at kv head hk as stored, j < nj: the
 * integer and bf16 pairs' P V's rows, read in place across pages (a run's
 * keys st[1] apart, one block-table lookup a run). */
static void dec_v_rows(const dec_ctx *c, int64_t b, int64_t hk, int64_t k0, int64_t nj, const void **rows) {
    const fmha_problem *p = &c->plan->p;
    const int64_t *st = p->v_strides;
    const size_t unit = fmha_cache_format_at(c->plan->v_format)->unit_bytes;
    for (int64_t j = 0; j < nj;) {
        int64_t first;
        const int64_t run = fmha_kv_run_at(p, st, b, k0 + j, nj - j, &first);
        for (int64_t t = 0; t < run; t++, j++)
            rows[j] = (const char *)c->v + (size_t)(first + t * st[1] + hk * st[2]) * unit;
    }
}

/* 1 when K's (which 0) or V's (1) format keeps scales beside its rows. */
static int dec_has_scales(const fmha_problem *p, int which) {
    const fmha_cache_format *f = fmha_cache_format_at(fmha_problem_format(p, which));
    return f->scales == FMHA_SCALES_PER_KEY || (f->scales == FMHA_SCALES_PER_HEAD && (which ? p->v_scales : p->k_scales));
}

/* x[r][j] *= the scale of key k0 + j (K's: which 0, V's: 1), r < n, j < nj;
 * rows DEC_TILE apart: the scores by K's scales, P by V's. */
static inline __attribute__((always_inline)) void dec_scale_columns(const fmha_plan *plan, int which, int64_t b,
                                                                    int64_t hk, int64_t k0, int64_t nj, int64_t n,
                                                                    float *x) {
    float sc[DEC_TILE]; /* nj <= a tile */
    fmha_kv_scales_of(&plan->p, which, b, hk, k0, nj, sc);
    if (plan->check_scales && fmha_kv_scales_bad(sc, nj)) __atomic_store_n(plan->bad_scales_at, 1, __ATOMIC_RELAXED);
    plan->uk->rows.scale_columns((size_t)n, (size_t)nj, sc, x, DEC_TILE);
}

/* Asks for head hk's rows of the sub-block at key k0 (keys before `end`) of
 * K or V into L2 (prefetcht2; into L1, prefetcht0, every format lost
 * 1.2-1.8x on Zen 4). dec_prefetch_stream decides which and when: head by
 * head, before each head's kernel, so that the requests spread over the
 * sub-block's work: in one burst of all heads' rows they
 * waited on the fill buffers and lost float32 rows 5-10%. At Skv = 65536,
 * Hq 32 / Hkv 8, D 128, 2 threads on Zen 4 (ms, off / on, alternating,
 * two runs each): float32 24.3 / 19.3-20.8, bf16 18.8-19.1 / 11.1-12.4,
 * f16 18.3-18.4 / 10.7-11.9, int8 17.2-18.1 / 12.4-12.9, fp8_e4m3
 * 19.1-21.2 / 14.9-16.7, q8_0 16.0-16.6 / 12.3-14.1, q4_0 14.0-14.8 /
 * 13.2-13.5; paged bf16 (pages of 16, Skv 16384) 5.2-5.5 / 3.3-3.6. The
 * hardware prefetchers follow one head's rows key after key, but not a
 * walk that reads a few hundred bytes of each head in turn. */
static void dec_prefetch_head(const dec_ctx *c, fmha_cache_format_id fmt, const int64_t *st, const void *x,
                              int64_t len, int64_t b, int64_t hk, int64_t k0, int64_t keys, int64_t end) {
    const fmha_problem *p = &c->plan->p;
    const fmha_cache_format *f = fmha_cache_format_at(fmt);
    const int64_t bytes = fmha_format_row_bytes(f, len);
    const int64_t nj = end - k0 < keys ? end - k0 : keys;
    for (int64_t j = 0; j < nj;) {
        int64_t first;
        const int64_t run = fmha_kv_run_at(p, st, b, k0 + j, nj - j, &first);
        for (int64_t t = 0; t < run; t++, j++) {
            const char *row = (const char *)x + (first + t * st[1] + hk * st[2]) * (int64_t)f->unit_bytes;
            for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(row + at, 0, 1);
        }
    }
}

/* Asks for the per-key scales of K (which 0) or V (1) of keys [k0, k0 +
 * keys) (before `end`), kv heads [hk, hk + heads): a paged cache's pages
 * of scales lie anywhere, and read one page after another they waited on
 * memory (an uneven paged int8 batch, Zen 4: fmha_kv_scales_of 10% of the
 * step). Only where the format keeps them beside its rows per key. */
static void dec_prefetch_scales(const fmha_problem *p, int which, int64_t b, int64_t hk, int64_t heads, int64_t k0,
                                int64_t keys, int64_t end) {
    const fmha_cache_format *f = fmha_cache_format_at(fmha_problem_format(p, which));
    const float *sc = which ? p->v_scales : p->k_scales;
    if (f->scales != FMHA_SCALES_PER_KEY || !sc) return;
    const int64_t *ss = which ? p->v_scale_strides : p->k_scale_strides;
    const int64_t nj = end - k0 < keys ? end - k0 : keys;
    for (int64_t j = 0; j < nj;) {
        int64_t first;
        const int64_t run = fmha_kv_run_at(p, ss, b, k0 + j, nj - j, &first);
        for (int64_t t = 0; t < run; t++, j++) {
            const float *at = sc + first + t * ss[1] + hk * ss[2];
            __builtin_prefetch(at, 0, 1);
            __builtin_prefetch(at + (heads - 1) * ss[2], 0, 1);
        }
    }
}

/* A head's K and V as one stream in the order a task reads them (tile
 * t's K keys, then its V keys), position 2 DEC_TILE t + (0..DEC_TILE for
 * K, DEC_TILE.. for V): asks for the head's rows from *pf up to `until`,
 * DEC_SUB keys a request, and moves *pf there. The reads run
 * dec_prefetch_keys behind, a distance in bytes: one sub-block ahead (16
 * keys) kept 8 KiB of float32 rows in flight a head but only 2 KiB of
 * int8's, too few to cover memory's latency. Zen 4, Skv 65536, Hq 32 /
 * Hkv 8 (8 heads a task), D 128, 2 threads, ms, fastest of 4 alternating,
 * one sub-block ahead (K; V's 64-key sub-blocks one ahead) / 32 / 64 /
 * 128 KiB over the heads: int8 6.70 / 6.69 / 6.11 / 6.26, q8_0 7.69 /
 * 7.00 / 7.03 / 6.98, float32 20.2 / 20.0 / 20.2 / 20.8, bf16 10.8 / 10.7
 * / 10.7 / 10.8; q4_0 and fp8_e4m3, whose kernels bound them, and uneven
 * paged batches did not move. */
static void dec_prefetch_stream(const dec_ctx *c, int64_t b, int64_t hk, int64_t scale_heads, int64_t kb, int64_t ke,
                                int64_t *pf, int64_t until) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    while (*pf < until) {
        const int64_t t = *pf / (2 * DEC_TILE), w = *pf % (2 * DEC_TILE), v = w >= DEC_TILE;
        const int64_t k = kb + t * DEC_TILE + w % DEC_TILE;
        if (k >= ke) { /* past this tile's keys: its V, or the end */
            if (v || kb + t * DEC_TILE >= ke) {
                *pf = INT64_MAX;
                return;
            }
            *pf = 2 * DEC_TILE * t + DEC_TILE;
            continue;
        }
        if (v) dec_prefetch_head(c, plan->v_format, p->v_strides, c->v, p->head_dim_v, b, hk, k, DEC_SUB, ke);
        else dec_prefetch_head(c, plan->k_format, p->k_strides, c->k, p->head_dim, b, hk, k, DEC_SUB, ke);
        if (scale_heads) dec_prefetch_scales(p, v, b, hk, scale_heads, k, DEC_SUB, ke);
        *pf += DEC_SUB;
    }
}

/* The query rows of a unit (batch b, kv heads from hk0, rows [rho0, rho0 + n)
 * of each), widened: qf [heads][rows][D]. */
static void dec_load_query(const dec_ctx *c, int64_t b, int64_t hk0, int64_t rho0, int64_t n, float *qf) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t *qs = p->q_strides, D = p->head_dim;
    for (int64_t hh = 0; hh < plan->drv.dec.heads; hh++)
        for (int64_t r = 0; r < n; r++) {
            int64_t i = (rho0 + r) / plan->group, h = (hk0 + hh) * plan->group + (rho0 + r) % plan->group;
            int64_t first = b * qs[0] + i * qs[1] + h * qs[2];
            fmha_load_row_uk(plan->uk, c->q, p->dtype, first, qs[3], D, qf + (hh * plan->drv.dec.rows + r) * D);
        }
}

/* qt [heads][groups of 16][D][16] = the query rows qf [heads][rows][D]
 * transposed (the table's transposing copy), lanes past the unit's n
 * rows 0. */
static void dec_transpose_query(const fmha_ukernels *uk, const float *qf, int64_t heads, int64_t rows, int64_t n,
                                int64_t D, float *qt) {
    const int64_t groups = (rows + 15) / 16;
    for (int64_t hh = 0; hh < heads; hh++)
        for (int64_t g = 0; g < groups; g++) {
            float *to = qt + (hh * groups + g) * D * 16;
            const int64_t nr = n - 16 * g < 16 ? n - 16 * g : 16;
            if (nr < 16) memset(to, 0, (size_t)(D * 16) * sizeof(float));
            if (nr > 0) uk->rows.transpose((size_t)nr, (size_t)D, qf + (hh * rows + 16 * g) * D, (size_t)D, to, 16);
        }
}

/* Unit u's query rows quantized for the integer scores (the shared qi,
 * qd, qsum) or rounded to bf16 pairs (qb), once a call for every chunk;
 * q_ok[u] 0 when a row is not finite. */
static void dec_quantize_task(void *vctx, size_t unit, int thread) {
    const dec_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const int64_t D = plan->p.head_dim, rows = plan->drv.dec.rows;
    int64_t b, hk0, rho0, n;
    dec_unit(plan, (int64_t)unit, &b, &hk0, &rho0, &n);
    dec_scratch s;
    fmha_carver carver = {c->ws + (size_t)thread * plan->thread_bytes, 0};
    dec_carve(plan, &carver, &s);
    dec_load_query(c, b, hk0, rho0, n, s.qf);
    int ok = 1;
    const size_t first = unit * (size_t)(plan->drv.dec.heads * rows);
    for (int64_t hh = 0; hh < plan->drv.dec.heads; hh++)
        for (int64_t r = 0; r < n; r++) {
            const size_t x = first + (size_t)(hh * rows + r);
            const float *row = s.qf + (hh * rows + r) * D;
            if (plan->drv.dec.scores == FMHA_DEC_SCORES_Q8) {
                ok &= fmha_q8_quantize_row(row, D, c->pt.qi + x * (size_t)D, c->pt.qd + x * (size_t)(D / 32),
                                           c->pt.qsum + x * (size_t)(D / 32));
                continue;
            }
            uint32_t *pairs = c->pt.qb + x * (size_t)(D / 2);
            float finite = 0.0f; /* x * 0: 0 for finite x, NaN otherwise */
            for (int64_t e = 0; e < D; e += 2) {
                finite += row[e] * 0.0f + row[e + 1] * 0.0f;
                pairs[e / 2] = (uint32_t)fmha_f32_to_bf16(row[e]) | (uint32_t)fmha_f32_to_bf16(row[e + 1]) << 16;
            }
            /* float8 keys: a row not finite keeps the float32 kernels (fmha.h);
             * bf16 pairs against bf16 keys carry NaN and inf as the float32
             * products do, so such a row changes no other row's bits */
            if (plan->k_format != FMHA_FORMAT_BF16) ok &= finite == 0.0f;
        }
    if (dec_qbt(plan)) /* the pair tiles: qbt [heads][groups][D / 2][16], rows past n 0 */
        for (int64_t hh = 0; hh < plan->drv.dec.heads; hh++)
            for (int64_t g = 0; 16 * g < rows; g++) {
                uint32_t *tile = dec_qbt_tile(plan, c->pt.qbt, unit, hh, g);
                for (int64_t r = 0; r < 16; r++) {
                    if (16 * g + r >= n) { /* past the unit's rows: zeros, no pair row to read */
                        for (int64_t p2 = 0; p2 < D / 2; p2++) tile[p2 * 16 + r] = 0;
                        continue;
                    }
                    const uint32_t *pairs = c->pt.qb + (first + (size_t)(hh * rows + 16 * g + r)) * (size_t)(D / 2);
                    for (int64_t p2 = 0; p2 < D / 2; p2++) tile[p2 * 16 + r] = pairs[p2];
                }
            }
    if (ok && dec_q8_tiles(plan)) /* the tiles the kernel reads, head by head */
        for (int64_t hh = 0; hh < plan->drv.dec.heads; hh++) {
            const size_t x = first + (size_t)(hh * rows), tb = dec_tiles_bytes(plan) / (size_t)plan->drv.dec.heads;
            const fmha_q8_rows qq = {c->pt.qi + x * (size_t)D, c->pt.qd + x * (size_t)(D / 32),
                                     c->pt.qsum + x * (size_t)(D / 32), (size_t)D, NULL};
            fmha_q8_tiles_pack((size_t)n, (size_t)D, &qq, c->pt.qt + unit * dec_tiles_bytes(plan) + (size_t)hh * tb);
        }
    c->pt.q_ok[unit] = ok;
}

/* Keys [k0, k0 + nj) of kv head hk scored again in float32 from their
 * dequantised values, as the float path scores them, where an integer
 * score came out not finite: the integer sums are exact and finite, so
 * only a block's NaN or inf d (data, fmha.h) gets there, and d x sum
 * would follow other rules than the float path's per-element products
 * (inf x 0 is NaN there). sh [n][DEC_TILE] holds the scores. */
static void dec_rescore_nonfinite(const dec_ctx *c, int64_t b, int64_t hk, int64_t rho0, int64_t n, int64_t k0,
                                  int64_t nj, float *sh) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const fmha_f32_nonfinite_ukernel_fn nonfinite = plan->uk->rows.nonfinite;
    if (!nonfinite((size_t)n, (size_t)nj, sh, DEC_TILE)) return; /* every call but the rare one */
    const fmha_cache_format *kf = fmha_cache_format_at(plan->k_format);
    const int64_t *qs = p->q_strides, D = p->head_dim;
    for (int64_t j = 0; j < nj; j++) {
        if (!nonfinite((size_t)n, 1, sh + j, DEC_TILE)) continue; /* key j's column */
        const char *krow = (const char *)c->k + (size_t)fmha_kv_row_at(p, p->k_strides, b, hk, k0 + j) * kf->unit_bytes;
        for (int64_t r = 0; r < n; r++) {
            const int64_t i = (rho0 + r) / plan->group, h = hk * plan->group + (rho0 + r) % plan->group;
            float dot = 0.0f;
            for (int64_t e = 0; e < D; e++)
                dot += fmha_load(c->q, p->dtype, b * qs[0] + i * qs[1] + h * qs[2] + e * qs[3]) * kf->dequant(krow, e);
            sh[r * DEC_TILE + j] = plan->scale * dot;
        }
    }
}

static void dec_split_task(void *vctx, size_t task, int thread) {
    const dec_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const fmha_ukernels *uk = plan->uk;
    const int64_t D = p->head_dim, Dv = p->head_dim_v, group = plan->group;
    const int64_t heads = plan->drv.dec.heads, rows = plan->drv.dec.rows;
    const int64_t unit = (int64_t)task / plan->drv.dec.splits, split = (int64_t)task % plan->drv.dec.splits;
    int64_t b, hk0, rho0, n;
    dec_unit(plan, unit, &b, &hk0, &rho0, &n);

    dec_scratch s;
    fmha_carver carver = {c->ws + (size_t)thread * plan->thread_bytes, 0};
    dec_carve(plan, &carver, &s);
    /* this task's partial: o [heads][rows][Dv], m, l [heads][rows] */
    size_t slot = (size_t)task * (size_t)(heads * rows);
    float *po = c->pt.po + slot * (size_t)Dv, *pm = c->pt.pm + slot, *pl = c->pt.pl + slot;
    memset(po, 0, (size_t)(heads * rows * Dv) * sizeof(float));
    for (int64_t x = 0; x < heads * rows; x++) {
        pm[x] = -INFINITY;
        pl[x] = 0.0f;
    }

    /* the chunk's keys any row sees: [kb, ke); a row's range depends only
     * on its query, so every head shares lo/hi */
    int64_t kb = split * plan->drv.dec.chunk, ke = kb + plan->drv.dec.chunk;
    if (ke > p->seq_kv) ke = p->seq_kv;
    int64_t any_lo = INT64_MAX, any_hi = INT64_MIN;
    for (int64_t r = 0; r < n; r++) {
        dec_row_range(plan, b, (rho0 + r) / group, &s.lo[r], &s.hi[r]);
        if (s.lo[r] < s.hi[r]) {
            if (s.lo[r] < any_lo) any_lo = s.lo[r];
            if (s.hi[r] > any_hi) any_hi = s.hi[r];
        }
    }
    if (any_lo > kb) kb = any_lo;
    if (any_hi < ke) ke = any_hi;
    if (kb >= ke) return;
    kb = kb / DEC_TILE * DEC_TILE; /* tiles on the chunk's grid */

    /* query rows: widened, qf [heads][rows][D], or quantized once a call
     * (dec_quantize_task) for the integer scores */
    const int qscores = plan->drv.dec.scores && c->pt.q_ok[unit] ? plan->drv.dec.scores : FMHA_DEC_SCORES_F32;
    const size_t q_at = (size_t)(unit * heads * rows); /* this unit's first quantized row */
    if (!qscores) dec_load_query(c, b, hk0, rho0, n, s.qf);
    /* many rows on the float32 query: rows in the lanes (scores_qt), the
     * query transposed once a task, K float32 rows */
    const int qt = !qscores && dec_qt(plan, n);
    /* bf16 scores on the query's pair tiles (made by dec_quantize_task) */
    const int qbt = qscores == FMHA_DEC_SCORES_BF16 && dec_qbt(plan);
    const int64_t groups = (rows + 15) / 16;
    if (qt) dec_transpose_query(uk, s.qf, heads, rows, n, D, s.qt);

    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    long long computed = 0;
    /* the formats' kernels for rows read in place, the float32 format's for staged rows */
    const fmha_uk_cache *k_kern = &uk->cache[plan->k_format], *v_kern = &uk->cache[plan->v_format];
    const fmha_uk_cache *staged = &uk->cache[FMHA_FORMAT_F32];
    const int k_scaled = dec_has_scales(p, 0), v_scaled = dec_has_scales(p, 1);
    /* K's scale one a kv head (float8): folded into the scores' scale, no pass over the scores */
    const int k_per_head = k_scaled && fmha_cache_format_at(plan->k_format)->scales == FMHA_SCALES_PER_HEAD;
    float head_scale[DEC_MAX_HEADS];
    for (int64_t hh = 0; hh < heads; hh++) {
        float sc = 1.0f;
        if (k_per_head) fmha_kv_scales_of(p, 0, b, hk0 + hh, 0, 1, &sc);
        head_scale[hh] = plan->scale * sc;
    }
    const int64_t vsub = dec_values_keys(plan);
    /* many rows: narrow rows widened once for all the kernels' row blocks */
    const int widen_k = dec_widen(plan, plan->k_format, n) || (qt && plan->k_format != FMHA_FORMAT_F32),
              widen_v = dec_widen(plan, plan->v_format, n);
    for (int64_t r = 0; r < rows; r++) s.ones[r] = 1.0f;
    /* prefetch: each head's stream position requested so far, prefetch_keys ahead of its reads */
    int64_t pf[DEC_MAX_HEADS];
    for (int64_t hh = 0; hh < heads; hh++) pf[hh] = 0;
    const int64_t pf_ahead = plan->drv.dec.prefetch_keys;
    for (int64_t k0 = kb; k0 < ke; k0 += DEC_TILE) {
        const int64_t at = (k0 - kb) / DEC_TILE * 2 * DEC_TILE; /* this tile's stream position */
        int64_t nk = ke - k0 < DEC_TILE ? ke - k0 : DEC_TILE;
        /* K and V one sub-block at a time: in place, or staged (dec_rows) */
        const void *rows_of[DEC_MAX_HEADS];
        int in_place;
        /* scores: keys in sub-blocks, every head of a sub-block in turn,
         * so that a cache interleaving the heads is read in address order */
        for (int64_t j0 = 0; j0 < nk; j0 += DEC_SUB) {
            const int64_t nj = nk - j0 < DEC_SUB ? nk - j0 : DEC_SUB;
            size_t ld = dec_rows(c, plan->k_format, ks, c->k, D, b, hk0, heads, k0 + j0, nj, qscores != 0, widen_k,
                                 s.kf, rows_of, &in_place);
            const fmha_cache_scores_ukernel_fn scores = in_place ? k_kern->scores : staged->scores;
            for (int64_t hh = 0; hh < heads; hh++) {
                if (plan->drv.dec.prefetch)
                    dec_prefetch_stream(c, b, hk0 + hh, hh ? 0 : heads, kb, ke, &pf[hh], at + j0 + DEC_SUB + pf_ahead);
                const float *qh = s.qf + hh * rows * D;
                float *sh = s.s + hh * rows * DEC_TILE + j0;
                const size_t x = q_at + (size_t)(hh * rows); /* its first quantized row */
                const float scale = head_scale[hh];
                if (qscores == FMHA_DEC_SCORES_Q8) {
                    const size_t tb = dec_tiles_bytes(plan) / (size_t)heads; /* a head's tiles */
                    const fmha_q8_rows qq = {c->pt.qi + x * (size_t)D, c->pt.qd + x * (size_t)(D / 32),
                                             c->pt.qsum + x * (size_t)(D / 32), (size_t)D,
                                             dec_q8_tiles(plan) ? c->pt.qt + (size_t)unit * dec_tiles_bytes(plan) + (size_t)hh * tb
                                                                : NULL};
                    k_kern->scores_q8((size_t)n, (size_t)nj, (size_t)D, &qq, rows_of[hh], ld, sh, DEC_TILE, scale);
                    dec_rescore_nonfinite(c, b, hk0 + hh, rho0, n, k0 + j0, nj, sh);
                } else if (qbt) { /* rows in the lanes */
                    for (int64_t g = 0; 16 * g < n; g++)
                        k_kern->scores_bf16_qt((size_t)(n - 16 * g < 16 ? n - 16 * g : 16), (size_t)nj, (size_t)D,
                                               dec_qbt_tile(plan, c->pt.qbt, (size_t)unit, hh, g), rows_of[hh], ld,
                                               sh + 16 * g * DEC_TILE, DEC_TILE, scale);
                } else if (qscores == FMHA_DEC_SCORES_BF16) {
                    k_kern->scores_bf16((size_t)n, (size_t)nj, (size_t)D, c->pt.qb + x * (size_t)(D / 2),
                                        (size_t)(D / 2), rows_of[hh], ld, sh, DEC_TILE, scale);
                } else if (qt) { /* float32 rows, in place or staged */
                    for (int64_t g = 0; g < groups && 16 * g < n; g++)
                        uk->decode.scores_qt((size_t)(n - 16 * g < 16 ? n - 16 * g : 16), (size_t)nj, (size_t)D,
                                             s.qt + (hh * groups + g) * D * 16, rows_of[hh], ld,
                                             sh + 16 * g * DEC_TILE, DEC_TILE, scale);
                } else {
                    scores((size_t)n, (size_t)nj, (size_t)D, qh, (size_t)D, rows_of[hh], ld, sh, DEC_TILE, scale);
                }
            }
        }
        for (int64_t hh = 0; hh < heads; hh++) {
            float *sh = s.s + hh * rows * DEC_TILE;
            /* K's per-key scales, and V's once the softmax has taken P's
             * sums, over the tile's keys: once a tile, not a sub-block */
            if (k_scaled && !k_per_head) dec_scale_columns(plan, 0, b, hk0 + hh, k0, nk, n, sh);
            /* softcap and ALiBi; -inf outside each row's keys */
            for (int64_t r = 0; r < n; r++) {
                float *row = sh + r * DEC_TILE;
                if (plan->has_bias)
                    fmha_bias_row(plan, b, (rho0 + r) / group, (hk0 + hh) * group + (rho0 + r) % group, k0, nk,
                                  row);
                for (int64_t j = 0; j < nk && k0 + j < s.lo[r]; j++) row[j] = -INFINITY;
                for (int64_t j = s.hi[r] - k0 > 0 ? s.hi[r] - k0 : 0; j < nk; j++) row[j] = -INFINITY;
            }
            uk->decode.softmax((size_t)n, (size_t)nk, sh, DEC_TILE, pm + hh * rows, pl + hh * rows,
                               s.alpha + hh * rows);
            if (v_scaled) dec_scale_columns(plan, 1, b, hk0 + hh, k0, nk, n, sh);
        }
        /* values in the same order; the first sub-block rescales O by alpha */
        for (int64_t j0 = 0; j0 < nk; j0 += vsub) {
            const int64_t nj = nk - j0 < vsub ? nk - j0 : vsub;
            /* the integer and bf16 pairs' P V read their rows where they
             * are (dec_v_rows), the others as dec_rows gives them */
            const int by_address = plan->drv.dec.vint || plan->drv.dec.vbf16;
            size_t ld = by_address ? 0
                                   : dec_rows(c, plan->v_format, vs, c->v, Dv, b, hk0, heads, k0 + j0, nj, 0, widen_v,
                                              s.vf, rows_of, &in_place);
            const fmha_cache_values_ukernel_fn values = in_place ? v_kern->values : staged->values;
            for (int64_t hh = 0; hh < heads; hh++) {
                if (plan->drv.dec.prefetch)
                    dec_prefetch_stream(c, b, hk0 + hh, hh ? 0 : heads, kb, ke, &pf[hh],
                                        at + DEC_TILE + j0 + nj + pf_ahead);
                float *ph = s.s + hh * rows * DEC_TILE + j0;
                const float *ah = j0 == 0 ? s.alpha + hh * rows : s.ones;
                float *oh = po + hh * rows * Dv;
                if (by_address) {
                    const void *v_rows[DEC_BY_ADDRESS_SUB];
                    dec_v_rows(c, b, hk0 + hh, k0 + j0, nj, v_rows);
                    if (plan->drv.dec.vint)
                        v_kern->values_int((size_t)n, (size_t)nj, (size_t)Dv, ph, DEC_TILE, v_rows, oh, (size_t)Dv, ah);
                    else
                        v_kern->values_bf16((size_t)n, (size_t)nj, (size_t)Dv, ph, DEC_TILE, v_rows, oh, (size_t)Dv,
                                            ah);
                } else {
                    values((size_t)n, (size_t)nj, (size_t)Dv, ph, DEC_TILE, rows_of[hh], ld, oh, (size_t)Dv, ah);
                }
            }
        }
        computed += heads;
    }
    fmha_tiles_count(computed);
}

/* Merge of a unit's chunks, in chunk order; writes O and lse. */
/* Row (b, query i, head h) once more, one key at a time, for a row whose
 * softmax sum is finite but whose output is not (a NaN or inf in V): the
 * value sum takes only the keys the row sees (score not -inf), so a value
 * its mask hides never reaches it. acc [Dv] gets the unnormalised O; *m and *l the row's max and
 * sum. Rare: never on finite inputs. */
static void dec_row_guarded(const dec_ctx *c, int64_t b, int64_t i, int64_t h, float *acc, float *m_out,
                            float *l_out, int thread) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t *qs = p->q_strides, *ks = p->k_strides, *vs = p->v_strides;
    const int64_t hk = h / plan->group, D = p->head_dim, Dv = p->head_dim_v;
    const fmha_cache_format *kf = fmha_cache_format_at(plan->k_format), *vf = fmha_cache_format_at(plan->v_format);
    const size_t k_esize = kf->unit_bytes, v_esize = vf->unit_bytes;
    float m = -INFINITY, l = 0.0f, s[DEC_TILE], k_sc[DEC_TILE], v_sc[DEC_TILE];
    for (int64_t e = 0; e < Dv; e++) acc[e] = 0.0f;
    fmha_tile_pos t = {b, h, i, 1, 0, 0};
    int64_t kb, ke;
    fmha_mask_kv_range(plan, &t, &kb, &ke);
    for (int64_t k0 = kb; k0 < ke; k0 += DEC_TILE) {
        t.k0 = k0;
        t.nk = ke - k0 < DEC_TILE ? ke - k0 : DEC_TILE;
        fmha_kv_scales_of(p, 0, b, hk, k0, t.nk, k_sc);
        fmha_kv_scales_of(p, 1, b, hk, k0, t.nk, v_sc);
        for (int64_t r = 0; r < t.nk; r++) {
            float dot = 0.0f;
            const char *krow = (const char *)c->k + (size_t)fmha_kv_row_at(p, ks, b, hk, k0 + r) * k_esize;
            for (int64_t d = 0; d < D; d++)
                dot += fmha_load(c->q, p->dtype, b * qs[0] + i * qs[1] + h * qs[2] + d * qs[3]) * kf->dequant(krow, d);
            s[r] = plan->scale * dot * k_sc[r];
        }
        if (plan->has_bias) fmha_bias_row(plan, b, i, h, k0, t.nk, s);
        fmha_mask_apply(plan, &t, s, 1, NULL, thread);
        float mx = m;
        for (int64_t r = 0; r < t.nk; r++) mx = fmaxf(mx, s[r]);
        if (mx == -INFINITY) continue;
        float alpha = expf(m - mx);
        l *= alpha;
        for (int64_t e = 0; e < Dv; e++) acc[e] *= alpha;
        for (int64_t r = 0; r < t.nk; r++) {
            if (s[r] == -INFINITY) continue; /* masked, or a -inf score: hidden */
            float pr = expf(s[r] - mx); /* one that underflows to 0 still multiplies V (0 x NaN) */
            l += pr;
            const char *vrow = (const char *)c->v + (size_t)fmha_kv_row_at(p, vs, b, hk, k0 + r) * v_esize;
            for (int64_t e = 0; e < Dv; e++) acc[e] += pr * v_sc[r] * vf->dequant(vrow, e);
        }
        m = mx;
    }
    *m_out = m;
    *l_out = l;
}

static void dec_merge_task(void *vctx, size_t unit, int thread) {
    const dec_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t Dv = p->head_dim_v, splits = plan->drv.dec.splits;
    const int64_t per_split = plan->drv.dec.heads * plan->drv.dec.rows; /* rows of a partial */
    const int64_t *os = p->o_strides;
    int64_t b, hk0, rho0, n;
    dec_unit(plan, (int64_t)unit, &b, &hk0, &rho0, &n);
    size_t first = unit * (size_t)(splits * per_split);
    dec_scratch s;
    fmha_carver carver = {c->ws + (size_t)thread * plan->thread_bytes, 0};
    dec_carve(plan, &carver, &s);
    float *acc = s.acc;
    for (int64_t hh = 0; hh < plan->drv.dec.heads; hh++)
        for (int64_t r = 0; r < n; r++) {
            const int64_t x = hh * plan->drv.dec.rows + r; /* row of the partials */
            int64_t i = (rho0 + r) / plan->group, h = (hk0 + hh) * plan->group + (rho0 + r) % plan->group;
            float mx = -INFINITY;
            for (int64_t sp = 0; sp < splits; sp++) {
                float pm = c->pt.pm[first + (size_t)(sp * per_split + x)];
                mx = fmha_partials_max(mx, pm);
            }
            int64_t orow = b * os[0] + i * os[1] + h * os[2];
            float inv, row_lse;
            if (mx == -INFINITY) { /* no key: O = 0, lse = -inf (or the sink's) */
                fmha_row_finish(plan, h, mx, 0.0f, &inv, &row_lse);
                for (int64_t e = 0; e < Dv; e++) fmha_store(c->o, plan->o_dtype, orow + e * os[3], 0.0f);
                if (c->lse) c->lse[(b * p->heads_q + h) * p->seq_q + i] = row_lse;
                continue;
            }
            /* acc = sum_c w_c O_c, l = sum_c w_c l_c */
            float l = 0.0f;
            for (int64_t e = 0; e < Dv; e++) acc[e] = 0.0f;
            for (int64_t sp = 0; sp < splits; sp++) {
                size_t at = first + (size_t)(sp * per_split + x);
                float pmx = c->pt.pm[at];
                if (!fmha_partial_counts(pmx)) continue;
                float w = expf(pmx - mx);
                l = fmaf(w, c->pt.pl[at], l);
                const float *po = c->pt.po + at * (size_t)Dv;
                plan->uk->rows.axpy((size_t)Dv, w, po, acc);
            }
            float finite = 0.0f; /* x * 0: 0 for finite x, NaN otherwise */
            for (int64_t e = 0; e < Dv; e++) finite += acc[e] * 0.0f;
            if (finite != 0.0f && isfinite(l)) dec_row_guarded(c, b, i, h, acc, &mx, &l, thread);
            fmha_row_finish(plan, h, mx, l, &inv, &row_lse);
            for (int64_t e = 0; e < Dv; e++)
                fmha_store(c->o, plan->o_dtype, orow + e * os[3], acc[e] * inv);
            if (c->lse) c->lse[(b * p->heads_q + h) * p->seq_q + i] = row_lse;
        }
}

void fmha_decode_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse,
                     char *ws) {
    fmha_carver sh = {ws + (size_t)run->threads * run->thread_bytes, 0};
    int bad_scales = 0;
    run->bad_scales_at = &bad_scales;
    dec_ctx c = {run, q, k, v, o, lse, ws, {0}};
    dec_carve_shared(run, &sh, &c.pt);
    size_t units = (size_t)(run->p.batch * run->p.heads_kv / run->drv.dec.heads * run->drv.dec.units);
    if (run->drv.dec.scores) fmha_run_parallel(run, units, dec_quantize_task, &c);
    fmha_run_parallel(run, units * (size_t)run->drv.dec.splits, dec_split_task, &c);
    run->bad_scales = run->check_scales && __atomic_load_n(&bad_scales, __ATOMIC_RELAXED);
    if (!run->bad_scales) fmha_run_parallel(run, units, dec_merge_task, &c);
}

int fmha_decode_reads_scales(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    if (!(dec_has_scales(p, 0) || dec_has_scales(p, 1))) return 0;
    for (int which = 0; which < 2; which++)
        if (dec_has_scales(p, which) &&
            fmha_cache_format_at(fmha_problem_format(p, which))->scales != FMHA_SCALES_PER_KEY)
            return 0;
    /* per sequence: a unit reads, for each of its kv heads, the hull of its
     * rows' key ranges from its first tile (dec_split_task); the hulls of
     * the units of rows must cover the sequence's keys */
    const int64_t rows = plan->group * p->seq_q;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t keys = p->masks.kv_lengths ? p->masks.kv_lengths[b] : p->seq_kv;
        int64_t covered = 0, grew = 1;
        while (covered < keys && grew) {
            grew = 0;
            for (int64_t rho0 = 0; rho0 < rows; rho0 += plan->drv.dec.rows) {
                const int64_t n = rows - rho0 < plan->drv.dec.rows ? rows - rho0 : plan->drv.dec.rows;
                int64_t lo = INT64_MAX, hi = INT64_MIN;
                for (int64_t i = rho0 / plan->group; i <= (rho0 + n - 1) / plan->group; i++) {
                    int64_t l, h;
                    dec_row_range(plan, b, i, &l, &h);
                    if (l < h) lo = l < lo ? l : lo, hi = h > hi ? h : hi;
                }
                if (lo < hi && lo / DEC_TILE * DEC_TILE <= covered && hi > covered) covered = hi, grew = 1;
            }
        }
        if (covered < keys) return 0;
    }
    return 1;
}
