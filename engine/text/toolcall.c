/* toolcall.c — the streaming tool-call parser (toolcall.h).
 *
 * Generated text is appended to one buffer; buf[pos..] is what has not been
 * reported yet. Each state looks at that text and either reports some of it
 * or waits for more. While a call is being read its raw text stays in the
 * buffer (from mark on), so that a call that turns out malformed is
 * reported as the text it was. */
#include "engine/text/toolcall.h"

#include "engine/text/toolcall_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum state {
    S_TEXT,          /* content or reasoning, watching for markers */
    S_HERMES,        /* <tool_call> seen: waiting for </tool_call> */
    S_JSON,          /* a bare JSON call (llama3) */
    S_JSON_AFTER,    /* after one: ';' and spaces, then maybe another */
    S_PYTAG,         /* <|python_tag|> seen: to <|eom_id|>/<|eot_id|> or the end */
    S_MI_START,      /* [TOOL_CALLS] seen: a list or a name follows */
    S_MI_LIST,       /* [TOOL_CALLS][... */
    S_MI_NAME,       /* [TOOL_CALLS]NAME... */
    S_MI_ID,         /* ...[CALL_ID]ID... */
    S_MI_ARGS,       /* ...[ARGS]{... */
    S_DS_BLOCK,      /* inside <｜tool▁calls▁begin｜>, between calls */
    S_DS_CALL,       /* <｜tool▁call▁begin｜> seen: to <｜tool▁call▁end｜> */
    S_FN_NAME,       /* functionary: NAME\n after >>> */
    S_FN_ARGS,       /* functionary: the arguments of a call */
    S_FN_CODE,       /* functionary: python code, to >>> or the end */
    S_FN_AFTER,      /* functionary: after a call */
    S_H_START,       /* harmony: the reply's start (may open with a header) */
    S_H_TOP,         /* harmony: between messages */
    S_H_HEADER,      /* harmony: a header, to <|message|> */
    S_H_BODY,        /* harmony: a message streamed as content or reasoning */
    S_H_CALL,        /* harmony: a message to a recipient (a call's arguments) */
};

enum { CH_CONTENT, CH_REASONING };

/* Text kept back per channel: trailing whitespace (dropped when a marker
 * follows), and whether leading whitespace is to be dropped. */
typedef struct chan {
    strbuf ws;
    int trim_lead;
} chan;

struct tc_parser {
    tc_format fmt;
    int syn, think;
    int calls;          /* calls are looked for (not TC_NO_CALLS) */
    const char *think_open, *think_close;
    strbuf buf;
    size_t pos;
    enum state st;
    int in_think;
    int content_seen;   /* content other than whitespace since the reply or the last marker began */
    size_t mark, body, scan, blk_mark, aux;
    int blk_calls;
    int h_kind;         /* harmony body: CH_CONTENT or CH_REASONING */
    tcj_scan js;
    chan ch[2];
    const tc_callbacks *cb;
    strbuf name, args, id, tmp;
    uint64_t rng;
    size_t n_calls;
};

/* ---- markers ---- */

#define M_TOOL_CALL "<tool_call>"
#define M_TOOL_CALL_END "</tool_call>"
#define M_PYTAG "<|python_tag|>"
#define M_EOM "<|eom_id|>"
#define M_EOT "<|eot_id|>"
#define M_TOOL_CALLS "[TOOL_CALLS]"
#define M_ARGS "[ARGS]"
#define M_CALL_ID "[CALL_ID]"
#define M_DS_CALLS "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define M_DS_CALLS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define M_DS_CALL "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define M_DS_CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define M_DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"
#define M_FN ">>>"
#define M_H_START "<|start|>"
#define M_H_CHANNEL "<|channel|>"
#define M_H_MESSAGE "<|message|>"
#define M_H_END "<|end|>"
#define M_H_CALL "<|call|>"
#define M_H_RETURN "<|return|>"
#define M_H_CONSTRAIN "<|constrain|>"

#define MAX_NAME 256     /* a tool name longer than this is not one */
#define MAX_HEADER 512   /* a harmony header longer than this is text */

/* ---- small text helpers ---- */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void trim(const char **s, size_t *n)
{
    while (*n && is_ws(**s)) { (*s)++; (*n)--; }
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

static const char *find(const char *s, size_t n, const char *m)
{
    size_t ml = strlen(m);
    return n >= ml ? memmem(s, n, m, ml) : NULL;
}

static int starts(const char *s, size_t n, const char *m)
{
    size_t ml = strlen(m);
    return n >= ml && !memcmp(s, m, ml);
}

/* s[0..n) is a proper start of m (more text could complete it). */
static int prefix_of(const char *s, size_t n, const char *m)
{
    size_t ml = strlen(m);
    return n < ml && !memcmp(s, m, n);
}

/* The longest end of s[0..n) that begins one of the markers. */
static size_t holdback(const char *s, size_t n, const char *const *m, int nm)
{
    size_t best = 0;
    for (int k = 0; k < nm; k++) {
        size_t ml = strlen(m[k]);
        for (size_t l = ml - 1 < n ? ml - 1 : n; l > best; l--)
            if (!memcmp(s + n - l, m[k], l)) { best = l; break; }
    }
    return best;
}

/* The longest start of s[0..n) that does not end inside a UTF-8 character. */
static size_t utf8_whole(const char *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        if (c >= 0xC0) {
            size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (back < need) return n - back;
        }
        return n;
    }
    return n;
}

static int name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.' || c == ':';
}

static int valid_name(const char *s, size_t n)
{
    if (!n || n > MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++) if (!name_char(s[i])) return 0;
    return 1;
}

/* ---- output ---- */

static void out_raw(tc_parser *p, int c, const char *s, size_t n)
{
    if (!n) return;
    const tc_callbacks *cb = p->cb;
    if (c == CH_CONTENT && cb && cb->content) cb->content(cb->ctx, s, n);
    if (c == CH_REASONING && cb && cb->reasoning) cb->reasoning(cb->ctx, s, n);
}

/* Text for a channel: whitespace at its end is kept back until more text
 * follows, so that whitespace before a marker can be dropped. */
