/* amx_emu/attn_bwd.c: the matrix part's backward (amx/attn_bwd.c) built
 * over the software tile unit, suffix __amx_emu. */
#define FMHA_AMX_EMULATED 1
#include "../amx/attn_bwd.c"
