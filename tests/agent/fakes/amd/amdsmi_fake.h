/* The part of AMD SMI's C API (libamd_smi.so) that gpupool's AMD adapter uses, written for the fake library.
 *
 * Types, enum values and struct layouts follow AMD SMI's public API reference as the amdsmi Python binding
 * 7.0.x sees it (the binding reads these structs with ctypes, so every size and offset must agree: the
 * _Static_asserts below pin the sizes the binding computes). Only what fake_amdsmi.c implements is declared;
 * every other entry point the binding resolves is a stub returning AMDSMI_STATUS_NOT_SUPPORTED (symbols.txt).
 */
#ifndef GPUPOOL_AMDSMI_FAKE_H
#define GPUPOOL_AMDSMI_FAKE_H

#include <stddef.h>
#include <stdint.h>

typedef void *amdsmi_processor_handle;
typedef void *amdsmi_socket_handle;

typedef enum {
    AMDSMI_STATUS_SUCCESS = 0,
    AMDSMI_STATUS_INVAL = 1,
    AMDSMI_STATUS_NOT_SUPPORTED = 2,
    AMDSMI_STATUS_BUSY = 30,
    AMDSMI_STATUS_NOT_FOUND = 31,
    AMDSMI_STATUS_NOT_INIT = 32,
    AMDSMI_STATUS_DRIVER_NOT_LOADED = 34,
    AMDSMI_STATUS_NO_DATA = 40,
    AMDSMI_STATUS_INSUFFICIENT_SIZE = 41,
    AMDSMI_STATUS_UNEXPECTED_DATA = 43,
    AMDSMI_STATUS_OUT_OF_RESOURCES = 15,
    AMDSMI_STATUS_INIT_ERROR = 18,
    AMDSMI_STATUS_ARG_PTR_NULL = 53,
    AMDSMI_STATUS_SETTING_UNAVAILABLE = 55,
} amdsmi_status_t;

enum {
    AMDSMI_INIT_AMD_GPUS = 2, /* bit of amdsmi_init's flags asking for AMD GPUs */
};

typedef enum {
    AMDSMI_PROCESSOR_TYPE_AMD_GPU = 1,
} processor_type_t;

typedef enum {
    AMDSMI_COMPUTE_PARTITION_INVALID = 0,
    AMDSMI_COMPUTE_PARTITION_SPX = 1,
    AMDSMI_COMPUTE_PARTITION_DPX = 2,
    AMDSMI_COMPUTE_PARTITION_TPX = 3,
    AMDSMI_COMPUTE_PARTITION_QPX = 4,
    AMDSMI_COMPUTE_PARTITION_CPX = 5,
} amdsmi_compute_partition_type_t;

typedef enum {
    AMDSMI_MEMORY_PARTITION_UNKNOWN = 0,
    AMDSMI_MEMORY_PARTITION_NPS1 = 1,
    AMDSMI_MEMORY_PARTITION_NPS2 = 2,
    AMDSMI_MEMORY_PARTITION_NPS4 = 4,
    AMDSMI_MEMORY_PARTITION_NPS8 = 8,
} amdsmi_memory_partition_type_t;

typedef enum {
    AMDSMI_VRAM_TYPE_HBM2E = 3,
    AMDSMI_VRAM_TYPE_HBM3 = 4,
} amdsmi_vram_type_t;

typedef enum {
    AMDSMI_EVT_NOTIF_NONE = 0,
    AMDSMI_EVT_NOTIF_VMFAULT = 1,
    AMDSMI_EVT_NOTIF_THERMAL_THROTTLE = 2,
    AMDSMI_EVT_NOTIF_GPU_PRE_RESET = 3,
    AMDSMI_EVT_NOTIF_GPU_POST_RESET = 4,
    AMDSMI_EVT_NOTIF_LAST = 13,
} amdsmi_evt_notification_type_t;

#define AMDSMI_MAX_STRING_LENGTH 256
#define AMDSMI_GPU_UUID_SIZE 38

/* PCI address: function in bits 0-2, device 3-7, bus 8-15, domain 16-63 of one 64-bit word. */
typedef union {
    struct {
        uint64_t function_number : 3;
        uint64_t device_number : 5;
        uint64_t bus_number : 8;
        uint64_t domain_number : 48;
    } fields;
    uint64_t as_uint;
} amdsmi_bdf_t;

