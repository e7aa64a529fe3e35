/* Driver API: modules, kernel launches and kernel graphs. Modules are read as the
 * driver reads them (sim_image.c): cuModuleGetFunction finds only the kernels an
 * image holds. A kernel of a simulator test image takes its duration in
 * microseconds as its first parameter (uint64); a kernel of a real image (fat
 * binary, cubin, PTX) runs for the configured `kernel_us`. Either way it occupies
 * its stream's device for that long. */
#include "sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sim_module { struct sim_ctx *ctx; struct sim_image image; };
struct sim_func {
    struct sim_module *mod;
    const char *name;
    int max_dynamic_shared, carveout, cache_config;   /* the attributes a caller may set */
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
    FILE *f = fopen(fname, "rb");
    if (!f)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char *data = NULL;
    size_t len = 0, cap = 0, n;
    do {
        if (len + 65536 + 1 > cap) {
            char *grown = realloc(data, cap = (len + 65536 + 1) * 2);
            if (!grown) {
                free(data);
                fclose(f);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            data = grown;
        }
        n = fread(data + len, 1, 65536, f);
        len += n;
    } while (n > 0);
    fclose(f);
    data[len] = '\0';  /* PTX text */
    CUresult rc = load_module(module, data);
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
        *f = (struct sim_func){.mod = m, .name = kernel ? kernel : own, .max_dynamic_shared = 49152,
                               .carveout = -1};
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

/* ---- kernel attributes and occupancy, for an H100-like SM ---- */

#define SM_THREADS 2048
#define SM_BLOCKS 32
#define SM_SHARED (228 * 1024)
#define BLOCK_SHARED_OPTIN (227 * 1024)

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    SIM_REQUIRE_INIT();
    struct sim_func *f = sim_handle_get((uintptr_t)hfunc, SIM_KIND_FUNC);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 90; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = f->max_dynamic_shared; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = f->carveout; break;
    default:
        if ((unsigned)attrib >= CU_FUNC_ATTRIBUTE_MAX)
            return CUDA_ERROR_INVALID_VALUE;
        *pi = 0;  /* no static shared, constant or local memory; no cluster requirements */
    }
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    SIM_REQUIRE_INIT();
    struct sim_func *f = sim_handle_get((uintptr_t)hfunc, SIM_KIND_FUNC);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && value >= 0 && value <= BLOCK_SHARED_OPTIN)
        f->max_dynamic_shared = value;
    else if (attrib == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT && value >= -1 && value <= 100)
        f->carveout = value;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

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

/* Resident blocks of `block` threads with `shared` bytes each on one SM. */
static int blocks_per_sm(int block, size_t shared)
{
    int warps = (block + 31) / 32;
    int by_threads = SM_THREADS / (warps * 32);
    int n = by_threads < SM_BLOCKS ? by_threads : SM_BLOCKS;
    if (shared && (size_t)n > SM_SHARED / shared)
        n = (int)(SM_SHARED / shared);
    return n;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags)
{
    SIM_REQUIRE_INIT();
    struct sim_func *f = sim_handle_get((uintptr_t)func, SIM_KIND_FUNC);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!numBlocks || blockSize <= 0 || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    *numBlocks = blockSize > 1024 || dynamicSMemSize > (size_t)f->max_dynamic_shared
                     ? 0 : blocks_per_sm(blockSize, dynamicSMemSize);
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize)
{
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

/* The block size (a multiple of the warp) that keeps the most threads resident; the largest on a tie. */
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize, CUfunction func,
                                                   CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                   size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags)
{
    SIM_REQUIRE_INIT();
    struct sim_func *f = sim_handle_get((uintptr_t)func, SIM_KIND_FUNC);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!minGridSize || !blockSize || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    int limit = blockSizeLimit <= 0 || blockSizeLimit > 1024 ? 1024 : blockSizeLimit;
    int best = 0, best_blocks = 0, best_threads = 0;
    for (int b = limit / 32 * 32; b >= 32; b -= 32) {
        size_t shared = blockSizeToDynamicSMemSize ? blockSizeToDynamicSMemSize(b) : dynamicSMemSize;
        if (shared > (size_t)f->max_dynamic_shared)
            continue;
        int n = blocks_per_sm(b, shared);
        if (n * b > best_threads) {
            best = b;
            best_blocks = n;
            best_threads = n * b;
        }
    }
    *blockSize = best;
    *minGridSize = best_blocks * sim_config()->sms;
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                          CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                          int blockSizeLimit)
{
    return cuOccupancyMaxPotentialBlockSizeWithFlags(minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                                                     dynamicSMemSize, blockSizeLimit, 0);
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
    if (f->mod->image.kind == SIM_IMAGE_TEST)
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
    if (!sim_handle_get((uintptr_t)l->f, SIM_KIND_FUNC))
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
    rc = kernel_time(sim_handle_get((uintptr_t)l->f, SIM_KIND_FUNC), l->params, l->extra, &dur_us);
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
