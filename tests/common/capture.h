/* What the code under test writes to stderr, for the common/ tests
 * (header-only). cmocka reports failures on stderr too: end a capture before
 * asserting on what it caught. */
#ifndef HPD_TESTS_COMMON_CAPTURE_H
#define HPD_TESTS_COMMON_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct {
    FILE *file; /* fd 2 points here while capturing */
    int saved;  /* the real stderr */
} test_capture_t;

static inline void test_capture_begin(test_capture_t *c)
{
    fflush(stderr);
    c->file = tmpfile();
    c->saved = dup(2);
    if (c->file == NULL || c->saved < 0 || dup2(fileno(c->file), 2) < 0) {
        perror("test_capture_begin");
        abort();
    }
}

/* Puts stderr back; returns what was written meanwhile (malloc'd,
 * NUL-terminated; its length in *len_p when not NULL). */
static inline char *test_capture_end(test_capture_t *c, size_t *len_p)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    const int fd = fileno(c->file);
    const off_t len = lseek(fd, 0, SEEK_END);
    char *text = malloc(len > 0 ? (size_t)len + 1 : 1);
    if (len < 0 || text == NULL || pread(fd, text, (size_t)len, 0) != (ssize_t)len) {
        perror("test_capture_end");
        abort();
    }
    text[len] = '\0';
    fclose(c->file);
    if (len_p != NULL)
        *len_p = (size_t)len;
    return text;
}

#endif
