/* t_toolcall.c — the streaming tool-call parser (engine/text/toolcall.h):
 * every format on the text its models write (the templates' own renderings
 * of a call, and the formats' documented examples), several calls a turn,
 * nested and unicode arguments, reasoning, malformed and cut-off calls
 * coming back as text, and every case fed whole, a byte at a time and in
 * random pieces with the same result; format detection on the real
 * templates. */
#include "tests/check.h"
#include "common/utf8.h"
#include "engine/text/toolcall.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- collecting what the parser reports ---- */

typedef struct sbuf { char *p; size_t n, cap; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

typedef struct col {
    sbuf content, reasoning, calls, ids;
    int bad_piece;      /* a piece that was empty or not whole UTF-8 */
    int bad_args;       /* arguments that are not valid JSON */
} col;

static void piece_ok(col *c, const char *s, size_t n)
{
    if (!n || !utf8_valid(s, n, NULL)) c->bad_piece++;
}

static void on_content(void *ctx, const char *s, size_t n)
{
    col *c = ctx;
    piece_ok(c, s, n);
    sb_put(&c->content, s, n);
}

static void on_reasoning(void *ctx, const char *s, size_t n)
{
    col *c = ctx;
    piece_ok(c, s, n);
    sb_put(&c->reasoning, s, n);
}

static void on_call(void *ctx, const tc_call *k)
{
    col *c = ctx;
    json_error_t je;
    json_t *j = json_loadb(k->arguments, k->arguments_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    /* (jansson refuses integers beyond 64 bits, which JSON allows) */
    if (!j && json_error_code(&je) != json_error_numeric_overflow) c->bad_args++;
    json_decref(j);
    if (c->calls.n) sb_puts(&c->calls, "|");
    sb_put(&c->calls, k->name, k->name_len);
    sb_puts(&c->calls, "(");
    sb_put(&c->calls, k->arguments, k->arguments_len);
    sb_puts(&c->calls, ")");
    if (c->ids.n) sb_puts(&c->ids, "|");
    sb_put(&c->ids, k->id, k->id_len);
}

static void col_free(col *c)
{
    free(c->content.p);
    free(c->reasoning.p);
    free(c->calls.p);
    free(c->ids.p);
    memset(c, 0, sizeof *c);
}

static const char *S(const sbuf *b) { return b->p ? b->p : ""; }

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Feeds text in pieces: split 0 = whole, 1 = a byte at a time, k >= 2 =
 * random pieces of 1..k bytes. */
static void parse(tc_format f, const char *text, int split, col *c)
{
    memset(c, 0, sizeof *c);
    tc_parser *p = tc_new(f);
    if (!p) abort();
    tc_seed(p, 1);
    tc_callbacks cb = { on_content, on_reasoning, on_call, c };
    size_t n = strlen(text), i = 0;
    while (i < n) {
        size_t k = split == 0 ? n : split == 1 ? 1 : 1 + rnd() % (uint64_t)split;
        if (k > n - i) k = n - i;
        CHECK(tc_feed(p, text + i, k, &cb) == 0);
        i += k;
    }
    CHECK(tc_finish(p, &cb) == 0);
    tc_free(p);
}

/* One case: the same result whatever the pieces. */
static void expect(tc_format f, const char *text, const char *content, const char *reasoning, const char *calls)
{
    static const int splits[] = { 0, 1, 2, 3, 7, 16 };
    for (size_t s = 0; s < sizeof splits / sizeof *splits; s++) {
        for (int rep = 0; rep < (splits[s] >= 2 ? 4 : 1); rep++) {
            col c;
            parse(f, text, splits[s], &c);
            CHECKF(!strcmp(S(&c.content), content), "[%s split %d] content \"%s\", want \"%s\" (input %s)",
                   tc_format_name(f), splits[s], S(&c.content), content, text);
            CHECKF(!strcmp(S(&c.reasoning), reasoning), "[%s split %d] reasoning \"%s\", want \"%s\" (input %s)",
                   tc_format_name(f), splits[s], S(&c.reasoning), reasoning, text);
            CHECKF(!strcmp(S(&c.calls), calls), "[%s split %d] calls \"%s\", want \"%s\" (input %s)",
                   tc_format_name(f), splits[s], S(&c.calls), calls, text);
            CHECK_EQ_INT(c.bad_piece, 0);
            CHECK_EQ_INT(c.bad_args, 0);
            col_free(&c);
        }
    }
}

/* Malformed or cut-off: all of it comes back as content, byte for byte. */
static void expect_text(tc_format f, const char *text)
{
    expect(f, text, text, "", "");
}

/* ---- Hermes / Qwen ---- */

static void test_hermes(void)
{
    /* Qwen2.5's template: <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call> */
    expect(TC_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           "", "", "get_weather({\"city\":\"Paris\"})");
    /* text first, then two calls in one turn */
    expect(TC_HERMES,
           "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xC3\xBCrich\"}}\n</tool_call>",
           "Let me check both.", "",
           "get_weather({\"city\":\"Paris\"})|get_weather({\"city\":\"Z\xC3\xBCrich\"})");
    /* nested JSON, unicode, escapes and numbers kept as written */
    expect(TC_HERMES,
           "<tool_call>{\"name\":\"plan\",\"arguments\":{ \"a\" : {\"b\": [1, 2.50, {\"c\": null}, true]},"
           " \"s\": \"\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82 \\u00fc \\\"q\\\" \\\\n\", \"big\": 123456789012345678901234567890,"
           " \"e\": -1.5E+3}}</tool_call>",
           "", "",
           "plan({\"a\":{\"b\":[1,2.50,{\"c\":null},true]},\"s\":\"\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82 \\u00fc \\\"q\\\" \\\\n\","
           "\"big\":123456789012345678901234567890,\"e\":-1.5E+3})");
    /* Hermes 2 Pro writes "parameters" at times; quoted argument objects are unquoted */
    expect(TC_HERMES, "<tool_call>{\"name\": \"f\", \"parameters\": {\"x\": 1}}</tool_call>", "", "", "f({\"x\":1})");
    expect(TC_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}</tool_call>", "", "",
           "f({\"x\":[1,2]})");
    expect(TC_HERMES, "<tool_call>{\"name\": \"now\"}</tool_call>", "", "", "now({})");
    /* text after a call is content */
    expect(TC_HERMES, "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>\nDone.", "Done.", "", "now({})");
    /* malformed: bad JSON, no name, a name that is not one, not an object */
    expect_text(TC_HERMES, "<tool_call>{\"name\": oops}</tool_call> after");
    expect_text(TC_HERMES, "Before <tool_call>{\"arguments\": {}}</tool_call>");
    expect_text(TC_HERMES, "<tool_call>{\"name\": \"a b\", \"arguments\": {}}</tool_call>");
    expect_text(TC_HERMES, "<tool_call>[1, 2]</tool_call>");
    expect_text(TC_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}} trailing</tool_call>");
    /* cut off: the reply ended inside the call or its marker */
    expect_text(TC_HERMES, "Sure <tool_call>{\"name\": \"f\", \"argu");
    expect_text(TC_HERMES, "Sure <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_c");
    expect_text(TC_HERMES, "a < b and <tool_ca");
    /* a bad one does not spoil a good one after it */
    expect(TC_HERMES, "<tool_call>{bad}</tool_call> <tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
           "<tool_call>{bad}</tool_call>", "", "g({})");
}

