/* GEMM y = (acc ? y : 0) + x w^T, deterministic: every output follows one
 * canonical summation order, fixed by k alone (not by m, the batch), in both
 * kernels below, so a row's bits do not depend on the batch it is in or on
 * which kernel computed it:
 *   k is cut into chunks of KC = 64 elements (the last may be shorter);
 *   a chunk's partial starts at 0.0f and takes fmaf(x, w, partial) for its
 *   elements in ascending k; total starts at 0.0f and adds the partials in
 *   ascending chunk order (__fadd_rn); y = accumulate ? y + total : total.
 * Weights in F32, BF16, F16 or FP8 E4M3 (times its block scale, one
 * rounding) are widened to fp32 by the same functions in both kernels. No
 * cuBLAS.
 * - tiled (any m): 128x128 output tiles, 256 threads of 8x8 outputs, k in
 *   steps of TK = 16 through shared memory (the next step's tile loaded
 *   into registers meanwhile); a chunk's partial in a register, added to the
 *   running total at each chunk's end;
 * - gemv (m <= GEMV_MAX_M, weight rows 16-byte aligned): a thread per
 *   (chunk, column, group of up to 8 rows); weights staged through shared
 *   memory with coalesced 16-byte loads, partials summed by one lane per
 *   output in chunk order. */
#include <type_traits>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/block_scan.h"
#include "common/util.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/mma.h"

__device__ static inline float widen(float w)
{
    return w;
}

/* BF16 and F16 weights are read as their 16-bit patterns */
struct bf16_t {
    uint16_t bits;
};
struct f16_t {
    uint16_t bits;
};

__device__ static inline float widen(bf16_t w)
{
    return __uint_as_float((uint32_t)w.bits << 16);
}

__device__ static inline float widen(f16_t w)
{
    return __half2float(__ushort_as_half(w.bits));
}

/* FP8 E4M3 (no infinities; S.1111.111 is NaN), exact */
struct f8_t {
    uint8_t bits;
};

