/* chat.c — chat prompts: the model's Jinja template rendered with the
 * conversation, then tokenized with special tokens recognised only in the
 * template's own text (message contents are located in the output, in
 * order, and encoded as plain text). */
#include "engine/text/chat.h"
#include "common/chatvars.h"
#include "common/err.h"
#include "engine/text/jinja.h"
#include "engine/text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct chat_tpl {
    jinja_tpl *tpl;
    char *src;
    char *bos, *eos;   /* token texts, "" when none */
};

static char *piece_dup(const struct tok *t, int32_t id)
{
    size_t l = 0;
    const char *p = id >= 0 ? tok_piece(t, id, &l) : "";
    char *s = malloc(l + 1);
    if (s) { memcpy(s, p, l); s[l] = 0; }
    return s;
}

chat_tpl *chat_open(const struct tok *t, const char *src, size_t len, char *err, size_t errlen)
{
    chat_tpl *c = calloc(1, sizeof *c);
    if (!c) { err_set(err, errlen, "out of memory"); return NULL; }
    c->src = malloc(len + 1);
    c->bos = piece_dup(t, tok_bos(t));
    c->eos = piece_dup(t, tok_eos(t));
    if (!c->src || !c->bos || !c->eos) { chat_free(c); err_set(err, errlen, "out of memory"); return NULL; }
    memcpy(c->src, src, len);
    c->src[len] = 0;
    c->tpl = jinja_parse(src, len, err, errlen);
    if (!c->tpl) { chat_free(c); return NULL; }
    return c;
}

void chat_free(chat_tpl *c)
{
    if (!c) return;
    jinja_free(c->tpl);
    free(c->src); free(c->bos); free(c->eos);
    free(c);
}

const char *chat_source(const chat_tpl *c) { return c->src; }

/* Rendering bounds for one request: a prompt is at most about a megabyte,
 * so these leave real templates room many times over while keeping a
 * hostile conversation's cost to the tokenizer thread small. */
static void limits(jinja_limits *l)
{
    jinja_default_limits(l);
    l->max_output = 16u << 20;
    l->max_memory = 128u << 20;
    l->max_steps = 2000000;
    l->max_work = 512u << 20;
}

/* tool_calls[i].function.arguments (or tool_calls[i].arguments) given as
 * the text of a JSON object become the object. */
static void args_to_objects(json_t *msg)
{
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        json_t *holders[2] = { json_object_get(tc, "function"), tc };
        for (int h = 0; h < 2; h++) {
            json_t *a = json_object_get(holders[h], "arguments");
            if (!json_is_string(a)) continue;
            json_t *o = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, NULL);
            if (json_is_object(o)) json_object_set_new(holders[h], "arguments", o);
            else json_decref(o);
        }
    }
}

