/* The fake libdcmi.so: behaviour and state file are documented in dcmi_fake.h. Every call takes an exclusive
 * flock on the state file, loads it, answers (and for create / destroy writes it back), and unlocks, so
 * processes sharing the file see one consistent card. */
#define _GNU_SOURCE
#include "dcmi_fake.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "fake_json.h"

#define MAX_CARDS 16
#define MAX_CHIPS 4
#define MAX_VNPUS 16
#define MAX_ERRORS 32
#define MAX_OVERRIDES 8
#define TRAINING_ID_SPAN 16
#define INFERENCE_ID_SPAN 8
#define INFERENCE_MAX_VNPUS 7
#define TRAINING_DDR_MIB 15360ULL /* the control CPU's DDR a training card reports outside its HBM */
#define MIB 1048576ULL

struct tpl {
    const char *name;
    unsigned aicore;
    unsigned aicpu;
    unsigned long long mem_mib; /* 0: in proportion to the chip's AI Cores (template_memory) */
};

static const struct tpl TRAINING_TEMPLATES[] = {
    {"vir02", 2, 0, 0}, {"vir04", 4, 0, 0}, {"vir08", 8, 0, 0}, {"vir16", 16, 0, 0}, {NULL, 0, 0, 0}};
static const struct tpl INFERENCE_TEMPLATES[] = {
    {"vir01", 1, 1, 0},    {"vir02", 2, 2, 0},          {"vir02_1c", 2, 1, 0},      {"vir04", 4, 4, 0},
    {"vir04_3c", 4, 3, 0}, {"vir04_3c_ndvpp", 4, 3, 0}, {"vir04_4c_dvpp", 4, 4, 0}, {NULL, 0, 0, 0}};

/* The 910B variants (dcmi_fake.h, "Variants"): each template names its AI Cores, AI CPUs and memory. */
static const struct tpl B2_TEMPLATES[] = {
    {"vir03_1c_8g", 3, 1, 8192}, {"vir06_1c_16g", 6, 1, 16384}, {"vir12_3c_32g", 12, 3, 32768}, {NULL, 0, 0, 0}};
static const struct tpl B3_TEMPLATES[] = {
    {"vir05_1c_16g", 5, 1, 16384}, {"vir10_3c_32g", 10, 3, 32768}, {NULL, 0, 0, 0}};
static const struct tpl B4_TEMPLATES[] = {
    {"vir05_1c_8g", 5, 1, 8192}, {"vir10_3c_16g", 10, 3, 16384}, {NULL, 0, 0, 0}};

struct variant {
    const char *chip_name;
    unsigned aicore, aicpu;
    unsigned long long mem_mib;
    const struct tpl *templates;
};

static const struct variant VARIANTS[] = {
    {"910B2", 24, 6, 65536, B2_TEMPLATES},
    {"910B3", 20, 7, 65536, B3_TEMPLATES},
    {"910B4", 20, 7, 32768, B4_TEMPLATES},
    {NULL, 0, 0, 0, NULL},
};

static const struct variant *find_variant(const char *chip_name) {
    for (const struct variant *v = VARIANTS; v->chip_name; v++)
        if (strcmp(v->chip_name, chip_name) == 0) return v;
    return NULL;
}

struct vnpu {
    unsigned vdev_id;
    char tpl[32];
    int in_use;
};

struct proc {
    int pid;
    unsigned long long mem_mib;
};

struct mem_override {
    char tpl[32];
    unsigned long long mem_mib;
};

struct chip {
    char name[32];
    unsigned phy_id, logic_id, aicore, aicpu, health;
    unsigned long long mem_mib, mem_used_mib;
    int pci[4];
    unsigned die[5];
    unsigned errors[MAX_ERRORS];
    int nerrors;
    struct proc procs[DCMI_FAKE_MAX_PROC];
    int nprocs;
    int dynamic_vnpu;
    struct mem_override overrides[MAX_OVERRIDES];
    int noverrides;
    struct vnpu vnpus[MAX_VNPUS];
    int nvnpus;
};

struct card {
    int card_id;
    struct chip chips[MAX_CHIPS];
    int nchips;
};

struct state {
    char driver_version[64];
    int init_error;
    struct card cards[MAX_CARDS];
    int ncards;
};

static int g_initialised;

/* ----- state file ---------------------------------------------------------------------------------- */

