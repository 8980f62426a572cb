/* engine.h — the engine's whole public surface; the daemon includes nothing
 * else from engine/ (engine/README.md maps the rest).
 *
 * One eng owns one resident model (weights mmapped read-only), its tokenizer,
 * the KV cache pool and one worker thread that runs every forward pass.
 * Any thread may call eng_submit/eng_cancel/eng_tokenize/eng_stats_get; the
 * worker never calls back into the caller except through opts.notify, which
 * must only wake the caller's loop (ev_async_send). Results are then taken
 * with eng_events_take() on the caller's thread.
 *
 * Conventions: 0 ok, -1 error; messages through (char *err, size_t errlen). */
#ifndef ANE_ENGINE_H
#define ANE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"

typedef struct eng eng;

/* KV cache types (eng_opts.kv_type): f16 the default; q8_0 about half
 * its bytes (docs/cuda.md gives the accuracy); f32 twice them */
enum { ENG_KV_F16 = 0, ENG_KV_Q8_0 = 1, ENG_KV_F32 = 2 };
/* their names, indexed by ENG_KV_* (NULL-terminated): what --kv-type takes */
extern const char *const eng_kv_types[];

/* How embed jobs pool the hidden states after the final norm (eng_opts.pooling;
 * 1..3 are llama.cpp's pooling_type values): ENG_POOL_MODEL takes the GGUF's
 * <arch>.pooling_type, and last-token pooling where it names none (or none /
 * rank), the right one for decoder models (Qwen3-Embedding and kin). */
enum { ENG_POOL_MODEL = 0, ENG_POOL_MEAN = 1, ENG_POOL_CLS = 2, ENG_POOL_LAST = 3 };

typedef struct eng_opts {
    const char *model_path; /* GGUF file or Hugging Face directory */
    const char *backend;    /* "cpu", "cuda", or NULL for the best present */
    int n_threads;          /* matmul threads; 0 = online cores */
    int n_ctx;              /* max tokens per sequence; 0 = the model's trained context (lowered to what the KV pool holds) */
    /* bytes for the shared KV pool, whose pages sequences take as they grow;
     * 0 = what fits (the CPU: a quarter of physical memory; a GPU: its free
     * memory after the rest and the f16 weight copies, less 1/16), at most
     * max_seqs full contexts */
    size_t kv_budget;
    int max_seqs;           /* sequences in one batched forward pass; 0 = 16 */
    int max_queued;         /* jobs waiting beyond max_seqs before ENG_EBUSY; 0 = 256 */
    int kv_type;            /* ENG_KV_*: how the KV cache holds keys and values (aned --kv-type) */
    /* 1: sliding-window layers keep the KV of every position, paged with
     * the rest (prefix reuse works for their models), instead of a ring of
     * their window per sequence (aned --swa-full) */
    int swa_full;
    /* Called on the worker thread whenever events were queued. Must not call
     * into the engine; typically ev_async_send(). May be NULL (then poll). */
    void (*notify)(void *arg);
    void *notify_arg;
    /* Backend options that change results or memory (be_opts): */
    int deterministic;      /* 1: a sequence's results never depend on the others batched with it (aned --deterministic) */
    int cuda_f16_cache_off; /* 1: no f16 weight copies on the GPU for prompts (aned --cuda-f16-cache off) */
    int cpu_repack_off;     /* 1: the CPU keeps every weight in the file's layout (aned --cpu-repack off) */
    /* A line for the daemon's log (warn 0: an error, 1: a warning), from any
     * engine thread, e.g. that the model file changed on disk. May be NULL
     * (then stderr). */
    void (*log)(void *arg, int warn, const char *line);
    void *log_arg;
    /* A chat template (Jinja source, len bytes) instead of the model's own
     * (aned --chat-template FILE); NULL = the model's. chat_template_name
     * names it in info (the file's path). */
    const char *chat_template;
    size_t chat_template_len;
    const char *chat_template_name;
    int pooling;            /* ENG_POOL_*: embed jobs' pooling (aned --pooling); 0 = the model's */
    /* "0,1": the CUDA devices the model is split over, tensor parallel (aned
     * --gpus; one number: that GPU alone); NULL = the first GPU */
    const char *gpus;
    /* 1: --gpus splits the model by layers, each GPU whole layers in turn
     * (aned --split layers); 0: by heads, tensor parallel */
    int split_layers;
    /* N > 0: only the last N layers and the output on the GPU, the layers
     * before them and the embeddings on the CPU, the residual stream
     * handed over through host memory each pass (aned --gpu-layers, for a
     * model larger than the GPU); 0, or N at least the layers: all on the
     * GPU */
    int gpu_layers;
} eng_opts;

