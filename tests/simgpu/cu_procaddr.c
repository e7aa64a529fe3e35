/*
 * cuGetProcAddress(_v2): a base name and the caller's CUDA version pick the
 * versioned export (the row with the highest minimum version not above it);
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM picks that row's per-thread
 * form where one exists.
 *
 * The one list: X(base name, export, minimum CUDA version, per-thread export or NULL).
 */
#include "sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_PROCS(X) \
    X(cuInit, cuInit, 2000, NULL) \
    X(cuDriverGetVersion, cuDriverGetVersion, 2020, NULL) \
    X(cuGetErrorName, cuGetErrorName, 6000, NULL) \
    X(cuGetErrorString, cuGetErrorString, 6000, NULL) \
    X(cuGetProcAddress, cuGetProcAddress, 11030, NULL) \
    X(cuGetProcAddress, cuGetProcAddress_v2, 12000, NULL) \
    X(cuDeviceGet, cuDeviceGet, 2000, NULL) \
    X(cuDeviceGetCount, cuDeviceGetCount, 2000, NULL) \
    X(cuDeviceGetName, cuDeviceGetName, 2000, NULL) \
    X(cuDeviceGetUuid, cuDeviceGetUuid, 9020, NULL) \
    X(cuDeviceGetUuid, cuDeviceGetUuid_v2, 11040, NULL) \
    X(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020, NULL) \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, NULL) \
    X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId, 4010, NULL) \
    X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, NULL) \
    X(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, NULL) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, NULL) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, NULL) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000, NULL) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, NULL) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, 11000, NULL) \
    X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, 7000, NULL) \
    X(cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags, 7000, NULL) \
    X(cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2, 11000, NULL) \
    X(cuCtxCreate, cuCtxCreate_v2, 3020, NULL) \
    X(cuCtxCreate, cuCtxCreate_v3, 11040, NULL) \
    X(cuCtxCreate, cuCtxCreate_v4, 12050, NULL) \
    X(cuCtxDestroy, cuCtxDestroy, 2000, NULL) \
    X(cuCtxDestroy, cuCtxDestroy_v2, 4000, NULL) \
    X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, NULL) \
    X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, NULL) \
    X(cuCtxPushCurrent, cuCtxPushCurrent, 2000, NULL) \
    X(cuCtxPushCurrent, cuCtxPushCurrent_v2, 4000, NULL) \
    X(cuCtxPopCurrent, cuCtxPopCurrent, 2000, NULL) \
    X(cuCtxPopCurrent, cuCtxPopCurrent_v2, 4000, NULL) \
    X(cuCtxGetDevice, cuCtxGetDevice, 2000, NULL) \
    X(cuCtxSynchronize, cuCtxSynchronize, 2000, NULL) \
    X(cuMemGetInfo, cuMemGetInfo_v2, 3020, NULL) \
    X(cuMemAlloc, cuMemAlloc_v2, 3020, NULL) \
    X(cuMemAllocPitch, cuMemAllocPitch_v2, 3020, NULL) \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, NULL) \
    X(cuMemFree, cuMemFree_v2, 3020, NULL) \
    X(cuMemAllocHost, cuMemAllocHost_v2, 3020, NULL) \
    X(cuMemFreeHost, cuMemFreeHost, 2000, NULL) \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz) \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz) \
    X(cuMemPoolCreate, cuMemPoolCreate, 11020, NULL) \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, NULL) \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, NULL) \
    X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, NULL) \
    X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, NULL) \
    X(cuMemCreate, cuMemCreate, 10020, NULL) \
    X(cuMemRelease, cuMemRelease, 10020, NULL) \
    X(cuMemAddressReserve, cuMemAddressReserve, 10020, NULL) \
    X(cuMemAddressFree, cuMemAddressFree, 10020, NULL) \
    X(cuMemMap, cuMemMap, 10020, NULL) \
    X(cuMemUnmap, cuMemUnmap, 10020, NULL) \
    X(cuMemSetAccess, cuMemSetAccess, 10020, NULL) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020, NULL) \
    X(cuArrayCreate, cuArrayCreate_v2, 3020, NULL) \
    X(cuArray3DCreate, cuArray3DCreate_v2, 3020, NULL) \
    X(cuArrayDestroy, cuArrayDestroy, 2000, NULL) \
    X(cuMemcpyHtoD, cuMemcpyHtoD_v2, 3020, cuMemcpyHtoD_v2_ptds) \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020, cuMemcpyDtoH_v2_ptds) \
    X(cuMemsetD8, cuMemsetD8_v2, 3020, cuMemsetD8_v2_ptds) \
    X(cuStreamCreate, cuStreamCreate, 2000, NULL) \
    X(cuStreamSynchronize, cuStreamSynchronize, 2000, cuStreamSynchronize_ptsz) \
    X(cuStreamQuery, cuStreamQuery, 2000, cuStreamQuery_ptsz) \
    X(cuStreamDestroy, cuStreamDestroy, 2000, NULL) \
    X(cuStreamDestroy, cuStreamDestroy_v2, 4000, NULL) \
    X(cuEventCreate, cuEventCreate, 2000, NULL) \
    X(cuEventRecord, cuEventRecord, 2000, cuEventRecord_ptsz) \
    X(cuEventQuery, cuEventQuery, 2000, NULL) \
    X(cuEventSynchronize, cuEventSynchronize, 2000, NULL) \
    X(cuEventElapsedTime, cuEventElapsedTime, 2000, NULL) \
    X(cuEventElapsedTime, cuEventElapsedTime_v2, 12080, NULL) \
    X(cuEventDestroy, cuEventDestroy, 2000, NULL) \
    X(cuEventDestroy, cuEventDestroy_v2, 4000, NULL) \
    X(cuModuleLoad, cuModuleLoad, 2000, NULL) \
    X(cuModuleLoadData, cuModuleLoadData, 2000, NULL) \
    X(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, NULL) \
    X(cuModuleGetFunction, cuModuleGetFunction, 2000, NULL) \
    X(cuModuleUnload, cuModuleUnload, 2000, NULL) \
    X(cuLaunchKernel, cuLaunchKernel, 4000, cuLaunchKernel_ptsz) \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, cuLaunchKernelEx_ptsz) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel_ptsz) \
    X(cuGraphCreate, cuGraphCreate, 10000, NULL) \
    X(cuGraphAddKernelNode, cuGraphAddKernelNode_v2, 12000, NULL) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, NULL) \
    X(cuGraphLaunch, cuGraphLaunch, 10000, cuGraphLaunch_ptsz) \
    X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, NULL) \
    X(cuGraphDestroy, cuGraphDestroy, 10000, NULL) \
    X(cuLibraryLoadData, cuLibraryLoadData, 12000, NULL) \
    X(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000, NULL) \
    X(cuLibraryUnload, cuLibraryUnload, 12000, NULL) \
    X(cuLibraryGetKernel, cuLibraryGetKernel, 12000, NULL) \
    X(cuLibraryGetModule, cuLibraryGetModule, 12000, NULL) \
    X(cuLibraryGetGlobal, cuLibraryGetGlobal, 12000, NULL) \
    X(cuLibraryGetKernelCount, cuLibraryGetKernelCount, 12040, NULL) \
    X(cuLibraryEnumerateKernels, cuLibraryEnumerateKernels, 12040, NULL) \
    X(cuKernelGetFunction, cuKernelGetFunction, 12000, NULL) \
    X(cuKernelGetLibrary, cuKernelGetLibrary, 12050, NULL) \
    X(cuKernelGetName, cuKernelGetName, 12030, NULL) \
    X(cuKernelGetAttribute, cuKernelGetAttribute, 12000, NULL) \
    X(cuKernelSetAttribute, cuKernelSetAttribute, 12000, NULL) \
    X(cuFuncGetAttribute, cuFuncGetAttribute, 2020, NULL) \
    X(cuFuncSetAttribute, cuFuncSetAttribute, 9000, NULL) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, NULL) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, \
      7000, NULL) \
    X(cuOccupancyMaxPotentialBlockSize, cuOccupancyMaxPotentialBlockSize, 6050, NULL) \
    X(cuOccupancyMaxPotentialBlockSizeWithFlags, cuOccupancyMaxPotentialBlockSizeWithFlags, 7000, NULL) \
    X(cuLinkCreate, cuLinkCreate, 5050, NULL) \
    X(cuLinkCreate, cuLinkCreate_v2, 6050, NULL) \
    X(cuLinkAddData, cuLinkAddData, 5050, NULL) \
    X(cuLinkAddData, cuLinkAddData_v2, 6050, NULL) \
    X(cuLinkAddFile, cuLinkAddFile, 5050, NULL) \
    X(cuLinkAddFile, cuLinkAddFile_v2, 6050, NULL) \
    X(cuLinkComplete, cuLinkComplete, 5050, NULL) \
    X(cuLinkDestroy, cuLinkDestroy, 5050, NULL) \
    X(cuMemHostAlloc, cuMemHostAlloc, 2020, NULL) \
    X(cuMemHostRegister, cuMemHostRegister, 4000, NULL) \
    X(cuMemHostRegister, cuMemHostRegister_v2, 6050, NULL) \
    X(cuMemHostUnregister, cuMemHostUnregister, 4000, NULL) \
    X(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2, 3020, NULL) \
    X(cuMemHostGetFlags, cuMemHostGetFlags, 2030, NULL) \
    X(cuPointerGetAttribute, cuPointerGetAttribute, 4000, NULL) \
    X(cuPointerGetAttributes, cuPointerGetAttributes, 7000, NULL) \
    X(cuProfilerStart, cuProfilerStart, 4000, NULL) \
    X(cuProfilerStop, cuProfilerStop, 4000, NULL) \
    X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, 3020, cuMemcpyHtoDAsync_v2_ptsz) \
    X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, 3020, cuMemcpyDtoHAsync_v2_ptsz) \
    X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, 3020, cuMemcpyDtoDAsync_v2_ptsz) \
    X(cuMemsetD8Async, cuMemsetD8Async, 3020, cuMemsetD8Async_ptsz) \
    X(cuMemcpyDtoD, cuMemcpyDtoD_v2, 3020, cuMemcpyDtoD_v2_ptds) \
    SIM_PROCS_RUNTIME(X)

