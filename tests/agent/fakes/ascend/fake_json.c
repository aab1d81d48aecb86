/* See fake_json.h. A recursive-descent reader; depth is bounded so a malformed file cannot blow the stack. */
#include "fake_json.h"

#include <stdlib.h>
#include <string.h>

#define FJ_MAX_DEPTH 32

struct fj_cursor {
    const char *p;
};

static void skip_ws(struct fj_cursor *c) {
    while (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t') c->p++;
}

static struct fj *node(enum fj_type type) {
    struct fj *v = calloc(1, sizeof *v);
    if (v) v->type = type;
    return v;
}

static char *parse_string(struct fj_cursor *c) {
    if (*c->p != '"') return NULL;
    c->p++;
    size_t cap = 16, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    while (*c->p && *c->p != '"') {
        char ch = *c->p++;
        if (ch == '\\') {
            char e = *c->p++;
            switch (e) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case '/': ch = '/'; break;
            case 'n': ch = '\n'; break;
            case 't': ch = '\t'; break;
            default: free(out); return NULL;
            }
        }
        if (len + 2 > cap) {
            cap *= 2;
            char *grown = realloc(out, cap);
            if (!grown) { free(out); return NULL; }
            out = grown;
        }
        out[len++] = ch;
    }
    if (*c->p != '"') { free(out); return NULL; }
    c->p++;
    out[len] = '\0';
    return out;
}

static int append(struct fj *v, struct fj *item, char *key) {
    struct fj **items = realloc(v->items, (v->n + 1) * sizeof *items);
    if (!items) return -1;
    v->items = items;
    if (v->type == FJ_OBJ) {
        char **keys = realloc(v->keys, (v->n + 1) * sizeof *keys);
        if (!keys) return -1;
        v->keys = keys;
        v->keys[v->n] = key;
    }
    v->items[v->n++] = item;
    return 0;
}

static struct fj *parse_value(struct fj_cursor *c, int depth);

static struct fj *parse_container(struct fj_cursor *c, int depth, int is_obj) {
    struct fj *v = node(is_obj ? FJ_OBJ : FJ_ARR);
    if (!v) return NULL;
    c->p++;
    skip_ws(c);
    if (*c->p == (is_obj ? '}' : ']')) { c->p++; return v; }
    for (;;) {
        char *key = NULL;
        skip_ws(c);
        if (is_obj) {
            key = parse_string(c);
            skip_ws(c);
            if (!key || *c->p != ':') { free(key); fj_free(v); return NULL; }
            c->p++;
        }
        struct fj *item = parse_value(c, depth + 1);
        if (!item || append(v, item, key) != 0) { free(key); fj_free(item); fj_free(v); return NULL; }
        skip_ws(c);
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == (is_obj ? '}' : ']')) { c->p++; return v; }
        fj_free(v);
        return NULL;
    }
}

static struct fj *parse_value(struct fj_cursor *c, int depth) {
    if (depth > FJ_MAX_DEPTH) return NULL;
    skip_ws(c);
    if (*c->p == '{') return parse_container(c, depth, 1);
    if (*c->p == '[') return parse_container(c, depth, 0);
    if (*c->p == '"') {
        char *s = parse_string(c);
        if (!s) return NULL;
        struct fj *v = node(FJ_STR);
        if (!v) { free(s); return NULL; }
        v->str = s;
        return v;
    }
    if (strncmp(c->p, "true", 4) == 0 || strncmp(c->p, "false", 5) == 0) {
        struct fj *v = node(FJ_BOOL);
        if (!v) return NULL;
        v->num = c->p[0] == 't';
        c->p += v->num ? 4 : 5;
        return v;
    }
    if (strncmp(c->p, "null", 4) == 0) {
        c->p += 4;
        return node(FJ_NULL);
    }
    char *end = NULL;
    double num = strtod(c->p, &end);
    if (end == c->p) return NULL;
    c->p = end;
    struct fj *v = node(FJ_NUM);
    if (v) v->num = num;
    return v;
}

struct fj *fj_parse(const char *text) {
    struct fj_cursor c = {text};
    struct fj *v = parse_value(&c, 0);
    if (!v) return NULL;
    skip_ws(&c);
    if (*c.p != '\0') { fj_free(v); return NULL; }
    return v;
}

void fj_free(struct fj *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        fj_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

const struct fj *fj_get(const struct fj *obj, const char *key) {
    if (!obj || obj->type != FJ_OBJ) return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

double fj_num(const struct fj *obj, const char *key, double dflt) {
    const struct fj *v = fj_get(obj, key);
    return v && (v->type == FJ_NUM || v->type == FJ_BOOL) ? v->num : dflt;
}

void fj_str(const struct fj *obj, const char *key, const char *dflt, char *out, size_t cap) {
    const struct fj *v = fj_get(obj, key);
    const char *src = v && v->type == FJ_STR ? v->str : dflt;
    if (cap == 0) return;
    strncpy(out, src, cap - 1);
    out[cap - 1] = '\0';
}