static int is_training(const struct chip *c) { return strncmp(c->name, "910", 3) == 0; }

static int lock_state(void) {
    const char *path = getenv("FAKE_DCMI_STATE");
    if (!path || !*path) return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void unlock_state(int fd) {
    flock(fd, LOCK_UN);
    close(fd);
}

static char *read_all(int fd) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) { free(buf); return NULL; }
            buf = grown;
        }
        ssize_t got = pread(fd, buf + len, cap - len - 1, (off_t)len);
        if (got < 0) { free(buf); return NULL; }
        if (got == 0) break;
        len += (size_t)got;
    }
    buf[len] = '\0';
    return buf;
}

static void load_chip(const struct fj *j, struct chip *c, unsigned index) {
    memset(c, 0, sizeof *c);
    fj_str(j, "chip_name", "910B", c->name, sizeof c->name);
    const struct variant *v = find_variant(c->name);
    c->phy_id = (unsigned)fj_num(j, "phy_id", index);
    c->logic_id = (unsigned)fj_num(j, "logic_id", c->phy_id);
    c->aicore = (unsigned)fj_num(j, "aicore", v ? v->aicore : is_training(c) ? 32 : 8);
    c->aicpu = (unsigned)fj_num(j, "aicpu", v ? v->aicpu : is_training(c) ? 14 : 7);
    c->mem_mib = (unsigned long long)fj_num(j, "memory_mib", v ? (double)v->mem_mib : is_training(c) ? 65536 : 24576);
    c->mem_used_mib = (unsigned long long)fj_num(j, "memory_used_mib", 0);
    c->health = (unsigned)fj_num(j, "health", 0);
    c->dynamic_vnpu = (int)fj_num(j, "dynamic_vnpu", is_training(c) ? 0 : 1);
    const struct fj *pci = fj_get(j, "pci");
    for (int i = 0; i < 4; i++)
        c->pci[i] = pci && pci->type == FJ_ARR && (size_t)i < pci->n ? (int)pci->items[i]->num : 0;
    /* A die id unique per chip unless the test sets one: the physical id in the last word. */
    const struct fj *die = fj_get(j, "die_id");
    for (int i = 0; i < 5; i++)
        c->die[i] = die && die->type == FJ_ARR && (size_t)i < die->n ? (unsigned)die->items[i]->num
                                                                       : (i == 0 ? 0x19e5u : i == 4 ? c->phy_id : 0u);
    const struct fj *errors = fj_get(j, "errors");
    for (size_t i = 0; errors && errors->type == FJ_ARR && i < errors->n && i < MAX_ERRORS; i++)
        c->errors[c->nerrors++] = (unsigned)errors->items[i]->num;
    const struct fj *procs = fj_get(j, "processes");
    for (size_t i = 0; procs && procs->type == FJ_ARR && i < procs->n && i < DCMI_FAKE_MAX_PROC; i++) {
        c->procs[c->nprocs].pid = (int)fj_num(procs->items[i], "pid", 0);
        c->procs[c->nprocs++].mem_mib = (unsigned long long)fj_num(procs->items[i], "memory_mib", 0);
    }
    const struct fj *ov = fj_get(j, "template_memory_mib");
    for (size_t i = 0; ov && ov->type == FJ_OBJ && i < ov->n && i < MAX_OVERRIDES; i++) {
        strncpy(c->overrides[c->noverrides].tpl, ov->keys[i], sizeof c->overrides[0].tpl - 1);
        c->overrides[c->noverrides++].mem_mib = (unsigned long long)ov->items[i]->num;
    }
    const struct fj *vnpus = fj_get(j, "vnpus");
    for (size_t i = 0; vnpus && vnpus->type == FJ_ARR && i < vnpus->n && i < MAX_VNPUS; i++) {
        struct vnpu *v = &c->vnpus[c->nvnpus++];
        v->vdev_id = (unsigned)fj_num(vnpus->items[i], "vdev_id", 0);
        fj_str(vnpus->items[i], "template", "", v->tpl, sizeof v->tpl);
        v->in_use = (int)fj_num(vnpus->items[i], "in_use", 0);
    }
}

