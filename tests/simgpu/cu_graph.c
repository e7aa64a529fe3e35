/* Driver API: graphs, made by hand or by stream capture (cu_stream.c), and graph memory.
 *
 * Nodes: kernel, memcpy, memset, host, child graph, empty, event record / wait, memory
 * allocation and free. A kernel node keeps its kernel, launch shape and the duration its launch
 * books, not its argument values (kernels do not compute here: reading its parameters back gives
 * NULL kernelParams and extra). Copies and fills read and write memory when they run (a host
 * source is read at replay, as a graph's memcpy node does). An executable graph is a flattened
 * copy (child graphs expanded) in an order that respects the dependencies (the order the nodes
 * were added); a launch queues its nodes on the stream in that order, so each kernel books its
 * time on the device timeline one after another.
 *
 * Graph memory, as cuda.h documents it: an allocation node gets a fixed address when it is made
 * (capture of cuMemAllocAsync, or cuGraphAddMemAllocNode); no device memory is taken then nor at
 * instantiation. Uploading an executable graph or launching it the first time maps device memory
 * behind its allocations from a per-device reserve, grown in 2 MiB pages charged to the device
 * (so nvidia-smi and cuMemGetInfo show it); when the card cannot hold it: CUDA_ERROR_OUT_OF_MEMORY,
 * nothing taken. The memory stays mapped for later launches; cuDeviceGraphMemTrim unmaps what no
 * executing or scheduled graph and no live allocation needs and gives the unused reserve back.
 * An allocation the graph does not free lives on after the launch until cuMemFree(Async), a free
 * node of another graph, or the next launch of an executable made with AUTO_FREE_ON_LAUNCH; a
 * launch while it lives otherwise fails with CUDA_ERROR_INVALID_VALUE. USED is what is mapped,
 * RESERVED what is charged. Not simulated: sharing physical memory between allocations whose
 * lifetimes do not overlap (each allocation maps its own pages), conditional and batch memory
 * operation nodes, node removal, cloning, and device-side launch. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define GRAPH_EXEC_UPDATE_FAILURE ((CUresult)910)  /* CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE */

struct sim_galloc {                      /* one graph allocation (an allocation node's address) */
    uintptr_t va;
    size_t size;
    uint64_t bytes;                      /* whole 2 MiB pages */
    int dev;
    int refs;                            /* nodes and executable copies naming it, + 1 while live */
    int live;                            /* allocated by a launch and not freed yet */
    int mapped;                          /* device memory of the reserve is behind it */
    int freed_by_graph;                  /* a free node frees it */
    struct sim_exec *exec;               /* the executable graph that maps it */
    struct sim_alloc *alloc;             /* its address as the allocation registry sees it */
    struct sim_galloc *next;
};

struct sim_graph_node {
    struct sim_node_desc d;
    struct sim_graph_node **deps;
    size_t ndeps;
    struct sim_galloc *ga;               /* alloc node: its allocation; free node: the one it frees */
    CUDA_MEM_ALLOC_NODE_PARAMS alloc_params;
    const struct sim_graph_node *origin; /* an executable's copy: the graph node it was made from */
};

struct sim_graph {
    struct sim_graph_node **nodes;
    size_t count;
    int registered;                      /* a CUgraph handle (not an executable's private copy) */
    int has_mem;                         /* holds memory allocation or free nodes */
    _Atomic int capturing;               /* a capture adds to it */
    struct sim_exec *exec;               /* with memory nodes: its one executable graph */
};

struct sim_exec {
    struct sim_graph_node *nodes;        /* flattened copies, in launch order */
    size_t count;
    struct sim_graph *shape;             /* a private copy of the graph, for updates and capture */
    struct sim_graph *source;            /* the graph it was made from, while it exists */
    unsigned long long flags;
    int inflight;                        /* launches queued and not finished */
    int destroyed;
};

static pthread_mutex_t gm_lock = PTHREAD_MUTEX_INITIALIZER;  /* graph memory, executables' state */
static struct sim_galloc *gallocs;
static struct { uint64_t used, used_high, reserved, reserved_high; } gm[SIM_MAX_DEVICES];

/* ---- graph allocations ---- */

static void galloc_unref_locked(struct sim_galloc *ga)
{
    if (!ga || --ga->refs > 0)
        return;
    if (ga->mapped)
        gm[ga->dev].used -= ga->bytes;
    for (struct sim_galloc **p = &gallocs; *p; p = &(*p)->next)
        if (*p == ga) {
            *p = ga->next;
            break;
        }
    sim_handle_take(ga->va, SIM_KIND_ALLOC);
    free(ga->alloc);
    munmap((void *)ga->va, ga->bytes);
    free(ga);
}

