/*
 * A device's compute engine, shared by every process: it runs one context's work at a time
 * and time-slices between contexts, as a GPU without MPS does.
 *
 * - A context gets the engine (its turn) when the engine is idle or the context before it
 *   runs out of work. It keeps it while no other context's work waits, across gaps in its
 *   own work too (nobody else asked for the engine meanwhile). Once another context's work
 *   waits, the running one keeps the engine until `timeslice_us` after its turn began, then
 *   the waiting one takes it, preempting the kernel in progress: that kernel resumes after,
 *   its end moved by what ran between (two intervals in the ring). A context that runs out
 *   of work before its slice ends hands the engine over then, nothing preempted.
 * - The context that took the engine (the guest) keeps it for more of its work queued during
 *   its turn, up to its own slice; then the preempted one's turn resumes, a fresh slice.
 * - An event on an idle stream of a context that waits is reached when its context gets the
 *   engine; one behind its stream's own work is reached in that work's turn. So the wait of
 *   the one that took the engine is in none of its measurements, while the events around a
 *   preempted kernel take in the other's run.
 * - `timeslice_us` 0: no preemption; each context's work runs whole, in booking order.
 *
 * What it was fitted to: the H200 of 2026-11-27, where two containers at 30 and 70 % with
 * 1 ms kernels (libvgpu as of 84b4dcf, NVML's correction not running) did 34.6-34.8 : 65.2
 * of the work: by their kernels' count 29.9 and 56.5 % of the time, by the kernels' own
 * spans 30.2 and 70.8 %. The 70 % one, resident longest, was preempted by the 30 % one's
 * kernels and charged for them. That build reads 33.9-34.8 here (29.2-29.7 and 55.8-57.1 %
 * by count). Variants that did not fit: a turn restarting after each gap in its own work
 * (31.9), an event's context giving the engine back at once when nothing else of it is
 * queued (24.1: the 30 % one's kernels wait a slice behind their start events).
 *
 * Everything is under the device's engine lock (process-shared, robust). Each change under
 * it is a few stores; a holder killed inside leaves at worst one run's interval or end
 * unmoved. Runs not yet over are kept (SIM_ENGINE_RUNS per device) so that a turn taken
 * can move them; their bookers read their end from here until it has passed. A run whose
 * booker died is forgotten a second after its end.
 */
#include "sim.h"

#define SIM_RUN_GRACE_NS 1000000000ULL

