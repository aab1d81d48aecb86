/* Memory: every allocating entry point reserves its bytes in the pod's accounting *before* the driver is
 * called, so two processes racing for the last bytes cannot both pass the cap; a failed call gives them
 * back. Stream-ordered pools are counted by what they reserve from the device (their growth), not per
 * call, read from the pool itself after each allocation and free. */
#include "gp.h"

#include <stdlib.h>
#include <string.h>

/* ---- what this process allocated: handle -> (limit index, bytes) -------------------------------------- */
enum kind { K_PTR = 1, K_ARRAY, K_MIPMAP, K_VMM };
struct rec {
    uint64_t key;
    int kind;
    int li;
    uint64_t bytes;
    struct rec *next;
};
#define NBUCKETS 4096
static struct rec *buckets[NBUCKETS];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket(uint64_t key, int kind) { return (size_t)((key >> 4) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)kind) % NBUCKETS; }

static void remember(uint64_t key, int kind, int li, uint64_t bytes) {
    struct rec *r = malloc(sizeof *r);
    if (r == NULL) return; /* the bytes stay counted: conservative */
    r->key = key;
    r->kind = kind;
    r->li = li;
    r->bytes = bytes;
    pthread_mutex_lock(&table_mu);
    size_t b = bucket(key, kind);
    r->next = buckets[b];
    buckets[b] = r;
    pthread_mutex_unlock(&table_mu);
}

static void forget(uint64_t key, int kind) {
    pthread_mutex_lock(&table_mu);
    struct rec **p = &buckets[bucket(key, kind)];
    while (*p != NULL && !((*p)->key == key && (*p)->kind == kind)) p = &(*p)->next;
    struct rec *r = *p;
    if (r != NULL) *p = r->next;
    pthread_mutex_unlock(&table_mu);
    if (r != NULL) {
        gp_mem_release(r->li, r->bytes);
        free(r);
    }
}

/* ---- stream-ordered pools ----------------------------------------------------------------------------- */
/* Pools are tracked in a fixed table; an allocation from a pool beyond it is refused (out of memory) rather
 * than let through uncounted. 1024 is far above what frameworks create (one per device and stream kind). */
#define MAX_POOLS 1024
struct pool {
    CUmemoryPool pool;
    int li;
    uint64_t recorded; /* reserved bytes already in the accounting */
};
static struct pool pools[MAX_POOLS];
static int npools;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t pool_reserved(CUmemoryPool p) {
    GP_REAL(CUresult (*)(CUmemoryPool, int, void *), get, "cuMemPoolGetAttribute");
    cuuint64_t v = 0;
    if (get == NULL || get(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) != CUDA_SUCCESS) return 0;
    return v;
}

static struct pool *find_pool(CUmemoryPool p, int li, int add) {
    for (int i = 0; i < npools; i++)
        if (pools[i].pool == p) return &pools[i];
    if (!add || npools == MAX_POOLS) return NULL;
    pools[npools] = (struct pool){p, li, 0};
    return &pools[npools++];
}

/* Bring the accounting in line with what each known pool holds now (pools shrink at syncs and trims). */
static void pools_refresh(void) {
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < npools; i++) {
        uint64_t now = pool_reserved(pools[i].pool);
        gp_mem_adjust(pools[i].li, (int64_t)now - (int64_t)pools[i].recorded);
        pools[i].recorded = now;
    }
    pthread_mutex_unlock(&pool_mu);
}

static CUmemoryPool device_pool(void) {
    GP_REAL(CUresult (*)(CUdevice *), ctxdev, "cuCtxGetDevice");
    GP_REAL(CUresult (*)(CUmemoryPool *, CUdevice), getpool, "cuDeviceGetMemPool");
    CUdevice d;
    CUmemoryPool p = NULL;
    if (ctxdev == NULL || getpool == NULL || ctxdev(&d) != CUDA_SUCCESS || getpool(&p, d) != CUDA_SUCCESS) return NULL;
    return p;
}

