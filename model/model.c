#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"
#include "model/safetensors.h"
#include "model/shard.h"
#include "kernels/tp_sum.h"

#define LOG_COMPONENT "model"

uint32_t hpd_model_gdn_in_rows(const hpd_model_config_t *c)
{
    return c->conv_dim + c->lin_n_v_heads * c->lin_v_dim + 2 * c->lin_n_v_heads;
}

uint32_t hpd_model_moe_in_rows(const hpd_model_config_t *c)
{
    return c->n_experts + (c->shared_inter > 0 ? 1 + 2 * c->shared_inter : 0);
}

uint32_t hpd_model_attn_qkv_rows(const hpd_model_config_t *c)
{
    return c->n_heads * 2 * c->head_dim + 2 * c->n_kv_heads * c->head_dim;
}

typedef struct {
    const hpd_st_archive_t *ar;
    const hpd_model_config_t *config; /* the checkpoint's: the tensors' shapes */
    const hpd_shard_t *shard;         /* the part this model holds */
    const char *dir;
    const char *prefix; /* "model." or "model.language_model." */
    char name[256];
} loader_t;

static const char *tensor_name(loader_t *ld, const char *fmt, ...)
{
    va_list ap;
    size_t n = (size_t)snprintf(ld->name, sizeof(ld->name), "%s", ld->prefix);

    va_start(ap, fmt);
    vsnprintf(ld->name + n, sizeof(ld->name) - n, fmt, ap);
    va_end(ap);
    return ld->name;
}

static void shape_str(const uint64_t *shape, uint32_t ndim, char *out, size_t len)
{
    size_t n = (size_t)snprintf(out, len, "[");
    for (uint32_t d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(out + n, len - n, "%s%llu", d ? ", " : "",
                              (unsigned long long)shape[d]);
    if (n < len)
        snprintf(out + n, len - n, "]");
}

/* Finds `name`, checks its shape against (d0, d1[, d2]) (ndim from the number
 * of non-zero dims) and returns it. */
static hpd_status_t find_checked(loader_t *ld, const char *name, uint32_t ndim,
                                 const uint64_t *dims, const hpd_st_tensor_t **t_p)
{
    const hpd_st_tensor_t *t = hpd_st_archive_find(ld->ar, name);
    char want[96], got[96];
    bool ok;

    if (t == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: missing tensor '%s'", ld->dir, name);
        return HPD_ERR_NOT_FOUND;
    }
    const char *file = hpd_st_archive_path(ld->ar, t->file);
    if (!t->dtype_known) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: tensor '%s' has dtype %s (expected F32, F16, BF16 or F8_E4M3)", file,
                      name, t->dtype_name);
        return HPD_ERR_FORMAT;
    }
    ok = t->ndim == ndim;
    for (uint32_t d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == dims[d];
    if (!ok) {
        shape_str(dims, ndim, want, sizeof(want));
        shape_str(t->shape, t->ndim, got, sizeof(got));
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' has shape %s, expected %s", file, name, got,
                      want);
        return HPD_ERR_FORMAT;
    }
    *t_p = t;
    return HPD_OK;
}

/* Converts a whole tensor of the expected shape into dst (vectors: never
 * FP8). */
static hpd_status_t load_into(loader_t *ld, const char *name, uint32_t ndim, uint64_t d0,
                              uint64_t d1, uint64_t d2, float *dst)
{
    const uint64_t dims[3] = {d0, d1, d2};
    const hpd_st_tensor_t *t;
    hpd_status_t st = find_checked(ld, name, ndim, dims, &t);

    if (st == HPD_OK && t->dtype == HPD_DTYPE_F8_E4M3) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' is F8_E4M3 (expected F32, F16 or BF16: "
                      "only linear weights are quantised)", ld->dir, name);
        return HPD_ERR_FORMAT;
    }
    if (st == HPD_OK)
        hpd_dtype_to_f32(t->dtype, t->data, dst, t->n_elements);
    return st;
}

static float *alloc_f32(hpd_model_t *m, size_t n)
{
    m->n_params += n;
    m->weight_bytes += n * sizeof(float);
    return malloc(n * sizeof(float));
}

/* ---- weight matrices, kept in the checkpoint's dtype */

/* A checkpoint tensor holding matrices of `rows` rows (a 3-D tensor holds
 * shape[0] of them), with its weight_scale_inv grid when it is FP8. */
typedef struct {
    const hpd_st_tensor_t *t, *scale;
    uint64_t rows, cols;
} src_t;

/* find_checked, then for an F8_E4M3 tensor its NAME_scale_inv grid of
 * [matrices][ceil(rows / block rows)][ceil(cols / block cols)] (F32, BF16
 * or F16), the block from quantization_config. */
static hpd_status_t find_src(loader_t *ld, const char *name, uint32_t ndim, const uint64_t *dims,
                             src_t *s)
{
    const hpd_model_config_t *c = ld->config;
    hpd_status_t st;
    *s = (src_t){.rows = dims[ndim - 2], .cols = dims[ndim - 1]};
    if ((st = find_checked(ld, name, ndim, dims, &s->t)) != HPD_OK ||
        s->t->dtype != HPD_DTYPE_F8_E4M3)
        return st;
    if (c->fp8_block_rows == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' is F8_E4M3 but config.json has no "
                      "quantization_config (quant_method fp8, weight_block_size)", ld->dir, name);
        return HPD_ERR_FORMAT;
    }
    char sname[300];
    uint64_t sdims[3] = {dims[0], 0, 0};
    snprintf(sname, sizeof(sname), "%s_scale_inv", name);
    sdims[ndim - 2] = (s->rows + c->fp8_block_rows - 1) / c->fp8_block_rows;
    sdims[ndim - 1] = (s->cols + c->fp8_block_cols - 1) / c->fp8_block_cols;
    if ((st = find_checked(ld, sname, ndim, sdims, &s->scale)) != HPD_OK)
        return st;
    if (s->scale->dtype == HPD_DTYPE_F8_E4M3) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' is F8_E4M3 (expected F32, BF16 or F16 "
                      "scales)", ld->dir, sname);
        return HPD_ERR_FORMAT;
    }
    return HPD_OK;
}

/* The dtype of a matrix fused from the tensors ss: theirs when they agree,
 * else F32 (every one widens to it exactly, FP8 with its scale). */
static hpd_dtype_t fused_dtype(const src_t *ss, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++)
        if (ss[i].t->dtype != ss[0].t->dtype)
            return HPD_DTYPE_F32;
    return ss[0].t->dtype;
}

