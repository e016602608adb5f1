/* The stand-in for kernels/cuda/mma.h: the warp's fragments gathered (each
 * lane writes its own, waits for its warp), each lane's four outputs
 * computed from them with the fragment layout of the PTX ISA that the real
 * header documents, the products summed in double and added to d in one
 * rounding (the tensor cores' order of additions is not documented: tests
 * compare this path with a tolerance, and bit for bit only with itself).
 * ldmatrix (and its .trans) gathers the lanes' row addresses as the
 * instruction does;
 * cp.async copies land only when the thread waits for their group, so a
 * kernel that reads shared memory before its wait and barrier reads stale
 * bytes (the NaN the launch filled it with) and fails its test. */
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

/* ldmatrix .x4, transposed or not: the lanes' row addresses gathered once
 * (one wait, not one per matrix), then each lane's words read */
static inline void hpd_emu_ldmatrix(uint32_t r[4], const void *row, bool trans)
{
    const unsigned tid = hpd_emu_blk->cur, w0 = tid / 32 * 32, lane = tid % 32;
    if (w0 + 32 > hpd_emu_blk->nt) {
        fprintf(stderr, "cuda_host: ldmatrix in a partial warp\n");
        abort();
    }
    memcpy(&hpd_emu_xchg[tid], &row, sizeof(row));
    hpd_emu_wait(HPD_EMU_AT_WARP);
    const auto addr = [&](unsigned l) {
        const uint8_t *m;
        memcpy(&m, &hpd_emu_xchg[w0 + l], sizeof(m));
        return m;
    };
    for (unsigned i = 0; i < 4; i++) {
        if (!trans) { /* row l / 4, elements 2 (l % 4), + 1 */
            memcpy(&r[i], addr(i * 8 + lane / 4) + 4 * (lane % 4), 4);
            continue;
        }
        /* column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 */
        uint16_t lo, hi;
        memcpy(&lo, addr(i * 8 + 2 * (lane % 4)) + 2 * (lane / 4), 2);
        memcpy(&hi, addr(i * 8 + 2 * (lane % 4) + 1) + 2 * (lane / 4), 2);
        r[i] = lo | (uint32_t)hi << 16;
    }
    hpd_emu_wait(HPD_EMU_AT_WARP); /* every lane has read the addresses */
}

static inline void hpd_ldmatrix_x4(uint32_t r[4], const void *row)
{
    hpd_emu_ldmatrix(r, row, false);
}

static inline void hpd_ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
    hpd_emu_ldmatrix(r, row, true);
}

static inline void hpd_cp_async16(void *dst, const void *src, uint32_t src_bytes)
{
    if ((uintptr_t)dst % 16 != 0 || (uintptr_t)src % 16 != 0 || src_bytes > 16) {
        fprintf(stderr, "cuda_host: cp.async of %u bytes from %p to %p\n", src_bytes, src, dst);
        abort();
    }
    hpd_emu_copy_t c = {dst, {0}};
    memcpy(c.bytes, src, src_bytes);
    hpd_emu_blk->fibers[hpd_emu_blk->cur].copies.push_back(c);
}

static inline void hpd_cp_async_commit()
{
    hpd_emu_fiber_t &f = hpd_emu_blk->fibers[hpd_emu_blk->cur];
    f.groups.push_back(f.copies.size());
}

/* lands the copies of every committed group but the N most recent */
template <int N> static inline void hpd_cp_async_wait()
{
    hpd_emu_fiber_t &f = hpd_emu_blk->fibers[hpd_emu_blk->cur];
    if (f.groups.size() <= (size_t)N)
        return;
    const size_t done = f.groups.size() - N, upto = f.groups[done - 1];
    for (size_t i = 0; i < upto; i++)
        memcpy(f.copies[i].dst, f.copies[i].bytes, 16);
    f.copies.erase(f.copies.begin(), f.copies.begin() + (ptrdiff_t)upto);
    f.groups.erase(f.groups.begin(), f.groups.begin() + (ptrdiff_t)done);
    for (size_t &g : f.groups)
        g -= upto;
}

#endif
