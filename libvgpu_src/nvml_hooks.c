/* NVML as the container sees it: its card is `limit` big, holds what the
 * container's processes use, and runs only the container's processes. */
#include "internal.h"
#include "hooks.h"

/* Hooked so that a process libvgpu refuses (hooks.h) never starts NVML. */
HAMI_HOOK_VOID(nvmlReturn_t, nvmlInit)
{
    return real();
}

HAMI_HOOK_VOID(nvmlReturn_t, nvmlInit_v2)
{
    return real();
}

HAMI_HOOK(nvmlReturn_t, nvmlInitWithFlags, (unsigned int flags), (flags))
{
    return real(flags);
}

/* Rewrites total/used/free for `dev` when it has a limit (hami_mem_view). */
static void virtualise(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used,
                       unsigned long long *free)
{
    uint64_t t = *total, u = *used, f = *free;
    if (hami_mem_view(hami_region_nvml_index(dev), &t, &u, &f)) {
        *total = t;
        *used = u;
        *free = f;
    }
}

HAMI_HOOK(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t *memory),
          (device, memory))
{
    nvmlReturn_t rc = real(device, memory);
    if (rc == NVML_SUCCESS && memory)
        virtualise(device, &memory->total, &memory->used, &memory->free);
    return rc;
}

HAMI_HOOK(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t *memory),
          (device, memory))
{
    nvmlReturn_t rc = real(device, memory);
    if (rc == NVML_SUCCESS && memory && hami_mem_limit(hami_region_nvml_index(device))) {
        memory->reserved = 0;
        virtualise(device, &memory->total, &memory->used, &memory->free);
    }
    return rc;
}

/* Keeps the container's own processes (by slot pid or host pid), in order. Only
 * when the limits name devices (a runtime-made container): bare use shows all. */
#define FILTER_PROCESSES(infos, count)                                   \
    do {                                                                 \
        unsigned int kept_ = 0;                                          \
        for (unsigned int i_ = 0; i_ < (count); i_++)                    \
            if (hami_region_has_pid((infos)[i_].pid))                    \
                (infos)[kept_++] = (infos)[i_];                          \
        (count) = kept_;                                                 \
    } while (0)

static int filtering(nvmlDevice_t device)
{
    const struct hami_limits *l = hami_limits_get();
    return l && hami_mem_limit(hami_region_nvml_index(device)) && l->devices[0].uuid[0];
}

#define DEFINE_RUNNING_PROCESSES(name, info_type)                                              \
    HAMI_HOOK(nvmlReturn_t, name, (nvmlDevice_t device, unsigned int *infoCount, info_type *infos), \
              (device, infoCount, infos))                                                     \
    {                                                                                         \
        nvmlReturn_t rc = real(device, infoCount, infos);                                     \
        if (rc == NVML_SUCCESS && infoCount && infos && filtering(device))                    \
            FILTER_PROCESSES(infos, *infoCount);                                              \
        return rc;                                                                            \
    }

DEFINE_RUNNING_PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
DEFINE_RUNNING_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
DEFINE_RUNNING_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