__device__ static inline float widen(f8_t w)
{
    const uint32_t b = w.bits, sign = (b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 7u;
    if (exp == 0xfu && mant == 7u)
        return __uint_as_float(sign | 0x7fc00000u);
    if (exp != 0)
        return __uint_as_float(sign | ((exp + 120u) << 23) | (mant << 20));
    const float f = __fmul_rn((float)mant, 0.001953125f);
    return sign ? -f : f;
}

/* The FP8 scales (unused for the other dtypes). */
struct wscale_t {
    const float *scale;
    uint32_t ld, block;
};

/* A grouped GEMM's plan (hpd_cuda_gemm_grouped, below): block y of a
 * kernel takes tile y, {group, first row, rows, 0}, group NO_TILE past the
 * plan's tiles. */
struct group_t {
    const uint4 *tiles; /* NULL: one matrix, rows from blockIdx.y * T */
    size_t w_bytes;     /* between the groups' matrices */
    size_t s_floats;    /* between their scale grids */
};
#define NO_TILE 0xffffffffu

/* This block's rows [row0, m) and its group's matrix: with a plan, tile
 * blockIdx.y (false: no tile, the block has nothing to do); else rows from
 * blockIdx.y * T, m unchanged. The kernels index rows absolutely, so a
 * tile's rows are where the plan's group put them. */
template <typename P>
__device__ static inline bool block_rows(const group_t &g, uint32_t T, P &w, wscale_t &ws,
                                         uint32_t &row0, uint32_t &m)
{
    if (g.tiles == nullptr) {
        row0 = blockIdx.y * T;
        return true;
    }
    const uint4 t = g.tiles[blockIdx.y];
    if (t.x == NO_TILE)
        return false;
    w = (P)((const char *)w + t.x * g.w_bytes);
    if (ws.scale != nullptr)
        ws.scale += t.x * g.s_floats;
    row0 = t.y;
    m = t.y + t.z;
    return true;
}

/* element (row n, column c) of w, in fp32 */
template <typename WT>
__device__ static inline float weight(const WT *w, uint32_t n, uint32_t c, uint32_t k,
                                      wscale_t ws)
{
    return widen(w[(size_t)n * k + c]);
}

template <>
__device__ inline float weight<f8_t>(const f8_t *w, uint32_t n, uint32_t c, uint32_t k,
                                     wscale_t ws)
{
    return __fmul_rn(widen(w[(size_t)n * k + c]), ws.scale[(size_t)n * ws.ld + c / ws.block]);
}

#define TM 128 /* output tile: TM rows of x by TN weight rows */
#define TN 128
#define TK 16
#define KC 64 /* the canonical order's chunk: a multiple of TK */
#define TILE_THREADS 256
static_assert(KC % TK == 0, "a chunk must end on a tile step");

/* 256 threads, each 8x8 outputs: rows ty*4 + {0..3} and 64 + ty*4 + {0..3},
 * columns likewise with tx, read from the k-major shared tiles as 16-byte
 * vectors. The next k-step's tile is loaded into registers (8 of x, 8 of w
 * per thread, all in flight) while this one is computed. */
template <typename WT>
__global__ void __launch_bounds__(TILE_THREADS, 1)
    gemm_kernel(const float *__restrict__ x, uint32_t ldx, const WT *__restrict__ w, wscale_t wsc,
                float *__restrict__ y, uint32_t ldy, uint32_t m, uint32_t n, uint32_t k,
                bool accumulate, group_t grp)
{
    __shared__ __align__(16) float xs[TK][TM];
    __shared__ __align__(16) float ws[TK][TN];
    const uint32_t tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const uint32_t col0 = blockIdx.x * TN;
    uint32_t row0;
    if (!block_rows(grp, TM, w, wsc, row0, m))
        return;
    /* this thread's loads: row (or weight row) lr, k offsets lk .. lk + 7 */
    const uint32_t lr = tid / 2, lk = (tid % 2) * 8;
    float acc[8][8], total[8][8], xr[8], wr[8];

#pragma unroll
    for (uint32_t i = 0; i < 8; i++)
#pragma unroll
        for (uint32_t j = 0; j < 8; j++)
            acc[i][j] = 0.0f, total[i][j] = 0.0f;
    const auto load = [&](uint32_t k0) {
        const uint32_t gr = row0 + lr, gc = col0 + lr;
#pragma unroll
        for (uint32_t u = 0; u < 8; u++) {
            const uint32_t gk = k0 + lk + u;
            xr[u] = gr < m && gk < k ? x[(size_t)gr * ldx + gk] : 0.0f;
            wr[u] = gc < n && gk < k ? weight(w, gc, gk, k, wsc) : 0.0f;
        }
    };
    const auto store = [&]() {
#pragma unroll
        for (uint32_t u = 0; u < 8; u++) {
            xs[lk + u][lr] = xr[u];
            ws[lk + u][lr] = wr[u];
        }
    };
    load(0);
    store();
    __syncthreads();
    for (uint32_t k0 = 0; k0 < k; k0 += TK) {
        const bool more = k0 + TK < k;
        if (more)
            load(k0 + TK);
        /* no product past k: a zero product would turn a -0 partial into +0 */
        const uint32_t steps = more ? TK : k - k0;
#pragma unroll 4
        for (uint32_t kk = 0; kk < steps; kk++) {
            const float4 a0 = *(const float4 *)&xs[kk][ty * 4];
            const float4 a1 = *(const float4 *)&xs[kk][64 + ty * 4];
            const float4 b0 = *(const float4 *)&ws[kk][tx * 4];
            const float4 b1 = *(const float4 *)&ws[kk][64 + tx * 4];
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (uint32_t i = 0; i < 8; i++)
#pragma unroll
                for (uint32_t j = 0; j < 8; j++)
                    acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if ((k0 + TK) % KC == 0 || !more) { /* a chunk ends */
#pragma unroll
            for (uint32_t i = 0; i < 8; i++)
#pragma unroll
                for (uint32_t j = 0; j < 8; j++) {
                    total[i][j] = __fadd_rn(total[i][j], acc[i][j]);
                    acc[i][j] = 0.0f;
                }
        }
        if (more) {
            __syncthreads(); /* this step's tiles are read */
            store();
            __syncthreads();
        }
    }
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {
        const uint32_t r = row0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
            const uint32_t c = col0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
            if (r < m && c < n) {
                float *out = y + (size_t)r * ldy + c;
                *out = accumulate ? __fadd_rn(*out, total[i][j]) : total[i][j];
            }
        }
    }
}

/* ------------------------------------------------------------------ GEMV
 *
 * A block of WARPS warps owns WARPS * CPW weight rows (output columns) and
 * MR rows of x (a row group: blockIdx.y). Lane L of a warp owns column
 * L / RC of its warp's CPW and chunk L % RC of the round: a round covers
 * RC = 32 / CPW consecutive chunks. Per round:
 *   - the block stages the round's x (MR rows x RC chunks) in shared memory,
 *     each chunk's row padded to KC + 4 floats so that the lanes' float4
 *     reads of RC different chunks fall in different banks;
 *   - each warp stages its 32 weight lines (line L: lane L's column and
 *     chunk, KC * sizeof(WT) bytes) with coalesced 16-byte loads, each line
 *     padded by 16 bytes (conflict-free 16-byte reads of 32 lines); the
 *     next round's loads are in flight while this round computes;
 *   - lane L computes its chunk's MR partials in ascending k;
 *   - lane u * MR + r adds the round's partials of (column u, row r) to its
 *     running total in ascending chunk order.
 * CPW grows with MR so that each x value read from shared memory serves
 * more weight bytes. The tiled kernel takes rows whose weights are not
 * 16-byte aligned (same bits). */

#define GEMV_MAX_M 32 /* m above: the tiled kernel */
#define XPAD 4

template <typename WT, uint32_t MR> struct gemv_shape {
    static constexpr uint32_t EPS = 16 / sizeof(WT);           /* elements per 16 bytes */
    static constexpr uint32_t SEGS = KC / EPS;                 /* 16-byte segments a line */
    static constexpr uint32_t WARPS = sizeof(WT) == 4 ? 2 : 4; /* shared memory < 48 KiB */
    static constexpr uint32_t THREADS = WARPS * 32;
    static constexpr uint32_t CPW = MR <= 2 ? 1 : MR / 2;      /* columns per warp */
    static constexpr uint32_t RC = 32 / CPW;                   /* chunks per round */
    static constexpr uint32_t COLS = WARPS * CPW;              /* columns per block */
    static constexpr uint32_t XROW = KC + XPAD;                /* floats per staged x chunk */
    static_assert(KC % EPS == 0 && SEGS % 2 == 0, "lines of an odd number of segments");
    static_assert(CPW * MR <= 32 && CPW * RC == 32, "one lane per (column, row) total");
    static_assert(MR * 33 * 4 <= 32 * (SEGS + 1) * 16, "the partials fit a warp's lines");
};

__device__ static inline uint32_t word_of(const uint4 &v, uint32_t i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* element e of a 16-byte segment of weights, widened (little-endian) */
template <typename WT> __device__ static inline float seg_elem(const uint4 &v, uint32_t e);

template <> __device__ inline float seg_elem<float>(const uint4 &v, uint32_t e)
{
    return widen(__uint_as_float(word_of(v, e)));
}

template <> __device__ inline float seg_elem<bf16_t>(const uint4 &v, uint32_t e)
{
    return widen(bf16_t{(uint16_t)(word_of(v, e / 2) >> (16 * (e % 2)))});
}

template <> __device__ inline float seg_elem<f16_t>(const uint4 &v, uint32_t e)
{
    return widen(f16_t{(uint16_t)(word_of(v, e / 2) >> (16 * (e % 2)))});
}

template <> __device__ inline float seg_elem<f8_t>(const uint4 &v, uint32_t e)
{
    return widen(f8_t{(uint8_t)(word_of(v, e / 4) >> (8 * (e % 4)))});
}

/* Loads (into regs) the warp's 32 weight lines of round R; a segment past
 * the row (k is a multiple of EPS here) or of a column past n reads zero. */
template <typename WT, uint32_t MR>
__device__ static inline void gemv_load_w(uint4 *regs, const char *__restrict__ w,
                                          size_t row_bytes, uint32_t col_w, uint32_t R,
                                          uint32_t n, uint32_t k, uint32_t lane)
{
    typedef gemv_shape<WT, MR> S;
#pragma unroll
    for (uint32_t t = 0; t < S::SEGS; t++) {
        const uint32_t idx = t * 32 + lane, line = idx / S::SEGS, seg = idx % S::SEGS;
        const uint32_t c = col_w + line / S::RC, j = R * S::RC + line % S::RC;
        const uint32_t e0 = j * KC + seg * S::EPS; /* the segment's first element */
        regs[t] = c < n && e0 < k
                      ? __ldcg((const uint4 *)(w + (size_t)c * row_bytes + (size_t)e0 * sizeof(WT)))
                      : make_uint4(0, 0, 0, 0);
    }
}

template <typename WT, uint32_t MR>
__global__ void __launch_bounds__(gemv_shape<WT, MR>::THREADS)
gemv_kernel(const float *__restrict__ x, uint32_t ldx, const WT *__restrict__ w, wscale_t wsc,
            float *__restrict__ y, uint32_t ldy, uint32_t m, uint32_t n, uint32_t k,
            bool accumulate, group_t grp)
{
    typedef gemv_shape<WT, MR> S;
    __shared__ __align__(16) float xs[MR * S::RC * S::XROW];
    __shared__ uint4 wbuf[S::WARPS][32 * (S::SEGS + 1)];
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t col_w = blockIdx.x * S::COLS + warp * S::CPW; /* the warp's first column */
    uint32_t row0;
    if (!block_rows(grp, MR, w, wsc, row0, m))
        return;
    const uint32_t n_chunks = (k + KC - 1) / KC;
    const size_t row_bytes = (size_t)k * sizeof(WT);
    const char *wb = (const char *)w;
    const uint32_t q = lane % S::RC, u = lane / S::RC; /* this lane's chunk slot, column */
    uint4 regs[S::SEGS];
    float total = 0.0f; /* lane u' * MR + r': output (column u', row r') */

    gemv_load_w<WT, MR>(regs, wb, row_bytes, col_w, 0, n, k, lane);
    for (uint32_t R = 0; R * S::RC < n_chunks; R++) {
        __syncthreads(); /* the last round's readers of xs and wbuf are done */
        uint4 *lines = wbuf[warp];
#pragma unroll
        for (uint32_t t = 0; t < S::SEGS; t++) {
            const uint32_t idx = t * 32 + lane;
            lines[(idx / S::SEGS) * (S::SEGS + 1) + idx % S::SEGS] = regs[t];
        }
        const uint32_t kr = R * S::RC * KC; /* the round's first element */
#pragma unroll 8
        for (uint32_t i = tid; i < MR * S::RC * KC; i += S::THREADS) {
            const uint32_t r = i / (S::RC * KC), rem = i % (S::RC * KC);
            const uint32_t gr = min(row0 + r, m - 1); /* rows past m: computed, not written */
            xs[(r * S::RC + rem / KC) * S::XROW + rem % KC] =
                kr + rem < k ? x[(size_t)gr * ldx + kr + rem] : 0.0f;
        }
        if ((R + 1) * S::RC < n_chunks)
            gemv_load_w<WT, MR>(regs, wb, row_bytes, col_w, R + 1, n, k, lane);
        __syncthreads();

        /* this lane's chunk: its partial for each of the MR rows */
        const uint32_t j = R * S::RC + q;
        const uint32_t n_segs = j < n_chunks ? min((uint32_t)KC, k - j * KC) / S::EPS : 0;
        const uint4 *line = lines + lane * (S::SEGS + 1);
        const float *xc = xs + q * S::XROW;
        float part[MR];
#pragma unroll
        for (uint32_t r = 0; r < MR; r++)
            part[r] = 0.0f;
        /* FP8: the block scale of the current element, stepped at block edges */
        const float *srow = nullptr;
        uint32_t sb = 0, s_next = 0;
        float sc = 1.0f;
        if constexpr (std::is_same_v<WT, f8_t>) {
            if (n_segs > 0 && col_w + u < n) {
                srow = wsc.scale + (size_t)(col_w + u) * wsc.ld;
                sb = j * KC / wsc.block;
                s_next = (sb + 1) * wsc.block;
                sc = srow[sb];
            }
        }
#pragma unroll
        for (uint32_t s = 0; s < S::SEGS; s++) {
            if (s < n_segs) {
                const uint4 v = line[s];
#pragma unroll
                for (uint32_t e4 = 0; e4 < S::EPS; e4 += 4) {
                    float4 xv[MR];
#pragma unroll
                    for (uint32_t r = 0; r < MR; r++)
                        xv[r] = *(const float4 *)(xc + r * S::RC * S::XROW + s * S::EPS + e4);
#pragma unroll
                    for (uint32_t e = 0; e < 4; e++) {
                        float wv = seg_elem<WT>(v, e4 + e);
                        if constexpr (std::is_same_v<WT, f8_t>) {
                            if (srow != nullptr && j * KC + s * S::EPS + e4 + e == s_next) {
                                sb++;
                                s_next += wsc.block;
                                sc = srow[sb];
                            }
                            wv = __fmul_rn(wv, sc);
                        }
#pragma unroll
                        for (uint32_t r = 0; r < MR; r++) {
                            const float xe = e == 0 ? xv[r].x : e == 1 ? xv[r].y
                                           : e == 2 ? xv[r].z : xv[r].w;
                            part[r] = fmaf(xe, wv, part[r]);
                        }
                    }
                }
            }
        }
        /* the partials, through this warp's line buffer (read out above);
         * rows 33 floats apart: the summing lanes read in distinct banks */
        __syncwarp();
        float *parts = (float *)lines;
#pragma unroll
        for (uint32_t r = 0; r < MR; r++)
            parts[r * 33 + lane] = part[r];
        __syncwarp();
        if (lane < S::CPW * MR) {
            const uint32_t uo = lane / MR, ro = lane % MR;
            const uint32_t n_round = min(S::RC, n_chunks - R * S::RC);
            for (uint32_t qq = 0; qq < n_round; qq++)
                total = __fadd_rn(total, parts[ro * 33 + uo * S::RC + qq]);
        }
    }
    if (lane < S::CPW * MR) {
        const uint32_t c = col_w + lane / MR, r = row0 + lane % MR;
        if (c < n && r < m) {
            float *out = y + (size_t)r * ldy + c;
            *out = accumulate ? __fadd_rn(*out, total) : total;
        }
    }
}

/* Where a grouped GEMM's blocks come from: its plan and the grid's y (the
 * most tiles there can be), or for one matrix none (rows by blockIdx.y) */
struct rows_t {
    group_t g;
    uint32_t gy;
};

static rows_t one_matrix(uint32_t m, uint32_t T)
{
    return rows_t{group_t{}, (m + T - 1) / T};
}

template <typename WT, uint32_t MR>
static void gemv_launch(const hpd_gemm_args_t *a, wscale_t wsc, const rows_t &rw, cudaStream_t s)
{
    typedef gemv_shape<WT, MR> S;
    const dim3 grid((a->n + S::COLS - 1) / S::COLS, rw.gy);
    gemv_kernel<WT, MR><<<grid, S::THREADS, 0, s>>>(a->x, a->ldx, (const WT *)a->w, wsc, a->y,
                                                     a->ldy, a->m, a->n, a->k, a->accumulate,
                                                     rw.g);
}

/* MR: the smallest of 1, 2, 4, 8 that holds m rows (8 above: row groups) */
static uint32_t gemv_mr(uint32_t m)
{
    return m == 1 ? 1 : m == 2 ? 2 : m <= 4 ? 4 : 8;
}

template <typename WT>
static void gemv(const hpd_gemm_args_t *a, uint32_t mr, wscale_t wsc, const rows_t &rw,
                 cudaStream_t s)
{
    if (mr == 1)
        gemv_launch<WT, 1>(a, wsc, rw, s);
    else if (mr == 2)
        gemv_launch<WT, 2>(a, wsc, rw, s);
    else if (mr == 4)
        gemv_launch<WT, 4>(a, wsc, rw, s);
    else
        gemv_launch<WT, 8>(a, wsc, rw, s);
}

/* Whether the GEMV takes a GEMM of at most `rows` rows a block: few rows,
 * and every weight row 16-byte aligned for its 16-byte loads (else the
 * tiled kernel, the same bits) */
static bool gemv_takes(const hpd_gemm_args_t *a, uint32_t rows)
{
    const size_t es = hpd_dtype_size(a->w_dtype);
    return rows <= GEMV_MAX_M && a->k > 0 && (uintptr_t)a->w % 16 == 0 &&
           (size_t)a->k * es % 16 == 0;
}

/* The rows a block takes: the GEMV's MR, or the tiled kernel's TM */
static uint32_t f32_tile_rows(const hpd_gemm_args_t *a, uint32_t rows)
{
    return gemv_takes(a, rows) ? gemv_mr(rows) : TM;
}

template <typename WT>
static void gemm_launch(const hpd_gemm_args_t *a, uint32_t rows, wscale_t wsc, const rows_t &rw,
                        cudaStream_t s)
{
    if (gemv_takes(a, rows)) {
        gemv<WT>(a, gemv_mr(rows), wsc, rw, s);
        return;
    }
    const dim3 grid((a->n + TN - 1) / TN, rw.gy);
    gemm_kernel<<<grid, TILE_THREADS, 0, s>>>(a->x, a->ldx, (const WT *)a->w, wsc, a->y, a->ldy,
                                              a->m, a->n, a->k, a->accumulate, rw.g);
}

/* The kernels of fp32 products; `rows`: the most rows a block's matrix
 * has (m, or a grouped GEMM's max_rows) */
static hpd_status_t gemm_f32(hpd_backend_t *b, const hpd_gemm_args_t *a, uint32_t rows,
                             const rows_t &rw)
{
    cudaStream_t s = hpd_cuda_ctx(b)->stream;
    const wscale_t wsc = {a->w_scale, a->w_scale_ld, a->w_block};
    switch (a->w_dtype) {
    case HPD_DTYPE_F32:
        gemm_launch<float>(a, rows, wsc, rw, s);
        break;
    case HPD_DTYPE_BF16:
        gemm_launch<bf16_t>(a, rows, wsc, rw, s);
        break;
    case HPD_DTYPE_F16:
        gemm_launch<f16_t>(a, rows, wsc, rw, s);
        break;
    case HPD_DTYPE_F8_E4M3:
        if (a->w_scale == NULL || a->w_block == 0)
            return HPD_ERR_INVALID_ARG;
        gemm_launch<f8_t>(a, rows, wsc, rw, s);
        break;
    default:
        return HPD_ERR_UNSUPPORTED;
    }
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

hpd_status_t hpd_cuda_gemm(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    if (a->m == 0 || a->n == 0)
        return HPD_OK;
    return gemm_f32(b, a, a->m, one_matrix(a->m, f32_tile_rows(a, a->m)));
}

/* ---- Grouped GEMMs (hpd_gemm_grouped_args_t: a mixture of experts'
 * expert GEMMs in one launch each)
 *
 * The groups' rows stay on the device: plan_kernel cuts each group's rows
 * (first[x] .. first[x + 1] - 1) into tiles of T rows, T the rows a block
 * of the kernel takes (the GEMV's MR, the tiled kernels' 128, the decode
 * kernels' max_rows), and lists them group by group; block y of the
 * kernel takes tile y (block_rows), and the grid's y is the most tiles
 * there can be, ceil(rows / T) + min(groups, rows): the blocks past the
 * plan's tiles end at once. A tile runs the kernel of one matrix over its
 * rows, so each row has the bits gemm gives it, whatever the grouping. The
 * kernel is chosen by max_rows (a bound every group's rows are within) as
 * gemm chooses by m. */
#define PLAN_THREADS 1024 /* a thread per group: HPD_MAX_EXPERTS */

__global__ void __launch_bounds__(PLAN_THREADS)
    plan_kernel(const uint32_t *first, uint32_t n_groups, uint32_t T, uint32_t bound,
                uint4 *tiles)
{
    __shared__ uint32_t scan[2][PLAN_THREADS];
    const uint32_t x = threadIdx.x;
    const uint32_t r0 = x < n_groups ? first[x] : 0, cnt = x < n_groups ? first[x + 1] - r0 : 0;
    const uint32_t nt = (cnt + T - 1) / T;
    uint32_t total;
    const uint32_t base = hpd_block_scan<PLAN_THREADS>(nt, scan, &total) - nt;
    for (uint32_t i = 0; i < nt && base + i < bound; i++)
        tiles[base + i] = make_uint4(x, r0 + i * T, min(T, cnt - i * T), 0u);
    for (uint32_t i = total + x; i < bound; i += PLAN_THREADS)
        tiles[i] = make_uint4(NO_TILE, 0u, 0u, 0u);
}

/* the most tiles of T rows the groups can have */
static uint32_t plan_bound(const hpd_gemm_grouped_args_t *ga, uint32_t T)
{
    return (uint32_t)(((uint64_t)ga->g.m + T - 1) / T + HPD_MIN(ga->n_groups, ga->g.m));
}

/* the plan's bytes in front of the work buffer */
static size_t plan_bytes(const hpd_gemm_grouped_args_t *ga, uint32_t T)
{
    return ((size_t)plan_bound(ga, T) * sizeof(uint4) + 255) & ~(size_t)255;
}

/* Plans a grouped GEMM's tiles of T rows into `tiles` (work memory of
 * plan_bytes) and says where the kernel's blocks come from */
static hpd_status_t plan(hpd_backend_t *b, const hpd_gemm_grouped_args_t *ga, uint32_t T,
                         uint4 *tiles, rows_t *rw)
{
    const uint32_t bound = plan_bound(ga, T);
    if (bound > 65535u) { /* the grid's y */
        HPD_LOG_ERROR("cuda",
                      "grouped GEMM of %u rows in %u groups: %u tiles of %u rows, at most 65535",
                      ga->g.m, ga->n_groups, bound, T);
        return HPD_ERR_INVALID_ARG;
    }
    plan_kernel<<<1, PLAN_THREADS, 0, hpd_cuda_ctx(b)->stream>>>(ga->first, ga->n_groups, T,
                                                                  bound, tiles);
    HPD_CUDA_LAUNCHED();
    const size_t es = hpd_dtype_size(ga->g.w_dtype);
    rw->g = group_t{tiles, (size_t)ga->g.n * ga->g.k * es, (size_t)ga->g.n * ga->g.w_scale_ld};
    rw->gy = bound;
    return HPD_OK;
}

/* The rows a grouped GEMM's kernel is chosen by (as gemm's by m): max_rows
 * where they are few (decode); else, where the groups' mean is few (a
 * prompt spread over many experts), `few`: the decode kernels then take a
 * group's rows `few` at a time, reading its weights once per tile, where
 * the tiled kernels' 128-row tiles would compute mostly rows of padding;
 * else max_rows (the tiled kernels). The choice moves no bit. */
static uint32_t grouped_rows(const hpd_gemm_grouped_args_t *ga, uint32_t few)
{
    const uint32_t rows = HPD_MIN(ga->max_rows, ga->g.m);
    const uint32_t busy = HPD_MIN(ga->n_groups, ga->g.m); /* the most groups with rows */
    const uint32_t mean = (ga->g.m + busy - 1) / busy;
    return rows <= few || mean > few ? rows : few;
}

/* what every grouped GEMM needs of its arguments */
static hpd_status_t grouped_args(const hpd_gemm_grouped_args_t *ga)
{
    if (ga->n_groups == 0 || ga->n_groups > PLAN_THREADS || ga->max_rows == 0) {
        HPD_LOG_ERROR("cuda",
                      "grouped GEMM of %u groups (1 to %u), at most %u rows a group (1 or more)",
                      ga->n_groups, PLAN_THREADS, ga->max_rows);
        return HPD_ERR_INVALID_ARG;
    }
    return HPD_OK;
}

hpd_status_t hpd_cuda_gemm_grouped(hpd_backend_t *b, const hpd_gemm_grouped_args_t *ga)
{
    void *work;
    hpd_status_t st;
    if (ga->g.m == 0 || ga->g.n == 0)
        return HPD_OK;
    if ((st = grouped_args(ga)) != HPD_OK)
        return st;
    const uint32_t rows = grouped_rows(ga, GEMV_MAX_M), T = f32_tile_rows(&ga->g, rows);
    rows_t rw;
    if ((st = hpd_cuda_work(b, plan_bytes(ga, T), &work)) != HPD_OK ||
        (st = plan(b, ga, T, (uint4 *)work, &rw)) != HPD_OK)
        return st;
    return gemm_f32(b, &ga->g, rows, rw);
}

/* ---- BF16 weights on tensor cores (device cuda-fast)
 *
 * y = x w^T with x rounded to bf16 (to nearest even) and the products of
 * mma.sync m16n8k16 accumulated in fp32. x is rounded once, into a bf16
 * copy in the work buffer (tc_round_x_kernel); then blocks of 128 rows by
 * 128 weight rows, eight warps of 64 x 32, walk k in tiles of 32 through a
 * ring of TC_STAGES tiles in shared memory: each tile's x and w rows come
 * by cp.async (zeros past k and past the last rows), TC_STAGES - 1 tiles
 * ahead of the one the warps multiply, whose fragments they take with
 * ldmatrix. Every output is the same sequence of tensor-core steps over k
 * whatever m, the block or the other rows (no split of k): within this
 * kernel a row's bits do not depend on the batch (cuda-fast sends batches
 * of up to TC_MIN_ROWS rows to the GEMV instead, whose bits differ:
 * cuda-fast rows depend on the batch). Weight rows 16-byte aligned
 * (k % 8 == 0).
 *
 * The device cuda-bf16 keeps rows batch-invariant on tensor cores: every
 * output is the sequence acc = 0; for each step of 16 k in ascending order
 * (ceil(k / 16) steps, zeros past k): acc = mma(x row, w row, acc); y = acc
 * (or y + acc). The tiled kernel computes it for batches of more than
 * TC_MIN_ROWS rows, gemv_tc_kernel for fewer (decode) with the same mma
 * operands per output; a tensor core's output element depends on its own
 * row of A, column of B and accumulator alone, so a row's bits are the same
 * in either kernel and in any batch. */
#define TC_BM 128
#define TC_STAGES 3
#define TC_THREADS 256
#define TC_MIN_ROWS 32 /* cuda-fast: fewer rows take the GEMV */

/* The tiled kernel's two shapes (the same bits: a tile's shape moves no
 * product of an output): blocks of 128 x 128 weight rows, warps of 64 x 32,
 * k tiles of 32 (TC_NARROW); or 128 x 256, warps of 64 x 64, k tiles of 64
 * (TC_WIDE: CUTLASS's usual shape for large GEMMs on sm_80, two k steps
 * more between barriers and half the fragment loads per product, one block
 * an SM), taken where its blocks fill the GPU. A shape's shared rows hold
 * BK + 8 bf16 (the eight rows of an ldmatrix in different banks). */
template <uint32_t WN_, uint32_t BK_> struct tc_tile {
    static constexpr uint32_t WN = WN_, BK = BK_, BN = 4 * WN, LD = BK + 8;
    static constexpr size_t SMEM = (size_t)TC_STAGES * (TC_BM + BN) * LD * 2;
};
typedef tc_tile<32, 32> TC_NARROW;
typedef tc_tile<64, 64> TC_WIDE;

/* xb[r][c] = bf16(x[r][c]), rows of k, four elements per step (x rows
 * off 16-byte alignment read one float at a time) */
__global__ void tc_round_x_kernel(const float *x, uint32_t ldx, uint32_t *xb, uint32_t m,
                                  uint32_t k)
{
    const uint64_t quads = (uint64_t)m * (k / 4);
    const bool vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
    for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; e < quads;
         e += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = e / (k / 4), c = e % (k / 4) * 4;
        const float *src = x + r * ldx + c;
        const float4 q = vec ? *(const float4 *)src : make_float4(src[0], src[1], src[2], src[3]);
        uint32_t *dst = xb + (r * k + c) / 2;
        dst[0] = hpd_bf16x2(q.x, q.y);
        dst[1] = hpd_bf16x2(q.z, q.w);
    }
}

/* FP8 weights on tensor cores (cuda-bf16): each weight dequantised to
 * bf16(q * scale), rounded to nearest even, the same in every kernel */
__device__ static inline uint32_t tc_f8_bf16(uint32_t q, float scale)
{
    return hpd_bf16_rn(__fmul_rn(widen(f8_t{(uint8_t)q}), scale));
}

/* A k tile of FP8 weights (BN rows of BK): eight weights per step (one
 * scale: the scale blocks are multiples of 8), dequantised through
 * registers and stored, ready before the barrier that precedes their tile's
 * use. */
template <typename TT>
__device__ static inline void tc_load_tile_f8(uint16_t *dst, const uint8_t *src, wscale_t ws,
                                              uint32_t r0, uint32_t rows, uint32_t k, uint32_t k0,
                                              uint32_t tid)
{
    #pragma unroll
    for (uint32_t e = tid; e < TT::BN * TT::BK / 8; e += TC_THREADS) {
        const uint32_t r = e / (TT::BK / 8), c = e % (TT::BK / 8) * 8;
        uint2 q = {0u, 0u};
        float sc = 0.0f;
        if (r0 + r < rows && k0 + c < k) {
            q = *(const uint2 *)(src + (size_t)(r0 + r) * k + k0 + c);
            sc = ws.scale[(size_t)(r0 + r) * ws.ld + (k0 + c) / ws.block];
        }
        uint4 v;
        v.x = tc_f8_bf16(q.x & 0xff, sc) | tc_f8_bf16(q.x >> 8 & 0xff, sc) << 16;
        v.y = tc_f8_bf16(q.x >> 16 & 0xff, sc) | tc_f8_bf16(q.x >> 24, sc) << 16;
        v.z = tc_f8_bf16(q.y & 0xff, sc) | tc_f8_bf16(q.y >> 8 & 0xff, sc) << 16;
        v.w = tc_f8_bf16(q.y >> 16 & 0xff, sc) | tc_f8_bf16(q.y >> 24, sc) << 16;
        *(uint4 *)(dst + r * TT::LD + c) = v;
    }
}

/* A thread's share of a k tile of R rows (x, or BF16 w) of BK columns in
 * the tiled kernel: its CH 16-byte chunks (e = tid, tid + TC_THREADS: row
 * e / (BK / 8), column (e % (BK / 8)) * 8, the same column for all), each
 * row's start and shared offset worked out once instead of per tile (the
 * address arithmetic per copy took some 30 instructions, as many issue
 * slots per tile as the tile's mma.sync) */
template <uint32_t R, uint32_t BK> struct tc_rows_t {
    static constexpr uint32_t CH = R * BK / 8 / TC_THREADS;
    const uint16_t *row[CH]; /* the chunk's row at column c; NULL past the rows */
    uint32_t soff[CH];       /* its place in a stage */
    uint32_t c;
};

template <uint32_t R, uint32_t BK>
__device__ static inline tc_rows_t<R, BK> tc_rows(const uint16_t *src, uint32_t r0,
                                                  uint32_t rows, uint32_t k, uint32_t tid)
{
    static_assert(R * BK / 8 % TC_THREADS == 0 && TC_THREADS % (BK / 8) == 0,
                  "every thread copies the same column of whole chunks");
    tc_rows_t<R, BK> t;
    t.c = tid % (BK / 8) * 8;
    #pragma unroll
    for (uint32_t i = 0; i < t.CH; i++) {
        const uint32_t r = (tid + i * TC_THREADS) / (BK / 8);
        t.row[i] = r0 + r < rows ? src + (size_t)(r0 + r) * k + t.c : nullptr;
        t.soff[i] = r * (BK + 8) + t.c;
    }
    return t;
}

/* Issues a thread's copies of the tile at k0 into dst, from the rows worked
 * out by tc_rows: zero past the rows and past k (k % 8 == 0: a chunk is
 * whole or out); `base` stands for the source of a zero fill. */
template <uint32_t R, uint32_t BK>
__device__ static inline void tc_issue(uint16_t *dst, const tc_rows_t<R, BK> &t,
                                       const uint16_t *base, uint32_t k, uint32_t k0)
{
    const bool kin = k0 + t.c < k;
    #pragma unroll
    for (uint32_t i = 0; i < t.CH; i++) {
        const bool in = kin && t.row[i] != nullptr;
        hpd_cp_async16(dst + t.soff[i], in ? t.row[i] + k0 : base, in ? 16u : 0u);
    }
}

template <bool FP8, typename TT>
__global__ void __launch_bounds__(TC_THREADS)
    gemm_tc_kernel(const uint16_t *xb, const void *w, wscale_t ws, float *y, uint32_t ldy,
                   uint32_t m, uint32_t n, uint32_t k, bool accumulate, group_t grp)
{
    constexpr uint32_t BN = TT::BN, BK = TT::BK, LD = TT::LD, NJ = TT::WN / 8;
    extern __shared__ uint4 tc_smem[];
    uint16_t *const As = (uint16_t *)tc_smem, *const Bs = As + TC_STAGES * TC_BM * LD;
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t g = lane / 4, t = lane % 4, wm = warp / 4 * 64, wn = warp % 4 * TT::WN;
    const uint32_t n0 = blockIdx.x * BN;
    uint32_t m0;
    if (!block_rows(grp, TC_BM, w, ws, m0, m))
        return;
    const uint32_t tiles = (k + BK - 1) / BK;
    float acc[4][NJ][4];
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (uint32_t j = 0; j < NJ; j++)
            #pragma unroll
            for (int r = 0; r < 4; r++)
                acc[i][j][r] = 0.0f;

    /* a k tile of x and of w into a stage (BF16 w by cp.async; FP8 w
     * dequantised through registers) */
    const tc_rows_t<TC_BM, BK> xr = tc_rows<TC_BM, BK>(xb, m0, m, k, tid);
    /* BF16 w (FP8: no rows, its tiles go through registers) */
    const tc_rows_t<BN, BK> wr = tc_rows<BN, BK>((const uint16_t *)w, n0, FP8 ? 0 : n, k, tid);
    const auto load = [&](uint32_t stage, uint32_t kt) {
        tc_issue(As + stage * TC_BM * LD, xr, xb, k, kt * BK);
        if constexpr (FP8)
            tc_load_tile_f8<TT>(Bs + stage * BN * LD, (const uint8_t *)w, ws, n0, n, k, kt * BK,
                                tid);
        else
            tc_issue(Bs + stage * BN * LD, wr, (const uint16_t *)w, k, kt * BK);
    };
    /* the first TC_STAGES - 1 tiles in flight (a group per tile, empty past
     * the last, so that every wait below counts the same) */
    #pragma unroll
    for (uint32_t s = 0; s < TC_STAGES - 1; s++) {
        if (s < tiles)
            load(s, s);
        hpd_cp_async_commit();
    }
    /* each lane's ldmatrix rows: x's 16-row tiles (rows 0-7 then 8-15 at k,
     * then both at k + 8), w's pairs of 8-row tiles (k, k + 8 of each) */
    const uint32_t a_row = wm + lane % 8 + 8 * (lane / 8 % 2), a_col = 8 * (lane / 16);
    const uint32_t b_row = wn + lane % 8 + 8 * (lane / 16), b_col = 8 * (lane / 8 % 2);
    /* the stages of tile kt and of the tile loaded meanwhile, as counters
     * (no division per tile) */
    for (uint32_t kt = 0, use = 0, fill = TC_STAGES - 1; kt < tiles; kt++) {
        hpd_cp_async_wait<TC_STAGES - 2>(); /* this thread's part of tile kt landed */
        __syncthreads(); /* everyone's; and the stage refilled below was read */
        if (kt + TC_STAGES - 1 < tiles)
            load(fill, kt + TC_STAGES - 1);
        hpd_cp_async_commit();
        const uint16_t *A = As + use * TC_BM * LD;
        const uint16_t *B = Bs + use * BN * LD;
        use = use + 1 == TC_STAGES ? 0 : use + 1;
        fill = fill + 1 == TC_STAGES ? 0 : fill + 1;
        #pragma unroll
        for (uint32_t kk = 0; kk < BK; kk += 16) {
            if (kt * BK + kk >= k)
                break; /* no step past k: the sequence is ceil(k / 16) steps, as in the GEMV */
            uint32_t a[4][4], b[NJ][2];
            #pragma unroll
            for (int i = 0; i < 4; i++)
                hpd_ldmatrix_x4(a[i], A + (a_row + 16 * i) * LD + kk + a_col);
            #pragma unroll
            for (uint32_t p = 0; p < NJ / 2; p++) {
                uint32_t r[4];
                hpd_ldmatrix_x4(r, B + (b_row + 16 * p) * LD + kk + b_col);
                b[2 * p][0] = r[0], b[2 * p][1] = r[1];
                b[2 * p + 1][0] = r[2], b[2 * p + 1][1] = r[3];
            }
            #pragma unroll
            for (int i = 0; i < 4; i++)
                #pragma unroll
                for (uint32_t j = 0; j < NJ; j++)
                    hpd_mma_bf16_16816(acc[i][j], a[i], b[j]);
        }
    }
    hpd_cp_async_wait<0>(); /* the empty groups */
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (uint32_t j = 0; j < NJ; j++)
            #pragma unroll
            for (int r = 0; r < 4; r++) {
                const uint32_t row = m0 + wm + i * 16 + g + 8 * (r / 2);
                const uint32_t col = n0 + wn + j * 8 + 2 * t + r % 2;
                if (row < m && col < n) {
                    float *o = y + (size_t)row * ldy + col;
                    *o = accumulate ? *o + acc[i][j][r] : acc[i][j][r];
                }
            }
}

/* The GEMM of decode on tensor cores (cuda-bf16, m <= TC_MIN_ROWS) where
 * gemv_ring_kernel (below) does not take the weights (FP8 rows with k not a
 * multiple of 16 or more than GR_SCALES scales): a warp
 * per 8 weight rows walks all of k, one (m <= 16) or two 16-row tiles of x
 * (rows past m zero) against them. A lane's operands of a run of steps,
 * weights (lane (g, t): row g, k 2t and 2t + 8 of each step, a 32-byte
 * sector per row and step) and x alike, are loaded a run ahead of the
 * products (the first H100 run, loading x at each step, read the weights
 * at 0.08-0.17 of the copy bandwidth). */
#define GV_WARPS 4

/* A lane's operands of STEPS steps: BF16 weight pairs as they are, FP8
 * pairs raw (dequantised when used) with their scales (a pair has one: the
 * scale blocks are multiples of 8); x's fragments of MT tiles. */
template <uint32_t STEPS, uint32_t MT> struct gv_frag_t {
    uint32_t w[STEPS][2];
    float s[STEPS][2];
    uint32_t x[STEPS][MT][4];
};

/* A lane's x fragments of STEPS steps from step s0 (rows past m and k
 * past its end zero) */
template <uint32_t STEPS, uint32_t MT>
__device__ static inline void gv_load_x(uint32_t (&x)[STEPS][MT][4], const uint16_t *xb,
                                        uint32_t m, uint32_t k, uint32_t s0, uint32_t g,
                                        uint32_t t)
{
    #pragma unroll
    for (uint32_t u = 0; u < STEPS; u++)
        #pragma unroll
        for (uint32_t h = 0; h < 2; h++) {
            const uint32_t k0 = (s0 + u) * 16 + 2 * t + 8 * h; /* k even: a pair is in or out whole */
            const bool in = k0 < k;
            #pragma unroll
            for (uint32_t mi = 0; mi < MT; mi++) { /* a[h * 2 + 0]: row g, a[h * 2 + 1]: g + 8 */
                const uint32_t r0 = mi * 16 + g, r1 = r0 + 8;
                x[u][mi][2 * h] = r0 < m && in ? *(const uint32_t *)(xb + (size_t)r0 * k + k0)
                                               : 0u;
                x[u][mi][2 * h + 1] =
                    r1 < m && in ? *(const uint32_t *)(xb + (size_t)r1 * k + k0) : 0u;
            }
        }
}

template <bool FP8, uint32_t STEPS, uint32_t MT>
__device__ static inline void gv_load(gv_frag_t<STEPS, MT> &f, const uint16_t *xb, uint32_t m,
                                      const void *wr, const float *sr, uint32_t block,
                                      bool row_in, uint32_t k, uint32_t s0, uint32_t g,
                                      uint32_t t)
{
    #pragma unroll
    for (uint32_t u = 0; u < STEPS; u++) {
        #pragma unroll
        for (uint32_t h = 0; h < 2; h++) {
            const uint32_t k0 = (s0 + u) * 16 + 2 * t + 8 * h;
            const bool in = k0 < k;
            if constexpr (FP8) {
                f.w[u][h] = row_in && in ? *(const uint16_t *)((const uint8_t *)wr + k0) : 0u;
                f.s[u][h] = row_in && in ? sr[k0 / block] : 0.0f;
            } else {
                f.w[u][h] = row_in && in ? *(const uint32_t *)((const uint16_t *)wr + k0) : 0u;
            }
        }
    }
    gv_load_x(f.x, xb, m, k, s0, g, t);
}

/* A decode kernel's outputs: lane (g, t) holds rows g, g + 8 of each x
 * tile, columns n0 + 2t, + 1 */
template <uint32_t MT>
__device__ static inline void gv_store(const float (&acc)[MT][4], float *y, uint32_t ldy,
                                       uint32_t m, uint32_t n, uint32_t n0, uint32_t g,
                                       uint32_t t, bool accumulate)
{
    #pragma unroll
    for (uint32_t mi = 0; mi < MT; mi++)
        #pragma unroll
        for (int r = 0; r < 4; r++) {
            const uint32_t row = mi * 16 + g + 8 * (r / 2), col = n0 + 2 * t + r % 2;
            if (row < m && col < n) {
                float *o = y + (size_t)row * ldy + col;
                *o = accumulate ? *o + acc[mi][r] : acc[mi][r];
            }
        }
}

template <bool FP8, uint32_t MT>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gemv_tc_kernel(const uint16_t *xb, const void *w, wscale_t ws, float *y, uint32_t ldy,
                   uint32_t m, uint32_t n, uint32_t k, bool accumulate, group_t grp)
{
    constexpr uint32_t STEPS = MT == 1 ? 8 : 4;
    const uint32_t lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t n0 = (blockIdx.x * GV_WARPS + threadIdx.x / 32) * 8;
    uint32_t row0;
    if (n0 >= n || !block_rows(grp, 0, w, ws, row0, m))
        return; /* the whole warp */
    xb += (size_t)row0 * k, y += (size_t)row0 * ldy, m -= row0; /* rows from the tile's first */
    const bool row_in = n0 + g < n;
    const size_t wrow = row_in ? n0 + g : 0;
    const void *wr = (const uint8_t *)w + wrow * k * (FP8 ? 1 : 2);
    const float *sr = FP8 ? ws.scale + wrow * ws.ld : nullptr;
    const uint32_t steps = (k + 15) / 16;
    float acc[MT][4] = {};
    /* registers: indices known when compiled */
    gv_frag_t<STEPS, MT> cur, next = {};
    gv_load<FP8>(cur, xb, m, wr, sr, ws.block, row_in, k, 0, g, t);
    for (uint32_t s0 = 0; s0 < steps; s0 += STEPS) {
        if (s0 + STEPS < steps) /* the next run's operands in flight meanwhile */
            gv_load<FP8>(next, xb, m, wr, sr, ws.block, row_in, k, s0 + STEPS, g, t);
        #pragma unroll
        for (uint32_t u = 0; u < STEPS; u++) {
            if (s0 + u >= steps)
                break;
            uint32_t b[2] = {cur.w[u][0], cur.w[u][1]};
            if constexpr (FP8)
                for (uint32_t h = 0; h < 2; h++)
                    b[h] = tc_f8_bf16(cur.w[u][h] & 0xff, cur.s[u][h]) |
                           tc_f8_bf16(cur.w[u][h] >> 8, cur.s[u][h]) << 16;
            #pragma unroll
            for (uint32_t mi = 0; mi < MT; mi++) {
                /* the fragment's order: rows g, g + 8 at k; then at k + 8 */
                const uint32_t a[4] = {cur.x[u][mi][0], cur.x[u][mi][1], cur.x[u][mi][2],
                                       cur.x[u][mi][3]};
                hpd_mma_bf16_16816(acc[mi], a, b);
            }
        }
        cur = next;
    }
    gv_store(acc, y, ldy, m, n, n0, g, t, accumulate);
}

/* The GEMM of decode on tensor cores, weights streamed (cuda-bf16): the
 * products of gemv_tc_kernel, in the same order with the same operands (so
 * the same bits), but each warp's 8 weight rows and x's rows come through
 * a ring of slots of GR_CH k in shared memory (GR_RING slots with one tile
 * of x, half as many with two), filled by cp.async a ring ahead (16-byte
 * copies, a row's 128 bytes of a slot contiguous): some 15 KB of weights in
 * flight per warp where registers held 64 bytes per lane, and x's
 * fragments read from the slot, not loaded from L2 a step before their
 * products. There is one warp per 8 weight rows whatever k, so at decode's
 * n of a few thousand an SM has a handful of warps: the bandwidth needs the
 * bytes in flight (the first H100 run read the weights at 0.08-0.17 of
 * copy). A slot holds x's first m rows only (a decode row alone: 144
 * bytes), so the block's shared memory follows m. FP8 rows take their
 * scales into shared memory first (at most GR_SCALES a row) and need
 * k % 16 == 0 (16-byte aligned rows); others keep gemv_tc_kernel. */
#define GR_WARPS 2
#define GR_CH 64
#define GR_RING 16 /* slots of a ring for m <= GR_DEEP (8 past it) */
#define GR_DEEP 4
/* slots of a ring for m <= GR_DEEP where the GEMM has at most a block per
 * SM (few weight rows: an SM then holds 2 warps, whose rings are all the
 * bytes it has in flight) */
#define GR_RING_DEEP 32
#define GR_SCALES 128
#define GR_SLD (GR_SCALES + 4) /* a row's scales: the 8 rows' reads of a step in other banks */
#define GR_XROW (2 * GR_CH + 16) /* an x row of a slot (bf16), padded as the weights' */

/* A slot's layout: the 8 weight rows (padded 16 bytes: lane (g, t)'s words
 * fall in 32 banks), then x's first min(m, 16 MT) rows; RING slots a warp
 * (GR_RING for a few rows of x, half that past GR_DEEP: a block stays
 * within 91 KB, two blocks an SM on an H100, one on GPUs of 99 KB) */
template <bool FP8, uint32_t MT, uint32_t RING> struct gr_shape {
    static constexpr uint32_t wrow = (FP8 ? GR_CH : 2 * GR_CH) + 16;
    static constexpr uint32_t ring = RING;
    static constexpr uint32_t scales = FP8 ? 8 * GR_SLD * 4 : 0;
    static __host__ __device__ uint32_t xrows(uint32_t m) { return m < 16 * MT ? m : 16 * MT; }
    static __host__ __device__ uint32_t slot(uint32_t m) { return 8 * wrow + xrows(m) * GR_XROW; }
    static __host__ __device__ uint32_t warp(uint32_t m) { return ring * slot(m) + scales; }
};

/* Issues slot j: GR_CH elements from k j * GR_CH of the warp's weight rows
 * n0..n0+7 and of x's first xrows rows, zero past n and past k (chunks are
 * whole: k % 8 == 0 for BF16, k % 16 == 0 for FP8). */
template <uint32_t WROW>
__device__ static inline void gr_fill(uint8_t *slot, const uint8_t *w, const uint16_t *xb,
                                      uint32_t xrows, uint32_t n0, uint32_t n, uint32_t k,
                                      uint32_t j, uint32_t lane)
{
    constexpr bool FP8 = WROW == GR_CH + 16;
    constexpr uint32_t ES = FP8 ? 1 : 2, PER = 16 / ES, CHUNKS = GR_CH / PER, XCH = GR_CH / 8;
    #pragma unroll
    for (uint32_t e = lane; e < 8 * CHUNKS; e += 32) {
        const uint32_t r = e / CHUNKS, c = e % CHUNKS, k0 = j * GR_CH + c * PER;
        const bool in = n0 + r < n && k0 < k;
        const uint8_t *src = in ? w + ((size_t)(n0 + r) * k + k0) * ES : w;
        hpd_cp_async16(slot + r * WROW + c * 16, src, in ? 16u : 0u);
    }
    uint8_t *xs = slot + 8 * WROW;
    for (uint32_t e = lane; e < xrows * XCH; e += 32) {
        const uint32_t r = e / XCH, c = e % XCH, k0 = j * GR_CH + c * 8;
        const bool in = k0 < k;
        hpd_cp_async16(xs + r * GR_XROW + c * 16, in ? xb + (size_t)r * k + k0 : xb, in ? 16u : 0u);
    }
}

template <bool FP8, uint32_t MT, uint32_t RING_>
__global__ void __launch_bounds__(GR_WARPS * 32)
    gemv_ring_kernel(const uint16_t *xb, const void *w, wscale_t ws, float *y, uint32_t ldy,
                     uint32_t m, uint32_t n, uint32_t k, bool accumulate, group_t grp)
{
    using SH = gr_shape<FP8, MT, RING_>;
    constexpr uint32_t STEPS = GR_CH / 16, RING = SH::ring;
    extern __shared__ float4 gr_sm4[];
    uint32_t row0;
    if (!block_rows(grp, 0, w, ws, row0, m))
        return; /* the whole block */
    xb += (size_t)row0 * k, y += (size_t)row0 * ldy, m -= row0; /* rows from the tile's first */
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    /* a warp past n works on zeros (no early exit: the host stand-in's
     * __syncwarp waits for the whole block) */
    const uint32_t n0 = (blockIdx.x * GR_WARPS + warp) * 8, xrows = SH::xrows(m);
    const uint32_t slot_bytes = SH::slot(m);
    uint8_t *ring = (uint8_t *)gr_sm4 + warp * SH::warp(m);
    float *scales = (float *)(ring + RING * slot_bytes); /* FP8: [8][GR_SLD] */
    const uint32_t steps = (k + 15) / 16, slots = (k + GR_CH - 1) / GR_CH;
    const uint8_t *w8 = (const uint8_t *)w;
    if constexpr (FP8) {
        const uint32_t ns = (k + ws.block - 1) / ws.block;
        for (uint32_t e = lane; e < 8 * ns; e += 32) {
            const uint32_t r = e / ns, i = e % ns;
            scales[r * GR_SLD + i] = n0 + r < n ? ws.scale[(size_t)(n0 + r) * ws.ld + i] : 0.0f;
        }
    }
    for (uint32_t j = 0; j + 1 < RING; j++) {
        if (j < slots)
            gr_fill<SH::wrow>(ring + j * slot_bytes, w8, xb, xrows, n0, n, k, j, lane);
        hpd_cp_async_commit(); /* empty groups too: one group per slot */
    }
    float acc[MT][4] = {};
    for (uint32_t j = 0; j < slots; j++) {
        __syncwarp(); /* every lane done with slot j - 1, refilled now */
        const uint32_t jf = j + RING - 1;
        if (jf < slots)
            gr_fill<SH::wrow>(ring + jf % RING * slot_bytes, w8, xb, xrows, n0, n, k, jf, lane);
        hpd_cp_async_commit();
        hpd_cp_async_wait<RING - 1>(); /* this lane's copies of slot j */
        __syncwarp();                  /* and every lane's (the scales too, at j = 0) */
        const uint8_t *sl = ring + j % RING * slot_bytes;
        const uint8_t *wl = sl + g * SH::wrow, *xs = sl + 8 * SH::wrow;
        #pragma unroll
        for (uint32_t u = 0; u < STEPS; u++) {
            if (j * STEPS + u >= steps)
                break;
            uint32_t b[2], a[MT][4];
            #pragma unroll
            for (uint32_t h = 0; h < 2; h++) {
                const uint32_t kk = u * 16 + 2 * t + 8 * h; /* within the slot */
                if constexpr (FP8) {
                    const uint32_t q = *(const uint16_t *)(wl + kk), col = j * GR_CH + kk;
                    const float sc = col < k ? scales[g * GR_SLD + col / ws.block] : 0.0f;
                    b[h] = tc_f8_bf16(q & 0xff, sc) | tc_f8_bf16(q >> 8, sc) << 16;
                } else {
                    b[h] = *(const uint32_t *)(wl + 2 * kk);
                }
                /* a[2h]: row g, a[2h + 1]: row g + 8, at k and k + 8 (rows
                 * past m zero, never read from the slot) */
                #pragma unroll
                for (uint32_t mi = 0; mi < MT; mi++) {
                    const uint32_t r0 = mi * 16 + g, r1 = r0 + 8;
                    a[mi][2 * h] = r0 < m ? *(const uint32_t *)(xs + r0 * GR_XROW + 2 * kk) : 0u;
                    a[mi][2 * h + 1] =
                        r1 < m ? *(const uint32_t *)(xs + r1 * GR_XROW + 2 * kk) : 0u;
                }
            }
            #pragma unroll
            for (uint32_t mi = 0; mi < MT; mi++)
                hpd_mma_bf16_16816(acc[mi], a[mi], b);
        }
    }
    hpd_cp_async_wait<0>(); /* no copy outlives the block */
    gv_store(acc, y, ldy, m, n, n0, g, t, accumulate);
}

/* A launch of gemv_ring_kernel: one tile of x up to 16 rows, the deep ring
 * up to GR_DEEP; shared memory as the variant and m need */
template <bool FP8, uint32_t MT, uint32_t RING>
static void gr_variant(cudaStream_t s, dim3 grid, const uint16_t *x16, const hpd_gemm_args_t *a,
                       uint32_t rows, wscale_t ws, const group_t &g)
{
    const size_t smem = GR_WARPS * gr_shape<FP8, MT, RING>::warp(rows);
    gemv_ring_kernel<FP8, MT, RING><<<grid, GR_WARPS * 32, smem, s>>>(
        x16, a->w, ws, a->y, a->ldy, a->m, a->n, a->k, a->accumulate, g);
}

/* rows: the most a block's matrix has; deep: the deeper ring where it
 * takes them */
template <bool FP8>
static void gr_launch(cudaStream_t s, dim3 grid, const uint16_t *x16, const hpd_gemm_args_t *a,
                      uint32_t rows, wscale_t ws, const group_t &g, bool deep)
{
    if (rows <= GR_DEEP && deep)
        gr_variant<FP8, 1, GR_RING_DEEP>(s, grid, x16, a, rows, ws, g);
    else if (rows <= GR_DEEP)
        gr_variant<FP8, 1, GR_RING>(s, grid, x16, a, rows, ws, g);
    else if (rows <= 16)
        gr_variant<FP8, 1, GR_RING / 2>(s, grid, x16, a, rows, ws, g);
    else
        gr_variant<FP8, 2, GR_RING / 2>(s, grid, x16, a, rows, ws, g);
}

/* A ring kernel's shared memory opted in (the largest m it takes); an
 * error it leaves is cleared */
template <typename K> static bool gr_optin(K kernel, size_t smem, size_t optin)
{
    if (smem <= 48 * 1024)
        return true;
    if (smem <= optin && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)smem) == cudaSuccess)
        return true;
    cudaGetLastError();
    return false;
}

