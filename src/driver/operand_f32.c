/* operand_f32.c: the float32 operand paths and the choice of a path.
 *   fmha_path_f32      float32 tensors: K is read in place from the caller's
 *                      memory with any strides (from a per-call copy where
 *                      the tuning asks: k_copy_bytes), V in place when its
 *                      rows suit the value product and else from a copy
 *                      (f32_values);
 *                      Q^T (and in the backward dO^T, plus rows when not
 *                      unit-stride) is packed.
 *   fmha_path_widened  bf16 and f16 on kernels without bf16 products: K and V
 *                      of each (batch, kv head) are widened to float32 once per
 *                      call, then everything runs as float32.
 * Both run the products on the float32 GEMM microkernel (the gradient
 * products in fmha_bwd_grads_f32, shared with the bf16 path's precision
 * ACCURATE); scale enters as its ab_scale, so Q is packed unscaled and a large scale cannot overflow Q. */
#include <string.h>

#include "runtime/convert.h"
#include "format/format.h"
#include "config/tuning.h"
#include "operand.h"

static size_t floats_bytes(size_t n) { return fmha_round_up(n * sizeof(float), FMHA_ALIGN); }

void fmha_pack_rows_f32(const void *src, fmha_dtype t, int64_t first, int64_t rs, int64_t cs,
                        int64_t n, int64_t cols, size_t nr, float *rows, size_t ld) {
    if (t == FMHA_DTYPE_F32 && cs == 1) { /* float32 rows: copies, zeros only in the padding */
        const float *x = (const float *)src + first;
        for (int64_t i = 0; i < n; i++) {
            memcpy(rows + (size_t)i * ld, x + i * rs, (size_t)cols * sizeof(float));
            memset(rows + (size_t)i * ld + cols, 0, (ld - (size_t)cols) * sizeof(float));
        }
        memset(rows + (size_t)n * ld, 0, (nr - (size_t)n) * ld * sizeof(float));
        return;
    }
    memset(rows, 0, nr * ld * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < cols; e++)
            rows[(size_t)i * ld + (size_t)e] = fmha_load(src, t, first + i * rs + e * cs);
}

/* tr[e][i] = X[i][e] widened, [cols][NR], zero lanes past n. */
static void pack_transposed_f32(const fmha_ukernels *uk, const void *src, fmha_dtype t, int64_t first, int64_t rs,
                                int64_t cs, int64_t n, int64_t cols, size_t nr, float *tr) {
    if (n < (int64_t)nr)
        for (int64_t e = 0; e < cols; e++) memset(tr + (size_t)e * nr + n, 0, (nr - (size_t)n) * sizeof(float));
    if (t == FMHA_DTYPE_F32 && cs == 1 && rs > 0) { /* rows of unit stride: the kernel */
        uk->rows.transpose((size_t)n, (size_t)cols, (const float *)src + first, (size_t)rs, tr, nr);
        return;
    }
    if (t == FMHA_DTYPE_F32) { /* no conversion: plain loads */
        const float *x = src;
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < cols; e++) tr[(size_t)e * nr + (size_t)i] = x[first + i * rs + e * cs];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < cols; e++)
            tr[(size_t)e * nr + (size_t)i] = fmha_load(src, t, first + i * rs + e * cs);
}

/* ---- forward ---- */

/* V rows in the forward's own copy: [Skv][ld] per (batch, kv head), or
 * [Bc][ld] per tile in the value product's scratch. ld is Dv rounded to
 * whole cache lines, then made an odd number of lines. */
static size_t v_copy_ld(const fmha_plan *plan) {
    size_t ld = fmha_round_up((size_t)plan->p.head_dim_v, 16);
    return (ld / 16) % 2 ? ld : ld + 16;
}

/* 1 when rows rs floats apart are not a whole even number of cache lines
 * apart: at 4 KiB ([B, S, H, D], H = 8, D = 128) the rows one product walks
 * share a few L1 sets. */
