/* The HIP test program: a small HIP "application" linked against libamdhip64.so (the fake) that reads
 * commands on stdin and answers one line each, so Python tests drive the HIP memory cap through a real
 * process. argv[1] picks how it finds the runtime's entry points:
 *   direct      the linked symbols (what preloading interposes)
 *   dlsym       dlopen("libamdhip64.so") + dlsym
 *   gpa         hipGetProcAddress (HIP 6.2 and later), itself found by linking
 *   and two ways a hostile tenant finds an unwrapped resolver first:
 *   dlvsym      dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34") (then 2.2.5), then that dlsym
 *   dlsym_libc  dlsym(dlopen("libc.so.6"), "dlsym"), then that dlsym
 * Commands:  alloc KIND BYTES -> "<rc> <id>" | free ID -> "<rc>" | info -> "<rc> free total"
 *            total -> "<rc> bytes" (hipDeviceTotalMem of device 0) | device N -> "<rc>" (hipSetDevice)
 *            badfree -> "<hipFree rc> <hipFreeAsync rc>" of a pointer nobody allocated
 *            echo -> "<hipFakeEcho(1)>" through the path's resolver
 *            threads N OPS SEED SIZE... -> "<rc> max_live successes failures other_codes"
 *            stress BYTES -> "started", then never answers (alloc/free forever, for kill -9 tests)
 *            bench N -> "<rc> <nanoseconds per hipMalloc of 1 MiB + hipFree>" (N pairs)
 * Streams, kernels and CU masks (the CU mask tests; SID 0 is the null stream):
 *            stream -> "<rc> <sid>" (hipStreamCreate) | custream W... -> "<rc> <sid>" (hipExtStreamCreateWithCUMask
 *            of the given dwords) | launch SID WORK N -> "<rc>" (N kernels of WORK CU-us, the first error)
 *            getmask SID -> "<rc> <CUs> w0..w31" (hipExtStreamGetCUMask of 32 dwords)
 *            and HSA directly, as a tenant that skips HIP would: hsaq -> "<status> <qid>" (a queue on the first GPU)
 *            | hsaset QID BITS W... -> "<status>" (hsa_amd_queue_cu_set_mask) | hsaget QID -> "<status> <CUs>"
 *            | hsarun QID WORK N -> "<status>" (N kernels through the fake's dispatch)
 *            | qbench N -> "<status> <nanoseconds per hsa_queue_create + hsa_queue_destroy>" (N pairs)
 * Allocation KINDs: mem (hipMalloc), ext (hipExtMallocWithFlags, fine-grained), managed (hipMallocManaged),
 * pitch (hipMallocPitch: rows of 1 MiB, or one row of BYTES below that), mempitch (hipMemAllocPitch, the
 * same rows of 4-byte elements), async (hipMallocAsync), pool (hipMallocFromPoolAsync from the device's
 * default pool), host (hipHostMalloc). free uses hipFree, but
 * hipFreeAsync for async and pool and hipHostFree for host. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_hsa.h"

hipError_t hipMalloc(void **, size_t);
hipError_t hipExtMallocWithFlags(void **, size_t, unsigned int);
hipError_t hipMallocManaged(void **, size_t, unsigned int);
hipError_t hipMallocPitch(void **, size_t *, size_t, size_t);
hipError_t hipMemAllocPitch(void **, size_t *, size_t, size_t, unsigned int);
hipError_t hipMallocAsync(void **, size_t, hipStream_t);
hipError_t hipMallocFromPoolAsync(void **, size_t, hipMemPool_t, hipStream_t);
hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t *, int);
hipError_t hipHostMalloc(void **, size_t, unsigned int);
hipError_t hipHostFree(void *);
hipError_t hipFree(void *);
hipError_t hipFreeAsync(void *, hipStream_t);
hipError_t hipMemGetInfo(size_t *, size_t *);
hipError_t hipDeviceTotalMem(size_t *, int);
hipError_t hipSetDevice(int);
hipError_t hipGetProcAddress(const char *, void **, int, uint64_t, hipDriverProcAddressQueryResult *);
int hipFakeEcho(int);
hipError_t hipStreamCreate(hipStream_t *);
hipError_t hipExtStreamCreateWithCUMask(hipStream_t *, uint32_t, const uint32_t *);
hipError_t hipExtStreamGetCUMask(hipStream_t, uint32_t, uint32_t *);
typedef struct {
    uint32_t x, y, z;
} dim3;
hipError_t hipLaunchKernel(const void *, dim3, dim3, void **, size_t, hipStream_t);

/* The compute entry points, found on the same path as the memory ones (HSA's by dlsym on its own handle; the
 * gpa path uses the linked HSA symbols: hipGetProcAddress answers for HIP only). */
