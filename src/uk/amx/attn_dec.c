/* amx/attn_dec.c: decoding on the tiles (the matrix part's decode;
 * contract in ukernel.h), bf16, P rounded to bf16 (FAST). Built twice,
 * like attn.c.
 *
 * A decode step reads each key once for a few rows, so K and V are read in
 * place, never packed per call: K's rows are already the A operand of
 * S^T = K Q^T (16 keys x 32 elements of D a tile, the cache's row stride),
 * and Q^T (packed once per step) is B. Per block of 128 keys:
 *   S^T [128 keys][32 rows]   tmm0..3 C (keys 0-15 / 16-31 of a 32-key pass
 *                             x rows 0-15 / 16-31), tmm4, 5 A (K), tmm6, 7 B
 *   softmax over keys         lanes over rows (two vectors): column maxima,
 *                             the lazy rescale of the forward, P^T = 2^t
 *   P rows                    each key pair's two P^T rows rounded and
 *                             interleaved (a column of the A tile), then a
 *                             16 x 16 word transpose: P [32 rows][128 keys]
 *   V                         pairs of key rows interleaved in-lane
 *                             (dec_pack_v) into the B layout, in L1, once
 *                             for all row blocks; O's columns permuted
 *                             back at the end
 *   O [32 rows][Dv] += P V    tmm0..3 C per 32 columns of O (in memory),
 *                             tmm4, 5 A (P), tmm6, 7 B (V), 4 k-steps
 * The row blocks take the key block in turn (K from L1 or L2 after the
 * first); the first also sends the next key block towards L2. The last
 * keys short of 32 are copied into a zero-padded block first (a tile load
 * reads 16 rows whatever the keys). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../avx512/unpack.h"
#include "amx.h"
#include "attn_common.h"
#include "tile.h"

enum { DEC_BK = 128 };

/* One block of 32 rows: its Q^T, key ranges [lo, hi), O [32][dvp], m, and
 * its S^T [128][32] and P [32][128] of the key block. */
typedef struct dec_rows {
    size_t nq;
    const uint32_t *qt;
    const int64_t *lo, *hi;
    float *o, *m, *s;
    uint16_t *p;
} dec_rows;

/* A block of 16 rows or fewer: its kernels take half the tile work. */
static inline int dec_half(const dec_rows *rb) { return rb->nq <= 16; }

void FMHA_AMX_FN(fmha_matrix_pack_qt)(size_t nq, size_t d, const void *const *rows, int src, ptrdiff_t cs,
                                      int negate, uint32_t *qt) {
    const __m512i sign = _mm512_set1_epi32(negate ? (int)0x80008000u : 0);
    for (size_t t = 0; t < d / 32; t++)
        for (size_t h = 0; h < 2; h++) {
            __m512i m[16]; /* m[r]: row 16 h + r's 16 pairs of k-step t */
            for (size_t r = 0; r < 16; r++) {
                m[r] = _mm512_setzero_si512();
                if (16 * h + r < nq) {
                    row_chunk(rows[16 * h + r], src, cs, d, t, &m[r], NULL);
                    m[r] = _mm512_xor_si512(m[r], sign);
                }
            }
            transpose_16x16(m); /* m[p]: pair p over the rows */
            for (size_t p = 0; p < 16; p++) _mm512_storeu_si512(qt + ((t * 2 + h) * 16 + p) * 16, m[p]);
        }
}

/* Rows [r0, r1) of a cache block (rows rs bytes apart, `bytes` each) to
 * L2 (inlined, as prefetch_row is). */
static inline __attribute__((always_inline)) void prefetch_block_rows(const char *base, ptrdiff_t rs, size_t r0, size_t r1, size_t bytes) {
    if (!base) return;
    for (size_t r = r0; r < r1; r++)
        for (size_t b = 0; b < bytes; b += 64) _mm_prefetch(base + (ptrdiff_t)r * rs + (ptrdiff_t)b, _MM_HINT_T1);
}

/* One 32-key pass of S^T for a row block: s [32 keys][32 rows] (row
 * stride 32 floats) of the keys at k (rows k_rs bytes apart), D / 32
 * k-steps of 2 x 2 products; a block of 16 rows or fewer (dec_half) takes
 * the 2 x 1 products of its rows 0-15 only and leaves s's lanes 16-31. */
