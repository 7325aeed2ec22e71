/* wisdom.c: reading wisdom files (wisdom.h): the format's rules on top of
 * the JSON reader (runtime/json.h), at most WISDOM_MAX_DEPTH deep and
 * FMHA_WISDOM_MAX_BYTES long; the schema is checked entry by entry and the
 * first problem ends the read with its reason and the place it was found. */
#include "config/wisdom.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/json.h"

enum { WISDOM_MAX_DEPTH = 16 };

static int fail(char *err, size_t size, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    vsnprintf(err, size, format, ap);
    va_end(ap);
    return -1;
}

/* Every key of an object once. */
static int keys_unique(const fmha_json *r, int object, char *err, size_t err_size, const char *where) {
    char a[64];
    const int k = fmha_json_repeated_key(r, object);
    if (k < 0) return 0;
    fmha_json_string(r, k, a, sizeof a);
    return fail(err, err_size, "%s: the key \"%s\" appears twice", where, a);
}

/* A string member of an entry into buf. */
static int entry_string(const fmha_json *r, int entry, const char *key, char *buf, size_t size, char *err,
                        size_t err_size, const char *where) {
    int repeated = 0;
    const int v = fmha_json_member(r, entry, key, &repeated);
    if (v < 0 || r->nodes[v].type != FMHA_JSON_STRING || fmha_json_string(r, v, buf, size) <= 0)
        return fail(err, err_size, "%s: \"%s\" must be a string of 1 to %zu characters", where, key, size - 1);
    return 0;
}

static int entry_integer(const fmha_json *r, int entry, const char *key, int64_t *out, char *err, size_t err_size,
                         const char *where) {
    int repeated = 0;
    const int v = fmha_json_member(r, entry, key, &repeated);
    if (v < 0 || fmha_json_integer(r, v, out) || *out < 0 || *out > 1000000)
        return fail(err, err_size, "%s: \"%s\" must be an integer in 0..1000000", where, key);
    return 0;
}

/* One entry of "entries" into e. */
static int read_entry(const fmha_json *r, int node, fmha_wisdom_entry *e, char *err, size_t err_size,
                      const char *where) {
    if (r->nodes[node].type != FMHA_JSON_OBJECT) return fail(err, err_size, "%s: an entry must be an object", where);
    if (keys_unique(r, node, err, err_size, where)) return -1;
    if (entry_string(r, node, "vendor", e->vendor, sizeof e->vendor, err, err_size, where) ||
        entry_string(r, node, "isa", e->isa, sizeof e->isa, err, err_size, where) ||
        entry_integer(r, node, "family", &e->family, err, err_size, where) ||
        entry_integer(r, node, "model", &e->model, err, err_size, where))
        return -1;
    int repeated = 0;
    const int fields = fmha_json_member(r, node, "fields", &repeated);
    if (fields < 0 || r->nodes[fields].type != FMHA_JSON_OBJECT)
        return fail(err, err_size, "%s: \"fields\" must be an object", where);
    if (keys_unique(r, fields, err, err_size, where)) return -1;
    /* the fields as key=value text, checked by the one check of every source */
    size_t at = 0;
    char key[64];
    e->fields[0] = '\0';
    for (int k = r->nodes[fields].child; k >= 0; k = fmha_json_next_key(r, k)) {
        const int len = fmha_json_string(r, k, key, sizeof key);
        const fmha_tuning_field *f = len > 0 ? fmha_tuning_field_named(key, (size_t)len) : NULL;
        int64_t v;
        if (!f) return fail(err, err_size, "%s: \"fields\": the unknown key \"%.40s\"", where, len > 0 ? key : "?");
        if (fmha_json_integer(r, r->nodes[k].next, &v))
            return fail(err, err_size, "%s: %s must be an integer in %lld..%lld, a multiple of %lld", where, f->key,
                        (long long)f->lo, (long long)f->hi, (long long)f->multiple);
        const int n = snprintf(e->fields + at, sizeof e->fields - at, "%s%s=%lld", at ? "," : "", key, (long long)v);
        if (n < 0 || (size_t)n >= sizeof e->fields - at) return fail(err, err_size, "%s: \"fields\" is too long", where);
        at += (size_t)n;
    }
    char why[160];
    e->tuning = fmha_tuning_generic;
    if (fmha_tuning_apply(e->fields, &e->tuning, why, sizeof why))
        return fail(err, err_size, "%s: %s", where, why);
    e->tuning.name = "wisdom";
    e->tuning.source = FMHA_TUNING_WISDOM;
    e->text_at = r->nodes[node].at;
    e->text_len = r->nodes[node].len;
    return 0;
}

