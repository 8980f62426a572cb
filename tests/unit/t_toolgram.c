/* t_toolgram.c — forced tool-call grammars (toolgram.h): for every call
 * syntax, random sentences of the grammar (a random walk over the token
 * mask) are read by that format's parser (toolcall.h) as calls to allowed
 * functions whose arguments hold to the schema, with no text left over;
 * special tokens named in a grammar are matched as tokens, never as text;
 * the errors. */
#include "tests/check.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/toolgram.h"
#include "engine/text/toolcall.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}, \"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 14},"
    " \"unit\": {\"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\"], \"additionalProperties\": false}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"tz\": {\"type\": \"string\", \"pattern\": \"^[A-Z]{3}$\"}}, \"required\": [\"tz\"], \"additionalProperties\": false}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]";

/* The walk's vocabulary: printable ASCII, newline, a few multi-byte pieces,
 * the markers of every syntax as text, and specials from 200 on. */
#define N_VOCAB 260
static const char *markers[] = {
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|channel|>", "<|constrain|>", "<|message|>",
    "commentary to=functions.", "\"name\": \"", "\"arguments\": ", "\"parameters\": ", "</think>", "[/THINK]",
    ("<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"),
    ("<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"),
    ("<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"),
    ("<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"),
    ("<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"), "```json", ">>>", "get_", "\xC3\xA9", "\xEF\xBD\x9C", "\xE2\x96\x81",
};
#define N_MARK (sizeof markers / sizeof *markers)
#define SPECIAL0 200   /* ids SPECIAL0 + i: special tokens spelled markers[i] */

static char pieces_buf[N_VOCAB][64];
static const char *pieces[N_VOCAB];
static size_t lens[N_VOCAB];

/* specials on: markers[0..] are also special tokens (ids SPECIAL0 + i) */
static int use_specials;

static int32_t special(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    if (!use_specials) return -1;
    for (size_t i = 0; i < N_MARK && i < 8; i++)
        if (strlen(markers[i]) == len && !memcmp(markers[i], text, len)) return SPECIAL0 + (int32_t)i;
    return -1;
}

