/* Driver API: context-independent libraries and their kernels. A library keeps its
 * own copy of the image and loads it as a module (cuModuleLoadDataEx) into each
 * context that uses it, the first time it is used there; a kernel resolves to that
 * module's function (cuModuleGetFunction) per context. A CUkernel is accepted
 * wherever a CUfunction is, as on the real driver. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

struct ctx_module {
    struct sim_ctx *ctx;
    CUmodule mod;
    struct ctx_module *next;
};

struct sim_library {
    void *image;
    size_t size;
    pthread_mutex_t lock;                /* guards modules and every kernel's functions */
    struct ctx_module *modules;
};

struct ctx_function {
    struct sim_ctx *ctx;
    CUfunction fn;
    struct ctx_function *next;
};

struct sim_kernel {
    struct sim_library *lib;
    char *name;
    struct ctx_function *functions;
};

static CUresult library_new(CUlibrary *library, const void *code, size_t size)
{
    struct sim_library *lib = calloc(1, sizeof *lib);
    if (!lib || !(lib->image = malloc(size))) {
        free(lib);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(lib->image, code, size);
    lib->size = size;
    pthread_mutex_init(&lib->lock, NULL);
    sim_handle_put((uintptr_t)lib, SIM_KIND_LIBRARY, lib);
    *library = (CUlibrary)lib;
    return CUDA_SUCCESS;
}

/* The library's module in the current context, loaded there on first use. Called with lib->lock held. */
static CUresult module_here(struct sim_library *lib, CUmodule *out)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (struct ctx_module *m = lib->modules; m; m = m->next)
        if (m->ctx == ctx) {
            *out = m->mod;
            return CUDA_SUCCESS;
        }
    struct ctx_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = cuModuleLoadDataEx(&m->mod, lib->image, 0, NULL, NULL);
    if (rc != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    m->ctx = ctx;
    m->next = lib->modules;
    lib->modules = m;
    *out = m->mod;
    return CUDA_SUCCESS;
}

static CUresult check_options(unsigned n, const void *options, void *const *values)
{
    return n && (!options || !values) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Library options: CU_LIBRARY_BINARY_IS_PRESERVED takes no value (the library copies the image
 * anyway), so values may be NULL when it is the only kind given. */
#define LIBRARY_BINARY_IS_PRESERVED 1
#define LIBRARY_OPTIONS 2
static CUresult check_library_options(unsigned n, const CUlibraryOption *options, void *const *values)
{
    if (n && !options)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if ((options[i] != LIBRARY_BINARY_IS_PRESERVED && !values) || (unsigned)options[i] >= LIBRARY_OPTIONS)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                           void **libraryOptionValues, unsigned int numLibraryOptions)
{
    SIM_REQUIRE_INIT();
    if (!library || !code || check_options(numJitOptions, jitOptions, jitOptionsValues) ||
        check_library_options(numLibraryOptions, libraryOptions, libraryOptionValues))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_image img;
    CUresult rc = sim_image_parse(code, &img);  /* a malformed image is refused at once */
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_image_free(&img);
    code = sim_image_unwrap(code);
    rc = library_new(library, code, sim_image_size(code));
    if (rc != CUDA_SUCCESS || !sim_ctx_current())
        return rc;
    /* with a context current, a bad image is refused at once */
    struct sim_library *lib = (struct sim_library *)*library;
    CUmodule mod;
    pthread_mutex_lock(&lib->lock);
    rc = module_here(lib, &mod);
    pthread_mutex_unlock(&lib->lock);
    if (rc != CUDA_SUCCESS)
        cuLibraryUnload(*library);
    return rc;
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions)
{
    SIM_REQUIRE_INIT();
    if (!library || !fileName)
        return CUDA_ERROR_INVALID_VALUE;
    char *data;
    size_t len;
    CUresult rc = sim_image_read_file(fileName, &data, &len);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = cuLibraryLoadData(library, data, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                           libraryOptionValues, numLibraryOptions);
    free(data);
    return rc;
}

static int kernel_of_library(void *val, void *arg) { return ((struct sim_kernel *)val)->lib == arg; }

CUresult cuLibraryUnload(CUlibrary library)
{
    SIM_REQUIRE_INIT();
    struct sim_library *lib = sim_handle_take((uintptr_t)library, SIM_KIND_LIBRARY);
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_kernel *k;
    while ((k = sim_handle_find(SIM_KIND_KERNEL, kernel_of_library, lib))) {
        sim_handle_take((uintptr_t)k, SIM_KIND_KERNEL);
        for (struct ctx_function *f = k->functions, *next; f; f = next) {
            next = f->next;
            free(f);
        }
        free(k->name);
        free(k);
    }
    for (struct ctx_module *m = lib->modules, *next; m; m = next) {
        next = m->next;
        if (sim_ctx_check((CUcontext)m->ctx))
            cuModuleUnload(m->mod);
        free(m);
    }
    pthread_mutex_destroy(&lib->lock);
    free(lib->image);
    free(lib);
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    SIM_REQUIRE_INIT();
    struct sim_library *lib = sim_handle_get((uintptr_t)library, SIM_KIND_LIBRARY);
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lib->lock);
    CUresult rc = module_here(lib, pMod);
    pthread_mutex_unlock(&lib->lock);
    return rc;
}

struct kernel_key { struct sim_library *lib; const char *name; };

static int kernel_named(void *val, void *arg)
{
    const struct sim_kernel *k = val;
    const struct kernel_key *key = arg;
    return k->lib == key->lib && !strcmp(k->name, key->name);
}

/* The kernel's function in the current context. Called with the library's lock held. */
static CUresult function_here(struct sim_kernel *k, CUfunction *out)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (struct ctx_function *f = k->functions; f; f = f->next)
        if (f->ctx == ctx) {
            *out = f->fn;
            return CUDA_SUCCESS;
        }
    CUmodule mod;
    if ((rc = module_here(k->lib, &mod)) != CUDA_SUCCESS)
        return rc;
    struct ctx_function *f = calloc(1, sizeof *f);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = cuModuleGetFunction(&f->fn, mod, k->name)) != CUDA_SUCCESS) {
        free(f);
        return rc;
    }
    f->ctx = ctx;
    f->next = k->functions;
    k->functions = f;
    sim_func_bind_kernel(f->fn, (CUkernel)k);  /* its attributes are the kernel's */
    *out = f->fn;
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    SIM_REQUIRE_INIT();
    struct sim_library *lib = sim_handle_get((uintptr_t)library, SIM_KIND_LIBRARY);
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    struct kernel_key key = {lib, name};
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lib->lock);
    struct sim_kernel *k = sim_handle_find(SIM_KIND_KERNEL, kernel_named, &key);
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k || !(k->name = strdup(name))) {
            free(k);
            pthread_mutex_unlock(&lib->lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        k->lib = lib;
        /* with a context current, an unknown name is refused at once */
        CUfunction fn;
        if (sim_ctx_current() && (rc = function_here(k, &fn)) != CUDA_SUCCESS) {
            free(k->name);
            free(k);
            pthread_mutex_unlock(&lib->lock);
            return rc;
        }
        sim_handle_put((uintptr_t)k, SIM_KIND_KERNEL, k);
    }
    pthread_mutex_unlock(&lib->lock);
    *pKernel = (CUkernel)k;
    return CUDA_SUCCESS;
}

