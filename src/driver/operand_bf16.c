/* operand_bf16.c: the bf16 operand path for kernel tables with bf16 pair
 * products (vdpbf16ps). Operands are packed as pairs along the reduced
 * dimension (uk->bf16.gemm's layout):
 *   forward   Q^T pairs [D2][NR] per block; K pairs [Skv][D2] and V^T pairs
 *             [Dv][Skv2] of each (batch, kv head), packed once per call
 *   backward  Q^T, dO^T pairs per query block, K and V pairs per key block;
 *             FAST also Q, dO query-row pairs and K key-row pairs
 * S^T and dP^T run on pairs; the P V product takes P^T as pairs plus (precision
 * ACCURATE) the pairs of its rounding residual. With precision FAST dV, dK
 * and dQ run on pairs of P and dS rounded per tile (each gradient about 1.45x
 * the error of rounding its exact value to bf16, measured); ACCURATE keeps
 * them float32 GEMMs on float32 rows. A float32 problem at precision BF16
 * takes this path too: its Q, K, V and dO rounded to bf16 (round to nearest
 * even, fmha_f32_to_bf16) as they are packed, the products and P as a bf16
 * problem's at FAST (fmha.h, FMHA_PRECISION_BF16). */
#include <string.h>

#include "runtime/convert.h"
#include "operand.h"

static size_t words_bytes(size_t n) { return fmha_round_up(n * sizeof(uint32_t), FMHA_ALIGN); }
static size_t pairs(int64_t n) { return (size_t)(n + 1) / 2; }

/* Element i of a bf16 or float32 tensor (dtype t) as bf16 bits. */
static inline uint16_t bf16_at(const void *src, fmha_dtype t, int64_t i) {
    return t == FMHA_DTYPE_BF16 ? ((const uint16_t *)src)[i] : fmha_f32_to_bf16(((const float *)src)[i]);
}

/* (X[lo], X[hi]) as a pair of bf16 (hi as 0 without has_hi). */
static inline uint32_t pair_at(const void *src, fmha_dtype t, int64_t lo, int64_t hi, int has_hi) {
    return (uint32_t)bf16_at(src, t, lo) | (has_hi ? (uint32_t)bf16_at(src, t, hi) << 16 : 0u);
}

/* Row `first` (n elements cs apart) of a bf16 or float32 tensor as n bf16
 * of unit stride: a bf16 row of unit stride where it is, else gathered or
 * rounded (the table's conversion kernel: fmha_f32_to_bf16's bits) into
 * tmp [n]. */
static const uint16_t *bf16_row(const fmha_ukernels *uk, const void *src, fmha_dtype t, int64_t first, int64_t cs,
                                int64_t n, uint16_t *tmp) {
    if (t == FMHA_DTYPE_BF16 && cs == 1) return (const uint16_t *)src + first;
    if (t == FMHA_DTYPE_F32 && cs == 1) {
        uk->rows.to_bf16((size_t)n, (const float *)src + first, tmp);
        return tmp;
    }
    for (int64_t e = 0; e < n; e++) tmp[e] = bf16_at(src, t, first + e * cs);
    return tmp;
}

/* tr2[p][i] = (X[i][2p], X[i][2p+1]) for i < n, zero elsewhere: [cols2][NR].
 * Rows of unit stride and even length, 4-byte aligned, already are their
 * pairs: then it is a transposing copy of 32-bit words, the table's
 * transpose kernel (moves only, so the bits are the loop's); float32 rows
 * of unit stride and even length are rounded 16 at a time into such rows
 * first. */