static void dec_scores_pass(const fmha_matrix_dec_args *a, const dec_rows *rb, const char *kt, ptrdiff_t k_rs,
                            float *s) {
    const size_t steps = a->d / 32;
    TILE_ZERO(0);
    TILE_ZERO(2);
    if (dec_half(rb)) {
        TILE_LOAD(4, kt, k_rs);
        TILE_LOAD(6, rb->qt, 64);
        TILE_LOAD(5, kt + 16 * k_rs, k_rs);
        for (size_t t = 0; t < steps; t++) {
            TILE_DPBF16PS(0, 4, 6);
            if (t + 1 < steps) TILE_LOAD(4, kt + 64 * (t + 1), k_rs);
            TILE_DPBF16PS(2, 5, 6);
            if (t + 1 < steps) {
                TILE_LOAD(6, rb->qt + (t + 1) * 512, 64);
                TILE_LOAD(5, kt + 64 * (t + 1) + 16 * k_rs, k_rs);
            }
        }
        TILE_STORE(0, s, 128);
        TILE_STORE(2, s + 16 * 32, 128);
        return;
    }
    TILE_ZERO(1);
    TILE_ZERO(3);
    tile_loads((step_tiles){kt, (const char *)rb->qt, (size_t)(16 * k_rs), (size_t)k_rs, 256 * 4, 64});
    for (size_t t = 0; t < steps; t++) {
        const int more = t + 1 < steps;
        tile_products(more, (step_tiles){kt + 64 * (t + 1), (const char *)(rb->qt + (t + 1) * 512),
                                         (size_t)(16 * k_rs), (size_t)k_rs, 256 * 4, 64});
    }
    /* C0: keys 0-15 x rows 0-15, C1: x rows 16-31, C2, C3: keys 16-31 */
    TILE_STORE(0, s, 128);
    TILE_STORE(1, s + 16, 128);
    TILE_STORE(2, s + 16 * 32, 128);
    TILE_STORE(3, s + 16 * 32 + 16, 128);
}

/* Columns [16 c, 16 c + 32) of a row block's O [32][dvp] += P [32][n] V
 * over n keys (V interleaved in vb); a half block (dec_half): rows 0-15 only. */
static void dec_values_cols(const fmha_matrix_dec_args *a, const dec_rows *rb, size_t n, size_t c) {
    const size_t ctiles = a->dvp / 16, ldo = a->dvp * 4, steps = n / 32, ldp = DEC_BK * 2;
    float *o = rb->o + c * 16;
    TILE_LOAD(0, o, ldo);
    TILE_LOAD(1, o + 16, ldo);
    if (dec_half(rb)) {
        const char *vb = (const char *)(a->vb + c * 256);
        TILE_LOAD(4, rb->p, ldp);
        TILE_LOAD(6, vb, 64);
        TILE_LOAD(7, vb + 256 * 4, 64);
        for (size_t t = 0; t < steps; t++) {
            const char *vn = (const char *)(a->vb + ((t + 1) * ctiles + c) * 256);
            TILE_DPBF16PS(0, 4, 6);
            if (t + 1 < steps) TILE_LOAD(6, vn, 64);
            TILE_DPBF16PS(1, 4, 7);
            if (t + 1 < steps) {
                TILE_LOAD(4, rb->p + 32 * (t + 1), ldp);
                TILE_LOAD(7, vn + 256 * 4, 64);
            }
        }
        TILE_STORE(0, o, ldo);
        TILE_STORE(1, o + 16, ldo);
        return;
    }
    TILE_LOAD(2, o + 16 * a->dvp, ldo);
    TILE_LOAD(3, o + 16 * a->dvp + 16, ldo);
    tile_loads((step_tiles){(const char *)rb->p, (const char *)(a->vb + c * 256), 16 * ldp, ldp, 256 * 4, 64});
    for (size_t t = 0; t < steps; t++) {
        const int more = t + 1 < steps;
        tile_products(more, (step_tiles){(const char *)(rb->p + 32 * (t + 1)),
                                         (const char *)(a->vb + ((t + 1) * ctiles + c) * 256), 16 * ldp, ldp,
                                         256 * 4, 64});
    }
    TILE_STORE(0, o, ldo);
    TILE_STORE(1, o + 16, ldo);
    TILE_STORE(2, o + 16 * a->dvp, ldo);
    TILE_STORE(3, o + 16 * a->dvp + 16, ldo);
}

/* Rows' key ranges [lo, hi) relative to key k0, clamped to the block's n
 * keys (the padding past ke never kept): two int32 vectors of 16 rows each. */