static CUresult galloc_new(int dev, size_t size, struct sim_galloc **out)
{
    if (!size || size > sim_config()->memory_mib * SIM_MIB)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_galloc *ga = calloc(1, sizeof *ga);
    struct sim_alloc *a = calloc(1, sizeof *a);
    uint64_t bytes = sim_round_up(size, SIM_PAGE);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!ga || !a || p == MAP_FAILED) {
        free(ga);
        free(a);
        if (p != MAP_FAILED)
            munmap(p, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ga = (struct sim_galloc){.va = (uintptr_t)p, .size = size, .bytes = bytes, .dev = dev, .refs = 1, .alloc = a};
    /* the address answers pointer queries and copies as device memory; it charges nothing */
    *a = (struct sim_alloc){.base = ga->va, .size = size, .dev = dev, .ctx = sim_ctx_current(), .graph = ga};
    pthread_mutex_lock(&gm_lock);
    ga->next = gallocs;
    gallocs = ga;
    pthread_mutex_unlock(&gm_lock);
    sim_handle_put(ga->va, SIM_KIND_ALLOC, a);
    *out = ga;
    return CUDA_SUCCESS;
}

/* A live allocation is given back (gm_lock held). Its memory stays mapped for the executable
 * that made it, or goes back to the reserve when that executable is gone. */
static void galloc_release_locked(struct sim_galloc *ga)
{
    ga->live = 0;
    if (!ga->exec && ga->mapped) {
        ga->mapped = 0;
        gm[ga->dev].used -= ga->bytes;
    }
    galloc_unref_locked(ga);
}

CUresult sim_graph_mem_free(struct sim_galloc *ga)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&gm_lock);
    if (!ga->live)
        rc = CUDA_ERROR_INVALID_VALUE;  /* not allocated now */
    else
        galloc_release_locked(ga);
    pthread_mutex_unlock(&gm_lock);
    return rc;
}

static void high(uint64_t *hi, uint64_t v)
{
    if (v > *hi)
        *hi = v;
}

/* Maps device memory behind every allocation of e (gm_lock held): from the reserve, which grows
 * in 2 MiB pages; all or nothing. */
