/* backend.h — the ops every accelerator backend implements (engine-internal).
 *
 * The forward pass (engine/arch/) is written once against these ops; the CPU
 * backend is the reference, and each other backend (CUDA) is tested against
 * it op by op. Activation buffers are backend memory (plain host memory on
 * the CPU) allocated once at engine start; ops never allocate. Shapes are in
 * the comments: T = tokens in the batch. */
#ifndef ANE_BACKEND_H
#define ANE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/load/model.h"

#define KV_PAGE 16   /* tokens per KV page */

#define BE_QUEUE_ROWS 1024   /* rows of one argmax_queue */

/* Where each token of a batch sits: its sequence's page table and position. */
typedef struct be_batch {
    int T;
    const int32_t *pos;            /* [T] position in its sequence */
    const int32_t *const *pages;   /* [T] page table of the token's sequence */
    const int32_t *slot;           /* [T] sequence slot (0..max_seqs-1) for per-sequence state */
    /* Tokens [0, n_dec) are decode steps (a sampled token of a sequence past
     * its prompt, one per sequence), and they are also the first n_dec
     * output rows; the rest are prompt tokens. A backend whose kernels
     * differ by batch size routes rows by this, so that what a sequence
     * computes does not depend on the other sequences in the batch. */
    int n_dec;
    /* 1: the token ids are on the device already, the previous argmax_queue's
     * rows 0..T-1 in order (a pass queued before the host has read them) */
    int ids_dev;
    /* 0: cache rows are paged (pages[]); else each sequence slot has a ring
     * of `ring` rows and position p sits at row slot * ring + p % ring
     * (sliding-window layers; only for backends with kv_ring) */
    int ring;
} be_batch;

typedef struct be be;

/* What attention_ex adds to plain causal attention. */
typedef struct be_attn_ex {
    /* 0: every earlier position; else a token at position p sees positions
     * p-window+1 .. p (a sliding window of `window` tokens, itself included) */
    int window;
    /* NULL (or no data), or an f32 vector [n_head]: one more logit per head
     * in the softmax's denominator that adds no value (gpt-oss's attention
     * sinks) */
    const wt *sinks;
    float scale;    /* of q·k; 0: 1/sqrt(head_dim) */
} be_attn_ex;

/* A save point for per-sequence state: the state of sequence `slot` right
 * after its token at position pos-1 is copied to dst (a slot-sized buffer of
 * the same layout), when that token is in the batch. */
typedef struct be_save {
    int slot, pos;
    float *dst;
} be_save;

/* Mixture of experts: how tokens are routed and what each expert computes.
 * Expert tensors are stored as in GGUF (ffn_gate_exps.weight has ne =
 * {E, n_ff, n_expert}): one wt whose rows are the experts' rows stacked, so
 * expert e's rows of gate and up are [e*n_ff, (e+1)*n_ff) (n_out =
 * n_expert*n_ff) and of down [e*E, (e+1)*E) (n_in = n_ff). Any weight type
 * the matmul takes. */
enum {
    /* router probabilities p = softmax(logits) over all experts; the n_used
     * highest are chosen, weight = p (Mixtral, Qwen-MoE) */
    BE_MOE_SOFTMAX = 0,
    /* the n_used highest logits are chosen; weight = softmax over those
     * n_used logits (gpt-oss) */
    BE_MOE_TOPK_SOFTMAX,
    /* p = sigmoid(logits); the n_used highest chosen, weight = p */
    BE_MOE_SIGMOID,
};
/* (All three choose by the logits, which order the experts as p does.) */
enum {
    BE_MOE_SILU = 0,     /* h = silu(g) * u */
    BE_MOE_GELU,         /* h = gelu(g) * u (tanh approximation) */
    /* gpt-oss: g = min(g, limit), u = clamp(u, -limit, limit),
     * h = g * sigmoid(alpha * g) * (u + 1) */
    BE_MOE_SWIGLU_OAI,
};
typedef struct be_moe {
    int n_expert, n_used;       /* 1 <= n_used <= n_expert <= BE_MOE_MAX */
    int n_ff;                   /* rows of each expert's gate and up */
    int gating;                 /* BE_MOE_SOFTMAX... */
    int norm;                   /* 1: the chosen weights divided by their sum (not for TOPK_SOFTMAX, already 1) */
    float scale;                /* every weight times this (0 taken as 1) */
    int act;                    /* BE_MOE_SILU... */
    float alpha, limit;         /* BE_MOE_SWIGLU_OAI's */
    const wt *router;           /* [E] -> [n_expert] logits */
    const wt *router_b;         /* f32 [n_expert] added to the logits, or NULL / no data */
    const wt *gate, *up, *down; /* stacked experts, as above */
    /* f32 per-expert biases, [n_expert][n_ff] for gate and up and
     * [n_expert][E] for down (n_in = row, n_out = n_expert), or NULL */
    const wt *gate_b, *up_b, *down_b;
    /* Expert parallelism (split.h): this backend holds experts [expert0,
     * expert0 + n_held) of the n_expert routed over, stacked as above from
     * its first (and their biases); a pair routed to another adds nothing
     * here, the group's all-reduce sums the ranks. n_held 0: all. */
    int expert0, n_held;
} be_moe;

