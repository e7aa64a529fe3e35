/* Launch hooks: each passes through the SM limiter (sm_limiter.h) on the region
 * index of the launching context's device. */
#include "internal.h"
#include "hooks.h"
#include "sm_limiter.h"

/* The launching device's region index, or -1 at once when no device of the region
 * has an SM limit (read live: the runtime may change limits), sparing the driver
 * query on every launch of an unlimited container. */
static int launch_device_index(void)
{
    struct hami_region *r = hami_region_get();
    if (!r)
        return -1;
    uint32_t count = r->device_count < HAMI_MAX_DEVICES ? r->device_count : HAMI_MAX_DEVICES;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t limit = __atomic_load_n(&r->devices[i].sm_limit, __ATOMIC_RELAXED);
        if (limit > 0 && limit < 100)
            return hami_current_device_index(NULL);
    }
    return -1;
}

#define LAUNCH(name, stream, ...)                                    \
    do {                                                             \
        __typeof__(&name) real_ = HAMI_REAL(name);                   \
        if (!real_)                                                  \
            return CUDA_ERROR_NOT_FOUND;                       \
        if (hami_in_driver)                                          \
            return real_(__VA_ARGS__);                               \
        int dev_ = launch_device_index();                            \
        hami_sm_before_launch(dev_, (stream));                       \
        CUresult rc_ = HAMI_CALL(real_(__VA_ARGS__));                \
        hami_sm_after_launch(dev_, (stream), rc_);                   \
        return rc_;                                                  \
    } while (0)


#define DEFINE_LAUNCH_KERNEL(name)                                                              \
    HAMI_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,       \
                              unsigned int gridDimZ, unsigned int blockDimX,                    \
                              unsigned int blockDimY, unsigned int blockDimZ,                   \
                              unsigned int sharedMemBytes, CUstream hStream,                    \
                              void **kernelParams, void **extra)                                \
    {                                                                                           \
        LAUNCH(name, hStream, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, \
               sharedMemBytes, hStream, kernelParams, extra);                                   \
    }

#define DEFINE_LAUNCH_COOPERATIVE(name)                                                         \
    HAMI_EXPORT CUresult name(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,       \
                              unsigned int gridDimZ, unsigned int blockDimX,                    \
                              unsigned int blockDimY, unsigned int blockDimZ,                   \
                              unsigned int sharedMemBytes, CUstream hStream,                    \
                              void **kernelParams)                                              \
    {                                                                                           \
        LAUNCH(name, hStream, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, \
               sharedMemBytes, hStream, kernelParams);                                          \
    }

#define DEFINE_LAUNCH_EX(name)                                                                   \
    HAMI_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **kernelParams,   \
                              void **extra)                                                     \
    {                                                                                            \
        LAUNCH(name, config ? config->hStream : NULL, config, f, kernelParams, extra);          \
    }

#define DEFINE_GRAPH_LAUNCH(name)                                                                \
    HAMI_EXPORT CUresult name(CUgraphExec hGraphExec, CUstream hStream)                          \
    {                                                                                            \
        LAUNCH(name, hStream, hGraphExec, hStream);                                              \
    }

DEFINE_LAUNCH_KERNEL(cuLaunchKernel)
DEFINE_LAUNCH_KERNEL(cuLaunchKernel_ptsz)
DEFINE_LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel)
DEFINE_LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel_ptsz)
DEFINE_LAUNCH_EX(cuLaunchKernelEx)
DEFINE_LAUNCH_EX(cuLaunchKernelEx_ptsz)
DEFINE_GRAPH_LAUNCH(cuGraphLaunch)
DEFINE_GRAPH_LAUNCH(cuGraphLaunch_ptsz)
