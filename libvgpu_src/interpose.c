/* Interposition: the three ways a program can reach a driver function (linking,
 * dlsym on the driver's handle, cuGetProcAddress) all lead to our hook, answered
 * from the one list in hooks.h. The top of libvgpu: it names every hook. */
#include "internal.h"
#include "hooks.h"
#include "log.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

struct hook_entry {
    const char *name;
    void *hook;
    enum hami_lib lib;
};

#define HAMI_HOOK_ENTRY(name, lib) {#name, (void *)name, HAMI_LIB_##lib},
static const struct hook_entry hook_table[HAMI_HOOK_COUNT] = {HAMI_HOOKS(HAMI_HOOK_ENTRY)};
#undef HAMI_HOOK_ENTRY

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
    hami_dlsym_fn fn = hami_real_dlsym();
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
        hami_dlsym_fn fn = hami_real_dlsym();
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
