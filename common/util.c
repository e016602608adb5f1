#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/log.h"

hpd_status_t hpd_append(char **out, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (hpd_grow(out, cap, *len + n + 1, 1) != HPD_OK)
        return HPD_ERR_NO_MEMORY;
    memcpy(*out + *len, s, n);
    *len += n;
    (*out)[*len] = '\0';
    return HPD_OK;
}

hpd_status_t hpd_grow(void *items_p, size_t *cap_p, size_t need, size_t elem)
{
    void **items = items_p;
    size_t cap = *cap_p ? *cap_p : 16;
    void *grown;

    if (need <= *cap_p)
        return HPD_OK;
    if (elem == 0 || need > SIZE_MAX / elem)
        return HPD_ERR_NO_MEMORY; /* need * elem bytes do not exist */
    while (cap < need)
        cap = cap <= SIZE_MAX / 2 ? cap * 2 : need;
    if (cap > SIZE_MAX / elem)
        cap = need; /* doubling past what fits: exactly what is needed */
    if ((grown = realloc(*items, cap * elem)) == NULL)
        return HPD_ERR_NO_MEMORY;
    *items = grown;
    *cap_p = cap;
    return HPD_OK;
}

hpd_status_t hpd_parse_id_list(const char *text, int32_t **ids_p, size_t *n_p, char *err,
                               size_t errlen)
{
    size_t cap = 0, n = 0;
    int32_t *ids = NULL;
    const char *p = text;

    for (;;) {
        char *end;
        long long v;

        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0' && n == 0)
            break;
        if (!isdigit((unsigned char)*p)) {
            snprintf(err, errlen, "token id list: expected a non-negative integer at '%.20s'",
                     *p ? p : "end of list");
            goto err_free;
        }
        errno = 0;
        v = strtoll(p, &end, 10);
        if (errno != 0 || v > INT32_MAX) {
            snprintf(err, errlen, "token id list: value '%.20s' is out of range", p);
            goto err_free;
        }
        if (hpd_grow(&ids, &cap, n + 1, sizeof(*ids)) != HPD_OK) {
            snprintf(err, errlen, "token id list: out of memory");
            free(ids);
            return HPD_ERR_NO_MEMORY;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '\0')
            break;
        snprintf(err, errlen, "token id list: expected ',' at '%.20s'", p);
        goto err_free;
    }
    if (n == 0) {
        snprintf(err, errlen, "token id list is empty");
        goto err_free;
    }
    *ids_p = ids;
    *n_p = n;
    return HPD_OK;

err_free:
    free(ids);
    return HPD_ERR_INVALID_ARG;
}

int hpd_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *value_p)
{
    char *end;
    unsigned long long v;

    if (text == NULL || !isdigit((unsigned char)text[0]))
        return -1;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *value_p = v;
    return 0;
}

int hpd_parse_float(const char *text, float *value_p)
{
    char *end;
    float v;

    if (text == NULL || *text == '\0')
        return -1;
    errno = 0;
    v = strtof(text, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v))
        return -1;
    *value_p = v;
    return 0;
}

hpd_status_t hpd_read_file(const char *path, char **data_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    char *data;
    long len;

    if (f == NULL) {
        HPD_LOG_ERROR("util", "cannot open %s: %s", path, strerror(errno));
        return HPD_ERR_IO;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* it opens for reading on Linux, and "sizes" to LONG_MAX */
        HPD_LOG_ERROR("util", "%s is a directory (expected a file)", path);
        fclose(f);
        return HPD_ERR_INVALID_ARG;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        HPD_LOG_ERROR("util", "cannot size %s: %s", path, strerror(errno));
        fclose(f);
        return HPD_ERR_IO;
    }
    data = malloc((size_t)len + 1);
    if (data == NULL) {
        fclose(f);
        return HPD_ERR_NO_MEMORY;
    }
    if (fread(data, 1, (size_t)len, f) != (size_t)len) {
        HPD_LOG_ERROR("util", "cannot read %s", path);
        free(data);
        fclose(f);
        return HPD_ERR_IO;
    }
    fclose(f);
    data[len] = '\0';
    *data_p = data;
    *len_p = (size_t)len;
    return HPD_OK;
}

hpd_status_t hpd_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    if (f == NULL) {
        HPD_LOG_ERROR("util", "cannot create %s: %s", path, strerror(errno));
        return HPD_ERR_IO;
    }
    size_t written = fwrite(data, 1, len, f);
    int closed = fclose(f);

    if (written != len || closed != 0) {
        HPD_LOG_ERROR("util", "cannot write %s: %s", path, strerror(errno));
        return HPD_ERR_IO;
    }
    return HPD_OK;
}

double hpd_time_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t hpd_mem_available(void)
{
    char line[256];
    unsigned long long kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb << 10;
}

void hpd_prompts_free(hpd_prompt_t *prompts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(prompts[i].ids);
    free(prompts);
}

hpd_status_t hpd_read_prompts(const char *tool, const char *path, hpd_prompt_t **prompts_p,
                              size_t *n_p)
{
    char *text, *next, err[160];
    size_t len, n = 0, cap = 0, line = 0;
    hpd_prompt_t *prompts = NULL;
    hpd_status_t st;

    if (hpd_read_file(path, &text, &len) != HPD_OK) {
        fprintf(stderr, "%s: cannot read %s\n", tool, path);
        return HPD_ERR_IO;
    }
    /* line by line: strtok_r would pass over empty lines and miscount them */
    for (char *l = text; l != NULL; l = next) {
        if ((next = strchr(l, '\n')) != NULL)
            *next++ = '\0';
        line++;
        if (strspn(l, " \t\r") == strlen(l))
            continue;
        if (hpd_grow(&prompts, &cap, n + 1, sizeof(*prompts)) != HPD_OK) {
            fprintf(stderr, "%s: %s: out of memory\n", tool, path);
            free(text);
            hpd_prompts_free(prompts, n);
            return HPD_ERR_NO_MEMORY;
        }
        st = hpd_parse_id_list(l, &prompts[n].ids, &prompts[n].n, err, sizeof(err));
        if (st != HPD_OK) {
            fprintf(stderr, "%s: %s line %zu: %s\n", tool, path, line, err);
            free(text);
            hpd_prompts_free(prompts, n);
            return st;
        }
        n++;
    }
    free(text);
    if (n == 0) {
        fprintf(stderr, "%s: %s holds no prompt\n", tool, path);
        free(prompts);
        return HPD_ERR_INVALID_ARG;
    }
    *prompts_p = prompts;
    *n_p = n;
    return HPD_OK;
}
