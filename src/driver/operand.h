/* operand.h: operand paths, how the products of the drivers read their
 * operands for one (dtype, ISA). A path packs Q (and dO), packs or views K
 * and V, and runs the score and value products (and the backward's
 * gradient products); it is chosen once when a call is planned, and the drivers make one indirect call per step without
 * ever testing the dtype. The tables:
 *   fmha_path_f32      float32, K read in place from the caller, V in place
 *                      or from rows copied an odd number of cache lines apart
 *   fmha_path_widened  bf16 or f16 widened to float32 copies (any ISA)
 *   fmha_path_bf16     bf16 pairs on vdpbf16ps (tables with gemm_bf16); the
 *                      gradient products too with precision FAST
 * A new dtype or operand format (fp8, int8 caches) is a new table here plus
 * the switch sites -Wswitch names. */
#ifndef FMHA_OPERAND_H
#define FMHA_OPERAND_H

#include <stddef.h>
#include <stdint.h>

#include "core/attn.h"

/* A K or V tile as a GEMM's broadcast operand: element (r, e) (key r, head
 * dim e; a pair index on the bf16 path) at p + r * rs + e * cs, counted in
 * the path's words (float, or uint32 pairs). */
typedef struct fmha_kv_view {
    const void *p;
    int64_t rs, cs;
} fmha_kv_view;

/* Operands of one backward query block (pointers into the packed area, or
 * the caller's rows when the path reads them in place). */
typedef struct fmha_bwd_qblock {
    const void *qt;          /* Q^T as the score product reads it */
    const void *dot;         /* dO^T as the dP product reads it */
    /* Q and dO rows as the dK and dV products read them: float32 [NR][ld],
     * or bf16 query-row pairs [NR/2][ld] words (word (p, e) holds rows 2p
     * and 2p + 1 of column e) */
    const void *qrows, *dorows;
    size_t qrows_ld, dorows_ld;
    int rows_in_place;       /* qrows, dorows are the caller's: nothing to pack */
    const float *lse, *dsum; /* [NR]; padding lanes -inf and 0 */
} fmha_bwd_qblock;

/* Per-thread operands of one backward key block. */
typedef struct fmha_bwd_keys {
    void *k_op;     /* K as the score product reads it */
    void *v_op;     /* V as the dP product reads it */
    float *krows;   /* [Bc][D_pad] float32 K rows (may alias k_op) */
    void *k_grad;   /* K as the dQ product reads it (krows, or key-row pairs) */
    void *a_op;     /* scratch of the gradient products' A operands, or NULL */
} fmha_bwd_keys;

struct fmha_operand_path {
    const char *name;

    /* ---- forward ---- */
    /* Bytes of K and V packed for one (batch, kv head); 0 reads them in place. */
    size_t (*kv_unit_bytes)(const fmha_plan *plan);
    /* Packs keys [k0, k0 + nk) of (b, hk) into its unit (only when unit bytes > 0). */
    void (*kv_pack)(const fmha_plan *plan, const void *k, const void *v, int64_t b, int64_t hk,
                    int64_t k0, int64_t nk, char *unit);
    /* K and V views of keys k0.. of (b, hk): unit is its packed area or NULL. */
    void (*kv_views)(const fmha_plan *plan, const void *k, const void *v, const char *unit,
                     int64_t b, int64_t hk, int64_t k0, fmha_kv_view *kv, fmha_kv_view *vv);
    /* Bytes of one packed Q^T block, and its packing (lanes >= nq zero). */
    size_t (*q_bytes)(const fmha_plan *plan);
    void (*q_pack)(const fmha_plan *plan, const void *q, int64_t b, int64_t h, int64_t q0, int64_t nq,
                   void *qt);
    /* st[r][*] = scale * K_r . Q^T for r < nk: S^T [nk][NR]. */
    void (*scores)(const fmha_plan *plan, fmha_kv_view kv, int64_t nk, const void *qt, float *st);
    /* Bytes of the scratch the value product needs for `rows` keys. */
    size_t (*p_bytes)(const fmha_plan *plan, size_t rows);
    /* ot = ot * alpha + V^T P^T over nk keys (STORE ignores ot, alpha). */
    void (*values)(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const float *pt, void *scratch,
                   float *ot, int mode, const float *alpha);