static void pack_pairs_transposed(const fmha_ukernels *uk, const void *x, fmha_dtype t, int64_t first, int64_t rs,
                                  int64_t cs, int64_t n, int64_t cols, size_t nr, uint32_t *tr2) {
    int64_t cols2 = (cols + 1) / 2;
    const uint16_t *src = x;
    const int words = t == FMHA_DTYPE_BF16 && rs % 2 == 0 && ((uintptr_t)(src + first) & 3u) == 0;
    if (cs == 1 && cols % 2 == 0 && (words || t == FMHA_DTYPE_F32)) {
        if (n < (int64_t)nr)
            for (int64_t e = 0; e < cols2; e++) memset(tr2 + (size_t)e * nr + n, 0, (nr - (size_t)n) * sizeof(uint32_t));
        if (words) {
            uk->rows.transpose((size_t)n, (size_t)cols2, (const float *)(const void *)(src + first), (size_t)(rs / 2),
                              (float *)(void *)tr2, nr);
            return;
        }
        /* float32: rounded 16 rows at a time, then the same transpose */
        uint16_t rows16[16 * FMHA_MAX_HEAD_DIM]; /* [16][cols] */
        for (int64_t i0 = 0; i0 < n; i0 += 16) {
            const int64_t m = n - i0 < 16 ? n - i0 : 16;
            for (int64_t r = 0; r < m; r++)
                uk->rows.to_bf16((size_t)cols, (const float *)x + first + (i0 + r) * rs, rows16 + r * cols);
            uk->rows.transpose((size_t)m, (size_t)cols2, (const float *)(const void *)rows16, (size_t)cols2,
                              (float *)(void *)(tr2 + i0), nr);
        }
        return;
    }
    memset(tr2, 0, (size_t)cols2 * nr * sizeof(uint32_t));
    uint16_t tmp[FMHA_MAX_HEAD_DIM];
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *row = bf16_row(uk, x, t, first + i * rs, cs, cols, tmp);
        for (int64_t e = 0; e < cols2; e++)
            tr2[(size_t)e * nr + (size_t)i] = fmha_bf16_pair(row, 2 * e, 2 * e + 1, 2 * e + 1 < cols);
    }
}

/* dst[p][e] = (X[2p][e], X[2p+1][e]) for 2p < n, e < cols (an odd n pairs
 * its last row with 0), zero elsewhere: pairs across rows, [rows2][ld]. */
static void pack_pairs_across_rows(const fmha_ukernels *uk, const void *src, fmha_dtype t, int64_t first, int64_t rs,
                                   int64_t cs, int64_t n, int64_t cols, size_t rows2, uint32_t *dst, size_t ld) {
    memset(dst, 0, rows2 * ld * sizeof(uint32_t));
    uint16_t tmp[2][FMHA_MAX_HEAD_DIM];
    for (int64_t p = 0; 2 * p < n; p++) {
        int64_t row = first + 2 * p * rs;
        const uint16_t *lo = bf16_row(uk, src, t, row, cs, cols, tmp[0]);
        const uint16_t *hi = 2 * p + 1 < n ? bf16_row(uk, src, t, row + rs, cs, cols, tmp[1]) : NULL;
        uk->rows.interleave_u16((size_t)cols, lo, hi, dst + (size_t)p * ld); /* the table's interleave kernel */
    }
}

/* dst[r][p] = (X[r][2p], X[r][2p+1]) for r < n: rows of pairs [n][cols2]. */
static void pack_pairs_rows(const fmha_ukernels *uk, const void *src, fmha_dtype t, int64_t first, int64_t rs,
                            int64_t cs, int64_t n, int64_t cols, uint32_t *dst) {
    int64_t cols2 = (cols + 1) / 2;
    uint16_t tmp[FMHA_MAX_HEAD_DIM];
    for (int64_t r = 0; r < n; r++) {
        const uint16_t *row = bf16_row(uk, src, t, first + r * rs, cs, cols, tmp);
        if (cols % 2 == 0) { /* the row already is its pairs */
            memcpy(dst + r * cols2, row, (size_t)cols * sizeof(uint16_t));
            continue;
        }
        for (int64_t e = 0; e < cols2; e++) dst[r * cols2 + e] = fmha_bf16_pair(row, 2 * e, 2 * e + 1, 2 * e + 1 < cols);
    }
}