static CUresult exec_map_locked(struct sim_exec *e)
{
    uint64_t need[SIM_MAX_DEVICES] = {0}, grown[SIM_MAX_DEVICES] = {0};
    for (size_t i = 0; i < e->count; i++) {
        struct sim_galloc *ga = e->nodes[i].d.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ? e->nodes[i].ga : NULL;
        if (ga && !ga->mapped)
            need[ga->dev] += ga->bytes;
    }
    int visible = sim_config()->visible;
    for (int dev = 0; dev < visible; dev++) {
        uint64_t spare = gm[dev].reserved - gm[dev].used;
        if (need[dev] <= spare)
            continue;
        grown[dev] = sim_round_up(need[dev] - spare, SIM_PAGE);
        if (sim_charge(dev, grown[dev]) < 0) {
            for (int d = 0; d < dev; d++)
                if (grown[d])
                    sim_uncharge(d, grown[d]);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    for (int dev = 0; dev < visible; dev++) {
        gm[dev].reserved += grown[dev];
        gm[dev].used += need[dev];
        high(&gm[dev].reserved_high, gm[dev].reserved);
        high(&gm[dev].used_high, gm[dev].used);
    }
    for (size_t i = 0; i < e->count; i++)
        if (e->nodes[i].d.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            e->nodes[i].ga->mapped = 1;
    return CUDA_SUCCESS;
}

/* ---- graphs and nodes ---- */

static struct sim_graph *graph_alloc(int registered)
{
    struct sim_graph *g = calloc(1, sizeof *g);
    if (!g)
        abort();
    g->registered = registered;
    if (registered)
        sim_handle_put((uintptr_t)g, SIM_KIND_GRAPH, g);
    return g;
}

struct sim_graph *sim_graph_new(void) { return graph_alloc(1); }

void sim_graph_set_capturing(struct sim_graph *g, int on) { g->capturing = on; }

static void node_free(struct sim_graph_node *n, int registered)
{
    if (registered)
        sim_handle_take((uintptr_t)n, SIM_KIND_GRAPH_NODE);
    if (n->ga) {
        pthread_mutex_lock(&gm_lock);
        if (n->d.type == CU_GRAPH_NODE_TYPE_MEM_FREE && registered)
            n->ga->freed_by_graph = 0;   /* no graph frees it any more (an executable's copy is not one) */
        galloc_unref_locked(n->ga);
        pthread_mutex_unlock(&gm_lock);
    }
    if (n->d.child)
        sim_graph_free(n->d.child);
    free(n->deps);
    free(n);
}

void sim_graph_free(struct sim_graph *g)
{
    if (g->registered)
        sim_handle_take((uintptr_t)g, SIM_KIND_GRAPH);
    pthread_mutex_lock(&gm_lock);
    if (g->exec)
        g->exec->source = NULL;
    pthread_mutex_unlock(&gm_lock);
    for (size_t i = 0; i < g->count; i++)
        node_free(g->nodes[i], g->registered);
    free(g->nodes);
    free(g);
}

static int node_in(const struct sim_graph *g, const struct sim_graph_node *n)
{
    for (size_t i = 0; i < g->count; i++)
        if (g->nodes[i] == n)
            return 1;
    return 0;
}

static size_t node_index(const struct sim_graph *g, const struct sim_graph_node *n)
{
    size_t i = 0;
    while (i < g->count && g->nodes[i] != n)
        i++;
    return i;
}

int sim_graph_node_before(const struct sim_graph_node *a, const struct sim_graph_node *b)
{
    if (a == b)
        return 1;
    for (size_t i = 0; i < b->ndeps; i++)
        if (sim_graph_node_before(a, b->deps[i]))
            return 1;
    return 0;
}

/* Adds a node of content d after deps. Memory nodes: an allocation node makes its allocation
 * (d->dptr is set); a free node must name a graph allocation no graph frees yet. */
CUresult sim_graph_add(struct sim_graph *g, struct sim_graph_node *const *deps, size_t ndeps,
                       struct sim_node_desc *d, struct sim_graph_node **out)
{
    for (size_t i = 0; i < ndeps; i++) {
        if (!node_in(g, deps[i]))
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t j = 0; j < i; j++)
            if (deps[j] == deps[i])
                return CUDA_ERROR_INVALID_VALUE;  /* "dependencies may not have any duplicate entries" */
    }
    struct sim_graph_node *n = calloc(1, sizeof *n);
    struct sim_graph_node **nodes = n ? realloc(g->nodes, (g->count + 1) * sizeof *nodes) : NULL;
    if (!nodes) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g->nodes = nodes;
    if (ndeps && !(n->deps = malloc(ndeps * sizeof *n->deps))) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (ndeps)
        memcpy(n->deps, deps, ndeps * sizeof *deps);
    n->ndeps = ndeps;
    n->d = *d;
    if (d->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
        CUresult rc = galloc_new(d->dev, d->bytes, &n->ga);
        if (rc != CUDA_SUCCESS) {
            free(n->deps);
            free(n);
            return rc;
        }
        d->dptr = n->d.dptr = n->ga->va;
        n->alloc_params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        n->alloc_params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        n->alloc_params.poolProps.location.id = d->dev;
        n->alloc_params.bytesize = d->bytes;
        n->alloc_params.dptr = n->ga->va;
        g->has_mem = 1;
    } else if (d->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
        struct sim_alloc *a = sim_handle_get((uintptr_t)d->dptr, SIM_KIND_ALLOC);
        CUresult rc = CUDA_SUCCESS;
        pthread_mutex_lock(&gm_lock);
        if (!a || !a->graph || a->graph->freed_by_graph)
            rc = CUDA_ERROR_INVALID_VALUE;  /* not an allocation node's address, or freed by a graph already */
        else {
            n->ga = a->graph;
            n->ga->freed_by_graph = 1;
            n->ga->refs++;
        }
        pthread_mutex_unlock(&gm_lock);
        if (rc != CUDA_SUCCESS) {
            free(n->deps);
            free(n);
            return rc;
        }
        g->has_mem = 1;
    }
    g->nodes[g->count++] = n;
    if (g->registered)
        sim_handle_put((uintptr_t)n, SIM_KIND_GRAPH_NODE, n);
    *out = n;
    return CUDA_SUCCESS;
}

/* A private copy of g (child graphs copied too), for an executable graph. */
static struct sim_graph *graph_copy(const struct sim_graph *g)
{
    struct sim_graph *c = graph_alloc(0);
    c->has_mem = g->has_mem;
    c->nodes = g->count ? calloc(g->count, sizeof *c->nodes) : NULL;
    if (g->count && !c->nodes)
        abort();
    for (size_t i = 0; i < g->count; i++) {
        const struct sim_graph_node *o = g->nodes[i];
        struct sim_graph_node *n = malloc(sizeof *n);
        struct sim_graph_node **deps = o->ndeps ? malloc(o->ndeps * sizeof *deps) : NULL;
        if (!n || (o->ndeps && !deps))
            abort();
        *n = (struct sim_graph_node){.d = o->d, .deps = deps, .ndeps = o->ndeps, .ga = o->ga,
                                     .alloc_params = o->alloc_params, .origin = o};
        for (size_t j = 0; j < o->ndeps; j++)
            n->deps[j] = c->nodes[node_index(g, o->deps[j])];
        if (o->d.child)
            n->d.child = graph_copy(o->d.child);
        if (n->ga) {
            pthread_mutex_lock(&gm_lock);
            n->ga->refs++;
            pthread_mutex_unlock(&gm_lock);
        }
        c->nodes[i] = n;
        c->count = i + 1;
    }
    return c;
}

#define GRAPH_OF(var, h)                                                      \
    struct sim_graph *var = sim_handle_get((uintptr_t)(h), SIM_KIND_GRAPH);   \
    if (!var)                                                                 \
        return CUDA_ERROR_INVALID_VALUE

/* The common part of the cuGraphAdd*Node calls. */
static CUresult add_node(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                         size_t numDependencies, struct sim_node_desc *d)
{
    SIM_REQUIRE_INIT();
    GRAPH_OF(g, hGraph);
    if (!phGraphNode || (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph_node *n;
    CUresult rc = sim_graph_add(g, (struct sim_graph_node *const *)dependencies, numDependencies, d, &n);
    if (rc == CUDA_SUCCESS)
        *phGraphNode = (CUgraphNode)n;
    return rc;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    SIM_REQUIRE_INIT();
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = (CUgraph)sim_graph_new();
    return CUDA_SUCCESS;
}

/* A kernel node's content from its parameters (func, or kern when func is NULL). */
static CUresult kernel_desc(struct sim_node_desc *d, const CUDA_KERNEL_NODE_PARAMS *p)
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
    *d = (struct sim_node_desc){.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = f,
                                .grid = {p->gridDimX, p->gridDimY, p->gridDimZ},
                                .block = {p->blockDimX, p->blockDimY, p->blockDimZ},
                                .shared = p->sharedMemBytes, .dur_us = dur_us};
    return CUDA_SUCCESS;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    SIM_REQUIRE_INIT();
    if (!sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_node_desc d;
    CUresult rc = kernel_desc(&d, nodeParams);
    return rc != CUDA_SUCCESS ? rc : add_node(phGraphNode, hGraph, dependencies, numDependencies, &d);
}

CUresult cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                             size_t numDependencies)
{
    struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_EMPTY};
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, &d);
}

CUresult cuGraphAddHostNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, const CUDA_HOST_NODE_PARAMS *nodeParams)
{
    if (!nodeParams || !nodeParams->fn)
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_HOST, .fn = nodeParams->fn, .user = nodeParams->userData};
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, &d);
}

