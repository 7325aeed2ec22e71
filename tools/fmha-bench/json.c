/* json.c: the JSON tree, parser and writer of fmha-bench (see json.h). */
#include "json.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 256

static void *json_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "fmha-bench: out of memory\n");
        exit(1);
    }
    return p;
}

static void *json_realloc(void *old, size_t bytes)
{
    void *p = realloc(old, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "fmha-bench: out of memory\n");
        exit(1);
    }
    return p;
}

static char *json_strndup(const char *s, size_t n)
{
    char *copy = json_alloc(n + 1);
    memcpy(copy, s, n);
    copy[n] = '\0';
    return copy;
}

static json_value *json_new(json_type type)
{
    json_value *v = json_alloc(sizeof *v);
    memset(v, 0, sizeof *v);
    v->type = type;
    return v;
}

json_value *json_new_null(void) { return json_new(JSON_NULL); }

json_value *json_new_bool(int value)
{
    json_value *v = json_new(JSON_BOOL);
    v->boolean = value != 0;
    return v;
}

json_value *json_new_number(double value)
{
    json_value *v = json_new(JSON_NUMBER);
    v->number = value;
    return v;
}

json_value *json_new_string(const char *value)
{
    json_value *v = json_new(JSON_STRING);
    v->string = json_strndup(value ? value : "", value ? strlen(value) : 0);
    return v;
}

json_value *json_new_array(void) { return json_new(JSON_ARRAY); }
json_value *json_new_object(void) { return json_new(JSON_OBJECT); }

static void json_grow(json_value *v)
{
    if (v->count < v->cap)
        return;
    v->cap = v->cap ? 2 * v->cap : 8;
    v->items = json_realloc(v->items, v->cap * sizeof *v->items);
    if (v->type == JSON_OBJECT)
        v->keys = json_realloc(v->keys, v->cap * sizeof *v->keys);
}

void json_array_push(json_value *array, json_value *item)
{
    json_grow(array);
    array->items[array->count++] = item;
}

void json_object_set(json_value *object, const char *key, json_value *value)
{
    for (size_t i = 0; i < object->count; i++) {
        if (strcmp(object->keys[i], key) == 0) {
            json_free(object->items[i]);
            object->items[i] = value;
            return;
        }
    }
    json_grow(object);
    object->keys[object->count] = json_strndup(key, strlen(key));
    object->items[object->count++] = value;
}

void json_set_string(json_value *object, const char *key, const char *value)
{
    json_object_set(object, key, json_new_string(value));
}

void json_set_number(json_value *object, const char *key, double value)
{
    json_object_set(object, key, json_new_number(value));
}

void json_set_bool(json_value *object, const char *key, int value)
{
    json_object_set(object, key, json_new_bool(value));
}

json_value *json_object_get(const json_value *object, const char *key)
{
    if (!object || object->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (strcmp(object->keys[i], key) == 0)
            return object->items[i];
    return NULL;
}

const char *json_get_string(const json_value *object, const char *key, const char *fallback)
{
    const json_value *v = json_object_get(object, key);
    return v && v->type == JSON_STRING ? v->string : fallback;
}

double json_get_number(const json_value *object, const char *key, double fallback)
{
    const json_value *v = json_object_get(object, key);
    return v && v->type == JSON_NUMBER ? v->number : fallback;
}

json_value *json_clone(const json_value *value)
{
    json_value *copy = json_new(value->type);
    copy->boolean = value->boolean;
    copy->number = value->number;
    if (value->type == JSON_STRING)
        copy->string = json_strndup(value->string, strlen(value->string));
    for (size_t i = 0; i < value->count; i++) {
        if (value->type == JSON_OBJECT)
            json_object_set(copy, value->keys[i], json_clone(value->items[i]));
        else
            json_array_push(copy, json_clone(value->items[i]));
    }
    return copy;
}

int json_equal(const json_value *a, const json_value *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return a->boolean == b->boolean;
    case JSON_NUMBER: return a->number == b->number;
    case JSON_STRING: return strcmp(a->string, b->string) == 0;
    case JSON_ARRAY:
        if (a->count != b->count)
            return 0;
        for (size_t i = 0; i < a->count; i++)
            if (!json_equal(a->items[i], b->items[i]))
                return 0;
        return 1;
    case JSON_OBJECT:
        if (a->count != b->count)
            return 0;
        for (size_t i = 0; i < a->count; i++) {
            const json_value *other = json_object_get(b, a->keys[i]);
            if (!other || !json_equal(a->items[i], other))
                return 0;
        }
        return 1;
    }
    return 0;
}

