/*
 * Graph memory: what a graph's memory-allocation nodes (captured cuMemAllocAsync,
 * cuGraphAddMemAllocNode) take. The driver gives a graph physical memory when it is
 * uploaded or launched (not at instantiation), keeps it reserved for later launches,
 * and gives it back at cuDeviceGraphMemTrim. libvgpu charges it as the driver
 * reserves it: before a commit, what the graph may need beyond the reservation's
 * idle part is charged up front (so the container's check is atomic) and the call is
 * refused with CUDA_ERROR_OUT_OF_MEMORY, before the driver sees it, when the limit
 * cannot hold that; after it, the charge follows the driver's reservation.
 */
#ifndef HAMI_GRAPH_MEMORY_H
#define HAMI_GRAPH_MEMORY_H

#include "cuda_api.h"

/* Launches or uploads `exec` on `stream` through `commit` (the real cuGraphLaunch or
 * cuGraphUpload, or a _ptsz form: `stream` names the per-thread stream explicitly),
 * charging the graph's memory around it. */
CUresult hami_graph_commit(CUgraphExec exec, CUresult (*commit)(CUgraphExec, CUstream), CUstream stream);

#endif
