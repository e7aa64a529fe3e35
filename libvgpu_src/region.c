/* The shared region: mapping (or creating) it, this process's slot, reclaiming
 * the slots of dead processes, and mapping driver devices to region indices.
 * Protocol in region.h; nothing here takes a lock another process could hold. */
#include "internal.h"
#include "hooks.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define CAS(p, expected, desired) \
    __atomic_compare_exchange_n((p), (expected), (desired), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)

static struct hami_region *g_region;
static pthread_once_t region_once = PTHREAD_ONCE_INIT;

static struct hami_proc_slot *g_self;
static int g_self_failed;
static uint64_t g_self_owner;
static pthread_mutex_t self_lock = PTHREAD_MUTEX_INITIALIZER;
/* Updates of the own slot in flight (hami_slot_begin/end), and whether the process
 * is giving its slot back (exit). */
static int g_slot_writers;
static int g_releasing;

/* ---- process identity ---- */

/* State letter and start time (clock ticks since boot) of `pid`; -1 when it is gone. */
static int read_proc_stat(int pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');   /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ')
        return -1;
    p += 2;
    *state = *p;
    /* after ')' come fields 3..; starttime is field 22 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

static uint64_t owner_value(int pid)
{
    char state;
    uint64_t start = 0;
    if (read_proc_stat(pid, &state, &start) < 0)
        start = 0;
    return ((uint64_t)(uint32_t)pid << 32) | (start & 0xffffffffu);
}

/* An owner (or reclaim token) whose process still runs. Zombies hold no device memory. */
static int owner_alive(uint64_t owner)
{
    int pid = (int)(owner >> 32);
    if (owner == 0 || owner == HAMI_OWNER_RECLAIMING || pid <= 0 || pid > (1 << 22))
        return 0;
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return 0;
    char state;
    uint64_t start;
    if (read_proc_stat(pid, &state, &start) < 0)
        return errno == ENOENT ? 0 : 1;
    if (state == 'Z' || state == 'X')
        return 0;
    return (start & 0xffffffffu) == (owner & 0xffffffffu);
}

/* ---- mapping ---- */

static void init_header(struct hami_region *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    r->magic = HAMI_REGION_MAGIC;
    r->version = HAMI_REGION_VERSION;
    __atomic_store_n(&r->state, HAMI_REGION_READY, __ATOMIC_RELEASE);
}

/* What makes a mapped region unusable (written to why), or 0 when it is usable. */
static int region_problem(const struct hami_region *r, const char *path, char *why, size_t len)
{
    if (r->magic == HAMI_REGION_MAGIC && r->version == HAMI_REGION_VERSION)
        return 0;
    snprintf(why, len, "region %s: magic %#llx version %u, expected %#llx version %u", path,
             (unsigned long long)r->magic, r->version, (unsigned long long)HAMI_REGION_MAGIC,
             HAMI_REGION_VERSION);
    return 1;
}

static struct hami_region *map_private(void)
{
    void *p = mmap(NULL, sizeof(struct hami_region), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        hami_error("cannot map a private region: %s; running without limits", strerror(errno));
        return NULL;
    }
    init_header(p);
    return p;
}

/* A runtime-made container's region: the runtime made it complete and it is
 * never made here (a missing one was removed from inside). */
static struct hami_region *map_runtime_region(const char *path, char *why, size_t len)
{
    struct hami_region *r = hami_map_runtime_file(path, sizeof *r, 1, "region", why, len);
    if (r && region_problem(r, path, why, len)) {
        munmap(r, sizeof *r);
        r = NULL;
    }
    return r;
}

/* Bare use: the file the env names, made here (from nothing but a header) when
 * no process has made it yet. NULL when it cannot be used: then nothing is limited. */