/* both dtypes of a variant, at the most rows it takes */
template <uint32_t MT, uint32_t RING> static bool gr_optin_variant(size_t optin, uint32_t max_m)
{
    return gr_optin(gemv_ring_kernel<true, MT, RING>,
                    GR_WARPS * gr_shape<true, MT, RING>::warp(max_m), optin) &&
           gr_optin(gemv_ring_kernel<false, MT, RING>,
                    GR_WARPS * gr_shape<false, MT, RING>::warp(max_m), optin);
}

bool hpd_cuda_ring_init(const hpd_cuda_ctx_t *c)
{
    return c->cc_major >= 8 && gr_optin_variant<1, GR_RING>(c->smem_optin, GR_DEEP) &&
           gr_optin_variant<1, GR_RING / 2>(c->smem_optin, 16) &&
           gr_optin_variant<2, GR_RING / 2>(c->smem_optin, TC_MIN_ROWS);
}

bool hpd_cuda_ring_deep_init(const hpd_cuda_ctx_t *c)
{
    return c->cc_major >= 8 && gr_optin_variant<1, GR_RING_DEEP>(c->smem_optin, GR_DEEP);
}

/* Whether gemv_ring_kernel takes these weights (else gemv_tc_kernel) */
static bool gr_args(const hpd_gemm_args_t *a, bool fp8)
{
    return !fp8 || (a->k % 16 == 0 && (a->k + a->w_block - 1) / a->w_block <= GR_SCALES);
}


