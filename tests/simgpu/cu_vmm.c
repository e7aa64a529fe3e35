/*
 * Driver API: virtual memory management. cuMemCreate takes physical device memory
 * (a memfd, so it is real, shareable backing) in multiples of the 2 MiB granularity;
 * cuMemAddressReserve takes address space only; cuMemMap maps the one into the other
 * and cuMemSetAccess opens it. A handle is reference-counted (cuMemRetainAllocationHandle
 * adds one, cuMemRelease drops one); once released it gives its memory back at its last
 * unmapping. A handle created for POSIX file descriptors exports its memfd (a duplicate);
 * importing one makes a handle of the same memory in any process, charged to no one but
 * the process that created it (the memory is that process's, as long as it holds it).
 */
#include "sim.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define VMM_GRANULARITY (2 * SIM_MIB)

#define VMM_MEMFD_NAME "hami-sim-vmm-card"   /* + the card: an importer finds the device */

struct vmm_handle {
    int fd;
    size_t size;
    int dev;
    int refs;                            /* cuMemCreate/import 1, + retains, - releases */
    int maps;
    int charged;                         /* 0: imported, the creator's memory */
    CUmemAllocationHandleType types;     /* requested at creation */
};
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
    char name[sizeof VMM_MEMFD_NAME + 8];
    snprintf(name, sizeof name, VMM_MEMFD_NAME "%d", sim_card(dev));
    struct vmm_handle *h = calloc(1, sizeof *h);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (!h || fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        free(h);
        sim_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct vmm_handle){.fd = fd, .size = size, .dev = dev, .refs = 1, .charged = 1,
                             .types = prop->requestedHandleTypes};
    sim_handle_put((uintptr_t)h, SIM_KIND_VMM_HANDLE, h);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

static void handle_destroy(struct vmm_handle *h)
{
    close(h->fd);
    if (h->charged)
        sim_uncharge(h->dev, h->size);
    free(h);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    SIM_REQUIRE_INIT();
    pthread_mutex_lock(&vmm_lock);
    struct vmm_handle *h = sim_handle_get((uintptr_t)handle, SIM_KIND_VMM_HANDLE);
    int gone = h && --h->refs == 0;
    if (gone)
        sim_handle_take((uintptr_t)handle, SIM_KIND_VMM_HANDLE);
    int idle = gone && h->maps == 0;
    pthread_mutex_unlock(&vmm_lock);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    if (idle)
        handle_destroy(h);
    return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags)
{
    SIM_REQUIRE_INIT();
    struct vmm_handle *h = sim_handle_get((uintptr_t)handle, SIM_KIND_VMM_HANDLE);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;   /* Windows handles, fabric handles: not on this machine */
    if (!shareableHandle || flags || !(h->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

/* The visible device whose card made the memfd `fd` (its name says which), or -1. */
static int memfd_device(int fd)
{
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return -1;
    target[n] = 0;
    const char *at = strstr(target, "/memfd:" VMM_MEMFD_NAME);
    int card;
    if (!at || sscanf(at + strlen("/memfd:" VMM_MEMFD_NAME), "%d", &card) != 1)
        return -1;
    for (int dev = 0; dev < sim_config()->visible; dev++)
        if (sim_card(dev) == card)
            return dev;
    return -1;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    SIM_REQUIRE_INIT();
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int shared = (int)(intptr_t)osHandle;
    struct stat st;
    int dev = handle ? memfd_device(shared) : -1;
    if (dev < 0 || fstat(shared, &st) != 0 || st.st_size <= 0 || st.st_size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    struct vmm_handle *h = calloc(1, sizeof *h);
    int fd = h ? fcntl(shared, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd < 0) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct vmm_handle){.fd = fd, .size = (size_t)st.st_size, .dev = dev, .refs = 1,
                             .types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
    sim_handle_put((uintptr_t)h, SIM_KIND_VMM_HANDLE, h);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    SIM_REQUIRE_INIT();
    struct vmm_handle *h = sim_handle_get((uintptr_t)handle, SIM_KIND_VMM_HANDLE);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    *prop = (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED, .requestedHandleTypes = h->types,
                                  .location = {CU_MEM_LOCATION_TYPE_DEVICE, h->dev}};
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
        int last = --m->h->maps == 0 && m->h->refs == 0;
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

/* The handle mapped at addr, with one more reference (a handle released while mapped comes back). */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    SIM_REQUIRE_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&vmm_lock);
    struct range q = {(uintptr_t)addr, 1};
    struct vmm_map *m = sim_handle_find(SIM_KIND_VMM_MAP, map_overlaps, &q);
    if (m && m->h->refs++ == 0)
        sim_handle_put((uintptr_t)m->h, SIM_KIND_VMM_HANDLE, m->h);
    if (m)
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->h;
    pthread_mutex_unlock(&vmm_lock);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
