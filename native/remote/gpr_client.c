/* libgpupool_remote.so: a CUDA driver (libcuda.so.1) for a container on a node without a GPU, which runs
 * every call on a gpupool GPU server (gpr_server.c) over TCP or a unix socket.
 *
 * Configuration (the agent writes it into the container):
 *   GPUPOOL_REMOTE_SERVER_FILE  a file holding the server's address, read when a process starts: the
 *                               agent rewrites it when the share moves to another server, so a process
 *                               started after a move goes where the share is (running ones are moved)
 *   GPUPOOL_REMOTE_SERVER       tcp:HOST:PORT or unix:PATH, where there is no GPUPOOL_REMOTE_SERVER_FILE
 *   GPUPOOL_REMOTE_TOKEN_FILE   a file holding the share's token (or GPUPOOL_REMOTE_TOKEN, the token itself)
 *   GPUPOOL_REMOTE_TIMEOUT_S    optional: the longest wait for one reply (default: none; a dead or
 *                               unreachable server is still noticed, by EOF or TCP keepalive)
 *
 * One connection per context (the first one reuses cuInit's). Calls that return data or whose result the program needs wait for the
 * reply; launches, asynchronous copies to the device, memsets and event records are sent without waiting
 * (pipelined), and the server reports their errors at the next call that waits, as the driver does with
 * asynchronous errors. Contexts, modules, functions, streams and events are the client's own objects that
 * name the server's by number; device pointers are the server's own values (programs compute with them).
 * A call this library does not forward answers CUDA_ERROR_NOT_SUPPORTED; a lost server answers
 * CUDA_ERROR_LAUNCH_FAILED on every later call of that context, as a driver does after a fatal fault. */
#define _GNU_SOURCE
#include "gpr.h"

#include <elf.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <sys/un.h>

#define EXPORT __attribute__((visibility("default")))
#define CONNECT_TIMEOUT_MS 10000

typedef struct CUmod_st *CUmodule;

/* ---- objects ------------------------------------------------------------------------------------------ */
#define CTX_MAGIC 0x47505243u
#define OBJ_MAGIC 0x4750524fu
#define FN_MAGIC 0x47505246u

struct gctx {
    uint32_t magic;
    struct gctx *retired_next; /* ended contexts stay allocated, listed (see end_ctx) */
    int fd;
    int dead;
    int device;
    int primary;
    unsigned flags;
    int refs;              /* primary contexts: retains outstanding */
    pthread_mutex_t mu;    /* one message (and its reply) at a time on the connection */
};
struct gfunc;
struct gobj {              /* a module, stream or event: the server's number for it, in its context */
    uint32_t magic;
    uint32_t id;
    struct gctx *ctx;
    struct gfunc *funcs;   /* a module's functions, freed with it (as the driver's are) */
};
struct gfunc {
    uint32_t magic;
    uint32_t id;
    struct gctx *ctx;
    uint32_t nparams;      /* GPR_PARAMS_UNKNOWN: the server's driver cannot describe them */
    uint32_t argsize;
    uint32_t *layout;      /* nparams x (offset, size) */
    struct gfunc *next;
};

static struct gpr_devices devs;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int initialised;
static char server[512];             /* where new connections go (a migration moves it) */
static pthread_mutex_t server_mu = PTHREAD_MUTEX_INITIALIZER;
static int spare_fd = -1;            /* cuInit's connection, kept for the first context (guarded by server_mu) */
static char token[GPR_MAX_TOKEN + 1];
static int64_t reply_timeout_ms = -1;
static pthread_mutex_t primary_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gctx *primary[GPR_MAX_DEV];

static __thread struct gctx *ctx_stack[32];
static __thread int ctx_depth;

static void note(const char *what) { fprintf(stderr, "gpupool-remote: %s\n", what); }

/* ---- the connection ----------------------------------------------------------------------------------- */
static int dial(const char *addr) {
    int fd = -1, tcp = 0;
    if (strncmp(addr, "unix:", 5) == 0) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(addr + 5) >= sizeof a.sun_path) return -1;
        strcpy(a.sun_path, addr + 5);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            return -1;
        }
        return fd;
    }
    if (strncmp(addr, "tcp:", 4) != 0) return -1;
    char host[sizeof server];
    snprintf(host, sizeof host, "%s", addr + 4);
    char *colon = strrchr(host, ':');
    if (colon == NULL) return -1;
    *colon = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0) return -1;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return -1;
    /* a connect that hangs (a black-holed address) ends after CONNECT_TIMEOUT_MS, not the kernel's minutes */
    struct pollfd pf = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof err;
    if (poll(&pf, 1, CONNECT_TIMEOUT_MS) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    tcp = 1;
    int one = 1, idle = 10, intvl = 5, cnt = 3;
    unsigned user_timeout = 30000;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* a server that vanishes without a FIN (a dead node, a cut link) is noticed within ~25 s */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
    (void)tcp;
    return fd;
}

static void lose(struct gctx *c) { /* locked */
    if (!c->dead) {
        c->dead = 1;
        note("lost the connection to the GPU server: this context's calls fail from now on");
        if (c->fd >= 0) close(c->fd);
        c->fd = -1;
    }
}

/* Open a connection and pass the hello. 0, or the CUresult the server refused with. */
static CUresult open_conn_to(struct gctx *c, const char *addr) {
    c->fd = dial(addr);
    if (c->fd < 0) return GPR_CUDA_ERROR_NO_DEVICE;
    size_t tl = strlen(token);
    struct {
        struct gpr_hdr h;
        uint32_t head[3];
    } m = {{GPR_OP_HELLO, 0, (uint32_t)(12 + tl)}, {GPR_MAGIC, GPR_VERSION, (uint32_t)tl}};
    struct gpr_hdr r;
    uint32_t info[2];
    int64_t deadline = gpr_now_ms() + CONNECT_TIMEOUT_MS;
    if (gpr_write_full(c->fd, &m, sizeof m) != 0 || gpr_write_full(c->fd, token, tl) != 0 ||
        gpr_read_full(c->fd, &r, sizeof r, deadline) != 0 ||
        (r.op_or_result == CUDA_SUCCESS && (r.len != sizeof info || gpr_read_full(c->fd, info, sizeof info, deadline) != 0))) {
        close(c->fd);
        c->fd = -1;
        return GPR_CUDA_ERROR_NO_DEVICE;
    }
    if (r.op_or_result != CUDA_SUCCESS) {
        close(c->fd);
        c->fd = -1;
        return r.op_or_result == GPR_CUDA_ERROR_NOT_PERMITTED ? GPR_CUDA_ERROR_NOT_PERMITTED : GPR_CUDA_ERROR_NO_DEVICE;
    }
    return CUDA_SUCCESS;
}

static CUresult open_conn(struct gctx *c) {
    char addr[sizeof server];
    pthread_mutex_lock(&server_mu);
    memcpy(addr, server, sizeof addr);
    pthread_mutex_unlock(&server_mu);
    return open_conn_to(c, addr);
}

/* One request: header + up to two payload parts. NOREPLY requests return at once; the others return the
 * server's result and its payload in out (at most outcap bytes; *outlen gets the length). */
