/* toolcall.h — tool calls and reasoning in generated text, parsed as it
 * streams.
 *
 * The model's chat template tells which syntax its tool calls use
 * (tc_detect looks for the markers the template writes). A parser is fed the
 * generated text in pieces of any size — a piece may end inside a marker or
 * inside a UTF-8 character — and reports, through callbacks:
 *   - content text, as soon as it cannot be the start of a call or marker;
 *   - reasoning text (<think>...</think>, [THINK]...[/THINK], gpt-oss's
 *     analysis channel), when the format has it;
 *   - each tool call, once it is complete and valid: its name, its arguments
 *     as compact valid JSON text, and an id.
 * Text pieces handed to callbacks end on whole UTF-8 characters (given valid
 * input). A call that turns out malformed, and anything left open at
 * tc_finish, comes back as content text exactly as generated: nothing is
 * lost. Markers that were understood (tags, channel headers) are not
 * repeated as text; whitespace that only separates markers or calls from
 * each other is dropped.
 *
 * Formats:
 *   TC_HERMES      <tool_call>{"name": N, "arguments": {...}}</tool_call>
 *                  (Hermes, Qwen 2.5/3); inside the same tags, Qwen3-Coder's
 *                  <function=N><parameter=P>V</parameter>...</function>
 *                  (V is taken as JSON when it parses as a number, true,
 *                  false, null, an object or an array; as a string otherwise),
 *                  and GLM 4.5-4.7's N<arg_key>K</arg_key><arg_value>V</arg_value>
 *                  (values read the same way)
 *   TC_LLAMA3      {"name": N, "parameters": {...}} as the whole reply
 *                  (several separated by ';' or newlines), or after
 *                  <|python_tag|>: the same JSON, a builtin NAME.call(k="v"),
 *                  or code (a call "python" with {"code": ...})
 *   TC_MISTRAL     [TOOL_CALLS][{"name": N, "arguments": {...}, "id": I}, ...]
 *                  and [TOOL_CALLS]N[ARGS]{...} (optionally N[CALL_ID]I[ARGS])
 *   TC_HARMONY     gpt-oss: <|channel|>analysis = reasoning, final and
 *                  commentary without recipient = content, a message to=
 *                  functions.N = a call (<|start|>, <|end|>, <|call|>,
 *                  <|return|>, <|constrain|> understood)
 *   TC_DEEPSEEK    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}
 *                  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (V3.1), and R1's
 *                  function<｜tool▁sep｜>N\n```json\n{...}\n```
 *   TC_FUNCTIONARY v3.2: the prompt ends in ">>>"; the reply is NAME\n{...}
 *                  or all\nTEXT, further ones after ">>>"
 *   TC_PLAIN       no calls: all text is content.
 * Flags OR'ed into a format:
 *   TC_THINK       reasoning blocks <think>...</think> ([THINK]...[/THINK]
 *                  with TC_MISTRAL) are reasoning text
 *   TC_THINK_OPEN  the prompt already opened a reasoning block (the reply
 *                  starts inside it and closes it with </think>); see
 *                  tc_after_prompt.
 *   TC_NO_CALLS    reasoning alone (a reply without tools): the syntax's
 *                  calls are not looked for, their text is content; with
 *                  TC_HARMONY a message to a recipient is content too.
 *
 * Ids: a call's own id when the model wrote one (Mistral), otherwise a fresh
 * random one: "call_" and 24 letters and digits, or 9 letters and digits for
 * TC_MISTRAL (its templates accept no other). tc_seed makes them
 * reproducible. */
#ifndef ANE_TOOLCALL_H
#define ANE_TOOLCALL_H

#include <stddef.h>
#include <stdint.h>

typedef enum tc_format {
    TC_PLAIN = 0,
    TC_HERMES,
    TC_LLAMA3,
    TC_MISTRAL,
    TC_HARMONY,
    TC_DEEPSEEK,
    TC_FUNCTIONARY,
    TC_SYNTAX_MASK = 0xff,
    TC_THINK = 0x100,
    TC_THINK_OPEN = 0x200,
    TC_NO_CALLS = 0x400,
} tc_format;

typedef struct tc_call {
    const char *name;        /* not NUL-terminated; valid during the callback */
    size_t name_len;
    const char *arguments;   /* compact JSON (an object unless the model wrote another value) */
    size_t arguments_len;
    const char *id;
    size_t id_len;
} tc_call;

/* Any callback may be NULL: what it would get is dropped. */
typedef struct tc_callbacks {
    void (*content)(void *ctx, const char *text, size_t len);
    void (*reasoning)(void *ctx, const char *text, size_t len);
    void (*call)(void *ctx, const tc_call *call);
    void *ctx;
} tc_callbacks;

typedef struct tc_parser tc_parser;

/* The format (with TC_THINK when the template writes reasoning blocks) of a
 * chat template's source; TC_PLAIN when NULL or unrecognised. */
tc_format tc_detect(const char *template_src);

/* fmt with TC_THINK_OPEN added when the rendered prompt ends inside an open
 * reasoning block (its last <think> is not closed: DeepSeek R1, Qwen3 in
 * thinking mode); only when fmt has TC_THINK. */
tc_format tc_after_prompt(tc_format fmt, const char *prompt, size_t len);

/* "plain", "hermes", "llama3", "mistral", "harmony", "deepseek",
 * "functionary" (the flags are not named). */
const char *tc_format_name(tc_format fmt);

/* NULL only when out of memory. */
tc_parser *tc_new(tc_format fmt);
/* Ids from this seed instead of a random one. */
void tc_seed(tc_parser *p, uint64_t seed);
/* 0, or -1 when out of memory (the parser is then unusable). */
int tc_feed(tc_parser *p, const char *text, size_t len, const tc_callbacks *cb);
/* The end of the reply: whatever is held is resolved (complete calls
 * reported, anything else as content). The parser can then be freed, or fed
 * a new reply from the start. 0, or -1 when out of memory. */
int tc_finish(tc_parser *p, const tc_callbacks *cb);
/* Calls reported so far in this reply. */
size_t tc_n_calls(const tc_parser *p);
void tc_free(tc_parser *p);

#endif
