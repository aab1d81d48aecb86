/* Which of the limits a CUDA device is held to. The limits are in the order of the container's GPUs; a
 * program sees CUDA ordinals, which match that order only when it sees the same GPUs in the same order.
 * Where the GPUs are named by UUID (the agent's file, or NVIDIA_VISIBLE_DEVICES) the device's own UUID
 * decides, so a program that narrows CUDA_VISIBLE_DEVICES cannot make a GPU take another GPU's limit. */
#include "gp.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static int ordinal_map[64];
static pthread_once_t map_once = PTHREAD_ONCE_INIT;
static void map_reset(void) {
    for (int i = 0; i < 64; i++) ordinal_map[i] = -2;
}

static void format_uuid(const CUuuid *u, char *out, size_t size) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int gp_device_index(CUdevice dev) {
    gp_init();
    if (gp_cfg.ndev == 0 || dev < 0) return -1;
    if (!gp_cfg.by_uuid) return dev < gp_cfg.ndev ? dev : -1;
    pthread_once(&map_once, map_reset);
    if (dev < 64 && ordinal_map[dev] != -2) return ordinal_map[dev];
    int found = -1;
    typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);
    uuid_fn get = (uuid_fn)gp_cuda_sym("cuDeviceGetUuid_v2");
    if (get == NULL) get = (uuid_fn)gp_cuda_sym("cuDeviceGetUuid");
    CUuuid u;
    if (get != NULL && get(&u, dev) == CUDA_SUCCESS) {
        char text[64];
        format_uuid(&u, text, sizeof text);
        for (int i = 0; i < gp_cfg.ndev; i++)
            if (strcasecmp(text, gp_cfg.uuid[i]) == 0) found = i;
    }
    if (found < 0 && dev < gp_cfg.ndev) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            gp_log("device %d: its UUID is not in NVIDIA_VISIBLE_DEVICES; using the limit at its ordinal", dev);
        found = dev;
    }
    if (dev < 64) ordinal_map[dev] = found;
    return found;
}

int gp_current_index(void) {
    gp_init();
    if (gp_cfg.ndev == 0) return -1;
    if (gp_cfg.ndev == 1 && gp_cfg.nuuid <= 1) return 0; /* one GPU in the container: no driver call */
    GP_REAL(CUresult (*)(CUdevice *), get, "cuCtxGetDevice");
    CUdevice d;
    if (get == NULL || get(&d) != CUDA_SUCCESS) return -1;
    return gp_device_index(d);
}