/* One exchange on a connection: 0, or -1 when the connection failed. A GPR_R_MOVED reply leaves the
 * server's new address in moved (GPR_MAX_ADDR bytes). */
static int exchange(int fd, uint32_t op, uint32_t flags, const void *a, size_t alen, const void *b, size_t blen,
                    void *out, size_t outcap, size_t *outlen, uint32_t *result, char *moved) {
    struct gpr_hdr h = {op, flags, (uint32_t)(alen + blen)};
    struct iovec iov[3] = {{&h, sizeof h}, {(void *)a, alen}, {(void *)b, blen}};
    int niov = blen > 0 ? 3 : alen > 0 ? 2 : 1;
    size_t total = sizeof h + alen + blen;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    *result = CUDA_SUCCESS;
    if (outlen != NULL) *outlen = 0;
    while (total > 0) {
        ssize_t put = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return -1;
        total -= (size_t)put;
        while (put > 0 && mh.msg_iovlen > 0) { /* advance past what went out */
            if ((size_t)put >= mh.msg_iov[0].iov_len) {
                put -= (ssize_t)mh.msg_iov[0].iov_len;
                mh.msg_iov++;
                mh.msg_iovlen--;
            } else {
                mh.msg_iov[0].iov_base = (char *)mh.msg_iov[0].iov_base + put;
                mh.msg_iov[0].iov_len -= (size_t)put;
                put = 0;
            }
        }
    }
    if (flags & GPR_F_NOREPLY) return 0;
    struct gpr_hdr r;
    int64_t deadline = reply_timeout_ms < 0 ? -1 : gpr_now_ms() + reply_timeout_ms;
    if (gpr_read_full(fd, &r, sizeof r, deadline) != 0) return -1;
    if (r.op_or_result == GPR_R_MOVED) {
        if (moved == NULL || r.len == 0 || r.len > GPR_MAX_ADDR || gpr_read_full(fd, moved, r.len, deadline) != 0)
            return -1;
        moved[r.len - 1] = '\0';
        *result = GPR_R_MOVED;
        return 0;
    }
    if (r.op_or_result == GPR_E_PROTOCOL || r.len > outcap) return -1;
    if (r.len > 0 && gpr_read_full(fd, out, r.len, deadline) != 0) return -1;
    if (outlen != NULL) *outlen = r.len;
    *result = r.op_or_result;
    return 0;
}

static int migrate(struct gctx *c, const char *target);

/* One request on a context's connection. NOREPLY requests return at once; the others return the server's
 * result and its payload in out (at most outcap bytes; *outlen gets the length). A server that answers
 * "moved" gets the context moved (migrate) and the request sent again where the context now is. */
static CUresult call(struct gctx *c, uint32_t op, uint32_t flags, const void *a, size_t alen, const void *b,
                     size_t blen, void *out, size_t outcap, size_t *outlen) {
    if (outlen != NULL) *outlen = 0;
    if (c == NULL) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&c->mu);
    uint32_t res = GPR_CUDA_ERROR_LAUNCH_FAILED;
    for (int tries = 0; !c->dead && tries < 3; tries++) {
        char moved[GPR_MAX_ADDR];
        if (exchange(c->fd, op, flags, a, alen, b, blen, out, outcap, outlen, &res, moved) != 0) {
            lose(c);
            res = GPR_CUDA_ERROR_LAUNCH_FAILED;
            break;
        }
        if (res != GPR_R_MOVED) break;
        migrate(c, moved); /* on failure the context stays where it was, which serves the request again */
        res = GPR_CUDA_ERROR_UNKNOWN;
    }
    pthread_mutex_unlock(&c->mu);
    return (CUresult)res;
}

static CUresult call_simple(struct gctx *c, uint32_t op, const void *a, size_t alen) {
    return call(c, op, 0, a, alen, NULL, 0, NULL, 0, NULL);
}


/* ---- live migration (docs/remote.md) ------------------------------------------------------------------
 * The source worker answered a request with "moved to TARGET" after synchronising the context: everything
 * this context sent before has run there, and nothing else is in flight (its lock is held here). Its state
 * is read from the source and replayed into a fresh worker on the target under the same numbers and device
 * addresses, so the program's handles and pointers stay valid; then the connection is swapped and the
 * source worker, seeing it close, exits and frees the GPU there. Any failure leaves the context on the
 * source, untouched. Called with c->mu held. */
struct xfer {
    int from, to;
    unsigned char *buf;        /* GPR_MAX_MSG bytes */
};

static int ask(int fd, uint32_t op, const void *a, size_t alen, const void *b, size_t blen, void *out,
               size_t outcap, size_t *outlen) {
    uint32_t res;
    if (exchange(fd, op, 0, a, alen, b, blen, out, outcap, outlen, &res, NULL) != 0) return -1;
    return res == CUDA_SUCCESS ? 0 : -1;
}
static int tell(int fd, uint32_t op, const void *a, size_t alen, const void *b, size_t blen) {
    uint32_t res;
    return exchange(fd, op, GPR_F_NOREPLY, a, alen, b, blen, NULL, 0, NULL, &res, NULL);
}

static int replay(struct xfer *x, const unsigned char *st, size_t len) {
    struct gpr_state_head h;
    if (len < sizeof h) return -1;
    memcpy(&h, st, sizeof h);
    const unsigned char *p = st + sizeof h, *end = st + len;
#define TAKE(v) (p + sizeof(v) <= end ? (memcpy(&(v), p, sizeof(v)), p += sizeof(v), 0) : -1)
    const unsigned char *allocs = p;
    if ((size_t)(end - p) < (size_t)h.nallocs * 16) return -1;
    p += (size_t)h.nallocs * 16;
    for (uint32_t i = 0; i < h.nmodules; i++) { /* modules first: functions name them */
        uint32_t id, ilen;
        size_t got;
        if (TAKE(id) || TAKE(ilen)) return -1;
        if (ask(x->from, GPR_OP_MODULE_IMAGE, &id, 4, NULL, 0, x->buf, GPR_MAX_MSG, &got) != 0 || got != ilen ||
            tell(x->to, GPR_OP_RESTORE_MODULE, &id, 4, x->buf, got) != 0)
            return -1;
    }
    for (uint32_t i = 0; i < h.nfuncs; i++) {
        uint32_t ids[2], nlen;
        if (TAKE(ids) || TAKE(nlen) || (size_t)(end - p) < nlen) return -1;
        if (tell(x->to, GPR_OP_RESTORE_FUNCTION, ids, 8, p, nlen) != 0) return -1;
        p += nlen;
    }
    for (uint32_t i = 0; i < h.nstreams; i++) {
        uint32_t v[3];
        if (TAKE(v) || tell(x->to, GPR_OP_RESTORE_STREAM, v, sizeof v, NULL, 0) != 0) return -1;
    }
    for (uint32_t i = 0; i < h.nevents; i++) {
        uint32_t v[2];
        if (TAKE(v) || tell(x->to, GPR_OP_RESTORE_EVENT, v, sizeof v, NULL, 0) != 0) return -1;
    }
#undef TAKE
    if (h.nallocs > 0 && tell(x->to, GPR_OP_RESTORE_ALLOC, allocs, (size_t)h.nallocs * 16, NULL, 0) != 0) return -1;
    if (ask(x->to, GPR_OP_CTX_SYNC, NULL, 0, NULL, 0, NULL, 0, NULL) != 0) return -1; /* all rebuilt? */
    for (uint32_t i = 0; i < h.nallocs; i++) { /* then the contents, chunk by chunk */
        uint64_t ptr, bytes;
        memcpy(&ptr, allocs + 16 * (size_t)i, 8);
        memcpy(&bytes, allocs + 16 * (size_t)i + 8, 8);
        for (uint64_t off = 0; off < bytes; off += GPR_CHUNK) {
            uint64_t n = bytes - off < GPR_CHUNK ? bytes - off : GPR_CHUNK;
            struct { uint64_t src, n; uint32_t stream, async; } rq = {ptr + off, n, 0, 0};
            struct { uint64_t dst; uint32_t stream, async; } wr = {ptr + off, 0, 0};
            size_t got;
            if (ask(x->from, GPR_OP_DTOH, &rq, sizeof rq, NULL, 0, x->buf, GPR_MAX_MSG, &got) != 0 || got != n ||
                tell(x->to, GPR_OP_HTOD, &wr, sizeof wr, x->buf, n) != 0)
                return -1;
        }
    }
    return ask(x->to, GPR_OP_CTX_SYNC, NULL, 0, NULL, 0, NULL, 0, NULL);
}

