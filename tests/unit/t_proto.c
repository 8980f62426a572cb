/* t_proto.c — the wire protocol library: round trips of every message,
 * limits, framing of partial/oversized/deep/garbage input, field validation,
 * UTF-8 helpers, and random garbage/mutation fuzzing. */
#include "proto/proto.h"
#include "tests/check.h"

#include <msgpack.h>
#include <stdlib.h>
#include <stdint.h>

/* ---- helpers ---- */

/* A hand-built message: map with fields appended by the test. */
typedef struct raw { msgpack_sbuffer sb; msgpack_packer pk; } raw;

static void raw_init(raw *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}
static void raw_free(raw *m) { msgpack_sbuffer_destroy(&m->sb); }
static void raw_str(raw *m, const char *s) { msgpack_pack_str_with_body(&m->pk, s, strlen(s)); }
static void raw_strn(raw *m, const char *s, size_t n) { msgpack_pack_str_with_body(&m->pk, s, n); }

/* Feeds bytes and takes one request; returns next_req's value. */
static int one_req(const void *data, size_t n, proto_req *q, proto_err *code, char *err, size_t errlen)
{
    static proto_reader *r;
    if (r) proto_reader_free(r);
    r = proto_reader_new(0);
    if (proto_reader_feed(r, data, n) < 0) return -2;
    return proto_reader_next_req(r, q, code, err, errlen);
}

/* Builds {"type": t, "id": 7, key: <value packed by fn>} and decodes it. */
typedef void (*packfn)(msgpack_packer *pk);
static int field_case(const char *type, const char *key, packfn fn, const char *extra_key, packfn extra,
                      proto_req *q, proto_err *code, char *err, size_t errlen)
{
    raw m;
    raw_init(&m);
    msgpack_pack_map(&m.pk, 3 + (extra_key != NULL));
    raw_str(&m, "type"); raw_str(&m, type);
    raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 7);
    if (extra_key) { raw_str(&m, extra_key); extra(&m.pk); }
    raw_str(&m, key); fn(&m.pk);
    int rc = one_req(m.sb.data, m.sb.size, q, code, err, errlen);
    raw_free(&m);
    return rc;
}

static void p_str(msgpack_packer *pk) { msgpack_pack_str_with_body(pk, "x", 1); }
static void p_badutf8(msgpack_packer *pk) { msgpack_pack_str_with_body(pk, "a\xff" "b", 3); }
static void p_int(msgpack_packer *pk) { msgpack_pack_int(pk, 5); }
static void p_neg(msgpack_packer *pk) { msgpack_pack_int(pk, -3); }
static void p_huge(msgpack_packer *pk) { msgpack_pack_uint64(pk, UINT64_MAX); }
static void p_float(msgpack_packer *pk) { msgpack_pack_double(pk, 0.5); }
static void p_floatint(msgpack_packer *pk) { msgpack_pack_double(pk, 100.0); }
static void p_nan(msgpack_packer *pk) { msgpack_pack_double(pk, NAN); }
static void p_big(msgpack_packer *pk) { msgpack_pack_double(pk, 1e9); }
static void p_bool(msgpack_packer *pk) { msgpack_pack_true(pk); }
static void p_nil(msgpack_packer *pk) { msgpack_pack_nil(pk); }
static void p_map(msgpack_packer *pk) { msgpack_pack_map(pk, 0); }
static void p_arr(msgpack_packer *pk) { msgpack_pack_array(pk, 1); msgpack_pack_int(pk, 1); }
static void p_arr_empty(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }
static void p_arr_str(msgpack_packer *pk) { msgpack_pack_array(pk, 1); msgpack_pack_str_with_body(pk, "a", 1); }
static void p_arr_neg(msgpack_packer *pk) { msgpack_pack_array(pk, 2); msgpack_pack_int(pk, 1); msgpack_pack_int(pk, -1); }
static void p_arr_frac(msgpack_packer *pk) { msgpack_pack_array(pk, 1); msgpack_pack_double(pk, 1.5); }
static void p_arr_big(msgpack_packer *pk) { msgpack_pack_array(pk, 1); msgpack_pack_int64(pk, 1LL << 40); }
static void p_prompt(msgpack_packer *pk) { msgpack_pack_str_with_body(pk, "hi", 2); }

/* ---- tests ---- */

static void t_names(void)
{
    for (int i = 0; i < PROTO_E__COUNT; i++) {
        const char *n = proto_err_name((proto_err)i);
        CHECK(n && *n);
        CHECK_EQ_INT(proto_err_from_name(n, strlen(n)), i);
    }
    CHECK(strcmp(proto_err_name(PROTO_E_SHUTDOWN), "shutting_down") == 0);
    CHECK(strcmp(proto_err_name(PROTO_E_DUPLICATE_ID), "duplicate_id") == 0);
    CHECK_EQ_INT(proto_err_from_name("nope", 4), PROTO_E_INTERNAL);
    CHECK_EQ_INT(proto_err_from_name("busyx", 4), PROTO_E_BUSY);
    CHECK_EQ_INT(proto_err_from_name(NULL, 0), PROTO_E_INTERNAL);
    CHECK(strcmp(proto_err_name((proto_err)999), "internal") == 0);
    CHECK(strcmp(proto_type_name(PROTO_T_HELLO_OK), "hello") == 0);
    CHECK(strcmp(proto_type_name(PROTO_T_INFO_OK), "info") == 0);
    CHECK(strcmp(proto_type_name(PROTO_T_DETOKENIZE), "detokenize") == 0);
    CHECK(strcmp(proto_type_name((proto_type)999), "") == 0);
}

static void t_defaults(void)
{
    proto_req q;
    proto_req_init(&q, PROTO_T_GENERATE, 5);
    CHECK_EQ_INT(q.id, 5);
    CHECK_EQ_INT(q.max_tokens, 256);
    CHECK_NEAR(q.temperature, 0.8, 1e-6);
    CHECK_EQ_INT(q.top_k, 40);
    CHECK_NEAR(q.top_p, 0.95, 1e-6);
    CHECK_NEAR(q.min_p, 0.05, 1e-6);
    CHECK_NEAR(q.repeat_penalty, 1.0, 0);
    CHECK_EQ_INT(q.repeat_last_n, 64);
    CHECK_EQ_INT(q.top, 10);
    CHECK_EQ_INT(q.add_bos, 1);
    CHECK_EQ_INT(q.version, PROTO_VERSION);
}

/* Encodes q, decodes it, and returns the decoded request in *out (borrowing r). */
static int rt_req(proto_reader *r, const proto_req *q, proto_req *out)
{
    proto_buf b = {0};
    char err[256];
    proto_err code;
    int rc = proto_req_encode(&b, q);
    CHECK_EQ_INT(rc, 0);
    if (rc) return -1;
    CHECK(proto_reader_feed(r, b.data, b.len) == 0);
    proto_buf_free(&b);
    rc = proto_reader_next_req(r, out, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_OK, "rc %d code %s: %s", rc, proto_err_name(code), err);
    CHECK_EQ_INT(proto_reader_pending(r), 0);   /* exactly one frame */
    return rc == 1 && code == PROTO_OK ? 0 : -1;
}

static void t_req_roundtrip(void)
{
    proto_reader *r = proto_reader_new(0);
    proto_req q, o;

    proto_req_init(&q, PROTO_T_HELLO, 1);
    q.client = "tester"; q.client_len = 6;
    if (rt_req(r, &q, &o) == 0) {
        CHECK_EQ_INT(o.type, PROTO_T_HELLO);
        CHECK_EQ_INT(o.id, 1);
        CHECK_EQ_INT(o.version, PROTO_VERSION);
        CHECK(o.client_len == 6 && memcmp(o.client, "tester", 6) == 0 && o.client[6] == 0);
    }

    static const int32_t toks[] = { 1, 2, 511, 0, 2147483647 };
    proto_req_init(&q, PROTO_T_GENERATE, UINT64_MAX);
    q.text = "Once upon a time \xc3\xa9"; q.text_len = strlen(q.text);
    q.system = "be brief"; q.system_len = 8;
    q.raw = 1; q.special = 1;
    q.max_tokens = 17; q.temperature = 0; q.top_k = 3; q.top_p = 0.5f; q.min_p = 0.25f;
    q.repeat_penalty = 1.25f; q.repeat_last_n = 9; q.seed = 1234567890123ULL; q.has_seed = 1;
    q.stop[0] = "\n\n"; q.stop_len[0] = 2; q.stop[1] = "THE END"; q.stop_len[1] = 7; q.n_stop = 2;
    if (rt_req(r, &q, &o) == 0) {
        CHECK_EQ_INT(o.type, PROTO_T_GENERATE);
        CHECK(o.id == UINT64_MAX);
        CHECK(o.text_len == q.text_len && memcmp(o.text, q.text, q.text_len) == 0);
        CHECK(o.tokens == NULL);
        CHECK(o.system_len == 8 && memcmp(o.system, "be brief", 8) == 0);
        CHECK_EQ_INT(o.raw, 1);
        CHECK_EQ_INT(o.special, 1);
        CHECK_EQ_INT(o.max_tokens, 17);
        CHECK_NEAR(o.temperature, 0, 0);
        CHECK_EQ_INT(o.top_k, 3);
        CHECK_NEAR(o.top_p, 0.5, 0);
        CHECK_NEAR(o.min_p, 0.25, 0);
        CHECK_NEAR(o.repeat_penalty, 1.25, 0);
        CHECK_EQ_INT(o.repeat_last_n, 9);
        CHECK(o.has_seed && o.seed == 1234567890123ULL);
        CHECK_EQ_INT(o.n_stop, 2);
        CHECK(o.stop_len[1] == 7 && memcmp(o.stop[1], "THE END", 7) == 0);
    }
    /* tokens prompt, no seed, no system, empty prompt text */
    proto_req_init(&q, PROTO_T_GENERATE, 2);
    q.tokens = toks; q.n_tokens = 5;
    if (rt_req(r, &q, &o) == 0) {
        CHECK(o.text == NULL);
        CHECK(o.n_tokens == 5 && o.tokens && memcmp(o.tokens, toks, sizeof toks) == 0);
        CHECK(!o.has_seed);
        CHECK(o.system == NULL);
        CHECK_EQ_INT(o.max_tokens, 256);
    }
    proto_req_init(&q, PROTO_T_GENERATE, 3);
    if (rt_req(r, &q, &o) == 0) CHECK(o.text != NULL && o.text_len == 0);
    CHECK(o.reasoning == PROTO_REASONING_AUTO && !o.keep_reasoning);   /* (the rest: t_proto_fields) */

    proto_req_init(&q, PROTO_T_EVAL, 4);
    q.text = "abc"; q.text_len = 3; q.top = 100;
    if (rt_req(r, &q, &o) == 0) {
        CHECK_EQ_INT(o.type, PROTO_T_EVAL);
        CHECK_EQ_INT(o.top, 100);
        CHECK(o.text_len == 3);
    }
    proto_req_init(&q, PROTO_T_EVAL, 5);
    q.tokens = toks; q.n_tokens = 2; q.raw = 1;
    if (rt_req(r, &q, &o) == 0) {
        CHECK_EQ_INT(o.top, 10);
        CHECK_EQ_INT(o.n_tokens, 2);
        CHECK_EQ_INT(o.raw, 1);
    }

    proto_req_init(&q, PROTO_T_TOKENIZE, 6);
    q.text = "<s>hi"; q.text_len = 5; q.special = 1; q.add_bos = 0;
    if (rt_req(r, &q, &o) == 0) {
        CHECK_EQ_INT(o.type, PROTO_T_TOKENIZE);
        CHECK(o.text_len == 5 && memcmp(o.text, "<s>hi", 5) == 0);
        CHECK_EQ_INT(o.special, 1);
        CHECK_EQ_INT(o.add_bos, 0);
    }
    proto_req_init(&q, PROTO_T_TOKENIZE, 6);
    q.text = ""; q.text_len = 0;
    if (rt_req(r, &q, &o) == 0) { CHECK(o.text && o.text_len == 0); CHECK_EQ_INT(o.add_bos, 1); }

    proto_req_init(&q, PROTO_T_DETOKENIZE, 7);
    q.tokens = toks; q.n_tokens = 5;
    if (rt_req(r, &q, &o) == 0) CHECK(o.n_tokens == 5 && memcmp(o.tokens, toks, sizeof toks) == 0);
    proto_req_init(&q, PROTO_T_DETOKENIZE, 8);
    if (rt_req(r, &q, &o) == 0) CHECK(o.tokens != NULL && o.n_tokens == 0);

    proto_type simple[] = { PROTO_T_CANCEL, PROTO_T_INFO, PROTO_T_PING };
    for (int i = 0; i < 3; i++) {
        proto_req_init(&q, simple[i], 40 + (uint64_t)i);
        if (rt_req(r, &q, &o) == 0) { CHECK_EQ_INT(o.type, simple[i]); CHECK_EQ_INT(o.id, 40 + i); }
    }
    /* Not a request type: refused by the encoder. */
    proto_buf b = {0};
    proto_req_init(&q, PROTO_T_DONE, 1);
    CHECK_EQ_INT(proto_req_encode(&b, &q), -1);
    proto_req_init(&q, PROTO_T_GENERATE, 1);
    q.n_stop = PROTO_MAX_STOP + 1;
    CHECK_EQ_INT(proto_req_encode(&b, &q), -1);
    CHECK_EQ_INT(b.len, 0);
    proto_buf_free(&b);
    CHECK_EQ_INT(proto_reader_pending(r), 0);
    proto_reader_free(r);
}