static struct {
    hipError_t (*stream)(hipStream_t *);
    hipError_t (*custream)(hipStream_t *, uint32_t, const uint32_t *);
    hipError_t (*getmask)(hipStream_t, uint32_t, uint32_t *);
    hipError_t (*launch)(const void *, dim3, dim3, void **, size_t, hipStream_t);
    hsa_status_t (*init)(void);
    hsa_status_t (*iterate)(hsa_status_t (*)(hsa_agent_t, void *), void *);
    hsa_status_t (*info)(hsa_agent_t, int, void *);
    hsa_status_t (*qcreate)(hsa_agent_t, uint32_t, hsa_queue_type32_t, hsa_queue_callback, void *, uint32_t, uint32_t,
                            hsa_queue_t **);
    hsa_status_t (*setmask)(const hsa_queue_t *, uint32_t, const uint32_t *);
    hsa_status_t (*getqmask)(const hsa_queue_t *, uint32_t, uint32_t *);
} k;

static struct {
    hipError_t (*malloc_)(void **, size_t);
    hipError_t (*ext)(void **, size_t, unsigned int);
    hipError_t (*managed)(void **, size_t, unsigned int);
    hipError_t (*pitch)(void **, size_t *, size_t, size_t);
    hipError_t (*async)(void **, size_t, hipStream_t);
    hipError_t (*pool)(void **, size_t, hipMemPool_t, hipStream_t);
    hipError_t (*defpool)(hipMemPool_t *, int);
    hipError_t (*host)(void **, size_t, unsigned int);
    hipError_t (*hostfree)(void *);
    hipError_t (*free_)(void *);
    hipError_t (*freeasync)(void *, hipStream_t);
    hipError_t (*info)(size_t *, size_t *);
    hipError_t (*total)(size_t *, int);
    hipError_t (*setdev)(int);
    int (*echo)(int);
    hipError_t (*mempitch)(void **, size_t *, size_t, size_t, unsigned int);
} h;

typedef void *(*resolver)(void *, const char *);

static void link_hsa(void) {
    k.init = hsa_init, k.iterate = hsa_iterate_agents, k.info = hsa_agent_get_info, k.qcreate = hsa_queue_create;
    k.setmask = hsa_amd_queue_cu_set_mask, k.getqmask = hsa_amd_queue_cu_get_mask;
}