static gram_vocab *walk_vocab(void)
{
    int32_t n = 0;
    for (int c = 0x20; c < 0x7F; c++) { pieces_buf[n][0] = (char)c; pieces_buf[n][1] = 0; n++; }
    strcpy(pieces_buf[n++], "\n");
    for (size_t i = 0; i < N_MARK; i++) strcpy(pieces_buf[n++], markers[i]);
    for (int32_t i = 0; i < N_VOCAB; i++) {
        pieces[i] = i < n ? pieces_buf[i] : NULL;
        lens[i] = i < n ? strlen(pieces_buf[i]) : 0;
    }
    gram_vocab *v = gram_vocab_new(pieces, lens, N_VOCAB);
    int32_t sp[8];
    for (int i = 0; i < 8; i++) sp[i] = SPECIAL0 + i;
    if (v) gram_vocab_set_special(v, sp, 8);
    return v;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* A random sentence of g (tokens from the mask; ending, where allowed, with
 * probability 1/4 per step, else at 4,000 bytes). 0 ok, -1 stuck/failed. */
static int walk(const gram *g, const gram_vocab *v, uint64_t *rs, char *out, size_t cap)
{
    char err[256];
    gram_match *m = NULL;
    if (gram_match_new(&m, g, err, sizeof err)) return -1;
    uint32_t mask[(N_VOCAB + 31) / 32];
    size_t n = 0;
    int rc = -1;
    for (int steps = 0; steps < 6000; steps++) {
        int can_end = gram_match_can_end(m);
        if (can_end && (gram_match_must_end(m) || rng_next(rs) % 4 == 0)) { rc = 0; break; }
        int64_t k = gram_match_mask(m, v, mask, err, sizeof err);
        if (k <= 0) break;
        /* prefer a token that closes what is open when the text runs long */
        int64_t pick = (int64_t)(rng_next(rs) % (uint64_t)k);
        int32_t id = -1;
        for (int32_t i = 0; i < N_VOCAB; i++)
            if (mask[i >> 5] >> (i & 31) & 1) { if (pick-- == 0) { id = i; break; } }
        if (n > 2500) {
            /* long enough: close what is open (quotes and brackets first, then
             * anything but whitespace and the start of another call) */
            int32_t alt = -1;
            for (int32_t i = 0; i < N_VOCAB; i++) {
                if (!(mask[i >> 5] >> (i & 31) & 1) || !pieces[i]) continue;
                if (strchr("\"}]", pieces[i][0])) { id = i; alt = -2; break; }
                if (alt == -1 && !strchr(" \t\n<[", pieces[i][0])) alt = i;
            }
            if (alt >= 0) id = alt;
        }
        const char *txt;
        size_t tl;
        int ok;
        if (id >= SPECIAL0) {
            txt = markers[id - SPECIAL0]; tl = strlen(txt);
            ok = gram_match_accept_token(m, id, err, sizeof err);
        } else {
            txt = pieces[id]; tl = lens[id];
            ok = gram_match_accept(m, txt, tl, err, sizeof err);
        }
        if (ok != 1 || n + tl + 1 > cap) break;
        memcpy(out + n, txt, tl);
        n += tl;
    }
    out[n] = 0;
    gram_match_free(m);
    return rc;
}

typedef struct { int n_calls, bad; char text[256]; size_t text_n; const char *only; } got;

static void on_text(void *ctx, const char *t, size_t n)
{
    got *g = ctx;
    size_t k = n < sizeof g->text - 1 - g->text_n ? n : sizeof g->text - 1 - g->text_n;
    memcpy(g->text + g->text_n, t, k);
    g->text_n += k;
    g->text[g->text_n] = 0;
}

/* A call holds to TOOLS: a known name (the one named, when one is), arguments
 * valid under its schema. */
static void on_call(void *ctx, const tc_call *c)
{
    got *g = ctx;
    g->n_calls++;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)c->name_len, c->name);
    json_t *a = json_loadb(c->arguments, c->arguments_len, JSON_DECODE_ANY, NULL);
    int ok = json_is_object(a);
    if (g->only && strcmp(name, g->only)) ok = 0;
    if (!strcmp(name, "get_weather")) {
        json_t *city = json_object_get(a, "city"), *days = json_object_get(a, "days"), *unit = json_object_get(a, "unit");
        ok = ok && json_is_string(city) && json_string_length(city) <= 12 * 6;
        if (days) ok = ok && json_is_number(days) && json_number_value(days) >= 1 && json_number_value(days) <= 14;
        if (unit) ok = ok && json_is_string(unit) && (!strcmp(json_string_value(unit), "c") || !strcmp(json_string_value(unit), "f"));
        ok = ok && json_object_size(a) == (size_t)(1 + !!days + !!unit);
    } else if (!strcmp(name, "get_time")) {
        json_t *tz = json_object_get(a, "tz");
        const char *s = json_string_value(tz);
        ok = ok && s && strlen(s) == 3 && s[0] >= 'A' && s[0] <= 'Z' && s[1] >= 'A' && s[1] <= 'Z' && s[2] >= 'A' && s[2] <= 'Z'
             && json_object_size(a) == 1;
    } else if (!strcmp(name, "ping")) {
        /* any object: jansson refuses some valid JSON (numbers past double range) */
        ok = (!g->only || !strcmp(g->only, "ping")) && c->arguments_len >= 2 && c->arguments[0] == '{';
    } else ok = 0;
    if (!ok) { g->bad++; fprintf(stderr, "bad call %s(%.*s)\n", name, (int)c->arguments_len, c->arguments); }
    json_decref(a);
}

static const char *const TPL_MISTRAL_LIST = "{{ '[TOOL_CALLS]' }}";
static const char *const TPL_MISTRAL_ARGS = "{{ '[TOOL_CALLS]' + name + '[ARGS]' }}";
static const char *const TPL_DS_R1 = "{{ 'function' }}\n```json\n";

