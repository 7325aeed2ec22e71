/* amx/attn.c: attention on the tiles (the matrix part of the amx table,
 * contract and layouts in ukernel.h): Q, K, V and P tile-shaped end to
 * end, the online softmax in AVX-512 on the scores straight from
 * tilestored. Built twice, like amx.c: on the hardware and (amx_emu) on
 * the software tile unit.
 *
 * One query block = 32 rows, two A tiles per k-step. Tiles (the one
 * configuration of amx.c, every tile 16 x 64 bytes):
 *   S = Q K^T   tmm0..3 C (rows 0-15 / 16-31 x keys 0-15 / 16-31 of a
 *               32-key step), tmm4, tmm5 A (Q rows), tmm6, tmm7 B (K^T)
 *   O += P V    tmm0..3 C (O rows x 32 columns, loaded from and stored to
 *               the float32 O in memory), tmm4, tmm5 A (P rows, bf16 pairs
 *               along keys), tmm6, tmm7 B (V, pairs of keys x 16 columns)
 * Per key block the scores go to memory once (float32 [32][block_kv]), the
 * softmax reads them, and writes P once as bf16 [32][block_kv], which is
 * the A layout of the value product.
 *
 * Softmax (per row, keys along the row): the block's maximum M over the
 * visible keys (masks as lane masks, only where a row's [lo, hi) cuts the
 * block); the row's reference m_ref moves to M only when M passes it by
 * more than rescale_log2 / scale_log2 (then O's row and the sums are scaled
 * by 2^((m_ref - M) scale_log2)); P = 2^(s scale_log2 - m_ref scale_log2),
 * one FMA, then 2^t as 2^floor(t) p(t - floor(t)) with a degree-4
 * polynomial (3.0e-6 relative: P is rounded to bf16, 2e-3, next, but l
 * sums the unrounded P and lse = m + log l keeps 1e-5), in instructions
 * that issue on port 5 (a tile product holds port 0); the sums l stay 16
 * partial sums a row until the end. A row
 * whose m_ref is -inf uses 0 in its place (no key seen yet, or every score
 * -inf): -inf scores give P = 0, NaN gives NaN. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "amx.h"
#include "attn_common.h"
#include "tile.h"

/* ---- packing ---- */

void FMHA_AMX_FN(fmha_matrix_pack_q)(size_t nq, size_t d, const void *const *rows, int src, ptrdiff_t cs, int negate,
                                     uint32_t *hi, uint32_t *lo) {
    const size_t dp = fmha_matrix_dp(d), steps = dp / 16;
    /* the sign of every bf16 (the padding's zeros become -0: they meet K's zeros) */
    const __m512i sign = _mm512_set1_epi32(negate ? (int)0x80008000u : 0);
    for (size_t i = 0; i < nq; i++) prefetch_row(rows[i], cs, d * src_bytes(src));
    for (size_t i = 0; i < ATTN_BQ; i++)
        for (size_t t = 0; t < steps; t++) {
            const size_t at = (t * ATTN_BQ + i) * 16;
            __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512();
            if (i < nq) {
                row_chunk(rows[i], src, cs, d, t, &h, lo ? &l : NULL);
                h = _mm512_xor_si512(h, sign);
                l = _mm512_xor_si512(l, sign);
            }
            _mm512_storeu_si512(hi + at, h);
            if (lo) _mm512_storeu_si512(lo + at, l);
        }
}