/* What the CUDA runtime (libcudart) and CuPy reach beyond the rows above. */
#define SIM_PROCS_RUNTIME(X) \
    X(cuGetExportTable, cuGetExportTable, 3000, NULL) \
    X(cuDeviceSetMemPool, cuDeviceSetMemPool, 11020, NULL) \
    X(cuMemGetAddressRange, cuMemGetAddressRange_v2, 3020, NULL) \
    X(cuMemcpy, cuMemcpy, 4000, cuMemcpy_ptds) \
    X(cuMemcpyAsync, cuMemcpyAsync, 4000, cuMemcpyAsync_ptsz) \
    X(cuMemsetD16, cuMemsetD16_v2, 3020, cuMemsetD16_v2_ptds) \
    X(cuMemsetD32, cuMemsetD32_v2, 3020, cuMemsetD32_v2_ptds) \
    X(cuMemsetD16Async, cuMemsetD16Async, 3020, cuMemsetD16Async_ptsz) \
    X(cuMemsetD32Async, cuMemsetD32Async, 3020, cuMemsetD32Async_ptsz) \
    X(cuCtxGetApiVersion, cuCtxGetApiVersion, 3020, NULL) \
    X(cuCtxGetFlags, cuCtxGetFlags, 7000, NULL) \
    X(cuCtxGetId, cuCtxGetId, 12000, NULL) \
    X(cuCtxGetLimit, cuCtxGetLimit, 3010, NULL) \
    X(cuCtxSetLimit, cuCtxSetLimit, 3010, NULL) \
    X(cuCtxGetCacheConfig, cuCtxGetCacheConfig, 3020, NULL) \
    X(cuCtxSetCacheConfig, cuCtxSetCacheConfig, 3020, NULL) \
    X(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange, 5050, NULL) \
    X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer, 4000, NULL) \
    X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, 5050, NULL) \
    X(cuStreamGetPriority, cuStreamGetPriority, 5050, cuStreamGetPriority_ptsz) \
    X(cuStreamGetFlags, cuStreamGetFlags, 5050, cuStreamGetFlags_ptsz) \
    X(cuStreamGetCtx, cuStreamGetCtx, 9020, cuStreamGetCtx_ptsz) \
    X(cuStreamGetId, cuStreamGetId, 12000, cuStreamGetId_ptsz) \
    X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, cuStreamWaitEvent_ptsz) \
    X(cuStreamAddCallback, cuStreamAddCallback, 5000, cuStreamAddCallback_ptsz) \
    X(cuLaunchHostFunc, cuLaunchHostFunc, 10000, cuLaunchHostFunc_ptsz) \
    X(cuEventRecordWithFlags, cuEventRecordWithFlags, 11010, cuEventRecordWithFlags_ptsz) \
    X(cuStreamIsCapturing, cuStreamIsCapturing, 10000, cuStreamIsCapturing_ptsz) \
    X(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode, 10010, NULL) \
    X(cuFuncSetCacheConfig, cuFuncSetCacheConfig, 3000, NULL) \
    X(cuFuncGetName, cuFuncGetName, 12030, NULL) \
    SIM_PROCS_TORCH(X)

