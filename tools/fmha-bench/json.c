/* json.c: the JSON tree and writer of fmha-bench (see json.h); reading is
 * the library's JSON reader (src/runtime/json.c, compiled in), whose nodes
 * become the tree. */
#include "json.h"

#include "runtime/json.h"

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

/* ---- reading: the tree's JSON reader (src/runtime/json.c), its nodes made a tree */

/* Results files grow with every --append; only a runaway file is refused. */
static const fmha_json_limits json_limits = {(size_t)1 << 30, JSON_MAX_DEPTH, 1};

static json_value *json_from_node(const fmha_json *doc, int k)
{
    const fmha_json_node *n = &doc->nodes[k];
    json_value *v;
    switch (n->type) {
    case FMHA_JSON_NULL: return json_new_null();
    case FMHA_JSON_BOOL: return json_new_bool(doc->text[n->at] == 't');
    case FMHA_JSON_NUMBER: {
        char *digits = json_strndup(doc->text + n->at, n->len);
        v = json_new_number(strtod(digits, NULL));
        free(digits);
        return v;
    }
    case FMHA_JSON_STRING: {
        char *s = json_alloc(n->len + 1);
        fmha_json_string(doc, k, s, n->len + 1);
        v = json_new_string(s);
        free(s);
        return v;
    }
    case FMHA_JSON_ARRAY:
        v = json_new_array();
        for (int c = n->child; c >= 0; c = doc->nodes[c].next)
            json_array_push(v, json_from_node(doc, c));
        return v;
    case FMHA_JSON_OBJECT:
        v = json_new_object();
        for (int c = n->child; c >= 0; c = fmha_json_next_key(doc, c)) {
            char *key = json_alloc(doc->nodes[c].len + 1);
            fmha_json_string(doc, c, key, doc->nodes[c].len + 1);
            json_object_set(v, key, json_from_node(doc, doc->nodes[c].next));
            free(key);
        }
        return v;
    }
    return json_new_null();
}

json_value *json_parse(const char *text, size_t length, char *error, size_t error_size)
{
    fmha_json doc;
    if (fmha_json_read(text, length, &json_limits, &doc, error, error_size))
        return NULL;
    json_value *v = json_from_node(&doc, 0);
    fmha_json_free(&doc);
    return v;
}

/* ---- writer ---------------------------------------------------------------- */

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
