/* wisdom.c: reading wisdom files (wisdom.h). A small JSON reader of its
 * own (RFC 8259: objects, arrays, strings with escapes, numbers, literals;
 * nesting at most WISDOM_MAX_DEPTH deep) turns the text into a flat list of
 * nodes, then the schema is checked entry by entry; the first problem ends
 * the read with its reason and the place it was found. */
#include "config/wisdom.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WISDOM_MAX_DEPTH = 16 };

typedef enum { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT } json_type;

/* A value: its bytes text[at, at + len) (a string's between its quotes,
 * a container's brackets included);
 * an array's or object's first child and each node's next sibling (-1:
 * none). An object's children alternate key (a string) and value. */
typedef struct json_node {
    json_type type;
    size_t at, len;
    int child, next;
} json_node;

typedef struct json_reader {
    const char *s;
    size_t n, i;
    json_node *nodes;
    int count, cap;
    char *err;
    size_t err_size;
} json_reader;

static int fail(char *err, size_t size, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    vsnprintf(err, size, format, ap);
    va_end(ap);
    return -1;
}

static void skip_space(json_reader *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

static int new_node(json_reader *r, json_type type, size_t at) {
    if (r->count == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        json_node *grown = realloc(r->nodes, (size_t)cap * sizeof *grown);
        if (!grown) return fail(r->err, r->err_size, "out of memory");
        r->nodes = grown;
        r->cap = cap;
    }
    r->nodes[r->count] = (json_node){type, at, 0, -1, -1};
    return r->count++;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A string from its opening quote; the node spans its contents. */
static int read_string(json_reader *r) {
    const size_t open = r->i++;
    while (r->i < r->n && r->s[r->i] != '"') {
        const unsigned char c = (unsigned char)r->s[r->i];
        if (c < 0x20) return fail(r->err, r->err_size, "byte %zu: a control character inside a string", r->i);
        if (c == '\\') {
            if (r->i + 1 >= r->n) break;
            const char e = r->s[r->i + 1];
            if (e == 'u') {
                for (int k = 2; k < 6; k++)
                    if (r->i + (size_t)k >= r->n || !is_hex(r->s[r->i + (size_t)k]))
                        return fail(r->err, r->err_size, "byte %zu: a bad \\u escape", r->i);
                r->i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e)) return fail(r->err, r->err_size, "byte %zu: a bad escape", r->i);
            r->i += 2;
            continue;
        }
        r->i++;
    }
    if (r->i >= r->n) return fail(r->err, r->err_size, "byte %zu: a string without its closing quote", open);
    const int node = new_node(r, J_STRING, open + 1);
    if (node < 0) return -1;
    r->nodes[node].len = r->i - open - 1;
    r->i++;
    return node;
}

static int read_number(json_reader *r) {
    const size_t at = r->i;
    const char *s = r->s;
    size_t i = r->i;
    if (i < r->n && s[i] == '-') i++;
    if (i < r->n && s[i] == '0') i++;
    else if (i < r->n && s[i] >= '1' && s[i] <= '9')
        while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
    else
        return fail(r->err, r->err_size, "byte %zu: not a value", at);
    if (i < r->n && s[i] == '.') {
        if (++i >= r->n || s[i] < '0' || s[i] > '9') return fail(r->err, r->err_size, "byte %zu: a bad number", at);
        while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < r->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < r->n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= r->n || s[i] < '0' || s[i] > '9') return fail(r->err, r->err_size, "byte %zu: a bad number", at);
        while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
    }
    const int node = new_node(r, J_NUMBER, at);
    if (node < 0) return -1;
    r->nodes[node].len = i - at;
    r->i = i;
    return node;
}

static int read_value(json_reader *r, int depth);

