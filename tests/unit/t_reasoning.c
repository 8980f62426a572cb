/* t_reasoning — reasoning apart from the reply's text, through the engine's
 * public header, on qwen2-tiny with real chat templates (Qwen3, Qwen3.5,
 * gpt-oss) given as the chat template and a grammar that makes the reply a
 * known text: the text and reasoning each mode gives, the same ids either
 * way, stop strings and max_tokens inside the reasoning, a prompt that
 * opens the block, keep_reasoning's effect on the rendered prompt, and
 * template_vars (enable_thinking). */
#include "engine/engine.h"
#include "tests/check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL FIXTURE("models/qwen2-tiny.bf16.gguf")
#define TPL(f) FIXTURE("chat/templates/" f)

typedef struct res {
    int32_t ids[256];
    int n;
    char text[2048], reason[2048];
    size_t text_len, reason_len;
    int done, error;
    eng_finish finish;
    int prompt_tokens;
    char err[256];
} res;

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[n] = 0; *len = (size_t)n; }
    return b;
}

/* The model with the template file path as its chat template (or the text src). */
static eng *open_with(const char *path, const char *src)
{
    size_t len = 0;
    char *owned = src ? NULL : slurp(path, &len);
    if (src) len = strlen(src);
    const char *text = src ? src : owned;
    if (!text) { fprintf(stderr, "cannot read %s\n", path); return NULL; }
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = MODEL;
    o.n_threads = 2;
    o.max_seqs = 2;
    o.chat_template = text;
    o.chat_template_len = len;
    o.chat_template_name = path ? path : "inline";
    if (eng_open(&e, &o, err, sizeof err)) fprintf(stderr, "eng_open: %s\n", err);
    free(owned);
    return e;
}

static void run_job(eng *e, eng_job_desc *d, res *r)
{
    memset(r, 0, sizeof *r);
    uint64_t id;
    eng_err code;
    d->kind = ENG_JOB_GENERATE;
    d->user = r;
    if (eng_submit(e, d, &id, &code, r->err, sizeof r->err)) { r->error = 1; return; }
    for (int spins = 0; !r->done && !r->error && spins < 400000; spins++) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(500); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            if (ev->type == ENG_EV_TOKEN) {
                if (r->n < 256) r->ids[r->n++] = ev->token;
                if (r->text_len + ev->text_len < sizeof r->text) {
                    memcpy(r->text + r->text_len, ev->text, ev->text_len);
                    r->text_len += ev->text_len;
                }
                if (ev->reasoning && r->reason_len + ev->reasoning_len < sizeof r->reason) {
                    memcpy(r->reason + r->reason_len, ev->reasoning, ev->reasoning_len);
                    r->reason_len += ev->reasoning_len;
                }
            } else if (ev->type == ENG_EV_DONE) {
                r->done = 1;
                r->finish = ev->finish;
                r->prompt_tokens = ev->prompt_tokens;
            } else if (ev->type == ENG_EV_ERROR) {
                r->error = 1;
                snprintf(r->err, sizeof r->err, "%s", ev->message);
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
    if (r->error) fprintf(stderr, "job: %s\n", r->err);
}

static const eng_msg USER_HI[] = { { "user", 4, "Hi", 2, NULL, 0 } };

/* A generate of msgs (or of text when msgs is NULL) whose reply is the grammar's. */
static void gen(eng *e, const eng_msg *msgs, size_t nm, const char *text, int raw, const char *grammar,
                int reasoning, int max_tokens, const char *stop, res *r)
{
    eng_job_desc d = { 0 };
    d.msgs = msgs;
    d.n_msgs = nm;
    if (!msgs) { d.text = text; d.text_len = strlen(text); d.raw = raw; }
    d.grammar = grammar;
    d.grammar_len = grammar ? strlen(grammar) : 0;
    d.reasoning = reasoning;
    d.max_tokens = max_tokens;
    size_t sl = stop ? strlen(stop) : 0;
    const char *stops[1] = { stop };
    if (stop) { d.stop = stops; d.stop_len = &sl; d.n_stop = 1; }
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    run_job(e, &d, r);
}

static int same_ids(const res *a, const res *b)
{
    return a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids);
}

#define REPLY "<think>\\nplan it\\n</think>\\n\\nHello there."