/* ---- forward ---- */

/* K's rows already are its pairs (unit stride, even D, every row 4-byte
 * aligned): the products read K where it is, and the unit's K part is idle. */
static int k_in_place(const fmha_plan *plan, const void *k) {
    const int64_t *ks = plan->p.k_strides;
    return plan->p.dtype == FMHA_DTYPE_BF16 && ks[3] == 1 && plan->p.head_dim % 2 == 0 && ks[0] % 2 == 0 && ks[1] % 2 == 0 && ks[2] % 2 == 0 &&
           ((uintptr_t)k & 3u) == 0;
}

/* Unit: K pairs [Skv][D2] (unused when K is read in place), then V^T
 * pairs [Dv][Skv2]. */
static size_t unit_bytes(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    return words_bytes((size_t)p->seq_kv * pairs(p->head_dim)) +
           words_bytes((size_t)p->head_dim_v * pairs(p->seq_kv));
}

static void kv_pack(const fmha_plan *plan, const void *k, const void *v, int64_t b, int64_t hk,
                    int64_t k0, int64_t nk, char *unit) {
    const fmha_problem *p = &plan->p;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    int64_t skv = p->seq_kv, Dv = p->head_dim_v, D2 = (int64_t)pairs(p->head_dim);
    int64_t skv2 = (int64_t)pairs(skv);
    uint32_t *k2 = (uint32_t *)unit;
    uint32_t *v2 = (uint32_t *)(unit + words_bytes((size_t)(skv * D2)));
    const fmha_dtype t = p->dtype;
    if (!k_in_place(plan, k))
        pack_pairs_rows(plan->uk, k, t, b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3], nk, p->head_dim,
                        k2 + k0 * D2);
    /* V^T pairs in blocks of 16 pairs: 32 source rows stay in L1 while each
     * destination row gets 16 consecutive words. A key past the sequence's
     * length pairs as 0, so that 0 * NaN never meets a value no row sees. */
    int64_t limit = p->masks.kv_lengths && p->masks.kv_lengths[b] < skv ? p->masks.kv_lengths[b] : skv;
    int64_t pr_end = (k0 + nk + 1) / 2;
    if (vs[3] == 1) {
        /* rows paired in place order (pair[r][e] = (V[2r][e], V[2r+1][e]),
         * 16 pair rows of up to PAIR_COLS columns at a time), then moved by
         * the transpose kernel */
        enum { PAIR_COLS = 256 };
        uint32_t pair[16 * PAIR_COLS];
        uint16_t tmp[2][PAIR_COLS];
        for (int64_t c0 = 0; c0 < Dv; c0 += PAIR_COLS) {
            int64_t nc = Dv - c0 < PAIR_COLS ? Dv - c0 : PAIR_COLS;
            for (int64_t pr0 = k0 / 2; pr0 < pr_end; pr0 += 16) {
                int64_t n = pr_end - pr0 < 16 ? pr_end - pr0 : 16;
                for (int64_t r = 0; r < n; r++) {
                    int64_t key = 2 * (pr0 + r), at = b * vs[0] + key * vs[1] + hk * vs[2] + c0;
                    uint32_t *w = pair + r * nc;
                    if (key < limit)
                        plan->uk->rows.interleave_u16(
                            (size_t)nc, bf16_row(plan->uk, v, t, at, 1, nc, tmp[0]),
                            key + 1 < limit ? bf16_row(plan->uk, v, t, at + vs[1], 1, nc, tmp[1]) : NULL, w);
                    else
                        memset(w, 0, (size_t)nc * sizeof(uint32_t));
                }
                plan->uk->rows.transpose((size_t)n, (size_t)nc, (const float *)(const void *)pair, (size_t)nc,
                                         (float *)(void *)(v2 + c0 * skv2 + pr0), (size_t)skv2);
            }
        }
        return;
    }
    for (int64_t pr0 = k0 / 2; pr0 < pr_end; pr0 += 16) {
        int64_t pr1 = pr0 + 16 < pr_end ? pr0 + 16 : pr_end;
        for (int64_t e = 0; e < Dv; e++)
            for (int64_t pr = pr0; pr < pr1; pr++) {
                int64_t at = b * vs[0] + 2 * pr * vs[1] + hk * vs[2] + e * vs[3];
                v2[e * skv2 + pr] = 2 * pr < limit ? pair_at(v, t, at, at + vs[1], 2 * pr + 1 < limit) : 0;
            }
    }
}