/* An array or object from its opening bracket; children linked in order. */
static int read_container(json_reader *r, int depth) {
    const int object = r->s[r->i] == '{';
    const char close = object ? '}' : ']';
    if (depth >= WISDOM_MAX_DEPTH) return fail(r->err, r->err_size, "byte %zu: nested too deep", r->i);
    const int node = new_node(r, object ? J_OBJECT : J_ARRAY, r->i);
    if (node < 0) return -1;
    r->i++;
    int last = -1;
    skip_space(r);
    if (r->i < r->n && r->s[r->i] == close) {
        r->nodes[node].len = ++r->i - r->nodes[node].at;
        return node;
    }
    for (;;) {
        skip_space(r);
        int key = -1;
        if (object) {
            if (r->i >= r->n || r->s[r->i] != '"')
                return fail(r->err, r->err_size, "byte %zu: an object key must be a string", r->i);
            if ((key = read_string(r)) < 0) return -1;
            skip_space(r);
            if (r->i >= r->n || r->s[r->i] != ':') return fail(r->err, r->err_size, "byte %zu: expected ':'", r->i);
            r->i++;
        }
        const int value = read_value(r, depth + 1);
        if (value < 0) return -1;
        const int first = key >= 0 ? key : value;
        if (key >= 0) r->nodes[key].next = value;
        if (last < 0) r->nodes[node].child = first;
        else r->nodes[last].next = first;
        last = value;
        skip_space(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            r->i++;
            continue;
        }
        if (r->i < r->n && r->s[r->i] == close) {
            r->nodes[node].len = ++r->i - r->nodes[node].at;
            return node;
        }
        return fail(r->err, r->err_size, "byte %zu: expected ',' or '%c'", r->i, close);
    }
}

static int read_value(json_reader *r, int depth) {
    skip_space(r);
    if (r->i >= r->n) return fail(r->err, r->err_size, "byte %zu: the text ends where a value should be", r->i);
    const char c = r->s[r->i];
    if (c == '{' || c == '[') return read_container(r, depth);
    if (c == '"') return read_string(r);
    static const char *const literals[] = {"null", "true", "false"};
    for (int k = 0; k < 3; k++) {
        const size_t len = strlen(literals[k]);
        if (r->n - r->i >= len && !memcmp(r->s + r->i, literals[k], len)) {
            const int node = new_node(r, k ? J_BOOL : J_NULL, r->i);
            if (node < 0) return -1;
            r->nodes[node].len = len;
            r->i += len;
            return node;
        }
    }
    return read_number(r);
}

/* A string node's text, unescaped into buf (\u escapes past ASCII as '?').
 * Returns its length, or -1 when it does not fit. */
static int string_of(const char *text, const json_node *n, char *buf, size_t size) {
    size_t o = 0;
    for (size_t i = n->at; i < n->at + n->len; i++) {
        char c = text[i];
        if (c == '\\') {
            const char e = text[++i];
            if (e == 'u') {
                const unsigned v = (unsigned)strtoul((char[5]){text[i + 1], text[i + 2], text[i + 3], text[i + 4], 0},
                                                     NULL, 16);
                c = v < 0x80 ? (char)v : '?';
                i += 4;
            } else {
                c = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
            }
        }
        if (o + 1 >= size) return -1;
        buf[o++] = c;
    }
    buf[o] = '\0';
    return (int)o;
}

/* A number node that is an integer (no fraction or exponent, at most 18
 * digits) into *v; -1 otherwise. */
static int integer_of(const char *text, const json_node *n, int64_t *v) {
    if (n->type != J_NUMBER) return -1;
    size_t i = n->at, end = n->at + n->len;
    const int negative = text[i] == '-';
    i += negative;
    if (end - i > 18) return -1;
    int64_t x = 0;
    for (; i < end; i++) {
        if (text[i] < '0' || text[i] > '9') return -1;
        x = x * 10 + (text[i] - '0');
    }
    *v = negative ? -x : x;
    return 0;
}

/* The value of `key` in an object node, or -1; 1 in *repeated when a key
 * appears twice. */
static int member(const json_reader *r, int object, const char *key, int *repeated) {
    int found = -1;
    char name[64];
    for (int k = r->nodes[object].child; k >= 0; k = r->nodes[r->nodes[k].next].next) {
        if (string_of(r->s, &r->nodes[k], name, sizeof name) < 0 || strcmp(name, key)) continue;
        if (found >= 0) *repeated = 1;
        found = r->nodes[k].next;
    }
    return found;
}

