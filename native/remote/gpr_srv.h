/* Internal interface between the files of gpupool-gpu-server (gpr_server.c says what the program does).
 *
 * The files, each one concern, lowest layer first; a file calls only into the layers below it
 * (tests/native/test_native_layout.py holds that order and fails on any call or include against it):
 *   gpr_srv_io.c        the log line, replies, the reply buffer
 *   gpr_srv_driver.c    the driver's functions, found once
 *   gpr_srv_context.c   the worker's one context; device queries
 *   gpr_srv_streams.c   streams and events (their tables, which memory and launches look up)
 *   gpr_srv_memory.c    allocations and copies
 *   gpr_srv_modules.c   modules, functions and launches
 *   gpr_srv_state.c     a migration's snapshot of the client's state (every family's part of it)
 *   gpr_srv_dispatch.c  the table from a request's op to its handler
 *   gpr_srv_worker.c    one connection's request loop
 *   gpr_srv_listener.c  accepting, admitting (token, limits) and starting workers
 *   gpr_server.c        the program's options
 * A request family keeps its tables to itself and hands the snapshot its part (*_state_size / _put),
 * so adding a family touches the family, the snapshot and the dispatch table, nothing else. */
#ifndef GPR_SRV_H
#define GPR_SRV_H

#include "gpr.h"

#define GPR_SERVER_NAME "gpupool-gpu-server"

/* What one client may hold: bounded so that one tenant cannot grow the server without end. */
#define MAX_ALLOCS 65536
#define MAX_MODULES 1024
#define MAX_FUNCS 16384
#define MAX_STREAMS 1024
#define MAX_EVENTS 16384
#define HELLO_TIMEOUT_MS 5000

/* Payload readers: each checks the length, so a short message is an error reply, never an overread. */
struct gpr_rd {
    const unsigned char *p;
    uint32_t left;
    int bad;
};
static inline uint32_t rd_u32(struct gpr_rd *r) {
    uint32_t v = 0;
    if (r->left < 4) {
        r->bad = 1;
        return 0;
    }
    memcpy(&v, r->p, 4);
    r->p += 4;
    r->left -= 4;
    return v;
}
static inline uint64_t rd_u64(struct gpr_rd *r) {
    uint64_t v = 0;
    if (r->left < 8) {
        r->bad = 1;
        return 0;
    }
    memcpy(&v, r->p, 8);
    r->p += 8;
    r->left -= 8;
    return v;
}

/* One request: its op (a handler may serve several), its payload, and the reply's payload length, which
 * the handler sets when it wrote a payload into gpr_out_room. Returns the CUresult to reply with. */
#define GPR_HANDLER(name)                                                                                   \
    uint32_t name(uint32_t op __attribute__((unused)), struct gpr_rd *r __attribute__((unused)),            \
                  uint32_t *olen __attribute__((unused)))
typedef uint32_t gpr_handler(uint32_t op, struct gpr_rd *r, uint32_t *olen);

/* Appends a value to a reply being built at p. */
#define GPR_PUT(p, v) (memcpy((p), &(v), sizeof(v)), (p) += sizeof(v))

/* gpr_srv_io.c */
void gpr_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int gpr_reply(int fd, uint32_t result, const void *data, uint32_t len);
extern unsigned char *gpr_outbuf;      /* the reply's payload, valid until the next gpr_out_room */
unsigned char *gpr_out_room(size_t n); /* gpr_outbuf with room for n bytes, or NULL */