static void run_format(tc_format fmt, const char *tpl, const char *only, int max_calls, int specials, int n)
{
    gram_vocab *v = walk_vocab();
    CHECK(v != NULL);
    if (!v) return;
    use_specials = specials;
    char err[256] = "";
    char *text = toolgram_gbnf(fmt, tpl, TOOLS, strlen(TOOLS), only, only ? strlen(only) : 0, max_calls,
                               special, NULL, err, sizeof err);
    CHECKF(text != NULL, "%s: %s", tc_format_name(fmt), err);
    if (!text) { gram_vocab_free(v); return; }
    CHECKF(!specials || strstr(text, "<[200]>") || strstr(text, "<[202]>") || strstr(text, "<[204]>") ||
           (fmt & TC_SYNTAX_MASK) == TC_LLAMA3 || (fmt & TC_SYNTAX_MASK) == TC_FUNCTIONARY || (fmt & TC_SYNTAX_MASK) == TC_DEEPSEEK,
           "%s: markers named as tokens", tc_format_name(fmt));
    gram *g = NULL;
    CHECKF(gram_compile(&g, text, strlen(text), err, sizeof err) == 0, "%s: %s\n%s", tc_format_name(fmt), err, text);
    if (!g) { free(text); gram_vocab_free(v); return; }
    uint64_t rs = 0x9E3779B97F4A7C15ull ^ (uint64_t)fmt ^ (uint64_t)max_calls << 20;
    int parsed = 0, multi = 0, names[3] = { 0 };
    static char buf[8192];
    for (int i = 0; i < n; i++) {
        if (walk(g, v, &rs, buf, sizeof buf)) { CHECKF(0, "%s: the walk got stuck: %s", tc_format_name(fmt), buf); continue; }
        got res = { .only = only };
        tc_callbacks cb = { on_text, on_text, on_call, &res };
        tc_parser *p = tc_new(fmt);
        /* in random pieces, as tokens come */
        for (size_t at = 0, len = strlen(buf); at < len;) {
            size_t k = 1 + rng_next(&rs) % 7;
            if (k > len - at) k = len - at;
            tc_feed(p, buf + at, k, &cb);
            at += k;
        }
        tc_finish(p, &cb);
        tc_free(p);
        int ok = res.n_calls >= 1 && !res.bad && res.text_n == 0 && (max_calls != 1 || res.n_calls == 1);
        CHECKF(ok, "%s: %d calls, %d bad, text %s from %s", tc_format_name(fmt), res.n_calls, res.bad, res.text, buf);
        parsed += ok;
        multi += res.n_calls > 1;
        names[0] += strstr(buf, "get_weather") != NULL;
        names[1] += strstr(buf, "get_time") != NULL;
        names[2] += strstr(buf, "ping") != NULL;
    }
    CHECKF(parsed == n, "%s: %d of %d parsed", tc_format_name(fmt), parsed, n);
    if (!only) CHECKF(names[0] && names[1] && names[2], "%s: every function comes up", tc_format_name(fmt));
    else CHECK(names[0] == n);
    int many = max_calls == 0 && (fmt & TC_SYNTAX_MASK) != TC_HARMONY;
    CHECKF(many ? multi > 0 : multi == 0, "%s: several calls %d", tc_format_name(fmt), multi);
    gram_free(g);
    free(text);
    gram_vocab_free(v);
}

static void test_formats(void)
{
    struct { tc_format f; const char *tpl; } fm[] = {
        { TC_HERMES, "" }, { TC_LLAMA3, "" }, { TC_MISTRAL, TPL_MISTRAL_LIST }, { TC_MISTRAL, TPL_MISTRAL_ARGS },
        { TC_HARMONY, "" }, { TC_DEEPSEEK, "" }, { TC_DEEPSEEK, TPL_DS_R1 }, { TC_FUNCTIONARY, "" },
        { TC_HERMES | TC_THINK | TC_THINK_OPEN, "" }, { TC_DEEPSEEK | TC_THINK | TC_THINK_OPEN, "" },
    };
    for (size_t i = 0; i < sizeof fm / sizeof *fm; i++)
        for (int sp = 0; sp < 2; sp++) {
            run_format(fm[i].f, fm[i].tpl, NULL, 1, sp, 60);
            run_format(fm[i].f, fm[i].tpl, NULL, 0, sp, 60);
            run_format(fm[i].f, fm[i].tpl, "get_weather", 1, sp, 20);
        }
}

/* A token named in a grammar is matched as the token alone: not by its text,
 * and no text rule ([^...], .) takes a special token. */
