/* A stand-in for an interception library whose compute pacing does not work: it holds a process to the
 * memory cap in GPUPOOL_MEMORY_LIMIT_MIB (its first value) and reports that cap as the GPU's total, but
 * passes every kernel launch straight to the driver, or, with STUB_STARVE_US=N, only after sleeping N
 * microseconds (a pacing that starves its tenant). The `isolation` check must fail on it either way.
 * Programs reach the driver through dlsym (ctypes does), so that is what it answers, as the real library does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef void *(*dlsym_fn)(void *, const char *);
static size_t used;

static dlsym_fn real_dlsym(void) {
    static dlsym_fn fn;
    if (fn == NULL) fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (fn == NULL) fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return fn;
}
static size_t cap(void) {
    const char *v = getenv("GPUPOOL_MEMORY_LIMIT_MIB");
    return v != NULL ? (size_t)strtoull(v, NULL, 10) << 20 : 0;
}
static void *driver(const char *name) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return cuda != NULL ? real_dlsym()(cuda, name) : NULL;
}
static CUresult mem_alloc(unsigned long long *p, size_t n) {
    if (used + n > cap()) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    CUresult r = ((CUresult(*)(unsigned long long *, size_t))driver("cuMemAlloc_v2"))(p, n);
    if (r == 0) used += n;
    return r;
}
static CUresult mem_info(size_t *free_bytes, size_t *total) {
    *total = cap();
    *free_bytes = cap() - used;
    return 0;
}
typedef CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                              void **, void **);
static CUresult launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shm, void *stream, void **params, void **extra) {
    const char *starve = getenv("STUB_STARVE_US");
    if (starve != NULL) usleep((useconds_t)strtoul(starve, NULL, 10));
    return ((launch_fn)driver("cuLaunchKernel"))(f, gx, gy, gz, bx, by, bz, shm, stream, params, extra);
}
void *dlsym(void *handle, const char *name) {
    if (strcmp(name, "cuLaunchKernel") == 0) return (void *)launch;
    if (strcmp(name, "cuMemAlloc_v2") == 0) return (void *)mem_alloc;
    if (strcmp(name, "cuMemGetInfo_v2") == 0) return (void *)mem_info;
    return real_dlsym()(handle, name);
}