static void out_text(tc_parser *p, int c, const char *s, size_t n)
{
    chan *h = &p->ch[c];
    if (h->trim_lead) {
        while (n && is_ws(*s)) { s++; n--; }
        if (!n) return;
        h->trim_lead = 0;
    }
    size_t body = n;
    while (body && is_ws(s[body - 1])) body--;
    if (body) {
        out_raw(p, c, h->ws.p, h->ws.n);
        h->ws.n = 0;
        out_raw(p, c, s, body);
        if (c == CH_CONTENT) p->content_seen = 1;
    }
    strbuf_add(&h->ws, s + body, n - body);
}

/* A marker ends the channel's text: its kept-back whitespace is dropped. */
static void chan_cut(tc_parser *p, int c, int trim_next)
{
    p->ch[c].ws.n = 0;
    p->ch[c].trim_lead = trim_next;
}

static void out_chan_flush(tc_parser *p, int c)
{
    out_raw(p, c, p->ch[c].ws.p, p->ch[c].ws.n);
    p->ch[c].ws.n = 0;
}

/* The text buf[from..to) was not a call after all: it is content. */
static void out_as_text(tc_parser *p, size_t from, size_t to)
{
    out_text(p, p->in_think ? CH_REASONING : CH_CONTENT, p->buf.p + from, to - from);
    p->pos = to;
}

