/*
 * Stream capture and graph memory as a compiled program sees them. One scenario per run,
 * named by argv[1] (see main); each prints one JSON object: the result codes and states
 * the scenario met, for tests/simgpu/test_capture.py to compare with the driver's rules.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define CHECK(call) do { CUresult rc_ = (call); if (rc_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, rc_); exit(1); } } while (0)
#define MIB (1024ULL * 1024ULL)

static CUcontext ctx;
static CUfunction spin;
static CUstream s1, s2, nb;              /* two blocking streams, one non-blocking */

static CUresult launch(CUstream s, uint64_t us)
{
    void *params[] = {&us};
    return cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
}

static int status(CUstream s)
{
    CUstreamCaptureStatus st;
    CUresult rc = cuStreamIsCapturing(s, &st);
    return rc == CUDA_SUCCESS ? (int)st : -(int)rc;
}

static size_t nodes(CUgraph g)
{
    size_t n = 0;
    return g && cuGraphGetNodes(g, NULL, &n) == CUDA_SUCCESS ? n : (size_t)-1;
}

static unsigned long long mem_free(void)
{
    size_t free_b, total;
    CHECK(cuMemGetInfo_v2(&free_b, &total));
    return free_b;
}

static unsigned long long attr(CUgraphMem_attribute a)
{
    cuuint64_t v = 0;
    CHECK(cuDeviceGetGraphMemAttribute(0, a, &v));
    return v;
}

/* ---- one capture in a given mode: begin, a kernel, queries, end ---- */
static void modes(const char *which)
{
    CUstreamCaptureMode mode = !strcmp(which, "global") ? CU_STREAM_CAPTURE_MODE_GLOBAL
                               : !strcmp(which, "thread_local") ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                                                 : CU_STREAM_CAPTURE_MODE_RELAXED;
    int begin = cuStreamBeginCapture_v2(s1, mode);
    int again = cuStreamBeginCapture_v2(s1, mode);
    int kernel = launch(s1, 1000);
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    CUgraph g = NULL;
    const CUgraphNode *deps = NULL;
    size_t ndeps = 0;
    int info = cuStreamGetCaptureInfo_v3(s1, &st, &id, &g, &deps, NULL, &ndeps);
    CUgraphNodeType type = 99;
    if (ndeps == 1)
        cuGraphNodeGetType(deps[0], &type);
    int destroy = cuGraphDestroy(g);                  /* not while capturing into it */
    CUgraph out = NULL;
    int end = cuStreamEndCapture(s1, &out);
    printf("{\"destroy\": %d, \"begin\": %d, \"again\": %d, \"kernel\": %d, \"info\": %d, \"status\": %d, \"id\": %d, "
           "\"graph_same\": %d, \"deps\": %zu, \"type\": %d, \"end\": %d, \"nodes\": %zu, \"after\": %d, "
           "\"end_again\": %d}\n",
           destroy, begin, again, kernel, info, (int)st, id > 0, g == out, ndeps, (int)type, end, nodes(out), status(s1),
           cuStreamEndCapture(s1, &out));
}

/* ---- an illegal operation during a capture on s (blocking or not): its code, then what
 * the capture became and how ending it went ---- */
static CUevent ev_out, ev_in;
static void *host_buf;
static CUdeviceptr dbuf, spare;

static void callback(CUstream s, CUresult rc, void *arg) { (void)s, (void)rc, (void)arg; }
static void host_noop(void *arg) { (void)arg; }

