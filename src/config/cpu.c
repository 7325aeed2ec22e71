/* cpu.c: the config layer: the ISA registry, each ISA's tuning and the
 * context a call runs with, resolved once (pthread_once) and immutable
 * after. The registry is one array of slots, the architecture's ISAs
 * (cpu_x86.c, cpu_arm.c) then scalar; each slot holds the ISA's check,
 * its parts composed into a complete table (uk/compose.c) with its tuning,
 * the table its float32 plans run on and the context of the two.
 *
 * A slot's tuning starts from every field's default (tuning.h) and takes,
 * as key=value text through the one check (fmha_tuning_apply), the first
 * of: FMHA_WISDOM's file's entry, the per-user wisdom file's (wisdom.c),
 * the architecture's compiled-in entry, the cache heuristic; then
 * FMHA_TUNING over it. The table decides the fields left at
 * FMHA_TUNING_OF_TABLE (its tile shape, its keys per tile). A tuning
 * whose tile shape is another of the shapes the table's tile part lists
 * (fmha_uk_tile.shapes) gets, as its float32 table, the table's parts with
 * that tile (less the bf16 and matrix parts, which are on the table's own
 * NR), composed with the same tuning. fmha_tune builds trial contexts the same way
 * (fmha_cpu_trial) and passes them to the planner; nothing here is per
 * thread. */
#include "config/cpu.h"
#include "config/wisdom.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha.h"

/* Architectures have at most this many ISAs besides scalar. */
enum { CPU_MAX_ISA = 16 };

static int cpu_always(void) { return 1; }

/* One ISA of the registry. */
typedef struct cpu_slot {
    fmha_isa isa;                /* name, check, &table */
    const fmha_isa_parts *parts;
    int by_name_only, supported;
    int in_limit;                /* 0 for an ISA that fmha_cpu_limit_isas left out (tests only) */
    fmha_tuning tuning;          /* resolved */
    char tuning_name[48];
    fmha_ukernels table;         /* parts composed with tuning */
    fmha_ukernels f32_table;     /* the float32 tile shape the tuning names, composed with it */
    fmha_context ctx;            /* {&table, &f32_table or &table} */
} cpu_slot;

static cpu_slot cpu_slots[CPU_MAX_ISA + 1];
static size_t cpu_n_isa;
static const fmha_context *cpu_selected;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

/* ---- tunings' sources ---- */

/* A wisdom file, read once. */
typedef struct wisdom_file {
    char path[512];
    int state; /* 0 read, 1 not found, -1 refused, 2 none named */
    char reason[256];
    fmha_wisdom w;
} wisdom_file;

static wisdom_file wisdom_env, wisdom_user; /* FMHA_WISDOM's, the per-user one */
static pthread_once_t wisdom_once = PTHREAD_ONCE_INIT;

static void wisdom_read_one(wisdom_file *f, const char *path) {
    if (!path || !*path || snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path) {
        f->state = 2;
        return;
    }
    f->state = fmha_wisdom_load(f->path, &f->w, f->reason, sizeof f->reason);
}

static void wisdom_read(void) {
    char user[512];
    wisdom_read_one(&wisdom_env, getenv("FMHA_WISDOM"));
    wisdom_read_one(&wisdom_user, fmha_wisdom_user_path(user, sizeof user) == 0 ? user : NULL);
}

/* The cache-size heuristic, for a CPU with no wisdom and no entry of its
 * own. Measured on a Xeon (GenuineIntel family 6 model 167: 48 KiB L1D,
 * 2 MiB L2; float32 forward, 8 heads, one thread): K read in place from
 * [B, S, H, D] (rows 2-4 KiB apart, a page each) cost 11% at S = 2048,
 * D = 128 (1 MiB of K a head) and 3% at S = 1024, D = 64 (256 KiB) against
 * a copy made once per call, and the copy cost 5% at S = 128 (32 KiB): so
 * K is copied past an eighth of L2. The decode driver's prefetch pays once
 * K and V outgrow what the cores' L2 and the L3 keep (measured 8 MiB on
 * Zen 4, 1 MiB of L2 a core): 8 L2. The rest stays generic. */
