/* A fake HIP runtime (libamdhip64.so) for the HIP memory cap's tests, written from HIP's API reference: the
 * memory entry points the cap wraps, with the answers the reference documents, on simulated devices whose
 * memory is shared by every process of a test.
 *
 * Behaviour (what the tests rely on):
 * - devices: FAKE_HIP_DEVICES (default 1, at most 8), each with FAKE_HIP_MEM_MIB of memory (default 196608:
 *   an MI300X's 192 GiB). The current device is per thread, 0 until hipSetDevice.
 * - memory: FAKE_GPU_STATE names the file holding what each process holds on each device (its layout is
 *   this fake's own), so hipMemGetInfo answers for the whole device, as ROCm's does (the free memory of
 *   the device, every process's allocations taken off); a dead process's memory is freed (kill(pid, 0):
 *   the tests share one PID space). Unset: each process sees devices of its own.
 * - an allocation that does not fit the device's free memory fails with hipErrorOutOfMemory.
 * - hipMalloc, hipExtMallocWithFlags, hipMallocAsync, hipMallocFromPoolAsync, hipMallocManaged: size 0
 *   allocates nothing, sets *ptr to NULL and succeeds; a NULL ptr is hipErrorInvalidValue.
 *   hipExtMallocWithFlags takes hipDeviceMallocDefault / Finegrained / SignalMemory / Uncached, anything
 *   else is hipErrorInvalidValue; hipMallocManaged takes hipMemAttachGlobal or hipMemAttachHost (its pages
 *   are counted on the device: the fake simulates a GPU where they live there); hipMallocFromPoolAsync
 *   needs a pool (hipDeviceGetDefaultMemPool hands one out).
 * - hipMallocPitch and hipMemAllocPitch: rows padded to 128 bytes (the alignment the reference states);
 *   width or height 0 allocates nothing; hipMemAllocPitch's element size must be 4, 8 or 16.
 * - granularity: the reference documents none for hipMalloc (hipMallocManaged "should be" a multiple of
 *   4 KiB, a recommendation, not an error): the fake counts the bytes asked for.
 * - hipFree(NULL) succeeds; hipFree of a pointer that is not a live device allocation of this process
 *   (a host pointer from hipHostMalloc included) is hipErrorInvalidDevicePointer; hipFreeAsync of one is
 *   hipErrorInvalidValue (its reference lists no other error for a bad pointer).
 * - hipHostMalloc / hipHostFree: pinned host memory, never counted on a device.
 * - hipGetProcAddress finds the fake's own entry points by name (hipSuccess; an unknown name sets
 *   HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND and answers hipErrorInvalidValue, the only error the reference
 *   lists). hipFakeEcho(x) = x + 1000: a function the cap does not wrap, to see lookups pass it through.
 * Pointers are addresses of nothing: the fake never touches the memory it "allocates".
 *
 * Streams and kernels, on the fake HSA runtime (fake_hsa.c, libhsa-runtime64.so.1, linked: its functions are
 * called through the PLT, as ROCclr calls HSA's, so a preloaded library sees them):
 * - hipStreamCreate / hipStreamCreateWithFlags take a hardware queue from the device's pool: up to
 *   GPU_MAX_HW_QUEUES (default 4) queues per device, made with hsa_queue_create as streams need them and
 *   then shared round-robin, as ROCclr does. The null stream is one more stream of the device, made on its
 *   first use, with its queue from the same pool. A queue that cannot be made makes the stream's creation
 *   (or the null stream's kernel) fail with hipErrorOutOfMemory.
 * - ROC_GLOBAL_CU_MASK (fake_hsa.h's parser, the documented syntax): HIP sets it on every queue it makes,
 *   through hsa_amd_queue_cu_set_mask; a failing call is ignored (the queue keeps running on every CU, the
 *   fail-open that HAMi's notes describe).
 * - hipExtStreamCreateWithCUMask(stream, n, mask): n dwords (hipErrorInvalidValue for 0 or a NULL mask,
 *   hipErrorInvalidHandle for a NULL stream); the stream gets a queue of its own, whose mask is set with
 *   hsa_amd_queue_cu_set_mask(queue, 32 * n, mask AND ROC_GLOBAL_CU_MASK); a status other than success or
 *   HSA_STATUS_CU_MASK_REDUCED destroys the queue and answers hipErrorInvalidValue.
 * - hipExtStreamGetCUMask(stream, n, mask): the stream's mask as HIP recorded it (a CU-masked stream's, else
 *   ROC_GLOBAL_CU_MASK's, else every CU), n dwords, zero beyond the card; hipErrorInvalidValue for n 0 or a
 *   NULL mask.
 * - hipLaunchKernel(f, grid, block, args, shmem, stream): the fake's kernels are described by args[0], a
 *   uint64_t of work in CU-microseconds, run on the stream's queue (fakehsa_dispatch);
 *   hipErrorLaunchFailure when the HSA runtime cannot run it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_hsa.h"
#include "fake_shm.h"

#define FK_DEVS 8
#define FK_PROCS 128
#define FK_MAGIC 0x5049484b41464bULL /* "KFAKHIP" */
#define FK_ALLOCS 65536

