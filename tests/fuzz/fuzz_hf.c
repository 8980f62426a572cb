/* fuzz_hf — Hugging Face model directories: config.json, safetensors and
 * tokenizer.json through model_load's directory path.
 *
 * Input: parts separated by FUZZ_SEP: config.json, model.safetensors,
 * tokenizer.json, tokenizer_config.json (the last two optional; without a
 * tokenizer.json the fixture's is used). They are written into a private
 * temp directory, which model_load then reads. */
#include "engine/load/model.h"
#include "engine/text/tokenizer.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_util.h"

#define FUZZ_SEP "\n#--8<--#\n"
#define FIX_TOKENIZER "tests/fixtures/hf/qwen2-tiny/tokenizer.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[PATH_MAX];
static char fix_tok[PATH_MAX];

static void path_in(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static void cleanup(void)
{
    static const char *names[] = { "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" };
    char p[PATH_MAX + 64];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        path_in(p, sizeof p, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/fuzz_hf.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) abort();
        if (!realpath(FIX_TOKENIZER, fix_tok)) abort();   /* run from the repository root */
        atexit(cleanup);
    }
    const uint8_t *p = data;
    size_t left = size;
    const uint8_t *part[4];
    size_t len[4];
    for (int i = 0; i < 4; i++) {
        part[i] = p;
        len[i] = fuzz_part(&p, &left, FUZZ_SEP);
    }
    char cfg[PATH_MAX + 64], st[PATH_MAX + 64], tj[PATH_MAX + 64], tc[PATH_MAX + 64];
    path_in(cfg, sizeof cfg, "config.json");
    path_in(st, sizeof st, "model.safetensors");
    path_in(tj, sizeof tj, "tokenizer.json");
    path_in(tc, sizeof tc, "tokenizer_config.json");
    if (fuzz_write_file(cfg, part[0], len[0]) || fuzz_write_file(st, part[1], len[1])) abort();
    unlink(tj);
    unlink(tc);
    if (len[2]) {
        if (fuzz_write_file(tj, part[2], len[2])) abort();
    } else if (symlink(fix_tok, tj)) {
        abort();
    }
    if (len[3] && fuzz_write_file(tc, part[3], len[3])) abort();

    char err[512] = "";
    model *m = NULL;
    if (model_load(&m, dir, err, sizeof err) == 0) {
        static const char text[] = "Hello <|im_start|> world \xff\xfe";
        int32_t *ids = NULL;
        size_t n = 0;
        if (tok_encode(m->tok, text, sizeof text - 1, 1, &ids, &n, err, sizeof err) == 0) {
            char *out = NULL;
            size_t olen = 0;
            if (tok_decode(m->tok, ids, n, &out, &olen) == 0) free(out);
        }
        free(ids);
        if (m->tok_embd.data && m->tok_embd.n_in > 0 && m->tok_embd.n_in <= (1 << 20)) {
            float *row = malloc((size_t)m->tok_embd.n_in * sizeof *row);
            if (row) {
                wt_row_f32(&m->tok_embd, m->tok_embd.n_out - 1, row);
                free(row);
            }
        }
        model_free(m);
    } else if (!err[0]) {
        abort();
    }
    return 0;
}
