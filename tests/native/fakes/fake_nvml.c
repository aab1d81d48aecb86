/* A fake libnvidia-ml.so.1 reading the same simulated device as fake_cuda.c (see fake_state.h). */
#include "fake_state.h"
#include "../../../native/gpupool_cuda.h"

#include <dlfcn.h>
#include <stdio.h>

#define EXPORT __attribute__((visibility("default")))
static int the_device;
#define DEV ((nvmlDevice_t)&the_device)

EXPORT nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "Error"; }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (i != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *d = DEV;
    return NVML_SUCCESS;
}
static const char *uuid_text(void) {
    const char *u = getenv("FAKE_GPU_UUID");
    return u != NULL ? u : "GPU-11111111-2222-3333-4444-555555555555";
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    if (strcasecmp(uuid, uuid_text()) != 0) return NVML_ERROR_NOT_FOUND;
    *d = DEV;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned len) {
    (void)d;
    snprintf(out, len, "%s", uuid_text());
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) { (void)d; *i = 0; return NVML_SUCCESS; }

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    (void)d;
    fk_lock();
    uint64_t used = fk_used_all();
    fk_unlock();
    m->total = fk_total();
    m->used = used;
    m->free = used > m->total ? 0 : m->total - used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(d, &v1);
    m->total = v1.total;
    m->used = v1.used;
    m->free = v1.free;
    m->reserved = 0;
    return NVML_SUCCESS;
}

/* FAKE_NVML_RACES=K, FAKE_NVML_RACE_MIB=M: during K answers, another thread of the asking process
 * allocates M MiB just before NVML reads the table and frees them just after (through whatever
 * cuMemAlloc_v2 the process sees, so through the hook when it is preloaded): the interleaving a hook
 * comparing NVML's figure with its own count must survive, made deterministic. The answers raced are the
 * first K once the process holds a context and has been listed with it once (the hook's identification
 * of itself at context creation is left alone). */
static int race_due(void) {
    static int listed;
    static uint64_t done;
    int has_ctx = 0;
    fk_lock();
    for (int i = 0; i < FAKE_PROCS; i++)
        if (fk->procs[i].pid == getpid()) has_ctx = fk->procs[i].has_ctx;
    fk_unlock();
    if (!has_ctx) return 0;
    if (!listed) {
        listed = 1;
        return 0;
    }
    if (done >= fk_env("FAKE_NVML_RACES", 0)) return 0;
    done++;
    return 1;
}

static void race_begin(CUdeviceptr *p) {
    *p = 0;
    if (!race_due()) return;
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    if (alloc != NULL && alloc(p, (size_t)fk_env("FAKE_NVML_RACE_MIB", 1) << 20) != CUDA_SUCCESS) *p = 0;
}

static void race_end(CUdeviceptr p) {
    CUresult (*release)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(RTLD_DEFAULT, "cuMemFree_v2");
    if (p != 0 && release != NULL) release(p);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *out) {
    (void)d;
    unsigned n = 0;
    CUdeviceptr raced;
    race_begin(&raced);
    fk_lock();
    for (int i = 0; i < FAKE_PROCS; i++) {
        struct fake_proc *p = &fk->procs[i];
        if (!fk_alive(p->pid) || (!p->has_ctx && p->used + p->ctx == 0)) continue;
        if (n < *count) out[n] = (nvmlProcessInfo_t){(unsigned)p->host_pid, p->used + p->ctx, 0xffffffffU, 0xffffffffU};
        n++;
    }
    fk_unlock();
    race_end(raced);
    nvmlReturn_t r = n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return r;
}

/* Per-process utilisation as fake_state.h documents it: each process sampled on the driver's clock at its
 * own phase, smUtil the scaled busy share since its previous sample, visible after a lag, possibly repeated. */
