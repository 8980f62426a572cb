/* toolgram.c — GBNF for forced tool calls (toolgram.h). */
#include "engine/grammar/toolgram.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar.h"
#include "common/strbuf.h"

typedef struct {
    strbuf o;
    toolgram_special_fn special; void *ctx;
} gb;

static void put(gb *b, const char *s, size_t n) { strbuf_add(&b->o, s, n); }
static void puts_(gb *b, const char *s) { put(b, s, strlen(s)); }

/* A GBNF literal of raw bytes (UTF-8 passes as it is). */
static void lit(gb *b, const char *s, size_t n)
{
    puts_(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; put(b, e, 2); }
        else if (c < 0x20 || c == 0x7F) { snprintf(e, sizeof e, "\\x%02X", c); put(b, e, 4); }
        else put(b, (const char *)&c, 1);
    }
    puts_(b, "\"");
}

/* A marker: the special token when the vocabulary has it as one, else its text. */
static void mark(gb *b, const char *s)
{
    int32_t id = b->special ? b->special(b->ctx, s, strlen(s)) : -1;
    if (id >= 0) {
        char t[32];
        snprintf(t, sizeof t, " <[%ld]> ", (long)id);
        puts_(b, t);
    } else {
        puts_(b, " ");
        lit(b, s, strlen(s));
        puts_(b, " ");
    }
}

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap; va_start(ap, fmt); vsnprintf(err, errlen, fmt, ap); va_end(ap);
    return -1;
}

