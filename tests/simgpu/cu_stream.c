/* Driver API: streams and events. Each stream has a worker thread that runs its
 * operations in order; a kernel books its duration on the device timeline shared
 * by all processes and the worker sleeps until it ends. The legacy and the
 * per-thread default stream are one stream per context here. */
#include "sim.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

enum op_type { OP_KERNEL, OP_CALL };

struct sim_op {
    enum op_type type;
    uint64_t dur_us;
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
    int has_worker, stop;
    pthread_t worker;
    struct sim_stream *next;              /* all streams of the process */
};

static struct sim_stream *streams;
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000ULL), (long)(t_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void *worker(void *arg)
{
    struct sim_stream *s = arg;
    pthread_mutex_lock(&s->m);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->m);
        if (!s->head)
            break;
        struct sim_op *op = s->head;
        pthread_mutex_unlock(&s->m);
        if (op->type == OP_KERNEL) {
            uint64_t dur_ns = op->dur_us * 1000ULL;
            uint64_t end = sim_book_kernel(s->ctx->dev, dur_ns) + dur_ns;
            if (end > sim_now_ns())
                sleep_until(end);
        } else {
            op->fn(op->arg);
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

void sim_stream_free(struct sim_stream *s)
{
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
    struct sim_record *latest;            /* NULL: never recorded */
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
    pthread_mutex_lock(&events_lock);
    r->time_ns = sim_now_ns();
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
    record_unref_locked(r);
    pthread_mutex_unlock(&events_lock);
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

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    SIM_REQUIRE_INIT();
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_record *r = calloc(1, sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r->refs = 2;                          /* the event's latest, the queued record */
    pthread_mutex_lock(&events_lock);
    record_unref_locked(ev->latest);
    ev->latest = r;
    pthread_mutex_unlock(&events_lock);
    sim_stream_enqueue_call(s, event_reached, r);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) { return cuEventRecord(hEvent, hStream); }

CUresult cuEventQuery(CUevent hEvent)
{
    SIM_REQUIRE_INIT();
    struct sim_event *ev = sim_handle_get((uintptr_t)hEvent, SIM_KIND_EVENT);
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
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
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
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
}

static CUresult enqueue_host_call(CUstream hStream, CUstreamCallback callback, CUhostFn fn, void *user)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
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

/* Stream capture (graphs from streams) is not simulated: no stream is ever capturing. */
STREAM_GETTER(cuStreamIsCapturing, CUstreamCaptureStatus, CU_STREAM_CAPTURE_STATUS_NONE)

/* Stream capture is not simulated: beginning one is refused on a valid stream, and no stream
 * can end one. */
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuStreamBeginCapture(CUstream hStream) { return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL); }

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    return phGraph ? CUDA_ERROR_ILLEGAL_STATE : CUDA_ERROR_INVALID_VALUE;
}

/* The three generations of the capture query: never capturing, so nothing besides the status. */
CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                                   CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                   const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    (void)id_out, (void)graph_out, (void)dependencies_out, (void)edgeData_out, (void)numDependencies_out;
    if (!captureStatus_out)
        return sim_cuda_initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return cuStreamIsCapturing(hStream, captureStatus_out);  /* the other outputs are set only while capturing */
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

static __thread CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

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
