/* A fake libcuda.so.1 for the interception library's tests: the simulated device of fake_state.h behind
 * the driver entry points the library wraps, plus the ones tests use to drive it. Test code, not a model
 * of every driver rule: what it implements is what fake_state.h documents. */
#include "fake_state.h"
#include "../../../native/gpupool_cuda.h"

#include <stdio.h>

#define EXPORT __attribute__((visibility("default")))
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NOT_READY 600

/* ---- process-local bookkeeping ------------------------------------------------------------------------ */
struct alloc {
    uint64_t key, bytes;
    void *pool;
    struct alloc *next;
};
static struct alloc *allocs;
static int have_ctx;
struct fake_stream { int64_t tail; };
static struct fake_stream default_stream;
static int64_t latest_tail;
struct fake_pool { uint64_t reserved, used; };
static struct fake_pool default_pool;

static void ensure_ctx(void) { /* locked */
    if (!have_ctx) {
        struct fake_proc *me = fk_me();
        me->ctx = fk_env("FAKE_GPU_CTX_MIB", 0) << 20;
        me->has_ctx = 1;
        have_ctx = 1;
    }
}

/* locked: take bytes from the device for this process */
static CUresult take(uint64_t bytes) {
    ensure_ctx();
    if (fk_used_all() + bytes > fk_total()) return CUDA_ERROR_OUT_OF_MEMORY;
    fk_me()->used += bytes;
    return CUDA_SUCCESS;
}

static CUresult alloc_bytes(unsigned long long *out, uint64_t bytes, void *pool) {
    fk_lock();
    CUresult r = pool == NULL ? take(bytes) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        *out = fk->next_ptr;
        fk->next_ptr += (bytes + 255) / 256 * 256 + 256;
        struct alloc *a = malloc(sizeof *a);
        *a = (struct alloc){*out, bytes, pool, allocs};
        allocs = a;
    }
    fk_unlock();
    return r;
}

static struct alloc *unlink_alloc(uint64_t key) { /* locked */
    for (struct alloc **p = &allocs; *p != NULL; p = &(*p)->next) {
        if ((*p)->key == key) {
            struct alloc *a = *p;
            *p = a->next;
            return a;
        }
    }
    return NULL;
}

