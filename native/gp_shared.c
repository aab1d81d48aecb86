/* The pod's shared accounting file (<accounting_dir>/usage.v1, where the agent's limits file says; without
 * one, $GPUPOOL_HOOK_DIR), mapped by every process of the pod.
 *
 * The file is writable by the pod, so nothing in it is trusted for the limits: they come from the agent's
 * read-only limits file (gp_config.c). Each process keeps its own usage in private memory too and writes it
 * back into its slot at every operation, so a process is held to the cap by its own bookkeeping whatever
 * the file says. What a tenant who rewrites this file can still do: make the pod's processes forget each
 * other's usage (each still refuses past the cap on its own, so N processes may hold up to N caps) and
 * rewrite the shared pacing state (token bucket, rate, poller lease) to lift the pod's compute pacing. The
 * agent's host-side watchdog, which reads NVML from outside the container, is the line for both.
 *
 * Locking uses open-file-description (OFD) record locks, which the kernel drops when the last descriptor of
 * the holder closes, so a process killed at any instant never leaves anything locked:
 *   byte 0          the accounting lock (held for a few loads and stores),
 *   byte 1 + i      held for its whole life by the process owning slot i: a slot whose byte nobody holds
 *                   belongs to a dead process, whose memory is reclaimed. This works across containers
 *                   (different PID namespaces) and is immune to PID reuse, unlike kill(pid, 0).
 * OFD locks are per open file, so threads of one process are serialised by a process mutex first.
 * Every record is updated with single 64-bit stores, so a process dying mid-update leaves it consistent. */
#include "gp_core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(struct gp_devstate) == 64, "devstate layout is read by the agent");
_Static_assert(sizeof(struct gp_slot) == 264, "slot layout is read by the agent");
_Static_assert(offsetof(struct gp_shared, dev) == 304, "layout is read by the agent");
_Static_assert(offsetof(struct gp_shared, features) == 1328, "layout is read by the agent");
_Static_assert(offsetof(struct gp_shared, squeeze_ppm) == 1336, "layout is written by the agent");
_Static_assert(offsetof(struct gp_shared, credit_ns) == 1464, "layout is documented for the agent");
_Static_assert(offsetof(struct gp_shared, ev_busy_ns) == 1592, "layout is documented for the agent");
_Static_assert(offsetof(struct gp_shared, scale_ppm) == 1848, "layout is documented for the agent");
_Static_assert(offsetof(struct gp_shared, slots) == 2048, "layout is read by the agent");
_Static_assert(offsetof(struct gp_shared, ident) == 69632, "layout is read by the agent");

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct gp_shared *shm;
static int shm_fd = -1;
static int slot = -1;
static int opened;
static int slot_ok;                          /* a slot is held and the accounting works (set once) */
static int broken;                           /* agent mode without its accounting: refuse, never run uncounted */
static uint64_t own_used[GP_MAX_DEV];        /* this process's own usage, private: the file's copy may be zeroed */
static uint64_t own_ctx[GP_MAX_DEV];
static uint64_t own_changes[GP_MAX_DEV];      /* bumped by every change of own_used: see gp_refresh_ctx */
static int64_t own_host[GP_HOSTPIDS];
#define IDENT_LOCK_BYTE (1 + GP_MAX_SLOTS)   /* held around context creation (gp_ident.c) */

static int ofd(int fd, int cmd, short type, off_t start) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = 1;
    int r;
    do {
        r = fcntl(fd, cmd, &fl);
    } while (r < 0 && errno == EINTR);
    if (cmd == F_OFD_GETLK) return r < 0 ? -1 : fl.l_type != F_UNLCK;
    return r;
}

static void fill_header(struct gp_shared *s) {
    s->version = GP_VERSION;
    s->ndev = (uint32_t)gp_cfg.ndev;
    for (int i = 0; i < GP_MAX_DEV; i++) {
        s->limit[i] = gp_cfg.limit[i];
        s->cores_ppm[i] = (uint64_t)gp_cfg.cores_ppm[i];
    }
    s->mode = (uint64_t)gp_cfg.mode;
}

