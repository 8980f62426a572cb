/* chat.c — native rendering of the ChatML (Qwen) and Llama-3 chat formats
 * to token ids. The rendered turn is encoded as one text (so words join
 * across template/content boundaries exactly as in the template's output),
 * with special tokens recognised only in the template's own parts. */
#include "engine/text/chat.h"
#include "common/err.h"
#include "engine/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

chat_kind chat_detect(const char *src)
{
    if (!src || !*src) return CHAT_NONE;
    if (strstr(src, "<|im_start|>")) return CHAT_CHATML;
    if (strstr(src, "<|start_header_id|>")) return CHAT_LLAMA3;
    return CHAT_NONE;
}

const char *chat_kind_name(chat_kind k)
{
    switch (k) {
    case CHAT_CHATML: return "chatml";
    case CHAT_LLAMA3: return "llama3";
    default: return "none";
    }
}

int chat_default_system(const char *src, char *buf, size_t cap)
{
    static const char open[] = "<|im_start|>system";
    if (!src || !buf || cap == 0) return -1;
    for (const char *p = strstr(src, open); p; p = strstr(p + 1, open)) {
        const char *q = p + sizeof open - 1;
        if (q[0] == '\\' && q[1] == 'n') q += 2;
        else if (q[0] == '\n') q += 1;
        else continue;
        const char *e = strstr(q, "<|im_end|>");
        if (!e || e == q) continue;
        size_t k = 0;
        int literal = 1;
        for (const char *r = q; r < e; r++) {
            char c = *r;
            if (strchr("'\"{}+", c)) { literal = 0; break; }
            if (c == '\\' && r + 1 < e) {
                r++;
                c = *r == 'n' ? '\n' : *r == 't' ? '\t' : *r;
            }
            if (k + 1 >= cap) { literal = 0; break; }
            buf[k++] = c;
        }
        if (!literal) continue;
        buf[k] = 0;
        return (int)k;
    }
    return -1;
}

static const char *memmem_(const char *h, size_t hl, const char *needle)
{
    size_t nl = strlen(needle);
    if (!h || hl < nl) return NULL;
    for (size_t i = 0; i + nl <= hl; i++)
        if (h[i] == needle[0] && memcmp(h + i, needle, nl) == 0) return h + i;
    return NULL;
}

typedef struct segs { tok_seg *s; size_t n, cap; } segs;

static void seg_add(segs *v, const char *text, size_t len, int special)
{
    if (v->n < v->cap) v->s[v->n++] = (tok_seg){ text, len, special };
}

