/* dropout.c (scalar): the specification of the dropout kernel (contract in
 * ukernel.h): a counter-based hash per score, so the backward regenerates
 * the forward's mask and every ISA drops the same scores. */
#include "../ukernel.h"

/* splitmix64's finalizer: a bijection of 64-bit words that mixes every bit. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void fmha_f32_dropout_ukernel__scalar(size_t rows, size_t lanes, float *s, size_t lds,
                                      const uint64_t *counter, uint64_t seed_mix, uint64_t threshold,
                                      float scale) {
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < lanes; i++) {
            uint64_t z = mix64((counter[i] + r) ^ seed_mix);
            s[r * lds + i] *= (z >> 32) >= threshold ? scale : 0.0f;
        }
}
