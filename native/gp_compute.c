/* Compute: pace kernel launches so that the pod's share of the GPU's time converges to its cap.
 *
 * A token bucket counted in *device time*, pod-wide in the shared file: credit accrues at rate x wall time
 * (rate = the cap, in ppm); each launch is charged an estimate of its device time and, when that leaves
 * the bucket in debt, the launching thread waits until the debt is paid. Estimates are then replaced by
 * facts: one process of the pod (the poller, holding a lease) reads NVML's per-process utilisation samples
 * for the pod's host PIDs (gp_ident.c) and corrects the bucket by (charged - measured), both cumulative. So
 * over any period the pod's measured busy time is rate x time, give or take the bucket's bounds, however
 * wrong the per-launch estimate is and however deep the device queue is (a launch is charged when it is
 * made, its execution is measured when it happens; only the running totals are compared, never one poll
 * window's launches with the same window's busy time).
 *
 * Three details make it exact rather than close:
 * - the per-launch estimate is the ratio of two decaying sums (busy time, launches), not a decaying
 *   average of per-window ratios, which a deep queue biases (a window's launches execute in the next one);
 * - a waiting launch re-reads the bucket every few ms, so a correction that pays its debt early lets it
 *   go early instead of sleeping off an over-estimate;
 * - credit from the corrections is kept apart from the bucket (credit_ns; a debt goes into the bucket) and
 *   a launch waits while the two together are in debt: the burst bound clips only the refill of idle time,
 *   never a correction, so credit the pod was over-charged is given back in full, even while its execution
 *   lags its launches by a deep queue.
 *
 * NVML samples: each covers one sample period of the driver's (learnt as the smallest gap between sample
 * timestamps). Drivers that return every period since the last timestamp and drivers that return only the
 * newest period are both read exactly, because the poller runs at least twice per period.
 *
 * elastic: the rate may rise above the cap into time nobody else wants, and gives it back at once: while
 * the GPU is saturated and another process runs, the borrowed part is halved at every poll (and credit
 * beyond the burst of the lowered rate dropped); while the GPU has idle time it grows by 2 points a poll.
 * A neighbour's demand is invisible in what it gets (a FIFO device splits contended time by queue depth),
 * so "saturated with someone else present" is the only signal that it wants more.
 *
 * squeeze: the cap in force is min(the cap, the squeeze the node agent writes into the limits file), read
 * at every launch and every poll, so a reclaim lowers a running pod's share and lifts it again without a
 * restart. Launches are counted (and the per-launch cost learnt) even while uncapped, so a squeeze paces
 * with a good estimate from its first launch, and an uncapped pod carries no token debt into one. */
#include "gp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Until the first measurement a launch is charged 2 ms, on the high side for most kernels: a pod starting
 * with a deep queue of long kernels would otherwise run far over its cap until the first correction, then
 * pay that debt back with a long silence. Over-charging costs nothing: the credit comes back with the first
 * measurement (20 ms at most). */
#define DEFAULT_COST_NS 2000000
#define BURST_WINDOW_NS 100000000  /* credit kept across idle time: 100 ms of the rate */
#define ELASTIC_MARGIN_PPM 20000   /* elastic leaves 2 % of the GPU free so a neighbour is seen waking */
#define ELASTIC_STEP_PPM 20000     /* elastic grows into idle time by 2 points a poll */
#define WAIT_SLICE_NS 4000000      /* a waiting launch re-reads the bucket this often */
#define MAX_WAIT_NS 2000000000LL   /* a bounded wait: a stale debt never hangs a launch */

static int poller_state; /* 0 none, 1 running */
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int64_t burst_of(int64_t rate, int64_t cost) {
    int64_t b = BURST_WINDOW_NS / GP_PPM * rate;
    return b > 4 * cost ? b : 4 * cost;
}

/* Credit for the wall time since the last refill, up to the burst; credit above the burst (given back by a
 * correction) is left alone. */
