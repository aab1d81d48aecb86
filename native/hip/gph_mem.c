/* The memory cap for HIP programs: every allocating entry point of the hipMalloc family reserves its bytes
 * in the pod's accounting (gp_shared.c) *before* the runtime is called, so two processes racing for the
 * last bytes cannot both pass the cap; a failed call gives them back, hipFree / hipFreeAsync give back
 * what the pointer held. hipMemGetInfo and hipDeviceTotalMem answer with the share: the cap as the total,
 * the cap less what the pod holds as free (never more than the device really has free).
 *
 * Counted: hipMalloc, hipExtMallocWithFlags, hipMallocManaged (its pages may all come to the GPU, so they
 * count where they may land), hipMallocPitch and hipMemAllocPitch (the pitched rows the runtime really
 * made), hipMallocAsync and
 * hipMallocFromPoolAsync (per allocation, until its free). Not counted: hipHostMalloc (pinned host memory;
 * the device holds none of it). Not intercepted (docs/hook-hip.md): arrays, hipMalloc3D, the virtual
 * memory API (hipMemCreate), and what a stream-ordered pool keeps cached after a free. */
#include "gph.h"

#include <stdlib.h>

/* ---- what this process allocated: pointer -> (limit index, bytes) -------------------------------------- */
struct rec {
    uintptr_t key;
    int li;
    uint64_t bytes;
    struct rec *next;
};
#define NBUCKETS 4096
static struct rec *buckets[NBUCKETS];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket(uintptr_t key) { return (size_t)(((uint64_t)key >> 4) * 0x9E3779B97F4A7C15ULL % NBUCKETS); }

static void remember(void *p, int li, uint64_t bytes) {
    struct rec *r = malloc(sizeof *r);
    if (r == NULL) return; /* the bytes stay counted: the safe side of the cap */
    r->key = (uintptr_t)p;
    r->li = li;
    r->bytes = bytes;
    pthread_mutex_lock(&table_mu);
    size_t b = bucket(r->key);
    r->next = buckets[b];
    buckets[b] = r;
    pthread_mutex_unlock(&table_mu);
}

static void forget(void *p) {
    uintptr_t key = (uintptr_t)p;
    pthread_mutex_lock(&table_mu);
    struct rec **at = &buckets[bucket(key)];
    while (*at != NULL && (*at)->key != key) at = &(*at)->next;
    struct rec *r = *at;
    if (r != NULL) *at = r->next;
    pthread_mutex_unlock(&table_mu);
    if (r != NULL) {
        gp_mem_release(r->li, r->bytes);
        free(r);
    }
}

/* ---- the reservation around each call ----------------------------------------------------------------- */
/* Reserve `bytes` on the current device's limit: 0 when refused. *li is -1 for a device without a limit. */
static int admit(int *li, uint64_t bytes) {
    *li = gph_current_index();
    if (*li == GPH_UNKNOWN) return 0;
    return *li < 0 || gp_mem_reserve(*li, bytes) == 0;
}

/* After the runtime answered: keep the reservation for the pointer it made, or give it back. */
static hipError_t settle(int li, uint64_t bytes, void **ptr, hipError_t r) {
    if (li < 0) return r;
    if (r != hipSuccess || ptr == NULL || *ptr == NULL) gp_mem_release(li, bytes); /* size 0 makes no pointer */
    else remember(*ptr, li, bytes);
    return r;
}

static uint64_t product(size_t a, size_t b) {
    uint64_t v;
    return __builtin_mul_overflow((uint64_t)a, (uint64_t)b, &v) ? UINT64_MAX : v;
}

/* ---- allocations --------------------------------------------------------------------------------------- */
GP_EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
    GPH_REAL(hipError_t (*)(void **, size_t), real, "hipMalloc");
    if (real == NULL) return hipErrorNotInitialized;
    int li;
    if (!admit(&li, size)) return hipErrorOutOfMemory;
    return settle(li, size, ptr, real(ptr, size));
}

GP_EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags) {
    GPH_REAL(hipError_t (*)(void **, size_t, unsigned int), real, "hipExtMallocWithFlags");
    if (real == NULL) return hipErrorNotInitialized;
    int li;
    if (!admit(&li, size)) return hipErrorOutOfMemory;
    return settle(li, size, ptr, real(ptr, size, flags));
}

GP_EXPORT hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags) {
    GPH_REAL(hipError_t (*)(void **, size_t, unsigned int), real, "hipMallocManaged");
    if (real == NULL) return hipErrorNotInitialized;
    int li;
    if (!admit(&li, size)) return hipErrorOutOfMemory;
    return settle(li, size, ptr, real(ptr, size, flags));
}

GP_EXPORT hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream) {
    GPH_REAL(hipError_t (*)(void **, size_t, hipStream_t), real, "hipMallocAsync");
    if (real == NULL) return hipErrorNotInitialized;
    int li;
    if (!admit(&li, size)) return hipErrorOutOfMemory;
    return settle(li, size, ptr, real(ptr, size, stream));
}

GP_EXPORT hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream) {
    GPH_REAL(hipError_t (*)(void **, size_t, hipMemPool_t, hipStream_t), real, "hipMallocFromPoolAsync");
    if (real == NULL) return hipErrorNotInitialized;
    int li;
    if (!admit(&li, size)) return hipErrorOutOfMemory;
    return settle(li, size, ptr, real(ptr, size, pool, stream));
}

