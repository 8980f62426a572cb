/* fuzz_jinja — the Jinja interpreter on arbitrary templates and variables.
 *
 * Input: a template, optionally followed by FUZZ_SEP and the variables as
 * JSON (when they do not parse as an object, a fixed conversation with a
 * tool call is used). Renders under small bounds, so that loops, recursion
 * and growth end in a bound's error rather than a timeout. A parse or render
 * error must come with a message (raise_exception's own may be empty); a
 * rendered text must be valid UTF-8. */
#include "common/utf8.h"
#include "engine/text/jinja.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_SEP "\n#--8<--#\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char default_vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather in Z\\u00fcrich? <b>&</b>\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\","
    "  \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\\u00fcrich\", \"days\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"{\\\"temp\\\": 12}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather.\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *fallback;
    if (!fallback) {
        json_error_t je;
        fallback = json_loads(default_vars, 0, &je);
        if (!fallback) abort();
    }
    const uint8_t *sep = size >= sizeof FUZZ_SEP - 1 ? memmem(data, size, FUZZ_SEP, sizeof FUZZ_SEP - 1) : NULL;
    size_t tlen = sep ? (size_t)(sep - data) : size;
    char err[1024] = "";
    jinja_tpl *t = jinja_parse((const char *)data, tlen, err, sizeof err);
    if (!t) {
        if (!err[0]) abort();
        return 0;
    }
    json_t *vars = NULL;
    if (sep) {
        json_error_t je;
        size_t off = tlen + sizeof FUZZ_SEP - 1;
        vars = json_loadb((const char *)data + off, size - off, 0, &je);
        if (vars && !json_is_object(vars)) {
            json_decref(vars);
            vars = NULL;
        }
    }
    jinja_limits lim;
    jinja_default_limits(&lim);
    lim.max_output = 1 << 20;
    lim.max_memory = 32 << 20;
    lim.max_steps = 20000;
    lim.max_work = 64 << 20;
    lim.max_depth = 40;
    lim.max_stack = 512 << 10;
    char *out = NULL;
    size_t n = 0;
    err[0] = 0;
    int rc = jinja_render(t, vars ? vars : fallback, 1795694400, &lim, &out, &n, err, sizeof err);
    if (rc == JINJA_OK) {
        if (!out || out[n] != 0 || !utf8_valid(out, n, NULL)) abort();
    } else if ((!err[0] && rc != JINJA_ERAISE) || out) {
        abort();
    }
    free(out);
    json_decref(vars);
    jinja_free(t);
    return 0;
}
