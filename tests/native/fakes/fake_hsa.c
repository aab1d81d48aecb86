/* A fake HSA runtime (libhsa-runtime64.so.1) for the HIP library's CU mask tests, written from the HSA runtime's
 * reference (hsa.h, hsa_ext_amd.h) and ROCm's "Setting the number of CUs": agents, queues, CU masks, and a
 * simulated device on which a kernel's time depends on the CUs its queue may use.
 *
 * Behaviour (what the tests rely on):
 * - agents: one CPU agent first, then FAKE_HIP_DEVICES GPU agents (default 1, at most 8), in the order
 *   hsa_iterate_agents visits them. hsa_agent_get_info answers HSA_AGENT_INFO_DEVICE and
 *   HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT (FAKE_HSA_CUS, default 304: an MI300X; 0 for the CPU), anything
 *   else HSA_STATUS_ERROR_INVALID_ARGUMENT. Every call but hsa_init before hsa_init answers
 *   HSA_STATUS_ERROR_NOT_INITIALIZED.
 * - hsa_queue_create: HSA_STATUS_ERROR_INVALID_ARGUMENT for a NULL queue, a size 0 or not a power of two, or a
 *   type other than MULTI (0), SINGLE (1) or COOPERATIVE (2); HSA_STATUS_ERROR_INVALID_AGENT for an unknown
 *   agent; HSA_STATUS_ERROR_INVALID_QUEUE_CREATION on the CPU agent; at most 128 queues per GPU
 *   (HSA_STATUS_ERROR_OUT_OF_RESOURCES). A new queue's mask is the GPU's HSA_CU_MASK, else every CU.
 * - hsa_amd_queue_cu_set_mask (the reference, and the runtime's documented handling): the count is in bits,
 *   a multiple of 32 (else HSA_STATUS_ERROR_INVALID_ARGUMENT, as is a count > 0 with a NULL mask); a count of
 *   0 asks for every CU. The mask is cut to the card's CUs: dwords beyond them and bits past the last CU are
 *   dropped, silently. With HSA_CU_MASK set for the GPU the mask is ANDed with it, and any requested CU it
 *   removes (a bit beyond the card included) makes the answer HSA_STATUS_CU_MASK_REDUCED; the mask is still
 *   set. A mask left with no CU is set as it is (the queue's work then never finishes). An unknown queue is
 *   HSA_STATUS_ERROR_INVALID_QUEUE.
 * - hsa_amd_queue_cu_get_mask: the first count bits of the queue's mask, zero beyond it; a count of 0, not a
 *   multiple of 32, or a NULL mask is HSA_STATUS_ERROR_INVALID_ARGUMENT.
 * - HSA_CU_MASK: parsed once at hsa_init by fake_hsa.h's parser (the documented syntax).
 * - kernels (fakehsa_dispatch): W CU-microseconds of work on a queue whose mask holds the CUs M of the card
 *   take, on the simulated device's clock, W / |M| (FAKE_HSA_DISPATCH=cu, the default: work spreads over the
 *   queue's CUs wherever they are). What the reference leaves open is a parameter:
 *     FAKE_HSA_XCCS (default 8) and FAKE_HSA_CU_LAYOUT: which XCC CU j belongs to, j % XCCS ("interleaved",
 *     the default) or j / (CUS / XCCS) ("blocked");
 *     FAKE_HSA_DISPATCH=xcc: the work is split evenly over the XCCs, each XCC's part runs on that XCC's CUs
 *     of the mask, and the kernel ends with the slowest part (an XCC with no CU of the mask never finishes
 *     its part: the dispatch fails).
 *   Each CU is busy until the kernel it runs ends: a kernel starts when its queue's previous kernel has ended
 *   and every CU of its mask is free, so queues with overlapping masks share those CUs and queues with
 *   disjoint masks do not meet. The clock is simulated (never the wall clock): FAKE_HSA_STATE names the file
 *   holding each CU's busy-until time, shared by a test's processes (unset: each process has its own device).
 * - FAKE_HSA_LOG, when set, gets one line per event, appended (the tests' view of the device):
 *     queue PID DEV QID HEX        a queue made, with its mask
 *     mask PID DEV QID STATUS HEX  a set_mask call, its answer, and the queue's mask after it
 *     dispatch PID DEV QID WORK START END NCU HEX   a kernel: work (CU-us), simulated ns, the CUs it ran on
 *     hang PID DEV QID WORK HEX    a kernel that could not run
 *   HEX: the mask's dwords for the card, lowest first, as 8 hex digits each. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_hsa.h"
#include "fake_shm.h"

#define FK_GPUS 8
#define FK_QUEUES 128
#define CPU_HANDLE 0x4350550000ULL
#define GPU_HANDLE 0x4750550000ULL
#define FK_MAGIC 0x41534846414b4bULL /* "KKAFHSA" */

