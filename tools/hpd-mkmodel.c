/* hpd-mkmodel: writes a random Qwen3-Next / Qwen3.5 dense model as a Hugging
 * Face directory (config.json + safetensors), for tests and demos.
 *
 * The weights are a pure function of (seed, tensor, element): the same seed
 * gives the same model whatever the naming, dtype or sharding, so the loader
 * can be checked across all of them. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dtype.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *out;
    uint64_t seed;
    hpd_model_arch_t arch;
    hpd_dtype_t dtype;
    hpd_dtype_t round_to; /* values rounded to this dtype first (then stored as dtype) */
    uint32_t hidden, layers, full_interval, inter, vocab, heads, kv_heads, head_dim;
    uint32_t lk_heads, lv_heads, lk_dim, lv_dim, conv_kernel, shards, max_pos;
    float rope_theta, partial_rotary;
    int tie, interval_only;
    const char *eos; /* "1,2": eos_token_id in config.json and generation_config.json */
    /* mixture of experts: experts (0: dense), per token, their and the
     * shared expert's intermediate sizes; qwen3_5_moe(_text) for the
     * Qwen3.5 archs; fused 3-D expert tensors; Qwen3-Next's sparse step and
     * dense layers */
    uint32_t experts, top_k, moe_inter, shared_inter, sparse_step;
    int moe_family, fused_experts, no_norm_topk;
    const char *mlp_only; /* "1,3" */
    uint32_t fp8_block;   /* > 0: an FP8 release (block-quantised projections) */
    bool sampling;   /* temperature, top_p and top_k in generation_config.json */
    float gen_temperature, gen_top_p;
    uint32_t gen_top_k;
} opts_t;

typedef struct {
    hpd_st_write_tensor_t *t;
    void **bufs;
    size_t n, cap;
    uint32_t next_id; /* logical tensor counter: keys the random stream */
    hpd_dtype_t dtype;
    uint32_t fp8_block; /* > 0: projection weights FP8 E4M3 in blocks of this many squared */
} writer_t;

