/*
 * hami-runtime launcher: the fast path in front of the Python runtime.
 *
 * Passthrough subcommands (everything but create, run and delete) become the
 * real runtime at once, with no interpreter start: the launcher reads only the
 * `runtime` key of the config (config.c) and execs the first executable
 * candidate. So do create and run of a spec that surely asks for no GPU
 * (spec_scan.c: no request key, env request or dockerd GPU hook, and nothing
 * it cannot read exactly as Python would), with runc's flags only and a valid
 * id: the Python runtime would pass it through untouched (such a create where
 * no create server runs starts one, detached and at low priority; with the
 * server off, a warm-up of the caches a GPU create reads). delete runs the real
 * runtime's delete and returns its status at once; where the state dir holds
 * the id's allocation dirs, the allocation is then freed by a detached release
 * (stdio on /dev/null; the create server's where one answers, else a Python
 * of its own), and by any later allocator transaction in any
 * case, since an allocation whose container runc removed is dead by the
 * allocator's rule. Every other create/run, and anything this launcher does
 * not fully understand (an unusual config, a runtime that is this program),
 * goes to the Python runtime, which decides and reports errors as usual: the
 * create server's, where one answers (server_client.c), else a Python of its
 * own. `hami-hook` is the createRuntime hook (hook.c).
 *
 * Built with HAMI_PYTHONPATH (make build: this tree and its virtual
 * environment's site-packages; make install: the installed environment's
 * site-packages), Python starts with -S and these paths put in
 * front: no site processing (.pth files, the editable-install finder), which
 * is a third of an interpreter start. Without it, `python -I -m hami_runtime`.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <time.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "hook.h"
#include "ids.h"
#include "server_client.h"
#include "spec_scan.h"


static const char *const default_runtimes[] = {
    "/usr/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc", NULL};

/* Global flags of runc that take a value; the boolean ones need no list. */
static int takes_value(const char *name, size_t len)
{
    static const char *const names[] = {"log", "log-format", "root", "criu", "rootless", NULL};
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == len && strncmp(names[i], name, len) == 0)
            return 1;
    return 0;
}

static int is_bool_flag(const char *name, size_t len)
{
    static const char *const names[] = {"debug", "systemd-cgroup", "help", "h", "version", "v", NULL};
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == len && strncmp(names[i], name, len) == 0)
            return 1;
    return 0;
}

/* The subcommand's index in argv, or 0 when there is none or a flag is not runc's. */
static int subcommand(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || strcmp(arg, "-") == 0 || strcmp(arg, "--") == 0)
            return i;
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (takes_value(name, len)) {
            if (!eq)
                i++;
        } else if (!is_bool_flag(name, len)) {
            return 0;
        }
    }
    return 0;
}

/* The index of name (len bytes) in a NULL-ended list, or -1. */
static int index_of(const char *name, size_t len, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == len && strncmp(names[i], name, len) == 0)
            return i;
    return -1;
}

/* Go's strconv.ParseBool's false, as runc reads a bool flag's value */
static const char *const go_false[] = {"0", "f", "F", "false", "FALSE", "False", NULL};

/*
 * A boolean global flag of runc, named `name` or `letter`, set (not to Go's
 * false) among the global flags before argv[end].
 */
static int global_flag(int end, char **argv, const char *name_long, char letter)
{
    for (int i = 1; i < end; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-')
            return 0;
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (takes_value(name, len) && !eq)
            i++;
        else if ((len == strlen(name_long) && !strncmp(name, name_long, len)) ||
                 (len == 1 && name[0] == letter))
            return !eq || index_of(eq + 1, strlen(eq + 1), go_false) < 0;
    }
    return 0;
}

/*
 * runc's --version (or -v): runc then prints its version and runs no
 * subcommand. runc's own help: --help (or -h) among the global flags, the
 * subcommand help (or h) alone, or no argument at all. Python prints ours
 * before runc's.
 */
static int asks_version(int end, char **argv)
{
    return global_flag(end, argv, "version", 'v');
}

static int asks_help(int argc, char **argv, int at)
{
    if (argc == 1 || global_flag(at ? at : argc, argv, "help", 'h'))
        return 1;
    return at && at == argc - 1 && (!strcmp(argv[at], "help") || !strcmp(argv[at], "h"));
}

/*
 * The bundle and the container id of a create or run whose flags after the
 * subcommand (at argv[at]) are all runc's, each at most once, with exactly one
 * argument, the id (hami_runtime/argv.py reads them the same way; urfave/cli
 * takes flags after the id too). -1 for anything else: the Python runtime reads it.
 */
