/* Loading and lookup: configuration from the environment, the real driver and NVML, the interposed
 * dlsym, and cuGetProcAddress(_v2), so that every path to a driver entry point reaches our wrappers. */
#include "gp.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


struct gp_config gp_cfg;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int log_level = 1;

int64_t gp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void gp_log(const char *fmt, ...) {
    if (log_level <= 0) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpupool-hook[%d]: %s\n", (int)getpid(), buf);
}

/* ---- real dlsym --------------------------------------------------------------------------------------- */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_ptr;

/* dlsym runs inside sanitizer runtimes' own start-up (they look up the functions they wrap), before their
 * shadow memory exists: the lookup path must not be instrumented. */
#define GP_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

GP_UNINSTRUMENTED static dlsym_fn real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (f != NULL) return f;
    /* dlvsym is not interposed, so asking it for the next "dlsym" never comes back here. The version
     * names are glibc's: 2.34 moved dlsym into libc; older x86-64 and aarch64 builds export these. */
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && f == NULL; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (f == NULL) {
        fprintf(stderr, "gpupool-hook: cannot find the real dlsym; symbol lookups will fail\n");
        return NULL;
    }
    __atomic_store_n(&real_dlsym_ptr, f, __ATOMIC_RELEASE);
    return f;
}

static void *open_lib(void **slot, const char *name) {
    void *h = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (h == NULL) {
        h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (h != NULL) __atomic_store_n(slot, h, __ATOMIC_RELEASE);
    }
    return h;
}

static void *cuda_handle, *nvml_handle;

void *gp_cuda_sym(const char *name) {
    void *h = open_lib(&cuda_handle, "libcuda.so.1");
    dlsym_fn f = real_dlsym();
    return h && f ? f(h, name) : NULL;
}

void *gp_nvml_sym(const char *name) {
    void *h = open_lib(&nvml_handle, "libnvidia-ml.so.1");
    dlsym_fn f = real_dlsym();
    return h && f ? f(h, name) : NULL;
}

/* ---- configuration ------------------------------------------------------------------------------------ */
/* Parse "a,b,c" of non-negative decimals; returns the count, or -1 when any item is not a number. */
static int parse_list(const char *text, double *out, int max) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno != 0 || v != v || v < 0) return -1;
        while (*end == ' ') end++;
        if (*end != ',' && *end != '\0') return -1;
        if (n == max) return -1;
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0') return -1;
    }
    return n;
}

static void load_config(void) {
    const char *lv = getenv("GPUPOOL_HOOK_LOG");
    if (lv != NULL) log_level = atoi(lv);
    struct gp_config *c = &gp_cfg;
    memset(c, 0, sizeof *c);
    for (int i = 0; i < GP_MAX_DEV; i++) c->cores_ppm[i] = GP_PPM;
    c->poll_ms = 20;
    const char *poll = getenv("GPUPOOL_HOOK_POLL_MS");
    if (poll != NULL && atoi(poll) > 0) c->poll_ms = atoi(poll);

    const char *vis = getenv("NVIDIA_VISIBLE_DEVICES");
    if (vis != NULL && (strncmp(vis, "GPU-", 4) == 0 || strncmp(vis, "MIG-", 4) == 0)) {
        c->by_uuid = 1;
        const char *p = vis;
        while (*p && c->nuuid < GP_MAX_DEV) {
            size_t len = strcspn(p, ",");
            size_t keep = len < 63 ? len : 63;
            memcpy(c->uuid[c->nuuid], p, keep);
            c->uuid[c->nuuid][keep] = '\0';
            c->nuuid++;
            p += len;
            if (*p == ',') p++;
        }
    }

    double v[GP_MAX_DEV];
    const char *mem = getenv("GPUPOOL_MEMORY_LIMIT_MIB");
    int n = 0;
    if (mem != NULL && *mem) {
        n = parse_list(mem, v, GP_MAX_DEV);
        if (n < 0) {
            gp_log("GPUPOOL_MEMORY_LIMIT_MIB=%.64s is not a comma-separated list of MiB; memory is not capped", mem);
            n = 0;
        }
        for (int i = 0; i < n; i++) c->limit[i] = (uint64_t)v[i] * 1024ULL * 1024ULL;
    }
    const char *cores = getenv("GPUPOOL_CORES_PERCENT");
    int m = 0;
    if (cores != NULL && *cores) {
        m = parse_list(cores, v, GP_MAX_DEV);
        for (int i = 0; i < m; i++)
            if (v[i] <= 0 || v[i] > 100) m = -1;
        if (m < 0) {
            gp_log("GPUPOOL_CORES_PERCENT=%.64s is not a list of percentages in (0, 100]; compute is not capped",
                   cores);
            m = 0;
        }
        for (int i = 0; i < m; i++) c->cores_ppm[i] = (int64_t)(v[i] * 10000.0 + 0.5);
    }
    c->ndev = n > m ? n : m;
    if (c->by_uuid && c->ndev > c->nuuid) {
        gp_log("%d limits for %d visible GPUs: the extra limits are ignored", c->ndev, c->nuuid);
        c->ndev = c->nuuid;
    }
    const char *mode = getenv("GPUPOOL_CORES_MODE");
    if (mode != NULL && strcmp(mode, "elastic") == 0) c->mode = GP_ELASTIC;
    else if (mode != NULL && *mode && strcmp(mode, "hard") != 0)
        gp_log("GPUPOOL_CORES_MODE=%.32s is neither hard nor elastic; using hard", mode);
}