/* The child graph is copied into the node, as the driver does. */
CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, CUgraph childGraph)
{
    SIM_REQUIRE_INIT();
    GRAPH_OF(child, childGraph);
    if (child->has_mem)                  /* only by moving ownership, which is not simulated */
        return CUDA_ERROR_NOT_SUPPORTED;
    struct sim_graph *copy = graph_copy(child);
    copy->registered = 1;                /* the node's graph is a handle cuGraphChildGraphNodeGetGraph gives */
    sim_handle_put((uintptr_t)copy, SIM_KIND_GRAPH, copy);
    struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_GRAPH, .child = copy};
    CUresult rc = add_node(phGraphNode, hGraph, dependencies, numDependencies, &d);
    if (rc != CUDA_SUCCESS)
        sim_graph_free(copy);
    return rc;
}

static CUresult event_node(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           size_t numDependencies, CUevent event, CUgraphNodeType type)
{
    SIM_REQUIRE_INIT();
    if (!sim_handle_get((uintptr_t)event, SIM_KIND_EVENT))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_node_desc d = {.type = type, .event = event};
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, &d);
}

CUresult cuGraphAddEventRecordNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                   size_t numDependencies, CUevent event)
{
    return event_node(phGraphNode, hGraph, dependencies, numDependencies, event, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}

CUresult cuGraphAddEventWaitNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, CUevent event)
{
    return event_node(phGraphNode, hGraph, dependencies, numDependencies, event, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    SIM_REQUIRE_INIT();
    if (!nodeParams || nodeParams->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        nodeParams->poolProps.location.id < 0 || nodeParams->poolProps.location.id >= sim_config()->visible ||
        !nodeParams->bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .bytes = nodeParams->bytesize,
                              .dev = nodeParams->poolProps.location.id};
    CUresult rc = add_node(phGraphNode, hGraph, dependencies, numDependencies, &d);
    if (rc == CUDA_SUCCESS)
        nodeParams->dptr = d.dptr;
    return rc;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               size_t numDependencies, CUdeviceptr dptr)
{
    struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE, .dptr = dptr};
    return add_node(phGraphNode, hGraph, dependencies, numDependencies, &d);
}

