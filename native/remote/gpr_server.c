/* gpupool-gpu-server: runs the CUDA driver calls of remote clients (gpr_client.c) on this node's GPUs.
 *
 *   gpupool-gpu-server --listen tcp:HOST:PORT|unix:PATH --tokens FILE [--hook LIB] [--cuda LIB]
 *                      [--limits-fd N] [--message-timeout-ms MS] [--max-clients N]
 *
 * The listener never touches the GPU. Each connection gets a child that reads the hello, checks the token
 * against FILE (lines "TOKEN SHARE_DIR"; the file must belong to the server's user and be private to it),
 * then execs this program again as that connection's worker, with gpupool's interception library
 * preloaded and the share's limits file where the library reads it: the share's memory cap and compute
 * pacing are then the very code and limits a local `hook` container runs under, in a process the tenant
 * cannot reach. One process per connection (= per client context) means everything a client holds on the
 * GPU is released by the kernel and the driver when that process exits, whichever way its client went.
 *
 * Where the limits file goes: by default into a private mount namespace of the worker, bound read-only on
 * /run/gpupool/limits (the path the production library reads; needs CAP_SYS_ADMIN, as the agent has).
 * --limits-fd N instead hands it over as descriptor N, for a library built with
 * GP_LIMITS_PATH=/proc/self/fd/N (the native tests' build). */
#define _GNU_SOURCE
#include "gpr.h"
#include "../gp.h" /* struct gp_limits: the share's limits file */

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

/* What one client may hold: bounded so that one tenant cannot grow the server without end. */
#define MAX_ALLOCS 65536
#define MAX_MODULES 1024
#define MAX_FUNCS 16384
#define MAX_STREAMS 1024
#define MAX_EVENTS 16384
#define HELLO_TIMEOUT_MS 5000

extern char **environ;

static const char *prog = "gpupool-gpu-server";

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s[%d]: %s\n", prog, (int)getpid(), line);
}

static int reply(int fd, uint32_t result, const void *data, uint32_t len) {
    struct gpr_hdr h = {result, 0, len};
    if (len > 0 && len <= 4096) { /* small replies leave in one write: one wake-up of the client, not two */
        unsigned char one[sizeof h + 4096];
        memcpy(one, &h, sizeof h);
        memcpy(one + sizeof h, data, len);
        return gpr_write_full(fd, one, sizeof h + len);
    }
    if (gpr_write_full(fd, &h, sizeof h) != 0) return -1;
    return len > 0 ? gpr_write_full(fd, data, len) : 0;
}

/* The worker's reads go through a buffer: a pipelined client's requests arrive many to a segment, and one
 * recv then serves them all. deadline_ms as gpr_read_full's. */
static unsigned char rbuf[65536];
static size_t rpos, rlen;
static int buffered_read(int fd, void *dst, size_t n, int64_t deadline_ms) {
    unsigned char *d = dst;
    while (n > 0) {
        if (rpos < rlen) {
            size_t k = rlen - rpos < n ? rlen - rpos : n;
            memcpy(d, rbuf + rpos, k);
            rpos += k;
            d += k;
            n -= k;
            continue;
        }
        if (n >= sizeof rbuf / 2) return gpr_read_full(fd, d, n, deadline_ms); /* bulk data: straight in */
        if (deadline_ms >= 0) {
            int64_t left = deadline_ms - gpr_now_ms();
            struct pollfd pf = {fd, POLLIN, 0};
            if (left <= 0) return -1;
            int r = poll(&pf, 1, left > 1000000 ? 1000000 : (int)left);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return -1;
        }
        ssize_t got = recv(fd, rbuf, sizeof rbuf, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        rpos = 0;
        rlen = (size_t)got;
    }
    return 0;
}

/* ======================================= the worker ====================================================== */
static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*HtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*DtoH)(void *, CUdeviceptr, size_t);
    CUresult (*DtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*DtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*DtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*MemsetD16)(CUdeviceptr, unsigned short, size_t);
    CUresult (*MemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned int, size_t);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*ModuleLoadData)(void **, const void *);
    CUresult (*ModuleUnload)(void *);
    CUresult (*ModuleGetFunction)(CUfunction *, void *, const char *);
    CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*StreamCreateWithPriority)(CUstream *, unsigned, int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    /* the VMM calls a migrated allocation is rebuilt with, at the device address it had */
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const void *, size_t);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
} drv;

struct func {
    CUfunction f;
    uint32_t module;       /* 0 = free slot */
    uint32_t nparams;      /* GPR_PARAMS_UNKNOWN when the driver cannot describe them */
    uint32_t *layout;      /* nparams x (offset, size) */
    char *name;            /* kept for a migration, which looks it up again on the target */
};

/* Every live allocation, for a migration (and for the bound on how many a client holds). */
struct arec {
    uint64_t ptr, bytes;
    int64_t region;                    /* rebuilt by a migration: its region (below); -1 = cuMemAlloc'd */
};
static struct arec *arecs;
static size_t narecs, arecs_cap;

/* Memory a migration rebuilt: one VMM mapping per run of allocations whose granularity-aligned spans touch
 * (the driver packs small allocations closer than its 2 MiB mapping granularity, so each cannot have a
 * mapping of its own at its address). Freed when the last allocation in it is. */
struct region {
    uint64_t base, size;
    CUmemGenericAllocationHandle handle;
    uint32_t users;
};
static struct region *regions;
static size_t nregions;

static int conn = -1;
static int64_t msg_timeout_ms = 30000;
static CUcontext ctx;
static int device_ordinal;
static uint32_t deferred;          /* the first error of a request that got no reply, not yet reported */
static void *modules[MAX_MODULES];
static unsigned char *module_image[MAX_MODULES]; /* as loaded, for a migration */
static uint32_t module_len[MAX_MODULES];
static uint32_t stream_flags[MAX_STREAMS], event_flags[MAX_EVENTS];
static int32_t stream_prio[MAX_STREAMS];
static volatile sig_atomic_t move_asked; /* SIGUSR1: move this client to the server named in SHARE/move-to */
static unsigned char *in;          /* the request being handled (static: reachable to the end) */
static size_t incap;
static struct func funcs[MAX_FUNCS];
static CUstream streams[MAX_STREAMS];
static unsigned char stream_used[MAX_STREAMS];
static CUevent events[MAX_EVENTS];
static unsigned char event_used[MAX_EVENTS];

static void load_driver(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        say("cannot load the driver %s: %s", path, dlerror());
        exit(3);
    }
    /* Looked up with dlsym so that the preloaded interception library answers with its wrappers: the
     * worker's calls are accounted and paced exactly as a local program's are. */
