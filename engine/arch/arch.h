/* arch.h — the architecture table (engine-internal).
 *
 * A family is one file of this folder: how its own hyper-parameters and
 * tensors load (over engine/load/loader.h) and its forward pass (over the
 * layer helpers of layers.h). Each architecture name is one row of the table
 * in arch.c: the family that runs it and the options, as data, that set it
 * apart from its siblings (llama, qwen2 and qwen3 are three rows of the
 * llama family). A new variant is a row; a new family is a file and a row.
 *
 * Families take the same hooks: a mixture-of-experts FFN (Qwen3-MoE,
 * Mixtral, gpt-oss) is the layer helper ly_moe_ffn beside ly_ffn_glu that a
 * family's pass calls for its layers (layers.h); per-layer attention
 * differences (gpt-oss's sliding window on some layers and sinks, q/k
 * norms) are set in layer_w and hparams by the family's load and handed to
 * the backend's attention ops by its pass; layernorm, GELU or learned
 * positions (GPT-2) are helpers beside the rmsnorm and GLU ones. */
#ifndef ANE_ARCH_H
#define ANE_ARCH_H

#include "engine/arch/forward.h"
#include "engine/load/loader.h"

struct sp;

/* Options of a row, read by its family's hooks. */
enum {
    ARCH_ROPE_NEOX = 1u << 0,   /* GGUF q/k rows rotate halves (llama's were permuted to adjacent pairs) */
    ARCH_QKV_BIAS = 1u << 1,    /* attn_{q,k,v}.bias in every layer */
    ARCH_QK_NORM = 1u << 2,     /* per-head attn_{q,k}_norm in every layer */
    ARCH_YARN = 1u << 3,        /* rope.scaling.type yarn taken (its ramp's ends floored and ceiled, as llama.cpp
                                   and transformers compute it) */
    ARCH_YARN_EXACT = 1u << 4,  /* ... with the ramp unrounded (gpt-oss defines it so: truncate false) */
    ARCH_ROPE_LINEAR = 1u << 5, /* rope.scaling.type linear taken: every pair's frequency divided by
                                   rope.scaling.factor, in the global layers (Gemma 3: the sliding ones
                                   keep theirs) */
};

/* Per-sequence state beside the KV pages (recurrent layers) and its
 * snapshots: the contracts of fw_seq_reset and fw_snap_* (forward.h). */
typedef struct arch_seq {
    void (*reset)(fw *f, int slot);
    int (*snap_count)(const fw *f);
    void (*snap_save)(fw *f, int slot, int snap);
    void (*snap_load)(fw *f, int snap, int slot);
    void (*snap_at)(fw *f, int slot, int pos, int snap);
} arch_seq;

typedef struct arch_family {
    /* The family's own hyper-parameters (model.c has read the shared ones)
     * and every tensor, checked; hp->n_attn_layers set. 0, or -1 through
     * ld_fail. */
    int (*load)(ld *l);
    /* NULL when backend ops o can run model m's pass; else what they lack,
     * for messages (the engine then runs the model on the CPU). NULL hook:
     * the base ops suffice. */
    const char *(*lacks)(const model *m, const be_ops *o);
    /* fw_open's contract but for what fw_open does for every family (the
     * lacks check, the KV caches): (*out)'s fw part filled in. */
    int (*open)(fw **out, model *m, be *b, int max_T, int max_out, int max_seqs, char *err, size_t errlen);
    /* Frees what open allocated (fw_close frees the KV caches). */
    void (*close)(fw *f);
    /* Queues every op of a pass up to the logits in f->lg (not synced). */
    void (*pass)(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out);
    /* 0 when the next pass must run its ops rather than a backend's replay
     * of a recorded one (it copies state out); NULL: always may replay. */
    int (*replayable)(const fw *f);
    const arch_seq *seq;        /* NULL: no state outside the KV pages */
    int greedy;                 /* its logits may stay on the device for the backend's argmax (fw_greedy_*) */
    /* Cuts s->r, a copy of the whole model, to rank s->rank's part
     * (split.h) and divides its hparams; 0, or -1 through split.h's
     * messages. NULL: the family does not split. Its pass then calls
     * ly_reduce after each split sum. */
    int (*split)(struct sp *s);
} arch_family;

/* A row of the table. */
typedef struct arch {
    const char *name;           /* GGUF general.architecture, HF model_type */
    const arch_family *fam;
    unsigned opt;               /* ARCH_* */
} arch;

/* What forward.c reads of an open forward state; each family's state
 * begins with it (struct llama_fw { fw base; ... }). */
struct fw {
    const arch_family *fam;
    model *m;
    be *b;
    float *lg;                  /* [max_out][n_vocab] logits of the last pass */
    float *xo;                  /* [max_out][n_embd] their input: the final norm's output rows */
    void **kc, **vc;            /* [n_layer] KV cache of each layer that attends (fw_open's) */
    size_t kv_bytes;            /* the KV pool and any per-sequence state */
    struct fw_group *grp;       /* rank 0 of a tensor-parallel group: the other ranks it drives (group.c) */
    struct fw_group *relay;     /* every rank of a layer split whose hand-overs go through host memory */
};

/* forward.c: one rank's pass (fw_pass without the group); wait(arg), where
 * not NULL, after the backend's step_begin and before the ops */
void fw_pass_one(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out,
                 void (*wait)(void *), void *arg);
/* group.c: a pass, an argmax_queue and an argmax_take on every rank of
 * f's group; its end (the other ranks' threads and passes) */
void fw_group_pass(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out);
void fw_group_argmax(fw *f, int n_out, const uint32_t *mask);
void fw_group_take(fw *f, int32_t *ids, int n_out);
void fw_group_close(fw *f);
/* the rank whose logits are the pass's: a layer split's last, else f */
fw *fw_group_out(fw *f);
/* A layer split's hand-over of x [n] to stage `to`, and its taking from
 * stage `from`: the backends' send and recv, or through host memory
 * where the group relays (fw_join) */
void fw_send(fw *f, const float *x, size_t n, int to);
void fw_recv(fw *f, float *x, size_t n, int from);

extern const arch_family arch_llama, arch_qwen35, arch_gemma3, arch_gpt2, arch_gptoss;

/* The row of `name`, or NULL. */
const arch *arch_find(const char *name);
/* "llama, qwen2, ..." into buf; returns buf. */
const char *arch_names(char *buf, size_t n);

#endif
