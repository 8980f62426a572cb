/* proto.h — the aned wire protocol: bytes and messages only (no sockets, no
 * engine). Used by the daemon and by libaneclient alike. PROTOCOL.md is the
 * specification; this is its C binding.
 *
 * A connection carries a stream of msgpack maps in each direction. The
 * reader (proto_reader) frames that stream: it checks every header's type,
 * size, count and nesting against the limits below *before* handing a whole
 * message to msgpack-c, so no length from the peer is trusted. Decoded
 * messages borrow their strings/arrays from the reader and stay valid until
 * the next proto_reader_next() call on that reader (decoded strings are
 * copies, NUL-terminated, so reading more bytes in between is fine; absent
 * event strings read as ""). Request text is checked to be UTF-8; event
 * text is passed on as received (the daemon guarantees UTF-8).
 *
 * Conventions: 0 ok, -1 error; messages through (char *err, size_t errlen). */
#ifndef ANE_PROTO_H
#define ANE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"

#define PROTO_VERSION       1
#define PROTO_MAX_FRAME     (1u << 20)  /* bytes of one message, both directions */
#define PROTO_MAX_DEPTH     8           /* nesting of maps/arrays in one message */
#define PROTO_MAX_PROMPT    (PROTO_MAX_FRAME - 4096) /* bytes of prompt/system text */
#define PROTO_MAX_TOKENS    131072      /* token ids in one request or one tokens reply */
#define PROTO_MAX_INFLIGHT  32          /* requests in flight per connection */
#define PROTO_MAX_STOP      16          /* stop strings per request */
#define PROTO_MAX_STOP_LEN  256         /* bytes per stop string */
#define PROTO_MAX_CHOICE    64          /* texts of a "choice" constraint */
#define PROTO_MAX_CHOICE_LEN 4096       /* bytes per choice text, and of a "regex" */
#define PROTO_MAX_TOP       100         /* eval top-N */
#define PROTO_MAX_GEN       1048576     /* max_tokens upper bound */
#define PROTO_MAX_NAME      256         /* bytes of hello's "client" */
#define PROTO_MAX_REPLY_TEXT (PROTO_MAX_FRAME - 256) /* bytes of a detokenize reply's text */
#define PROTO_MAX_TEMPERATURE 100.0     /* temperature range [0, 100] */
#define PROTO_MAX_PENALTY   100.0       /* repeat_penalty range (0, 100] */
#define PROTO_DEF_MAX_TOKENS 256        /* generate's max_tokens when absent */
#define PROTO_MAX_MSGS      1024        /* messages in one request */
#define PROTO_MAX_ROLE      32          /* bytes of one message's role */

typedef enum proto_type {
    PROTO_T_NONE = 0,
    /* client → server requests */
    PROTO_T_HELLO, PROTO_T_GENERATE, PROTO_T_TOKENIZE, PROTO_T_DETOKENIZE,
    PROTO_T_EVAL, PROTO_T_CANCEL, PROTO_T_INFO, PROTO_T_PING,
    PROTO_T_EMBED,      /* "embed" */
    /* server → client events/replies */
    PROTO_T_HELLO_OK,   /* wire name "hello" */
    PROTO_T_TOKEN,      /* "token"  */
    PROTO_T_LOGITS,     /* "logits" */
    PROTO_T_DONE,       /* "done"   */
    PROTO_T_ERROR,      /* "error"  */
    PROTO_T_TOKENS,     /* "tokens" (tokenize reply) */
    PROTO_T_TEXT,       /* "text"   (detokenize reply) */
    PROTO_T_INFO_OK,    /* wire name "info" */
    PROTO_T_PONG,       /* "pong"   */
    PROTO_T_TOOL_CALL,  /* "tool_call" (generate with tools) */
    PROTO_T_EMBEDDING,  /* "embedding" (embed) */
    PROTO_T_PROMPT_TOKEN, /* "prompt_token" (generate with echo) */
} proto_type;

