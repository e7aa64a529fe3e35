/*
 * Activity and priority between containers on one GPU (activity.h has the
 * boards' layout and why nothing a container writes misleads another).
 *
 * Per process and device (CUDA ordinal of the launching context):
 * - its own stamp (<stamp dir>/<uuid>), mapped read-write once;
 * - each board's entries for that GPU (the files in <board>/<uuid>), listed
 *   again every ACT_LIST_NS while the process launches, each mapped read-only
 *   once and read at every question (a few loads: a low process sees a high
 *   one start at its next launch, not at the next listing);
 * - `high`: one priority board entry is its own stamp (same device and inode).
 *   A change of priority (the host adds or removes the link) is seen at the next
 *   listing.
 *
 * Every process stamps `last_ns` at each launch and when a query finds its work
 * still running, and holds a `waits` slot while it is in a launch or waits for
 * its work (synchronisation), so one kernel longer than a window keeps counting
 * while the process waits for it (up to ACT_WAIT_HOLD_NS: a process killed while
 * waiting leaves its slot, which then stops counting by itself).
 *
 * A low process, before a launch, waits while any other priority board entry
 * is active: its `last_ns` younger than the idle time, or a wait slot younger
 * than ACT_WAIT_HOLD_NS. It sleeps in chunks of at most ACT_SLEEP_MAX_NS,
 * holding no lock, and adds each to the region's sm[dev].paused_ns. Work it
 * already queued runs on; nothing is dropped or cut. A high process never waits.
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

#include "activity.h"
#include "hooks.h"
#include "log.h"

#define ACT_MAX_PEERS 64                         /* entries followed per board and device */
#define ACT_LIST_NS 100000000LL                  /* the boards are listed again every 100 ms */
#define ACT_WAIT_HOLD_NS 5000000000LL            /* a wait slot counts at most 5 s */
#define ACT_AHEAD_NS 10000000LL                  /* a stamp further ahead of our clock is not believed */
#define ACT_SLEEP_MIN_NS 100000LL
#define ACT_SLEEP_MAX_NS 2000000LL               /* paused: look again every 2 ms at most */

/* A wait's token: the device and its slot (HAMI_STAMP_WAITS: none was free). */
#define ACT_TOKEN(dev, slot) ((int)(dev) * (HAMI_STAMP_WAITS + 1) + (slot))

_Static_assert(sizeof(struct hami_stamp) == HAMI_STAMP_BYTES, "stamp layout");

enum { ACT_UNKNOWN = 0, ACT_OFF, ACT_ON };
enum { BOARD_ACTIVITY, BOARD_PRIORITY, BOARD_COUNT };

struct act_peer {
    dev_t dev;
    ino_t ino;
    const struct hami_stamp *stamp;
};

/* One board's entries for one device, as this process last listed them. */
struct board_view {
    struct act_peer peers[ACT_MAX_PEERS];
    int npeers;
    int own_listed;                              /* one entry is the own stamp */
};

struct act_dev {
    pthread_mutex_t lock;
    int state;                                   /* ACT_*, read without the lock */
    int region_index;                            /* -1: the limits do not name the device */
    struct hami_stamp *own;                      /* NULL: no stamp (never high, never seen) */
    dev_t own_dev;
    ino_t own_ino;
    int high;                                    /* own stamp on the priority board, read without the lock */
    char uuid[HAMI_UUID_LEN];
    struct board_view boards[BOARD_COUNT];
    int64_t next_list_ns;
};

static struct act_dev act[HAMI_MAX_ORDINALS];
static pthread_once_t act_once = PTHREAD_ONCE_INIT;
static int board_fds[BOARD_COUNT] = {-1, -1};
static int stamps_fd = -1;
static __thread int64_t act_wait_value;          /* what this thread's wait slot holds */

static void act_reset_locks(void)
{
    for (int d = 0; d < HAMI_MAX_ORDINALS; d++)
        pthread_mutex_init(&act[d].lock, NULL);
}

