/* Symbol resolution: the real driver's entry points, and the three ways a program
 * can reach a driver function (linking, dlsym on the driver's handle, and
 * cuGetProcAddress), all answered from the one list in hooks.h. */
#include "internal.h"
#include "hooks.h"
#include "log.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

__thread int hami_depth __attribute__((tls_model("initial-exec")));

struct hook_entry {
    const char *name;
    void *hook;
    enum hami_lib lib;
};

#define HAMI_HOOK_ENTRY(name, lib) {#name, (void *)name, HAMI_LIB_##lib},
static const struct hook_entry hook_table[HAMI_HOOK_COUNT] = {HAMI_HOOKS(HAMI_HOOK_ENTRY)};
#undef HAMI_HOOK_ENTRY

static const char *const library_names[HAMI_LIB_COUNT] = {"libcuda.so.1", "libnvidia-ml.so.1"};

/* ---- the real dlsym ---- */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_ptr;

static dlsym_fn real_dlsym(void)
{
    dlsym_fn fn = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (!fn) {
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!fn)
            fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        if (!fn)
            fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
        __atomic_store_n(&real_dlsym_ptr, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

/* ---- the real libraries ---- */

static void *lib_handles[HAMI_LIB_COUNT];
static pthread_once_t lib_once[HAMI_LIB_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static void open_cuda(void)
{
    lib_handles[HAMI_LIB_CUDA] = dlopen(library_names[HAMI_LIB_CUDA], RTLD_NOW | RTLD_GLOBAL);
    if (!lib_handles[HAMI_LIB_CUDA])
        hami_warn("cannot open %s: %s", library_names[HAMI_LIB_CUDA], dlerror());
}

static void open_nvml(void)
{
    lib_handles[HAMI_LIB_NVML] = dlopen(library_names[HAMI_LIB_NVML], RTLD_NOW | RTLD_GLOBAL);
    if (!lib_handles[HAMI_LIB_NVML])
        hami_warn("cannot open %s: %s", library_names[HAMI_LIB_NVML], dlerror());
}

static void *lib_handle(enum hami_lib lib)
{
    pthread_once(&lib_once[lib], lib == HAMI_LIB_CUDA ? open_cuda : open_nvml);
    return lib_handles[lib];
}

static void *lib_symbol(enum hami_lib lib, const char *name)
{
    void *handle = lib_handle(lib);
    dlsym_fn fn = real_dlsym();
    return handle && fn ? fn(handle, name) : NULL;
}

void *hami_driver_symbol(const char *name)
{
    return lib_symbol(strncmp(name, "nvml", 4) == 0 ? HAMI_LIB_NVML : HAMI_LIB_CUDA, name);
}

/* Resolved once per hook; (void *)1 marks "the driver lacks it". */
static void *real_table[HAMI_HOOK_COUNT];
#define MISSING ((void *)1)

void *hami_real(enum hami_hook_id id)
{
    void *fn = __atomic_load_n(&real_table[id], __ATOMIC_ACQUIRE);
    if (!fn) {
        hami_init();
        fn = lib_symbol(hook_table[id].lib, hook_table[id].name);
        if (!fn) {
            hami_debug("the driver has no %s", hook_table[id].name);
            fn = MISSING;
        }
        __atomic_store_n(&real_table[id], fn, __ATOMIC_RELEASE);
    }
    return fn == MISSING ? NULL : fn;
}

static const struct hook_entry *hook_by_name(const char *name)
{
    if (!name || !((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0))
        return NULL;
    for (int i = 0; i < HAMI_HOOK_COUNT; i++)
        if (strcmp(hook_table[i].name, name) == 0)
            return &hook_table[i];
    return NULL;
}

/* cuGetProcAddress answered with a real entry point: the hook for that exact variant. */
static void *hook_for_real_address(void *fn)
{
    for (int i = 0; i < HAMI_HOOK_COUNT; i++)
        if (hook_table[i].lib == HAMI_LIB_CUDA && hami_real((enum hami_hook_id)i) == fn)
            return hook_table[i].hook;
    return fn;
}

/* ---- dlsym ---- */

/* RTLD_NEXT means "after the caller", and the caller is no longer visible to the
 * real dlsym once we sit in between: walk the objects loaded after the caller. */
static void *next_after(const void *caller, const char *name)
{
    dlsym_fn fn = real_dlsym();
    Dl_info info;
    struct link_map *self = NULL;
    if (!fn || !dladdr1(caller, &info, (void **)&self, RTLD_DL_LINKMAP) || !self)
        return NULL;
    for (struct link_map *lm = self->l_next; lm; lm = lm->l_next) {
        /* a link map is not always usable as a handle: ask for a real one */
        void *handle = lm->l_name && lm->l_name[0] ? dlopen(lm->l_name, RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (!handle)
            continue;
        void *sym = fn(handle, name);
        dlclose(handle);
        struct link_map *owner = NULL;
        if (sym && dladdr1(sym, &info, (void **)&owner, RTLD_DL_LINKMAP) && owner == lm)
            return sym;
    }
    return NULL;
}

HAMI_EXPORT void *dlsym(void *__restrict handle, const char *__restrict name)
{
    void *sym;
    if (handle == RTLD_NEXT) {
        sym = next_after(__builtin_return_address(0), name);
    } else {
        dlsym_fn fn = real_dlsym();
        sym = fn ? fn(handle, name) : NULL;
    }
    if (sym) {
        const struct hook_entry *hook = hook_by_name(name);
        if (hook)
            return hook->hook;
    }
    return sym;
}

/* ---- cuGetProcAddress ---- */

HAMI_HOOK(CUresult, cuGetProcAddress,
          (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags),
          (symbol, pfn, cudaVersion, flags))
{
    CUresult rc = real(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = hook_for_real_address(*pfn);
    return rc;
}

HAMI_HOOK(CUresult, cuGetProcAddress_v2,
          (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
           CUdriverProcAddressQueryResult *symbolStatus),
          (symbol, pfn, cudaVersion, flags, symbolStatus))
{
    CUresult rc = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = hook_for_real_address(*pfn);
    return rc;
}