int fmha_tuning_heuristic(const fmha_cache_sizes *c, char *fields, size_t size) {
    if (size) fields[0] = '\0';
    if (c->l2 <= 0) return 0;
    snprintf(fields, size,
             "k_copy_bytes=%lld,decode_prefetch_bytes=%lld,decode_prefetch_f32_bytes=%lld,"
             "decode_prefetch_h16_bytes=%lld",
             (long long)(c->l2 / 8), (long long)(8 * c->l2), (long long)(8 * c->l2), (long long)(8 * c->l2));
    return 1;
}

/* The first source's text for `isa` on this CPU: *name and *source set. */
static const char *cpu_source_text(const char *isa, const char **name, fmha_tuning_source *source, char *buf,
                                   size_t size) {
    char vendor[16] = {0};
    unsigned family = 0, model = 0;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    pthread_once(&wisdom_once, wisdom_read);
    const fmha_wisdom_entry *e = fmha_wisdom_find(&wisdom_env.w, vendor, family, model, isa);
    if (!e) e = fmha_wisdom_find(&wisdom_user.w, vendor, family, model, isa);
    if (e) {
        *name = "wisdom", *source = FMHA_TUNING_WISDOM;
        return e->fields;
    }
    size_t n = 0;
    const fmha_arch_tuning *t = fmha_arch_tunings(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].isa, isa) && !strcmp(t[i].vendor, vendor) && t[i].family == family &&
            model >= t[i].model_lo && model <= t[i].model_hi) {
            *name = t[i].name, *source = FMHA_TUNING_BUILTIN;
            return t[i].fields;
        }
    fmha_cache_sizes c;
    fmha_arch_cache_sizes(&c);
    if (fmha_tuning_heuristic(&c, buf, size)) {
        *name = "heuristic", *source = FMHA_TUNING_HEURISTIC;
        return buf;
    }
    *name = "generic", *source = FMHA_TUNING_GENERIC;
    return "";
}

void fmha_tuning_lookup(const char *isa, fmha_tuning *out, char *name, size_t name_size) {
    char buf[256], err[160];
    const char *base_name;
    fmha_tuning_source source;
    const char *text = cpu_source_text(isa, &base_name, &source, buf, sizeof buf);
    *out = fmha_tuning_generic;
    if (fmha_tuning_apply(text, out, err, sizeof err)) { /* a compiled-in entry out of range: generic */
        base_name = "generic", source = FMHA_TUNING_GENERIC;
    }
    snprintf(name, name_size, "%s", base_name);
    out->name = name;
    out->source = source;
}

/* ---- composing ---- */

/* parts composed with tuning t (the table's own fields filled in) into *out. */
static void cpu_compose(const fmha_isa_parts *parts, int supported, fmha_tuning *t, fmha_ukernels *out) {
    fmha_ukernels_compose(parts, out);
    /* a vector-length-agnostic ISA's lanes, read only where it runs */
    if (supported && out->tile.nr_at_run_time) out->tile.nr = out->tile.nr_at_run_time();
    if (t->tile_mr == FMHA_TUNING_OF_TABLE) t->tile_mr = (int64_t)out->tile.mr;
    if (t->tile_nr == FMHA_TUNING_OF_TABLE) t->tile_nr = (int64_t)out->tile.nr;
    if (t->block_kv == FMHA_TUNING_OF_TABLE) t->block_kv = (int64_t)out->tile.block_kv;
    out->tuning = t;
    out->tile.block_kv = (size_t)t->block_kv;
}

static int cpu_usable(const cpu_slot *s) { return s->supported && s->in_limit; }

const fmha_uk_tile *fmha_cpu_f32_tile_at(const fmha_ukernels *table, size_t i) {
    if (i == 0) return &table->tile;
    const fmha_uk_tile *const *shapes = table->tile.shapes;
    for (size_t j = 0; shapes && shapes[j]; j++)
        if (j == i) return shapes[j];
    return NULL;
}

/* The tile part of `table`'s listed shapes (fmha_uk_tile.shapes) that
 * tuning t names, or NULL: the table's own tiles (its shape, or one it
 * lacks). */
static const fmha_uk_tile *cpu_shape_for(const fmha_ukernels *table, const fmha_tuning *t) {
    if (table->tile.mr == (size_t)t->tile_mr && table->tile.nr == (size_t)t->tile_nr) return NULL;
    const fmha_uk_tile *shape;
    for (size_t i = 1; (shape = fmha_cpu_f32_tile_at(table, i)) != NULL; i++)
        if (shape->mr == (size_t)t->tile_mr && shape->nr == (size_t)t->tile_nr) return shape;
    return NULL;
}