/* K: (key r, pair e) at k2 + r * D2 + e (in place: the caller's row r);
 * V^T: (key pair r, column c) at v2 + r + c * Skv2. */
static void kv_views(const fmha_plan *plan, const void *k, const void *v, const char *unit, int64_t b,
                     int64_t hk, int64_t k0, fmha_kv_view *kv, fmha_kv_view *vv) {
    int64_t D2 = (int64_t)pairs(plan->p.head_dim), skv2 = (int64_t)pairs(plan->p.seq_kv);
    const uint32_t *k2 = (const uint32_t *)unit;
    const uint32_t *v2 = (const uint32_t *)(unit + words_bytes((size_t)(plan->p.seq_kv * D2)));
    if (k_in_place(plan, k)) {
        const int64_t *ks = plan->p.k_strides;
        const uint32_t *rows = (const uint32_t *)k + (b * ks[0] + hk * ks[2]) / 2;
        *kv = (fmha_kv_view){rows + k0 * (ks[1] / 2), ks[1] / 2, 1};
    } else {
        *kv = (fmha_kv_view){k2 + k0 * D2, D2, 1};
    }
    *vv = (fmha_kv_view){v2 + k0 / 2, 1, skv2};
}

static size_t q_bytes(const fmha_plan *plan) {
    return pairs(plan->p.head_dim) * plan->uk->tile.nr * sizeof(uint32_t);
}

static void q_pack(const fmha_plan *plan, const void *q, int64_t b, int64_t h, int64_t q0, int64_t nq,
                   void *qt) {
    const int64_t *qs = plan->p.q_strides;
    pack_pairs_transposed(plan->uk, q, plan->p.dtype, b * qs[0] + q0 * qs[1] + h * qs[2], qs[1], qs[3], nq,
                          plan->p.head_dim, plan->uk->tile.nr, qt);
}

static void scores(const fmha_plan *plan, fmha_kv_view kv, int64_t nk, const void *qt, float *st) {
    const fmha_ukernels *uk = plan->uk;
    const uint32_t *k2 = kv.p;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->bf16.mr) {
        size_t m = (size_t)(nk - r) < uk->bf16.mr ? (size_t)(nk - r) : uk->bf16.mr;
        uk->bf16.gemm(m, pairs(plan->p.head_dim), k2 + r * kv.rs, kv.rs, kv.cs, qt, uk->tile.nr,
                      st + (size_t)r * uk->tile.nr, uk->tile.nr, FMHA_UK_STORE, NULL, plan->scale);
    }
}

/* P^T pairs [2][rows2][NR]: rounded, then the rounding residual. */
static size_t p_bytes(const fmha_plan *plan, size_t rows) {
    return 2 * pairs((int64_t)rows) * plan->uk->tile.nr * sizeof(uint32_t);
}

/* ot = ot * alpha + V^T P^T from P^T's pair-rows hi and, unless NULL,
 * those of its rounding residual lo. */
