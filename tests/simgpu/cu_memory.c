/* Driver API: device and host allocations, copies. A device pointer is the address
 * of a MAP_NORESERVE mapping, so simulated memory costs nothing until it is touched
 * and copies are plain memcpy. Each allocation takes whole 2 MiB pages of device
 * memory, as large allocations do on the real driver. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void *map_backing(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Device memory is charged to its device, managed memory to the host's budget. */
static int charge(int dev, uint64_t bytes, int managed)
{
    return managed ? sim_charge_host(bytes) : sim_charge(dev, bytes);
}

static void uncharge(int dev, uint64_t bytes, int managed)
{
    if (managed)
        sim_uncharge_host(bytes);
    else
        sim_uncharge(dev, bytes);
}

static CUresult alloc_charged(struct sim_ctx *ctx, size_t size, uint64_t charged, int managed,
                              CUdeviceptr *out)
{
    if (charge(ctx->dev, charged, managed) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t mapped = sim_round_up(size, 4096);
    void *p = map_backing(mapped);
    struct sim_alloc *a = p ? malloc(sizeof *a) : NULL;
    if (!a) {
        if (p)
            munmap(p, mapped);
        uncharge(ctx->dev, charged, managed);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *a = (struct sim_alloc){.base = (uintptr_t)p, .size = size, .mapped = mapped, .charged = charged,
                            .managed = managed, .dev = ctx->dev, .ctx = ctx};
    sim_handle_put(a->base, SIM_KIND_ALLOC, a);
    *out = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

CUresult sim_alloc_device(struct sim_ctx *ctx, size_t size, CUdeviceptr *out)
{
    if (size > sim_config()->memory_mib * SIM_MIB)
        return CUDA_ERROR_OUT_OF_MEMORY;  /* never fits; and rounding it up could wrap */
    return alloc_charged(ctx, size, sim_round_up(size, SIM_PAGE), 0, out);
}

void sim_alloc_release(struct sim_alloc *a)
{
    if (a->mapped)
        munmap((void *)a->base, a->mapped);
    if (a->charged)
        uncharge(a->dev, a->charged, a->managed);
    free(a);
}

/* Stream-ordered (pool) allocations outlive their context, as on the real driver; a graph
 * allocation's address belongs to its graph (cu_graph.c). */
static int owned_by_ctx(void *val, void *arg)
{
    struct sim_alloc *a = val;
    return a->ctx == arg && !a->pool && !a->graph;
}

#define HEAP_ALIGN 256

static pthread_mutex_t heap_lock = PTHREAD_MUTEX_INITIALIZER;

CUresult sim_ctx_heap(struct sim_ctx *ctx, size_t size, CUdeviceptr *out)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&heap_lock);
    size_t at = sim_round_up(ctx->heap_used, HEAP_ALIGN);
    if (!ctx->heap_page || at + size > ctx->heap_size) {
        size_t page = sim_round_up(size, SIM_PAGE);
        if ((rc = sim_alloc_device(ctx, page, &ctx->heap_page)) == CUDA_SUCCESS) {
            ctx->heap_size = page;
            at = 0;
        }
    }
    if (rc == CUDA_SUCCESS) {
        *out = ctx->heap_page + at;
        ctx->heap_used = at + size;
    }
    pthread_mutex_unlock(&heap_lock);
    return rc;
}

void sim_free_ctx_allocations(struct sim_ctx *ctx)
{
    pthread_mutex_lock(&heap_lock);
    ctx->heap_page = 0;                  /* its pages go with the rest */
    ctx->heap_used = ctx->heap_size = 0;
    pthread_mutex_unlock(&heap_lock);
    struct sim_alloc *a;
    while ((a = sim_handle_find(SIM_KIND_ALLOC, owned_by_ctx, ctx))) {
        sim_handle_take(a->base, SIM_KIND_ALLOC);
        sim_alloc_release(a);
    }
}

struct range { uintptr_t addr; size_t len; };

static int contains(void *val, void *arg)
{
    struct sim_alloc *a = val;
    struct range *r = arg;
    return r->addr >= a->base && r->addr - a->base <= a->size && r->len <= a->size - (r->addr - a->base);
}

struct sim_alloc *sim_alloc_containing(uintptr_t addr, size_t len)
{
    struct sim_alloc *a = sim_handle_get(addr, SIM_KIND_ALLOC);
    if (a && len <= a->size)
        return a;
    struct range r = {addr, len};
    return sim_handle_find(SIM_KIND_ALLOC, contains, &r);
}

/* cuMemAlloc and cuMemFree are "potentially unsafe" during capture (cuThreadExchangeStreamCaptureMode). */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc == CUDA_SUCCESS)
        rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc_device(ctx, bytesize, dptr);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc == CUDA_SUCCESS)
        rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = sim_round_up(WidthInBytes, 512);
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sim_alloc_device(ctx, pitch * Height, dptr);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}

