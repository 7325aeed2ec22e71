/* json.c: the JSON reader (json.h). One pass turns the text into nodes that
 * point back into it; strings are unescaped and numbers converted only when
 * a user asks (fmha_json_string, fmha_json_integer). Plain C and libc only,
 * so that fmha-bench can compile this file in beside the library. */
#include "runtime/json.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct json_reader {
    const char *s;
    size_t n, i;
    fmha_json_limits limits;
    fmha_json_node *nodes;
    int count, cap;
    char *err;
    size_t err_size;
} json_reader;

static int fail(json_reader *r, const char *format, ...) __attribute__((format(printf, 2, 3)));
static int fail(json_reader *r, const char *format, ...) {
    if (r->err && r->err_size) {
        va_list ap;
        va_start(ap, format);
        vsnprintf(r->err, r->err_size, format, ap);
        va_end(ap);
    }
    return -1;
}

static void skip_space(json_reader *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

/* A node of len bytes at `at`. The text holds at most INT_MAX - 1 bytes and
 * every node starts at a byte of its own, so the count fits an int. */
static int new_node(json_reader *r, fmha_json_type type, size_t at, size_t len) {
    if (r->count == r->cap) {
        const size_t cap = r->cap ? 2 * (size_t)r->cap : 64;
        const int capped = cap < (size_t)INT_MAX ? (int)cap : INT_MAX;
        fmha_json_node *grown = realloc(r->nodes, (size_t)capped * sizeof *grown);
        if (!grown) return fail(r, "out of memory");
        r->nodes = grown;
        r->cap = capped;
    }
    r->nodes[r->count] = (fmha_json_node){type, at, len, -1, -1};
    return r->count++;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A string from its opening quote; the node spans its contents. */
static int read_string(json_reader *r) {
    const size_t open = r->i++;
    while (r->i < r->n && r->s[r->i] != '"') {
        const unsigned char c = (unsigned char)r->s[r->i];
        if (c < 0x20) return fail(r, "byte %zu: a control character inside a string", r->i);
        if (c == '\\') {
            if (r->i + 1 >= r->n) return fail(r, "byte %zu: a string without its closing quote", open);
            const char e = r->s[r->i + 1];
            if (e == 'u') {
                for (int k = 2; k < 6; k++)
                    if (r->i + (size_t)k >= r->n || !is_hex(r->s[r->i + (size_t)k]))
                        return fail(r, "byte %zu: a bad \\u escape", r->i);
                r->i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e)) return fail(r, "byte %zu: a bad escape", r->i);
            r->i += 2;
            continue;
        }
        r->i++;
    }
    if (r->i >= r->n) return fail(r, "byte %zu: a string without its closing quote", open);
    const int node = new_node(r, FMHA_JSON_STRING, open + 1, r->i - open - 1);
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
        return fail(r, "byte %zu: not a value", at);
    if (i < r->n && s[i] == '.') {
        if (++i >= r->n || s[i] < '0' || s[i] > '9') return fail(r, "byte %zu: a bad number", at);
        while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < r->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < r->n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= r->n || s[i] < '0' || s[i] > '9') return fail(r, "byte %zu: a bad number", at);
        while (i < r->n && s[i] >= '0' && s[i] <= '9') i++;
    }
    r->i = i;
    return new_node(r, FMHA_JSON_NUMBER, at, i - at);
}

static int read_value(json_reader *r, int depth);

/* An array or object from its opening bracket; children linked in order. */
static int read_container(json_reader *r, int depth) {
    const int object = r->s[r->i] == '{';
    const char close = object ? '}' : ']';
    if (depth >= r->limits.max_depth) return fail(r, "byte %zu: nested too deep", r->i);
    const int node = new_node(r, object ? FMHA_JSON_OBJECT : FMHA_JSON_ARRAY, r->i, 0);
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
            if (r->i >= r->n || r->s[r->i] != '"') return fail(r, "byte %zu: an object key must be a string", r->i);
            if ((key = read_string(r)) < 0) return -1;
            skip_space(r);
            if (r->i >= r->n || r->s[r->i] != ':') return fail(r, "byte %zu: expected ':'", r->i);
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
        return fail(r, "byte %zu: expected ',' or '%c'", r->i, close);
    }
}