static hpd_status_t mat_alloc(loader_t *ld, hpd_model_t *m, hpd_weight_t *w, hpd_dtype_t dtype,
                              uint64_t rows, uint64_t cols)
{
    *w = (hpd_weight_t){.dtype = dtype};
    m->n_params += rows * cols;
    m->weight_bytes += rows * cols * hpd_dtype_size(dtype);
    if ((w->p = malloc(rows * cols * hpd_dtype_size(dtype))) == NULL)
        return HPD_ERR_NO_MEMORY;
    if (dtype == HPD_DTYPE_F8_E4M3) {
        w->block = ld->config->fp8_block_cols;
        w->scale_ld = (uint32_t)((cols + w->block - 1) / w->block);
        m->weight_bytes += rows * w->scale_ld * sizeof(float);
        if ((w->scale = malloc(rows * w->scale_ld * sizeof(float))) == NULL)
            return HPD_ERR_NO_MEMORY;
    }
    return HPD_OK;
}

/* The scale of row r (counted over all the tensor's matrices) and column
 * block cb of an FP8 source, in fp32. */
static float src_scale(const loader_t *ld, const src_t *s, uint64_t r, uint64_t cb)
{
    const uint64_t br = ld->config->fp8_block_rows, bc = ld->config->fp8_block_cols;
    const uint64_t grid_rows = (s->rows + br - 1) / br, grid_cols = (s->cols + bc - 1) / bc;
    const uint64_t i = ((r / s->rows) * grid_rows + (r % s->rows) / br) * grid_cols + cb;
    float v;
    hpd_dtype_to_f32(s->scale->dtype,
                     (const char *)s->scale->data + i * hpd_dtype_size(s->scale->dtype), &v, 1);
    return v;
}

/* Rows [src_row, src_row + n) of s into rows [dst_row, ...) of w: copied as
 * they are (an FP8 row with its scales), or widened to w's F32 (an FP8 one
 * dequantised: q * scale in fp32). */
static void mat_rows(const loader_t *ld, hpd_weight_t *w, uint64_t dst_row, const src_t *s,
                     uint64_t src_row, uint64_t n)
{
    const uint64_t cols = s->cols;
    const size_t es = hpd_dtype_size(w->dtype), ts = hpd_dtype_size(s->t->dtype);
    char *dst = (char *)w->p + dst_row * cols * es;
    const char *src = (const char *)s->t->data + src_row * cols * ts;
    if (s->t->dtype == w->dtype) {
        /* in pieces, each piece's file pages let go once copied (a large
         * embedding is not resident twice) */
        const size_t total = n * cols * es, piece = 4u << 20;
        for (size_t off = 0; off < total; off += piece) {
            const size_t len = total - off < piece ? total - off : piece;
            memcpy(dst + off, src + off, len);
            hpd_st_release_bytes(src + off, len);
        }
        for (uint64_t r = 0; w->scale != NULL && r < n; r++)
            for (uint64_t cb = 0; cb < w->scale_ld; cb++)
                w->scale[(dst_row + r) * w->scale_ld + cb] = src_scale(ld, s, src_row + r, cb);
        return;
    }
    hpd_dtype_to_f32(s->t->dtype, src, (float *)dst, n * cols);
    if (s->t->dtype == HPD_DTYPE_F8_E4M3)
        for (uint64_t r = 0; r < n; r++)
            for (uint64_t c = 0; c < cols; c++) {
                float *v = (float *)dst + r * cols + c;
                *v = *v * src_scale(ld, s, src_row + r, c / ld->config->fp8_block_cols);
            }
}

/* ---- row-parallel matrices, stored group by group (model.h) */

