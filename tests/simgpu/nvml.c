/* NVML of the simulated machine: devices from the config, memory and processes from
 * the shared state, utilisation from the kernels booked on each device's timeline. */
#include "sim.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

struct nvml_device { int index; };        /* visible index (see sim.h) */

static struct nvml_device devices[SIM_MAX_DEVICES];
struct nvml_mig { int instance; };       /* sim_config()->mig_instance[instance] */
static struct nvml_mig mig_handles[SIM_MAX_MIG];
static int init_count;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int attached[SIM_MAX_DEVICES];    /* visible indices this process's NVML has initialised */
static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;

#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFu

static nvmlReturn_t init(void)
{
    if (!sim_config())
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!sim_state())
        return NVML_ERROR_UNKNOWN;
    pthread_mutex_lock(&init_lock);
    if (init_count == 0)
        sim_sleep_us(sim_config()->nvml_init_us);  /* under the lock: the others wait for it */
    for (int i = 0; i < SIM_MAX_DEVICES; i++)
        devices[i].index = i;
    for (int i = 0; i < SIM_MAX_MIG; i++)
        mig_handles[i].instance = i;
    init_count++;
    pthread_mutex_unlock(&init_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return init(); }
nvmlReturn_t nvmlInit(void) { return init(); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;  /* NO_GPUS / NO_ATTACH change nothing for simulated devices */
    return init();
}

nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&init_lock);
    if (init_count == 0) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else if (--init_count == 0) {  /* NVML's state goes: a new start initialises the GPUs again */
        pthread_mutex_lock(&attach_lock);
        memset(attached, 0, sizeof attached);
        pthread_mutex_unlock(&attach_lock);
    }
    pthread_mutex_unlock(&init_lock);
    return rc;
}

#define SIM_NVML_TEXT(name, value, text) case name: return text;

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
        HAMI_NVML_RETURNS(SIM_NVML_TEXT)
    }
    return "Unknown Error";
}

static int initialised(void) { return __atomic_load_n(&init_count, __ATOMIC_ACQUIRE) > 0; }

#define REQUIRE_INIT() do { if (!initialised()) return NVML_ERROR_UNINITIALIZED; } while (0)

/* `nvml_attach_us`: NVML initialises a GPU at the process's first handle of it (a real
 * driver's first access to that GPU; the process's other callers wait for it). */
static void attach(int index)
{
    pthread_mutex_lock(&attach_lock);
    if (!attached[index])
        sim_sleep_us(sim_config()->nvml_attach_us);
    attached[index] = 1;
    pthread_mutex_unlock(&attach_lock);
}

static nvmlReturn_t handed(nvmlDevice_t *device, int index)
{
    attach(index);
    *device = (nvmlDevice_t)&devices[index];
    return NVML_SUCCESS;
}

/* The device index behind a handle, or -1 when the handle is not one of ours. */
static int device_of(nvmlDevice_t handle)
{
    struct nvml_device *d = (struct nvml_device *)handle;
    if (d < devices || d >= devices + sim_config()->visible)
        return -1;
    return d->index;
}

/* The MIG instance behind a handle, or NULL when it is not a MIG handle of ours. */
static const struct sim_mig *mig_of(nvmlDevice_t handle)
{
    struct nvml_mig *m = (struct nvml_mig *)handle;
    if (!initialised() || m < mig_handles || m >= mig_handles + sim_config()->mig_count)
        return NULL;
    return &sim_config()->mig_instance[m->instance];
}

#define REQUIRE_DEVICE(handle, idx) \
    REQUIRE_INIT(); \
    int idx = device_of(handle); \
    if (idx < 0) return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t copy_string(const char *text, char *out, unsigned int length)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    REQUIRE_INIT();
    return copy_string(sim_config()->driver_version, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    REQUIRE_INIT();
    *cudaDriverVersion = sim_config()->cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    REQUIRE_INIT();
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned)sim_config()->visible;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!device || index >= (unsigned)sim_config()->visible)
        return NVML_ERROR_INVALID_ARGUMENT;
    return handed(device, (int)index);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* as NVML documents it: by index and PCI bus id only the GPU asked for is
     * initialised, by UUID each one searched on the way to it */
    for (int i = 0; i < sim_config()->visible; i++) {
        char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        attach(i);
        sim_device_uuid_string(i, text, sizeof text);
        if (!strcmp(text, uuid))
            return handed(device, i);
    }
    return NVML_ERROR_NOT_FOUND;
}

/* "[domain:]bus:device.function", hexadecimal, as nvmlPciInfo_t's busId and cuDeviceGetPCIBusId write it. */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    unsigned domain = 0, bus, slot, function;
    char end;
    if (!pciBusId || !device ||
        (sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &slot, &function, &end) != 4 &&
         (domain = 0, sscanf(pciBusId, "%x:%x.%x%c", &bus, &slot, &function, &end) != 3)))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < sim_config()->visible; i++)
        if (domain == 0 && bus == (unsigned)sim_device_pci_bus(i) && slot == 0 && function == 0)
            return handed(device, i);
    return NVML_ERROR_NOT_FOUND;
}

