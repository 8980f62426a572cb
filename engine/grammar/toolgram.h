/* toolgram.h — a grammar whose sentences are tool calls (tool_choice
 * "required" or a named function), in the surface syntax of the chat
 * template's format (engine/text/toolcall.h), so that the format's parser
 * reads every sentence as calls.
 *
 * Each call names one allowed function (its name a literal alternative)
 * and its arguments are JSON valid under that function's "parameters"
 * schema (jsonschema.c, with what that enforces). One call, or one or more
 * where the format writes several in a reply and max_calls is 0. Markers
 * that are special tokens of the vocabulary are named as tokens (<[N]>), so
 * they are matched as the token, never spelled out in pieces. */
#ifndef ANE_TOOLGRAM_H
#define ANE_TOOLGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "engine/text/toolcall.h"

/* The special token whose text is exactly text, or -1 (then the marker is
 * matched as text). */
typedef int32_t (*toolgram_special_fn)(void *ctx, const char *text, size_t len);

/* GBNF (malloc'd) for the calls. fmt: the template's format, with
 * TC_THINK_OPEN when the prompt leaves a reasoning block open (the reply
 * then closes it first). tpl_src: the template's text (it tells variants
 * apart: Mistral's NAME[ARGS]{...} or JSON list, DeepSeek R1's fenced
 * arguments). tools: the request's JSON array. name: the one function
 * allowed, or NULL for any. max_calls: 1 = exactly one call; 0 = one or
 * more. NULL with err set: the format has no call syntax, the name is not
 * among the tools, a name cannot be written in the syntax, or a schema does
 * not convert (err names "tools"[i].function.parameters). */
char *toolgram_gbnf(tc_format fmt, const char *tpl_src, const char *tools, size_t tools_len,
                    const char *name, size_t name_len, int max_calls,
                    toolgram_special_fn special, void *ctx, char *err, size_t errlen);

#endif
