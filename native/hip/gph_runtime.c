/* The HIP and HSA runtimes' own functions, and which of the limits a HIP device is held to.
 *
 * The runtime is found by its sonames (the one the program loaded, else the first that loads), and its
 * functions through libc's dlsym on that handle: never through the program's global scope, where this
 * library's own wrappers come first. The limits are in the order of the container's GPUs, matched to HIP
 * ordinals: a container granted one GPU sees it as ordinal 0 (the only render node it is given), which is
 * the case the agent grants today; with several GPUs of different caps, a program that reorders them
 * (HIP_VISIBLE_DEVICES) moves the caps with the ordinals (docs/hook-hip.md says so). */
#include "gph.h"

static void *hip_handle;
static const char *const hip_names[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                        "libamdhip64.so.5", NULL};

void *gph_sym(const char *name) { return gp_lib_sym(&hip_handle, hip_names, name); }

/* The HSA runtime HIP runs on, found the same way (its soname has been .so.1 since ROCm 1.x). */
static void *hsa_handle;
static const char *const hsa_names[] = {"libhsa-runtime64.so.1", "libhsa-runtime64.so", NULL};

void *gph_hsa_sym(const char *name) { return gp_lib_sym(&hsa_handle, hsa_names, name); }

int gph_device_index(hipDevice_t dev) {
    gp_init();
    if (gp_cfg.ndev == 0 || dev < 0) return -1;
    return dev < gp_cfg.ndev ? dev : -1;
}

int gph_current_index(void) {
    gp_init();
    if (gp_cfg.ndev == 0) return -1;
    if (gp_cfg.ndev == 1) return 0; /* one GPU in the container: no runtime call */
    GPH_REAL(hipError_t (*)(int *), get, "hipGetDevice");
    int d;
    if (get == NULL || get(&d) != hipSuccess) return GPH_UNKNOWN; /* refused: never uncounted */
    return gph_device_index(d);
}
