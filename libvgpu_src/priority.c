/*
 * Priority between containers on one GPU (priority.h has the board's layout).
 *
 * Per process and device (CUDA ordinal of the launching context):
 * - its own stamp (CUDA_PRIORITY_STAMP_DIR/<uuid>), mapped read-write once;
 * - the board's entries for that GPU (the files in CUDA_PRIORITY_BOARD/<uuid>), listed again
 *   every PRIO_LIST_NS while the process launches, each mapped read-only once
 *   and read at every launch (a few loads: a low process sees a high one start
 *   at its next launch, not at the next listing);
 * - `high`: one entry is its own stamp (same device and inode). A change of
 *   priority (the host adds or removes the link) is seen at the next listing.
 *
 * A high process never waits here. It stamps `last_ns` at each launch and when
 * a query finds its work still running, and holds a `waits` slot while it is in a
 * launch or waits for its work (synchronisation), so one kernel longer than the
 * idle time keeps low work out while the process waits for it (up to
 * PRIO_WAIT_HOLD_NS: a process killed while waiting leaves its slot, which then
 * stops counting by itself).
 *
 * A low process, before a launch, waits while any other entry is active: its
 * `last_ns` younger than the idle time, or a wait slot younger than
 * PRIO_WAIT_HOLD_NS. It sleeps in chunks of at most PRIO_SLEEP_MAX_NS, holding
 * no lock, and adds each to the region's sm[dev].paused_ns. Work it already
 * queued runs on; nothing is dropped or cut.
 *
 * Paths are opened without following a symlink at the last component; a file
 * that is not a regular file of at least HAMI_STAMP_BYTES is not a stamp.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"
#include "log.h"
#include "priority.h"

#define PRIO_MAX_ORDINALS 64
#define PRIO_MAX_PEERS 64                        /* board entries followed per device */
#define PRIO_LIST_NS 100000000LL                 /* the board is listed again every 100 ms */
#define PRIO_WAIT_HOLD_NS 5000000000LL           /* a wait slot counts at most 5 s */
#define PRIO_AHEAD_NS 10000000LL                 /* a stamp further ahead of our clock is not believed */
#define PRIO_SLEEP_MIN_NS 100000LL
#define PRIO_SLEEP_MAX_NS 2000000LL              /* paused: look again every 2 ms at most */

/* A wait's token: the device and its slot (HAMI_STAMP_WAITS: none was free). */
#define PRIO_TOKEN(dev, slot) ((int)(dev) * (HAMI_STAMP_WAITS + 1) + (slot))

_Static_assert(sizeof(struct hami_stamp) == HAMI_STAMP_BYTES, "stamp layout");

enum { PRIO_UNKNOWN = 0, PRIO_OFF, PRIO_ON };

struct prio_peer {
    dev_t dev;
    ino_t ino;
    const struct hami_stamp *stamp;
};

struct prio_dev {
    pthread_mutex_t lock;
    int state;                                   /* PRIO_*, read without the lock */
    int region_index;                            /* -1: the region does not name the device */
    struct hami_stamp *own;                      /* NULL: no stamp, never high */
    dev_t own_dev;
    ino_t own_ino;
    int high;                                    /* own stamp on the board, read without the lock */
    char uuid[HAMI_UUID_LEN];
    struct prio_peer peers[PRIO_MAX_PEERS];
    int npeers;
    int64_t next_list_ns;
};

static struct prio_dev prio[PRIO_MAX_ORDINALS];
static pthread_once_t prio_once = PTHREAD_ONCE_INIT;
static int prio_board_fd = -1;
static int prio_stamps_fd = -1;
static __thread int64_t prio_wait_value;         /* what this thread's wait slot holds */

static void prio_reset_locks(void)
{
    for (int d = 0; d < PRIO_MAX_ORDINALS; d++)
        pthread_mutex_init(&prio[d].lock, NULL);
}

/* A forked child may have been forked while another thread held a lock. The
 * mappings stay valid in it. */
static void prio_after_fork_child(void)
{
    prio_reset_locks();
}

static int prio_open_dir(const char *path)
{
    return path ? open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
}

static void prio_init_once(void)
{
    prio_reset_locks();
    prio_board_fd = prio_open_dir(hami_config.priority_board);
    if (prio_board_fd < 0)
        hami_warn("CUDA_PRIORITY_BOARD=%s: %s; priority has no effect", hami_config.priority_board,
                  strerror(errno));
    prio_stamps_fd = prio_open_dir(hami_config.priority_stamp_dir);
    pthread_atfork(NULL, NULL, prio_after_fork_child);
}

