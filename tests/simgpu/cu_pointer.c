/* Driver API: pointer attributes of device allocations (cuMemAlloc, pools, managed) and
 * of page-locked host memory. Unified addressing: a device pointer and a page-locked
 * host pointer are the same address on both sides. Managed memory reads as the real
 * driver's does: memory type device (the driver documents that managed memory may say
 * device or host wherever its pages are), IS_MANAGED 1, its own address as host
 * pointer, not IPC-capable. */
#include "sim.h"

#include <string.h>

struct pointer_info {
    CUmemorytype type;                   /* 0: not memory the driver knows */
    CUcontext ctx;
    int dev;
    uintptr_t base;
    size_t size;
    CUmemoryPool pool;
    int managed;
};

static struct pointer_info look_up(CUdeviceptr ptr)
{
    struct pointer_info info = {0};
    struct sim_alloc *a = sim_alloc_containing((uintptr_t)ptr, 1);
    if (a) {
        info = (struct pointer_info){CU_MEMORYTYPE_DEVICE, (CUcontext)a->ctx, a->dev, a->base, a->size,
                                     (CUmemoryPool)a->pool, a->managed};
        return info;
    }
    uintptr_t base;
    size_t size;
    unsigned flags;
    struct sim_ctx *ctx = sim_ctx_current();
    if (sim_host_range((uintptr_t)ptr, &base, &size, &flags))
        info = (struct pointer_info){CU_MEMORYTYPE_HOST, (CUcontext)ctx, ctx ? ctx->dev : 0, base, size, NULL, 0};
    return info;
}

#define PUT(type, value) do { type v_ = (value); memcpy(data, &v_, sizeof v_); } while (0)

/* One attribute of a known pointer; unknown attributes are refused. */
static CUresult attribute(const struct pointer_info *in, CUpointer_attribute attr, CUdeviceptr ptr, void *data)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: PUT(CUcontext, in->ctx); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: PUT(unsigned int, in->type); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: PUT(CUdeviceptr, ptr); break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (in->type != CU_MEMORYTYPE_HOST && !in->managed)
            return CUDA_ERROR_INVALID_VALUE;  /* device memory has no host address */
        PUT(void *, (void *)(uintptr_t)ptr);
        break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: PUT(unsigned char, 0); break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: PUT(unsigned long long, in->base); break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: PUT(unsigned char, (unsigned char)in->managed); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: PUT(int, in->dev); break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        PUT(unsigned char, in->type == CU_MEMORYTYPE_DEVICE && !in->pool && !in->managed);
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: PUT(CUdeviceptr, in->base); break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: PUT(size_t, in->size); break;
    case CU_POINTER_ATTRIBUTE_MAPPED: PUT(unsigned char, 1); break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: PUT(unsigned int, 3); break;  /* read-write */
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: PUT(CUmemoryPool, in->pool); break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute_, CUdeviceptr ptr)
{
    SIM_REQUIRE_INIT();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    struct pointer_info info = look_up(ptr);
    if (!info.type)
        return CUDA_ERROR_INVALID_VALUE;
    return attribute(&info, attribute_, ptr, data);
}

/* Unlike cuPointerGetAttribute, memory the driver does not know is no error: every
 * attribute reads as zero (NULL, unregistered, ordinal -2 as on the real driver). */
CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr)
{
    SIM_REQUIRE_INIT();
    if (!numAttributes || !attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    struct pointer_info info = look_up(ptr);
    for (unsigned i = 0; i < numAttributes; i++) {
        if (!data[i])
            return CUDA_ERROR_INVALID_VALUE;
        if (info.type) {
            CUresult rc = attribute(&info, attributes[i], ptr, data[i]);
            if (rc != CUDA_SUCCESS && attributes[i] != CU_POINTER_ATTRIBUTE_HOST_POINTER)
                return rc;
            if (rc != CUDA_SUCCESS)
                memset(data[i], 0, sizeof(void *));
            continue;
        }
        struct pointer_info none = {0};
        none.dev = -2;
        CUresult rc = attribute(&none, attributes[i], ptr, data[i]);
        if (rc == CUDA_SUCCESS && attributes[i] == CU_POINTER_ATTRIBUTE_MAPPED)
            *(unsigned char *)data[i] = 0;
        if (rc == CUDA_SUCCESS && attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_POINTER)
            memset(data[i], 0, sizeof(CUdeviceptr));
        if (rc == CUDA_SUCCESS && attributes[i] == CU_POINTER_ATTRIBUTE_ACCESS_FLAGS)
            memset(data[i], 0, sizeof(unsigned int));
        if (rc != CUDA_SUCCESS && attributes[i] != CU_POINTER_ATTRIBUTE_HOST_POINTER)
            return rc;
        if (rc != CUDA_SUCCESS)          /* host pointer of unknown memory */
            memset(data[i], 0, sizeof(void *));
    }
    return CUDA_SUCCESS;
}
