/* Context and device queries: what the node's GPUs are, and the worker's one context (one per connection,
 * so everything a client holds goes when its worker exits). The other families run only once it exists
 * (gpr_srv_dispatch.c). */
#include "gpr_srv.h"

CUcontext gpr_ctx;
int gpr_device_ordinal;

GPR_HANDLER(gpr_op_devices) {
    struct gpr_devices *d = (struct gpr_devices *)(void *)gpr_out_room(sizeof *d);
    if (d == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(d, 0, sizeof *d);
    int v = 0, n = 0;
    CALL(DriverGetVersion, &v);
    CUresult res = CALL(DeviceGetCount, &n);
    if (res != CUDA_SUCCESS) return (uint32_t)res;
    d->driver_version = v;
    d->count = n > GPR_MAX_DEV ? GPR_MAX_DEV : n;
    for (int i = 0; i < d->count; i++) {
        CUdevice dev = 0;
        CALL(DeviceGet, &dev, i);
        CALL(DeviceGetName, d->dev[i].name, (int)sizeof d->dev[i].name, dev);
        d->dev[i].name[GPR_MAX_NAME - 1] = '\0';
        CUuuid u;
        memset(&u, 0, sizeof u);
        CALL(DeviceGetUuid, &u, dev);
        memcpy(d->dev[i].uuid, u.bytes, 16);
        size_t total = 0;
        CALL(DeviceTotalMem, &total, dev);
        d->dev[i].total_mem = total;
        for (int a = 0; a < GPR_NATTR; a++) {
            int value = 0;
            d->dev[i].attr[a] = a > 0 && CALL(DeviceGetAttribute, &value, a, dev) == CUDA_SUCCESS ? value : INT32_MIN;
        }
    }
    *olen = sizeof *d;
    return CUDA_SUCCESS;
}

GPR_HANDLER(gpr_op_ctx_create) {
    uint32_t dev = rd_u32(r), flags = rd_u32(r), primary = rd_u32(r);
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    if (gpr_ctx != NULL) return CUDA_ERROR_INVALID_VALUE; /* one context per connection */
    CUdevice d = 0;
    CUresult res = CALL(DeviceGet, &d, (int)dev);
    if (res != CUDA_SUCCESS) return (uint32_t)res;
    gpr_device_ordinal = (int)dev;
    res = primary ? CALL(PrimaryCtxRetain, &gpr_ctx, d) : CALL(CtxCreate, &gpr_ctx, flags, d);
    if (res == CUDA_SUCCESS) res = CALL(CtxSetCurrent, gpr_ctx);
    if (res != CUDA_SUCCESS) gpr_ctx = NULL;
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_ctx_sync) {
    return (uint32_t)CALL(CtxSynchronize);
}
