/* amx_emu/attn.c: the matrix part (amx/attn.c) built over the software
 * tile unit, suffix __amx_emu. */
#define FMHA_AMX_EMULATED 1
#include "../amx/attn.c"
