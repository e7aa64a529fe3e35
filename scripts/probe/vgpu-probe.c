/*
 * vgpu-probe: a small CUDA program for the demo and the engine tests.
 * It loads the driver as libcudart does (dlopen "libcuda.so.1"), so it runs
 * unchanged on the real driver, on the simulated one, and under libvgpu.
 *
 *   vgpu-probe info              devices and the memory the container sees
 *   vgpu-probe fill [DEVICE]     allocate until refused, print what it got
 *   vgpu-probe hold MIB SECONDS  allocate MIB on device 0 and keep it a while
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef uint64_t CUdeviceptr;

#define CUDA_ERROR_OUT_OF_MEMORY 2
#define MiB (1024ull * 1024ull)

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_name)(char *, int, CUdevice);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_info)(size_t *, size_t *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*error_name)(CUresult, const char **);
} cu;

static const char *error_name(CUresult r)
{
    const char *name = NULL;
    if (cu.error_name == NULL || cu.error_name(r, &name) != 0 || name == NULL)
        return "CUDA_ERROR_UNKNOWN";
    return name;
}

static void check(CUresult r, const char *what)
{
    if (r != 0) {
        fprintf(stderr, "vgpu-probe: %s: %s\n", what, error_name(r));
        exit(1);
    }
}

static void *symbol(void *lib, const char *name)
{
    void *fn = dlsym(lib, name);
    if (fn == NULL) {
        fprintf(stderr, "vgpu-probe: libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return fn;
}

static void load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "vgpu-probe: %s\n", dlerror());
        exit(1);
    }
    *(void **)&cu.init = symbol(lib, "cuInit");
    *(void **)&cu.device_count = symbol(lib, "cuDeviceGetCount");
    *(void **)&cu.device_get = symbol(lib, "cuDeviceGet");
    *(void **)&cu.device_name = symbol(lib, "cuDeviceGetName");
    *(void **)&cu.primary_retain = symbol(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.ctx_set_current = symbol(lib, "cuCtxSetCurrent");
    *(void **)&cu.mem_info = symbol(lib, "cuMemGetInfo_v2");
    *(void **)&cu.mem_alloc = symbol(lib, "cuMemAlloc_v2");
    *(void **)&cu.mem_free = symbol(lib, "cuMemFree_v2");
    *(void **)&cu.error_name = symbol(lib, "cuGetErrorName");
    check(cu.init(0), "cuInit");
}

static void use_device(int index)
{
    CUdevice dev;
    CUcontext ctx;
    check(cu.device_get(&dev, index), "cuDeviceGet");
    check(cu.primary_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cu.ctx_set_current(ctx), "cuCtxSetCurrent");
}

static int info(void)
{
    int count;
    check(cu.device_count(&count), "cuDeviceGetCount");
    printf("devices: %d\n", count);
    for (int i = 0; i < count; i++) {
        char name[256] = "";
        size_t free_b, total_b;
        CUdevice dev;
        check(cu.device_get(&dev, i), "cuDeviceGet");
        check(cu.device_name(name, sizeof name, dev), "cuDeviceGetName");
        use_device(i);
        check(cu.mem_info(&free_b, &total_b), "cuMemGetInfo");
        printf("device %d: %s, total %zu MiB, free %zu MiB\n", i, name,
               (size_t)(total_b / MiB), (size_t)(free_b / MiB));
    }
    return 0;
}

/* Big blocks first, then single MiB, until the driver (or libvgpu) says no. */
static int fill(int index)
{
    static CUdeviceptr blocks[1 << 16];
    size_t count = 0, got = 0;
    size_t steps[] = {256 * MiB, 16 * MiB, 1 * MiB};
    CUresult last = 0;
    size_t free_b, total_b;

    use_device(index);
    check(cu.mem_info(&free_b, &total_b), "cuMemGetInfo");
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        while (count < sizeof blocks / sizeof blocks[0]) {
            last = cu.mem_alloc(&blocks[count], steps[s]);
            if (last != 0)
                break;
            count++;
            got += steps[s];
        }
    }
    printf("device %d: cuMemGetInfo total %zu MiB, free %zu MiB before filling\n", index,
           (size_t)(total_b / MiB), (size_t)(free_b / MiB));
    printf("allocated %zu MiB; the next 1 MiB was refused: %s\n", (size_t)(got / MiB),
           error_name(last));
    while (count > 0)
        check(cu.mem_free(blocks[--count]), "cuMemFree");
    return last == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1;
}

static int hold(size_t mib, unsigned seconds)
{
    CUdeviceptr ptr;
    use_device(0);
    check(cu.mem_alloc(&ptr, mib * MiB), "cuMemAlloc");
    printf("holding %zu MiB for %u s\n", mib, seconds);
    fflush(stdout);
    sleep(seconds);
    check(cu.mem_free(ptr), "cuMemFree");
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "info";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strcmp(cmd, "info") == 0) {
        load_driver();
        return info();
    }
    if (strcmp(cmd, "fill") == 0) {
        load_driver();
        return fill(argc > 2 ? atoi(argv[2]) : 0);
    }
    if (strcmp(cmd, "hold") == 0 && argc == 4) {
        load_driver();
        return hold(strtoull(argv[2], NULL, 10), (unsigned)atoi(argv[3]));
    }
    fprintf(stderr, "usage: vgpu-probe info | fill [DEVICE] | hold MIB SECONDS\n");
    return 2;
}