static int rt_ev(proto_reader *r, const proto_ev *e, proto_ev *out)
{
    proto_buf b = {0};
    char err[256];
    proto_err code;
    int rc = proto_ev_encode(&b, e);
    CHECK_EQ_INT(rc, 0);
    if (rc) return -1;
    CHECK(proto_reader_feed(r, b.data, b.len) == 0);
    proto_buf_free(&b);
    rc = proto_reader_next_ev(r, out, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_OK, "rc %d code %s: %s", rc, proto_err_name(code), err);
    CHECK_EQ_INT(proto_reader_pending(r), 0);
    return rc == 1 && code == PROTO_OK ? 0 : -1;
}

/* logprobs: the request's fields, token and prompt_token events' keys
 * (bytes that are not UTF-8 kept as they are), bad values named. */
static void t_logprobs(void)
{
    proto_reader *r = proto_reader_new(0);
    proto_buf b = {0};
    proto_req q, o;
    proto_err code;
    char err[256];
    proto_req_init(&q, PROTO_T_GENERATE, 3);
    q.text = "x"; q.text_len = 1;
    q.logprobs = 1; q.top_logprobs = 20; q.echo = 1; q.prompt_only = 1;
    CHECK(proto_req_encode(&b, &q) == 0);
    CHECK(proto_reader_feed(r, b.data, b.len) == 0);
    CHECK(proto_reader_next_req(r, &o, &code, err, sizeof err) == 1 && code == PROTO_OK);
    CHECK(o.logprobs == 1 && o.top_logprobs == 20 && o.echo == 1 && o.prompt_only == 1);
    b.len = 0;
    proto_req_init(&q, PROTO_T_GENERATE, 4);
    q.text = "x"; q.text_len = 1;
    CHECK(proto_req_encode(&b, &q) == 0);
    CHECK(proto_reader_feed(r, b.data, b.len) == 0);
    CHECK(proto_reader_next_req(r, &o, &code, err, sizeof err) == 1 && code == PROTO_OK);
    CHECK(o.logprobs == 0 && o.echo == 0 && o.prompt_only == 0);
    proto_buf_free(&b);
    static void (*const bad[])(msgpack_packer *) = { p_big, p_neg, p_str };
    static const proto_err want[] = { PROTO_E_INVALID_VALUE, PROTO_E_INVALID_VALUE, PROTO_E_BAD_REQUEST };
    for (int i = 0; i < 3; i++) {
        CHECK(field_case("generate", "logprobs", bad[i], "prompt", p_str, &o, &code, err, sizeof err) == 1);
        CHECKF(code == want[i] && strstr(err, "\"logprobs\""), "logprobs case %d: %d %s", i, code, err);
    }
    CHECK(field_case("generate", "prompt_only", p_bool, "prompt", p_str, &o, &code, err, sizeof err) == 1);
    CHECK(code == PROTO_E_INVALID_VALUE && strstr(err, "\"prompt_only\""));
    CHECK(field_case("generate", "logprobs", p_bool, "prompt", p_str, &o, &code, err, sizeof err) == 1);
    CHECK(code == PROTO_OK && o.logprobs == 1 && o.top_logprobs == 0);

    proto_ev e, v;
    proto_lp lps[2] = { { 5, -0.25f, "\xe2\x82", 2 }, { 9, -INFINITY, "", 0 } };
    proto_ev_init(&e, PROTO_T_TOKEN, 9);
    e.token = 5; e.text = ""; e.bytes = "\xe2\x82"; e.bytes_len = 2;
    e.has_logprob = 1; e.logprob = -0.25f; e.lps = lps; e.n_lps = 2;
    if (rt_ev(r, &e, &v) == 0) {
        CHECK(v.has_logprob && v.logprob == -0.25f && v.bytes_len == 2 && !memcmp(v.bytes, "\xe2\x82", 2));
        CHECK(v.n_lps == 2 && v.lps[0].id == 5 && v.lps[0].logprob == -0.25f && v.lps[0].bytes_len == 2);
        CHECK(v.lps[1].id == 9 && v.lps[1].logprob == -INFINITY && v.lps[1].bytes_len == 0);
    }
    proto_ev_init(&e, PROTO_T_TOKEN, 9);   /* without logprobs: none of the keys */
    e.token = 5; e.text = "a"; e.text_len = 1;
    if (rt_ev(r, &e, &v) == 0) CHECK(!v.has_logprob && !v.bytes && !v.lps);
    proto_ev_init(&e, PROTO_T_PROMPT_TOKEN, 10);
    e.pos = 0; e.token = 1; e.bytes = "<s>"; e.bytes_len = 3;
    if (rt_ev(r, &e, &v) == 0) CHECK(v.type == PROTO_T_PROMPT_TOKEN && v.pos == 0 && v.token == 1 && !v.has_logprob && !v.lps);
    e.pos = 1; e.has_logprob = 1; e.logprob = -3; e.lps = lps; e.n_lps = 1;
    if (rt_ev(r, &e, &v) == 0) CHECK(v.pos == 1 && v.logprob == -3 && v.n_lps == 1);
    CHECK(strcmp(proto_type_name(PROTO_T_PROMPT_TOKEN), "prompt_token") == 0);
    proto_reader_free(r);
}

