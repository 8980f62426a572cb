/* model.h — a loaded model: hyper-parameters from metadata and weight
 * tensors used in place from the file mapping (engine-internal).
 *
 * Shapes follow ggml: a weight W with ne = {n_in, n_out} has n_out rows of
 * n_in values, and y = W x means y[r] = dot(row r, x). */
#ifndef ANE_MODEL_H
#define ANE_MODEL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct tok;
struct arch;

typedef struct wt {
    uint32_t type;          /* qtypes id */
    int64_t n_in, n_out;    /* ne[0], ne[1] (times ne[2] for stacked experts) */
    int32_t n_mat;          /* > 1: n_mat matrices (experts) stacked, n_out / n_mat rows each */
    size_t row_bytes;
    const void *data;       /* host bytes (mmap or owned) */
    void *dev;              /* the GPU backend's copy, when it keeps one */
    void *pack;             /* the CPU backend's copy in its kernels' layout (quant/x8.c), when it keeps one */
    int lookup;             /* 1: rows are looked up (token, position embeddings), never multiplied */
} wt;

typedef struct layer_w {
    wt attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    wt bq, bk, bv;              /* qwen2 biases (data NULL when absent) */
    wt attn_sinks;              /* gpt-oss: f32 [n_head] sink logits */
    wt q_norm, k_norm;          /* qwen3 per-head norms */
    /* gemma3: norms of the attention's and the FFN's outputs; swa: a
     * sliding-window layer (hp.n_swa, hp.rope_base_swa) */
    wt post_attn_norm, post_ffn_norm;
    int swa;
    /* gpt2: the norms' biases (attn_norm, ffn_norm), the output
     * projection's (also gpt-oss's attn_output.bias) and the FFN's (wq, wk,
     * wv, bq, bk, bv: thirds of the file's fused attn_qkv) */
    wt attn_norm_b, ffn_norm_b, bo, b_up, b_down;
    /* qwen35: linear (Gated DeltaNet) layers use these instead of wq..wo;
     * full-attention layers use wq (query and output gate interleaved per
     * head), wk, wv, wo, q_norm, k_norm. ffn_norm is post_attention_norm. */
    int linear;
    wt ssm_qkv;                 /* [E] -> [2*n_k*dk + n_v*dv]: q, k, v channels */
    wt ssm_z;                   /* [E] -> [n_v*dv]: output gate (attn_gate) */
    wt ssm_alpha, ssm_beta;     /* [E] -> [n_v] */
    wt ssm_a;                   /* f32 [n_v]: -exp(A_log) */
    wt ssm_dt_bias;             /* f32 [n_v] */
    wt ssm_conv;                /* f32 [conv_dim] rows of ssm_conv_k taps */
    wt ssm_norm;                /* f32 [dv] */
    wt ssm_out;                 /* [n_v*dv] -> [E] */
    /* mixture of experts (data NULL in dense layers): the router and the
     * experts' FFNs, each one wt of n_expert experts' rows stacked (GGUF's
     * 3-D ffn_*_exps: gate and up [E] -> [n_expert * n_ff_exp], down
     * [n_ff_exp] -> [n_expert * E]); f32 per-expert biases where a family
     * has them (n_in = the row, n_out = n_expert) */
    wt ffn_gate_inp, ffn_gate_inp_b;
    wt ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    wt ffn_gate_exps_b, ffn_up_exps_b, ffn_down_exps_b;
} layer_w;

typedef struct hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int32_t n_rot;              /* rotary dims per head */
    int32_t n_ctx_train;
    float norm_eps;
    float rope_base;
    int rope_neox;              /* 1: rotate (i, i+n_rot/2); 0: adjacent pairs */
    /* gpt-oss: the sliding window of its windowed layers, the SwiGLU clamp */
    int32_t swa_window;
    float swiglu_limit;
    /* YaRN rope scaling (rope_yarn 0: none), as rope_yarn_table takes it */
    int rope_yarn, yarn_truncate;
    double rope_linear;         /* linear rope scaling's factor (0: none; ARCH_ROPE_LINEAR rows) */
    double yarn_factor, yarn_orig_ctx, yarn_beta_fast, yarn_beta_slow, yarn_attn;
    /* qwen35 linear-attention layers (0 elsewhere) */
    int32_t ssm_conv_k;         /* causal conv taps */
    int32_t ssm_dk, ssm_dv;     /* key / value head size */
    int32_t ssm_nk, ssm_nv;     /* key / value heads (nv a multiple of nk) */
    int32_t n_attn_layers;      /* layers that keep a KV cache (not linear-attention ones) */
    /* mixture of experts (n_expert 0: dense FFNs) */
    int32_t n_expert, n_expert_used, n_ff_exp;
    int expert_gating;          /* backend.h BE_MOE_SOFTMAX...; -1: not given, the family's */
    int expert_norm;            /* 1: the chosen weights renormalised; -1: not given, the family's */
    float expert_scale;         /* the weights times this (expert_weights_scale; 1) */
    /* gemma3: the sliding window of its swa layers (tokens), their rope
     * base, and the q·k scale (0: 1/sqrt(head_dim)) */
    int32_t n_swa;
    float rope_base_swa;
    float attn_scale;
    int32_t pooling_type;       /* <arch>.pooling_type (embeddings), -1 when absent */
} hparams;

