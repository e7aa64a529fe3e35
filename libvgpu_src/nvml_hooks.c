/* NVML as the container sees it: its card is `limit` big, holds what the
 * container's processes use, and runs only the container's processes. */
#include "internal.h"
#include "hooks.h"

static unsigned long long min_ull(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}

/* Rewrites total/used/free for `dev` when it has a limit; free never underflows.
 * Oversubscribed (HAMI_DEVICE_SPILL), the card is the limit, whatever its physical size. */
static void virtualise(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used,
                       unsigned long long *free)
{
    int index = hami_region_nvml_index(dev);
    uint64_t limit = hami_mem_limit(index);
    if (!limit)
        return;
    int spills = hami_mem_spill(index);
    unsigned long long cap = spills ? limit : min_ull(limit, *total);
    unsigned long long mine = min_ull(hami_mem_container_used(index), cap);
    unsigned long long physical_free = *free;
    *total = cap;
    *used = mine;
    *free = spills ? cap - mine : min_ull(cap - mine, physical_free);
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
 * when the region names devices (a runtime-made region): bare use shows all. */
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
    struct hami_region *r = hami_region_get();
    return r && hami_mem_limit(hami_region_nvml_index(device)) && r->devices[0].uuid[0];
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
