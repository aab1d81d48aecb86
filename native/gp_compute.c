/* Compute: pace kernel launches so that the pod's share of the GPU's time converges to its cap.
 *
 * A token bucket counted in *device time*, pod-wide in the shared file: credit accrues at rate x wall time
 * (rate = the cap, in ppm); each launch is charged an estimate of its device time and, when that leaves
 * the bucket in debt, the launching thread waits until the debt is paid. Estimates are then replaced by
 * measurements: one process of the pod (the poller, holding a lease) measures the pod's device time and
 * corrects the bucket by (charged - measured), both cumulative. So over any period the pod's measured busy
 * time is rate x time, give or take the bucket's bounds, however wrong the per-launch estimate is and
 * however deep the device queue is (only the running totals are compared, never one poll window's launches
 * with the same window's busy time). The per-launch estimate is the ratio of two decaying sums; a waiting
 * launch re-reads the bucket every few ms; credit from corrections is kept apart from the bucket's burst
 * bound (credit_ns), so credit the pod was over-charged is given back in full. Unused budget is kept up to
 * 40 ms of the rate across idle time, and up to 200 ms across time in which the pod's own work was still on
 * the device (it waited for the device, not for budget: refill()).
 *
 * What measures the pod (issue 38). NVML's per-process samples alone cannot be made exact on a real GPU
 * (nvidia-facts.md 4.5): the driver samples each process on its own clock (1/6 s on recent datacenter GPUs,
 * up to 1 s), at its own phase, as a mean since its previous sample, visible after a lag; smUtil is of an
 * undocumented scale; MIG mode has none. The library before issue 38 multiplied smUtil by the smallest gap
 * between any two timestamps it saw and took smUtil as the busy percent: on an H100 a 30 % cap alone read
 * 42.4 % and 70 % read 92.3 %, which the simulated GPU reproduces with smUtil at 0.71 of the busy share
 * (benchmarks/isolation_sim.py, profile h100). So the library measures with its own CUDA events, a signal
 * that depends on no NVML scale and that the driver's clock gives directly:
 * - after a launch on a capped GPU an event is recorded on the launch's stream, at most every 250 us per
 *   stream; the poller thread closes spans left open each ms and queries the events without blocking; an
 *   event's completion time is cuEventElapsedTime from an anchor event of the library's own (recorded on an
 *   empty stream, it completes as it is recorded). The work between two events ran within [max(the earlier
 *   one's completion, the first launch after it), the later one's completion]: exactly the stream's device
 *   time while no other context's work interleaves. No synchronisation, one cuEventRecord per launch at
 *   most, none at all while uncapped.
 * - solo (NVML shows nobody else busy on the GPU and at most one of the pod's processes busy): the events
 *   are the pod's device time. Meanwhile NVML's smUtil scale is learnt: the pod's samples against the
 *   events over the same sample periods.
 * - shared: the events also count the time the pod's queued work waited for others' time slices. The
 *   truth is then NVML's samples of the pod (each its own gap since that PID's previous sample) divided by
 *   the learnt scale (a scale common to all processes cancels; the agent's, from limits.v1, before the pod
 *   has learnt its own; else 1), each counted for the part of the pod's work in it that fell in shared time.
 *   NVML covers the pod only up to its newest sample: the shared time since then counts provisionally as
 *   its launches times g (the device time per launch NVML showed over the pod's shared samples; before
 *   any, its events per launch while solo), never more than its events, replaced by the truth when the
 *   samples come. Not its events times f (what NVML said against what the events counted): with work
 *   queued the events run with the wall clock whatever the pod gets, so f only repeats the past (with 1 s
 *   samples a second late); f is left for a pod that has neither. The totals are exact; the feedback
 *   comes within a poll. Several of the pod's processes busy (their samples overlap, whichever polls they
 *   come in): each is sampled at its own phase, so each counts provisionally from its own newest sample,
 *   for 1/k of the pod's launches and events (k of them busy), and f and g weigh a sample of one of them
 *   against 1/k of them too. A context of another process that NVML lists (at once, a period and a lag
 *   before its first sample) makes the time shared from then on, until its samples could have shown it.
 *   Until the pod's first shared samples all its events count there (an upper bound: under its cap, never
 *   over), and the credit those samples give back is paid out at most 3 % of the GPU above the cap.
 * - no per-process samples (MIG mode): the events, their spans united across the pod's processes (ev_add),
 *   exact on an instance the pod has to itself. gpupool never runs this library on a MIG device (isolation
 *   `mig` pods and claims get the instance, without the library, one per pod or claim; a `hook` share is
 *   never placed on a MIG-mode GPU), so tenants of different pods never share one; were they to, each would
 *   count the others' slices in its events and get less than its cap, never more.
 * - CUDA graphs made by stream capture (torch.cuda.graph): nothing is recorded on a stream while it
 *   captures (its launches run nothing then, and an event captured with them would invalidate the capture
 *   when queried), and the poller thread runs in relaxed capture mode, so its event calls never invalidate a
 *   capture begun in global mode on another thread (tests/native/test_hook_capture.py).
 * Limits: a pod that never runs alone on a GPU whose smUtil scale is not 1, and whose agent gave none, is
 * measured at scale 1 while it shares the GPU (its error is the scale's); with per-process samples the
 * processes of a pod of several are summed, their overlap corrected by f. Between samples the measure is
 * provisional (launches times g): with kernels of very different lengths and 1 s samples the tenant at 30
 * of 30/70 ran 23-40 % in single 1 s windows, put right when the samples come. On a time-sliced GPU each
 * context switch costs device time nobody gets, so caps adding up to 100 cannot all be met: what the
 * switches cost comes out of the tenant that would take the rest.
 *
 * elastic: the rate rises above the cap into time nobody else wants, only while NVML shows nobody else busy
 * on the GPU (on a time-sliced GPU a borrower with queued work takes half the slices from a neighbour that
 * wants more, and the neighbour's demand never shows in what it gets). A process that opens a context on
 * the GPU (NVML lists it at once, its samples a period later) makes it give back at once, dropping credit
 * saved at the higher rate, and it holds its cap until NVML shows that process idle again.
 *
 * squeeze: the cap in force is min(the cap, the squeeze the node agent writes into the limits file), read
 * at every launch and every poll, so a reclaim lowers a running pod's share and lifts it again without a
 * restart. Launches are counted (and the per-launch cost learnt) even while uncapped, so a squeeze paces
 * with a good estimate from its first launch, and an uncapped pod carries no token debt into one.
 *
 * Measured: benchmarks/isolation_sim.py on the simulated GPU (docs/concepts.md has the figures); on a real
 * GPU only the library before issue 38 has been measured (H100, above). */
#include "gp.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Until the first measurement a launch is charged 2 ms, on the high side for most kernels: a pod starting
 * with a deep queue of long kernels would otherwise run far over its cap until the first correction, then
 * pay that debt back with a long silence. Over-charging costs nothing: the credit comes back with the first
 * measurement (20 ms at most). */
#define DEFAULT_COST_NS 2000000
#define BURST_WINDOW_NS 40000000   /* credit kept across idle time: 40 ms of the rate (what a pod that was
                                    * held back by others' time slices may burst by: 1 point of a 4 s window) */
#define ELASTIC_MARGIN_PPM 50000   /* elastic alone leaves 5 % free: a neighbour's first kernels find room */
#define BUSY_WINDOW_NS 200000000LL /* ... and across time in which its own work was on the device (refill) */
#define RELEASE_PPM 30000          /* start-up credit is paid out at most 3 % of the GPU above the cap */
#define WAIT_SLICE_NS 4000000      /* a waiting launch re-reads the bucket this often */
#define MAX_WAIT_NS 2000000000LL   /* a bounded wait: a stale debt never hangs a launch */

