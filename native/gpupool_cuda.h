/* The CUDA driver and NVML declarations gpupool's interception library needs, written from NVIDIA's
 * public API documentation (CUDA Driver API reference, NVML API reference). Only the types and values the
 * library reads or passes on are declared; everything else stays opaque. No CUDA toolkit is needed. */
#ifndef GPUPOOL_CUDA_H
#define GPUPOOL_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* ---- driver API: results, handles ------------------------------------------------------------------ */
typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_FOUND 500

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;      /* the _v2 pointer type */
typedef unsigned int CUdeviceptr_v1;         /* the original 32-bit pointer type (cuMemAlloc, cuMemFree) */
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;

typedef struct { char bytes[16]; } CUuuid;

/* Managed memory (memory oversubscription, gp_mem.c) */
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_DEVICE_CPU (-1)                           /* a CUdevice naming the host */
#define CU_MEM_ADVISE_SET_PREFERRED_LOCATION 3       /* CUmem_advise values */
#define CU_MEM_ADVISE_SET_ACCESSED_BY 5
#define CU_MEM_LOCATION_TYPE_DEVICE 1             /* CUmemLocation.type (declared with the VMM types below) */

/* CUarray_format values (element type of one channel) */
#define CU_AD_FORMAT_UNSIGNED_INT8 0x01
#define CU_AD_FORMAT_UNSIGNED_INT16 0x02
#define CU_AD_FORMAT_UNSIGNED_INT32 0x03
#define CU_AD_FORMAT_SIGNED_INT8 0x08
#define CU_AD_FORMAT_SIGNED_INT16 0x09
#define CU_AD_FORMAT_SIGNED_INT32 0x0a
#define CU_AD_FORMAT_HALF 0x10
#define CU_AD_FORMAT_FLOAT 0x20
typedef int CUarray_format;

typedef struct {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;          /* the _v2 layout */

typedef struct {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;        /* the _v2 layout */

typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

/* CUmemAllocationProp (cuMemCreate): only the leading fields are read; the tail is kept opaque. */
typedef struct {
    int type;                      /* CUmemLocationType: 1 = device */
    int id;                        /* the device ordinal for a device location */
} CUmemLocation;
typedef struct {
    int type;                      /* CUmemAllocationType */
    int requestedHandleTypes;      /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];   /* compressionType, gpuDirectRDMACapable, usage, reserved[4] */
} CUmemAllocationProp;

/* CUmemPool_attribute: the pool's reserved backing memory (what it holds from the device) */
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5

/* cuLaunchKernelEx's configuration; attributes are passed through untouched. */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* The library's own timing events (gp_compute.c): entry points it calls on the real driver, with the ABI
 * the CUDA Driver API reference gives them. */
#define CUDA_ERROR_NOT_READY 600
/* Stream capture (CUDA graphs built by capturing a stream, as torch.cuda.graph does): the library must not
 * put its own events into a capture, nor make calls that invalidate one (gp_compute.c). */
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define CUDA_ERROR_CAPTURED_EVENT 907
typedef enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
               CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2 } CUstreamCaptureStatus;
typedef enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
               CU_STREAM_CAPTURE_MODE_RELAXED = 2 } CUstreamCaptureMode;
typedef struct CUgraph_st *CUgraph;
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DEFAULT 0x0
typedef CUresult (*cuEventCreate_fn)(CUevent *, unsigned int);
typedef CUresult (*cuEventDestroy_fn)(CUevent);
typedef CUresult (*cuEventRecord_fn)(CUevent, CUstream);
typedef CUresult (*cuEventQuery_fn)(CUevent);
typedef CUresult (*cuEventElapsedTime_fn)(float *, CUevent, CUevent);
typedef CUresult (*cuCtxGetCurrent_fn)(CUcontext *);
typedef CUresult (*cuCtxSetCurrent_fn)(CUcontext);
typedef CUresult (*cuStreamCreate_fn)(CUstream *, unsigned int);
typedef CUresult (*cuStreamIsCapturing_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*cuThreadExchangeStreamCaptureMode_fn)(CUstreamCaptureMode *);
typedef CUresult (*cuStreamDestroy_fn)(CUstream);

/* cuGetProcAddress_v2's out parameter (CUdriverProcAddressQueryResult) */
typedef int CUdriverProcAddressQueryResult;
/* cuGetProcAddress flags: CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM asks for the _ptsz/_ptds forms */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

/* ---- NVML -------------------------------------------------------------------------------------------- */
typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3         /* e.g. per-process utilisation in MIG mode */
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;          /* nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24 */
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;               /* the _v3 (nvmlProcessInfo_v2_t) layout */

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;  /* microseconds */
    unsigned int smUtil;           /* percent of the sample period a kernel of this process ran */
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

#endif
