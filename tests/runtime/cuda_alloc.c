/*
 * Allocates device memory through the CUDA driver API, one allocation per
 * argument (MiB), and prints "alloc <MiB> <result>" for each; linked against
 * libcuda.so.1 so that a preloaded libvgpu interposes it as in any CUDA app.
 *
 * `cuda_alloc keep <MiB> <seconds>`: keeps allocating <MiB> at a time for that
 * long, holding all of it; a refusal is retried every 20 ms (a live resize lets
 * it get further). What it holds shows in the container's region.
 *
 * An argument `@<path>` waits (at most 20 s) until <path> exists, holding what was
 * allocated so far, so that a test can act between two allocations.
 *
 * `cuda_alloc spin <count> <us>`: launches <count> kernels of <us> microseconds
 * each (the simulated driver's test kernel `spin`), waits for them and prints
 * "spin <seconds>": how long the work took under the container's SM share.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    if (argc == 4 && !strcmp(argv[1], "spin")) {
        CUmodule mod;
        CUfunction fn;
        if (check("module", cuModuleLoadData(&mod, "test image")) ||
            check("function", cuModuleGetFunction(&fn, mod, "spin")))
            return 2;
        uint64_t us = strtoull(argv[3], NULL, 10);
        void *params[] = {&us};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < atoi(argv[2]); i++)
            if (check("launch", cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL)))
                return 2;
        if (check("sync", cuCtxSynchronize()))
            return 2;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("spin %.3f\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "keep")) {
        size_t step = strtoull(argv[2], NULL, 10) << 20;
        time_t until = time(NULL) + atoi(argv[3]);
        struct timespec pause = {0, 20000000};
        while (time(NULL) < until) {
            CUdeviceptr ptr = 0;
            if (cuMemAlloc_v2(&ptr, step) != CUDA_SUCCESS)
                nanosleep(&pause, NULL);
        }
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '@') {
            fflush(stdout);                      /* what it holds is said before it waits */
            struct timespec pause = {0, 20000000};
            for (int tries = 0; tries < 1000 && access(argv[i] + 1, F_OK) != 0; tries++)
                nanosleep(&pause, NULL);
            continue;
        }
        CUdeviceptr ptr = 0;
        size_t mib = strtoull(argv[i], NULL, 10);
        printf("alloc %zu %d\n", mib, (int)cuMemAlloc_v2(&ptr, mib << 20));
    }
    fflush(stdout);
    return 0;
}
