/* A fake libamd_smi.so: AMD Instinct cards simulated from a JSON state file, for the real amdsmi Python binding.
 *
 * Written from AMD SMI's public API reference (status codes, buffer rules, partition behaviour); the kernel
 * driver's documented partition rules decide which modes a card accepts. Nothing here is AMD's code.
 *
 * State file: the path in FAKE_AMDSMI_STATE, read on every call (so a second process sees what the first
 * changed) and written back, under an exclusive flock, when a call changes a mode or consumes an event:
 *
 *   {
 *     "driver_version": "6.12.12",          (optional)
 *     "init_status": 0,                      (optional: amdsmi_init returns this status when non-zero)
 *     "cards": [
 *       {"model": "MI300X",                  MI300X, MI325X or MI210
 *        "uuid": "2fff74a1-0000-1000-80c2-1b7a3e0c4d01",
 *        "bdf": "0000:0c:00.0", "numa": 0,
 *        "compute": "SPX", "memory": "NPS1", (the card's modes; ignored for MI210)
 *        "render": 128,                      (optional: renderD minor of partition 0; default 128 + 8 * index)
 *        "ecc": {"correctable": 0, "uncorrectable": 0, "deferred": 0},            (optional)
 *        "processes": [{"pid": 4242, "name": "python3", "vram_mib": 1024, "partition": 0}]}   (optional)
 *     ],
 *     "events": [{"card": 0, "partition": 0, "type": 3, "message": "..."}]       (optional, consumed)
 *   }
 *
 * Behaviour (AMD SMI reference and the amdgpu partition rules):
 * - One socket per card; a card in compute mode SPX/DPX/QPX/CPX shows 1/2/4/8 processors under its socket,
 *   processor k being partition k (kfd current_partition_id k). Each has 1/N of the card's XCCs, CUs and
 *   VRAM: the driver gives every compute partition an equal share of the memory partition it sits in, so
 *   an MI300X DPX partition has 152 CUs and 98,296 MiB.
 * - Partition k keeps the card's BDF and reports the card's UUID with its first two hex digits replaced by
 *   k in hex (k > 0); partition 0 reports the card's UUID. (A fake convention: the reference does not fix
 *   partition UUIDs.)
 * - Compute x memory pairs (8-XCC MI300X/MI325X): SPX needs NPS1; DPX NPS1 or NPS2; QPX NPS1 or NPS4;
 *   CPX NPS1 or NPS4; TPX is for 6-XCC parts only. The memory mode must also be one the card supports:
 *   NPS1 and NPS4 on MI300X and MI325X (amdgpu's default supported_nps_modes for these chips on bare
 *   metal, so DPX/NPS2 is refused). A set that would make an invalid pair, or names a mode the card
 *   lacks, returns AMDSMI_STATUS_SETTING_UNAVAILABLE; a set while any process holds the card returns
 *   AMDSMI_STATUS_BUSY; MI210 returns AMDSMI_STATUS_NOT_SUPPORTED for every partition call.
 * - A mode may be set through any processor of the card. Handles of partitions that no longer exist after a
 *   mode change answer AMDSMI_STATUS_NOT_FOUND; callers re-enumerate.
 * - Events: amdsmi_get_gpu_event_notification returns queued events of processors whose notification was
 *   initialised and whose mask has bit (type - 1), polling every 10 ms up to timeout_ms; none:
 *   AMDSMI_STATUS_NO_DATA with *num_elem 0.
 */
#define _GNU_SOURCE
#include "amdsmi_fake.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_json.h"

#define MAX_CARDS 16
#define MAX_PARTS 8
#define NPS1_BIT 1u
#define NPS2_BIT 2u
#define NPS4_BIT 4u

typedef struct {
    const char *name;   /* the "model" key of the state file */
    const char *market; /* ASIC market name */
    uint64_t device_id;
    uint32_t xccs;
    uint32_t cus;
    uint32_t vram_mib;
    uint32_t nps_caps; /* NPS*_BIT; 0: no partitions */
    uint64_t gfx;
    amdsmi_vram_type_t vram_type;
} model_t;

