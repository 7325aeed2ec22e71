/* amx_emu/attn_dec.c: the matrix part's decode (amx/attn_dec.c) built
 * over the software tile unit, suffix __amx_emu. */
#define FMHA_AMX_EMULATED 1
#include "../amx/attn_dec.c"
