/*
 * The part of the CUDA driver API that libvgpu and the simulated driver use,
 * declared here so that neither needs the CUDA toolkit to build. Names are
 * the exported (versioned) symbol names; there are no renaming macros.
 *
 * With HAMI_CHECK_AGAINST_CUDA_H defined, the types come from the toolkit's
 * cuda.h and only the prototypes below are compiled, so that the compiler
 * checks each of them against the toolkit (tests/libvgpu/test_cuda_decls).
 */
#ifndef HAMI_CUDA_API_H
#define HAMI_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

/* One list of results: the enum and every name/description table come from it. */
#define HAMI_CU_RESULTS(X) \
    X(CUDA_SUCCESS, 0, "no error") \
    X(CUDA_ERROR_INVALID_VALUE, 1, "invalid argument") \
    X(CUDA_ERROR_OUT_OF_MEMORY, 2, "out of memory") \
    X(CUDA_ERROR_NOT_INITIALIZED, 3, "initialization error") \
    X(CUDA_ERROR_DEINITIALIZED, 4, "driver shutting down") \
    X(CUDA_ERROR_STUB_LIBRARY, 34, "CUDA driver is a stub library") \
    X(CUDA_ERROR_NO_DEVICE, 100, "no CUDA-capable device is detected") \
    X(CUDA_ERROR_INVALID_DEVICE, 101, "invalid device ordinal") \
    X(CUDA_ERROR_INVALID_IMAGE, 200, "device kernel image is invalid") \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, 209, "no kernel image is available for execution on the device") \
    X(CUDA_ERROR_INVALID_CONTEXT, 201, "invalid device context") \
    X(CUDA_ERROR_MAP_FAILED, 205, "mapping of buffer object failed") \
    X(CUDA_ERROR_UNMAP_FAILED, 206, "unmapping of buffer object failed") \
    X(CUDA_ERROR_ALREADY_MAPPED, 208, "resource already mapped") \
    X(CUDA_ERROR_NOT_MAPPED, 211, "resource not mapped") \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, 217, "peer access is not supported across the given devices") \
    X(CUDA_ERROR_INVALID_PTX, 218, "a PTX JIT compilation failed") \
    X(CUDA_ERROR_INVALID_SOURCE, 300, "device kernel image is invalid") \
    X(CUDA_ERROR_FILE_NOT_FOUND, 301, "file not found") \
    X(CUDA_ERROR_OPERATING_SYSTEM, 304, "OS call failed or operation not supported on this OS") \
    X(CUDA_ERROR_INVALID_HANDLE, 400, "invalid resource handle") \
    X(CUDA_ERROR_ILLEGAL_STATE, 401, "the operation cannot be performed in the present state") \
    X(CUDA_ERROR_NOT_FOUND, 500, "named symbol not found") \
    X(CUDA_ERROR_NOT_READY, 600, "device not ready") \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, 700, "an illegal memory access was encountered") \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 701, "too many resources requested for launch") \
    X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, 705, "peer access has not been enabled") \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, 708, "primary context active") \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, 709, "context is destroyed") \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712, "part or all of the requested memory range is already mapped") \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, 713, "pointer does not correspond to a registered memory region") \
    X(CUDA_ERROR_LAUNCH_FAILED, 719, "unspecified launch failure") \
    X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, 720, "too many blocks in cooperative launch") \
    X(CUDA_ERROR_NOT_PERMITTED, 800, "operation not permitted") \
    X(CUDA_ERROR_NOT_SUPPORTED, 801, "operation not supported") \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900, "operation not permitted when stream is capturing") \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901, "operation failed due to a previous error during capture") \
    X(CUDA_ERROR_STREAM_CAPTURE_MERGE, 902, "operation would result in a merge of separate capture sequences") \
    X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 903, "capture was not ended in the same stream as it began") \
    X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, 904, "capturing stream has unjoined work") \
    X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, 905, "dependency created on uncaptured work in another stream") \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 906, "operation would make the legacy stream depend on a capturing blocking stream") \
    X(CUDA_ERROR_CAPTURED_EVENT, 907, "operation not permitted on an event last recorded in a capturing stream") \
    X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 908, "attempt to terminate a thread-local capture sequence from another thread") \
    X(CUDA_ERROR_TIMEOUT, 909, "timeout") \
    X(CUDA_ERROR_INVALID_CLUSTER_SIZE, 912, "invalid cluster size") \
    X(CUDA_ERROR_UNKNOWN, 999, "unknown error")