static int migrate(struct gctx *c, const char *target) {
    int64_t t0 = gpr_now_ms();
    struct gctx n = {.magic = CTX_MAGIC, .fd = -1};
    struct xfer x = {c->fd, -1, malloc(GPR_MAX_MSG)};
    unsigned char *st = malloc(GPR_MAX_MSG);
    uint32_t a[3] = {(uint32_t)c->device, c->flags, (uint32_t)c->primary};
    size_t stlen = 0;
    const char *failed = NULL;
    if (x.buf == NULL || st == NULL) failed = "memory";
    else if (open_conn_to(&n, target) != CUDA_SUCCESS) failed = "connecting";
    x.to = n.fd;
    if (failed == NULL && ask(x.to, GPR_OP_CTX_CREATE, a, sizeof a, NULL, 0, NULL, 0, NULL) != 0) failed = "a context";
    if (failed == NULL && ask(x.from, GPR_OP_STATE, NULL, 0, NULL, 0, st, GPR_MAX_MSG, &stlen) != 0)
        failed = "reading the state";
    if (failed == NULL && replay(&x, st, stlen) != 0) failed = "replaying the state";
    free(st);
    free(x.buf);
    char msg[GPR_MAX_ADDR + 128];
    if (failed != NULL) {
        if (n.fd >= 0) close(n.fd);
        snprintf(msg, sizeof msg, "could not move to %s (%s); staying on the current GPU server", target, failed);
        note(msg);
        return -1;
    }
    close(c->fd);
    c->fd = n.fd;
    pthread_mutex_lock(&server_mu); /* this process's new contexts go where the administrator sent it */
    snprintf(server, sizeof server, "%s", target);
    pthread_mutex_unlock(&server_mu);
    snprintf(msg, sizeof msg, "moved to %s in %lld ms", target, (long long)(gpr_now_ms() - t0));
    note(msg);
    return 0;
}

/* ---- init, devices ------------------------------------------------------------------------------------ */
/* The first line of `path` into `out` (empty when the file cannot be read). */
static void read_line(const char *path, char *out, size_t size) {
    out[0] = '\0';
    FILE *f = fopen(path, "re");
    if (f == NULL) return;
    size_t n = fread(out, 1, size - 1, f);
    fclose(f);
    out[n] = '\0';
    out[strcspn(out, "\r\n")] = '\0';
}

static void read_config(void) {
    const char *sf = getenv("GPUPOOL_REMOTE_SERVER_FILE");
    const char *s = getenv("GPUPOOL_REMOTE_SERVER");
    if (sf != NULL && *sf) {
        read_line(sf, server, sizeof server);
        s = server;
    }
    if (s == NULL || !*s) {
        note(sf != NULL && *sf ? "GPUPOOL_REMOTE_SERVER_FILE names no server: no GPU"
                               : "GPUPOOL_REMOTE_SERVER is not set: no GPU");
        init_result = GPR_CUDA_ERROR_NO_DEVICE;
        return;
    }
    if (s != server) snprintf(server, sizeof server, "%s", s);
    const char *t = getenv("GPUPOOL_REMOTE_TOKEN");
    const char *tf = getenv("GPUPOOL_REMOTE_TOKEN_FILE");
    if (tf != NULL && *tf) {
        read_line(tf, token, sizeof token);
    } else if (t != NULL) {
        snprintf(token, sizeof token, "%s", t);
    }
    const char *to = getenv("GPUPOOL_REMOTE_TIMEOUT_S");
    if (to != NULL && atoll(to) > 0) reply_timeout_ms = atoll(to) * 1000;
    /* The device table is read once, on a connection of its own: device queries are then answered here,
     * without a round trip, as the driver answers them without one. */
    struct gctx c = {.magic = CTX_MAGIC, .fd = -1};
    pthread_mutex_init(&c.mu, NULL);
    CUresult r = open_conn(&c);
    if (r == CUDA_SUCCESS) {
        size_t got = 0;
        r = call(&c, GPR_OP_DEVICES, 0, NULL, 0, NULL, 0, &devs, sizeof devs, &got);
        if (r == CUDA_SUCCESS && got != sizeof devs) r = GPR_CUDA_ERROR_NO_DEVICE;
        /* kept for the first context: one connection (one server process) less, and no window in which a
         * busy server has room for the device query but not for the context right after it */
        if (r == CUDA_SUCCESS && !c.dead) spare_fd = c.fd;
        else if (c.fd >= 0) close(c.fd);
    }
    if (r != CUDA_SUCCESS) {
        char msg[600];
        snprintf(msg, sizeof msg, "the GPU server %s %s (%d)", server,
                 r == GPR_CUDA_ERROR_NOT_PERMITTED ? "refused this share's token" : "cannot be reached", r);
        note(msg);
    }
    pthread_mutex_destroy(&c.mu);
    init_result = r;
}

EXPORT CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&init_once, read_config);
    if (init_result == CUDA_SUCCESS) __atomic_store_n(&initialised, 1, __ATOMIC_RELEASE);
    return init_result;
}

#define NEED_INIT()                                                    \
    do {                                                               \
        if (!__atomic_load_n(&initialised, __ATOMIC_ACQUIRE))          \
            return CUDA_ERROR_NOT_INITIALIZED;                         \
    } while (0)
