/* hf.h — Hugging Face model directories (engine-internal): config.json,
 * model.safetensors or sharded *.safetensors with model.safetensors.index.json.
 * Tensors are exposed under their GGUF names (blk.N.attn_q.weight, ...) as
 * gguf_tensor records pointing into read-only mappings of the shards, so the
 * model loader treats both sources alike. Per-expert tensors (mlp.experts.N.*)
 * are copied into one stacked tensor per layer, as GGUF's ffn_*_exps;
 * gpt-oss's MXFP4 experts (U8 codes and scales) become GGUF MXFP4 tensors,
 * bit for bit. Every header offset is checked against its file before use. */
#ifndef ANE_HF_H
#define ANE_HF_H

#include <stddef.h>
#include <stdint.h>

#include "engine/load/gguf.h"

typedef struct hf_config {
    char arch[32];            /* "llama", "qwen2", "qwen3", "qwen3moe", "gpt2" (from model_type; mixtral is llama) */
    int64_t hidden, layers, heads, kv_heads, head_dim, ff, vocab, ctx;
    double eps, rope_theta;
    int tie;                  /* tie_word_embeddings: 1, 0, or -1 when absent */
    int rope_llama3;          /* rope_type llama3: the parameters below */
    double rope_factor, rope_low, rope_high, rope_orig_ctx;
    int rope_yarn;            /* rope_type yarn (gpt_oss): factor, orig_ctx and these */
    double yarn_beta_fast, yarn_beta_slow, yarn_attn;
    int yarn_truncate;
    /* gpt_oss: the sliding window of the even layers (layer_types checked
     * to alternate sliding and full attention) and the SwiGLU clamp */
    int64_t sliding_window;
    double swiglu_limit;
    int64_t bos, eos;         /* -1 when null/absent */
    /* mixture of experts (n_expert 0: dense) */
    int64_t n_expert, n_expert_used, ff_exp;
    int norm_topk;            /* norm_topk_prob (Mixtral: always 1) */
} hf_config;

typedef struct hf_model hf_model;

int hf_open(hf_model **out, const char *dir, char *err, size_t errlen);
void hf_close(hf_model *h);
const hf_config *hf_cfg(const hf_model *h);
const gguf_tensor *hf_tensor_find(const hf_model *h, const char *gguf_name);
uint64_t hf_n_tensors(const hf_model *h);
/* mf_check over the shards: the first MF_CHANGED, else the first MF_REPLACED. */
int hf_check(hf_model *h, int quick, char *why, size_t n);

#endif