/* Gaussian from the counter-based RNG: element e of logical tensor id. */
static float gauss(uint64_t seed, uint32_t id, uint64_t e)
{
    hpd_philox_out_t r = hpd_philox4x32(seed, e, id);
    float u1 = ((float)(r.v[0] >> 8) + 0.5f) * (1.0f / 16777216.0f);
    float u2 = (float)(r.v[1] >> 8) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static float uniform(uint64_t seed, uint32_t id, uint64_t e)
{
    return hpd_u32_to_unit(hpd_philox4x32(seed, e, id).v[2]);
}

typedef enum { DIST_NORMAL, DIST_ONE_PLUS, DIST_LOG_UNIFORM } dist_t;

/* A logical tensor of n fp32 values (rows x cols). */
static float *make(const opts_t *o, writer_t *w, uint64_t n, dist_t dist, float scale)
{
    const uint32_t id = w->next_id++;
    float *v = malloc(n * sizeof(float));

    if (v == NULL)
        return NULL;
    for (uint64_t e = 0; e < n; e++) {
        switch (dist) {
        case DIST_NORMAL: v[e] = scale * gauss(o->seed, id, e); break;
        case DIST_ONE_PLUS: v[e] = 1.0f + scale * gauss(o->seed, id, e); break;
        case DIST_LOG_UNIFORM: /* A_log: log of A uniform in [0.1, 0.1 + scale] */
            v[e] = logf(0.1f + scale * uniform(o->seed, id, e));
            break;
        }
    }
    if (o->round_to != HPD_DTYPE_F32) { /* the values of a round_to model, in another dtype */
        void *tmp = malloc(n * hpd_dtype_size(o->round_to));
        if (tmp == NULL) {
            free(v);
            return NULL;
        }
        hpd_dtype_from_f32(o->round_to, v, tmp, n);
        hpd_dtype_to_f32(o->round_to, tmp, v, n);
        free(tmp);
    }
    return v;
}

static int add_as(writer_t *w, const char *name, const float *f32, hpd_dtype_t dtype,
                  uint32_t ndim, uint64_t d0, uint64_t d1, uint64_t d2);

/* The weights an FP8 release quantises: the linear projections (attention,
 * linear attention, MLP, experts, the shared expert); not the embedding, the
 * LM head, the router (mlp.gate), the shared expert's gate, norms, conv. */
static bool quantised(const char *name)
{
    const size_t n = strlen(name);
    return (strstr(name, "proj") != NULL && n > 7 && strcmp(name + n - 7, ".weight") == 0) ||
           (n > 5 && strcmp(name + n - 5, "_proj") == 0);
}

/* Block FP8 of a [mats][rows][cols] tensor as the FP8 releases store it:
 * per block of fp8_block squared, scale = max |w| / 448, q = e4m3(w / scale),
 * and NAME_scale_inv [mats][row blocks][column blocks] holding the scales. */
static int add_fp8(writer_t *w, const char *name, const float *f32, uint32_t ndim, uint64_t d0,
                   uint64_t d1, uint64_t d2)
{
    const uint64_t mats = ndim == 3 ? d0 : 1, rows = ndim == 3 ? d1 : d0,
                   cols = ndim == 3 ? d2 : d1, B = w->fp8_block;
    const uint64_t rb = (rows + B - 1) / B, cb = (cols + B - 1) / B;
    float *deq = malloc(mats * rows * cols * sizeof(float)), *sc = malloc(mats * rb * cb * 4);
    char sname[300];
    int rc = -1;
    if (deq == NULL || sc == NULL)
        goto out;
    for (uint64_t m = 0; m < mats; m++)
        for (uint64_t i = 0; i < rb; i++)
            for (uint64_t j = 0; j < cb; j++) {
                const uint64_t r1 = HPD_MIN((i + 1) * B, rows), c1 = HPD_MIN((j + 1) * B, cols);
                float amax = 0;
                for (uint64_t r = i * B; r < r1; r++)
                    for (uint64_t c = j * B; c < c1; c++)
                        amax = fmaxf(amax, fabsf(f32[(m * rows + r) * cols + c]));
                const float scale = amax > 0 ? amax / 448.0f : 1.0f;
                sc[(m * rb + i) * cb + j] = scale;
                /* the values the file holds, before the F8 conversion in add_as */
                for (uint64_t r = i * B; r < r1; r++)
                    for (uint64_t c = j * B; c < c1; c++) {
                        const uint64_t e = (m * rows + r) * cols + c;
                        deq[e] = f32[e] / scale;
                    }
            }
    snprintf(sname, sizeof(sname), "%s_scale_inv", name);
    rc = add_as(w, name, deq, HPD_DTYPE_F8_E4M3, ndim, d0, d1, d2) == 0 &&
                 add_as(w, sname, sc, HPD_DTYPE_F32, ndim, ndim == 3 ? mats : rb,
                        ndim == 3 ? rb : cb, ndim == 3 ? cb : 0) == 0
             ? 0
             : -1;
out:
    free(deq);
    free(sc);
    return rc;
}

/* Adds a tensor to the file, converted to the output dtype (or FP8 with its
 * scales); takes f32. */
static int add(writer_t *w, const char *name, const float *f32, uint32_t ndim, uint64_t d0,
               uint64_t d1, uint64_t d2)
{
    if (w->fp8_block > 0 && ndim >= 2 && quantised(name))
        return add_fp8(w, name, f32, ndim, d0, d1, d2);
    return add_as(w, name, f32, w->dtype, ndim, d0, d1, d2);
}

static int add_as(writer_t *w, const char *name, const float *f32, hpd_dtype_t dtype,
                  uint32_t ndim, uint64_t d0, uint64_t d1, uint64_t d2)
{
    const uint64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    void *buf = malloc(n * hpd_dtype_size(dtype) + 1);

    if (buf == NULL)
        return -1;
    size_t cap_bufs = w->cap;
    if (hpd_grow(&w->t, &w->cap, w->n + 1, sizeof(*w->t)) != HPD_OK ||
        hpd_grow(&w->bufs, &cap_bufs, w->n + 1, sizeof(*w->bufs)) != HPD_OK) {
        free(buf);
        return -1;
    }
    hpd_dtype_from_f32(dtype, f32, buf, n);
    hpd_st_write_tensor_t *t = &w->t[w->n];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->data = buf;
    w->bufs[w->n++] = buf;
    return 0;
}

#define CHECK(x)                                                      \
    do {                                                              \
        if (!(x)) {                                                   \
            fprintf(stderr, "hpd-mkmodel: out of memory\n");          \
            exit(1);                                                  \
        }                                                             \
    } while (0)

/* Whether layer l's MLP is a mixture of experts (as transformers decides). */
static bool layer_moe(const opts_t *o, uint32_t l)
{
    if (o->experts == 0)
        return false;
    if (o->moe_family)
        return true;
    if ((l + 1) % o->sparse_step != 0)
        return false;
    for (const char *p = o->mlp_only; p != NULL && *p != '\0';) {
        char *end;
        if (strtoul(p, &end, 10) == l && end != p)
            return false;
        p = *end == ',' ? end + 1 : end + (*end != '\0');
    }
    return true;
}

/* Adds layer l's tensor SUFFIX (name, pfx, l and w in scope). */
#define ADD(suffix, buf, nd, a, b, c)                                       \
    do {                                                                    \
        snprintf(name, sizeof(name), "%slayers.%u.%s", pfx, l, suffix);     \
        CHECK(add(w, name, buf, nd, a, b, c) == 0);                         \
    } while (0)

/* A gated MLP of width I at `mlp` ("mlp." or "mlp.shared_expert."): gate,
 * up and down projections, in that order of random streams. */
static void gen_mlp(const opts_t *o, writer_t *w, const char *pfx, uint32_t l, const char *mlp,
                    uint64_t I)
{
    const uint64_t H = o->hidden;
    const float sh = 1.0f / sqrtf((float)H);
    char name[256], suffix[96];
    float *t;

    CHECK(t = make(o, w, I * H, DIST_NORMAL, sh));
    snprintf(suffix, sizeof(suffix), "%sgate_proj.weight", mlp);
    ADD(suffix, t, 2, I, H, 0);
    free(t);
    CHECK(t = make(o, w, I * H, DIST_NORMAL, sh));
    snprintf(suffix, sizeof(suffix), "%sup_proj.weight", mlp);
    ADD(suffix, t, 2, I, H, 0);
    free(t);
    CHECK(t = make(o, w, H * I, DIST_NORMAL, 1.0f / sqrtf((float)I)));
    snprintf(suffix, sizeof(suffix), "%sdown_proj.weight", mlp);
    ADD(suffix, t, 2, H, I, 0);
    free(t);
}

/* A MoE layer's tensors: the router, the shared expert and its gate, the
 * experts (per expert or fused 3-D; the same random streams either way). */
static void gen_moe(const opts_t *o, writer_t *w, const char *pfx, uint32_t l)
{
    const uint64_t H = o->hidden, E = o->experts, Im = o->moe_inter, Is = o->shared_inter;
    const float sh = 1.0f / sqrtf((float)H);
    char name[256];
    float *t, *gu = NULL, *dn = NULL;

    CHECK(t = make(o, w, E * H, DIST_NORMAL, 4.0f * sh));
    ADD("mlp.gate.weight", t, 2, E, H, 0);
    free(t);
    if (Is > 0) {
        gen_mlp(o, w, pfx, l, "mlp.shared_expert.", Is);
        CHECK(t = make(o, w, H, DIST_NORMAL, sh));
        ADD("mlp.shared_expert_gate.weight", t, 2, 1, H, 0);
        free(t);
    }
    if (o->fused_experts) {
        CHECK(gu = malloc(E * 2 * Im * H * sizeof(float)));
        CHECK(dn = malloc(E * H * Im * sizeof(float)));
    }
    for (uint64_t x = 0; x < E; x++) {
        char sfx[96];
        const char *part[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int p = 0; p < 3; p++) {
            const uint64_t rows = p < 2 ? Im : H, cols = p < 2 ? H : Im;
            CHECK(t = make(o, w, rows * cols, DIST_NORMAL, 1.0f / sqrtf((float)cols)));
            if (o->fused_experts) {
                float *dst = p < 2 ? gu + (x * 2 + (uint64_t)p) * Im * H : dn + x * H * Im;
                memcpy(dst, t, rows * cols * sizeof(float));
            } else {
                snprintf(sfx, sizeof(sfx), "mlp.experts.%llu.%s.weight", (unsigned long long)x,
                         part[p]);
                ADD(sfx, t, 2, rows, cols, 0);
            }
            free(t);
        }
    }
    if (o->fused_experts) {
        ADD("mlp.experts.gate_up_proj", gu, 3, E, 2 * Im, H);
        ADD("mlp.experts.down_proj", dn, 3, E, H, Im);
        free(gu);
        free(dn);
    }
}

static void gen_layer(const opts_t *o, writer_t *w, const char *pfx, uint32_t l, bool full)
{
    const uint64_t H = o->hidden, I = o->inter;
    const float sh = 1.0f / sqrtf((float)H);
    char name[256];
    float *t;

    /* The same logical order for every naming keeps the random streams equal. */
    CHECK(t = make(o, w, H, DIST_NORMAL, 0.1f));
    ADD("input_layernorm.weight", t, 1, H, 0, 0);
    free(t);
    CHECK(t = make(o, w, H, DIST_NORMAL, 0.1f));
    ADD("post_attention_layernorm.weight", t, 1, H, 0, 0);
    free(t);
    if (layer_moe(o, l)) {
        gen_moe(o, w, pfx, l);
    } else {
        gen_mlp(o, w, pfx, l, "mlp.", I);
    }

    if (full) {
        const uint64_t nh = o->heads, nkv = o->kv_heads, hd = o->head_dim;
        CHECK(t = make(o, w, nh * 2 * hd * H, DIST_NORMAL, sh));
        ADD("self_attn.q_proj.weight", t, 2, nh * 2 * hd, H, 0);
        free(t);
        CHECK(t = make(o, w, nkv * hd * H, DIST_NORMAL, sh));
        ADD("self_attn.k_proj.weight", t, 2, nkv * hd, H, 0);
        free(t);
        CHECK(t = make(o, w, nkv * hd * H, DIST_NORMAL, sh));
        ADD("self_attn.v_proj.weight", t, 2, nkv * hd, H, 0);
        free(t);
        CHECK(t = make(o, w, H * nh * hd, DIST_NORMAL, 1.0f / sqrtf((float)(nh * hd))));
        ADD("self_attn.o_proj.weight", t, 2, H, nh * hd, 0);
        free(t);
        CHECK(t = make(o, w, hd, DIST_NORMAL, 0.1f));
        ADD("self_attn.q_norm.weight", t, 1, hd, 0, 0);
        free(t);
        CHECK(t = make(o, w, hd, DIST_NORMAL, 0.1f));
        ADD("self_attn.k_norm.weight", t, 1, hd, 0, 0);
        free(t);
        return;
    }

    const uint64_t nk = o->lk_heads, nv = o->lv_heads, dk = o->lk_dim, dv = o->lv_dim;
    const uint64_t r = nv / nk, conv_dim = 2 * nk * dk + nv * dv;
    float *q, *k, *v, *z, *b, *a;
    CHECK(q = make(o, w, nk * dk * H, DIST_NORMAL, sh));
    CHECK(k = make(o, w, nk * dk * H, DIST_NORMAL, sh));
    CHECK(v = make(o, w, nv * dv * H, DIST_NORMAL, sh));
    CHECK(z = make(o, w, nv * dv * H, DIST_NORMAL, sh));
    CHECK(b = make(o, w, nv * H, DIST_NORMAL, sh));
    CHECK(a = make(o, w, nv * H, DIST_NORMAL, sh));
    if (o->arch == HPD_ARCH_QWEN3_NEXT) {
        const uint64_t group = 2 * dk + 2 * r * dv;
        float *qkvz, *ba;
        CHECK(qkvz = malloc(nk * group * H * sizeof(float)));
        CHECK(ba = malloc(nk * 2 * r * H * sizeof(float)));
        for (uint64_t g = 0; g < nk; g++) {
            float *dst = qkvz + g * group * H;
            memcpy(dst, q + g * dk * H, dk * H * sizeof(float));
            memcpy(dst + dk * H, k + g * dk * H, dk * H * sizeof(float));
            memcpy(dst + 2 * dk * H, v + g * r * dv * H, r * dv * H * sizeof(float));
            memcpy(dst + (2 * dk + r * dv) * H, z + g * r * dv * H, r * dv * H * sizeof(float));
            memcpy(ba + g * 2 * r * H, b + g * r * H, r * H * sizeof(float));
            memcpy(ba + (g * 2 * r + r) * H, a + g * r * H, r * H * sizeof(float));
        }
        ADD("linear_attn.in_proj_qkvz.weight", qkvz, 2, nk * group, H, 0);
        ADD("linear_attn.in_proj_ba.weight", ba, 2, nk * 2 * r, H, 0);
        free(qkvz);
        free(ba);
    } else {
        float *qkv;
        CHECK(qkv = malloc(conv_dim * H * sizeof(float)));
        memcpy(qkv, q, nk * dk * H * sizeof(float));
        memcpy(qkv + nk * dk * H, k, nk * dk * H * sizeof(float));
        memcpy(qkv + 2 * nk * dk * H, v, nv * dv * H * sizeof(float));
        ADD("linear_attn.in_proj_qkv.weight", qkv, 2, conv_dim, H, 0);
        ADD("linear_attn.in_proj_z.weight", z, 2, nv * dv, H, 0);
        ADD("linear_attn.in_proj_b.weight", b, 2, nv, H, 0);
        ADD("linear_attn.in_proj_a.weight", a, 2, nv, H, 0);
        free(qkv);
    }
    free(q);
    free(k);
    free(v);
    free(z);
    free(b);
    free(a);
    CHECK(t = make(o, w, conv_dim * o->conv_kernel, DIST_NORMAL,
                   1.0f / sqrtf((float)o->conv_kernel)));
    ADD("linear_attn.conv1d.weight", t, 3, conv_dim, 1, o->conv_kernel);
    free(t);
    CHECK(t = make(o, w, nv, DIST_LOG_UNIFORM, 1.9f));
    ADD("linear_attn.A_log", t, 1, nv, 0, 0);
    free(t);
    CHECK(t = make(o, w, nv, DIST_ONE_PLUS, 0.1f));
    ADD("linear_attn.dt_bias", t, 1, nv, 0, 0);
    free(t);
    CHECK(t = make(o, w, dv, DIST_ONE_PLUS, 0.1f));
    ADD("linear_attn.norm.weight", t, 1, dv, 0, 0);
    free(t);
    CHECK(t = make(o, w, H * nv * dv, DIST_NORMAL, 1.0f / sqrtf((float)(nv * dv))));
    ADD("linear_attn.out_proj.weight", t, 2, H, nv * dv, 0);
    free(t);
}

static json_t *text_config(const opts_t *o)
{
    json_t *c = json_object();
    json_t *types = json_array();
    const char *mt = o->arch == HPD_ARCH_QWEN3_NEXT ? "qwen3_next"
                     : o->moe_family               ? "qwen3_5_moe_text"
                                                   : "qwen3_5_text";

    for (uint32_t i = 0; i < o->layers; i++)
        json_array_append_new(types, json_string((i + 1) % o->full_interval == 0
                                                     ? "full_attention"
                                                     : "linear_attention"));
    json_object_set_new(c, "model_type", json_string(mt));
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    if (!o->moe_family) /* Qwen3.5-MoE has none: every layer is sparse */
        json_object_set_new(c, "intermediate_size", json_integer(o->inter));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "full_attention_interval", json_integer(o->full_interval));
    if (!o->interval_only)
        json_object_set_new(c, "layer_types", types);
    else
        json_decref(types);
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->kv_heads));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "linear_num_key_heads", json_integer(o->lk_heads));
    json_object_set_new(c, "linear_num_value_heads", json_integer(o->lv_heads));
    json_object_set_new(c, "linear_key_head_dim", json_integer(o->lk_dim));
    json_object_set_new(c, "linear_value_head_dim", json_integer(o->lv_dim));
    json_object_set_new(c, "linear_conv_kernel_dim", json_integer(o->conv_kernel));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->max_pos));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "rope_parameters",
                        json_pack("{s:s, s:f, s:f}", "rope_type", "default", "rope_theta",
                                  (double)o->rope_theta, "partial_rotary_factor",
                                  (double)o->partial_rotary));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(o->tie));
    if (o->arch == HPD_ARCH_QWEN3_NEXT || o->moe_family)
        json_object_set_new(c, "num_experts", json_integer(o->experts));
    if (o->experts > 0) {
        json_object_set_new(c, "num_experts_per_tok", json_integer(o->top_k));
        json_object_set_new(c, "moe_intermediate_size", json_integer(o->moe_inter));
        json_object_set_new(c, "shared_expert_intermediate_size", json_integer(o->shared_inter));
    }
    if (o->arch == HPD_ARCH_QWEN3_NEXT) {
        json_object_set_new(c, "norm_topk_prob", json_boolean(!o->no_norm_topk));
        json_object_set_new(c, "decoder_sparse_step", json_integer(o->sparse_step));
        json_t *only = json_array();
        for (uint32_t l = 0; l < o->layers; l++)
            if (o->experts > 0 && (l + 1) % o->sparse_step == 0 && !layer_moe(o, l))
                json_array_append_new(only, json_integer(l));
        json_object_set_new(c, "mlp_only_layers", only);
        json_object_set_new(c, "architectures", json_pack("[s]", "Qwen3NextForCausalLM"));
    } else {
        json_object_set_new(c, "architectures",
                            json_pack("[s]", o->moe_family ? "Qwen3_5MoeForCausalLM"
                                                           : "Qwen3_5ForCausalLM"));
    }
    json_object_set_new(c, "torch_dtype", json_string(o->dtype == HPD_DTYPE_F32   ? "float32"
                                                      : o->dtype == HPD_DTYPE_F16 ? "float16"
                                                                                  : "bfloat16"));
    return c;
}

