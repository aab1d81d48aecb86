/* Which host PID NVML knows this process by.
 *
 * Inside a container (its own PID namespace) getpid() is the container's number, while NVML reports the
 * host's, so the two never match and the samples of the pod's own kernels would go unrecognised. The
 * driver is the only party that sees both: the process compares the processes NVML lists on the device
 * just before and just after it creates its context there, and the one that appeared is itself. Processes
 * of the pod create contexts one at a time (gp_ident_lock), so a sibling never appears in the difference;
 * a process of another pod starting in the same instant can. Then the process marks itself: it allocates
 * a buffer of a size drawn at random (a multiple of 2 MiB, NVML's granularity), and the candidate whose
 * memory grew by exactly that is itself; the buffer is freed at once (and reserved in the pod's accounting
 * meanwhile). Should that stay ambiguous after three draws, every candidate is kept (up to GP_HOSTPIDS),
 * which can only make the pod pace itself harder, never less.
 *
 * A process that cannot get an accounting slot (the pod's table is full) is refused its context: a
 * process the pod cannot count must not run on the GPU. */
#include "gp.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LISTED 512
static int identified;        /* 1 once the before/after comparison has run for this process */
static pthread_mutex_t ident_mu = PTHREAD_MUTEX_INITIALIZER;

typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

/* The host PIDs holding a context on the device (and their memory, when `mem`), or -1 when NVML cannot say. */
static int listed_mem(int li, int64_t *out, uint64_t *mem) {
    static procs_fn get;
    if (get == NULL) get = (procs_fn)gp_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
    nvmlDevice_t h = gp_nvml_device(li);
    if (get == NULL || h == NULL) return -1;
    nvmlProcessInfo_t *info = calloc(MAX_LISTED, sizeof *info);
    if (info == NULL) return -1;
    unsigned int n = MAX_LISTED;
    nvmlReturn_t r = get(h, &n, info);
    int count = -1;
    if (r == NVML_SUCCESS) {
        count = 0;
        for (unsigned i = 0; i < n && i < MAX_LISTED; i++) {
            if (mem != NULL) mem[count] = info[i].usedGpuMemory;
            out[count++] = info[i].pid;
        }
    }
    free(info);
    return count;
}

static int listed(int li, int64_t *out) { return listed_mem(li, out, NULL); }

/* The memory NVML reports for host PID `pid` (UINT64_MAX when it is not listed). */
static uint64_t memory_of(const int64_t *pids, const uint64_t *mem, int n, int64_t pid) {
    for (int i = 0; i < n; i++)
        if (pids[i] == pid) return mem[i];
    return UINT64_MAX;
}

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*ctxpush_fn)(CUcontext);
typedef CUresult (*ctxpop_fn)(CUcontext *);

/* Narrow several candidates down to the one whose memory follows an allocation of ours (see above). */
static void mark_self(int li, CUcontext ctx, int push, int64_t *mine, int *nm) {
    GP_REAL(alloc_fn, ralloc, "cuMemAlloc_v2");
    GP_REAL(free_fn, rfree, "cuMemFree_v2");
    GP_REAL(ctxpush_fn, rpush, "cuCtxPushCurrent_v2");
    GP_REAL(ctxpop_fn, rpop, "cuCtxPopCurrent_v2");
    if (ralloc == NULL || rfree == NULL || (push && (rpush == NULL || rpop == NULL))) return;
    int64_t *pids = calloc(2 * MAX_LISTED, sizeof *pids);
    uint64_t *mem = calloc(2 * MAX_LISTED, sizeof *mem);
    unsigned seed = (unsigned)getpid() ^ (unsigned)gp_now_ns();
    if (pids == NULL || mem == NULL || (push && rpush(ctx) != CUDA_SUCCESS)) {
        free(pids);
        free(mem);
        return;
    }
    for (int attempt = 0; attempt < 3 && *nm > 1; attempt++) {
        uint64_t size = (uint64_t)(1 + rand_r(&seed) % 24) << 21;
        int n0 = listed_mem(li, pids, mem);
        if (n0 < 0 || gp_mem_reserve(li, size) != 0) break;
        CUdeviceptr p = 0;
        int n1 = -1;
        if (ralloc(&p, size) == CUDA_SUCCESS) {
            n1 = listed_mem(li, pids + MAX_LISTED, mem + MAX_LISTED);
            rfree(p);
        }
        gp_mem_release(li, size);
        if (n1 < 0) break;
        int64_t grew[GP_HOSTPIDS];
        int ng = 0;
        for (int k = 0; k < *nm; k++) {
            uint64_t a = memory_of(pids, mem, n0, mine[k]), b = memory_of(pids + MAX_LISTED, mem + MAX_LISTED, n1, mine[k]);
            if (a != UINT64_MAX && b != UINT64_MAX && b >= a + size && b < a + size + (2u << 20)) grew[ng++] = mine[k];
        }
        if (ng == 1) {
            mine[0] = grew[0];
            *nm = 1;
        }
    }
    if (push) {
        CUcontext popped;
        rpop(&popped);
    }
    free(pids);
    free(mem);
}

