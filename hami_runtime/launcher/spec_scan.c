/*
 * The launcher's fast path: a create or run whose spec asks for no GPU becomes
 * runc at once, with no interpreter start. "No GPU" is decided here only when
 * it is certain; every doubt goes to the Python runtime, which decides as it
 * always does (and refuses what it refuses).
 *
 * The spec is read as Python's json reads it, only more strictly: UTF-8 with
 * no byte order mark and no NUL, JSON's grammar alone (no NaN or Infinity, no
 * number longer than MAX_NUMBER characters: Python refuses integers of over
 * 4300 digits), strings with their escapes decoded (a key written
 * "hami\u002eio/gpu" is hami.io/gpu; a lone surrogate or \u0000 is a doubt),
 * nesting at most MAX_DEPTH deep, nothing after the value. Of what the runtime
 * reads, the spec must hold:
 *  - annotations: an object of strings, no key holding a request mark;
 *  - process: an object; its env a list of strings, no name with a request prefix;
 *  - hooks: an object, no string in it (key or value) naming dockerd's GPU hook;
 *  - linux: an object; mounts: a list (the shapes the runtime checks);
 *  - none of these keys twice, at the top level or in process (Python keeps
 *    the last one; this scanner would have to guess).
 * The marks, prefixes and hook names are the Python side's (launcher_keys.py),
 * written by make build into spec_keys.h, compared without regard to ASCII case.
 */
#include "spec_scan.h"
#include "spec_keys.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SPEC (4 << 20)
#define MAX_DEPTH 64
#define MAX_NUMBER 64

static const char *const annotation_marks[] = {SPEC_ANNOTATION_MARKS, NULL};
static const char *const env_prefixes[] = {SPEC_ENV_PREFIXES, NULL};
static const char *const hook_names[] = {SPEC_HOOK_NAMES, NULL};

/* Every reader below returns 0 (read, nothing found) or -1 (a doubt: malformed,
 * unusual, or a request). */
struct parser {
    const unsigned char *p, *end;
    int depth;
    char *str; /* the string read last, decoded (room for the whole text) */
    size_t len;
};

/* A rule for the strings of a subtree: -1 when one of them is a doubt. */
struct rule {
    int (*check)(const char *s, size_t len);
};

static int fold(int c)
{
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

static int starts_folded(const char *s, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    if (n > len)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (fold((unsigned char)s[i]) != fold((unsigned char)prefix[i]))
            return 0;
    return 1;
}

static int contains_folded(const char *s, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; n <= len && i <= len - n; i++)
        if (starts_folded(s + i, len - i, needle))
            return 1;
    return 0;
}

static int any_of(const char *s, size_t len, const char *const *list,
                  int (*match)(const char *, size_t, const char *))
{
    for (int i = 0; list[i]; i++)
        if (match(s, len, list[i]))
            return 1;
    return 0;
}

static int names_gpu_hook(const char *s, size_t len)
{
    return any_of(s, len, hook_names, contains_folded) ? -1 : 0;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF, no NUL. */
static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i], more, min, cp;
        if (c < 0x80) {
            if (c == 0)
                return 0;
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            more = 1, min = 0x80, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            more = 2, min = 0x800, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            more = 3, min = 0x10000, cp = c & 0x07;
        else
            return 0;
        if (n - i <= more)
            return 0;
        for (unsigned k = 1; k <= more; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += more + 1;
    }
    return 1;
}