/* 0 on success, a DCMI error when the file is missing or not the documented schema. */
static int load(int fd, struct state *s) {
    memset(s, 0, sizeof *s);
    char *text = read_all(fd);
    if (!text) return DCMI_ERR_CODE_FILE_OPERATE_FAIL;
    struct fj *root = fj_parse(text);
    free(text);
    if (!root) return DCMI_ERR_CODE_FILE_OPERATE_FAIL;
    fj_str(root, "driver_version", "24.1.rc3", s->driver_version, sizeof s->driver_version);
    s->init_error = (int)fj_num(root, "init_error", 0);
    const struct fj *cards = fj_get(root, "cards");
    for (size_t i = 0; cards && cards->type == FJ_ARR && i < cards->n && i < MAX_CARDS; i++) {
        struct card *card = &s->cards[s->ncards++];
        card->card_id = (int)fj_num(cards->items[i], "card_id", (double)i);
        const struct fj *chips = fj_get(cards->items[i], "chips");
        for (size_t k = 0; chips && chips->type == FJ_ARR && k < chips->n && k < MAX_CHIPS; k++)
            load_chip(chips->items[k], &card->chips[card->nchips++], (unsigned)(i * MAX_CHIPS + k));
    }
    fj_free(root);
    return DCMI_OK;
}

static void save_chip(FILE *f, const struct chip *c, int last) {
    fprintf(f, "    {\"chip_name\": \"%s\", \"phy_id\": %u, \"logic_id\": %u, \"aicore\": %u, \"aicpu\": %u,\n",
            c->name, c->phy_id, c->logic_id, c->aicore, c->aicpu);
    fprintf(f, "     \"memory_mib\": %llu, \"memory_used_mib\": %llu, \"pci\": [%d, %d, %d, %d], \"health\": %u,\n",
            c->mem_mib, c->mem_used_mib, c->pci[0], c->pci[1], c->pci[2], c->pci[3], c->health);
    fprintf(f, "     \"die_id\": [%u, %u, %u, %u, %u],\n", c->die[0], c->die[1], c->die[2], c->die[3], c->die[4]);
    fprintf(f, "     \"dynamic_vnpu\": %s, \"errors\": [", c->dynamic_vnpu ? "true" : "false");
    for (int i = 0; i < c->nerrors; i++) fprintf(f, "%s%u", i ? ", " : "", c->errors[i]);
    fprintf(f, "],\n     \"processes\": [");
    for (int i = 0; i < c->nprocs; i++)
        fprintf(f, "%s{\"pid\": %d, \"memory_mib\": %llu}", i ? ", " : "", c->procs[i].pid, c->procs[i].mem_mib);
    fprintf(f, "],\n     \"template_memory_mib\": {");
    for (int i = 0; i < c->noverrides; i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", c->overrides[i].tpl, c->overrides[i].mem_mib);
    fprintf(f, "},\n     \"vnpus\": [");
    for (int i = 0; i < c->nvnpus; i++)
        fprintf(f, "%s{\"vdev_id\": %u, \"template\": \"%s\", \"in_use\": %s}", i ? ", " : "", c->vnpus[i].vdev_id,
                c->vnpus[i].tpl, c->vnpus[i].in_use ? "true" : "false");
    fprintf(f, "]}%s\n", last ? "" : ",");
}

static int save(int fd, const struct state *s) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return DCMI_ERR_CODE_FILE_OPERATE_FAIL;
    fprintf(f, "{\"driver_version\": \"%s\", \"init_error\": %d, \"cards\": [\n", s->driver_version, s->init_error);
    for (int i = 0; i < s->ncards; i++) {
        fprintf(f, "  {\"card_id\": %d, \"chips\": [\n", s->cards[i].card_id);
        for (int k = 0; k < s->cards[i].nchips; k++) save_chip(f, &s->cards[i].chips[k], k == s->cards[i].nchips - 1);
        fprintf(f, "  ]}%s\n", i == s->ncards - 1 ? "" : ",");
    }
    fprintf(f, "]}\n");
    fclose(f);
    int rc = DCMI_OK;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, len, 0) != (ssize_t)len) rc = DCMI_ERR_CODE_FILE_OPERATE_FAIL;
    free(buf);
    return rc;
}

/* ----- lookups ------------------------------------------------------------------------------------- */

struct session {
    int fd;
    struct state s;
};

