/* avx512/f32_tall.c: the AVX-512 float32 tile kernels on 32 lanes (2 zmm),
 * for tiles taller than 6 x 64: 12 x 32 (24 accumulators, 2 B rows) and
 * 14 x 32 (28 accumulators). Per FMA they read half the bytes of B that
 * 6 x 64 reads (128 bytes per 24 or 28 FMAs against 256 per 24), and their
 * query block of 32 keeps a block's Q^T, scores and O^T in a third of the
 * L1 that 64 lanes take; they broadcast twice as many A elements per FMA.
 * Which tile is fastest is a property of the core: the planner measures
 * them (design.md, "Tunings"). The softmax and the backward's lane-wise
 * kernels are the 64-lane ones' templates (softmax.h, tile.h) on 2 zmm.
 * Contracts in ../ukernel.h; the scalar kernels are the specification. */
#include "f32.h"

#include <immintrin.h>
#include <stddef.h>

#include "../ukernel.h"
#include "softmax.h"
#include "tile.h"

enum { TALL_VECS = FMHA_AVX512_TALL_NR / 16 };

/* C[m x 32] (op)= ab_scale * A[m x k] B[k x 32]; contract in ukernel.h. */
TILE_GEMM_FN(fmha_f32_gemm_ukernel_12x32__avx512, 12, TALL_VECS, 0)
TILE_GEMM_FN(fmha_f32_gemm_ukernel_14x32__avx512, 14, TALL_VECS, 0)

void fmha_f32_softmax_ukernel_32__avx512(size_t rows, float *s, size_t lds, float *m, float *l, float *alpha) {
    softmax_tile(TALL_VECS, rows, s, lds, m, l, alpha, 0, s, NULL, NULL);
}

void fmha_f32_softmax_lowp_ukernel_32__avx512(size_t rows, float *s, size_t lds, float *m, float *l,
                                              float *alpha) {
    softmax_tile(TALL_VECS, rows, s, lds, m, l, alpha, 1, s, NULL, NULL);
}

void fmha_f32_exp_sub_ukernel_32__avx512(size_t rows, float *s, size_t lds, const float *sub) {
    exp_sub_tile(TALL_VECS, rows, s, lds, sub, 0);
}

void fmha_f32_exp_sub_lowp_ukernel_32__avx512(size_t rows, float *s, size_t lds, const float *sub) {
    exp_sub_tile(TALL_VECS, rows, s, lds, sub, 1);
}

void fmha_f32_ds_ukernel_32__avx512(size_t rows, const float *p, float *dp, size_t lds, const float *dsum) {
    ds_tile(TALL_VECS, rows, p, dp, lds, dsum);
}

