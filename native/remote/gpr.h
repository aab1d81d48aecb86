/* gpupool remote mode: the wire protocol shared by the client library (gpr_client.c, loaded by a program
 * as its libcuda.so.1) and the GPU server (gpr_server.c, gpr_srv_*.c). docs/remote.md describes it for
 * people; this file is the definition.
 *
 * Every message is a 12-byte header and a payload, little-endian, fields at natural alignment:
 *   request  u32 op | u32 flags | u32 length     then `length` bytes
 *   reply    u32 result (a CUresult, or GPR_E_PROTOCOL) | u32 0 | u32 length     then `length` bytes
 * A request with GPR_F_NOREPLY gets no reply: its error, if any, is kept by the server and returned by the
 * next request that does get a reply (the driver's asynchronous errors surface the same way). */
#ifndef GPR_H
#define GPR_H

#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../gpupool_cuda.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the remote protocol is little-endian and this build writes structs as they are in memory"
#endif

#define GPR_MAGIC 0x31525047u   /* "GPR1": first field of the hello */
#define GPR_VERSION 1u
#define GPR_MAX_TOKEN 256u
#define GPR_MAX_MSG (16u << 20)    /* the largest payload either side accepts; bigger copies are split */
#define GPR_CHUNK (8u << 20)       /* what the client puts in one memcpy message */
#define GPR_MAX_NAME 256u
#define GPR_MAX_PARAMS 256u        /* kernel parameters described per function */
#define GPR_MAX_DEV 16
#define GPR_NATTR 160              /* device attributes 1..GPR_NATTR-1 cached by the client at cuInit */
#define GPR_E_PROTOCOL 0x7fff0001u /* reply to a message the server could not parse; it then hangs up */
#define GPR_R_MOVED 0x7fff0002u    /* instead of running a request: move to the server in the payload (an
                                    * address, NUL-terminated), then send the request again */
#define GPR_MAX_ADDR 256u

/* driver result codes the protocol and the client use beyond gpupool_cuda.h's (CUDA Driver API reference) */
#define GPR_CUDA_ERROR_DEINITIALIZED 4
#define GPR_CUDA_ERROR_NO_DEVICE 100
#define GPR_CUDA_ERROR_INVALID_DEVICE 101
#define GPR_CUDA_ERROR_INVALID_IMAGE 200
#define GPR_CUDA_ERROR_INVALID_CONTEXT 201
#define GPR_CUDA_ERROR_INVALID_HANDLE 400
#define GPR_CUDA_ERROR_NOT_READY 600
#define GPR_CUDA_ERROR_LAUNCH_FAILED 719
#define GPR_CUDA_ERROR_NOT_PERMITTED 800
#define GPR_CUDA_ERROR_NOT_SUPPORTED 801
#define GPR_CUDA_ERROR_UNKNOWN 999

/* the `extra` launch argument's markers (CU_LAUNCH_PARAM_*) */
#define GPR_LAUNCH_PARAM_END ((void *)0x00)
#define GPR_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define GPR_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

#define GPR_F_NOREPLY 1u

/* Stream and event handles travel as server-side table indexes. Stream 0 is the NULL (default) stream,
 * 1 the legacy and 2 the per-thread default stream (the driver's special values CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD); real streams start at GPR_FIRST_ID. */
#define GPR_STREAM_LEGACY 1u
#define GPR_STREAM_PER_THREAD 2u
#define GPR_FIRST_ID 16u