static int read_value(json_reader *r, int depth) {
    skip_space(r);
    if (r->i >= r->n) return fail(r, "byte %zu: the text ends where a value should be", r->i);
    const char c = r->s[r->i];
    if (c == '{' || c == '[') return read_container(r, depth);
    if (c == '"') return read_string(r);
    static const struct {
        const char *word;
        fmha_json_type type;
        int nonfinite;
    } literals[] = {{"null", FMHA_JSON_NULL, 0},       {"true", FMHA_JSON_BOOL, 0},
                    {"false", FMHA_JSON_BOOL, 0},      {"NaN", FMHA_JSON_NUMBER, 1},
                    {"Infinity", FMHA_JSON_NUMBER, 1}, {"-Infinity", FMHA_JSON_NUMBER, 1}};
    for (size_t k = 0; k < sizeof literals / sizeof literals[0]; k++) {
        const size_t len = strlen(literals[k].word);
        if ((!literals[k].nonfinite || r->limits.nonfinite) && r->n - r->i >= len &&
            !memcmp(r->s + r->i, literals[k].word, len)) {
            r->i += len;
            return new_node(r, literals[k].type, r->i - len, len);
        }
    }
    return read_number(r);
}

int fmha_json_read(const char *text, size_t len, const fmha_json_limits *limits, fmha_json *doc, char *err,
                   size_t err_size) {
    *doc = (fmha_json){0};
    json_reader r = {text, len, 0, *limits, NULL, 0, 0, err, err_size};
    if (len > limits->max_bytes || len >= (size_t)INT_MAX) {
        fail(&r, "the text is larger than %zu bytes", limits->max_bytes);
    } else if (read_value(&r, 0) >= 0) {
        skip_space(&r);
        if (r.i == len) {
            *doc = (fmha_json){text, r.nodes, r.count};
            return 0;
        }
        fail(&r, "byte %zu: text after the value", r.i);
    }
    free(r.nodes);
    return -1;
}

void fmha_json_free(fmha_json *doc) {
    free(doc->nodes);
    *doc = (fmha_json){0};
}

static unsigned hex4(const char *s) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) v = v << 4 | (unsigned)(s[k] <= '9' ? s[k] - '0' : (s[k] | 0x20) - 'a' + 10);
    return v;
}

/* The code point of the \u escape at text[*i] (its backslash), a surrogate
 * pair taken whole, a lone surrogate as U+FFFD; *i moves to its last byte. */
static unsigned code_point(const char *text, size_t end, size_t *i) {
    unsigned cp = hex4(text + *i + 2);
    *i += 5;
    if (cp >= 0xD800 && cp < 0xDC00 && end - *i > 6 && text[*i + 1] == '\\' && text[*i + 2] == 'u') {
        const unsigned low = hex4(text + *i + 3);
        if (low >= 0xDC00 && low < 0xE000) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            *i += 6;
        }
    }
    return cp >= 0xD800 && cp < 0xE000 ? 0xFFFD : cp;
}

/* cp as UTF-8 into out; its length. */
static size_t utf8(unsigned cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    const size_t m = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (size_t k = m - 1; k > 0; k--, cp >>= 6) out[k] = (char)(0x80 | (cp & 0x3F));
    out[0] = (char)(((0xF00u >> m) | cp) & 0xFF);
    return m;
}

int fmha_json_string(const fmha_json *doc, int node, char *buf, size_t size) {
    const fmha_json_node *n = &doc->nodes[node];
    const char *text = doc->text;
    size_t o = 0;
    for (size_t i = n->at, end = n->at + n->len; i < end; i++) {
        char out[4] = {text[i]};
        size_t m = 1;
        if (text[i] == '\\' && text[i + 1] == 'u') {
            m = utf8(code_point(text, end, &i), out);
        } else if (text[i] == '\\') {
            const char e = text[++i];
            out[0] = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
        }
        if (o + m >= size) {
            buf[o] = '\0';
            return -1;
        }
        memcpy(buf + o, out, m);
        o += m;
    }
    buf[o] = '\0';
    return (int)o;
}

int fmha_json_integer(const fmha_json *doc, int node, int64_t *v) {
    const fmha_json_node *n = &doc->nodes[node];
    const char *text = doc->text;
    if (n->type != FMHA_JSON_NUMBER) return -1;
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

int fmha_json_member(const fmha_json *doc, int object, const char *key, int *repeated) {
    int found = -1;
    char name[64];
    for (int k = doc->nodes[object].child; k >= 0; k = fmha_json_next_key(doc, k)) {
        if (fmha_json_string(doc, k, name, sizeof name) < 0 || strcmp(name, key)) continue;
        if (found >= 0) *repeated = 1;
        found = doc->nodes[k].next;
    }
    return found;
}

int fmha_json_repeated_key(const fmha_json *doc, int object) {
    const fmha_json_node *nodes = doc->nodes;
    for (int k = nodes[object].child; k >= 0; k = fmha_json_next_key(doc, k))
        for (int j = fmha_json_next_key(doc, k); j >= 0; j = fmha_json_next_key(doc, j))
            if (nodes[k].len == nodes[j].len && !memcmp(doc->text + nodes[k].at, doc->text + nodes[j].at, nodes[k].len))
                return k;
    return -1;
}
