/*
 * Every way to launch a kernel, as a compiled program linked against libcuda sees
 * them: cuLaunchKernel (kernelParams and the packed `extra` buffer), the _ptsz forms
 * on the per-thread stream, cuLaunchKernelEx, cooperative launches and a kernel
 * graph. Each line printed is "<path> <result> <milliseconds the stream took>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define CHECK(call) do { CUresult rc_ = (call); if (rc_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, rc_); exit(1); } } while (0)

static CUfunction kernel;
static CUevent start, stop;

static void timed(const char *path, CUstream stream, CUresult (*launch)(CUstream, uint64_t), uint64_t us)
{
    CHECK(cuEventRecord(start, stream));
    CUresult rc = launch(stream, us);
    CHECK(cuEventRecord(stop, stream));
    CHECK(cuEventSynchronize(stop));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, start, stop));
    printf("%s %d %.0f\n", path, rc, ms);
}

static CUresult plain(CUstream s, uint64_t us)
{
    void *params[] = {&us};
    return cuLaunchKernel(kernel, 4, 1, 1, 128, 1, 1, 0, s, params, NULL);
}

static CUresult packed(CUstream s, uint64_t us)
{
    size_t size = sizeof us;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &us, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    return cuLaunchKernel(kernel, 4, 1, 1, 128, 1, 1, 0, s, NULL, extra);
}

static CUresult per_thread(CUstream s, uint64_t us)
{
    void *params[] = {&us};
    return cuLaunchKernel_ptsz(kernel, 4, 1, 1, 128, 1, 1, 0, s, params, NULL);
}

static CUresult cooperative(CUstream s, uint64_t us)
{
    void *params[] = {&us};
    return cuLaunchCooperativeKernel(kernel, 132, 1, 1, 1024, 1, 1, 0, s, params);
}

static CUresult cooperative_too_large(CUstream s, uint64_t us)
{
    void *params[] = {&us};
    return cuLaunchCooperativeKernel(kernel, 132 * 2 + 1, 1, 1, 1024, 1, 1, 0, s, params);
}

static CUresult launch_ex(CUstream s, uint64_t us)
{
    void *params[] = {&us};
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
    CUlaunchConfig config = {8, 1, 1, 256, 1, 1, 0, s, &attr, 1};
    return cuLaunchKernelEx(&config, kernel, params, NULL);
}

static CUgraphExec graph_exec;

static CUresult graph(CUstream s, uint64_t us)
{
    (void)us;
    return cuGraphLaunch(graph_exec, s);
}

int main(void)
{
    CUcontext ctx;
    CUmodule module;
    CUstream stream;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CHECK(cuModuleLoadData(&module, "any image"));
    CHECK(cuModuleGetFunction(&kernel, module, "spin"));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));

    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    uint64_t node_us[3] = {10000, 20000, 30000};
    CUgraphNode prev = NULL;
    for (int i = 0; i < 3; i++) {
        void *params[] = {&node_us[i]};
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = kernel;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32;
        p.blockDimY = p.blockDimZ = 1;
        p.kernelParams = params;
        CUgraphNode node;
        CHECK(cuGraphAddKernelNode_v2(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &p));
        prev = node;
    }
    node_us[0] = node_us[1] = node_us[2] = 0;  /* parameters were copied when the nodes were added */
    CHECK(cuGraphInstantiateWithFlags(&graph_exec, g, 0));
    CHECK(cuGraphDestroy(g));

    timed("plain", stream, plain, 30000);
    timed("packed", stream, packed, 30000);
    timed("per_thread", CU_STREAM_PER_THREAD, per_thread, 30000);
    timed("legacy", CU_STREAM_LEGACY, plain, 30000);
    timed("cooperative", stream, cooperative, 30000);
    timed("cooperative_too_large", stream, cooperative_too_large, 30000);
    timed("launch_ex", stream, launch_ex, 30000);
    timed("graph", stream, graph, 0);
    CHECK(cuGraphExecDestroy(graph_exec));
    printf("graph_destroyed %d\n", cuGraphLaunch(graph_exec, stream));
    CHECK(cuModuleUnload(module));
    printf("unloaded %d\n", plain(stream, 1));
    CHECK(cuStreamDestroy_v2(stream));
    CHECK(cuCtxDestroy_v2(ctx));
    return 0;
}
