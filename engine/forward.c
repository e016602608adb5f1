/* The forward pass of the hybrid linear-attention family (Qwen3-Next,
 * Qwen3.5): Gated DeltaNet layers and gated full-attention layers, each
 * followed by the MLP, over one batch of decode rows and prefill chunks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/util.h"
#include "engine/internal.h"

#define LOG_COMPONENT "engine"

/* The start of every sublayer: h = rmsnorm(x) with norm_w, then
 * proj[:, 0:rows) = h proj^T, one GEMM per part of the fused matrix. */
static hpd_status_t norm_project(hpd_engine_t *e, uint32_t R, const float *norm_w,
                                 const hpd_fused_t *proj)
{
    const uint32_t H = e->cfg->hidden_size;
    const hpd_rmsnorm_args_t norm = {.x = {.p = e->x, .ld = H},
                                     .y = {.p = e->h, .ld = H},
                                     .n_tokens = R,
                                     .n_heads = 1,
                                     .dim = H,
                                     .w = norm_w,
                                     .eps = e->cfg->rms_norm_eps,
                                     .zero_centred = true};
    hpd_status_t st = hpd_rmsnorm(e->be, &norm);
    uint32_t row = 0;
    for (uint32_t p = 0; p < proj->n && st == HPD_OK; p++) {
        const hpd_gemm_args_t g = {.x = e->h,
                                   .ldx = H,
                                   HPD_GEMM_WEIGHT(proj->part[p]),
                                   .y = e->proj + row,
                                   .ldy = e->ld_proj,
                                   .m = R,
                                   .n = proj->rows[p],
                                   .k = H};
        st = hpd_gemm(e->be, &g);
        row += proj->rows[p];
    }
    return st;
}

/* ---- the canonical sum of a row-parallel product (kernels/tp_sum.h)
 *
 * y (+)= x W^T where W is a row-parallel matrix (model.h: stored group by
 * group) and x this rank's columns. The rank computes the sum of its
 * groups' partials as the fixed tree would, its subtree: a pair of groups
 * as one GEMM then the next accumulated onto it (fl(p0 + p1), the tree's
 * add), larger subtrees as their halves added by tp_sum. The ranks' subtree
 * sums then meet in tp_sum's tree, on every rank, so the result has the
 * same bits at every TP degree, TP 1 included. */
typedef struct {
    const float *x;
    uint32_t ldx;
    const hpd_weight_t *w;
    uint32_t m, n, k_full;
    /* a mixture of experts' down projection: gemm_grouped over the experts */
    const uint32_t *first;
    uint32_t n_groups, max_rows;
} rowpar_t;

/* group g's product into y (accumulated or not) */
static hpd_status_t rowpar_group(hpd_engine_t *e, const rowpar_t *rp, uint32_t g, float *y,
                                 bool accumulate)
{
    const uint64_t rows = (uint64_t)rp->n * (rp->first != NULL ? rp->n_groups : 1);
    uint32_t col, k;
    const hpd_weight_t v = hpd_model_group(rp->w, rows, rp->k_full, &e->w->shard, g, &col, &k);
    if (k == 0) /* an empty group (K below 8) adds nothing */
        return accumulate ? HPD_OK
                          : hpd_backend_memset(e->be, y, 0, (size_t)rp->m * rp->n * sizeof(float));
    const hpd_gemm_args_t a = {.x = rp->x + col,
                               .ldx = rp->ldx,
                               HPD_GEMM_WEIGHT(v),
                               .y = y,
                               .ldy = rp->n,
                               .m = rp->m,
                               .n = rp->n,
                               .k = k,
                               .accumulate = accumulate};
    if (rp->first == NULL)
        return hpd_gemm(e->be, &a);
    const hpd_gemm_grouped_args_t ga = {
        .g = a, .first = rp->first, .n_groups = rp->n_groups, .max_rows = rp->max_rows};
    return hpd_gemm_grouped(e->be, &ga);
}

