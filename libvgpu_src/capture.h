/*
 * Stream capture and libvgpu. While a stream captures, the work sent to it is
 * recorded into a graph and nothing runs. The driver invalidates a capture on
 * any operation it forbids meanwhile: querying or synchronising a capturing
 * stream or an event last recorded in one, and, while a capture in the default
 * global mode is open anywhere in the process, a "potentially unsafe" call
 * (cuEventQuery, a synchronisation, cuMemAlloc...) from a thread whose
 * interaction mode is not relaxed. libvgpu's own driver calls must never be
 * that cause: launches into a capturing stream get no event and no wait, and
 * what libvgpu queries for itself it queries in relaxed mode.
 */
#ifndef HAMI_CAPTURE_H
#define HAMI_CAPTURE_H

#include "cuda_api.h"

/* Whether work sent to `stream` now would be captured rather than run (also the
 * legacy stream while a blocking stream of its context captures: work there would
 * fail and invalidate that capture whatever libvgpu does). Always legal to ask. */
int hami_stream_capturing(CUstream stream);

/* Puts this thread in relaxed interaction mode for libvgpu's own queries; returns
 * the mode to give back to hami_capture_restore (-1: nothing to restore). */
int hami_capture_relax(void);
void hami_capture_restore(int mode);

#endif
