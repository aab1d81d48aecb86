/* Compute by CU masks: every HSA queue of the process runs on the compute units the agent gave the container
 * (cu_masks.v1, gph.h), and nothing the tenant asks for widens that.
 *
 * Where the mask goes on. HIP runs all of a process's GPU work (kernels, copies, the null stream's and every
 * other stream's) through HSA queues, and creates each of them with hsa_queue_create (libhsa-runtime64.so.1);
 * a queue's CU mask (hsa_amd_queue_cu_set_mask) decides which CUs the command processor may send its work
 * to. So the library wraps hsa_queue_create and sets the container's mask on every queue before handing it
 * out; a queue the mask cannot be set on is destroyed and refused (fail closed, one log line), never used
 * unmasked. What the tenant can ask for afterwards is intersected with the container's mask:
 *   - hsa_amd_queue_cu_set_mask: the request AND the container's mask, answered HSA_STATUS_CU_MASK_REDUCED
 *     when that took any CU away (the status the runtime gives for CUs disabled for the process); a count of
 *     0 ("all CUs") gets the container's mask. A request left with no CU of the container is refused with
 *     HSA_STATUS_ERROR_INVALID_ARGUMENT and the queue keeps its mask (an empty mask would hang the queue).
 *   - hipExtStreamCreateWithCUMask: the same intersection before HIP sees the mask (HIP sets it through
 *     hsa_amd_queue_cu_set_mask anyway; this keeps HIP's own record of the stream's mask truthful), and
 *     hipExtStreamGetCUMask answers with what the stream can really use.
 *   - HSA_CU_MASK and ROC_GLOBAL_CU_MASK need nothing: the HSA runtime ANDs HSA_CU_MASK into every mask it
 *     sets, and HIP applies ROC_GLOBAL_CU_MASK through hsa_amd_queue_cu_set_mask, which lands here.
 * Lookups of these names by dlsym / dlvsym / hipGetProcAddress answer with the wrappers (gph_lookup.c).
 *
 * Which mask: the queue's agent is matched to the file's entries by its ordinal among the GPU agents
 * (hsa_iterate_agents), the order limits.v1 and the container's devices share. The entry must describe the
 * agent's card: its ncu must equal the agent's HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT, else the queue is
 * refused (a mask for another card would mean other CUs). Without the file, or for a GPU whose entry has
 * ncu 0 or lies beyond the file's devices, queues are left alone (memory cap only, as before). A file that is
 * there but cannot be read or is garbled refuses every GPU queue.
 *
 * The file is read once per process, at its first queue: a mask the agent narrows while the process runs
 * applies to processes started after it, not to queues already made (docs/hook-hip.md, "Squeeze"). */
#include "gph.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CU_NONE = 0, CU_MASKS = 1, CU_BROKEN = -1 };
static int cu_state;
static struct gph_cu_file cu_file;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static const char *check_file(const struct gph_cu_file *f) {
    if (f->magic != GPH_CU_MAGIC || f->version != 1) return "is not a version 1 CU mask file";
    if (f->ndev > GP_MAX_DEV) return "names more than 16 devices";
    for (uint32_t d = 0; d < f->ndev; d++) {
        const struct gph_cu_entry *e = &f->dev[d];
        if (e->reserved != 0 || e->ncu > GPH_CU_MAX) return "has an entry out of range";
        int any = 0;
        for (uint32_t w = 0; w < GPH_CU_WORDS; w++) {
            uint32_t below = e->ncu >= 32 * (w + 1) ? 0xFFFFFFFFu
                             : e->ncu > 32 * w      ? (1u << (e->ncu - 32 * w)) - 1
                                                    : 0;
            if (e->bits[w] & ~below) return "sets a CU beyond its card's count";
            any |= e->bits[w] != 0;
        }
        if (e->ncu != 0 && !any) return "gives a device no CU at all";
    }
    return NULL;
}

/* ROCR_VISIBLE_DEVICES makes the HSA runtime hide or reorder the container's GPUs (it reads the variable at
 * hsa_init), and the masks are matched to GPUs by their order: with it, one card's mask would land on another
 * card, where its CUs may be a neighbour's, and a card without its own entry would run unmasked. So with masks
 * for a container of several GPUs, the variable refuses every queue. It is looked at when the library is
 * loaded (the environment the program was started with) and again at the first queue; a program that sets
 * it after the one and unsets it before the other is not caught (docs/hook-hip.md). With one GPU the variable
 * can only keep or hide that GPU. */
static int rocr_at_start;
__attribute__((constructor)) static void gph_cu_note_environment(void) {
    rocr_at_start = getenv("ROCR_VISIBLE_DEVICES") != NULL;
}