/* The experts m's backend holds. */
static inline int be_moe_held(const be_moe *m) { return m->n_held ? m->n_held : m->n_expert; }

#define BE_MOE_MAX 512   /* experts of one layer at most */

/* The linear-attention ops of be_ops (below), typed here for the backends'
 * files that define them (cpu_ssm.h, cuda_be.h). */
/* dst[r*dst_stride + i] = src[r*src_stride + i], i < n, r < rows. */
typedef void be_copy_rows_fn(be *b, float *dst, size_t dst_stride, const float *src, size_t src_stride, int rows,
                             int n);
/* x *= sigmoid(g)                                         [n] */
typedef void be_sigmoid_mul_fn(be *b, float *x, const float *g, size_t n);
/* out[r] = x[r] / rms(x[r]) * w * silu(z[r]).  x, z, out [rows][n];
 * in place (out == x) allowed; w an f32 vector of n. */
typedef void be_rmsnorm_gated_fn(be *b, const float *x, const float *z, const wt *w, int rows, int n, float eps,
                                 float *out);
/* Causal depthwise convolution of each sequence's stream, then SiLU:
 * out[t][c] = silu(sum_j w[c][j] * in[t-K+1+j][c]), where inputs before
 * the batch come from state ([max_seqs][K-1][C]: the sequence's last K-1
 * inputs), which is updated. w: f32 rows of K taps, one per channel.
 * x, out [T][C]; in place allowed. */
typedef void be_conv1d_silu_fn(be *b, const float *x, const wt *w, float *state, const be_batch *bt, int C, int K,
                               const be_save *sv, int n_sv, float *out);
/* Gated delta rule (Gated DeltaNet), per value head h of nv, with key
 * head h % nk (GGUF files store value heads in this tiled order; the
 * Hugging Face layout groups them, h / (nv/nk)). Row t of qkv (stride floats apart) holds q [nk][dk],
 * k [nk][dk], v [nv][dv]; q and k are L2-normalized (eps) and q scaled
 * by 1/sqrt(dk). Gates: g = A[h] * softplus(a[t][h] + dt_bias[h]) (log
 * decay), beta = sigmoid(bb[t][h]). With S [dk][dv] the head's state
 * (state: [max_seqs][nv][dk][dv]):
 *   S = exp(g) S;  S += k ((v - S^T k) beta)^T;  out[t][h] = S^T q.
 * A run of tokens of one sequence is computed in chunks (the chunked
 * parallel form), which equals the token-by-token recurrence.
 * a, bb [T][nv]; out [T][nv][dv]. Both ops honour save points sv[n_sv]
 * (the prefix state a later prompt can resume from). */
typedef void be_deltanet_fn(be *b, const float *qkv, size_t stride, const float *a, const float *bb, const wt *A,
                            const wt *dt_bias, float *state, const be_batch *bt, int nk, int nv, int dk, int dv,
                            float eps, const be_save *sv, int n_sv, float *out);