static void values_from_pairs(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const uint32_t *hi,
                              const uint32_t *lo, float *ot, int mode, const float *alpha) {
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr, kp = pairs(nk);
    const uint32_t *v2 = vv.p;
    int64_t Dv = plan->p.head_dim_v;
    for (int64_t c = 0; c < Dv; c += (int64_t)uk->bf16.mr) {
        size_t m = (size_t)(Dv - c) < uk->bf16.mr ? (size_t)(Dv - c) : uk->bf16.mr;
        const uint32_t *a = v2 + c * vv.cs;
        uk->bf16.gemm(m, kp, a, vv.cs, vv.rs, hi, nr, ot + (size_t)c * nr, nr, mode, alpha, 1.0f);
        if (lo)
            uk->bf16.gemm(m, kp, a, vv.cs, vv.rs, lo, nr, ot + (size_t)c * nr, nr, FMHA_UK_ACCUMULATE,
                          NULL, 1.0f);
    }
}

/* ot = ot * alpha + V^T P^T, P^T as bf16 pairs plus (precision ACCURATE)
 * the pairs of its rounding residual: rounding P alone adds an error as
 * large as rounding O itself. */
static void values(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const float *pt, void *scratch,
                   float *ot, int mode, const float *alpha) {
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr, kp = pairs(nk);
    uint32_t *hi = scratch, *lo = hi + kp * nr;
    int split = !fmha_pairs_round_p(plan);
    for (size_t pr = 0; pr < kp; pr++) {
        const float *a = pt + 2 * pr * nr, *b = 2 * pr + 1 < (size_t)nk ? pt + (2 * pr + 1) * nr : NULL;
        if (split) uk->bf16.pair_rows_split(a, b, hi + pr * nr, lo + pr * nr);
        else uk->bf16.pair_rows(a, b, hi + pr * nr);
    }
    values_from_pairs(plan, vv, nk, hi, split ? lo : NULL, ot, mode, alpha);
}

/* values, P^T's pair-rows given (precision FAST). */
static void values_paired(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const void *pairs, float *ot,
                          int mode, const float *alpha) {
    values_from_pairs(plan, vv, nk, pairs, NULL, ot, mode, alpha);
}

/* ---- backward ---- */

/* Where P is rounded (fmha_pairs_round_p), the gradient products run on pairs too. */
static int pair_grads(const fmha_plan *plan) { return fmha_pairs_round_p(plan); }

/* Q^T pairs [D2][NR], dO^T pairs [Dv2][NR], then Q rows [NR][D_pad] and dO
 * rows [NR][Dv_pad]: query-row pairs [NR/2][*_pad] (FAST), or float32. */
static void qblock_carve(const fmha_plan *plan, fmha_carver *c, const void *q, const void *d_o,
                         int64_t b, int64_t h, int64_t q0, fmha_bwd_qblock *blk) {
    const fmha_problem *p = &plan->p;
    size_t nr = plan->uk->tile.nr, d_pad = fmha_pad_nr(plan, p->head_dim),
           dv_pad = fmha_pad_nr(plan, p->head_dim_v);
    size_t rows = pair_grads(plan) ? nr / 2 : nr; /* 4-byte words: pairs or floats */
    blk->qt = fmha_carve(c, pairs(p->head_dim) * nr * sizeof(uint32_t));
    blk->dot = fmha_carve(c, pairs(p->head_dim_v) * nr * sizeof(uint32_t));
    blk->qrows = fmha_carve(c, rows * d_pad * sizeof(uint32_t));
    blk->dorows = fmha_carve(c, rows * dv_pad * sizeof(uint32_t));
    blk->qrows_ld = d_pad;
    blk->dorows_ld = dv_pad;
    blk->rows_in_place = 0;
}