/* eos_token_id as a JSON list from "1,2" (NULL: not valid). */
static json_t *eos_list(const char *text, uint32_t vocab)
{
    int32_t *ids;
    size_t n;
    char err[160];
    if (hpd_parse_id_list(text, &ids, &n, err, sizeof(err)) != HPD_OK) {
        fprintf(stderr, "hpd-mkmodel: --eos: %s\n", err);
        return NULL;
    }
    json_t *a = json_array();
    for (size_t i = 0; i < n && a != NULL; i++) {
        if ((uint32_t)ids[i] >= vocab) {
            fprintf(stderr, "hpd-mkmodel: --eos: %d is not below the vocabulary (%u)\n", ids[i],
                    vocab);
            json_decref(a);
            a = NULL;
        } else {
            json_array_append_new(a, json_integer(ids[i]));
        }
    }
    free(ids);
    return a;
}

static int write_config(const opts_t *o)
{
    char path[4096];
    json_t *cfg = text_config(o);
    int rc;

    if (o->eos != NULL || o->sampling) {
        json_t *gen = json_object();
        if (o->eos != NULL) {
            json_t *eos = eos_list(o->eos, o->vocab);
            if (eos == NULL) {
                json_decref(gen);
                json_decref(cfg);
                return -1;
            }
            json_object_set(cfg, "eos_token_id", eos);
            json_object_set_new(gen, "eos_token_id", eos);
        }
        if (o->sampling) {
            json_object_set_new(gen, "do_sample", json_true());
            json_object_set_new(gen, "temperature", json_real(o->gen_temperature));
            json_object_set_new(gen, "top_p", json_real(o->gen_top_p));
            json_object_set_new(gen, "top_k", json_integer(o->gen_top_k));
        }
        snprintf(path, sizeof(path), "%s/generation_config.json", o->out);
        rc = json_dump_file(gen, path, JSON_INDENT(2));
        json_decref(gen);
        if (rc != 0) {
            fprintf(stderr, "hpd-mkmodel: cannot write %s\n", path);
            json_decref(cfg);
            return rc;
        }
    }

    json_t *quant = o->fp8_block == 0
                        ? NULL
                        : json_pack("{s:s, s:s, s:s, s:[i,i], s:[s,s,s,s]}", "quant_method",
                                    "fp8", "fmt", "e4m3", "activation_scheme", "dynamic",
                                    "weight_block_size", (int)o->fp8_block, (int)o->fp8_block,
                                    "modules_to_not_convert", "lm_head", "embed_tokens",
                                    "mlp.gate", "shared_expert_gate");
    if (o->arch == HPD_ARCH_QWEN3_5) {
        json_t *top = json_object();
        json_object_set_new(top, "model_type",
                            json_string(o->moe_family ? "qwen3_5_moe" : "qwen3_5"));
        json_object_set_new(top, "architectures",
                            json_pack("[s]", o->moe_family ? "Qwen3_5MoeForConditionalGeneration"
                                                           : "Qwen3_5ForConditionalGeneration"));
        json_object_set_new(top, "tie_word_embeddings", json_boolean(o->tie));
        json_object_del(cfg, "tie_word_embeddings");
        json_object_set_new(top, "text_config", cfg);
        cfg = top;
    }
    if (quant != NULL)
        json_object_set_new(cfg, "quantization_config", quant);
    snprintf(path, sizeof(path), "%s/config.json", o->out);
    rc = json_dump_file(cfg, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cfg);
    if (rc != 0)
        fprintf(stderr, "hpd-mkmodel: cannot write %s\n", path);
    return rc;
}

