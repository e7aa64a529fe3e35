/*
 * vgpu_probe: drives the driver API the way programs do, for libvgpu's tests.
 *
 *   vgpu_probe MODE COMMAND [ARGS...]
 *
 * MODE picks how entry points are reached:
 *   link       direct calls to the linked libcuda (what LD_PRELOAD must win)
 *   dlsym      dlopen("libcuda.so.1") + dlsym on that handle (as libcudart did)
 *   proc       dlopen + cuGetProcAddress_v2 with base names (as libcudart 12 does)
 *   proc_ptsz  the same with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * COMMAND:
 *   info                 prints total (cuDeviceTotalMem), memtotal/free (cuMemGetInfo)
 *   ctx                  prints the bytes a primary context takes (NVML free before/after)
 *   alloc KIND BYTES     one allocation; prints rc=N
 *   max KIND             largest allocation that succeeds (bisection); prints max=N
 *   hold KIND BYTES SEC  allocates, prints "held rc=N", waits SEC or for the end of
 *                        stdin, frees
 *   churn KIND BYTES SEC holds BYTES and allocates and frees 2 MiB blocks meanwhile;
 *                        prints "ready" once it holds BYTES
 *   stress THREADS SEC MAXMIB [START]  threads allocate and free random sizes, from
 *                        the CLOCK_REALTIME second START on
 *   watch SEC            samples NVML device 0 used bytes (no context); prints maxused=N
 *   launch N [SEC]       N zero-length kernel launches; prints rc=N, then waits as
 *                        hold does (SEC, or the end of stdin) before it exits
 *   uuids                the devices' UUIDs, one a line
 *   badfree              frees a pointer never allocated; prints rc=N
 *   nullsafe             cuMemGetInfo / cuDeviceTotalMem with NULL outputs; prints rcs
 *   bypass LIB B1 B2     allocates B1 through LIB loaded with RTLD_DEEPBIND (past the
 *                        hooks), then B2 through the hooks; prints hidden_rc, rc
 *   rtldnext             checks dlsym(RTLD_NEXT) through libvgpu's dlsym; prints same=1
 *   pooldestroy FREE BYTES BIG  two BYTES allocations from a new pool, the pool
 *                        destroyed, then cuMemAlloc(BIG) tried at each step; FREE:
 *                        before (both freed before the destroy), async, sync (freed
 *                        one by one after it); prints destroy_rc during_rc mid_rc
 *                        after_rc (mid: one of two freed)
 *   vmmrelease WHEN BYTES BIG  a VMM handle of BYTES mapped, released while still
 *                        mapped (WHEN=mapped) or after the unmap (unmapped), then
 *                        cuMemAlloc(BIG) tried before and after the unmap; prints
 *                        release_rc during_rc after_rc
 *   ctxdestroy BYTES BIG a created context gets BYTES stream-ordered (default pool)
 *                        and BYTES plain, and is destroyed with both live; then
 *                        cuMemAlloc(BIG) in the primary context, before and after
 *                        the stream-ordered block (which outlives its context) is
 *                        freed; prints destroy_rc during_rc after_rc
 * KIND: mem pitch managed async pool vmm array array3d
 *   ctxview              prints getinfo_used (cuMemGetInfo total - free) and
 *                        nvml_used (NVML device 0) once the context is open
 * Env PROBE_CTX=create (create_v3, create_v4) uses cuCtxCreate_v2 (_v3, _v4) instead
 * of the primary context;
 * PROBE_DEVICE=N works on CUDA device N (default 0).
 * Exit 77 when the driver lacks an entry point the command needs.
 */
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "nvml_api.h"

