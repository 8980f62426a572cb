/* kernels.h — launchers of the CUDA kernels (the .cu files of shaders/)
 * for the CUDA backend (engine/backend_cuda.c). Every launcher queues work on
 * `st` and returns at once; pointers are device memory unless said otherwise.
 * Weights stay in their GGUF block layout (q8_0 and q6_K repacked within
 * each row, same bytes); rows are row_bytes apart.
 * Per-step batch data (ids, pos, page tables) lives in a device block:
 *   pos[T], off[T] (start of token t's page table in pages[]), pages[]. */
#ifndef ANE_CUDA_KERNELS_H
#define ANE_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the device and this build's code offer the kernels (docs/cuda.md,
 * "Which GPUs"). ck_feat_probe fills it at open from the device's compute
 * capability and a probe kernel (which code the device runs), and makes it
 * the one the launchers follow; ck_feat_use sets the one they follow
 * (tests: every Hopper feature off, the portable path). */
typedef struct ck_feat {
    int cc;          /* compute capability, 10 * major + minor (90: Hopper) */
    int code;        /* the architecture of the code the device runs: 80, 86, 89, 90, 120... */
    int wgmma;       /* warpgroup MMAs: sm_90a code on a 9.x device */
    int bulk;        /* cp.async.bulk with an mbarrier: code for 9.0 and later */
    int pdl;         /* programmatic dependent launch: 9.0 and later devices running code for them */
    int smem_optin;  /* dynamic shared memory a block may opt into, bytes */
} ck_feat;
/* 0, or -1 with a message in err: no code in this build for the device
 * (built without its CUDA_ARCH), or the probe failed. */
int ck_feat_probe(ck_feat *f, char *err, size_t errlen);
void ck_feat_use(const ck_feat *f);
const ck_feat *ck_feat_now(void);

/* 1 when the kernels know weight type `type`. */
int ck_type_ok(uint32_t type);
/* 1 when debug switch `name` (an environment variable, docs/cuda.md) is
 * set to 0: the feature it names is off. */
int ck_debug_off(const char *name);

/* out[t] = row ids[t] of W as f32.                              out [T][n_in] */
void ck_embed(cudaStream_t st, uint32_t type, const void *W, size_t row_bytes, int n_in,
              const int32_t *ids, int T, float *out);
/* out[r] = x[r] / rms(x[r]) * w                                  [rows][n]
 * xq (or NULL; n % 32 == 0): also out's int8 form for the GEMV, as
 * CK_XQ_BYTES(rows, n) scratch, the same bits as ck_gemv_multi's own
 * quantization: then ck_gemv_multi_q can take it. x16 (or NULL): also
 * out's f16 form [rows][n], the same values as ck_f32_to_f16 gives. (So
 * for add_rmsnorm, silu_mul and attention.) */
void ck_rmsnorm(cudaStream_t st, const float *x, const float *w, int rows, int n, float eps, float *out, void *xq,
                void *x16);
/* out[t][r] = dot(row r, x[t]) (+ bias[r]) f32 arithmetic; */
#define CK_GEMV_MAX_T 16
/* (larger T: passes of CK_GEMV_MAX_T tokens) */
void ck_gemv(cudaStream_t st, uint32_t type, const void *W, size_t row_bytes, int n_in, int n_out,
             const float *bias, const float *x, int T, float *out, void *xq_scratch);
/* q8_0 weights live on the device repacked (same bytes per row): a row's
 * 32-byte quant blocks, then its f16 scales. Every kernel reads that layout. */
void ck_repack_q8_0(cudaStream_t st, const void *src, void *dst, size_t row_bytes, int n_in, int n_out);
/* q6_K likewise (same bytes per row): aligned words for the int8 GEMV
 * (the layout: q6_word in shaders/common.cuh). */
void ck_repack_q6_K(cudaStream_t st, const void *src, void *dst, size_t row_bytes, int n_in, int n_out);
/* Types with an int8 path (x quantized per 32 values, __dp4a dots), used when
 * xq_scratch (CK_XQ_BYTES(T, n_in) bytes) is given; else f32 arithmetic. */