/* The text the models' tokenizer is trained on: a few languages, code,
 * numbers and the chat markers, so that every script the tests use has
 * merges. */
static const char SAMPLE[] =
    "The quick brown fox jumps over the lazy dog. Hello, world! This is a small random model "
    "that answers with random words, through the real path of the cluster: text, tokens, "
    "prefill, the push of its pages, decode, and text again. What is the capital of France? "
    "Paris is the capital of France. The weather is nice today; let's go for a walk in the "
    "park. I think, therefore I am. To be, or not to be, that is the question.\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026 3.14159\n"
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n"
    "Grüße aus München! Le café était très bon. ¿Dónde está la biblioteca?\n"
    "Привет, мир! Как дела? 你好，世界！今天天气很好。こんにちは、世界。안녕하세요.\n"
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi there! How can I help "
    "you today?<|im_end|>\n";

/* tokenizer.json (a byte-level BPE of the model's vocabulary, trained on
 * SAMPLE, the chat tokens on the last ids) and tokenizer_config.json; none
 * for a vocabulary too small to hold the 256 bytes. */
static int write_tokenizer(const opts_t *o)
{
    static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    char path[4096];
    if (o->vocab < 256 + 3 + 1)
        return 0;
    snprintf(path, sizeof(path), "%s/tokenizer.json", o->out);
    if (hpd_tokenizer_train(path, SAMPLE, sizeof(SAMPLE) - 1, o->vocab, specials, 3) != HPD_OK)
        return -1;
    json_t *cfg = json_pack("{s:s, s:s, s:s, s:i, s:s}", "tokenizer_class", "Qwen2Tokenizer",
                            "eos_token", "<|im_end|>", "pad_token", "<|endoftext|>",
                            "model_max_length", (int)o->max_pos, "chat_template",
                            hpd_chat_template_qwen35);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", o->out);
    const int rc = json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
    if (rc != 0)
        fprintf(stderr, "hpd-mkmodel: cannot write %s\n", path);
    return rc;
}