/* The kernels the image holds that the simulator can read (a compressed fatbin entry's are not). */
CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
    SIM_REQUIRE_INIT();
    struct sim_library *l = sim_handle_get((uintptr_t)lib, SIM_KIND_LIBRARY);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_image img;
    CUresult rc = sim_image_parse(l->image, &img);
    if (rc == CUDA_SUCCESS)
        *count = (unsigned)img.count;
    sim_image_free(&img);
    return rc;
}

CUresult cuLibraryEnumerateKernels(CUkernel *kernels, unsigned int numKernels, CUlibrary lib)
{
    SIM_REQUIRE_INIT();
    struct sim_library *l = sim_handle_get((uintptr_t)lib, SIM_KIND_LIBRARY);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!kernels || !numKernels)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_image img;
    CUresult rc = sim_image_parse(l->image, &img);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < img.count && i < numKernels; i++)
        rc = cuLibraryGetKernel(&kernels[i], lib, img.names[i]);
    sim_image_free(&img);
    return rc;
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    SIM_REQUIRE_INIT();
    struct sim_kernel *k = sim_handle_get((uintptr_t)kernel, SIM_KIND_KERNEL);
    if (!k)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&k->lib->lock);
    CUresult rc = function_here(k, pFunc);
    pthread_mutex_unlock(&k->lib->lock);
    return rc;
}

CUfunction sim_kernel_resolve(CUfunction f)
{
    CUfunction fn;
    if (!sim_handle_get((uintptr_t)f, SIM_KIND_KERNEL) || cuKernelGetFunction(&fn, (CUkernel)f) != CUDA_SUCCESS)
        return f;
    return fn;
}

CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    SIM_REQUIRE_INIT();
    struct sim_kernel *k = sim_handle_get((uintptr_t)kernel, SIM_KIND_KERNEL);
    if (!k)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pLib)
        return CUDA_ERROR_INVALID_VALUE;
    *pLib = (CUlibrary)k->lib;
    return CUDA_SUCCESS;
}

CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    SIM_REQUIRE_INIT();
    struct sim_kernel *k = sim_handle_get((uintptr_t)hfunc, SIM_KIND_KERNEL);
    if (!k)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = k->name;
    return CUDA_SUCCESS;
}

/* A kernel's attributes are kept as a function's are (cu_function.c); the simulator
 * gives every kernel the same static attributes on every device. */
static CUresult kernel_on_device(CUkernel kernel, CUdevice dev)
{
    SIM_REQUIRE_INIT();
    if (!sim_handle_get((uintptr_t)kernel, SIM_KIND_KERNEL))
        return CUDA_ERROR_INVALID_HANDLE;
    return dev < 0 || dev >= sim_config()->visible ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    CUresult rc = kernel_on_device(kernel, dev);
    return rc != CUDA_SUCCESS ? rc : sim_func_attr_get((uintptr_t)kernel, attrib, pi);
}

CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)
{
    CUresult rc = kernel_on_device(kernel, dev);
    return rc != CUDA_SUCCESS ? rc : sim_func_attr_set((uintptr_t)kernel, attrib, val);
}

/* A global variable is its module's, in the current context (cuModuleGetGlobal_v2). */
CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    SIM_REQUIRE_INIT();
    struct sim_library *lib = sim_handle_get((uintptr_t)library, SIM_KIND_LIBRARY);
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    CUmodule mod;
    pthread_mutex_lock(&lib->lock);
    CUresult rc = module_here(lib, &mod);
    pthread_mutex_unlock(&lib->lock);
    return rc != CUDA_SUCCESS ? rc : cuModuleGetGlobal_v2(dptr, bytes, mod, name);
}
