/*
 * capture_probe: stream capture and CUDA graphs on the driver API, as a program
 * that uses them would, under libvgpu or not (it comes in by LD_PRELOAD).
 *
 *   capture_probe capture MODE KERNELS REPLAYS [neighbour [LAUNCHES]]
 *       MODE global|thread_local|relaxed. Captures KERNELS test kernels of 200 µs
 *       on a stream, forked to a second stream and joined back through events, ends
 *       the capture, instantiates it and launches the graph REPLAYS times. With
 *       `neighbour`, a second thread keeps launching 100 µs kernels on a stream of
 *       its own for as long as the capture is open, which waits for LAUNCHES of
 *       them (5 by default) after each captured kernel.
 *   capture_probe graph_memory MIB upload|launch
 *       Captures a graph that allocates MIB MiB (cuMemAllocAsync), runs a kernel and
 *       frees it; commits it by cuGraphUpload or cuGraphLaunch, launches it again,
 *       then trims the device's graph memory.
 *
 * Prints key=value pairs: each step's CUresult and cuMemGetInfo's free MiB around
 * them. Exit 0 when it ran to the end, whatever the driver answered.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define MIB (1024ull * 1024ull)

static CUfunction spin;
static CUcontext ctx;

static void die(const char *what, CUresult r)
{
    printf("failed=%s rc=%d\n", what, (int)r);
    exit(2);
}
#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) die(#call, r_); } while (0)

/* The test kernel's one parameter: its duration in µs, 64 bits. */
static CUresult launch(CUstream s, unsigned long long us)
{
    void *params[] = {&us};
    return cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static unsigned long long free_mib(void)
{
    size_t free = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free, &total));
    return free / MIB;
}

/* ---- a neighbour thread launching while the capture is open ---- */

static _Atomic int neighbour_stop;
static _Atomic int neighbour_launched;
static _Atomic int neighbour_rc;

static void *neighbour(void *arg)
{
    (void)arg;
    CUstream s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    while (!neighbour_stop) {
        CUresult rc = launch(s, 100);
        if (rc != CUDA_SUCCESS) {
            neighbour_rc = rc;
            break;
        }
        neighbour_launched++;
    }
    return NULL;
}

static void wait_for_neighbour(int launches)
{
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 10000 && neighbour_launched < launches && !neighbour_rc; i++)
        nanosleep(&ms, NULL);
}

static int capture(const char *mode_name, int kernels, int replays, int with_neighbour, int per_kernel)
{
    CUstreamCaptureMode mode = !strcmp(mode_name, "relaxed")        ? CU_STREAM_CAPTURE_MODE_RELAXED
                               : !strcmp(mode_name, "thread_local") ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                                                    : CU_STREAM_CAPTURE_MODE_GLOBAL;
    CUstream s, side;
    CUevent fork, join;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
    for (int i = 0; i < 3; i++)                  /* work in flight before the capture */
        CHECK(launch(s, 200));
    pthread_t thread;
    if (with_neighbour) {
        pthread_create(&thread, NULL, neighbour, NULL);
        wait_for_neighbour(5);
    }
    CHECK(cuStreamBeginCapture_v2(s, mode));
    int base = neighbour_launched;
    CUresult launch_rc = CUDA_SUCCESS;
    for (int i = 0; i < kernels && launch_rc == CUDA_SUCCESS; i++) {
        launch_rc = launch(s, 200);
        if (i == 0 && launch_rc == CUDA_SUCCESS) {   /* fork a second stream into the capture, join it */
            launch_rc = cuEventRecord(fork, s);
            if (launch_rc == CUDA_SUCCESS)
                launch_rc = cuStreamWaitEvent(side, fork, 0);
            if (launch_rc == CUDA_SUCCESS)
                launch_rc = launch(side, 200);
            if (launch_rc == CUDA_SUCCESS)
                launch_rc = cuEventRecord(join, side);
            if (launch_rc == CUDA_SUCCESS)
                launch_rc = cuStreamWaitEvent(s, join, 0);
        }
        if (with_neighbour)
            wait_for_neighbour(base + per_kernel * (i + 1));
    }
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult status_rc = cuStreamIsCapturing(s, &status);
    CUgraph graph = NULL;
    CUresult end_rc = cuStreamEndCapture(s, &graph);
    if (with_neighbour) {
        neighbour_stop = 1;
        pthread_join(thread, NULL);
    }
    printf("launch_rc=%d status_rc=%d status=%d end_rc=%d neighbour_launches=%d neighbour_rc=%d\n",
           (int)launch_rc, (int)status_rc, (int)status, (int)end_rc, neighbour_launched - base,
           (int)neighbour_rc);
    if (end_rc != CUDA_SUCCESS)
        return 0;
    size_t nodes = 0;
    CHECK(cuGraphGetNodes(graph, NULL, &nodes));
    CUgraphExec exec;
    CUresult inst_rc = cuGraphInstantiateWithFlags(&exec, graph, 0);
    CUresult replay_rc = inst_rc;
    for (int i = 0; i < replays && replay_rc == CUDA_SUCCESS; i++)
        replay_rc = cuGraphLaunch(exec, s);
    CUresult sync_rc = cuStreamSynchronize(s);
    printf("nodes=%zu instantiate_rc=%d replay_rc=%d sync_rc=%d\n", nodes, (int)inst_rc, (int)replay_rc,
           (int)sync_rc);
    return 0;
}

static int graph_memory(unsigned long long mib, const char *how)
{
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned long long before = free_mib();
    CUgraph graph;
    CUdeviceptr p = 0;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult alloc_rc = cuMemAllocAsync(&p, mib * MIB, s);
    if (alloc_rc == CUDA_SUCCESS) {
        CHECK(launch(s, 100));
        CHECK(cuMemFreeAsync(p, s));
    }
    CUresult end_rc = cuStreamEndCapture(s, &graph);
    printf("free_before=%llu alloc_rc=%d end_rc=%d\n", before, (int)alloc_rc, (int)end_rc);
    if (end_rc != CUDA_SUCCESS)
        return 0;
    CUgraphExec exec;
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    unsigned long long instantiated = free_mib();
    CUresult commit_rc = !strcmp(how, "upload") ? cuGraphUpload(exec, s) : cuGraphLaunch(exec, s);
    CHECK(cuStreamSynchronize(s));
    unsigned long long committed = free_mib();
    CUresult again_rc = cuGraphLaunch(exec, s);
    CHECK(cuStreamSynchronize(s));
    unsigned long long again = free_mib();
    CUdevice dev;
    CHECK(cuCtxGetDevice(&dev));
    CHECK(cuDeviceGraphMemTrim(dev));
    unsigned long long trimmed = free_mib();
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    printf("free_instantiated=%llu commit_rc=%d free_committed=%llu again_rc=%d free_again=%llu "
           "free_trimmed=%llu\n",
           instantiated, (int)commit_rc, committed, (int)again_rc, again, trimmed);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: capture_probe capture|graph_memory ...\n");
        return 1;
    }
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "sim"));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    if (!strcmp(argv[1], "capture") && argc >= 5)
        return capture(argv[2], atoi(argv[3]), atoi(argv[4]), argc > 5 && !strcmp(argv[5], "neighbour"),
                       argc > 6 ? atoi(argv[6]) : 5);
    if (!strcmp(argv[1], "graph_memory") && argc == 4)
        return graph_memory(strtoull(argv[2], NULL, 10), argv[3]);
    fprintf(stderr, "capture_probe: bad arguments\n");
    return 1;
}
