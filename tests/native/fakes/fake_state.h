/* The simulated GPU shared by every process of a test (and by the fake libcuda and the fake NVML):
 * one device with its own memory and a device clock on which kernels occupy time.
 *
 * Semantics (documented here because the tests rely on them):
 * - memory: a process holds what it allocated plus FAKE_GPU_CTX_MIB for its context (from its first
 *   context call); a dead process's memory is freed (checked with kill(pid, 0): tests share a PID space).
 * - PID namespaces: NVML names processes by their *host* PID, like the real driver. FAKE_GPU_PID_NS=N
 *   simulates a container's own PID namespace: the process's host PID is getpid() + N, so what NVML reports
 *   never equals what the process's getpid() returns (as in every real pod). 0 / unset: the same.
 * - NVML's process list holds the processes with a context on the device (from their first context call),
 *   as the driver's does, whether or not they allocated anything.
 * - time: CLOCK_MONOTONIC. A kernel runs gridDim.x*y*z * FAKE_GPU_NS_PER_BLOCK ns of device time (a
 *   CUgraphExec handle is its length in us). The device is simulated lazily (fk_advance, called by every
 *   launch, sync, event query and NVML query): launched kernels wait in a queue in arrival order; the
 *   kernels of one process run in the order it launched them (one stream or several: FIFO per process);
 *   contexts of different processes are time-sliced, as the GPU does:
 *     FAKE_GPU_TIMESLICE_US (default 2000): while another process has work queued, the running context
 *       keeps the device for at most this long, then the next process with work (round robin by PID)
 *       gets it, preempting a longer kernel mid-way. 0 = no time-slicing: whole kernels in arrival order
 *       across processes (the fake's behaviour before issue 38).
 *     FAKE_GPU_SWITCH_US (default 50): every change of context costs this much device time, in which no
 *       kernel progresses (logged as nobody's). 0 = free switches.
 *   Every piece of kernel execution is logged as (pid, start, end) in start order (consecutive pieces of
 *   one process merged): the ground truth the tests grade against.
 * - an event recorded on a stream completes when the process's work launched before it has (or at the
 *   record if there is none); cuEventElapsedTime gives the span between two completions; synchronising a
 *   stream, the context or an event polls the simulation until the work is done.
 * - NVML per-process utilisation (nvmlDeviceGetProcessUtilization), modelled on what real drivers do
 *   (NVML reference, nvtop/nvitop/go-nvml reports; /work/shared/reference/nvidia-facts.md 4.5):
 *     FAKE_GPU_PERIOD_US (default 166667, the 1/6 s of recent datacenter GPUs): the driver's own sample
 *       period. Each process is sampled at phase + k * period, its phase its own (a hash of its host PID)
 *       unless FAKE_GPU_ALIGNED=1 (all at multiples of the period, the fake before issue 38). A sample's
 *       smUtil is the process's busy share of the time since its previous sample ("mean since the last
 *       sample"); a process is sampled only for periods in which it ran.
 *     FAKE_GPU_SM_SCALE_PCT (default 100): smUtil = round(scale/100 * busy %); FAKE_GPU_SM_UNCAPPED=1 lets
 *       it exceed 100 (default: capped at 100).
 *     FAKE_GPU_LAG_US (default 10000): a sample is returned only this long after its timestamp.
 *     FAKE_GPU_NVML_REPEAT (default 1): a query also returns each process's newest sample again, even when
 *       it is not newer than lastSeenTimeStamp (readers must skip timestamps they have seen).
 *     FAKE_GPU_NVML_SAMPLES=all (default) returns every sample newer than lastSeenTimeStamp (200 periods of
 *       history); =latest only each process's newest.
 *     FAKE_GPU_MIG=1: MIG mode, no per-process samples (NVML_ERROR_NOT_SUPPORTED).
 *   Parameters are read by each process from its environment once.
 * The state file is FAKE_GPU_STATE; it is locked with OFD record locks, so kill -9 never wedges it. */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FAKE_PROCS 256
#define FAKE_IVS (1 << 16)

struct fake_proc {
    int64_t pid;      /* getpid() of the process (the tests' PID space) */
    int64_t host_pid; /* what NVML calls it */
    uint64_t used;
    uint64_t ctx;
    uint64_t has_ctx;
};
struct fake_iv {
    int64_t pid, start, end;
};
#define FAKE_PENDING 4096
#define FAKE_DONE (1 << 16)
struct fake_queued {
    int64_t pid;
    uint64_t seq;       /* launch order, device-wide, from 1 */
    int64_t remaining;  /* device time still to run, ns */
};
/* The device scheduler (fk_advance); after the log so the log's offsets (read by the tests) stay put. */
struct fake_sched {
    int64_t sim_t;        /* the device has been simulated up to here */
    int64_t cur_pid;      /* the context on the device (the last one that ran) */
    int64_t slice_end;    /* its time slice ends here (while others wait) */
    int64_t switch_until; /* a context switch in progress until here */
    uint64_t next_seq;
    uint64_t switches;    /* context switches so far */
    uint64_t npending;
    struct fake_queued pending[FAKE_PENDING]; /* arrival order */
    uint64_t done_seq[FAKE_DONE];             /* completion time of kernel seq at [seq % FAKE_DONE] */
    int64_t done_at[FAKE_DONE];
};
struct fake_state {
    uint64_t magic;
    int64_t device_free_at; /* unused since the scheduler (kept: the log's offset) */
    uint64_t next_ptr;
    uint64_t iv_count;
    struct fake_proc procs[FAKE_PROCS];
    struct fake_iv iv[FAKE_IVS];
    struct fake_sched sched;
};

