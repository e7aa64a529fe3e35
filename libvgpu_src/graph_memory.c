/* Graph memory hooks (graph_memory.h): instantiation learns what an executable graph's
 * memory nodes need, upload and launch commit it, trim and destroy give it back. */
#include "internal.h"
#include "hooks.h"
#include "capture.h"
#include "graph_memory.h"
#include "log.h"

#include <pthread.h>
#include <stdlib.h>

#define INSTANTIATE_FLAG_UPLOAD 2ull     /* CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD */

/* Per region device: the reservation charged, and the trim generation. An executable
 * graph committed in the current generation still has its memory mapped, so launching
 * it again takes no more; a trim may have unmapped any of them. */
struct graph_dev {
    pthread_mutex_t lock;
    uint64_t charged;
    uint64_t generation;
};
static struct graph_dev graph_devs[HAMI_MAX_DEVICES] = {
    [0 ... HAMI_MAX_DEVICES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

/* An executable graph's record (struct hami_res's aux, kind HAMI_RES_GRAPH). */
struct graph_exec {
    CUdevice dev;
    int committed;
    uint64_t generation;
};

static uint64_t graph_attr(CUdevice dev, CUgraphMem_attribute attr, uint64_t fallback)
{
    CUresult (*get)(CUdevice, CUgraphMem_attribute, void *) = HAMI_DRIVER(cuDeviceGetGraphMemAttribute);
    cuuint64_t value = 0;
    return get && get(dev, attr, &value) == CUDA_SUCCESS ? value : fallback;
}

/* The charge follows the driver's reservation (g locked). Growth past the up-front
 * charge (the driver's own rounding) cannot be refused after the fact: charged as it is. */
static void settle(int index, CUdevice dev)
{
    struct graph_dev *g = &graph_devs[index];
    uint64_t reserved = graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, g->charged);
    if (reserved > g->charged)
        hami_mem_charge_force(index, reserved - g->charged);
    else
        hami_mem_uncharge(index, g->charged - reserved);
    g->charged = reserved;
}

/* What a graph's memory-allocation nodes ask for, in whole pages (a child graph
 * cannot hold memory nodes, so one level is all). */
static uint64_t graph_need(CUgraph graph)
{
    CUresult (*get_nodes)(CUgraph, CUgraphNode *, size_t *) = HAMI_DRIVER(cuGraphGetNodes);
    CUresult (*get_type)(CUgraphNode, CUgraphNodeType *) = HAMI_DRIVER(cuGraphNodeGetType);
    CUresult (*get_alloc)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *) = HAMI_DRIVER(cuGraphMemAllocNodeGetParams);
    size_t count = 0;
    if (!get_nodes || !get_type || !get_alloc || get_nodes(graph, NULL, &count) != CUDA_SUCCESS || !count)
        return 0;
    CUgraphNode *nodes = malloc(count * sizeof *nodes);
    uint64_t need = 0;
    if (nodes && get_nodes(graph, nodes, &count) == CUDA_SUCCESS) {
        for (size_t i = 0; i < count; i++) {
            CUgraphNodeType type;
            CUDA_MEM_ALLOC_NODE_PARAMS params;
            if (get_type(nodes[i], &type) == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
                get_alloc(nodes[i], &params) == CUDA_SUCCESS)
                need += hami_pages(params.bytesize);
        }
    }
    free(nodes);
    return need;
}

struct commit_call {
    CUresult (*run)(const struct commit_call *);
    CUgraphExec exec, *exec_out;
    CUgraph graph;
    CUstream stream;
    CUresult (*commit)(CUgraphExec, CUstream);
    CUresult (*instantiate)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
    CUDA_GRAPH_INSTANTIATE_PARAMS *params;
};

/* Runs `call`, which may commit `need` bytes of graph memory on region device `index`
 * (g locked): what the reservation's idle part cannot hold is charged first, and
 * without room in the limit the call is refused before the driver sees it. */
static CUresult charged_commit(int index, CUdevice dev, uint64_t need, const struct commit_call *call)
{
    settle(index, dev);
    uint64_t reserved = graph_devs[index].charged;
    uint64_t used = graph_attr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, reserved);
    uint64_t idle = reserved > used ? reserved - used : 0;
    uint64_t upfront = need > idle ? hami_pages(need - idle) : 0;
    if (upfront && hami_mem_charge(index, upfront) < 0) {
        hami_info("device %d: a graph's %llu bytes of memory would pass the limit: refused", index,
                  (unsigned long long)need);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    graph_devs[index].charged += upfront;
    CUresult rc = call->run(call);
    settle(index, dev);
    return rc;
}

static CUresult run_commit(const struct commit_call *c) { return c->commit(c->exec, c->stream); }

