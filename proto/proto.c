/* proto.c — the aned wire protocol: names, defaults and the encoders.
 * The framing reader and the decoders are in proto_read.c. See proto.h and
 * PROTOCOL.md. */
#include "common/err.h"
#include "common/sampling.h"
#include "common/utf8.h"
#include "proto/proto.h"
#include "proto/proto_int.h"
#include "proto/proto_json.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

/* ------------------------------------------------------------------ names */

static const char *const err_names[PROTO_E__COUNT] = {
    [PROTO_OK] = "ok",
    [PROTO_E_MALFORMED] = "malformed",
    [PROTO_E_TOO_LARGE] = "too_large",
    [PROTO_E_TOO_DEEP] = "too_deep",
    [PROTO_E_BAD_REQUEST] = "bad_request",
    [PROTO_E_UNKNOWN_TYPE] = "unknown_type",
    [PROTO_E_VERSION] = "version",
    [PROTO_E_HANDSHAKE] = "handshake",
    [PROTO_E_DUPLICATE_ID] = "duplicate_id",
    [PROTO_E_INVALID_VALUE] = "invalid_value",
    [PROTO_E_INVALID_TOKEN] = "invalid_token",
    [PROTO_E_INVALID_UTF8] = "invalid_utf8",
    [PROTO_E_CONTEXT] = "context",
    [PROTO_E_BUSY] = "busy",
    [PROTO_E_DENIED] = "denied",
    [PROTO_E_NO_MODEL] = "no_model",
    [PROTO_E_SHUTDOWN] = "shutting_down",
    [PROTO_E_INTERNAL] = "internal",
    [PROTO_E_MODEL_CHANGED] = "model_changed",
};

const char *proto_err_name(proto_err e)
{
    if ((int)e < 0 || e >= PROTO_E__COUNT) return "internal";
    return err_names[e];
}

proto_err proto_err_from_name(const char *s, size_t n)
{
    if (!s) return PROTO_E_INTERNAL;
    for (int i = 0; i < PROTO_E__COUNT; i++)
        if (strlen(err_names[i]) == n && memcmp(err_names[i], s, n) == 0) return (proto_err)i;
    return PROTO_E_INTERNAL;
}

static const char *const type_names[] = {
    [PROTO_T_NONE] = "",
    [PROTO_T_HELLO] = "hello", [PROTO_T_GENERATE] = "generate",
    [PROTO_T_TOKENIZE] = "tokenize", [PROTO_T_DETOKENIZE] = "detokenize",
    [PROTO_T_EVAL] = "eval", [PROTO_T_CANCEL] = "cancel", [PROTO_T_INFO] = "info",
    [PROTO_T_PING] = "ping",
    [PROTO_T_HELLO_OK] = "hello", [PROTO_T_TOKEN] = "token", [PROTO_T_LOGITS] = "logits",
    [PROTO_T_DONE] = "done", [PROTO_T_ERROR] = "error", [PROTO_T_TOKENS] = "tokens",
    [PROTO_T_TEXT] = "text", [PROTO_T_INFO_OK] = "info", [PROTO_T_PONG] = "pong",
    [PROTO_T_TOOL_CALL] = "tool_call",
    [PROTO_T_EMBED] = "embed", [PROTO_T_EMBEDDING] = "embedding", [PROTO_T_PROMPT_TOKEN] = "prompt_token",
};
#define N_TYPES ((int)(sizeof type_names / sizeof type_names[0]))

const char *proto_type_name(proto_type t)
{
    if ((int)t < 0 || (int)t >= N_TYPES) return "";
    return type_names[t];
}

/* Wire name → type, for requests (first half) or events (second half). */
proto_type proto_type_lookup(const char *s, size_t n, int events)
{
    int lo = events ? PROTO_T_HELLO_OK : PROTO_T_HELLO;
    int hi = events ? PROTO_T_PROMPT_TOKEN : PROTO_T_EMBED;
    for (int i = lo; i <= hi; i++)
        if (strlen(type_names[i]) == n && memcmp(type_names[i], s, n) == 0) return (proto_type)i;
    return PROTO_T_NONE;
}

/* ------------------------------------------------------------------ init */

void proto_req_init(proto_req *r, proto_type t, uint64_t id)
{
    *r = (proto_req){ .type = t, .id = id, .version = PROTO_VERSION, .add_bos = 1, .max_tokens = PROTO_DEF_MAX_TOKENS,
                      SAMPLING_DEFAULTS, .top = 10, .parallel_tool_calls = 1 };
}

