/* How every part of the server speaks: its log line, a reply to the client, and the one buffer replies are
 * built in (grown to the largest reply so far, never freed: a worker lives as long as its one client). */
#include "gpr_srv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void gpr_say(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s[%d]: %s\n", GPR_SERVER_NAME, (int)getpid(), line);
}

int gpr_reply(int fd, uint32_t result, const void *data, uint32_t len) {
    struct gpr_hdr h = {result, 0, len};
    if (len > 0 && len <= 4096) { /* small replies leave in one write: one wake-up of the client, not two */
        unsigned char one[sizeof h + 4096];
        memcpy(one, &h, sizeof h);
        memcpy(one + sizeof h, data, len);
        return gpr_write_full(fd, one, sizeof h + len);
    }
    if (gpr_write_full(fd, &h, sizeof h) != 0) return -1;
    return len > 0 ? gpr_write_full(fd, data, len) : 0;
}

unsigned char *gpr_outbuf;
static size_t outcap;
unsigned char *gpr_out_room(size_t n) {
    if (n > outcap) {
        unsigned char *p = realloc(gpr_outbuf, n);
        if (p == NULL) return NULL;
        gpr_outbuf = p;
        outcap = n;
    }
    return gpr_outbuf;
}
