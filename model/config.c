#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

#define LOG_COMPONENT "model"

const char *hpd_model_arch_name(hpd_model_arch_t arch)
{
    switch (arch) {
    case HPD_ARCH_QWEN3_NEXT: return "qwen3_next";
    case HPD_ARCH_QWEN3_5_TEXT: return "qwen3_5_text";
    case HPD_ARCH_QWEN3_5: return "qwen3_5";
    }
    return "?";
}

uint64_t hpd_model_config_gdn_layer_bytes(const hpd_model_config_t *c)
{
    return 4ull * ((uint64_t)c->lin_n_v_heads * c->lin_k_dim * c->lin_v_dim +
                   (uint64_t)c->conv_dim * (c->conv_kernel - 1));
}

/* Looks a field up in the text config first, then in the top-level object
 * (Qwen3.5 keeps some fields, e.g. tie_word_embeddings, at the top). */
static json_t *field(json_t *text, json_t *top, const char *name)
{
    json_t *v = json_object_get(text, name);
    if (v == NULL && top != NULL && top != text)
        v = json_object_get(top, name);
    return v;
}

/* eos_token_id: an id or a list of ids below vocab; absent or null: none.
 * On success n_p and ids are set (ids of at most HPD_MAX_EOS). */
static hpd_status_t parse_eos(json_t *v, const char *origin, uint32_t vocab, uint32_t *n_p,
                              int32_t ids[HPD_MAX_EOS])
{
    json_t *one = NULL;
    size_t i;
    *n_p = 0;
    if (v == NULL || json_is_null(v))
        return HPD_OK;
    if (json_is_integer(v)) {
        one = v;
        v = NULL;
    }
    const size_t n = v != NULL && json_is_array(v) ? json_array_size(v) : v == NULL ? 1 : 0;
    if ((v != NULL && !json_is_array(v)) || n > HPD_MAX_EOS) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: eos_token_id must be a token id or a list of at most "
                      "%d token ids", origin, HPD_MAX_EOS);
        return HPD_ERR_FORMAT;
    }
    for (i = 0; i < n; i++) {
        json_t *x = v != NULL ? json_array_get(v, i) : one;
        const json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (id < 0 || (uint64_t)id >= vocab) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: eos_token_id entry %zu is not a token id (0 to %u)",
                          origin, i, vocab - 1);
            return HPD_ERR_FORMAT;
        }
        ids[i] = (int32_t)id;
    }
    *n_p = (uint32_t)n;
    return HPD_OK;
}

/* generation_config.json's temperature, top_p and top_k (as vLLM's
 * --generation-config auto takes them); do_sample false makes the default
 * greedy whatever the temperature says, as transformers' generate does. */
static hpd_status_t parse_gen_sampling(json_t *g, const char *origin, hpd_sampling_t *s)
{
    json_t *v;
    if ((v = json_object_get(g, "temperature")) != NULL && !json_is_null(v)) {
        const double t = json_number_value(v);
        if (!json_is_number(v) || !(t >= 0 && t <= 1e6)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: temperature must be a number in [0, 1e6]",
                          origin);
            return HPD_ERR_FORMAT;
        }
        s->temperature = (float)t;
    }
    if ((v = json_object_get(g, "top_p")) != NULL && !json_is_null(v)) {
        const double p = json_number_value(v);
        if (!json_is_number(v) || !(p > 0 && p <= 1)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: top_p must be a number in (0, 1]", origin);
            return HPD_ERR_FORMAT;
        }
        s->top_p = (float)p;
    }
    if ((v = json_object_get(g, "top_k")) != NULL && !json_is_null(v)) {
        const json_int_t k = json_is_integer(v) ? json_integer_value(v) : -1;
        if (k < 0 || k >= HPD_TOP_K_UNSET) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: top_k must be an integer >= 0 (0: off)", origin);
            return HPD_ERR_FORMAT;
        }
        s->top_k = (uint32_t)k;
    }
    v = json_object_get(g, "do_sample");
    if (v != NULL && json_is_boolean(v) && !json_is_true(v))
        s->temperature = 0;
    return HPD_OK;
}

