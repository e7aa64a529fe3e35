/*
 * libvgpu_bench: per-call cost of the hot paths and CUDA init, for
 * bench/libvgpu_overhead.py (run with and without libvgpu preloaded).
 *
 *   libvgpu_bench calls N   prints alloc_ns free_ns launch_ns getinfo_ns per call
 *   libvgpu_bench init      prints init_ns: cuInit .. first allocation, in process
 *   libvgpu_bench uuids     prints each device's UUID, one a line (for a limits file)
 * Env BENCH_DEVICE=N: calls and init work on CUDA device N (default 0).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define CHECK(call)                                                   \
    do {                                                              \
        CUresult rc_ = (call);                                        \
        if (rc_ != CUDA_SUCCESS) {                                    \
            fprintf(stderr, "%s: rc=%d\n", #call, (int)rc_);          \
            exit(1);                                                  \
        }                                                             \
    } while (0)

static CUcontext open_context(void)
{
    CUdevice dev;
    CUcontext ctx;
    const char *ordinal = getenv("BENCH_DEVICE");
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, ordinal ? atoi(ordinal) : 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    return ctx;
}

static int bench_calls(long n)
{
    open_context();
    /* batches of BATCH allocations then BATCH frees: 4 KiB each takes a 2 MiB page */
    enum { BATCH = 1000 };
    CUdeviceptr ptrs[BATCH];
    long long alloc_total = 0, free_total = 0, done = 0;
    while (done < n) {
        long long t0 = now_ns();
        for (int i = 0; i < BATCH; i++)
            CHECK(cuMemAlloc_v2(&ptrs[i], 4096));
        long long t1 = now_ns();
        for (int i = 0; i < BATCH; i++)
            CHECK(cuMemFree_v2(ptrs[i]));
        long long t2 = now_ns();
        alloc_total += t1 - t0;
        free_total += t2 - t1;
        done += BATCH;
    }

    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, "bench"));
    CHECK(cuModuleGetFunction(&fn, mod, "empty"));
    unsigned long long zero_us = 0;
    void *params[] = {&zero_us};
    CHECK(cuCtxSynchronize());
    long long t3 = now_ns();
    for (long i = 0; i < n; i++)
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    long long t4 = now_ns();
    CHECK(cuCtxSynchronize());

    size_t free_b, total_b;
    long long t5 = now_ns();
    for (long i = 0; i < n; i++)
        CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    long long t6 = now_ns();
    printf("alloc_ns=%.1f free_ns=%.1f launch_ns=%.1f getinfo_ns=%.1f\n",
           (double)alloc_total / done, (double)free_total / done, (double)(t4 - t3) / n,
           (double)(t6 - t5) / n);
    return 0;
}

static int bench_init(void)
{
    long long t0 = now_ns();
    open_context();
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 4096));
    long long t1 = now_ns();
    CHECK(cuMemFree_v2(p));
    printf("init_ns=%lld\n", t1 - t0);
    return 0;
}

static int bench_uuids(void)
{
    int count;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&count));
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        CUuuid id;
        CHECK(cuDeviceGet(&dev, i));
        CHECK(cuDeviceGetUuid_v2(&id, dev));
        const unsigned char *b = (const unsigned char *)id.bytes;
        printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0], b[1],
               b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "calls"))
        return bench_calls(atol(argv[2]));
    if (argc >= 2 && !strcmp(argv[1], "init"))
        return bench_init();
    if (argc >= 2 && !strcmp(argv[1], "uuids"))
        return bench_uuids();
    fprintf(stderr, "usage: libvgpu_bench calls N | init | uuids\n");
    return 2;
}