/* (exported name, base name for cuGetProcAddress) */
#define PROBE_API(X) \
    X(cuInit, cuInit) \
    X(cuDeviceGet, cuDeviceGet) \
    X(cuDeviceGetCount, cuDeviceGetCount) \
    X(cuDeviceGetUuid_v2, cuDeviceGetUuid) \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease) \
    X(cuCtxSetCurrent, cuCtxSetCurrent) \
    X(cuCtxCreate_v2, cuCtxCreate) \
    X(cuCtxCreate_v3, cuCtxCreate) \
    X(cuCtxCreate_v4, cuCtxCreate) \
    X(cuCtxDestroy_v2, cuCtxDestroy) \
    X(cuCtxSynchronize, cuCtxSynchronize) \
    X(cuMemGetInfo_v2, cuMemGetInfo) \
    X(cuMemAlloc_v2, cuMemAlloc) \
    X(cuMemFree_v2, cuMemFree) \
    X(cuMemAllocPitch_v2, cuMemAllocPitch) \
    X(cuMemAllocManaged, cuMemAllocManaged) \
    X(cuMemAllocAsync, cuMemAllocAsync) \
    X(cuMemFreeAsync, cuMemFreeAsync) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync) \
    X(cuMemPoolCreate, cuMemPoolCreate) \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo) \
    X(cuMemPoolDestroy, cuMemPoolDestroy) \
    X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool) \
    X(cuStreamSynchronize, cuStreamSynchronize) \
    X(cuMemCreate, cuMemCreate) \
    X(cuMemRelease, cuMemRelease) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity) \
    X(cuMemAddressReserve, cuMemAddressReserve) \
    X(cuMemAddressFree, cuMemAddressFree) \
    X(cuMemMap, cuMemMap) \
    X(cuMemUnmap, cuMemUnmap) \
    X(cuArrayCreate_v2, cuArrayCreate) \
    X(cuArray3DCreate_v2, cuArray3DCreate) \
    X(cuArrayDestroy, cuArrayDestroy) \
    X(cuModuleLoadData, cuModuleLoadData) \
    X(cuModuleGetFunction, cuModuleGetFunction) \
    X(cuLaunchKernel, cuLaunchKernel)

/* Weak, so that one binary runs on a driver lacking some of them. */
#define PROBE_WEAK(name, base) extern __typeof__(name) name __attribute__((weak));
PROBE_API(PROBE_WEAK)

static struct {
#define PROBE_FIELD(name, base) __typeof__(&name) name;
    PROBE_API(PROBE_FIELD)
} api;

static CUdevice device;
static CUcontext context;
static CUmemoryPool own_pool;
static size_t vmm_granularity = 2u << 20;