static int masks_several_gpus(const struct gph_cu_file *f) {
    if (f->ndev < 2) return 0;
    for (uint32_t d = 0; d < f->ndev; d++)
        if (f->dev[d].ncu != 0) return 1;
    return 0;
}

static void load(void) {
    int fd = open(GPH_CU_MASKS_PATH, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return; /* no masks granted: queues are left alone */
    const char *why = NULL;
    struct stat st;
    if (fd < 0) why = "cannot be opened";
    else if (fstat(fd, &st) != 0 || st.st_size != (off_t)sizeof cu_file) why = "is not 2192 bytes";
    else if (pread(fd, &cu_file, sizeof cu_file, 0) != (ssize_t)sizeof cu_file) why = "cannot be read";
    else why = check_file(&cu_file);
    int reordered = rocr_at_start || getenv("ROCR_VISIBLE_DEVICES") != NULL;
    if (why == NULL && reordered && masks_several_gpus(&cu_file))
        why = "masks several GPUs by their order, which ROCR_VISIBLE_DEVICES changes (use HIP_VISIBLE_DEVICES)";
    if (fd >= 0) close(fd);
    if (why != NULL) {
        gp_log("the pod's CU mask file %s %s: every GPU queue is refused", GPH_CU_MASKS_PATH, why);
        cu_state = CU_BROKEN;
        return;
    }
    cu_state = CU_MASKS;
}

static int state(void) {
    pthread_once(&cu_once, load);
    return cu_state;
}

static const struct gph_cu_entry *entry(int dev) {
    if (dev < 0 || (uint32_t)dev >= cu_file.ndev || cu_file.dev[dev].ncu == 0) return NULL;
    return &cu_file.dev[dev];
}

static uint32_t words_of(const struct gph_cu_entry *e) { return (e->ncu + 31) / 32; }

/* ---- the queues this process holds: queue -> device ------------------------------------------------- */
#define MAX_QUEUES 1024
static struct {
    const hsa_queue_t *q;
    int dev;
} queues[MAX_QUEUES];
static pthread_mutex_t queues_mu = PTHREAD_MUTEX_INITIALIZER;

static int remember(const hsa_queue_t *q, int dev) {
    int ok = 0;
    pthread_mutex_lock(&queues_mu);
    for (int i = 0; i < MAX_QUEUES && !ok; i++)
        if (queues[i].q == NULL) queues[i].q = q, queues[i].dev = dev, ok = 1;
    pthread_mutex_unlock(&queues_mu);
    return ok;
}

/* The device of a queue made through the wrapper; -1 for one it never saw. */
static int device_of(const hsa_queue_t *q, int forget) {
    int dev = -1;
    pthread_mutex_lock(&queues_mu);
    for (int i = 0; i < MAX_QUEUES && dev < 0; i++) {
        if (q == NULL || queues[i].q != q) continue;
        dev = queues[i].dev;
        if (forget) queues[i].q = NULL;
    }
    pthread_mutex_unlock(&queues_mu);
    return dev;
}

/* ---- which GPU an agent is ------------------------------------------------------------------------------ */
typedef hsa_status_t (*get_info_fn)(hsa_agent_t, int, void *);
struct agent_search {
    get_info_fn info;
    uint64_t target;
    int ordinal;
    int found;
};

static hsa_status_t visit(hsa_agent_t agent, void *data) {
    struct agent_search *s = data;
    uint32_t type = 0;
    if (s->info(agent, HSA_AGENT_INFO_DEVICE, &type) != HSA_STATUS_SUCCESS || type != HSA_DEVICE_TYPE_GPU)
        return HSA_STATUS_SUCCESS;
    if (agent.handle == s->target) {
        s->found = 1;
        return HSA_STATUS_INFO_BREAK;
    }
    s->ordinal++;
    return HSA_STATUS_SUCCESS;
}

/* The agent's ordinal among the GPU agents: -1 for an agent that is no GPU, -2 when HSA cannot say. */
static int gpu_ordinal(hsa_agent_t agent) {
    GPH_REAL_HSA(hsa_status_t (*)(hsa_status_t (*)(hsa_agent_t, void *), void *), iterate, "hsa_iterate_agents");
    GPH_REAL_HSA(get_info_fn, info, "hsa_agent_get_info");
    if (iterate == NULL || info == NULL) return -2;
    struct agent_search s = {info, agent.handle, 0, 0};
    hsa_status_t r = iterate(visit, &s);
    if (r != HSA_STATUS_SUCCESS && r != HSA_STATUS_INFO_BREAK) return -2;
    return s.found ? s.ordinal : -1;
}

/* The mask a new queue on `agent` must get (NULL: none) and, under a mask file, its GPU (*dev; -1 for an agent
 * that is no GPU, or without a file); *refuse says why the queue must be refused instead. */
static const struct gph_cu_entry *mask_for(hsa_agent_t agent, int *dev, const char **refuse) {
    *dev = -1;
    *refuse = NULL;
    int st = state();
    if (st == CU_NONE) return NULL;
    int ordinal = gpu_ordinal(agent);
    if (ordinal == -1) return NULL; /* not a GPU: no CUs to mask */
    if (st == CU_BROKEN) {
        *refuse = "the CU mask file is unusable";
        return NULL;
    }
    if (ordinal < 0) {
        *refuse = "the HSA runtime cannot say which GPU the queue is on";
        return NULL;
    }
    *dev = ordinal;
    const struct gph_cu_entry *e = entry(ordinal);
    if (e == NULL) return NULL;
    GPH_REAL_HSA(get_info_fn, info, "hsa_agent_get_info");
    uint32_t cus = 0;
    if (info == NULL || info(agent, HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT, &cus) != HSA_STATUS_SUCCESS ||
        cus != e->ncu) {
        *refuse = "the GPU's CU count is not the one its mask was made for";
        return NULL;
    }
    return e;
}

/* ---- the wrappers ------------------------------------------------------------------------------------- */
typedef hsa_status_t (*set_mask_fn)(const hsa_queue_t *, uint32_t, const uint32_t *);

GP_EXPORT hsa_status_t hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type,
                                        hsa_queue_callback callback, void *data, uint32_t private_segment_size,
                                        uint32_t group_segment_size, hsa_queue_t **queue) {
    GPH_REAL_HSA(hsa_status_t (*)(hsa_agent_t, uint32_t, hsa_queue_type32_t, hsa_queue_callback, void *, uint32_t,
                                  uint32_t, hsa_queue_t **),
                 real, "hsa_queue_create");
    GPH_REAL_HSA(set_mask_fn, set_mask, "hsa_amd_queue_cu_set_mask");
    GPH_REAL_HSA(hsa_status_t (*)(hsa_queue_t *), destroy, "hsa_queue_destroy");
    if (real == NULL) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    int dev;
    const char *refuse;
    const struct gph_cu_entry *e = mask_for(agent, &dev, &refuse);
    if (refuse != NULL) {
        gp_log("a GPU queue is refused: %s", refuse);
        return HSA_STATUS_ERROR_INVALID_QUEUE_CREATION;
    }
    hsa_status_t r = real(agent, size, type, callback, data, private_segment_size, group_segment_size, queue);
    if (r != HSA_STATUS_SUCCESS || dev < 0 || queue == NULL || *queue == NULL) return r;
    /* Every GPU queue is remembered under a mask file, masked or not, so that a later set_mask knows it. */
    hsa_status_t m = e == NULL ? HSA_STATUS_SUCCESS
                     : set_mask != NULL ? set_mask(*queue, 32 * words_of(e), e->bits)
                                        : HSA_STATUS_ERROR;
    if ((m != HSA_STATUS_SUCCESS && m != HSA_STATUS_CU_MASK_REDUCED) || !remember(*queue, dev)) {
        gp_log("a queue on GPU %d is refused: its CU mask could not be set (HSA status %#x)", dev, (unsigned)m);
        if (destroy != NULL) destroy(*queue);
        *queue = NULL;
        return HSA_STATUS_ERROR_INVALID_QUEUE_CREATION;
    }
    return r;
}