typedef struct be_ops {
    const char *name;
    /* 1: kv_store and attention(_ex) take be_batch.ring */
    int kv_ring;
    void (*close)(be *b);
    void *(*alloc)(be *b, size_t bytes);       /* zeroed; NULL on failure */
    void (*free)(be *b, void *p);
    /* Makes w usable by matmul/embed (upload, repack); called once at load. */
    int (*weight_prepare)(be *b, wt *w);
    void (*to_host)(be *b, void *dst, const void *src, size_t n);
    void (*to_dev)(be *b, void *dst, const void *src, size_t n);

    /* out[t] = row ids[t] of emb, as f32.                    out [T][n_in] */
    void (*embed)(be *b, const wt *emb, const int32_t *ids, int T, float *out);
    /* out[r] = x[r] / rms(x[r]) * w.  x, out [rows][n]; in place allowed;
     * w is an f32 vector of n. */
    void (*rmsnorm)(be *b, const float *x, const wt *w, int rows, int n, float eps, float *out);
    /* out[t] = W x[t] (+ bias, an f32 vector, or NULL / no data).
     * x [T][w->n_in], out [T][w->n_out] */
    void (*matmul)(be *b, const wt *w, const wt *bias, const float *x, int T, float *out);
    /* x += y                                                   [n] */
    void (*add)(be *b, float *x, const float *y, size_t n);
    /* out = silu(gate) * up                                    [n] */
    void (*silu_mul)(be *b, const float *gate, const float *up, size_t n, float *out);
    /* Rotary embedding in place on x [T][n_heads][head_dim] at bt->pos:
     * pair i at position p turns by p * base^(-2i/n_rot) / freq_div[i].
     * freq_div: per-pair divisors (llama-3.1, YaRN), or NULL / no data; one
     * of n_rot/2 + 1 values (n_in) ends with a factor on cos and sin
     * (YaRN's attention factor), as every rope op below takes it. */
    void (*rope)(be *b, float *x, const be_batch *bt, int n_heads, int head_dim, int n_rot,
                 float base, int neox, const wt *freq_div);
    /* Writes k, v [T][kv_dim] into layer cache slots of each token. */
    void (*kv_store)(be *b, void *kcache, void *vcache, const be_batch *bt, int kv_dim,
                     const float *k, const float *v);
    /* Causal attention of each token over positions 0..pos of its sequence.
     * q, out [T][n_head][head_dim]. */
    void (*attention)(be *b, const float *q, const void *kcache, const void *vcache,
                      const be_batch *bt, int n_head, int n_head_kv, int head_dim, float *out);
    /* Optional: attention with the extras of ex (NULL, or all zero: the
     * same values as attention). */
    void (*attention_ex)(be *b, const float *q, const void *kcache, const void *vcache, const be_batch *bt,
                         int n_head, int n_head_kv, int head_dim, const be_attn_ex *ex, float *out);
    /* Waits for queued work (no-op on the CPU). */
    void (*sync)(be *b);
    /* Optional (accelerators): the device memory free and in all, for the
     * start-up check that the model fits (fw_mem_estimate). 0 or -1. */
    int (*mem_free)(be *b, size_t *free_bytes, size_t *total_bytes);

    /* ---- Optional ops (NULL where a backend lacks them; a model that needs
     * them fails to open with a clear message). Linear-attention (Gated
     * DeltaNet) layers and gated attention (qwen35). Per-sequence state
     * lives in buffers indexed by bt->slot; the tokens of one sequence come
     * in position order within a batch, and a token at position 0 starts
     * from zero state (the types above say what each does). ---- */
    be_copy_rows_fn *copy_rows;
    be_sigmoid_mul_fn *sigmoid_mul;
    be_rmsnorm_gated_fn *rmsnorm_gated;
    be_conv1d_silu_fn *conv1d_silu;
    be_deltanet_fn *deltanet;

    /* ---- Optional: a mixture-of-experts FFN (be_moe below). ----
     * moe_scratch: bytes of device memory that moe needs for batches of up
     * to max_T tokens (the family allocates it once with alloc, at open).
     * moe: out[t] = sum over the k = 0..n_used-1 experts chosen for x[t] of
     * weight[t][k] * expert(x[t]), each expert's FFN run only on the tokens
     * routed to it, and the sum taken in the order of k (rank), so that a
     * token's result does not depend on the other tokens of the batch.
     * x, out [T][E] (out may be x); scratch of moe_scratch(max_T >= T). */
    size_t (*moe_scratch)(be *b, const struct be_moe *m, int max_T);
    void (*moe)(be *b, const struct be_moe *m, const float *x, int T, void *scratch, float *out);
    /* ---- Optional ops of the Gemma and GPT-2 families. ---- */
    /* out = gelu(x) (tanh approximation), times up where up is not NULL.
     * [n]; in place allowed. */
    void (*gelu_mul)(be *b, const float *x, const float *up, size_t n, float *out);
    /* out[r] = (x[r] - mean(x[r])) / sqrt(var(x[r]) + eps) * w + bias (bias
     * NULL or no data: none); w, bias f32 vectors of n. [rows][n]; in place
     * allowed. */
    void (*layernorm)(be *b, const float *x, const wt *w, const wt *bias, int rows, int n, float eps, float *out);
    /* x *= s                                                   [n] */
    void (*scale)(be *b, float *x, size_t n, float s);
    /* x[t] += row bt->pos[t] of table (learned absolute positions); x [T][n],
     * table an f32, f16 or bf16 matrix of rows of n. */
    void (*add_pos)(be *b, float *x, const wt *table, const be_batch *bt, int n);

    /* Optional hooks (NULL when a backend has none).
     * step_begin: called by fw_run before the ops of a forward pass with its
     * whole input (host arrays); the backend may upload them once for every
     * op, and returns 1 when it replays a recorded pass of the same shape
     * (e.g. a CUDA graph): fw_run then skips the ops. step_end: after the
     * ops (or the skip), before the logits are read. */
    int (*step_begin)(be *b, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out);
    void (*step_end)(be *b);
    /* Optional: host ids[r] = first argmax of row r of x [rows][n]; waits.
     * mask: NULL, or host bits [rows][(n + 31) / 32] (bit i & 31 of word
     * i >> 5 set: token i may be chosen), as a grammar allows; a row that
     * allows nothing gives 0. */
    void (*argmax)(be *b, const float *x, int rows, int n, const uint32_t *mask, int32_t *ids);
    /* Optional pair: argmax_queue queues argmax (mask as above, read before
     * the call returns) without waiting and leaves the ids where a next pass
     * with ids_dev reads them; argmax_take waits for the oldest queued and
     * writes it to host ids[rows]. At most two are queued at once, of at
     * most BE_QUEUE_ROWS rows. */
    void (*argmax_queue)(be *b, const float *x, int rows, int n, const uint32_t *mask);
    void (*argmax_take)(be *b, int32_t *ids, int rows);
    /* Optional fused ops (fw_run uses the plain ops where NULL).
     * matmul_n: n (<= 3) matmuls of the same x: out[i] = W[i] x (+ bias[i]). */
    void (*matmul_n)(be *b, int n, const wt *const *w, const wt *const *bias, const float *x, int T,
                     float *const *out);
    /* matmul_glu: out = silu(Wg x) * (Wu x), with g, u [T][n_out] as scratch
     * (out may be g): the same values as matmul_n then silu_mul. */
    void (*matmul_glu)(be *b, const wt *wg, const wt *wu, const float *x, int T, float *g, float *u, float *out);
    /* add_rmsnorm: x += y, then out = rmsnorm(x) * w (out may be y).  [rows][n] */
    void (*add_rmsnorm)(be *b, float *x, const float *y, const wt *w, int rows, int n, float eps, float *out);
    /* rope_kv: rope of q [T][n_head][head_dim] and k [T][n_head_kv][head_dim]
     * in place, then kv_store of k and v (kv_dim = n_head_kv*head_dim): the
     * same values as rope, rope, kv_store. bias[3] (each NULL or without
     * data: none): the q, k, v projections' biases, added first (q and k
     * keep them, as if the matmuls had added them; v may too). */
    void (*rope_kv)(be *b, float *q, float *k, float *v, void *kcache, void *vcache, const be_batch *bt,
                    int n_head, int n_head_kv, int head_dim, int n_rot, float base, int neox, const wt *freq_div,
                    const wt *const *bias);
    /* rope_attention: rope_kv, then attention of q into out: the same
     * values (a backend may do the rope inside the attention). */
    void (*rope_attention)(be *b, float *q, float *k, float *v, void *kcache, void *vcache, const be_batch *bt,
                           int n_head, int n_head_kv, int head_dim, int n_rot, float base, int neox,
                           const wt *freq_div, const wt *const *bias, float *out);
    /* qkv_rope: matmul_n of w[3] (wq, wk, wv) on x without biases, then
     * rope_kv with bias[3], where the backend can do them in one go (the
     * same values); returns 0, having done nothing, where it cannot. */
    int (*qkv_rope)(be *b, const wt *const *w, const wt *const *bias, const float *x, float *q, float *k, float *v,
                    void *kcache, void *vcache, const be_batch *bt, int n_head, int n_head_kv, int head_dim,
                    int n_rot, float base, int neox, const wt *freq_div);

    /* ---- Optional: tensor parallelism (engine/arch/split.h). ----
     * group: joins bs[0..n) (backends of this kind, rank = index) into a
     * group; from then on each rank's passes run on a thread of its own, and
     * every rank queues the same ops in the same order. 0, or -1 with err
     * (nothing joined).
     * allreduce: x [n] becomes the sum of every rank's x, taken in rank
     * order, so that all ranks hold the same bits; nothing outside a group. */
    int (*group)(be *const *bs, int n, char *err, size_t errlen);
    void (*allreduce)(be *b, float *x, size_t n);
    /* A layer split's hand-over (split.h model_stages): send gives x [n]
     * to rank `to`, whose recv of n floats into its x takes it; each rank
     * queues its sends and receives in the order of the stages. */
    void (*send)(be *b, const float *x, size_t n, int to);
    void (*recv)(be *b, float *x, size_t n, int from);
} be_ops;

