/*
 * Simulated GPU driver: what its files offer each other. Both libcuda.so.1
 * and libnvidia-ml.so.1 are built from these sources; only the API entry
 * points (declared in the shared headers, included with default visibility)
 * are exported.
 */
#ifndef HAMI_SIM_H
#define HAMI_SIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>

#pragma GCC visibility push(default)
#include "cuda_api.h"
#include "nvml_api.h"
#pragma GCC visibility pop

#define SIM_MAX_DEVICES 16
#define SIM_MAX_MIG 32                   /* MIG instances on the whole machine */
#define SIM_MIG_PER_CARD 7               /* as on an A100/H100: at most seven */
#define SIM_MAX_PROCS 1024
#define SIM_RING 262144                  /* kernel intervals remembered per device: 2.6 s of 10 us kernels */
#define SIM_STATE_MAGIC 0x3154535f4d495348ULL
#define SIM_STATE_VERSION 8
#define SIM_MIB (1024ULL * 1024ULL)
#define SIM_PAGE (2 * SIM_MIB)           /* device allocations take whole 2 MiB pages */
#define SIM_SM_VERSION 90                /* every simulated card is compute capability 9.0 */
#define SIM_SM_SHARED_BYTES (228 * 1024)  /* shared memory of one SM, all of it available to kernels */
#define SIM_PCI_DEVICE_ID 0x233010DE      /* device and vendor id of an H100 SXM5 80GB, as NVML reports them */
#define SIM_PCI_SUBSYSTEM_ID 0x16C110DE
#define SIM_HEARTBEAT_NS 1000000000ULL
#define SIM_UTIL_WINDOW_NS 1000000000ULL

