/* ukernel.h: the contract between the driver and the per-ISA microkernels.
 *
 * The driver owns tiles, threads and memory; a microkernel owns registers.
 * Every ISA implements the same contracts and lists its kernels as parts
 * (declared at the end), composed into one complete table; the ISA
 * registry of src/config/cpu.c lists the ISAs with their CPU checks and selects
 * one at run time. Only files under src/uk/<isa>/ get ISA flags.
 *
 * Every microkernel has a plain-C specification in src/uk/scalar/ that the
 * tests hold the SIMD kernels to: the float32 ones are the scalar table's
 * kernels (f32.c), the bf16 ones stand alone (bf16.h), since the scalar
 * table runs bf16 through widened float32 tiles.
 *
 * Layout idea ("transposed tiles"): the NR lanes of a register always run
 * over queries (forward) or over the contiguous dimension of B. Scores are
 * kept as S^T [keys][NR queries], so the softmax over keys is a vertical
 * (lane-wise) max/sum with no horizontal reductions, and both GEMMs of the
 * forward read K and V straight from the caller's memory as the broadcast
 * operand (any strides), with nothing packed but Q^T per query block.
 */
#ifndef FMHA_UKERNEL_H
#define FMHA_UKERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "format/format.h"

/* GEMM microkernel: C[m x NR] (op)= ab_scale * A[m x k] * B[k x NR].
 *   a     element (r, p) at a[r * a_rs + p * a_cs]: the broadcast operand,
 *         any non-negative strides (r < m, p < k).
 *   b     row p at b + p * ldb: NR contiguous floats (rows need not be aligned).
 *   c     row r at c + r * ldc: NR contiguous floats.
 *   mode  FMHA_UK_STORE:      C = s A B
 *         FMHA_UK_ACCUMULATE: C = C + s A B
 *         FMHA_UK_RESCALE:    C = C * col_scale[col] + s A B  (col_scale: NR floats)
 *   ab_scale (s) multiplies the product in every mode. It is applied once to
 *   the finished sum A B, not to an operand, so a large s with small operands
 *   (or a small s with large ones) gives the representable result without
 *   overflowing (or underflowing) on the way.
 *   1 <= m <= MR, k >= 1 (k == 0 is allowed and gives C = 0, C, or C*scale).
 *   All NR columns are computed (callers pad B to NR columns); rows r >= m of C
 *   are never read or written. */
enum { FMHA_UK_STORE = 0, FMHA_UK_ACCUMULATE = 1, FMHA_UK_RESCALE = 2 };

typedef void (*fmha_f32_gemm_ukernel_fn)(size_t m, size_t k, const float *a, ptrdiff_t a_rs,
                                         ptrdiff_t a_cs, const float *b, size_t ldb, float *c,
                                         size_t ldc, int mode, const float *col_scale,
                                         float ab_scale);

/* Online-softmax step over a score tile, in place.
 *   s      S^T tile: row r (a key) at s + r * lds, NR floats (lanes = queries);
 *          on return it holds P^T = exp(S^T - m_new) (0 where S is -inf).
 *   rows   >= 1 keys in the tile.
 *   m, l   NR running maxima and sums, updated:
 *            m_new = max(m, max_r s[r]); l = l * alpha + sum_r P[r]
 *   alpha  NR outputs: exp(m_old - m_new), the factor the caller applies to its
 *          running output.
 *   A lane whose m_new is -inf (every score so far masked) is treated as if
 *   m_new were 0: its P is 0, alpha is 0 on the first tile, l stays 0.
 *   NaN and infinities follow IEEE, the same in every ISA: the max is NaN
 *   when any operand is, so a NaN score (or a NaN m) makes m_new NaN and
 *   that lane's P, alpha and l NaN, in this tile and every later one; a +inf
 *   score makes m_new +inf, its own P NaN (exp(inf - inf)), the lane's
 *   finite scores' P 0 and so l NaN; -inf scores give P = 0, never NaN. */
typedef void (*fmha_f32_softmax_ukernel_fn)(size_t rows, float *s, size_t lds, float *m,
                                            float *l, float *alpha);

/* Backward: probabilities recomputed from the forward's lse, in place.
 *   s[r][i] = exp(s[r][i] - sub[i]) for r < rows, i < NR; a lane whose sub is
 *   -inf (a fully masked or padding query) gives 0 whatever s holds (NaN and
 *   inf included), and s = -inf gives 0. Otherwise IEEE: a NaN s or sub
 *   gives NaN, s = +inf (sub finite) and overflow give +inf. */
typedef void (*fmha_f32_exp_sub_ukernel_fn)(size_t rows, float *s, size_t lds, const float *sub);

/* Backward: dS = P * (dP - Dsum), in place in dp.
 *   dp[r][i] = p[r][i] * (dp[r][i] - dsum[i]) for r < rows, i < NR, one
 *   subtraction and one multiplication as IEEE has them (NaN in, NaN out;
 *   0 * inf = NaN), the same in every ISA. */
typedef void (*fmha_f32_ds_ukernel_fn)(size_t rows, const float *p, float *dp, size_t lds,
                                       const float *dsum);

/* Bias epilogue: adds a tensor stored with queries as rows to a score tile,
 * transposing it: st[r][i] += src[i * q_stride + r] for r < nk, i < nq
 * (nq <= NR; src rows are contiguous over keys). */
typedef void (*fmha_f32_add_transposed_ukernel_fn)(size_t nk, size_t nq, const float *src,
                                                   ptrdiff_t q_stride, float *st, size_t lds);

/* Forward epilogue: the transposed accumulator ot [cols][ldt] (lanes run
 * over rows) written out as rows, each scaled:
 *   o[i * ldo + c] = ot[c * ldt + i] * scale[i]   for i < rows (<= 64), c < cols
 * (one IEEE multiplication each). Returns the rows with a NaN or an infinity
 * among their outputs, bit i for row i. */
typedef uint64_t (*fmha_f32_finish_ukernel_fn)(size_t rows, size_t cols, const float *ot, size_t ldt,
                                               const float *scale, float *o, size_t ldo);
/* y[i] = fmaf(a, x[i], y[i]) for i < n: one rounding each, so every ISA
 * gives the specification's bits (the split-KV merges' weighted sums). */