/* Slot s's float32 table under tuning t (resolved), its table composed
 * into *base: into *f32, returned, when t names another of the listed
 * shapes; else base. */
static const fmha_ukernels *cpu_f32_table(const cpu_slot *s, const fmha_ukernels *base, fmha_tuning *t,
                                          fmha_ukernels *f32) {
    const fmha_uk_tile *shape = cpu_shape_for(base, t);
    if (!shape) return base;
    fmha_isa_parts parts = *s->parts;
    parts.tile = shape, parts.bf16 = NULL, parts.matrix = NULL;
    cpu_compose(&parts, s->supported, t, f32);
    return f32;
}

/* A context for slot s under tuning *t (resolved here): table and float32 table into *base and *f32. */
static void cpu_context(const cpu_slot *s, fmha_tuning *t, fmha_ukernels *base, fmha_ukernels *f32,
                        fmha_context *ctx) {
    cpu_compose(s->parts, s->supported, t, base);
    *ctx = (fmha_context){base, cpu_f32_table(s, base, t, f32)};
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

/* Slot i's tuning before its table fills its own fields: the lookup,
 * then FMHA_TUNING over it (an invalid text changes nothing;
 * fmha_tuning_status shows the tuning in use). */
static void cpu_tuning(cpu_slot *s) {
    char base_name[sizeof s->tuning_name - sizeof "+FMHA_TUNING"], err[160];
    fmha_tuning_lookup(s->isa.name, &s->tuning, base_name, sizeof base_name);
    snprintf(s->tuning_name, sizeof s->tuning_name, "%s", base_name);
    const char *env = getenv("FMHA_TUNING");
    if (env && *env && fmha_tuning_apply(env, &s->tuning, err, sizeof err) == 0) {
        if (strcmp(env, "generic")) snprintf(s->tuning_name, sizeof s->tuning_name, "%s+FMHA_TUNING", base_name);
        else snprintf(s->tuning_name, sizeof s->tuning_name, "generic");
        s->tuning.source = FMHA_TUNING_ENV;
    }
    s->tuning.name = s->tuning_name;
}

static void cpu_add(const fmha_arch_isa *a) {
    cpu_slot *s = &cpu_slots[cpu_n_isa++];
    *s = (cpu_slot){.parts = a->parts, .by_name_only = a->by_name_only};
    s->isa = (fmha_isa){a->name, a->detect, &s->table};
    s->supported = a->detect() != 0;
    s->in_limit = cpu_listed(a->name);
    cpu_tuning(s);
}

/* The slot of a name that this CPU supports, or NULL (once the checks have
 * run; called inside cpu_init too, so it must not wait on cpu_once). */
static const cpu_slot *cpu_supported_named(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < cpu_n_isa; i++) {
        const cpu_slot *s = &cpu_slots[i];
        if (!strcmp(s->isa.name, name)) return cpu_usable(s) || (s->supported && !strcmp(name, "scalar")) ? s : NULL;
    }
    return NULL;
}

/* ---- fmha_tuning_status ---- */

static char tuning_status[2048];
static pthread_mutex_t tuning_status_lock = PTHREAD_MUTEX_INITIALIZER;

static void status_of_file(char *buf, size_t size, const char *what, const wisdom_file *f) {
    switch (f->state) {
    case 0: snprintf(buf, size, "%s %s: read, %zu entries", what, f->path, f->w.n_entries); break;
    case 1: snprintf(buf, size, "%s %s: not found", what, f->path); break;
    case 2: snprintf(buf, size, "%s: none", what); break;
    default: snprintf(buf, size, "%s %s: refused, nothing of it used: %s", what, f->path, f->reason); break;
    }
}

void fmha_tuning_set_status(const char *line) {
    pthread_once(&wisdom_once, wisdom_read);
    char env[900], user[700];
    status_of_file(env, sizeof env, "FMHA_WISDOM", &wisdom_env);
    status_of_file(user, sizeof user, "user wisdom", &wisdom_user);
    fmha_cache_sizes c;
    fmha_arch_cache_sizes(&c);
    pthread_mutex_lock(&tuning_status_lock);
    snprintf(tuning_status, sizeof tuning_status, "%s; %s; %s; caches L1d %lld KiB, L2 %lld KiB", line, env, user,
             (long long)(c.l1d >> 10), (long long)(c.l2 >> 10));
    pthread_mutex_unlock(&tuning_status_lock);
}

