/* Driver API: stream priorities and what a stream says of itself. A 9.0 device
 * offers priorities 0 (least) to -5 (greatest); a priority outside that range is
 * clamped to it, as on the real driver. Priorities are recorded, not scheduled. */
#include "sim.h"

#define LEAST_PRIORITY 0
#define GREATEST_PRIORITY (-5)

CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (leastPriority)
        *leastPriority = LEAST_PRIORITY;
    if (greatestPriority)
        *greatestPriority = GREATEST_PRIORITY;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    CUresult rc = cuStreamCreate(phStream, flags);
    if (rc != CUDA_SUCCESS)
        return rc;
    priority = priority > LEAST_PRIORITY ? LEAST_PRIORITY : priority < GREATEST_PRIORITY ? GREATEST_PRIORITY : priority;
    struct sim_stream *s;
    if (sim_stream_resolve(*phStream, &s) == CUDA_SUCCESS)
        sim_stream_set_priority(s, priority);
    return CUDA_SUCCESS;
}

CUresult cuStreamGetPriority(CUstream hStream, int *priority)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    *priority = sim_stream_priority(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = sim_stream_flags(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)sim_stream_ctx(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamGetPriority_ptsz(CUstream hStream, int *priority) { return cuStreamGetPriority(hStream, priority); }
CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags) { return cuStreamGetFlags(hStream, flags); }
CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx) { return cuStreamGetCtx(hStream, pctx); }

/* The simulator has no stream capture: a stream is never capturing. */
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return cuStreamIsCapturing(hStream, captureStatus);
}
