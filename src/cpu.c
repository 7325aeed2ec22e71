/* cpu.c: the ISA registry and the choice of kernel table. The registry is
 * the architecture's ISAs (cpu_x86.c, cpu_arm.c) followed by scalar; on
 * first use (pthread_once) each ISA's check runs and its parts are composed
 * into a complete table (uk/compose.c) with its tuning (tuning.h's lookup
 * order), then the first supported ISA is the table in use unless FMHA_ISA
 * names another supported one. A table whose tuning names a float32
 * variant (another tile shape of its float32 tile part) gets a companion:
 * the variant's table composed with the table's tuning, on which its
 * float32 plans run (fmha_cpu_f32_kernels). */
#include "cpu.h"
#include "tuning.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Architectures have at most this many ISAs besides scalar. */
enum { CPU_MAX_ISA = 16 };

static int cpu_always(void) { return 1; }

static fmha_isa cpu_registry[CPU_MAX_ISA + 1];
static fmha_ukernels cpu_tables[CPU_MAX_ISA + 1];
static const fmha_isa_parts *cpu_parts[CPU_MAX_ISA + 1];
static const char *cpu_variant_of[CPU_MAX_ISA + 1]; /* fmha_arch_isa.variant_of */
/* The table float32 plans of table i run on: &cpu_f32_tables[i] or the table */
static fmha_ukernels cpu_f32_tables[CPU_MAX_ISA + 1];
static const fmha_ukernels *cpu_f32_of[CPU_MAX_ISA + 1];
static int cpu_skip_variant_tables; /* tests: fmha_cpu_skip_variants */
/* A tuning trial's tables on this thread (fmha_cpu_set_trial) */
static _Thread_local const fmha_ukernels *cpu_trial_base, *cpu_trial_f32;
static int cpu_supported[CPU_MAX_ISA + 1];
/* 0 for an ISA that fmha_cpu_limit_isas left out (tests only) */
static int cpu_in_limit[CPU_MAX_ISA + 1];
static size_t cpu_n_isa;
static const fmha_ukernels *cpu_selected;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

/* Each table's tuning (a copy: FMHA_TUNING may change it) and its name. */
static fmha_tuning cpu_tunings[CPU_MAX_ISA + 1];
static char cpu_tuning_names[CPU_MAX_ISA + 1][48];

/* The tuning for ISA i on this CPU (tuning.h's lookup), FMHA_TUNING
 * applied (an invalid text changes nothing; fmha_plan_describe shows the
 * tuning in use). */
static const fmha_tuning *cpu_tuning(size_t i, const char *isa) {
    fmha_tuning *own = &cpu_tunings[i];
    char base_name[sizeof cpu_tuning_names[i]];
    fmha_tuning_lookup(isa, own, base_name, sizeof base_name);
    fmha_tuning base = *own;
    snprintf(cpu_tuning_names[i], sizeof cpu_tuning_names[i], "%s", base.name);
    own->name = base.name = cpu_tuning_names[i];
    const char *env = getenv("FMHA_TUNING");
    if (env && *env && fmha_tuning_parse(env, &base, own, base_name, sizeof base_name) == 0) {
        snprintf(cpu_tuning_names[i], sizeof cpu_tuning_names[i], "%s", base_name);
        own->name = cpu_tuning_names[i];
    }
    return own;
}

/* The ISAs that fmha_cpu_limit_isas leaves, "" for all. */
static char cpu_limit[256];

void fmha_cpu_limit_isas(const char *list) {
    size_t n = list ? strlen(list) : 0;
    if (n >= sizeof cpu_limit) n = sizeof cpu_limit - 1;
    memcpy(cpu_limit, list ? list : "", n);
    cpu_limit[n] = '\0';
}

/* Is `name` in cpu_limit (comma-separated), or is there no limit? */
static int cpu_listed(const char *name) {
    if (!cpu_limit[0]) return 1;
    const size_t n = strlen(name);
    for (const char *p = cpu_limit; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        p += len + (end != NULL);
    }
    return 0;
}

