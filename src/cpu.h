/* cpu.h: the ISA registry (every microkernel table the build has, with its
 * CPU check), which table this CPU runs, and the FMHA_ISA override.
 * Internal to the library and its tests. */
#ifndef FMHA_CPU_H
#define FMHA_CPU_H

#include <stddef.h>

#include "uk/ukernel.h"

/* One registered ISA: its name (also table->isa), a check that this CPU and
 * OS can run it, and its kernel table. */
typedef struct fmha_isa {
    const char *name;
    int (*detect)(void); /* 1 if this CPU and OS support the ISA, else 0 */
    const fmha_ukernels *table;
} fmha_isa;

/* The registry, most preferred first (avx512bf16, avx512, avx2, scalar on
 * x86-64; scalar alone elsewhere). Lists every ISA the build has, supported
 * here or not; fmha_isa_at returns NULL for i >= fmha_isa_count(). */
size_t fmha_isa_count(void);
const fmha_isa *fmha_isa_at(size_t i);

/* 1 if this CPU runs `isa` (detect's answer, taken once), else 0. */
int fmha_isa_supported(const fmha_isa *isa);

/* The table in use: the first supported ISA of the registry, or FMHA_ISA's
 * choice when it names a supported one. */
const fmha_ukernels *fmha_cpu_kernels(void);

/* The table for an ISA name, or NULL when the name is unknown or this CPU
 * (or build) cannot run it. */
const fmha_ukernels *fmha_cpu_kernels_for(const char *isa);

/* Makes `isa` the table in use (tests run every ISA in one process).
 * Returns 0, or -1 when fmha_cpu_kernels_for(isa) is NULL. Not thread-safe
 * against concurrent attention calls. */
int fmha_cpu_force_isa(const char *isa);

#endif /* FMHA_CPU_H */
