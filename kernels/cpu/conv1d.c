/* Causal depthwise conv1d + SiLU with a rolling conv state, on the CPU.
 * The step form (one token per sequence, decode) is the same computation with
 * n_tokens = 1.
 *
 * Every output is one sequence whatever the path: acc = 0, then acc +=
 * w[j] * in[j] for the taps j in order (a product and a sum, two roundings),
 * then acc / (1 + exp(-acc)) with the kernels' exp (hpd_exp1, the same in a
 * vector lane). Few tokens (decode) go channel by channel; a prompt goes
 * token by token over 8 channels at a time, the weights transposed once per
 * call: the same bits. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

#define MAX_KC 16
#define VEC_TOKENS 16 /* a sequence this long goes token by token */

/* one channel c of one sequence, token by token, its state rolled */
static void conv_channel(const hpd_conv1d_args_t *a, const hpd_seq_t *seq, float *state,
                         uint32_t c)
{
    const uint32_t kc = a->kc, hist = kc - 1;
    const float *w = a->w + (size_t)c * kc;
    float *st = state + (size_t)c * hist;
    float win[MAX_KC]; /* the last kc inputs, oldest first */

    memcpy(win, st, hist * sizeof(float));
    for (uint32_t i = 0; i < seq->n_tokens; i++) {
        const uint32_t row = seq->row + i;
        float acc = 0.0f;

        win[hist] = a->x[(size_t)row * a->ldx + c];
        for (uint32_t j = 0; j < kc; j++)
            acc = acc + w[j] * win[j];
        a->y[(size_t)row * a->ldy + c] = hpd_silu1(acc);
        memmove(win, win + 1, hist * sizeof(float));
    }
    memcpy(st, win, hist * sizeof(float));
}

/* channels [c, c + 8) of a sequence of at least kc tokens, token by token;
 * wt is the weights transposed, [kc][channels] */
static void conv_block8(const hpd_conv1d_args_t *a, const hpd_seq_t *seq, float *state,
                        const float *wt, uint32_t c)
{
    const uint32_t kc = a->kc, hist = kc - 1;
    float old[MAX_KC][8]; /* the state's history, tap-major */

    for (uint32_t p = 0; p < hist; p++)
        for (uint32_t l = 0; l < 8; l++)
            old[p][l] = state[(size_t)(c + l) * hist + p];
    for (uint32_t i = 0; i < seq->n_tokens; i++) {
        hpd_v8_t acc = hpd_v8_zero();
        for (uint32_t j = 0; j < kc; j++) {
            const uint32_t p = i + j; /* in the window: < hist is the state */
            const hpd_v8_t in = p < hist ? hpd_v8_load(old[p])
                                         : hpd_v8_load(a->x + (size_t)(seq->row + p - hist) *
                                                                  a->ldx + c);
            acc = hpd_v8_add(acc, hpd_v8_mul(hpd_v8_load(wt + (size_t)j * a->channels + c), in));
        }
        hpd_v8_store(a->y + (size_t)(seq->row + i) * a->ldy + c, hpd_v8_silu(acc));
    }
    /* the newest hist inputs (n_tokens >= kc > hist: all from x) */
    for (uint32_t p = 0; p < hist; p++)
        for (uint32_t l = 0; l < 8; l++)
            state[(size_t)(c + l) * hist + p] =
                a->x[(size_t)(seq->row + seq->n_tokens - hist + p) * a->ldx + c + l];
}

hpd_status_t hpd_cpu_conv1d(hpd_backend_t *b, const hpd_conv1d_args_t *a)
{
    const uint32_t kc = a->kc;
    float *wt = NULL;

    if (kc < 2 || kc > MAX_KC)
        return HPD_ERR_UNSUPPORTED;
    for (uint32_t s = 0; s < a->n_seqs; s++) {
        const hpd_seq_t *seq = &a->seqs[s];
        float *state = a->states[s];
        const int threads =
            (uint64_t)seq->n_tokens * a->channels >= (1u << 14) ? hpd_cpu_threads(b) : 1;
        const bool vec = seq->n_tokens >= VEC_TOKENS && seq->n_tokens >= kc;
        const uint32_t n_blocks = vec ? a->channels / 8 : 0;

        if (vec && wt == NULL) {
            if ((wt = malloc((size_t)kc * a->channels * sizeof(float))) == NULL) {
                HPD_LOG_ERROR("cpu", "conv1d: %zu bytes of weights cannot be allocated",
                              (size_t)kc * a->channels * sizeof(float));
                return HPD_ERR_NO_MEMORY;
            }
            for (uint32_t c = 0; c < a->channels; c++)
                for (uint32_t j = 0; j < kc; j++)
                    wt[(size_t)j * a->channels + c] = a->w[(size_t)c * kc + j];
        }
#pragma omp parallel num_threads(threads)
        {
#pragma omp for schedule(static) nowait
            for (uint32_t blk = 0; blk < n_blocks; blk++)
                conv_block8(a, seq, state, wt, blk * 8);
#pragma omp for schedule(static)
            for (uint32_t c = n_blocks * 8; c < a->channels; c++)
                conv_channel(a, seq, state, c);
        }
    }
    free(wt);
    return HPD_OK;
}