/* A forked child may have been forked while another thread held a lock. The
 * mappings stay valid in it. */
static void act_after_fork_child(void)
{
    act_reset_locks();
}

static int open_board(const char *path, const char *what)
{
    if (!path)
        return -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        hami_warn("%s %s: %s; it has no effect", what, path, strerror(errno));
    return fd;
}

static void act_init_once(void)
{
    act_reset_locks();
    board_fds[BOARD_ACTIVITY] = open_board(hami_config.activity_board, "activity board");
    board_fds[BOARD_PRIORITY] = open_board(hami_config.priority_board, "priority board");
    stamps_fd = hami_config.activity_stamp_dir ? open(hami_config.activity_stamp_dir,
                                                      O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    pthread_atfork(NULL, NULL, act_after_fork_child);
}

/* A GPU UUID usable as one path component: [A-Za-z0-9][A-Za-z0-9_.:-]*. */
static int act_uuid_ok(const char *uuid)
{
    static const char rest[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-";
    size_t n = strnlen(uuid, HAMI_UUID_LEN);
    if (n == 0 || n == HAMI_UUID_LEN || !strchr(rest, uuid[0]) || strchr("_.:-", uuid[0]))
        return 0;
    return strspn(uuid, rest) == n;
}

/* A stamp file at `name` under `dir_fd`: a regular file, never through a symlink. */
static void *act_map(int dir_fd, const char *name, int writable, struct stat *st)
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
static void act_open(struct act_dev *p, CUdevice dev)
{
    p->region_index = hami_region_device_index(dev);
    const struct hami_limits *l = hami_limits_get();
    if (l && p->region_index >= 0 && l->devices[p->region_index].uuid[0]) {
        memcpy(p->uuid, l->devices[p->region_index].uuid, HAMI_UUID_LEN);
        p->uuid[HAMI_UUID_LEN - 1] = '\0';
    } else if (hami_cuda_uuid(dev, p->uuid, sizeof p->uuid) < 0) {
        return;                                  /* the driver cannot tell yet: try again later */
    }
    if ((board_fds[BOARD_ACTIVITY] < 0 && board_fds[BOARD_PRIORITY] < 0) || !act_uuid_ok(p->uuid)) {
        __atomic_store_n(&p->state, ACT_OFF, __ATOMIC_RELEASE);
        return;
    }
    struct stat st;
    struct hami_stamp *own = stamps_fd >= 0 ? act_map(stamps_fd, p->uuid, 1, &st) : NULL;
    if (own) {
        p->own_dev = st.st_dev;
        p->own_ino = st.st_ino;
    }
    __atomic_store_n(&p->own, own, __ATOMIC_RELEASE);
    __atomic_store_n(&p->state, ACT_ON, __ATOMIC_RELEASE);
}

static const struct hami_stamp *act_known(const struct act_peer *peers, int n, const struct stat *st)
{
    for (int i = 0; i < n; i++)
        if (peers[i].dev == st->st_dev && peers[i].ino == st->st_ino)
            return peers[i].stamp;
    return NULL;
}

/* A board's entries for this device, again: every entry but the own stamp, whose
 * presence `own_listed` says. Called with p->lock held. */
static void list_board(struct act_dev *p, int board_fd, struct board_view *view)
{
    struct act_peer seen[ACT_MAX_PEERS];
    int n = 0, own_listed = 0;
    int fd = board_fd >= 0 ? openat(board_fd, p->uuid, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
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
            own_listed = 1;
            continue;
        }
        if (n == ACT_MAX_PEERS || act_known(seen, n, &st))
            continue;
        const struct hami_stamp *stamp = act_known(view->peers, view->npeers, &st);
        struct stat mapped;
        if (!stamp) {
            stamp = act_map(dirfd(dir), e->d_name, 0, &mapped);
            if (stamp && (mapped.st_dev != st.st_dev || mapped.st_ino != st.st_ino)) {
                munmap((void *)stamp, HAMI_STAMP_BYTES);   /* replaced in between: next time */
                stamp = NULL;
            }
        }
        if (stamp)
            seen[n++] = (struct act_peer){st.st_dev, st.st_ino, stamp};
    }
    if (dir)
        closedir(dir);
    for (int i = 0; i < view->npeers; i++)
        if (!act_known(seen, n, &(struct stat){.st_dev = view->peers[i].dev, .st_ino = view->peers[i].ino}))
            munmap((void *)view->peers[i].stamp, HAMI_STAMP_BYTES);
    memcpy(view->peers, seen, sizeof(seen[0]) * (size_t)n);
    view->npeers = n;
    view->own_listed = own_listed;
}

/* Both boards again, when ACT_LIST_NS has passed. Called with p->lock held. */
static void act_refresh(struct act_dev *p, int64_t now)
{
    if (now < p->next_list_ns)
        return;
    p->next_list_ns = now + ACT_LIST_NS;
    for (int b = 0; b < BOARD_COUNT; b++)
        list_board(p, board_fds[b], &p->boards[b]);
    int high = p->boards[BOARD_PRIORITY].own_listed;
    if (high != p->high)
        hami_debug("priority: %s on %s", high ? "high" : "low", p->uuid);
    __atomic_store_n(&p->high, high, __ATOMIC_RELEASE);
}

/* How long another entry of the board stays active, as far as we know now (0:
 * none is; one that waits for its work counts until we look again). Under p->lock. */
static int64_t active_for(const struct board_view *view, int64_t now, int64_t window)
{
    int64_t left = 0;
    for (int i = 0; i < view->npeers; i++) {
        const struct hami_stamp *s = view->peers[i].stamp;
        int64_t last = __atomic_load_n(&s->last_ns, __ATOMIC_ACQUIRE);
        if (last > 0 && last <= now + ACT_AHEAD_NS && now - last < window && window - (now - last) > left)
            left = window - (now - last);
        for (int w = 0; w < HAMI_STAMP_WAITS; w++) {
            int64_t since = __atomic_load_n(&s->waits[w], __ATOMIC_ACQUIRE);
            if (since > 0 && since <= now + ACT_AHEAD_NS && now - since < ACT_WAIT_HOLD_NS &&
                left < ACT_SLEEP_MAX_NS)
                left = ACT_SLEEP_MAX_NS;
        }
    }
    return left;
}

/* Device `dev`, opened on first use; NULL when no board applies there. */
static struct act_dev *act_device(CUdevice dev)
{
    pthread_once(&act_once, act_init_once);
    if (dev < 0 || dev >= HAMI_MAX_ORDINALS)
        return NULL;
    struct act_dev *p = &act[dev];
    int state = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
    if (state == ACT_UNKNOWN) {
        pthread_mutex_lock(&p->lock);
        if (p->state == ACT_UNKNOWN)
            act_open(p, dev);
        state = p->state;
        pthread_mutex_unlock(&p->lock);
    }
    return state == ACT_ON ? p : NULL;
}

/* The current context's device, as act_device. */
static struct act_dev *act_current(CUdevice *dev_out)
{
    CUresult (*get_device)(CUdevice *) = HAMI_DRIVER(cuCtxGetDevice);
    CUdevice dev;
    if (!get_device || get_device(&dev) != CUDA_SUCCESS)
        return NULL;
    if (dev_out)
        *dev_out = dev;
    return act_device(dev);
}

static void act_stamp(struct act_dev *p, int64_t now)
{
    __atomic_store_n(&p->own->last_ns, now, __ATOMIC_RELEASE);
}

/* The process marks that it waits for its work: a free (or stale) slot. */
static int act_mark_wait(struct act_dev *p, CUdevice dev, int64_t now)
{
    act_stamp(p, now);
    for (int w = 0; w < HAMI_STAMP_WAITS; w++) {
        int64_t seen = __atomic_load_n(&p->own->waits[w], __ATOMIC_ACQUIRE);
        if ((seen == 0 || now - seen >= ACT_WAIT_HOLD_NS || seen > now + ACT_AHEAD_NS) &&
            __atomic_compare_exchange_n(&p->own->waits[w], &seen, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            act_wait_value = now;
            return ACT_TOKEN(dev, w);
        }
    }
    /* every slot taken: the others' marks already say so; only stamp at the end */
    return ACT_TOKEN(dev, HAMI_STAMP_WAITS);
}

int hami_activity_launch_slow(void)
{
    CUdevice dev;
    struct act_dev *p = act_current(&dev);
    if (!p)
        return -1;
    const struct hami_limits *limits = hami_limits_get();
    int64_t idle = (int64_t)(limits ? limits->priority_idle_ms : HAMI_PRIORITY_IDLE_MS_DEFAULT) * 1000000LL;
    int64_t now = hami_now_ns();
    struct hami_region *r = hami_region_get();
    uint64_t *paused_ns = r && p->region_index >= 0 ? &r->sm[p->region_index].paused_ns : NULL;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        act_refresh(p, now);
        int64_t wait = p->high ? 0 : active_for(&p->boards[BOARD_PRIORITY], now, idle);
        pthread_mutex_unlock(&p->lock);
        if (!wait)
            break;
        hami_sleep_ns(wait, ACT_SLEEP_MIN_NS, ACT_SLEEP_MAX_NS);
        int64_t then = hami_now_ns();
        if (paused_ns)                           /* chunk by chunk: a reader sees "paused now" */
            __atomic_add_fetch(paused_ns, (uint64_t)(then - now), __ATOMIC_RELAXED);
        now = then;
    }
    return p->own ? act_mark_wait(p, dev, now) : -1;
}

int hami_activity_wait_slow(void)
{
    CUdevice dev;
    struct act_dev *p = act_current(&dev);
    return p && p->own ? act_mark_wait(p, dev, hami_now_ns()) : -1;
}

void hami_activity_end_slow(int token)
{
    struct hami_stamp *own = __atomic_load_n(&act[token / (HAMI_STAMP_WAITS + 1)].own, __ATOMIC_ACQUIRE);
    int slot = token % (HAMI_STAMP_WAITS + 1);
    if (!own)
        return;
    __atomic_store_n(&own->last_ns, hami_now_ns(), __ATOMIC_RELEASE);
    int64_t mine = act_wait_value;
    if (slot < HAMI_STAMP_WAITS)   /* unless another took it over as stale */
        __atomic_compare_exchange_n(&own->waits[slot], &mine, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

void hami_activity_running_slow(void)
{
    struct act_dev *p = act_current(NULL);
    if (p && p->own)
        act_stamp(p, hami_now_ns());
}

int hami_activity_lock(CUdevice dev)
{
    struct act_dev *p = act_device(dev);
    if (!p || board_fds[BOARD_ACTIVITY] < 0)
        return -1;
    char what[HAMI_UUID_LEN + 32];
    snprintf(what, sizeof what, "activity board %s", p->uuid);
    return hami_flock_bounded(openat(board_fds[BOARD_ACTIVITY], p->uuid,
                                     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), what);
}

int hami_activity_others(int64_t window_ns)
{
    if (!hami_config.activity_board)
        return -1;
    struct act_dev *p = act_current(NULL);
    if (!p || board_fds[BOARD_ACTIVITY] < 0)
        return -1;
    int64_t now = hami_now_ns();
    pthread_mutex_lock(&p->lock);
    act_refresh(p, now);
    int others = active_for(&p->boards[BOARD_ACTIVITY], now, window_ns) > 0;
    pthread_mutex_unlock(&p->lock);
    return others;
}