struct fk_proc {
    int64_t pid;
    uint64_t used[FK_DEVS];
};
struct fk_state {
    uint64_t magic;
    struct fk_proc procs[FK_PROCS];
};

static struct fk_state *st;
static int st_fd = -1;
static int ndev = 1;
static uint64_t dev_bytes = 196608ULL << 20;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int current;

enum { K_FREE = 0, K_DEVICE, K_HOST };
static struct {
    uintptr_t ptr;
    int kind;
    int dev;
    uint64_t bytes;
} allocs[FK_ALLOCS];
static uintptr_t next_va = 0x7a0000000000ULL;

static uint64_t env_u64(const char *name, uint64_t fallback) {
    const char *v = getenv(name);
    return v != NULL && *v ? strtoull(v, NULL, 10) : fallback;
}

static void setup(void) {
    ndev = (int)env_u64("FAKE_HIP_DEVICES", 1);
    if (ndev < 1) ndev = 1;
    if (ndev > FK_DEVS) ndev = FK_DEVS;
    dev_bytes = env_u64("FAKE_HIP_MEM_MIB", 196608) << 20;
    st = fk_map_shared(getenv("FAKE_GPU_STATE"), sizeof *st, FK_MAGIC, &st_fd);
}

static void lock(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    if (st_fd >= 0) flock(st_fd, LOCK_EX);
}

static void unlock(void) {
    if (st_fd >= 0) flock(st_fd, LOCK_UN);
    pthread_mutex_unlock(&mu);
}

static int alive(int64_t pid) { return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM); }

/* With the lock held: what every live process holds on `dev` (the dead ones' entries cleared), and this
 * process's entry. */
static uint64_t device_used(int dev, struct fk_proc **mine) {
    uint64_t sum = 0;
    int64_t me = getpid();
    *mine = NULL;
    struct fk_proc *empty = NULL;
    for (int i = 0; i < FK_PROCS; i++) {
        struct fk_proc *p = &st->procs[i];
        if (p->pid == me) *mine = p;
        else if (p->pid != 0 && !alive(p->pid)) memset(p, 0, sizeof *p);
        if (p->pid == 0 && empty == NULL) empty = p;
        sum += p->used[dev];
    }
    if (*mine == NULL && empty != NULL) {
        empty->pid = me;
        *mine = empty;
    }
    return sum;
}

