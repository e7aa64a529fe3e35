/* Driver API: streams, events and stream capture. Each stream has a worker thread that
 * runs its operations in order; the legacy and the per-thread default stream are one stream
 * per context here.
 *
 * Timing follows a GPU's, not the worker's: each stream has a GPU timeline (gpu_ns), the time
 * its last operation is done on the device. An operation reaches the device when its call
 * returns (a kernel `dispatch_us` later: the front end's work before its first block runs) and
 * starts there once the stream's earlier work is done; a kernel then runs on the device's
 * engine, shared by every process, which time-slices between contexts (sim_engine.c), and an
 * event takes the time its stream's timeline reached, or later, when its context gets the
 * engine. So an event recorded on an idle stream of an idle device reads the moment it was
 * recorded, one recorded behind a kernel reads the kernel's end, one recorded while another
 * context runs reads when its own context's turn came, and the worker's own wake-ups (late
 * by what the OS allows) are in no measurement; the worker sleeps until a kernel's end only
 * so that queries and synchronisations see it done when a GPU would.
 *
 * Capture follows the driver's documented rules (cuda.h, the programming guide's "Stream
 * Capture", "Prohibited and Unhandled Operations" and "Invalidation"): while a stream
 * captures, what is queued on it becomes graph nodes (cu_graph.c) instead of running;
 * an event recorded there is a captured event and a stream that waits on it joins the
 * capture (fork), its work coming back to the origin stream through another event (join).
 * An illegal operation returns its error and invalidates the capture(s) concerned; the
 * origin stream then ends the capture with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and a NULL
 * graph. Not simulated: capturing the per-thread default stream (the legacy and per-thread
 * streams are one stream here), cuStreamBeginCaptureToGraph, stream memory operations and
 * prefetches inside a capture. */
#include "sim.h"

#include <errno.h>
#include <sched.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum op_type { OP_KERNEL, OP_CALL };

struct sim_op {
    enum op_type type;
    uint64_t dur_us;
    _Atomic uint64_t submit_ns;           /* when its call returned; 0 until then (see enqueue) */
    void (*fn)(void *);
    void *arg;
    struct sim_op *next;
};

struct sim_stream {
    struct sim_ctx *ctx;
    unsigned flags;
    int priority;
    uint64_t id;                          /* cuStreamGetId: unique in the process */
    pthread_mutex_t m;
    pthread_cond_t cv;
    struct sim_op *head, *tail;
    uint64_t enqueued, completed;
    uint64_t gpu_ns;                      /* the stream's GPU timeline; the worker's alone */
    int has_worker, stop;
    pthread_t worker;
    struct sim_stream *next;              /* all streams of the process */
    /* capture state, under cap_lock */
    struct sim_capture *cap;              /* the capture the stream is in (origin or joined) */
    struct sim_graph_node **deps;         /* what its next captured node depends on */
    size_t ndeps, deps_size;
    unsigned char *edges;                 /* zeroed CUgraphEdgeData for cuStreamGetCaptureInfo_v3 */
    size_t edges_size;
};

struct sim_capture {
    uint64_t id;                          /* unique in the process, never 0 */
    CUstreamCaptureMode mode;
    pthread_t thread;                     /* the thread that began it */
    struct sim_stream *origin;
    struct sim_graph *graph;
    int invalidated;
    struct sim_capture *next;
};