int ck_gemv_int8(uint32_t type, int n_in);
/* Decode batches past the GEMV's (CK_GEMV_MAX_T < T <= CK_MMQB_MAX_T) of
 * q4_K matrices, and of q6_K ones on Hopper (ck_mmqb_ok, ck_feat.wgmma) in a
 * layout of their own (ck_repack_q6_Kb from ck_repack_q6_K's, rows
 * ck_q6b_row_bytes apart, which is the row_bytes to pass then):
 * out[i][t][r] = dot(row r of W[i], x[t])
 * (+ bias[i][r]), the quantized weights read once for all T tokens and
 * dequantized to f16 for f16 tensor cores; x16 is x [T][n] in f16 (as for
 * cuBLAS). Other arithmetic than the GEMV's (outside the batch-invariance
 * promise). part (part_bytes) and cnt (n_cnt ints, zero, left zero) are
 * scratch for matrices whose rows are split over several blocks (how many:
 * from n_sm, the device's SM count); with too little, no split (slower). */
#define CK_MMQB_MAX_T 32   /* (wider decode batches: cuBLAS, faster there: docs/benchmarks-cuda.md) */
#define CK_MMQB_PART (32u << 20)   /* part_bytes ample for any model */
#define CK_MMQB_CNT 16384
int ck_mmqb_ok(uint32_t type, int n_in);
size_t ck_q6b_row_bytes(int n_in);
void ck_repack_q6_Kb(cudaStream_t st, const void *src, void *dst, size_t row_bytes, int n_in, int n_out);
void ck_mmq_dec(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t row_bytes, int n_in,
                const int *n_out, const float *const *bias, int T, float *const *out, const void *x16, void *part,
                size_t part_bytes, int *cnt, int n_cnt, int n_sm);
/* Gate, up and silu_mul of a decode batch as above: out [T][F] =
 * silu(Wg x) * (Wu x) and its f16 form to h_out (not x16), the same bits as
 * ck_mmq_dec of {Wg, Wu} then ck_silu_mul. 0 (nothing done) where it does
 * not apply: not q4_K, F not a multiple of 64, or no h_out. */
int ck_mmq_glu_try(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t row_bytes, int n_in, int F,
               int T, float *out, void *h_out, const void *x16, void *part, size_t part_bytes, int *cnt, int n_cnt,
               int n_sm);
#define CK_XQ_BYTES(T, n) ((size_t)(T) * (size_t)(n) + (size_t)(T) * ((size_t)(n) / 32) * 8)
/* Several matrices of one type and n_in on the same x, in one launch. */
#define CK_MULTI_MAX 3
void ck_gemv_multi(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t row_bytes, int n_in,
                   const int *n_out, const float *const *bias, const float *x, int T, float *const *out,
                   void *xq_scratch);
/* One token's out = silu(Wg x) * (Wu x) (both n_out x n_in, of one type
 * and row_bytes) in one launch, x already quantized in xq (as for
 * ck_gemv_multi_q), out's int8 form to act_forms_for (another scratch than xq;
 * or NULL) and f16 form to x16_out (or NULL): the same bits as
 * ck_gemv_multi then ck_silu_mul. Only where ck_glu_ok. */
int ck_glu_ok(uint32_t type, int n_in, int n_out, int T, int n_sm);
/* 1 for GEMV sets of `bytes` small enough to be launch-bound (the GEMV's
 * prefetch rule: up to 5 MiB). */
int ck_small_set(size_t bytes);
void ck_gemv_glu(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t row_bytes, int n_in,
                 int n_out, const void *xq, float *out, void *act_forms_for, void *x16_out);
/* x += y; out = x / rms(x) * w (out may be y)                    [rows][n] */
void ck_add_rmsnorm(cudaStream_t st, float *x, const float *y, const float *w, int rows, int n, float eps,
                    float *out, void *xq, void *x16);
/* ck_gemv_multi of an int8 type on x already quantized into xq (by one of
 * the producers above, with the same T and n_in). */
/* x [rows][n] (n % 32 == 0) quantized into xq (CK_XQ_BYTES(rows, n)) as
 * ck_gemv_multi quantizes its input */