static void resolve(const char *mode) {
    if (strcmp(mode, "direct") == 0) {
        h.malloc_ = hipMalloc, h.ext = hipExtMallocWithFlags, h.managed = hipMallocManaged, h.pitch = hipMallocPitch;
        h.async = hipMallocAsync, h.pool = hipMallocFromPoolAsync, h.defpool = hipDeviceGetDefaultMemPool;
        h.host = hipHostMalloc, h.hostfree = hipHostFree, h.free_ = hipFree, h.freeasync = hipFreeAsync;
        h.info = hipMemGetInfo, h.total = hipDeviceTotalMem, h.setdev = hipSetDevice;
        h.mempitch = hipMemAllocPitch;
        void *lib = dlopen("libamdhip64.so", RTLD_NOW);
        h.echo = lib != NULL ? (int (*)(int))dlsym(lib, "hipFakeEcho") : NULL;
        k.stream = hipStreamCreate, k.custream = hipExtStreamCreateWithCUMask, k.getmask = hipExtStreamGetCUMask;
        k.launch = hipLaunchKernel;
        link_hsa();
        return;
    }
    void *lib = dlopen("libamdhip64.so", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "hip_app: %s\n", dlerror());
        exit(2);
    }
    resolver find = dlsym;
    if (strcmp(mode, "dlvsym") == 0) {
        find = (resolver)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
        if (find == NULL) find = (resolver)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
    } else if (strcmp(mode, "dlsym_libc") == 0) {
        find = (resolver)dlsym(dlopen("libc.so.6", RTLD_NOW), "dlsym");
    }
    void *found[16];
    static const char *const names[16] = {
        "hipMalloc", "hipExtMallocWithFlags", "hipMallocManaged", "hipMallocPitch", "hipMallocAsync",
        "hipMallocFromPoolAsync", "hipDeviceGetDefaultMemPool", "hipHostMalloc", "hipHostFree", "hipFree",
        "hipFreeAsync", "hipMemGetInfo", "hipDeviceTotalMem", "hipSetDevice", "hipFakeEcho", "hipMemAllocPitch"};
    for (int i = 0; i < 16; i++) {
        if (strcmp(mode, "gpa") == 0) {
            hipDriverProcAddressQueryResult status;
            found[i] = NULL;
            if (hipGetProcAddress(names[i], &found[i], 602, 0, &status) != hipSuccess) found[i] = NULL;
        } else {
            found[i] = find(lib, names[i]);
        }
        if (found[i] == NULL) {
            fprintf(stderr, "hip_app: %s not found on path %s\n", names[i], mode);
            exit(2);
        }
    }
    memcpy(&h, found, sizeof h);
    static const char *const knames[] = {"hipStreamCreate", "hipExtStreamCreateWithCUMask", "hipExtStreamGetCUMask",
                                         "hipLaunchKernel"};
    static const char *const hnames[] = {"hsa_init", "hsa_iterate_agents", "hsa_agent_get_info", "hsa_queue_create",
                                         "hsa_amd_queue_cu_set_mask", "hsa_amd_queue_cu_get_mask"};
    void *kfound[10];
    void *hsa = dlopen("libhsa-runtime64.so.1", RTLD_NOW);
    for (int i = 0; i < 10; i++) {
        const char *name = i < 4 ? knames[i] : hnames[i - 4];
        if (strcmp(mode, "gpa") == 0 && i < 4) {
            hipDriverProcAddressQueryResult status;
            if (hipGetProcAddress(name, &kfound[i], 602, 0, &status) != hipSuccess) kfound[i] = NULL;
        } else if (strcmp(mode, "gpa") == 0) {
            kfound[i] = NULL;
        } else {
            kfound[i] = find(i < 4 ? lib : hsa, name);
        }
    }
    memcpy(&k, kfound, sizeof k);
    if (strcmp(mode, "gpa") == 0) link_hsa();
    for (int i = 0; i < 10; i++) {
        if (((void **)&k)[i] == NULL) {
            fprintf(stderr, "hip_app: %s not found on path %s\n", i < 4 ? knames[i] : hnames[i - 4], mode);
            exit(2);
        }
    }
}

/* ---- allocations, by id ------------------------------------------------------------------------------- */
#define MAX_IDS 65536
static struct {
    void *p;
    int kind; /* 0 free, else 1 + index in KINDS */
} ids[MAX_IDS];
static const char *const KINDS[] = {"mem", "ext", "managed", "pitch", "async", "pool", "host", "mempitch"};
#define NKINDS 8
static pthread_mutex_t ids_mu = PTHREAD_MUTEX_INITIALIZER;

