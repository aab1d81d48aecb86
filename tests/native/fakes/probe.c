/* The test driver: a small CUDA "application" linked against libcuda.so.1 (the fake) that reads commands
 * on stdin and answers one line each, so Python tests can drive the interception library through a real
 * process. argv[1] picks how it finds driver entry points, one of the three paths an application uses:
 *   direct  the linked symbols (what LD_PRELOAD interposes)
 *   dlsym   dlopen("libcuda.so.1") + dlsym of the versioned names
 *   gpa     cuGetProcAddress(base name, CUDA 12.4)        gpa2  cuGetProcAddress_v2 (the CUDA 12/13 form)
 *   and two ways a hostile tenant finds an unwrapped resolver first:
 *   dlvsym      dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34") (then 2.2.5), then that dlsym's versioned names
 *   dlsym_libc  dlsym(dlopen("libc.so.6"), "dlsym"), then that dlsym's versioned names
 * Commands:  alloc KIND BYTES -> "<rc> <id>" | free ID -> "<rc>" | info -> "<rc> free total"
 *            togpu advise|prefetch ID -> "<rc>" (preferred location / prefetch: device 0)
 *            total -> "<rc> bytes" | nvml -> "<rc> total free used" | echo -> cuFakeEcho(1) via dlsym
 *            launch KIND BLOCKS SECONDS SYNC_EVERY -> "<rc> launches"
 *            threads N OPS SEED SIZE... -> "<rc> max_live successes failures other_codes"
 *            stress BYTES -> never answers (alloc/free forever, for kill -9 tests)
 *            bench launch|alloc N -> "<rc> picoseconds per call" (an empty kernel; a 1 MiB alloc + free)
 *            pools N BYTES -> "<successes> <last rc>" (N new pools, BYTES allocated from each, kept)
 *            mixed SECONDS SEED [SYNC_EVERY] -> "<rc> launches" (kernels of 0.1 to 20 ms and graphs, a random mix)
 *            capture MODE SECONDS -> "<begin rc> <end rc> <graph us> <graph launch rc>": a CUDA graph made by
 *                                    capturing a stream (MODE 0 global, 1 thread-local, 2 relaxed) for
 *                                    SECONDS while another stream runs kernels, then launched
 *            plant overflow|misaligned -> "<rc>" if nothing caught it (a fault inside the library, for the
 *                                          sanitizer tests: an instrumented library dies there instead)
 * Allocation KINDs: mem mem1 pitch pitch1 managed async async_ptsz pool pool_ptsz vmm array array1 array3d
 * array3d1 mipmap (the v1 ones, *1, only on the direct and dlsym paths: cuGetProcAddress hands a CUDA >= 3.2
 * caller the _v2 ABI for their base names). Launch KINDs: kernel kernel_ptsz ex ex_ptsz coop coop_ptsz graph
 * graph_ptsz. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../../native/gpupool_cuda.h"

CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const void *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
#define D(name, ret, args) ret name args;
#include "probe_syms.h"
#undef D

static const char *mode;
static void *libcuda;

/* one table: direct address, versioned name (dlsym), base name (cuGetProcAddress) */
#define D(name, ret, args) static ret(*p_##name) args;
#include "probe_syms.h"
#undef D

typedef void *(*resolver)(void *, const char *);

static resolver bypass_resolver(void) {
    if (strcmp(mode, "dlvsym") == 0) {
        void *p = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
        if (p == NULL) p = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
        return (resolver)p;
    }
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    return (resolver)dlsym(libc, "dlsym");
}