static struct gp_shared *open_file(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, GP_FILE_NAME) >= (int)sizeof path) return NULL;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        gp_log("cannot open %.200s (%s): memory is accounted per process, not per pod", path, strerror(errno));
        return NULL;
    }
    (void)fchmod(fd, 0666); /* processes of the pod may run as different users; fails harmlessly if not ours */
    struct gp_shared *s = MAP_FAILED;
    struct stat st;
    if (ofd(fd, F_OFD_SETLKW, F_WRLCK, 0) == 0) {
        if (fstat(fd, &st) == 0 && (st.st_size >= (off_t)sizeof *s || ftruncate(fd, sizeof *s) == 0))
            s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (s != MAP_FAILED) {
            /* The header's limits are for the agent's metrics only: never read back (a tenant may rewrite them). */
            if (s->magic != GP_MAGIC || s->version != GP_VERSION) {
                memset(s, 0, sizeof *s);
                fill_header(s);
                __atomic_store_n(&s->magic, GP_MAGIC, __ATOMIC_RELEASE);
            }
            __atomic_fetch_or(&s->features, GP_LIB_FEATURES | (gp_cfg.agent ? GP_FEAT_LIMITS : 0),
                              __ATOMIC_RELEASE);
        }
        ofd(fd, F_OFD_SETLK, F_UNLCK, 0);
    }
    if (s == MAP_FAILED) {
        gp_log("cannot map %.200s (%s): memory is accounted per process", path, strerror(errno));
        close(fd);
        return NULL;
    }
    shm_fd = fd;
    return s;
}

/* Called with mu held. */
static void ensure_open(void) {
    if (opened) return;
    gp_init();
    const char *dir = gp_cfg.acct_dir;
    shm = *dir ? open_file(dir) : NULL;
    if (shm == NULL && gp_cfg.agent && !gp_cfg.broken) {
        broken = 1;
        gp_log("the pod's accounting in %.200s cannot be used: every allocation is refused", *dir ? dir : "(none)");
    }
    if (shm == NULL) {
        void *p = mmap(NULL, sizeof *shm, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) abort(); /* 70 KiB of anonymous memory: nothing sensible is left to do */
        shm = p;
        fill_header(shm);
        shm->magic = GP_MAGIC;
    }
    opened = 1;
}

static void lock(void) {
    pthread_mutex_lock(&mu);
    ensure_open();
    if (shm_fd >= 0) ofd(shm_fd, F_OFD_SETLKW, F_WRLCK, 0);
}

static void unlock(void) {
    if (shm_fd >= 0) ofd(shm_fd, F_OFD_SETLK, F_UNLCK, 0);
    pthread_mutex_unlock(&mu);
}

static void heal_slot(void);

/* With the locks held: claim a slot whose liveness byte nobody holds (free, or left by a dead process). */
static void claim_slot(void) {
    if (slot >= 0) return;
    if (shm_fd < 0) {
        slot = 0;
        shm->slots[0].pid = getpid();
        return;
    }
    for (int i = 0; i < GP_MAX_SLOTS; i++) {
        if (ofd(shm_fd, F_OFD_SETLK, F_WRLCK, 1 + i) == 0) {
            memset(&shm->slots[i], 0, sizeof shm->slots[i]);
            memset(&shm->ident[i], 0, sizeof shm->ident[i]);
            __atomic_store_n(&shm->slots[i].pid, (int64_t)getpid(), __ATOMIC_RELEASE);
            slot = i;
            heal_slot();
            return;
        }
    }
    static int warned;
    if (!warned++) gp_log("all %d process slots of the pod are taken; this process is refused memory and contexts",
                          GP_MAX_SLOTS);
}

/* With the locks held: write this process's own bookkeeping back into its slot (undoing any rewrite). */
static void heal_slot(void) {
    if (slot < 0) return;
    struct gp_slot *s = &shm->slots[slot];
    if (s->pid != (int64_t)getpid()) __atomic_store_n(&s->pid, (int64_t)getpid(), __ATOMIC_RELEASE);
    for (int i = 0; i < GP_MAX_DEV; i++) {
        if (s->used[i] != own_used[i]) __atomic_store_n(&s->used[i], own_used[i], __ATOMIC_RELAXED);
        if (s->ctx[i] != own_ctx[i]) __atomic_store_n(&s->ctx[i], own_ctx[i], __ATOMIC_RELAXED);
    }
    for (int k = 0; k < GP_HOSTPIDS; k++)
        if (shm->ident[slot].host_pid[k] != own_host[k])
            __atomic_store_n(&shm->ident[slot].host_pid[k], own_host[k], __ATOMIC_RELAXED);
}

