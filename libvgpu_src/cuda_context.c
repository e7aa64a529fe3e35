/* Contexts take device memory. Their size is measured: the device's free memory
 * (NVML, which needs no context) before and after the driver creates one. A
 * context the limit cannot hold is destroyed again and refused. */
#include "internal.h"
#include "activity.h"
#include "hooks.h"
#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define UNKNOWN UINT64_MAX

/* One creation or destruction at a time in this process, so that a measurement
 * sees only its own context appear (other processes may still move it). */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    CUcontext ctx;
    uint64_t bytes;
    int index;
    int charged;
} primary[HAMI_MAX_ORDINALS];

/* Hooked so that a process libvgpu refuses (hooks.h) never initialises the driver:
 * every entry point it does not hook then answers "not initialised". */
HAMI_HOOK(CUresult, cuInit, (unsigned int Flags), (Flags))
{
    return real(Flags);
}

int hami_current_device_index(CUdevice *dev_out)
{
    if (!hami_region_get())
        return -1;
    CUresult (*get_device)(CUdevice *) = HAMI_DRIVER(cuCtxGetDevice);
    CUdevice dev;
    if (!get_device || get_device(&dev) != CUDA_SUCCESS)
        return -1;
    if (dev_out)
        *dev_out = dev;
    return hami_region_device_index(dev);
}

#define MAX_SEEN 256

/* What the device looks like around a context's creation: its free memory and
 * every process's usage (the driver's own per-process count). */
struct snapshot {
    uint64_t free;
    unsigned int count;
    nvmlProcessInfo_t procs[MAX_SEEN];
};

static void take_snapshot(nvmlDevice_t handle, struct snapshot *snap)
{
    snap->free = UNKNOWN;
    snap->count = 0;
    if (!handle)
        return;
    nvmlMemory_t mem;
    __typeof__(&nvmlDeviceGetMemoryInfo) info = HAMI_REAL(nvmlDeviceGetMemoryInfo);
    if (info && info(handle, &mem) == NVML_SUCCESS)
        snap->free = mem.free;
    __typeof__(&nvmlDeviceGetComputeRunningProcesses_v3) list =
        HAMI_REAL(nvmlDeviceGetComputeRunningProcesses_v3);
    if (!list)
        list = HAMI_REAL(nvmlDeviceGetComputeRunningProcesses_v2);
    unsigned int count = MAX_SEEN;
    if (list && list(handle, &count, snap->procs) == NVML_SUCCESS)
        snap->count = count;
}

/* NVML's "not available" (no per-process accounting, e.g. some virtualised setups). */
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFull

static const nvmlProcessInfo_t *find_pid(const struct snapshot *snap, unsigned int pid)
{
    for (unsigned int i = 0; pid && i < snap->count; i++)
        if (snap->procs[i].pid == pid && snap->procs[i].usedGpuMemory != NVML_VALUE_NOT_AVAILABLE_ULL)
            return &snap->procs[i];
    return NULL;
}

static unsigned int host_pid;   /* this process as the driver names it, once known */

unsigned int hami_host_pid(void)
{
    return __atomic_load_n(&host_pid, __ATOMIC_RELAXED);
}

/* The context's size: this process's growth in the driver's per-process count
 * (found by pid, or as the one process that appeared); else the device's free
 * memory drop, which other containers' activity can blur. */
static uint64_t measured(const struct snapshot *before, const struct snapshot *after)
{
    unsigned int pids[2] = {host_pid, (unsigned int)getpid()};
    for (int i = 0; i < 2; i++) {
        const nvmlProcessInfo_t *now = find_pid(after, pids[i]);
        if (now) {
            const nvmlProcessInfo_t *then = find_pid(before, pids[i]);
            uint64_t was = then ? then->usedGpuMemory : 0;
            return now->usedGpuMemory > was ? now->usedGpuMemory - was : 0;
        }
    }
    const nvmlProcessInfo_t *appeared = NULL;
    int appeared_count = 0;
    for (unsigned int i = 0; i < after->count; i++) {
        if (!find_pid(before, after->procs[i].pid)) {
            appeared = &after->procs[i];
            appeared_count++;
        }
    }
    if (appeared_count == 1 && appeared->usedGpuMemory != NVML_VALUE_NOT_AVAILABLE_ULL) {
        __atomic_store_n(&host_pid, appeared->pid, __ATOMIC_RELAXED);
        struct hami_proc_slot *self = hami_slot_begin();
        if (self) {
            if (!__atomic_load_n(&self->host_pid, __ATOMIC_RELAXED))
                __atomic_store_n(&self->host_pid, (int32_t)host_pid, __ATOMIC_RELAXED);
            hami_slot_end();
        }
        hami_debug("the driver knows this process as pid %u", host_pid);
        return appeared->usedGpuMemory;
    }
    return before->free != UNKNOWN && after->free != UNKNOWN && before->free > after->free
               ? before->free - after->free
               : 0;
}