static struct fake_state *fk;
static int fk_fd = -1;
static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;

static inline int64_t fk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline uint64_t fk_env(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    return v != NULL && *v ? strtoull(v, NULL, 10) : dflt;
}

static inline void fk_range(short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_len = 1;
    while (fcntl(fk_fd, type == F_UNLCK ? F_OFD_SETLK : F_OFD_SETLKW, &fl) != 0 && errno == EINTR) {
    }
}

static inline void fk_lock(void) {
    pthread_mutex_lock(&fk_mu);
    if (fk == NULL) {
        const char *path = getenv("FAKE_GPU_STATE");
        if (path == NULL) path = "/tmp/fake-gpu-state";
        fk_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fk_fd < 0) abort();
        fk_range(F_WRLCK);
        struct stat st;
        if (fstat(fk_fd, &st) != 0) abort();
        if (st.st_size < (off_t)sizeof *fk && ftruncate(fk_fd, sizeof *fk) != 0) abort();
        fk = mmap(NULL, sizeof *fk, PROT_READ | PROT_WRITE, MAP_SHARED, fk_fd, 0);
        if (fk == MAP_FAILED) abort();
        if (fk->magic != 0x4b414648) {
            memset(fk, 0, sizeof *fk);
            fk->next_ptr = 1ULL << 40;
            fk->magic = 0x4b414648;
        }
        return;
    }
    fk_range(F_WRLCK);
}

static inline void fk_unlock(void) {
    fk_range(F_UNLCK);
    pthread_mutex_unlock(&fk_mu);
}

static inline int fk_alive(int64_t pid) { return pid != 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM); }

/* locked: this process's record */
static inline struct fake_proc *fk_me(void) {
    int64_t me = getpid();
    struct fake_proc *free_slot = NULL;
    for (int i = 0; i < FAKE_PROCS; i++) {
        if (fk->procs[i].pid == me) return &fk->procs[i];
        if (free_slot == NULL && !fk_alive(fk->procs[i].pid)) free_slot = &fk->procs[i];
    }
    if (free_slot == NULL) abort();
    memset(free_slot, 0, sizeof *free_slot);
    free_slot->pid = me;
    free_slot->host_pid = me + (int64_t)fk_env("FAKE_GPU_PID_NS", 0);
    return free_slot;
}

/* locked: the host PID NVML reports for a process of the tests' PID space */
static inline int64_t fk_host_pid(int64_t pid) {
    for (int i = 0; i < FAKE_PROCS; i++)
        if (fk->procs[i].pid == pid) return fk->procs[i].host_pid;
    return pid;
}

static inline uint64_t fk_total(void) { return fk_env("FAKE_GPU_MEM_MIB", 81920) << 20; }

/* locked */
static inline uint64_t fk_used_all(void) {
    uint64_t sum = 0;
    for (int i = 0; i < FAKE_PROCS; i++)
        if (fk_alive(fk->procs[i].pid)) sum += fk->procs[i].used + fk->procs[i].ctx;
    return sum;
}

