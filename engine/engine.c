/* engine.c — the public engine: jobs, the scheduler and the worker thread.
 *
 * Ownership: the submitting thread checks what is cheap to check (fields,
 * token ids, roles), copies the prompt and queues the job under e->mu. A
 * prompt given as text or messages waits on the pending list until the
 * tokenizer thread has turned it into ids (chat template included), so a
 * huge prompt costs neither the caller's loop nor the worker's steps; what
 * that finds wrong (invalid UTF-8, a prompt over the context) ends the job
 * with ENG_EV_ERROR. The worker thread owns every admitted job, the forward
 * pass, the KV pool and the sampler: no locks are held around tensors. Each
 * step the worker
 *   1. retires cancelled and failed jobs and admits ready ones (fair across
 *      owners and uids, while sequence slots and KV pages last);
 *   2. builds one batch: a decode token for every generating sequence, then
 *      prefill chunks from the token budget that is left;
 *   3. runs the forward pass once for the whole batch;
 *   4. samples / reports logits / pools embed jobs' hidden states (embed.c),
 *      turns tokens into whole-UTF-8 text with stop strings held back, and
 *      queues events; notify() wakes the caller.
 * Every event is queued by the worker, but for eng_tokenize_submit's, which
 * the tokenizer thread answers itself. A job's KV pages are returned the
 * moment it ends or is cancelled, and taken back earlier (evict) when a
 * waiting job needs them: from a paused job, or from a running one of a
 * uid or owner holding more than its share (make_room). Such a job keeps
 * its tokens and, once admitted again, computes those whose KV the prefix
 * cache no longer holds without giving their outputs a second time. */
#include "common/sampling.h"
#include "engine/engine_int.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/toolgram.h"

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *const eng_kv_types[] = { "f16", "q8_0", "f32", NULL };

const char *eng_strerror(eng_err c)
{
    switch (c) {
    case ENG_OK: return "ok";
    case ENG_EINVAL: return "invalid value";
    case ENG_ETOKEN: return "token id outside the vocabulary";
    case ENG_ECTX: return "prompt longer than the context";
    case ENG_EBUSY: return "too many jobs queued";
    case ENG_ENOMODEL: return "the model has no weights (tokenizer only)";
    case ENG_EUTF8: return "text is not valid UTF-8";
    case ENG_ENOMEM: return "out of memory";
    case ENG_ESHUTDOWN: return "the engine is shutting down";
    case ENG_EINTERNAL: return "internal error";
    case ENG_EMODEL_CHANGED: return "the model file changed on disk after load; restart aned to load it";
    }
    return "unknown error";
}

const char *eng_finish_str(eng_finish f)
{
    switch (f) {
    case ENG_FINISH_LENGTH: return "length";
    case ENG_FINISH_STOP: return "stop";
    case ENG_FINISH_EOS: return "eos";
    case ENG_FINISH_CANCELLED: return "cancelled";
    case ENG_FINISH_TOOL_CALLS: return "tool_calls";
    }
    return "length";
}

void eng_sampling_default(eng_sampling *s) { *s = (eng_sampling){ SAMPLING_DEFAULTS }; }

/* ---- UTF-8 --------------------------------------------------------------- */

/* Copies whole characters of src[0..n) to dst (invalid bytes → U+FFFD);
 * returns the bytes consumed, leaving an incomplete tail unless flush. dst
 * needs 3*n bytes. */
static size_t utf8_clean(const char *src, size_t n, int flush, char *dst, size_t *dlen)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t i = 0, o = 0;
    while (i < n) {
        int l = utf8_char(src + i, n - i);
        if (l == 0 && !flush) break;
        if (l <= 0) { memcpy(dst + o, "\xEF\xBF\xBD", 3); o += 3; i += 1; continue; }
        memcpy(dst + o, s + i, (size_t)l);
        o += (size_t)l; i += (size_t)l;
    }
    *dlen = o;
    return i;
}

/* ---- events -------------------------------------------------------------- */

eng_event *ev_new(eng_event_type t, job *j)
{
    eng_event *ev = calloc(1, sizeof *ev);
    if (!ev) return NULL;
    ev->type = t;
    ev->job_id = j->id;
    ev->user = j->user;
    return ev;
}

void ev_push(eng *e, eng_event *ev)
{
    if (!ev) return;
    pthread_mutex_lock(&e->ev_mu);
    if (e->ev_tail) e->ev_tail->next = ev; else e->ev_head = ev;
    e->ev_tail = ev;
    pthread_mutex_unlock(&e->ev_mu);
}

eng_event *eng_events_take(eng *e)
{
    pthread_mutex_lock(&e->ev_mu);
    eng_event *h = e->ev_head;
    e->ev_head = e->ev_tail = NULL;
    pthread_mutex_unlock(&e->ev_mu);
    return h;
}

void eng_event_free(eng_event *ev)
{
    if (!ev) return;
    free(ev->text); free(ev->reasoning);
    free(ev->ids);
    free(ev->top_ids); free(ev->top_logits);
    free(ev->embd);
    free(ev->lp_ids); free(ev->lp_vals);
    free(ev->call_name); free(ev->call_args); free(ev->call_id);
    free(ev);
}

void notify(eng *e)
{
    if (e->opt.notify) e->opt.notify(e->opt.notify_arg);
}

/* ---- jobs ---------------------------------------------------------------- */

/* The submitted prompt's copies, once encoded. */
static void job_prompt_free(job *j)
{
    free(j->text); j->text = NULL;
    free(j->system); j->system = NULL;
    free(j->msgs); j->msgs = NULL;
    free(j->msg_buf); j->msg_buf = NULL;
    free(j->tools); j->tools = NULL;
    free(j->tvars); j->tvars = NULL;
    j->n_msgs = 0;
}

void job_free(job *j)
{
    if (!j) return;
    job_prompt_free(j);
    free(j->toks);
    free(j->emb_acc);
    for (size_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->stop); free(j->stop_len);
    free(j->hold);
    tc_free(j->tc);
    free(j->tc_text); free(j->tc_reason);
    for (eng_event *ev = j->tc_calls; ev;) { eng_event *n = ev->next; eng_event_free(ev); ev = n; }
    free(j->pages);
    gram_match_free(j->gm);
    gram_free(j->gram);
    free(j->tool_name);
    free(j);
}

void pages_release(eng *e, job *j)
{
    if (j->state == JOB_ACTIVE) e->slot_used[j->slot] = 0;
    if (j->state == JOB_ACTIVE && j->snap >= 0) snapc_release(e->snaps, j->snap);
    if (j->state == JOB_ACTIVE && j->snap2 >= 0) snapc_release(e->snaps, j->snap2);
    kvc_release(e->kv, j->pages, j->n_pages);
    j->n_pages = 0;
}

/* Offers every page the job has filled for prefix reuse. */
void pages_publish(eng *e, job *j)
{
    int full = j->n_past / KV_PAGE;
    while (j->n_published < full) kvc_publish(e->kv, j->pages, j->n_published++, j->toks);
    /* recurrent models: the state at each page boundary, for a later prompt
     * that reuses these pages */
    int s = j->n_past <= (j->n_prompt - 1) / KV_PAGE * KV_PAGE ? j->snap : j->snap2;
    if (s >= 0 && j->n_past > 0 && j->n_past % KV_PAGE == 0 && j->n_past > snapc_len(e->snaps, s)) {
        fw_snap_save(e->fw, j->slot, s);
        snapc_set(e->snaps, s, j->toks, j->n_past);
    }
}