static int rows_spread(int64_t rs) { return rs % 16 != 0 || (rs / 16) % 2 == 1; }

static void in_place_views(const fmha_plan *plan, const void *k, const void *v, const char *unit,
                           int64_t b, int64_t hk, int64_t k0, fmha_kv_view *kv, fmha_kv_view *vv) {
    const int64_t *ks = plan->p.k_strides, *vs = plan->p.v_strides;
    *kv = (fmha_kv_view){(const float *)k + b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3]};
    *vv = (fmha_kv_view){(const float *)v + b * vs[0] + k0 * vs[1] + hk * vs[2], vs[1], vs[3]};
}

/* Widened unit: kf [Skv][D] then vf [Skv][v_copy_ld], float32. */
static size_t widened_unit_bytes(const fmha_plan *plan) {
    size_t skv = (size_t)plan->p.seq_kv;
    return floats_bytes(skv * (size_t)plan->p.head_dim) + floats_bytes(skv * v_copy_ld(plan));
}

/* dst[r][e] = value e of K's (which 0) or V's (1) row of key k0 + r, kv
 * head hk, batch b, in float32 with its format's scales, r < nk, e < len
 * (rows ld floats apart): the format's load kernel for rows of unit stride. */
static void widen_rows(const fmha_plan *plan, int which, const void *x, const int64_t *st, int64_t b, int64_t hk,
                       int64_t k0, int64_t nk, int64_t len, float *dst, size_t ld) {
    const fmha_cache_format_id id = which ? plan->v_format : plan->k_format;
    const fmha_cache_format *f = fmha_cache_format_at(id);
    const fmha_cache_load_ukernel_fn load = plan->uk->cache[id].load;
    float sc[64];
    for (int64_t r0 = 0; r0 < nk; r0 += 64) {
        const int64_t n = nk - r0 < 64 ? nk - r0 : 64;
        const int scaled = f->scales == FMHA_SCALES_PER_KEY || f->scales == FMHA_SCALES_PER_HEAD;
        if (scaled) fmha_kv_scales_of(&plan->p, which, b, hk, k0 + r0, n, sc);
        for (int64_t r = r0; r < r0 + n; r++) {
            const int64_t at = b * st[0] + (k0 + r) * st[1] + hk * st[2];
            float *row = dst + (size_t)r * ld;
            if (st[3] == 1)
                load((size_t)len, (const char *)x + at * (int64_t)f->unit_bytes, row);
            else
                for (int64_t e = 0; e < len; e++) row[e] = fmha_format_value(f, x, at, e, st[3]);
            if (scaled)
                for (int64_t e = 0; e < len; e++) row[e] *= sc[r - r0];
        }
    }
}

static void widened_kv_pack(const fmha_plan *plan, const void *k, const void *v, int64_t b,
                            int64_t hk, int64_t k0, int64_t nk, char *unit) {
    const fmha_problem *p = &plan->p;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    int64_t D = p->head_dim, Dv = p->head_dim_v;
    size_t ld = v_copy_ld(plan);
    float *kf = (float *)unit, *vf = (float *)(unit + floats_bytes((size_t)(p->seq_kv * D)));
    widen_rows(plan, 0, k, ks, b, hk, k0, nk, D, kf + k0 * D, (size_t)D);
    widen_rows(plan, 1, v, vs, b, hk, k0, nk, Dv, vf + (size_t)k0 * ld, ld);
}

static void widened_views(const fmha_plan *plan, const void *k, const void *v, const char *unit,
                          int64_t b, int64_t hk, int64_t k0, fmha_kv_view *kv, fmha_kv_view *vv) {
    int64_t D = plan->p.head_dim;
    const float *vf = (const float *)(unit + floats_bytes((size_t)(plan->p.seq_kv * D)));
    *kv = (fmha_kv_view){(const float *)unit + k0 * D, D, 1};
    size_t ld = v_copy_ld(plan);
    *vv = (fmha_kv_view){vf + (size_t)k0 * ld, (int64_t)ld, 1};
}

