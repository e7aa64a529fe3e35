/* Device-memory hooks: every path that takes device memory is charged before the
 * driver is asked (so the check is atomic across the container), settled to what
 * the driver really took, and given back on free. Untracked handles go to the
 * driver unchanged. Also the virtualised views (cuMemGetInfo, cuDeviceTotalMem). */
#include "internal.h"
#include "hooks.h"
#include "capture.h"
#include "log.h"

#include <pthread.h>
#include <stdlib.h>

#define PITCH_ALIGN 512ull

static int current_index(CUcontext *ctx)
{
    CUdevice dev = 0;
    int index = hami_current_device_index(&dev);
    if (index >= 0)
        hami_reconcile(index, dev);
    CUresult (*get_ctx)(CUcontext *) = HAMI_DRIVER(cuCtxGetCurrent);
    *ctx = NULL;
    if (index >= 0 && get_ctx)
        get_ctx(ctx);
    return index;
}

static void track(int kind, uint64_t key, int index, uint64_t bytes, CUcontext ctx, void *aux)
{
    struct hami_res res = {.key = key, .kind = kind, .dev = index, .bytes = bytes, .ctx = ctx,
                           .aux = aux};
    hami_res_put(&res);
}

/* ---- plain, managed, pitch ---- */

/* Oversubscription (HAMI_DEVICE_SPILL): a plain allocation the container's limit let
 * through but the card cannot hold now (the driver says out of memory) is served from
 * managed memory, which the driver pages between the card and the host. It stays
 * charged as it is, so the limit is exact either way. */