void json_free(json_value *value)
{
    if (!value)
        return;
    for (size_t i = 0; i < value->count; i++) {
        json_free(value->items[i]);
        if (value->type == JSON_OBJECT)
            free(value->keys[i]);
    }
    free(value->items);
    free(value->keys);
    free(value->string);
    free(value);
}

/* ---- parser ---------------------------------------------------------------- */

typedef struct json_parser {
    const char *text;
    size_t length, pos;
    char *error;
    size_t error_size;
    int failed;
} json_parser;

static void parse_fail(json_parser *ps, const char *what)
{
    if (!ps->failed && ps->error && ps->error_size)
        snprintf(ps->error, ps->error_size, "%s at byte %zu", what, ps->pos);
    ps->failed = 1;
}

static void skip_space(json_parser *ps)
{
    while (ps->pos < ps->length) {
        char c = ps->text[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        ps->pos++;
    }
}

static int parse_literal(json_parser *ps, const char *word)
{
    size_t n = strlen(word);
    if (ps->length - ps->pos < n || memcmp(ps->text + ps->pos, word, n) != 0)
        return 0;
    ps->pos += n;
    return 1;
}

static int hex4(json_parser *ps, unsigned *out)
{
    if (ps->length - ps->pos < 4)
        return 0;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->text[ps->pos + i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    ps->pos += 4;
    *out = v;
    return 1;
}

typedef struct text_buffer {
    char *data;
    size_t length, cap;
} text_buffer;

static void buffer_put(text_buffer *b, const char *s, size_t n)
{
    if (b->length + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->length + n + 1 > cap)
            cap *= 2;
        b->data = json_realloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->length, s, n);
    b->length += n;
    b->data[b->length] = '\0';
}

static void buffer_putc(text_buffer *b, char c) { buffer_put(b, &c, 1); }

static void buffer_put_utf8(text_buffer *b, unsigned cp)
{
    char out[4];
    size_t n;
    if (cp < 0x80) { out[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    buffer_put(b, out, n);
}

/* Parses a string starting at the opening quote; returns a malloc'ed copy. */
static char *parse_string_raw(json_parser *ps)
{
    text_buffer b = {0};
    buffer_put(&b, "", 0);
    ps->pos++; /* opening quote */
    while (ps->pos < ps->length) {
        unsigned char c = (unsigned char)ps->text[ps->pos];
        if (c == '"') {
            ps->pos++;
            return b.data;
        }
        if (c < 0x20) {
            parse_fail(ps, "control character in string");
            break;
        }
        if (c != '\\') {
            buffer_putc(&b, (char)c);
            ps->pos++;
            continue;
        }
        ps->pos++;
        if (ps->pos >= ps->length)
            break;
        char e = ps->text[ps->pos++];
        switch (e) {
        case '"': buffer_putc(&b, '"'); break;
        case '\\': buffer_putc(&b, '\\'); break;
        case '/': buffer_putc(&b, '/'); break;
        case 'b': buffer_putc(&b, '\b'); break;
        case 'f': buffer_putc(&b, '\f'); break;
        case 'n': buffer_putc(&b, '\n'); break;
        case 'r': buffer_putc(&b, '\r'); break;
        case 't': buffer_putc(&b, '\t'); break;
        case 'u': {
            unsigned cp, low;
            if (!hex4(ps, &cp)) {
                parse_fail(ps, "bad \\u escape");
                free(b.data);
                return NULL;
            }
            if (cp >= 0xD800 && cp < 0xDC00 && ps->length - ps->pos >= 6 && ps->text[ps->pos] == '\\' &&
                ps->text[ps->pos + 1] == 'u') {
                size_t save = ps->pos;
                ps->pos += 2;
                if (hex4(ps, &low) && low >= 0xDC00 && low < 0xE000)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                else
                    ps->pos = save;
            }
            if (cp >= 0xD800 && cp < 0xE000)
                cp = 0xFFFD; /* lone surrogate */
            buffer_put_utf8(&b, cp);
            break;
        }
        default:
            parse_fail(ps, "bad escape in string");
            free(b.data);
            return NULL;
        }
    }
    parse_fail(ps, "unterminated string");
    free(b.data);
    return NULL;
}

static json_value *parse_value(json_parser *ps, int depth);

static json_value *parse_number(json_parser *ps)
{
    size_t start = ps->pos;
    const char *t = ps->text;
    if (ps->pos < ps->length && t[ps->pos] == '-')
        ps->pos++;
    if (ps->pos >= ps->length || t[ps->pos] < '0' || t[ps->pos] > '9') {
        parse_fail(ps, "bad number");
        return NULL;
    }
    if (t[ps->pos] == '0')
        ps->pos++;
    else
        while (ps->pos < ps->length && t[ps->pos] >= '0' && t[ps->pos] <= '9')
            ps->pos++;
    if (ps->pos < ps->length && t[ps->pos] == '.') {
        ps->pos++;
        if (ps->pos >= ps->length || t[ps->pos] < '0' || t[ps->pos] > '9') {
            parse_fail(ps, "bad number");
            return NULL;
        }
        while (ps->pos < ps->length && t[ps->pos] >= '0' && t[ps->pos] <= '9')
            ps->pos++;
    }
    if (ps->pos < ps->length && (t[ps->pos] == 'e' || t[ps->pos] == 'E')) {
        ps->pos++;
        if (ps->pos < ps->length && (t[ps->pos] == '+' || t[ps->pos] == '-'))
            ps->pos++;
        if (ps->pos >= ps->length || t[ps->pos] < '0' || t[ps->pos] > '9') {
            parse_fail(ps, "bad number");
            return NULL;
        }
        while (ps->pos < ps->length && t[ps->pos] >= '0' && t[ps->pos] <= '9')
            ps->pos++;
    }
    char *copy = json_strndup(t + start, ps->pos - start);
    double v = strtod(copy, NULL);
    free(copy);
    return json_new_number(v);
}

static json_value *parse_container(json_parser *ps, int depth, int is_object)
{
    json_value *v = is_object ? json_new_object() : json_new_array();
    char close = is_object ? '}' : ']';
    ps->pos++;
    skip_space(ps);
    if (ps->pos < ps->length && ps->text[ps->pos] == close) {
        ps->pos++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        skip_space(ps);
        if (is_object) {
            if (ps->pos >= ps->length || ps->text[ps->pos] != '"') {
                parse_fail(ps, "expected a key");
                break;
            }
            key = parse_string_raw(ps);
            if (!key)
                break;
            skip_space(ps);
            if (ps->pos >= ps->length || ps->text[ps->pos] != ':') {
                parse_fail(ps, "expected ':'");
                free(key);
                break;
            }
            ps->pos++;
        }
        json_value *item = parse_value(ps, depth + 1);
        if (!item) {
            free(key);
            break;
        }
        if (is_object) {
            json_object_set(v, key, item);
            free(key);
        } else {
            json_array_push(v, item);
        }
        skip_space(ps);
        if (ps->pos < ps->length && ps->text[ps->pos] == ',') {
            ps->pos++;
            continue;
        }
        if (ps->pos < ps->length && ps->text[ps->pos] == close) {
            ps->pos++;
            return v;
        }
        parse_fail(ps, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
        break;
    }
    json_free(v);
    return NULL;
}

static json_value *parse_value(json_parser *ps, int depth)
{
    if (depth > JSON_MAX_DEPTH) {
        parse_fail(ps, "nesting too deep");
        return NULL;
    }
    skip_space(ps);
    if (ps->pos >= ps->length) {
        parse_fail(ps, "unexpected end of input");
        return NULL;
    }
    char c = ps->text[ps->pos];
    if (c == '{')
        return parse_container(ps, depth, 1);
    if (c == '[')
        return parse_container(ps, depth, 0);
    if (c == '"') {
        char *s = parse_string_raw(ps);
        if (!s)
            return NULL;
        json_value *v = json_new(JSON_STRING);
        v->string = s;
        return v;
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return parse_number(ps);
    if (parse_literal(ps, "true"))
        return json_new_bool(1);
    if (parse_literal(ps, "false"))
        return json_new_bool(0);
    if (parse_literal(ps, "null"))
        return json_new_null();
    /* Python's json module writes these for non-finite floats. */
    if (parse_literal(ps, "NaN"))
        return json_new_number(NAN);
    if (parse_literal(ps, "Infinity"))
        return json_new_number(INFINITY);
    parse_fail(ps, "unexpected character");
    return NULL;
}

json_value *json_parse(const char *text, size_t length, char *error, size_t error_size)
{
    json_parser ps = {text, length, 0, error, error_size, 0};
    json_value *v = parse_value(&ps, 0);
    if (!v)
        return NULL;
    skip_space(&ps);
    if (ps.pos != ps.length) {
        parse_fail(&ps, "trailing characters");
        json_free(v);
        return NULL;
    }
    return v;
}

/* ---- writer ---------------------------------------------------------------- */

static void write_number(text_buffer *b, double v)
{
    char tmp[40];
    if (!isfinite(v)) {
        buffer_put(b, "null", 4);
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(tmp, sizeof tmp, "%lld", (long long)v);
    } else {
        /* Shortest of %.15g..%.17g that reads back exactly. */
        for (int precision = 15; precision <= 17; precision++) {
            snprintf(tmp, sizeof tmp, "%.*g", precision, v);
            if (strtod(tmp, NULL) == v)
                break;
        }
    }
    buffer_put(b, tmp, strlen(tmp));
}

static void write_string(text_buffer *b, const char *s)
{
    buffer_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        switch (*p) {
        case '"': buffer_put(b, "\\\"", 2); break;
        case '\\': buffer_put(b, "\\\\", 2); break;
        case '\n': buffer_put(b, "\\n", 2); break;
        case '\r': buffer_put(b, "\\r", 2); break;
        case '\t': buffer_put(b, "\\t", 2); break;
        case '\b': buffer_put(b, "\\b", 2); break;
        case '\f': buffer_put(b, "\\f", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", *p);
                buffer_put(b, tmp, 6);
            } else {
                buffer_putc(b, (char)*p);
            }
        }
    }
    buffer_putc(b, '"');
}

static void write_newline(text_buffer *b, int indent, int level)
{
    if (indent <= 0)
        return;
    buffer_putc(b, '\n');
    for (int i = 0; i < indent * level; i++)
        buffer_putc(b, ' ');
}

static void write_value(text_buffer *b, const json_value *v, int indent, int level)
{
    switch (v->type) {
    case JSON_NULL: buffer_put(b, "null", 4); return;
    case JSON_BOOL: buffer_put(b, v->boolean ? "true" : "false", v->boolean ? 4 : 5); return;
    case JSON_NUMBER: write_number(b, v->number); return;
    case JSON_STRING: write_string(b, v->string); return;
    case JSON_ARRAY:
    case JSON_OBJECT: {
        int is_object = v->type == JSON_OBJECT;
        buffer_putc(b, is_object ? '{' : '[');
        for (size_t i = 0; i < v->count; i++) {
            if (i)
                buffer_put(b, indent > 0 ? "," : ", ", indent > 0 ? 1 : 2);
            write_newline(b, indent, level + 1);
            if (is_object) {
                write_string(b, v->keys[i]);
                buffer_put(b, ": ", 2);
            }
            write_value(b, v->items[i], indent, level + 1);
        }
        if (v->count)
            write_newline(b, indent, level);
        buffer_putc(b, is_object ? '}' : ']');
        return;
    }
    }
}

char *json_serialize(const json_value *value, int indent)
{
    text_buffer b = {0};
    buffer_put(&b, "", 0);
    write_value(&b, value, indent, 0);
    return b.data;
}