static void test_qwen3(void)
{
    eng *e = open_with(TPL("Qwen-Qwen3-0.6B.jinja"), NULL);
    if (!e) { CHECK(0); return; }
    const char *g = "root ::= \"" REPLY "\"";
    res split, raw, dflt, text, rawtext, toks;
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_SPLIT, 64, NULL, &split);
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_AUTO, 64, NULL, &dflt);
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_RAW, 64, NULL, &raw);
    CHECK(split.done && raw.done && dflt.done);
    CHECKF(!strcmp(split.text, "Hello there.") && !strcmp(split.reason, "plan it"), "split: text \"%s\" reasoning \"%s\"",
           split.text, split.reason);
    CHECKF(!strcmp(dflt.text, "Hello there.") && !strcmp(dflt.reason, "plan it"), "messages default to split: \"%s\" \"%s\"",
           dflt.text, dflt.reason);
    CHECKF(!strcmp(raw.text, "<think>\nplan it\n</think>\n\nHello there.") && raw.reason_len == 0,
           "raw: text \"%s\" reasoning \"%s\"", raw.text, raw.reason);
    CHECK(same_ids(&split, &raw) && same_ids(&split, &dflt));
    CHECK(split.finish == ENG_FINISH_EOS && raw.finish == ENG_FINISH_EOS);
    /* a text prompt through the template splits too; raw text and ids do not, unless asked */
    gen(e, NULL, 0, "Hi", 0, g, ENG_REASONING_AUTO, 64, NULL, &text);
    CHECKF(!strcmp(text.text, "Hello there.") && !strcmp(text.reason, "plan it"), "templated text prompt: \"%s\"", text.text);
    gen(e, NULL, 0, "Hi", 1, g, ENG_REASONING_AUTO, 64, NULL, &rawtext);
    CHECKF(!strcmp(rawtext.text, "<think>\nplan it\n</think>\n\nHello there.") && rawtext.reason_len == 0,
           "raw prompt: \"%s\"", rawtext.text);
    gen(e, NULL, 0, "Hi", 1, g, ENG_REASONING_SPLIT, 64, NULL, &toks);
    CHECKF(!strcmp(toks.text, "Hello there.") && !strcmp(toks.reason, "plan it"), "raw prompt, split asked: \"%s\"", toks.text);
    /* a stop string inside the reasoning: the same tokens as raw, nothing after it */
    res s1, s2;
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_SPLIT, 64, " it", &s1);
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_RAW, 64, " it", &s2);
    CHECK(s1.finish == ENG_FINISH_STOP && s2.finish == ENG_FINISH_STOP && same_ids(&s1, &s2));
    CHECKF(s1.text_len == 0 && !strcmp(s1.reason, "plan") && !strcmp(s2.text, "<think>\nplan"),
           "stop in reasoning: text \"%s\" reasoning \"%s\" raw \"%s\"", s1.text, s1.reason, s2.text);
    /* max_tokens inside the reasoning: what was reasoned comes out */
    res m1, m2;
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_SPLIT, 4, NULL, &m1);
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_RAW, 4, NULL, &m2);
    CHECK(m1.finish == ENG_FINISH_LENGTH && m1.n == 4 && same_ids(&m1, &m2));
    CHECKF(m1.text_len == 0 && m1.reason_len > 0 && strstr(m2.text, m1.reason) != NULL,
           "cut in reasoning: text \"%s\" reasoning \"%s\" raw \"%s\"", m1.text, m1.reason, m2.text);
    /* a bad mode */
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_GENERATE;
    d.msgs = USER_HI;
    d.n_msgs = 1;
    d.reasoning = 7;
    eng_sampling_default(&d.sampling);
    uint64_t id;
    eng_err code = ENG_OK;
    char err[256] = "";
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) != 0 && code == ENG_EINVAL && strstr(err, "\"reasoning\""));
    eng_close(e);
}

/* Qwen3.5's prompt opens the block: the reply starts inside it */
static void test_open_block(void)
{
    eng *e = open_with(TPL("Qwen3.5-4B.jinja"), NULL);
    if (!e) { CHECK(0); return; }
    res a, b;
    gen(e, USER_HI, 1, NULL, 0, "root ::= \"plan\\n</think>\\n\\nHi.\"", ENG_REASONING_AUTO, 64, NULL, &a);
    gen(e, USER_HI, 1, NULL, 0, "root ::= \"plan\\n</think>\\n\\nHi.\"", ENG_REASONING_RAW, 64, NULL, &b);
    CHECKF(!strcmp(a.text, "Hi.") && !strcmp(a.reason, "plan"), "open block: text \"%s\" reasoning \"%s\"", a.text, a.reason);
    CHECKF(!strcmp(b.text, "plan\n</think>\n\nHi.") && b.reason_len == 0, "open block raw: \"%s\"", b.text);
    CHECK(same_ids(&a, &b));
    eng_close(e);
}

/* gpt-oss's template: the analysis message is reasoning, the final one text */
static void test_harmony(void)
{
    eng *e = open_with(TPL("openai-gpt-oss-120b.jinja"), NULL);
    if (!e) { CHECK(0); return; }
    const char *g = "root ::= \"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi.\"";
    res a, b;
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_AUTO, 96, NULL, &a);
    gen(e, USER_HI, 1, NULL, 0, g, ENG_REASONING_RAW, 96, NULL, &b);
    CHECKF(!strcmp(a.text, "Hi.") && !strcmp(a.reason, "Think."), "harmony: text \"%s\" reasoning \"%s\"", a.text, a.reason);
    CHECKF(strstr(b.text, "analysis") && strstr(b.text, "Think.") && b.reason_len == 0, "harmony raw: \"%s\"", b.text);
    CHECK(same_ids(&a, &b));
    eng_close(e);
}