/* Lock order: cap_lock, then streams_lock, then a stream's m or events_lock. */
static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_capture *captures;
static _Atomic int open_captures;         /* lets every call skip cap_lock when nothing captures */
static __thread CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static struct sim_stream *streams;
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000ULL), (long)(t_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* The operation a worker runs now, for the calls that read or move its stream's timeline. */
static __thread struct sim_stream *running_stream;
static __thread uint64_t running_submit_ns;

/* When the stream's GPU timeline starts the operation its worker runs now. */
static uint64_t sim_stream_gpu_time(void)
{
    struct sim_stream *s = running_stream;
    if (!s)
        return sim_now_ns();
    return s->gpu_ns > running_submit_ns ? s->gpu_ns : running_submit_ns;
}

void sim_stream_gpu_reach(uint64_t t_ns)
{
    struct sim_stream *s = running_stream;
    if (s && t_ns > s->gpu_ns)
        s->gpu_ns = t_ns;
}

/* When the op's call returned (stamped by the caller right after it queued the op). */
static uint64_t submitted(const struct sim_op *op)
{
    uint64_t t;
    while (!(t = atomic_load(&op->submit_ns)))
        sched_yield();
    return t;
}

/* A kernel runs on the device's engine (sim_engine.c) a time slice at most at a time, so that a
 * long one of a context that took the engine gives it back after its slice. The worker sleeps
 * until the kernel's end as it stands then: another context's turn can move it later. */
static void run_kernel(struct sim_stream *s, const struct sim_op *op)
{
    uint64_t left = op->dur_us * 1000ULL, slice = sim_config()->timeslice_us * 1000ULL;
    uint64_t submit = submitted(op), ctx = sim_engine_context(s->ctx);
    uint64_t ready = submit + sim_config()->dispatch_us * 1000ULL;
    if (ready < s->gpu_ns)
        ready = s->gpu_ns;
    /* the dispatch NVML sees: what of it the stream's earlier work did not hide */
    uint64_t reached = submit > s->gpu_ns ? submit : s->gpu_ns, lead = ready - reached;
    do {
        uint64_t part = slice && left > slice ? slice : left;
        struct sim_ticket ticket;
        sim_engine_book(s->ctx->dev, ctx, submit, ready, part, lead, &ticket);
        while ((ready = sim_engine_end(s->ctx->dev, &ticket)) > sim_now_ns())
            sleep_until(ready);
        lead = 0;
        left -= part;
    } while (left);
    s->gpu_ns = ready;
}

static void *worker(void *arg)
{
    struct sim_stream *s = arg;
    prctl(PR_SET_TIMERSLACK, 1UL);        /* wake at a kernel's end, not up to 50 us later */
    pthread_mutex_lock(&s->m);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->m);
        if (!s->head)
            break;
        struct sim_op *op = s->head;
        pthread_mutex_unlock(&s->m);
        if (op->type == OP_KERNEL) {
            run_kernel(s, op);
        } else {
            running_stream = s;
            running_submit_ns = submitted(op);
            op->fn(op->arg);
            sim_stream_gpu_reach(running_submit_ns);
            running_stream = NULL;
        }
        pthread_mutex_lock(&s->m);
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->completed++;
        free(op);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->m);
    return NULL;
}

struct sim_stream *sim_stream_new(struct sim_ctx *ctx, unsigned flags)
{
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        abort();
    static _Atomic uint64_t next_id = 1;
    s->ctx = ctx;
    s->flags = flags;
    s->id = next_id++;
    pthread_mutex_init(&s->m, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_lock(&streams_lock);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&streams_lock);
    return s;
}

int sim_stream_stopping(struct sim_stream *s)
{
    pthread_mutex_lock(&s->m);
    int stop = s->stop;
    pthread_mutex_unlock(&s->m);
    return stop;
}

void sim_stream_wait_idle(struct sim_stream *s)
{
    pthread_mutex_lock(&s->m);
    while (s->completed < s->enqueued)
        pthread_cond_wait(&s->cv, &s->m);
    pthread_mutex_unlock(&s->m);
}

static void stream_leave_capture(struct sim_stream *s);

void sim_stream_free(struct sim_stream *s)
{
    stream_leave_capture(s);
    pthread_mutex_lock(&streams_lock);
    for (struct sim_stream **p = &streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&streams_lock);
    pthread_mutex_lock(&s->m);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    int joined = s->has_worker;
    pthread_mutex_unlock(&s->m);
    if (joined)
        pthread_join(s->worker, NULL);
    pthread_mutex_destroy(&s->m);
    pthread_cond_destroy(&s->cv);
    free(s->deps);
    free(s->edges);
    free(s);
}

static void enqueue(struct sim_stream *s, struct sim_op *op)
{
    pthread_mutex_lock(&s->m);
    if (!s->has_worker) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        if (pthread_create(&s->worker, &attr, worker, s) != 0)
            abort();
        pthread_attr_destroy(&attr);
        s->has_worker = 1;
    }
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->enqueued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->m);
    /* The op reaches the device when the call returns, as a doorbell write does: after
     * the worker's wake-up, whose cost (microseconds) a real driver's call does not have.
     * The worker waits for the stamp (submitted). */
    atomic_store(&op->submit_ns, sim_now_ns());
}

void sim_stream_enqueue_kernel(struct sim_stream *s, uint64_t dur_us)
{
    struct sim_op *op = calloc(1, sizeof *op);
    if (!op)
        abort();
    op->type = OP_KERNEL;
    op->dur_us = dur_us;
    enqueue(s, op);
}

void sim_stream_enqueue_call(struct sim_stream *s, void (*fn)(void *), void *arg)
{
    struct sim_op *op = calloc(1, sizeof *op);
    if (!op)
        abort();
    op->type = OP_CALL;
    op->fn = fn;
    op->arg = arg;
    enqueue(s, op);
}

