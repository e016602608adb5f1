/* Causal depthwise conv1d + SiLU with a rolling conv state, on the CPU.
 * The step form (one token per sequence, decode) is the same computation with
 * n_tokens = 1. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define MAX_KC 16

hpd_status_t hpd_cpu_conv1d(hpd_backend_t *b, const hpd_conv1d_args_t *a)
{
    const uint32_t kc = a->kc, hist = a->kc - 1;

    if (kc < 2 || kc > MAX_KC)
        return HPD_ERR_UNSUPPORTED;
    for (uint32_t s = 0; s < a->n_seqs; s++) {
        const hpd_seq_t *seq = &a->seqs[s];
        float *state = a->states[s];
        const int threads =
            (uint64_t)seq->n_tokens * a->channels >= (1u << 14) ? hpd_cpu_threads(b) : 1;

#pragma omp parallel for schedule(static) num_threads(threads)
        for (uint32_t c = 0; c < a->channels; c++) {
            const float *w = a->w + (size_t)c * kc;
            float *st = state + (size_t)c * hist;
            float win[MAX_KC]; /* the last kc inputs, oldest first */

            memcpy(win, st, hist * sizeof(float));
            for (uint32_t i = 0; i < seq->n_tokens; i++) {
                const uint32_t row = seq->row + i;
                float acc = 0.0f;

                win[hist] = a->x[(size_t)row * a->ldx + c];
                for (uint32_t j = 0; j < kc; j++)
                    acc += w[j] * win[j];
                a->y[(size_t)row * a->ldy + c] = acc / (1.0f + expf(-acc));
                memmove(win, win + 1, hist * sizeof(float));
            }
            memcpy(st, win, hist * sizeof(float));
        }
    }
    return HPD_OK;
}