void gp_init(void) { pthread_once(&init_once, load_config); }

/* ---- device mapping ----------------------------------------------------------------------------------- */
static int ordinal_map[64];
static pthread_once_t map_once = PTHREAD_ONCE_INIT;
static void map_reset(void) {
    for (int i = 0; i < 64; i++) ordinal_map[i] = -2;
}

static void format_uuid(const CUuuid *u, char *out, size_t size) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int gp_device_index(CUdevice dev) {
    gp_init();
    if (gp_cfg.ndev == 0 || dev < 0) return -1;
    if (!gp_cfg.by_uuid) return dev < gp_cfg.ndev ? dev : -1;
    pthread_once(&map_once, map_reset);
    if (dev < 64 && ordinal_map[dev] != -2) return ordinal_map[dev];
    int found = -1;
    typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);
    uuid_fn get = (uuid_fn)gp_cuda_sym("cuDeviceGetUuid_v2");
    if (get == NULL) get = (uuid_fn)gp_cuda_sym("cuDeviceGetUuid");
    CUuuid u;
    if (get != NULL && get(&u, dev) == CUDA_SUCCESS) {
        char text[64];
        format_uuid(&u, text, sizeof text);
        for (int i = 0; i < gp_cfg.ndev; i++)
            if (strcasecmp(text, gp_cfg.uuid[i]) == 0) found = i;
    }
    if (found < 0 && dev < gp_cfg.ndev) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            gp_log("device %d: its UUID is not in NVIDIA_VISIBLE_DEVICES; using the limit at its ordinal", dev);
        found = dev;
    }
    if (dev < 64) ordinal_map[dev] = found;
    return found;
}

int gp_current_index(void) {
    gp_init();
    if (gp_cfg.ndev == 0) return -1;
    if (gp_cfg.ndev == 1 && gp_cfg.nuuid <= 1) return 0; /* one GPU in the container: no driver call */
    GP_REAL(CUresult (*)(CUdevice *), get, "cuCtxGetDevice");
    CUdevice d;
    if (get == NULL || get(&d) != CUDA_SUCCESS) return -1;
    return gp_device_index(d);
}

/* ---- the hook table ----------------------------------------------------------------------------------- */
/* Each module lists its own wrappers (with their real types, cast to void * as POSIX dlsym does). */
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
static struct gp_hook *tables[] = {lookup_hooks, gp_mem_hooks, gp_compute_hooks, gp_nvml_hooks};
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

/* cuGetProcAddress answers with the driver's own entry point for the ABI version the caller asked for;
 * finding which exported symbol that pointer is tells which of our wrappers has the same ABI. */
static void *substitute(void *p, const char *symbol) {
    pthread_once(&hooks_once, resolve_hooks);
    FOR_HOOKS(h) {
        if (h->real == p) return h->wrapper;
        if (h->wrapper == p) return p; /* already ours (the driver looked it up through our dlsym) */
    }
    size_t len = strlen(symbol);
    FOR_HOOKS(h) {
        if (strncmp(h->name, symbol, len) == 0 && (h->name[len] == '\0' || h->name[len] == '_')) {
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                gp_log("cuGetProcAddress(%.64s) gave an entry point that is not an exported symbol; "
                       "it is not intercepted", symbol);
            return p;
        }
    }
    return p;
}

GP_EXPORT GP_UNINSTRUMENTED void *dlsym(void *handle, const char *name) {
    dlsym_fn f = real_dlsym();
    if (f == NULL) return NULL;
    void *p = f(handle, name);
    if (p == NULL) return p;
    if ((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0) {
        void *w = hook_by_name(name);
        if (w != NULL) return w;
    }
    return p;
}

GP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    GP_REAL(gpa_fn, real, "cuGetProcAddress");
    if (real == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL) *pfn = substitute(*pfn, symbol);
    return r;
}

GP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status) {
    GP_REAL(gpa2_fn, real, "cuGetProcAddress_v2");
    if (real == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL) *pfn = substitute(*pfn, symbol);
    return r;
}

static void after_fork_child(void) {
    gp_shared_after_fork();
    gp_mem_after_fork();
    gp_compute_after_fork();
}

__attribute__((constructor)) static void gp_constructor(void) {
    /* Nothing heavy here: under /etc/ld.so.preload every program of the container loads us. */
    pthread_atfork(NULL, NULL, after_fork_child);
}