struct sim_ctx *sim_stream_ctx(struct sim_stream *s) { return s->ctx; }

void sim_ctx_sync(struct sim_ctx *ctx)
{
    pthread_mutex_lock(&streams_lock);
    for (struct sim_stream *s = streams; s; s = s->next)
        if (s->ctx == ctx)
            sim_stream_wait_idle(s);
    pthread_mutex_unlock(&streams_lock);
}

void sim_ctx_streams_destroy(struct sim_ctx *ctx)
{
    for (;;) {
        struct sim_stream *victim = NULL;
        pthread_mutex_lock(&streams_lock);
        for (struct sim_stream *s = streams; s && !victim; s = s->next)
            if (s->ctx == ctx)
                victim = s;
        pthread_mutex_unlock(&streams_lock);
        if (!victim)
            return;
        sim_handle_take((uintptr_t)victim, SIM_KIND_STREAM);
        sim_stream_free(victim);
    }
}

CUresult sim_stream_resolve(CUstream h, struct sim_stream **out)
{
    SIM_REQUIRE_INIT();
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct sim_ctx *ctx = sim_ctx_current();
        if (!ctx)
            return CUDA_ERROR_INVALID_CONTEXT;
        *out = ctx->null_stream;
        return CUDA_SUCCESS;
    }
    struct sim_stream *s = sim_handle_get((uintptr_t)h, SIM_KIND_STREAM);
    if (!s || !s->ctx->active)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

/* ---- stream capture: the state every rule reads ---- */

static int is_legacy(CUstream h) { return h == NULL || h == CU_STREAM_LEGACY; }

static struct sim_capture *capture_by_id_locked(uint64_t id)
{
    for (struct sim_capture *c = id ? captures : NULL; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

static void set_deps_locked(struct sim_stream *s, struct sim_graph_node *const *deps, size_t n)
{
    if (n > s->deps_size) {
        struct sim_graph_node **d = realloc(s->deps, n * sizeof *d);
        if (!d)
            abort();
        s->deps = d;
        s->deps_size = n;
    }
    if (n)
        memmove(s->deps, deps, n * sizeof *deps);
    s->ndeps = n;
}

static void add_deps_locked(struct sim_stream *s, struct sim_graph_node *const *deps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < s->ndeps && s->deps[j] != deps[i])
            j++;
        if (j < s->ndeps)
            continue;
        if (s->ndeps == s->deps_size) {
            size_t size = s->deps_size ? 2 * s->deps_size : 4;
            struct sim_graph_node **d = realloc(s->deps, size * sizeof *d);
            if (!d)
                abort();
            s->deps = d;
            s->deps_size = size;
        }
        s->deps[s->ndeps++] = deps[i];
    }
}

/* Invalidates every capture that has a blocking stream of ctx; returns how many
 * (all: any stream of ctx, blocking or not). */
static int invalidate_ctx_captures_locked(struct sim_ctx *ctx, int all)
{
    int hit = 0;
    pthread_mutex_lock(&streams_lock);
    for (struct sim_stream *s = streams; s; s = s->next)
        if (s->cap && s->ctx == ctx && (all || !(s->flags & CU_STREAM_NON_BLOCKING))) {
            s->cap->invalidated = 1;
            hit++;
        }
    pthread_mutex_unlock(&streams_lock);
    return hit;
}

static int ctx_blocking_capture_locked(struct sim_ctx *ctx)
{
    int hit = 0;
    pthread_mutex_lock(&streams_lock);
    for (struct sim_stream *s = streams; s && !hit; s = s->next)
        hit = s->cap && s->ctx == ctx && !(s->flags & CU_STREAM_NON_BLOCKING);
    pthread_mutex_unlock(&streams_lock);
    return hit;
}

