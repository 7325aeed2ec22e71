/* neon/exp.h: the vectorised float32 exp shared by the NEON kernels
 * (f32.c, decode.c), inlined where it is used. */
#ifndef FMHA_UK_NEON_EXP_H
#define FMHA_UK_NEON_EXP_H

#include <arm_neon.h>

/* exp(x) over the whole float range: x clamped to [-104, 89] (exp(-104) is
 * below half the least subnormal, so -inf gives 0; FMAX and FMIN return NaN
 * when either operand is, so NaN gives NaN), n = round(x log2 e) (FRINTN),
 * r = x - n ln2 (two-part ln2), exp(r) by a degree-6 polynomial (Chebyshev
 * fit on [-ln2/2, ln2/2], 0.2 ulp before rounding), then 2^n applied as two
 * factors 2^(n/2) built in the exponent bits, so that n = 128 and the
 * subnormal results are exact to the final rounding. */
static inline __attribute__((always_inline)) float32x4_t neon_exp_f32(float32x4_t x) {
    x = vminq_f32(vdupq_n_f32(89.0f), vmaxq_f32(vdupq_n_f32(-104.0f), x));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(0x1.715476p+0f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0x1.62e430p-1f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-0x1.05c610p-29f));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(0x1.126fa6p-7f), vdupq_n_f32(0x1.6d7532p-10f), r);
    p = vfmaq_f32(vdupq_n_f32(0x1.5554acp-5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0x1.555404p-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t ni = vcvtq_s32_f32(n); /* NaN converts to 0: p carries the NaN */
    const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    const int32x4_t bias = vdupq_n_s32(127);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

#endif /* FMHA_UK_NEON_EXP_H */
