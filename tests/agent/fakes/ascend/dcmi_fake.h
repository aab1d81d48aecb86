/* A fake of Huawei's DCMI management library (libdcmi.so) for gpupool's Ascend adapter tests
 * (src/gpupool/agent/devices/ascend.py). Written for gpupool from the public DCMI API reference
 * (the 910B / 310P "DCMI API" pages: function signatures, structure layouts, error code values) and
 * the public vNPU (Ascend virtual instance) user guides; no vendor header or code is used. The
 * structures below reproduce only the documented layouts the adapter reads, field for field, so a
 * caller built against this header would read the real library the same way.
 *
 * State: a JSON file named by the environment variable FAKE_DCMI_STATE, read at every call and
 * written back (pretty-printed, same keys) after every change, under an exclusive flock(2) on the
 * file. Several processes may share it. Schema (every key optional unless marked):
 *
 *   { "driver_version": "24.1.rc3",
 *     "init_error": 0,                  dcmi_init returns this when nonzero (a driver that is not up)
 *     "cards": [                        in dcmi_get_card_num_list order
 *       { "card_id": 0,                 (required) DCMI's card (NPU management unit) id; ids need not
 *                                       be contiguous, as on real servers
 *         "chips": [                    device_id = index in this list (the NPU chips of the card)
 *           { "chip_name": "910B",      (required) "910B*" = training card, "310P*" = inference card;
 *                                       "910B2" / "910B3" / "910B4": a variant (below)
 *             "phy_id": 0, "logic_id": 0,   physical id (/dev/davinci<phy_id>) and logic id
 *             "aicore": 32,             AI Cores (training: 30 or 32 per the vNPU guides; 310P: 8)
 *             "aicpu": 14,              AI CPUs (310P: 7)
 *             "memory_mib": 65536,      HBM (training) or DDR (310P) size
 *             "memory_used_mib": 0,
 *             "pci": [0, 193, 0, 0],    domain, bus, device, function
 *             "die_id": [6629, 0, 0, 0, 0],   dcmi_get_device_die_v2 (default: 0x19e5, 0, 0, 0, phy_id)
 *             "health": 0,              dcmi_get_device_health: 0 ok, 1 minor, 2 major, 3 critical alarm
 *             "errors": [],             dcmi_get_device_errorcode_v2: the chip's current error codes
 *             "processes": [ { "pid": 1234, "memory_mib": 512 } ],   whole-card work on the chip
 *             "dynamic_vnpu": true,     false: dcmi_create_vdevice / dcmi_set_destroy_vdevice refuse with
 *                                       DCMI_ERR_CODE_NOT_SUPPORT (static vNPUs only, created by an
 *                                       administrator: put them in "vnpus"). Default: true on 310P,
 *                                       false on training cards (vNPUs are created dynamically only on
 *                                       inference cards per the vNPU guides; a parameter because it
 *                                       depends on driver version and cluster software)
 *             "template_memory_mib": { "vir02": 4369 },   per-template memory overrides (see below)
 *             "vnpus": [ { "vdev_id": 100, "template": "vir04", "in_use": false } ] } ] } ] }
 *
 * Templates (template_name of dcmi_create_vdevice):
 *   training (910B*): vir02, vir04, vir08, vir16 = 2 / 4 / 8 / 16 AI Cores, no AI CPU accounting
 *     (the guides give none per template).
 *   inference (310P*): vir01 (1 AI Core, 1 AI CPU), vir02 (2, 2), vir02_1c (2, 1), vir04 (4, 4),
 *     vir04_3c (4, 3), vir04_3c_ndvpp (4, 3), vir04_4c_dvpp (4, 4): "virNN" = AI Cores, "Nc" = AI CPUs.
 *   Memory of a template: memory_mib * template AI Cores / chip AI Cores, rounded down, unless
 *     template_memory_mib names it. This reproduces the published figures (310P, 24 GiB: vir01 3 GiB,
 *     vir02 6 GiB, vir04 12 GiB; 30-core training card, 32 GiB: vir02 2184 MiB ... vir16 17476 MiB) but
 *     the 64 GB 910B figures are not published: an assumption, hence the override.
 *
 * Variants: a chip named exactly "910B2", "910B3" or "910B4" (what DCMI's chip info reports for the Atlas
 * A2 training chips) has its own templates instead of vir02-vir16, each naming its AI Cores, AI CPUs and
 * memory ("vir10_3c_32g": 10 AI Cores, 3 AI CPUs, 32 GiB), and its own defaults for aicore / aicpu /
 * memory_mib (HAMi's Ascend device table; npu-smi's vNPU output for the 910B3):
 *   910B2: 24 AI Cores, 6 AI CPUs, 64 GiB: vir03_1c_8g, vir06_1c_16g, vir12_3c_32g
 *   910B3: 20 AI Cores, 7 AI CPUs, 64 GiB: vir05_1c_16g, vir10_3c_32g
 *   910B4: 20 AI Cores, 7 AI CPUs, 32 GiB: vir05_1c_8g, vir10_3c_16g
 *   A template's memory is the one its name gives (template_memory_mib still overrides it). AI CPUs are
 *   accounted as on the 310P: a create that would take more than the chip's is refused.
 *
 * Behaviour (the documented semantics; where the documents only say "nonzero on failure" the code
 * chosen is named here and the adapter must not depend on it beyond the mapping it documents):
 * - every function other than dcmi_init returns DCMI_ERR_CODE_NOT_REDAY before dcmi_init succeeded.
 * - card_id not in the list / device_id out of range: DCMI_ERR_CODE_INVALID_DEVICE_ID.
 * - NULL output pointers, short lists or buffers: DCMI_ERR_CODE_INVALID_PARAMETER.
 * - dcmi_get_device_hbm_info on a 310P (DDR memory, no HBM): DCMI_ERR_CODE_NOT_SUPPORT; memory there is
 *   read with dcmi_get_device_memory_info_v3. On training cards memory_info_v3 reports the control CPU's
 *   DDR (a fixed 15 GiB here), not the HBM: callers must use the HBM call.
 * - dcmi_create_vdevice(card, dev, {vdev_id, vfg_id, template_name}, out): vdev_id 0xFFFFFFFF = pick the
 *   lowest free id; ids live in [phy_id*16+100, phy_id*16+100+N) with N = 16 (training) or 8 (310P), as
 *   npu-smi create-vnpu documents; at most 16 (training) or 7 (310P) vNPUs. Refusals:
 *     unknown template, id outside the range or already used: DCMI_ERR_CODE_INVALID_PARAMETER;
 *     dynamic_vnpu false: DCMI_ERR_CODE_NOT_SUPPORT;
 *     processes running on the chip (whole-card work): DCMI_ERR_CODE_RESOURCE_OCCUPIED;
 *     not enough free AI Cores, memory, AI CPUs or vNPU count: DCMI_ERR_CODE_NOT_SUPPORT (what npu-smi
 *       reports for an insufficient resource; the adapter checks the free resources first, as npu-smi does).
 * - dcmi_set_destroy_vdevice(card, dev, vdev_id): unknown id DCMI_ERR_CODE_INVALID_PARAMETER; a vNPU in
 *   a container ("in_use") DCMI_ERR_CODE_RESOURCE_OCCUPIED; dynamic_vnpu false DCMI_ERR_CODE_NOT_SUPPORT.
 * - dcmi_get_device_info(card, dev, DCMI_MAIN_CMD_VDEV_MNG, sub, buf, size): sub GET_VDEV_RESOURCE fills a
 *   struct dcmi_vdev_query_stru for buf->vdev_id, GET_TOTAL_RESOURCE a struct dcmi_soc_total_resource,
 *   GET_FREE_RESOURCE a struct dcmi_soc_free_resource (computing.aic, computing.memory_size in MB,
 *   computing.device_aicpu); *size must be at least the structure's size and is set to it.
 * - dcmi_get_device_resource_info: the chip's processes (proc_mem_usage in bytes); proc_info must hold
 *   DCMI_FAKE_MAX_PROC entries.
 */
