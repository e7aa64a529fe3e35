/* Logging: one write(2) per line so lines of concurrent threads never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int hami_log_level = HAMI_LOG_ERROR;

static const char *const level_names[] = {"", "error", "warning", "info", "debug"};

void hami_log_init(void)
{
    const char *text = getenv("LIBCUDA_LOG_LEVEL");
    if (!text || !*text)
        return;
    char *end = NULL;
    long level = strtol(text, &end, 10);
    if (*end || level < HAMI_LOG_SILENT || level > HAMI_LOG_DEBUG) {
        hami_log_write(HAMI_LOG_ERROR, "LIBCUDA_LOG_LEVEL=%s is not 0..4; keeping 1 (errors)", text);
        return;
    }
    hami_log_level = (int)level;
}

void hami_log_write(int level, const char *fmt, ...)
{
    char line[1024];
    int len = snprintf(line, sizeof line, "[hami] %s: ",
                       level_names[level > 0 && level <= HAMI_LOG_DEBUG ? level : 1]);
    va_list ap;
    va_start(ap, fmt);
    int more = vsnprintf(line + len, sizeof line - (size_t)len - 1, fmt, ap);
    va_end(ap);
    if (more < 0)
        more = 0;
    len += more;
    if ((size_t)len > sizeof line - 2)
        len = (int)sizeof line - 2;
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, (size_t)len);
    (void)ignored;
}