/* Managed memory lives in host pages that a real driver would move to the device on
 * touch and back under pressure: here it stays host-backed, counted against the
 * machine's host budget (host_memory_mib) and never against a device, so it succeeds
 * beyond a device's free memory and leaves cuMemGetInfo and NVML's used memory as
 * they were. It is reached like device memory (copies, fills, kernels) and from the host. */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > sim_config()->host_memory_mib * SIM_MIB)
        return CUDA_ERROR_OUT_OF_MEMORY;  /* never fits; and rounding it up could wrap */
    return alloc_charged(ctx, bytesize, sim_round_up(bytesize, SIM_PAGE), 1, dptr);
}

/* Prefetching managed memory: its pages stay in host memory here (see cuMemAllocManaged), so a
 * valid request, in stream order, moves nothing. */
CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                               CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing)                       /* prefetch nodes are not simulated */
        return sim_capture_refuse(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    struct sim_alloc *a = count ? sim_alloc_containing((uintptr_t)devPtr, count) : NULL;
    int to_device = location.type == CU_MEM_LOCATION_TYPE_DEVICE && location.id >= 0 &&
                    location.id < sim_config()->visible;
    if (!a || !a->managed || flags || (!to_device && location.type != CU_MEM_LOCATION_TYPE_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The legacy form: a device ordinal, or CU_DEVICE_CPU (-1) for the host. */
CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream)
{
    CUmemLocation to = {dstDevice == -1 ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE, dstDevice};
    return cuMemPrefetchAsync_v2(devPtr, count, to, 0, hStream);
}
SIM_PER_THREAD(cuMemPrefetchAsync, ptsz)
SIM_PER_THREAD(cuMemPrefetchAsync_v2, ptsz)

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    SIM_REQUIRE_INIT();
    CUresult rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dptr == 0)
        return CUDA_SUCCESS;
    struct sim_alloc *a = sim_handle_get((uintptr_t)dptr, SIM_KIND_ALLOC);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    if (a->graph)
        return sim_graph_mem_free(a->graph);
    if (a->pool)
        return sim_pool_free(a, NULL);
    if (!sim_handle_take((uintptr_t)dptr, SIM_KIND_ALLOC))
        return CUDA_ERROR_INVALID_VALUE;
    sim_alloc_release(a);
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t cap = sim_config()->memory_mib * SIM_MIB, used = sim_device_used(ctx->dev);
    *total = cap;
    *free = used < cap ? cap - used : 0;
    return CUDA_SUCCESS;
}

struct host_alloc { uintptr_t base; size_t mapped; };

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pp || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t mapped = sim_round_up(bytesize, 4096);
    void *p = map_backing(mapped);
    struct host_alloc *h = p ? malloc(sizeof *h) : NULL;
    if (!h) {
        if (p)
            munmap(p, mapped);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct host_alloc){(uintptr_t)p, mapped};
    sim_handle_put(h->base, SIM_KIND_HOST, h);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p)
{
    SIM_REQUIRE_INIT();
    struct host_alloc *h = sim_handle_take((uintptr_t)p, SIM_KIND_HOST);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)h->base, h->mapped);
    free(h);
    return CUDA_SUCCESS;
}

/* Synchronous copies wait for the context's work first, as on the legacy stream. */
static CUresult device_range(CUdeviceptr ptr, size_t len, struct sim_ctx **ctx)
{
    CUresult rc = sim_ctx_current_checked(ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (len == 0)
        return CUDA_SUCCESS;
    if (!sim_alloc_containing((uintptr_t)ptr, len) && !sim_vmm_accessible((uintptr_t)ptr, len))
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sim_capture_sync_call(*ctx)) != CUDA_SUCCESS)
        return rc;
    sim_ctx_sync(*ctx);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    struct sim_ctx *ctx;
    CUresult rc = device_range(dstDevice, ByteCount, &ctx);
    if (rc == CUDA_SUCCESS && ByteCount) {
        if (!srcHost)
            return CUDA_ERROR_INVALID_VALUE;
        memcpy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
    }
    return rc;
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    struct sim_ctx *ctx;
    CUresult rc = device_range(srcDevice, ByteCount, &ctx);
    if (rc == CUDA_SUCCESS && ByteCount) {
        if (!dstHost)
            return CUDA_ERROR_INVALID_VALUE;
        memcpy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
    }
    return rc;
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    struct sim_ctx *ctx;
    CUresult rc = device_range(dstDevice, N, &ctx);
    if (rc == CUDA_SUCCESS && N)
        memset((void *)(uintptr_t)dstDevice, uc, N);
    return rc;
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return cuMemsetD8_v2(dstDevice, uc, N);
}