typedef void (*fmha_f32_axpy_ukernel_fn)(size_t n, float a, const float *x, float *y);
/* x[r * ldx + j] *= sc[j] for r < rows, j < n: one rounding each (the
 * decode driver's per-key scales on scores and on P). */
typedef void (*fmha_f32_scale_columns_ukernel_fn)(size_t rows, size_t n, const float *sc, float *x, size_t ldx);
/* 1 when some x[r * ldx + j] (r < rows, j < n) is a NaN or an infinity,
 * else 0 (the decode driver's check of the integer scores). */
typedef int (*fmha_f32_nonfinite_ukernel_fn)(size_t rows, size_t n, const float *x, size_t ldx);

/* Packing: dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols, a
 * copy of the 32-bit words' bits (the bf16 path moves pairs of bf16 with
 * it; a NaN keeps its payload). */
typedef void (*fmha_f32_transpose_ukernel_fn)(size_t rows, size_t cols, const float *src, size_t lds, float *dst,
                                              size_t ldd);
void fmha_f32_axpy_ukernel__scalar(size_t n, float a, const float *x, float *y);
void fmha_f32_scale_columns_ukernel__scalar(size_t rows, size_t n, const float *sc, float *x, size_t ldx);
int fmha_f32_nonfinite_ukernel__scalar(size_t rows, size_t n, const float *x, size_t ldx);
void fmha_f32_transpose_ukernel__scalar(size_t rows, size_t cols, const float *src, size_t lds, float *dst,
                                        size_t ldd);
/* Its specification (uk/scalar/f32.c). */
uint64_t fmha_f32_finish_ukernel__scalar(size_t rows, size_t cols, const float *ot, size_t ldt,
                                         const float *scale, float *o, size_t ldo);
/* Narrowing: dst[i] = the bf16 nearest src[i] (ties to even; a NaN keeps
 * its sign and top payload bits and is made quiet; no flush of subnormals:
 * fmha_f32_to_bf16's bits), i < n. */
typedef void (*fmha_f32_to_bf16_ukernel_fn)(size_t n, const float *src, uint16_t *dst);
void fmha_f32_to_bf16_ukernel__scalar(size_t n, const float *src, uint16_t *dst);
/* Pairing two rows of 16-bit values (bf16 rows of V into the pairs of the
 * value product): dst[i] = lo[i] | hi[i] << 16 for i < n, hi NULL pairing
 * with 0. Moves bits only. */
typedef void (*fmha_u16_interleave_ukernel_fn)(size_t n, const uint16_t *lo, const uint16_t *hi, uint32_t *dst);
void fmha_u16_interleave_ukernel__scalar(size_t n, const uint16_t *lo, const uint16_t *hi, uint32_t *dst);

/* ---- bfloat16 (AVX-512 BF16, AMX, Arm BF16 machines) ----
 * bf16 GEMMs take both operands in pairs along k, the layout of vdpbf16ps:
 * one 32-bit word holds (X[2p], X[2p+1]) for k-steps 2p, 2p+1 (element 2p in
 * the low half). Odd k is padded with a zero pair half. C is float32. */

/* C[m x NR] (op)= ab_scale * A[m x 2kp] * B[2kp x NR] (MR: the bf16 part's).
 *   a       pair (r, p) = (A[r][2p], A[r][2p+1]) at a[r * a_rs + p * a_cs] (32-bit words)
 *   b       pair-row p at b + p * ldb (32-bit words): NR words, word i holds
 *           (B[2p][i], B[2p+1][i])
 *   c, ldc, mode, col_scale, ab_scale as for the float32 GEMM.
 *   1 <= m <= MR; kp >= 0 pairs.
 * Arithmetic (vdpbf16ps): each pair-step adds the two bf16 products, exact
 * in float32, to a float32 accumulator, each addition rounded to nearest
 * even; the summation order across pair-steps is the kernel's. The
 * instruction also flushes subnormal inputs and results to zero, which the
 * scalar specification (src/uk/scalar/bf16.c) does not.
 * Arithmetic (Arm BFDOT / BFMMLA without FEAT_EBF16, the neonbf16 table):
 * BFDotAdd per pair-step, its products, their sum and the addition each
 * rounded to odd, subnormals flushed, the default NaN (FPCR not read); each
 * accumulator starts at +0 and takes the pair-steps in order, then C is
 * finished as above: bit for bit fmha_bf16_gemm_ukernel_4x16__arm. */
typedef void (*fmha_bf16_gemm_ukernel_fn)(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                                          ptrdiff_t a_cs, const uint32_t *b, size_t ldb, float *c,
                                          size_t ldc, int mode, const float *col_scale,
                                          float ab_scale);

/* Rounds (nearest even) and pairs two float32 rows into one pair-row:
 *   dst[i] = (bf16(lo[i]), bf16(hi[i])) for i < NR; hi == NULL pairs with 0.
 * NaN stays NaN with its sign. A kernel may turn a float32 subnormal into a
 * zero of its sign (vcvtne2ps2bf16 does). */
typedef void (*fmha_bf16_pair_rows_ukernel_fn)(const float *lo, const float *hi, uint32_t *dst);

/* Rounds float32 rows to pairs of adjacent elements, rounding as pair_rows:
 *   dst[r * ldd + p] = (bf16(src[r * lds + 2p]), bf16(src[r * lds + 2p + 1]))
 * for r < rows, p < (n + 1) / 2; an odd n pairs its last element with 0
 * (src[r * lds + n] is not read). Words past (n + 1) / 2 are not written. */
typedef void (*fmha_bf16_pack_rows_ukernel_fn)(size_t rows, size_t n, const float *src, size_t lds,
                                               uint32_t *dst, size_t ldd);

/* Online-softmax step with P delivered as bf16 pair-rows (the bf16 FAST
 * forward): m, l and alpha bitwise as the table's softmax_lowp_f32 leaves
 * them on the same s, and pairs[p * NR + i] bitwise as its pair_rows_bf16
 * makes of that softmax's P rows 2p and 2p + 1 (an odd rows' last row paired
 * with 0), p < (rows + 1) / 2. s is only read: P never exists as float32 in
 * memory. */
typedef void (*fmha_bf16_softmax_pairs_ukernel_fn)(size_t rows, const float *s, size_t lds, float *m, float *l,
                                                   float *alpha, uint32_t *pairs);