/* A tiled kernel's dynamic shared memory opted in */
template <typename K> static bool tc_optin(K kernel, size_t smem)
{
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem) == cudaSuccess;
}

bool hpd_cuda_tc_init(const hpd_cuda_ctx_t *c)
{
    cudaFuncAttributes fa;
    return c->cc_major >= 8 && c->smem_optin >= TC_NARROW::SMEM &&
           cudaFuncGetAttributes(&fa, gemm_tc_kernel<false, TC_NARROW>) == cudaSuccess &&
           fa.ptxVersion >= 80 && fa.binaryVersion >= 80 &&
           /* the tiled kernels' shared memory, once per device */
           tc_optin(gemm_tc_kernel<false, TC_NARROW>, TC_NARROW::SMEM) &&
           tc_optin(gemm_tc_kernel<true, TC_NARROW>, TC_NARROW::SMEM);
}

bool hpd_cuda_tc_wide_init(const hpd_cuda_ctx_t *c)
{
    if (c->smem_optin < TC_WIDE::SMEM)
        return false;
    if (tc_optin(gemm_tc_kernel<false, TC_WIDE>, TC_WIDE::SMEM) &&
        tc_optin(gemm_tc_kernel<true, TC_WIDE>, TC_WIDE::SMEM))
        return true;
    cudaGetLastError(); /* refused: the narrow blocks take every tiled GEMM */
    return false;
}

