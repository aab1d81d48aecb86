#define _POSIX_C_SOURCE 200809L
#include "fake_json.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p;
    int ok;
} cursor;

/* Out of memory in a test fake: stop at once rather than carry on with half a state. */
static void *xrealloc(void *old, size_t size) {
    void *p = realloc(old, size);
    if (!p) abort();
    return p;
}

static char *xstrdup(const char *s) {
    char *p = strdup(s);
    if (!p) abort();
    return p;
}

static void skip_ws(cursor *c) {
    while (*c->p && isspace((unsigned char)*c->p)) c->p++;
}

static jval *new_val(jkind kind) {
    jval *v = calloc(1, sizeof *v);
    if (!v) abort();
    v->kind = kind;
    return v;
}

static void push(jval *v, char *key, jval *item) {
    if (v->count == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->items = xrealloc(v->items, (size_t)v->cap * sizeof *v->items);
        v->keys = xrealloc(v->keys, (size_t)v->cap * sizeof *v->keys);
    }
    v->items[v->count] = item;
    v->keys[v->count] = key;
    v->count++;
}

static char *parse_string(cursor *c) {
    if (*c->p != '"') {
        c->ok = 0;
        return NULL;
    }
    c->p++;
    size_t cap = 32, n = 0;
    char *out = xrealloc(NULL, cap);
    while (*c->p && *c->p != '"') {
        char ch = *c->p++;
        if (ch == '\\') {
            char e = *c->p++;
            ch = e == 'n' ? '\n' : e == 't' ? '\t' : e;
        }
        if (n + 2 > cap) out = xrealloc(out, cap *= 2);
        out[n++] = ch;
    }
    if (*c->p != '"') {
        c->ok = 0;
        free(out);
        return NULL;
    }
    c->p++;
    out[n] = '\0';
    return out;
}

static jval *parse_value(cursor *c);

static jval *parse_container(cursor *c, int object) {
    jval *v = new_val(object ? JOBJ : JARR);
    c->p++;
    skip_ws(c);
    char close = object ? '}' : ']';
    if (*c->p == close) {
        c->p++;
        return v;
    }
    while (c->ok) {
        skip_ws(c);
        char *key = NULL;
        if (object) {
            key = parse_string(c);
            skip_ws(c);
            if (!c->ok || *c->p != ':') {
                c->ok = 0;
                free(key);
                break;
            }
            c->p++;
        }
        jval *item = parse_value(c);
        if (!c->ok) {
            free(key);
            json_free(item);
            break;
        }
        push(v, key, item);
        skip_ws(c);
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == close) {
            c->p++;
            return v;
        }
        c->ok = 0;
    }
    json_free(v);
    return NULL;
}

static jval *parse_value(cursor *c) {
    skip_ws(c);
    if (*c->p == '{') return parse_container(c, 1);
    if (*c->p == '[') return parse_container(c, 0);
    if (*c->p == '"') {
        jval *v = new_val(JSTR);
        v->str = parse_string(c);
        return v;
    }
    if (strncmp(c->p, "true", 4) == 0 || strncmp(c->p, "false", 5) == 0) {
        jval *v = new_val(JBOOL);
        v->num = *c->p == 't';
        c->p += v->num ? 4 : 5;
        return v;
    }
    if (strncmp(c->p, "null", 4) == 0) {
        c->p += 4;
        return new_val(JNULL);
    }
    if (*c->p == '-' || isdigit((unsigned char)*c->p)) {
        char *end;
        jval *v = new_val(JNUM);
        v->num = strtoll(c->p, &end, 10);
        c->p = end;
        return v;
    }
    c->ok = 0;
    return NULL;
}

jval *json_parse(const char *text) {
    cursor c = {text, 1};
    jval *v = parse_value(&c);
    skip_ws(&c);
    if (!c.ok || *c.p) {
        json_free(v);
        return NULL;
    }
    return v;
}

void json_free(jval *v) {
    if (!v) return;
    for (int i = 0; i < v->count; i++) {
        json_free(v->items[i]);
        free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

static void write_string(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', out);
        if (*s == '\n') {
            fputs("\\n", out);
            continue;
        }
        fputc(*s, out);
    }
    fputc('"', out);
}

void json_write(FILE *out, const jval *v) {
    switch (v->kind) {
    case JNULL: fputs("null", out); break;
    case JBOOL: fputs(v->num ? "true" : "false", out); break;
    case JNUM: fprintf(out, "%lld", (long long)v->num); break;
    case JSTR: write_string(out, v->str); break;
    case JARR:
    case JOBJ:
        fputc(v->kind == JOBJ ? '{' : '[', out);
        for (int i = 0; i < v->count; i++) {
            if (i) fputs(", ", out);
            if (v->kind == JOBJ) {
                write_string(out, v->keys[i]);
                fputs(": ", out);
            }
            json_write(out, v->items[i]);
        }
        fputc(v->kind == JOBJ ? '}' : ']', out);
        break;
    }
}

jval *json_get(const jval *obj, const char *key) {
    if (!obj || obj->kind != JOBJ) return NULL;
    for (int i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

int64_t json_int(const jval *obj, const char *key, int64_t fallback) {
    jval *v = json_get(obj, key);
    return v && (v->kind == JNUM || v->kind == JBOOL) ? v->num : fallback;
}

const char *json_str(const jval *obj, const char *key, const char *fallback) {
    jval *v = json_get(obj, key);
    return v && v->kind == JSTR ? v->str : fallback;
}

void json_set_str(jval *obj, const char *key, const char *value) {
    jval *v = json_get(obj, key);
    if (!v) {
        v = new_val(JSTR);
        push(obj, xstrdup(key), v);
    }
    if (v->kind != JSTR) {
        v->kind = JSTR;
    }
    free(v->str);
    v->str = xstrdup(value);
}

void json_remove_at(jval *arr, int index) {
    if (index < 0 || index >= arr->count) return;
    json_free(arr->items[index]);
    free(arr->keys[index]);
    for (int i = index; i + 1 < arr->count; i++) {
        arr->items[i] = arr->items[i + 1];
        arr->keys[i] = arr->keys[i + 1];
    }
    arr->count--;
}