/* Pairs two float32 rows a, b (b NULL: zeros) as pair_rows does into hi,
 * and the pairs of the rounding residuals a - bf16(a), b - bf16(b) into lo:
 * a GEMM over hi and then lo sees the rows to about 16 significant bits. */
typedef void (*fmha_bf16_pair_rows_split_ukernel_fn)(const float *a, const float *b, uint32_t *hi,
                                                     uint32_t *lo);

/* ---- decoding: keys in the lanes ----
 * A decode step serves a few query rows (the query heads of one key/value
 * head times the query positions) from one pass over K and V, so the lanes
 * run over keys (scores) and over the value dimension (the output); from
 * 16 rows the scores may run rows in the lanes instead (scores_qt). K and V rows have contiguous elements in a cache format
 * (src/format/format.h); a format's kernels read its rows in place and widen in
 * registers, and rows of a format without them are first loaded into
 * float32 rows (fmha_cache_load_ukernel_fn) for the float32 format's. */

/* s[r][j] = scale * sum_e q[r * ldq + e] * K(j, e)
 * for r < rows, j < nk, e < d, K(j, e) element e of the row at k + j * ldk
 * (ldk counts the format's storage units: floats for float32, bytes for the
 * 8-bit and block formats). scale multiplies the
 * finished dot product. A format's kernel gives the float32 kernel's bits
 * on the loaded rows. */
typedef void (*fmha_cache_scores_ukernel_fn)(size_t rows, size_t nk, size_t d, const float *q,
                                             size_t ldq, const void *k, size_t ldk, float *s,
                                             size_t lds, float scale);

/* The float32 scores of many rows, rows in the lanes: the same s[r][j]
 * as fmha_cache_scores_ukernel_fn, with the query transposed, qt[e * 16
 * + r] = q[r][e] for r < rows <= 16 (lanes past rows: any finite value),
 * K float32 rows ldk floats apart. Each (row, key) is summed e = 0, 1, ...
 * in one chain of fmaf from zero, then scaled: the scalar float32 scores'
 * bits. A K element broadcast feeds one FMA of 16 rows, and one 16 x 16
 * transposition a block of 16 keys replaces the per-block sums of the
 * keys-in-lanes kernels. */
typedef void (*fmha_f32_decode_scores_qt_ukernel_fn)(size_t rows, size_t nk, size_t d, const float *qt,
                                                     const float *k, size_t ldk, float *s, size_t lds,
                                                     float scale);

/* Online-softmax step along rows (keys run along a row), in place:
 *   m_new[r] = max(m[r], max_j s[r][j]); s[r][j] = exp(s[r][j] - m_new[r]);
 *   alpha[r] = exp(m[r] - m_new[r]); l[r] = l[r] * alpha[r] + sum_j s[r][j]
 * for j < nk, with the conventions of fmha_f32_softmax_ukernel_fn for a row
 * whose m_new is -inf (every score masked: P = 0, l stays 0). */
typedef void (*fmha_f32_decode_softmax_ukernel_fn)(size_t rows, size_t nk, float *s, size_t lds,
                                                   float *m, float *l, float *alpha);

/* o[r][c] = o[r][c] * alpha[r] + sum_j p[r * ldp + j] * V(j, c)
 * for r < rows, c < dv, j < nk (nk >= 0), V(j, c) element c of the row at
 * v + j * ldv (storage units of the format). Scales kept beside the rows
 * (int8's per key, fp8's per head) are the driver's: it multiplies the
 * scores and P by them; block formats' scales are the kernels'. */
typedef void (*fmha_cache_values_ukernel_fn)(size_t rows, size_t nk, size_t dv, const float *p,
                                             size_t ldp, const void *v, size_t ldv, float *o,
                                             size_t ldo, const float *alpha);

/* ---- integer scores on a quantized query ----
 * Under precision FAST the decode driver quantizes each query row once a
 * step as GGUF q8_0 quantizes (llama.cpp's dot-product type for q8_0 and
 * q4_0 keys): blocks of 32 values, each with its scale d = max |x| / 127
 * kept in float32 (not rounded to a half as a q8_0 block stores it) and
 * q = round(x / d), half away from zero (format.h: fmha_q8_quantize_row).
 * The 8-bit and 4-bit formats' keys then meet it in integer dot products. */
typedef struct fmha_q8_rows {
    const int8_t *q;    /* [rows][ld]: row r's values from q + r * ld */
    const float *d;     /* [rows][ld / 32]: the blocks' scales */
    const int32_t *sum; /* [rows][ld / 32]: each block's sum of q (for offsets) */
    size_t ld;          /* a multiple of 32 */
    const void *tiles;  /* the same rows in the tile layout below, where the cache part asks for it, else NULL */
} fmha_q8_rows;

/* The query rows as AMX kernels read them (fmha_q8_rows.tiles; made by
 * fmha_q8_tiles_pack, q8_tiles.c, where fmha_uk_cache.q8_tiles is set):
 * per group of 16 rows (the last padded with zero rows), for each chunk c
 * of 64 values (d / 64 rounded up), two tiles B[h] [16][64] int8 (h = 0, 1:
 * blocks 2c and 2c + 1), tdpbssd's B operand: bytes 4n..4n+3 of tile row kk
 * hold values 64c + 4kk .. 64c + 4kk + 3 of row n when kk / 8 == h, else 0;
 * then for each block b its rows' d [16] float32 and sum [16] int32 (0 for
 * the padding rows). */
static inline size_t fmha_q8_tiles_group_bytes(size_t d) {
    return (d + 63) / 64 * 2048 + (d / 32) * 16 * (sizeof(float) + sizeof(int32_t));
}

/* The tiles of rows [0, rows) of q (fmha_q8_rows.tiles' layout: q8_tiles.c)
 * into out: fmha_q8_tiles_group_bytes(d) bytes for each group of 16 rows. */
void fmha_q8_tiles_pack(size_t rows, size_t d, const fmha_q8_rows *q, void *out);

