/* NVML's handle of a CUDA device: NVML started once per process, each device's handle
 * found once. A GPU is found by its PCI bus id, which has NVML initialise that GPU alone;
 * by UUID NVML may initialise every GPU it searches on the way (NVML's documentation),
 * each a first access to a GPU (~6 ms on an H200), so a process on the last GPU of a
 * multi-GPU container would pay for all of them. A MIG instance is found by its MIG- UUID
 * as the limits write it: its bus id is its GPU's, whose processes are not the instance's.
 * A GPU its bus id does not find is looked for by UUID. */
#include "internal.h"
#include "hooks.h"
#include "log.h"

#include <pthread.h>
#include <string.h>
#include <strings.h>


static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_ready;
static nvmlDevice_t handles[HAMI_MAX_ORDINALS];

static void nvml_start(void)
{
    nvmlReturn_t (*init)(void) = HAMI_DRIVER(nvmlInit_v2);
    nvml_ready = init && init() == NVML_SUCCESS;
    if (!nvml_ready)
        hami_warn("NVML unavailable: context memory is not measured");
}

/* The limits' MIG- UUID of `dev` into `out`: 0, or -1 when the limits name no MIG instance for it. */
static int mig_uuid(CUdevice dev, char *out, size_t len)
{
    const struct hami_limits *l = hami_limits_get();
    int index = hami_region_device_index(dev);
    if (!l || index < 0 || len < HAMI_UUID_LEN)
        return -1;
    memcpy(out, l->devices[index].uuid, HAMI_UUID_LEN);
    out[HAMI_UUID_LEN - 1] = '\0';
    return strncasecmp(out, "MIG-", 4) == 0 ? 0 : -1;
}

nvmlDevice_t hami_nvml_device(CUdevice dev)
{
    if (dev < 0 || dev >= HAMI_MAX_ORDINALS)
        return NULL;
    nvmlDevice_t handle = __atomic_load_n(&handles[dev], __ATOMIC_ACQUIRE);
    if (handle)
        return handle;
    pthread_once(&nvml_once, nvml_start);
    if (!nvml_ready)
        return NULL;
    char id[HAMI_UUID_LEN];
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *) = HAMI_DRIVER(nvmlDeviceGetHandleByUUID);
    nvmlReturn_t (*by_bus_id)(const char *, nvmlDevice_t *) = HAMI_DRIVER(nvmlDeviceGetHandleByPciBusId_v2);
    CUresult (*bus_id_of)(char *, int, CUdevice) = HAMI_DRIVER(cuDeviceGetPCIBusId);
    nvmlReturn_t rc = NVML_ERROR_FUNCTION_NOT_FOUND;
    int mig = mig_uuid(dev, id, sizeof id) == 0;
    if (!mig && by_bus_id && bus_id_of && bus_id_of(id, (int)sizeof id, dev) == CUDA_SUCCESS &&
        (rc = by_bus_id(id, &handle)) != NVML_SUCCESS)
        hami_info("device %d: NVML does not know PCI bus id %s (%d): looked for by UUID", dev, id, (int)rc);
    /* a MIG instance, or a GPU its bus id did not find */
    if (rc != NVML_SUCCESS && by_uuid && (mig || hami_cuda_uuid(dev, id, sizeof id) == 0))
        rc = by_uuid(id, &handle);
    if (rc != NVML_SUCCESS) {
        hami_debug("device %d: no NVML handle (%d)", dev, (int)rc);
        return NULL;
    }
    __atomic_store_n(&handles[dev], handle, __ATOMIC_RELEASE);
    return handle;
}
