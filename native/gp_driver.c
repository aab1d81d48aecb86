/* The CUDA driver's and NVML's own functions (never our wrappers), by their sonames: the ones every
 * installation of the driver provides. Apart from gp_sym.c because the HIP library shares that file and
 * must not carry, or ever load, the NVIDIA libraries. */
#include "gp.h"

static void *cuda_handle, *nvml_handle;
static const char *const cuda_names[] = {"libcuda.so.1", NULL};
static const char *const nvml_names[] = {"libnvidia-ml.so.1", NULL};

void *gp_cuda_sym(const char *name) { return gp_lib_sym(&cuda_handle, cuda_names, name); }

void *gp_nvml_sym(const char *name) { return gp_lib_sym(&nvml_handle, nvml_names, name); }
