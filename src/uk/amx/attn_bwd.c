/* amx/attn_bwd.c: the backward on the tiles (the matrix part's backward;
 * contract and layouts in ukernel.h), bf16 with P and dS rounded to bf16
 * (precision FAST) or taken as bf16 plus their rounding residuals
 * (ACCURATE: x = hi + lo, hi = bf16(x), lo = bf16(x - hi), within 2^-16
 * of x; each gradient product gains its residual's term). Built twice,
 * like attn.c.
 *
 * Derivation (as driver/bwd.c): with S = scale Q K^T, P = softmax(S),
 * O = P V and dO = dL/dO,
 *   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - Dsum), Dsum = rowsum(dO * O),
 *   dQ = scale dS K,  dK = scale dS^T Q,
 * with P recomputed from the forward's lse. On the tiles each product keeps
 * its operands in the layouts the tiles read, so nothing is transposed in
 * the inner loop:
 *   S   [32 q][n]  = Q K^T         A = Q (as the forward's), B = K (the forward's)
 *   dP  [32 q][n]  = dO V^T        A = dO (as Q), B = V packed as K
 *   dV^T [Dv][n]  += dO^T P        A = dO^T block (pack_t), B = P as pairs of rows
 *   dK^T [D][n]   += Q^T dS        A = Q^T block, B = dS as pairs of rows
 *   dQ  [32 q][D] += dS K          A = dS rows (bf16 pairs along keys), B = K packed as V
 * dV^T and dK^T sum over the query blocks of a call (up to 4, one k-step
 * each, two with the residuals) before their tiles go back to memory; the
 * caller transposes them once per key block. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "amx.h"
#include "attn_common.h"
#include "tile.h"

enum { BWD_MAX_QB = 4 };

/* words 0-15 and 16-31 of two rows' 32 bf16 interleaved: (a[w], b[w]) */
static inline __m512i pairs_lo(__m512i a, __m512i b) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    return _mm512_permutex2var_epi16(a, idx, b);
}
static inline __m512i pairs_hi(__m512i a, __m512i b) {
    const __m512i idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                                         22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    return _mm512_permutex2var_epi16(a, idx, b);
}

/* X^T block of the bf16 nearest each element (residual 0) or of the bf16
 * nearest its residual (residual 1). */
static void pack_t_part(size_t nq, size_t d, const void *x, int src, ptrdiff_t rs, ptrdiff_t cs, int residual,
                        uint32_t *xt) {
    const size_t xr = fmha_matrix_dvp(d), es = src_bytes(src);
    for (size_t c = 0; c < xr / 32; c++) {
        /* m0[p], m1[p]: pair p's words over elements 32c..32c+15, 32c+16..32c+31 */
        __m512i m0[16], m1[16];
        for (size_t p = 0; p < 16; p++) {
            __m512i a = _mm512_setzero_si512(), b = a, hi;
            if (2 * p < nq)
                row_chunk((const char *)x + (ptrdiff_t)(2 * p) * rs * (ptrdiff_t)es, src, cs, d, c, residual ? &hi : &a,
                          residual ? &a : NULL);
            if (2 * p + 1 < nq)
                row_chunk((const char *)x + (ptrdiff_t)(2 * p + 1) * rs * (ptrdiff_t)es, src, cs, d, c,
                          residual ? &hi : &b, residual ? &b : NULL);
            m0[p] = pairs_lo(a, b);
            m1[p] = pairs_hi(a, b);
        }
        transpose_16x16(m0);
        transpose_16x16(m1);
        for (size_t e = 0; e < 16; e++) {
            _mm512_storeu_si512(xt + ((2 * c) * 16 + e) * 16, m0[e]);
            _mm512_storeu_si512(xt + ((2 * c + 1) * 16 + e) * 16, m1[e]);
        }
    }
}

void FMHA_AMX_FN(fmha_matrix_pack_t)(size_t nq, size_t d, const void *x, int src, ptrdiff_t rs, ptrdiff_t cs,
                                     uint32_t *xt, uint32_t *xt_lo) {
    pack_t_part(nq, d, x, src, rs, cs, 0, xt);
    if (xt_lo) pack_t_part(nq, d, x, src, rs, cs, 1, xt_lo);
}

int FMHA_AMX_FN(fmha_matrix_nonfinite)(size_t n, size_t d, const void *x, int src, ptrdiff_t rs, ptrdiff_t cs) {
    const size_t es = src_bytes(src);
    const __m512i exp_bits = _mm512_set1_epi16(0x7F80);
    __mmask32 bad = 0;
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < (d + 31) / 32; c++) {
            __m512i h;
            row_chunk((const char *)x + (ptrdiff_t)j * rs * (ptrdiff_t)es, src, cs, d, c, &h, NULL);
            bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, exp_bits), exp_bits);
        }
    return bad != 0;
}