static int illegal(const char *op, CUstream s)
{
    if (!strcmp(op, "stream_sync")) return cuStreamSynchronize(s);
    if (!strcmp(op, "stream_query")) return cuStreamQuery(s);
    if (!strcmp(op, "event_query")) return cuEventQuery(ev_in);
    if (!strcmp(op, "event_sync")) return cuEventSynchronize(ev_in);
    if (!strcmp(op, "ctx_sync")) return cuCtxSynchronize();
    if (!strcmp(op, "legacy_launch")) return launch(NULL, 10);
    if (!strcmp(op, "legacy_sync")) return cuStreamSynchronize(NULL);
    if (!strcmp(op, "legacy_record")) return cuEventRecord(ev_out, CU_STREAM_LEGACY);
    if (!strcmp(op, "sync_copy")) return cuMemcpyHtoD_v2(dbuf, host_buf, 64);
    if (!strcmp(op, "wait_uncaptured")) return cuStreamWaitEvent(s, ev_out, 0);
    if (!strcmp(op, "wait_external")) return cuStreamWaitEvent(s, ev_out, 1);
    if (!strcmp(op, "mem_alloc")) { CUdeviceptr p; return cuMemAlloc_v2(&p, 1 << 20); }
    if (!strcmp(op, "callback")) return cuStreamAddCallback(s, callback, NULL, 0);
    if (!strcmp(op, "host_fn")) return cuLaunchHostFunc(s, host_noop, NULL);
    if (!strcmp(op, "end_on_joined")) {
        CHECK(cuEventRecord(ev_in, s));
        CHECK(cuStreamWaitEvent(s2, ev_in, 0));
        return cuStreamEndCapture(s2, &(CUgraph){0});
    }
    if (!strcmp(op, "unjoined")) {       /* a fork never joined: ending reports it */
        CHECK(cuEventRecord(ev_in, s));
        CHECK(cuStreamWaitEvent(s2, ev_in, 0));
        CHECK(launch(s2, 10));
        return 0;
    }
    if (!strcmp(op, "legacy_is_capturing")) {
        CUstreamCaptureStatus st;
        return cuStreamIsCapturing(NULL, &st);
    }
    fprintf(stderr, "unknown op %s\n", op);
    exit(2);
}

static void rule(const char *op, const char *kind, const char *thread_mode)
{
    CUstream s = !strcmp(kind, "nonblocking") ? nb : s1;
    CUstreamCaptureMode m = !strcmp(thread_mode, "relaxed") ? CU_STREAM_CAPTURE_MODE_RELAXED
                                                            : CU_STREAM_CAPTURE_MODE_GLOBAL;
    CHECK(cuEventRecord(ev_out, s2));    /* recorded outside any capture */
    CHECK(cuStreamSynchronize(s2));
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(s, 10));
    CHECK(cuEventRecord(ev_in, s));      /* a captured event */
    CHECK(cuThreadExchangeStreamCaptureMode(&m));
    int rc = illegal(op, s);
    CHECK(cuThreadExchangeStreamCaptureMode(&m));
    int during = status(s);
    CUgraph g = (CUgraph)1;
    int end = cuStreamEndCapture(s, &g);
    printf("{\"rc\": %d, \"status\": %d, \"end\": %d, \"graph\": %d, \"after\": %d, \"s2_after\": %d}\n", rc, during,
           end, g == NULL ? 0 : g == (CUgraph)1 ? -1 : (int)nodes(g), status(s), status(s2));
}

/* ---- the potentially unsafe calls, from this thread or another, per interaction mode ---- */
struct caller { const char *call; CUstreamCaptureMode mode; int rc; };

static int unsafe_call(const char *call)
{
    static CUevent other_ev;
    if (!other_ev) {
        CHECK(cuEventCreate(&other_ev, 0));
        CHECK(cuEventRecord(other_ev, s2));
    }
    CUdeviceptr p;
    if (!strcmp(call, "mem_alloc")) {
        CUresult rc = cuMemAlloc_v2(&p, 1 << 20);
        if (rc == CUDA_SUCCESS)
            CHECK(cuMemFree_v2(p));
        return rc;
    }
    if (!strcmp(call, "mem_free")) return cuMemFree_v2(spare);
    if (!strcmp(call, "event_query")) { CUresult rc = cuEventQuery(other_ev); return rc == CUDA_ERROR_NOT_READY ? 0 : rc; }
    if (!strcmp(call, "event_sync")) return cuEventSynchronize(other_ev);
    if (!strcmp(call, "stream_query")) { CUresult rc = cuStreamQuery(s2); return rc == CUDA_ERROR_NOT_READY ? 0 : rc; }
    if (!strcmp(call, "stream_sync")) return cuStreamSynchronize(s2);
    if (!strcmp(call, "sync_copy")) return cuMemcpyHtoD_v2(dbuf, host_buf, 64);
    if (!strcmp(call, "sync_memset")) return cuMemsetD8_v2(dbuf, 1, 64);
    /* always legal */
    CUstreamCaptureStatus st;
    if (!strcmp(call, "is_capturing")) return cuStreamIsCapturing(nb, &st);
    if (!strcmp(call, "capture_info")) return cuStreamGetCaptureInfo_v3(nb, &st, NULL, NULL, NULL, NULL, NULL);
    if (!strcmp(call, "event_create")) {
        CUevent e;
        CUresult rc = cuEventCreate(&e, 0);
        return rc ? rc : cuEventDestroy_v2(e);
    }
    if (!strcmp(call, "event_record")) return cuEventRecord(other_ev, s2);
    if (!strcmp(call, "ctx_current")) { CUcontext c; return cuCtxGetCurrent(&c); }
    if (!strcmp(call, "graph_mem_attr")) { cuuint64_t v; return cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v); }
    if (!strcmp(call, "mem_get_info")) { size_t f, t; return cuMemGetInfo_v2(&f, &t); }
    fprintf(stderr, "unknown call %s\n", call);
    exit(2);
}

