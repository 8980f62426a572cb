/* logprobs.c — token log-probabilities in OpenAI's shapes (docs/http.md):
 * the request fields of both endpoints, and each choice's entries as they
 * arrive (aned's token and prompt_token events), written as
 * /v1/completions' legacy object {tokens, token_logprobs, top_logprobs,
 * text_offset} or /v1/chat/completions' {content: [{token, logprob, bytes,
 * top_logprobs}]}, whole or per streamed chunk. */
#include "http/gw_int.h"
#include "http/logprobs.h"
#include "common/utf8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct gw_lp {
    sbuf tokens, vals, tops, offs;   /* completions: the arrays' bodies */
    sbuf content;                    /* chat: the entries */
    int n;                           /* entries in them */
    long long off;                   /* text_offset of the next generated token */
    long long poff;                  /* of the next prompt token (echo) */
};

int lp_parse(json_t *o, proto_req *q, int chat, perr *e)
{
    json_t *lp = json_object_get(o, "logprobs"), *tlp = json_object_get(o, "top_logprobs");
    if (chat) {
        if (present(lp) && !json_is_boolean(lp)) return pfail(e, "logprobs", "\"logprobs\" must be true or false");
        long long n = 0;
        int has = 0;
        if (get_int(o, "top_logprobs", 0, PROTO_MAX_LOGPROBS, &has, &n, e) < 0) return -1;
        if (has && n > 0 && !json_is_true(lp)) return pfail(e, "top_logprobs", "\"top_logprobs\" needs \"logprobs\": true");
        if (json_is_true(lp)) { q->logprobs = 1; q->top_logprobs = (int32_t)n; }
        return 0;
    }
    if (present(tlp)) return pfail(e, "top_logprobs", "\"top_logprobs\" goes with /v1/chat/completions; here "
                                   "\"logprobs\": N asks for N alternatives");
    if (!present(lp)) return 0;
    if (json_is_boolean(lp)) return pfail(e, "logprobs", "\"logprobs\" must be an integer in [0, %d]", PROTO_MAX_LOGPROBS);
    long long n = 0;
    int has = 0;
    if (get_int(o, "logprobs", 0, PROTO_MAX_LOGPROBS, &has, &n, e) < 0) return -1;
    q->logprobs = 1;
    q->top_logprobs = (int32_t)n;
    return 0;
}