/* CU and memory figures: 38 CUs per XCC on MI300X/MI325X (304 per card); MI300X 192 GB, MI325X 256 GB,
 * MI210 64 GB, each less the 16 MiB the driver reserves (so an MI300X DPX half is 98,296 MiB). */
static const model_t MODELS[] = {
    {"MI300X", "AMD Instinct MI300X", 0x74a1, 8, 304, 196592, NPS1_BIT | NPS4_BIT, 0x942, AMDSMI_VRAM_TYPE_HBM3},
    {"MI325X", "AMD Instinct MI325X", 0x74a5, 8, 304, 262128, NPS1_BIT | NPS4_BIT, 0x942, AMDSMI_VRAM_TYPE_HBM3},
    {"MI210", "AMD Instinct MI210", 0x740f, 1, 104, 65520, 0, 0x90a, AMDSMI_VRAM_TYPE_HBM2E},
};

typedef struct {
    int card;
    int part;
} slot_t;

static slot_t g_slots[MAX_CARDS][MAX_PARTS];
static int g_sockets[MAX_CARDS];
static int g_initialised;
static int g_events_on[MAX_CARDS][MAX_PARTS];
static uint64_t g_event_mask[MAX_CARDS][MAX_PARTS];

/* --- state file --------------------------------------------------------------------------------------- */

typedef struct {
    int fd;
    jval *root;
} state_t;

static int state_open(state_t *st, int exclusive) {
    const char *path = getenv("FAKE_AMDSMI_STATE");
    st->fd = -1;
    st->root = NULL;
    if (!path) return -1;
    st->fd = open(path, O_RDWR);
    if (st->fd < 0) return -1;
    flock(st->fd, exclusive ? LOCK_EX : LOCK_SH);
    struct stat sb;
    if (fstat(st->fd, &sb) != 0) goto fail;
    char *text = malloc((size_t)sb.st_size + 1);
    ssize_t got = pread(st->fd, text, (size_t)sb.st_size, 0);
    if (got < 0) {
        free(text);
        goto fail;
    }
    text[got] = '\0';
    st->root = json_parse(text);
    free(text);
    if (!st->root || st->root->kind != JOBJ) goto fail;
    return 0;
fail:
    json_free(st->root);
    st->root = NULL;
    close(st->fd);
    st->fd = -1;
    return -1;
}

static void state_save(state_t *st) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    json_write(mem, st->root);
    fputc('\n', mem);
    fclose(mem);
    if (ftruncate(st->fd, 0) == 0 && pwrite(st->fd, buf, len, 0) == (ssize_t)len) fsync(st->fd);
    free(buf);
}

static void state_close(state_t *st) {
    json_free(st->root);
    if (st->fd >= 0) {
        flock(st->fd, LOCK_UN);
        close(st->fd);
    }
    st->fd = -1;
    st->root = NULL;
}

static jval *cards_of(const state_t *st) {
    jval *cards = json_get(st->root, "cards");
    return cards && cards->kind == JARR ? cards : NULL;
}

static int card_count(const state_t *st) {
    jval *cards = cards_of(st);
    int n = cards ? cards->count : 0;
    return n > MAX_CARDS ? MAX_CARDS : n;
}

static const model_t *model_of(const jval *card) {
    const char *name = json_str(card, "model", "");
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++)
        if (strcmp(MODELS[i].name, name) == 0) return &MODELS[i];
    return NULL;
}

/* --- modes -------------------------------------------------------------------------------------------- */

static const char *COMPUTE_NAMES[] = {"", "SPX", "DPX", "TPX", "QPX", "CPX"};

static int compute_of(const jval *card) {
    const char *name = json_str(card, "compute", "SPX");
    for (int i = 1; i <= 5; i++)
        if (strcmp(COMPUTE_NAMES[i], name) == 0) return i;
    return AMDSMI_COMPUTE_PARTITION_SPX;
}

