/* amx_emu/tile_unit.c: the software tile unit (tile_unit.h): per-thread
 * tiles and configuration, the checks the hardware makes (a fault prints
 * its reason and aborts), and the products on AVX-512 (the amx_emu table
 * needs AVX512_BF16 for its other parts anyway). */
#include <immintrin.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../amx/tile.h"
#include "tile_unit.h"

enum { UNIT_TILES = 8, UNIT_ROWS = 16, UNIT_COLSB = 64 };

/* This thread's tile unit: tile t's row r at tile[t][r] (64 bytes). */
typedef struct tile_unit {
    _Alignas(64) uint8_t tile[UNIT_TILES][UNIT_ROWS][UNIT_COLSB];
    fmha_tile_config cfg;
    int configured;
} tile_unit;

static _Thread_local tile_unit unit;

static _Noreturn void unit_fault(const char *insn, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "fmha amx_emu: %s: ", insn);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (a fault on AMX hardware)\n");
    fflush(stderr);
    abort();
}

/* Tile t, which must exist and be configured, for instruction insn. */
static void unit_check_tile(const char *insn, int t) {
    if (!unit.configured) unit_fault(insn, "no tile configuration loaded (ldtilecfg) on this thread");
    if (t < 0 || t >= UNIT_TILES) unit_fault(insn, "tile %d does not exist (palette 1 has tmm0..tmm7)", t);
    if (unit.cfg.rows[t] == 0) unit_fault(insn, "tmm%d is not configured (0 rows)", t);
}

void fmha_tile_unit_loadconfig(const void *cfg_bytes) {
    const char *insn = "ldtilecfg";
    fmha_tile_config cfg;
    memcpy(&cfg, cfg_bytes, sizeof cfg);
    if (cfg.palette == 0) { /* the init state: as tilerelease */
        fmha_tile_unit_release();
        return;
    }
    if (cfg.palette != 1) unit_fault(insn, "palette %u is not supported (1 is)", cfg.palette);
    if (cfg.start_row != 0) unit_fault(insn, "start_row %u (kernels start at 0)", cfg.start_row);
    for (int i = 0; i < 14; i++)
        if (cfg.reserved[i]) unit_fault(insn, "reserved byte %d is %u, not 0", i + 2, cfg.reserved[i]);
    for (int t = 0; t < 16; t++) {
        unsigned rows = cfg.rows[t], colsb = cfg.colsb[t];
        if (t >= UNIT_TILES && (rows || colsb)) unit_fault(insn, "tile %d has a shape; palette 1 has 8 tiles", t);
        if (rows > UNIT_ROWS || colsb > UNIT_COLSB)
            unit_fault(insn, "tmm%d is %u rows x %u bytes, over 16 x 64", t, rows, colsb);
        if ((rows == 0) != (colsb == 0)) unit_fault(insn, "tmm%d is %u rows x %u bytes: both or neither zero", t, rows, colsb);
    }
    unit.cfg = cfg;
    unit.configured = 1;
    memset(unit.tile, 0, sizeof unit.tile);
}

void fmha_tile_unit_storeconfig(void *cfg) {
    if (unit.configured) memcpy(cfg, &unit.cfg, sizeof unit.cfg);
    else memset(cfg, 0, sizeof unit.cfg);
}

void fmha_tile_unit_release(void) {
    memset(&unit.cfg, 0, sizeof unit.cfg);
    memset(unit.tile, 0, sizeof unit.tile);
    unit.configured = 0;
}

void fmha_tile_unit_zero(int t) {
    unit_check_tile("tilezero", t);
    memset(unit.tile[t], 0, sizeof unit.tile[t]);
}

void fmha_tile_unit_load(int t, const void *base, ptrdiff_t stride) {
    unit_check_tile("tileloadd", t);
    memset(unit.tile[t], 0, sizeof unit.tile[t]);
    for (unsigned r = 0; r < unit.cfg.rows[t]; r++)
        memcpy(unit.tile[t][r], (const char *)base + (ptrdiff_t)r * stride, unit.cfg.colsb[t]);
}

void fmha_tile_unit_store(int t, void *base, ptrdiff_t stride) {
    unit_check_tile("tilestored", t);
    for (unsigned r = 0; r < unit.cfg.rows[t]; r++)
        memcpy((char *)base + (ptrdiff_t)r * stride, unit.tile[t][r], unit.cfg.colsb[t]);
}

/* The checks of a tile product C[M][N] += A[M][K] B[K][N] (4-byte
 * elements of C, 4-byte groups along K): distinct, configured tiles whose
 * shapes agree. Sets M, N, K. */
static void unit_check_product(const char *insn, int c, int a, int b, unsigned *m, unsigned *n, unsigned *k) {
    unit_check_tile(insn, c);
    unit_check_tile(insn, a);
    unit_check_tile(insn, b);
    if (c == a || c == b || a == b) unit_fault(insn, "tmm%d, tmm%d, tmm%d: a tile named twice", c, a, b);
    const unsigned cr = unit.cfg.rows[c], cc = unit.cfg.colsb[c], ar = unit.cfg.rows[a], ac = unit.cfg.colsb[a];
    const unsigned br = unit.cfg.rows[b], bc = unit.cfg.colsb[b];
    if (cc % 4 || ac % 4 || bc % 4) unit_fault(insn, "row bytes %u, %u, %u: not multiples of 4", cc, ac, bc);
    if (cr != ar) unit_fault(insn, "C has %u rows, A %u", cr, ar);
    if (cc != bc) unit_fault(insn, "C rows are %u bytes, B rows %u", cc, bc);
    if (ac / 4 != br) unit_fault(insn, "A has %u groups a row, B %u rows", ac / 4, br);
    *m = cr;
    *n = cc / 4;
    *k = br;
}