static int write_weights(const opts_t *o, writer_t *w)
{
    char path[4096];

    if (o->shards <= 1) {
        snprintf(path, sizeof(path), "%s/model.safetensors", o->out);
        return hpd_st_write(path, w->t, w->n) == HPD_OK ? 0 : -1;
    }
    json_t *index = json_object(), *map = json_object();
    const size_t per = (w->n + o->shards - 1) / o->shards;
    for (uint32_t s = 0; s < o->shards; s++) {
        const size_t b = s * per, e = b + per < w->n ? b + per : w->n;
        char file[64];
        snprintf(file, sizeof(file), "model-%05u-of-%05u.safetensors", s + 1, o->shards);
        snprintf(path, sizeof(path), "%s/%s", o->out, file);
        if (hpd_st_write(path, w->t + b, e > b ? e - b : 0) != HPD_OK)
            return -1;
        for (size_t i = b; i < e; i++)
            json_object_set_new(map, w->t[i].name, json_string(file));
    }
    json_object_set_new(index, "metadata", json_object());
    json_object_set_new(index, "weight_map", map);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", o->out);
    int rc = json_dump_file(index, path, JSON_INDENT(2));
    json_decref(index);
    return rc;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: hpd-mkmodel --out DIR [options]\n"
            "  --seed N              random seed (1)\n"
            "  --arch A              qwen3_next | qwen3_5_text | qwen3_5 | qwen3_5_moe_text |\n"
            "                        qwen3_5_moe (qwen3_next)\n"
            "  --dtype D             f32 | bf16 | f16 (bf16)\n"
            "  --experts N           a mixture of experts of N (0: dense; qwen3_5_moe: 8)\n"
            "  --experts-per-tok K (2) --moe-intermediate N (64) --shared-intermediate N (64,\n"
            "                        0: no shared expert)  --fused-experts (3-D expert tensors)\n"
            "  --sparse-step N (1) --mlp-only-layers 0,3 --no-norm-topk   (qwen3_next)\n"
            "  --fp8 B               an FP8 release: projection weights F8_E4M3 in BxB blocks\n"
            "                        with weight_scale_inv, quantization_config (128 is theirs)\n"
            "  --round-to D          round every value to D first: --dtype f32 --round-to bf16\n"
            "                        stores a bf16 model's weights widened to F32\n"
            "  --hidden N (256) --layers N (8) --full-interval N (4) --intermediate N (512)\n"
            "  --vocab N (1024) --heads N (4) --kv-heads N (2) --head-dim N (64)\n"
            "  --lin-k-heads N (2) --lin-v-heads N (4) --lin-k-dim N (64) --lin-v-dim N (64)\n"
            "  --conv-kernel N (4) --rope-theta F (10000000) --partial-rotary F (0.25)\n"
            "  --max-pos N (32768) --tie  --shards N (1)\n"
            "  --interval-only       write full_attention_interval without layer_types\n"
            "  --eos ID[,ID]         end-of-sequence ids: eos_token_id in config.json and a\n"
            "                        generation_config.json (none by default)\n"
            "  --sampling T,P,K      generation_config.json's default temperature, top_p and\n"
            "                        top_k (none by default: greedy)\n");
}

