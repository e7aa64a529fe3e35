/*
 * The createRuntime hook without an interpreter start (runc runs it inside
 * its create, so its time is the create's):
 *
 *   hami-runtime hami-hook --state-dir DIR --root-key KEY
 *       [--rootfs ROOT --etc bind|dir|mount --libvgpu PATH] createRuntime  < OCI state
 *
 * checks, with --rootfs (the runtime always gives it), that the container's
 * mount tree holds the slice as the runtime meant it, and fails the create
 * with one line on stderr otherwise (runc then tears the container down and
 * puts the line in its error); then records the container's host PID as
 * <DIR>/private/<id>@<KEY>/pid ("<pid>\n", replaced atomically), which hamictl
 * reads; KEY names the runc root (an allocation belongs to a runc root and an
 * id). A container with no private dir has no allocation: nothing to record
 * (and, with --rootfs, nothing to check against: refused). Nothing here
 * follows a symlink inside the state dir. No poststop hook is needed with the
 * launcher: hami-runtime delete frees the allocation, as does any later
 * allocator transaction (runc removes the container's state before poststop).
 *
 * The check (hami_runtime/lifecycle/spec_edit/rootfs.py mounted_problem is the same, with
 * the same lines): runc runs this hook on the host while its init, the state's
 * pid, waits in the container's mount namespace with every mount made and the
 * root not yet pivoted, so /proc/<pid>/root + ROOT is the container's tree.
 * Each path is opened without following a link and compared by device and
 * inode with the host's files: ROOT the host's ROOT; /etc a directory, the
 * rootfs's own /etc as the host sees it now (bind, dir) and its own mount point
 * (bind, mount); /etc/ld.so.preload the runtime's private/<name>/ld.so.preload;
 * /.hami a mount point on a device of its own, its libvgpu.so the node's
 * libvgpu, its limits private/<name>/limits, its shared/, activity/ and
 * priority/ containers/<name>/ and the boards. A second container given the
 * same rootfs dir can swap any of them with a link between the runtime's look
 * at create and runc's mounts (and runc follows a link in the /etc bind's
 * source on the host): this is where that is seen.
 */
#include "hook.h"
#include "ids.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define MAX_STATE (1024 * 1024)

static int fail(const char *message, const char *detail)
{
    fprintf(stderr, "hami-hook: %s%s%s\n", message, detail ? ": " : "", detail ? detail : "");
    return 1;
}

/* A JSON scanner just deep enough for the top level of the OCI state. */
struct scan {
    const char *p, *end;
};

