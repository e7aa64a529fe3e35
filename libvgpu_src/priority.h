/*
 * Priority between containers on one GPU, through a host-owned board.
 *
 * Host side (hami_runtime/lifecycle/priority_board.py): every container has one
 * activity stamp per GPU it was granted, a small file in its own rw region dir
 * (CUDA_PRIORITY_STAMP_DIR/<gpu uuid>); the board (CUDA_PRIORITY_BOARD, mounted
 * read-only) holds one dir per GPU whose entries are hard links to the stamps of
 * that GPU's high-priority containers. Only the host makes or removes a link,
 * so what counts as high-priority work cannot be forged from a container: a
 * low-priority container can write its own stamp, which no board entry names.
 *
 * In a process: its own stamp is "high" on a device while a board entry there
 * is the same file (same inode). A high process stamps at every launch and
 * marks the times it waits for its work (synchronisation); a low process, before
 * a launch, waits while a board entry other than its own says high-priority
 * work is active (see hami_stamp_active in priority.c).
 */
#ifndef HAMI_PRIORITY_H
#define HAMI_PRIORITY_H

#include <stdint.h>

#include "internal.h"

/* The stamp file: HAMI_STAMP_BYTES, made zeroed by the host (or a bare test). */
#define HAMI_STAMP_BYTES 64
#define HAMI_STAMP_WAITS 7

struct hami_stamp {
    int64_t last_ns;                      /* CLOCK_MONOTONIC of the latest launch or observed work */
    int64_t waits[HAMI_STAMP_WAITS];      /* CLOCK_MONOTONIC a thread began waiting for its work; 0 free */
};

/* Before every launch: a low process waits while high work is active on the
 * launching device; a high one stamps and counts as waiting for its work until
 * hami_priority_end (the launch may block while the driver's queue is full).
 * Returns a token for hami_priority_end, -1 when there is nothing to end. Costs
 * one load and a branch where no board is configured. */
int hami_priority_launch_slow(void);
static inline int hami_priority_before_launch(void)
{
    return __builtin_expect(hami_config.priority_board != NULL, 0) ? hami_priority_launch_slow() : -1;
}

/* Around a call that waits for the process's own work (cuCtxSynchronize,
 * cuStreamSynchronize, cuEventSynchronize): while a high process waits, its
 * work is running, however long ago it was launched. */
int hami_priority_wait_slow(void);
static inline int hami_priority_wait_begin(void)
{
    return __builtin_expect(hami_config.priority_board != NULL, 0) ? hami_priority_wait_slow() : -1;
}

/* The launch or wait is over (its work observed done, or queued): stamp, and
 * give the wait mark back. */
void hami_priority_end_slow(int token);
static inline void hami_priority_end(int token)
{
    if (__builtin_expect(token >= 0, 0))
        hami_priority_end_slow(token);
}

/* A query said the work is still running (CUDA_ERROR_NOT_READY): stamp. */
void hami_priority_running_slow(void);
static inline void hami_priority_still_running(void)
{
    if (__builtin_expect(hami_config.priority_board != NULL, 0))
        hami_priority_running_slow();
}

#endif