static hipError_t take(void **ptr, uint64_t bytes, int kind) {
    if (ptr == NULL) return hipErrorInvalidValue;
    if (bytes == 0) {
        *ptr = NULL;
        return hipSuccess;
    }
    lock();
    int dev = current;
    struct fk_proc *mine;
    hipError_t r = hipSuccess;
    if (kind == K_DEVICE) {
        uint64_t used = device_used(dev, &mine);
        if (mine == NULL || bytes > dev_bytes || used > dev_bytes - bytes) r = hipErrorOutOfMemory;
    }
    int slot = -1;
    for (int i = 0; r == hipSuccess && i < FK_ALLOCS && slot < 0; i++)
        if (allocs[i].kind == K_FREE) slot = i;
    if (r == hipSuccess && slot < 0) r = hipErrorOutOfMemory;
    if (r == hipSuccess) {
        allocs[slot].ptr = next_va;
        allocs[slot].kind = kind;
        allocs[slot].dev = dev;
        allocs[slot].bytes = bytes;
        next_va += ((bytes + 4095) & ~4095ULL) + 4096; /* never two allocations at one address */
        if (kind == K_DEVICE) mine->used[dev] += bytes;
        *ptr = (void *)allocs[slot].ptr;
    }
    unlock();
    return r;
}

/* Give back a live allocation of `kind` at p: 0 when there is none. */
static int give(void *p, int kind) {
    lock();
    int found = 0;
    for (int i = 0; i < FK_ALLOCS && !found; i++) {
        if (allocs[i].kind != kind || allocs[i].ptr != (uintptr_t)p) continue;
        found = 1;
        if (kind == K_DEVICE) {
            struct fk_proc *mine;
            device_used(allocs[i].dev, &mine);
            if (mine != NULL) mine->used[allocs[i].dev] -= allocs[i].bytes;
        }
        allocs[i].kind = K_FREE;
    }
    unlock();
    return found;
}

hipError_t hipInit(unsigned int flags) {
    (void)flags;
    pthread_once(&once, setup);
    return hipSuccess;
}

hipError_t hipGetDeviceCount(int *count) {
    pthread_once(&once, setup);
    if (count == NULL) return hipErrorInvalidValue;
    *count = ndev;
    return hipSuccess;
}

hipError_t hipGetDevice(int *dev) {
    if (dev == NULL) return hipErrorInvalidValue;
    *dev = current;
    return hipSuccess;
}

hipError_t hipSetDevice(int dev) {
    pthread_once(&once, setup);
    if (dev < 0 || dev >= ndev) return hipErrorInvalidDevice;
    current = dev;
    return hipSuccess;
}

hipError_t hipMalloc(void **ptr, size_t size) { return take(ptr, size, K_DEVICE); }

hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags) {
    if (flags != hipDeviceMallocDefault && flags != hipDeviceMallocFinegrained && flags != hipMallocSignalMemory &&
        flags != hipDeviceMallocUncached)
        return hipErrorInvalidValue;
    return take(ptr, size, K_DEVICE);
}

hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags) {
    if (flags != hipMemAttachGlobal && flags != hipMemAttachHost) return hipErrorInvalidValue;
    return take(ptr, size, K_DEVICE);
}

hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream) {
    (void)stream;
    return take(ptr, size, K_DEVICE);
}

hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t *pool, int dev) {
    pthread_once(&once, setup);
    if (pool == NULL) return hipErrorInvalidValue;
    if (dev < 0 || dev >= ndev) return hipErrorInvalidDevice;
    *pool = (hipMemPool_t)(uintptr_t)(0x1000 + dev);
    return hipSuccess;
}

hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream) {
    (void)stream;
    if (pool == NULL) return hipErrorInvalidValue;
    return take(ptr, size, K_DEVICE);
}

hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height) {
    if (ptr == NULL || pitch == NULL) return hipErrorInvalidValue;
    if (width == 0 || height == 0) {
        *ptr = NULL;
        *pitch = 0;
        return hipSuccess;
    }
    size_t row = (width + 127) & ~(size_t)127;
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)row, (uint64_t)height, &bytes)) return hipErrorOutOfMemory;
    hipError_t r = take(ptr, bytes, K_DEVICE);
    if (r == hipSuccess) *pitch = row;
    return r;
}

/* The driver-API form: elementSizeBytes "should be 4, 8 or 16"; the fake refuses any other. */
hipError_t hipMemAllocPitch(void **ptr, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    if (elem != 4 && elem != 8 && elem != 16) return hipErrorInvalidValue;
    return hipMallocPitch(ptr, pitch, width, height);
}