int fmha_wisdom_parse(const char *text, size_t len, fmha_wisdom *w, char *err, size_t err_size) {
    *w = (fmha_wisdom){0};
    const fmha_json_limits limits = {FMHA_WISDOM_MAX_BYTES, WISDOM_MAX_DEPTH, 0};
    fmha_json r;
    if (fmha_json_read(text, len, &limits, &r, err, err_size)) return -1;
    int rc = -1;
    const int root = 0;
    if (r.nodes[root].type != FMHA_JSON_OBJECT) {
        fail(err, err_size, "the file must hold one object");
        goto done;
    }
    if (keys_unique(&r, root, err, err_size, "the file")) goto done;
    int repeated = 0;
    int64_t version;
    const int v = fmha_json_member(&r, root, "fmha_wisdom", &repeated);
    if (v < 0 || fmha_json_integer(&r, v, &version) || version != FMHA_WISDOM_VERSION) {
        fail(err, err_size, "\"fmha_wisdom\" must be %d (a wisdom file of this library)", FMHA_WISDOM_VERSION);
        goto done;
    }
    const int list = fmha_json_member(&r, root, "entries", &repeated);
    if (list < 0 || r.nodes[list].type != FMHA_JSON_ARRAY) {
        fail(err, err_size, "\"entries\" must be an array");
        goto done;
    }
    size_t n = 0;
    for (int k = r.nodes[list].child; k >= 0; k = r.nodes[k].next) n++;
    fmha_wisdom_entry *entries = calloc(n ? n : 1, sizeof *entries);
    char *copy = malloc(len + 1);
    if (!entries || !copy) {
        free(entries), free(copy);
        fail(err, err_size, "out of memory");
        goto done;
    }
    size_t i = 0;
    for (int k = r.nodes[list].child; k >= 0; k = r.nodes[k].next, i++) {
        char where[32];
        snprintf(where, sizeof where, "entries[%zu]", i);
        fmha_wisdom_entry *e = &entries[i];
        if (read_entry(&r, k, e, err, err_size, where)) break;
        size_t j = 0;
        while (j < i && (strcmp(entries[j].vendor, e->vendor) || entries[j].family != e->family ||
                         entries[j].model != e->model || strcmp(entries[j].isa, e->isa)))
            j++;
        if (j < i) {
            fail(err, err_size, "%s repeats the CPU and ISA of entries[%zu]", where, j);
            break;
        }
    }
    if (i < n) {
        free(entries), free(copy);
        goto done;
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    *w = (fmha_wisdom){copy, n, entries};
    rc = 0;
done:
    fmha_json_free(&r);
    return rc;
}

int fmha_wisdom_load(const char *path, fmha_wisdom *w, char *err, size_t err_size) {
    *w = (fmha_wisdom){0};
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) {
            fail(err, err_size, "not found");
            return 1;
        }
        return fail(err, err_size, "cannot be read (%s)", strerror(errno));
    }
    char *text = malloc(FMHA_WISDOM_MAX_BYTES + 1);
    size_t len = text ? fread(text, 1, FMHA_WISDOM_MAX_BYTES + 1, f) : 0;
    const int bad = !text || ferror(f);
    fclose(f);
    int rc;
    if (bad) rc = fail(err, err_size, "cannot be read");
    else if (len > FMHA_WISDOM_MAX_BYTES) rc = fail(err, err_size, "is larger than %d bytes", FMHA_WISDOM_MAX_BYTES);
    else rc = fmha_wisdom_parse(text, len, w, err, err_size);
    free(text);
    return rc;
}

void fmha_wisdom_free(fmha_wisdom *w) {
    free(w->text);
    free(w->entries);
    *w = (fmha_wisdom){0};
}

const fmha_wisdom_entry *fmha_wisdom_find(const fmha_wisdom *w, const char *vendor, int64_t family, int64_t model,
                                          const char *isa) {
    for (size_t i = 0; i < w->n_entries; i++) {
        const fmha_wisdom_entry *e = &w->entries[i];
        if (!strcmp(e->vendor, vendor) && e->family == family && e->model == model && !strcmp(e->isa, isa)) return e;
    }
    return NULL;
}

int fmha_wisdom_user_path(char *buf, size_t size) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/') n = snprintf(buf, size, "%s/fmha/wisdom.json", xdg);
    else if (home && home[0]) n = snprintf(buf, size, "%s/.cache/fmha/wisdom.json", home);
    else return -1;
    return n > 0 && (size_t)n < size ? 0 : -1;
}