/* Names written bare (not as a JSON string) must not run into the syntax around them. */
static int bare_ok(const char *s, size_t n)
{
    if (!n) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

#define DS_CALLS "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALLS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_CALL "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"

/* One alternative of tc-call for function i (name n, arguments rule tc-args-i). */
static void call_alt(gb *b, int syn, int variant, const char *n, size_t nl, size_t i)
{
    char args[32];
    snprintf(args, sizeof args, " tc-args-%zu ", i);
    json_t *js = json_stringn(n, nl);
    char *jn = js ? json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(js);
    if (!jn) { b->o.oom = 1; return; }
    switch (syn) {
    case TC_HERMES:
        mark(b, "<tool_call>");
        lit(b, "\n{\"name\": ", 10); lit(b, jn, strlen(jn)); lit(b, ", \"arguments\": ", 15);
        puts_(b, args);
        lit(b, "}\n", 2);
        mark(b, "</tool_call>");
        break;
    case TC_LLAMA3:
        lit(b, "{\"name\": ", 9); lit(b, jn, strlen(jn)); lit(b, ", \"parameters\": ", 16);
        puts_(b, args);
        lit(b, "}", 1);
        break;
    case TC_MISTRAL:
        if (variant) {           /* [TOOL_CALLS]NAME[ARGS]{...} */
            mark(b, "[TOOL_CALLS]");
            lit(b, n, nl);
            mark(b, "[ARGS]");
            puts_(b, args);
        } else {                 /* an element of [TOOL_CALLS][...] */
            lit(b, "{\"name\": ", 9); lit(b, jn, strlen(jn)); lit(b, ", \"arguments\": ", 15);
            puts_(b, args);
            puts_(b, " \", \\\"id\\\": \\\"\" [a-zA-Z0-9]{9} \"\\\"}\" ");
        }
        break;
    case TC_HARMONY:
        mark(b, "<|channel|>");
        lit(b, "commentary to=functions.", 24); lit(b, n, nl); lit(b, " ", 1);
        mark(b, "<|constrain|>");
        lit(b, "json", 4);
        mark(b, "<|message|>");
        puts_(b, args);
        break;
    case TC_DEEPSEEK:
        mark(b, DS_CALL);
        if (variant) {           /* R1: function<sep>NAME\n```json\n{...}\n``` */
            lit(b, "function", 8);
            mark(b, DS_SEP);
            lit(b, n, nl);
            lit(b, "\n```json\n", 9);
            puts_(b, args);
            lit(b, "\n```", 4);
        } else {
            lit(b, n, nl);
            mark(b, DS_SEP);
            puts_(b, args);
        }
        mark(b, DS_CALL_END);
        break;
    case TC_FUNCTIONARY:
        lit(b, n, nl); lit(b, "\n", 1);
        puts_(b, args);
        break;
    }
    free(jn);
}

char *toolgram_gbnf(tc_format fmt, const char *tpl_src, const char *tools, size_t tools_len,
                    const char *name, size_t name_len, int max_calls,
                    toolgram_special_fn special, void *ctx, char *err, size_t errlen)
{
    int syn = fmt & TC_SYNTAX_MASK;
    if (syn == TC_PLAIN || syn > TC_FUNCTIONARY) {
        fail(err, errlen, "\"tool_choice\": the chat template has no tool-call syntax this server knows, so a call cannot be required");
        return NULL;
    }
    json_error_t je;
    json_t *arr = json_loadb(tools, tools_len, 0, &je);
    if (!json_is_array(arr) || !json_array_size(arr)) {
        json_decref(arr);
        fail(err, errlen, "\"tool_choice\" needs a non-empty \"tools\" array");
        return NULL;
    }
    size_t nt = json_array_size(arr), nsel = 0;
    const char **schemas = calloc(nt, sizeof *schemas);
    size_t *slen = calloc(nt, sizeof *slen), *which = calloc(nt, sizeof *which);
    char **owned = calloc(nt, sizeof *owned);
    gb b = { .special = special, .ctx = ctx };
    char *out = NULL, *rules = NULL;
    if (!schemas || !slen || !which || !owned) { fail(err, errlen, "out of memory"); goto done; }
    int variant = 0;
    if (syn == TC_MISTRAL) variant = tpl_src && strstr(tpl_src, "[ARGS]") != NULL;
    if (syn == TC_DEEPSEEK) variant = tpl_src && strstr(tpl_src, "```json") != NULL;
    int bare = syn == TC_HARMONY || syn == TC_FUNCTIONARY || syn == TC_DEEPSEEK || (syn == TC_MISTRAL && variant);
    for (size_t i = 0; i < nt; i++) {
        json_t *t = json_array_get(arr, i), *f = json_object_get(t, "function");
        if (!json_is_object(f)) f = t;
        json_t *nm = json_object_get(f, "name");
        if (!json_is_string(nm)) { fail(err, errlen, "\"tools\"[%zu].function.name must be a string", i); goto done; }
        const char *s = json_string_value(nm);
        size_t sl = json_string_length(nm);
        if (name && (sl != name_len || memcmp(s, name, sl))) continue;
        if (bare && !bare_ok(s, sl)) {
            fail(err, errlen, "\"tool_choice\": the function name \"%.64s\" cannot be written in the %s call syntax "
                 "(letters, digits, '_', '-', '.')", s, tc_format_name(fmt));
            goto done;
        }
        json_t *par = json_object_get(f, "parameters");
        if (par) {
            owned[nsel] = json_dumps(par, JSON_ENCODE_ANY | JSON_COMPACT);
            if (!owned[nsel]) { fail(err, errlen, "out of memory"); goto done; }
            schemas[nsel] = owned[nsel];
        } else schemas[nsel] = "{\"type\": \"object\"}";
        slen[nsel] = strlen(schemas[nsel]);
        which[nsel++] = i;
    }
    if (!nsel) {
        fail(err, errlen, "\"tool_choice\" names the function \"%.*s\", which is not among \"tools\"", (int)(name_len > 64 ? 64 : name_len), name);
        goto done;
    }
    char jerr[256] = "";
    /* a string may not spell the marker that ends the call: its first
     * character comes escaped (\u003c) */
    const char *no_raw = syn == TC_HERMES || syn == TC_DEEPSEEK || syn == TC_HARMONY ? "<"
                       : syn == TC_FUNCTIONARY ? ">" : syn == TC_MISTRAL ? "[" : NULL;
    rules = jsonschema_gbnf_set(schemas, slen, nsel, "tc-args-", no_raw, jerr, sizeof jerr);
    if (!rules) {
        /* which schema: convert them one at a time */
        for (size_t k = 0; k < nsel; k++) {
            char e1[256] = "";
            char *r1 = jsonschema_gbnf_set(&schemas[k], &slen[k], 1, "tc-args-", no_raw, e1, sizeof e1);
            if (!r1) { fail(err, errlen, "\"tools\"[%zu].function.parameters: %s", which[k], e1); goto done; }
            free(r1);
        }
        fail(err, errlen, "\"tools\": %s", jerr);
        goto done;
    }
    puts_(&b, rules);
    /* one call: an alternative per function */
    puts_(&b, "tc-call ::=");
    for (size_t k = 0; k < nsel; k++) {
        json_t *f = json_object_get(json_array_get(arr, which[k]), "function");
        if (!json_is_object(f)) f = json_array_get(arr, which[k]);
        json_t *nm = json_object_get(f, "name");
        if (k) puts_(&b, " |");
        call_alt(&b, syn, variant, json_string_value(nm), json_string_length(nm), k);
    }
    puts_(&b, "\n");
    /* several where the syntax writes several in one reply (Harmony ends
     * the reply at a call's <|call|>) */
    int many = max_calls != 1 && syn != TC_HARMONY;
    const char *sep = syn == TC_HERMES ? "\"\\n\"" : syn == TC_LLAMA3 ? "\"; \"" : syn == TC_FUNCTIONARY ? "\">>>\""
                    : syn == TC_MISTRAL && !variant ? "\", \"" : syn == TC_DEEPSEEK && variant ? "\"\\n\"" : "";
    puts_(&b, "tc-calls ::= tc-call");
    if (many) { puts_(&b, " ( "); puts_(&b, *sep ? sep : ""); puts_(&b, " tc-call )*"); }
    puts_(&b, "\n");
    puts_(&b, "root ::=");
    if (fmt & TC_THINK_OPEN) {
        /* the prompt opened a reasoning block: the reply closes it first */
        mark(&b, syn == TC_MISTRAL ? "[/THINK]" : "</think>");
        if (syn != TC_MISTRAL) lit(&b, "\n\n", 2);
    }
    if (syn == TC_MISTRAL && !variant) {
        mark(&b, "[TOOL_CALLS]");
        puts_(&b, " \"[\" tc-calls \"]\"");
    } else if (syn == TC_DEEPSEEK) {
        mark(&b, DS_CALLS);
        puts_(&b, " tc-calls ");
        mark(&b, DS_CALLS_END);
    } else puts_(&b, " tc-calls");
    puts_(&b, "\n");
    if (b.o.oom) { fail(err, errlen, "out of memory"); goto done; }
    out = b.o.p;
    b.o.p = NULL;
done:
    free(b.o.p);
    free(rules);
    for (size_t i = 0; owned && i < nt; i++) free(owned[i]);
    free(owned); free(schemas); free(slen); free(which);
    json_decref(arr);
    return out;
}
