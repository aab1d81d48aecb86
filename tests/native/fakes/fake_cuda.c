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
    unsigned char *data; /* the contents, mapped at the first copy, memset or kernel that touches them */
    int on_host;         /* managed memory whose pages the driver keeps on the host: no device memory held */
    uint64_t mapped;     /* a cuMemCreate handle's memory: where cuMemMap put it (0 = nowhere) */
};
static struct alloc *allocs;
static int have_ctx;
struct fake_stream { uint64_t seq; }; /* the stream's last kernel (fake_state.h: fk_seq_end) */
static struct fake_stream default_stream;
static uint64_t latest_seq; /* the process's last kernel: its kernels complete in launch order */
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
        *a = (struct alloc){*out, bytes, pool, allocs, NULL, 0, 0};
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
    if (a != NULL && !a->on_host) fk_me()->used -= a->bytes;
    fk_unlock();
    if (a != NULL && a->data != NULL) munmap(a->data, a->bytes);
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

/* Managed memory moves as the real driver moves it: a preferred location on the host takes its pages off
 * the device (their device memory is given back), a preferred location on the device or a prefetch there
 * brings them back (and needs the device memory). Whole allocations only: enough for the tests. */
static CUresult place_managed(CUdeviceptr p, int on_host) {
    fk_lock();
    struct alloc *a = allocs;
    while (a != NULL && a->key != p) a = a->next;
    CUresult r = a == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (a != NULL && on_host && !a->on_host) {
        fk_me()->used -= a->bytes;
        a->on_host = 1;
    } else if (a != NULL && !on_host && a->on_host) {
        r = take(a->bytes);
        if (r == CUDA_SUCCESS) a->on_host = 0;
    }
    fk_unlock();
    return r;
}
EXPORT CUresult cuMemAdvise(CUdeviceptr p, size_t n, int advice, CUdevice d) {
    (void)n;
    return advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION ? place_managed(p, d == CU_DEVICE_CPU) : CUDA_SUCCESS;
}
EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice d, CUstream s) {
    (void)n;
    (void)s;
    return place_managed(p, d == CU_DEVICE_CPU);
}
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
    if (a != NULL && a->data != NULL) munmap(a->data, a->bytes);
    free(a);
    return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- streams, events, kernels ------------------------------------------------------------------------- */
/* ---- stream capture ------------------------------------------------------------------------------------
 * What NVIDIA documents of cuStreamBeginCapture / cuStreamEndCapture / cuThreadExchangeStreamCaptureMode:
 * - work pushed to a capturing stream is not executed but captured; cuStreamEndCapture returns the graph
 *   (here a handle whose value is the captured device time in us, launchable like the fake's graphs), or
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED once something broke the capture;
 * - an event recorded on a capturing stream is captured: querying, timing or synchronising it conflicts
 *   with the capture in every mode (CUDA_ERROR_CAPTURED_EVENT) and invalidates it;
 * - while a capture begun in GLOBAL mode is under way (or one in THREAD_LOCAL mode in the calling thread),
 *   a thread whose own interaction mode is not RELAXED may make no potentially unsafe call: the call fails
 *   with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture. NVIDIA lists no such calls;
 *   FAKE_CAPTURE_UNSAFE (default "query,sync") says whether event queries and timings ("query") and
 *   stream, context and event synchronisations ("sync") count, and the tests sweep it ("" = neither);
 * - the legacy default stream cannot capture, and asking it whether it captures while another stream
 *   captures in a mode other than RELAXED is CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. */
#define FAKE_CAPTURES 8
static struct {
    CUstream s;
    int mode, invalid;
    pthread_t thread;
    int64_t captured_ns;
} captures[FAKE_CAPTURES];
static pthread_mutex_t capture_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static int capture_of(CUstream s) { /* capture_mu held: the capture under way on `s`, or -1 */
    for (int i = 0; i < FAKE_CAPTURES; i++)
        if (captures[i].s != NULL && captures[i].s == s) return i;
    return -1;
}
/* An unsafe call of kind `kind` ("query" or "sync") in this thread: whether a capture forbids it (and is
 * invalidated by it). */