static void dec_ranges(const dec_rows *rb, int64_t k0, size_t n, __m512i lo[2], __m512i hi[2]) {
    int32_t l[32], h[32];
    for (size_t r = 0; r < 32; r++) {
        int64_t x = r < rb->nq ? rb->lo[r] - k0 : 0, y = r < rb->nq ? rb->hi[r] - k0 : 0;
        if (x < 0) x = 0;
        if (y > (int64_t)n) y = (int64_t)n;
        if (y < x) y = x;
        l[r] = (int32_t)x;
        h[r] = (int32_t)y;
    }
    for (int v = 0; v < 2; v++) {
        lo[v] = _mm512_loadu_si512(l + 16 * v);
        hi[v] = _mm512_loadu_si512(h + 16 * v);
    }
}

/* V's key block [nk][dv] (bf16 rows rs elements apart) into the B layout
 * of P V, in-lane: each pair of key rows' 32-element chunk is interleaved
 * by vpunpcklwd / vpunpckhwd (one uop each, where pack_v's vpermt2w takes
 * three), so column tile 2c holds O's columns {0-3, 8-11, 16-19, 24-27} of
 * chunk c and tile 2c + 1 the others; dec_unpermute puts O back at the
 * end. Keys past nk and columns past dv are zeros. */
static void dec_pack_v(size_t nk, size_t dv, const uint16_t *v, ptrdiff_t rs, size_t dvp, uint32_t *vb) {
    const size_t ctiles = dvp / 16, ksteps = (nk + 31) / 32;
    for (size_t ks = 0; ks < ksteps; ks++)
        for (size_t r = 0; r < 16; r++) {
            const size_t j0 = ks * 32 + 2 * r, j1 = j0 + 1;
            const uint16_t *a = v + (ptrdiff_t)j0 * rs, *b = v + (ptrdiff_t)j1 * rs;
            for (size_t c = 0; c < dvp / 32; c++) {
                const size_t left = dv - 32 * c;
                const __mmask32 m = left >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << left) - 1;
                const __m512i x = j0 < nk ? _mm512_maskz_loadu_epi16(m, a + 32 * c) : _mm512_setzero_si512();
                const __m512i y = j1 < nk ? _mm512_maskz_loadu_epi16(m, b + 32 * c) : _mm512_setzero_si512();
                uint32_t *at = vb + (ks * ctiles + 2 * c) * 256 + r * 16;
                _mm512_storeu_si512(at, _mm512_unpacklo_epi16(x, y));
                _mm512_storeu_si512(at + 256, _mm512_unpackhi_epi16(x, y));
            }
        }
}

/* O's rows [n][dvp] from dec_pack_v's column order back to O's (each
 * chunk of 32: column tile 2c the lo unpack's outputs, 2c + 1 the hi's). */
static void dec_unpermute(float *o, size_t n, size_t dvp) {
    for (size_t r = 0; r < n; r++)
        for (size_t c = 0; c < dvp; c += 32) {
            float *x = o + r * dvp + c;
            const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
            _mm512_storeu_ps(x, fmha_avx512_unpacked_in_order(lo, hi, 0));
            _mm512_storeu_ps(x + 16, fmha_avx512_unpacked_in_order(lo, hi, 1));
        }
}

/* The softmax of a block of n keys over S^T, lanes over rows: m, the sums
 * and O's rows (by alpha, in memory) updated, P [32][n] written as bf16;
 * nv vectors of 16 rows (a compile-time constant at each use): 1 for a
 * block of 16 rows or fewer (dec_half), whose rows 16-31 are left. */