static struct hami_region *map_file(const char *path)
{
    const size_t size = sizeof(struct hami_region);
    struct hami_region *r = NULL;
    char why[PATH_MAX + 160];
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        hami_error("region %s: %s; running without limits", path, strerror(errno));
        return NULL;
    }
    int locked = 0;
    struct stat st;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size != size) {
        /* empty (we or a peer just created it) or being created: settle it under the lock */
        while (flock(fd, LOCK_EX) < 0) {
            if (errno != EINTR) {
                hami_error("region %s: flock: %s; running without limits", path, strerror(errno));
                goto out;
            }
        }
        locked = 1;
        if (fstat(fd, &st) < 0) {
            hami_error("region %s: %s; running without limits", path, strerror(errno));
            goto out;
        }
        if (st.st_size == 0 && ftruncate(fd, (off_t)size) < 0) {
            hami_error("region %s: ftruncate: %s; running without limits", path, strerror(errno));
            goto out;
        }
        if (st.st_size != 0 && (size_t)st.st_size != size) {
            hami_error("region %s: %lld bytes, expected %zu; running without limits", path,
                       (long long)st.st_size, size);
            goto out;
        }
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        hami_error("region %s: mmap: %s; running without limits", path, strerror(errno));
        goto out;
    }
    r = p;
    if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != HAMI_REGION_READY) {
        if (!locked) {
            while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
                ;
            locked = 1;
        }
        /* Holding the lock: a creator that left it unfinished is gone (a foreign
         * file is left as it is, and refused below). */
        if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != HAMI_REGION_READY &&
            (r->magic == 0 || r->magic == HAMI_REGION_MAGIC)) {
            hami_info("region %s: created", path);
            r->state = HAMI_REGION_INITIALIZING;
            init_header(r);
        }
    }
    if (region_problem(r, path, why, sizeof why)) {
        hami_error("%s; running without limits", why);
        munmap(p, size);
        r = NULL;
    }
out:
    if (locked)
        flock(fd, LOCK_UN);
    close(fd);
    return r;
}

static void forget_slot_in_child(void)
{
    /* The child is a new process: it must claim its own slot. */
    g_self = NULL;
    g_self_failed = 0;
    g_self_owner = 0;
    g_slot_writers = 0;   /* the parent's other threads are not here */
    g_releasing = 0;
    pthread_mutex_init(&self_lock, NULL);
}

static const struct hami_limits *g_limits;
static int g_refused;

/* A runtime-made container takes everything from the runtime's files, and fails
 * closed when they cannot be used: its processes then get no GPU at all, never
 * one without limits. Bare use takes the env's limits. */
static void region_once_body(void)
{
    hami_init();
    if (hami_config.runtime_made) {
        char why[2 * PATH_MAX];
        g_limits = hami_limits_map(HAMI_LIMITS_PATH, why, sizeof why);
        if (g_limits)
            g_region = map_runtime_region(hami_config.region_path, why, sizeof why);
        if (!g_limits || !g_region) {
            g_refused = 1;
            hami_error("%s; every CUDA and NVML call of this process is refused", why);
        }
    } else {
        g_limits = hami_limits_from_env();
        g_region = hami_config.region_path ? map_file(hami_config.region_path) : map_private();
    }
    pthread_atfork(NULL, NULL, forget_slot_in_child);
}

const struct hami_limits *hami_limits_get(void)
{
    pthread_once(&region_once, region_once_body);
    return g_region ? g_limits : NULL;
}

int hami_refused(void)
{
    pthread_once(&region_once, region_once_body);
    return g_refused;
}

/* Context creation is serialised with flocks, which the kernel drops when their
 * holder dies: a fresh descriptor each time, so a forked child never shares its
 * parent's lock. A holder that is stopped (not dead) is waited for at most
 * LOCK_WAIT_MS: then we go on without the lock (a measurement may be blurred)
 * rather than hang. */
#define LOCK_WAIT_MS 2000

int hami_flock_bounded(int fd, const char *what)
{
    if (fd < 0)
        return -1;
    for (int waited = 0; flock(fd, LOCK_EX | LOCK_NB) < 0; waited++) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || waited >= LOCK_WAIT_MS) {
            hami_warn("%s: lock not had in %d ms; measuring without it", what, LOCK_WAIT_MS);
            close(fd);
            return -1;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return fd;
}

