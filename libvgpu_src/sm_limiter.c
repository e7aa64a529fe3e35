/*
 * SM share limiter: a token bucket of device busy time per device, shared by
 * every process of the container through the region (struct hami_sm_state),
 * and charged with each launch's MEASURED device time.
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
 * - At most SM_WINDOW measured launches per process and device may be in
 *   flight: a process cannot run further ahead of its measurements than that.
 * - Everything shared is updated with atomics; no lock spans processes, so a
 *   process killed at any instant leaves at most one estimate charged.
 *
 * No thread is started and no signal is used. A forked child starts with an
 * empty local state (pthread_atfork child handler): the parent's events belong
 * to contexts the child cannot use.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "log.h"
#include "sm_limiter.h"

#define SM_WINDOW 4                              /* measured launches in flight, per process and device */
#define SM_BURST_WINDOW_NS 50000000LL            /* tokens kept at most: share x 50 ms */
#define SM_SLEEP_MIN_NS 20000LL
#define SM_SLEEP_MAX_NS 10000000LL
#define SM_POLL_NS 200000LL                      /* window full: look again after 0.2 ms */

enum { SM_UNKNOWN = 0, SM_OFF = 1, SM_ON = 2 };
enum { PROBE_FREE = 0, PROBE_ARMED, PROBE_FLYING };

/* One measured launch: events around it and the estimate charged for it. */
struct sm_probe {
    CUevent start, end;
    CUcontext ctx;                               /* context the events were created in */
    int64_t charged_ns;
    int state;
};

struct sm_local {
    pthread_mutex_t lock;
    struct sm_probe probes[SM_WINDOW];
    int in_use;                                  /* probes not FREE */
    int64_t estimate_ns;                         /* running mean of measured launches */
};

struct sm_driver {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_destroy)(CUevent);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
};

/* Decided once per process and device: the hot path reads one byte. */
static uint8_t sm_mode[HAMI_MAX_DEVICES];
static struct sm_local sm_local[HAMI_MAX_DEVICES];
static struct sm_driver sm_drv;
static pthread_once_t sm_once = PTHREAD_ONCE_INIT;
static int sm_ready;                             /* driver entry points found */

/* The probe armed by this thread's before_launch, for its after_launch. */
static __thread int sm_armed_dev = -1;
static __thread int sm_armed_probe = -1;
static __thread int64_t sm_armed_charge;

static int64_t sm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sm_local_reset(void)
{
    for (int d = 0; d < HAMI_MAX_DEVICES; d++) {
        memset(&sm_local[d], 0, sizeof(sm_local[d]));
        pthread_mutex_init(&sm_local[d].lock, NULL);
    }
}

/* In a forked child the parent's events are unusable and a lock may have been
 * held by a thread that does not exist there: start over. */
static void sm_after_fork_child(void)
{
    sm_local_reset();
    sm_armed_dev = -1;
    sm_armed_probe = -1;
}

static void sm_init_once(void)
{
    sm_local_reset();
    sm_drv.ctx_get_current = (CUresult(*)(CUcontext *))hami_driver_symbol("cuCtxGetCurrent");
    sm_drv.event_create = (CUresult(*)(CUevent *, unsigned int))hami_driver_symbol("cuEventCreate");
    sm_drv.event_destroy = (CUresult(*)(CUevent))hami_driver_symbol("cuEventDestroy_v2");
    sm_drv.event_record = (CUresult(*)(CUevent, CUstream))hami_driver_symbol("cuEventRecord");
    sm_drv.event_query = (CUresult(*)(CUevent))hami_driver_symbol("cuEventQuery");
    sm_drv.event_elapsed =
        (CUresult(*)(float *, CUevent, CUevent))hami_driver_symbol("cuEventElapsedTime");
    sm_ready = sm_drv.ctx_get_current && sm_drv.event_create && sm_drv.event_destroy &&
               sm_drv.event_record && sm_drv.event_query && sm_drv.event_elapsed;
    if (!sm_ready)
        hami_error("SM limit: driver event functions missing; launches are charged by estimate only");
    pthread_atfork(NULL, NULL, sm_after_fork_child);
}

/* The share (percent) that applies to `dev` now, 0 when none. */
static uint32_t sm_share(struct hami_region *region, int dev)
{
    if (!region || (uint32_t)dev >= region->device_count || region->core_policy == HAMI_POLICY_DISABLE)
        return 0;
    uint32_t limit = __atomic_load_n(&region->devices[dev].sm_limit, __ATOMIC_RELAXED);
    return (limit == 0 || limit >= 100) ? 0 : limit;
}

static uint8_t sm_decide(int dev)
{
    uint32_t share = sm_share(hami_region_get(), dev);
    uint8_t mode = share ? SM_ON : SM_OFF;
    if (share)
        hami_info("SM limit on device %d: %u%%", dev, share);
    __atomic_store_n(&sm_mode[dev], mode, __ATOMIC_RELAXED);
    return mode;
}

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

static void sm_charge(struct hami_sm_state *st, int64_t ns)
{
    if (ns)
        __atomic_sub_fetch(&st->tokens_ns, ns, __ATOMIC_ACQ_REL);
}

static void sm_probe_release(struct sm_local *loc, struct sm_probe *p)
{
    p->state = PROBE_FREE;
    loc->in_use--;
}

