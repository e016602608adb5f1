/* Sampling parameters of a request: what the client asks for, the
 * messages carry and every backend's sampler reads (docs/determinism.md). */
#ifndef HPD_COMMON_SAMPLING_H
#define HPD_COMMON_SAMPLING_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    float temperature; /* <= 0: greedy */
    float top_p;       /* in (0, 1]; 1 disables */
    uint32_t top_k;    /* 0 disables */
    uint64_t seed;
} hpd_sampling_t;

/* Choices of one request (n): the most the engine forks. */
#define HPD_MAX_CHOICES 16

/* A field a request did not set: temperature and top_p NAN, top_k this.
 * hpd_sampling_resolve gives such fields the model's generation defaults
 * (generation_config.json) or greedy ones. */
#define HPD_TOP_K_UNSET UINT32_MAX

/* Every field unset (the seed 0). */
static inline hpd_sampling_t hpd_sampling_unset(void)
{
    return (hpd_sampling_t){.temperature = NAN, .top_p = NAN, .top_k = HPD_TOP_K_UNSET};
}

/* The fields left unset take defaults' (the model's) or, with defaults
 * NULL, greedy ones (temperature 0, top_p 1, top_k 0). */
static inline void hpd_sampling_resolve(hpd_sampling_t *s, const hpd_sampling_t *defaults)
{
    static const hpd_sampling_t greedy = {.top_p = 1};
    const hpd_sampling_t *d = defaults != NULL ? defaults : &greedy;
    if (isnan(s->temperature))
        s->temperature = d->temperature;
    if (isnan(s->top_p))
        s->top_p = d->top_p;
    if (s->top_k == HPD_TOP_K_UNSET)
        s->top_k = d->top_k;
}

#endif
