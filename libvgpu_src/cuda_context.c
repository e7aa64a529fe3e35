/* Contexts take device memory. Their size is measured: the device's free memory
 * (NVML, which needs no context) before and after the driver creates one. A
 * context the limit cannot hold is destroyed again and refused. */
#include "internal.h"
#include "hooks.h"
#include "log.h"

#include <pthread.h>
#include <stdio.h>

#define MAX_ORDINALS 64
#define UNKNOWN UINT64_MAX

/* One creation or destruction at a time in this process, so that a measurement
 * sees only its own context appear (other processes may still move it). */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    CUcontext ctx;
    uint64_t bytes;
    int index;
    int charged;
} primary[MAX_ORDINALS];

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

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_ready;

static void nvml_start(void)
{
    nvmlReturn_t (*init)(void) = HAMI_DRIVER(nvmlInit_v2);
    nvml_ready = init && init() == NVML_SUCCESS;
    if (!nvml_ready)
        hami_warn("NVML unavailable: context memory is not measured");
}

static uint64_t device_free_bytes(CUdevice dev)
{
    pthread_once(&nvml_once, nvml_start);
    if (!nvml_ready)
        return UNKNOWN;
    char uuid[96];
    nvmlDevice_t handle;
    nvmlMemory_t mem;
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *) = HAMI_DRIVER(nvmlDeviceGetHandleByUUID);
    __typeof__(&nvmlDeviceGetMemoryInfo) info = HAMI_REAL(nvmlDeviceGetMemoryInfo);
    if (!by_uuid || !info || hami_cuda_uuid(dev, uuid, sizeof uuid) < 0 ||
        by_uuid(uuid, &handle) != NVML_SUCCESS || info(handle, &mem) != NVML_SUCCESS)
        return UNKNOWN;
    return mem.free;
}

static uint64_t measured(uint64_t before, uint64_t after)
{
    return before != UNKNOWN && after != UNKNOWN && before > after ? before - after : 0;
}

/* ---- primary contexts ---- */

static void drop_primary(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORDINALS || !primary[dev].charged)
        return;
    hami_mem_release_ctx(primary[dev].ctx);
    hami_mem_uncharge(primary[dev].index, primary[dev].bytes);
    hami_ctx_charged(primary[dev].index, -(int64_t)primary[dev].bytes);
    primary[dev].charged = 0;
    primary[dev].ctx = NULL;
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxRetain) real = HAMI_REAL(cuDevicePrimaryCtxRetain);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    int index = hami_region_device_index(dev);
    if (index < 0 || dev >= MAX_ORDINALS)
        return real(pctx, dev);
    pthread_mutex_lock(&ctx_lock);
    int fresh = !primary[dev].charged;
    uint64_t before = fresh ? device_free_bytes(dev) : 0;
    CUresult rc = real(pctx, dev);
    if (rc == CUDA_SUCCESS && fresh && pctx) {
        uint64_t bytes = measured(before, device_free_bytes(dev));
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
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}

static CUresult primary_release(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&ctx_lock);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS && dev >= 0 && dev < MAX_ORDINALS && primary[dev].charged) {
        unsigned int flags = 0;
        int active = 1;
        CUresult (*state)(CUdevice, unsigned int *, int *) = HAMI_DRIVER(cuDevicePrimaryCtxGetState);
        if (state && state(dev, &flags, &active) == CUDA_SUCCESS && !active)
            drop_primary(dev);
    }
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}

static CUresult primary_reset(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&ctx_lock);
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS)
        drop_primary(dev);
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(HAMI_REAL(cuDevicePrimaryCtxRelease_v2), dev);
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release(HAMI_REAL(cuDevicePrimaryCtxRelease), dev);
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(HAMI_REAL(cuDevicePrimaryCtxReset_v2), dev);
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset(HAMI_REAL(cuDevicePrimaryCtxReset), dev);
}

/* ---- created contexts ---- */

struct creation {
    int index;
    CUdevice dev;
    uint64_t before;
};

static void creation_begin(struct creation *c, CUdevice dev)
{
    c->dev = dev;
    c->index = hami_region_device_index(dev);
    pthread_mutex_lock(&ctx_lock);
    c->before = c->index >= 0 ? device_free_bytes(dev) : UNKNOWN;
}

static CUresult creation_end(struct creation *c, CUresult rc, CUcontext *pctx)
{
    if (rc == CUDA_SUCCESS && c->index >= 0 && pctx && *pctx) {
        uint64_t bytes = measured(c->before, device_free_bytes(c->dev));
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
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}

HAMI_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate_v2) real = HAMI_REAL(cuCtxCreate_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct creation c;
    creation_begin(&c, dev);
    return creation_end(&c, real(pctx, flags, dev), pctx);
}

HAMI_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                    unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate_v3) real = HAMI_REAL(cuCtxCreate_v3);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct creation c;
    creation_begin(&c, dev);
    return creation_end(&c, real(pctx, paramsArray, numParams, flags, dev), pctx);
}

HAMI_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                    unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate_v4) real = HAMI_REAL(cuCtxCreate_v4);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct creation c;
    creation_begin(&c, dev);
    return creation_end(&c, real(pctx, ctxCreateParams, flags, dev), pctx);
}

HAMI_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    __typeof__(&cuCtxDestroy_v2) real = HAMI_REAL(cuCtxDestroy_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&ctx_lock);
    CUresult rc = real(ctx);
    if (rc == CUDA_SUCCESS) {
        struct hami_res res;
        if (hami_res_take(HAMI_RES_CTX, (uint64_t)(uintptr_t)ctx, &res) == 0) {
            hami_mem_uncharge(res.dev, res.bytes);
            hami_ctx_charged(res.dev, -(int64_t)res.bytes);
        }
        hami_mem_release_ctx(ctx);
    }
    pthread_mutex_unlock(&ctx_lock);
    return rc;
}