static hpd_status_t get_u32(json_t *text, json_t *top, const char *origin, const char *name,
                            bool required, uint32_t dflt, uint32_t *out)
{
    json_t *v = field(text, top, name);

    if (v == NULL || json_is_null(v)) {
        if (required) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: missing field '%s' (expected a positive integer)",
                          origin, name);
            return HPD_ERR_FORMAT;
        }
        *out = dflt;
        return HPD_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > (json_int_t)UINT32_MAX) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: field '%s' must be a non-negative integer", origin,
                      name);
        return HPD_ERR_FORMAT;
    }
    *out = (uint32_t)json_integer_value(v);
    return HPD_OK;
}

static hpd_status_t get_float(json_t *obj, const char *origin, const char *name, bool *found,
                              float *out)
{
    json_t *v = json_object_get(obj, name);

    *found = false;
    if (v == NULL || json_is_null(v))
        return HPD_OK;
    if (!json_is_number(v)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: field '%s' must be a number", origin, name);
        return HPD_ERR_FORMAT;
    }
    *out = (float)json_number_value(v);
    *found = true;
    return HPD_OK;
}

/* A number field of a rope map; absent or null: *out unchanged, *found
 * false. */
static hpd_status_t get_number(json_t *p, const char *origin, const char *name, bool *found,
                               double *out)
{
    json_t *v = json_object_get(p, name);
    *found = false;
    if (v == NULL || json_is_null(v))
        return HPD_OK;
    if (!json_is_number(v)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: rope field '%s' must be a number", origin, name);
        return HPD_ERR_FORMAT;
    }
    *out = json_number_value(v);
    *found = true;
    return HPD_OK;
}

/* YaRN's fields, resolved in resolve_yarn once the rotary dimension is known. */
static hpd_status_t parse_yarn(json_t *p, const char *origin, hpd_model_config_t *c)
{
    bool found;
    double orig = 0;
    hpd_status_t st;
    c->yarn = true;
    c->yarn_raw_factor = 0;
    c->yarn_raw_attention = 0;
    c->yarn_beta_fast = 32;
    c->yarn_beta_slow = 1;
    c->yarn_mscale = c->yarn_mscale_all_dim = 0;
    c->yarn_truncate = true;
    c->yarn_original_max_pos = 0;
    static const struct {
        const char *name;
        size_t off;
    } nums[] = {
        {"factor", offsetof(hpd_model_config_t, yarn_raw_factor)},
        {"attention_factor", offsetof(hpd_model_config_t, yarn_raw_attention)},
        {"beta_fast", offsetof(hpd_model_config_t, yarn_beta_fast)},
        {"beta_slow", offsetof(hpd_model_config_t, yarn_beta_slow)},
        {"mscale", offsetof(hpd_model_config_t, yarn_mscale)},
        {"mscale_all_dim", offsetof(hpd_model_config_t, yarn_mscale_all_dim)},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
        if ((st = get_number(p, origin, nums[i].name, &found,
                             (double *)((char *)c + nums[i].off))) != HPD_OK)
            return st;
    if ((st = get_number(p, origin, "original_max_position_embeddings", &found, &orig)) != HPD_OK)
        return st;
    if (found && !(orig >= 1 && orig <= 1e9)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: original_max_position_embeddings %g is invalid", origin,
                      orig);
        return HPD_ERR_FORMAT;
    }
    c->yarn_original_max_pos = (uint32_t)orig;
    json_t *t = json_object_get(p, "truncate");
    if (t != NULL && !json_is_null(t)) {
        if (!json_is_boolean(t)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: rope field 'truncate' must be true or false", origin);
            return HPD_ERR_FORMAT;
        }
        c->yarn_truncate = json_is_true(t);
    }
    return HPD_OK;
}

