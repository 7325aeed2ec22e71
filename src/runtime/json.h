/* json.h: the tree's one JSON reader (json.c). RFC 8259: objects, arrays,
 * strings with escapes, numbers, literals; the text becomes a flat array of
 * nodes, checked whole: the first problem ends the read with its reason and
 * byte. The limits are the caller's: wisdom files (config/wisdom.c) and
 * fmha-bench's results files, which compiles this file in. Internal. */
#ifndef FMHA_JSON_H
#define FMHA_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    FMHA_JSON_NULL,
    FMHA_JSON_BOOL,
    FMHA_JSON_NUMBER,
    FMHA_JSON_STRING,
    FMHA_JSON_ARRAY,
    FMHA_JSON_OBJECT
} fmha_json_type;

/* A value: its bytes text[at, at + len) (a string's between its quotes, a
 * container's brackets included); an array's or object's first child and
 * each node's next sibling (-1: none). An object's children alternate key
 * (a string) and value. */
typedef struct fmha_json_node {
    fmha_json_type type;
    size_t at, len;
    int child, next;
} fmha_json_node;

typedef struct fmha_json_limits {
    size_t max_bytes; /* a longer text is refused (at most INT_MAX - 1) */
    int max_depth;    /* containers nested deeper are refused */
    int nonfinite;    /* NaN, Infinity, -Infinity read as numbers (Python's json writes them) */
} fmha_json_limits;

/* A read text: nodes[0] is the root. The text is the caller's, not copied. */
typedef struct fmha_json {
    const char *text;
    fmha_json_node *nodes;
    int count;
} fmha_json;

/* Reads text[0..len) into doc. Returns 0, or -1 with the reason in err
 * ("byte N: ...") and doc empty. */
int fmha_json_read(const char *text, size_t len, const fmha_json_limits *limits, fmha_json *doc, char *err,
                   size_t err_size);
void fmha_json_free(fmha_json *doc);

/* A string node unescaped into buf (size >= 1) as UTF-8, a lone surrogate
 * as U+FFFD; never longer than the node's len. Returns its length, or -1
 * when it does not fit (buf then holds a prefix). */
int fmha_json_string(const fmha_json *doc, int node, char *buf, size_t size);

/* A number node that is an integer (no fraction or exponent, at most 18
 * digits) into *v; -1 otherwise. */
int fmha_json_integer(const fmha_json *doc, int node, int64_t *v);

/* The value of key in an object node, or -1 (keys longer than 63 bytes
 * never match); 1 in *repeated when the key appears twice. */
int fmha_json_member(const fmha_json *doc, int object, const char *key, int *repeated);

/* The first key node of an object whose bytes appear again as a later key,
 * or -1 when every key is there once. */
int fmha_json_repeated_key(const fmha_json *doc, int object);

/* An object's key after key k (its value is nodes[k].next), or -1. */
static inline int fmha_json_next_key(const fmha_json *doc, int k) { return doc->nodes[doc->nodes[k].next].next; }

#endif /* FMHA_JSON_H */
