/*
 * Driver API: stream-ordered allocation and memory pools. A pool reserves device
 * memory in 32 MiB granules (2 MiB pages when a granule no longer fits) and keeps
 * freed memory reserved: at synchronisation points it gives back what is above
 * its release threshold (default 0), and cuMemPoolTrimTo gives back on request.
 * The reservation is what the device is charged, as on the real driver.
 */
#include "sim.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define POOL_GRANULE (32 * SIM_MIB)
#define POOL_ALIGN 512

struct sim_pool {
    int dev;
    int is_default;
    int destroyed;                       /* handle gone; freed once nothing is allocated from it */
    uint64_t max_size;                   /* 0: no limit */
    uint64_t reserved, reserved_high, used, used_high, release_threshold;
    int reuse[3];                        /* the three REUSE_* flags: stored, not acted on */
    struct sim_pool *next;
};

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_pool *pools;
static struct sim_pool *default_pool[SIM_MAX_DEVICES];
static struct sim_pool *current_pool[SIM_MAX_DEVICES];  /* cuDeviceSetMemPool; NULL: the default */

static uint64_t pool_bytes(size_t size) { return sim_round_up(size, POOL_ALIGN); }

static struct sim_pool *pool_new(int dev, int is_default, uint64_t max_size)
{
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->dev = dev;
    p->is_default = is_default;
    p->max_size = max_size;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    p->next = pools;
    pools = p;
    sim_handle_put((uintptr_t)p, SIM_KIND_POOL, p);
    return p;
}

static struct sim_pool *default_pool_of(int dev)
{
    pthread_mutex_lock(&pools_lock);
    if (!default_pool[dev])
        default_pool[dev] = pool_new(dev, 1, 0);
    struct sim_pool *p = default_pool[dev];
    pthread_mutex_unlock(&pools_lock);
    return p;
}

/* Gives back reservation above max(keep, what is in use) (pools_lock held). */
static void trim_locked(struct sim_pool *p, uint64_t keep)
{
    uint64_t floor = sim_round_up(p->used, 2 * SIM_MIB);
    if (keep < floor)
        keep = floor;
    if (p->reserved > keep) {
        sim_uncharge(p->dev, p->reserved - keep);
        p->reserved = keep;
    }
}

void sim_pools_sync_trim(int dev)
{
    pthread_mutex_lock(&pools_lock);
    for (struct sim_pool *p = pools; p; p = p->next)
        if (p->dev == dev)
            trim_locked(p, p->release_threshold);
    pthread_mutex_unlock(&pools_lock);
}

void sim_pools_release_ctx(struct sim_ctx *ctx)
{
    (void)ctx;  /* stream-ordered allocations outlive their context, as on the real driver */
}