/* s[r][j] = scale * acc(r, j), r < rows, j < nk, where over the blocks
 * b < d / 32 in order, from acc = 0,
 *   acc = fmaf((float)isum(r, j, b), q->d[r][b] * kd(j, b), acc)
 *   isum(r, j, b) = sum over e of block b of q->q[r][e] * kq(j, e)
 * (an exact int32 sum: every kernel gives these bits), kq(j, e) the
 * integer of element e of the key row at k + j * ldk (bytes) and kd(j, b)
 * its block's scale: int8 the element and 1 (the per-key scale is the
 * driver's, as for the float kernels), q8_0 q and the block's half d,
 * q4_0 nibble - 8 and d. d is a multiple of 32. */
typedef void (*fmha_cache_scores_q8_ukernel_fn)(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q,
                                                const void *k, size_t ldk, float *s, size_t lds, float scale);

/* Scores of float8 keys on the query rounded to bf16 (precision FAST;
 * every float8 value is a bf16 value), and of bf16 keys on a bf16 query
 * (a bf16 problem at FAST, a float32 one at BF16): q [rows][ldq] words, each a pair of
 * bf16 (element 2p in the low half, 2p + 1 in the high), rounded to
 * nearest even by the driver. With vdpbf16ps's arithmetic (each product
 * exact in float32, added high half first, one rounding each) in 16
 * lanes: lane i sums, over the steps t < d / 32 in order, the pairs of
 * elements 32 t + 2 i and 32 t + 2 i + 1 from 0; the lanes' sum is taken
 * as ((G0 + G1) + (G2 + G3)), Gg = (x[4g] + x[4g + 2]) + (x[4g + 1] +
 * x[4g + 3]); then s[r][j] = sum * scale. d a multiple of 32. The
 * specification holds for operands and sums that stay normal (as the bf16
 * GEMM's, ../scalar/bf16.h). */
typedef void (*fmha_cache_scores_bf16_ukernel_fn)(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                                                  const void *k, size_t ldk, float *s, size_t lds, float scale);

/* The same scores with 16 rows in the lanes (float8 and bf16 keys; the
 * decode driver's choice from 10 rows a unit): qt the rows' pairs as
 * tiles, qt[16 p + r] = row r's pair p (p < d / 2; rows past `rows` 0),
 * and for each key a single sum from 0 over the pairs p in order, each
 * pair as vdpbf16ps adds it (high half first, one rounding each); s[r][j]
 * = sum * scale, r < rows <= 16, j < nk. No transposing sum: one
 * vdpbf16ps a pair serves 16 rows. Another order of summation than
 * scores_bf16's, so other bits; the same normal-operand caveat. d a
 * multiple of 32. */
typedef void (*fmha_cache_scores_bf16_qt_ukernel_fn)(size_t rows, size_t nk, size_t d, const uint32_t *qt,
                                                     const void *k, size_t ldk, float *s, size_t lds, float scale);

/* P V on P rounded to bf16, for bf16 and float8 values where the
 * precision rounds P (a bf16 problem at FAST, a float32 one at BF16;
 * every float8 value is a bf16 value):
 *   o[r][c] = fmaf(o[r][c], alpha[r], acc[r][c])
 * where acc[r][c] sums, from 0, over the pairs of keys (2i, 2i + 1) in
 * order, bf16(P[r][2i + 1]) V(2i + 1, c) and then bf16(P[r][2i]) V(2i, c)
 * (vdpbf16ps's arithmetic: each product exact, one rounding each); an odd
 * nk's last pair has neither P nor V past nk; nk <= 128. bf16() rounds to
 * nearest even (fmha_f32_to_bf16). V's row j (bf16, or float8 bytes) at
 * v_rows[j]: the rows of a call may lie anywhere (a paged cache's pages),
 * so a call spans pages without a copy. Holds for operands and sums that
 * stay normal, as scores_bf16's. */
typedef void (*fmha_cache_values_bf16_ukernel_fn)(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                                  const void *const *v_rows, float *o, size_t ldo,
                                                  const float *alpha);

/* P V in integers on P quantized to 16 bits (precision FAST, with the
 * integer scores): for each row r and block b of 32 value columns (the
 * last block of an int8 row may be shorter), over the call's keys j < nk:
 *   w_j = p[r][j] * vd(j, b)               (float32; vd: V's block scale,
 *                                          1 for int8: its per-key scale is
 *                                          the driver's, already in P)
 *   m = max_j |p[r][j]| * max_j |vd(j, b)| (at least every |w_j|), and
 *   when m is finite: s = m / 32767,
 *   inv = m >= 2^-100 ? 32767 / m : 0, P'_j = (int32)rintf(w_j * inv) (to
 *   nearest even, |P'_j| <= 32767); when it is not: P'_j = 0, s = NaN
 *   isum(c) = sum_j P'_j * vq(j, c)          (exact int32)
 *   o[r][c] = fmaf(o[r][c], alpha[r], (float)isum(c) * s)
 * vq, vd as scores_q8's kq, kd, V's row j (its stored bytes) at
 * v_rows[j]: the rows of a call may lie anywhere (a paged cache's pages),
 * so a call spans pages without a copy. P' keeps 15 bits of each block's
 * largest weight: about float32's error on O at a fraction of its
 * products. 1 <= nk <= 64; rows >= 1. A non-finite block scale makes its
 * columns NaN (the driver then recomputes the row,
 * fmha_cache_values_ukernel_fn's rule). */
typedef void (*fmha_cache_values_int_ukernel_fn)(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                                 const void *const *v_rows, float *o, size_t ldo,
                                                 const float *alpha);

/* dst[i] = element i of the row at src as float32, i < n (a multiple of 32
 * for the block formats, src at a block): exact for the float formats (a
 * NaN stays a NaN, possibly quieted); the format's dequantisation
 * (src/format/format.h) bit for bit, without the scales kept beside the rows. */
typedef void (*fmha_cache_load_ukernel_fn)(size_t n, const void *src, float *dst);

/* Dropout on a score tile S^T (rows = keys, lanes = queries), in place:
 *   s[r][i] *= keep(counter[i] + r) ? scale : 0   for r < rows, i < lanes
 * keep(c): z = c ^ seed_mix, then the splitmix64 finalizer
 *   z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9; z = (z ^ z >> 27) * 0x94d049bb133111eb;
 *   z ^= z >> 31, and keep iff (z >> 32) >= threshold (all unsigned 64-bit).
 * Integer arithmetic: every ISA keeps the same scores; the product with
 * scale (or 0) is one IEEE multiplication (0 * NaN = NaN). */
