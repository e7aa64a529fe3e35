/* Driver API: page-locked host memory with flags (cuMemHostAlloc) and registered
 * host ranges. With unified addressing every page-locked range is mapped for the
 * device at its host address, as on the real driver. Allocations are made with
 * cuMemAllocHost (and freed with cuMemFreeHost); this file keeps their flags and
 * sizes, and the registered ranges. */
#include "sim.h"

#include <stdlib.h>

struct host_range {
    uintptr_t base;
    size_t size;
    unsigned flags;
    int registered;                      /* cuMemHostRegister'd, not allocated */
    struct host_range *next;
};

static struct host_range *ranges;
static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;

/* Called with ranges_lock held: allocations freed by cuMemFreeHost are dropped here. */
static struct host_range *find_locked(uintptr_t addr)
{
    for (struct host_range **p = &ranges; *p;) {
        struct host_range *r = *p;
        if (!r->registered && !sim_handle_get(r->base, SIM_KIND_HOST)) {
            *p = r->next;
            free(r);
            continue;
        }
        if (addr >= r->base && addr - r->base < r->size)
            return r;
        p = &r->next;
    }
    return NULL;
}

int sim_host_range(uintptr_t addr, uintptr_t *base, size_t *size, unsigned *flags)
{
    pthread_mutex_lock(&ranges_lock);
    struct host_range *r = find_locked(addr);
    if (r) {
        *base = r->base;
        *size = r->size;
        *flags = r->flags;
    }
    pthread_mutex_unlock(&ranges_lock);
    if (r)
        return 1;
    if (sim_handle_get(addr, SIM_KIND_HOST)) {  /* cuMemAllocHost: the start of one, size unknown here */
        *base = addr;
        *size = 0;
        *flags = 0;
        return 1;
    }
    return 0;
}

static CUresult add_range(uintptr_t base, size_t size, unsigned flags, int registered)
{
    struct host_range *r = malloc(sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *r = (struct host_range){base, size, flags, registered, NULL};
    pthread_mutex_lock(&ranges_lock);
    r->next = ranges;
    ranges = r;
    pthread_mutex_unlock(&ranges_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    SIM_REQUIRE_INIT();
    if (!pp || Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                   CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuMemAllocHost_v2(pp, bytesize);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = add_range((uintptr_t)*pp, bytesize, Flags, 0)) != CUDA_SUCCESS)
        cuMemFreeHost(*pp);
    return rc;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!p || !bytesize || Flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                               CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY))
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t start = (uintptr_t)p, base;
    size_t size;
    unsigned flags;
    if (sim_host_range(start, &base, &size, &flags) || sim_host_range(start + bytesize - 1, &base, &size, &flags))
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    int inside = 0;                      /* a known range lying wholly within the new one */
    pthread_mutex_lock(&ranges_lock);
    find_locked(0);                      /* drops freed allocations */
    for (struct host_range *r = ranges; r && !inside; r = r->next)
        inside = r->base >= start && r->base - start < bytesize;
    pthread_mutex_unlock(&ranges_lock);
    return inside ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED : add_range(start, bytesize, Flags, 1);
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return cuMemHostRegister_v2(p, bytesize, Flags);
}

CUresult cuMemHostUnregister(void *p)
{
    SIM_REQUIRE_INIT();
    pthread_mutex_lock(&ranges_lock);
    struct host_range **at = &ranges;
    while (*at && !((*at)->registered && (*at)->base == (uintptr_t)p))
        at = &(*at)->next;
    struct host_range *r = *at;
    if (r)
        *at = r->next;
    pthread_mutex_unlock(&ranges_lock);
    free(r);
    return r ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    SIM_REQUIRE_INIT();
    uintptr_t base;
    size_t size;
    unsigned flags;
    if (!pdptr || Flags || !sim_host_range((uintptr_t)p, &base, &size, &flags))
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    SIM_REQUIRE_INIT();
    uintptr_t base;
    size_t size;
    unsigned flags;
    if (!pFlags || !sim_host_range((uintptr_t)p, &base, &size, &flags))
        return CUDA_ERROR_INVALID_VALUE;
    *pFlags = flags;
    return CUDA_SUCCESS;
}