/* C [32][n] = sum over i < terms of A_i B_i over the keys of the block, 32
 * keys a pass: A_i query rows as packed for the forward (k-steps of
 * [32][16] words), B_i packed as K (`pairs` pair-rows per 16-key tile);
 * one term, or three for split operands (A B + A B_lo + A_lo B). */
static void rows_by_keys(const uint32_t *const *a, const uint32_t *const *b, size_t terms, size_t pairs, size_t n,
                         float *c) {
    const size_t steps = pairs / 16, all = terms * steps;
    for (size_t kk = 0; kk < n; kk += 32) {
        const step_tiles first = {(const char *)a[0], (const char *)(b[0] + kk * pairs), 16 * 16 * 4, 64,
                                  pairs * 16 * 4, 64};
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
        tile_loads(first);
        for (size_t t = 0; t < all; t++) {
            const int more = t + 1 < all;
            const size_t i = (t + 1) / steps, u = (t + 1) % steps; /* the next k-step: term i, step u */
            const step_tiles next = more ? (step_tiles){(const char *)(a[i] + u * ATTN_BQ * 16),
                                                        (const char *)(b[i] + kk * pairs + u * 256), 16 * 16 * 4, 64,
                                                        pairs * 16 * 4, 64}
                                         : (step_tiles){0};
            tile_products(more, next);
        }
        TILE_STORE(0, c + kk, n * 4);
        TILE_STORE(1, c + kk + 16, n * 4);
        TILE_STORE(2, c + 16 * n + kk, n * 4);
        TILE_STORE(3, c + 16 * n + kk + 16, n * 4);
    }
}

/* Lanes of x that are finite. */
static inline __mmask16 finite_lanes(__m512 x) {
    return _mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_EQ_OQ);
}

/* P's or dS's residual (attn_common.h), 0 where not finite, so that an
 * infinity stays one. */
static inline __m512i finite_residual(__m512i hi, __m512 x0, __m512 x1) {
    return bf16_residual(hi, x0, x1, finite_lanes(x0), finite_lanes(x1));
}

/* P and dS of one query block from its S and dP ([32][n]): dS rows as bf16
 * into ds [32][n], P and dS as pairs of rows into p_pairs, ds_pairs
 * [16][n] (word (p, k) = rows 2p, 2p + 1 at key k); with a->residual their
 * residuals alike into ds_lo, p_lo_pairs, ds_lo_pairs. */
