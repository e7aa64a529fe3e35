/* Launch hooks: each passes through activity (activity.h: the process stamps its
 * container's work; a low-priority process waits while high-priority work is
 * active) and then the SM limiter (sm_limiter.h) on the region index of the
 * launching context's device. Activity comes first: it may sleep, and the
 * limiter holds a lock from its before_launch to its after_launch. A launch into
 * a capturing stream runs nothing (it becomes a graph node): it goes to the
 * driver untouched, neither waited for, throttled, measured nor stamped
 * (capture.h); the graph's launches are what run, and those are held. */
#include "internal.h"
#include "hooks.h"
#include "activity.h"
#include "sm_limiter.h"
#include "capture.h"
#include "graph_memory.h"

/* The launching device's region index, or -1 at once when no device has an SM
 * limit (read live: the runtime may change limits), sparing the driver query on
 * every launch of an unlimited container. */
static int launch_device_index(void)
{
    const struct hami_limits *l = hami_limits_get();
    if (!l)
        return -1;
    uint32_t count = l->device_count < HAMI_MAX_DEVICES ? l->device_count : HAMI_MAX_DEVICES;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t limit = __atomic_load_n(&l->devices[i].sm_limit, __ATOMIC_RELAXED);
        if (limit > 0 && limit < 100)
            return hami_current_device_index(NULL);
    }
    return -1;
}

/* The limiter records its events on `stream` with the legacy-stream entry points,
 * so a NULL stream of a per-thread-default-stream launch (_ptsz) is named
 * explicitly as CU_STREAM_PER_THREAD. */
#define LIMITER_STREAM(stream, per_thread)                                                          \
    ((stream) || !(per_thread) ? (stream) : CU_STREAM_PER_THREAD)

/* Every launch form: through activity and the limiter, then `call`, the real entry
 * point. Whether the stream captures is asked only where something would be done
 * to the launch (a limit or a board), so an unlimited container pays nothing. */
#define LAUNCH(stream, call)                                                                        \
    do {                                                                                            \
        int dev_ = launch_device_index();                                                           \
        if ((dev_ >= 0 || hami_boards_configured()) && hami_stream_capturing(stream))               \
            return (call);                                                                          \
        int act_ = hami_activity_before_launch();                                                   \
        hami_sm_before_launch(dev_, (stream));                                                      \
        CUresult rc_ = (call);                                                                      \
        hami_sm_after_launch(dev_, (stream), rc_);                                                  \
        hami_activity_end(act_);                                                                    \
        return rc_;                                                                                 \
    } while (0)

#define KERNEL_PARAMS                                                                               \
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,              \
        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                     \
        unsigned int sharedMemBytes, CUstream hStream
#define KERNEL_ARGS                                                                                 \
    f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream

#define DEFINE_LAUNCH_KERNEL(name, per_thread)                                                      \
    HAMI_HOOK(CUresult, name, (KERNEL_PARAMS, void **kernelParams, void **extra),                   \
              (KERNEL_ARGS, kernelParams, extra))                                                   \
    {                                                                                               \
        LAUNCH(LIMITER_STREAM(hStream, per_thread), real(KERNEL_ARGS, kernelParams, extra));        \
    }

#define DEFINE_LAUNCH_COOPERATIVE(name, per_thread)                                                 \
    HAMI_HOOK(CUresult, name, (KERNEL_PARAMS, void **kernelParams), (KERNEL_ARGS, kernelParams))    \
    {                                                                                               \
        LAUNCH(LIMITER_STREAM(hStream, per_thread), real(KERNEL_ARGS, kernelParams));               \
    }

#define DEFINE_LAUNCH_EX(name, per_thread)                                                          \
    HAMI_HOOK(CUresult, name,                                                                       \
              (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),      \
              (config, f, kernelParams, extra))                                                     \
    {                                                                                               \
        LAUNCH(LIMITER_STREAM(config ? config->hStream : NULL, per_thread),                         \
               real(config, f, kernelParams, extra));                                               \
    }

/* A graph launch also commits the graph's memory (graph_memory.h), after any wait for
 * the share and right around the driver's call; the per-thread stream named explicitly
 * means the same to either entry point. */
#define DEFINE_GRAPH_LAUNCH(name, per_thread)                                                       \
    HAMI_HOOK(CUresult, name, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))    \
    {                                                                                               \
        LAUNCH(LIMITER_STREAM(hStream, per_thread),                                                 \
               hami_graph_commit(hGraphExec, real, LIMITER_STREAM(hStream, per_thread)));           \
    }

DEFINE_LAUNCH_KERNEL(cuLaunchKernel, 0)
DEFINE_LAUNCH_KERNEL(cuLaunchKernel_ptsz, 1)
DEFINE_LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel, 0)
DEFINE_LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel_ptsz, 1)
DEFINE_LAUNCH_EX(cuLaunchKernelEx, 0)
DEFINE_LAUNCH_EX(cuLaunchKernelEx_ptsz, 1)
DEFINE_GRAPH_LAUNCH(cuGraphLaunch, 0)
DEFINE_GRAPH_LAUNCH(cuGraphLaunch_ptsz, 1)
