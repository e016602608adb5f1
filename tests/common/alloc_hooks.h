/* The malloc family of a common/ test binary: glibc's allocator, through its
 * __libc_* entry points, counting the allocations not yet freed and failing
 * one on demand. The tests check with it the out-of-memory contracts (NULL
 * or HPD_ERR_NO_MEMORY, nothing changed, nothing leaked) and that nothing
 * leaks, in every build. Include it in one file per test binary.
 *
 * Under AddressSanitizer, whose allocator must serve every allocation, none
 * of this is compiled and TEST_ALLOC_HOOKS stays undefined: the tests that
 * need it skip, and LeakSanitizer checks for leaks there. */
#ifndef HPD_TESTS_COMMON_ALLOC_HOOKS_H
#define HPD_TESTS_COMMON_ALLOC_HOOKS_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#if !defined(TEST_ASAN) && defined(__GLIBC__)
#define TEST_ALLOC_HOOKS 1

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void __libc_free(void *p);

/* Allocations made and not yet freed (by anyone in the process). */
static long test_alloc_live;
/* Allocations that succeed before one fails (the ones after it succeed
 * again); -1: none fails. */
static long test_alloc_fail_in = -1;
/* Whether that allocation has failed yet. */
static bool test_alloc_failed;

/* Makes the allocation after the next n fail. */
static inline void test_alloc_fail_after(long n)
{
    test_alloc_fail_in = n;
    test_alloc_failed = false;
}

/* Ends test_alloc_fail_after(); returns whether an allocation failed. */
static inline bool test_alloc_stop(void)
{
    test_alloc_fail_in = -1;
    return test_alloc_failed;
}

/* Whether this allocation fails; a failing one sets errno as glibc's does. */
static bool test_alloc_fail_now(void)
{
    if (test_alloc_fail_in < 0)
        return false;
    if (test_alloc_fail_in-- > 0)
        return false;
    test_alloc_failed = true;
    errno = ENOMEM;
    return true;
}

void *malloc(size_t size)
{
    void *p = test_alloc_fail_now() ? NULL : __libc_malloc(size);
    test_alloc_live += p != NULL;
    return p;
}

void *calloc(size_t n, size_t size)
{
    void *p = test_alloc_fail_now() ? NULL : __libc_calloc(n, size);
    test_alloc_live += p != NULL;
    return p;
}

void *realloc(void *p, size_t size)
{
    if (test_alloc_fail_now())
        return NULL; /* p stays as it was */
    void *q = __libc_realloc(p, size);
    if (p == NULL && q != NULL)
        test_alloc_live++;
    else if (p != NULL && q == NULL && size == 0)
        test_alloc_live--; /* freed */
    return q;
}

void free(void *p)
{
    test_alloc_live -= p != NULL;
    __libc_free(p);
}
#endif

#endif