static CUresult spill(int index, CUresult rc, CUdeviceptr *dptr, size_t bytes)
{
    if (rc != CUDA_ERROR_OUT_OF_MEMORY || !hami_mem_spill(index))
        return rc;
    __typeof__(&cuMemAllocManaged) managed = HAMI_REAL(cuMemAllocManaged);
    if (!managed || managed(dptr, bytes, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS)
        return rc;
    hami_info("device %d: %zu bytes the card cannot hold now served from managed memory", index,
              bytes);
    return CUDA_SUCCESS;
}

HAMI_HOOK(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize), (dptr, bytesize))
{
    CUcontext ctx;
    int index = current_index(&ctx);
    if (index < 0 || !dptr || bytesize == 0)
        return real(dptr, bytesize);
    uint64_t charge = hami_pages(bytesize);
    if (hami_mem_charge(index, charge) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = spill(index, real(dptr, bytesize), dptr, bytesize);
    if (rc == CUDA_SUCCESS)
        track(HAMI_RES_MEM, *dptr, index, charge, ctx, NULL);
    else
        hami_mem_uncharge(index, charge);
    return rc;
}

HAMI_HOOK(CUresult, cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags),
          (dptr, bytesize, flags))
{
    CUcontext ctx;
    int index = current_index(&ctx);
    if (index < 0 || !dptr || bytesize == 0)
        return real(dptr, bytesize, flags);
    uint64_t charge = hami_pages(bytesize);
    if (hami_mem_charge(index, charge) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(dptr, bytesize, flags);
    if (rc == CUDA_SUCCESS)
        track(HAMI_RES_MEM, *dptr, index, charge, ctx, NULL);
    else
        hami_mem_uncharge(index, charge);
    return rc;
}

HAMI_HOOK(CUresult, cuMemAllocPitch_v2,
          (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
           unsigned int ElementSizeBytes),
          (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))
{
    CUcontext ctx;
    int index = current_index(&ctx);
    uint64_t row = (WidthInBytes + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (index < 0 || !dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        row < WidthInBytes)
        return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (Height > UINT64_MAX / row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t charge = hami_pages(row * Height);
    if (hami_mem_charge(index, charge) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        /* spilled rows keep the pitch the charge assumed */
        rc = spill(index, rc, dptr, row * Height);
        if (rc == CUDA_SUCCESS)
            *pPitch = row;
    }
    if (rc != CUDA_SUCCESS) {
        hami_mem_uncharge(index, charge);
        return rc;
    }
    /* Settle to the pitch the driver chose. */
    uint64_t actual = hami_pages((uint64_t)*pPitch * Height);
    if (actual > charge && hami_mem_charge(index, actual - charge) < 0) {
        __typeof__(&cuMemFree_v2) release = HAMI_REAL(cuMemFree_v2);
        if (release)
            release(*dptr);
        hami_mem_uncharge(index, charge);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < charge)
        hami_mem_uncharge(index, charge - actual);
    track(HAMI_RES_MEM, *dptr, index, actual, ctx, NULL);
    return rc;
}

/* ---- stream-ordered pools: the pool's reservation is what is charged ---- */

#define MAX_POOLS 256

/* A pool we charge for. A destroyed pool with allocations outstanding keeps its
 * memory in the driver until the last of them is freed, so its record stays
 * (`destroyed`, no longer found by handle: the driver may hand the handle out
 * again) and keeps the charge until then. */
struct pool_rec {
    CUmemoryPool pool;     /* NULL: a free record */
    int index;
    int destroyed;
    uint64_t outstanding;  /* tracked allocations from it not yet freed */
    uint64_t charged;      /* the reservation last seen */
    pthread_mutex_t lock;
};

static struct pool_rec pools[MAX_POOLS] = {
    [0 ... MAX_POOLS - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};
static int pool_count;
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;

static CUmemoryPool rec_pool(struct pool_rec *rec)
{
    return __atomic_load_n(&rec->pool, __ATOMIC_ACQUIRE);
}

static struct pool_rec *pool_find(CUmemoryPool pool, int index, int create)
{
    struct pool_rec *rec = NULL;
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < pool_count && !rec; i++)
        if (pools[i].pool == pool && !pools[i].destroyed)
            rec = &pools[i];
    if (!rec && create) {
        for (int i = 0; i < pool_count && !rec; i++)
            if (!pools[i].pool)
                rec = &pools[i];
        if (!rec && pool_count < MAX_POOLS)
            rec = &pools[pool_count++];
        if (rec) {
            rec->index = index;
            rec->destroyed = 0;
            rec->outstanding = 0;
            rec->charged = 0;
            __atomic_store_n(&rec->pool, pool, __ATOMIC_RELEASE);   /* fields first */
        } else {
            hami_error("more than %d memory pools; pool %p is not limited", MAX_POOLS, (void *)pool);
        }
    }
    pthread_mutex_unlock(&pools_lock);
    return rec;
}

/* Gives back the whole charge and frees the record (rec locked). */
static void pool_forget(struct pool_rec *rec)
{
    hami_mem_uncharge(rec->index, rec->charged);
    rec->charged = 0;
    pthread_mutex_lock(&pools_lock);
    rec->destroyed = 0;
    __atomic_store_n(&rec->pool, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pools_lock);
}

static int pool_attr(CUmemoryPool pool, CUmemPool_attribute attr, uint64_t *value)
{
    CUresult (*get)(CUmemoryPool, CUmemPool_attribute, void *) = HAMI_DRIVER(cuMemPoolGetAttribute);
    cuuint64_t v = 0;
    if (!get || get(pool, attr, &v) != CUDA_SUCCESS)
        return -1;
    *value = v;
    return 0;
}

/* Brings the charge to the pool's current reservation (rec locked). Growth we did
 * not cause cannot be refused after the fact, so it is charged as it is. A
 * destroyed pool can no longer be asked: its charge stays as last seen. */
static void pool_settle(struct pool_rec *rec)
{
    uint64_t reserved;
    if (rec->destroyed || pool_attr(rec->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) < 0)
        return;
    if (reserved > rec->charged)
        hami_mem_charge_force(rec->index, reserved - rec->charged);
    else
        hami_mem_uncharge(rec->index, rec->charged - reserved);
    rec->charged = reserved;
}

static void settle_pools(void)
{
    pthread_mutex_lock(&pools_lock);
    int count = pool_count;
    pthread_mutex_unlock(&pools_lock);
    for (int i = 0; i < count; i++) {
        struct pool_rec *rec = &pools[i];
        /* A pool busy in this thread (a charge inside pool_alloc) is skipped. */
        if (rec_pool(rec) && pthread_mutex_trylock(&rec->lock) == 0) {
            if (rec->pool)
                pool_settle(rec);
            pthread_mutex_unlock(&rec->lock);
        }
    }
}

enum async_call { ASYNC_CURRENT, ASYNC_CURRENT_PTSZ, ASYNC_POOL, ASYNC_POOL_PTSZ };

static CUresult call_async(enum async_call which, CUdeviceptr *dptr, size_t bytes,
                           CUmemoryPool pool, CUstream stream)
{
    void *fn = NULL;
    switch (which) {
    case ASYNC_CURRENT: fn = HAMI_REAL(cuMemAllocAsync); break;
    case ASYNC_CURRENT_PTSZ: fn = HAMI_REAL(cuMemAllocAsync_ptsz); break;
    case ASYNC_POOL: fn = HAMI_REAL(cuMemAllocFromPoolAsync); break;
    case ASYNC_POOL_PTSZ: fn = HAMI_REAL(cuMemAllocFromPoolAsync_ptsz); break;
    }
    if (!fn)
        return CUDA_ERROR_NOT_FOUND;
    if (which == ASYNC_CURRENT || which == ASYNC_CURRENT_PTSZ)
        return ((__typeof__(&cuMemAllocAsync))fn)(dptr, bytes, stream);
    return ((__typeof__(&cuMemAllocFromPoolAsync))fn)(dptr, bytes, pool, stream);
}

static void free_async_now(CUdeviceptr ptr, CUstream stream, struct pool_rec *rec)
{
    __typeof__(&cuMemFreeAsync) free_async = HAMI_REAL(cuMemFreeAsync);
    CUresult (*sync)(CUstream) = HAMI_DRIVER(cuStreamSynchronize);
    CUresult (*trim)(CUmemoryPool, size_t) = HAMI_DRIVER(cuMemPoolTrimTo);
    uint64_t used = 0;
    if (free_async)
        free_async(ptr, stream);
    if (sync)
        sync(stream);
    if (trim && pool_attr(rec->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) == 0)
        trim(rec->pool, used);
}

/* Charge what the pool may have to grow by, up front (atomic check), then settle to
 * the reservation the driver really made. */
static CUresult pool_alloc(enum async_call which, CUdeviceptr *dptr, size_t bytes,
                           CUmemoryPool pool, CUstream stream, int index)
{
    struct pool_rec *rec = pool_find(pool, index, 1);
    if (!rec || !dptr || bytes == 0)
        return call_async(which, dptr, bytes, pool, stream);
    pthread_mutex_lock(&rec->lock);
    pool_settle(rec);
    uint64_t used = 0;
    pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
    uint64_t spare = rec->charged > used ? rec->charged - used : 0;
    uint64_t upfront = bytes > spare ? hami_pages(bytes) : 0;
    if (hami_mem_charge(rec->index, upfront) < 0) {
        pthread_mutex_unlock(&rec->lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rec->charged += upfront;
    CUresult rc = call_async(which, dptr, bytes, pool, stream);
    uint64_t reserved;
    if (pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) < 0)
        reserved = rec->charged;
    if (reserved > rec->charged) {
        uint64_t grown = reserved - rec->charged;
        if (hami_mem_charge(rec->index, grown) < 0) {
            if (rc == CUDA_SUCCESS) {
                /* the pool grew past the limit: undo, give the growth back, refuse */
                free_async_now(*dptr, stream, rec);
                pool_settle(rec);
                pthread_mutex_unlock(&rec->lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            hami_mem_charge_force(rec->index, grown);   /* failed, yet reserved: counted */
        }
        rec->charged = reserved;
    } else {
        hami_mem_uncharge(rec->index, rec->charged - reserved);
        rec->charged = reserved;
    }
    if (rc == CUDA_SUCCESS) {
        rec->outstanding++;
        track(HAMI_RES_ASYNC, *dptr, rec->index, 0, NULL, rec);
    }
    pthread_mutex_unlock(&rec->lock);
    return rc;
}

/* Near the limit a pool grows by more than the request (the driver picks the
 * granule), so a request that fits the limit could still be refused: it is then
 * served from plain device memory, charged exactly, and freed synchronously. The
 * same holds where the card is full: with HAMI_DEVICE_SPILL that plain allocation
 * spills to managed memory like any other. */
#define FALLBACK ((void *)1)

static CUresult pool_alloc_or_plain(enum async_call which, CUdeviceptr *dptr, size_t bytes,
                                    CUmemoryPool pool, CUstream stream, int index)
{
    /* Captured, it becomes the graph's allocation node: no memory is taken until the
     * graph's is committed (graph_memory.c), and nothing here may touch the stream. */
    int per_thread = which == ASYNC_CURRENT_PTSZ || which == ASYNC_POOL_PTSZ;
    if (hami_stream_capturing(per_thread && !stream ? CU_STREAM_PER_THREAD : stream))
        return call_async(which, dptr, bytes, pool, stream);
    CUresult rc = pool_alloc(which, dptr, bytes, pool, stream, index);
    if (rc != CUDA_ERROR_OUT_OF_MEMORY || !dptr || bytes == 0)
        return rc;
    __typeof__(&cuMemAlloc_v2) plain = HAMI_REAL(cuMemAlloc_v2);
    uint64_t charge = hami_pages(bytes);
    if (!plain || hami_mem_charge(index, charge) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext ctx = NULL;
    CUresult (*get_ctx)(CUcontext *) = HAMI_DRIVER(cuCtxGetCurrent);
    if (get_ctx)
        get_ctx(&ctx);
    rc = spill(index, plain(dptr, bytes), dptr, bytes);
    if (rc == CUDA_SUCCESS)
        track(HAMI_RES_MEM, *dptr, index, charge, ctx, FALLBACK);
    else
        hami_mem_uncharge(index, charge);
    hami_debug("%zu bytes stream-ordered served from plain memory (rc %d)", bytes, (int)rc);
    return rc;
}

static CUresult current_pool_alloc(enum async_call which, CUdeviceptr *dptr, size_t bytes,
                                   CUstream stream)
{
    CUdevice dev;
    int index = hami_current_device_index(&dev);
    CUmemoryPool pool = NULL;
    CUresult (*get_pool)(CUmemoryPool *, CUdevice) = HAMI_DRIVER(cuDeviceGetMemPool);
    if (!get_pool)
        get_pool = HAMI_DRIVER(cuDeviceGetDefaultMemPool);
    if (index < 0 || !get_pool || get_pool(&pool, dev) != CUDA_SUCCESS || !pool)
        return call_async(which, dptr, bytes, NULL, stream);
    hami_reconcile(index, dev);
    return pool_alloc_or_plain(which, dptr, bytes, pool, stream, index);
}

static CUresult from_pool_alloc(enum async_call which, CUdeviceptr *dptr, size_t bytes,
                                CUmemoryPool pool, CUstream stream)
{
    struct pool_rec *known = pool_find(pool, -1, 0);
    int index = known ? known->index : hami_current_device_index(NULL);
    if (index < 0 || !pool)
        return call_async(which, dptr, bytes, pool, stream);
    return pool_alloc_or_plain(which, dptr, bytes, pool, stream, index);
}

HAMI_HOOK(CUresult, cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),
          (dptr, bytesize, hStream))
{
    return current_pool_alloc(ASYNC_CURRENT, dptr, bytesize, hStream);
}

HAMI_HOOK(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),
          (dptr, bytesize, hStream))
{
    return current_pool_alloc(ASYNC_CURRENT_PTSZ, dptr, bytesize, hStream);
}

HAMI_HOOK(CUresult, cuMemAllocFromPoolAsync,
          (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),
          (dptr, bytesize, pool, hStream))
{
    return from_pool_alloc(ASYNC_POOL, dptr, bytesize, pool, hStream);
}

HAMI_HOOK(CUresult, cuMemAllocFromPoolAsync_ptsz,
          (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),
          (dptr, bytesize, pool, hStream))
{
    return from_pool_alloc(ASYNC_POOL_PTSZ, dptr, bytesize, pool, hStream);
}

static void settle_pool_of(CUmemoryPool pool)
{
    struct pool_rec *rec = pool_find(pool, -1, 0);
    if (rec) {
        pthread_mutex_lock(&rec->lock);
        if (rec->pool == pool && !rec->destroyed)
            pool_settle(rec);
        pthread_mutex_unlock(&rec->lock);
    }
}

struct async_free {
    CUstream stream;
    int ptsz;
};

static CUstream async_stream(const struct async_free *a)
{
    return a->ptsz && !a->stream ? CU_STREAM_PER_THREAD : a->stream;
}

/* One of the pool's allocations was freed (`a`: in stream order on that stream, NULL:
 * at once). A live pool is settled to its reservation. A destroyed one releases its
 * memory when its last allocation is freed: in stream order, once the stream has
 * reached the free, so the charge goes after that stream is synchronised. */
static void pool_freed(struct pool_rec *rec, const struct async_free *a)
{
    pthread_mutex_lock(&rec->lock);
    if (rec->outstanding)
        rec->outstanding--;
    if (!rec->destroyed) {
        pool_settle(rec);
    } else if (!rec->outstanding) {
        CUresult (*sync)(CUstream) = HAMI_DRIVER(cuStreamSynchronize);
        if (a && sync)
            sync(async_stream(a));
        hami_debug("destroyed pool %p: last allocation freed, %llu bytes given back",
                   (void *)rec->pool, (unsigned long long)rec->charged);
        pool_forget(rec);
    }
    pthread_mutex_unlock(&rec->lock);
}

static CUresult release_sync(CUdeviceptr dptr, void *arg);
static CUresult release_async(CUdeviceptr dptr, void *arg);

/* Frees a pointer through `release` and gives back what it held; untracked
 * pointers go to the driver unchanged. */
static CUresult free_tracked(CUdeviceptr dptr, CUresult (*release)(CUdeviceptr, void *), void *arg)
{
    struct hami_res res;
    int kind = HAMI_RES_MEM;
    if (hami_res_take(HAMI_RES_MEM, dptr, &res) < 0) {
        kind = HAMI_RES_ASYNC;
        if (hami_res_take(HAMI_RES_ASYNC, dptr, &res) < 0)
            return release(dptr, arg);
    }
    if (release == release_async && hami_stream_capturing(async_stream(arg))) {
        /* captured: the free happens when the graph runs, if the driver takes it at all */
        hami_res_put(&res);
        return release(dptr, arg);
    }
    if (res.aux == FALLBACK && release == release_async) {
        /* plain memory freed in stream order: wait for the stream, then free it */
        CUresult (*sync)(CUstream) = HAMI_DRIVER(cuStreamSynchronize);
        if (sync)
            sync(async_stream(arg));
        release = release_sync;
    }
    CUresult rc = release(dptr, arg);
    if (rc != CUDA_SUCCESS) {
        hami_res_put(&res);
        return rc;
    }
    if (kind == HAMI_RES_MEM)
        hami_mem_uncharge(res.dev, res.bytes);
    else
        pool_freed(res.aux, release == release_async ? arg : NULL);
    return rc;
}

static CUresult release_sync(CUdeviceptr dptr, void *arg)
{
    (void)arg;
    __typeof__(&cuMemFree_v2) real = HAMI_REAL(cuMemFree_v2);
    return real ? real(dptr) : CUDA_ERROR_NOT_FOUND;
}

static CUresult release_async(CUdeviceptr dptr, void *arg)
{
    struct async_free *a = arg;
    __typeof__(&cuMemFreeAsync) real =
        a->ptsz ? HAMI_REAL(cuMemFreeAsync_ptsz) : HAMI_REAL(cuMemFreeAsync);
    return real ? real(dptr, a->stream) : CUDA_ERROR_NOT_FOUND;
}

HAMI_HOOK(CUresult, cuMemFree_v2, (CUdeviceptr dptr), (dptr))
{
    return free_tracked(dptr, release_sync, NULL);
}

HAMI_HOOK(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream))
{
    struct async_free a = {hStream, 0};
    return free_tracked(dptr, release_async, &a);
}

HAMI_HOOK(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream))
{
    struct async_free a = {hStream, 1};
    return free_tracked(dptr, release_async, &a);
}

HAMI_HOOK(CUresult, cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *poolProps),
          (pool, poolProps))
{
    CUresult rc = real(pool, poolProps);
    if (rc == CUDA_SUCCESS && pool && poolProps &&
        poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        int index = hami_region_device_index(poolProps->location.id);
        if (index >= 0)
            pool_find(*pool, index, 1);
    }
    return rc;
}

HAMI_HOOK(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep),
          (pool, minBytesToKeep))
{
    CUresult rc = real(pool, minBytesToKeep);
    if (rc == CUDA_SUCCESS)
        settle_pool_of(pool);
    return rc;
}

/* The driver destroys a pool with allocations outstanding only once the last of them
 * is freed (it returns at once): its reservation, read while the handle still
 * answers, stays charged until then (pool_freed). */
HAMI_HOOK(CUresult, cuMemPoolDestroy, (CUmemoryPool pool), (pool))
{
    struct pool_rec *rec = pool_find(pool, -1, 0);
    if (!rec)
        return real(pool);
    pthread_mutex_lock(&rec->lock);
    int ours = rec->pool == pool && !rec->destroyed;
    if (ours)
        pool_settle(rec);
    CUresult rc = real(pool);
    if (rc == CUDA_SUCCESS && ours) {
        if (rec->outstanding) {
            pthread_mutex_lock(&pools_lock);
            rec->destroyed = 1;
            pthread_mutex_unlock(&pools_lock);
            hami_debug("pool %p destroyed with %llu allocations outstanding: %llu bytes stay charged",
                       (void *)pool, (unsigned long long)rec->outstanding,
                       (unsigned long long)rec->charged);
        } else {
            pool_forget(rec);
        }
    }
    pthread_mutex_unlock(&rec->lock);
    return rc;
}

/* ---- virtual memory management ---- */

HAMI_HOOK(CUresult, cuMemCreate,
          (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
           unsigned long long flags),
          (handle, size, prop, flags))
{
    int index = -1;
    if (prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        index = hami_region_device_index(prop->location.id);
    if (index < 0 || !handle || size == 0)
        return real(handle, size, prop, flags);
    hami_reconcile(index, prop->location.id);
    uint64_t charge = size;   /* a multiple of the granularity, or the driver refuses */
    if (hami_mem_charge(index, charge) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(handle, size, prop, flags);
    if (rc == CUDA_SUCCESS)
        track(HAMI_RES_VMM, *handle, index, charge, NULL, NULL);
    else
        hami_mem_uncharge(index, charge);
    return rc;
}

/* A handle released while mapped keeps its memory in the driver until its last
 * mapping is unmapped: the mappings of charged handles are kept, and a charged
 * handle released while mapped stays charged (`released`) until then. Not a hot path. */
struct vmm_map {
    CUdeviceptr ptr;
    size_t size;
    CUmemGenericAllocationHandle handle;
};

static struct vmm_map *vmm_maps;
static size_t vmm_map_count, vmm_map_cap;
static struct hami_res *vmm_released;
static size_t vmm_released_count, vmm_released_cap;
static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

static int grow(void **items, size_t *cap, size_t count, size_t size)
{
    if (count < *cap)
        return 0;
    size_t want = *cap ? *cap * 2 : 16;
    void *bigger = realloc(*items, want * size);
    if (!bigger)
        return -1;
    *items = bigger;
    *cap = want;
    return 0;
}

static int vmm_mapped(CUmemGenericAllocationHandle handle)   /* vmm_lock held */
{
    for (size_t i = 0; i < vmm_map_count; i++)
        if (vmm_maps[i].handle == handle)
            return 1;
    return 0;
}

/* Released handles with no mapping left give their charge back (vmm_lock held). */
static void vmm_settle_released(void)
{
    for (size_t i = 0; i < vmm_released_count;) {
        if (!vmm_mapped(vmm_released[i].key)) {
            hami_mem_uncharge(vmm_released[i].dev, vmm_released[i].bytes);
            vmm_released[i] = vmm_released[--vmm_released_count];
        } else {
            i++;
        }
    }
}

/* Forgets the mappings inside [ptr, ptr + size) (unmapped), or only the one entry
 * {ptr, size, handle} when `handle` is given (a mapping the driver refused). */
static void vmm_unmapped(CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle handle)
{
    pthread_mutex_lock(&vmm_lock);
    for (size_t i = 0; i < vmm_map_count;) {
        const struct vmm_map *m = &vmm_maps[i];
        int gone = handle ? m->ptr == ptr && m->size == size && m->handle == handle
                          : m->ptr >= ptr && m->ptr - ptr <= size && m->size <= size - (m->ptr - ptr);
        if (!gone) {
            i++;
            continue;
        }
        vmm_maps[i] = vmm_maps[--vmm_map_count];
        if (handle)
            break;
    }
    vmm_settle_released();
    pthread_mutex_unlock(&vmm_lock);
}

/* The mapping is recorded before the driver makes it, so that a release racing with
 * it keeps the charge. */
HAMI_HOOK(CUresult, cuMemMap,
          (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
           unsigned long long flags),
          (ptr, size, offset, handle, flags))
{
    if (!hami_region_get())
        return real(ptr, size, offset, handle, flags);
    pthread_mutex_lock(&vmm_lock);
    int recorded = grow((void **)&vmm_maps, &vmm_map_cap, vmm_map_count, sizeof *vmm_maps) == 0;
    if (recorded)
        vmm_maps[vmm_map_count++] = (struct vmm_map){ptr, size, handle};
    pthread_mutex_unlock(&vmm_lock);
    CUresult rc = real(ptr, size, offset, handle, flags);
    if (rc != CUDA_SUCCESS && recorded)
        vmm_unmapped(ptr, size, handle);
    return rc;
}

HAMI_HOOK(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size))
{
    if (!hami_region_get())
        return real(ptr, size);
    CUresult rc = real(ptr, size);
    if (rc == CUDA_SUCCESS)
        vmm_unmapped(ptr, size, 0);
    return rc;
}

HAMI_HOOK(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle), (handle))
{
    struct hami_res res;
    if (hami_res_take(HAMI_RES_VMM, handle, &res) < 0)
        return real(handle);
    CUresult rc = real(handle);
    if (rc != CUDA_SUCCESS) {
        hami_res_put(&res);
        return rc;
    }
    pthread_mutex_lock(&vmm_lock);
    int keep = vmm_mapped(handle) &&
               grow((void **)&vmm_released, &vmm_released_cap, vmm_released_count,
                    sizeof *vmm_released) == 0;
    if (keep)
        vmm_released[vmm_released_count++] = res;
    else
        hami_mem_uncharge(res.dev, res.bytes);
    pthread_mutex_unlock(&vmm_lock);
    return rc;
}

/* ---- arrays ---- */

static uint64_t format_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format format, unsigned channels)
{
    uint64_t dims[5] = {w, h ? h : 1, d ? d : 1, channels ? channels : 1, format_bytes(format)};
    uint64_t total = 1;
    for (int i = 0; i < 5; i++) {
        if (dims[i] && total > UINT64_MAX / dims[i])
            return UINT64_MAX;
        total *= dims[i];
    }
    return hami_pages(total);
}

