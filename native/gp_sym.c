/* Finding libc's own dlsym and dlvsym without calling either.
 *
 * The library exports dlsym and dlvsym so that every lookup an application makes ends at the wrappers.
 * Its own calls to those names would then come back to itself (an unversioned definition satisfies even a
 * versioned reference such as dlvsym@GLIBC_2.34), so the real functions are read from the dynamic symbol
 * tables of the loaded objects: the list ld.so publishes in _r_debug, walked without calling any function
 * a sanitizer runtime might intercept, because this runs inside the sanitizers' own start-up. */
#include "gp.h"

#include <elf.h>
#include <link.h>
#include <string.h>

#define GP_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

extern struct r_debug _r_debug;

/* ld.so rewrites most pointers of a loaded object's dynamic section to addresses; some targets keep them
 * as offsets. An offset is smaller than the load address of the object it belongs to. */
GP_UNINSTRUMENTED static uintptr_t dyn_ptr(const struct link_map *lm, ElfW(Addr) p) {
    return p < lm->l_addr ? lm->l_addr + p : p;
}

GP_UNINSTRUMENTED static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

GP_UNINSTRUMENTED static uint32_t symbol_count(const uint32_t *sysv, const uint32_t *gnu) {
    if (sysv != NULL) return sysv[1]; /* nchain */
    if (gnu == NULL) return 0;
    uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom = gnu[2];
    const uint32_t *buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t i = 0; i < nbuckets; i++)
        if (buckets[i] > last) last = buckets[i];
    if (last < symoffset) return symoffset;
    while ((chain[last - symoffset] & 1) == 0) last++;
    return last + 1;
}

/* The default (non-hidden) version of a defined function `name` in one object, or NULL. */
GP_UNINSTRUMENTED static void *lookup(const struct link_map *lm, const char *name) {
    const ElfW(Sym) *syms = NULL;
    const char *strs = NULL;
    const ElfW(Half) *versym = NULL;
    const uint32_t *sysv = NULL, *gnu = NULL;
    if (lm->l_ld == NULL) return NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: syms = (const ElfW(Sym) *)dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_STRTAB: strs = (const char *)dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_VERSYM: versym = (const ElfW(Half) *)dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_HASH: sysv = (const uint32_t *)dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = (const uint32_t *)dyn_ptr(lm, d->d_un.d_ptr); break;
        default: break;
        }
    }
    if (syms == NULL || strs == NULL) return NULL;
    uint32_t n = symbol_count(sysv, gnu);
    for (uint32_t i = 1; i < n; i++) {
        const ElfW(Sym) *s = &syms[i];
        if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC || s->st_value == 0) continue;
        if (versym != NULL && (versym[i] & 0x8000)) continue; /* a compat version, not the default */
        if (same(strs + s->st_name, name)) return (void *)(lm->l_addr + s->st_value);
    }
    return NULL;
}

GP_UNINSTRUMENTED static int is_libc(const char *path) {
    const char *base = path;
    for (const char *p = path; *p; p++)
        if (*p == '/') base = p + 1;
    return base[0] == 'l' && base[1] == 'i' && base[2] == 'b' && base[3] == 'c' && base[4] == '.';
}

/* libc's definition first (dlsym moved there in glibc 2.34), else the first object after ours that defines
 * it (libdl.so.2 before 2.34); never this library's own wrappers. */
GP_UNINSTRUMENTED void *gp_libc_sym(const char *name, const void *not_this, const void *nor_this) {
    void *other = NULL;
    for (const struct link_map *lm = _r_debug.r_map; lm != NULL; lm = lm->l_next) {
        void *p = lookup(lm, name);
        if (p == NULL || p == not_this || p == nor_this) continue;
        if (lm->l_name != NULL && is_libc(lm->l_name)) return p;
        if (other == NULL) other = p;
    }
    return other;
}