/* generate's "reasoning": AUTO = not sent (split for a chat-rendered prompt) */
enum { PROTO_REASONING_AUTO = 0, PROTO_REASONING_SPLIT, PROTO_REASONING_RAW };

/* generate's "tool_choice" */
enum { PROTO_TOOLS_AUTO = 0, PROTO_TOOLS_NONE, PROTO_TOOLS_REQUIRED, PROTO_TOOLS_NAMED };

/* Error codes travel as their names (proto_err_name). */
typedef enum proto_err {
    PROTO_OK = 0,
    PROTO_E_MALFORMED,      /* "malformed": not msgpack / not a map; connection closed */
    PROTO_E_TOO_LARGE,      /* "too_large": frame, string or array over a limit */
    PROTO_E_TOO_DEEP,       /* "too_deep": nesting over PROTO_MAX_DEPTH; connection closed */
    PROTO_E_BAD_REQUEST,    /* "bad_request": missing field or wrong type */
    PROTO_E_UNKNOWN_TYPE,   /* "unknown_type" */
    PROTO_E_VERSION,        /* "version": unsupported protocol version */
    PROTO_E_HANDSHAKE,      /* "handshake": request before hello */
    PROTO_E_DUPLICATE_ID,   /* "duplicate_id": id already in flight on this connection */
    PROTO_E_INVALID_VALUE,  /* "invalid_value": sampling value/max_tokens/top out of range */
    PROTO_E_INVALID_TOKEN,  /* "invalid_token": token id outside the vocabulary */
    PROTO_E_INVALID_UTF8,   /* "invalid_utf8" */
    PROTO_E_CONTEXT,        /* "context": prompt longer than the context */
    PROTO_E_BUSY,           /* "busy": too many jobs in flight or queued; retry */
    PROTO_E_DENIED,         /* "denied": peer not allowed; connection closed */
    PROTO_E_NO_MODEL,       /* "no_model": tokenizer-only model */
    PROTO_E_SHUTDOWN,       /* "shutting_down" */
    PROTO_E_INTERNAL,       /* "internal" */
    PROTO_E_MODEL_CHANGED,  /* "model_changed": the model file changed on disk after load */
    PROTO_E__COUNT
} proto_err;

const char *proto_err_name(proto_err e);
proto_err proto_err_from_name(const char *s, size_t n); /* PROTO_E_INTERNAL if unknown */
const char *proto_type_name(proto_type t);               /* wire name */

/* One chat message of a request's "messages": common/msg.h. */
typedef ane_msg proto_msg;

/* A request (client → server). Strings are bytes with explicit length and
 * are not NUL-terminated. has_* flags say which optional fields were sent. */