typedef CUresult (*pool_alloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

/* Reserve the growth the pool may need (all of `size`, unless the pool already holds that much unused),
 * allocate, then account the pool's real growth in place of the reservation. */
static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream, void *real,
                           int from_pool) {
    int li = gp_current_index();
    if (li < 0 || pool == NULL) {
        return from_pool ? ((pool_alloc_fn)real)(dptr, size, pool, stream)
                         : ((CUresult(*)(CUdeviceptr *, size_t, CUstream))real)(dptr, size, stream);
    }
    pools_refresh();
    pthread_mutex_lock(&pool_mu);
    struct pool *p = find_pool(pool, li, 1);
    if (p == NULL) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            gp_log("more than %d memory pools: allocations from the others are refused", MAX_POOLS);
        pthread_mutex_unlock(&pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    GP_REAL(CUresult (*)(CUmemoryPool, int, void *), get, "cuMemPoolGetAttribute");
    cuuint64_t in_use = 0;
    if (get != NULL) get(pool, 7 /* CU_MEMPOOL_ATTR_USED_MEM_CURRENT */, &in_use);
    uint64_t before = pool_reserved(pool);
    uint64_t idle = before > in_use ? before - in_use : 0;
    uint64_t growth = size > idle ? size - idle : 0;
    if (gp_mem_reserve(li, growth) != 0) {
        pthread_mutex_unlock(&pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = from_pool ? ((pool_alloc_fn)real)(dptr, size, pool, stream)
                           : ((CUresult(*)(CUdeviceptr *, size_t, CUstream))real)(dptr, size, stream);
    uint64_t after = pool_reserved(pool);
    gp_mem_adjust(li, (int64_t)after - (int64_t)before - (int64_t)growth);
    p->recorded += after - before;
    pthread_mutex_unlock(&pool_mu);
    return r;
}

/* ---- plain allocations -------------------------------------------------------------------------------- */
static int format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4; /* 32-bit formats; block-compressed and video formats are at most this per texel */
    }
}

static uint64_t dim(size_t v) { return v == 0 ? 1 : (uint64_t)v; }

static uint64_t array3d_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch) {
    return dim(w) * dim(h) * dim(d) * (uint64_t)ch * (uint64_t)format_bytes(f);
}

#define RESERVE_OR_OOM(li, bytes) \
    do {                                                              \
        if (gp_mem_reserve((li), (bytes)) != 0) return CUDA_ERROR_OUT_OF_MEMORY; \
    } while (0)

static int before_alloc(void) {
    int li = gp_current_index();
    if (li >= 0) {
        pools_refresh();
        gp_refresh_ctx(li);
    }
    return li;
}

/* ---- memory oversubscription ------------------------------------------------------------------------- */
/* An allocation the cap refuses may still be served, up to the cap plus the pod's oversubscription (limits
 * file only), as managed memory whose pages stay on the host: preferred location the CPU, mapped for the
 * GPU, so kernels read and write it over the bus (slower) and the GPU memory the pod holds stays within its
 * cap: the guaranteed shares beside it are untouched. Advice or a prefetch that would bring those pages
 * onto the GPU is refused (cuMemAdvise, cuMemPrefetchAsync below). The ranges are kept in a fixed table; a
 * spill beyond it is refused rather than left unguarded. */
#define MAX_SPILLS 4096
static struct { uint64_t start, bytes; } spills[MAX_SPILLS];
static int nspills;
static pthread_mutex_t spill_mu = PTHREAD_MUTEX_INITIALIZER;

static int spill_add(uint64_t start, uint64_t bytes) {
    pthread_mutex_lock(&spill_mu);
    int ok = nspills < MAX_SPILLS;
    if (ok) {
        spills[nspills].start = start;
        spills[nspills].bytes = bytes;
        nspills++;
    }
    pthread_mutex_unlock(&spill_mu);
    return ok;
}

static void spill_forget(uint64_t start) {
    pthread_mutex_lock(&spill_mu);
    for (int i = 0; i < nspills; i++) {
        if (spills[i].start != start) continue;
        spills[i] = spills[--nspills];
        break;
    }
    pthread_mutex_unlock(&spill_mu);
}

static int spilled(uint64_t start, uint64_t bytes) {
    uint64_t end = bytes > UINT64_MAX - start ? UINT64_MAX : start + bytes;
    pthread_mutex_lock(&spill_mu);
    int hit = 0;
    for (int i = 0; i < nspills && !hit; i++) hit = start < spills[i].start + spills[i].bytes && spills[i].start < end;
    pthread_mutex_unlock(&spill_mu);
    return hit;
}

