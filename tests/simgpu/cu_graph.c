/* Driver API: graphs of kernel nodes. A node keeps its kernel, launch shape and the
 * duration its launch books (the argument values are not kept: kernels do not compute
 * here, so reading a node's parameters back gives NULL kernelParams and extra). An
 * instantiated graph is a copy of its nodes; a launch queues them on the stream in the
 * order they were added (dependencies are checked, not used: the order added is a
 * valid order). Only kernel nodes exist, so no graph ever holds memory of its own (the
 * graph memory attributes read 0); stream capture is not simulated. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

struct sim_graph_node {
    const struct sim_graph_node *origin;  /* exec copies: the graph node it was made from */
    CUfunction func;
    unsigned grid[3], block[3], shared;
    uint64_t dur_us;
};

struct sim_graph {
    struct sim_graph_node **nodes;       /* graphs: the node handles; execs: their own copies */
    size_t count;
};

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    SIM_REQUIRE_INIT();
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_handle_put((uintptr_t)g, SIM_KIND_GRAPH, g);
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

/* A node's content from kernel node parameters (func, or kern when func is NULL). */
static CUresult node_params(struct sim_graph_node *n, const CUDA_KERNEL_NODE_PARAMS *p)
{
    CUfunction f = p->func ? p->func : (CUfunction)p->kern;
    if (!f || (!sim_handle_get((uintptr_t)f, SIM_KIND_FUNC) && !sim_handle_get((uintptr_t)f, SIM_KIND_KERNEL)))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY || !p->blockDimZ ||
        (uint64_t)p->blockDimX * p->blockDimY * p->blockDimZ > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t dur_us;
    CUresult rc = sim_kernel_time(f, p->kernelParams, p->extra, &dur_us);  /* arguments are read when added */
    if (rc != CUDA_SUCCESS)
        return rc;
    *n = (struct sim_graph_node){n->origin, f, {p->gridDimX, p->gridDimY, p->gridDimZ},
                                 {p->blockDimX, p->blockDimY, p->blockDimZ}, p->sharedMemBytes, dur_us};
    return CUDA_SUCCESS;
}

static int node_in(const struct sim_graph *g, const struct sim_graph_node *n)
{
    for (size_t i = 0; i < g->count; i++)
        if (g->nodes[i] == n)
            return 1;
    return 0;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *g = sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!g)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!phGraphNode || !nodeParams || (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < numDependencies; i++)
        if (!node_in(g, (const struct sim_graph_node *)dependencies[i]))
            return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph_node *n = calloc(1, sizeof *n);
    struct sim_graph_node **nodes = n ? realloc(g->nodes, (g->count + 1) * sizeof *nodes) : NULL;
    if (!nodes) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g->nodes = nodes;
    CUresult rc = node_params(n, nodeParams);
    if (rc != CUDA_SUCCESS) {
        free(n);
        return rc;
    }
    g->nodes[g->count++] = n;
    sim_handle_put((uintptr_t)n, SIM_KIND_GRAPH_NODE, n);
    *phGraphNode = (CUgraphNode)n;
    return CUDA_SUCCESS;
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *g = sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!g)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (size_t i = 0; i < *numNodes; i++)
            nodes[i] = i < g->count ? (CUgraphNode)g->nodes[i] : NULL;
    if (!nodes || *numNodes > g->count)
        *numNodes = g->count;
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    SIM_REQUIRE_INIT();
    if (!sim_handle_get((uintptr_t)hNode, SIM_KIND_GRAPH_NODE))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = CU_GRAPH_NODE_TYPE_KERNEL;
    return CUDA_SUCCESS;
}

static void params_of(const struct sim_graph_node *n, CUDA_KERNEL_NODE_PARAMS *p)
{
    *p = (CUDA_KERNEL_NODE_PARAMS){.func = n->func, .gridDimX = n->grid[0], .gridDimY = n->grid[1],
                                   .gridDimZ = n->grid[2], .blockDimX = n->block[0], .blockDimY = n->block[1],
                                   .blockDimZ = n->block[2], .sharedMemBytes = n->shared};
}

CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    SIM_REQUIRE_INIT();
    struct sim_graph_node *n = sim_handle_get((uintptr_t)hNode, SIM_KIND_GRAPH_NODE);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    params_of(n, nodeParams);
    return CUDA_SUCCESS;
}

/* The legacy parameter block is the first fields of the current one. */
CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    CUDA_KERNEL_NODE_PARAMS p;
    CUresult rc = nodeParams ? cuGraphKernelNodeGetParams_v2(hNode, &p) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        memcpy(nodeParams, &p, sizeof *nodeParams);
    return rc;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    SIM_REQUIRE_INIT();
    (void)flags;
    struct sim_graph *g = sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!g)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *e = calloc(1, sizeof *e);
    struct sim_graph_node *copies = e && g->count ? malloc(g->count * sizeof *copies) : NULL;
    if (!e || (g->count && (!copies || !(e->nodes = malloc(g->count * sizeof *e->nodes))))) {
        free(copies);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < g->count; i++) {
        copies[i] = *g->nodes[i];
        copies[i].origin = g->nodes[i];
        e->nodes[i] = &copies[i];
    }
    e->count = g->count;
    sim_handle_put((uintptr_t)e, SIM_KIND_GRAPH_EXEC, e);
    *phGraphExec = (CUgraphExec)e;
    return CUDA_SUCCESS;
}

/* The legacy form (and its _v2) reports an error node and a log, neither of which can arise here. */
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize)
{
    if (phErrorNode)
        *phErrorNode = NULL;
    if (logBuffer && bufferSize)
        logBuffer[0] = 0;
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}
extern __typeof__(cuGraphInstantiate) cuGraphInstantiate_v2 __attribute__((alias("cuGraphInstantiate")));

CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                           const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *e = sim_handle_get((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    if (!e || !sim_handle_get((uintptr_t)hNode, SIM_KIND_GRAPH_NODE))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->count; i++)
        if (e->nodes[i]->origin == (const struct sim_graph_node *)hNode)
            return node_params(e->nodes[i], nodeParams);
    return CUDA_ERROR_INVALID_VALUE;     /* not a node of the graph it was made from */
}

CUresult cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                        const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    CUDA_KERNEL_NODE_PARAMS p = {0};
    if (nodeParams)
        memcpy(&p, nodeParams, sizeof *nodeParams);
    return cuGraphExecKernelNodeSetParams_v2(hGraphExec, hNode, nodeParams ? &p : NULL);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *e = sim_handle_get((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (size_t i = 0; i < e->count; i++)
        sim_stream_enqueue_kernel(s, e->nodes[i]->dur_us);
    return CUDA_SUCCESS;
}
SIM_PER_THREAD(cuGraphLaunch, ptsz)

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *e = sim_handle_take((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->count)
        free(e->nodes[0]);               /* the copies are one array */
    free(e->nodes);
    free(e);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *g = sim_handle_take((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!g)
        return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < g->count; i++)
        free(sim_handle_take((uintptr_t)g->nodes[i], SIM_KIND_GRAPH_NODE));
    free(g->nodes);
    free(g);
    return CUDA_SUCCESS;
}

/* ---- graph memory: only memory-allocation nodes take it, and there are none ---- */

static CUresult graph_memory(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    SIM_REQUIRE_INIT();
    if (device < 0 || device >= sim_config()->visible)
        return CUDA_ERROR_INVALID_DEVICE;
    return !value || (unsigned)attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    CUresult rc = graph_memory(device, attr, value);
    if (rc == CUDA_SUCCESS)
        *(cuuint64_t *)value = 0;
    return rc;
}

/* Only the high watermarks can be set, and only back to 0. */
CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    CUresult rc = graph_memory(device, attr, value);
    if (rc == CUDA_SUCCESS && ((attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) ||
                               *(cuuint64_t *)value))
        rc = CUDA_ERROR_INVALID_VALUE;
    return rc;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    cuuint64_t none;
    return graph_memory(device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &none);
}