typedef struct proto_req {
    proto_type type;
    uint64_t id;            /* chosen by the client; unique among its requests in flight */
    /* hello */
    uint32_t version;
    const char *client; size_t client_len;
    /* generate / eval / embed / tokenize: the prompt as text or as ids (exactly one) */
    const char *text; size_t text_len;       /* != NULL when sent, even "" */
    const int32_t *tokens; size_t n_tokens;  /* != NULL when sent; detokenize input too */
    const char *system; size_t system_len;
    /* generate / eval: a whole conversation instead of prompt/tokens (when
     * n_msgs > 0); contents add up to at most PROTO_MAX_PROMPT bytes */
    const proto_msg *msgs; size_t n_msgs;
    /* generate with messages: "tools" as the text of a JSON array (NULL =
     * none), "tool_choice" (PROTO_TOOLS_*; the function's name when NAMED)
     * and "parallel_tool_calls" (default 1) */
    const char *tools; size_t tools_len;
    int tool_choice;
    const char *tool_name; size_t tool_name_len;
    int parallel_tool_calls;
    /* generate: "reasoning" (PROTO_REASONING_*); generate/eval with
     * messages: "keep_reasoning" (assistant messages' reasoning_content
     * reaches the template; default 0: removed) */
    int reasoning;
    int keep_reasoning;
    /* generate / eval through the chat template: "template_vars", a map of
     * further variables for it (e.g. {"enable_thinking": false}) as the text
     * of a JSON object; NULL = none */
    const char *template_vars; size_t template_vars_len;
    int raw;                /* generate/eval: 1 = no chat template */
    int special;            /* tokenize, generate: parse special tokens in text */
    int add_bos;            /* tokenize: prepend BOS when the model uses one (default 1) */
    int32_t max_tokens;     /* default 256 */
    float temperature;      /* default 0.8 */
    int32_t top_k;          /* default 40 */
    float top_p;            /* default 0.95; 0..1, 1 = off, 0 = the most likely token alone */
    float min_p;            /* default 0.05 */
    float repeat_penalty;   /* default 1.0 */
    int32_t repeat_last_n;  /* default 64 */
    uint64_t seed; int has_seed;
    const char *stop[PROTO_MAX_STOP]; size_t stop_len[PROTO_MAX_STOP]; size_t n_stop;
    /* generate: the output one match of "regex", or exactly one of "choice" */
    const char *regex; size_t regex_len;
    const char *choice[PROTO_MAX_CHOICE]; size_t choice_len[PROTO_MAX_CHOICE]; size_t n_choice;
    int32_t top;            /* eval: top-N per position, default 10 */
    /* generate: constrained output (at most one): a GBNF grammar, a JSON
     * Schema as JSON text, or any JSON object */
    const char *grammar; size_t grammar_len;
    const char *json_schema; size_t json_schema_len;
    int json_object;
    /* generate: "logprobs" (logprobs 1, top_logprobs alternatives 0..20),
     * "echo" (prompt_token events), "prompt_only" (with echo: no generation) */
    int logprobs;
    int32_t top_logprobs;
    int echo, prompt_only;
    /* cancel: `id` names the request to cancel */
} proto_req;

void proto_req_init(proto_req *r, proto_type t, uint64_t id); /* zero + defaults */

typedef struct proto_top { int32_t id; float logit; } proto_top;
/* One top_logprobs entry: a token, its log-probability and its bytes. */
typedef struct proto_lp { int32_t id; float logprob; const char *bytes; size_t bytes_len; } proto_lp;
#define PROTO_MAX_LOGPROBS 20

typedef struct proto_client_count { uint32_t uid; uint32_t pid; uint32_t active, queued; } proto_client_count;

/* An event/reply (server → client). */
typedef struct proto_ev {
    proto_type type;
    uint64_t id;            /* the request it answers; 0 for connection-level errors */
    /* hello */
    uint32_t version;
    const char *server; size_t server_len;
    const char *model; size_t model_len;
    /* token */
    int32_t token;
    const char *text; size_t text_len;        /* token text, detokenize text */
    const char *reasoning; size_t reasoning_len; /* token: reasoning text (split), NULL = none */
    /* token with logprobs, prompt_token: the token's bytes (NULL: not sent),
     * its logprob (has_logprob) and the alternatives (lps != NULL: sent) */
    const char *bytes; size_t bytes_len;
    int has_logprob; float logprob;
    const proto_lp *lps; size_t n_lps;
    /* tool_call */
    uint32_t call_index;
    const char *call_name; size_t call_name_len;
    const char *call_args; size_t call_args_len; /* JSON text */
    const char *call_id; size_t call_id_len;
    /* tokens (tokenize reply) */
    const int32_t *tokens; size_t n_tokens;
    /* embedding: the vector, n_embedding floats (on the wire a bin of
     * little-endian float32) */
    const float *embedding; size_t n_embedding;
    /* logits */
    int32_t pos;
    const proto_top *top; size_t n_top;
    /* done */
    const char *finish; size_t finish_len;    /* "length" "stop" "eos" "cancelled" */
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    double queue_ms, prefill_ms, decode_ms;   /* prefill/decode tokens/s are derived */
    /* error */
    proto_err code;
    const char *message; size_t message_len;
    int closing;            /* the daemon closes the connection after this error */
    /* info */
    const char *arch; size_t arch_len;
    const char *backend; size_t backend_len;
    const char *chat_template; size_t chat_template_len;
    const char *tool_format; size_t tool_format_len; /* info */
    const char *warning; size_t warning_len;
    int32_t n_vocab, n_ctx, n_layer, n_embd;
    int tokenizer_only;
    uint32_t active, queued, clients;
    uint64_t jobs_done, tokens_served, prompt_tokens_total;
    uint64_t kv_used, kv_total, weight_bytes;
    uint64_t kv_tokens;      /* info: tokens the KV pool's pages hold (all sequences) */
    uint32_t swa_ring;       /* info: KV rows a sequence keeps per sliding-window layer; 0 = paged */
    double uptime_s;
    double idle_timeout_s;   /* info: idle connections close after this; 0 = never */
    uint32_t max_clients_per_uid; /* info: 0 = no limit */
    int deterministic;       /* info: batch-invariant results at every batch size */
    const char *cuda_f16_cache; /* info: "auto" or "off" (NULL: not sent) */
    const char *cpu_repack;  /* info: "auto" or "off" (NULL: not sent, nor repacked_bytes) */
    uint64_t repacked_bytes; /* info: host memory of the CPU backend's repacked weights */
    const char *kv_type;     /* info: "f16", "q8_0" or "f32" (NULL: not sent) */
    const char *device;      /* info: the accelerator and the kernels' path, "" on the CPU (NULL: not sent) */
    const char *pooling, *pooling_source; /* info: embed's pooling and where it came from (NULL: not sent) */
    const proto_client_count *per_client; size_t n_per_client;
    const char *model_path; size_t model_path_len; /* info */
} proto_ev;

