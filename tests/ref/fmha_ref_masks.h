/* fmha_ref_masks.h: the float64 reference with every mask and bias of
 * fmha_problem (window, causal in both alignments, lengths, segments, dense
 * mask, mask callback; dense bias, ALiBi, T5 table, softcap, bias callback)
 * and the gradients of the bias parameters. The oracle of the mask and bias
 * tests; per-element loops in double, no tiles. */
#ifndef FMHA_REF_MASKS_H
#define FMHA_REF_MASKS_H

#include "fmha.h"

/* The scale the library uses for p: p->scale, or 1/sqrt(D) when it is +0.0. */
double fmha_ref_full_scale(const fmha_problem *p);

/* 1 if query i of (batch b, query head h) may see key j under every mask of
 * p (AND of causal, window, lengths, segments, dense mask and the mask
 * callback, which is asked about the 1 x 1 tile (i, j) on thread 0). */
int fmha_ref_full_visible(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);

/* Sum of the additive biases at (b, h, i, j) in double: dense + ALiBi +
 * relative-position table + bias callback (asked about the 1 x 1 tile). */
double fmha_ref_full_bias(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);

/* Forward with every mask and bias of p, and its attention sinks. q, k, v use p's strides (float32).
 * Outputs contiguous double: o [B, Sq, Hq, Dv], lse [B, Hq, Sq] (may be
 * NULL). A fully masked row gives o = 0, lse = -inf. Returns 0, or -1 if
 * allocation failed. */
int fmha_ref_forward_full(const fmha_problem *p, const float *q, const float *k, const float *v,
                          double *o, double *lse);
/* The same with every weight exp(s - max) below FLT_MIN taken as exactly 0
 * (float32's underflow): a seen key's V still multiplies it, so an
 * infinity there gives NaN (0 x inf) where the float64 weight keeps inf.
 * A float32 kernel may give either, by where its exp underflows. */
int fmha_ref_forward_full_f32_weights(const fmha_problem *p, const float *q, const float *k, const float *v,
                                      double *o, double *lse);

/* Backward of L = sum(O * dO), d_o with p->o_strides. Outputs contiguous
 * double: dq [B, Sq, Hq, D], dk [B, Skv, Hkv, D], dv [B, Skv, Hkv, Dv] (dk,
 * dv summed over the query heads of a group), and, each optional (NULL):
 *   d_bias_dense [B, Hq, Sq, Skv]  dL/dbias at every score: the dense bias's
 *                gradient before any broadcast reduction (and a callback
 *                bias's gradient); 0 where masked
 *   d_alibi      [Hq]             dL/dslope, computed even without slopes
 *   d_rel_table  [Hq, rel_num_buckets] (needs rel_num_buckets >= 1)
 * Returns 0, or -1 on allocation failure or a missing bucket count. */
int fmha_ref_backward_full(const fmha_problem *p, const float *q, const float *k, const float *v,
                           const float *d_o, double *dq, double *dk, double *dv,
                           double *d_bias_dense, double *d_alibi, double *d_rel_table);

/* The same, and ds_scale [B, Hq, Sq, Skv] (may be NULL): P (|dP| + |sum_k P
 * dP|) per score, the size of the terms dS = P (dP - sum_k P dP) subtracts.
 * A float32 dS is accurate to a few epsilons of it (even where dS is 0), so
 * sums of dS are judged against sums of ds_scale. rel_scale [Hq,
 * rel_num_buckets] (may be NULL): ds_scale summed as d_rel_table sums dS,
 * without a buffer of every score. */
int fmha_ref_backward_full_ex(const fmha_problem *p, const float *q, const float *k,
                              const float *v, const float *d_o, double *dq, double *dk, double *dv,
                              double *d_bias_dense, double *d_alibi, double *d_rel_table,
                              double *ds_scale, double *rel_scale);

#endif /* FMHA_REF_MASKS_H */