/* Takes every stream out of capture c and forgets it (the graph is the caller's). */
static void end_capture_locked(struct sim_capture *c)
{
    pthread_mutex_lock(&streams_lock);
    for (struct sim_stream *s = streams; s; s = s->next)
        if (s->cap == c) {
            s->cap = NULL;
            s->ndeps = 0;
        }
    pthread_mutex_unlock(&streams_lock);
    for (struct sim_capture **p = &captures; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    sim_graph_set_capturing(c->graph, 0);
    open_captures--;
    free(c);
}

/* A stream that goes while it captures: a joined stream just leaves; the origin takes the
 * whole capture with it (nothing could end it any more), its graph discarded. */
static void stream_leave_capture(struct sim_stream *s)
{
    if (!open_captures)
        return;
    pthread_mutex_lock(&cap_lock);
    struct sim_capture *c = s->cap;
    if (c && c->origin == s) {
        struct sim_graph *g = c->graph;
        end_capture_locked(c);
        sim_graph_free(g);
    } else if (c) {
        s->cap = NULL;
        s->ndeps = 0;
    }
    pthread_mutex_unlock(&cap_lock);
}

CUresult sim_stream_op(CUstream h, struct sim_stream **out, int *capturing)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(h, &s);
    *capturing = 0;
    if (rc != CUDA_SUCCESS)
        return rc;
    *out = s;
    if (!open_captures)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&cap_lock);
    if (is_legacy(h) && ctx_blocking_capture_locked(s->ctx)) {
        /* the legacy stream would depend on the capturing streams: refused, and those
         * captures invalidated (the guide's "Invalidation") */
        invalidate_ctx_captures_locked(s->ctx, 0);
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    } else if (s->cap) {
        if (s->cap->invalidated)
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        else
            *capturing = 1;
    }
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