/* parts composed with tuning t into *out */
static void cpu_compose(size_t i, const fmha_isa_parts *parts, const fmha_tuning *t, fmha_ukernels *out) {
    fmha_ukernels_compose(parts, out);
    /* a vector-length-agnostic ISA's lanes, read only where it runs */
    if (cpu_supported[i] && out->tile.nr_at_run_time) out->tile.nr = out->tile.nr_at_run_time();
    out->tuning = t;
    if (t->block_kv) out->tile.block_kv = (size_t)t->block_kv;
}

static void cpu_add(const fmha_arch_isa *a) {
    size_t i = cpu_n_isa++;
    cpu_supported[i] = a->detect() != 0;
    cpu_in_limit[i] = cpu_listed(a->name);
    cpu_parts[i] = a->parts;
    cpu_variant_of[i] = a->variant_of;
    cpu_compose(i, a->parts, cpu_tuning(i, a->name), &cpu_tables[i]);
    cpu_registry[i] = (fmha_isa){a->name, a->detect, &cpu_tables[i]};
    if (cpu_supported[i] && cpu_in_limit[i] && !a->by_name_only && !cpu_selected) cpu_selected = &cpu_tables[i];
}

static int cpu_usable(size_t i) {
    return cpu_supported[i] && cpu_in_limit[i] && !(cpu_variant_of[i] && cpu_skip_variant_tables);
}

/* The registered float32 variant that table i's float32 plans run on
 * under tuning t (its MR x NR, of table i's tile part), or -1: i's own. */
static long cpu_variant_for(size_t i, const fmha_tuning *t) {
    if (!t->tile_mr || !t->tile_nr ||
        (cpu_tables[i].tile.mr == (size_t)t->tile_mr && cpu_tables[i].tile.nr == (size_t)t->tile_nr))
        return -1;
    for (size_t j = 0; j < cpu_n_isa; j++) {
        if (!cpu_variant_of[j] || !cpu_usable(j) || cpu_tables[j].tile.mr != (size_t)t->tile_mr ||
            cpu_tables[j].tile.nr != (size_t)t->tile_nr)
            continue;
        for (size_t b = 0; b < cpu_n_isa; b++)
            if (!strcmp(cpu_registry[b].name, cpu_variant_of[j]) && cpu_parts[b]->tile == cpu_parts[i]->tile)
                return (long)j;
    }
    return -1;
}

/* Table i's float32 table under tuning t: the variant composed with t
 * into *out, or table i (NULL). */
static const fmha_ukernels *cpu_f32_table(size_t i, const fmha_tuning *t, fmha_ukernels *out) {
    const long j = cpu_variant_for(i, t);
    if (j < 0) return NULL;
    cpu_compose((size_t)j, cpu_parts[j], t, out);
    return out;
}

/* The registry entry for a name that this CPU supports, or NULL (once the
 * checks have run; called inside cpu_init too, so it must not wait on
 * cpu_once). */
static const fmha_isa *cpu_supported_named(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < cpu_n_isa; i++)
        if (!strcmp(cpu_registry[i].name, name))
            return cpu_usable(i) || (cpu_supported[i] && !strcmp(name, "scalar")) ? &cpu_registry[i] : NULL;
    return NULL;
}