/* keep_reasoning: an assistant turn's reasoning_content reaches the template
 * only when kept (Qwen3 renders it for turns after the last user message) */
static void test_keep(void)
{
    static const char tpl[] =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";
    const char *files[] = { TPL("Qwen-Qwen3-0.6B.jinja"), NULL };
    for (int f = 0; f < 2; f++) {
        eng *e = open_with(files[f], files[f] ? NULL : tpl);
        if (!e) { CHECK(0); return; }
        static const char call[] = "{\"reasoning_content\": \"The user wants the weather in Paris, so I call the tool.\", "
                                   "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": "
                                   "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}";
        eng_msg conv[] = { { "user", 4, "Weather in Paris?", 17, NULL, 0 },
                           { "assistant", 9, "", 0, call, sizeof call - 1 },
                           { "tool", 4, "sunny", 5, NULL, 0 } };
        int pt[2];
        for (int keep = 0; keep < 2; keep++) {
            eng_job_desc d = { 0 };
            d.msgs = conv;
            d.n_msgs = 3;
            d.keep_reasoning = keep;
            d.max_tokens = 1;
            eng_sampling_default(&d.sampling);
            d.sampling.temperature = 0;
            res r;
            run_job(e, &d, &r);
            CHECK(r.done);
            pt[keep] = r.prompt_tokens;
        }
        CHECKF(pt[1] > pt[0] + 10, "%s: kept reasoning is rendered: %d vs %d prompt tokens", files[f] ? files[f] : "inline",
               pt[1], pt[0]);
        eng_close(e);
    }
}

/* template_vars: {"enable_thinking": false} closes the block in the
 * prompt (Qwen3.5: the reply is then text, not reasoning; Qwen3: an empty
 * block is written); the request's own variables may not be among them,
 * and a text that is not an object is an error event naming them. */
static void test_template_vars(void)
{
    const char *off = "{\"enable_thinking\": false}";
    eng *e = open_with(TPL("Qwen3.5-4B.jinja"), NULL);
    if (!e) { CHECK(0); return; }
    res on, no;
    eng_job_desc d = { 0 };
    d.msgs = USER_HI;
    d.n_msgs = 1;
    d.grammar = "root ::= \"Hi.\"";
    d.grammar_len = strlen(d.grammar);
    d.max_tokens = 16;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    run_job(e, &d, &on);
    d.template_vars = off;
    d.template_vars_len = strlen(off);
    run_job(e, &d, &no);
    CHECK(on.done && no.done);
    CHECKF(!strcmp(on.reason, "Hi.") && on.text_len == 0, "thinking: text \"%s\" reasoning \"%s\"", on.text, on.reason);
    CHECKF(!strcmp(no.text, "Hi.") && no.reason_len == 0, "enable_thinking false: text \"%s\" reasoning \"%s\"", no.text,
           no.reason);
    CHECKF(no.prompt_tokens > on.prompt_tokens, "the closed block is in the prompt: %d vs %d", no.prompt_tokens,
           on.prompt_tokens);
    /* a text prompt through the template takes them too */
    eng_job_desc t = d;
    t.msgs = NULL;
    t.n_msgs = 0;
    t.text = "Hi";
    t.text_len = 2;
    res tx;
    run_job(e, &t, &tx);
    CHECKF(tx.done && !strcmp(tx.text, "Hi.") && tx.prompt_tokens == no.prompt_tokens, "text prompt: \"%s\" %d",
           tx.text, tx.prompt_tokens);
    /* not an object; a variable of the request's own */
    const char *bad[2] = { "[1, 2]", "{\"messages\": []}" };
    for (int b = 0; b < 2; b++) {
        res r;
        d.template_vars = bad[b];
        d.template_vars_len = strlen(bad[b]);
        run_job(e, &d, &r);
        CHECKF(r.error && strstr(r.err, "template_vars"), "%s: %s", bad[b], r.err);
    }
    eng_close(e);
    e = open_with(TPL("Qwen-Qwen3-0.6B.jinja"), NULL);
    if (!e) { CHECK(0); return; }
    d.template_vars = NULL;
    d.template_vars_len = 0;
    run_job(e, &d, &on);
    d.template_vars = off;
    d.template_vars_len = strlen(off);
    run_job(e, &d, &no);
    CHECKF(on.done && no.done && no.prompt_tokens > on.prompt_tokens, "Qwen3: %d vs %d prompt tokens", no.prompt_tokens,
           on.prompt_tokens);
    eng_close(e);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_qwen3);
    RUN(test_open_block);
    RUN(test_harmony);
    RUN(test_keep);
    RUN(test_template_vars);
    return CHECK_DONE();
}