/* the subtree of groups [g0, g1) into out; scratch level `level` on */
static hpd_status_t rowpar_tree(hpd_engine_t *e, const rowpar_t *rp, uint32_t g0, uint32_t g1,
                                float *out, uint32_t level)
{
    hpd_status_t st;
    if (g1 - g0 == 1)
        return rowpar_group(e, rp, g0, out, false);
    if (g1 - g0 == 2) {
        if ((st = rowpar_group(e, rp, g0, out, false)) != HPD_OK)
            return st;
        return rowpar_group(e, rp, g0 + 1, out, true);
    }
    const uint32_t mid = (g0 + g1) / 2;
    float *right = e->tp_scratch[level];
    if ((st = rowpar_tree(e, rp, g0, mid, out, level + 1)) != HPD_OK ||
        (st = rowpar_tree(e, rp, mid, g1, right, level + 1)) != HPD_OK)
        return st;
    const hpd_tp_sum_args_t sum = {.parts = {out, right},
                                   .n_parts = 2,
                                   .ld_parts = rp->n,
                                   .y = out,
                                   .ldy = rp->n,
                                   .m = rp->m,
                                   .n = rp->n};
    return hpd_tp_sum(e->be, &sum);
}

/* A failed rank stops the others at their next meeting. */
static hpd_status_t tp_failed(hpd_engine_t *e, hpd_status_t st)
{
    if (st != HPD_OK && e->group != NULL)
        hpd_tp_group_abort(e->group);
    return st;
}

/* y = (accumulate ? y + s : s), s the product's canonical sum. */
static hpd_status_t rowpar(hpd_engine_t *e, const rowpar_t *rp, float *y, uint32_t ldy,
                           bool accumulate)
{
    const hpd_shard_t *sh = &e->w->shard;
    const hpd_range_t mine = hpd_tp_rank_groups(sh->tp, sh->rank, sh->sum_groups);
    hpd_tp_sum_args_t sum = {.parts = {e->tp_part},
                             .n_parts = 1,
                             .ld_parts = rp->n,
                             .y = y,
                             .ldy = ldy,
                             .m = rp->m,
                             .n = rp->n,
                             .accumulate = accumulate};
    if (e->tp == 1 && mine.end - mine.begin == 1) /* one group (--tp-fast): one GEMM */
        return rowpar_group(e, rp, mine.begin, y, accumulate);
    hpd_status_t st;
    if (e->be->ops->gemm_sum != NULL) {
        /* the rank's subtree in one op, straight into y at TP 1 */
        const uint64_t rows = (uint64_t)rp->n * (rp->first != NULL ? rp->n_groups : 1);
        hpd_gemm_sum_args_t gs = {.n_groups = mine.end - mine.begin,
                                  .m = rp->m,
                                  .n = rp->n,
                                  .y = e->tp == 1 ? y : e->tp_part,
                                  .ldy = e->tp == 1 ? ldy : rp->n,
                                  .accumulate = e->tp == 1 && accumulate,
                                  .first = rp->first,
                                  .n_experts = rp->first != NULL ? rp->n_groups : 0};
        for (uint32_t g = mine.begin; g < mine.end; g++) {
            uint32_t col, k;
            const hpd_weight_t v = hpd_model_group(rp->w, rows, rp->k_full, sh, g, &col, &k);
            gs.g[g - mine.begin] = (hpd_gemm_args_t){
                .x = rp->x + col, .ldx = rp->ldx, HPD_GEMM_WEIGHT(v), .k = k};
        }
        st = hpd_gemm_sum(e->be, &gs);
        if (st != HPD_OK || e->tp == 1)
            return tp_failed(e, st);
    } else {
        st = rowpar_tree(e, rp, mine.begin, mine.end, e->tp_part, 0);
    }
    if (st != HPD_OK || e->tp == 1)
        return tp_failed(e, st != HPD_OK ? st : hpd_tp_sum(e->be, &sum));
    /* every rank's subtree sum, read where it lies (CPU ranks: host memory) */
    const double t0 = hpd_time_now();
    const void *all[HPD_TP_MAX];
    if ((st = tp_failed(e, hpd_tp_group_share(e->group, e->rank, e->tp_part, all))) != HPD_OK)
        return st;
    for (uint32_t r = 0; r < e->tp; r++)
        sum.parts[r] = all[r];
    sum.n_parts = e->tp;
    if ((st = tp_failed(e, hpd_tp_sum(e->be, &sum))) == HPD_OK)
        st = hpd_tp_group_barrier(e->group);
    e->tp_meet_seconds += hpd_time_now() - t0;
    return st;
}