static void skip_space(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int peek(const struct parser *ps)
{
    return ps->p < ps->end ? *ps->p : -1;
}

static int hex4(struct parser *ps, unsigned *out)
{
    if (ps->end - ps->p < 4)
        return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int c = ps->p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (fold(c) >= 'a' && fold(c) <= 'f')
            d = fold(c) - 'a' + 10;
        else
            return -1;
        v = v << 4 | (unsigned)d;
    }
    ps->p += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The string at ps->p, decoded into ps->str / ps->len (never longer than its text). */
static int string(struct parser *ps)
{
    if (peek(ps) != '"')
        return -1;
    ps->p++;
    size_t n = 0;
    while (ps->p < ps->end) {
        unsigned c = *ps->p++;
        if (c == '"') {
            ps->str[n] = '\0';
            ps->len = n;
            return 0;
        }
        if (c < 0x20)
            return -1; /* a raw control character: Python's json refuses it too */
        if (c != '\\') {
            ps->str[n++] = (char)c;
            continue;
        }
        if (ps->p >= ps->end)
            return -1;
        unsigned cp;
        switch (*ps->p++) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (hex4(ps, &cp) != 0 || cp == 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* only as the first of a pair */
                unsigned low;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
                    return -1;
                ps->p += 2;
                if (hex4(ps, &low) != 0 || low < 0xDC00 || low > 0xDFFF)
                    return -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            break;
        default:
            return -1;
        }
        n += put_utf8(ps->str + n, cp);
    }
    return -1;
}

static int digits(struct parser *ps)
{
    const unsigned char *start = ps->p;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
        ps->p++;
    return ps->p > start ? 0 : -1;
}

static int number(struct parser *ps)
{
    const unsigned char *start = ps->p;
    if (peek(ps) == '-')
        ps->p++;
    if (peek(ps) == '0')
        ps->p++;
    else if (peek(ps) < '1' || peek(ps) > '9' || digits(ps) != 0)
        return -1;
    if (peek(ps) == '.') {
        ps->p++;
        if (digits(ps) != 0)
            return -1;
    }
    if (peek(ps) == 'e' || peek(ps) == 'E') {
        ps->p++;
        if (peek(ps) == '+' || peek(ps) == '-')
            ps->p++;
        if (digits(ps) != 0)
            return -1;
    }
    return ps->p - start > MAX_NUMBER ? -1 : 0;
}

static int literal(struct parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return -1;
    ps->p += n;
    return 0;
}

/* An object: each member's key is decoded in ps->str when member() reads its value. */
static int object(struct parser *ps, int (*member)(struct parser *, void *), void *ctx)
{
    if (peek(ps) != '{' || ++ps->depth > MAX_DEPTH)
        return -1;
    ps->p++;
    skip_space(ps);
    if (peek(ps) == '}') {
        ps->p++;
        ps->depth--;
        return 0;
    }
    for (;;) {
        skip_space(ps);
        if (string(ps) != 0)
            return -1;
        skip_space(ps);
        if (peek(ps) != ':')
            return -1;
        ps->p++;
        skip_space(ps);
        if (member(ps, ctx) != 0)
            return -1;
        skip_space(ps);
        if (peek(ps) == ',') {
            ps->p++;
            continue;
        }
        if (peek(ps) != '}')
            return -1;
        ps->p++;
        ps->depth--;
        return 0;
    }
}

static int array(struct parser *ps, int (*element)(struct parser *, void *), void *ctx)
{
    if (peek(ps) != '[' || ++ps->depth > MAX_DEPTH)
        return -1;
    ps->p++;
    skip_space(ps);
    if (peek(ps) == ']') {
        ps->p++;
        ps->depth--;
        return 0;
    }
    for (;;) {
        skip_space(ps);
        if (element(ps, ctx) != 0)
            return -1;
        skip_space(ps);
        if (peek(ps) == ',') {
            ps->p++;
            continue;
        }
        if (peek(ps) != ']')
            return -1;
        ps->p++;
        ps->depth--;
        return 0;
    }
}

static int any_value(struct parser *ps, void *ctx);

static int any_member(struct parser *ps, void *ctx)
{
    const struct rule *rule = ctx;
    if (rule && rule->check(ps->str, ps->len) != 0)
        return -1;
    return any_value(ps, ctx);
}

/* Any value; with a rule (ctx), every string in it, keys included, passes it. */
static int any_value(struct parser *ps, void *ctx)
{
    const struct rule *rule = ctx;
    switch (peek(ps)) {
    case '{':
        return object(ps, any_member, ctx);
    case '[':
        return array(ps, any_value, ctx);
    case '"':
        if (string(ps) != 0)
            return -1;
        return rule ? rule->check(ps->str, ps->len) : 0;
    case 't':
        return literal(ps, "true");
    case 'f':
        return literal(ps, "false");
    case 'n':
        return literal(ps, "null");
    default:
        return number(ps);
    }
}

static int annotation(struct parser *ps, void *ctx)
{
    (void)ctx;
    if (any_of(ps->str, ps->len, annotation_marks, contains_folded))
        return -1;
    return peek(ps) == '"' ? string(ps) : -1;
}

static int env_entry(struct parser *ps, void *ctx)
{
    (void)ctx;
    if (string(ps) != 0)
        return -1;
    const char *eq = memchr(ps->str, '=', ps->len);
    size_t name_len = eq ? (size_t)(eq - ps->str) : ps->len;
    return any_of(ps->str, name_len, env_prefixes, starts_folded) ? -1 : 0;
}

static int is_key(const struct parser *ps, const char *key)
{
    return ps->len == strlen(key) && memcmp(ps->str, key, ps->len) == 0;
}

static int process_member(struct parser *ps, void *ctx)
{
    int *seen_env = ctx;
    if (!is_key(ps, "env"))
        return any_value(ps, NULL);
    if ((*seen_env)++)
        return -1;
    return array(ps, env_entry, NULL);
}

static const char *const watched[] = {"annotations", "process", "hooks", "linux", "mounts", NULL};

static int top_member(struct parser *ps, void *ctx)
{
    int *seen = ctx;
    int k = 0;
    while (watched[k] && !is_key(ps, watched[k]))
        k++;
    if (!watched[k])
        return any_value(ps, NULL);
    if (seen[k]++)
        return -1;
    static const struct rule hook_rule = {names_gpu_hook};
    int seen_env = 0;
    switch (k) {
    case 0:
        return object(ps, annotation, NULL);
    case 1:
        return object(ps, process_member, &seen_env);
    case 2:
        return peek(ps) == '{' ? any_value(ps, (void *)&hook_rule) : -1;
    case 3:
        return peek(ps) == '{' ? any_value(ps, NULL) : -1;
    default:
        return peek(ps) == '[' ? any_value(ps, NULL) : -1;
    }
}

int spec_text_asks_nothing(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    if (len == 0 || len > MAX_SPEC || (len >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF) ||
        !valid_utf8(s, len))
        return 0;
    struct parser ps = {s, s + len, 0, malloc(len + 1), 0};
    if (!ps.str)
        return 0;
    int seen[sizeof watched / sizeof watched[0]] = {0};
    skip_space(&ps);
    int clean = object(&ps, top_member, seen) == 0;
    skip_space(&ps);
    free(ps.str);
    return clean && ps.p == ps.end;
}

int spec_asks_nothing(const char *bundle)
{
    char path[PATH_MAX];
    if (!*bundle || snprintf(path, sizeof path, "%s/config.json", bundle) >= (int)sizeof path)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return 0;
    struct stat st;
    char *text = NULL;
    size_t len = 0, room = 0;
    int clean = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= MAX_SPEC &&
        (text = malloc((room = (size_t)st.st_size + 1) + 1)) != NULL) {
        for (;;) { /* a file that grows while read is a doubt */
            ssize_t n = read(fd, text + len, room - len);
            if (n <= 0) {
                clean = n == 0;
                break;
            }
            len += (size_t)n;
            if (len == room)
                break;
        }
        clean = clean && spec_text_asks_nothing(text, len);
    }
    free(text);
    close(fd);
    return clean;
}