#ifndef GPUPOOL_DCMI_FAKE_H
#define GPUPOOL_DCMI_FAKE_H

#define DCMI_OK 0
#define DCMI_ERROR_CODE_BASE (-8000)
#define DCMI_ERR_CODE_INVALID_PARAMETER (DCMI_ERROR_CODE_BASE - 1)
#define DCMI_ERR_CODE_OPER_NOT_PERMITTED (DCMI_ERROR_CODE_BASE - 2)
#define DCMI_ERR_CODE_INNER_ERR (DCMI_ERROR_CODE_BASE - 5)
#define DCMI_ERR_CODE_INVALID_DEVICE_ID (DCMI_ERROR_CODE_BASE - 7)
#define DCMI_ERR_CODE_DEVICE_NOT_EXIST (DCMI_ERROR_CODE_BASE - 8)
#define DCMI_ERR_CODE_NOT_REDAY (DCMI_ERROR_CODE_BASE - 12)
#define DCMI_ERR_CODE_FILE_OPERATE_FAIL (DCMI_ERROR_CODE_BASE - 14)
#define DCMI_ERR_CODE_RESOURCE_OCCUPIED (DCMI_ERROR_CODE_BASE - 20)
#define DCMI_ERR_CODE_NOT_SUPPORT (DCMI_ERROR_CODE_BASE - 255)

