/* dropout.c (scalar): the specification of the dropout kernel (contract in
 * ukernel.h): a counter-based hash per score, so the backward regenerates
 * the forward's mask and every ISA drops the same scores. */
#include "../ukernel.h"

void fmha_f32_dropout_ukernel__scalar(size_t rows, size_t lanes, float *s, size_t lds,
                                      const uint64_t *counter, uint64_t seed_mix, uint64_t threshold,
                                      float scale) {
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < lanes; i++) {
            uint64_t z = fmha_dropout_mix64((counter[i] + r) ^ seed_mix);
            s[r * lds + i] *= (z >> 32) >= threshold ? scale : 0.0f;
        }
}
