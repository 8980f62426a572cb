/* jobs.c — requests and the engine's events: each decoded request is
 * checked and turned into engine work (or answered at once), and each engine
 * event into the message its client waits for. The loop, connections and
 * back-pressure are server.c's. */
#include "daemon/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- requests */

static uint64_t next_seed(server *s)
{
    /* splitmix64 over a clock-seeded state: distinct seeds per job */
    uint64_t z = (s->seed_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void req_hello(client *cl, const proto_req *r)
{
    server *s = cl->srv;
    if (cl->state != CL_HANDSHAKE) {
        send_error(cl, r->id, r->type, PROTO_E_BAD_REQUEST, "a second hello on this connection");
        return;
    }
    size_t n = r->client_len < sizeof cl->name - 1 ? r->client_len : sizeof cl->name - 1;
    memcpy(cl->name, r->client ? r->client : "", n);
    cl->name[n] = 0;
    if (r->version != PROTO_VERSION) {
        char msg[96];
        snprintf(msg, sizeof msg, "hello: server speaks protocol version %d, client asked for %u",
                 PROTO_VERSION, (unsigned)r->version);
        send_fatal(cl, r->id, PROTO_E_VERSION, msg);
        client_close_soon(cl, "protocol version mismatch");
        return;
    }
    ev_timer_stop(s->loop, &cl->timer);
    cl->state = CL_READY;
    if (s->opt.idle_timeout > 0) {
        ev_timer_set(&cl->idle, s->opt.idle_timeout, 0.);
        ev_timer_start(s->loop, &cl->idle);
    }
    const eng_model_info *mi = eng_model(s->eng);
    proto_ev e;
    proto_ev_init(&e, PROTO_T_HELLO_OK, r->id);
    e.version = PROTO_VERSION;
    e.server = ANED_SERVER_NAME;
    e.server_len = strlen(e.server);
    e.model = mi->name ? mi->name : "";
    e.model_len = strlen(e.model);
    client_send(cl, &e);
}

/* Links a job the engine accepted into the client's and the server's lists. */
static void job_link(server *s, client *cl, job *j, const proto_req *r)
{
    j->req_id = r->id;
    j->type = r->type;
    j->cl = cl;
    j->uid = cl->peer.uid;
    j->cl_next = cl->jobs;
    if (cl->jobs) cl->jobs->cl_prev = j;
    cl->jobs = j;
    cl->n_jobs++;
    j->all_next = s->jobs;
    if (s->jobs) s->jobs->all_prev = j;
    s->jobs = j;
    s->n_jobs++;
    if (!ev_is_active(&s->poll_timer)) ev_timer_again(s->loop, &s->poll_timer);
}

/* Token ids against the vocabulary, named as the decoder names a field
 * (the engine checks them again). 0: all in range. */
static int check_vocab(client *cl, const proto_req *r)
{
    int32_t nv = eng_model(cl->srv->eng)->n_vocab;
    for (size_t i = 0; r->tokens && i < r->n_tokens; i++)
        if (r->tokens[i] >= nv) {
            char msg[128];
            snprintf(msg, sizeof msg, "\"tokens\"[%zu] = %ld is outside the vocabulary (0..%ld)",
                     i, (long)r->tokens[i], (long)nv - 1);
            send_error(cl, r->id, r->type, PROTO_E_INVALID_TOKEN, msg);
            return -1;
        }
    return 0;
}

/* An engine call's failure, answered with its code and message. */
static void send_eng_error(client *cl, const proto_req *r, eng_err code, const char *err)
{
    if (code == ENG_OK) code = ENG_EINTERNAL;
    send_error(cl, r->id, r->type, map_eng_err(code), err[0] ? err : eng_strerror(code));
}

/* 1 (answered busy) when the connection already has its most jobs. */
static int inflight_full(client *cl, const proto_req *r)
{
    if (cl->n_jobs < PROTO_MAX_INFLIGHT) return 0;
    char msg[64];
    snprintf(msg, sizeof msg, "%d requests already in flight on this connection", PROTO_MAX_INFLIGHT);
    send_error(cl, r->id, r->type, PROTO_E_BUSY, msg);
    return 1;
}

static void req_submit(client *cl, const proto_req *r)
{
    server *s = cl->srv;
    if (s->phase != PH_RUN) {
        send_error(cl, r->id, r->type, PROTO_E_SHUTDOWN, "the server is shutting down");
        return;
    }
    if (inflight_full(cl, r)) return;
    uid_use *uu = uid_find(s, cl->peer.uid, 1);
    if (!uu) { send_error(cl, r->id, r->type, PROTO_E_INTERNAL, "out of memory"); return; }
    if (s->opt.max_jobs_per_uid > 0 && uu->jobs >= (uint32_t)s->opt.max_jobs_per_uid) {
        char msg[96];
        snprintf(msg, sizeof msg, "%u requests already in flight or queued for uid %lu",
                 uu->jobs, (unsigned long)cl->peer.uid);
        send_error(cl, r->id, r->type, PROTO_E_BUSY, msg);
        return;
    }
    if (!eng_model(s->eng)->tokenizer_only && check_vocab(cl, r) < 0) return;
    job *j = calloc(1, sizeof *j);
    if (!j) { send_error(cl, r->id, r->type, PROTO_E_INTERNAL, "out of memory"); return; }

    eng_job_desc d;
    memset(&d, 0, sizeof d);
    d.kind = r->type == PROTO_T_EVAL ? ENG_JOB_EVAL : r->type == PROTO_T_EMBED ? ENG_JOB_EMBED : ENG_JOB_GENERATE;
    d.tokens = r->tokens;
    d.n_tokens = r->n_tokens;
    d.text = r->text;
    d.text_len = r->text_len;
    d.system = r->system;
    d.system_len = r->system_len;
    d.msgs = r->msgs;   /* (one type: common/msg.h; eng_submit copies) */
    d.n_msgs = r->n_msgs;
    d.raw = r->raw;
    d.parse_special = r->special;
    d.max_tokens = r->max_tokens;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = r->temperature;
    d.sampling.top_k = r->top_k;
    d.sampling.top_p = r->top_p;
    d.sampling.min_p = r->min_p;
    d.sampling.repeat_penalty = r->repeat_penalty;
    d.sampling.repeat_last_n = r->repeat_last_n;
    d.sampling.seed = r->has_seed ? r->seed : next_seed(s);
    d.stop = r->stop;
    d.stop_len = r->stop_len;
    d.n_stop = r->n_stop;
    d.top_n = r->top;
    /* tools: "none" withholds them from the template and parses nothing */
    if (r->tools && r->tool_choice != PROTO_TOOLS_NONE) {
        d.tools = r->tools;
        d.tools_len = r->tools_len;
        d.parse_tools = 1;
        d.max_tool_calls = r->parallel_tool_calls ? 0 : 1;
        /* "required" and a named function: the reply is calls, by a grammar */
        d.force_tools = r->tool_choice == PROTO_TOOLS_REQUIRED || r->tool_choice == PROTO_TOOLS_NAMED;
        if (r->tool_choice == PROTO_TOOLS_NAMED) { d.tool_name = r->tool_name; d.tool_name_len = r->tool_name_len; }
    }
    d.grammar = r->grammar;
    d.grammar_len = r->grammar_len;
    d.json_schema = r->json_schema;
    d.json_schema_len = r->json_schema_len;
    d.json_object = r->json_object;
    d.regex = r->regex;
    d.regex_len = r->regex_len;
    d.choice = r->choice;
    d.choice_len = r->choice_len;
    d.n_choice = r->n_choice;
    d.logprobs = r->logprobs;
    d.top_logprobs = r->top_logprobs;
    d.echo = r->echo;
    d.prompt_only = r->prompt_only;
    d.reasoning = r->reasoning == PROTO_REASONING_SPLIT ? ENG_REASONING_SPLIT
                : r->reasoning == PROTO_REASONING_RAW ? ENG_REASONING_RAW : ENG_REASONING_AUTO;
    d.keep_reasoning = r->keep_reasoning;
    d.template_vars = r->template_vars;
    d.template_vars_len = r->template_vars_len;
    d.owner = cl->serial;
    d.uid = (uint32_t)cl->peer.uid;
    d.user = j;

    eng_err code = ENG_OK;
    char err[256] = "";
    int rc = eng_submit(s->eng, &d, &j->eng_id, &code, err, sizeof err);
    if (rc < 0) {
        free(j);
        send_eng_error(cl, r, code, err);
        return;
    }
    job_link(s, cl, j, r);
    uid_find(s, j->uid, 1)->jobs++; /* the entry exists: nothing freed it since */
    if (cl->paused) {
        eng_pause(s->eng, j->eng_id, 1);
        if (!ev_is_active(&cl->timer)) { /* the stall deadline covers it too */
            ev_timer_set(&cl->timer, s->opt.stall_timeout, 0.);
            ev_timer_start(s->loop, &cl->timer);
        }
    }
}

/* Encoded on the engine's tokenizer thread; answered from its event. */
static void req_tokenize(client *cl, const proto_req *r)
{
    server *s = cl->srv;
    if (r->n_tokens || !r->text) {
        send_error(cl, r->id, r->type, PROTO_E_BAD_REQUEST, "tokenize takes text");
        return;
    }
    if (inflight_full(cl, r)) return;
    job *j = calloc(1, sizeof *j);
    if (!j) { send_error(cl, r->id, r->type, PROTO_E_INTERNAL, "out of memory"); return; }
    j->tokenize = 1;
    eng_err code = ENG_OK;
    char err[256] = "";
    if (eng_tokenize_submit(s->eng, r->text, r->text_len, r->add_bos, r->special, (uint32_t)cl->peer.uid,
                            j, &j->eng_id, &code, err, sizeof err) < 0) {
        free(j);
        send_eng_error(cl, r, code, err);
        return;
    }
    job_link(s, cl, j, r);
}

static void req_detokenize(client *cl, const proto_req *r)
{
    server *s = cl->srv;
    if (r->text_len) {
        send_error(cl, r->id, r->type, PROTO_E_BAD_REQUEST, "detokenize takes tokens");
        return;
    }
    if (check_vocab(cl, r) < 0) return;
    char *text = NULL;
    size_t len = 0;
    eng_err code = ENG_OK;
    char err[256] = "";
    if (eng_detokenize(s->eng, r->tokens, r->n_tokens, &text, &len, &code, err, sizeof err) < 0) {
        send_eng_error(cl, r, code, err);
        return;
    }
    if (len > PROTO_MAX_REPLY_TEXT) {
        char msg[128];
        snprintf(msg, sizeof msg, "the text is %zu bytes, over the limit of %u one reply may carry",
                 len, (unsigned)PROTO_MAX_REPLY_TEXT);
        free(text);
        send_error(cl, r->id, r->type, PROTO_E_TOO_LARGE, msg);
        return;
    }
    proto_ev e;
    proto_ev_init(&e, PROTO_T_TEXT, r->id);
    e.text = text ? text : "";
    e.text_len = len;
    client_send(cl, &e);
    free(text);
}

static void req_info(client *cl, const proto_req *r)
{
    server *s = cl->srv;
    const eng_model_info *mi = eng_model(s->eng);
    eng_stats st;
    eng_stats_get(s->eng, &st);
    proto_ev e;
    proto_ev_init(&e, PROTO_T_INFO_OK, r->id);
    e.version = PROTO_VERSION;
    e.server = ANED_SERVER_NAME;
    e.server_len = strlen(e.server);
#define STR(f, v) do { e.f = (v) ? (v) : ""; e.f##_len = strlen(e.f); } while (0)
    STR(model, mi->name);
    STR(model_path, mi->path);
    STR(arch, mi->arch);
    STR(backend, mi->backend);
    STR(chat_template, mi->chat_template);
    STR(tool_format, mi->tool_format);
    STR(warning, mi->warning);
#undef STR
    e.n_vocab = mi->n_vocab;
    e.n_ctx = mi->n_ctx;
    e.n_layer = mi->n_layer;
    e.n_embd = mi->n_embd;
    e.tokenizer_only = mi->tokenizer_only;
    e.active = st.active;
    e.queued = st.queued;
    e.clients = s->n_clients;
    e.jobs_done = st.jobs_done;
    e.tokens_served = s->tokens_served;
    e.prompt_tokens_total = st.prompt_tokens;
    e.kv_used = st.kv_used;
    e.kv_total = st.kv_total;
    e.kv_tokens = mi->kv_pool_tokens;
    e.swa_ring = (uint32_t)mi->swa_ring;
    e.weight_bytes = st.weight_bytes ? st.weight_bytes : mi->weight_bytes;
    e.uptime_s = ev_time() - s->started;
    e.idle_timeout_s = s->opt.idle_timeout;
    e.max_clients_per_uid = (uint32_t)s->opt.max_clients_per_uid;
    e.deterministic = mi->deterministic;
    e.cuda_f16_cache = mi->cuda_f16_cache_off ? "off" : "auto";
    e.cpu_repack = mi->cpu_repack_off ? "off" : "auto";
    e.repacked_bytes = mi->repacked_bytes;
    e.kv_type = mi->kv_type;
    e.device = mi->device;
    e.pooling = mi->tokenizer_only ? NULL : mi->pooling;
    e.pooling_source = mi->tokenizer_only ? NULL : mi->pooling_source;
    /* One entry per connection with jobs. A job counts as "active" once its
     * first event arrived, else "queued" (the engine reports no per-job state). */
    proto_client_count *pc = calloc(s->n_clients ? s->n_clients : 1, sizeof *pc);
    if (pc) {
        size_t i = 0;
        for (client *c = s->clients; c && i < s->n_clients; c = c->next) {
            if (!c->n_jobs) continue;
            pc[i].uid = (uint32_t)c->peer.uid;
            pc[i].pid = (uint32_t)c->peer.pid;
            for (job *j = c->jobs; j; j = j->cl_next) {
                if (j->tokenize) continue;
                if (j->started) pc[i].active++;
                else pc[i].queued++;
            }
            i++;
        }
        e.per_client = pc;
        e.n_per_client = i;
    }
    client_send(cl, &e);
    free(pc);
}

void dispatch(client *cl, const proto_req *r)
{
    cl->n_requests++;
    cl->srv->requests_total++;
    cl->last_active = ev_now(cl->srv->loop);
    if (r->type == PROTO_T_HELLO) { req_hello(cl, r); return; }
    if (cl->state == CL_HANDSHAKE) {
        /* dropped; the connection stays and hello may follow (the hello
         * deadline still runs) */
        send_error(cl, r->id, r->type, PROTO_E_HANDSHAKE, "the first request must be hello");
        return;
    }
    if (r->type == PROTO_T_CANCEL) {
        job *j = client_find_job(cl, r->id);
        if (j && !j->tokenize) {   /* a tokenize is answered anyway */
            j->client_cancel = 1;
            job_cancel(cl->srv, j);
        }
        return;
    }
    if (client_find_job(cl, r->id)) {
        send_error(cl, r->id, r->type, PROTO_E_DUPLICATE_ID, "a request with this id is in flight");
        return;
    }
    switch (r->type) {
    case PROTO_T_GENERATE:
    case PROTO_T_EVAL:
    case PROTO_T_EMBED:      req_submit(cl, r); break;
    case PROTO_T_TOKENIZE:   req_tokenize(cl, r); break;
    case PROTO_T_DETOKENIZE: req_detokenize(cl, r); break;
    case PROTO_T_INFO:       req_info(cl, r); break;
    case PROTO_T_PING: {
        proto_ev e;
        proto_ev_init(&e, PROTO_T_PONG, r->id);
        client_send(cl, &e);
        break;
    }
    default:
        send_error(cl, r->id, r->type, PROTO_E_UNKNOWN_TYPE, "not a request type");
        break;
    }
}

/* ---------------------------------------------------------------- engine events */

static void job_end(server *s, job *j)
{
    client *cl = j->cl;
    if (!j->tokenize) uid_release(s, j->uid, 0, 1);
    if (cl) {
        cl->last_active = ev_now(s->loop);
        if (cl->n_jobs == 1 && ev_is_active(&cl->idle)) {   /* idle from now: a whole timeout */
            ev_timer_stop(s->loop, &cl->idle);
            ev_timer_set(&cl->idle, s->opt.idle_timeout, 0.);
            ev_timer_start(s->loop, &cl->idle);
        }
        if (j->cl_prev) j->cl_prev->cl_next = j->cl_next; else cl->jobs = j->cl_next;
        if (j->cl_next) j->cl_next->cl_prev = j->cl_prev;
        cl->n_jobs--;
    }
    if (j->all_prev) j->all_prev->all_next = j->all_next; else s->jobs = j->all_next;
    if (j->all_next) j->all_next->all_prev = j->all_prev;
    s->n_jobs--;
    free(j);
}

/* The events that stream a job's output: each its message, and whether it
 * marks the job as started (for info's active/queued). */
static const struct { proto_type type; uint8_t starts; } streamed[] = {
    [ENG_EV_TOKEN] = { PROTO_T_TOKEN, 1 },         [ENG_EV_PROMPT_TOKEN] = { PROTO_T_PROMPT_TOKEN, 1 },
    [ENG_EV_TOOL_CALL] = { PROTO_T_TOOL_CALL, 0 }, [ENG_EV_LOGITS] = { PROTO_T_LOGITS, 1 },
    [ENG_EV_EMBEDDING] = { PROTO_T_EMBEDDING, 1 },
};

static void stream_event(server *s, job *j, const eng_event *ev)
{
    client *cl = j->cl;
    if (streamed[ev->type].starts) j->started = 1;
    if (!cl || j->overflow) return;
    proto_ev e;
    proto_lp lps[PROTO_MAX_LOGPROBS];
    proto_top top[ENG_MAX_TOP];
    proto_ev_init(&e, streamed[ev->type].type, j->req_id);
    switch (ev->type) {
    case ENG_EV_TOKEN:
        e.token = ev->token;
        e.text = ev->text ? ev->text : "";
        e.text_len = ev->text ? ev->text_len : 0;
        e.reasoning = ev->reasoning;
        e.reasoning_len = ev->reasoning_len;
        ev_put_logprobs(s->eng, ev, ev->has_logprob, &e, lps);
        cl->n_tokens++;
        s->tokens_served++;
        break;
    case ENG_EV_PROMPT_TOKEN:
        e.pos = ev->pos;
        e.token = ev->token;
        ev_put_logprobs(s->eng, ev, 1, &e, lps);
        break;
    case ENG_EV_TOOL_CALL:
        e.call_index = (uint32_t)ev->call_index;
        e.call_name = ev->call_name;
        e.call_name_len = ev->call_name_len;
        e.call_args = ev->call_args;
        e.call_args_len = ev->call_args_len;
        e.call_id = ev->call_id;
        e.call_id_len = ev->call_id_len;
        break;
    case ENG_EV_LOGITS: {
        int32_t n = ev->n_top < 0 ? 0 : ev->n_top > ENG_MAX_TOP ? ENG_MAX_TOP : ev->n_top;
        for (int32_t i = 0; i < n; i++) {
            top[i].id = ev->top_ids[i];
            top[i].logit = ev->top_logits[i];
        }
        e.pos = ev->pos;
        e.top = top;
        e.n_top = (size_t)n;
        break;
    }
    default:   /* ENG_EV_EMBEDDING */
        e.embedding = ev->embd;
        e.n_embedding = ev->embd ? (size_t)ev->n_embd : 0;
        break;
    }
    client_send(cl, &e);
}

void handle_event(server *s, const eng_event *ev)
{
    job *j = ev->user;
    if (!j) { log_error("engine event without a job (job %llu)", (unsigned long long)ev->job_id); return; }
    if ((unsigned)ev->type < sizeof streamed / sizeof streamed[0] && streamed[ev->type].type != PROTO_T_NONE) {
        stream_event(s, j, ev);
        return;
    }
    client *cl = j->cl;
    proto_ev e;
    switch (ev->type) {
    case ENG_EV_TOKENS:
        if (!cl || j->overflow) break;
        if (ev->n_ids > PROTO_MAX_TOKENS) {
            char msg[128];
            snprintf(msg, sizeof msg, "the text gives %zu tokens, over the limit of %d one reply may carry",
                     (size_t)ev->n_ids, PROTO_MAX_TOKENS);
            send_error(cl, j->req_id, j->type, PROTO_E_TOO_LARGE, msg);
            break;
        }
        proto_ev_init(&e, PROTO_T_TOKENS, j->req_id);
        e.tokens = ev->ids;
        e.n_tokens = ev->n_ids;
        client_send(cl, &e);
        break;
    case ENG_EV_DONE:
        if (j->type == PROTO_T_EMBED && !j->started && ev->finish != ENG_FINISH_CANCELLED && cl && !j->overflow) {
            send_error(cl, j->req_id, j->type, PROTO_E_INTERNAL, "out of memory for the vector");
            break;
        }
        if (j->tokenize) {   /* cancelled: overflow, shutdown or a closed connection */
            if (cl) send_error(cl, j->req_id, j->type, j->overflow ? PROTO_E_BUSY : PROTO_E_SHUTDOWN,
                               j->overflow ? "cancelled: the client did not read its output"
                                           : "the server is shutting down");
            break;
        }
        if (!cl)
            log_debug("job %llu of a closed connection ended: %s", (unsigned long long)ev->job_id,
                      eng_finish_str(ev->finish));
        if (cl && j->overflow) {
            send_error(cl, j->req_id, j->type, PROTO_E_BUSY,
                       "cancelled: the client did not read its output (backlog limit or stall timeout)");
        } else if (cl) {
            const char *f = eng_finish_str(ev->finish);
            if (ev->finish == ENG_FINISH_CANCELLED && j->client_cancel)
                LOG_RL(s, j->uid, RL_CANCELLED, LOG_INFO,
                       "client %llu (uid %lu pid %ld%s%s) request %llu cancelled by the client: "
                       "%d prompt + %d generated tokens, %.1f ms", (unsigned long long)cl->serial,
                       (unsigned long)cl->peer.uid, (long)cl->peer.pid, cl->name[0] ? " " : "", cl->name,
                       (unsigned long long)j->req_id, ev->prompt_tokens, ev->completion_tokens,
                       ev->queue_ms + ev->prefill_ms + ev->decode_ms);
            log_debug("client %llu request %llu: %s; %d prompt (%d cached) + %d generated tokens; "
                      "queue %.1f ms, prefill %.1f ms, decode %.1f ms", (unsigned long long)cl->serial,
                      (unsigned long long)j->req_id, f ? f : "?", ev->prompt_tokens, ev->cached_tokens,
                      ev->completion_tokens, ev->queue_ms, ev->prefill_ms, ev->decode_ms);
            proto_ev_init(&e, PROTO_T_DONE, j->req_id);
            e.finish = f ? f : "";
            e.finish_len = strlen(e.finish);
            e.prompt_tokens = (uint32_t)ev->prompt_tokens;
            e.cached_tokens = (uint32_t)ev->cached_tokens;
            e.completion_tokens = (uint32_t)ev->completion_tokens;
            e.queue_ms = ev->queue_ms;
            e.prefill_ms = ev->prefill_ms;
            e.decode_ms = ev->decode_ms;
            client_send(cl, &e);
        }
        break;
    case ENG_EV_ERROR:
        LOG_RL(s, j->uid, RL_FAILED, LOG_INFO, "job %llu (uid %lu) failed: %s: %s", (unsigned long long)ev->job_id,
               (unsigned long)j->uid, eng_strerror(ev->code), ev->message);
        if (cl) send_error(cl, j->req_id, j->type, map_eng_err(ev->code),
                           ev->message[0] ? ev->message : eng_strerror(ev->code));
        break;
    default:
        log_error("unknown engine event type %d", (int)ev->type);
        return;
    }
    job_end(s, j);
    if (cl) client_maybe_finish(cl);
}