static size_t f32_q_bytes(const fmha_plan *plan) {
    return (size_t)plan->p.head_dim * plan->uk->tile.nr * sizeof(float);
}

/* qt[d][i] = Q[b, q0 + i, h, d] widened, [D][NR]. */
static void f32_q_pack(const fmha_plan *plan, const void *q, int64_t b, int64_t h, int64_t q0,
                       int64_t nq, void *qt) {
    const int64_t *qs = plan->p.q_strides;
    pack_transposed_f32(plan->uk, q, plan->p.dtype, b * qs[0] + q0 * qs[1] + h * qs[2], qs[1], qs[3], nq,
                        plan->p.head_dim, plan->uk->tile.nr, qt);
}

static void f32_scores(const fmha_plan *plan, fmha_kv_view kv, int64_t nk, const void *qt, float *st) {
    const fmha_ukernels *uk = plan->uk;
    const float *k = kv.p;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->tile.mr) {
        size_t m = (size_t)(nk - r) < uk->tile.mr ? (size_t)(nk - r) : uk->tile.mr;
        uk->tile.gemm(m, (size_t)plan->p.head_dim, k + r * kv.rs, kv.rs, kv.cs, qt, uk->tile.nr,
                     st + (size_t)r * uk->tile.nr, uk->tile.nr, FMHA_UK_STORE, NULL, plan->scale);
    }
}

static size_t no_p_bytes(const fmha_plan *plan, size_t rows) { return 0; }

/* ot = ot * alpha + V^T P^T: A element (c, r) = V[r][c]. */
static void values_product(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const float *pt,
                           float *ot, int mode, const float *alpha) {
    const fmha_ukernels *uk = plan->uk;
    const float *v = vv.p;
    int64_t Dv = plan->p.head_dim_v;
    for (int64_t c = 0; c < Dv; c += (int64_t)uk->tile.mr) {
        size_t m = (size_t)(Dv - c) < uk->tile.mr ? (size_t)(Dv - c) : uk->tile.mr;
        uk->tile.gemm(m, (size_t)nk, v + c * vv.cs, vv.cs, vv.rs, pt, uk->tile.nr, ot + (size_t)c * uk->tile.nr,
                     uk->tile.nr, mode, alpha, 1.0f);
    }
}

/* V is read from a copy when the tiled forward reads V rows whose stride
 * is a whole even number of cache lines (or not unit-stride) and one head's
 * V is at least F32_VCOPY_MIN_HEAD_BYTES: below that it stays in L2 and in
 * place costs less than copying (measured, S <= 512 at D = 128: in place
 * 1-3% faster; S = 1024: the copy 25% faster). The copy of every (batch, kv
 * head) is made once per call when it serves at least F32_VCOPY_MIN_USES
 * query blocks and stays within F32_VCOPY_MAX_BYTES; otherwise each tile is
 * copied as the product needs it. */
enum { F32_VCOPY_MIN_USES = 4 };
#define F32_VCOPY_MIN_HEAD_BYTES ((size_t)256 << 10)
#define F32_VCOPY_MAX_BYTES ((size_t)64 << 20)

static int v_copy_pays(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    int rows_fit = p->v_strides[3] == 1 && rows_spread(p->v_strides[1]);
    return plan->strategy != FMHA_STRATEGY_DENSE && !rows_fit &&
           (size_t)(p->seq_kv * p->head_dim_v) * sizeof(float) >= F32_VCOPY_MIN_HEAD_BYTES;
}

/* K rows in the forward's own copy: [Skv][k_copy_ld], D rounded to whole
 * cache lines: contiguous rows, a page holding several. */
static size_t k_copy_ld(const fmha_plan *plan) { return fmha_round_up((size_t)plan->p.head_dim, 16); }