static float *slot_layer(hpd_engine_t *e, const request_t *r, uint32_t gdn_index)
{
    return (float *)((uint8_t *)hpd_slot_pool_ptr(e->slots, r->slot) +
                     gdn_index * e->gdn_layer_bytes);
}

static hpd_status_t gdn_layer(hpd_engine_t *e, const batch_t *bt, uint32_t l)
{
    const hpd_model_config_t *c = e->cfg;
    const hpd_layer_weights_t *w = &e->w->layers[l];
    const uint32_t R = bt->rows, H = c->hidden_size, nk = c->lin_n_k_heads;
    const uint32_t nv = c->lin_n_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const uint32_t gi = c->kind_index[l], zoff = c->conv_dim, boff = zoff + nv * dv;
    const uint64_t rec_floats = (uint64_t)nv * dk * dv;
    hpd_status_t st;

    for (uint32_t i = 0, np = 0, nd = 0; i < bt->n_items; i++) {
        float *state = slot_layer(e, e->items[i].req, gi);
        if (e->items[i].decode) {
            e->st_dec[nd] = state;
            e->cs_dec[nd++] = state + rec_floats;
        } else {
            e->st_pre[np] = state;
            e->cs_pre[np++] = state + rec_floats;
        }
    }
    if ((st = norm_project(e, R, w->input_norm, &w->gdn_in)) != HPD_OK)
        return st;

    hpd_conv1d_args_t conv = {.x = e->proj,
                              .ldx = e->ld_proj,
                              .y = e->conv,
                              .ldy = c->conv_dim,
                              .w = w->gdn_conv,
                              .channels = c->conv_dim,
                              .kc = c->conv_kernel,
                              .states = e->cs_pre,
                              .seqs = e->seqs_pre,
                              .n_seqs = bt->n_pre};
    if (bt->n_pre > 0 && (st = hpd_conv1d(e->be, &conv)) != HPD_OK)
        return st;
    conv.states = e->cs_dec;
    conv.seqs = e->seqs_dec;
    conv.n_seqs = bt->n_dec;
    if (bt->n_dec > 0 && (st = hpd_conv1d_step(e->be, &conv)) != HPD_OK)
        return st;

    hpd_view_t q = {.p = e->conv, .ld = c->conv_dim, .hs = dk};
    hpd_view_t k = {.p = e->conv + nk * dk, .ld = c->conv_dim, .hs = dk};
    hpd_view_t v = {.p = e->conv + 2 * nk * dk, .ld = c->conv_dim, .hs = dv};
    hpd_l2norm_args_t qn = {.x = q,
                            .n_tokens = R,
                            .n_heads = nk,
                            .dim = dk,
                            .eps = 1e-6f,
                            .scale = 1.0f / sqrtf((float)dk)};
    hpd_l2norm_args_t kn = {
        .x = k, .n_tokens = R, .n_heads = nk, .dim = dk, .eps = 1e-6f, .scale = 1.0f};
    hpd_gdn_gating_args_t gate = {.a = e->proj + boff + nv,
                                  .b = e->proj + boff,
                                  .lda = e->ld_proj,
                                  .ldb = e->ld_proj,
                                  .a_log = w->gdn_a_log,
                                  .dt_bias = w->gdn_dt_bias,
                                  .g = e->g,
                                  .beta = e->beta,
                                  .n_tokens = R,
                                  .nv = nv};
    /* both norms and the gates: one op (one launch on a GPU) */
    const hpd_l2norm_gating_args_t ng = {.q = qn, .k = kn, .gate = gate};
    if ((st = hpd_l2norm_gating(e->be, &ng)) != HPD_OK)
        return st;

    hpd_view_t out = {.p = e->core, .ld = e->ld_core, .hs = dv};
    hpd_gdn_args_t gdn = {.q = q,
                          .k = k,
                          .v = v,
                          .g = e->g,
                          .beta = e->beta,
                          .out = out,
                          .nk = nk,
                          .nv = nv,
                          .dk = dk,
                          .dv = dv,
                          .states = e->st_pre,
                          .seqs = e->seqs_pre,
                          .n_seqs = bt->n_pre};
    if (bt->n_pre > 0 && (st = hpd_gdn_chunked(e->be, &gdn)) != HPD_OK)
        return st;
    gdn.states = e->st_dec;
    gdn.seqs = e->seqs_dec;
    gdn.n_seqs = bt->n_dec;
    if (bt->n_dec > 0 && (st = hpd_gdn_recurrent(e->be, &gdn)) != HPD_OK)
        return st;

    hpd_gated_rmsnorm_args_t gn = {.x = out,
                                   .z = {.p = e->proj + zoff, .ld = e->ld_proj, .hs = dv},
                                   .y = out,
                                   .n_tokens = R,
                                   .n_heads = nv,
                                   .dim = dv,
                                   .w = w->gdn_norm,
                                   .eps = c->rms_norm_eps};
    const rowpar_t o = {.x = e->core,
                        .ldx = e->ld_core,
                        .w = &w->gdn_out,
                        .m = R,
                        .n = H,
                        .k_full = nv * dv * e->tp};
    if ((st = hpd_gated_rmsnorm(e->be, &gn)) != HPD_OK)
        return st;
    return rowpar(e, &o, e->x, H, true);
}