CUresult hami_graph_commit(CUgraphExec exec, CUresult (*commit)(CUgraphExec, CUstream), CUstream stream)
{
    struct hami_res res;
    if (hami_res_get(HAMI_RES_GRAPH, (uint64_t)(uintptr_t)exec, &res) < 0 || hami_stream_capturing(stream))
        return commit(exec, stream);
    struct graph_exec *ge = res.aux;
    struct graph_dev *g = &graph_devs[res.dev];
    struct commit_call call = {.run = run_commit, .exec = exec, .stream = stream, .commit = commit};
    pthread_mutex_lock(&g->lock);
    int mapped = ge->committed && ge->generation == g->generation;
    CUresult rc = charged_commit(res.dev, ge->dev, mapped ? 0 : res.bytes, &call);
    if (rc == CUDA_SUCCESS) {
        ge->committed = 1;
        ge->generation = g->generation;
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* After an instantiation: the executable graph is remembered when its graph holds
 * memory nodes and its device is one of the region's (committed: it was uploaded). */
static void remember(CUgraphExec exec, int index, CUdevice dev, uint64_t need, int committed)
{
    struct graph_exec *ge = need ? malloc(sizeof *ge) : NULL;
    if (!ge)
        return;
    *ge = (struct graph_exec){.dev = dev, .committed = committed,
                              .generation = graph_devs[index].generation};
    struct hami_res res = {.key = (uint64_t)(uintptr_t)exec, .kind = HAMI_RES_GRAPH, .dev = index,
                           .bytes = need, .aux = ge};
    hami_res_put(&res);
}

static int current_index(CUdevice *dev)
{
    int index = hami_current_device_index(dev);
    return index >= 0 && index < HAMI_MAX_DEVICES ? index : -1;
}

#define DEFINE_INSTANTIATE(name, params, args, exec_out, graph)                                     \
    HAMI_HOOK(CUresult, name, params, args)                                                         \
    {                                                                                               \
        CUresult rc = real args;                                                                    \
        CUdevice dev;                                                                               \
        int index;                                                                                  \
        if (rc == CUDA_SUCCESS && (index = current_index(&dev)) >= 0)                               \
            remember(*(exec_out), index, dev, graph_need(graph), 0);                                \
        return rc;                                                                                  \
    }

DEFINE_INSTANTIATE(cuGraphInstantiate,
                   (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                    size_t bufferSize),
                   (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize), phGraphExec, hGraph)
DEFINE_INSTANTIATE(cuGraphInstantiate_v2,
                   (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                    size_t bufferSize),
                   (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize), phGraphExec, hGraph)
DEFINE_INSTANTIATE(cuGraphInstantiateWithFlags,
                   (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags),
                   (phGraphExec, hGraph, flags), phGraphExec, hGraph)

static CUresult run_instantiate(const struct commit_call *c)
{
    return c->instantiate(c->exec_out, c->graph, c->params);
}

/* With the upload flag the instantiation commits the graph's memory itself. */
static CUresult instantiate_with_params(CUresult (*real)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *),
                                        CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    CUdevice dev;
    int index = current_index(&dev);
    if (index < 0 || !exec || !params)
        return real(exec, graph, params);
    uint64_t need = graph_need(graph);
    int upload = (params->flags & INSTANTIATE_FLAG_UPLOAD) && need;
    CUresult rc;
    if (upload) {
        struct commit_call call = {.run = run_instantiate, .exec_out = exec, .graph = graph,
                                   .instantiate = real, .params = params};
        pthread_mutex_lock(&graph_devs[index].lock);
        rc = charged_commit(index, dev, need, &call);
        pthread_mutex_unlock(&graph_devs[index].lock);
    } else {
        rc = real(exec, graph, params);
    }
    if (rc == CUDA_SUCCESS)
        remember(*exec, index, dev, need, upload);
    return rc;
}

HAMI_HOOK(CUresult, cuGraphInstantiateWithParams,
          (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
          (phGraphExec, hGraph, instantiateParams))
{
    return instantiate_with_params(real, phGraphExec, hGraph, instantiateParams);
}

HAMI_HOOK(CUresult, cuGraphInstantiateWithParams_ptsz,
          (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
          (phGraphExec, hGraph, instantiateParams))
{
    return instantiate_with_params(real, phGraphExec, hGraph, instantiateParams);
}

HAMI_HOOK(CUresult, cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
{
    return hami_graph_commit(hGraphExec, real, hStream);
}

HAMI_HOOK(CUresult, cuGraphUpload_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
{
    return hami_graph_commit(hGraphExec, real, hStream ? hStream : CU_STREAM_PER_THREAD);
}

/* The driver keeps a destroyed graph's memory reserved until a trim: the charge follows. */
HAMI_HOOK(CUresult, cuGraphExecDestroy, (CUgraphExec hGraphExec), (hGraphExec))
{
    struct hami_res res;
    if (hami_res_take(HAMI_RES_GRAPH, (uint64_t)(uintptr_t)hGraphExec, &res) < 0)
        return real(hGraphExec);
    CUresult rc = real(hGraphExec);
    if (rc != CUDA_SUCCESS) {
        hami_res_put(&res);
        return rc;
    }
    struct graph_exec *ge = res.aux;
    pthread_mutex_lock(&graph_devs[res.dev].lock);
    settle(res.dev, ge->dev);
    pthread_mutex_unlock(&graph_devs[res.dev].lock);
    free(ge);
    return rc;
}

HAMI_HOOK(CUresult, cuDeviceGraphMemTrim, (CUdevice device), (device))
{
    int index = hami_region_device_index(device);
    if (index < 0 || index >= HAMI_MAX_DEVICES)
        return real(device);
    pthread_mutex_lock(&graph_devs[index].lock);
    CUresult rc = real(device);
    graph_devs[index].generation++;
    settle(index, device);
    pthread_mutex_unlock(&graph_devs[index].lock);
    return rc;
}