CUresult sim_capture_add(struct sim_stream *s, struct sim_node_desc *d)
{
    CUresult rc;
    pthread_mutex_lock(&cap_lock);
    struct sim_capture *c = s->cap;
    if (!c)                               /* ended by another thread meanwhile */
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (c->invalidated)
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else {
        struct sim_graph_node *n;
        rc = sim_graph_add(c->graph, s->deps, s->ndeps, d, &n);
        if (rc == CUDA_SUCCESS)
            set_deps_locked(s, &n, 1);
        else
            c->invalidated = 1;
    }
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

CUresult sim_capture_refuse(struct sim_stream *s, CUresult rc)
{
    pthread_mutex_lock(&cap_lock);
    if (s->cap)
        s->cap->invalidated = 1;
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

/* cuThreadExchangeStreamCaptureMode's rule: a thread whose mode is not RELAXED may not make a
 * potentially unsafe call while it has a capture of its own not begun RELAXED, nor (mode
 * GLOBAL) while another thread has a capture begun GLOBAL. Those captures are invalidated. A
 * capture already invalidated has nothing left to protect and forbids nothing (ROCm matched
 * CUDA there: later calls proceed). */
CUresult sim_capture_unsafe_call(void)
{
    if (!open_captures || capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    int hit = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&cap_lock);
    for (struct sim_capture *c = captures; c; c = c->next) {
        if (c->invalidated)
            continue;
        int mine = pthread_equal(c->thread, self);
        if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = 1;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&cap_lock);
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult sim_capture_sync_call(struct sim_ctx *ctx)
{
    CUresult rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS || !open_captures)
        return rc;
    pthread_mutex_lock(&cap_lock);
    if (invalidate_ctx_captures_locked(ctx, 0))
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;  /* synchronous work goes through the legacy stream */
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

CUresult sim_capture_ctx_call(struct sim_ctx *ctx)
{
    CUresult rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS || !open_captures)
        return rc;
    pthread_mutex_lock(&cap_lock);
    if (invalidate_ctx_captures_locked(ctx, 1))
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  /* "a broader handle which encompasses an active capture" */
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

/* Synchronising or querying a stream: the unsafe-call rule; a capturing stream holds no work to
 * wait for (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); the legacy stream would wait for capturing
 * blocking streams (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). Either invalidates. */
static CUresult stream_sync_rules(CUstream h, struct sim_stream *s)
{
    CUresult rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS || !open_captures)
        return rc;
    pthread_mutex_lock(&cap_lock);
    if (s->cap) {
        s->cap->invalidated = 1;
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (is_legacy(h) && invalidate_ctx_captures_locked(s->ctx, 0))
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s = sim_stream_new(ctx, Flags);
    sim_handle_put((uintptr_t)s, SIM_KIND_STREAM, s);
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc == CUDA_SUCCESS)
        rc = stream_sync_rules(hStream, s);
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_stream_wait_idle(s);
    sim_pools_sync_trim(s->ctx->dev);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return cuStreamSynchronize(hStream); }

CUresult cuStreamQuery(CUstream hStream)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc == CUDA_SUCCESS)
        rc = stream_sync_rules(hStream, s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&s->m);
    int idle = s->completed == s->enqueued;
    pthread_mutex_unlock(&s->m);
    return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamQuery_ptsz(CUstream hStream) { return cuStreamQuery(hStream); }

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s = sim_handle_take((uintptr_t)hStream, SIM_KIND_STREAM);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_stream_wait_idle(s);
    sim_stream_free(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

/* ---- events ----
 * Each record is its own completion: a wait (cuStreamWaitEvent, cuEventSynchronize) is for the
 * record that was the event's latest when it was asked, whatever records follow on other
 * streams; a query and the elapsed time look at the latest record. */

struct sim_record {
    int refs;                             /* the event while it is the latest, + queued operations */
    int done;
    uint64_t time_ns;
};

struct sim_event {
    unsigned flags;
    struct sim_record *latest;            /* NULL: never recorded (or only in captures) */
    uint64_t cap_id;                      /* last recorded in this capture (0: not); under cap_lock */
    struct sim_graph_node **cap_deps;     /* what a stream waiting on it would depend on */
    size_t ncap_deps;
};

static pthread_mutex_t events_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t events_cv = PTHREAD_COND_INITIALIZER;

static void record_unref_locked(struct sim_record *r)
{
    if (r && --r->refs == 0)
        free(r);
}

/* The event's latest record with one more reference, or NULL when it was never recorded. */
static struct sim_record *latest_record_locked(struct sim_event *ev)
{
    if (ev->latest)
        ev->latest->refs++;
    return ev->latest;
}

static void event_reached(void *arg)
{
    struct sim_record *r = arg;
    uint64_t t = sim_stream_gpu_time();
    struct sim_stream *s = running_stream;
    if (s && t > s->gpu_ns) {             /* on an idle stream: reached once its context has the engine */
        t = sim_engine_turn(s->ctx->dev, sim_engine_context(s->ctx), t);
        sim_stream_gpu_reach(t);
    }
    pthread_mutex_lock(&events_lock);
    r->time_ns = t;
    r->done = 1;
    record_unref_locked(r);
    pthread_cond_broadcast(&events_cv);
    pthread_mutex_unlock(&events_lock);
}

static void wait_record(void *arg)
{
    struct sim_record *r = arg;
    pthread_mutex_lock(&events_lock);
    while (!r->done)
        pthread_cond_wait(&events_cv, &events_lock);
    uint64_t reached = r->time_ns;
    record_unref_locked(r);
    pthread_mutex_unlock(&events_lock);
    sim_stream_gpu_reach(reached);        /* the stream's later work starts after the record's */
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    struct sim_ctx *ctx;
    CUresult rc = sim_ctx_current_checked(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phEvent || (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | 0x4)))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->flags = Flags;
    sim_handle_put((uintptr_t)ev, SIM_KIND_EVENT, ev);
    *phEvent = (CUevent)ev;
    return CUDA_SUCCESS;
}

static void record_on(struct sim_event *ev, struct sim_stream *s)
{
    struct sim_record *r = calloc(1, sizeof *r);
    if (!r)
        abort();
    r->refs = 2;                          /* the event's latest, the queued record */
    pthread_mutex_lock(&events_lock);
    record_unref_locked(ev->latest);
    ev->latest = r;
    pthread_mutex_unlock(&events_lock);
    sim_stream_enqueue_call(s, event_reached, r);
}

/* In a capturing stream a record adds no node: the event then stands for the stream's current
 * dependencies, for streams that wait on it (the guide's "Cross-stream Dependencies"). A record
 * on a stream that does not capture makes the event an ordinary one again. */
CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing || ev->cap_id) {
        pthread_mutex_lock(&cap_lock);
        if (s->cap) {
            struct sim_graph_node **d = s->ndeps ? malloc(s->ndeps * sizeof *d) : NULL;
            if (s->ndeps && !d)
                abort();
            if (s->ndeps)
                memcpy(d, s->deps, s->ndeps * sizeof *d);
            free(ev->cap_deps);
            ev->cap_deps = d;
            ev->ncap_deps = s->ndeps;
            ev->cap_id = s->cap->id;
        } else
            ev->cap_id = 0;
        pthread_mutex_unlock(&cap_lock);
        if (capturing)
            return CUDA_SUCCESS;
    }
    record_on(ev, s);
    return CUDA_SUCCESS;
}

void sim_stream_enqueue_event_record(struct sim_stream *s, CUevent hEvent)
{
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (ev)                               /* an event destroyed since: nothing to record */
        record_on(ev, s);
}

void sim_stream_enqueue_event_wait(struct sim_stream *s, CUevent hEvent)
{
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return;
    pthread_mutex_lock(&events_lock);
    struct sim_record *r = latest_record_locked(ev);
    pthread_mutex_unlock(&events_lock);
    if (r)
        sim_stream_enqueue_call(s, wait_record, r);
}

/* Querying or waiting for an event last recorded in a capture is refused even in RELAXED mode
 * (cuThreadExchangeStreamCaptureMode), and invalidates that capture. */
