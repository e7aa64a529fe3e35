/* What the parts of libvgpu offer each other. */
#ifndef HAMI_INTERNAL_H
#define HAMI_INTERNAL_H

#include <time.h>

#include "cuda_api.h"
#include "nvml_api.h"
#include "region.h"

#define HAMI_EXPORT __attribute__((visibility("default")))

/* CLOCK_MONOTONIC in ns: the clock of every libvgpu timer, and of the priority
 * stamps other containers compare with theirs. */
static inline int64_t hami_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* CUDA device ordinals each per-process, per-device table holds. */
#define HAMI_MAX_ORDINALS 64

/* The driver hands out device memory in whole 2 MiB pages; charging the same keeps
 * what the host sees for the container within the limit. */
#define HAMI_PAGE (2ull << 20)

/* `bytes` rounded up to whole pages (saturating). */
static inline uint64_t hami_pages(uint64_t bytes)
{
    return bytes > UINT64_MAX - HAMI_PAGE ? UINT64_MAX : (bytes + HAMI_PAGE - 1) / HAMI_PAGE * HAMI_PAGE;
}

/* Sleeps `ns`, brought within [min_ns, max_ns]. */
static inline void hami_sleep_ns(int64_t ns, int64_t min_ns, int64_t max_ns)
{
    ns = ns < min_ns ? min_ns : ns > max_ns ? max_ns : ns;
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

/* symbols.c: the real driver's entry point for `name` (never one of our hooks), or NULL;
 * the C library's own dlsym (ours interposes it: interpose.c). */
void *hami_driver_symbol(const char *name);
typedef void *(*hami_dlsym_fn)(void *, const char *);
hami_dlsym_fn hami_real_dlsym(void);

/* limits.c: the limits from the environment (bare use), and the host's limits file
 * mapped read-only, checked to be on a read-only mount with sane fields (NULL, and
 * why in `why`, when it is not). */
const struct hami_limits *hami_limits_from_env(void);
const struct hami_limits *hami_limits_map(const char *path, char *why, size_t len);

/* limits.c: one of a runtime-made container's files at its fixed path, opened without
 * following a link or blocking on a FIFO, a regular file of `size` bytes (read-only: on a
 * read-only mount, as the runtime mounts the limits), mapped; NULL and why (naming `what`)
 * otherwise. */
void *hami_map_runtime_file(const char *path, size_t size, int writable, const char *what, char *why,
                            size_t len);

/* region.c: the limits in force (NULL when none: then nothing is limited) and
 * whether libvgpu refuses every call (a runtime-made container whose limits or
 * region cannot be used: it fails closed, never runs unlimited). Both settle at
 * the first CUDA or NVML call. */
const struct hami_limits *hami_limits_get(void);
int hami_refused(void);
/* region.c: the mapped region (NULL when none could be had: then nothing is limited),
 * this process's slot in it, and the region's device index for a driver device
 * (matched by UUID, so CUDA_VISIBLE_DEVICES reordering cannot mix devices up; -1 if none). */
struct hami_region *hami_region_get(void);
struct hami_proc_slot *hami_region_self(void);
/* The own slot for an update: NULL when there is none, or once the process gives it
 * back at exit (region.c); a non-NULL one is followed by hami_slot_end() right after
 * the update (no call out in between), so that release never zeroes it under a writer. */
struct hami_proc_slot *hami_slot_begin(void);
void hami_slot_end(void);
int hami_region_device_index(CUdevice dev);
/* The driver's UUID of `dev` as "GPU-xxxxxxxx-xxxx-..."; 0, or -1 when the driver cannot tell. */
int hami_cuda_uuid(CUdevice dev, char *out, size_t len);
/* Same for an NVML handle. */
int hami_region_nvml_index(nvmlDevice_t dev);
/* nvml_device.c: NVML's handle of a CUDA device, NVML started once per process (NULL when
 * NVML cannot say). */
nvmlDevice_t hami_nvml_device(CUdevice dev);
/* How many slots may hold usage (slots beyond were never claimed). */
int hami_region_procs_high(struct hami_region *r);
/* flock(fd, LOCK_EX), waiting at most 2 s for a holder that is stopped; the fd, or -1
 * (fd closed, one warning naming `what`) when it is not had. hami_unlock drops it. */
int hami_flock_bounded(int fd, const char *what);
void hami_unlock(int fd);
/* A container-wide lock (flock on the region file; -1 when there is none). */
int hami_region_lock(void);
/* Frees the slots of processes that are gone; returns how many. */
int hami_region_reclaim_dead(void);
/* True when `pid` is one of the container's live processes (its slot pid or host pid). */
int hami_region_has_pid(unsigned int pid);

/* config.c: runtime-made or bare, and the environment, read once at load (never
 * on a hot path). */
struct hami_config {
    uint64_t mem_limit[HAMI_MAX_DEVICES];   /* bytes, 0 = none */
    uint32_t sm_limit[HAMI_MAX_DEVICES];    /* percent, 0 = none */
    uint32_t core_policy;                   /* HAMI_POLICY_* */
    int32_t priority;                       /* 0 high, 1 low */
    int spill;                              /* CUDA_OVERSUBSCRIBE=true: HAMI_DEVICE_SPILL */
    uint32_t priority_idle_ms;              /* CUDA_PRIORITY_IDLE_MS */
    /* The paths below are the runtime's fixed ones in a runtime-made container
     * (limits from HAMI_LIMITS_PATH, the fields above unused), else the env's. */
    int runtime_made;                       /* HAMI_LIMITS_PATH exists */
    const char *region_path;                /* CUDA_DEVICE_MEMORY_SHARED_CACHE or NULL */
    const char *activity_board;             /* CUDA_ACTIVITY_BOARD or NULL: `default` holds as `force` */
    const char *priority_board;             /* CUDA_PRIORITY_BOARD or NULL: priority has no effect */
    const char *activity_stamp_dir;         /* CUDA_ACTIVITY_STAMP_DIR or NULL: no stamps (never high) */
};
extern struct hami_config hami_config;
/* Runs once (constructor and every entry point): logging level, then the env. */
void hami_init(void);
void hami_config_load(void);
/* Parses "<digits>[k|m|g]" (case-insensitive) into bytes; 0 on success, -1 on a bad value. */
int hami_parse_size(const char *text, uint64_t *bytes);

/* memory.c: the container's device-memory count (region slots). `dev` is a region index.
 * hami_mem_charge returns 0 when charged, -1 when the limit refuses it. */
int hami_mem_charge(int dev, uint64_t bytes);
void hami_mem_charge_force(int dev, uint64_t bytes);
void hami_mem_uncharge(int dev, uint64_t bytes);
void hami_ctx_charged(int dev, int64_t delta);
uint64_t hami_mem_limit(int dev);
/* Whether the device's allocations the card cannot hold may be served from managed
 * memory (HAMI_DEVICE_SPILL, set by the runtime where the node oversubscribes, on a
 * device with a limit). */
int hami_mem_spill(int dev);
uint64_t hami_mem_container_used(int dev);
/* What this process charged on `dev`, by its own count (never the region's). */
uint64_t hami_mem_own(int dev);
/* The card a limited device shows the container, from the physical *total and *free
 * (free may be NULL): total its limit (capped at the physical size unless it spills),
 * used the container's usage, free what is left of the limit (never below 0; unless
 * it spills, never above the physical free). 0, nothing changed, without a limit. */
int hami_mem_view(int dev, uint64_t *total, uint64_t *used, uint64_t *free);

/* tracked.c: what libvgpu charged, keyed by driver handle, thread-safe. */
enum hami_res_kind {
    HAMI_RES_MEM,      /* cuMemAlloc/Pitch/Managed pointer */
    HAMI_RES_ASYNC,    /* stream-ordered pointer; its memory is charged on its pool */
    HAMI_RES_VMM,      /* cuMemCreate handle */
    HAMI_RES_ARRAY,    /* CUarray */
    HAMI_RES_CTX,      /* cuCtxCreate context */
    HAMI_RES_GRAPH,    /* executable graph with memory nodes: bytes is what they need (not charged) */
};
struct hami_res {
    uint64_t key;
    int kind;
    int dev;           /* region index, -1 when not limited */
    uint64_t bytes;    /* charged */
    CUcontext ctx;     /* owning context (freed with it), NULL when none */
    void *aux;         /* ASYNC: its pool's record (cuda_memory.c) */
};
void hami_res_put(const struct hami_res *res);
/* Removes the entry and copies it to `out`; 0 when found, -1 when untracked. */
int hami_res_take(int kind, uint64_t key, struct hami_res *out);
/* Copies the entry to `out` and leaves it; 0 when found, -1 when untracked. */
int hami_res_get(int kind, uint64_t key, struct hami_res *out);
/* Removes every entry owned by `ctx`, calling `fn` for each. */
void hami_res_take_ctx(CUcontext ctx, void (*fn)(const struct hami_res *res));

/* memory.c: gives back what a destroyed context held; `settle` (cuda_memory.c's, set
 * once at load) runs before a charge is refused, to settle every pool's charge. */
void hami_mem_release_ctx(CUcontext ctx);
void hami_mem_before_refusal(void (*settle)(void));
/* memory.c: what the driver shows the container's other processes holding on `dev`
 * (cuda_context.c's reconciliation says it), a floor under the region's counters; and
 * the context layer's way to ask again before a charge is refused (set once at load). */
void hami_mem_others_seen(int dev, uint64_t bytes);
void hami_mem_driver_refresh(void (*refresh)(int dev));

/* cuda_context.c: the region index of the current context's device (-1 if none);
 * charges what the driver holds for this process beyond what the hooks charged
 * (called where a hook starts, before its own charge; throttled). */
int hami_current_device_index(CUdevice *dev_out);
void hami_reconcile(int index, CUdevice dev);
/* The pid the driver names this process by, as the one process that appeared when
 * it created a context (kept in this process only); 0 until known. */
unsigned int hami_host_pid(void);
/* Who is told of a context's end (destroyed, or a primary one released for good or
 * reset), after the driver's call: the SM limiter's, set once at load. */
void hami_ctx_gone_subscribe(void (*gone)(CUcontext ctx));

#endif
