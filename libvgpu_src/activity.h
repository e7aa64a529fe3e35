/*
 * What the containers on one GPU tell each other, through boards the host owns.
 *
 * Host side (hami_runtime/lifecycle/node_state/boards.py): every GPU container has one
 * activity stamp per GPU it was granted, a small file in its own read-write
 * region dir (runtime: HAMI_RUNTIME_STAMP_DIR/<gpu uuid>; bare use:
 * CUDA_ACTIVITY_STAMP_DIR). Two boards, mounted read-only into every GPU
 * container, hold one dir per GPU whose entries are hard links to stamps:
 *
 * - the activity board (HAMI_RUNTIME_ACTIVITY_BOARD; CUDA_ACTIVITY_BOARD): the
 *   stamps of every container on that GPU. Whether another container works
 *   there now is what the `default` SM policy asks (sm_limiter.c);
 * - the priority board (HAMI_RUNTIME_PRIORITY_BOARD; CUDA_PRIORITY_BOARD): the
 *   stamps of the high-priority containers. A low-priority process waits while
 *   one of them works.
 *
 * Only the host links or unlinks, so nothing a container writes makes another
 * container's work look active or idle: it can write its own stamp, and make
 * its own work look idle (which only lets its neighbours run free) or busy
 * (which holds them to no less than their shares), but it cannot add, remove
 * or reach an entry that is not its own. The same answer on a real driver and
 * the simulator: no pid, no driver query is involved.
 *
 * In a process (per CUDA device of the launching context): every process
 * stamps its container's stamp at every launch and when a query says its work
 * still runs, and holds one of the stamp's wait slots while it is in a launch
 * or in a synchronise call, so a kernel longer than the idle time counts as
 * active for as long as the process waits for it. An entry is active while its
 * last stamp is younger than the asker's window, or a wait slot younger than
 * ACT_WAIT_HOLD_NS (activity.c).
 */
#ifndef HAMI_ACTIVITY_H
#define HAMI_ACTIVITY_H

#include <stdint.h>

#include "internal.h"

/* The stamp file: HAMI_STAMP_BYTES, made zeroed by the host (or a bare test). */
#define HAMI_STAMP_BYTES 64
#define HAMI_STAMP_WAITS 7

struct hami_stamp {
    int64_t last_ns;                      /* CLOCK_MONOTONIC of the latest launch or observed work */
    int64_t waits[HAMI_STAMP_WAITS];      /* CLOCK_MONOTONIC a thread began waiting for its work; 0 free */
};

static inline int hami_boards_configured(void)
{
    return __builtin_expect(hami_config.priority_board != NULL || hami_config.activity_board != NULL, 0);
}

/* Before every launch: a low-priority process waits while high-priority work is
 * active on the launching device; then the process stamps and counts as waiting
 * for its work until hami_activity_end (the launch may block while the driver's
 * queue is full). Returns a token for hami_activity_end, -1 when there is nothing
 * to end. Costs one or two loads and a branch where no board is configured. */
int hami_activity_launch_slow(void);
static inline int hami_activity_before_launch(void)
{
    return hami_boards_configured() ? hami_activity_launch_slow() : -1;
}

/* Around a call that waits for the process's own work (cuCtxSynchronize,
 * cuStreamSynchronize, cuEventSynchronize): while it waits, its work runs,
 * however long ago it was launched. */
int hami_activity_wait_slow(void);
static inline int hami_activity_wait_begin(void)
{
    return hami_boards_configured() ? hami_activity_wait_slow() : -1;
}

/* The launch or wait is over (its work observed done, or queued): stamp, and
 * give the wait slot back. */
void hami_activity_end_slow(int token);
static inline void hami_activity_end(int token)
{
    if (__builtin_expect(token >= 0, 0))
        hami_activity_end_slow(token);
}

/* A query said the work is still running (CUDA_ERROR_NOT_READY): stamp. */
void hami_activity_running_slow(void);
static inline void hami_activity_still_running(void)
{
    if (hami_boards_configured())
        hami_activity_running_slow();
}

/* A node-wide lock on device `dev` among every container on the activity board
 * (a flock on its GPU dir there, which all of them share, read-only): context
 * creations of two containers on one GPU then never overlap, so each one's
 * measurement sees only its own. -1 when there is no board; hami_unlock drops it. */
int hami_activity_lock(CUdevice dev);

/* Whether another container's work is active on the current context's device,
 * stamped within the last `window_ns` (or waited for now): 1 yes, 0 no, -1 not
 * known (no activity board, or the device is not on it). */
int hami_activity_others(int64_t window_ns);

#endif
