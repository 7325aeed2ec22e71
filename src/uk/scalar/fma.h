/* scalar/fma.h: FMHA_SCALAR_FMA_CLONES, on the scalar kernels' hot loops.
 * The scalar kernels are built for baseline x86-64, where fmaf is a call
 * into libm; on an x86-64 ELF target they also get a clone built with FMA3,
 * chosen once at load time (an ifunc), where fmaf is one instruction. Both
 * clones compute the same correctly rounded fused multiply-adds: the bits
 * do not depend on which runs. */
#ifndef FMHA_UK_SCALAR_FMA_H
#define FMHA_UK_SCALAR_FMA_H

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(FMHA_NO_FMA_CLONES)
#define FMHA_SCALAR_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define FMHA_SCALAR_FMA_CLONES
#endif

#endif /* FMHA_UK_SCALAR_FMA_H */