/* A simulated card has no NVLink: every link query is not supported, as on a PCIe card. */
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    REQUIRE_DEVICE(device, idx);
    (void)idx;
    (void)link;
    return pNvLinkDeviceType ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    REQUIRE_DEVICE(device, idx);
    (void)idx;
    (void)link;
    return pci ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    const struct sim_mig *mig = mig_of(device);
    if (mig) {
        sim_mig_uuid_string(mig, text, sizeof text);
        return copy_string(text, uuid, length);
    }
    REQUIRE_DEVICE(device, idx);
    sim_device_uuid_string(idx, text, sizeof text);
    return copy_string(text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    const struct sim_mig *mig = mig_of(device);
    if (mig) {  /* as NVML names them: "<model> MIG <slices>g.<GiB>gb", of 7 slices */
        char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE + 32];
        uint64_t slices = mig->memory_mib * 7 / sim_config()->memory_mib;
        snprintf(text, sizeof text, "%s MIG %llug.%llugb", sim_config()->name,
                 (unsigned long long)(slices ? slices : 1), (unsigned long long)(mig->memory_mib / 1024));
        return copy_string(text, name, length);
    }
    REQUIRE_DEVICE(device, idx);
    (void)idx;
    return copy_string(sim_config()->name, name, length);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    REQUIRE_DEVICE(device, idx);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)idx;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    REQUIRE_DEVICE(device, idx);
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = (unsigned)sim_card(idx);  /* the card's node, not its visible index */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    REQUIRE_DEVICE(device, idx);
    (void)idx;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = SIM_SM_VERSION / 10;
    *minor = SIM_SM_VERSION % 10;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    REQUIRE_DEVICE(device, idx);
    (void)idx;
    if (!type)
        return NVML_ERROR_INVALID_ARGUMENT;
    *type = sim_config()->brand;
    return NVML_SUCCESS;
}

static void memory_of(int idx, uint64_t *total, uint64_t *used)
{
    *total = sim_config()->memory_mib * SIM_MIB;
    *used = sim_device_used(idx);
    if (*used > *total)
        *used = *total;
}

/* A MIG instance's memory is its own; the simulator books no use on it. */
static nvmlReturn_t memory_of_handle(nvmlDevice_t device, uint64_t *total, uint64_t *used)
{
    const struct sim_mig *mig = mig_of(device);
    if (mig) {
        *total = mig->memory_mib * SIM_MIB;
        *used = 0;
        return NVML_SUCCESS;
    }
    REQUIRE_DEVICE(device, idx);
    memory_of(idx, total, used);
    return NVML_SUCCESS;
}

/* `nvml_memory_info_us`: the memory query of a driver that is slow or hangs. */
static void memory_info_delay(void) { sim_sleep_us(sim_config()->nvml_memory_info_us); }

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    memory_info_delay();
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t total, used;
    nvmlReturn_t rc = memory_of_handle(device, &total, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    memory_info_delay();
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t total, used;
    nvmlReturn_t rc = memory_of_handle(device, &total, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    REQUIRE_DEVICE(device, idx);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    unsigned bus = (unsigned)sim_device_pci_bus(idx);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", bus);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", bus);
    pci->domain = 0;
    pci->bus = bus;
    pci->device = 0;
    pci->pciDeviceId = SIM_PCI_DEVICE_ID;
    pci->pciSubSystemId = SIM_PCI_SUBSYSTEM_ID;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    REQUIRE_DEVICE(device, idx);
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = sim_now_ns();
    uint64_t busy = sim_busy_ns(idx, 0, now - SIM_UTIL_WINDOW_NS, now);
    utilization->gpu = (unsigned)((busy * 100 + SIM_UTIL_WINDOW_NS / 2) / SIM_UTIL_WINDOW_NS);
    utilization->memory = 0;
    return NVML_SUCCESS;
}

/* Per-process utilisation as NVML documents it: the driver samples each process's SM use over
 * periods of `util_period_ms` ("between 1 second and 1/6 second, depending on the product"),
 * recorded at each period's end (periods aligned to the monotonic clock), the last four seconds'
 * kept. A query returns, for each process that ran in the periods recorded after
 * `lastSeenTimeStamp` (0: the last second's), its busy share of them, stamped (CPU time, µs)
 * with the newest one's end: so a
 * caller that passes the stamp it was last given reads exactly the periods since, and one that
 * passes "a second ago" reads periods that end up to a period before now. The caller's buffer
 * must hold the driver's whole sample buffer, however few samples there are: a smaller one
 * gets INSUFFICIENT_SIZE and that size (the documented sizing call answers it; drivers are
 * reported to answer 100 whatever ran, and on an H200 a 64-entry buffer never got a figure). */