/* Every key of an object once. */
static int keys_unique(const json_reader *r, int object, char *err, size_t err_size, const char *where) {
    char a[64], b[64];
    for (int k = r->nodes[object].child; k >= 0; k = r->nodes[r->nodes[k].next].next)
        for (int j = r->nodes[r->nodes[k].next].next; j >= 0; j = r->nodes[r->nodes[j].next].next)
            if (r->nodes[k].len == r->nodes[j].len &&
                !memcmp(r->s + r->nodes[k].at, r->s + r->nodes[j].at, r->nodes[k].len)) {
                string_of(r->s, &r->nodes[k], a, sizeof a);
                string_of(r->s, &r->nodes[j], b, sizeof b);
                return fail(err, err_size, "%s: the key \"%s\" appears twice", where, a);
            }
    return 0;
}

/* A string member of an entry into buf. */
static int entry_string(const json_reader *r, int entry, const char *key, char *buf, size_t size, char *err,
                        size_t err_size, const char *where) {
    int repeated = 0;
    const int v = member(r, entry, key, &repeated);
    if (v < 0 || r->nodes[v].type != J_STRING || string_of(r->s, &r->nodes[v], buf, size) <= 0)
        return fail(err, err_size, "%s: \"%s\" must be a string of 1 to %zu characters", where, key, size - 1);
    return 0;
}

static int entry_integer(const json_reader *r, int entry, const char *key, int64_t *out, char *err, size_t err_size,
                         const char *where) {
    int repeated = 0;
    const int v = member(r, entry, key, &repeated);
    if (v < 0 || integer_of(r->s, &r->nodes[v], out) || *out < 0 || *out > 1000000)
        return fail(err, err_size, "%s: \"%s\" must be an integer in 0..1000000", where, key);
    return 0;
}

/* One entry of "entries" into e. */
static int read_entry(const json_reader *r, int node, fmha_wisdom_entry *e, char *err, size_t err_size,
                      const char *where) {
    if (r->nodes[node].type != J_OBJECT) return fail(err, err_size, "%s: an entry must be an object", where);
    if (keys_unique(r, node, err, err_size, where)) return -1;
    if (entry_string(r, node, "vendor", e->vendor, sizeof e->vendor, err, err_size, where) ||
        entry_string(r, node, "isa", e->isa, sizeof e->isa, err, err_size, where) ||
        entry_integer(r, node, "family", &e->family, err, err_size, where) ||
        entry_integer(r, node, "model", &e->model, err, err_size, where))
        return -1;
    int repeated = 0;
    const int fields = member(r, node, "fields", &repeated);
    if (fields < 0 || r->nodes[fields].type != J_OBJECT)
        return fail(err, err_size, "%s: \"fields\" must be an object", where);
    if (keys_unique(r, fields, err, err_size, where)) return -1;
    /* the fields as key=value text, checked by the one check of every source */
    size_t at = 0;
    char key[64];
    e->fields[0] = '\0';
    for (int k = r->nodes[fields].child; k >= 0; k = r->nodes[r->nodes[k].next].next) {
        const int len = string_of(r->s, &r->nodes[k], key, sizeof key);
        const fmha_tuning_field *f = len > 0 ? fmha_tuning_field_named(key, (size_t)len) : NULL;
        int64_t v;
        if (!f) return fail(err, err_size, "%s: \"fields\": the unknown key \"%.40s\"", where, len > 0 ? key : "?");
        if (integer_of(r->s, &r->nodes[r->nodes[k].next], &v))
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
    json_reader r = {text, len, 0, NULL, 0, 0, err, err_size};
    int rc = -1;
    const int root = read_value(&r, 0);
    if (root < 0) goto done;
    skip_space(&r);
    if (r.i != len) {
        fail(err, err_size, "byte %zu: text after the value", r.i);
        goto done;
    }
    if (r.nodes[root].type != J_OBJECT) {
        fail(err, err_size, "the file must hold one object");
        goto done;
    }
    if (keys_unique(&r, root, err, err_size, "the file")) goto done;
    int repeated = 0;
    int64_t version;
    const int v = member(&r, root, "fmha_wisdom", &repeated);
    if (v < 0 || integer_of(text, &r.nodes[v], &version) || version != FMHA_WISDOM_VERSION) {
        fail(err, err_size, "\"fmha_wisdom\" must be %d (a wisdom file of this library)", FMHA_WISDOM_VERSION);
        goto done;
    }
    const int list = member(&r, root, "entries", &repeated);
    if (list < 0 || r.nodes[list].type != J_ARRAY) {
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
    free(r.nodes);
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