static CUresult spill(CUdeviceptr *dptr, size_t size, int li) {
    GP_REAL(CUresult (*)(CUdeviceptr *, size_t, unsigned int), managed, "cuMemAllocManaged");
    GP_REAL(CUresult (*)(CUdeviceptr, size_t, int, CUdevice), advise, "cuMemAdvise");
    GP_REAL(CUresult (*)(CUdeviceptr), rfree, "cuMemFree_v2");
    GP_REAL(CUresult (*)(CUdevice *), ctxdev, "cuCtxGetDevice");
    if (gp_cfg.oversub[li] == 0 || managed == NULL || advise == NULL || rfree == NULL || ctxdev == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (gp_mem_reserve_over(li, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUdevice dev = 0;
    CUresult r = managed(dptr, size, CU_MEM_ATTACH_GLOBAL);
    if (r == CUDA_SUCCESS && (ctxdev(&dev) != CUDA_SUCCESS ||
                              advise(*dptr, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, CU_DEVICE_CPU) != CUDA_SUCCESS ||
                              advise(*dptr, size, CU_MEM_ADVISE_SET_ACCESSED_BY, dev) != CUDA_SUCCESS ||
                              !spill_add(*dptr, size))) {
        rfree(*dptr); /* pages that could migrate onto the GPU are never handed out */
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) remember(*dptr, K_PTR, li, size);
    else gp_mem_release(li, size);
    return r == CUDA_SUCCESS ? r : CUDA_ERROR_OUT_OF_MEMORY;
}

GP_EXPORT CUresult cuMemAdvise(CUdeviceptr p, size_t count, int advice, CUdevice dev) {
    GP_REAL(CUresult (*)(CUdeviceptr, size_t, int, CUdevice), real, "cuMemAdvise");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return spilled(p, count) ? CUDA_ERROR_INVALID_VALUE : real(p, count, advice, dev);
}

GP_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr p, size_t count, int advice, CUmemLocation where) {
    GP_REAL(CUresult (*)(CUdeviceptr, size_t, int, CUmemLocation), real, "cuMemAdvise_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return spilled(p, count) ? CUDA_ERROR_INVALID_VALUE : real(p, count, advice, where);
}

GP_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t count, CUdevice dst, CUstream s) {
    GP_REAL(CUresult (*)(CUdeviceptr, size_t, CUdevice, CUstream), real, "cuMemPrefetchAsync");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return dst != CU_DEVICE_CPU && spilled(p, count) ? CUDA_ERROR_INVALID_VALUE : real(p, count, dst, s);
}

GP_EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t count, CUdevice dst, CUstream s) {
    GP_REAL(CUresult (*)(CUdeviceptr, size_t, CUdevice, CUstream), real, "cuMemPrefetchAsync_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return dst != CU_DEVICE_CPU && spilled(p, count) ? CUDA_ERROR_INVALID_VALUE : real(p, count, dst, s);
}

GP_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t count, CUmemLocation where, unsigned flags,
                                         CUstream s) {
    GP_REAL(CUresult (*)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream), real, "cuMemPrefetchAsync_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return where.type == CU_MEM_LOCATION_TYPE_DEVICE && spilled(p, count) ? CUDA_ERROR_INVALID_VALUE
                                                                            : real(p, count, where, flags, s);
}

GP_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    GP_REAL(CUresult (*)(CUdeviceptr *, size_t), real, "cuMemAlloc_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = before_alloc();
    if (li < 0) return real(dptr, size);
    if (gp_mem_reserve(li, size) != 0) return spill(dptr, size, li);
    CUresult r = real(dptr, size);
    if (r == CUDA_SUCCESS) remember(*dptr, K_PTR, li, size);
    else gp_mem_release(li, size);
    return r;
}

GP_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size) {
    GP_REAL(CUresult (*)(CUdeviceptr_v1 *, unsigned int), real, "cuMemAlloc");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = before_alloc();
    if (li < 0) return real(dptr, size);
    RESERVE_OR_OOM(li, size);
    CUresult r = real(dptr, size);
    if (r == CUDA_SUCCESS) remember(*dptr, K_PTR, li, size);
    else gp_mem_release(li, size);
    return r;
}