static void seg_lit(segs *v, const char *lit) { seg_add(v, lit, strlen(lit), 1); }

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int chat_encode(const struct tok *t, chat_kind k, const chat_msg *msgs, size_t n,
                int add_assistant, int32_t **ids, size_t *n_ids, char *err, size_t errlen)
{
    *ids = NULL;
    *n_ids = 0;
    if (!t) return err_set(err, errlen, "chat: no tokenizer");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].role[0]) return err_set(err, errlen, "chat: message %zu has no role", i);
        if (!msgs[i].content && msgs[i].content_len) return err_set(err, errlen, "chat: message %zu has no content", i);
        for (const char *r = msgs[i].role; *r; r++)
            if (is_ws(*r) || *r == '<' || *r == '>' || *r == '|')
                return err_set(err, errlen, "chat: bad role in message %zu", i);
    }
    segs v = { .cap = 6 * n + 8 };
    v.s = malloc(sizeof(tok_seg) * v.cap);
    if (!v.s) return err_set(err, errlen, "chat: out of memory");
    char defsys[512];
    int32_t bos = -1;

    switch (k) {
    case CHAT_CHATML: {
        if (tok_add_bos(t)) bos = tok_bos(t);
        int has_sys = n > 0 && strcmp(msgs[0].role, "system") == 0;
        int dl = has_sys ? -1 : chat_default_system(tok_chat_template(t), defsys, sizeof defsys);
        if (dl > 0) {
            seg_lit(&v, "<|im_start|>system\n");
            seg_add(&v, defsys, (size_t)dl, 1);
            seg_lit(&v, "<|im_end|>\n");
        }
        /* Qwen3's template drops the reasoning of earlier assistant turns
         * and writes that of turns after the last user message as a think block */
        int qwen3 = strstr(tok_chat_template(t), "reasoning_content") != NULL;
        size_t last_q = n ? n - 1 : 0;
        for (size_t i = n; i-- > 0;) {
            const char *c = msgs[i].content;
            size_t l = msgs[i].content_len;
            int tool = l >= 33 && memcmp(c, "<tool_response>", 15) == 0 && memcmp(c + l - 16, "</tool_response>", 16) == 0;
            if (strcmp(msgs[i].role, "user") == 0 && !tool) { last_q = i; break; }
        }
        for (size_t i = 0; i < n; i++) {
            seg_lit(&v, "<|im_start|>");
            seg_add(&v, msgs[i].role, strlen(msgs[i].role), 0);
            seg_lit(&v, "\n");
            if (qwen3 && strcmp(msgs[i].role, "assistant") == 0) {
                const char *c = msgs[i].content, *ce = c + msgs[i].content_len;
                const char *rs = c, *re = c;        /* reasoning */
                const char *first = memmem_(c, msgs[i].content_len, "</think>");
                if (first) {
                    const char *last = first, *q;
                    while ((q = memmem_(last + 8, (size_t)(ce - last - 8), "</think>"))) last = q;
                    re = first;
                    while (re > c && re[-1] == '\n') re--;
                    for (const char *w = c; (q = memmem_(w, (size_t)(re - w), "<think>")); w = q + 7) rs = q + 7;
                    while (rs < re && *rs == '\n') rs++;
                    c = last + 8;
                }
                int block = i > last_q && (i + 1 == n || re > rs);
                if (block) {
                    while (rs < re && *rs == '\n') rs++;
                    while (re > rs && re[-1] == '\n') re--;
                    seg_lit(&v, "<think>\n");
                    seg_add(&v, rs, (size_t)(re - rs), 0);
                    seg_lit(&v, "\n</think>\n\n");
                }
                if (first || block)
                    while (c < ce && *c == '\n') c++;
                seg_add(&v, c, (size_t)(ce - c), 0);
            } else {
                seg_add(&v, msgs[i].content, msgs[i].content_len, 0);
            }
            seg_lit(&v, "<|im_end|>\n");
        }
        if (add_assistant) seg_lit(&v, "<|im_start|>assistant\n");
        break;
    }
    case CHAT_LLAMA3: {
        bos = tok_bos(t);
        if (bos < 0) seg_lit(&v, "<|begin_of_text|>");
        for (size_t i = 0; i < n; i++) {
            const char *c = msgs[i].content;
            size_t l = msgs[i].content_len;
            while (l && is_ws(c[0])) { c++; l--; }      /* the template's "| trim" */
            while (l && is_ws(c[l - 1])) l--;
            seg_lit(&v, "<|start_header_id|>");
            seg_add(&v, msgs[i].role, strlen(msgs[i].role), 0);
            seg_lit(&v, "<|end_header_id|>\n\n");
            seg_add(&v, c, l, 0);
            seg_lit(&v, "<|eot_id|>");
        }
        if (add_assistant) seg_lit(&v, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    }
    default:
        /* no known format: the contents as plain text, one per line */
        if (tok_add_bos(t)) bos = tok_bos(t);
        for (size_t i = 0; i < n; i++) {
            if (i) seg_add(&v, "\n", 1, 0);
            seg_add(&v, msgs[i].content, msgs[i].content_len, 0);
        }
        break;
    }

    int32_t *body = NULL;
    size_t nb = 0;
    int rc = tok_encode_segs(t, v.s, v.n, &body, &nb, err, errlen);
    free(v.s);
    if (rc) return rc;   /* the tokenizer's TOK_E* code */
    if (bos < 0) {
        *ids = body;
        *n_ids = nb;
        return 0;
    }
    int32_t *o = malloc(sizeof(int32_t) * (nb + 1));
    if (!o) { free(body); return err_set(err, errlen, "chat: out of memory"); }
    o[0] = bos;
    if (nb) memcpy(o + 1, body, nb * sizeof(int32_t));
    free(body);
    *ids = o;
    *n_ids = nb + 1;
    return 0;
}