/* Mark the slots whose liveness byte another open file holds, among slots [lo, hi]. One F_OFD_GETLK over a
 * range reports one lock in it; the parts on either side are then searched the same way, so the cost is
 * about two system calls per live process, not one per slot. */
static void find_live(int lo, int hi, uint8_t *live) {
    if (lo > hi) return;
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 1 + lo;
    fl.l_len = hi - lo + 1;
    int r;
    do {
        r = fcntl(shm_fd, F_OFD_GETLK, &fl);
    } while (r < 0 && errno == EINTR);
    if (r < 0) { /* cannot tell: every slot counts as live (the safe side of the cap) */
        for (int i = lo; i <= hi; i++) live[i] = 1;
        return;
    }
    if (fl.l_type == F_UNLCK) return;
    long first = (long)fl.l_start - 1, last = fl.l_len == 0 ? hi : (long)(fl.l_start + fl.l_len) - 2;
    if (first < lo) first = lo;
    if (last > hi) last = hi;
    for (long i = first; i <= last; i++) live[i] = 1;
    find_live(lo, (int)first - 1, live);
    find_live((int)last + 1, hi, live);
}

/* With the locks held: free the slots of dead processes, then sum what the pod holds on one GPU. A slot is
 * live while its byte is locked, whatever its content says; a live slot whose pid was wiped has been
 * tampered with (a slot is claimed and filled under the accounting lock, which we hold), so its usage is
 * unknown until its owner writes it back: UINT64_MAX, every request is refused meanwhile. */
static uint64_t pod_used_locked(int li) {
    uint64_t sum = 0;
    heal_slot();
    uint8_t live_slots[GP_MAX_SLOTS];
    memset(live_slots, 0, sizeof live_slots);
    if (shm_fd >= 0) find_live(0, GP_MAX_SLOTS - 1, live_slots);
    for (int i = 0; i < GP_MAX_SLOTS; i++) {
        struct gp_slot *s = &shm->slots[i];
        if (i == slot) {
            sum += own_used[li] + own_ctx[li];
            continue;
        }
        if (shm_fd < 0) continue;
        int live = live_slots[i];
        if (!live) {
            if (s->pid != 0) {
                memset(s, 0, sizeof *s); /* its owner died: its memory went with its contexts */
                memset(&shm->ident[i], 0, sizeof shm->ident[i]);
            }
            continue;
        }
        if (s->pid == 0) return UINT64_MAX;
        uint64_t v = s->used[li] + s->ctx[li];
        sum = v < UINT64_MAX - sum ? sum + v : UINT64_MAX;
    }
    return sum;
}

struct gp_shared *gp_shm(void) {
    pthread_mutex_lock(&mu);
    ensure_open();
    pthread_mutex_unlock(&mu);
    return shm;
}

int gp_slot_index(void) {
    lock();
    claim_slot();
    int s = slot;
    unlock();
    return s;
}

static int reserve(int li, uint64_t bytes, uint64_t extra) {
    if (li < 0) return 0;
    lock();
    claim_slot();
    uint64_t used = pod_used_locked(li);
    uint64_t limit = gp_cfg.limit[li];
    uint64_t ceiling = limit + extra < limit ? UINT64_MAX : limit + extra;
    int ok = limit == 0 || (bytes <= ceiling && used <= ceiling - bytes);
    if (limit != 0 && (slot < 0 || broken)) ok = 0; /* uncounted is never an option: refuse */
    if (ok) {
        own_used[li] += bytes;
        own_changes[li]++;
        heal_slot();
    }
    unlock();
    return ok ? 0 : -1;
}

int gp_mem_reserve(int li, uint64_t bytes) { return reserve(li, bytes, 0); }

int gp_mem_reserve_over(int li, uint64_t bytes) { return li < 0 ? 0 : reserve(li, bytes, gp_cfg.oversub[li]); }

void gp_mem_adjust(int li, int64_t delta) {
    if (li < 0 || delta == 0) return;
    lock();
    claim_slot();
    uint64_t *u = &own_used[li];
    *u = delta < 0 && (uint64_t)(-delta) > *u ? 0 : *u + (uint64_t)delta;
    own_changes[li]++;
    heal_slot();
    unlock();
}

void gp_mem_release(int li, uint64_t bytes) { gp_mem_adjust(li, -(int64_t)bytes); }

uint64_t gp_pod_used(int li) {
    if (li < 0) return 0;
    lock(); /* no slot claimed: nvidia-smi asking for the share needs none */
    uint64_t u = pod_used_locked(li);
    unlock();
    return u;
}