typedef struct model {
    hparams hp;
    const struct arch *arch;    /* its row of the architecture table (NULL: vocabulary only) */
    char arch_name[32];
    char name[128];
    char path[512];
    wt tok_embd, output_norm, output;
    wt output_norm_b, pos_embd;  /* gpt2: the final layernorm's bias; learned positions [n_ctx_train][E] */
    wt rope_freqs;              /* llama-3.1 or YaRN per-pair divisors (backend.h rope); data NULL when absent */
    float yarn_tab[513];        /* YaRN's: n_rot/2 divisors and the attention factor */
    layer_w *layers;
    int tokenizer_only;
    int spm;                    /* SentencePiece vocabulary: drop the space prefix after BOS */
    int recurrent;              /* has per-sequence recurrent state: no prefix reuse */
    /* Tokens of each sequence's ring that holds the KV of the sliding-window
     * layers (layer_w.swa) in place of pages, so that it never grows past
     * the window (the window plus a batch); 0: those layers are paged like
     * the others. Set by the engine before fw_open (fw_swa_ring). */
    int swa_ring;
    /* A layer split's stage (split.h model_stages): this part's layers take
     * x from stage - 1 (none at stage 0) and hand it to stage + 1 (the last
     * computes the logits); n_stages 0: a whole model */
    int stage, n_stages;
    /* Expert parallelism (split.h model_split): the experts this rank
     * holds, [expert0, expert0 + n_held); n_held 0: all of them */
    int expert0, n_held;
    struct tok *tok;
    uint64_t n_params, weight_bytes;
    uint64_t active_bytes;      /* weight bytes a token reads: experts' by n_expert_used of n_expert */
    int resident;               /* the backend holds its own copy of every weight: the
                                   file mappings are not read after model_prepare */
    atomic_llong check_due;     /* resident: model_check looks again from then on (ms) */
    /* owner of the bytes: */
    struct gguf *gguf;
    struct hf_model *hf;
    void *owned;                /* converted/loaded buffers (HF dirs), freed with the model */
} model;

/* Loads a GGUF file or a Hugging Face directory (config.json, *.safetensors,
 * tokenizer.json). */
int model_load(model **out, const char *path, char *err, size_t errlen);
void model_free(model *m);

struct be;
/* Every weight slot of m (data NULL where absent) into out[0..cap): the
 * count; model_wts_count(m) slots in all. */
int model_wts(model *m, wt **out, int cap);
int model_wts_count(const model *m);
/* Hands every weight to the backend once (upload/repack); 0 ok. */
int model_prepare(model *m, struct be *b, char *err, size_t errlen);

/* The model's mapped files against what was loaded (engine/load/mfile.h), cheap
 * enough for every forward pass: MODEL_SAME; MODEL_CHANGED: the weights in
 * use are no longer what was loaded (a file was rewritten or truncated in
 * place; a read past its new end found zero pages): jobs must end;
 * MODEL_DETACHED: the files on disk differ from what was loaded (renamed
 * over, removed, or rewritten while the backend holds its own copy) but the
 * weights in use are intact. For the last two a line in why. Any thread. */
enum { MODEL_SAME = 0, MODEL_CHANGED, MODEL_DETACHED };
/* quick (after each forward pass): what can only be told (a rename over the
 * file; anything for a resident model) is looked at once a second. */
int model_check(model *m, int quick, char *why, size_t n);

/* YaRN as transformers computes it (_compute_yarn_parameters): for each of
 * the n_rot/2 pairs, the divisor of its frequency base^(-2i/n_rot) that
 * blends interpolation (factor) and extrapolation (1) over the ramp between
 * the pairs that turn beta_fast and beta_slow times in orig_ctx positions
 * (floored and ceiled where truncate); then attn, the factor on cos and
 * sin. out[n_rot/2 + 1], as the backend's rope takes it. */
void rope_yarn_table(double base, int n_rot, double factor, double orig_ctx, double beta_fast, double beta_slow,
                     int truncate, double attn, float *out);

/* Dequantizes row r of w to f32 (embedding lookup, tests). */
void wt_row_f32(const wt *w, int64_t r, float *dst);

#endif