/* What the driver shows the container's other processes holding: every process but
 * this one (`mine`) whose pid a live slot of the region names. */
static uint64_t others_held(const struct snapshot *snap, const nvmlProcessInfo_t *mine)
{
    uint64_t held = 0;
    for (unsigned int i = 0; i < snap->count; i++) {
        const nvmlProcessInfo_t *p = &snap->procs[i];
        if (p != mine && p->pid != (unsigned int)getpid() && p->usedGpuMemory != NVML_VALUE_NOT_AVAILABLE_ULL &&
            hami_region_has_pid(p->pid))
            held += p->usedGpuMemory;
    }
    return held;
}

/* ---- what the driver allocated on its own ---- */

#define RECONCILE_EVERY_NS 100000000ull

static uint64_t growth[HAMI_MAX_DEVICES];      /* charged by reconciliation, per device */
static uint64_t reconciled_ns[HAMI_MAX_DEVICES];
static CUdevice reconciled_dev[HAMI_MAX_DEVICES];  /* the CUDA device of each region index + 1 (0: not seen) */
static pthread_mutex_t reconcile_lock = PTHREAD_MUTEX_INITIALIZER;

/* The driver's per-process count is the truth: what it holds for this process beyond
 * what the hooks charged (a context growing as modules load, graph memory, anything
 * reached past the hooks, e.g. through RTLD_DEEPBIND) is charged as context memory,
 * and given back when it shrinks. Estimated low, never high: the hooks charge before
 * the driver allocates and give back after it frees, and the larger of two readings of
 * our count around the driver's is used. At most every 100 ms per device, never during
 * a context creation (whose memory the driver already shows but we have yet to charge).
 * Managed memory the hooks charged (cuMemAllocManaged, spilled allocations) is in our
 * count: a driver that shows its resident pages per process is not charged for them
 * twice, and one that shows device memory only (the simulator) just lowers the estimate. */
void hami_reconcile(int index, CUdevice dev)
{
    if (!hami_region_self() || index < 0 || index >= HAMI_MAX_DEVICES || !hami_mem_limit(index))
        return;
    uint64_t now = (uint64_t)hami_now_ns();
    if (now - __atomic_load_n(&reconciled_ns[index], __ATOMIC_RELAXED) < RECONCILE_EVERY_NS)
        return;
    if (pthread_mutex_trylock(&ctx_lock) != 0)
        return;
    if (pthread_mutex_trylock(&reconcile_lock) != 0) {
        pthread_mutex_unlock(&ctx_lock);
        return;
    }
    __atomic_store_n(&reconciled_ns[index], now, __ATOMIC_RELAXED);
    __atomic_store_n(&reconciled_dev[index], dev + 1, __ATOMIC_RELAXED);
    static struct snapshot snap;   /* under reconcile_lock */
    uint64_t ours = hami_mem_own(index);
    take_snapshot(hami_nvml_device(dev), &snap);
    uint64_t ours_after = hami_mem_own(index);
    if (ours_after > ours)
        ours = ours_after;
    const nvmlProcessInfo_t *mine = find_pid(&snap, host_pid);
    if (!mine)
        mine = find_pid(&snap, (unsigned int)getpid());
    if (mine) {
        uint64_t hooked = ours > growth[index] ? ours - growth[index] : 0;
        uint64_t target = mine->usedGpuMemory > hooked ? mine->usedGpuMemory - hooked : 0;
        if (target > growth[index]) {
            hami_mem_charge_force(index, target - growth[index]);
            hami_ctx_charged(index, (int64_t)(target - growth[index]));
            hami_info("device %d: %llu bytes the driver holds past the hooks, now charged", index,
                      (unsigned long long)target);
        } else if (target < growth[index]) {
            hami_mem_uncharge(index, growth[index] - target);
            hami_ctx_charged(index, -(int64_t)(growth[index] - target));
        }
        growth[index] = target;
    }
    hami_mem_others_seen(index, others_held(&snap, mine));
    pthread_mutex_unlock(&reconcile_lock);
    pthread_mutex_unlock(&ctx_lock);
}

