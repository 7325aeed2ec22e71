/* cpu.h: the ISA registry (every ISA the build has, with its CPU check and
 * its composed kernel table), which table this CPU runs, and the FMHA_ISA
 * override. The checks live per architecture (cpu_x86.c, cpu_arm.c); this
 * registry (cpu.c) adds the scalar ISA, which runs anywhere. Internal to
 * the library and its tests. */
#ifndef FMHA_CPU_H
#define FMHA_CPU_H

#include <stddef.h>

#include "uk/ukernel.h"

/* An ISA of an architecture: its name, a check that this CPU and OS can run
 * it (1 or 0; it may ask the OS for a permission, once), and its parts. */
typedef struct fmha_arch_isa {
    const char *name;
    int (*detect)(void);
    const fmha_isa_parts *parts; /* NULL: not in this build (the registry skips it) */
    /* 1: never the registry's choice, only FMHA_ISA's (amx_emu) */
    int by_name_only;
    /* A float32 variant: the ISA whose float32 tiles it replaces (its tile
     * part another shape, the other parts that ISA's; no bf16 part). Float32
     * plans of every table with that ISA's tile part run on it when their
     * tuning names its MR x NR (tuning.h); NULL for the others. */
    const char *variant_of;
} fmha_arch_isa;

/* The architecture's ISAs, most preferred first (cpu_x86.c, cpu_arm.c;
 * none elsewhere), and a line naming the CPU and its features for
 * fmha_plan_describe ("AuthenticAMD family 25 model 17: avx2 avx512f ..."). */
size_t fmha_arch_isa_count(void);
const fmha_arch_isa *fmha_arch_isa_at(size_t i);
void fmha_arch_describe(char *buf, size_t n);

/* This CPU's vendor (cpuid's string on x86, "" where none is read),
 * family and model, for choosing tunings (tuning.h), and the
 * architecture's tunings, most specific first. */
void fmha_arch_cpu_id(char *vendor, size_t vendor_size, unsigned *family, unsigned *model);
const struct fmha_arch_tuning *fmha_arch_tunings(size_t *n);

/* One registered ISA: its name (also table->isa), its check and its
 * composed kernel table. */
typedef struct fmha_isa {
    const char *name;
    int (*detect)(void);
    const fmha_ukernels *table;
} fmha_isa;

/* The registry, most preferred first: the architecture's ISAs, then scalar.
 * Lists every ISA the build has, supported here or not; fmha_isa_at returns
 * NULL for i >= fmha_isa_count(). */
size_t fmha_isa_count(void);
const fmha_isa *fmha_isa_at(size_t i);

/* 1 if this CPU runs `isa` (detect's answer, taken once), else 0. */
int fmha_isa_supported(const fmha_isa *isa);

/* The table in use: the first supported ISA of the registry, or FMHA_ISA's
 * choice when it names a supported one (a tuning trial's table on a thread
 * that set one: fmha_cpu_set_trial). */
const fmha_ukernels *fmha_cpu_kernels(void);

/* The table float32 plans of `uk` run on: the float32 variant its tuning
 * names (tile_mr, tile_nr), composed with uk's tuning, or uk itself. */
const fmha_ukernels *fmha_cpu_f32_kernels(const fmha_ukernels *uk);

/* Tuning trials (fmha_tune, tune.c): composes the supported ISA `isa` with
 * tuning t (which must outlive them) into *base, and into *f32 the table
 * its float32 plans run on under t. Returns 0, or -1 when `isa` is not a
 * supported ISA here. fmha_cpu_set_trial makes them the calling thread's
 * tables for the plans it makes (NULL, NULL: the registry's again); the
 * registry's tables and other threads are untouched. */
int fmha_cpu_trial_tables(const char *isa, const struct fmha_tuning *t, fmha_ukernels *base, fmha_ukernels *f32);
void fmha_cpu_set_trial(const fmha_ukernels *base, const fmha_ukernels *f32);

/* The table for an ISA name, or NULL when the name is unknown or this CPU
 * (or build) cannot run it. */
const fmha_ukernels *fmha_cpu_kernels_for(const char *isa);

/* Tests only: before the registry's first use, makes the ISAs that `list`
 * (comma-separated names) leaves out count as unsupported here, so that an
 * emulated test run can cover a subset of the tables (tests/c/test_util.c:
 * FMHA_TEST_ISAS). scalar, the specification and the portable strategy's
 * table, stays available by name (fmha_cpu_kernels_for, forcing) even
 * then; fmha_isa_supported reports it left out. */
void fmha_cpu_limit_isas(const char *list);

/* Tests only: before the registry's first use, makes the float32 variants
 * (fmha_arch_isa.variant_of) count as unsupported here, so that a test
 * that does not ask for them skips them (tests/c/test_util.c). */
void fmha_cpu_skip_variants(void);

/* Makes `isa` the table in use (tests run every ISA in one process).
 * Returns 0, or -1 when fmha_cpu_kernels_for(isa) is NULL. Not thread-safe
 * against concurrent attention calls. */
int fmha_cpu_force_isa(const char *isa);

#endif /* FMHA_CPU_H */