void ck_quant_x(cudaStream_t st, const float *x, int rows, int n, void *xq);
void ck_gemv_multi_q(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t row_bytes, int n_in,
                     const int *n_out, const float *const *bias, int T, float *const *out, void *xq);
/* dst [n_out][n_in] f16 = W dequantized. */
void ck_dequant_f16(cudaStream_t st, uint32_t type, const void *W, size_t row_bytes, int n_in, int n_out,
                    void *dst);
/* dst [n_out][n_in] f32 = W dequantized. */
void ck_dequant_f32(cudaStream_t st, uint32_t type, const void *W, size_t row_bytes, int n_in, int n_out,
                    float *dst);
/* dst f16 = x (saturated to the f16 range).                                [n] */
void ck_f32_to_f16(cudaStream_t st, const float *x, size_t n, void *dst);
/* out[t][r] += bias[r]                                           [T][n_out] */
void ck_add_bias(cudaStream_t st, float *out, const float *bias, int T, int n_out);
void ck_add(cudaStream_t st, float *x, const float *y, size_t n);
/* out = gelu(x) (tanh form) * u (u NULL: gelu(x))                 [n] */
void ck_gelu_mul(cudaStream_t st, const float *x, const float *u, size_t n, float *out);
/* x *= s                                                          [n] */
void ck_scale(cudaStream_t st, float *x, size_t n, float s);
/* out[r] = (x[r] - mean) / sqrt(var + eps) * w + b (b NULL: none)  [rows][n] */
void ck_layernorm(cudaStream_t st, const float *x, const float *w, const float *b, int rows, int n, float eps,
                  float *out);
/* x[t] += row pos[t] of tab (kind 0 f32, 1 f16, 2 bf16)          [T][n] */
void ck_add_pos(cudaStream_t st, float *x, const void *tab, int kind, size_t row_bytes, const int32_t *pos, int T,
                int n);
/* out = silu(g) * u                               [n]; xq: out as [rows][n/rows] */
void ck_silu_mul(cudaStream_t st, const float *g, const float *u, size_t n, float *out, void *xq, void *x16, int rows);
/* neox, in every rope kernel: the mode, bit 0 rotate halves (else adjacent
 * pairs), bit 1 freq_div[n_rot/2] scales cos and sin (YaRN; backend.h) */
void ck_rope(cudaStream_t st, float *x, const int32_t *pos, int T, int n_heads, int head_dim, int n_rot,
             float base, int neox, const float *freq_div);
/* The KV cache's forms (the `f16` argument of the cache's launchers): 0
 * f32, 1 f16, CK_KV_Q8_0 ggml's q8_0 blocks of CK_KV_Q8_BLOCK bytes (an f16
 * scale, 32 int8), a row's kv_dim / 32 of them (kv_dim % 32 == 0);
 * ck_rope_kv takes all three, the rope inside the attention or the matmul
 * and the tensor-core attention f16 and f32 only */
#define CK_KV_Q8_0 2
#define CK_KV_Q8_BLOCK 34
void ck_kv_store(cudaStream_t st, void *kc, void *vc, int f16, const int32_t *pos, const int32_t *off,
                 const int32_t *pages, int T, int kv_dim, const float *k, const float *v);
/* ck_rope of q [T][n_head][hd] and k [T][n_head_kv][hd], then ck_kv_store
 * of k and v, in one launch (the same values); bq, bk, bv (or NULL):
 * biases added to q, k, v first, q and k keeping them. tab ([T][n_rot/2]
 * float pairs, or NULL) and tab_mode: 0 the angles computed, 1 computed
 * and written to tab, 2 read from tab (the same values). */
void ck_rope_kv(cudaStream_t st, float *q, float *k, const float *v, void *kc, void *vc, int f16,
                const int32_t *pos, const int32_t *off, const int32_t *pages, int T, int n_head, int n_head_kv,
                int hd, int n_rot, float base, int neox, const float *fd, const float *bq, const float *bk,
                const float *bv, void *tab, int tab_mode);