static double yarn_mscale(double scale, double m)
{
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

static double yarn_correction_dim(double rotations, double dim, double base, double max_pos)
{
    return dim * log(max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

/* transformers' _compute_yarn_parameters, in double as Python computes its
 * scalars; the kernels apply the fp32 part (backend.h, hpd_rope_args_t). */
static hpd_status_t resolve_yarn(const char *origin, hpd_model_config_t *c)
{
    const double dim = c->rot_dim, base = c->rope_theta;
    const double orig = c->yarn_original_max_pos ? c->yarn_original_max_pos
                                                 : c->max_position_embeddings;
    double factor = c->yarn_raw_factor;
    if (factor == 0)
        factor = (double)c->max_position_embeddings / orig;
    if (!(factor > 0) || !(orig > 0)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: yarn factor %g / original_max_position_embeddings %g "
                      "invalid (expected positive)", origin, factor, orig);
        return HPD_ERR_FORMAT;
    }
    double attn = c->yarn_raw_attention;
    if (attn == 0)
        attn = c->yarn_mscale != 0 && c->yarn_mscale_all_dim != 0
                   ? yarn_mscale(factor, c->yarn_mscale) / yarn_mscale(factor, c->yarn_mscale_all_dim)
                   : yarn_mscale(factor, 1);
    double low = yarn_correction_dim(c->yarn_beta_fast, dim, base, orig);
    double high = yarn_correction_dim(c->yarn_beta_slow, dim, base, orig);
    if (c->yarn_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high)
        high += 0.001; /* as transformers' linear_ramp_factor */
    c->yarn_factor = (float)factor;
    c->yarn_low = (float)low;
    c->yarn_span = (float)(high - low);
    c->yarn_attention = (float)attn;
    return HPD_OK;
}

static hpd_status_t parse_rope(json_t *text, json_t *top, const char *origin,
                               hpd_model_config_t *c)
{
    json_t *params = field(text, top, "rope_parameters");
    json_t *scaling = field(text, top, "rope_scaling");
    bool found;
    hpd_status_t st;

    c->rope_theta = 10000.0f;
    c->partial_rotary_factor = 1.0f;
    if ((st = get_float(text, origin, "rope_theta", &found, &c->rope_theta)) != HPD_OK)
        return st;
    if ((st = get_float(text, origin, "partial_rotary_factor", &found,
                        &c->partial_rotary_factor)) != HPD_OK)
        return st;
    for (int i = 0; i < 2; i++) {
        json_t *p = i == 0 ? params : scaling;
        json_t *type;

        if (p == NULL || json_is_null(p))
            continue;
        if (!json_is_object(p)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: field '%s' must be an object", origin,
                          i == 0 ? "rope_parameters" : "rope_scaling");
            return HPD_ERR_FORMAT;
        }
        type = json_object_get(p, "rope_type");
        if (type == NULL)
            type = json_object_get(p, "type");
        const char *name = json_is_string(type) ? json_string_value(type) : NULL;
        if (type != NULL && (name == NULL || (strcmp(name, "default") != 0 &&
                                              strcmp(name, "yarn") != 0))) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: rope type '%s' is not supported (expected "
                          "\"default\" or \"yarn\")", origin, name != NULL ? name : "?");
            return HPD_ERR_UNSUPPORTED;
        }
        if (name != NULL && strcmp(name, "yarn") == 0 &&
            (st = parse_yarn(p, origin, c)) != HPD_OK)
            return st;
        if ((st = get_float(p, origin, "rope_theta", &found, &c->rope_theta)) != HPD_OK)
            return st;
        if ((st = get_float(p, origin, "partial_rotary_factor", &found,
                            &c->partial_rotary_factor)) != HPD_OK)
            return st;
    }
    return HPD_OK;
}

static hpd_status_t parse_layer_types(json_t *text, json_t *top, const char *origin,
                                      hpd_model_config_t *c)
{
    json_t *types = field(text, top, "layer_types");
    uint32_t interval;
    hpd_status_t st;

    if (types != NULL && !json_is_null(types)) {
        if (!json_is_array(types) || json_array_size(types) != c->n_layers) {
            HPD_LOG_ERROR(LOG_COMPONENT,
                          "%s: 'layer_types' must be an array of num_hidden_layers=%u strings",
                          origin, c->n_layers);
            return HPD_ERR_FORMAT;
        }
        for (uint32_t i = 0; i < c->n_layers; i++) {
            const char *t = json_string_value(json_array_get(types, i));
            if (t != NULL && strcmp(t, "full_attention") == 0)
                c->layer_full[i] = true;
            else if (t != NULL && strcmp(t, "linear_attention") == 0)
                c->layer_full[i] = false;
            else {
                HPD_LOG_ERROR(LOG_COMPONENT,
                              "%s: layer_types[%u] is '%s' (expected \"full_attention\" or "
                              "\"linear_attention\")",
                              origin, i, t ? t : "not a string");
                return HPD_ERR_FORMAT;
            }
        }
        return HPD_OK;
    }
    if ((st = get_u32(text, top, origin, "full_attention_interval", true, 0, &interval)) !=
        HPD_OK)
        return st;
    if (interval == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: full_attention_interval must be at least 1", origin);
        return HPD_ERR_FORMAT;
    }
    for (uint32_t i = 0; i < c->n_layers; i++)
        c->layer_full[i] = (i + 1) % interval == 0;
    return HPD_OK;
}

