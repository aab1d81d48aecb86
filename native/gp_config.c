/* Configuration, read once per process: the caps, the compute mode and where the pod's accounting lives.
 *
 * With the agent's limits file (GP_LIMITS_PATH, struct gp_limits in gp.h) that file decides, because the
 * tenant can write everything else in the container: the environment may only lower a cap. A file that is
 * there but unusable refuses everything rather than falling back to no limit. Without the file no agent
 * granted anything, and the environment caps the process as a self-imposed limit. */
#include "gp_core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct gp_config gp_cfg;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* Parse "a,b,c" of non-negative decimals; returns the count, or -1 when any item is not a number. */
static int parse_list(const char *text, double *out, int max) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno != 0 || v != v || v < 0) return -1;
        while (*end == ' ') end++;
        if (*end != ',' && *end != '\0') return -1;
        if (n == max) return -1;
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0') return -1;
    }
    return n;
}

/* The environment's caps (GPUPOOL_MEMORY_LIMIT_MIB, GPUPOOL_CORES_PERCENT): counts, or -1 when malformed. */
static int env_caps(const char *name, double *v, int cores) {
    const char *text = getenv(name);
    if (text == NULL || !*text) return 0;
    int n = parse_list(text, v, GP_MAX_DEV);
    for (int i = 0; cores && i < n; i++)
        if (v[i] <= 0 || v[i] > 100) n = -1;
    return n;
}

/* Fail closed: the agent's file is there but cannot be used, so nothing may be allocated and compute is
 * held to 1 %: a tampered or half-written grant never turns into no limit at all. */
static void refuse_everything(struct gp_config *c, const char *why) {
    gp_log("the pod's limits file %s %s: every allocation is refused", GP_LIMITS_PATH, why);
    c->broken = 1;
    c->ndev = GP_MAX_DEV;
    c->by_uuid = 0;
    for (int i = 0; i < GP_MAX_DEV; i++) {
        c->limit[i] = 1;
        c->oversub[i] = 0;
        c->cores_ppm[i] = GP_PPM / 100;
    }
    c->acct_dir[0] = '\0';
}

