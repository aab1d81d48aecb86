/* After fork the child shares its parent's open file descriptions (hence its locks on the pod's accounting)
 * and holds none of its device memory: it claims its own slot and starts with an empty table. Registered
 * from a constructor that does nothing else, because under /etc/ld.so.preload every program of the
 * container loads this library, GPU or not. */
#include "gph.h"

static void after_fork_child(void) {
    gp_shared_after_fork();
    gph_mem_after_fork();
    gph_cu_after_fork();
}

__attribute__((constructor)) static void gph_constructor(void) { pthread_atfork(NULL, NULL, after_fork_child); }