static CUresult array_charged(int index, uint64_t charge, CUresult rc, CUarray *pHandle,
                              CUcontext ctx)
{
    if (rc == CUDA_SUCCESS)
        track(HAMI_RES_ARRAY, (uint64_t)(uintptr_t)*pHandle, index, charge, ctx, NULL);
    else
        hami_mem_uncharge(index, charge);
    return rc;
}

HAMI_HOOK(CUresult, cuArrayCreate_v2, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc),
          (pHandle, desc))
{
    CUcontext ctx;
    int index = current_index(&ctx);
    if (index < 0 || !pHandle || !desc)
        return real(pHandle, desc);
    uint64_t charge = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    if (hami_mem_charge(index, charge) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return array_charged(index, charge, real(pHandle, desc), pHandle, ctx);
}

HAMI_HOOK(CUresult, cuArray3DCreate_v2, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc),
          (pHandle, desc))
{
    CUcontext ctx;
    int index = current_index(&ctx);
    if (index < 0 || !pHandle || !desc)
        return real(pHandle, desc);
    uint64_t charge =
        array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    if (hami_mem_charge(index, charge) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return array_charged(index, charge, real(pHandle, desc), pHandle, ctx);
}

HAMI_HOOK(CUresult, cuArrayDestroy, (CUarray hArray), (hArray))
{
    struct hami_res res;
    if (hami_res_take(HAMI_RES_ARRAY, (uint64_t)(uintptr_t)hArray, &res) < 0)
        return real(hArray);
    CUresult rc = real(hArray);
    if (rc == CUDA_SUCCESS)
        hami_mem_uncharge(res.dev, res.bytes);
    else
        hami_res_put(&res);
    return rc;
}

/* ---- what the program sees ---- */

HAMI_HOOK(CUresult, cuMemGetInfo_v2, (size_t *free, size_t *total), (free, total))
{
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = real(free, total);
    CUdevice dev = 0;
    int index = rc == CUDA_SUCCESS ? hami_current_device_index(&dev) : -1;
    if (!hami_mem_limit(index))
        return rc;
    settle_pools();
    hami_reconcile(index, dev);
    uint64_t shown_total = *total, shown_free = *free;
    hami_mem_view(index, &shown_total, NULL, &shown_free);
    *total = shown_total;
    *free = shown_free;
    return rc;
}

HAMI_HOOK(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev), (bytes, dev))
{
    CUresult rc = real(bytes, dev);
    uint64_t shown = bytes ? *bytes : 0;
    if (rc == CUDA_SUCCESS && bytes && hami_mem_view(hami_region_device_index(dev), &shown, NULL, NULL))
        *bytes = shown;
    return rc;
}

/* Before refusing a charge, the accounting gives back what released pool memory
 * held: it asks this file, which it does not call by name (one direction). */
__attribute__((constructor)) static void register_pool_settling(void)
{
    hami_mem_before_refusal(settle_pools);
}