static uint64_t rng_next(tc_parser *p)
{
    uint64_t x = p->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    p->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static void make_id(tc_parser *p)
{
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    p->id.n = 0;
    int n = 24;
    if (p->syn == TC_MISTRAL) n = 9;
    else strbuf_adds(&p->id, "call_");
    for (int i = 0; i < n; i++) strbuf_addc(&p->id, al[rng_next(p) % 62]);
}

/* Reports the call in p->name / p->args (p->id when set, else a fresh id). */
static void out_call(tc_parser *p)
{
    if (!p->id.n) make_id(p);
    if (p->name.oom || p->args.oom || p->id.oom) return;
    tc_call c = { p->name.p, p->name.n, p->args.p, p->args.n, p->id.p, p->id.n };
    if (p->cb && p->cb->call) p->cb->call(p->cb->ctx, &c);
    p->n_calls++;
    p->name.n = p->args.n = p->id.n = 0;
    chan_cut(p, CH_CONTENT, 1);
    p->content_seen = 0;
}

/* ---- reading one call's parts ---- */

/* p->args from JSON arguments: an object as it is; a string holding JSON
 * (some models quote the object) decoded first; absent = {}. */
static int set_args(tc_parser *p, const char *v, size_t vl)
{
    p->args.n = 0;
    if (!v) { strbuf_adds(&p->args, "{}"); return 0; }
    if (vl && v[0] == '"') {
        p->tmp.n = 0;
        if (tcj_str_decode(v, vl, &p->tmp) == 0 && !p->tmp.oom && tcj_compact(p->tmp.p, p->tmp.n, &p->args) == 0)
            return 0;
        p->args.n = 0;
    }
    strbuf_add(&p->args, v, vl);
    return 0;
}

/* {"name": N, "arguments"|"parameters": A[, "id": I]} in compact JSON;
 * 0 with p->name/args/id set, -1 when it is not a call. */
static int json_call(tc_parser *p, const char *o, size_t n)
{
    const char *v, *a = NULL, *idv;
    size_t vl, al = 0, idl;
    if (!tcj_get(o, n, "name", &v, &vl) || v[0] != '"') return -1;
    p->name.n = 0;
    if (tcj_str_decode(v, vl, &p->name) < 0 || !valid_name(p->name.p, p->name.n)) return -1;
    if (!tcj_get(o, n, "arguments", &a, &al)) tcj_get(o, n, "parameters", &a, &al);
    if (a && a[0] != '{' && a[0] != '"') return -1;
    set_args(p, a, al);
    p->id.n = 0;
    if (tcj_get(o, n, "id", &idv, &idl) && idv[0] == '"') tcj_str_decode(idv, idl, &p->id);
    return 0;
}

/* A JSON call in raw text s[0..n). */
static int json_call_text(tc_parser *p, const char *s, size_t n)
{
    strbuf c = {0};
    int rc = tcj_compact(s, n, &c) == 0 && !c.oom ? json_call(p, c.p, c.n) : -1;
    strbuf_free(&c);
    return rc;
}

/* One "key":value of XML-ish arguments: JSON values as they are, anything
 * else (a JSON string included: it is text that happens to be quoted) as a
 * string. */
/* -1 for a key with a control character (not a parameter's name, and a
 * NUL in a key is more than many JSON readers take) */
static int put_param(tc_parser *p, int *first, const char *k, size_t kl, const char *v, size_t vl)
{
    for (size_t i = 0; i < kl; i++)
        if ((unsigned char)k[i] < 0x20 || k[i] == 0x7F) return -1;
    if (!*first) strbuf_addc(&p->args, ',');
    *first = 0;
    strbuf_json_str(&p->args, k, kl);
    strbuf_addc(&p->args, ':');
    const char *tv = v;
    size_t tl = vl;
    trim(&tv, &tl);
    if (!tl || (tv[0] == '"' && tl > 1) || tcj_compact(tv, tl, &p->args) < 0)
        strbuf_json_str(&p->args, v, vl);
    return 0;
}

/* GLM 4.5-4.7: N<arg_key>K</arg_key><arg_value>V</arg_value>... (newlines
 * between the parts or not). */
static int glm_call(tc_parser *p, const char *s, size_t n)
{
    trim(&s, &n);
    const char *k = find(s, n, "<arg_key>");
    const char *nm = s;
    size_t nl = k ? (size_t)(k - s) : n;
    trim(&nm, &nl);
    if (!valid_name(nm, nl)) return -1;
    p->name.n = p->args.n = p->id.n = 0;
    strbuf_add(&p->name, nm, nl);
    strbuf_addc(&p->args, '{');
    int first = 1;
    n -= (size_t)(k ? k - s : (ptrdiff_t)n);
    s = k ? k : s + n;
    while (n) {
        if (!starts(s, n, "<arg_key>")) return -1;
        s += 9; n -= 9;
        const char *ke = find(s, n, "</arg_key>");
        if (!ke) return -1;
        const char *key = s;
        size_t keyl = (size_t)(ke - s);
        n -= keyl + 10;
        s = ke + 10;
        while (n && is_ws(*s)) { s++; n--; }
        if (!starts(s, n, "<arg_value>")) return -1;
        s += 11; n -= 11;
        const char *ve = find(s, n, "</arg_value>");
        if (!ve) return -1;
        trim(&key, &keyl);
        if (!keyl) return -1;
        if (put_param(p, &first, key, keyl, s, (size_t)(ve - s)) < 0) return -1;
        n -= (size_t)(ve - s) + 12;
        s = ve + 12;
        while (n && is_ws(*s)) { s++; n--; }
    }
    strbuf_addc(&p->args, '}');
    return 0;
}

/* Qwen3-Coder: <function=N><parameter=P>V</parameter>...</function>. */
static int xml_call(tc_parser *p, const char *s, size_t n)
{
    trim(&s, &n);
    if (!starts(s, n, "<function=")) return -1;
    s += 10; n -= 10;
    const char *gt = memchr(s, '>', n);
    if (!gt) return -1;
    const char *nm = s;
    size_t nl = (size_t)(gt - s);
    trim(&nm, &nl);
    if (!valid_name(nm, nl)) return -1;
    p->name.n = 0;
    strbuf_add(&p->name, nm, nl);
    n -= (size_t)(gt + 1 - s);
    s = gt + 1;
    p->args.n = 0;
    strbuf_addc(&p->args, '{');
    int first = 1;
    for (;;) {
        while (n && is_ws(*s)) { s++; n--; }
        if (starts(s, n, "</function>")) {
            s += 11; n -= 11;
            while (n && is_ws(*s)) { s++; n--; }
            if (n) return -1;
            break;
        }
        if (!starts(s, n, "<parameter=")) return -1;
        s += 11; n -= 11;
        gt = memchr(s, '>', n);
        if (!gt) return -1;
        const char *k = s;
        size_t kl = (size_t)(gt - s);
        trim(&k, &kl);
        if (!kl || memchr(k, '<', kl)) return -1;
        n -= (size_t)(gt + 1 - s);
        s = gt + 1;
        /* the value ends at </parameter>, or (when that was left out) at
         * the next parameter or the function's end */
        const char *e = find(s, n, "</parameter>"), *e2 = find(s, n, "<parameter="), *e3 = find(s, n, "</function>");
        size_t skip = 12;
        if (!e || (e2 && e2 < e)) { e = e2; skip = 0; }
        if (!e || (e3 && e3 < e)) { e = e3; skip = 0; }
        if (!e) return -1;
        const char *v = s;
        size_t vl = (size_t)(e - s);
        if (vl && v[0] == '\n') { v++; vl--; }
        if (vl && v[vl - 1] == '\n') vl--;
        if (put_param(p, &first, k, kl, v, vl) < 0) return -1;
        n -= (size_t)(e - s) + skip;
        s = e + skip;
    }
    strbuf_addc(&p->args, '}');
    p->id.n = 0;
    return 0;
}

/* Llama 3.1's builtin tools: NAME.call(k="v", n=1). */
static int builtin_call(tc_parser *p, const char *s, size_t n)
{
    const char *dot = find(s, n, ".call(");
    if (!dot || !valid_name(s, (size_t)(dot - s)) || n < 1 || s[n - 1] != ')') return -1;
    p->name.n = 0;
    strbuf_add(&p->name, s, (size_t)(dot - s));
    const char *a = dot + 6, *end = s + n - 1;
    p->args.n = 0;
    strbuf_addc(&p->args, '{');
    int first = 1;
    while (a < end) {
        while (a < end && (is_ws(*a) || *a == ',')) a++;
        if (a == end) break;
        const char *k = a;
        while (a < end && name_char(*a)) a++;
        size_t kl = (size_t)(a - k);
        while (a < end && is_ws(*a)) a++;
        if (!kl || a == end || *a != '=') return -1;
        a++;
        while (a < end && is_ws(*a)) a++;
        if (!first) strbuf_addc(&p->args, ',');
        first = 0;
        strbuf_json_str(&p->args, k, kl);
        strbuf_addc(&p->args, ':');
        if (a < end && (*a == '"' || *a == '\'')) {
            char q = *a++;
            p->tmp.n = 0;
            while (a < end && *a != q) {
                if (*a == '\\' && a + 1 < end) {
                    a++;
                    strbuf_addc(&p->tmp, *a == 'n' ? '\n' : *a == 't' ? '\t' : *a);
                } else {
                    strbuf_addc(&p->tmp, *a);
                }
                a++;
            }
            if (a == end) return -1;
            a++;
            strbuf_json_str(&p->args, p->tmp.p, p->tmp.n);
        } else {
            const char *v = a;
            while (a < end && *a != ',') a++;
            size_t vl = (size_t)(a - v);
            trim(&v, &vl);
            if (vl == 4 && !memcmp(v, "True", 4)) strbuf_adds(&p->args, "true");
            else if (vl == 5 && !memcmp(v, "False", 5)) strbuf_adds(&p->args, "false");
            else if (vl == 4 && !memcmp(v, "None", 4)) strbuf_adds(&p->args, "null");
            else if (!vl || tcj_compact(v, vl, &p->args) < 0) return -1;
        }
    }
    strbuf_addc(&p->args, '}');
    p->id.n = 0;
    return 0;
}

static void code_call(tc_parser *p, const char *s, size_t n)
{
    p->name.n = p->args.n = p->id.n = 0;
    strbuf_adds(&p->name, "python");
    strbuf_adds(&p->args, "{\"code\":");
    strbuf_json_str(&p->args, s, n);
    strbuf_addc(&p->args, '}');
}

/* ---- the states ---- */

static void enter(tc_parser *p, enum state st, size_t mark, size_t body)
{
    p->st = st;
    p->mark = mark;
    p->body = p->scan = body;
}

static void scan_json_from(tc_parser *p, size_t at)
{
    memset(&p->js, 0, sizeof p->js);
    p->js.pos = at;
}

/* Content or reasoning text up to the first marker. Returns the index of the
 * marker found at p->pos (the text before it reported), or -1 when none is
 * there yet (what is surely not one reported). */
static int text_until(tc_parser *p, int c, const char *const *m, int nm, int final)
{
    const char *s = p->buf.p + p->pos;
    size_t n = p->buf.n - p->pos;
    const char *best = NULL;
    int which = -1;
    for (int k = 0; k < nm; k++) {
        size_t lim = best ? (size_t)(best - s) + strlen(m[k]) : n;   /* only an earlier one matters */
        const char *h = find(s, lim < n ? lim : n, m[k]);
        if (h && (!best || h < best)) { best = h; which = k; }
    }
    size_t upto = best ? (size_t)(best - s) : final ? n : utf8_whole(s, n - holdback(s, n, m, nm));
    out_text(p, c, s, upto);
    p->pos += upto;
    return which;
}

static int st_text(tc_parser *p, int final)
{
    const char *mk[4];
    int nm = 0;
    const char *s = p->buf.p + p->pos;
    size_t n = p->buf.n - p->pos;
    if (p->in_think) {
        mk[nm++] = p->think_close;
        int k = text_until(p, CH_REASONING, mk, nm, final);
        if (k < 0) return 0;
        p->pos += strlen(mk[k]);
        p->in_think = 0;
        chan_cut(p, CH_REASONING, 0);
        chan_cut(p, CH_CONTENT, 1);
        p->content_seen = 0;
        return 1;
    }
    if (p->syn == TC_LLAMA3 && p->calls && !p->content_seen) {
        /* a reply that opens with "{" may be a call */
        size_t i = 0;
        while (i < n && is_ws(s[i])) i++;
        if (i < n && s[i] == '{') {
            out_text(p, CH_CONTENT, s, i);
            p->pos += i;
            enter(p, S_JSON, p->pos, p->pos);
            scan_json_from(p, p->pos);
            return 1;
        }
        if (i == n && !final) { out_text(p, CH_CONTENT, s, n); p->pos += n; return 0; }
    }
    if (p->think) mk[nm++] = p->think_open;
    switch (p->calls ? p->syn : TC_PLAIN) {
    case TC_HERMES: mk[nm++] = M_TOOL_CALL; break;
    case TC_LLAMA3: mk[nm++] = M_PYTAG; break;
    case TC_MISTRAL: mk[nm++] = M_TOOL_CALLS; break;
    case TC_DEEPSEEK: mk[nm++] = M_DS_CALLS; mk[nm++] = M_DS_CALL; break;
    case TC_FUNCTIONARY: mk[nm++] = M_FN; break;
    default: break;
    }
    int k = text_until(p, CH_CONTENT, mk, nm, final);
    if (k < 0) return 0;
    const char *m = mk[k];
    size_t at = p->pos, ml = strlen(m);
    if (m == p->think_open) {
        p->pos += ml;
        p->in_think = 1;
        chan_cut(p, CH_CONTENT, 0);
        chan_cut(p, CH_REASONING, 1);
        return 1;
    }
    if (!strcmp(m, M_TOOL_CALL)) enter(p, S_HERMES, at, at + ml);
    else if (!strcmp(m, M_PYTAG)) enter(p, S_PYTAG, at, at + ml);
    else if (!strcmp(m, M_TOOL_CALLS)) enter(p, S_MI_START, at, at + ml);
    else if (!strcmp(m, M_DS_CALLS)) {
        enter(p, S_DS_BLOCK, at, at + ml);
        p->blk_mark = at;
        p->blk_calls = 0;
    } else if (!strcmp(m, M_DS_CALL)) {
        enter(p, S_DS_CALL, at, at + ml);
        p->blk_mark = at;
        p->blk_calls = 0;
    } else if (!strcmp(m, M_FN)) enter(p, S_FN_NAME, at, at + ml);
    return 1;
}

/* Waits for end marker m from p->scan on; returns its offset, or -1 (with
 * p->scan moved on so the text is not searched again). */
static long long wait_for(tc_parser *p, const char *m)
{
    size_t ml = strlen(m);
    const char *h = find(p->buf.p + p->scan, p->buf.n - p->scan, m);
    if (h) return (long long)(h - p->buf.p);
    if (p->buf.n - p->scan >= ml) p->scan = p->buf.n - ml + 1;
    return -1;
}

/* A call that cannot be read: its text from mark to `to` is content, and the
 * text after it is read as usual. */
/* back to text at pos: the call or block is done */
static int resume_text(tc_parser *p, size_t pos)
{
    p->pos = pos;
    p->st = S_TEXT;
    return 1;
}

/* the buffer's bytes [from, to), trimmed */
static const char *span(const tc_parser *p, size_t from, size_t to, size_t *len)
{
    const char *b = p->buf.p + from;
    *len = to - from;
    trim(&b, len);
    return b;
}

static int fail(tc_parser *p, size_t to)
{
    p->st = S_TEXT;
    out_as_text(p, p->mark, to);
    return 1;
}

/* A JSON value that ended unread (r from tcj_scan_feed, <= 0): text up to
 * the byte the scanner refused, or everything once the reply ended, never
 * up to what happens to be buffered, so whole and streamed replies agree. */
static int fail_json(tc_parser *p, int r)
{
    return fail(p, r < 0 ? p->js.pos : p->buf.n);
}

/* A call's arguments, the JSON value scanned from p->aux: once whole,
 * compacted into p->args and the call put out (1, the value's end at
 * p->js.pos); 0 while more may come; -1 where they are not JSON (put out
 * as text: the state is already text's). */
static int args_out(tc_parser *p, int final)
{
    int r = tcj_scan_feed(&p->js, p->buf.p, p->buf.n);
    if (r == 0 && !final) return 0;
    if (r <= 0) {
        fail_json(p, r);
        return -1;
    }
    p->args.n = 0;
    if (tcj_compact(p->buf.p + p->aux, p->js.pos - p->aux, &p->args) < 0) {
        fail(p, p->js.pos);
        return -1;
    }
    out_call(p);
    return 1;
}

static int st_hermes(tc_parser *p, int final)
{
    long long e = wait_for(p, M_TOOL_CALL_END);
    if (e < 0) return final ? fail(p, p->buf.n) : 0;
    size_t end = (size_t)e + strlen(M_TOOL_CALL_END);
    size_t bl;
    const char *b = span(p, p->body, (size_t)e, &bl);
    int ok = bl && b[0] == '{' ? json_call_text(p, b, bl) : starts(b, bl, "<function=") ? xml_call(p, b, bl)
                                                                                         : glm_call(p, b, bl);
    if (ok < 0) return fail(p, end);
    out_call(p);
    return resume_text(p, end);
}

/* A bare JSON call (llama3) from p->mark; several may follow each other. */
static int st_json(tc_parser *p, int final)
{
    int r = tcj_scan_feed(&p->js, p->buf.p, p->buf.n);
    if (r == 0 && !final) return 0;
    if (r <= 0) {
        p->content_seen = 1;   /* this text is content: no call follows it */
        return fail_json(p, r);
    }
    if (json_call_text(p, p->buf.p + p->mark, p->js.pos - p->mark) < 0) {
        p->content_seen = 1;
        return fail(p, p->js.pos);
    }
    out_call(p);
    p->pos = p->js.pos;
    p->st = S_JSON_AFTER;
    return 1;
}

static int st_json_after(tc_parser *p, int final)
{
    size_t i = p->pos;
    while (i < p->buf.n && (is_ws(p->buf.p[i]) || p->buf.p[i] == ';')) i++;
    if (i == p->buf.n && !final) return 0;
    p->pos = i;
    if (i < p->buf.n && p->buf.p[i] == '{') {
        enter(p, S_JSON, i, i);
        scan_json_from(p, i);
    } else {
        p->st = S_TEXT;
    }
    return 1;
}

/* Body b[0..n) is one or more JSON calls separated by ';' or spaces: all
 * reported (when report), 0; -1 when any is not a call (none reported). */
static int json_seq(tc_parser *p, const char *b, size_t n, int report)
{
    size_t i = 0;
    while (i < n) {
        tcj_scan sc = { i, 0, 0, 0, 0 };
        if (tcj_scan_feed(&sc, b, n) != 1 || json_call_text(p, b + i, sc.pos - i) < 0) return -1;
        if (report) out_call(p);
        i = sc.pos;
        while (i < n && (is_ws(b[i]) || b[i] == ';')) i++;
    }
    return 0;
}

static int st_pytag(tc_parser *p, int final)
{
    const char *s = p->buf.p + p->scan;
    size_t n = p->buf.n - p->scan;
    const char *h1 = find(s, n, M_EOM), *h2 = find(s, n, M_EOT);
    const char *h = !h1 ? h2 : !h2 ? h1 : h1 < h2 ? h1 : h2;
    if (!h && !final) {
        if (n >= strlen(M_EOM)) p->scan = p->buf.n - strlen(M_EOM) + 1;
        return 0;
    }
    size_t stop = h ? (size_t)(h - p->buf.p) : p->buf.n;
    size_t end = h ? stop + strlen(M_EOM) : stop;   /* both end markers are as long */
    size_t bl;
    const char *b = span(p, p->body, stop, &bl);
    if (!bl) return fail(p, end);
    if (b[0] == '{' && json_seq(p, b, bl, 0) == 0) json_seq(p, b, bl, 1);
    else {
        if (builtin_call(p, b, bl) < 0) code_call(p, b, bl);
        out_call(p);
    }
    return resume_text(p, end);
}

/* ---- Mistral ---- */

static int st_mi_start(tc_parser *p, int final)
{
    size_t i = p->body;
    while (i < p->buf.n && is_ws(p->buf.p[i])) i++;
    if (i == p->buf.n) return final ? fail(p, p->buf.n) : 0;
    if (p->buf.p[i] == '[') {
        p->st = S_MI_LIST;
        scan_json_from(p, i);
        p->aux = i;
    } else {
        p->st = S_MI_NAME;
        p->body = p->scan = i;
    }
    return 1;
}

static int st_mi_list(tc_parser *p, int final)
{
    int r = tcj_scan_feed(&p->js, p->buf.p, p->buf.n);
    if (r == 0 && !final) return 0;
    if (r <= 0) return fail_json(p, r);
    size_t end = p->js.pos;
    strbuf c = {0};
    int ok = tcj_compact(p->buf.p + p->aux, end - p->aux, &c) == 0 && !c.oom && c.n > 2;
    /* every element must be a call before any is reported */
    for (int pass = 0; ok && pass < 2; pass++) {
        size_t i = 1;
        while (ok && i < c.n - 1) {
            size_t l = tcj_value_len(c.p + i, c.n - 1 - i);
            if (c.p[i] != '{' || json_call(p, c.p + i, l) < 0) ok = 0;
            else if (pass) out_call(p);
            i += l + 1;
        }
    }
    strbuf_free(&c);
    if (!ok) return fail(p, end);
    return resume_text(p, end);
}

/* NAME, then [ARGS] or [CALL_ID]ID[ARGS] */
static int st_mi_name(tc_parser *p, int final)
{
    const char *s = p->buf.p + p->body;
    size_t n = p->buf.n - p->body, i = 0;
    int id = p->st == S_MI_ID;
    while (i < n && (id ? (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')
                        : name_char(s[i])) && i <= MAX_NAME) i++;
    if (i > MAX_NAME) return fail(p, p->body + i);
    if (i == n || (s[i] == '[' && (prefix_of(s + i, n - i, M_ARGS) || (!id && prefix_of(s + i, n - i, M_CALL_ID))))) {
        if (!final) return 0;
        return fail(p, p->buf.n);
    }
    int is_args = starts(s + i, n - i, M_ARGS), is_id = !id && starts(s + i, n - i, M_CALL_ID);
    if (!i || (!is_args && !is_id)) return fail(p, p->body + i);
    if (!id) { p->name.n = 0; strbuf_add(&p->name, s, i); p->id.n = 0; }
    else { p->id.n = 0; strbuf_add(&p->id, s, i); }
    if (is_id) {
        p->st = S_MI_ID;
        p->body = p->scan = p->body + i + strlen(M_CALL_ID);
        return 1;
    }
    p->st = S_MI_ARGS;
    p->aux = p->body + i + strlen(M_ARGS);
    scan_json_from(p, p->aux);
    return 1;
}

static int st_mi_args(tc_parser *p, int final)
{
    int r = args_out(p, final);
    return r <= 0 ? -r : resume_text(p, p->js.pos);
}

/* ---- DeepSeek ---- */

static int st_ds_block(tc_parser *p, int final)
{
    size_t i = p->body;
    while (i < p->buf.n && is_ws(p->buf.p[i])) i++;
    const char *s = p->buf.p + i;
    size_t n = p->buf.n - i;
    if (starts(s, n, M_DS_CALL)) {
        p->st = S_DS_CALL;
        p->mark = i;
        p->body = p->scan = i + strlen(M_DS_CALL);
        return 1;
    }
    if (starts(s, n, M_DS_CALLS_END)) {
        return resume_text(p, i + strlen(M_DS_CALLS_END));
    }
    if (!final && (prefix_of(s, n, M_DS_CALL) || prefix_of(s, n, M_DS_CALLS_END))) return 0;
    /* anything else ends the block */
    if (p->blk_calls) return resume_text(p, p->body);
    p->mark = p->blk_mark;
    return fail(p, i);
}

static int st_ds_call(tc_parser *p, int final)
{
    long long e = wait_for(p, M_DS_CALL_END);
    if (e < 0 && !final) return 0;
    if (e < 0) { if (!p->blk_calls) p->mark = p->blk_mark; return fail(p, p->buf.n); }
    size_t end = (size_t)e + strlen(M_DS_CALL_END);
    const char *b = p->buf.p + p->body;
    size_t bl = (size_t)e - p->body;
    const char *sep = find(b, bl, M_DS_SEP);
    int ok = -1;
    if (sep) {
        const char *nm = b, *a = sep + strlen(M_DS_SEP);
        size_t nl = (size_t)(sep - b), al = (size_t)(b + bl - a);
        trim(&nm, &nl);
        if (nl == 8 && !memcmp(nm, "function", 8)) {
            /* R1: function<sep>NAME\n```json\n{...}\n``` */
            const char *nlc = memchr(a, '\n', al);
            if (nlc) {
                nm = a;
                nl = (size_t)(nlc - a);
                a = nlc + 1;
                al = (size_t)(b + bl - a);
                trim(&a, &al);
                if (starts(a, al, "```json")) { a += 7; al -= 7; }
                else if (starts(a, al, "```")) { a += 3; al -= 3; }
                if (al >= 3 && !memcmp(a + al - 3, "```", 3)) al -= 3;
                trim(&nm, &nl);
            }
        }
        trim(&a, &al);
        p->args.n = 0;
        if (valid_name(nm, nl) && al && a[0] == '{' && tcj_compact(a, al, &p->args) == 0) {
            p->name.n = p->id.n = 0;
            strbuf_add(&p->name, nm, nl);
            ok = 0;
        }
    }
    if (ok < 0) { if (!p->blk_calls) p->mark = p->blk_mark; return fail(p, end); }
    out_call(p);
    p->blk_calls++;
    p->pos = end;
    p->st = S_DS_BLOCK;
    p->body = end;
    return 1;
}

/* ---- Functionary v3.2 ---- */

static int st_fn_name(tc_parser *p, int final)
{
    const char *s = p->buf.p + p->body;
    size_t n = p->buf.n - p->body, i = 0;
    while (i < n && name_char(s[i]) && i <= MAX_NAME) i++;
    if (i == n && !final && i <= MAX_NAME) return 0;
    if (i == n || !i || i > MAX_NAME || s[i] != '\n') {
        p->content_seen = 1;
        return fail(p, p->body + i < p->buf.n ? p->body + i : p->buf.n);
    }
    if (i == 3 && !memcmp(s, "all", 3)) {
        /* text for the user, to the next >>> */
        return resume_text(p, p->body + 4);
    }
    p->name.n = p->id.n = 0;
    strbuf_add(&p->name, s, i);
    p->aux = p->body + i + 1;
    size_t j = p->aux;
    while (j < p->buf.n && is_ws(p->buf.p[j])) j++;
    if (j == p->buf.n && !final) return 0;
    if (j < p->buf.n && p->buf.p[j] == '{') {
        p->st = S_FN_ARGS;
        scan_json_from(p, j);
    } else if (i == 6 && !memcmp(s, "python", 6)) {
        p->st = S_FN_CODE;
        p->scan = p->aux;
    } else {
        return fail(p, j);
    }
    return 1;
}

static int st_fn_args(tc_parser *p, int final)
{
    int r = args_out(p, final);
    if (r <= 0) return -r;
    p->pos = p->js.pos;
    p->st = S_FN_AFTER;
    return 1;
}

static int st_fn_code(tc_parser *p, int final)
{
    long long e = wait_for(p, M_FN);
    if (e < 0 && !final) return 0;
    size_t stop = e < 0 ? p->buf.n : (size_t)e;
    size_t bl;
    const char *b = span(p, p->aux, stop, &bl);
    code_call(p, b, bl);
    out_call(p);
    return resume_text(p, stop);
}

static int st_fn_after(tc_parser *p, int final)
{
    size_t i = p->pos;
    while (i < p->buf.n && is_ws(p->buf.p[i])) i++;
    if (i == p->buf.n && !final) return 0;
    return resume_text(p, i);
}

/* ---- Harmony (gpt-oss) ---- */

static const char *const h_markers[] = { M_H_START, M_H_CHANNEL, M_H_END, M_H_CALL, M_H_RETURN };

static int st_h_start(tc_parser *p, int final)
{
    const char *s = p->buf.p + p->pos;
    size_t n = p->buf.n - p->pos;
    static const char *const open[] = { M_H_CHANNEL, " to=", "to=" };
    for (int k = 0; k < 3; k++) {
        if (starts(s, n, open[k])) {
            enter(p, S_H_HEADER, p->pos, p->pos);
            return 1;
        }
        if (!final && prefix_of(s, n, open[k])) return 0;
    }
    p->st = S_H_TOP;
    return 1;
}

static int st_h_top(tc_parser *p, int final)
{
    int k = text_until(p, CH_CONTENT, h_markers, 5, final);
    if (k < 0) return 0;
    if (k <= 1) { enter(p, S_H_HEADER, p->pos, p->pos); return 1; }
    p->pos += strlen(h_markers[k]);   /* a message's end */
    chan_cut(p, CH_CONTENT, 0);
    return 1;
}

/* The header text h (from <|start|> or <|channel|> to <|message|>): the
 * channel and the recipient. -1 when it holds what a header does not. */
static int h_parse(tc_parser *p, const char *h, size_t n, int *kind)
{
    p->name.n = p->id.n = 0;
    const char *ch = NULL;
    size_t chl = 0;
    for (size_t i = 0; i < n;) {
        if (h[i] == '<') {
            if (starts(h + i, n - i, M_H_CHANNEL)) {
                i += strlen(M_H_CHANNEL);
                ch = h + i;
                while (i < n && name_char(h[i])) i++;
                chl = (size_t)(h + i - ch);
                continue;
            }
            if (starts(h + i, n - i, M_H_START)) { i += strlen(M_H_START); continue; }
            if (starts(h + i, n - i, M_H_CONSTRAIN)) { i += strlen(M_H_CONSTRAIN); continue; }
            return -1;
        }
        if (starts(h + i, n - i, "to=")) {
            i += 3;
            const char *r = h + i;
            while (i < n && name_char(h[i])) i++;
            size_t rl = (size_t)(h + i - r);
            if (starts(r, rl, "functions.")) { r += 10; rl -= 10; }
            if (!valid_name(r, rl)) return -1;
            p->name.n = 0;
            strbuf_add(&p->name, r, rl);
            continue;
        }
        i++;
    }
    if (p->name.n && p->calls) *kind = -1;
    else if (chl == 8 && !memcmp(ch, "analysis", 8)) *kind = CH_REASONING;
    else *kind = CH_CONTENT;
    return 0;
}

static int st_h_header(tc_parser *p, int final)
{
    long long e = wait_for(p, M_H_MESSAGE);
    size_t lim = p->mark + MAX_HEADER;
    /* until a marker starting at lim would be whole: the decision must not
     * depend on where the reply was cut into pieces */
    if (e < 0 && !final && p->buf.n < lim + strlen(M_H_MESSAGE)) return 0;
    if (e < 0 || (size_t)e > lim) {
        /* not a header: its first byte on is text again */
        p->st = S_H_TOP;
        size_t to = p->mark + 1;
        while (to < p->buf.n && (p->buf.p[to] & 0xC0) == 0x80) to++;
        out_as_text(p, p->mark, to);
        return 1;
    }
    int kind;
    if (h_parse(p, p->buf.p + p->mark, (size_t)e - p->mark, &kind) < 0) {
        p->st = S_H_TOP;
        out_as_text(p, p->mark, (size_t)e + strlen(M_H_MESSAGE));
        return 1;
    }
    size_t body = (size_t)e + strlen(M_H_MESSAGE);
    if (kind < 0) {
        p->st = S_H_CALL;
        p->body = p->scan = body;
        return 1;
    }
    p->h_kind = kind;
    p->pos = body;
    p->st = S_H_BODY;
    chan_cut(p, kind, 1);
    return 1;
}

static int st_h_body(tc_parser *p, int final)
{
    int k = text_until(p, p->h_kind, h_markers, 5, final);
    if (k < 0) {
        if (final) p->st = S_H_TOP;
        return final;
    }
    chan_cut(p, p->h_kind, 0);
    if (p->h_kind == CH_CONTENT) p->ch[CH_CONTENT].trim_lead = 0;
    if (k <= 1) enter(p, S_H_HEADER, p->pos, p->pos);
    else { p->pos += strlen(h_markers[k]); p->st = S_H_TOP; }
    return 1;
}

static int st_h_call(tc_parser *p, int final)
{
    /* the arguments end at the first message marker, or with the reply
     * (<|call|> is an end-of-turn token that generation may not show) */
    const char *s = p->buf.p + p->scan;
    size_t n = p->buf.n - p->scan;
    const char *best = NULL;
    int which = -1;
    for (int k = 0; k < 5; k++) {
        const char *h = find(s, n, h_markers[k]);
        if (h && (!best || h < best)) { best = h; which = k; }
    }
    if (!best && !final) {
        if (n > 16) p->scan = p->buf.n - 16;   /* the longest marker is shorter */
        return 0;
    }
    size_t stop = best ? (size_t)(best - p->buf.p) : p->buf.n;
    size_t end = best && which >= 2 ? stop + strlen(h_markers[which]) : stop;
    size_t bl;
    const char *b = span(p, p->body, stop, &bl);
    p->args.n = 0;
    if (!bl || tcj_compact(b, bl, &p->args) < 0) {
        p->st = S_H_TOP;
        out_as_text(p, p->mark, end);
        return 1;
    }
    out_call(p);
    p->pos = end;
    p->st = S_H_TOP;
    return 1;
}

/* ---- driver ---- */

static int step(tc_parser *p, int final)
{
    switch (p->st) {
    case S_TEXT: return st_text(p, final);
    case S_HERMES: return st_hermes(p, final);
    case S_JSON: return st_json(p, final);
    case S_JSON_AFTER: return st_json_after(p, final);
    case S_PYTAG: return st_pytag(p, final);
    case S_MI_START: return st_mi_start(p, final);
    case S_MI_LIST: return st_mi_list(p, final);
    case S_MI_NAME: case S_MI_ID: return st_mi_name(p, final);
    case S_MI_ARGS: return st_mi_args(p, final);
    case S_DS_BLOCK: return st_ds_block(p, final);
    case S_DS_CALL: return st_ds_call(p, final);
    case S_FN_NAME: return st_fn_name(p, final);
    case S_FN_ARGS: return st_fn_args(p, final);
    case S_FN_CODE: return st_fn_code(p, final);
    case S_FN_AFTER: return st_fn_after(p, final);
    case S_H_START: return st_h_start(p, final);
    case S_H_TOP: return st_h_top(p, final);
    case S_H_HEADER: return st_h_header(p, final);
    case S_H_BODY: return st_h_body(p, final);
    case S_H_CALL: return st_h_call(p, final);
    }
    return 0;
}

static void reset(tc_parser *p)
{
    p->buf.n = p->pos = 0;
    p->in_think = p->think && (p->fmt & TC_THINK_OPEN);
    p->content_seen = 0;
    p->mark = p->body = p->scan = p->blk_mark = p->aux = 0;
    p->blk_calls = 0;
    for (int c = 0; c < 2; c++) { p->ch[c].ws.n = 0; p->ch[c].trim_lead = 0; }
    if (p->in_think) p->ch[CH_REASONING].trim_lead = 1;
    p->n_calls = 0;
    /* functionary's prompt ends in ">>>": the reply starts with a name */
    p->st = p->syn == TC_FUNCTIONARY && p->calls ? S_FN_NAME : p->syn == TC_HARMONY ? S_H_START : S_TEXT;
}

/* Drops the reported text from the buffer's start. */
static void shift(tc_parser *p)
{
    size_t d = p->pos;
    if (p->st != S_TEXT && p->st != S_H_TOP && p->st != S_H_BODY && p->st != S_JSON_AFTER && p->st != S_FN_AFTER) {
        d = p->mark < d ? p->mark : d;
        if (p->st == S_DS_BLOCK || p->st == S_DS_CALL) d = p->blk_mark < d ? p->blk_mark : d;
    }
    if (!d) return;
    memmove(p->buf.p, p->buf.p + d, p->buf.n - d);
    p->buf.n -= d;
    p->pos -= d;
#define SUB(x) x = x >= d ? x - d : 0
    SUB(p->mark); SUB(p->body); SUB(p->scan); SUB(p->blk_mark); SUB(p->aux); SUB(p->js.pos);
#undef SUB
}

static int run(tc_parser *p, const tc_callbacks *cb, int final)
{
    p->cb = cb;
    while (step(p, final)) {}
    shift(p);
    p->cb = NULL;
    return p->buf.oom || p->name.oom || p->args.oom || p->id.oom || p->tmp.oom ||
           p->ch[0].ws.oom || p->ch[1].ws.oom ? -1 : 0;
}

int tc_feed(tc_parser *p, const char *text, size_t len, const tc_callbacks *cb)
{
    if (p->buf.oom) return -1;
    strbuf_add(&p->buf, text, len);
    if (p->buf.oom) return -1;
    return run(p, cb, 0);
}

int tc_finish(tc_parser *p, const tc_callbacks *cb)
{
    if (p->buf.oom) return -1;
    int rc = run(p, cb, 1);
    p->cb = cb;
    out_chan_flush(p, CH_REASONING);
    out_chan_flush(p, CH_CONTENT);
    p->cb = NULL;
    size_t calls = p->n_calls;
    reset(p);
    p->n_calls = calls;
    return rc;
}

size_t tc_n_calls(const tc_parser *p) { return p->n_calls; }

tc_parser *tc_new(tc_format fmt)
{
    tc_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->buf.cap = 256;   /* never NULL: offsets into it are taken before any text */
    p->buf.p = malloc(p->buf.cap);
    if (!p->buf.p) { free(p); return NULL; }
    p->buf.p[0] = 0;
    p->fmt = fmt;
    p->syn = (int)(fmt & TC_SYNTAX_MASK);
    if (p->syn > TC_FUNCTIONARY) p->syn = TC_PLAIN;
    p->think = (fmt & TC_THINK) && p->syn != TC_HARMONY;
    p->calls = !(fmt & TC_NO_CALLS);
    p->think_open = p->syn == TC_MISTRAL ? "[THINK]" : "<think>";
    p->think_close = p->syn == TC_MISTRAL ? "[/THINK]" : "</think>";
    static unsigned long long counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    p->rng = ((uint64_t)ts.tv_sec * 1000000007ULL) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)(uintptr_t)p << 16) ^
             (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ULL);
    if (!p->rng) p->rng = 1;
    reset(p);
    return p;
}

