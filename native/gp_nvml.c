/* NVML: the library's own view (device handles, per-process memory for context accounting) and the two
 * memory queries it answers with the pod's share, so nvidia-smi inside the container shows the cap. */
#include "gp.h"

#include <stdlib.h>

#include <string.h>

static nvmlDevice_t handles[GP_MAX_DEV];
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void open_nvml(void) {
    gp_init();
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))gp_nvml_sym("nvmlInit_v2");
    if (init == NULL || init() != NVML_SUCCESS) return;
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *) =
        (nvmlReturn_t(*)(const char *, nvmlDevice_t *))gp_nvml_sym("nvmlDeviceGetHandleByUUID");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))gp_nvml_sym("nvmlDeviceGetHandleByIndex_v2");
    for (int i = 0; i < gp_cfg.ndev; i++) {
        nvmlDevice_t h = NULL;
        if (gp_cfg.by_uuid && by_uuid != NULL) by_uuid(gp_cfg.uuid[i], &h);
        if (h == NULL && by_index != NULL) by_index((unsigned)i, &h);
        handles[i] = h;
    }
}

nvmlDevice_t gp_nvml_device(int li) {
    pthread_once(&nvml_once, open_nvml);
    return li >= 0 && li < GP_MAX_DEV ? handles[li] : NULL;
}

int gp_nvml_index(nvmlDevice_t dev) {
    pthread_once(&nvml_once, open_nvml);
    for (int i = 0; i < gp_cfg.ndev; i++)
        if (handles[i] != NULL && handles[i] == dev) return i;
    return -1;
}

/* The most NVML reports for any of this process's host PIDs on the device (several candidates, see
 * gp_ident.c: the largest is the safe side of the cap); -1 when NVML cannot tell or lists none of them. */
static int64_t nvml_process_bytes(nvmlDevice_t h, const int64_t *mine, int nm) {
    typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    static procs_fn get;
    if (get == NULL) get = (procs_fn)gp_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
    if (get == NULL) return -1;
    /* As many entries as NVML has: a crowded GPU must not push this process out of the list (and its
     * context memory out of the count). */
    unsigned int n = 64, cap = 0;
    nvmlProcessInfo_t *info = NULL;
    nvmlReturn_t r = NVML_ERROR_INSUFFICIENT_SIZE;
    while (r == NVML_ERROR_INSUFFICIENT_SIZE && n <= 65536) {
        cap = n + 16;
        nvmlProcessInfo_t *grown = realloc(info, cap * sizeof *info);
        if (grown == NULL) break;
        info = grown;
        n = cap;
        r = get(h, &n, info);
    }
    int64_t most = -1;
    for (unsigned i = 0; r == NVML_SUCCESS && i < n && i < cap; i++)
        for (int k = 0; k < nm; k++)
            if ((int64_t)info[i].pid == mine[k] && (int64_t)info[i].usedGpuMemory > most)
                most = (int64_t)info[i].usedGpuMemory;
    free(info);
    return most;
}

/* What NVML says this process holds beyond what it allocated through us is context and module memory:
 * counted as the pod's, so the pod's usage as NVML reports it stays within the cap.
 * NVML's figure is only comparable with our own count if no allocation or free of ours changed that count
 * while NVML answered: one made and freed by another thread in between is in NVML's figure and in neither
 * of our readings, and would pass for context memory until the next refresh (refusing allocations that
 * fit). So a reading is taken again when our count changed meanwhile; if every try was disturbed, the
 * smallest estimate stands and the next allocation measures again instead of waiting for the period. */
#define CTX_TRIES 3
void gp_refresh_ctx(int li) {
    static int64_t last[GP_MAX_DEV];
    int64_t now = gp_now_ns();
    if (li < 0 || (last[li] != 0 && now - last[li] < 100000000LL)) return;
    last[li] = now;
    nvmlDevice_t h = gp_nvml_device(li);
    int64_t mine[GP_HOSTPIDS];
    int nm = h == NULL ? 0 : gp_own_host_pids(mine); /* NVML speaks host PIDs, not getpid() */
    if (nm == 0) return;
    uint64_t best = UINT64_MAX;
    int settled = 0;
    for (int t = 0; t < CTX_TRIES && !settled; t++) {
        uint64_t c0, c1;
        uint64_t own = gp_own_used(li, &c0);
        int64_t most = nvml_process_bytes(h, mine, nm);
        uint64_t after = gp_own_used(li, &c1);
        if (most < 0) return;
        if (after > own) own = after;
        uint64_t estimate = (uint64_t)most > own ? (uint64_t)most - own : 0;
        settled = c0 == c1;
        if (settled || estimate < best) best = estimate;
    }
    if (!settled) last[li] = 0;
    gp_set_ctx_bytes(li, best);
}

static int share(nvmlDevice_t dev, unsigned long long *total, unsigned long long *free_b,
                 unsigned long long *used) {
    int li = gp_nvml_index(dev);
    if (li < 0 || gp_cfg.limit[li] == 0) return 0;
    uint64_t limit = gp_cfg.limit[li];
    uint64_t u = gp_pod_used(li);
    *total = limit < *total ? limit : *total;
    *used = u;
    *free_b = u >= *total ? 0 : *total - u;
    return 1;
}

GP_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    static nvmlReturn_t (*real)(nvmlDevice_t, nvmlMemory_t *);
    if (real == NULL) real = (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))gp_nvml_sym("nvmlDeviceGetMemoryInfo");
    if (real == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(dev, mem);
    if (r == NVML_SUCCESS && mem != NULL) share(dev, &mem->total, &mem->free, &mem->used);
    return r;
}

GP_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    static nvmlReturn_t (*real)(nvmlDevice_t, nvmlMemory_v2_t *);
    if (real == NULL)
        real = (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))gp_nvml_sym("nvmlDeviceGetMemoryInfo_v2");
    if (real == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(dev, mem);
    if (r == NVML_SUCCESS && mem != NULL && share(dev, &mem->total, &mem->free, &mem->used)) mem->reserved = 0;
    return r;
}

struct gp_hook gp_nvml_hooks[] = {
    {"nvmlDeviceGetMemoryInfo", (void *)nvmlDeviceGetMemoryInfo, NULL},
    {"nvmlDeviceGetMemoryInfo_v2", (void *)nvmlDeviceGetMemoryInfo_v2, NULL},
    {NULL, NULL, NULL},
};
