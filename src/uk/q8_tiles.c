/* q8_tiles.c: a step's quantized query rows packed once a call into the
 * tiles the AMX-INT8 scores read (fmha_q8_rows.tiles' layout, ukernel.h):
 * per group of 16 rows, 64 values a chunk as the B operand's dword pairs,
 * then the blocks' scales and sums. Plain C, every ISA's build. */
#include <string.h>

#include "uk/ukernel.h"

void fmha_q8_tiles_pack(size_t rows, size_t d, const fmha_q8_rows *q, void *out) {
    const size_t chunks = (d + 63) / 64, nb = d / 32, ldd = q->ld / 32;
    for (size_t g = 0; g * 16 < rows; g++) {
        int8_t *b = (int8_t *)out + g * fmha_q8_tiles_group_bytes(d);
        memset(b, 0, chunks * 2048);
        for (size_t c = 0; c < chunks; c++)
            for (size_t n = 0; n < 16 && 16 * g + n < rows; n++)
                for (size_t kk = 0; kk < 16; kk++) {
                    const size_t e = 64 * c + 4 * kk; /* values e..e+3 of row 16g + n, in block e / 32 */
                    if (e >= d) continue;
                    memcpy(b + ((2 * c + kk / 8) * 16 + kk) * 64 + 4 * n, q->q + (16 * g + n) * q->ld + e, 4);
                }
        float *qd = (float *)(b + chunks * 2048);
        int32_t *sum = (int32_t *)(qd + nb * 16);
        for (size_t blk = 0; blk < nb; blk++)
            for (size_t n = 0; n < 16; n++) {
                const int real = 16 * g + n < rows;
                qd[blk * 16 + n] = real ? q->d[(16 * g + n) * ldd + blk] : 0.0f;
                sum[blk * 16 + n] = real ? q->sum[(16 * g + n) * ldd + blk] : 0;
            }
    }
}