static uint32_t memory_of(const jval *card) {
    const char *name = json_str(card, "memory", "NPS1");
    if (strcmp(name, "NPS2") == 0) return AMDSMI_MEMORY_PARTITION_NPS2;
    if (strcmp(name, "NPS4") == 0) return AMDSMI_MEMORY_PARTITION_NPS4;
    return AMDSMI_MEMORY_PARTITION_NPS1;
}

static uint32_t partitions_in(const model_t *m, int compute) {
    if (!m->nps_caps) return 1;
    switch (compute) {
    case AMDSMI_COMPUTE_PARTITION_DPX: return 2;
    case AMDSMI_COMPUTE_PARTITION_TPX: return 3;
    case AMDSMI_COMPUTE_PARTITION_QPX: return 4;
    case AMDSMI_COMPUTE_PARTITION_CPX: return m->xccs;
    default: return 1;
    }
}

static uint32_t nps_bit(uint32_t memory) {
    return memory == AMDSMI_MEMORY_PARTITION_NPS1   ? NPS1_BIT
           : memory == AMDSMI_MEMORY_PARTITION_NPS2 ? NPS2_BIT
           : memory == AMDSMI_MEMORY_PARTITION_NPS4 ? NPS4_BIT
                                                    : 0;
}

/* The memory modes a compute mode works with on this card (the amdgpu driver's compatibility rule). */
static uint32_t compatible_nps(const model_t *m, int compute) {
    uint32_t modes = 0;
    switch (compute) {
    case AMDSMI_COMPUTE_PARTITION_SPX: modes = NPS1_BIT; break;
    case AMDSMI_COMPUTE_PARTITION_DPX: modes = m->xccs % 4 == 0 ? NPS1_BIT | NPS2_BIT : 0; break;
    case AMDSMI_COMPUTE_PARTITION_TPX: modes = m->xccs % 3 == 0 ? NPS1_BIT | NPS4_BIT : 0; break;
    case AMDSMI_COMPUTE_PARTITION_QPX: modes = m->xccs / 4 >= 2 ? NPS1_BIT | NPS4_BIT : 0; break;
    case AMDSMI_COMPUTE_PARTITION_CPX: modes = m->xccs > 1 ? NPS1_BIT | NPS4_BIT : 0; break;
    default: break;
    }
    return modes & m->nps_caps;
}

/* --- handles ------------------------------------------------------------------------------------------ */

typedef struct {
    state_t st;
    jval *card;
    const model_t *model;
    int card_i;
    int part;
    uint32_t nparts;
} proc_t;

static int slot_of(amdsmi_processor_handle h, int *card, int *part) {
    char *base = (char *)&g_slots[0][0];
    char *p = (char *)h;
    if (!h || p < base || p >= base + sizeof g_slots) return -1;
    slot_t *s = (slot_t *)h;
    *card = s->card;
    *part = s->part;
    return 0;
}

static amdsmi_status_t proc_open(amdsmi_processor_handle h, proc_t *pr, int exclusive) {
    if (!g_initialised) return AMDSMI_STATUS_NOT_INIT;
    if (slot_of(h, &pr->card_i, &pr->part) != 0) return AMDSMI_STATUS_INVAL;
    if (state_open(&pr->st, exclusive) != 0) return AMDSMI_STATUS_DRIVER_NOT_LOADED;
    jval *cards = cards_of(&pr->st);
    if (!cards || pr->card_i >= card_count(&pr->st)) goto gone;
    pr->card = cards->items[pr->card_i];
    pr->model = model_of(pr->card);
    if (!pr->model) {
        state_close(&pr->st);
        return AMDSMI_STATUS_UNEXPECTED_DATA;
    }
    pr->nparts = partitions_in(pr->model, compute_of(pr->card));
    if ((uint32_t)pr->part >= pr->nparts) goto gone;
    return AMDSMI_STATUS_SUCCESS;
gone:
    state_close(&pr->st);
    return AMDSMI_STATUS_NOT_FOUND;
}

static void copy_text(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
}

static int parse_bdf(const char *text, unsigned *domain, unsigned *bus, unsigned *dev, unsigned *fn) {
    return sscanf(text, "%x:%x:%x.%x", domain, bus, dev, fn) == 4 ? 0 : -1;
}