void FMHA_AMX_FN(fmha_matrix_pack_k)(size_t nk, size_t d, const void *k, int src, ptrdiff_t rs, ptrdiff_t cs,
                                     uint32_t *hi, uint32_t *lo) {
    const size_t dp = fmha_matrix_dp(d), tiles = (nk + 31) / 32 * 2, es = src_bytes(src);
    for (size_t j = 0; j < 16 && j < nk; j++) prefetch_row((const char *)k + (ptrdiff_t)j * rs * (ptrdiff_t)es, cs, d * es);
    for (size_t jt = 0; jt < tiles; jt++) {
        for (size_t j = (jt + 1) * 16; j < (jt + 2) * 16 && j < nk; j++) /* the next tile's keys */
            prefetch_row((const char *)k + (ptrdiff_t)j * rs * (ptrdiff_t)es, cs, d * es);
        for (size_t c = 0; c < dp / 16; c++) {
            __m512i mh[16], ml[16];
            for (size_t r = 0; r < 16; r++) {
                const size_t j = jt * 16 + r;
                mh[r] = ml[r] = _mm512_setzero_si512();
                if (j < nk) row_chunk((const char *)k + (ptrdiff_t)j * rs * (ptrdiff_t)es, src, cs, d, c, &mh[r], lo ? &ml[r] : NULL);
            }
            transpose_16x16(mh);
            for (size_t p = 0; p < 16; p++) _mm512_storeu_si512(hi + (jt * dp + 16 * c + p) * 16, mh[p]);
            if (lo) {
                transpose_16x16(ml);
                for (size_t p = 0; p < 16; p++) _mm512_storeu_si512(lo + (jt * dp + 16 * c + p) * 16, ml[p]);
            }
        }
    }
}

void FMHA_AMX_FN(fmha_matrix_pack_v)(size_t nk, size_t dv, const void *v, int src, ptrdiff_t rs, ptrdiff_t cs,
                                     uint32_t *hi, uint32_t *lo) {
    const size_t dvp = fmha_matrix_dvp(dv), ctiles = dvp / 16, ksteps = (nk + 31) / 32, es = src_bytes(src);
    /* words 0-15 and 16-31 of two rows' 32 elements interleaved */
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                            6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23,
                                            54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    for (size_t j = 0; j < 8 && j < nk; j++) prefetch_row((const char *)v + (ptrdiff_t)j * rs * (ptrdiff_t)es, cs, dv * es);
    for (size_t ks = 0; ks < ksteps; ks++)
        for (size_t r = 0; r < 16; r++) {
            const size_t j0 = ks * 32 + 2 * r, j1 = j0 + 1;
            for (size_t j = j0 + 8; j < j0 + 10 && j < nk; j++) /* four pairs ahead */
                prefetch_row((const char *)v + (ptrdiff_t)j * rs * (ptrdiff_t)es, cs, dv * es);
            for (size_t c = 0; c < dvp / 32; c++) {
                __m512i ah = _mm512_setzero_si512(), bh = ah, al = ah, bl = ah;
                if (j0 < nk) row_chunk((const char *)v + (ptrdiff_t)j0 * rs * (ptrdiff_t)es, src, cs, dv, c, &ah, lo ? &al : NULL);
                if (j1 < nk) row_chunk((const char *)v + (ptrdiff_t)j1 * rs * (ptrdiff_t)es, src, cs, dv, c, &bh, lo ? &bl : NULL);
                const size_t at = (ks * ctiles + 2 * c) * 256 + r * 16;
                _mm512_storeu_si512(hi + at, _mm512_permutex2var_epi16(ah, lo_idx, bh));
                _mm512_storeu_si512(hi + at + 256, _mm512_permutex2var_epi16(ah, hi_idx, bh));
                if (lo) {
                    _mm512_storeu_si512(lo + at, _mm512_permutex2var_epi16(al, lo_idx, bl));
                    _mm512_storeu_si512(lo + at + 256, _mm512_permutex2var_epi16(al, hi_idx, bl));
                }
            }
        }
}

/* ---- the forward ---- */

/* A key block of the forward: its first key (a multiple of 32) and its keys
 * (a multiple of 32; the last block runs to ke rounded up to 32). */
typedef struct attn_block {
    int64_t k0;
    size_t n;
} attn_block;

/* The tile work of the forward as a sequence of k-steps (four products
 * each), so that it can be issued a step at a time between rows of the
 * softmax. Tiles are not renamed: a load into a tile waits until the
 * products reading it have read it, so each step's loads for the next step
 * come right after the last product that reads the tile they replace.
 *   scores pass (32 keys of block sblk):  tmm0..3 = 0; per k-step of D
 *     and term: Q rows 0-15, 16-31 (tmm4, 5) x K keys 0-15, 16-31 (tmm6,
 *     7); S stored
 *   values pair (32 columns of O):  tmm0..3 = O; per 32 keys of block
 *     vblk and term: P rows (tmm4, 5) x V columns (tmm6, 7); O stored
 * Split operands (hi + lo bf16) add terms: Q K^T takes hi hi, hi lo and
 * lo hi, P V takes P hi V hi, then P hi V lo and P lo V hi where there
 * are lo parts. */
