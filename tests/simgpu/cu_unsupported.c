/* Driver API: what a CUDA 13 driver exports for features a simulated card does not
 * have. Each entry point exists (clients resolve them up front, as PyTorch's c10 does)
 * and answers as the driver does on a device without the feature:
 * - multicast objects (NVLink SHARP): CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0;
 * - green contexts (SM partitions): not offered by the simulated card.
 * Both give CUDA_ERROR_NOT_SUPPORTED after the usual checks of initialisation and
 * device ordinal. */
#include "sim.h"

static CUresult not_supported_on(CUdevice dev)
{
    SIM_REQUIRE_INIT();
    return dev < 0 || dev >= sim_config()->visible ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult not_supported(void)
{
    SIM_REQUIRE_INIT();
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)
{
    SIM_REQUIRE_INIT();
    return !mcHandle || !prop ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
    (void)mcHandle;
    return not_supported_on(dev);
}

CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                            size_t memOffset, size_t size, unsigned long long flags)
{
    (void)mcHandle, (void)mcOffset, (void)memHandle, (void)memOffset, (void)size, (void)flags;
    return not_supported();
}

CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset, size_t size)
{
    (void)mcHandle, (void)mcOffset, (void)size;
    return not_supported_on(dev);
}

CUresult cuDeviceGetDevResource(CUdevice device, CUdevResource *resource, CUdevResourceType type)
{
    (void)type;
    SIM_REQUIRE_INIT();
    return !resource ? CUDA_ERROR_INVALID_VALUE : not_supported_on(device);
}

CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nbGroups, const CUdevResource *input,
                                     CUdevResource *remaining, unsigned int useFlags, unsigned int minCount)
{
    (void)result, (void)nbGroups, (void)input, (void)remaining, (void)useFlags, (void)minCount;
    return not_supported();
}

CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources, unsigned int nbResources)
{
    (void)phDesc, (void)resources, (void)nbResources;
    return not_supported();
}

CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
{
    (void)desc, (void)flags;
    SIM_REQUIRE_INIT();
    return !phCtx ? CUDA_ERROR_INVALID_VALUE : not_supported_on(dev);
}

/* No green context can exist, so every handle is unknown. */
CUresult cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    (void)hCtx;
    SIM_REQUIRE_INIT();
    return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx)
{
    (void)hCtx;
    SIM_REQUIRE_INIT();
    return !pContext ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx, unsigned int flags, int priority)
{
    (void)greenCtx, (void)flags, (void)priority;
    SIM_REQUIRE_INIT();
    return !phStream ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
}