static void t_ev_roundtrip(void)
{
    proto_reader *r = proto_reader_new(0);
    proto_ev e, o;

    proto_ev_init(&e, PROTO_T_HELLO_OK, 0);
    e.version = 1; e.server = "aned 0.1"; e.server_len = 8; e.model = "stories260K"; e.model_len = 11;
    if (rt_ev(r, &e, &o) == 0) {
        CHECK_EQ_INT(o.type, PROTO_T_HELLO_OK);
        CHECK_EQ_INT(o.version, 1);
        CHECK(strcmp(o.server, "aned 0.1") == 0 && strcmp(o.model, "stories260K") == 0);
    }
    proto_ev_init(&e, PROTO_T_TOKEN, 9);
    e.token = 42; e.text = "\xe2\x82\xac"; e.text_len = 3;
    if (rt_ev(r, &e, &o) == 0) {
        CHECK_EQ_INT(o.id, 9); CHECK_EQ_INT(o.token, 42);
        CHECK(o.text_len == 3 && memcmp(o.text, "\xe2\x82\xac", 3) == 0);
    }
    proto_ev_init(&e, PROTO_T_TOKEN, 9);   /* empty text while bytes are held */
    e.token = 7;
    if (rt_ev(r, &e, &o) == 0) CHECK(o.text && o.text_len == 0);

    proto_top top[PROTO_MAX_TOP];
    for (int i = 0; i < PROTO_MAX_TOP; i++) { top[i].id = i * 3; top[i].logit = 10.5f - (float)i * 0.125f; }
    top[99].logit = -INFINITY;
    proto_ev_init(&e, PROTO_T_LOGITS, 10);
    e.pos = 3; e.top = top; e.n_top = PROTO_MAX_TOP;
    if (rt_ev(r, &e, &o) == 0) {
        CHECK_EQ_INT(o.pos, 3);
        CHECK_EQ_INT(o.n_top, PROTO_MAX_TOP);
        int same = 1;
        for (int i = 0; i < PROTO_MAX_TOP; i++) same &= o.top[i].id == top[i].id && o.top[i].logit == top[i].logit;
        CHECK(same);
    }
    proto_ev_init(&e, PROTO_T_DONE, 11);
    e.finish = "stop"; e.finish_len = 4;
    e.prompt_tokens = 10; e.cached_tokens = 4; e.completion_tokens = 20;
    e.queue_ms = 0.5; e.prefill_ms = 12.25; e.decode_ms = 100;
    if (rt_ev(r, &e, &o) == 0) {
        CHECK(strcmp(o.finish, "stop") == 0);
        CHECK_EQ_INT(o.prompt_tokens, 10); CHECK_EQ_INT(o.cached_tokens, 4); CHECK_EQ_INT(o.completion_tokens, 20);
        CHECK_NEAR(o.queue_ms, 0.5, 0); CHECK_NEAR(o.prefill_ms, 12.25, 0); CHECK_NEAR(o.decode_ms, 100, 0);
    }
    proto_ev_init(&e, PROTO_T_ERROR, 12);
    e.code = PROTO_E_INVALID_TOKEN; e.message = "tokens[3] = 9999 is outside the vocabulary"; e.message_len = strlen(e.message);
    if (rt_ev(r, &e, &o) == 0) {
        CHECK_EQ_INT(o.code, PROTO_E_INVALID_TOKEN);
        CHECK(strcmp(o.message, e.message) == 0);
    }
    static const int32_t toks[] = { 1, 403, 0 };
    proto_ev_init(&e, PROTO_T_TOKENS, 13);
    e.tokens = toks; e.n_tokens = 3;
    if (rt_ev(r, &e, &o) == 0) CHECK(o.n_tokens == 3 && memcmp(o.tokens, toks, sizeof toks) == 0);
    proto_ev_init(&e, PROTO_T_TOKENS, 13);
    if (rt_ev(r, &e, &o) == 0) CHECK(o.n_tokens == 0);
    proto_ev_init(&e, PROTO_T_TEXT, 14);
    e.text = "hello\nworld"; e.text_len = 11;
    if (rt_ev(r, &e, &o) == 0) CHECK(o.text_len == 11 && strcmp(o.text, "hello\nworld") == 0);

    proto_client_count pc[2] = { { 1000, 4242, 1, 2 }, { 0, 1, 0, 0 } };
    proto_ev_init(&e, PROTO_T_INFO_OK, 15);
    e.version = 1; e.server = "aned"; e.server_len = 4; e.model = "m"; e.model_len = 1;
    e.arch = "llama"; e.arch_len = 5; e.backend = "cpu"; e.backend_len = 3;
    e.chat_template = "none"; e.chat_template_len = 4; e.warning = ""; e.warning_len = 0;
    e.model_path = "/x/m.gguf"; e.model_path_len = 9;
    e.n_vocab = 512; e.n_ctx = 512; e.n_layer = 5; e.n_embd = 64; e.tokenizer_only = 1;
    e.active = 3; e.queued = 4; e.clients = 2; e.jobs_done = 1ULL << 40; e.tokens_served = 77;
    e.prompt_tokens_total = 88; e.kv_used = 1000; e.kv_total = 1ULL << 33; e.weight_bytes = 1ULL << 20;
    e.uptime_s = 3.5; e.per_client = pc; e.n_per_client = 2;
    if (rt_ev(r, &e, &o) == 0) {
        CHECK(strcmp(o.arch, "llama") == 0 && strcmp(o.backend, "cpu") == 0);
        CHECK(strcmp(o.chat_template, "none") == 0 && o.warning_len == 0);
        CHECK(strcmp(o.model_path, "/x/m.gguf") == 0);
        CHECK_EQ_INT(o.n_vocab, 512); CHECK_EQ_INT(o.n_ctx, 512); CHECK_EQ_INT(o.n_layer, 5); CHECK_EQ_INT(o.n_embd, 64);
        CHECK_EQ_INT(o.tokenizer_only, 1);
        CHECK_EQ_INT(o.active, 3); CHECK_EQ_INT(o.queued, 4); CHECK_EQ_INT(o.clients, 2);
        CHECK(o.jobs_done == 1ULL << 40 && o.kv_total == 1ULL << 33);
        CHECK_EQ_INT(o.tokens_served, 77); CHECK_EQ_INT(o.prompt_tokens_total, 88);
        CHECK_NEAR(o.uptime_s, 3.5, 0);
        CHECK_EQ_INT(o.n_per_client, 2);
        CHECK(o.n_per_client == 2 && o.per_client[0].uid == 1000 && o.per_client[0].pid == 4242
              && o.per_client[0].active == 1 && o.per_client[0].queued == 2);
    }
    proto_ev_init(&e, PROTO_T_PONG, 16);
    if (rt_ev(r, &e, &o) == 0) { CHECK_EQ_INT(o.type, PROTO_T_PONG); CHECK_EQ_INT(o.id, 16); }

    proto_buf b = {0};
    proto_ev_init(&e, PROTO_T_GENERATE, 1);
    CHECK_EQ_INT(proto_ev_encode(&b, &e), -1);
    proto_buf_free(&b);
    proto_reader_free(r);
}