/* ---- queries ---- */

#define NODE_OF(var, h)                                                              \
    SIM_REQUIRE_INIT();                                                              \
    struct sim_graph_node *var = sim_handle_get((uintptr_t)(h), SIM_KIND_GRAPH_NODE); \
    if (!var)                                                                        \
        return CUDA_ERROR_INVALID_VALUE

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
    struct sim_graph_node *n = sim_handle_get((uintptr_t)hNode, SIM_KIND_GRAPH_NODE);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n->d.type;
    return CUDA_SUCCESS;
}

/* Edge data is all zero here (8 bytes each: ports and type). */
CUresult cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode *dependencies, CUgraphEdgeData *edgeData,
                                       size_t *numDependencies)
{
    NODE_OF(n, hNode);
    if (!numDependencies || (edgeData && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    if (dependencies) {
        for (size_t i = 0; i < *numDependencies; i++)
            dependencies[i] = i < n->ndeps ? (CUgraphNode)n->deps[i] : NULL;
        if (edgeData)
            memset(edgeData, 0, *numDependencies * 8);
    }
    if (!dependencies || *numDependencies > n->ndeps)
        *numDependencies = n->ndeps;
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetDependencies(CUgraphNode hNode, CUgraphNode *dependencies, size_t *numDependencies)
{
    return cuGraphNodeGetDependencies_v2(hNode, dependencies, NULL, numDependencies);
}

CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    SIM_REQUIRE_INIT();
    struct sim_graph_node *n = sim_handle_get((uintptr_t)hNode, SIM_KIND_GRAPH_NODE);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!nodeParams || n->d.type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    *nodeParams = (CUDA_KERNEL_NODE_PARAMS){.func = n->d.func, .gridDimX = n->d.grid[0], .gridDimY = n->d.grid[1],
                                            .gridDimZ = n->d.grid[2], .blockDimX = n->d.block[0],
                                            .blockDimY = n->d.block[1], .blockDimZ = n->d.block[2],
                                            .sharedMemBytes = n->d.shared};
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

CUresult cuGraphHostNodeGetParams(CUgraphNode hNode, CUDA_HOST_NODE_PARAMS *nodeParams)
{
    NODE_OF(n, hNode);
    if (!nodeParams || n->d.type != CU_GRAPH_NODE_TYPE_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    *nodeParams = (CUDA_HOST_NODE_PARAMS){n->d.fn, n->d.user};
    return CUDA_SUCCESS;
}

CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    NODE_OF(n, hNode);
    if (!phGraph || n->d.type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = (CUgraph)n->d.child;
    return CUDA_SUCCESS;
}

static CUresult node_event(CUgraphNode hNode, CUevent *event_out, CUgraphNodeType type)
{
    NODE_OF(n, hNode);
    if (!event_out || n->d.type != type)
        return CUDA_ERROR_INVALID_VALUE;
    *event_out = n->d.event;
    return CUDA_SUCCESS;
}

CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode hNode, CUevent *event_out)
{
    return node_event(hNode, event_out, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}

CUresult cuGraphEventWaitNodeGetEvent(CUgraphNode hNode, CUevent *event_out)
{
    return node_event(hNode, event_out, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out)
{
    NODE_OF(n, hNode);
    if (!params_out || n->d.type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    *params_out = n->alloc_params;
    return CUDA_SUCCESS;
}

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out)
{
    NODE_OF(n, hNode);
    if (!dptr_out || n->d.type != CU_GRAPH_NODE_TYPE_MEM_FREE)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr_out = n->d.dptr;
    return CUDA_SUCCESS;
}

/* ---- executable graphs ---- */

static size_t flat_count(const struct sim_graph *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->count; i++)
        n += g->nodes[i]->d.type == CU_GRAPH_NODE_TYPE_GRAPH ? flat_count(g->nodes[i]->d.child) : 1;
    return n;
}

/* Copies g's nodes into out (children expanded), each copy naming the node it came from. */
static size_t flatten(const struct sim_graph *g, struct sim_graph_node *out)
{
    size_t k = 0;
    for (size_t i = 0; i < g->count; i++) {
        const struct sim_graph_node *o = g->nodes[i];
        if (o->d.type == CU_GRAPH_NODE_TYPE_GRAPH) {
            k += flatten(o->d.child, out + k);
            continue;
        }
        out[k] = (struct sim_graph_node){.d = o->d, .ga = o->ga, .origin = o};
        if (o->ga)
            o->ga->refs++;
        k++;
    }
    return k;
}

static CUresult exec_upload(struct sim_exec *e);

static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags,
                            CUstream upload_stream, CUgraphInstantiateResult *result)
{
    SIM_REQUIRE_INIT();
    if (result)
        *result = CUDA_GRAPH_INSTANTIATE_ERROR;
    struct sim_graph *g = sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!g)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!phGraphExec || (flags & ~(unsigned long long)0xf) || ((flags & 1) && (flags & 4)))
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & 4)                       /* device launch */
        return CUDA_ERROR_NOT_SUPPORTED;
    struct sim_stream *us = NULL;
    if (flags & 2) {                     /* CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD */
        CUresult rc = sim_stream_resolve(upload_stream, &us);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    struct sim_exec *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t count = flat_count(g);
    if (count && !(e->nodes = calloc(count, sizeof *e->nodes))) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&gm_lock);
    if (g->has_mem && g->exec) {
        /* "there can be at most one executable graph in existence for that graph at a time" */
        pthread_mutex_unlock(&gm_lock);
        free(e->nodes);
        free(e);
        return CUDA_ERROR_INVALID_VALUE;
    }
    e->count = flatten(g, e->nodes);
    e->flags = flags;
    if (g->has_mem) {
        g->exec = e;
        e->source = g;
        for (size_t i = 0; i < e->count; i++)
            if (e->nodes[i].d.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
                e->nodes[i].ga->exec = e;
    }
    pthread_mutex_unlock(&gm_lock);
    e->shape = graph_copy(g);
    sim_handle_put((uintptr_t)e, SIM_KIND_GRAPH_EXEC, e);
    *phGraphExec = (CUgraphExec)e;
    if (us) {
        CUresult rc = exec_upload(e);
        if (rc != CUDA_SUCCESS) {
            cuGraphExecDestroy(*phGraphExec);
            *phGraphExec = NULL;
            return rc;
        }
    }
    if (result)
        *result = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    if (flags & 2)                       /* upload needs a stream: only through the parameters */
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return instantiate(phGraphExec, hGraph, flags, NULL, NULL);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    if (!instantiateParams)
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    instantiateParams->hErrNode_out = NULL;
    return instantiate(phGraphExec, hGraph, instantiateParams->flags, instantiateParams->hUploadStream,
                       &instantiateParams->result_out);
}
SIM_PER_THREAD(cuGraphInstantiateWithParams, ptsz)

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
    struct sim_exec *e = sim_handle_get((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    if (!e || !sim_handle_get((uintptr_t)hNode, SIM_KIND_GRAPH_NODE))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < e->count; i++)
        if (e->nodes[i].origin == (const struct sim_graph_node *)hNode) {
            if (e->nodes[i].d.type != CU_GRAPH_NODE_TYPE_KERNEL)
                return CUDA_ERROR_INVALID_VALUE;
            struct sim_node_desc d;
            CUresult rc = kernel_desc(&d, nodeParams);
            if (rc == CUDA_SUCCESS)
                e->nodes[i].d = d;
            return rc;
        }
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

static CUresult exec_upload(struct sim_exec *e)
{
    pthread_mutex_lock(&gm_lock);
    CUresult rc = exec_map_locked(e);
    pthread_mutex_unlock(&gm_lock);
    return rc;
}

CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_exec *e = sim_handle_get((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing)                       /* nothing to upload into a capture: not simulated */
        return sim_capture_refuse(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    return exec_upload(e);
}
SIM_PER_THREAD(cuGraphUpload, ptsz)

static void exec_free(struct sim_exec *e)
{
    pthread_mutex_lock(&gm_lock);
    for (size_t i = 0; i < e->count; i++)
        galloc_unref_locked(e->nodes[i].ga);
    pthread_mutex_unlock(&gm_lock);
    sim_graph_free(e->shape);
    free(e->nodes);
    free(e);
}

static void launch_done(void *arg)
{
    struct sim_exec *e = arg;
    pthread_mutex_lock(&gm_lock);
    int gone = --e->inflight == 0 && e->destroyed;
    pthread_mutex_unlock(&gm_lock);
    if (gone)
        exec_free(e);
}

static void run_node(void *arg)
{
    struct sim_graph_node *n = arg;
    const struct sim_node_desc *d = &n->d;
    for (size_t row = 0; row < d->height; row++) {
        unsigned char *dst = (unsigned char *)d->dst + row * d->dst_pitch;
        if (d->type == CU_GRAPH_NODE_TYPE_MEMCPY)
            memmove(dst, (const unsigned char *)d->src + row * d->src_pitch, d->width);
        else if (d->elem == 1)
            memset(dst, (int)d->value, d->width);
        else
            for (size_t i = 0; i < d->width; i++)
                memcpy(dst + i * d->elem, &d->value, d->elem);  /* little-endian: the low bytes */
    }
    if (d->type == CU_GRAPH_NODE_TYPE_HOST) {
        d->fn(d->user);
        sim_stream_gpu_reach(sim_now_ns());   /* the graph's later nodes waited for the host */
    }
}

/* Whether e has a node of `type` for allocation ga. */
static int exec_has(const struct sim_exec *e, CUgraphNodeType type, const struct sim_galloc *ga)
{
    for (size_t i = 0; i < e->count; i++)
        if (e->nodes[i].d.type == type && e->nodes[i].ga == ga)
            return 1;
    return 0;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_exec *e = sim_handle_get((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing) {
        /* a launch in a capture is captured as a child graph node holding a copy of the graph;
         * one with memory nodes cannot be a child graph (cuGraphAddMemAllocNode's restrictions) */
        if (e->shape->has_mem)
            return sim_capture_refuse(s, CUDA_ERROR_NOT_SUPPORTED);
        struct sim_graph *child = graph_copy(e->shape);
        child->registered = 1;
        sim_handle_put((uintptr_t)child, SIM_KIND_GRAPH, child);
        struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_GRAPH, .child = child};
        rc = sim_capture_add(s, &d);
        if (rc != CUDA_SUCCESS)
            sim_graph_free(child);
        return rc;
    }
    pthread_mutex_lock(&gm_lock);
    for (size_t i = 0; i < e->count && rc == CUDA_SUCCESS; i++) {
        struct sim_galloc *ga = e->nodes[i].d.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ? e->nodes[i].ga : NULL;
        if (ga && ga->live && !(e->flags & 1))  /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */
            rc = CUDA_ERROR_INVALID_VALUE;      /* an allocation of the last launch is still unfreed */
    }
    if (rc == CUDA_SUCCESS)
        rc = exec_map_locked(e);
    if (rc == CUDA_SUCCESS) {
        for (size_t i = 0; i < e->count; i++) {
            struct sim_galloc *ga = e->nodes[i].ga;
            if (e->nodes[i].d.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
                if (ga->live)            /* auto-free: as though cuMemFreeAsync came first */
                    galloc_release_locked(ga);
                if (!exec_has(e, CU_GRAPH_NODE_TYPE_MEM_FREE, ga)) {  /* it outlives the launch */
                    ga->live = 1;
                    ga->refs++;
                }
            } else if (e->nodes[i].d.type == CU_GRAPH_NODE_TYPE_MEM_FREE && ga->live &&
                       !exec_has(e, CU_GRAPH_NODE_TYPE_MEM_ALLOC, ga)) {
                galloc_release_locked(ga);  /* an allocation of another graph */
            }
        }
        e->inflight++;
    }
    pthread_mutex_unlock(&gm_lock);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (size_t i = 0; i < e->count; i++) {
        struct sim_graph_node *n = &e->nodes[i];
        switch (n->d.type) {
        case CU_GRAPH_NODE_TYPE_KERNEL:
            sim_stream_enqueue_kernel(s, n->d.dur_us);
            break;
        case CU_GRAPH_NODE_TYPE_MEMCPY:
        case CU_GRAPH_NODE_TYPE_MEMSET:
        case CU_GRAPH_NODE_TYPE_HOST:
            sim_stream_enqueue_call(s, run_node, n);
            break;
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            sim_stream_enqueue_event_record(s, n->d.event);
            break;
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
            sim_stream_enqueue_event_wait(s, n->d.event);
            break;
        default:                         /* empty, memory nodes: nothing runs */
            break;
        }
    }
    sim_stream_enqueue_call(s, launch_done, e);
    return CUDA_SUCCESS;
}
SIM_PER_THREAD(cuGraphLaunch, ptsz)

/* The executable goes at once for the caller; a launch still queued keeps its copy until it
 * ends. Live allocations outlive it (their memory goes back to the reserve when freed). */
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    SIM_REQUIRE_INIT();
    struct sim_exec *e = sim_handle_take((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&gm_lock);
    if (e->source)
        e->source->exec = NULL;
    for (size_t i = 0; i < e->count; i++) {
        struct sim_galloc *ga = e->nodes[i].ga;
        if (e->nodes[i].d.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && ga->exec == e) {
            ga->exec = NULL;
            if (ga->mapped && !ga->live) {
                ga->mapped = 0;
                gm[ga->dev].used -= ga->bytes;
            }
        }
    }
    e->destroyed = 1;
    int now = e->inflight == 0;
    pthread_mutex_unlock(&gm_lock);
    if (now)
        exec_free(e);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *g = sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!g || g->capturing)              /* "all operations other than destroy" while capturing into it */
        return CUDA_ERROR_INVALID_VALUE;
    sim_graph_free(g);
    return CUDA_SUCCESS;
}

/* ---- updates: a graph of the same topology gives its parameters ---- */

static CUgraphExecUpdateResult same_shape(const struct sim_graph *a, const struct sim_graph *b,
                                          const struct sim_graph_node **err, const struct sim_graph_node **from)
{
    if (a->count != b->count)
        return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    for (size_t i = 0; i < a->count; i++) {
        const struct sim_graph_node *x = a->nodes[i], *y = b->nodes[i];
        *err = y;
        if (x->ndeps != y->ndeps)
            return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        for (size_t j = 0; j < x->ndeps; j++)
            if (node_index(a, x->deps[j]) != node_index(b, y->deps[j])) {
                *from = y->deps[j];
                return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
            }
        if (x->d.type != y->d.type)
            return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
        if (x->d.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || x->d.type == CU_GRAPH_NODE_TYPE_MEM_FREE)
            return CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED;  /* memory nodes: not simulated */
        if (x->d.type == CU_GRAPH_NODE_TYPE_GRAPH) {
            CUgraphExecUpdateResult r = same_shape(x->d.child, y->d.child, err, from);
            if (r != CU_GRAPH_EXEC_UPDATE_SUCCESS)
                return r;
        }
    }
    *err = NULL;
    return CU_GRAPH_EXEC_UPDATE_SUCCESS;
}

CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
    SIM_REQUIRE_INIT();
    struct sim_exec *e = sim_handle_get((uintptr_t)hGraphExec, SIM_KIND_GRAPH_EXEC);
    struct sim_graph *g = sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!e || !g || !resultInfo)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_graph_node *err = NULL, *from = NULL;
    CUgraphExecUpdateResult r = same_shape(e->shape, g, &err, &from);
    *resultInfo = (CUgraphExecUpdateResultInfo){r, (CUgraphNode)err, (CUgraphNode)from};
    if (r != CU_GRAPH_EXEC_UPDATE_SUCCESS)
        return GRAPH_EXEC_UPDATE_FAILURE;
    /* same topology: the flattened order pairs the nodes; the next launch runs the new parameters */
    struct sim_graph_node *fresh = e->count ? calloc(e->count, sizeof *fresh) : NULL;
    if (e->count && !fresh)
        return CUDA_ERROR_OUT_OF_MEMORY;
    flatten(g, fresh);
    pthread_mutex_lock(&gm_lock);
    for (size_t i = 0; i < e->count; i++)
        e->nodes[i].d = fresh[i].d;       /* no memory nodes here: no references taken */
    pthread_mutex_unlock(&gm_lock);
    free(fresh);
    struct sim_graph *old = e->shape;
    e->shape = graph_copy(g);
    sim_graph_free(old);
    return CUDA_SUCCESS;
}

CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                           CUgraphExecUpdateResult *updateResult_out)
{
    CUgraphExecUpdateResultInfo info = {CU_GRAPH_EXEC_UPDATE_ERROR, NULL, NULL};
    CUresult rc = cuGraphExecUpdate_v2(hGraphExec, hGraph, &info);
    if (hErrorNode_out)
        *hErrorNode_out = info.errorNode;
    if (updateResult_out)
        *updateResult_out = info.result;
    return rc;
}

/* ---- graph memory attributes and trimming ---- */

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
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&gm_lock);
    uint64_t v[] = {gm[device].used, gm[device].used_high, gm[device].reserved, gm[device].reserved_high};
    pthread_mutex_unlock(&gm_lock);
    *(cuuint64_t *)value = v[attr];
    return CUDA_SUCCESS;
}

/* Only the high watermarks can be set, and only back to 0. */
CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    CUresult rc = graph_memory(device, attr, value);
    if (rc == CUDA_SUCCESS && ((attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) ||
                               *(cuuint64_t *)value))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&gm_lock);
        if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
            gm[device].used_high = 0;
        else
            gm[device].reserved_high = 0;
        pthread_mutex_unlock(&gm_lock);
    }
    return rc;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    SIM_REQUIRE_INIT();
    if (device < 0 || device >= sim_config()->visible)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&gm_lock);
    for (struct sim_galloc *ga = gallocs; ga; ga = ga->next)
        if (ga->dev == device && ga->mapped && !ga->live && !(ga->exec && ga->exec->inflight)) {
            ga->mapped = 0;
            gm[device].used -= ga->bytes;
        }
    if (gm[device].reserved > gm[device].used) {
        sim_uncharge(device, gm[device].reserved - gm[device].used);
        gm[device].reserved = gm[device].used;
    }
    pthread_mutex_unlock(&gm_lock);
    return CUDA_SUCCESS;
}