GP_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    GP_REAL(CUresult (*)(CUdeviceptr *, size_t, unsigned int), real, "cuMemAllocManaged");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = before_alloc();
    if (li < 0) return real(dptr, size, flags);
    RESERVE_OR_OOM(li, size);
    CUresult r = real(dptr, size, flags);
    if (r == CUDA_SUCCESS) remember(*dptr, K_PTR, li, size);
    else gp_mem_release(li, size);
    return r;
}

/* The pitch is chosen by the driver: reserve the unpadded size, then the padding once it is known. */
GP_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int elem) {
    GP_REAL(CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int), real, "cuMemAllocPitch_v2");
    GP_REAL(CUresult (*)(CUdeviceptr), rfree, "cuMemFree_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = before_alloc();
    if (li < 0) return real(dptr, pitch, width, height, elem);
    uint64_t want = (uint64_t)width * height;
    RESERVE_OR_OOM(li, want);
    CUresult r = real(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) {
        gp_mem_release(li, want);
        return r;
    }
    uint64_t got = (uint64_t)*pitch * height;
    if (got > want && gp_mem_reserve(li, got - want) != 0) {
        if (rfree != NULL) rfree(*dptr);
        gp_mem_release(li, want);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    remember(*dptr, K_PTR, li, got > want ? got : want);
    return r;
}

GP_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                   unsigned int height, unsigned int elem) {
    GP_REAL(CUresult (*)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int), real,
            "cuMemAllocPitch");
    GP_REAL(CUresult (*)(CUdeviceptr_v1), rfree, "cuMemFree");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = before_alloc();
    if (li < 0) return real(dptr, pitch, width, height, elem);
    uint64_t want = (uint64_t)width * height;
    RESERVE_OR_OOM(li, want);
    CUresult r = real(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) {
        gp_mem_release(li, want);
        return r;
    }
    uint64_t got = (uint64_t)*pitch * height;
    if (got > want && gp_mem_reserve(li, got - want) != 0) {
        if (rfree != NULL) rfree(*dptr);
        gp_mem_release(li, want);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    remember(*dptr, K_PTR, li, got > want ? got : want);
    return r;
}

GP_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream) {
    GP_REAL(void *, real, "cuMemAllocAsync");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return pool_alloc(dptr, size, device_pool(), stream, real, 0);
}

GP_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream stream) {
    GP_REAL(void *, real, "cuMemAllocAsync_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return pool_alloc(dptr, size, device_pool(), stream, real, 0);
}

GP_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream) {
    GP_REAL(void *, real, "cuMemAllocFromPoolAsync");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return pool_alloc(dptr, size, pool, stream, real, 1);
}

GP_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                                CUstream stream) {
    GP_REAL(void *, real, "cuMemAllocFromPoolAsync_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    return pool_alloc(dptr, size, pool, stream, real, 1);
}

GP_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    GP_REAL(CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long),
            real, "cuMemCreate");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    /* VMM memory lives where its properties say, not necessarily on the current context's device. */
    int li = prop != NULL && prop->location.type == 1 ? gp_device_index(prop->location.id) : -1;
    if (li < 0) return real(handle, size, prop, flags);
    pools_refresh();
    gp_refresh_ctx(li);
    RESERVE_OR_OOM(li, size);
    CUresult r = real(handle, size, prop, flags);
    if (r == CUDA_SUCCESS) remember(*handle, K_VMM, li, size);
    else gp_mem_release(li, size);
    return r;
}


GP_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *d) {
    GP_REAL(CUresult (*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *), real, "cuArrayCreate_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = d != NULL ? before_alloc() : -1;
    if (li < 0) return real(arr, d);
    uint64_t bytes = array3d_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    RESERVE_OR_OOM(li, bytes);
    CUresult r = real(arr, d);
    if (r == CUDA_SUCCESS) remember((uint64_t)(uintptr_t)*arr, K_ARRAY, li, bytes);
    else gp_mem_release(li, bytes);
    return r;
}

GP_EXPORT CUresult cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    GP_REAL(CUresult (*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *), real, "cuArrayCreate");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = d != NULL ? before_alloc() : -1;
    if (li < 0) return real(arr, d);
    uint64_t bytes = array3d_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    RESERVE_OR_OOM(li, bytes);
    CUresult r = real(arr, d);
    if (r == CUDA_SUCCESS) remember((uint64_t)(uintptr_t)*arr, K_ARRAY, li, bytes);
    else gp_mem_release(li, bytes);
    return r;
}

