/* amx_emu/tile_unit.h: a software AMX tile unit, per thread: eight 1 KiB
 * tiles and a palette-1 configuration, with the instructions the amx
 * kernels use. The amx kernels built against it (FMHA_AMX_EMULATED, see
 * amx/tile.h) form the amx_emu table, so every AMX kernel runs, and is
 * tested, on CPUs without tiles.
 *
 * Faults: where the hardware raises #UD or #GP (a tile instruction before
 * ldtilecfg, an invalid configuration, shapes the configuration does not
 * allow, a tile named twice in one product), the unit prints what was
 * wrong and aborts the process.
 *
 * Arithmetic:
 *   dpbf16ps  per pair-step, a0*b0 + a1*b1 rounded once to float32 (nearest
 *             even; each product is exact, infinite past the range, zero
 *             below it; a zero sum is +0), then added to C (nearest even):
 *             the rule measured on an Intel Xeon for one pair per step,
 *             bit for bit, applied step by step.
 *             With several pair-steps a row the hardware's order differs, so
 *             results agree with it within rounding, not bit for bit. bf16
 *             subnormal inputs, a subnormal C and float32 subnormal results
 *             are flushed to zero, as Intel documents (C measured).
 *   dpfp16ps  the same over float16 pairs, subnormal f16 inputs kept (as
 *             documented for AMX-FP16), C and results flushed.
 *   dpb[su][su]d  int32 C += four 8-bit products per step, wrapping: exact,
 *             as the hardware.
 * Tiles are loaded and stored over the configured rows and bytes of each
 * row only; a load zeroes the rest of the tile. */
#ifndef FMHA_UK_AMX_EMU_TILE_UNIT_H
#define FMHA_UK_AMX_EMU_TILE_UNIT_H

#include <stddef.h>

void fmha_tile_unit_loadconfig(const void *cfg);
void fmha_tile_unit_storeconfig(void *cfg);
void fmha_tile_unit_release(void);
void fmha_tile_unit_zero(int t);
void fmha_tile_unit_load(int t, const void *base, ptrdiff_t stride);
void fmha_tile_unit_store(int t, void *base, ptrdiff_t stride);
void fmha_tile_unit_dpbf16ps(int c, int a, int b);
void fmha_tile_unit_dpfp16ps(int c, int a, int b);
void fmha_tile_unit_dpbssd(int c, int a, int b);
void fmha_tile_unit_dpbsud(int c, int a, int b);
void fmha_tile_unit_dpbusd(int c, int a, int b);
void fmha_tile_unit_dpbuud(int c, int a, int b);

#endif /* FMHA_UK_AMX_EMU_TILE_UNIT_H */
