/*
 * The createRuntime hook without an interpreter start (runc runs it inside
 * its create, so its time is the create's):
 *
 *   hami-runtime hami-hook --state-dir DIR --root-key KEY createRuntime  < OCI state
 *
 * records the container's host PID as <DIR>/private/<id>@<KEY>/pid ("<pid>\n",
 * replaced atomically), which hamictl reads; KEY names the runc root (an
 * allocation belongs to a runc root and an id). A container with no private
 * dir has no allocation: nothing to record. Nothing here follows a symlink
 * inside the state dir. No poststop hook is needed with the launcher:
 * hami-runtime delete frees the allocation, as does any later allocator
 * transaction (runc removes the container's state before poststop).
 */
#include "hook.h"
#include "ids.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The root key: 16 lowercase hex digits (hami_runtime/lifecycle/store.py root_key). */
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

int hook_main(int argc, char **argv)
{
    const char *state_dir = NULL, *key = NULL, *stage = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--state-dir") == 0 && i + 1 < argc)
            state_dir = argv[++i];
        else if (strcmp(argv[i], "--root-key") == 0 && i + 1 < argc)
            key = argv[++i];
        else if (!stage)
            stage = argv[i];
        else
            return fail("argument not understood", argv[i]);
    }
    if (!state_dir || !key || !stage || strcmp(stage, "createRuntime") != 0)
        return fail("usage", "hami-runtime hami-hook --state-dir DIR --root-key KEY createRuntime");
    if (!valid_root_key(key))
        return fail("--root-key must be 16 lowercase hex digits", key);
    if (state_dir[0] != '/')
        return fail("--state-dir must be an absolute path", state_dir);

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
    return record_pid(state_dir, id, key, pid);
}