int main(int argc, char **argv)
{
    opts_t o = {.seed = 1, .arch = HPD_ARCH_QWEN3_NEXT, .dtype = HPD_DTYPE_BF16,
                .hidden = 256, .layers = 8, .full_interval = 4, .inter = 512, .vocab = 1024,
                .heads = 4, .kv_heads = 2, .head_dim = 64, .lk_heads = 2, .lv_heads = 4,
                .lk_dim = 64, .lv_dim = 64, .conv_kernel = 4, .shards = 1, .max_pos = 32768,
                .rope_theta = 10000000.0f, .partial_rotary = 0.25f, .top_k = 2, .moe_inter = 64,
                .shared_inter = 64, .sparse_step = 1};
    static const struct option longopts[] = {
        {"out", 1, 0, 'o'}, {"seed", 1, 0, 's'}, {"arch", 1, 0, 'a'}, {"dtype", 1, 0, 'd'},
        {"hidden", 1, 0, 1}, {"layers", 1, 0, 2}, {"full-interval", 1, 0, 3},
        {"intermediate", 1, 0, 4}, {"vocab", 1, 0, 5}, {"heads", 1, 0, 6},
        {"kv-heads", 1, 0, 7}, {"head-dim", 1, 0, 8}, {"lin-k-heads", 1, 0, 9},
        {"lin-v-heads", 1, 0, 10}, {"lin-k-dim", 1, 0, 11}, {"lin-v-dim", 1, 0, 12},
        {"conv-kernel", 1, 0, 13}, {"rope-theta", 1, 0, 14}, {"partial-rotary", 1, 0, 15},
        {"max-pos", 1, 0, 16}, {"tie", 0, 0, 17}, {"shards", 1, 0, 18},
        {"interval-only", 0, 0, 19}, {"eos", 1, 0, 20}, {"sampling", 1, 0, 21},
        {"round-to", 1, 0, 22}, {"experts", 1, 0, 23}, {"experts-per-tok", 1, 0, 24},
        {"moe-intermediate", 1, 0, 25}, {"shared-intermediate", 1, 0, 26},
        {"sparse-step", 1, 0, 27}, {"fused-experts", 0, 0, 28}, {"mlp-only-layers", 1, 0, 29},
        {"no-norm-topk", 0, 0, 30}, {"fp8", 1, 0, 31}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    uint32_t *u32opt[] = {NULL, &o.hidden, &o.layers, &o.full_interval, &o.inter, &o.vocab,
                          &o.heads, &o.kv_heads, &o.head_dim, &o.lk_heads, &o.lv_heads,
                          &o.lk_dim, &o.lv_dim, &o.conv_kernel};
    writer_t w = {0};
    int c;
    uint64_t v;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c >= 1 && c <= 13) {
            if (hpd_parse_u64(optarg, 1, 1u << 20, &v) != 0) {
                fprintf(stderr, "hpd-mkmodel: --%s '%s' must be an integer from 1 to %u\n",
                        longopts[c + 3].name, optarg, 1u << 20);
                return 2;
            }
            *u32opt[c] = (uint32_t)v;
            continue;
        }
        switch (c) {
        case 'o': o.out = optarg; break;
        case 's':
            if (hpd_parse_u64(optarg, 0, UINT64_MAX, &o.seed) != 0) {
                fprintf(stderr, "hpd-mkmodel: --seed '%s' is not a number\n", optarg);
                return 2;
            }
            break;
        case 'a':
            if (strcmp(optarg, "qwen3_next") == 0)
                o.arch = HPD_ARCH_QWEN3_NEXT;
            else if (strcmp(optarg, "qwen3_5_text") == 0)
                o.arch = HPD_ARCH_QWEN3_5_TEXT;
            else if (strcmp(optarg, "qwen3_5") == 0)
                o.arch = HPD_ARCH_QWEN3_5;
            else if (strcmp(optarg, "qwen3_5_moe_text") == 0)
                o.arch = HPD_ARCH_QWEN3_5_TEXT, o.moe_family = 1;
            else if (strcmp(optarg, "qwen3_5_moe") == 0)
                o.arch = HPD_ARCH_QWEN3_5, o.moe_family = 1;
            else {
                fprintf(stderr,
                        "hpd-mkmodel: --arch '%s' (expected qwen3_next, qwen3_5_text, qwen3_5, "
                        "qwen3_5_moe_text, qwen3_5_moe)\n",
                        optarg);
                return 2;
            }
            break;
        case 'd':
        case 22:
            if (hpd_dtype_parse(optarg, c == 'd' ? &o.dtype : &o.round_to) != 0) {
                fprintf(stderr, "hpd-mkmodel: --%s '%s' (expected f32, bf16 or f16)\n",
                        c == 'd' ? "dtype" : "round-to", optarg);
                return 2;
            }
            break;
        case 14:
        case 15:
            if (hpd_parse_float(optarg, c == 14 ? &o.rope_theta : &o.partial_rotary) != 0) {
                fprintf(stderr, "hpd-mkmodel: '%s' is not a number\n", optarg);
                return 2;
            }
            break;
        case 16:
        case 18:
            if (hpd_parse_u64(optarg, 1, 1u << 30, &v) != 0) {
                fprintf(stderr, "hpd-mkmodel: '%s' must be a positive integer\n", optarg);
                return 2;
            }
            *(c == 16 ? &o.max_pos : &o.shards) = (uint32_t)v;
            break;
        case 17: o.tie = 1; break;
        case 19: o.interval_only = 1; break;
        case 20: o.eos = optarg; break;
        case 23:
        case 24:
        case 25:
        case 26:
        case 27: {
            uint32_t *dst[] = {&o.experts, &o.top_k, &o.moe_inter, &o.shared_inter,
                               &o.sparse_step};
            if (hpd_parse_u64(optarg, c == 26 || c == 23 ? 0 : 1, 1024, &v) != 0) {
                fprintf(stderr, "hpd-mkmodel: --%s '%s' must be an integer up to 1024\n",
                        longopts[c + 3].name, optarg);
                return 2;
            }
            *dst[c - 23] = (uint32_t)v;
            break;
        }
        case 28: o.fused_experts = 1; break;
        case 29: o.mlp_only = optarg; break;
        case 30: o.no_norm_topk = 1; break;
        case 31:
            if (hpd_parse_u64(optarg, 1, 4096, &v) != 0) {
                fprintf(stderr, "hpd-mkmodel: --fp8 '%s' must be a block size from 1 to 4096\n",
                        optarg);
                return 2;
            }
            o.fp8_block = (uint32_t)v;
            break;
        case 21: {
            char *end;
            unsigned long k = 0;
            o.sampling = true;
            o.gen_temperature = strtof(optarg, &end);
            if (*end == ',')
                o.gen_top_p = strtof(end + 1, &end);
            if (*end == ',' && end[1] >= '0' && end[1] <= '9')
                k = strtoul(end + 1, &end, 10);
            else
                end = optarg; /* malformed */
            if (*end != '\0' || !(o.gen_temperature >= 0) ||
                !(o.gen_top_p > 0 && o.gen_top_p <= 1) ||
                k > 1u << 30) {
                fprintf(stderr, "hpd-mkmodel: --sampling '%s' (expected T,P,K: temperature >= 0, "
                        "top_p in (0, 1], top_k >= 0)\n", optarg);
                return 2;
            }
            o.gen_top_k = (uint32_t)k;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (o.out == NULL || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (o.moe_family && o.experts == 0)
        o.experts = 8;
    if (o.experts > 0 && o.arch != HPD_ARCH_QWEN3_NEXT)
        o.moe_family = 1; /* Qwen3.5 with experts is Qwen3.5-MoE */
    if (o.experts > 0 && o.top_k > o.experts) {
        fprintf(stderr, "hpd-mkmodel: --experts-per-tok %u exceeds --experts %u\n", o.top_k,
                o.experts);
        return 2;
    }
    if (o.lv_heads % o.lk_heads != 0 || o.heads % o.kv_heads != 0) {
        fprintf(stderr, "hpd-mkmodel: value heads must be a multiple of key heads, and "
                        "attention heads of kv heads\n");
        return 2;
    }
    if (make_dirs(o.out) != 0) {
        fprintf(stderr, "hpd-mkmodel: cannot create %s: %s\n", o.out, strerror(errno));
        return 1;
    }
    w.dtype = o.dtype;
    w.fp8_block = o.fp8_block;
    const char *pfx = o.arch == HPD_ARCH_QWEN3_5 ? "model.language_model." : "model.";
    char name[128];
    float *t;
    CHECK(t = make(&o, &w, (uint64_t)o.vocab * o.hidden, DIST_NORMAL, 1.0f));
    snprintf(name, sizeof(name), "%sembed_tokens.weight", pfx);
    CHECK(add(&w, name, t, 2, o.vocab, o.hidden, 0) == 0);
    free(t);
    for (uint32_t l = 0; l < o.layers; l++)
        gen_layer(&o, &w, pfx, l, (l + 1) % o.full_interval == 0);
    CHECK(t = make(&o, &w, o.hidden, DIST_NORMAL, 0.1f));
    snprintf(name, sizeof(name), "%snorm.weight", pfx);
    CHECK(add(&w, name, t, 1, o.hidden, 0, 0) == 0);
    free(t);
    CHECK(t = make(&o, &w, (uint64_t)o.vocab * o.hidden, DIST_NORMAL,
                   3.0f / sqrtf((float)o.hidden)));
    if (!o.tie)
        CHECK(add(&w, "lm_head.weight", t, 2, o.vocab, o.hidden, 0) == 0);
    free(t);

    int rc = write_config(&o) == 0 && write_weights(&o, &w) == 0 && write_tokenizer(&o) == 0
                 ? 0
                 : 1;
    for (size_t i = 0; i < w.n; i++) {
        free((void *)w.t[i].name);
        free(w.bufs[i]);
    }
    free(w.t);
    free(w.bufs);
    return rc;
}
