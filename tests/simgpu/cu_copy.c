/* Driver API: copies and fills queued on a stream, and device-to-device copies.
 * A queued copy runs on the stream's worker in order with its kernels; a copy from
 * host memory takes its source when it is queued (as the driver stages pageable
 * memory), so the caller may reuse the buffer at once. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

static int device_ok(CUdeviceptr ptr, size_t len)
{
    return !len || sim_alloc_containing((uintptr_t)ptr, len) || sim_vmm_accessible((uintptr_t)ptr, len);
}

struct copy {
    void *dst;
    const void *src;
    size_t len;
    int fill;                            /* memset with `value` instead of copying */
    unsigned char value;
    unsigned char staged[];              /* a host source taken at queue time */
};

static void run_copy(void *arg)
{
    struct copy *c = arg;
    if (c->fill)
        memset(c->dst, c->value, c->len);
    else
        memmove(c->dst, c->src, c->len);
    free(c);
}

/* Queues the copy or fill `op`; stage: the source is host memory, taken now. */
static CUresult enqueue(CUstream stream, struct copy op, int stage)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(stream, &s);
    if (rc != CUDA_SUCCESS || !op.len)
        return rc;
    struct copy *c = malloc(sizeof *c + (stage ? op.len : 0));
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *c = op;
    if (stage) {
        memcpy(c->staged, op.src, op.len);
        c->src = c->staged;
    }
    sim_stream_enqueue_call(s, run_copy, c);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (!device_ok(dstDevice, ByteCount) || (ByteCount && !srcHost))
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(hStream, (struct copy){.dst = (void *)(uintptr_t)dstDevice, .src = srcHost, .len = ByteCount}, 1);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (!device_ok(srcDevice, ByteCount) || (ByteCount && !dstHost))
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(hStream, (struct copy){.dst = dstHost, .src = (const void *)(uintptr_t)srcDevice, .len = ByteCount},
                   0);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (!device_ok(dstDevice, ByteCount) || !device_ok(srcDevice, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    struct copy op = {.dst = (void *)(uintptr_t)dstDevice, .src = (const void *)(uintptr_t)srcDevice, .len = ByteCount};
    return enqueue(hStream, op, 0);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (!device_ok(dstDevice, N))
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(hStream, (struct copy){.dst = (void *)(uintptr_t)dstDevice, .len = N, .fill = 1, .value = uc}, 0);
}

/* Synchronous, as on the legacy stream: the context's queued work first. */
CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device_ok(dstDevice, ByteCount) || !device_ok(srcDevice, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    sim_ctx_sync(ctx);
    if (ByteCount)
        memmove((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    return cuMemcpyHtoDAsync_v2(dstDevice, srcHost, ByteCount, hStream);
}

CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    return cuMemcpyDtoHAsync_v2(dstHost, srcDevice, ByteCount, hStream);
}

CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream)
{
    return cuMemcpyDtoDAsync_v2(dstDevice, srcDevice, ByteCount, hStream);
}

CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    return cuMemsetD8Async(dstDevice, uc, N, hStream);
}

CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}