#ifndef HAMI_CHECK_AGAINST_CUDA_H

typedef unsigned long long cuuint64_t;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

typedef struct CUuuid_st { char bytes[16]; } CUuuid;

#define HAMI_CU_RESULT_ENUM(name, value, text) name = value,
typedef enum cudaError_enum { HAMI_CU_RESULTS(HAMI_CU_RESULT_ENUM) } CUresult;
#undef HAMI_CU_RESULT_ENUM

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DEFAULT 0x0
#define CU_EVENT_BLOCKING_SYNC 0x1
#define CU_EVENT_DISABLE_TIMING 0x2

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11,
    CU_DEVICE_ATTRIBUTE_REGISTERS_PER_BLOCK = 12,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT = 14,
    CU_DEVICE_ATTRIBUTE_GPU_OVERLAP = 15,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT = 17,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH = 21,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH = 22,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT = 23,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH = 24,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT = 25,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH = 26,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH = 27,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT = 28,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS = 29,
    CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT = 30,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
    CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_TCC_DRIVER = 35,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH = 42,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS = 43,
    CU_DEVICE_ATTRIBUTE_CAN_TEX2D_GATHER = 44,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH = 45,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT = 46,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE = 47,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE = 48,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE = 49,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT = 51,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH = 52,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH = 53,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS = 54,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH = 55,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH = 56,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT = 57,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH = 58,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT = 59,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH = 60,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH = 61,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS = 62,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH = 63,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT = 64,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS = 65,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH = 66,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH = 67,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS = 68,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH = 69,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH = 70,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT = 71,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH = 72,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH = 73,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT = 74,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH = 77,
    CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED = 78,
    CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED = 79,
    CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED = 80,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD = 84,
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID = 85,
    CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO = 87,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED = 90,
    CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
    CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK = 111,
    CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH = 120,
    CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT = 126,
    CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED = 127,
    CU_DEVICE_ATTRIBUTE_NUMA_ID = 131,
    CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134,
    CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID = 139,
    CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID = 140,
    CU_DEVICE_ATTRIBUTE_MAX = 150
} CUdevice_attribute;

typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2

typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
    CU_MEM_ALLOCATION_TYPE_MANAGED = 0x2,
    CU_MEM_ALLOCATION_TYPE_MAX = 0x7FFFFFFF
} CUmemAllocationType;

typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
    CU_MEM_HANDLE_TYPE_MAX = 0x7FFFFFFF
} CUmemAllocationHandleType;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0x0,
    CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
    CU_MEM_LOCATION_TYPE_HOST = 0x2,
    CU_MEM_LOCATION_TYPE_MAX = 0x7FFFFFFF
} CUmemLocationType;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
    CU_MEM_ACCESS_FLAGS_PROT_MAX = 0x7FFFFFFF
} CUmemAccess_flags;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

typedef enum CUmemPool_attribute_enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH
} CUmemPool_attribute;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef enum CUlaunchAttributeID_enum {
    CU_LAUNCH_ATTRIBUTE_IGNORE = 0,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
} CUlaunchAttributeID;

typedef union CUlaunchAttributeValue_union {
    char pad[64];
    int cooperative;
    struct {
        unsigned int x;
        unsigned int y;
        unsigned int z;
    } clusterDim;
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef int CUjit_option;          /* options are accepted and ignored */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;  /* only passed through */
typedef struct CUctxCreateParams_st CUctxCreateParams;      /* only passed through */

typedef enum CUdriverProcAddress_flags_enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1
} CUdriverProcAddress_flags;

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