static uint32_t gcd(uint32_t a, uint32_t b)
{
    while (b != 0) {
        const uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The FP8 scales of a group's columns [c0, c1): a group inside one block
 * takes its one scale; else blocks of *sub_p columns, the largest that
 * divides both the block and where the group starts in it, so that each
 * sub-block lies in one block of the checkpoint (the group's column c has
 * scale c / *sub_p). The count; 0 for an empty group. */
static uint32_t group_scales(uint32_t c0, uint32_t c1, uint32_t block, uint32_t *sub_p)
{
    *sub_p = block;
    if (c1 <= c0)
        return 0;
    if (c0 / block == (c1 - 1) / block)
        return 1;
    *sub_p = gcd(block, c0 % block);
    return (c1 - c0 + *sub_p - 1) / *sub_p;
}

/* Whether every group of the rank starts on a block edge or lies in one
 * block: then the rank keeps the checkpoint's blocks of its columns,
 * [rows][blocks], shared by the groups (no scale stored twice); else
 * each group has its own (group_scales). */
static bool blocks_shared(uint32_t k_full, uint32_t block, const hpd_shard_t *s)
{
    const hpd_range_t mine = hpd_tp_rank_groups(s->tp, s->rank, s->sum_groups);
    for (uint32_t g = mine.begin; g < mine.end; g++) {
        const hpd_range_t r = hpd_tp_group(k_full, g, s->sum_groups);
        if (r.end > r.begin && r.begin % block != 0 && r.begin / block != (r.end - 1) / block)
            return false;
    }
    return true;
}

/* the rank's columns [begin, end) of k_full */
static hpd_range_t rank_cols(uint32_t k_full, const hpd_shard_t *s)
{
    const hpd_range_t mine = hpd_tp_rank_groups(s->tp, s->rank, s->sum_groups);
    return (hpd_range_t){.begin = hpd_tp_group(k_full, mine.begin, s->sum_groups).begin,
                         .end = hpd_tp_group(k_full, mine.end - 1, s->sum_groups).end};
}

hpd_weight_t hpd_model_group(const hpd_weight_t *w, uint64_t rows, uint32_t k_full,
                             const hpd_shard_t *s, uint32_t g, uint32_t *col_p, uint32_t *k_p)
{
    const hpd_range_t mine = hpd_tp_rank_groups(s->tp, s->rank, s->sum_groups);
    const size_t es = hpd_dtype_size(w->dtype);
    uint64_t col = 0, scale_col = 0;
    if (w->scale != NULL && blocks_shared(k_full, w->block, s)) {
        const hpd_range_t r = hpd_tp_group(k_full, g, s->sum_groups), cols = rank_cols(k_full, s);
        col = r.begin - cols.begin;
        *col_p = (uint32_t)col;
        *k_p = r.end - r.begin;
        return (hpd_weight_t){.p = (char *)w->p + rows * col * es,
                              .dtype = w->dtype,
                              .scale = w->scale + (r.begin / w->block - cols.begin / w->block),
                              .scale_ld = w->scale_ld,
                              .block = w->block};
    }
    uint32_t sub;
    for (uint32_t j = mine.begin; j < g; j++) {
        const hpd_range_t r = hpd_tp_group(k_full, j, s->sum_groups);
        col += r.end - r.begin;
        if (w->scale != NULL)
            scale_col += group_scales(r.begin, r.end, w->block, &sub);
    }
    const hpd_range_t r = hpd_tp_group(k_full, g, s->sum_groups);
    hpd_weight_t v = {.p = (char *)w->p + rows * col * es, .dtype = w->dtype, .block = w->block};
    if (w->scale != NULL) {
        v.scale = w->scale + rows * scale_col;
        v.scale_ld = group_scales(r.begin, r.end, w->block, &v.block);
    }
    *col_p = (uint32_t)col;
    *k_p = r.end - r.begin;
    return v;
}

/* A row-parallel matrix of `rows` rows over this rank's groups of k_full
 * columns, in dtype; FP8 scales per group (group_scales). */
static hpd_status_t rowpar_alloc(loader_t *ld, hpd_model_t *m, hpd_weight_t *w, hpd_dtype_t dtype,
                                 uint64_t rows, uint32_t k_full)
{
    const hpd_range_t mine = hpd_tp_rank_groups(ld->shard->tp, ld->shard->rank, ld->shard->sum_groups);
    const hpd_range_t rc = rank_cols(k_full, ld->shard);
    hpd_status_t st;
    if ((st = mat_alloc(ld, m, w, dtype, rows, rc.end - rc.begin)) != HPD_OK || w->scale == NULL)
        return st;
    m->weight_bytes -= rows * w->scale_ld * sizeof(float);
    free(w->scale);
    w->scale = NULL;
    w->scale_ld = 0;
    if (blocks_shared(k_full, w->block, ld->shard)) {
        /* the blocks the rank's columns touch (its first may start inside one) */
        w->scale_ld = rc.end > rc.begin ? (rc.end - 1) / w->block - rc.begin / w->block + 1 : 0;
    } else {
        for (uint32_t g = mine.begin; g < mine.end; g++) { /* every group's scales of a row */
            const hpd_range_t r = hpd_tp_group(k_full, g, ld->shard->sum_groups);
            uint32_t sub;
            w->scale_ld += group_scales(r.begin, r.end, w->block, &sub);
        }
    }
    m->weight_bytes += rows * w->scale_ld * sizeof(float);
    if ((w->scale = malloc(rows * w->scale_ld * sizeof(float) + 1)) == NULL)
        return HPD_ERR_NO_MEMORY;
    return HPD_OK;
}

/* Rows [src_row, src_row + n) of s, columns of this rank's groups, into
 * rows [dst_row, ...) of the row-parallel matrix w (rowpar_alloc): copied
 * as they are (an FP8 row with its scales) or widened to w's F32. */
static void rowpar_rows(const loader_t *ld, hpd_weight_t *w, uint64_t rows, uint32_t k_full,
                        uint64_t dst_row, const src_t *s, uint64_t src_row, uint64_t n)
{
    const hpd_range_t mine = hpd_tp_rank_groups(ld->shard->tp, ld->shard->rank, ld->shard->sum_groups);
    const size_t es = hpd_dtype_size(w->dtype), ts = hpd_dtype_size(s->t->dtype);
    const uint32_t B = ld->config->fp8_block_cols;
    const bool shared = w->scale != NULL && blocks_shared(k_full, w->block, ld->shard);
    if (shared) { /* the rank's blocks, once */
        const uint32_t b0 = rank_cols(k_full, ld->shard).begin / B;
        for (uint64_t r = 0; r < n; r++)
            for (uint32_t cb = 0; cb < w->scale_ld; cb++)
                w->scale[(dst_row + r) * w->scale_ld + cb] = src_scale(ld, s, src_row + r, b0 + cb);
    }
    for (uint32_t g = mine.begin; g < mine.end; g++) {
        uint32_t col, k;
        const hpd_weight_t v = hpd_model_group(w, rows, k_full, ld->shard, g,
                                               &col, &k);
        const uint32_t c0 = hpd_tp_group(k_full, g, ld->shard->sum_groups).begin;
        for (uint64_t r = 0; r < n && k > 0; r++) {
            char *dst = (char *)v.p + (dst_row + r) * k * es;
            const char *src = (const char *)s->t->data + ((src_row + r) * s->cols + c0) * ts;
            if (s->t->dtype == w->dtype) {
                memcpy(dst, src, (size_t)k * es);
                for (uint32_t cb = 0; v.scale != NULL && !shared && cb < v.scale_ld; cb++)
                    v.scale[(dst_row + r) * v.scale_ld + cb] =
                        src_scale(ld, s, src_row + r, (c0 + cb * v.block) / B);
                continue;
            }
            hpd_dtype_to_f32(s->t->dtype, src, (float *)dst, k);
            if (s->t->dtype == HPD_DTYPE_F8_E4M3)
                for (uint32_t c = 0; c < k; c++)
                    ((float *)dst)[c] *= src_scale(ld, s, src_row + r, (c0 + c) / B);
        }
    }
}

/* One tensor [rows][k_full] as a row-parallel matrix. */
static hpd_status_t load_rowpar(loader_t *ld, hpd_model_t *m, hpd_weight_t *w, const char *name,
                                uint64_t rows, uint32_t k_full)
{
    const uint64_t dims[2] = {rows, k_full};
    src_t s;
    hpd_status_t st;

    if ((st = find_src(ld, name, 2, dims, &s)) != HPD_OK ||
        (st = rowpar_alloc(ld, m, w, s.t->dtype, rows, k_full)) != HPD_OK)
        return st;
    rowpar_rows(ld, w, rows, k_full, 0, &s, 0, rows);
    return HPD_OK;
}

/* The parts of a fused matrix: consecutive sources (of rows[i] rows, cols
 * wide) of one dtype share a part. */
static hpd_status_t fused_alloc(loader_t *ld, hpd_model_t *m, hpd_fused_t *f, const src_t *ss,
                                const uint64_t *rows, uint32_t n, uint64_t cols)
{
    hpd_status_t st;
    *f = (hpd_fused_t){0};
    for (uint32_t i = 0; i < n; i++) {
        if (f->n == 0 || ss[i].t->dtype != f->part[f->n - 1].dtype) {
            if (f->n == HPD_MAX_PARTS)
                return HPD_ERR_INTERNAL;
            f->part[f->n++].dtype = ss[i].t->dtype;
        }
        f->rows[f->n - 1] += (uint32_t)rows[i];
    }
    for (uint32_t p = 0; p < f->n; p++)
        if ((st = mat_alloc(ld, m, &f->part[p], f->part[p].dtype, f->rows[p], cols)) != HPD_OK)
            return st;
    return HPD_OK;
}

/* mat_rows into a fused matrix: dst_row counts over all its parts (the n
 * rows stay within one part). */
static void fused_rows(const loader_t *ld, hpd_fused_t *f, uint64_t dst_row, const src_t *s,
                       uint64_t src_row, uint64_t n)
{
    uint32_t p = 0;
    while (dst_row >= f->rows[p]) {
        dst_row -= f->rows[p];
        p++;
    }
    mat_rows(ld, &f->part[p], dst_row, s, src_row, n);
}

#define MAX_SOURCES 4
#define MAX_SPANS 3

/* Rows of a tensor this rank takes: [begin, begin + n). */
typedef struct {
    uint64_t begin, n;
} span_t;

/* A source of a stacked matrix: tensor_name format fmt of `rows` rows, of
 * which the spans (in order) are taken; no span: all of them. */
typedef struct {
    const char *fmt;
    uint64_t rows;
    span_t span[MAX_SPANS];
    uint32_t n_spans;
} stack_src_t;

static uint64_t taken_rows(const stack_src_t *s)
{
    uint64_t n = s->n_spans == 0 ? s->rows : 0;
    for (uint32_t j = 0; j < s->n_spans; j++)
        n += s->span[j].n;
    return n;
}

/* A fused matrix of up to MAX_SOURCES tensors [rows][cols] of layer l,
 * the rows each source's spans take stacked in order. */
static hpd_status_t load_stacked(loader_t *ld, hpd_model_t *m, hpd_fused_t *f, uint64_t cols,
                                 uint32_t l, uint32_t n, const stack_src_t *srcs)
{
    src_t ss[MAX_SOURCES];
    uint64_t rows[MAX_SOURCES], total = 0;
    hpd_status_t st;

    for (uint32_t i = 0; i < n; i++) {
        const uint64_t dims[2] = {srcs[i].rows, cols};
        if ((st = find_src(ld, tensor_name(ld, srcs[i].fmt, l), 2, dims, &ss[i])) != HPD_OK)
            return st;
        rows[i] = taken_rows(&srcs[i]);
    }
    if ((st = fused_alloc(ld, m, f, ss, rows, n, cols)) != HPD_OK)
        return st;
    for (uint32_t i = 0; i < n; i++) {
        if (srcs[i].n_spans == 0)
            fused_rows(ld, f, total, &ss[i], 0, rows[i]);
        for (uint32_t j = 0; j < srcs[i].n_spans; j++) {
            fused_rows(ld, f, total, &ss[i], srcs[i].span[j].begin, srcs[i].span[j].n);
            total += srcs[i].span[j].n;
        }
        if (srcs[i].n_spans == 0)
            total += rows[i];
    }
    return HPD_OK;
}

/* Rows [begin, begin + n) of tensor `name` of rows x cols into a matrix. */
static hpd_status_t load_matrix_rows(loader_t *ld, hpd_model_t *m, hpd_weight_t *w,
                                     const char *name, uint64_t rows, uint64_t cols,
                                     uint64_t begin, uint64_t n)
{
    const uint64_t dims[2] = {rows, cols};
    src_t s;
    hpd_status_t st;

    if ((st = find_src(ld, name, 2, dims, &s)) != HPD_OK ||
        (st = mat_alloc(ld, m, w, s.t->dtype, n, cols)) != HPD_OK)
        return st;
    mat_rows(ld, w, 0, &s, begin, n);
    return HPD_OK;
}

/* The spans (rows of row_elems elements each) of a vector tensor of the
 * given shape, converted into dst one after another. */
static hpd_status_t load_spans(loader_t *ld, const char *name, uint32_t ndim, uint64_t d0,
                               uint64_t d1, uint64_t d2, uint64_t row_elems, const span_t *spans,
                               uint32_t n_spans, float *dst)
{
    const uint64_t dims[3] = {d0, d1, d2};
    const hpd_st_tensor_t *t;
    hpd_status_t st = find_checked(ld, name, ndim, dims, &t);

    if (st == HPD_OK && t->dtype == HPD_DTYPE_F8_E4M3) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tensor '%s' is F8_E4M3 (expected F32, F16 or BF16: "
                      "only linear weights are quantised)", ld->dir, name);
        return HPD_ERR_FORMAT;
    }
    const size_t ts = st == HPD_OK ? hpd_dtype_size(t->dtype) : 0;
    for (uint32_t j = 0; st == HPD_OK && j < n_spans; j++) {
        hpd_dtype_to_f32(t->dtype, (const char *)t->data + spans[j].begin * row_elems * ts, dst,
                         spans[j].n * row_elems);
        dst += spans[j].n * row_elems;
    }
    return st;
}

/* Qwen3-Next packs q, k, v and z per key head: group g holds
 * [q_g (dk) | k_g (dk) | v_g (r*dv) | z_g (r*dv)] and in_proj_ba holds
 * [b_g (r) | a_g (r)]. This unpacks both into the Qwen3.5 order q|k|v|z|b|a. */
static hpd_status_t load_gdn_next(loader_t *ld, hpd_model_t *m, uint32_t l, hpd_fused_t *w)
{
    const hpd_model_config_t *c = ld->config, *lc = &m->config;
    const uint64_t H = c->hidden_size, nk = c->lin_n_k_heads, dk = c->lin_k_dim;
    const uint64_t r = c->lin_n_v_heads / c->lin_n_k_heads, dv = c->lin_v_dim;
    const uint64_t nv = lc->lin_n_v_heads, group = 2 * dk + 2 * r * dv;
    const uint64_t lnk = lc->lin_n_k_heads, k0 = ld->shard->k_heads.begin;
    const uint64_t v_base = 2 * lnk * dk, z_base = lc->conv_dim;
    const uint64_t b_base = z_base + nv * dv, a_base = b_base + nv;
    const uint64_t qkvz_dims[2] = {nk * group, H}, ba_dims[2] = {nk * 2 * r, H};
    src_t ss[2];
    hpd_status_t st;

    if ((st = find_src(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_qkvz.weight", l), 2,
                       qkvz_dims, &ss[0])) != HPD_OK ||
        (st = find_src(ld, tensor_name(ld, "layers.%u.linear_attn.in_proj_ba.weight", l), 2,
                       ba_dims, &ss[1])) != HPD_OK ||
        (st = fused_alloc(ld, m, w, ss, (const uint64_t[]){b_base, 2 * nv}, 2, H)) != HPD_OK)
        return st; /* q|k|v|z from qkvz, then b|a from ba */
    for (uint64_t g = 0; g < lnk; g++) { /* this rank's key heads k0 + g */
        const uint64_t src = (k0 + g) * group;
        fused_rows(ld, w, g * dk, &ss[0], src, dk);
        fused_rows(ld, w, lnk * dk + g * dk, &ss[0], src + dk, dk);
        fused_rows(ld, w, v_base + g * r * dv, &ss[0], src + 2 * dk, r * dv);
        fused_rows(ld, w, z_base + g * r * dv, &ss[0], src + 2 * dk + r * dv, r * dv);
        fused_rows(ld, w, b_base + g * r, &ss[1], (k0 + g) * 2 * r, r);
        fused_rows(ld, w, a_base + g * r, &ss[1], (k0 + g) * 2 * r + r, r);
    }
    return HPD_OK;
}

/* The conv channels of this rank, per segment: its key heads' q and k
 * channels and its value heads' v channels (never one slice of q|k|v). */
static void conv_spans(const loader_t *ld, span_t span[3])
{
    const hpd_model_config_t *c = ld->config;
    const hpd_shard_t *s = ld->shard;
    const uint64_t nk = c->lin_n_k_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const uint64_t lk = s->k_heads.end - s->k_heads.begin, lv = s->v_heads.end - s->v_heads.begin;
    span[0] = (span_t){.begin = s->k_heads.begin * dk, .n = lk * dk};
    span[1] = (span_t){.begin = nk * dk + s->k_heads.begin * dk, .n = lk * dk};
    span[2] = (span_t){.begin = 2 * nk * dk + s->v_heads.begin * dv, .n = lv * dv};
}

static hpd_status_t load_gdn_35(loader_t *ld, hpd_model_t *m, uint32_t l, hpd_fused_t *w)
{
    const hpd_model_config_t *c = ld->config;
    const uint64_t nv = c->lin_n_v_heads, dv = c->lin_v_dim;
    const uint64_t v0 = ld->shard->v_heads.begin, lv = ld->shard->v_heads.end - v0;
    stack_src_t srcs[] = {
        {.fmt = "layers.%u.linear_attn.in_proj_qkv.weight", .rows = c->conv_dim, .n_spans = 3},
        {.fmt = "layers.%u.linear_attn.in_proj_z.weight", .rows = nv * dv,
         .span = {{.begin = v0 * dv, .n = lv * dv}}, .n_spans = 1},
        {.fmt = "layers.%u.linear_attn.in_proj_b.weight", .rows = nv,
         .span = {{.begin = v0, .n = lv}}, .n_spans = 1},
        {.fmt = "layers.%u.linear_attn.in_proj_a.weight", .rows = nv,
         .span = {{.begin = v0, .n = lv}}, .n_spans = 1}};
    conv_spans(ld, srcs[0].span);
    return load_stacked(ld, m, w, c->hidden_size, l, 4, srcs);
}

/* The experts of MoE layer l, in either naming: fused 3-D
 * mlp.experts.gate_up_proj [E][2*Im][H] and mlp.experts.down_proj [E][H][Im]
 * (transformers v5), or per expert mlp.experts.N.{gate,up,down}_proj.weight
 * (the released checkpoints). */
static hpd_status_t load_experts(loader_t *ld, hpd_model_t *m, uint32_t l, hpd_layer_weights_t *w)
{
    const hpd_model_config_t *c = ld->config;
    const uint64_t E = c->n_experts, H = c->hidden_size, I = c->moe_inter;
    const uint64_t i0 = ld->shard->expert.begin, Il = m->config.moe_inter;
    src_t gu, dn;
    hpd_status_t st;

    if (hpd_st_archive_find(ld->ar, tensor_name(ld, "layers.%u.mlp.experts.gate_up_proj", l)) !=
        NULL) {
        const uint64_t gu_dims[3] = {E, 2 * I, H}, dn_dims[3] = {E, H, I};
        if ((st = find_src(ld, tensor_name(ld, "layers.%u.mlp.experts.gate_up_proj", l), 3,
                           gu_dims, &gu)) != HPD_OK ||
            (st = find_src(ld, tensor_name(ld, "layers.%u.mlp.experts.down_proj", l), 3, dn_dims,
                           &dn)) != HPD_OK ||
            (st = mat_alloc(ld, m, &w->moe_gate_up, gu.t->dtype, E * 2 * Il, H)) != HPD_OK ||
            (st = rowpar_alloc(ld, m, &w->moe_down, dn.t->dtype, E * H, (uint32_t)I)) != HPD_OK)
            return st;
        for (uint64_t x = 0; x < E; x++) { /* this rank's gate rows, then its up rows */
            mat_rows(ld, &w->moe_gate_up, 2 * Il * x, &gu, 2 * I * x + i0, Il);
            mat_rows(ld, &w->moe_gate_up, 2 * Il * x + Il, &gu, 2 * I * x + I + i0, Il);
        }
        rowpar_rows(ld, &w->moe_down, E * H, (uint32_t)I, 0, &dn, 0, E * H);
        return HPD_OK;
    }
    src_t *ss = malloc(3 * E * sizeof(*ss));
    const uint64_t in_dims[2] = {I, H}, out_dims[2] = {H, I};
    if (ss == NULL)
        return HPD_ERR_NO_MEMORY;
    st = HPD_OK;
    for (uint64_t x = 0; x < E && st == HPD_OK; x++) {
        st = find_src(ld, tensor_name(ld, "layers.%u.mlp.experts.%u.gate_proj.weight", l,
                                      (uint32_t)x), 2, in_dims, &ss[2 * x]);
        if (st == HPD_OK)
            st = find_src(ld, tensor_name(ld, "layers.%u.mlp.experts.%u.up_proj.weight", l,
                                          (uint32_t)x), 2, in_dims, &ss[2 * x + 1]);
        if (st == HPD_OK)
            st = find_src(ld, tensor_name(ld, "layers.%u.mlp.experts.%u.down_proj.weight", l,
                                          (uint32_t)x), 2, out_dims, &ss[2 * E + x]);
    }
    if (st == HPD_OK &&
        (st = mat_alloc(ld, m, &w->moe_gate_up, fused_dtype(ss, 2 * (uint32_t)E), E * 2 * Il, H)) ==
            HPD_OK &&
        (st = rowpar_alloc(ld, m, &w->moe_down, fused_dtype(ss + 2 * E, (uint32_t)E), E * H,
                           (uint32_t)I)) == HPD_OK) {
        for (uint64_t x = 0; x < E; x++) {
            mat_rows(ld, &w->moe_gate_up, 2 * Il * x, &ss[2 * x], i0, Il);
            mat_rows(ld, &w->moe_gate_up, 2 * Il * x + Il, &ss[2 * x + 1], i0, Il);
            rowpar_rows(ld, &w->moe_down, E * H, (uint32_t)I, H * x, &ss[2 * E + x], 0, H);
        }
    }
    free(ss);
    return st;
}

/* A MoE layer's MLP: the router, the shared expert and its gate, the experts. */
static hpd_status_t load_moe(loader_t *ld, hpd_model_t *m, uint32_t l, hpd_layer_weights_t *w)
{
    const hpd_model_config_t *c = ld->config;
    const uint64_t H = c->hidden_size, Is = c->shared_inter;
    const uint64_t s0 = ld->shard->shared.begin, Sl = m->config.shared_inter;
    const stack_src_t in[] = {
        {.fmt = "layers.%u.mlp.gate.weight", .rows = c->n_experts},
        {.fmt = "layers.%u.mlp.shared_expert_gate.weight", .rows = 1},
        {.fmt = "layers.%u.mlp.shared_expert.gate_proj.weight", .rows = Is,
         .span = {{.begin = s0, .n = Sl}}, .n_spans = 1},
        {.fmt = "layers.%u.mlp.shared_expert.up_proj.weight", .rows = Is,
         .span = {{.begin = s0, .n = Sl}}, .n_spans = 1}};
    hpd_status_t st;

    if ((st = load_stacked(ld, m, &w->moe_in, H, l, Is > 0 ? 4 : 1, in)) != HPD_OK ||
        (Is > 0 &&
         (st = load_rowpar(ld, m, &w->shared_down,
                           tensor_name(ld, "layers.%u.mlp.shared_expert.down_proj.weight", l), H,
                           (uint32_t)Is)) != HPD_OK))
        return st;
    return load_experts(ld, m, l, w);
}

static hpd_status_t load_layer(loader_t *ld, hpd_model_t *m, uint32_t l)
{
    const hpd_model_config_t *c = ld->config, *lc = &m->config;
    const hpd_shard_t *sh = ld->shard;
    hpd_layer_weights_t *w = &m->layers[l];
    const uint64_t H = c->hidden_size, I = c->intermediate_size;
    const uint64_t i0 = sh->mlp.begin, Il = lc->intermediate_size;
    const stack_src_t mlp[] = {{.fmt = "layers.%u.mlp.gate_proj.weight", .rows = I,
                                .span = {{.begin = i0, .n = Il}}, .n_spans = 1},
                               {.fmt = "layers.%u.mlp.up_proj.weight", .rows = I,
                                .span = {{.begin = i0, .n = Il}}, .n_spans = 1}};
    hpd_status_t st;

    w->input_norm = alloc_f32(m, H);
    w->post_norm = alloc_f32(m, H);
    if (!w->input_norm || !w->post_norm)
        return HPD_ERR_NO_MEMORY;
    if ((st = load_into(ld, tensor_name(ld, "layers.%u.input_layernorm.weight", l), 1, H, 0, 0,
                        w->input_norm)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.post_attention_layernorm.weight", l), 1,
                        H, 0, 0, w->post_norm)) != HPD_OK ||
        (c->layer_moe[l] && (st = load_moe(ld, m, l, w)) != HPD_OK))
        return st;
    if (!c->layer_moe[l] &&
        ((st = load_stacked(ld, m, &w->mlp_gate_up, H, l, 2, mlp)) != HPD_OK ||
         (st = load_rowpar(ld, m, &w->mlp_down,
                           tensor_name(ld, "layers.%u.mlp.down_proj.weight", l), H,
                           (uint32_t)I)) != HPD_OK))
        return st;

    if (c->layer_full[l]) {
        const uint64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
        const uint64_t q0 = sh->q_heads.begin, kv0 = sh->kv_heads.begin;
        const uint64_t lq = lc->n_heads, lkv = lc->n_kv_heads;
        const stack_src_t qkv[] = {
            {.fmt = "layers.%u.self_attn.q_proj.weight", .rows = nh * 2 * hd,
             .span = {{.begin = q0 * 2 * hd, .n = lq * 2 * hd}}, .n_spans = 1},
            {.fmt = "layers.%u.self_attn.k_proj.weight", .rows = nkv * hd,
             .span = {{.begin = kv0 * hd, .n = lkv * hd}}, .n_spans = 1},
            {.fmt = "layers.%u.self_attn.v_proj.weight", .rows = nkv * hd,
             .span = {{.begin = kv0 * hd, .n = lkv * hd}}, .n_spans = 1}};
        w->q_norm = alloc_f32(m, hd);
        w->k_norm = alloc_f32(m, hd);
        if (!w->q_norm || !w->k_norm)
            return HPD_ERR_NO_MEMORY;
        if ((st = load_stacked(ld, m, &w->attn_qkv, H, l, 3, qkv)) != HPD_OK ||
            (st = load_rowpar(ld, m, &w->attn_o,
                              tensor_name(ld, "layers.%u.self_attn.o_proj.weight", l), H,
                              (uint32_t)(nh * hd))) != HPD_OK ||
            (st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.q_norm.weight", l), 1, hd, 0,
                            0, w->q_norm)) != HPD_OK ||
            (st = load_into(ld, tensor_name(ld, "layers.%u.self_attn.k_norm.weight", l), 1, hd, 0,
                            0, w->k_norm)) != HPD_OK)
            return st;
        return HPD_OK;
    }

    const uint64_t nv = c->lin_n_v_heads, dv = c->lin_v_dim, lv = lc->lin_n_v_heads;
    const span_t vspan = {.begin = sh->v_heads.begin, .n = lv};
    span_t cspan[3];
    conv_spans(ld, cspan);
    w->gdn_conv = alloc_f32(m, (uint64_t)lc->conv_dim * c->conv_kernel);
    w->gdn_a_log = alloc_f32(m, lv);
    w->gdn_dt_bias = alloc_f32(m, lv);
    w->gdn_norm = alloc_f32(m, dv);
    if (!w->gdn_conv || !w->gdn_a_log || !w->gdn_dt_bias || !w->gdn_norm)
        return HPD_ERR_NO_MEMORY;
    st = c->arch == HPD_ARCH_QWEN3_NEXT ? load_gdn_next(ld, m, l, &w->gdn_in)
                                        : load_gdn_35(ld, m, l, &w->gdn_in);
    if (st != HPD_OK)
        return st;
    if ((st = load_spans(ld, tensor_name(ld, "layers.%u.linear_attn.conv1d.weight", l), 3,
                         c->conv_dim, 1, c->conv_kernel, c->conv_kernel, cspan, 3,
                         w->gdn_conv)) != HPD_OK ||
        (st = load_spans(ld, tensor_name(ld, "layers.%u.linear_attn.A_log", l), 1, nv, 0, 0, 1,
                         &vspan, 1, w->gdn_a_log)) != HPD_OK ||
        (st = load_spans(ld, tensor_name(ld, "layers.%u.linear_attn.dt_bias", l), 1, nv, 0, 0, 1,
                         &vspan, 1, w->gdn_dt_bias)) != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "layers.%u.linear_attn.norm.weight", l), 1, dv, 0, 0,
                        w->gdn_norm)) != HPD_OK ||
        (st = load_rowpar(ld, m, &w->gdn_out,
                          tensor_name(ld, "layers.%u.linear_attn.out_proj.weight", l), H,
                          (uint32_t)(nv * dv))) != HPD_OK)
        return st;
    return HPD_OK;
}

