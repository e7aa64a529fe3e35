/*
 * hami-runtime launcher: the fast path in front of the Python runtime.
 *
 * Passthrough subcommands (everything but create, run and delete) become the
 * real runtime at once, with no interpreter start: the launcher reads only the
 * `runtime` key of the config and execs the first executable candidate.
 * delete runs the real runtime's delete and returns its status at once; the
 * allocation is then freed by a detached Python release (stdio on /dev/null),
 * and by any later allocator transaction in any case, since an allocation
 * whose container runc removed is dead by the allocator's rule.
 * create/run, and anything this launcher does not fully understand
 * (an unusual config, a runtime that is this program), go to the Python
 * runtime, which decides and reports errors as usual. `hami-hook` is the
 * createRuntime hook (hook.c).
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
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hook.h"
#include "ids.h"
#include "spec_scan.h"

#ifndef HAMI_PYTHON
#define HAMI_PYTHON "/usr/bin/python3"
#endif
#define DEFAULT_CONFIG "/etc/hami/config.toml"
#define MAX_CANDIDATES 16
#define MAX_CONFIG (256 * 1024)

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

#ifdef HAMI_PYTHONPATH
#define PYTHON_FLAGS "-I", "-S", "-c",                                       \
    "import sys; sys.path[:0] = '" HAMI_PYTHONPATH "'.split(':'); "          \
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

/* Reads one TOML basic string at *p ("..." without escapes). */
static int read_string(const char **p, char *out, size_t size)
{
    const char *s = *p;
    if (*s != '"')
        return -1;
    const char *end = strchr(s + 1, '"');
    if (!end || memchr(s + 1, '\\', (size_t)(end - s - 1)) || memchr(s + 1, '\n', (size_t)(end - s - 1)))
        return -1;
    size_t len = (size_t)(end - s - 1);
    if (len == 0 || len >= size || s[1] != '/')
        return -1;
    memcpy(out, s + 1, len);
    out[len] = '\0';
    *p = end + 1;
    return 0;
}

static const char *skip_blank(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

/*
 * The `runtime` candidates from the config's top level: a string or a
 * one-line array of strings. 0 found, 1 absent (defaults), -1 not understood.
 */
static int config_runtimes(char cands[][PATH_MAX], int *count)
{
    const char *path = getenv("HAMI_CONFIG");
    int named = path && *path;
    if (!named)
        path = DEFAULT_CONFIG;
    FILE *f = fopen(path, "r");
    if (!f)
        return (!named && errno == ENOENT) ? 1 : -1;
    static char text[MAX_CONFIG + 1];
    size_t n = fread(text, 1, MAX_CONFIG, f);
    int big = !feof(f);
    fclose(f);
    if (big)
        return -1;
    text[n] = '\0';
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *s = skip_blank(line);
        if (*s == '[')
            break; /* tables follow: the key is not at the top level */
        if (strncmp(s, "runtime", 7) != 0)
            continue;
        s = skip_blank(s + 7);
        if (*s != '=')
            continue;
        s = skip_blank(s + 1);
        *count = 0;
        if (*s == '"')
            return read_string(&s, cands[(*count)++], PATH_MAX) == 0 ? 0 : -1;
        if (*s != '[')
            return -1;
        s = skip_blank(s + 1);
        while (*s != ']') {
            if (*count >= MAX_CANDIDATES || read_string(&s, cands[(*count)++], PATH_MAX) != 0)
                return -1;
            s = skip_blank(s);
            if (*s == ',')
                s = skip_blank(s + 1);
            else if (*s != ']')
                return -1;
        }
        return *count > 0 ? 0 : -1;
    }
    return 1;
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

/* The Python release after runc's delete, detached: the caller does not wait
 * for it, and it holds none of the caller's pipes. */
static void release_detached(char **argv)
{
    pid_t child = fork();
    if (child < 0)
        return; /* the next allocator transaction frees it */
    if (child == 0) {
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
        setenv(DELETE_DONE_ENV, "1", 1);
        run_python(argv);
    }
    waitpid(child, NULL, 0);
}

static int delete_then_release(const char *runtime, char **argv)
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
    release_detached(argv);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], HOOK_SUBCOMMAND) == 0)
        return hook_main(argc - 2, argv + 2);
    int at = subcommand(argc, argv);
    const char *cmd = at ? argv[at] : NULL;
    if (cmd && !strcmp(cmd, "delete")) {
        const char *runtime = find_runtime();
        if (!runtime)
            run_python(argv);
        return delete_then_release(runtime, argv);
    }
    if (cmd && (!strcmp(cmd, "create") || !strcmp(cmd, "run"))) {
        /* A spec that surely asks for no GPU: runc at once, as Python would exec it. */
        const char *bundle, *id, *runtime;
        if (create_args(argc, argv, at, &bundle, &id) == 0 && valid_container_id(id) &&
            spec_asks_nothing(bundle) && (runtime = find_runtime()) != NULL) {
            argv[0] = (char *)runtime;
            execv(runtime, argv);
        }
        char exe[PATH_MAX];
        if (realpath("/proc/self/exe", exe))
            setenv(LAUNCHER_ENV, exe, 1); /* the createRuntime hook can be this program */
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