typedef struct {
    char market_name[AMDSMI_MAX_STRING_LENGTH];
    uint32_t vendor_id;
    char vendor_name[AMDSMI_MAX_STRING_LENGTH];
    uint32_t subvendor_id;
    uint64_t device_id;
    uint32_t rev_id;
    char asic_serial[AMDSMI_MAX_STRING_LENGTH];
    uint32_t oam_id;
    uint32_t num_of_compute_units;
    uint64_t target_graphics_version; /* gfx942 is 0x942: the binding prints it in hex */
    uint32_t subsystem_id;
    uint32_t reserved[21];
} amdsmi_asic_info_t;

typedef struct {
    amdsmi_vram_type_t vram_type;
    char vram_vendor[AMDSMI_MAX_STRING_LENGTH];
    uint64_t vram_size; /* MB */
    uint32_t vram_bit_width;
    uint64_t vram_max_bandwidth; /* GB/s */
    uint64_t reserved[37];
} amdsmi_vram_info_t;

typedef struct {
    uint32_t vram_total; /* MB */
    uint32_t vram_used;  /* MB */
    uint32_t reserved[2];
} amdsmi_vram_usage_t;

typedef struct {
    uint64_t kfd_id;
    uint32_t node_id;
    uint32_t current_partition_id;
    uint32_t reserved[12];
} amdsmi_kfd_info_t;

typedef struct {
    uint32_t drm_render; /* the N of /dev/dri/renderD<N> */
    uint32_t drm_card;   /* the N of /dev/dri/card<N> */
    uint32_t hsa_id;
    uint32_t hip_id;
    char hip_uuid[AMDSMI_MAX_STRING_LENGTH];
} amdsmi_enumeration_info_t;

typedef struct {
    char name[AMDSMI_MAX_STRING_LENGTH];
    uint32_t pid;
    uint64_t mem; /* bytes */
    struct {
        uint64_t gfx;
        uint64_t enc;
        uint32_t reserved[12];
    } engine_usage;
    struct {
        uint64_t gtt_mem;
        uint64_t cpu_mem;
        uint64_t vram_mem; /* bytes */
        uint32_t reserved[10];
    } memory_usage;
    char container_name[AMDSMI_MAX_STRING_LENGTH];
    uint32_t cu_occupancy;
    uint32_t reserved[11];
} amdsmi_proc_info_t;

typedef struct {
    uint64_t correctable_count;
    uint64_t uncorrectable_count;
    uint64_t deferred_count;
    uint64_t reserved[5];
} amdsmi_error_count_t;

typedef struct {
    amdsmi_processor_handle processor_handle;
    amdsmi_evt_notification_type_t event;
    char message[AMDSMI_MAX_STRING_LENGTH];
} amdsmi_evt_notification_data_t;

/* nps1 in bit 0, nps2 bit 1, nps4 bit 2, nps8 bit 3 */
typedef union {
    struct {
        uint32_t nps1_cap : 1;
        uint32_t nps2_cap : 1;
        uint32_t nps4_cap : 1;
        uint32_t nps8_cap : 1;
        uint32_t reserved : 28;
    } nps_flags;
    uint32_t nps_cap_mask;
} amdsmi_nps_caps_t;

typedef struct {
    amdsmi_nps_caps_t partition_caps;
    amdsmi_memory_partition_type_t mp_mode;
    uint32_t num_numa_ranges;
    struct {
        amdsmi_vram_type_t memory_type;
        uint64_t start;
        uint64_t end;
    } numa_range[32];
    uint64_t reserved[11];
} amdsmi_memory_partition_config_t;

typedef struct {
    char driver_version[AMDSMI_MAX_STRING_LENGTH];
    char driver_date[AMDSMI_MAX_STRING_LENGTH];
    char driver_name[AMDSMI_MAX_STRING_LENGTH];
} amdsmi_driver_info_t;