    /* ---- backward ---- */
    /* Carves one packed query block from `c` (measures when c->base is NULL)
     * and points *blk at it; rows the path reads in place point into q and
     * d_o. Fills nothing. */
    void (*bwd_qblock_carve)(const fmha_plan *plan, fmha_carver *c, const void *q, const void *d_o,
                             int64_t b, int64_t h, int64_t q0, fmha_bwd_qblock *blk);
    /* Packs Q and dO rows [q0, q0 + nq) of (b, h) into a carved block. */
    void (*bwd_qblock_pack)(const fmha_plan *plan, const void *q, const void *d_o, int64_t b,
                            int64_t h, int64_t q0, int64_t nq, const fmha_bwd_qblock *blk);
    /* Carves the per-thread key operands. */
    void (*bwd_keys_carve)(const fmha_plan *plan, fmha_carver *c, fmha_bwd_keys *keys);
    /* Packs keys [k0, k0 + nk) of (b, hk); krows only when the products
     * read them or `guarded` (the block holds a NaN or inf: the guarded dQ
     * reads them). */
    void (*bwd_keys_pack)(const fmha_plan *plan, const void *k, const void *v, int64_t b, int64_t hk,
                          int64_t k0, int64_t nk, int guarded, const fmha_bwd_keys *keys);
    /* pt = scale K Q^T and dpt = V dO^T, [nk][NR] each. */
    void (*bwd_scores)(const fmha_plan *plan, const fmha_bwd_keys *keys, const fmha_bwd_qblock *blk,
                       int64_t nk, float *pt, float *dpt);
    /* From pt = P^T and dpt = dS^T ([nk][NR]) of nq queries and nk keys:
     * dv [nk][Dv_pad] += P^T dO, dk [nk][D_pad] += dS^T Q and, unless dq is
     * NULL, dq [nq][D_pad] += dS K; float32 accumulation, fixed order. */
    void (*bwd_grads)(const fmha_plan *plan, const fmha_bwd_keys *keys, const fmha_bwd_qblock *blk,
                      size_t nq, size_t nk, const float *pt, const float *dpt, float *dv, float *dk,
                      float *dq);

    /* ---- optional (NULL where a path has no such form) ---- */
    /* values with P^T already rounded to bf16 pair-rows [(nk + 1) / 2][NR]
     * (the table's softmax_pairs_bf16, written into the values scratch). */
    void (*values_paired)(const fmha_plan *plan, fmha_kv_view vv, int64_t nk, const void *pairs, float *ot,
                          int mode, const float *alpha);
};

extern const fmha_operand_path fmha_path_f32;
extern const fmha_operand_path fmha_path_widened;
extern const fmha_operand_path fmha_path_bf16;

/* The path of a dtype, at a precision, on a kernel table. */
const fmha_operand_path *fmha_operand_path_for(fmha_dtype dtype, fmha_precision precision, const fmha_ukernels *uk);

/* 1 where the bf16 path rounds P (and the backward's dS) to bf16: every
 * precision it runs at but ACCURATE (a bf16 problem's FAST, a float32
 * one's BF16), which splits P into pairs of its value and residual. */
static inline int fmha_pairs_round_p(const fmha_plan *plan) { return plan->precision != FMHA_PRECISION_ACCURATE; }

/* Head dims padded to whole NR panels (the backward's row buffers). */
static inline size_t fmha_pad_nr(const fmha_plan *plan, int64_t n) {
    return fmha_round_up((size_t)n, plan->uk->tile.nr);
}

/* C[rows][ncols_pad] += A B over column panels of NR, MR rows at a time,
 * on uk->tile.gemm, or with `pairs` on uk->bf16.gemm (k then counts pairs);
 * A and B are in 4-byte words (float or pair), strides as the kernels'. */
void fmha_gemm_panels(const fmha_ukernels *uk, int pairs, size_t rows, size_t k, const void *a,
                      ptrdiff_t a_rs, ptrdiff_t a_cs, const void *b, size_t ldb, float *c, size_t ldc,
                      size_t ncols_pad);

/* bwd_grads as float32 GEMMs on float32 rows. */
void fmha_bwd_grads_f32(const fmha_plan *plan, const fmha_bwd_keys *keys, const fmha_bwd_qblock *blk,
                        size_t nq, size_t nk, const float *pt, const float *dpt, float *dv, float *dk,
                        float *dq);

/* Float32 rows of a strided block: rows[i][e] = X[i][e] widened, [NR][ld],
 * zero past n rows and cols columns; X element (i, e) at src[first + i*rs + e*cs]. */
void fmha_pack_rows_f32(const void *src, fmha_dtype t, int64_t first, int64_t rs, int64_t cs,
                        int64_t n, int64_t cols, size_t nr, float *rows, size_t ld);

#endif /* FMHA_OPERAND_H */