static void skip_space(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

/* A string at s->p; its raw bytes (escapes left as they are) in [*start, *stop). */
static int scan_string(struct scan *s, const char **start, const char **stop)
{
    if (s->p >= s->end || *s->p != '"')
        return -1;
    const char *q = s->p + 1;
    while (q < s->end && *q != '"') {
        if (*q == '\\')
            q++;
        q++;
    }
    if (q >= s->end)
        return -1;
    *start = s->p + 1;
    *stop = q;
    s->p = q + 1;
    return 0;
}

/* Any value: strings and nesting followed, the rest up to a delimiter. */
static int skip_value(struct scan *s)
{
    skip_space(s);
    if (s->p >= s->end)
        return -1;
    if (*s->p == '"') {
        const char *a, *b;
        return scan_string(s, &a, &b);
    }
    if (*s->p == '{' || *s->p == '[') {
        int depth = 0;
        while (s->p < s->end) {
            if (*s->p == '"') {
                const char *a, *b;
                if (scan_string(s, &a, &b) != 0)
                    return -1;
                continue;
            }
            if (*s->p == '{' || *s->p == '[')
                depth++;
            else if (*s->p == '}' || *s->p == ']')
                depth--;
            s->p++;
            if (depth == 0)
                return 0;
        }
        return -1;
    }
    while (s->p < s->end && !strchr(",}] \t\r\n", *s->p))
        s->p++;
    return 0;
}

/* The top-level "id" (a string without escapes) and "pid" (0 when absent). */
static int parse_state(const char *text, size_t len, char *id, size_t id_size, long *pid)
{
    struct scan s = {text, text + len};
    int have_id = 0;
    *pid = 0;
    skip_space(&s);
    if (s.p >= s.end || *s.p++ != '{')
        return -1;
    for (;;) {
        skip_space(&s);
        if (s.p < s.end && *s.p == '}')
            break;
        const char *key, *key_end;
        if (scan_string(&s, &key, &key_end) != 0)
            return -1;
        skip_space(&s);
        if (s.p >= s.end || *s.p++ != ':')
            return -1;
        skip_space(&s);
        size_t key_len = (size_t)(key_end - key);
        const char *value = s.p;
        if (skip_value(&s) != 0)
            return -1;
        if (key_len == 2 && memcmp(key, "id", 2) == 0) {
            size_t n = (size_t)(s.p - value);
            if (n < 2 || value[0] != '"' || n - 2 >= id_size || memchr(value + 1, '\\', n - 2))
                return -2;
            memcpy(id, value + 1, n - 2);
            id[n - 2] = '\0';
            have_id = 1;
        } else if (key_len == 3 && memcmp(key, "pid", 3) == 0) {
            char *num_end;
            errno = 0;
            *pid = strtol(value, &num_end, 10);
            if (errno || num_end != s.p || *pid < 0 || *pid > INT_MAX)
                return -1;
        }
        skip_space(&s);
        if (s.p < s.end && *s.p == ',') {
            s.p++;
            continue;
        }
        if (s.p < s.end && *s.p == '}')
            break;
        return -1;
    }
    return have_id ? 0 : -2;
}

/* The root key: 16 lowercase hex digits (hami_runtime/lifecycle/node_state/store.py root_key). */
static int valid_root_key(const char *key)
{
    if (strlen(key) != 16)
        return 0;
    for (const char *c = key; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return 0;
    return 1;
}

/* 0: a real directory; 1: absent; -1: anything else (a symlink included). */
static int real_dir(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 1 : -1;
    return S_ISDIR(st.st_mode) ? 0 : -1;
}

static int record_pid(const char *state_dir, const char *id, const char *key, long pid)
{
    char base[PATH_MAX], dir[PATH_MAX], tmp[PATH_MAX], path[PATH_MAX];
    if (snprintf(base, sizeof base, "%s/private", state_dir) >= (int)sizeof base ||
        snprintf(dir, sizeof dir, "%s/%s@%s", base, id, key) >= (int)sizeof dir ||
        snprintf(path, sizeof path, "%s/pid", dir) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/.pid.%ld.tmp", dir, (long)getpid()) >= (int)sizeof tmp)
        return fail("--state-dir", "path too long");
    const char *const parts[] = {base, dir};
    for (int i = 0; i < 2; i++) {
        int found = real_dir(parts[i]);
        if (found == 1)
            return 0;
        if (found < 0)
            return fail(parts[i], "not a real directory (a symlink is refused)");
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return fail(tmp, strerror(errno));
    char line[32];
    int len = snprintf(line, sizeof line, "%ld\n", pid);
    int ok = write(fd, line, (size_t)len) == len;
    ok = (close(fd) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int saved = errno;
        unlink(tmp);
        return fail(path, strerror(saved));
    }
    return 0;
}

/* --- the check of the container's mounts --- */

#ifndef SYS_openat2
#define SYS_openat2 437 /* the same number on every architecture */
#endif
/* linux/openat2.h's, which older headers lack */
struct hook_open_how {
    uint64_t flags, mode, resolve;
};
#define HOOK_RESOLVE_NO_MAGICLINKS 0x02
#define HOOK_RESOLVE_NO_SYMLINKS 0x04

static const char *const ETC_MODES[] = {"bind", "dir", "mount"};

/* The line a failed check prints (after "hami-hook: container <id>: "). */
static char problem[3 * PATH_MAX];

__attribute__((format(printf, 1, 2))) static int mismatch(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(problem, sizeof problem, format, args);
    va_end(args);
    return -1;
}

/* One path as opened, the link itself where it is one; fd -1: absent. */
struct node {
    int fd;
    struct stat st;
};

#define MAX_FDS 16
struct fds {
    int fd[MAX_FDS];
    int n;
};

static int keep(struct fds *open_fds, int fd)
{
    if (fd < 0 || open_fds->n < MAX_FDS) {
        if (fd >= 0)
            open_fds->fd[open_fds->n++] = fd;
        return fd;
    }
    close(fd); /* cannot happen: the check opens fewer */
    errno = EMFILE;
    return -1;
}

static const char *kind_name(mode_t mode)
{
    switch (mode & S_IFMT) {
    case S_IFLNK: return "a symbolic link";
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    default: return "an odd file";
    }
}

/* What rootfs.py's _describe says of the same node. */
static const char *describe(const struct node *n, char *buf, size_t size)
{
    if (n->fd < 0)
        return "nothing";
    snprintf(buf, size, "%s (device %u:%u, inode %llu)", kind_name(n->st.st_mode), major(n->st.st_dev),
             minor(n->st.st_dev), (unsigned long long)n->st.st_ino);
    return buf;
}

static int same(const struct node *a, const struct stat *b)
{
    return a->fd >= 0 && a->st.st_dev == b->st_dev && a->st.st_ino == b->st_ino;
}

/* `name` under dir, not following a link: 0 (fd -1 when absent) or -1. */
static int at(struct fds *open_fds, int dir, const char *name, struct node *n)
{
    n->fd = keep(open_fds, openat(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (n->fd < 0)
        return errno == ENOENT ? 0 : -1;
    return fstat(n->fd, &n->st);
}

/* The directory at absolute `path` under start, no link followed: openat2
 * where the kernel has it, else one component at a time with O_NOFOLLOW. */
static int open_dir_beneath(int start, const char *path)
{
    for (const char *p = path; *p;) {
        while (*p == '/')
            p++;
        size_t len = strcspn(p, "/");
        if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) {
            errno = EINVAL; /* the runtime gives a real path: none of these */
            return -1;
        }
        p += len;
    }
    const char *rel = path + strspn(path, "/");
    if (!*rel)
        return fcntl(start, F_DUPFD_CLOEXEC, 0);
    struct hook_open_how how = {O_PATH | O_DIRECTORY | O_CLOEXEC, 0,
                                HOOK_RESOLVE_NO_SYMLINKS | HOOK_RESOLVE_NO_MAGICLINKS};
    long got = syscall(SYS_openat2, start, rel, &how, sizeof how);
    if (got >= 0 || (errno != ENOSYS && errno != EPERM && errno != E2BIG))
        return (int)got;
    int fd = fcntl(start, F_DUPFD_CLOEXEC, 0);
    char part[NAME_MAX + 1];
    for (const char *p = rel; fd >= 0 && *p;) {
        size_t len = strcspn(p, "/");
        if (len > NAME_MAX) {
            close(fd);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(part, p, len);
        part[len] = '\0';
        int next = openat(fd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int saved = errno;
        close(fd);
        errno = saved;
        fd = next;
        p += len;
        p += strspn(p, "/");
    }
    return fd;
}

/* The mount id of fd's mount: statx where the kernel reports it (5.8), else
 * /proc/self/fdinfo (3.15). A bind of a dir onto itself keeps its device: a
 * mount point is told by its mount id. */
static int mount_id(int fd, unsigned long long *id)
{
#ifdef STATX_MNT_ID
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) == 0 &&
        (sx.stx_mask & STATX_MNT_ID)) {
        *id = sx.stx_mnt_id;
        return 0;
    }
#endif
    char path[64], text[4096];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    int info = open(path, O_RDONLY | O_CLOEXEC);
    if (info < 0)
        return -1;
    ssize_t n = read(info, text, sizeof text - 1);
    close(info);
    text[n > 0 ? n : 0] = '\0';
    const char *line = strstr(text, "mnt_id:");
    if (!line || (line != text && line[-1] != '\n')) {
        errno = ENOSYS;
        return -1;
    }
    *id = strtoull(line + strlen("mnt_id:"), NULL, 10);
    return 0;
}

/* What the runtime made on the host for one container, and where the
 * container is to see it: /etc/ld.so.preload, or a name in /.hami. */
struct host_file {
    const char *in_hami; /* NULL: the preload */
    const char *what;
    char path[PATH_MAX];
    int follow; /* libvgpu: runc follows the bind's source on the host, as stat does */
    int dir;
    struct stat st;
};

enum { PRELOAD, LIBVGPU, LIMITS, REGION, ACTIVITY, PRIORITY, HOST_FILES };

static int check_mounts(struct fds *open_fds, long pid, const char *root, const char *etc_mode,
                        struct host_file *host)
{
    char path[PATH_MAX + 32], found[128], expected[128];
    for (int i = 0; i < HOST_FILES; i++) {
        if ((host[i].follow ? stat : lstat)(host[i].path, &host[i].st) != 0)
            return mismatch("%s: %s: nothing to check the container's mounts against", host[i].path,
                            strerror(errno));
        if (host[i].dir ? !S_ISDIR(host[i].st.st_mode) : !S_ISREG(host[i].st.st_mode)) {
            struct node n = {0, host[i].st};
            return mismatch("%s is %s, not %s", host[i].path, describe(&n, found, sizeof found),
                            host[i].dir ? "a directory" : "a regular file");
        }
    }

    int slash = keep(open_fds, open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    struct node host_root = {keep(open_fds, slash < 0 ? -1 : open_dir_beneath(slash, root)), {0}};
    if (host_root.fd < 0 || fstat(host_root.fd, &host_root.st) != 0)
        return mismatch("%s: %s: the rootfs cannot be opened on the host without following a link", root,
                        strerror(errno));
    char proc_root[64];
    snprintf(proc_root, sizeof proc_root, "/proc/%ld/root", pid);
    int proc = keep(open_fds, open(proc_root, O_PATH | O_DIRECTORY | O_CLOEXEC));
    struct node inside = {keep(open_fds, proc < 0 ? -1 : open_dir_beneath(proc, root)), {0}};
    if (inside.fd < 0 && errno == ENOENT) {
        /* a runtime that pivots before createRuntime: the init's root is the rootfs */
        struct stat st;
        if (fstat(proc, &st) == 0 && st.st_dev == host_root.st.st_dev && st.st_ino == host_root.st.st_ino)
            inside.fd = keep(open_fds, fcntl(proc, F_DUPFD_CLOEXEC, 0));
        else
            errno = ENOENT;
    }
    if (inside.fd < 0 || fstat(inside.fd, &inside.st) != 0)
        return mismatch("%s: %s: cannot be opened in the container's mount namespace (%s) without "
                        "following a link", root, strerror(errno), proc_root);
    if (!same(&inside, &host_root.st)) {
        snprintf(expected, sizeof expected, "%s", describe(&host_root, found, sizeof found));
        return mismatch("%s is %s, not the rootfs the host has there (%s)", root,
                        describe(&inside, found, sizeof found), expected);
    }
    unsigned long long root_mount, mount;
    if (mount_id(inside.fd, &root_mount) != 0)
        return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));

    struct node etc, own, file, hami;
    snprintf(path, sizeof path, "%s/etc", root);
    if (at(open_fds, inside.fd, "etc", &etc) != 0)
        return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));
    if (etc.fd < 0 || !S_ISDIR(etc.st.st_mode))
        return mismatch("%s is %s, not a directory", path, describe(&etc, found, sizeof found));
    if (strcmp(etc_mode, "mount") != 0) {
        if (at(open_fds, host_root.fd, "etc", &own) != 0)
            return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));
        if (!same(&etc, &own.st) || own.fd < 0) {
            snprintf(expected, sizeof expected, "%s", describe(&own, found, sizeof found));
            return mismatch("%s is %s, not the rootfs's own /etc (%s)", path,
                            describe(&etc, found, sizeof found), expected);
        }
    }
    if (strcmp(etc_mode, "dir") != 0) {
        if (mount_id(etc.fd, &mount) != 0)
            return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));
        if (mount == root_mount)
            return mismatch("%s is the rootfs's directory, not a mount point of its own: runc's /etc "
                            "mount went elsewhere", path);
    }
    snprintf(path, sizeof path, "%s/etc/ld.so.preload", root);
    if (at(open_fds, etc.fd, "ld.so.preload", &file) != 0)
        return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));
    if (!same(&file, &host[PRELOAD].st))
        return mismatch("%s is %s, not %s (%s)", path, describe(&file, found, sizeof found), host[PRELOAD].what,
                        host[PRELOAD].path);

    snprintf(path, sizeof path, "%s/.hami", root);
    if (at(open_fds, inside.fd, ".hami", &hami) != 0)
        return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));
    if (hami.fd < 0 || !S_ISDIR(hami.st.st_mode))
        return mismatch("%s is %s, not a directory", path, describe(&hami, found, sizeof found));
    if (mount_id(hami.fd, &mount) != 0)
        return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));
    if (mount == root_mount || hami.st.st_dev == inside.st.st_dev)
        return mismatch("%s is the rootfs's directory, not the runtime's tmpfs: runc's /.hami mount "
                        "went elsewhere", path);
    for (int i = LIBVGPU; i < HOST_FILES; i++) {
        snprintf(path, sizeof path, "%s/.hami/%s", root, host[i].in_hami);
        if (at(open_fds, hami.fd, host[i].in_hami, &file) != 0)
            return mismatch("%s: cannot check the container's mounts: %s", root, strerror(errno));
        if (!same(&file, &host[i].st))
            return mismatch("%s is %s, not %s (%s)", path, describe(&file, found, sizeof found), host[i].what,
                            host[i].path);
    }
    return 0;
}