typedef struct tile_work {
    const fmha_matrix_fwd_args *a;
    attn_block sblk, vblk;
    float *s;                   /* scores of sblk: [32][sblk.n] */
    const uint16_t *p, *p_lo;   /* P of vblk: [32][vblk.n] bf16 (p_lo NULL: no residual) */
    size_t s_terms, s_steps;    /* terms of Q K^T; its k-steps a pass: dp / 16 x terms */
    size_t n_scores;            /* k-steps of the scores passes: sblk.n / 32 passes */
    size_t v_terms, v_steps;    /* terms of P V; its k-steps a pair: vblk.n / 32 x terms */
    size_t n_total;             /* all k-steps */
} tile_work;

static tile_work tile_work_of(const fmha_matrix_fwd_args *a, attn_block sblk, float *s, attn_block vblk,
                              const uint16_t *p, const uint16_t *p_lo) {
    const size_t s_terms = a->qp_lo ? 3 : 1, v_terms = 1 + (a->vp_lo != NULL) + (p_lo != NULL);
    tile_work w = {a, sblk, vblk, s, p, p_lo, s_terms, a->dp / 16 * s_terms, 0, v_terms, vblk.n / 32 * v_terms, 0};
    w.n_scores = sblk.n / 32 * w.s_steps;
    w.n_total = w.n_scores + (vblk.n ? a->dvp / 32 * w.v_steps : 0);
    return w;
}

/* Step s of a scores pass over the keys at kt (K's words of 32 keys). */
static step_tiles scores_tiles(const tile_work *w, size_t kk, size_t s) {
    const fmha_matrix_fwd_args *a = w->a;
    const size_t t = s / w->s_terms, u = s % w->s_terms, at = (size_t)(w->sblk.k0 + (int64_t)kk) * a->dp;
    const uint32_t *q = u == 2 ? a->qp_lo : a->qp, *k = u == 1 ? a->kp_lo : a->kp;
    return (step_tiles){(const char *)(q + t * ATTN_BQ * 16), (const char *)(k + at + t * 256), 16 * 16 * 4, 64,
                        a->dp * 16 * 4, 64};
}

/* Step s of a values pair (columns 16 c..) over block vblk. */
static step_tiles values_tiles(const tile_work *w, size_t c, size_t s) {
    const fmha_matrix_fwd_args *a = w->a;
    const size_t t = s / w->v_terms, u = s % w->v_terms, n = w->vblk.n, ctiles = a->dvp / 16;
    /* term 0: P V; term 1: P V_lo (or P_lo V without V_lo); term 2: P_lo V */
    const int p_lo = (u == 1 && !a->vp_lo) || u == 2, v_lo = u == 1 && a->vp_lo;
    const uint16_t *p = p_lo ? w->p_lo : w->p;
    const uint32_t *v = v_lo ? a->vp_lo : a->vp;
    return (step_tiles){(const char *)(p + 32 * t), (const char *)(v + ((size_t)w->vblk.k0 / 32 * ctiles + t * ctiles + c) * 256),
                        16 * n * 2, n * 2, 256 * 4, 64};
}

