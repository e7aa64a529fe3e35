/* Driver API: copies and fills queued on a stream, and device-to-device copies.
 * A queued copy runs on the stream's worker in order with its kernels; a copy from
 * host memory takes its source when it is queued (as the driver stages pageable
 * memory), so the caller may reuse the buffer at once. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

int sim_device_range_ok(CUdeviceptr ptr, size_t len)
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
    int capturing;
    CUresult rc = sim_stream_op(stream, &s, &capturing);
    if (rc != CUDA_SUCCESS || !op.len)
        return rc;
    if (capturing) {                     /* a memcpy or memset node: a host source is read at replay */
        struct sim_node_desc d = {.type = op.fill ? CU_GRAPH_NODE_TYPE_MEMSET : CU_GRAPH_NODE_TYPE_MEMCPY,
                                  .dst = (uintptr_t)op.dst, .src = (uintptr_t)op.src, .width = op.len,
                                  .height = 1, .value = op.value, .elem = 1};
        return sim_capture_add(s, &d);
    }
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
    if (!sim_device_range_ok(dstDevice, ByteCount) || (ByteCount && !srcHost))
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(hStream, (struct copy){.dst = (void *)(uintptr_t)dstDevice, .src = srcHost, .len = ByteCount}, 1);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (!sim_device_range_ok(srcDevice, ByteCount) || (ByteCount && !dstHost))
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(hStream, (struct copy){.dst = dstHost, .src = (const void *)(uintptr_t)srcDevice, .len = ByteCount},
                   0);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (!sim_device_range_ok(dstDevice, ByteCount) || !sim_device_range_ok(srcDevice, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    struct copy op = {.dst = (void *)(uintptr_t)dstDevice, .src = (const void *)(uintptr_t)srcDevice, .len = ByteCount};
    return enqueue(hStream, op, 0);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    if (!sim_device_range_ok(dstDevice, N))
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
    if (!sim_device_range_ok(dstDevice, ByteCount) || !sim_device_range_ok(srcDevice, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sim_capture_sync_call(ctx)) != CUDA_SUCCESS)
        return rc;
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

/* ---- 2D copies: rows of WidthInBytes, each side at its own pitch ---- */

struct copy2d {
    unsigned char *dst;
    const unsigned char *src;
    size_t dst_pitch, src_pitch, width, height;
    unsigned char staged[];              /* a host source taken at queue time, rows packed */
};

static void copy_rows(const struct copy2d *c)
{
    for (size_t row = 0; row < c->height; row++)
        memmove(c->dst + row * c->dst_pitch, c->src + row * c->src_pitch, c->width);
}

static void run_copy2d(void *arg)
{
    copy_rows(arg);
    free(arg);
}

/* One side of a 2D copy: its first byte, and whether it is host memory. Arrays are not
 * copied to or from (CUDA_ERROR_NOT_SUPPORTED); device rows must lie in device memory. */
static CUresult side2d(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x, size_t y, size_t pitch,
                       size_t width, size_t height, unsigned char **at, int *is_host)
{
    if (type == CU_MEMORYTYPE_ARRAY)
        return CUDA_ERROR_NOT_SUPPORTED;
    uintptr_t base = type == CU_MEMORYTYPE_HOST ? (uintptr_t)host : (uintptr_t)dev;
    if (!base || (height > 1 && pitch < width) || (type != CU_MEMORYTYPE_HOST && type != CU_MEMORYTYPE_DEVICE &&
                                                  type != CU_MEMORYTYPE_UNIFIED))
        return CUDA_ERROR_INVALID_VALUE;
    *at = (unsigned char *)base + y * pitch + x;
    size_t span = height ? (height - 1) * pitch + width : 0;
    int device = sim_device_range_ok((CUdeviceptr)(uintptr_t)*at, span);
    if (type == CU_MEMORYTYPE_DEVICE && !device)
        return CUDA_ERROR_INVALID_VALUE;
    *is_host = !device;                  /* unified addresses: whichever the pointer is */
    return CUDA_SUCCESS;
}

static CUresult copy2d(const CUDA_MEMCPY2D *p, CUstream stream, int async)
{
    SIM_REQUIRE_INIT();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *dst, *src;
    int dst_host, src_host;
    CUresult rc = side2d(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY, p->dstPitch,
                         p->WidthInBytes, p->Height, &dst, &dst_host);
    if (rc == CUDA_SUCCESS)
        rc = side2d(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, p->srcPitch,
                    p->WidthInBytes, p->Height, &src, &src_host);
    if (rc != CUDA_SUCCESS || !p->WidthInBytes || !p->Height)
        return rc;
    struct copy2d op = {dst, src, p->dstPitch, p->srcPitch, p->WidthInBytes, p->Height};
    if (!async) {                        /* as on the legacy stream: the context's queued work first */
        struct sim_ctx *ctx;
        if ((rc = sim_ctx_current_checked(&ctx)) != CUDA_SUCCESS || (rc = sim_capture_sync_call(ctx)) != CUDA_SUCCESS)
            return rc;
        sim_ctx_sync(ctx);
        copy_rows(&op);
        return CUDA_SUCCESS;
    }
    struct sim_stream *s;
    int capturing;
    if ((rc = sim_stream_op(stream, &s, &capturing)) != CUDA_SUCCESS)
        return rc;
    if (capturing) {
        struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_MEMCPY, .dst = (uintptr_t)dst, .src = (uintptr_t)src,
                                  .width = p->WidthInBytes, .height = p->Height, .dst_pitch = p->dstPitch,
                                  .src_pitch = p->srcPitch};
        return sim_capture_add(s, &d);
    }
    size_t staged = src_host ? p->WidthInBytes * p->Height : 0;
    struct copy2d *c = malloc(sizeof *c + staged);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *c = op;
    if (staged) {
        for (size_t row = 0; row < p->Height; row++)
            memcpy(c->staged + row * p->WidthInBytes, src + row * p->srcPitch, p->WidthInBytes);
        c->src = c->staged;
        c->src_pitch = p->WidthInBytes;
    }
    sim_stream_enqueue_call(s, run_copy2d, c);
    return CUDA_SUCCESS;
}

CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy) { return copy2d(pCopy, NULL, 0); }
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy) { return copy2d(pCopy, NULL, 0); }
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream) { return copy2d(pCopy, hStream, 1); }
SIM_PER_THREAD(cuMemcpy2D_v2, ptds)
SIM_PER_THREAD(cuMemcpy2DUnaligned_v2, ptds)
SIM_PER_THREAD(cuMemcpy2DAsync_v2, ptsz)