#endif /* HAMI_CHECK_AGAINST_CUDA_H */

/* Calls that take the default stream exist twice in the driver: the legacy-stream
 * name and a per-thread-default-stream one (suffix _ptsz or _ptds). Both get the
 * same prototype. */
#define HAMI_DECLARE_PTSZ(ret, name, suffix, params) \
    ret name params;                                  \
    ret name##_##suffix params;

/* initialisation, version, errors */
CUresult cuInit(unsigned int Flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);

/* devices */
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);

/* contexts */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);   /* pre-11.0 name, same contract */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);     /* pre-11.0 name, same contract */
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);

/* memory */
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemFreeHost(void *p);
HAMI_DECLARE_PTSZ(CUresult, cuMemAllocAsync, ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemFreeAsync, ptsz, (CUdeviceptr dptr, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemAllocFromPoolAsync, ptsz,
                  (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
HAMI_DECLARE_PTSZ(CUresult, cuMemcpyHtoD_v2, ptds, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount))
HAMI_DECLARE_PTSZ(CUresult, cuMemcpyDtoH_v2, ptds, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount))
HAMI_DECLARE_PTSZ(CUresult, cuMemsetD8_v2, ptds, (CUdeviceptr dstDevice, unsigned char uc, size_t N))

/* streams and events */
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
HAMI_DECLARE_PTSZ(CUresult, cuStreamSynchronize, ptsz, (CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuStreamQuery, ptsz, (CUstream hStream))
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
HAMI_DECLARE_PTSZ(CUresult, cuEventRecord, ptsz, (CUevent hEvent, CUstream hStream))
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventDestroy_v2(CUevent hEvent);

/* modules and launches */
CUresult cuModuleLoad(CUmodule *module, const char *fname);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            CUjit_option *options, void **optionValues);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuModuleUnload(CUmodule hmod);
HAMI_DECLARE_PTSZ(CUresult, cuLaunchKernel, ptsz,
                  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra))
HAMI_DECLARE_PTSZ(CUresult, cuLaunchKernelEx, ptsz,
                  (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))
HAMI_DECLARE_PTSZ(CUresult, cuLaunchCooperativeKernel, ptsz,
                  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams))
HAMI_DECLARE_PTSZ(CUresult, cuGraphLaunch, ptsz, (CUgraphExec hGraphExec, CUstream hStream))

/* Legacy names the driver still exports with the same contract as the _v2 ones. */
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext *pctx);
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags);
CUresult cuStreamDestroy(CUstream hStream);
CUresult cuEventDestroy(CUevent hEvent);

/* graphs: kernel nodes */
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUkern_st *CUkernel;
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef CUDA_KERNEL_NODE_PARAMS_v2 CUDA_KERNEL_NODE_PARAMS;
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#endif
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphDestroy(CUgraph hGraph);

/* libraries, kernels and the JIT linker (cuda.core, numba-cuda) */
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef struct CUlib_st *CUlibrary;
typedef struct CUlinkState_st *CUlinkState;
typedef int CUlibraryOption;       /* options are accepted and ignored */
typedef enum CUjitInputType_enum {
    CU_JIT_INPUT_CUBIN = 0,
    CU_JIT_INPUT_PTX = 1,
    CU_JIT_INPUT_FATBINARY = 2,
    CU_JIT_INPUT_OBJECT = 3,
    CU_JIT_INPUT_LIBRARY = 4,
    CU_JIT_INPUT_NVVM = 5
} CUjitInputType;
#define CU_JIT_WALL_TIME 2
#define CU_JIT_INFO_LOG_BUFFER 3
#define CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES 4
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
typedef enum CUfunction_attribute_enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
    CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
    CU_FUNC_ATTRIBUTE_CACHE_MODE_CA = 7,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
    CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET = 10,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH = 11,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT = 12,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH = 13,
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
    CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 15,
    CU_FUNC_ATTRIBUTE_MAX
} CUfunction_attribute;
typedef size_t (*CUoccupancyB2DSize)(int blockSize);
#endif
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                           void **libraryOptionValues, unsigned int numLibraryOptions);
CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);
CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library);
CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name);
CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib);
CUresult cuLibraryEnumerateKernels(CUkernel *kernels, unsigned int numKernels, CUlibrary lib);
CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel);
CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel);
CUresult cuKernelGetName(const char **name, CUkernel hfunc);
CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev);
CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev);
CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc);
CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags);
CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                          CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                          int blockSizeLimit);
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize, CUfunction func,
                                                   CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                   size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags);
CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut);
CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                          unsigned int numOptions, CUjit_option *options, void **optionValues);
CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                          CUjit_option *options, void **optionValues);
CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut);
CUresult cuLinkCreate(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut);
CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                       unsigned int numOptions, CUjit_option *options, void **optionValues);
CUresult cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                       CUjit_option *options, void **optionValues);
CUresult cuLinkDestroy(CUlinkState state);
/* host memory, pointer attributes, copies on a stream (cuda-bindings, numba-cuda) */
#ifndef HAMI_CHECK_AGAINST_CUDA_H
#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x04
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08
typedef enum CUmemorytype_enum {
    CU_MEMORYTYPE_HOST = 0x01,
    CU_MEMORYTYPE_DEVICE = 0x02,
    CU_MEMORYTYPE_ARRAY = 0x03,
    CU_MEMORYTYPE_UNIFIED = 0x04
} CUmemorytype;
typedef enum CUpointer_attribute_enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
    CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13,
    CU_POINTER_ATTRIBUTE_ACCESS_FLAGS = 16,
    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17
} CUpointer_attribute;
#endif
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags);
CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p);
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr);
CUresult cuProfilerStart(void);
CUresult cuProfilerStop(void);
CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr);
HAMI_DECLARE_PTSZ(CUresult, cuMemcpyHtoDAsync_v2, ptsz,
                  (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemcpyDtoHAsync_v2, ptsz,
                  (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemcpyDtoDAsync_v2, ptsz,
                  (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemsetD8Async, ptsz, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemcpyDtoD_v2, ptds, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount))
/* ---- what the CUDA runtime (libcudart) and CuPy reach beyond the above ---- */
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef enum CUlimit_enum { CU_LIMIT_STACK_SIZE = 0, CU_LIMIT_MAX = 10 } CUlimit;
typedef enum CUfunc_cache_enum { CU_FUNC_CACHE_PREFER_NONE = 0, CU_FUNC_CACHE_PREFER_EQUAL = 3 } CUfunc_cache;
typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1, CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;
typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1, CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;
typedef void (*CUstreamCallback)(CUstream hStream, CUresult status, void *userData);
typedef void (*CUhostFn)(void *userData);
#endif
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
HAMI_DECLARE_PTSZ(CUresult, cuMemcpy, ptds, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount))
HAMI_DECLARE_PTSZ(CUresult, cuMemcpyAsync, ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemsetD16_v2, ptds, (CUdeviceptr dstDevice, unsigned short us, size_t N))
HAMI_DECLARE_PTSZ(CUresult, cuMemsetD32_v2, ptds, (CUdeviceptr dstDevice, unsigned int ui, size_t N))
HAMI_DECLARE_PTSZ(CUresult, cuMemsetD16Async, ptsz,
                  (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemsetD32Async, ptsz,
                  (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream))
CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version);
CUresult cuCtxGetFlags(unsigned int *flags);
CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit);
CUresult cuCtxSetLimit(CUlimit limit, size_t value);
CUresult cuCtxGetCacheConfig(CUfunc_cache *pconfig);
CUresult cuCtxSetCacheConfig(CUfunc_cache config);
CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId);
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
HAMI_DECLARE_PTSZ(CUresult, cuStreamGetPriority, ptsz, (CUstream hStream, int *priority))
HAMI_DECLARE_PTSZ(CUresult, cuStreamGetFlags, ptsz, (CUstream hStream, unsigned int *flags))
HAMI_DECLARE_PTSZ(CUresult, cuStreamGetCtx, ptsz, (CUstream hStream, CUcontext *pctx))
HAMI_DECLARE_PTSZ(CUresult, cuStreamGetId, ptsz, (CUstream hStream, unsigned long long *streamId))
HAMI_DECLARE_PTSZ(CUresult, cuStreamWaitEvent, ptsz, (CUstream hStream, CUevent hEvent, unsigned int Flags))
HAMI_DECLARE_PTSZ(CUresult, cuStreamAddCallback, ptsz,
                  (CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags))
