/* tok_internal.h — what the tokenizer's loaders share (engine-internal,
 * tokenizer modules only). A loader fills a tok_spec with the vocabulary as
 * the file states it; tok_build turns it into an immutable tok. */
#ifndef ANE_TOK_INTERNAL_H
#define ANE_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/text/tokenizer.h"

/* token types, numbered as GGUF tokenizer.ggml.token_type */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };
enum { TOK_SPM = 1, TOK_BPE = 2 };

typedef struct tok_sv { const char *s; size_t n; } tok_sv;
typedef struct tok_merge { tok_sv a, b; } tok_merge;

typedef struct tok_spec {
    int type;                   /* TOK_SPM / TOK_BPE */
    int32_t n_vocab;
    const tok_sv *text;         /* n_vocab token texts as stored */
    const float *scores;        /* SPM; may be NULL */
    const uint8_t *ttype;       /* may be NULL: all normal */
    const tok_merge *merges;    /* BPE, in rank order */
    size_t n_merges;
    const char *regex;          /* BPE split regex (PCRE2 syntax); NULL: none */
    const char *pre_name;       /* for tok_info */
    const char *note;           /* fallback taken while loading, or NULL */
    int ignore_merges, nfc, add_prefix_space;
    int add_space_prefix;       /* SPM: 1 at the start and after special tokens, 2 at the start only */
    int split_words;            /* SPM: no merge across a U+2581 (Metaspace split) */
    int split_digits;           /* BPE: each numeric character a word of its own (Digits pre-tokenizer) */
    int32_t bos, eos, eot, eom, unk;
    int add_bos;
    tok_sv chat_template;
    const char *chat_template_from; /* where it was found (a static string), or NULL */
} tok_spec;

int tok_build(tok **out, const tok_spec *s, char *err, size_t errlen);

/* Split regexes as Hugging Face defines them. */
extern const char TOK_RE_GPT2[], TOK_RE_QWEN2[], TOK_RE_LLAMA3[];

#endif
