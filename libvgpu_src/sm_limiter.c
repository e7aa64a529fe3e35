/*
 * SM share limiter: a token bucket of device busy time per device, shared by
 * every process of the container through the region (struct hami_sm_state),
 * and charged with each launch's MEASURED device time.
 *
 * A device is limited when its sm_limit is 1..99 and the policy is not
 * `disable`. Otherwise a launch costs a few loads and branches: no event, lock
 * or clock. `force` always holds the share. `default` holds it only while
 * another container's work is active on the device, as the host's activity
 * board says (activity.h: a container can neither make another's work look
 * idle nor look busy itself but through its own stamp): alone, its launches do
 * not wait and are not billed, the bucket refills meanwhile, so a shared phase
 * starts with a fresh short burst and no debt. Without an activity board
 * (bare use without one), `default` holds the share as `force` does.
 *
 * - Tokens are nanoseconds of device time the container may still use. They
 *   refill at share x wall time (whoever launches next claims the elapsed
 *   wall time with a CAS on refill_ns) and are capped at share x
 *   SM_BURST_WINDOW_NS, so an idle container cannot save up more than a short
 *   burst.
 * - A launch waits until the bucket is positive, then is charged at once with
 *   this process's running estimate of a launch's device time. Two events
 *   recorded around the launch on its own stream measure what it really took;
 *   when the end event has completed (polled with cuEventQuery by later
 *   launches, never blocking) the difference measured - estimate is charged,
 *   so the bucket holds exactly what was used and the long-run average
 *   converges to the share however wrong the estimate was.
 * - Only the kernel's own run is charged. A start event recorded while none of
 *   this process's launches is in flight (the GPU idle before it, as a
 *   throttled launch always finds it) is reached at once, and the kernel only
 *   after the driver's launch call has returned and the GPU has dispatched it:
 *   the events would bill both, a large part of a short kernel (on an H200,
 *   ~10 us of dispatch a launch beyond the call: 50 us kernels held at 30 %
 *   ran 25 %, and NVML, which counts the dispatch busy too, gave none back).
 *   So a launch near the share on an idle GPU is primed: an empty kernel of ours goes
 *   to its stream first and the start event behind it, so the event is reached
 *   only once a launch has gone through the GPU's dispatch, as the kernel's own
 *   does. A launch on an idle GPU then loses from its measurement the CPU time
 *   from the primer's return (unprimed: the start event's record) to the launch
 *   call's return (never more than half of it, nor four times the least such gap
 *   lately: a call held up after the kernel was queued would hide kernel time);
 *   tests/simgpu/test_kernels.py shows both on the simulator, which models the
 *   dispatch as the H200 showed it. Only launches near the share are primed:
 *   those that find the bucket under half full (as one that waited for the
 *   share always does; there a job whose kernels run below its share would be
 *   held back by its dispatch billed); a job far below its share pays no extra
 *   launch. Where the empty kernel cannot be loaded (the driver cannot compile
 *   its PTX), launches are charged as measured.
 * - Launches measured but not yet harvested are bounded (SM_PROBES, and two or
 *   SM_INFLIGHT_NS of estimated work; one until a first measurement exists):
 *   a process cannot run further ahead of its measurements than that.
 * - Events measure latency, not occupancy: a launch that waited behind another
 *   process's kernel (or its time slices) looks longer than it ran, and the
 *   container would pay for the other's work; and the GPU's own dispatch of a
 *   launch is inside them. Every SM_TICK_NS the process asks NVML what its
 *   kernels ran in the periods the driver recorded since the last ones it
 *   judged by, and once they cover half a second compares that with what
 *   it measured over the same periods (NVML's sample stamps say where they
 *   end: the newest can end up to a period, up to a second, before the
 *   question; compared with the last second instead, a change of pace read
 *   as a wrong ratio and had to be smoothed over seconds), and measurements
 *   are charged scaled by that ratio (in [SM_FACTOR_MIN, 1]), alone or
 *   beside other containers. The factor never
 *   exceeds 1, so the correction can only give back time that was not used;
 *   without NVML, or without knowing the pid NVML knows us by, it stays 1.
 *   Beside other processes of its own container it goes back to 1: their
 *   kernels are the container's to pay, and waits behind them are rare (the
 *   shared bucket spaces them).
 * - Everything shared is updated with atomics; no lock spans processes, so a
 *   process killed at any instant leaves at most its estimates charged.
 * - The region is the container's to write, so its bucket is not trusted
 *   alone: each process also keeps a bucket of its own (same share, same
 *   charges, in its own memory) and waits while either is empty. Honestly
 *   used, the own bucket never holds less than the shared one (it pays only
 *   for its process's work); scribbled over, the shared one can let the
 *   container's processes together run past the share, never one of them.
 *
 * - Launches into a capturing stream never reach the limiter (cuda_launch.c),
 *   so no event is recorded in a capture; the events' queries and records run
 *   in relaxed capture mode (capture.h), so another thread's capture in global
 *   mode is never invalidated by them.
 *
 * Within a process, a limited launch holds its device's local lock from
 * before_launch to after_launch (the driver's launch call only, never a sleep),
 * so two threads sharing a stream cannot interleave a launch between the other's
 * events. No thread is started and no signal is used. A forked child starts with
 * an empty local state (pthread_atfork child handler): the parent's events belong
 * to contexts the child cannot use, and a lock may be held by a thread it lacks.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "activity.h"
#include "capture.h"
#include "sm_limiter.h"

#define SM_PROBES 64                             /* measured launches in flight, per process and device */
#define SM_INFLIGHT_NS 20000000LL                /* ... beyond two, at most this much estimated work */
#define SM_HARVEST_PENDING 2                     /* a harvest stops at this many unfinished probes */
#define SM_BURST_WINDOW_NS 40000000LL            /* tokens kept at most: share x 40 ms (a busy second after an idle one reads share + 4 % of it) */
#define SM_SLEEP_MIN_NS 20000LL
#define SM_SLEEP_MAX_NS 10000000LL
#define SM_POLL_NS 200000LL                      /* waiting for a measurement: look every 0.2 ms */
#define SM_TICK_NS 250000000LL                   /* occupancy correction period */
#define SM_BIN_NS 25000000LL                     /* measurements kept by when they were launched, in bins of 25 ms ... */
#define SM_BINS 128                              /* ... 3.2 s of them: past SM_NVML_KEPT_NS */
#define SM_NVML_WINDOW_NS 1000000000LL           /* the last second: company, and NVML's periods before a first judgement */
#define SM_NVML_JUDGED_NS 500000000LL            /* NVML's periods are judged once they cover half a second */
#define SM_NVML_KEPT_NS 3000000000LL             /* ... since the last judged, if no longer ago than this */
#define SM_LOOK_NS 100000000LL                   /* `default`: look for other containers' work */
#define SM_RECENT_NS 400000000LL                 /* ... stamped no longer ago than this */
#define SM_NVML_RETRY_NS 10000000000LL           /* pid unknown to NVML: ask again after 10 s */
#define SM_NVML_MAX_PROCS 64
#define SM_SAMPLE_EVERY 2000                     /* a measured launch in so many is logged at debug */
#define SM_NVML_MAX_SAMPLES 65536                /* the most utilisation samples we make room for */
#define SM_FACTOR_MIN 0.25                       /* a kernel time-sliced with others can read 2-4x its run */
#define SM_PID_INIT_NS_INO 0xEFFFFFFCUL          /* inode of the host's pid namespace */