static CUresult free_bytes(uint64_t key) {
    fk_lock();
    struct alloc *a = unlink_alloc(key);
    if (a != NULL) fk_me()->used -= a->bytes;
    fk_unlock();
    free(a);
    return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- init, devices, contexts ------------------------------------------------------------------------- */
EXPORT CUresult cuInit(unsigned flags) { (void)flags; return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}
static const char *uuid_text(void) {
    const char *u = getenv("FAKE_GPU_UUID");
    return u != NULL ? u : "GPU-11111111-2222-3333-4444-555555555555";
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    (void)d;
    const char *t = uuid_text() + 4;
    int n = 0;
    for (; *t && n < 16; t++) {
        if (*t == '-') continue;
        unsigned v;
        if (sscanf(t, "%2x", &v) != 1) return CUDA_ERROR_INVALID_VALUE;
        u->bytes[n++] = (char)v;
        t++;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = fk_total(); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceTotalMem(unsigned *b, CUdevice d) {
    (void)d;
    *b = fk_total() > 0xffffffffULL ? 0xffffffffU : (unsigned)fk_total();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) {
    (void)flags; (void)d;
    fk_lock();
    ensure_ctx();
    fk_unlock();
    *c = (CUcontext)(uintptr_t)1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { return cuCtxCreate_v2(c, 0, d); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) { (void)c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) { *c = (CUcontext)(uintptr_t)1; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (!have_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *d = 0;
    return CUDA_SUCCESS;
}

/* ---- memory ------------------------------------------------------------------------------------------- */
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    fk_lock();
    uint64_t used = fk_used_all();
    fk_unlock();
    *t = fk_total();
    *f = used > *t ? 0 : *t - used;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo(unsigned *f, unsigned *t) {
    size_t ff, tt;
    cuMemGetInfo_v2(&ff, &tt);
    *f = ff > 0xffffffffULL ? 0xffffffffU : (unsigned)ff;
    *t = tt > 0xffffffffULL ? 0xffffffffU : (unsigned)tt;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc_bytes(p, n, NULL); }
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned n) {
    unsigned long long v;
    CUresult r = alloc_bytes(&v, n, NULL);
    if (r == CUDA_SUCCESS) *p = (CUdeviceptr_v1)v; /* low bits are unique enough in a test */
    if (r == CUDA_SUCCESS) {
        fk_lock();
        allocs->key = *p;
        fk_unlock();
    }
    return r;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) { (void)flags; return alloc_bytes(p, n, NULL); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned elem) {
    (void)elem;
    *pitch = (w + 511) / 512 * 512;
    return alloc_bytes(p, *pitch * h, NULL);
}
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned *pitch, unsigned w, unsigned h, unsigned elem) {
    size_t pt;
    unsigned long long v;
    CUresult r = cuMemAllocPitch_v2(&v, &pt, w, h, elem);
    if (r == CUDA_SUCCESS) {
        *p = (CUdeviceptr_v1)v;
        *pitch = (unsigned)pt;
        fk_lock();
        allocs->key = *p;
        fk_unlock();
    }
    return r;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return free_bytes(p); }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) { return free_bytes(p); }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    (void)prop; (void)flags;
    return alloc_bytes(h, n, NULL);
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return free_bytes(h); }

static int elem(int f) { return f == 1 || f == 8 ? 1 : f == 2 || f == 9 || f == 0x10 ? 2 : 4; }
static uint64_t d1(size_t v) { return v ? v : 1; }
static CUresult make_array(void *out, uint64_t bytes) {
    unsigned long long v;
    CUresult r = alloc_bytes(&v, bytes, NULL);
    if (r == CUDA_SUCCESS) *(void **)out = (void *)(uintptr_t)v;
    return r;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    return make_array(a, d1(d->Width) * d1(d->Height) * d->NumChannels * elem(d->Format));
}
EXPORT CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    return make_array(a, d1(d->Width) * d1(d->Height) * d->NumChannels * elem(d->Format));
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return make_array(a, d1(d->Width) * d1(d->Height) * d1(d->Depth) * d->NumChannels * elem(d->Format));
}
EXPORT CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    return make_array(a, d1(d->Width) * d1(d->Height) * d1(d->Depth) * d->NumChannels * elem(d->Format));
}
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t bytes = 0;
    for (unsigned l = 0; l < levels; l++) {
        size_t w = d->Width >> l, h = d->Height >> l, z = d->Depth >> l;
        bytes += d1(w) * (d->Height ? d1(h) : 1) * (d->Depth ? d1(z) : 1) * d->NumChannels * elem(d->Format);
    }
    return make_array(a, bytes);
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return free_bytes((uint64_t)(uintptr_t)a); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return free_bytes((uint64_t)(uintptr_t)a); }