typedef void (*fmha_f32_dropout_ukernel_fn)(size_t rows, size_t lanes, float *s, size_t lds,
                                            const uint64_t *counter, uint64_t seed_mix,
                                            uint64_t threshold, float scale);

/* splitmix64's finalizer, the hash above: a bijection of 64-bit words that
 * mixes every bit (the scalar kernel, the seed's mix, fmha_dropout_keep). */
static inline uint64_t fmha_dropout_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The dropout kernels (uk/scalar/dropout.c, uk/avx512/dropout.c). */
void fmha_f32_dropout_ukernel__scalar(size_t rows, size_t lanes, float *s, size_t lds, const uint64_t *counter,
                                      uint64_t seed_mix, uint64_t threshold, float scale);
void fmha_f32_dropout_ukernel__avx512(size_t rows, size_t lanes, float *s, size_t lds, const uint64_t *counter,
                                      uint64_t seed_mix, uint64_t threshold, float scale);

/* ---- a table's parts ----
 * An ISA's table is composed of parts, each defined once in its ISA's
 * directory and shared by every table that has it (avx512bf16 is avx512's
 * parts plus a bf16 part). fmha_ukernels_compose (src/uk/compose.c) turns
 * the parts into one complete table with the fallbacks below, once per
 * ISA, so no driver tests a kernel pointer for NULL. */

/* Tile arithmetic, lanes bound to NR. Required. */
typedef struct fmha_uk_tile {
    size_t mr;                            /* rows of a GEMM microtile (MR) */
    size_t nr;                            /* lanes of a GEMM microtile (NR); queries per block */
    /* A vector-length-agnostic ISA's NR (a multiple of 16, <= 64), read by
     * the registry on a CPU that runs the ISA, in nr's place; NULL: nr. */
    size_t (*nr_at_run_time)(void);
    size_t block_kv;                      /* keys per tile in the tiled forward (Bc) */
    fmha_f32_gemm_ukernel_fn gemm;
    fmha_f32_softmax_ukernel_fn softmax;
    fmha_f32_exp_sub_ukernel_fn exp_sub;
    fmha_f32_ds_ukernel_fn ds;
    /* softmax and exp_sub whose values carry up to 5e-6 relative error
     * (special values as the exact ones), for the bf16 FAST paths, which
     * round P (and dS) to bf16 (2e-3) right after. Fallback: the exact ones. */
    fmha_f32_softmax_ukernel_fn softmax_lowp;
    fmha_f32_exp_sub_ukernel_fn exp_sub_lowp;
    /* The float32 tile shapes of every table on this part, NULL-terminated,
     * this part first, then tile parts of other MR x NR (their own `shapes`
     * NULL): a tuning's tile_mr x tile_nr picks the one float32 plans run
     * on (config/cpu.c). NULL: this part's shape alone. */
    const struct fmha_uk_tile *const *shapes;
} fmha_uk_tile;

/* bf16 pair products on the tile part's NR. The four kernels after mr come
 * together or not at all; without them bf16 runs through the float32
 * kernels on widened tiles. */
typedef struct fmha_uk_bf16 {
    size_t mr; /* rows of the pair GEMM (a tile unit's 16); fallback: the tile part's MR */
    fmha_bf16_gemm_ukernel_fn gemm;
    fmha_bf16_pair_rows_ukernel_fn pair_rows;
    fmha_bf16_pair_rows_split_ukernel_fn pair_rows_split;
    fmha_bf16_pack_rows_ukernel_fn pack_rows;
    /* the tile part's softmax_lowp and pair_rows in one pass (bf16 FAST
     * forward without dropout); fallback: NULL, the two in turn */
    fmha_bf16_softmax_pairs_ukernel_fn softmax_pairs;
} fmha_uk_bf16;

/* Row kernels: any length, no lanes. Fallback per kernel: the scalar
 * part's (their specifications). */
typedef struct fmha_uk_rows {
    fmha_f32_add_transposed_ukernel_fn add_transposed;
    fmha_f32_finish_ukernel_fn finish;
    fmha_f32_transpose_ukernel_fn transpose;
    fmha_f32_to_bf16_ukernel_fn to_bf16;
    fmha_u16_interleave_ukernel_fn interleave_u16;
    fmha_f32_dropout_ukernel_fn dropout;
    fmha_f32_axpy_ukernel_fn axpy;
    fmha_f32_scale_columns_ukernel_fn scale_columns;
    fmha_f32_nonfinite_ukernel_fn nonfinite;
} fmha_uk_rows;

/* Decoding's softmax. Fallback: none (decode problems then run on the
 * tiled forward); with it the float32 format's scores and values are
 * required. */
typedef struct fmha_uk_decode {
    fmha_f32_decode_softmax_ukernel_fn softmax;
    /* optional: NULL, scores serve every row count */
    fmha_f32_decode_scores_qt_ukernel_fn scores_qt;
    int qt_rows; /* from this many rows a call the driver runs scores_qt */
} fmha_uk_decode;

/* One cache format's kernels. load: fallback the scalar part's. scores and
 * values come together or not at all; fallback: none (rows are loaded into
 * float32 rows for the float32 format's kernels). scores_q8: integer
 * scores on the quantized query (precision FAST, where the format allows
 * it: format.h), reading the format's bytes (in place, or gathered across
 * pages) whether or not the table has scores and values; fallback: none
 * (the float32 query's kernels serve). values_int: P V in integers beside
 * the integer scores, reading V's bytes likewise; fallback: none (the
 * format's values, or float32 rows). scores_bf16: float8 keys' scores on
 * the query rounded to bf16 (precision FAST, or where the precision
 * rounds the query), read as scores_q8 reads, and bf16 keys' where the
 * precision rounds the query (the bf16 pairs); fallback: none.
 * scores_bf16_qt: the same with 16 rows in the lanes, on the query's pair
 * tiles, which the driver makes from DEC_QBT_ROWS rows a unit; fallback:
 * none (scores_bf16 serves). values_bf16: P V on bf16 P where the
 * precision rounds P; fallback: none (the format's values). q8_tiles: the
 * driver makes the query's tiles for scores_q8. widen_rows: from this many
 * rows a call, the driver widens the format's rows once into float32 rows
 * for the float32 format's kernels rather than letting scores and values
 * widen them once per block of rows (the same bits); 0: never. */