#define DCMI_NAME_LEN 32
#define DCMI_VDEV_RES_NAME_LEN 16
#define DCMI_VDEV_FOR_RESERVE 32
#define DCMI_SOC_SPLIT_MAX 32
#define DCMI_VDEV_AUTO_ID 0xFFFFFFFFu
#define DCMI_FAKE_MAX_PROC 32

enum dcmi_main_cmd_fake { DCMI_MAIN_CMD_VDEV_MNG = 52 };
enum dcmi_vmng_sub_cmd_fake {
    DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE = 0,
    DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE = 1,
    DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE = 2,
};

struct dcmi_chip_info {
    unsigned char chip_type[DCMI_NAME_LEN];
    unsigned char chip_name[DCMI_NAME_LEN];
    unsigned char chip_ver[DCMI_NAME_LEN];
    unsigned int aicore_cnt;
};

struct dcmi_pcie_info_all {
    unsigned int venderid;
    unsigned int subvenderid;
    unsigned int deviceid;
    unsigned int subdeviceid;
    int domain;
    unsigned int bdf_busid;
    unsigned int bdf_deviceid;
    unsigned int bdf_funcid;
    unsigned char reserve[32];
};

struct dcmi_hbm_info {
    unsigned long long memory_size; /* MB */
    unsigned int freq;
    unsigned long long memory_usage; /* MB */
    int temp;
    unsigned int bandwith_util_rate;
};

struct dcmi_get_memory_info_stru {
    unsigned long long memory_size; /* MB */
    unsigned long long memory_available;
    unsigned int freq;
    unsigned long hugepagesize;
    unsigned long hugepages_total;
    unsigned long hugepages_free;
    unsigned int utiliza;
    unsigned char reserve[60];
};

struct dcmi_aicore_info {
    unsigned int freq;
    unsigned int cur_freq;
};

enum dcmi_die_type_fake { DCMI_DIE_NDIE = 0, DCMI_DIE_VDIE = 1 };

struct dcmi_die_id {
    unsigned int soc_die[5];
};

struct dcmi_proc_mem_info {
    int proc_id;
    unsigned long proc_mem_usage; /* bytes */
};

struct dcmi_base_resource {
    unsigned long long token;
    unsigned long long token_max;
    unsigned long long task_timeout;
    unsigned int vfg_id;
    unsigned char vip_mode;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE - 1];
};