/* One token's q, k, v projections (q8_0, the same n_in, no biases in the
 * matmul) with ck_rope_kv's rope and KV store in their epilogue: q, k as
 * ck_rope_kv leaves them, v as the matmul leaves it, both cache rows
 * written; the same bits as ck_gemv_multi_q then ck_rope_kv. n_rot ==
 * head_dim. tab: the pass's angle table (ck_rope_kv's), or NULL to
 * compute them. Returns 0 (and launches nothing) for shapes it does not
 * take: rows under 2048 values or not two warps a row, or other types. */
typedef struct ck_qkv_rope {
    const float *bq, *bk, *bv;   /* biases, or NULL */
    const void *tab;
    const int32_t *pos, *off, *pages;   /* the batch block (one token) */
    void *kc, *vc;
    int f16, head_dim, n_rot, neox, n_head_kv;
    float base;
    const float *fd;   /* rope frequency divisors, or NULL */
} ck_qkv_rope;
int ck_gemv_qkv_rope_try(cudaStream_t st, uint32_t type, const void *const *W, size_t rb, int n, const int *n_out,
                     const void *xq, float *const *out, const ck_qkv_rope *r);
/* Causal attention over the paged cache (xq: also out's int8 form, as
 * ck_rmsnorm; head_dim % 32 == 0). A token's positions go in spans of
 * CK_ATT_SPAN, merged in order, so its result does not depend on the batch.
 * G > 1 spreads the spans of each (token, head) over G blocks of
 * CK_ATT_WARPS warps, a span per warp (flash-decoding): `part` then holds
 * T*n_head*maxs*(head_dim+2) floats, and maxs must be at least the spans
 * of the longest token. head_dim <= 256. n_sm: the device's SM count
 * (launches of fewer blocks take the kernel's rolled form). grp > 0 (no
 * rp; ck_att_grp_ok): a block per (token, KV head) and each of grp parts
 * of its spans, a warp per q head, the K and V rows read once per group
 * (grp > 1: every span's partial to `part` as with G > 1): the same bits.
 * mma (with grp; f16 caches, head_dim 64 or 128): the group's heads on
 * tensor cores instead, f32-accurate but other bits (for batches outside
 * the batch-invariance promise). */
#define CK_ATT_SPAN 32
#define CK_ATT_WARPS 4
/* rp (or NULL): a batch of decode tokens (one per sequence) whose
 * ck_rope_kv in table mode 2 the attention does itself: q, k, v as the
 * projections left them (with the biases or NULL), the same values in q's
 * use and in the caches as ck_rope_kv then ck_attention. */
typedef struct ck_rope_in {
    const float *k, *v, *bq, *bk, *bv;
    const void *tab;   /* the pass's angles, written by its first ck_rope_kv */
    int n_rot, neox;
} ck_rope_in;
/* whether ck_attention can group these heads (2..8 q heads per KV head,
 * a head's cache row of at most 512 bytes, in 16-byte pieces) */
int ck_att_grp_ok(int f16, int n_head, int n_head_kv, int hd);
/* whether it can take them to tensor cores (mma: f16 caches, head_dim 64 or 128) */
int ck_att_mma_ok(int f16, int n_head, int n_head_kv, int hd);
/* > 0 where ck_attention's blocks (G >= 1, no grp) take each span with all
 * their warps (head_dim 32 * CK_ATT_WARPS; the same bits, a shorter chain):
 * with G == 1 for tokens of up to that many spans, and with G > 1 always,
 * best at G as many as the spans (a span per block) */
int ck_att_coop(int hd);
/* > 0 where a launch of G == 1 with at most a block per SM (no rp, no grp)
 * takes several spans at once, a group of CK_ATT_WARPS warps on each (the
 * same bits): the spans up to which a token's (token, head) stays in one
 * block rather than split (head_dim 32 * CK_ATT_WARPS) */
int ck_att_par(int hd);
/* T: the rows [0, T) computed, of T_all (out's rows, and its forms') */
void ck_attention(cudaStream_t st, const float *q, const void *kc, const void *vc, int f16,
                  const int32_t *pos, const int32_t *off, const int32_t *pages, int T, int T_all, int n_head,
                  int n_head_kv, int head_dim, float *out, float *part, int G, int maxs, void *xq, void *x16,
                  int n_sm, const ck_rope_in *rp, int grp, int mma);