/* x with its subnormal lanes made zeros of their sign. */
static __m512 unit_flush(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __mmask16 tiny = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7F800000));
    return _mm512_castsi512_ps(_mm512_mask_and_epi32(bits, tiny, bits, _mm512_set1_epi32((int)0x80000000)));
}

/* bf16 halves of 16 pair words as float32, subnormals flushed: lo (element
 * 2p) and hi (element 2p + 1). */
static void unit_bf16_pairs(__m512i w, __m512 *lo, __m512 *hi) {
    *lo = unit_flush(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    *hi = unit_flush(_mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000))));
}

/* f16 halves of 16 pair words as float32 (exact, subnormals kept). */
static void unit_f16_pairs(__m512i w, __m512 *lo, __m512 *hi) {
    *lo = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w));
    *hi = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
}

/* C += A B over float pairs: C read with its subnormals flushed; each
 * step's two products in float32 (exact for 8- or 11-bit significands,
 * infinite past the range, flushed below it), their sum rounded once (a
 * zero sum is +0) and flushed, then added to C and flushed. Measured on an
 * Intel Xeon (tests/c/test_tile_unit.c): a subnormal C and a subnormal
 * product count as zero (2^-127 + 2^-127 gives 0), two infinite products
 * of opposite signs give NaN, -1 * +0 + -1 * +0 added to C = -0 gives +0,
 * a negative subnormal sum added to C = -0 gives -0. */
static void unit_float_pairs(const char *insn, int c, int a, int b, void (*pairs)(__m512i, __m512 *, __m512 *)) {
    unsigned M, N, K;
    unit_check_product(insn, c, a, b, &M, &N, &K);
    const __mmask16 lanes = (__mmask16)((1u << N) - 1u);
    for (unsigned m = 0; m < M; m++) {
        float *crow = (float *)unit.tile[c][m];
        __m512 acc = unit_flush(_mm512_maskz_loadu_ps(lanes, crow));
        for (unsigned k = 0; k < K; k++) {
            uint32_t aw;
            memcpy(&aw, unit.tile[a][m] + 4 * k, 4);
            __m512 a0, a1, b0, b1;
            pairs(_mm512_set1_epi32((int)aw), &a0, &a1);
            pairs(_mm512_loadu_si512(unit.tile[b][k]), &b0, &b1);
            const __m512 sum = _mm512_add_ps(unit_flush(_mm512_mul_ps(a0, b0)), unit_flush(_mm512_mul_ps(a1, b1)));
            const __m512 pair = unit_flush(_mm512_add_ps(sum, _mm512_setzero_ps())); /* -0 + +0 = +0 */
            acc = unit_flush(_mm512_add_ps(acc, pair));
        }
        _mm512_mask_storeu_ps(crow, lanes, acc);
    }
}

void fmha_tile_unit_dpbf16ps(int c, int a, int b) { unit_float_pairs("tdpbf16ps", c, a, b, unit_bf16_pairs); }

void fmha_tile_unit_dpfp16ps(int c, int a, int b) { unit_float_pairs("tdpfp16ps", c, a, b, unit_f16_pairs); }

/* C += A B over groups of four bytes, signed or unsigned on each side,
 * int32 wrapping. */
static void unit_int8(const char *insn, int c, int a, int b, int a_signed, int b_signed) {
    unsigned M, N, K;
    unit_check_product(insn, c, a, b, &M, &N, &K);
    for (unsigned m = 0; m < M; m++)
        for (unsigned n = 0; n < N; n++) {
            uint32_t acc;
            memcpy(&acc, unit.tile[c][m] + 4 * n, 4);
            for (unsigned k = 0; k < K; k++)
                for (unsigned j = 0; j < 4; j++) {
                    const uint8_t x = unit.tile[a][m][4 * k + j], y = unit.tile[b][k][4 * n + j];
                    const int32_t xv = a_signed ? (int8_t)x : x, yv = b_signed ? (int8_t)y : y;
                    acc += (uint32_t)(xv * yv);
                }
            memcpy(unit.tile[c][m] + 4 * n, &acc, 4);
        }
}

void fmha_tile_unit_dpbssd(int c, int a, int b) { unit_int8("tdpbssd", c, a, b, 1, 1); }
void fmha_tile_unit_dpbsud(int c, int a, int b) { unit_int8("tdpbsud", c, a, b, 1, 0); }
void fmha_tile_unit_dpbusd(int c, int a, int b) { unit_int8("tdpbusd", c, a, b, 0, 1); }
void fmha_tile_unit_dpbuud(int c, int a, int b) { unit_int8("tdpbuud", c, a, b, 0, 0); }