/* gpr_srv_driver.c */
struct gpr_driver {
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*HtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*DtoH)(void *, CUdeviceptr, size_t);
    CUresult (*DtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*DtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*DtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*MemsetD16)(CUdeviceptr, unsigned short, size_t);
    CUresult (*MemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned int, size_t);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*ModuleLoadData)(void **, const void *);
    CUresult (*ModuleUnload)(void *);
    CUresult (*ModuleGetFunction)(CUfunction *, void *, const char *);
    CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*StreamCreateWithPriority)(CUstream *, unsigned, int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    /* the VMM calls a migrated allocation is rebuilt with, at the device address it had */
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const void *, size_t);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
};
extern struct gpr_driver gpr_drv;
void gpr_load_driver(const char *path); /* exits when the driver cannot be loaded */
/* A driver entry point this driver lacks answers NOT_SUPPORTED instead of crashing the worker. */
#define CALL(field, ...) (gpr_drv.field != NULL ? gpr_drv.field(__VA_ARGS__) : GPR_CUDA_ERROR_NOT_SUPPORTED)

/* gpr_srv_context.c */
extern CUcontext gpr_ctx;              /* NULL until GPR_OP_CTX_CREATE succeeded */
extern int gpr_device_ordinal;
GPR_HANDLER(gpr_op_devices);
GPR_HANDLER(gpr_op_ctx_create);
GPR_HANDLER(gpr_op_ctx_sync);

/* gpr_srv_streams.c */
int gpr_stream_of(uint32_t id, CUstream *out); /* 0, or -1 when the client holds no such stream */
int gpr_event_of(uint32_t id, CUevent *out);
GPR_HANDLER(gpr_op_stream_create);
GPR_HANDLER(gpr_op_stream_destroy);
GPR_HANDLER(gpr_op_stream_sync_or_query);
GPR_HANDLER(gpr_op_stream_wait);
GPR_HANDLER(gpr_op_event_create);
GPR_HANDLER(gpr_op_event_destroy_sync_query);
GPR_HANDLER(gpr_op_event_record);
GPR_HANDLER(gpr_op_event_elapsed);
GPR_HANDLER(gpr_op_restore_stream);
GPR_HANDLER(gpr_op_restore_event);
size_t gpr_streams_state_size(struct gpr_state_head *h);
unsigned char *gpr_streams_state_put(unsigned char *p);

/* gpr_srv_memory.c */
GPR_HANDLER(gpr_op_mem_info);
GPR_HANDLER(gpr_op_mem_alloc);
GPR_HANDLER(gpr_op_mem_free);
GPR_HANDLER(gpr_op_htod);
GPR_HANDLER(gpr_op_dtoh);
GPR_HANDLER(gpr_op_dtod);
GPR_HANDLER(gpr_op_memset);
GPR_HANDLER(gpr_op_restore_alloc);
size_t gpr_memory_state_size(struct gpr_state_head *h);
unsigned char *gpr_memory_state_put(unsigned char *p);

/* gpr_srv_modules.c */
GPR_HANDLER(gpr_op_module_load);
GPR_HANDLER(gpr_op_module_unload);
GPR_HANDLER(gpr_op_get_function);
GPR_HANDLER(gpr_op_launch);
GPR_HANDLER(gpr_op_module_image);
GPR_HANDLER(gpr_op_restore_module);
GPR_HANDLER(gpr_op_restore_function);
size_t gpr_modules_state_size(struct gpr_state_head *h);
unsigned char *gpr_modules_state_put(unsigned char *p);

/* gpr_srv_state.c */
GPR_HANDLER(gpr_op_state);

/* gpr_srv_dispatch.c */
uint32_t gpr_handle(uint32_t op, struct gpr_rd *r, uint32_t *olen); /* sets *olen (0 without a payload) */

/* gpr_srv_worker.c */
int gpr_worker(int fd, const char *cuda, int64_t msg_timeout_ms); /* the worker's exit status */

/* gpr_srv_listener.c */
struct gpr_options {
    const char *tokens, *hook, *cuda;  /* --tokens, --hook (NULL: none), --cuda */
    int limits_fd;                     /* --limits-fd, -1: a mount namespace */
    int max_clients;
    int64_t msg_timeout_ms;
};
int gpr_serve(const char *listen_spec, const struct gpr_options *opt); /* returns only on failure */

#endif
