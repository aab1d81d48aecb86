/* A small JSON reader and writer for the fake AMD SMI library's state file (objects, arrays, strings without
 * escapes beyond \" \\ \/ \n \t, integers, true/false/null). Enough for a file the tests write; not general. */
#ifndef GPUPOOL_FAKE_JSON_H
#define GPUPOOL_FAKE_JSON_H

#include <stdint.h>
#include <stdio.h>

typedef enum { JNULL, JBOOL, JNUM, JSTR, JARR, JOBJ } jkind;

typedef struct jval {
    jkind kind;
    int64_t num;       /* JNUM, JBOOL */
    char *str;         /* JSTR */
    struct jval **items; /* JARR, JOBJ values */
    char **keys;       /* JOBJ keys */
    int count;
    int cap;
} jval;

jval *json_parse(const char *text);        /* NULL on a syntax error */
void json_free(jval *v);
void json_write(FILE *out, const jval *v);
jval *json_get(const jval *obj, const char *key); /* NULL when absent or obj is not an object */
int64_t json_int(const jval *obj, const char *key, int64_t fallback);
const char *json_str(const jval *obj, const char *key, const char *fallback);
void json_set_str(jval *obj, const char *key, const char *value);
void json_remove_at(jval *arr, int index);

#endif
