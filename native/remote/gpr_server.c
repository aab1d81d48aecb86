/* gpupool-gpu-server: runs the CUDA driver calls of remote clients (gpr_client.c) on this node's GPUs.
 *
 *   gpupool-gpu-server --listen tcp:HOST:PORT|unix:PATH --tokens FILE [--hook LIB] [--cuda LIB]
 *                      [--limits-fd N] [--message-timeout-ms MS] [--max-clients N]
 *
 * The listener never touches the GPU. Each connection gets a child that reads the hello, checks the token
 * against FILE (lines "TOKEN SHARE_DIR"; the file must belong to the server's user and be private to it),
 * then execs this program again as that connection's worker, with gpupool's interception library
 * preloaded and the share's limits file where the library reads it: the share's memory cap and compute
 * pacing are then the very code and limits a local `hook` container runs under, in a process the tenant
 * cannot reach. One process per connection (= per client context) means everything a client holds on the
 * GPU is released by the kernel and the driver when that process exits, whichever way its client went.
 *
 * Where the limits file goes: by default into a private mount namespace of the worker, bound read-only on
 * /run/gpupool/limits (the path the production library reads; needs CAP_SYS_ADMIN, as the agent has).
 * --limits-fd N instead hands it over as descriptor N, for a library built with
 * GP_LIMITS_PATH=/proc/self/fd/N (the native tests' build). *
 * This file is the program's options; the files it is made of are listed in gpr_srv.h. */

#include "gpr_srv.h"

#include <stdio.h>
#include <stdlib.h>

static void usage(void) {
    fprintf(stderr, "usage: %s --listen tcp:HOST:PORT|unix:PATH --tokens FILE [--hook LIB] [--cuda LIB]\n"
                    "       [--limits-fd N] [--message-timeout-ms MS] [--max-clients N]\n", GPR_SERVER_NAME);
    exit(2);
}

int main(int argc, char **argv) {
    const char *listen_spec = NULL;
    int worker_fd = -1;
    struct gpr_options o = {.cuda = "libcuda.so.1", .limits_fd = -1, .max_clients = 256, .msg_timeout_ms = 30000};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) usage();
        if (!strcmp(a, "--listen")) listen_spec = v;
        else if (!strcmp(a, "--tokens")) o.tokens = v;
        else if (!strcmp(a, "--hook")) o.hook = v;
        else if (!strcmp(a, "--cuda")) o.cuda = v;
        else if (!strcmp(a, "--limits-fd")) o.limits_fd = atoi(v);
        else if (!strcmp(a, "--message-timeout-ms")) o.msg_timeout_ms = atoll(v) > 0 ? atoll(v) : 30000;
        else if (!strcmp(a, "--worker")) worker_fd = atoi(v);
        else if (!strcmp(a, "--max-clients")) o.max_clients = atoi(v) > 0 ? atoi(v) : 256; /* served at once */
        else usage();
        i++;
    }
    if (worker_fd >= 0) return gpr_worker(worker_fd, o.cuda, o.msg_timeout_ms);
    if (listen_spec == NULL || o.tokens == NULL) usage();
    return gpr_serve(listen_spec, &o);
}
