/* Driver API: the driver's error log (CUDA 12.9+). Callbacks are registered and
 * removed as on the real driver; the simulator writes no log entries, so none is
 * ever called, the current position stays 0 and a dump holds nothing. */
#include "sim.h"

#include <stdio.h>
#include <stdlib.h>

struct CUlogsCallbackEntry_st { CUlogsCallback fn; void *data; };

CUresult cuLogsRegisterCallback(CUlogsCallback callbackFunc, void *userData, CUlogsCallbackHandle *callback_out)
{
    if (!callbackFunc)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUlogsCallbackEntry_st *e = malloc(sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (struct CUlogsCallbackEntry_st){callbackFunc, userData};
    sim_handle_put((uintptr_t)e, SIM_KIND_LOG_CALLBACK, e);
    if (callback_out)
        *callback_out = e;
    return CUDA_SUCCESS;
}

CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle callback)
{
    struct CUlogsCallbackEntry_st *e = sim_handle_take((uintptr_t)callback, SIM_KIND_LOG_CALLBACK);
    free(e);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuLogsCurrent(CUlogIterator *iterator_out, unsigned int flags)
{
    if (!iterator_out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    *iterator_out = 0;
    return CUDA_SUCCESS;
}

CUresult cuLogsDumpToFile(CUlogIterator *iterator, const char *pathToFile, unsigned int flags)
{
    if (!pathToFile || flags)
        return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(pathToFile, "a");
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    fclose(f);
    if (iterator)
        *iterator = 0;
    return CUDA_SUCCESS;
}

CUresult cuLogsDumpToMemory(CUlogIterator *iterator, char *buffer, size_t *size, unsigned int flags)
{
    if (!buffer || !size || !*size || flags)
        return CUDA_ERROR_INVALID_VALUE;
    buffer[0] = 0;
    *size = 0;
    if (iterator)
        *iterator = 0;
    return CUDA_SUCCESS;
}