static void *caller_thread(void *arg)
{
    struct caller *c = arg;
    CHECK(cuCtxSetCurrent(ctx));
    CUstreamCaptureMode m = c->mode;
    CHECK(cuThreadExchangeStreamCaptureMode(&m));
    c->rc = unsafe_call(c->call);
    return NULL;
}

static CUstreamCaptureMode mode_of(const char *name)
{
    return !strcmp(name, "global") ? CU_STREAM_CAPTURE_MODE_GLOBAL
           : !strcmp(name, "thread_local") ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL : CU_STREAM_CAPTURE_MODE_RELAXED;
}

static void unsafe(const char *capture_mode, const char *where, const char *thread_mode, const char *call)
{
    /* a busy stream, so queries and waits have something to look at */
    CHECK(launch(s2, 20000));
    CHECK(cuStreamBeginCapture_v2(nb, mode_of(capture_mode)));  /* non-blocking: no legacy-stream rule */
    CHECK(launch(nb, 10));
    struct caller c = {call, mode_of(thread_mode), 0};
    if (!strcmp(where, "same")) {
        caller_thread(&c);
        CUstreamCaptureMode back = CU_STREAM_CAPTURE_MODE_GLOBAL;
        CHECK(cuThreadExchangeStreamCaptureMode(&back));
    } else {
        pthread_t t;
        pthread_create(&t, NULL, caller_thread, &c);
        pthread_join(t, NULL);
    }
    int during = status(nb);
    CUgraph g = NULL;
    int end = cuStreamEndCapture(nb, &g);
    printf("{\"rc\": %d, \"status\": %d, \"end\": %d}\n", c.rc, during, end);
}

/* ---- an executable graph takes the parameters of a graph of the same topology ---- */
static CUgraph capture_kernels(int n, uint64_t us, int memset_last)
{
    CUgraph g;
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < n; i++)
        CHECK(i == n - 1 && memset_last ? cuMemsetD8Async(dbuf, 0, 64, s1) : launch(s1, us));
    CHECK(cuStreamEndCapture(s1, &g));
    return g;
}

static double launch_ms(CUgraphExec e)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(cuGraphLaunch(e, s1));
    CHECK(cuStreamSynchronize(s1));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
}

