/* Driver API: contexts. A context takes `context_mib` of device memory while it
 * lives; destroying it frees everything allocated in it, as the real driver does. */
#include "sim.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

#define CTX_STACK_MAX 64

static __thread CUcontext ctx_stack[CTX_STACK_MAX];
static __thread int ctx_depth;

static struct sim_ctx *primary[SIM_MAX_DEVICES];
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

struct sim_ctx *sim_ctx_check(CUcontext ctx)
{
    struct sim_ctx *c = sim_handle_get((uintptr_t)ctx, SIM_KIND_CTX);
    return c && c->active ? c : NULL;
}

struct sim_ctx *sim_ctx_current(void)
{
    return ctx_depth > 0 ? sim_ctx_check(ctx_stack[ctx_depth - 1]) : NULL;
}

CUresult sim_ctx_current_checked(struct sim_ctx **out)
{
    SIM_REQUIRE_INIT();
    *out = sim_ctx_current();
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static int valid_device(CUdevice dev) { return dev >= 0 && dev < sim_config()->visible; }

/* With `self_calls`, an entry point reaches another through its exported name (what
 * the process's symbol lookup finds first), as a real driver may. */
static void *exported(const char *name)
{
    return dlsym(RTLD_DEFAULT, name);
}

/* How much of a context's `bytes` is allocated through the exported cuMemAlloc_v2. */
static uint64_t self_called_bytes(uint64_t bytes)
{
    return sim_config()->self_calls && bytes >= SIM_PAGE ? SIM_PAGE : 0;
}

/* Takes the context's device memory and starts its default stream, in
 * `context_us` (the memory is taken at once, as a real driver's shows while it
 * sets the context up). With `self_calls`, one page of that memory is allocated
 * in the new context through the exported cuMemAlloc_v2 (freed with the
 * context); the total is the same. */
static CUresult ctx_start(struct sim_ctx *c)
{
    uint64_t bytes = sim_config()->context_mib * SIM_MIB, inner = self_called_bytes(bytes);
    if (inner && ctx_depth >= CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (sim_charge(c->dev, bytes - inner) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_sleep_us(sim_config()->context_us);
    sim_context_count(c->dev, 1);
    c->null_stream = sim_stream_new(c, 0);
    c->active = 1;
    if (inner) {
        __typeof__(&cuMemAlloc_v2) alloc = (__typeof__(&cuMemAlloc_v2))exported("cuMemAlloc_v2");
        CUdeviceptr ptr;
        ctx_stack[ctx_depth++] = (CUcontext)c;
        CUresult rc = alloc ? alloc(&ptr, inner) : CUDA_ERROR_NOT_FOUND;
        ctx_depth--;
        if (rc != CUDA_SUCCESS) {
            c->active = 0;
            sim_ctx_streams_destroy(c);
            c->null_stream = NULL;
            sim_uncharge(c->dev, bytes - inner);
            sim_context_count(c->dev, -1);
            return rc;
        }
    }
    return CUDA_SUCCESS;
}

static void ctx_stop(struct sim_ctx *c)
{
    uint64_t bytes = sim_config()->context_mib * SIM_MIB, inner = self_called_bytes(bytes);
    sim_ctx_sync(c);
    sim_ctx_cls_destroy(c);
    c->active = 0;
    sim_ctx_streams_destroy(c);
    c->null_stream = NULL;
    sim_pools_release_ctx(c);
    sim_free_ctx_allocations(c);   /* the self-called page too */
    sim_free_ctx_arrays(c);
    sim_uncharge(c->dev, bytes - inner);
    sim_context_count(c->dev, -1);
}

static void remove_from_stack(CUcontext ctx)
{
    int w = 0;
    for (int r = 0; r < ctx_depth; r++)
        if (ctx_stack[r] != ctx)
            ctx_stack[w++] = ctx_stack[r];
    ctx_depth = w;
}

/* The primary context object exists from its first mention on; it is active while retained. */
static struct sim_ctx *primary_locked(int dev)
{
    struct sim_ctx *c = primary[dev];
    if (!c && (c = calloc(1, sizeof *c))) {
        c->dev = dev;
        c->primary = 1;
        primary[dev] = c;
        sim_handle_put((uintptr_t)c, SIM_KIND_CTX, c);
    }
    return c;
}

struct sim_ctx *sim_ctx_primary(int dev)
{
    if (!valid_device(dev))
        return NULL;
    pthread_mutex_lock(&ctx_lock);
    struct sim_ctx *c = primary_locked(dev);
    pthread_mutex_unlock(&ctx_lock);
    return c;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    SIM_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&ctx_lock);
    struct sim_ctx *c = primary_locked(dev);
    if (!c)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else if (c->refcount == 0)
        rc = ctx_start(c);
    if (rc == CUDA_SUCCESS) {
        c->refcount++;
        *pctx = (CUcontext)c;
    }
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    SIM_REQUIRE_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&ctx_lock);
    struct sim_ctx *c = primary[dev];
    if (!c || c->refcount == 0)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (--c->refcount == 0)
        ctx_stop(c);
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    SIM_REQUIRE_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_lock);
    struct sim_ctx *c = primary[dev];
    if (c && c->refcount > 0) {
        c->refcount = 0;
        ctx_stop(c);
    }
    pthread_mutex_unlock(&ctx_lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    SIM_REQUIRE_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_lock);
    struct sim_ctx *c = primary[dev];
    *flags = c ? c->flags : 0;
    *active = c && c->refcount > 0;
    pthread_mutex_unlock(&ctx_lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    SIM_REQUIRE_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_lock);
    struct sim_ctx *c = primary_locked(dev);
    if (c)
        c->flags = flags;
    pthread_mutex_unlock(&ctx_lock);
    return c ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) { return cuDevicePrimaryCtxSetFlags_v2(dev, flags); }

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    SIM_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_depth >= CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = dev;
    c->flags = flags;
    sim_handle_put((uintptr_t)c, SIM_KIND_CTX, c);   /* a handle already while it starts */
    CUresult rc = ctx_start(c);
    if (rc != CUDA_SUCCESS) {
        sim_handle_take((uintptr_t)c, SIM_KIND_CTX);
        free(c);
        return rc;
    }
    ctx_stack[ctx_depth++] = (CUcontext)c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