/* The wire form of done carries derived rates. */
static void t_done_wire(void)
{
    proto_ev e;
    proto_buf b = {0};
    proto_ev_init(&e, PROTO_T_DONE, 1);
    e.finish = "length"; e.finish_len = 6;
    e.prompt_tokens = 110; e.cached_tokens = 10; e.completion_tokens = 50;
    e.prefill_ms = 100; e.decode_ms = 500;
    CHECK_EQ_INT(proto_ev_encode(&b, &e), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    CHECK(msgpack_unpack_next(&u, b.data, b.len, &off) == MSGPACK_UNPACK_SUCCESS);
    double ptps = -1, dtps = -1;
    const msgpack_object *m = &u.data;
    for (uint32_t i = 0; m->type == MSGPACK_OBJECT_MAP && i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        if (kv->key.via.str.size == 7 && memcmp(kv->key.via.str.ptr, "timings", 7) == 0)
            for (uint32_t j = 0; j < kv->val.via.map.size; j++) {
                const msgpack_object_kv *t = &kv->val.via.map.ptr[j];
                if (t->key.via.str.size == 11 && memcmp(t->key.via.str.ptr, "prefill_tps", 11) == 0) ptps = t->val.via.f64;
                if (t->key.via.str.size == 10 && memcmp(t->key.via.str.ptr, "decode_tps", 10) == 0) dtps = t->val.via.f64;
            }
    }
    CHECK_NEAR(ptps, 1000, 1e-9);
    CHECK_NEAR(dtps, 100, 1e-9);
    msgpack_unpacked_destroy(&u);
    proto_buf_free(&b);
}

/* Byte-at-a-time delivery: 0 until the last byte, then the message. */
static void t_partial(void)
{
    proto_req q, o;
    proto_buf b = {0};
    proto_req_init(&q, PROTO_T_GENERATE, 99);
    q.text = "split me"; q.text_len = 8;
    q.stop[0] = "x"; q.stop_len[0] = 1; q.n_stop = 1;
    proto_req_encode(&b, &q);
    proto_req_init(&q, PROTO_T_PING, 100);
    proto_req_encode(&b, &q);
    proto_reader *r = proto_reader_new(0);
    proto_err code;
    char err[200];
    int got = 0, zeros = 0, bad = 0;
    for (size_t i = 0; i < b.len; i++) {
        size_t avail;
        char *sp = proto_reader_space(r, &avail);
        if (!sp || avail < 1) { bad++; break; }
        sp[0] = b.data[i];
        proto_reader_commit(r, 1);
        int rc;
        while ((rc = proto_reader_next_req(r, &o, &code, err, sizeof err)) == 1) {
            got++;
            if (got == 1) CHECK(o.id == 99 && o.text_len == 8 && memcmp(o.text, "split me", 8) == 0 && o.n_stop == 1);
            if (got == 2) CHECK(o.id == 100 && o.type == PROTO_T_PING && i == b.len - 1);
        }
        if (rc == 0) zeros++;
        if (rc < 0) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(got, 2);
    CHECK_EQ_INT(zeros, (int)b.len);
    CHECK_EQ_INT(proto_reader_pending(r), 0);
    /* Many messages in one feed all come out. */
    proto_buf many = {0};
    for (int i = 0; i < 1000; i++) { proto_req_init(&q, PROTO_T_PING, (uint64_t)i + 1); proto_req_encode(&many, &q); }
    CHECK(proto_reader_feed(r, many.data, many.len) == 0);
    int n = 0, ok = 1;
    while (proto_reader_next_req(r, &o, &code, err, sizeof err) == 1) { n++; ok &= o.id == (uint64_t)n; }
    CHECK_EQ_INT(n, 1000);
    CHECK(ok);
    proto_buf_free(&many);
    proto_buf_free(&b);
    proto_reader_free(r);
}

/* Frames over the limit are refused as soon as a header says so. */
static void t_too_large(void)
{
    proto_req o;
    proto_err code;
    char err[200];
    /* str32 claiming 4 GiB: refused from the header alone. */
    const unsigned char s32[] = { 0x81, 0xa4, 't', 'y', 'p', 'e', 0xdb, 0xff, 0xff, 0xff, 0xff };
    CHECK_EQ_INT(one_req(s32, sizeof s32, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_TOO_LARGE);
    /* array32 / map32 with absurd counts. */
    const unsigned char a32[] = { 0x81, 0xa1, 'x', 0xdd, 0x7f, 0xff, 0xff, 0xff };
    CHECK_EQ_INT(one_req(a32, sizeof a32, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_TOO_LARGE);
    const unsigned char m32[] = { 0xdf, 0x00, 0x10, 0x00, 0x00 };
    CHECK_EQ_INT(one_req(m32, sizeof m32, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_TOO_LARGE);
    /* bin32 header. */
    const unsigned char b32[] = { 0x81, 0xa1, 'x', 0xc6, 0x00, 0x20, 0x00, 0x00 };
    CHECK_EQ_INT(one_req(b32, sizeof b32, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_TOO_LARGE);
    /* Exactly at a small reader's limit passes; one byte more does not. */
    for (int extra = 0; extra <= 1; extra++) {
        proto_reader *r = proto_reader_new(100);
        raw m;
        raw_init(&m);
        msgpack_pack_map(&m.pk, 3);
        raw_str(&m, "type"); raw_str(&m, "tokenize");
        raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 1);
        raw_str(&m, "text");
        size_t base = m.sb.size + 2;   /* str8 header */
        char pad[200];
        memset(pad, 'a', sizeof pad);
        raw_strn(&m, pad, 100 - base + (size_t)extra);
        CHECK_EQ_INT(m.sb.size, 100 + extra);
        proto_reader_feed(r, m.sb.data, m.sb.size);
        int rc = proto_reader_next_req(r, &o, &code, err, sizeof err);
        if (extra) { CHECK_EQ_INT(rc, -1); CHECK_EQ_INT(code, PROTO_E_TOO_LARGE); }
        else { CHECK_EQ_INT(rc, 1); CHECK_EQ_INT(code, PROTO_OK); }
        /* Broken stays broken. */
        if (extra) CHECK_EQ_INT(proto_reader_next_req(r, &o, &code, err, sizeof err), -1);
        raw_free(&m);
        proto_reader_free(r);
    }
    /* A frame too large whose bytes trickle in: refused before the buffer
     * holds more than the limit. */
    proto_reader *r = proto_reader_new(1000);
    const unsigned char hdr[] = { 0x82, 0xa4, 't', 'y', 'p', 'e', 0xa4, 'p', 'i', 'n', 'g', 0xa1, 'x', 0xdc, 0x03, 0xe8 };
    proto_reader_feed(r, hdr, sizeof hdr);   /* array16 of 1000 elements > 1000 - 16 bytes */
    CHECK_EQ_INT(proto_reader_next_req(r, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_TOO_LARGE);
    proto_reader_free(r);
    /* Encoders refuse what no reader would accept. */
    proto_buf b = {0};
    proto_req q;
    proto_req_init(&q, PROTO_T_TOKENIZE, 1);
    size_t big = PROTO_MAX_FRAME;
    char *t = malloc(big);
    memset(t, 'z', big);
    q.text = t; q.text_len = big;
    CHECK_EQ_INT(proto_req_encode(&b, &q), -1);
    CHECK_EQ_INT(b.len, 0);
    proto_ev e;
    proto_ev_init(&e, PROTO_T_TEXT, 1);
    e.text = t; e.text_len = big - 100;
    CHECK_EQ_INT(proto_ev_encode(&b, &e), 0);
    CHECK(b.len <= PROTO_MAX_FRAME);
    /* ... and such a frame (just under the limit) decodes. */
    proto_reader *rr = proto_reader_new(0);
    size_t off = 0;
    int rc = 0;
    proto_ev o2;
    while (off < b.len) {   /* via space/commit in read-sized pieces */
        size_t avail;
        char *sp = proto_reader_space(rr, &avail);
        if (!sp || !avail) break;
        size_t k = b.len - off < avail ? b.len - off : avail;
        if (k > 4000) k = 4000;
        memcpy(sp, b.data + off, k);
        proto_reader_commit(rr, k);
        off += k;
        rc = proto_reader_next_ev(rr, &o2, &code, err, sizeof err);
        if (rc) break;
    }
    CHECK_EQ_INT(rc, 1);
    CHECK(rc == 1 && o2.text_len == big - 100 && o2.text[0] == 'z');
    proto_reader_free(rr);
    proto_buf_free(&b);
    free(t);
}

static void t_depth(void)
{
    proto_req o;
    proto_err code;
    char err[200];
    for (int depth = PROTO_MAX_DEPTH; depth <= PROTO_MAX_DEPTH + 1; depth++) {
        raw m;
        raw_init(&m);
        msgpack_pack_map(&m.pk, 3);
        raw_str(&m, "type"); raw_str(&m, "ping");
        raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 3);
        raw_str(&m, "deep");
        for (int i = 1; i < depth; i++) msgpack_pack_array(&m.pk, 1);   /* the map is level 1 */
        msgpack_pack_nil(&m.pk);
        int rc = one_req(m.sb.data, m.sb.size, &o, &code, err, sizeof err);
        if (depth == PROTO_MAX_DEPTH) { CHECK_EQ_INT(rc, 1); CHECK_EQ_INT(code, PROTO_OK); CHECK_EQ_INT(o.type, PROTO_T_PING); }
        else { CHECK_EQ_INT(rc, -1); CHECK_EQ_INT(code, PROTO_E_TOO_DEEP); }
        raw_free(&m);
    }
    /* Deep empty containers count too. */
    unsigned char deep[64];
    size_t n = 0;
    deep[n++] = 0x81; deep[n++] = 0xa1; deep[n++] = 'x';
    for (int i = 0; i < 20; i++) deep[n++] = 0x91;
    deep[n++] = 0x90;
    CHECK_EQ_INT(one_req(deep, n, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_TOO_DEEP);
}

static void t_malformed(void)
{
    proto_req o;
    proto_err code;
    char err[200];
    const unsigned char arr[] = { 0x92, 0x01, 0x02 };
    CHECK_EQ_INT(one_req(arr, sizeof arr, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    const unsigned char str[] = { 0xa2, 'h', 'i' };
    CHECK_EQ_INT(one_req(str, sizeof str, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    const unsigned char num[] = { 0x05 };
    CHECK_EQ_INT(one_req(num, sizeof num, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    const unsigned char c1[] = { 0x81, 0xa1, 'x', 0xc1 };
    CHECK_EQ_INT(one_req(c1, sizeof c1, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    const unsigned char ext[] = { 0x81, 0xa1, 'x', 0xd4, 0x01, 0x00 };   /* fixext1 */
    CHECK_EQ_INT(one_req(ext, sizeof ext, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    const unsigned char ext8[] = { 0x81, 0xa1, 'x', 0xc7, 0x01, 0x05, 0x00 };
    CHECK_EQ_INT(one_req(ext8, sizeof ext8, &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    /* JSON text is not msgpack. */
    const char *json = "{\"type\":\"ping\",\"id\":1}";
    CHECK_EQ_INT(one_req(json, strlen(json), &o, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    /* A truncated message is just "need more". */
    const unsigned char part[] = { 0x82, 0xa4, 't', 'y' };
    CHECK_EQ_INT(one_req(part, sizeof part, &o, &code, err, sizeof err), 0);
    CHECK_EQ_INT(one_req(part, 0, &o, &code, err, sizeof err), 0);
}

/* Field-level errors: return 1 with a code, id/type filled in, and the reader
 * stays usable. */
static void t_fields(void)
{
    proto_req q;
    proto_err code;
    char err[256];
    struct { const char *type, *key; packfn v; proto_err want; } cases[] = {
        { "hello", "version", p_str, PROTO_E_BAD_REQUEST },
        { "hello", "version", p_neg, PROTO_E_INVALID_VALUE },
        { "hello", "version", p_huge, PROTO_E_INVALID_VALUE },
        { "hello", "client", p_int, PROTO_E_BAD_REQUEST },
        { "hello", "client", p_badutf8, PROTO_E_INVALID_UTF8 },
        { "generate", "prompt", p_int, PROTO_E_BAD_REQUEST },
        { "generate", "prompt", p_badutf8, PROTO_E_INVALID_UTF8 },
        { "generate", "system", p_arr, PROTO_E_BAD_REQUEST },
        { "generate", "system", p_badutf8, PROTO_E_INVALID_UTF8 },
        { "generate", "max_tokens", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "reasoning", p_int, PROTO_E_BAD_REQUEST },
        { "generate", "reasoning", p_str, PROTO_E_INVALID_VALUE },
        { "generate", "keep_reasoning", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "max_tokens", p_neg, PROTO_E_INVALID_VALUE },
        { "generate", "max_tokens", p_float, PROTO_E_INVALID_VALUE },
        { "generate", "max_tokens", p_big, PROTO_E_INVALID_VALUE },
        { "generate", "max_tokens", p_huge, PROTO_E_INVALID_VALUE },
        { "generate", "temperature", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "temperature", p_neg, PROTO_E_INVALID_VALUE },
        { "generate", "temperature", p_nan, PROTO_E_INVALID_VALUE },
        { "generate", "temperature", p_big, PROTO_E_INVALID_VALUE },
        { "generate", "top_k", p_bool, PROTO_E_BAD_REQUEST },
        { "generate", "top_k", p_neg, PROTO_E_INVALID_VALUE },
        { "generate", "top_p", p_map, PROTO_E_BAD_REQUEST },
        { "generate", "top_p", p_int, PROTO_E_INVALID_VALUE },
        { "generate", "min_p", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "min_p", p_neg, PROTO_E_INVALID_VALUE },
        { "generate", "repeat_penalty", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "repeat_penalty", p_neg, PROTO_E_INVALID_VALUE },
        { "generate", "repeat_penalty", p_big, PROTO_E_INVALID_VALUE },
        { "generate", "repeat_last_n", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "repeat_last_n", p_neg, PROTO_E_INVALID_VALUE },
        { "generate", "seed", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "seed", p_neg, PROTO_E_INVALID_VALUE },
        { "generate", "seed", p_float, PROTO_E_INVALID_VALUE },
        { "generate", "stop", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "stop", p_arr, PROTO_E_BAD_REQUEST },
        { "generate", "raw", p_int, PROTO_E_BAD_REQUEST },
        { "generate", "raw", p_str, PROTO_E_BAD_REQUEST },
        { "generate", "special", p_int, PROTO_E_BAD_REQUEST },
        { "generate", "tokens", p_str, PROTO_E_BAD_REQUEST },
        { "eval", "top", p_str, PROTO_E_BAD_REQUEST },
        { "eval", "top", p_neg, PROTO_E_INVALID_VALUE },
        { "eval", "raw", p_str, PROTO_E_BAD_REQUEST },
        { "tokenize", "text", p_int, PROTO_E_BAD_REQUEST },
        { "tokenize", "text", p_badutf8, PROTO_E_INVALID_UTF8 },
        { "tokenize", "special", p_str, PROTO_E_BAD_REQUEST },
        { "tokenize", "add_bos", p_int, PROTO_E_BAD_REQUEST },
        { "detokenize", "tokens", p_str, PROTO_E_BAD_REQUEST },
        { "detokenize", "tokens", p_arr_str, PROTO_E_BAD_REQUEST },
        { "detokenize", "tokens", p_arr_neg, PROTO_E_INVALID_VALUE },   /* negative, as every number */
        { "generate", "tokens", p_arr_neg, PROTO_E_INVALID_VALUE },
        { "eval", "tokens", p_arr_neg, PROTO_E_INVALID_VALUE },
        { "generate", "tokens", p_arr_big, PROTO_E_INVALID_TOKEN },
        { "detokenize", "tokens", p_arr_frac, PROTO_E_INVALID_TOKEN },
        { "detokenize", "tokens", p_arr_big, PROTO_E_INVALID_TOKEN },
        { "detokenize", "tokens", p_map, PROTO_E_BAD_REQUEST },
    };
    proto_reader *keep = proto_reader_new(0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int needs_prompt = (!strcmp(cases[i].type, "generate") || !strcmp(cases[i].type, "eval"))
                           && strcmp(cases[i].key, "prompt") && strcmp(cases[i].key, "tokens");
        int needs_text = !strcmp(cases[i].type, "tokenize") && strcmp(cases[i].key, "text");
        int needs_version = !strcmp(cases[i].type, "hello") && strcmp(cases[i].key, "version");
        const char *ek = needs_prompt ? "prompt" : needs_text ? "text" : needs_version ? "version" : NULL;
        packfn ev = needs_version ? p_int : p_prompt;
        int rc = field_case(cases[i].type, cases[i].key, cases[i].v, ek, ev, &q, &code, err, sizeof err);
        CHECKF(rc == 1 && code == cases[i].want, "%s.%s: rc %d code %s (want %s): %s", cases[i].type, cases[i].key,
               rc, proto_err_name(code), proto_err_name(cases[i].want), err);
        CHECKF(strstr(err, cases[i].key) != NULL, "%s.%s: message does not name the field: %s", cases[i].type, cases[i].key, err);
        CHECK_EQ_INT(q.id, 7);
        CHECK(strcmp(proto_type_name(q.type), cases[i].type) == 0);
    }
    /* The connection's reader goes on after a field error. */
    raw m;
    raw_init(&m);
    msgpack_pack_map(&m.pk, 3);
    raw_str(&m, "type"); raw_str(&m, "generate");
    raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 5);
    raw_str(&m, "prompt"); msgpack_pack_int(&m.pk, 1);
    msgpack_pack_map(&m.pk, 2);
    raw_str(&m, "type"); raw_str(&m, "ping");
    raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 6);
    proto_reader_feed(keep, m.sb.data, m.sb.size);
    CHECK_EQ_INT(proto_reader_next_req(keep, &q, &code, err, sizeof err), 1);
    CHECK_EQ_INT(code, PROTO_E_BAD_REQUEST);
    CHECK_EQ_INT(q.id, 5);
    CHECK_EQ_INT(proto_reader_next_req(keep, &q, &code, err, sizeof err), 1);
    CHECK_EQ_INT(code, PROTO_OK);
    CHECK_EQ_INT(q.type, PROTO_T_PING);
    CHECK_EQ_INT(q.id, 6);
    raw_free(&m);
    proto_reader_free(keep);
}

/* Heads, presence rules, numbers in any encoding, nil and unknown keys. */
static void t_heads(void)
{
    proto_req q;
    proto_err code;
    char err[256];
    raw m;
    int rc;
#define BUILD(n, ...) do { raw_init(&m); msgpack_pack_map(&m.pk, n); __VA_ARGS__; \
        rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err); raw_free(&m); } while (0)
    BUILD(1, raw_str(&m, "id"); msgpack_pack_int(&m.pk, 3));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && q.id == 3 && strstr(err, "type"));
    BUILD(2, raw_str(&m, "type"); msgpack_pack_int(&m.pk, 3); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 4));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && q.id == 4);
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "frobnicate"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 4));
    CHECK(rc == 1 && code == PROTO_E_UNKNOWN_TYPE && q.id == 4 && q.type == PROTO_T_NONE && strstr(err, "frobnicate"));
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "done"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 4));
    CHECK(rc == 1 && code == PROTO_E_UNKNOWN_TYPE);   /* an event name is no request */
    BUILD(1, raw_str(&m, "type"); raw_str(&m, "ping"));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "id"));
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "ping"); raw_str(&m, "id"); raw_str(&m, "1"));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && q.type == PROTO_T_PING);
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "ping"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, -1));
    CHECK(rc == 1 && code == PROTO_E_INVALID_VALUE);
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "ping"); raw_str(&m, "id"); msgpack_pack_double(&m.pk, 12.0));
    CHECK(rc == 1 && code == PROTO_OK && q.id == 12);
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "ping"); raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, UINT64_MAX));
    CHECK(rc == 1 && code == PROTO_OK && q.id == UINT64_MAX);
    /* hello: id optional, version required */
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "hello"); raw_str(&m, "version"); msgpack_pack_int8(&m.pk, 1));
    CHECK(rc == 1 && code == PROTO_OK && q.id == 0 && q.version == 1 && q.client == NULL);
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "hello"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "version"));
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "hello"); raw_str(&m, "version"); msgpack_pack_int(&m.pk, 99));
    CHECK(rc == 1 && code == PROTO_OK && q.version == 99);   /* the daemon judges the version */
    /* generate: prompt xor tokens */
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "generate"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "prompt"));
    BUILD(4, raw_str(&m, "type"); raw_str(&m, "generate"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "prompt"); raw_str(&m, "a"); raw_str(&m, "tokens"); p_arr(&m.pk));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST);
    BUILD(3, raw_str(&m, "type"); raw_str(&m, "eval"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "tokens"); p_arr_empty(&m.pk));
    CHECK(rc == 1 && code == PROTO_E_INVALID_VALUE && strstr(err, "tokens"));
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "tokenize"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "text"));
    BUILD(2, raw_str(&m, "type"); raw_str(&m, "detokenize"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1));
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "tokens"));
    /* numbers in other encodings; nil means default; unknown keys ignored */
    BUILD(9, raw_str(&m, "type"); raw_str(&m, "generate"); raw_str(&m, "id"); msgpack_pack_uint8(&m.pk, 200);
          raw_str(&m, "prompt"); raw_str(&m, "x");
          raw_str(&m, "max_tokens"); p_floatint(&m.pk);
          raw_str(&m, "temperature"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "top_k"); msgpack_pack_int64(&m.pk, 5);
          raw_str(&m, "top_p"); msgpack_pack_float(&m.pk, 0.5f);
          raw_str(&m, "min_p"); p_nil(&m.pk);
          raw_str(&m, "future_field"); msgpack_pack_map(&m.pk, 1); raw_str(&m, "a"); msgpack_pack_array(&m.pk, 0));
    CHECKF(rc == 1 && code == PROTO_OK, "%s", err);
    CHECK(q.id == 200 && q.max_tokens == 100 && q.temperature == 1.0f && q.top_k == 5 && q.top_p == 0.5f);
    CHECK_NEAR(q.min_p, 0.05, 1e-6);
    /* Non-string keys are ignored. */
    BUILD(3, raw_str(&m, "type"); raw_str(&m, "ping"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          msgpack_pack_int(&m.pk, 5); msgpack_pack_int(&m.pk, 5));
    CHECK(rc == 1 && code == PROTO_OK);
    /* bin accepted where text is expected */
    BUILD(3, raw_str(&m, "type"); raw_str(&m, "tokenize"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "text"); msgpack_pack_bin_with_body(&m.pk, "ab", 2));
    CHECK(rc == 1 && code == PROTO_OK && q.text_len == 2 && strcmp(q.text, "ab") == 0);
    /* Empty map. */
    BUILD(0, (void)0);
    CHECK(rc == 1 && code == PROTO_E_BAD_REQUEST);
    /* Boundary values accepted. */
    BUILD(8, raw_str(&m, "type"); raw_str(&m, "generate"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "tokens"); p_arr(&m.pk);
          raw_str(&m, "max_tokens"); msgpack_pack_int(&m.pk, PROTO_MAX_GEN);
          raw_str(&m, "temperature"); msgpack_pack_double(&m.pk, PROTO_MAX_TEMPERATURE);
          raw_str(&m, "top_p"); msgpack_pack_int(&m.pk, 0);
          raw_str(&m, "repeat_penalty"); msgpack_pack_double(&m.pk, PROTO_MAX_PENALTY);
          raw_str(&m, "seed"); msgpack_pack_uint64(&m.pk, UINT64_MAX));
    CHECKF(rc == 1 && code == PROTO_OK, "%s", err);
    CHECK(q.seed == UINT64_MAX && q.has_seed && q.max_tokens == PROTO_MAX_GEN);
    BUILD(4, raw_str(&m, "type"); raw_str(&m, "generate"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "tokens"); p_arr(&m.pk); raw_str(&m, "max_tokens"); msgpack_pack_int(&m.pk, PROTO_MAX_GEN + 1));
    CHECK(rc == 1 && code == PROTO_E_INVALID_VALUE);
    BUILD(4, raw_str(&m, "type"); raw_str(&m, "generate"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "tokens"); p_arr(&m.pk); raw_str(&m, "repeat_penalty"); msgpack_pack_int(&m.pk, 0));
    CHECK(rc == 1 && code == PROTO_E_INVALID_VALUE);
    BUILD(4, raw_str(&m, "type"); raw_str(&m, "eval"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "tokens"); p_arr(&m.pk); raw_str(&m, "top"); msgpack_pack_int(&m.pk, PROTO_MAX_TOP + 1));
    CHECK(rc == 1 && code == PROTO_E_INVALID_VALUE);
    BUILD(4, raw_str(&m, "type"); raw_str(&m, "eval"); raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
          raw_str(&m, "tokens"); p_arr(&m.pk); raw_str(&m, "top"); msgpack_pack_int(&m.pk, 0));
    CHECK(rc == 1 && code == PROTO_E_INVALID_VALUE);
#undef BUILD
}