void proto_ev_init(proto_ev *e, proto_type t, uint64_t id);

/* Growable output buffer; encoders append one complete message each. */
typedef struct proto_buf { char *data; size_t len, cap; } proto_buf;
void proto_buf_free(proto_buf *b);
void proto_buf_consume(proto_buf *b, size_t n);        /* drop n bytes from the front */

int proto_req_encode(proto_buf *b, const proto_req *r); /* -1: over a limit / OOM */
int proto_ev_encode(proto_buf *b, const proto_ev *e);

/* Stream reader for one connection. */
typedef struct proto_reader proto_reader;
proto_reader *proto_reader_new(size_t max_frame);     /* 0 = PROTO_MAX_FRAME */
void proto_reader_free(proto_reader *r);
/* Space to read into: *avail bytes at the returned pointer; then commit.
 * Drain with proto_reader_next_*() until it returns 0 before asking again:
 * *avail is 0 only when a whole message is still waiting to be taken. */
char *proto_reader_space(proto_reader *r, size_t *avail);
void proto_reader_commit(proto_reader *r, size_t n);
int proto_reader_feed(proto_reader *r, const void *buf, size_t n); /* copy in; -1 OOM */
/* Bytes received but not yet returned as messages. */
size_t proto_reader_pending(const proto_reader *r);
/* After a too_large break: the least size in bytes that the refused message's
 * headers claimed (from its first byte; proto_reader_pending() of it are in
 * hand), so a server can read the rest and drop it before it closes; 0
 * otherwise. */
uint64_t proto_reader_claimed(const proto_reader *r);

/* Next whole message from the stream:
 *   1  a message was decoded into *req (server side) — or, when the map is a
 *      valid frame but its fields are wrong, *code != PROTO_OK and req->id /
 *      req->type are set as far as they could be read (answer with an error,
 *      keep the connection);
 *   0  need more bytes;
 *  -1  the stream is broken (*code says why); close the connection. */
int proto_reader_next_req(proto_reader *r, proto_req *req, proto_err *code,
                          char *err, size_t errlen);
/* Client side: the same for events. */
int proto_reader_next_ev(proto_reader *r, proto_ev *ev, proto_err *code,
                         char *err, size_t errlen);

/* UTF-8 helpers shared by both sides. */
int proto_utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s that ends on a whole character. */
size_t proto_utf8_whole(const char *s, size_t n);

#endif