#define R(field, name) *(void **)&drv.field = dlsym(h, name)
    R(Init, "cuInit"); R(DriverGetVersion, "cuDriverGetVersion"); R(DeviceGetCount, "cuDeviceGetCount");
    R(DeviceGet, "cuDeviceGet"); R(DeviceGetName, "cuDeviceGetName"); R(DeviceGetUuid, "cuDeviceGetUuid_v2");
    if (drv.DeviceGetUuid == NULL) R(DeviceGetUuid, "cuDeviceGetUuid");
    R(DeviceTotalMem, "cuDeviceTotalMem_v2"); R(DeviceGetAttribute, "cuDeviceGetAttribute");
    R(CtxCreate, "cuCtxCreate_v2"); R(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    R(CtxSetCurrent, "cuCtxSetCurrent"); R(CtxSynchronize, "cuCtxSynchronize");
    R(MemGetInfo, "cuMemGetInfo_v2"); R(MemAlloc, "cuMemAlloc_v2"); R(MemFree, "cuMemFree_v2");
    R(HtoD, "cuMemcpyHtoD_v2"); R(HtoDAsync, "cuMemcpyHtoDAsync_v2");
    R(DtoH, "cuMemcpyDtoH_v2"); R(DtoHAsync, "cuMemcpyDtoHAsync_v2");
    R(DtoD, "cuMemcpyDtoD_v2"); R(DtoDAsync, "cuMemcpyDtoDAsync_v2");
    R(MemsetD8, "cuMemsetD8_v2"); R(MemsetD8Async, "cuMemsetD8Async");
    R(MemsetD16, "cuMemsetD16_v2"); R(MemsetD16Async, "cuMemsetD16Async");
    R(MemsetD32, "cuMemsetD32_v2"); R(MemsetD32Async, "cuMemsetD32Async");
    R(ModuleLoadData, "cuModuleLoadData"); R(ModuleUnload, "cuModuleUnload");
    R(ModuleGetFunction, "cuModuleGetFunction"); R(FuncGetParamInfo, "cuFuncGetParamInfo");
    R(LaunchKernel, "cuLaunchKernel"); R(StreamCreateWithPriority, "cuStreamCreateWithPriority");
    R(StreamDestroy, "cuStreamDestroy_v2"); R(StreamSynchronize, "cuStreamSynchronize");
    R(StreamQuery, "cuStreamQuery"); R(StreamWaitEvent, "cuStreamWaitEvent");
    R(EventCreate, "cuEventCreate"); R(EventDestroy, "cuEventDestroy_v2"); R(EventRecord, "cuEventRecord");
    R(EventSynchronize, "cuEventSynchronize"); R(EventQuery, "cuEventQuery");
    R(EventElapsedTime, "cuEventElapsedTime");
    R(MemAddressReserve, "cuMemAddressReserve"); R(MemAddressFree, "cuMemAddressFree");
    R(MemCreate, "cuMemCreate"); R(MemRelease, "cuMemRelease"); R(MemMap, "cuMemMap"); R(MemUnmap, "cuMemUnmap");
    R(MemSetAccess, "cuMemSetAccess"); R(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
#undef R
}

/* A driver entry point this driver lacks answers NOT_SUPPORTED instead of crashing the worker. */
#define CALL(field, ...) (drv.field != NULL ? drv.field(__VA_ARGS__) : GPR_CUDA_ERROR_NOT_SUPPORTED)

static int stream_of(uint32_t id, CUstream *out) {
    if (id == 0 || id == GPR_STREAM_LEGACY || id == GPR_STREAM_PER_THREAD) {
        *out = (CUstream)(uintptr_t)id;
        return 0;
    }
    if (id < GPR_FIRST_ID || id >= MAX_STREAMS || !stream_used[id]) return -1;
    *out = streams[id];
    return 0;
}

static int event_of(uint32_t id, CUevent *out) {
    if (id < GPR_FIRST_ID || id >= MAX_EVENTS || !event_used[id]) return -1;
    *out = events[id];
    return 0;
}

static uint32_t free_slot(const unsigned char *used, uint32_t n) {
    for (uint32_t i = GPR_FIRST_ID; i < n; i++)
        if (!used[i]) return i;
    return 0;
}

static int reserve_arec(void) {
    if (narecs < arecs_cap) return 0;
    size_t cap = arecs_cap ? arecs_cap * 2 : 64;
    struct arec *a = realloc(arecs, cap * sizeof *a);
    if (a == NULL) return -1;
    arecs = a;
    arecs_cap = cap;
    return 0;
}

static CUresult free_alloc(uint64_t p) {
    size_t i = 0;
    while (i < narecs && arecs[i].ptr != p) i++;
    if (i == narecs) return CALL(MemFree, p); /* not ours: the driver gives the error it gives */
    CUresult res = CUDA_SUCCESS;
    if (arecs[i].region < 0) {
        res = CALL(MemFree, p);
    } else {
        struct region *g = &regions[arecs[i].region];
        if (--g->users == 0) {
            res = CALL(MemUnmap, g->base, g->size);
            if (res == CUDA_SUCCESS) res = CALL(MemRelease, g->handle);
            if (res == CUDA_SUCCESS) res = CALL(MemAddressFree, g->base, g->size);
        }
    }
    if (res == CUDA_SUCCESS) arecs[i] = arecs[--narecs];
    return res;
}

static int by_ptr(const void *a, const void *b) {
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return x < y ? -1 : x > y;
}

/* Memory mapped at exactly [base, base + size) (granularity-aligned), or an error: the range is taken. */
static CUresult map_region(uint64_t base, uint64_t size, const CUmemAllocationProp *prop,
                           CUmemGenericAllocationHandle *h) {
    CUdeviceptr got = 0;
    CUresult res = CALL(MemAddressReserve, &got, size, 0, base, 0);
    if (res != CUDA_SUCCESS) return res;
    if (got != base) {
        CALL(MemAddressFree, got, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    res = CALL(MemCreate, h, size, prop, 0);
    if (res == CUDA_SUCCESS) {
        res = CALL(MemMap, base, size, 0, *h, 0);
        if (res != CUDA_SUCCESS) CALL(MemRelease, *h);
    }
    if (res == CUDA_SUCCESS) {
        struct { int type, id, flags; } access = {1, prop->location.id, 3}; /* CUmemAccessDesc: read-write */
        res = CALL(MemSetAccess, base, size, &access, 1);
        if (res != CUDA_SUCCESS) {
            CALL(MemUnmap, base, size);
            CALL(MemRelease, *h);
        }
    }
    if (res != CUDA_SUCCESS) CALL(MemAddressFree, base, size);
    return res;
}

/* A migration's allocations, all at once (n x (u64 pointer, u64 bytes)): each at the device address the
 * program knows (docs/remote.md), runs of neighbours sharing one mapping. */
static CUresult restore_allocs(const unsigned char *p, uint32_t n) {
    if (n == 0) return CUDA_SUCCESS;
    if (narecs + n > MAX_ALLOCS) return CUDA_ERROR_OUT_OF_MEMORY;
    if (arecs_cap < narecs + n) {
        struct arec *a = realloc(arecs, (narecs + n) * sizeof *a);
        if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        arecs = a;
        arecs_cap = narecs + n;
    }
    uint64_t *list = malloc((size_t)n * 16);
    if (list == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(list, p, (size_t)n * 16);
    qsort(list, n, 16, by_ptr);
    CUdevice dev = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    size_t gran = 0;
    CUresult res = CALL(DeviceGet, &dev, device_ordinal);
    prop.location.id = dev;
    if (res == CUDA_SUCCESS) res = CALL(MemGetAllocationGranularity, &gran, &prop, 0);
    if (gran == 0) gran = 1;
    for (uint32_t i = 0; i < n && res == CUDA_SUCCESS;) {
        uint64_t lo = list[2 * i] / gran * gran, hi = lo;
        uint32_t j = i;
        do { /* sorted: the next allocation shares the mapping if it starts before this run's aligned end */
            uint64_t bytes = list[2 * j + 1] ? list[2 * j + 1] : 1;
            uint64_t end = (list[2 * j] + bytes + gran - 1) / gran * gran;
            if (end > hi) hi = end;
            j++;
        } while (j < n && list[2 * j] < hi);
        struct region *g = realloc(regions, (nregions + 1) * sizeof *g);
        if (g == NULL) {
            res = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        regions = g;
        struct region *r = &regions[nregions];
        *r = (struct region){lo, hi - lo, 0, 0};
        res = map_region(lo, hi - lo, &prop, &r->handle);
        if (res != CUDA_SUCCESS) break;
        for (uint32_t k = i; k < j; k++) {
            arecs[narecs++] = (struct arec){list[2 * k], list[2 * k + 1], (int64_t)nregions};
            r->users++;
        }
        nregions++;
        i = j;
    }
    free(list);
    return res;
}

static void keep_image(uint32_t id, const unsigned char *image, uint32_t len) {
    free(module_image[id]);
    module_image[id] = malloc(len ? len : 1);
    module_len[id] = module_image[id] != NULL ? len : 0;
    if (module_image[id] != NULL) memcpy(module_image[id], image, len);
}

/* Table entry `id` for function f of module mid: its parameter layout as the driver describes it. */
static CUresult describe(uint32_t id, CUfunction f, uint32_t mid, const char *name) {
    uint32_t layout[2 * GPR_MAX_PARAMS], n = 0;
    if (drv.FuncGetParamInfo == NULL) n = GPR_PARAMS_UNKNOWN;
    while (n < GPR_MAX_PARAMS) {
        size_t off = 0, size = 0;
        if (drv.FuncGetParamInfo(f, n, &off, &size) != CUDA_SUCCESS) break;
        if (off > GPR_MAX_MSG || size > GPR_MAX_MSG) return GPR_CUDA_ERROR_NOT_SUPPORTED;
        layout[2 * n] = (uint32_t)off;
        layout[2 * n + 1] = (uint32_t)size;
        n++;
    }
    uint32_t count = n == GPR_PARAMS_UNKNOWN ? 0 : n;
    funcs[id] = (struct func){f, mid, n, NULL, strdup(name)};
    if (count > 0) {
        funcs[id].layout = malloc(count * 8);
        if (funcs[id].layout == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(funcs[id].layout, layout, count * 8);
    }
    return CUDA_SUCCESS;
}

/* Payload readers: each checks the length, so a short message is an error reply, never an overread. */
struct rd {
    const unsigned char *p;
    uint32_t left;
    int bad;
};
static uint32_t rd_u32(struct rd *r) {
    uint32_t v = 0;
    if (r->left < 4) {
        r->bad = 1;
        return 0;
    }
    memcpy(&v, r->p, 4);
    r->p += 4;
    r->left -= 4;
    return v;
}
static uint64_t rd_u64(struct rd *r) {
    uint64_t v = 0;
    if (r->left < 8) {
        r->bad = 1;
        return 0;
    }
    memcpy(&v, r->p, 8);
    r->p += 8;
    r->left -= 8;
    return v;
}

static unsigned char *outbuf;
static size_t outcap;
static unsigned char *out_room(size_t n) {
    if (n > outcap) {
        unsigned char *p = realloc(outbuf, n);
        if (p == NULL) return NULL;
        outbuf = p;
        outcap = n;
    }
    return outbuf;
}

/* GPR_OP_STATE: everything a target worker needs to stand in for this one (gpr.h, struct gpr_state_head). */
static uint32_t op_state(uint32_t *olen) {
    struct gpr_state_head h = {(uint32_t)narecs, 0, 0, 0, 0};
    size_t size = sizeof h + narecs * 16;
    for (uint32_t i = 1; i < MAX_MODULES; i++)
        if (modules[i] != NULL) h.nmodules++, size += 8;
    for (uint32_t i = 1; i < MAX_FUNCS; i++)
        if (funcs[i].module != 0) h.nfuncs++, size += 12 + strlen(funcs[i].name) + 1;
    for (uint32_t i = GPR_FIRST_ID; i < MAX_STREAMS; i++)
        if (stream_used[i]) h.nstreams++, size += 12;
    for (uint32_t i = GPR_FIRST_ID; i < MAX_EVENTS; i++)
        if (event_used[i]) h.nevents++, size += 8;
    if (size > GPR_MAX_MSG) return GPR_CUDA_ERROR_NOT_SUPPORTED;
    unsigned char *o = out_room(size), *p = o;
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
#define PUT(v) (memcpy(p, &(v), sizeof(v)), p += sizeof(v))
    PUT(h);
    for (size_t i = 0; i < narecs; i++) {
        PUT(arecs[i].ptr);
        PUT(arecs[i].bytes);
    }
    for (uint32_t i = 1; i < MAX_MODULES; i++)
        if (modules[i] != NULL) {
            PUT(i);
            PUT(module_len[i]);
        }
    for (uint32_t i = 1; i < MAX_FUNCS; i++)
        if (funcs[i].module != 0) {
            uint32_t len = (uint32_t)strlen(funcs[i].name) + 1;
            PUT(i);
            PUT(funcs[i].module);
            PUT(len);
            memcpy(p, funcs[i].name, len);
            p += len;
        }
    for (uint32_t i = GPR_FIRST_ID; i < MAX_STREAMS; i++)
        if (stream_used[i]) {
            PUT(i);
            PUT(stream_flags[i]);
            PUT(stream_prio[i]);
        }
    for (uint32_t i = GPR_FIRST_ID; i < MAX_EVENTS; i++)
        if (event_used[i]) {
            PUT(i);
            PUT(event_flags[i]);
        }
#undef PUT
    *olen = (uint32_t)size;
    return CUDA_SUCCESS;
}

/* One request; returns the result and sets *olen to the reply's payload length (in outbuf). */
static uint32_t handle(uint32_t op, struct rd *r, uint32_t *olen) {
    *olen = 0;
    if (op <= GPR_OP_HELLO || op >= GPR_OP_COUNT) return GPR_CUDA_ERROR_NOT_SUPPORTED;
    if (op != GPR_OP_DEVICES && op != GPR_OP_CTX_CREATE && ctx == NULL) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    switch (op) {
    case GPR_OP_DEVICES: {
        struct gpr_devices *d = (struct gpr_devices *)(void *)out_room(sizeof *d);
        if (d == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        memset(d, 0, sizeof *d);
        int v = 0, n = 0;
        CALL(DriverGetVersion, &v);
        CUresult res = CALL(DeviceGetCount, &n);
        if (res != CUDA_SUCCESS) return (uint32_t)res;
        d->driver_version = v;
        d->count = n > GPR_MAX_DEV ? GPR_MAX_DEV : n;
        for (int i = 0; i < d->count; i++) {
            CUdevice dev = 0;
            CALL(DeviceGet, &dev, i);
            CALL(DeviceGetName, d->dev[i].name, (int)sizeof d->dev[i].name, dev);
            d->dev[i].name[GPR_MAX_NAME - 1] = '\0';
            CUuuid u;
            memset(&u, 0, sizeof u);
            CALL(DeviceGetUuid, &u, dev);
            memcpy(d->dev[i].uuid, u.bytes, 16);
            size_t total = 0;
            CALL(DeviceTotalMem, &total, dev);
            d->dev[i].total_mem = total;
            for (int a = 0; a < GPR_NATTR; a++) {
                int value = 0;
                d->dev[i].attr[a] = a > 0 && CALL(DeviceGetAttribute, &value, a, dev) == CUDA_SUCCESS ? value : INT32_MIN;
            }
        }
        *olen = sizeof *d;
        return CUDA_SUCCESS;
    }
    case GPR_OP_CTX_CREATE: {
        uint32_t dev = rd_u32(r), flags = rd_u32(r), primary = rd_u32(r);
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        if (ctx != NULL) return CUDA_ERROR_INVALID_VALUE; /* one context per connection */
        CUdevice d = 0;
        CUresult res = CALL(DeviceGet, &d, (int)dev);
        if (res != CUDA_SUCCESS) return (uint32_t)res;
        device_ordinal = (int)dev;
        res = primary ? CALL(PrimaryCtxRetain, &ctx, d) : CALL(CtxCreate, &ctx, flags, d);
        if (res == CUDA_SUCCESS) res = CALL(CtxSetCurrent, ctx);
        if (res != CUDA_SUCCESS) ctx = NULL;
        return (uint32_t)res;
    }
    case GPR_OP_CTX_SYNC: return (uint32_t)CALL(CtxSynchronize);
    case GPR_OP_MEM_INFO: {
        size_t f = 0, t = 0;
        CUresult res = CALL(MemGetInfo, &f, &t);
        uint64_t *o = (uint64_t *)(void *)out_room(16);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        o[0] = f;
        o[1] = t;
        *olen = 16;
        return (uint32_t)res;
    }
    case GPR_OP_MEM_ALLOC: {
        uint64_t n = rd_u64(r);
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        if (narecs >= MAX_ALLOCS || reserve_arec() != 0) return CUDA_ERROR_OUT_OF_MEMORY;
        CUdeviceptr p = 0;
        CUresult res = CALL(MemAlloc, &p, (size_t)n);
        if (res == CUDA_SUCCESS) arecs[narecs++] = (struct arec){p, n, -1};
        uint64_t *o = (uint64_t *)(void *)out_room(8);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        *o = p;
        *olen = 8;
        return (uint32_t)res;
    }
    case GPR_OP_MEM_FREE: {
        uint64_t p = rd_u64(r);
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        return (uint32_t)free_alloc(p);
    }
    case GPR_OP_HTOD: {
        uint64_t dst = rd_u64(r);
        uint32_t sid = rd_u32(r), async = rd_u32(r);
        CUstream s;
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        if (stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        /* The payload buffer is reused by the next message: the driver has taken a pageable source in
         * before an async copy returns (it stages it), so handing it over is safe. */
        return (uint32_t)(async ? CALL(HtoDAsync, dst, r->p, r->left, s) : CALL(HtoD, dst, r->p, r->left));
    }
    case GPR_OP_DTOH: {
        uint64_t src = rd_u64(r), n = rd_u64(r);
        uint32_t sid = rd_u32(r), async = rd_u32(r);
        CUstream s;
        if (r->bad || n > GPR_MAX_MSG) return CUDA_ERROR_INVALID_VALUE;
        if (stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        unsigned char *o = out_room(n ? n : 1);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult res = async ? CALL(DtoHAsync, o, src, n, s) : CALL(DtoH, o, src, n);
        if (async && res == CUDA_SUCCESS) res = CALL(StreamSynchronize, s); /* the data leaves with the reply */
        if (res == CUDA_SUCCESS) *olen = (uint32_t)n;
        return (uint32_t)res;
    }
    case GPR_OP_DTOD: {
        uint64_t dst = rd_u64(r), src = rd_u64(r), n = rd_u64(r);
        uint32_t sid = rd_u32(r), async = rd_u32(r);
        CUstream s;
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        if (stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        return (uint32_t)(async ? CALL(DtoDAsync, dst, src, n, s) : CALL(DtoD, dst, src, n));
    }
    case GPR_OP_MEMSET: {
        uint64_t dst = rd_u64(r), n = rd_u64(r);
        uint32_t value = rd_u32(r), size = rd_u32(r), sid = rd_u32(r), async = rd_u32(r);
        CUstream s;
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        if (stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        if (size == 1)
            return (uint32_t)(async ? CALL(MemsetD8Async, dst, (unsigned char)value, n, s)
                                    : CALL(MemsetD8, dst, (unsigned char)value, n));
        if (size == 2)
            return (uint32_t)(async ? CALL(MemsetD16Async, dst, (unsigned short)value, n, s)
                                    : CALL(MemsetD16, dst, (unsigned short)value, n));
        if (size == 4)
            return (uint32_t)(async ? CALL(MemsetD32Async, dst, value, n, s) : CALL(MemsetD32, dst, value, n));
        return CUDA_ERROR_INVALID_VALUE;
    }
    case GPR_OP_MODULE_LOAD: {
        uint32_t id = 0;
        for (uint32_t i = 1; i < MAX_MODULES && id == 0; i++)
            if (modules[i] == NULL) id = i;
        if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
        if (r->left == 0) return GPR_CUDA_ERROR_INVALID_IMAGE;
        /* The image is handed over as it came; a text image (PTX) must end with its NUL, which the client
         * sends, and the check keeps a driver from reading past a hostile one. */
        void *m = NULL;
        CUresult res = CALL(ModuleLoadData, &m, r->p);
        if (res != CUDA_SUCCESS) return (uint32_t)res;
        modules[id] = m;
        keep_image(id, r->p, r->left);
        uint32_t *o = (uint32_t *)(void *)out_room(4);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        *o = id;
        *olen = 4;
        return CUDA_SUCCESS;
    }
    case GPR_OP_MODULE_UNLOAD: {
        uint32_t id = rd_u32(r);
        if (r->bad || id == 0 || id >= MAX_MODULES || modules[id] == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
        CUresult res = CALL(ModuleUnload, modules[id]);
        modules[id] = NULL;
        free(module_image[id]);
        module_image[id] = NULL;
        for (uint32_t i = 1; i < MAX_FUNCS; i++) {
            if (funcs[i].module == id) {
                free(funcs[i].layout);
                free(funcs[i].name);
                memset(&funcs[i], 0, sizeof funcs[i]);
            }
        }
        return (uint32_t)res;
    }
    case GPR_OP_GET_FUNCTION: {
        uint32_t mid = rd_u32(r);
        if (r->bad || mid == 0 || mid >= MAX_MODULES || modules[mid] == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
        if (r->left == 0 || r->left > GPR_MAX_NAME || memchr(r->p, '\0', r->left) == NULL)
            return CUDA_ERROR_INVALID_VALUE;
        CUfunction f = NULL;
        CUresult res = CALL(ModuleGetFunction, &f, modules[mid], (const char *)r->p);
        if (res != CUDA_SUCCESS) return (uint32_t)res;
        /* The driver hands out one handle per kernel; so does the table, however often a program asks. */
        for (uint32_t i = 1; i < MAX_FUNCS; i++) {
            if (funcs[i].module == mid && funcs[i].f == f) {
                uint32_t cnt = funcs[i].nparams == GPR_PARAMS_UNKNOWN ? 0 : funcs[i].nparams;
                uint32_t *o = (uint32_t *)(void *)out_room(8 + cnt * 8);
                if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
                o[0] = i;
                o[1] = funcs[i].nparams;
                if (cnt > 0) memcpy(o + 2, funcs[i].layout, cnt * 8);
                *olen = 8 + cnt * 8;
                return CUDA_SUCCESS;
            }
        }
        uint32_t id = 0;
        for (uint32_t i = 1; i < MAX_FUNCS && id == 0; i++)
            if (funcs[i].module == 0) id = i;
        if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
        res = describe(id, f, mid, (const char *)r->p);
        if (res != CUDA_SUCCESS) return (uint32_t)res;
        uint32_t n = funcs[id].nparams, count = n == GPR_PARAMS_UNKNOWN ? 0 : n;
        const uint32_t *layout = funcs[id].layout;
        uint32_t *o = (uint32_t *)(void *)out_room(8 + count * 8);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        o[0] = id;
        o[1] = n;
        if (count > 0) memcpy(o + 2, layout, count * 8);
        *olen = 8 + count * 8;
        return CUDA_SUCCESS;
    }
    case GPR_OP_LAUNCH: {
        struct gpr_launch l;
        if (r->left < sizeof l) return CUDA_ERROR_INVALID_VALUE;
        memcpy(&l, r->p, sizeof l);
        const unsigned char *args = r->p + sizeof l;
        uint32_t nargs = r->left - (uint32_t)sizeof l;
        CUstream s;
        if (stream_of(l.stream, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        CUfunction f = NULL; /* function 0: the program passed NULL, and the driver answers for it */
        struct func *fe = NULL;
        if (l.function != 0) {
            if (l.function >= MAX_FUNCS || funcs[l.function].module == 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
            fe = &funcs[l.function];
            f = fe->f;
        }
        /* Copied out of the message buffer into an aligned one: the driver reads parameters by type. */
        static _Alignas(16) unsigned char argbuf[65536];
        if (nargs > sizeof argbuf) return CUDA_ERROR_INVALID_VALUE;
        memcpy(argbuf, args, nargs);
        if (l.use_extra) {
            size_t size = nargs;
            void *extra[] = {GPR_LAUNCH_PARAM_BUFFER_POINTER, argbuf, GPR_LAUNCH_PARAM_BUFFER_SIZE, &size,
                             GPR_LAUNCH_PARAM_END};
            return (uint32_t)CALL(LaunchKernel, f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1],
                                  l.block[2], l.shared_mem, s, NULL, extra);
        }
        void *params[GPR_MAX_PARAMS];
        uint32_t n = fe != NULL && fe->nparams != GPR_PARAMS_UNKNOWN ? fe->nparams : 0;
        if (fe != NULL && fe->nparams == GPR_PARAMS_UNKNOWN && nargs > 0) return GPR_CUDA_ERROR_NOT_SUPPORTED;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t off = fe->layout[2 * i], size = fe->layout[2 * i + 1];
            if ((uint64_t)off + size > nargs) return CUDA_ERROR_INVALID_VALUE;
            params[i] = argbuf + off;
        }
        return (uint32_t)CALL(LaunchKernel, f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1],
                              l.block[2], l.shared_mem, s, n > 0 ? params : NULL, NULL);
    }
    case GPR_OP_STREAM_CREATE: {
        uint32_t flags = rd_u32(r), prio = rd_u32(r);
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        uint32_t id = free_slot(stream_used, MAX_STREAMS);
        if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult res = CALL(StreamCreateWithPriority, &streams[id], flags, (int)prio);
        if (res != CUDA_SUCCESS) return (uint32_t)res;
        stream_used[id] = 1;
        stream_flags[id] = flags;
        stream_prio[id] = (int32_t)prio;
        uint32_t *o = (uint32_t *)(void *)out_room(4);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        *o = id;
        *olen = 4;
        return CUDA_SUCCESS;
    }
    case GPR_OP_STREAM_DESTROY: {
        uint32_t id = rd_u32(r);
        CUstream s;
        if (r->bad || id < GPR_FIRST_ID || stream_of(id, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        stream_used[id] = 0;
        return (uint32_t)CALL(StreamDestroy, s);
    }
    case GPR_OP_STREAM_SYNC:
    case GPR_OP_STREAM_QUERY: {
        uint32_t id = rd_u32(r);
        CUstream s;
        if (r->bad || stream_of(id, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        return (uint32_t)(op == GPR_OP_STREAM_SYNC ? CALL(StreamSynchronize, s) : CALL(StreamQuery, s));
    }
    case GPR_OP_STREAM_WAIT: {
        uint32_t sid = rd_u32(r), eid = rd_u32(r), flags = rd_u32(r);
        CUstream s;
        CUevent e;
        if (r->bad || stream_of(sid, &s) != 0 || event_of(eid, &e) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        return (uint32_t)CALL(StreamWaitEvent, s, e, flags);
    }
    case GPR_OP_EVENT_CREATE: {
        uint32_t flags = rd_u32(r);
        if (r->bad) return CUDA_ERROR_INVALID_VALUE;
        uint32_t id = free_slot(event_used, MAX_EVENTS);
        if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult res = CALL(EventCreate, &events[id], flags);
        if (res != CUDA_SUCCESS) return (uint32_t)res;
        event_used[id] = 1;
        event_flags[id] = flags;
        uint32_t *o = (uint32_t *)(void *)out_room(4);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        *o = id;
        *olen = 4;
        return CUDA_SUCCESS;
    }
    case GPR_OP_EVENT_DESTROY:
    case GPR_OP_EVENT_SYNC:
    case GPR_OP_EVENT_QUERY: {
        uint32_t id = rd_u32(r);
        CUevent e;
        if (r->bad || event_of(id, &e) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        if (op == GPR_OP_EVENT_DESTROY) {
            event_used[id] = 0;
            return (uint32_t)CALL(EventDestroy, e);
        }
        return (uint32_t)(op == GPR_OP_EVENT_SYNC ? CALL(EventSynchronize, e) : CALL(EventQuery, e));
    }
    case GPR_OP_EVENT_RECORD: {
        uint32_t eid = rd_u32(r), sid = rd_u32(r);
        CUstream s;
        CUevent e;
        if (r->bad || stream_of(sid, &s) != 0 || event_of(eid, &e) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        return (uint32_t)CALL(EventRecord, e, s);
    }
    case GPR_OP_EVENT_ELAPSED: {
        uint32_t a = rd_u32(r), b = rd_u32(r);
        CUevent ea, eb;
        if (r->bad || event_of(a, &ea) != 0 || event_of(b, &eb) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        float ms = 0;
        CUresult res = CALL(EventElapsedTime, &ms, ea, eb);
        unsigned char *o = out_room(4);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(o, &ms, 4);
        *olen = 4;
        return (uint32_t)res;
    }
    case GPR_OP_STATE: return op_state(olen);
    case GPR_OP_MODULE_IMAGE: {
        uint32_t id = rd_u32(r);
        if (r->bad || id == 0 || id >= MAX_MODULES || module_image[id] == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
        unsigned char *o = out_room(module_len[id] ? module_len[id] : 1);
        if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(o, module_image[id], module_len[id]);
        *olen = module_len[id];
        return CUDA_SUCCESS;
    }
    case GPR_OP_RESTORE_ALLOC:
        if (r->left % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
        return (uint32_t)restore_allocs(r->p, r->left / 16);
    case GPR_OP_RESTORE_MODULE: {
        uint32_t id = rd_u32(r);
        if (r->bad || id == 0 || id >= MAX_MODULES || modules[id] != NULL || r->left == 0) return CUDA_ERROR_INVALID_VALUE;
        CUresult res = CALL(ModuleLoadData, &modules[id], r->p);
        if (res == CUDA_SUCCESS) keep_image(id, r->p, r->left);
        else modules[id] = NULL;
        return (uint32_t)res;
    }
    case GPR_OP_RESTORE_FUNCTION: {
        uint32_t id = rd_u32(r), mid = rd_u32(r);
        if (r->bad || id == 0 || id >= MAX_FUNCS || funcs[id].module != 0 || mid == 0 || mid >= MAX_MODULES ||
            modules[mid] == NULL || r->left == 0 || memchr(r->p, '\0', r->left) == NULL)
            return CUDA_ERROR_INVALID_VALUE;
        CUfunction f = NULL;
        CUresult res = CALL(ModuleGetFunction, &f, modules[mid], (const char *)r->p);
        return (uint32_t)(res != CUDA_SUCCESS ? res : describe(id, f, mid, (const char *)r->p));
    }
    case GPR_OP_RESTORE_STREAM: {
        uint32_t id = rd_u32(r), flags = rd_u32(r), prio = rd_u32(r);
        if (r->bad || id < GPR_FIRST_ID || id >= MAX_STREAMS || stream_used[id]) return CUDA_ERROR_INVALID_VALUE;
        CUresult res = CALL(StreamCreateWithPriority, &streams[id], flags, (int)prio);
        if (res == CUDA_SUCCESS) {
            stream_used[id] = 1;
            stream_flags[id] = flags;
            stream_prio[id] = (int32_t)prio;
        }
        return (uint32_t)res;
    }
    case GPR_OP_RESTORE_EVENT: {
        uint32_t id = rd_u32(r), flags = rd_u32(r);
        if (r->bad || id < GPR_FIRST_ID || id >= MAX_EVENTS || event_used[id]) return CUDA_ERROR_INVALID_VALUE;
        CUresult res = CALL(EventCreate, &events[id], flags);
        if (res == CUDA_SUCCESS) {
            event_used[id] = 1;
            event_flags[id] = flags;
        }
        return (uint32_t)res;
    }
    default: return GPR_CUDA_ERROR_NOT_SUPPORTED;
    }
}

/* Where an administrator asked this share's clients to move: SHARE/move-to (one address), read when the
 * worker is signalled (SIGUSR1). 0 = a target. */
static int move_target(char *out) {
    const char *share = getenv("GPUPOOL_REMOTE_SHARE");
    if (share == NULL) return -1;
    char path[1200];
    snprintf(path, sizeof path, "%s/move-to", share);
    FILE *f = fopen(path, "re");
    if (f == NULL) return -1;
    int ok = fgets(out, GPR_MAX_ADDR, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    out[strcspn(out, " \r\n")] = '\0';
    return strncmp(out, "tcp:", 4) == 0 || strncmp(out, "unix:", 5) == 0 ? 0 : -1;
}

static void on_move(int sig) {
    (void)sig;
    move_asked = 1;
}

static int worker(int fd, const char *cuda) {
    conn = fd;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_move;
    sa.sa_flags = SA_RESTART; /* a signal must not end a read: the read helpers treat EINTR as "go on" */
    sigaction(SIGUSR1, &sa, NULL);
    load_driver(cuda);
    if (drv.Init == NULL || drv.Init(0) != CUDA_SUCCESS) {
        say("the driver does not initialise");
        reply(fd, GPR_CUDA_ERROR_NO_DEVICE, NULL, 0);
        return 3;
    }
    uint32_t hello[2] = {GPR_VERSION, (uint32_t)getpid()};
    if (reply(fd, CUDA_SUCCESS, hello, sizeof hello) != 0) return 0;
    for (;;) {
        struct gpr_hdr h;
        /* Idle as long as the client likes (keepalive finds a vanished peer); once a message has begun,
         * the rest must follow within the message timeout, so a stalled sender cannot pin the worker. */
        if (buffered_read(fd, &h, 1, -1) != 0) return 0;
        if (buffered_read(fd, (char *)&h + 1, sizeof h - 1, gpr_now_ms() + msg_timeout_ms) != 0) return 0;
        if (h.len > GPR_MAX_MSG + 4096 || h.op_or_result == 0 || h.op_or_result == GPR_OP_HELLO) {
            say("a message of %u bytes, op %u: not a request; hanging up", h.len, h.op_or_result);
            reply(fd, GPR_E_PROTOCOL, NULL, 0);
            return 0;
        }
        if (h.len + 16u > incap) {
            size_t want = h.len + 16u;
            unsigned char *p = realloc(in, want);
            if (p == NULL) {
                reply(fd, GPR_E_PROTOCOL, NULL, 0);
                return 0;
            }
            in = p;
            incap = want;
        }
        if (h.len > 0 && buffered_read(fd, in, h.len, gpr_now_ms() + msg_timeout_ms) != 0) return 0;
        in[h.len] = '\0'; /* a name or PTX image read as a string ends in the buffer even if the sender cut it */
        struct rd r = {in, h.len, 0};
        uint32_t olen = 0;
        if (move_asked && !(h.flags & GPR_F_NOREPLY) && ctx != NULL && deferred == 0) {
            move_asked = 0;
            char target[GPR_MAX_ADDR];
            if (move_target(target) == 0 && CALL(CtxSynchronize) == CUDA_SUCCESS) {
                /* the client is waiting on this reply and sends nothing else: its work so far has run here */
                say("moving this client to %s", target);
                if (reply(fd, GPR_R_MOVED, target, (uint32_t)strlen(target) + 1) != 0) return 0;
                continue;
            }
        }
        uint32_t res = handle(h.op_or_result, &r, &olen);
        if (h.flags & GPR_F_NOREPLY) {
            if (res != CUDA_SUCCESS && deferred == 0) deferred = res;
            continue;
        }
        if (deferred != 0 && res == CUDA_SUCCESS) {
            res = deferred; /* an earlier asynchronous failure, reported where the program next waits */
            olen = 0;
        }
        deferred = 0;
        if (reply(fd, res, outbuf, olen) != 0) return 0;
    }
}

/* ======================================= the listener ==================================================== */
static const char *tokens_path, *hook_path, *cuda_path = "libcuda.so.1";
static int limits_fd = -1;
static int max_clients = 256;             /* connections served at once (each is a process) */
static volatile sig_atomic_t children;    /* live children: being admitted or serving */

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) children--;
    errno = saved;
}

/* The share directory of a token, from the token file (re-read at every connection, so tokens are
 * revoked by editing it). 0 = found. */
static int lookup_token(const char *token, size_t len, char *share, size_t size) {
    int fd = open(tokens_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        say("cannot open the token file: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        say("the token file must belong to the server's user and be private to it (mode 0600)");
        close(fd);
        return -1;
    }
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        close(fd);
        return -1;
    }
    char line[4096];
    int found = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        char *tok = strtok(line, " \t\r\n");
        char *dir = strtok(NULL, "\r\n");
        if (tok == NULL || dir == NULL || tok[0] == '#') continue;
        while (*dir == ' ' || *dir == '\t') dir++;
        size_t tl = strlen(tok);
        /* compared over the whole length whatever matches, so timing says nothing about the token */
        unsigned diff = (unsigned)(tl ^ len);
        for (size_t i = 0; i < len; i++) diff |= (unsigned char)(tok[i < tl ? i : 0] ^ token[i]);
        if (diff == 0 && found != 0 && strlen(dir) < size) {
            snprintf(share, size, "%s", dir);
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* CUDA_VISIBLE_DEVICES=<the share's GPUs> from its limits file: a worker sees only the GPUs its share is on.
 * The library caps whatever device a one-GPU share uses (it matches it by ordinal), so without this a share
 * allocated on one GPU could run on any GPU of the node. A file that names no UUID (matched by ordinal, as
 * the agent never writes for a claim) leaves the server's own view. */
static char visible[sizeof "CUDA_VISIBLE_DEVICES=" + GP_MAX_DEV * 64];

static int share_gpus(int fd, const char *share) {
    struct gp_limits l;
    visible[0] = '\0';
    if (pread(fd, &l, sizeof l, 0) != (ssize_t)sizeof l || l.magic != GP_LIMITS_MAGIC ||
        l.version != GP_LIMITS_VERSION || l.ndev > GP_MAX_DEV) {
        say("share %s: its limits file is not one gpupool wrote: refused", share);
        return -1;
    }
    size_t at = (size_t)snprintf(visible, sizeof visible, "CUDA_VISIBLE_DEVICES=");
    for (uint32_t i = 0; i < l.ndev && l.uuid[i][0] != '\0'; i++) {
        l.uuid[i][sizeof l.uuid[i] - 1] = '\0';
        if (strpbrk(l.uuid[i], ",=") != NULL) {
            say("share %s: GPU %u's UUID is malformed: refused", share, i);
            return -1;
        }
        at += (size_t)snprintf(visible + at, sizeof visible - at, "%s%s", i ? "," : "", l.uuid[i]);
    }
    if (l.ndev == 0 || l.uuid[0][0] == '\0') visible[0] = '\0';
    return 0;
}

static int place_limits(const char *share) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/limits/limits.v1", share);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        say("share %s has no limits file (%s): refused", share, strerror(errno));
        return -1;
    }
    if (share_gpus(fd, share) != 0) {
        close(fd);
        return -1;
    }
    if (limits_fd >= 0) {
        if (dup2(fd, limits_fd) < 0) return -1; /* dup2 clears close-on-exec: the worker inherits it */
        close(fd);
        return 0;
    }
    close(fd);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/limits", share);
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        say("cannot make a mount namespace for the share's limits (%s): refused", strerror(errno));
        return -1;
    }
    mkdir("/run/gpupool", 0755);
    mkdir("/run/gpupool/limits", 0755);
    if (mount(dir, "/run/gpupool/limits", NULL, MS_BIND, NULL) != 0 ||
        mount(NULL, "/run/gpupool/limits", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) != 0) {
        say("cannot mount the share's limits (%s): refused", strerror(errno));
        return -1;
    }
    return 0;
}

/* The child for one connection: hello, token, then exec as the worker (or a refusal). */
static void admit(int fd, const char *self) {
    struct gpr_hdr h;
    uint32_t head[3];
    char token[GPR_MAX_TOKEN];
    int64_t deadline = gpr_now_ms() + HELLO_TIMEOUT_MS;
    if (gpr_read_full(fd, &h, sizeof h, deadline) != 0) _exit(0);
    if (h.op_or_result != GPR_OP_HELLO || h.len < sizeof head || h.len > sizeof head + GPR_MAX_TOKEN) {
        reply(fd, GPR_E_PROTOCOL, NULL, 0);
        _exit(0);
    }
    if (gpr_read_full(fd, head, sizeof head, deadline) != 0) _exit(0);
    uint32_t tlen = h.len - (uint32_t)sizeof head;
    if (head[0] != GPR_MAGIC || head[2] != tlen || gpr_read_full(fd, token, tlen, deadline) != 0) {
        reply(fd, GPR_E_PROTOCOL, NULL, 0);
        _exit(0);
    }
    if (head[1] != GPR_VERSION) {
        say("a client speaks protocol version %u, this server %u: refused", head[1], GPR_VERSION);
        reply(fd, GPR_CUDA_ERROR_NOT_SUPPORTED, NULL, 0);
        _exit(0);
    }
    char share[1024];
    if (tlen == 0 || lookup_token(token, tlen, share, sizeof share) != 0) {
        say("a client with an unknown token: refused");
        reply(fd, GPR_CUDA_ERROR_NOT_PERMITTED, NULL, 0);
        _exit(0);
    }
    if (place_limits(share) != 0) {
        reply(fd, GPR_CUDA_ERROR_NOT_PERMITTED, NULL, 0);
        _exit(0);
    }
    /* The worker's environment: the server's, less anything gpupool's library would read as a limit or a
     * place (those come from the share), plus the library itself. */
    size_t n = 0;
    while (environ[n] != NULL) n++;
    char **env = calloc(n + 5, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "GPUPOOL_", 8) != 0 && strncmp(environ[i], "LD_PRELOAD=", 11) != 0 &&
            (visible[0] == '\0' || strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) != 0))
            env[k++] = environ[i];
    if (visible[0] != '\0') env[k++] = visible;
    char preload[PATH_MAX + 16], hookdir[1100];
    if (hook_path != NULL) {
        snprintf(preload, sizeof preload, "LD_PRELOAD=%s", hook_path);
        env[k++] = preload;
    }
    snprintf(hookdir, sizeof hookdir, "GPUPOOL_REMOTE_SHARE=%s", share);
    env[k++] = hookdir;
    env[k] = NULL;
    int fl = fcntl(fd, F_GETFD);
    fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    char timeout[32];
    snprintf(timeout, sizeof timeout, "%lld", (long long)msg_timeout_ms);
    char *argv[] = {(char *)prog, "--worker", fdarg, "--cuda", (char *)cuda_path, "--message-timeout-ms", timeout,
                    NULL};
    execve(self, argv, env);
    say("cannot start the worker: %s", strerror(errno));
    reply(fd, GPR_CUDA_ERROR_UNKNOWN, NULL, 0);
    _exit(3);
}

static void tune(int fd, int tcp) {
    if (!tcp) return;
    int one = 1, idle = 10, intvl = 5, cnt = 3;
    unsigned user_timeout = 30000;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

static int listen_on(const char *spec, int *tcp) {
    int fd = -1;
    *tcp = 0;
    if (strncmp(spec, "unix:", 5) == 0) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(spec + 5) >= sizeof a.sun_path) return -1;
        strcpy(a.sun_path, spec + 5);
        unlink(a.sun_path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0) return -1;
        chmod(a.sun_path, 0666); /* the token, not the socket's mode, decides who is served */
        printf("listening unix:%s\n", a.sun_path);
    } else if (strncmp(spec, "tcp:", 4) == 0) {
        char host[256];
        snprintf(host, sizeof host, "%s", spec + 4);
        char *colon = strrchr(host, ':');
        if (colon == NULL) return -1;
        *colon = '\0';
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
        if (getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai) != 0) return -1;
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            freeaddrinfo(ai);
            return -1;
        }
        freeaddrinfo(ai);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        int port = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                           : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        printf("listening tcp:%s:%d\n", host, port); /* port 0 asks for any: the line says which */
        *tcp = 1;
    } else {
        return -1;
    }
    fflush(stdout);
    return fd;
}

static void usage(void) {
    fprintf(stderr, "usage: %s --listen tcp:HOST:PORT|unix:PATH --tokens FILE [--hook LIB] [--cuda LIB]\n"
                    "       [--limits-fd N] [--message-timeout-ms MS] [--max-clients N]\n", prog);
    exit(2);
}

int main(int argc, char **argv) {
    const char *listen_spec = NULL;
    int worker_fd = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) usage();
        if (!strcmp(a, "--listen")) listen_spec = v;
        else if (!strcmp(a, "--tokens")) tokens_path = v;
        else if (!strcmp(a, "--hook")) hook_path = v;
        else if (!strcmp(a, "--cuda")) cuda_path = v;
        else if (!strcmp(a, "--limits-fd")) limits_fd = atoi(v);
        else if (!strcmp(a, "--message-timeout-ms")) msg_timeout_ms = atoll(v) > 0 ? atoll(v) : 30000;
        else if (!strcmp(a, "--worker")) worker_fd = atoi(v);
        else if (!strcmp(a, "--max-clients")) max_clients = atoi(v) > 0 ? atoi(v) : 256;
        else usage();
        i++;
    }
    if (worker_fd >= 0) return worker(worker_fd, cuda_path);
    if (listen_spec == NULL || tokens_path == NULL) usage();
    if (hook_path == NULL) say("no --hook: shares run without gpupool's memory cap and compute pacing");
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return 3;
    self[sl] = '\0';
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child; /* reaps, and counts what is served */
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int tcp;
    int lfd = listen_on(listen_spec, &tcp);
    if (lfd < 0) {
        say("cannot listen on %s: %s", listen_spec, strerror(errno));
        return 3;
    }
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EINTR) usleep(10000); /* out of descriptors: wait, do not spin */
            continue;
        }
        if (children >= max_clients) {
            /* full: the client reads EOF at its hello and reports no device; nothing is forked for it */
            static int64_t said;
            if (gpr_now_ms() - said > 10000) {
                say("%d clients are being served (--max-clients): refusing connections", max_clients);
                said = gpr_now_ms();
            }
            close(fd);
            continue;
        }
        tune(fd, tcp);
        sigprocmask(SIG_BLOCK, &chld, &old); /* the count and the fork agree even if a child ends at once */
        pid_t pid = fork();
        if (pid == 0) {
            sigprocmask(SIG_SETMASK, &old, NULL);
            close(lfd);
            signal(SIGCHLD, SIG_DFL);
            admit(fd, self);
        }
        if (pid > 0) children++;
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(fd);
    }
}