/* The tiled GEMM's blocks: TC_WIDE where the GEMM has at least a block per
 * SM of them (row_tiles of TC_BM rows), else TC_NARROW (more, smaller
 * blocks); HPD_CUDA_GEMM_BN forces either. The same bits either way. */
static bool tc_wide(const hpd_cuda_ctx_t *c, uint32_t n, uint32_t row_tiles)
{
    if (!c->wide_ok || c->gemm_bn == 128)
        return false;
    return c->gemm_bn == 256 ||
           (uint64_t)row_tiles * ((n + TC_WIDE::BN - 1) / TC_WIDE::BN) >= c->n_sms;
}

/* A launch of the tiled kernel with blocks TT */
template <typename TT>
static void tc_tiled(cudaStream_t s, bool fp8, const uint16_t *x16, const hpd_gemm_args_t *a,
                     wscale_t ws, const rows_t &rw)
{
    const dim3 grid((a->n + TT::BN - 1) / TT::BN, rw.gy);
    if (fp8)
        gemm_tc_kernel<true, TT><<<grid, TC_THREADS, TT::SMEM, s>>>(
            x16, a->w, ws, a->y, a->ldy, a->m, a->n, a->k, a->accumulate, rw.g);
    else
        gemm_tc_kernel<false, TT><<<grid, TC_THREADS, TT::SMEM, s>>>(
            x16, a->w, ws, a->y, a->ldy, a->m, a->n, a->k, a->accumulate, rw.g);
}