struct dcmi_computing_resource {
    float aic;
    float aiv;
    unsigned short dsa;
    unsigned short rtsq;
    unsigned short acsq;
    unsigned short cdqm;
    unsigned short c_core;
    unsigned short ffts;
    unsigned short sdma;
    unsigned short pcie_dma;
    unsigned long long memory_size; /* MB */
    unsigned int event_id;
    unsigned int notify_id;
    unsigned int stream_id;
    unsigned int model_id;
    unsigned short topic_schedule_aicpu;
    unsigned short host_ctrl_cpu;
    unsigned short host_aicpu;
    unsigned short device_aicpu;
    unsigned short topic_ctrl_cpu_slot;
    unsigned int vdev_aicore_utilization;
    unsigned long long vdev_memory_total;
    unsigned long long vdev_memory_free;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE - (2 * sizeof(unsigned long long) + sizeof(unsigned int))];
};

struct dcmi_media_resource {
    float jpegd;
    float jpege;
    float vpc;
    float vdec;
    float pngd;
    float venc;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE];
};

struct dcmi_create_vdev_res_stru {
    unsigned int vdev_id;
    unsigned int vfg_id;
    char template_name[32];
    unsigned char reserved[64];
};

struct dcmi_create_vdev_out {
    unsigned int vdev_id;
    unsigned int pcie_bus;
    unsigned int pcie_device;
    unsigned int pcie_func;
    unsigned int vfg_id;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE];
};

struct dcmi_vdev_query_info {
    char name[DCMI_VDEV_RES_NAME_LEN];
    unsigned int status;
    unsigned int is_container_used;
    unsigned int vfid;
    unsigned int vfg_id;
    unsigned long long container_id;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};

struct dcmi_vdev_query_stru {
    unsigned int vdev_id;
    struct dcmi_vdev_query_info query_info;
};

struct dcmi_soc_free_resource {
    unsigned int vfg_num;
    unsigned int vfg_bitmap;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};

struct dcmi_soc_total_resource {
    unsigned int vdev_num;
    unsigned int vdev_id[DCMI_SOC_SPLIT_MAX];
    unsigned int vfg_num;
    unsigned int vfg_bitmap;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};

int dcmi_init(void);
int dcmi_get_driver_version(char *driver_ver, unsigned int len);
int dcmi_get_card_num_list(int *card_num, int *card_list, int list_len);
int dcmi_get_card_list(int *card_num, int *card_list, int list_len);
int dcmi_get_device_num_in_card(int card_id, int *device_num);
int dcmi_get_device_id_in_card(int card_id, int *device_id_max, int *mcu_id, int *cpu_id);
int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id);
int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid);
int dcmi_get_device_logicid_from_phyid(unsigned int phyid, unsigned int *logicid);
int dcmi_get_card_id_device_id_from_logicid(int *card_id, int *device_id, unsigned int device_logic_id);
int dcmi_get_card_id_device_id_from_phyid(int *card_id, int *device_id, unsigned int device_phy_id);
int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info);
int dcmi_get_device_pcie_info_v2(int card_id, int device_id, struct dcmi_pcie_info_all *pcie_info);
int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info);
int dcmi_get_device_memory_info_v3(int card_id, int device_id, struct dcmi_get_memory_info_stru *memory_info);
int dcmi_get_device_aicore_info(int card_id, int device_id, struct dcmi_aicore_info *aicore_info);
int dcmi_get_device_die_v2(int card_id, int device_id, int input_type, struct dcmi_die_id *die_id);
int dcmi_get_device_health(int card_id, int device_id, unsigned int *health);
int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count, unsigned int *error_code_list,
                                 unsigned int list_len);
int dcmi_get_device_resource_info(int card_id, int device_id, struct dcmi_proc_mem_info *proc_info, int *proc_num);
int dcmi_create_vdevice(int card_id, int device_id, struct dcmi_create_vdev_res_stru *vdev,
                        struct dcmi_create_vdev_out *out);
int dcmi_set_destroy_vdevice(int card_id, int device_id, unsigned int vdevid);
int dcmi_get_device_info(int card_id, int device_id, int main_cmd, unsigned int sub_cmd, void *buf,
                         unsigned int *size);

#endif
