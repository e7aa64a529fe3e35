/* Symbol resolution: the real driver's entry points, by name or by hook id (the
 * one list in hooks.h). Below every hook; the hooks' own addresses are handed out
 * by interpose.c, which nothing here calls. */
#include "internal.h"
#include "hooks.h"
#include "log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

__thread int hami_depth __attribute__((tls_model("initial-exec")));

struct real_entry {
    const char *name;
    enum hami_lib lib;
};

#define HAMI_REAL_ENTRY(name, lib) {#name, HAMI_LIB_##lib},
static const struct real_entry real_names[HAMI_HOOK_COUNT] = {HAMI_HOOKS(HAMI_REAL_ENTRY)};
#undef HAMI_REAL_ENTRY

static const char *const library_names[HAMI_LIB_COUNT] = {"libcuda.so.1", "libnvidia-ml.so.1"};

/* ---- the real dlsym ---- */

static hami_dlsym_fn real_dlsym_ptr;

hami_dlsym_fn hami_real_dlsym(void)
{
    hami_dlsym_fn fn = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (!fn) {
        fn = (hami_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!fn)
            fn = (hami_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        if (!fn)
            fn = (hami_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
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
    hami_dlsym_fn fn = hami_real_dlsym();
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
        fn = lib_symbol(real_names[id].lib, real_names[id].name);
        if (!fn) {
            hami_debug("the driver has no %s", real_names[id].name);
            fn = MISSING;
        }
        __atomic_store_n(&real_table[id], fn, __ATOMIC_RELEASE);
    }
    return fn == MISSING ? NULL : fn;
}