static int create_args(int argc, char **argv, int at, const char **bundle, const char **id)
{
    /* bundle and b first: either names the bundle */
    static const char *const value_flags[] = {"bundle", "b", "console-socket", "pid-file",
                                              "preserve-fds", "pidfd-socket", NULL};
    static const char *const bool_flags[] = {"no-pivot", "no-new-keyring", "detach", "d", "keep",
                                             "no-subreaper", NULL};
    unsigned seen = 0;
    *bundle = ".";
    *id = NULL;
    for (int i = at + 1; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || strcmp(arg, "-") == 0) {
            if (*id)
                return -1;
            *id = arg;
            continue;
        }
        if (strncmp(arg, "---", 3) == 0 || strcmp(arg, "--") == 0)
            return -1;
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = index_of(name, len, value_flags);
        if (k >= 0) {
            if (!eq && i + 1 >= argc)
                return -1;
            const char *value = eq ? eq + 1 : argv[++i];
            if (k <= 1)
                *bundle = value;
        } else if ((k = index_of(name, len, bool_flags)) >= 0 && !eq) {
            k += 16;
        } else {
            return -1;
        }
        if (seen & (1u << k))
            return -1;
        seen |= 1u << k;
    }
    /* --bundle and -b both, or an empty bundle: leave it to Python */
    if (!*id || (seen & 3u) == 3u || !**bundle)
        return -1;
    return 0;
}

/* The runtime lives for one command (tens of ms): the cyclic garbage collector,
 * which runs again and again while the imports build their classes, is off. */
#ifdef HAMI_PYTHONPATH
#define PYTHON_FLAGS "-I", "-S", "-c",                                       \
    "import gc, sys; gc.disable(); "                                         \
    "sys.path[:0] = '" HAMI_PYTHONPATH "'.split(':'); "                      \
    "from hami_runtime.cli import main; sys.exit(main())"
#else
#define PYTHON_FLAGS "-I", "-m", "hami_runtime"
#endif

static void run_python(char **argv)
{
    static const char *const flags[] = {PYTHON_FLAGS};
    const int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    int argc = 0;
    while (argv[argc])
        argc++;
    char **args = calloc((size_t)argc + (size_t)nflags + 1, sizeof(char *));
    if (!args)
        _exit(1);
    args[0] = (char *)HAMI_PYTHON;
    for (int i = 0; i < nflags; i++)
        args[1 + i] = (char *)flags[i];
    for (int i = 1; i < argc; i++)
        args[nflags + i] = argv[i];
    execv(HAMI_PYTHON, args);
    fprintf(stderr, "hami-runtime: launcher python=%s: %s\n", HAMI_PYTHON, strerror(errno));
    _exit(1);
}

/* The real runtime from the config (or the defaults); NULL: leave it to Python. */
static const char *find_runtime(void)
{
    static char cands[MAX_CANDIDATES][PATH_MAX];
    int count = 0;
    int found = config_runtimes(cands, &count);
    if (found < 0)
        return NULL;
    if (found == 1)
        for (count = 0; default_runtimes[count]; count++)
            snprintf(cands[count], PATH_MAX, "%s", default_runtimes[count]);
    char self[PATH_MAX], real[PATH_MAX];
    if (!realpath("/proc/self/exe", self))
        return NULL;
    for (int i = 0; i < count; i++) {
        struct stat st;
        if (stat(cands[i], &st) != 0 || !S_ISREG(st.st_mode) || access(cands[i], X_OK) != 0)
            continue;
        if (!realpath(cands[i], real) || strcmp(real, self) == 0)
            return NULL; /* Python refuses it with the usual message */
        return cands[i];
    }
    return NULL; /* no runtime: Python reports it */
}

/* Closes every fd from `low` up (those /proc/self/fd lists). */
static void close_from(int low)
{
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return;
    int own = dirfd(dir);
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end == '\0' && e->d_name[0] != '\0' && fd >= low && fd != own)
            close((int)fd);
    }
    closedir(dir);
}

/* Waits until process `pid` has ended, at most `ms` milliseconds (the whole
 * time where the kernel has no pidfd). */
static void wait_for_end(pid_t pid, int ms)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
#else
    int fd = -1;
    (void)pid;
#endif
    if (fd < 0) {
        struct timespec pause = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
        return;
    }
    struct pollfd ended = {fd, POLLIN, 0};
    while (poll(&ended, 1, ms) < 0 && errno == EINTR)
        ;
    close(fd);
}