enum gpr_op {
    GPR_OP_HELLO = 1,        /* u32 magic, u32 version, u32 token length, token -> u32 version, u32 pid */
    GPR_OP_DEVICES,          /* -> struct gpr_devices */
    GPR_OP_CTX_CREATE,       /* u32 device, u32 flags, u32 primary -> - */
    GPR_OP_CTX_SYNC,         /* - -> - */
    GPR_OP_MEM_INFO,         /* - -> u64 free, u64 total */
    GPR_OP_MEM_ALLOC,        /* u64 bytes -> u64 device pointer */
    GPR_OP_MEM_FREE,         /* u64 pointer -> - */
    GPR_OP_HTOD,             /* u64 dst, u32 stream, u32 async, data -> - */
    GPR_OP_DTOH,             /* u64 src, u64 bytes, u32 stream, u32 async -> data */
    GPR_OP_DTOD,             /* u64 dst, u64 src, u64 bytes, u32 stream, u32 async -> - */
    GPR_OP_MEMSET,           /* u64 dst, u64 count, u32 value, u32 element size (1, 2, 4), u32 stream, u32 async */
    GPR_OP_MODULE_LOAD,      /* image -> u32 module */
    GPR_OP_MODULE_UNLOAD,    /* u32 module -> - */
    GPR_OP_GET_FUNCTION,     /* u32 module, name -> u32 function, u32 n (or GPR_PARAMS_UNKNOWN), n x (u32 offset, u32 size) */
    GPR_OP_LAUNCH,           /* struct gpr_launch, argument buffer -> - */
    GPR_OP_STREAM_CREATE,    /* u32 flags, i32 priority -> u32 stream */
    GPR_OP_STREAM_DESTROY,   /* u32 stream -> - */
    GPR_OP_STREAM_SYNC,      /* u32 stream -> - */
    GPR_OP_STREAM_QUERY,     /* u32 stream -> - (CUDA_ERROR_NOT_READY while busy) */
    GPR_OP_STREAM_WAIT,      /* u32 stream, u32 event, u32 flags -> - */
    GPR_OP_EVENT_CREATE,     /* u32 flags -> u32 event */
    GPR_OP_EVENT_DESTROY,    /* u32 event -> - */
    GPR_OP_EVENT_RECORD,     /* u32 event, u32 stream -> - */
    GPR_OP_EVENT_SYNC,       /* u32 event -> - */
    GPR_OP_EVENT_QUERY,      /* u32 event -> - */
    GPR_OP_EVENT_ELAPSED,    /* u32 start, u32 end -> f32 milliseconds */
    /* live migration (docs/remote.md): the client reads its state from the source worker and replays it
     * into a fresh worker on the target under the same numbers and device addresses */
    GPR_OP_STATE,            /* - -> struct gpr_state_head, then its records (see gpr_srv_state.c) */
    GPR_OP_MODULE_IMAGE,     /* u32 module -> the image as it was loaded */
    GPR_OP_RESTORE_ALLOC,    /* n x (u64 pointer, u64 bytes) -> - (memory at exactly those device addresses) */
    GPR_OP_RESTORE_MODULE,   /* u32 module, image -> - */
    GPR_OP_RESTORE_FUNCTION, /* u32 function, u32 module, name -> - */
    GPR_OP_RESTORE_STREAM,   /* u32 stream, u32 flags, i32 priority -> - */
    GPR_OP_RESTORE_EVENT,    /* u32 event, u32 flags -> - */
    GPR_OP_COUNT
};

#define GPR_PARAMS_UNKNOWN 0xffffffffu

/* GPR_OP_STATE's reply: this head, then nallocs x (u64 pointer, u64 bytes), nmodules x (u32 module, u32
 * image length), nfuncs x (u32 function, u32 module, u32 name length incl. NUL, name), nstreams x (u32
 * stream, u32 flags, i32 priority), nevents x (u32 event, u32 flags). */
struct gpr_state_head {
    uint32_t nallocs, nmodules, nfuncs, nstreams, nevents;
};

struct gpr_hdr {
    uint32_t op_or_result;
    uint32_t flags;
    uint32_t len;
};

struct gpr_devices {
    int32_t driver_version;
    int32_t count;
    struct {
        char name[GPR_MAX_NAME];
        char uuid[16];
        uint64_t total_mem;
        int32_t attr[GPR_NATTR];   /* attr[i] = cuDeviceGetAttribute(i); INT32_MIN where the driver refused */
    } dev[GPR_MAX_DEV];
};

struct gpr_launch {
    uint32_t function;
    uint32_t grid[3], block[3];
    uint32_t shared_mem;
    uint32_t stream;
    uint32_t use_extra;       /* 1: the buffer is an `extra` BUFFER_POINTER block; 0: laid out by param info */
    uint32_t nparams;         /* parameters described (what the server rebuilds kernelParams from) */
};

/* ---- blocking I/O with a deadline: never hangs on a peer that stopped halfway --------------------------- */
static inline int64_t gpr_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Read exactly n bytes. deadline_ms < 0: wait as long as it takes (the peer's death still ends it: EOF or a
 * reset). Returns 0, or -1 on EOF, error or deadline. */
static inline int gpr_read_full(int fd, void *buf, size_t n, int64_t deadline_ms) {
    char *p = buf;
    while (n > 0) {
        if (deadline_ms >= 0) {
            int64_t left = deadline_ms - gpr_now_ms();
            if (left <= 0) return -1;
            struct pollfd pf = {fd, POLLIN, 0};
            int r = poll(&pf, 1, left > 1000000 ? 1000000 : (int)left);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return -1;
        }
        ssize_t got = recv(fd, p, n, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Write exactly n bytes (MSG_NOSIGNAL: a closed peer is an error code, not SIGPIPE in the tenant's program). */
static inline int gpr_write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return -1;
        p += put;
        n -= (size_t)put;
    }
    return 0;
}

#endif
