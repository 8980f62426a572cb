/* aned-http — an OpenAI-compatible HTTP gateway to aned.
 *
 * A separate, unprivileged program: it speaks HTTP (libmicrohttpd) and JSON
 * (jansson) to its clients and the aned protocol (libaneclient) to the
 * daemon, so HTTP parsing never runs inside the process that owns the model.
 *
 * Threads: libmicrohttpd runs one thread per HTTP connection (bounded by
 * --max-connections; a few more are taken only to be answered 503). Each HTTP connection owns one daemon connection, made
 * on its first request and kept for the following keep-alive requests; it is
 * only ever used from that connection's thread. While a request waits for
 * the daemon, its thread also watches the HTTP socket: a client that goes
 * away cancels its jobs.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (both with
 * "stream": true as server-sent events), GET /v1/models[/ID], GET /health,
 * POST /tokenize, POST /detokenize. This file serves requests; options,
 * listening and main are in main.c; the buffer and error answers in util.c;
 * request fields in params.c. */
#include "client/aneclient.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "http/gw_int.h"
#include "http/logprobs.h"
#include "http/tools.h"

/* Connections within --max-connections (the others are "over"). */
static atomic_uint n_served;

/* ------------------------------------------------------------------ daemon side */

/* The connection's daemon client, connecting when needed. -1: 503 sent-worthy, err says why. */
int conn_ane(gw_conn *c, char *err, size_t errlen)
{
    if (c->ane) return 0;
    ane_connect_opts o = { G.socket_path, GW_NAME, 5000, G.daemon_uid };
    proto_err refused = PROTO_OK;
    if (ane_connect_with(&c->ane, &o, &refused, err, errlen) < 0) { c->ane = NULL; return -1; }
    return 0;
}

void conn_drop(gw_conn *c)
{
    ane_close(c->ane);   /* cancels whatever is still in flight there */
    c->ane = NULL;
}

/* Waits for the next daemon event while watching the HTTP peer.
 * 1 event; -1 daemon connection failed (err); -2 the HTTP client left. */