static hpd_status_t attn_layer(hpd_engine_t *e, const batch_t *bt, uint32_t l)
{
    const hpd_model_config_t *c = e->cfg;
    const hpd_layer_weights_t *w = &e->w->layers[l];
    const uint32_t R = bt->rows, H = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads;
    const uint32_t hd = c->head_dim, a = c->kind_index[l];
    const uint32_t P = e->p.kv_layout.pack_size, group = a / P;
    hpd_status_t st;

    for (uint32_t i = 0; i < bt->n_items; i++) {
        const request_t *r = e->items[i].req;
        e->bt_all[i] = r->pages + (size_t)group * r->n_blocks;
    }
    if ((st = norm_project(e, R, w->input_norm, &w->attn_qkv)) !=
        HPD_OK)
        return st;

    hpd_view_t q = {.p = e->proj, .ld = e->ld_proj, .hs = 2 * hd};
    hpd_view_t gate = {.p = e->proj + hd, .ld = e->ld_proj, .hs = 2 * hd};
    hpd_view_t k = {.p = e->proj + nh * 2 * hd, .ld = e->ld_proj, .hs = hd};
    hpd_view_t v = {.p = e->proj + nh * 2 * hd + nkv * hd, .ld = e->ld_proj, .hs = hd};
    hpd_rmsnorm_args_t qn = {.x = q,
                             .y = q,
                             .n_tokens = R,
                             .n_heads = nh,
                             .dim = hd,
                             .w = w->q_norm,
                             .eps = c->rms_norm_eps,
                             .zero_centred = true};
    hpd_rmsnorm_args_t kn = {.x = k,
                             .y = k,
                             .n_tokens = R,
                             .n_heads = nkv,
                             .dim = hd,
                             .w = w->k_norm,
                             .eps = c->rms_norm_eps,
                             .zero_centred = true};
    /* both norms, then RoPE on both: one op (one launch on a GPU) */
    const hpd_norm_rope_args_t nr = {.q = qn,
                                     .k = kn,
                                     .rope = {.rot_dim = c->rot_dim,
                                              .positions = e->positions,
                                              .theta = c->rope_theta,
                                              .yarn_factor = c->yarn_factor,
                                              .yarn_low = c->yarn_low,
                                              .yarn_span = c->yarn_span,
                                              .yarn_attention = c->yarn_attention}};
    if ((st = hpd_norm_rope(e->be, &nr)) != HPD_OK)
        return st;

    hpd_paged_kv_t kv = {.layout = &e->p.kv_layout,
                         .pool = hpd_page_pool_base(e->pages),
                         .member = a % P,
                         .block_tables = e->bt_all};
    hpd_kv_store_args_t store = {
        .kv = kv, .k = k, .v = v, .seqs = e->seqs_all, .n_seqs = bt->n_items};
    hpd_view_t out = {.p = e->core, .ld = e->ld_core, .hs = hd};
    hpd_attention_args_t att = {.kv = kv,
                                .q = q,
                                .out = out,
                                .n_heads = nh,
                                .scale = 1.0f / sqrtf((float)hd),
                                .seqs = e->seqs_all,
                                .n_seqs = bt->n_items};
    hpd_sigmoid_mul_args_t sg = {.x = out, .gate = gate, .n_tokens = R, .n_heads = nh, .dim = hd};
    const rowpar_t o = {
        .x = e->core, .ldx = e->ld_core, .w = &w->attn_o, .m = R, .n = H, .k_full = nh * hd * e->tp};
    if ((st = hpd_kv_store(e->be, &store)) != HPD_OK ||
        (st = hpd_attention(e->be, &att)) != HPD_OK || (st = hpd_sigmoid_mul(e->be, &sg)) != HPD_OK)
        return st;
    return rowpar(e, &o, e->x, H, true);
}

