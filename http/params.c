/* params.c — reading a generation request's fields: each is checked for
 * type and range and named in the error when wrong; what aned cannot do is
 * refused by name, never ignored. */
#include "http/gw_int.h"
#include "http/logprobs.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ request parsing helpers */

long long now_s(void) { return (long long)time(NULL); }

void make_id(char *out, size_t n, const char *prefix)
{
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
        memcpy(r, &v, 8);
        memset(r + 8, 0, 4);
    }
    int k = snprintf(out, n, "%s", prefix);
    for (size_t i = 0; i < sizeof r && k >= 0 && (size_t)k + 2 < n; i++)
        k += snprintf(out + k, n - (size_t)k, "%02x", r[i]);
}

/* Nesting depth of a JSON text, outside strings (jansson recurses). */
int json_too_deep(const char *s, size_t n, int limit)
{
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') in_str = 1;
        else if (c == '[' || c == '{') { if (++depth > limit) return 1; }
        else if (c == ']' || c == '}') depth--;
    }
    return 0;
}

/* The param of an error about one message's field: "messages[3].role". */
const char *msg_param(perr *e, size_t i, const char *field)
{
    snprintf(e->pbuf, sizeof e->pbuf, "messages[%zu]%s%s", i, field ? "." : "", field ? field : "");
    return e->pbuf;
}

int pfail(perr *e, const char *param, const char *fmt, ...)
{
    e->status = 400;
    e->code = "invalid_value";
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int unsupported(perr *e, const char *param, const char *why)
{
    pfail(e, param, "\"%s\" is not supported by aned%s%s", param, why ? ": " : "", why ? why : "");
    e->code = "unsupported_parameter";
    return -1;
}

static int get_number(json_t *o, const char *key, double lo, double hi, int *has, double *out, perr *e)
{
    json_t *v = json_object_get(o, key);
    *has = 0;
    if (!present(v)) return 0;
    if (!json_is_number(v)) return pfail(e, key, "\"%s\" must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return pfail(e, key, "\"%s\" = %g is out of range [%g, %g]", key, d, lo, hi);
    *has = 1;
    *out = d;
    return 0;
}

int get_int(json_t *o, const char *key, long long lo, long long hi, int *has, long long *out, perr *e)
{
    json_t *v = json_object_get(o, key);
    *has = 0;
    if (!present(v)) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && fabs(json_real_value(v)) < 9.2e18 && json_real_value(v) == floor(json_real_value(v)))
        x = (long long)json_real_value(v);
    else return pfail(e, key, "\"%s\" must be an integer", key);
    if (x < lo || x > hi) return pfail(e, key, "\"%s\" = %lld is out of range [%lld, %lld]", key, x, lo, hi);
    *has = 1;
    *out = x;
    return 0;
}

