/* fuzz_tok — the tokenizers on arbitrary bytes (invalid UTF-8 included).
 *
 * Vocabularies from tests/fixtures: SentencePiece (llama), byte-level BPE
 * from GGUF (gpt-2, qwen2, llama3) and from tokenizer.json (qwen2-tiny).
 * Byte 0 picks the vocabulary and the mode: encode with or without special
 * tokens, encode as segments, or decode the bytes read as token ids. Every id
 * produced must be in range; encoded text must decode. */
#include "engine/load/gguf.h"
#include "engine/text/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char *const gguf_vocabs[] = {
    "tests/fixtures/tokenizers/llama.cpp/ggml-vocab-llama-spm.gguf",
    "tests/fixtures/tokenizers/llama.cpp/ggml-vocab-gpt-2.gguf",
    "bin/fixtures/vocab-qwen2.gguf",
    "bin/fixtures/vocab-llama3.gguf",
};
#define MAX_TOK 8
static tok *toks[MAX_TOK];
static gguf *ggufs[MAX_TOK];   /* kept open (and reachable) for the process's life */
static int n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[512];
    for (size_t i = 0; i < sizeof gguf_vocabs / sizeof *gguf_vocabs; i++) {
        gguf *g = NULL;
        if (gguf_open(&ggufs[n_toks], gguf_vocabs[i], err, sizeof err) == 0) g = ggufs[n_toks];
        if (!g || tok_load_gguf(&toks[n_toks], g, err, sizeof err)) {
            fprintf(stderr, "fuzz_tok: %s (run `make fixtures` from the repository root)\n", err);
            exit(1);
        }
        n_toks++;
    }
    if (tok_load_hf(&toks[n_toks], "tests/fixtures/hf/qwen2-tiny/tokenizer.json",
                    "tests/fixtures/hf/qwen2-tiny/tokenizer_config.json", err, sizeof err)) {
        fprintf(stderr, "fuzz_tok: %s\n", err);
        exit(1);
    }
    n_toks++;
    return 0;
}

static void check_ids(const tok *t, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) abort();
    char *out = NULL;
    size_t len = 0;
    if (tok_decode(t, ids, n, &out, &len) != 0) abort();
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const tok *t = toks[data[0] % n_toks];
    int mode = (data[0] / 8) % 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char err[256];
    int32_t *ids = NULL;
    size_t n = 0;
    if (mode < 2) {
        if (tok_encode(t, text, len, mode, &ids, &n, err, sizeof err) == 0) check_ids(t, ids, n);
        else if (!err[0]) abort();
    } else if (mode == 2) {
        /* three segments cut where the bytes say, alternating special parsing */
        size_t a = len ? (unsigned char)text[0] % (len + 1) : 0;
        size_t b = a + (len > a ? (unsigned char)text[len - 1] % (len - a + 1) : 0);
        tok_seg segs[3] = { { text, a, 1 }, { text + a, b - a, 0 }, { text + b, len - b, 1 } };
        if (tok_encode_segs(t, segs, 3, &ids, &n, err, sizeof err) == 0) check_ids(t, ids, n);
    } else {
        size_t k = len / 4;
        int32_t *in = malloc((k ? k : 1) * sizeof *in);
        if (!in) return 0;
        for (size_t i = 0; i < k; i++) {
            uint32_t v;
            memcpy(&v, text + 4 * i, 4);
            in[i] = (int32_t)(v % (uint32_t)tok_n_vocab(t));
            size_t pl = 0;
            const char *piece = tok_piece(t, in[i], &pl);
            if (!piece) abort();
        }
        check_ids(t, in, k);
        free(in);
    }
    free(ids);
    return 0;
}
