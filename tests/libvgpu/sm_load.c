/*
 * sm_load: keeps a device busy with fixed-length kernels of the simulated
 * driver and reports how many completed, per second of a measured window.
 *
 *   sm_load -u KERNEL_US -t SECONDS [-d DEV] [-m kernel|ex|coop|graph|captured]
 *           [-w WARMUP_S] [-s START_MONOTONIC_NS] [-q QUEUE] [-n STREAMS] [-p THREADS]
 *           [-c CONTEXT_MONOTONIC_NS]
 *
 * -m graph: one kernel node added with cuGraphAddKernelNode; -m captured: a graph
 * captured from a stream (global mode), four kernels of KERNEL_US / 4 each. Either
 * way one launch keeps the device busy KERNEL_US.
 * -c: the context is made at that CLOCK_MONOTONIC time (processes started
 * together then make theirs at once).
 * THREADS threads (default 1) launch at once, each round-robin over the same
 * STREAMS streams (default 1), so threads may share a stream.
 * Completion times come from events recorded after each launch (device time,
 * converted to CLOCK_MONOTONIC through a reference event recorded on an idle
 * stream). The window starts at -s (an absolute CLOCK_MONOTONIC time, so that
 * processes started together measure the same seconds) or after -w seconds.
 * Output, one JSON line: {"completed": N, "launched": L (every launch, in the window
 * or not; each one was waited for, so all of them completed), "last_s": when the last one
 * completed, relative to the window, "seconds": T, "kernel_us": U,
 * "ready_s": when launching began relative to the window, "per_second": [...],
 * "per_tenth": [...] (completions per 100 ms, for switching times)}.
 *
 * Linked to libcuda, as an application is: libvgpu comes in by LD_PRELOAD.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

#define MAX_QUEUE 256
#define MAX_STREAMS 8
#define MAX_THREADS 8
#define MAX_SECONDS 120

static void die(const char *what, CUresult r)
{
    fprintf(stderr, "sm_load: %s failed: %d\n", what, (int)r);
    exit(2);
}
#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) die(#call, r_); } while (0)

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void usage(void)
{
    fprintf(stderr, "usage: sm_load -u KERNEL_US -t SECONDS [-d DEV] [-m kernel|ex|coop|graph|captured] "
                    "[-w WARMUP_S] [-s START_MONOTONIC_NS] [-q QUEUE] [-n STREAMS] "
                    "[-p THREADS] [-c CONTEXT_MONOTONIC_NS]\n");
    exit(1);
}

/* What every launching thread shares (read-only once they run). */
static struct {
    unsigned long long kernel_us;
    int dev_index, queue, nstreams;
    int is_graph, is_ex, is_coop;
    CUcontext ctx;
    CUfunction fn;
    CUgraphExec graph_exec;
    CUstream streams[MAX_STREAMS];
    CUevent ref;
    int64_t ref_host, window_start, window_end;
} cfg;

struct launcher {
    pthread_t thread;
    long completed;
    long launched;
    int64_t last_done;                           /* CLOCK_MONOTONIC of the latest completion */
    long per_second[MAX_SECONDS];
    long per_tenth[MAX_SECONDS * 10];
};