int wait_event(gw_req *rq, proto_ev *ev, char *err, size_t errlen)
{
    gw_conn *c = rq->conn;
    for (;;) {
        int rc = ane_next_event(c->ane, ev, 0, err, errlen);
        if (rc == 1) return 1;
        if (rc < 0) return -1;
        struct pollfd pf[2] = { { ane_fd(c->ane), POLLIN, 0 }, { c->fd, POLLRDHUP, 0 } };
        int pr = poll(pf, c->fd >= 0 ? 2 : 1, -1);
        if (pr < 0 && errno != EINTR) { snprintf(err, errlen, "poll: %s", strerror(errno)); return -1; }
        if (pr > 0 && c->fd >= 0 && (pf[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) return -2;
    }
}

/* A one-shot request (info, ping, tokenize, detokenize): its terminal event. */
int ask_daemon(gw_req *rq, proto_type t, proto_ev *ev, char *err, size_t errlen)
{
    proto_req q;
    proto_req_init(&q, t, 0);
    return call_daemon(rq, &q, ev, err, errlen);
}

int call_daemon(gw_req *rq, proto_req *q, proto_ev *ev, char *err, size_t errlen)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (conn_ane(rq->conn, err, errlen) < 0) return -1;
        uint64_t id = ane_submit(rq->conn->ane, q, err, errlen);
        if (!id) { conn_drop(rq->conn); continue; }   /* a stale connection: once more */
        for (;;) {
            int rc = wait_event(rq, ev, err, errlen);
            if (rc == -2) { conn_drop(rq->conn); return -2; }
            if (rc < 0) { conn_drop(rq->conn); return -1; }
            if (ev->id == id && ane_event_terminal(ev)) return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ generation */

static void rq_free_jobs(gw_req *rq)
{
    for (int i = 0; i < rq->n_jobs; i++) {
        sb_free(&rq->jobs[i].text);
        sb_free(&rq->jobs[i].calls);
        sb_free(&rq->jobs[i].reasoning);
        lp_free(&rq->jobs[i]);
    }
}

static job *job_by_id(gw_req *rq, uint64_t id)
{
    for (int i = 0; i < rq->n_jobs; i++) if (rq->jobs[i].id == id) return &rq->jobs[i];
    return NULL;
}

/* OpenAI's finish_reason for aned's finish, or NULL when the text is not
 * whole: "cancelled" means aned stopped the job (shutting down, say), since
 * this gateway never cancels a job it still answers for. */
static const char *finish_reason(const char *f)
{
    if (!f) return NULL;
    if (!strcmp(f, "length")) return "length";
    if (!strcmp(f, "stop") || !strcmp(f, "eos")) return "stop";   /* a stop string, end of turn */
    if (!strcmp(f, "tool_calls")) return "tool_calls";
    return NULL;
}

/* Submits every job (q is per job: seeds differ per choice). */
static int submit_jobs(gw_req *rq, proto_req *qs, char *err, size_t errlen)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (conn_ane(rq->conn, err, errlen) < 0) return -1;
        int i;
        for (i = 0; i < rq->n_jobs; i++) {
            rq->jobs[i].id = ane_submit(rq->conn->ane, &qs[i], err, errlen);
            if (!rq->jobs[i].id) break;
        }
        if (i == rq->n_jobs) return 0;
        conn_drop(rq->conn);
        if (i > 0) return -1;   /* some were sent: do not send them twice */
    }
    return -1;
}

/* SSE: one chunk for a job's new text, its end, or the role opening. */
static void sse_chunk_head(gw_req *rq, sbuf *b)
{
    sb_printf(b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":%s,\"choices\":[",
              rq->id, rq->chat ? "chat.completion.chunk" : "text_completion", rq->created, rq->model_json);
}

/* reason (chat): reasoning text, a delta's reasoning_content; its content
 * then only when there is some. */
static void sse_delta(gw_req *rq, int index, const char *reason, size_t rlen, const char *text, size_t len,
                      const char *finish, job *lpj)
{
    sbuf *b = &rq->out;
    sse_chunk_head(rq, b);
    sb_printf(b, "{\"index\":%d,", index);
    if (rq->chat) {
        sb_puts(b, "\"delta\":{");
        if (reason) { sb_puts(b, "\"reasoning_content\":"); sb_json_str(b, reason, rlen); }
        if (text && (len || !reason)) { sb_puts(b, reason ? ",\"content\":" : "\"content\":"); sb_json_str(b, text, len); }
        sb_puts(b, "}");
    } else {
        sb_puts(b, "\"text\":");
        sb_json_str(b, text ? text : "", text ? len : 0);
    }
    sb_puts(b, ",");
    if (lpj) lp_json(rq, lpj, b);
    else sb_puts(b, "\"logprobs\":null");
    sb_puts(b, ",\"finish_reason\":");
    if (finish) sb_printf(b, "\"%s\"", finish);
    else sb_puts(b, "null");
    sb_puts(b, "}]}\n\n");
}

static void sse_text(gw_req *rq, int index, const char *text, size_t len, const char *finish, job *lpj)
{
    sse_delta(rq, index, NULL, 0, text, len, finish, lpj);
}

/* One tool call in OpenAI's shape: streamed as a whole delta (index, id,
 * type, name and arguments in one chunk), or an entry of message.tool_calls. */
static void call_json(sbuf *b, const proto_ev *ev, int with_index)
{
    sb_puts(b, "{");
    if (with_index) sb_printf(b, "\"index\":%u,", ev->call_index);
    sb_puts(b, "\"id\":");
    sb_json_str(b, ev->call_id, ev->call_id_len);
    sb_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
    sb_json_str(b, ev->call_name, ev->call_name_len);
    sb_puts(b, ",\"arguments\":");
    sb_json_str(b, ev->call_args, ev->call_args_len);
    sb_puts(b, "}}");
}

static void sse_call(gw_req *rq, int index, const proto_ev *ev)
{
    sbuf *b = &rq->out;
    sse_chunk_head(rq, b);
    sb_printf(b, "{\"index\":%d,\"delta\":{\"tool_calls\":[", index);
    call_json(b, ev, 1);
    sb_puts(b, "]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

static void usage_json(gw_req *rq, sbuf *b)
{
    uint64_t pt = 0, ct = 0, cached = 0;
    int seen[GW_MAX_CHOICES] = {0};
    for (int i = 0; i < rq->n_jobs; i++) {
        job *j = &rq->jobs[i];
        ct += j->completion_tokens;
        if (!seen[j->prompt_no]) { seen[j->prompt_no] = 1; pt += j->prompt_tokens; cached += j->cached_tokens; }
    }
    sb_printf(b, "{\"prompt_tokens\":%" PRIu64 ",\"completion_tokens\":%" PRIu64 ",\"total_tokens\":%" PRIu64
              ",\"prompt_tokens_details\":{\"cached_tokens\":%" PRIu64 "}}", pt, ct, pt + ct, cached);
}

static void sse_error(gw_req *rq, const job_err *je)
{
    json_t *j = error_obj(je->status, je->code, je->param, je->msg);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    sb_puts(&rq->out, "data: ");
    sb_puts(&rq->out, s ? s : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    sb_puts(&rq->out, "\n\n");
    free(s);
}

/* Applies one event to its job; for streams also renders it. Returns 1 when
 * the job ended without its whole answer — an error event, or a done that
 * aned cut short — with *je saying how. */
static int apply_event(gw_req *rq, const proto_ev *ev, job_err *je)
{
    job *j = job_by_id(rq, ev->id);
    if (!j || j->done) return 0;
    if (j->echo_ids == 1 && ev->type != PROTO_T_PROMPT_TOKEN) {
        lp_fix_utf8(&j->text);   /* the prompt's tokens' bytes, all in */
        j->echo_ids = 2;
    }
    if (j->echo_wait && ev->type != PROTO_T_PROMPT_TOKEN) {
        /* the prompt's tokens are all in: the echo's chunk, with their logprobs */
        j->echo_wait = 0;
        if (ev->type != PROTO_T_ERROR) sse_text(rq, j->index, j->text.p, j->text.len, NULL, j->lp ? j : NULL);
    }
    switch (ev->type) {
    case PROTO_T_PROMPT_TOKEN:
        if (j->echo_ids == 1 && ev->bytes_len) sb_add(&j->text, ev->bytes, ev->bytes_len);
        lp_add(rq, j, ev);
        break;
    case PROTO_T_TOKEN:
        lp_add(rq, j, ev);
        if (ev->text_len == 0 && !ev->reasoning_len && !lp_pending(j)) break;
        if (rq->stream) sse_delta(rq, j->index, ev->reasoning_len ? ev->reasoning : NULL, ev->reasoning_len,
                                  ev->text, ev->text_len, NULL, j->lp ? j : NULL);
        else {
            if (ev->text_len) sb_add(&j->text, ev->text, ev->text_len);
            if (ev->reasoning_len) sb_add(&j->reasoning, ev->reasoning, ev->reasoning_len);
        }
        break;
    case PROTO_T_TOOL_CALL:
        if (rq->stream) sse_call(rq, j->index, ev);
        else {
            if (j->n_calls) sb_puts(&j->calls, ",");
            call_json(&j->calls, ev, 0);
        }
        j->n_calls++;
        break;
    case PROTO_T_DONE:
        j->done = 1;
        rq->n_done++;
        j->finish = finish_reason(ev->finish);
        j->prompt_tokens = ev->prompt_tokens;
        j->cached_tokens = ev->cached_tokens;
        j->completion_tokens = ev->completion_tokens;
        if (!j->finish) {
            je->status = 503;
            je->code = "generation_cut_short";
            je->param = NULL;
            snprintf(je->msg, sizeof je->msg, "aned stopped choice %d after %u tokens, before its end (finish "
                     "\"%.40s\"; aned may be shutting down): the answer was cut short", j->index,
                     ev->completion_tokens, ev->finish ? ev->finish : "");
            return 1;
        }
        if (rq->stream) sse_text(rq, j->index, NULL, 0, j->finish, NULL);
        break;
    case PROTO_T_ERROR:
        j->done = 1;
        rq->n_done++;
        err_from_event(rq->rt, ev, je);
        return 1;
    default:
        break;
    }
    return 0;
}

/* 1 when ev ends its job without the whole answer (see apply_event). */
static int ev_fails(const proto_ev *ev)
{
    return ev->type == PROTO_T_ERROR || (ev->type == PROTO_T_DONE && !finish_reason(ev->finish));
}

static void lost_err(job_err *je, const char *err)
{
    je->status = 503;
    je->code = "daemon_unavailable";
    je->param = NULL;
    snprintf(je->msg, sizeof je->msg, "lost the connection to aned: %s", err);
}

static void sse_finish(gw_req *rq)
{
    if (rq->include_usage) {
        sse_chunk_head(rq, &rq->out);
        sb_puts(&rq->out, "],\"usage\":");
        usage_json(rq, &rq->out);
        sb_puts(&rq->out, "}\n\n");
    }
    sb_puts(&rq->out, "data: [DONE]\n\n");
    rq->finished = 1;
}

/* Ends a stream that cannot be completed: an error chunk, then [DONE]. The
 * jobs still running are cancelled by dropping the daemon connection (je is
 * a copy: nothing here points into that connection's buffers). */
static void sse_fail(gw_req *rq, const job_err *je)
{
    rq->stream_failed = 1;
    sse_error(rq, je);
    sb_puts(&rq->out, "data: [DONE]\n\n");
    if (rq->n_done < rq->n_jobs) conn_drop(rq->conn);
    rq->finished = 1;
}

/* Produces more SSE bytes into rq->out: at least one event's worth, then
 * whatever else has already arrived. */
static void stream_more(gw_req *rq)
{
    char err[256];
    proto_ev ev;
    job_err je;
    int rc = wait_event(rq, &ev, err, sizeof err);
    for (;;) {
        if (rc == -2) { conn_drop(rq->conn); rq->failed = 1; rq->finished = 1; return; }
        if (rc < 0) {
            conn_drop(rq->conn);
            lost_err(&je, err);
            sse_fail(rq, &je);
            return;
        }
        if (rc == 0) return;
        if (apply_event(rq, &ev, &je)) { sse_fail(rq, &je); return; }
        if (rq->n_done == rq->n_jobs) { sse_finish(rq); return; }
        if (rq->out.len - rq->out_off > 16384) return;
        rc = ane_next_event(rq->conn->ane, &ev, 0, err, sizeof err);
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    gw_req *rq = cls;
    (void)pos;
    while (rq->out_off == rq->out.len) {
        rq->out.len = rq->out_off = 0;
        if (rq->finished) return rq->failed ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        stream_more(rq);
        if (rq->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = rq->out.len - rq->out_off;
    if (n > max) n = max;
    memcpy(buf, rq->out.p + rq->out_off, n);
    rq->out_off += n;
    return (ssize_t)n;
}

/* Answers a request whose job failed before anything was sent: its status.
 * The others are cancelled first (je is a copy, so dropping is safe). */
static enum MHD_Result fail_http(gw_req *rq, struct MHD_Connection *mc, const job_err *je)
{
    if (rq->n_done < rq->n_jobs) conn_drop(rq->conn);
    return send_error(rq, mc, je->status, je->code, je->param, "%s", je->msg);
}

static enum MHD_Result respond_generation(gw_req *rq, struct MHD_Connection *mc)
{
    char err[256];
    proto_ev ev;
    job_err je;
    if (rq->stream) {
        /* Wait for the first event so that a refused request gets its HTTP status. */
        int rc = wait_event(rq, &ev, err, sizeof err);
        if (rc == -2) { conn_drop(rq->conn); return MHD_NO; }
        if (rc < 0) {
            conn_drop(rq->conn);
            return send_error(rq, mc, 503, "daemon_unavailable", NULL, "lost the connection to aned: %s", err);
        }
        if (ev_fails(&ev) && apply_event(rq, &ev, &je)) return fail_http(rq, mc, &je);
        if (rq->chat)
            for (int i = 0; i < rq->n_jobs; i++) {
                sse_chunk_head(rq, &rq->out);
                sb_printf(&rq->out, "{\"index\":%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                          "\"logprobs\":null,\"finish_reason\":null}]}\n\n", rq->jobs[i].index);
            }
        if (!rq->chat && rq->echo)
            for (int i = 0; i < rq->n_jobs; i++)
                if (rq->jobs[i].text.len && !rq->jobs[i].echo_wait)
                    sse_text(rq, rq->jobs[i].index, rq->jobs[i].text.p, rq->jobs[i].text.len, NULL, NULL);
        (void)apply_event(rq, &ev, &je);   /* not a failure: that was answered above */
        if (rq->n_done == rq->n_jobs) sse_finish(rq);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, rq, NULL);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        add_common_headers(rq, r);
        rq->status = 200;
        enum MHD_Result ret = MHD_queue_response(mc, 200, r);
        MHD_destroy_response(r);
        return ret;
    }

    while (rq->n_done < rq->n_jobs) {
        int rc = wait_event(rq, &ev, err, sizeof err);
        if (rc == -2) { conn_drop(rq->conn); return MHD_NO; }
        if (rc < 0) {
            conn_drop(rq->conn);
            return send_error(rq, mc, 503, "daemon_unavailable", NULL, "lost the connection to aned: %s", err);
        }
        if (apply_event(rq, &ev, &je)) return fail_http(rq, mc, &je);
    }
    sbuf b = {0};
    sb_printf(&b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":%s,\"choices\":[",
              rq->id, rq->chat ? "chat.completion" : "text_completion", rq->created, rq->model_json);
    for (int k = 0; k < rq->n_jobs; k++) {
        job *j = NULL;
        for (int i = 0; i < rq->n_jobs; i++) if (rq->jobs[i].index == k) j = &rq->jobs[i];
        if (!j) continue;
        sb_printf(&b, "%s{\"index\":%d,", k ? "," : "", k);
        if (rq->chat) {
            sb_puts(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
            if (j->n_calls && !j->text.len) sb_puts(&b, "null");   /* as OpenAI: a reply that only calls */
            else sb_json_str(&b, j->text.p ? j->text.p : "", j->text.len);
            if (j->reasoning.len) {
                sb_puts(&b, ",\"reasoning_content\":");
                sb_json_str(&b, j->reasoning.p, j->reasoning.len);
            }
            if (j->n_calls) {
                sb_puts(&b, ",\"tool_calls\":[");
                sb_add(&b, j->calls.p, j->calls.len);
                sb_puts(&b, "]");
            }
            sb_puts(&b, "}");
        } else {
            sb_puts(&b, "\"text\":");
            sb_json_str(&b, j->text.p ? j->text.p : "", j->text.len);
        }
        sb_puts(&b, ",");
        lp_json(rq, j, &b);
        sb_printf(&b, ",\"finish_reason\":\"%s\"}", j->finish);
    }
    sb_puts(&b, "],\"usage\":");
    usage_json(rq, &b);
    sb_puts(&b, "}");
    return send_sb(rq, mc, &b);
}

/* Chat message content: a string, null, or text parts joined by newlines. */
static int msg_content(json_t *c, size_t i, sbuf *tmp, const char **s, size_t *n, perr *e)
{
    if (!present(c)) { *s = ""; *n = 0; return 0; }
    if (json_is_string(c)) { *s = json_string_value(c); *n = json_string_length(c); return 0; }
    if (!json_is_array(c)) return pfail(e, msg_param(e, i, "content"), "messages[%zu].content must be a string or an array of parts", i);
    size_t start = tmp->len, k;
    json_t *part;
    int first = 1;
    json_array_foreach(c, k, part) {
        json_t *t = json_object_get(part, "type");
        if (!json_is_string(t)) return pfail(e, msg_param(e, i, "content"), "messages[%zu].content[%zu] needs a \"type\"", i, k);
        if (strcmp(json_string_value(t), "text") != 0) {
            pfail(e, msg_param(e, i, "content"), "messages[%zu].content[%zu]: only \"text\" parts are supported, not \"%s\"",
                  i, k, json_string_value(t));
            e->code = "unsupported_content";
            return -1;
        }
        json_t *tx = json_object_get(part, "text");
        if (!json_is_string(tx)) return pfail(e, msg_param(e, i, "content"), "messages[%zu].content[%zu].text must be a string", i, k);
        if (!first) sb_add(tmp, "\n", 1);
        sb_add(tmp, json_string_value(tx), json_string_length(tx));
        first = 0;
    }
    /* Offsets, not pointers: tmp may still move. Resolved by the caller. */
    *s = (const char *)(uintptr_t)start;
    *n = tmp->len - start;
    return 1;
}

static enum MHD_Result handle_generation(gw_req *rq, struct MHD_Connection *mc, json_t *o)
{
    perr e = { 400, NULL, NULL, "", "" };
    proto_req base;
    proto_req_init(&base, PROTO_T_GENERATE, 0);
    int n = 1;
    proto_req qs[GW_MAX_CHOICES];
    proto_msg *msgs = NULL;
    sbuf parts = {0};
    int *part_of = NULL;   /* per message: 1 when its content lives in parts */
    char **extras = NULL, *tools_json = NULL, *tvars_json = NULL;   /* JSON texts the requests point into */
    size_t n_extras = 0;
    enum MHD_Result ret;
    char err[256];

    if (parse_sampling(o, &base, rq->chat, &n, &e) < 0) goto bad;
    int has;
    if (get_bool(o, "stream", 0, &rq->stream, &e) < 0) goto bad;
    json_t *so = json_object_get(o, "stream_options");
    if (present(so)) {
        if (!json_is_object(so)) { pfail(&e, "stream_options", "\"stream_options\" must be an object"); goto bad; }
        if (get_bool(so, "include_usage", 0, &rq->include_usage, &e) < 0) goto bad;
    }

    int n_prompts = 1;
    json_t *prompts[GW_MAX_CHOICES];
    if (rq->chat) {
        json_t *ms = json_object_get(o, "messages");
        if (!json_is_array(ms) || json_array_size(ms) == 0) {
            pfail(&e, "messages", "\"messages\" must be a non-empty array");
            goto bad;
        }
        size_t nm = json_array_size(ms);
        if (nm > PROTO_MAX_MSGS) { pfail(&e, "messages", "%zu messages; at most %d", nm, PROTO_MAX_MSGS); goto bad; }
        msgs = calloc(nm, sizeof *msgs);
        part_of = calloc(nm, sizeof *part_of);
        if (!msgs || !part_of) { ret = send_error(rq, mc, 500, NULL, NULL, "out of memory"); goto out; }
        for (size_t i = 0; i < nm; i++) {
            json_t *m = json_array_get(ms, i);
            if (!json_is_object(m)) { pfail(&e, msg_param(&e, i, NULL), "messages[%zu] must be an object", i); goto bad; }
            json_t *role = json_object_get(m, "role");
            if (!json_is_string(role)) {
                pfail(&e, msg_param(&e, i, "role"), "messages[%zu].role must be a string (system, developer, user, assistant)", i);
                goto bad;
            }
            const char *r = json_string_value(role);
            if (strlen(r) != json_string_length(role)) { pfail(&e, msg_param(&e, i, "role"), "messages[%zu].role holds a NUL", i); goto bad; }
            if (!strcmp(r, "developer")) r = "system";
            if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
                pfail(&e, msg_param(&e, i, "role"), "messages[%zu].role \"%.40s\" is not supported (system, developer, user, assistant, tool)", i, r);
                goto bad;
            }
            int xbad;
            char xmsg[256];
            const char *xfield;
            char *x = gwt_msg_extra(m, i, &xbad, &xfield, xmsg, sizeof xmsg);
            if (xbad) { pfail(&e, msg_param(&e, i, xfield), "%s", xmsg); goto bad; }
            if (x) {
                char **nk = realloc(extras, (n_extras + 1) * sizeof *nk);
                if (!nk) { free(x); ret = send_error(rq, mc, 500, NULL, NULL, "out of memory"); goto out; }
                extras = nk;
                extras[n_extras++] = x;
                msgs[i].extra = x;
                msgs[i].extra_len = strlen(x);
            }
            msgs[i].role = r;
            msgs[i].role_len = strlen(r);
            int rc = msg_content(json_object_get(m, "content"), i, &parts, &msgs[i].content, &msgs[i].content_len, &e);
            if (rc < 0) goto bad;
            part_of[i] = rc;
        }
        if (parts.oom) { ret = send_error(rq, mc, 500, NULL, NULL, "out of memory"); goto out; }
        size_t total = 0;
        for (size_t i = 0; i < nm; i++) total += msgs[i].content_len;
        if (total > PROTO_MAX_PROMPT) {
            pfail(&e, "messages", "the messages' contents add up to %zu bytes; aned takes at most %d", total, PROTO_MAX_PROMPT);
            goto bad;
        }
        for (size_t i = 0; i < nm; i++)
            if (part_of[i]) msgs[i].content = parts.p + (uintptr_t)msgs[i].content;
        base.msgs = msgs;
        base.n_msgs = nm;
        const char *tparam = NULL;
        char tmsg[256];
        if (gwt_request(o, &base, &tools_json, &tparam, tmsg, sizeof tmsg) < 0 ||
            gwt_reasoning(o, &base, &tparam, tmsg, sizeof tmsg) < 0 ||
            gwt_template_vars(o, &base, &tvars_json, &tparam, tmsg, sizeof tmsg) < 0) {
            pfail(&e, tparam, "%s", tmsg);
            goto bad;
        }
    } else {
        json_t *p = json_object_get(o, "prompt");
        if (!present(p)) { pfail(&e, "prompt", "\"prompt\" is required"); goto bad; }
        /* A string, an array of strings, an array of token ids, or an array of those. */
        if (json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0))) {
            n_prompts = (int)json_array_size(p);
            if (n_prompts > GW_MAX_CHOICES) { pfail(&e, "prompt", "at most %d prompts", GW_MAX_CHOICES); goto bad; }
            for (int i = 0; i < n_prompts; i++) prompts[i] = json_array_get(p, (size_t)i);
        } else prompts[0] = p;
        if (get_bool(o, "echo", 0, &rq->echo, &e) < 0) goto bad;
        if (present(json_object_get(o, "suffix"))) { unsupported(&e, "suffix", NULL); goto bad; }
        long long bo;
        if (get_int(o, "best_of", 1, GW_MAX_CHOICES, &has, &bo, &e) < 0) goto bad;
        if (has && bo != 1 && bo != n) { unsupported(&e, "best_of", "only best_of = n"); goto bad; }
    }
    if (n_prompts * n > GW_MAX_CHOICES) {
        pfail(&e, "n", "%d prompts × n = %d choices; at most %d", n_prompts, n_prompts * n, GW_MAX_CHOICES);
        goto bad;
    }

    /* One job per (prompt, n). */
    int32_t *tok_bufs[GW_MAX_CHOICES] = {0};
    rq->n_jobs = n_prompts * n;
    for (int p = 0; p < n_prompts; p++) {
        proto_req q = base;
        if (!rq->chat) {
            json_t *pr = prompts[p];
            q.raw = 1;
            if (json_is_string(pr)) {
                q.text = json_string_value(pr);
                q.text_len = json_string_length(pr);
                if (q.text_len > PROTO_MAX_PROMPT) {
                    pfail(&e, "prompt", "prompt %d is %zu bytes; aned takes at most %d", p, q.text_len, PROTO_MAX_PROMPT);
                    goto bad_toks;
                }
            } else if (json_is_array(pr) && json_array_size(pr) > 0) {
                size_t nt = json_array_size(pr);
                if (nt > PROTO_MAX_TOKENS) { pfail(&e, "prompt", "prompt %d has %zu tokens; at most %d", p, nt, PROTO_MAX_TOKENS); goto bad_toks; }
                tok_bufs[p] = malloc(nt * sizeof *tok_bufs[p]);
                if (!tok_bufs[p]) { pfail(&e, "prompt", "out of memory"); e.status = 500; goto bad_toks; }
                for (size_t i = 0; i < nt; i++) {
                    json_t *t = json_array_get(pr, i);
                    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
                        pfail(&e, "prompt", "prompt %d: token %zu is not a token id", p, i);
                        goto bad_toks;
                    }
                    tok_bufs[p][i] = (int32_t)json_integer_value(t);
                }
                q.tokens = tok_bufs[p];
                q.n_tokens = nt;
            } else {
                pfail(&e, "prompt", "\"prompt\" must be a string, an array of strings or of token ids");
                goto bad_toks;
            }
            /* echo with logprobs, of ids, or of the prompt alone: the prompt's tokens come as events */
            if (rq->echo && (q.logprobs || q.tokens || q.prompt_only)) q.echo = 1;
            json_t *ps = json_object_get(o, "parse_special");
            if (present(ps)) { int v; if (get_bool(o, "parse_special", 0, &v, &e) < 0) goto bad_toks; q.special = v; }
        }
        for (int k = 0; k < n; k++) {
            int idx = p * n + k;
            qs[idx] = q;
            if (q.has_seed) qs[idx].seed = q.seed + (uint64_t)k;
            rq->jobs[idx].index = idx;
            rq->jobs[idx].prompt_no = p;
            if (rq->echo && q.text) sb_add(&rq->jobs[idx].text, q.text, q.text_len);
            rq->jobs[idx].echo_ids = rq->echo && !q.text;
            rq->jobs[idx].echo_wait = q.echo && rq->stream;
            if (q.logprobs) lp_start(&rq->jobs[idx], rq->echo ? q.text : NULL, q.text_len);
        }
    }
    /* What cannot be sent is the request's fault, said here, not a daemon failure. */
    for (int p = 0; p < n_prompts; p++) {
        proto_buf probe = {0};
        int enc = proto_req_encode(&probe, &qs[p * n]);
        proto_buf_free(&probe);
        if (enc < 0) {
            pfail(&e, rq->chat ? "messages" : "prompt", "the request for %s %d does not fit aned's %u-byte message "
                  "limit once encoded; shorten it", rq->chat ? "the messages" : "prompt", p, PROTO_MAX_FRAME);
            e.code = "request_too_large";
            goto bad_toks;
        }
    }
    make_id(rq->id, sizeof rq->id, rq->chat ? "chatcmpl-" : "cmpl-");
    rq->created = now_s();
    if (submit_jobs(rq, qs, err, sizeof err) < 0) {
        ret = send_error(rq, mc, 503, "daemon_unavailable", NULL, "aned is not reachable: %s", err);
        goto out_toks;
    }
    {
        const char *name = ane_model_name(rq->conn->ane);
        json_t *js = json_string(name);
        rq->model_json = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        json_decref(js);
        if (!rq->model_json) rq->model_json = strdup("\"\"");
    }
    ret = respond_generation(rq, mc);
    goto out_toks;
bad_toks:
    ret = send_error(rq, mc, e.status, e.code, e.param, "%s", e.msg);
out_toks:
    for (int i = 0; i < GW_MAX_CHOICES; i++) free(tok_bufs[i]);
    goto out;
bad:
    ret = send_error(rq, mc, e.status, e.code, e.param, "%s", e.msg);
out:
    free(msgs);
    free(part_of);
    for (size_t i = 0; i < n_extras; i++) free(extras[i]);
    free(extras);
    free(tools_json);
    free(tvars_json);
    sb_free(&parts);
    return ret;
}

/* ------------------------------------------------------------------ other endpoints */

enum MHD_Result daemon_failed(gw_req *rq, struct MHD_Connection *mc, int rc, const char *err)
{
    if (rc == -2) return MHD_NO;
    return send_error(rq, mc, 503, "daemon_unavailable", NULL, "aned is not reachable: %s", err);
}

enum MHD_Result ev_error(gw_req *rq, struct MHD_Connection *mc, const proto_ev *ev)
{
    job_err je;
    err_from_event(rq->rt, ev, &je);
    return send_error(rq, mc, je.status, je.code, je.param, "%s", je.msg);
}

static enum MHD_Result handle_health(gw_req *rq, struct MHD_Connection *mc)
{
    proto_ev ev;
    char err[256];
    int rc = ask_daemon(rq, PROTO_T_PING, &ev, err, sizeof err);
    if (rc < 0) {
        if (rc == -2) return MHD_NO;
        return send_json(rq, mc, 503, json_pack("{s:s, s:s}", "status", "unavailable", "error", err));
    }
    return send_json(rq, mc, 200, json_pack("{s:s}", "status", "ok"));
}

static enum MHD_Result handle_models(gw_req *rq, struct MHD_Connection *mc)
{
    proto_ev ev;
    char err[256];
    int rc = ask_daemon(rq, PROTO_T_INFO, &ev, err, sizeof err);
    if (rc < 0) return daemon_failed(rq, mc, rc, err);
    if (ev.type != PROTO_T_INFO_OK) return ev_error(rq, mc, &ev);
    json_t *m = json_pack("{s:s%, s:s, s:I, s:s, s:{s:s%, s:s%, s:s%, s:i, s:i, s:b}}",
                          "id", ev.model, ev.model_len, "object", "model",
                          "created", (json_int_t)(now_s() - (long long)ev.uptime_s), "owned_by", "aned",
                          "meta", "arch", ev.arch, ev.arch_len, "backend", ev.backend, ev.backend_len,
                          "chat_template", ev.chat_template, ev.chat_template_len,
                          "n_ctx", (int)ev.n_ctx, "n_vocab", (int)ev.n_vocab, "tokenizer_only", ev.tokenizer_only);
    if (!m) return send_error(rq, mc, 500, NULL, NULL, "cannot describe the model (its name is not UTF-8?)");
    if (rq->rt == R_MODEL) {
        if (strlen(rq->model_id) != ev.model_len || memcmp(rq->model_id, ev.model, ev.model_len) != 0) {
            json_decref(m);
            return send_error(rq, mc, 404, "model_not_found", "model", "the model \"%.200s\" does not exist; aned serves \"%.*s\"",
                              rq->model_id, (int)(ev.model_len > 200 ? 200 : ev.model_len), ev.model);
        }
        return send_json(rq, mc, 200, m);
    }
    return send_json(rq, mc, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

static enum MHD_Result handle_tokenize(gw_req *rq, struct MHD_Connection *mc, json_t *o)
{
    perr e = { 400, NULL, NULL, "", "" };
    proto_req q;
    proto_ev ev;
    char err[256];
    proto_req_init(&q, PROTO_T_TOKENIZE, 0);
    json_t *c = json_object_get(o, "content");
    if (!present(c)) c = json_object_get(o, "text");
    if (!json_is_string(c)) return send_error(rq, mc, 400, "invalid_value", "content", "\"content\" must be a string");
    q.text = json_string_value(c);
    q.text_len = json_string_length(c);
    if (get_bool(o, "add_special", 0, &q.add_bos, &e) < 0 || get_bool(o, "parse_special", 0, &q.special, &e) < 0)
        return send_error(rq, mc, e.status, e.code, e.param, "%s", e.msg);
    int rc = call_daemon(rq, &q, &ev, err, sizeof err);
    if (rc < 0) return daemon_failed(rq, mc, rc, err);
    if (ev.type != PROTO_T_TOKENS) return ev_error(rq, mc, &ev);
    sbuf b = {0};
    sb_puts(&b, "{\"tokens\":[");
    for (size_t i = 0; i < ev.n_tokens; i++) sb_printf(&b, "%s%d", i ? "," : "", (int)ev.tokens[i]);
    sb_puts(&b, "]}");
    return send_sb(rq, mc, &b);
}

static enum MHD_Result handle_detokenize(gw_req *rq, struct MHD_Connection *mc, json_t *o)
{
    proto_req q;
    proto_ev ev;
    char err[256];
    json_t *t = json_object_get(o, "tokens");
    if (!json_is_array(t)) return send_error(rq, mc, 400, "invalid_value", "tokens", "\"tokens\" must be an array of token ids");
    size_t n = json_array_size(t);
    if (n > PROTO_MAX_TOKENS) return send_error(rq, mc, 400, "invalid_value", "tokens", "%zu tokens; at most %d", n, PROTO_MAX_TOKENS);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return send_error(rq, mc, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            free(ids);
            return send_error(rq, mc, 400, "invalid_token", "tokens", "tokens[%zu] is not a token id", i);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    proto_req_init(&q, PROTO_T_DETOKENIZE, 0);
    q.tokens = ids;
    q.n_tokens = n;
    int rc = call_daemon(rq, &q, &ev, err, sizeof err);
    free(ids);
    if (rc < 0) return daemon_failed(rq, mc, rc, err);
    if (ev.type != PROTO_T_TEXT) return ev_error(rq, mc, &ev);
    sbuf b = {0};
    sb_puts(&b, "{\"content\":");
    sb_json_str(&b, ev.text, ev.text_len);
    sb_puts(&b, "}");
    return send_sb(rq, mc, &b);
}

/* ------------------------------------------------------------------ routing and checks */

static route route_of(const char *url, const char **model_id)
{
    *model_id = NULL;
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/health")) return R_HEALTH;
    if (!strcmp(url, "/v1/models") || !strcmp(url, "/models")) return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) { *model_id = url + 11; return R_MODEL; }
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/tokenize") || !strcmp(url, "/v1/tokenize")) return R_TOKENIZE;
    if (!strcmp(url, "/detokenize") || !strcmp(url, "/v1/detokenize")) return R_DETOKENIZE;
    if (!strcmp(url, "/v1/embeddings") || !strcmp(url, "/embeddings")) return R_EMBEDDINGS;
    return R_NONE;
}

/* Host names a loopback address (or one allowed with --allow-host). */
static int host_allowed(const char *host)
{
    if (!G.check_host || !host) return 1;
    char h[256];
    size_t n = strlen(host);
    if (n >= sizeof h) return 0;
    memcpy(h, host, n + 1);
    /* strip :port (not inside [v6]) */
    char *end = h[0] == '[' ? strchr(h, ']') : NULL;
    char *colon = strrchr(end ? end : h, ':');
    if (colon) *colon = 0;
    if (!strcasecmp(h, "localhost") || !strcmp(h, "[::1]") || !strcmp(h, "::1")) return 1;
    if (!strncmp(h, "127.", 4)) {
        unsigned a, b, c, d;
        char x;
        if (sscanf(h, "%u.%u.%u.%u%c", &a, &b, &c, &d, &x) == 4 && b < 256 && c < 256 && d < 256) return 1;
    }
    for (size_t i = 0; i < G.n_hosts; i++) if (!strcasecmp(h, G.hosts[i])) return 1;
    return 0;
}

static int origin_allowed(const char *origin)
{
    for (size_t i = 0; i < G.n_origins; i++) if (!strcmp(origin, G.origins[i])) return 1;
    return 0;
}

static int key_ok(const char *auth)
{
    if (!G.api_key) return 1;
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0) return 0;
    const char *k = auth + 7;
    while (*k == ' ') k++;
    size_t n = strlen(k);
    while (n && (k[n - 1] == ' ' || k[n - 1] == '\t')) n--;
    /* constant time in the key's content */
    unsigned char diff = (unsigned char)(n != G.api_key_len);
    for (size_t i = 0; i < G.api_key_len; i++) diff |= (unsigned char)(G.api_key[i] ^ (i < n ? k[i] : 0));
    return diff == 0;
}

enum MHD_Result gw_on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls; (void)version;
    gw_req *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof *rq);
        if (!rq) return MHD_NO;
        *con_cls = rq;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        rq->conn = ci ? ci->socket_context : NULL;
        rq->mc = mc;
        rq->t0_ns = mono_ns();
        snprintf(rq->method, sizeof rq->method, "%s", method);
        snprintf(rq->path, sizeof rq->path, "%s", url);
        if (!rq->conn) return MHD_NO;
        if (rq->conn->over)
            return send_error(rq, mc, 503, "too_many_connections", NULL,
                              "aned-http serves %u connections at once (--max-connections); try again shortly",
                              G.max_conns);

        const char *origin = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin");
        if (origin && !origin_allowed(origin))
            return send_error(rq, mc, 403, "origin_not_allowed", NULL,
                              "requests from web pages at %.200s are not allowed (see --allow-origin)", origin);
        rq->origin = origin;
        if (!host_allowed(MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Host")))
            return send_error(rq, mc, 403, "host_not_allowed", NULL,
                              "the Host header names no loopback address (see --allow-host)");
        rq->rt = route_of(url, &rq->model_id);
        if (!strcmp(method, "OPTIONS") && origin) {
            /* CORS preflight from an allowed origin. */
            struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
            if (!r) return MHD_NO;
            add_common_headers(rq, r);
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
            rq->status = 204;
            enum MHD_Result ret = MHD_queue_response(mc, 204, r);
            MHD_destroy_response(r);
            return ret;
        }
        if (rq->rt == R_NONE)
            return send_error(rq, mc, 404, "not_found", NULL, "no such endpoint: %.200s %.200s", method, url);
        int get = route_is_get(rq->rt);
        if (strcmp(method, get ? "GET" : "POST") != 0 && !(get && !strcmp(method, "HEAD")))
            return send_error(rq, mc, 405, "method_not_allowed", NULL, "%.200s takes %s, not %.40s",
                              url, get ? "GET" : "POST", method);
        if (rq->rt != R_HEALTH && !key_ok(MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization")))
            return send_error(rq, mc, 401, "invalid_api_key", NULL, "a valid API key is required (Authorization: Bearer KEY)");
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || *end || v > G.max_body)
                return send_error(rq, mc, 413, "body_too_large", NULL, "the request body is over %zu bytes", G.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (rq->body.len + *upload_size > G.max_body) rq->too_large = 1;
        else sb_add(&rq->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->too_large)
        return send_error(rq, mc, 413, "body_too_large", NULL, "the request body is over %zu bytes", G.max_body);
    if (rq->body.oom) return send_error(rq, mc, 500, NULL, NULL, "out of memory");

    switch (rq->rt) {
    case R_HEALTH: return handle_health(rq, mc);
    case R_MODELS: case R_MODEL: return handle_models(rq, mc);
    default: break;
    }
    /* POST endpoints: a JSON object body. */
    if (rq->body.len == 0) return send_error(rq, mc, 400, "invalid_json", NULL, "the request body must be a JSON object");
    if (json_too_deep(rq->body.p, rq->body.len, GW_MAX_JSON_DEPTH))
        return send_error(rq, mc, 400, "invalid_json", NULL, "the JSON nests deeper than %d levels", GW_MAX_JSON_DEPTH);
    json_error_t je;
    json_t *o = json_loadb(rq->body.p, rq->body.len, JSON_ALLOW_NUL, &je);
    if (!o) return send_error(rq, mc, 400, "invalid_json", NULL, "the body is not valid JSON: %s (line %d, column %d)",
                              je.text, je.line, je.column);
    enum MHD_Result ret;
    if (!json_is_object(o)) ret = send_error(rq, mc, 400, "invalid_json", NULL, "the request body must be a JSON object");
    else if (rq->rt == R_TOKENIZE) ret = handle_tokenize(rq, mc, o);
    else if (rq->rt == R_DETOKENIZE) ret = handle_detokenize(rq, mc, o);
    else if (rq->rt == R_EMBEDDINGS) ret = gw_embeddings(rq, mc, o);
    else {
        rq->chat = rq->rt == R_CHAT;
        ret = handle_generation(rq, mc, o);
    }
    json_decref(o);   /* nothing kept for a stream points into it */
    return ret;
}

/* -v: METHOD PATH STATUS MS [tokens] [how it ended], when the request ends
 * (the path cut at 120 bytes; logf_ masks control bytes). */
static void access_log(const gw_req *rq, enum MHD_RequestTerminationCode toe)
{
    char toks[96] = "";
    if (rq->n_jobs) {
        uint64_t pt = 0, ct = 0;
        int seen[GW_MAX_CHOICES] = {0};
        for (int i = 0; i < rq->n_jobs; i++) {
            ct += rq->jobs[i].completion_tokens;
            if (!seen[rq->jobs[i].prompt_no]) { seen[rq->jobs[i].prompt_no] = 1; pt += rq->jobs[i].prompt_tokens; }
        }
        snprintf(toks, sizeof toks, " prompt %" PRIu64 " completion %" PRIu64 " tokens", pt, ct);
    }
    const char *how = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? (rq->stream_failed ? " (stream ended with an error)" : "")
                    : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT ? " (client left)"
                    : toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? " (timed out)" : " (ended early)";
    char st[12] = "-";
    if (rq->status) snprintf(st, sizeof st, "%u", rq->status);
    logf_("%s %.120s %s %.1f ms%s%s", rq->method, rq->path, st, (double)(mono_ns() - rq->t0_ns) / 1e6, toks, how);
}

void gw_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls; (void)mc;
    gw_req *rq = *con_cls;
    if (!rq) return;
    /* A request that ended early (client gone, error) may leave jobs running. */
    if (rq->n_done < rq->n_jobs && rq->conn) conn_drop(rq->conn);
    if (G.verbose) access_log(rq, toe);
    rq_free_jobs(rq);
    sb_free(&rq->body);
    sb_free(&rq->out);
    free(rq->model_json);
    free(rq);
    *con_cls = NULL;
}

void gw_on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        gw_conn *c = calloc(1, sizeof *c);
        if (!c) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        /* Every SSE event is sent when it is made: no Nagle delay. */
        int one = 1;
        if (c->fd >= 0) setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        unsigned n = atomic_load(&n_served);
        do {
            if (n >= G.max_conns) { c->over = 1; break; }
        } while (!atomic_compare_exchange_weak(&n_served, &n, n + 1));
        /* an over connection only gets its 503: it may not linger */
        if (c->over) MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)GW_OVER_TIMEOUT_S);
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        gw_conn *c = *socket_context;
        if (c) {
            if (!c->over) atomic_fetch_sub(&n_served, 1);
            ane_close(c->ane);
            free(c);
        }
        *socket_context = NULL;
    }
}

void gw_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    if (G.verbose) logf_("http: %s", line);
}