static void block_p_ds(const fmha_matrix_bwd_args *a, const fmha_matrix_bwd_qblock *q, const float *s,
                       const float *dp, uint16_t *ds, uint32_t *p_pairs, uint32_t *ds_pairs, uint16_t *ds_lo,
                       uint32_t *p_lo_pairs, uint32_t *ds_lo_pairs) {
    const size_t n = a->n;
    const int residual = a->residual;
    const __m512 c1 = _mm512_set1_ps(a->scale_log2), sc = _mm512_set1_ps(a->abs_scale),
                 log2e = _mm512_set1_ps((float)M_LOG2E);
    for (size_t pr = 0; pr < 16; pr++) {
        __m512i p_bf[2], ds_bf[2], p_lo[2], ds_lo_bf[2]; /* rows 2 pr, 2 pr + 1: 32 keys each */
        for (size_t kk = 0; kk < n; kk += 32) {
            for (int half = 0; half < 2; half++) {
                const size_t r = 2 * pr + (size_t)half;
                const int64_t lo = q->lo[r], hi = q->hi[r], base = a->k0 + (int64_t)kk;
                const __mmask16 m0 = lanes_in(base, lo, hi), m1 = lanes_in(base + 16, lo, hi);
                const float lse = q->lse[r];
                const __m512 dsum = _mm512_set1_ps(q->dsum[r]);
                __m512 p[2], g[2];
                for (int v = 0; v < 2; v++) {
                    const __mmask16 keep = v ? m1 : m0;
                    const __m512 sv = _mm512_loadu_ps(s + r * n + kk + 16 * (size_t)v);
                    /* s c1 - lse log2(e) in one FMA errs by |lse| 2^-23 (the rounded
                     * lse log2(e)); past |lse| = 64, (s |scale| - lse) log2(e): the
                     * FMA's difference is exact where P matters */
                    const __m512 t = fabsf(lse) < 64.0f
                                         ? _mm512_fmsub_ps(sv, c1, _mm512_set1_ps(lse * (float)M_LOG2E))
                                         : _mm512_mul_ps(_mm512_fmsub_ps(sv, sc, _mm512_set1_ps(lse)), log2e);
                    p[v] = exp2_keep(keep, t, 0);
                    const __m512 dpv = _mm512_loadu_ps(dp + r * n + kk + 16 * (size_t)v);
                    g[v] = _mm512_maskz_mul_ps(keep, p[v], _mm512_sub_ps(dpv, dsum)); /* hidden keys: 0, even for NaN dP */
                }
                p_bf[half] = (__m512i)_mm512_cvtne2ps_pbh(p[1], p[0]);
                ds_bf[half] = (__m512i)_mm512_cvtne2ps_pbh(g[1], g[0]);
                _mm512_storeu_si512(ds + r * n + kk, ds_bf[half]);
                if (residual) {
                    p_lo[half] = finite_residual(p_bf[half], p[0], p[1]);
                    ds_lo_bf[half] = finite_residual(ds_bf[half], g[0], g[1]);
                    _mm512_storeu_si512(ds_lo + r * n + kk, ds_lo_bf[half]);
                }
            }
            uint32_t *pw = p_pairs + pr * n + kk, *dw = ds_pairs + pr * n + kk;
            _mm512_storeu_si512(pw, pairs_lo(p_bf[0], p_bf[1]));
            _mm512_storeu_si512(pw + 16, pairs_hi(p_bf[0], p_bf[1]));
            _mm512_storeu_si512(dw, pairs_lo(ds_bf[0], ds_bf[1]));
            _mm512_storeu_si512(dw + 16, pairs_hi(ds_bf[0], ds_bf[1]));
            if (residual) {
                uint32_t *plw = p_lo_pairs + pr * n + kk, *dlw = ds_lo_pairs + pr * n + kk;
                _mm512_storeu_si512(plw, pairs_lo(p_lo[0], p_lo[1]));
                _mm512_storeu_si512(plw + 16, pairs_hi(p_lo[0], p_lo[1]));
                _mm512_storeu_si512(dlw, pairs_lo(ds_lo_bf[0], ds_lo_bf[1]));
                _mm512_storeu_si512(dlw + 16, pairs_hi(ds_lo_bf[0], ds_lo_bf[1]));
            }
        }
    }
}

/* dq [32][ldq] += sum over i < terms of dS_i K_i (dS K, then dS_lo K and
 * dS K_lo where they are): per 32 columns of D, k-steps of 32 keys. */
static void block_dq(const fmha_matrix_bwd_args *a, const uint16_t *const *ds, const uint32_t *const *kv,
                     size_t terms, float *dq) {
    const size_t n = a->n, ctiles = a->dr / 16, steps = n / 32, ldq = a->ldq * 4, all = terms * steps;
    for (size_t c = 0; c < ctiles; c += 2) {
        float *o = dq + c * 16;
        TILE_LOAD(0, o, ldq);
        TILE_LOAD(1, o + 16, ldq);
        TILE_LOAD(2, o + 16 * a->ldq, ldq);
        TILE_LOAD(3, o + 16 * a->ldq + 16, ldq);
        tile_loads((step_tiles){(const char *)ds[0], (const char *)(kv[0] + c * 256), 16 * n * 2, n * 2, 256 * 4, 64});
        for (size_t t = 0; t < all; t++) {
            const int more = t + 1 < all;
            const size_t i = (t + 1) / steps, u = (t + 1) % steps; /* the next k-step: term i, keys 32 u.. */
            tile_products(more, more ? (step_tiles){(const char *)(ds[i] + 32 * u),
                                                    (const char *)(kv[i] + c * 256 + u * ctiles * 256), 16 * n * 2,
                                                    n * 2, 256 * 4, 64}
                                     : (step_tiles){0});
        }
        TILE_STORE(0, o, ldq);
        TILE_STORE(1, o + 16, ldq);
        TILE_STORE(2, o + 16 * a->ldq, ldq);
        TILE_STORE(3, o + 16 * a->ldq + 16, ldq);
    }
}

/* acc [rows][n] += sum over g < steps of X_g^T Y_g: A = X^T blocks
 * (xt[g]), B = Y_g as pairs of rows (yp[g], [16][n]); per 32 rows x 32
 * keys of acc, one k-step per g (a query block, or its residual's). */