_Static_assert(offsetof(struct gp_limits, nvml_scale_ppm) == 1816, "layout is written by the agent");

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
 * correction) is left alone. Wall time in which the pod's own work was still on the device (until
 * `busy_until`) is not idle time: the pod waited for the device, not for its budget (a stream sync behind
 * long kernels time-sliced with a neighbour's), and it refills up to BUSY_WINDOW_NS of the rate. With the
 * 40 ms bound alone, the 70 of 30/70 with kernels of 0.1-20 ms lost what it could not spend in such waits
 * (1.1 s of its 7 s in a 10 s run, its share 59-61 % with 1 s NVML periods) and then waited for budget
 * while the device stood idle. */
static void refill(struct gp_devstate *d, int64_t now, int64_t rate, int64_t cost, int64_t busy_until) {
    int64_t last = __atomic_load_n(&d->refill_at, __ATOMIC_ACQUIRE);
    if (last == 0) {
        __atomic_compare_exchange_n(&d->refill_at, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return;
    }
    if (now <= last || !__atomic_compare_exchange_n(&d->refill_at, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    int64_t busy_end = busy_until < now ? busy_until : now;
    int64_t busy = busy_end > last ? busy_end - last : 0;
    int64_t add_busy = (int64_t)((__int128)busy * rate / GP_PPM);
    int64_t add = (int64_t)((__int128)(now - last) * rate / GP_PPM) - add_busy;
    int64_t burst = burst_of(rate, cost), busy_burst = BUSY_WINDOW_NS / GP_PPM * rate;
    if (busy_burst < burst) busy_burst = burst;
    int64_t t = __atomic_load_n(&d->tokens, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t nt = t;
        if (nt < busy_burst) nt = nt + add_busy > busy_burst ? busy_burst : nt + add_busy;
        if (nt < burst) nt = nt + add > burst ? burst : nt + add;
        if (nt <= t) return;
        if (__atomic_compare_exchange_n(&d->tokens, &t, nt, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
    }
}

/* ---- the library's own events: the pod's device time, measured on the device's clock ------------------
 * After a launch on a capped GPU, an event is recorded on the launch's stream when the last one there is
 * RECORD_GAP_NS old (so at most a few thousand a second, never a synchronisation); the poller thread
 * records one on a stream whose launches since its last event are that old, so every launch is followed
 * by an event soon after it. The poller queries them without blocking; an event's completion time is
 * cuEventElapsedTime from the process's anchor (an event recorded on an empty stream of the library's own,
 * which completes when recorded) added to the anchor's host time. The work between two events of a stream
 * ran within [max(the earlier one's completion, the first launch after it), the later one's completion]:
 * exactly the stream's device time while nobody else's work interleaves. Spans are added to the pod's
 * shared total once each (ev_until: a union across the pod's processes). */
#define EV_RING 1024
#define EV_STREAMS 64
#define RECORD_GAP_NS 250000
#define EV_TICK_NS 1000000          /* the poller's tick while capped: events are closed and read this often */
#define ANCHOR_AGE_NS 30000000000LL /* a fresh anchor this often: a float's milliseconds stay precise */
#define PTSZ_STREAM ((CUstream)(uintptr_t)2) /* CU_STREAM_PER_THREAD */

struct evstream {
    CUstream s;
    int li, used, gone;
    int64_t last_rec;   /* when an event was last recorded on it */
    int64_t open_since; /* the first launch since then (0: none) */
    int64_t done_at;    /* completion of its last completed event */
};
struct evrec {
    CUevent e;
    int si, li;
    int64_t first; /* the first launch of the span the event closes */
};
static struct {
    pthread_mutex_t mu;
    struct evstream st[EV_STREAMS];
    struct evrec ring[EV_RING];
    unsigned head, tail;
    CUevent spare[GP_MAX_DEV][16]; /* events are their context's: kept per GPU */
    int nspare[GP_MAX_DEV];
    CUevent anchor[GP_MAX_DEV], next_anchor[GP_MAX_DEV];
    int64_t anchor_t[GP_MAX_DEV], next_anchor_t[GP_MAX_DEV];
    CUstream anchor_stream[GP_MAX_DEV];
    CUcontext ctx[GP_MAX_DEV];
    CUcontext poller_ctx;
    int active;   /* events were recorded in this process */
    int inflight; /* one of them has not completed yet (the poller's last look) */
} ev = {.mu = PTHREAD_MUTEX_INITIALIZER};

static struct {
    cuEventCreate_fn create;
    cuEventDestroy_fn destroy;
    cuEventRecord_fn record;
    cuEventQuery_fn query;
    cuEventElapsedTime_fn elapsed;
    cuCtxGetCurrent_fn ctx_get;
    cuCtxSetCurrent_fn ctx_set;
    cuStreamCreate_fn stream_create;
    cuStreamIsCapturing_fn is_capturing;                 /* both absent before CUDA 10: no capture there */
    cuThreadExchangeStreamCaptureMode_fn exchange_mode;
    int ok;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_resolve(void) {
    drv.create = (cuEventCreate_fn)gp_cuda_sym("cuEventCreate");
    drv.destroy = (cuEventDestroy_fn)gp_cuda_sym("cuEventDestroy_v2");
    drv.record = (cuEventRecord_fn)gp_cuda_sym("cuEventRecord");
    drv.query = (cuEventQuery_fn)gp_cuda_sym("cuEventQuery");
    drv.elapsed = (cuEventElapsedTime_fn)gp_cuda_sym("cuEventElapsedTime");
    drv.ctx_get = (cuCtxGetCurrent_fn)gp_cuda_sym("cuCtxGetCurrent");
    drv.ctx_set = (cuCtxSetCurrent_fn)gp_cuda_sym("cuCtxSetCurrent");
    drv.stream_create = (cuStreamCreate_fn)gp_cuda_sym("cuStreamCreate");
    drv.is_capturing = (cuStreamIsCapturing_fn)gp_cuda_sym("cuStreamIsCapturing");
    drv.exchange_mode = (cuThreadExchangeStreamCaptureMode_fn)gp_cuda_sym("cuThreadExchangeStreamCaptureMode");
    drv.ok = drv.create && drv.destroy && drv.record && drv.query && drv.elapsed && drv.ctx_get && drv.ctx_set &&
             drv.stream_create;
}

/* ---- the debug trace (gp.h: GPUPOOL_DEBUG_NVML_TRACE) -------------------------------------------------- */
#define TRACE_MAX_BYTES (64LL << 20)
static int trace_fd = -2; /* -2 not opened yet, -1 none (or full) */
static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...) {
    if (__atomic_load_n(&trace_fd, __ATOMIC_ACQUIRE) == -1) return;
    pthread_mutex_lock(&trace_mu);
    if (trace_fd == -2) {
        const char *path = getenv("GPUPOOL_DEBUG_NVML_TRACE");
        trace_fd = path != NULL && *path ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
        struct stat st0;
        if (trace_fd >= 0 && (fstat(trace_fd, &st0) != 0 || st0.st_size >= TRACE_MAX_BYTES - 256)) {
            close(trace_fd); /* full already: nothing more, not even the header */
            trace_fd = -1;
        }
        if (trace_fd >= 0) {
            char head[256];
            int n = snprintf(head, sizeof head,
                             "# gpupool trace pid %d: t_ns pid ts_us sm_util pod charged_ns | E t_ns li start_ns "
                             "end_ns added_ns | S t_ns li scale_ppm solo pod_ns f truth_ns solo_ns prov_ns "
                             "tokens_ns credit_ns (native/gp.h)\n",
                             (int)getpid());
            if (write(trace_fd, head, (size_t)n) < 0) {
                close(trace_fd);
                trace_fd = -1;
            }
        }
    }
    if (trace_fd >= 0) {
        struct stat st;
        char line[256];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(line, sizeof line, fmt, ap);
        va_end(ap);
        /* bounded: past 64 MiB (all writers together) the process stops writing */
        if (fstat(trace_fd, &st) != 0 || st.st_size + n > TRACE_MAX_BYTES || n <= 0 || n >= (int)sizeof line ||
            write(trace_fd, line, (size_t)n) != n) {
            close(trace_fd);
            __atomic_store_n(&trace_fd, -1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&trace_mu);
}

/* locked: the poller thread works in the context the events were recorded in */
static void ev_ctx(int li) {
    if (ev.ctx[li] != NULL && ev.poller_ctx != ev.ctx[li] && drv.ctx_set(ev.ctx[li]) == CUDA_SUCCESS)
        ev.poller_ctx = ev.ctx[li];
}

/* locked: the anchor that maps event times onto CLOCK_MONOTONIC (recorded on an empty stream of ours, it
 * completes as it is recorded) */
static void ev_anchor(int li, int64_t now) {
    CUcontext c = NULL;
    if (drv.ctx_get(&c) != CUDA_SUCCESS || c == NULL) return;
    CUstream s = NULL;
    CUevent e = NULL;
    if (drv.stream_create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
    if (drv.create(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return;
    now = gp_now_ns();
    if (drv.record(e, s) != CUDA_SUCCESS) {
        drv.destroy(e);
        return;
    }
    ev.ctx[li] = c;
    ev.anchor_stream[li] = s;
    ev.anchor[li] = e;
    ev.anchor_t[li] = now;
}

static CUevent ev_new(int li) { /* locked */
    CUevent e = NULL;
    if (ev.nspare[li] > 0) return ev.spare[li][--ev.nspare[li]];
    return drv.create(&e, CU_EVENT_DEFAULT) == CUDA_SUCCESS ? e : NULL;
}

static void ev_free(int li, CUevent e) { /* locked */
    if (ev.nspare[li] < (int)(sizeof ev.spare[0] / sizeof ev.spare[0][0])) ev.spare[li][ev.nspare[li]++] = e;
    else drv.destroy(e);
}

/* Whether work pushed to `s` now would be captured into a CUDA graph (torch.cuda.graph and the like) rather
 * than run. The library then records nothing there: an event recorded on a capturing stream is captured
 * too, and querying it would invalidate the tenant's capture (CUDA_ERROR_CAPTURED_EVENT). An error (the
 * legacy stream asked while another stream captures) counts as capturing: recording there would be an
 * implicit synchronisation with the capture. */
static int capturing(CUstream s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (drv.is_capturing == NULL) return 0;
    return drv.is_capturing(s, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void ev_record(int si, int64_t now) { /* locked */
    struct evstream *st = &ev.st[si];
    if (ev.head - ev.tail >= EV_RING) return; /* full: the span stays open and is closed later */
    if (capturing(st->s)) { /* its launches since the span opened were captured, not run: no device time */
        st->open_since = 0;
        return;
    }
    CUevent e = ev_new(st->li);
    if (e == NULL) return;
    if (drv.record(e, st->s) != CUDA_SUCCESS) {
        ev_free(st->li, e);
        return;
    }
    ev.ring[ev.head % EV_RING] = (struct evrec){e, si, st->li, st->open_since ? st->open_since : now};
    ev.head++;
    st->open_since = 0;
    st->last_rec = now;
}

static int ev_stream(CUstream s, int li) { /* locked: the table entry of a stream, -1 when full */
    int free_slot = -1;
    for (int i = 0; i < EV_STREAMS; i++) {
        if (ev.st[i].used && !ev.st[i].gone && ev.st[i].s == s && ev.st[i].li == li) return i;
        if (free_slot < 0 && !ev.st[i].used) free_slot = i;
    }
    if (free_slot < 0) { /* reuse a destroyed stream's entry no event in flight refers to */
        for (int i = 0; i < EV_STREAMS && free_slot < 0; i++) {
            if (!ev.st[i].gone) continue;
            int referred = 0;
            for (unsigned k = ev.tail; k != ev.head && !referred; k++) referred = ev.ring[k % EV_RING].si == i;
            if (!referred) free_slot = i;
        }
    }
    if (free_slot >= 0) ev.st[free_slot] = (struct evstream){s, li, 1, 0, 0, 0, 0};
    return free_slot;
}

static void ev_after_launch(int li, CUstream s, int ptsz, int64_t launched) {
    if (li < 0 || gp_cap_ppm(li) >= GP_PPM) return; /* uncapped: no events, no cost */
    pthread_once(&drv_once, drv_resolve);
    if (!drv.ok) return;
    /* the legacy default stream is the context's; a per-thread default stream is only this thread's */
    CUstream key = ptsz && s == NULL ? PTSZ_STREAM : s;
    int64_t now = gp_now_ns();
    pthread_mutex_lock(&ev.mu);
    int si = ev.anchor[li] != NULL ? ev_stream(key, li) : -1;
    /* a launch into a capture ran nothing: while the stream captures no span opens (and no anchor is made) */
    if ((si < 0 || ev.st[si].open_since == 0) && capturing(key)) {
        pthread_mutex_unlock(&ev.mu);
        return;
    }
    if (ev.anchor[li] == NULL) {
        ev_anchor(li, launched);
        si = ev.anchor[li] != NULL ? ev_stream(key, li) : -1;
    }
    if (si >= 0) {
        struct evstream *st = &ev.st[si];
        if (st->open_since == 0) st->open_since = launched;
        if (now - st->last_rec >= RECORD_GAP_NS) ev_record(si, now);
        __atomic_store_n(&ev.active, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ev.mu);
}

/* The launching thread is about to wait for the bucket: its streams may drain meanwhile, so the spans its
 * launches opened are closed now, not at the poller's next tick (and a per-thread default stream can only
 * be recorded on by its own thread). */
static void ev_close_open(void) {
    if (!__atomic_load_n(&ev.active, __ATOMIC_ACQUIRE)) return;
    int64_t now = gp_now_ns();
    pthread_mutex_lock(&ev.mu);
    for (int i = 0; i < EV_STREAMS; i++)
        if (ev.st[i].used && !ev.st[i].gone && ev.st[i].open_since) ev_record(i, now);
    pthread_mutex_unlock(&ev.mu);
}

static void ev_forget_stream(CUstream s) {
    pthread_mutex_lock(&ev.mu);
    for (int i = 0; i < EV_STREAMS; i++)
        if (ev.st[i].used && ev.st[i].s == s) ev.st[i].gone = 1;
    pthread_mutex_unlock(&ev.mu);
}

typedef nvmlReturn_t (*util_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *, unsigned long long);

/* Whether NVML gives per-process samples on the GPU (not in MIG mode, nor without NVML): asked once (the
 * handles are final once gp_nvml_device has opened NVML). */
static int per_process_samples(int li) {
    static int known[GP_MAX_DEV]; /* 0 not asked yet, 1 yes, 2 no */
    if (known[li] == 0) {
        util_fn get = (util_fn)gp_nvml_sym("nvmlDeviceGetProcessUtilization");
        nvmlDevice_t h = gp_nvml_device(li);
        unsigned int n = 0;
        nvmlReturn_t r = get != NULL && h != NULL ? get(h, NULL, &n, 0) : NVML_ERROR_NOT_SUPPORTED;
        known[li] = r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND ? 2 : 1;
    }
    return known[li] == 1;
}

/* The part of [a, b] not counted yet, added to the pod's total. With per-process samples, the part beyond
 * what this process has counted already (its streams' spans overlap when their work waits on one another):
 * the pod's processes are summed, not united, and NVML's samples of each correct the overlap (f, measure()).
 * Without them (MIG mode) nothing would: two busy processes each counted the time their work waited for the
 * other's slices, and a pod of two at 40 alone ran 34 %. There the spans are united across the pod's
 * processes through the pod's frontier (ev_until, the end of the newest span counted): exact on an instance
 * the pod has to itself, as long as spans are read in the order they end (each process reads its own every
 * millisecond; one read later than another process's newer span loses the part that span covers). */
static int64_t ev_add(struct gp_shared *sh, int li, int64_t a, int64_t b) {
    static int64_t until[GP_MAX_DEV]; /* the poller thread's only */
    int64_t from;
    if (per_process_samples(li)) {
        if (b <= until[li]) return 0;
        from = a > until[li] ? a : until[li];
        until[li] = b;
        __atomic_store_n(&sh->ev_until[li], b, __ATOMIC_RELEASE);
    } else {
        int64_t old = __atomic_load_n(&sh->ev_until[li], __ATOMIC_ACQUIRE);
        do {
            if (b <= old) return 0;
        } while (!__atomic_compare_exchange_n(&sh->ev_until[li], &old, b, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
        from = a > old ? a : old;
    }
    __atomic_add_fetch(&sh->ev_busy_ns[li], (uint64_t)(b - from), __ATOMIC_RELAXED);
    return b - from;
}

/* The poller thread's tick: close spans left open, read the events that completed. */
static void ev_poll(struct gp_shared *sh, int64_t now) {
    if (!__atomic_load_n(&ev.active, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&ev.mu);
    for (int i = 0; i < EV_STREAMS; i++) {
        struct evstream *st = &ev.st[i];
        /* a per-thread default stream can only be recorded on by its own thread */
        if (st->used && !st->gone && st->open_since && st->s != PTSZ_STREAM && now - st->last_rec >= RECORD_GAP_NS) {
            ev_ctx(st->li);
            ev_record(i, now);
        }
    }
    while (ev.tail != ev.head) {
        struct evrec *r = &ev.ring[ev.tail % EV_RING];
        ev_ctx(r->li);
        CUresult q = drv.query(r->e);
        if (q == CUDA_ERROR_NOT_READY) break;
        float ms = 0;
        if (q == CUDA_SUCCESS && drv.elapsed(&ms, ev.anchor[r->li], r->e) == CUDA_SUCCESS) {
            int64_t end = ev.anchor_t[r->li] + (int64_t)((double)ms * 1e6);
            struct evstream *st = &ev.st[r->si];
            int64_t start = st->done_at > r->first ? st->done_at : r->first;
            int64_t added = end > start ? ev_add(sh, r->li, start, end) : 0;
            if (end > st->done_at) st->done_at = end;
            trace("E %lld %d %lld %lld %lld\n", (long long)now, r->li, (long long)start, (long long)end,
                  (long long)added);
        }
        ev_free(r->li, r->e);
        ev.tail++;
    }
    __atomic_store_n(&ev.inflight, ev.tail != ev.head, __ATOMIC_RELEASE);
    /* a fresh anchor now and then (cuEventElapsedTime's float keeps microseconds only over minutes) */
    for (int li = 0; li < gp_cfg.ndev && li < GP_MAX_DEV; li++) {
        if (ev.anchor[li] == NULL) continue;
        ev_ctx(li);
        if (ev.next_anchor[li] != NULL && drv.query(ev.next_anchor[li]) == CUDA_SUCCESS) {
            drv.destroy(ev.anchor[li]);
            ev.anchor[li] = ev.next_anchor[li];
            ev.anchor_t[li] = ev.next_anchor_t[li];
            ev.next_anchor[li] = NULL;
        } else if (ev.next_anchor[li] == NULL && now - ev.anchor_t[li] > ANCHOR_AGE_NS) {
            CUevent e = ev_new(li);
            int64_t t = gp_now_ns();
            if (e != NULL && drv.record(e, ev.anchor_stream[li]) == CUDA_SUCCESS) {
                ev.next_anchor[li] = e;
                ev.next_anchor_t[li] = t;
            } else if (e != NULL) {
                ev_free(li, e);
            }
        }
    }
    pthread_mutex_unlock(&ev.mu);
}

/* ---- the poller: measure, correct, set the rate ------------------------------------------------------- */
#define MAX_SEEN_PIDS 64
#define HIST 256     /* the events' running total at each measurement (a few seconds of them) */
#define SWITCHES 16  /* the last changes between measuring by events (alone) and by NVML (with others) */
#define CAL_MIN_NS 150000000.0 /* the scale is learnt from at least 0.15 s of the pod's busy time alone (at 0.2 s
                                * a tenant at 30 alone for its first second before another joined did not
                                * reach it at some phases of its 1/6 s samples, and never learnt the scale) */
#define SOLO_G_MIN_NS 200000000.0 /* g from solo time once 0.2 s of events outweigh the first queue */
#define F_MIN_NS 20000000.0    /* f from at least 20 ms of the pod's event-measured time with others ... */
#define F_MIN_SAMPLES 1        /* ... over one of its samples at least (it only weighs the provisional part) */
#define G_MIN_LAUNCHES 16.0    /* the device time per launch from 16 launches at least */
struct devmeter {
    unsigned long long last_ts;   /* newest NVML sample timestamp consumed (us) */
    unsigned long long period_us; /* NVML's sample period: the smallest gap between two samples of one PID */
    struct { int64_t pid; unsigned long long ts; } seen[MAX_SEEN_PIDS]; /* each PID's newest sample consumed */
    int nseen;
    uint64_t charged_seen;
    uint64_t launches_seen;
    uint64_t ev_seen;             /* the pod's event-measured busy time at the last measurement */
    int64_t hist_t[HIST];         /* CLOCK_MONOTONIC of each measurement ... */
    uint64_t hist_ev[HIST];       /* ... and the events' total then */
    uint64_t hist_l[HIST];        /* ... and the pod's launches then */
    unsigned nhist;
    int64_t sw_t[SWITCHES];       /* from sw_t[k] on, the pod was solo (sw_solo[k]) or shared the GPU */
    int sw_solo[SWITCHES];
    unsigned nsw;
    int64_t other_end;            /* the end of the newest busy NVML sample of another process (monotonic ns) */
    double cost_busy, cost_launches; /* decaying sums for the per-launch estimate */
    double u_pod, u_other;        /* smoothed shares of the GPU (elastic) */
    double cal_nvml, cal_ev;      /* sums over NVML samples of the pod alone: their busy time and the events' */
    double f_nvml, f_ev, f_l;     /* the same with others busy (f), and the pod's launches over those samples */
    double prov;                  /* provisional busy time counted (shared time NVML does not cover yet) */
    int64_t cov_t;                /* NVML's samples of the pod cover it up to here (monotonic ns) */
    int64_t start_t;              /* when this poller began counting */
    double busy_total, busy_published; /* the pod's measured busy time: signed total, and what busy_ns got */
    int alone;                    /* nobody else busy on the GPU (elastic) */
    int64_t multi_until;          /* two or more of the pod's processes were busy: f applies until then */
    struct { int64_t pid, a, b, cov; } pbusy[8]; /* each of the pod's processes: its newest busy sample (a, b]
                                                   * and its newest sample's end (cov) */
    int npbusy;
    int f_samples;                /* the pod's samples f was learnt from */
    double all_nvml, all_t;       /* decaying sums: everyone's NVML busy time, wall time */
    int64_t last_at;              /* the previous measurement */
    int64_t unmeasured_ns;        /* charged while nothing showed the pod, since the last sighting */
    int trust;                    /* corrections apply: the pod's work is being found */
    int paced;                    /* the GPU was capped at the previous measurement (the window was paced) */
    int started;                  /* a first reading has set where this poller's counting begins */
    struct deferred { unsigned long long ts; unsigned util; int mine; int64_t pid; } defer[16]; /* held back */
    int64_t known[MAX_SEEN_PIDS]; /* the other processes with a context on the GPU at the last look (elastic) */
    int nknown, listed;
    int upper;                    /* shared time was counted as all of the events since the last samples */
    double held;                  /* credit the first samples gave back, paid out at RELEASE_PPM */
    int64_t hold_until;           /* elastic holds its cap until then: a newcomer's samples are not in yet */
    int64_t listed_until;         /* shared because NVML lists another context: until its samples could show */
    double solo_e, solo_l;        /* decaying sums over solo time: the pod's events and launches (g before
                                   * NVML has shown the pod sharing) */
    int ndefer;
};
#define DEFER 16
static struct devmeter meters[GP_MAX_DEV];

/* One poll's NVML samples, summed. */
struct acc {
    double pod_raw, other_raw; /* busy time at NVML's scale */
    int64_t others_from;       /* the start of the earliest busy sample of another process (monotonic ns) */
    int multi;                 /* a busy sample of the pod overlapped another of its processes' newest */
    int nmine;
    struct { int64_t a, b; double busy; int k; } mine[64]; /* the pod's samples: (a, b], busy time, and how
                                                            * many of the pod's processes were busy over it */
};

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

/* The slot of a PID's newest consumed sample (the oldest slot is reused when full). */
static int seen_slot(struct devmeter *m, int64_t pid) {
    int oldest = 0;
    for (int i = 0; i < m->nseen; i++) {
        if (m->seen[i].pid == pid) return i;
        if (m->seen[i].ts < m->seen[oldest].ts) oldest = i;
    }
    if (m->nseen < MAX_SEEN_PIDS) oldest = m->nseen++;
    m->seen[oldest].pid = pid;
    m->seen[oldest].ts = 0;
    return oldest;
}

/* An NVML timestamp (us) on CLOCK_MONOTONIC: drivers stamp samples with the wall clock; whichever of the
 * two clocks the stamp is nearer to is the one it was taken on. */
static int64_t ts_mono(unsigned long long ts_us, int64_t now) {
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    int64_t real = (int64_t)w.tv_sec * 1000000000LL + w.tv_nsec, t = (int64_t)ts_us * 1000;
    int64_t dm = t > now ? t - now : now - t, dr = t > real ? t - real : real - t;
    return dm <= dr ? t : t - (real - now);
}

/* A running total kept at each measurement (the events', or the launches') at time t, interpolated. */
static double hist_at(const struct devmeter *m, const uint64_t *h, int64_t t) {
    unsigned n = m->nhist < HIST ? m->nhist : HIST;
    if (n == 0) return 0;
    unsigned newest = (m->nhist - 1) % HIST, oldest = (m->nhist - n) % HIST;
    if (t >= m->hist_t[newest]) return (double)h[newest];
    if (t <= m->hist_t[oldest]) return (double)h[oldest];
    for (unsigned k = 1; k < n; k++) {
        unsigned i = (m->nhist - 1 - k) % HIST, j = (m->nhist - k) % HIST; /* i before j */
        if (m->hist_t[i] <= t) {
            double f = (double)(t - m->hist_t[i]) / (double)(m->hist_t[j] - m->hist_t[i]);
            return (double)h[i] + f * (double)(h[j] - h[i]);
        }
    }
    return (double)h[oldest];
}
static double ev_at(const struct devmeter *m, int64_t t) { return hist_at(m, m->hist_ev, t); }
static double launches_at(const struct devmeter *m, int64_t t) { return hist_at(m, m->hist_l, t); }

static void set_mode(struct devmeter *m, int64_t t, int solo) {
    m->sw_t[m->nsw % SWITCHES] = t;
    m->sw_solo[m->nsw % SWITCHES] = solo;
    m->nsw++;
}

static int mode_solo(const struct devmeter *m) { return m->nsw == 0 || m->sw_solo[(m->nsw - 1) % SWITCHES]; }

/* What of (x, y] fell in shared segments: the pod's event-measured time there (what 1), its launches (2),
 * or the wall time (0). */
static double in_shared(const struct devmeter *m, int64_t x, int64_t y, int what) {
    if (y <= x || m->nsw == 0) return 0;
    unsigned n = m->nsw < SWITCHES ? m->nsw : SWITCHES;
    double part = 0;
    for (unsigned k = 0; k < n; k++) {
        unsigned i = (m->nsw - n + k) % SWITCHES;
        int64_t from = m->sw_t[i], to = k + 1 < n ? m->sw_t[(i + 1) % SWITCHES] : INT64_MAX;
        if (k == 0 && from > x) from = x; /* before the oldest change known: as it was then */
        if (m->sw_solo[i]) continue;
        int64_t a = from > x ? from : x, b = to < y ? to : y;
        if (b > a) part += what == 1 ? ev_at(m, b) - ev_at(m, a) : what == 2 ? launches_at(m, b) - launches_at(m, a)
                                                                           : (double)(b - a);
    }
    return part;
}
static double ev_shared(const struct devmeter *m, int64_t x, int64_t y) { return in_shared(m, x, y, 1); }
static double launches_shared(const struct devmeter *m, int64_t x, int64_t y) { return in_shared(m, x, y, 2); }
/* The share of (x, y] that was shared time (for a sample the events say nothing about). */
static double time_shared(const struct devmeter *m, int64_t x, int64_t y) {
    return y > x ? in_shared(m, x, y, 0) / (double)(y - x) : 0;
}

/* Two of the pod's processes busy at once: a busy sample of one overlaps the newest busy sample of another.
 * Each process is sampled at its own phase, so the two samples of one period come in the same poll only
 * when the phases are within a poll of each other; a pod of two 44 ms apart never had both in one poll,
 * went solo and summed its processes' events (each also counts the time its work waited for the other's
 * slices), and paced itself to 33 % of a 40 % cap. So each process's newest busy sample is kept across
 * polls. Returns how many of the pod's processes were busy over the sample (itself included). */
static int pod_sample(struct devmeter *m, int64_t pid, int64_t a, int64_t b, double busy, struct acc *acc) {
    int slot = -1, oldest = 0, k = 1;
    for (int i = 0; i < m->npbusy; i++) {
        if (m->pbusy[i].pid == pid) slot = i;
        else if (busy > 0 && m->pbusy[i].b > a && b > m->pbusy[i].a) k++;
        if (m->pbusy[i].b < m->pbusy[oldest].b) oldest = i;
    }
    if (k > 1) acc->multi = 1;
    if (slot < 0) {
        slot = m->npbusy < (int)(sizeof m->pbusy / sizeof m->pbusy[0]) ? m->npbusy++ : oldest;
        m->pbusy[slot].pid = pid;
        m->pbusy[slot].a = m->pbusy[slot].b = m->pbusy[slot].cov = INT64_MIN;
    }
    if (b > m->pbusy[slot].cov) m->pbusy[slot].cov = b;
    if (busy > 0 && b > m->pbusy[slot].b) {
        m->pbusy[slot].a = a;
        m->pbusy[slot].b = b;
    }
    return k;
}

/* A sample covering (ts - gap, ts]: smUtil x gap of busy time at NVML's scale. */
static void take(struct devmeter *m, int64_t now, int64_t pid, unsigned long long ts, unsigned long long gap,
                 unsigned util, int mine, struct acc *acc) {
    if (m->period_us != 0 && gap > m->period_us) gap = m->period_us;
    double busy = util / 100.0 * (double)gap * 1000.0;
    int64_t b = ts_mono(ts, now), a = b - (int64_t)gap * 1000;
    /* what ran before this poller began counting was charged to nobody it knows of (a sample that began
     * before counts whole: the pod's work in it ran after the pod's first launches, not spread over it) */
    if (b <= m->start_t) return;
    if (mine) {
        acc->pod_raw += busy;
        int k = pod_sample(m, pid, a, b, busy, acc);
        if (acc->nmine < 64) {
            acc->mine[acc->nmine].a = a;
            acc->mine[acc->nmine].b = b;
            acc->mine[acc->nmine].busy = busy;
            acc->mine[acc->nmine].k = k;
            acc->nmine++;
        }
    } else if (busy > 0) {
        acc->other_raw += busy;
        if (b > m->other_end) m->other_end = b;
        if (a < acc->others_from) acc->others_from = a;
    }
}

/* elastic: has a process outside the pod opened a context on the GPU since the last look? NVML lists it at
 * once, a period and its lag before its first utilisation sample: lending stops then, not a period later
 * (a neighbour's demand is invisible in what it gets on a time-sliced GPU until the lender gives way). */
static int newcomer(struct devmeter *m, int64_t now, const int64_t *pids, int npids, int64_t period_ns) {
    typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    static procs_fn get;
    if (get == NULL) get = (procs_fn)gp_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
    nvmlDevice_t h = gp_nvml_device((int)(m - meters));
    if (get == NULL || h == NULL) return 0;
    nvmlProcessInfo_t info[MAX_SEEN_PIDS];
    unsigned n = MAX_SEEN_PIDS;
    nvmlReturn_t r = get(h, &n, info);
    if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE) return 0;
    if (n > MAX_SEEN_PIDS) n = MAX_SEEN_PIDS;
    int fresh = 0, nk = 0;
    int64_t now_known[MAX_SEEN_PIDS];
    for (unsigned i = 0; i < n; i++) {
        int64_t pid = (int64_t)info[i].pid;
        int mine = 0, seen = 0;
        for (int k = 0; k < npids; k++) mine |= pids[k] == pid;
        if (mine) continue;
        for (int k = 0; k < m->nknown; k++) seen |= m->known[k] == pid;
        fresh |= !seen;
        now_known[nk++] = pid;
    }
    memcpy(m->known, now_known, (size_t)nk * sizeof now_known[0]);
    m->nknown = nk;
    if (!m->listed) { /* the first look only learns who is there */
        m->listed = 1;
        return 0;
    }
    if (fresh) m->hold_until = now + 2 * period_ns + 50000000LL;
    return fresh;
}

/* The pod's device time over the shared part of (x, now] that NVML has not covered yet. Its launches times
 * g (the device time per launch NVML showed over the pod's shared samples), never more than its events
 * (which also count the time its work waited for others' slices: an upper bound); before g is learnt, its
 * events times f. Why launches and not events: while the pod shares the GPU with work queued its events
 * run with the wall clock whatever it gets, so f x events says nothing of what it does now, only what it
 * got over the samples f came from (with 1 s samples, a second and more ago); a launch's device time is
 * its own, whoever shares the GPU. */
static double provisional(const struct devmeter *m, int64_t x, int64_t now, double f, double g) {
    double e = ev_shared(m, x, now);
    if (g <= 0) return f * e;
    double l = g * launches_shared(m, x, now);
    return l < e ? l : e;
}

static void measure(int li, struct gp_shared *s, int64_t now) {
    static util_fn get;
    if (get == NULL) get = (util_fn)gp_nvml_sym("nvmlDeviceGetProcessUtilization");
    nvmlDevice_t h = gp_nvml_device(li);
    struct devmeter *m = &meters[li];
    struct gp_devstate *d = &s->dev[li];
    unsigned int n = 0;
    nvmlReturn_t r = get != NULL && h != NULL ? get(h, NULL, &n, m->last_ts) : NVML_ERROR_NOT_SUPPORTED;
    /* no per-process samples at all (MIG mode, or no NVML): the events measure, alone or not */
    int no_samples = r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND;
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
    uint64_t charged = __atomic_load_n(&d->charged_ns, __ATOMIC_ACQUIRE);
    uint64_t evb = __atomic_load_n(&s->ev_busy_ns[li], __ATOMIC_ACQUIRE);
    m->hist_t[m->nhist % HIST] = now;
    m->hist_ev[m->nhist % HIST] = evb;
    m->hist_l[m->nhist % HIST] = __atomic_load_n(&d->launches, __ATOMIC_ACQUIRE);
    m->nhist++;
    if (!m->started) { /* a new poller: what ran before now was counted by another, or by nobody */
        m->started = 1;
        m->charged_seen = charged;
        m->launches_seen = __atomic_load_n(&d->launches, __ATOMIC_ACQUIRE);
        m->ev_seen = evb;
        m->last_at = now;
        m->cov_t = m->start_t = now;
        set_mode(m, now, 1);
        free(buf);
        return;
    }
    int64_t period_ns = (int64_t)(m->period_us ? m->period_us : 166667) * 1000;
    /* Each sample is the PID's mean since its own previous sample (the driver samples each process at its
     * own phase): it covers (ts - gap, ts], gap the time since the PID's previous sample, at most one
     * period (a PID idle for periods has no samples for them); a PID's first sample covers one learnt
     * period, or counts nothing until one is learnt. A sample already consumed (a driver repeating its
     * last) is skipped. Another process busy with the pod measured by events: from the start of its
     * sample on, the pod is measured by NVML (the events counted since then are taken back below). */
    struct acc acc;
    memset(&acc, 0, sizeof acc);
    acc.others_from = INT64_MAX;
    for (unsigned i = 0; i < n; i++) {
        unsigned long long ts = buf[i].timeStamp;
        int mine = 0;
        for (int k = 0; k < npids; k++) mine |= pids[k] == (int64_t)buf[i].pid;
        trace("%lld %u %llu %u %d %llu\n", (long long)now, buf[i].pid, ts, buf[i].smUtil, mine,
              (unsigned long long)charged);
        int k = seen_slot(m, (int64_t)buf[i].pid);
        unsigned long long prev = m->seen[k].ts;
        if (ts <= prev) continue;
        m->seen[k].ts = ts;
        if (ts > m->last_ts) m->last_ts = ts;
        if (prev != 0 && (m->period_us == 0 || ts - prev < m->period_us)) m->period_us = ts - prev;
        if (prev == 0 && m->period_us == 0) { /* how long its first sample covers is not known yet */
            if (m->ndefer < DEFER) m->defer[m->ndefer++] = (struct deferred){ts, buf[i].smUtil, mine, buf[i].pid};
            continue;
        }
        unsigned long long gap = prev == 0 ? m->period_us : ts - prev;
        take(m, now, (int64_t)buf[i].pid, ts, gap, buf[i].smUtil, mine, &acc);
    }
    if (m->period_us != 0) { /* a period is known now: the first samples held back cover one */
        for (int i = 0; i < m->ndefer; i++)
            take(m, now, m->defer[i].pid, m->defer[i].ts, m->period_us, m->defer[i].util, m->defer[i].mine, &acc);
        m->ndefer = 0;
    }
    free(buf);
    double pod_raw = acc.pod_raw, other_raw = acc.other_raw;
    int64_t others_from = acc.others_from;
    uint64_t launches = __atomic_load_n(&d->launches, __ATOMIC_ACQUIRE);
    uint64_t dc = charged - m->charged_seen, dl = launches - m->launches_seen;
    double dev_ns = (double)(evb - m->ev_seen), dt = (double)(now - m->last_at);
    m->charged_seen = charged;
    m->launches_seen = launches;
    m->ev_seen = evb;
    m->last_at = now;

    /* The measure (see the header comment). Time is split into segments: "solo" while NVML shows nobody
     * else busy on the GPU and at most one of the pod's processes busy, "shared" otherwise (the switches
     * are kept in sw_t / sw_solo). Solo, the pod's device time is what its events measured: exact, at
     * any smUtil scale. Shared, the events also count the time the pod's queued work waited for other
     * contexts' slices; there the truth is NVML's samples of the pod divided by the scale (learnt from
     * NVML against the events while solo), each sample counted for the part of the pod's work in it that
     * fell in shared time. NVML covers the pod only up to its newest samples, a period and a lag ago: the
     * shared time since then is counted provisionally, as its events times f (what NVML said against what
     * the events counted over the shared samples so far), and replaced by the truth when the samples
     * come. So the totals the bucket is corrected by are exact, and still follow the pod within a poll. */
    int64_t last_sw = m->sw_t[(m->nsw - 1) % SWITCHES];
    int was_solo = mode_solo(m);
    double retro = 0;
    int first_look = !m->listed;
    int fresh = newcomer(m, now, pids, npids, period_ns);
    if (acc.multi) m->multi_until = now + 2 * period_ns + 50000000LL;
    int others_gone = now - m->other_end > period_ns + period_ns / 2 + 20000000LL;
    /* without per-process samples (MIG) nobody else is busy only if nobody else holds a context there */
    m->alone = no_samples ? m->listed && m->nknown == 0 : others_gone && others_from == INT64_MAX;
    if (no_samples) {
        if (!was_solo) set_mode(m, now, 1);
    } else if (was_solo && (others_from != INT64_MAX || acc.multi)) {
        /* shared since the other's sample began (the solo events counted since then are taken back and
         * counted provisionally below: nothing changes until NVML's samples say how much was the pod's) */
        int64_t from = others_from == INT64_MAX ? now : others_from > last_sw ? others_from : last_sw;
        if (from > now) from = now;
        int64_t prev = now - (int64_t)dt;
        if (from < prev) retro = ev_at(m, prev) - ev_at(m, from); /* counted as solo by earlier polls */
        set_mode(m, from, 0);
    } else if (was_solo && (fresh || (first_look && m->nknown > 0))) {
        /* NVML lists a context of another process (at once; its first sample comes a period and a lag
         * later): shared from now on until its samples could have shown it, so the pod's events, which
         * also count its work's wait for that process's slices, are not taken for its device time. With
         * 1 s samples two tenants starting together each took the other's slices as theirs for a second
         * and more, and the largest never got back what it left unused (30/70: 29.2/62.0). */
        set_mode(m, now, 0);
        /* the period may not be known yet: the longest there is (1 s) then */
        m->listed_until = now + 2 * (m->period_us ? period_ns : 1000000000LL) + 50000000LL;
    } else if (!was_solo && others_gone && now >= m->multi_until && now >= m->listed_until) {
        set_mode(m, now, 1); /* nobody else busy for a period and a half after the last sample showing one */
    }
    int solo = mode_solo(m);
    last_sw = m->sw_t[(m->nsw - 1) % SWITCHES];

    double scale = (double)__atomic_load_n(&s->scale_ppm[li], __ATOMIC_RELAXED) / GP_PPM;
    if (scale < 0.05 || scale > 20) scale = 0; /* not a scale this library wrote */
    uint64_t agent = gp_cfg.file != NULL ? gp_cfg.file->nvml_scale_ppm[li] : 0;
    if (scale <= 0 && agent >= 50000 && agent <= 20000000) scale = (double)agent / GP_PPM;
    /* everyone's NVML busy time against the wall time, over ~3 s, ten sample periods at least */
    double lo_span = 10.0 * (double)period_ns > 3e9 ? 10.0 * (double)period_ns : 3e9;
    double keep3 = dt > 0 ? 1.0 - dt / lo_span : 1.0;
    if (keep3 < 0) keep3 = 0;
    m->all_nvml = m->all_nvml * keep3 + pod_raw + other_raw;
    m->all_t = m->all_t * keep3 + dt;
    if (scale <= 0) { /* not learnt, not given: NVML's documented 1, or more if everyone's samples add up to
                       * more than the wall time (the GPU cannot be busier than that) */
        scale = 1.0;
        double lo = m->all_t > 0 ? m->all_nvml / m->all_t : 0;
        /* NVML's time comes a sample period at a time, the wall time smoothly: right after a period's
         * samples the sums can be over by up to a period's worth (with 1 s samples a scale of 1.11 was
         * taken after every sample, and the tenant at 30 of 30/70 ran 35 % for half a second each time) */
        if (m->all_t > lo_span / 3 && lo > 1.02 + (double)period_ns / lo_span) scale = lo;
    }

    double truth = 0, cal_n = 0, cal_e = 0, f_n = 0, f_e = 0, f_l = 0;
    for (int i = 0; i < acc.nmine; i++) {
        int64_t sa = acc.mine[i].a, sb = acc.mine[i].b;
        double e = ev_at(m, sb) - ev_at(m, sa), w = ev_shared(m, sa, sb);
        double part = e > 0 ? w / e : time_shared(m, sa, sb);
        truth += acc.mine[i].busy / scale * part;
        if (part <= 0 && solo && sa > last_sw) { /* solo for the whole sample: NVML against the events */
            cal_n += acc.mine[i].busy;
            cal_e += e;
        } else if (part >= 0.999 && e > 0) { /* shared for the whole sample */
            f_n += acc.mine[i].busy;
            f_e += e / acc.mine[i].k; /* the pod's events over it are all its busy processes' */
            f_l += (launches_at(m, sb) - launches_at(m, sa)) / acc.mine[i].k;
            m->f_samples++;
        }
        if (sb > m->cov_t) m->cov_t = sb;
    }
    double keep = dt > 0 ? 1.0 - dt / 10e9 : 1.0; /* the scale: sums over ~10 s */
    if (keep < 0) keep = 0;
    m->cal_nvml = m->cal_nvml * keep + cal_n;
    m->cal_ev = m->cal_ev * keep + cal_e;
    if (m->cal_ev > CAL_MIN_NS && m->cal_nvml > 0)
        __atomic_store_n(&s->scale_ppm[li], (int64_t)(m->cal_nvml / m->cal_ev * GP_PPM), __ATOMIC_RELAXED);
    double keep2 = dt > 0 ? 1.0 - dt / 2e9 : 1.0; /* f and g: sums over ~2 s */
    if (keep2 < 0) keep2 = 0;
    m->f_nvml = m->f_nvml * keep2 + f_n;
    m->f_ev = m->f_ev * keep2 + f_e;
    m->f_l = m->f_l * keep2 + f_l;
    int learnt = m->f_ev > F_MIN_NS && m->f_samples >= F_MIN_SAMPLES && m->f_nvml > 0;
    /* Before NVML has shown the pod sharing (and with no device time per launch from solo time, g below),
     * all its events count: an upper bound, so the pod runs under its cap until its first samples, never
     * over (docs/concepts.md: why no lower estimate holds every case there). The credit those samples
     * then give back is paid out at most RELEASE_PPM of the GPU's time above the cap (`held`). */
    double f = 1.0;
    int upper = !learnt && m->nknown > 0;
    if (learnt) f = m->f_nvml / scale / m->f_ev;
    int first_truth = m->upper && truth > 0;
    if (first_truth) m->upper = 0;
    if (f > 1.0) f = 1.0;
    if (f < 0.02) f = 0.02;
    /* g: the pod's device time per launch over the same shared samples (NVML against the launches); before
     * those, over the pod's solo time (its events against its launches: exact there, once 0.2 s of events
     * outweigh the queue its first launches filled before any of their events completed) */
    double g = learnt && m->f_l >= G_MIN_LAUNCHES ? m->f_nvml / scale / m->f_l
             : !learnt && m->solo_l >= G_MIN_LAUNCHES && m->solo_e > SOLO_G_MIN_NS ? m->solo_e / m->solo_l : 0;
    if (upper && g <= 0) m->upper = 1;
    double solo_ev = dev_ns - ev_shared(m, now - (int64_t)dt, now);
    double solo_l = (double)dl - launches_shared(m, now - (int64_t)dt, now);
    m->solo_e = m->solo_e * keep2 + solo_ev;
    m->solo_l = m->solo_l * keep2 + (solo_l > 0 ? solo_l : 0);
    /* the provisional part: shared time NVML does not cover yet (the pod's newest sample, or none yet) */
    double prov = provisional(m, m->cov_t, now, f, g);
    /* Several processes of the pod busy: NVML covers each only up to its own newest sample, at its own phase.
     * Each one's part of the pod's events since then is taken as 1/k of them (k busy): what f, learnt the
     * same way, makes of it is that process's share of the pod's device time. */
    int64_t recent = now - (period_ns + period_ns / 2 + 20000000LL);
    int nbusy = 0;
    for (int i = 0; i < m->npbusy; i++) nbusy += m->pbusy[i].b > recent;
    if (nbusy > 1) {
        prov = 0;
        for (int i = 0; i < m->npbusy; i++)
            if (m->pbusy[i].b > recent) prov += provisional(m, m->pbusy[i].cov, now, f, g) / nbusy;
    }
    double pod_ns = truth + solo_ev - retro + prov - m->prov;
    m->prov = prov;
    double other_ns = other_raw / scale;
    trace("S %lld %d %lld %d %.0f %.4f %.0f %.0f %.0f %lld %lld\n", (long long)now, li, (long long)(scale * GP_PPM),
          solo, pod_ns, f, truth, solo_ev - retro, prov, (long long)__atomic_load_n(&d->tokens, __ATOMIC_ACQUIRE),
          (long long)__atomic_load_n(&s->credit_ns[li], __ATOMIC_ACQUIRE));

    /* the agent's busy-time metric: the signed running total (a provisional part replaced by a smaller truth
     * is taken back), published without ever going down */
    m->busy_total += pod_ns;
    if (m->busy_total > m->busy_published) {
        __atomic_add_fetch(&d->busy_ns, (uint64_t)(m->busy_total - m->busy_published), __ATOMIC_RELAXED);
        m->busy_published = m->busy_total;
    }
    __atomic_add_fetch(&d->others_ns, (uint64_t)other_ns, __ATOMIC_RELAXED);
    int64_t cap = gp_cap_ppm(li);
    /* Trust measurements only while they see the pod: a pod whose host PIDs NVML never reports (and whose
     * events measure nothing) would otherwise be credited back every charge and run unpaced. 200 ms of
     * charges with nothing measured suspends the corrections (estimates alone pace) until it shows up. */
    if (pod_ns > 0) {
        m->trust = 1;
        m->unmeasured_ns = 0;
    } else if (dc > 0) {
        m->unmeasured_ns += (int64_t)dc;
        if (m->unmeasured_ns > 200000000LL) m->trust = 0;
    }
    if (m->trust && m->paced && cap < GP_PPM) {
        int64_t c = __atomic_add_fetch(&s->credit_ns[li], (int64_t)dc - (int64_t)pod_ns, __ATOMIC_ACQ_REL);
        /* The first samples after counting all of the events (an over-count while sharing) give back what
         * the pod left unused: as a burst the tenant at 30 of 30/70 ran 35-41 % for a second with 1 s
         * samples. It is held back and paid out at most RELEASE_PPM above the cap. */
        if (first_truth && c > 0) {
            __atomic_sub_fetch(&s->credit_ns[li], c, __ATOMIC_ACQ_REL);
            m->held += (double)c;
            c = 0;
        }
        if (m->held > 0 && dt > 0) {
            double out = dt * RELEASE_PPM / GP_PPM < m->held ? dt * RELEASE_PPM / GP_PPM : m->held;
            m->held -= out;
            c = __atomic_add_fetch(&s->credit_ns[li], (int64_t)out, __ATOMIC_ACQ_REL);
        }
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
    /* Sums decaying over ~0.3 s (four NVML periods at least): longer than any device queue a launch loop
     * builds, short enough to follow a change of kernels. */
    if (pod_ns < 0) pod_ns = 0;
    double cost_span = 4.0 * (double)period_ns > 300e6 ? 4.0 * (double)period_ns : 300e6; /* NVML comes in chunks */
    double keep_cost = 1.0 - dt / cost_span;
    if (keep_cost < 0) keep_cost = 0;
    m->cost_busy = m->cost_busy * keep_cost + pod_ns;
    m->cost_launches = m->cost_launches * keep_cost + (double)dl;
    if (pod_ns > 0 && m->cost_launches >= 1.0)
        __atomic_store_n(&d->cost_ns, (int64_t)(m->cost_busy / m->cost_launches), __ATOMIC_RELAXED);
    if (dt > 0) { /* over a period and a half (25 ms at least): NVML's samples come a period at a time */
        double span = 1.5 * (double)period_ns > 25e6 ? 1.5 * (double)period_ns : 25e6;
        double w = dt / span < 1.0 ? dt / span : 1.0;
        m->u_pod = m->u_pod * (1 - w) + w * (pod_ns / dt);
        m->u_other = m->u_other * (1 - w) + w * (other_ns / dt);
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
        /* On a time-sliced GPU a borrower with work queued takes half the slices from a neighbour that wants
         * more, and the neighbour's demand never shows in what it gets: so the pod borrows only while nobody
         * else is busy on the GPU (NVML), stops the moment a new process opens a context there (its samples
         * come a period later), and is held at its cap while it shares the GPU. */
        if (fresh) rate = cap;                                               /* someone new: give back at once */
        else if (now < m->hold_until) rate = cap;                            /* until NVML can show what it does */
        else if (m->alone) rate = GP_PPM - ELASTIC_MARGIN_PPM;                /* alone: all but the margin */
        else rate = cap;                                                     /* sharing: its cap */
        if (rate < cap) rate = cap;
        if (rate > GP_PPM - ELASTIC_MARGIN_PPM) rate = GP_PPM - ELASTIC_MARGIN_PPM;
        if (rate < old || now < m->hold_until + 2 * period_ns) {
            /* credit saved at the higher rate is not the neighbour's to wait for: nor is credit that comes
             * back from that time later (NVML's samples of it arrive a period late) */
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
    /* This thread queries and records events while the tenant may be capturing a CUDA graph in global mode
     * (PyTorch's default), where a potentially unsafe call from any thread not in relaxed mode invalidates
     * the capture: nothing this thread does belongs to a capture, so it runs relaxed. */
    pthread_once(&drv_once, drv_resolve);
    if (drv.exchange_mode != NULL) {
        CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
        drv.exchange_mode(&relaxed);
    }
    int64_t me = getpid();
    int64_t last = gp_now_ns();
    int capped = 0;
    for (;;) {
        int64_t poll = poll_ns();
        /* every process reads its own events each millisecond while capped; the pod's poller reads NVML and
         * corrects the bucket every poll */
        sleep_ns(capped && __atomic_load_n(&ev.active, __ATOMIC_ACQUIRE) ? EV_TICK_NS : poll);
        struct gp_shared *s = gp_shm();
        int64_t now = gp_now_ns();
        ev_poll(s, now);
        capped = 0; /* a squeeze may cap an uncapped pod at any time: looked at on every wake-up */
        for (int li = 0; li < gp_cfg.ndev; li++) capped |= gp_cap_ppm(li) < GP_PPM;
        /* Uncapped pods are measured for the agent's metrics only: once a second is plenty. */
        if (!capped && now - last < 1000000000LL) continue;
        if (capped && now - last < poll - EV_TICK_NS / 2) continue;
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
        for (int li = 0; li < gp_cfg.ndev; li++) measure(li, s, now);
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

static void pace(int li);

/* 0, or the error the launch returns instead of running: a process the pod cannot count does not run. */
static CUresult gp_launch_gate(int li) {
    if (li < 0) return CUDA_SUCCESS;
    if (!gp_has_slot()) return CUDA_ERROR_OUT_OF_MEMORY;
    pace(li);
    return CUDA_SUCCESS;
}

/* Until when the pod's work was on the device, as far as this process knows: its work is still there while
 * one of its events has not completed (a batch of long kernels may be covered by a single event), else it
 * was there until the pod's newest event completed. */
static int64_t busy_until(struct gp_shared *sh, int li) {
    if (__atomic_load_n(&ev.inflight, __ATOMIC_ACQUIRE)) return INT64_MAX;
    return __atomic_load_n(&sh->ev_until[li], __ATOMIC_ACQUIRE);
}

static void pace(int li) {
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
    refill(d, gp_now_ns(), rate, cost, busy_until(sh, li));
    __atomic_add_fetch(&d->charged_ns, (uint64_t)cost, __ATOMIC_RELAXED);
    int64_t t = __atomic_sub_fetch(&d->tokens, cost, __ATOMIC_ACQ_REL) + __atomic_load_n(&sh->credit_ns[li], __ATOMIC_ACQUIRE);
    if (t < 0) ev_close_open();
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
        refill(d, gp_now_ns(), rate, cost, busy_until(sh, li));
        t = __atomic_load_n(&d->tokens, __ATOMIC_ACQUIRE) + __atomic_load_n(&sh->credit_ns[li], __ATOMIC_ACQUIRE);
    }
}

void gp_compute_after_fork(void) {
    pthread_mutex_init(&start_mu, NULL);
    poller_state = 0; /* threads do not survive fork */
    memset(meters, 0, sizeof meters);
    /* the parent's events belong to its context, and the mutex may have been held by a thread that is gone */
    memset(&ev, 0, sizeof ev);
    pthread_mutex_init(&ev.mu, NULL);
    pthread_mutex_init(&trace_mu, NULL);
}

/* ---- launch entry points ------------------------------------------------------------------------------ */
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*graph_fn)(CUgraphExec, CUstream);

/* The gate before a launch (pacing), and after it the launch's event (ev_after_launch). */
#define GATE()                                                          \
    int gli_ = -1;                                                      \
    int64_t glt_ = 0;                                                   \
    do {                                                                \
        gp_init();                                                      \
        if (gp_cfg.ndev != 0) {                                         \
            gli_ = gp_current_index();                                  \
            CUresult g_ = gp_launch_gate(gli_);                         \
            if (g_ != CUDA_SUCCESS) return g_;                          \
            if (gli_ >= 0 && gp_cap_ppm(gli_) < GP_PPM) glt_ = gp_now_ns(); \
        }                                                               \
    } while (0)

#define LAUNCHED(call, stream, ptsz)                                    \
    do {                                                                \
        CUresult r_ = (call);                                           \
        if (r_ == CUDA_SUCCESS && glt_ != 0) ev_after_launch(gli_, (stream), (ptsz), glt_); \
        return r_;                                                      \
    } while (0)

GP_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    GP_REAL(launch_fn, real, "cuLaunchKernel");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(f, gx, gy, gz, bx, by, bz, shm, s, params, extra), s, 0);
}

GP_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                       void **extra) {
    GP_REAL(launch_fn, real, "cuLaunchKernel_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(f, gx, gy, gz, bx, by, bz, shm, s, params, extra), s, 1);
}

GP_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    GP_REAL(launch_ex_fn, real, "cuLaunchKernelEx");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(cfg, f, params, extra), cfg != NULL ? cfg->hStream : NULL, 0);
}

GP_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    GP_REAL(launch_ex_fn, real, "cuLaunchKernelEx_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(cfg, f, params, extra), cfg != NULL ? cfg->hStream : NULL, 1);
}

GP_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    GP_REAL(coop_fn, real, "cuLaunchCooperativeKernel");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(f, gx, gy, gz, bx, by, bz, shm, s, params), s, 0);
}

GP_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                  unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                                                  void **params) {
    GP_REAL(coop_fn, real, "cuLaunchCooperativeKernel_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(f, gx, gy, gz, bx, by, bz, shm, s, params), s, 1);
}

GP_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    GP_REAL(graph_fn, real, "cuGraphLaunch");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(g, s), s, 0);
}

GP_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    GP_REAL(graph_fn, real, "cuGraphLaunch_ptsz");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    GATE();
    LAUNCHED(real(g, s), s, 1);
}

/* A destroyed stream is never recorded on again (the poller closes spans on the application's streams). */
GP_EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    GP_REAL(cuStreamDestroy_fn, real, "cuStreamDestroy_v2");
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    ev_forget_stream(s);
    return real(s);
}

struct gp_hook gp_compute_hooks[] = {
#define H(n) {#n, (void *)n, NULL},
    H(cuLaunchKernel) H(cuLaunchKernel_ptsz) H(cuLaunchKernelEx) H(cuLaunchKernelEx_ptsz)
    H(cuLaunchCooperativeKernel) H(cuLaunchCooperativeKernel_ptsz) H(cuGraphLaunch) H(cuGraphLaunch_ptsz)
    H(cuStreamDestroy_v2)
#undef H
    {NULL, NULL, NULL},
};