/* The runtime pads each row to its alignment: the width times the height is reserved first, and what the
 * padding adds on top once the pitch is known (refused and undone when that passes the cap). elem is
 * hipMemAllocPitch's element size, 0 for hipMallocPitch. */
typedef hipError_t (*pitch_fn)(void **, size_t *, size_t, size_t);
typedef hipError_t (*mem_pitch_fn)(void **, size_t *, size_t, size_t, unsigned int);

static hipError_t pitched(void *real, void **ptr, size_t *pitch, size_t width, size_t height, unsigned int elem,
                          int driver_form) {
    GPH_REAL(hipError_t (*)(void *), rfree, "hipFree");
    if (real == NULL || rfree == NULL) return hipErrorNotInitialized;
    int li;
    uint64_t want = product(width, height);
    if (!admit(&li, want)) return hipErrorOutOfMemory;
    hipError_t r = driver_form ? ((mem_pitch_fn)real)(ptr, pitch, width, height, elem)
                               : ((pitch_fn)real)(ptr, pitch, width, height);
    if (li < 0 || r != hipSuccess || ptr == NULL || *ptr == NULL || pitch == NULL) return settle(li, want, ptr, r);
    uint64_t got = product(*pitch, height);
    if (got > want && gp_mem_reserve(li, got - want) != 0) {
        rfree(*ptr);
        *ptr = NULL;
        gp_mem_release(li, want);
        return hipErrorOutOfMemory;
    }
    if (got < want) gp_mem_release(li, want - got);
    remember(*ptr, li, got);
    return r;
}

GP_EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height) {
    GPH_REAL(pitch_fn, real, "hipMallocPitch");
    return pitched((void *)real, ptr, pitch, width, height, 0, 0);
}

/* The driver-API form (hipify's cuMemAllocPitch), freed with hipFree like the others. */
GP_EXPORT hipError_t hipMemAllocPitch(void **ptr, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    GPH_REAL(mem_pitch_fn, real, "hipMemAllocPitch");
    return pitched((void *)real, ptr, pitch, width, height, elem, 1);
}

/* ---- frees --------------------------------------------------------------------------------------------- */
GP_EXPORT hipError_t hipFree(void *p) {
    GPH_REAL(hipError_t (*)(void *), real, "hipFree");
    if (real == NULL) return hipErrorNotInitialized;
    hipError_t r = real(p);
    if (r == hipSuccess && p != NULL) forget(p);
    return r;
}

GP_EXPORT hipError_t hipFreeAsync(void *p, hipStream_t stream) {
    GPH_REAL(hipError_t (*)(void *, hipStream_t), real, "hipFreeAsync");
    if (real == NULL) return hipErrorNotInitialized;
    hipError_t r = real(p, stream);
    if (r == hipSuccess && p != NULL) forget(p);
    return r;
}

/* ---- what the program is told -------------------------------------------------------------------------- */
static void share_info(int li, size_t *free_b, size_t *total_b) {
    uint64_t limit = gp_cfg.limit[li];
    if (limit == 0) return;
    uint64_t used = gp_pod_used(li);
    uint64_t avail = used >= limit ? 0 : limit - used;
    if (total_b != NULL && limit < *total_b) *total_b = limit;
    if (free_b != NULL && avail < *free_b) *free_b = avail;
}

GP_EXPORT hipError_t hipMemGetInfo(size_t *free_b, size_t *total_b) {
    GPH_REAL(hipError_t (*)(size_t *, size_t *), real, "hipMemGetInfo");
    if (real == NULL) return hipErrorNotInitialized;
    hipError_t r = real(free_b, total_b);
    int li = r == hipSuccess ? gph_current_index() : -1;
    if (li == GPH_UNKNOWN) { /* a limit holds, on which device is unknown: nothing is on offer */
        if (free_b != NULL) *free_b = 0;
    } else if (li >= 0) {
        share_info(li, free_b, total_b);
    }
    return r;
}

GP_EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device) {
    GPH_REAL(hipError_t (*)(size_t *, hipDevice_t), real, "hipDeviceTotalMem");
    if (real == NULL) return hipErrorNotInitialized;
    hipError_t r = real(bytes, device);
    int li = r == hipSuccess ? gph_device_index(device) : -1;
    if (li >= 0) share_info(li, NULL, bytes);
    return r;
}

void gph_mem_after_fork(void) {
    /* The child holds none of its parent's device memory (HIP does not survive a fork): it starts empty. */
    pthread_mutex_init(&table_mu, NULL);
    for (int i = 0; i < NBUCKETS; i++) buckets[i] = NULL; /* leaked on purpose: the parent's, copy-on-write */
}

struct gp_hook gph_mem_hooks[] = {
#define H(n) {#n, (void *)n, NULL},
    H(hipMalloc) H(hipExtMallocWithFlags) H(hipMallocManaged) H(hipMallocAsync) H(hipMallocFromPoolAsync)
    H(hipMallocPitch) H(hipMemAllocPitch) H(hipFree) H(hipFreeAsync) H(hipMemGetInfo) H(hipDeviceTotalMem)
#undef H
    {NULL, NULL, NULL},
};
