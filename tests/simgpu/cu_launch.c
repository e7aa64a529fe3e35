/* Driver API: modules and kernel launches. Modules are read as the
 * driver reads them (sim_image.c): cuModuleGetFunction finds only the kernels an
 * image holds. The simulator's test kernels (`spin`, `sleep_kernel`, `empty`, in a
 * test image or in a real one that defines them) take their duration in
 * microseconds as their first parameter (uint64); every other kernel runs for the
 * configured `kernel_us`. Either way it occupies its stream's device for that long. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

struct module_global { char *name; CUdeviceptr ptr; size_t size; struct module_global *next; };
struct sim_module {
    struct sim_ctx *ctx;
    struct sim_image image;              /* what it holds, as read */
    void *bytes;                         /* its own copy of the image, for its globals */
    size_t size;
    pthread_mutex_t lock;                /* guards globals */
    struct module_global *globals;
};
struct sim_func {
    struct sim_module *mod;
    const char *name;
    int cache_config;
    CUkernel kernel;                     /* the library kernel it is the function of, if any */
};

static CUresult load_module(CUmodule *module, const void *image)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    const void *raw = sim_image_unwrap(image);
    size_t size = sim_image_size(raw);
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m || !(m->bytes = malloc(size))) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc = sim_image_parse(image, &m->image);
    if (rc != CUDA_SUCCESS) {
        free(m->bytes);
        free(m);
        return rc;
    }
    memcpy(m->bytes, raw, size);
    m->size = size;
    pthread_mutex_init(&m->lock, NULL);
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

/* CUDA_MODULE_LOADING says how the runtime loads modules: LAZY (the default) or EAGER. */
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
    SIM_REQUIRE_INIT();
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    const char *env = getenv("CUDA_MODULE_LOADING");
    *mode = env && !strcmp(env, "EAGER") ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
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
    for (struct module_global *g = m->globals, *next; g; g = next) {
        next = g->next;  /* their memory is the context's module heap, which only grows */
        free(g->name);
        free(g);
    }
    pthread_mutex_destroy(&m->lock);
    sim_image_free(&m->image);
    free(m->bytes);
    free(m);
    return CUDA_SUCCESS;
}

/* A global variable of the module's image: placed in its context's module heap the first time
 * it is asked for, with its initial data (cubins) or zeroed. */
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name)
{
    SIM_REQUIRE_INIT();
    struct sim_module *m = sim_handle_get((uintptr_t)hmod, SIM_KIND_MODULE);
    if (!m || !sim_ctx_check((CUcontext)m->ctx))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&m->lock);
    struct module_global *g = m->globals;
    while (g && strcmp(g->name, name))
        g = g->next;
    if (!g) {
        size_t size = 0;
        void *init = NULL;
        if (!sim_image_global(m->bytes, m->size, name, &size, &init))
            rc = CUDA_ERROR_NOT_FOUND;
        else if (!(g = calloc(1, sizeof *g)) || !(g->name = strdup(name)))
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            rc = sim_ctx_heap(m->ctx, size ? size : 1, &g->ptr);
        if (rc == CUDA_SUCCESS) {
            if (init)
                memcpy((void *)(uintptr_t)g->ptr, init, size);
            else
                memset((void *)(uintptr_t)g->ptr, 0, size);
            g->size = size;
            g->next = m->globals;
            m->globals = g;
        } else if (g) {
            free(g->name);
            free(g);
            g = NULL;
        }
        free(init);
    }
    if (g && dptr)
        *dptr = g->ptr;
    if (g && bytes)
        *bytes = g->size;
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void sim_func_bind_kernel(CUfunction f, CUkernel k)
{
    struct sim_func *fn = sim_handle_get((uintptr_t)f, SIM_KIND_FUNC);
    if (fn)
        fn->kernel = k;
}

CUkernel sim_func_kernel(CUfunction f)
{
    struct sim_func *fn = sim_handle_get((uintptr_t)f, SIM_KIND_FUNC);
    return fn ? fn->kernel : NULL;
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

/* How long a kernel runs: a test kernel's first parameter, else the configured time. */
static CUresult kernel_time(struct sim_func *f, void **kernelParams, void **extra, uint64_t *dur_us)
{
    if (sim_image_test_kernel(f->name))
        return kernel_duration(kernelParams, extra, dur_us);
    *dur_us = sim_config()->kernel_us;
    return kernelParams && extra ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult sim_kernel_time(CUfunction f, void **kernelParams, void **extra, uint64_t *dur_us)
{
    struct sim_func *fn = sim_handle_get((uintptr_t)sim_kernel_resolve(f), SIM_KIND_FUNC);
    return fn ? kernel_time(fn, kernelParams, extra, dur_us) : CUDA_ERROR_INVALID_HANDLE;
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
    int capturing;
    CUresult rc = sim_stream_op(l->stream, &s, &capturing);
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
    if (capturing) {                     /* a kernel node instead */
        struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .dur_us = dur_us, .func = l->f,
                                  .grid = {l->grid[0], l->grid[1], l->grid[2]},
                                  .block = {l->block[0], l->block[1], l->block[2]}};
        return sim_capture_add(s, &d);
    }
    sim_spin_us(sim_config()->launch_us);  /* the driver's own work in the call */
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
