/* grammar.h — grammar-constrained decoding (engine-internal).
 *
 * GBNF (the grammar language llama.cpp reads: rules `name ::= ...`, `|`,
 * groups, `*` `+` `?` `{m}` `{m,}` `{m,n}`, "literals", [classes] with
 * ranges and `^`, `.`, escapes \x \u \U \t \r \n, `#` comments, start rule
 * `root`; `<[N]>` names the special token N) is compiled once per request into a `gram`. A `gram_match` holds
 * the parse state (a set of pushdown stacks over Unicode code points) and
 * advances over the bytes of each sampled token. The per-step mask walks a
 * prefix tree of the vocabulary's token texts (`gram_vocab`, built once per
 * model) against the state: a prefix the grammar refuses cuts off every
 * token below it, so a mask over a large vocabulary visits few nodes
 * outside free text. Masks of a state seen before come from a small cache.
 *
 * Bounded: left recursion is a compile error; a step whose stacks or
 * expansions exceed fixed limits is an error, never a hang. */
#ifndef ANE_GRAMMAR_H
#define ANE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

typedef struct gram gram;
typedef struct gram_vocab gram_vocab;
typedef struct gram_match gram_match;

/* Compiles GBNF text. Errors name the rule and the position:
 * "rule 'x' at 3:14: ...". */
int gram_compile(gram **out, const char *text, size_t len, char *err, size_t errlen);
void gram_free(gram *g);
size_t gram_n_rules(const gram *g);

/* The vocabulary's token texts; pieces[i] NULL (or empty) for tokens the
 * grammar never allows (control tokens, end of generation). Copied. */
gram_vocab *gram_vocab_new(const char *const *pieces, const size_t *lens, int32_t n);
void gram_vocab_free(gram_vocab *v);
int32_t gram_vocab_size(const gram_vocab *v);

/* The special (control) tokens a grammar may name as <[N]>: matched as
 * symbols by id, never by text (so no text rule such as [^"] takes them).
 * Copied. 0, or -1 when out of memory. */
int gram_vocab_set_special(gram_vocab *v, const int32_t *ids, uint32_t n);

int gram_match_new(gram_match **out, const gram *g, char *err, size_t errlen);
void gram_match_free(gram_match *m);

/* Advances over bytes (a token's text). 1: accepted (state advanced);
 * 0: refused (state unchanged); -1: a work bound was passed (err set). */
int gram_match_accept(gram_match *m, const char *bytes, size_t n, char *err, size_t errlen);

/* Advances over a special token (one set by gram_vocab_set_special):
 * 1 accepted, 0 refused, -1 bound (err set). */
int gram_match_accept_token(gram_match *m, int32_t id, char *err, size_t errlen);

/* As gram_match_accept, without changing the state. */
int gram_match_check(gram_match *m, const char *bytes, size_t n, char *err, size_t errlen);

/* As gram_match_accept_token, without changing the state. */
int gram_match_check_token(gram_match *m, int32_t id, char *err, size_t errlen);

/* 1 when the text so far is a whole sentence of the grammar (EOS may follow). */
int gram_match_can_end(const gram_match *m);

/* 1 when nothing more can follow (the only way on is to end). */
int gram_match_must_end(const gram_match *m);

/* Sets bit i of mask (uint32 words, (n_vocab+31)/32 of them) for every
 * token whose whole text the grammar accepts next. Returns the number of
 * such tokens, or -1 when a work bound was passed (err set). */
int64_t gram_match_mask(gram_match *m, const gram_vocab *v, uint32_t *mask, char *err, size_t errlen);

/* 1 when gram_match_mask of the current state would come from its cache
 * (the state's mask was made before and kept) or needs no walk. */
int gram_match_mask_cached(const gram_match *m, const gram_vocab *v);

/* Tokens longer than this (bytes) are not in the vocabulary trie: no mask
 * allows them. */
#define GRAM_MAX_PIECE 60000

/* ---- JSON Schema (jsonschema.c) → GBNF, compiled with gram_compile.
 *The result is compiled with gram_compile.
 *
 * Enforced: type (one or a list), properties, required (any member order; the
 * named members at most once each while there are at most 8, else the
 * required ones while at most 6, else required ones first in the schema's
 * order), additionalProperties (false, a schema, or any),
 * enum, const, anyOf, oneOf (as anyOf: exclusivity is not enforced), allOf
 * of one schema, items (a schema or a tuple), prefixItems, additionalItems,
 * minItems/maxItems, minLength/maxLength (code points; an escape counts
 * one), pattern (classes, escapes \d \w \s, `.`, groups, `|`, `*` `+` `?`
 * `{m,n}`, anchors ^ $ at the ends; the pattern's characters may not need
 * JSON escapes), $ref to "#", "#/definitions/..", "#/$defs/..", boolean
 * schemas. Numbers have at most 16 integer digits, 16 fraction
 * digits and 3 exponent digits (so that output is bounded); integers may
 * end in ".0" (1.0 is an integer); minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum (numrange.c: a bounded value has no exponent);
 * multipleOf, format, uniqueItems, contains,
 * dependencies, patternProperties, not, if/then/else are not enforced
 * (any value of the type passes). Text is compact JSON with optional
 * whitespace (at most 20 characters) between tokens. (Schemas false, boolean-false
 * required members, remote and $id-relative references are errors.) */

/* GBNF for values valid under the schema (JSON text); malloc'd, or NULL
 * with err naming the schema path (e.g. "/properties/a/pattern"). */
char *jsonschema_gbnf(const char *schema, size_t len, char *err, size_t errlen);

/* The rules for several schemas in one grammar, without a root: value i
 * is the rule PREFIX<i> (PREFIX of letters and '-'; no whitespace around).
 * The primitives (ws, value, object, string, ...) come once; the ASCII
 * characters of no_raw (or NULL) appear in strings only as \u escapes (so
 * that no string can hold a marker of the text around). NULL with err
 * set (err names no schema: the caller says which). */
char *jsonschema_gbnf_set(const char *const *schemas, const size_t *lens, size_t n, const char *prefix,
                          const char *no_raw, char *err, size_t errlen);

/* GBNF for text the whole of which matches the regex re (the pattern
 * subset above, over any characters; ^ and $ at the ends change nothing);
 * malloc'd, or NULL with err naming the offset of what is not supported. */
char *regex_gbnf(const char *re, size_t len, char *err, size_t errlen);

/* GBNF for exactly one of k non-empty texts; malloc'd, or NULL with err. */
char *choice_gbnf(const char *const *s, const size_t *lens, size_t k, char *err, size_t errlen);

/* GBNF for any JSON object (response_format json_object). Static. */
const char *jsonschema_object_gbnf(void);

#endif
