/* The worker: one client's connection, after the listener admitted it and exec'd this program again with
 * gpupool's interception library preloaded. Reads requests, runs each (gpr_srv_dispatch.c), replies;
 * moves the client to another server when an administrator asks (SIGUSR1). */
#include "gpr_srv.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static uint32_t deferred;          /* the first error of a request that got no reply, not yet reported */
static volatile sig_atomic_t move_asked; /* SIGUSR1: move this client to the server named in SHARE/move-to */
static unsigned char *in;          /* the request being handled (static: reachable to the end) */
static size_t incap;

/* The worker's reads go through a buffer: a pipelined client's requests arrive many to a segment, and one
 * recv then serves them all. deadline_ms as gpr_read_full's. */
static unsigned char rbuf[65536];
static size_t rpos, rlen;
static int buffered_read(int fd, void *dst, size_t n, int64_t deadline_ms) {
    unsigned char *d = dst;
    while (n > 0) {
        if (rpos < rlen) {
            size_t k = rlen - rpos < n ? rlen - rpos : n;
            memcpy(d, rbuf + rpos, k);
            rpos += k;
            d += k;
            n -= k;
            continue;
        }
        if (n >= sizeof rbuf / 2) return gpr_read_full(fd, d, n, deadline_ms); /* bulk data: straight in */
        if (deadline_ms >= 0) {
            int64_t left = deadline_ms - gpr_now_ms();
            struct pollfd pf = {fd, POLLIN, 0};
            if (left <= 0) return -1;
            int r = poll(&pf, 1, left > 1000000 ? 1000000 : (int)left);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return -1;
        }
        ssize_t got = recv(fd, rbuf, sizeof rbuf, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        rpos = 0;
        rlen = (size_t)got;
    }
    return 0;
}

/* Where an administrator asked this share's clients to move: SHARE/move-to (one address), read when the
 * worker is signalled (SIGUSR1). 0 = a target. */
static int move_target(char *out) {
    const char *share = getenv("GPUPOOL_REMOTE_SHARE");
    if (share == NULL) return -1;
    char path[1200];
    snprintf(path, sizeof path, "%s/move-to", share);
    FILE *f = fopen(path, "re");
    if (f == NULL) return -1;
    int ok = fgets(out, GPR_MAX_ADDR, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    out[strcspn(out, " \r\n")] = '\0';
    return strncmp(out, "tcp:", 4) == 0 || strncmp(out, "unix:", 5) == 0 ? 0 : -1;
}

static void on_move(int sig) {
    (void)sig;
    move_asked = 1;
}

int gpr_worker(int fd, const char *cuda, int64_t msg_timeout_ms) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_move;
    sa.sa_flags = SA_RESTART; /* a signal must not end a read: the read helpers treat EINTR as "go on" */
    sigaction(SIGUSR1, &sa, NULL);
    gpr_load_driver(cuda);
    if (gpr_drv.Init == NULL || gpr_drv.Init(0) != CUDA_SUCCESS) {
        gpr_say("the driver does not initialise");
        gpr_reply(fd, GPR_CUDA_ERROR_NO_DEVICE, NULL, 0);
        return 3;
    }
    uint32_t hello[2] = {GPR_VERSION, (uint32_t)getpid()};
    if (gpr_reply(fd, CUDA_SUCCESS, hello, sizeof hello) != 0) return 0;
    for (;;) {
        struct gpr_hdr h;
        /* Idle as long as the client likes (keepalive finds a vanished peer); once a message has begun,
         * the rest must follow within the message timeout, so a stalled sender cannot pin the worker. */
        if (buffered_read(fd, &h, 1, -1) != 0) return 0;
        if (buffered_read(fd, (char *)&h + 1, sizeof h - 1, gpr_now_ms() + msg_timeout_ms) != 0) return 0;
        if (h.len > GPR_MAX_MSG + 4096 || h.op_or_result == 0 || h.op_or_result == GPR_OP_HELLO) {
            gpr_say("a message of %u bytes, op %u: not a request; hanging up", h.len, h.op_or_result);
            gpr_reply(fd, GPR_E_PROTOCOL, NULL, 0);
            return 0;
        }
        if (h.len + 16u > incap) {
            size_t want = h.len + 16u;
            unsigned char *p = realloc(in, want);
            if (p == NULL) {
                gpr_reply(fd, GPR_E_PROTOCOL, NULL, 0);
                return 0;
            }
            in = p;
            incap = want;
        }
        if (h.len > 0 && buffered_read(fd, in, h.len, gpr_now_ms() + msg_timeout_ms) != 0) return 0;
        in[h.len] = '\0'; /* a name or PTX image read as a string ends in the buffer even if the sender cut it */
        struct gpr_rd r = {in, h.len, 0};
        uint32_t olen = 0;
        if (move_asked && !(h.flags & GPR_F_NOREPLY) && gpr_ctx != NULL && deferred == 0) {
            move_asked = 0;
            char target[GPR_MAX_ADDR];
            if (move_target(target) == 0 && CALL(CtxSynchronize) == CUDA_SUCCESS) {
                /* the client is waiting on this reply and sends nothing else: its work so far has run here */
                gpr_say("moving this client to %s", target);
                if (gpr_reply(fd, GPR_R_MOVED, target, (uint32_t)strlen(target) + 1) != 0) return 0;
                continue;
            }
        }
        uint32_t res = gpr_handle(h.op_or_result, &r, &olen);
        if (h.flags & GPR_F_NOREPLY) {
            if (res != CUDA_SUCCESS && deferred == 0) deferred = res;
            continue;
        }
        if (deferred != 0 && res == CUDA_SUCCESS) {
            res = deferred; /* an earlier asynchronous failure, reported where the program next waits */
            olen = 0;
        }
        deferred = 0;
        if (gpr_reply(fd, res, gpr_outbuf, olen) != 0) return 0;
    }
}