void job_finish(eng *e, job *j, eng_finish f)
{
    j->t_end = now_ms();
    eng_event *ev = ev_new(ENG_EV_DONE, j);
    if (ev) {
        ev->finish = f;
        ev->prompt_tokens = j->n_prompt;
        ev->cached_tokens = j->n_cached;
        ev->completion_tokens = j->n_gen;
        ev->queue_ms = (j->t_admit ? j->t_admit : j->t_end) - j->t_submit;
        if (j->t_admit) {
            double first = j->t_first ? j->t_first : j->t_end;
            ev->prefill_ms = first - j->t_admit;
            ev->decode_ms = j->t_first ? j->t_end - j->t_first : 0;
        }
    }
    ev_push(e, ev);
}

/* Text for a newly generated token: appended to the hold buffer; returns in
 * *out the bytes that are safe to send (whole characters, no possible stop
 * prefix). Sets *stopped when a stop string matched (text before it sent). */
char *job_text(job *j, const char *piece, size_t plen, int final, int *stopped, size_t *out_len)
{
    *stopped = 0;
    *out_len = 0;
    if (j->hold_len + plen > j->hold_cap) {
        size_t nc = (j->hold_len + plen) * 2 + 64;
        char *nh = realloc(j->hold, nc);
        if (!nh) return NULL;
        j->hold = nh; j->hold_cap = nc;
    }
    if (plen) memcpy(j->hold + j->hold_len, piece, plen);   /* hold may still be NULL */
    j->hold_len += plen;

    size_t send = j->hold_len;
    /* earliest stop match */
    size_t best = (size_t)-1;
    for (size_t i = 0; i < j->n_stop; i++) {
        size_t sl = j->stop_len[i];
        if (sl == 0 || sl > j->hold_len) continue;
        for (size_t p = 0; p + sl <= j->hold_len && p < best; p++)
            if (!memcmp(j->hold + p, j->stop[i], sl)) { best = p; break; }
    }
    if (best != (size_t)-1) {
        send = best;
        *stopped = 1;
        final = 1;
    } else if (!final) {
        /* hold back the longest tail that could begin a stop string */
        for (size_t i = 0; i < j->n_stop; i++) {
            size_t sl = j->stop_len[i];
            if (sl == 0) continue;   /* sl - 1 would wrap: an empty stop never matches */
            for (size_t k = sl - 1; k > 0; k--) {
                if (k > j->hold_len) continue;
                if (!memcmp(j->hold + j->hold_len - k, j->stop[i], k)) {
                    if (j->hold_len - k < send) send = j->hold_len - k;
                    break;
                }
            }
        }
    }
    char *out = malloc(send * 3 + 1);
    if (!out) return NULL;
    size_t used = utf8_clean(j->hold, send, final, out, out_len);
    if (used) memmove(j->hold, j->hold + used, j->hold_len - used);   /* hold may still be NULL */
    j->hold_len -= used;
    if (*stopped) j->hold_len = 0;
    out[*out_len] = 0;
    return out;
}

/* ---- tool calls ---------------------------------------------------------- */

static int buf_add(char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *nb = realloc(*b, nc);
        if (!nb) return -1;
        *b = nb;
        *cap = nc;
    }
    if (n) memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

static void tc_on_content(void *ctx, const char *s, size_t n)
{
    job *j = ctx;
    if (buf_add(&j->tc_text, &j->tc_text_len, &j->tc_text_cap, s, n)) j->tc_failed = 1;
}

static void tc_on_reasoning(void *ctx, const char *s, size_t n)
{
    job *j = ctx;
    /* raw with tools: Harmony's analysis channel is content like the rest */
    if (!j->split) { tc_on_content(ctx, s, n); return; }
    if (buf_add(&j->tc_reason, &j->tc_reason_len, &j->tc_reason_cap, s, n)) j->tc_failed = 1;
}

static char *dupn(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) { if (n) memcpy(d, s, n); d[n] = 0; }
    return d;
}

static void tc_on_call(void *ctx, const tc_call *c)
{
    job *j = ctx;
    eng_event *ev = ev_new(ENG_EV_TOOL_CALL, j);
    if (!ev) { j->tc_failed = 1; return; }
    ev->call_name = dupn(c->name, c->name_len);
    ev->call_args = dupn(c->arguments, c->arguments_len);
    ev->call_id = dupn(c->id, c->id_len);
    if (!ev->call_name || !ev->call_args || !ev->call_id) { eng_event_free(ev); j->tc_failed = 1; return; }
    ev->call_name_len = c->name_len;
    ev->call_args_len = c->arguments_len;
    ev->call_id_len = c->id_len;
    ev->call_index = j->n_calls++;
    if (!j->tc_calls_tail) j->tc_calls_tail = &j->tc_calls;
    *j->tc_calls_tail = ev;
    j->tc_calls_tail = &ev->next;
}

int job_tools(job *j, const char *text, size_t len, int final, char **content, size_t *content_len)
{
    tc_callbacks cb = { tc_on_content, tc_on_reasoning, tc_on_call, j };
    j->tc_text_len = 0;
    if (j->tc_text) j->tc_text[0] = 0;
    if (len && tc_feed(j->tc, text, len, &cb)) j->tc_failed = 1;
    if (final && tc_finish(j->tc, &cb)) j->tc_failed = 1;
    *content = dupn(j->tc_text ? j->tc_text : "", j->tc_text_len);
    *content_len = j->tc_text_len;
    return *content && !j->tc_failed ? 0 : -1;
}

/* ---- submit / cancel ----------------------------------------------------- */

static int fail(eng_err *code, eng_err c, char *err, size_t errlen, const char *msg)
{
    if (code) *code = c;
    snprintf(err, errlen, "%s", msg ? msg : eng_strerror(c));
    return -1;
}

/* What a job that model_gone() ends is told. */
void gone_msg(const eng *e, char *msg, size_t n)
{
    snprintf(msg, n, "model file %.80s changed on disk after load; restart aned to load it", e->m->path);
}

void eng_log(eng *e, int warn, const char *line)
{
    if (e->opt.log) e->opt.log(e->opt.log_arg, warn, line);
    else fprintf(stderr, "aned: %s: %s\n", warn ? "warning" : "error", line);
}

/* The model's files against what was loaded (model_check), at submit and
 * (quick) after every forward pass. Once the weights in use are not what
 * was loaded every job ends with ENG_EMODEL_CHANGED and new ones are
 * refused (ping, info, tokenize go on); a change that leaves them intact is
 * only logged. Logged once either way. Any thread, not under mu. */