/* Whether the tensor-core kernels take these arguments: BF16 weights, or
 * FP8 ones whose scale blocks are multiples of 8 (fp8 = true), k a multiple
 * of 8, weight rows 16-byte aligned (x is read through its bf16 copy,
 * aligned whatever x is). They depend on the weights alone, never on the
 * batch. */
static bool tc_args(const hpd_gemm_args_t *a, bool fp8)
{
    const bool dtype = a->w_dtype == HPD_DTYPE_BF16 ||
                       (fp8 && a->w_dtype == HPD_DTYPE_F8_E4M3 && a->w_scale != NULL &&
                        a->w_block > 0 && a->w_block % 8 == 0);
    return dtype && a->k % 8 == 0 && (uintptr_t)a->w % 16 == 0 && a->m <= 65535u * TC_BM;
}

/* The rows a tensor-core block takes: the tiled kernel's TC_BM, or with
 * `gemv` for at most TC_MIN_ROWS rows all of a matrix's (the decode
 * kernels walk every row of x) */
static uint32_t tc_tile_rows(uint32_t rows, bool gemv)
{
    return gemv && rows <= TC_MIN_ROWS ? rows : TC_BM;
}

/* x rounded into the work buffer, then the tiled kernel, or for at most
 * TC_MIN_ROWS rows the GEMV when `gemv` (the same bits per output). ga: a
 * grouped GEMM (a's rows in groups, `rows` the most a group has; the
 * plan's tiles in front of the bf16 copy of x), else NULL (rows = m). */
