/*
 * Every symbol libvgpu interposes, in one list: X(name, library). The export
 * table, the dlsym map and the cuGetProcAddress map (interpose.c) and the ids
 * used to reach the real driver's entry points are all generated from it.
 * Each listed name is defined once, with its real prototype, by a hook file,
 * through HAMI_HOOK (below).
 */
#ifndef HAMI_HOOKS_H
#define HAMI_HOOKS_H

#include "internal.h"

#define HAMI_HOOKS(X) \
    X(cuInit, CUDA) \
    X(cuGetProcAddress, CUDA) \
    X(cuGetProcAddress_v2, CUDA) \
    X(cuDeviceTotalMem_v2, CUDA) \
    X(cuDevicePrimaryCtxRetain, CUDA) \
    X(cuDevicePrimaryCtxRelease, CUDA) \
    X(cuDevicePrimaryCtxRelease_v2, CUDA) \
    X(cuDevicePrimaryCtxReset, CUDA) \
    X(cuDevicePrimaryCtxReset_v2, CUDA) \
    X(cuCtxCreate_v2, CUDA) \
    X(cuCtxCreate_v3, CUDA) \
    X(cuCtxCreate_v4, CUDA) \
    X(cuCtxDestroy_v2, CUDA) \
    X(cuMemGetInfo_v2, CUDA) \
    X(cuMemAlloc_v2, CUDA) \
    X(cuMemAllocPitch_v2, CUDA) \
    X(cuMemAllocManaged, CUDA) \
    X(cuMemFree_v2, CUDA) \
    X(cuMemAllocAsync, CUDA) \
    X(cuMemAllocAsync_ptsz, CUDA) \
    X(cuMemAllocFromPoolAsync, CUDA) \
    X(cuMemAllocFromPoolAsync_ptsz, CUDA) \
    X(cuMemFreeAsync, CUDA) \
    X(cuMemFreeAsync_ptsz, CUDA) \
    X(cuMemPoolCreate, CUDA) \
    X(cuMemPoolTrimTo, CUDA) \
    X(cuMemPoolDestroy, CUDA) \
    X(cuMemCreate, CUDA) \
    X(cuMemRelease, CUDA) \
    X(cuMemMap, CUDA) \
    X(cuMemUnmap, CUDA) \
    X(cuArrayCreate_v2, CUDA) \
    X(cuArray3DCreate_v2, CUDA) \
    X(cuArrayDestroy, CUDA) \
    X(cuLaunchKernel, CUDA) \
    X(cuLaunchKernel_ptsz, CUDA) \
    X(cuLaunchKernelEx, CUDA) \
    X(cuLaunchKernelEx_ptsz, CUDA) \
    X(cuLaunchCooperativeKernel, CUDA) \
    X(cuLaunchCooperativeKernel_ptsz, CUDA) \
    X(cuGraphLaunch, CUDA) \
    X(cuGraphLaunch_ptsz, CUDA) \
    X(cuGraphInstantiate, CUDA) \
    X(cuGraphInstantiate_v2, CUDA) \
    X(cuGraphInstantiateWithFlags, CUDA) \
    X(cuGraphInstantiateWithParams, CUDA) \
    X(cuGraphInstantiateWithParams_ptsz, CUDA) \
    X(cuGraphUpload, CUDA) \
    X(cuGraphUpload_ptsz, CUDA) \
    X(cuGraphExecDestroy, CUDA) \
    X(cuDeviceGraphMemTrim, CUDA) \
    X(cuCtxSynchronize, CUDA) \
    X(cuCtxSynchronize_v2, CUDA) \
    X(cuStreamSynchronize, CUDA) \
    X(cuStreamSynchronize_ptsz, CUDA) \
    X(cuEventSynchronize, CUDA) \
    X(cuStreamQuery, CUDA) \
    X(cuStreamQuery_ptsz, CUDA) \
    X(cuEventQuery, CUDA) \
    X(nvmlInit, NVML) \
    X(nvmlInit_v2, NVML) \
    X(nvmlInitWithFlags, NVML) \
    X(nvmlDeviceGetMemoryInfo, NVML) \
    X(nvmlDeviceGetMemoryInfo_v2, NVML) \
    X(nvmlDeviceGetComputeRunningProcesses, NVML) \
    X(nvmlDeviceGetComputeRunningProcesses_v2, NVML) \
    X(nvmlDeviceGetComputeRunningProcesses_v3, NVML)

enum hami_lib { HAMI_LIB_CUDA, HAMI_LIB_NVML, HAMI_LIB_COUNT };

#define HAMI_HOOK_ID(name, lib) HAMI_HOOK_##name,
enum hami_hook_id { HAMI_HOOKS(HAMI_HOOK_ID) HAMI_HOOK_COUNT };
#undef HAMI_HOOK_ID