/* The mixture of experts, as transformers builds it: Qwen3-Next's layer l
 * is sparse when l is not in mlp_only_layers, num_experts > 0 and
 * (l + 1) % decoder_sparse_step == 0 (a config without num_experts is taken
 * as dense here; every released one states it); Qwen3.5-MoE's every layer,
 * always renormalising the top-k weights. The sizes default as in
 * transformers' configuration classes. */
static hpd_status_t parse_moe(json_t *text, json_t *top, const char *origin,
                              hpd_model_config_t *c)
{
    const bool next = c->arch == HPD_ARCH_QWEN3_NEXT;
    uint32_t step = 1;
    hpd_status_t st;

    if ((st = get_u32(text, top, origin, "num_experts", false, c->moe_family ? 256 : 0,
                      &c->n_experts)) != HPD_OK)
        return st;
    if (c->n_experts == 0)
        return HPD_OK;
    if ((st = get_u32(text, top, origin, "num_experts_per_tok", false, next ? 10 : 8,
                      &c->top_k)) != HPD_OK ||
        (st = get_u32(text, top, origin, "moe_intermediate_size", false, 512, &c->moe_inter)) !=
            HPD_OK ||
        (st = get_u32(text, top, origin, "shared_expert_intermediate_size", false, 512,
                      &c->shared_inter)) != HPD_OK ||
        (next && (st = get_u32(text, top, origin, "decoder_sparse_step", false, 1, &step)) !=
                     HPD_OK))
        return st;
    json_t *norm = field(text, top, "norm_topk_prob");
    if (norm != NULL && !json_is_boolean(norm)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: field 'norm_topk_prob' must be true or false", origin);
        return HPD_ERR_FORMAT;
    }
    c->norm_topk = !next || norm == NULL || json_is_true(norm);
    if (c->n_experts > HPD_MAX_EXPERTS || c->top_k == 0 || c->top_k > c->n_experts ||
        c->top_k > HPD_MAX_TOPK || c->moe_inter == 0 || step == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: num_experts=%u, num_experts_per_tok=%u, moe_intermediate_size=%u, "
                      "decoder_sparse_step=%u (expected 1 to %d experts, 1 to min(experts, %d) "
                      "per token, positive sizes)",
                      origin, c->n_experts, c->top_k, c->moe_inter, step, HPD_MAX_EXPERTS,
                      HPD_MAX_TOPK);
        return HPD_ERR_FORMAT;
    }
    for (uint32_t l = 0; l < c->n_layers; l++)
        c->layer_moe[l] = !next || (l + 1) % step == 0;
    json_t *only = next ? field(text, top, "mlp_only_layers") : NULL;
    if (only != NULL && !json_is_null(only)) {
        if (!json_is_array(only)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: field 'mlp_only_layers' must be a list of layer "
                          "indices", origin);
            return HPD_ERR_FORMAT;
        }
        for (size_t i = 0; i < json_array_size(only); i++) {
            json_t *x = json_array_get(only, i);
            const json_int_t l = json_is_integer(x) ? json_integer_value(x) : -1;
            if (l < 0 || l >= c->n_layers) {
                HPD_LOG_ERROR(LOG_COMPONENT, "%s: mlp_only_layers entry %zu is not a layer "
                              "index (0 to %u)", origin, i, c->n_layers - 1);
                return HPD_ERR_FORMAT;
            }
            c->layer_moe[l] = false;
        }
    }
    for (uint32_t l = 0; l < c->n_layers; l++)
        c->n_moe_layers += c->layer_moe[l];
    return HPD_OK;
}