int get_bool(json_t *o, const char *key, int def, int *out, perr *e)
{
    json_t *v = json_object_get(o, key);
    *out = def;
    if (!present(v)) return 0;
    if (!json_is_boolean(v)) return pfail(e, key, "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* Fields shared by both generation endpoints → q (sampling, stop, limits). */
int parse_sampling(json_t *o, proto_req *q, int chat, int *n_out, perr *e)
{
    int has;
    double d;
    long long x;
    /* max_tokens: OpenAI's defaults — 16 for completions, the rest of the
     * context for chat; -1 (llama.cpp) also means "until the context ends". */
    q->max_tokens = chat ? 0 : GW_COMPLETIONS_DEF_MAX;
    const char *mt = chat && present(json_object_get(o, "max_completion_tokens")) ? "max_completion_tokens" : "max_tokens";
    if (get_int(o, mt, -1, PROTO_MAX_GEN, &has, &x, e) < 0) return -1;
    if (has) {
        /* 0 with echo: the prompt alone, scored (evaluation harnesses' loglikelihood) */
        if (x == 0 && !chat && json_is_true(json_object_get(o, "echo"))) { q->echo = q->prompt_only = 1; x = 1; }
        if (x == 0) return pfail(e, mt, "\"%s\" must be at least 1 (or -1 for the rest of the context; 0 only with \"echo\")", mt);
        q->max_tokens = x < 0 ? 0 : (int32_t)x;
    }
    if (get_number(o, "temperature", 0, PROTO_MAX_TEMPERATURE, &has, &d, e) < 0) return -1;
    if (has) q->temperature = (float)d;
    if (get_number(o, "top_p", 0, 1, &has, &d, e) < 0) return -1;   /* 0: the most likely token alone */
    if (has) q->top_p = (float)d;
    if (get_int(o, "top_k", 0, INT32_MAX, &has, &x, e) < 0) return -1;
    if (has) q->top_k = (int32_t)x;
    if (get_number(o, "min_p", 0, 1, &has, &d, e) < 0) return -1;
    if (has) q->min_p = (float)d;
    if (get_number(o, "repeat_penalty", 0, PROTO_MAX_PENALTY, &has, &d, e) < 0) return -1;
    if (has) {
        if (d <= 0) return pfail(e, "repeat_penalty", "\"repeat_penalty\" must be greater than 0");
        q->repeat_penalty = (float)d;
    }
    if (get_int(o, "repeat_last_n", 0, PROTO_MAX_TOKENS, &has, &x, e) < 0) return -1;
    if (has) q->repeat_last_n = (int32_t)x;
    if (get_int(o, "seed", LLONG_MIN, LLONG_MAX, &has, &x, e) < 0) return -1;
    if (has) { q->seed = (uint64_t)x; q->has_seed = 1; }
    if (get_int(o, "n", 1, GW_MAX_CHOICES, &has, &x, e) < 0) return -1;
    *n_out = has ? (int)x : 1;

    /* stop: a string or up to PROTO_MAX_STOP strings. */
    json_t *st = json_object_get(o, "stop");
    q->n_stop = 0;
    if (present(st)) {
        json_t *one[1] = { st };
        size_t n = json_is_array(st) ? json_array_size(st) : 1;
        if (!json_is_array(st) && !json_is_string(st)) return pfail(e, "stop", "\"stop\" must be a string or an array of strings");
        if (n > PROTO_MAX_STOP) return pfail(e, "stop", "\"stop\" has %zu strings; at most %d", n, PROTO_MAX_STOP);
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_is_array(st) ? json_array_get(st, i) : one[0];
            if (!json_is_string(s)) return pfail(e, "stop", "\"stop\"[%zu] must be a string", i);
            size_t len = json_string_length(s);
            if (len == 0) continue;
            if (len > PROTO_MAX_STOP_LEN) return pfail(e, "stop", "\"stop\"[%zu] is %zu bytes; at most %d", i, len, PROTO_MAX_STOP_LEN);
            q->stop[q->n_stop] = json_string_value(s);
            q->stop_len[q->n_stop++] = len;
        }
    }

    /* Declined clearly rather than ignored. */
    static const char *const zero_only[] = { "presence_penalty", "frequency_penalty" };
    for (size_t i = 0; i < 2; i++) {
        if (get_number(o, zero_only[i], -2, 2, &has, &d, e) < 0) return -1;
        if (has && d != 0) return unsupported(e, zero_only[i], "use \"repeat_penalty\" (1 = off)");
    }
    json_t *lb = json_object_get(o, "logit_bias");
    if (present(lb) && !(json_is_object(lb) && json_object_size(lb) == 0)) return unsupported(e, "logit_bias", NULL);
    if (lp_parse(o, q, chat, e) < 0) return -1;
    /* Tools, structured output and audio are declined on both endpoints
     * until implemented: a client must not take plain text for them. */
    json_t *tools = json_object_get(o, "tools"), *fns = json_object_get(o, "functions");
    if (!chat && present(tools) && !(json_is_array(tools) && json_array_size(tools) == 0))
        return unsupported(e, "tools", "tools go with /v1/chat/completions");
    if (present(fns) && !(json_is_array(fns) && json_array_size(fns) == 0))
        return unsupported(e, "functions", "give \"tools\" instead (the deprecated functions are not taken)");
    json_t *tc = json_object_get(o, "tool_choice");
    if (!chat && present(tc) && !(json_is_string(tc) && (!strcmp(json_string_value(tc), "none") || !strcmp(json_string_value(tc), "auto"))))
        return unsupported(e, "tool_choice", "tools go with /v1/chat/completions");
    /* completions are raw text: reasoning is not taken apart there */
    json_t *rfmt = json_object_get(o, "reasoning_format");
    if (!chat && present(rfmt) && !(json_is_string(rfmt) && !strcmp(json_string_value(rfmt), "none")))
        return unsupported(e, "reasoning_format", "reasoning is taken apart on /v1/chat/completions; completions are raw text");
    if (!chat && present(json_object_get(o, "keep_reasoning")))
        return unsupported(e, "keep_reasoning", "it applies to messages (/v1/chat/completions)");
    if (!chat && present(json_object_get(o, "chat_template_kwargs")))
        return unsupported(e, "chat_template_kwargs", "completions are raw text, not rendered by the chat template");
    json_t *fc = json_object_get(o, "function_call");
    if (present(fc) && !(json_is_string(fc) && (!strcmp(json_string_value(fc), "none") || !strcmp(json_string_value(fc), "auto"))))
        return unsupported(e, "function_call", "tool calls are not implemented");
    /* response_format: text, json_object, json_schema {schema, strict};
     * `grammar` (GBNF) as an extension. The schema's JSON text is kept in
     * the request object, which outlives the daemon request. */
    json_t *rf = json_object_get(o, "response_format");
    json_t *gr = json_object_get(o, "grammar");
    if (present(gr)) {
        if (!json_is_string(gr)) return pfail(e, "grammar", "\"grammar\" must be a string (GBNF)");
        q->grammar = json_string_value(gr);
        q->grammar_len = json_string_length(gr);
    }
    if (present(rf)) {
        json_t *t = json_object_get(rf, "type");
        const char *ts = json_is_string(t) ? json_string_value(t) : "";
        if (strcmp(ts, "json_object") == 0) q->json_object = 1;
        else if (strcmp(ts, "json_schema") == 0) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *sc = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!json_is_object(sc) && !json_is_boolean(sc))
                return pfail(e, "response_format", "\"response_format\": {\"type\": \"json_schema\"} needs \"json_schema\": {\"schema\": {...}}");
            char *text = json_dumps(sc, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!text) return pfail(e, "response_format", "the schema cannot be serialized");
            json_object_set_new(rf, "\x01text", json_string(text));
            free(text);
            json_t *kept = json_object_get(rf, "\x01text");
            if (!kept) return pfail(e, "response_format", "the schema is not valid UTF-8");
            q->json_schema = json_string_value(kept);
            q->json_schema_len = json_string_length(kept);
        } else if (strcmp(ts, "text") != 0)
            return unsupported(e, "response_format", "{\"type\": \"text\"}, \"json_object\" or \"json_schema\"");
        if (q->grammar && (q->json_object || q->json_schema))
            return pfail(e, "grammar", "\"grammar\" and a JSON \"response_format\" exclude each other");
    }
    /* guided_regex and guided_choice, as vLLM names them */
    json_t *gx = json_object_get(o, "guided_regex"), *gc = json_object_get(o, "guided_choice");
    if (present(gx)) {
        if (!json_is_string(gx) || json_string_length(gx) == 0 || json_string_length(gx) > PROTO_MAX_CHOICE_LEN)
            return pfail(e, "guided_regex", "\"guided_regex\" must be a non-empty string of at most %d bytes", PROTO_MAX_CHOICE_LEN);
        q->regex = json_string_value(gx);
        q->regex_len = json_string_length(gx);
    }
    if (present(gc)) {
        size_t i;
        json_t *c;
        if (!json_is_array(gc) || json_array_size(gc) == 0 || json_array_size(gc) > PROTO_MAX_CHOICE)
            return pfail(e, "guided_choice", "\"guided_choice\" must be an array of 1 to %d strings", PROTO_MAX_CHOICE);
        json_array_foreach(gc, i, c) {
            if (!json_is_string(c) || json_string_length(c) == 0 || json_string_length(c) > PROTO_MAX_CHOICE_LEN)
                return pfail(e, "guided_choice", "\"guided_choice\"[%zu] must be a non-empty string of at most %d bytes", i,
                             PROTO_MAX_CHOICE_LEN);
            q->choice[i] = json_string_value(c);
            q->choice_len[i] = json_string_length(c);
        }
        q->n_choice = json_array_size(gc);
    }
    if ((q->grammar || q->json_object || q->json_schema) + (q->regex != NULL) + (q->n_choice > 0) > 1)
        return pfail(e, present(gx) ? "guided_regex" : "guided_choice",
                     "grammar, response_format, guided_regex and guided_choice exclude each other");
    json_t *mo = json_object_get(o, "modalities");
    if (present(mo)) {
        size_t i;
        json_t *md;
        if (!json_is_array(mo)) return pfail(e, "modalities", "\"modalities\" must be an array of strings");
        json_array_foreach(mo, i, md)
            if (!json_is_string(md) || strcmp(json_string_value(md), "text") != 0)
                return unsupported(e, "modalities", "only [\"text\"]");
    }
    if (present(json_object_get(o, "audio"))) return unsupported(e, "audio", "audio output is not implemented");
    json_t *m = json_object_get(o, "model");
    if (present(m) && !json_is_string(m)) return pfail(e, "model", "\"model\" must be a string");
    return 0;
}