void proto_ev_init(proto_ev *e, proto_type t, uint64_t id)
{
    memset(e, 0, sizeof *e);
    e->type = t;
    e->id = id;
}

/* ------------------------------------------------------------------ UTF-8 */

int proto_utf8_valid(const char *str, size_t n) { return utf8_valid(str, n, NULL); }

size_t proto_utf8_whole(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    /* Look back over at most 3 continuation bytes for the last lead byte. */
    size_t k = 0;
    while (k < n && k < 4) {
        unsigned c = s[n - 1 - k];
        if ((c & 0xC0) != 0x80) {
            size_t need;
            if (c < 0x80) return n;
            else if ((c & 0xE0) == 0xC0) need = 2;
            else if ((c & 0xF0) == 0xE0) need = 3;
            else if ((c & 0xF8) == 0xF0) need = 4;
            else return n;               /* invalid lead: will never complete */
            return (k + 1 < need) ? n - 1 - k : n;
        }
        k++;
    }
    return n;   /* only continuation bytes: nothing pending can complete them */
}

/* ------------------------------------------------------------------ buffer */

void proto_buf_free(proto_buf *b)
{
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void proto_buf_consume(proto_buf *b, size_t n)
{
    if (n >= b->len) { b->len = 0; return; }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

static int buf_write(void *data, const char *s, size_t n)
{
    proto_buf *b = data;
    if (n > b->cap - b->len) {
        size_t need = b->len + n;
        if (need < b->len) return -1;
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) {
            if (cap > SIZE_MAX / 2) return -1;
            cap *= 2;
        }
        char *p = realloc(b->data, cap);
        if (!p) return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

/* ------------------------------------------------------------------ encoders */

/* Packing helpers: every call ORs failures into pk->fail. */
typedef struct pk { msgpack_packer p; int fail; } pk;

static void pk_str(pk *k, const char *s, size_t n)
{
    if (!s) { s = ""; n = 0; }
    k->fail |= msgpack_pack_str_with_body(&k->p, s, n);
}
static void pk_cstr(pk *k, const char *s) { pk_str(k, s, s ? strlen(s) : 0); }
static void pk_key(pk *k, const char *s) { pk_cstr(k, s); }
static void pk_map(pk *k, size_t n) { k->fail |= msgpack_pack_map(&k->p, n); }
static void pk_arr(pk *k, size_t n) { k->fail |= msgpack_pack_array(&k->p, n); }
static void pk_u64(pk *k, uint64_t v) { k->fail |= msgpack_pack_uint64(&k->p, v); }
static void pk_i64(pk *k, int64_t v) { k->fail |= msgpack_pack_int64(&k->p, v); }
static void pk_f32(pk *k, float v) { k->fail |= msgpack_pack_float(&k->p, v); }
static void pk_f64(pk *k, double v) { k->fail |= msgpack_pack_double(&k->p, v); }
static void pk_bool(pk *k, int v) { k->fail |= v ? msgpack_pack_true(&k->p) : msgpack_pack_false(&k->p); }

static void pk_kstr(pk *k, const char *key, const char *s, size_t n) { pk_key(k, key); pk_str(k, s, n); }
static void pk_ku64(pk *k, const char *key, uint64_t v) { pk_key(k, key); pk_u64(k, v); }
static void pk_ki64(pk *k, const char *key, int64_t v) { pk_key(k, key); pk_i64(k, v); }
static void pk_kf32(pk *k, const char *key, float v) { pk_key(k, key); pk_f32(k, v); }
static void pk_kf64(pk *k, const char *key, double v) { pk_key(k, key); pk_f64(k, v); }
static void pk_kbool(pk *k, const char *key, int v) { pk_key(k, key); pk_bool(k, v); }
/* an optional C string: the key only when s is not NULL */
static void pk_kopt(pk *k, const char *key, const char *s) { if (s) pk_kstr(k, key, s, strlen(s)); }
/* Every message opens with its map header, "type" and "id". */
static void pk_head(pk *k, size_t n_keys, const char *type, uint64_t id)
{
    pk_map(k, n_keys);
    pk_kstr(k, "type", type, strlen(type));
    pk_ku64(k, "id", id);
}
static void pk_bin(pk *k, const char *s, size_t n)
{
    k->fail |= msgpack_pack_bin(&k->p, n);
    if (n) k->fail |= msgpack_pack_bin_body(&k->p, s, n);
}

/* token / prompt_token: bytes, logprob and top_logprobs where present */
static size_t lp_keys(const proto_ev *e) { return (e->bytes != NULL) + (e->has_logprob != 0) + (e->lps != NULL); }
static void pk_lps(pk *k, const proto_ev *e)
{
    if (e->bytes) { pk_key(k, "bytes"); pk_bin(k, e->bytes, e->bytes_len); }
    if (e->has_logprob) pk_kf32(k, "logprob", e->logprob);
    if (!e->lps) return;
    pk_key(k, "top_logprobs");
    pk_arr(k, e->n_lps);
    for (size_t i = 0; i < e->n_lps && !k->fail; i++) {
        pk_arr(k, 3);
        pk_i64(k, e->lps[i].id);
        pk_f32(k, e->lps[i].logprob);
        pk_bin(k, e->lps[i].bytes, e->lps[i].bytes_len);
    }
}

/* floats as a bin of little-endian float32 (embedding) */
static void pk_f32le(pk *k, const float *v, size_t n)
{
    if (n > PROTO_MAX_FRAME / 4) { k->fail = 1; return; }
    k->fail |= msgpack_pack_bin(&k->p, n * 4);
    for (size_t i = 0; i < n && !k->fail; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        unsigned char b[4] = { (unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                               (unsigned char)(u >> 24) };
        k->fail |= msgpack_pack_bin_body(&k->p, b, 4);
    }
}

/* "tokens": the ids (none when t is NULL) */
static void pk_ktokens(pk *k, const int32_t *t, size_t n)
{
    if (!t) n = 0;
    pk_key(k, "tokens");
    pk_arr(k, n);
    for (size_t i = 0; i < n && !k->fail; i++) pk_i64(k, t[i]);
}

/* a message of its type, id and "tokens" alone (detokenize, tokens) */
static void pk_tokens_msg(pk *k, const char *type, uint64_t id, const int32_t *t, size_t n)
{
    pk_head(k, 3, type, id);
    pk_ktokens(k, t, n);
}

static void pk_msgs(pk *k, const proto_msg *m, size_t n)
{
    pk_key(k, "messages");
    pk_arr(k, n);
    for (size_t i = 0; i < n && !k->fail; i++) {
        long nx = m[i].extra ? pj_members(m[i].extra, m[i].extra_len) : 0;
        if (nx < 0) { k->fail = 1; return; }
        pk_map(k, 2 + (size_t)nx);
        pk_kstr(k, "role", m[i].role, m[i].role_len);
        pk_kstr(k, "content", m[i].content, m[i].content_len);
        if (nx > 0 && pj_pack(&k->p, m[i].extra, m[i].extra_len, 1, NULL)) k->fail = 1;
    }
}

/* tools, tool_choice, parallel_tool_calls: how many keys */
static size_t n_tool_keys(const proto_req *r)
{
    return r->tools ? 3 : 0;
}

static void pk_tools(pk *k, const proto_req *r)
{
    if (!r->tools) return;
    pk_key(k, "tools");
    if (pj_pack(&k->p, r->tools, r->tools_len, 0, NULL)) k->fail = 1;
    pk_key(k, "tool_choice");
    switch (r->tool_choice) {
    case PROTO_TOOLS_NONE: pk_cstr(k, "none"); break;
    case PROTO_TOOLS_REQUIRED: pk_cstr(k, "required"); break;
    case PROTO_TOOLS_NAMED:
        pk_map(k, 2);
        pk_kstr(k, "type", "function", 8);
        pk_key(k, "function");
        pk_map(k, 1);
        pk_kstr(k, "name", r->tool_name, r->tool_name_len);
        break;
    default: pk_cstr(k, "auto"); break;
    }
    pk_kbool(k, "parallel_tool_calls", r->parallel_tool_calls);
}

static void pk_tvars(pk *k, const proto_req *r)
{
    if (!r->template_vars) return;
    pk_key(k, "template_vars");
    if (pj_pack(&k->p, r->template_vars, r->template_vars_len, 0, NULL)) k->fail = 1;
}

/* Starts a message; finish with pk_end, which rolls back on failure. */
static void pk_begin(pk *k, proto_buf *b)
{
    msgpack_packer_init(&k->p, b, buf_write);
    k->fail = 0;
}
static int pk_end(pk *k, proto_buf *b, size_t start)
{
    if (k->fail || b->len - start > PROTO_MAX_FRAME) {
        b->len = start;
        return -1;
    }
    return 0;
}

/* generate's and eval's prompt: messages, tokens or text (the first given),
 * then "system" when given and "raw" */
static void pk_chat_prompt(pk *k, const proto_req *r)
{
    if (r->msgs && r->n_msgs > 0) pk_msgs(k, r->msgs, r->n_msgs);
    else if (r->tokens) pk_ktokens(k, r->tokens, r->n_tokens);
    else pk_kstr(k, "prompt", r->text, r->text_len);
    if (r->system) pk_kstr(k, "system", r->system, r->system_len);
    pk_kbool(k, "raw", r->raw);
}

int proto_req_encode(proto_buf *b, const proto_req *r)
{
    size_t start = b->len;
    pk k;
    pk_begin(&k, b);
    const char *tn = proto_type_name(r->type);
    int prompt_tokens = r->tokens != NULL;
    if ((r->type == PROTO_T_GENERATE || r->type == PROTO_T_EVAL) && r->msgs && r->n_msgs > PROTO_MAX_MSGS)
        return -1;
    switch (r->type) {
    case PROTO_T_HELLO:
        pk_head(&k, r->client ? 4 : 3, tn, r->id);
        pk_ku64(&k, "version", r->version);
        if (r->client) pk_kstr(&k, "client", r->client, r->client_len);
        break;
    case PROTO_T_GENERATE:
        if (r->n_stop > PROTO_MAX_STOP || r->n_choice > PROTO_MAX_CHOICE) return -1;
        pk_head(&k, 13 + (r->has_seed != 0) + (r->system != NULL) + n_tool_keys(r) + (r->grammar != NULL) +
                   (r->json_schema != NULL) + (r->json_object != 0) + (r->logprobs != 0) + (r->echo != 0) +
                   (r->prompt_only != 0) + (r->reasoning != PROTO_REASONING_AUTO) + (r->keep_reasoning != 0) +
                   (r->template_vars != NULL) + (r->regex != NULL) + (r->n_choice > 0), tn, r->id);
        pk_chat_prompt(&k, r);
        pk_ki64(&k, "max_tokens", r->max_tokens);
        pk_kf32(&k, "temperature", r->temperature);
        pk_ki64(&k, "top_k", r->top_k);
        pk_kf32(&k, "top_p", r->top_p);
        pk_kf32(&k, "min_p", r->min_p);
        pk_kf32(&k, "repeat_penalty", r->repeat_penalty);
        pk_ki64(&k, "repeat_last_n", r->repeat_last_n);
        if (r->has_seed) pk_ku64(&k, "seed", r->seed);
        pk_key(&k, "stop");
        pk_arr(&k, r->n_stop);
        for (size_t i = 0; i < r->n_stop; i++) pk_str(&k, r->stop[i], r->stop_len[i]);
        pk_kbool(&k, "special", r->special);
        pk_tools(&k, r);
        if (r->grammar) pk_kstr(&k, "grammar", r->grammar, r->grammar_len);
        if (r->json_schema) pk_kstr(&k, "json_schema", r->json_schema, r->json_schema_len);
        if (r->json_object) pk_kbool(&k, "json_object", 1);
        if (r->regex) pk_kstr(&k, "regex", r->regex, r->regex_len);
        if (r->n_choice) {
            pk_key(&k, "choice");
            pk_arr(&k, r->n_choice);
            for (size_t i = 0; i < r->n_choice; i++) pk_str(&k, r->choice[i], r->choice_len[i]);
        }
        if (r->logprobs) pk_ki64(&k, "logprobs", r->top_logprobs);
        if (r->echo) pk_kbool(&k, "echo", 1);
        if (r->prompt_only) pk_kbool(&k, "prompt_only", 1);
        if (r->reasoning != PROTO_REASONING_AUTO) { pk_key(&k, "reasoning"); pk_cstr(&k, r->reasoning == PROTO_REASONING_RAW ? "raw" : "split"); }
        if (r->keep_reasoning) pk_kbool(&k, "keep_reasoning", 1);
        pk_tvars(&k, r);
        break;
    case PROTO_T_EVAL:
        pk_head(&k, 5 + (r->system != NULL) + (r->keep_reasoning != 0) + (r->template_vars != NULL), tn, r->id);
        pk_chat_prompt(&k, r);
        pk_ki64(&k, "top", r->top);
        if (r->keep_reasoning) pk_kbool(&k, "keep_reasoning", 1);
        pk_tvars(&k, r);
        break;
    case PROTO_T_EMBED:
        pk_head(&k, 4, tn, r->id);
        if (prompt_tokens) pk_ktokens(&k, r->tokens, r->n_tokens);
        else pk_kstr(&k, "prompt", r->text, r->text_len);
        pk_kbool(&k, "special", r->special);
        break;
    case PROTO_T_TOKENIZE:
        pk_head(&k, 5, tn, r->id);
        pk_kstr(&k, "text", r->text, r->text_len);
        pk_kbool(&k, "special", r->special);
        pk_kbool(&k, "add_bos", r->add_bos);
        break;
    case PROTO_T_DETOKENIZE:
        pk_tokens_msg(&k, tn, r->id, r->tokens, r->n_tokens);
        break;
    case PROTO_T_CANCEL:
    case PROTO_T_INFO:
    case PROTO_T_PING:
        pk_head(&k, 2, tn, r->id);
        break;
    default: return -1;
    }
    return pk_end(&k, b, start);
}

static double per_s(double n, double ms) { return ms > 0 ? n * 1000.0 / ms : 0.0; }

int proto_ev_encode(proto_buf *b, const proto_ev *e)
{
    size_t start = b->len;
    pk k;
    pk_begin(&k, b);
    const char *tn = proto_type_name(e->type);
    switch (e->type) {
    case PROTO_T_HELLO_OK:
        pk_head(&k, 5, tn, e->id);
        pk_ku64(&k, "version", e->version);
        pk_kstr(&k, "server", e->server, e->server_len);
        pk_kstr(&k, "model", e->model, e->model_len);
        break;
    case PROTO_T_TOKEN:
        pk_head(&k, 4 + (e->reasoning != NULL) + lp_keys(e), tn, e->id);
        pk_ki64(&k, "token", e->token);
        pk_kstr(&k, "text", e->text, e->text_len);
        if (e->reasoning) pk_kstr(&k, "reasoning", e->reasoning, e->reasoning_len);
        pk_lps(&k, e);
        break;
    case PROTO_T_PROMPT_TOKEN:
        pk_head(&k, 4 + lp_keys(e), tn, e->id);
        pk_ki64(&k, "pos", e->pos);
        pk_ki64(&k, "token", e->token);
        pk_lps(&k, e);
        break;
    case PROTO_T_TOOL_CALL:
        pk_head(&k, 6, tn, e->id);
        pk_ku64(&k, "index", e->call_index);
        pk_kstr(&k, "name", e->call_name, e->call_name_len);
        pk_kstr(&k, "arguments", e->call_args, e->call_args_len);
        pk_kstr(&k, "call_id", e->call_id, e->call_id_len);
        break;
    case PROTO_T_LOGITS:
        pk_head(&k, 4, tn, e->id);
        pk_ki64(&k, "pos", e->pos);
        pk_key(&k, "top");
        pk_arr(&k, e->top ? e->n_top : 0);
        for (size_t i = 0; e->top && i < e->n_top && !k.fail; i++) {
            pk_arr(&k, 2);
            pk_i64(&k, e->top[i].id);
            pk_f32(&k, e->top[i].logit);
        }
        break;
    case PROTO_T_EMBEDDING:
        pk_head(&k, 3, tn, e->id);
        pk_key(&k, "embedding");
        pk_f32le(&k, e->embedding, e->embedding ? e->n_embedding : 0);
        break;
    case PROTO_T_DONE: {
        pk_head(&k, 5, tn, e->id);
        pk_kstr(&k, "finish", e->finish, e->finish_len);
        pk_key(&k, "usage");
        pk_map(&k, 3);
        pk_ku64(&k, "prompt_tokens", e->prompt_tokens);
        pk_ku64(&k, "cached_tokens", e->cached_tokens);
        pk_ku64(&k, "completion_tokens", e->completion_tokens);
        pk_key(&k, "timings");
        pk_map(&k, 5);
        pk_kf64(&k, "queue_ms", e->queue_ms);
        pk_kf64(&k, "prefill_ms", e->prefill_ms);
        pk_kf64(&k, "decode_ms", e->decode_ms);
        double prefilled = e->prompt_tokens > e->cached_tokens
                         ? (double)(e->prompt_tokens - e->cached_tokens) : 0.0;
        pk_kf64(&k, "prefill_tps", per_s(prefilled, e->prefill_ms));
        pk_kf64(&k, "decode_tps", per_s(e->completion_tokens, e->decode_ms));
        break;
    }
    case PROTO_T_ERROR:
        pk_head(&k, 4 + (e->closing != 0), tn, e->id);
        pk_kstr(&k, "code", proto_err_name(e->code), strlen(proto_err_name(e->code)));
        pk_kstr(&k, "message", e->message, e->message_len);
        if (e->closing) pk_kbool(&k, "closing", 1);
        break;
    case PROTO_T_TOKENS:
        pk_tokens_msg(&k, tn, e->id, e->tokens, e->n_tokens);
        break;
    case PROTO_T_TEXT:
        pk_head(&k, 3, tn, e->id);
        pk_kstr(&k, "text", e->text, e->text_len);
        break;
    case PROTO_T_INFO_OK:
        pk_head(&k, 33 + (e->cuda_f16_cache != NULL) + 2 * (e->cpu_repack != NULL) + (e->kv_type != NULL) +
                   (e->device != NULL) +
                   (e->pooling != NULL) + (e->pooling_source != NULL), tn, e->id);
        pk_ku64(&k, "version", e->version);
        pk_kstr(&k, "server", e->server, e->server_len);
        pk_kstr(&k, "model", e->model, e->model_len);
        pk_kstr(&k, "arch", e->arch, e->arch_len);
        pk_kstr(&k, "backend", e->backend, e->backend_len);
        pk_kstr(&k, "chat_template", e->chat_template, e->chat_template_len);
        pk_kstr(&k, "tool_format", e->tool_format, e->tool_format_len);
        pk_kstr(&k, "warning", e->warning, e->warning_len);
        pk_ki64(&k, "n_vocab", e->n_vocab);
        pk_ki64(&k, "n_ctx", e->n_ctx);
        pk_ki64(&k, "n_layer", e->n_layer);
        pk_ki64(&k, "n_embd", e->n_embd);
        pk_kbool(&k, "tokenizer_only", e->tokenizer_only);
        pk_ku64(&k, "active", e->active);
        pk_ku64(&k, "queued", e->queued);
        pk_ku64(&k, "clients", e->clients);
        pk_ku64(&k, "jobs_done", e->jobs_done);
        pk_ku64(&k, "tokens_served", e->tokens_served);
        pk_ku64(&k, "prompt_tokens_total", e->prompt_tokens_total);
        pk_ku64(&k, "kv_used", e->kv_used);
        pk_ku64(&k, "kv_total", e->kv_total);
        pk_ku64(&k, "kv_tokens", e->kv_tokens);
        pk_ku64(&k, "swa_ring", e->swa_ring);
        pk_ku64(&k, "weight_bytes", e->weight_bytes);
        pk_kf64(&k, "uptime_s", e->uptime_s);
        pk_key(&k, "per_client");
        pk_arr(&k, e->per_client ? e->n_per_client : 0);
        for (size_t i = 0; e->per_client && i < e->n_per_client && !k.fail; i++) {
            const proto_client_count *c = &e->per_client[i];
            pk_map(&k, 4);
            pk_ku64(&k, "uid", c->uid);
            pk_ku64(&k, "pid", c->pid);
            pk_ku64(&k, "active", c->active);
            pk_ku64(&k, "queued", c->queued);
        }
        pk_kstr(&k, "model_path", e->model_path, e->model_path_len);
        pk_ku64(&k, "max_inflight", PROTO_MAX_INFLIGHT);
        pk_kf64(&k, "idle_timeout_s", e->idle_timeout_s);
        pk_ku64(&k, "max_clients_per_uid", e->max_clients_per_uid);
        pk_kbool(&k, "deterministic", e->deterministic);
        pk_kopt(&k, "cuda_f16_cache", e->cuda_f16_cache);
        if (e->cpu_repack) {
            pk_kopt(&k, "cpu_repack", e->cpu_repack);
            pk_ku64(&k, "repacked_bytes", e->repacked_bytes);
        }
        pk_kopt(&k, "kv_type", e->kv_type);
        pk_kopt(&k, "device", e->device);
        pk_kopt(&k, "pooling", e->pooling);
        pk_kopt(&k, "pooling_source", e->pooling_source);
        break;
    case PROTO_T_PONG:
        pk_head(&k, 2, tn, e->id);
        break;
    default: return -1;
    }
    return pk_end(&k, b, start);
}