#define MAX_PERIODS 200
#define MAX_PIDS 32
#ifndef NVML_ERROR_NOT_SUPPORTED
#define NVML_ERROR_NOT_SUPPORTED 3
#endif
static int64_t phase_of(int64_t host_pid, int64_t period) {
    FK_PARAM(aligned, "FAKE_GPU_ALIGNED", 0);
    if (aligned) return 0;
    uint64_t h = (uint64_t)host_pid * 0x9e3779b97f4a7c15ULL; /* unrelated phases for unrelated processes */
    return (int64_t)((h >> 17) % (uint64_t)period);
}
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
                                                    unsigned *count, unsigned long long last_seen) {
    (void)d;
    FK_PARAM(period_us, "FAKE_GPU_PERIOD_US", 166667);
    FK_PARAM(lag_us, "FAKE_GPU_LAG_US", 10000);
    FK_PARAM(scale, "FAKE_GPU_SM_SCALE_PCT", 100);
    FK_PARAM(uncapped, "FAKE_GPU_SM_UNCAPPED", 0);
    FK_PARAM(repeat, "FAKE_GPU_NVML_REPEAT", 1);
    FK_PARAM(mig, "FAKE_GPU_MIG", 0);
    if (mig) return NVML_ERROR_NOT_SUPPORTED;
    const char *mode = getenv("FAKE_GPU_NVML_SAMPLES");
    int latest = mode != NULL && strcmp(mode, "latest") == 0;
    int64_t period = (period_us > 0 ? period_us : 1) * 1000;
    int64_t now = fk_now();
    int64_t hi = now - lag_us * 1000;                  /* samples up to here are visible */
    int64_t lo = hi - (MAX_PERIODS - 1) * period;      /* and the history goes back this far */
    int64_t seen = (int64_t)last_seen * 1000;
    /* with repeats, each process's newest sample must be in range even when it is not newer than seen */
    if (!repeat && seen > lo) lo = seen;
    if (repeat && seen - period > lo) lo = seen - period;
    static int64_t busy[MAX_PIDS][MAX_PERIODS];
    static int64_t pids[MAX_PIDS], host[MAX_PIDS], k0[MAX_PIDS], phase[MAX_PIDS];
    int npids = 0;
    memset(busy, 0, sizeof busy);
    fk_lock();
    fk_advance(now);
    for (uint64_t k = fk->iv_count; k > 0 && k + FAKE_IVS > fk->iv_count; k--) {
        struct fake_iv *iv = &fk->iv[(k - 1) % FAKE_IVS];
        if (iv->end <= lo - period) break; /* pieces are appended in start order and never overlap */
        int p = 0;
        while (p < npids && pids[p] != iv->pid) p++;
        if (p == npids) {
            if (npids == MAX_PIDS) continue;
            pids[npids] = iv->pid;
            host[npids] = fk_host_pid(iv->pid);
            phase[npids] = phase_of(host[npids], period);
            k0[npids] = floor_div(lo - phase[npids], period) + 1; /* the first sample after lo */
            npids++;
        }
        /* sample j of this process is at t_j = phase + (k0 + j) * period and covers (t_j - period, t_j] */
        int64_t j_first = floor_div(iv->start - phase[p], period) - k0[p];
        for (int64_t j = j_first < 0 ? 0 : j_first; j < MAX_PERIODS; j++) {
            int64_t b = phase[p] + (k0[p] + j) * period, a = b - period;
            if (a >= iv->end) break;
            int64_t st = iv->start > a ? iv->start : a, e = iv->end < b ? iv->end : b;
            if (e > st) busy[p][j] += e - st;
        }
    }
    fk_unlock();
    unsigned n = 0;
    for (int p = 0; p < npids; p++) {
        int64_t newest = -1; /* the newest visible sample of the process with busy time */
        for (int64_t j = 0; j < MAX_PERIODS; j++) {
            int64_t t = phase[p] + (k0[p] + j) * period;
            if (t > hi) break;
            if (busy[p][j] > 0) newest = j;
        }
        for (int64_t j = 0; j < MAX_PERIODS; j++) {
            int64_t t = phase[p] + (k0[p] + j) * period;
            if (t > hi) break;
            if (busy[p][j] == 0) continue;
            int fresh = t / 1000 > (int64_t)last_seen;
            if (latest && j != newest) continue;
            if (!fresh && !(repeat && j == newest)) continue;
            unsigned util = (unsigned)((busy[p][j] * scale * 2 + period) / (2 * period));
            if (!uncapped && util > 100) util = 100;
            if (out != NULL && n < *count)
                out[n] = (nvmlProcessUtilizationSample_t){(unsigned)host[p], (unsigned long long)(t / 1000), util,
                                                          0, 0, 0};
            n++;
        }
    }
    if (out == NULL || n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

EXPORT int nvmlFakeEcho(int x) { return x + 2000; }
