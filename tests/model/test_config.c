/* config.json parsing: the three model types, both layer-type forms, rope
 * fields in either place, and a clear refusal of what is not supported. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/config.h"

#define DIMS                                                                              \
    "\"vocab_size\": 1000, \"hidden_size\": 128, \"intermediate_size\": 300, "            \
    "\"num_hidden_layers\": 5, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, " \
    "\"head_dim\": 32, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 6, "     \
    "\"linear_key_head_dim\": 16, \"linear_value_head_dim\": 24, "                        \
    "\"linear_conv_kernel_dim\": 4, \"rms_norm_eps\": 1e-5"

static void test_qwen3_next_layer_types(void **state)
{
    const char *j = "{\"model_type\": \"qwen3_next\", " DIMS ", \"num_experts\": 0, "
                    "\"layer_types\": [\"full_attention\", \"linear_attention\", "
                    "\"linear_attention\", \"full_attention\", \"linear_attention\"], "
                    "\"rope_theta\": 5000.0, \"partial_rotary_factor\": 0.5, "
                    "\"tie_word_embeddings\": true}";
    hpd_model_config_t c;
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_OK);
    assert_int_equal(c.arch, HPD_ARCH_QWEN3_NEXT);
    assert_int_equal(c.n_layers, 5);
    /* the pattern is read, not assumed */
    assert_true(c.layer_full[0] && !c.layer_full[1] && !c.layer_full[2] && c.layer_full[3] &&
                !c.layer_full[4]);
    assert_int_equal(c.n_full_layers, 2);
    assert_int_equal(c.n_linear_layers, 3);
    assert_int_equal(c.kind_index[3], 1);
    assert_int_equal(c.kind_index[4], 2);
    assert_int_equal(c.lin_k_dim, 16); /* dk != dv, nv != nk */
    assert_int_equal(c.lin_v_dim, 24);
    assert_int_equal(c.lin_n_v_heads, 6);
    assert_int_equal(c.conv_dim, 2 * 2 * 16 + 6 * 24);
    assert_int_equal(c.rot_dim, 16);
    assert_true(c.rope_theta == 5000.0f);
    assert_true(c.tie_word_embeddings);
    assert_true(c.rms_norm_eps == 1e-5f);
}

static void test_qwen3_5_text_interval_rope_parameters(void **state)
{
    const char *j = "{\"model_type\": \"qwen3_5_text\", " DIMS ", \"full_attention_interval\": 2, "
                    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e7, "
                    "\"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10]}}";
    hpd_model_config_t c;
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_OK);
    assert_int_equal(c.arch, HPD_ARCH_QWEN3_5_TEXT);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(c.layer_full[i], (i + 1) % 2 == 0);
    assert_true(c.rope_theta == 1e7f);
    assert_int_equal(c.rot_dim, 8);
    assert_false(c.tie_word_embeddings);
}

static void test_qwen3_5_nested(void **state)
{
    /* the text config's fields win over the top level's; what it lacks
     * (eos_token_id here) is read from the top level */
    const char *j = "{\"model_type\": \"qwen3_5\", \"tie_word_embeddings\": true, "
                    "\"hidden_size\": 64, \"eos_token_id\": 7, "
                    "\"vision_config\": {}, \"text_config\": {\"model_type\": \"qwen3_5_text\", " DIMS
                    ", \"full_attention_interval\": 4}}";
    hpd_model_config_t c;
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_OK);
    assert_int_equal(c.arch, HPD_ARCH_QWEN3_5);
    assert_int_equal(c.hidden_size, 128);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 7);
    assert_true(c.tie_word_embeddings); /* read from the top level */
    assert_true(c.layer_full[3] && !c.layer_full[0]);
}

/* As Qwen3_5ForConditionalGeneration: the top-level flag decides (default
 * false), whatever the text_config says. */