struct fk_dev_state {
    int64_t busy_until[32 * FAKE_CU_WORDS]; /* per CU, simulated ns */
};
struct fk_state {
    uint64_t magic;
    struct fk_dev_state dev[FK_GPUS];
};

struct fk_queue {
    hsa_queue_t pub; /* first: the pointer handed out is the queue's */
    int live;
    int dev;
    uint32_t mask[FAKE_CU_WORDS];
    int64_t clock; /* when its last kernel ends */
};

static int inits;
static int ngpu = 1, ncu = 304, nxcc = 8, blocked, per_xcc;
static uint32_t global_mask[FAKE_MAX_GPUS][FAKE_CU_WORDS];
static int has_global[FAKE_MAX_GPUS];
static struct fk_queue queues[FK_GPUS][FK_QUEUES];
static uint64_t next_id = 1;
static struct fk_state *st;
static int st_fd = -1, log_fd = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v != NULL && *v ? atoi(v) : fallback;
}

static void map_state(void) {
    st = fk_map_shared(getenv("FAKE_HSA_STATE"), sizeof *st, FK_MAGIC, &st_fd);
}

static uint32_t words(void) { return (uint32_t)(ncu + 31) / 32; }

static void card_mask(uint32_t *m) {
    memset(m, 0, sizeof(uint32_t) * FAKE_CU_WORDS);
    for (int c = 0; c < ncu; c++) m[c / 32] |= 1u << (c % 32);
}

