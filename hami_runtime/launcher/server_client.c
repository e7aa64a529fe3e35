/*
 * A request to the create server: one AF_UNIX stream connection. The request
 * is a little-endian u32 length, then NUL-terminated fields: the protocol,
 * cwd, umask (octal), argc, the argv, the env; stdin, stdout and stderr ride
 * along its first bytes (SCM_RIGHTS). The server takes it on ("A"; we answer
 * "G") or declines it ("F", or nothing); then its answer, until it closes:
 * "E<runtime path>" (exec it with argv) or "X<status>" (exit with it).
 */
#include "server_client.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define PROTOCOL "hami-create-1" /* create_server.py */
#define ACK_MS 2000

extern char **environ;

/* The server's socket, connected, if it is a process of our own uid's. */
static int connected(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return -1;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct ucred peer;
    socklen_t len = sizeof peer;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != geteuid()) {
        close(fd);
        return -1;
    }
    return fd;
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

static int send_request(int fd, const char *buf, size_t total, const int fds[3])
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
    ssize_t n;
    while ((n = sendmsg(fd, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    if (n <= 0)
        return -1;
    for (size_t sent = (size_t)n; sent < total; sent += (size_t)n)
        while ((n = send(fd, buf + sent, total - sent, MSG_NOSIGNAL)) <= 0)
            if (n == 0 || errno != EINTR)
                return -1;
    return 0;
}

/* The server took the request on ("A" within ACK_MS), and is told to go on
 * ("G"): a server that is stopped, or too slow to start, is passed by (the
 * caller runs the command itself), and one that took the request on after we
 * gave up finds us gone and does nothing. */
static int taken_on(int fd)
{
    struct pollfd ready = {fd, POLLIN, 0};
    int n;
    while ((n = poll(&ready, 1, ACK_MS)) < 0 && errno == EINTR)
        ;
    char ack;
    if (n != 1 || read(fd, &ack, 1) != 1 || ack != 'A')
        return 0;
    return send(fd, "G", 1, MSG_NOSIGNAL) == 1;
}

static int answer(int fd, char *runtime, size_t size, int *status)
{
    char text[PATH_MAX + 16];
    size_t got = 0;
    ssize_t n;
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
    int fd = connected(socket_path);
    if (fd < 0)
        return NOT_SERVED;
    size_t total;
    char *buf = request(argv, &total);
    int served = buf && send_request(fd, buf, total, fds) == 0 && taken_on(fd)
                     ? answer(fd, runtime, size, status) : NOT_SERVED;
    free(buf);
    close(fd);
    return served;
}