typedef struct fmha_uk_cache {
    fmha_cache_load_ukernel_fn load;
    fmha_cache_scores_ukernel_fn scores;
    fmha_cache_values_ukernel_fn values;
    fmha_cache_scores_q8_ukernel_fn scores_q8;
    fmha_cache_values_int_ukernel_fn values_int;
    fmha_cache_scores_bf16_ukernel_fn scores_bf16;
    fmha_cache_scores_bf16_qt_ukernel_fn scores_bf16_qt;
    fmha_cache_values_bf16_ukernel_fn values_bf16;
    int q8_tiles; /* 1: scores_q8 reads the query's tiles (fmha_q8_rows.tiles) */
    int widen_rows;
} fmha_uk_cache;

/* Per-thread set-up and tear-down around a job's tasks, for kernels with
 * thread state (a tile configuration, a streaming mode): begin runs on each
 * thread of a job before its first task, end after its last (pool.h);
 * foreign after a caller's callback returns on the thread (it may have used
 * and changed that state: another library's AMX tiles), so the kernels set
 * it up again before their next use. Fallback: none. */
typedef struct fmha_uk_thread {
    void (*begin)(void);
    void (*end)(void);
    void (*foreign)(void);
} fmha_uk_thread;

/* ---- attention on a matrix engine (AMX tiles) ----
 * Q, K, V and P stay tile-shaped end to end: a part of its own, run by the
 * matrix driver (driver/matrix.c), not through the GEMM contract above.
 * bf16 pairs (32-bit words, element 2p in the low half), packed as:
 *   Q block  [dp / 16][32][16]: per k-step (16 pairs of D), the block's
 *            32 rows (rows past nq and pairs past D zero)
 *   K        [round_up(nk, 32) / 16][dp][16]: per 16 keys, pair p of D of
 *            each (keys past nk and pairs past D zero): tdpbf16ps's B
 *   V        [round_up(nk, 32) / 32][dvp / 16][16][16]: per 32 keys and 16
 *            columns, key pair r, column c (the VNNI B layout)
 * with dp = D / 2 and dvp = Dv, each rounded up to 32 (two tiles a step).
 * Keys of a head are packed from key 0; keys k0.. (k0 a multiple of 32)
 * start at word k0 * dp of K and (k0 / 2) * dvp of V. */
static inline size_t fmha_matrix_dp(size_t d) { return ((d + 1) / 2 + 31) / 32 * 32; }
/* Element formats the packing reads: bf16, float16, float32 (the last two
 * rounded to bf16, with their residuals when asked). */
enum { FMHA_MATRIX_SRC_BF16 = 0, FMHA_MATRIX_SRC_F16, FMHA_MATRIX_SRC_F32 };
static inline size_t fmha_matrix_dvp(size_t dv) { return (dv + 31) / 32 * 32; }

/* One query block of the forward: rows [0, nq) of 32 against keys
 * [kb, ke), row i seeing keys [lo[i], hi[i]) (within [kb, ke); empty for a
 * row that sees none). Runs the online softmax with raw scores s = Q K^T:
 * P = 2^((s - m_ref) scale_log2) rounded to bf16 for the value product, l
 * sums the unrounded P; m_ref is the row's reference maximum, raised (O
 * and l rescaled) only when the block's maximum passes it by more than
 * rescale_log2 / scale_log2 (0: whenever it grows; P then stays <=
 * 2^rescale_log2). Outputs o [32][dvp] = sum P V (unnormalised), m[i] =
 * m_ref (-inf for a row that saw no key) and l[i]. Keys are visited in
 * steps of block_kv (a multiple of 32) on the grid of multiples of
 * block_kv. scale_log2 = |scale| log2(e) > 0: a negative scale is the
 * packed Q's sign. */
typedef struct fmha_matrix_fwd_args {
    size_t nq, dp, dvp, block_kv;
    const uint32_t *qp, *kp, *vp; /* the packed Q block; the head's packed K and V (key 0) */
    /* their residuals (x - bf16(x), packed alike) or NULL: with them Q K^T
     * is Q K + Q K_lo + Q_lo K and P V gains P V_lo */
    const uint32_t *qp_lo, *kp_lo, *vp_lo;
    int64_t kb, ke;
    const int64_t *lo, *hi;       /* [32] */
    float scale_log2, rescale_log2;
    int overlap;                  /* 1: the next block's scores and the last one's P V during the softmax */
    float *o, *m, *l;             /* [32][dvp], [32], [32] */
    float *s;                     /* scratch [2][32][block_kv] */
    uint16_t *p;                  /* scratch [2][32][block_kv] */
    uint16_t *p_lo;               /* scratch [2][32][block_kv] for P's residual (P V gains P_lo V), or NULL */
    uint32_t nonfinite;           /* out: bit i when o's row i holds a NaN or an infinity */
    size_t blocks;                /* out: key blocks computed */
} fmha_matrix_fwd_args;

/* The backward on the tiles: P and dS rounded to bf16 (bf16 at FAST, float32
 * at BF16), or, with `residual`, each as bf16 plus its bf16 rounding
 * residual (bf16 at ACCURATE: dV, dK and dQ each gain the residual's
 * product, as the forward's P V gains P_lo V). Split operands (float16,
 * float32 at BF16X3: kp_lo not NULL, and residual) have every packed
 * operand's residual beside it, and each product takes three terms, the
 * forward's X Y + X Y_lo + X_lo Y. Per key block of n keys (k0 a multiple of 32, n a multiple of 32)
 * and up to 4 query blocks of 32 rows, in the layouts above and:
 *   X^T block  [xr / 16][16][16] words, xr = fmha_matrix_dvp(D or Dv):
 *              row e, pair p = (X[2p][e], X[2p + 1][e]) of the block's 32
 *              rows (fmha_uk_matrix.pack_t); the A operand of dK^T, dV^T
 * the kernel computes, with S = Q K^T raw (Q negated for a negative scale),
 * P = e^(S |scale| - lse) on each row's keys [lo, hi) (0
 * elsewhere), dP = dO V^T and dS = P (dP - dsum):
 *   dvt [dvr][n] += dO^T P,  dkt [dr][n] += Q^T dS  (float32, in memory)
 *   dq rows [32][ldq] += dS K                        (float32, in memory)
 * dK = scale dkt^T and dQ = scale dq are the caller's to scale and store. */
