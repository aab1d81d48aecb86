/* What gpupool's interception libraries share, whatever the vendor: the layouts of the two files they share
 * with the node agent (Python, gpupool/agent/state/hookdir.py) and the GPU server (remote/), and the
 * interface of the modules both libraries are built from. libgpupool_hook.so (CUDA, native/gp.h) and
 * libgpupool_hip.so (HIP, native/hip/gph.h) each add their own modules above these:
 *   gp_sym.c      finding libc's own dlsym and dlvsym, and a vendor library's functions through them
 *   gp_log.c      the log line
 *   gp_config.c   configuration: the agent's limits file, else the environment
 *   gp_shared.c   the pod's shared accounting (usage.v1)
 * Nothing here names a vendor's types or libraries: the HIP library is built from these files without any
 * of CUDA's (native/build.py, hip_sources; tests/native/test_native_layout.py holds it). */
#ifndef GP_CORE_H
#define GP_CORE_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define GP_MAX_DEV 16
#define GP_MAX_SLOTS 256
#define GP_HOSTPIDS 4   /* host PID candidates kept per process (see gp_ident.c) */
#define GP_PPM 1000000LL
#define GP_FILE_NAME "usage.v1"
#define GP_MAGIC 0x314c4f4f50555047ULL /* "GPUPOOL1" little-endian */
#define GP_VERSION 1
/* Bits of gp_shared.features: what this library reads of the file beyond version 1's fields. Added fields
 * live in what was padding (zero in files of older libraries), so GP_VERSION stays 1 and old readers work. */
#define GP_FEAT_SQUEEZE 1ULL /* honours squeeze_ppm (the agent's reclaim squeeze) */
#define GP_FEAT_HOSTPID 2ULL /* publishes the host PIDs of its processes (ident[], after the slots) */
#define GP_FEAT_LIMITS 4ULL  /* takes its limits from the agent's read-only limits file, never from this one */
#define GP_SQUEEZE_MIN_PPM 10000 /* a squeeze below 1 % is taken as 1 %: the pod must keep making progress */

enum gp_mode { GP_HARD = 0, GP_ELASTIC = 1 };

/* The agent's limits file: written by the node agent before the container starts and mounted read-only at
 * a path compiled into the library (GP_LIMITS_PATH), so nothing in the container can redirect, rewrite or
 * remove it. It is the only source of the caps and of where the pod's accounting lives; the process
 * environment may lower a cap, never raise it (gp_config.c reads it). squeeze_ppm is rewritten in place by
 * the agent while the pod runs (8-byte aligned stores).
 * Two programs in two languages read and write these bytes: gpupool/agent/state/hookdir.py writes them with its
 * own offsets, the library and the GPU server read them through this struct. The assertions after it hold
 * the struct to the offsets below, and tests/native/test_limits_layout.py holds the agent's writer to what
 * a compiled reader of this struct sees, so a change on either side fails before a pod runs with its caps
 * read from the wrong bytes. */
#ifndef GP_LIMITS_PATH
#define GP_LIMITS_PATH "/run/gpupool/limits/limits.v1"
#endif
#define GP_LIMITS_MAGIC 0x3154494d494c5047ULL /* "GPLIMIT1" little-endian */
#define GP_LIMITS_VERSION 1
struct gp_limits {
    uint64_t magic;                       /* 0 */
    uint32_t version;                     /* 8 */
    uint32_t ndev;                        /* 12: GPUs of the container with a cap */
    uint64_t limit[GP_MAX_DEV];           /* 16: bytes, 0 = no memory cap */
    uint64_t cores_ppm[GP_MAX_DEV];       /* 144: 1..1000000, 0 or >= 1000000 = no compute cap */
    uint64_t mode;                        /* 272: enum gp_mode */
    uint64_t squeeze_ppm[GP_MAX_DEV];     /* 280: the agent's reclaim squeeze, 0 = none */
    char uuid[GP_MAX_DEV][64];            /* 408: the container's GPUs in order ("" = match by ordinal) */
    char accounting_dir[256];             /* 1432: the writable accounting directory, a container path */
    /* 1688: memory oversubscription, bytes per GPU the pod may allocate beyond its cap (0 = none). Only
     * cuMemAlloc(_v2) spills there, as managed memory kept on the host (gp_mem.c): the GPU's memory the
     * pod uses never exceeds its cap, so the guaranteed shares beside it are untouched. Zero in files of
     * agents before this field (it was padding), so GP_LIMITS_VERSION stays 1. */
    uint64_t oversub[GP_MAX_DEV];
    /* 1816: NVML's smUtil scale on each GPU (smUtil / the busy percent, ppm; 0 = not known), as the agent's
     * validation measured it with a probe alone on the GPU: what the library divides a pod's NVML samples by
     * while other processes share the GPU and the pod has not yet learnt the scale itself (gp_compute.c).
     * Zero in files of agents before this field (it was padding). */
    uint64_t nvml_scale_ppm[GP_MAX_DEV];
    uint8_t pad[2048 - 1688 - 16 * GP_MAX_DEV];
};