static json_t *build_vars(const chat_tpl *c, const chat_msg *msgs, size_t n, const char *tools, size_t tools_len,
                          const char *vars, size_t vars_len, int add_assistant, char *err, size_t errlen)
{
    json_t *v = json_object(), *ms = json_array();
    if (!v || !ms) { json_decref(v); json_decref(ms); err_set(err, errlen, "out of memory"); return NULL; }
    json_object_set_new(v, "messages", ms);
    for (size_t i = 0; i < n; i++) {
        json_t *m = NULL;
        if (!msgs[i].role || (!msgs[i].content && msgs[i].content_len)) {
            json_decref(v);
            err_set(err, errlen, "message %zu has no role or content", i);
            return NULL;
        }
        if (msgs[i].extra && msgs[i].extra_len) {
            json_error_t je;
            m = json_loadb(msgs[i].extra, msgs[i].extra_len, 0, &je);
            if (!json_is_object(m)) {
                json_decref(m);
                json_decref(v);
                err_set(err, errlen, "message %zu: its fields are not a JSON object", i);
                return NULL;
            }
            args_to_objects(m);
            if (msgs[i].drop_reasoning) json_object_del(m, "reasoning_content");
        } else {
            m = json_object();
        }
        json_t *content = json_stringn_nocheck(msgs[i].content ? msgs[i].content : "", msgs[i].content_len);
        if (!m || !content || json_object_set_new(m, "role", json_string_nocheck(msgs[i].role)) ||
            json_object_set_new(m, "content", content) || json_array_append_new(ms, m)) {
            json_decref(v);
            err_set(err, errlen, "out of memory");
            return NULL;
        }
    }
    if (tools) {
        json_error_t je;
        json_t *tl = json_loadb(tools, tools_len, 0, &je);
        if (!json_is_array(tl)) {
            json_decref(tl);
            json_decref(v);
            err_set(err, errlen, "tools: not a JSON array");
            return NULL;
        }
        json_object_set_new(v, "tools", tl);
    }
    json_object_set_new(v, "add_generation_prompt", json_boolean(add_assistant));
    json_object_set_new(v, "bos_token", json_string_nocheck(c->bos));
    json_object_set_new(v, "eos_token", json_string_nocheck(c->eos));
    if (vars) {
        json_error_t je;
        json_t *o = json_loadb(vars, vars_len, 0, &je);
        const char *key;
        json_t *val;
        if (!json_is_object(o)) {
            json_decref(o);
            json_decref(v);
            err_set(err, errlen, "template_vars: not a JSON object");
            return NULL;
        }
        json_object_foreach(o, key, val) {
            if (chat_own_var(key, strlen(key))) {
                err_set(err, errlen, "template_vars: \"%s\" is the request's own", key);
                json_decref(o);
                json_decref(v);
                return NULL;
            }
            json_object_set(v, key, val);
        }
        json_decref(o);
    }
    return v;
}

int chat_render(const chat_tpl *c, const chat_msg *msgs, size_t n, const char *tools, size_t tools_len,
                const char *vars, size_t vars_len, int add_assistant, char **out, size_t *out_len, char *err,
                size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    json_t *v = build_vars(c, msgs, n, tools, tools_len, vars, vars_len, add_assistant, err, errlen);
    if (!v) return CHAT_EINPUT;
    jinja_limits lim;
    limits(&lim);
    char jerr[200];
    int rc = jinja_render(c->tpl, v, (int64_t)time(NULL), &lim, out, out_len, jerr, sizeof jerr);
    json_decref(v);
    if (rc == JINJA_OK) return 0;
    if (rc == JINJA_ERAISE) err_set(err, errlen, "chat template raised: %s", jerr);
    else if (rc == JINJA_ELIMIT) err_set(err, errlen, "chat template: %s", jerr);
    else err_set(err, errlen, "chat template failed: %s", jerr);
    return CHAT_ERENDER;
}

