/* After fork the child shares its parent's open file descriptions (hence its locks) and has only the forking
 * thread: every module that keeps per-process state starts afresh in the child. Registered from a
 * constructor that does nothing else, because under /etc/ld.so.preload every program of the container
 * loads this library, GPU or not. */
#include "gp.h"

static void after_fork_child(void) {
    gp_shared_after_fork();
    gp_mem_after_fork();
    gp_compute_after_fork();
    gp_ident_after_fork();
}

__attribute__((constructor)) static void gp_constructor(void) {
    pthread_atfork(NULL, NULL, after_fork_child);
}