enum { SM_UNKNOWN = 0, SM_OFF = 1, SM_ON = 2 };
enum { PROBE_FREE = 0, PROBE_ARMED, PROBE_FLYING };

/* One measured launch: events around it and the estimate charged for it. */
struct sm_probe {
    CUevent start, end;
    CUcontext ctx;                               /* context the events were created in */
    int64_t charged_ns;
    int64_t idle_since_ns;                       /* CPU clock after the start event's record, when
                                                    nothing was in flight (else 0) ... */
    int64_t idle_gap_ns;                         /* ... to the launch call's return */
    int64_t launched_ns;                         /* CPU clock at the launch */
    int billed;                                  /* 0: launched while alone, nothing to charge */
    int primed;                                  /* the empty kernel went before the start event */
    int state;
};

/* Measured nanoseconds (and launches that went unmeasured) of the launches made in one bin of
 * SM_BIN_NS: bin `index` covers [index, index + 1) x SM_BIN_NS of the CPU clock. */
struct sm_bin {
    int64_t index, measured, unmeasured;
};

/* What one process knows about its launches on one device. */
struct sm_local {
    pthread_mutex_t lock;
    struct sm_probe probes[SM_PROBES];           /* FIFO in launch order: [head, tail) */
    unsigned head, tail;
    int in_use;                                  /* probes not FREE */
    int measured_once;
    int64_t estimate_ns;                         /* running mean of charged launches */
    int64_t gap_floor_ns;                        /* the least launch gap lately (creeps up) */
    uint64_t harvested;                          /* launches measured (for the sampled debug line) */
    /* occupancy correction */
    double factor;                               /* charge = measured x factor */
    int64_t next_tick_ns;
    struct sm_bin bins[SM_BINS];                 /* by launch time: see sm_attribute */
    unsigned long long nvml_seen_us;             /* end of NVML's last period judged by (CPU time, us); 0: none */
    struct hami_sm_state own;                    /* this process's own bucket (tokens, refill) */
    /* `default` policy */
    int alone;                                   /* no other container's work lately */
    int64_t next_look_ns;
    int nvml_usable;
    int64_t nvml_retry_ns;
    nvmlDevice_t nvml_dev;
    unsigned int nvml_pid;
    nvmlReturn_t nvml_said;                      /* the last failure logged, not to repeat it */
};

struct sm_driver {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_destroy)(CUevent);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
    nvmlReturn_t (*nvml_process_util)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
                                      unsigned long long);
    nvmlReturn_t (*nvml_running)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*module_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                       unsigned int, unsigned int, CUstream, void **, void **);
};

/* Cached per process and device (OFF looked at again per launch, see
 * hami_sm_before_launch): the hot path reads one byte and the limits. */
static uint8_t sm_mode[HAMI_MAX_DEVICES];
static struct sm_local sm_local[HAMI_MAX_DEVICES];
static struct sm_driver sm_drv;
static pthread_once_t sm_once = PTHREAD_ONCE_INIT;
static int sm_events_ok;                         /* event entry points found */