static void test_qwen3_5_tie_precedence(void **state)
{
    static const struct {
        const char *top, *text;
        bool want;
    } cases[] = {
        {"\"tie_word_embeddings\": true, ", "\"tie_word_embeddings\": false, ", true},
        {"\"tie_word_embeddings\": false, ", "\"tie_word_embeddings\": true, ", false},
        {"", "\"tie_word_embeddings\": true, ", false},
        {"\"tie_word_embeddings\": true, ", "", true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char j[2048];
        snprintf(j, sizeof(j), "{\"model_type\": \"qwen3_5\", %s\"vision_config\": {}, "
                 "\"text_config\": {%s\"model_type\": \"qwen3_5_text\", " DIMS
                 ", \"full_attention_interval\": 4}}", cases[i].top, cases[i].text);
        hpd_model_config_t c;
        assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_OK);
        if (c.tie_word_embeddings != cases[i].want)
            fail_msg("case %zu: tie_word_embeddings %d, expected %d", i, c.tie_word_embeddings,
                     cases[i].want);
    }
    /* a flat qwen3_5_text config keeps its own flag */
    const char *flat = "{\"model_type\": \"qwen3_5_text\", \"tie_word_embeddings\": true, "
                       DIMS ", \"full_attention_interval\": 4}";
    hpd_model_config_t c;
    assert_int_equal(hpd_model_config_parse(flat, "t", &c), HPD_OK);
    assert_true(c.tie_word_embeddings);
}

/* YaRN as transformers' _compute_yarn_parameters computes it, against the
 * same formulas in float64: the correction range (floored / ceiled), the
 * factor (given, or max_position_embeddings / original), the attention
 * factor (given, from mscale and mscale_all_dim, or 0.1 ln(factor) + 1), in
 * rope_parameters and in the legacy rope_scaling; other types are refused
 * by name. */
static double corr_dim(double rot, double dim, double base, double max_pos)
{
    return dim * log(max_pos / (rot * 2 * M_PI)) / (2 * log(base));
}

static void test_yarn(void **state)
{
    static const struct {
        const char *rope;
        double factor, attn, beta_fast, beta_slow, orig;
    } cases[] = {
        {"\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000, "
         "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}",
         4, 0.1 * log(4.0) + 1, 32, 1, 32768},
        {"\"rope_theta\": 10000, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.5, "
         "\"original_max_position_embeddings\": 4096, \"beta_fast\": 16, \"beta_slow\": 2, "
         "\"attention_factor\": 1.25}",
         2.5, 1.25, 16, 2, 4096},
        {"\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000, "
         "\"factor\": 8, \"mscale\": 0.707, \"mscale_all_dim\": 1.0, "
         "\"original_max_position_embeddings\": 8192}",
         8, (0.1 * 0.707 * log(8.0) + 1) / (0.1 * 1.0 * log(8.0) + 1), 32, 1, 8192},
        /* no factor: max_position_embeddings / original */
        {"\"max_position_embeddings\": 65536, \"rope_parameters\": {\"rope_type\": \"yarn\", "
         "\"rope_theta\": 10000, \"original_max_position_embeddings\": 16384}",
         4, 0.1 * log(4.0) + 1, 32, 1, 16384},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char j[2048];
        hpd_model_config_t c;
        snprintf(j, sizeof(j), "{\"model_type\": \"qwen3_5_text\", %s, " DIMS
                 ", \"full_attention_interval\": 4}", cases[i].rope);
        if (hpd_model_config_parse(j, "t", &c) != HPD_OK)
            fail_msg("case %zu refused", i);
        const double dim = c.rot_dim;
        double low = floor(corr_dim(cases[i].beta_fast, dim, 10000, cases[i].orig));
        double high = ceil(corr_dim(cases[i].beta_slow, dim, 10000, cases[i].orig));
        low = fmax(low, 0);
        high = fmin(high, dim - 1);
        if (low == high)
            high += 0.001;
        assert_true(c.yarn);
        assert_true(c.yarn_factor == (float)cases[i].factor);
        assert_true(c.yarn_low == (float)low);
        assert_true(c.yarn_span == (float)(high - low));
        if (c.yarn_attention != (float)cases[i].attn)
            fail_msg("case %zu: attention factor %.9g, expected %.9g", i, c.yarn_attention,
                     cases[i].attn);
    }
    /* a factor below 1 scales attention by 1 (transformers' get_mscale), and
     * a correction range past the rotary dims is cut at dim - 1: beta_slow
     * put where ceil(high) is dim itself */
    hpd_model_config_t c;
    char j[2048];
    snprintf(j, sizeof(j), "{\"model_type\": \"qwen3_5_text\", \"rope_parameters\": "
             "{\"rope_type\": \"yarn\", \"rope_theta\": 10000, \"factor\": 0.5, "
             "\"original_max_position_embeddings\": 8192}, " DIMS
             ", \"full_attention_interval\": 4}");
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_OK);
    assert_true(c.yarn_attention == 1.0f);
    const double dim = c.rot_dim, orig = 8192;
    const double beta_slow = orig / (2 * M_PI * exp((dim - 0.5) * 2 * log(10000.0) / dim));
    assert_true(ceil(corr_dim(beta_slow, dim, 10000, orig)) == dim);
    snprintf(j, sizeof(j), "{\"model_type\": \"qwen3_5_text\", \"rope_parameters\": "
             "{\"rope_type\": \"yarn\", \"rope_theta\": 10000, \"factor\": 4, "
             "\"beta_slow\": %.17g, \"original_max_position_embeddings\": 8192}, " DIMS
             ", \"full_attention_interval\": 4}", beta_slow);
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_OK);
    const double low = fmax(floor(corr_dim(32, dim, 10000, orig)), 0);
    assert_true(c.yarn_low == (float)low);
    assert_true(c.yarn_span == (float)(dim - 1 - low));
    /* other rope types are refused by name */
    const char *linear = "{\"model_type\": \"qwen3_5_text\", \"rope_parameters\": "
                         "{\"rope_type\": \"linear\", \"factor\": 2}, " DIMS
                         ", \"full_attention_interval\": 4}";
    assert_int_equal(hpd_model_config_parse(linear, "t", &c), HPD_ERR_UNSUPPORTED);
    /* without YaRN nothing changes */
    const char *plain = "{\"model_type\": \"qwen3_5_text\", " DIMS
                        ", \"full_attention_interval\": 4}";
    assert_int_equal(hpd_model_config_parse(plain, "t", &c), HPD_OK);
    assert_false(c.yarn);
    assert_true(c.yarn_factor == 0.0f);
}