HAMI_DECLARE_PTSZ(CUresult, cuLaunchHostFunc, ptsz, (CUstream hStream, CUhostFn fn, void *userData))
HAMI_DECLARE_PTSZ(CUresult, cuEventRecordWithFlags, ptsz, (CUevent hEvent, CUstream hStream, unsigned int flags))
HAMI_DECLARE_PTSZ(CUresult, cuStreamIsCapturing, ptsz, (CUstream hStream, CUstreamCaptureStatus *captureStatus))
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config);
CUresult cuFuncGetName(const char **name, CUfunction hfunc);

/* ---- what PyTorch's CUDA 13 stack reaches beyond the above (c10's driver API, cuBLAS, cuDNN) ---- */
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef uint32_t cuuint32_t;
typedef enum CUmoduleLoadingMode_enum {
    CU_MODULE_EAGER_LOADING = 0x1,
    CU_MODULE_LAZY_LOADING = 0x2
} CUmoduleLoadingMode;
#endif
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name);
CUresult cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name);
CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle);
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef enum CUstreamBatchMemOpType_enum {
    CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1,
    CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2,
    CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES = 3,
    CU_STREAM_MEM_OP_WAIT_VALUE_64 = 4,
    CU_STREAM_MEM_OP_WRITE_VALUE_64 = 5,
    CU_STREAM_MEM_OP_BARRIER = 6
} CUstreamBatchMemOpType;
typedef union CUstreamBatchMemOpParams_union {
    CUstreamBatchMemOpType operation;
    struct CUstreamMemOpWaitValueParams_st {
        CUstreamBatchMemOpType operation;
        CUdeviceptr address;
        union {
            cuuint32_t value;
            cuuint64_t value64;
        };
        unsigned int flags;
        CUdeviceptr alias;
    } waitValue;
    struct CUstreamMemOpWriteValueParams_st {
        CUstreamBatchMemOpType operation;
        CUdeviceptr address;
        union {
            cuuint32_t value;
            cuuint64_t value64;
        };
        unsigned int flags;
        CUdeviceptr alias;
    } writeValue;
    cuuint64_t pad[6];
} CUstreamBatchMemOpParams;
#define CU_STREAM_WAIT_VALUE_GEQ 0x0
#define CU_STREAM_WAIT_VALUE_EQ 0x1
#define CU_STREAM_WAIT_VALUE_AND 0x2
#define CU_STREAM_WAIT_VALUE_NOR 0x3
#define CU_STREAM_WAIT_VALUE_FLUSH (1 << 30)
#define CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER 0x1
#endif
/* stream memory operations: the legacy (v1) exports and the _v2 ones, which take the same arguments */
#define HAMI_DECLARE_MEMOPS(suffix)                                                                        \
    CUresult cuStreamWaitValue32##suffix(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);  \
    CUresult cuStreamWaitValue64##suffix(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);  \
    CUresult cuStreamWriteValue32##suffix(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags); \
    CUresult cuStreamWriteValue64##suffix(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags); \
    CUresult cuStreamBatchMemOp##suffix(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,  \
                                        unsigned int flags);
