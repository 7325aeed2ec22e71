/* amx/tile.h: the tile instructions the amx kernels use, as macros over
 * either the hardware (inline asm) or the software tile unit
 * (amx_emu/tile_unit.h), so that one kernel source builds two tables: amx
 * and amx_emu (the same files compiled with FMHA_AMX_EMULATED=1 for the
 * test builds, src/uk/amx_emu/CMakeLists.txt; any AVX512_BF16 CPU).
 *
 * Why asm and not <immintrin.h>: GCC 12's _tile_loadconfig tells the
 * compiler it reads 8 bytes of the configuration, so -O2/-O3 deleted the
 * stores of its rows and column widths and every tile instruction after it
 * faulted (SIGILL); its _tile_loadd/_tile_stored name no memory at all, so
 * stores into a block could move past the load that reads it. Here:
 *   - the configuration is a constant object in read-only data, and
 *     ldtilecfg names all 64 bytes of it as its memory operand;
 *   - tileloadd and tilestored clobber "memory", so the compiler finishes
 *     every store before a load and reads nothing a store writes early;
 *   - every tile instruction is volatile, so they keep their order.
 * tests/python/test_amx_static.py checks the shipped library's ldtilecfg
 * operands; tests/c/test_tile_unit.c reads the configuration back. */
#ifndef FMHA_UK_AMX_TILE_H
#define FMHA_UK_AMX_TILE_H

#include <stddef.h>
#include <stdint.h>

/* ldtilecfg's 64-byte operand (palette 1: 8 tiles of up to 16 rows x 64 bytes). */
typedef struct fmha_tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fmha_tile_config;
_Static_assert(sizeof(fmha_tile_config) == 64, "ldtilecfg reads 64 bytes");

#if FMHA_AMX_EMULATED
#include "../amx_emu/tile_unit.h"
/* Kernel names of the emulated table. */
#define FMHA_AMX_FN(name) name##__amx_emu
#define TILE_LOADCONFIG(cfg) fmha_tile_unit_loadconfig(cfg)
#define TILE_STORECONFIG(cfg) fmha_tile_unit_storeconfig(cfg)
#define TILE_RELEASE() fmha_tile_unit_release()
#define TILE_ZERO(t) fmha_tile_unit_zero(t)
#define TILE_LOAD(t, base, stride) fmha_tile_unit_load(t, base, (ptrdiff_t)(stride))
#define TILE_STORE(t, base, stride) fmha_tile_unit_store(t, base, (ptrdiff_t)(stride))
#define TILE_DPBF16PS(c, a, b) fmha_tile_unit_dpbf16ps(c, a, b)
#define TILE_DPFP16PS(c, a, b) fmha_tile_unit_dpfp16ps(c, a, b)
#define TILE_DPBSSD(c, a, b) fmha_tile_unit_dpbssd(c, a, b)
#define TILE_DPBUSD(c, a, b) fmha_tile_unit_dpbusd(c, a, b)
#else
#define FMHA_AMX_FN(name) name##__amx
/* cfg: a pointer to a fmha_tile_config; all 64 bytes are the operand. */
#define TILE_LOADCONFIG(cfg) __asm__ volatile("ldtilecfg %0" ::"m"(*(const fmha_tile_config *)(cfg)))
#define TILE_STORECONFIG(cfg) __asm__ volatile("sttilecfg %0" : "=m"(*(fmha_tile_config *)(cfg)))
#define TILE_RELEASE() __asm__ volatile("tilerelease" ::: "memory")
/* t, c, a, b: tile numbers 0..7, literal (they are part of the instruction). */
#define TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TILE_LOAD(t, base, stride)                                                                                     \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"((ptrdiff_t)(stride)) : "memory")
#define TILE_STORE(t, base, stride)                                                                                    \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"((ptrdiff_t)(stride)) : "memory")
#define TILE_DPBF16PS(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TILE_DPFP16PS(c, a, b) __asm__ volatile("tdpfp16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TILE_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TILE_DPBUSD(c, a, b) __asm__ volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#endif

#endif /* FMHA_UK_AMX_TILE_H */