static void exec_update(void)
{
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, capture_kernels(2, 10000, 0), 0));
    double before = launch_ms(e);
    CUgraphExecUpdateResultInfo info;
    int same = cuGraphExecUpdate_v2(e, capture_kernels(2, 50000, 0), &info);
    int same_result = info.result;
    double after = launch_ms(e);
    int more = cuGraphExecUpdate_v2(e, capture_kernels(3, 10000, 0), &info);
    int more_result = info.result;
    int type = cuGraphExecUpdate_v2(e, capture_kernels(2, 10000, 1), &info);
    int type_result = info.result;
    /* a capture whose dependency set is replaced: the next node depends on the first only */
    CUgraph g;
    CUstreamCaptureStatus st;
    const CUgraphNode *deps;
    size_t n = 0;
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(s1, 10));
    CHECK(cuStreamGetCaptureInfo_v2(s1, &st, NULL, NULL, &deps, &n));
    CUgraphNode first = deps[0];
    CHECK(launch(s1, 10));
    CHECK(cuStreamUpdateCaptureDependencies(s1, &first, 1, 1));
    CHECK(launch(s1, 10));
    CHECK(cuStreamEndCapture(s1, &g));
    CUgraphNode all[3], third_deps[2];
    size_t count = 3, ndeps = 2;
    CHECK(cuGraphGetNodes(g, all, &count));
    CHECK(cuGraphNodeGetDependencies(all[2], third_deps, &ndeps));
    printf("{\"before_ms\": %.0f, \"same\": [%d, %d], \"after_ms\": %.0f, \"more\": [%d, %d], \"type\": [%d, %d], "
           "\"third_deps\": %zu, \"on_first\": %d}\n", before, same, same_result, after, more, more_result, type,
           type_result, ndeps, ndeps == 1 && third_deps[0] == first);
}

/* ---- after an invalidation: what the dead capture still refuses ---- */
static void after_invalid(void)
{
    CUdeviceptr p;
    CHECK(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(nb, 10));
    CHECK(cuEventRecord(ev_in, nb));
    int first = cuMemAlloc_v2(&p, 1 << 20);
    int second = cuMemAlloc_v2(&p, 1 << 20);          /* nothing left to protect */
    int launch_rc = launch(nb, 10);                   /* the stream itself still refuses */
    int idle_wait = cuStreamWaitEvent(s2, ev_in, 0);   /* an idle stream waiting on its event */
    int s2_status = status(s2);
    CUgraph g;
    int end = cuStreamEndCapture(nb, &g);
    printf("{\"first\": %d, \"second\": %d, \"launch\": %d, \"idle_wait\": %d, \"s2\": %d, \"end\": %d}\n",
           first, second, launch_rc, idle_wait, s2_status, end);
}

/* ---- a capture ended from another thread ---- */
static void *end_elsewhere(void *arg)
{
    CHECK(cuCtxSetCurrent(ctx));
    CUgraph g = NULL;
    *(int *)arg = cuStreamEndCapture(s1, &g);
    return NULL;
}

static void wrong_thread(const char *mode)
{
    CHECK(cuStreamBeginCapture_v2(s1, mode_of(mode)));
    CHECK(launch(s1, 10));
    int other = -1;
    pthread_t t;
    pthread_create(&t, NULL, end_elsewhere, &other);
    pthread_join(t, NULL);
    int after = status(s1);
    CUgraph g = NULL;
    int end = after == CU_STREAM_CAPTURE_STATUS_NONE ? -1 : (int)cuStreamEndCapture(s1, &g);
    printf("{\"other\": %d, \"status\": %d, \"end\": %d}\n", other, after, end);
}

