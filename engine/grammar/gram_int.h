/* gram_int.h — the compiled grammar, shared by the parser (gbnf.c) and the
 * matcher (grammar.c). Internal to engine/grammar/. */
#ifndef ANE_GRAM_INT_H
#define ANE_GRAM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/grammar/grammar.h"

#define GRAM_MAX_RULES   65536
#define GRAM_MAX_ELEMS   (1u << 22)
#define GRAM_MAX_REPEAT  10000
#define GRAM_MAX_DEPTH   256
#define GRAM_MAX_STACKS  4096      /* live stacks after one step */
#define GRAM_MAX_EXPAND  200000    /* expansions in one step */

/* a token named in the grammar (<[N]>) is the symbol GRAM_TOKEN_CP + N,
 * past every code point */
#define GRAM_TOKEN_CP    0x110000u
#define GRAM_MAX_TOKEN   0xFFFFFFu

enum { GEL_END = 0, GEL_CHAR = 1, GEL_REF = 2 };

typedef struct {
    uint8_t type;
    uint8_t neg;        /* CHAR: [^...] */
    uint32_t a;         /* CHAR: first range; REF: rule */
    uint32_t b;         /* CHAR: number of ranges */
} gram_el;

typedef struct { uint32_t lo, hi; } gram_range;

typedef struct {
    char *name;
    uint32_t alt_off, n_alt;   /* into alt_start */
    uint32_t def_at, ref_at;   /* byte offsets (errors) */
    uint8_t defined, generated, nullable;
} gram_rule;

struct gram {
    gram_rule *rules; uint32_t n_rules, cap_rules;
    gram_el *el; uint32_t n_el, cap_el;
    struct { uint32_t rule, start; } *alts; uint32_t n_alts, cap_alts;
    uint32_t *alt_start;
    gram_range *ranges; uint32_t n_ranges, cap_ranges;
    uint32_t root;
    uint8_t has_tokens;        /* some element names a token */
};

/* numrange.c: a bound of a number range (JSON Schema minimum & co.) */
typedef struct { int on, excl; double v; } gram_bound;

/* A GBNF expression (malloc'd) for the JSON numbers between lo and hi
 * (integers: with an optional ".0..." tail), without exponents, at most 16
 * integer and 16 fraction digits; NULL with err set when a bound needs more
 * digits. Bounds that leave nothing give an expression that matches nothing. */
char *numrange_gbnf(const gram_bound *lo, const gram_bound *hi, int integer, char *err, size_t errlen);

#endif
