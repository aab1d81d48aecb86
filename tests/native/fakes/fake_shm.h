/* The state a fake runtime shares between a test's processes: a file named by the test, mapped shared, set to
 * zero with its magic the first time (or after a different layout); without a file, or if it cannot be mapped,
 * private memory, so a lone process still runs. Shared by the fake HIP and HSA runtimes. */
#ifndef FAKE_SHM_H
#define FAKE_SHM_H

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Maps `size` bytes whose first 8 are the layout's `magic`; *fd is the file's descriptor (-1: private). */
static inline void *fk_map_shared(const char *path, size_t size, uint64_t magic, int *fd) {
    void *p = MAP_FAILED;
    *fd = -1;
    if (path != NULL && *path) {
        *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (*fd >= 0) {
            flock(*fd, LOCK_EX);
            struct stat s;
            if (fstat(*fd, &s) == 0 && (s.st_size >= (off_t)size || ftruncate(*fd, (off_t)size) == 0))
                p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
            if (p != MAP_FAILED && *(uint64_t *)p != magic) {
                memset(p, 0, size);
                *(uint64_t *)p = magic;
            }
            flock(*fd, LOCK_UN);
        }
    }
    if (p == MAP_FAILED) {
        if (*fd >= 0) close(*fd);
        *fd = -1;
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) abort();
        *(uint64_t *)p = magic;
    }
    return p;
}

#endif