/* Per-field size limits: the request is refused, the connection kept. */
static void t_limits(void)
{
    proto_req q;
    proto_err code;
    char err[256];
    raw m;
    int rc;
    char *big = malloc(PROTO_MAX_PROMPT + 1);
    memset(big, 'p', PROTO_MAX_PROMPT + 1);
    for (int over = 0; over <= 1; over++) {
        raw_init(&m);
        msgpack_pack_map(&m.pk, 3);
        raw_str(&m, "type"); raw_str(&m, "generate");
        raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
        raw_str(&m, "prompt"); raw_strn(&m, big, PROTO_MAX_PROMPT + (size_t)over);
        rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err);
        CHECKF(rc == 1 && code == (over ? PROTO_E_TOO_LARGE : PROTO_OK), "over %d: %d %s", over, rc, err);
        if (!over) CHECK_EQ_INT(q.text_len, PROTO_MAX_PROMPT);
        raw_free(&m);
    }
    for (int over = 0; over <= 1; over++) {
        raw_init(&m);
        msgpack_pack_map(&m.pk, 3);
        raw_str(&m, "type"); raw_str(&m, "detokenize");
        raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
        raw_str(&m, "tokens");
        size_t n = PROTO_MAX_TOKENS + (size_t)over;
        msgpack_pack_array(&m.pk, n);
        for (size_t i = 0; i < n; i++) msgpack_pack_int(&m.pk, (int)(i % 100));
        rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err);
        CHECKF(rc == 1 && code == (over ? PROTO_E_TOO_LARGE : PROTO_OK), "tokens over %d: %d %s", over, rc, err);
        if (!over) CHECK(q.n_tokens == PROTO_MAX_TOKENS && q.tokens[PROTO_MAX_TOKENS - 1] == (PROTO_MAX_TOKENS - 1) % 100);
        raw_free(&m);
    }
    for (int over = 0; over <= 1; over++) {
        raw_init(&m);
        msgpack_pack_map(&m.pk, 4);
        raw_str(&m, "type"); raw_str(&m, "generate");
        raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
        raw_str(&m, "prompt"); raw_str(&m, "x");
        raw_str(&m, "stop");
        msgpack_pack_array(&m.pk, PROTO_MAX_STOP + over);
        for (int i = 0; i < PROTO_MAX_STOP + over; i++) raw_strn(&m, big, PROTO_MAX_STOP_LEN);
        rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err);
        CHECKF(rc == 1 && code == (over ? PROTO_E_TOO_LARGE : PROTO_OK), "stop over %d: %s", over, err);
        if (!over) CHECK(q.n_stop == PROTO_MAX_STOP && q.stop_len[15] == PROTO_MAX_STOP_LEN);
        raw_free(&m);
    }
    raw_init(&m);
    msgpack_pack_map(&m.pk, 4);
    raw_str(&m, "type"); raw_str(&m, "generate");
    raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
    raw_str(&m, "prompt"); raw_str(&m, "x");
    raw_str(&m, "stop"); msgpack_pack_array(&m.pk, 1); raw_strn(&m, big, PROTO_MAX_STOP_LEN + 1);
    rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err);
    CHECK(rc == 1 && code == PROTO_E_TOO_LARGE && strstr(err, "stop"));
    raw_free(&m);
    raw_init(&m);
    msgpack_pack_map(&m.pk, 4);
    raw_str(&m, "type"); raw_str(&m, "generate");
    raw_str(&m, "id"); msgpack_pack_int(&m.pk, 1);
    raw_str(&m, "prompt"); raw_str(&m, "x");
    raw_str(&m, "stop"); msgpack_pack_array(&m.pk, 1); raw_str(&m, "");
    rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err);
    CHECK(rc == 1 && code == PROTO_E_INVALID_VALUE);
    raw_free(&m);
    raw_init(&m);
    msgpack_pack_map(&m.pk, 3);
    raw_str(&m, "type"); raw_str(&m, "hello");
    raw_str(&m, "version"); msgpack_pack_int(&m.pk, 1);
    raw_str(&m, "client"); raw_strn(&m, big, PROTO_MAX_NAME + 1);
    rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err);
    CHECK(rc == 1 && code == PROTO_E_TOO_LARGE);
    raw_free(&m);
    free(big);
}

