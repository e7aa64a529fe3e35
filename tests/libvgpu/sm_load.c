/*
 * sm_load: keeps a device busy with fixed-length kernels of the simulated
 * driver and reports how many completed, per second of a measured window.
 *
 *   sm_load -u KERNEL_US -t SECONDS [-d DEV] [-m kernel|ex|coop|graph]
 *           [-w WARMUP_S] [-s START_MONOTONIC_NS] [-q QUEUE] [-n STREAMS]
 *
 * Launches go round-robin over STREAMS streams (default 1).
 * Completion times come from events recorded after each launch (device time,
 * converted to CLOCK_MONOTONIC through a reference event recorded on an idle
 * stream). The window starts at -s (an absolute CLOCK_MONOTONIC time, so that
 * processes started together measure the same seconds) or after -w seconds.
 * Output, one JSON line: {"completed": N, "seconds": T, "per_second": [...]}.
 *
 * Built twice: linked to libcuda (libvgpu preloaded in front of it), and with
 * -DSM_HARNESS, where it calls the SM limiter directly (sm_harness.h) so the
 * limiter can be exercised on its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

#define MAX_QUEUE 256
#define MAX_STREAMS 8
#define MAX_SECONDS 120

static void die(const char *what, CUresult r)
{
    fprintf(stderr, "sm_load: %s failed: %d\n", what, (int)r);
    exit(2);
}
#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) die(#call, r_); } while (0)

#ifdef SM_HARNESS
#include "sm_harness.h"
#else
#define HARNESS_BEFORE(stream)
#define HARNESS_AFTER(stream, r)
#endif

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void usage(void)
{
    fprintf(stderr, "usage: sm_load -u KERNEL_US -t SECONDS [-d DEV] [-m kernel|ex|coop|graph] "
                    "[-w WARMUP_S] [-s START_MONOTONIC_NS] [-q QUEUE] [-n STREAMS]\n");
    exit(1);
}

int main(int argc, char **argv)
{
    unsigned long long kernel_us = 0;
    double seconds = 0, warmup = 1.0;
    int dev_index = 0, queue = 16, nstreams = 1;
    long long start_at = 0;
    const char *mode = "kernel";
    int opt;
    while ((opt = getopt(argc, argv, "u:t:d:m:w:s:q:n:")) != -1) {
        switch (opt) {
        case 'u': kernel_us = strtoull(optarg, NULL, 10); break;
        case 't': seconds = atof(optarg); break;
        case 'd': dev_index = atoi(optarg); break;
        case 'm': mode = optarg; break;
        case 'w': warmup = atof(optarg); break;
        case 's': start_at = atoll(optarg); break;
        case 'q': queue = atoi(optarg); break;
        case 'n': nstreams = atoi(optarg); break;
        default: usage();
        }
    }
    if (!kernel_us || seconds <= 0 || seconds > MAX_SECONDS || queue < 1 || queue > MAX_QUEUE ||
        nstreams < 1 || nstreams > MAX_STREAMS)
        usage();
    int is_graph = !strcmp(mode, "graph"), is_ex = !strcmp(mode, "ex"), is_coop = !strcmp(mode, "coop");
    if (!is_graph && !is_ex && !is_coop && strcmp(mode, "kernel"))
        usage();

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream streams[MAX_STREAMS];
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, dev_index));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "sim"));
    CHECK(cuModuleGetFunction(&fn, mod, "spin"));
    for (int i = 0; i < nstreams; i++)
        CHECK(cuStreamCreate(&streams[i], 0));
    CUstream stream = streams[0];

    void *params[] = {&kernel_us};
    CUgraphExec graph_exec = NULL;
    if (is_graph) {
        /* one kernel node: a graph launch then takes as long as a kernel */
        CUgraph graph;
        CUgraphNode node;
        CUDA_KERNEL_NODE_PARAMS node_params;
        memset(&node_params, 0, sizeof(node_params));
        node_params.func = fn;
        node_params.gridDimX = node_params.gridDimY = node_params.gridDimZ = 1;
        node_params.blockDimX = node_params.blockDimY = node_params.blockDimZ = 1;
        node_params.kernelParams = params;
        CHECK(cuGraphCreate(&graph, 0));
        CHECK(cuGraphAddKernelNode_v2(&node, graph, NULL, 0, &node_params));
        CHECK(cuGraphInstantiateWithFlags(&graph_exec, graph, 0));
    }

    CUevent ref, done[MAX_QUEUE];
    CHECK(cuEventCreate(&ref, CU_EVENT_DEFAULT));
    for (int i = 0; i < queue; i++)
        CHECK(cuEventCreate(&done[i], CU_EVENT_DEFAULT));
    CHECK(cuStreamSynchronize(stream));
    int64_t ref_host = now_ns();
    CHECK(cuEventRecord(ref, stream));

    int64_t window_start = start_at ? start_at : ref_host + (int64_t)(warmup * 1e9);
    int64_t window_end = window_start + (int64_t)(seconds * 1e9);
    int nsec = (int)(seconds + 0.999);
    long per_second[MAX_SECONDS] = {0};
    long completed = 0;

    long launched = 0, retired = 0;
    for (;;) {
        int stop = now_ns() >= window_end;
        if (launched - retired == queue || (stop && retired < launched)) {
            CUevent ev = done[retired % queue];
            CHECK(cuEventSynchronize(ev));
            float ms;
            CHECK(cuEventElapsedTime(&ms, ref, ev));
            int64_t at = ref_host + (int64_t)((double)ms * 1e6);
            if (at >= window_start && at < window_end) {
                completed++;
                per_second[(at - window_start) / 1000000000LL]++;
            }
            retired++;
            continue;
        }
        if (stop)
            break;
        CUresult r;
        stream = streams[launched % nstreams];
        HARNESS_BEFORE(stream);
        if (is_graph) {
            r = cuGraphLaunch(graph_exec, stream);
        } else if (is_ex) {
            CUlaunchConfig cfg;
            memset(&cfg, 0, sizeof(cfg));
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
            cfg.hStream = stream;
            r = cuLaunchKernelEx(&cfg, fn, params, NULL);
        } else if (is_coop) {
            r = cuLaunchCooperativeKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params);
        } else {
            r = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
        }
        HARNESS_AFTER(stream, r);
        if (r != CUDA_SUCCESS)
            die("launch", r);
        CHECK(cuEventRecord(done[launched % queue], stream));
        launched++;
    }

    printf("{\"completed\": %ld, \"seconds\": %g, \"kernel_us\": %llu, \"per_second\": [",
           completed, seconds, kernel_us);
    for (int i = 0; i < nsec; i++)
        printf("%s%ld", i ? ", " : "", per_second[i]);
    printf("]}\n");
    return 0;
}