/* Every field, offset and size, and the total: see above for why each is pinned, not only a few. */
#define GP_LIMITS_AT(field, offset, size)                                                                   \
    _Static_assert(offsetof(struct gp_limits, field) == (offset) &&                                         \
                       sizeof(((struct gp_limits *)0)->field) == (size),                                    \
                   "limits.v1 is written by the agent at these offsets: change both sides and the version")
GP_LIMITS_AT(magic, 0, 8);
GP_LIMITS_AT(version, 8, 4);
GP_LIMITS_AT(ndev, 12, 4);
GP_LIMITS_AT(limit, 16, 128);
GP_LIMITS_AT(cores_ppm, 144, 128);
GP_LIMITS_AT(mode, 272, 8);
GP_LIMITS_AT(squeeze_ppm, 280, 128);
GP_LIMITS_AT(uuid, 408, 1024);
GP_LIMITS_AT(accounting_dir, 1432, 256);
GP_LIMITS_AT(oversub, 1688, 128);
GP_LIMITS_AT(nvml_scale_ppm, 1816, 128);
GP_LIMITS_AT(pad, 1944, 104);
#undef GP_LIMITS_AT
_Static_assert(sizeof(struct gp_limits) == 2048, "limits.v1 is 2048 bytes: the agent writes exactly that many");
_Static_assert(GP_MAX_DEV == 16, "limits.v1 has 16 entries per array: the agent writes exactly that many");

/* Pod-wide compute state of one GPU, in the shared file (64 bytes; offsets documented for the agent). */
struct gp_devstate {
    int64_t tokens;        /* device-time credit, ns (negative = debt the next launch sleeps off) */
    int64_t refill_at;     /* CLOCK_MONOTONIC ns of the last refill */
    int64_t rate_ppm;      /* device time granted per wall time, parts per million */
    int64_t cost_ns;       /* estimated device time of one launch (measured, averaged) */
    uint64_t launches;     /* launches paced, cumulative */
    uint64_t busy_ns;      /* the pod's device busy time as measured from NVML, cumulative */
    uint64_t charged_ns;   /* estimates charged at launch, cumulative */
    uint64_t others_ns;    /* busy time of other processes on the GPU, cumulative */
};

struct gp_slot {           /* one process of the pod (264 bytes) */
    int64_t pid;           /* 0 = free; liveness is the OFD lock on byte 1 + index, not this pid */
    uint64_t used[GP_MAX_DEV];  /* bytes the process allocated through hooked calls */
    uint64_t ctx[GP_MAX_DEV];   /* bytes NVML reports for the process beyond `used` (contexts) */
};

/* The shared file: the pod's accounting; the agent reads it (gpupool/agent/state/hookdir.py mirrors it). */
struct gp_shared {
    uint64_t magic;                       /* 0 */
    uint32_t version;                     /* 8 */
    uint32_t ndev;                        /* 12 */
    uint64_t limit[GP_MAX_DEV];           /* 16: bytes, 0 = unlimited */
    uint64_t cores_ppm[GP_MAX_DEV];       /* 144 */
    uint64_t mode;                        /* 272 */
    int64_t poller_pid;                   /* 280: the process measuring for the pod */
    int64_t poller_lease;                 /* 288: CLOCK_MONOTONIC ns until which its lease holds */
    uint64_t updated_ns;                  /* 296: CLOCK_REALTIME ns of the last measurement */
    struct gp_devstate dev[GP_MAX_DEV];   /* 304 */
    uint64_t features;                    /* 1328: GP_FEAT_* bits, set by the library when it maps the file */
    /* 1336: written by the node agent while the scheduler squeezes the pod to reclaim compute for another
     * queue: the compute cap (ppm) the pod is lowered to on each GPU, 0 = none. The library enforces
     * min(GPUPOOL_CORES_PERCENT, squeeze), read at every launch, so the agent can lower and lift it at any
     * time without the pod restarting. */
    uint64_t squeeze_ppm[GP_MAX_DEV];
    /* 1464: the sum of the poller's corrections (charged - measured), per GPU: credit or debt beside the
     * token bucket, never clipped by the bucket's burst bound (gp_compute.c) */
    int64_t credit_ns[GP_MAX_DEV];
    /* 1592: the pod's device time measured by the library's own events (gp_compute.c), cumulative (the
     * pod's processes summed), and the end (CLOCK_MONOTONIC ns) of the last span a process counted. */
    uint64_t ev_busy_ns[GP_MAX_DEV];
    int64_t ev_until[GP_MAX_DEV];
    /* 1848: NVML's smUtil scale learnt against the events while the pod ran alone (ppm; 0 = not yet) */
    int64_t scale_ppm[GP_MAX_DEV];
    uint8_t pad[2048 - 1336 - 5 * GP_MAX_DEV * 8];
    struct gp_slot slots[GP_MAX_SLOTS];   /* 2048 */
    /* 69632: the host PIDs NVML knows each slot's process by (a PID namespace hides them from getpid());
     * up to GP_HOSTPIDS candidates when the process could not tell its own apart, 0 = none. */
    struct { int64_t host_pid[GP_HOSTPIDS]; } ident[GP_MAX_SLOTS];
};

