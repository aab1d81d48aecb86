/* The listener: accepts connections and forks a child for each, which checks the client's token and execs
 * this program again as that connection's worker, under the share's limits file. The listener itself
 * never touches the GPU. */
#include "gpr_srv.h"
#include "../gp.h" /* struct gp_limits: the share's limits file */

#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

extern char **environ;

static const struct gpr_options *opt;
static volatile sig_atomic_t children;    /* live children: being admitted or serving */

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) children--;
    errno = saved;
}

/* The share directory of a token, from the token file (re-read at every connection, so tokens are
 * revoked by editing it). 0 = found. */
static int lookup_token(const char *token, size_t len, char *share, size_t size) {
    int fd = open(opt->tokens, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        gpr_say("cannot open the token file: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        gpr_say("the token file must belong to the server's user and be private to it (mode 0600)");
        close(fd);
        return -1;
    }
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        close(fd);
        return -1;
    }
    char line[4096];
    int found = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        char *tok = strtok(line, " \t\r\n");
        char *dir = strtok(NULL, "\r\n");
        if (tok == NULL || dir == NULL || tok[0] == '#') continue;
        while (*dir == ' ' || *dir == '\t') dir++;
        size_t tl = strlen(tok);
        /* compared over the whole length whatever matches, so timing says nothing about the token */
        unsigned diff = (unsigned)(tl ^ len);
        for (size_t i = 0; i < len; i++) diff |= (unsigned char)(tok[i < tl ? i : 0] ^ token[i]);
        if (diff == 0 && found != 0 && strlen(dir) < size) {
            snprintf(share, size, "%s", dir);
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* CUDA_VISIBLE_DEVICES=<the share's GPUs> from its limits file: a worker sees only the GPUs its share is on.
 * The library caps whatever device a one-GPU share uses (it matches it by ordinal), so without this a share
 * allocated on one GPU could run on any GPU of the node. A file that names no UUID (matched by ordinal, as
 * the agent never writes for a claim) leaves the server's own view. */
static char visible[sizeof "CUDA_VISIBLE_DEVICES=" + GP_MAX_DEV * 64];

static int share_gpus(int fd, const char *share) {
    struct gp_limits l;
    visible[0] = '\0';
    if (pread(fd, &l, sizeof l, 0) != (ssize_t)sizeof l || l.magic != GP_LIMITS_MAGIC ||
        l.version != GP_LIMITS_VERSION || l.ndev > GP_MAX_DEV) {
        gpr_say("share %s: its limits file is not one gpupool wrote: refused", share);
        return -1;
    }
    size_t at = (size_t)snprintf(visible, sizeof visible, "CUDA_VISIBLE_DEVICES=");
    for (uint32_t i = 0; i < l.ndev && l.uuid[i][0] != '\0'; i++) {
        l.uuid[i][sizeof l.uuid[i] - 1] = '\0';
        if (strpbrk(l.uuid[i], ",=") != NULL) {
            gpr_say("share %s: GPU %u's UUID is malformed: refused", share, i);
            return -1;
        }
        at += (size_t)snprintf(visible + at, sizeof visible - at, "%s%s", i ? "," : "", l.uuid[i]);
    }
    if (l.ndev == 0 || l.uuid[0][0] == '\0') visible[0] = '\0';
    return 0;
}

static int place_limits(const char *share) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/limits/limits.v1", share);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        gpr_say("share %s has no limits file (%s): refused", share, strerror(errno));
        return -1;
    }
    if (share_gpus(fd, share) != 0) {
        close(fd);
        return -1;
    }
    if (opt->limits_fd >= 0) {
        if (dup2(fd, opt->limits_fd) < 0) return -1; /* dup2 clears close-on-exec: the worker inherits it */
        close(fd);
        return 0;
    }
    close(fd);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/limits", share);
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        gpr_say("cannot make a mount namespace for the share's limits (%s): refused", strerror(errno));
        return -1;
    }
    mkdir("/run/gpupool", 0755);
    mkdir("/run/gpupool/limits", 0755);
    if (mount(dir, "/run/gpupool/limits", NULL, MS_BIND, NULL) != 0 ||
        mount(NULL, "/run/gpupool/limits", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) != 0) {
        gpr_say("cannot mount the share's limits (%s): refused", strerror(errno));
        return -1;
    }
    return 0;
}