/* K is copied with V's per-call copy when the tuning asks for it from
 * this size of one head's K on (k_copy_bytes) and its rows are not
 * contiguous already. In [B, S, H, D] each key's row of a head is H D
 * floats from the next, a page apart at 1-4 KiB: the score product walks
 * a page per key. Measured on a Xeon (design.md, "Tunings"): at
 * S = 2048, D = 128 the forward ran 11% faster on the copy; Zen 4 read K
 * in place at 82-89% of the FMA peak (generic: no copy). */
static int k_copy_pays(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    const int64_t from = plan->uk->tuning->k_copy_bytes;
    const int rows_contiguous = p->k_strides[3] == 1 && (size_t)p->k_strides[1] == k_copy_ld(plan);
    return from > 0 && plan->strategy != FMHA_STRATEGY_DENSE && !rows_contiguous &&
           p->seq_kv * p->head_dim * (int64_t)sizeof(float) >= from;
}

/* The per-call copy of one (batch, kv head): K rows [Skv][k_copy_ld] when
 * k_copy_pays, then V rows [Skv][v_copy_ld] when v_copy_pays; *k_bytes
 * receives the bytes of its K part. 0 when neither pays, or when the copy
 * would serve fewer than F32_VCOPY_MIN_USES query blocks or pass
 * F32_VCOPY_MAX_BYTES in all. */
static size_t f32_copy_layout(const fmha_plan *plan, size_t *k_bytes) {
    const fmha_problem *p = &plan->p;
    size_t q_blocks = ((size_t)p->seq_q + plan->uk->tile.nr - 1) / plan->uk->tile.nr;
    *k_bytes = k_copy_pays(plan) ? floats_bytes((size_t)p->seq_kv * k_copy_ld(plan)) : 0;
    size_t unit = *k_bytes + (v_copy_pays(plan) ? floats_bytes((size_t)p->seq_kv * v_copy_ld(plan)) : 0);
    if (!unit || q_blocks * (size_t)plan->group < F32_VCOPY_MIN_USES ||
        unit * (size_t)(p->batch * p->heads_kv) > F32_VCOPY_MAX_BYTES)
        return *k_bytes = 0;
    return unit;
}

static size_t f32_unit_bytes(const fmha_plan *plan) {
    size_t k_bytes;
    return f32_copy_layout(plan, &k_bytes);
}

/* Rows [k0, k0 + nk) of K[b, :, hk, :] and V[b, :, hk, :] (those the
 * layout copies) into the unit's rows k0.. */
static void f32_kv_pack(const fmha_plan *plan, const void *k, const void *v, int64_t b, int64_t hk,
                        int64_t k0, int64_t nk, char *unit) {
    const int64_t *ks = plan->p.k_strides, *vs = plan->p.v_strides;
    size_t k_bytes, kld = k_copy_ld(plan), vld = v_copy_ld(plan);
    const size_t all = f32_copy_layout(plan, &k_bytes);
    if (k_bytes)
        fmha_pack_rows_f32(k, FMHA_DTYPE_F32, b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3], nk, plan->p.head_dim,
                           (size_t)nk, (float *)unit + (size_t)k0 * kld, kld);
    if (all > k_bytes)
        fmha_pack_rows_f32(v, FMHA_DTYPE_F32, b * vs[0] + k0 * vs[1] + hk * vs[2], vs[1], vs[3], nk,
                           plan->p.head_dim_v, (size_t)nk, (float *)(unit + k_bytes) + (size_t)k0 * vld, vld);
}

/* K and V in place, or from the per-call copy of those it holds. */
static void f32_views(const fmha_plan *plan, const void *k, const void *v, const char *unit, int64_t b,
                      int64_t hk, int64_t k0, fmha_kv_view *kv, fmha_kv_view *vv) {
    in_place_views(plan, k, v, unit, b, hk, k0, kv, vv);
    if (!unit) return;
    size_t k_bytes;
    const size_t all = f32_copy_layout(plan, &k_bytes);
    if (k_bytes) *kv = (fmha_kv_view){(const float *)unit + (size_t)k0 * k_copy_ld(plan), (int64_t)k_copy_ld(plan), 1};
    if (all > k_bytes) {
        size_t ld = v_copy_ld(plan);
        *vv = (fmha_kv_view){(const float *)(unit + k_bytes) + (size_t)k0 * ld, (int64_t)ld, 1};
    }
}