/* The reader's buffer stays bounded and is released when idle. */
static void t_bounded(void)
{
    proto_reader *r = proto_reader_new(0);
    size_t avail;
    char *p = proto_reader_space(r, &avail);
    CHECK(p != NULL && avail >= 4096 && avail <= PROTO_MAX_FRAME + 65536);
    /* Feeding without draining is refused past two frames. */
    char *junk = calloc(1, PROTO_MAX_FRAME);
    int fails = 0;
    for (int i = 0; i < 4; i++) fails += proto_reader_feed(r, junk, PROTO_MAX_FRAME) < 0;
    CHECK(fails >= 2);
    free(junk);
    proto_reader_free(r);
    /* Stream 10 MB of messages through space/commit: space never grows past
     * a frame plus a read. */
    r = proto_reader_new(0);
    proto_buf b = {0};
    proto_req q, o;
    proto_req_init(&q, PROTO_T_TOKENIZE, 1);
    char text[3000];
    memset(text, 'q', sizeof text);
    q.text = text; q.text_len = sizeof text;
    for (int i = 0; i < 10; i++) proto_req_encode(&b, &q);
    size_t maxavail = 0;
    int got = 0;
    proto_err code;
    char err[100];
    for (int round = 0; round < 300; round++) {
        size_t off = 0;
        while (off < b.len) {
            char *sp = proto_reader_space(r, &avail);
            if (avail > maxavail) maxavail = avail;
            if (!sp || !avail) break;
            size_t k = b.len - off < avail ? b.len - off : avail;
            memcpy(sp, b.data + off, k);
            proto_reader_commit(r, k);
            off += k;
            while (proto_reader_next_req(r, &o, &code, err, sizeof err) == 1) got++;
        }
    }
    CHECK_EQ_INT(got, 3000);
    CHECK(maxavail <= PROTO_MAX_FRAME + 65536);
    proto_buf_free(&b);
    proto_reader_free(r);
    proto_reader_free(NULL);
    proto_buf_free(NULL);
}

static void t_utf8(void)
{
    struct { const char *s; int ok; } v[] = {
        { "", 1 }, { "ascii", 1 }, { "\xc3\xa9", 1 }, { "\xe2\x82\xac", 1 }, { "\xf0\x9f\x98\x80", 1 },
        { "\xef\xbf\xbf", 1 }, { "\xf4\x8f\xbf\xbf", 1 }, { "\xed\x9f\xbf", 1 },
        { "\xc0\x80", 0 }, { "\xc1\xbf", 0 }, { "\xe0\x80\x80", 0 }, { "\xe0\x9f\xbf", 0 },
        { "\xed\xa0\x80", 0 }, { "\xed\xbf\xbf", 0 }, { "\xf0\x80\x80\x80", 0 }, { "\xf4\x90\x80\x80", 0 },
        { "\xf5\x80\x80\x80", 0 }, { "\xff", 0 }, { "\x80", 0 }, { "\xc3", 0 }, { "\xe2\x82", 0 },
        { "a\xc3(", 0 }, { "\xf0\x9f\x98", 0 },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        CHECKF(proto_utf8_valid(v[i].s, strlen(v[i].s)) == v[i].ok, "case %zu", i);
    CHECK(proto_utf8_valid("a\0b", 3));
    CHECK_EQ_INT(proto_utf8_whole("", 0), 0);
    CHECK_EQ_INT(proto_utf8_whole("abc", 3), 3);
    CHECK_EQ_INT(proto_utf8_whole("ab\xc3", 3), 2);
    CHECK_EQ_INT(proto_utf8_whole("ab\xc3\xa9", 4), 4);
    CHECK_EQ_INT(proto_utf8_whole("a\xe2\x82", 3), 1);
    CHECK_EQ_INT(proto_utf8_whole("a\xe2", 2), 1);
    CHECK_EQ_INT(proto_utf8_whole("a\xe2\x82\xac", 4), 4);
    CHECK_EQ_INT(proto_utf8_whole("\xf0\x9f\x98", 3), 0);
    CHECK_EQ_INT(proto_utf8_whole("\xf0\x9f\x98\x80", 4), 4);
    CHECK_EQ_INT(proto_utf8_whole("x\x80\x80", 3), 3);   /* stray continuations never complete */
    CHECK_EQ_INT(proto_utf8_whole("x\xff", 2), 2);
    /* Every prefix of a valid string cut by whole() is valid. */
    const char *s = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80!";
    int ok = 1;
    for (size_t n = 0; n <= strlen(s); n++) ok &= proto_utf8_valid(s, proto_utf8_whole(s, n));
    CHECK(ok);
}

/* ---- fuzzing ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Feeds data in random pieces; returns the number of messages seen. */
static int fuzz_feed(const char *data, size_t n, int events)
{
    proto_reader *r = proto_reader_new(rnd() % 4 ? 0 : 64 + rnd() % 512);
    proto_err code;
    char err[128];
    int msgs = 0;
    size_t off = 0;
    while (off < n) {
        size_t k = 1 + rnd() % 64;
        if (k > n - off) k = n - off;
        if (proto_reader_feed(r, data + off, k) < 0) break;
        off += k;
        int rc;
        for (;;) {
            if (events) {
                proto_ev e;
                rc = proto_reader_next_ev(r, &e, &code, err, sizeof err);
                if (rc == 1 && code == PROTO_OK && e.text) msgs += e.text[e.text_len] == 0;   /* touch the data */
            } else {
                proto_req q;
                rc = proto_reader_next_req(r, &q, &code, err, sizeof err);
                if (rc == 1 && code == PROTO_OK && q.tokens) msgs += q.tokens[0] >= 0 || q.n_tokens == 0;
            }
            if (rc != 1) break;
            msgs++;
        }
        if (rc < 0) break;
    }
    proto_reader_free(r);
    return msgs;
}

static void t_fuzz(void)
{
    /* A corpus of valid frames. */
    proto_buf corpus[20];
    int nc = 0;
    memset(corpus, 0, sizeof corpus);
    static const int32_t toks[] = { 1, 2, 3, 300, 70000 };
    proto_req q;
    proto_req_init(&q, PROTO_T_HELLO, 0); q.client = "fz"; q.client_len = 2;
    proto_req_encode(&corpus[nc++], &q);
    proto_req_init(&q, PROTO_T_GENERATE, 1); q.text = "Once \xc3\xa9"; q.text_len = 7; q.has_seed = 1; q.seed = 5;
    q.stop[0] = "a"; q.stop_len[0] = 1; q.n_stop = 1; q.system = "s"; q.system_len = 1;
    proto_req_encode(&corpus[nc++], &q);
    proto_req_init(&q, PROTO_T_GENERATE, 2); q.tokens = toks; q.n_tokens = 5;
    proto_req_encode(&corpus[nc++], &q);
    proto_req_init(&q, PROTO_T_EVAL, 3); q.tokens = toks; q.n_tokens = 3; q.top = 4;
    proto_req_encode(&corpus[nc++], &q);
    proto_req_init(&q, PROTO_T_TOKENIZE, 4); q.text = "hi"; q.text_len = 2;
    proto_req_encode(&corpus[nc++], &q);
    proto_req_init(&q, PROTO_T_DETOKENIZE, 5); q.tokens = toks; q.n_tokens = 5;
    proto_req_encode(&corpus[nc++], &q);
    proto_req_init(&q, PROTO_T_CANCEL, 6);
    proto_req_encode(&corpus[nc++], &q);
    proto_ev e;
    proto_top top[3] = { { 1, 2.5f }, { 7, -1.0f }, { 9, -3.0f } };
    proto_client_count pc[1] = { { 1, 2, 3, 4 } };
    proto_ev_init(&e, PROTO_T_LOGITS, 7); e.top = top; e.n_top = 3; e.pos = 2;
    proto_ev_encode(&corpus[nc++], &e);
    proto_ev_init(&e, PROTO_T_DONE, 8); e.finish = "eos"; e.finish_len = 3; e.prompt_tokens = 3;
    proto_ev_encode(&corpus[nc++], &e);
    proto_ev_init(&e, PROTO_T_INFO_OK, 9); e.per_client = pc; e.n_per_client = 1; e.arch = "llama"; e.arch_len = 5;
    proto_ev_encode(&corpus[nc++], &e);
    proto_ev_init(&e, PROTO_T_TOKEN, 10); e.text = "ab"; e.text_len = 2; e.token = 5;
    proto_ev_encode(&corpus[nc++], &e);
    proto_ev_init(&e, PROTO_T_ERROR, 11); e.code = PROTO_E_BUSY; e.message = "m"; e.message_len = 1;
    proto_ev_encode(&corpus[nc++], &e);
    proto_ev_init(&e, PROTO_T_TOKENS, 12); e.tokens = toks; e.n_tokens = 5;
    proto_ev_encode(&corpus[nc++], &e);

    /* Clean corpus decodes fully on both sides (as garbage on the wrong side). */
    int total = 0;
    for (int i = 0; i < nc; i++) total += fuzz_feed(corpus[i].data, corpus[i].len, i >= 7) > 0;
    CHECK_EQ_INT(total, nc);

    char buf[4096];
    long runs = 0, decoded = 0;
    /* Random bytes, biased toward msgpack header bytes. */
    for (int it = 0; it < 20000; it++) {
        size_t n = 1 + rnd() % 300;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = rnd();
            buf[i] = (char)((x & 3) == 0 ? 0x80 + (x >> 8) % 0x60 : (x >> 8));
        }
        if (rnd() % 2) buf[0] = (char)(0x80 | (rnd() % 16));
        fuzz_feed(buf, n, (int)(rnd() % 2));
        runs++;
    }
    /* Mutations of valid frames: flips, splices, truncations, duplication. */
    for (int it = 0; it < 40000; it++) {
        const proto_buf *src = &corpus[rnd() % (uint32_t)nc];
        size_t n = src->len;
        if (n > sizeof buf / 2) n = sizeof buf / 2;
        memcpy(buf, src->data, n);
        int muts = 1 + (int)(rnd() % 4);
        for (int k = 0; k < muts; k++) {
            switch (rnd() % 6) {
            case 0: buf[rnd() % n] ^= (char)(1u << (rnd() % 8)); break;
            case 1: buf[rnd() % n] = (char)rnd(); break;
            case 2: { static const unsigned char hot[] = { 0xdb, 0xdd, 0xdf, 0xc6, 0xff, 0x00, 0x7f, 0x80, 0x90, 0xa0, 0xc1, 0xd4, 0xcb, 0xca };
                      buf[rnd() % n] = (char)hot[rnd() % sizeof hot]; break; }
            case 3: if (n > 1) n = 1 + rnd() % (n - 1); break;
            case 4: { size_t a = rnd() % n; if (n + (n - a) < sizeof buf) { memcpy(buf + n, buf + a, n - a); n += n - a; } break; }
            case 5: { size_t a = rnd() % n, len = 1 + rnd() % 8; if (a + len > n) len = n - a;
                      memmove(buf + a, buf + a + len, n - a - len); n -= len; if (!n) n = 1; break; }
            }
        }
        decoded += fuzz_feed(buf, n, (int)(rnd() % 2));
        runs++;
    }
    CHECK_EQ_INT(runs, 60000);
    CHECKF(decoded > 1000, "only %ld messages decoded from mutations", decoded);
    for (int i = 0; i < nc; i++) proto_buf_free(&corpus[i]);
}