GP_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    GP_REAL(CUresult (*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *), real, "cuArray3DCreate_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = d != NULL ? before_alloc() : -1;
    if (li < 0) return real(arr, d);
    uint64_t bytes = array3d_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    RESERVE_OR_OOM(li, bytes);
    CUresult r = real(arr, d);
    if (r == CUDA_SUCCESS) remember((uint64_t)(uintptr_t)*arr, K_ARRAY, li, bytes);
    else gp_mem_release(li, bytes);
    return r;
}

GP_EXPORT CUresult cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    GP_REAL(CUresult (*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *), real, "cuArray3DCreate");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = d != NULL ? before_alloc() : -1;
    if (li < 0) return real(arr, d);
    uint64_t bytes = array3d_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    RESERVE_OR_OOM(li, bytes);
    CUresult r = real(arr, d);
    if (r == CUDA_SUCCESS) remember((uint64_t)(uintptr_t)*arr, K_ARRAY, li, bytes);
    else gp_mem_release(li, bytes);
    return r;
}

/* A mipmapped array holds every level, each half the previous in each dimension (at least 1). */
GP_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                          unsigned int levels) {
    GP_REAL(CUresult (*)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int), real,
            "cuMipmappedArrayCreate");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    int li = d != NULL ? before_alloc() : -1;
    if (li < 0) return real(arr, d, levels);
    uint64_t bytes = 0;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        size_t w = d->Width >> l, h = d->Height >> l, z = d->Depth >> l;
        bytes += array3d_bytes(w ? w : 1, d->Height ? (h ? h : 1) : 0, d->Depth ? (z ? z : 1) : 0, d->Format,
                               d->NumChannels);
    }
    RESERVE_OR_OOM(li, bytes);
    CUresult r = real(arr, d, levels);
    if (r == CUDA_SUCCESS) remember((uint64_t)(uintptr_t)*arr, K_MIPMAP, li, bytes);
    else gp_mem_release(li, bytes);
    return r;
}

/* ---- frees -------------------------------------------------------------------------------------------- */
GP_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    GP_REAL(CUresult (*)(CUdeviceptr), real, "cuMemFree_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(p);
    if (r == CUDA_SUCCESS) {
        forget(p, K_PTR);
        spill_forget(p);
    }
    return r;
}

GP_EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) {
    GP_REAL(CUresult (*)(CUdeviceptr_v1), real, "cuMemFree");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(p);
    if (r == CUDA_SUCCESS) forget(p, K_PTR);
    return r;
}

GP_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    GP_REAL(CUresult (*)(CUmemGenericAllocationHandle), real, "cuMemRelease");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(h);
    if (r == CUDA_SUCCESS) forget(h, K_VMM);
    return r;
}

GP_EXPORT CUresult cuArrayDestroy(CUarray a) {
    GP_REAL(CUresult (*)(CUarray), real, "cuArrayDestroy");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(a);
    if (r == CUDA_SUCCESS) forget((uint64_t)(uintptr_t)a, K_ARRAY);
    return r;
}

GP_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    GP_REAL(CUresult (*)(CUmipmappedArray), real, "cuMipmappedArrayDestroy");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(a);
    if (r == CUDA_SUCCESS) forget((uint64_t)(uintptr_t)a, K_MIPMAP);
    return r;
}

GP_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    GP_REAL(CUresult (*)(CUdeviceptr, CUstream), real, "cuMemFreeAsync");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(p, s);
    pools_refresh();
    return r;
}

GP_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    GP_REAL(CUresult (*)(CUdeviceptr, CUstream), real, "cuMemFreeAsync_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(p, s);
    pools_refresh();
    return r;
}

GP_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    GP_REAL(CUresult (*)(CUmemoryPool, size_t), real, "cuMemPoolTrimTo");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(pool, keep);
    pools_refresh();
    return r;
}

GP_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    GP_REAL(CUresult (*)(CUmemoryPool), real, "cuMemPoolDestroy");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(pool);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&pool_mu);
        for (int i = 0; i < npools; i++) {
            if (pools[i].pool != pool) continue;
            gp_mem_release(pools[i].li, pools[i].recorded);
            pools[i] = pools[--npools];
            break;
        }
        pthread_mutex_unlock(&pool_mu);
    }
    return r;
}

