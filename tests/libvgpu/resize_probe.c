/*
 * A long-running CUDA process for live resizes: it keeps one context and obeys
 * one command per line on stdin, answering one line on stdout, so that a test
 * can change the container's limits between its calls and see what the next
 * call gets.
 *
 *   alloc MIB             -> "alloc rc=<CUresult>" (kept until `free`)
 *   free                  -> "free n=<allocations freed>"
 *   info                  -> "info free=<bytes> total=<bytes>" (cuMemGetInfo)
 *   spin N US             -> "spin seconds=<wall time of N launches of US us, synchronised>"
 *   wait_total BYTES S    -> "seen ns=<CLOCK_MONOTONIC when cuMemGetInfo's total was BYTES>
 *                            polls=<calls>" (ns=0 if not within S seconds)
 *
 * Kernels are the simulated driver's `spin` (module "sim"), as sm_load uses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define MAX_ALLOCS 4096

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static int check(const char *what, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        printf("error %s rc=%d\n", what, (int)rc);
        fflush(stdout);
        exit(1);
    }
    return 0;
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    static CUdeviceptr held[MAX_ALLOCS];
    int count = 0;
    char line[256];

    check("init", cuInit(0));
    check("device", cuDeviceGet(&dev, 0));
    check("context", cuDevicePrimaryCtxRetain(&ctx, dev));
    check("current", cuCtxSetCurrent(ctx));
    check("module", cuModuleLoadData(&mod, "sim"));
    check("function", cuModuleGetFunction(&spin, mod, "spin"));
    printf("ready\n");
    fflush(stdout);

    while (fgets(line, sizeof line, stdin)) {
        unsigned long long a = 0, b = 0;
        if (sscanf(line, "alloc %llu", &a) == 1) {
            CUdeviceptr p = 0;
            CUresult rc = count < MAX_ALLOCS ? cuMemAlloc_v2(&p, (size_t)a << 20)
                                             : CUDA_ERROR_OUT_OF_MEMORY;
            if (rc == CUDA_SUCCESS)
                held[count++] = p;
            printf("alloc rc=%d\n", (int)rc);
        } else if (!strncmp(line, "free", 4)) {
            int n = count;
            while (count > 0)
                check("free", cuMemFree_v2(held[--count]));
            printf("free n=%d\n", n);
        } else if (!strncmp(line, "info", 4)) {
            size_t free_bytes = 0, total = 0;
            check("info", cuMemGetInfo_v2(&free_bytes, &total));
            printf("info free=%zu total=%zu\n", free_bytes, total);
        } else if (sscanf(line, "spin %llu %llu", &a, &b) == 2) {
            void *params[] = {&b};
            unsigned long long start = now_ns();
            for (unsigned long long i = 0; i < a; i++)
                check("launch", cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
            check("sync", cuCtxSynchronize());
            printf("spin seconds=%.6f\n", (double)(now_ns() - start) / 1e9);
        } else if (sscanf(line, "wait_total %llu %llu", &a, &b) == 2) {
            unsigned long long until = now_ns() + b * 1000000000ull, seen = 0, polls = 0;
            while (!seen && now_ns() < until) {
                size_t free_bytes = 0, total = 0;
                check("info", cuMemGetInfo_v2(&free_bytes, &total));
                polls++;
                if (total == a)
                    seen = now_ns();
            }
            printf("seen ns=%llu polls=%llu\n", seen, polls);
        } else {
            printf("error unknown command\n");
        }
        fflush(stdout);
    }
    return 0;
}