static void test_qwen3_coder(void)
{
    /* Qwen3-Coder's template renders a call so */
    expect(TC_HERMES,
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
           "", "", "get_weather({\"city\":\"Paris\"})");
    /* several parameters: JSON values as such, text as strings, multi-line text kept */
    expect(TC_HERMES,
           "I will write it.\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a \"b\".txt\n</parameter>\n"
           "<parameter=content>\nline 1\n  line 2 \xC3\xA9\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
           "<parameter=opts>\n{\"append\": false, \"tags\": [\"x\"]}\n</parameter>\n</function>\n</tool_call>\n"
           "<tool_call>\n<function=list_dir>\n</function>\n</tool_call>",
           "I will write it.", "",
           "write_file({\"path\":\"/tmp/a \\\"b\\\".txt\",\"content\":\"line 1\\n  line 2 \xC3\xA9\",\"mode\":420,"
           "\"opts\":{\"append\":false,\"tags\":[\"x\"]}})|list_dir({})");
    expect_text(TC_HERMES, "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>");
    /* GLM 4.x inside the same tags */
    expect(TC_HERMES | TC_THINK,
           "<think>Two things.</think>\n<tool_call>write\n<arg_key>path</arg_key>\n<arg_value>/tmp/\xC3\xA9</arg_value>\n"
           "<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n<arg_key>o</arg_key><arg_value>{\"a\": [true]}</arg_value>\n"
           "</tool_call><tool_call>now</tool_call>",
           "", "Two things.", "write({\"path\":\"/tmp/\xC3\xA9\",\"n\":3,\"o\":{\"a\":[true]}})|now({})");
    expect_text(TC_HERMES, "<tool_call>write\n<arg_key>path</arg_key>\n</tool_call>");
    expect_text(TC_HERMES, "<tool_call>not a call at all</tool_call>");
    expect_text(TC_HERMES, "<tool_call>\n<function=f>\n<parameter=x>\n1");
}