static int unsafe_call(const char *kind) {
    const char *unsafe = getenv("FAKE_CAPTURE_UNSAFE");
    if (unsafe == NULL) unsafe = "query,sync";
    if (strstr(unsafe, kind) == NULL || thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
    int hit = 0;
    pthread_mutex_lock(&capture_mu);
    for (int i = 0; i < FAKE_CAPTURES; i++) {
        if (captures[i].s == NULL || captures[i].mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        if (captures[i].mode == CU_STREAM_CAPTURE_MODE_GLOBAL || pthread_equal(captures[i].thread, pthread_self())) {
            captures[i].invalid = 1;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&capture_mu);
    return hit;
}
static void invalidate_capture(CUstream s) {
    pthread_mutex_lock(&capture_mu);
    int i = capture_of(s);
    if (i >= 0) captures[i].invalid = 1;
    pthread_mutex_unlock(&capture_mu);
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    if ((uintptr_t)s <= 2) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&capture_mu);
    int i = capture_of(s), free_slot = -1;
    for (int k = FAKE_CAPTURES - 1; k >= 0; k--)
        if (captures[k].s == NULL) free_slot = k;
    if (i < 0 && free_slot >= 0)
        captures[free_slot] = (__typeof__(captures[0])){s, mode, 0, pthread_self(), 0};
    pthread_mutex_unlock(&capture_mu);
    return i >= 0 || free_slot < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    pthread_mutex_lock(&capture_mu);
    int i = capture_of(s), invalid = i >= 0 && captures[i].invalid;
    int64_t us = i >= 0 ? captures[i].captured_ns / 1000 : 0;
    if (i >= 0) captures[i].s = NULL;
    pthread_mutex_unlock(&capture_mu);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    *g = invalid ? NULL : (CUgraph)(uintptr_t)(us > 0 ? us : 1);
    return invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
    pthread_mutex_lock(&capture_mu);
    int i = capture_of(s), implicit = 0;
    if ((uintptr_t)s <= 1)
        for (int k = 0; k < FAKE_CAPTURES; k++)
            implicit |= captures[k].s != NULL && captures[k].mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    *status = i < 0 ? CU_STREAM_CAPTURE_STATUS_NONE
              : captures[i].invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&capture_mu);
    return implicit ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}
EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    int old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
/* Work pushed to a capturing stream: counted into its graph instead of run (1 if it was). */
static int captured(CUstream s, int64_t ns) {
    pthread_mutex_lock(&capture_mu);
    int i = (uintptr_t)s <= 2 ? -1 : capture_of(s);
    if (i >= 0) captures[i].captured_ns += ns < 0 ? 0 : ns;
    pthread_mutex_unlock(&capture_mu);
    return i >= 0;
}

/* NULL and the driver's special handles CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the default
 * stream (the fake has one thread of work per process) */
static struct fake_stream *stream_of(CUstream s) {
    return (uintptr_t)s <= 2 ? &default_stream : (struct fake_stream *)s;
}
/* Wait until kernel `seq` of this process has completed: sleep until it would if nobody launched anything
 * more, then look again (later launches of other processes can still take device time before it). */
static void wait_seq(uint64_t seq) {
    for (;;) {
        fk_lock();
        int64_t now = fk_now();
        fk_advance(now);
        int64_t end = fk_seq_end(seq), wake = end < 0 ? fk_project(seq) : 0;
        fk_unlock();
        if (end >= 0) return;
        int64_t ns = wake - now;
        if (ns < 20000) ns = 20000;
        struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    *s = (CUstream)calloc(1, sizeof(struct fake_stream));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { free(s); return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    int capturing;
    pthread_mutex_lock(&capture_mu);
    capturing = capture_of(s) >= 0;
    pthread_mutex_unlock(&capture_mu);
    if (capturing) { /* a capturing stream has nothing running to wait for: that conflicts with capture */
        invalidate_capture(s);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (unsafe_call("sync")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_seq(stream_of(s)->seq);
    fk_lock();
    trim(&default_pool, 0); /* release threshold 0: unused pool memory goes back at a sync */
    fk_unlock();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) {
    if (unsafe_call("sync")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_seq(latest_seq);
    return cuStreamSynchronize(NULL);
}

static CUresult run(CUstream s, int64_t ns) {
    struct fake_stream *st = stream_of(s);
    if (captured(s, ns)) return CUDA_SUCCESS;
    for (;;) {
        fk_lock();
        ensure_ctx();
        fk_advance(fk_now());
        struct fake_sched *q = &fk->sched;
        if (q->npending < FAKE_PENDING) {
            if (q->next_seq == 0) q->next_seq = 1;
            uint64_t seq = q->next_seq++;
            q->pending[q->npending++] = (struct fake_queued){getpid(), seq, ns < 0 ? 0 : ns};
            st->seq = latest_seq = seq;
            fk_unlock();
            return CUDA_SUCCESS;
        }
        fk_unlock(); /* the device's queue is full: wait for room, as a driver's push buffer does */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}
static int64_t grid_ns(unsigned gx, unsigned gy, unsigned gz) {
    return (int64_t)gx * gy * gz * (int64_t)fk_env("FAKE_GPU_NS_PER_BLOCK", 1000);
}
static CUresult kernel_body(CUfunction f, void **params, void **extra, int64_t *ns);
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    (void)bx; (void)by; (void)bz; (void)shm;
    int64_t ns = grid_ns(gx, gy, gz);
    CUresult r = kernel_body(f, params, extra, &ns);
    return r != CUDA_SUCCESS ? r : run(s, ns);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    int64_t ns = grid_ns(c->gridDimX, c->gridDimY, c->gridDimZ);
    CUresult r = kernel_body(f, params, extra, &ns);
    return r != CUDA_SUCCESS ? r : run(c->hStream, ns);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    (void)f; (void)bx; (void)by; (void)bz; (void)shm; (void)params;
    return run(s, grid_ns(gx, gy, gz));
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return run(s, (int64_t)(uintptr_t)g * 1000); }

/* An event completes when the kernels launched before it on its stream have (at its record if none are
 * left; on the legacy default stream, the process's kernels on every stream). */
struct fake_event { uint64_t seq; int64_t recorded; CUstream captured_on; /* NULL: a plain record */ };
EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    *e = (CUevent)calloc(1, sizeof(struct fake_event));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    struct fake_event *ev = (struct fake_event *)e;
    /* the legacy default stream waits for the process's other streams; any other stream for its own work */
    if (captured(s, 0)) {
        ev->captured_on = s;
        return CUDA_SUCCESS;
    }
    ev->captured_on = NULL;
    ev->seq = (uintptr_t)s <= 1 ? latest_seq : stream_of(s)->seq;
    ev->recorded = fk_now();
    return CUDA_SUCCESS;
}
/* Using an event: CUDA_SUCCESS, or why the capture rules forbid it (and the capture it broke). */
static CUresult event_use(const struct fake_event *ev, const char *kind) {
    if (ev->captured_on != NULL) {
        invalidate_capture(ev->captured_on);
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    return unsafe_call(kind) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}
static int64_t event_time(const struct fake_event *ev) { /* -1: not yet */
    fk_lock();
    fk_advance(fk_now());
    int64_t end = fk_seq_end(ev->seq);
    fk_unlock();
    return end < 0 ? -1 : end > ev->recorded ? end : ev->recorded;
}
EXPORT CUresult cuEventQuery(CUevent e) {
    CUresult r = event_use((struct fake_event *)e, "query");
    if (r != CUDA_SUCCESS) return r;
    return event_time((struct fake_event *)e) >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
    CUresult r = event_use((struct fake_event *)e, "sync");
    if (r != CUDA_SUCCESS) return r;
    wait_seq(((struct fake_event *)e)->seq);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    CUresult r = event_use((struct fake_event *)a, "query");
    if (r == CUDA_SUCCESS) r = event_use((struct fake_event *)b, "query");
    if (r != CUDA_SUCCESS) return r;
    int64_t ta = event_time((struct fake_event *)a), tb = event_time((struct fake_event *)b);
    if (ta < 0 || tb < 0) return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)(tb - ta) / 1e6);
    return CUDA_SUCCESS;
}

/* An entry point no interception library knows: it must reach the driver untouched. */
EXPORT int cuFakeEcho(int x) { return x + 1000; }


/* ---- contents, modules, kernels (what remote mode's tests check end to end) ---------------------------
 * - allocations have contents: host memory mapped lazily (MAP_NORESERVE, so the existing tests' 70 GiB
 *   allocations cost nothing until touched), read and written by cuMemcpy*, cuMemset* and the kernels below;
 *   an access outside every live allocation of the process is CUDA_ERROR_INVALID_VALUE (copies) or
 *   CUDA_ERROR_ILLEGAL_ADDRESS (kernels). Copies and kernels take effect when called (stream order is then
 *   trivially kept); kernels also occupy the device clock as before.
 * - a module image is the text "gpupool-fake-module:NAME,NAME,...", NUL-terminated; anything else is
 *   CUDA_ERROR_INVALID_IMAGE. cuModuleGetFunction finds a NAME the image lists and the fake knows:
 *     add_u32(u32 *buf, u32 n, u32 value)        buf[i] += value for i < n; layout (0,8) (8,4) (12,4)
 *     axpy_u32(u32 a, u32 *x, u32 *y, u32 n)     y[i] = a * x[i] + y[i];    layout (0,4) (8,8) (16,8) (24,4)
 *     spin_us(u64 us)                            occupies the device for us microseconds; layout (0,8)
 *   cuFuncGetParamInfo describes those layouts (CUDA 12.4); parameters come as kernelParams or as an
 *   `extra` CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE block laid out the same way. A NULL function launches the
 *   timing-only kernel the older tests use. */
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_ADDRESS 700

/* The bytes [p, p + n) if one live allocation of this process holds them all, else NULL. */
static unsigned char *bytes_at(uint64_t p, uint64_t n) {
    unsigned char *out = NULL;
    fk_lock();
    for (struct alloc *a = allocs; a != NULL; a = a->next) {
        uint64_t base = a->mapped != 0 ? a->mapped : a->key; /* VMM memory is reached where it is mapped */
        if (p >= base && n <= a->bytes && p - base <= a->bytes - n) {
            if (a->data == NULL) {
                void *m = mmap(NULL, a->bytes ? a->bytes : 1, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (m != MAP_FAILED) a->data = m;
            }
            if (a->data != NULL) out = a->data + (p - base);
            break;
        }
    }
    fk_unlock();
    return out;
}

static CUresult copy_in(CUdeviceptr d, const void *h, size_t n) {
    unsigned char *dst = bytes_at(d, n);
    if (dst == NULL || (h == NULL && n > 0)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, h, n);
    return CUDA_SUCCESS;
}
static CUresult copy_out(void *h, CUdeviceptr d, size_t n) {
    unsigned char *src = bytes_at(d, n);
    if (src == NULL || (h == NULL && n > 0)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(h, src, n);
    return CUDA_SUCCESS;
}
static CUresult copy_dd(CUdeviceptr d, CUdeviceptr s, size_t n) {
    unsigned char *dst = bytes_at(d, n), *src = bytes_at(s, n);
    if (dst == NULL || src == NULL) return CUDA_ERROR_INVALID_VALUE;
    memmove(dst, src, n);
    return CUDA_SUCCESS;
}
static CUresult fill(CUdeviceptr d, unsigned value, unsigned size, size_t count) {
    if (count > UINT64_MAX / size) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *dst = bytes_at(d, (uint64_t)count * size);
    if (dst == NULL || d % size != 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) memcpy(dst + i * size, &value, size); /* little-endian: the low bytes */
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return copy_in(d, h, n); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) { (void)s; return copy_in(d, h, n); }
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return copy_out(h, d, n); }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) { (void)s; return copy_out(h, d, n); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr src, size_t n) { return copy_dd(d, src, n); }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { (void)s; return copy_dd(d, src, n); }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return fill(d, v, 1, n); }
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return fill(d, v, 2, n); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) { return fill(d, v, 4, n); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; return fill(d, v, 1, n); }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)s; return fill(d, v, 2, n); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { (void)s; return fill(d, v, 4, n); }

struct fake_kernel {
    const char *name;
    unsigned nparams;
    size_t offset[4], size[4];
};
static const struct fake_kernel kernels[] = {
    {"add_u32", 3, {0, 8, 12}, {8, 4, 4}},
    {"axpy_u32", 4, {0, 8, 16, 24}, {4, 8, 8, 4}},
    {"spin_us", 1, {0}, {8}},
};
#define FAKE_IMAGE_PREFIX "gpupool-fake-module:"
struct fake_module { char names[1024]; };

static const struct fake_kernel *kernel_of(CUfunction f) {
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if ((const void *)f == (const void *)&kernels[i]) return &kernels[i];
    return NULL;
}
typedef struct CUmod_st *CUmodule;
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    if (m == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
    const char *text = image;
    size_t plen = strlen(FAKE_IMAGE_PREFIX);
    if (strncmp(text, FAKE_IMAGE_PREFIX, plen) != 0 || strlen(text + plen) >= sizeof(struct fake_module) - 2)
        return CUDA_ERROR_INVALID_IMAGE;
    struct fake_module *fm = calloc(1, sizeof *fm);
    snprintf(fm->names, sizeof fm->names, ",%s,", text + plen);
    *m = (CUmodule)fm;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *opts, void **vals) {
    (void)n; (void)opts; (void)vals;
    return cuModuleLoadData(m, image);
}
EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *image) { return cuModuleLoadData(m, image); }
EXPORT CUresult cuModuleUnload(CUmodule m) {
    if (m == NULL) return CUDA_ERROR_INVALID_HANDLE;
    free(m);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    if (f == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (m == NULL) return CUDA_ERROR_INVALID_HANDLE;
    char key[300];
    snprintf(key, sizeof key, ",%s,", name);
    if (strstr(((struct fake_module *)m)->names, key) == NULL) return CUDA_ERROR_NOT_FOUND;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        if (strcmp(kernels[i].name, name) == 0) {
            *f = (CUfunction)(void *)&kernels[i];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size) {
    const struct fake_kernel *k = kernel_of(f);
    if (k == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (index >= k->nparams || offset == NULL || size == NULL) return CUDA_ERROR_INVALID_VALUE;
    *offset = k->offset[index];
    *size = k->size[index];
    return CUDA_SUCCESS;
}

/* Parameter i of a launch, read from kernelParams or from the `extra` block at its offset. */
static int param(const struct fake_kernel *k, void **params, const unsigned char *block, size_t blen, unsigned i,
                 void *out) {
    if (params != NULL) {
        if (params[i] == NULL) return -1;
        memcpy(out, params[i], k->size[i]);
        return 0;
    }
    if (block == NULL || k->offset[i] + k->size[i] > blen) return -1;
    memcpy(out, block + k->offset[i], k->size[i]);
    return 0;
}

static CUresult kernel_body(CUfunction f, void **params, void **extra, int64_t *ns) {
    if (f == NULL) return CUDA_SUCCESS;
    const struct fake_kernel *k = kernel_of(f);
    if (k == NULL) return CUDA_ERROR_INVALID_HANDLE;
    const unsigned char *block = NULL;
    size_t blen = 0;
    for (int i = 0; extra != NULL && extra[i] != NULL; i += 2) {
        if (extra[i] == (void *)1) block = extra[i + 1];
        else if (extra[i] == (void *)2) blen = *(size_t *)extra[i + 1];
        else return CUDA_ERROR_INVALID_VALUE;
    }
    if (params == NULL && block == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (!strcmp(k->name, "spin_us")) {
        uint64_t us;
        if (param(k, params, block, blen, 0, &us) != 0) return CUDA_ERROR_INVALID_VALUE;
        *ns = (int64_t)us * 1000;
        return CUDA_SUCCESS;
    }
    if (!strcmp(k->name, "add_u32")) {
        uint64_t buf;
        uint32_t n, value;
        if (param(k, params, block, blen, 0, &buf) || param(k, params, block, blen, 1, &n) ||
            param(k, params, block, blen, 2, &value))
            return CUDA_ERROR_INVALID_VALUE;
        unsigned char *b = bytes_at(buf, (uint64_t)n * 4);
        if (b == NULL) return CUDA_ERROR_ILLEGAL_ADDRESS;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, b + 4 * (size_t)i, 4);
            v += value;
            memcpy(b + 4 * (size_t)i, &v, 4);
        }
        return CUDA_SUCCESS;
    }
    uint32_t a, n; /* axpy_u32 */
    uint64_t x, y;
    if (param(k, params, block, blen, 0, &a) || param(k, params, block, blen, 1, &x) ||
        param(k, params, block, blen, 2, &y) || param(k, params, block, blen, 3, &n))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *xb = bytes_at(x, (uint64_t)n * 4), *yb = bytes_at(y, (uint64_t)n * 4);
    if (xb == NULL || yb == NULL) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t xv, yv;
        memcpy(&xv, xb + 4 * (size_t)i, 4);
        memcpy(&yv, yb + 4 * (size_t)i, 4);
        yv = a * xv + yv;
        memcpy(yb + 4 * (size_t)i, &yv, 4);
    }
    return CUDA_SUCCESS;
}


/* The VMM calls a migration rebuilds allocations with: an address range is reserved (at the address asked
 * for when no mapping of the process overlaps it, as the driver honours a free requested address), a
 * cuMemCreate handle's memory is mapped there and reached at that address from then on. The granularity is
 * the driver's usual 2 MiB. */
#define FAKE_VMM_GRANULARITY (2ULL << 20)
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    (void)prop; (void)option;
    if (g == NULL) return CUDA_ERROR_INVALID_VALUE;
    *g = FAKE_VMM_GRANULARITY;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    (void)align; (void)flags;
    if (p == NULL || size == 0 || size % FAKE_VMM_GRANULARITY != 0) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    int free_there = addr != 0;
    for (struct alloc *a = allocs; a != NULL && free_there; a = a->next)
        if (a->mapped != 0 && addr < a->mapped + a->bytes && a->mapped < addr + size) free_there = 0;
    if (free_there) {
        *p = addr;
    } else {
        *p = fk->next_ptr;
        fk->next_ptr += size;
    }
    fk_unlock();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p; (void)size; return CUDA_SUCCESS; }
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    (void)flags;
    fk_lock();
    struct alloc *a = allocs;
    while (a != NULL && a->key != h) a = a->next;
    CUresult r = a == NULL || offset != 0 || size > a->bytes || a->mapped != 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) a->mapped = p;
    fk_unlock();
    return r;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    (void)size;
    fk_lock();
    struct alloc *a = allocs;
    while (a != NULL && (a->mapped == 0 || a->mapped != p)) a = a->next;
    if (a != NULL) a->mapped = 0;
    fk_unlock();
    return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count) {
    (void)p; (void)size;
    return desc != NULL && count > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- the rest of a driver a forwarding server calls --------------------------------------------------- */
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (d != 0 || name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "gpupool fake GPU");
    return CUDA_SUCCESS;
}
/* A few attributes with an H100's values (compute capability 9.0, 132 SMs); the others answer 0. */
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    if (d != 0 || v == NULL || attr <= 0 || attr > 140) return CUDA_ERROR_INVALID_VALUE;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : attr == 1 ? 1024 : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { (void)c; return CUDA_SUCCESS; }
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
    *c = have_ctx ? (CUcontext)(uintptr_t)1 : NULL;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int prio) {
    (void)prio;
    return cuStreamCreate(s, flags);
}
EXPORT CUresult cuStreamQuery(CUstream s) {
    fk_lock();
    fk_advance(fk_now());
    int64_t end = fk_seq_end(stream_of(s)->seq);
    fk_unlock();
    return end >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
/* the stream's later work starts after the event's: already so, the process's kernels run in launch order */
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    (void)s; (void)e; (void)flags;
    return CUDA_SUCCESS;
}

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
    {"cuMemAdvise", (void *)cuMemAdvise},
    {"cuMemPrefetchAsync", (void *)cuMemPrefetchAsync},
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
    {"cuMemcpyHtoD_v2", (void *)cuMemcpyHtoD_v2},
    {"cuMemcpyHtoDAsync_v2", (void *)cuMemcpyHtoDAsync_v2},
    {"cuMemcpyDtoH_v2", (void *)cuMemcpyDtoH_v2},
    {"cuMemcpyDtoHAsync_v2", (void *)cuMemcpyDtoHAsync_v2},
    {"cuMemcpyDtoD_v2", (void *)cuMemcpyDtoD_v2},
    {"cuMemcpyDtoDAsync_v2", (void *)cuMemcpyDtoDAsync_v2},
    {"cuMemsetD8_v2", (void *)cuMemsetD8_v2},
    {"cuMemsetD16_v2", (void *)cuMemsetD16_v2},
    {"cuMemsetD32_v2", (void *)cuMemsetD32_v2},
    {"cuMemsetD8Async", (void *)cuMemsetD8Async},
    {"cuMemsetD16Async", (void *)cuMemsetD16Async},
    {"cuMemsetD32Async", (void *)cuMemsetD32Async},
    {"cuModuleLoadData", (void *)cuModuleLoadData},
    {"cuModuleLoadDataEx", (void *)cuModuleLoadDataEx},
    {"cuModuleLoadFatBinary", (void *)cuModuleLoadFatBinary},
    {"cuModuleUnload", (void *)cuModuleUnload},
    {"cuModuleGetFunction", (void *)cuModuleGetFunction},
    {"cuFuncGetParamInfo", (void *)cuFuncGetParamInfo},
    {"cuDeviceGetName", (void *)cuDeviceGetName},
    {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
    {"cuCtxDestroy_v2", (void *)cuCtxDestroy_v2},
    {"cuDevicePrimaryCtxRelease_v2", (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuStreamCreateWithPriority", (void *)cuStreamCreateWithPriority},
    {"cuStreamQuery", (void *)cuStreamQuery},
    {"cuStreamWaitEvent", (void *)cuStreamWaitEvent},
    {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
    {"cuMemAddressReserve", (void *)cuMemAddressReserve},
    {"cuMemAddressFree", (void *)cuMemAddressFree},
    {"cuMemMap", (void *)cuMemMap},
    {"cuMemUnmap", (void *)cuMemUnmap},
    {"cuMemSetAccess", (void *)cuMemSetAccess},
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