/* Collects every finished measurement of this process on `dev` (never waits). */
static void sm_harvest(struct sm_local *loc, struct hami_sm_state *st, int dev)
{
    for (int i = 0; i < SM_WINDOW; i++) {
        struct sm_probe *p = &loc->probes[i];
        if (p->state != PROBE_FLYING)
            continue;
        CUresult r = sm_drv.event_query(p->end);
        if (r == CUDA_ERROR_NOT_READY)
            continue;
        float ms = 0;
        if (r == CUDA_SUCCESS && sm_drv.event_elapsed(&ms, p->start, p->end) == CUDA_SUCCESS && ms >= 0) {
            int64_t ns = (int64_t)((double)ms * 1e6);
            sm_charge(st, ns - p->charged_ns);
            __atomic_add_fetch(&st->busy_ns, (uint64_t)ns, __ATOMIC_RELAXED);
            struct hami_proc_slot *self = hami_region_self();
            if (self)
                __atomic_add_fetch(&self->sm_busy_ns[dev], (uint64_t)ns, __ATOMIC_RELAXED);
            loc->estimate_ns += (ns - loc->estimate_ns) / 4;
        }
        /* A failed query (context gone) keeps the estimate as the charge. */
        sm_probe_release(loc, p);
    }
}

/* A free probe whose events live in the current context, or -1. */
static int sm_probe_get(struct sm_local *loc)
{
    CUcontext ctx = NULL;
    if (sm_drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
        return -1;
    for (int i = 0; i < SM_WINDOW; i++) {
        struct sm_probe *p = &loc->probes[i];
        if (p->state != PROBE_FREE)
            continue;
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
        return i;
    }
    return -1;
}

static void sm_sleep(int64_t ns)
{
    if (ns < SM_SLEEP_MIN_NS)
        ns = SM_SLEEP_MIN_NS;
    if (ns > SM_SLEEP_MAX_NS)
        ns = SM_SLEEP_MAX_NS;
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

static void sm_before_slow(int dev, CUstream stream, uint8_t mode)
{
    if (mode == SM_UNKNOWN && sm_decide(dev) == SM_OFF)
        return;
    struct hami_region *region = hami_region_get();
    pthread_once(&sm_once, sm_init_once);
    struct hami_sm_state *st = &region->sm[dev];
    struct sm_local *loc = &sm_local[dev];

    pthread_mutex_lock(&loc->lock);
    for (;;) {
        uint32_t share = sm_share(region, dev);
        if (!share) {                            /* limit lifted while running */
            pthread_mutex_unlock(&loc->lock);
            return;
        }
        if (sm_ready)
            sm_harvest(loc, st, dev);
        int64_t now = sm_now_ns();
        sm_refill(st, share, now);
        int64_t tokens = __atomic_load_n(&st->tokens_ns, __ATOMIC_ACQUIRE);
        int window_full = sm_ready && loc->in_use >= SM_WINDOW;
        if (tokens > 0 && !window_full)
            break;
        /* Sleep until the deficit has refilled (or a measurement may be in). */
        int64_t wait = tokens > 0 ? SM_POLL_NS : -tokens / share * 100 + SM_SLEEP_MIN_NS;
        if (window_full && wait > SM_POLL_NS)
            wait = SM_POLL_NS;
        pthread_mutex_unlock(&loc->lock);
        sm_sleep(wait);
        pthread_mutex_lock(&loc->lock);
    }

    int64_t estimate = loc->estimate_ns;
    sm_charge(st, estimate);
    int idx = sm_ready ? sm_probe_get(loc) : -1;
    if (idx >= 0) {
        struct sm_probe *p = &loc->probes[idx];
        if (sm_drv.event_record(p->start, stream) == CUDA_SUCCESS) {
            p->state = PROBE_ARMED;
            p->charged_ns = estimate;
            loc->in_use++;
        } else {
            idx = -1;
        }
    }
    pthread_mutex_unlock(&loc->lock);
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

    pthread_mutex_lock(&loc->lock);
    if (idx >= 0) {
        struct sm_probe *p = &loc->probes[idx];
        if (result != CUDA_SUCCESS) {
            sm_charge(st, -p->charged_ns);       /* nothing ran: give the estimate back */
            sm_probe_release(loc, p);
        } else if (sm_drv.event_record(p->end, stream) == CUDA_SUCCESS) {
            p->state = PROBE_FLYING;
        } else {
            sm_probe_release(loc, p);            /* unmeasurable: the estimate stays charged */
        }
    } else if (result != CUDA_SUCCESS) {
        sm_charge(st, -sm_armed_charge);
    }
    pthread_mutex_unlock(&loc->lock);
    if (result == CUDA_SUCCESS) {
        struct hami_proc_slot *self = hami_region_self();
        if (self)
            __atomic_add_fetch(&self->launches[dev], 1, __ATOMIC_RELAXED);
    }
}

void hami_sm_before_launch(int dev, CUstream stream)
{
    uint8_t mode = (uint32_t)dev < HAMI_MAX_DEVICES ? __atomic_load_n(&sm_mode[dev], __ATOMIC_RELAXED)
                                                    : SM_OFF;
    if (__builtin_expect(mode == SM_OFF, 1))
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
