/* Finding the real functions: libc's own dlsym and dlvsym, and through them a vendor library's (the CUDA
 * driver's and NVML's in gp_driver.c, the HIP runtime's in hip/gph_runtime.c).
 *
 * The library exports dlsym and dlvsym so that every lookup an application makes ends at the wrappers.
 * Its own calls to those names would then come back to itself (an unversioned definition satisfies even a
 * versioned reference such as dlvsym@GLIBC_2.34), so the real functions are read from the dynamic symbol
 * tables of the loaded objects: the list ld.so publishes in _r_debug, walked without calling any function
 * a sanitizer runtime might intercept, because this runs inside the sanitizers' own start-up. This library
 * itself is skipped by its dynamic section (_DYNAMIC, which ld.so records as the object's l_ld): so the
 * lowest layer needs no address of the wrappers above it. */
#include "gp_core.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

extern struct r_debug _r_debug;
extern ElfW(Dyn) _DYNAMIC[] __attribute__((visibility("hidden")));

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
GP_UNINSTRUMENTED static void *libc_sym(const char *name) {
    void *other = NULL;
    for (const struct link_map *lm = _r_debug.r_map; lm != NULL; lm = lm->l_next) {
        if (lm->l_ld == _DYNAMIC) continue;
        void *p = lookup(lm, name);
        if (p == NULL) continue;
        if (lm->l_name != NULL && is_libc(lm->l_name)) return p;
        if (other == NULL) other = p;
    }
    return other;
}

static gp_dlsym_fn real_dlsym_ptr;
static gp_dlvsym_fn real_dlvsym_ptr;

GP_UNINSTRUMENTED gp_dlsym_fn gp_real_dlsym(void) {
    gp_dlsym_fn f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (f != NULL) return f;
    f = (gp_dlsym_fn)libc_sym("dlsym");
    if (f == NULL) {
        fprintf(stderr, "gpupool-hook: cannot find the real dlsym; symbol lookups will fail\n");
        return NULL;
    }
    __atomic_store_n(&real_dlsym_ptr, f, __ATOMIC_RELEASE);
    return f;
}

GP_UNINSTRUMENTED gp_dlvsym_fn gp_real_dlvsym(void) {
    gp_dlvsym_fn f = __atomic_load_n(&real_dlvsym_ptr, __ATOMIC_ACQUIRE);
    if (f != NULL) return f;
    f = (gp_dlvsym_fn)libc_sym("dlvsym");
    if (f != NULL) __atomic_store_n(&real_dlvsym_ptr, f, __ATOMIC_RELEASE);
    return f;
}

void *gp_lib_sym(void **handle, const char *const *sonames, const char *name) {
    void *h = __atomic_load_n(handle, __ATOMIC_ACQUIRE);
    /* The one the program loaded first (RTLD_NOLOAD: any of the names), else the first that loads. */
    for (int load = 0; h == NULL && load < 2; load++)
        for (const char *const *s = sonames; h == NULL && *s != NULL; s++)
            h = dlopen(*s, RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD));
    if (h == NULL) return NULL;
    __atomic_store_n(handle, h, __ATOMIC_RELEASE);
    gp_dlsym_fn f = gp_real_dlsym();
    return f != NULL ? f(h, name) : NULL;
}