/* Per-tile copies: V worth copying, without the per-call copy. */
static size_t f32_p_bytes(const fmha_plan *plan, size_t rows) {
    if (!v_copy_pays(plan) || f32_unit_bytes(plan)) return 0;
    return floats_bytes(rows * v_copy_ld(plan));
}

/* The value product of the caller's V (or the path's copy). It walks one
 * V row per key; in a [B, S, H, D] tensor rows are H D floats apart (4 KiB
 * at H = 8, D = 128), each in its own page and, with an even number of
 * lines between them, in the same few L1 sets. Once a head's V outgrows L2
 * every k-step waited on it: at S = 1024, D = 128 the product ran at 55-60%
 * of the FMA peak against the score product's ~100%. Rows copied an odd
 * number of lines apart (the per-call copy, else this tile's) restore it. */
static void f32_values(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const float *pt,
                       void *scratch, float *ot, int mode, const float *alpha) {
    if (scratch && f32_p_bytes(plan, 1)) {
        size_t ld = v_copy_ld(plan);
        fmha_pack_rows_f32(vv.p, FMHA_DTYPE_F32, 0, vv.rs, vv.cs, nk, plan->p.head_dim_v, (size_t)nk, scratch, ld);
        vv = (fmha_kv_view){scratch, (int64_t)ld, 1};
    }
    values_product(plan, vv, nk, pt, ot, mode, alpha);
}

static void widened_values(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const float *pt,
                           void *scratch, float *ot, int mode, const float *alpha) {
    values_product(plan, vv, nk, pt, ot, mode, alpha);
}

/* ---- backward ---- */

/* Q^T [D][NR], dO^T [Dv][NR], then Q rows [NR][D_pad] and dO rows
 * [NR][Dv_pad] unless `in_place` reads the caller's rows (float32 with unit
 * innermost stride, head dims that fill whole panels, f32_rows_in_place). */
static void qblock_carve(const fmha_plan *plan, fmha_carver *c, const void *q, const void *d_o,
                         int64_t b, int64_t h, int64_t q0, fmha_bwd_qblock *blk, int in_place) {
    const fmha_problem *p = &plan->p;
    size_t nr = plan->uk->tile.nr, d_pad = fmha_pad_nr(plan, p->head_dim),
           dv_pad = fmha_pad_nr(plan, p->head_dim_v);
    blk->qt = fmha_carve(c, (size_t)p->head_dim * nr * sizeof(float));
    blk->dot = fmha_carve(c, (size_t)p->head_dim_v * nr * sizeof(float));
    if (in_place) {
        const int64_t *qs = p->q_strides, *os = p->o_strides;
        /* measuring (no tensors yet): nothing to point at */
        blk->qrows = q ? (const float *)q + b * qs[0] + q0 * qs[1] + h * qs[2] : NULL;
        blk->dorows = d_o ? (const float *)d_o + b * os[0] + q0 * os[1] + h * os[2] : NULL;
        blk->qrows_ld = (size_t)qs[1];
        blk->dorows_ld = (size_t)os[1];
        blk->rows_in_place = 1;
    } else {
        blk->qrows = fmha_carve(c, nr * d_pad * sizeof(float));
        blk->dorows = fmha_carve(c, nr * dv_pad * sizeof(float));
        blk->qrows_ld = d_pad;
        blk->dorows_ld = dv_pad;
        blk->rows_in_place = 0;
    }
}

/* Q and dO rows the gradient products read in place; rows_spread fails
 * them otherwise and they are packed (once per query block, in the
 * pre-pass): the backward ran 4% (D = 64) to 8% (D = 128) faster at
 * S = 1024 for it. */
