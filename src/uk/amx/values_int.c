/* amx/values_int.c: P V in integers for int8, q8_0 and q4_0 values
 * (fmha_cache_values_int_ukernel_fn; contract and specification in
 * ../ukernel.h and ../scalar/decode.c) on AMX-INT8 tiles, for steps of 16
 * rows or more; the rows past the last group of 16 (and steps of fewer)
 * take avx512vnni's kernel. Both take each row's P' and V's scales from
 * ../avx512vnni/values_int.h, and both sums are exact, so the bits are
 * the same. Built twice: for the tiles and, as amx_emu, for the software
 * tile unit.
 *
 * A tile product multiplies bytes; P' has 16 bits. Split P' = 256 h + l
 * (h = P' >> 8 signed, l = P' & 255 unsigned): isum = 256 (h V) + (l V),
 * tdpbssd for h V and tdpbusd for l V, each exact in int32 (|h V| <= 2^20
 * over 64 keys, times 256 below 2^29). Per call:
 *   B  V in VNNI order, once: per block of 32 columns two tiles [16 key
 *      quads][16 columns][4 keys] (q4_0: nibbles less 8), keys past nk 0;
 *      byte and word unpacks of four keys' rows leave the columns 0-3,
 *      16-19, 4-7, 20-23 in the first tile and 8-11, 24-27, 12-15, 28-31 in
 *      the second, put back in order on the sums
 *   A  per group of 16 rows and P' block: h and l [16 rows][64 keys]
 *   C  h B0, h B1, l B0, l B1 (tmm0-3), stored; isum = 256 h.. + l..
 * Tiles: tmm0-3 C, tmm4 h, tmm5 l, tmm6 and tmm7 B. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../avx512vnni/decode.h"
#include "../avx512vnni/values_int.h"
#include "amx.h"
#include "tile.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* Rows a group of the tiles takes (fewer: avx512vnni's kernel). */
enum { GROUP_ROWS = 16 };

/* Columns [32 b, 32 b + 32) of row x as int8 (int8: the lanes of cm, the
 * others 0; q4_0: low nibbles for columns 0-15, high for 16-31, less 8). */
FMHA_INLINE __m256i block_values(const int kind, const uint8_t *x, size_t b, __mmask32 cm) {
    if (kind == V_INT8) return _mm256_maskz_loadu_epi8(cm, x + 32 * b);
    const uint8_t *at = x + b * fmha_int_block_bytes(kind) + fmha_int_block_values_at(kind);
    if (kind == V_Q8_0) return _mm256_loadu_si256((const __m256i *)at);
    const __m128i bytes = _mm_loadu_si128((const __m128i *)at), nib = _mm_set1_epi8(15);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(bytes, nib)),
                                                 _mm_and_si128(_mm_srli_epi16(bytes, 4), nib), 1);
    return _mm256_sub_epi8(both, _mm256_set1_epi8(8));
}

/* bt [cb][2][16][64]: the B tiles of every block of 32 columns (banner). */
FMHA_INLINE void pack_values(const int kind, size_t nk, size_t dv, const void *const *v_rows, size_t cb,
                             uint8_t *bt) {
    for (size_t b = 0; b < cb; b++) {
        const __mmask32 cm = dv - 32 * b >= 32 ? 0xffffffffu : (__mmask32)((1u << (dv - 32 * b)) - 1u);
        uint8_t *t0 = bt + b * 2048, *t1 = t0 + 1024;
        for (size_t g = 0; g < 16; g++) {
            __m256i x[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const size_t j = 4 * g + (size_t)i;
                x[i] = j < nk ? block_values(kind, v_rows[j], b, cm) : _mm256_setzero_si256();
            }
            const __m256i l01 = _mm256_unpacklo_epi8(x[0], x[1]), h01 = _mm256_unpackhi_epi8(x[0], x[1]);
            const __m256i l23 = _mm256_unpacklo_epi8(x[2], x[3]), h23 = _mm256_unpackhi_epi8(x[2], x[3]);
            _mm256_storeu_si256((__m256i *)(t0 + 64 * g), _mm256_unpacklo_epi16(l01, l23));
            _mm256_storeu_si256((__m256i *)(t0 + 64 * g + 32), _mm256_unpackhi_epi16(l01, l23));
            _mm256_storeu_si256((__m256i *)(t1 + 64 * g), _mm256_unpacklo_epi16(h01, h23));
            _mm256_storeu_si256((__m256i *)(t1 + 64 * g + 32), _mm256_unpackhi_epi16(h01, h23));
        }
    }
}

/* a [2][16][64]: the high bytes (signed) and the low bytes (unsigned) of
 * 16 rows of P' (pw: 64 int16 a row, keys past nk 0), keys in order. */
FMHA_INLINE void pack_weights(const int16_t pw[GROUP_ROWS][MAX_KEYS], uint8_t *a) {
    /* packs interleave the 128-bit lanes of its two sources: qwords back in key order */
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), low = _mm512_set1_epi16(0xff);
    for (int r = 0; r < GROUP_ROWS; r++) {
        const __m512i x0 = _mm512_loadu_si512(pw[r]), x1 = _mm512_loadu_si512(pw[r] + 32);
        const __m512i h = _mm512_packs_epi16(_mm512_srai_epi16(x0, 8), _mm512_srai_epi16(x1, 8));
        const __m512i l = _mm512_packus_epi16(_mm512_and_si512(x0, low), _mm512_and_si512(x1, low));
        _mm512_storeu_si512(a + 64 * r, _mm512_permutexvar_epi64(order, h));
        _mm512_storeu_si512(a + 1024 + 64 * r, _mm512_permutexvar_epi64(order, l));
    }
}

