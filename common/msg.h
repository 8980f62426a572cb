/* msg.h — one chat message ("system", "user", "assistant" or "tool") as
 * byte strings with lengths, not NUL-terminated. The protocol reads it
 * (proto_msg) and the engine renders it (eng_msg): one type, so a request's
 * messages go to the engine as they arrived. Installed beside proto.h. */
#ifndef ANE_COMMON_MSG_H
#define ANE_COMMON_MSG_H

#include <stddef.h>

typedef struct ane_msg {
    const char *role; size_t role_len;
    const char *content; size_t content_len;
    /* optional: its other keys (tool_calls, tool_call_id, name, ...) as the
     * text of a JSON object, given to the template with role and content;
     * NULL when it has none */
    const char *extra; size_t extra_len;
} ane_msg;

#endif