/* Step i of the work (0 <= i < n_total). */
static void tile_work_step(const tile_work *w, size_t i) {
    const fmha_matrix_fwd_args *a = w->a;
    if (i < w->n_scores) {
        const size_t pass = i / w->s_steps, t = i % w->s_steps, kk = 32 * pass, ld = w->sblk.n;
        if (t == 0) {
            TILE_ZERO(0);
            TILE_ZERO(1);
            TILE_ZERO(2);
            TILE_ZERO(3);
            tile_loads(scores_tiles(w, kk, 0));
        }
        const int more = t + 1 < w->s_steps;
        tile_products(more, more ? scores_tiles(w, kk, t + 1) : (step_tiles){0});
        if (!more) {
            float *s = w->s;
            TILE_STORE(0, s + kk, ld * 4);
            TILE_STORE(1, s + kk + 16, ld * 4);
            TILE_STORE(2, s + 16 * ld + kk, ld * 4);
            TILE_STORE(3, s + 16 * ld + kk + 16, ld * 4);
        }
    } else {
        const size_t j = i - w->n_scores, c = 2 * (j / w->v_steps), t = j % w->v_steps;
        const size_t ldo = a->dvp * 4, dvp = a->dvp;
        float *o = a->o + c * 16;
        if (t == 0) {
            TILE_LOAD(0, o, ldo);
            TILE_LOAD(1, o + 16, ldo);
            TILE_LOAD(2, o + 16 * dvp, ldo);
            TILE_LOAD(3, o + 16 * dvp + 16, ldo);
            tile_loads(values_tiles(w, c, 0));
        }
        const int more = t + 1 < w->v_steps;
        tile_products(more, more ? values_tiles(w, c, t + 1) : (step_tiles){0});
        if (!more) {
            TILE_STORE(0, o, ldo);
            TILE_STORE(1, o + 16, ldo);
            TILE_STORE(2, o + 16 * dvp, ldo);
            TILE_STORE(3, o + 16 * dvp + 16, ldo);
        }
    }
}

/* P = 2^((s - m_use) c1) of a row's visible keys (zeros elsewhere) as bf16
 * into p_row, their sum added to lsum's 16 partial sums; `far` computes
 * (s - m_use) c1 (two operations), else s c1 - m_use c1 (one FMA). */
static inline __attribute__((always_inline)) void softmax_row_pass(size_t nv, const float *s_row, uint16_t *p_row,
                                                                    uint16_t *p_lo_row, int64_t k0, int64_t lo,
                                                                    int64_t hi, int full, float c1, float m_use, int far,
                                                                    float *lsum) {
    const __m512 c1v = _mm512_set1_ps(c1), mv = _mm512_set1_ps(m_use), mc = _mm512_set1_ps(m_use * c1);
    __m512 sum = _mm512_loadu_ps(lsum);
    for (size_t v = 0; v < nv; v += 2) {
        const __mmask16 k0m = full ? 0xFFFF : lanes_in(k0 + (int64_t)(16 * v), lo, hi);
        const __mmask16 k1m = full ? 0xFFFF : lanes_in(k0 + (int64_t)(16 * v + 16), lo, hi);
        const __m512 s0 = _mm512_loadu_ps(s_row + 16 * v), s1 = _mm512_loadu_ps(s_row + 16 * v + 16);
        const __m512 t0 = far ? _mm512_mul_ps(_mm512_sub_ps(s0, mv), c1v) : _mm512_fmsub_ps(s0, c1v, mc);
        const __m512 t1 = far ? _mm512_mul_ps(_mm512_sub_ps(s1, mv), c1v) : _mm512_fmsub_ps(s1, c1v, mc);
        /* degree 4: l sums these P, and lse = m + log l keeps 1e-5 */
        const __m512 p0 = exp2_keep(k0m, t0, 1), p1 = exp2_keep(k1m, t1, 1);
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1)); /* one add a step on the chain */
        const __m512i ph = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
        _mm512_storeu_si512(p_row + 16 * v, ph);
        if (p_lo_row) _mm512_storeu_si512(p_lo_row + 16 * v, bf16_residual(ph, p0, p1, 0xFFFF, 0xFFFF));
    }
    _mm512_storeu_ps(lsum, sum);
}

/* The softmax of a row over the block's keys [k0, k0 + bk): P row into
 * p_row (bf16), m_ref and the row's partial sums (lsum, 16 floats) updated;
 * *alpha receives the factor O's row takes before this block's P V (1
 * unless m_ref moved: O may be in the tiles' hands now). */
