/* util.c — aned-http's growing buffer and its error answers: one JSON
 * shape for every error, its HTTP status and OpenAI "type"/"code"/"param"
 * from the daemon's error codes. */
#include "http/gw_int.h"
#include "common/strbuf.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ buffers */

void sb_free(sbuf *b) { free(b->p); b->p = NULL; b->len = b->cap = 0; b->oom = 0; }

int sb_reserve(sbuf *b, size_t add)
{
    if (b->oom) return -1;
    if (b->p && add <= b->cap - b->len) return 0;   /* an empty add still makes room for the NUL */
    size_t need = b->len + add, cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap + 1);
    if (!p) { b->oom = 1; return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

void sb_add(sbuf *b, const char *s, size_t n)
{
    if (sb_reserve(b, n) < 0) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[256];   /* most fit: formatted once */
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
    } else if (n >= 0 && sb_reserve(b, (size_t)n + 1) == 0) {
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, again);
        b->len += (size_t)n;
    }
    va_end(again);
}

/* A JSON string literal of UTF-8 text (the daemon guarantees UTF-8). */
void sb_json_str(sbuf *b, const char *s, size_t n)
{
    if (sb_reserve(b, n + 2) < 0) return;
    sb_add(b, "\"", 1);
    size_t run = 0;   /* s[run..i) is added as it is */
    for (size_t i = 0; i < n; i++) {
        char e[6];
        size_t el = json_escape((unsigned char)s[i], e);
        if (!el) continue;
        sb_add(b, s + run, i - run);
        sb_add(b, e, el);
        run = i + 1;
    }
    sb_add(b, s + run, n - run);
    sb_add(b, "\"", 1);
}

long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------ responses */

static const char *err_type_for(unsigned status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

void add_common_headers(gw_req *rq, struct MHD_Response *r)
{
    if (rq && rq->origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", rq->origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
}

enum MHD_Result send_buf(gw_req *rq, struct MHD_Connection *mc, unsigned status,
                                const char *ctype, const char *data, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    add_common_headers(rq, r);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 405 && rq) MHD_add_response_header(r, "Allow", route_is_get(rq->rt) ? "GET, HEAD" : "POST");
    if (rq && rq->conn && rq->conn->over) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (rq) rq->status = status;
    enum MHD_Result ret = MHD_queue_response(mc, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result send_json(gw_req *rq, struct MHD_Connection *mc, unsigned status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (!s) return send_buf(rq, mc, 500, "application/json",
                            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}", 84);
    enum MHD_Result ret = send_buf(rq, mc, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

enum MHD_Result send_sb(gw_req *rq, struct MHD_Connection *mc, sbuf *b)
{
    enum MHD_Result ret = b->oom ? send_error(rq, mc, 500, NULL, NULL, "out of memory")
                                 : send_buf(rq, mc, 200, "application/json", b->p, b->len);
    sb_free(b);
    return ret;
}

json_t *error_obj(unsigned status, const char *code, const char *param, const char *msg)
{
    json_t *e = json_pack("{s:s, s:s, s:s?, s:s?}", "message", msg, "type", err_type_for(status),
                          "param", param, "code", code);
    return json_pack("{s:o}", "error", e);
}

enum MHD_Result send_error(gw_req *rq, struct MHD_Connection *mc, unsigned status,
                           const char *code, const char *param, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* The message may quote client text cut at any byte: keep it UTF-8. */
    size_t n = strlen(msg);
    while (n && !proto_utf8_valid(msg, n)) n--;
    msg[n] = 0;
    if (G.verbose) logf_("%u: %s", status, msg);
    return send_json(rq, mc, status, error_obj(status, code, param, msg));
}

/* The HTTP status and OpenAI code for a daemon error. */
static unsigned status_for(proto_err e, const char **code)
{
    *code = NULL;
    switch (e) {
    case PROTO_E_CONTEXT: *code = "context_length_exceeded"; return 400;
    case PROTO_E_BUSY: *code = "busy"; return 429;
    case PROTO_E_NO_MODEL: *code = "no_model"; return 501;
    case PROTO_E_SHUTDOWN: *code = "shutting_down"; return 503;
    case PROTO_E_MODEL_CHANGED: *code = "model_changed"; return 503;
    case PROTO_E_DENIED: *code = "denied"; return 502;
    case PROTO_E_INTERNAL: *code = "internal"; return 500;
    case PROTO_E_MALFORMED: case PROTO_E_TOO_DEEP: case PROTO_E_VERSION: case PROTO_E_HANDSHAKE:
    case PROTO_E_DUPLICATE_ID: case PROTO_E_UNKNOWN_TYPE:
        *code = proto_err_name(e); return 502;
    default:
        *code = proto_err_name(e); return 400;
    }
}

/* The request field a daemon error is about, in OpenAI's names, found as the
 * first protocol field name the message mentions ("top_p must be in (0, 1]").
 * NULL when it names none. */
static const char *param_for(route rt, const char *msg)
{
    /* protocol name; its OpenAI name for completions, chat, tokenize, detokenize */
    static const char *const names[][5] = {
        { "max_tokens", "max_tokens", "max_tokens" }, { "temperature", "temperature", "temperature" },
        { "top_k", "top_k", "top_k" }, { "top_p", "top_p", "top_p" }, { "min_p", "min_p", "min_p" },
        { "repeat_penalty", "repeat_penalty", "repeat_penalty" },
        { "repeat_last_n", "repeat_last_n", "repeat_last_n" }, { "seed", "seed", "seed" },
        { "stop", "stop", "stop" }, { "messages", "prompt", "messages" }, { "prompt", "prompt", "messages" },
        { "tokens", "prompt", "messages", NULL, "tokens" }, { "token", "prompt", "messages", NULL, "tokens" },
        { "text", NULL, NULL, "content" },
    };
    int col = rt == R_COMPLETIONS ? 1 : rt == R_CHAT ? 2 : rt == R_TOKENIZE ? 3 : rt == R_DETOKENIZE ? 4 : 0;
    if (!col) return NULL;
    const char *best = NULL, *best_at = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!names[i][col]) continue;
        size_t n = strlen(names[i][0]);
        for (const char *p = strstr(msg, names[i][0]); p; p = strstr(p + 1, names[i][0])) {
            if ((p > msg && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) || isalnum((unsigned char)p[n]) || p[n] == '_')
                continue;   /* inside a longer word */
            if (!best_at || p < best_at) { best_at = p; best = names[i][col]; }
            break;
        }
    }
    return best;
}

/* How a job (or a one-shot request) failed, copied out of its event: the
 * event's strings live in the daemon connection's buffers, which conn_drop
 * frees. */

void err_from_event(route rt, const proto_ev *ev, job_err *je)
{
    je->status = status_for(ev->code, &je->code);
    size_t n = ev->message_len < sizeof je->msg - 1 ? ev->message_len : sizeof je->msg - 1;
    memcpy(je->msg, ev->message ? ev->message : "", ev->message ? n : 0);
    if (!ev->message) n = 0;
    while (n && !proto_utf8_valid(je->msg, n)) n--;   /* cut inside a character */
    je->msg[n] = 0;
    je->param = je->status == 400 ? param_for(rt, je->msg) : NULL;
}