static void test_think(void)
{
    /* Qwen3: reasoning, then a call */
    expect(TC_HERMES | TC_THINK,
           "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
           "{\"city\": \"Paris\"}}\n</tool_call>",
           "", "The user wants the weather.", "get_weather({\"city\":\"Paris\"})");
    expect(TC_HERMES | TC_THINK, "<think>\nShort.\n</think>\n\nHello there.", "Hello there.", "Short.", "");
    /* markers inside reasoning are reasoning */
    expect(TC_HERMES | TC_THINK, "<think>maybe <tool_call>{}</tool_call></think>ok", "ok",
           "maybe <tool_call>{}</tool_call>", "");
    /* the prompt opened the block (DeepSeek R1, Qwen3 thinking) */
    expect(TC_HERMES | TC_THINK | TC_THINK_OPEN, "\nStill thinking.\n</think>\n\nAnswer.", "Answer.", "Still thinking.", "");
    /* never closed: all reasoning */
    expect(TC_HERMES | TC_THINK, "<think>cut off", "", "cut off", "");
    /* without TC_THINK the tags are text */
    expect(TC_HERMES, "<think>x</think>y", "<think>x</think>y", "", "");
    expect(TC_PLAIN | TC_THINK, "<think>a</think>b", "b", "a", "");
    expect(TC_PLAIN | TC_THINK, "a <thin", "a <thin", "", "");
}

/* Reasoning alone (a reply without tools): think blocks and Harmony's
 * analysis channel are reasoning; call syntax is content as written. */
static void test_no_calls(void)
{
    const char *call = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    char in[256];
    snprintf(in, sizeof in, "<think>\nplan\n</think>\n\nSure: %s", call);
    char want[256];
    snprintf(want, sizeof want, "Sure: %s", call);
    expect(TC_HERMES | TC_THINK | TC_NO_CALLS, in, want, "plan", "");
    expect(TC_HERMES | TC_THINK, in, "Sure:", "plan", "f({})");   /* the same with calls */
    expect(TC_HERMES | TC_THINK | TC_THINK_OPEN | TC_NO_CALLS, "plan\n</think>\n\nHi", "Hi", "plan", "");
    expect(TC_MISTRAL | TC_THINK | TC_NO_CALLS, "[THINK]plan[/THINK]Hi [TOOL_CALLS]f[ARGS]{}", "Hi [TOOL_CALLS]f[ARGS]{}",
           "plan", "");
    expect(TC_LLAMA3 | TC_NO_CALLS, "{\"name\": \"f\", \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": {}}", "", "");
    expect(TC_FUNCTIONARY | TC_NO_CALLS, "f\n{\"a\": 1}", "f\n{\"a\": 1}", "", "");
    expect(TC_DEEPSEEK | TC_THINK | TC_NO_CALLS, "<think>x</think>y " "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>",
           "y " "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>", "x", "");
    /* Harmony: analysis is reasoning, final content; a message to a function is content */
    expect(TC_HARMONY | TC_NO_CALLS,
           "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi.<|return|>",
           "Hi.", "Think.", "");
    expect(TC_HARMONY | TC_NO_CALLS,
           "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
           "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
           "{\"city\": \"Paris\"}", "Need it.", "");
}

/* ---- Llama 3.x ---- */

static void test_llama3(void)
{
    /* the Llama 3.1-3.3 templates render a call as the whole reply */
    expect(TC_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "",
           "get_weather({\"city\":\"Paris\"})");
    expect(TC_LLAMA3, "\n{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "",
           "get_weather({\"city\":\"Paris\"})");
    /* several, separated by ';' */
    expect(TC_LLAMA3,
           "{\"name\": \"a\", \"parameters\": {\"x\": \"\xC3\xA9t\xC3\xA9\"}}; {\"name\": \"b\", \"parameters\": {\"n\": [1, {\"d\": 2}]}}",
           "", "", "a({\"x\":\"\xC3\xA9t\xC3\xA9\"})|b({\"n\":[1,{\"d\":2}]})");
    /* <|python_tag|>: JSON, a builtin tool, code */
    expect(TC_LLAMA3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eom_id|>", "", "",
           "get_weather({\"city\":\"Paris\"})");
    expect(TC_LLAMA3, "<|python_tag|>brave_search.call(query=\"weather in Paris\", n=3)", "", "",
           "brave_search({\"query\":\"weather in Paris\",\"n\":3})");
    expect(TC_LLAMA3, "<|python_tag|>wolfram_alpha.call(query='2+2')<|eom_id|>", "", "",
           "wolfram_alpha({\"query\":\"2+2\"})");
    expect(TC_LLAMA3, "<|python_tag|>import math\nprint(math.pi)", "", "",
           "python({\"code\":\"import math\\nprint(math.pi)\"})");
    /* JSON that is not a call, and calls in the middle of text, are content */
    expect_text(TC_LLAMA3, "{\"answer\": 42}");
    expect_text(TC_LLAMA3, "The call is {\"name\": \"f\", \"parameters\": {}}");
    expect_text(TC_LLAMA3, "{\"name\": \"f\", \"parameters\": {\"x\": ");
    expect_text(TC_LLAMA3, "{not json at all} and more");
    expect(TC_LLAMA3, "Plain answer.", "Plain answer.", "", "");
    expect_text(TC_LLAMA3, "<|python_tag|>");
}

