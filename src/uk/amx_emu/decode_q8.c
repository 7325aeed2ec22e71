/* amx_emu/decode_q8.c: the integer scores on tiles (amx/decode_q8.c) over
 * the software tile unit, suffix __amx_emu. */
#define FMHA_AMX_EMULATED 1
#include "../amx/decode_q8.c"