/* Rows [r0, r0 + 16) of o: per block of 32 columns, the four products,
 * then o = fmaf(o, alpha, (float)isum * s) as the specification. */
FMHA_INLINE void group_values(const int kind, size_t nk, size_t dv, const float *p, size_t ldp, const uint8_t *bt,
                              const __m512 vd[MAX_BLOCKS][MAX_KEYS / 16], const float dm[MAX_BLOCKS], float *o,
                              size_t ldo, const float *alpha) {
    const size_t nb = value_p_blocks(kind, dv), cb = (dv + 31) / 32;
    _Alignas(64) int16_t pw[MAX_BLOCKS][GROUP_ROWS][MAX_KEYS];
    _Alignas(64) uint8_t a[2 * 1024];
    _Alignas(64) int32_t cs[4][16 * 16];
    float s[GROUP_ROWS][MAX_BLOCKS];
    memset(pw, 0, nb * sizeof pw[0]);
    for (int r = 0; r < GROUP_ROWS; r++) {
        const float pm = abs_max(nk, p + (size_t)r * ldp);
        for (size_t b = 0; b < nb; b++) /* the tiles take q4_0's offset in the values: no sum */
            quantize_row(nk, p + (size_t)r * ldp, vd[b], pm, dm[b], (int32_t *)pw[b][r], &s[r][b], NULL);
    }
    const __m512i lo_cols = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i hi_cols = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (size_t b = 0; b < cb; b++) {
        const size_t pb = kind == V_INT8 ? 0 : b; /* the columns' P' */
        if (b == 0 || pb != 0) {
            pack_weights(pw[pb], a);
            TILE_LOAD(4, a, 64);
            TILE_LOAD(5, a + 1024, 64);
        }
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
        TILE_LOAD(6, bt + b * 2048, 64);
        TILE_LOAD(7, bt + b * 2048 + 1024, 64);
        TILE_DPBSSD(0, 4, 6);
        TILE_DPBSSD(1, 4, 7);
        TILE_DPBUSD(2, 5, 6);
        TILE_DPBUSD(3, 5, 7);
        TILE_STORE(0, cs[0], 64);
        TILE_STORE(1, cs[1], 64);
        TILE_STORE(2, cs[2], 64);
        TILE_STORE(3, cs[3], 64);
        for (int r = 0; r < GROUP_ROWS; r++) {
            const __m512i t0 = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cs[0] + 16 * r), 8),
                                                _mm512_load_si512(cs[2] + 16 * r));
            const __m512i t1 = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cs[1] + 16 * r), 8),
                                                _mm512_load_si512(cs[3] + 16 * r));
            const __m512 sv = _mm512_set1_ps(s[r][pb]), al = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) { /* columns 16 h.. of the block, in order */
                const size_t c = 32 * b + 16 * (size_t)h;
                if (c >= dv) break;
                const __m512i isum = _mm512_permutex2var_epi32(t0, h ? hi_cols : lo_cols, t1);
                const __mmask16 cm = dv - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dv - c)) - 1u);
                float *orow = o + (size_t)r * ldo + c;
                const __m512 old = _mm512_maskz_loadu_ps(cm, orow);
                _mm512_mask_storeu_ps(orow, cm, _mm512_fmadd_ps(old, al, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), sv)));
            }
        }
    }
}

FMHA_INLINE void values_tiles(const int kind, size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                              const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    FMHA_AMX_FN(fmha_amx_ready)(); /* configures on a call outside a job (tests) */
    const size_t cb = (dv + 31) / 32;
    __m512 vd[MAX_BLOCKS][MAX_KEYS / 16];
    float dm[MAX_BLOCKS];
    value_block_scales(kind, nk, dv, v_rows, vd, dm);
    _Alignas(64) uint8_t bt[MAX_BLOCKS * 2048];
    pack_values(kind, nk, dv, v_rows, cb, bt);
    for (size_t r0 = 0; r0 + GROUP_ROWS <= rows; r0 += GROUP_ROWS)
        group_values(kind, nk, dv, p + r0 * ldp, ldp, bt, (const __m512(*)[MAX_KEYS / 16])vd, dm, o + r0 * ldo, ldo,
                     alpha + r0);
}

#define AMX_VALUES_INT(name, kind)                                                                                     \
    void FMHA_AMX_FN(fmha_##name##kv_values_int)(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,       \
                                                  const void *const *v_rows, float *o, size_t ldo,                      \
                                                  const float *alpha) {                                                 \
        const size_t tiled = rows / GROUP_ROWS * GROUP_ROWS; /* the rest: avx512vnni's kernel, the same bits */        \
        if (tiled) values_tiles(kind, tiled, nk, dv, p, ldp, v_rows, o, ldo, alpha);                                  \
        if (rows > tiled)                                                                                              \
            fmha_##name##kv_values_int__avx512vnni(rows - tiled, nk, dv, p + tiled * ldp, ldp, v_rows,                 \
                                                   o + tiled * ldo, ldo, alpha + tiled);                               \
    }
AMX_VALUES_INT(int8, V_INT8)
AMX_VALUES_INT(q8_0, V_Q8_0)
AMX_VALUES_INT(q4_0, V_Q4_0)