static CUresult event_sync_rules(struct sim_event *ev)
{
    CUresult rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS || !open_captures)
        return rc;
    pthread_mutex_lock(&cap_lock);
    struct sim_capture *c = capture_by_id_locked(ev->cap_id);
    if (c) {
        c->invalidated = 1;
        rc = CUDA_ERROR_CAPTURED_EVENT;
    }
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) { return cuEventRecord(hEvent, hStream); }

CUresult cuEventQuery(CUevent hEvent)
{
    SIM_REQUIRE_INIT();
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = event_sync_rules(ev);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&events_lock);
    int done = !ev->latest || ev->latest->done;
    pthread_mutex_unlock(&events_lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    SIM_REQUIRE_INIT();
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = event_sync_rules(ev);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&events_lock);
    struct sim_record *r = latest_record_locked(ev);
    while (r && !r->done)
        pthread_cond_wait(&events_cv, &events_lock);
    record_unref_locked(r);
    pthread_mutex_unlock(&events_lock);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    SIM_REQUIRE_INIT();
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *a = sim_handle_get((uintptr_t)hStart, SIM_KIND_EVENT);
    struct sim_event *b = sim_handle_get((uintptr_t)hEnd, SIM_KIND_EVENT);
    if (!a || !b)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&events_lock);
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING || !a->latest || !b->latest)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->latest->done || !b->latest->done)
        rc = CUDA_ERROR_NOT_READY;
    else
        *pMilliseconds = (float)((double)((int64_t)(b->latest->time_ns - a->latest->time_ns)) / 1e6);
    pthread_mutex_unlock(&events_lock);
    return rc;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

/* Queued records and waits keep their own record; the event goes at once. */
CUresult cuEventDestroy_v2(CUevent hEvent)
{
    SIM_REQUIRE_INIT();
    struct sim_event *ev = sim_handle_take((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&events_lock);
    record_unref_locked(ev->latest);
    pthread_mutex_unlock(&events_lock);
    free(ev->cap_deps);
    free(ev);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

/* ---- what the CUDA runtime adds: priorities, queries, cross-stream waits, host callbacks ---- */

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    CUresult rc = cuStreamCreate(phStream, flags);
    if (rc == CUDA_SUCCESS)  /* clamped to the range cuCtxGetStreamPriorityRange reports */
        ((struct sim_stream *)*phStream)->priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    return rc;
}

/* A stream property read back: the stream is checked first, then the output pointer. */
#define STREAM_GETTER(name, type, value)                       \
    CUresult name(CUstream hStream, type *out)                 \
    {                                                          \
        struct sim_stream *s;                                  \
        CUresult rc = sim_stream_resolve(hStream, &s);         \
        if (rc == CUDA_SUCCESS && !out)                        \
            rc = CUDA_ERROR_INVALID_VALUE;                     \
        if (rc == CUDA_SUCCESS)                                \
            *out = (value);                                    \
        return rc;                                             \
    }

STREAM_GETTER(cuStreamGetPriority, int, s->priority)
STREAM_GETTER(cuStreamGetFlags, unsigned int, s->flags)
STREAM_GETTER(cuStreamGetCtx, CUcontext, (CUcontext)s->ctx)
STREAM_GETTER(cuStreamGetId, unsigned long long, s->id)

/* The stream waits for the event's latest record issued before this call. */
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    SIM_REQUIRE_INIT();
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    if (Flags & ~1u)  /* CU_EVENT_WAIT_EXTERNAL */
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (open_captures) {
        int done = 1;
        pthread_mutex_lock(&cap_lock);
        struct sim_capture *c = capture_by_id_locked(ev->cap_id);
        if (c && c->invalidated) {
            /* a stream outside the capture waiting on its event: CUDA_ERROR_INVALID_VALUE, as CUDA
             * answers (ROCm's capture work matched it); a stream in it was refused above */
            rc = CUDA_ERROR_INVALID_VALUE;
        } else if (c && s->cap == c) {
            add_deps_locked(s, ev->cap_deps, ev->ncap_deps);      /* a join */
        } else if (c && s->cap) {
            c->invalidated = s->cap->invalidated = 1;             /* two captures would merge */
            rc = CUDA_ERROR_STREAM_CAPTURE_MERGE;
        } else if (c && is_legacy(hStream)) {
            c->invalidated = 1;                                   /* the legacy stream cannot capture */
            rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        } else if (c) {
            s->cap = c;                                           /* a fork: the stream joins the capture */
            set_deps_locked(s, ev->cap_deps, ev->ncap_deps);
        } else if (s->cap && !(Flags & 1u)) {
            /* "It is invalid to wait on a non-captured event from a stream which is being
             * captured without specifying cudaEventWaitExternal" */
            s->cap->invalidated = 1;
            rc = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        } else
            done = 0;
        pthread_mutex_unlock(&cap_lock);
        if (!done && s->cap) {                                    /* an external wait: a node */
            struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_WAIT_EVENT, .event = hEvent};
            return sim_capture_add(s, &d);
        }
        if (done)
            return rc;
    }
    pthread_mutex_lock(&events_lock);
    struct sim_record *r = latest_record_locked(ev);
    pthread_mutex_unlock(&events_lock);
    if (r)                                /* an event never recorded is complete: nothing to wait for */
        sim_stream_enqueue_call(s, wait_record, r);
    return CUDA_SUCCESS;
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    if (flags & ~1u)  /* CU_EVENT_RECORD_EXTERNAL */
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    if (flags && open_captures) {         /* captured as an event record node */
        struct sim_stream *s;
        int capturing;
        CUresult rc = sim_stream_op(hStream, &s, &capturing);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (!sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT))
            return CUDA_ERROR_INVALID_HANDLE;
        if (capturing) {
            struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD, .event = hEvent};
            return sim_capture_add(s, &d);
        }
    }
    return cuEventRecord(hEvent, hStream);
}

