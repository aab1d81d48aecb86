/* A CUDA "application" for remote mode's tests and benchmark: linked against libcuda.so.1, which is the fake
 * driver when it runs locally and libgpupool_remote.so when it runs through the forwarder. It reads one
 * command a line on stdin and answers one line, so Python drives it and checks every value itself.
 * Buffers and handles are named by the program's own numbers (slots), never by driver values, except `ptr`.
 *   ctx                         -> "<rc>"  cuInit + cuCtxCreate (primary: cuDevicePrimaryCtxRetain + SetCurrent)
 *   primary                     -> "<rc>"
 *   alloc SLOT BYTES            -> "<rc>"            free SLOT -> "<rc>"      ptr SLOT -> "<rc> <pointer>"
 *   write SLOT OFF ASYNC STREAM HEX       -> "<rc>"  cuMemcpyHtoD(Async) of the bytes HEX at buffer + OFF
 *   read SLOT OFF BYTES ASYNC STREAM      -> "<rc> <hex>"
 *   dtod DST SRC BYTES ASYNC STREAM       -> "<rc>"
 *   memset SIZE SLOT VALUE COUNT ASYNC STREAM -> "<rc>"  (SIZE 8, 16 or 32)
 *   load TEXT                   -> "<rc>"  cuModuleLoadData of the text (the fake's module images)
 *   unload                      -> "<rc>"
 *   func NAME                   -> "<rc>"  cuModuleGetFunction into the current function
 *   add SLOT N VALUE HOW STREAM -> "<rc>"  launch add_u32(buffer, N, VALUE); HOW = params | extra
 *   axpy A X Y N HOW STREAM     -> "<rc>"  launch axpy_u32(A, buffer X, buffer Y, N)
 *   spin US STREAM              -> "<rc>"
 *   adds SLOT N COUNT STREAM    -> "<rc>"  COUNT launches of add_u32(+1) back to back, then nothing else
 *   stream SLOT                 -> "<rc>"  a new stream in stream slot SLOT (1..15; 0 is the NULL stream)
 *   sdestroy SLOT / ssync SLOT / squery SLOT -> "<rc>"
 *   event SLOT / record E S / esync E / equery E / elapsed A B (-> "<rc> <microseconds>") / edestroy E
 *   wait S E                    -> "<rc>"  cuStreamWaitEvent
 *   sync                        -> "<rc>"  cuCtxSynchronize       info -> "<rc> <free> <total>"
 *   tsync                       -> "<rc> <ns>"  one cuCtxSynchronize, timed (a migration's pause happens in one)
 *   dev                         -> "<rc> <count> <cc major> <cc minor> <total> <name with _ for spaces>"
 *   gpa NAME                    -> "<rc>"  cuGetProcAddress_v2(NAME, 12040, 0)
 *   managed                     -> "<rc>"  cuMemAllocManaged through cuGetProcAddress (not forwarded)
 *   errname RC                  -> "<rc> <name>"
 *   rtt N                       -> "<rc> <p50 ns> <p99 ns>"  N cuCtxSynchronize calls, each timed
 *   copy BYTES REPS             -> "<rc> <h2d ns> <d2h ns>"  best of REPS copies each way
 *   big BYTES SEED ASYNC        -> "<rc> <1 if what came back is what went>"  a pattern through H2D and D2H */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../../native/gpupool_cuda.h"

typedef struct CUmod_st *CUmodule;
CUresult cuInit(unsigned);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD16_v2(CUdeviceptr, unsigned short, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD16Async(CUdeviceptr, unsigned short, size_t, CUstream);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned, size_t, CUstream);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamQuery(CUstream);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuEventQuery(CUevent);
CUresult cuEventElapsedTime(float *, CUevent, CUevent);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static CUdeviceptr bufs[64];
static CUstream streams[16];
static CUevent events[16];
static CUmodule module;
static CUfunction func;
static char hexbuf[(16 << 20) + 64];
static unsigned char data[(8 << 20) + 64];

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}
static size_t unhex(const char *h, unsigned char *out, size_t max) {
    size_t n = 0;
    while (h[0] && h[1] && h[0] != '\n' && n < max) {
        unsigned v;
        if (sscanf(h, "%2x", &v) != 1) break;
        out[n++] = (unsigned char)v;
        h += 2;
    }
    return n;
}
static CUstream S(unsigned i) { return i < 16 ? streams[i] : NULL; }