static hpd_status_t mlp(hpd_engine_t *e, const batch_t *bt, uint32_t l)
{
    const hpd_model_config_t *c = e->cfg;
    const hpd_layer_weights_t *w = &e->w->layers[l];
    const uint32_t R = bt->rows, H = c->hidden_size, I = c->intermediate_size;
    hpd_status_t st;

    hpd_silu_mul_args_t act = {
        .gu = e->proj, .ldgu = e->ld_proj, .out = e->act, .ldout = I, .n_tokens = R, .inter = I};
    const rowpar_t down = {
        .x = e->act, .ldx = I, .w = &w->mlp_down, .m = R, .n = H, .k_full = I * e->tp};
    if ((st = norm_project(e, R, w->post_norm, &w->mlp_gate_up)) != HPD_OK ||
        (st = hpd_silu_mul(e->be, &act)) != HPD_OK)
        return st;
    return rowpar(e, &down, e->x, H, true);
}

/* A mixture-of-experts MLP (Qwen3-Next, Qwen3.5-MoE): one projection gives
 * the router logits, the shared expert's gate logit and its gate|up rows;
 * the backend routes each token (moe_route: kernels/moe_route.h) and its
 * rows are gathered by expert; each expert hit runs its GEMMs over its rows
 * only (gemm_grouped: the others' weights are not read); the combine op
 * adds each token's experts in ascending id and the gated shared expert to
 * the residual. The routing stays in backend memory: on a GPU no op of the
 * layer waits for the host, so the step can be recorded as a graph. Each
 * GEMM row is batch invariant and the sum's order is the token's own, so a
 * token's result does not depend on the batch. */