/* How the KV cache holds keys and values (aned --kv-type). A cache row is
 * a token's n_head_kv * head_dim values of one layer: f32, f16, or q8_0
 * blocks as ggml's (32 values, an f16 scale then 32 int8; head_dim % 32
 * == 0), so a head's values are whole blocks. */
enum { BE_KV_F32 = 0, BE_KV_F16 = 1, BE_KV_Q8_0 = 2 };
#define BE_KV_Q8_BLOCK 34   /* bytes per 32 values */

struct be {
    const be_ops *ops;
    int kv_type;           /* BE_KV_* */
    char device[192];      /* the accelerator and the kernels' path (info), or "" */
    size_t own_bytes;      /* host memory of the weights' repacked copies (CPU), logged at start */
};

/* What a backend is opened with (zero: the defaults). */
typedef struct be_opts {
    int kv_type;         /* BE_KV_* (zero: f32) */
    /* 1: a row's results never depend on the rows batched with it. The CPU
     * always holds to that; CUDA does for decode batches of up to
     * CK_GEMV_MAX_T rows, and with this at every size (slower past it). */
    int deterministic;
    /* 1 (CUDA): no f16 copies of the quantized weights for prompt matmuls:
     * less device memory, each prompt pass dequantizes instead. */
    int f16_cache_off;
    /* 1 (CUDA): matmuls of types with an int8 path take int8 activations
     * at every batch size, as the CPU's do (else prompt rows go to f16
     * tensor cores): for mixture-of-experts models, whose routers then
     * choose the experts the CPU (and llama.cpp) would. */
    int act_int8;
    /* (CUDA) the device's index (0: the first) */
    int device;
    /* 1 (CUDA): passes never recorded as graphs and replayed (a layer
     * split's stage fed through host memory: fw_join's relay) */
    int no_graphs;
} be_opts;