static int f32_rows_in_place(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    return p->q_strides[3] == 1 && p->o_strides[3] == 1 && rows_spread(p->q_strides[1]) &&
           rows_spread(p->o_strides[1]) &&
           (size_t)p->head_dim == fmha_pad_nr(plan, p->head_dim) &&
           (size_t)p->head_dim_v == fmha_pad_nr(plan, p->head_dim_v);
}

static void f32_qblock_carve(const fmha_plan *plan, fmha_carver *c, const void *q, const void *d_o,
                             int64_t b, int64_t h, int64_t q0, fmha_bwd_qblock *blk) {
    qblock_carve(plan, c, q, d_o, b, h, q0, blk, f32_rows_in_place(plan));
}

static void widened_qblock_carve(const fmha_plan *plan, fmha_carver *c, const void *q,
                                 const void *d_o, int64_t b, int64_t h, int64_t q0,
                                 fmha_bwd_qblock *blk) {
    qblock_carve(plan, c, q, d_o, b, h, q0, blk, 0);
}

static void f32_qblock_pack(const fmha_plan *plan, const void *q, const void *d_o, int64_t b,
                            int64_t h, int64_t q0, int64_t nq, const fmha_bwd_qblock *blk) {
    const fmha_problem *p = &plan->p;
    const int64_t *qs = p->q_strides, *os = p->o_strides;
    size_t nr = plan->uk->tile.nr;
    int64_t qfirst = b * qs[0] + q0 * qs[1] + h * qs[2], ofirst = b * os[0] + q0 * os[1] + h * os[2];
    pack_transposed_f32(plan->uk, q, p->dtype, qfirst, qs[1], qs[3], nq, p->head_dim, nr, (float *)blk->qt);
    pack_transposed_f32(plan->uk, d_o, p->dtype, ofirst, os[1], os[3], nq, p->head_dim_v, nr, (float *)blk->dot);
    if (!blk->rows_in_place) {
        fmha_pack_rows_f32(q, p->dtype, qfirst, qs[1], qs[3], nq, p->head_dim, nr,
                           (float *)blk->qrows, blk->qrows_ld);
        fmha_pack_rows_f32(d_o, p->dtype, ofirst, os[1], os[3], nq, p->head_dim_v, nr,
                           (float *)blk->dorows, blk->dorows_ld);
    }
}

/* K rows [Bc][D_pad] (also dQ's operand) and V rows [Bc][Dv_pad]. */
static void f32_keys_carve(const fmha_plan *plan, fmha_carver *c, fmha_bwd_keys *keys) {
    size_t bc = plan->uk->tile.block_kv;
    keys->krows = fmha_carve(c, bc * fmha_pad_nr(plan, plan->p.head_dim) * sizeof(float));
    keys->k_op = keys->krows;
    keys->k_grad = keys->krows;
    keys->a_op = NULL;
    keys->v_op = fmha_carve(c, bc * fmha_pad_nr(plan, plan->p.head_dim_v) * sizeof(float));
}

static void f32_keys_pack(const fmha_plan *plan, const void *k, const void *v, int64_t b, int64_t hk,
                          int64_t k0, int64_t nk, int guarded, const fmha_bwd_keys *keys) {
    (void)guarded; /* krows are the scores' operand: always packed */
    const fmha_problem *p = &plan->p;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    size_t bc = plan->uk->tile.block_kv;
    fmha_pack_rows_f32(k, p->dtype, b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3], nk, p->head_dim,
                       bc, keys->krows, fmha_pad_nr(plan, p->head_dim));
    fmha_pack_rows_f32(v, p->dtype, b * vs[0] + k0 * vs[1] + hk * vs[2], vs[1], vs[3], nk,
                       p->head_dim_v, bc, keys->v_op, fmha_pad_nr(plan, p->head_dim_v));
}