/* Attention with be_attn_ex's extras: positions pos-window+1..pos
 * (window 0: all), sinks (device f32 [n_head], or NULL) in the softmax's
 * denominator, q·k times scale. A warp per (token, head); head_dim <= 256. */
void ck_attention_ex(cudaStream_t st, const float *q, const void *kc, const void *vc, int f16, const int32_t *pos,
                     const int32_t *off, const int32_t *pages, int T, int n_head, int n_head_kv, int hd, int window,
                     const float *sinks, float scale, float *out);
/* A prompt's attention on tensor cores (outside the batch-invariance
 * promise, f32-accurate): rows [t_first, T) of q, as ck_attention's (and
 * out's forms for T rows, xq / x16 or NULL) with ck_attention_ex's window
 * (0: none), sinks (or NULL) and scale. A block takes
 * ck_att_prompt_tokens() consecutive tokens' q heads of one KV head and
 * reads each cached K and V row once for them; tokens of one sequence (the
 * same page table) share the reads. kv: the cache type (ck_attention's
 * f16). ck_att_prompt_ok: f16 and q8_0 caches, head_dim 64 or 128, up to
 * 16 q heads per KV head. */
int ck_att_prompt_ok(int kv, int n_head, int n_head_kv, int hd);
int ck_att_prompt_tokens(int n_head, int n_head_kv);
void ck_att_prompt(cudaStream_t st, const float *q, const void *kc, const void *vc, int kv, const int32_t *pos,
                   const int32_t *off, const int32_t *pages, int t_first, int T, int n_head, int n_head_kv, int hd,
                   int window, const float *sinks, float scale, float *out, void *xq, void *x16);
/* ids[r] = argmax of row r of x [rows][n] (first of equals) among the
 * tokens whose bit is set in mask (device [rows][(n + 31) / 32], or NULL:
 * all; none set: 0). part (or NULL): a scratch of CK_ARGMAX_PART bytes,
 * with which fewer than 64 rows are each split over several blocks. */
#define CK_ARGMAX_PART (64 * 32 * 8)
void ck_argmax(cudaStream_t st, const float *x, int rows, int n, const uint32_t *mask, int32_t *ids, void *part);

/* Mixture of experts (moe.cu; the op of backend.h's be_moe, gating and
 * act as its BE_MOE_* numbers). Routing: ids, wts [T][K] from the logits
 * lg [T][X] (X <= 1024). Grouping of the N = T*K pairs by expert:
 * first [X+1], slot [N] (pair -> slot), pair [N] (slot -> pair), and the
 * tiles (expert, first slot, slots) of up to tt slots (CK_MOE_TT, or
 * CK_MOE_TC_TT for the tensor-core kernels), as int32 triples, their count
 * in *n_tiles (at most ck_moe_tiles_max(N, X, tt)). */
#define CK_MOE_TT 16
#define CK_MOE_TC_TT 64
#define CK_MOE_RT 64
#define ck_moe_tiles_max(N, X, tt) (((N) + (tt) - 1) / (tt) + (X))
#define ck_moe_max_tiles(N, X) ck_moe_tiles_max(N, X, CK_MOE_TT)
/* Routing over X experts; each id then its expert's index among the nh
 * held from e0 on (expert parallelism), -1 for another rank's. Grouping
 * over the nh held: a pair of id -1 gets slot -1 and no tile, and the
 * combines below skip it (0 where a token has none here). */
void ck_moe_route(cudaStream_t st, const float *lg, int T, int X, int K, int gating, int norm, float scale, int e0,
                  int nh, int32_t *ids, float *wts);
void ck_moe_group(cudaStream_t st, const int32_t *ids, int N, int X, int tt, int32_t *first, int32_t *slot,
                  int32_t *pair, int32_t *tiles, int32_t *n_tiles);
/* Both in one launch (one block: for batches of a few tokens) */
#define CK_MOE_RG_MAX_T 32
void ck_moe_route_group(cudaStream_t st, const float *lg, int T, int X, int K, int gating, int norm, float scale,
                        int e0, int nh, int32_t *ids, float *wts, int32_t *first, int32_t *slot, int32_t *pair,
                        int32_t *tiles, int32_t *n_tiles);