/* symbols.c: the real entry point behind hook `id` (NULL when the driver lacks it). */
void *hami_real(enum hami_hook_id id);

/* The real driver's `name`, typed as our declaration of it, or NULL. */
#define HAMI_REAL(name) ((__typeof__(&name))hami_real(HAMI_HOOK_##name))
/* Same for driver calls libvgpu makes but does not hook (looked up once per call site). */
#define HAMI_DRIVER(name)                                                          \
    ({                                                                             \
        static void *hami_cached_;                                                 \
        void *hami_fn_ = __atomic_load_n(&hami_cached_, __ATOMIC_ACQUIRE);         \
        if (!hami_fn_) {                                                           \
            hami_fn_ = hami_driver_symbol(#name);                                  \
            __atomic_store_n(&hami_cached_, hami_fn_ ? hami_fn_ : (void *)1,       \
                             __ATOMIC_RELEASE);                                    \
        }                                                                          \
        (__typeof__(&name))(hami_fn_ == (void *)1 ? NULL : hami_fn_);              \
    })

/* The library of each hooked name, and what a hook returns when the driver lacks
 * the real entry point (CUDA and NVML each have their own "not found"). */
#define HAMI_HOOK_LIB(name, lib) HAMI_LIB_OF_##name = HAMI_LIB_##lib,
enum hami_hook_lib { HAMI_HOOKS(HAMI_HOOK_LIB) };
#undef HAMI_HOOK_LIB
#define HAMI_MISSING(name) \
    ((int)HAMI_LIB_OF_##name == (int)HAMI_LIB_CUDA ? (int)CUDA_ERROR_NOT_FOUND : (int)NVML_ERROR_FUNCTION_NOT_FOUND)
/* ... and what every hook returns while libvgpu refuses (hami_refused). */
#define HAMI_REFUSAL(name) \
    ((int)HAMI_LIB_OF_##name == (int)HAMI_LIB_CUDA ? (int)CUDA_ERROR_NOT_PERMITTED : (int)NVML_ERROR_NO_PERMISSION)

/* How many hooks this thread is inside (0 outside libvgpu). */
extern __thread int hami_depth __attribute__((tls_model("initial-exec")));

#define HAMI_UNPAREN(...) __VA_ARGS__

/*
 * Defines hooked entry point `name` (listed above) with parameters `params` and the
 * same names as `args`; the braces that follow are its body, which gets the real
 * entry point as `real` (never NULL). Re-entrancy is decided here, once for every
 * hook: a hook reached while this thread is already inside libvgpu (a driver whose
 * entry points call each other through their exported names, or anything the
 * driver calls back while libvgpu is in it) is the real entry point, tail-called,
 * with no lock taken and nothing charged or throttled. So no body needs to know
 * whether it was called from inside, and a driver's inner call never takes a lock
 * of ours again on the same thread. Other threads (driver callbacks) have their own
 * depth.
 *
 * Failing closed is decided here too: in a runtime-made container whose limits
 * or region cannot be used (hami_refused), every hook, cuInit and nvmlInit among
 * them, returns "not permitted" without reaching the driver, so the process never
 * uses the GPU unlimited.
 */
#define HAMI_HOOK(ret, name, params, args)                                             \
    HAMI_HOOK_DEFINE(ret, name, params, args,                                            \
                     (__typeof__(&name) real __attribute__((unused)), HAMI_UNPAREN params), \
                     (real, HAMI_UNPAREN args))

/* HAMI_HOOK for an entry point that takes no parameters. */
#define HAMI_HOOK_VOID(ret, name)                                                      \
    HAMI_HOOK_DEFINE(ret, name, (void), (), (__typeof__(&name) real __attribute__((unused))), (real))

/* Both: the body is hami_body_<name> with `body_params`, called with `body_args`. */
#define HAMI_HOOK_DEFINE(ret, name, params, args, body_params, body_args)              \
    static ret hami_body_##name body_params;                                             \
    HAMI_EXPORT ret name params                                                          \
    {                                                                                    \
        __typeof__(&name) real = HAMI_REAL(name);                                        \
        if (!real)                                                                       \
            return (ret)HAMI_MISSING(name);                                              \
        if (hami_depth)                                                                  \
            return real args;                                                            \
        if (__builtin_expect(hami_refused(), 0))                                         \
            return (ret)HAMI_REFUSAL(name);                                              \
        hami_depth++;                                                                    \
        ret rc = hami_body_##name body_args;                                             \
        hami_depth--;                                                                    \
        return rc;                                                                       \
    }                                                                                    \
    static ret hami_body_##name body_params

#endif