/* ---- fork and join across streams, and a merge of two captures ---- */
static void fork_join(void)
{
    CUevent e1, e2;
    CHECK(cuEventCreate(&e1, 0));
    CHECK(cuEventCreate(&e2, 0));
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(s1, 10));
    CHECK(cuEventRecord(e1, s1));
    int before = status(s2);
    CHECK(cuStreamWaitEvent(s2, e1, 0));               /* fork: s2 joins the capture */
    cuuint64_t id1 = 0, id2 = 0;
    CUstreamCaptureStatus st;
    CHECK(cuStreamGetCaptureInfo_v2(s1, &st, &id1, NULL, NULL, NULL));
    CHECK(cuStreamGetCaptureInfo_v2(s2, &st, &id2, NULL, NULL, NULL));
    CHECK(launch(s2, 10));
    CHECK(launch(s1, 10));
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&relaxed));
    int query = cuEventQuery(e1);                     /* captured: refused even when relaxed, invalidates */
    CHECK(cuThreadExchangeStreamCaptureMode(&relaxed));
    printf("{\"s2_before\": %d, \"s2_joined\": %d, \"same_id\": %d, \"query\": %d, ", before, (int)st, id1 == id2,
           query);
    CUgraph g = NULL;
    printf("\"end_invalid\": %d, ", cuStreamEndCapture(s1, &g));
    /* again, without the query, and joined back */
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(s1, 10));
    CHECK(cuEventRecord(e1, s1));
    CHECK(cuStreamWaitEvent(s2, e1, 0));
    CHECK(launch(s2, 10));
    CHECK(launch(s1, 10));
    CHECK(cuEventRecord(e2, s2));
    CHECK(cuStreamWaitEvent(s1, e2, 0));              /* join */
    CHECK(launch(s1, 10));
    const CUgraphNode *deps;
    size_t ndeps = 0;
    CHECK(cuStreamGetCaptureInfo_v2(s1, &st, NULL, NULL, &deps, &ndeps));
    CHECK(cuStreamEndCapture(s1, &g));
    CUgraphNode all[8];
    size_t n = 8, last_deps = 0;
    CHECK(cuGraphGetNodes(g, all, &n));
    CHECK(cuGraphNodeGetDependencies(all[n - 1], NULL, &last_deps));
    printf("\"nodes\": %zu, \"last_deps\": %zu, \"deps_before_last\": %zu, \"s2_after\": %d, ", n, last_deps, ndeps,
           status(s2));
    /* merge: s2 captures on its own and waits for an event of s1's capture */
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuStreamBeginCapture_v2(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(s1, 10));
    CHECK(cuEventRecord(e1, s1));
    int merge = cuStreamWaitEvent(s2, e1, 0);
    int st1 = status(s1), st2 = status(s2);
    CUgraph g1 = NULL, g2 = NULL;
    int end1 = cuStreamEndCapture(s1, &g1), end2 = cuStreamEndCapture(s2, &g2);
    printf("\"merge\": %d, \"merged_status\": [%d, %d], \"merged_end\": [%d, %d]}\n", merge, st1, st2, end1, end2);
}

/* ---- every node kind capture makes, and a replay that runs them ---- */
static int host_runs;
static void host_fn(void *arg) { (void)arg; host_runs++; }

static void node_kinds(void)
{
    CUevent er, ew;
    CHECK(cuEventCreate(&er, 0));
    CHECK(cuEventCreate(&ew, 0));
    CHECK(cuEventRecord(ew, s2));
    /* a graph to launch inside the capture: one kernel */
    CUgraph inner;
    CUgraphExec inner_exec;
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(s1, 10));
    CHECK(cuStreamEndCapture(s1, &inner));
    CHECK(cuGraphInstantiateWithFlags(&inner_exec, inner, 0));
    unsigned value = 0x5a5a5a5a, back = 0;
    CUdeviceptr a;
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(s1, 10));
    CHECK(cuMemsetD8Async(dbuf, 0, 64, s1));
    CHECK(cuMemcpyHtoDAsync_v2(dbuf, &value, sizeof value, s1));
    CHECK(cuLaunchHostFunc(s1, host_fn, NULL));
    CHECK(cuEventRecordWithFlags(er, s1, 1));         /* external: an event record node */
    CHECK(cuStreamWaitEvent(s1, ew, 1));              /* external: an event wait node */
    CHECK(cuGraphLaunch(inner_exec, s1));              /* a child graph node */
    CHECK(cuMemAllocAsync(&a, 4 << 20, s1));
    CHECK(cuMemcpyDtoDAsync_v2(a, dbuf, 4, s1));
    CHECK(cuMemcpyDtoHAsync_v2(&back, a, sizeof back, s1));
    CHECK(cuMemFreeAsync(a, s1));
    CUgraph g;
    CHECK(cuStreamEndCapture(s1, &g));
    CUgraphNode all[16];
    size_t n = 16;
    CHECK(cuGraphGetNodes(g, all, &n));
    printf("{\"types\": [");
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        CHECK(cuGraphNodeGetType(all[i], &t));
        printf("%s%d", i ? ", " : "", (int)t);
    }
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    CUdeviceptr freed = 0;
    CHECK(cuGraphMemAllocNodeGetParams(all[7], &ap));
    CHECK(cuGraphMemFreeNodeGetParams(all[10], &freed));
    CUgraph child;
    CHECK(cuGraphChildGraphNodeGetGraph(all[6], &child));
    int host_before = host_runs;
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    CHECK(cuGraphLaunch(e, s1));
    CHECK(cuStreamSynchronize(s1));
    printf("], \"alloc_addr\": %d, \"alloc_size\": %zu, \"free_addr\": %d, \"child_nodes\": %zu, \"host_before\": %d, "
           "\"host_after\": %d, \"copied\": %d}\n",
           ap.dptr == a, ap.bytesize, freed == a, nodes(child), host_before, host_runs, back == value);
}

