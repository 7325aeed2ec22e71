/* neonbf16/cvt.c: float32 to bf16 on BFCVTN/BFCVTN2 (4 + 4 floats into one
 * register of 8 bf16, round to nearest even under the default FPCR):
 *   pair rows      two rows of 16 lanes interleaved by ST2 into pair words
 *   split          pair rows plus the pairs of the rounding residuals
 *   pack rows      rows converted in place order (adjacent elements pair)
 *   softmax pairs  the neon softmax step (neon/softmax.h) with P rounded
 *                  into pair-rows on registers, two rows at a time
 *   to_bf16        any length, fmha_f32_to_bf16's bits
 * BFCVTN honours FPCR (rounding mode, FZ, DN). Under FZ a subnormal becomes
 * a zero of its sign, which the pair kernels' contract allows and to_bf16's
 * does not: to_bf16 reads FPCR once per call and runs the neon integer
 * kernel unless it is the default. The pair kernels assume the rounding
 * mode and NaN handling every float kernel of the library assumes (round
 * to nearest, DN clear). Contracts in ../ukernel.h. */
#include <arm_neon.h>
#include <string.h>

#include "../neon/neon.h"
#include "../neon/softmax.h"
#include "neonbf16.h"

enum { NR = FMHA_NEONBF16_NR };

#define FMHA_INLINE static inline __attribute__((always_inline))

/* bf16 of 8 floats (lo: the first 4) as 16-bit words. */
FMHA_INLINE uint16x8_t bf16x8(float32x4_t lo, float32x4_t hi) {
    return vreinterpretq_u16_bf16(vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(lo), hi));
}

/* dst[i] = (bf16(lo[i]), bf16(hi[i])) for 16 lanes in registers; ST2
 * interleaves the halves, which on a little-endian CPU is each pair's
 * word. hi NULL: zero halves, made as integers. */
FMHA_INLINE void store_pairs(const float32x4_t lo[4], const float32x4_t *hi, uint32_t *dst) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        uint16x8x2_t w;
        w.val[0] = bf16x8(lo[2 * h], lo[2 * h + 1]);
        w.val[1] = hi ? bf16x8(hi[2 * h], hi[2 * h + 1]) : vdupq_n_u16(0);
        vst2q_u16((uint16_t *)(dst + 8 * h), w);
    }
}

FMHA_INLINE void load16(const float *x, float32x4_t v[4]) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) v[i] = vld1q_f32(x + 4 * i);
}

/* dst[i] = (bf16(lo[i]), bf16(hi[i])); contract in ukernel.h. */
void fmha_bf16_pair_rows_ukernel_16__neonbf16(const float *lo, const float *hi, uint32_t *dst) {
    float32x4_t l[4], h[4];
    load16(lo, l);
    if (hi) load16(hi, h);
    store_pairs(l, hi ? h : NULL, dst);
}

/* The residual x - bf16(x) of 8 floats, bf16(x) widened from its bits. */
FMHA_INLINE void residual8(const float32x4_t x[2], uint16x8_t rounded, float32x4_t out[2]) {
    out[0] = vsubq_f32(x[0], vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(rounded), 16)));
    out[1] = vsubq_f32(x[1], vreinterpretq_f32_u32(vshll_high_n_u16(rounded, 16)));
}

/* hi: pairs of bf16(a), bf16(b); lo: pairs of bf16(a - bf16(a)),
 * bf16(b - bf16(b)), b NULL reading as zeros; contract in ukernel.h. */
void fmha_bf16_pair_rows_split_ukernel_16__neonbf16(const float *a, const float *b, uint32_t *hi, uint32_t *lo) {
    float32x4_t av[4], bv[4];
    load16(a, av);
    if (b) load16(b, bv);
    else
        for (int i = 0; i < 4; i++) bv[i] = vdupq_n_f32(0.0f);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        uint16x8x2_t w, r;
        float32x4_t ra[2], rb[2];
        w.val[0] = bf16x8(av[2 * h], av[2 * h + 1]);
        w.val[1] = bf16x8(bv[2 * h], bv[2 * h + 1]);
        vst2q_u16((uint16_t *)(hi + 8 * h), w);
        residual8(av + 2 * h, w.val[0], ra);
        residual8(bv + 2 * h, w.val[1], rb);
        r.val[0] = bf16x8(ra[0], ra[1]);
        r.val[1] = bf16x8(rb[0], rb[1]);
        vst2q_u16((uint16_t *)(lo + 8 * h), r);
    }
}

/* n floats to bf16 in order, 8 at a time; the last n % 8 through a
 * zero-padded copy, so nothing past src[n - 1] is read or dst[n - 1]
 * written. */
static void convert_row(size_t n, const float *src, uint16_t *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) vst1q_u16(dst + i, bf16x8(vld1q_f32(src + i), vld1q_f32(src + i + 4)));
    if (i < n) {
        float t[8] = {0};
        uint16_t h[8];
        memcpy(t, src + i, (n - i) * sizeof *t);
        vst1q_u16(h, bf16x8(vld1q_f32(t), vld1q_f32(t + 4)));
        memcpy(dst + i, h, (n - i) * sizeof *h);
    }
}

/* dst[r][p] = (bf16(src[r][2p]), bf16(src[r][2p + 1])): a row converted in
 * order already is its pairs; an odd n's last high half is 0. Contract in
 * ukernel.h. */
void fmha_bf16_pack_rows_ukernel__neonbf16(size_t rows, size_t n, const float *src, size_t lds, uint32_t *dst,
                                           size_t ldd) {
    for (size_t r = 0; r < rows; r++) {
        uint16_t *d = (uint16_t *)(dst + r * ldd);
        convert_row(n, src + r * lds, d);
        if (n % 2) d[n] = 0;
    }
}

/* The neon softmax step (fmha_f32_softmax_ukernel_16__neon's pieces, so
 * the same m, l, alpha and P) with rows 2p and 2p + 1 of P stored as
 * pair-row p; contract in ukernel.h. */
void fmha_bf16_softmax_pairs_ukernel_16__neonbf16(size_t rows, const float *s, size_t lds, float *m, float *l,
                                                  float *alpha, uint32_t *pairs) {
    float32x4_t mx[4], m_use[4], sum[4], p0[4], p1[4];
    neon_softmax_max(rows, s, lds, m, mx, m_use, sum);
    size_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        neon_softmax_row(s + r * lds, m_use, sum, p0);
        neon_softmax_row(s + (r + 1) * lds, m_use, sum, p1);
        store_pairs(p0, p1, pairs + r / 2 * NR);
    }
    if (r < rows) {
        neon_softmax_row(s + r * lds, m_use, sum, p0);
        store_pairs(p0, NULL, pairs + r / 2 * NR);
    }
    neon_softmax_update(m, l, alpha, mx, m_use, sum);
}

/* FPCR's bits that change what BFCVTN returns: FIZ (0), AH (1), NEP (2),
 * RMode (22-23), FZ (24), DN (25). */
static int fpcr_is_default(void) {
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return (fpcr & 0x03C00007u) == 0;
}

/* dst[i] = bf16(src[i]) by fmha_f32_to_bf16's rules (nearest even,
 * subnormals kept, a NaN quieted with its sign and top payload bits), which
 * BFCVTN meets under the default FPCR; contract in ukernel.h. */
void fmha_f32_to_bf16_ukernel__neonbf16(size_t n, const float *src, uint16_t *dst) {
    if (!fpcr_is_default()) {
        fmha_f32_to_bf16_ukernel__neon(n, src, dst);
        return;
    }
    convert_row(n, src, dst);
}