/* ---- what the CUDA runtime adds: address ranges, unified copies, 16- and 32-bit fills ---- */

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    SIM_REQUIRE_INIT();
    struct sim_alloc *a = sim_alloc_containing((uintptr_t)dptr, 0);
    if (!a)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = (CUdeviceptr)a->base;
    if (psize)
        *psize = a->size;
    return CUDA_SUCCESS;
}

/* Any address a copy may touch: device memory, mapped VMM memory, or host memory (the simulator's
 * device pointers are host mappings, so unified addressing is plain memory). */
static CUresult copy_checked(uintptr_t dst, uintptr_t src, size_t n)
{
    if (n && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    if (n)
        memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

static int device_addr_ok(uintptr_t p, size_t n)
{
    return n == 0 || sim_alloc_containing(p, n) || sim_vmm_accessible(p, n);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc == CUDA_SUCCESS)
        rc = sim_capture_sync_call(ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_ctx_sync(ctx);
    return copy_checked((uintptr_t)dst, (uintptr_t)src, ByteCount);
}

/* Stream-ordered copies and fills: the stream's earlier work finishes first, then the bytes move
 * before the call returns (as the driver does for pageable host memory). */
/* In a capturing stream, *node is filled in as the node it becomes (and nothing waits). */
static CUresult stream_ready(CUstream hStream, struct sim_node_desc *node)
{
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc == CUDA_SUCCESS && capturing)
        return sim_capture_add(s, node);
    if (rc == CUDA_SUCCESS)
        sim_stream_wait_idle(s);
    node->type = CU_GRAPH_NODE_TYPE_EMPTY;  /* not captured: the caller does the work */
    return rc;
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    if (ByteCount && (!dst || !src))
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_MEMCPY, .dst = dst, .src = src, .width = ByteCount,
                              .height = 1};
    CUresult rc = stream_ready(hStream, &d);
    if (rc != CUDA_SUCCESS || d.type == CU_GRAPH_NODE_TYPE_MEMCPY)
        return rc;
    return copy_checked((uintptr_t)dst, (uintptr_t)src, ByteCount);
}

static void fill(uintptr_t dst, const void *value, size_t width, size_t n)
{
    unsigned char *p = (unsigned char *)dst;
    for (size_t i = 0; i < n; i++)
        memcpy(p + i * width, value, width);
}

static CUresult memset_sync(CUdeviceptr dst, const void *value, size_t width, size_t n)
{
    struct sim_ctx *ctx;
    if (n > SIZE_MAX / width)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = device_range(dst, n * width, &ctx);
    if (rc == CUDA_SUCCESS && dst % width)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        fill((uintptr_t)dst, value, width, n);
    return rc;
}

static CUresult memset_async(CUdeviceptr dst, const void *value, size_t width, size_t n, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (n > SIZE_MAX / width || dst % width || !device_addr_ok((uintptr_t)dst, n * width))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .dst = dst, .width = n, .height = 1,
                              .elem = (unsigned)width};
    memcpy(&d.value, value, width);
    CUresult rc = stream_ready(hStream, &d);
    if (rc == CUDA_SUCCESS && d.type == CU_GRAPH_NODE_TYPE_EMPTY)
        fill((uintptr_t)dst, value, width, n);
    return rc;
}

CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
    return memset_sync(dstDevice, &us, sizeof us, N);
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    return memset_sync(dstDevice, &ui, sizeof ui, N);
}

CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
    return memset_async(dstDevice, &us, sizeof us, N, hStream);
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    return memset_async(dstDevice, &ui, sizeof ui, N, hStream);
}

/* The legacy and per-thread default streams are one stream here: the per-thread names are aliases. */
SIM_PER_THREAD(cuMemcpy, ptds)
SIM_PER_THREAD(cuMemcpyAsync, ptsz)
SIM_PER_THREAD(cuMemsetD16_v2, ptds)
SIM_PER_THREAD(cuMemsetD32_v2, ptds)
SIM_PER_THREAD(cuMemsetD16Async, ptsz)
SIM_PER_THREAD(cuMemsetD32Async, ptsz)