hipError_t hipFree(void *p) {
    pthread_once(&once, setup);
    if (p == NULL) return hipSuccess;
    return give(p, K_DEVICE) ? hipSuccess : hipErrorInvalidDevicePointer;
}

hipError_t hipFreeAsync(void *p, hipStream_t stream) {
    (void)stream;
    return give(p, K_DEVICE) ? hipSuccess : hipErrorInvalidValue;
}

hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags) {
    (void)flags;
    return take(ptr, size, K_HOST);
}

hipError_t hipHostFree(void *p) {
    if (p == NULL) return hipSuccess;
    return give(p, K_HOST) ? hipSuccess : hipErrorInvalidValue;
}

hipError_t hipMemGetInfo(size_t *free_b, size_t *total_b) {
    if (free_b == NULL || total_b == NULL) return hipErrorInvalidValue;
    lock();
    struct fk_proc *mine;
    uint64_t used = device_used(current, &mine);
    unlock();
    *total_b = dev_bytes;
    *free_b = used >= dev_bytes ? 0 : dev_bytes - used;
    return hipSuccess;
}

hipError_t hipDeviceTotalMem(size_t *bytes, int dev) {
    pthread_once(&once, setup);
    if (bytes == NULL) return hipErrorInvalidValue;
    if (dev < 0 || dev >= ndev) return hipErrorInvalidDevice;
    *bytes = dev_bytes;
    return hipSuccess;
}

/* ---- streams and kernels ---------------------------------------------------------------------------------- */
#define FK_STREAMS 256
#define FK_POOL 64
struct fk_stream {
    int live;
    int dev;
    hsa_queue_t *queue;
    int own_queue;
    int has_mask;
    uint32_t mask[FAKE_CU_WORDS];
};
static struct fk_stream streams[FK_STREAMS];
static struct fk_stream null_streams[FK_DEVS];
static hsa_queue_t *pool[FK_DEVS][FK_POOL];
static int pool_next[FK_DEVS];
static uint32_t roc_mask[FAKE_MAX_GPUS][FAKE_CU_WORDS];
static int roc_has[FAKE_MAX_GPUS];
static pthread_once_t hsa_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;

static void hsa_setup(void) {
    pthread_once(&once, setup);
    hsa_init();
    const char *v = getenv("ROC_GLOBAL_CU_MASK");
    if (v != NULL) fake_cu_parse(v, roc_mask, roc_has);
}

static hsa_status_t find_gpu(hsa_agent_t agent, void *data) {
    int *want = data;
    uint32_t type = 0;
    if (hsa_agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &type) != HSA_STATUS_SUCCESS || type != HSA_DEVICE_TYPE_GPU)
        return HSA_STATUS_SUCCESS;
    if (want[0]-- == 0) {
        *(hsa_agent_t *)(want + 2) = agent;
        return HSA_STATUS_INFO_BREAK;
    }
    return HSA_STATUS_SUCCESS;
}

/* A new hardware queue on `dev`, ROC_GLOBAL_CU_MASK applied; NULL when HSA refuses it. */
static hsa_queue_t *new_queue(int dev) {
    pthread_once(&hsa_once, hsa_setup);
    int want[4] = {dev, 0, 0, 0}; /* the ordinal, then room for the agent (8-byte aligned) */
    if (hsa_iterate_agents(find_gpu, want) != HSA_STATUS_INFO_BREAK) return NULL;
    hsa_agent_t agent;
    memcpy(&agent, want + 2, sizeof agent);
    hsa_queue_t *q = NULL;
    if (hsa_queue_create(agent, 4096, 0, NULL, NULL, UINT32_MAX, UINT32_MAX, &q) != HSA_STATUS_SUCCESS) return NULL;
    if (roc_has[dev]) hsa_amd_queue_cu_set_mask(q, 32 * FAKE_CU_WORDS, roc_mask[dev]);
    return q;
}

