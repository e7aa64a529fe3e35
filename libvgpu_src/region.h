/*
 * The two files a runtime-made container's processes share, in one definition:
 *
 * - the LIMITS (struct hami_limits): what the container was granted (its GPUs
 *   by UUID, memory and SM limits, core policy, priority, priority idle time).
 *   The runtime writes it on the host (<state_dir>/private/<name>/limits, a
 *   host-only dir) and bind-mounts it read-only at HAMI_LIMITS_PATH; nothing in
 *   the container can change, replace or remove it. hamictl update rewrites it
 *   in place (the mount holds the inode), one aligned store per field.
 * - the REGION (struct hami_region): the container's usage (per-process slots,
 *   the SM limiter's buckets and counters), in the region dir the runtime mounts
 *   read-write at HAMI_RUNTIME_REGION_DIR, as every process of the container
 *   updates it. The container can write it: what it holds is trusted for
 *   nothing but that container's own accounting.
 *
 * Python reads this same header through cffi (hami_runtime/node/region.py), so it
 * keeps to what cffi's cdef parses: fixed-width fields, plain structs, and
 * "#define NAME <integer>" constants. Other preprocessor lines (the paths below)
 * are ignored by that reader.
 *
 * Runtime-made or bare: a process is in a runtime-made container when
 * HAMI_LIMITS_PATH exists (a read-only mount point, which a process in the
 * container can neither remove nor unmount). Then limits, policy, priority and
 * every path come only from that file and the fixed paths below, never from the
 * environment, and anything unusable (the limits missing, writable, malformed;
 * the region missing or malformed) makes libvgpu fail closed. Otherwise
 * (LD_PRELOAD outside the runtime, as HAMi-core is used) limits come from the
 * environment and the region from CUDA_DEVICE_MEMORY_SHARED_CACHE.
 *
 * Region protocol
 * - Creation: the runtime writes a complete region to a temporary file and
 *   renames it into place, so a reader sees nothing or a finished region.
 *   A process used bare that finds no file creates it under flock(LOCK_EX) and
 *   only then sets `state` to HAMI_REGION_READY. A runtime-made container's
 *   processes never create it.
 * - Processes: a process claims a free slot by compare-and-swap of `owner`
 *   from 0 to hami_owner(pid, start time). Its usage lives only in its slot.
 * - Memory charge (lock-free, never overcommits): add the size to the own
 *   slot, then sum all slots for that device (those below `procs_high`, which
 *   a claimer raises before its first charge); if the sum exceeds the limit,
 *   take the size back and refuse. Every successful charge has seen all
 *   charges made before it (sequentially consistent atomics).
 * - Reclaim: a slot whose process is gone (kill(pid,0) fails with ESRCH, or
 *   /proc/<pid>/stat start time differs) is taken by CAS of `owner` from the
 *   dead value to HAMI_OWNER_RECLAIMING; only the winner zeroes the usage and
 *   then stores 0. No lock exists, so no dead process can hold one.
 *   While a slot is RECLAIMING, `started_ns` is the reclaimer's token: it is
 *   taken by CAS to the reclaimer's owner value before zeroing and put back to
 *   0 before `owner` is; a reclaimer killed half-way leaves a token naming a
 *   dead process, which the next reclaimer takes over the same way.
 *
 * Limits protocol (live changes: hamictl update, under the runtime's node lock,
 * after the allocation record is written): only `devices[i].sm_limit`,
 * `core_policy`, `devices[i].mem_limit` and `priority` change, each with one
 * aligned store of the whole field (never `uuid` or `device_count`), so no
 * reader sees a torn value. Each field is a complete setting alone and no
 * reader needs two of them to agree: a reader that reads two mid-update sees at
 * worst one old and one new value for one call, so no order is relied on (the
 * runtime writes SM share and policy, then memory, then priority). libvgpu
 * keeps no copy of them: every allocation, launch and view reads the limits,
 * so all processes follow at their next call. A memory limit may be set below
 * what the slots hold (a forced shrink): nothing is freed, every charge is
 * refused until the sum falls below it (a charge compares the sum with the
 * limit it loaded, one 64-bit load), and views clamp free to 0.
 */
#ifndef HAMI_REGION_H
#define HAMI_REGION_H

#include <stdint.h>

/* Where the runtime puts them in a container (hami_runtime/lifecycle/spec_edit/modifiers.py
 * says the same; a test checks that they agree). */