static CUresult launch(const char *how, void **params, const void *block, size_t blen, unsigned stream) {
    if (!strcmp(how, "extra")) {
        void *extra[] = {(void *)1, (void *)block, (void *)2, &blen, (void *)0};
        return cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, S(stream), NULL, extra);
    }
    return cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, S(stream), params, NULL);
}

int main(void) {
    static char line[(16 << 20) + 256];
    char word[64], text[1024];
    unsigned a, b, c, d, e;
    unsigned long long x, y;
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin) != NULL) {
        CUresult r = 0;
        if (!strncmp(line, "ctx", 3)) {
            CUcontext ctx;
            r = cuInit(0);
            if (r == 0) r = cuCtxCreate_v2(&ctx, 0, 0);
            printf("%d\n", r);
        } else if (!strncmp(line, "primary", 7)) {
            CUcontext ctx;
            r = cuInit(0);
            if (r == 0) r = cuDevicePrimaryCtxRetain(&ctx, 0);
            if (r == 0) r = cuCtxSetCurrent(ctx);
            printf("%d\n", r);
        } else if (sscanf(line, "alloc %u %llu", &a, &x) == 2 && a < 64) {
            printf("%d\n", cuMemAlloc_v2(&bufs[a], x));
        } else if (sscanf(line, "free %u", &a) == 1 && a < 64) {
            printf("%d\n", cuMemFree_v2(bufs[a]));
        } else if (sscanf(line, "ptr %u", &a) == 1 && a < 64) {
            printf("0 %llu\n", (unsigned long long)bufs[a]);
        } else if (sscanf(line, "write %u %llu %u %u %16777215s", &a, &x, &b, &c, hexbuf) == 5 && a < 64) {
            size_t n = unhex(hexbuf, data, sizeof data);
            r = b ? cuMemcpyHtoDAsync_v2(bufs[a] + x, data, n, S(c)) : cuMemcpyHtoD_v2(bufs[a] + x, data, n);
            printf("%d\n", r);
        } else if (sscanf(line, "read %u %llu %llu %u %u", &a, &x, &y, &b, &c) == 5 && a < 64 && y <= sizeof data) {
            r = b ? cuMemcpyDtoHAsync_v2(data, bufs[a] + x, y, S(c)) : cuMemcpyDtoH_v2(data, bufs[a] + x, y);
            if (b && r == 0) r = cuStreamSynchronize(S(c));
            printf("%d ", r);
            for (size_t i = 0; i < y; i++) printf("%02x", data[i]);
            printf("\n");
        } else if (sscanf(line, "dtod %u %u %llu %u %u", &a, &b, &x, &c, &d) == 5 && a < 64 && b < 64) {
            r = c ? cuMemcpyDtoDAsync_v2(bufs[a], bufs[b], x, S(d)) : cuMemcpyDtoD_v2(bufs[a], bufs[b], x);
            printf("%d\n", r);
        } else if (sscanf(line, "memset %u %u %u %llu %u %u", &a, &b, &c, &x, &d, &e) == 6 && b < 64) {
            CUdeviceptr p = bufs[b];
            if (a == 8) r = d ? cuMemsetD8Async(p, (unsigned char)c, x, S(e)) : cuMemsetD8_v2(p, (unsigned char)c, x);
            else if (a == 16) r = d ? cuMemsetD16Async(p, (unsigned short)c, x, S(e)) : cuMemsetD16_v2(p, (unsigned short)c, x);
            else r = d ? cuMemsetD32Async(p, c, x, S(e)) : cuMemsetD32_v2(p, c, x);
            printf("%d\n", r);
        } else if (sscanf(line, "load %1023s", text) == 1) {
            printf("%d\n", cuModuleLoadData(&module, text));
        } else if (!strncmp(line, "unload", 6)) {
            printf("%d\n", cuModuleUnload(module));
        } else if (sscanf(line, "func %1023s", text) == 1) {
            func = NULL;
            printf("%d\n", cuModuleGetFunction(&func, module, text));
        } else if (sscanf(line, "add %u %u %u %63s %u", &a, &b, &c, word, &d) == 5 && a < 64) {
            CUdeviceptr p = bufs[a];
            uint32_t n = b, v = c;
            void *params[] = {&p, &n, &v};
            unsigned char block[16];
            memcpy(block, &p, 8);
            memcpy(block + 8, &n, 4);
            memcpy(block + 12, &v, 4);
            printf("%d\n", launch(word, params, block, sizeof block, d));
        } else if (sscanf(line, "axpy %u %u %u %u %63s %u", &a, &b, &c, &d, word, &e) == 6 && b < 64 && c < 64) {
            uint32_t k = a, n = d;
            CUdeviceptr px = bufs[b], py = bufs[c];
            void *params[] = {&k, &px, &py, &n};
            unsigned char block[32] = {0};
            memcpy(block, &k, 4);
            memcpy(block + 8, &px, 8);
            memcpy(block + 16, &py, 8);
            memcpy(block + 24, &n, 4);
            printf("%d\n", launch(word, params, block, 28, e));
        } else if (sscanf(line, "spin %llu %u", &x, &a) == 2) {
            uint64_t us = x;
            void *params[] = {&us};
            printf("%d\n", cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, S(a), params, NULL));
        } else if (sscanf(line, "adds %u %u %u %u", &a, &b, &c, &d) == 4 && a < 64) {
            CUdeviceptr p = bufs[a];
            uint32_t n = b, v = 1;
            void *params[] = {&p, &n, &v};
            for (unsigned i = 0; i < c && r == 0; i++) r = cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, S(d), params, NULL);
            printf("%d\n", r);
        } else if (sscanf(line, "stream %u", &a) == 1 && a > 0 && a < 16) {
            printf("%d\n", cuStreamCreate(&streams[a], 0));
        } else if (sscanf(line, "sdestroy %u", &a) == 1 && a < 16) {
            printf("%d\n", cuStreamDestroy_v2(streams[a]));
        } else if (sscanf(line, "ssync %u", &a) == 1) {
            printf("%d\n", cuStreamSynchronize(S(a)));
        } else if (sscanf(line, "squery %u", &a) == 1) {
            printf("%d\n", cuStreamQuery(S(a)));
        } else if (sscanf(line, "event %u", &a) == 1 && a < 16) {
            printf("%d\n", cuEventCreate(&events[a], 0));
        } else if (sscanf(line, "record %u %u", &a, &b) == 2 && a < 16) {
            printf("%d\n", cuEventRecord(events[a], S(b)));
        } else if (sscanf(line, "esync %u", &a) == 1 && a < 16) {
            printf("%d\n", cuEventSynchronize(events[a]));
        } else if (sscanf(line, "equery %u", &a) == 1 && a < 16) {
            printf("%d\n", cuEventQuery(events[a]));
        } else if (sscanf(line, "edestroy %u", &a) == 1 && a < 16) {
            printf("%d\n", cuEventDestroy_v2(events[a]));
        } else if (sscanf(line, "elapsed %u %u", &a, &b) == 2 && a < 16 && b < 16) {
            float ms = 0;
            r = cuEventElapsedTime(&ms, events[a], events[b]);
            printf("%d %lld\n", r, (long long)(ms * 1000.0f + 0.5f));
        } else if (sscanf(line, "wait %u %u", &a, &b) == 2 && b < 16) {
            printf("%d\n", cuStreamWaitEvent(S(a), events[b], 0));
        } else if (!strncmp(line, "tsync", 5)) {
            int64_t t0 = now_ns();
            r = cuCtxSynchronize();
            printf("%d %lld\n", r, (long long)(now_ns() - t0));
        } else if (!strncmp(line, "sync", 4)) {
            printf("%d\n", cuCtxSynchronize());
        } else if (!strncmp(line, "info", 4)) {
            size_t f = 0, t = 0;
            r = cuMemGetInfo_v2(&f, &t);
            printf("%d %zu %zu\n", r, f, t);
        } else if (!strncmp(line, "dev", 3)) {
            int n = 0, major = 0, minor = 0;
            size_t total = 0;
            char name[256] = "";
            r = cuDeviceGetCount(&n);
            if (r == 0) r = cuDeviceGetAttribute(&major, 75, 0);
            if (r == 0) r = cuDeviceGetAttribute(&minor, 76, 0);
            if (r == 0) r = cuDeviceTotalMem_v2(&total, 0);
            if (r == 0) r = cuDeviceGetName(name, sizeof name, 0);
            for (char *p = name; *p; p++)
                if (*p == ' ') *p = '_';
            printf("%d %d %d %d %zu %s\n", r, n, major, minor, total, name[0] ? name : "-");
        } else if (sscanf(line, "gpa %1023s", text) == 1) {
            void *p = NULL;
            CUdriverProcAddressQueryResult st;
            printf("%d\n", cuGetProcAddress_v2(text, &p, 12040, 0, &st));
        } else if (!strncmp(line, "managed", 7)) {
            void *p = NULL;
            CUdriverProcAddressQueryResult st;
            r = cuGetProcAddress_v2("cuMemAllocManaged", &p, 12040, 0, &st);
            CUdeviceptr m = 0;
            if (r == 0) r = ((CUresult(*)(CUdeviceptr *, size_t, unsigned))p)(&m, 4096, 1);
            printf("%d\n", r);
        } else if (sscanf(line, "errname %u", &a) == 1) {
            const char *s = NULL;
            void *p = NULL;
            CUdriverProcAddressQueryResult st;
            r = cuGetProcAddress_v2("cuGetErrorName", &p, 12040, 0, &st);
            if (r == 0) r = ((CUresult(*)(CUresult, const char **))p)((CUresult)a, &s);
            printf("%d %s\n", r, s != NULL ? s : "-");
        } else if (sscanf(line, "rtt %u", &a) == 1 && a > 0) {
            int64_t *t = malloc(a * sizeof *t);
            for (unsigned i = 0; i < a && r == 0; i++) {
                int64_t t0 = now_ns();
                r = cuCtxSynchronize();
                t[i] = now_ns() - t0;
            }
            qsort(t, a, sizeof *t, cmp64);
            printf("%d %lld %lld\n", r, (long long)t[a / 2], (long long)t[(size_t)a * 99 / 100]);
            free(t);
        } else if (sscanf(line, "big %llu %u %u", &x, &a, &b) == 3) {
            unsigned char *h = malloc(x), *back = malloc(x);
            for (size_t i = 0; i < x; i++) h[i] = (unsigned char)(((uint32_t)i * 2654435761u + a) >> 24);
            memset(back, 0, x);
            CUdeviceptr p = 0;
            r = cuMemAlloc_v2(&p, x);
            if (r == 0) r = b ? cuMemcpyHtoDAsync_v2(p, h, x, NULL) : cuMemcpyHtoD_v2(p, h, x);
            if (r == 0) r = b ? cuMemcpyDtoHAsync_v2(back, p, x, NULL) : cuMemcpyDtoH_v2(back, p, x);
            if (r == 0 && b) r = cuStreamSynchronize(NULL);
            if (p) cuMemFree_v2(p);
            printf("%d %d\n", r, memcmp(h, back, x) == 0);
            free(h);
            free(back);
        } else if (sscanf(line, "copy %llu %u", &x, &a) == 2) {
            unsigned char *h = malloc(x);
            memset(h, 0x5a, x);
            CUdeviceptr p = 0;
            int64_t up = INT64_MAX, down = INT64_MAX;
            r = cuMemAlloc_v2(&p, x);
            for (unsigned i = 0; i < a && r == 0; i++) {
                int64_t t0 = now_ns();
                r = cuMemcpyHtoD_v2(p, h, x);
                int64_t t1 = now_ns();
                if (r == 0) r = cuMemcpyDtoH_v2(h, p, x);
                int64_t t2 = now_ns();
                if (t1 - t0 < up) up = t1 - t0;
                if (t2 - t1 < down) down = t2 - t1;
            }
            if (p) cuMemFree_v2(p);
            free(h);
            printf("%d %lld %lld\n", r, (long long)up, (long long)down);
        } else {
            printf("? %s", line);
        }
    }
    return 0;
}