static void block_xt_y(const fmha_matrix_bwd_args *a, const uint32_t *const *xt, const uint32_t *const *yp,
                       size_t steps, size_t rows, float *acc) {
    const size_t n = a->n, ld = n * 4, ldt = a->ldt, ldc = ldt * 4;
    for (size_t r = 0; r < rows; r += 32)
        for (size_t kk = 0; kk < n; kk += 32) {
            float *c = acc + r * ldt + kk;
            TILE_LOAD(0, c, ldc);
            TILE_LOAD(1, c + 16, ldc);
            TILE_LOAD(2, c + 16 * ldt, ldc);
            TILE_LOAD(3, c + 16 * ldt + 16, ldc);
            tile_loads((step_tiles){(const char *)(xt[0] + r * 16), (const char *)(yp[0] + kk), 16 * 16 * 4, 64, 16 * 4, ld});
            for (size_t g = 0; g < steps; g++) {
                const int more = g + 1 < steps;
                tile_products(more, more ? (step_tiles){(const char *)(xt[g + 1] + r * 16), (const char *)(yp[g + 1] + kk),
                                                        16 * 16 * 4, 64, 16 * 4, ld}
                                         : (step_tiles){0});
            }
            TILE_STORE(0, c, ldc);
            TILE_STORE(1, c + 16, ldc);
            TILE_STORE(2, c + 16 * ldt, ldc);
            TILE_STORE(3, c + 16 * ldt + 16, ldc);
        }
}

void FMHA_AMX_FN(fmha_matrix_backward)(const fmha_matrix_bwd_args *a) {
    FMHA_AMX_FN(fmha_amx_ready)();
    const size_t n = a->n, nqb = a->nqb, split = a->kp_lo != NULL;
    /* the k-steps of dV^T and dK^T: X^T Y of every query block, then with
     * the residuals their X^T Y_lo and, for split operands, X_lo^T Y */
    const uint32_t *dot[3 * BWD_MAX_QB], *pp[3 * BWD_MAX_QB], *qt[3 * BWD_MAX_QB], *dsp[3 * BWD_MAX_QB];
    const size_t at_lo = nqb, at_split = a->residual ? 2 * nqb : nqb;
    const size_t steps = at_split + (split ? nqb : 0);
    for (size_t g = 0; g < nqb; g++) {
        const fmha_matrix_bwd_qblock *q = &a->qb[g];
        float *s = a->s + g * ATTN_BQ * n, *dp = a->dp_buf + g * ATTN_BQ * n;
        uint16_t *ds = a->ds + g * ATTN_BQ * n, *ds_lo = a->residual ? a->ds_lo + g * ATTN_BQ * n : NULL;
        uint32_t *p_pairs = a->p_pairs + g * 16 * n, *ds_pairs = a->ds_pairs + g * 16 * n;
        uint32_t *p_lo_pairs = a->residual ? a->p_lo_pairs + g * 16 * n : NULL;
        uint32_t *ds_lo_pairs = a->residual ? a->ds_lo_pairs + g * 16 * n : NULL;
        /* S = Q K (+ Q K_lo + Q_lo K), dP = dO V (+ dO V_lo + dO_lo V) */
        const uint32_t *sa[3] = {q->q, q->q, q->q_lo}, *sb[3] = {a->kp, a->kp_lo, a->kp};
        const uint32_t *da[3] = {q->d_o, q->d_o, q->d_o_lo}, *db[3] = {a->vk, a->vk_lo, a->vk};
        rows_by_keys(sa, sb, split ? 3 : 1, a->dp, n, s);
        rows_by_keys(da, db, split ? 3 : 1, a->dpv, n, dp);
        block_p_ds(a, q, s, dp, ds, p_pairs, ds_pairs, ds_lo, p_lo_pairs, ds_lo_pairs);
        /* dQ = dS K (+ dS_lo K) (+ dS K_lo) */
        const uint16_t *qa[3] = {ds, ds_lo, ds};
        const uint32_t *qb[3] = {a->kv, a->kv, a->kv_lo};
        block_dq(a, qa, qb, split ? 3 : a->residual ? 2 : 1, q->dq);
        dot[g] = q->d_ot, pp[g] = p_pairs, qt[g] = q->qt, dsp[g] = ds_pairs;
        if (a->residual) {
            const size_t x = at_lo + g;
            dot[x] = q->d_ot, pp[x] = p_lo_pairs, qt[x] = q->qt, dsp[x] = ds_lo_pairs;
        }
        if (split) {
            const size_t x = at_split + g;
            dot[x] = q->d_ot_lo, pp[x] = p_pairs, qt[x] = q->qt_lo, dsp[x] = ds_pairs;
        }
    }
    block_xt_y(a, dot, pp, steps, a->dvp, a->dvt);
    block_xt_y(a, qt, dsp, steps, a->dr, a->dkt);
}