static void block_softmax_row(const fmha_matrix_fwd_args *a, int64_t k0, size_t bk, const float *s_row,
                              uint16_t *p_row, uint16_t *p_lo_row, int64_t lo, int64_t hi, float *m_ref, float *lsum,
                              float *alpha) {
    *alpha = 1.0f;
    const size_t nv = bk / 16;
    if (hi <= lo || hi <= k0 || lo >= k0 + (int64_t)bk) { /* nothing visible: P = 0 */
        for (size_t v = 0; v < nv; v += 2) {
            _mm512_storeu_si512(p_row + 16 * v, _mm512_setzero_si512());
            if (p_lo_row) _mm512_storeu_si512(p_lo_row + 16 * v, _mm512_setzero_si512());
        }
        return;
    }
    const int full = lo <= k0 && hi >= k0 + (int64_t)bk;
    /* two chains (nv is even): one vmaxps chain took a fifth of the softmax */
    __m512 mx0 = _mm512_set1_ps(-INFINITY), mx1 = mx0;
    for (size_t v = 0; v < nv; v += 2) {
        const __mmask16 keep0 = full ? 0xFFFF : lanes_in(k0 + (int64_t)(16 * v), lo, hi);
        const __mmask16 keep1 = full ? 0xFFFF : lanes_in(k0 + (int64_t)(16 * v + 16), lo, hi);
        mx0 = _mm512_mask_max_ps(mx0, keep0, _mm512_loadu_ps(s_row + 16 * v), mx0);
        mx1 = _mm512_mask_max_ps(mx1, keep1, _mm512_loadu_ps(s_row + 16 * v + 16), mx1);
    }
    const float block_max = _mm512_reduce_max_ps(_mm512_max_ps(mx0, mx1));
    const float c1 = a->scale_log2;
    if (block_max > *m_ref) {
        if (*m_ref == -INFINITY) {
            *m_ref = block_max; /* O and l hold nothing yet (or NaN, which stays) */
        } else if ((block_max - *m_ref) * c1 > a->rescale_log2) {
            *alpha = exp2f((*m_ref - block_max) * c1);
            _mm512_storeu_ps(lsum, _mm512_mul_ps(_mm512_loadu_ps(lsum), _mm512_set1_ps(*alpha)));
            *m_ref = block_max;
        }
    }
    const float m_use = *m_ref == -INFINITY ? 0.0f : *m_ref;
    /* s c1 - m c1 in one FMA errs by |m c1| 2^-24 (m c1 is rounded): a few
     * 1e-4 at |m c1| = 2^12; past that, (s - m) c1, exact near the max */
    if (fabsf(m_use * c1) < 0x1p12f)
        softmax_row_pass(nv, s_row, p_row, p_lo_row, k0, lo, hi, full, c1, m_use, 0, lsum);
    else
        softmax_row_pass(nv, s_row, p_row, p_lo_row, k0, lo, hi, full, c1, m_use, 1, lsum);
}

/* The row's sums in memory: 16 floats a row. */
enum { ATTN_LSUM = 16 };


static attn_block block_at(const fmha_matrix_fwd_args *a, int64_t first, size_t b) {
    const int64_t k0 = first + (int64_t)(b * a->block_kv);
    const int64_t left = a->ke - k0;
    return (attn_block){k0, left < (int64_t)a->block_kv ? (size_t)((left + 31) / 32 * 32) : a->block_kv};
}

/* Softmax of rows [r0, r1) of block b (its S in s, P into p and its
 * residual into p_lo when that is not NULL). */
static void softmax_rows(const fmha_matrix_fwd_args *a, attn_block b, const float *s, uint16_t *p, uint16_t *p_lo,
                         size_t r0, size_t r1, float *lsum, float *alpha) {
    for (size_t i = r0; i < r1; i++)
        block_softmax_row(a, b.k0, b.n, s + i * b.n, p + i * b.n, p_lo ? p_lo + i * b.n : NULL,
                          i < a->nq ? a->lo[i] : 0, i < a->nq ? a->hi[i] : 0, &a->m[i], lsum + i * ATTN_LSUM, &alpha[i]);
}

/* O's rows times the factors softmax_rows left (then 1). */
static void apply_alpha(const fmha_matrix_fwd_args *a, float *alpha) {
    for (size_t i = 0; i < ATTN_BQ; i++) {
        if (alpha[i] == 1.0f) continue;
        const __m512 al = _mm512_set1_ps(alpha[i]);
        float *row = a->o + i * a->dvp;
        for (size_t c = 0; c < a->dvp; c += 16) _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_loadu_ps(row + c), al));
        alpha[i] = 1.0f;
    }
}