static hipError_t allocate(int kind, unsigned long long n, void **p) {
    switch (kind) {
    case 0: return h.malloc_(p, n);
    case 1: return h.ext(p, n, hipDeviceMallocFinegrained);
    case 2: return h.managed(p, n, hipMemAttachGlobal);
    case 3: {
        size_t pitch, width = n >= (1u << 20) ? (1u << 20) : n, height = n >= (1u << 20) ? n >> 20 : 1;
        return h.pitch(p, &pitch, width, height);
    }
    case 4: return h.async(p, n, NULL);
    case 5: {
        hipMemPool_t pool;
        hipError_t r = h.defpool(&pool, 0);
        return r != hipSuccess ? r : h.pool(p, n, pool, NULL);
    }
    case 6: return h.host(p, n, 0);
    default: {
        size_t pitch, width = n >= (1u << 20) ? (1u << 20) : n, height = n >= (1u << 20) ? n >> 20 : 1;
        return h.mempitch(p, &pitch, width, height, 4);
    }
    }
}

static hipError_t release(int kind, void *p) {
    if (kind == 4 || kind == 5) return h.freeasync(p, NULL);
    if (kind == 6) return h.hostfree(p);
    return h.free_(p);
}

/* ---- threads ------------------------------------------------------------------------------------------ */
static long long live, max_live, successes, failures, others;
static int nsizes, ops;
static unsigned long long sizes[64];
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *held[32];
    unsigned long long held_n[32];
    int nh = 0;
    for (int i = 0; i < ops || nh > 0; i++) {
        if (nh > 0 && (i >= ops || rand_r(&seed) % 2 == 0 || nh == 32)) {
            int k = (int)(rand_r(&seed) % (unsigned)nh);
            pthread_mutex_lock(&live_mu);
            live -= (long long)held_n[k]; /* before the free: live never exceeds what is accounted */
            pthread_mutex_unlock(&live_mu);
            h.free_(held[k]);
            held[k] = held[--nh];
            held_n[k] = held_n[nh];
            continue;
        }
        unsigned long long n = sizes[rand_r(&seed) % (unsigned)nsizes];
        void *p;
        hipError_t r = h.malloc_(&p, n);
        pthread_mutex_lock(&live_mu);
        if (r == hipSuccess) {
            live += (long long)n;
            if (live > max_live) max_live = live;
            successes++;
            held[nh] = p;
            held_n[nh++] = n;
        } else if (r == hipErrorOutOfMemory) {
            failures++;
        } else {
            others++;
        }
        pthread_mutex_unlock(&live_mu);
    }
    return NULL;
}

/* ---- streams, kernels, CU masks ----------------------------------------------------------------------- */
#define MAX_STREAMS 256
static hipStream_t sids[MAX_STREAMS]; /* 0: the null stream */
static int nsids = 1;
static hsa_queue_t *qids[MAX_STREAMS];
static int nqids = 1;

static int words_from(const char *p, uint32_t *w) {
    int n = 0;
    char *end;
    for (;;) {
        unsigned long v = strtoul(p, &end, 0);
        if (end == p || n == 32) return n;
        w[n++] = (uint32_t)v;
        p = end;
    }
}

static int popcount(const uint32_t *w, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += __builtin_popcount(w[i]);
    return c;
}

static hsa_status_t first_gpu(hsa_agent_t agent, void *data) {
    uint32_t type = 0;
    if (k.info(agent, HSA_AGENT_INFO_DEVICE, &type) != HSA_STATUS_SUCCESS || type != HSA_DEVICE_TYPE_GPU)
        return HSA_STATUS_SUCCESS;
    *(hsa_agent_t *)data = agent;
    return HSA_STATUS_INFO_BREAK;
}

