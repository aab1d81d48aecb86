/* Internal interface of libgpupool_hip.so, gpupool's memory cap for HIP programs (docs/hook-hip.md), and the
 * HIP types and entry points it uses. No HIP SDK: the types below are what HIP's API reference documents
 * (hip_runtime_api.h), declared here with the values the runtime's ABI uses.
 *
 * The library is the shared modules of native/ (gp_core.h: gp_sym.c, gp_log.c, gp_config.c, gp_shared.c:
 * the limits file, the tamper rules and the pod's accounting, the same files the CUDA library runs) and
 * these, lowest layer first (tests/native/test_native_layout.py holds the order):
 *   gph_runtime.c  the HIP runtime's own functions, and which limit the current device is held to
 *   gph_mem.c      the memory cap: the hipMalloc family, hipFree, hipMemGetInfo
 *   gph_cu.c       compute by CU masks: every HSA queue of the process held to the container's CUs
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
    hipErrorInvalidHandle = 400,
    hipErrorLaunchFailure = 719,
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

/* HSA, the layer below HIP (libhsa-runtime64.so.1): the types and values of hsa.h and hsa_ext_amd.h that the CU
 * masks use, as the HSA runtime's reference documents them. HIP runs every kernel and copy through HSA queues,
 * and a queue's CU mask is what decides which compute units its work may run on. */
typedef enum {
    HSA_STATUS_SUCCESS = 0x0,
    HSA_STATUS_INFO_BREAK = 0x1,
    HSA_STATUS_ERROR = 0x1000,
    HSA_STATUS_ERROR_INVALID_ARGUMENT = 0x1001,
    HSA_STATUS_ERROR_INVALID_QUEUE_CREATION = 0x1002,
    HSA_STATUS_ERROR_INVALID_AGENT = 0x1004,
    HSA_STATUS_ERROR_INVALID_QUEUE = 0x1007,
    HSA_STATUS_ERROR_OUT_OF_RESOURCES = 0x1008,
    HSA_STATUS_ERROR_NOT_INITIALIZED = 0x100B,
    HSA_STATUS_CU_MASK_REDUCED = 44, /* hsa_ext_amd.h: success, but CUs disabled for the process stay disabled */
} hsa_status_t;
typedef struct { uint64_t handle; } hsa_agent_t;
typedef struct { uint64_t handle; } hsa_signal_t;
typedef uint32_t hsa_queue_type32_t; /* HSA_QUEUE_TYPE_MULTI 0, SINGLE 1, COOPERATIVE 2 */
typedef struct hsa_queue_s {
    hsa_queue_type32_t type;
    uint32_t features;
    void *base_address;
    hsa_signal_t doorbell_signal;
    uint32_t size;
    uint32_t reserved1;
    uint64_t id;
} hsa_queue_t;
#define HSA_AGENT_INFO_DEVICE 17                     /* hsa_device_type_t */
#define HSA_DEVICE_TYPE_GPU 1
#define HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT 0xA002 /* uint32_t */
typedef void (*hsa_queue_callback)(hsa_status_t status, hsa_queue_t *source, void *data);

/* cu_masks.v1: the agent's CU masks, one per GPU of the container in limits.v1's order, beside limits.v1 in the
 * read-only limits directory (gpupool/agent/state/hookdir.py writes it: CuMask, write_cu_masks). Little-endian.
 * ncu 0: no mask for that GPU (all its CUs); else bit j of bits[] (bits[j / 32] >> (j % 32) & 1) = CU j usable,
 * every bit below ncu, at least one set. Read once per process, at its first HSA queue. */
#ifndef GPH_CU_MASKS_PATH
#define GPH_CU_MASKS_PATH "/run/gpupool/limits/cu_masks.v1"
#endif
#define GPH_CU_MAGIC 0x314B534D55435047ULL /* "GPCUMSK1" little-endian */
#define GPH_CU_MAX 1024
#define GPH_CU_WORDS (GPH_CU_MAX / 32)
struct gph_cu_entry {
    uint32_t ncu;                 /* the card's CUs, 0 = no mask */
    uint32_t reserved;            /* 0 */
    uint32_t bits[GPH_CU_WORDS];
};
struct gph_cu_file {
    uint64_t magic;
    uint32_t version;             /* 1 */
    uint32_t ndev;                /* entries used, <= GP_MAX_DEV */
    struct gph_cu_entry dev[GP_MAX_DEV];
};
_Static_assert(sizeof(struct gph_cu_entry) == 136, "cu_masks.v1 entries are 136 bytes: the agent writes that");
_Static_assert(offsetof(struct gph_cu_file, dev) == 16 && sizeof(struct gph_cu_file) == 2192,
               "cu_masks.v1 is 16 bytes of header and 16 entries: the agent writes exactly 2192 bytes");

/* gph_runtime.c */
void *gph_sym(const char *name);       /* the HIP runtime's own function, never our wrapper */
void *gph_hsa_sym(const char *name);   /* the HSA runtime's own function (libhsa-runtime64.so.1) */
#define GPH_UNKNOWN (-2)
int gph_device_index(hipDevice_t dev); /* limit index of a HIP ordinal, -1 = not limited */
int gph_current_index(void);           /* of the current device; GPH_UNKNOWN: limited, but which is unknown */

/* Resolve the runtime's function once; the cache is a plain pointer (racing writers store the same). */
#define GPH_REAL_IN(find, type, var, name)                                         \
    static __typeof__(type) var;                                                   \
    do {                                                                           \
        if (__atomic_load_n(&var, __ATOMIC_ACQUIRE) == NULL)                       \
            __atomic_store_n(&var, (type)find(name), __ATOMIC_RELEASE);            \
    } while (0)
#define GPH_REAL(type, var, name) GPH_REAL_IN(gph_sym, type, var, name)
#define GPH_REAL_HSA(type, var, name) GPH_REAL_IN(gph_hsa_sym, type, var, name)

/* gph_mem.c */
extern struct gp_hook gph_mem_hooks[];
void gph_mem_after_fork(void);

/* gph_cu.c */
extern struct gp_hook gph_cu_hooks[];
void gph_cu_after_fork(void);

#endif