static hpd_status_t moe(hpd_engine_t *e, const batch_t *bt, uint32_t l)
{
    const hpd_model_config_t *c = e->cfg;
    const hpd_layer_weights_t *w = &e->w->layers[l];
    const uint32_t R = bt->rows, H = c->hidden_size, E = c->n_experts, K = c->top_k;
    const uint32_t Im = c->moe_inter, Is = c->shared_inter, S = R * K;
    hpd_status_t st;

    if ((st = norm_project(e, R, w->post_norm, &w->moe_in)) != HPD_OK)
        return st;
    const hpd_moe_route_args_t route = {.logits = e->proj,
                                        .ld = e->ld_proj,
                                        .n_tokens = R,
                                        .n_experts = E,
                                        .top_k = K,
                                        .norm = c->norm_topk,
                                        .ids = e->moe_ids,
                                        .weights = e->moe_w,
                                        .slots = e->moe_slots,
                                        .idx = e->moe_idx,
                                        .first = e->moe_first};
    if ((st = hpd_moe_route(e->be, &route)) != HPD_OK)
        return st;
    const hpd_gather_args_t gather = {.src = e->h,
                                      .ld_src = H,
                                      .idx_dev = e->moe_idx,
                                      .n = S,
                                      .dim = H,
                                      .dst = e->moe_x,
                                      .ld_dst = H};
    if ((st = hpd_gather(e->be, &gather)) != HPD_OK)
        return st;
    const hpd_gemm_grouped_args_t gu = {.g = {.x = e->moe_x,
                                              .ldx = H,
                                              HPD_GEMM_WEIGHT(w->moe_gate_up),
                                              .y = e->moe_gu,
                                              .ldy = 2 * Im,
                                              .m = S,
                                              .n = 2 * Im,
                                              .k = H},
                                        .first = e->moe_first,
                                        .n_groups = E,
                                        .max_rows = R};
    if ((st = hpd_gemm_grouped(e->be, &gu)) != HPD_OK)
        return st;
    const hpd_silu_mul_args_t act = {
        .gu = e->moe_gu, .ldgu = 2 * Im, .out = e->moe_act, .ldout = Im, .n_tokens = S, .inter = Im};
    if ((st = hpd_silu_mul(e->be, &act)) != HPD_OK)
        return st;
    const rowpar_t down = {.x = e->moe_act,
                           .ldx = Im,
                           .w = &w->moe_down,
                           .m = S,
                           .n = H,
                           .k_full = Im * e->tp,
                           .first = e->moe_first,
                           .n_groups = E,
                           .max_rows = R};
    if ((st = rowpar(e, &down, e->moe_out, H, false)) != HPD_OK)
        return st;
    if (Is > 0) {
        const hpd_silu_mul_args_t sact = {.gu = e->proj + E + 1,
                                          .ldgu = e->ld_proj,
                                          .out = e->act,
                                          .ldout = Is,
                                          .n_tokens = R,
                                          .inter = Is};
        const rowpar_t sdown = {
            .x = e->act, .ldx = Is, .w = &w->shared_down, .m = R, .n = H, .k_full = Is * e->tp};
        if ((st = hpd_silu_mul(e->be, &sact)) != HPD_OK ||
            (st = rowpar(e, &sdown, e->moe_shared, H, false)) != HPD_OK)
            return st;
    }
    const hpd_moe_combine_args_t comb = {.x = e->x,
                                         .ldx = H,
                                         .rows = e->moe_out,
                                         .ld_rows = H,
                                         .slots = e->moe_slots,
                                         .weights = e->moe_w,
                                         .top_k = K,
                                         .shared = Is > 0 ? e->moe_shared : NULL,
                                         .ld_shared = H,
                                         .gate = e->proj + E,
                                         .ld_gate = e->ld_proj,
                                         .n_tokens = R,
                                         .dim = H};
    return hpd_moe_combine(e->be, &comb);
}