/* The sizes the binding's ctypes structs have (x86-64 and aarch64 Linux). */
_Static_assert(sizeof(amdsmi_bdf_t) == 8, "amdsmi_bdf_t");
_Static_assert(sizeof(amdsmi_asic_info_t) == 896, "amdsmi_asic_info_t");
_Static_assert(sizeof(amdsmi_vram_info_t) == 584, "amdsmi_vram_info_t");
_Static_assert(sizeof(amdsmi_vram_usage_t) == 16, "amdsmi_vram_usage_t");
_Static_assert(sizeof(amdsmi_kfd_info_t) == 64, "amdsmi_kfd_info_t");
_Static_assert(sizeof(amdsmi_enumeration_info_t) == 272, "amdsmi_enumeration_info_t");
_Static_assert(sizeof(amdsmi_proc_info_t) == 704, "amdsmi_proc_info_t");
_Static_assert(sizeof(amdsmi_error_count_t) == 64, "amdsmi_error_count_t");
_Static_assert(sizeof(amdsmi_evt_notification_data_t) == 272, "amdsmi_evt_notification_data_t");
_Static_assert(sizeof(amdsmi_memory_partition_config_t) == 872, "amdsmi_memory_partition_config_t");
_Static_assert(sizeof(amdsmi_driver_info_t) == 768, "amdsmi_driver_info_t");

amdsmi_status_t amdsmi_init(uint64_t init_flags);
amdsmi_status_t amdsmi_shut_down(void);
amdsmi_status_t amdsmi_get_socket_handles(uint32_t *socket_count, amdsmi_socket_handle *socket_handles);
amdsmi_status_t amdsmi_get_socket_info(amdsmi_socket_handle socket_handle, size_t len, char *name);
amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle socket_handle, uint32_t *processor_count,
                                             amdsmi_processor_handle *processor_handles);
amdsmi_status_t amdsmi_get_processor_type(amdsmi_processor_handle processor_handle, processor_type_t *processor_type);
amdsmi_status_t amdsmi_get_gpu_device_bdf(amdsmi_processor_handle processor_handle, amdsmi_bdf_t *bdf);
amdsmi_status_t amdsmi_get_gpu_device_uuid(amdsmi_processor_handle processor_handle, unsigned int *uuid_length,
                                           char *uuid);
amdsmi_status_t amdsmi_get_gpu_enumeration_info(amdsmi_processor_handle processor_handle,
                                                amdsmi_enumeration_info_t *info);
amdsmi_status_t amdsmi_get_gpu_asic_info(amdsmi_processor_handle processor_handle, amdsmi_asic_info_t *info);
amdsmi_status_t amdsmi_get_gpu_kfd_info(amdsmi_processor_handle processor_handle, amdsmi_kfd_info_t *info);
amdsmi_status_t amdsmi_get_gpu_vram_info(amdsmi_processor_handle processor_handle, amdsmi_vram_info_t *info);
amdsmi_status_t amdsmi_get_gpu_vram_usage(amdsmi_processor_handle processor_handle, amdsmi_vram_usage_t *info);
amdsmi_status_t amdsmi_get_gpu_driver_info(amdsmi_processor_handle processor_handle, amdsmi_driver_info_t *info);
amdsmi_status_t amdsmi_topo_get_numa_node_number(amdsmi_processor_handle processor_handle, uint32_t *numa_node);
amdsmi_status_t amdsmi_get_gpu_compute_partition(amdsmi_processor_handle processor_handle, char *compute_partition,
                                                 uint32_t len);
amdsmi_status_t amdsmi_set_gpu_compute_partition(amdsmi_processor_handle processor_handle,
                                                 amdsmi_compute_partition_type_t compute_partition);
amdsmi_status_t amdsmi_get_gpu_memory_partition(amdsmi_processor_handle processor_handle, char *memory_partition,
                                                uint32_t len);
amdsmi_status_t amdsmi_set_gpu_memory_partition(amdsmi_processor_handle processor_handle,
                                                amdsmi_memory_partition_type_t memory_partition);
amdsmi_status_t amdsmi_get_gpu_memory_partition_config(amdsmi_processor_handle processor_handle,
                                                       amdsmi_memory_partition_config_t *config);
amdsmi_status_t amdsmi_get_gpu_process_list(amdsmi_processor_handle processor_handle, uint32_t *max_processes,
                                            amdsmi_proc_info_t *list);
amdsmi_status_t amdsmi_get_gpu_total_ecc_count(amdsmi_processor_handle processor_handle, amdsmi_error_count_t *ec);
amdsmi_status_t amdsmi_init_gpu_event_notification(amdsmi_processor_handle processor_handle);
amdsmi_status_t amdsmi_set_gpu_event_notification_mask(amdsmi_processor_handle processor_handle, uint64_t mask);
amdsmi_status_t amdsmi_get_gpu_event_notification(int timeout_ms, uint32_t *num_elem,
                                                  amdsmi_evt_notification_data_t *data);
amdsmi_status_t amdsmi_stop_gpu_event_notification(amdsmi_processor_handle processor_handle);

#endif
