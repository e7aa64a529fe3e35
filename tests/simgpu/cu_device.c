/* Driver API: initialisation, versions, error strings and device queries. */
#include "sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int sim_cuda_initialised;
static int forked_after_init;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static void child_after_fork(void)
{
    /* As with the real driver, a forked child cannot use its parent's CUDA state. */
    if (sim_cuda_initialised) {
        forked_after_init = 1;
        sim_cuda_initialised = 0;
    }
}

CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (forked_after_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (sim_cuda_initialised)
        return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&init_lock);
    if (!sim_cuda_initialised) {
        /* a bad config, or a container given no GPU node: the real driver also fails here */
        if (!sim_config() || sim_config()->visible == 0)
            rc = CUDA_ERROR_NO_DEVICE;
        else if (!sim_state())
            rc = CUDA_ERROR_OPERATING_SYSTEM;
        else {
            pthread_atfork(NULL, NULL, child_after_fork);
            __atomic_store_n(&sim_cuda_initialised, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&init_lock);
    return rc;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_config *cfg = sim_config();
    *driverVersion = cfg ? cfg->cuda_version : 12040;
    return CUDA_SUCCESS;
}

#define SIM_RESULT_NAME(name, value, text) case name: *pStr = #name; return CUDA_SUCCESS;
#define SIM_RESULT_TEXT(name, value, text) case name: *pStr = text; return CUDA_SUCCESS;

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
        HAMI_CU_RESULTS(SIM_RESULT_NAME)
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
        HAMI_CU_RESULTS(SIM_RESULT_TEXT)
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

static int valid_device(CUdevice dev)
{
    const struct sim_config *cfg = sim_config();
    return cfg && dev >= 0 && dev < cfg->visible;
}

#define REQUIRE_DEVICE(dev) do { SIM_REQUIRE_INIT(); if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE; } while (0)

CUresult cuDeviceGetCount(int *count)
{
    SIM_REQUIRE_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = sim_config()->visible;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    SIM_REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    REQUIRE_DEVICE(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", sim_config()->name);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    REQUIRE_DEVICE(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    sim_device_uuid(dev, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REQUIRE_DEVICE(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = sim_config()->memory_mib * SIM_MIB;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    REQUIRE_DEVICE(dev);
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", sim_device_pci_bus(dev));
    return CUDA_SUCCESS;
}

/* Attribute values of the simulated card: an H100 SXM's (compute capability 9.0), except where the
 * simulator lacks the feature (no peer access, compressible memory, persisting L2, NVLink, multicast,
 * IPC events or pool export): those read 0, as does every attribute not listed. */
#define SIM_ATTRIBUTES(X, cfg, dev) \
    X(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024) \
    X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024) \
    X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024) \
    X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64) \
    X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647) \
    X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535) \
    X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535) \
    X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152) \
    X(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536) \
    X(CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32) \
    X(CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647) \
    X(CU_DEVICE_ATTRIBUTE_REGISTERS_PER_BLOCK, 65536) \
    X(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000) \
    X(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512) \
    X(CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1) \
    X(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, (cfg)->sms) \
    X(CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0) \
    X(CU_DEVICE_ATTRIBUTE_INTEGRATED, 0) \
    X(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1) \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, 131072) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH, 131072) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT, 65536) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH, 16384) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT, 16384) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH, 16384) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS, 2048) \
    X(CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT, 512) \
    X(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1) \
    X(CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1) \
    X(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, sim_device_pci_bus(dev)) \
    X(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0) \
    X(CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0) \
    X(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000) \
    X(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120) \
    X(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800) \
    X(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048) \
    X(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3) \
    X(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS, 2048) \
    X(CU_DEVICE_ATTRIBUTE_CAN_TEX2D_GATHER, 1) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE, 8192) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE, 8192) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE, 32768) \
    X(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0) \
    X(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS, 2046) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH, 131072) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT, 65536) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH, 16384) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT, 16384) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH, 16384) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS, 2048) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS, 2048) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS, 2046) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH, 268435456) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH, 131072) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT, 65000) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH, 2097120) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT, 32768) \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, SIM_SM_VERSION / 10) \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, SIM_SM_VERSION % 10) \
    X(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH, 32768) \
    X(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, SIM_SM_SHARED_BYTES) \
    X(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536) \
    X(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1) \
    X(CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0) \
    X(CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID, sim_card(dev)) \
    X(CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2) \
    X(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1) \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1) \
    X(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1) \
    X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448) \
    X(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32) \
    X(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024) \
    X(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1) \
    X(CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, 4) \
    X(CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED, 1) \
    X(CU_DEVICE_ATTRIBUTE_NUMA_ID, -1) \
    X(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1) \
    X(CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID, SIM_PCI_DEVICE_ID) \
    X(CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID, SIM_PCI_SUBSYSTEM_ID)

#define SIM_ATTRIBUTE_CASE(attr, value) case attr: *pi = (value); return CUDA_SUCCESS;

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    REQUIRE_DEVICE(dev);
    if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_config *cfg = sim_config();
    switch (attrib) {
        SIM_ATTRIBUTES(SIM_ATTRIBUTE_CASE, cfg, dev)
    default:
        if (getenv("HAMI_SIM_TRACE"))
            fprintf(stderr, "hami-sim: device attribute %d is not simulated: reads 0\n", (int)attrib);
        *pi = 0;
        return CUDA_SUCCESS;
    }
}