static void log_line(const char *head, const uint32_t *mask) {
    if (log_fd < 0) return;
    char line[512];
    int n = snprintf(line, sizeof line, "%s", head);
    for (uint32_t w = 0; w < words() && n < (int)sizeof line - 10; w++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %08x", mask[w]);
    n += snprintf(line + n, sizeof line - (size_t)n, "\n");
    if (write(log_fd, line, (size_t)n) < 0) return;
}

hsa_status_t hsa_init(void) {
    pthread_mutex_lock(&mu);
    if (inits++ == 0 && st == NULL) {
        ngpu = env_int("FAKE_HIP_DEVICES", 1);
        ngpu = ngpu < 1 ? 1 : ngpu > FK_GPUS ? FK_GPUS : ngpu;
        ncu = env_int("FAKE_HSA_CUS", 304);
        ncu = ncu < 1 ? 1 : ncu > 32 * FAKE_CU_WORDS ? 32 * FAKE_CU_WORDS : ncu;
        nxcc = env_int("FAKE_HSA_XCCS", 8);
        nxcc = nxcc < 1 || nxcc > ncu ? 1 : nxcc;
        const char *layout = getenv("FAKE_HSA_CU_LAYOUT"), *dispatch = getenv("FAKE_HSA_DISPATCH");
        blocked = layout != NULL && strcmp(layout, "blocked") == 0;
        per_xcc = dispatch != NULL && strcmp(dispatch, "xcc") == 0;
        const char *env = getenv("HSA_CU_MASK");
        if (env != NULL) fake_cu_parse(env, global_mask, has_global);
        uint32_t card[FAKE_CU_WORDS];
        card_mask(card);
        for (int g = 0; g < FAKE_MAX_GPUS; g++)
            for (int w = 0; w < FAKE_CU_WORDS; w++) global_mask[g][w] &= card[w];
        const char *log = getenv("FAKE_HSA_LOG");
        if (log != NULL && *log) log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
        map_state();
    }
    pthread_mutex_unlock(&mu);
    return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_shut_down(void) {
    pthread_mutex_lock(&mu);
    hsa_status_t r = inits > 0 ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (inits > 0) inits--;
    pthread_mutex_unlock(&mu);
    return r;
}

static int open_(void) {
    pthread_mutex_lock(&mu);
    int on = inits > 0;
    pthread_mutex_unlock(&mu);
    return on;
}

/* -1: the CPU agent; 0..ngpu-1: a GPU; -2: no agent of this runtime */
static int agent_index(hsa_agent_t a) {
    if (a.handle == CPU_HANDLE) return -1;
    if (a.handle >= GPU_HANDLE && a.handle < GPU_HANDLE + (uint64_t)ngpu) return (int)(a.handle - GPU_HANDLE);
    return -2;
}

hsa_status_t hsa_iterate_agents(hsa_status_t (*callback)(hsa_agent_t, void *), void *data) {
    if (!open_()) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (callback == NULL) return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    hsa_agent_t a = {CPU_HANDLE};
    hsa_status_t r = callback(a, data);
    for (int g = 0; g < ngpu && r == HSA_STATUS_SUCCESS; g++) {
        a.handle = GPU_HANDLE + (uint64_t)g;
        r = callback(a, data);
    }
    return r; /* a callback's other status ends the walk and is the answer (HSA_STATUS_INFO_BREAK included) */
}

hsa_status_t hsa_agent_get_info(hsa_agent_t agent, int attribute, void *value) {
    if (!open_()) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    int g = agent_index(agent);
    if (g == -2) return HSA_STATUS_ERROR_INVALID_AGENT;
    if (value == NULL) return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    if (attribute == HSA_AGENT_INFO_DEVICE) {
        *(uint32_t *)value = g >= 0 ? HSA_DEVICE_TYPE_GPU : 0;
        return HSA_STATUS_SUCCESS;
    }
    if (attribute == HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT) {
        *(uint32_t *)value = g >= 0 ? (uint32_t)ncu : 0;
        return HSA_STATUS_SUCCESS;
    }
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
}

static void describe(char *buf, size_t n, const char *what, const struct fk_queue *q) {
    snprintf(buf, n, "%s %d %d %llu", what, (int)getpid(), q->dev, (unsigned long long)q->pub.id);
}

hsa_status_t hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type, hsa_queue_callback callback,
                              void *data, uint32_t private_segment_size, uint32_t group_segment_size,
                              hsa_queue_t **queue) {
    (void)callback, (void)data, (void)private_segment_size, (void)group_segment_size;
    if (!open_()) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (queue == NULL || size == 0 || (size & (size - 1)) != 0 || type > 2) return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    int g = agent_index(agent);
    if (g == -2) return HSA_STATUS_ERROR_INVALID_AGENT;
    if (g == -1) return HSA_STATUS_ERROR_INVALID_QUEUE_CREATION;
    pthread_mutex_lock(&mu);
    struct fk_queue *q = NULL;
    for (int i = 0; i < FK_QUEUES && q == NULL; i++)
        if (!queues[g][i].live) q = &queues[g][i];
    if (q == NULL) {
        pthread_mutex_unlock(&mu);
        return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
    }
    memset(q, 0, sizeof *q);
    q->live = 1;
    q->dev = g;
    q->pub.type = type;
    q->pub.size = size;
    q->pub.id = ((uint64_t)getpid() << 20) | next_id++;
    if (has_global[g]) memcpy(q->mask, global_mask[g], sizeof q->mask);
    else card_mask(q->mask);
    char head[128];
    describe(head, sizeof head, "queue", q);
    log_line(head, q->mask);
    pthread_mutex_unlock(&mu);
    *queue = &q->pub;
    return HSA_STATUS_SUCCESS;
}

/* With mu held: the live queue at q, or NULL. */
static struct fk_queue *find(const hsa_queue_t *q) {
    for (int g = 0; g < ngpu; g++)
        for (int i = 0; i < FK_QUEUES; i++)
            if (queues[g][i].live && &queues[g][i].pub == q) return &queues[g][i];
    return NULL;
}

hsa_status_t hsa_queue_destroy(hsa_queue_t *queue) {
    if (!open_()) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&mu);
    struct fk_queue *q = find(queue);
    if (q != NULL) q->live = 0;
    pthread_mutex_unlock(&mu);
    return q != NULL ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR_INVALID_QUEUE;
}