int model_gone(eng *e, int quick)
{
    if (atomic_load(&e->model_gone)) return 1;
    char why[400], line[480];
    int rc = model_check(e->m, quick, why, sizeof why);
    if (rc == MODEL_SAME) return 0;
    if (rc == MODEL_DETACHED) {
        if (!atomic_exchange(&e->model_noted, 1)) {
            snprintf(line, sizeof line, "%s; restart aned to load the file now there", why);
            eng_log(e, 1, line);
        }
        return 0;
    }
    if (!atomic_exchange(&e->model_gone, 1)) {
        snprintf(line, sizeof line, "%s; restart aned to load it (until then requests fail with model_changed)", why);
        eng_log(e, 0, line);
        /* the worker ends the other jobs now, paused or queued ones too */
        pthread_mutex_lock(&e->mu);
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
    return 1;
}

/* A tokenizer failure as an engine error: a regex limit is the text's fault
 * (invalid_value), not a UTF-8 error. */
static eng_err tok_err(int rc)
{
    return rc == TOK_EUTF8 ? ENG_EUTF8 : rc == TOK_ELIMIT || rc == CHAT_ERENDER || rc == CHAT_EINPUT ? ENG_EINVAL
         : rc == TOK_ENOMEM ? ENG_ENOMEM : ENG_EINTERNAL;
}

static int valid_sampling(const eng_sampling *s, char *err, size_t errlen)
{
    const char *bad = NULL;
    if (!isfinite(s->temperature) || s->temperature < 0 || s->temperature > 100) bad = "temperature must be in [0, 100]";
    else if (s->top_k < 0) bad = "top_k must be >= 0";
    else if (!isfinite(s->top_p) || s->top_p < 0 || s->top_p > 1) bad = "top_p must be in [0, 1]";
    else if (!isfinite(s->min_p) || s->min_p < 0 || s->min_p > 1) bad = "min_p must be in [0, 1]";
    else if (!isfinite(s->repeat_penalty) || s->repeat_penalty <= 0 || s->repeat_penalty > 100)
        bad = "repeat_penalty must be in (0, 100]";
    else if (s->repeat_last_n < -1) bad = "repeat_last_n must be >= -1";
    if (!bad) return 0;
    snprintf(err, errlen, "%s", bad);
    return -1;
}

/* Every id in range of the vocabulary, else ENG_ETOKEN naming the first bad one. */
static int check_ids(const tok *t, const int32_t *ids, size_t n, eng_err *code, char *err, size_t errlen)
{
    int32_t nv = tok_n_vocab(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv) {
            char msg[96];
            snprintf(msg, sizeof msg, "token id %d at position %zu is outside the vocabulary (0..%d)",
                     (int)ids[i], i, nv - 1);
            return fail(code, ENG_ETOKEN, err, errlen, msg);
        }
    return 0;
}

/* The prompt's ids for a text or messages job, from the job's copies (any
 * thread: reads only the job and the immutable tokenizer). */
static int job_encode(const eng *e, const job *j, int32_t **ids, size_t *n,
                      eng_err *code, char *err, size_t errlen)
{
    const tok *t = e->m->tok;
    char terr[160];
    int rc;
    *ids = NULL;
    *n = 0;
    if (j->n_msgs > 0) {
        rc = chat_encode(t, e->chat, j->msgs, j->n_msgs, j->tools, j->tools_len, j->tvars, j->tvars_len, 1, ids, n,
                         terr, sizeof terr);
    } else if (!j->raw && e->chat) {
        chat_msg msgs[2];
        size_t nm = 0;
        if (j->system_len) msgs[nm++] = (chat_msg){ "system", j->system, j->system_len, NULL, 0, 0 };
        msgs[nm++] = (chat_msg){ "user", j->text ? j->text : "", j->text_len, NULL, 0, 0 };
        rc = chat_encode(t, e->chat, msgs, nm, NULL, 0, j->tvars, j->tvars_len, 1, ids, n, terr, sizeof terr);
    } else {
        rc = tok_encode(t, j->text ? j->text : "", j->text_len, j->parse_special, ids, n, terr, sizeof terr);
        if (rc == 0 && tok_add_bos(t) && tok_bos(t) >= 0) {
            int32_t *nb = realloc(*ids, (*n + 1) * sizeof **ids);
            if (!nb) {
                rc = -1;
                snprintf(terr, sizeof terr, "out of memory");
            } else {
                *ids = nb;
                memmove(nb + 1, nb, *n * sizeof *nb);
                nb[0] = tok_bos(t);
                (*n)++;
            }
        }
    }
    if (rc) { free(*ids); *ids = NULL; *n = 0; return fail(code, tok_err(rc), err, errlen, terr); }
    return 0;
}

/* Takes ids (n of them, ownership passes) as the job's prompt: context and
 * KV-budget checks, generation room, token and page buffers. */
static int job_tool_grammar(eng *e, job *j, tc_format f, eng_err *code, char *err, size_t errlen);

static int job_set_prompt(eng *e, job *j, int32_t *ids, size_t n, eng_err *code, char *err, size_t errlen)
{
    const tok *t = e->m->tok;
    if (n == 0) {
        free(ids);
        if (tok_bos(t) < 0) return fail(code, ENG_EINVAL, err, errlen, "empty prompt");
        ids = malloc(sizeof *ids);
        if (!ids) return fail(code, ENG_ENOMEM, err, errlen, NULL);
        ids[0] = tok_bos(t);
        n = 1;
    }
    /* eval scores every position and generates nothing: n_ctx tokens fit;
     * generate needs room for at least one more */
    int scores = j->kind != ENG_JOB_GENERATE || j->prompt_only;
    if (n > (size_t)e->n_ctx || (!scores && n == (size_t)e->n_ctx)) {
        char msg[160];
        if (scores)
            snprintf(msg, sizeof msg, "prompt of %zu tokens does not fit the context of %d", n, e->n_ctx);
        else
            snprintf(msg, sizeof msg, "prompt of %zu tokens does not fit the context of %d"
                     " (a generate's prompt leaves room for one token: at most %d)", n, e->n_ctx, e->n_ctx - 1);
        free(ids);
        return fail(code, ENG_ECTX, err, errlen, msg);
    }
    int room = e->n_ctx - (int)n;
    j->max_gen = scores ? 0 : (j->max_tokens == 0 || j->max_tokens > room ? room : j->max_tokens);
    int need = ((int)n + j->max_gen + KV_PAGE - 1) / KV_PAGE;
    if (need > e->n_pages_total) {
        free(ids);
        return fail(code, ENG_ECTX, err, errlen, "prompt and max_tokens exceed the KV cache budget");
    }
    j->cap = (int)n + j->max_gen + 1;
    j->toks = realloc(ids, (size_t)j->cap * sizeof *ids);
    if (!j->toks) { free(ids); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
    j->n_prompt = j->n_tok = (int)n;
    j->pages = malloc((size_t)need * sizeof *j->pages);
    if (!j->pages) return fail(code, ENG_ENOMEM, err, errlen, NULL);
    int harmony = (e->tc_fmt & TC_SYNTAX_MASK) == TC_HARMONY;
    if (j->parse_tools || (j->split && ((e->tc_fmt & TC_THINK) || harmony))) {
        tc_format f = e->tc_fmt;
        if (f & TC_THINK) {
            /* whether the prompt leaves a reasoning block open: its tail suffices */
            size_t from = n > 64 ? n - 64 : 0;
            char *tail = NULL;
            size_t tl = 0;
            if (tok_decode(t, j->toks + from, n - from, &tail, &tl) == 0) f = tc_after_prompt(f, tail, tl);
            free(tail);
        }
        /* a forced call after an open reasoning block closes it first */
        if (j->force_tools && (f & TC_THINK_OPEN) && job_tool_grammar(e, j, f, code, err, errlen)) return -1;
        /* without tools the parser looks for reasoning alone; raw with tools
         * leaves reasoning blocks in the content, tags and all */
        if (!j->parse_tools) f |= TC_NO_CALLS;
        else if (!j->split) f &= ~(TC_THINK | TC_THINK_OPEN);
        j->tc_ctl = j->parse_tools || harmony;
        j->tc = tc_new(f);
        if (!j->tc) return fail(code, ENG_ENOMEM, err, errlen, NULL);
        tc_seed(j->tc, j->s.seed);
    }
    return 0;
}

/* Copies a text or messages prompt into the job (roles checked here: cheap,
 * and the caller hears of a bad one at once). */
static int job_copy_prompt(eng *e, job *j, const eng_job_desc *d, eng_err *code, char *err, size_t errlen)
{
    j->raw = d->raw;
    j->parse_special = d->parse_special;
    if (d->template_vars) {
        if (d->template_vars_len > ((size_t)1 << 20)) return fail(code, ENG_EINVAL, err, errlen, "template_vars too long");
        j->tvars = malloc(d->template_vars_len + 1);
        if (!j->tvars) return fail(code, ENG_ENOMEM, err, errlen, NULL);
        memcpy(j->tvars, d->template_vars, d->template_vars_len);
        j->tvars[d->template_vars_len] = 0;
        j->tvars_len = d->template_vars_len;
    }
    if (d->n_msgs > 0) {
        if (!e->chat) return fail(code, ENG_EINVAL, err, errlen, "the model has no chat template for messages");
        if (d->n_msgs > 4096) return fail(code, ENG_EINVAL, err, errlen, "too many messages");
        size_t total = 0;
        for (size_t i = 0; i < d->n_msgs; i++) {
            const eng_msg *mm = &d->msgs[i];
            size_t cl = mm->content ? mm->content_len : 0, xl = mm->extra ? mm->extra_len : 0;
            if (cl > SIZE_MAX / 4 || xl > SIZE_MAX / 4 || cl + xl > SIZE_MAX - 2 - total)
                return fail(code, ENG_EINVAL, err, errlen, "messages too long");
            total += cl + xl + 2;
        }
        j->msgs = calloc(d->n_msgs, sizeof *j->msgs);
        j->msg_buf = malloc(total);
        if (!j->msgs || !j->msg_buf) return fail(code, ENG_ENOMEM, err, errlen, NULL);
        size_t off = 0;
        for (size_t i = 0; i < d->n_msgs; i++) {
            const eng_msg *mm = &d->msgs[i];
            static const char *const roles[] = { "system", "user", "assistant", "tool" };
            const char *role = NULL;
            for (int r = 0; r < 4 && mm->role; r++)
                if (mm->role_len == strlen(roles[r]) && !memcmp(mm->role, roles[r], mm->role_len)) role = roles[r];
            if (!role) {
                char msg[96];
                snprintf(msg, sizeof msg, "message %zu: role must be system, user, assistant or tool", i);
                return fail(code, ENG_EINVAL, err, errlen, msg);
            }
            size_t cl = mm->content ? mm->content_len : 0, xl = mm->extra ? mm->extra_len : 0;
            if (cl) memcpy(j->msg_buf + off, mm->content, cl);
            j->msg_buf[off + cl] = 0;
            j->msgs[i] = (chat_msg){ role, j->msg_buf + off, cl, NULL, 0, !d->keep_reasoning && !strcmp(role, "assistant") };
            off += cl + 1;
            if (xl) {
                memcpy(j->msg_buf + off, mm->extra, xl);
                j->msg_buf[off + xl] = 0;
                j->msgs[i].extra = j->msg_buf + off;
                j->msgs[i].extra_len = xl;
                off += xl + 1;
            }
        }
        if (d->tools) {
            j->tools = malloc(d->tools_len + 1);
            if (!j->tools) return fail(code, ENG_ENOMEM, err, errlen, NULL);
            memcpy(j->tools, d->tools, d->tools_len);
            j->tools[d->tools_len] = 0;
            j->tools_len = d->tools_len;
        }
        j->n_msgs = d->n_msgs;
        return 0;
    }
    size_t tl = d->text ? d->text_len : 0;
    j->text = malloc(tl + 1);
    if (!j->text) return fail(code, ENG_ENOMEM, err, errlen, NULL);
    if (tl) memcpy(j->text, d->text, tl);
    j->text[tl] = 0;
    j->text_len = tl;
    if (d->system && d->system_len) {
        j->system = malloc(d->system_len + 1);
        if (!j->system) return fail(code, ENG_ENOMEM, err, errlen, NULL);
        memcpy(j->system, d->system, d->system_len);
        j->system[d->system_len] = 0;
        j->system_len = d->system_len;
    }
    return 0;
}

/* Start-time fair queueing across uids for the tokenizer: a job's virtual
 * start is one past its uid's latest waiting job, and never before the
 * current virtual time, so uids take turns however many prompts (or however
 * large ones) one of them piles up; within a uid, submit order. Admission
 * (pick_fair) is unchanged. Under mu. */
static uint64_t pend_vt(const eng *e, uint32_t uid)
{
    uint64_t vt = e->tok_vt;
    if (e->tokenizing && e->tokenizing->uid == uid && e->tokenizing->vt + 1 > vt) vt = e->tokenizing->vt + 1;
    for (const job *q = e->pend_head; q; q = q->next)
        if (q->uid == uid && q->vt + 1 > vt) vt = q->vt + 1;
    return vt;
}

/* j joins the jobs waiting for the tokenizer, at the end, with its fair
 * start, and wakes it. Under mu. */
static void pend_add(eng *e, job *j)
{
    j->state = JOB_PENDING;
    j->vt = pend_vt(e, j->uid);
    if (e->pend_tail) e->pend_tail->next = j; else e->pend_head = j;
    e->pend_tail = j;
    if (j->kind == JOB_TOKENIZE) e->n_tokreq++;
    else e->n_pending++;
    pthread_cond_signal(&e->tok_cv);
}

/* A pending job leaves the tokenizer's count. Under mu. */
void pend_done(eng *e, const job *j)
{
    if (j->kind == JOB_TOKENIZE) e->n_tokreq--;
    else e->n_pending--;
}

/* Inserts a ready job into the queue by id, so that admission's "oldest
 * first" stays submit order whenever tokenization finishes. Under mu. */
void queue_insert(eng *e, job *j)
{
    job *prev = NULL;
    if (e->queue_tail && e->queue_tail->id > j->id)
        for (job *q = e->queue_head; q && q->id < j->id; q = q->next) prev = q;
    else prev = e->queue_tail;
    j->next = prev ? prev->next : e->queue_head;
    if (prev) prev->next = j; else e->queue_head = j;
    if (e->queue_tail == prev) e->queue_tail = j;
    j->state = JOB_QUEUED;
    e->n_queued++;
}

/* The vocabulary trie for grammars: built once, at the first request with
 * one. End-of-generation tokens are left out (the worker allows them where
 * the grammar may end); control tokens are matched as symbols (<[N]>),
 * never as text. */
static gram_vocab *grammar_vocab(eng *e)
{
    pthread_mutex_lock(&e->gv_mu);
    if (!e->gvocab) {
        const tok *t = e->m->tok;
        int32_t n = tok_n_vocab(t);
        const char **p = calloc((size_t)n, sizeof *p);
        size_t *l = calloc((size_t)n, sizeof *l);
        int32_t *sp = calloc((size_t)n, sizeof *sp);
        uint32_t ns = 0;
        if (p && l && sp) {
            for (int32_t i = 0; i < n; i++) {
                if (e->eog[i]) continue;
                if (!tok_is_control(t, i)) p[i] = tok_piece(t, i, &l[i]);
                else sp[ns++] = i;
            }
            e->gvocab = gram_vocab_new(p, l, n);
            if (e->gvocab && gram_vocab_set_special(e->gvocab, sp, ns)) { gram_vocab_free(e->gvocab); e->gvocab = NULL; }
        }
        free(p); free(l); free(sp);
    }
    gram_vocab *v = e->gvocab;
    pthread_mutex_unlock(&e->gv_mu);
    return v;
}

/* A marker of a tool-call syntax as a special token of the vocabulary (a
 * control token that does not end the reply), or -1: matched as text. */
static int32_t special_of(void *ctx, const char *text, size_t len)
{
    eng *e = ctx;
    int32_t id = tok_find(e->m->tok, text, len);
    return id >= 0 && tok_is_control(e->m->tok, id) && !e->eog[id] ? id : -1;
}

/* The grammar of a forced tool call (toolgram.h) in format f, replacing any. */
static int job_tool_grammar(eng *e, job *j, tc_format f, eng_err *code, char *err, size_t errlen)
{
    char *text = toolgram_gbnf(f, chat_source(e->chat), j->tools, j->tools_len, j->tool_name, j->tool_name_len,
                               j->max_calls, special_of, e, err, errlen);
    if (!text) { if (code) *code = ENG_EINVAL; return -1; }
    gram_match_free(j->gm); j->gm = NULL;
    gram_free(j->gram); j->gram = NULL;
    char cerr[256];
    int rc = gram_compile(&j->gram, text, strlen(text), cerr, sizeof cerr);
    free(text);
    if (!rc) rc = gram_match_new(&j->gm, j->gram, cerr, sizeof cerr);
    if (rc) {
        snprintf(err, errlen, "\"tool_choice\": the call grammar does not compile: %s", cerr);
        if (code) *code = ENG_EINVAL;
        return -1;
    }
    if (!grammar_vocab(e)) return fail(code, ENG_ENOMEM, err, errlen, NULL);
    return 0;
}

static int job_set_grammar(eng *e, job *j, const eng_job_desc *d, eng_err *code, char *err, size_t errlen)
{
    int n = (d->grammar != NULL) + (d->json_schema != NULL) + (d->json_object != 0) + (d->regex != NULL) +
            (d->n_choice > 0);
    if (j->force_tools) {
        if (n) return fail(code, ENG_EINVAL, err, errlen, "\"tool_choice\" \"required\" or a named function "
                           "constrains the reply to calls: it excludes grammar, json_schema, json_object (response_format), "
                           "regex and choice");
        return job_tool_grammar(e, j, e->tc_fmt & ~TC_THINK_OPEN, code, err, errlen);
    }
    if (!n) return 0;
    if (n > 1) return fail(code, ENG_EINVAL, err, errlen, "grammar, json_schema, json_object, regex and choice exclude each other");
    char *text = NULL;
    const char *src;
    size_t len;
    if (d->grammar) { src = d->grammar; len = d->grammar_len; }
    else if (d->json_object) { src = jsonschema_object_gbnf(); len = strlen(src); }
    else {
        text = d->regex ? regex_gbnf(d->regex, d->regex_len, err, errlen)
             : d->n_choice ? choice_gbnf(d->choice, d->choice_len, d->n_choice, err, errlen)
             : jsonschema_gbnf(d->json_schema, d->json_schema_len, err, errlen);
        if (!text) { if (code) *code = ENG_EINVAL; return -1; }
        src = text; len = strlen(text);
    }
    int rc = gram_compile(&j->gram, src, len, err, errlen);
    free(text);
    if (rc) { if (code) *code = ENG_EINVAL; return -1; }
    if (gram_match_new(&j->gm, j->gram, err, errlen)) { if (code) *code = ENG_EINVAL; return -1; }
    if (!grammar_vocab(e)) return fail(code, ENG_ENOMEM, err, errlen, NULL);
    return 0;
}

int eng_submit(eng *e, const eng_job_desc *d, uint64_t *job_id, eng_err *code, char *err, size_t errlen)
{
    if (code) *code = ENG_OK;
    if (e->m->tokenizer_only) return fail(code, ENG_ENOMODEL, err, errlen, NULL);
    if (model_gone(e, 0)) { gone_msg(e, err, errlen); if (code) *code = ENG_EMODEL_CHANGED; return -1; }
    if (d->kind != ENG_JOB_GENERATE && d->kind != ENG_JOB_EVAL && d->kind != ENG_JOB_EMBED)
        return fail(code, ENG_EINVAL, err, errlen, "unknown job kind");
    if (d->kind == ENG_JOB_EMBED && (d->n_msgs || d->system))
        return fail(code, ENG_EINVAL, err, errlen, "embed: takes text or tokens, no messages or system");
    if (d->kind == ENG_JOB_GENERATE && valid_sampling(&d->sampling, err, errlen)) {
        if (code) *code = ENG_EINVAL;
        return -1;
    }
    if (d->kind == ENG_JOB_EVAL && (d->top_n < 1 || d->top_n > ENG_MAX_TOP))
        return fail(code, ENG_EINVAL, err, errlen, "top must be in [1, 100]");
    if (d->max_tokens < 0) return fail(code, ENG_EINVAL, err, errlen, "max_tokens must be >= 0");
    if (d->n_stop > ENG_MAX_STOP) return fail(code, ENG_EINVAL, err, errlen, "too many stop strings");
    if (d->top_logprobs < 0 || d->top_logprobs > ENG_MAX_LOGPROBS)
        return fail(code, ENG_EINVAL, err, errlen, "\"logprobs\" must be in [0, 20]");
    if ((d->logprobs || d->echo || d->prompt_only) && d->kind != ENG_JOB_GENERATE)
        return fail(code, ENG_EINVAL, err, errlen, "logprobs and echo go with generate");
    if (d->prompt_only && !d->echo)
        return fail(code, ENG_EINVAL, err, errlen, "\"prompt_only\" needs \"echo\"");
    if (d->reasoning < ENG_REASONING_AUTO || d->reasoning > ENG_REASONING_RAW)
        return fail(code, ENG_EINVAL, err, errlen, "\"reasoning\" must be \"split\" or \"raw\"");

    if (d->system) {
        /* a system message goes where the chat template puts it; never dropped unsaid */
        const char *why = d->n_msgs ? "put it first in \"messages\" as a \"system\" message"
                        : d->n_tokens ? "it does not apply to \"tokens\" (used as given)"
                        : d->raw ? "it needs the chat template, which \"raw\" turns off"
                        : !e->chat ? "it needs a chat template; this model has none" : NULL;
        if (why) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s: \"system\": %s",
                     d->kind == ENG_JOB_EVAL ? "eval" : d->kind == ENG_JOB_EMBED ? "embed" : "generate", why);
            return fail(code, ENG_EINVAL, err, errlen, msg);
        }
    }
    job *j = calloc(1, sizeof *j);
    if (!j) return fail(code, ENG_ENOMEM, err, errlen, NULL);
    j->kind = d->kind;
    j->max_tokens = d->max_tokens;
    if (d->kind == ENG_JOB_EMBED) {
        j->emb_acc = calloc((size_t)e->m->hp.n_embd, sizeof *j->emb_acc);
        if (!j->emb_acc) { job_free(j); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
    }
    j->lp = d->logprobs != 0;
    j->n_lp = j->lp ? d->top_logprobs : 0;
    j->echo = d->echo != 0;
    j->prompt_only = d->prompt_only != 0;
    /* before the prompt is taken (ids are taken at once): it builds the parser */
    j->split = d->kind == ENG_JOB_GENERATE &&
               (d->reasoning == ENG_REASONING_SPLIT ||
                (d->reasoning == ENG_REASONING_AUTO &&
                 (d->parse_tools || (d->n_tokens == 0 && (d->n_msgs > 0 || (!d->raw && e->chat))))));
    int text = d->n_tokens == 0;
    if (!text) {
        /* ids as given: checked and taken now, linear and cheap */
        if (d->n_tokens > (size_t)e->n_ctx) {
            char msg[128];
            snprintf(msg, sizeof msg, "prompt of %zu tokens does not fit the context of %d", d->n_tokens, e->n_ctx);
            job_free(j);
            return fail(code, ENG_ECTX, err, errlen, msg);
        }
        if (check_ids(e->m->tok, d->tokens, d->n_tokens, code, err, errlen)) { job_free(j); return -1; }
        int32_t *ids = malloc(d->n_tokens * sizeof *ids);
        if (!ids) { job_free(j); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
        memcpy(ids, d->tokens, d->n_tokens * sizeof *ids);
        if (job_set_prompt(e, j, ids, d->n_tokens, code, err, errlen)) { job_free(j); return -1; }
    } else if (job_copy_prompt(e, j, d, code, err, errlen)) {
        job_free(j);
        return -1;
    }
    if (d->kind == ENG_JOB_EMBED) j->raw = 1;   /* the text as is: no chat template */
    j->s = d->sampling;
    if (d->parse_tools && d->kind == ENG_JOB_GENERATE && d->n_msgs > 0) {
        j->parse_tools = 1;
        j->max_calls = d->max_tool_calls > 0 ? d->max_tool_calls : 0;
        if (d->force_tools) {
            if (!j->tools) { job_free(j); return fail(code, ENG_EINVAL, err, errlen, "\"tool_choice\" needs \"tools\""); }
            j->force_tools = 1;
            if (d->tool_name) {
                j->tool_name = malloc(d->tool_name_len + 1);
                if (!j->tool_name) { job_free(j); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
                memcpy(j->tool_name, d->tool_name, d->tool_name_len);
                j->tool_name[d->tool_name_len] = 0;
                j->tool_name_len = d->tool_name_len;
            }
        }
    } else if (d->force_tools) {
        job_free(j);
        return fail(code, ENG_EINVAL, err, errlen, "\"tool_choice\" \"required\" or a named function needs messages and tools");
    }
    j->rng = sampler_rng_seed(d->sampling.seed);
    j->top_n = d->top_n;
    j->user = d->user;
    j->owner = d->owner;
    j->uid = d->uid;
    if (d->n_stop) {
        j->stop = calloc(d->n_stop, sizeof *j->stop);
        j->stop_len = calloc(d->n_stop, sizeof *j->stop_len);
        if (!j->stop || !j->stop_len) { job_free(j); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
        for (size_t i = 0; i < d->n_stop; i++) {
            j->stop[i] = malloc(d->stop_len[i] + 1);
            if (!j->stop[i]) { job_free(j); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
            memcpy(j->stop[i], d->stop[i], d->stop_len[i]);
            j->stop_len[i] = d->stop_len[i];
            j->n_stop++;
        }
    }
    if (d->kind == ENG_JOB_GENERATE && job_set_grammar(e, j, d, code, err, errlen)) { job_free(j); return -1; }
    j->t_submit = now_ms();

    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        return fail(code, ENG_ESHUTDOWN, err, errlen, NULL);
    }
    if (e->n_queued + e->n_pending >= e->max_queued) {
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        return fail(code, ENG_EBUSY, err, errlen, NULL);
    }
    j->id = ++e->next_id;
    *job_id = j->id;   /* under mu: once it is unlocked the job may end and be freed */
    if (text) {
        pend_add(e, j);
    } else {
        queue_insert(e, j);
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int eng_tokenize_submit(eng *e, const char *text, size_t len, int add_bos, int parse_special,
                        uint32_t uid, void *user, uint64_t *job_id, eng_err *code, char *err, size_t errlen)
{
    if (code) *code = ENG_OK;
    job *j = calloc(1, sizeof *j);
    if (!j) return fail(code, ENG_ENOMEM, err, errlen, NULL);
    j->kind = JOB_TOKENIZE;
    j->text = malloc(len + 1);
    if (!j->text) { job_free(j); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
    if (len) memcpy(j->text, text, len);
    j->text[len] = 0;
    j->text_len = len;
    j->add_bos = add_bos;
    j->parse_special = parse_special;
    j->uid = uid;
    j->user = user;
    j->t_submit = now_ms();
    pthread_mutex_lock(&e->mu);
    if (e->stop || !e->tokw_started) {
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        return fail(code, ENG_ESHUTDOWN, err, errlen, NULL);
    }
    if (e->n_tokreq >= e->max_queued) {
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        return fail(code, ENG_EBUSY, err, errlen, "too many tokenize requests waiting");
    }
    j->id = ++e->next_id;
    *job_id = j->id;
    pend_add(e, j);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void eng_cancel(eng *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    for (job *j = e->pend_head; j; j = j->next)
        if (j->id == id) atomic_store(&j->cancel, 1);
    if (e->tokenizing && e->tokenizing->id == id) atomic_store(&e->tokenizing->cancel, 1);
    for (job *j = e->queue_head; j; j = j->next)
        if (j->id == id) atomic_store(&j->cancel, 1);
    for (int i = 0; i < e->n_active; i++)
        if (e->active[i]->id == id) atomic_store(&e->active[i]->cancel, 1);
    for (job *j = e->parked; j; j = j->next)
        if (j->id == id) atomic_store(&j->cancel, 1);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void eng_pause(eng *e, uint64_t id, int paused)
{
    pthread_mutex_lock(&e->mu);
    for (job *j = e->pend_head; j; j = j->next)
        if (j->id == id) atomic_store(&j->paused, paused != 0);
    if (e->tokenizing && e->tokenizing->id == id) atomic_store(&e->tokenizing->paused, paused != 0);
    for (job *j = e->queue_head; j; j = j->next)
        if (j->id == id) atomic_store(&j->paused, paused != 0);
    for (int i = 0; i < e->n_active; i++)
        if (e->active[i]->id == id) atomic_store(&e->active[i]->paused, paused != 0);
    for (job *j = e->parked; j; j = j->next)
        if (j->id == id) atomic_store(&j->paused, paused != 0);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* ---- the tokenizer thread ------------------------------------------------ */

/* The pending job to tokenize next: the least virtual start time, oldest
 * first among equals (see pend_vt). Under mu. */
static job *pick_pending(eng *e, job **prev_out)
{
    job *best = NULL, *best_prev = NULL, *prev = NULL;
    for (job *j = e->pend_head; j; prev = j, j = j->next)
        if (!best || j->vt < best->vt) { best = j; best_prev = prev; }
    *prev_out = best_prev;
    return best;
}

/* Encodes pending prompts one at a time, outside every lock, on its own
 * thread rather than between the worker's steps: tok_encode cannot be cut
 * into slices (pre-tokenizer words, NFC and chat segments span any cut), so
 * on the worker a large prompt would stop every stream for its whole
 * encoding; here it stops none. At a lower priority so that on a busy
 * machine the worker's forward passes go first. */
static void *tokw_main(void *arg)
{
    eng *e = arg;
    (void)setpriority(PRIO_PROCESS, 0, TOK_NICE);   /* best effort; 0 is this thread on Linux */
    pthread_mutex_lock(&e->mu);
    e->tokw_ready = 1;   /* eng_open waits for this: no syscall of ours after it returns (seccomp) */
    pthread_cond_broadcast(&e->cv);
    for (;;) {
        while (!e->stop && !e->pend_head) pthread_cond_wait(&e->tok_cv, &e->mu);
        if (e->stop) break;
        job *prev;
        job *j = pick_pending(e, &prev);
        if (prev) prev->next = j->next; else e->pend_head = j->next;
        if (e->pend_tail == j) e->pend_tail = prev;
        j->next = NULL;
        j->state = JOB_TOKENIZING;
        e->tokenizing = j;
        e->tok_vt = j->vt;
        pthread_mutex_unlock(&e->mu);

        int32_t *ids = NULL;
        size_t n = 0;
        eng_err code = ENG_OK;
        char msg[sizeof j->err_msg];
        int rc = 0;
        if (atomic_load(&j->cancel)) {}
        else if (j->kind == JOB_TOKENIZE)
            rc = eng_tokenize(e, j->text, j->text_len, j->add_bos, j->parse_special, &ids, &n, &code, msg, sizeof msg);
        else
            rc = job_encode(e, j, &ids, &n, &code, msg, sizeof msg);

        pthread_mutex_lock(&e->mu);
        e->tokenizing = NULL;
        if (j->reported) {           /* cancelled meanwhile: its DONE is queued */
            free(ids);
            job_free(j);
            continue;
        }
        pend_done(e, j);
        if (j->kind == JOB_TOKENIZE) {
            /* answered from here: no worker step is involved (there may be no worker) */
            eng_event *ev = NULL;
            if (atomic_load(&j->cancel)) {
                job_finish(e, j, ENG_FINISH_CANCELLED);
            } else if (rc == 0 && (ev = ev_new(ENG_EV_TOKENS, j))) {
                ev->ids = ids;
                ev->n_ids = n;
                ids = NULL;
                ev_push(e, ev);
            } else {
                j->err_code = rc ? (code != ENG_OK ? code : ENG_EINTERNAL) : ENG_ENOMEM;
                snprintf(j->err_msg, sizeof j->err_msg, "%s", rc ? msg : eng_strerror(ENG_ENOMEM));
                job_error(e, j);
            }
            free(ids);
            job_free(j);
            notify(e);
            continue;
        }
        /* the rest only allocates; still under mu, as out of every list
         * an eng_cancel could not find the job */
        if (rc == 0 && !atomic_load(&j->cancel)) rc = job_set_prompt(e, j, ids, n, &code, msg, sizeof msg);
        else free(ids);
        if (rc) { j->err_code = code != ENG_OK ? code : ENG_EINTERNAL; memcpy(j->err_msg, msg, sizeof msg); }
        job_prompt_free(j);
        queue_insert(e, j);
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- open / close / info ------------------------------------------------- */

/* The chat template (--chat-template's, else the model's) and the tokens
 * that end generation: the tokenizer's (EOS, EOT, EOM and the known
 * end-of-turn names) and those the template ends an assistant turn with.
 * A model template that does not parse is a warning (prompts then go in
 * as is, messages are refused); a --chat-template that does not parse is
 * an error. */
static int chat_setup(eng *e, char *err, size_t errlen)
{
    const model *m = e->m;
    const tok *t = m->tok;
    eng_model_info *in = &e->info;
    const char *src = e->opt.chat_template ? e->opt.chat_template : tok_chat_template(t);
    size_t len = e->opt.chat_template ? e->opt.chat_template_len : strlen(src);
    in->chat_template = "none";
    in->warning = "";
    if (len) {
        char perr[160];
        e->chat = chat_open(t, src, len, perr, sizeof perr);
        if (!e->chat && e->opt.chat_template) {
            snprintf(err, errlen, "%s: the chat template does not parse: %s",
                     e->opt.chat_template_name ? e->opt.chat_template_name : "--chat-template", perr);
            return -1;
        }
        if (!e->chat) {
            snprintf(e->warning, sizeof e->warning, "the model's chat template does not parse (%.100s): prompts are used raw", perr);
            in->warning = e->warning;
        } else {
            in->chat_template = e->opt.chat_template ? (e->opt.chat_template_name ? e->opt.chat_template_name : "file")
                                                     : tok_chat_template_from(t)[0] ? tok_chat_template_from(t) : "model";
        }
    }
    e->tc_fmt = e->chat ? tc_detect(chat_source(e->chat)) : TC_PLAIN;
    int mi = (e->tc_fmt & TC_SYNTAX_MASK) == TC_MISTRAL;
    e->think_tok[0] = e->think_tok[1] = -1;
    if (e->tc_fmt & TC_THINK) {
        e->think_tok[0] = mi ? tok_find(t, "[THINK]", 7) : tok_find(t, "<think>", 7);
        e->think_tok[1] = mi ? tok_find(t, "[/THINK]", 8) : tok_find(t, "</think>", 8);
    }
    in->tool_format = tc_format_name(e->tc_fmt);
    int32_t nv = tok_n_vocab(t);
    e->eog = calloc((size_t)nv, 1);
    if (!e->eog) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int32_t i = 0; i < nv; i++) e->eog[i] = (uint8_t)tok_is_eog(t, i);
    /* gpt-oss (harmony) closes a message with <|end|> and the reply with
     * <|return|> or <|call|>: <|end|> goes on to the next message */
    int32_t end = tok_find(t, "<|end|>", 7);
    if (end >= 0 && tok_find(t, "<|return|>", 10) >= 0 && tok_find(t, "<|call|>", 8) >= 0) e->eog[end] = 0;
    if (e->chat) {
        int32_t ends[4];
        int k = chat_end_tokens(t, e->chat, ends, 4);
        for (int i = 0; i < k; i++) if (ends[i] >= 0 && ends[i] < nv && ends[i] != tok_bos(t) && (ends[i] != end || e->eog[end])) e->eog[ends[i]] = 1;
    }
    return 0;
}

/* Starts the tokenizer thread and waits until it runs: no syscall of its
 * start-up comes after eng_open returns (the seccomp filter follows). */
static int tokw_start(eng *e, char *err, size_t errlen)
{
    if (pthread_create(&e->tokw, NULL, tokw_main, e) != 0) {
        snprintf(err, errlen, "cannot start the tokenizer thread");
        return -1;
    }
    e->tokw_started = 1;
    pthread_mutex_lock(&e->mu);
    while (!e->tokw_ready) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int eng_open(eng **out, const eng_opts *opt, char *err, size_t errlen)
{
    *out = NULL;
    eng *e = calloc(1, sizeof *e);
    if (!e) { snprintf(err, errlen, "out of memory"); return -1; }
    e->opt = *opt;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->ev_mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->tok_cv, NULL);
    if (model_load(&e->m, opt->model_path, err, errlen)) goto fail;
    model *m = e->m;
    eng_model_info *in = &e->info;
    in->path = m->path;
    in->arch = m->tokenizer_only ? "none" : m->arch_name;
    in->name = m->name;
    in->backend = "cpu";
    in->kv_type = "f16";
    in->device = "";
    in->tokenizer_only = m->tokenizer_only;
    in->n_vocab = tok_n_vocab(m->tok);
    in->bos = tok_bos(m->tok);
    in->eos = tok_eos(m->tok);
    in->eot = tok_eot(m->tok);
    if (chat_setup(e, err, errlen)) goto fail;
    e->max_queued = opt->max_queued > 0 ? opt->max_queued : 256;
    if (m->tokenizer_only) {
        if (tokw_start(e, err, errlen)) goto fail;
        *out = e;
        return 0;
    }
    in->n_ctx_train = m->hp.n_ctx_train;
    in->n_layer = m->hp.n_layer;
    in->n_embd = m->hp.n_embd;
    in->n_head = m->hp.n_head;
    in->n_head_kv = m->hp.n_head_kv;
    in->n_params = m->n_params;
    in->weight_bytes = m->weight_bytes;
    in->active_bytes = m->active_bytes;

    /* the model's trained context unless --ctx; kv_size may lower it to what the KV pool holds */
    e->n_ctx = opt->n_ctx > 0 ? opt->n_ctx : m->hp.n_ctx_train > 0 ? m->hp.n_ctx_train : 4096;
    if (e->n_ctx > 1 << 24) e->n_ctx = 1 << 24;
    if (e->n_ctx < 8) e->n_ctx = 8;
    if (m->pos_embd.data && e->n_ctx > m->hp.n_ctx_train) {   /* learned positions end there */
        snprintf(err, errlen, "%s: a context of %d tokens is past the model's learned positions (%s.context_length "
                 "%d): expected at most that", m->path, e->n_ctx, m->arch_name, m->hp.n_ctx_train);
        goto fail;
    }
    e->max_seqs = opt->max_seqs > 0 ? opt->max_seqs : 16;
    if (e->max_seqs > 256) e->max_seqs = 256;
    in->n_ctx = e->n_ctx;
    in->max_seqs = e->max_seqs;
    in->deterministic = opt->deterministic;
    in->cuda_f16_cache_off = opt->cuda_f16_cache_off;
    in->cpu_repack_off = opt->cpu_repack_off;

    int nth = opt->n_threads > 0 ? opt->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nth < 1) nth = 1;
    if (nth > 256) nth = 256;
    in->n_threads = nth;
    if (pool_open(&e->pool, nth)) { snprintf(err, errlen, "cannot start %d threads", nth); goto fail; }
    int max_out = EVAL_ROWS > e->max_seqs ? EVAL_ROWS : e->max_seqs;
    int max_T = BATCH_TOKENS + e->max_seqs;
    if (eng_place(e, opt, max_T, max_out, err, errlen)) goto fail;
    emb_setup(e);
    if (sampler_open(&e->smp, m->hp.n_vocab)) { snprintf(err, errlen, "out of memory"); goto fail; }
    pthread_mutex_init(&e->gv_mu, NULL);
    e->gmask = malloc(((size_t)m->hp.n_vocab + 31) / 32 * sizeof *e->gmask);
    if (!e->gmask) { snprintf(err, errlen, "out of memory"); goto fail; }
    e->active = calloc((size_t)e->max_seqs, sizeof *e->active);
    e->b_tok = malloc((size_t)max_T * sizeof *e->b_tok);
    e->b_pos = malloc((size_t)max_T * sizeof *e->b_pos);
    e->b_out = malloc((size_t)max_T * sizeof *e->b_out);
    e->b_ids = malloc((size_t)max_T * sizeof *e->b_ids);
    e->b_gfail = calloc((size_t)max_T, 1);
    e->b_gneed = calloc((size_t)max_T, 1);
    e->a_pos = malloc((size_t)max_T * sizeof *e->a_pos);
    e->a_out = malloc((size_t)max_T * sizeof *e->a_out);
    e->a_ids = malloc((size_t)max_T * sizeof *e->a_ids);
    e->a_job = malloc((size_t)max_T * sizeof *e->a_job);
    e->b_pages = malloc((size_t)max_T * sizeof *e->b_pages);
    e->b_job = malloc((size_t)max_T * sizeof *e->b_job);
    e->b_slot = malloc((size_t)max_T * sizeof *e->b_slot);
    e->slot_used = calloc((size_t)e->max_seqs, 1);
    e->b_job_of_out = malloc((size_t)max_T * sizeof *e->b_job_of_out);
    e->b_out_pos = malloc((size_t)max_T * sizeof *e->b_out_pos);
    e->logits = malloc((size_t)max_out * m->hp.n_vocab * sizeof(float));
    e->hidden = malloc((size_t)max_out * m->hp.n_embd * sizeof(float));
    if (kvc_open(&e->kv, e->n_pages_total, KV_PAGE)) { snprintf(err, errlen, "out of memory"); goto fail; }
    if (m->recurrent && fw_snap_count(e->fw) > 0 && snapc_open(&e->snaps, fw_snap_count(e->fw), e->n_ctx)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!e->active || !e->b_tok || !e->b_pos || !e->b_out || !e->b_ids || !e->b_gfail || !e->b_gneed || !e->a_pos || !e->a_out || !e->a_ids ||
        !e->a_job || !e->b_pages || !e->b_job || !e->b_slot || !e->slot_used ||
        !e->b_job_of_out || !e->b_out_pos || !e->logits || !e->hidden) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    e->st.kv_total = fw_kv_bytes(e->fw);
    in->kv_bytes = e->st.kv_total;
    e->st.weight_bytes = m->weight_bytes;
    if (pthread_create(&e->worker, NULL, worker_main, e) != 0) {
        snprintf(err, errlen, "cannot start the worker thread");
        goto fail;
    }
    e->worker_started = 1;
    if (tokw_start(e, err, errlen)) goto fail;
    *out = e;
    return 0;
fail:
    eng_close(e);
    return -1;
}

void eng_close(eng *e)
{
    if (!e) return;
    if (e->worker_started || e->tokw_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_cond_signal(&e->tok_cv);
        pthread_mutex_unlock(&e->mu);
        if (e->worker_started) pthread_join(e->worker, NULL);
        if (e->tokw_started) pthread_join(e->tokw, NULL);   /* ends its current prompt first */
    }
    for (job *j = e->pend_head; j;) { job *n = j->next; job_free(j); j = n; }
    for (job *j = e->queue_head; j;) { job *n = j->next; job_free(j); j = n; }
    for (int i = 0; i < e->n_active; i++) job_free(e->active[i]);
    for (job *j = e->parked; j;) { job *n = j->next; job_free(j); j = n; }
    eng_event *ev = e->ev_head;
    while (ev) { eng_event *n = ev->next; eng_event_free(ev); ev = n; }
    sampler_close(e->smp);
    gram_vocab_free(e->gvocab);
    free(e->gmask); free(e->gm_rows);
    free(e->eog_bits);
    free(e->b_gfail); free(e->b_gneed);
    eng_unplace(e);
    pool_close(e->pool);
    model_free(e->m);
    kvc_close(e->kv);
    snapc_close(e->snaps);
    free(e->active); free(e->b_tok); free(e->b_pos); free(e->b_out);
    free(e->b_pages); free(e->b_job); free(e->b_slot); free(e->slot_used); free(e->b_job_of_out); free(e->b_out_pos); free(e->logits); free(e->hidden); free(e->b_ids);
    free(e->a_pos); free(e->a_out); free(e->a_ids); free(e->a_job);
    chat_free(e->chat);
    free(e->eog);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->ev_mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->tok_cv);
    free(e);
}

const eng_model_info *eng_model(const eng *e) { return &e->info; }

/* The job and KV counts as they are now. Under mu: the worker retires a
 * job (its pages released) in the same hold of mu as its done event, so a
 * reader woken by that event sees the job gone. */
void stats_now(eng *e)
{
    e->st.active = (uint32_t)(e->n_active + e->n_parked);
    e->st.queued = (uint32_t)(e->n_queued + e->n_pending);
    if (e->m->tokenizer_only) return;   /* (no backend, no KV) */
    /* the pages in use, and the rings of the slots in use */
    e->st.kv_used = (size_t)kvc_in_use(e->kv) * fw_kv_page_bytes(e->m, e->be->kv_type) +
                    (size_t)e->n_active * fw_kv_ring_bytes(e->m, e->be->kv_type);
    if (e->st.kv_used > e->st.kv_peak) e->st.kv_peak = e->st.kv_used;
}

void eng_stats_get(eng *e, eng_stats *st)
{
    pthread_mutex_lock(&e->mu);
    stats_now(e);
    *st = e->st;
    pthread_mutex_unlock(&e->mu);
}

int eng_tokenize(eng *e, const char *text, size_t len, int add_bos, int parse_special,
                 int32_t **ids, size_t *n, eng_err *code, char *err, size_t errlen)
{
    const tok *t = e->m->tok;
    int rc = tok_encode(t, text, len, parse_special, ids, n, err, errlen);
    if (rc) {
        if (code) *code = tok_err(rc);
        return -1;
    }
    if (add_bos && tok_add_bos(t) && tok_bos(t) >= 0) {
        int32_t *nb = realloc(*ids, (*n + 1) * sizeof **ids);
        if (!nb) { free(*ids); *ids = NULL; return fail(code, ENG_ENOMEM, err, errlen, NULL); }
        memmove(nb + 1, nb, *n * sizeof *nb);
        nb[0] = tok_bos(t);
        *ids = nb;
        (*n)++;
    }
    if (code) *code = ENG_OK;
    return 0;
}

const char *eng_token_piece(const eng *e, int32_t id, size_t *len)
{
    *len = 0;
    if (!e->m->tok || id < 0 || id >= tok_n_vocab(e->m->tok)) return "";
    return tok_piece(e->m->tok, id, len);
}

int eng_detokenize(eng *e, const int32_t *ids, size_t n, char **text, size_t *len,
                   eng_err *code, char *err, size_t errlen)
{
    const tok *t = e->m->tok;
    if (check_ids(t, ids, n, code, err, errlen)) return -1;
    char *raw;
    size_t rl;
    if (tok_decode(t, ids, n, &raw, &rl)) return fail(code, ENG_ENOMEM, err, errlen, NULL);
    /* the wire carries UTF-8 only: invalid byte sequences become U+FFFD */
    char *clean = malloc(rl * 3 + 1);
    if (!clean) { free(raw); return fail(code, ENG_ENOMEM, err, errlen, NULL); }
    utf8_clean(raw, rl, 1, clean, len);
    clean[*len] = 0;
    free(raw);
    *text = clean;
    if (code) *code = ENG_OK;
    return 0;
}