struct host_call { CUstream stream; CUstreamCallback callback; CUhostFn fn; void *user; };

static void run_host_call(void *arg)
{
    struct host_call *c = arg;
    if (c->callback)
        c->callback(c->stream, CUDA_SUCCESS, c->user);
    else
        c->fn(c->user);
    free(c);
    sim_stream_gpu_reach(sim_now_ns());   /* the stream waited for the host */
}

static CUresult enqueue_host_call(CUstream hStream, CUstreamCallback callback, CUhostFn fn, void *user)
{
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(hStream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing && callback)            /* legacy callbacks are not capturable; host functions are */
        return sim_capture_refuse(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (capturing) {
        struct sim_node_desc d = {.type = CU_GRAPH_NODE_TYPE_HOST, .fn = fn, .user = user};
        return sim_capture_add(s, &d);
    }
    struct host_call *c = malloc(sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct host_call){hStream, callback, fn, user};
    sim_stream_enqueue_call(s, run_host_call, c);
    return CUDA_SUCCESS;
}

CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)
{
    if (!callback || flags)
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return enqueue_host_call(hStream, callback, NULL, userData);
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    if (!fn)
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return enqueue_host_call(hStream, NULL, fn, userData);
}

/* ---- stream capture: begin, end, queries ---- */

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_legacy(hStream))               /* "Capture may not be initiated if stream is CU_STREAM_LEGACY" */
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (hStream == CU_STREAM_PER_THREAD)  /* one stream with the legacy one here: not simulated */
        return CUDA_ERROR_NOT_SUPPORTED;
    struct sim_capture *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    static uint64_t next_id = 1;
    pthread_mutex_lock(&cap_lock);
    if (s->cap) {
        /* "it may only be initiated if the stream is not already in capture mode" */
        pthread_mutex_unlock(&cap_lock);
        free(c);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    c->id = next_id++;
    c->mode = mode;
    c->thread = pthread_self();
    c->origin = s;
    c->graph = sim_graph_new();
    sim_graph_set_capturing(c->graph, 1);
    c->next = captures;
    captures = c;
    open_captures++;
    s->cap = c;
    s->ndeps = 0;
    pthread_mutex_unlock(&cap_lock);
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream) { return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL); }

/* Whether work of every stream that joined c reaches the origin stream's current position. */
static int joined_locked(struct sim_capture *c)
{
    int ok = 1;
    pthread_mutex_lock(&streams_lock);
    for (struct sim_stream *s = streams; s && ok; s = s->next) {
        if (s->cap != c || s == c->origin)
            continue;
        for (size_t i = 0; i < s->ndeps && ok; i++) {
            int reached = 0;
            for (size_t j = 0; j < c->origin->ndeps && !reached; j++)
                reached = sim_graph_node_before(s->deps[i], c->origin->deps[j]);
            ok = reached;
        }
    }
    pthread_mutex_unlock(&streams_lock);
    return ok;
}

