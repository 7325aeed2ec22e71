/* avx512/exp.h: the vectorised float32 exp shared by the AVX-512
 * kernels (f32.c, decode.c), inlined where it is used. */
#ifndef FMHA_UK_AVX512_EXP_H
#define FMHA_UK_AVX512_EXP_H

#include <immintrin.h>

/* The lanes of x that are not -inf. A masked score (-inf) gives exp 0
 * through the zero-masking instead of vscalefps: scaling by 2^-150 is a
 * result that underflows, which without FTZ (the library leaves MXCSR as
 * the caller set it) costs a microcode assist a lane on Intel cores; the
 * diagonal tiles of a causal mask are full of such lanes (float32 causal
 * forward at S 128 took 1.6x plain's time, 1.8x faster with FTZ set). The
 * bits are the same: the clamped path also gives +0. */
static inline __attribute__((always_inline)) __mmask16 exp_finite_or_nan(__m512 x) {
    return _mm512_cmp_ps_mask(x, _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_UQ);
}

/* exp(x) for x <= 89: n = round(x log2 e) (an fma against 1.5 * 2^23 rounds
 * to integer), r = x - n ln2 (two-part ln2), exp(r) by a degree-6 polynomial
 * (Chebyshev fit on [-ln2/2, ln2/2], max relative error 0.2 ulp before
 * rounding), then p 2^n with vscalefps, which rounds gracefully through
 * subnormals to 0. x is clamped below at -104 (exp(-104) < 2^-150), so -inf
 * gives 0 and never NaN; the clamp passes NaN through (vmaxps returns its
 * second operand when either is NaN), so NaN gives NaN. Lanes outside
 * `keep` give 0 (the zero-masking of vscalefps). Max error measured:
 * 1.05 ulp. */
static inline __attribute__((always_inline)) __m512 exp_f32_keep(__mmask16 keep, __m512 x) {
    keep &= exp_finite_or_nan(x);
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const __m512 round_bias = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), round_bias), round_bias);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e430p-1f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-0x1.05c610p-29f), r);
    __m512 p = _mm512_set1_ps(0x1.6d7532p-10f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.126fa6p-7f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.5554acp-5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.555404p-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

static inline __attribute__((always_inline)) __m512 exp_f32(__m512 x) { return exp_f32_keep((__mmask16)0xFFFF, x); }

/* exp(x) to 3e-6 relative, for P that is rounded to bf16 next (half a bf16
 * ulp is 2e-3): as exp_f32 with ln2 in one part and a degree-4 polynomial
 * (relative minimax on [-ln2/2, ln2/2] with the constant term 1, so
 * exp(0) = 1 exactly; 2.9e-6 evaluated in float32); 10 vector operations
 * against 13. Same clamp, so -inf gives 0 and NaN gives NaN; lanes outside
 * `keep` give 0. */
static inline __attribute__((always_inline)) __m512 exp_f32_lowp_keep(__mmask16 keep, __m512 x) {
    keep &= exp_finite_or_nan(x);
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const __m512 round_bias = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), round_bias), round_bias);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e430p-1f), x);
    __m512 p = _mm512_set1_ps(0x1.5414e0p-5f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.57ceb8p-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.0003f4p-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.fffba8p-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

static inline __attribute__((always_inline)) __m512 exp_f32_lowp(__m512 x) {
    return exp_f32_lowp_keep((__mmask16)0xFFFF, x);
}

#endif /* FMHA_UK_AVX512_EXP_H */