/* quantization_config: fp8 with its weight_block_size (the FP8 releases),
 * or none; any other method is refused by name. */
static hpd_status_t parse_quantization(json_t *text, json_t *top, const char *origin,
                                       hpd_model_config_t *c)
{
    json_t *q = field(text, top, "quantization_config");
    if (q == NULL || json_is_null(q))
        return HPD_OK;
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    if (!json_is_object(q) || method == NULL || strcmp(method, "fp8") != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: quantization_config quant_method '%s' is not "
                      "supported (expected \"fp8\" with weight_block_size)",
                      origin, method != NULL ? method : "?");
        return HPD_ERR_UNSUPPORTED;
    }
    const char *fmt = json_string_value(json_object_get(q, "fmt"));
    json_t *b = json_object_get(q, "weight_block_size");
    json_int_t r = json_is_array(b) && json_array_size(b) == 2 &&
                           json_is_integer(json_array_get(b, 0))
                       ? json_integer_value(json_array_get(b, 0))
                       : 0;
    json_int_t k = r > 0 && json_is_integer(json_array_get(b, 1))
                       ? json_integer_value(json_array_get(b, 1))
                       : 0;
    if ((fmt != NULL && strcmp(fmt, "e4m3") != 0) || r <= 0 || k <= 0 || r > 65536 ||
        k > 65536) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: quantization_config: fmt '%s', weight_block_size "
                      "(expected fmt e4m3 and [rows, cols] of positive block sizes; per-tensor "
                      "FP8 is not supported)", origin, fmt != NULL ? fmt : "e4m3");
        return HPD_ERR_UNSUPPORTED;
    }
    c->fp8_block_rows = (uint32_t)r;
    c->fp8_block_cols = (uint32_t)k;
    return HPD_OK;
}

static hpd_status_t check_supported(json_t *text, json_t *top, const char *origin)
{
    json_t *act = field(text, top, "hidden_act");
    json_t *bias = field(text, top, "attention_bias");

    if (act != NULL && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: hidden_act '%s' is not supported (expected \"silu\")",
                      origin, json_is_string(act) ? json_string_value(act) : "?");
        return HPD_ERR_UNSUPPORTED;
    }
    if (bias != NULL && json_is_true(bias)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: attention_bias=true is not supported", origin);
        return HPD_ERR_UNSUPPORTED;
    }
    return HPD_OK;
}

static hpd_status_t validate(const char *origin, hpd_model_config_t *c)
{
    const struct {
        const char *name;
        uint32_t v;
    } positive[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden_size},
        {"num_hidden_layers", c->n_layers},
        {"num_attention_heads", c->n_heads},
        {"num_key_value_heads", c->n_kv_heads},
        {"head_dim", c->head_dim},
        {"linear_num_key_heads", c->lin_n_k_heads},
        {"linear_num_value_heads", c->lin_n_v_heads},
        {"linear_key_head_dim", c->lin_k_dim},
        {"linear_value_head_dim", c->lin_v_dim},
    };
    float rot;

    for (size_t i = 0; i < HPD_ARRAY_SIZE(positive); i++) {
        if (positive[i].v == 0) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: %s must be positive", origin, positive[i].name);
            return HPD_ERR_FORMAT;
        }
    }
    if (c->n_layers > HPD_MAX_LAYERS) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: num_hidden_layers=%u exceeds the supported %d",
                      origin, c->n_layers, HPD_MAX_LAYERS);
        return HPD_ERR_UNSUPPORTED;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: num_attention_heads=%u is not a multiple of num_key_value_heads=%u",
                      origin, c->n_heads, c->n_kv_heads);
        return HPD_ERR_FORMAT;
    }
    if (c->lin_n_v_heads % c->lin_n_k_heads != 0) {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: linear_num_value_heads=%u is not a multiple of linear_num_key_heads=%u",
                      origin, c->lin_n_v_heads, c->lin_n_k_heads);
        return HPD_ERR_FORMAT;
    }
    if (c->conv_kernel < 2 || c->conv_kernel > 16) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: linear_conv_kernel_dim=%u (expected 2..16)", origin,
                      c->conv_kernel);
        return HPD_ERR_FORMAT;
    }
    if (!(c->partial_rotary_factor > 0.0f && c->partial_rotary_factor <= 1.0f)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: partial_rotary_factor=%g (expected in (0, 1])", origin,
                      c->partial_rotary_factor);
        return HPD_ERR_FORMAT;
    }
    if (!(c->rope_theta > 0.0f) || !(c->rms_norm_eps > 0.0f)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: rope_theta and rms_norm_eps must be positive", origin);
        return HPD_ERR_FORMAT;
    }
    rot = (float)c->head_dim * c->partial_rotary_factor;
    c->rot_dim = (uint32_t)rot; /* int() truncation, as HF computes it */
    if (c->rot_dim % 2 != 0 || c->rot_dim == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: rotary dimension %u (head_dim %u * %g) must be even",
                      origin, c->rot_dim, c->head_dim, c->partial_rotary_factor);
        return HPD_ERR_FORMAT;
    }
    if (c->yarn && resolve_yarn(origin, c) != HPD_OK)
        return HPD_ERR_FORMAT;
    c->n_full_layers = c->n_linear_layers = 0;
    for (uint32_t i = 0; i < c->n_layers; i++)
        c->kind_index[i] = c->layer_full[i] ? c->n_full_layers++ : c->n_linear_layers++;
    c->conv_dim = 2 * c->lin_n_k_heads * c->lin_k_dim + c->lin_n_v_heads * c->lin_v_dim;
    return HPD_OK;
}