/* A GPU UUID usable as one path component: [A-Za-z0-9][A-Za-z0-9_.:-]*. */
static int prio_uuid_ok(const char *uuid)
{
    static const char rest[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-";
    size_t n = strnlen(uuid, HAMI_UUID_LEN);
    if (n == 0 || n == HAMI_UUID_LEN || !strchr(rest, uuid[0]) || strchr("_.:-", uuid[0]))
        return 0;
    return strspn(uuid, rest) == n;
}

/* A stamp file at `name` under `dir_fd`: a regular file, never through a symlink. */
static void *prio_map(int dir_fd, const char *name, int writable, struct stat *st)
{
    int fd = openat(dir_fd, name, (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *map = NULL;
    if (fstat(fd, st) == 0 && S_ISREG(st->st_mode) && st->st_size >= HAMI_STAMP_BYTES) {
        map = mmap(NULL, HAMI_STAMP_BYTES, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
            map = NULL;
    }
    close(fd);
    return map;
}

/* First use of a device: its UUID (the limits', else the driver's), region
 * index and own stamp. Called with p->lock held. */
static void prio_open(struct prio_dev *p, CUdevice dev)
{
    p->region_index = hami_region_device_index(dev);
    const struct hami_limits *l = hami_limits_get();
    if (l && p->region_index >= 0 && l->devices[p->region_index].uuid[0]) {
        memcpy(p->uuid, l->devices[p->region_index].uuid, HAMI_UUID_LEN);
        p->uuid[HAMI_UUID_LEN - 1] = '\0';
    } else if (hami_cuda_uuid(dev, p->uuid, sizeof p->uuid) < 0) {
        return;                                  /* the driver cannot tell yet: try again later */
    }
    if (prio_board_fd < 0 || !prio_uuid_ok(p->uuid)) {
        __atomic_store_n(&p->state, PRIO_OFF, __ATOMIC_RELEASE);
        return;
    }
    struct stat st;
    struct hami_stamp *own = prio_stamps_fd >= 0 ? prio_map(prio_stamps_fd, p->uuid, 1, &st) : NULL;
    if (own) {
        p->own_dev = st.st_dev;
        p->own_ino = st.st_ino;
    }
    __atomic_store_n(&p->own, own, __ATOMIC_RELEASE);
    __atomic_store_n(&p->state, PRIO_ON, __ATOMIC_RELEASE);
}

static const struct hami_stamp *prio_known(const struct prio_peer *peers, int n, const struct stat *st)
{
    for (int i = 0; i < n; i++)
        if (peers[i].dev == st->st_dev && peers[i].ino == st->st_ino)
            return peers[i].stamp;
    return NULL;
}

/* The board's entries for this device, again. Called with p->lock held. */
static void prio_list(struct prio_dev *p, int64_t now)
{
    p->next_list_ns = now + PRIO_LIST_NS;
    struct prio_peer seen[PRIO_MAX_PEERS];
    int n = 0, high = 0;
    int fd = openat(prio_board_fd, p->uuid, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (fd >= 0 && !dir)
        close(fd);
    struct dirent *e;
    while (dir && (e = readdir(dir)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.' ||               /* ".", "..", the host's temporary names */
            fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_size < HAMI_STAMP_BYTES)
            continue;
        if (p->own && st.st_dev == p->own_dev && st.st_ino == p->own_ino) {
            high = 1;
            continue;
        }
        if (n == PRIO_MAX_PEERS || prio_known(seen, n, &st))
            continue;
        const struct hami_stamp *stamp = prio_known(p->peers, p->npeers, &st);
        struct stat mapped;
        if (!stamp) {
            stamp = prio_map(dirfd(dir), e->d_name, 0, &mapped);
            if (stamp && (mapped.st_dev != st.st_dev || mapped.st_ino != st.st_ino)) {
                munmap((void *)stamp, HAMI_STAMP_BYTES);   /* replaced in between: next time */
                stamp = NULL;
            }
        }
        if (stamp)
            seen[n++] = (struct prio_peer){st.st_dev, st.st_ino, stamp};
    }
    if (dir)
        closedir(dir);
    for (int i = 0; i < p->npeers; i++)
        if (!prio_known(seen, n, &(struct stat){.st_dev = p->peers[i].dev, .st_ino = p->peers[i].ino}))
            munmap((void *)p->peers[i].stamp, HAMI_STAMP_BYTES);
    memcpy(p->peers, seen, sizeof(seen[0]) * (size_t)n);
    p->npeers = n;
    if (high != p->high)
        hami_debug("priority: %s on %s", high ? "high" : "low", p->uuid);
    __atomic_store_n(&p->high, high, __ATOMIC_RELEASE);
}

/* How long high work stays active on the board, as far as we know now (0: not
 * active; while it waits for its work, until we look again). Under p->lock. */
static int64_t prio_active_for(const struct prio_dev *p, int64_t now, int64_t idle)
{
    int64_t left = 0;
    for (int i = 0; i < p->npeers; i++) {
        const struct hami_stamp *s = p->peers[i].stamp;
        int64_t last = __atomic_load_n(&s->last_ns, __ATOMIC_ACQUIRE);
        if (last > 0 && last <= now + PRIO_AHEAD_NS && now - last < idle && idle - (now - last) > left)
            left = idle - (now - last);
        for (int w = 0; w < HAMI_STAMP_WAITS; w++) {
            int64_t since = __atomic_load_n(&s->waits[w], __ATOMIC_ACQUIRE);
            if (since > 0 && since <= now + PRIO_AHEAD_NS && now - since < PRIO_WAIT_HOLD_NS &&
                left < PRIO_SLEEP_MAX_NS)
                left = PRIO_SLEEP_MAX_NS;
        }
    }
    return left;
}

/* The current context's device, opened on first use; NULL when priority does
 * not apply there. */
static struct prio_dev *prio_current(CUdevice *dev_out)
{
    pthread_once(&prio_once, prio_init_once);
    if (prio_board_fd < 0)
        return NULL;
    CUresult (*get_device)(CUdevice *) = HAMI_DRIVER(cuCtxGetDevice);
    CUdevice dev;
    if (!get_device || get_device(&dev) != CUDA_SUCCESS || dev < 0 || dev >= PRIO_MAX_ORDINALS)
        return NULL;
    struct prio_dev *p = &prio[dev];
    int state = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
    if (state == PRIO_UNKNOWN) {
        pthread_mutex_lock(&p->lock);
        if (p->state == PRIO_UNKNOWN)
            prio_open(p, dev);
        state = p->state;
        pthread_mutex_unlock(&p->lock);
    }
    if (dev_out)
        *dev_out = dev;
    return state == PRIO_ON ? p : NULL;
}

static void prio_stamp(struct prio_dev *p, int64_t now)
{
    __atomic_store_n(&p->own->last_ns, now, __ATOMIC_RELEASE);
}

/* A high process marks that it waits for its work: a free (or stale) slot. */
static int prio_mark_wait(struct prio_dev *p, CUdevice dev, int64_t now)
{
    prio_stamp(p, now);
    for (int w = 0; w < HAMI_STAMP_WAITS; w++) {
        int64_t seen = __atomic_load_n(&p->own->waits[w], __ATOMIC_ACQUIRE);
        if ((seen == 0 || now - seen >= PRIO_WAIT_HOLD_NS || seen > now + PRIO_AHEAD_NS) &&
            __atomic_compare_exchange_n(&p->own->waits[w], &seen, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            prio_wait_value = now;
            return PRIO_TOKEN(dev, w);
        }
    }
    /* every slot taken: the others' marks already say so; only stamp at the end */
    return PRIO_TOKEN(dev, HAMI_STAMP_WAITS);
}

int hami_priority_launch_slow(void)
{
    CUdevice dev;
    struct prio_dev *p = prio_current(&dev);
    if (!p)
        return -1;
    const struct hami_limits *limits = hami_limits_get();
    int64_t idle = (int64_t)(limits ? limits->priority_idle_ms : HAMI_PRIORITY_IDLE_MS_DEFAULT) * 1000000LL;
    int64_t now = hami_now_ns();
    struct hami_region *r = hami_region_get();
    uint64_t *paused_ns = r && p->region_index >= 0 ? &r->sm[p->region_index].paused_ns : NULL;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        if (now >= p->next_list_ns)
            prio_list(p, now);
        int64_t wait = p->high ? 0 : prio_active_for(p, now, idle);
        pthread_mutex_unlock(&p->lock);
        if (!wait)
            break;
        hami_sleep_ns(wait, PRIO_SLEEP_MIN_NS, PRIO_SLEEP_MAX_NS);
        int64_t then = hami_now_ns();
        if (paused_ns)                           /* chunk by chunk: a reader sees "paused now" */
            __atomic_add_fetch(paused_ns, (uint64_t)(then - now), __ATOMIC_RELAXED);
        now = then;
    }
    if (!__atomic_load_n(&p->high, __ATOMIC_ACQUIRE))
        return -1;
    return prio_mark_wait(p, dev, now);
}

int hami_priority_wait_slow(void)
{
    CUdevice dev;
    struct prio_dev *p = prio_current(&dev);
    if (!p || !__atomic_load_n(&p->high, __ATOMIC_ACQUIRE))
        return -1;
    return prio_mark_wait(p, dev, hami_now_ns());
}

void hami_priority_end_slow(int token)
{
    struct hami_stamp *own = __atomic_load_n(&prio[token / (HAMI_STAMP_WAITS + 1)].own, __ATOMIC_ACQUIRE);
    int slot = token % (HAMI_STAMP_WAITS + 1);
    if (!own)
        return;
    __atomic_store_n(&own->last_ns, hami_now_ns(), __ATOMIC_RELEASE);
    int64_t mine = prio_wait_value;
    if (slot < HAMI_STAMP_WAITS)   /* unless another took it over as stale */
        __atomic_compare_exchange_n(&own->waits[slot], &mine, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

void hami_priority_running_slow(void)
{
    struct prio_dev *p = prio_current(NULL);
    if (p && __atomic_load_n(&p->high, __ATOMIC_ACQUIRE))
        prio_stamp(p, hami_now_ns());
}
