/*
 * A request to the create server: one AF_UNIX stream connection. The request
 * is a little-endian u32 length, then NUL-terminated fields: the protocol,
 * cwd, umask (octal), argc, the argv, the env; stdin, stdout and stderr ride
 * along its first bytes (SCM_RIGHTS). The server takes it on ("A"; we answer
 * "G") or declines it ("F", or nothing); then its answer, until it closes:
 * "E<runtime path>" (exec it with argv) or "X<status>" (exit with it).
 *
 * Whoever can rename a socket over the server's path (root in a container
 * given a hostPath above the state dir) would get the engine's argv, env and
 * fds and name what we exec: the listener is identified before a byte is sent
 * (identify). Everything up to the server's "A" shares one deadline (ACK_MS),
 * so that a stopped, starved or flooded server costs a create that much at
 * most: connect never waits (a full backlog is "no server"), nor does a send.
 */
#include "server_client.h"

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL "hami-create-1" /* create_server.py */
#define ACK_MS 2000
#define SERVER_LOCK_FD 3 /* where the launcher hands the server its lock (hami-runtime.c) */

/* A pidfd of the peer (Linux 6.5): it pins the process, so pid reuse cannot
 * pass the checks off as its. Elsewhere the pid alone. */
#if !defined(SO_PEERPIDFD) && (defined(__x86_64__) || defined(__aarch64__) || defined(__i386__))
#define SO_PEERPIDFD 77
#endif

extern char **environ;

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* fd is ready for `events` before the deadline. */
static int ready(int fd, short events, long long deadline)
{
    struct pollfd p = {fd, events, 0};
    int n;
    do {
        long long left = deadline - now_ms();
        n = poll(&p, 1, left > 0 ? (int)left : 0);
    } while (n < 0 && errno == EINTR);
    return n == 1;
}

/* The server's socket, connected without waiting: a full backlog (a stopped
 * or flooded server) is EAGAIN, and no server. */
static int connected(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return -1;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* 1: the same file (dev and inode) at both paths, /proc's links naming the
 * object; 0: another; -1: a path names nothing (errno). */
static int same_file(const char *a, const char *b)
{
    struct stat x, y;
    if (stat(a, &x) != 0 || stat(b, &y) != 0)
        return -1;
    return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* The listener's process lives: the pidfd's (then the /proc reads before
 * this were of it, its pid not yet reused), else whatever has its pid. */
static int still_alive(int pidfd, pid_t pid)
{
#ifdef SYS_pidfd_send_signal
    if (pidfd >= 0)
        return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0;
#else
    (void)pidfd;
#endif
    return kill(pid, 0) == 0 || errno != ESRCH;
}

/*
 * NULL where the process listening at fd's other end is this node's create
 * server, else why not: a process of our euid, in our mount and pid
 * namespaces with our root (so that the paths and the pid a request holds
 * mean what they mean here), running the interpreter we would run, holding
 * the server lock at its fd 3 (create_server.py's LOCK_FD). *pid: the listener's.
 */
static const char *identify(int fd, const char *socket_path, pid_t *pid)
{
    struct ucred peer;
    socklen_t len = sizeof peer;
    *pid = 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.pid <= 0)
        return "no process of this pid namespace";
    *pid = peer.pid;
    if (peer.uid != geteuid())
        return "another uid";
    int pidfd = -1;
#ifdef SO_PEERPIDFD
    len = sizeof pidfd;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0) {
        if (errno != ENOPROTOOPT)
            return "ended"; /* the process that listened is gone: its socket was handed on */
        pidfd = -1;
    }
#endif
    static const char *const views[][2] = {{"ns/mnt", "another mount namespace"},
                                           {"ns/pid", "another pid namespace"},
                                           {"root", "another root"}};
    char mine[64], theirs[64], lock[PATH_MAX];
    const char *why = NULL;
    for (size_t i = 0; !why && i < sizeof views / sizeof views[0]; i++) {
        snprintf(mine, sizeof mine, "/proc/self/%s", views[i][0]);
        snprintf(theirs, sizeof theirs, "/proc/%d/%s", (int)peer.pid, views[i][0]);
        int same = same_file(mine, theirs);
        if (same != 1)
            why = same < 0 && errno == ENOENT ? "ended" : views[i][1]; /* a zombie has no namespaces left */
    }
    const char *slash = strrchr(socket_path, '/');
    snprintf(theirs, sizeof theirs, "/proc/%d/exe", (int)peer.pid);
    if (!why && same_file(HAMI_PYTHON, theirs) != 1)
        why = "another program";
    snprintf(theirs, sizeof theirs, "/proc/%d/fd/%d", (int)peer.pid, SERVER_LOCK_FD);
    if (!why && (!slash || snprintf(lock, sizeof lock, "%.*s/%s", (int)(slash - socket_path), socket_path,
                                    strrchr(SERVER_LOCK, '/') + 1) >= (int)sizeof lock ||
                 same_file(lock, theirs) != 1))
        why = "not holding the server lock";
    if (!still_alive(pidfd, peer.pid))
        why = "ended";
    if (pidfd >= 0)
        close(pidfd);
    return why;
}

/* A warning in the runtime's log (config log_file), as hami_runtime/log.py writes
 * one: never through a link, nor into anything but a regular file. */
