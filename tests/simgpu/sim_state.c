/*
 * The state every process of the simulated machine shares: a file (HAMI_SIM_STATE,
 * default /dev/shm/hami-sim.state) mapped by each of them.
 *
 * - Creation: a complete file is written under a temporary name and link()ed into
 *   place, so nobody sees a half-made one.
 * - Memory: each process owns one slot; its usage lives only there. Claims and
 *   charges take a process-shared robust mutex; a holder killed inside it leaves
 *   the mutex EOWNERDEAD, the next locker marks it consistent, and since every
 *   change under the lock is a single store nothing is left half-done.
 * - Reclaim: a slot whose process is gone (no /proc entry, a zombie, or another
 *   start time: the pid was reused) is freed by whoever looks next. Slots from
 *   another pid namespace cannot be checked that way: they count as alive until
 *   their heartbeat (updated every second) is `stale_seconds` old (config, default 10).
 *   A caller in the host's pid namespace checks a slot whose host pid is known (the
 *   pid service answered) by that pid, as a real driver sees the process go: gone, a
 *   zombie, or a process of another namespace or pid there is the slot's end.
 * - Kernels: a device's engine (sim_engine.c) books them, one context's at a time, so no
 *   two kernels overlap on one device, across processes. Each run goes to a ring that
 *   utilisation is computed from.
 * - Pids: what NVML reports is each process's pid in the host's pid namespace, as a
 *   real driver's (the kernel's) view is. A process in that namespace knows it; one
 *   in another asks the pid service beside the state file (sim_pid_service.c),
 *   which gets it from the kernel; with no service it knows only its own pid as its
 *   namespace sees it, and readers in the host's namespace find its host pid in
 *   /proc (sim_pids.c).
 */
#include "sim.h"
#include "sim_pids.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SIM_INIT_PIDNS 0xEFFFFFFCULL            /* the kernel's inode of the host's pid namespace */
#define SIM_PID_SERVICE "host-pids.sock"         /* beside the state file */

static struct sim_state *state;
static int state_failed;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

static int self_slot = -1;
static uint32_t self_pid, self_host_pid;
static uint32_t self_host_pid_known;   /* self_host_pid is the host's: own namespace, or the service */
static uint64_t self_start, self_pidns;
static int heartbeat_started;
static char state_path[4096];

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void sim_spin_us(uint64_t us)
{
    uint64_t until = sim_now_ns() + us * 1000ULL;
    while (sim_now_ns() < until)
        ;
}

void sim_sleep_us(uint64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (us && nanosleep(&ts, &ts) != 0)
        ;
}

int sim_read_proc(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

/* Start time (field 22) and state letter of /proc/<pid>/stat; -1 when there is none. */
static int proc_stat(uint32_t pid, uint64_t *start_time, char *letter)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    if (sim_read_proc(path, buf, sizeof buf) != 0)
        return -1;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return -1;
    p += 2;
    *letter = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    *start_time = strtoull(p, NULL, 10);
    return 0;
}

