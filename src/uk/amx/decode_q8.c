/* amx/decode_q8.c: integer scores of int8, q8_0 and q4_0 keys on the
 * query quantized as q8_0 (fmha_cache_scores_q8_ukernel_fn; contract and
 * specification in ../ukernel.h and ../scalar/decode.c) on AMX-INT8
 * tiles, for steps of 16 rows or more (GQA groups x query positions);
 * fewer rows take avx512vnni's kernel (the same bits). With the data in
 * L1 (16 keys a call, D 128, fastest of 300 runs, ns a key, avx512vnni /
 * tiles): 16 rows int8 16.3 / 10.4, q8_0 16.9 / 15.2, q4_0 15.3 / 15.5;
 * 32 rows 31.9 / 19.8, 32.9 / 29.1, 29.6 / 30.0; 8 rows 8.6 / 10.7, 9.3 /
 * 15.6, 8.4 / 16.0. What the tiles save is the dot products; the
 * specification's float32 step a key and block (and q8_0's and q4_0's
 * scales a block) costs both kernels the same. Built twice: for
 * the tiles and, as amx_emu, for the software tile unit.
 *
 * Per 16 keys and chunk of 64 values (two blocks): A = the keys' values
 * (copied, 64 bytes a key: q4_0's nibbles unpacked as stored, value + 8),
 * B = the query's tiles, one a block (the driver's, fmha_q8_tiles_pack:
 * rows of the other block zero), so tdpbssd (tdpbusd for q4_0) leaves
 * each block's exact sums, C [16 keys][16 rows]. The specification's
 * float32 step then runs a key at a time, rows in the lanes (16
 * accumulators), and one 16 x 16 transpose gives s [rows][keys].
 * Tiles: tmm0, tmm1 C of the even and odd block, tmm2 A, tmm3 and tmm4 B. */
#include <immintrin.h>
#include <stdint.h>

#include "../avx512vnni/decode.h"
#include "../avx512vnni/rows_in_lanes.h"
#include "amx.h"
#include "tile.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

enum { Q8_INT8 = FMHA_FORMAT_INT8, Q8_Q8_0 = FMHA_FORMAT_Q8_0, Q8_Q4_0 = FMHA_FORMAT_Q4_0 };

/* Rows a step needs before the tiles pay (measured above; below:
 * avx512vnni's kernel). */
enum { TILE_MIN_ROWS = 16 };

/* 16 keys (kr; nj stored) x the 16-row group g of q (nr stored). */
FMHA_INLINE void tiles_block(const int kind, size_t nj, size_t nr, size_t d, const uint8_t *tiles,
                             const uint8_t *const kr[16], float *s, size_t lds, float scale) {
    const size_t chunks = (d + 63) / 64, nb = d / 32;
    const float *qd = (const float *)(tiles + chunks * 2048);
    const int32_t *qsum = (const int32_t *)(qd + nb * 16);
    _Alignas(64) uint8_t a[16 * 64];
    _Alignas(64) int32_t cs[2][16 * 16];
    _Alignas(64) float kd[16];
    __m512 acc[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    for (size_t c = 0; c < chunks; c++) {
        fmha_q8_keys_pack(kind, kr, c, nb, 0, a);
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_LOAD(2, a, 64);
        TILE_LOAD(3, tiles + c * 2048, 64);
        TILE_LOAD(4, tiles + c * 2048 + 1024, 64);
        if (kind == Q8_Q4_0) {
            TILE_DPBUSD(0, 2, 3);
            TILE_DPBUSD(1, 2, 4);
        } else {
            TILE_DPBSSD(0, 2, 3);
            TILE_DPBSSD(1, 2, 4);
        }
        TILE_STORE(0, cs[0], 64);
        TILE_STORE(1, cs[1], 64);
        for (size_t h = 0; h < 2 && 2 * c + h < nb; h++) {
            const size_t b = 2 * c + h;
            const __m512 qdv = _mm512_loadu_ps(qd + 16 * b);
            const __m512i off = kind == Q8_Q4_0 ? _mm512_slli_epi32(_mm512_loadu_si512(qsum + 16 * b), 3)
                                                : _mm512_setzero_si512(); /* 8 x sum: nibbles are value + 8 */
            if (kind != Q8_INT8) _mm512_store_ps(kd, fmha_q8_key_halves(kind, kr, b));
#pragma GCC unroll 16
            for (int m = 0; m < 16; m++) {
                const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(cs[h] + 16 * m), off));
                const __m512 w = kind == Q8_INT8 ? qdv : _mm512_mul_ps(qdv, _mm512_set1_ps(kd[m]));
                acc[m] = _mm512_fmadd_ps(sum, w, acc[m]);
            }
        }
    }
    fmha_q8_store_rows(acc, scale, nj, nr, s, lds);
}

FMHA_INLINE void scores_tiles(const int kind, size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                              size_t ldk, float *s, size_t lds, float scale) {
    FMHA_AMX_FN(fmha_amx_ready)(); /* configures on a call outside a job (tests) */
    const uint8_t *k8 = k;
    for (size_t j0 = 0; j0 < nk; j0 += 16) {
        const size_t nj = nk - j0 < 16 ? nk - j0 : 16;
        const uint8_t *kr[16];
        for (size_t i = 0; i < 16; i++) kr[i] = k8 + (j0 + (i < nj ? i : nj - 1)) * ldk;
        for (size_t r0 = 0; r0 < rows; r0 += 16)
            tiles_block(kind, nj, rows - r0 < 16 ? rows - r0 : 16, d,
                        (const uint8_t *)q->tiles + r0 / 16 * fmha_q8_tiles_group_bytes(d), kr, s + r0 * lds + j0, lds,
                        scale);
    }
}

#define AMX_SCORES_Q8(name, kind)                                                                                      \
    void FMHA_AMX_FN(fmha_##name##kv_scores_q8)(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q,              \
                                                 const void *k, size_t ldk, float *s, size_t lds, float scale) {       \
        if (rows < TILE_MIN_ROWS) fmha_##name##kv_scores_q8__avx512vnni(rows, nk, d, q, k, ldk, s, lds, scale);       \
        else scores_tiles(kind, rows, nk, d, q, k, ldk, s, lds, scale);                                                \
    }
AMX_SCORES_Q8(int8, Q8_INT8)
AMX_SCORES_Q8(q8_0, Q8_Q8_0)
AMX_SCORES_Q8(q4_0, Q8_Q4_0)
