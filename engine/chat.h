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
 * to token ids (BOS included when the tokenizer uses one). *ids malloc'd. */
int chat_encode(const struct tok *t, chat_kind k, const chat_msg *msgs, size_t n,
                int add_assistant, int32_t **ids, size_t *n_ids, char *err, size_t errlen);

#endif
