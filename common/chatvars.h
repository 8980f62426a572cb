/* chatvars.h — the chat template variables a request sets itself. A
 * request's further variables (the protocol's template_vars, aned-http's
 * chat_template_kwargs) may not name them: the engine, the protocol and
 * the gateway refuse them by this one list. */
#ifndef ANE_COMMON_CHATVARS_H
#define ANE_COMMON_CHATVARS_H

#include <stddef.h>
#include <string.h>

/* key (len bytes) when it is one of them (messages, tools,
 * add_generation_prompt), as its name; else NULL */
static inline const char *chat_own_var(const char *key, size_t len)
{
    static const char *const own[] = { "messages", "tools", "add_generation_prompt" };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strlen(own[i]) == len && memcmp(key, own[i], len) == 0) return own[i];
    return NULL;
}

#endif