/* Among the container's processes: the region file. */
int hami_region_lock(void)
{
    if (!hami_region_get() || !hami_config.region_path)
        return -1;
    int fd = open(hami_config.region_path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    return hami_flock_bounded(fd, hami_config.region_path);
}

void hami_unlock(int fd)
{
    if (fd >= 0)
        close(fd);   /* drops the lock */
}

struct hami_region *hami_region_get(void)
{
    pthread_once(&region_once, region_once_body);
    return g_region;
}

/* ---- slots ---- */

int hami_region_procs_high(struct hami_region *r)
{
    uint32_t high = LOAD(&r->procs_high);
    return high < HAMI_MAX_PROCS ? (int)high : HAMI_MAX_PROCS;
}

static void zero_slot_usage(struct hami_proc_slot *s)
{
    for (int d = 0; d < HAMI_MAX_DEVICES; d++) {
        STORE(&s->mem_used[d], 0);
        STORE(&s->ctx_used[d], 0);
        STORE(&s->sm_busy_ns[d], 0);
        STORE(&s->launches[d], 0);
    }
    STORE(&s->pid, 0);
    STORE(&s->host_pid, 0);
}

/* The slot is RECLAIMING and `token` was read from its `started_ns`: take the
 * token, zero the usage, free the slot. 0 when another reclaimer got there first. */
static int finish_reclaim(struct hami_proc_slot *s, uint64_t token, uint64_t me)
{
    if (!CAS(&s->started_ns, &token, me))
        return 0;
    zero_slot_usage(s);
    uint64_t mine = me;
    CAS(&s->started_ns, &mine, 0);
    uint64_t reclaiming = HAMI_OWNER_RECLAIMING;
    CAS(&s->owner, &reclaiming, 0);
    return 1;
}

/* While a slot is RECLAIMING, `started_ns` holds the reclaimer's owner value as a
 * token; a reclaimer killed half-way is replaced by the next one (owner_alive fails
 * on its token, and a leftover timestamp never names a live process). */
static int reclaim_slot(struct hami_proc_slot *s, uint64_t me)
{
    uint64_t owner = LOAD(&s->owner);
    if (owner == 0)
        return 0;
    uint64_t token = LOAD(&s->started_ns);
    if (owner == HAMI_OWNER_RECLAIMING) {
        if (owner_alive(token))
            return 0;
    } else {
        if (owner_alive(owner) || !CAS(&s->owner, &owner, HAMI_OWNER_RECLAIMING))
            return 0;
        token = LOAD(&s->started_ns);
    }
    return finish_reclaim(s, token, me);
}

int hami_region_reclaim_dead(void)
{
    struct hami_region *r = hami_region_get();
    if (!r)
        return 0;
    uint64_t me = g_self_owner ? g_self_owner : owner_value(getpid());
    int freed = 0;
    for (int i = 0; i < hami_region_procs_high(r); i++)
        if (LOAD(&r->procs[i].owner) != me)
            freed += reclaim_slot(&r->procs[i], me);
    if (freed)
        hami_info("reclaimed %d slot(s) of exited processes", freed);
    return freed;
}

static struct hami_proc_slot *claim_slot(struct hami_region *r, uint64_t me)
{
    for (int i = 0; i < HAMI_MAX_PROCS; i++) {
        struct hami_proc_slot *s = &r->procs[i];
        uint64_t expected = 0;
        if (LOAD(&s->owner) == 0 && CAS(&s->owner, &expected, me)) {
            /* visible to every charge before this slot's first one */
            uint32_t high = LOAD(&r->procs_high);
            while (high < (uint32_t)i + 1 && !CAS(&r->procs_high, &high, (uint32_t)i + 1))
                ;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            STORE(&s->pid, (int32_t)getpid());
            STORE(&s->started_ns, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
            return s;
        }
    }
    return NULL;
}

struct hami_proc_slot *hami_region_self(void)
{
    struct hami_proc_slot *s = __atomic_load_n(&g_self, __ATOMIC_ACQUIRE);
    if (s || g_self_failed)
        return s;
    struct hami_region *r = hami_region_get();
    if (!r)
        return NULL;
    pthread_mutex_lock(&self_lock);
    s = g_self;
    if (!s && !g_self_failed) {
        uint64_t me = owner_value(getpid());
        g_self_owner = me;
        hami_region_reclaim_dead();
        s = claim_slot(r, me);
        if (!s) {
            g_self_failed = 1;
            hami_error("region: all %d process slots are taken; this process is not limited",
                       HAMI_MAX_PROCS);
        }
        __atomic_store_n(&g_self, s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&self_lock);
    return s;
}

struct hami_proc_slot *hami_slot_begin(void)
{
    struct hami_proc_slot *s = hami_region_self();
    if (!s)
        return NULL;
    __atomic_add_fetch(&g_slot_writers, 1, __ATOMIC_SEQ_CST);
    if (LOAD(&g_releasing)) {   /* of this and the release's check, one sees the other */
        __atomic_sub_fetch(&g_slot_writers, 1, __ATOMIC_SEQ_CST);
        return NULL;
    }
    return s;
}

void hami_slot_end(void)
{
    __atomic_sub_fetch(&g_slot_writers, 1, __ATOMIC_SEQ_CST);
}

#define RELEASE_WAIT_NS 1000000000ull
#define RELEASE_POLL_NS 100000LL

/* A process that exits normally (return from main, exit(), an interpreter's exit)
 * gives its slot back at once, so that no view counts it once it is gone; a killed
 * one is reclaimed by the next process that looks (reclaim_slot). Other threads may
 * still call in: from here on they charge nothing (no slot), and updates already
 * under way are waited for (at most 1 s, else the slot is left to reclaim) before
 * the slot is zeroed. Only the process that claimed the slot gives it back: a child
 * that shares our memory without fork's handlers (vfork, a bare clone) has another
 * pid and leaves everything as it is. */
__attribute__((destructor)) static void release_own_slot(void)
{
    struct hami_proc_slot *s = __atomic_load_n(&g_self, __ATOMIC_ACQUIRE);
    uint64_t me = g_self_owner;
    if (!s || (int)(me >> 32) != (int)getpid())
        return;
    pthread_mutex_lock(&self_lock);
    STORE(&g_releasing, 1);
    g_self_failed = 1;   /* no thread claims a new slot either */
    __atomic_store_n(&g_self, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&self_lock);
    int64_t start = hami_now_ns();
    while (LOAD(&g_slot_writers) > 0) {
        if ((uint64_t)(hami_now_ns() - start) > RELEASE_WAIT_NS)
            return;
        hami_sleep_ns(RELEASE_POLL_NS, RELEASE_POLL_NS, RELEASE_POLL_NS);
    }
    uint64_t owner = me;
    if (CAS(&s->owner, &owner, HAMI_OWNER_RECLAIMING))
        finish_reclaim(s, LOAD(&s->started_ns), me);
}

int hami_region_has_pid(unsigned int pid)
{
    struct hami_region *r = hami_region_get();
    if (!r || pid == 0)
        return 0;
    for (int i = 0; i < hami_region_procs_high(r); i++) {
        struct hami_proc_slot *s = &r->procs[i];
        uint64_t owner = LOAD(&s->owner);
        if (owner == 0 || owner == HAMI_OWNER_RECLAIMING)
            continue;
        if ((unsigned int)LOAD(&s->pid) == pid || (unsigned int)LOAD(&s->host_pid) == pid)
            return 1;
    }
    return 0;
}

/* ---- devices ---- */

static int limits_have_uuids(const struct hami_limits *l)
{
    for (uint32_t i = 0; i < l->device_count && i < HAMI_MAX_DEVICES; i++)
        if (l->devices[i].uuid[0])
            return 1;
    return 0;
}

/* A UUID's hex body: CUDA's UUID of a device, written GPU-<hex> here, is a MIG
 * instance's own (cuDeviceGetUuid_v2), which NVML and the limits write MIG-<hex>. */
static const char *uuid_body(const char *uuid)
{
    return strncasecmp(uuid, "GPU-", 4) == 0 || strncasecmp(uuid, "MIG-", 4) == 0 ? uuid + 4 : uuid;
}

static int index_of_uuid(const struct hami_limits *l, const char *uuid)
{
    const char *want = uuid_body(uuid);
    for (uint32_t i = 0; i < l->device_count && i < HAMI_MAX_DEVICES; i++) {
        char have[HAMI_UUID_LEN];
        memcpy(have, l->devices[i].uuid, HAMI_UUID_LEN);
        have[HAMI_UUID_LEN - 1] = '\0';
        if (have[0] && strcasecmp(uuid_body(have), want) == 0)
            return (int)i;
    }
    return -1;
}

int hami_cuda_uuid(CUdevice dev, char *out, size_t len)
{
    CUuuid id;
    CUresult (*get_v2)(CUuuid *, CUdevice) = HAMI_DRIVER(cuDeviceGetUuid_v2);
    CUresult (*get_v1)(CUuuid *, CUdevice) = HAMI_DRIVER(cuDeviceGetUuid);
    CUresult rc = get_v2 ? get_v2(&id, dev) : get_v1 ? get_v1(&id, dev) : CUDA_ERROR_NOT_FOUND;
    if (rc != CUDA_SUCCESS)
        return -1;
    const unsigned char *b = (const unsigned char *)id.bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return 0;
}

static int cuda_index_cache[HAMI_MAX_ORDINALS] = {[0 ... HAMI_MAX_ORDINALS - 1] = -2};

int hami_region_device_index(CUdevice dev)
{
    const struct hami_limits *l = hami_limits_get();
    if (!l || dev < 0 || dev >= HAMI_MAX_ORDINALS)
        return -1;
    int cached = __atomic_load_n(&cuda_index_cache[dev], __ATOMIC_ACQUIRE);
    if (cached != -2)
        return cached;
    int index = -1;
    if (!limits_have_uuids(l)) {
        index = dev < HAMI_MAX_DEVICES ? dev : -1;
    } else {
        char uuid[HAMI_UUID_LEN];
        if (hami_cuda_uuid(dev, uuid, sizeof uuid) < 0)
            return -1;   /* not cached: the driver may not be initialised yet */
        index = index_of_uuid(l, uuid);
        if (index < 0)
            hami_warn("device %d (%s) is not in the region; not limited", dev, uuid);
    }
    __atomic_store_n(&cuda_index_cache[dev], index, __ATOMIC_RELEASE);
    return index;
}

/* Bare use: the CUDA ordinal with this UUID (CUDA_VISIBLE_DEVICES decides ordinals). */
static int cuda_ordinal_of_uuid(const char *uuid)
{
    CUresult (*init)(unsigned int) = HAMI_DRIVER(cuInit);
    CUresult (*count_fn)(int *) = HAMI_DRIVER(cuDeviceGetCount);
    CUresult (*get)(CUdevice *, int) = HAMI_DRIVER(cuDeviceGet);
    int count = 0;
    if (!init || !count_fn || !get || init(0) != CUDA_SUCCESS || count_fn(&count) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < count && i < HAMI_MAX_DEVICES; i++) {
        CUdevice dev;
        char have[HAMI_UUID_LEN];
        if (get(&dev, i) == CUDA_SUCCESS && hami_cuda_uuid(dev, have, sizeof have) == 0 &&
            strcasecmp(uuid_body(have), uuid_body(uuid)) == 0)
            return i;
    }
    return -1;
}

static struct {
    nvmlDevice_t handle;
    int index;
} nvml_cache[HAMI_MAX_ORDINALS];
static int nvml_cache_len;
static pthread_mutex_t nvml_cache_lock = PTHREAD_MUTEX_INITIALIZER;

int hami_region_nvml_index(nvmlDevice_t dev)
{
    const struct hami_limits *l = hami_limits_get();
    if (!l || !dev)
        return -1;
    pthread_mutex_lock(&nvml_cache_lock);
    for (int i = 0; i < nvml_cache_len; i++) {
        if (nvml_cache[i].handle == dev) {
            int index = nvml_cache[i].index;
            pthread_mutex_unlock(&nvml_cache_lock);
            return index;
        }
    }
    pthread_mutex_unlock(&nvml_cache_lock);

    nvmlReturn_t (*get_uuid)(nvmlDevice_t, char *, unsigned int) = HAMI_DRIVER(nvmlDeviceGetUUID);
    char uuid[HAMI_UUID_LEN] = "";
    if (!get_uuid || get_uuid(dev, uuid, sizeof uuid) != NVML_SUCCESS)
        return -1;
    int index = -1;
    if (limits_have_uuids(l)) {
        index = index_of_uuid(l, uuid);
    } else if (getenv("CUDA_VISIBLE_DEVICES")) {
        /* bare use, devices renumbered for CUDA: find the CUDA ordinal of this UUID */
        index = cuda_ordinal_of_uuid(uuid);
    } else {
        /* bare use: NVML's index is the CUDA ordinal (no CUDA init in NVML-only tools) */
        unsigned int nvml_index;
        nvmlReturn_t (*get_index)(nvmlDevice_t, unsigned int *) = HAMI_DRIVER(nvmlDeviceGetIndex);
        if (get_index && get_index(dev, &nvml_index) == NVML_SUCCESS &&
            nvml_index < HAMI_MAX_DEVICES)
            index = (int)nvml_index;
    }
    pthread_mutex_lock(&nvml_cache_lock);
    if (nvml_cache_len < HAMI_MAX_ORDINALS) {
        nvml_cache[nvml_cache_len].handle = dev;
        nvml_cache[nvml_cache_len].index = index;
        nvml_cache_len++;
    }
    pthread_mutex_unlock(&nvml_cache_lock);
    return index;
}
