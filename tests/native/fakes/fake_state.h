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
 * - time: CLOCK_MONOTONIC. A kernel launched at t on a stream starts at max(t, stream tail, device free)
 *   and runs gridDim.x*y*z * FAKE_GPU_NS_PER_BLOCK ns (a CUgraphExec handle is its length in us), so
 *   kernels of all processes are serialised on one device clock, like time-sliced contexts at kernel
 *   granularity. Every kernel is logged as (pid, start, end).
 * - an event recorded on a stream completes when the stream's earlier work has (max(now, tail));
 *   synchronising a stream or an event sleeps until then.
 * - NVML utilisation: one sample per process per FAKE_GPU_PERIOD_US period in which its kernels ran,
 *   timestamped at the period's end (us), smUtil = busy share of that period rounded to a percent.
 *   FAKE_GPU_NVML_SAMPLES=all (default) returns every finished period newer than lastSeenTimeStamp (a ring
 *   of 200); =latest returns only the newest finished period, one sample per process per call, as drivers
 *   that keep no history do: a caller polling slower than the period loses the periods in between.
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
struct fake_state {
    uint64_t magic;
    int64_t device_free_at;
    uint64_t next_ptr;
    uint64_t iv_count;
    struct fake_proc procs[FAKE_PROCS];
    struct fake_iv iv[FAKE_IVS];
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
        if (fk->magic != 0x4b414647) {
            memset(fk, 0, sizeof *fk);
            fk->next_ptr = 1ULL << 40;
            fk->magic = 0x4b414647;
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

#endif