static void cpu_init(void) {
    size_t n = fmha_arch_isa_count();
    for (size_t i = 0; i < n && i < CPU_MAX_ISA; i++) {
        const fmha_arch_isa *a = fmha_arch_isa_at(i);
        if (a->parts) cpu_add(a); /* NULL: a table this build lacks (amx_emu outside the tests) */
    }
    static const fmha_arch_isa scalar = {"scalar", cpu_always, &fmha_isa_scalar, 0};
    cpu_add(&scalar);
    for (size_t i = 0; i < cpu_n_isa; i++) {
        cpu_slot *s = &cpu_slots[i];
        cpu_context(s, &s->tuning, &s->table, &s->f32_table, &s->ctx);
        if (cpu_usable(s) && !s->by_name_only && !cpu_selected) cpu_selected = &s->ctx;
    }
    /* a limit that leaves only by-name tables (FMHA_TEST_ISAS=amx_emu):
     * the specification until one is forced */
    if (!cpu_selected) cpu_selected = &cpu_slots[cpu_n_isa - 1].ctx;
    /* An unknown or unsupported FMHA_ISA leaves the best supported table. */
    const cpu_slot *forced = cpu_supported_named(getenv("FMHA_ISA"));
    if (forced) cpu_selected = &forced->ctx;
    char line[256];
    snprintf(line, sizeof line, "%s: tuning %s (source %s), float32 tile %zux%zu", cpu_selected->uk->isa,
             cpu_selected->uk->tuning->name, fmha_tuning_source_name(cpu_selected->uk->tuning->source),
             cpu_selected->f32->tile.mr, cpu_selected->f32->tile.nr);
    fmha_tuning_set_status(line);
}

const char *fmha_tuning_status(void) {
    pthread_once(&cpu_once, cpu_init); /* the registry's first use sets it */
    return tuning_status;
}

/* ---- the registry and contexts ---- */

size_t fmha_isa_count(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_n_isa;
}

const fmha_isa *fmha_isa_at(size_t i) {
    pthread_once(&cpu_once, cpu_init);
    return i < cpu_n_isa ? &cpu_slots[i].isa : NULL;
}

int fmha_isa_supported(const fmha_isa *isa) {
    pthread_once(&cpu_once, cpu_init);
    for (size_t i = 0; i < cpu_n_isa; i++)
        if (isa == &cpu_slots[i].isa) return cpu_usable(&cpu_slots[i]);
    return 0;
}

const fmha_context *fmha_context_default(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_selected;
}

const fmha_ukernels *fmha_cpu_kernels(void) { return fmha_context_default()->uk; }

int fmha_cpu_trial(const char *isa, const fmha_tuning *t, fmha_trial *out) {
    pthread_once(&cpu_once, cpu_init);
    const cpu_slot *s = cpu_supported_named(isa);
    if (!s) return -1;
    out->tuning = *t;
    cpu_context(s, &out->tuning, &out->base, &out->f32, &out->ctx);
    return 0;
}

void fmha_cpu_force_context(const fmha_context *ctx) {
    pthread_once(&cpu_once, cpu_init);
    cpu_selected = ctx;
}

const fmha_ukernels *fmha_cpu_kernels_for(const char *isa) {
    pthread_once(&cpu_once, cpu_init);
    const cpu_slot *s = cpu_supported_named(isa);
    return s ? &s->table : NULL;
}

const fmha_context *fmha_cpu_context_for(const char *isa) {
    pthread_once(&cpu_once, cpu_init);
    const cpu_slot *s = cpu_supported_named(isa);
    return s ? &s->ctx : NULL;
}

int fmha_cpu_force_isa(const char *isa) {
    pthread_once(&cpu_once, cpu_init);
    const cpu_slot *s = cpu_supported_named(isa);
    if (!s) return -1;
    cpu_selected = &s->ctx;
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
const fmha_arch_tuning *fmha_arch_tunings(size_t *n) {
    *n = 0;
    return NULL;
}
void fmha_arch_cache_sizes(fmha_cache_sizes *c) { c->l1d = c->l2 = 0; }
#endif