hsa_status_t hsa_amd_queue_cu_set_mask(const hsa_queue_t *queue, uint32_t num_cu_mask_count, const uint32_t *cu_mask) {
    if (!open_()) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (num_cu_mask_count % 32 != 0 || (num_cu_mask_count != 0 && cu_mask == NULL))
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    struct fk_queue *q = find(queue);
    if (q == NULL) {
        pthread_mutex_unlock(&mu);
        return HSA_STATUS_ERROR_INVALID_QUEUE;
    }
    uint32_t card[FAKE_CU_WORDS], out[FAKE_CU_WORDS] = {0};
    card_mask(card);
    uint32_t given = num_cu_mask_count / 32;
    int reduced = 0;
    for (uint32_t w = 0; w < FAKE_CU_WORDS; w++) {
        uint32_t want = num_cu_mask_count == 0 ? card[w] : w < given ? cu_mask[w] : 0;
        if (has_global[q->dev]) reduced |= (want & ~global_mask[q->dev][w]) != 0;
        out[w] = want & card[w] & (has_global[q->dev] ? global_mask[q->dev][w] : 0xFFFFFFFFu);
    }
    for (uint32_t w = FAKE_CU_WORDS; has_global[q->dev] && w < given; w++) reduced |= cu_mask[w] != 0;
    memcpy(q->mask, out, sizeof out);
    hsa_status_t r = reduced ? HSA_STATUS_CU_MASK_REDUCED : HSA_STATUS_SUCCESS;
    char head[160];
    describe(head, sizeof head, "mask", q);
    snprintf(head + strlen(head), sizeof head - strlen(head), " %d", (int)r);
    log_line(head, q->mask);
    pthread_mutex_unlock(&mu);
    return r;
}

hsa_status_t hsa_amd_queue_cu_get_mask(const hsa_queue_t *queue, uint32_t num_cu_mask_count, uint32_t *cu_mask) {
    if (!open_()) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (num_cu_mask_count == 0 || num_cu_mask_count % 32 != 0 || cu_mask == NULL)
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    struct fk_queue *q = find(queue);
    for (uint32_t w = 0; q != NULL && w < num_cu_mask_count / 32; w++) cu_mask[w] = w < words() ? q->mask[w] : 0;
    pthread_mutex_unlock(&mu);
    return q != NULL ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR_INVALID_QUEUE;
}

static int xcc_of(int cu) { return blocked ? cu / (ncu / nxcc > 0 ? ncu / nxcc : 1) % nxcc : cu % nxcc; }

hsa_status_t fakehsa_dispatch(const hsa_queue_t *queue, uint64_t work_cu_us) {
    if (!open_()) return HSA_STATUS_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&mu);
    struct fk_queue *q = find(queue);
    if (q == NULL) {
        pthread_mutex_unlock(&mu);
        return HSA_STATUS_ERROR_INVALID_QUEUE;
    }
    int per[64] = {0}, n = 0;
    for (int c = 0; c < ncu; c++)
        if (q->mask[c / 32] >> (c % 32) & 1) per[xcc_of(c) % 64]++, n++;
    uint64_t work_ns = work_cu_us * 1000;
    int64_t dur = 0;
    int stuck = n == 0;
    if (per_xcc) {
        for (int x = 0; x < nxcc && x < 64; x++) {
            if (per[x] == 0) stuck = 1;
            else if ((int64_t)(work_ns / (uint64_t)nxcc / (uint64_t)per[x]) > dur)
                dur = (int64_t)(work_ns / (uint64_t)nxcc / (uint64_t)per[x]);
        }
    } else if (n > 0) {
        dur = (int64_t)(work_ns / (uint64_t)n);
    }
    char head[256];
    if (stuck) {
        describe(head, sizeof head, "hang", q);
        snprintf(head + strlen(head), sizeof head - strlen(head), " %llu", (unsigned long long)work_cu_us);
        log_line(head, q->mask);
        pthread_mutex_unlock(&mu);
        return HSA_STATUS_ERROR;
    }
    if (st_fd >= 0) flock(st_fd, LOCK_EX);
    int64_t *busy = st->dev[q->dev].busy_until, start = q->clock;
    for (int c = 0; c < ncu; c++)
        if ((q->mask[c / 32] >> (c % 32) & 1) && busy[c] > start) start = busy[c];
    int64_t end = start + dur;
    for (int c = 0; c < ncu; c++)
        if (q->mask[c / 32] >> (c % 32) & 1) busy[c] = end;
    if (st_fd >= 0) flock(st_fd, LOCK_UN);
    q->clock = end;
    describe(head, sizeof head, "dispatch", q);
    snprintf(head + strlen(head), sizeof head - strlen(head), " %llu %lld %lld %d", (unsigned long long)work_cu_us,
             (long long)start, (long long)end, n);
    log_line(head, q->mask);
    pthread_mutex_unlock(&mu);
    return HSA_STATUS_SUCCESS;
}
