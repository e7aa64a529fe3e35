/*
 * The pids NVML shows. A real driver names every process by its pid in the host's pid
 * namespace. A simulated process in another namespace (a container) learns that pid from
 * the pid service (sim_pid_service.c) if one runs beside the state file; otherwise its slot
 * holds only its pid as its own namespace numbers it. A reader in the host's namespace
 * (hamictl, the node agent, nvidia-smi on the host) does not need the service: it finds
 * such a process in its own /proc, the one whose NSpid ends with the slot's pid and whose
 * pid namespace is the slot's (or, where that link cannot be read, whose start time is the
 * slot's), and records the host pid in the slot for every later reader. The process itself
 * and its namespace go on seeing it by the pid they knew (a CUDA process's view of its own
 * pid never changes under it); other namespaces see the host pid once it is found, and
 * until then a number above any pid the kernel gives (SIM_PID_UNSEEN + its slot), never
 * its own pid: that would be another process's in theirs (each container's first process
 * is pid 1), and libvgpu there would take that process's memory and kernels for its own.
 */
#include "sim_pids.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SIM_INIT_PIDNS 0xEFFFFFFCULL     /* the kernel's inode of the host's pid namespace */
#define SIM_RESOLVE_RETRY_NS 1000000000ULL  /* a process not found is looked for again after this */
#define SIM_RESOLVE_BATCH 64

static uint32_t reader_pid;
static uint64_t reader_ns;

/* This process's pid namespace (a forked child may be in another: asked again there). */
static uint64_t own_pidns(void)
{
    uint32_t pid = (uint32_t)getpid();
    if (__atomic_load_n(&reader_pid, __ATOMIC_ACQUIRE) != pid) {
        struct stat st;
        __atomic_store_n(&reader_ns, stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&reader_pid, pid, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&reader_ns, __ATOMIC_RELAXED);
}

uint32_t sim_pid_shown(struct sim_state *s, int slot)
{
    const struct sim_proc_slot *p = &s->procs[slot];
    uint32_t known = __atomic_load_n(&p->host_pid_known, __ATOMIC_ACQUIRE);
    uint64_t ns = own_pidns();
    if (!ns || !p->pidns || p->pidns == ns)   /* its own namespace sees it as the process itself does */
        return known == SIM_HOST_PID_FOUND ? p->pid : p->host_pid;
    if (known)
        return p->host_pid;
    return SIM_PID_UNSEEN + (uint32_t)slot;   /* its own pid would be another process's here */
}

uint32_t sim_interval_pid(struct sim_state *s, uint32_t pid, uint32_t slot)
{
    if (slot >= SIM_MAX_PROCS)
        return pid;
    const struct sim_proc_slot *p = &s->procs[slot];
    if (!__atomic_load_n(&p->live, __ATOMIC_ACQUIRE) || p->pid != pid)
        return pid;
    return sim_pid_shown(s, (int)slot);
}

/* Field 22 of /proc/<pid>/stat (the start time); 0 when unknown. */
static uint64_t start_time(uint32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    if (sim_read_proc(path, buf, sizeof buf) != 0)
        return 0;
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++) {
        p = strchr(p + 1, ' ');
    }
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* The innermost pid of /proc/<pid> when it lives in a namespace below the host's (its
 * NSpid line has more than one pid) and is not a zombie; 0 otherwise. */
static uint32_t inner_pid(uint32_t pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%u/status", pid);
    if (sim_read_proc(path, buf, sizeof buf) != 0)
        return 0;
    const char *state = strstr(buf, "\nState:");
    const char *nspid = strstr(buf, "\nNSpid:");
    if (!state || !nspid)
        return 0;
    state += strspn(state + 7, " \t") + 7;
    if (*state == 'Z' || *state == 'X')
        return 0;
    char *p = (char *)nspid + 7, *end;
    unsigned long last = 0;
    int count = 0;
    for (;;) {
        unsigned long v = strtoul(p, &end, 10);
        if (end == p)
            break;
        last = v;
        count++;
        p = end;
    }
    return count > 1 ? (uint32_t)last : 0;
}

struct wanted { int slot; uint32_t pid, found; uint64_t start, pidns; };

/* Per slot, a process not found: not looked for again before `at` (a reader's own memory). */
static struct { uint32_t pid; uint64_t start, at; } missed[SIM_MAX_PROCS];
static pthread_mutex_t missed_lock = PTHREAD_MUTEX_INITIALIZER;

static int missed_lately(int i, const struct sim_proc_slot *p, uint64_t now)
{
    pthread_mutex_lock(&missed_lock);
    int lately = missed[i].pid == p->pid && missed[i].start == p->start_time && now < missed[i].at;
    pthread_mutex_unlock(&missed_lock);
    return lately;
}

void sim_pids_resolve(struct sim_state *s)
{
    if (own_pidns() != SIM_INIT_PIDNS)
        return;
    struct wanted want[SIM_RESOLVE_BATCH];
    int n = 0;
    uint64_t now = sim_now_ns();
    int hwm = (int)__atomic_load_n(&s->slot_hwm, __ATOMIC_ACQUIRE);
    for (int i = 0; i < hwm && i < SIM_MAX_PROCS && n < SIM_RESOLVE_BATCH; i++) {
        struct sim_proc_slot *p = &s->procs[i];
        if (!__atomic_load_n(&p->live, __ATOMIC_ACQUIRE) || __atomic_load_n(&p->host_pid_known, __ATOMIC_ACQUIRE) ||
            !p->pidns || p->pidns == SIM_INIT_PIDNS || missed_lately(i, p, now))
            continue;
        want[n++] = (struct wanted){i, p->pid, 0, p->start_time, p->pidns};
    }
    if (!n)
        return;
    DIR *proc = opendir("/proc");
    int left = n;
    for (struct dirent *d; proc && left && (d = readdir(proc));) {
        if (d->d_name[0] < '1' || d->d_name[0] > '9')
            continue;
        uint32_t host = (uint32_t)strtoul(d->d_name, NULL, 10);
        uint32_t inner = inner_pid(host);
        if (!inner)
            continue;
        for (int k = 0; k < n; k++) {
            if (want[k].found || want[k].pid != inner)
                continue;
            char path[64];
            struct stat st;
            snprintf(path, sizeof path, "/proc/%u/ns/pid", host);
            int same = stat(path, &st) == 0 ? (uint64_t)st.st_ino == want[k].pidns
                                               : want[k].start && start_time(host) == want[k].start;
            if (same) {
                want[k].found = host;
                left--;
                break;
            }
        }
    }
    if (proc)
        closedir(proc);
    if (pthread_mutex_lock(&s->lock) == EOWNERDEAD)
        pthread_mutex_consistent(&s->lock);
    for (int k = 0; k < n; k++) {
        struct sim_proc_slot *p = &s->procs[want[k].slot];
        if (!want[k].found) {
            pthread_mutex_lock(&missed_lock);
            missed[want[k].slot].pid = want[k].pid;
            missed[want[k].slot].start = want[k].start;
            missed[want[k].slot].at = now + SIM_RESOLVE_RETRY_NS;
            pthread_mutex_unlock(&missed_lock);
            continue;
        }
        if (!p->live || p->pid != want[k].pid || p->start_time != want[k].start || p->pidns != want[k].pidns ||
            p->host_pid_known)
            continue;   /* another process's slot by now, or found meanwhile */
        p->host_pid = want[k].found;
        __atomic_store_n(&p->host_pid_known, SIM_HOST_PID_FOUND, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&s->lock);
}