static void *find(const char *exact, const char *base, void *direct) {
    void *p = NULL;
    if (strcmp(mode, "direct") == 0) return direct;
    if (strcmp(mode, "dlsym") == 0) return dlsym(libcuda, exact);
    if (strcmp(mode, "dlvsym") == 0 || strcmp(mode, "dlsym_libc") == 0) return bypass_resolver()(libcuda, exact);
    CUresult (*gpa)(const char *, void **, int, cuuint64_t) = (void *)dlsym(libcuda, "cuGetProcAddress");
    CUresult (*gpa2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        (void *)dlsym(libcuda, "cuGetProcAddress_v2");
    int ptsz = strstr(exact, "_ptsz") != NULL;
    cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    if (strcmp(mode, "gpa") == 0) gpa(base, &p, 12040, flags);
    else {
        CUdriverProcAddressQueryResult st;
        gpa2(base, &p, 12040, flags, &st);
    }
    return p;
}

static void resolve(void) {
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    char base[128];
#define D(name, ret, args)                                       \
    snprintf(base, sizeof base, "%s", #name);                    \
    if (strstr(base, "_ptsz")) *strstr(base, "_ptsz") = '\0';    \
    if (strstr(base, "_v2")) *strstr(base, "_v2") = '\0';        \
    p_##name = (ret(*) args)find(#name, base, (void *)name);
#include "probe_syms.h"
#undef D
}

/* ---- allocations by kind ------------------------------------------------------------------------------ */
static CUmemoryPool user_pool;

static CUresult alloc(const char *kind, unsigned long long n, unsigned long long *id) {
    CUdeviceptr p = 0;
    CUresult r;
    if (!strcmp(kind, "mem")) r = p_cuMemAlloc_v2(&p, n);
    else if (!strcmp(kind, "mem1")) {
        CUdeviceptr_v1 q = 0;
        r = p_cuMemAlloc(&q, (unsigned)n);
        p = q;
    } else if (!strcmp(kind, "pitch")) {
        size_t pitch;
        r = p_cuMemAllocPitch_v2(&p, &pitch, n / 4, 4, 4);
    } else if (!strcmp(kind, "pitch1")) {
        CUdeviceptr_v1 q = 0;
        unsigned pitch;
        r = p_cuMemAllocPitch(&q, &pitch, (unsigned)(n / 4), 4, 4);
        p = q;
    } else if (!strcmp(kind, "managed")) r = p_cuMemAllocManaged(&p, n, 1);
    else if (!strcmp(kind, "async")) r = p_cuMemAllocAsync(&p, n, NULL);
    else if (!strcmp(kind, "async_ptsz")) r = p_cuMemAllocAsync_ptsz(&p, n, NULL);
    else if (!strcmp(kind, "pool")) {
        if (user_pool == NULL) cuMemPoolCreate(&user_pool, NULL);
        r = p_cuMemAllocFromPoolAsync(&p, n, user_pool, NULL);
    } else if (!strcmp(kind, "pool_ptsz")) {
        if (user_pool == NULL) cuMemPoolCreate(&user_pool, NULL);
        r = p_cuMemAllocFromPoolAsync_ptsz(&p, n, user_pool, NULL);
    } else if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = 1;
        prop.location.id = 0;
        r = p_cuMemCreate(&p, n, &prop, 0);
    } else if (!strcmp(kind, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {n / 8, 2, CU_AD_FORMAT_UNSIGNED_INT16, 2};
        r = p_cuArrayCreate_v2((CUarray *)&p, &d);
    } else if (!strcmp(kind, "array1")) {
        CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)(n / 8), 2, CU_AD_FORMAT_UNSIGNED_INT16, 2};
        r = p_cuArrayCreate((CUarray *)&p, &d);
    } else if (!strcmp(kind, "array3d1")) {
        CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)(n / 16), 2, 2, CU_AD_FORMAT_FLOAT, 1, 0};
        r = p_cuArray3DCreate((CUarray *)&p, &d);
    } else if (!strcmp(kind, "array3d")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {n / 16, 2, 2, CU_AD_FORMAT_FLOAT, 1, 0};
        r = p_cuArray3DCreate_v2((CUarray *)&p, &d);
    } else if (!strcmp(kind, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {n, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        r = p_cuMipmappedArrayCreate((CUmipmappedArray *)&p, &d, 1);
    } else return CUDA_ERROR_INVALID_VALUE;
    *id = p;
    return r;
}

static CUresult release(const char *kind, unsigned long long id) {
    if (!strcmp(kind, "mem1") || !strcmp(kind, "pitch1")) return p_cuMemFree((CUdeviceptr_v1)id);
    if (!strcmp(kind, "async") || !strcmp(kind, "async_ptsz") || !strcmp(kind, "pool") ||
        !strcmp(kind, "pool_ptsz")) {
        CUresult r = p_cuMemFreeAsync(id, NULL);
        cuStreamSynchronize(NULL);
        if (user_pool != NULL) p_cuMemPoolTrimTo(user_pool, 0);
        return r;
    }
    if (!strcmp(kind, "vmm")) return p_cuMemRelease(id);
    if (!strcmp(kind, "array") || !strcmp(kind, "array3d") || !strcmp(kind, "array1") || !strcmp(kind, "array3d1"))
        return p_cuArrayDestroy((CUarray)(uintptr_t)id);
    if (!strcmp(kind, "mipmap")) return p_cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)id);
    return p_cuMemFree_v2(id);
}