static void test_special_tokens(void)
{
    char err[256];
    gram *g = NULL;
    const char *src = "root ::= <[5]> [^x]* <[7]>";
    CHECK(gram_compile(&g, src, strlen(src), err, sizeof err) == 0);
    gram_match *m = NULL;
    CHECK(g && gram_match_new(&m, g, err, sizeof err) == 0);
    if (!m) { gram_free(g); return; }
    CHECK(gram_match_accept(m, "<x>", 3, err, sizeof err) == 0);
    CHECK(gram_match_accept_token(m, 6, err, sizeof err) == 0);
    CHECK(gram_match_accept_token(m, 5, err, sizeof err) == 1);
    CHECK(gram_match_accept(m, "abc", 3, err, sizeof err) == 1);
    CHECK(gram_match_accept_token(m, 5, err, sizeof err) == 0);   /* not as [^x] */
    CHECK(!gram_match_can_end(m));
    /* the mask: token 7 (special) and text tokens other than x */
    const char *pc[10] = { "a", "x", "b", NULL, NULL, NULL, NULL, NULL, NULL, NULL };
    size_t ln[10] = { 1, 1, 1, 0, 0, 0, 0, 0, 0, 0 };
    gram_vocab *v = gram_vocab_new(pc, ln, 10);
    int32_t sp[] = { 5, 7, 9 };
    CHECK(v && gram_vocab_set_special(v, sp, 3) == 0);
    uint32_t mask[1] = { 0 };
    CHECK_EQ_INT(gram_match_mask(m, v, mask, err, sizeof err), 3);
    CHECK_EQ_INT(mask[0], (1u << 0) | (1u << 2) | (1u << 7));
    CHECK(gram_match_accept_token(m, 7, err, sizeof err) == 1);
    CHECK(gram_match_must_end(m));
    gram_match_free(m);
    gram_free(g);
    /* grammars without token names never let specials through */
    const char *any = "root ::= .*";
    CHECK(gram_compile(&g, any, strlen(any), err, sizeof err) == 0);
    CHECK(gram_match_new(&m, g, err, sizeof err) == 0);
    CHECK_EQ_INT(gram_match_mask(m, v, mask, err, sizeof err), 3);
    CHECK_EQ_INT(mask[0], 7u);
    CHECK(gram_match_accept_token(m, 5, err, sizeof err) == 0);
    gram_match_free(m);
    gram_free(g);
    gram_vocab_free(v);
    /* syntax errors */
    const char *bad[] = { "root ::= <[]>", "root ::= <[12", "root ::= <[99999999]>" };
    for (size_t i = 0; i < 3; i++) {
        g = NULL;
        CHECKF(gram_compile(&g, bad[i], strlen(bad[i]), err, sizeof err) != 0 && strstr(err, "token"), "%s: %s", bad[i], err);
        gram_free(g);
    }
}

static void test_errors(void)
{
    char err[256];
    char *t = toolgram_gbnf(TC_PLAIN, "", TOOLS, strlen(TOOLS), NULL, 0, 1, NULL, NULL, err, sizeof err);
    CHECKF(!t && strstr(err, "tool_choice") && strstr(err, "syntax"), "%s", err);
    t = toolgram_gbnf(TC_HERMES, "", TOOLS, strlen(TOOLS), "nope", 4, 1, NULL, NULL, err, sizeof err);
    CHECKF(!t && strstr(err, "\"nope\"") && strstr(err, "not among"), "%s", err);
    const char *badschema = "[{\"type\": \"function\", \"function\": {\"name\": \"a\"}},"
                            " {\"type\": \"function\", \"function\": {\"name\": \"b\", \"parameters\": {\"type\": \"thing\"}}}]";
    t = toolgram_gbnf(TC_HERMES, "", badschema, strlen(badschema), NULL, 0, 1, NULL, NULL, err, sizeof err);
    CHECKF(!t && strstr(err, "\"tools\"[1].function.parameters") && strstr(err, "unknown type"), "%s", err);
    /* only the named function's schema matters */
    t = toolgram_gbnf(TC_HERMES, "", badschema, strlen(badschema), "a", 1, 1, NULL, NULL, err, sizeof err);
    CHECKF(t != NULL, "%s", err);
    free(t);
    const char *odd = "[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]";
    t = toolgram_gbnf(TC_HARMONY, "", odd, strlen(odd), NULL, 0, 1, NULL, NULL, err, sizeof err);
    CHECKF(!t && strstr(err, "\"a b\""), "%s", err);
    t = toolgram_gbnf(TC_HERMES, "", odd, strlen(odd), NULL, 0, 1, NULL, NULL, err, sizeof err);
    CHECKF(t != NULL, "a JSON-quoted name may hold a space: %s", err);
    free(t);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_special_tokens);
    RUN(test_errors);
    RUN(test_formats);
    return CHECK_DONE();
}
