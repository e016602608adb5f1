/* Stages an op's sequences and per-sequence state pointers (conv1d and the
 * gated delta rules) through hpd_cuda_stage. Included after hpd_cuda_stage
 * is declared: by kernels/cuda/cuda_ops.h, and by the host stand-in's
 * (tests/kernels/cuda_host/), so both stage them the same way. */
#ifndef HPD_KERNELS_CUDA_STAGE_SEQS_H
#define HPD_KERNELS_CUDA_STAGE_SEQS_H

static inline hpd_status_t hpd_cuda_stage_seqs(hpd_backend_t *b, const hpd_seq_t *seqs,
                                               float *const *states, uint32_t n_seqs,
                                               const hpd_seq_t **dseqs_p,
                                               float *const **dstates_p)
{
    void *ds, *dst;
    const hpd_cuda_meta_t m[] = {
        {.host = seqs, .bytes = n_seqs * sizeof(hpd_seq_t), .dev_p = &ds},
        {.host = states, .bytes = n_seqs * sizeof(float *), .dev_p = &dst}};
    const hpd_status_t st = hpd_cuda_stage(b, m, 2);
    if (st != HPD_OK)
        return st;
    *dseqs_p = (const hpd_seq_t *)ds;
    *dstates_p = (float *const *)dst;
    return HPD_OK;
}

#endif
