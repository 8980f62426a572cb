/* tokenizer.h — text <-> token ids (engine-internal).
 *
 * Two families: SentencePiece-style (GGUF tokenizer.ggml.model = "llama":
 * scores, byte fallback, space prefix) and byte-level BPE (model = "gpt2":
 * GPT-2 / Qwen / Llama-3 pre-tokenizer rules, merge ranks, ignore_merges),
 * loaded from GGUF metadata or from a Hugging Face tokenizer.json.
 * A loaded tok is immutable: every function below may be called from any
 * thread at once. */
#ifndef ANE_TOKENIZER_H
#define ANE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf;
typedef struct tok tok;

/* The gguf may be closed afterwards (everything needed is copied).
 * tokenizer.ggml.pre selects the split rules: "qwen2" (and aliases),
 * "llama-bpe" ("llama3", "smaug-bpe", ...), "smollm" (digits split), "gpt-2";
 * any other name gets GPT-2 rules and says so in tok_note. */
int tok_load_gguf(tok **out, const struct gguf *g, char *err, size_t errlen);
/* tokenizer.json, plus tokenizer_config.json when present (may be NULL):
 * added/special tokens, bos/eos, add_bos_token, chat template source.
 * Models: byte-level BPE (ByteLevel / Split(regex, Isolated) pre-tokenizers,
 * NFC or no normalizer) and SentencePiece-style BPE (byte_fallback,
 * Prepend/Replace "\u2581" normalizers or Metaspace). Anything else
 * (Unigram, WordPiece, other normalizers) is refused with a message. */
int tok_load_hf(tok **out, const char *tokenizer_json, const char *tokenizer_config,
                char *err, size_t errlen);
void tok_free(tok *t);

int32_t tok_n_vocab(const tok *t);
int32_t tok_bos(const tok *t);        /* -1 when none */
int32_t tok_eos(const tok *t);
int32_t tok_eot(const tok *t);        /* end of turn (<|im_end|>, <|eot_id|>); -1 when none */
int tok_add_bos(const tok *t);        /* 1: prompts start with BOS */
int tok_is_eog(const tok *t, int32_t id);   /* EOS, EOT or another end-of-generation token */
int tok_is_control(const tok *t, int32_t id);
/* Chat template source text from metadata ("" when none). */
const char *tok_chat_template(const tok *t);
/* Where it came from: "tokenizer.chat_template" (GGUF), "tokenizer_config.json"
 * or "chat_template.jinja"; "" when none. */
const char *tok_chat_template_from(const tok *t);

/* Text → ids (no BOS added here). parse_special: special (control) tokens
 * written in the text become their ids; otherwise they are plain text.
 * Non-special added tokens (user-defined, e.g. Qwen's "<think>") are always
 * matched, as Hugging Face tokenizers and llama.cpp do. Qwen (pre "qwen2")
 * text is NFC-normalized first, as its tokenizer.json asks. *ids is
 * malloc'd, caller frees. On failure a TOK_E* code (negative, message in
 * err). */
enum {
    TOK_EUTF8 = -1,      /* the text is not valid UTF-8 (or NULL) */
    TOK_ENOMEM = -2,
    TOK_ELIMIT = -3,     /* the split regex hit a PCRE2 limit on this text (custom patterns only) */
    TOK_EINTERNAL = -4,  /* another PCRE2 failure */
};
int tok_encode(const tok *t, const char *text, size_t len, int parse_special,
               int32_t **ids, size_t *n, char *err, size_t errlen);

/* The bytes a token stands for when it follows other text (SentencePiece's
 * U+2581 → ' ', <0xAB> → the byte, byte-level BPE's unicode → bytes). Control
 * tokens give their text (e.g. "<|im_end|>"). Valid for the tok's lifetime.
 * id must be in range. */
const char *tok_piece(const tok *t, int32_t id, size_t *len);

/* ids → text: concatenated pieces, except that a SentencePiece space prefix
 * at the very start (or right after BOS) is dropped so that
 * decode(encode(s)) == s. BOS/EOS are not rendered. *text malloc'd. */
int tok_decode(const tok *t, const int32_t *ids, size_t n, char **text, size_t *len);

/* Text made of segments, encoded as if concatenated (so pre-tokenizer words
 * may span segments), but special tokens are matched only where the segment
 * allows it and only entirely inside one segment. Chat rendering uses this:
 * template text with parse_special = 1, message content with 0. */
typedef struct tok_seg { const char *text; size_t len; int parse_special; } tok_seg;
int tok_encode_segs(const tok *t, const tok_seg *segs, size_t nseg,
                    int32_t **ids, size_t *n, char *err, size_t errlen);

/* Exact token text (as the vocabulary stores it) → id; -1 when none. */
int32_t tok_find(const tok *t, const char *text, size_t len);
const char *tok_kind_name(const tok *t);   /* "spm" or "bpe" */
const char *tok_pre_name(const tok *t);    /* pre-tokenizer rules in use ("gpt-2", "qwen2", ...) */
/* "" or a note about a fallback taken while loading (e.g. an unknown
 * pre-tokenizer name handled with GPT-2 rules). */
const char *tok_note(const tok *t);

#endif