/* eos_token_id: an id, a list, null or absent; anything else refused. */
static void test_eos(void **state)
{
    static const struct {
        const char *eos;
        hpd_status_t st;
        uint32_t n;
        int32_t first, last;
    } cases[] = {
        {"", HPD_OK, 0, 0, 0},
        {"\"eos_token_id\": null, ", HPD_OK, 0, 0, 0},
        {"\"eos_token_id\": 7, ", HPD_OK, 1, 7, 7},
        {"\"eos_token_id\": [3, 999], ", HPD_OK, 2, 3, 999},
        {"\"eos_token_id\": [], ", HPD_OK, 0, 0, 0},
        {"\"eos_token_id\": 1000, ", HPD_ERR_FORMAT, 0, 0, 0},  /* = vocab */
        {"\"eos_token_id\": -1, ", HPD_ERR_FORMAT, 0, 0, 0},
        {"\"eos_token_id\": \"2\", ", HPD_ERR_FORMAT, 0, 0, 0},
        {"\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9], ", HPD_ERR_FORMAT, 0, 0, 0},
        {"\"eos_token_id\": [1, 2.5], ", HPD_ERR_FORMAT, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char j[2048];
        hpd_model_config_t c;
        snprintf(j, sizeof(j), "{\"model_type\": \"qwen3_5_text\", %s" DIMS
                 ", \"full_attention_interval\": 4}", cases[i].eos);
        const hpd_status_t st = hpd_model_config_parse(j, "t", &c);
        if (st != cases[i].st)
            fail_msg("case %zu: status %d, expected %d", i, st, cases[i].st);
        if (st != HPD_OK)
            continue;
        assert_int_equal(c.n_eos, cases[i].n);
        if (c.n_eos > 0) {
            assert_int_equal(c.eos_ids[0], cases[i].first);
            assert_int_equal(c.eos_ids[c.n_eos - 1], cases[i].last);
        }
    }
}

/* Mixtures of experts as transformers builds them: Qwen3-Next's sparse
 * layers from decoder_sparse_step and mlp_only_layers, Qwen3.5-MoE's every
 * layer with its defaults and no intermediate_size. */
static void test_moe(void **state)
{
    hpd_model_config_t c;
    const char *next = "{\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, " DIMS
                       ", \"num_experts\": 16, \"num_experts_per_tok\": 4, "
                       "\"moe_intermediate_size\": 40, \"shared_expert_intermediate_size\": 0, "
                       "\"norm_topk_prob\": false, \"decoder_sparse_step\": 2, "
                       "\"mlp_only_layers\": [3]}";
    assert_int_equal(hpd_model_config_parse(next, "t", &c), HPD_OK);
    assert_int_equal(c.n_experts, 16);
    assert_int_equal(c.top_k, 4);
    assert_int_equal(c.moe_inter, 40);
    assert_int_equal(c.shared_inter, 0);
    assert_false(c.norm_topk);
    const bool want[5] = {false, true, false, false, false}; /* (l + 1) % 2 == 0, not 3 */
    for (int l = 0; l < 5; l++)
        assert_int_equal(c.layer_moe[l], want[l]);
    assert_int_equal(c.n_moe_layers, 1);
    assert_int_equal(c.intermediate_size, 300);

    char j[2048];
    snprintf(j, sizeof(j),
             "{\"model_type\": \"qwen3_5_moe\", \"text_config\": {\"model_type\": "
             "\"qwen3_5_moe_text\", \"full_attention_interval\": 4, \"vocab_size\": 1000, "
             "\"hidden_size\": 128, \"num_hidden_layers\": 5, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 1, \"head_dim\": 32, \"linear_num_key_heads\": 2, "
             "\"linear_num_value_heads\": 6, \"linear_key_head_dim\": 16, "
             "\"linear_value_head_dim\": 24, \"norm_topk_prob\": false}}");
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_OK);
    assert_int_equal(c.arch, HPD_ARCH_QWEN3_5);
    assert_true(c.moe_family);
    assert_int_equal(c.n_experts, 256); /* Qwen3_5MoeTextConfig's defaults */
    assert_int_equal(c.top_k, 8);
    assert_int_equal(c.moe_inter, 512);
    assert_int_equal(c.shared_inter, 512);
    assert_true(c.norm_topk); /* Qwen3.5-MoE's router always renormalises */
    assert_int_equal(c.n_moe_layers, 5);
    assert_int_equal(c.intermediate_size, 0);

    /* a dense layer needs intermediate_size */
    snprintf(j, sizeof(j),
             "{\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"vocab_size\": "
             "1000, \"hidden_size\": 128, \"num_hidden_layers\": 5, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 1, \"head_dim\": 32, \"linear_num_key_heads\": 2, "
             "\"linear_num_value_heads\": 6, \"linear_key_head_dim\": 16, "
             "\"linear_value_head_dim\": 24, \"num_experts\": 8, \"num_experts_per_tok\": 2, "
             "\"mlp_only_layers\": [0]}");
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_ERR_FORMAT);
}

