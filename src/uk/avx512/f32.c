/* avx512/f32.c: the AVX-512 float32 microkernels (NR = 64 lanes = 4 zmm).
 * A 6x64 GEMM tile keeps 24 accumulators and 4 B rows in zmm registers and
 * broadcasts one element of A per row and k-step (the tile templates of
 * tile.h, which the tall tiles of f32_tall.c share); the online softmax and the
 * backward's exp(s - lse) run a vectorised exp (Cody-Waite reduction,
 * degree-6 polynomial, vscalefps); dS = P (dP - Dsum) is plain lane-wise.
 * Contract in ../ukernel.h; the scalar kernels are the specification. */
#include "f32.h"

#include <immintrin.h>
#include <stddef.h>

#include "../ukernel.h"
#include "decode.h"
#include "exp.h"
#include "softmax.h"
#include "tile.h"
#include "transpose.h"

/* MR = 6: 24 accumulators + 4 B rows of the 32 zmm. Measured on Zen 5 at
 * k = 64: 6x64 runs at 94-98% of the FMA peak, 4x64 at 83-97%. */
enum { AVX512_MR = FMHA_AVX512_MR, AVX512_NR = FMHA_AVX512_NR, AVX512_VECS = AVX512_NR / 16 };

#define FMHA_INLINE static inline __attribute__((always_inline))

/* C[m x 64] (op)= ab_scale * A[m x k] B[k x 64], 1 <= m <= MR; contract in
 * ukernel.h (the template: tile.h). */
TILE_GEMM_FN(fmha_f32_gemm_ukernel_6x64__avx512, 6, AVX512_VECS, 0)

/* y[i] = exp(x[i]) over any n; exp(+inf) = +inf, exp(NaN) = NaN. The test
 * checks the exp of this file through it. */
void fmha_f32_exp__avx512(size_t n, const float *x, float *y) {
    const __m512 hi = _mm512_set1_ps(89.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, exp_f32(_mm512_min_ps(hi, _mm512_loadu_ps(x + i))));
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(tail, x + i);
        _mm512_mask_storeu_ps(y + i, tail, exp_f32(_mm512_min_ps(hi, xv)));
    }
}

void fmha_f32_softmax_ukernel_64__avx512(size_t rows, float *s, size_t lds, float *m, float *l,
                                         float *alpha) {
    softmax_64(rows, s, lds, m, l, alpha, 0, s, NULL, NULL);
}

/* The same step with P by exp_f32_lowp (alpha stays exact): for P rounded
 * to bf16 next (fmha_f32_softmax_ukernel_fn, softmax_lowp_f32). */
void fmha_f32_softmax_lowp_ukernel_64__avx512(size_t rows, float *s, size_t lds, float *m, float *l,
                                              float *alpha) {
    softmax_64(rows, s, lds, m, l, alpha, 1, s, NULL, NULL);
}

/* Backward: s = exp(s - sub) lane-wise, in place (tile.h); contract in
 * ukernel.h. */
void fmha_f32_exp_sub_ukernel_64__avx512(size_t rows, float *s, size_t lds, const float *sub) {
    exp_sub_tile(AVX512_VECS, rows, s, lds, sub, 0);
}

/* The same with exp_f32_lowp, for P rounded to bf16 next (exp_sub_lowp_f32). */
void fmha_f32_exp_sub_lowp_ukernel_64__avx512(size_t rows, float *s, size_t lds, const float *sub) {
    exp_sub_tile(AVX512_VECS, rows, s, lds, sub, 1);
}

/* Backward: dp = p * (dp - dsum) lane-wise, in place (tile.h); contract in
 * ukernel.h. */
void fmha_f32_ds_ukernel_64__avx512(size_t rows, const float *p, float *dp, size_t lds,
                                    const float *dsum) {
    ds_tile(AVX512_VECS, rows, p, dp, lds, dsum);
}

/* x[l] = the lanes of m of row l of src (rows ld apart) for l < n, zero
 * for l >= n: a 16 x 16 block ready for fmha_avx512_transpose16. */
FMHA_INLINE void load_block_16(const float *src, ptrdiff_t ld, size_t n, __mmask16 m, __m512 x[16]) {
    for (size_t l = 0; l < 16; l++) x[l] = l < n ? _mm512_maskz_loadu_ps(m, src + (ptrdiff_t)l * ld) : _mm512_setzero_ps();
}

/* st[r][i] += src[i * q_stride + r]; contract in ukernel.h. 16 x 16 blocks:
 * 16 query rows loaded (keys past nk masked, queries past nq zero),
 * transposed, added to 16 score rows. */
void fmha_f32_add_transposed_ukernel__avx512(size_t nk, size_t nq, const float *src,
                                            ptrdiff_t q_stride, float *st, size_t lds) {
    for (size_t i0 = 0; i0 < nq; i0 += 16) {
        size_t rows = nq - i0 < 16 ? nq - i0 : 16;
        for (size_t r0 = 0; r0 < nk; r0 += 16) {
            size_t keys = nk - r0 < 16 ? nk - r0 : 16;
            const __mmask16 kmask = (__mmask16)((1u << keys) - 1u);
            __m512 x[16];
            load_block_16(src + (ptrdiff_t)i0 * q_stride + (ptrdiff_t)r0, q_stride, rows, kmask, x);
            fmha_avx512_transpose16(x);
            for (size_t c = 0; c < keys; c++) {
                float *row = st + (r0 + c) * lds + i0;
                _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), x[c]));
            }
        }
    }
}

