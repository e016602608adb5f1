/* Small utilities: parsing, files, time. */
#ifndef HPD_COMMON_UTIL_H
#define HPD_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define HPD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define HPD_MAX(a, b) ((a) > (b) ? (a) : (b))
#define HPD_DIV_UP(a, b) (((a) + (b) - 1) / (b))
#define HPD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Makes room for `need` elements of `elem` bytes in the array *items_p of
 * capacity *cap_p (doubling, from 16). On failure nothing changes and
 * HPD_ERR_NO_MEMORY is returned. items_p points to the array pointer. */
hpd_status_t hpd_grow(void *items_p, size_t *cap_p, size_t need, size_t elem);

/* Appends n bytes to the text *out (*len bytes, *cap of room; grown with
 * hpd_grow), keeping it NUL-terminated. */
hpd_status_t hpd_append(char **out, size_t *len, size_t *cap, const char *s, size_t n);

/* Parses a comma-separated list of non-negative integers ("1,2,3", spaces
 * allowed around commas). On success *ids_p is a malloc'ed array owned by the
 * caller. An empty list, a negative or non-numeric item, or a value above
 * INT32_MAX gives HPD_ERR_INVALID_ARG and a message in err (errlen bytes);
 * out of memory, HPD_ERR_NO_MEMORY and a message. */
hpd_status_t hpd_parse_id_list(const char *text, int32_t **ids_p, size_t *n_p, char *err,
                               size_t errlen);

/* Parses a whole unsigned decimal number into [min, max]. Returns 0 or -1. */
int hpd_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *value_p);

/* Parses a whole finite float. Returns 0 or -1. */
int hpd_parse_float(const char *text, float *value_p);

/* Reads a whole file into a malloc'ed, NUL-terminated buffer. */
hpd_status_t hpd_read_file(const char *path, char **data_p, size_t *len_p);

/* Writes len bytes to path (created or truncated). */
hpd_status_t hpd_write_file(const char *path, const void *data, size_t len);

/* Monotonic time in seconds. */
double hpd_time_now(void);

/* This host's available memory in bytes (MemAvailable of /proc/meminfo);
 * 0 when it cannot be read. */
uint64_t hpd_mem_available(void);

/* A prompt of token ids. */
typedef struct {
    int32_t *ids;
    size_t n;
} hpd_prompt_t;

/* Reads a prompts file: one prompt per line as comma-separated token ids
 * (hpd_parse_id_list), blank lines skipped. Errors (unreadable file, a bad
 * id with its line, no prompt at all, out of memory) are printed to stderr
 * after `tool: `.
 * Free with hpd_prompts_free. */
hpd_status_t hpd_read_prompts(const char *tool, const char *path, hpd_prompt_t **prompts_p,
                              size_t *n_p);
void hpd_prompts_free(hpd_prompt_t *prompts, size_t n);

#endif
