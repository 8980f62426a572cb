/* split.h — a model split over the ranks of a tensor-parallel group
 * (engine-internal).
 *
 * Rank r of n holds the r-th n-th of every attention layer's heads (the
 * rows of q, k, v and their biases, the columns of the output projection;
 * with fewer key/value heads than ranks, the one its query heads read, so
 * that ranks share it)
 * and of every FFN's hidden units (the rows of gate and up, the columns of
 * down; for experts, of each expert's, or where those do not split in
 * whole blocks, the r-th n-th of the experts whole: expert parallelism,
 * be_moe.n_held), and all of the rest (embeddings,
 * norms, routers, the output matrix). Each rank's attention and FFN then
 * give a partial sum of the layer's output, which the backends' allreduce
 * adds up (layers.h ly_reduce) before the residual: two all-reduces a
 * layer. A bias added after a split sum (attention output, experts' down)
 * is rank 0's alone. Rows are a view into the file; columns are copies
 * owned by the rank's model. A family splits its models by its hook
 * (arch_family.split) over the helpers below. */
#ifndef ANE_SPLIT_H
#define ANE_SPLIT_H

#include "engine/load/model.h"

#include <stddef.h>

/* ranks[0..n) = the models of each rank (their own hparams: heads, n_ff
 * and n_ff_exp divided by n; weight_bytes theirs). 0, or -1 with err
 * naming the file and what does not divide (nothing left allocated). */
int model_split(const model *m, int n, model **ranks, char *err, size_t errlen);
/* The same with every mixture-of-experts layer's experts whole (tests) */
int model_split_experts(const model *m, int n, model **ranks, char *err, size_t errlen);
void model_split_free(model *rank);
/* The layer split: ranks[r] = stage r of n, the r-th n-th of the layers
 * whole (the first also the embeddings, the last the output), which takes
 * the residual stream from stage r - 1 and hands it to stage r + 1 (be_ops
 * send and recv): one hand-over of T x n_embd floats a stage a pass, for
 * GPUs without a fast link. Not for families with per-sequence state.
 * model_split_free frees each. */
int model_stages(const model *m, int n, model **ranks, char *err, size_t errlen);
/* The same with stage r's layers from first[r] (first[0] == 0, rising, all
 * below n_layer): a CPU stage before a GPU's (--gpu-layers) */
int model_stages_from(const model *m, int n, const int *first, model **ranks, char *err, size_t errlen);

/* A split in progress, for the families' hooks. */
typedef struct sp {
    int rank, n;
    model *r;                 /* the rank's model (a copy of the whole one, being cut) */
    char *err; size_t errlen;
    int failed;
    int experts_whole;        /* experts whole even where their units split */
} sp;
/* The r-th n-th of the rows of each of w's n_mat matrices (all of w's
 * rows when n_mat <= 1). name: for messages. */
void sp_rows(sp *s, wt *w, const char *name, int layer);
/* The r-th n-th of every row's values: whole blocks of w's type. */
void sp_cols(sp *s, wt *w, const char *name, int layer);
/* The same with part `part` of `parts` in place of the rank's (key/value
 * heads fewer than the ranks: each rank takes its group's whole head). */
void sp_rows_part(sp *s, wt *w, const char *name, int layer, int part, int parts);
void sp_cols_part(sp *s, wt *w, const char *name, int layer, int part, int parts);
/* Rank 0 keeps w, the others have none (a bias added after a split sum). */
void sp_first(sp *s, wt *w);
/* The split fails with err "<file>: " and fmt's message */
void sp_fail(sp *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* -1 with err naming the file, when a hyper-parameter v does not divide
 * over the ranks */
int sp_divides(sp *s, int64_t v, const char *what);

/* The split of the families whose layers are attention and an FFN (or
 * experts): q, k, v and their biases by heads, the output projection's
 * columns, gate and up (and their biases) by units, down's columns, the
 * sinks by heads; the biases after a split sum (attention output, down)
 * rank 0's. Families: .split = sp_layers, and ly_reduce after wo and
 * after the FFN. */
int sp_layers(sp *s);

#endif