static void f32_bwd_scores(const fmha_plan *plan, const fmha_bwd_keys *keys,
                           const fmha_bwd_qblock *blk, int64_t nk, float *pt, float *dpt) {
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr, d_pad = fmha_pad_nr(plan, plan->p.head_dim),
           dv_pad = fmha_pad_nr(plan, plan->p.head_dim_v);
    const float *krows = keys->k_op, *vrows = keys->v_op;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->tile.mr) {
        size_t m = (size_t)(nk - r) < uk->tile.mr ? (size_t)(nk - r) : uk->tile.mr;
        uk->tile.gemm(m, (size_t)plan->p.head_dim, krows + (size_t)r * d_pad, (ptrdiff_t)d_pad, 1,
                     blk->qt, nr, pt + (size_t)r * nr, nr, FMHA_UK_STORE, NULL, plan->scale);
        uk->tile.gemm(m, (size_t)plan->p.head_dim_v, vrows + (size_t)r * dv_pad, (ptrdiff_t)dv_pad, 1,
                     blk->dot, nr, dpt + (size_t)r * nr, nr, FMHA_UK_STORE, NULL, 1.0f);
    }
}

void fmha_gemm_panels(const fmha_ukernels *uk, int pairs, size_t rows, size_t k, const void *a,
                      ptrdiff_t a_rs, ptrdiff_t a_cs, const void *b, size_t ldb, float *c, size_t ldc,
                      size_t ncols_pad) {
    const float *af = a, *bf = b;
    const uint32_t *a2 = a, *b2 = b;
    const size_t mr = pairs ? uk->bf16.mr : uk->tile.mr;
    for (size_t c0 = 0; c0 < ncols_pad; c0 += uk->tile.nr)
        for (size_t r = 0; r < rows; r += mr) {
            size_t m = rows - r < mr ? rows - r : mr;
            ptrdiff_t at = (ptrdiff_t)r * a_rs;
            float *cr = c + r * ldc + c0;
            if (pairs)
                uk->bf16.gemm(m, k, a2 + at, a_rs, a_cs, b2 + c0, ldb, cr, ldc, FMHA_UK_ACCUMULATE, NULL, 1.0f);
            else
                uk->tile.gemm(m, k, af + at, a_rs, a_cs, bf + c0, ldb, cr, ldc, FMHA_UK_ACCUMULATE, NULL, 1.0f);
        }
}

/* dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j (A element (i, r) =
 * dS^T[r][i]). */
void fmha_bwd_grads_f32(const fmha_plan *plan, const fmha_bwd_keys *keys, const fmha_bwd_qblock *blk,
                        size_t nq, size_t nk, const float *pt, const float *dpt, float *dv, float *dk,
                        float *dq) {
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr, d_pad = fmha_pad_nr(plan, plan->p.head_dim),
           dv_pad = fmha_pad_nr(plan, plan->p.head_dim_v);
    fmha_gemm_panels(uk, 0, nk, nq, pt, (ptrdiff_t)nr, 1, blk->dorows, blk->dorows_ld, dv, dv_pad, dv_pad);
    fmha_gemm_panels(uk, 0, nk, nq, dpt, (ptrdiff_t)nr, 1, blk->qrows, blk->qrows_ld, dk, d_pad, d_pad);
    if (dq) fmha_gemm_panels(uk, 0, nq, nk, dpt, 1, (ptrdiff_t)nr, keys->k_grad, d_pad, dq, d_pad, d_pad);
}

const fmha_operand_path fmha_path_f32 = {
    "f32",
    f32_unit_bytes, f32_kv_pack, f32_views, f32_q_bytes, f32_q_pack, f32_scores, f32_p_bytes, f32_values,
    f32_qblock_carve, f32_qblock_pack, f32_keys_carve, f32_keys_pack, f32_bwd_scores,
    fmha_bwd_grads_f32, NULL,
};

const fmha_operand_path fmha_path_widened = {
    "widened",
    widened_unit_bytes, widened_kv_pack, widened_views, f32_q_bytes, f32_q_pack, f32_scores,
    no_p_bytes, widened_values,
    widened_qblock_carve, f32_qblock_pack, f32_keys_carve, f32_keys_pack, f32_bwd_scores,
    fmha_bwd_grads_f32, NULL,
};
