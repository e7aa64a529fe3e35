/* Launch hooks: each passes through the SM limiter (sm_limiter.h) on the region
 * index of the launching context's device. */
#include "internal.h"
#include "hooks.h"
#include "sm_limiter.h"

#define LAUNCH(name, stream, ...)                                    \
    do {                                                             \
        __typeof__(&name) real_ = HAMI_REAL(name);                   \
        if (!real_)                                                  \
            return CUDA_ERROR_NOT_FOUND;                       \
        if (hami_in_driver)                                          \
            return real_(__VA_ARGS__);                               \
        int dev_ = hami_current_device_index(NULL);                  \
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