/* ---- Mistral ---- */

static void test_mistral(void)
{
    /* Mistral Nemo: a JSON list with 9-character ids */
    expect(TC_MISTRAL,
           "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]", "", "",
           "get_weather({\"city\":\"Paris\"})");
    expect(TC_MISTRAL,
           "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"q\": [\"\xE2\x82\xAC\"]}}]", "",
           "", "a({})|b({\"q\":[\"\xE2\x82\xAC\"]})");
    /* Mistral Small 3.2, Devstral, Ministral 3: NAME[ARGS]{...} */
    expect(TC_MISTRAL, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "", "", "get_weather({\"city\":\"Paris\"})");
    expect(TC_MISTRAL, "Checking.[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{\"x\": {\"y\": [1, 2]}}", "Checking.", "",
           "a({})|b({\"x\":{\"y\":[1,2]}})");
    expect(TC_MISTRAL, "[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]{\"city\": \"Paris\"}", "", "",
           "get_weather({\"city\":\"Paris\"})");
    /* Ministral 3 Reasoning */
    expect(TC_MISTRAL | TC_THINK, "[THINK]Need the weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "",
           "Need the weather.", "get_weather({\"city\":\"Paris\"})");
    expect_text(TC_MISTRAL, "[TOOL_CALLS]get weather[ARGS]{}");
    expect_text(TC_MISTRAL, "[TOOL_CALLS]get_weather[ARGS]{\"city\": ");
    expect_text(TC_MISTRAL, "[TOOL_CALLS]get_weather[ARGS]nope");
    expect_text(TC_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, 3]");
    expect_text(TC_MISTRAL, "[TOOL_CALLS][]");
    expect_text(TC_MISTRAL, "[TOOL_CALLS]get_weath");
}

