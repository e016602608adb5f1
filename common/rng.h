/* Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
 * A draw is a pure function of (seed, counter): sampling keyed by
 * (request seed, token position) gives the same token wherever and in
 * whatever batch the position is computed. Header-only so that every backend
 * computes the same bits. */
#ifndef HPD_COMMON_RNG_H
#define HPD_COMMON_RNG_H

#include <stdint.h>

#include "common/hostdev.h"

typedef struct {
    uint32_t v[4];
} hpd_philox_out_t;

static inline HPD_HOST_DEVICE uint32_t hpd_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* Ten Philox rounds over the 128-bit counter (ctr0, ctr1) with a 64-bit key. */
static inline HPD_HOST_DEVICE hpd_philox_out_t hpd_philox4x32(uint64_t key, uint64_t ctr0,
                                                              uint64_t ctr1)
{
    uint32_t c0 = (uint32_t)ctr0, c1 = (uint32_t)(ctr0 >> 32);
    uint32_t c2 = (uint32_t)ctr1, c3 = (uint32_t)(ctr1 >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    hpd_philox_out_t out;

    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = hpd_mulhilo32(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = hpd_mulhilo32(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out.v[0] = c0;
    out.v[1] = c1;
    out.v[2] = c2;
    out.v[3] = c3;
    return out;
}

/* A uniform float in [0, 1) from 24 random bits. */
static inline HPD_HOST_DEVICE float hpd_u32_to_unit(uint32_t x)
{
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* The uniform draw used for sampling the token at `position` of a request. */
static inline HPD_HOST_DEVICE float hpd_rng_uniform(uint64_t seed, uint64_t position)
{
    return hpd_u32_to_unit(hpd_philox4x32(seed, position, 0x68706473u /* "hpds" */).v[0]);
}

#endif