typedef struct fmha_matrix_bwd_qblock {
    const uint32_t *q, *d_o;      /* Q (negated for a negative scale), dO: query blocks as packed for the forward */
    const uint32_t *qt, *d_ot;    /* Q^T (not negated), dO^T: X^T blocks */
    const uint32_t *q_lo, *d_o_lo, *qt_lo, *d_ot_lo; /* split operands: their residuals alike, else NULL */
    const float *lse;             /* [32] the forward's lse; rows past the block's: anything (lo = hi there) */
    const float *dsum;            /* [32] rowsum(dO O) */
    const int64_t *lo, *hi;       /* [32] each row's visible keys */
    float *dq;                    /* [32][ldq] accumulator rows */
} fmha_matrix_bwd_qblock;

typedef struct fmha_matrix_bwd_args {
    size_t dp, dpv;               /* fmha_matrix_dp(D), fmha_matrix_dp(Dv): pairs of Q and K, of dO and V */
    size_t dvp, dr;               /* fmha_matrix_dvp(Dv), fmha_matrix_dvp(D): rows of dvt, of dkt (columns of K packed as V) */
    size_t n;                     /* keys */
    int64_t k0;                   /* the block's first key (the masks') */
    /* the block's keys packed from their first words: K as the forward's
     * (pack_k), V as K is (pack_k over Dv), K as V is (pack_v over D) */
    const uint32_t *kp, *vk, *kv;
    const uint32_t *kp_lo, *vk_lo, *kv_lo; /* split operands: their residuals alike, else NULL */
    size_t nqb;                   /* query blocks, 1..4 */
    const fmha_matrix_bwd_qblock *qb;
    size_t ldq;                   /* floats between dq rows */
    float abs_scale, scale_log2;  /* |scale|, |scale| log2(e) */
    float *dvt, *dkt;             /* [fmha_matrix_dvp(Dv)][ldt], [fmha_matrix_dvp(D)][ldt] float32 accumulators */
    size_t ldt;                   /* floats between their rows (>= n) */
    float *s, *dp_buf;            /* scratch [4][32][n] each */
    uint32_t *p_pairs, *ds_pairs; /* scratch [4][16][n]: P, dS as pairs of rows (the B of dV^T, dK^T) */
    uint16_t *ds;                 /* scratch [4][32][n] bf16: dS rows (the A of dQ) */
    int residual;                 /* 1: P and dS also as their residuals x - bf16(x) (ACCURATE) */
    uint32_t *p_lo_pairs, *ds_lo_pairs; /* scratch [4][16][n] with residual: the residuals as p_pairs, ds_pairs */
    uint16_t *ds_lo;              /* scratch [4][32][n] with residual: dS's residual rows */
} fmha_matrix_bwd_args;

/* Decoding on the tiles: nb blocks of up to 32 rows (the queries of one kv
 * head) against keys [kb, ke) read in place as A tiles: S^T = K Q^T
 * ([keys][rows], the softmax's lanes over rows), then O = P V with P's
 * rows from a register transpose and V's key pairs interleaved a block of
 * 128 keys at a time (no copy of K or V per call). Each key block is read
 * from memory once for all nb row blocks. Key j's rows at k + (j - kb) k_rs
 * and v + (j - kb) v_rs bytes, unit stride, D a multiple of 32.
 *   Q^T block  [D / 32][2][16][16] words: k-step t, rows 16 h..16 h + 15,
 *              word (p, r) = (Q[16 h + r][32 t + 2 p], Q[..][32 t + 2 p + 1])
 *              (pack_qt, from bf16 or rounded to it; zero past nq; negated
 *              for a negative scale)
 * Outputs as the forward's, per row block: o [32][dvp] unnormalised, m
 * (raw score units, -inf for a row that saw no key), l. A range of keys
 * may take several calls, each starting where the last ended: `resume`
 * continues from the o, m and l the last left (o in the kernel's own
 * column order) and `unfinished` leaves o in that order for the next.
 * Calls that start on the 128-key grid from the first call's kb give the
 * one call's bits; others (a paged cache's pages) give bits of their own,
 * the same at every run. */
enum { FMHA_MATRIX_DEC_BLOCKS = 4 };
typedef struct fmha_matrix_dec_args {
    size_t nb;                    /* row blocks, 1..FMHA_MATRIX_DEC_BLOCKS */
    size_t nq, d, dv, dvp;        /* nq: rows of the last block (all others 32) */
    const uint32_t *qt;           /* [nb] Q^T blocks */
    const char *k, *v;            /* key kb's rows */
    ptrdiff_t k_rs, v_rs;         /* bytes between key rows */
    int64_t kb, ke;
    const int64_t *lo, *hi;       /* [nb][32] rows' key ranges */
    float scale_log2, rescale_log2;
    float *o, *m, *l;             /* [nb][32][dvp], [nb][32], [nb][32] */
    float *s;                     /* scratch [nb][128][32] */
    uint16_t *p;                  /* scratch [nb][32][128] bf16 */
    uint32_t *vb;                 /* scratch [4][dvp / 16][16][16] words */
    uint16_t *k_tail;             /* scratch [32][D] bf16: the last keys short of 32, zero-padded */
    int resume, unfinished;       /* 0, 0: one call over the range */
    /* optional: the next call's first keys (rows k_rs and v_rs bytes
     * apart), sent towards L2 during this call's last block */
    const char *next_k, *next_v;
    size_t next_n;
} fmha_matrix_dec_args;