static int max_hw_queues(void) {
    int n = (int)env_u64("GPU_MAX_HW_QUEUES", 4);
    return n < 1 ? 1 : n > FK_POOL ? FK_POOL : n;
}

/* With streams_mu held: a queue of the device's pool. */
static hsa_queue_t *pooled(int dev) {
    int i = pool_next[dev]++ % max_hw_queues();
    if (pool[dev][i] == NULL) pool[dev][i] = new_queue(dev);
    return pool[dev][i];
}

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags) {
    (void)flags;
    if (stream == NULL) return hipErrorInvalidValue;
    pthread_once(&once, setup);
    pthread_mutex_lock(&streams_mu);
    hipError_t r = hipErrorOutOfMemory;
    for (int i = 0; i < FK_STREAMS; i++) {
        if (streams[i].live) continue;
        hsa_queue_t *q = pooled(current);
        if (q != NULL) {
            memset(&streams[i], 0, sizeof streams[i]);
            streams[i].live = 1, streams[i].dev = current, streams[i].queue = q;
            *stream = (hipStream_t)&streams[i];
            r = hipSuccess;
        }
        break;
    }
    pthread_mutex_unlock(&streams_mu);
    return r;
}

hipError_t hipStreamCreate(hipStream_t *stream) { return hipStreamCreateWithFlags(stream, 0); }

hipError_t hipExtStreamCreateWithCUMask(hipStream_t *stream, uint32_t cuMaskSize, const uint32_t *cuMask) {
    if (stream == NULL) return hipErrorInvalidHandle;
    if (cuMaskSize == 0 || cuMask == NULL) return hipErrorInvalidValue;
    pthread_once(&once, setup);
    pthread_mutex_lock(&streams_mu);
    struct fk_stream *s = NULL;
    for (int i = 0; i < FK_STREAMS && s == NULL; i++)
        if (!streams[i].live) s = &streams[i];
    hsa_queue_t *q = s != NULL ? new_queue(current) : NULL;
    if (q == NULL) {
        pthread_mutex_unlock(&streams_mu);
        return hipErrorOutOfMemory;
    }
    uint32_t mask[FAKE_CU_WORDS] = {0};
    for (uint32_t w = 0; w < cuMaskSize && w < FAKE_CU_WORDS; w++)
        mask[w] = cuMask[w] & (roc_has[current] ? roc_mask[current][w] : 0xFFFFFFFFu);
    uint32_t n = cuMaskSize < FAKE_CU_WORDS ? cuMaskSize : FAKE_CU_WORDS;
    hsa_status_t r = hsa_amd_queue_cu_set_mask(q, 32 * n, mask);
    if (r != HSA_STATUS_SUCCESS && r != HSA_STATUS_CU_MASK_REDUCED) {
        hsa_queue_destroy(q);
        pthread_mutex_unlock(&streams_mu);
        return hipErrorInvalidValue;
    }
    memset(s, 0, sizeof *s);
    s->live = 1, s->dev = current, s->queue = q, s->own_queue = 1, s->has_mask = 1;
    memcpy(s->mask, mask, sizeof mask);
    *stream = (hipStream_t)s;
    pthread_mutex_unlock(&streams_mu);
    return hipSuccess;
}

/* The stream behind a handle (NULL: the current device's null stream, made on first use); NULL if none. */
static struct fk_stream *stream_of(hipStream_t stream) {
    pthread_once(&once, setup);
    if (stream != NULL) {
        struct fk_stream *s = (struct fk_stream *)stream;
        return s >= streams && s < streams + FK_STREAMS && s->live ? s : NULL;
    }
    struct fk_stream *s = &null_streams[current];
    pthread_mutex_lock(&streams_mu);
    if (!s->live && (s->queue = pooled(current)) != NULL) s->live = 1, s->dev = current;
    pthread_mutex_unlock(&streams_mu);
    return s->live ? s : NULL;
}