static hpd_status_t fingerprint(hpd_model_t *m, const char *model_dir,
                                const hpd_st_archive_t *ar)
{
    XXH3_state_t *state = XXH3_createState();
    char path[4096];
    char *text;
    size_t len;
    hpd_status_t st;
    XXH128_hash_t h;
    XXH128_canonical_t canon;

    if (state == NULL)
        return HPD_ERR_NO_MEMORY;
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    if ((st = hpd_read_file(path, &text, &len)) != HPD_OK) {
        XXH3_freeState(state);
        return st;
    }
    XXH3_128bits_reset(state);
    XXH3_128bits_update(state, text, len);
    free(text);
    /* tensors are iterated in name order, so sharding does not matter */
    for (size_t i = 0; i < hpd_st_archive_count(ar); i++) {
        const hpd_st_tensor_t *t = hpd_st_archive_get(ar, i);
        XXH3_128bits_update(state, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(state, t->dtype_name, strlen(t->dtype_name) + 1);
        XXH3_128bits_update(state, t->shape, t->ndim * sizeof(t->shape[0]));
        /* in pieces, each let go once hashed: not kept resident */
        for (uint64_t off = 0; off < t->nbytes; off += 4u << 20) {
            const size_t piece = (size_t)HPD_MIN(t->nbytes - off, (uint64_t)4u << 20);
            XXH3_128bits_update(state, (const char *)t->data + off, piece);
            hpd_st_release_bytes((const char *)t->data + off, piece);
        }
    }
    /* the end-of-sequence ids, wherever they came from (generation_config.json
     * is not hashed whole): nodes that would stop differently differ */
    XXH3_128bits_update(state, &m->config.n_eos, sizeof(m->config.n_eos));
    XXH3_128bits_update(state, m->config.eos_ids, m->config.n_eos * sizeof(int32_t));
    /* and the sampling defaults, so every node resolves a request alike */
    const float gen[2] = {m->config.gen_sampling.temperature, m->config.gen_sampling.top_p};
    XXH3_128bits_update(state, gen, sizeof(gen));
    XXH3_128bits_update(state, &m->config.gen_sampling.top_k, sizeof(uint32_t));
    h = XXH3_128bits_digest(state);
    XXH3_freeState(state);
    XXH128_canonicalFromHash(&canon, h);
    memcpy(m->fingerprint, canon.digest, 16);
    return HPD_OK;
}

/* Rank `rank`'s shard of the model in ar (config c) into m. */
static hpd_status_t load_shard(loader_t *ld, const hpd_model_config_t *c, uint32_t tp,
                               uint32_t rank, bool fast, hpd_model_t *m)
{
    const char *model_dir = ld->dir;
    char why[200];
    hpd_status_t st;

    if ((st = hpd_shard_plan(c, tp, rank, &m->shard, why, sizeof(why))) != HPD_OK) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: cannot run at tensor parallelism: %s", model_dir, why);
        return st;
    }
    if (fast)
        m->shard.sum_groups = tp;
    hpd_shard_config(c, &m->shard, &m->config);
    ld->shard = &m->shard;
    const uint64_t V = c->vocab_size, H = c->hidden_size;
    const uint64_t v0 = m->shard.vocab.begin, Vl = m->shard.vocab.end - v0;
    m->final_norm = alloc_f32(m, H);
    if (m->final_norm == NULL)
        return HPD_ERR_NO_MEMORY;
    if ((st = load_matrix_rows(ld, m, &m->embed, tensor_name(ld, "embed_tokens.weight"), V, H, v0,
                               Vl)) == HPD_OK &&
        m->embed.dtype == HPD_DTYPE_F8_E4M3) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: embed_tokens.weight is F8_E4M3 (expected F32, F16 or "
                      "BF16: FP8 releases keep the embedding unquantised)", model_dir);
        st = HPD_ERR_UNSUPPORTED;
    }
    if (st != HPD_OK ||
        (st = load_into(ld, tensor_name(ld, "norm.weight"), 1, H, 0, 0, m->final_norm)) != HPD_OK)
        return st;
    if (m->config.tie_word_embeddings)
        m->lm_head = m->embed;
    else if ((st = load_matrix_rows(ld, m, &m->lm_head, "lm_head.weight", V, H, v0, Vl)) != HPD_OK)
        return st;
    /* the file's pages go as soon as their layer is copied: the peak stays
     * near the bytes the rank keeps, not those plus the file's */
    hpd_st_archive_release(ld->ar, NULL);
    for (uint32_t l = 0; l < m->config.n_layers; l++) {
        if ((st = load_layer(ld, m, l)) != HPD_OK)
            return st;
        hpd_st_archive_release(ld->ar, NULL);
    }
    return HPD_OK;
}