/* y [N][rows] by slot = each tile's expert's rows (W: stacked experts of
 * `rows` rows each, n values a row) on x (rows of n: by token, pair / K,
 * when by_token, else by slot) (+ bias [X][rows], or NULL); f32
 * arithmetic, the same per (slot, row) in any tile. mv: by the warp-per-row
 * kernel (decode-sized batches; max_tiles then bounds the grid), whose sums
 * are in another order than the tiled kernel's */
void ck_moe_mm(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const float *x,
               int by_token, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles, int max_tiles,
               const float *bias, float *y, int mv);
/* Types whose experts take int8 activations (n % 32 == 0), and their
 * products as ck_moe_mm's mv form: x quantized by ck_quant_x into xq
 * (x_rows rows of n), the CPU's kind of arithmetic, one form for every
 * batch size (a (slot, row) output depends on nothing else). */
int ck_moe_int8(uint32_t type, int n);
void ck_moe_mmq(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const void *xq,
                int x_rows, int by_token, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                int max_tiles, const float *bias, float *y);
/* The gate and up products of int8 experts (both of one type and row
 * length, ck_moe_gluq_ok), act of the two, into hg [N][F] by slot (f32,
 * when not NULL) and its int8 form hq (CK_XQ_BYTES(N, F), when not NULL),
 * the same bits as ck_moe_mmq twice, ck_moe_act and ck_quant_x. */
int ck_moe_gluq_ok(uint32_t gate_type, size_t gate_rb, uint32_t up_type, size_t up_rb, int n, int F);
void ck_moe_gluq(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int F,
                 const void *xq, int x_rows, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                 int max_tiles, const float *bg, const float *bu, int act, float alpha, float limit, float *hg,
                 void *hq, int N);
/* out [T][E] = the down products of the T tokens' K pairs (int8 experts,
 * hq: the activations by slot, N rows of F) summed by the weights, the
 * same bits as ck_moe_mmq and ck_moe_combine; K <= ck_moe_downq_ok's bound.
 * A warp per (token, row) reads its K experts' rows: for a few tokens. */
int ck_moe_downq_ok(uint32_t type, int F, int K);
void ck_moe_downq(cudaStream_t st, uint32_t type, const void *W, size_t rb, int F, int E, const void *hq, int N, int T,
                  int K, const int32_t *ids, const int32_t *slot, const float *wts, const float *bias, float *out);
/* The experts' products of prompt batches on int8 tensor cores
 * (moe_tc.cu), tiles of up to CK_MOE_TC_TT slots, for the types of
 * ck_moe_int8: each 32 values' integer dots exact, then scaled and summed
 * in f32 in value order, so another order than ck_moe_mmq's (and not
 * batch-invariant: for batches past CK_MOE_RG_MAX_T, not deterministic).
 * ck_moe_tc_mm: as ck_moe_mmq; ck_moe_tc_glu: as ck_moe_gluq, into hq
 * only (F % 32 == 0). */
void ck_moe_tc_mm(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const void *xq,
                  int x_rows, int by_token, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                  int max_tiles, const float *bias, float *y);
void ck_moe_tc_glu(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int F,
                   const void *xq, int x_rows, int K, const int32_t *pair, const int32_t *tiles,
                   const int32_t *n_tiles, int max_tiles, const float *bg, const float *bu, int act, float alpha,
                   float limit, void *hq, int N);
/* The same for one matrix of those types on all T rows of xq: y [T][rows]
 * (+ bias), the int8 GEMV's arithmetic in another order of the sums (for
 * the prompts of models whose experts take int8 activations). */
void ck_tc_matmul(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const void *xq, int T,
                  const float *bias, float *y);
/* g = act(g, u)                                                     [n] */
void ck_moe_act(cudaStream_t st, float *g, const float *u, size_t n, int act, float alpha, float limit);
/* out[t] = sum over k of w[t][k] * y[slot[t*K+k]], k in order    [T][E] */
void ck_moe_combine(cudaStream_t st, const float *y, const int32_t *slot, const float *w, int T, int K, int E,
                    float *out);

#ifdef __cplusplus
}
#endif
#endif