/* Limits from the agent's read-only file. The mapping stays: the agent rewrites squeeze_ppm in place. */
static int load_limits_file(struct gp_config *c) {
    int fd = open(GP_LIMITS_PATH, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 0;
    c->agent = 1;
    if (fd < 0) {
        refuse_everything(c, strerror(errno));
        return 1;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(struct gp_limits))
        p = mmap(NULL, sizeof(struct gp_limits), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        refuse_everything(c, "is too short or cannot be mapped");
        return 1;
    }
    const struct gp_limits *f = p;
    if (f->magic != GP_LIMITS_MAGIC || f->version != GP_LIMITS_VERSION || f->ndev > GP_MAX_DEV ||
        memchr(f->accounting_dir, '\0', sizeof f->accounting_dir) == NULL) {
        refuse_everything(c, "is not a version 1 limits file");
        return 1;
    }
    c->file = f;
    c->ndev = (int)f->ndev;
    for (int i = 0; i < c->ndev; i++) {
        c->limit[i] = f->limit[i];
        c->oversub[i] = f->limit[i] != 0 ? f->oversub[i] : 0; /* beyond no cap there is nothing to spill */
        uint64_t ppm = f->cores_ppm[i];
        c->cores_ppm[i] = ppm == 0 || ppm >= (uint64_t)GP_PPM ? GP_PPM : (int64_t)ppm;
    }
    c->mode = f->mode == GP_ELASTIC ? GP_ELASTIC : GP_HARD;
    for (int i = 0; i < c->ndev; i++) {
        memcpy(c->uuid[i], f->uuid[i], sizeof c->uuid[i]);
        c->uuid[i][sizeof c->uuid[i] - 1] = '\0';
    }
    c->by_uuid = c->ndev > 0 && c->uuid[0][0] != '\0';
    c->nuuid = c->by_uuid ? c->ndev : 0;
    snprintf(c->acct_dir, sizeof c->acct_dir, "%s", f->accounting_dir);
    return 1;
}

static void load_config(void) {
    const char *lv = getenv("GPUPOOL_HOOK_LOG");
    if (lv != NULL) gp_log_set_level(atoi(lv));
    struct gp_config *c = &gp_cfg;
    memset(c, 0, sizeof *c);
    for (int i = 0; i < GP_MAX_DEV; i++) c->cores_ppm[i] = GP_PPM;
    /* How often the pod's measurements are read: finer is harmless, coarser only within reason (the pacing
     * between two measurements runs on estimates). */
    c->poll_ms = 20;
    const char *poll = getenv("GPUPOOL_HOOK_POLL_MS");
    if (poll != NULL && atoi(poll) > 0) c->poll_ms = atoi(poll) < 2 ? 2 : atoi(poll) > 50 ? 50 : atoi(poll);

    double mem[GP_MAX_DEV], cores[GP_MAX_DEV];
    int nmem = env_caps("GPUPOOL_MEMORY_LIMIT_MIB", mem, 0);
    if (nmem < 0) gp_log("GPUPOOL_MEMORY_LIMIT_MIB=%.64s is not a comma-separated list of MiB; memory is not capped by it",
                         getenv("GPUPOOL_MEMORY_LIMIT_MIB"));
    int ncores = env_caps("GPUPOOL_CORES_PERCENT", cores, 1);
    if (ncores < 0)
        gp_log("GPUPOOL_CORES_PERCENT=%.64s is not a list of percentages in (0, 100]; compute is not capped by it",
               getenv("GPUPOOL_CORES_PERCENT"));
    const char *mode = getenv("GPUPOOL_CORES_MODE");
    int env_mode = mode != NULL && strcmp(mode, "elastic") == 0 ? GP_ELASTIC : GP_HARD;
    if (mode != NULL && *mode && strcmp(mode, "elastic") != 0 && strcmp(mode, "hard") != 0)
        gp_log("GPUPOOL_CORES_MODE=%.32s is neither hard nor elastic; using hard", mode);

    if (load_limits_file(c)) {
        if (c->broken) return;
        /* The agent's file decides; the environment can only ask for less (a process capping itself). */
        int raised = 0;
        for (int i = 0; i < c->ndev && i < nmem; i++) {
            uint64_t b = (uint64_t)mem[i] * 1024ULL * 1024ULL;
            if (b == 0) continue;
            if (c->limit[i] == 0 || b < c->limit[i]) c->limit[i] = b;
            else raised |= b > c->limit[i];
        }
        for (int i = 0; i < c->ndev && i < ncores; i++) {
            int64_t ppm = (int64_t)(cores[i] * 10000.0 + 0.5);
            if (ppm < c->cores_ppm[i]) c->cores_ppm[i] = ppm;
            else raised |= ppm > c->cores_ppm[i];
        }
        if (c->mode == GP_ELASTIC && mode != NULL && strcmp(mode, "hard") == 0) c->mode = GP_HARD;
        if (raised) gp_log("the environment asks for more than the pod's limits file grants; the file's limits hold");
        const char *dir = getenv("GPUPOOL_HOOK_DIR");
        if (dir != NULL && *dir && strcmp(dir, c->acct_dir) != 0)
            gp_log("GPUPOOL_HOOK_DIR is ignored: the pod's accounting is where its limits file says");
        return;
    }

    /* No limits file: no agent grant, so nothing to protect; the environment caps the process as before. */
    const char *vis = getenv("NVIDIA_VISIBLE_DEVICES");
    if (vis != NULL && (strncmp(vis, "GPU-", 4) == 0 || strncmp(vis, "MIG-", 4) == 0)) {
        c->by_uuid = 1;
        const char *p = vis;
        while (*p && c->nuuid < GP_MAX_DEV) {
            size_t len = strcspn(p, ",");
            size_t keep = len < 63 ? len : 63;
            memcpy(c->uuid[c->nuuid], p, keep);
            c->uuid[c->nuuid][keep] = '\0';
            c->nuuid++;
            p += len;
            if (*p == ',') p++;
        }
    }
    int n = nmem > 0 ? nmem : 0, m = ncores > 0 ? ncores : 0;
    for (int i = 0; i < n; i++) c->limit[i] = (uint64_t)mem[i] * 1024ULL * 1024ULL;
    for (int i = 0; i < m; i++) c->cores_ppm[i] = (int64_t)(cores[i] * 10000.0 + 0.5);
    c->ndev = n > m ? n : m;
    if (c->by_uuid && c->ndev > c->nuuid) {
        gp_log("%d limits for %d visible GPUs: the extra limits are ignored", c->ndev, c->nuuid);
        c->ndev = c->nuuid;
    }
    c->mode = env_mode;
    const char *dir = getenv("GPUPOOL_HOOK_DIR");
    if (dir != NULL) snprintf(c->acct_dir, sizeof c->acct_dir, "%s", dir);
}

void gp_init(void) { pthread_once(&init_once, load_config); }