#define ENG_GPUS_MAX 8   /* GPUs of --gpus at most */

/* Loads the model and starts the worker. */
int eng_open(eng **out, const eng_opts *opt, char *err, size_t errlen);
/* Cancels every job, joins the worker, unmaps the model. NULL is fine.
 * Events still queued are freed. */
void eng_close(eng *e);

typedef enum eng_err {
    ENG_OK = 0,
    ENG_EINVAL,      /* a field out of range (sampling value, max_tokens, top_n) */
    ENG_ETOKEN,      /* a token id outside the vocabulary */
    ENG_ECTX,        /* prompt (+ max_tokens floor) longer than the context */
    ENG_EBUSY,       /* queue full; retry later */
    ENG_ENOMODEL,    /* tokenizer-only model: no weights to run */
    ENG_EUTF8,       /* text is not valid UTF-8 */
    ENG_ENOMEM,
    ENG_ESHUTDOWN,   /* the engine is closing */
    ENG_EINTERNAL,
    ENG_EMODEL_CHANGED, /* the model file changed on disk after load: restart to load it */
} eng_err;

const char *eng_strerror(eng_err code);

/* Static facts about the loaded model; valid until eng_close. */
typedef struct eng_model_info {
    const char *path;
    const char *arch;          /* "llama", "qwen2", "qwen3", ... */
    const char *name;          /* general.name or the file's base name */
    const char *backend;       /* "cpu" or "cuda" */
    const char *chat_template; /* where the template came from: "tokenizer.chat_template" (GGUF),
                                  "tokenizer_config.json", "chat_template.jinja", the
                                  --chat-template file's path, or "none" */
    const char *warning;       /* e.g. a model template that does not parse; "" when none */
    int tokenizer_only;        /* 1: no tensors; generate/eval answer ENG_ENOMODEL */
    int32_t n_vocab, n_ctx, n_ctx_train, n_layer, n_embd, n_head, n_head_kv;
    int32_t bos, eos, eot;     /* -1 when absent */
    const char *tool_format;   /* the syntax of tool calls the template shows ("hermes", "llama3",
                                  "mistral", "harmony", "deepseek", "functionary"), or "plain" */
    uint64_t n_params;         /* weights */
    uint64_t weight_bytes;
    uint64_t active_bytes;     /* of them, what one token reads (mixtures of experts: the experts
                                  it is routed to) */
    int n_threads, max_seqs;
    int deterministic, cuda_f16_cache_off, cpu_repack_off; /* as opened (eng_opts) */
    const char *kv_type;       /* "f16", "q8_0" or "f32" */
    const char *device;        /* the accelerator or processor and the kernels' path */
    const char *pooling;       /* embed jobs' pooling: "mean", "cls" or "last" */
    const char *pooling_source; /* "model" (its pooling_type), "default" (it names none: last
                                   token) or "option" (eng_opts.pooling) */
    /* KV rows each sequence keeps for a sliding-window layer (its window
     * plus a batch, in a ring); 0: those layers' KV is paged with the rest
     * (a model without them, --swa-full, or a backend without rings) */
    int32_t swa_ring;
    uint64_t kv_pool_tokens;   /* tokens the KV pool's pages hold, over all sequences */
    uint64_t kv_bytes;         /* the KV pool's and the rings' bytes, as allocated (eng_stats.kv_total) */
    uint64_t repacked_bytes;   /* host memory of weights the CPU backend holds in its own layout
                                  (q4_K, q8_0 in 8-row groups for AVX2), beside the mapped file; 0: none */
} eng_model_info;

const eng_model_info *eng_model(const eng *e);

