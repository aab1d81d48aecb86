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

#define MAX_PERIODS 200
#define MAX_PIDS 32
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
                                                    unsigned *count, unsigned long long last_seen) {
    (void)d;
    int64_t period = (int64_t)fk_env("FAKE_GPU_PERIOD_US", 10000) * 1000;
    int64_t now = fk_now();
    int64_t last_end = now / period * period; /* the newest finished period ends here */
    int64_t first_end = last_end - (MAX_PERIODS - 1) * period;
    if ((int64_t)last_seen * 1000 + period > first_end) first_end = (int64_t)last_seen * 1000 + period;
    first_end = (first_end + period - 1) / period * period;
    const char *mode = getenv("FAKE_GPU_NVML_SAMPLES");
    if (mode != NULL && strcmp(mode, "latest") == 0 && first_end < last_end) first_end = last_end;
    static int64_t busy[MAX_PERIODS][MAX_PIDS];
    static int64_t pids[MAX_PIDS];
    int npids = 0, nper = first_end > last_end ? 0 : (int)((last_end - first_end) / period) + 1;
    fk_lock();
    memset(busy, 0, sizeof busy);
    int64_t lo = first_end - period;
    for (uint64_t k = fk->iv_count; k > 0 && k + FAKE_IVS > fk->iv_count; k--) {
        struct fake_iv *iv = &fk->iv[(k - 1) % FAKE_IVS];
        if (iv->end <= lo) break; /* intervals are appended in start order and never overlap */
        int p = 0;
        while (p < npids && pids[p] != iv->pid) p++;
        if (p == npids) {
            if (npids == MAX_PIDS) continue;
            pids[npids++] = iv->pid;
        }
        for (int j = 0; j < nper; j++) {
            int64_t a = first_end - period + j * period, b = a + period;
            int64_t s = iv->start > a ? iv->start : a, e = iv->end < b ? iv->end : b;
            if (e > s) busy[j][p] += e - s;
        }
    }
    int64_t host[MAX_PIDS];
    for (int p = 0; p < npids; p++) host[p] = fk_host_pid(pids[p]);
    fk_unlock();
    unsigned n = 0;
    for (int j = 0; j < nper; j++)
        for (int p = 0; p < npids; p++) {
            if (busy[j][p] == 0) continue;
            if (out != NULL && n < *count) {
                out[n] = (nvmlProcessUtilizationSample_t){(unsigned)host[p],
                                                          (unsigned long long)((first_end + j * period) / 1000),
                                                          (unsigned)((busy[j][p] * 100 + period / 2) / period), 0,
                                                          0, 0};
            }
            n++;
        }
    if (out == NULL || n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

EXPORT int nvmlFakeEcho(int x) { return x + 2000; }
