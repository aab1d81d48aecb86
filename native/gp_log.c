/* The library's log line: on stderr, marked as ours and with the process, because it speaks inside the
 * tenant's program and its lines mix with the program's own. GPUPOOL_HOOK_LOG=0 silences it (gp_config.c
 * reads the environment, once). */
#include "gp_core.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static int log_level = 1;

void gp_log_set_level(int level) { log_level = level; }

void gp_log(const char *fmt, ...) {
    if (log_level <= 0) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpupool-hook[%d]: %s\n", (int)getpid(), buf);
}