/* What PyTorch's CUDA 13 stack reaches beyond the rows above (c10's driver API, cuBLAS, cuDNN). */
#define SIM_PROCS_TORCH(X) \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, NULL) \
    X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, NULL) \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, NULL) \
    X(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle, 10020, NULL) \
    X(cuStreamWaitValue32, cuStreamWaitValue32, 8000, cuStreamWaitValue32_ptsz) \
    X(cuStreamWaitValue32, cuStreamWaitValue32_v2, 11070, cuStreamWaitValue32_v2_ptsz) \
    X(cuStreamWaitValue64, cuStreamWaitValue64, 9000, cuStreamWaitValue64_ptsz) \
    X(cuStreamWaitValue64, cuStreamWaitValue64_v2, 11070, cuStreamWaitValue64_v2_ptsz) \
    X(cuStreamWriteValue32, cuStreamWriteValue32, 8000, cuStreamWriteValue32_ptsz) \
    X(cuStreamWriteValue32, cuStreamWriteValue32_v2, 11070, cuStreamWriteValue32_v2_ptsz) \
    X(cuStreamWriteValue64, cuStreamWriteValue64, 9000, cuStreamWriteValue64_ptsz) \
    X(cuStreamWriteValue64, cuStreamWriteValue64_v2, 11070, cuStreamWriteValue64_v2_ptsz) \
    X(cuStreamBatchMemOp, cuStreamBatchMemOp, 8000, cuStreamBatchMemOp_ptsz) \
    X(cuStreamBatchMemOp, cuStreamBatchMemOp_v2, 11070, cuStreamBatchMemOp_v2_ptsz) \
    X(cuModuleGetLoadingMode, cuModuleGetLoadingMode, 11070, NULL) \
    X(cuModuleGetGlobal, cuModuleGetGlobal_v2, 3020, NULL) \
    X(cuMemGetDefaultMemPool, cuMemGetDefaultMemPool, 13000, NULL) \
    X(cuMemGetMemPool, cuMemGetMemPool, 13000, NULL) \
    X(cuMemSetMemPool, cuMemSetMemPool, 13000, NULL) \
    X(cuCtxGetDevice, cuCtxGetDevice_v2, 13000, NULL) \
    X(cuCtxSynchronize, cuCtxSynchronize_v2, 13000, NULL) \
    X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, 4000, NULL) \
    X(cuCtxDisablePeerAccess, cuCtxDisablePeerAccess, 4000, NULL) \
    X(cuMemPrefetchAsync, cuMemPrefetchAsync, 8000, cuMemPrefetchAsync_ptsz) \
    X(cuMemPrefetchAsync, cuMemPrefetchAsync_v2, 12020, cuMemPrefetchAsync_v2_ptsz) \
    X(cuMemcpy2D, cuMemcpy2D_v2, 3020, cuMemcpy2D_v2_ptds) \
    X(cuMemcpy2DUnaligned, cuMemcpy2DUnaligned_v2, 3020, cuMemcpy2DUnaligned_v2_ptds) \
    X(cuMemcpy2DAsync, cuMemcpy2DAsync_v2, 3020, cuMemcpy2DAsync_v2_ptsz) \
    X(cuStreamBeginCapture, cuStreamBeginCapture, 10000, cuStreamBeginCapture_ptsz) \
    X(cuStreamBeginCapture, cuStreamBeginCapture_v2, 10010, cuStreamBeginCapture_v2_ptsz) \
    X(cuStreamEndCapture, cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz) \
    X(cuGraphGetNodes, cuGraphGetNodes, 10000, NULL) \
    X(cuGraphNodeGetType, cuGraphNodeGetType, 10000, NULL) \
    X(cuGraphKernelNodeGetParams, cuGraphKernelNodeGetParams, 10000, NULL) \
    X(cuGraphKernelNodeGetParams, cuGraphKernelNodeGetParams_v2, 12000, NULL) \
    X(cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams, 10010, NULL) \
    X(cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams_v2, 12000, NULL) \
    X(cuGraphInstantiate, cuGraphInstantiate, 10000, NULL) \
    X(cuGraphInstantiate, cuGraphInstantiate_v2, 11000, NULL) \
    X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, NULL) \
    X(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, 11040, NULL) \
    X(cuDeviceSetGraphMemAttribute, cuDeviceSetGraphMemAttribute, 11040, NULL) \
    X(cuStreamUpdateCaptureDependencies, cuStreamUpdateCaptureDependencies, 11030, cuStreamUpdateCaptureDependencies_ptsz) \
    X(cuStreamUpdateCaptureDependencies, cuStreamUpdateCaptureDependencies_v2, 12030, cuStreamUpdateCaptureDependencies_v2_ptsz) \
    X(cuGraphNodeGetDependencies, cuGraphNodeGetDependencies, 10000, NULL) \
    X(cuGraphNodeGetDependencies, cuGraphNodeGetDependencies_v2, 12030, NULL) \
    X(cuGraphAddEmptyNode, cuGraphAddEmptyNode, 10000, NULL) \
    X(cuGraphAddHostNode, cuGraphAddHostNode, 10000, NULL) \
    X(cuGraphHostNodeGetParams, cuGraphHostNodeGetParams, 10000, NULL) \
    X(cuGraphAddChildGraphNode, cuGraphAddChildGraphNode, 10000, NULL) \
    X(cuGraphChildGraphNodeGetGraph, cuGraphChildGraphNodeGetGraph, 10000, NULL) \
    X(cuGraphAddEventRecordNode, cuGraphAddEventRecordNode, 11010, NULL) \
    X(cuGraphAddEventWaitNode, cuGraphAddEventWaitNode, 11010, NULL) \
    X(cuGraphEventRecordNodeGetEvent, cuGraphEventRecordNodeGetEvent, 11010, NULL) \
    X(cuGraphEventWaitNodeGetEvent, cuGraphEventWaitNodeGetEvent, 11010, NULL) \
    X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, NULL) \
    X(cuGraphMemAllocNodeGetParams, cuGraphMemAllocNodeGetParams, 11040, NULL) \
    X(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 11040, NULL) \
    X(cuGraphMemFreeNodeGetParams, cuGraphMemFreeNodeGetParams, 11040, NULL) \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams_ptsz) \
    X(cuGraphUpload, cuGraphUpload, 11010, cuGraphUpload_ptsz) \
    X(cuGraphExecUpdate, cuGraphExecUpdate, 10020, NULL) \
    X(cuGraphExecUpdate, cuGraphExecUpdate_v2, 12000, NULL) \
    X(cuOccupancyAvailableDynamicSMemPerBlock, cuOccupancyAvailableDynamicSMemPerBlock, 10020, NULL) \
    X(cuOccupancyMaxActiveClusters, cuOccupancyMaxActiveClusters, 11070, NULL) \
    X(cuOccupancyMaxPotentialClusterSize, cuOccupancyMaxPotentialClusterSize, 11070, NULL) \
    X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo, 10010, cuStreamGetCaptureInfo_ptsz) \
    X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v2, 11030, cuStreamGetCaptureInfo_v2_ptsz) \
    X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v3, 12030, cuStreamGetCaptureInfo_v3_ptsz) \
    X(cuLogsRegisterCallback, cuLogsRegisterCallback, 12090, NULL) \
    X(cuLogsUnregisterCallback, cuLogsUnregisterCallback, 12090, NULL) \
    X(cuLogsCurrent, cuLogsCurrent, 12090, NULL) \
    X(cuLogsDumpToFile, cuLogsDumpToFile, 12090, NULL) \
    X(cuLogsDumpToMemory, cuLogsDumpToMemory, 12090, NULL) \
    X(cuMulticastCreate, cuMulticastCreate, 12010, NULL) \
    X(cuMulticastAddDevice, cuMulticastAddDevice, 12010, NULL) \
    X(cuMulticastBindMem, cuMulticastBindMem, 12010, NULL) \
    X(cuMulticastUnbind, cuMulticastUnbind, 12010, NULL) \
    X(cuDeviceGetDevResource, cuDeviceGetDevResource, 12040, NULL) \
    X(cuDevSmResourceSplitByCount, cuDevSmResourceSplitByCount, 12040, NULL) \
    X(cuDevResourceGenerateDesc, cuDevResourceGenerateDesc, 12040, NULL) \
    X(cuGreenCtxCreate, cuGreenCtxCreate, 12040, NULL) \
    X(cuGreenCtxDestroy, cuGreenCtxDestroy, 12040, NULL) \
    X(cuCtxFromGreenCtx, cuCtxFromGreenCtx, 12040, NULL) \
    X(cuGreenCtxStreamCreate, cuGreenCtxStreamCreate, 12040, NULL)

struct proc_row { const char *name; void *fn; int min_version; void *per_thread; };

#define SIM_PROC_ROW(base, export, version, per_thread) {#base, (void *)export, version, (void *)per_thread},
static const struct proc_row proc_rows[] = {SIM_PROCS(SIM_PROC_ROW)};

static CUresult resolve(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn || (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                                  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    const struct proc_row *best = NULL;
    for (size_t i = 0; i < sizeof proc_rows / sizeof *proc_rows; i++) {
        const struct proc_row *r = &proc_rows[i];
        if (strcmp(r->name, symbol))
            continue;
        st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        if (r->min_version <= cudaVersion && (!best || r->min_version > best->min_version))
            best = r;
    }
    *pfn = NULL;
    if (best) {
        st = CU_GET_PROC_ADDRESS_SUCCESS;
        *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->per_thread ? best->per_thread
                                                                                            : best->fn;
    }
    if (!best && getenv("HAMI_SIM_TRACE"))
        fprintf(stderr, "hami-sim: cuGetProcAddress(%s, %d): not provided\n", symbol, cudaVersion);
    if (status)
        *status = st;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return resolve(symbol, pfn, cudaVersion, flags, NULL);
}
