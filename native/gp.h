/* Internal interface between the modules of libgpupool_hook.so, the CUDA interception library. The layouts
 * of the two files it shares with the node agent and the GPU server (limits.v1, usage.v1) and the modules
 * it shares with the HIP library (native/hip/) are in gp_core.h, which this header includes.
 *
 * The modules, each one concern, lowest layer first; a module calls only into the layers below it
 * (tests/native/test_native_layout.py holds that order and fails on any call or include against it):
 *   gp_sym.c      finding the real libc functions, and a vendor library's through them (gp_core.h)
 *   gp_log.c      the log line (gp_core.h)
 *   gp_driver.c   finding the driver's and NVML's own functions
 *   gp_config.c   configuration: the agent's limits file, else the environment (gp_core.h)
 *   gp_device.c   which of the limits a CUDA device is held to
 *   gp_shared.c   the pod's shared accounting (usage.v1) (gp_core.h)
 *   gp_nvml.c     NVML access, and the memory queries answered with the pod's share
 *   gp_ident.c    which host PID NVML knows this process by
 *   gp_mem.c      the memory cap
 *   gp_compute.c  compute pacing
 *   gp_lookup.c   the program's lookups (dlsym, cuGetProcAddress) answered with every module's wrappers
 *   gp_fork.c     a forked child starting every module afresh
 * Only the last two know every module: what sits in one list of all of them belongs there, so no module
 * below has to call back up (which made a circle of six files before). */
#ifndef GP_H
#define GP_H

#include "gp_core.h"
#include "gpupool_cuda.h"

/* gp_driver.c */
void *gp_cuda_sym(const char *name);  /* the driver's own function, never our wrapper */
void *gp_nvml_sym(const char *name);

/* gp_device.c */
int gp_device_index(CUdevice dev);    /* limit index of a CUDA ordinal, -1 = not limited */
int gp_current_index(void);           /* limit index of the current context's device */

/* gp_nvml.c */
extern struct gp_hook gp_nvml_hooks[];
nvmlDevice_t gp_nvml_device(int li);
int gp_nvml_index(nvmlDevice_t dev);
void gp_refresh_ctx(int li);

/* gp_ident.c */
extern struct gp_hook gp_ident_hooks[];
void gp_ident_after_fork(void);

/* gp_mem.c */
extern struct gp_hook gp_mem_hooks[];
void gp_mem_after_fork(void);

/* gp_compute.c
 * GPUPOOL_DEBUG_NVML_TRACE=<path>: the process appends what its poller reads to that file (O_APPEND, one
 * write per line, at most 64 MiB in all; it only ever writes, nothing in it is read back), for
 * benchmarks/isolation_gpu.py. Lines starting with '#' are comments (one header line per process). Fields,
 * whitespace-separated:
 *   t_ns pid ts_us sm_util pod charged_ns      one NVML per-process sample, read by the pod's poller:
 *       t_ns CLOCK_MONOTONIC when read; pid the sample's host PID; ts_us its timeStamp; sm_util its smUtil;
 *       pod 1 if the PID is one of the pod's; charged_ns the pod's cumulative charge on that GPU then
 *   E t_ns li start_ns end_ns added_ns          one span of the process's work measured by its own events:
 *       t_ns when read; li the GPU's index in the limits; [start_ns, end_ns] CLOCK_MONOTONIC, the span
 *       from max(the previous event's completion, the first launch after it) to the event's completion;
 *       added_ns what it added to the pod's event-measured busy time (overlap with the process's own
 *       earlier spans counted once; the pod's processes are summed)
 *   S t_ns li scale_ppm solo pod_ns f truth_ns solo_ns prov_ns tokens_ns credit_ns
 *       one measurement of the pod's poller: the smUtil scale in use (ppm), whether the pod is solo on the
 *       GPU (1) or shares it (0), the busy time this measurement counted (pod_ns = truth_ns + solo_ns + the
 *       change of prov_ns), f, the part from NVML's samples (truth_ns), from the events while solo
 *       (solo_ns), the provisional part for shared time NVML does not cover yet (prov_ns), and the pod's
 *       bucket before this measurement's correction: its tokens and the credit kept beside them (a launch
 *       waits while their sum is below zero) */
extern struct gp_hook gp_compute_hooks[];
void gp_compute_after_fork(void);

/* Resolve the real driver function once; the cache is a plain pointer (racing writers store the same). */
#define GP_REAL(type, var, name)                                                   \
    static __typeof__(type) var;                                                   \
    do {                                                                           \
        if (__atomic_load_n(&var, __ATOMIC_ACQUIRE) == NULL)                       \
            __atomic_store_n(&var, (type)gp_cuda_sym(name), __ATOMIC_RELEASE);     \
    } while (0)

#endif
