/* Every way a program reaches a HIP or HSA entry point the library wraps ends at the wrapper: the interposed
 * dlsym and dlvsym (a framework that dlopens libamdhip64 or libhsa-runtime64 and looks its functions up), and
 * hipGetProcAddress (HIP 6.2 and later). The linked calls reach the wrappers by symbol interposition: the library is preloaded, so its
 * definitions come before the runtime's in every lookup of the program's global scope. The one file that
 * lists the wrappers; nothing below calls up here. */
#include "gph.h"

#include <dlfcn.h>
#include <string.h>

GP_EXPORT void *dlvsym(void *handle, const char *name, const char *version);
GP_EXPORT hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags,
                                       hipDriverProcAddressQueryResult *status);
static struct gp_hook lookup_hooks[] = {
    {"hipGetProcAddress", (void *)hipGetProcAddress, NULL},
    {NULL, NULL, NULL},
};
static struct gp_hook *tables[] = {lookup_hooks, gph_mem_hooks, gph_cu_hooks};
#define NTABLES (sizeof tables / sizeof tables[0])

GP_UNINSTRUMENTED static void *hook_by_name(const char *name) {
    for (size_t t = 0; t < NTABLES; t++)
        for (struct gp_hook *h = tables[t]; h->name != NULL; h++)
            if (strcmp(h->name, name) == 0) return h->wrapper;
    return NULL;
}

/* What a lookup of `name` must answer instead of the real symbol: our wrapper, and our dlsym/dlvsym for
 * the lookup functions themselves (an unwrapped resolver fetched around dlsym would hand out the
 * runtime's hipMalloc). */
GP_UNINSTRUMENTED static void *intercepted(const char *name) {
    if (name[0] == 'd' && name[1] == 'l') {
        if (strcmp(name, "dlsym") == 0) return (void *)dlsym;
        if (strcmp(name, "dlvsym") == 0) return (void *)dlvsym;
        return NULL;
    }
    if (name[0] == 'h' && ((name[1] == 'i' && name[2] == 'p') || (name[1] == 's' && name[2] == 'a' && name[3] == '_')))
        return hook_by_name(name);
    return NULL;
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

/* HIP's entry points have one ABI per name (hipVersion only says whether the caller may have it): the name
 * alone says which wrapper stands in for what the runtime answered. */
GP_EXPORT hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags,
                                       hipDriverProcAddressQueryResult *status) {
    GPH_REAL(hipError_t (*)(const char *, void **, int, uint64_t, hipDriverProcAddressQueryResult *), real,
             "hipGetProcAddress");
    if (real == NULL) return hipErrorNotInitialized;
    hipError_t r = real(symbol, pfn, hipVersion, flags, status);
    if (r == hipSuccess && symbol != NULL && pfn != NULL && *pfn != NULL) {
        void *w = hook_by_name(symbol);
        if (w != NULL) *pfn = w;
    }
    return r;
}