hpd_status_t hpd_model_load_tp(const char *model_dir, uint32_t tp, bool fast,
                               hpd_model_t **models)
{
    hpd_model_config_t c;
    hpd_st_archive_t *ar = NULL;
    loader_t ld = {.config = &c, .dir = model_dir};
    uint32_t skipped_visual = 0, skipped_mtp = 0;
    hpd_model_t *loaded[HPD_TP_MAX] = {0};
    hpd_status_t st;

    if (tp < 1 || tp > HPD_TP_MAX) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: tp %u: expected 1 to %d", model_dir, tp, HPD_TP_MAX);
        return HPD_ERR_INVALID_ARG;
    }
    if ((st = hpd_model_config_load(model_dir, &c)) != HPD_OK ||
        (st = hpd_st_archive_open(model_dir, &ar)) != HPD_OK)
        return st;
    ld.ar = ar;
    for (size_t i = 0; i < hpd_st_archive_count(ar); i++) {
        const char *name = hpd_st_archive_get(ar, i)->name;
        skipped_visual += strncmp(name, "model.visual.", 13) == 0;
        skipped_mtp += strncmp(name, "mtp.", 4) == 0;
    }
    if (skipped_visual + skipped_mtp > 0)
        HPD_LOG_INFO(LOG_COMPONENT, "%s: skipping %u tensors of the vision tower (model.visual.*) "
                     "and %u of the MTP head (mtp.*): text generation does not use them",
                     model_dir, skipped_visual, skipped_mtp);
    ld.prefix = hpd_st_archive_find(ar, "model.language_model.embed_tokens.weight") != NULL
                    ? "model.language_model."
                    : "model.";
    for (uint32_t r = 0; r < tp && st == HPD_OK; r++) {
        if ((loaded[r] = calloc(1, sizeof(hpd_model_t))) == NULL) {
            st = HPD_ERR_NO_MEMORY;
            break;
        }
        loaded[r]->config = c; /* what destroy reads until the shard's is set */
        loaded[r]->whole = c;
        loaded[r]->skipped_visual = skipped_visual;
        loaded[r]->skipped_mtp = skipped_mtp;
        if ((st = load_shard(&ld, &c, tp, r, fast, loaded[r])) == HPD_OK) {
            /* the checkpoint's, once: every rank of a node is the same model */
            if (r == 0)
                st = fingerprint(loaded[0], model_dir, ar);
            else
                memcpy(loaded[r]->fingerprint, loaded[0]->fingerprint, 16);
        }
    }
    hpd_st_archive_destroy(ar);
    if (st == HPD_OK) {
        memcpy(models, loaded, tp * sizeof(*models));
        return HPD_OK;
    }
    if (st == HPD_ERR_NO_MEMORY)
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: out of memory while loading weights", model_dir);
    for (uint32_t r = 0; r < tp; r++)
        hpd_model_destroy(loaded[r]);
    return st;
}

