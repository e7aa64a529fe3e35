/*
 * Allocates device memory through the CUDA driver API, one allocation per
 * argument (MiB), and prints "alloc <MiB> <result>" for each; linked against
 * libcuda.so.1 so that a preloaded libvgpu interposes it as in any CUDA app.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

static int check(const char *what, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        printf("%s %d\n", what, (int)rc);
        fflush(stdout);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    size_t free_bytes = 0, total_bytes = 0;

    if (check("init", cuInit(0)) || check("device", cuDeviceGet(&dev, 0)) ||
        check("context", cuCtxCreate_v2(&ctx, 0, dev)))
        return 2;
    if (cuMemGetInfo_v2(&free_bytes, &total_bytes) == CUDA_SUCCESS)
        printf("total %zu\n", total_bytes >> 20);
    for (int i = 1; i < argc; i++) {
        CUdeviceptr ptr = 0;
        size_t mib = strtoull(argv[i], NULL, 10);
        printf("alloc %zu %d\n", mib, (int)cuMemAlloc_v2(&ptr, mib << 20));
    }
    fflush(stdout);
    return 0;
}