GP_EXPORT hsa_status_t hsa_queue_destroy(hsa_queue_t *queue) {
    GPH_REAL_HSA(hsa_status_t (*)(hsa_queue_t *), real, "hsa_queue_destroy");
    if (real == NULL) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    hsa_status_t r = real(queue);
    if (r == HSA_STATUS_SUCCESS && state() == CU_MASKS) device_of(queue, 1); /* only then were any remembered */
    return r;
}

GP_EXPORT hsa_status_t hsa_amd_queue_cu_set_mask(const hsa_queue_t *queue, uint32_t num_cu_mask_count,
                                                 const uint32_t *cu_mask) {
    GPH_REAL_HSA(set_mask_fn, real, "hsa_amd_queue_cu_set_mask");
    if (real == NULL) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    int st = state();
    if (st == CU_NONE) return real(queue, num_cu_mask_count, cu_mask);
    int dev = device_of(queue, 0);
    if (dev < 0) {
        /* Every GPU queue of a process under masks is made by the wrapper above: one it never saw is none of
         * them (or not a queue at all), and nothing says which CUs it may have. */
        gp_log("a CU mask is refused for a queue the library did not make");
        return HSA_STATUS_ERROR_INVALID_QUEUE;
    }
    const struct gph_cu_entry *e = entry(dev);
    if (e == NULL) return real(queue, num_cu_mask_count, cu_mask);
    /* The runtime's own argument checks first, so the tenant sees the documented errors. */
    if (num_cu_mask_count % 32 != 0 || (num_cu_mask_count != 0 && cu_mask == NULL))
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    uint32_t out[GPH_CU_WORDS] = {0}, n = words_of(e), asked = num_cu_mask_count / 32;
    int reduced = 0, any = 0;
    for (uint32_t w = 0; w < n; w++) {
        uint32_t want = num_cu_mask_count == 0 ? 0xFFFFFFFFu : w < asked ? cu_mask[w] : 0;
        if (num_cu_mask_count == 0 && w == n - 1 && e->ncu % 32) want &= (1u << (e->ncu % 32)) - 1;
        out[w] = want & e->bits[w];
        reduced |= (want & ~e->bits[w]) != 0;
        any |= out[w] != 0;
    }
    for (uint32_t w = n; w < asked; w++) reduced |= cu_mask[w] != 0;
    if (!any) {
        gp_log("a CU mask naming none of the container's CUs on GPU %d is refused; the queue keeps its mask", dev);
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
    hsa_status_t r = real(queue, 32 * n, out);
    return r == HSA_STATUS_SUCCESS && reduced ? HSA_STATUS_CU_MASK_REDUCED : r;
}

/* The HIP device a stream is on (the current one when HIP cannot say). */
static int stream_device(hipStream_t stream) {
    GPH_REAL(hipError_t (*)(hipStream_t, int *), of_stream, "hipStreamGetDevice");
    GPH_REAL(hipError_t (*)(int *), current, "hipGetDevice");
    int d = -1;
    if (stream != NULL && of_stream != NULL && of_stream(stream, &d) == hipSuccess) return d;
    if (current == NULL || current(&d) != hipSuccess) return -1;
    return d;
}

GP_EXPORT hipError_t hipExtStreamCreateWithCUMask(hipStream_t *stream, uint32_t cuMaskSize, const uint32_t *cuMask) {
    GPH_REAL(hipError_t (*)(hipStream_t *, uint32_t, const uint32_t *), real, "hipExtStreamCreateWithCUMask");
    if (real == NULL) return hipErrorNotInitialized;
    if (state() == CU_NONE || cuMask == NULL || cuMaskSize == 0) return real(stream, cuMaskSize, cuMask);
    if (state() == CU_BROKEN) return hipErrorOutOfMemory; /* as HIP answers a queue it could not create */
    const struct gph_cu_entry *e = entry(stream_device(NULL));
    if (e == NULL) return real(stream, cuMaskSize, cuMask);
    uint32_t out[GPH_CU_WORDS] = {0}, n = words_of(e);
    int any = 0;
    for (uint32_t w = 0; w < n && w < cuMaskSize; w++) any |= (out[w] = cuMask[w] & e->bits[w]) != 0;
    if (!any) {
        gp_log("a stream's CU mask naming none of the container's CUs is refused");
        return hipErrorInvalidValue;
    }
    return real(stream, n, out);
}

GP_EXPORT hipError_t hipExtStreamGetCUMask(hipStream_t stream, uint32_t cuMaskSize, uint32_t *cuMask) {
    GPH_REAL(hipError_t (*)(hipStream_t, uint32_t, uint32_t *), real, "hipExtStreamGetCUMask");
    if (real == NULL) return hipErrorNotInitialized;
    hipError_t r = real(stream, cuMaskSize, cuMask);
    if (r != hipSuccess || cuMask == NULL || state() != CU_MASKS) return r;
    const struct gph_cu_entry *e = entry(stream_device(stream));
    for (uint32_t w = 0; e != NULL && w < cuMaskSize; w++) cuMask[w] &= w < GPH_CU_WORDS ? e->bits[w] : 0;
    return r;
}

void gph_cu_after_fork(void) {
    /* HSA queues do not survive fork: the child holds none of its parent's. */
    pthread_mutex_init(&queues_mu, NULL);
    memset(queues, 0, sizeof queues);
}

struct gp_hook gph_cu_hooks[] = {
#define H(n) {#n, (void *)n, NULL},
    H(hsa_queue_create) H(hsa_queue_destroy) H(hsa_amd_queue_cu_set_mask) H(hipExtStreamCreateWithCUMask)
    H(hipExtStreamGetCUMask)
#undef H
    {NULL, NULL, NULL},
};
