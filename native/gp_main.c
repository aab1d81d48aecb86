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
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* ---- the real dlsym and dlvsym ------------------------------------------------------------------------ */
typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static dlsym_fn real_dlsym_ptr;
static dlvsym_fn real_dlvsym_ptr;

/* dlsym runs inside sanitizer runtimes' own start-up (they look up the functions they wrap), before their
 * shadow memory exists: the lookup path must not be instrumented. */
#define GP_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

GP_EXPORT void *dlvsym(void *handle, const char *name, const char *version);

GP_UNINSTRUMENTED static dlsym_fn real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (f != NULL) return f;
    f = (dlsym_fn)gp_libc_sym("dlsym", (void *)dlsym, (void *)dlvsym);
    if (f == NULL) {
        fprintf(stderr, "gpupool-hook: cannot find the real dlsym; symbol lookups will fail\n");
        return NULL;
    }
    __atomic_store_n(&real_dlsym_ptr, f, __ATOMIC_RELEASE);
    return f;
}

GP_UNINSTRUMENTED static dlvsym_fn real_dlvsym(void) {
    dlvsym_fn f = __atomic_load_n(&real_dlvsym_ptr, __ATOMIC_ACQUIRE);
    if (f != NULL) return f;
    f = (dlvsym_fn)gp_libc_sym("dlvsym", (void *)dlsym, (void *)dlvsym);
    if (f != NULL) __atomic_store_n(&real_dlvsym_ptr, f, __ATOMIC_RELEASE);
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

/* The environment's caps (GPUPOOL_MEMORY_LIMIT_MIB, GPUPOOL_CORES_PERCENT): counts, or -1 when malformed. */
static int env_caps(const char *name, double *v, int cores) {
    const char *text = getenv(name);
    if (text == NULL || !*text) return 0;
    int n = parse_list(text, v, GP_MAX_DEV);
    for (int i = 0; cores && i < n; i++)
        if (v[i] <= 0 || v[i] > 100) n = -1;
    return n;
}

/* Fail closed: the agent's file is there but cannot be used, so nothing may be allocated and compute is
 * held to 1 %: a tampered or half-written grant never turns into no limit at all. */
static void refuse_everything(struct gp_config *c, const char *why) {
    gp_log("the pod's limits file %s %s: every allocation is refused", GP_LIMITS_PATH, why);
    c->broken = 1;
    c->ndev = GP_MAX_DEV;
    c->by_uuid = 0;
    for (int i = 0; i < GP_MAX_DEV; i++) {
        c->limit[i] = 1;
        c->oversub[i] = 0;
        c->cores_ppm[i] = GP_PPM / 100;
    }
    c->acct_dir[0] = '\0';
}

/* Limits from the agent's read-only file. The mapping stays: the agent rewrites squeeze_ppm in place. */
static int load_limits_file(struct gp_config *c) {
    int fd = open(GP_LIMITS_PATH, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 0;
    c->agent = 1;
    if (fd < 0) {
        refuse_everything(c, strerror(errno));
        return 1;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(struct gp_limits))
        p = mmap(NULL, sizeof(struct gp_limits), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        refuse_everything(c, "is too short or cannot be mapped");
        return 1;
    }
    const struct gp_limits *f = p;
    if (f->magic != GP_LIMITS_MAGIC || f->version != GP_LIMITS_VERSION || f->ndev > GP_MAX_DEV ||
        memchr(f->accounting_dir, '\0', sizeof f->accounting_dir) == NULL) {
        refuse_everything(c, "is not a version 1 limits file");
        return 1;
    }
    c->file = f;
    c->ndev = (int)f->ndev;
    for (int i = 0; i < c->ndev; i++) {
        c->limit[i] = f->limit[i];
        c->oversub[i] = f->limit[i] != 0 ? f->oversub[i] : 0; /* beyond no cap there is nothing to spill */
        uint64_t ppm = f->cores_ppm[i];
        c->cores_ppm[i] = ppm == 0 || ppm >= (uint64_t)GP_PPM ? GP_PPM : (int64_t)ppm;
    }
    c->mode = f->mode == GP_ELASTIC ? GP_ELASTIC : GP_HARD;
    for (int i = 0; i < c->ndev; i++) {
        memcpy(c->uuid[i], f->uuid[i], sizeof c->uuid[i]);
        c->uuid[i][sizeof c->uuid[i] - 1] = '\0';
    }
    c->by_uuid = c->ndev > 0 && c->uuid[0][0] != '\0';
    c->nuuid = c->by_uuid ? c->ndev : 0;
    snprintf(c->acct_dir, sizeof c->acct_dir, "%s", f->accounting_dir);
    return 1;
}

static void load_config(void) {
    const char *lv = getenv("GPUPOOL_HOOK_LOG");
    if (lv != NULL) log_level = atoi(lv);
    struct gp_config *c = &gp_cfg;
    memset(c, 0, sizeof *c);
    for (int i = 0; i < GP_MAX_DEV; i++) c->cores_ppm[i] = GP_PPM;
    /* How often the pod's measurements are read: finer is harmless, coarser only within reason (the pacing
     * between two measurements runs on estimates). */
    c->poll_ms = 20;
    const char *poll = getenv("GPUPOOL_HOOK_POLL_MS");
    if (poll != NULL && atoi(poll) > 0) c->poll_ms = atoi(poll) < 2 ? 2 : atoi(poll) > 50 ? 50 : atoi(poll);

    double mem[GP_MAX_DEV], cores[GP_MAX_DEV];
    int nmem = env_caps("GPUPOOL_MEMORY_LIMIT_MIB", mem, 0);
    if (nmem < 0) gp_log("GPUPOOL_MEMORY_LIMIT_MIB=%.64s is not a comma-separated list of MiB; memory is not capped by it",
                         getenv("GPUPOOL_MEMORY_LIMIT_MIB"));
    int ncores = env_caps("GPUPOOL_CORES_PERCENT", cores, 1);
    if (ncores < 0)
        gp_log("GPUPOOL_CORES_PERCENT=%.64s is not a list of percentages in (0, 100]; compute is not capped by it",
               getenv("GPUPOOL_CORES_PERCENT"));
    const char *mode = getenv("GPUPOOL_CORES_MODE");
    int env_mode = mode != NULL && strcmp(mode, "elastic") == 0 ? GP_ELASTIC : GP_HARD;
    if (mode != NULL && *mode && strcmp(mode, "elastic") != 0 && strcmp(mode, "hard") != 0)
        gp_log("GPUPOOL_CORES_MODE=%.32s is neither hard nor elastic; using hard", mode);

    if (load_limits_file(c)) {
        if (c->broken) return;
        /* The agent's file decides; the environment can only ask for less (a process capping itself). */
        int raised = 0;
        for (int i = 0; i < c->ndev && i < nmem; i++) {
            uint64_t b = (uint64_t)mem[i] * 1024ULL * 1024ULL;
            if (b == 0) continue;
            if (c->limit[i] == 0 || b < c->limit[i]) c->limit[i] = b;
            else raised |= b > c->limit[i];
        }
        for (int i = 0; i < c->ndev && i < ncores; i++) {
            int64_t ppm = (int64_t)(cores[i] * 10000.0 + 0.5);
            if (ppm < c->cores_ppm[i]) c->cores_ppm[i] = ppm;
            else raised |= ppm > c->cores_ppm[i];
        }
        if (c->mode == GP_ELASTIC && mode != NULL && strcmp(mode, "hard") == 0) c->mode = GP_HARD;
        if (raised) gp_log("the environment asks for more than the pod's limits file grants; the file's limits hold");
        const char *dir = getenv("GPUPOOL_HOOK_DIR");
        if (dir != NULL && *dir && strcmp(dir, c->acct_dir) != 0)
            gp_log("GPUPOOL_HOOK_DIR is ignored: the pod's accounting is where its limits file says");
        return;
    }

    /* No limits file: no agent grant, so nothing to protect; the environment caps the process as before. */
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
    int n = nmem > 0 ? nmem : 0, m = ncores > 0 ? ncores : 0;
    for (int i = 0; i < n; i++) c->limit[i] = (uint64_t)mem[i] * 1024ULL * 1024ULL;
    for (int i = 0; i < m; i++) c->cores_ppm[i] = (int64_t)(cores[i] * 10000.0 + 0.5);
    c->ndev = n > m ? n : m;
    if (c->by_uuid && c->ndev > c->nuuid) {
        gp_log("%d limits for %d visible GPUs: the extra limits are ignored", c->ndev, c->nuuid);
        c->ndev = c->nuuid;
    }
    c->mode = env_mode;
    const char *dir = getenv("GPUPOOL_HOOK_DIR");
    if (dir != NULL) snprintf(c->acct_dir, sizeof c->acct_dir, "%s", dir);
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
    dlsym_fn f = real_dlsym();
    if (f == NULL) return NULL;
    void *p = f(handle, name);
    if (p == NULL) return p;
    void *w = intercepted(name);
    return w != NULL ? w : p;
}

GP_EXPORT GP_UNINSTRUMENTED void *dlvsym(void *handle, const char *name, const char *version) {
    dlvsym_fn f = real_dlvsym();
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

static void after_fork_child(void) {
    gp_shared_after_fork();
    gp_mem_after_fork();
    gp_compute_after_fork();
    gp_ident_after_fork();
}

__attribute__((constructor)) static void gp_constructor(void) {
    /* Nothing heavy here: under /etc/ld.so.preload every program of the container loads us. */
    pthread_atfork(NULL, NULL, after_fork_child);
}