static uint64_t pidns_inode(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

struct slot_id { int index; uint32_t pid; uint64_t start, pidns, heartbeat; uint32_t host_pid, host_known; };

/* A same-namespace process that still exists and whose /proc entry some process read
 * less than 100 ms ago is taken as alive without reading it again: sweeps stay cheap
 * when many processes query at once. A reaped process is noticed at once (kill fails),
 * a zombie or a reused pid within 100 ms. */
#define SIM_VERIFIED_NS 100000000ULL

/* The innermost pid of host process `host_pid` (the last NSpid of its status), the inode of its
 * pid namespace and its state letter; -1 when it is gone. */
static int host_view(uint32_t host_pid, uint32_t *inner, uint64_t *pidns, char *letter)
{
    char path[64], buf[2048];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%u/ns/pid", host_pid);
    if (stat(path, &st) != 0)
        return -1;
    *pidns = (uint64_t)st.st_ino;
    snprintf(path, sizeof path, "/proc/%u/status", host_pid);
    if (sim_read_proc(path, buf, sizeof buf) != 0)
        return -1;
    const char *state = strstr(buf, "\nState:");
    const char *nspid = strstr(buf, "\nNSpid:");
    if (!state || !nspid)
        return -1;
    for (state += 8; *state == ' ' || *state == '\t'; state++)
        ;
    *letter = *state;
    const char *end = strchr(nspid + 1, '\n');
    const char *last = end ? end : nspid + strlen(nspid);
    while (last > nspid && (last[-1] < '0' || last[-1] > '9'))
        last--;
    const char *first = last;
    while (first > nspid && first[-1] >= '0' && first[-1] <= '9')
        first--;
    *inner = (uint32_t)strtoul(first, NULL, 10);
    return 0;
}

/* Another namespace's slot seen from the host's: its process by its host pid. */
static int host_slot_alive(struct sim_proc_slot *p, const struct slot_id *id, uint64_t now)
{
    if (kill((pid_t)id->host_pid, 0) != 0 && errno == ESRCH)
        return 0;
    if (now - atomic_load(&p->verified_ns) < SIM_VERIFIED_NS)
        return 1;
    uint32_t inner;
    uint64_t pidns;
    char letter;
    if (host_view(id->host_pid, &inner, &pidns, &letter) < 0)
        return kill((pid_t)id->host_pid, 0) == 0 || errno == EPERM;
    if (letter == 'Z' || letter == 'X' || pidns != id->pidns || inner != id->pid)
        return 0;  /* exited, or the host pid is another process's now */
    atomic_store(&p->verified_ns, now);
    return 1;
}

static int slot_alive(struct sim_proc_slot *p, const struct slot_id *id)
{
    uint64_t now = sim_now_ns();
    if (id->pidns && self_pidns && id->pidns != self_pidns) {
        if (self_pidns == SIM_INIT_PIDNS && id->host_known && id->host_pid)
            return host_slot_alive(p, id, now);
        return now - id->heartbeat < (uint64_t)sim_config()->stale_seconds * 1000000000ULL;
    }
    if (kill((pid_t)id->pid, 0) != 0 && errno == ESRCH)
        return 0;
    if (now - atomic_load(&p->verified_ns) < SIM_VERIFIED_NS)
        return 1;
    uint64_t start;
    char letter;
    if (proc_stat(id->pid, &start, &letter) < 0)
        return kill((pid_t)id->pid, 0) == 0 || errno == EPERM;
    if (letter == 'Z' || letter == 'X')
        return 0;  /* exited: a real driver has released its memory already */
    if (id->start != 0 && start != id->start)
        return 0;  /* the pid was reused */
    atomic_store(&p->verified_ns, now);
    return 1;
}

void sim_mutex_init_shared(pthread_mutex_t *m)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &attr);
    pthread_mutexattr_destroy(&attr);
}

void sim_mutex_lock_shared(pthread_mutex_t *m)
{
    if (pthread_mutex_lock(m) == EOWNERDEAD)
        pthread_mutex_consistent(m);
}

static void state_lock(struct sim_state *s) { sim_mutex_lock_shared(&s->lock); }

static void state_unlock(struct sim_state *s) { pthread_mutex_unlock(&s->lock); }

static void init_fresh(struct sim_state *s, const struct sim_config *cfg)
{
    sim_mutex_init_shared(&s->lock);
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        sim_mutex_init_shared(&s->dev[d].engine.lock);
    s->version = SIM_STATE_VERSION;
    s->devices = (uint32_t)cfg->devices;
    s->memory_bytes = cfg->memory_mib * SIM_MIB;
    s->magic = SIM_STATE_MAGIC;
}

