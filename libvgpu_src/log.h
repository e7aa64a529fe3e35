/* Logging to stderr with a "[hami]" prefix; level from LIBCUDA_LOG_LEVEL
 * (0 silent, 1 errors (default), 2 warnings, 3 info, 4 debug). */
#ifndef HAMI_LOG_H
#define HAMI_LOG_H

enum { HAMI_LOG_SILENT, HAMI_LOG_ERROR, HAMI_LOG_WARN, HAMI_LOG_INFO, HAMI_LOG_DEBUG };

extern int hami_log_level;
void hami_log_init(void);
void hami_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define HAMI_LOG(level, ...) \
    do { if (hami_log_level >= (level)) hami_log_write((level), __VA_ARGS__); } while (0)
#define hami_error(...) HAMI_LOG(HAMI_LOG_ERROR, __VA_ARGS__)
#define hami_warn(...) HAMI_LOG(HAMI_LOG_WARN, __VA_ARGS__)
#define hami_info(...) HAMI_LOG(HAMI_LOG_INFO, __VA_ARGS__)
#define hami_debug(...) HAMI_LOG(HAMI_LOG_DEBUG, __VA_ARGS__)

#endif