hpd_status_t hpd_model_config_parse(const char *json_text, const char *origin,
                                    hpd_model_config_t *config_p)
{
    json_error_t jerr;
    json_t *root = json_loads(json_text, 0, &jerr);
    json_t *text;
    const char *model_type;
    hpd_model_config_t c;
    hpd_status_t st = HPD_ERR_FORMAT;
    json_t *tie;
    bool found;

    memset(&c, 0, sizeof(c));
    c.gen_sampling.top_p = 1;
    if (root == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: line %d: malformed JSON: %s", origin, jerr.line,
                      jerr.text);
        return HPD_ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: expected a JSON object", origin);
        goto out;
    }
    model_type = json_string_value(json_object_get(root, "model_type"));
    text = root;
    if (model_type == NULL) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: missing field 'model_type'", origin);
        goto out;
    } else if (strcmp(model_type, "qwen3_next") == 0) {
        c.arch = HPD_ARCH_QWEN3_NEXT;
    } else if (strcmp(model_type, "qwen3_5_text") == 0 ||
               strcmp(model_type, "qwen3_5_moe_text") == 0) {
        c.arch = HPD_ARCH_QWEN3_5_TEXT;
    } else if (strcmp(model_type, "qwen3_5") == 0 || strcmp(model_type, "qwen3_5_moe") == 0) {
        c.arch = HPD_ARCH_QWEN3_5;
        text = json_object_get(root, "text_config");
        if (!json_is_object(text)) {
            HPD_LOG_ERROR(LOG_COMPONENT, "%s: model_type %s needs an object 'text_config'",
                          origin, model_type);
            goto out;
        }
    } else {
        HPD_LOG_ERROR(LOG_COMPONENT,
                      "%s: model_type '%s' is not supported (expected qwen3_next, qwen3_5_text, "
                      "qwen3_5, qwen3_5_moe_text or qwen3_5_moe)",
                      origin, model_type);
        st = HPD_ERR_UNSUPPORTED;
        goto out;
    }
    c.moe_family = strstr(model_type, "_moe") != NULL;
    if ((st = check_supported(text, root, origin)) != HPD_OK)
        goto out;

    struct {
        const char *name;
        uint32_t *dst;
        bool required;
        uint32_t dflt;
    } fields[] = {
        {"vocab_size", &c.vocab_size, true, 0},
        {"hidden_size", &c.hidden_size, true, 0},
        {"intermediate_size", &c.intermediate_size, false, 0}, /* checked below */
        {"num_hidden_layers", &c.n_layers, true, 0},
        {"num_attention_heads", &c.n_heads, true, 0},
        {"num_key_value_heads", &c.n_kv_heads, true, 0},
        {"head_dim", &c.head_dim, false, 0},
        {"linear_num_key_heads", &c.lin_n_k_heads, true, 0},
        {"linear_num_value_heads", &c.lin_n_v_heads, true, 0},
        {"linear_key_head_dim", &c.lin_k_dim, true, 0},
        {"linear_value_head_dim", &c.lin_v_dim, true, 0},
        {"linear_conv_kernel_dim", &c.conv_kernel, false, 4},
        {"max_position_embeddings", &c.max_position_embeddings, false, 262144},
    };
    for (size_t i = 0; i < HPD_ARRAY_SIZE(fields); i++) {
        st = get_u32(text, root, origin, fields[i].name, fields[i].required, fields[i].dflt,
                     fields[i].dst);
        if (st != HPD_OK)
            goto out;
    }
    if (c.head_dim == 0 && c.n_heads != 0)
        c.head_dim = c.hidden_size / c.n_heads;
    if (c.n_layers > HPD_MAX_LAYERS) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: num_hidden_layers=%u exceeds the supported %d",
                      origin, c.n_layers, HPD_MAX_LAYERS);
        st = HPD_ERR_UNSUPPORTED;
        goto out;
    }
    if ((st = parse_layer_types(text, root, origin, &c)) != HPD_OK ||
        (st = parse_moe(text, root, origin, &c)) != HPD_OK ||
        (st = parse_quantization(text, root, origin, &c)) != HPD_OK)
        goto out;
    if (c.n_moe_layers < c.n_layers && c.intermediate_size == 0) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: field 'intermediate_size' is missing or 0 (%u layers have a "
                      "dense MLP)", origin, c.n_layers - c.n_moe_layers);
        st = HPD_ERR_FORMAT;
        goto out;
    }
    if ((st = parse_rope(text, root, origin, &c)) != HPD_OK)
        goto out;
    c.rms_norm_eps = 1e-6f;
    if ((st = get_float(text, origin, "rms_norm_eps", &found, &c.rms_norm_eps)) != HPD_OK)
        goto out;
    /* Qwen3_5ForConditionalGeneration ties by its own (top-level) config,
     * whose default is false; a text_config's flag does not count there */
    tie = c.arch == HPD_ARCH_QWEN3_5 ? json_object_get(root, "tie_word_embeddings")
                                     : field(text, root, "tie_word_embeddings");
    if (tie != NULL && !json_is_boolean(tie)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: field 'tie_word_embeddings' must be true or false",
                      origin);
        st = HPD_ERR_FORMAT;
        goto out;
    }
    c.tie_word_embeddings = tie != NULL && json_is_true(tie);
    if ((st = parse_eos(field(text, root, "eos_token_id"), origin, c.vocab_size, &c.n_eos,
                        c.eos_ids)) != HPD_OK)
        goto out;
    if ((st = validate(origin, &c)) != HPD_OK)
        goto out;
    *config_p = c;
    st = HPD_OK;