/* ---- what the process is told ------------------------------------------------------------------------- */
static void share_info(int li, size_t *free_b, size_t *total_b) {
    uint64_t limit = gp_cfg.limit[li];
    if (limit == 0) return;
    pools_refresh();
    gp_refresh_ctx(li);
    uint64_t used = gp_pod_used(li);
    uint64_t avail = used >= limit ? 0 : limit - used;
    if (total_b != NULL) *total_b = limit < *total_b ? limit : *total_b;
    if (free_b != NULL) *free_b = avail < *free_b ? avail : *free_b;
}

GP_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    GP_REAL(CUresult (*)(size_t *, size_t *), real, "cuMemGetInfo_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(free_b, total_b);
    int li = r == CUDA_SUCCESS ? gp_current_index() : -1;
    if (li >= 0) share_info(li, free_b, total_b);
    return r;
}

GP_EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b) {
    GP_REAL(CUresult (*)(unsigned int *, unsigned int *), real, "cuMemGetInfo");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(free_b, total_b);
    int li = r == CUDA_SUCCESS ? gp_current_index() : -1;
    if (li >= 0 && free_b != NULL && total_b != NULL) {
        size_t f = *free_b, t = *total_b;
        share_info(li, &f, &t);
        *free_b = (unsigned int)f;
        *total_b = (unsigned int)t;
    }
    return r;
}

GP_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    GP_REAL(CUresult (*)(size_t *, CUdevice), real, "cuDeviceTotalMem_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(bytes, dev);
    int li = r == CUDA_SUCCESS && bytes != NULL ? gp_device_index(dev) : -1;
    if (li >= 0 && gp_cfg.limit[li] != 0 && gp_cfg.limit[li] < *bytes) *bytes = gp_cfg.limit[li];
    return r;
}

GP_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    GP_REAL(CUresult (*)(unsigned int *, CUdevice), real, "cuDeviceTotalMem");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(bytes, dev);
    int li = r == CUDA_SUCCESS && bytes != NULL ? gp_device_index(dev) : -1;
    if (li >= 0 && gp_cfg.limit[li] != 0 && gp_cfg.limit[li] < *bytes) *bytes = (unsigned int)gp_cfg.limit[li];
    return r;
}

void gp_mem_after_fork(void) {
    /* The child has no CUDA context of its parent's: its allocations and pools are not its own. */
    pthread_mutex_init(&table_mu, NULL);
    pthread_mutex_init(&pool_mu, NULL);
    pthread_mutex_init(&spill_mu, NULL);
    for (int i = 0; i < NBUCKETS; i++) buckets[i] = NULL; /* leaked on purpose: the parent's, copy-on-write */
    npools = 0;
    nspills = 0;
}

struct gp_hook gp_mem_hooks[] = {
#define H(n) {#n, (void *)n, NULL},
    H(cuMemAlloc) H(cuMemAlloc_v2) H(cuMemAllocPitch) H(cuMemAllocPitch_v2) H(cuMemAllocManaged)
    H(cuMemAllocAsync) H(cuMemAllocAsync_ptsz) H(cuMemAllocFromPoolAsync) H(cuMemAllocFromPoolAsync_ptsz)
    H(cuMemCreate) H(cuArrayCreate) H(cuArrayCreate_v2) H(cuArray3DCreate) H(cuArray3DCreate_v2)
    H(cuMipmappedArrayCreate) H(cuMemFree) H(cuMemFree_v2) H(cuMemFreeAsync) H(cuMemFreeAsync_ptsz)
    H(cuMemRelease) H(cuArrayDestroy) H(cuMipmappedArrayDestroy) H(cuMemPoolTrimTo) H(cuMemPoolDestroy)
    H(cuMemGetInfo) H(cuMemGetInfo_v2) H(cuDeviceTotalMem) H(cuDeviceTotalMem_v2)
    H(cuMemAdvise) H(cuMemAdvise_v2) H(cuMemPrefetchAsync) H(cuMemPrefetchAsync_ptsz) H(cuMemPrefetchAsync_v2)
#undef H
    {NULL, NULL, NULL},
};