/* ---- threads ------------------------------------------------------------------------------------------ */
static long long live, max_live, successes, failures, others;
static int nsizes, ops;
static unsigned long long sizes[64];
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    unsigned long long held[32], held_n[32];
    int nh = 0;
    for (int i = 0; i < ops; i++) {
        if (nh > 0 && (rand_r(&seed) % 2 == 0 || nh == 32)) {
            int k = (int)(rand_r(&seed) % (unsigned)nh);
            pthread_mutex_lock(&live_mu);
            live -= (long long)held_n[k]; /* before the free: live never exceeds what is accounted */
            pthread_mutex_unlock(&live_mu);
            p_cuMemFree_v2(held[k]);
            held[k] = held[--nh];
            held_n[k] = held_n[nh];
            continue;
        }
        unsigned long long n = sizes[rand_r(&seed) % (unsigned)nsizes], id;
        CUresult r = p_cuMemAlloc_v2(&id, n);
        pthread_mutex_lock(&live_mu);
        if (r == CUDA_SUCCESS) {
            live += (long long)n;
            if (live > max_live) max_live = live;
            successes++;
            held[nh] = id;
            held_n[nh++] = n;
        } else if (r == CUDA_ERROR_OUT_OF_MEMORY) failures++;
        else others++;
        pthread_mutex_unlock(&live_mu);
    }
    for (int k = 0; k < nh; k++) {
        pthread_mutex_lock(&live_mu);
        live -= (long long)held_n[k];
        pthread_mutex_unlock(&live_mu);
        p_cuMemFree_v2(held[k]);
    }
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    mode = argc > 1 ? argv[1] : "direct";
    cuInit(0);
    CUcontext ctx;
    cuCtxCreate_v2(&ctx, 0, 0);
    resolve();
    char line[4096], kind[32];
    double mixed_secs;
    unsigned mixed_seed;
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin) != NULL) {
        unsigned long long n, id;
        if (sscanf(line, "alloc %31s %llu", kind, &n) == 2) {
            CUresult r = alloc(kind, n, &id);
            printf("%d %llu\n", r, id);
        } else if (sscanf(line, "free %31s %llu", kind, &id) == 2) {
            printf("%d\n", release(kind, id));
        } else if (sscanf(line, "togpu %31s %llu", kind, &id) == 2) { /* bring managed pages onto the GPU */
            CUresult r = !strcmp(kind, "advise") ? p_cuMemAdvise(id, 1, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, 0)
                                                 : p_cuMemPrefetchAsync(id, 1, 0, NULL);
            printf("%d\n", r);
        } else if (!strncmp(line, "info", 4)) {
            size_t f = 0, t = 0;
            CUresult r = p_cuMemGetInfo_v2(&f, &t);
            printf("%d %zu %zu\n", r, f, t);
        } else if (!strncmp(line, "total", 5)) {
            size_t t = 0;
            CUresult r = p_cuDeviceTotalMem_v2(&t, 0);
            printf("%d %zu\n", r, t);
        } else if (!strncmp(line, "nvml", 4)) {
            void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
            nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
            nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) =
                (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
            nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *) =
                (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
            nvmlDevice_t dev;
            nvmlMemory_t m = {0, 0, 0};
            init();
            get(0, &dev);
            nvmlReturn_t r = mem(dev, &m);
            printf("%d %llu %llu %llu\n", r, m.total, m.free, m.used);
        } else if (!strncmp(line, "echo", 4)) {
            int (*echo)(int) = (int (*)(int))dlsym(libcuda, "cuFakeEcho");
            void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
            int (*echo2)(int) = (int (*)(int))dlsym(nv, "nvmlFakeEcho");
            void *p = NULL;
            CUresult r = cuGetProcAddress("cuFakeEcho", &p, 12040, 0);
            printf("%d %d %d %d\n", echo(1), echo2(1), r, p != NULL ? ((int (*)(int))p)(2) : -1);
        } else if (sscanf(line, "launch %31s %llu %llu %llu", kind, &n, &id, &(unsigned long long){0}) >= 3) {
            unsigned long long every = 4;
            double secs;
            sscanf(line, "launch %31s %llu %lf %llu", kind, &n, &secs, &every);
            double end = now_s() + secs;
            long long count = 0;
            CUresult r = CUDA_SUCCESS;
            CUlaunchConfig cfg = {(unsigned)n, 1, 1, 32, 1, 1, 0, NULL, NULL, 0};
            while (now_s() < end && r == CUDA_SUCCESS) {
                if (!strcmp(kind, "kernel")) r = p_cuLaunchKernel(NULL, (unsigned)n, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                else if (!strcmp(kind, "kernel_ptsz")) r = p_cuLaunchKernel_ptsz(NULL, (unsigned)n, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                else if (!strcmp(kind, "ex")) r = p_cuLaunchKernelEx(&cfg, NULL, NULL, NULL);
                else if (!strcmp(kind, "ex_ptsz")) r = p_cuLaunchKernelEx_ptsz(&cfg, NULL, NULL, NULL);
                else if (!strcmp(kind, "coop")) r = p_cuLaunchCooperativeKernel(NULL, (unsigned)n, 1, 1, 32, 1, 1, 0, NULL, NULL);
                else if (!strcmp(kind, "coop_ptsz")) r = p_cuLaunchCooperativeKernel_ptsz(NULL, (unsigned)n, 1, 1, 32, 1, 1, 0, NULL, NULL);
                else if (!strcmp(kind, "graph_ptsz")) r = p_cuGraphLaunch_ptsz((CUgraphExec)(uintptr_t)n, NULL);
                else r = p_cuGraphLaunch((CUgraphExec)(uintptr_t)n, NULL); /* a graph of n us: n blocks at 1 us */
                if (++count % (long long)every == 0) cuStreamSynchronize(NULL);
            }
            cuStreamSynchronize(NULL);
            printf("%d %lld\n", r, count);
        } else if (sscanf(line, "capture %llu %lf", &n, &(double){0}) == 2) {
            double secs = 0;
            sscanf(line, "capture %llu %lf", &n, &secs);
            CUstream work = NULL, cap = NULL;
            cuStreamCreate(&work, 0);
            cuStreamCreate(&cap, 0);
            for (int i = 0; i < 20; i++) p_cuLaunchKernel(NULL, 500, 1, 1, 32, 1, 1, 0, work, NULL, NULL);
            cuStreamSynchronize(work);
            CUresult begin = cuStreamBeginCapture_v2(cap, (int)n), end = CUDA_ERROR_INVALID_VALUE, r = CUDA_SUCCESS;
            CUgraph g = NULL;
            if (begin == CUDA_SUCCESS) {
                /* the capture's kernels, and real work beside it (no synchronisation: that would be ours) */
                for (double stop = now_s() + secs; now_s() < stop;) {
                    p_cuLaunchKernel(NULL, 500, 1, 1, 32, 1, 1, 0, cap, NULL, NULL);
                    p_cuLaunchKernel(NULL, 500, 1, 1, 32, 1, 1, 0, work, NULL, NULL);
                    nanosleep(&(struct timespec){0, 2000000}, NULL);
                }
                end = cuStreamEndCapture(cap, &g);
            }
            if (end == CUDA_SUCCESS) r = p_cuGraphLaunch((CUgraphExec)(void *)g, work);
            cuStreamSynchronize(work);
            printf("%d %d %llu %d\n", begin, end, (unsigned long long)(uintptr_t)g, r);
        } else if (sscanf(line, "threads %d %d", &nsizes, &ops) == 2) {
            int nthreads = nsizes;
            unsigned seed;
            char *p = line;
            for (int skip = 0; skip < 3; skip++) p = strchr(p, ' ') + 1;
            seed = (unsigned)strtoul(p, &p, 10);
            nsizes = 0;
            while (*p && *p != '\n' && nsizes < 64) sizes[nsizes++] = strtoull(p, &p, 10);
            pthread_t t[64];
            for (int i = 0; i < nthreads && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(seed + (unsigned)i));
            for (int i = 0; i < nthreads && i < 64; i++) pthread_join(t[i], NULL);
            printf("0 %lld %lld %lld %lld\n", max_live, successes, failures, others);
            max_live = successes = failures = others = 0;
        } else if (sscanf(line, "bench %31s %llu", kind, &n) == 2) {
            CUresult r = CUDA_SUCCESS;
            double t0 = now_s();
            for (unsigned long long i = 0; i < n && r == CUDA_SUCCESS; i++) {
                if (!strcmp(kind, "launch")) r = p_cuLaunchKernel(NULL, 0, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                else if ((r = p_cuMemAlloc_v2(&id, 1 << 20)) == CUDA_SUCCESS) r = p_cuMemFree_v2(id);
            }
            printf("%d %lld\n", r, (long long)((now_s() - t0) / (double)n * 1e12));
        } else if (sscanf(line, "pools %llu %llu", &id, &n) == 2) {
            unsigned long long ok = 0;
            CUresult r = CUDA_SUCCESS;
            for (unsigned long long i = 0; i < id; i++) {
                CUmemoryPool pool;
                CUdeviceptr p;
                cuMemPoolCreate(&pool, NULL);
                r = p_cuMemAllocFromPoolAsync(&p, n, pool, NULL);
                if (r == CUDA_SUCCESS) ok++;
            }
            printf("%llu %d\n", ok, r);
        } else if (sscanf(line, "mixed %lf %u", &mixed_secs, &mixed_seed) == 2) {
            unsigned long long every = 4;
            sscanf(line, "mixed %lf %u %llu", &mixed_secs, &mixed_seed, &every);
            /* kernels of 0.1, 0.5, 2, 5 and 20 ms (1 us blocks) and graphs of 1 and 8 ms, drawn at random */
            static const unsigned lengths[] = {100, 500, 2000, 5000, 20000, 1000, 8000};
            double end = now_s() + mixed_secs;
            long long count = 0;
            CUresult r = CUDA_SUCCESS;
            while (now_s() < end && r == CUDA_SUCCESS) {
                unsigned k = (unsigned)(rand_r(&mixed_seed) % 7);
                if (k < 5) r = p_cuLaunchKernel(NULL, lengths[k], 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                else r = p_cuGraphLaunch((CUgraphExec)(uintptr_t)lengths[k], NULL);
                if (++count % (long long)every == 0) cuStreamSynchronize(NULL);
            }
            cuStreamSynchronize(NULL);
            printf("%d %lld\n", r, count);
        } else if (sscanf(line, "plant %31s", kind) == 1) {
            /* A fault planted in the library's own code for the sanitizer tests: its cuArrayCreate_v2 wrapper
             * reads the caller's descriptor before the driver does, so a descriptor in a 4-byte heap block
             * (overflow) or at an odd address (misaligned) is first touched inside the library. */
            CUarray a;
            CUresult r = CUDA_ERROR_INVALID_VALUE;
            if (!strcmp(kind, "overflow")) {
                void *block = malloc(4);
                r = p_cuArrayCreate_v2(&a, (const CUDA_ARRAY_DESCRIPTOR *)block);
                free(block);
            } else if (!strcmp(kind, "misaligned")) {
                static unsigned char raw[2 * sizeof(CUDA_ARRAY_DESCRIPTOR)] __attribute__((aligned(16)));
                CUDA_ARRAY_DESCRIPTOR d = {64, 2, CU_AD_FORMAT_UNSIGNED_INT16, 2};
                memcpy(raw + 1, &d, sizeof d);
                r = p_cuArrayCreate_v2(&a, (const CUDA_ARRAY_DESCRIPTOR *)(void *)(raw + 1));
            }
            printf("%d\n", r);
        } else if (sscanf(line, "stress %llu", &n) == 1) {
            printf("started\n");
            for (;;) {
                if (p_cuMemAlloc_v2(&id, n) == CUDA_SUCCESS) p_cuMemFree_v2(id);
            }
        } else {
            printf("? %s", line);
        }
    }
    return 0;
}