/* Before a charge is refused: the driver asked again at once. */
static void reconcile_now(int index)
{
    CUdevice dev = (CUdevice)__atomic_load_n(&reconciled_dev[index], __ATOMIC_RELAXED) - 1;
    if (dev < 0)
        return;
    __atomic_store_n(&reconciled_ns[index], 0, __ATOMIC_RELAXED);
    hami_reconcile(index, dev);
}

__attribute__((constructor)) static void register_driver_refresh(void)
{
    hami_mem_driver_refresh(reconcile_now);
}

static void (*ctx_gone)(CUcontext);

void hami_ctx_gone_subscribe(void (*gone)(CUcontext ctx))
{
    ctx_gone = gone;
}

/* A context ended: what it held is given back, and its end is told. */
static void context_ended(CUcontext ctx)
{
    hami_mem_release_ctx(ctx);
    if (ctx_gone)
        ctx_gone(ctx);
}

/* ---- primary contexts ---- */

static void drop_primary(CUdevice dev)
{
    if (dev < 0 || dev >= HAMI_MAX_ORDINALS || !primary[dev].charged)
        return;
    context_ended(primary[dev].ctx);
    hami_mem_uncharge(primary[dev].index, primary[dev].bytes);
    hami_ctx_charged(primary[dev].index, -(int64_t)primary[dev].bytes);
    primary[dev].charged = 0;
    primary[dev].ctx = NULL;
}

/* One measured creation: the process's ctx_lock, the container's region lock, the
 * GPU's lock among containers (activity.h; in this order), and the device seen before. */
struct creation {
    int index;
    int region_fd, gpu_fd;
    nvmlDevice_t handle;
    struct snapshot before;
};

static void creation_begin(struct creation *c, CUdevice dev, int index)
{
    c->index = index;
    pthread_mutex_lock(&ctx_lock);
    c->region_fd = c->gpu_fd = -1;
    c->handle = NULL;
    if (index >= 0) {
        /* NVML's start (its init and first device access: ~17 ms on an H200) is this
         * process's own: before the locks other processes wait on, or they start one by one. */
        c->handle = hami_nvml_device(dev);
        c->region_fd = hami_region_lock();
        c->gpu_fd = hami_activity_lock(dev);
        take_snapshot(c->handle, &c->before);
    }
}

/* The size of what was created (0 when nothing is measured). */
static uint64_t creation_size(struct creation *c)
{
    struct snapshot after;
    take_snapshot(c->handle, &after);
    return measured(&c->before, &after);
}

static void creation_end(struct creation *c)
{
    hami_unlock(c->gpu_fd);
    hami_unlock(c->region_fd);
    pthread_mutex_unlock(&ctx_lock);
}

HAMI_HOOK(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev), (pctx, dev))
{
    int index = hami_region_device_index(dev);
    if (index < 0 || dev >= HAMI_MAX_ORDINALS)
        return real(pctx, dev);
    struct creation c;
    pthread_mutex_lock(&ctx_lock);
    int fresh = !primary[dev].charged;
    pthread_mutex_unlock(&ctx_lock);
    creation_begin(&c, dev, fresh && !primary[dev].charged ? index : -1);
    CUresult rc = real(pctx, dev);
    if (rc == CUDA_SUCCESS && c.index >= 0 && pctx && !primary[dev].charged) {
        uint64_t bytes = creation_size(&c);
        if (hami_mem_charge(index, bytes) < 0) {
            __typeof__(&cuDevicePrimaryCtxRelease_v2) release = HAMI_REAL(cuDevicePrimaryCtxRelease_v2);
            if (release)
                release(dev);
            *pctx = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            hami_ctx_charged(index, (int64_t)bytes);
            primary[dev].ctx = *pctx;
            primary[dev].bytes = bytes;
            primary[dev].index = index;
            primary[dev].charged = 1;
            hami_debug("device %d: primary context takes %llu bytes", dev, (unsigned long long)bytes);
        }
    }
    creation_end(&c);
    return rc;
}