static CUresult launch_one(CUstream stream, void **params)
{
    if (cfg.is_graph)
        return cuGraphLaunch(cfg.graph_exec, stream);
    if (cfg.is_ex) {
        CUlaunchConfig lc;
        memset(&lc, 0, sizeof(lc));
        lc.gridDimX = lc.gridDimY = lc.gridDimZ = 1;
        lc.blockDimX = lc.blockDimY = lc.blockDimZ = 1;
        lc.hStream = stream;
        return cuLaunchKernelEx(&lc, cfg.fn, params, NULL);
    }
    if (cfg.is_coop)
        return cuLaunchCooperativeKernel(cfg.fn, 1, 1, 1, 1, 1, 1, 0, stream, params);
    return cuLaunchKernel(cfg.fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

/* Launches until the window closes, keeping `queue` launches in flight, and
 * counts completions inside the window. */
static void *launcher_run(void *arg)
{
    struct launcher *me = arg;
    int queue = cfg.queue;
    unsigned long long kernel_us = cfg.kernel_us;
    void *params[] = {&kernel_us};
    CUevent done[MAX_QUEUE];
    CHECK(cuCtxSetCurrent(cfg.ctx));
    for (int i = 0; i < queue; i++)
        CHECK(cuEventCreate(&done[i], CU_EVENT_DEFAULT));
    long launched = 0, retired = 0;
    for (;;) {
        int stop = now_ns() >= cfg.window_end;
        if (launched - retired == queue || (stop && retired < launched)) {
            CUevent ev = done[retired % queue];
            CHECK(cuEventSynchronize(ev));
            float ms;
            CHECK(cuEventElapsedTime(&ms, cfg.ref, ev));
            int64_t at = cfg.ref_host + (int64_t)((double)ms * 1e6);
            if (at > me->last_done)
                me->last_done = at;
            if (at >= cfg.window_start && at < cfg.window_end) {
                me->completed++;
                me->per_second[(at - cfg.window_start) / 1000000000LL]++;
                me->per_tenth[(at - cfg.window_start) / 100000000LL]++;
            }
            retired++;
            continue;
        }
        if (stop) {
            me->launched = launched;
            break;
        }
        CUstream stream = cfg.streams[launched % cfg.nstreams];
        CUresult r = launch_one(stream, params);
        if (r != CUDA_SUCCESS)
            die("launch", r);
        CHECK(cuEventRecord(done[launched % queue], stream));
        launched++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    double seconds = 0, warmup = 1.0;
    int nthreads = 1;
    long long start_at = 0, context_at = 0;
    const char *mode = "kernel";
    int opt;
    cfg.queue = 16;
    cfg.nstreams = 1;
    while ((opt = getopt(argc, argv, "u:t:d:m:w:s:q:n:p:c:")) != -1) {
        switch (opt) {
        case 'u': cfg.kernel_us = strtoull(optarg, NULL, 10); break;
        case 't': seconds = atof(optarg); break;
        case 'd': cfg.dev_index = atoi(optarg); break;
        case 'm': mode = optarg; break;
        case 'w': warmup = atof(optarg); break;
        case 's': start_at = atoll(optarg); break;
        case 'q': cfg.queue = atoi(optarg); break;
        case 'n': cfg.nstreams = atoi(optarg); break;
        case 'p': nthreads = atoi(optarg); break;
        case 'c': context_at = atoll(optarg); break;
        default: usage();
        }
    }
    if (!cfg.kernel_us || seconds <= 0 || seconds > MAX_SECONDS || cfg.queue < 1 || cfg.queue > MAX_QUEUE ||
        cfg.nstreams < 1 || cfg.nstreams > MAX_STREAMS || nthreads < 1 || nthreads > MAX_THREADS)
        usage();
    int captured = !strcmp(mode, "captured");
    cfg.is_graph = captured || !strcmp(mode, "graph");
    cfg.is_ex = !strcmp(mode, "ex");
    cfg.is_coop = !strcmp(mode, "coop");
    if (!cfg.is_graph && !cfg.is_ex && !cfg.is_coop && strcmp(mode, "kernel"))
        usage();

    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, cfg.dev_index));
    if (context_at > now_ns()) {
        long long wait = context_at - now_ns();
        struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
        nanosleep(&ts, NULL);
    }
    CHECK(cuDevicePrimaryCtxRetain(&cfg.ctx, dev));
    CHECK(cuCtxSetCurrent(cfg.ctx));
    CHECK(cuModuleLoadData(&mod, "sim"));
    CHECK(cuModuleGetFunction(&cfg.fn, mod, "spin"));
    for (int i = 0; i < cfg.nstreams; i++)
        CHECK(cuStreamCreate(&cfg.streams[i], 0));

    if (captured) {
        /* four kernels of a quarter each, captured: a graph launch takes as long as a kernel */
        unsigned long long quarter = cfg.kernel_us / 4 ? cfg.kernel_us / 4 : 1;
        void *params[] = {&quarter};
        CUgraph graph;
        CHECK(cuStreamBeginCapture_v2(cfg.streams[0], CU_STREAM_CAPTURE_MODE_GLOBAL));
        for (int i = 0; i < 4; i++)
            CHECK(cuLaunchKernel(cfg.fn, 1, 1, 1, 1, 1, 1, 0, cfg.streams[0], params, NULL));
        CHECK(cuStreamEndCapture(cfg.streams[0], &graph));
        CHECK(cuGraphInstantiateWithFlags(&cfg.graph_exec, graph, 0));
    } else if (cfg.is_graph) {
        /* one kernel node: a graph launch then takes as long as a kernel */
        void *params[] = {&cfg.kernel_us};
        CUgraph graph;
        CUgraphNode node;
        CUDA_KERNEL_NODE_PARAMS node_params;
        memset(&node_params, 0, sizeof(node_params));
        node_params.func = cfg.fn;
        node_params.gridDimX = node_params.gridDimY = node_params.gridDimZ = 1;
        node_params.blockDimX = node_params.blockDimY = node_params.blockDimZ = 1;
        node_params.kernelParams = params;
        CHECK(cuGraphCreate(&graph, 0));
        CHECK(cuGraphAddKernelNode_v2(&node, graph, NULL, 0, &node_params));
        CHECK(cuGraphInstantiateWithFlags(&cfg.graph_exec, graph, 0));
    }

    /* device time -> CLOCK_MONOTONIC: a reference event recorded on an idle stream */
    CHECK(cuEventCreate(&cfg.ref, CU_EVENT_DEFAULT));
    CHECK(cuStreamSynchronize(cfg.streams[0]));
    cfg.ref_host = now_ns();
    CHECK(cuEventRecord(cfg.ref, cfg.streams[0]));
    CHECK(cuEventSynchronize(cfg.ref));
    cfg.window_start = start_at ? start_at : cfg.ref_host + (int64_t)(warmup * 1e9);
    cfg.window_end = cfg.window_start + (int64_t)(seconds * 1e9);

    /* when launching began, against the window: shows a start delayed by a loaded machine */
    double ready_s = (double)(now_ns() - cfg.window_start) / 1e9;
    static struct launcher launchers[MAX_THREADS];
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&launchers[i].thread, NULL, launcher_run, &launchers[i]))
            die("pthread_create", CUDA_ERROR_OPERATING_SYSTEM);
    static long per_second[MAX_SECONDS], per_tenth[MAX_SECONDS * 10];
    long completed = 0, launched = 0;
    int64_t last_done = 0;
    int nsec = (int)(seconds + 0.999), ntenth = (int)(seconds * 10 + 0.999);
    for (int i = 0; i < nthreads; i++) {
        pthread_join(launchers[i].thread, NULL);
        completed += launchers[i].completed;
        launched += launchers[i].launched;
        if (launchers[i].last_done > last_done)
            last_done = launchers[i].last_done;
        for (int s = 0; s < nsec; s++)
            per_second[s] += launchers[i].per_second[s];
        for (int s = 0; s < ntenth; s++)
            per_tenth[s] += launchers[i].per_tenth[s];
    }

    printf("{\"completed\": %ld, \"launched\": %ld, \"last_s\": %.3f, \"seconds\": %g, \"kernel_us\": %llu, "
           "\"ready_s\": %.3f, \"per_second\": [", completed, launched,
           (double)(last_done - cfg.window_start) / 1e9, seconds, cfg.kernel_us, ready_s);
    for (int i = 0; i < nsec; i++)
        printf("%s%ld", i ? ", " : "", per_second[i]);
    printf("], \"per_tenth\": [");
    for (int i = 0; i < ntenth; i++)
        printf("%s%ld", i ? ", " : "", per_tenth[i]);
    printf("]}\n");
    return 0;
}
