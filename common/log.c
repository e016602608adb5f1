#include "common/log.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

hpd_log_level_t hpd_log_level = HPD_LOG_LEVEL_WARN;

static const char *level_names[] = {"error", "warn", "info", "debug"};

void hpd_log_set_level(hpd_log_level_t level)
{
    hpd_log_level = level;
}

int hpd_log_level_parse(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

void hpd_log_write(hpd_log_level_t level, const char *component, uint64_t request,
                   const char *fmt, ...)
{
    char line[HPD_LOG_MAX_LINE + 1];
    struct timespec ts;
    struct tm tm;
    va_list ap;
    int n;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char req[32] = "-";
    if (request != HPD_LOG_NO_REQ)
        snprintf(req, sizeof(req), "%llu", (unsigned long long)request);
    n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s req=%s: ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, ts.tv_nsec / 1000000, level_names[level], component, req);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* one fputs per line keeps lines of concurrent threads whole; a line cut
     * at the end of the buffer still ends with its newline */
    size_t len = strlen(line);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len] = '\n';
    line[len + 1] = '\0';
    fputs(line, stderr);
}
