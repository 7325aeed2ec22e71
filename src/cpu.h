/* cpu.h: which microkernel table this CPU runs (cpuid, once), and the
 * FMHA_ISA override. Internal to the library and its tests. */
#ifndef FMHA_CPU_H
#define FMHA_CPU_H

#include "uk/ukernel.h"

/* The table in use: the best the CPU supports, or FMHA_ISA's choice. */
const fmha_ukernels *fmha_cpu_kernels(void);

/* The table for an ISA name ("scalar", "avx2", "avx512", "avx512bf16"), or NULL when the
 * name is unknown or this CPU (or build) cannot run it. */
const fmha_ukernels *fmha_cpu_kernels_for(const char *isa);

/* Makes `isa` the table in use (tests run every ISA in one process).
 * Returns 0, or -1 when fmha_cpu_kernels_for(isa) is NULL. Not thread-safe
 * against concurrent attention calls. */
int fmha_cpu_force_isa(const char *isa);

#endif /* FMHA_CPU_H */