static int contains(const int64_t *v, int n, int64_t x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

struct before {
    int li;
    int n;                    /* -1: nothing to compare (already identified, or NVML silent) */
    int64_t pids[MAX_LISTED];
};

/* 0 to go on with the real call, or the error to return instead. */
static CUresult ident_begin(CUdevice dev, struct before *b) {
    b->n = -1;
    b->li = gp_device_index(dev);
    if (b->li < 0) return CUDA_SUCCESS;  /* no limit on this GPU: nothing to count it against */
    if (!gp_has_slot()) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&ident_mu);
    if (identified) {
        pthread_mutex_unlock(&ident_mu);
        return CUDA_SUCCESS;
    }
    gp_ident_lock(1);
    b->n = listed(b->li, b->pids);
    return CUDA_SUCCESS;                  /* ident_mu and the pod's lock stay held until ident_end */
}

static void ident_end(struct before *b, CUresult r, CUcontext ctx, int push) {
    if (b->li < 0) return;
    if (b->n < 0) {
        if (!identified) {
            gp_ident_lock(0);
            pthread_mutex_unlock(&ident_mu);
        }
        return;
    }
    int64_t *after = calloc(MAX_LISTED, sizeof *after);
    int na = r == CUDA_SUCCESS && after != NULL ? listed(b->li, after) : -1;
    int64_t mine[GP_HOSTPIDS], pod[GP_MAX_SLOTS * GP_HOSTPIDS + GP_HOSTPIDS];
    int nm = 0, np = gp_pod_pids(pod, (int)(sizeof pod / sizeof pod[0])), extra = 0;
    for (int i = 0; i < na; i++) {
        if (contains(b->pids, b->n, after[i]) || contains(pod, np, after[i])) continue;
        if (nm < GP_HOSTPIDS) mine[nm++] = after[i];
        else extra++;
    }
    /* Nothing new: our context was there before (or the driver lists late). Without a PID namespace the
     * host PID is our own; otherwise we stay unidentified rather than guess. */
    if (nm == 0 && na > 0 && contains(after, na, (int64_t)getpid())) mine[nm++] = getpid();
    if (nm > 1 && extra == 0) mark_self(b->li, ctx, push, mine, &nm);
    if (na >= 0) {
        identified = 1;
        if (nm > 0) gp_set_host_pids(mine, nm);
        if (nm == 0) gp_log("NVML did not list this process's new context; its kernels are paced on estimates");
        if (nm > 1 || extra > 0)
            gp_log("%d processes started on the GPU together; all are counted as this one", nm + extra);
    }
    free(after);
    gp_ident_lock(0);
    pthread_mutex_unlock(&ident_mu);
}

void gp_ident_after_fork(void) {
    pthread_mutex_init(&ident_mu, NULL);
    identified = 0; /* a new process: a new host PID, and no context yet */
}

/* ---- context creation --------------------------------------------------------------------------------- */
typedef CUresult (*create_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*create3_fn)(CUcontext *, void *, int, unsigned int, CUdevice);
typedef CUresult (*create4_fn)(CUcontext *, void *, unsigned int, CUdevice);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);

/* push: the call leaves the new context not current (a primary context is only retained) */
#define IDENT_AROUND(call, push)                                       \
    struct before *b = malloc(sizeof *b);                              \
    if (b == NULL) return CUDA_ERROR_OUT_OF_MEMORY;                    \
    CUresult r = ident_begin(dev, b);                                  \
    if (r == CUDA_SUCCESS) {                                           \
        r = call;                                                      \
        ident_end(b, r, r == CUDA_SUCCESS && ctx ? *ctx : NULL, push); \
    }                                                                  \
    free(b);                                                           \
    return r;

GP_EXPORT CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    GP_REAL(create_fn, real, "cuCtxCreate");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    IDENT_AROUND(real(ctx, flags, dev), 0)
}

GP_EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    GP_REAL(create_fn, real, "cuCtxCreate_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    IDENT_AROUND(real(ctx, flags, dev), 0)
}

GP_EXPORT CUresult cuCtxCreate_v3(CUcontext *ctx, void *params, int n, unsigned int flags, CUdevice dev) {
    GP_REAL(create3_fn, real, "cuCtxCreate_v3");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    IDENT_AROUND(real(ctx, params, n, flags, dev), 0)
}

GP_EXPORT CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned int flags, CUdevice dev) {
    GP_REAL(create4_fn, real, "cuCtxCreate_v4");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    IDENT_AROUND(real(ctx, params, flags, dev), 0)
}

GP_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    GP_REAL(retain_fn, real, "cuDevicePrimaryCtxRetain");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    IDENT_AROUND(real(ctx, dev), 1)
}

struct gp_hook gp_ident_hooks[] = {
#define H(n) {#n, (void *)n, NULL},
    H(cuCtxCreate) H(cuCtxCreate_v2) H(cuCtxCreate_v3) H(cuCtxCreate_v4) H(cuDevicePrimaryCtxRetain)
#undef H
    {NULL, NULL, NULL},
};