#define NEED_DEV(d)                                                    \
    do {                                                               \
        NEED_INIT();                                                   \
        if ((d) < 0 || (d) >= devs.count) return GPR_CUDA_ERROR_INVALID_DEVICE; \
    } while (0)

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
    /* Before cuInit the library does not know the server's driver: it speaks the 12.4 API (what it forwards). */
    *v = __atomic_load_n(&initialised, __ATOMIC_ACQUIRE) && devs.driver_version > 0 ? devs.driver_version : 12040;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
    NEED_INIT();
    if (n == NULL) return CUDA_ERROR_INVALID_VALUE;
    *n = devs.count;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_DEV(ordinal);
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_DEV(d);
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", devs.dev[d].name);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    NEED_DEV(d);
    if (u == NULL) return CUDA_ERROR_INVALID_VALUE;
    memcpy(u->bytes, devs.dev[d].uuid, 16);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
    NEED_DEV(d);
    if (b == NULL) return CUDA_ERROR_INVALID_VALUE;
    *b = devs.dev[d].total_mem;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    NEED_DEV(d);
    if (v == NULL || attr <= 0 || attr >= GPR_NATTR || devs.dev[d].attr[attr] == INT32_MIN)
        return CUDA_ERROR_INVALID_VALUE;
    *v = devs.dev[d].attr[attr];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice d) {
    CUresult r = cuDeviceGetAttribute(major, 75, d); /* COMPUTE_CAPABILITY_MAJOR */
    return r != CUDA_SUCCESS ? r : cuDeviceGetAttribute(minor, 76, d);
}

/* ---- contexts ----------------------------------------------------------------------------------------- */
static struct gctx *current(void) { return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL; }

static CUresult new_ctx(struct gctx **out, int device, unsigned flags, int is_primary) {
    struct gctx *c = calloc(1, sizeof *c);
    if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = CTX_MAGIC;
    c->device = device;
    c->primary = is_primary;
    c->flags = flags;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_lock(&server_mu);
    c->fd = spare_fd;
    spare_fd = -1;
    pthread_mutex_unlock(&server_mu);
    CUresult r = c->fd >= 0 ? CUDA_SUCCESS : open_conn(c);
    uint32_t a[3] = {(uint32_t)device, flags, (uint32_t)is_primary};
    if (r == CUDA_SUCCESS) r = call_simple(c, GPR_OP_CTX_CREATE, a, sizeof a);
    if (r != CUDA_SUCCESS) {
        if (c->fd >= 0) close(c->fd);
        pthread_mutex_destroy(&c->mu);
        free(c);
        return r == GPR_CUDA_ERROR_LAUNCH_FAILED ? GPR_CUDA_ERROR_NO_DEVICE : r;
    }
    *out = c;
    return CUDA_SUCCESS;
}

/* Ending a context closes its connection: the server's process for it exits and the driver frees all of
 * it. The object itself stays allocated (dead): another thread may still hold it current, and a call
 * there must fail cleanly rather than touch freed memory. */
static struct gctx *retired;
static void end_ctx(struct gctx *c) {
    pthread_mutex_lock(&c->mu);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->dead = 1;
    c->magic = 0;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&primary_mu);
    c->retired_next = retired;
    retired = c;
    pthread_mutex_unlock(&primary_mu);
}

static int valid_ctx(const struct gctx *c) { return c != NULL && c->magic == CTX_MAGIC; }

EXPORT CUresult cuCtxCreate_v2(CUcontext *out, unsigned flags, CUdevice d) {
    NEED_DEV(d);
    if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct gctx *c;
    CUresult r = new_ctx(&c, d, flags, 0);
    if (r != CUDA_SUCCESS) return r;
    if (ctx_depth < 32) ctx_stack[ctx_depth++] = c; /* a new context is pushed on the caller's stack */
    *out = (CUcontext)c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    struct gctx *c = (struct gctx *)ctx;
    if (!valid_ctx(c) || c->primary) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == c) ctx_stack[i] = NULL;
    while (ctx_depth > 0 && ctx_stack[ctx_depth - 1] == NULL) ctx_depth--;
    end_ctx(c);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *out, CUdevice d) {
    NEED_DEV(d);
    if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&primary_mu);
    CUresult r = CUDA_SUCCESS;
    if (primary[d] == NULL) r = new_ctx(&primary[d], d, 0, 1);
    if (r == CUDA_SUCCESS) {
        primary[d]->refs++;
        *out = (CUcontext)primary[d];
    }
    pthread_mutex_unlock(&primary_mu);
    return r;
}
static CUresult primary_drop(CUdevice d, int all) {
    NEED_DEV(d);
    pthread_mutex_lock(&primary_mu);
    struct gctx *c = primary[d];
    CUresult r = CUDA_SUCCESS;
    if (c == NULL) r = all ? CUDA_SUCCESS : GPR_CUDA_ERROR_INVALID_CONTEXT;
    else if (all || --c->refs <= 0) {
        primary[d] = NULL;
        end_ctx(c);
    }
    pthread_mutex_unlock(&primary_mu);
    return r;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return primary_drop(d, 0); }
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { return primary_drop(d, 1); }
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    NEED_DEV(d);
    if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&primary_mu);
    *flags = 0;
    *active = primary[d] != NULL;
    pthread_mutex_unlock(&primary_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned flags) {
    NEED_DEV(d);
    (void)flags; /* scheduling flags are a host-side matter of the server's process; nothing to forward */
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    struct gctx *c = (struct gctx *)ctx;
    if (c != NULL && !valid_ctx(c)) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0) {
        if (c == NULL) return CUDA_SUCCESS;
        ctx_depth = 1;
    }
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *out) {
    if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
    *out = (CUcontext)current();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    struct gctx *c = (struct gctx *)ctx;
    if (!valid_ctx(c)) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= 32) return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *out) {
    if (ctx_depth == 0) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    struct gctx *c = ctx_stack[--ctx_depth];
    if (out != NULL) *out = (CUcontext)c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    struct gctx *c = current();
    if (!valid_ctx(c)) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    *d = c->device;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) { return call_simple(current(), GPR_OP_CTX_SYNC, NULL, 0); }

/* ---- memory ------------------------------------------------------------------------------------------- */
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    uint64_t o[2] = {0, 0};
    size_t got;
    CUresult r = call(current(), GPR_OP_MEM_INFO, 0, NULL, 0, NULL, 0, o, sizeof o, &got);
    if (r == CUDA_SUCCESS && got == sizeof o) {
        if (f != NULL) *f = o[0];
        if (t != NULL) *t = o[1];
    }
    return r;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t a = n, o = 0;
    size_t got;
    CUresult r = call(current(), GPR_OP_MEM_ALLOC, 0, &a, 8, NULL, 0, &o, 8, &got);
    if (r == CUDA_SUCCESS) *p = o;
    return r;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    uint64_t a = p;
    return call_simple(current(), GPR_OP_MEM_FREE, &a, 8);
}