/* Continues in a detached grandchild (a session of its own; stdio on
 * /dev/null; none of the caller's fds, which may be the engine's pipes and
 * preserved fds, but `keep_fd` (>= 0), as its fd 3): returns 1 there, 0 in
 * the caller, which waits only for the child between them. */
static int detached(int keep_fd)
{
    pid_t child = fork();
    if (child < 0)
        return 0;
    if (child > 0) {
        waitpid(child, NULL, 0);
        return 0;
    }
    if (setsid() < 0 || fork() != 0)
        _exit(0);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (null > 2)
            close(null);
    }
    if (keep_fd >= 0)
        keep_fd = keep_fd == 3 ? fcntl(3, F_SETFD, 0) : dup2(keep_fd, 3);
    close_from(keep_fd >= 0 ? 4 : 3);
    return 1;
}

/* Python with `flag` set in its env, detached, running only while a CPU is
 * idle (SCHED_IDLE; where that is refused, at nice 19), once the caller (then
 * what it execs) has ended or 2 s have passed. */
static void python_when_idle(char **argv, const char *flag, int keep_fd)
{
    pid_t caller = getpid();
    if (!detached(keep_fd))
        return;
    setenv(flag, "1", 1);
    struct sched_param none = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &none) != 0)
        setpriority(PRIO_PROCESS, 0, 19);
    wait_for_end(caller, 2000);
    run_python(argv);
}

/*
 * The caches a GPU create reads, filled ahead of it: on a state dir without
 * the validated config (a fresh /run after a boot), the first create that
 * passes through here starts a detached Python that validates the config and
 * runs discovery (WARM_UP_ENV), once per state dir (cache/.warm-up, made
 * exclusively, says it was started). A pod's sandbox is made before its
 * containers, so its GPU containers find them; nothing waits for it.
 */
static void warm_up_once(char *argv0)
{
    char state[PATH_MAX], path[PATH_MAX];
    if (config_state_dir(state, sizeof state) < 0 ||
        snprintf(path, sizeof path, "%s/cache/config.json", state) >= (int)sizeof path)
        return;
    struct stat st;
    if (stat(path, &st) == 0)
        return;
    if (snprintf(path, sizeof path, "%s/cache", state) >= (int)sizeof path ||
        (mkdir(state, 0700) != 0 && errno != EEXIST) || (mkdir(path, 0755) != 0 && errno != EEXIST) ||
        snprintf(path, sizeof path, "%s/cache/.warm-up", state) >= (int)sizeof path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    close(fd);
    char *args[] = {argv0, NULL}; /* no command: without the flag, runc's help */
    /* behind whatever the node runs now, and after runc's create (a run's: 2 s at most) */
    python_when_idle(args, WARM_UP_ENV, -1);
}

/* <state dir>/`name` where the config has the create server on; -1 otherwise. */
static int server_file(const char *name, char *out, size_t size)
{
    char state[PATH_MAX];
    if (config_server_idle_s() <= 0 || config_state_dir(state, sizeof state) < 0)
        return -1;
    return snprintf(out, size, "%s/%s", state, name) < (int)size ? 0 : -1;
}

/*
 * Starts the create server (create_server.py), detached and idle, once this
 * command has ended, where no server holds the state dir's server lock: it
 * gets the lock, taken, so that however many creates find none, one starts.
 */
static void start_server(char *argv0)
{
    char state[PATH_MAX], dir[PATH_MAX], lock[PATH_MAX];
    if (server_file("", state, sizeof state) != 0 || server_file(SERVER_DIR, dir, sizeof dir) != 0 ||
        server_file(SERVER_LOCK, lock, sizeof lock) != 0 ||
        (mkdir(state, 0700) != 0 && errno != EEXIST) || (mkdir(dir, 0700) != 0 && errno != EEXIST))
        return;
    int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        char *args[] = {argv0, NULL};
        python_when_idle(args, SERVER_ENV, fd);
    }
    close(fd);
}

/*
 * A create or run (or a delete's release) through the create server: execs
 * the runtime it names, or exits with its status. Returns where none answered
 * (the caller runs Python itself), having started one for the creates to come.
 */
static void through_server(char **argv)
{
    static const int stdio[3] = {0, 1, 2};
    char socket_path[PATH_MAX], runtime[PATH_MAX];
    int status;
    if (server_file(SERVER_SOCKET, socket_path, sizeof socket_path) != 0)
        return;
    switch (server_request(socket_path, argv, stdio, runtime, sizeof runtime, &status)) {
    case SERVED_EXEC:
        unsetenv(LAUNCHER_ENV);
        unsetenv(LAUNCHER_STARTED_ENV);
        argv[0] = runtime;
        execv(runtime, argv);
        fprintf(stderr, "hami-runtime: runtime=%s: %s\n", runtime, strerror(errno));
        exit(1);
    case SERVED_EXIT:
        exit(status);
    default:
        start_server(argv[0]);
    }
}

