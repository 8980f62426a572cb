/* embeddings.c — POST /v1/embeddings in OpenAI's shape: "input" a string,
 * an array of strings, an array of token ids or an array of such arrays;
 * each input one aned "embed" request, up to GW_MAX_CHOICES of them in
 * flight at once (the daemon batches them with everything else);
 * "encoding_format" float or base64 (little-endian float32); "dimensions"
 * keeps the first d components and scales them back to unit length. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "http/gw_int.h"

#define GW_MAX_EMBED_INPUTS 2048   /* OpenAI's limit on inputs per request */

typedef struct emb_in {
    const char *text; size_t len;  /* a string input, or */
    int32_t *toks; size_t n_toks;  /* token ids (toks != NULL) */
    uint64_t id;                   /* its embed request; 0 = not sent yet */
    float *vec; size_t n;          /* the answer */
    int done;
} emb_in;

static int oom(perr *e)
{
    pfail(e, NULL, "out of memory");
    e->status = 500;
    e->code = NULL;
    return -1;
}

/* Token ids of one JSON array into *in; -1 with e filled. */
static int get_ids(json_t *a, const char *what, emb_in *in, perr *e)
{
    size_t n = json_array_size(a);
    if (n == 0) return pfail(e, "input", "%s is an empty array of token ids", what);
    if (n > PROTO_MAX_TOKENS) return pfail(e, "input", "%s has %zu token ids; at most %d", what, n, PROTO_MAX_TOKENS);
    in->toks = malloc(n * sizeof *in->toks);
    if (!in->toks) return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            pfail(e, "input", "%s[%zu] is not a token id", what, i);
            e->code = "invalid_token";
            return -1;
        }
        in->toks[i] = (int32_t)json_integer_value(v);
    }
    in->n_toks = n;
    return 0;
}

static int get_text(json_t *s, const char *what, emb_in *in, perr *e)
{
    in->text = json_string_value(s);
    in->len = json_string_length(s);
    if (in->len == 0) return pfail(e, "input", "%s is an empty string", what);
    if (in->len > PROTO_MAX_PROMPT) return pfail(e, "input", "%s is %zu bytes; at most %d", what, in->len, (int)PROTO_MAX_PROMPT);
    return 0;
}

/* "input" into ins[*n] (malloc'd). */
static int parse_input(json_t *o, emb_in **ins, size_t *n, perr *e)
{
    json_t *in = json_object_get(o, "input");
    *ins = NULL;
    *n = 0;
    if (!present(in)) return pfail(e, "input", "\"input\" is required: a string, an array of strings, "
                                               "an array of token ids or an array of such arrays");
    if (json_is_string(in)) {
        *ins = calloc(1, sizeof **ins);
        if (!*ins) return oom(e);
        *n = 1;
        return get_text(in, "\"input\"", *ins, e);
    }
    if (!json_is_array(in) || json_array_size(in) == 0)
        return pfail(e, "input", "\"input\" must be a string or a non-empty array");
    json_t *first = json_array_get(in, 0);
    if (json_is_integer(first)) {   /* one input as token ids */
        *ins = calloc(1, sizeof **ins);
        if (!*ins) return oom(e);
        *n = 1;
        return get_ids(in, "\"input\"", *ins, e);
    }
    size_t cnt = json_array_size(in);
    if (cnt > GW_MAX_EMBED_INPUTS) return pfail(e, "input", "%zu inputs; at most %d", cnt, GW_MAX_EMBED_INPUTS);
    *ins = calloc(cnt, sizeof **ins);
    if (!*ins) return oom(e);
    *n = cnt;
    int strings = json_is_string(first);
    for (size_t i = 0; i < cnt; i++) {
        json_t *v = json_array_get(in, i);
        char what[40];
        snprintf(what, sizeof what, "\"input\"[%zu]", i);
        if (strings && json_is_string(v)) { if (get_text(v, what, &(*ins)[i], e) < 0) return -1; }
        else if (!strings && json_is_array(v)) { if (get_ids(v, what, &(*ins)[i], e) < 0) return -1; }
        else return pfail(e, "input", "%s must be %s, as \"input\"[0] is", what,
                          strings ? "a string" : "an array of token ids");
    }
    return 0;
}