static void refill(struct gp_devstate *d, int64_t now, int64_t rate, int64_t cost) {
    int64_t last = __atomic_load_n(&d->refill_at, __ATOMIC_ACQUIRE);
    if (last == 0) {
        __atomic_compare_exchange_n(&d->refill_at, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return;
    }
    if (now <= last || !__atomic_compare_exchange_n(&d->refill_at, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    int64_t add = (int64_t)((__int128)(now - last) * rate / GP_PPM);
    int64_t burst = burst_of(rate, cost);
    int64_t t = __atomic_load_n(&d->tokens, __ATOMIC_ACQUIRE);
    for (;;) {
        if (t >= burst) return;
        int64_t nt = t + add > burst ? burst : t + add;
        if (__atomic_compare_exchange_n(&d->tokens, &t, nt, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
    }
}

/* ---- the poller: measure, correct, set the rate ------------------------------------------------------- */
struct devmeter {
    unsigned long long last_ts;   /* newest NVML sample timestamp consumed (us) */
    unsigned long long period_us; /* NVML's sample period, learnt as the smallest gap between samples */
    uint64_t charged_seen;
    uint64_t launches_seen;
    double cost_busy, cost_launches; /* decaying sums for the per-launch estimate */
    double u_pod, u_other;        /* smoothed shares of the GPU (elastic) */
    int64_t unmeasured_ns;        /* charged while NVML showed nothing of the pod, since the last sighting */
    int trust;                    /* corrections apply: the pod's samples are being found */
    int paced;                    /* the GPU was capped at the previous measurement (the window was paced) */
    int started;                  /* a first reading has set where this poller's counting begins */
};
static struct devmeter meters[GP_MAX_DEV];

typedef nvmlReturn_t (*util_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *, unsigned long long);

static int cmp_ts(const void *a, const void *b) {
    const nvmlProcessUtilizationSample_t *x = a, *y = b;
    return x->timeStamp < y->timeStamp ? -1 : x->timeStamp > y->timeStamp;
}

static int64_t poll_ns(void) {
    int64_t p = (int64_t)gp_cfg.poll_ms * 1000000LL;
    for (int li = 0; li < gp_cfg.ndev; li++) {
        int64_t half = (int64_t)meters[li].period_us * 500; /* twice per NVML period: none is missed */
        if (half > 0 && half < p) p = half;
    }
    return p < 2000000 ? 2000000 : p;
}

static void measure(int li, struct gp_shared *s) {
    static util_fn get;
    if (get == NULL) get = (util_fn)gp_nvml_sym("nvmlDeviceGetProcessUtilization");
    nvmlDevice_t h = gp_nvml_device(li);
    struct devmeter *m = &meters[li];
    struct gp_devstate *d = &s->dev[li];
    if (get == NULL || h == NULL) return;
    unsigned int n = 0;
    nvmlReturn_t r = get(h, NULL, &n, m->last_ts);
    if ((r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE) || n == 0) n = 0;
    nvmlProcessUtilizationSample_t *buf = n ? calloc(n + 16, sizeof *buf) : NULL;
    if (buf != NULL) {
        n += 16;
        if (get(h, buf, &n, m->last_ts) != NVML_SUCCESS) n = 0;
    } else {
        n = 0;
    }
    int64_t pids[GP_MAX_SLOTS * GP_HOSTPIDS + GP_HOSTPIDS];
    int npids = gp_pod_pids(pids, (int)(sizeof pids / sizeof pids[0]));
    if (n > 0) qsort(buf, n, sizeof *buf, cmp_ts);
    /* Learn the period from consecutive distinct timestamps (of this batch, and against the last one). */
    unsigned long long prev = m->last_ts;
    for (unsigned i = 0; i < n; i++) {
        unsigned long long ts = buf[i].timeStamp;
        if (ts <= m->last_ts) continue;
        if (prev != 0 && ts > prev && (m->period_us == 0 || ts - prev < m->period_us)) m->period_us = ts - prev;
        if (ts > prev) prev = ts;
    }
    unsigned long long first_ts = m->last_ts;
    double pod_ns = 0, other_ns = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned long long ts = buf[i].timeStamp;
        if (ts <= m->last_ts) continue;
        unsigned long long period = m->period_us ? m->period_us : 20000;
        double busy = buf[i].smUtil / 100.0 * (double)period * 1000.0;
        int mine = 0;
        for (int k = 0; k < npids; k++) mine |= pids[k] == (int64_t)buf[i].pid;
        if (mine) pod_ns += busy;
        else other_ns += busy;
    }
    double span_ns = first_ts != 0 && prev > first_ts ? (double)(prev - first_ts) * 1000.0 : 0;
    if (prev > m->last_ts) m->last_ts = prev;
    free(buf);
    if (!m->started) { /* a new poller: what ran before now was counted by another, or by nobody */
        m->started = 1;
        m->charged_seen = __atomic_load_n(&d->charged_ns, __ATOMIC_ACQUIRE);
        m->launches_seen = __atomic_load_n(&d->launches, __ATOMIC_ACQUIRE);
        return;
    }

    uint64_t charged = __atomic_load_n(&d->charged_ns, __ATOMIC_ACQUIRE);
    uint64_t launches = __atomic_load_n(&d->launches, __ATOMIC_ACQUIRE);
    uint64_t dc = charged - m->charged_seen, dl = launches - m->launches_seen;
    m->charged_seen = charged;
    m->launches_seen = launches;
    __atomic_add_fetch(&d->busy_ns, (uint64_t)pod_ns, __ATOMIC_RELAXED);
    __atomic_add_fetch(&d->others_ns, (uint64_t)other_ns, __ATOMIC_RELAXED);
    int64_t cap = gp_cap_ppm(li);
    /* Trust measurements only while they see the pod: a pod whose host PIDs NVML never reports would
     * otherwise be credited back every charge and run unpaced. 200 ms of charges with nothing measured
     * suspends the corrections (estimates alone pace) until the pod's samples show up again. */
    if (pod_ns > 0) {
        m->trust = 1;
        m->unmeasured_ns = 0;
    } else if (dc > 0) {
        m->unmeasured_ns += (int64_t)dc;
        if (m->unmeasured_ns > 200000000LL) m->trust = 0;
    }
    if (m->trust && m->paced && cap < GP_PPM) {
        int64_t c = __atomic_add_fetch(&s->credit_ns[li], (int64_t)dc - (int64_t)pod_ns, __ATOMIC_ACQ_REL);
        /* A debt goes into the bucket itself, which refills it; credit first pays any debt of the bucket.
         * Only credit beyond that stays apart from the burst bound. */
        int64_t t = __atomic_load_n(&d->tokens, __ATOMIC_ACQUIRE);
        int64_t move = c < 0 ? c : t < 0 ? (c < -t ? c : -t) : 0;
        if (move != 0) {
            __atomic_sub_fetch(&s->credit_ns[li], move, __ATOMIC_ACQ_REL);
            __atomic_add_fetch(&d->tokens, move, __ATOMIC_ACQ_REL);
        }
    }
    m->paced = cap < GP_PPM;
    /* Sums decaying over ~0.3 s: longer than any device queue a launch loop builds, short enough to follow a
     * change of kernels. */
    double keep = 1.0 - (double)poll_ns() / 300e6;
    m->cost_busy = m->cost_busy * keep + pod_ns;
    m->cost_launches = m->cost_launches * keep + (double)dl;
    if (pod_ns > 0 && m->cost_launches >= 1.0)
        __atomic_store_n(&d->cost_ns, (int64_t)(m->cost_busy / m->cost_launches), __ATOMIC_RELAXED);
    if (span_ns > 0) { /* over ~25 ms of samples: one period's rounding and phase do not decide */
        double w = span_ns / 25e6 < 1.0 ? span_ns / 25e6 : 1.0;
        m->u_pod = m->u_pod * (1 - w) + w * (pod_ns / span_ns);
        m->u_other = m->u_other * (1 - w) + w * (other_ns / span_ns);
    }
    if (cap >= GP_PPM) { /* uncapped: nothing is paced, so no credit or debt may build up */
        __atomic_store_n(&d->tokens, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&s->credit_ns[li], 0, __ATOMIC_RELEASE);
        __atomic_store_n(&d->rate_ppm, cap, __ATOMIC_RELEASE);
        return;
    }
    int64_t rate = cap;
    if (gp_cfg.mode == GP_ELASTIC) {
        int64_t old = __atomic_load_n(&d->rate_ppm, __ATOMIC_ACQUIRE);
        if (old < cap) old = cap;
        double idle = 1.0 - m->u_pod - m->u_other;
        if (m->u_other < 0.01) rate = GP_PPM - ELASTIC_MARGIN_PPM;                 /* alone: all but the margin */
        else if (idle * GP_PPM <= ELASTIC_MARGIN_PPM) rate = cap + (old - cap) / 2; /* contended: give back */
        else if (idle * GP_PPM <= 2 * ELASTIC_MARGIN_PPM) rate = old;                  /* at the margin: hold */
        else {
            int64_t room = GP_PPM - (int64_t)(m->u_other * GP_PPM) - ELASTIC_MARGIN_PPM;
            rate = old + ELASTIC_STEP_PPM < room ? old + ELASTIC_STEP_PPM : room;
        }
        if (rate < cap) rate = cap;
        if (rate > GP_PPM - ELASTIC_MARGIN_PPM) rate = GP_PPM - ELASTIC_MARGIN_PPM;
        if (rate < old) { /* credit saved at the higher rate is not the neighbour's to wait for */
            int64_t cost = __atomic_load_n(&d->cost_ns, __ATOMIC_RELAXED), burst = burst_of(rate, cost);
            int64_t t = __atomic_load_n(&d->tokens, __ATOMIC_ACQUIRE), c = __atomic_load_n(&s->credit_ns[li], __ATOMIC_ACQUIRE);
            int64_t excess = t + c - burst;
            if (excess > 0 && c > 0) {
                int64_t from_credit = excess < c ? excess : c;
                __atomic_sub_fetch(&s->credit_ns[li], from_credit, __ATOMIC_ACQ_REL);
                excess -= from_credit;
            }
            if (excess > 0) __atomic_sub_fetch(&d->tokens, excess, __ATOMIC_ACQ_REL);
        }
    }
    __atomic_store_n(&d->rate_ppm, rate, __ATOMIC_RELEASE);
}

static void *poller(void *arg) {
    (void)arg;
    int64_t me = getpid();
    int64_t last = gp_now_ns();
    for (;;) {
        int64_t poll = poll_ns();
        sleep_ns(poll);
        struct gp_shared *s = gp_shm();
        int64_t now = gp_now_ns();
        int capped = 0; /* a squeeze may cap an uncapped pod at any time: looked at on every wake-up */
        for (int li = 0; li < gp_cfg.ndev; li++) capped |= gp_cap_ppm(li) < GP_PPM;
        /* Uncapped pods are measured for the agent's metrics only: once a second is plenty. */
        if (!capped && now - last < 1000000000LL) continue;
        int64_t owner = __atomic_load_n(&s->poller_pid, __ATOMIC_ACQUIRE);
        if (owner != me) {
            if (__atomic_load_n(&s->poller_lease, __ATOMIC_ACQUIRE) > now) {
                last = now;
                continue;
            }
            if (!__atomic_compare_exchange_n(&s->poller_pid, &owner, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
            memset(meters, 0, sizeof meters); /* the previous poller's progress is not ours to know */
        }
        __atomic_store_n(&s->poller_lease, now + 5 * (capped ? (poll > 20000000 ? poll : 20000000) : 1000000000LL),
                         __ATOMIC_RELEASE);
        for (int li = 0; li < gp_cfg.ndev; li++) measure(li, s);
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        __atomic_store_n(&s->updated_ns, (uint64_t)wall.tv_sec * 1000000000ULL + (uint64_t)wall.tv_nsec,
                         __ATOMIC_RELEASE);
        last = now;
    }
    return NULL;
}

static void ensure_poller(void) {
    if (__atomic_load_n(&poller_state, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&start_mu);
    if (!poller_state) {
        (void)gp_slot_index(); /* the poller counts this process's samples only once it has a slot */
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, poller, NULL) != 0) gp_log("cannot start the utilisation poller");
        pthread_attr_destroy(&a);
        __atomic_store_n(&poller_state, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&start_mu);
}

/* 0, or the error the launch returns instead of running: a process the pod cannot count does not run. */
static CUresult gp_launch_gate(int li) {
    if (li < 0) return CUDA_SUCCESS;
    if (!gp_has_slot()) return CUDA_ERROR_OUT_OF_MEMORY;
    gp_pace(li);
    return CUDA_SUCCESS;
}

void gp_pace(int li) {
    if (li < 0) return;
    ensure_poller(); /* also measures uncapped pods, for the agent's busy-time metric */
    struct gp_shared *sh = gp_shm();
    struct gp_devstate *d = &sh->dev[li];
    __atomic_add_fetch(&d->launches, 1, __ATOMIC_RELAXED);
    int64_t cap = gp_cap_ppm(li);
    if (cap >= GP_PPM) return;
    int64_t rate = __atomic_load_n(&d->rate_ppm, __ATOMIC_ACQUIRE);
    /* hard: the cap itself (a squeeze takes effect now, not at the next poll); elastic: the poller's rate,
     * never below the cap */
    if (rate <= 0 || gp_cfg.mode != GP_ELASTIC || rate < cap) rate = cap;
    int64_t cost = __atomic_load_n(&d->cost_ns, __ATOMIC_RELAXED);
    if (cost <= 0) cost = DEFAULT_COST_NS;
    refill(d, gp_now_ns(), rate, cost);
    __atomic_add_fetch(&d->charged_ns, (uint64_t)cost, __ATOMIC_RELAXED);
    int64_t t = __atomic_sub_fetch(&d->tokens, cost, __ATOMIC_ACQ_REL) + __atomic_load_n(&sh->credit_ns[li], __ATOMIC_ACQUIRE);
    for (int64_t waited = 0; t < 0 && waited < MAX_WAIT_NS;) {
        int64_t wait = (int64_t)((__int128)(-t) * GP_PPM / rate);
        if (wait > WAIT_SLICE_NS) wait = WAIT_SLICE_NS;
        if (wait < 20000) wait = 20000;
        sleep_ns(wait);
        waited += wait;
        int64_t r2 = __atomic_load_n(&d->rate_ppm, __ATOMIC_ACQUIRE);
        if (gp_cfg.mode == GP_ELASTIC && r2 > cap) rate = r2;
        else rate = gp_cap_ppm(li) < GP_PPM ? gp_cap_ppm(li) : GP_PPM;
        if (rate >= GP_PPM) break; /* the squeeze was lifted while waiting */
        refill(d, gp_now_ns(), rate, cost);
        t = __atomic_load_n(&d->tokens, __ATOMIC_ACQUIRE) + __atomic_load_n(&sh->credit_ns[li], __ATOMIC_ACQUIRE);
    }
}

void gp_compute_after_fork(void) {
    pthread_mutex_init(&start_mu, NULL);
    poller_state = 0; /* threads do not survive fork */
    memset(meters, 0, sizeof meters);
}

/* ---- launch entry points ------------------------------------------------------------------------------ */
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*graph_fn)(CUgraphExec, CUstream);

#define GATE()                                                          \
    do {                                                                \
        gp_init();                                                      \
        if (gp_cfg.ndev != 0) {                                         \
            CUresult g_ = gp_launch_gate(gp_current_index());           \
            if (g_ != CUDA_SUCCESS) return g_;                          \
        }                                                               \
    } while (0)

#define LAUNCH_BODY(real_name, call)                     \
    GP_REAL(launch_fn, real, real_name);                 \
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED; \
    GATE();                                              \
    return call;

GP_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    LAUNCH_BODY("cuLaunchKernel", real(f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
}

GP_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                       void **extra) {
    LAUNCH_BODY("cuLaunchKernel_ptsz", real(f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
}

GP_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    GP_REAL(launch_ex_fn, real, "cuLaunchKernelEx");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    return real(cfg, f, params, extra);
}

GP_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    GP_REAL(launch_ex_fn, real, "cuLaunchKernelEx_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    return real(cfg, f, params, extra);
}

GP_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    GP_REAL(coop_fn, real, "cuLaunchCooperativeKernel");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    return real(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

GP_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                  unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                                                  void **params) {
    GP_REAL(coop_fn, real, "cuLaunchCooperativeKernel_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    return real(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

GP_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    GP_REAL(graph_fn, real, "cuGraphLaunch");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    return real(g, s);
}

GP_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    GP_REAL(graph_fn, real, "cuGraphLaunch_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    return real(g, s);
}

struct gp_hook gp_compute_hooks[] = {
#define H(n) {#n, (void *)n, NULL},
    H(cuLaunchKernel) H(cuLaunchKernel_ptsz) H(cuLaunchKernelEx) H(cuLaunchKernelEx_ptsz)
    H(cuLaunchCooperativeKernel) H(cuLaunchCooperativeKernel_ptsz) H(cuGraphLaunch) H(cuGraphLaunch_ptsz)
#undef H
    {NULL, NULL, NULL},
};
