/* A small JSON reader for the fake DCMI's state file (dcmi_fake.h): objects, arrays, strings (the escapes
 * \" \\ \/ \n \t only; no \u), numbers, true, false, null. Enough for a file the tests write themselves. */
#ifndef GPUPOOL_FAKE_JSON_H
#define GPUPOOL_FAKE_JSON_H

#include <stddef.h>

enum fj_type { FJ_NULL, FJ_BOOL, FJ_NUM, FJ_STR, FJ_ARR, FJ_OBJ };

struct fj {
    enum fj_type type;
    double num;         /* FJ_NUM, FJ_BOOL (0/1) */
    char *str;          /* FJ_STR */
    size_t n;           /* FJ_ARR, FJ_OBJ: number of items */
    struct fj **items;  /* FJ_ARR, FJ_OBJ */
    char **keys;        /* FJ_OBJ */
};

/* Parse `text`; NULL on a syntax error. */
struct fj *fj_parse(const char *text);
void fj_free(struct fj *v);
/* The member `key` of an object, or NULL (also when `obj` is not an object). */
const struct fj *fj_get(const struct fj *obj, const char *key);
/* Number / bool members with a default when absent or of another type. */
double fj_num(const struct fj *obj, const char *key, double dflt);
/* A string member copied into out[cap] (truncated, NUL-terminated), or dflt. */
void fj_str(const struct fj *obj, const char *key, const char *dflt, char *out, size_t cap);

#endif
