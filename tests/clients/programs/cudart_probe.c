/*
 * A program as nvcc would build it, on NVIDIA's CUDA runtime (libcudart.so.12):
 * memory queries, allocations to and past the limit, copies, stream-ordered
 * allocations, and a kernel registered the way nvcc-generated code registers
 * it (a fat binary holding PTX, registered at start-up) and launched through its
 * host stub. No CUDA toolkit is needed: the few runtime prototypes are declared
 * here. Prints one JSON object.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct { unsigned x, y, z; } dim3;
enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, void *tid, void *bid, dim3 *bDim, dim3 *gDim, int *wSize);

#define MIB (1024UL * 1024UL)
#define CHUNK (64 * MIB)
#define MAX_CHUNKS 1024

/* ---- the fat binary nvcc would embed: one PTX entry ---- */

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_90\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry hami_scale(\n"
    "    .param .u64 hami_scale_param_0,\n"
    "    .param .u32 hami_scale_param_1\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n";

struct fatbin_entry {
    uint16_t kind, version;
    uint32_t header_size;
    uint64_t payload_size;
    uint32_t compressed_size, reserved0;
    uint16_t minor, major;               /* the PTX ISA version of a PTX entry */
    uint32_t arch, name_offset, name_size;
    uint64_t flags, reserved1, uncompressed_size;
};
struct fatbin {
    uint32_t magic;
    uint16_t version, header_size;
    uint64_t size;
    struct fatbin_entry entry;
    char payload[(sizeof ptx + 7) / 8 * 8];
};
static struct fatbin image = {
    .magic = 0xba55ed50u, .version = 1, .header_size = 16,
    .size = sizeof(struct fatbin_entry) + sizeof image.payload,
    .entry = {.kind = 1 /* PTX */, .version = 0x101, .header_size = sizeof(struct fatbin_entry),
              .payload_size = sizeof image.payload, .minor = 0, .major = 8, .arch = 90,
              .flags = 0x1 | 0x10 /* 64-bit, Linux */},
};
static struct { uint32_t magic, version; const void *data; const void *prelinked; } wrapper = {
    0x466243b1u, 1, &image, NULL};

/* The host stubs: the runtime knows kernels by these addresses. */
static void hami_scale_stub(void) {}
static void not_in_image_stub(void) {}

int main(void)
{
    memcpy(image.payload, ptx, sizeof ptx);
    void **handle = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(handle, (const char *)hami_scale_stub, "hami_scale", "hami_scale", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterFunction(handle, (const char *)not_in_image_stub, "hami_missing", "hami_missing", -1, NULL,
                           NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(handle);

    int count = -1;
    cudaError_t count_rc = cudaGetDeviceCount(&count);
    size_t free0 = 0, total = 0;
    cudaError_t info_rc = cudaMemGetInfo(&free0, &total);

    /* copies round-trip */
    enum { N = 1 << 20 };
    unsigned char *src = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    void *d = NULL;
    cudaError_t copy_rc = cudaMalloc(&d, N);
    if (copy_rc == 0)
        copy_rc = cudaMemcpy(d, src, N, cudaMemcpyHostToDevice);
    if (copy_rc == 0)
        copy_rc = cudaMemcpy(back, d, N, cudaMemcpyDeviceToHost);
    int copy_ok = copy_rc == 0 && memcmp(src, back, N) == 0;

    /* a kernel launched through its host stub */
    unsigned n = N / 4;
    void *args[] = {&d, &n};
    cudaError_t launch_rc = cudaLaunchKernel((const void *)hami_scale_stub, (dim3){256, 1, 1}, (dim3){256, 1, 1},
                                             args, 0, NULL);
    cudaError_t sync_rc = cudaDeviceSynchronize();
    cudaError_t missing_rc = cudaLaunchKernel((const void *)not_in_image_stub, (dim3){1, 1, 1}, (dim3){1, 1, 1},
                                              args, 0, NULL);
    cudaGetLastError();
    cudaFree(d);

    /* cudaMalloc to the limit and past it */
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    static void *chunks[MAX_CHUNKS];
    int k = 0;
    cudaError_t malloc_fail = 0;
    while (k < MAX_CHUNKS && (malloc_fail = cudaMalloc(&chunks[k], CHUNK)) == 0)
        k++;
    cudaGetLastError();
    size_t malloc_mib = k * (CHUNK / MIB);
    while (k > 0)
        cudaFree(chunks[--k]);

    /* stream-ordered allocations to the limit and past it */
    cudaStream_t stream;
    cudaError_t stream_rc = cudaStreamCreate(&stream);
    size_t free2 = 0;
    cudaMemGetInfo(&free2, &total);
    cudaError_t async_fail = 0;
    while (k < MAX_CHUNKS && (async_fail = cudaMallocAsync(&chunks[k], CHUNK, stream)) == 0)
        k++;
    cudaGetLastError();
    size_t async_mib = k * (CHUNK / MIB);
    while (k > 0)
        cudaFreeAsync(chunks[--k], stream);
    cudaError_t async_sync_rc = cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);

    __cudaUnregisterFatBinary(handle);
    printf("{\"count_rc\": %d, \"count\": %d, \"info_rc\": %d, \"total_mib\": %zu, \"free_mib\": %zu, "
           "\"copy_rc\": %d, \"copy_ok\": %s, \"launch_rc\": %d, \"sync_rc\": %d, \"missing_rc\": %d, "
           "\"malloc_free_mib\": %zu, \"malloc_mib\": %zu, \"malloc_fail\": %d, \"stream_rc\": %d, "
           "\"async_free_mib\": %zu, \"async_mib\": %zu, \"async_fail\": %d, \"async_sync_rc\": %d, "
           "\"chunk_mib\": %lu}\n",
           count_rc, count, info_rc, total / MIB, free0 / MIB, copy_rc, copy_ok ? "true" : "false", launch_rc,
           sync_rc, missing_rc, free1 / MIB, malloc_mib, malloc_fail, stream_rc, free2 / MIB, async_mib,
           async_fail, async_sync_rc, CHUNK / MIB);
    free(src);
    free(back);
    return 0;
}
