/*
 * The node config (HAMI_CONFIG, else the install's, /etc/hami/config.toml), as far as the
 * launcher reads it: top-level `runtime` (a string or a one-line array of
 * strings), `state_dir` and `log_file` (strings), each an absolute path without
 * escapes, `log_level` (a string) and `create_server_idle_s` (decimal digits),
 * before the first table. Anything else there is "not understood", and the
 * caller leaves the decision to the Python runtime, which reads the whole file.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* make install builds the launcher with its SYSCONFDIR's config (packaging/install.py) */
#ifndef HAMI_CONFIG_FILE
#define HAMI_CONFIG_FILE "/etc/hami/config.toml"
#endif
#define DEFAULT_CONFIG HAMI_CONFIG_FILE
#define MAX_CONFIG (256 * 1024)

/* The config's text: 0 read, 1 no file at the default path (defaults), -1 unreadable. */
static int config_text(const char **out)
{
    static char text[MAX_CONFIG + 1];
    static int loaded = 0, result;
    *out = text;
    if (loaded)
        return result;
    loaded = 1;
    const char *path = getenv("HAMI_CONFIG");
    int named = path && *path;
    if (!named)
        path = DEFAULT_CONFIG;
    FILE *f = fopen(path, "re");
    if (!f)
        return result = (!named && errno == ENOENT) ? 1 : -1;
    size_t n = fread(text, 1, MAX_CONFIG, f);
    int big = !feof(f);
    fclose(f);
    text[n] = '\0';
    return result = big ? -1 : 0;
}

/* Reads one TOML basic string at *p ("/..." without escapes). */
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

/* The value of a top-level `key = value` line: 0 (*value set), 1 absent, -1 no config. */
static int top_level(const char *key, const char **value)
{
    const char *text;
    int found = config_text(&text);
    if (found != 0)
        return found;
    size_t len = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *s = skip_blank(line);
        if (*s == '[')
            break; /* tables follow: the key is not at the top level */
        if (strncmp(s, key, len) != 0)
            continue;
        s = skip_blank(s + len);
        if (*s != '=')
            continue;
        *value = skip_blank(s + 1);
        return 0;
    }
    return 1;
}

int config_runtimes(char cands[][PATH_MAX], int *count)
{
    const char *s;
    int found = top_level("runtime", &s);
    if (found != 0)
        return found;
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

int config_state_dir(char *out, size_t size)
{
    const char *s;
    int found = top_level("state_dir", &s);
    if (found == 1)
        return snprintf(out, size, "%s", DEFAULT_STATE_DIR) < (int)size ? 1 : -1;
    if (found != 0 || read_string(&s, out, size) != 0)
        return -1;
    s = skip_blank(s);
    return (*s == '\n' || *s == '\0' || *s == '#' || *s == '\r') ? 0 : -1;
}

int config_server_idle_s(void)
{
    const char *s;
    int found = top_level("create_server_idle_s", &s);
    if (found == 1)
        return DEFAULT_SERVER_IDLE_S;
    if (found != 0 || *s < '0' || *s > '9')
        return -1;
    long value = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        if ((value = value * 10 + (*s - '0')) > 86400)
            return -1;
    s = skip_blank(s);
    return (*s == '\n' || *s == '\0' || *s == '#' || *s == '\r') ? (int)value : -1;
}

int config_warning_log(char *out, size_t size)
{
    const char *s;
    if (top_level("log_file", &s) != 0 || read_string(&s, out, size) != 0)
        return -1;
    return top_level("log_level", &s) == 0 && strncmp(s, "\"error\"", 7) == 0 ? -1 : 0;
}
