/* Driver API: modules, kernel launches and kernel graphs. Modules are read as the
 * driver reads them (sim_image.c): cuModuleGetFunction finds only the kernels an
 * image holds. The simulator's test kernels (`spin`, `sleep_kernel`, `empty`, in a
 * test image or in a real one that defines them) take their duration in
 * microseconds as their first parameter (uint64); every other kernel runs for the
 * configured `kernel_us`. Either way it occupies its stream's device for that long. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

struct sim_module { struct sim_ctx *ctx; struct sim_image image; };
struct sim_func {
    struct sim_module *mod;
    const char *name;
    int cache_config;
};

static CUresult load_module(CUmodule *module, const void *image)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sim_image_parse(image, &m->image);
    if (rc != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    m->ctx = ctx;
    sim_handle_put((uintptr_t)m, SIM_KIND_MODULE, m);
    *module = (CUmodule)m;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    SIM_REQUIRE_INIT();
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    char *data;
    size_t len;
    CUresult rc = sim_image_read_file(fname, &data, &len);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = load_module(module, data);
    free(data);  /* the module keeps what it read, not the bytes */
    return rc;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    SIM_REQUIRE_INIT();
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return load_module(module, image);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                            void **optionValues)
{
    SIM_REQUIRE_INIT();
    if (numOptions > 0 && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(module, image);
}

struct func_key { struct sim_module *mod; const char *name; };

static int func_of_module(void *val, void *arg) { return ((struct sim_func *)val)->mod == arg; }

static int same_func(void *val, void *arg)
{
    struct sim_func *f = val;
    struct func_key *k = arg;
    return f->mod == k->mod && !strcmp(f->name, k->name);
}

/* One handle per kernel and module, as the driver returns the same CUfunction each time. */
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    SIM_REQUIRE_INIT();
    struct sim_module *m = sim_handle_get((uintptr_t)hmod, SIM_KIND_MODULE);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    const char *kernel = sim_image_kernel(&m->image, name);
    if (!kernel && !m->image.opaque)
        return CUDA_ERROR_NOT_FOUND;
    struct func_key key = {m, name};
    struct sim_func *f = sim_handle_find(SIM_KIND_FUNC, same_func, &key);
    if (!f) {
        char *own = kernel ? NULL : strdup(name);
        if (!(f = calloc(1, sizeof *f)) || (!kernel && !own)) {
            free(f);
            free(own);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *f = (struct sim_func){.mod = m, .name = kernel ? kernel : own};
        sim_handle_put((uintptr_t)f, SIM_KIND_FUNC, f);
    }
    *hfunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

static void func_free(struct sim_func *f)
{
    if (!sim_image_kernel(&f->mod->image, f->name))
        free((char *)f->name);
    free(f);
}

CUresult cuModuleUnload(CUmodule hmod)
{
    SIM_REQUIRE_INIT();
    struct sim_module *m = sim_handle_take((uintptr_t)hmod, SIM_KIND_MODULE);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_func *f;
    while ((f = sim_handle_find(SIM_KIND_FUNC, func_of_module, m))) {
        sim_handle_take((uintptr_t)f, SIM_KIND_FUNC);
        func_free(f);
    }
    sim_image_free(&m->image);
    free(m);
    return CUDA_SUCCESS;
}

/* ---- what the runtime asks of a kernel beyond its attributes (cu_function.c) ---- */

CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    SIM_REQUIRE_INIT();
    struct sim_func *f = sim_handle_get((uintptr_t)hfunc, SIM_KIND_FUNC);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((unsigned)config > CU_FUNC_CACHE_PREFER_EQUAL)
        return CUDA_ERROR_INVALID_VALUE;
    f->cache_config = config;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    SIM_REQUIRE_INIT();
    struct sim_func *f = sim_handle_get((uintptr_t)hfunc, SIM_KIND_FUNC);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = f->name;
    return CUDA_SUCCESS;
}

/* How long a kernel runs: a test kernel's first parameter, else the configured time. */
static CUresult kernel_time(struct sim_func *f, void **kernelParams, void **extra, uint64_t *dur_us);

/* The kernel's duration: its first parameter, from kernelParams or the packed `extra` buffer. */
static CUresult kernel_duration(void **kernelParams, void **extra, uint64_t *dur_us)
{
    *dur_us = 0;
    if (kernelParams && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams) {
        if (kernelParams[0])
            memcpy(dur_us, kernelParams[0], sizeof *dur_us);
        return CUDA_SUCCESS;
    }
    if (extra) {
        void *buffer = NULL;
        size_t size = 0;
        for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buffer = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
                size = *(size_t *)extra[i + 1];
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (buffer && size >= sizeof *dur_us)
            memcpy(dur_us, buffer, sizeof *dur_us);
    }
    return CUDA_SUCCESS;
}

static CUresult kernel_time(struct sim_func *f, void **kernelParams, void **extra, uint64_t *dur_us)
{
    if (sim_image_test_kernel(f->name))
        return kernel_duration(kernelParams, extra, dur_us);
    *dur_us = sim_config()->kernel_us;
    return kernelParams && extra ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

struct launch {
    CUfunction f;
    unsigned grid[3], block[3];
    CUstream stream;
    void **params, **extra;
    int cooperative;
};

static CUresult launch(const struct launch *l)
{
    SIM_REQUIRE_INIT();
    if (!sim_handle_get((uintptr_t)sim_kernel_resolve(l->f), SIM_KIND_FUNC))  /* a CUkernel launches too */
        return CUDA_ERROR_INVALID_HANDLE;
    if (!l->grid[0] || !l->grid[1] || !l->grid[2] || !l->block[0] || !l->block[1] || !l->block[2] ||
        l->grid[1] > 65535 || l->grid[2] > 65535 || l->block[0] > 1024 || l->block[1] > 1024 || l->block[2] > 64)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
    if (threads > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(l->stream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (l->cooperative) {
        /* every block must be resident at once: 2048 threads (at most 32 blocks) per SM */
        uint64_t per_sm = 2048 / threads > 32 ? 32 : 2048 / threads;
        uint64_t blocks = (uint64_t)l->grid[0] * l->grid[1] * l->grid[2];
        if (blocks > per_sm * (uint64_t)sim_config()->sms)
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    uint64_t dur_us;
    rc = kernel_time(sim_handle_get((uintptr_t)sim_kernel_resolve(l->f), SIM_KIND_FUNC), l->params, l->extra,
                     &dur_us);
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_stream_enqueue_kernel(s, dur_us);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    struct launch l = {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, hStream,
                       kernelParams, extra, 0};
    return launch(&l);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    return cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                          hStream, kernelParams, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    (void)sharedMemBytes;
    struct launch l = {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, hStream,
                       kernelParams, NULL, 1};
    return launch(&l);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    return cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                     sharedMemBytes, hStream, kernelParams);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    SIM_REQUIRE_INIT();
    if (!config || (config->numAttrs && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    struct launch l = {f, {config->gridDimX, config->gridDimY, config->gridDimZ},
                       {config->blockDimX, config->blockDimY, config->blockDimZ}, config->hStream,
                       kernelParams, extra, 0};
    for (unsigned i = 0; i < config->numAttrs; i++)
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
            l.cooperative = config->attrs[i].value.cooperative != 0;
    return launch(&l);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return cuLaunchKernelEx(config, f, kernelParams, extra);
}

/* ---- graphs: kernel nodes, run in the order they were added ---- */

struct graph_node { uint64_t dur_us; };
struct sim_graph { struct graph_node *nodes; size_t count; };

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

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *g = sim_handle_get((uintptr_t)hGraph, SIM_KIND_GRAPH);
    if (!g)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!phGraphNode || !nodeParams || (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_handle_get((uintptr_t)nodeParams->func, SIM_KIND_FUNC))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t dur_us;
    CUresult rc = kernel_time(sim_handle_get((uintptr_t)nodeParams->func, SIM_KIND_FUNC), nodeParams->kernelParams,
                              nodeParams->extra, &dur_us);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct graph_node *nodes = realloc(g->nodes, (g->count + 1) * sizeof *nodes);
    if (!nodes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->nodes = nodes;
    g->nodes[g->count].dur_us = dur_us;  /* parameters are copied when the node is added */
    g->count++;
    *phGraphNode = (CUgraphNode)(uintptr_t)g->count;
    return CUDA_SUCCESS;
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
    if (!e || (g->count && !(e->nodes = malloc(g->count * sizeof *e->nodes)))) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (g->count)
        memcpy(e->nodes, g->nodes, g->count * sizeof *e->nodes);
    e->count = g->count;
    sim_handle_put((uintptr_t)e, SIM_KIND_GRAPH_EXEC, e);
    *phGraphExec = (CUgraphExec)e;
    return CUDA_SUCCESS;
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
        sim_stream_enqueue_kernel(s, e->nodes[i].dur_us);
    return CUDA_SUCCESS;
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) { return cuGraphLaunch(hGraphExec, hStream); }

static CUresult graph_free(CUgraph h, int kind)
{
    SIM_REQUIRE_INIT();
    struct sim_graph *g = sim_handle_take((uintptr_t)h, kind);
    if (!g)
        return CUDA_ERROR_INVALID_HANDLE;
    free(g->nodes);
    free(g);
    return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { return graph_free((CUgraph)hGraphExec, SIM_KIND_GRAPH_EXEC); }
CUresult cuGraphDestroy(CUgraph hGraph) { return graph_free(hGraph, SIM_KIND_GRAPH); }