/* One compute command; 0 when the line is none of them. */
static int compute(const char *line) {
    uint32_t w[32] = {0};
    unsigned long long work, count;
    int id, bits;
    if (strcmp(line, "stream\n") == 0) {
        hipStream_t s = NULL;
        hipError_t r = k.stream(&s);
        if (r == hipSuccess && nsids < MAX_STREAMS) sids[nsids++] = s;
        printf("%d %d\n", r, r == hipSuccess ? nsids - 1 : 0);
    } else if (strncmp(line, "custream ", 9) == 0) {
        int n = words_from(line + 9, w);
        hipStream_t s = NULL;
        hipError_t r = k.custream(&s, (uint32_t)n, w);
        if (r == hipSuccess && nsids < MAX_STREAMS) sids[nsids++] = s;
        printf("%d %d\n", r, r == hipSuccess ? nsids - 1 : 0);
    } else if (sscanf(line, "launch %d %llu %llu", &id, &work, &count) == 3) {
        hipError_t r = id >= 0 && id < nsids ? hipSuccess : hipErrorInvalidHandle;
        void *args[1] = {&work};
        dim3 one = {1, 1, 1};
        for (unsigned long long i = 0; i < count && r == hipSuccess; i++) r = k.launch(NULL, one, one, args, 0, sids[id]);
        printf("%d\n", r);
    } else if (sscanf(line, "getmask %d", &id) == 1) {
        hipError_t r = id >= 0 && id < nsids ? k.getmask(sids[id], 32, w) : hipErrorInvalidHandle;
        printf("%d %d", r, popcount(w, 32));
        for (int i = 0; i < 32; i++) printf(" %u", w[i]);
        printf("\n");
    } else if (strcmp(line, "hsaq\n") == 0) {
        hsa_agent_t gpu = {0};
        hsa_queue_t *q = NULL;
        hsa_status_t r = k.init();
        if (r == HSA_STATUS_SUCCESS) r = k.iterate(first_gpu, &gpu) == HSA_STATUS_INFO_BREAK ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR;
        if (r == HSA_STATUS_SUCCESS) r = k.qcreate(gpu, 1024, 0, NULL, NULL, UINT32_MAX, UINT32_MAX, &q);
        if (r == HSA_STATUS_SUCCESS && nqids < MAX_STREAMS) qids[nqids++] = q;
        printf("%d %d\n", r, r == HSA_STATUS_SUCCESS ? nqids - 1 : 0);
    } else if (sscanf(line, "hsaset %d %d", &id, &bits) == 2) {
        const char *p = line + 7;
        for (int skip = 0; skip < 2; skip++) p = strchr(p, ' ') != NULL ? strchr(p, ' ') + 1 : p + strlen(p);
        words_from(p, w);
        hsa_queue_t *q = id > 0 && id < nqids ? qids[id] : (hsa_queue_t *)(uintptr_t)0x1000;
        printf("%d\n", k.setmask(q, (uint32_t)bits, bits > 0 ? w : NULL));
    } else if (sscanf(line, "hsaget %d", &id) == 1) {
        hsa_status_t r = id > 0 && id < nqids ? k.getqmask(qids[id], 1024, w) : HSA_STATUS_ERROR_INVALID_QUEUE;
        printf("%d %d\n", r, popcount(w, 32));
    } else if (sscanf(line, "qbench %llu", &count) == 1 && count > 0) {
        hsa_agent_t gpu = {0};
        hsa_status_t r = k.init();
        if (r == HSA_STATUS_SUCCESS) r = k.iterate(first_gpu, &gpu) == HSA_STATUS_INFO_BREAK ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (unsigned long long i = 0; i < count && r == HSA_STATUS_SUCCESS; i++) {
            hsa_queue_t *q = NULL;
            if ((r = k.qcreate(gpu, 1024, 0, NULL, NULL, UINT32_MAX, UINT32_MAX, &q)) == HSA_STATUS_SUCCESS)
                r = hsa_queue_destroy(q);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
        printf("%d %lld\n", r, (long long)(ns / (double)count));
    } else if (sscanf(line, "hsarun %d %llu %llu", &id, &work, &count) == 3) {
        hsa_status_t r = id > 0 && id < nqids ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR_INVALID_QUEUE;
        for (unsigned long long i = 0; i < count && r == HSA_STATUS_SUCCESS; i++) r = fakehsa_dispatch(qids[id], work);
        printf("%d\n", r);
    } else {
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    resolve(argc > 1 ? argv[1] : "direct");
    setvbuf(stdout, NULL, _IOLBF, 0);
    char line[4096], kind[32];
    unsigned long long n;
    int id;
    while (fgets(line, sizeof line, stdin) != NULL) {
        if (sscanf(line, "alloc %31s %llu", kind, &n) == 2) {
            int k = 0;
            while (k < NKINDS && strcmp(KINDS[k], kind) != 0) k++;
            if (k == NKINDS) {
                printf("? %s", line);
                continue;
            }
            void *p = NULL;
            hipError_t r = allocate(k, n, &p);
            int slot = -1;
            pthread_mutex_lock(&ids_mu);
            for (int i = 1; r == hipSuccess && i < MAX_IDS && slot < 0; i++)
                if (ids[i].kind == 0) slot = i;
            if (slot > 0) {
                ids[slot].p = p;
                ids[slot].kind = 1 + k;
            }
            pthread_mutex_unlock(&ids_mu);
            printf("%d %d\n", r, slot > 0 ? slot : 0);
        } else if (sscanf(line, "free %d", &id) == 1) {
            if (id <= 0 || id >= MAX_IDS || ids[id].kind == 0) {
                printf("-1\n");
                continue;
            }
            hipError_t r = release(ids[id].kind - 1, ids[id].p);
            if (r == hipSuccess) ids[id].kind = 0;
            printf("%d\n", r);
        } else if (strcmp(line, "info\n") == 0) {
            size_t f = 0, t = 0;
            hipError_t r = h.info(&f, &t);
            printf("%d %zu %zu\n", r, f, t);
        } else if (strcmp(line, "total\n") == 0) {
            size_t t = 0;
            hipError_t r = h.total(&t, 0);
            printf("%d %zu\n", r, t);
        } else if (sscanf(line, "device %d", &id) == 1) {
            printf("%d\n", h.setdev(id));
        } else if (strcmp(line, "badfree\n") == 0) {
            void *bad = (void *)(uintptr_t)0x1000;
            printf("%d %d\n", h.free_(bad), h.freeasync(bad, NULL));
        } else if (strcmp(line, "echo\n") == 0) {
            printf("%d\n", h.echo != NULL ? h.echo(1) : -1);
        } else if (sscanf(line, "threads %d %d", &nsizes, &ops) == 2) {
            int nthreads = nsizes;
            char *p = line;
            for (int skip = 0; skip < 3; skip++) p = strchr(p, ' ') + 1;
            unsigned seed = (unsigned)strtoul(p, &p, 10);
            nsizes = 0;
            while (*p && *p != '\n' && nsizes < 64) sizes[nsizes++] = strtoull(p, &p, 10);
            if (nsizes == 0) {
                printf("? %s", line);
                continue;
            }
            pthread_t t[64];
            for (int i = 0; i < nthreads && i < 64; i++)
                pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(seed + (unsigned)i));
            for (int i = 0; i < nthreads && i < 64; i++) pthread_join(t[i], NULL);
            printf("0 %lld %lld %lld %lld\n", max_live, successes, failures, others);
            max_live = successes = failures = others = 0;
        } else if (sscanf(line, "bench %llu", &n) == 1 && n > 0) {
            struct timespec t0, t1;
            hipError_t r = hipSuccess;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (unsigned long long i = 0; i < n && r == hipSuccess; i++) {
                void *p;
                if ((r = h.malloc_(&p, 1 << 20)) == hipSuccess) r = h.free_(p);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
            printf("%d %lld\n", r, (long long)(ns / (double)n));
        } else if (compute(line)) {
            continue;
        } else if (sscanf(line, "stress %llu", &n) == 1) {
            printf("started\n");
            for (;;) {
                void *p;
                if (h.malloc_(&p, n) == hipSuccess) h.free_(p);
            }
        } else {
            printf("? %s", line);
        }
    }
    return 0;
}