static CUresult pool_alloc(struct sim_pool *p, size_t size, struct sim_ctx *ctx, CUdeviceptr *out)
{
    if (size > sim_config()->memory_mib * SIM_MIB)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t bytes = pool_bytes(size);
    size_t mapped = sim_round_up(size, 4096);
    void *mem = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    struct sim_alloc *a = mem == MAP_FAILED ? NULL : malloc(sizeof *a);
    if (!a) {
        if (mem != MAP_FAILED)
            munmap(mem, mapped);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pools_lock);
    if (p->used + bytes > p->reserved) {
        uint64_t need = p->used + bytes - p->reserved;
        uint64_t grow = sim_round_up(need, POOL_GRANULE);
        if (p->max_size && p->reserved + grow > p->max_size)
            grow = sim_round_up(need, 2 * SIM_MIB);
        if (p->max_size && p->reserved + grow > p->max_size)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else if (sim_charge(p->dev, grow) < 0) {
            grow = sim_round_up(need, 2 * SIM_MIB);
            if (sim_charge(p->dev, grow) < 0)
                rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (rc == CUDA_SUCCESS) {
            p->reserved += grow;
            if (p->reserved > p->reserved_high)
                p->reserved_high = p->reserved;
        }
    }
    if (rc == CUDA_SUCCESS) {
        p->used += bytes;
        if (p->used > p->used_high)
            p->used_high = p->used;
    }
    pthread_mutex_unlock(&pools_lock);
    if (rc != CUDA_SUCCESS) {
        munmap(mem, mapped);
        free(a);
        return rc;
    }
    *a = (struct sim_alloc){.base = (uintptr_t)mem, .size = size, .mapped = mapped, .charged = 0,
                            .dev = p->dev, .ctx = ctx, .pool = p};
    sim_handle_put(a->base, SIM_KIND_ALLOC, a);
    *out = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

/* Gives back a destroyed pool's whole reservation and forgets it (pools_lock held). */
static void pool_unlink_locked(struct sim_pool *p)
{
    for (struct sim_pool **pp = &pools; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    p->release_threshold = 0;
    trim_locked(p, 0);
}

static void pool_return(void *arg)
{
    struct sim_alloc *a = arg;
    munmap((void *)a->base, a->mapped);
    free(a);
}

/* The freed bytes are reusable by work queued after the free at once (stream-ordered
 * reuse); the backing goes when the stream reaches the free. */
CUresult sim_pool_free(struct sim_alloc *a, struct sim_stream *s)
{
    if (!sim_handle_take(a->base, SIM_KIND_ALLOC))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_pool *p = a->pool;
    pthread_mutex_lock(&pools_lock);
    p->used -= pool_bytes(a->size);
    int gone = p->destroyed && p->used == 0;
    if (gone)
        pool_unlink_locked(p);
    pthread_mutex_unlock(&pools_lock);
    if (gone)
        free(p);
    if (s)
        sim_stream_enqueue_call(s, pool_return, a);
    else
        pool_return(a);
    return CUDA_SUCCESS;
}

/* A device's pool as pool_of(dev) finds it, for the cuDeviceGet*MemPool calls. */
static CUresult device_pool(CUmemoryPool *out, CUdevice dev, struct sim_pool *(*pool_of)(int))
{
    SIM_REQUIRE_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= sim_config()->visible)
        return CUDA_ERROR_INVALID_DEVICE;
    struct sim_pool *p = pool_of(dev);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    return device_pool(pool_out, dev, default_pool_of);
}

/* The pool cuMemAllocAsync takes from: the one set for the device, else its default. */
static struct sim_pool *current_pool_of(int dev)
{
    pthread_mutex_lock(&pools_lock);
    struct sim_pool *p = current_pool[dev];
    pthread_mutex_unlock(&pools_lock);
    return p ? p : default_pool_of(dev);
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    return device_pool(pool, dev, current_pool_of);
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    SIM_REQUIRE_INIT();
    if (dev < 0 || dev >= sim_config()->visible)
        return CUDA_ERROR_INVALID_DEVICE;
    struct sim_pool *p = sim_handle_get((uintptr_t)pool, SIM_KIND_POOL);
    if (!p || p->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_lock);
    current_pool[dev] = p->is_default ? NULL : p;
    pthread_mutex_unlock(&pools_lock);
    return CUDA_SUCCESS;
}

/* CUDA 13's forms name a location and an allocation type: a device's pinned pools are the ones
 * above; the simulator has no host or managed pools. */
static CUresult device_of_location(const CUmemLocation *location, CUmemAllocationType type, CUdevice *dev)
{
    SIM_REQUIRE_INIT();
    if (!location || (type != CU_MEM_ALLOCATION_TYPE_PINNED && type != CU_MEM_ALLOCATION_TYPE_MANAGED))
        return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE || type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return location->type == CU_MEM_LOCATION_TYPE_DEVICE || location->type == CU_MEM_LOCATION_TYPE_HOST
                   ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    *dev = location->id;
    return CUDA_SUCCESS;
}

CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, CUmemAllocationType type)
{
    CUdevice dev;
    CUresult rc = device_of_location(location, type, &dev);
    return rc != CUDA_SUCCESS ? rc : cuDeviceGetDefaultMemPool(pool_out, dev);
}

CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
    CUdevice dev;
    CUresult rc = device_of_location(location, type, &dev);
    return rc != CUDA_SUCCESS ? rc : cuDeviceGetMemPool(pool, dev);
}

CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool)
{
    CUdevice dev;
    CUresult rc = device_of_location(location, type, &dev);
    return rc != CUDA_SUCCESS ? rc : cuDeviceSetMemPool(dev, pool);
}

/* In a capture, a memory allocation node: the address the graph's allocation will have, no
 * memory taken now (it is the graph's, mapped at upload or launch). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, struct sim_pool *p, CUstream hStream)
{
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || bytesize == 0)
        return capturing ? sim_capture_refuse(s, CUDA_ERROR_INVALID_VALUE) : CUDA_ERROR_INVALID_VALUE;
    struct sim_ctx *ctx = sim_stream_ctx(s);
    if (capturing) {
        struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .bytes = bytesize,
                                  .dev = p ? p->dev : ctx->dev};
        rc = sim_capture_add(s, &d);
        if (rc == CUDA_SUCCESS)
            *dptr = d.dptr;
        return rc;
    }
    if (!p && !(p = current_pool_of(ctx->dev)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return pool_alloc(p, bytesize, ctx, dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, NULL, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return cuMemAllocAsync(dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_pool *p = sim_handle_get((uintptr_t)pool, SIM_KIND_POOL);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, p, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

static void release_plain(void *arg) { sim_alloc_release(arg); }

/* In a capture, a memory free node, which only a graph allocation may have. */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing) {
        struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE, .dptr = dptr};
        return sim_capture_add(s, &d);
    }
    struct sim_alloc *a = sim_handle_get((uintptr_t)dptr, SIM_KIND_ALLOC);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    if (a->graph)
        return sim_graph_mem_free(a->graph);
    if (!a->pool) {
        /* memory from cuMemAlloc may be freed in stream order too */
        if (!sim_handle_take(a->base, SIM_KIND_ALLOC))
            return CUDA_ERROR_INVALID_VALUE;
        sim_stream_enqueue_call(s, release_plain, a);
        return CUDA_SUCCESS;
    }
    return sim_pool_free(a, s);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return cuMemFreeAsync(dptr, hStream); }

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    SIM_REQUIRE_INIT();
    if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE || poolProps->location.id < 0 ||
        poolProps->location.id >= sim_config()->visible)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_lock);
    struct sim_pool *p = pool_new(poolProps->location.id, 0, poolProps->maxSize);
    pthread_mutex_unlock(&pools_lock);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

/* As on the real driver, a pool with allocations outstanding goes once the last is freed. */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    SIM_REQUIRE_INIT();
    struct sim_pool *p = sim_handle_get((uintptr_t)pool, SIM_KIND_POOL);
    if (!p || p->is_default || !sim_handle_take((uintptr_t)p, SIM_KIND_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_lock);
    p->destroyed = 1;
    if (current_pool[p->dev] == p)  /* the device goes back to its default pool */
        current_pool[p->dev] = NULL;
    int idle = p->used == 0;
    if (idle)
        pool_unlink_locked(p);
    pthread_mutex_unlock(&pools_lock);
    if (idle)
        free(p);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    SIM_REQUIRE_INIT();
    struct sim_pool *p = sim_handle_get((uintptr_t)pool, SIM_KIND_POOL);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pools_lock);
    trim_locked(p, minBytesToKeep);
    pthread_mutex_unlock(&pools_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_REQUIRE_INIT();
    struct sim_pool *p = sim_handle_get((uintptr_t)pool, SIM_KIND_POOL);
    if (!p || !value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pools_lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
    default: rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&pools_lock);
    return rc;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_REQUIRE_INIT();
    struct sim_pool *p = sim_handle_get((uintptr_t)pool, SIM_KIND_POOL);
    if (!p || !value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pools_lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(int *)value != 0;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = *(cuuint64_t *)value; break;
    /* the high watermarks can only be reset, to the current value */
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (*(cuuint64_t *)value) rc = CUDA_ERROR_INVALID_VALUE; else p->reserved_high = p->reserved;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(cuuint64_t *)value) rc = CUDA_ERROR_INVALID_VALUE; else p->used_high = p->used;
        break;
    default: rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&pools_lock);
    return rc;
}
