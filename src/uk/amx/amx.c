/* amx/amx.c: the bf16 pair GEMM on AMX tiles (tdpbf16ps), and the tile
 * configuration each thread loads before its first tile instruction and
 * releases after its job (the thread part of the amx table).
 *
 * Contract: fmha_bf16_gemm_ukernel_fn with MR = 16, NR = 64. Tiles (palette
 * 1, every tile 16 rows x 64 bytes):
 *   tmm0..3  C, four 16 x 16 float32 blocks of the 16 x 64 product
 *   tmm4     A, 16 rows x 16 pairs (32 bf16) of a k-step
 *   tmm5     B, 16 pair-rows x 16 columns, one column block at a time
 * The pair-rows of B are the VNNI layout tdpbf16ps reads (word (p, i) holds
 * B[2p][i], B[2p+1][i]), loaded in place; A is loaded in place when its
 * pairs are contiguous (a_cs = 1) and the tile is whole, else gathered
 * (vpgatherdd, a row at a time) into a zero-padded 16 x 16 block; a k-tail
 * of B is copied into a zero-padded block (rows past kp are never
 * read). The product goes through memory once (tilestored) and the mode and
 * ab_scale are applied there with AVX-512.
 *
 * Arithmetic (tdpbf16ps): each pair-step adds the two bf16 products to the
 * float32 accumulator, round to nearest even; subnormal inputs and results
 * are flushed to zero. The summation order differs from vdpbf16ps's, so
 * results agree with the scalar specification within its tolerance, not
 * bit for bit. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "amx.h"
#include "tile.h"

/* The one configuration of every amx kernel: tmm0..tmm7 all 16 rows x 64
 * bytes. A constant, so nothing stored at run time can be lost. */
static const _Alignas(64) fmha_tile_config amx_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* This thread's tiles are configured for these kernels. */
static _Thread_local int amx_configured;

static void amx_configure(void) {
    TILE_LOADCONFIG(&amx_config);
    amx_configured = 1;
}

void FMHA_AMX_FN(fmha_amx_thread_begin)(void) { amx_configure(); }

void FMHA_AMX_FN(fmha_amx_thread_end)(void) {
    TILE_RELEASE();
    amx_configured = 0;
}

void FMHA_AMX_FN(fmha_amx_thread_foreign)(void) { amx_configured = 0; }

void FMHA_AMX_FN(fmha_amx_ready)(void) {
    if (!amx_configured) amx_configure();
}

const fmha_tile_config *FMHA_AMX_FN(fmha_amx_tile_config)(void) { return &amx_config; }

/* c[r][0..64) = op(c, s * acc[r]) for r < m (acc rows 64 floats apart). */
static void amx_epilogue(size_t m, const float *acc, float *c, size_t ldc, int mode, const float *col_scale,
                         float ab_scale) {
    const __m512 s = _mm512_set1_ps(ab_scale);
    for (size_t r = 0; r < m; r++)
        for (int j = 0; j < 64; j += 16) {
            __m512 x = _mm512_mul_ps(s, _mm512_load_ps(acc + r * 64 + j));
            float *cr = c + r * ldc + j;
            if (mode == FMHA_UK_ACCUMULATE) x = _mm512_add_ps(_mm512_loadu_ps(cr), x);
            else if (mode == FMHA_UK_RESCALE)
                x = _mm512_fmadd_ps(_mm512_loadu_ps(cr), _mm512_loadu_ps(col_scale + j), x);
            _mm512_storeu_ps(cr, x);
        }
}

void FMHA_AMX_FN(fmha_bf16_gemm_ukernel_16x64)(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                       const uint32_t *b, size_t ldb, float *c, size_t ldc, int mode,
                                       const float *col_scale, float ab_scale) {
    FMHA_AMX_FN(fmha_amx_ready)(); /* configures on a call outside a job (tests) */
    /* acc [16][64] the product; a_blk [16][16] and b_blk [16][64] gathered operands */
    _Alignas(64) float acc[16 * 64];
    _Alignas(64) uint32_t a_blk[16 * 16];
    _Alignas(64) uint32_t b_blk[16 * 64];
    /* pair p of an A row at p * a_cs words: gathered when the offsets fit 32 bits */
    const int gather = a_cs >= 0 && a_cs <= (ptrdiff_t)(INT32_MAX / 16);
    const __m512i pair_index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                  _mm512_set1_epi32(gather ? (int)a_cs : 0));
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    for (size_t p0 = 0; p0 < kp; p0 += 16) {
        const size_t np = kp - p0 < 16 ? kp - p0 : 16;
        if (a_cs == 1 && m == 16 && np == 16) {
            TILE_LOAD(4, a + p0, (long)a_rs * 4);
        } else if (gather) { /* a row of 16 pairs a_cs words apart: one gather */
            const __mmask16 pm = (__mmask16)((1u << np) - 1u);
            for (size_t r = 0; r < 16; r++) {
                __m512i row = _mm512_setzero_si512();
                if (r < m)
                    row = _mm512_mask_i32gather_epi32(row, pm, pair_index,
                                                      a + (ptrdiff_t)r * a_rs + (ptrdiff_t)p0 * a_cs, 4);
                _mm512_store_si512((__m512i *)(a_blk + r * 16), row);
            }
            TILE_LOAD(4, a_blk, 64);
        } else {
            for (size_t r = 0; r < 16; r++)
                for (size_t p = 0; p < 16; p++)
                    a_blk[r * 16 + p] = r < m && p < np ? a[(ptrdiff_t)r * a_rs + (ptrdiff_t)(p0 + p) * a_cs] : 0u;
            TILE_LOAD(4, a_blk, 64);
        }
        const uint32_t *bp = b + p0 * ldb;
        long b_stride = (long)ldb * 4;
        if (np < 16) {
            for (size_t p = 0; p < 16; p++)
                if (p < np) memcpy(b_blk + p * 64, b + (p0 + p) * ldb, 64 * sizeof(uint32_t));
                else memset(b_blk + p * 64, 0, 64 * sizeof(uint32_t));
            bp = b_blk;
            b_stride = 256;
        }
        TILE_LOAD(5, bp, b_stride);
        TILE_DPBF16PS(0, 4, 5);
        TILE_LOAD(5, bp + 16, b_stride);
        TILE_DPBF16PS(1, 4, 5);
        TILE_LOAD(5, bp + 32, b_stride);
        TILE_DPBF16PS(2, 4, 5);
        TILE_LOAD(5, bp + 48, b_stride);
        TILE_DPBF16PS(3, 4, 5);
    }
    TILE_STORE(0, acc, 256);
    TILE_STORE(1, acc + 16, 256);
    TILE_STORE(2, acc + 32, 256);
    TILE_STORE(3, acc + 48, 256);
    amx_epilogue(m, acc, c, ldc, mode, col_scale, ab_scale);
}