typedef struct fmha_uk_matrix {
    /* Packs rows [0, nq) (nq <= 32) of Q, element e of row i at
     * rows[i][e * cs] in format src (FMHA_MATRIX_SRC_*), negated when
     * `negate`, into a Q block: hi the bf16 nearest each, and lo (when not
     * NULL) the bf16 nearest its residual. */
    void (*pack_q)(size_t nq, size_t d, const void *const *rows, int src, ptrdiff_t cs, int negate, uint32_t *hi,
                   uint32_t *lo);
    /* Packs keys [k0, k0 + nk) of a head (k0 a multiple of 32), element (j, e)
     * of key k0 + j at k[j * rs + e * cs], into its K and V (from key k0's
     * words, as above; nk not a multiple of 32 only for the head's last
     * keys), with residuals as pack_q. */
    void (*pack_k)(size_t nk, size_t d, const void *k, int src, ptrdiff_t rs, ptrdiff_t cs, uint32_t *hi, uint32_t *lo);
    void (*pack_v)(size_t nk, size_t dv, const void *v, int src, ptrdiff_t rs, ptrdiff_t cs, uint32_t *hi,
                   uint32_t *lo);
    void (*forward)(fmha_matrix_fwd_args *a);
    /* The backward (optional: NULL, the tiled backward serves): X^T
     * blocks of rows [0, nq) of X (as pack_q, never negated; xt_lo, when
     * not NULL, of the residuals); one key block's products; 1 when rows
     * [0, n) of d elements (as pack_k reads them) hold a NaN or an
     * infinity, else 0. */
    void (*pack_t)(size_t nq, size_t d, const void *x, int src, ptrdiff_t rs, ptrdiff_t cs, uint32_t *xt,
                   uint32_t *xt_lo);
    void (*backward)(const fmha_matrix_bwd_args *a);
    int (*nonfinite)(size_t n, size_t d, const void *x, int src, ptrdiff_t rs, ptrdiff_t cs);
    /* Decoding (optional: NULL, the decode driver serves): Q^T blocks of
     * rows[i] (element e at rows[i][e * cs]) in format src, each rounded to
     * the nearest bf16 (bf16 rows moved as they are), and nb blocks of rows
     * against a range of keys. */
    void (*pack_qt)(size_t nq, size_t d, const void *const *rows, int src, ptrdiff_t cs, int negate, uint32_t *qt);
    void (*decode)(fmha_matrix_dec_args *a);
} fmha_uk_matrix;

/* A GEMM microkernel's dispatch on its rows m = 6..1: CASE(M) is a case
 * label and the call of the tile of M rows (M a constant). */
#define FMHA_UK_SWITCH_ROWS_6(m, CASE)                                                                                 \
    switch (m) {                                                                                                       \
        CASE(6);                                                                                                       \
        CASE(5);                                                                                                       \
        CASE(4);                                                                                                       \
        CASE(3);                                                                                                       \
        CASE(2);                                                                                                       \
        CASE(1);                                                                                                       \
    default:                                                                                                           \
        break;                                                                                                         \
    }

/* An ISA's cache parts from an array of fmha_uk_cache [FMHA_FORMAT_COUNT]. */
#define FMHA_CACHE_PARTS(caches)                                                                                       \
    {                                                                                                                  \
        &(caches)[0], &(caches)[1], &(caches)[2], &(caches)[3], &(caches)[4], &(caches)[5], &(caches)[6], &(caches)[7] \
    }

/* An ISA as its parts. tile is required; NULL parts take the fallbacks. */
typedef struct fmha_isa_parts {
    const char *isa;                      /* its name in the registry, e.g. "avx2" */
    const fmha_uk_tile *tile;
    const fmha_uk_bf16 *bf16;
    const fmha_uk_rows *rows;
    const fmha_uk_decode *decode;
    const fmha_uk_cache *cache[FMHA_FORMAT_COUNT];
    const fmha_uk_thread *thread;
    const fmha_uk_matrix *matrix; /* NULL: no matrix engine (the matrix driver does not serve) */
} fmha_isa_parts;

struct fmha_tuning;

/* A composed table: every part by value, fallbacks applied, and the
 * tuning it runs with on this CPU (tuning.h; tile.block_kv is the tuning's
 * when it sets one). */
typedef struct fmha_ukernels {
    const char *isa;
    const struct fmha_tuning *tuning;
    fmha_uk_tile tile;
    fmha_uk_bf16 bf16;     /* bf16.gemm NULL: no bf16 pair kernels */
    fmha_uk_rows rows;     /* complete */
    fmha_uk_decode decode; /* decode.softmax NULL: no decode kernels */
    fmha_uk_cache cache[FMHA_FORMAT_COUNT]; /* load complete */
    fmha_uk_thread thread;
    fmha_uk_matrix matrix; /* matrix.forward NULL: none */
} fmha_ukernels;

/* Composes parts into a complete table (src/uk/compose.c). */
void fmha_ukernels_compose(const fmha_isa_parts *parts, fmha_ukernels *out);

/* The parts of each ISA the build has (src/uk/<isa>/table.c); an ISA is
 * only usable if the CPU supports it (the registry, src/cpu.h). */
extern const fmha_isa_parts fmha_isa_scalar;     /* any CPU: src/uk/scalar */
extern const fmha_isa_parts fmha_isa_avx2;       /* AVX2 + FMA: src/uk/avx2 */
extern const fmha_isa_parts fmha_isa_avx2vnni;   /* avx2's parts, integer scores (AVX-VNNI): src/uk/avx2vnni */
extern const fmha_isa_parts fmha_isa_avx512;     /* AVX-512 F/BW/VL/DQ: src/uk/avx512 */
extern const fmha_isa_parts fmha_isa_avx512vnni; /* avx512's parts, integer scores (AVX512-VNNI): src/uk/avx512vnni */
extern const fmha_isa_parts fmha_isa_avx512bf16; /* avx512's parts + a bf16 part: src/uk/avx512bf16 */
extern const fmha_isa_parts fmha_isa_amx;        /* avx512bf16's parts, the pair GEMM on AMX tiles: src/uk/amx */
extern const fmha_isa_parts fmha_isa_amx_emu;    /* amx's kernels on the software tile unit, test builds only: src/uk/amx_emu */
extern const fmha_isa_parts fmha_isa_neon;       /* aarch64 Advanced SIMD: src/uk/neon */
extern const fmha_isa_parts fmha_isa_neondot;    /* neon's parts, integer scores on SDOT: src/uk/neondot */
extern const fmha_isa_parts fmha_isa_neonbf16;   /* neon's parts + a BF16 part (BFMMLA, BFCVTN): src/uk/neonbf16 */
extern const fmha_isa_parts fmha_isa_sve;        /* SVE float32 tiles (NR from the vector length) + neon's rest: src/uk/sve */

#endif /* FMHA_UKERNEL_H */
