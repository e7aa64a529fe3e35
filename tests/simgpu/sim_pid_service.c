/*
 * hami-sim-pids SOCKET: what the kernel tells a real driver, for the simulated one.
 *
 * A real driver names every process by its pid in the host's pid namespace (the
 * kernel module sees the global pid), also for processes in containers, which
 * cannot see that pid themselves. The simulated driver is a library in each
 * process, so a process in another pid namespace may ask this service, run on the
 * host beside the simulator's state file (optional: without it, readers in the host's
 * namespace find that pid in /proc, sim_pids.c, and the process's own namespace names
 * it by its own pid; with it, it is named by its host pid everywhere, as on a real
 * driver): it listens on SOCKET (a unix socket in
 * the state file's directory, which containers share), and answers each
 * connection with the peer's pid as the kernel translates it into the service's
 * own pid namespace (SO_PEERCRED), as one decimal line. Nothing is read from the
 * client. It ends on SIGTERM or SIGINT, and when the process that started it
 * dies (so a test killed half-way leaves no service behind).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;

static void stop(int sig)
{
    (void)sig;
    stopping = 1;
}

int main(int argc, char **argv)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (argc != 2 || strlen(argv[1]) >= sizeof addr.sun_path) {
        fprintf(stderr, "usage: hami-sim-pids SOCKET (a path under %zu bytes)\n", sizeof addr.sun_path);
        return 2;
    }
    pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        return 0;
    struct sigaction sa = {.sa_handler = stop};
    sigaction(SIGTERM, &sa, NULL);   /* no SA_RESTART: accept returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    strcpy(addr.sun_path, argv[1]);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(argv[1]);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || chmod(argv[1], 0666) < 0 ||
        listen(fd, 128) < 0) {
        fprintf(stderr, "hami-sim-pids: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    while (!stopping) {
        int client = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0)
            continue;
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(client, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
            char line[32];
            int n = snprintf(line, sizeof line, "%d\n", (int)cred.pid);
            ssize_t sent = write(client, line, (size_t)n);   /* a client that gave up goes on without it */
            (void)sent;
        }
        close(client);
    }
    unlink(argv[1]);
    return 0;
}