static const char *find(const char *h, size_t hl, const char *nd, size_t nl)
{
    if (nl == 0 || hl < nl) return NULL;
    return memmem(h, hl, nd, nl);
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int chat_encode(const struct tok *t, const chat_tpl *c, const chat_msg *msgs, size_t n,
                const char *tools, size_t tools_len, const char *vars, size_t vars_len, int add_assistant,
                int32_t **ids, size_t *n_ids, char *err, size_t errlen)
{
    *ids = NULL;
    *n_ids = 0;
    char *text;
    size_t tl;
    int rc = chat_render(c, msgs, n, tools, tools_len, vars, vars_len, add_assistant, &text, &tl, err, errlen);
    if (rc) return rc;
    /* segments: template text (specials parsed) around each content found
     * in order (plain); content the template changed beyond trimming is
     * not found and stays template text */
    tok_seg *sg = malloc(sizeof *sg * (2 * n + 1));
    if (!sg) { free(text); err_set(err, errlen, "out of memory"); return TOK_ENOMEM; }
    size_t ns = 0, pos = 0;
    for (size_t i = 0; i < n; i++) {
        const char *cs = msgs[i].content;
        size_t cl = msgs[i].content_len;
        const char *at = find(text + pos, tl - pos, cs, cl);
        if (!at) {
            while (cl && is_ws(cs[0])) { cs++; cl--; }
            while (cl && is_ws(cs[cl - 1])) cl--;
            at = find(text + pos, tl - pos, cs, cl);
        }
        if (!at) continue;
        size_t p = (size_t)(at - text);
        if (p > pos) sg[ns++] = (tok_seg){ text + pos, p - pos, 1 };
        sg[ns++] = (tok_seg){ at, cl, 0 };
        pos = p + cl;
    }
    if (pos < tl || ns == 0) sg[ns++] = (tok_seg){ text + pos, tl - pos, 1 };
    int32_t *body = NULL;
    size_t nb = 0;
    rc = tok_encode_segs(t, sg, ns, &body, &nb, err, errlen);
    free(sg);
    free(text);
    if (rc) return rc;
    int32_t bos = tok_bos(t);
    if (!tok_add_bos(t) || bos < 0 || (nb && body[0] == bos)) {
        *ids = body;
        *n_ids = nb;
        return 0;
    }
    int32_t *o = malloc(sizeof(int32_t) * (nb + 1));
    if (!o) { free(body); err_set(err, errlen, "out of memory"); return TOK_ENOMEM; }
    o[0] = bos;
    if (nb) memcpy(o + 1, body, nb * sizeof(int32_t));
    free(body);
    *ids = o;
    *n_ids = nb + 1;
    return 0;
}

/* The special token ids of text, in order. */
static size_t specials(const struct tok *t, const char *text, size_t len, int32_t **out)
{
    int32_t *ids = NULL;
    size_t n = 0, k = 0;
    char e[8];
    if (tok_encode(t, text, len, 1, &ids, &n, e, sizeof e)) return 0;
    for (size_t i = 0; i < n; i++)
        if (tok_is_control(t, ids[i]) || tok_is_eog(t, ids[i])) ids[k++] = ids[i];
    *out = ids;
    return k;
}

static int add_id(int32_t *ids, int n, int cap, int32_t id)
{
    for (int i = 0; i < n; i++) if (ids[i] == id) return n;
    if (n < cap) ids[n++] = id;
    return n;
}

int chat_end_tokens(const struct tok *t, const chat_tpl *c, int32_t *ids, int cap)
{
    static const char mark[] = "\x01" "aned-reply" "\x01";
    int k = 0;
    char err[64], *out;
    size_t ol;
    /* a plain reply: the first special token after its text */
    chat_msg m[2] = { { "user", "Hi", 2, NULL, 0, 0 }, { "assistant", mark, sizeof mark - 1, NULL, 0, 0 } };
    if (chat_render(c, m, 2, NULL, 0, NULL, 0, 0, &out, &ol, err, sizeof err) == 0) {
        const char *at = find(out, ol, mark, sizeof mark - 1);
        if (at) {
            size_t off = (size_t)(at - out) + sizeof mark - 1;
            int32_t *sp = NULL;
            size_t ns = specials(t, out + off, ol - off, &sp);
            if (ns) k = add_id(ids, k, cap, sp[0]);
            free(sp);
        }
        free(out);
    }
    /* a turn that calls a tool: its last special token */
    static const char call[] = "{\"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", "
                               "\"function\": {\"name\": \"f\", \"arguments\": {}}}]}";
    static const char tools[] = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"f\", "
                                "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]";
    chat_msg m2[2] = { { "user", "Hi", 2, NULL, 0, 0 }, { "assistant", "", 0, call, sizeof call - 1, 0 } };
    if (chat_render(c, m2, 2, tools, sizeof tools - 1, NULL, 0, 0, &out, &ol, err, sizeof err) == 0) {
        size_t cut = 0;
        const char *u = find(out, ol, "Hi", 2);   /* after the user's turn */
        if (u) cut = (size_t)(u - out) + 2;
        int32_t *sp = NULL;
        size_t ns = specials(t, out + cut, ol - cut, &sp);
        if (ns) k = add_id(ids, k, cap, sp[ns - 1]);
        free(sp);
        free(out);
    }
    return k;
}
