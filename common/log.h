/* Logging: one line per event on stderr with time, level, component and
 * the cluster-wide request id it concerns ("req=-" when none):
 *   2026-11-21T10:04:05.123Z info  coordinator req=42: finished, 24 tokens
 * The macros test the level before any formatting happens. */
#ifndef HPD_COMMON_LOG_H
#define HPD_COMMON_LOG_H

#include <stdarg.h>
#include <stdint.h>

typedef enum {
    HPD_LOG_LEVEL_ERROR = 0,
    HPD_LOG_LEVEL_WARN = 1,
    HPD_LOG_LEVEL_INFO = 2,
    HPD_LOG_LEVEL_DEBUG = 3,
} hpd_log_level_t;

extern hpd_log_level_t hpd_log_level;

/* Sets the global level; messages above it are dropped. */
void hpd_log_set_level(hpd_log_level_t level);

/* Parses "error", "warn", "info" or "debug"; returns -1 on anything else. */
int hpd_log_level_parse(const char *name);

/* No request: the line says "req=-". */
#define HPD_LOG_NO_REQ UINT64_C(0)

/* The most a line holds, its newline included: a longer one is cut there
 * and still ends with its newline. */
#define HPD_LOG_MAX_LINE 1023

/* Writes one formatted line; use the macros instead. */
void hpd_log_write(hpd_log_level_t level, const char *component, uint64_t request,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define HPD_LOG(level, component, ...) HPD_LOGR(level, component, HPD_LOG_NO_REQ, __VA_ARGS__)

#define HPD_LOGR(level, component, request, ...)                        \
    do {                                                                \
        if ((level) <= hpd_log_level)                                   \
            hpd_log_write((level), (component), (request), __VA_ARGS__); \
    } while (0)

#define HPD_LOG_ERROR(c, ...) HPD_LOG(HPD_LOG_LEVEL_ERROR, c, __VA_ARGS__)
#define HPD_LOG_WARN(c, ...)  HPD_LOG(HPD_LOG_LEVEL_WARN, c, __VA_ARGS__)
#define HPD_LOG_INFO(c, ...)  HPD_LOG(HPD_LOG_LEVEL_INFO, c, __VA_ARGS__)
#define HPD_LOG_DEBUG(c, ...) HPD_LOG(HPD_LOG_LEVEL_DEBUG, c, __VA_ARGS__)

/* The same about one request (its coordinator-assigned id). */
#define HPD_LOGR_ERROR(c, r, ...) HPD_LOGR(HPD_LOG_LEVEL_ERROR, c, r, __VA_ARGS__)
#define HPD_LOGR_WARN(c, r, ...)  HPD_LOGR(HPD_LOG_LEVEL_WARN, c, r, __VA_ARGS__)
#define HPD_LOGR_INFO(c, r, ...)  HPD_LOGR(HPD_LOG_LEVEL_INFO, c, r, __VA_ARGS__)
#define HPD_LOGR_DEBUG(c, r, ...) HPD_LOGR(HPD_LOG_LEVEL_DEBUG, c, r, __VA_ARGS__)

#endif
