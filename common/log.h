/* Logging: one line per event on stderr with time, level and component.
 * The macros test the level before any formatting happens. */
#ifndef HPD_COMMON_LOG_H
#define HPD_COMMON_LOG_H

#include <stdarg.h>

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

/* Writes one formatted line; use the macros instead. */
void hpd_log_write(hpd_log_level_t level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define HPD_LOG(level, component, ...)                                  \
    do {                                                                \
        if ((level) <= hpd_log_level)                                   \
            hpd_log_write((level), (component), __VA_ARGS__);           \
    } while (0)

#define HPD_LOG_ERROR(c, ...) HPD_LOG(HPD_LOG_LEVEL_ERROR, c, __VA_ARGS__)
#define HPD_LOG_WARN(c, ...)  HPD_LOG(HPD_LOG_LEVEL_WARN, c, __VA_ARGS__)
#define HPD_LOG_INFO(c, ...)  HPD_LOG(HPD_LOG_LEVEL_INFO, c, __VA_ARGS__)
#define HPD_LOG_DEBUG(c, ...) HPD_LOG(HPD_LOG_LEVEL_DEBUG, c, __VA_ARGS__)

#endif
