/* Synchronisation and query hooks: tell activity (activity.h) that a process's
 * work is still running while it waits for it or polls it, so a kernel longer
 * than the others' window (or, for high-priority work, the idle time) counts as
 * active. Without a board each costs one or two loads and a branch. */
#include "internal.h"
#include "hooks.h"
#include "activity.h"

/* The wait itself, between the marks. */
#define WAITING(call)                                                                               \
    do {                                                                                            \
        int token = hami_activity_wait_begin();                                                     \
        CUresult rc = (call);                                                                       \
        hami_activity_end(token);                                                                   \
        return rc;                                                                                  \
    } while (0)

/* A call that blocks until the process's own work is done. */
#define DEFINE_WAIT(name, params, args)                                                             \
    HAMI_HOOK(CUresult, name, params, args)                                                         \
    {                                                                                               \
        WAITING(real args);                                                                         \
    }

/* A call that says whether the work is done; NOT_READY: it is still running. */
#define DEFINE_QUERY(name, params, args)                                                            \
    HAMI_HOOK(CUresult, name, params, args)                                                         \
    {                                                                                               \
        CUresult rc = real args;                                                                    \
        if (rc == CUDA_ERROR_NOT_READY)                                                             \
            hami_activity_still_running();                                                          \
        return rc;                                                                                  \
    }

HAMI_HOOK_VOID(CUresult, cuCtxSynchronize)
{
    WAITING(real());
}

DEFINE_WAIT(cuCtxSynchronize_v2, (CUcontext ctx), (ctx))  /* CUDA 13: cudaDeviceSynchronize */
DEFINE_WAIT(cuStreamSynchronize, (CUstream hStream), (hStream))
DEFINE_WAIT(cuStreamSynchronize_ptsz, (CUstream hStream), (hStream))
DEFINE_WAIT(cuEventSynchronize, (CUevent hEvent), (hEvent))
DEFINE_QUERY(cuStreamQuery, (CUstream hStream), (hStream))
DEFINE_QUERY(cuStreamQuery_ptsz, (CUstream hStream), (hStream))
DEFINE_QUERY(cuEventQuery, (CUevent hEvent), (hEvent))