/* The child for one connection: hello, token, then exec as the worker (or a refusal). */
static void admit(int fd, const char *self) {
    struct gpr_hdr h;
    uint32_t head[3];
    char token[GPR_MAX_TOKEN];
    int64_t deadline = gpr_now_ms() + HELLO_TIMEOUT_MS;
    if (gpr_read_full(fd, &h, sizeof h, deadline) != 0) _exit(0);
    if (h.op_or_result != GPR_OP_HELLO || h.len < sizeof head || h.len > sizeof head + GPR_MAX_TOKEN) {
        gpr_reply(fd, GPR_E_PROTOCOL, NULL, 0);
        _exit(0);
    }
    if (gpr_read_full(fd, head, sizeof head, deadline) != 0) _exit(0);
    uint32_t tlen = h.len - (uint32_t)sizeof head;
    if (head[0] != GPR_MAGIC || head[2] != tlen || gpr_read_full(fd, token, tlen, deadline) != 0) {
        gpr_reply(fd, GPR_E_PROTOCOL, NULL, 0);
        _exit(0);
    }
    if (head[1] != GPR_VERSION) {
        gpr_say("a client speaks protocol version %u, this server %u: refused", head[1], GPR_VERSION);
        gpr_reply(fd, GPR_CUDA_ERROR_NOT_SUPPORTED, NULL, 0);
        _exit(0);
    }
    char share[1024];
    if (tlen == 0 || lookup_token(token, tlen, share, sizeof share) != 0) {
        gpr_say("a client with an unknown token: refused");
        gpr_reply(fd, GPR_CUDA_ERROR_NOT_PERMITTED, NULL, 0);
        _exit(0);
    }
    if (place_limits(share) != 0) {
        gpr_reply(fd, GPR_CUDA_ERROR_NOT_PERMITTED, NULL, 0);
        _exit(0);
    }
    /* The worker's environment: the server's, less anything gpupool's library would read as a limit or a
     * place (those come from the share), plus the library itself. */
    size_t n = 0;
    while (environ[n] != NULL) n++;
    char **env = calloc(n + 5, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "GPUPOOL_", 8) != 0 && strncmp(environ[i], "LD_PRELOAD=", 11) != 0 &&
            (visible[0] == '\0' || strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) != 0))
            env[k++] = environ[i];
    if (visible[0] != '\0') env[k++] = visible;
    char preload[PATH_MAX + 16], hookdir[1100];
    if (opt->hook != NULL) {
        snprintf(preload, sizeof preload, "LD_PRELOAD=%s", opt->hook);
        env[k++] = preload;
    }
    snprintf(hookdir, sizeof hookdir, "GPUPOOL_REMOTE_SHARE=%s", share);
    env[k++] = hookdir;
    env[k] = NULL;
    int fl = fcntl(fd, F_GETFD);
    fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    char timeout[32];
    snprintf(timeout, sizeof timeout, "%lld", (long long)opt->msg_timeout_ms);
    char *argv[] = {GPR_SERVER_NAME, "--worker", fdarg, "--cuda", (char *)opt->cuda, "--message-timeout-ms", timeout,
                    NULL};
    execve(self, argv, env);
    gpr_say("cannot start the worker: %s", strerror(errno));
    gpr_reply(fd, GPR_CUDA_ERROR_UNKNOWN, NULL, 0);
    _exit(3);
}

static void tune(int fd, int tcp) {
    if (!tcp) return;
    int one = 1, idle = 10, intvl = 5, cnt = 3;
    unsigned user_timeout = 30000;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

static int listen_on(const char *spec, int *tcp) {
    int fd = -1;
    *tcp = 0;
    if (strncmp(spec, "unix:", 5) == 0) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(spec + 5) >= sizeof a.sun_path) return -1;
        strcpy(a.sun_path, spec + 5);
        unlink(a.sun_path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0) return -1;
        chmod(a.sun_path, 0666); /* the token, not the socket's mode, decides who is served */
        printf("listening unix:%s\n", a.sun_path);
    } else if (strncmp(spec, "tcp:", 4) == 0) {
        char host[256];
        snprintf(host, sizeof host, "%s", spec + 4);
        char *colon = strrchr(host, ':');
        if (colon == NULL) return -1;
        *colon = '\0';
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
        if (getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai) != 0) return -1;
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            freeaddrinfo(ai);
            return -1;
        }
        freeaddrinfo(ai);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        int port = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                           : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        printf("listening tcp:%s:%d\n", host, port); /* port 0 asks for any: the line says which */
        *tcp = 1;
    } else {
        return -1;
    }
    fflush(stdout);
    return fd;
}

int gpr_serve(const char *listen_spec, const struct gpr_options *options) {
    opt = options;
    if (opt->hook == NULL) gpr_say("no --hook: shares run without gpupool's memory cap and compute pacing");
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return 3;
    self[sl] = '\0';
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child; /* reaps, and counts what is served */
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int tcp;
    int lfd = listen_on(listen_spec, &tcp);
    if (lfd < 0) {
        gpr_say("cannot listen on %s: %s", listen_spec, strerror(errno));
        return 3;
    }
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EINTR) usleep(10000); /* out of descriptors: wait, do not spin */
            continue;
        }
        if (children >= opt->max_clients) {
            /* full: the client reads EOF at its hello and reports no device; nothing is forked for it */
            static int64_t said;
            if (gpr_now_ms() - said > 10000) {
                gpr_say("%d clients are being served (--max-clients): refusing connections", opt->max_clients);
                said = gpr_now_ms();
            }
            close(fd);
            continue;
        }
        tune(fd, tcp);
        sigprocmask(SIG_BLOCK, &chld, &old); /* the count and the fork agree even if a child ends at once */
        pid_t pid = fork();
        if (pid == 0) {
            sigprocmask(SIG_SETMASK, &old, NULL);
            close(lfd);
            signal(SIGCHLD, SIG_DFL);
            admit(fd, self);
        }
        if (pid > 0) children++;
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(fd);
    }
}