void tc_seed(tc_parser *p, uint64_t seed)
{
    p->rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    if (!p->rng) p->rng = 1;
}

void tc_free(tc_parser *p)
{
    if (!p) return;
    strbuf_free(&p->buf);
    strbuf_free(&p->name);
    strbuf_free(&p->args);
    strbuf_free(&p->id);
    strbuf_free(&p->tmp);
    strbuf_free(&p->ch[0].ws);
    strbuf_free(&p->ch[1].ws);
    free(p);
}

/* ---- detection ---- */

static int has(const char *s, const char *m) { return strstr(s, m) != NULL; }

tc_format tc_detect(const char *src)
{
    if (!src) return TC_PLAIN;
    int f = TC_PLAIN;
    if (has(src, "<|channel|>") && has(src, "<|message|>")) return TC_HARMONY;
    if (has(src, "tool\xE2\x96\x81" "calls\xE2\x96\x81" "begin")) f = TC_DEEPSEEK;
    else if (has(src, ">>>all")) f = TC_FUNCTIONARY;
    else if (has(src, M_TOOL_CALLS)) f = TC_MISTRAL;
    else if (has(src, M_TOOL_CALL)) f = TC_HERMES;
    else if (has(src, "<|start_header_id|>") &&
             (has(src, M_PYTAG) || has(src, "<|start_header_id|>ipython") || has(src, "\"parameters\"")))
        f = TC_LLAMA3;
    if (has(src, "<think>") || (f == TC_MISTRAL && has(src, "[THINK]"))) f |= TC_THINK;
    return (tc_format)f;
}

tc_format tc_after_prompt(tc_format fmt, const char *prompt, size_t len)
{
    if (!(fmt & TC_THINK) || !prompt) return fmt;
    int mi = (fmt & TC_SYNTAX_MASK) == TC_MISTRAL;
    const char *o = mi ? "[THINK]" : "<think>", *c = mi ? "[/THINK]" : "</think>";
    const char *lo = NULL, *lc = NULL;
    for (const char *h = prompt; (h = find(h, len - (size_t)(h - prompt), o)); h++) lo = h;
    for (const char *h = prompt; (h = find(h, len - (size_t)(h - prompt), c)); h++) lc = h;
    if (lo && (!lc || lc < lo)) return (tc_format)(fmt | TC_THINK_OPEN);
    return (tc_format)(fmt & ~TC_THINK_OPEN);
}

const char *tc_format_name(tc_format fmt)
{
    static const char *const names[] = { "plain", "hermes", "llama3", "mistral", "harmony", "deepseek", "functionary" };
    unsigned s = fmt & TC_SYNTAX_MASK;
    return s < sizeof names / sizeof *names ? names[s] : "plain";
}