hpd_status_t hpd_model_load(const char *model_dir, hpd_model_t **model_p)
{
    return hpd_model_load_tp(model_dir, 1, false, model_p);
}

uint32_t hpd_model_tensors(hpd_model_t *m, hpd_model_tensor_t *out)
{
    const hpd_model_config_t *c = &m->config;
    const uint64_t V = m->shard.vocab.end - m->shard.vocab.begin, H = c->hidden_size;
    const uint64_t I = c->intermediate_size, nh = c->n_heads, hd = c->head_dim;
    const uint64_t nv = c->lin_n_v_heads, dv = c->lin_v_dim;
    uint32_t n = 0;

#define T(ptr, count)                                                                         \
    out[n++] = (hpd_model_tensor_t){.slot = (void **)&(ptr),                                     \
                                    .dtype = HPD_DTYPE_F32,                                      \
                                    .elements = (count),                                         \
                                    .bytes = (count) * sizeof(float)}
    /* a matrix of rows x cols, then an FP8 one's scales */
#define W(mat, rows_, cols_)                                                                       \
    do {                                                                                         \
        out[n++] = (hpd_model_tensor_t){.slot = &(mat).p,                                        \
                                        .dtype = (mat).dtype,                                    \
                                        .elements = (uint64_t)(rows_) * (cols_),                   \
                                        .bytes = (uint64_t)(rows_) * (cols_) *                     \
                                                 hpd_dtype_size((mat).dtype),                    \
                                        .matrix = &(mat),                                        \
                                        .rows = (rows_),                                         \
                                        .cols = (cols_)};                                         \
        if ((mat).dtype == HPD_DTYPE_F8_E4M3) {                                                  \
            T((mat).scale, (uint64_t)(rows_) * (mat).scale_ld);                                   \
            out[n - 1].is_scale = true;                                                          \
        }                                                                                        \
    } while (0)
    /* a row-parallel matrix, stored group by group */
#define R(mat, rows_, cols_)                                                                     \
    do {                                                                                         \
        W(mat, rows_, cols_);                                                                    \
        out[n - ((mat).dtype == HPD_DTYPE_F8_E4M3 ? 2 : 1)].k_full = (cols_) * m->shard.tp;      \
    } while (0)
    /* every part of a fused matrix */
#define F(fused, cols_)                                                                          \
    for (uint32_t p_ = 0; p_ < HPD_MAX_PARTS; p_++)                                              \
        if (p_ < (fused).n)                                                                      \
            W((fused).part[p_], (fused).rows[p_], cols_)
    W(m->embed, V, H);
    T(m->final_norm, H);
    if (!c->tie_word_embeddings)
        W(m->lm_head, V, H);
    for (uint32_t l = 0; l < c->n_layers && l < HPD_MAX_LAYERS; l++) {
        hpd_layer_weights_t *w = &m->layers[l];
        T(w->input_norm, H);
        T(w->post_norm, H);
        if (c->layer_moe[l]) {
            const uint64_t E = c->n_experts, Im = c->moe_inter, Is = c->shared_inter;
            F(w->moe_in, H);
            W(w->moe_gate_up, E * 2 * Im, H);
            R(w->moe_down, E * H, Im);
            if (Is > 0)
                R(w->shared_down, H, Is);
        } else {
            F(w->mlp_gate_up, H);
            R(w->mlp_down, H, I);
        }
        if (c->layer_full[l]) {
            F(w->attn_qkv, H);
            R(w->attn_o, H, nh * hd);
            T(w->q_norm, hd);
            T(w->k_norm, hd);
        } else {
            F(w->gdn_in, H);
            T(w->gdn_conv, (uint64_t)c->conv_dim * c->conv_kernel);
            T(w->gdn_a_log, nv);
            T(w->gdn_dt_bias, nv);
            T(w->gdn_norm, dv);
            R(w->gdn_out, H, nv * dv);
        }
    }
#undef R
#undef F
#undef W
#undef T
    return n;
}

