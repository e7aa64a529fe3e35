/* The container's device-memory count. Charge = add to the own slot, then sum all
 * slots; over the limit = take it back and refuse (region.h). Sequentially
 * consistent atomics: of two racing charges, at least one sees the other.
 *
 * The slots are in the region, which the container can write: each process also
 * keeps what it charged in its own memory, and is never let past the limit by
 * that count alone, whatever the region says. */
#include "internal.h"
#include "log.h"

#include <pthread.h>

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)

/* What this process charged per device: its slot as it should read. A forked
 * child starts a process of its own, with nothing charged. */
static uint64_t own_used[HAMI_MAX_DEVICES];
static pthread_once_t own_once = PTHREAD_ONCE_INIT;

/* The allocation layer's: settles its pools' charges before a charge is refused. */
static void (*before_refusal)(void);
/* The context layer's: asks the driver again what the container's processes hold. */
static void (*driver_refresh)(int dev);

/* What the driver said the container's *other* processes held on each device when this
 * process last asked (cuda_context.c reconciles every 100 ms at most). The region is
 * the container's to write: a charge is also checked against that plus this process's
 * own count, so zeroed or forged counters let no process past the limit. */
static uint64_t others_seen[HAMI_MAX_DEVICES];

static void own_forget_in_child(void)
{
    for (int d = 0; d < HAMI_MAX_DEVICES; d++)
        own_used[d] = 0;
}

static void own_once_body(void)
{
    pthread_atfork(NULL, NULL, own_forget_in_child);
}

uint64_t hami_mem_limit(int dev)
{
    const struct hami_limits *l = hami_limits_get();
    if (!l || dev < 0 || dev >= HAMI_MAX_DEVICES)
        return 0;
    return LOAD(&l->devices[dev].mem_limit);
}

int hami_mem_spill(int dev)
{
    const struct hami_limits *l = hami_limits_get();
    if (!l || dev < 0 || dev >= HAMI_MAX_DEVICES)
        return 0;
    /* only a limited device spills: the limit is what bounds the host memory it may take */
    return LOAD(&l->devices[dev].mem_limit) && (LOAD(&l->devices[dev].flags) & HAMI_DEVICE_SPILL);
}

uint64_t hami_mem_own(int dev)
{
    return dev >= 0 && dev < HAMI_MAX_DEVICES ? __atomic_load_n(&own_used[dev], __ATOMIC_SEQ_CST) : 0;
}

uint64_t hami_mem_container_used(int dev)
{
    struct hami_region *r = hami_region_get();
    if (!r || dev < 0 || dev >= HAMI_MAX_DEVICES)
        return 0;
    uint64_t sum = 0;
    int high = hami_region_procs_high(r);
    for (int i = 0; i < high; i++)
        sum += LOAD(&r->procs[i].mem_used[dev]);
    return sum;
}

int hami_mem_view(int dev, uint64_t *total, uint64_t *used, uint64_t *free)
{
    uint64_t limit = hami_mem_limit(dev);
    if (!limit)
        return 0;
    /* oversubscribed, the card is the limit: physical size and free no longer bound it */
    int spills = hami_mem_spill(dev);
    uint64_t cap = spills || limit < *total ? limit : *total;
    uint64_t mine = hami_mem_container_used(dev);
    if (mine > cap)
        mine = cap;  /* a limit forced below use: nothing underflows */
    *total = cap;
    if (used)
        *used = mine;
    if (free && (spills || cap - mine < *free))
        *free = cap - mine;
    return 1;
}

/* 0 when charged (or there is no slot to charge: the process is not limited, or is exiting). */
static int try_charge(int dev, uint64_t bytes, uint64_t limit)
{
    struct hami_proc_slot *self = hami_slot_begin();
    if (!self)
        return 0;
    pthread_once(&own_once, own_once_body);
    int rc = 0;
    uint64_t own = __atomic_add_fetch(&own_used[dev], bytes, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&self->mem_used[dev], bytes, __ATOMIC_SEQ_CST);
    uint64_t others = __atomic_load_n(&others_seen[dev], __ATOMIC_RELAXED);
    if (limit && (own > limit || others + own > limit || hami_mem_container_used(dev) > limit)) {
        __atomic_fetch_sub(&self->mem_used[dev], bytes, __ATOMIC_SEQ_CST);
        __atomic_fetch_sub(&own_used[dev], bytes, __ATOMIC_SEQ_CST);
        rc = -1;
    }
    hami_slot_end();
    return rc;
}

