/* The pod's shared accounting file ($GPUPOOL_HOOK_DIR/usage.v1), mapped by every process of the pod.
 *
 * Locking uses open-file-description (OFD) record locks, which the kernel drops when the last descriptor of
 * the holder closes, so a process killed at any instant never leaves anything locked:
 *   byte 0          the accounting lock (held for a few loads and stores),
 *   byte 1 + i      held for its whole life by the process owning slot i: a slot whose byte nobody holds
 *                   belongs to a dead process, whose memory is reclaimed. This works across containers
 *                   (different PID namespaces) and is immune to PID reuse, unlike kill(pid, 0).
 * OFD locks are per open file, so threads of one process are serialised by a process mutex first.
 * Every record is updated with single 64-bit stores, so a process dying mid-update leaves it consistent. */
#include "gp.h"

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
_Static_assert(offsetof(struct gp_shared, slots) == 2048, "layout is read by the agent");

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct gp_shared *shm;
static int shm_fd = -1;
static int slot = -1;
static int opened;

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
            if (s->magic != GP_MAGIC || s->version != GP_VERSION) {
                memset(s, 0, sizeof *s);
                fill_header(s);
                __atomic_store_n(&s->magic, GP_MAGIC, __ATOMIC_RELEASE);
            } else if (s->ndev != (uint32_t)gp_cfg.ndev || memcmp(s->limit, gp_cfg.limit, sizeof s->limit) != 0) {
                gp_log("limits in the environment differ from the pod's file; the environment's are used");
                fill_header(s);
            }
            __atomic_fetch_or(&s->features, GP_FEAT_SQUEEZE, __ATOMIC_RELEASE);
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
    const char *dir = getenv("GPUPOOL_HOOK_DIR");
    shm = dir != NULL && *dir ? open_file(dir) : NULL;
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
            __atomic_store_n(&shm->slots[i].pid, (int64_t)getpid(), __ATOMIC_RELEASE);
            slot = i;
            return;
        }
    }
    static int warned;
    if (!warned++) gp_log("all %d process slots of the pod are taken; this process is not accounted", GP_MAX_SLOTS);
}

/* With the locks held: free the slots of dead processes, then sum what the pod holds on one GPU. */
static uint64_t pod_used_locked(int li) {
    uint64_t sum = 0;
    for (int i = 0; i < GP_MAX_SLOTS; i++) {
        struct gp_slot *s = &shm->slots[i];
        if (s->pid == 0) continue;
        if (i != slot && shm_fd >= 0 && ofd(shm_fd, F_OFD_GETLK, F_WRLCK, 1 + i) == 0) {
            memset(s, 0, sizeof *s); /* its owner died: its memory went with its contexts */
            continue;
        }
        sum += s->used[li] + s->ctx[li];
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

int gp_mem_reserve(int li, uint64_t bytes) {
    if (li < 0) return 0;
    lock();
    claim_slot();
    uint64_t used = pod_used_locked(li);
    uint64_t limit = gp_cfg.limit[li];
    int ok = limit == 0 || (bytes <= limit && used <= limit - bytes);
    if (ok && slot >= 0) __atomic_store_n(&shm->slots[slot].used[li], shm->slots[slot].used[li] + bytes, __ATOMIC_RELAXED);
    unlock();
    return ok ? 0 : -1;
}

void gp_mem_adjust(int li, int64_t delta) {
    if (li < 0 || delta == 0) return;
    lock();
    claim_slot();
    if (slot >= 0) {
        uint64_t *u = &shm->slots[slot].used[li];
        uint64_t v = delta < 0 && (uint64_t)(-delta) > *u ? 0 : *u + (uint64_t)delta;
        __atomic_store_n(u, v, __ATOMIC_RELAXED);
    }
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
    if (slot >= 0) __atomic_store_n(&shm->slots[slot].ctx[li], bytes, __ATOMIC_RELAXED);
    unlock();
}

uint64_t gp_own_used(int li) {
    if (li < 0) return 0;
    lock();
    claim_slot();
    uint64_t u = slot >= 0 ? shm->slots[slot].used[li] : 0;
    unlock();
    return u;
}

int64_t gp_cap_ppm(int li) {
    int64_t cap = gp_cfg.cores_ppm[li];
    /* One aligned 64-bit load: the agent's write is seen whole or not at all. Nonsense (0, >= 100 %) is no
     * squeeze; the agent clamps too, this guards against anything else writing the file. */
    uint64_t sq = __atomic_load_n(&gp_shm()->squeeze_ppm[li], __ATOMIC_ACQUIRE);
    if (sq == 0 || sq >= (uint64_t)GP_PPM) return cap;
    int64_t v = sq < GP_SQUEEZE_MIN_PPM ? GP_SQUEEZE_MIN_PPM : (int64_t)sq;
    return v < cap ? v : cap;
}

int gp_pod_pids(int64_t *pids, int max) {
    struct gp_shared *s = gp_shm();
    int n = 0;
    for (int i = 0; i < GP_MAX_SLOTS && n < max; i++) {
        int64_t p = __atomic_load_n(&s->slots[i].pid, __ATOMIC_ACQUIRE);
        if (p != 0) pids[n++] = p;
    }
    return n;
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
}