#define NEED(fn)                                                         \
    do {                                                                 \
        if (!api.fn) {                                                   \
            printf("missing %s\n", #fn);                                 \
            fflush(stdout);                                              \
            exit(77);                                                    \
        }                                                                \
    } while (0)

#define CHECK(call)                                                      \
    do {                                                                 \
        CUresult rc_ = (call);                                           \
        if (rc_ == CUDA_ERROR_NOT_FOUND) {                               \
            printf("missing (driver) %s\n", #call);                      \
            exit(77);                                                    \
        }                                                                \
        if (rc_ != CUDA_SUCCESS) {                                       \
            printf("error %s rc=%d\n", #call, (int)rc_);                 \
            fflush(stdout);                                              \
            exit(3);                                                     \
        }                                                                \
    } while (0)

static void resolve(const char *mode)
{
    if (!strcmp(mode, "link")) {
#define PROBE_LINK(name, base) api.name = name;
        PROBE_API(PROBE_LINK)
        return;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("error dlopen %s\n", dlerror());
        exit(3);
    }
    if (!strcmp(mode, "dlsym")) {
#define PROBE_DLSYM(name, base) api.name = (__typeof__(&name))dlsym(lib, #name);
        PROBE_API(PROBE_DLSYM)
        return;
    }
    cuuint64_t flags = !strcmp(mode, "proc_ptsz") ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                                  : CU_GET_PROC_ADDRESS_DEFAULT;
    __typeof__(&cuGetProcAddress_v2) gpa = (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) {
        printf("missing cuGetProcAddress_v2\n");
        exit(77);
    }
#define PROBE_PROC_AT(name, base, version)                                           \
    {                                                                               \
        void *fn = NULL;                                                            \
        CUdriverProcAddressQueryResult status;                                      \
        if (gpa(#base, &fn, version, flags, &status) == CUDA_SUCCESS)               \
            api.name = (__typeof__(&name))fn;                                       \
    }
#define PROBE_PROC(name, base) PROBE_PROC_AT(name, base, 12040)
    PROBE_API(PROBE_PROC)
    /* one base name, three variants: each asked for with the version that picks it */
    PROBE_PROC_AT(cuCtxCreate_v2, cuCtxCreate, 3020)
    PROBE_PROC_AT(cuCtxCreate_v3, cuCtxCreate, 11040)
    PROBE_PROC_AT(cuCtxCreate_v4, cuCtxCreate, 12050)
}

static void open_context(void)
{
    NEED(cuInit);
    NEED(cuDeviceGet);
    CHECK(api.cuInit(0));
    const char *ordinal = getenv("PROBE_DEVICE");
    CHECK(api.cuDeviceGet(&device, ordinal ? atoi(ordinal) : 0));
    const char *how = getenv("PROBE_CTX");
    if (how && !strcmp(how, "create")) {
        NEED(cuCtxCreate_v2);
        CHECK(api.cuCtxCreate_v2(&context, 0, device));
    } else if (how && !strcmp(how, "create_v3")) {
        NEED(cuCtxCreate_v3);
        CHECK(api.cuCtxCreate_v3(&context, NULL, 0, 0, device));
    } else if (how && !strcmp(how, "create_v4")) {
        NEED(cuCtxCreate_v4);
        CHECK(api.cuCtxCreate_v4(&context, NULL, 0, device));
    } else {
        NEED(cuDevicePrimaryCtxRetain);
        NEED(cuCtxSetCurrent);
        CHECK(api.cuDevicePrimaryCtxRetain(&context, device));
        CHECK(api.cuCtxSetCurrent(context));
    }
}

/* ---- one allocation of each kind ---- */

struct block {
    CUdeviceptr ptr;
    CUarray array;
    CUmemGenericAllocationHandle handle;
};

static void need_kind(const char *kind)
{
    if (!strcmp(kind, "mem")) { NEED(cuMemAlloc_v2); NEED(cuMemFree_v2); }
    else if (!strcmp(kind, "pitch")) { NEED(cuMemAllocPitch_v2); NEED(cuMemFree_v2); }
    else if (!strcmp(kind, "managed")) { NEED(cuMemAllocManaged); NEED(cuMemFree_v2); }
    else if (!strcmp(kind, "async")) {
        NEED(cuMemAllocAsync); NEED(cuMemFreeAsync); NEED(cuStreamSynchronize);
        NEED(cuMemPoolTrimTo); NEED(cuDeviceGetDefaultMemPool);
    } else if (!strcmp(kind, "pool")) {
        NEED(cuMemAllocFromPoolAsync); NEED(cuMemFreeAsync); NEED(cuStreamSynchronize);
        NEED(cuMemPoolTrimTo); NEED(cuMemPoolCreate);
    } else if (!strcmp(kind, "vmm")) { NEED(cuMemCreate); NEED(cuMemRelease); NEED(cuMemGetAllocationGranularity); }
    else if (!strcmp(kind, "array")) { NEED(cuArrayCreate_v2); NEED(cuArrayDestroy); }
    else if (!strcmp(kind, "array3d")) { NEED(cuArray3DCreate_v2); NEED(cuArrayDestroy); }
    else { printf("unknown kind %s\n", kind); exit(2); }
}

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

static void prepare_kind(const char *kind)
{
    need_kind(kind);
    if (!strcmp(kind, "pool")) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = device;
        CHECK(api.cuMemPoolCreate(&own_pool, &props));
    } else if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop = vmm_prop();
        CHECK(api.cuMemGetAllocationGranularity(&vmm_granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    }
}

#define ARRAY_ROW (8192ull * 16)   /* 8192 elements of 4 x float */

static CUresult take_raw(const char *kind, size_t bytes, struct block *b)
{
    memset(b, 0, sizeof *b);
    if (!strcmp(kind, "mem"))
        return api.cuMemAlloc_v2(&b->ptr, bytes);
    if (!strcmp(kind, "managed"))
        return api.cuMemAllocManaged(&b->ptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (!strcmp(kind, "pitch")) {
        size_t pitch, height = 64, width = bytes / height;
        return api.cuMemAllocPitch_v2(&b->ptr, &pitch, width ? width : 1, height, 4);
    }
    if (!strcmp(kind, "async"))
        return api.cuMemAllocAsync(&b->ptr, bytes, NULL);
    if (!strcmp(kind, "pool"))
        return api.cuMemAllocFromPoolAsync(&b->ptr, bytes, own_pool, NULL);
    if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop = vmm_prop();
        size_t size = (bytes + vmm_granularity - 1) / vmm_granularity * vmm_granularity;
        return api.cuMemCreate(&b->handle, size ? size : vmm_granularity, &prop, 0);
    }
    if (!strcmp(kind, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 8192, .Height = bytes / ARRAY_ROW ? bytes / ARRAY_ROW : 1,
                                   .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
        return api.cuArrayCreate_v2(&b->array, &d);
    }
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 8192, .Height = 16,
                                 .Depth = bytes / (ARRAY_ROW * 16) ? bytes / (ARRAY_ROW * 16) : 1,
                                 .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    return api.cuArray3DCreate_v2(&b->array, &d);
}

static CUresult take(const char *kind, size_t bytes, struct block *b)
{
    CUresult rc = take_raw(kind, bytes, b);
    if (rc == CUDA_ERROR_NOT_FOUND) {
        printf("missing (driver) %s allocation\n", kind);
        exit(77);
    }
    return rc;
}

static CUresult give(const char *kind, struct block *b)
{
    if (!strcmp(kind, "async") || !strcmp(kind, "pool")) {
        CUmemoryPool pool = own_pool;
        CUresult rc = api.cuMemFreeAsync(b->ptr, NULL);
        api.cuStreamSynchronize(NULL);
        if (!strcmp(kind, "async"))
            api.cuDeviceGetDefaultMemPool(&pool, device);
        api.cuMemPoolTrimTo(pool, 0);
        return rc;
    }
    if (!strcmp(kind, "vmm"))
        return api.cuMemRelease(b->handle);
    if (!strcmp(kind, "array") || !strcmp(kind, "array3d"))
        return api.cuArrayDestroy(b->array);
    return api.cuMemFree_v2(b->ptr);
}

/* ---- NVML without a context ---- */

static unsigned long long nvml_device0(int field)   /* 0 free, 1 used, 2 total */
{
    static void *lib;
    static nvmlDevice_t dev;
    if (!lib) {
        lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        nvmlReturn_t (*init)(void) = lib ? (nvmlReturn_t(*)(void))dlsym(lib, "nvmlInit_v2") : NULL;
        nvmlReturn_t (*get)(unsigned int, nvmlDevice_t *) =
            lib ? (nvmlReturn_t(*)(unsigned int, nvmlDevice_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;
        if (!init || !get || init() != NVML_SUCCESS || get(0, &dev) != NVML_SUCCESS) {
            printf("error nvml\n");
            exit(3);
        }
    }
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    nvmlMemory_t m;
    if (!info || info(dev, &m) != NVML_SUCCESS) {
        printf("error nvml memory\n");
        exit(3);
    }
    return field == 0 ? m.free : field == 1 ? m.used : m.total;
}

/* ---- commands ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmd_max(const char *kind)
{
    size_t total = 0;
    NEED(cuDeviceTotalMem_v2);
    CHECK(api.cuDeviceTotalMem_v2(&total, device));
    size_t lo = 0, hi = 2 * total + (64u << 20);
    const size_t step = 64u << 10;
    while (hi - lo > step) {
        size_t mid = lo + (hi - lo) / 2;
        struct block b;
        CUresult rc = take(kind, mid, &b);
        if (rc == CUDA_SUCCESS) {
            CHECK(give(kind, &b));
            lo = mid;
        } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            hi = mid;
        } else {
            printf("error rc=%d at %zu\n", (int)rc, mid);
            return 3;
        }
    }
    /* one byte past what succeeded must be refused with OUT_OF_MEMORY */
    struct block b;
    CUresult over = take(kind, hi, &b);
    if (over == CUDA_SUCCESS)
        give(kind, &b);
    printf("max=%zu over_rc=%d\n", lo, (int)over);
    return 0;
}

struct stress_arg {
    double until;
    size_t max_bytes;
    unsigned seed;
    long ok, refused, errors;
};

static double start_at;   /* CLOCK_REALTIME seconds: every process starts its load together */

static void *stress_thread(void *p)
{
    struct stress_arg *a = p;
    CHECK(api.cuCtxSetCurrent(context));
    struct timespec ts;
    do {
        clock_gettime(CLOCK_REALTIME, &ts);
        if ((double)ts.tv_sec + (double)ts.tv_nsec / 1e9 >= start_at)
            break;
        usleep(1000);
    } while (1);
    a->until = now_s() + a->until;
    CUdeviceptr held[8] = {0};
    while (now_s() < a->until) {
        int i = (int)(rand_r(&a->seed) % 8);
        if (held[i]) {
            CHECK(api.cuMemFree_v2(held[i]));
            held[i] = 0;
        } else {
            size_t bytes = 1 + (size_t)rand_r(&a->seed) % a->max_bytes;
            CUresult rc = api.cuMemAlloc_v2(&held[i], bytes);
            if (rc == CUDA_SUCCESS) a->ok++;
            else if (rc == CUDA_ERROR_OUT_OF_MEMORY) { a->refused++; held[i] = 0; }
            else { a->errors++; held[i] = 0; }
        }
    }
    for (int i = 0; i < 8; i++)
        if (held[i])
            api.cuMemFree_v2(held[i]);
    return NULL;
}

static int cmd_stress(int threads, double seconds, size_t max_mib)
{
    NEED(cuMemAlloc_v2);
    NEED(cuMemFree_v2);
    pthread_t tid[64];
    struct stress_arg args[64];
    if (threads > 64)
        threads = 64;
    for (int i = 0; i < threads; i++) {
        args[i] = (struct stress_arg){.until = seconds, .max_bytes = max_mib << 20,
                                      .seed = (unsigned)(getpid() * 131 + i)};
        pthread_create(&tid[i], NULL, stress_thread, &args[i]);
    }
    long ok = 0, refused = 0, errors = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        ok += args[i].ok;
        refused += args[i].refused;
        errors += args[i].errors;
    }
    printf("ok=%ld refused=%ld errors=%ld\n", ok, refused, errors);
    return errors ? 1 : 0;
}

/* cuMemAlloc(bytes) and free: the rc of the allocation. */
static int try_plain(size_t bytes)
{
    CUdeviceptr p;
    CUresult rc = api.cuMemAlloc_v2(&p, bytes);
    if (rc == CUDA_SUCCESS)
        CHECK(api.cuMemFree_v2(p));
    return (int)rc;
}

static void free_pooled(const char *how, CUdeviceptr p)
{
    CHECK(!strcmp(how, "sync") ? api.cuMemFree_v2(p) : api.cuMemFreeAsync(p, NULL));
    CHECK(api.cuStreamSynchronize(NULL));
}

static int cmd_pooldestroy(const char *how, size_t bytes, size_t big)
{
    need_kind("pool");
    need_kind("mem");
    NEED(cuMemPoolDestroy);
    prepare_kind("pool");
    CUdeviceptr first, second;
    CHECK(api.cuMemAllocFromPoolAsync(&first, bytes, own_pool, NULL));
    CHECK(api.cuMemAllocFromPoolAsync(&second, bytes, own_pool, NULL));
    int before = !strcmp(how, "before");
    if (before) {
        free_pooled("async", first);
        free_pooled("async", second);
    }
    int destroy_rc = (int)api.cuMemPoolDestroy(own_pool);
    int during_rc = try_plain(big), mid_rc = -1;
    if (!before) {
        free_pooled(how, first);
        mid_rc = try_plain(big);
        free_pooled(how, second);
    }
    printf("destroy_rc=%d during_rc=%d mid_rc=%d after_rc=%d\n", destroy_rc, during_rc, mid_rc,
           try_plain(big));
    return 0;
}

static int cmd_vmmrelease(const char *when, size_t bytes, size_t big)
{
    need_kind("vmm");
    need_kind("mem");
    NEED(cuMemAddressReserve);
    NEED(cuMemAddressFree);
    NEED(cuMemMap);
    NEED(cuMemUnmap);
    prepare_kind("vmm");
    struct block b;
    CHECK(take("vmm", bytes, &b));
    size_t size = (bytes + vmm_granularity - 1) / vmm_granularity * vmm_granularity;
    CUdeviceptr va;
    CHECK(api.cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(api.cuMemMap(va, size, 0, b.handle, 0));
    int mapped = !strcmp(when, "mapped");
    if (!mapped)
        CHECK(api.cuMemUnmap(va, size));
    int release_rc = (int)api.cuMemRelease(b.handle);
    int during_rc = try_plain(big);
    if (mapped)
        CHECK(api.cuMemUnmap(va, size));
    CHECK(api.cuMemAddressFree(va, size));
    printf("release_rc=%d during_rc=%d after_rc=%d\n", release_rc, during_rc, try_plain(big));
    return 0;
}

static int cmd_ctxdestroy(size_t bytes, size_t big)
{
    need_kind("async");
    need_kind("mem");
    NEED(cuCtxCreate_v2);
    NEED(cuCtxDestroy_v2);
    CUcontext created;
    CUdeviceptr pooled, plain;
    CHECK(api.cuCtxCreate_v2(&created, 0, device));
    CHECK(api.cuMemAllocAsync(&pooled, bytes, NULL));
    CHECK(api.cuMemAlloc_v2(&plain, bytes));
    int destroy_rc = (int)api.cuCtxDestroy_v2(created);
    CHECK(api.cuCtxSetCurrent(context));
    int during_rc = try_plain(big);
    free_pooled("async", pooled);
    printf("destroy_rc=%d during_rc=%d after_rc=%d\n", destroy_rc, during_rc, try_plain(big));
    return 0;
}

/* Until `seconds` have passed or stdin reaches end of file (the test lets go). */
static void wait_for_release(double seconds)
{
    double until = now_s() + seconds;
    struct pollfd in = {.fd = 0, .events = POLLIN};
    while (now_s() < until) {
        char buf[64];
        if (poll(&in, 1, 10) > 0 && read(0, buf, sizeof buf) <= 0)
            break;
    }
}

static int cmd_launch(long count, double hold)
{
    NEED(cuModuleLoadData);
    NEED(cuModuleGetFunction);
    NEED(cuLaunchKernel);
    CUmodule mod;
    CUfunction fn;
    CHECK(api.cuModuleLoadData(&mod, "probe"));
    CHECK(api.cuModuleGetFunction(&fn, mod, "sleep_kernel"));
    uint64_t duration_us = 0;
    void *params[] = {&duration_us};
    CUresult rc = CUDA_SUCCESS;
    for (long i = 0; i < count && rc == CUDA_SUCCESS; i++)
        rc = api.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    if (api.cuCtxSynchronize)
        api.cuCtxSynchronize();
    printf("rc=%d\n", (int)rc);
    wait_for_release(hold);
    return rc == CUDA_SUCCESS ? 0 : 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: vgpu_probe MODE COMMAND [ARGS...]\n");
        return 2;
    }
    const char *cmd = argv[2];
    if (!strcmp(cmd, "watch") && argc > 3) {
        double until = now_s() + atof(argv[3]);
        unsigned long long max_used = 0;
        while (now_s() < until) {
            unsigned long long used = nvml_device0(1);
            if (used > max_used)
                max_used = used;
            usleep(2000);
        }
        printf("maxused=%llu\n", max_used);
        return 0;
    }
    if (!strcmp(cmd, "rtldnext")) {
        /* dlsym(RTLD_NEXT) from here must find what follows this program, not libvgpu's view */
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        void *next = dlsym(RTLD_NEXT, "malloc");
        void *direct = libc ? dlsym(libc, "malloc") : NULL;
        printf("same=%d\n", next && next == direct);
        return 0;
    }
    resolve(argv[1]);
    if (!strcmp(cmd, "uuids")) {
        int count = 0;
        NEED(cuInit);
        NEED(cuDeviceGetCount);
        NEED(cuDeviceGetUuid_v2);
        CHECK(api.cuInit(0));
        CHECK(api.cuDeviceGetCount(&count));
        for (int i = 0; i < count; i++) {
            CUuuid id;
            CUdevice dev;
            CHECK(api.cuDeviceGet(&dev, i));
            CHECK(api.cuDeviceGetUuid_v2(&id, dev));
            const unsigned char *b = (const unsigned char *)id.bytes;
            printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
                   b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                   b[12], b[13], b[14], b[15]);
        }
        return 0;
    }
    if (!strcmp(cmd, "ctx")) {
        NEED(cuInit);
        CHECK(api.cuInit(0));
        unsigned long long before = nvml_device0(0);
        open_context();
        printf("ctx=%llu\n", before - nvml_device0(0));
        return 0;
    }
    open_context();
    if (!strcmp(cmd, "nullsafe")) {
        /* NULL outputs: the driver's answer, and no crash */
        size_t some;
        NEED(cuMemGetInfo_v2);
        NEED(cuDeviceTotalMem_v2);
        printf("getinfo_free=%d getinfo_total=%d totalmem=%d\n",
               (int)api.cuMemGetInfo_v2(NULL, &some), (int)api.cuMemGetInfo_v2(&some, NULL),
               (int)api.cuDeviceTotalMem_v2(NULL, device));
        return 0;
    }
    if (!strcmp(cmd, "info")) {
        size_t total = 0, free = 0, memtotal = 0;
        NEED(cuDeviceTotalMem_v2);
        NEED(cuMemGetInfo_v2);
        CHECK(api.cuDeviceTotalMem_v2(&total, device));
        CHECK(api.cuMemGetInfo_v2(&free, &memtotal));
        printf("total=%zu memtotal=%zu free=%zu\n", total, memtotal, free);
        return 0;
    }
    if (!strcmp(cmd, "ctxview")) {
        size_t free = 0, total = 0;
        NEED(cuMemGetInfo_v2);
        CHECK(api.cuMemGetInfo_v2(&free, &total));
        printf("getinfo_used=%zu nvml_used=%llu\n", total - free, nvml_device0(1));
        return 0;
    }
    if (!strcmp(cmd, "alloc") && argc > 4) {
        prepare_kind(argv[3]);
        struct block b;
        CUresult rc = take(argv[3], strtoull(argv[4], NULL, 10), &b);
        printf("rc=%d\n", (int)rc);
        if (rc == CUDA_SUCCESS)
            CHECK(give(argv[3], &b));
        return 0;
    }
    if (!strcmp(cmd, "max") && argc > 3) {
        prepare_kind(argv[3]);
        return cmd_max(argv[3]);
    }
    if ((!strcmp(cmd, "hold") || !strcmp(cmd, "churn")) && argc > 5) {
        prepare_kind(argv[3]);
        size_t bytes = strtoull(argv[4], NULL, 10);
        struct block b;
        CUresult rc = take(argv[3], bytes, &b);
        printf(!strcmp(cmd, "hold") ? "held rc=%d\n" : "ready rc=%d\n", (int)rc);
        if (!strcmp(cmd, "hold")) {
            wait_for_release(atof(argv[5]));
            if (rc == CUDA_SUCCESS)
                CHECK(give(argv[3], &b));
            return 0;
        }
        /* keeps BYTES and allocates and frees 2 MiB blocks meanwhile */
        double until = now_s() + atof(argv[5]);
        while (now_s() < until) {
            struct block small;
            if (take(argv[3], 2u << 20, &small) == CUDA_SUCCESS)
                CHECK(give(argv[3], &small));
        }
        if (rc == CUDA_SUCCESS)
            CHECK(give(argv[3], &b));
        return 0;
    }
    if (!strcmp(cmd, "bypass") && argc > 5) {
        /* allocates past libvgpu (RTLD_DEEPBIND), waits, then asks through the hooks */
        void *lib = dlopen(argv[3], RTLD_NOW | RTLD_DEEPBIND);
        int (*helper)(size_t, CUdeviceptr *) = lib ? (int (*)(size_t, CUdeviceptr *))dlsym(lib, "helper_alloc") : NULL;
        if (!helper) {
            printf("error helper %s\n", dlerror());
            return 3;
        }
        CUdeviceptr hidden, seen;
        int hidden_rc = helper(strtoull(argv[4], NULL, 10), &hidden);
        usleep(200000);
        NEED(cuMemAlloc_v2);
        CUresult rc = api.cuMemAlloc_v2(&seen, strtoull(argv[5], NULL, 10));
        printf("hidden_rc=%d rc=%d\n", hidden_rc, (int)rc);
        return 0;
    }
    if (!strcmp(cmd, "badfree")) {
        /* a pointer nobody allocated: the driver's answer, whatever it is */
        NEED(cuMemFree_v2);
        printf("rc=%d\n", (int)api.cuMemFree_v2((CUdeviceptr)0x1000));
        return 0;
    }
    if (!strcmp(cmd, "stress") && argc > 5) {
        start_at = argc > 6 ? atof(argv[6]) : 0;
        return cmd_stress(atoi(argv[3]), atof(argv[4]), strtoull(argv[5], NULL, 10));
    }
    if (!strcmp(cmd, "pooldestroy") && argc > 5)
        return cmd_pooldestroy(argv[3], strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10));
    if (!strcmp(cmd, "vmmrelease") && argc > 5)
        return cmd_vmmrelease(argv[3], strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10));
    if (!strcmp(cmd, "ctxdestroy") && argc > 4)
        return cmd_ctxdestroy(strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    if (!strcmp(cmd, "launch") && argc > 3)
        return cmd_launch(atol(argv[3]), argc > 4 ? atof(argv[4]) : 0);
    fprintf(stderr, "vgpu_probe: bad command\n");
    return 2;
}