static hpd_status_t gemm_tc(hpd_backend_t *b, const hpd_gemm_args_t *a, bool gemv,
                            const hpd_gemm_grouped_args_t *ga = nullptr)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    void *work;
    hpd_status_t st;
    if (a->m == 0 || a->n == 0)
        return HPD_OK;
    if (!tc_args(a, true))
        return HPD_ERR_INVALID_ARG;
    const bool fp8 = a->w_dtype == HPD_DTYPE_F8_E4M3;
    const wscale_t ws = {a->w_scale, a->w_scale_ld, a->w_block};
    if (a->k == 0) { /* no tile: y = 0, or unchanged */
        if (!a->accumulate)
            for (uint32_t r = 0; r < a->m; r++)
                HPD_CUDA_CHECK(cudaMemsetAsync(a->y + (size_t)r * a->ldy, 0,
                                               a->n * sizeof(float), c->stream));
        return HPD_OK;
    }
    const uint32_t rows = ga != nullptr ? grouped_rows(ga, TC_MIN_ROWS) : a->m;
    const uint32_t T = tc_tile_rows(rows, gemv);
    const size_t front = ga != nullptr ? plan_bytes(ga, T) : 0;
    if ((st = hpd_cuda_work(b, front + (size_t)a->m * a->k * 2, &work)) != HPD_OK)
        return st;
    rows_t rw = one_matrix(a->m, T);
    if (ga != nullptr && (st = plan(b, ga, T, (uint4 *)work, &rw)) != HPD_OK)
        return st;
    void *xb = (char *)work + front;
    const uint64_t quads = (uint64_t)a->m * (a->k / 4);
    const uint32_t blocks = (uint32_t)HPD_MIN((quads + 255) / 256, (uint64_t)4096);
    tc_round_x_kernel<<<blocks, 256, 0, c->stream>>>(a->x, a->ldx, (uint32_t *)xb, a->m, a->k);
    HPD_CUDA_LAUNCHED();
    const uint16_t *x16 = (const uint16_t *)xb;
    if (gemv && rows <= TC_MIN_ROWS && c->gr_ok && gr_args(a, fp8)) {
        /* (shared memory opted in at hpd_cuda_ring_init, _deep_init) */
        const dim3 grid(((a->n + 7) / 8 + GR_WARPS - 1) / GR_WARPS, rw.gy);
        const bool deep = c->gr_deep_ok && (uint64_t)grid.x * grid.y <= c->n_sms;
        if (fp8)
            gr_launch<true>(c->stream, grid, x16, a, rows, ws, rw.g, deep);
        else
            gr_launch<false>(c->stream, grid, x16, a, rows, ws, rw.g, deep);
        HPD_CUDA_LAUNCHED();
        return HPD_OK;
    }
    if (gemv && rows <= TC_MIN_ROWS) {
        const dim3 grid(((a->n + 7) / 8 + GV_WARPS - 1) / GV_WARPS, rw.gy);
        if (fp8 && rows <= 16)
            gemv_tc_kernel<true, 1><<<grid, GV_WARPS * 32, 0, c->stream>>>(
                x16, a->w, ws, a->y, a->ldy, a->m, a->n, a->k, a->accumulate, rw.g);
        else if (fp8)
            gemv_tc_kernel<true, 2><<<grid, GV_WARPS * 32, 0, c->stream>>>(
                x16, a->w, ws, a->y, a->ldy, a->m, a->n, a->k, a->accumulate, rw.g);
        else if (rows <= 16)
            gemv_tc_kernel<false, 1><<<grid, GV_WARPS * 32, 0, c->stream>>>(
                x16, a->w, ws, a->y, a->ldy, a->m, a->n, a->k, a->accumulate, rw.g);
        else
            gemv_tc_kernel<false, 2><<<grid, GV_WARPS * 32, 0, c->stream>>>(
                x16, a->w, ws, a->y, a->ldy, a->m, a->n, a->k, a->accumulate, rw.g);
        HPD_CUDA_LAUNCHED();
        return HPD_OK;
    }
    /* (their shared memory was opted in at the backend's creation:
     * hpd_cuda_tc_init, hpd_cuda_tc_wide_init) */
    if (tc_wide(c, a->n, rw.gy))
        tc_tiled<TC_WIDE>(c->stream, fp8, x16, a, ws, rw);
    else
        tc_tiled<TC_NARROW>(c->stream, fp8, x16, a, ws, rw);
    HPD_CUDA_LAUNCHED();
    return HPD_OK;
}