static void qblock_pack(const fmha_plan *plan, const void *q, const void *d_o, int64_t b, int64_t h,
                        int64_t q0, int64_t nq, const fmha_bwd_qblock *blk) {
    const fmha_problem *p = &plan->p;
    const int64_t *qs = p->q_strides, *os = p->o_strides;
    size_t nr = plan->uk->tile.nr;
    int64_t qfirst = b * qs[0] + q0 * qs[1] + h * qs[2], ofirst = b * os[0] + q0 * os[1] + h * os[2];
    const fmha_dtype t = p->dtype;
    pack_pairs_transposed(plan->uk, q, t, qfirst, qs[1], qs[3], nq, p->head_dim, nr, (uint32_t *)blk->qt);
    pack_pairs_transposed(plan->uk, d_o, t, ofirst, os[1], os[3], nq, p->head_dim_v, nr, (uint32_t *)blk->dot);
    if (pair_grads(plan)) {
        pack_pairs_across_rows(plan->uk, q, t, qfirst, qs[1], qs[3], nq, p->head_dim, nr / 2, (uint32_t *)blk->qrows,
                               blk->qrows_ld);
        pack_pairs_across_rows(plan->uk, d_o, t, ofirst, os[1], os[3], nq, p->head_dim_v, nr / 2,
                               (uint32_t *)blk->dorows, blk->dorows_ld);
        return;
    }
    fmha_pack_rows_f32(q, p->dtype, qfirst, qs[1], qs[3], nq, p->head_dim, nr, (float *)blk->qrows,
                       blk->qrows_ld);
    fmha_pack_rows_f32(d_o, p->dtype, ofirst, os[1], os[3], nq, p->head_dim_v, nr,
                       (float *)blk->dorows, blk->dorows_ld);
}

/* K pairs [Bc][D2], V pairs [Bc][Dv2] (along dv), float32 K rows [Bc][D_pad]
 * (dQ's operand, or FAST the guarded dQ's); FAST also K key-row pairs
 * [Bc/2][D_pad] and the A operands' scratch: query pairs [Bc][NR/2], then
 * key pairs [Bc/2][NR]. */
static void keys_carve(const fmha_plan *plan, fmha_carver *c, fmha_bwd_keys *keys) {
    size_t bc = plan->uk->tile.block_kv, nr = plan->uk->tile.nr, d_pad = fmha_pad_nr(plan, plan->p.head_dim);
    keys->k_op = fmha_carve(c, bc * pairs(plan->p.head_dim) * sizeof(uint32_t));
    keys->v_op = fmha_carve(c, bc * pairs(plan->p.head_dim_v) * sizeof(uint32_t));
    keys->krows = fmha_carve(c, bc * d_pad * sizeof(float));
    keys->k_grad = keys->krows;
    keys->a_op = NULL;
    if (pair_grads(plan)) {
        keys->k_grad = fmha_carve(c, pairs((int64_t)bc) * d_pad * sizeof(uint32_t));
        keys->a_op = fmha_carve(c, 2 * pairs((int64_t)bc) * nr * sizeof(uint32_t));
    }
}

static void keys_pack(const fmha_plan *plan, const void *k, const void *v, int64_t b, int64_t hk,
                      int64_t k0, int64_t nk, int guarded, const fmha_bwd_keys *keys) {
    const fmha_problem *p = &plan->p;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    int64_t kfirst = b * ks[0] + k0 * ks[1] + hk * ks[2], vfirst = b * vs[0] + k0 * vs[1] + hk * vs[2];
    pack_pairs_rows(plan->uk, k, p->dtype, kfirst, ks[1], ks[3], nk, p->head_dim, keys->k_op);
    pack_pairs_rows(plan->uk, v, p->dtype, vfirst, vs[1], vs[3], nk, p->head_dim_v, keys->v_op);
    /* FAST: float32 K rows only for the guarded dQ */
    if (!pair_grads(plan) || guarded)
        fmha_pack_rows_f32(k, p->dtype, kfirst, ks[1], ks[3], nk, p->head_dim, plan->uk->tile.block_kv,
                           keys->krows, fmha_pad_nr(plan, p->head_dim));
    if (pair_grads(plan))
        pack_pairs_across_rows(plan->uk, k, p->dtype, kfirst, ks[1], ks[3], nk, p->head_dim, pairs(nk), keys->k_grad,
                               fmha_pad_nr(plan, p->head_dim));
}

