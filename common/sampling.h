/* Sampling parameters of a request: what the client asks for, the
 * messages carry and every backend's sampler reads (docs/determinism.md). */
#ifndef HPD_COMMON_SAMPLING_H
#define HPD_COMMON_SAMPLING_H

#include <stdint.h>

typedef struct {
    float temperature; /* <= 0: greedy */
    float top_p;       /* in (0, 1]; 1 disables */
    uint32_t top_k;    /* 0 disables */
    uint64_t seed;
} hpd_sampling_t;

#endif