/* Pools grow by exactly what an allocation lacks, and give back unused memory at trims and syncs. */
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice d) {
    (void)d;
    *p = (CUmemoryPool)&default_pool;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const void *props) {
    (void)props;
    *p = (CUmemoryPool)calloc(1, sizeof(struct fake_pool));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool p, int attr, void *value) {
    struct fake_pool *fp = (struct fake_pool *)p;
    fk_lock();
    *(cuuint64_t *)value = attr == 5 ? fp->reserved : attr == 7 ? fp->used : 0;
    fk_unlock();
    return attr == 5 || attr == 7 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static void trim(struct fake_pool *fp, uint64_t keep) { /* locked */
    uint64_t target = fp->used > keep ? fp->used : keep;
    if (fp->reserved > target) {
        fk_me()->used -= fp->reserved - target;
        fp->reserved = target;
    }
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep) {
    fk_lock();
    trim((struct fake_pool *)p, keep);
    fk_unlock();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p) {
    fk_lock();
    struct fake_pool *fp = (struct fake_pool *)p;
    fk_me()->used -= fp->reserved;
    fp->reserved = fp->used = 0;
    fk_unlock();
    if (fp != &default_pool) free(fp);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *ptr, size_t n, CUmemoryPool p, CUstream s) {
    (void)s;
    struct fake_pool *fp = (struct fake_pool *)p;
    fk_lock();
    uint64_t idle = fp->reserved - fp->used;
    CUresult r = n > idle ? take(n - idle) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        if (n > idle) fp->reserved += n - idle;
        fp->used += n;
    }
    fk_unlock();
    if (r == CUDA_SUCCESS) alloc_bytes(ptr, n, fp);
    return r;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t n, CUstream s) {
    return cuMemAllocFromPoolAsync(ptr, n, (CUmemoryPool)&default_pool, s);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
    (void)s;
    fk_lock();
    struct alloc *a = unlink_alloc(ptr);
    if (a != NULL && a->pool != NULL) ((struct fake_pool *)a->pool)->used -= a->bytes;
    fk_unlock();
    free(a);
    return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- streams, events, kernels ------------------------------------------------------------------------- */
static struct fake_stream *stream_of(CUstream s) { return s == NULL ? &default_stream : (struct fake_stream *)s; }
static void sleep_until(int64_t t) {
    int64_t now = fk_now();
    if (t <= now) return;
    struct timespec ts = {(time_t)((t - now) / 1000000000LL), (long)((t - now) % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    *s = (CUstream)calloc(1, sizeof(struct fake_stream));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { free(s); return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    sleep_until(stream_of(s)->tail);
    fk_lock();
    trim(&default_pool, 0); /* release threshold 0: unused pool memory goes back at a sync */
    fk_unlock();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) {
    sleep_until(latest_tail);
    return cuStreamSynchronize(NULL);
}

static CUresult run(CUstream s, int64_t ns) {
    struct fake_stream *st = stream_of(s);
    fk_lock();
    ensure_ctx();
    int64_t now = fk_now();
    int64_t start = now > st->tail ? now : st->tail;
    if (fk->device_free_at > start) start = fk->device_free_at;
    int64_t end = start + ns;
    fk->device_free_at = end;
    st->tail = end;
    if (end > latest_tail) latest_tail = end;
    fk->iv[fk->iv_count % FAKE_IVS] = (struct fake_iv){getpid(), start, end};
    fk->iv_count++;
    fk_unlock();
    return CUDA_SUCCESS;
}
static int64_t grid_ns(unsigned gx, unsigned gy, unsigned gz) {
    return (int64_t)gx * gy * gz * (int64_t)fk_env("FAKE_GPU_NS_PER_BLOCK", 1000);
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    (void)f; (void)bx; (void)by; (void)bz; (void)shm; (void)params; (void)extra;
    return run(s, grid_ns(gx, gy, gz));
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)f; (void)params; (void)extra;
    return run(c->hStream, grid_ns(c->gridDimX, c->gridDimY, c->gridDimZ));
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    (void)f; (void)bx; (void)by; (void)bz; (void)shm; (void)params;
    return run(s, grid_ns(gx, gy, gz));
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return run(s, (int64_t)(uintptr_t)g * 1000); }

struct fake_event { int64_t t; };
EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    *e = (CUevent)calloc(1, sizeof(struct fake_event));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    int64_t now = fk_now(), tail = stream_of(s)->tail;
    ((struct fake_event *)e)->t = now > tail ? now : tail;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e) { return ((struct fake_event *)e)->t <= fk_now() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY; }
EXPORT CUresult cuEventSynchronize(CUevent e) { sleep_until(((struct fake_event *)e)->t); return CUDA_SUCCESS; }
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    *ms = (float)(((struct fake_event *)b)->t - ((struct fake_event *)a)->t) / 1e6f;
    return CUDA_SUCCESS;
}

/* An entry point no interception library knows: it must reach the driver untouched. */
EXPORT int cuFakeEcho(int x) { return x + 1000; }

/* ---- the _ptsz aliases and cuGetProcAddress ----------------------------------------------------------- */
#define ALIAS(name, target) EXPORT __typeof__(target) name __attribute__((alias(#target)));
ALIAS(cuLaunchKernel_ptsz, cuLaunchKernel)
ALIAS(cuLaunchKernelEx_ptsz, cuLaunchKernelEx)
ALIAS(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel)
ALIAS(cuGraphLaunch_ptsz, cuGraphLaunch)
ALIAS(cuMemAllocAsync_ptsz, cuMemAllocAsync)
ALIAS(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync)
ALIAS(cuMemFreeAsync_ptsz, cuMemFreeAsync)

/* Like the driver: a base name and the caller's CUDA version pick the ABI variant (_v2 from 3.2 on for the
 * functions that have one), the per-thread flag picks _ptsz; answered from our own exports. */
/* Our own exports by name (not dlsym: an interposed dlsym would answer for the library under test). */
static void *self_sym(const char *name);
static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    char name[256];
    *pfn = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        *pfn = self_sym(name);
    }
    if (*pfn == NULL && version >= 3020) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        *pfn = self_sym(name);
    }
    if (*pfn == NULL) *pfn = self_sym(symbol);
    return *pfn != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return lookup(symbol, pfn, version, flags);
}
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    CUresult r = lookup(symbol, pfn, version, flags);
    if (status != NULL) *status = r == CUDA_SUCCESS ? 0 : 1;
    return r;
}