float hpd_model_tensor_value(const hpd_model_t *m, const hpd_model_tensor_t *t, uint64_t e)
{
    const char *p = *t->slot;
    float x;
    hpd_dtype_to_f32(t->dtype, p + e * hpd_dtype_size(t->dtype), &x, 1);
    if (t->dtype != HPD_DTYPE_F8_E4M3)
        return x;
    hpd_weight_t w = *t->matrix;
    uint64_t cols = t->cols, r = e / cols, c = e % cols;
    if (t->k_full > 0) { /* find the group holding element e, and e within it */
        const hpd_range_t mine = hpd_tp_rank_groups(m->shard.tp, m->shard.rank, m->shard.sum_groups);
        for (uint32_t g = mine.begin; g < mine.end; g++) {
            uint32_t col, k;
            const hpd_weight_t v = hpd_model_group(t->matrix, t->rows, t->k_full, &m->shard, g,
                                                   &col, &k);
            if (e < (uint64_t)t->rows * (col + k)) {
                w = v;
                cols = k;
                r = (e - (uint64_t)t->rows * col) / k;
                c = (e - (uint64_t)t->rows * col) % k;
                break;
            }
        }
    }
    return x * w.scale[r * w.scale_ld + c / w.block];
}

void hpd_model_destroy(hpd_model_t *m)
{
    hpd_model_tensor_t t[HPD_MODEL_MAX_TENSORS];
    if (m == NULL)
        return;
    /* a config that failed to load lists no layers: free what was loaded */
    const uint32_t n = hpd_model_tensors(m, t);
    for (uint32_t i = 0; i < n; i++)
        free(*t[i].slot);
    free(m);
}

void hpd_model_fingerprint_hex(const hpd_model_t *m, char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", m->fingerprint[i]);
}
