/* chat.h — chat prompts rendered with the model's own template
 * (engine-internal).
 *
 * The template source (GGUF tokenizer.chat_template, tokenizer_config.json's
 * chat_template, chat_template.jinja, or aned --chat-template FILE) is parsed
 * once with jinja.h and rendered per request the way transformers'
 * apply_chat_template does: variables messages, tools (when given),
 * add_generation_prompt, bos_token and eos_token (the model's own token
 * texts). The rendered text is tokenized with special tokens parsed, except
 * inside message contents found verbatim in it, so a user cannot forge
 * "<|im_end|>" into a turn boundary. */
#ifndef ANE_CHAT_H
#define ANE_CHAT_H

#include <stddef.h>
#include <stdint.h>

struct tok;
typedef struct chat_tpl chat_tpl;

/* Parses src (len bytes) for the tokenizer t (whose BOS/EOS texts become
 * bos_token/eos_token). NULL with err ("line N: ...") when it does not parse. */
chat_tpl *chat_open(const struct tok *t, const char *src, size_t len, char *err, size_t errlen);
void chat_free(chat_tpl *c);
const char *chat_source(const chat_tpl *c);   /* the template text, NUL-terminated */

typedef struct chat_msg {
    const char *role;         /* NUL-terminated */
    const char *content;      /* content_len bytes; may be NULL when content_len is 0 */
    size_t content_len;
    /* optional: the message's other keys (tool_calls, tool_call_id, name, ...)
     * as the text of a JSON object, merged into the message; NULL = none */
    const char *extra;
    size_t extra_len;
    int drop_reasoning;       /* 1: extra's reasoning_content is not given to the template */
} chat_msg;

/* Error codes (besides the tokenizer's TOK_E*). */
enum {
    CHAT_EINPUT = -20,   /* extra or tools is not valid JSON of the right shape */
    CHAT_ERENDER = -21,  /* the template raised, failed, or hit a bound */
};

/* The variables' JSON for msgs, tools (the text of a JSON array; NULL =
 * none) and add_generation_prompt = add_assistant, then vars (the text of a
 * JSON object of further variables, e.g. {"enable_thinking": false}; NULL =
 * none; messages, tools and add_generation_prompt may not be among them).
 * A function's "arguments" given as the text of a JSON object become that
 * object (templates tojson them; transformers expects a dict). *out
 * malloc'd. */
int chat_render(const chat_tpl *c, const chat_msg *msgs, size_t n, const char *tools, size_t tools_len,
                const char *vars, size_t vars_len, int add_assistant, char **out, size_t *out_len, char *err,
                size_t errlen);

/* chat_render, then the ids (BOS first when the tokenizer adds one and the
 * template did not write it). *ids malloc'd. 0, a TOK_E* or CHAT_E* code. */
int chat_encode(const struct tok *t, const chat_tpl *c, const chat_msg *msgs, size_t n,
                const char *tools, size_t tools_len, const char *vars, size_t vars_len, int add_assistant,
                int32_t **ids, size_t *n_ids, char *err, size_t errlen);

/* The special tokens the template ends an assistant turn with: the first
 * after a plain reply's text, and the last of a turn that calls a tool
 * (<|im_end|>, <|eot_id|>, <end_of_turn>, <|return|>, <|call|>, ...).
 * Writes at most cap ids; returns how many (0 when none were found). */
int chat_end_tokens(const struct tok *t, const chat_tpl *c, int32_t *ids, int cap);

#endif