static inline __attribute__((always_inline)) void dec_softmax_lanes(const fmha_matrix_dec_args *a,
                                                                    const dec_rows *rb, int64_t k0, size_t n,
                                                                    float *lsum, const int nv) {
    __m512i lo[2], hi[2];
    dec_ranges(rb, k0, a->ke - k0 < (int64_t)n ? (size_t)(a->ke - k0) : n, lo, hi);
    const __m512 c1 = _mm512_set1_ps(a->scale_log2), neg_inf = _mm512_set1_ps(-INFINITY);
    __m512 mx[2] = {neg_inf, neg_inf};
    for (size_t j = 0; j < n; j++) {
        const __m512i jv = _mm512_set1_epi32((int)j);
        for (int v = 0; v < nv; v++) {
            const __mmask16 keep = _mm512_cmple_epi32_mask(lo[v], jv) & _mm512_cmpgt_epi32_mask(hi[v], jv);
            mx[v] = _mm512_mask_max_ps(mx[v], keep, _mm512_loadu_ps(rb->s + j * 32 + 16 * v), mx[v]);
        }
    }
    __m512 m_use[2], mc[2], sum[2];
    float alpha[32];
    for (int v = 0; v < nv; v++) {
        const __m512 m_old = _mm512_loadu_ps(rb->m + 16 * v);
        const __mmask16 grew = _mm512_cmp_ps_mask(mx[v], m_old, _CMP_GT_OQ);
        const __mmask16 first = grew & _mm512_cmp_ps_mask(m_old, neg_inf, _CMP_EQ_OQ);
        const __mmask16 moved =
            first | (grew & _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_sub_ps(mx[v], m_old), c1),
                                               _mm512_set1_ps(a->rescale_log2), _CMP_GT_OQ));
        /* alpha: 1, or 2^((m_old - m_new) c1) where a finite reference moved */
        __m512 al = _mm512_set1_ps(1.0f);
        const __mmask16 scaled = moved & ~first;
        if (scaled) {
            float d[16], e[16];
            _mm512_storeu_ps(d, _mm512_mul_ps(_mm512_sub_ps(m_old, mx[v]), c1));
            for (int r = 0; r < 16; r++) e[r] = scaled >> r & 1 ? exp2f(d[r]) : 1.0f;
            al = _mm512_loadu_ps(e);
        }
        _mm512_storeu_ps(alpha + 16 * v, al);
        sum[v] = _mm512_mul_ps(_mm512_loadu_ps(lsum + 16 * v), al);
        const __m512 m_new = _mm512_mask_mov_ps(m_old, moved, mx[v]);
        _mm512_storeu_ps(rb->m + 16 * v, m_new);
        m_use[v] = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
        mc[v] = _mm512_mul_ps(m_use[v], c1);
    }
    for (size_t r = 0; r < 16 * (size_t)nv; r++) /* O's rows before this block's P V */
        if (alpha[r] != 1.0f)
            for (size_t c = 0; c < a->dvp; c += 16)
                _mm512_storeu_ps(rb->o + r * a->dvp + c, _mm512_mul_ps(_mm512_loadu_ps(rb->o + r * a->dvp + c),
                                                                       _mm512_set1_ps(alpha[r])));
    /* P^T = 2^(s c1 - m c1) (or (s - m) c1 past |m c1| = 2^12), two keys a
     * step: their rows rounded and interleaved into one word vector a half
     * (rows 0-15, 16-31), 16 of them transposed into the A tile's rows */
    const __m512i pair_idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    float far_check[32];
    int far = 0;
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(far_check + 16 * v, _mm512_abs_ps(mc[v]));
    for (int r = 0; r < 16 * nv; r++) far |= far_check[r] >= 0x1p12f;
    for (size_t kk = 0; kk < n; kk += 32) {
        __m512i cols[2][16];
        for (size_t pr = 0; pr < 16; pr++) {
            __m512 p[2][2]; /* [key of the pair][half] */
            for (int e = 0; e < 2; e++) {
                const size_t j = kk + 2 * pr + (size_t)e;
                const __m512i jv = _mm512_set1_epi32((int)j);
                for (int v = 0; v < nv; v++) {
                    const __mmask16 keep = _mm512_cmple_epi32_mask(lo[v], jv) & _mm512_cmpgt_epi32_mask(hi[v], jv);
                    const __m512 sv = _mm512_loadu_ps(rb->s + j * 32 + 16 * v);
                    const __m512 t = far ? _mm512_mul_ps(_mm512_sub_ps(sv, m_use[v]), c1) : _mm512_fmsub_ps(sv, c1, mc[v]);
                    p[e][v] = exp2_keep(keep, t, 1);
                    sum[v] = _mm512_add_ps(sum[v], p[e][v]);
                }
            }
            for (int v = 0; v < nv; v++)
                cols[v][pr] = _mm512_permutexvar_epi16(pair_idx, (__m512i)_mm512_cvtne2ps_pbh(p[1][v], p[0][v]));
        }
        for (int v = 0; v < nv; v++) {
            transpose_16x16(cols[v]); /* cols[v][r]: row 16 v + r's 16 key pairs */
            for (size_t r = 0; r < 16; r++) _mm512_storeu_si512(rb->p + (16 * (size_t)v + r) * DEC_BK + kk, cols[v][r]);
        }
    }
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(lsum + 16 * v, sum[v]);
    /* a NaN sum (a NaN or +inf score seen) makes m NaN, which the merge
     * carries to the row (partials.h); the max above skips NaN scores */
    for (int v = 0; v < nv; v++) {
        const __mmask16 nan = _mm512_cmp_ps_mask(sum[v], sum[v], _CMP_UNORD_Q);
        if (nan) _mm512_mask_storeu_ps(rb->m + 16 * v, nan, _mm512_set1_ps(NAN));
    }
}

