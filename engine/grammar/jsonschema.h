/* jsonschema.h — JSON Schema (draft 7 and the 2020-12 words below) to GBNF
 * (engine-internal). The result is compiled with gram_compile.
 *
 * Enforced: type (one or a list), properties, required (any property order
 * while at most 6 are required; past that, the required ones come first in
 * the schema's order), additionalProperties (false, a schema, or any),
 * enum, const, anyOf, oneOf (as anyOf: exclusivity is not enforced), allOf
 * of one schema, items (a schema or a tuple), prefixItems, additionalItems,
 * minItems/maxItems, minLength/maxLength (code points; an escape counts
 * one), pattern (classes, escapes \d \w \s, `.`, groups, `|`, `*` `+` `?`
 * `{m,n}`, anchors ^ $ at the ends; the pattern's characters may not need
 * JSON escapes), $ref to "#", "#/definitions/..", "#/$defs/..", boolean
 * schemas. Integers: "-"? digits with an optional ".0" tail (1.0 is an
 * integer); minimum/maximum, multipleOf, format, uniqueItems, contains,
 * dependencies, patternProperties, not, if/then/else are not enforced
 * (any value of the type passes). Text is compact JSON with optional
 * whitespace (at most 20 characters) between tokens. */
#ifndef ANE_JSONSCHEMA_H
#define ANE_JSONSCHEMA_H

#include <stddef.h>

/* GBNF for values valid under the schema (JSON text); malloc'd, or NULL
 * with err naming the schema path (e.g. "/properties/a/pattern"). */
char *jsonschema_gbnf(const char *schema, size_t len, char *err, size_t errlen);

/* GBNF for any JSON object (response_format json_object). Static. */
const char *jsonschema_object_gbnf(void);

#endif