/* With `self_calls`: _v4 calls the exported _v3, which calls the exported _v2. */
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    if (sim_config() && sim_config()->self_calls) {
        __typeof__(&cuCtxCreate_v2) v2 = (__typeof__(&cuCtxCreate_v2))exported("cuCtxCreate_v2");
        return v2 ? v2(pctx, flags, dev) : CUDA_ERROR_NOT_FOUND;
    }
    return ctx_create(pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev)
{
    (void)ctxCreateParams;
    if (sim_config() && sim_config()->self_calls) {
        __typeof__(&cuCtxCreate_v3) v3 = (__typeof__(&cuCtxCreate_v3))exported("cuCtxCreate_v3");
        return v3 ? v3(pctx, NULL, 0, flags, dev) : CUDA_ERROR_NOT_FOUND;
    }
    return ctx_create(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    SIM_REQUIRE_INIT();
    struct sim_ctx *c = sim_handle_get((uintptr_t)ctx, SIM_KIND_CTX);
    if (!c || c->primary || !sim_handle_take((uintptr_t)ctx, SIM_KIND_CTX))
        return CUDA_ERROR_INVALID_CONTEXT;
    remove_from_stack(ctx);
    ctx_stop(c);
    free(c);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

/* A primary context can be made current while it is inactive, as on the real driver (the
 * runtime does so before retaining it); calls in it fail until it is retained. */
static int ctx_known(CUcontext ctx)
{
    struct sim_ctx *c = sim_handle_get((uintptr_t)ctx, SIM_KIND_CTX);
    return c && (c->active || c->primary);
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    SIM_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    SIM_REQUIRE_INIT();
    if (!ctx) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_known(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    SIM_REQUIRE_INIT();
    if (!ctx_known(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    SIM_REQUIRE_INIT();
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = top;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

/* A property of the current context read back: the context is checked first, then the
 * output pointer. */
#define CTX_GETTER(name, type, value)                      \
    CUresult name(type *out)                               \
    {                                                      \
        struct sim_ctx *c;                                 \
        CUresult rc = sim_ctx_current_checked(&c);         \
        if (rc != CUDA_SUCCESS)                            \
            return rc;                                     \
        if (!out)                                          \
            return CUDA_ERROR_INVALID_VALUE;               \
        *out = (value);                                    \
        return CUDA_SUCCESS;                               \
    }

CTX_GETTER(cuCtxGetDevice, CUdevice, c->dev)

/* CUDA 13's forms name the context (NULL: the current one). */
static CUresult named_or_current(CUcontext ctx, struct sim_ctx **out)
{
    if (!ctx)
        return sim_ctx_current_checked(out);
    SIM_REQUIRE_INIT();
    *out = sim_ctx_check(ctx);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    struct sim_ctx *c;
    CUresult rc = named_or_current(ctx, &c);
    if (rc == CUDA_SUCCESS && !device)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *device = c->dev;
    return rc;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    struct sim_ctx *c;
    CUresult rc = named_or_current(ctx, &c);
    if (rc == CUDA_SUCCESS)
        rc = sim_capture_ctx_call(c);
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_ctx_sync(c);
    sim_pools_sync_trim(c->dev);
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return cuCtxSynchronize_v2(NULL); }

/* ---- context queries the CUDA runtime makes ---- */

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    SIM_REQUIRE_INIT();
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(ctx ? sim_ctx_check(ctx) : sim_ctx_current()))
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;  /* every context is made through the 3.2+ API */
    return CUDA_SUCCESS;
}

CTX_GETTER(cuCtxGetFlags, unsigned int, c->flags)

CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    SIM_REQUIRE_INIT();
    struct sim_ctx *c = ctx ? sim_ctx_check(ctx) : sim_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctxId)
        return CUDA_ERROR_INVALID_VALUE;
    *ctxId = (uintptr_t)c;
    return CUDA_SUCCESS;
}

/* Limits as the driver starts them on an H100; set values are kept per context. CU_LIMIT_SHMEM_SIZE (7) is the shared memory kernels may use: all
 * of an SM's on a context that shares none with graphics (CIG), as every simulated context is. */
static const size_t limit_defaults[CU_LIMIT_MAX] = {1024, 1048576, 8388608, 2, 2048, 64, 0, SIM_SM_SHARED_BYTES, 0, 0};

CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    struct sim_ctx *c;
    CUresult rc = sim_ctx_current_checked(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pvalue || (unsigned)limit >= CU_LIMIT_MAX)
        return CUDA_ERROR_INVALID_VALUE;  /* CUDA_ERROR_UNSUPPORTED_LIMIT is for known limits */
    *pvalue = c->limit_set[limit] ? c->limits[limit] : limit_defaults[limit];
    return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    struct sim_ctx *c;
    CUresult rc = sim_ctx_current_checked(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((unsigned)limit >= CU_LIMIT_MAX || limit >= 7)  /* the CIG limits can only be read */
        return CUDA_ERROR_INVALID_VALUE;
    c->limits[limit] = value;
    c->limit_set[limit] = 1;
    return CUDA_SUCCESS;
}

CTX_GETTER(cuCtxGetCacheConfig, CUfunc_cache, (CUfunc_cache)c->cache_config)

CUresult cuCtxSetCacheConfig(CUfunc_cache config)
{
    struct sim_ctx *c;
    CUresult rc = sim_ctx_current_checked(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((unsigned)config > CU_FUNC_CACHE_PREFER_EQUAL)
        return CUDA_ERROR_INVALID_VALUE;
    c->cache_config = config;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    struct sim_ctx *c;
    CUresult rc = sim_ctx_current_checked(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    SIM_REQUIRE_INIT();
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev) || !valid_device(peerDev))
        return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = 0;  /* no peer mappings between simulated cards */
    return CUDA_SUCCESS;
}

/* Peer access is never possible (cuDeviceCanAccessPeer says 0), so it cannot be enabled. */
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    struct sim_ctx *c;
    CUresult rc = sim_ctx_current_checked(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (Flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_ctx *peer = sim_ctx_check(peerContext);
    if (!peer)
        return CUDA_ERROR_INVALID_CONTEXT;
    return peer->dev == c->dev ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    struct sim_ctx *c;
    CUresult rc = sim_ctx_current_checked(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_ctx_check(peerContext) ? CUDA_ERROR_PEER_ACCESS_NOT_ENABLED : CUDA_ERROR_INVALID_CONTEXT;
}