static void cpu_init(void) {
    size_t n = fmha_arch_isa_count();
    for (size_t i = 0; i < n && i < CPU_MAX_ISA; i++) {
        const fmha_arch_isa *a = fmha_arch_isa_at(i);
        if (a->parts) cpu_add(a); /* NULL: a table this build lacks (amx_emu outside the tests) */
    }
    static const fmha_arch_isa scalar = {"scalar", cpu_always, &fmha_isa_scalar, 0, NULL};
    cpu_add(&scalar);
    /* a limit that leaves only by-name tables (FMHA_TEST_ISAS=amx_emu):
     * the specification until one is forced */
    if (!cpu_selected) cpu_selected = &cpu_tables[cpu_n_isa - 1];
    for (size_t i = 0; i < cpu_n_isa; i++) {
        const fmha_ukernels *f32 = cpu_f32_table(i, cpu_tables[i].tuning, &cpu_f32_tables[i]);
        cpu_f32_of[i] = f32 ? f32 : &cpu_tables[i];
    }
    /* An unknown or unsupported FMHA_ISA leaves the best supported table. */
    const fmha_isa *forced = cpu_supported_named(getenv("FMHA_ISA"));
    if (forced) cpu_selected = forced->table;
    char line[256];
    size_t sel = 0;
    while (sel < cpu_n_isa && cpu_selected != &cpu_tables[sel]) sel++;
    snprintf(line, sizeof line, "%s: tuning %s (source %s), float32 on %s", cpu_selected->isa,
             cpu_selected->tuning->name, fmha_tuning_source_name(cpu_selected->tuning->source),
             sel < cpu_n_isa ? cpu_f32_of[sel]->isa : cpu_selected->isa);
    fmha_tuning_set_status(line);
}

size_t fmha_isa_count(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_n_isa;
}

const fmha_isa *fmha_isa_at(size_t i) {
    pthread_once(&cpu_once, cpu_init);
    return i < cpu_n_isa ? &cpu_registry[i] : NULL;
}

int fmha_isa_supported(const fmha_isa *isa) {
    pthread_once(&cpu_once, cpu_init);
    for (size_t i = 0; i < cpu_n_isa; i++)
        if (isa == &cpu_registry[i]) return cpu_usable(i);
    return 0;
}

const fmha_ukernels *fmha_cpu_kernels(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_trial_base ? cpu_trial_base : cpu_selected;
}

const fmha_ukernels *fmha_cpu_f32_kernels(const fmha_ukernels *uk) {
    pthread_once(&cpu_once, cpu_init);
    if (uk == cpu_trial_base) return cpu_trial_f32;
    for (size_t i = 0; i < cpu_n_isa; i++)
        if (uk == &cpu_tables[i]) return cpu_f32_of[i];
    return uk;
}

int fmha_cpu_trial_tables(const char *isa, const fmha_tuning *t, fmha_ukernels *base, fmha_ukernels *f32) {
    pthread_once(&cpu_once, cpu_init);
    const fmha_isa *entry = cpu_supported_named(isa);
    if (!entry) return -1;
    const size_t i = (size_t)(entry - cpu_registry);
    cpu_compose(i, cpu_parts[i], t, base);
    if (!cpu_f32_table(i, t, f32)) *f32 = *base;
    return 0;
}

void fmha_cpu_set_trial(const fmha_ukernels *base, const fmha_ukernels *f32) {
    cpu_trial_base = base;
    cpu_trial_f32 = base ? f32 : NULL;
}

void fmha_cpu_skip_variants(void) { cpu_skip_variant_tables = 1; }

const fmha_ukernels *fmha_cpu_kernels_for(const char *isa) {
    pthread_once(&cpu_once, cpu_init);
    const fmha_isa *entry = cpu_supported_named(isa);
    return entry ? entry->table : NULL;
}

int fmha_cpu_force_isa(const char *isa) {
    const fmha_ukernels *t = fmha_cpu_kernels_for(isa);
    if (!t) return -1;
    cpu_selected = t;
    return 0;
}

#if !FMHA_HAVE_X86 && !defined(__aarch64__)
/* An architecture without ISAs of its own: scalar alone. */
size_t fmha_arch_isa_count(void) { return 0; }
const fmha_arch_isa *fmha_arch_isa_at(size_t i) { return NULL; }
void fmha_arch_describe(char *buf, size_t n) {
    if (n) buf[0] = '\0';
}
void fmha_arch_cpu_id(char *vendor, size_t vendor_size, unsigned *family, unsigned *model) {
    if (vendor_size) vendor[0] = '\0';
    *family = *model = 0;
}
const struct fmha_arch_tuning *fmha_arch_tunings(size_t *n) {
    *n = 0;
    return NULL;
}
void fmha_arch_cache_sizes(fmha_cache_sizes *c) { c->l1d = c->l2 = 0; }
#endif