/* Open the state for one call: DCMI_OK, or the error the call returns. */
static int begin(struct session *x) {
    if (!g_initialised) return DCMI_ERR_CODE_NOT_REDAY;
    x->fd = lock_state();
    if (x->fd < 0) return DCMI_ERR_CODE_FILE_OPERATE_FAIL;
    int rc = load(x->fd, &x->s);
    if (rc != DCMI_OK) unlock_state(x->fd);
    return rc;
}

static int end(struct session *x, int rc) {
    unlock_state(x->fd);
    return rc;
}

static struct card *find_card(struct state *s, int card_id) {
    for (int i = 0; i < s->ncards; i++)
        if (s->cards[i].card_id == card_id) return &s->cards[i];
    return NULL;
}

static struct chip *find_chip(struct state *s, int card_id, int device_id) {
    struct card *card = find_card(s, card_id);
    if (!card || device_id < 0 || device_id >= card->nchips) return NULL;
    return &card->chips[device_id];
}

static const struct tpl *templates_of(const struct chip *c) {
    const struct variant *v = find_variant(c->name);
    if (v) return v->templates;
    return is_training(c) ? TRAINING_TEMPLATES : INFERENCE_TEMPLATES;
}

static const struct tpl *find_template(const struct chip *c, const char *name) {
    for (const struct tpl *t = templates_of(c); t->name; t++)
        if (strcmp(t->name, name) == 0) return t;
    return NULL;
}

static unsigned long long template_memory(const struct chip *c, const struct tpl *t) {
    for (int i = 0; i < c->noverrides; i++)
        if (strcmp(c->overrides[i].tpl, t->name) == 0) return c->overrides[i].mem_mib;
    if (t->mem_mib) return t->mem_mib;
    return c->aicore ? c->mem_mib * t->aicore / c->aicore : 0;
}

struct usage {
    unsigned aicore, aicpu;
    unsigned long long mem_mib;
};

static struct usage used_by_vnpus(const struct chip *c) {
    struct usage u = {0, 0, 0};
    for (int i = 0; i < c->nvnpus; i++) {
        const struct tpl *t = find_template(c, c->vnpus[i].tpl);
        if (!t) continue;
        u.aicore += t->aicore;
        u.aicpu += t->aicpu;
        u.mem_mib += template_memory(c, t);
    }
    return u;
}

static unsigned id_base(const struct chip *c) { return c->phy_id * 16 + 100; }
static unsigned id_span(const struct chip *c) { return is_training(c) ? TRAINING_ID_SPAN : INFERENCE_ID_SPAN; }
static int max_vnpus(const struct chip *c) { return is_training(c) ? MAX_VNPUS : INFERENCE_MAX_VNPUS; }

static struct vnpu *find_vnpu(struct chip *c, unsigned vdev_id) {
    for (int i = 0; i < c->nvnpus; i++)
        if (c->vnpus[i].vdev_id == vdev_id) return &c->vnpus[i];
    return NULL;
}

/* ----- the API ------------------------------------------------------------------------------------- */

int dcmi_init(void) {
    int fd = lock_state();
    if (fd < 0) return DCMI_ERR_CODE_FILE_OPERATE_FAIL;
    struct state *s = malloc(sizeof *s);
    if (!s) {
        unlock_state(fd);
        return DCMI_ERR_CODE_INNER_ERR;
    }
    int rc = load(fd, s);
    if (rc == DCMI_OK && s->init_error) rc = s->init_error;
    free(s);
    unlock_state(fd);
    g_initialised = rc == DCMI_OK;
    return rc;
}

int dcmi_get_driver_version(char *driver_ver, unsigned int len) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    if (!driver_ver || len <= strlen(x.s.driver_version)) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    strcpy(driver_ver, x.s.driver_version);
    return end(&x, DCMI_OK);
}

int dcmi_get_card_num_list(int *card_num, int *card_list, int list_len) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    if (!card_num || !card_list || list_len < x.s.ncards) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    *card_num = x.s.ncards;
    for (int i = 0; i < x.s.ncards; i++) card_list[i] = x.s.cards[i].card_id;
    return end(&x, DCMI_OK);
}

int dcmi_get_card_list(int *card_num, int *card_list, int list_len) {
    return dcmi_get_card_num_list(card_num, card_list, list_len);
}