/* A stream argument: its context and the server's number; the NULL stream is the current context's. */
static CUresult stream_ref(CUstream s, int ptsz, struct gctx **c, uint32_t *id) {
    uintptr_t v = (uintptr_t)s;
    if (v == 0 || v == GPR_STREAM_LEGACY || v == GPR_STREAM_PER_THREAD) {
        *c = current();
        *id = v == 0 && ptsz ? GPR_STREAM_PER_THREAD : (uint32_t)v;
        return *c != NULL ? CUDA_SUCCESS : GPR_CUDA_ERROR_INVALID_CONTEXT;
    }
    struct gobj *o = (struct gobj *)s;
    if (o->magic != OBJ_MAGIC || o->ctx == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
    *c = o->ctx;
    *id = o->id;
    return CUDA_SUCCESS;
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n, CUstream s, int async, int ptsz) {
    struct gctx *c;
    uint32_t sid;
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    if (r != CUDA_SUCCESS) return r;
    if (src == NULL && n > 0) return CUDA_ERROR_INVALID_VALUE;
    /* Chunks go out back to back; a synchronous copy waits only for the last one's reply, which the server
     * sends after all of them ran (and carries any earlier chunk's error). */
    size_t off = 0;
    do {
        size_t len = n - off > GPR_CHUNK ? GPR_CHUNK : n - off;
        int last = off + len == n;
        struct {
            uint64_t dst;
            uint32_t stream, async;
        } a = {dst + off, sid, (uint32_t)async};
        uint32_t flags = async || !last ? GPR_F_NOREPLY : 0;
        r = call(c, GPR_OP_HTOD, flags, &a, sizeof a, (const char *)src + off, len, NULL, 0, NULL);
        off += len;
    } while (off < n && r == CUDA_SUCCESS);
    return r;
}
static CUresult dtoh(void *dst, CUdeviceptr src, size_t n, CUstream s, int async, int ptsz) {
    struct gctx *c;
    uint32_t sid;
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    if (r != CUDA_SUCCESS) return r;
    if (dst == NULL && n > 0) return CUDA_ERROR_INVALID_VALUE;
    /* An asynchronous copy to the host completes before it returns: the data must cross the network into
     * the caller's buffer, and finishing early is within the driver's contract. */
    size_t off = 0;
    do {
        size_t len = n - off > GPR_CHUNK ? GPR_CHUNK : n - off, got = 0;
        struct {
            uint64_t src, n;
            uint32_t stream, async;
        } a = {src + off, len, sid, (uint32_t)async};
        r = call(c, GPR_OP_DTOH, 0, &a, sizeof a, NULL, 0, (char *)dst + off, len, &got);
        if (r == CUDA_SUCCESS && got != len) r = GPR_CUDA_ERROR_UNKNOWN;
        off += len;
    } while (off < n && r == CUDA_SUCCESS);
    return r;
}
static CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int async, int ptsz) {
    struct gctx *c;
    uint32_t sid;
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    if (r != CUDA_SUCCESS) return r;
    struct {
        uint64_t dst, src, n;
        uint32_t stream, async;
    } a = {dst, src, n, sid, (uint32_t)async};
    return call(c, GPR_OP_DTOD, async ? GPR_F_NOREPLY : 0, &a, sizeof a, NULL, 0, NULL, 0, NULL);
}
static CUresult memset_any(CUdeviceptr dst, uint32_t value, uint32_t size, size_t n, CUstream s, int async, int ptsz) {
    struct gctx *c;
    uint32_t sid;
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    if (r != CUDA_SUCCESS) return r;
    struct {
        uint64_t dst, n;
        uint32_t value, size, stream, async;
    } a = {dst, n, value, size, sid, (uint32_t)async};
    /* memsets go out without waiting, synchronous ones too: nothing comes back but a result, which the next
     * waiting call reports; the driver itself returns from a device memset before it has run */
    return call(c, GPR_OP_MEMSET, GPR_F_NOREPLY, &a, sizeof a, NULL, 0, NULL, 0, NULL);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return htod(d, h, n, NULL, 0, 0); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) { return htod(d, h, n, s, 1, 0); }
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *h, size_t n, CUstream s) { return htod(d, h, n, s, 1, 1); }
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return dtoh(h, d, n, NULL, 0, 0); }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) { return dtoh(h, d, n, s, 1, 0); }
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *h, CUdeviceptr d, size_t n, CUstream s) { return dtoh(h, d, n, s, 1, 1); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return dtod(d, s, n, NULL, 0, 0); }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { return dtod(d, src, n, s, 1, 0); }
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { return dtod(d, src, n, s, 1, 1); }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return memset_any(d, v, 1, n, NULL, 0, 0); }
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return memset_any(d, v, 2, n, NULL, 0, 0); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return memset_any(d, v, 4, n, NULL, 0, 0); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return memset_any(d, v, 1, n, s, 1, 0); }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return memset_any(d, v, 2, n, s, 1, 0); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { return memset_any(d, v, 4, n, s, 1, 0); }
EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return memset_any(d, v, 1, n, s, 1, 1); }
EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { return memset_any(d, v, 4, n, s, 1, 1); }

/* ---- modules and functions ---------------------------------------------------------------------------- */
/* How long an image is: the driver takes a bare pointer and reads the format's own header; the bytes must
 * cross the network, so the length is read the same way. ELF (a cubin): the furthest of its section table,
 * program headers and sections. A fat binary: its header's size fields. Anything else is text (PTX, or a
 * test driver's image): up to and with its NUL. 0 = not an image we can measure. */
static size_t image_size(const void *image) {
    const unsigned char *p = image;
    if (memcmp(p, ELFMAG, SELFMAG) == 0 && p[EI_CLASS] == ELFCLASS64) {
        Elf64_Ehdr e;
        memcpy(&e, p, sizeof e);
        uint64_t end = e.e_ehsize;
        if (e.e_shoff + (uint64_t)e.e_shnum * e.e_shentsize > end) end = e.e_shoff + (uint64_t)e.e_shnum * e.e_shentsize;
        if (e.e_phoff + (uint64_t)e.e_phnum * e.e_phentsize > end) end = e.e_phoff + (uint64_t)e.e_phnum * e.e_phentsize;
        for (unsigned i = 0; i < e.e_shnum && e.e_shentsize >= sizeof(Elf64_Shdr); i++) {
            Elf64_Shdr s;
            memcpy(&s, p + e.e_shoff + (uint64_t)i * e.e_shentsize, sizeof s);
            if (s.sh_type != SHT_NOBITS && s.sh_offset + s.sh_size > end) end = s.sh_offset + s.sh_size;
        }
        return end <= GPR_MAX_MSG ? (size_t)end : 0;
    }
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic == 0xba55ed50u) { /* fat binary header: u32 magic, u16 version, u16 header size, u64 body size */
        uint16_t hsize;
        uint64_t fsize;
        memcpy(&hsize, p + 6, 2);
        memcpy(&fsize, p + 8, 8);
        return hsize + fsize <= GPR_MAX_MSG ? (size_t)(hsize + fsize) : 0;
    }
    if (magic == 0x466243b1u) return 0; /* a fat binary wrapper: cuModuleLoadFatBinary's caller unwraps it */
    size_t n = strnlen((const char *)image, GPR_MAX_MSG);
    return n < GPR_MAX_MSG ? n + 1 : 0;
}

