/* tools.h — the OpenAI tool and reasoning fields of a chat completion
 * request, turned into aned's (tools, tool_choice, parallel_tool_calls; a
 * message's tool_calls, tool_call_id, name and reasoning_content;
 * reasoning_format and keep_reasoning). */
#ifndef ANE_HTTP_TOOLS_H
#define ANE_HTTP_TOOLS_H

#include <jansson.h>
#include <stddef.h>

struct proto_req;

/* Reads tools, tool_choice and parallel_tool_calls of body o into q;
 * *tools_json (malloc'd, the caller frees after sending) holds the tools'
 * JSON text. -1 with *param and msg for a 400 (param points into static
 * text or into o). */
int gwt_request(json_t *o, struct proto_req *q, char **tools_json, const char **param, char *msg, size_t msglen);

/* reasoning_format ("auto" or "deepseek": reasoning apart, in
 * reasoning_content; "none": left in the content as generated) and
 * keep_reasoning (assistant messages' reasoning_content given to the
 * template) of body o into q. -1 with *param and msg for a 400. */
int gwt_reasoning(json_t *o, struct proto_req *q, const char **param, char *msg, size_t msglen);

/* chat_template_kwargs of body o (an object of further variables for the
 * chat template, e.g. {"enable_thinking": false}) into q as JSON text in
 * *vars_json (malloc'd; NULL when absent). -1 with *param and msg for a 400. */
int gwt_template_vars(json_t *o, struct proto_req *q, char **vars_json, const char **param, char *msg,
                      size_t msglen);

/* A message's keys other than role and content, as JSON object text
 * (malloc'd), or NULL with *bad = 0 when it has none; *bad = 1, msg and
 * *field (the key at fault) when its tool_calls are malformed or its
 * reasoning_content is not a string. */
char *gwt_msg_extra(json_t *m, size_t i, int *bad, const char **field, char *msg, size_t msglen);

#endif
