/* From a request's op to its handler. Every op but the two that make a context needs one: checked here,
 * once, so no handler can run against a worker without a context. */
#include "gpr_srv.h"

static const struct {
    gpr_handler *run;
    int without_context;
} handlers[GPR_OP_COUNT] = {
    [GPR_OP_DEVICES]            = {gpr_op_devices, 1},
    [GPR_OP_CTX_CREATE]         = {gpr_op_ctx_create, 1},
    [GPR_OP_CTX_SYNC]           = {gpr_op_ctx_sync, 0},
    [GPR_OP_MEM_INFO]           = {gpr_op_mem_info, 0},
    [GPR_OP_MEM_ALLOC]          = {gpr_op_mem_alloc, 0},
    [GPR_OP_MEM_FREE]           = {gpr_op_mem_free, 0},
    [GPR_OP_HTOD]               = {gpr_op_htod, 0},
    [GPR_OP_DTOH]               = {gpr_op_dtoh, 0},
    [GPR_OP_DTOD]               = {gpr_op_dtod, 0},
    [GPR_OP_MEMSET]             = {gpr_op_memset, 0},
    [GPR_OP_MODULE_LOAD]        = {gpr_op_module_load, 0},
    [GPR_OP_MODULE_UNLOAD]      = {gpr_op_module_unload, 0},
    [GPR_OP_GET_FUNCTION]       = {gpr_op_get_function, 0},
    [GPR_OP_LAUNCH]             = {gpr_op_launch, 0},
    [GPR_OP_STREAM_CREATE]      = {gpr_op_stream_create, 0},
    [GPR_OP_STREAM_DESTROY]     = {gpr_op_stream_destroy, 0},
    [GPR_OP_STREAM_SYNC]        = {gpr_op_stream_sync_or_query, 0},
    [GPR_OP_STREAM_QUERY]       = {gpr_op_stream_sync_or_query, 0},
    [GPR_OP_STREAM_WAIT]        = {gpr_op_stream_wait, 0},
    [GPR_OP_EVENT_CREATE]       = {gpr_op_event_create, 0},
    [GPR_OP_EVENT_DESTROY]      = {gpr_op_event_destroy_sync_query, 0},
    [GPR_OP_EVENT_RECORD]       = {gpr_op_event_record, 0},
    [GPR_OP_EVENT_SYNC]         = {gpr_op_event_destroy_sync_query, 0},
    [GPR_OP_EVENT_QUERY]        = {gpr_op_event_destroy_sync_query, 0},
    [GPR_OP_EVENT_ELAPSED]      = {gpr_op_event_elapsed, 0},
    [GPR_OP_STATE]              = {gpr_op_state, 0},
    [GPR_OP_MODULE_IMAGE]       = {gpr_op_module_image, 0},
    [GPR_OP_RESTORE_ALLOC]      = {gpr_op_restore_alloc, 0},
    [GPR_OP_RESTORE_MODULE]     = {gpr_op_restore_module, 0},
    [GPR_OP_RESTORE_FUNCTION]   = {gpr_op_restore_function, 0},
    [GPR_OP_RESTORE_STREAM]     = {gpr_op_restore_stream, 0},
    [GPR_OP_RESTORE_EVENT]      = {gpr_op_restore_event, 0},
};

uint32_t gpr_handle(uint32_t op, struct gpr_rd *r, uint32_t *olen) {
    *olen = 0;
    if (op <= GPR_OP_HELLO || op >= GPR_OP_COUNT) return GPR_CUDA_ERROR_NOT_SUPPORTED;
    if (!handlers[op].without_context && gpr_ctx == NULL) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    if (handlers[op].run == NULL) return GPR_CUDA_ERROR_NOT_SUPPORTED;
    return handlers[op].run(op, r, olen);
}