/* Ahead of GPU creates, from one that asks for none: the create server started
 * where none runs (a state dir that never had one, or one whose server ended
 * idle: a pod's sandbox comes before its GPU containers, which it then serves;
 * the server's lock says whether one runs), else the warm-up of the caches. */
static void ahead_of_gpu_creates(char *argv0)
{
    if (config_server_idle_s() > 0)
        start_server(argv0);
    else
        warm_up_once(argv0);
}

/*
 * Whether the state dir may hold an allocation for the id a delete names (at
 * argv[at + 1..]): its private/ or containers/ has an entry <id>@<root key>
 * of any runc root, or this cannot be told. A container with neither asked for
 * no GPU (or its create was killed before making them: any later allocator
 * transaction frees that), and its delete starts no Python.
 */
static int may_hold_allocation(int argc, char **argv, int at)
{
    const char *id = NULL;
    for (int i = at + 1; i < argc; i++) {
        if (argv[i][0] == '-')
            continue; /* delete's flags (--force) take no value */
        if (id)
            return 1;
        id = argv[i];
    }
    char state[PATH_MAX];
    if (!id || !valid_container_id(id) || config_state_dir(state, sizeof state) < 0)
        return 1;
    static const char *const subdirs[] = {"private", "containers"};
    size_t n = strlen(id);
    for (int i = 0; i < 2; i++) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", state, subdirs[i]) >= (int)sizeof path)
            return 1;
        DIR *dir = opendir(path);
        if (!dir) {
            if (errno == ENOENT)
                continue;
            return 1;
        }
        int found = 0;
        for (struct dirent *e; !found && (e = readdir(dir)) != NULL;)
            found = strncmp(e->d_name, id, n) == 0 && e->d_name[n] == '@';
        closedir(dir);
        if (found)
            return 1;
    }
    return 0;
}

static int delete_then_release(const char *runtime, int argc, char **argv, int at)
{
    pid_t child = fork();
    if (child < 0)
        run_python(argv); /* Python runs runc's delete itself */
    if (child == 0) {
        argv[0] = (char *)runtime;
        execv(runtime, argv);
        fprintf(stderr, "hami-runtime: runtime=%s: %s\n", runtime, strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            return 1;
    /* the release, detached (the next allocator transaction frees it otherwise) */
    if (may_hold_allocation(argc, argv, at) && detached(-1)) {
        setenv(DELETE_DONE_ENV, "1", 1);
        through_server(argv);
        run_python(argv);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    if (argc >= 2 && strcmp(argv[1], HOOK_SUBCOMMAND) == 0)
        return hook_main(argc - 2, argv + 2);
    int at = subcommand(argc, argv);
    const char *cmd = at ? argv[at] : NULL;
    if (asks_version(at ? at : argc, argv) || asks_help(argc, argv, at))
        run_python(argv); /* hami-runtime's version or help, then runc's */
    if (cmd && !strcmp(cmd, "delete")) {
        const char *runtime = find_runtime();
        if (!runtime)
            run_python(argv);
        return delete_then_release(runtime, argc, argv, at);
    }
    if (cmd && (!strcmp(cmd, "create") || !strcmp(cmd, "run"))) {
        /* A spec that surely asks for no GPU: runc at once, as Python would exec it. */
        const char *bundle, *id, *runtime;
        if (create_args(argc, argv, at, &bundle, &id) == 0 && valid_container_id(id) &&
            spec_asks_nothing(bundle) && (runtime = find_runtime()) != NULL) {
            ahead_of_gpu_creates(argv[0]);
            argv[0] = (char *)runtime;
            execv(runtime, argv);
        }
        char exe[PATH_MAX];
        if (realpath("/proc/self/exe", exe))
            setenv(LAUNCHER_ENV, exe, 1); /* the createRuntime hook can be this program */
        char stamp[32];
        snprintf(stamp, sizeof stamp, "%lld", (long long)started.tv_sec * 1000000000LL + started.tv_nsec);
        setenv(LAUNCHER_STARTED_ENV, stamp, 1);
        through_server(argv);
        run_python(argv);
    }

    const char *runtime = find_runtime();
    if (runtime) {
        argv[0] = (char *)runtime;
        execv(runtime, argv);
    }
    run_python(argv); /* no runtime, or not one to exec: Python reports it */
    return 1;
}
