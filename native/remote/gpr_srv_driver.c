/* The driver functions a worker calls, found once at start. */
#include "gpr_srv.h"

#include <dlfcn.h>
#include <stdlib.h>

struct gpr_driver gpr_drv;

void gpr_load_driver(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        gpr_say("cannot load the driver %s: %s", path, dlerror());
        exit(3);
    }
    /* Looked up with dlsym so that the preloaded interception library answers with its wrappers: the
     * worker's calls are accounted and paced exactly as a local program's are. */
#define R(field, name) *(void **)&gpr_drv.field = dlsym(h, name)
    R(Init, "cuInit"); R(DriverGetVersion, "cuDriverGetVersion"); R(DeviceGetCount, "cuDeviceGetCount");
    R(DeviceGet, "cuDeviceGet"); R(DeviceGetName, "cuDeviceGetName"); R(DeviceGetUuid, "cuDeviceGetUuid_v2");
    if (gpr_drv.DeviceGetUuid == NULL) R(DeviceGetUuid, "cuDeviceGetUuid");
    R(DeviceTotalMem, "cuDeviceTotalMem_v2"); R(DeviceGetAttribute, "cuDeviceGetAttribute");
    R(CtxCreate, "cuCtxCreate_v2"); R(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    R(CtxSetCurrent, "cuCtxSetCurrent"); R(CtxSynchronize, "cuCtxSynchronize");
    R(MemGetInfo, "cuMemGetInfo_v2"); R(MemAlloc, "cuMemAlloc_v2"); R(MemFree, "cuMemFree_v2");
    R(HtoD, "cuMemcpyHtoD_v2"); R(HtoDAsync, "cuMemcpyHtoDAsync_v2");
    R(DtoH, "cuMemcpyDtoH_v2"); R(DtoHAsync, "cuMemcpyDtoHAsync_v2");
    R(DtoD, "cuMemcpyDtoD_v2"); R(DtoDAsync, "cuMemcpyDtoDAsync_v2");
    R(MemsetD8, "cuMemsetD8_v2"); R(MemsetD8Async, "cuMemsetD8Async");
    R(MemsetD16, "cuMemsetD16_v2"); R(MemsetD16Async, "cuMemsetD16Async");
    R(MemsetD32, "cuMemsetD32_v2"); R(MemsetD32Async, "cuMemsetD32Async");
    R(ModuleLoadData, "cuModuleLoadData"); R(ModuleUnload, "cuModuleUnload");
    R(ModuleGetFunction, "cuModuleGetFunction"); R(FuncGetParamInfo, "cuFuncGetParamInfo");
    R(LaunchKernel, "cuLaunchKernel"); R(StreamCreateWithPriority, "cuStreamCreateWithPriority");
    R(StreamDestroy, "cuStreamDestroy_v2"); R(StreamSynchronize, "cuStreamSynchronize");
    R(StreamQuery, "cuStreamQuery"); R(StreamWaitEvent, "cuStreamWaitEvent");
    R(EventCreate, "cuEventCreate"); R(EventDestroy, "cuEventDestroy_v2"); R(EventRecord, "cuEventRecord");
    R(EventSynchronize, "cuEventSynchronize"); R(EventQuery, "cuEventQuery");
    R(EventElapsedTime, "cuEventElapsedTime");
    R(MemAddressReserve, "cuMemAddressReserve"); R(MemAddressFree, "cuMemAddressFree");
    R(MemCreate, "cuMemCreate"); R(MemRelease, "cuMemRelease"); R(MemMap, "cuMemMap"); R(MemUnmap, "cuMemUnmap");
    R(MemSetAccess, "cuMemSetAccess"); R(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
#undef R
}