/* The primer: an empty kernel, PTX any driver compiles for any GPU, loaded once per
 * context where a launch first needs it. Named and shaped as the simulated
 * driver's `empty` test kernel (tests/simgpu/README.md), which runs for its parameter's
 * microseconds: 0, as the real one all but does. */
static const char sm_primer_ptx[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                    ".visible .entry empty(.param .u64 empty_us)\n{\n\tret;\n}\n";
#define SM_PRIMER_CONTEXTS 16
static struct sm_primer {
    CUcontext ctx;
    CUfunction fn;                               /* NULL: it could not be had in this context */
} sm_primers[SM_PRIMER_CONTEXTS];
static pthread_mutex_t sm_primer_lock = PTHREAD_MUTEX_INITIALIZER;  /* after a device's loc->lock */

/* What this thread's before_launch armed, for its after_launch. */
static __thread int sm_armed_dev = -1;
static __thread int sm_armed_probe = -1;
static __thread int64_t sm_armed_charge;

static void sm_local_reset(void)
{
    for (int d = 0; d < HAMI_MAX_DEVICES; d++) {
        memset(&sm_local[d], 0, sizeof(sm_local[d]));
        pthread_mutex_init(&sm_local[d].lock, NULL);
        sm_local[d].factor = 1.0;
    }
}

/* In a forked child the parent's events are unusable and a lock may have been
 * held by a thread that does not exist there: start over. */
static void sm_after_fork_child(void)
{
    sm_local_reset();
    memset(sm_primers, 0, sizeof(sm_primers));
    pthread_mutex_init(&sm_primer_lock, NULL);
    sm_armed_dev = -1;
    sm_armed_probe = -1;
}

#define SM_RESOLVE(field, name) (*(void **)&sm_drv.field = hami_driver_symbol(name))

static void sm_init_once(void)
{
    sm_local_reset();
    SM_RESOLVE(ctx_get_current, "cuCtxGetCurrent");
    SM_RESOLVE(ctx_get_device, "cuCtxGetDevice");
    SM_RESOLVE(event_create, "cuEventCreate");
    SM_RESOLVE(event_destroy, "cuEventDestroy_v2");
    SM_RESOLVE(event_record, "cuEventRecord");
    SM_RESOLVE(event_query, "cuEventQuery");
    SM_RESOLVE(event_elapsed, "cuEventElapsedTime");
    SM_RESOLVE(nvml_process_util, "nvmlDeviceGetProcessUtilization");
    SM_RESOLVE(nvml_running, "nvmlDeviceGetComputeRunningProcesses_v3");
    SM_RESOLVE(module_load, "cuModuleLoadData");
    SM_RESOLVE(module_function, "cuModuleGetFunction");
    SM_RESOLVE(launch, "cuLaunchKernel");
    sm_events_ok = sm_drv.ctx_get_current && sm_drv.event_create && sm_drv.event_destroy &&
                   sm_drv.event_record && sm_drv.event_query && sm_drv.event_elapsed;
    if (!sm_events_ok)
        hami_error("SM limit: the driver lacks event functions; launches cannot be measured or limited");
    pthread_atfork(NULL, NULL, sm_after_fork_child);
}

/* The share (percent) that applies to `dev` now, 0 when none. Read from the
 * limits at every call: hamictl update changes limit and policy live. */
static uint32_t sm_share(const struct hami_limits *limits, int dev)
{
    if (!limits || (uint32_t)dev >= limits->device_count ||
        __atomic_load_n(&limits->core_policy, __ATOMIC_RELAXED) == HAMI_POLICY_DISABLE)
        return 0;
    uint32_t limit = __atomic_load_n(&limits->devices[dev].sm_limit, __ATOMIC_RELAXED);
    return (limit == 0 || limit >= 100) ? 0 : limit;
}

static uint8_t sm_decide(int dev)
{
    uint32_t share = sm_share(hami_limits_get(), dev);
    uint8_t mode = share ? SM_ON : SM_OFF;
    if (share)
        hami_info("SM limit on device %d: %u%%", dev, share);
    __atomic_store_n(&sm_mode[dev], mode, __ATOMIC_RELAXED);
    return mode;
}

/* ---- the shared bucket ---- */

/* Adds share x (wall time since the last refill) to the bucket, capped. */
static void sm_refill(struct hami_sm_state *st, uint32_t share, int64_t now)
{
    uint64_t last = __atomic_load_n(&st->refill_ns, __ATOMIC_ACQUIRE);
    if ((int64_t)last >= now ||
        !__atomic_compare_exchange_n(&st->refill_ns, &last, (uint64_t)now, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    int64_t cap = SM_BURST_WINDOW_NS / 100 * share;
    int64_t elapsed = now - (int64_t)last;
    int64_t add = elapsed > SM_BURST_WINDOW_NS ? cap : elapsed / 100 * share;
    int64_t tokens = __atomic_add_fetch(&st->tokens_ns, add, __ATOMIC_ACQ_REL);
    while (tokens > cap &&
           !__atomic_compare_exchange_n(&st->tokens_ns, &tokens, cap, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
        ;
}

/* Charges (or gives back, ns < 0) device time to the container's bucket and the
 * process's own. */
static void sm_charge(struct sm_local *loc, struct hami_sm_state *st, int64_t ns)
{
    if (ns) {
        __atomic_sub_fetch(&st->tokens_ns, ns, __ATOMIC_ACQ_REL);
        __atomic_sub_fetch(&loc->own.tokens_ns, ns, __ATOMIC_ACQ_REL);
    }
}

/* ---- measurements ---- */

static void sm_probe_release(struct sm_local *loc, struct sm_probe *p)
{
    p->state = PROBE_FREE;
    loc->in_use--;
    while (loc->head != loc->tail && loc->probes[loc->head % SM_PROBES].state == PROBE_FREE)
        loc->head++;
}

/* What of a measurement (ns) a launch gap takes off: the gap, but never more than
 * four times the least gap lately, nor half the measurement. A gap far above the least
 * (the thread held up inside the driver's call, a signal handler there) may hide
 * kernel time, so it is not taken whole; the floor creeps up 1/64 a launch so that
 * it follows a driver whose launches became slower. */
static int64_t sm_gap_taken(struct sm_local *loc, int64_t gap, int64_t ns)
{
    if (gap <= 0)
        return 0;
    if (!loc->gap_floor_ns || gap < loc->gap_floor_ns)
        loc->gap_floor_ns = gap;
    else
        loc->gap_floor_ns += loc->gap_floor_ns / 64 + 1;
    int64_t taken = gap < 4 * loc->gap_floor_ns ? gap : 4 * loc->gap_floor_ns;
    return taken < ns / 2 ? taken : ns / 2;
}

/* A launch's measured time (or, unmeasured, that it went without events) is kept by when
 * it was launched, not when it was harvested: harvests happen at later launches, a job that
 * pauses has its last launches harvested when it resumes, and NVML counts them where they
 * ran. A launch runs within SM_INFLIGHT_NS of its call. */
static void sm_attribute(struct sm_local *loc, int64_t launched_ns, int64_t ns, int unmeasured)
{
    int64_t index = launched_ns / SM_BIN_NS;
    struct sm_bin *bin = &loc->bins[index % SM_BINS];
    if (bin->index > index)
        return;                                  /* older than what is kept */
    if (bin->index < index) {
        bin->index = index;
        bin->measured = bin->unmeasured = 0;
    }
    bin->measured += ns;
    bin->unmeasured += unmeasured;
}

/* What was measured of the launches made in [from, to) (the bins at its edges in proportion),
 * and how many of them went unmeasured; -1 when part of it is older than what is kept. */
static int sm_measured_between(const struct sm_local *loc, int64_t now, int64_t from, int64_t to, double *measured,
                               int64_t *unmeasured)
{
    if (from < 0 || now - from > (SM_BINS - 1) * SM_BIN_NS)
        return -1;
    *measured = 0;
    *unmeasured = 0;
    for (int64_t index = from / SM_BIN_NS; index * SM_BIN_NS < to; index++) {
        const struct sm_bin *bin = &loc->bins[index % SM_BINS];
        if (bin->index != index)
            continue;                            /* nothing launched then */
        int64_t lo = index * SM_BIN_NS > from ? index * SM_BIN_NS : from;
        int64_t hi = (index + 1) * SM_BIN_NS < to ? (index + 1) * SM_BIN_NS : to;
        *measured += (double)bin->measured * (double)(hi - lo) / (double)SM_BIN_NS;
        *unmeasured += bin->unmeasured;
    }
    return 0;
}

/* Charges what finished launches really used, oldest first; never waits. */
static void sm_harvest(struct sm_local *loc, struct hami_sm_state *st, int dev)
{
    int pending = 0;
    for (unsigned i = loc->head; i != loc->tail && pending < SM_HARVEST_PENDING; i++) {
        struct sm_probe *p = &loc->probes[i % SM_PROBES];
        if (p->state != PROBE_FLYING) {
            pending += p->state == PROBE_ARMED;
            continue;
        }
        CUresult r = sm_drv.event_query(p->end);
        if (r == CUDA_ERROR_NOT_READY) {
            pending++;
            continue;
        }
        float ms = 0;
        if (r == CUDA_SUCCESS && sm_drv.event_elapsed(&ms, p->start, p->end) == CUDA_SUCCESS && ms >= 0) {
            int64_t ns = (int64_t)((double)ms * 1e6);
            int64_t taken = sm_gap_taken(loc, p->idle_gap_ns, ns);
            ns -= taken;
            int64_t used = (int64_t)((double)ns * loc->factor);
            if (++loc->harvested % SM_SAMPLE_EVERY == 1)   /* what a real GPU's events hold, now and then */
                hami_debug("SM limit: a launch measured %.1f us%s, launch gap %.1f us (%.1f taken), charged %.1f us",
                           (double)ms * 1e3, p->primed ? " primed" : "", (double)p->idle_gap_ns / 1e3,
                           (double)taken / 1e3, (double)used / 1e3);
            sm_attribute(loc, p->launched_ns, ns, 0);
            if (p->billed)
                sm_charge(loc, st, used - p->charged_ns);
            __atomic_add_fetch(&st->busy_ns, (uint64_t)used, __ATOMIC_RELAXED);
            struct hami_proc_slot *self = hami_slot_begin();
            if (self) {
                __atomic_add_fetch(&self->sm_busy_ns[dev], (uint64_t)used, __ATOMIC_RELAXED);
                hami_slot_end();
            }
            loc->estimate_ns = loc->measured_once ? loc->estimate_ns + (used - loc->estimate_ns) / 4 : used;
            loc->measured_once = 1;
        }
        if (r != CUDA_SUCCESS) {
            /* the context is gone: the estimate stays the charge, the events are dropped */
            sm_drv.event_destroy(p->start);
            sm_drv.event_destroy(p->end);
            p->ctx = NULL;
        }
        sm_probe_release(loc, p);
    }
}

/* The next probe, with events in the current context; -1 if none can be had. */
static int sm_probe_get(struct sm_local *loc)
{
    if (loc->tail - loc->head >= SM_PROBES)
        return -1;
    CUcontext ctx = NULL;
    if (sm_drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
        return -1;
    int idx = (int)(loc->tail % SM_PROBES);
    struct sm_probe *p = &loc->probes[idx];
    if (p->ctx != ctx) {
        if (p->ctx) {
            sm_drv.event_destroy(p->start);
            sm_drv.event_destroy(p->end);
            p->ctx = NULL;
        }
        if (sm_drv.event_create(&p->start, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
            return -1;
        if (sm_drv.event_create(&p->end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
            sm_drv.event_destroy(p->start);
            return -1;
        }
        p->ctx = ctx;
    }
    return idx;
}

/* May another launch go before older ones are measured? */
static int sm_window_open(const struct sm_local *loc)
{
    if (!sm_events_ok)
        return 1;
    if (loc->tail - loc->head >= SM_PROBES)
        return 0;
    if (!loc->measured_once)
        return loc->in_use == 0;
    return loc->in_use < 2 || loc->in_use * loc->estimate_ns < SM_INFLIGHT_NS;
}

/* ---- occupancy correction through NVML ---- */

/* The pid NVML reports this process as: the one context creation found (the
 * process that appeared, cuda_context.c: known to this process alone, never
 * read back from the region), our own pid when we live in the host's pid
 * namespace, or else our own pid only if the driver lists it among the
 * device's processes. 0 when unknown. */
static unsigned int sm_nvml_pid(nvmlDevice_t nvml_dev)
{
    unsigned int found = hami_host_pid();
    if (found)
        return found;
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
    unsigned long ino = 0;
    if (n > 0) {
        link[n] = '\0';
        sscanf(link, "pid:[%lu]", &ino);
    }
    unsigned int pid = (unsigned int)getpid();
    if (ino == SM_PID_INIT_NS_INO)
        return pid;
    nvmlProcessInfo_t infos[SM_NVML_MAX_PROCS];
    unsigned int count = SM_NVML_MAX_PROCS;
    if (!sm_drv.nvml_running || sm_drv.nvml_running(nvml_dev, &count, infos) != NVML_SUCCESS)
        return 0;
    for (unsigned int i = 0; i < count; i++)
        if (infos[i].pid == pid)
            return pid;
    return 0;
}

/* NVML's view of the launching context's device and our pid in it. */
static int sm_nvml_open(struct sm_local *loc, int64_t now)
{
    if (loc->nvml_usable)
        return 1;
    if (now < loc->nvml_retry_ns)
        return 0;
    loc->nvml_retry_ns = now + SM_NVML_RETRY_NS;
    CUdevice cu_dev;
    if (!sm_drv.nvml_process_util || !sm_drv.ctx_get_device || sm_drv.ctx_get_device(&cu_dev) != CUDA_SUCCESS ||
        !(loc->nvml_dev = hami_nvml_device(cu_dev)))
        return 0;
    loc->nvml_pid = sm_nvml_pid(loc->nvml_dev);
    if (!loc->nvml_pid) {
        hami_info("SM limit: this process's pid is unknown to NVML; launches are charged as measured");
        return 0;
    }
    loc->nvml_usable = 1;
    return 1;
}

enum { SM_ALONE = 0, SM_WITH_OWN = 1, SM_WITH_FOREIGN = 2 };

/* The driver answers a utilisation buffer smaller than its own sample buffer
 * with INSUFFICIENT_SIZE and the size it wants (the documented sizing call;
 * drivers are reported to want their whole buffer, 100 samples, however few
 * processes ran: on the H200 a 64-entry one never gave a figure), so each device's
 * buffer grows to what the driver asks. Outside sm_local: a forked child keeps
 * it. Used under that device's loc->lock. */
static struct {
    nvmlProcessUtilizationSample_t *buf;
    unsigned int cap;
} sm_samples[HAMI_MAX_DEVICES];

static nvmlReturn_t sm_nvml_samples(int dev, nvmlDevice_t handle, unsigned long long since, unsigned int *count)
{
    for (;;) {
        *count = sm_samples[dev].cap;
        nvmlReturn_t rc = sm_drv.nvml_process_util(handle, sm_samples[dev].buf, count, since);
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE || *count <= sm_samples[dev].cap || *count > SM_NVML_MAX_SAMPLES)
            return rc;
        void *grown = realloc(sm_samples[dev].buf, *count * sizeof(nvmlProcessUtilizationSample_t));
        if (!grown)
            return rc;
        sm_samples[dev].buf = grown;
        sm_samples[dev].cap = *count;
    }
}

/* This process's SM use in the periods NVML recorded after `since` (CPU time, us), in percent
 * (-1 if it is not among the samples), and when the newest of them ended (*stamp, the newest
 * sample's of any process; 0: none since); *company says who else used the
 * device meanwhile: another container (its board entry was active), else processes of this
 * container (samples of pids in its region: only this container can mislead itself), or
 * nobody. With `since` 0 the driver would average its whole sample buffer, seconds old. */
static int sm_nvml_util(struct sm_local *loc, int dev, unsigned long long since, unsigned long long *stamp,
                        int *company)
{
    *company = hami_activity_others(SM_NVML_WINDOW_NS) > 0 ? SM_WITH_FOREIGN : SM_ALONE;
    unsigned int count;
    *stamp = 0;
    nvmlReturn_t rc = sm_nvml_samples(dev, loc->nvml_dev, since, &count);
    if (rc != NVML_SUCCESS) {
        if (rc != NVML_ERROR_NOT_FOUND && rc != loc->nvml_said)
            hami_info("SM limit: NVML's process utilisation answered %d (%u samples wanted); "
                      "launches are charged as measured", (int)rc, count);
        loc->nvml_said = rc;
        return -1;
    }
    const nvmlProcessUtilizationSample_t *samples = sm_samples[dev].buf;
    int util = -1;
    unsigned long long own = 0;
    for (unsigned int i = 0; i < count; i++) {
        if (samples[i].timeStamp > *stamp)
            *stamp = samples[i].timeStamp;
        if (samples[i].pid == loc->nvml_pid) {
            if (samples[i].timeStamp >= own) {
                own = samples[i].timeStamp;
                util = (int)samples[i].smUtil;
            }
        } else if (*company == SM_ALONE && samples[i].smUtil && hami_region_has_pid(samples[i].pid)) {
            *company = SM_WITH_OWN;
        }
    }
    return util;
}

/* Every SM_TICK_NS: compare NVML's occupancy with our measurements of the same
 * periods. Their ratio below 1 is time measured but not run (the GPU's
 * dispatch, waits behind other containers' work), and the charge factor
 * follows it; beside another container, less for a process NVML counts past
 * its share, in proportion to how far past: its events took in the other's run
 * because its own turn ran long (a burst, the GPU preempting it for the
 * other), and time given back would let it burst more (on the H200, a 30 %
 * process read 39-40 % by NVML with its factor at 0.59-0.84). Not alone: NVML
 * counts a short kernel's dispatch too, so a job of 10 us kernels reads past
 * its share at half of it, and under CPU load (a launch held between its
 * events) would be held there. */
static void sm_correct(struct sm_local *loc, int dev, uint32_t share, int64_t now)
{
    if (now < loc->next_tick_ns)
        return;
    loc->next_tick_ns = now + SM_TICK_NS;
    if (!sm_nvml_open(loc, now))
        return;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    unsigned long long wall_us = (unsigned long long)wall.tv_sec * 1000000ULL + (unsigned long long)wall.tv_nsec / 1000ULL;
    unsigned long long window_us = (unsigned long long)(SM_NVML_WINDOW_NS / 1000);
    /* the periods after the last ones judged by; else (none yet, or too long ago) those of the
     * last second, only to learn where a period ends: where the first of them starts is unknown */
    int synced = loc->nvml_seen_us && wall_us - loc->nvml_seen_us < (unsigned long long)(SM_NVML_KEPT_NS / 1000);
    unsigned long long since = synced ? loc->nvml_seen_us : wall_us - window_us, stamp;
    int company;
    int util = sm_nvml_util(loc, dev, since, &stamp, &company);
    if (!stamp || stamp > wall_us)
        return;                                  /* nothing recorded since */
    if (!synced) {
        loc->nvml_seen_us = stamp;
        return;
    }
    int64_t from = now - (int64_t)(wall_us - since) * 1000, to = now - (int64_t)(wall_us - stamp) * 1000;
    if (to - from < SM_NVML_JUDGED_NS)
        return;                                  /* too little yet: asked again from the same point */
    loc->nvml_seen_us = stamp;
    double measured;
    int64_t unmeasured;
    if (sm_measured_between(loc, now, from, to, &measured, &unmeasured))
        return;
    double span = (double)(to - from);
    int all_measured = unmeasured == 0;
    if (util < 0 || measured * 50 < span)        /* it ran too little then to judge by */
        return;
    double ratio = (double)util / 100.0 * span / measured;
    double target = 1.0;
    if (company == SM_WITH_FOREIGN)
        /* past its share by the driver's count: charged that much more than NVML counts */
        target = ratio * (util > (int)share ? (double)util / (double)share : 1.0);
    else if (company == SM_ALONE && all_measured)
        target = ratio;                          /* alone: nobody's turn in its events, only its own gaps */
    else if (company == SM_ALONE)
        target = loc->factor;                    /* launches went unmeasured: nothing to judge by */
    /* the same periods on both sides: nothing to smooth */
    loc->factor = target > 1.0 ? 1.0 : target < SM_FACTOR_MIN ? SM_FACTOR_MIN : target;
    /* the span says how long NVML's periods are on this GPU (whole periods, half a second or more) */
    hami_debug("SM limit: NVML %d%%, measured %.1f%% over %.2f s of its periods, company %d, charge factor %.3f",
               util, 100.0 * measured / span, span / 1e9, company, loc->factor);
}

/* `default` policy: has no other container's work been active on the device in
 * the last SM_RECENT_NS? Looked up every SM_LOOK_NS; unknown counts as no. */
static int sm_alone(struct sm_local *loc, int64_t now)
{
    if (now < loc->next_look_ns)
        return loc->alone;
    loc->next_look_ns = now + SM_LOOK_NS;
    int alone = hami_activity_others(SM_RECENT_NS) == 0;
    if (alone != loc->alone)
        hami_debug("SM limit: %s", alone ? "alone on the device: not held" : "other containers busy: held");
    loc->alone = alone;
    return alone;
}

/* ---- the primer ---- */

/* The primer of context `ctx`, loaded on first need; NULL where it cannot be had. */
static CUfunction sm_primer_of(CUcontext ctx)
{
    struct sm_primer *free_slot = NULL;
    CUfunction fn = NULL;
    pthread_mutex_lock(&sm_primer_lock);
    for (int i = 0; i < SM_PRIMER_CONTEXTS; i++) {
        if (sm_primers[i].ctx == ctx) {
            fn = sm_primers[i].fn;
            goto out;
        }
        if (!sm_primers[i].ctx && !free_slot)
            free_slot = &sm_primers[i];
    }
    if (!free_slot || !sm_drv.module_load || !sm_drv.module_function || !sm_drv.launch)
        goto out;
    CUmodule module;
    CUresult rc = sm_drv.module_load(&module, sm_primer_ptx);
    if (rc == CUDA_SUCCESS)
        rc = sm_drv.module_function(&fn, module, "empty");
    if (rc != CUDA_SUCCESS) {
        fn = NULL;
        hami_info("SM limit: the empty kernel that primes a launch near the share cannot be loaded (%d): "
                  "such launches are charged their dispatch too", (int)rc);
    } else {
        hami_debug("SM limit: the primer is loaded in context %p", (void *)ctx);
    }
    free_slot->ctx = ctx;
    free_slot->fn = fn;
out:
    pthread_mutex_unlock(&sm_primer_lock);
    return fn;
}

/* Sends the primer to `stream` ahead of a launch near the share; 1 if it went. */
static int sm_prime(CUcontext ctx, CUstream stream)
{
    CUfunction fn = sm_primer_of(ctx);
    unsigned long long no_time = 0;
    void *params[] = {&no_time};
    return fn && sm_drv.launch(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL) == CUDA_SUCCESS;
}

/* A context ended, its module with it: a later context at the same address loads its own. */
static void sm_context_gone(CUcontext ctx)
{
    pthread_mutex_lock(&sm_primer_lock);
    for (int i = 0; i < SM_PRIMER_CONTEXTS; i++)
        if (sm_primers[i].ctx == ctx)
            sm_primers[i] = (struct sm_primer){0};
    pthread_mutex_unlock(&sm_primer_lock);
}

__attribute__((constructor)) static void sm_subscribe_context_ends(void)
{
    hami_ctx_gone_subscribe(sm_context_gone);
}

/* ---- launch path ---- */

static void sm_before_slow(int dev, CUstream stream, uint8_t mode)
{
    if (mode != SM_ON && sm_decide(dev) == SM_OFF)
        return;
    const struct hami_limits *limits = hami_limits_get();
    pthread_once(&sm_once, sm_init_once);
    struct hami_sm_state *st = &hami_region_get()->sm[dev];
    struct sm_local *loc = &sm_local[dev];

    pthread_mutex_lock(&loc->lock);
    int capture_mode = hami_capture_relax();
    int billed = 1, near_share = 0;
    for (;;) {
        uint32_t share = sm_share(limits, dev);
        if (!share) {                            /* limit lifted while running */
            hami_capture_restore(capture_mode);
            pthread_mutex_unlock(&loc->lock);
            return;
        }
        int64_t now = hami_now_ns();
        if (sm_events_ok) {
            sm_harvest(loc, st, dev);
            sm_correct(loc, dev, share, now);
        }
        sm_refill(st, share, now);
        sm_refill(&loc->own, share, now);
        int window_open = sm_window_open(loc);
        /* alone, only the window applies: it bounds the work queued ahead, and
         * so how long a neighbour's arrival takes to be felt */
        int free_run = __atomic_load_n(&limits->core_policy, __ATOMIC_RELAXED) == HAMI_POLICY_DEFAULT &&
                       sm_alone(loc, now);
        int64_t shared = __atomic_load_n(&st->tokens_ns, __ATOMIC_ACQUIRE);
        int64_t own = __atomic_load_n(&loc->own.tokens_ns, __ATOMIC_ACQUIRE);
        int64_t tokens = own < shared ? own : shared;
        if ((free_run || tokens > 0) && window_open) {
            billed = !free_run;
            near_share = tokens < SM_BURST_WINDOW_NS / 200 * share;   /* under half full */
            break;
        }
        /* sleep until the deficit has refilled, or look again for a measurement */
        int short_of_share = !free_run && tokens <= 0;
        int64_t wait = short_of_share ? -tokens / share * 100 + SM_SLEEP_MIN_NS : SM_POLL_NS;
        if (!window_open && wait > SM_POLL_NS)
            wait = SM_POLL_NS;
        pthread_mutex_unlock(&loc->lock);
        /* a wait for the share (not for a measurement) is throttling; counted per
         * chunk, so a long wait shows while it lasts and a process killed in it
         * has counted what it slept */
        int64_t slept_from = short_of_share ? hami_now_ns() : 0;
        hami_sleep_ns(wait, SM_SLEEP_MIN_NS, SM_SLEEP_MAX_NS);
        if (short_of_share)
            __atomic_add_fetch(&st->throttled_ns, (uint64_t)(hami_now_ns() - slept_from), __ATOMIC_RELAXED);
        pthread_mutex_lock(&loc->lock);
    }

    int64_t estimate = billed ? loc->estimate_ns : 0;
    sm_charge(loc, st, estimate);
    int idx = sm_events_ok ? sm_probe_get(loc) : -1;
    if (idx >= 0) {
        struct sm_probe *p = &loc->probes[idx];
        int idle = loc->in_use == 0;             /* harvested just now: all earlier ones done */
        int primed = idle && billed && near_share && sm_prime(p->ctx, stream);
        /* the start event is reached once the primer is dispatched, the kernel once its own
         * dispatch follows its call's return: the gap runs from the primer's return */
        int64_t primed_at = primed ? hami_now_ns() : 0;
        if (sm_drv.event_record(p->start, stream) == CUDA_SUCCESS) {
            p->idle_since_ns = primed ? primed_at : idle ? hami_now_ns() : 0;
            p->idle_gap_ns = 0;
            p->launched_ns = hami_now_ns();
            p->state = PROBE_ARMED;
            p->charged_ns = estimate;
            p->billed = billed;
            p->primed = primed;
            loc->in_use++;
            loc->tail++;
        } else {
            /* stale events (their context is gone): make new ones next time */
            sm_drv.event_destroy(p->start);
            sm_drv.event_destroy(p->end);
            p->ctx = NULL;
            idx = -1;
        }
    }
    if (idx < 0)
        sm_attribute(loc, hami_now_ns(), 0, 1);  /* its time will be missing from what is measured */
    hami_capture_restore(capture_mode);
    /* The lock stays held through the driver's launch, until after_launch: no
     * other thread of this process can slip a launch between our events. */
    sm_armed_dev = dev;
    sm_armed_probe = idx;
    sm_armed_charge = estimate;
}

static void sm_after_slow(int dev, CUstream stream, CUresult result)
{
    if (sm_armed_dev != dev)
        return;
    int idx = sm_armed_probe;
    sm_armed_dev = -1;
    sm_armed_probe = -1;
    struct hami_region *region = hami_region_get();
    struct hami_sm_state *st = &region->sm[dev];
    struct sm_local *loc = &sm_local[dev];

    /* loc->lock is held since before_launch */
    if (idx >= 0) {
        struct sm_probe *p = &loc->probes[idx];
        int capture_mode = hami_capture_relax();
        if (result != CUDA_SUCCESS) {
            sm_charge(loc, st, -p->charged_ns);  /* nothing ran: give the estimate back */
            sm_probe_release(loc, p);
        } else {
            if (p->idle_since_ns)
                p->idle_gap_ns = hami_now_ns() - p->idle_since_ns;
            if (sm_drv.event_record(p->end, stream) == CUDA_SUCCESS)
                p->state = PROBE_FLYING;
            else
                sm_probe_release(loc, p);        /* unmeasurable: the estimate stays charged */
        }
        hami_capture_restore(capture_mode);
    } else if (result != CUDA_SUCCESS) {
        sm_charge(loc, st, -sm_armed_charge);
    }
    pthread_mutex_unlock(&loc->lock);
    if (result == CUDA_SUCCESS) {
        struct hami_proc_slot *self = hami_slot_begin();
        if (self) {
            __atomic_add_fetch(&self->launches[dev], 1, __ATOMIC_RELAXED);
            hami_slot_end();
        }
    }
}

/* OFF is never final: a device found unlimited is looked at again at each launch
 * (two loads from the mapped limits), so a share set later by hamictl update holds
 * from the next launch. ON stays ON (a lifted share makes the slow path return). */
void hami_sm_before_launch(int dev, CUstream stream)
{
    uint8_t mode = (uint32_t)dev < HAMI_MAX_DEVICES ? __atomic_load_n(&sm_mode[dev], __ATOMIC_RELAXED)
                                                    : SM_OFF;
    if (__builtin_expect(mode == SM_OFF, 1) &&
        ((uint32_t)dev >= HAMI_MAX_DEVICES || !sm_share(hami_limits_get(), dev)))
        return;
    sm_before_slow(dev, stream, mode);
}

void hami_sm_after_launch(int dev, CUstream stream, CUresult result)
{
    uint8_t mode = (uint32_t)dev < HAMI_MAX_DEVICES ? __atomic_load_n(&sm_mode[dev], __ATOMIC_RELAXED)
                                                    : SM_OFF;
    if (__builtin_expect(mode == SM_OFF, 1))
        return;
    sm_after_slow(dev, stream, result);
}