/* Final norm and LM head over the rows that need logits. */
static hpd_status_t lm_head(hpd_engine_t *e, const batch_t *bt)
{
    const hpd_model_config_t *c = e->cfg;
    const uint32_t H = c->hidden_size, n = bt->n_logits + bt->n_plp;
    hpd_status_t st;

    /* the rows that need logits, together: one op (one launch on a GPU) */
    const hpd_gather_args_t rows = {.src = e->x,
                                    .ld_src = H,
                                    .idx = e->logit_rows,
                                    .n = n,
                                    .dim = H,
                                    .dst = e->lhid,
                                    .ld_dst = H};
    if ((st = hpd_gather(e->be, &rows)) != HPD_OK)
        return st;
    hpd_rmsnorm_args_t norm = {.x = {.p = e->lhid, .ld = H},
                               .y = {.p = e->lhid, .ld = H},
                               .n_tokens = n,
                               .n_heads = 1,
                               .dim = H,
                               .w = e->w->final_norm,
                               .eps = c->rms_norm_eps,
                               .zero_centred = true};
    /* this rank's vocabulary columns of the logits (all of them at TP 1) */
    const hpd_range_t v = e->vocab[e->rank];
    hpd_gemm_args_t head = {.x = e->lhid,
                            .ldx = H,
                            HPD_GEMM_WEIGHT(e->w->lm_head),
                            .y = e->logits + v.begin,
                            .ldy = c->vocab_size,
                            .m = n,
                            .n = v.end - v.begin,
                            .k = H};
    if ((st = hpd_rmsnorm(e->be, &norm)) != HPD_OK || (st = hpd_gemm(e->be, &head)) != HPD_OK ||
        e->tp == 1)
        return st;
    /* every rank gathers the others' columns: each samples from the whole
     * row, as TP 1 does, and draws the same token */
    const double t0 = hpd_time_now();
    const void *all[HPD_TP_MAX];
    if ((st = tp_failed(e, hpd_tp_group_share(e->group, e->rank, e->logits, all))) != HPD_OK)
        return st;
    for (uint32_t r = 0; r < e->tp && st == HPD_OK; r++)
        for (uint32_t i = 0; i < n && r != e->rank && st == HPD_OK; i++) {
            const size_t off = (size_t)i * c->vocab_size + e->vocab[r].begin;
            st = hpd_backend_copy(e->be, e->logits + off, (const float *)all[r] + off,
                                  (e->vocab[r].end - e->vocab[r].begin) * sizeof(float));
        }
    if ((st = tp_failed(e, st)) == HPD_OK)
        st = hpd_tp_group_barrier(e->group);
    e->tp_meet_seconds += hpd_time_now() - t0;
    return st;
}

/* The embedding rows of the batch's tokens into x. At TP N each rank holds
 * a range of the vocabulary: it looks up the tokens in its range, and
 * every rank copies each row from the rank that holds its token. */
static hpd_status_t embed(hpd_engine_t *e, const batch_t *bt)
{
    const uint32_t H = e->cfg->hidden_size;
    hpd_embed_args_t emb = {.ids = e->ids,
                            .n = bt->rows,
                            .table = e->w->embed.p,
                            .dtype = e->w->embed.dtype,
                            .dim = H,
                            .out = e->x,
                            .ld = H};
    if (e->tp == 1)
        return hpd_embed(e->be, &emb);
    const hpd_range_t v = e->vocab[e->rank];
    uint32_t n = 0;
    for (uint32_t i = 0; i < bt->rows; i++)
        if ((uint32_t)e->ids[i] >= v.begin && (uint32_t)e->ids[i] < v.end)
            e->emb_ids[n++] = e->ids[i] - (int32_t)v.begin;
    emb.ids = e->emb_ids;
    emb.n = n;
    emb.out = e->lhid; /* this rank's rows, in batch order */
    hpd_status_t st = n > 0 ? hpd_embed(e->be, &emb) : HPD_OK;
    const double t0 = hpd_time_now();
    const void *all[HPD_TP_MAX];
    if ((st = tp_failed(e, st)) != HPD_OK ||
        (st = tp_failed(e, hpd_tp_group_share(e->group, e->rank, e->lhid, all))) != HPD_OK)
        return st;
    uint32_t seen[HPD_TP_MAX] = {0}; /* rows of each rank so far */
    for (uint32_t i = 0; i < bt->rows && st == HPD_OK; i++) {
        uint32_t r = 0;
        while ((uint32_t)e->ids[i] >= e->vocab[r].end)
            r++;
        st = hpd_backend_copy(e->be, e->x + (size_t)i * H,
                              (const float *)all[r] + (size_t)seen[r]++ * H, H * sizeof(float));
    }
    if ((st = tp_failed(e, st)) == HPD_OK)
        st = hpd_tp_group_barrier(e->group);
    e->tp_meet_seconds += hpd_time_now() - t0;
    return st;
}

/* The ranks run their schedulers in lockstep: a batch that is not the same
 * on every rank (a bug, never an input) stops the step before any rank
 * computes with another's rows. The signature lives in the engine: a rank
 * that stops at a mismatch leaves it readable for the others. */
