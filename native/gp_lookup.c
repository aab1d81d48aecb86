/* Every way a program reaches a driver or NVML entry point ends at our wrappers: the interposed dlsym and
 * dlvsym, and cuGetProcAddress(_v2) (how the CUDA runtime finds the driver). This is the one file that
 * lists every module's wrappers: the modules do not know each other's, and none of them calls up here. */
#include "gp.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Each module lists its own wrappers (with their real types, cast to void * as POSIX dlsym does). */
GP_EXPORT void *dlvsym(void *handle, const char *name, const char *version);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
GP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
GP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status);
static struct gp_hook lookup_hooks[] = {
    {"cuGetProcAddress", (void *)cuGetProcAddress, NULL},
    {"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2, NULL},
    {NULL, NULL, NULL},
};
static struct gp_hook *tables[] = {lookup_hooks, gp_mem_hooks, gp_compute_hooks, gp_nvml_hooks, gp_ident_hooks};
#define NTABLES (sizeof tables / sizeof tables[0])
#define FOR_HOOKS(h) \
    for (size_t t_ = 0; t_ < NTABLES; t_++) \
        for (struct gp_hook *h = tables[t_]; h->name != NULL; h++)
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

static void resolve_hooks(void) {
    FOR_HOOKS(h) h->real = strncmp(h->name, "nvml", 4) == 0 ? gp_nvml_sym(h->name) : gp_cuda_sym(h->name);
}

GP_UNINSTRUMENTED static void *hook_by_name(const char *name) {
    FOR_HOOKS(h) if (strcmp(h->name, name) == 0) return h->wrapper;
    return NULL;
}

/* What a lookup of `name` must answer instead of the real symbol: our wrapper, and our dlsym/dlvsym for
 * the lookup functions themselves (dlsym(libc, "dlsym") or dlvsym(..., "dlsym", "GLIBC_2.34") would
 * otherwise hand out an unwrapped resolver, through which every driver entry point escapes). */
GP_UNINSTRUMENTED static void *intercepted(const char *name) {
    if (name[0] == 'd' && name[1] == 'l') {
        if (strcmp(name, "dlsym") == 0) return (void *)dlsym;
        if (strcmp(name, "dlvsym") == 0) return (void *)dlvsym;
        return NULL;
    }
    if ((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0) return hook_by_name(name);
    return NULL;
}

/* How the driver turns a base name and a CUDA version into an ABI variant, for the functions we wrap
 * (cudaTypedefs.h names them PFN_<base>_v<version>): the newest variant at or below the caller's version.
 * Base names not listed here have one ABI, or _v2 from CUDA 3.2 on. */
static const struct { const char *base; int since; const char *name; } variants[] = {
    {"cuCtxCreate", 12050, "cuCtxCreate_v4"},
    {"cuCtxCreate", 11040, "cuCtxCreate_v3"},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2"},
    {"cuCtxCreate", 0, "cuCtxCreate"},
};

static void *by_rule(const char *symbol, int version, cuuint64_t flags) {
    char name[160];
    void *w;
    if (strlen(symbol) > 100) return NULL;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        if (strcmp(variants[i].base, symbol) == 0 && version >= variants[i].since) return hook_by_name(variants[i].name);
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        if ((w = hook_by_name(name)) != NULL) return w;
    }
    if (version >= 3020) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        if ((w = hook_by_name(name)) != NULL) return w;
    }
    return hook_by_name(symbol);
}

/* cuGetProcAddress answers with the driver's own entry point for the ABI version the caller asked for;
 * finding which exported symbol that pointer is tells which of our wrappers has the same ABI. A pointer
 * that is none of them (a driver may hand out internal addresses) is replaced by the wrapper the driver's
 * naming rule picks: an entry point we wrap never escapes through this path. */
static void *substitute(void *p, const char *symbol, int version, cuuint64_t flags) {
    pthread_once(&hooks_once, resolve_hooks);
    FOR_HOOKS(h) {
        if (h->real == p) return h->wrapper;
        if (h->wrapper == p) return p; /* already ours (the driver looked it up through our dlsym) */
    }
    void *w = by_rule(symbol, version, flags);
    return w != NULL ? w : p;
}

GP_EXPORT GP_UNINSTRUMENTED void *dlsym(void *handle, const char *name) {
    gp_dlsym_fn f = gp_real_dlsym();
    if (f == NULL) return NULL;
    void *p = f(handle, name);
    if (p == NULL) return p;
    void *w = intercepted(name);
    return w != NULL ? w : p;
}

GP_EXPORT GP_UNINSTRUMENTED void *dlvsym(void *handle, const char *name, const char *version) {
    gp_dlvsym_fn f = gp_real_dlvsym();
    if (f == NULL) return NULL;
    void *p = f(handle, name, version);
    if (p == NULL) return p;
    void *w = intercepted(name);
    return w != NULL ? w : p;
}

GP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    GP_REAL(gpa_fn, real, "cuGetProcAddress");
    if (real == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL)
        *pfn = substitute(*pfn, symbol, cudaVersion, flags);
    return r;
}

GP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status) {
    GP_REAL(gpa2_fn, real, "cuGetProcAddress_v2");
    if (real == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL)
        *pfn = substitute(*pfn, symbol, cudaVersion, flags);
    return r;
}