void hami_mem_before_refusal(void (*settle)(void))
{
    __atomic_store_n(&before_refusal, settle, __ATOMIC_RELEASE);
}

void hami_mem_driver_refresh(void (*refresh)(int dev))
{
    __atomic_store_n(&driver_refresh, refresh, __ATOMIC_RELEASE);
}

void hami_mem_others_seen(int dev, uint64_t bytes)
{
    static int disagreeing[HAMI_MAX_DEVICES];   /* said once per episode, not at every look */
    if (dev < 0 || dev >= HAMI_MAX_DEVICES)
        return;
    __atomic_store_n(&others_seen[dev], bytes, __ATOMIC_RELAXED);
    uint64_t all = hami_mem_container_used(dev), own = hami_mem_own(dev);
    uint64_t counted = all > own ? all - own : 0;
    int disagrees = bytes > counted + (64ull << 20);   /* well past what reconciliation lags by */
    if (disagrees && !__atomic_exchange_n(&disagreeing[dev], 1, __ATOMIC_RELAXED))
        hami_error("device %d: the driver shows the container's other processes holding %llu MiB, its "
                   "counters %llu MiB: the region was written; the driver's figure holds", dev,
                   (unsigned long long)(bytes >> 20), (unsigned long long)(counted >> 20));
    else if (!disagrees)
        __atomic_store_n(&disagreeing[dev], 0, __ATOMIC_RELAXED);
}

int hami_mem_charge(int dev, uint64_t bytes)
{
    if (dev < 0 || dev >= HAMI_MAX_DEVICES || bytes == 0)
        return 0;
    uint64_t limit = hami_mem_limit(dev);
    if (!limit)
        return try_charge(dev, bytes, 0);
    if (bytes <= limit) {
        if (try_charge(dev, bytes, limit) == 0)
            return 0;
        /* Before refusing: give back what exited processes and released pool memory held,
         * and ask the driver again what the others hold now. */
        hami_region_reclaim_dead();
        void (*settle)(void) = __atomic_load_n(&before_refusal, __ATOMIC_ACQUIRE);
        if (settle)
            settle();
        void (*refresh)(int) = __atomic_load_n(&driver_refresh, __ATOMIC_ACQUIRE);
        if (refresh)
            refresh(dev);
        if (try_charge(dev, bytes, limit) == 0)
            return 0;
    }
    hami_info("device %d: %llu bytes refused (limit %llu, in use %llu, the driver shows others %llu)", dev,
              (unsigned long long)bytes, (unsigned long long)limit,
              (unsigned long long)hami_mem_container_used(dev),
              (unsigned long long)__atomic_load_n(&others_seen[dev], __ATOMIC_RELAXED));
    return -1;
}

void hami_mem_charge_force(int dev, uint64_t bytes)
{
    if (dev >= 0 && dev < HAMI_MAX_DEVICES && bytes)
        try_charge(dev, bytes, 0);
}

static void sub_clamped(uint64_t *counter, uint64_t bytes)
{
    uint64_t cur = LOAD(counter);
    while (!__atomic_compare_exchange_n(counter, &cur, cur > bytes ? cur - bytes : 0, 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
}

void hami_mem_uncharge(int dev, uint64_t bytes)
{
    if (dev < 0 || dev >= HAMI_MAX_DEVICES || !bytes)
        return;
    struct hami_proc_slot *self = hami_slot_begin();
    if (self) {
        sub_clamped(&self->mem_used[dev], bytes);
        sub_clamped(&own_used[dev], bytes);
        hami_slot_end();
    }
}

void hami_ctx_charged(int dev, int64_t delta)
{
    if (dev < 0 || dev >= HAMI_MAX_DEVICES || !delta)
        return;
    struct hami_proc_slot *self = hami_slot_begin();
    if (!self)
        return;
    if (delta > 0)
        __atomic_fetch_add(&self->ctx_used[dev], (uint64_t)delta, __ATOMIC_SEQ_CST);
    else
        sub_clamped(&self->ctx_used[dev], (uint64_t)-delta);
    hami_slot_end();
}

static void give_back(const struct hami_res *res)
{
    if (res->kind != HAMI_RES_ASYNC && res->kind != HAMI_RES_CTX)
        hami_mem_uncharge(res->dev, res->bytes);
}

void hami_mem_release_ctx(CUcontext ctx)
{
    hami_res_take_ctx(ctx, give_back);
}
