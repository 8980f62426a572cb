/* tools.c — OpenAI tool fields to aned's (tools.h). */
#include "http/tools.h"
#include "common/chatvars.h"
#include "proto/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(const char **param, const char *p, char *msg, size_t n, const char *text)
{
    *param = p;
    snprintf(msg, n, "%s", text);
    return -1;
}

int gwt_request(json_t *o, struct proto_req *q, char **tools_json, const char **param, char *msg, size_t msglen)
{
    *tools_json = NULL;
    json_t *tools = json_object_get(o, "tools"), *tc = json_object_get(o, "tool_choice");
    json_t *par = json_object_get(o, "parallel_tool_calls");
    if (json_is_null(tools)) tools = NULL;
    if (json_is_null(tc)) tc = NULL;
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par)) return bad(param, "parallel_tool_calls", msg, msglen, "\"parallel_tool_calls\" must be a boolean");
        q->parallel_tool_calls = json_is_true(par);
    }
    if (!tools) {
        if (tc && !(json_is_string(tc) && !strcmp(json_string_value(tc), "none")))
            return bad(param, "tool_choice", msg, msglen, "\"tool_choice\" needs \"tools\"");
        return 0;
    }
    if (!json_is_array(tools)) return bad(param, "tools", msg, msglen, "\"tools\" must be an array of function tools");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        json_t *ty = json_object_get(t, "type");
        if (!json_is_object(t) || !json_is_object(f) || (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "function")))) {
            snprintf(msg, msglen, "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
            *param = "tools";
            return -1;
        }
        json_t *nm = json_object_get(f, "name"), *pa = json_object_get(f, "parameters");
        if (!json_is_string(nm) || json_string_length(nm) == 0) {
            snprintf(msg, msglen, "tools[%zu].function.name must be a non-empty string", i);
            *param = "tools";
            return -1;
        }
        if (pa && !json_is_null(pa) && !json_is_object(pa)) {
            snprintf(msg, msglen, "tools[%zu].function.parameters must be a JSON schema object", i);
            *param = "tools";
            return -1;
        }
    }
    if (json_array_size(tools) == 0) return 0;   /* no tools: as if absent */
    if (tc) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "auto")) q->tool_choice = PROTO_TOOLS_AUTO;
            else if (!strcmp(s, "none")) q->tool_choice = PROTO_TOOLS_NONE;
            else if (!strcmp(s, "required")) q->tool_choice = PROTO_TOOLS_REQUIRED;
            else return bad(param, "tool_choice", msg, msglen, "\"tool_choice\" must be \"auto\", \"none\", \"required\" or a function");
        } else {
            json_t *f = json_object_get(tc, "function"), *nm = f ? json_object_get(f, "name") : NULL;
            if (!json_is_string(nm))
                return bad(param, "tool_choice", msg, msglen, "\"tool_choice\" must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
            q->tool_choice = PROTO_TOOLS_NAMED;
            q->tool_name = json_string_value(nm);
            q->tool_name_len = json_string_length(nm);
        }
    }
    *tools_json = json_dumps(tools, JSON_COMPACT);
    if (!*tools_json) return bad(param, "tools", msg, msglen, "out of memory");
    q->tools = *tools_json;
    q->tools_len = strlen(*tools_json);
    return 0;
}

int gwt_reasoning(json_t *o, struct proto_req *q, const char **param, char *msg, size_t msglen)
{
    json_t *f = json_object_get(o, "reasoning_format"), *k = json_object_get(o, "keep_reasoning");
    if (f && !json_is_null(f)) {
        const char *s = json_is_string(f) ? json_string_value(f) : NULL;
        if (s && (!strcmp(s, "auto") || !strcmp(s, "deepseek"))) q->reasoning = PROTO_REASONING_SPLIT;
        else if (s && !strcmp(s, "none")) q->reasoning = PROTO_REASONING_RAW;
        else return bad(param, "reasoning_format", msg, msglen, "\"reasoning_format\" must be \"auto\", \"deepseek\" or \"none\"");
    }
    if (k && !json_is_null(k)) {
        if (!json_is_boolean(k)) return bad(param, "keep_reasoning", msg, msglen, "\"keep_reasoning\" must be a boolean");
        q->keep_reasoning = json_is_true(k);
    }
    return 0;
}

char *gwt_msg_extra(json_t *m, size_t i, int *bad_out, const char **field, char *msg, size_t msglen)
{
    *bad_out = 0;
    *field = "tool_calls";
    json_t *rc = json_object_get(m, "reasoning_content");
    if (rc && !json_is_null(rc) && !json_is_string(rc)) {
        snprintf(msg, msglen, "messages[%zu].reasoning_content must be a string", i);
        *field = "reasoning_content";
        *bad_out = 1;
        return NULL;
    }
    json_t *calls = json_object_get(m, "tool_calls");
    if (calls && !json_is_null(calls)) {
        size_t k;
        json_t *c;
        if (!json_is_array(calls)) {
            snprintf(msg, msglen, "messages[%zu].tool_calls must be an array", i);
            *bad_out = 1;
            return NULL;
        }
        json_array_foreach(calls, k, c) {
            json_t *f = json_object_get(c, "function");
            json_t *nm = f ? json_object_get(f, "name") : NULL, *a = f ? json_object_get(f, "arguments") : NULL;
            if (!json_is_string(nm) || (a && !json_is_string(a) && !json_is_object(a))) {
                snprintf(msg, msglen, "messages[%zu].tool_calls[%zu] must have function.name (a string) and "
                         "function.arguments (a JSON string)", i, k);
                *bad_out = 1;
                return NULL;
            }
        }
    }
    json_t *x = json_object();
    if (!x) { *bad_out = 1; snprintf(msg, msglen, "out of memory"); return NULL; }
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) {
        if (!strcmp(key, "role") || !strcmp(key, "content") || json_is_null(v)) continue;
        json_object_set(x, key, v);
    }
    char *s = json_object_size(x) ? json_dumps(x, JSON_COMPACT) : NULL;
    json_decref(x);
    return s;
}

int gwt_template_vars(json_t *o, struct proto_req *q, char **vars_json, const char **param, char *msg,
                      size_t msglen)
{
    json_t *v = json_object_get(o, "chat_template_kwargs"), *val;
    const char *key;
    *vars_json = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return bad(param, "chat_template_kwargs", msg, msglen, "\"chat_template_kwargs\" must be an object");
    json_object_foreach(v, key, val) {
        const char *own = chat_own_var(key, strlen(key));
        if (own) {
            *param = "chat_template_kwargs";
            snprintf(msg, msglen, "\"chat_template_kwargs\".%s: set by the request itself", own);
            return -1;
        }
    }
    *vars_json = json_dumps(v, JSON_COMPACT);
    if (!*vars_json) return bad(param, "chat_template_kwargs", msg, msglen, "out of memory");
    q->template_vars = *vars_json;
    q->template_vars_len = strlen(*vars_json);
    return 0;
}
