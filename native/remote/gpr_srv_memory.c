/* Memory: the client's allocations and copies. Every live allocation is recorded, both to bound what one
 * client holds and so that a migration can rebuild each at the device address the program knows. */
#include "gpr_srv.h"

#include <stdlib.h>

/* Every live allocation, for a migration (and for the bound on how many a client holds). */
struct arec {
    uint64_t ptr, bytes;
    int64_t region;                    /* rebuilt by a migration: its region (below); -1 = cuMemAlloc'd */
};
static struct arec *arecs;
static size_t narecs, arecs_cap;

/* Memory a migration rebuilt: one VMM mapping per run of allocations whose granularity-aligned spans touch
 * (the driver packs small allocations closer than its 2 MiB mapping granularity, so each cannot have a
 * mapping of its own at its address). Freed when the last allocation in it is. */
struct region {
    uint64_t base, size;
    CUmemGenericAllocationHandle handle;
    uint32_t users;
};
static struct region *regions;
static size_t nregions;

static int reserve_arec(void) {
    if (narecs < arecs_cap) return 0;
    size_t cap = arecs_cap ? arecs_cap * 2 : 64;
    struct arec *a = realloc(arecs, cap * sizeof *a);
    if (a == NULL) return -1;
    arecs = a;
    arecs_cap = cap;
    return 0;
}

static CUresult free_alloc(uint64_t p) {
    size_t i = 0;
    while (i < narecs && arecs[i].ptr != p) i++;
    if (i == narecs) return CALL(MemFree, p); /* not ours: the driver gives the error it gives */
    CUresult res = CUDA_SUCCESS;
    if (arecs[i].region < 0) {
        res = CALL(MemFree, p);
    } else {
        struct region *g = &regions[arecs[i].region];
        if (--g->users == 0) {
            res = CALL(MemUnmap, g->base, g->size);
            if (res == CUDA_SUCCESS) res = CALL(MemRelease, g->handle);
            if (res == CUDA_SUCCESS) res = CALL(MemAddressFree, g->base, g->size);
        }
    }
    if (res == CUDA_SUCCESS) arecs[i] = arecs[--narecs];
    return res;
}

static int by_ptr(const void *a, const void *b) {
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return x < y ? -1 : x > y;
}