static void test_ids(void)
{
    col c;
    parse(TC_MISTRAL, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abc123def\"}]", 0, &c);
    CHECK(!strcmp(S(&c.ids), "abc123def"));
    col_free(&c);
    parse(TC_MISTRAL, "[TOOL_CALLS]f[CALL_ID]Zz9Zz9Zz9[ARGS]{}", 1, &c);
    CHECK(!strcmp(S(&c.ids), "Zz9Zz9Zz9"));
    col_free(&c);
    /* made-up ids: 9 letters and digits for Mistral, call_ + 24 otherwise, all different */
    parse(TC_MISTRAL, "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{}", 0, &c);
    CHECK_EQ_INT(c.ids.n, 19);
    CHECK(c.ids.n == 19 && memcmp(c.ids.p, c.ids.p + 10, 9) != 0);
    for (size_t i = 0; i < c.ids.n; i++)
        if (i != 9) CHECKF(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", c.ids.p[i]), "id %s", S(&c.ids));
    col_free(&c);
    parse(TC_HERMES, "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"f\"}</tool_call>", 0, &c);
    CHECK_EQ_INT(c.ids.n, 29 * 2 + 1);
    CHECK(!strncmp(S(&c.ids), "call_", 5) && !strncmp(S(&c.ids) + 30, "call_", 5) && memcmp(c.ids.p, c.ids.p + 30, 29));
    col_free(&c);
    /* two parsers with no seed do not repeat each other's ids */
    tc_parser *a = tc_new(TC_HERMES), *b = tc_new(TC_HERMES);
    col ca = {0}, cb2 = {0};
    tc_callbacks k1 = { on_content, on_reasoning, on_call, &ca }, k2 = { on_content, on_reasoning, on_call, &cb2 };
    const char *t = "<tool_call>{\"name\": \"f\"}</tool_call>";
    tc_feed(a, t, strlen(t), &k1);
    tc_feed(b, t, strlen(t), &k2);
    tc_finish(a, &k1);
    tc_finish(b, &k2);
    CHECK(ca.ids.n == 29 && cb2.ids.n == 29 && strcmp(S(&ca.ids), S(&cb2.ids)));
    CHECK_EQ_INT(tc_n_calls(a), 1);
    tc_free(a);
    tc_free(b);
    col_free(&ca);
    col_free(&cb2);
}

/* ---- gpt-oss Harmony ---- */

static void test_harmony(void)
{
    expect(TC_HARMONY,
           "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
           "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
           "", "Need the weather.", "get_weather({\"city\":\"Paris\"})");
    /* the template's own rendering: the recipient in the role part, no <|call|> shown */
    expect(TC_HARMONY, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}", "", "",
           "get_weather({\"city\":\"Paris\"})");
    expect(TC_HARMONY,
           "<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hello! "
           "\xF0\x9F\x91\x8B<|return|>",
           "Hello! \xF0\x9F\x91\x8B", "Simple greeting.", "");
    /* a preamble to the user, then two calls */
    expect(TC_HARMONY,
           "<|channel|>commentary<|message|>Looking both up.<|end|><|start|>assistant<|channel|>commentary "
           "to=functions.a <|constrain|>json<|message|>{\"n\": [1, {\"m\": \"\xC3\xB1\"}]}<|call|><|start|>assistant"
           "<|channel|>commentary to=functions.b json<|message|>{}<|call|>",
           "Looking both up.", "", "a({\"n\":[1,{\"m\":\"\xC3\xB1\"}]})|b({})");
    expect(TC_HARMONY, "<|channel|>final<|message|>Cut off here", "Cut off here", "", "");
    expect(TC_HARMONY, "Plain text.", "Plain text.", "", "");
    expect_text(TC_HARMONY, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{bad<|call|>");
    expect_text(TC_HARMONY, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ");
    expect_text(TC_HARMONY, "<|channel|>final never a message");
}

/* ---- DeepSeek ---- */

#define DS_CALLS "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALLS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_CALL "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"

static void test_deepseek(void)
{
    /* V3.1 (its template's rendering) */
    expect(TC_DEEPSEEK, DS_CALLS DS_CALL "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END DS_CALLS_END, "", "",
           "get_weather({\"city\":\"Paris\"})");
    /* reasoning opened by the prompt, text, two calls */
    expect(TC_DEEPSEEK | TC_THINK | TC_THINK_OPEN,
           "The user asks for two cities.</think>Checking." DS_CALLS DS_CALL "get_weather" DS_SEP "{\"city\": \"Paris\"}"
           DS_CALL_END DS_CALL "get_weather" DS_SEP "{\"city\": \"\xE6\x9D\xB1\xE4\xBA\xAC\", \"opts\": {\"u\": [\"c\"]}}"
           DS_CALL_END DS_CALLS_END,
           "Checking.", "The user asks for two cities.",
           "get_weather({\"city\":\"Paris\"})|get_weather({\"city\":\"\xE6\x9D\xB1\xE4\xBA\xAC\",\"opts\":{\"u\":[\"c\"]}})");
    /* R1 (the distills' template) */
    expect(TC_DEEPSEEK, DS_CALLS DS_CALL "function" DS_SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DS_CALL_END DS_CALLS_END,
           "", "", "get_weather({\"city\":\"Paris\"})");
    /* the block's end left out (the reply stopped after the call) */
    expect(TC_DEEPSEEK, DS_CALLS DS_CALL "f" DS_SEP "{}" DS_CALL_END, "", "", "f({})");
    expect_text(TC_DEEPSEEK, DS_CALLS DS_CALL "get_weather" DS_SEP "{\"city\": Paris}" DS_CALL_END DS_CALLS_END);
    expect_text(TC_DEEPSEEK, DS_CALLS DS_CALL "get_weather" DS_SEP "{\"city\": \"Par");
    expect_text(TC_DEEPSEEK, "Text " DS_CALLS "no call here");
    expect_text(TC_DEEPSEEK, "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls");
}

/* ---- Functionary v3.2 ---- */

static void test_functionary(void)
{
    /* the prompt ends in ">>>" (its template's generation prompt) */
    expect(TC_FUNCTIONARY, "get_weather\n{\"city\": \"Paris\"}", "", "", "get_weather({\"city\":\"Paris\"})");
    expect(TC_FUNCTIONARY, "all\nLet me check.>>>get_weather\n{\"city\": \"Paris\"}>>>get_time\n{\"tz\": \"\xC3\x86\"}", "Let me check.",
           "", "get_weather({\"city\":\"Paris\"})|get_time({\"tz\":\"\xC3\x86\"})");
    expect(TC_FUNCTIONARY, "all\nJust text, with a >>> b inside.", "Just text, with a >>> b inside.", "", "");
    expect(TC_FUNCTIONARY, "python\nprint(1)", "", "", "python({\"code\":\"print(1)\"})");
    expect_text(TC_FUNCTIONARY, "get_weather\n{\"city\": ");
    expect_text(TC_FUNCTIONARY, "Hello there");
    expect_text(TC_FUNCTIONARY, "get_weather\nnot json");
}

/* ---- plain text and exactness ---- */

static void test_plain_exact(void)
{
    expect_text(TC_PLAIN, "Hello <tool_call>{x}</tool_call> [TOOL_CALLS] <think> \n\n ");
    expect_text(TC_PLAIN, "");
    /* random valid UTF-8 with marker pieces: every byte comes back, for every format */
    static const char *const bits[] = { "a", " ", "\n", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x99\x82", "<", ">", "{", "}",
        "\"", "[", "]", "<tool_", "call>", "[TOOL_", "CALLS]", "<|", "|>", "python_tag", ">>", "\xEF\xBD\x9C", "tool" };
    for (int t = 0; t < 200; t++) {
        char text[256];
        size_t n = 0;
        int words = 1 + (int)(rnd() % 40);
        for (int w = 0; w < words; w++) {
            const char *b = bits[rnd() % (sizeof bits / sizeof *bits)];
            if (n + strlen(b) >= sizeof text) break;
            memcpy(text + n, b, strlen(b));
            n += strlen(b);
        }
        text[n] = 0;
        col c;
        parse(TC_PLAIN, text, 1 + (int)(rnd() % 5), &c);
        CHECKF(!strcmp(S(&c.content), text), "plain \"%s\" -> \"%s\"", text, S(&c.content));
        CHECK_EQ_INT(c.bad_piece, 0);
        col_free(&c);
        /* other formats: no piece that is not whole UTF-8, arguments always JSON */
        for (int f = TC_HERMES; f <= TC_FUNCTIONARY; f++) {
            parse((tc_format)(f | TC_THINK), text, 1 + (int)(rnd() % 5), &c);
            CHECK_EQ_INT(c.bad_piece, 0);
            CHECK_EQ_INT(c.bad_args, 0);
            col_free(&c);
        }
    }
}

/* A reply cut anywhere before its call is complete comes back as the text
 * it is, byte for byte, fed whole and a byte at a time. */
static void test_prefixes(void)
{
    static const struct { int fmt; const char *text; } full[] = {
        { TC_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xC3\xBCrich\"}}\n</tool_call>" },
        { TC_HERMES, "<tool_call>\n<function=f>\n<parameter=x>\n\xE2\x82\xAC\n</parameter>\n</function>\n</tool_call>" },
        { TC_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}" },
        { TC_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": [1]}, \"id\": \"abc123def\"}]" },
        { TC_MISTRAL, "[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]{\"city\": \"Paris\"}" },
        { TC_HARMONY, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": [1, \"\xC3\xA9\"]}" },
        { TC_DEEPSEEK, DS_CALLS DS_CALL "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END },
        { TC_FUNCTIONARY, "get_weather\n{\"city\": \"Paris\"}" },
    };
    for (size_t k = 0; k < sizeof full / sizeof *full; k++) {
        size_t n = strlen(full[k].text);
        for (size_t cut = 0; cut < n; cut++) {
            if (((unsigned char)full[k].text[cut] & 0xC0) == 0x80) continue;   /* whole characters only */
            char *pre = strndup(full[k].text, cut);
            for (int split = 0; split < 2; split++) {
                col c;
                parse((tc_format)full[k].fmt, pre, split, &c);
                CHECKF(!strcmp(S(&c.content), pre) && !c.calls.n && !c.reasoning.n,
                       "[%s] cut at %zu: content \"%s\" calls \"%s\"", tc_format_name((tc_format)full[k].fmt), cut,
                       S(&c.content), S(&c.calls));
                CHECK_EQ_INT(c.bad_piece, 0);
                col_free(&c);
            }
            free(pre);
        }
        col c;
        parse((tc_format)full[k].fmt, full[k].text, 1, &c);
        CHECKF(c.calls.n && !c.content.n, "[%s] whole: calls \"%s\" content \"%s\"",
               tc_format_name((tc_format)full[k].fmt), S(&c.calls), S(&c.content));
        col_free(&c);
    }
}

/* Content is streamed: text before a marker is out before the call ends. */
static void test_streaming(void)
{
    col c = {0};
    tc_parser *p = tc_new(TC_HERMES);
    tc_callbacks cb = { on_content, on_reasoning, on_call, &c };
    const char *a = "Hello world, checking <tool_c";
    tc_feed(p, a, strlen(a), &cb);
    CHECK(!strcmp(S(&c.content), "Hello world, checking"));
    const char *b = "all>{\"name\": \"f\"}</tool_call>";
    tc_feed(p, b, strlen(b), &cb);
    CHECK(!strcmp(S(&c.calls), "f({})"));   /* reported before the reply ends */
    tc_finish(p, &cb);
    /* the parser takes a new reply after tc_finish */
    col_free(&c);
    const char *d = "again";
    tc_feed(p, d, strlen(d), &cb);
    tc_finish(p, &cb);
    CHECK(!strcmp(S(&c.content), "again"));
    tc_free(p);
    col_free(&c);
    /* a split UTF-8 character is held until whole */
    p = tc_new(TC_PLAIN);
    tc_feed(p, "x\xE2\x82", 3, &cb);
    CHECK(!strcmp(S(&c.content), "x"));
    tc_feed(p, "\xAC", 1, &cb);
    CHECK(!strcmp(S(&c.content), "x\xE2\x82\xAC"));
    tc_finish(p, &cb);
    tc_free(p);
    col_free(&c);
    /* NULL callbacks drop */
    p = tc_new(TC_HERMES);
    tc_callbacks none = { 0, 0, 0, 0 };
    const char *e = "hi <tool_call>{\"name\": \"f\"}</tool_call>";
    CHECK(tc_feed(p, e, strlen(e), &none) == 0 && tc_finish(p, &none) == 0);
    CHECK(tc_feed(p, e, strlen(e), NULL) == 0 && tc_finish(p, NULL) == 0);
    tc_free(p);
}

/* ---- detection on the real templates ---- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static void test_detect(void)
{
    static const struct { const char *file; int fmt; } want[] = {
        { "GLM-4.6", TC_HERMES | TC_THINK },
        { "Qwen-Qwen2.5-7B-Instruct", TC_HERMES },
        { "Qwen-Qwen3-0.6B", TC_HERMES | TC_THINK },
        { "Qwen-QwQ-32B", TC_HERMES | TC_THINK },
        { "Qwen3-Coder", TC_HERMES },
        { "Qwen3.5-4B", TC_HERMES | TC_THINK },
        { "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", TC_HERMES },
        { "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", TC_HERMES },
        { "meta-llama-Llama-3.1-8B-Instruct", TC_LLAMA3 },
        { "meta-llama-Llama-3.2-3B-Instruct", TC_LLAMA3 },
        { "meta-llama-Llama-3.3-70B-Instruct", TC_LLAMA3 },
        { "mistralai-Mistral-Nemo-Instruct-2407", TC_MISTRAL },
        { "Mistral-Small-3.2-24B-Instruct-2506", TC_MISTRAL },
        { "unsloth-mistral-Devstral-Small-2507", TC_MISTRAL },
        { "mistralai-Ministral-3-14B-Reasoning-2512", TC_MISTRAL | TC_THINK },
        { "openai-gpt-oss-120b", TC_HARMONY },
        { "deepseek-ai-DeepSeek-V3.1", TC_DEEPSEEK | TC_THINK },
        { "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", TC_DEEPSEEK | TC_THINK },
        { "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", TC_DEEPSEEK | TC_THINK },
        { "meetkai-functionary-medium-v3.2", TC_FUNCTIONARY },
        { "google-gemma-2-2b-it", TC_PLAIN },
        { "microsoft-Phi-3.5-mini-instruct", TC_PLAIN },
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/chat/templates/%s.jinja", want[i].file);
        char *src = slurp(path);
        CHECKF(src, "%s", path);
        if (!src) continue;
        tc_format f = tc_detect(src);
        CHECKF((int)f == want[i].fmt, "%s: %s %#x, want %#x", want[i].file, tc_format_name(f), (unsigned)f, (unsigned)want[i].fmt);
        free(src);
    }
    CHECK(tc_detect(NULL) == TC_PLAIN);
    CHECK(tc_detect("{{ messages }}") == TC_PLAIN);
    CHECK(!strcmp(tc_format_name(TC_DEEPSEEK | TC_THINK), "deepseek"));
    /* the prompt left a block open */
    const char *open = "<|im_start|>assistant\n<think>\n";
    const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(tc_after_prompt(TC_HERMES | TC_THINK, open, strlen(open)) == (TC_HERMES | TC_THINK | TC_THINK_OPEN));
    CHECK(tc_after_prompt(TC_HERMES | TC_THINK, closed, strlen(closed)) == (TC_HERMES | TC_THINK));
    CHECK(tc_after_prompt(TC_HERMES, open, strlen(open)) == TC_HERMES);
    CHECK(tc_after_prompt(TC_MISTRAL | TC_THINK, "[THINK]", 7) == (TC_MISTRAL | TC_THINK | TC_THINK_OPEN));
}

/* ---- the templates' own renderings of a call (tests/fixtures/chat) ---- */

static void test_renders(void)
{
    /* the assistant turn holding the call, cut out of the "tool call with
     * its result" rendering (case 5) between these strings */
    static const struct { const char *tpl, *after, *before; } cut[] = {
        { "Qwen-Qwen2.5-7B-Instruct.jinja", "Paris?<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>" },
        { "Qwen-Qwen3-0.6B.jinja", "Paris?<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>" },
        { "Qwen3-Coder.jinja", "Paris?<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>" },
        { "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "Paris?<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>" },
        { "meta-llama-Llama-3.1-8B-Instruct.jinja", "Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>" },
        { "meta-llama-Llama-3.2-3B-Instruct.jinja", "Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>" },
        { "meta-llama-Llama-3.3-70B-Instruct.jinja", "Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>" },
        { "mistralai-Ministral-3-14B-Reasoning-2512.jinja", "Paris?[/INST]", "</s>" },
        { "deepseek-ai-DeepSeek-V3.1.jinja", "<think></think>", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>" },
        { "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "Paris?<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>",
          "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>" },
        { "openai-gpt-oss-120b.jinja", "Paris?<|end|><|start|>assistant", "<|start|>functions" },
        { "GLM-4.6.jinja", "Paris?<|assistant|>\n<think></think>\n", "<|observation|>" },
        { "GLM-4.7-Flash.jinja", "Paris?<|assistant|></think>", "<|observation|>" },
    };
    json_error_t je;
    json_t *root = json_load_file("bin/fixtures/chat/renders.dev.json", 0, &je);
    CHECKF(root, "bin/fixtures/chat/renders.dev.json: %s (make fixtures)", je.text);
    if (!root) return;
    json_t *cases = json_object_get(root, "cases");
    size_t done = 0;
    for (size_t k = 0; k < sizeof cut / sizeof *cut; k++) {
        const char *text = NULL, *src = NULL;
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *e = json_array_get(cases, i);
            if (strcmp(json_string_value(json_object_get(e, "template")) ?: "", cut[k].tpl) ||
                json_integer_value(json_object_get(e, "case")) != 5)
                continue;
            text = json_string_value(json_object_get(e, "text"));
        }
        CHECKF(text, "%s: no rendering of case 5", cut[k].tpl);
        if (!text) continue;
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/chat/templates/%s", cut[k].tpl);
        char *tsrc = slurp(path);
        src = tsrc;
        const char *a = strstr(text, cut[k].after);
        CHECKF(a, "%s: \"%s\" not in the rendering", cut[k].tpl, cut[k].after);
        if (!a || !src) { free(tsrc); continue; }
        a += strlen(cut[k].after);
        const char *b = strstr(a, cut[k].before);
        CHECKF(b, "%s: no end", cut[k].tpl);
        if (!b) { free(tsrc); continue; }
        char *reply = strndup(a, (size_t)(b - a));
        tc_format f = tc_after_prompt(tc_detect(src), text, (size_t)(a - text));
        f = (tc_format)(f & ~TC_THINK_OPEN);   /* the reply is cut out after the prompt's think block */
        for (int split = 0; split < 3; split++) {
            col c;
            parse(f, reply, split, &c);
            CHECKF(!strcmp(S(&c.calls), "get_weather({\"city\":\"Paris\"})"), "%s: calls \"%s\" from \"%s\"",
                   cut[k].tpl, S(&c.calls), reply);
            CHECKF(!c.content.n && !c.reasoning.n, "%s: content \"%s\" reasoning \"%s\"", cut[k].tpl, S(&c.content),
                   S(&c.reasoning));
            col_free(&c);
        }
        done++;
        free(reply);
        free(tsrc);
    }
    CHECK_EQ_INT(done, sizeof cut / sizeof *cut);
    json_decref(root);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_hermes);
    RUN(test_qwen3_coder);
    RUN(test_think);
    RUN(test_no_calls);
    RUN(test_llama3);
    RUN(test_mistral);
    RUN(test_ids);
    RUN(test_harmony);
    RUN(test_deepseek);
    RUN(test_functionary);
    RUN(test_plain_exact);
    RUN(test_prefixes);
    RUN(test_streaming);
    RUN(test_detect);
    RUN(test_renders);
    return CHECK_DONE();
}