/* Whether dev's charged primary context has just lost its last retain. */
static int primary_gone(CUdevice dev)
{
    if (dev < 0 || dev >= HAMI_MAX_ORDINALS || !primary[dev].charged)
        return 0;
    unsigned int flags = 0;
    int active = 1;
    CUresult (*state)(CUdevice, unsigned int *, int *) = HAMI_DRIVER(cuDevicePrimaryCtxGetState);
    return state && state(dev, &flags, &active) == CUDA_SUCCESS && !active;
}

/* Release or reset of a primary context: a reset always destroys it, so its
 * charge goes; a release only when that was the last retain. */
static CUresult primary_put(CUresult (*real)(CUdevice), CUdevice dev, int reset)
{
    pthread_mutex_lock(&ctx_lock);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS && (reset || primary_gone(dev)))
        drop_primary(dev);
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}

HAMI_HOOK(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))
{
    return primary_put(real, dev, 0);
}

HAMI_HOOK(CUresult, cuDevicePrimaryCtxRelease, (CUdevice dev), (dev))
{
    return primary_put(real, dev, 0);
}

HAMI_HOOK(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev))
{
    return primary_put(real, dev, 1);
}

HAMI_HOOK(CUresult, cuDevicePrimaryCtxReset, (CUdevice dev), (dev))
{
    return primary_put(real, dev, 1);
}

/* ---- created contexts ---- */

static CUresult created(struct creation *c, CUresult rc, CUcontext *pctx)
{
    if (rc == CUDA_SUCCESS && c->index >= 0 && pctx && *pctx) {
        uint64_t bytes = creation_size(c);
        if (hami_mem_charge(c->index, bytes) < 0) {
            __typeof__(&cuCtxDestroy_v2) destroy = HAMI_REAL(cuCtxDestroy_v2);
            if (destroy)
                destroy(*pctx);
            *pctx = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            hami_ctx_charged(c->index, (int64_t)bytes);
            struct hami_res res = {.key = (uint64_t)(uintptr_t)*pctx, .kind = HAMI_RES_CTX,
                                   .dev = c->index, .bytes = bytes};
            hami_res_put(&res);
        }
    }
    creation_end(c);
    return rc;
}

HAMI_HOOK(CUresult, cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev),
          (pctx, flags, dev))
{
    struct creation c;
    creation_begin(&c, dev, hami_region_device_index(dev));
    return created(&c, real(pctx, flags, dev), pctx);
}

HAMI_HOOK(CUresult, cuCtxCreate_v3,
          (CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
           CUdevice dev),
          (pctx, paramsArray, numParams, flags, dev))
{
    struct creation c;
    creation_begin(&c, dev, hami_region_device_index(dev));
    return created(&c, real(pctx, paramsArray, numParams, flags, dev), pctx);
}

HAMI_HOOK(CUresult, cuCtxCreate_v4,
          (CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev),
          (pctx, ctxCreateParams, flags, dev))
{
    struct creation c;
    creation_begin(&c, dev, hami_region_device_index(dev));
    return created(&c, real(pctx, ctxCreateParams, flags, dev), pctx);
}

HAMI_HOOK(CUresult, cuCtxDestroy_v2, (CUcontext ctx), (ctx))
{
    pthread_mutex_lock(&ctx_lock);
    CUresult rc = real(ctx);
    if (rc == CUDA_SUCCESS) {
        struct hami_res res;
        if (hami_res_take(HAMI_RES_CTX, (uint64_t)(uintptr_t)ctx, &res) == 0) {
            hami_mem_uncharge(res.dev, res.bytes);
            hami_ctx_charged(res.dev, -(int64_t)res.bytes);
        }
        context_ended(ctx);
    }
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}