static void b64(sbuf *b, const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (sb_reserve(b, (n + 2) / 3 * 4 + 1) < 0) return;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = { tab[v >> 18], tab[(v >> 12) & 63], i + 1 < n ? tab[(v >> 6) & 63] : '=', i + 2 < n ? tab[v & 63] : '=' };
        sb_add(b, q, 4);
    }
}

/* The first d components of v, scaled to unit length (d = n: v as it is,
 * already unit length), as a JSON array or base64 of little-endian float32. */
static int put_vec(sbuf *b, const float *v, size_t n, size_t d, int base64)
{
    double ss = 0;
    for (size_t i = 0; i < d; i++) ss += (double)v[i] * v[i];
    double inv = d < n && ss > 0 ? 1.0 / sqrt(ss) : 1.0;
    unsigned char *raw = base64 ? malloc(d * 4 + 1) : NULL;
    if (base64 && !raw) return -1;
    if (!base64) sb_puts(b, "[");
    for (size_t i = 0; i < d; i++) {
        float f = d < n ? (float)(v[i] * inv) : v[i];
        if (!isfinite(f)) { free(raw); return -1; }
        if (base64) {
            uint32_t u;
            memcpy(&u, &f, 4);
            for (int k = 0; k < 4; k++) raw[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
        } else sb_printf(b, "%s%.9g", i ? "," : "", (double)f);
    }
    if (base64) {
        sb_puts(b, "\"");
        b64(b, raw, d * 4);
        sb_puts(b, "\"");
        free(raw);
    } else sb_puts(b, "]");
    return 0;
}

/* The model's n_embd (info); -1 when the daemon failed (rc in *rc). */
static int n_embd_of(gw_req *rq, int *rc, char *err, size_t errlen, proto_ev *ev)
{
    *rc = ask_daemon(rq, PROTO_T_INFO, ev, err, errlen);
    if (*rc < 0) return -1;
    return ev->type == PROTO_T_INFO_OK ? ev->n_embd : 0;
}

enum MHD_Result gw_embeddings(gw_req *rq, struct MHD_Connection *mc, json_t *o)
{
    perr e = { 400, NULL, NULL, "", "" };
    emb_in *ins = NULL;
    size_t n = 0, sent = 0, done = 0, inflight = 0;
    uint64_t prompt_tokens = 0;
    int base64 = 0, has_dims = 0, rc;
    long long dims = 0;
    char err[256];
    proto_ev ev;
    enum MHD_Result ret;
    sbuf b = {0};

    json_t *ef = json_object_get(o, "encoding_format"), *mo = json_object_get(o, "model"),
           *us = json_object_get(o, "user");
    if (present(ef)) {
        const char *s = json_string_value(ef);
        if (!s || (strcmp(s, "float") && strcmp(s, "base64"))) {
            pfail(&e, "encoding_format", "\"encoding_format\" must be \"float\" or \"base64\"");
            goto bad;
        }
        base64 = !strcmp(s, "base64");
    }
    if (present(mo) && !json_is_string(mo)) { pfail(&e, "model", "\"model\" must be a string"); goto bad; }
    if (present(us) && !json_is_string(us)) { pfail(&e, "user", "\"user\" must be a string"); goto bad; }
    if (get_int(o, "dimensions", 1, 1 << 20, &has_dims, &dims, &e) < 0) goto bad;
    if (parse_input(o, &ins, &n, &e) < 0) goto bad;
    if (has_dims) {
        int ne = n_embd_of(rq, &rc, err, sizeof err, &ev);
        if (rc < 0) { ret = daemon_failed(rq, mc, rc, err); goto out; }
        if (ne <= 0) { ret = ev_error(rq, mc, &ev); goto out; }
        if (dims > ne) {
            pfail(&e, "dimensions", "\"dimensions\" is %lld; the model's embeddings have %d", dims, ne);
            goto bad;
        }
    }
    /* a window of requests in flight; an error ends them all (the
     * daemon connection is dropped, which cancels the rest) */
    if (conn_ane(rq->conn, err, sizeof err) < 0) { ret = daemon_failed(rq, mc, -1, err); goto out; }
    while (done < n) {
        while (sent < n && inflight < GW_MAX_CHOICES) {
            proto_req q;
            proto_req_init(&q, PROTO_T_EMBED, 0);
            if (ins[sent].toks) { q.tokens = ins[sent].toks; q.n_tokens = ins[sent].n_toks; }
            else { q.text = ins[sent].text; q.text_len = ins[sent].len; }
            ins[sent].id = ane_submit(rq->conn->ane, &q, err, sizeof err);
            if (!ins[sent].id && sent == 0) {   /* a stale connection: once more */
                conn_drop(rq->conn);
                if (conn_ane(rq->conn, err, sizeof err) == 0) ins[sent].id = ane_submit(rq->conn->ane, &q, err, sizeof err);
            }
            if (!ins[sent].id) { conn_drop(rq->conn); ret = daemon_failed(rq, mc, -1, err); goto out; }
            sent++;
            inflight++;
        }
        rc = wait_event(rq, &ev, err, sizeof err);
        if (rc < 0) { conn_drop(rq->conn); ret = daemon_failed(rq, mc, rc, err); goto out; }
        size_t i = 0;
        while (i < sent && ins[i].id != ev.id) i++;
        if (i == sent || ins[i].done) continue;
        if (ev.type == PROTO_T_EMBEDDING) {
            free(ins[i].vec);
            ins[i].vec = malloc((ev.n_embedding ? ev.n_embedding : 1) * sizeof *ins[i].vec);
            if (!ins[i].vec) { conn_drop(rq->conn); ret = send_error(rq, mc, 500, NULL, NULL, "out of memory"); goto out; }
            memcpy(ins[i].vec, ev.embedding, ev.n_embedding * sizeof *ins[i].vec);
            ins[i].n = ev.n_embedding;
        } else if (ev.type == PROTO_T_ERROR) {
            job_err je;
            err_from_event(rq->rt, &ev, &je);   /* (before the drop frees ev's strings) */
            conn_drop(rq->conn);
            if (je.status == 400) je.param = "input";
            if (n > 1) ret = send_error(rq, mc, je.status, je.code, je.param, "input[%zu]: %s", i, je.msg);
            else ret = send_error(rq, mc, je.status, je.code, je.param, "%s", je.msg);
            goto out;
        } else if (ev.type == PROTO_T_DONE) {
            if (!ins[i].vec || ins[i].n == 0) {
                ret = send_error(rq, mc, 503, "daemon_unavailable", NULL, "aned ended input %zu without its vector (%.*s)",
                                 i, (int)ev.finish_len, ev.finish);
                conn_drop(rq->conn);
                goto out;
            }
            ins[i].done = 1;
            prompt_tokens += ev.prompt_tokens;
            done++;
            inflight--;
        }
    }
    sb_puts(&b, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < n; i++) {
        size_t d = has_dims && (size_t)dims < ins[i].n ? (size_t)dims : ins[i].n;
        sb_printf(&b, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
        if (put_vec(&b, ins[i].vec, ins[i].n, d, base64) < 0) {
            ret = send_error(rq, mc, 500, NULL, NULL, "input %zu: the vector is not finite", i);
            goto out;
        }
        sb_puts(&b, "}");
    }
    sb_puts(&b, "],\"model\":");
    const char *name = ane_model_name(rq->conn->ane);
    sb_json_str(&b, name ? name : "", name ? strlen(name) : 0);
    sb_printf(&b, ",\"usage\":{\"prompt_tokens\":%llu,\"total_tokens\":%llu}}", (unsigned long long)prompt_tokens,
              (unsigned long long)prompt_tokens);
    ret = send_sb(rq, mc, &b);
    goto out;
bad:
    ret = send_error(rq, mc, e.status, e.code, e.param, "%s", e.msg);
out:
    for (size_t i = 0; i < n; i++) { free(ins[i].toks); free(ins[i].vec); }
    free(ins);
    sb_free(&b);
    return ret;
}