/* The check, for the container `id` of this root key: its private dir holds
 * what the mounts are compared with (none: no allocation, refused). */
static int check_container(const char *state_dir, const char *id, const char *key, long pid,
                           const char *root, const char *etc_mode, const char *libvgpu)
{
    static struct host_file host[HOST_FILES] = {
        [PRELOAD] = {NULL, "the preload the runtime made for it", "", 0, 0, {0}},
        [LIBVGPU] = {"libvgpu.so", "the node's libvgpu", "", 1, 0, {0}},
        [LIMITS] = {"limits", "its limits", "", 0, 0, {0}},
        [REGION] = {"shared", "its region dir", "", 0, 1, {0}},
        [ACTIVITY] = {"activity", "the activity board", "", 0, 1, {0}},
        [PRIORITY] = {"priority", "the priority board", "", 0, 1, {0}},
    };
    char base[PATH_MAX], dir[PATH_MAX];
    if (snprintf(base, sizeof base, "%s/private", state_dir) >= (int)sizeof base ||
        snprintf(dir, sizeof dir, "%s/%s@%s", base, id, key) >= (int)sizeof dir ||
        snprintf(host[PRELOAD].path, PATH_MAX, "%s/ld.so.preload", dir) >= PATH_MAX ||
        snprintf(host[LIBVGPU].path, PATH_MAX, "%s", libvgpu) >= PATH_MAX ||
        snprintf(host[LIMITS].path, PATH_MAX, "%s/limits", dir) >= PATH_MAX ||
        snprintf(host[REGION].path, PATH_MAX, "%s/containers/%s@%s", state_dir, id, key) >= PATH_MAX ||
        snprintf(host[ACTIVITY].path, PATH_MAX, "%s/activity", state_dir) >= PATH_MAX ||
        snprintf(host[PRIORITY].path, PATH_MAX, "%s/priority", state_dir) >= PATH_MAX)
        return fail("--state-dir", "path too long");
    const char *const parts[] = {base, dir};
    for (int i = 0; i < 2; i++) {
        int found = real_dir(parts[i]);
        if (found != 0) {
            fprintf(stderr, "hami-hook: container %s: %s: %s: no allocation to check its mounts "
                            "against; the create is refused\n", id, parts[i],
                    found == 1 ? "absent" : "not a real directory (a symlink is refused)");
            return 1;
        }
    }
    if (pid <= 0) {
        fprintf(stderr, "hami-hook: container %s: the OCI state has no pid: its mounts cannot be "
                        "checked; the create is refused\n", id);
        return 1;
    }
    struct fds open_fds = {{0}, 0};
    int checked = check_mounts(&open_fds, pid, root, etc_mode, host);
    for (int i = 0; i < open_fds.n; i++)
        close(open_fds.fd[i]);
    if (checked != 0) {
        fprintf(stderr, "hami-hook: container %s: %s; the create is refused\n", id, problem);
        return 1;
    }
    return 0;
}