typedef struct eng_stats {
    uint32_t active;          /* jobs in the running batch */
    uint32_t queued;          /* jobs waiting to be admitted */
    uint64_t jobs_done;
    uint64_t prompt_tokens;   /* processed (prefill), over the engine's life */
    uint64_t cached_tokens;   /* prompt tokens reused from the cache */
    uint64_t gen_tokens;      /* generated */
    size_t kv_used, kv_total; /* bytes */
    size_t kv_peak;           /* the most kv_used has been (bytes) */
    uint64_t evictions;       /* jobs whose KV pages were taken back for another job
                                 (paused, or over their uid's share); they compute
                                 those tokens again when they go on */
    size_t weight_bytes;
    /* the worker's steps: their count and time, and the part of it inside
     * forward passes (waiting for the device included); the rest is host
     * work between passes (scheduling, sampling, events); step_ms takes a
     * step in when the worker next takes the lock */
    uint64_t steps;
    double step_ms, pass_ms;
} eng_stats;

void eng_stats_get(eng *e, eng_stats *st);

/* Tokenizer, callable from any thread. *ids and *text are malloc'd, caller frees.
 * add_bos: prepend BOS when the model's tokenizer asks for it.
 * parse_special: text like "<|im_end|>" becomes the special token. */
int eng_tokenize(eng *e, const char *text, size_t len, int add_bos, int parse_special,
                 int32_t **ids, size_t *n, eng_err *code, char *err, size_t errlen);
int eng_detokenize(eng *e, const int32_t *ids, size_t n, char **text, size_t *len,
                   eng_err *code, char *err, size_t errlen);
/* The bytes one token stands for after other text (control tokens: their
 * text; "" for an id out of range); valid until eng_close. Not NUL-terminated. */
const char *eng_token_piece(const eng *e, int32_t id, size_t *len);

/* eng_tokenize off the caller's thread: the text is copied and encoded on
 * the engine's tokenizer thread, in the same fair order across uids as text
 * prompts, so a megabyte of text costs the caller a copy. The result is one
 * ENG_EV_TOKENS event (ids, n_ids) or ENG_EV_ERROR, carrying `user`;
 * eng_cancel drops it (ENG_EV_DONE, cancelled). At most max_queued of them
 * wait at once (ENG_EBUSY past that). Also on tokenizer-only models. */
int eng_tokenize_submit(eng *e, const char *text, size_t len, int add_bos, int parse_special,
                        uint32_t uid, void *user, uint64_t *job_id, eng_err *code, char *err, size_t errlen);

typedef struct eng_sampling {
    float temperature;     /* 0 = greedy */
    int32_t top_k;         /* 0 = off */
    float top_p;           /* 1 = off */
    float min_p;           /* 0 = off */
    float repeat_penalty;  /* 1 = off */
    int32_t repeat_last_n; /* window for the penalty; default 64 */
    uint64_t seed;         /* same seed, same text */
} eng_sampling;

void eng_sampling_default(eng_sampling *s);

/* EMBED: the prompt's prefill alone, no sampling; its hidden states after
 * the final norm pooled (eng_model_info.pooling) and L2-normalised into one
 * ENG_EV_EMBEDDING event, then DONE; its KV is released at once. It shares
 * the batch with the other jobs and its vector does not depend on them. A
 * text prompt is encoded as is (no chat template; BOS per the tokenizer). */
typedef enum eng_job_kind { ENG_JOB_GENERATE = 0, ENG_JOB_EVAL = 1, ENG_JOB_EMBED = 2 } eng_job_kind;

/* One chat message: common/msg.h. */
typedef ane_msg eng_msg;

