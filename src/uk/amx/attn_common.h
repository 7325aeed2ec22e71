/* amx/attn_common.h: what the forward (attn.c) and the backward
 * (attn_bwd.c) of the matrix part share: register transposes, the loading
 * of a row chunk in any source format (split into bf16 hi + lo), the exp,
 * lane masks, and the four-product k-step with its loads placed for the
 * tile unit (tiles are not renamed). Static inline, compiled into each. */
#ifndef FMHA_UK_AMX_ATTN_COMMON_H
#define FMHA_UK_AMX_ATTN_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../ukernel.h"
#include "tile.h"

/* Rows of a query block: two A tiles. */
enum { ATTN_BQ = 32 };

/* The 32-bit words of a 16 x 16 block transposed in place: word c of
 * m[r] becomes word r of m[c]. */
static inline void transpose_16x16(__m512i m[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(m[i], m[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(m[i], m[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        m[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        m[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        m[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        m[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(m[i + j], m[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(m[i + j], m[i + j + 4], 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        m[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        m[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xDD);
    }
}

/* Lanes [0, n) of 16 and of 32. */
static inline __mmask16 lanes16(size_t n) { return n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1u); }
static inline __mmask32 lanes32(size_t n) { return n >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << n) - 1u); }

/* Element e of a row as float32 (a strided row of any source format). */
static inline float element_at(const void *row, int src, ptrdiff_t at) {
    if (src == FMHA_MATRIX_SRC_F32) return ((const float *)row)[at];
    const uint16_t h = ((const uint16_t *)row)[at];
    if (src == FMHA_MATRIX_SRC_F16) return _cvtsh_ss(h);
    const uint32_t w = (uint32_t)h << 16;
    float x;
    memcpy(&x, &w, 4);
    return x;
}

/* The rounding residual of 32 floats x0 (words 0-15), x1 (16-31) whose
 * nearest bf16 are hi: bf16(x - hi), x - hi exact in float32, so hi + lo
 * is within 2^-16 of x; lanes outside keep0 / keep1 get 0 (all kept: an
 * infinity's residual is NaN). */
static inline __attribute__((always_inline)) __m512i bf16_residual(__m512i hi, __m512 x0, __m512 x1, __mmask16 keep0,
                                                                   __mmask16 keep1) {
    const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
    const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_sub_ps(keep1, x1, h1), _mm512_maskz_sub_ps(keep0, x0, h0));
}

/* The 32 elements [32 c, 32 c + 32) of a row, element e at row[e * cs]
 * (zeros past d), as bf16: *hi each rounded to nearest even and, when lo
 * is not NULL, *lo the residual x - hi rounded likewise (hi + lo holds a
 * float16 exactly and a float32 to 16 bits). bf16 rows are moved, not
 * rounded (their residual is 0). */
static inline __attribute__((always_inline)) void row_chunk(const void *row, int src, ptrdiff_t cs, size_t d, size_t c,
                                                            __m512i *hi, __m512i *lo) {
    const size_t e0 = 32 * c, n = e0 >= d ? 0 : d - e0 < 32 ? d - e0 : 32;
    if (src == FMHA_MATRIX_SRC_BF16 && cs == 1) {
        *hi = n ? _mm512_maskz_loadu_epi16(lanes32(n), (const uint16_t *)row + e0) : _mm512_setzero_si512();
        if (lo) *lo = _mm512_setzero_si512();
        return;
    }
    __m512 x0, x1; /* elements 0-15 and 16-31 */
    if (src == FMHA_MATRIX_SRC_F32 && cs == 1) {
        x0 = _mm512_maskz_loadu_ps(lanes16(n), (const float *)row + e0);
        x1 = _mm512_maskz_loadu_ps(lanes16(n > 16 ? n - 16 : 0), (const float *)row + e0 + 16);
    } else if (src == FMHA_MATRIX_SRC_F16 && cs == 1) {
        const __m512i h = _mm512_maskz_loadu_epi16(lanes32(n), (const uint16_t *)row + e0);
        x0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        x1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    } else {
        float t[32] = {0};
        for (size_t e = 0; e < n; e++) t[e] = element_at(row, src, (ptrdiff_t)(e0 + e) * cs);
        x0 = _mm512_loadu_ps(t);
        x1 = _mm512_loadu_ps(t + 16);
    }
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    *hi = h;
    if (lo) *lo = bf16_residual(h, x0, x1, 0xFFFF, 0xFFFF);
}

/* Bytes of one element of a source format. */
static inline size_t src_bytes(int src) { return src == FMHA_MATRIX_SRC_F32 ? 4 : 2; }

/* Asks for a row's d elements (unit stride) ahead of their use: rows a
 * head's stride apart (often a KiB or more) came in one cache miss at a
 * time, and reading Q, K and V took 12% of a causal bf16 forward. Always
 * inlined: GCC 12 finds a function of prefetches alone free of effects
 * and deletes its calls. */
static inline __attribute__((always_inline)) void prefetch_row(const void *row, ptrdiff_t cs, size_t bytes) {
    if (cs != 1) return;
    for (size_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

/* 2^t (t <= 2^7), lanes outside keep 0: f = t - floor(t) in [0, 1) by
 * vreduceps, 2^f by a polynomial with constant term 1, then times
 * 2^floor(t) by vscalefps, which takes the floor itself, underflows to 0
 * and gives 0 for t = -inf (f is 0 there) and NaN for NaN. The polynomial:
 * degree 4 (3.0e-6 relative) with `fine` (the forward: l sums P, and lse
 * keeps 1e-5), else degree 3 (8.6e-5: the backward's P and dS, rounded to
 * bf16, 2e-3, next). vrndscaleps, the usual way to n, issues on port 0 only, which
 * a tile product holds for its whole 16 cycles; these issue on port 5
 * too, so the softmax keeps running beside the tiles. */
static inline __attribute__((always_inline)) __m512 exp2_keep(__mmask16 keep, __m512 t, int fine) {
    const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p;
    if (fine) {
        p = _mm512_set1_ps(0x1.b7f732p-7f);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.abf868p-5f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.ee2450p-3f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.62d6c6p-1f));
    } else {
        p = _mm512_set1_ps(0x1.3baaa6p-4f);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.d2378ap-3f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.63e658p-1f));
    }
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, t);
}

/* Lanes of keys [base, base + 16) inside [lo, hi). */
static inline __mmask16 lanes_in(int64_t base, int64_t lo, int64_t hi) {
    int64_t a = lo - base, b = hi - base;
    if (a < 0) a = 0;
    if (b > 16) b = 16;
    if (b <= a) return 0;
    return (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
}

/* The A and B tiles of one k-step: A rows 0-15 at a, 16-31 at a + a_half,
 * a_ld bytes apart; B at b and b + b_half, b_ld bytes apart. */
typedef struct step_tiles {
    const char *a, *b;
    size_t a_half, a_ld, b_half, b_ld;
} step_tiles;

/* Four products with the next step's loads (when `more`) placed behind the
 * last reader of each tile. */
static inline __attribute__((always_inline)) void tile_products(int more, step_tiles next) {
    TILE_DPBF16PS(0, 4, 6);
    TILE_DPBF16PS(1, 4, 7);
    if (more) TILE_LOAD(4, next.a, next.a_ld);
    TILE_DPBF16PS(2, 5, 6);
    if (more) TILE_LOAD(6, next.b, next.b_ld);
    TILE_DPBF16PS(3, 5, 7);
    if (more) {
        TILE_LOAD(5, next.a + next.a_half, next.a_ld);
        TILE_LOAD(7, next.b + next.b_half, next.b_ld);
    }
}

static inline __attribute__((always_inline)) void tile_loads(step_tiles st) {
    TILE_LOAD(4, st.a, st.a_ld);
    TILE_LOAD(6, st.b, st.b_ld);
    TILE_LOAD(5, st.a + st.a_half, st.a_ld);
    TILE_LOAD(7, st.b + st.b_half, st.b_ld);
}

#endif /* FMHA_UK_AMX_ATTN_COMMON_H */