static CUresult load(CUmodule *m, const void *image) {
    if (m == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct gctx *c = current();
    if (!valid_ctx(c)) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    size_t n = image_size(image);
    if (n == 0) return GPR_CUDA_ERROR_INVALID_IMAGE;
    uint32_t id = 0;
    size_t got;
    CUresult r = call(c, GPR_OP_MODULE_LOAD, 0, image, n, NULL, 0, &id, 4, &got);
    if (r != CUDA_SUCCESS) return r;
    struct gobj *o = malloc(sizeof *o);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *o = (struct gobj){OBJ_MAGIC, id, c, NULL};
    *m = (CUmodule)o;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) { return load(m, image); }
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *options, void **values) {
    (void)n; (void)options; (void)values; /* JIT options: the server's driver compiles with its defaults */
    return load(m, image);
}
EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fat) { return load(m, fat); }
EXPORT CUresult cuModuleUnload(CUmodule m) {
    struct gobj *o = (struct gobj *)m;
    if (o == NULL || o->magic != OBJ_MAGIC) return GPR_CUDA_ERROR_INVALID_HANDLE;
    CUresult r = call_simple(o->ctx, GPR_OP_MODULE_UNLOAD, &o->id, 4);
    o->magic = 0;
    for (struct gfunc *f = o->funcs, *next; f != NULL; f = next) {
        next = f->next;
        f->magic = 0;
        free(f->layout);
        free(f);
    }
    free(o);
    return r;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    struct gobj *o = (struct gobj *)m;
    if (f == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (o == NULL || o->magic != OBJ_MAGIC) return GPR_CUDA_ERROR_INVALID_HANDLE;
    size_t len = strnlen(name, GPR_MAX_NAME);
    if (len >= GPR_MAX_NAME) return CUDA_ERROR_NOT_FOUND;
    uint32_t out[2 + 2 * GPR_MAX_PARAMS];
    size_t got;
    CUresult r = call(o->ctx, GPR_OP_GET_FUNCTION, 0, &o->id, 4, name, len + 1, out, sizeof out, &got);
    if (r != CUDA_SUCCESS) return r;
    uint32_t n = out[1], count = n == GPR_PARAMS_UNKNOWN ? 0 : n;
    if (got < 8 || count > GPR_MAX_PARAMS || got != 8 + (size_t)count * 8) return GPR_CUDA_ERROR_UNKNOWN;
    for (struct gfunc *known = o->funcs; known != NULL; known = known->next) {
        if (known->id == out[0]) { /* the server said: the same kernel as before, so the same handle */
            *f = (CUfunction)known;
            return CUDA_SUCCESS;
        }
    }
    struct gfunc *fn = calloc(1, sizeof *fn);
    if (fn == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *fn = (struct gfunc){FN_MAGIC, out[0], o->ctx, n, 0, NULL, o->funcs};
    if (count > 0) {
        fn->layout = malloc(count * 8);
        if (fn->layout == NULL) {
            free(fn);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(fn->layout, out + 2, count * 8);
        for (uint32_t i = 0; i < count; i++)
            if (fn->layout[2 * i] + fn->layout[2 * i + 1] > fn->argsize) fn->argsize = fn->layout[2 * i] + fn->layout[2 * i + 1];
    }
    o->funcs = fn;
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}

/* ---- launches ----------------------------------------------------------------------------------------- */
static CUresult launch(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shm, CUstream s,
                       void **params, void **extra, int ptsz) {
    struct gfunc *fn = (struct gfunc *)f;
    if (fn != NULL && fn->magic != FN_MAGIC) return GPR_CUDA_ERROR_INVALID_HANDLE;
    struct gctx *c;
    uint32_t sid;
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    if (r != CUDA_SUCCESS) return r;
    struct gpr_launch l = {fn != NULL ? fn->id : 0, {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]},
                           shm, sid, 0, 0};
    const void *args = NULL;
    size_t nargs = 0;
    unsigned char *packed = NULL;
    if (extra != NULL) {
        /* the caller's own argument block, passed as it is */
        const void *buf = NULL;
        size_t size = 0;
        for (int i = 0; i < 64 && extra[i] != GPR_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == GPR_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
            else if (extra[i] == GPR_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != NULL) size = *(size_t *)extra[i + 1];
            else return CUDA_ERROR_INVALID_VALUE;
        }
        if (buf == NULL || size > 65536) return CUDA_ERROR_INVALID_VALUE;
        l.use_extra = 1;
        args = buf;
        nargs = size;
    } else if (params != NULL && fn != NULL) {
        /* kernelParams is an array of pointers whose count and sizes only the kernel's signature knows: the
         * server's driver described them when the function was looked up */
        if (fn->nparams == GPR_PARAMS_UNKNOWN) return GPR_CUDA_ERROR_NOT_SUPPORTED;
        packed = calloc(1, fn->argsize ? fn->argsize : 1);
        if (packed == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        for (uint32_t i = 0; i < fn->nparams; i++) {
            if (params[i] == NULL) {
                free(packed);
                return CUDA_ERROR_INVALID_VALUE;
            }
            memcpy(packed + fn->layout[2 * i], params[i], fn->layout[2 * i + 1]);
        }
        l.nparams = fn->nparams;
        args = packed;
        nargs = fn->argsize;
    }
    r = call(c, GPR_OP_LAUNCH, GPR_F_NOREPLY, &l, sizeof l, args, nargs, NULL, 0, NULL);
    free(packed);
    return r;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, shm, s, params, extra, 0);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, shm, s, params, extra, 1);
}
static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra, int ptsz) {
    if (cfg == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (cfg->numAttrs > 0) return GPR_CUDA_ERROR_NOT_SUPPORTED; /* attributes are not forwarded (yet) */
    const unsigned g[3] = {cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ};
    const unsigned b[3] = {cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
    return launch(f, g, b, cfg->sharedMemBytes, cfg->hStream, params, extra, ptsz);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    return launch_ex(cfg, f, params, extra, 0);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    return launch_ex(cfg, f, params, extra, 1);
}

/* ---- streams and events ------------------------------------------------------------------------------- */
static CUresult new_obj(uint32_t op, const void *a, size_t alen, void **out) {
    struct gctx *c = current();
    if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_ctx(c)) return GPR_CUDA_ERROR_INVALID_CONTEXT;
    uint32_t id = 0;
    size_t got;
    CUresult r = call(c, op, 0, a, alen, NULL, 0, &id, 4, &got);
    if (r != CUDA_SUCCESS) return r;
    struct gobj *o = malloc(sizeof *o);
    if (o == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *o = (struct gobj){OBJ_MAGIC, id, c, NULL};
    *out = o;
    return CUDA_SUCCESS;
}
static struct gobj *obj(const void *h) {
    struct gobj *o = (struct gobj *)h;
    return o != NULL && o->magic == OBJ_MAGIC ? o : NULL;
}
static CUresult end_obj(void *h, uint32_t op) {
    struct gobj *o = obj(h);
    if (o == NULL) return GPR_CUDA_ERROR_INVALID_HANDLE;
    CUresult r = call_simple(o->ctx, op, &o->id, 4);
    o->magic = 0;
    free(o);
    return r;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int priority) {
    uint32_t a[2] = {flags, (uint32_t)priority};
    return new_obj(GPR_OP_STREAM_CREATE, a, sizeof a, (void **)s);
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) { return cuStreamCreateWithPriority(s, flags, 0); }
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { return end_obj(s, GPR_OP_STREAM_DESTROY); }
static CUresult stream_op(CUstream s, uint32_t op, int ptsz) {
    struct gctx *c;
    uint32_t sid;
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    return r != CUDA_SUCCESS ? r : call_simple(c, op, &sid, 4);
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_op(s, GPR_OP_STREAM_SYNC, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_op(s, GPR_OP_STREAM_SYNC, 1); }
EXPORT CUresult cuStreamQuery(CUstream s) { return stream_op(s, GPR_OP_STREAM_QUERY, 0); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return stream_op(s, GPR_OP_STREAM_QUERY, 1); }
static CUresult wait_event(CUstream s, CUevent e, unsigned flags, int ptsz) {
    struct gctx *c;
    uint32_t sid;
    struct gobj *o = obj(e);
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    if (r != CUDA_SUCCESS) return r;
    if (o == NULL || o->ctx != c) return GPR_CUDA_ERROR_INVALID_HANDLE; /* events do not cross servers */
    uint32_t a[3] = {sid, o->id, flags};
    return call(c, GPR_OP_STREAM_WAIT, GPR_F_NOREPLY, a, sizeof a, NULL, 0, NULL, 0, NULL);
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) { return wait_event(s, e, flags, 0); }
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned flags) { return wait_event(s, e, flags, 1); }

EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    return new_obj(GPR_OP_EVENT_CREATE, &flags, 4, (void **)e);
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) { return end_obj(e, GPR_OP_EVENT_DESTROY); }
static CUresult record(CUevent e, CUstream s, int ptsz) {
    struct gctx *c;
    uint32_t sid;
    struct gobj *o = obj(e);
    CUresult r = stream_ref(s, ptsz, &c, &sid);
    if (r != CUDA_SUCCESS) return r;
    if (o == NULL || o->ctx != c) return GPR_CUDA_ERROR_INVALID_HANDLE;
    uint32_t a[2] = {o->id, sid};
    return call(c, GPR_OP_EVENT_RECORD, GPR_F_NOREPLY, a, sizeof a, NULL, 0, NULL, 0, NULL);
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return record(e, s, 1); }
static CUresult event_op(CUevent e, uint32_t op) {
    struct gobj *o = obj(e);
    return o == NULL ? GPR_CUDA_ERROR_INVALID_HANDLE : call_simple(o->ctx, op, &o->id, 4);
}
EXPORT CUresult cuEventSynchronize(CUevent e) { return event_op(e, GPR_OP_EVENT_SYNC); }
EXPORT CUresult cuEventQuery(CUevent e) { return event_op(e, GPR_OP_EVENT_QUERY); }
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    struct gobj *x = obj(a), *y = obj(b);
    if (ms == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (x == NULL || y == NULL || x->ctx != y->ctx) return GPR_CUDA_ERROR_INVALID_HANDLE;
    uint32_t ids[2] = {x->id, y->id};
    float v = 0;
    size_t got;
    CUresult r = call(x->ctx, GPR_OP_EVENT_ELAPSED, 0, ids, sizeof ids, NULL, 0, &v, 4, &got);
    if (r == CUDA_SUCCESS) *ms = v;
    return r;
}

/* ---- errors ------------------------------------------------------------------------------------------- */
static const struct { int code; const char *name, *text; } errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected (the GPU server cannot be reached)"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure (the connection to the GPU server was lost)"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted (the GPU server refused this share's token)"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported (not forwarded by gpupool's remote mode)"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (errors[i].code == e) {
            *s = errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (errors[i].code == e) {
            *s = errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- entry points that are not forwarded: a clean error, never a missing symbol ----------------------- */
#define NOT_FORWARDED(name, params) \
    EXPORT CUresult name params { return GPR_CUDA_ERROR_NOT_SUPPORTED; }
#define U __attribute__((unused))
NOT_FORWARDED(cuMemAlloc, (U CUdeviceptr_v1 *p, U unsigned n))
NOT_FORWARDED(cuMemFree, (U CUdeviceptr_v1 p))
NOT_FORWARDED(cuMemAllocPitch_v2, (U CUdeviceptr *p, U size_t *pitch, U size_t w, U size_t h, U unsigned e))
NOT_FORWARDED(cuMemAllocPitch, (U CUdeviceptr_v1 *p, U unsigned *pitch, U unsigned w, U unsigned h, U unsigned e))
NOT_FORWARDED(cuMemAllocManaged, (U CUdeviceptr *p, U size_t n, U unsigned flags))
NOT_FORWARDED(cuMemAllocAsync, (U CUdeviceptr *p, U size_t n, U CUstream s))
NOT_FORWARDED(cuMemAllocAsync_ptsz, (U CUdeviceptr *p, U size_t n, U CUstream s))
NOT_FORWARDED(cuMemAllocFromPoolAsync, (U CUdeviceptr *p, U size_t n, U CUmemoryPool pool, U CUstream s))
NOT_FORWARDED(cuMemAllocFromPoolAsync_ptsz, (U CUdeviceptr *p, U size_t n, U CUmemoryPool pool, U CUstream s))
NOT_FORWARDED(cuMemFreeAsync, (U CUdeviceptr p, U CUstream s))
NOT_FORWARDED(cuMemFreeAsync_ptsz, (U CUdeviceptr p, U CUstream s))
NOT_FORWARDED(cuMemPoolCreate, (U CUmemoryPool *pool, U const void *props))
NOT_FORWARDED(cuMemPoolTrimTo, (U CUmemoryPool pool, U size_t keep))
NOT_FORWARDED(cuMemCreate, (U CUmemGenericAllocationHandle *h, U size_t n, U const CUmemAllocationProp *prop,
                            U unsigned long long flags))
NOT_FORWARDED(cuMemRelease, (U CUmemGenericAllocationHandle h))
NOT_FORWARDED(cuArrayCreate_v2, (U CUarray *a, U const CUDA_ARRAY_DESCRIPTOR *d))
NOT_FORWARDED(cuArrayCreate, (U CUarray *a, U const CUDA_ARRAY_DESCRIPTOR_v1 *d))
NOT_FORWARDED(cuArray3DCreate_v2, (U CUarray *a, U const CUDA_ARRAY3D_DESCRIPTOR *d))
NOT_FORWARDED(cuArray3DCreate, (U CUarray *a, U const CUDA_ARRAY3D_DESCRIPTOR_v1 *d))
NOT_FORWARDED(cuMipmappedArrayCreate, (U CUmipmappedArray *a, U const CUDA_ARRAY3D_DESCRIPTOR *d, U unsigned l))
NOT_FORWARDED(cuArrayDestroy, (U CUarray a))
NOT_FORWARDED(cuMipmappedArrayDestroy, (U CUmipmappedArray a))
NOT_FORWARDED(cuDeviceTotalMem, (U unsigned *b, U CUdevice d))
NOT_FORWARDED(cuMemGetInfo, (U unsigned *f, U unsigned *t))
NOT_FORWARDED(cuLaunchCooperativeKernel, (U CUfunction f, U unsigned gx, U unsigned gy, U unsigned gz,
                                          U unsigned bx, U unsigned by, U unsigned bz, U unsigned shm,
                                          U CUstream s, U void **params))
NOT_FORWARDED(cuLaunchCooperativeKernel_ptsz, (U CUfunction f, U unsigned gx, U unsigned gy, U unsigned gz,
                                               U unsigned bx, U unsigned by, U unsigned bz, U unsigned shm,
                                               U CUstream s, U void **params))
NOT_FORWARDED(cuGraphLaunch, (U CUgraphExec g, U CUstream s))
NOT_FORWARDED(cuGraphLaunch_ptsz, (U CUgraphExec g, U CUstream s))
NOT_FORWARDED(cuModuleGetGlobal_v2, (U CUdeviceptr *p, U size_t *n, U CUmodule m, U const char *name))
NOT_FORWARDED(cuMemcpy, (U CUdeviceptr d, U CUdeviceptr s, U size_t n))
NOT_FORWARDED(cuMemcpyAsync, (U CUdeviceptr d, U CUdeviceptr s, U size_t n, U CUstream st))
NOT_FORWARDED(cuMemHostAlloc, (U void **p, U size_t n, U unsigned flags))
NOT_FORWARDED(cuMemHostRegister_v2, (U void *p, U size_t n, U unsigned flags))
NOT_FORWARDED(cuFuncGetAttribute, (U int *v, U int attr, U CUfunction f))
NOT_FORWARDED(cuFuncSetAttribute, (U CUfunction f, U int attr, U int v))
NOT_FORWARDED(cuMemAdvise, (U CUdeviceptr p, U size_t n, U int advice, U CUdevice d))
NOT_FORWARDED(cuMemPrefetchAsync, (U CUdeviceptr p, U size_t n, U CUdevice d, U CUstream s))

/* ---- cuGetProcAddress: our own entry points, by the names the driver answers ---------------------------- */
static const struct { const char *name; void *fn; } exports[] = {
#define E(f) {#f, (void *)f},
    E(cuInit) E(cuDriverGetVersion) E(cuDeviceGetCount) E(cuDeviceGet) E(cuDeviceGetName) E(cuDeviceGetUuid)
    E(cuDeviceGetUuid_v2) E(cuDeviceTotalMem_v2) E(cuDeviceGetAttribute) E(cuDeviceComputeCapability)
    E(cuCtxCreate_v2) E(cuCtxDestroy_v2) E(cuDevicePrimaryCtxRetain) E(cuDevicePrimaryCtxRelease_v2)
    E(cuDevicePrimaryCtxReset_v2) E(cuDevicePrimaryCtxGetState) E(cuDevicePrimaryCtxSetFlags_v2)
    E(cuCtxSetCurrent) E(cuCtxGetCurrent) E(cuCtxPushCurrent_v2) E(cuCtxPopCurrent_v2) E(cuCtxGetDevice)
    E(cuCtxSynchronize) E(cuMemGetInfo_v2) E(cuMemAlloc_v2) E(cuMemFree_v2)
    E(cuMemcpyHtoD_v2) E(cuMemcpyHtoDAsync_v2) E(cuMemcpyHtoDAsync_v2_ptsz) E(cuMemcpyDtoH_v2)
    E(cuMemcpyDtoHAsync_v2) E(cuMemcpyDtoHAsync_v2_ptsz) E(cuMemcpyDtoD_v2) E(cuMemcpyDtoDAsync_v2)
    E(cuMemcpyDtoDAsync_v2_ptsz) E(cuMemsetD8_v2) E(cuMemsetD16_v2) E(cuMemsetD32_v2) E(cuMemsetD8Async)
    E(cuMemsetD16Async) E(cuMemsetD32Async) E(cuMemsetD8Async_ptsz) E(cuMemsetD32Async_ptsz)
    E(cuModuleLoadData) E(cuModuleLoadDataEx) E(cuModuleLoadFatBinary) E(cuModuleUnload) E(cuModuleGetFunction)
    E(cuLaunchKernel) E(cuLaunchKernel_ptsz) E(cuLaunchKernelEx) E(cuLaunchKernelEx_ptsz)
    E(cuStreamCreate) E(cuStreamCreateWithPriority) E(cuStreamDestroy_v2) E(cuStreamSynchronize)
    E(cuStreamSynchronize_ptsz) E(cuStreamQuery) E(cuStreamQuery_ptsz) E(cuStreamWaitEvent) E(cuStreamWaitEvent_ptsz)
    E(cuEventCreate) E(cuEventDestroy_v2) E(cuEventRecord) E(cuEventRecord_ptsz) E(cuEventSynchronize)
    E(cuEventQuery) E(cuEventElapsedTime) E(cuGetErrorString) E(cuGetErrorName)
    E(cuMemAlloc) E(cuMemFree) E(cuMemAllocPitch_v2) E(cuMemAllocPitch) E(cuMemAllocManaged) E(cuMemAllocAsync)
    E(cuMemAllocAsync_ptsz) E(cuMemAllocFromPoolAsync) E(cuMemAllocFromPoolAsync_ptsz) E(cuMemFreeAsync)
    E(cuMemFreeAsync_ptsz) E(cuMemPoolCreate) E(cuMemPoolTrimTo) E(cuMemCreate) E(cuMemRelease)
    E(cuArrayCreate_v2) E(cuArrayCreate) E(cuArray3DCreate_v2) E(cuArray3DCreate) E(cuMipmappedArrayCreate)
    E(cuArrayDestroy) E(cuMipmappedArrayDestroy) E(cuDeviceTotalMem) E(cuMemGetInfo) E(cuLaunchCooperativeKernel)
    E(cuLaunchCooperativeKernel_ptsz) E(cuGraphLaunch) E(cuGraphLaunch_ptsz) E(cuModuleGetGlobal_v2) E(cuMemcpy)
    E(cuMemcpyAsync) E(cuMemHostAlloc) E(cuMemHostRegister_v2) E(cuFuncGetAttribute) E(cuFuncSetAttribute)
    E(cuMemAdvise) E(cuMemPrefetchAsync)
#undef E
};

static void *own(const char *name) {
    for (size_t i = 0; i < sizeof exports / sizeof exports[0]; i++)
        if (strcmp(exports[i].name, name) == 0) return exports[i].fn;
    return NULL;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

/* As the driver does: a base name, the caller's CUDA version (the _v2 ABI from 3.2 on) and the per-thread
 * flag (the _ptsz/_ptds forms) pick the entry point. */
static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (!strcmp(symbol, "cuGetProcAddress")) *pfn = (void *)(version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress);
    char name[192];
    static const char *const per_thread[] = {"%s_v2_ptsz", "%s_ptsz", "%s_v2_ptds", "%s_ptds"};
    for (size_t i = 0; *pfn == NULL && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && i < 4; i++) {
        snprintf(name, sizeof name, per_thread[i], symbol);
        *pfn = own(name);
    }
    if (*pfn == NULL && version >= 3020) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        *pfn = own(name);
    }
    if (*pfn == NULL) *pfn = own(symbol);
    return *pfn != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return lookup(symbol, pfn, version, flags);
}
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    CUresult r = lookup(symbol, pfn, version, flags);
    if (status != NULL) *status = r == CUDA_SUCCESS ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return r;
}