/* Ending an invalidated or unjoined capture ends it all the same: the streams leave capture
 * mode and the graph is NULL (the guide's "Invalidation"). A wrong stream or thread leaves it
 * open but invalidated. */
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *g = NULL, *discard = NULL;
    pthread_mutex_lock(&cap_lock);
    struct sim_capture *c = s->cap;
    if (!c) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else if (c->origin != s) {
        c->invalidated = 1;
        rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    } else if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
        c->invalidated = 1;
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    } else {
        if (c->invalidated)
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        else if (!joined_locked(c))
            rc = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        if (rc == CUDA_SUCCESS)
            g = c->graph;
        else
            discard = c->graph;
        end_capture_locked(c);
    }
    pthread_mutex_unlock(&cap_lock);
    if (discard)
        sim_graph_free(discard);
    if (c && (rc == CUDA_SUCCESS || discard))
        *phGraph = (CUgraph)g;
    return rc;
}

/* The three generations of the capture query. On the legacy stream while a blocking stream of
 * its context captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the capture left valid (cuda.h). */
CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                                   CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                   const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!captureStatus_out || (edgeData_out && !dependencies_out))
        return CUDA_ERROR_INVALID_VALUE;
    if (!open_captures) {
        *captureStatus_out = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&cap_lock);
    struct sim_capture *c = s->cap;
    if (is_legacy(hStream) && ctx_blocking_capture_locked(s->ctx))
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    else if (!c)
        *captureStatus_out = CU_STREAM_CAPTURE_STATUS_NONE;
    else if (c->invalidated)
        *captureStatus_out = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    else {
        *captureStatus_out = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        if (id_out)
            *id_out = c->id;
        if (graph_out)
            *graph_out = (CUgraph)c->graph;
        if (dependencies_out)
            *dependencies_out = (const CUgraphNode *)s->deps;
        if (edgeData_out) {               /* no edge carries data here: all zero (8 bytes each) */
            if (s->ndeps * 8 > s->edges_size) {
                free(s->edges);
                if (!(s->edges = calloc(s->ndeps, 8)))
                    abort();
                s->edges_size = s->ndeps * 8;
            }
            *edgeData_out = (const CUgraphEdgeData *)s->edges;
        }
        if (numDependencies_out)
            *numDependencies_out = s->ndeps;
    }
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                                   CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                   size_t *numDependencies_out)
{
    return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                                     numDependencies_out);
}

CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out)
{
    return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return cuStreamGetCaptureInfo_v3(hStream, captureStatus, NULL, NULL, NULL, NULL, NULL);
}

/* Flags: 0 adds to the stream's dependency set (CU_STREAM_ADD_CAPTURE_DEPENDENCIES), 1 replaces it. */
CUresult cuStreamUpdateCaptureDependencies_v2(CUstream hStream, CUgraphNode *dependencies,
                                              const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                              unsigned int flags)
{
    (void)dependencyData;
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags > 1 || (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cap_lock);
    if (!s->cap)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    else if (s->cap->invalidated)
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (flags == 1)
        set_deps_locked(s, (struct sim_graph_node *const *)dependencies, numDependencies);
    else
        add_deps_locked(s, (struct sim_graph_node *const *)dependencies, numDependencies);
    pthread_mutex_unlock(&cap_lock);
    return rc;
}

CUresult cuStreamUpdateCaptureDependencies(CUstream hStream, CUgraphNode *dependencies, size_t numDependencies,
                                           unsigned int flags)
{
    return cuStreamUpdateCaptureDependencies_v2(hStream, dependencies, NULL, numDependencies, flags);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    SIM_REQUIRE_INIT();
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

SIM_PER_THREAD(cuStreamGetPriority, ptsz)
SIM_PER_THREAD(cuStreamGetFlags, ptsz)
SIM_PER_THREAD(cuStreamGetCtx, ptsz)
SIM_PER_THREAD(cuStreamGetId, ptsz)
SIM_PER_THREAD(cuStreamWaitEvent, ptsz)
SIM_PER_THREAD(cuEventRecordWithFlags, ptsz)
SIM_PER_THREAD(cuStreamAddCallback, ptsz)
SIM_PER_THREAD(cuLaunchHostFunc, ptsz)
SIM_PER_THREAD(cuStreamIsCapturing, ptsz)
SIM_PER_THREAD(cuStreamGetCaptureInfo, ptsz)
SIM_PER_THREAD(cuStreamBeginCapture, ptsz)
SIM_PER_THREAD(cuStreamBeginCapture_v2, ptsz)
SIM_PER_THREAD(cuStreamEndCapture, ptsz)
SIM_PER_THREAD(cuStreamGetCaptureInfo_v2, ptsz)
SIM_PER_THREAD(cuStreamGetCaptureInfo_v3, ptsz)
SIM_PER_THREAD(cuStreamUpdateCaptureDependencies, ptsz)
SIM_PER_THREAD(cuStreamUpdateCaptureDependencies_v2, ptsz)