static struct sim_state *map_fd(int fd)
{
    void *p = mmap(NULL, sizeof(struct sim_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Writes a fresh state under a temporary name and links it into place. */
static int create_state(const char *path, const struct sim_config *cfg, int replace)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%llu", path, (int)getpid(), (unsigned long long)sim_now_ns());
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return -1;
    fchmod(fd, 0666);  /* containers with other uids share it */
    int rc = -1;
    struct sim_state *s = NULL;
    if (ftruncate(fd, sizeof(struct sim_state)) == 0 && (s = map_fd(fd))) {
        init_fresh(s, cfg);
        msync(s, 4096, MS_SYNC);
        if (replace ? rename(tmp, path) == 0 : link(tmp, path) == 0 || errno == EEXIST)
            rc = 0;
        munmap(s, sizeof(struct sim_state));
    }
    int saved = errno;
    unlink(tmp);
    close(fd);
    errno = saved;
    return rc;
}

static struct sim_state *open_state(void)
{
    const struct sim_config *cfg = sim_config();
    if (!cfg)
        return NULL;
    const char *path = getenv("HAMI_SIM_STATE");
    if (!path || !*path)
        path = "/dev/shm/hami-sim.state";
    snprintf(state_path, sizeof state_path, "%s", path);
    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            if (create_state(path, cfg, 0) < 0) {
                fprintf(stderr, "hami-sim: HAMI_SIM_STATE=%s: cannot create: %s\n", path, strerror(errno));
                return NULL;
            }
            continue;
        }
        if (fd < 0) {
            fprintf(stderr, "hami-sim: HAMI_SIM_STATE=%s: cannot open: %s\n", path, strerror(errno));
            return NULL;
        }
        struct stat st;
        struct sim_state *s = NULL;
        struct { uint64_t magic; uint32_t version; } head = {0, 0};
        if (pread(fd, &head, sizeof head, 0) == (ssize_t)sizeof head && head.magic == SIM_STATE_MAGIC &&
            head.version < SIM_STATE_VERSION) {
            /* left by an older build of the simulator: start a fresh machine */
            close(fd);
            fprintf(stderr, "hami-sim: HAMI_SIM_STATE=%s: replacing a state file of version %u\n", path,
                    head.version);
            if (create_state(path, cfg, 1) < 0) {
                fprintf(stderr, "hami-sim: HAMI_SIM_STATE=%s: cannot replace: %s\n", path, strerror(errno));
                return NULL;
            }
            continue;
        }
        if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct sim_state))
            s = map_fd(fd);
        close(fd);
        if (!s || s->magic != SIM_STATE_MAGIC || s->version != SIM_STATE_VERSION) {
            fprintf(stderr, "hami-sim: HAMI_SIM_STATE=%s: not a state file of version %d\n", path,
                    SIM_STATE_VERSION);
            if (s)
                munmap(s, sizeof(struct sim_state));
            return NULL;
        }
        if (s->devices != (uint32_t)cfg->devices || s->memory_bytes != cfg->memory_mib * SIM_MIB) {
            fprintf(stderr, "hami-sim: HAMI_SIM_STATE=%s: made for %u devices x %llu MiB, config says %d x %llu MiB\n",
                    path, s->devices, (unsigned long long)(s->memory_bytes / SIM_MIB), cfg->devices,
                    (unsigned long long)cfg->memory_mib);
            munmap(s, sizeof(struct sim_state));
            return NULL;
        }
        return s;
    }
    fprintf(stderr, "hami-sim: HAMI_SIM_STATE=%s: cannot open\n", path);
    return NULL;
}

/* This process's pid in the host's pid namespace (see the header comment). */
static uint32_t ask_host_pid(void)
{
    if (self_pidns == SIM_INIT_PIDNS) {
        __atomic_store_n(&self_host_pid_known, 1, __ATOMIC_RELEASE);
        return self_pid;
    }
    char dir[sizeof state_path];
    snprintf(dir, sizeof dir, "%s", state_path);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int len = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s", dirname(dir), SIM_PID_SERVICE);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    uint32_t pid = 0;
    if (fd >= 0 && len < (int)sizeof addr.sun_path &&
        connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
        struct timeval wait = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
        char line[32] = "";
        ssize_t n = read(fd, line, sizeof line - 1);
        if (n > 0) {
            line[n] = '\0';
            pid = (uint32_t)strtoul(line, NULL, 10);
        }
    }
    if (fd >= 0)
        close(fd);
    if (pid)
        __atomic_store_n(&self_host_pid_known, 1, __ATOMIC_RELEASE);
    return pid ? pid : self_pid;
}

static uint32_t host_pid(void)
{
    uint32_t pid = __atomic_load_n(&self_host_pid, __ATOMIC_ACQUIRE);
    if (!pid) {
        pid = ask_host_pid();
        __atomic_store_n(&self_host_pid, pid, __ATOMIC_RELEASE);
    }
    return pid;
}

static void forget_self_in_child(void)
{
    self_slot = -1;
    heartbeat_started = 0;
    self_pid = (uint32_t)getpid();
    self_host_pid = 0;
    self_host_pid_known = 0;
}

