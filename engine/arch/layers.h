/* layers.h — the pieces of a layer that architecture families share
 * (engine-internal). Each queues backend ops; a family's pass strings them
 * together with its own residuals and norm placement. */
#ifndef ANE_LAYERS_H
#define ANE_LAYERS_H

#include "engine/backend/backend.h"
#include "engine/arch/arch.h"

/* How a layer attends once q, k, v are projected. */
typedef struct ly_attn {
    int n_head, n_head_kv, head_dim, n_rot;
    float rope_base;
    int rope_neox;              /* 1: rotate (i, i+n_rot/2); 0: adjacent pairs */
    const wt *freq_div;         /* per-pair rope divisors, or NULL */
    const wt *q_norm, *k_norm;  /* per-head rmsnorms, or NULL */
    float norm_eps;
    int fused;                  /* may take the backend's fused rope ops (rope_kv, rope_attention) */
    /* be_attn_ex's: a sliding window (0: none), sinks (NULL: none), the
     * q·k scale (0: 1/sqrt(head_dim)); any set: the backend's attention_ex */
    int window;
    const wt *sinks;
    float scale;
} ly_attn;

/* Attention over q [T][n_head*hd], k, v [T][n_head_kv*hd]: the q/k norms,
 * rope, the KV store into kc/vc and the attention into att [T][n_head*hd].
 * rope_bias (or NULL): q, k, v biases that the projections left to a fused
 * rope. */
void ly_attend(be *b, const ly_attn *a, float *q, float *k, float *v, void *kc, void *vc, const be_batch *bt,
               const wt *const *rope_bias, float *att);

/* out[i] [T][w[i]->n_out] = w[i]·x + bias[i] (bias[i] NULL: none) for
 * i < n: by the backend's matmul_n where it has one (one pass over x),
 * else one matmul each. */
void ly_matmuls(be *b, int n, const wt *const *w, const wt *const *bias, const float *x, int T, float *const *out);

/* out [T][E] = Wd · (silu(Wg·x) ∘ Wu·x); hg, hu [T][n_ff] scratch. fused:
 * may take the backend's matmul_glu or matmul_n. */
void ly_ffn_glu(be *b, const layer_w *L, const float *x, int T, int n_ff, int fused, float *hg, float *hu,
                float *out);

/* A model's mixture-of-experts layers as the backend's moe op takes them
 * (moe.c), and the scratch the op asks for, allocated once at open. */
typedef struct ly_moe {
    be_moe *d;                  /* [n_layer]; n_expert 0 in dense layers */
    void *scratch;
} ly_moe;
/* Loads layer i's router ffn_gate_inp.{weight,bias} and stacked experts
 * ffn_{gate,up,down}_exps.{weight,bias} (biases optional, f32), checked
 * against expert_count and expert_feed_forward_length; a missing router
 * or an expert count that the tensors contradict is an error naming both. */
int ly_load_moe(ld *l, layer_w *L, int i);
/* Floats of vec_cap (loader.h) that ly_load_moe takes per layer. */
size_t ly_moe_vec(const hparams *hp);
/* Layer l's be_moe: from the hyper-parameters and its tensors, with the
 * activation (act, alpha, limit) of `how`. */
void ly_moe_desc(const model *m, int l, const be_moe *how, be_moe *d);
/* NULL, or what ops o lack to run m's experts. */
const char *ly_moe_lacks(const model *m, const be_ops *o);
/* For a model with experts (nothing to do without; fw_open has checked the
 * backend's ops): the layers' be_moe and the scratch for batches of max_T,
 * counted into *bytes (or NULL). */
int ly_moe_open(ly_moe *mo, be *b, const model *m, const be_moe *how, int max_T, size_t *bytes, char *err,
                size_t errlen);
void ly_moe_close(ly_moe *mo, be *b);
/* out [T][E] = layer l's mixture of experts on x [T][E] (out may be x). */
void ly_moe_ffn(be *b, const ly_moe *mo, int l, const float *x, int T, float *out);

/* The final norm of the output rows x[out_idx[i]] into xo[i] [n_out][E]:
 * one rmsnorm per run of consecutive rows (a decode batch's are all one). */
void ly_out_norm(be *b, const float *x, const wt *w, const int32_t *out_idx, int n_out, int E, float eps,
                 float *xo);
/* The logits lg [n_out][n_vocab] of the output rows of x [T][E]: their
 * final rmsnorm (output_norm) into xo, then the output matrix. */
void ly_logits(be *b, const model *m, const float *x, const int32_t *out_idx, int n_out, float eps, float *xo,
               float *lg);
