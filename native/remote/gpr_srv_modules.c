/* Modules and launches: the images a client loads (kept as loaded, for a migration), its functions with
 * their parameter layouts (the server rebuilds kernelParams from them, since pointers into the client's
 * memory mean nothing here), and the launches themselves. */
#include "gpr_srv.h"

#include <stdlib.h>

struct func {
    CUfunction f;
    uint32_t module;       /* 0 = free slot */
    uint32_t nparams;      /* GPR_PARAMS_UNKNOWN when the driver cannot describe them */
    uint32_t *layout;      /* nparams x (offset, size) */
    char *name;            /* kept for a migration, which looks it up again on the target */
};

static void *modules[MAX_MODULES];
static unsigned char *module_image[MAX_MODULES]; /* as loaded, for a migration */
static uint32_t module_len[MAX_MODULES];
static struct func funcs[MAX_FUNCS];

static void keep_image(uint32_t id, const unsigned char *image, uint32_t len) {
    free(module_image[id]);
    module_image[id] = malloc(len ? len : 1);
    module_len[id] = module_image[id] != NULL ? len : 0;
    if (module_image[id] != NULL) memcpy(module_image[id], image, len);
}

/* Table entry `id` for function f of module mid: its parameter layout as the driver describes it. */
static CUresult describe(uint32_t id, CUfunction f, uint32_t mid, const char *name) {
    uint32_t layout[2 * GPR_MAX_PARAMS], n = 0;
    if (gpr_drv.FuncGetParamInfo == NULL) n = GPR_PARAMS_UNKNOWN;
    while (n < GPR_MAX_PARAMS) {
        size_t off = 0, size = 0;
        if (gpr_drv.FuncGetParamInfo(f, n, &off, &size) != CUDA_SUCCESS) break;
        if (off > GPR_MAX_MSG || size > GPR_MAX_MSG) return GPR_CUDA_ERROR_NOT_SUPPORTED;
        layout[2 * n] = (uint32_t)off;
        layout[2 * n + 1] = (uint32_t)size;
        n++;
    }
    uint32_t count = n == GPR_PARAMS_UNKNOWN ? 0 : n;
    funcs[id] = (struct func){f, mid, n, NULL, strdup(name)};
    if (count > 0) {
        funcs[id].layout = malloc(count * 8);
        if (funcs[id].layout == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(funcs[id].layout, layout, count * 8);
    }
    return CUDA_SUCCESS;
}

GPR_HANDLER(gpr_op_module_load) {
    uint32_t id = 0;
    for (uint32_t i = 1; i < MAX_MODULES && id == 0; i++)
        if (modules[i] == NULL) id = i;
    if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (r->left == 0) return GPR_CUDA_ERROR_INVALID_IMAGE;
    /* The image is handed over as it came; a text image (PTX) must end with its NUL, which the client
     * sends, and the check keeps a driver from reading past a hostile one. */
    void *m = NULL;
    CUresult res = CALL(ModuleLoadData, &m, r->p);
    if (res != CUDA_SUCCESS) return (uint32_t)res;
    modules[id] = m;
    keep_image(id, r->p, r->left);
    uint32_t *o = (uint32_t *)(void *)gpr_out_room(4);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *o = id;
    *olen = 4;
    return CUDA_SUCCESS;
}

GPR_HANDLER(gpr_op_module_unload) {
    uint32_t id = rd_u32(r);
    if (r->bad || id == 0 || id >= MAX_MODULES || modules[id] == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
    CUresult res = CALL(ModuleUnload, modules[id]);
    modules[id] = NULL;
    free(module_image[id]);
    module_image[id] = NULL;
    for (uint32_t i = 1; i < MAX_FUNCS; i++) {
        if (funcs[i].module == id) {
            free(funcs[i].layout);
            free(funcs[i].name);
            memset(&funcs[i], 0, sizeof funcs[i]);
        }
    }
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_get_function) {
    uint32_t mid = rd_u32(r);
    if (r->bad || mid == 0 || mid >= MAX_MODULES || modules[mid] == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
    if (r->left == 0 || r->left > GPR_MAX_NAME || memchr(r->p, '\0', r->left) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = NULL;
    CUresult res = CALL(ModuleGetFunction, &f, modules[mid], (const char *)r->p);
    if (res != CUDA_SUCCESS) return (uint32_t)res;
    /* The driver hands out one handle per kernel; so does the table, however often a program asks. */
    for (uint32_t i = 1; i < MAX_FUNCS; i++) {
        if (funcs[i].module == mid && funcs[i].f == f) {
            uint32_t cnt = funcs[i].nparams == GPR_PARAMS_UNKNOWN ? 0 : funcs[i].nparams;
            uint32_t *o = (uint32_t *)(void *)gpr_out_room(8 + cnt * 8);
            if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
            o[0] = i;
            o[1] = funcs[i].nparams;
            if (cnt > 0) memcpy(o + 2, funcs[i].layout, cnt * 8);
            *olen = 8 + cnt * 8;
            return CUDA_SUCCESS;
        }
    }
    uint32_t id = 0;
    for (uint32_t i = 1; i < MAX_FUNCS && id == 0; i++)
        if (funcs[i].module == 0) id = i;
    if (id == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    res = describe(id, f, mid, (const char *)r->p);
    if (res != CUDA_SUCCESS) return (uint32_t)res;
    uint32_t n = funcs[id].nparams, count = n == GPR_PARAMS_UNKNOWN ? 0 : n;
    const uint32_t *layout = funcs[id].layout;
    uint32_t *o = (uint32_t *)(void *)gpr_out_room(8 + count * 8);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    o[0] = id;
    o[1] = n;
    if (count > 0) memcpy(o + 2, layout, count * 8);
    *olen = 8 + count * 8;
    return CUDA_SUCCESS;
}

GPR_HANDLER(gpr_op_launch) {
    struct gpr_launch l;
    if (r->left < sizeof l) return CUDA_ERROR_INVALID_VALUE;
    memcpy(&l, r->p, sizeof l);
    const unsigned char *args = r->p + sizeof l;
    uint32_t nargs = r->left - (uint32_t)sizeof l;
    CUstream s;
    if (gpr_stream_of(l.stream, &s) != 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
    CUfunction f = NULL; /* function 0: the program passed NULL, and the driver answers for it */
    struct func *fe = NULL;
    if (l.function != 0) {
        if (l.function >= MAX_FUNCS || funcs[l.function].module == 0) return GPR_CUDA_ERROR_INVALID_HANDLE;
        fe = &funcs[l.function];
        f = fe->f;
    }
    /* Copied out of the message buffer into an aligned one: the driver reads parameters by type. */
    static _Alignas(16) unsigned char argbuf[65536];
    if (nargs > sizeof argbuf) return CUDA_ERROR_INVALID_VALUE;
    memcpy(argbuf, args, nargs);
    if (l.use_extra) {
        size_t size = nargs;
        void *extra[] = {GPR_LAUNCH_PARAM_BUFFER_POINTER, argbuf, GPR_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         GPR_LAUNCH_PARAM_END};
        return (uint32_t)CALL(LaunchKernel, f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1],
                              l.block[2], l.shared_mem, s, NULL, extra);
    }
    void *params[GPR_MAX_PARAMS];
    uint32_t n = fe != NULL && fe->nparams != GPR_PARAMS_UNKNOWN ? fe->nparams : 0;
    if (fe != NULL && fe->nparams == GPR_PARAMS_UNKNOWN && nargs > 0) return GPR_CUDA_ERROR_NOT_SUPPORTED;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t off = fe->layout[2 * i], size = fe->layout[2 * i + 1];
        if ((uint64_t)off + size > nargs) return CUDA_ERROR_INVALID_VALUE;
        params[i] = argbuf + off;
    }
    return (uint32_t)CALL(LaunchKernel, f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1],
                          l.block[2], l.shared_mem, s, n > 0 ? params : NULL, NULL);
}

GPR_HANDLER(gpr_op_module_image) {
    uint32_t id = rd_u32(r);
    if (r->bad || id == 0 || id >= MAX_MODULES || module_image[id] == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
    unsigned char *o = gpr_out_room(module_len[id] ? module_len[id] : 1);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(o, module_image[id], module_len[id]);
    *olen = module_len[id];
    return CUDA_SUCCESS;
}

GPR_HANDLER(gpr_op_restore_module) {
    uint32_t id = rd_u32(r);
    if (r->bad || id == 0 || id >= MAX_MODULES || modules[id] != NULL || r->left == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult res = CALL(ModuleLoadData, &modules[id], r->p);
    if (res == CUDA_SUCCESS) keep_image(id, r->p, r->left);
    else modules[id] = NULL;
    return (uint32_t)res;
}

GPR_HANDLER(gpr_op_restore_function) {
    uint32_t id = rd_u32(r), mid = rd_u32(r);
    if (r->bad || id == 0 || id >= MAX_FUNCS || funcs[id].module != 0 || mid == 0 || mid >= MAX_MODULES ||
        modules[mid] == NULL || r->left == 0 || memchr(r->p, '\0', r->left) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = NULL;
    CUresult res = CALL(ModuleGetFunction, &f, modules[mid], (const char *)r->p);
    return (uint32_t)(res != CUDA_SUCCESS ? res : describe(id, f, mid, (const char *)r->p));
}

size_t gpr_modules_state_size(struct gpr_state_head *h) {
    size_t size = 0;
    for (uint32_t i = 1; i < MAX_MODULES; i++)
        if (modules[i] != NULL) h->nmodules++, size += 8;
    for (uint32_t i = 1; i < MAX_FUNCS; i++)
        if (funcs[i].module != 0) h->nfuncs++, size += 12 + strlen(funcs[i].name) + 1;
    return size;
}

unsigned char *gpr_modules_state_put(unsigned char *p) {
    for (uint32_t i = 1; i < MAX_MODULES; i++)
        if (modules[i] != NULL) {
            GPR_PUT(p, i);
            GPR_PUT(p, module_len[i]);
        }
    for (uint32_t i = 1; i < MAX_FUNCS; i++)
        if (funcs[i].module != 0) {
            uint32_t len = (uint32_t)strlen(funcs[i].name) + 1;
            GPR_PUT(p, i);
            GPR_PUT(p, funcs[i].module);
            GPR_PUT(p, len);
            memcpy(p, funcs[i].name, len);
            p += len;
        }
    return p;
}