hpd_status_t hpd_cuda_gemm_tc(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    if (!tc_args(a, false)) /* cuda-fast: BF16 weights only */
        return HPD_ERR_INVALID_ARG;
    return gemm_tc(b, a, false);
}

/* The device cuda-bf16: BF16 and FP8 weights (dequantised to bf16) on
 * tensor cores for every m (the same sequence per output, above), other
 * weights the deterministic kernels of fp32 products; the choice depends on
 * the weights alone. */
hpd_status_t hpd_cuda_gemm_bf16(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    if (tc_args(a, true))
        return gemm_tc(b, a, true);
    return hpd_cuda_gemm(b, a);
}

/* cuda-bf16's grouped GEMM: the same choice by the weights */
hpd_status_t hpd_cuda_gemm_grouped_bf16(hpd_backend_t *b, const hpd_gemm_grouped_args_t *ga)
{
    hpd_status_t st;
    if (ga->g.m == 0 || ga->g.n == 0)
        return HPD_OK;
    if ((st = grouped_args(ga)) != HPD_OK)
        return st;
    if (tc_args(&ga->g, true))
        return gemm_tc(b, &ga->g, true, ga);
    return hpd_cuda_gemm_grouped(b, ga);
}

/* The fast mode (device cuda-fast): cuBLAS SGEMM in fp32 (default math: no TF32).
 * Its kernels and split-K choices depend on m, so a row's bits depend on
 * the batch: not the deterministic contract of DESIGN.md section 4. Row-major
 * y = x w^T is column-major y^T = w^T-as-stored times x^T-as-stored. */
hpd_status_t hpd_cuda_gemm_cublas(hpd_backend_t *b, const hpd_gemm_args_t *a)
{
    hpd_cuda_ctx_t *c = hpd_cuda_ctx(b);
    const float alpha = 1.0f, beta = a->accumulate ? 1.0f : 0.0f;
    if (a->m == 0 || a->n == 0)
        return HPD_OK;
    /* BF16 weights past TC_MIN_ROWS rows: tensor cores (decode's few rows
     * keep the GEMV, which reads the weights at the copy bandwidth: the
     * tensor-core blocks are too few for that at small m) */
    if (c->tc_ok && a->m > TC_MIN_ROWS && tc_args(a, false))
        return hpd_cuda_gemm_tc(b, a);
    if (a->w_dtype != HPD_DTYPE_F32) /* cuBLAS has no fp32 x bf16 product: the kernel above */
        return hpd_cuda_gemm(b, a);
    const cublasStatus_t cs = cublasSgemm(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->n,
                                          (int)a->m, (int)a->k, &alpha, (const float *)a->w,
                                          (int)a->k, a->x,
                                          (int)a->ldx, &beta, a->y, (int)a->ldy);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        HPD_LOG_ERROR("cuda", "cublasSgemm %ux%ux%u failed: status %d", a->m, a->n, a->k,
                      (int)cs);
        return HPD_ERR_INTERNAL;
    }
    return HPD_OK;
}
