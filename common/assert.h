/* Two assert tiers. HPD_ASSERT checks internal invariants in debug builds;
 * HPD_ASSERT_ALWAYS guards what must never happen, in every build. Neither is
 * used on input from a user, a file or the network. */
#ifndef HPD_COMMON_ASSERT_H
#define HPD_COMMON_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

#define HPD_ASSERT_ALWAYS(cond)                                                  \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                      \
            abort();                                                             \
        }                                                                        \
    } while (0)

#ifdef HPD_DEBUG
#define HPD_ASSERT(cond) HPD_ASSERT_ALWAYS(cond)
#else
#define HPD_ASSERT(cond) ((void)0)
#endif

#endif