/* Everything is copied by eng_submit; the caller's buffers may go away after. */
typedef struct eng_job_desc {
    eng_job_kind kind;
    /* Prompt: tokens when n_tokens > 0 (used as given), else text. */
    const int32_t *tokens;
    size_t n_tokens;
    const char *text;
    size_t text_len;
    const char *system;    /* optional system message (chat template only) */
    size_t system_len;
    const eng_msg *msgs;   /* a whole conversation (instead of text/system), rendered */
    size_t n_msgs;         /* with the model's chat template; ends with the assistant's turn */
    const char *tools;     /* messages only: the template's "tools", the text of a JSON array; */
    size_t tools_len;      /* NULL = none */
    const char *template_vars; /* prompts through the chat template: further variables for it, the */
    size_t template_vars_len;  /* text of a JSON object (e.g. {"enable_thinking": false}); NULL = none */
    int parse_tools;       /* generate with messages: the reply is parsed for tool calls (and
                              reasoning) in the template's syntax: TOKEN text is the content
                              alone, each call an ENG_EV_TOOL_CALL event */
    int reasoning;         /* generate: ENG_REASONING_AUTO, _SPLIT or _RAW (see below) */
    int keep_reasoning;    /* messages: 1 = assistant messages' reasoning_content reaches the
                              template; 0 = it is removed before rendering */
    int max_tool_calls;    /* with parse_tools: the reply ends (ENG_FINISH_TOOL_CALLS) after
                              this many calls; 0 = no limit */
    int force_tools;       /* with parse_tools: the reply is calls alone (tool_choice "required",
                              or tool_name's function), by a grammar in the template's syntax;
                              excludes grammar/json_schema/json_object */
    const char *tool_name; size_t tool_name_len;  /* with force_tools: the one function, or NULL */
    int raw;               /* 1: no chat template; BOS per the tokenizer */
    int parse_special;     /* special tokens in text are parsed (raw prompts) */
    int32_t max_tokens;    /* generate: 0 = until context end */
    eng_sampling sampling;
    const char *const *stop; /* stop strings (bytes), n_stop of them */
    const size_t *stop_len;
    size_t n_stop;
    int32_t top_n;         /* eval: top entries per position (1..ENG_MAX_TOP) */
    /* generate: output constrained to a GBNF grammar (llama.cpp's syntax) or
     * to a JSON Schema (JSON text); at most one. json_object: any JSON
     * object. A grammar that does not compile is ENG_EINVAL naming the rule
     * and line:column. */
    const char *grammar; size_t grammar_len;
    const char *json_schema; size_t json_schema_len;
    int json_object;
    /* or the whole output one match of a regex (the subset jsonschema.h
     * names), or exactly one of n_choice non-empty texts */
    const char *regex; size_t regex_len;
    const char *const *choice; const size_t *choice_len; size_t n_choice;
    /* generate, logprobs (docs: proto/PROTOCOL.md "logprobs"): with logprobs
     * 1 each TOKEN event carries the chosen token's log-probability and the
     * top_logprobs (0..ENG_MAX_LOGPROBS) likeliest tokens', from the logits
     * the sampler chose from: after the repetition penalty and the grammar
     * mask, before temperature, top-k/p and min-p (the model's distribution
     * as constrained, not the sampling one). echo: first one
     * ENG_EV_PROMPT_TOKEN event per prompt token, with logprobs its
     * log-probability given the tokens before it (the raw model's; none for
     * the first). prompt_only (with echo): nothing is generated. */
    int logprobs;
    int32_t top_logprobs;
    int echo, prompt_only;
    uint64_t owner;        /* fairness key: one value per connection */
    uint32_t uid;          /* fairness key: peer uid */
    void *user;            /* returned in every event of this job */
} eng_job_desc;

/* Reasoning (desc.reasoning), where the template marks it (<think> blocks,
 * Mistral's [THINK], gpt-oss's analysis channel): SPLIT sends its text in
 * TOKEN events' reasoning, never in text; RAW leaves the reply's text as
 * generated (no parsing without tools; with tools the blocks stay in the
 * content). AUTO is SPLIT for a prompt rendered with the chat template
 * (messages, or text without raw) and for tools, RAW otherwise. The ids
 * (TOKEN events, logprobs) do not depend on it. */
enum { ENG_REASONING_AUTO = 0, ENG_REASONING_SPLIT = 1, ENG_REASONING_RAW = 2 };

#define ENG_MAX_TOP 100
#define ENG_MAX_STOP 16
#define ENG_MAX_LOGPROBS 20

/* Queues a job. On success *job_id names it in events and eng_cancel. On
 * failure nothing was queued and *code/err say why. A text or messages
 * prompt is only copied here and tokenized on the engine's own thread: what
 * that finds (ENG_EUTF8, ENG_ECTX, ...) ends the job with ENG_EV_ERROR. */
int eng_submit(eng *e, const eng_job_desc *d, uint64_t *job_id,
               eng_err *code, char *err, size_t errlen);

