/* Driver API: CUDA arrays. They take width x height x depth x channels x element
 * size of device memory (whole 2 MiB pages) and are freed with their context. */
#include "sim.h"

#include <stdlib.h>

struct sim_array { int dev; uint64_t charged; struct sim_ctx *ctx; };

static unsigned element_size(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    }
    return 0;
}

static CUresult array_create(CUarray *pHandle, size_t width, size_t height, size_t depth, CUarray_format format,
                             unsigned channels)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    unsigned elem = element_size(format);
    if (!pHandle || width == 0 || !elem || (channels != 1 && channels != 2 && channels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned __int128 bytes = (unsigned __int128)width * (height ? height : 1) * (depth ? depth : 1) * channels * elem;
    if (bytes > (unsigned __int128)sim_config()->memory_mib * SIM_MIB)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t charged = sim_round_up((uint64_t)bytes, SIM_PAGE);
    struct sim_array *a = malloc(sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (sim_charge(ctx->dev, charged) < 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *a = (struct sim_array){ctx->dev, charged, ctx};
    sim_handle_put((uintptr_t)a, SIM_KIND_ARRAY, a);
    *pHandle = (CUarray)a;
    return CUDA_SUCCESS;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    SIM_REQUIRE_INIT();
    if (!pAllocateArray)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    return array_create(pHandle, d->Width, d->Height, 0, d->Format, d->NumChannels);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    SIM_REQUIRE_INIT();
    if (!pAllocateArray)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    if (d->Depth && !d->Height)
        return CUDA_ERROR_INVALID_VALUE;  /* a 3D array needs a height */
    return array_create(pHandle, d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
}

static void array_free(struct sim_array *a)
{
    sim_uncharge(a->dev, a->charged);
    free(a);
}

CUresult cuArrayDestroy(CUarray hArray)
{
    SIM_REQUIRE_INIT();
    struct sim_array *a = sim_handle_take((uintptr_t)hArray, SIM_KIND_ARRAY);
    if (!a)
        return CUDA_ERROR_INVALID_HANDLE;
    array_free(a);
    return CUDA_SUCCESS;
}

static int owned_by_ctx(void *val, void *arg) { return ((struct sim_array *)val)->ctx == arg; }

void sim_free_ctx_arrays(struct sim_ctx *ctx)
{
    struct sim_array *a;
    while ((a = sim_handle_find(SIM_KIND_ARRAY, owned_by_ctx, ctx))) {
        sim_handle_take((uintptr_t)a, SIM_KIND_ARRAY);
        array_free(a);
    }
}