HAMI_DECLARE_MEMOPS()
HAMI_DECLARE_MEMOPS(_v2)
HAMI_DECLARE_MEMOPS(_ptsz)
HAMI_DECLARE_MEMOPS(_v2_ptsz)
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef enum CUlogLevel_enum { CU_LOG_LEVEL_ERROR = 0, CU_LOG_LEVEL_WARNING = 1 } CUlogLevel;
typedef struct CUlogsCallbackEntry_st *CUlogsCallbackHandle;
typedef void (*CUlogsCallback)(void *data, CUlogLevel logLevel, char *message, size_t length);
typedef unsigned int CUlogIterator;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef struct CUdevResource_st CUdevResource;              /* only passed through */
typedef enum CUdevResourceType_enum { CU_DEV_RESOURCE_TYPE_INVALID = 0, CU_DEV_RESOURCE_TYPE_SM = 1 } CUdevResourceType;
typedef struct CUmulticastObjectProp_st CUmulticastObjectProp;  /* only passed through */
#endif
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef struct CUgraphEdgeData_st CUgraphEdgeData;           /* only passed through */
#endif
HAMI_DECLARE_PTSZ(CUresult, cuStreamGetCaptureInfo, ptsz,
                  (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out))
HAMI_DECLARE_PTSZ(CUresult, cuStreamGetCaptureInfo_v2, ptsz,
                  (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                   CUgraph *graph_out, const CUgraphNode **dependencies_out, size_t *numDependencies_out))
HAMI_DECLARE_PTSZ(CUresult, cuStreamGetCaptureInfo_v3, ptsz,
                  (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                   CUgraph *graph_out, const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out,
                   size_t *numDependencies_out))
CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize, CUfunction func, int numBlocks,
                                                 int blockSize);
CUresult cuOccupancyMaxActiveClusters(int *numClusters, CUfunction func, const CUlaunchConfig *config);
CUresult cuOccupancyMaxPotentialClusterSize(int *clusterSize, CUfunction func, const CUlaunchConfig *config);
CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
CUresult cuCtxSynchronize_v2(CUcontext ctx);
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags);
CUresult cuCtxDisablePeerAccess(CUcontext peerContext);
HAMI_DECLARE_PTSZ(CUresult, cuMemPrefetchAsync, ptsz, (CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuMemPrefetchAsync_v2, ptsz,
                  (CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags, CUstream hStream))
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes;
    size_t srcY;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes;
    size_t dstY;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes;
    size_t Height;
} CUDA_MEMCPY2D;
typedef enum CUgraphNodeType_enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0, CU_GRAPH_NODE_TYPE_MEMCPY = 1, CU_GRAPH_NODE_TYPE_MEMSET = 2,
    CU_GRAPH_NODE_TYPE_HOST = 3, CU_GRAPH_NODE_TYPE_GRAPH = 4, CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_WAIT_EVENT = 6, CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7, CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11
} CUgraphNodeType;
typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;
#endif
HAMI_DECLARE_PTSZ(CUresult, cuMemcpy2D_v2, ptds, (const CUDA_MEMCPY2D *pCopy))
HAMI_DECLARE_PTSZ(CUresult, cuMemcpy2DUnaligned_v2, ptds, (const CUDA_MEMCPY2D *pCopy))
HAMI_DECLARE_PTSZ(CUresult, cuMemcpy2DAsync_v2, ptsz, (const CUDA_MEMCPY2D *pCopy, CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuStreamBeginCapture, ptsz, (CUstream hStream))
HAMI_DECLARE_PTSZ(CUresult, cuStreamBeginCapture_v2, ptsz, (CUstream hStream, CUstreamCaptureMode mode))
HAMI_DECLARE_PTSZ(CUresult, cuStreamEndCapture, ptsz, (CUstream hStream, CUgraph *phGraph))
CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes);
CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type);
CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams);
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                        const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                           const CUDA_KERNEL_NODE_PARAMS *nodeParams);
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize);
CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, CUmemAllocationType type);
CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type);
CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool);
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef enum CUgraphMem_attribute_enum {
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
    CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH
} CUgraphMem_attribute;
#endif
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef enum CUgraphInstantiateResult_enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0, CUDA_GRAPH_INSTANTIATE_ERROR = 1
} CUgraphInstantiateResult;
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
#endif
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               size_t numDependencies, CUdeviceptr dptr);
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out);
CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out);
HAMI_DECLARE_PTSZ(CUresult, cuGraphInstantiateWithParams, ptsz,
                  (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams))
