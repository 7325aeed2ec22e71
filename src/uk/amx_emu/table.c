/* amx_emu/table.c: the amx table (amx/table.c) over the software tile
 * unit: the ISA "amx_emu", chosen only by FMHA_ISA=amx_emu (the tests and
 * the fuzzer run it on every AVX512_BF16 CPU). */
#define FMHA_AMX_EMULATED 1
#include "../amx/table.c"