static void dec_softmax(const fmha_matrix_dec_args *a, const dec_rows *rb, int64_t k0, size_t n, float *lsum) {
    if (dec_half(rb))
        dec_softmax_lanes(a, rb, k0, n, lsum, 1);
    else
        dec_softmax_lanes(a, rb, k0, n, lsum, 2);
}

void FMHA_AMX_FN(fmha_matrix_decode)(fmha_matrix_dec_args *a) {
    FMHA_AMX_FN(fmha_amx_ready)();
    const size_t qt_words = a->d / 32 * 512, nb = a->nb, ctiles = a->dvp / 16;
    dec_rows rows[FMHA_MATRIX_DEC_BLOCKS];
    for (size_t i = 0; i < nb; i++) {
        rows[i] = (dec_rows){i + 1 < nb ? 32 : a->nq, a->qt + i * qt_words, a->lo + 32 * i, a->hi + 32 * i,
                             a->o + i * 32 * a->dvp, a->m + 32 * i, a->s + i * DEC_BK * 32, a->p + i * 32 * DEC_BK};
        if (a->resume) continue;
        memset(rows[i].o, 0, 32 * a->dvp * sizeof(float));
        for (size_t r = 0; r < 32; r++) {
            rows[i].m[r] = -INFINITY;
            a->l[32 * i + r] = 0.0f;
        }
    }
    for (int64_t k0 = a->kb; k0 < a->ke; k0 += DEC_BK) {
        const size_t nk = (size_t)(a->ke - k0 < DEC_BK ? a->ke - k0 : DEC_BK), n = (nk + 31) / 32 * 32;
        const char *k = a->k + (k0 - a->kb) * a->k_rs, *v = a->v + (k0 - a->kb) * a->v_rs;
        /* the next block's keys, sent towards L2 while this one computes */
        size_t next_n = (size_t)(a->ke - k0 - (int64_t)nk < DEC_BK ? a->ke - k0 - (int64_t)nk : DEC_BK);
        const char *next_k = k + DEC_BK * a->k_rs, *next_v = v + DEC_BK * a->v_rs;
        if (!next_n && a->next_n) /* the last block: the next call's first keys */
            next_k = a->next_k, next_v = a->next_v, next_n = a->next_n < DEC_BK ? a->next_n : DEC_BK;
        dec_pack_v(nk, a->dv, (const uint16_t *)v, a->v_rs / 2, a->dvp, a->vb);
        /* S^T pass by pass, each pass's 32 keys (in L1) for every row block;
         * the keys short of 32 from a zero-padded copy */
        const size_t whole = nk / 32 * 32, row_bytes = a->d * 2;
        for (size_t kk = 0; kk < whole; kk += 32) {
            prefetch_block_rows(next_k, a->k_rs, kk < next_n ? kk : next_n, kk + 32 < next_n ? kk + 32 : next_n,
                                row_bytes);
            for (size_t i = 0; i < nb; i++)
                dec_scores_pass(a, &rows[i], k + (ptrdiff_t)kk * a->k_rs, a->k_rs, rows[i].s + kk * 32);
        }
        if (whole < nk) {
            memset(a->k_tail, 0, 32 * row_bytes);
            for (size_t j = whole; j < nk; j++)
                memcpy((char *)a->k_tail + (j - whole) * row_bytes, k + (ptrdiff_t)j * a->k_rs, row_bytes);
            for (size_t i = 0; i < nb; i++)
                dec_scores_pass(a, &rows[i], (const char *)a->k_tail, (ptrdiff_t)row_bytes, rows[i].s + whole * 32);
        }
        for (size_t i = 0; i < nb; i++) dec_softmax(a, &rows[i], k0, n, a->l + 32 * i);
        /* P V a pair of column tiles at a time, its V slice (in L1) for
         * every row block; the next block's V rows spread over the pairs */
        const size_t per = (next_n + ctiles / 2 - 1) / (ctiles / 2);
        for (size_t c = 0; c < ctiles; c += 2) {
            const size_t r0 = c / 2 * per;
            prefetch_block_rows(next_v, a->v_rs, r0 < next_n ? r0 : next_n, r0 + per < next_n ? r0 + per : next_n,
                                a->dv * 2);
            for (size_t i = 0; i < nb; i++) dec_values_cols(a, &rows[i], n, c);
        }
    }
    if (!a->unfinished)
        for (size_t i = 0; i < nb; i++) dec_unpermute(rows[i].o, rows[i].nq, a->dvp);
}