/* A parameter of the simulated GPU, read from the environment once per process (they never change). */
#define FK_PARAM(var, name, dflt)                                        \
    static int64_t var##_v = -1;                                         \
    if (var##_v < 0) var##_v = (int64_t)fk_env(name, (uint64_t)(dflt)); \
    int64_t var = var##_v

/* locked: append a piece of execution to the device log, merged with the last one when it continues it */
static inline void fk_log(int64_t pid, int64_t start, int64_t end) {
    if (end <= start) return;
    if (fk->iv_count > 0) {
        struct fake_iv *last = &fk->iv[(fk->iv_count - 1) % FAKE_IVS];
        if (last->pid == pid && last->end == start) {
            last->end = end;
            return;
        }
    }
    fk->iv[fk->iv_count % FAKE_IVS] = (struct fake_iv){pid, start, end};
    fk->iv_count++;
}

/* The scheduler's state while it runs: the shared one (fk_advance) or a copy (fk_project). */
struct fake_run {
    int64_t sim_t, cur_pid, slice_end, switch_until;
    uint64_t switches, npending;
    struct fake_queued *pending;
    int commit; /* log pieces and completions (the real run) */
};

/* the context that runs next at sim_t, 0 = nothing queued */
static inline int64_t fk_pick(const struct fake_run *r, int64_t slice) {
    if (r->npending == 0) return 0;
    if (slice == 0) return r->pending[0].pid; /* no time-slicing: the oldest kernel, whoever launched it */
    int cur_has = 0, others = 0;
    for (uint64_t i = 0; i < r->npending; i++) {
        if (r->pending[i].pid == r->cur_pid) cur_has = 1;
        else others = 1;
    }
    if (cur_has && (!others || r->sim_t < r->slice_end)) return r->cur_pid;
    /* round robin: the next PID above the current one with work, else the lowest */
    int64_t next = 0, lowest = 0;
    for (uint64_t i = 0; i < r->npending; i++) {
        int64_t p = r->pending[i].pid;
        if (p == r->cur_pid) continue;
        if (p > r->cur_pid && (next == 0 || p < next)) next = p;
        if (lowest == 0 || p < lowest) lowest = p;
    }
    return next != 0 ? next : lowest;
}

/* Run the device up to `now`, or (stop != 0) until kernel `stop` completes: returns when it did, else -1. */
static inline int64_t fk_run(struct fake_run *r, int64_t now, uint64_t stop) {
    FK_PARAM(slice_us, "FAKE_GPU_TIMESLICE_US", 2000);
    FK_PARAM(switch_us, "FAKE_GPU_SWITCH_US", 50);
    int64_t slice = slice_us * 1000, sw = switch_us * 1000;
    if (r->sim_t == 0) r->sim_t = now;
    for (;;) {
        if (r->switch_until > r->sim_t) {
            if (r->switch_until > now) break;
            r->sim_t = r->switch_until;
        }
        int64_t pid = fk_pick(r, slice);
        if (pid == 0) { /* idle */
            if (r->sim_t < now) r->sim_t = now;
            break;
        }
        if (pid != r->cur_pid) {
            int64_t prev = r->cur_pid;
            r->cur_pid = pid;
            r->slice_end = r->sim_t + slice;
            if (prev != 0 && sw > 0) { /* the switch takes device time in which nothing runs */
                r->switch_until = r->sim_t + sw;
                r->slice_end += sw;
                r->switches++;
                continue;
            }
        }
        uint64_t k = 0;
        while (r->pending[k].pid != pid) k++;
        struct fake_queued *q = &r->pending[k];
        int others = 0;
        for (uint64_t i = 0; i < r->npending && !others; i++) others = r->pending[i].pid != pid;
        if (slice > 0 && !others && r->slice_end < r->sim_t + slice) r->slice_end = r->sim_t + slice; /* alone */
        int64_t until = r->sim_t + q->remaining < now ? r->sim_t + q->remaining : now;
        if (slice > 0 && others && r->slice_end < until) until = r->slice_end;
        if (until < r->sim_t) until = r->sim_t;
        if (r->commit) fk_log(pid, r->sim_t, until);
        q->remaining -= until - r->sim_t;
        r->sim_t = until;
        if (q->remaining <= 0) {
            uint64_t seq = q->seq;
            if (r->commit) {
                fk->sched.done_seq[seq % FAKE_DONE] = seq;
                fk->sched.done_at[seq % FAKE_DONE] = r->sim_t;
            }
            memmove(q, q + 1, (r->npending - k - 1) * sizeof *q);
            r->npending--;
            if (seq == stop) return r->sim_t;
        } else if (until >= now) {
            break;
        }
    }
    return -1;
}

/* locked: run the simulated device up to `now` */
static inline void fk_advance(int64_t now) {
    struct fake_sched *s = &fk->sched;
    struct fake_run r = {s->sim_t, s->cur_pid, s->slice_end, s->switch_until, s->switches, s->npending,
                         s->pending, 1};
    fk_run(&r, now, 0);
    s->sim_t = r.sim_t;
    s->cur_pid = r.cur_pid;
    s->slice_end = r.slice_end;
    s->switch_until = r.switch_until;
    s->switches = r.switches;
    s->npending = r.npending;
}

/* locked: when kernel `seq` would complete if nobody launched anything more (later launches of other
 * processes can only delay it): what a synchronising caller sleeps until before it looks again */
static inline int64_t fk_project(uint64_t seq) {
    struct fake_sched *s = &fk->sched;
    struct fake_queued *copy = malloc((s->npending + 1) * sizeof *copy);
    if (copy == NULL) return 0;
    memcpy(copy, s->pending, s->npending * sizeof *copy);
    struct fake_run r = {s->sim_t, s->cur_pid, s->slice_end, s->switch_until, s->switches, s->npending, copy, 0};
    int64_t end = fk_run(&r, INT64_MAX, seq);
    free(copy);
    return end;
}

/* locked: when kernel `seq` completed (0: long ago or never launched), -1 while it has not */
static inline int64_t fk_seq_end(uint64_t seq) {
    struct fake_sched *s = &fk->sched;
    if (seq == 0) return 0;
    for (uint64_t i = 0; i < s->npending; i++)
        if (s->pending[i].seq == seq) return -1;
    return s->done_seq[seq % FAKE_DONE] == seq ? s->done_at[seq % FAKE_DONE] : 0;
}

#endif