/* The residual add and the next norm: x += y, then out = rmsnorm(x) * w
 * [T][E] (out may be y); by the backend's add_rmsnorm where it has one. */
void ly_add_norm(be *b, float *x, const float *y, const wt *w, int T, int E, float eps, float *out);

/* The KV caches of every layer that attends (not layers[l].linear):
 * (*kc)[l] and (*vc)[l] of n_pages pages (a sliding-window layer with
 * m->swa_ring set: max_seqs rings of that many rows) ([n_layer], NULL
 * elsewhere), counted into *bytes; -1 with err (naming the layer and size),
 * what was allocated left for ly_kv_close. */
int ly_kv_open(be *b, const model *m, int n_pages, int max_seqs, void ***kc, void ***vc, size_t *bytes,
               char *err, size_t errlen);
/* The batch layer l's cache takes: bt, or for a ring layer *ring (bt with
 * ring set, filled in here). */
const be_batch *ly_kv_batch(const model *m, int l, const be_batch *bt, be_batch *ring);
void ly_kv_close(be *b, const model *m, void **kc, void **vc);

/* An activation buffer of n floats, allocated into *p by ly_bufs_alloc. */
typedef struct ly_buf { float **p; size_t n; } ly_buf;
/* Allocates bufs[0..n) on b: 0, or -1 with err when any failed (the others
 * stay set, for the family's close to free). */
int ly_bufs_alloc(be *b, const ly_buf *bufs, size_t n, char *err, size_t errlen);
/* Frees the set ones of p[0..n). */
void ly_free(be *b, void *const *p, size_t n);

/* The forward state of the families whose every layer attends and has
 * an FFN (llama, gemma3, gpt2, gpt-oss). Buffers (T = max_T, E = n_embd,
 * Q = n_head*head_dim, K = n_head_kv*head_dim, F = ly_fw_open's):
 *   x, xb [T][E]   q, att [T][Q]   k, v [T][K]   hg [T][F]   hu [T][F] (GLU
 *   FFNs; else NULL)   xo [max_out][E]   base.lg [max_out][n_vocab] */
typedef struct ly_fw {
    fw base;
    float *x, *xb, *q, *k, *v, *att, *hg, *hu, *xo;
    ly_moe moe;                 /* the experts, when the model has them */
    int every_row;              /* this pass's output rows are its every row, in order (decode) */
    int last_here;              /* the pass's last layer and logits are here (not a layer split's earlier stage) */
} ly_fw;
/* A split sum (a tensor-parallel rank's attention or FFN output, split.h)
 * made whole: x [n] summed over the ranks by the backend's allreduce;
 * nothing for a whole model or a layer split's stage, whose sums are
 * whole. */
static inline void ly_reduce(ly_fw *f, float *x, size_t n)
{
    be *b = f->base.b;
    if (b->ops->allreduce && f->base.m->n_stages <= 1) b->ops->allreduce(b, x, n);
}

/* fam's open over ly_fw: the buffers (hu with glu), and where the model
 * has experts, their be_moe with the activation of `how`. 0 with *out
 * set, or -1 with err (nothing left allocated). */
int ly_fw_open(fw **out, const arch_family *fam, model *m, be *b, size_t F, int glu, const be_moe *how, int max_T,
               int max_out, char *err, size_t errlen);
/* Frees what ly_fw_open allocated: the close of its families. */
void ly_fw_close(fw *base);
/* A ly_fw family's pass by its hooks: x = embed(tokens), then first (NULL:
 * nothing more), layer for every layer in order, then last (NULL:
 * ly_logits). f->every_row and f->last_here are set for them. A layer
 * split's stage (model_stages) takes x from the stage before instead of
 * the embedding and its first hook, and hands x to the next stage instead
 * of last: a family that leaves its last layer's residual add to last
 * does it itself where last_here is 0. */
typedef struct ly_pass {
    void (*first)(ly_fw *f, const be_batch *bt);
    void (*layer)(ly_fw *f, const layer_w *L, int l, const be_batch *bt);
    void (*last)(ly_fw *f, const int32_t *out_idx, int n_out);
} ly_pass;
void ly_fw_pass(ly_fw *f, const ly_pass *p, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx,
                int n_out);

/* Loading layer i: the attention projections attn_{q,k,v,output}.weight
 * (q with q_out rows), and the GLU FFN ffn_{gate,up,down}.weight. */
int ly_load_attn(ld *l, layer_w *L, int i, int64_t q_out);
int ly_load_ffn_glu(ld *l, layer_w *L, int i);

#endif