static void log_warning(const char *message)
{
    char log_file[PATH_MAX], stamp[32], line[PATH_MAX + 512];
    time_t now = time(NULL);
    struct tm utc;
    if (config_warning_log(log_file, sizeof log_file) != 0 || !gmtime_r(&now, &utc) ||
        !strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc))
        return;
    int n = snprintf(line, sizeof line, "%s warning pid=%d %s\n", stamp, (int)getpid(), message);
    int fd = open(log_file, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                  0640);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        write(fd, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1) < 0) {
        /* the log never fails the caller */
    }
    close(fd);
}

/* Appends one NUL-terminated field; -1 where it would not fit. */
static int put(char **buf, size_t *used, size_t *cap, const char *field)
{
    size_t n = strlen(field) + 1;
    while (*used + n > *cap) {
        if (*cap > (64u << 20))
            return -1;
        char *bigger = realloc(*buf, *cap * 2);
        if (!bigger)
            return -1;
        *buf = bigger;
        *cap *= 2;
    }
    memcpy(*buf + *used, field, n);
    *used += n;
    return 0;
}

/* The request's bytes (length first); NULL where it cannot be made. */
static char *request(char **argv, size_t *total)
{
    char cwd[PATH_MAX], number[32];
    if (!getcwd(cwd, sizeof cwd))
        return NULL;
    mode_t mask = umask(0);
    umask(mask);
    int argc = 0;
    while (argv[argc])
        argc++;
    size_t cap = 1 << 16, used = 4;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    int bad = put(&buf, &used, &cap, PROTOCOL) || put(&buf, &used, &cap, cwd);
    snprintf(number, sizeof number, "%o", (unsigned)mask);
    bad = bad || put(&buf, &used, &cap, number);
    snprintf(number, sizeof number, "%d", argc);
    bad = bad || put(&buf, &used, &cap, number);
    for (int i = 0; !bad && i < argc; i++)
        bad = put(&buf, &used, &cap, argv[i]);
    for (char **e = environ; !bad && *e; e++)
        bad = put(&buf, &used, &cap, *e);
    if (bad) {
        free(buf);
        return NULL;
    }
    uint32_t length = (uint32_t)(used - 4);
    for (int i = 0; i < 4; i++)
        buf[i] = (char)((length >> (8 * i)) & 0xff);
    *total = used;
    return buf;
}

/* Sends without waiting past the deadline (a server that stopped reading
 * fills the socket's buffer). */
static int send_request(int fd, const char *buf, size_t total, const int fds[3], long long deadline)
{
    char control[CMSG_SPACE(3 * sizeof(int))];
    memset(control, 0, sizeof control);
    struct iovec first = {(void *)buf, total};
    struct msghdr msg = {.msg_iov = &first, .msg_iovlen = 1,
                         .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(3 * sizeof(int));
    memcpy(CMSG_DATA(c), fds, 3 * sizeof(int));
    size_t sent = 0;
    while (sent < total) {
        /* the fds go with the first bytes, once */
        ssize_t n = sent ? send(fd, buf + sent, total - sent, MSG_NOSIGNAL) : sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n > 0)
            sent += (size_t)n;
        else if (n == 0 || (errno != EINTR && (errno != EAGAIN || !ready(fd, POLLOUT, deadline))))
            return -1;
    }
    return 0;
}

/* The server took the request on ("A" before the deadline), and is told to go
 * on ("G"): a server that is stopped, or too slow to start, is passed by (the
 * caller runs the command itself), and one that took the request on after we
 * gave up finds us gone and does nothing. */
static int taken_on(int fd, long long deadline)
{
    char ack;
    ssize_t n;
    while ((n = read(fd, &ack, 1)) < 0 && (errno == EINTR || (errno == EAGAIN && ready(fd, POLLIN, deadline))))
        ;
    return n == 1 && ack == 'A' && send(fd, "G", 1, MSG_NOSIGNAL) == 1;
}

/* Once taken on, the command is the server's: its answer comes when the
 * command is done, which takes what the command takes (as its own Python would). */
static int answer(int fd, char *runtime, size_t size, int *status)
{
    char text[PATH_MAX + 16];
    size_t got = 0;
    ssize_t n;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        return NOT_SERVED;
    while (got < sizeof text - 1 && (n = read(fd, text + got, sizeof text - 1 - got)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return NOT_SERVED;
        }
        got += (size_t)n;
    }
    text[got] = '\0';
    if (got > 1 && text[0] == 'E' && text[1] == '/' && got - 1 < size) {
        memcpy(runtime, text + 1, got);
        return SERVED_EXEC;
    }
    char *end = text;
    long code = got > 1 && text[0] == 'X' ? strtol(text + 1, &end, 10) : -1;
    if (code < 0 || code > 255 || *end)
        return NOT_SERVED;
    *status = (int)code;
    return SERVED_EXIT;
}

int server_request(const char *socket_path, char **argv, const int fds[3],
                   char *runtime, size_t size, int *status)
{
    long long deadline = now_ms() + ACK_MS;
    int fd = connected(socket_path);
    if (fd < 0)
        return NOT_SERVED;
    pid_t pid;
    const char *why = identify(fd, socket_path, &pid);
    if (why) {
        close(fd);
        char message[PATH_MAX + 256];
        snprintf(message, sizeof message,
                 "create server: the listener on %s (pid %d) is not this node's server (%s): "
                 "nothing sent to it, the command runs its own Python", socket_path, (int)pid, why);
        log_warning(message);
        return NOT_SERVED;
    }
    size_t total;
    char *buf = request(argv, &total);
    int served = buf && send_request(fd, buf, total, fds, deadline) == 0 && taken_on(fd, deadline)
                     ? answer(fd, runtime, size, status) : NOT_SERVED;
    free(buf);
    close(fd);
    return served;
}
