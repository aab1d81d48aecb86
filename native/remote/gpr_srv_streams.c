/* Streams and events: the client names them by index into these tables (gpr.h), never by the driver's
 * handle, so a migration can recreate them on another GPU under the same numbers. */
#include "gpr_srv.h"

static CUstream streams[MAX_STREAMS];
static unsigned char stream_used[MAX_STREAMS];
static uint32_t stream_flags[MAX_STREAMS];
static int32_t stream_prio[MAX_STREAMS];
static CUevent events[MAX_EVENTS];
static unsigned char event_used[MAX_EVENTS];
static uint32_t event_flags[MAX_EVENTS];

int gpr_stream_of(uint32_t id, CUstream *out) {
    if (id == 0 || id == GPR_STREAM_LEGACY || id == GPR_STREAM_PER_THREAD) {
        *out = (CUstream)(uintptr_t)id;
        return 0;
    }
    if (id < GPR_FIRST_ID || id >= MAX_STREAMS || !stream_used[id]) return -1;
    *out = streams[id];
    return 0;
}

int gpr_event_of(uint32_t id, CUevent *out) {
    if (id < GPR_FIRST_ID || id >= MAX_EVENTS || !event_used[id]) return -1;
    *out = events[id];
    return 0;
}

static uint32_t free_slot(const unsigned char *used, uint32_t n) {
    for (uint32_t i = GPR_FIRST_ID; i < n; i++)
        if (!used[i]) return i;
    return 0;
}

GPR_HANDLER(gpr_op_stream_create) {
    uint32_t flags = rd_u32(r), prio = rd_u32(r);
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    uint32_t id = free_slot(stream_used, MAX_STREAMS);
    if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult res = CALL(StreamCreateWithPriority, &streams[id], flags, (int)prio);
    if (res != CUDA_SUCCESS) return (uint32_t)res;
    stream_used[id] = 1;
    stream_flags[id] = flags;
    stream_prio[id] = (int32_t)prio;
    uint32_t *o = (uint32_t *)(void *)gpr_out_room(4);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *o = id;
    *olen = 4;
    return CUDA_SUCCESS;
}

GPR_HANDLER(gpr_op_stream_destroy) {
    uint32_t id = rd_u32(r);
    CUstream s;
    if (r->bad || id < GPR_FIRST_ID || gpr_stream_of(id, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    stream_used[id] = 0;
    return (uint32_t)CALL(StreamDestroy, s);
}

GPR_HANDLER(gpr_op_stream_sync_or_query) {
    uint32_t id = rd_u32(r);
    CUstream s;
    if (r->bad || gpr_stream_of(id, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    return (uint32_t)(op == GPR_OP_STREAM_SYNC ? CALL(StreamSynchronize, s) : CALL(StreamQuery, s));
}

GPR_HANDLER(gpr_op_stream_wait) {
    uint32_t sid = rd_u32(r), eid = rd_u32(r), flags = rd_u32(r);
    CUstream s;
    CUevent e;
    if (r->bad || gpr_stream_of(sid, &s) != 0 || gpr_event_of(eid, &e) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    return (uint32_t)CALL(StreamWaitEvent, s, e, flags);
}

GPR_HANDLER(gpr_op_event_create) {
    uint32_t flags = rd_u32(r);
    if (r->bad) return CUDA_ERROR_INVALID_VALUE;
    uint32_t id = free_slot(event_used, MAX_EVENTS);
    if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult res = CALL(EventCreate, &events[id], flags);
    if (res != CUDA_SUCCESS) return (uint32_t)res;
    event_used[id] = 1;
    event_flags[id] = flags;
    uint32_t *o = (uint32_t *)(void *)gpr_out_room(4);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *o = id;
    *olen = 4;
    return CUDA_SUCCESS;
}

GPR_HANDLER(gpr_op_event_destroy_sync_query) {
    uint32_t id = rd_u32(r);
    CUevent e;
    if (r->bad || gpr_event_of(id, &e) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    if (op == GPR_OP_EVENT_DESTROY) {
        event_used[id] = 0;
        return (uint32_t)CALL(EventDestroy, e);
    }
    return (uint32_t)(op == GPR_OP_EVENT_SYNC ? CALL(EventSynchronize, e) : CALL(EventQuery, e));
}

GPR_HANDLER(gpr_op_event_record) {
    uint32_t eid = rd_u32(r), sid = rd_u32(r);
    CUstream s;
    CUevent e;
    if (r->bad || gpr_stream_of(sid, &s) != 0 || gpr_event_of(eid, &e) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    return (uint32_t)CALL(EventRecord, e, s);
}

GPR_HANDLER(gpr_op_event_elapsed) {
    uint32_t a = rd_u32(r), b = rd_u32(r);
    CUevent ea, eb;
    if (r->bad || gpr_event_of(a, &ea) != 0 || gpr_event_of(b, &eb) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    float ms = 0;
    CUresult res = CALL(EventElapsedTime, &ms, ea, eb);
    unsigned char *o = gpr_out_room(4);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(o, &ms, 4);
    *olen = 4;
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_restore_stream) {
    uint32_t id = rd_u32(r), flags = rd_u32(r), prio = rd_u32(r);
    if (r->bad || id < GPR_FIRST_ID || id >= MAX_STREAMS || stream_used[id]) return CUDA_ERROR_INVALID_VALUE;
    CUresult res = CALL(StreamCreateWithPriority, &streams[id], flags, (int)prio);
    if (res == CUDA_SUCCESS) {
        stream_used[id] = 1;
        stream_flags[id] = flags;
        stream_prio[id] = (int32_t)prio;
    }
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_restore_event) {
    uint32_t id = rd_u32(r), flags = rd_u32(r);
    if (r->bad || id < GPR_FIRST_ID || id >= MAX_EVENTS || event_used[id]) return CUDA_ERROR_INVALID_VALUE;
    CUresult res = CALL(EventCreate, &events[id], flags);
    if (res == CUDA_SUCCESS) {
        event_used[id] = 1;
        event_flags[id] = flags;
    }
    return (uint32_t)res;
}

size_t gpr_streams_state_size(struct gpr_state_head *h) {
    size_t size = 0;
    for (uint32_t i = GPR_FIRST_ID; i < MAX_STREAMS; i++)
        if (stream_used[i]) h->nstreams++, size += 12;
    for (uint32_t i = GPR_FIRST_ID; i < MAX_EVENTS; i++)
        if (event_used[i]) h->nevents++, size += 8;
    return size;
}

unsigned char *gpr_streams_state_put(unsigned char *p) {
    for (uint32_t i = GPR_FIRST_ID; i < MAX_STREAMS; i++)
        if (stream_used[i]) {
            GPR_PUT(p, i);
            GPR_PUT(p, stream_flags[i]);
            GPR_PUT(p, stream_prio[i]);
        }
    for (uint32_t i = GPR_FIRST_ID; i < MAX_EVENTS; i++)
        if (event_used[i]) {
            GPR_PUT(p, i);
            GPR_PUT(p, event_flags[i]);
        }
    return p;
}