static inline uint64_t sim_round_up(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

/* ---- configuration (sim_config.c) ----
 * Two numberings: a *card* is a simulated physical GPU (0 .. devices-1: its minor
 * number, UUID, bus id and its place in the state file); a *device* is a visible
 * ordinal (0 .. visible-1: the CUDA ordinal and NVML index). Which cards are visible
 * follows the device nodes, as with the real driver (sim_config.c). Every `dev`
 * argument below is a visible ordinal; the functions map it to its card. */
struct sim_config {
    int devices;                         /* cards */
    int visible;                         /* visible devices */
    int card[SIM_MAX_DEVICES];           /* visible ordinal -> card */
    uint64_t memory_mib;
    int sms;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    uint64_t context_mib;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda_version;
    int stale_seconds;                   /* another pid namespace's process: dead after this long without a heartbeat */
    uint64_t kernel_us;                  /* the run time of a kernel of a real image (no duration parameter) */
    uint64_t launch_us;                  /* CPU time a launch call takes before it returns */
    uint64_t dispatch_us;                /* from a launch's return to its kernel running on an idle stream */
    uint64_t timeslice_us;               /* how long a context keeps the engine once another's work waits */
    uint64_t util_period_ms;             /* NVML's per-process utilisation sample period */
    uint64_t context_us;                 /* how long making a context takes (its memory is taken first) */
    uint64_t nvml_memory_info_us;        /* how long nvmlDeviceGetMemoryInfo takes (a slow or hung driver) */
    uint64_t nvml_init_us;               /* how long a process's first nvmlInit takes */
    uint64_t nvml_attach_us;             /* how long NVML's first handle of each GPU takes */
    int self_calls;                      /* 1: entry points call each other through their exported names */
    uint64_t host_memory_mib;            /* host memory managed allocations may take, machine-wide */
    int brand;                           /* nvmlDeviceGetBrand's nvmlBrandType_t */
    char mig[256];                       /* the `mig` key as written: "<card>:<MiB>,..." */
    int mig_count;
    struct sim_mig {                     /* one MIG instance (a GPU instance with one compute instance) */
        int card;
        int gpu_instance;                /* 1, 2, ... in the card's order */
        int compute_instance;            /* 0 */
        uint64_t memory_mib;
    } mig_instance[SIM_MAX_MIG];
};
/* The configuration, read once; NULL (after one stderr line) when it is bad. */
const struct sim_config *sim_config(void);
/* The card behind visible ordinal dev (dev must be below visible). */
int sim_card(int dev);
void sim_device_uuid(int dev, unsigned char out[16]);
void sim_device_uuid_string(int dev, char *out, size_t len);  /* "GPU-xxxxxxxx-..." */
int sim_device_pci_bus(int dev);
void sim_mig_uuid_string(const struct sim_mig *mig, char *out, size_t len);  /* "MIG-xxxxxxxx-..." */

/* ---- cross-process state file (sim_state.c) ---- */
struct sim_proc_slot {
    uint32_t live;                       /* changed under the state mutex only */
    uint32_t pid;
    uint64_t start_time;                 /* /proc/<pid>/stat field 22 */
    uint64_t pidns;                      /* inode of /proc/<pid>/ns/pid */
    uint32_t host_pid;                   /* the pid NVML reports: in the host's pid namespace */
    uint32_t host_pid_known;             /* 1: host_pid is the host's (own namespace, or the pid service);
                                          * 2: found by a reader in the host's namespace (sim_pids.h) */
    _Atomic uint64_t heartbeat_ns;
    _Atomic uint64_t verified_ns;        /* when a process of its namespace last read its /proc entry */
    _Atomic uint64_t used[SIM_MAX_DEVICES];       /* bytes of device memory */
    _Atomic uint32_t contexts[SIM_MAX_DEVICES];   /* live contexts per device */
    _Atomic uint64_t managed;            /* bytes of managed memory (host-backed pages) */
};

struct sim_interval {                    /* one kernel on a device's timeline */
    _Atomic uint64_t seq;                /* ring position + 1 once written, 0 while writing */
    uint64_t start_ns, end_ns;           /* CLOCK_MONOTONIC; from when the engine took the launch
                                            (its dispatch: NVML counts it busy) to the kernel's end */
    uint32_t pid, slot;                  /* pid: the host's, as NVML reports it */
};

#define SIM_ENGINE_RUNS 256             /* kernels booked and not yet over, per device */

struct sim_run {                         /* a kernel (or a slice of one) on the engine, not yet over */
    uint64_t ticket;                     /* 0: the entry is free */
    uint64_t ctx;                        /* its context (sim_engine.c) */
    uint64_t start_ns, end_ns;
    uint64_t ring_pos;                   /* its latest interval in the ring */
};

struct sim_engine {                      /* a device's compute engine: sim_engine.c; under `lock` */
    pthread_mutex_t lock;                /* process-shared, robust */
    uint64_t busy_until_ns;              /* end of the work booked */
    uint64_t owner, owner_since_ns;      /* whose work ends last, and when its turn began (or resumes) */
    uint64_t guest, guest_since_ns, guest_end_ns;   /* a context that took the owner's engine: its turn */
    uint64_t tickets;
    struct sim_run runs[SIM_ENGINE_RUNS];
};

struct sim_device_state {
    struct sim_engine engine;
    _Atomic uint64_t ring_head;
    struct sim_interval ring[SIM_RING];
};

struct sim_state {
    uint64_t magic;
    uint32_t version;
    uint32_t devices;
    uint64_t memory_bytes;
    pthread_mutex_t lock;                /* process-shared, robust: guards slot claims and charges */
    uint32_t slot_hwm;                   /* slots at or above this index were never claimed */
    uint32_t reserved0;
    struct sim_proc_slot procs[SIM_MAX_PROCS];
    struct sim_device_state dev[SIM_MAX_DEVICES];
};

/* Maps the state file (HAMI_SIM_STATE); NULL after one stderr line on failure. */
struct sim_state *sim_state(void);
uint64_t sim_now_ns(void);              /* CLOCK_MONOTONIC */
void sim_spin_us(uint64_t us);          /* keeps the CPU busy that long, as a driver's call does */
void sim_sleep_us(uint64_t us);         /* waits that long, signals or not, as a call waiting on the kernel does */
/* The start of a /proc file, NUL-terminated, in one read; -1 when it cannot be read. */
int sim_read_proc(const char *path, char *buf, size_t size);
/* Charge `bytes` of device memory to this process; 0, or -1 when the device is full. */
int sim_charge(int dev, uint64_t bytes);
void sim_uncharge(int dev, uint64_t bytes);
/* Managed memory lives in host pages, counted apart from any device's memory: 0, or -1
 * when the machine's managed memory would pass host_memory_mib. */
int sim_charge_host(uint64_t bytes);
void sim_uncharge_host(uint64_t bytes);
void sim_context_count(int dev, int delta);
/* Memory in use on a device by all live processes (dead ones are reclaimed first). */
uint64_t sim_device_used(int dev);
struct sim_proc_usage { uint32_t pid; uint64_t used; };
/* Live processes with a context or memory on `dev`, by host pid, one entry per process (the slots of
 * two copies of the driver in one process, a dlmopen'd one, summed); returns how many there are
 * (may exceed max). */
unsigned sim_device_procs(int dev, struct sim_proc_usage *out, unsigned max);
/* This process's ids as a ring interval names it: the host's pid, its slot. */
void sim_self_ids(uint32_t *pid, uint32_t *slot);
void sim_mutex_init_shared(pthread_mutex_t *m);   /* process-shared, robust */
void sim_mutex_lock_shared(pthread_mutex_t *m);   /* taking over one a killed holder left */
/* Busy nanoseconds of the device (pid 0: all processes) within [from, to], as NVML counts them:
 * from when the engine took each launch to its kernel's end. */
uint64_t sim_busy_ns(int dev, uint32_t pid, uint64_t from, uint64_t to);
/* pids that ran kernels on dev within [from, to]; returns how many (up to max), last end each. */
unsigned sim_busy_pids(int dev, uint64_t from, uint64_t to, uint32_t *pids, uint64_t *last_end, unsigned max);

/* ---- a device's compute engine (sim_engine.c): one context's work at a time ---- */
struct sim_ticket { int run; uint64_t ticket, end_ns; };   /* a booked kernel, as its booker holds it */
/* Books `dur_ns` of context `ctx`'s work, queued (its call returned) at `queued_ns` and ready to
 * start at `ready_ns`; returns its start. `lead_ns`: the front end's work on the launch before it
 * (its dispatch on an idle stream), which NVML counts busy as it does the kernel. */
uint64_t sim_engine_book(int dev, uint64_t ctx, uint64_t queued_ns, uint64_t ready_ns, uint64_t dur_ns,
                         uint64_t lead_ns, struct sim_ticket *t);
/* The booked kernel's end as it stands now (another context's turn can move it later). */
uint64_t sim_engine_end(int dev, struct sim_ticket *t);
/* When work of context `ctx` reached at `t_ns` (an event's record) gets the engine. */
uint64_t sim_engine_turn(int dev, uint64_t ctx, uint64_t t_ns);
/* The engine's name for a context of this process. */
uint64_t sim_engine_context(const void *ctx);

/* ---- handle registry (sim_handles.c): every handle is checked here before use ---- */
enum sim_kind {
    SIM_KIND_CTX = 1, SIM_KIND_STREAM, SIM_KIND_EVENT, SIM_KIND_MODULE, SIM_KIND_FUNC,
    SIM_KIND_ALLOC, SIM_KIND_HOST, SIM_KIND_POOL, SIM_KIND_ARRAY, SIM_KIND_GRAPH,
    SIM_KIND_GRAPH_EXEC, SIM_KIND_VMM_HANDLE, SIM_KIND_VMM_RESERVE, SIM_KIND_VMM_MAP,
    SIM_KIND_LIBRARY, SIM_KIND_KERNEL, SIM_KIND_FUNC_ATTRS, SIM_KIND_LINK, SIM_KIND_LOG_CALLBACK,
    SIM_KIND_GRAPH_NODE
};
void sim_handle_put(uintptr_t key, int kind, void *val);
void *sim_handle_get(uintptr_t key, int kind);
void *sim_handle_take(uintptr_t key, int kind);
/* First value of `kind` for which match(val, arg) is true, or NULL. */
void *sim_handle_find(int kind, int (*match)(void *val, void *arg), void *arg);

/* ---- module images (sim_image.c, libcuda only) ---- */
enum sim_image_kind { SIM_IMAGE_TEST = 1, SIM_IMAGE_FATBIN, SIM_IMAGE_ELF, SIM_IMAGE_PTX };
struct sim_image {
    enum sim_image_kind kind;
    int opaque;                          /* holds entries not parsed (compressed): any name resolves */
    char **names;                        /* its kernels */
    size_t count;
};
/* Reads an image as cuModuleLoadData gets it; CUDA_ERROR_INVALID_IMAGE when it is malformed. */
CUresult sim_image_parse(const void *image, struct sim_image *img);
/* The kernel's name as the image holds it, or NULL. */
const char *sim_image_kernel(const struct sim_image *img, const char *name);
void sim_image_free(struct sim_image *img);
/* The fat binary a wrapper (what host code embeds) points at; any other image as it is. */
const void *sim_image_unwrap(const void *image);
/* How many bytes an image spans: a fat binary says so in its header, an ELF cubin ends with
 * its last section or header table, PTX and test images are NUL-terminated text. */
size_t sim_image_size(const void *image);
/* A global variable of a cubin, PTX text or a fat binary's chosen entry, of `len` bytes: 1 with
 * its size and, for a cubin's initialised data, a copy of it in *init (free it; else NULL). */
int sim_image_global(const void *image, size_t len, const char *name, size_t *bytes, void **init);
/* A file's bytes, read whole and NUL-terminated (free them); CUDA_ERROR_FILE_NOT_FOUND when
 * it cannot be opened. */
CUresult sim_image_read_file(const char *path, char **data, size_t *len);
/* Whether `name` is one of the simulator's test kernels (first parameter: duration in µs). */
int sim_image_test_kernel(const char *name);

/* ---- driver-side objects (libcuda only) ---- */
struct sim_stream;
struct sim_ctx {
    int dev;
    int primary;
    int active;                          /* 0 once destroyed/released */
    int refcount;                        /* primary contexts: retain count */
    unsigned flags;
    struct sim_stream *null_stream;      /* legacy and per-thread default stream */
    struct sim_cls *cls;                 /* context-local storage (cu_export.c) */
    CUdeviceptr heap_page;               /* the module heap's current page (cu_memory.c) */
    size_t heap_used, heap_size;
    size_t limits[10];                   /* cuCtxSetLimit values, where limit_set */
    unsigned char limit_set[10];
    int cache_config;
};

struct sim_alloc {
    uintptr_t base;
    size_t size;                         /* bytes asked for */
    size_t mapped;                       /* bytes of host mapping behind it (0: none) */
    uint64_t charged;                    /* device bytes charged (pool allocations: 0); managed: host bytes */
    int managed;                         /* cuMemAllocManaged: host-backed pages, no device charge */
    int dev;
    struct sim_ctx *ctx;
    struct sim_pool *pool;               /* pool allocations */
    struct sim_galloc *graph;            /* a graph allocation's address (cu_graph.c owns it) */
};

/* The per-thread-default-stream export of `name`: the same function, as the legacy and the
 * per-thread default stream are one stream per context here. */
#define SIM_PER_THREAD(name, suffix) extern __typeof__(name) name##_##suffix __attribute__((alias(#name)));

extern int sim_cuda_initialised;
#define SIM_REQUIRE_INIT() do { if (!sim_cuda_initialised) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

/* cu_context.c */
struct sim_ctx *sim_ctx_check(CUcontext ctx);     /* NULL unless a live context */
struct sim_ctx *sim_ctx_current(void);            /* NULL when none or not live */
CUresult sim_ctx_current_checked(struct sim_ctx **out);
/* The device's primary context, made (inactive) if it does not exist yet; NULL for a bad ordinal. */
struct sim_ctx *sim_ctx_primary(int dev);
/* cu_function.c: the card's SMs are laid out as an H100 SXM's, in pairs (TPCs) spread over
 * SIM_GPCS GPCs as evenly as they go (132 SMs: two GPCs of 18, six of 16); an odd SM is in the last. */
#define SIM_GPCS 8
int sim_gpc_sms(int gpc);
/* cu_export.c: calls the destructors of a context's local storage and empties it */
void sim_ctx_cls_destroy(struct sim_ctx *ctx);
const void *const *sim_export_runtime_table(void);
/* cu_export_check.c: the runtime's driver check table */
const void *const *sim_export_check_table(void);
/* cu_memory.c */
CUresult sim_alloc_device(struct sim_ctx *ctx, size_t size, CUdeviceptr *out);
void sim_free_ctx_allocations(struct sim_ctx *ctx);
/* Device memory for what modules place in a context (their globals): carved from 2 MiB pages the
 * context takes as it needs them (charged as device memory), freed with the context. */
CUresult sim_ctx_heap(struct sim_ctx *ctx, size_t size, CUdeviceptr *out);
void sim_alloc_release(struct sim_alloc *a);
struct sim_alloc *sim_alloc_containing(uintptr_t addr, size_t len);
/* cu_copy.c: whether [ptr, ptr+len) is device memory a copy may touch (plain, pool, managed or mapped VMM) */
int sim_device_range_ok(CUdeviceptr ptr, size_t len);
/* cu_stream.c */
struct sim_stream *sim_stream_new(struct sim_ctx *ctx, unsigned flags);
void sim_stream_free(struct sim_stream *s);
/* Resolves a CUstream (NULL, legacy, per-thread or a handle) to a live stream. */
CUresult sim_stream_resolve(CUstream h, struct sim_stream **out);
void sim_stream_wait_idle(struct sim_stream *s);
void sim_ctx_sync(struct sim_ctx *ctx);           /* every stream of the context */
void sim_ctx_streams_destroy(struct sim_ctx *ctx);
struct sim_ctx *sim_stream_ctx(struct sim_stream *s);
/* Queues a kernel of `dur_us` microseconds; fn (may be NULL) runs on the worker in order. */
void sim_stream_enqueue_kernel(struct sim_stream *s, uint64_t dur_us);
/* In an operation a stream's worker runs: it kept the stream busy until t_ns (a wait, a
 * host function), so the stream's later work starts after that. */
void sim_stream_gpu_reach(uint64_t t_ns);
void sim_stream_enqueue_call(struct sim_stream *s, void (*fn)(void *), void *arg);
/* Whether the stream is being destroyed (an operation that waits on memory gives up then). */
int sim_stream_stopping(struct sim_stream *s);
/* ---- stream capture (cu_stream.c) and graphs (cu_graph.c) ----
 * What a stream-ordered operation becomes while its stream captures: one graph node. */
struct sim_graph;
struct sim_graph_node;
struct sim_node_desc {
    CUgraphNodeType type;
    uint64_t dur_us;                     /* kernel: its booked time */
    CUfunction func;
    unsigned grid[3], block[3], shared;
    uintptr_t dst, src;                  /* memcpy (rows of width bytes), memset (elements of elem bytes) */
    size_t width, height, dst_pitch, src_pitch;
    unsigned value, elem;
    CUhostFn fn;                         /* host */
    void *user;
    CUevent event;                       /* event record / wait */
    struct sim_graph *child;             /* child graph (taken over by the node) */
    size_t bytes;                        /* mem alloc: size; dev its device */
    int dev;
    CUdeviceptr dptr;                    /* mem alloc: the address made; mem free: the address */
};
/* An operation on a stream: resolves it and applies the capture rules. *capturing is 1 when the
 * stream captures (add the node with sim_capture_add instead of queuing work), else 0. The
 * legacy stream refuses work while a blocking stream of its context captures
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); an invalidated capture refuses everything. */
CUresult sim_stream_op(CUstream h, struct sim_stream **out, int *capturing);
/* Adds a node to the capture s is in (after the stream's current dependencies); a node the
 * graph refuses invalidates the capture. */
CUresult sim_capture_add(struct sim_stream *s, struct sim_node_desc *d);
/* Invalidates the capture s is in (an operation it may not capture). */
CUresult sim_capture_refuse(struct sim_stream *s, CUresult rc);
/* The "potentially unsafe" calls (cuThreadExchangeStreamCaptureMode): refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the captures that forbid them. */
CUresult sim_capture_unsafe_call(void);
/* Synchronous work on the legacy stream of ctx (synchronous copies, memsets): the unsafe-call
 * rule, then CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking stream of ctx captures. */
CUresult sim_capture_sync_call(struct sim_ctx *ctx);
/* cuCtxSynchronize: the unsafe-call rule, then CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while any
 * stream of ctx captures (those captures are invalidated). */
CUresult sim_capture_ctx_call(struct sim_ctx *ctx);
/* Replays an event record / wait on a stream (graph event nodes). */
void sim_stream_enqueue_event_record(struct sim_stream *s, CUevent ev);
void sim_stream_enqueue_event_wait(struct sim_stream *s, CUevent ev);
/* cu_graph.c */
struct sim_graph *sim_graph_new(void);            /* registered as a CUgraph handle */
void sim_graph_free(struct sim_graph *g);         /* unregisters it */
void sim_graph_set_capturing(struct sim_graph *g, int on);  /* a capture's graph: cuGraphDestroy refuses it */
CUresult sim_graph_add(struct sim_graph *g, struct sim_graph_node *const *deps, size_t ndeps,
                       struct sim_node_desc *d, struct sim_graph_node **out);
/* Whether `a` is `b` or one of its ancestors. */
int sim_graph_node_before(const struct sim_graph_node *a, const struct sim_graph_node *b);
/* A graph allocation given back by cuMemFree / cuMemFreeAsync outside capture. */
CUresult sim_graph_mem_free(struct sim_galloc *g);

/* cu_vmm.c: whether [addr, addr+len) is mapped VMM memory with read/write access */
int sim_vmm_accessible(uintptr_t addr, size_t len);
/* cu_array.c */
void sim_free_ctx_arrays(struct sim_ctx *ctx);
/* cu_pool.c */
void sim_pools_release_ctx(struct sim_ctx *ctx);
void sim_pools_sync_trim(int dev);
CUresult sim_pool_free(struct sim_alloc *a, struct sim_stream *s);
/* cu_library.c: a CUkernel passed where a CUfunction goes becomes its function in the
 * current context; anything else is returned as it is. */
CUfunction sim_kernel_resolve(CUfunction f);
/* cu_launch.c: how long a launch of f runs (a CUkernel stands for its function in the current context) */
CUresult sim_kernel_time(CUfunction f, void **kernelParams, void **extra, uint64_t *dur_us);
/* cu_launch.c: the library kernel a module function stands for (its attributes are the kernel's) */
void sim_func_bind_kernel(CUfunction f, CUkernel k);
CUkernel sim_func_kernel(CUfunction f);
/* cu_function.c: attributes of a function or kernel handle (the caller checks the handle) */
CUresult sim_func_attr_get(uintptr_t key, CUfunction_attribute attrib, int *pi);
CUresult sim_func_attr_set(uintptr_t key, CUfunction_attribute attrib, int value);
/* cu_host.c: the page-locked host range holding addr (size 0: a cuMemAllocHost start, size unknown) */
int sim_host_range(uintptr_t addr, uintptr_t *base, size_t *size, unsigned *flags);

#endif