#define HAMI_RUNTIME_LIBVGPU "/.hami/libvgpu.so"
#define HAMI_LIMITS_PATH "/.hami/limits"
#define HAMI_RUNTIME_REGION_DIR "/.hami/shared"
#define HAMI_RUNTIME_REGION_PATH HAMI_RUNTIME_REGION_DIR "/vgpu.region"
#define HAMI_RUNTIME_STAMP_DIR HAMI_RUNTIME_REGION_DIR "/activity"
#define HAMI_RUNTIME_ACTIVITY_BOARD "/.hami/activity"
#define HAMI_RUNTIME_PRIORITY_BOARD "/.hami/priority"

#define HAMI_LIMITS_MAGIC 0x3153544d494c4148
#define HAMI_LIMITS_VERSION 1
#define HAMI_REGION_MAGIC 0x314e4752494d4148
#define HAMI_REGION_VERSION 2
#define HAMI_MAX_DEVICES 16
#define HAMI_MAX_PROCS 1024
#define HAMI_UUID_LEN 96

#define HAMI_REGION_EMPTY 0
#define HAMI_REGION_INITIALIZING 1
#define HAMI_REGION_READY 2

#define HAMI_OWNER_RECLAIMING 0xffffffffffffffff

#define HAMI_PRIORITY_IDLE_MS_DEFAULT 200
#define HAMI_PRIORITY_IDLE_MS_MAX 60000

#define HAMI_POLICY_DEFAULT 0
#define HAMI_POLICY_FORCE 1
#define HAMI_POLICY_DISABLE 2

/* hami_device_limit.flags */
#define HAMI_DEVICE_SPILL 1        /* allocations the card cannot hold may use managed memory */

struct hami_proc_slot {
    uint64_t owner;          /* 0 free; (pid << 32) | (start time & 0xffffffff) */
    int32_t pid;             /* pid as the container sees it */
    int32_t host_pid;        /* pid on the host when known (hook), else 0 */
    uint64_t started_ns;     /* CLOCK_REALTIME when the slot was claimed */
    uint64_t mem_used[HAMI_MAX_DEVICES];     /* bytes charged, every kind */
    uint64_t ctx_used[HAMI_MAX_DEVICES];     /* part of mem_used taken by contexts */
    uint64_t sm_busy_ns[HAMI_MAX_DEVICES];   /* measured kernel time, cumulative */
    uint64_t launches[HAMI_MAX_DEVICES];     /* kernel launches, cumulative */
};

struct hami_device_limit {
    char uuid[HAMI_UUID_LEN];  /* NUL-terminated; "" when unknown (bare use) */
    uint64_t mem_limit;        /* bytes; 0 = no limit */
    uint32_t sm_limit;         /* percent; 0 or >= 100 = no limit */
    uint32_t flags;            /* HAMI_DEVICE_* bits */
};

/* What a container may use: the limits file (see above). */
struct hami_limits {
    uint64_t magic;            /* HAMI_LIMITS_MAGIC */
    uint32_t version;          /* HAMI_LIMITS_VERSION */
    uint32_t device_count;     /* devices[0, device_count) are the container's GPUs */
    uint32_t core_policy;      /* HAMI_POLICY_* */
    int32_t priority;          /* 0 high, 1 low */
    uint32_t priority_idle_ms; /* low-priority launches resume once high work idled this long */
    uint32_t reserved;
    uint64_t created_ns;       /* CLOCK_REALTIME */
    struct hami_device_limit devices[HAMI_MAX_DEVICES];
};

/* SM limiter state shared by the container's processes, per device. */
struct hami_sm_state {
    int64_t tokens_ns;         /* busy time the container may still use */
    uint64_t refill_ns;        /* CLOCK_MONOTONIC of the last refill */
    uint64_t busy_ns;          /* measured kernel time, all processes */
    uint64_t throttled_ns;     /* time launches waited for the SM share, cumulative */
    uint64_t paused_ns;        /* time launches waited for high-priority work, cumulative */
    uint64_t reserved[3];
};

/* What the container's processes use: the region file. Device indices are the
 * limits' (bare: CUDA ordinals). */
struct hami_region {
    uint64_t magic;            /* HAMI_REGION_MAGIC */
    uint32_t version;          /* HAMI_REGION_VERSION */
    uint32_t state;            /* HAMI_REGION_EMPTY / INITIALIZING / READY */
    uint32_t procs_high;       /* slots [0, procs_high) were ever claimed; only grows */
    uint32_t reserved;
    uint64_t created_ns;       /* CLOCK_REALTIME */
    struct hami_sm_state sm[HAMI_MAX_DEVICES];
    struct hami_proc_slot procs[HAMI_MAX_PROCS];
};

#endif