static void test_refusals(void **state)
{
    char j[2048];
    hpd_model_config_t c;
    const struct {
        const char *extra;
        hpd_status_t want;
    } cases[] = {
        {"\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"num_experts\": 4, "
         "\"num_experts_per_tok\": 5",
         HPD_ERR_FORMAT},
        {"\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"num_experts\": 4, "
         "\"num_experts_per_tok\": 2, \"mlp_only_layers\": [7]",
         HPD_ERR_FORMAT},
        {"\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"num_experts\": 4, "
         "\"num_experts_per_tok\": 2, \"norm_topk_prob\": 1",
         HPD_ERR_FORMAT},
        {"\"model_type\": \"llama\", \"full_attention_interval\": 4", HPD_ERR_UNSUPPORTED},
        {"\"model_type\": \"qwen3_next\"", HPD_ERR_FORMAT}, /* neither layer form */
        {"\"model_type\": \"qwen3_next\", \"layer_types\": [\"full_attention\"]", HPD_ERR_FORMAT},
        {"\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"rope_scaling\": "
         "{\"rope_type\": \"dynamic\", \"factor\": 4.0}",
         HPD_ERR_UNSUPPORTED},
        {"\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"rope_scaling\": "
         "{\"rope_type\": \"yarn\", \"factor\": \"4\"}",
         HPD_ERR_FORMAT},
        {"\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"hidden_act\": \"gelu\"",
         HPD_ERR_UNSUPPORTED},
        {"\"model_type\": \"qwen3_5\", \"full_attention_interval\": 4", HPD_ERR_FORMAT},
        {"\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, \"num_experts\": 4, "
         "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 0",
         HPD_ERR_FORMAT},
        {"\"model_type\": \"qwen3_5_text\", \"full_attention_interval\": 4, \"rope_parameters\": "
         "{\"rope_type\": \"default\", \"rope_theta\": \"big\"}",
         HPD_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(j, sizeof(j), "{%s, %s}", cases[i].extra, DIMS);
        assert_int_equal(hpd_model_config_parse(j, "t", &c), cases[i].want);
    }
    assert_int_equal(hpd_model_config_parse("{not json", "t", &c), HPD_ERR_FORMAT);
    snprintf(j, sizeof(j),
             "{\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, %s}",
             "\"vocab_size\": 10, \"hidden_size\": \"big\"");
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_ERR_FORMAT);
    /* every size that must be positive, at 0 */
    static const char *const sizes[] = {"\"vocab_size\": 1000", "\"hidden_size\": 128",
                                        "\"num_hidden_layers\": 5",
                                        "\"num_key_value_heads\": 1", "\"num_attention_heads\": 4",
                                        "\"linear_num_key_heads\": 2",
                                        "\"linear_key_head_dim\": 16"};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        snprintf(j, sizeof(j),
                 "{\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, %s}", DIMS);
        char *f = strstr(j, sizes[i]);
        assert_non_null(f);
        char *digits = strchr(f, ':') + 2;
        memset(digits, ' ', strspn(digits, "0123456789"));
        digits[0] = '0';
        if (hpd_model_config_parse(j, "t", &c) != HPD_ERR_FORMAT)
            fail_msg("%s at 0 was not refused", sizes[i]);
    }
    /* more layers than supported; a conv kernel past 16 */
    static const struct {
        const char *field, *value;
        hpd_status_t want;
    } edits[] = {{"\"num_hidden_layers\": 5", "\"num_hidden_layers\": 257", HPD_ERR_UNSUPPORTED},
                 {"\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 17", HPD_ERR_FORMAT},
                 {"\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 16", HPD_OK}};
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        char base[2048];
        snprintf(base, sizeof(base),
                 "{\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, %s}", DIMS);
        char *f = strstr(base, edits[i].field);
        assert_non_null(f);
        snprintf(j, sizeof(j), "%.*s%s%s", (int)(f - base), base, edits[i].value,
                 f + strlen(edits[i].field));
        if (hpd_model_config_parse(j, "t", &c) != edits[i].want)
            fail_msg("%s: expected %s", edits[i].value, hpd_status_str(edits[i].want));
    }
    /* value heads not a multiple of key heads */
    snprintf(j, sizeof(j), "{\"model_type\": \"qwen3_next\", \"full_attention_interval\": 4, %s}",
             DIMS);
    char *p = strstr(j, "\"linear_num_value_heads\": 6");
    memcpy(p, "\"linear_num_value_heads\": 5", strlen("\"linear_num_value_heads\": 5"));
    assert_int_equal(hpd_model_config_parse(j, "t", &c), HPD_ERR_FORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_next_layer_types),
        cmocka_unit_test(test_qwen3_5_text_interval_rope_parameters),
        cmocka_unit_test(test_qwen3_5_nested),
        cmocka_unit_test(test_qwen3_5_tie_precedence),
        cmocka_unit_test(test_eos),
        cmocka_unit_test(test_yarn),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
