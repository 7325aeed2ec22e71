/* amx_emu/amx.c: the amx kernels (amx/amx.c) built over the software
 * tile unit (tile_unit.c), suffix __amx_emu. */
#define FMHA_AMX_EMULATED 1
#include "../amx/amx.c"