/* "messages": a whole conversation in generate/eval. */
static void p_msgs_ok(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    msgpack_pack_map(pk, 2);
    msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, "system", 6);
    msgpack_pack_str_with_body(pk, "content", 7); msgpack_pack_str_with_body(pk, "be brief", 8);
    msgpack_pack_map(pk, 3);
    msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, "user", 4);
    msgpack_pack_str_with_body(pk, "name", 4); msgpack_pack_int(pk, 3);   /* unknown: ignored */
    msgpack_pack_str_with_body(pk, "content", 7); msgpack_pack_nil(pk);   /* nil: "" */
}
static void p_msgs_norole(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    msgpack_pack_str_with_body(pk, "content", 7); msgpack_pack_str_with_body(pk, "hi", 2);
}
static void p_msgs_longrole(msgpack_packer *pk)
{
    char role[PROTO_MAX_ROLE + 1];
    memset(role, 'r', sizeof role);
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, role, sizeof role);
}
static void p_msgs_badutf8(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 2);
    msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, "user", 4);
    msgpack_pack_str_with_body(pk, "content", 7); msgpack_pack_str_with_body(pk, "a\xff", 2);
}
static void p_msgs_many(msgpack_packer *pk)
{
    msgpack_pack_array(pk, PROTO_MAX_MSGS + 1);
    for (int i = 0; i <= PROTO_MAX_MSGS; i++) {
        msgpack_pack_map(pk, 1);
        msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, "u", 1);
    }
}
/* The most messages, each as small as a message can be: the decoder's
 * storage must hold them. */
static void p_msgs_max_small(msgpack_packer *pk)
{
    msgpack_pack_array(pk, PROTO_MAX_MSGS);
    for (int i = 0; i < PROTO_MAX_MSGS; i++) {
        msgpack_pack_map(pk, 1);
        msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, "u", 1);
    }
}
/* The most messages, each an empty map (1 byte on the wire, 32 decoded):
 * refused for the missing role, not for lack of storage. */
static void p_msgs_empty_maps(msgpack_packer *pk)
{
    msgpack_pack_array(pk, PROTO_MAX_MSGS);
    for (int i = 0; i < PROTO_MAX_MSGS; i++) msgpack_pack_map(pk, 0);
}
static void p_msgs_nil_roles(msgpack_packer *pk)
{
    msgpack_pack_array(pk, PROTO_MAX_MSGS);
    for (int i = 0; i < PROTO_MAX_MSGS; i++) {
        msgpack_pack_map(pk, 1);
        msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_nil(pk);
    }
}
/* Valid entries, the last one without a role. */
static void p_msgs_last_norole(msgpack_packer *pk)
{
    msgpack_pack_array(pk, PROTO_MAX_MSGS);
    for (int i = 0; i < PROTO_MAX_MSGS - 1; i++) {
        msgpack_pack_map(pk, 1);
        msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, "u", 1);
    }
    msgpack_pack_map(pk, 0);
}
/* Entries that are not maps after a run of empty maps. */
static void p_msgs_not_map(msgpack_packer *pk)
{
    msgpack_pack_array(pk, PROTO_MAX_MSGS);
    for (int i = 0; i < PROTO_MAX_MSGS; i++) msgpack_pack_int(pk, 1);
}
static void p_msgs_bulky(msgpack_packer *pk)
{
    /* two contents just over PROTO_MAX_PROMPT together, in one frame */
    static char big[2 * (PROTO_MAX_PROMPT / 2 + 1)];
    memset(big, 'a', sizeof big);
    msgpack_pack_array(pk, 2);
    for (int i = 0; i < 2; i++) {
        msgpack_pack_map(pk, 2);
        msgpack_pack_str_with_body(pk, "role", 4); msgpack_pack_str_with_body(pk, "user", 4);
        msgpack_pack_str_with_body(pk, "content", 7); msgpack_pack_str_with_body(pk, big, sizeof big / 2);
    }
}

static void t_messages(void)
{
    proto_reader *r = proto_reader_new(0);
    proto_req q, o;
    proto_err code;
    char err[256];
    static const proto_msg msgs[] = {
        { "system", 6, "You are terse.", 14, NULL, 0 },
        { "user", 4, "Hi \xc3\xa9", 6, NULL, 0 },
        { "assistant", 9, "", 0, NULL, 0 },
        { "user", 4, "Again", 5, NULL, 0 },
    };
    proto_req_init(&q, PROTO_T_GENERATE, 9);
    q.msgs = msgs; q.n_msgs = 4; q.max_tokens = 3;
    if (rt_req(r, &q, &o) == 0) {
        CHECK(o.text == NULL && o.tokens == NULL);
        CHECK_EQ_INT(o.n_msgs, 4);
        for (size_t i = 0; o.msgs && i < 4 && i < o.n_msgs; i++) {
            CHECK(o.msgs[i].role_len == msgs[i].role_len && memcmp(o.msgs[i].role, msgs[i].role, msgs[i].role_len) == 0);
            CHECK(o.msgs[i].content_len == msgs[i].content_len
                  && memcmp(o.msgs[i].content, msgs[i].content, msgs[i].content_len) == 0);
        }
        CHECK_EQ_INT(o.max_tokens, 3);
    }
    proto_req_init(&q, PROTO_T_EVAL, 10);
    q.msgs = msgs + 1; q.n_msgs = 1; q.top = 2;
    if (rt_req(r, &q, &o) == 0) {
        CHECK_EQ_INT(o.n_msgs, 1);
        CHECK_EQ_INT(o.top, 2);
    }
    /* Requests without messages decode none. */
    proto_req_init(&q, PROTO_T_GENERATE, 11);
    q.text = "x"; q.text_len = 1;
    if (rt_req(r, &q, &o) == 0) CHECK(o.msgs == NULL && o.n_msgs == 0);
    /* Too many to encode. */
    proto_buf b = {0};
    proto_req_init(&q, PROTO_T_GENERATE, 12);
    q.msgs = msgs; q.n_msgs = PROTO_MAX_MSGS + 1;
    CHECK(proto_req_encode(&b, &q) == -1 && b.len == 0);
    proto_buf_free(&b);
    proto_reader_free(r);

    int rc = field_case("generate", "messages", p_msgs_ok, NULL, NULL, &q, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_OK, "%s", err);
    if (rc == 1 && code == PROTO_OK && q.n_msgs == 2) {
        CHECK(q.msgs[0].role_len == 6 && strcmp(q.msgs[0].role, "system") == 0);
        CHECK(q.msgs[0].content_len == 8 && strcmp(q.msgs[0].content, "be brief") == 0);
        CHECK(q.msgs[1].role_len == 4 && q.msgs[1].content && q.msgs[1].content_len == 0);
    } else CHECK(0);
    rc = field_case("generate", "messages", p_msgs_max_small, NULL, NULL, &q, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_OK && q.n_msgs == PROTO_MAX_MSGS, "%s", err);
    /* Hostile shapes are refused as bad requests naming the entry. */
    rc = field_case("generate", "messages", p_msgs_empty_maps, NULL, NULL, &q, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "\"messages\"[0]") && strstr(err, "role"),
           "1024 empty maps: %s: %s", proto_err_name(code), err);
    rc = field_case("eval", "messages", p_msgs_empty_maps, NULL, NULL, &q, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "\"messages\"[0]"),
           "eval, 1024 empty maps: %s: %s", proto_err_name(code), err);
    rc = field_case("generate", "messages", p_msgs_nil_roles, NULL, NULL, &q, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "\"messages\"[0]") && strstr(err, "role"),
           "1024 nil roles: %s: %s", proto_err_name(code), err);
    rc = field_case("generate", "messages", p_msgs_last_norole, NULL, NULL, &q, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "\"messages\"[1023]"),
           "last entry without role: %s: %s", proto_err_name(code), err);
    rc = field_case("generate", "messages", p_msgs_not_map, NULL, NULL, &q, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_E_BAD_REQUEST && strstr(err, "\"messages\"[0] must be a map"),
           "1024 integers: %s: %s", proto_err_name(code), err);

    struct { const char *type; packfn v; const char *extra_key; packfn extra; proto_err want; } cases[] = {
        { "generate", p_str, NULL, NULL, PROTO_E_BAD_REQUEST },
        { "generate", p_arr, NULL, NULL, PROTO_E_BAD_REQUEST },
        { "generate", p_arr_empty, NULL, NULL, PROTO_E_INVALID_VALUE },
        { "generate", p_msgs_norole, NULL, NULL, PROTO_E_BAD_REQUEST },
        { "generate", p_msgs_longrole, NULL, NULL, PROTO_E_TOO_LARGE },
        { "generate", p_msgs_badutf8, NULL, NULL, PROTO_E_INVALID_UTF8 },
        { "generate", p_msgs_many, NULL, NULL, PROTO_E_TOO_LARGE },
        { "generate", p_msgs_bulky, NULL, NULL, PROTO_E_TOO_LARGE },
        { "generate", p_msgs_ok, "prompt", p_prompt, PROTO_E_BAD_REQUEST },
        { "generate", p_msgs_ok, "tokens", p_arr, PROTO_E_BAD_REQUEST },
        { "generate", p_msgs_ok, "system", p_prompt, PROTO_E_BAD_REQUEST },
        { "generate", p_msgs_ok, "raw", p_bool, PROTO_E_BAD_REQUEST },
        { "eval", p_msgs_norole, NULL, NULL, PROTO_E_BAD_REQUEST },
        { "eval", p_msgs_ok, "prompt", p_prompt, PROTO_E_BAD_REQUEST },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rc = field_case(cases[i].type, "messages", cases[i].v, cases[i].extra_key, cases[i].extra,
                        &q, &code, err, sizeof err);
        CHECKF(rc == 1 && code == cases[i].want, "case %zu: rc %d code %s (%s)", i, rc, proto_err_name(code), err);
        CHECK_EQ_INT(q.id, 7);
    }
    /* messages is not a tokenize field: ignored there. */
    rc = field_case("tokenize", "messages", p_msgs_ok, "text", p_prompt, &q, &code, err, sizeof err);
    CHECK(rc == 1 && code == PROTO_OK && q.n_msgs == 0);
}

