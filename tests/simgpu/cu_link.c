/* Driver API: the JIT linker. The simulator does not compile: linking PTX inputs
 * gives their text (one after another, as one PTX the module loader reads), and
 * linking a single cubin or fatbin gives that image. The image belongs to the link
 * state until cuLinkDestroy. Logs are left empty and say so. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

struct sim_link {
    char *ptx;                           /* PTX inputs, concatenated */
    size_t ptx_len;
    void *binary;                        /* the one cubin/fatbin input */
    size_t binary_size;
    unsigned binaries;
    void *image;                         /* cuLinkComplete's result */
    size_t image_size;
    /* the caller's log and wall-time outputs, written at cuLinkComplete */
    void **size_out[2];                  /* info, error log sizes */
    float *wall_time;
};

/* Options: logs are emptied (sizes written back at completion); the rest are accepted. */
static CUresult read_options(struct sim_link *l, unsigned n, const CUjit_option *options, void **values)
{
    if (n && (!options || !values))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        switch (options[i]) {
        case CU_JIT_INFO_LOG_BUFFER:
        case CU_JIT_ERROR_LOG_BUFFER:
            if (values[i])
                *(char *)values[i] = 0;
            break;
        case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
            if (l)
                l->size_out[0] = &values[i];
            break;
        case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
            if (l)
                l->size_out[1] = &values[i];
            break;
        case CU_JIT_WALL_TIME:
            if (l)
                l->wall_time = (float *)&values[i];
            break;
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut)
{
    SIM_REQUIRE_INIT();
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!stateOut)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_link *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = read_options(l, numOptions, options, optionValues)) != CUDA_SUCCESS) {
        free(l);
        return rc;
    }
    sim_handle_put((uintptr_t)l, SIM_KIND_LINK, l);
    *stateOut = (CUlinkState)l;
    return CUDA_SUCCESS;
}

static CUresult add(struct sim_link *l, CUjitInputType type, const void *data, size_t size)
{
    switch (type) {
    case CU_JIT_INPUT_PTX: {
        size_t len = strnlen(data, size);
        char *ptx = realloc(l->ptx, l->ptx_len + len + 2);
        if (!ptx)
            return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(ptx + l->ptx_len, data, len);
        l->ptx_len += len;
        ptx[l->ptx_len++] = '\n';
        ptx[l->ptx_len] = 0;
        l->ptx = ptx;
        return CUDA_SUCCESS;
    }
    case CU_JIT_INPUT_CUBIN:
    case CU_JIT_INPUT_FATBINARY:
        if (!size)
            return CUDA_ERROR_INVALID_IMAGE;
        if (l->binaries++)
            return CUDA_SUCCESS;         /* refused at completion: binaries are not merged */
        if (!(l->binary = malloc(size)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(l->binary, data, size);
        l->binary_size = size;
        return CUDA_SUCCESS;
    case CU_JIT_INPUT_OBJECT:
    case CU_JIT_INPUT_LIBRARY:
    case CU_JIT_INPUT_NVVM:
        /* relocatable device code and NVVM IR need a real device linker */
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                          unsigned int numOptions, CUjit_option *options, void **optionValues)
{
    SIM_REQUIRE_INIT();
    (void)name;
    struct sim_link *l = sim_handle_get((uintptr_t)state, SIM_KIND_LINK);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!data || read_options(NULL, numOptions, options, optionValues) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    return add(l, type, data, size);
}

CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                          CUjit_option *options, void **optionValues)
{
    SIM_REQUIRE_INIT();
    struct sim_link *l = sim_handle_get((uintptr_t)state, SIM_KIND_LINK);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!path || read_options(NULL, numOptions, options, optionValues) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    char *data;
    size_t len;
    CUresult rc = sim_image_read_file(path, &data, &len);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = add(l, type, data, len);
    free(data);
    return rc;
}

CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    SIM_REQUIRE_INIT();
    struct sim_link *l = sim_handle_get((uintptr_t)state, SIM_KIND_LINK);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!cubinOut || !sizeOut)
        return CUDA_ERROR_INVALID_VALUE;
    if (!l->image) {
        if (l->binaries > 1 || (l->binaries && l->ptx))
            return CUDA_ERROR_NOT_SUPPORTED;  /* only one image can be passed through unchanged */
        if (l->binaries) {
            l->image = l->binary;
            l->image_size = l->binary_size;
        } else if (l->ptx) {
            l->image = l->ptx;
            l->image_size = l->ptx_len + 1;
        } else {
            return CUDA_ERROR_INVALID_VALUE;  /* nothing to link */
        }
    }
    for (int i = 0; i < 2; i++)
        if (l->size_out[i])
            *l->size_out[i] = (void *)(uintptr_t)0;
    if (l->wall_time)
        *l->wall_time = 0.0f;
    *cubinOut = l->image;
    *sizeOut = l->image_size;
    return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(CUlinkState state)
{
    SIM_REQUIRE_INIT();
    struct sim_link *l = sim_handle_take((uintptr_t)state, SIM_KIND_LINK);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    free(l->ptx);
    free(l->binary);
    free(l);
    return CUDA_SUCCESS;
}

/* The legacy exports (before 6.5) take the same arguments with the same meaning. */
extern __typeof__(cuLinkCreate_v2) cuLinkCreate __attribute__((alias("cuLinkCreate_v2")));
extern __typeof__(cuLinkAddData_v2) cuLinkAddData __attribute__((alias("cuLinkAddData_v2")));
extern __typeof__(cuLinkAddFile_v2) cuLinkAddFile __attribute__((alias("cuLinkAddFile_v2")));
