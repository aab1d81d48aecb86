/* Internal interface of libgpupool_hip.so, gpupool's memory cap for HIP programs (docs/hook-hip.md), and the
 * HIP types and entry points it uses. No HIP SDK: the types below are what HIP's API reference documents
 * (hip_runtime_api.h), declared here with the values the runtime's ABI uses.
 *
 * The library is the shared modules of native/ (gp_core.h: gp_sym.c, gp_log.c, gp_config.c, gp_shared.c:
 * the limits file, the tamper rules and the pod's accounting, the same files the CUDA library runs) and
 * these, lowest layer first (tests/native/test_native_layout.py holds the order):
 *   gph_runtime.c  the HIP runtime's own functions, and which limit the current device is held to
 *   gph_mem.c      the memory cap: the hipMalloc family, hipFree, hipMemGetInfo
 *   gph_lookup.c   the program's lookups (dlsym, dlvsym, hipGetProcAddress) answered with the wrappers
 *   gph_fork.c     a forked child starting afresh */
#ifndef GPH_H
#define GPH_H

#include "../gp_core.h"

/* hipError_t: the values the HIP reference lists (HIP's own enum, which follows CUDA's runtime numbering). */
typedef enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,            /* also hipErrorMemoryAllocation */
    hipErrorNotInitialized = 3,
    hipErrorInvalidDevicePointer = 17,
    hipErrorInvalidDevice = 101,
    hipErrorNotFound = 500,
    hipErrorNotSupported = 801,
} hipError_t;

typedef int hipDevice_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipMemPoolHandle_t *hipMemPool_t;
typedef enum {
    HIP_GET_PROC_ADDRESS_SUCCESS = 0,
    HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    HIP_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} hipDriverProcAddressQueryResult;

/* hipMallocManaged's flags and hipExtMallocWithFlags' */
#define hipMemAttachGlobal 0x01
#define hipMemAttachHost 0x02
#define hipDeviceMallocDefault 0x0
#define hipDeviceMallocFinegrained 0x1
#define hipMallocSignalMemory 0x2
#define hipDeviceMallocUncached 0x3

/* gph_runtime.c */
void *gph_sym(const char *name);       /* the HIP runtime's own function, never our wrapper */
#define GPH_UNKNOWN (-2)
int gph_device_index(hipDevice_t dev); /* limit index of a HIP ordinal, -1 = not limited */
int gph_current_index(void);           /* of the current device; GPH_UNKNOWN: limited, but which is unknown */

/* Resolve the runtime's function once; the cache is a plain pointer (racing writers store the same). */
#define GPH_REAL(type, var, name)                                                  \
    static __typeof__(type) var;                                                   \
    do {                                                                           \
        if (__atomic_load_n(&var, __ATOMIC_ACQUIRE) == NULL)                       \
            __atomic_store_n(&var, (type)gph_sym(name), __ATOMIC_RELEASE);         \
    } while (0)

/* gph_mem.c */
extern struct gp_hook gph_mem_hooks[];
void gph_mem_after_fork(void);

#endif