HAMI_DECLARE_PTSZ(CUresult, cuGraphUpload, ptsz, (CUgraphExec hGraphExec, CUstream hStream))
CUresult cuDeviceGraphMemTrim(CUdevice device);
CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value);
CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value);
CUresult cuLogsRegisterCallback(CUlogsCallback callbackFunc, void *userData, CUlogsCallbackHandle *callback_out);
CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle callback);
CUresult cuLogsCurrent(CUlogIterator *iterator_out, unsigned int flags);
CUresult cuLogsDumpToFile(CUlogIterator *iterator, const char *pathToFile, unsigned int flags);
CUresult cuLogsDumpToMemory(CUlogIterator *iterator, char *buffer, size_t *size, unsigned int flags);
CUresult cuDeviceGetDevResource(CUdevice device, CUdevResource *resource, CUdevResourceType type);
CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nbGroups, const CUdevResource *input,
                                     CUdevResource *remaining, unsigned int useFlags, unsigned int minCount);
CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources, unsigned int nbResources);
CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags);
CUresult cuGreenCtxDestroy(CUgreenCtx hCtx);
CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx);
CUresult cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx, unsigned int flags, int priority);
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop);
CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev);
CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                            size_t memOffset, size_t size, unsigned long long flags);
CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset, size_t size);

/* stream capture: dependencies; graphs: more node kinds, dependencies, executable updates */
#ifndef HAMI_CHECK_AGAINST_CUDA_H
typedef struct CUDA_HOST_NODE_PARAMS_v1_st {
    CUhostFn fn;
    void *userData;
} CUDA_HOST_NODE_PARAMS;
typedef enum CUgraphExecUpdateResult_enum {
    CU_GRAPH_EXEC_UPDATE_SUCCESS = 0x0, CU_GRAPH_EXEC_UPDATE_ERROR = 0x1,
    CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 0x2, CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 0x3,
    CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED = 0x4, CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED = 0x5,
    CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED = 0x6, CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE = 0x7,
    CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED = 0x8
} CUgraphExecUpdateResult;
typedef struct CUgraphExecUpdateResultInfo_st {
    CUgraphExecUpdateResult result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;
#endif
HAMI_DECLARE_PTSZ(CUresult, cuStreamUpdateCaptureDependencies, ptsz,
                  (CUstream hStream, CUgraphNode *dependencies, size_t numDependencies, unsigned int flags))
HAMI_DECLARE_PTSZ(CUresult, cuStreamUpdateCaptureDependencies_v2, ptsz,
                  (CUstream hStream, CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                   size_t numDependencies, unsigned int flags))
CUresult cuGraphNodeGetDependencies(CUgraphNode hNode, CUgraphNode *dependencies, size_t *numDependencies);
CUresult cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode *dependencies, CUgraphEdgeData *edgeData,
                                       size_t *numDependencies);
CUresult cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                             size_t numDependencies);
CUresult cuGraphAddHostNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, const CUDA_HOST_NODE_PARAMS *nodeParams);
CUresult cuGraphHostNodeGetParams(CUgraphNode hNode, CUDA_HOST_NODE_PARAMS *nodeParams);
CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, CUgraph childGraph);
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph);
CUresult cuGraphAddEventRecordNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                   size_t numDependencies, CUevent event);
CUresult cuGraphAddEventWaitNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, CUevent event);
CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode hNode, CUevent *event_out);
CUresult cuGraphEventWaitNodeGetEvent(CUgraphNode hNode, CUevent *event_out);
CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                           CUgraphExecUpdateResult *updateResult_out);
CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo);

#endif /* HAMI_CUDA_API_H */
