/* forward.h — the forward pass over a batch of tokens from any number of
 * sequences (engine-internal): the model's architecture family (arch.h)
 * runs it against backend ops. fw owns the activation buffers (sized for
 * max_T tokens), the KV cache pool (n_pages pages of KV_PAGE tokens for
 * every layer that attends) and any per-sequence state. */
#ifndef ANE_FORWARD_H
#define ANE_FORWARD_H

#include "engine/backend/backend.h"
#include "engine/load/model.h"

typedef struct fw fw;

/* Several GPUs: fs[0..n) are the open passes of the ranks of a split
 * model (split.h: model_split's heads, or model_stages' layers), on
 * backends joined by be_ops.group. Afterwards every call on fs[0] runs on
 * all of them (ranks 1.. on threads of their own) and reads its results
 * from rank 0 (a layer split: from its last stage); fw_close(fs[0])
 * closes the others (not their backends or models). Models whose family
 * splits keep no per-sequence state. relay > 0: a layer split over
 * backends of different kinds, not joined (the CPU, then a GPU:
 * --gpu-layers): each hand-over of up to relay floats goes to host memory
 * (the sender's to_host) and from there to the next stage (its to_dev).
 * 0, or -1 with err (nothing joined). */
int fw_join(fw *const *fs, int n, size_t relay, char *err, size_t errlen);

/* max_seqs: sequence slots for per-sequence state (recurrent layers). */
int fw_open(fw **out, model *m, be *b, int max_T, int max_out, int n_pages, int max_seqs,
            char *err, size_t errlen);
/* NULL when backend ops o can run m; else what they lack (for messages). */
const char *fw_lacks(const model *m, const be_ops *o);
/* A new sequence takes `slot`: clears its per-sequence state. */
void fw_seq_reset(fw *f, int slot);
void fw_close(fw *f);
/* Recurrent-state snapshots (models with per-sequence state; 0 of them
 * elsewhere): save copies slot's state into snapshot `snap`, load the
 * reverse. Both queue backend work like fw_run. */
int fw_snap_count(const fw *f);
void fw_snap_save(fw *f, int slot, int snap);
void fw_snap_load(fw *f, int snap, int slot);
/* The next fw_run saves slot's state right after its token at position
 * pos-1 (which must be in that batch) into snapshot `snap`. */
void fw_snap_at(fw *f, int slot, int pos, int snap);
size_t fw_kv_bytes(const fw *f);          /* bytes of the KV pool and per-sequence state */
/* Bytes of one KV page over the layers that are paged (with m->swa_ring
 * set, the sliding-window layers are not). */
size_t fw_kv_page_bytes(const model *m, int kv_type);
/* The sliding-window layers' ring (m->swa_ring) for a model, backend ops o,
 * batches of up to max_T tokens and contexts of n_ctx: the window plus
 * max_T - 1 rows (a batch writes all of its keys before any is read, so
 * none of one sequence's may land on a row its window still needs), in
 * whole pages; 0 where the model has no such layers, o lacks kv_ring, or
 * the ring would be no shorter than the context. */
int fw_swa_ring(const model *m, const be_ops *o, int max_T, int n_ctx);
/* Bytes of one sequence slot's rings over every sliding-window layer. */
size_t fw_kv_ring_bytes(const model *m, int kv_type);

/* The memory a model needs where the backend keeps everything (an
 * accelerator), estimated before anything is allocated, so that a device
 * too small is a start-up error rather than a failure mid-request. */
typedef struct fw_mem {
    size_t weights;   /* the model's weights as uploaded */
    size_t kv;        /* the KV pool: n_pages pages, and max_seqs slots' rings */
    size_t state;     /* per-sequence recurrent state and its snapshots */
    size_t act;       /* activation buffers for max_T tokens, max_out logit rows */
    size_t scratch;   /* the largest matrix in f16 (prompt matmuls dequantize into it) + the backend's own buffers */
    size_t total;
} fw_mem;
#define FW_MEM_BACKEND ((size_t)160 << 20)   /* cuBLAS workspace, split-K partials, graphs, quantized inputs */
void fw_mem_estimate(const model *m, int kv_type, size_t n_pages, int max_T, int max_out, int max_seqs, fw_mem *out);

/* Runs tokens[0..bt->T) (T <= max_T) and writes the logits of the tokens
 * out_idx[0..n_out) (n_out <= max_out) to host memory logits [n_out][n_vocab]. */
void fw_run(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out,
            float *logits);
/* After fw_run: the hidden states after the final norm (the output
 * projection's input) of its n_out output rows to host memory
 * hidden [n_out][n_embd]. */
void fw_hidden(fw *f, float *hidden, int n_out);
/* As fw_run, but writes only the greedy choice (first argmax of the logits,
 * among the tokens mask allows where it is not NULL: host bits
 * [n_out][(n_vocab + 31) / 32], see be_ops.argmax) of each output row to
 * host ids[n_out]: the logits stay on the device. Only where fw_greedy_ok
 * (the backend has an argmax). */
int fw_greedy_ok(const fw *f);
void fw_run_greedy(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out,
                   const uint32_t *mask, int32_t *ids);
/* The same in parts, so that a next pass can be queued before the ids of
 * this one are read, and a grammar's mask be computed while its pass runs:
 * fw_pass_queue queues the pass (0; -1 where the backend cannot, or
 * n_out > BE_QUEUE_ROWS: nothing queued), fw_argmax_queue the argmax of the
 * pass queued last, fw_greedy_take waits for the oldest queued argmax's
 * ids. A pass whose bt->ids_dev is set takes as its tokens the ids of the
 * argmax queued before it (rows 0..T-1; tokens is then NULL). At most two
 * argmaxes are queued. */
int fw_pass_queue(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out);
void fw_argmax_queue(fw *f, int n_out, const uint32_t *mask);
void fw_greedy_take(fw *f, int32_t *ids, int n_out);

#endif
