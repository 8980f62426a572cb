/* forward_qwen35.h — the Qwen3.5 hybrid forward pass (engine-internal):
 * forward.c hands models of ARCH_QWEN35 to these; contracts as in forward.h.
 * Besides the KV pool (full-attention layers only), it keeps per sequence
 * slot a conv state and a delta-rule state for every linear layer: fixed
 * memory per sequence, whatever its length; and up to 2*max_seqs snapshots
 * of that state for prefix reuse (within 512 MiB). */
#ifndef ANE_FORWARD_QWEN35_H
#define ANE_FORWARD_QWEN35_H

#include "engine/backend/backend.h"
#include "engine/load/model.h"

typedef struct fwq fwq;

int fwq_open(fwq **out, model *m, be *b, int max_T, int max_out, int n_pages, int max_seqs,
             char *err, size_t errlen);
void fwq_seq_reset(fwq *f, int slot);
void fwq_close(fwq *f);
int fwq_snap_count(const fwq *f);
void fwq_snap_save(fwq *f, int slot, int snap);
void fwq_snap_load(fwq *f, int snap, int slot);
void fwq_snap_at(fwq *f, int slot, int pos, int snap);
size_t fwq_kv_bytes(const fwq *f);          /* KV pool and recurrent state */
size_t fwq_kv_page_bytes(const model *m, size_t kv_elt);
void fwq_run(fwq *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out,
             float *logits);

#endif