struct pool;
/* Opens backend `name` ("cpu", "cuda"; NULL = the best present) with
 * options o (NULL: the defaults). The pool serves the CPU backend (and
 * host-side work of others). */
int be_open_opts(be **out, const char *name, struct pool *p, const be_opts *o, char *err, size_t errlen);
/* be_open_opts with only kv_type given */
int be_open(be **out, const char *name, struct pool *p, int kv_type, char *err, size_t errlen);
int be_cpu_open(be **out, struct pool *p, int kv_type, char *err, size_t errlen);
/* Whether weight_prepare may keep weights in the kernels' own layouts (a
 * copy; on by default): before the weights are prepared. */
void be_cpu_repack(be *b, int on);
/* Bytes of n cached values (n % 32 == 0 for q8_0) */
static inline size_t be_kv_bytes(int kv_type, size_t n)
{
    return kv_type == BE_KV_Q8_0 ? n / 32 * BE_KV_Q8_BLOCK : n * (kv_type == BE_KV_F16 ? 2 : 4);
}
/* "f32", "f16", "q8_0" */
const char *be_kv_name(int kv_type);
/* Tests: 1 = the CPU backend uses only its scalar reference code. */
void be_cpu_scalar(be *b, int on);
/* Tests: router choices the CPU's moe made since the last call whose
 * last chosen and first unchosen logits were within 1e-5 (near-ties that a
 * float64 reference may break the other way); resets the count. */
long be_cpu_moe_ties(be *b);
/* Tests: a CUDA backend's ways of computing an op that it takes by
 * default for some shapes only, forced to compare them (zero: the
 * defaults). */
typedef struct be_cuda_force {
    int unfused;     /* 1: no fused kernel, no matmul input written ahead */
    int gemv_all;    /* 1: every matmul row by the GEMV */
    int glu_apart;   /* 1: matmul_glu as matmul_n then silu_mul */
    int rope_att;    /* 1: rope_attention's fused form after any q/k/v set */
    int att_mma;     /* grouped attention on tensor cores: 1 always, -1 never */
    int att_grp;     /* grouped attention's blocks per SM (-1: not grouped) */
    int portable;    /* 1: no Hopper feature (wgmma, bulk copies, programmatic
                      * dependent launch): the path of 8.x devices */
} be_cuda_force;
#ifdef ANE_CUDA
int be_cuda_open(be **out, struct pool *p, const be_opts *o, char *err, size_t errlen);
void be_cuda_force_set(be *b, const be_cuda_force *f);
#endif
/* Backends compiled into this program, e.g. "cpu" or "cpu, cuda". */
const char *be_available(void);

#endif
