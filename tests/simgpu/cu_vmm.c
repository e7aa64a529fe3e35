/*
 * Driver API: virtual memory management. cuMemCreate takes physical device memory
 * (a memfd, so it is real, shareable backing) in multiples of the 2 MiB granularity;
 * cuMemAddressReserve takes address space only; cuMemMap maps the one into the other
 * and cuMemSetAccess opens it. A released handle gives its memory back once its
 * last mapping is gone.
 */
#include "sim.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define VMM_GRANULARITY (2 * SIM_MIB)

struct vmm_handle { int fd; size_t size; int dev; int released; int maps; };
struct vmm_reserve { uintptr_t base; size_t size; };
struct vmm_map { uintptr_t base; size_t size; struct vmm_handle *h; int prot; };

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

static int valid_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           prop->location.id >= 0 && prop->location.id < sim_config()->visible;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    SIM_REQUIRE_INIT();
    if (!granularity || !valid_prop(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    SIM_REQUIRE_INIT();
    if (!handle || !valid_prop(prop) || flags || size == 0 || size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (sim_charge(dev, size) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct vmm_handle *h = calloc(1, sizeof *h);
    int fd = memfd_create("hami-sim-vmm", MFD_CLOEXEC);
    if (!h || fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        free(h);
        sim_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct vmm_handle){fd, size, dev, 0, 0};
    sim_handle_put((uintptr_t)h, SIM_KIND_VMM_HANDLE, h);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

static void handle_destroy(struct vmm_handle *h)
{
    close(h->fd);
    sim_uncharge(h->dev, h->size);
    free(h);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    SIM_REQUIRE_INIT();
    struct vmm_handle *h = sim_handle_take((uintptr_t)handle, SIM_KIND_VMM_HANDLE);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&vmm_lock);
    h->released = 1;
    int idle = h->maps == 0;
    pthread_mutex_unlock(&vmm_lock);
    if (idle)
        handle_destroy(h);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    SIM_REQUIRE_INIT();
    (void)addr;  /* a hint only */
    if (!ptr || flags || size == 0 || size % VMM_GRANULARITY || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < VMM_GRANULARITY)
        alignment = VMM_GRANULARITY;
    size_t span = size + alignment;
    void *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = sim_round_up((uintptr_t)raw, alignment);
    if (base > (uintptr_t)raw)
        munmap(raw, base - (uintptr_t)raw);
    if ((uintptr_t)raw + span > base + size)
        munmap((void *)(base + size), (uintptr_t)raw + span - (base + size));
    struct vmm_reserve *r = malloc(sizeof *r);
    if (!r) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *r = (struct vmm_reserve){base, size};
    sim_handle_put(base, SIM_KIND_VMM_RESERVE, r);
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

struct range { uintptr_t addr; size_t len; };

static int reserve_covers(void *val, void *arg)
{
    struct vmm_reserve *r = val;
    struct range *q = arg;
    return q->addr >= r->base && q->addr - r->base <= r->size && q->len <= r->size - (q->addr - r->base);
}

static int map_overlaps(void *val, void *arg)
{
    struct vmm_map *m = val;
    struct range *q = arg;
    return q->addr < m->base + m->size && m->base < q->addr + q->len;
}

static int map_inside(void *val, void *arg)
{
    struct vmm_map *m = val;
    struct range *q = arg;
    return m->base >= q->addr && m->base + m->size <= q->addr + q->len;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    SIM_REQUIRE_INIT();
    struct vmm_reserve *r = sim_handle_get((uintptr_t)ptr, SIM_KIND_VMM_RESERVE);
    if (!r || r->size != size)
        return CUDA_ERROR_INVALID_VALUE;
    struct range q = {r->base, r->size};
    if (sim_handle_find(SIM_KIND_VMM_MAP, map_overlaps, &q))
        return CUDA_ERROR_INVALID_VALUE;  /* still mapped */
    sim_handle_take((uintptr_t)ptr, SIM_KIND_VMM_RESERVE);
    munmap((void *)r->base, r->size);
    free(r);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    SIM_REQUIRE_INIT();
    struct vmm_handle *h = sim_handle_get((uintptr_t)handle, SIM_KIND_VMM_HANDLE);
    if (!h)
        return CUDA_ERROR_INVALID_HANDLE;
    struct range q = {(uintptr_t)ptr, size};
    if (flags || size == 0 || size % VMM_GRANULARITY || offset % VMM_GRANULARITY || q.addr % VMM_GRANULARITY ||
        offset > h->size || size > h->size - offset || !sim_handle_find(SIM_KIND_VMM_RESERVE, reserve_covers, &q))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_handle_find(SIM_KIND_VMM_MAP, map_overlaps, &q))
        return CUDA_ERROR_ALREADY_MAPPED;
    struct vmm_map *m = malloc(sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (mmap((void *)q.addr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset) == MAP_FAILED) {
        free(m);
        return CUDA_ERROR_MAP_FAILED;
    }
    *m = (struct vmm_map){q.addr, size, h, PROT_NONE};
    pthread_mutex_lock(&vmm_lock);
    h->maps++;
    pthread_mutex_unlock(&vmm_lock);
    sim_handle_put(q.addr, SIM_KIND_VMM_MAP, m);
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    SIM_REQUIRE_INIT();
    struct range q = {(uintptr_t)ptr, size};
    struct vmm_map *m;
    int unmapped = 0;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    while ((m = sim_handle_find(SIM_KIND_VMM_MAP, map_inside, &q))) {
        sim_handle_take(m->base, SIM_KIND_VMM_MAP);
        /* the address range stays reserved */
        mmap((void *)m->base, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        pthread_mutex_lock(&vmm_lock);
        int last = --m->h->maps == 0 && m->h->released;
        pthread_mutex_unlock(&vmm_lock);
        if (last)
            handle_destroy(m->h);
        free(m);
        unmapped++;
    }
    return unmapped ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

struct access { struct range q; int prot; int ok; };

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    SIM_REQUIRE_INIT();
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= sim_config()->visible)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
            prot = PROT_READ;
        else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ)
            return CUDA_ERROR_INVALID_VALUE;
    }
    /* the whole range must be mapped */
    uintptr_t at = (uintptr_t)ptr, end = at + size;
    while (at < end) {
        struct range q = {at, 1};
        struct vmm_map *m = sim_handle_find(SIM_KIND_VMM_MAP, map_overlaps, &q);
        if (!m)
            return CUDA_ERROR_INVALID_VALUE;
        at = m->base + m->size;
    }
    for (at = (uintptr_t)ptr; at < end;) {
        struct range q = {at, 1};
        struct vmm_map *m = sim_handle_find(SIM_KIND_VMM_MAP, map_overlaps, &q);
        uintptr_t stop = m->base + m->size < end ? m->base + m->size : end;
        mprotect((void *)at, stop - at, prot);
        m->prot = prot;
        at = stop;
    }
    return CUDA_SUCCESS;
}

int sim_vmm_accessible(uintptr_t addr, size_t len)
{
    uintptr_t at = addr, end = addr + len;
    while (at < end) {
        struct range q = {at, 1};
        struct vmm_map *m = sim_handle_find(SIM_KIND_VMM_MAP, map_overlaps, &q);
        if (!m || m->prot != (PROT_READ | PROT_WRITE))
            return 0;
        at = m->base + m->size;
    }
    return 1;
}