hpd_status_t hpd_engine_tp_check(hpd_engine_t *e, const batch_t *bt)
{
    e->tp_sig[0] = XXH3_64bits_withSeed(e->ids, bt->rows * sizeof(*e->ids), bt->rows);
    e->tp_sig[1] = XXH3_64bits_withSeed(e->positions, bt->rows * sizeof(*e->positions),
                                        ((uint64_t)bt->n_items << 32) | bt->n_logits);
    const void *all[HPD_TP_MAX];
    hpd_status_t st = tp_failed(e, hpd_tp_group_share(e->group, e->rank, e->tp_sig, all));
    for (uint32_t r = 0; r < e->tp && st == HPD_OK; r++)
        if (memcmp(all[r], e->tp_sig, sizeof(e->tp_sig)) != 0) {
            HPD_LOG_ERROR(LOG_COMPONENT, "tp rank %u's batch differs from rank %u's (%u rows, "
                          "%u requests): the ranks left lockstep", r, e->rank, bt->rows,
                          bt->n_items);
            st = tp_failed(e, HPD_ERR_INTERNAL);
        }
    if (st != HPD_OK)
        return st;
    return hpd_tp_group_barrier(e->group);
}

static hpd_status_t forward(hpd_engine_t *e, const batch_t *bt)
{
    const hpd_model_config_t *c = e->cfg;
    hpd_status_t st;

    if ((st = embed(e, bt)) != HPD_OK)
        return st;
    if (e->p.layer_cb != NULL)
        for (uint32_t i = 0; i < bt->n_items; i++) {
            const batch_item_t *it = &e->items[i];
            e->step_items[i] = (hpd_engine_step_item_t){
                .id = it->req->id,
                .pos = it->req->n_done,
                .n_tokens = it->n_tokens,
                .prefill = !it->decode,
                .last_chunk = !it->decode && it->req->n_done + it->n_tokens == it->req->n_prompt};
        }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        st = c->layer_full[l] ? attn_layer(e, bt, l) : gdn_layer(e, bt, l);
        if (st != HPD_OK)
            return st;
        /* this layer's KV rows and GDN states are final for the step's tokens */
        if (e->p.layer_cb != NULL)
            e->p.layer_cb(e->p.layer_cb_arg, l, e->step_items, bt->n_items);
        if ((st = c->layer_moe[l] ? moe(e, bt, l) : mlp(e, bt, l)) != HPD_OK)
            return st;
    }
    return bt->n_logits + bt->n_plp > 0 ? lm_head(e, bt) : HPD_OK;
}

hpd_status_t hpd_engine_forward(hpd_engine_t *e, const batch_t *bt)
{
    return tp_failed(e, forward(e, bt));
}

/* Whether this step may be recorded whole: decode rows only (a prefill
 * chunk's shapes vary with each prompt), no layer callback (it records
 * fences other threads wait on). */
static bool step_recordable(const hpd_engine_t *e, const batch_t *bt)
{
    return e->p.step_graphs && bt->n_pre == 0 && e->p.layer_cb == NULL;
}

hpd_status_t hpd_engine_forward_step(hpd_engine_t *e, const batch_t *bt)
{
    if (!step_recordable(e, bt))
        return hpd_engine_forward(e, bt);
    hpd_status_t st = hpd_backend_step_begin(e->be, bt->rows);
    if (st == HPD_ERR_UNSUPPORTED)
        return hpd_engine_forward(e, bt);
    if (st != HPD_OK)
        return tp_failed(e, st);
    /* a failed op fails the step (the segments recorded before it ran) */
    const hpd_status_t fst = hpd_engine_forward(e, bt);
    bool ran;
    st = hpd_backend_step_end(e->be, fst == HPD_OK, &ran);
    if (fst != HPD_OK)
        return fst;
    if (st == HPD_OK && ran)
        e->stats.graph_steps++;
    return st != HPD_OK ? st : ran ? HPD_OK : HPD_ERR_INTERNAL;
}
