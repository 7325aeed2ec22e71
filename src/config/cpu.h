/* cpu.h: the config layer. The ISA registry (every ISA the build has,
 * with its CPU check, its composed kernel table and its tuning, resolved
 * once from tuning.h's sources), the context a call runs with, and the
 * FMHA_ISA override. The checks and the compiled-in tunings live per
 * architecture (cpu_x86.c, cpu_arm.c); the registry (cpu.c) adds the
 * scalar ISA, which runs anywhere. Nothing else resolves a table or a
 * tuning. Internal to the library and its tests. */
#ifndef FMHA_CPU_H
#define FMHA_CPU_H

#include <stddef.h>

#include "config/tuning.h"
#include "uk/ukernel.h"

/* An ISA of an architecture: its name, a check that this CPU and OS can run
 * it (1 or 0; it may ask the OS for a permission, once), and its parts. */
typedef struct fmha_arch_isa {
    const char *name;
    int (*detect)(void);
    const fmha_isa_parts *parts; /* NULL: not in this build (the registry skips it) */
    /* 1: never the registry's choice, only FMHA_ISA's (amx_emu) */
    int by_name_only;
} fmha_arch_isa;

/* The architecture's ISAs, most preferred first (cpu_x86.c, cpu_arm.c;
 * none elsewhere), and a line naming the CPU and its features for
 * fmha_plan_describe ("AuthenticAMD family 25 model 17: avx2 avx512f ..."). */
size_t fmha_arch_isa_count(void);
const fmha_arch_isa *fmha_arch_isa_at(size_t i);
void fmha_arch_describe(char *buf, size_t n);

/* This CPU's vendor (cpuid's string on x86, "" where none is read),
 * family and model, for choosing tunings. */
void fmha_arch_cpu_id(char *vendor, size_t vendor_size, unsigned *family, unsigned *model);

/* A tuning the project measured on a CPU (cpu_<arch>.c): the ISA it
 * applies to, the CPU (vendor string as cpuid spells it, family, models
 * lo..hi), its name and its fields as key=value text over the defaults
 * (tuning.h). */
typedef struct fmha_arch_tuning {
    const char *isa, *vendor;
    unsigned family, model_lo, model_hi;
    const char *name, *fields;
} fmha_arch_tuning;

/* The architecture's tunings, most specific first. */
const fmha_arch_tuning *fmha_arch_tunings(size_t *n);

/* This CPU's caches (bytes; 0 where unknown), read once: cpuid on x86,
 * /sys/devices/system/cpu/cpu0/cache on Linux elsewhere. */
typedef struct fmha_cache_sizes {
    int64_t l1d, l2;
} fmha_cache_sizes;
void fmha_arch_cache_sizes(fmha_cache_sizes *c);

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

/* What a call runs with, resolved once: the kernel table (its parts
 * composed, its tuning fully resolved: uk->tuning) and the table its
 * float32 plans in IEEE arithmetic run on (the float32 tile shape the
 * tuning names among those its tile part lists: the table's parts with
 * that tile, less bf16 and matrix, or the table itself). The
 * registry holds one per ISA; fmha_tune builds its own (fmha_cpu_trial).
 * Immutable once made. */
typedef struct fmha_context {
    const fmha_ukernels *uk, *f32;
} fmha_context;

/* The context in use: the first supported ISA of the registry's, or
 * FMHA_ISA's choice when it names a supported one. */
const fmha_context *fmha_context_default(void);

/* The table in use (fmha_context_default()->uk). */
const fmha_ukernels *fmha_cpu_kernels(void);

/* A trial's context (fmha_tune): the supported ISA `isa` composed with
 * tuning t (fields set or FMHA_TUNING_OF_TABLE; t must outlive the trial)
 * in the trial's own tables. Returns 0, or -1 when `isa` is not a
 * supported ISA here. */
typedef struct fmha_trial {
    fmha_tuning tuning;
    fmha_ukernels base, f32;
    fmha_context ctx;
} fmha_trial;
int fmha_cpu_trial(const char *isa, const fmha_tuning *t, fmha_trial *out);

/* The tuning the registry resolves for `isa` before FMHA_TUNING: wisdom
 * (FMHA_WISDOM's file, then the per-user one), the architecture's first
 * matching entry, the cache heuristic, else generic; fields the table
 * decides stay FMHA_TUNING_OF_TABLE. The name points at static storage or
 * at `name` (name_size bytes). */
void fmha_tuning_lookup(const char *isa, fmha_tuning *out, char *name, size_t name_size);

/* The cache-size heuristic's fields as key=value text (0 and "" when the
 * cache sizes are unknown). */
int fmha_tuning_heuristic(const fmha_cache_sizes *c, char *fields, size_t size);

/* The status line of fmha_tuning_status() after fmha_tune wrote wisdom. */
void fmha_tuning_set_status(const char *line);

/* The table (the context) for an ISA name, or NULL when the name is
 * unknown or this CPU (or build) cannot run it. */
const fmha_ukernels *fmha_cpu_kernels_for(const char *isa);
const fmha_context *fmha_cpu_context_for(const char *isa);

/* Tests only: before the registry's first use, makes the ISAs that `list`
 * (comma-separated names) leaves out count as unsupported here, so that an
 * emulated test run can cover a subset of the tables (tests/c/test_util.c:
 * FMHA_TEST_ISAS). scalar, the specification and the portable strategy's
 * table, stays available by name (fmha_cpu_kernels_for, forcing) even
 * then; fmha_isa_supported reports it left out. */
void fmha_cpu_limit_isas(const char *list);

/* The i-th float32 tile shape a tuning's tile_mr x tile_nr may pick on
 * `table` (its tile part's list, fmha_uk_tile.shapes): 0 its own (the
 * table's tile), then the others; NULL past the last. */
const fmha_uk_tile *fmha_cpu_f32_tile_at(const fmha_ukernels *table, size_t i);

/* Tests only: makes ctx (a trial's, which must outlive its use) the
 * context in use, as fmha_cpu_force_isa does a registered one. Not
 * thread-safe against concurrent attention calls. */
void fmha_cpu_force_context(const fmha_context *ctx);

/* Makes `isa` the table in use (tests run every ISA in one process).
 * Returns 0, or -1 when fmha_cpu_kernels_for(isa) is NULL. Not thread-safe
 * against concurrent attention calls. */
int fmha_cpu_force_isa(const char *isa);

#endif /* FMHA_CPU_H */