struct gp_config {
    int agent;                            /* 1: limits from the agent's file; 0: none (self-imposed env caps) */
    int broken;                           /* the agent's file exists but is unusable: refuse (fail closed) */
    char acct_dir[256];                   /* where the pod's accounting file lives ("" = per process) */
    const struct gp_limits *file;         /* the mapped limits file (read-only), NULL without one */
    int ndev;                             /* values given in the limits (0 = no limits at all) */
    uint64_t limit[GP_MAX_DEV];           /* bytes, 0 = unlimited */
    uint64_t oversub[GP_MAX_DEV];         /* bytes beyond `limit` served from host memory (limits file only) */
    int64_t cores_ppm[GP_MAX_DEV];        /* GP_PPM = unlimited */
    int mode;
    int by_uuid;                          /* NVIDIA_VISIBLE_DEVICES lists UUIDs: match devices by UUID */
    int nuuid;
    char uuid[GP_MAX_DEV][64];
    int poll_ms;
};

#define GP_EXPORT __attribute__((visibility("default")))
/* Lookups run inside sanitizer runtimes' own start-up (they look up the functions they wrap), before their
 * shadow memory exists: the lookup path must not be instrumented. */
#define GP_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

struct gp_hook {
    const char *name;     /* the exported driver/NVML symbol */
    void *wrapper;        /* our function with the same ABI */
    void *real;           /* the driver's, resolved on first cuGetProcAddress */
};

static inline int64_t gp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}


/* The GP_FEAT_* bits a library built from these files sets in the pod's shared file: what it honours of
 * it. The CUDA library honours the squeeze and publishes host PIDs; a library that does neither (the HIP
 * library: memory only) is built with -DGP_LIB_FEATURES=0, so the agent never counts on what it lacks. */
#ifndef GP_LIB_FEATURES
#define GP_LIB_FEATURES (GP_FEAT_SQUEEZE | GP_FEAT_HOSTPID)
#endif

/* gp_sym.c */
typedef void *(*gp_dlsym_fn)(void *, const char *);
typedef void *(*gp_dlvsym_fn)(void *, const char *, const char *);
gp_dlsym_fn gp_real_dlsym(void);      /* libc's, never our wrapper; NULL when it cannot be found */
gp_dlvsym_fn gp_real_dlvsym(void);
/* `name` in the first of `sonames` (a NULL-terminated list) that is loaded, else loads; the handle is kept in
 * *handle. The library's own function, never a wrapper (dlsym of one library's handle, through libc's). */
void *gp_lib_sym(void **handle, const char *const *sonames, const char *name);

/* gp_log.c */
void gp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void gp_log_set_level(int level);      /* 0 = silent */

/* gp_config.c */
extern struct gp_config gp_cfg;        /* valid after gp_init() */
void gp_init(void);

/* gp_shared.c */
struct gp_shared *gp_shm(void);       /* the pod's shared state (private memory when no hook dir) */
int gp_slot_index(void);
int gp_mem_reserve(int li, uint64_t bytes);   /* 0 = reserved, -1 = over the cap */
int gp_mem_reserve_over(int li, uint64_t bytes); /* the same within cap + oversubscription */
void gp_mem_release(int li, uint64_t bytes);
void gp_mem_adjust(int li, int64_t delta);    /* pool growth measured after the fact */
uint64_t gp_pod_used(int li);
uint64_t gp_own_used(int li, uint64_t *changes); /* and how often it changed so far */
void gp_set_ctx_bytes(int li, uint64_t bytes);
int gp_pod_pids(int64_t *pids, int max);       /* host PIDs of the pod's live processes */
int gp_has_slot(void);                 /* 0: past the slot table (refuse, never run uncounted) */
void gp_set_host_pids(const int64_t *pids, int n);
int gp_own_host_pids(int64_t *pids);   /* this process's host PIDs (candidates), 0 when not identified */
void gp_shared_after_fork(void);
void gp_ident_lock(int on);            /* serialises context creation across the pod's processes */
int64_t gp_cap_ppm(int li);            /* the compute cap in force: the environment's, lowered by a squeeze */

#endif