static long long n_chars(const char *s, size_t n)
{
    long long c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

void lp_start(job *j, const char *prompt, size_t prompt_len)
{
    if (!j->lp) j->lp = calloc(1, sizeof *j->lp);
    if (j->lp && prompt) j->lp->off = n_chars(prompt, prompt_len);
}

/* A token's text as OpenAI gives it: itself when valid UTF-8, else
 * "bytes:\xNN..." */
static void tok_str(sbuf *b, const char *s, size_t n)
{
    if (utf8_valid(s, n, NULL)) { sb_json_str(b, s, n); return; }
    sb_puts(b, "\"bytes:");
    for (size_t i = 0; i < n; i++) sb_printf(b, "\\\\x%02x", (unsigned char)s[i]);
    sb_puts(b, "\"");
}

static void num(sbuf *b, float v)
{
    if (isnan(v) || v < -9999.0f) sb_puts(b, "-9999.0");   /* a refused token (as OpenAI) */
    else sb_printf(b, "%.9g", (double)v);
}

static void bytes_arr(sbuf *b, const char *s, size_t n)
{
    sb_puts(b, "[");
    for (size_t i = 0; i < n; i++) sb_printf(b, i ? ",%u" : "%u", (unsigned char)s[i]);
    sb_puts(b, "]");
}

void lp_add(gw_req *rq, job *j, const proto_ev *ev)
{
    gw_lp *l = j->lp;
    if (!l) return;
    const char *s = ev->bytes ? ev->bytes : "";
    size_t n = ev->bytes ? ev->bytes_len : 0;
    int prompt = ev->type == PROTO_T_PROMPT_TOKEN;
    if (rq->chat) {
        if (prompt) return;
        sbuf *b = &l->content;
        if (l->n) sb_puts(b, ",");
        sb_puts(b, "{\"token\":");
        tok_str(b, s, n);
        sb_puts(b, ",\"logprob\":");
        num(b, ev->has_logprob ? ev->logprob : 0);
        sb_puts(b, ",\"bytes\":");
        bytes_arr(b, s, n);
        sb_puts(b, ",\"top_logprobs\":[");
        for (size_t i = 0; ev->lps && i < ev->n_lps; i++) {
            sb_puts(b, i ? ",{\"token\":" : "{\"token\":");
            tok_str(b, ev->lps[i].bytes, ev->lps[i].bytes_len);
            sb_puts(b, ",\"logprob\":");
            num(b, ev->lps[i].logprob);
            sb_puts(b, ",\"bytes\":");
            bytes_arr(b, ev->lps[i].bytes, ev->lps[i].bytes_len);
            sb_puts(b, "}");
        }
        sb_puts(b, "]}");
        l->n++;
        return;
    }
    if (l->n) {   /* (sb_puts of "" on an empty sbuf is not safe) */
        sb_puts(&l->tokens, ",");
        sb_puts(&l->vals, ",");
        sb_puts(&l->tops, ",");
        sb_puts(&l->offs, ",");
    }
    tok_str(&l->tokens, s, n);
    if (ev->has_logprob) {
        num(&l->vals, ev->logprob);
        sb_puts(&l->tops, "{");
        for (size_t i = 0; ev->lps && i < ev->n_lps; i++) {
            /* one entry per text, the likeliest (OpenAI's dict) */
            size_t k = 0;
            while (k < i && !(ev->lps[k].bytes_len == ev->lps[i].bytes_len &&
                              !memcmp(ev->lps[k].bytes, ev->lps[i].bytes, ev->lps[i].bytes_len))) k++;
            if (k < i) continue;
            if (i) sb_puts(&l->tops, ",");
            tok_str(&l->tops, ev->lps[i].bytes, ev->lps[i].bytes_len);
            sb_puts(&l->tops, ":");
            num(&l->tops, ev->lps[i].logprob);
        }
        sb_puts(&l->tops, "}");
    } else {
        sb_puts(&l->vals, "null");   /* the first prompt token: nothing before it */
        sb_puts(&l->tops, "null");
    }
    if (!prompt && l->off == 0) l->off = l->poff;   /* an echoed token prompt: after its tokens */
    long long *off = prompt ? &l->poff : &l->off;
    sb_printf(&l->offs, "%lld", *off);
    *off += n_chars(s, n);
    l->n++;
}

int lp_pending(const job *j)
{
    return j->lp && j->lp->n > 0;
}

void lp_json(gw_req *rq, job *j, sbuf *b)
{
    gw_lp *l = j->lp;
    if (!l) { sb_puts(b, "\"logprobs\":null"); return; }
    if (rq->chat) {
        sb_puts(b, "\"logprobs\":{\"content\":[");
        if (l->content.len) sb_add(b, l->content.p, l->content.len);
        sb_puts(b, "]}");
    } else {
        sb_puts(b, "\"logprobs\":{\"tokens\":[");
        if (l->tokens.len) sb_add(b, l->tokens.p, l->tokens.len);
        sb_puts(b, "],\"token_logprobs\":[");
        if (l->vals.len) sb_add(b, l->vals.p, l->vals.len);
        sb_puts(b, "],\"top_logprobs\":[");
        if (l->tops.len) sb_add(b, l->tops.p, l->tops.len);
        sb_puts(b, "],\"text_offset\":[");
        if (l->offs.len) sb_add(b, l->offs.p, l->offs.len);
        sb_puts(b, "]}");
    }
    l->tokens.len = l->vals.len = l->tops.len = l->offs.len = l->content.len = 0;
    l->n = 0;
}

void lp_fix_utf8(sbuf *b)
{
    if (!b->len || utf8_valid(b->p, b->len, NULL)) return;
    sbuf o = {0};
    for (size_t i = 0; i < b->len;) {
        int n = utf8_char(b->p + i, b->len - i);
        if (n > 0) { sb_add(&o, b->p + i, (size_t)n); i += (size_t)n; }
        else { sb_add(&o, "\xef\xbf\xbd", 3); i++; }   /* U+FFFD */
    }
    if (o.oom) { sb_free(&o); return; }
    sb_free(b);
    *b = o;
}

void lp_free(job *j)
{
    gw_lp *l = j->lp;
    if (!l) return;
    sb_free(&l->tokens); sb_free(&l->vals); sb_free(&l->tops); sb_free(&l->offs); sb_free(&l->content);
    free(l);
    j->lp = NULL;
}