/* ---- graph memory: taken at upload or first launch, kept, trimmed; out of memory ---- */
static CUgraph capture_alloc(size_t bytes, int free_in_graph, CUdeviceptr *addr)
{
    CUgraph g;
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemAllocAsync(addr, bytes, s1));
    CHECK(launch(s1, 10));
    if (free_in_graph)
        CHECK(cuMemFreeAsync(*addr, s1));
    CHECK(cuStreamEndCapture(s1, &g));
    return g;
}

#define ATTRS() attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) / MIB, attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) / MIB
#define STEP(name) printf("\"%s\": [%llu, %llu, %llu], ", name, ATTRS(), (free0 - mem_free()) / MIB)

static void graph_memory(void)
{
    unsigned long long free0 = mem_free();
    CUdeviceptr a, b;
    CUgraph g = capture_alloc(60 * MIB, 1, &a);       /* 60 MiB: 30 pages of 2 MiB */
    printf("{");
    STEP("captured");
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    STEP("instantiated");
    printf("\"second_instantiate\": %d, ", cuGraphInstantiateWithFlags(&(CUgraphExec){0}, g, 0));
    CHECK(cuGraphUpload(e, s1));
    STEP("uploaded");
    CHECK(cuGraphLaunch(e, s1));
    CHECK(cuGraphLaunch(e, s1));
    CHECK(cuStreamSynchronize(s1));
    STEP("launched");
    CHECK(cuDeviceGraphMemTrim(0));
    STEP("trimmed");
    CHECK(cuGraphLaunch(e, s1));                      /* the first launch after a trim maps again */
    CHECK(cuStreamSynchronize(s1));
    STEP("relaunched");
    /* an allocation the graph does not free */
    CUgraph g2 = capture_alloc(10 * MIB, 0, &b);
    CUgraphExec e2;
    CHECK(cuGraphInstantiateWithFlags(&e2, g2, 0));
    CHECK(cuGraphLaunch(e2, s1));
    CHECK(cuStreamSynchronize(s1));
    STEP("unfreed");
    printf("\"relaunch_unfreed\": %d, ", cuGraphLaunch(e2, s1));
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuDeviceGraphMemTrim(0));
    STEP("trim_live");                                /* e's memory goes; b lives on */
    CHECK(cuMemcpyHtoD_v2(b, "abc", 4));              /* still usable after the launch */
    CHECK(cuGraphExecDestroy(e2));
    CHECK(cuMemFreeAsync(b, s1));
    printf("\"free_again\": %d, ", cuMemFree_v2(b));
    CHECK(cuStreamSynchronize(s1));
    STEP("freed");
    CHECK(cuDeviceGraphMemTrim(0));
    STEP("trim_all");
    cuuint64_t zero = 0;
    unsigned long long used_high = attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) / MIB,
                       reserved_high = attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) / MIB;
    CHECK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
    CHECK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero));
    cuuint64_t one = 1;
    printf("\"highs\": [%llu, %llu], \"reset\": [%llu, %llu], \"set_current\": %d, ", used_high, reserved_high,
           attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH),
           cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &one));
    /* auto-free on launch: a relaunch frees what the last one left */
    CUdeviceptr c;
    CUgraph g3 = capture_alloc(4 * MIB, 0, &c);
    CUgraphExec e3;
    CHECK(cuGraphInstantiateWithFlags(&e3, g3, 1));
    CHECK(cuGraphLaunch(e3, s1));
    printf("\"auto_free_relaunch\": %d, ", cuGraphLaunch(e3, s1));
    CHECK(cuStreamSynchronize(s1));
    STEP("auto_free");
    /* by hand: an allocation node and a free node, and the upload flag of instantiation */
    CUgraph h;
    CHECK(cuGraphCreate(&h, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS p = {0};
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = 3 * MIB;
    CUgraphNode an, fn;
    CHECK(cuGraphAddMemAllocNode(&an, h, NULL, 0, &p));
    CHECK(cuGraphAddMemFreeNode(&fn, h, &an, 1, p.dptr));
    printf("\"free_twice\": %d, ", cuGraphAddMemFreeNode(&(CUgraphNode){0}, h, &fn, 1, p.dptr));
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {.flags = 2, .hUploadStream = s1};
    CUgraphExec eh;
    CHECK(cuGraphInstantiateWithParams(&eh, h, &ip));
    STEP("upload_flag");
    printf("\"result\": %d}\n", (int)ip.result_out);
}

static void graph_oom(void)
{
    unsigned long long free0 = mem_free();
    CUdeviceptr a;
    CUgraph g = capture_alloc(free0 + 2 * MIB, 1, &a);  /* more than the card has left */
    CUgraphExec e;
    printf("{");
    printf("\"instantiate\": %d, ", cuGraphInstantiateWithFlags(&e, g, 0));
    printf("\"upload\": %d, ", cuGraphUpload(e, s1));
    STEP("after_upload");
    printf("\"launch\": %d, ", cuGraphLaunch(e, s1));
    STEP("after_launch");
    CUgraph small = capture_alloc(free0 - 4 * MIB, 1, &a);
    CUgraphExec es;
    CHECK(cuGraphInstantiateWithFlags(&es, small, 0));
    printf("\"fits\": %d, ", cuGraphLaunch(es, s1));
    CHECK(cuStreamSynchronize(s1));
    STEP("fitted");
    CUdeviceptr p;
    printf("\"plain_alloc\": %d}\n", cuMemAlloc_v2(&p, 8 * MIB));
}

/* ---- replays book their kernels' time: three 200 ms kernels a launch ---- */
static void replay_time(void)
{
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = nvml ? (int (*)(void))dlsym(nvml, "nvmlInit_v2") : NULL;
    int (*handle)(unsigned, void **) = nvml ? (int (*)(unsigned, void **))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    int (*util)(void *, unsigned *) = nvml ? (int (*)(void *, unsigned *))dlsym(nvml, "nvmlDeviceGetUtilizationRates") : NULL;
    void *dev = NULL;
    if (!init || init() || handle(0, &dev))
        exit(3);
    CUgraph g;
    CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < 3; i++)
        CHECK(launch(s1, 200000));
    CHECK(cuStreamEndCapture(s1, &g));
    unsigned rates[2];
    util(dev, rates);
    unsigned idle = rates[0];
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(cuGraphLaunch(e, s1));
    CHECK(cuStreamSynchronize(s1));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    util(dev, rates);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("{\"idle_util\": %u, \"util\": %u, \"ms\": %.0f}\n", idle, rates[0], ms);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "any image"));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    CHECK(cuStreamCreate(&s1, 0));
    CHECK(cuStreamCreate(&s2, 0));
    CHECK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&ev_out, 0));
    CHECK(cuEventCreate(&ev_in, 0));
    CHECK(cuMemAlloc_v2(&dbuf, 64));
    CHECK(cuMemAlloc_v2(&spare, 64));
    host_buf = calloc(1, 64);
    const char *a = argv[1];
    if (!strcmp(a, "mode") && argc == 3) modes(argv[2]);
    else if (!strcmp(a, "rule") && argc == 5) rule(argv[2], argv[3], argv[4]);
    else if (!strcmp(a, "unsafe") && argc == 6) unsafe(argv[2], argv[3], argv[4], argv[5]);
    else if (!strcmp(a, "wrong_thread") && argc == 3) wrong_thread(argv[2]);
    else if (!strcmp(a, "fork_join")) fork_join();
    else if (!strcmp(a, "after_invalid")) after_invalid();
    else if (!strcmp(a, "exec_update")) exec_update();
    else if (!strcmp(a, "node_kinds")) node_kinds();
    else if (!strcmp(a, "graph_memory")) graph_memory();
    else if (!strcmp(a, "graph_oom")) graph_oom();
    else if (!strcmp(a, "replay_time")) replay_time();
    else return 2;
    return 0;
}
