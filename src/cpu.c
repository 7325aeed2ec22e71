/* cpu.c: the ISA registry and the choice of kernel table. The registry is
 * the architecture's ISAs (cpu_x86.c, cpu_arm.c) followed by scalar; on
 * first use (pthread_once) each ISA's check runs and its parts are composed
 * into a complete table (uk/compose.c), then the first supported ISA is the
 * table in use unless FMHA_ISA names another supported one. */
#include "cpu.h"
#include "tuning.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Architectures have at most this many ISAs besides scalar. */
enum { CPU_MAX_ISA = 16 };

static int cpu_always(void) { return 1; }

static fmha_isa cpu_registry[CPU_MAX_ISA + 1];
static fmha_ukernels cpu_tables[CPU_MAX_ISA + 1];
static int cpu_supported[CPU_MAX_ISA + 1];
/* 0 for an ISA that fmha_cpu_limit_isas left out (tests only) */
static int cpu_in_limit[CPU_MAX_ISA + 1];
static size_t cpu_n_isa;
static const fmha_ukernels *cpu_selected;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

/* Each table's tuning (a copy: FMHA_TUNING may change it) and its name. */
static fmha_tuning cpu_tunings[CPU_MAX_ISA + 1];
static char cpu_tuning_names[CPU_MAX_ISA + 1][48];

/* The tuning for ISA i on this CPU, FMHA_TUNING applied (an invalid text
 * changes nothing; fmha_plan_describe shows the tuning in use). */
static const fmha_tuning *cpu_tuning(size_t i, const char *isa) {
    const fmha_tuning *base = fmha_arch_tuning_for(isa);
    fmha_tuning *own = &cpu_tunings[i];
    *own = *base;
    const char *env = getenv("FMHA_TUNING");
    if (env && *env && fmha_tuning_parse(env, base, own, cpu_tuning_names[i], sizeof cpu_tuning_names[i]) == 0)
        own->name = cpu_tuning_names[i];
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

static void cpu_add(const char *name, int (*detect)(void), const fmha_isa_parts *parts, int by_name_only) {
    size_t i = cpu_n_isa++;
    cpu_supported[i] = detect() != 0;
    cpu_in_limit[i] = cpu_listed(name);
    fmha_ukernels_compose(parts, &cpu_tables[i]);
    /* a vector-length-agnostic ISA's lanes, read only where it runs */
    if (cpu_supported[i] && cpu_tables[i].tile.nr_at_run_time) cpu_tables[i].tile.nr = cpu_tables[i].tile.nr_at_run_time();
    cpu_tables[i].tuning = cpu_tuning(i, name);
    if (cpu_tables[i].tuning->block_kv) cpu_tables[i].tile.block_kv = (size_t)cpu_tables[i].tuning->block_kv;
    cpu_registry[i] = (fmha_isa){name, detect, &cpu_tables[i]};
    if (cpu_supported[i] && cpu_in_limit[i] && !by_name_only && !cpu_selected) cpu_selected = &cpu_tables[i];
}

/* The registry entry for a name that this CPU supports, or NULL (once the
 * checks have run; called inside cpu_init too, so it must not wait on
 * cpu_once). */
static const fmha_isa *cpu_supported_named(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < cpu_n_isa; i++)
        if (!strcmp(cpu_registry[i].name, name))
            return cpu_supported[i] && (cpu_in_limit[i] || !strcmp(name, "scalar")) ? &cpu_registry[i] : NULL;
    return NULL;
}

static void cpu_init(void) {
    size_t n = fmha_arch_isa_count();
    for (size_t i = 0; i < n && i < CPU_MAX_ISA; i++) {
        const fmha_arch_isa *a = fmha_arch_isa_at(i);
        cpu_add(a->name, a->detect, a->parts, a->by_name_only);
    }
    cpu_add("scalar", cpu_always, &fmha_isa_scalar, 0);
    /* An unknown or unsupported FMHA_ISA leaves the best supported table. */
    const fmha_isa *forced = cpu_supported_named(getenv("FMHA_ISA"));
    if (forced) cpu_selected = forced->table;
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
        if (isa == &cpu_registry[i]) return cpu_supported[i] && cpu_in_limit[i];
    return 0;
}

const fmha_ukernels *fmha_cpu_kernels(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_selected;
}

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
#endif