static void bwd_scores(const fmha_plan *plan, const fmha_bwd_keys *keys, const fmha_bwd_qblock *blk,
                       int64_t nk, float *pt, float *dpt) {
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr, D2 = pairs(plan->p.head_dim), Dv2 = pairs(plan->p.head_dim_v);
    const uint32_t *k2 = keys->k_op, *v2 = keys->v_op;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->bf16.mr) {
        size_t m = (size_t)(nk - r) < uk->bf16.mr ? (size_t)(nk - r) : uk->bf16.mr;
        uk->bf16.gemm(m, D2, k2 + (size_t)r * D2, (ptrdiff_t)D2, 1, blk->qt, nr, pt + (size_t)r * nr,
                      nr, FMHA_UK_STORE, NULL, plan->scale);
        uk->bf16.gemm(m, Dv2, v2 + (size_t)r * Dv2, (ptrdiff_t)Dv2, 1, blk->dot, nr,
                      dpt + (size_t)r * nr, nr, FMHA_UK_STORE, NULL, 1.0f);
    }
}

/* FAST: dV += P^T dO and dK += dS^T Q with P^T, dS^T rounded row by row
 * (adjacent queries paired) against query-row pairs of dO and Q; dQ += dS K
 * with those bf16 rows of dS^T interleaved two keys at a time (dS rounded
 * once) against key-row pairs of K. */
static void bwd_grads(const fmha_plan *plan, const fmha_bwd_keys *keys, const fmha_bwd_qblock *blk,
                      size_t nq, size_t nk, const float *pt, const float *dpt, float *dv, float *dk,
                      float *dq) {
    if (!pair_grads(plan)) {
        fmha_bwd_grads_f32(plan, keys, blk, nq, nk, pt, dpt, dv, dk, dq);
        return;
    }
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr, half = nr / 2, d_pad = fmha_pad_nr(plan, plan->p.head_dim),
           dv_pad = fmha_pad_nr(plan, plan->p.head_dim_v), qp = pairs((int64_t)nq);
    /* a [nk][NR/2] query pairs; a_keys [nk/2][NR] key pairs */
    uint32_t *a = keys->a_op, *a_keys = a + pairs((int64_t)uk->tile.block_kv) * nr;
    uk->bf16.pack_rows(nk, nq, pt, nr, a, half);
    fmha_gemm_panels(uk, 1, nk, qp, a, (ptrdiff_t)half, 1, blk->dorows, blk->dorows_ld, dv, dv_pad, dv_pad);
    uk->bf16.pack_rows(nk, nq, dpt, nr, a, half);
    fmha_gemm_panels(uk, 1, nk, qp, a, (ptrdiff_t)half, 1, blk->qrows, blk->qrows_ld, dk, d_pad, d_pad);
    if (!dq) return;
    /* row r of a as bf16: dS^T[r][0 .. nq) at ds16 + r * NR */
    const uint16_t *ds16 = (const uint16_t *)a;
    for (size_t pr = 0; 2 * pr < nk; pr++)
        uk->rows.interleave_u16(nq, ds16 + 2 * pr * nr, 2 * pr + 1 < nk ? ds16 + (2 * pr + 1) * nr : NULL,
                           a_keys + pr * nr);
    fmha_gemm_panels(uk, 1, nq, pairs((int64_t)nk), a_keys, 1, (ptrdiff_t)nr, keys->k_grad, d_pad, dq, d_pad,
                     d_pad);
}

const fmha_operand_path fmha_path_bf16 = {
    "bf16",
    unit_bytes, kv_pack, kv_views, q_bytes, q_pack, scores, p_bytes, values,
    qblock_carve, qblock_pack, keys_carve, keys_pack, bwd_scores, bwd_grads, values_paired,
};