void FMHA_AMX_FN(fmha_matrix_forward)(fmha_matrix_fwd_args *a) {
    FMHA_AMX_FN(fmha_amx_ready)();
    const size_t bk = a->block_kv;
    _Alignas(64) float lsum[ATTN_BQ * ATTN_LSUM];
    float alpha[ATTN_BQ];
    memset(lsum, 0, sizeof lsum);
    memset(a->o, 0, ATTN_BQ * a->dvp * sizeof(float));
    for (size_t i = 0; i < ATTN_BQ; i++) a->m[i] = -INFINITY, alpha[i] = 1.0f;
    const int64_t first = a->kb / (int64_t)bk * (int64_t)bk;
    const size_t blocks = a->ke > first ? (size_t)((a->ke - first + (int64_t)bk - 1) / (int64_t)bk) : 0;
    /* S and P (and P's residual) of two blocks: [2][32][bk] each */
    float *s_buf[2] = {a->s, a->s + ATTN_BQ * bk};
    uint16_t *p_buf[2] = {a->p, a->p + ATTN_BQ * bk};
    uint16_t *pl_buf[2] = {a->p_lo, a->p_lo ? a->p_lo + ATTN_BQ * bk : NULL};
    const attn_block none = {0, 0};
    if (!a->overlap) {
        for (size_t b = 0; b < blocks; b++) {
            const attn_block blk = block_at(a, first, b);
            const tile_work scores = tile_work_of(a, blk, s_buf[0], none, NULL, NULL);
            for (size_t i = 0; i < scores.n_total; i++) tile_work_step(&scores, i);
            softmax_rows(a, blk, s_buf[0], p_buf[0], pl_buf[0], 0, ATTN_BQ, lsum, alpha);
            apply_alpha(a, alpha);
            const tile_work values = tile_work_of(a, none, NULL, blk, p_buf[0], pl_buf[0]);
            for (size_t i = 0; i < values.n_total; i++) tile_work_step(&values, i);
        }
    } else if (blocks) {
        /* Software-pipelined: while the vector units run block b's softmax,
         * the tiles compute block b + 1's scores and block b - 1's P V, a
         * k-step at a time between rows of the softmax, so that both have
         * work within the core's out-of-order window. */
        attn_block prev = none, cur = block_at(a, first, 0);
        const tile_work first_scores = tile_work_of(a, cur, s_buf[0], none, NULL, NULL);
        for (size_t i = 0; i < first_scores.n_total; i++) tile_work_step(&first_scores, i);
        for (size_t b = 0; b < blocks; b++) {
            const attn_block next = b + 1 < blocks ? block_at(a, first, b + 1) : none;
            apply_alpha(a, alpha); /* block b - 1's factors, before its P V */
            const tile_work w = tile_work_of(a, next, s_buf[(b + 1) & 1], prev, p_buf[(b + 1) & 1], pl_buf[(b + 1) & 1]);
            const size_t steps = w.n_total ? w.n_total : 1;
            size_t row = 0;
            for (size_t i = 0; i < steps; i++) {
                if (i < w.n_total) tile_work_step(&w, i);
                const size_t row_end = ATTN_BQ * (i + 1) / steps;
                softmax_rows(a, cur, s_buf[b & 1], p_buf[b & 1], pl_buf[b & 1], row, row_end, lsum, alpha);
                row = row_end;
            }
            prev = cur;
            cur = next;
        }
        apply_alpha(a, alpha);
        const tile_work last = tile_work_of(a, none, NULL, prev, p_buf[(blocks - 1) & 1], pl_buf[(blocks - 1) & 1]);
        for (size_t i = 0; i < last.n_total; i++) tile_work_step(&last, i);
    }
    uint32_t nonfinite = 0;
    const __m512i exp_bits = _mm512_set1_epi32(0x7F800000);
    for (size_t i = 0; i < ATTN_BQ; i++) {
        a->l[i] = _mm512_reduce_add_ps(_mm512_loadu_ps(lsum + i * ATTN_LSUM));
        __mmask16 bad = 0;
        for (size_t c = 0; c < a->dvp; c += 16) {
            const __m512i x = _mm512_and_si512(_mm512_loadu_si512(a->o + i * a->dvp + c), exp_bits);
            bad |= _mm512_cmpeq_epi32_mask(x, exp_bits);
        }
        nonfinite |= (uint32_t)(bad != 0) << i;
    }
    a->nonfinite = nonfinite;
    a->blocks = blocks;
}