int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    struct card *card = find_card(&x.s, card_id);
    if (!card) return end(&x, DCMI_ERR_CODE_INVALID_DEVICE_ID);
    if (!device_num) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    *device_num = card->nchips;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_id_in_card(int card_id, int *device_id_max, int *mcu_id, int *cpu_id) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    struct card *card = find_card(&x.s, card_id);
    if (!card) return end(&x, DCMI_ERR_CODE_INVALID_DEVICE_ID);
    if (!device_id_max || !mcu_id || !cpu_id) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    /* NPU chips are [0, device_id_max); the MCU follows them; no control CPU is exposed (-1). */
    *device_id_max = card->nchips;
    *mcu_id = card->nchips;
    *cpu_id = -1;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    struct chip *c = find_chip(&x.s, card_id, device_id);
    if (!c) return end(&x, DCMI_ERR_CODE_INVALID_DEVICE_ID);
    if (!device_logic_id) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    *device_logic_id = (int)c->logic_id;
    return end(&x, DCMI_OK);
}

/* Find a chip by logic (by_phy 0) or physical (by_phy 1) id; fills card/device ids. */
static struct chip *chip_by_id(struct state *s, unsigned id, int by_phy, int *card_id, int *device_id) {
    for (int i = 0; i < s->ncards; i++)
        for (int k = 0; k < s->cards[i].nchips; k++) {
            struct chip *c = &s->cards[i].chips[k];
            if ((by_phy ? c->phy_id : c->logic_id) == id) {
                if (card_id) *card_id = s->cards[i].card_id;
                if (device_id) *device_id = k;
                return c;
            }
        }
    return NULL;
}

int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    struct chip *c = chip_by_id(&x.s, logicid, 0, NULL, NULL);
    if (!c) return end(&x, DCMI_ERR_CODE_INVALID_DEVICE_ID);
    if (!phyid) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    *phyid = c->phy_id;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_logicid_from_phyid(unsigned int phyid, unsigned int *logicid) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    struct chip *c = chip_by_id(&x.s, phyid, 1, NULL, NULL);
    if (!c) return end(&x, DCMI_ERR_CODE_INVALID_DEVICE_ID);
    if (!logicid) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    *logicid = c->logic_id;
    return end(&x, DCMI_OK);
}

static int ids_from(unsigned id, int by_phy, int *card_id, int *device_id) {
    struct session x;
    int rc = begin(&x);
    if (rc != DCMI_OK) return rc;
    if (!card_id || !device_id) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    return end(&x, chip_by_id(&x.s, id, by_phy, card_id, device_id) ? DCMI_OK : DCMI_ERR_CODE_INVALID_DEVICE_ID);
}

int dcmi_get_card_id_device_id_from_logicid(int *card_id, int *device_id, unsigned int device_logic_id) {
    return ids_from(device_logic_id, 0, card_id, device_id);
}

int dcmi_get_card_id_device_id_from_phyid(int *card_id, int *device_id, unsigned int device_phy_id) {
    return ids_from(device_phy_id, 1, card_id, device_id);
}

/* The common shape of per-chip queries: open, find the chip, check the output pointer. */
#define CHIP_QUERY(ptr)                                                         \
    struct session x;                                                           \
    int rc = begin(&x);                                                         \
    if (rc != DCMI_OK) return rc;                                               \
    struct chip *c = find_chip(&x.s, card_id, device_id);                       \
    if (!c) return end(&x, DCMI_ERR_CODE_INVALID_DEVICE_ID);                    \
    if (!(ptr)) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER)

