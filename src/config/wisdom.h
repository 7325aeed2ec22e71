/* wisdom.h: wisdom files, the tunings fmha_tune measured on a CPU, kept as
 * JSON so that later processes start from them (tuning.h's lookup order).
 * A file is read whole and checked whole: a file that is not what this
 * library writes (bad JSON, a missing key, an unknown field, a value out of
 * range, two entries for one CPU and ISA) is refused with a reason and
 * nothing of it is used. The library prints nothing: the reason goes to
 * fmha_tuning_status(). Internal. */
#ifndef FMHA_WISDOM_H
#define FMHA_WISDOM_H

#include <stddef.h>
#include <stdint.h>

#include "config/tuning.h"

/* The format this library reads and writes:
 *   {"fmha_wisdom": 1,
 *    "entries": [{"vendor": "GenuineIntel", "family": 6, "model": 167,
 *                 "isa": "amx", "fields": {"block_kv": 128, ...}, ...}, ...]}
 * Each entry is keyed by cpuid's vendor string, family and model (as
 * fmha_arch_cpu_id reports them) and the ISA (a registry name); "fields"
 * holds tuning fields (fmha_tuning_fields' keys, integers in range), the
 * others keep the generic values. Other keys (the rows measured, the CPU's
 * name) are kept by fmha_tune and ignored here. */
enum { FMHA_WISDOM_VERSION = 1, FMHA_WISDOM_MAX_BYTES = 4 << 20 };

typedef struct fmha_wisdom_entry {
    char vendor[16], isa[32];
    int64_t family, model;
    char fields[512];           /* its "fields" as key=value text (tuning.h) */
    fmha_tuning tuning;         /* generic with those fields */
    size_t text_at, text_len;   /* the entry's JSON in the file's text */
} fmha_wisdom_entry;

typedef struct fmha_wisdom {
    char *text;                 /* the file's bytes (NUL-terminated) */
    size_t n_entries;
    fmha_wisdom_entry *entries;
} fmha_wisdom;

/* Checks text[0..len) and fills w (its own copy of the text). Returns 0,
 * or -1 with the reason in err (w left empty). */
int fmha_wisdom_parse(const char *text, size_t len, fmha_wisdom *w, char *err, size_t err_size);

/* Reads and checks a file. Returns 0 (read), 1 (no such file: w empty,
 * err "not found") or -1 (refused or unreadable: w empty, err the reason). */
int fmha_wisdom_load(const char *path, fmha_wisdom *w, char *err, size_t err_size);

void fmha_wisdom_free(fmha_wisdom *w);

/* The entry for this CPU and ISA, or NULL. */
const fmha_wisdom_entry *fmha_wisdom_find(const fmha_wisdom *w, const char *vendor, int64_t family, int64_t model,
                                          const char *isa);

/* The per-user wisdom file: $XDG_CACHE_HOME/fmha/wisdom.json, else
 * $HOME/.cache/fmha/wisdom.json. Returns 0, or -1 when neither variable
 * is set (or the path does not fit). */
int fmha_wisdom_user_path(char *buf, size_t size);

#endif /* FMHA_WISDOM_H */
