/* json.h: the small JSON tree fmha-bench reads and writes its results file
 * with. Only what the schema needs: objects (keys kept in order), arrays,
 * strings, numbers (double), true/false and null. Reading is the library's
 * JSON reader (src/runtime/json.h); writing is here. Small allocations that
 * fail end the program (a benchmark cannot go on without its bookkeeping). */
#ifndef FMHA_BENCH_JSON_H
#define FMHA_BENCH_JSON_H

#include <stddef.h>

typedef enum json_type {
    JSON_NULL = 0,
    JSON_BOOL,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    int boolean;
    double number;
    char *string;          /* JSON_STRING: UTF-8, NUL-terminated */
    size_t count, cap;     /* JSON_ARRAY / JSON_OBJECT: number of items */
    json_value **items;
    char **keys;           /* JSON_OBJECT only: keys[i] names items[i] */
};

json_value *json_new_null(void);
json_value *json_new_bool(int value);
json_value *json_new_number(double value);   /* NaN and infinities are written as null */
json_value *json_new_string(const char *value);
json_value *json_new_array(void);
json_value *json_new_object(void);

/* Appends item (ownership passes to the array). */
void json_array_push(json_value *array, json_value *item);
/* Sets key to value (ownership passes), replacing an existing value in place. */
void json_object_set(json_value *object, const char *key, json_value *value);
/* Shorthands for json_object_set. */
void json_set_string(json_value *object, const char *key, const char *value);
void json_set_number(json_value *object, const char *key, double value);
void json_set_bool(json_value *object, const char *key, int value);
/* The value of key, or NULL when object is not an object or lacks it. */
json_value *json_object_get(const json_value *object, const char *key);
/* Typed lookups: the fallback when key is absent or of another type. */
const char *json_get_string(const json_value *object, const char *key, const char *fallback);
double json_get_number(const json_value *object, const char *key, double fallback);

json_value *json_clone(const json_value *value);
int json_equal(const json_value *a, const json_value *b);
void json_free(json_value *value);

/* Parses text[0..length) (at most 1 GiB, 256 deep; NaN, Infinity and
 * -Infinity, which Python's json writes, as numbers; a key twice keeps the
 * last value). Returns NULL on a syntax error and writes a message with the
 * byte offset to error (if not NULL). */
json_value *json_parse(const char *text, size_t length, char *error, size_t error_size);

/* Serialises value; indent > 0 pretty-prints with that many spaces a level,
 * indent == 0 writes one line. The string is malloc'ed. */
char *json_serialize(const json_value *value, int indent);

#endif /* FMHA_BENCH_JSON_H */