struct sim_state *sim_state(void)
{
    struct sim_state *s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s || state_failed)
        return s;
    pthread_mutex_lock(&open_lock);
    if (!state && !state_failed) {
        s = open_state();
        if (!s) {
            state_failed = 1;
        } else {
            self_pid = (uint32_t)getpid();
            char letter;
            if (proc_stat(self_pid, &self_start, &letter) < 0)
                self_start = 0;
            self_pidns = pidns_inode();
            host_pid();
            pthread_atfork(NULL, NULL, forget_self_in_child);
            __atomic_store_n(&state, s, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&open_lock);
    return state;
}

static void *heartbeat(void *arg)
{
    struct sim_proc_slot *slot = arg;
    /* four beats per stale period, at most one a second */
    uint64_t period_ns = (uint64_t)sim_config()->stale_seconds * 1000000000ULL / 4;
    if (period_ns > SIM_HEARTBEAT_NS)
        period_ns = SIM_HEARTBEAT_NS;
    struct timespec ts = {(time_t)(period_ns / 1000000000ULL), (long)(period_ns % 1000000000ULL)};
    for (;;) {
        atomic_store(&slot->heartbeat_ns, sim_now_ns());
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Reclaims the slots of processes that are gone. Liveness is checked without the lock
 * (it reads /proc); a slot is cleared under it only if it still holds the process that
 * was found dead. */
static void reclaim(struct sim_state *s, int locked, const struct slot_id *dead, int n)
{
    if (!locked)
        state_lock(s);
    for (int k = 0; k < n; k++) {
        struct sim_proc_slot *p = &s->procs[dead[k].index];
        if (!p->live || p->pid != dead[k].pid || p->start_time != dead[k].start || p->pidns != dead[k].pidns)
            continue;
        for (int d = 0; d < SIM_MAX_DEVICES; d++) {
            atomic_store(&p->used[d], 0);
            atomic_store(&p->contexts[d], 0);
        }
        atomic_store(&p->managed, 0);
        __atomic_store_n(&p->live, 0, __ATOMIC_RELEASE);
    }
    if (!locked)
        state_unlock(s);
}

static void sweep(struct sim_state *s, int locked)
{
    struct slot_id dead[32];
    int n = 0;
    int hwm = (int)__atomic_load_n(&s->slot_hwm, __ATOMIC_ACQUIRE);
    for (int i = 0; i < hwm && i < SIM_MAX_PROCS; i++) {
        struct sim_proc_slot *p = &s->procs[i];
        if (!__atomic_load_n(&p->live, __ATOMIC_ACQUIRE) || i == self_slot)
            continue;
        struct slot_id id = {i, p->pid, p->start_time, p->pidns, atomic_load(&p->heartbeat_ns), p->host_pid,
                             __atomic_load_n(&p->host_pid_known, __ATOMIC_ACQUIRE)};
        if (slot_alive(p, &id))
            continue;
        dead[n++] = id;
        if (n == (int)(sizeof dead / sizeof *dead)) {
            reclaim(s, locked, dead, n);
            n = 0;
        }
    }
    if (n)
        reclaim(s, locked, dead, n);
}

/* This process's slot, claimed on first use (state lock held). */
static struct sim_proc_slot *self_locked(struct sim_state *s)
{
    if (self_slot >= 0)  /* reset in a forked child */
        return &s->procs[self_slot];
    self_pid = (uint32_t)getpid();
    char letter;
    if (proc_stat(self_pid, &self_start, &letter) < 0)
        self_start = 0;
    self_pidns = pidns_inode();
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < SIM_MAX_PROCS; i++) {
            struct sim_proc_slot *p = &s->procs[i];
            if (p->live)
                continue;
            p->pid = self_pid;
            /* asked when the state was opened (a forked child's not yet: never under the lock) */
            p->host_pid = self_host_pid ? self_host_pid : self_pid;
            p->host_pid_known = self_host_pid ? __atomic_load_n(&self_host_pid_known, __ATOMIC_ACQUIRE) : 0;
            p->start_time = self_start;
            p->pidns = self_pidns;
            atomic_store(&p->heartbeat_ns, sim_now_ns());
            atomic_store(&p->verified_ns, 0);
            for (int d = 0; d < SIM_MAX_DEVICES; d++) {
                atomic_store(&p->used[d], 0);
                atomic_store(&p->contexts[d], 0);
            }
            atomic_store(&p->managed, 0);
            __atomic_store_n(&p->live, 1, __ATOMIC_RELEASE);
            self_slot = i;
            if (s->slot_hwm < (uint32_t)i + 1)
                __atomic_store_n(&s->slot_hwm, (uint32_t)i + 1, __ATOMIC_RELEASE);
            if (!heartbeat_started) {
                pthread_t t;
                pthread_attr_t attr;
                pthread_attr_init(&attr);
                pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                pthread_attr_setstacksize(&attr, 64 * 1024);
                if (pthread_create(&t, &attr, heartbeat, p) == 0)
                    heartbeat_started = 1;
                pthread_attr_destroy(&attr);
            }
            return p;
        }
        sweep(s, 1);
    }
    return NULL;
}

static uint64_t sum_used_locked(struct sim_state *s, int card)
{
    uint64_t total = 0;
    for (int i = 0; i < (int)s->slot_hwm; i++)
        if (s->procs[i].live)
            total += atomic_load(&s->procs[i].used[card]);
    return total;
}

int sim_charge(int dev, uint64_t bytes)
{
    struct sim_state *s = sim_state();
    if (!s || bytes > s->memory_bytes)
        return -1;
    int card = sim_card(dev);
    state_lock(s);
    struct sim_proc_slot *me = self_locked(s);
    int rc = -1;
    if (me) {
        uint64_t used = sum_used_locked(s, card);
        if (used + bytes > s->memory_bytes) {
            state_unlock(s);
            sweep(s, 0);
            state_lock(s);
            used = sum_used_locked(s, card);
        }
        if (used + bytes <= s->memory_bytes) {
            atomic_fetch_add(&me->used[card], bytes);
            rc = 0;
        }
    }
    state_unlock(s);
    return rc;
}

void sim_uncharge(int dev, uint64_t bytes)
{
    struct sim_state *s = sim_state();
    if (!s || self_slot < 0)
        return;
    _Atomic uint64_t *used = &s->procs[self_slot].used[sim_card(dev)];
    uint64_t cur = atomic_load(used);
    while (!atomic_compare_exchange_weak(used, &cur, cur > bytes ? cur - bytes : 0))
        ;
}

static uint64_t sum_managed_locked(struct sim_state *s)
{
    uint64_t total = 0;
    for (int i = 0; i < (int)s->slot_hwm; i++)
        if (s->procs[i].live)
            total += atomic_load(&s->procs[i].managed);
    return total;
}

int sim_charge_host(uint64_t bytes)
{
    struct sim_state *s = sim_state();
    uint64_t budget = sim_config()->host_memory_mib * SIM_MIB;
    if (!s || bytes > budget)
        return -1;
    state_lock(s);
    struct sim_proc_slot *me = self_locked(s);
    int rc = -1;
    if (me) {
        uint64_t used = sum_managed_locked(s);
        if (used + bytes > budget) {
            state_unlock(s);
            sweep(s, 0);
            state_lock(s);
            used = sum_managed_locked(s);
        }
        if (used + bytes <= budget) {
            atomic_fetch_add(&me->managed, bytes);
            rc = 0;
        }
    }
    state_unlock(s);
    return rc;
}

void sim_uncharge_host(uint64_t bytes)
{
    struct sim_state *s = sim_state();
    if (!s || self_slot < 0)
        return;
    _Atomic uint64_t *managed = &s->procs[self_slot].managed;
    uint64_t cur = atomic_load(managed);
    while (!atomic_compare_exchange_weak(managed, &cur, cur > bytes ? cur - bytes : 0))
        ;
}

void sim_context_count(int dev, int delta)
{
    struct sim_state *s = sim_state();
    if (!s)
        return;
    state_lock(s);
    struct sim_proc_slot *me = self_locked(s);
    if (me) {
        int card = sim_card(dev);
        uint32_t cur = atomic_load(&me->contexts[card]);
        atomic_store(&me->contexts[card], delta < 0 && cur == 0 ? 0 : cur + (uint32_t)delta);
    }
    state_unlock(s);
}

uint64_t sim_device_used(int dev)
{
    struct sim_state *s = sim_state();
    if (!s)
        return 0;
    sweep(s, 0);
    state_lock(s);
    uint64_t used = sum_used_locked(s, sim_card(dev));
    state_unlock(s);
    return used;
}

unsigned sim_device_procs(int dev, struct sim_proc_usage *out, unsigned max)
{
    struct sim_state *s = sim_state();
    if (!s)
        return 0;
    unsigned n = 0;
    int card = sim_card(dev);
    sweep(s, 0);
    sim_pids_resolve(s);
    state_lock(s);
    for (int i = 0; i < (int)s->slot_hwm; i++) {
        struct sim_proc_slot *p = &s->procs[i];
        uint64_t used = atomic_load(&p->used[card]);
        if (!p->live || (used == 0 && atomic_load(&p->contexts[card]) == 0))
            continue;
        /* one process, one entry: a second copy of the driver in it (dlmopen) has a slot of its own */
        uint32_t pid = sim_pid_shown(s, i);
        unsigned k = 0;
        while (k < n && k < max && out[k].pid != pid)
            k++;
        if (k < n && k < max) {
            out[k].used += used;
            continue;
        }
        if (n < max)
            out[n] = (struct sim_proc_usage){pid, used};
        n++;
    }
    state_unlock(s);
    return n;
}

void sim_self_ids(uint32_t *pid, uint32_t *slot)
{
    *pid = host_pid();
    *slot = (uint32_t)self_slot;
}

/* Calls fn for every completely written interval overlapping [from, to]. */
static void each_interval(int dev, uint64_t from, uint64_t to,
                          void (*fn)(const struct sim_interval *, uint64_t, uint64_t, void *), void *arg)
{
    struct sim_state *s = sim_state();
    if (!s)
        return;
    struct sim_device_state *d = &s->dev[sim_card(dev)];
    sim_pids_resolve(s);
    uint64_t head = atomic_load(&d->ring_head);
    uint64_t n = head < SIM_RING ? head : SIM_RING;
    unsigned older = 0;
    for (uint64_t k = 0; k < n; k++) {
        struct sim_interval *e = &d->ring[(head - 1 - k) % SIM_RING];
        uint64_t seq = atomic_load(&e->seq);
        struct sim_interval copy = {.start_ns = e->start_ns, .end_ns = e->end_ns, .pid = e->pid, .slot = e->slot};
        if (seq == 0 || atomic_load(&e->seq) != seq)
            continue;
        /* the ring is in booking order up to races between bookers: stop well past `from` */
        if (copy.end_ns < from && ++older > 64)
            break;
        uint64_t a = copy.start_ns > from ? copy.start_ns : from;
        uint64_t b = copy.end_ns < to ? copy.end_ns : to;
        if (b > a) {
            copy.pid = sim_interval_pid(s, copy.pid, copy.slot);
            fn(&copy, a, b, arg);
        }
    }
}

struct busy_sum { uint32_t pid; uint64_t ns; };

static void add_busy(const struct sim_interval *e, uint64_t a, uint64_t b, void *arg)
{
    struct busy_sum *sum = arg;
    if (!sum->pid || sum->pid == e->pid)
        sum->ns += b - a;
}

uint64_t sim_busy_ns(int dev, uint32_t pid, uint64_t from, uint64_t to)
{
    struct busy_sum sum = {pid, 0};
    each_interval(dev, from, to, add_busy, &sum);
    return sum.ns;
}

struct pid_list { uint32_t *pids; uint64_t *last_end; unsigned n, max; };

static void add_pid(const struct sim_interval *e, uint64_t a, uint64_t b, void *arg)
{
    (void)a;
    struct pid_list *l = arg;
    for (unsigned i = 0; i < l->n; i++) {
        if (l->pids[i] == e->pid) {
            if (b > l->last_end[i])
                l->last_end[i] = b;
            return;
        }
    }
    if (l->n < l->max) {
        l->pids[l->n] = e->pid;
        l->last_end[l->n] = b;
        l->n++;
    }
}

unsigned sim_busy_pids(int dev, uint64_t from, uint64_t to, uint32_t *pids, uint64_t *last_end, unsigned max)
{
    struct pid_list l = {pids, last_end, 0, max};
    each_interval(dev, from, to, add_pid, &l);
    return l.n;
}

/* A process that exits normally gives its memory back at once. */
__attribute__((destructor)) static void release_self(void)
{
    struct sim_state *s = state;
    if (!s || self_slot < 0)
        return;
    state_lock(s);
    struct sim_proc_slot *p = &s->procs[self_slot];
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        atomic_store(&p->used[d], 0);
        atomic_store(&p->contexts[d], 0);
    }
    atomic_store(&p->managed, 0);
    __atomic_store_n(&p->live, 0, __ATOMIC_RELEASE);
    self_slot = -1;
    state_unlock(s);
}
