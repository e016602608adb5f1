/* The stand-in for kernels/cuda/mma.h: the warp's fragments gathered (each
 * lane writes its own, waits for its warp), each lane's four outputs
 * computed from them with the fragment layout of the PTX ISA that the real
 * header documents, the products summed in double and added to d in one
 * rounding (the tensor cores' order of additions is not documented: tests
 * compare this path with a tolerance, and bit for bit only with itself). */
#ifndef HPD_KERNELS_CUDA_MMA_H
#define HPD_KERNELS_CUDA_MMA_H

#include <stdint.h>

inline uint32_t hpd_emu_mma_frag[1024][6];

static inline float hpd_emu_bf16_lo(uint32_t w)
{
    return __uint_as_float(w << 16);
}
static inline float hpd_emu_bf16_hi(uint32_t w)
{
    return __uint_as_float(w & 0xffff0000u);
}

static inline void hpd_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    const unsigned tid = hpd_emu_blk->cur, w0 = tid / 32 * 32, lane = tid % 32;
    if (w0 + 32 > hpd_emu_blk->nt) {
        fprintf(stderr, "cuda_host: mma in a partial warp\n");
        abort();
    }
    for (int i = 0; i < 4; i++)
        hpd_emu_mma_frag[tid][i] = a[i];
    hpd_emu_mma_frag[tid][4] = b[0];
    hpd_emu_mma_frag[tid][5] = b[1];
    hpd_emu_wait(HPD_EMU_AT_WARP);
    /* A[row][k] and B[k][col] from the lanes that hold them */
    auto A = [&](unsigned row, unsigned k) {
        const unsigned l = (row % 8) * 4 + (k % 8) / 2;
        const uint32_t wd = hpd_emu_mma_frag[w0 + l][(row >= 8) + 2 * (k >= 8)];
        return (double)(k % 2 ? hpd_emu_bf16_hi(wd) : hpd_emu_bf16_lo(wd));
    };
    auto B = [&](unsigned k, unsigned col) {
        const unsigned l = col * 4 + (k % 8) / 2;
        const uint32_t wd = hpd_emu_mma_frag[w0 + l][4 + (k >= 8)];
        return (double)(k % 2 ? hpd_emu_bf16_hi(wd) : hpd_emu_bf16_lo(wd));
    };
    const unsigned g = lane / 4, t = lane % 4;
    float out[4];
    for (int r = 0; r < 4; r++) {
        const unsigned row = g + 8 * (r / 2), col = 2 * t + r % 2;
        double s = d[r];
        for (unsigned k = 0; k < 16; k++)
            s += A(row, k) * B(k, col);
        out[r] = (float)s;
    }
    hpd_emu_wait(HPD_EMU_AT_WARP); /* every lane has read the fragments */
    for (int r = 0; r < 4; r++)
        d[r] = out[r];
}

#endif