static uint32_t render_of(const proc_t *pr) {
    return (uint32_t)json_int(pr->card, "render", 128 + 8 * pr->card_i) + (uint32_t)pr->part;
}

/* --- library lifetime ---------------------------------------------------------------------------------- */

amdsmi_status_t amdsmi_init(uint64_t init_flags) {
    state_t st;
    if (state_open(&st, 0) != 0) return AMDSMI_STATUS_DRIVER_NOT_LOADED; /* no amdgpu: nothing to read */
    int64_t forced = json_int(st.root, "init_status", 0);
    state_close(&st);
    if (forced != 0) return (amdsmi_status_t)forced;
    if (!(init_flags & AMDSMI_INIT_AMD_GPUS)) return AMDSMI_STATUS_INVAL;
    for (int c = 0; c < MAX_CARDS; c++) {
        g_sockets[c] = c;
        for (int k = 0; k < MAX_PARTS; k++) g_slots[c][k] = (slot_t){c, k};
    }
    g_initialised = 1;
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_shut_down(void) {
    g_initialised = 0;
    memset(g_events_on, 0, sizeof g_events_on);
    memset(g_event_mask, 0, sizeof g_event_mask);
    return AMDSMI_STATUS_SUCCESS;
}

/* --- discovery ---------------------------------------------------------------------------------------- */

amdsmi_status_t amdsmi_get_socket_handles(uint32_t *socket_count, amdsmi_socket_handle *socket_handles) {
    if (!g_initialised) return AMDSMI_STATUS_NOT_INIT;
    if (!socket_count) return AMDSMI_STATUS_INVAL;
    state_t st;
    if (state_open(&st, 0) != 0) return AMDSMI_STATUS_DRIVER_NOT_LOADED;
    uint32_t n = (uint32_t)card_count(&st);
    state_close(&st);
    if (!socket_handles) { /* a NULL list asks for the count */
        *socket_count = n;
        return AMDSMI_STATUS_SUCCESS;
    }
    uint32_t give = *socket_count < n ? *socket_count : n;
    for (uint32_t i = 0; i < give; i++) socket_handles[i] = &g_sockets[i];
    *socket_count = give;
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_socket_info(amdsmi_socket_handle socket_handle, size_t len, char *name) {
    if (!g_initialised) return AMDSMI_STATUS_NOT_INIT;
    int *s = (int *)socket_handle;
    if (!s || s < &g_sockets[0] || s >= &g_sockets[MAX_CARDS] || !name) return AMDSMI_STATUS_INVAL;
    state_t st;
    if (state_open(&st, 0) != 0) return AMDSMI_STATUS_DRIVER_NOT_LOADED;
    amdsmi_status_t rc = AMDSMI_STATUS_NOT_FOUND;
    if (*s < card_count(&st)) {
        const char *bdf = json_str(cards_of(&st)->items[*s], "bdf", "0000:00:00.0");
        snprintf(name, len, "%.*s", 10, bdf); /* the socket id is the BDF less its function: 0000:0c:00 */
        rc = AMDSMI_STATUS_SUCCESS;
    }
    state_close(&st);
    return rc;
}

amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle socket_handle, uint32_t *processor_count,
                                             amdsmi_processor_handle *processor_handles) {
    if (!g_initialised) return AMDSMI_STATUS_NOT_INIT;
    int *s = (int *)socket_handle;
    if (!s || s < &g_sockets[0] || s >= &g_sockets[MAX_CARDS] || !processor_count) return AMDSMI_STATUS_INVAL;
    state_t st;
    if (state_open(&st, 0) != 0) return AMDSMI_STATUS_DRIVER_NOT_LOADED;
    if (*s >= card_count(&st)) {
        state_close(&st);
        return AMDSMI_STATUS_NOT_FOUND;
    }
    jval *card = cards_of(&st)->items[*s];
    const model_t *m = model_of(card);
    uint32_t n = m ? partitions_in(m, compute_of(card)) : 0;
    state_close(&st);
    if (!m) return AMDSMI_STATUS_UNEXPECTED_DATA;
    if (!processor_handles) {
        *processor_count = n;
        return AMDSMI_STATUS_SUCCESS;
    }
    uint32_t give = *processor_count < n ? *processor_count : n;
    for (uint32_t k = 0; k < give; k++) processor_handles[k] = &g_slots[*s][k];
    *processor_count = give;
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_processor_type(amdsmi_processor_handle processor_handle, processor_type_t *type) {
    proc_t pr;
    if (!type) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    *type = AMDSMI_PROCESSOR_TYPE_AMD_GPU;
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_gpu_device_bdf(amdsmi_processor_handle processor_handle, amdsmi_bdf_t *bdf) {
    proc_t pr;
    if (!bdf) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    unsigned domain, bus, dev, fn;
    if (parse_bdf(json_str(pr.card, "bdf", ""), &domain, &bus, &dev, &fn) != 0) {
        rc = AMDSMI_STATUS_UNEXPECTED_DATA;
    } else {
        bdf->as_uint = 0;
        bdf->fields.domain_number = domain;
        bdf->fields.bus_number = bus & 0xff;
        bdf->fields.device_number = dev & 0x1f;
        bdf->fields.function_number = fn & 0x7;
    }
    state_close(&pr.st);
    return rc;
}

amdsmi_status_t amdsmi_get_gpu_device_uuid(amdsmi_processor_handle processor_handle, unsigned int *uuid_length,
                                           char *uuid) {
    proc_t pr;
    if (!uuid_length || !uuid) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    char text[AMDSMI_GPU_UUID_SIZE];
    copy_text(text, sizeof text, json_str(pr.card, "uuid", ""));
    if (pr.part > 0 && strlen(text) >= 2) {
        char digits[3];
        snprintf(digits, sizeof digits, "%02x", (unsigned)pr.part);
        text[0] = digits[0];
        text[1] = digits[1];
    }
    size_t need = strlen(text) + 1;
    if (*uuid_length < need) {
        rc = AMDSMI_STATUS_INSUFFICIENT_SIZE;
    } else {
        memcpy(uuid, text, need);
        *uuid_length = (unsigned)need;
    }
    state_close(&pr.st);
    return rc;
}

amdsmi_status_t amdsmi_get_gpu_enumeration_info(amdsmi_processor_handle processor_handle,
                                                amdsmi_enumeration_info_t *info) {
    proc_t pr;
    if (!info) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    info->drm_render = render_of(&pr);
    info->drm_card = info->drm_render - 128;
    info->hsa_id = (uint32_t)(pr.card_i * MAX_PARTS + pr.part);
    info->hip_id = info->hsa_id;
    snprintf(info->hip_uuid, sizeof info->hip_uuid, "GPU-%.8s%02x", json_str(pr.card, "uuid", "00000000"),
             (unsigned)pr.part);
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_gpu_asic_info(amdsmi_processor_handle processor_handle, amdsmi_asic_info_t *info) {
    proc_t pr;
    if (!info) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    copy_text(info->market_name, sizeof info->market_name, pr.model->market);
    info->vendor_id = 0x1002;
    copy_text(info->vendor_name, sizeof info->vendor_name, "Advanced Micro Devices Inc. [AMD/ATI]");
    info->subvendor_id = 0x1002;
    info->device_id = pr.model->device_id;
    info->rev_id = 0;
    snprintf(info->asic_serial, sizeof info->asic_serial, "%016llX",
             (unsigned long long)(0x5A1E000000000000ull | (uint64_t)pr.card_i << 8 | (uint64_t)pr.part));
    info->oam_id = (uint32_t)pr.card_i;
    info->num_of_compute_units = pr.model->cus / pr.nparts;
    info->target_graphics_version = pr.model->gfx;
    info->subsystem_id = (uint32_t)pr.model->device_id;
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_gpu_kfd_info(amdsmi_processor_handle processor_handle, amdsmi_kfd_info_t *info) {
    proc_t pr;
    if (!info) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    info->kfd_id = 40000u + (uint64_t)pr.card_i * 100u + (uint64_t)pr.part;
    info->node_id = (uint32_t)(1 + pr.card_i * MAX_PARTS + pr.part); /* KFD node 0 is the CPU */
    info->current_partition_id = (uint32_t)pr.part;
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

static uint32_t used_mib(const proc_t *pr) {
    jval *procs = json_get(pr->card, "processes");
    uint32_t used = 0;
    for (int i = 0; procs && procs->kind == JARR && i < procs->count; i++)
        if (json_int(procs->items[i], "partition", 0) == pr->part)
            used += (uint32_t)json_int(procs->items[i], "vram_mib", 0);
    return used;
}

amdsmi_status_t amdsmi_get_gpu_vram_info(amdsmi_processor_handle processor_handle, amdsmi_vram_info_t *info) {
    proc_t pr;
    if (!info) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    info->vram_type = pr.model->vram_type;
    copy_text(info->vram_vendor, sizeof info->vram_vendor, "SAMSUNG");
    info->vram_size = pr.model->vram_mib / pr.nparts;
    info->vram_bit_width = 8192;
    info->vram_max_bandwidth = 5300;
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_gpu_vram_usage(amdsmi_processor_handle processor_handle, amdsmi_vram_usage_t *info) {
    proc_t pr;
    if (!info) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    info->vram_total = pr.model->vram_mib / pr.nparts;
    info->vram_used = used_mib(&pr);
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_gpu_driver_info(amdsmi_processor_handle processor_handle, amdsmi_driver_info_t *info) {
    proc_t pr;
    if (!info) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    memset(info, 0, sizeof *info);
    copy_text(info->driver_name, sizeof info->driver_name, "amdgpu");
    copy_text(info->driver_version, sizeof info->driver_version, json_str(pr.st.root, "driver_version", "6.12.12"));
    copy_text(info->driver_date, sizeof info->driver_date, "2015/01/01 00:00");
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_topo_get_numa_node_number(amdsmi_processor_handle processor_handle, uint32_t *numa_node) {
    proc_t pr;
    if (!numa_node) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    *numa_node = (uint32_t)json_int(pr.card, "numa", 0);
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

/* --- partitions --------------------------------------------------------------------------------------- */

/* Copy `text` into a caller's buffer of `len` bytes: what fits, and INSUFFICIENT_SIZE when not all did. */
static amdsmi_status_t give_string(char *dst, uint32_t len, const char *text) {
    if (!dst || len == 0) return AMDSMI_STATUS_INVAL;
    snprintf(dst, len, "%s", text);
    return strlen(text) + 1 > len ? AMDSMI_STATUS_INSUFFICIENT_SIZE : AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_get_gpu_compute_partition(amdsmi_processor_handle processor_handle, char *compute_partition,
                                                 uint32_t len) {
    proc_t pr;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    rc = pr.model->nps_caps ? give_string(compute_partition, len, COMPUTE_NAMES[compute_of(pr.card)])
                            : AMDSMI_STATUS_NOT_SUPPORTED;
    state_close(&pr.st);
    return rc;
}

amdsmi_status_t amdsmi_get_gpu_memory_partition(amdsmi_processor_handle processor_handle, char *memory_partition,
                                                uint32_t len) {
    proc_t pr;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    char text[8];
    snprintf(text, sizeof text, "NPS%u", memory_of(pr.card));
    rc = pr.model->nps_caps ? give_string(memory_partition, len, text) : AMDSMI_STATUS_NOT_SUPPORTED;
    state_close(&pr.st);
    return rc;
}

amdsmi_status_t amdsmi_get_gpu_memory_partition_config(amdsmi_processor_handle processor_handle,
                                                       amdsmi_memory_partition_config_t *config) {
    proc_t pr;
    if (!config) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    if (!pr.model->nps_caps) {
        rc = AMDSMI_STATUS_NOT_SUPPORTED;
    } else {
        memset(config, 0, sizeof *config);
        config->partition_caps.nps_cap_mask = pr.model->nps_caps;
        config->mp_mode = (amdsmi_memory_partition_type_t)memory_of(pr.card);
    }
    state_close(&pr.st);
    return rc;
}

static int card_busy(const jval *card) {
    jval *procs = json_get(card, "processes");
    return procs && procs->kind == JARR && procs->count > 0;
}

amdsmi_status_t amdsmi_set_gpu_compute_partition(amdsmi_processor_handle processor_handle,
                                                 amdsmi_compute_partition_type_t compute_partition) {
    proc_t pr;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 1);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    int mode = (int)compute_partition;
    if (!pr.model->nps_caps) {
        rc = AMDSMI_STATUS_NOT_SUPPORTED;
    } else if (mode < AMDSMI_COMPUTE_PARTITION_SPX || mode > AMDSMI_COMPUTE_PARTITION_CPX) {
        rc = AMDSMI_STATUS_INVAL;
    } else if (!(compatible_nps(pr.model, mode) & nps_bit(memory_of(pr.card)))) {
        rc = AMDSMI_STATUS_SETTING_UNAVAILABLE;
    } else if (card_busy(pr.card)) {
        rc = AMDSMI_STATUS_BUSY;
    } else {
        json_set_str(pr.card, "compute", COMPUTE_NAMES[mode]);
        state_save(&pr.st);
    }
    state_close(&pr.st);
    return rc;
}

amdsmi_status_t amdsmi_set_gpu_memory_partition(amdsmi_processor_handle processor_handle,
                                                amdsmi_memory_partition_type_t memory_partition) {
    proc_t pr;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 1);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    uint32_t bit = nps_bit((uint32_t)memory_partition);
    if (!pr.model->nps_caps) {
        rc = AMDSMI_STATUS_NOT_SUPPORTED;
    } else if (!bit) {
        rc = AMDSMI_STATUS_INVAL;
    } else if (!(pr.model->nps_caps & bit) || !(compatible_nps(pr.model, compute_of(pr.card)) & bit)) {
        rc = AMDSMI_STATUS_SETTING_UNAVAILABLE;
    } else if (card_busy(pr.card)) {
        rc = AMDSMI_STATUS_BUSY;
    } else {
        char text[8];
        snprintf(text, sizeof text, "NPS%u", (unsigned)memory_partition);
        json_set_str(pr.card, "memory", text);
        state_save(&pr.st);
    }
    state_close(&pr.st);
    return rc;
}

/* --- processes and errors ----------------------------------------------------------------------------- */

amdsmi_status_t amdsmi_get_gpu_process_list(amdsmi_processor_handle processor_handle, uint32_t *max_processes,
                                            amdsmi_proc_info_t *list) {
    proc_t pr;
    if (!max_processes) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    jval *procs = json_get(pr.card, "processes");
    uint32_t total = 0;
    for (int i = 0; procs && procs->kind == JARR && i < procs->count; i++)
        if (json_int(procs->items[i], "partition", 0) == pr.part) total++;
    if (*max_processes == 0) { /* asks for the count */
        *max_processes = total;
        state_close(&pr.st);
        return AMDSMI_STATUS_SUCCESS;
    }
    if (!list) {
        state_close(&pr.st);
        return AMDSMI_STATUS_INVAL;
    }
    uint32_t written = 0;
    for (int i = 0; procs && procs->kind == JARR && i < procs->count && written < *max_processes; i++) {
        jval *p = procs->items[i];
        if (json_int(p, "partition", 0) != pr.part) continue;
        amdsmi_proc_info_t *out = &list[written++];
        memset(out, 0, sizeof *out);
        copy_text(out->name, sizeof out->name, json_str(p, "name", ""));
        out->pid = (uint32_t)json_int(p, "pid", 0);
        out->memory_usage.vram_mem = (uint64_t)json_int(p, "vram_mib", 0) * 1024u * 1024u;
        out->mem = out->memory_usage.vram_mem;
        out->cu_occupancy = 0xFFFFFFFFu; /* not reported: the binding shows N/A */
    }
    rc = written < total ? AMDSMI_STATUS_OUT_OF_RESOURCES : AMDSMI_STATUS_SUCCESS;
    *max_processes = written;
    state_close(&pr.st);
    return rc;
}

amdsmi_status_t amdsmi_get_gpu_total_ecc_count(amdsmi_processor_handle processor_handle, amdsmi_error_count_t *ec) {
    proc_t pr;
    if (!ec) return AMDSMI_STATUS_INVAL;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    jval *ecc = json_get(pr.card, "ecc");
    memset(ec, 0, sizeof *ec);
    ec->correctable_count = (uint64_t)json_int(ecc, "correctable", 0);
    ec->uncorrectable_count = (uint64_t)json_int(ecc, "uncorrectable", 0);
    ec->deferred_count = (uint64_t)json_int(ecc, "deferred", 0);
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

/* --- events ------------------------------------------------------------------------------------------- */

amdsmi_status_t amdsmi_init_gpu_event_notification(amdsmi_processor_handle processor_handle) {
    proc_t pr;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    g_events_on[pr.card_i][pr.part] = 1;
    state_close(&pr.st);
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_set_gpu_event_notification_mask(amdsmi_processor_handle processor_handle, uint64_t mask) {
    proc_t pr;
    amdsmi_status_t rc = proc_open(processor_handle, &pr, 0);
    if (rc != AMDSMI_STATUS_SUCCESS) return rc;
    if (!g_events_on[pr.card_i][pr.part]) {
        rc = AMDSMI_STATUS_INIT_ERROR; /* the mask needs amdsmi_init_gpu_event_notification first */
    } else {
        g_event_mask[pr.card_i][pr.part] = mask;
    }
    state_close(&pr.st);
    return rc;
}

amdsmi_status_t amdsmi_stop_gpu_event_notification(amdsmi_processor_handle processor_handle) {
    int card, part;
    if (!g_initialised) return AMDSMI_STATUS_NOT_INIT;
    if (slot_of(processor_handle, &card, &part) != 0) return AMDSMI_STATUS_INVAL;
    g_events_on[card][part] = 0;
    g_event_mask[card][part] = 0;
    return AMDSMI_STATUS_SUCCESS;
}

/* Move up to `room` wanted events from the state file into `data`; returns how many. */
static uint32_t take_events(uint32_t room, amdsmi_evt_notification_data_t *data) {
    state_t st;
    if (state_open(&st, 1) != 0) return 0;
    jval *events = json_get(st.root, "events");
    uint32_t taken = 0;
    for (int i = 0; events && events->kind == JARR && i < events->count && taken < room;) {
        jval *e = events->items[i];
        int64_t card = json_int(e, "card", -1), part = json_int(e, "partition", 0), type = json_int(e, "type", 0);
        int wanted = card >= 0 && card < MAX_CARDS && part >= 0 && part < MAX_PARTS && type >= 1 &&
                     type <= AMDSMI_EVT_NOTIF_LAST && g_events_on[card][part] &&
                     (g_event_mask[card][part] & (1ull << (type - 1)));
        if (!wanted) {
            i++;
            continue;
        }
        amdsmi_evt_notification_data_t *out = &data[taken++];
        memset(out, 0, sizeof *out);
        out->processor_handle = &g_slots[card][part];
        out->event = (amdsmi_evt_notification_type_t)type;
        copy_text(out->message, sizeof out->message, json_str(e, "message", ""));
        json_remove_at(events, i);
    }
    if (taken) state_save(&st);
    state_close(&st);
    return taken;
}

amdsmi_status_t amdsmi_get_gpu_event_notification(int timeout_ms, uint32_t *num_elem,
                                                  amdsmi_evt_notification_data_t *data) {
    if (!g_initialised) return AMDSMI_STATUS_NOT_INIT;
    if (!num_elem || !data || *num_elem == 0) return AMDSMI_STATUS_INVAL;
    int waited = 0;
    for (;;) {
        uint32_t got = take_events(*num_elem, data);
        if (got) {
            *num_elem = got;
            return AMDSMI_STATUS_SUCCESS;
        }
        if (waited >= timeout_ms) break;
        struct timespec step = {0, 10 * 1000 * 1000};
        nanosleep(&step, NULL);
        waited += 10;
    }
    *num_elem = 0;
    return AMDSMI_STATUS_NO_DATA;
}