void gp_set_ctx_bytes(int li, uint64_t bytes) {
    if (li < 0) return;
    lock();
    claim_slot();
    own_ctx[li] = bytes;
    heal_slot();
    unlock();
}

uint64_t gp_own_used(int li, uint64_t *changes) {
    if (li < 0) return 0;
    lock();
    claim_slot();
    uint64_t u = own_used[li];
    *changes = own_changes[li];
    unlock();
    return u;
}

int64_t gp_cap_ppm(int li) {
    int64_t cap = gp_cfg.cores_ppm[li];
    /* One aligned 64-bit load: the agent's write is seen whole or not at all. Nonsense (0, >= 100 %) is no
     * squeeze; the agent clamps too. With the agent's limits file the squeeze is read there (read-only in
     * the pod); only without one from the pod's own file (a squeeze can only lower the cap either way). */
    const uint64_t *where = gp_cfg.file != NULL ? &gp_cfg.file->squeeze_ppm[li] : &gp_shm()->squeeze_ppm[li];
    uint64_t sq = __atomic_load_n(where, __ATOMIC_ACQUIRE);
    if (sq == 0 || sq >= (uint64_t)GP_PPM) return cap;
    int64_t v = sq < GP_SQUEEZE_MIN_PPM ? GP_SQUEEZE_MIN_PPM : (int64_t)sq;
    return v < cap ? v : cap;
}

int gp_pod_pids(int64_t *pids, int max) {
    struct gp_shared *s = gp_shm();
    int n = 0;
    for (int k = 0; k < GP_HOSTPIDS && n < max; k++)
        if (own_host[k] != 0) pids[n++] = own_host[k];
    for (int i = 0; i < GP_MAX_SLOTS; i++) {
        if (i == slot || __atomic_load_n(&s->slots[i].pid, __ATOMIC_ACQUIRE) == 0) continue;
        for (int k = 0; k < GP_HOSTPIDS && n < max; k++) {
            int64_t p = __atomic_load_n(&s->ident[i].host_pid[k], __ATOMIC_ACQUIRE);
            if (p != 0) pids[n++] = p;
        }
    }
    return n;
}

int gp_has_slot(void) {
    if (__atomic_load_n(&slot_ok, __ATOMIC_ACQUIRE)) return 1; /* every launch asks: no lock once known */
    lock();
    claim_slot();
    int ok = slot >= 0 && !broken;
    if (ok) __atomic_store_n(&slot_ok, 1, __ATOMIC_RELEASE);
    unlock();
    return ok;
}

void gp_set_host_pids(const int64_t *pids, int n) {
    lock();
    claim_slot();
    for (int k = 0; k < GP_HOSTPIDS; k++) own_host[k] = k < n ? pids[k] : 0;
    heal_slot();
    unlock();
}

int gp_own_host_pids(int64_t *pids) {
    int n = 0;
    for (int k = 0; k < GP_HOSTPIDS; k++)
        if (own_host[k] != 0) pids[n++] = own_host[k];
    return n;
}

/* Another process of the pod identifying itself at the same moment would see our context appear in its
 * before/after comparison: contexts are created one process at a time (an OFD lock, dropped on death). */
void gp_ident_lock(int on) {
    pthread_mutex_lock(&mu);
    ensure_open();
    int fd = shm_fd;
    pthread_mutex_unlock(&mu);
    if (fd >= 0) ofd(fd, on ? F_OFD_SETLKW : F_OFD_SETLK, on ? F_WRLCK : F_UNLCK, IDENT_LOCK_BYTE);
}

/* The child shares the parent's open file description, hence its locks: it must open its own and claim
 * its own slot. The parent may have held `mu` at fork time in another thread; the child starts afresh. */
void gp_shared_after_fork(void) {
    pthread_mutex_init(&mu, NULL);
    if (opened && shm != NULL) munmap(shm, sizeof *shm);
    if (shm_fd >= 0) close(shm_fd);
    shm = NULL;
    shm_fd = -1;
    slot = -1;
    opened = 0;
    broken = 0;
    slot_ok = 0;
    memset(own_used, 0, sizeof own_used); /* the child holds nothing of its parent's (no CUDA across fork) */
    memset(own_ctx, 0, sizeof own_ctx);
    memset(own_host, 0, sizeof own_host);
}