#define SIM_UTIL_SAMPLE_BUFFER 100
#define SIM_UTIL_KEPT_NS (4 * SIM_UTIL_WINDOW_NS)

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    REQUIRE_DEVICE(device, idx);
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = sim_now_ns(), period = sim_config()->util_period_ms * 1000000ULL;
    uint64_t newest = now / period * period;                  /* the newest recorded period's end */
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t real_now_us = (uint64_t)rt.tv_sec * 1000000ULL + (uint64_t)rt.tv_nsec / 1000ULL;
    uint64_t stamp = real_now_us - (now - newest) / 1000ULL;
    /* from the start of the oldest period recorded after lastSeenTimeStamp, as far back as they are kept */
    uint64_t kept = newest > SIM_UTIL_KEPT_NS ? newest - SIM_UTIL_KEPT_NS : 0;
    uint64_t from = newest > SIM_UTIL_WINDOW_NS ? newest - SIM_UTIL_WINDOW_NS : 0;
    if (lastSeenTimeStamp && lastSeenTimeStamp < stamp && (real_now_us - lastSeenTimeStamp) * 1000ULL < now - kept) {
        /* on the monotonic clock; 10 us for the two clocks' rounding: a stamp given is a period's end */
        uint64_t seen_ns = now - (real_now_us - lastSeenTimeStamp) * 1000ULL + 10000ULL;
        from = seen_ns / period * period;
        from = from < kept ? kept : from;
    }
    uint32_t pids[SIM_MAX_PROCS];
    uint64_t last_end[SIM_MAX_PROCS];
    unsigned found = lastSeenTimeStamp >= stamp ? 0 : sim_busy_pids(idx, from, newest, pids, last_end, SIM_MAX_PROCS);
    unsigned n = 0;
    nvmlProcessUtilizationSample_t samples[SIM_MAX_PROCS];
    for (unsigned i = 0; i < found && newest > from; i++) {
        uint64_t busy = sim_busy_ns(idx, pids[i], from, newest), span = newest - from;
        samples[n++] = (nvmlProcessUtilizationSample_t){
            .pid = pids[i], .timeStamp = stamp, .smUtil = (unsigned)((busy * 100 + span / 2) / span)};
    }
    if (n == 0) {
        *processSamplesCount = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    unsigned wanted = n > SIM_UTIL_SAMPLE_BUFFER ? n : SIM_UTIL_SAMPLE_BUFFER;
    if (!utilization || *processSamplesCount < wanted) {
        *processSamplesCount = wanted;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(utilization, samples, n * sizeof *samples);
    *processSamplesCount = n;
    return NVML_SUCCESS;
}

/* Processes with a context on the device; fills either layout. */
static nvmlReturn_t running_processes(int idx, unsigned int *infoCount, nvmlProcessInfo_v1_t *v1,
                                      nvmlProcessInfo_t *v2)
{
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_proc_usage procs[SIM_MAX_PROCS];
    unsigned n = sim_device_procs(idx, procs, SIM_MAX_PROCS);
    if (*infoCount < n || (n > 0 && !v1 && !v2)) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        if (v1)
            v1[i] = (nvmlProcessInfo_v1_t){procs[i].pid, procs[i].used};
        else
            v2[i] = (nvmlProcessInfo_t){procs[i].pid, procs[i].used, NVML_VALUE_NOT_AVAILABLE,
                                        NVML_VALUE_NOT_AVAILABLE};
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    REQUIRE_DEVICE(device, idx);
    return running_processes(idx, infoCount, infos, NULL);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    REQUIRE_DEVICE(device, idx);
    return running_processes(idx, infoCount, NULL, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    REQUIRE_DEVICE(device, idx);
    return running_processes(idx, infoCount, NULL, infos);
}

/* ---- MIG: a card with instances in the config (`mig`) is in MIG mode ---- */

static int card_in_mig_mode(int card)
{
    for (int i = 0; i < sim_config()->mig_count; i++)
        if (sim_config()->mig_instance[i].card == card)
            return 1;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    REQUIRE_DEVICE(device, idx);
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = *pendingMode = card_in_mig_mode(sim_card(idx)) ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    REQUIRE_DEVICE(device, idx);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = card_in_mig_mode(sim_card(idx)) ? SIM_MIG_PER_CARD : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    REQUIRE_DEVICE(device, idx);
    if (!migDevice || index >= SIM_MIG_PER_CARD)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!card_in_mig_mode(sim_card(idx)))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int seen = 0;
    for (int i = 0; i < sim_config()->mig_count; i++) {
        if (sim_config()->mig_instance[i].card == sim_card(idx) && seen++ == index) {
            *migDevice = (nvmlDevice_t)&mig_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    const struct sim_mig *mig = mig_of(migDevice);
    if (!mig || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int dev = 0; dev < sim_config()->visible; dev++) {
        if (sim_card(dev) == mig->card) {
            *device = (nvmlDevice_t)&devices[dev];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    REQUIRE_INIT();
    if (!isMigDevice || (!mig_of(device) && device_of(device) < 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = mig_of(device) != NULL;
    return NVML_SUCCESS;
}

/* A MIG instance's GPU or compute instance id; a GPU's handle has neither. */
static nvmlReturn_t instance_id(nvmlDevice_t device, unsigned int *id, int compute)
{
    REQUIRE_INIT();
    const struct sim_mig *mig = mig_of(device);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig)
        return device_of(device) < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned)(compute ? mig->compute_instance : mig->gpu_instance);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) { return instance_id(device, id, 0); }

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, id, 1);
}