int hook_main(int argc, char **argv)
{
    const char *state_dir = NULL, *key = NULL, *stage = NULL, *root = NULL, *etc_mode = NULL,
               *libvgpu = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--state-dir") == 0 && i + 1 < argc)
            state_dir = argv[++i];
        else if (strcmp(argv[i], "--root-key") == 0 && i + 1 < argc)
            key = argv[++i];
        else if (strcmp(argv[i], "--rootfs") == 0 && i + 1 < argc)
            root = argv[++i];
        else if (strcmp(argv[i], "--etc") == 0 && i + 1 < argc)
            etc_mode = argv[++i];
        else if (strcmp(argv[i], "--libvgpu") == 0 && i + 1 < argc)
            libvgpu = argv[++i];
        else if (!stage)
            stage = argv[i];
        else
            return fail("argument not understood", argv[i]);
    }
    if (!state_dir || !key || !stage || strcmp(stage, "createRuntime") != 0)
        return fail("usage", "hami-runtime hami-hook --state-dir DIR --root-key KEY "
                             "[--rootfs ROOT --etc bind|dir|mount --libvgpu PATH] createRuntime");
    if (!valid_root_key(key))
        return fail("--root-key must be 16 lowercase hex digits", key);
    if (state_dir[0] != '/')
        return fail("--state-dir must be an absolute path", state_dir);
    if ((root || etc_mode || libvgpu) && !(root && etc_mode && libvgpu))
        return fail("usage", "--rootfs, --etc and --libvgpu go together");
    if (root && (root[0] != '/' || libvgpu[0] != '/'))
        return fail("--rootfs and --libvgpu must be absolute paths", root[0] != '/' ? root : libvgpu);
    int known_mode = !etc_mode;
    for (size_t i = 0; etc_mode && i < sizeof ETC_MODES / sizeof ETC_MODES[0]; i++)
        known_mode |= strcmp(etc_mode, ETC_MODES[i]) == 0;
    if (!known_mode)
        return fail("--etc must be bind, dir or mount", etc_mode);

    static char text[MAX_STATE + 1];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(STDIN_FILENO, text + len, MAX_STATE - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail("stdin", strerror(errno));
        if (n == 0)
            break;
        len += (size_t)n;
        if (len == MAX_STATE)
            return fail("stdin", "OCI state larger than 1 MiB");
    }
    char id[MAX_ID + 2];
    long pid;
    int parsed = parse_state(text, len, id, sizeof id, &pid);
    if (parsed == -1)
        return fail("stdin: not an OCI state document", NULL);
    if (parsed == -2)
        return fail("container id", "missing container id");
    if (!valid_container_id(id)) {
        fprintf(stderr, "hami-hook: container id='%s': must be letters, digits, '_', '.', '+', '-'"
                        " (no path parts)\n", id);
        return 1;
    }
    if (root && check_container(state_dir, id, key, pid, root, etc_mode, libvgpu) != 0)
        return 1;
    return record_pid(state_dir, id, key, pid);
}