/* Asks the worker to end a job. Its last event is ENG_EV_DONE with
 * ENG_FINISH_CANCELLED (or its normal end if it finished first). Unknown ids
 * are ignored. Its KV is freed before the next forward pass. */
void eng_cancel(eng *e, uint64_t job_id);

/* Backpressure: a paused job is left out of forward passes until resumed
 * (its client is not reading). It keeps its KV only while no other job
 * waits for the pages or the sequence slot; otherwise they are taken back
 * and it computes those tokens again when resumed (same output). Paused
 * jobs count in their uid's share at admission. Unknown ids are ignored.
 *
 * Sharing: jobs are admitted fairly across uids, then owners. When a job
 * waits for a slot or KV pages that jobs of another uid hold, and that uid
 * would still hold at least as much as the waiting job's uid after giving
 * one up, its most recently admitted job is preempted the same way: back to
 * the queue, its tokens kept. Between owners of one uid likewise. */
void eng_pause(eng *e, uint64_t job_id, int paused);

typedef enum eng_event_type {
    ENG_EV_TOKEN = 0,  /* generate: one sampled token */
    ENG_EV_LOGITS,     /* eval: top-N logits at one prompt position */
    ENG_EV_DONE,       /* last event of a job that ran */
    ENG_EV_ERROR,      /* last event of a job that failed after submit */
    ENG_EV_TOKENS,     /* eng_tokenize_submit: the ids (its only event) */
    ENG_EV_TOOL_CALL,  /* generate with parse_tools: one complete tool call, after the
                          TOKEN event of the token that completed it */
    ENG_EV_EMBEDDING,  /* embed: the vector (before DONE) */
    ENG_EV_PROMPT_TOKEN, /* generate with echo: one prompt token (pos, token, logprob) */
} eng_event_type;

typedef enum eng_finish {
    ENG_FINISH_LENGTH = 0, ENG_FINISH_STOP, ENG_FINISH_EOS, ENG_FINISH_CANCELLED,
    ENG_FINISH_TOOL_CALLS,  /* parse_tools: the reply ended (end of turn, stop string or
                               max_tool_calls) after at least one tool call */
} eng_finish;

const char *eng_finish_str(eng_finish f);

typedef struct eng_event {
    struct eng_event *next;
    eng_event_type type;
    uint64_t job_id;
    void *user;
    /* TOKEN: the id, and the UTF-8 text it completes (whole characters only;
     * may be empty while a character or a possible stop string is pending). */
    int32_t token;
    char *text;
    size_t text_len;
    /* TOKEN with parse_tools or split reasoning: reasoning text this token completes (NULL when none) */
    char *reasoning;
    size_t reasoning_len;
    /* TOOL_CALL: its index in the reply (0, 1, ...), name, arguments (compact
     * JSON text) and id (all malloc'd, NUL-terminated) */
    int32_t call_index;
    char *call_name, *call_args, *call_id;
    size_t call_name_len, call_args_len, call_id_len;
    /* TOKENS: the text's ids (malloc'd; NULL when there are none). */
    int32_t *ids;
    size_t n_ids;
    /* LOGITS: position in the prompt and its top-N, best first. */
    int32_t pos;
    int32_t n_top;
    int32_t *top_ids;
    float *top_logits;
    /* EMBEDDING: n_embd floats, unit L2 norm (malloc'd) */
    float *embd;
    int32_t n_embd;
    /* TOKEN with logprobs, PROMPT_TOKEN: has_logprob 0 for the first prompt
     * token (no prefix); lp_ids/lp_vals the n_lp likeliest tokens and their
     * log-probabilities, best first (ties: lower id first) */
    int has_logprob;
    float logprob;
    int32_t n_lp;
    int32_t *lp_ids;
    float *lp_vals;
    /* DONE */
    eng_finish finish;
    int32_t prompt_tokens, cached_tokens, completion_tokens;
    double queue_ms, prefill_ms, decode_ms;
    /* ERROR */
    eng_err code;
    char message[160];
} eng_event;

/* Takes every queued event (oldest first) as a list; NULL when none.
 * Free each with eng_event_free. */
eng_event *eng_events_take(eng *e);
void eng_event_free(eng_event *ev);

#endif