/* x[r][j] *= sc[j]: 16 columns a step, the tail masked. */
void fmha_f32_scale_columns_ukernel__avx512(size_t rows, size_t n, const float *sc, float *x, size_t ldx) {
    for (size_t j = 0; j < n; j += 16) {
        const __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        const __m512 s = _mm512_maskz_loadu_ps(m, sc + j);
        for (size_t r = 0; r < rows; r++) {
            float *at = x + r * ldx + j;
            _mm512_mask_storeu_ps(at, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, at), s));
        }
    }
}

/* Any exponent of all ones: 16 columns a step, the tail masked. */
int fmha_f32_nonfinite_ukernel__avx512(size_t rows, size_t n, const float *x, size_t ldx) {
    const __m512i e = _mm512_set1_epi32(0x7F800000);
    __mmask16 any = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < n; j += 16) {
            const __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
            const __m512i u = _mm512_maskz_loadu_epi32(m, x + r * ldx + j);
            any |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(u, e), e);
        }
    return any != 0;
}

/* y += a x: 16 lanes a step, the tail masked. */
void fmha_f32_axpy_ukernel__avx512(size_t n, float a, const float *x, float *y) {
    const __m512 av = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* A transposing copy, 16 x 16 blocks in registers. */
void fmha_f32_transpose_ukernel__avx512(size_t rows, size_t cols, const float *src, size_t lds, float *dst,
                                        size_t ldd) {
    for (size_t r0 = 0; r0 < rows; r0 += 16) {
        const size_t nr = rows - r0 < 16 ? rows - r0 : 16;
        const __mmask16 rmask = (__mmask16)((1u << nr) - 1u);
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 cmask = (__mmask16)((1u << nc) - 1u);
            __m512 x[16];
            if (nr == 16 && nc == 16) { /* a full block: unmasked, in registers */
#pragma GCC unroll 16
                for (int l = 0; l < 16; l++) x[l] = _mm512_loadu_ps(src + (r0 + (size_t)l) * lds + c0);
                fmha_avx512_transpose16(x);
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) _mm512_storeu_ps(dst + (c0 + (size_t)c) * ldd + r0, x[c]);
                continue;
            }
            load_block_16(src + r0 * lds + c0, (ptrdiff_t)lds, nr, cmask, x);
            fmha_avx512_transpose16(x);
            for (size_t c = 0; c < nc; c++) _mm512_mask_storeu_ps(dst + (c0 + c) * ldd + r0, rmask, x[c]);
        }
    }
}

/* float32 to bf16 in integer arithmetic, 16 at a time (the scalar
 * specification's steps; vcvtneps2bf16 would flush subnormals and is not
 * in AVX-512 F). */
void fmha_f32_to_bf16_ukernel__avx512(size_t n, const float *src, uint16_t *dst) {
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i half_ulp = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                  quiet = _mm512_set1_epi32(0x40);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i));
        const __m512i top = _mm512_srli_epi32(u, 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, magnitude), inf);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half_ulp, _mm512_and_si512(top, one)));
        r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_or_si512(top, quiet));
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, r);
    }
}

/* 16 pairs at a time: both rows widened to 32 bits (vpmovzxwd), the high
 * one shifted up; masked loads and stores for the tail. */
void fmha_u16_interleave_ukernel__avx512(size_t n, const uint16_t *lo, const uint16_t *hi, uint32_t *dst) {
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + i));
        if (hi) w = _mm512_or_si512(w, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + i)), 16));
        _mm512_mask_storeu_epi32(dst + i, m, w);
    }
}

/* The forward's epilogue: 16 rows x 16 columns at a time, scaled in the
 * lanes (rows), checked with vfpclassps, transposed and stored as rows. */
uint64_t fmha_f32_finish_ukernel__avx512(size_t rows, size_t cols, const float *ot, size_t ldt,
                                         const float *scale, float *o, size_t ldo) {
    uint64_t bad = 0;
    for (size_t i0 = 0; i0 < rows; i0 += 16) {
        const size_t nr = rows - i0 < 16 ? rows - i0 : 16;
        const __mmask16 rmask = (__mmask16)((1u << nr) - 1u);
        const __m512 sc = _mm512_maskz_loadu_ps(rmask, scale + i0);
        __mmask16 nonfinite = 0;
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 cmask = (__mmask16)((1u << nc) - 1u);
            __m512 x[16];
            if (nr == 16 && nc == 16) { /* a full block: unmasked, in registers */
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) {
                    x[c] = _mm512_mul_ps(_mm512_loadu_ps(ot + (c0 + (size_t)c) * ldt + i0), sc);
                    nonfinite |= _mm512_fpclass_ps_mask(x[c], 0x99); /* NaN, +inf, -inf */
                }
                fmha_avx512_transpose16(x);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) _mm512_storeu_ps(o + (i0 + (size_t)i) * ldo + c0, x[i]);
                continue;
            }
            load_block_16(ot + c0 * ldt + i0, (ptrdiff_t)ldt, nc, rmask, x);
            for (size_t c = 0; c < nc; c++) {
                x[c] = _mm512_mul_ps(x[c], sc);
                nonfinite |= _mm512_fpclass_ps_mask(x[c], 0x99); /* NaN, +inf, -inf */
            }
            fmha_avx512_transpose16(x);
            for (size_t i = 0; i < nr; i++) _mm512_mask_storeu_ps(o + (i0 + i) * ldo + c0, cmask, x[i]);
        }
        bad |= (uint64_t)(nonfinite & rmask) << i0;
    }
    return bad;
}
