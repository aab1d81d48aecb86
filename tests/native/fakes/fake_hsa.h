/* What the fake HSA runtime (fake_hsa.c, libhsa-runtime64.so.1) offers beyond HSA's API, for the fake HIP
 * runtime and the tests: a kernel run on a queue, and the parser of the CU mask variables both runtimes read.
 * The HSA types themselves are the library's (native/hip/gph.h), declared there from HSA's reference. */
#ifndef FAKE_HSA_H
#define FAKE_HSA_H

#include <stdlib.h>
#include <string.h>

#include "../../../native/hip/gph.h"

/* HSA's entry points the fakes and the test program call (hsa.h, hsa_ext_amd.h) */
hsa_status_t hsa_init(void);
hsa_status_t hsa_shut_down(void);
hsa_status_t hsa_iterate_agents(hsa_status_t (*callback)(hsa_agent_t agent, void *data), void *data);
hsa_status_t hsa_agent_get_info(hsa_agent_t agent, int attribute, void *value);
hsa_status_t hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type, hsa_queue_callback callback,
                              void *data, uint32_t private_segment_size, uint32_t group_segment_size,
                              hsa_queue_t **queue);
hsa_status_t hsa_queue_destroy(hsa_queue_t *queue);
hsa_status_t hsa_amd_queue_cu_set_mask(const hsa_queue_t *queue, uint32_t num_cu_mask_count, const uint32_t *cu_mask);
hsa_status_t hsa_amd_queue_cu_get_mask(const hsa_queue_t *queue, uint32_t num_cu_mask_count, uint32_t *cu_mask);

/* Run one kernel of `work_cu_us` CU-microseconds on `queue` (what a real runtime does by writing an AQL
 * dispatch packet and ringing the doorbell). HSA_STATUS_ERROR: the kernel would never finish (no CU of the
 * queue's mask can take its work); HSA_STATUS_ERROR_INVALID_QUEUE for a queue the runtime did not make. */
hsa_status_t fakehsa_dispatch(const hsa_queue_t *queue, uint64_t work_cu_us);

#define FAKE_CU_WORDS 32
#define FAKE_MAX_GPUS 16

/* HSA_CU_MASK / ROC_GLOBAL_CU_MASK, as ROCm's "Setting the number of CUs" documents them:
 *   ID = decimal; ID_list = (ID | ID-ID)[, (ID | ID-ID)]*; CU_list = 0x<hex> | ID_list;
 *   CU_Set = GPU_list : CU_list; VAR = CU_Set [; CU_Set]*
 * The listed CUs are enabled on the listed GPUs (indices after ROCR_VISIBLE_DEVICES), the rest disabled;
 * unlisted GPUs keep every CU. Parsing stops at a syntax error: that set and the ones after it are ignored.
 * A repeated GPU or CU, and a mask with no CU (0x0), are syntax errors. Fills mask[g] and has[g]. */
static inline const char *fake_cu_skip(const char *p) {
    while (*p == ' ') p++;
    return p;
}

/* An ID_list into bits (up to `limit` ids); NULL on a syntax error or a repeated id. */
static inline const char *fake_cu_ids(const char *p, uint32_t *bits, uint32_t limit) {
    for (;;) {
        p = fake_cu_skip(p);
        if (*p < '0' || *p > '9') return NULL;
        char *end;
        unsigned long a = strtoul(p, &end, 10), b = a;
        p = end;
        if (*p == '-') {
            if (p[1] < '0' || p[1] > '9') return NULL;
            b = strtoul(p + 1, &end, 10);
            p = end;
        }
        if (b < a || b >= limit) return NULL;
        for (unsigned long i = a; i <= b; i++) {
            if (bits[i / 32] >> (i % 32) & 1) return NULL;
            bits[i / 32] |= 1u << (i % 32);
        }
        p = fake_cu_skip(p);
        if (*p != ',') return p;
        p++;
    }
}

static inline void fake_cu_parse(const char *text, uint32_t mask[][FAKE_CU_WORDS], int *has) {
    const char *p = text;
    while (p != NULL && *(p = fake_cu_skip(p)) != '\0') {
        uint32_t gpus[1] = {0}, cus[FAKE_CU_WORDS] = {0};
        p = fake_cu_ids(p, gpus, FAKE_MAX_GPUS);
        if (p == NULL || *p != ':') return;
        p = fake_cu_skip(p + 1);
        if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
            const char *h = p + 2, *e = h;
            while ((*e >= '0' && *e <= '9') || (*e >= 'a' && *e <= 'f') || (*e >= 'A' && *e <= 'F')) e++;
            if (e == h || e - h > 256) return;
            for (int bit = 0; e - 1 - bit / 4 >= h; bit += 4) {
                char c = *(e - 1 - bit / 4);
                uint32_t v = (uint32_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
                cus[bit / 32] |= v << (bit % 32);
            }
            p = fake_cu_skip(e);
        } else {
            p = fake_cu_ids(p, cus, 32 * FAKE_CU_WORDS);
            if (p == NULL) return;
        }
        int any = 0;
        for (int w = 0; w < FAKE_CU_WORDS; w++) any |= cus[w] != 0;
        if (!any || (*p != ';' && *p != '\0')) return;
        for (int g = 0; g < FAKE_MAX_GPUS; g++)
            if ((gpus[0] >> g & 1) && has[g]) return; /* a GPU named twice */
        for (int g = 0; g < FAKE_MAX_GPUS; g++) {
            if (!(gpus[0] >> g & 1)) continue;
            has[g] = 1;
            memcpy(mask[g], cus, sizeof cus);
        }
        if (*p == ';') p++;
    }
}

#endif