out:
    json_decref(root);
    return st;
}

hpd_status_t hpd_model_config_load(const char *model_dir, hpd_model_config_t *config_p)
{
    char path[4096];
    char *text;
    size_t len;
    hpd_status_t st;

    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    if ((st = hpd_read_file(path, &text, &len)) != HPD_OK)
        return st;
    st = hpd_model_config_parse(text, path, config_p);
    free(text);
    if (st != HPD_OK)
        return st;
    /* generation_config.json, when there is one, says how to stop (as
     * transformers' generate reads it) */
    snprintf(path, sizeof(path), "%s/generation_config.json", model_dir);
    if (access(path, F_OK) != 0)
        return HPD_OK;
    if ((st = hpd_read_file(path, &text, &len)) != HPD_OK)
        return st;
    json_error_t jerr;
    json_t *g = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!json_is_object(g)) {
        HPD_LOG_ERROR(LOG_COMPONENT, "%s: not a JSON object (line %d: %s)", path, jerr.line,
                      jerr.text);
        json_decref(g);
        return HPD_ERR_FORMAT;
    }
    json_t *eos = json_object_get(g, "eos_token_id");
    if (eos != NULL && !json_is_null(eos))
        st = parse_eos(eos, path, config_p->vocab_size, &config_p->n_eos, config_p->eos_ids);
    if (st == HPD_OK)
        st = parse_gen_sampling(g, path, &config_p->gen_sampling);
    json_decref(g);
    return st;
}
