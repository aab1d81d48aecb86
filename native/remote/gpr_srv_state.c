/* GPR_OP_STATE: everything a target worker needs to stand in for this one (gpr.h, struct gpr_state_head),
 * for a live migration. Each family writes its own part, in the order the head lists them. */
#include "gpr_srv.h"

GPR_HANDLER(gpr_op_state) {
    struct gpr_state_head h = {0, 0, 0, 0, 0};
    size_t size = sizeof h;
    size += gpr_memory_state_size(&h);
    size += gpr_modules_state_size(&h);
    size += gpr_streams_state_size(&h);
    if (size > GPR_MAX_MSG) return GPR_CUDA_ERROR_NOT_SUPPORTED;
    unsigned char *o = gpr_out_room(size), *p = o;
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    GPR_PUT(p, h);
    p = gpr_memory_state_put(p);
    p = gpr_modules_state_put(p);
    p = gpr_streams_state_put(p);
    *olen = (uint32_t)size;
    return CUDA_SUCCESS;
}
