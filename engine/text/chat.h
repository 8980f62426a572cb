/* chat.h — chat templates (engine-internal).
 *
 * The model's template source (GGUF tokenizer.chat_template or
 * tokenizer_config.json) is recognised as one of the formats we render
 * natively; anything else is CHAT_NONE (prompts then go in raw, and the
 * engine reports a warning in info). Template text is tokenized with special
 * tokens parsed; user and system content never is, so a user cannot forge
 * "<|im_end|>" into a turn boundary. */
#ifndef ANE_CHAT_H
#define ANE_CHAT_H

#include <stddef.h>
#include <stdint.h>

struct tok;

typedef enum chat_kind { CHAT_NONE = 0, CHAT_CHATML, CHAT_LLAMA3 } chat_kind;

chat_kind chat_detect(const char *template_src);
const char *chat_kind_name(chat_kind k);   /* "none", "chatml", "llama3" */

typedef struct chat_msg {
    const char *role;      /* "system", "user", "assistant" */
    const char *content;
    size_t content_len;
} chat_msg;

/* Renders msgs and, when add_assistant, the opening of the assistant turn,
 * to token ids (BOS included when the tokenizer uses one). *ids malloc'd.
 * CHATML: when msgs do not open with a system message and the template has a
 * literal default one (Qwen2.5's "You are Qwen, created by Alibaba Cloud..."),
 * that system turn is rendered first, as the template does. LLAMA3: contents
 * are trimmed (the template's "| trim"); BOS always opens the prompt.
 * CHAT_NONE: the contents as plain text, one per line, BOS per tok_add_bos. */
int chat_encode(const struct tok *t, chat_kind k, const chat_msg *msgs, size_t n,
                int add_assistant, int32_t **ids, size_t *n_ids, char *err, size_t errlen);

/* The literal default system message of a ChatML template (written to buf,
 * NUL-terminated); its length, or -1 when the template has none. */
int chat_default_system(const char *template_src, char *buf, size_t cap);

#endif
