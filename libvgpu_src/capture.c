/* Stream capture: what libvgpu asks the driver so that it never breaks one (capture.h). */
#include "internal.h"
#include "hooks.h"
#include "capture.h"

int hami_stream_capturing(CUstream stream)
{
    CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *) = HAMI_DRIVER(cuStreamIsCapturing);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!is_capturing)
        return 0;                                /* a driver without capture */
    CUresult rc = is_capturing(stream, &status);
    if (rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        return 1;
    return rc == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

int hami_capture_relax(void)
{
    CUresult (*exchange)(CUstreamCaptureMode *) = HAMI_DRIVER(cuThreadExchangeStreamCaptureMode);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!exchange || exchange(&mode) != CUDA_SUCCESS)
        return -1;
    return (int)mode;
}

void hami_capture_restore(int mode)
{
    CUresult (*exchange)(CUstreamCaptureMode *) = HAMI_DRIVER(cuThreadExchangeStreamCaptureMode);
    CUstreamCaptureMode back = (CUstreamCaptureMode)mode;
    if (mode >= 0 && exchange)
        exchange(&back);
}