static const struct { const char *name; void *fn; } exports[] = {
    {"cuInit", (void *)cuInit},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuDeviceGet", (void *)cuDeviceGet},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid_v2", (void *)cuDeviceGetUuid_v2},
    {"cuDeviceTotalMem_v2", (void *)cuDeviceTotalMem_v2},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem},
    {"cuCtxCreate_v2", (void *)cuCtxCreate_v2},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxPushCurrent_v2", (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent_v2", (void *)cuCtxPopCurrent_v2},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2},
    {"cuMemGetInfo", (void *)cuMemGetInfo},
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
    {"cuMemAlloc", (void *)cuMemAlloc},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch},
    {"cuMemFree_v2", (void *)cuMemFree_v2},
    {"cuMemFree", (void *)cuMemFree},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuArrayCreate_v2", (void *)cuArrayCreate_v2},
    {"cuArrayCreate", (void *)cuArrayCreate},
    {"cuArray3DCreate_v2", (void *)cuArray3DCreate_v2},
    {"cuArray3DCreate", (void *)cuArray3DCreate},
    {"cuMipmappedArrayCreate", (void *)cuMipmappedArrayCreate},
    {"cuArrayDestroy", (void *)cuArrayDestroy},
    {"cuMipmappedArrayDestroy", (void *)cuMipmappedArrayDestroy},
    {"cuDeviceGetMemPool", (void *)cuDeviceGetMemPool},
    {"cuMemPoolCreate", (void *)cuMemPoolCreate},
    {"cuMemPoolGetAttribute", (void *)cuMemPoolGetAttribute},
    {"cuMemPoolTrimTo", (void *)cuMemPoolTrimTo},
    {"cuMemPoolDestroy", (void *)cuMemPoolDestroy},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuStreamCreate", (void *)cuStreamCreate},
    {"cuStreamDestroy_v2", (void *)cuStreamDestroy_v2},
    {"cuStreamSynchronize", (void *)cuStreamSynchronize},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    {"cuGraphLaunch", (void *)cuGraphLaunch},
    {"cuEventCreate", (void *)cuEventCreate},
    {"cuEventDestroy_v2", (void *)cuEventDestroy_v2},
    {"cuEventRecord", (void *)cuEventRecord},
    {"cuEventQuery", (void *)cuEventQuery},
    {"cuEventSynchronize", (void *)cuEventSynchronize},
    {"cuEventElapsedTime", (void *)cuEventElapsedTime},
    {"cuFakeEcho", (void *)cuFakeEcho},
    {"cuGetProcAddress", (void *)cuGetProcAddress},
    {"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2},
    {"cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuGraphLaunch_ptsz", (void *)cuGraphLaunch_ptsz},
    {"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz},
};

static void *self_sym(const char *name) {
    for (size_t i = 0; i < sizeof exports / sizeof exports[0]; i++)
        if (strcmp(exports[i].name, name) == 0) return exports[i].fn;
    return NULL;
}
