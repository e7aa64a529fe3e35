/* SM share: called by every launch hook (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch and their per-thread-stream forms).
 * `dev` is the shared region's device index of the launching context. */
#ifndef HAMI_SM_LIMITER_H
#define HAMI_SM_LIMITER_H

#include "cuda_api.h"

/* Blocks until the container may launch on `dev`; returns at once when no
 * limit applies to `dev`. Never fails the launch. */
void hami_sm_before_launch(int dev, CUstream stream);
/* After the launch returned `result` (work accounting only when it succeeded). */
void hami_sm_after_launch(int dev, CUstream stream, CUresult result);

#endif