hipError_t hipStreamDestroy(hipStream_t stream) {
    struct fk_stream *s = stream != NULL ? stream_of(stream) : NULL;
    if (s == NULL) return hipErrorInvalidHandle;
    pthread_mutex_lock(&streams_mu);
    if (s->own_queue) hsa_queue_destroy(s->queue);
    s->live = 0;
    pthread_mutex_unlock(&streams_mu);
    return hipSuccess;
}

hipError_t hipStreamGetDevice(hipStream_t stream, hipDevice_t *device) {
    if (device == NULL) return hipErrorInvalidValue;
    if (stream == NULL) {
        *device = current;
        return hipSuccess;
    }
    struct fk_stream *s = stream_of(stream);
    if (s == NULL) return hipErrorInvalidHandle;
    *device = s->dev;
    return hipSuccess;
}

hipError_t hipExtStreamGetCUMask(hipStream_t stream, uint32_t cuMaskSize, uint32_t *cuMask) {
    if (cuMaskSize == 0 || cuMask == NULL) return hipErrorInvalidValue;
    struct fk_stream *s = stream_of(stream);
    if (s == NULL) return stream == NULL ? hipErrorOutOfMemory : hipErrorInvalidHandle;
    uint32_t cus = (uint32_t)env_u64("FAKE_HSA_CUS", 304);
    for (uint32_t w = 0; w < cuMaskSize; w++) {
        uint32_t card = w >= FAKE_CU_WORDS || 32 * w >= cus ? 0 : cus >= 32 * (w + 1) ? 0xFFFFFFFFu : (1u << (cus % 32)) - 1;
        uint32_t v = s->has_mask ? (w < FAKE_CU_WORDS ? s->mask[w] : 0) : roc_has[s->dev] ? roc_mask[s->dev][w % FAKE_CU_WORDS] : card;
        cuMask[w] = v & card;
    }
    return hipSuccess;
}

hipError_t hipStreamSynchronize(hipStream_t stream) { return stream_of(stream) != NULL ? hipSuccess : hipErrorInvalidHandle; }

hipError_t hipDeviceSynchronize(void) { return hipSuccess; }

typedef struct {
    uint32_t x, y, z;
} dim3;

hipError_t hipLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shmem, hipStream_t stream) {
    (void)f, (void)grid, (void)block, (void)shmem;
    if (args == NULL || args[0] == NULL) return hipErrorInvalidValue;
    struct fk_stream *s = stream_of(stream);
    if (s == NULL) return stream == NULL ? hipErrorOutOfMemory : hipErrorInvalidHandle;
    return fakehsa_dispatch(s->queue, *(const uint64_t *)args[0]) == HSA_STATUS_SUCCESS ? hipSuccess
                                                                                          : hipErrorLaunchFailure;
}

int hipFakeEcho(int x) { return x + 1000; }

hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags,
                             hipDriverProcAddressQueryResult *status) {
    (void)hipVersion;
    (void)flags;
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
#define E(n) {#n, (void *)n},
        E(hipMalloc) E(hipExtMallocWithFlags) E(hipMallocManaged) E(hipMallocAsync) E(hipMallocFromPoolAsync)
        E(hipMallocPitch) E(hipMemAllocPitch) E(hipFree) E(hipFreeAsync) E(hipHostMalloc) E(hipHostFree) E(hipMemGetInfo)
        E(hipDeviceTotalMem) E(hipGetDevice) E(hipSetDevice) E(hipGetDeviceCount) E(hipFakeEcho)
        E(hipDeviceGetDefaultMemPool) E(hipGetProcAddress) E(hipStreamCreate) E(hipExtStreamCreateWithCUMask)
        E(hipExtStreamGetCUMask) E(hipLaunchKernel) E(hipStreamDestroy)
#undef E
    };
    if (symbol == NULL || pfn == NULL) return hipErrorInvalidValue;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, symbol) != 0) continue;
        *pfn = table[i].fn;
        if (status != NULL) *status = HIP_GET_PROC_ADDRESS_SUCCESS;
        return hipSuccess;
    }
    *pfn = NULL;
    if (status != NULL) *status = HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return hipErrorInvalidValue;
}

