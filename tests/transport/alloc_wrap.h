/* Allocation control for the in-process transport tests (header-only; one
 * test binary includes it once). The binary links with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free
 * (tests/CMakeLists.txt), which reroutes the calls made by the test and by
 * the static libraries it links (transport/, common/), not those made
 * inside shared libraries (UCX, libevent, msgpack-c's own functions).
 *
 * - arm(k, kinds): the k-th allocation of the given kinds from now fails,
 *   for a test that runs an operation with each of its allocations failing
 *   in turn; disarm() says whether the k-th happened.
 * - track(): from now on, every block allocated through the wraps is
 *   remembered until it is freed; live_blocks() counts those still there,
 *   so that a test can require that an operation gives back all it took,
 *   in the Release build too. */
#ifndef HPD_TESTS_TRANSPORT_ALLOC_WRAP_H
#define HPD_TESTS_TRANSPORT_ALLOC_WRAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

enum { ALLOC_MALLOC = 1, ALLOC_CALLOC = 2, ALLOC_REALLOC = 4, ALLOC_ANY = 7 };

static uint32_t alloc_n;      /* allocations of the armed kinds since arm() */
static uint32_t alloc_fail_at; /* the one that fails; 0: none */
static unsigned alloc_kinds;

/* The blocks allocated since track(), not yet freed (a small set: tests
 * look at a handful of operations at a time). */
enum { TRACK_MAX = 1 << 14 };
static void *tracked[TRACK_MAX];
static size_t n_tracked;
static bool tracking, track_overflow;

static inline bool alloc_failing(unsigned kind)
{
    return alloc_fail_at != 0 && (alloc_kinds & kind) && ++alloc_n == alloc_fail_at;
}

static inline void track_add(void *p)
{
    if (!tracking || p == NULL)
        return;
    if (n_tracked == TRACK_MAX) {
        track_overflow = true;
        return;
    }
    tracked[n_tracked++] = p;
}

static inline void track_del(void *p)
{
    if (!tracking || p == NULL)
        return;
    for (size_t i = n_tracked; i-- > 0;)
        if (tracked[i] == p) {
            tracked[i] = tracked[--n_tracked];
            return;
        }
}

void *__wrap_malloc(size_t n)
{
    void *p = alloc_failing(ALLOC_MALLOC) ? NULL : __real_malloc(n);
    track_add(p);
    return p;
}

void *__wrap_calloc(size_t n, size_t size)
{
    void *p = alloc_failing(ALLOC_CALLOC) ? NULL : __real_calloc(n, size);
    track_add(p);
    return p;
}

void *__wrap_realloc(void *old, size_t n)
{
    void *p = alloc_failing(ALLOC_REALLOC) ? NULL : __real_realloc(old, n);
    if (p != NULL) {
        track_del(old);
        track_add(p);
    }
    return p;
}

void __wrap_free(void *p)
{
    track_del(p);
    __real_free(p);
}

static inline void arm(uint32_t k, unsigned kinds)
{
    alloc_n = 0;
    alloc_kinds = kinds;
    alloc_fail_at = k;
}

/* Disarms; whether the k-th allocation happened (and failed). */
static inline bool disarm(void)
{
    const bool hit = alloc_fail_at != 0 && alloc_n >= alloc_fail_at;
    alloc_fail_at = 0;
    return hit;
}

static inline void track(void)
{
    n_tracked = 0;
    track_overflow = false;
    tracking = true;
}

/* Blocks still allocated of those taken since track(). */
static inline size_t live_blocks(void)
{
    return track_overflow ? SIZE_MAX : n_tracked;
}

static inline void untrack(void)
{
    tracking = false;
}

#endif