/* Memory mapped at exactly [base, base + size) (granularity-aligned), or an error: the range is taken. */
static CUresult map_region(uint64_t base, uint64_t size, const CUmemAllocationProp *prop,
                           CUmemGenericAllocationHandle *h) {
    CUdeviceptr got = 0;
    CUresult res = CALL(MemAddressReserve, &got, size, 0, base, 0);
    if (res != CUDA_SUCCESS) return res;
    if (got != base) {
        CALL(MemAddressFree, got, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    res = CALL(MemCreate, h, size, prop, 0);
    if (res == CUDA_SUCCESS) {
        res = CALL(MemMap, base, size, 0, *h, 0);
        if (res != CUDA_SUCCESS) CALL(MemRelease, *h);
    }
    if (res == CUDA_SUCCESS) {
        struct { int type, id, flags; } access = {1, prop->location.id, 3}; /* CUmemAccessDesc: read-write */
        res = CALL(MemSetAccess, base, size, &access, 1);
        if (res != CUDA_SUCCESS) {
            CALL(MemUnmap, base, size);
            CALL(MemRelease, *h);
        }
    }
    if (res != CUDA_SUCCESS) CALL(MemAddressFree, base, size);
    return res;
}

/* A migration's allocations, all at once (n x (u64 pointer, u64 bytes)): each at the device address the
 * program knows (docs/remote.md), runs of neighbours sharing one mapping. */
static CUresult restore_allocs(const unsigned char *p, uint32_t n) {
    if (n == 0) return CUDA_SUCCESS;
    if (narecs + n > MAX_ALLOCS) return CUDA_ERROR_OUT_OF_MEMORY;
    if (arecs_cap < narecs + n) {
        struct arec *a = realloc(arecs, (narecs + n) * sizeof *a);
        if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        arecs = a;
        arecs_cap = narecs + n;
    }
    uint64_t *list = malloc((size_t)n * 16);
    if (list == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(list, p, (size_t)n * 16);
    qsort(list, n, 16, by_ptr);
    CUdevice dev = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    size_t gran = 0;
    CUresult res = CALL(DeviceGet, &dev, gpr_device_ordinal);
    prop.location.id = dev;
    if (res == CUDA_SUCCESS) res = CALL(MemGetAllocationGranularity, &gran, &prop, 0);
    if (gran == 0) gran = 1;
    for (uint32_t i = 0; i < n && res == CUDA_SUCCESS;) {
        uint64_t lo = list[2 * i] / gran * gran, hi = lo;
        uint32_t j = i;
        do { /* sorted: the next allocation shares the mapping if it starts before this run's aligned end */
            uint64_t bytes = list[2 * j + 1] ? list[2 * j + 1] : 1;
            uint64_t end = (list[2 * j] + bytes + gran - 1) / gran * gran;
            if (end > hi) hi = end;
            j++;
        } while (j < n && list[2 * j] < hi);
        struct region *g = realloc(regions, (nregions + 1) * sizeof *g);
        if (g == NULL) {
            res = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        regions = g;
        struct region *r = &regions[nregions];
        *r = (struct region){lo, hi - lo, 0, 0};
        res = map_region(lo, hi - lo, &prop, &r->handle);
        if (res != CUDA_SUCCESS) break;
        for (uint32_t k = i; k < j; k++) {
            arecs[narecs++] = (struct arec){list[2 * k], list[2 * k + 1], (int64_t)nregions};
            r->users++;
        }
        nregions++;
        i = j;
    }
    free(list);
    return res;
}

GPR_HANDLER(gpr_op_mem_info) {
    size_t f = 0, t = 0;
    CUresult res = CALL(MemGetInfo, &f, &t);
    uint64_t *o = (uint64_t *)(void *)gpr_out_room(16);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    o[0] = f;
    o[1] = t;
    *olen = 16;
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_mem_alloc) {
    uint64_t n = rd_u64(r);
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    if (narecs >= MAX_ALLOCS || reserve_arec() != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr p = 0;
    CUresult res = CALL(MemAlloc, &p, (size_t)n);
    if (res == CUDA_SUCCESS) arecs[narecs++] = (struct arec){p, n, -1};
    uint64_t *o = (uint64_t *)(void *)gpr_out_room(8);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *o = p;
    *olen = 8;
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_mem_free) {
    uint64_t p = rd_u64(r);
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    return (uint32_t)free_alloc(p);
}

GPR_HANDLER(gpr_op_htod) {
    uint64_t dst = rd_u64(r);
    uint32_t sid = rd_u32(r), async = rd_u32(r);
    CUstream s;
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    if (gpr_stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    /* The payload buffer is reused by the next message: the driver has taken a pageable source in
     * before an async copy returns (it stages it), so handing it over is safe. */
    return (uint32_t)(async ? CALL(HtoDAsync, dst, r->p, r->left, s) : CALL(HtoD, dst, r->p, r->left));
}

GPR_HANDLER(gpr_op_dtoh) {
    uint64_t src = rd_u64(r), n = rd_u64(r);
    uint32_t sid = rd_u32(r), async = rd_u32(r);
    CUstream s;
    if (r->bad || n > GPR_MAX_MSG) return CUDA_ERROR_INVALID_VALUE;
    if (gpr_stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    unsigned char *o = gpr_out_room(n ? n : 1);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult res = async ? CALL(DtoHAsync, o, src, n, s) : CALL(DtoH, o, src, n);
    if (async && res == CUDA_SUCCESS) res = CALL(StreamSynchronize, s); /* the data leaves with the reply */
    if (res == CUDA_SUCCESS) *olen = (uint32_t)n;
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_dtod) {
    uint64_t dst = rd_u64(r), src = rd_u64(r), n = rd_u64(r);
    uint32_t sid = rd_u32(r), async = rd_u32(r);
    CUstream s;
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    if (gpr_stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    return (uint32_t)(async ? CALL(DtoDAsync, dst, src, n, s) : CALL(DtoD, dst, src, n));
}

GPR_HANDLER(gpr_op_memset) {
    uint64_t dst = rd_u64(r), n = rd_u64(r);
    uint32_t value = rd_u32(r), size = rd_u32(r), sid = rd_u32(r), async = rd_u32(r);
    CUstream s;
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    if (gpr_stream_of(sid, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    if (size == 1)
        return (uint32_t)(async ? CALL(MemsetD8Async, dst, (unsigned char)value, n, s)
                                : CALL(MemsetD8, dst, (unsigned char)value, n));
    if (size == 2)
        return (uint32_t)(async ? CALL(MemsetD16Async, dst, (unsigned short)value, n, s)
                                : CALL(MemsetD16, dst, (unsigned short)value, n));
    if (size == 4)
        return (uint32_t)(async ? CALL(MemsetD32Async, dst, value, n, s) : CALL(MemsetD32, dst, value, n));
    return CUDA_ERROR_INVALID_VALUE;
}

GPR_HANDLER(gpr_op_restore_alloc) {
    if (r->left % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
    return (uint32_t)restore_allocs(r->p, r->left / 16);
}

size_t gpr_memory_state_size(struct gpr_state_head *h) {
    h->nallocs = (uint32_t)narecs;
    return narecs * 16;
}

unsigned char *gpr_memory_state_put(unsigned char *p) {
    for (size_t i = 0; i < narecs; i++) {
        GPR_PUT(p, arecs[i].ptr);
        GPR_PUT(p, arecs[i].bytes);
    }
    return p;
}