/* An info event whose per_client holds many empty maps (1 byte each on the
 * wire, 16 decoded): decodes, each entry all zeros. */
static void t_sparse_per_client(void)
{
    enum { N = 20000 };
    raw m;
    raw_init(&m);
    msgpack_pack_map(&m.pk, 3);
    raw_str(&m, "type"); raw_str(&m, "info");
    raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 5);
    raw_str(&m, "per_client"); msgpack_pack_array(&m.pk, N);
    for (int i = 0; i < N - 1; i++) msgpack_pack_map(&m.pk, 0);
    msgpack_pack_map(&m.pk, 1); raw_str(&m, "uid"); msgpack_pack_uint32(&m.pk, 1234);
    proto_reader *r = proto_reader_new(0);
    proto_ev e;
    proto_err code;
    char err[256];
    CHECK(proto_reader_feed(r, m.sb.data, m.sb.size) == 0);
    int rc = proto_reader_next_ev(r, &e, &code, err, sizeof err);
    CHECKF(rc == 1 && code == PROTO_OK, "rc %d %s: %s", rc, proto_err_name(code), err);
    if (rc == 1 && code == PROTO_OK) {
        CHECK_EQ_INT(e.n_per_client, N);
        CHECK(e.per_client[0].uid == 0 && e.per_client[N / 2].pid == 0 && e.per_client[N - 1].uid == 1234);
    }
    /* the next message reuses the reader: the extra storage went with the last one */
    CHECK(proto_reader_feed(r, m.sb.data, m.sb.size) == 0);
    rc = proto_reader_next_ev(r, &e, &code, err, sizeof err);
    CHECK(rc == 1 && code == PROTO_OK && e.n_per_client == N && e.per_client[N - 1].uid == 1234);
    proto_reader_free(r);
    raw_free(&m);
}

/* "closing": true marks an error after which the daemon closes the
 * connection; other errors carry no such key (and decode as 0). */
static void t_error_closing(void)
{
    proto_reader *r = proto_reader_new(0);
    proto_ev e, o;
    for (int closing = 0; closing <= 1; closing++) {
        proto_ev_init(&e, PROTO_T_ERROR, 0);
        e.code = PROTO_E_TOO_LARGE;
        e.message = "message larger than 1048576 bytes";
        e.message_len = strlen(e.message);
        e.closing = closing;
        proto_buf b = {0};
        CHECK_EQ_INT(proto_ev_encode(&b, &e), 0);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        CHECK(msgpack_unpack_next(&u, b.data, b.len, NULL) == MSGPACK_UNPACK_SUCCESS);
        CHECK(u.data.type == MSGPACK_OBJECT_MAP);
        int seen = 0;
        for (uint32_t i = 0; u.data.type == MSGPACK_OBJECT_MAP && i < u.data.via.map.size; i++) {
            const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == 7 &&
                !memcmp(kv->key.via.str.ptr, "closing", 7)) {
                seen = 1;
                CHECK(kv->val.type == MSGPACK_OBJECT_BOOLEAN && kv->val.via.boolean);
            }
        }
        CHECK_EQ_INT(seen, closing);
        CHECK_EQ_INT(u.data.via.map.size, 4 + closing);
        msgpack_unpacked_destroy(&u);
        proto_buf_free(&b);
        if (rt_ev(r, &e, &o) == 0) {
            CHECK_EQ_INT(o.closing, closing);
            CHECK_EQ_INT(o.code, PROTO_E_TOO_LARGE);
        }
    }
    /* a "closing" that is not a bool is a bad event */
    raw m;
    raw_init(&m);
    msgpack_pack_map(&m.pk, 4);
    raw_str(&m, "type"); raw_str(&m, "error");
    raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 0);
    raw_str(&m, "code"); raw_str(&m, "busy");
    raw_str(&m, "closing"); msgpack_pack_int(&m.pk, 1);
    proto_err code;
    char err[256];
    CHECK(proto_reader_feed(r, m.sb.data, m.sb.size) == 0);
    CHECK_EQ_INT(proto_reader_next_ev(r, &o, &code, err, sizeof err), 1);
    CHECKF(code == PROTO_E_BAD_REQUEST && strstr(err, "closing"), "%s: %s", proto_err_name(code), err);
    raw_free(&m);
    proto_reader_free(r);
}

/* Token ids: negative ones are invalid_value (as every negative number),
 * fractions and ids no vocabulary can hold invalid_token; the message names
 * the field, the index and the value. */
/* After too_large the reader says how large the refused message claimed to
 * be (at least), from its first byte: a server can read that much and drop
 * it, so the peer finishes its write and reads the error. */
static void t_claimed(void)
{
    proto_reader *r = proto_reader_new(0);
    CHECK(proto_reader_claimed(r) == 0);
    /* {"type": "tokenize", "id": 1, "text": <str32 of 3 MiB>}: only the head sent */
    raw m;
    raw_init(&m);
    msgpack_pack_map(&m.pk, 3);
    raw_str(&m, "type"); raw_str(&m, "tokenize");
    raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 1);
    raw_str(&m, "text");
    size_t head = m.sb.size;
    const unsigned char h32[] = { 0xdb, 0x00, 0x30, 0x00, 0x00 };   /* str32, 3 MiB */
    msgpack_sbuffer_write(&m.sb, (const char *)h32, sizeof h32);
    msgpack_sbuffer_write(&m.sb, "aaaa", 4);
    proto_req q;
    proto_err code;
    char err[200];
    CHECK(proto_reader_feed(r, m.sb.data, m.sb.size) == 0);
    CHECK_EQ_INT(proto_reader_next_req(r, &q, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_TOO_LARGE);
    CHECK(proto_reader_claimed(r) == head + 5 + (3u << 20));
    CHECK_EQ_INT(proto_reader_pending(r), m.sb.size);
    raw_free(&m);
    proto_reader_free(r);
    /* an array claiming 2^31 elements: at least one byte each */
    r = proto_reader_new(0);
    const unsigned char a32[] = { 0x81, 0xa1, 'x', 0xdd, 0x80, 0x00, 0x00, 0x00 };
    CHECK(proto_reader_feed(r, a32, sizeof a32) == 0);
    CHECK_EQ_INT(proto_reader_next_req(r, &q, &code, err, sizeof err), -1);
    CHECK(proto_reader_claimed(r) == sizeof a32 + 0x80000000ull);
    proto_reader_free(r);
    /* other breaks claim nothing */
    r = proto_reader_new(0);
    const unsigned char bad[] = { 0x81, 0xc1 };
    CHECK(proto_reader_feed(r, bad, sizeof bad) == 0);
    CHECK_EQ_INT(proto_reader_next_req(r, &q, &code, err, sizeof err), -1);
    CHECK_EQ_INT(code, PROTO_E_MALFORMED);
    CHECK(proto_reader_claimed(r) == 0);
    proto_reader_free(r);
}

static void t_token_ids(void)
{
    static const struct { double v; int is_float; proto_err want; const char *text; } cases[] = {
        { -1, 0, PROTO_E_INVALID_VALUE, "\"tokens\"[1] = -1 must not be negative" },
        { -2147483648.0, 0, PROTO_E_INVALID_VALUE, "\"tokens\"[1] = -2147483648 must not be negative" },
        { -0.5, 1, PROTO_E_INVALID_TOKEN, "\"tokens\"[1] is not a token id" },
        { 2.5, 1, PROTO_E_INVALID_TOKEN, "\"tokens\"[1] is not a token id" },
        { 2147483648.0, 0, PROTO_E_INVALID_TOKEN, "\"tokens\"[1] = 2147483648 is outside any vocabulary" },
        { 7.0, 1, PROTO_OK, NULL },
    };
    const char *types[] = { "generate", "eval", "detokenize" };
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            raw m;
            raw_init(&m);
            msgpack_pack_map(&m.pk, 3);
            raw_str(&m, "type"); raw_str(&m, types[t]);
            raw_str(&m, "id"); msgpack_pack_uint64(&m.pk, 9);
            raw_str(&m, "tokens"); msgpack_pack_array(&m.pk, 2);
            msgpack_pack_int(&m.pk, 1);
            if (cases[i].is_float) msgpack_pack_double(&m.pk, cases[i].v);
            else msgpack_pack_int64(&m.pk, (int64_t)cases[i].v);
            proto_req q;
            proto_err code;
            char err[256] = "";
            int rc = one_req(m.sb.data, m.sb.size, &q, &code, err, sizeof err);
            CHECKF(rc == 1 && code == cases[i].want, "%s %g: rc %d %s (want %s): %s", types[t], cases[i].v, rc,
                   proto_err_name(code), proto_err_name(cases[i].want), err);
            if (cases[i].text) {
                char want[160];
                snprintf(want, sizeof want, "%s: %s", types[t], cases[i].text);
                CHECKF(strncmp(err, want, strlen(want)) == 0, "'%s' does not start '%s'", err, want);
            } else {
                CHECK(q.n_tokens == 2 && q.tokens[1] == 7);
            }
            raw_free(&m);
        }
}

int main(void)
{
    RUN(t_names);
    RUN(t_defaults);
    RUN(t_req_roundtrip);
    RUN(t_ev_roundtrip);
    RUN(t_logprobs);
    RUN(t_done_wire);
    RUN(t_partial);
    RUN(t_too_large);
    RUN(t_depth);
    RUN(t_malformed);
    RUN(t_fields);
    RUN(t_heads);
    RUN(t_limits);
    RUN(t_bounded);
    RUN(t_utf8);
    RUN(t_fuzz);
    RUN(t_messages);
    RUN(t_sparse_per_client);
    RUN(t_error_closing);
    RUN(t_token_ids);
    RUN(t_claimed);
    return CHECK_DONE();
}