static struct sim_device_state *device(int dev)
{
    struct sim_state *s = sim_state();
    return s ? &s->dev[sim_card(dev)] : NULL;
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

static void ring_write(struct sim_device_state *d, uint64_t pos, uint64_t start, uint64_t end, uint32_t pid,
                       uint32_t slot)
{
    struct sim_interval *e = &d->ring[pos % SIM_RING];
    atomic_store(&e->seq, 0);
    e->start_ns = start;
    e->end_ns = end;
    e->pid = pid;
    e->slot = slot;
    atomic_store(&e->seq, pos + 1);
}

static uint64_t ring_add(struct sim_device_state *d, uint64_t start, uint64_t end, uint32_t pid, uint32_t slot)
{
    uint64_t pos = atomic_fetch_add(&d->ring_head, 1);
    ring_write(d, pos, start, end, pid, slot);
    return pos;
}

/* Another context runs `dur` from `at`: the other contexts' work after `at` moves by it; a run
 * in progress at `at` is cut there and resumes after. */
static void make_room(struct sim_device_state *d, uint64_t at, uint64_t dur, uint64_t ctx)
{
    if (!dur)
        return;
    for (int i = 0; i < SIM_ENGINE_RUNS; i++) {
        struct sim_run *r = &d->engine.runs[i];
        if (!r->ticket || r->ctx == ctx || r->end_ns <= at)
            continue;
        struct sim_interval *e = &d->ring[r->ring_pos % SIM_RING];
        int intact = atomic_load(&e->seq) == r->ring_pos + 1;   /* not yet overwritten by the ring's wrap */
        if (r->start_ns >= at) {
            r->start_ns += dur;
            r->end_ns += dur;
            if (intact)
                ring_write(d, r->ring_pos, e->start_ns + dur, r->end_ns, e->pid, e->slot);
        } else {
            r->end_ns += dur;
            if (intact) {
                ring_write(d, r->ring_pos, e->start_ns, at, e->pid, e->slot);
                r->ring_pos = ring_add(d, at + dur, r->end_ns, e->pid, e->slot);
            }
        }
    }
}

static int free_run(struct sim_engine *e, uint64_t now)
{
    for (int pass = 0; pass < 2; pass++) {
        uint64_t grace = pass ? 0 : SIM_RUN_GRACE_NS;
        for (int i = 0; i < SIM_ENGINE_RUNS; i++)
            if (!e->runs[i].ticket || e->runs[i].end_ns + grace <= now)
                return i;
    }
    return -1;
}

uint64_t sim_engine_book(int dev, uint64_t ctx, uint64_t queued_ns, uint64_t ready_ns, uint64_t dur_ns,
                         uint64_t lead_ns, struct sim_ticket *t)
{
    struct sim_device_state *d = device(dev);
    t->run = -1;
    if (!d) {
        t->end_ns = ready_ns + dur_ns;
        return ready_ns;
    }
    uint32_t pid, slot;
    sim_self_ids(&pid, &slot);            /* before the lock: the first may ask the pid service */
    struct sim_engine *e = &d->engine;
    uint64_t slice = sim_config()->timeslice_us * 1000ULL, now = sim_now_ns(), start;
    sim_mutex_lock_shared(&e->lock);
    if (e->busy_until_ns < ready_ns || (e->busy_until_ns == ready_ns && e->owner != ctx)) {
        start = ready_ns;                 /* the engine is idle: a turn begins */
        if (e->owner != ctx)
            e->owner_since_ns = start;
        e->owner = ctx;
        e->guest = 0;
        e->busy_until_ns = start + dur_ns;
    } else if (e->owner == ctx) {
        start = e->busy_until_ns;         /* behind its own work */
        e->busy_until_ns += dur_ns;
    } else if (e->guest == ctx && queued_ns <= e->guest_end_ns &&
               (!slice || e->guest_end_ns - e->guest_since_ns < slice)) {
        start = max_u64(e->guest_end_ns, ready_ns);   /* more of the guest's work, queued in its turn */
        make_room(d, e->guest_end_ns, start + dur_ns - e->guest_end_ns, ctx);
        e->busy_until_ns += start + dur_ns - e->guest_end_ns;
        e->guest_end_ns = e->owner_since_ns = start + dur_ns;
    } else {
        uint64_t turn = slice ? max_u64(max_u64(ready_ns, e->owner_since_ns + slice), now) : UINT64_MAX;
        if (turn >= e->busy_until_ns) {
            start = e->busy_until_ns;     /* the owner runs out of work first: this context's turn follows */
            e->owner = ctx;
            e->owner_since_ns = start;
            e->guest = 0;
            e->busy_until_ns += dur_ns;
        } else {
            start = turn;                 /* the owner's slice ends first: this context takes the engine */
            make_room(d, start, dur_ns, ctx);
            e->guest = ctx;
            e->guest_since_ns = start;
            e->guest_end_ns = e->owner_since_ns = start + dur_ns;
            e->busy_until_ns += dur_ns;
        }
    }
    /* the front end's work on the launch shows only where nothing of another context's hid it */
    uint64_t pos = ring_add(d, start == ready_ns ? start - lead_ns : start, start + dur_ns, pid, slot);
    t->end_ns = start + dur_ns;
    int i = free_run(e, now);
    if (i >= 0) {
        e->runs[i] = (struct sim_run){++e->tickets, ctx, start, start + dur_ns, pos};
        t->run = i;
        t->ticket = e->runs[i].ticket;
    }
    pthread_mutex_unlock(&e->lock);
    return start;
}

uint64_t sim_engine_end(int dev, struct sim_ticket *t)
{
    struct sim_device_state *d = device(dev);
    if (!d || t->run < 0)
        return t->end_ns;
    struct sim_engine *e = &d->engine;
    sim_mutex_lock_shared(&e->lock);
    struct sim_run *r = &e->runs[t->run];
    if (r->ticket == t->ticket) {
        t->end_ns = r->end_ns;
        if (t->end_ns <= sim_now_ns()) {  /* over: nothing can move it any more */
            r->ticket = 0;
            t->run = -1;
        }
    } else {
        t->run = -1;
    }
    pthread_mutex_unlock(&e->lock);
    return t->end_ns;
}

uint64_t sim_engine_turn(int dev, uint64_t ctx, uint64_t t_ns)
{
    struct sim_device_state *d = device(dev);
    if (!d)
        return t_ns;
    struct sim_engine *e = &d->engine;
    uint64_t slice = sim_config()->timeslice_us * 1000ULL, at = t_ns;
    sim_mutex_lock_shared(&e->lock);
    if (e->busy_until_ns > at) {
        if (e->guest && e->guest != ctx && e->guest_since_ns <= at && at < e->guest_end_ns)
            at = e->guest_end_ns;         /* another context's turn runs now */
        if (e->owner != ctx && !(e->guest == ctx && at <= e->guest_end_ns)) {
            uint64_t turn = slice ? max_u64(at, e->owner_since_ns + slice) : e->busy_until_ns;
            at = turn < e->busy_until_ns ? turn : e->busy_until_ns;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return at;
}

uint64_t sim_engine_context(const void *ctx)
{
    uint32_t pid, slot;
    sim_self_ids(&pid, &slot);
    return ((uint64_t)(slot + 1) << 48) ^ (uint64_t)(uintptr_t)ctx;
}