int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info) {
    CHIP_QUERY(chip_info);
    memset(chip_info, 0, sizeof *chip_info);
    strcpy((char *)chip_info->chip_type, "Ascend");
    strncpy((char *)chip_info->chip_name, c->name, DCMI_NAME_LEN - 1);
    strcpy((char *)chip_info->chip_ver, "V1");
    chip_info->aicore_cnt = c->aicore;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_pcie_info_v2(int card_id, int device_id, struct dcmi_pcie_info_all *pcie_info) {
    CHIP_QUERY(pcie_info);
    memset(pcie_info, 0, sizeof *pcie_info);
    pcie_info->venderid = 0x19e5; /* Huawei's PCI vendor id */
    pcie_info->subvenderid = 0x0200;
    pcie_info->deviceid = is_training(c) ? 0xd802 : 0xd500;
    pcie_info->subdeviceid = 0x0100;
    pcie_info->domain = c->pci[0];
    pcie_info->bdf_busid = (unsigned)c->pci[1];
    pcie_info->bdf_deviceid = (unsigned)c->pci[2];
    pcie_info->bdf_funcid = (unsigned)c->pci[3];
    return end(&x, DCMI_OK);
}

int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info) {
    CHIP_QUERY(hbm_info);
    if (!is_training(c)) return end(&x, DCMI_ERR_CODE_NOT_SUPPORT);
    memset(hbm_info, 0, sizeof *hbm_info);
    hbm_info->memory_size = c->mem_mib;
    hbm_info->memory_usage = c->mem_used_mib;
    hbm_info->freq = 1600;
    hbm_info->temp = 40;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_memory_info_v3(int card_id, int device_id, struct dcmi_get_memory_info_stru *memory_info) {
    CHIP_QUERY(memory_info);
    memset(memory_info, 0, sizeof *memory_info);
    unsigned long long total = is_training(c) ? TRAINING_DDR_MIB : c->mem_mib;
    unsigned long long used = is_training(c) ? 0 : c->mem_used_mib;
    memory_info->memory_size = total;
    memory_info->memory_available = total - (used < total ? used : total);
    memory_info->freq = 3200;
    memory_info->utiliza = total ? (unsigned)(used * 100 / total) : 0;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_aicore_info(int card_id, int device_id, struct dcmi_aicore_info *aicore_info) {
    CHIP_QUERY(aicore_info);
    aicore_info->freq = is_training(c) ? 1800 : 1080;
    aicore_info->cur_freq = aicore_info->freq;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_die_v2(int card_id, int device_id, int input_type, struct dcmi_die_id *die_id) {
    CHIP_QUERY(die_id);
    if (input_type != DCMI_DIE_NDIE && input_type != DCMI_DIE_VDIE) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    for (int i = 0; i < 5; i++) die_id->soc_die[i] = c->die[i];
    return end(&x, DCMI_OK);
}

int dcmi_get_device_health(int card_id, int device_id, unsigned int *health) {
    CHIP_QUERY(health);
    *health = c->health;
    return end(&x, DCMI_OK);
}

int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count, unsigned int *error_code_list,
                                 unsigned int list_len) {
    CHIP_QUERY(error_count && error_code_list);
    if (list_len < (unsigned)c->nerrors) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    *error_count = c->nerrors;
    memcpy(error_code_list, c->errors, (size_t)c->nerrors * sizeof(unsigned));
    return end(&x, DCMI_OK);
}

int dcmi_get_device_resource_info(int card_id, int device_id, struct dcmi_proc_mem_info *proc_info, int *proc_num) {
    CHIP_QUERY(proc_info && proc_num);
    *proc_num = c->nprocs;
    for (int i = 0; i < c->nprocs; i++) {
        proc_info[i].proc_id = c->procs[i].pid;
        proc_info[i].proc_mem_usage = (unsigned long)(c->procs[i].mem_mib * MIB);
    }
    return end(&x, DCMI_OK);
}

int dcmi_create_vdevice(int card_id, int device_id, struct dcmi_create_vdev_res_stru *vdev,
                        struct dcmi_create_vdev_out *out) {
    CHIP_QUERY(vdev && out);
    char name[sizeof vdev->template_name + 1];
    memcpy(name, vdev->template_name, sizeof vdev->template_name);
    name[sizeof vdev->template_name] = '\0';
    const struct tpl *t = find_template(c, name);
    if (!t) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    unsigned id = vdev->vdev_id;
    if (id != DCMI_VDEV_AUTO_ID && (id < id_base(c) || id >= id_base(c) + id_span(c) || find_vnpu(c, id)))
        return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    if (!c->dynamic_vnpu) return end(&x, DCMI_ERR_CODE_NOT_SUPPORT);
    if (c->nprocs > 0) return end(&x, DCMI_ERR_CODE_RESOURCE_OCCUPIED);
    struct usage u = used_by_vnpus(c);
    if (c->nvnpus >= max_vnpus(c) || u.aicore + t->aicore > c->aicore || u.aicpu + t->aicpu > c->aicpu ||
        u.mem_mib + template_memory(c, t) > c->mem_mib)
        return end(&x, DCMI_ERR_CODE_NOT_SUPPORT);
    if (id == DCMI_VDEV_AUTO_ID)
        for (id = id_base(c); find_vnpu(c, id); id++) continue;
    struct vnpu *v = &c->vnpus[c->nvnpus++];
    v->vdev_id = id;
    strcpy(v->tpl, t->name);
    v->in_use = 0;
    rc = save(x.fd, &x.s);
    if (rc != DCMI_OK) return end(&x, rc);
    memset(out, 0, sizeof *out);
    out->vdev_id = id;
    out->vfg_id = DCMI_VDEV_AUTO_ID; /* reserved, as documented */
    return end(&x, DCMI_OK);
}

int dcmi_set_destroy_vdevice(int card_id, int device_id, unsigned int vdevid) {
    CHIP_QUERY(1);
    struct vnpu *v = find_vnpu(c, vdevid);
    if (!v) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
    if (!c->dynamic_vnpu) return end(&x, DCMI_ERR_CODE_NOT_SUPPORT);
    if (v->in_use) return end(&x, DCMI_ERR_CODE_RESOURCE_OCCUPIED);
    int index = (int)(v - c->vnpus);
    memmove(&c->vnpus[index], &c->vnpus[index + 1], (size_t)(c->nvnpus - index - 1) * sizeof *v);
    c->nvnpus--;
    return end(&x, save(x.fd, &x.s));
}

static void fill_computing(struct dcmi_computing_resource *r, unsigned aicore, unsigned aicpu,
                           unsigned long long mem_mib) {
    r->aic = (float)aicore;
    r->device_aicpu = (unsigned short)aicpu;
    r->memory_size = mem_mib;
    r->vdev_memory_total = mem_mib;
}

int dcmi_get_device_info(int card_id, int device_id, int main_cmd, unsigned int sub_cmd, void *buf,
                         unsigned int *size) {
    CHIP_QUERY(buf && size);
    if (main_cmd != DCMI_MAIN_CMD_VDEV_MNG) return end(&x, DCMI_ERR_CODE_NOT_SUPPORT);
    struct usage u = used_by_vnpus(c);
    if (sub_cmd == DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE) {
        if (*size < sizeof(struct dcmi_vdev_query_stru)) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
        struct dcmi_vdev_query_stru *q = buf;
        struct vnpu *v = find_vnpu(c, q->vdev_id);
        if (!v) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
        const struct tpl *t = find_template(c, v->tpl);
        unsigned id = q->vdev_id;
        memset(q, 0, sizeof *q);
        q->vdev_id = id;
        strncpy(q->query_info.name, v->tpl, DCMI_VDEV_RES_NAME_LEN - 1);
        q->query_info.status = 1;
        q->query_info.is_container_used = (unsigned)v->in_use;
        q->query_info.vfid = id - id_base(c) + 1;
        if (t) fill_computing(&q->query_info.computing, t->aicore, t->aicpu, template_memory(c, t));
        *size = sizeof *q;
    } else if (sub_cmd == DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE) {
        if (*size < sizeof(struct dcmi_soc_total_resource)) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
        struct dcmi_soc_total_resource *r = buf;
        memset(r, 0, sizeof *r);
        r->vdev_num = (unsigned)c->nvnpus;
        for (int i = 0; i < c->nvnpus; i++) r->vdev_id[i] = c->vnpus[i].vdev_id;
        fill_computing(&r->computing, c->aicore, c->aicpu, c->mem_mib);
        *size = sizeof *r;
    } else if (sub_cmd == DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE) {
        if (*size < sizeof(struct dcmi_soc_free_resource)) return end(&x, DCMI_ERR_CODE_INVALID_PARAMETER);
        struct dcmi_soc_free_resource *r = buf;
        memset(r, 0, sizeof *r);
        unsigned aicpu_free = u.aicpu <= c->aicpu ? c->aicpu - u.aicpu : 0;
        unsigned aicore_free = u.aicore <= c->aicore ? c->aicore - u.aicore : 0;
        unsigned long long mem_free = u.mem_mib <= c->mem_mib ? c->mem_mib - u.mem_mib : 0;
        fill_computing(&r->computing, aicore_free, aicpu_free, mem_free);
        *size = sizeof *r;
    } else {
        return end(&x, DCMI_ERR_CODE_NOT_SUPPORT);
    }
    return end(&x, DCMI_OK);
}
