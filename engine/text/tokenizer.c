/* tokenizer.c — the tokenizer core: building an immutable tok from a
 * tok_spec, encoding (special-token split, SentencePiece score merges,
 * byte-level BPE rank merges), pieces and decoding, and the GGUF loader.
 * The algorithms follow llama.cpp's llm_tokenizer_spm / llm_tokenizer_bpe so
 * that ids agree with llama.cpp and with Hugging Face tokenizers. */
#include "engine/text/tokenizer.h"
#include "common/err.h"
#include "common/utf8.h"
#include "engine/text/tok_internal.h"
#include "engine/load/gguf.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char TOK_RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char TOK_RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char TOK_RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* a hash slot carries the text's place so that a hit costs one miss on the
 * table and one on the text */
typedef struct hent { uint32_t tag; int32_t id; uint32_t off, len; } hent;
typedef struct merge_ent { uint64_t key; uint32_t rank; int32_t res; } merge_ent;

struct tok {
    int type;
    int32_t n;
    char *text;              /* arena of token texts, NUL after each */
    uint32_t *text_off, *text_len;
    char *piece;             /* arena of decoded pieces */
    uint32_t *piece_off, *piece_len;
    float *scores;
    uint8_t *ttype;
    uint8_t *eog;
    struct hent *hmap;       /* text → id, open addressing, id -1: empty */
    uint32_t hmask;
    merge_ent *mmap;         /* (left id, right id) → rank, merged id */
    uint32_t mmask;
    int32_t byte_id[256];    /* token of a single byte (SPM <0xAB>, BPE byte char) */
    int32_t *special;        /* candidates for matching in text, longest first */
    uint32_t sp_first[257];  /* special[sp_first[b] .. sp_first[b+1]) start with byte b */
    uint64_t *pairs;         /* SPM: adjacent character pairs found inside tokens */
    uint32_t pmask;
    int32_t bos, eos, eot, unk;
    int add_bos, add_space_prefix, ignore_merges, nfc, add_prefix_space, split_words, split_digits;
    pcre2_code *re;
    int re_jit;
    char *chat_template;
    const char *chat_template_from;
    char pre_name[32];
    char note[160];
};

/* ---- hashing ---------------------------------------------------------- */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    size_t total = n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8; n -= 8;
    }
    uint64_t v = 0;
    if (n && total >= 8) {          /* the last 8 bytes, shifted: no byte-wise tail */
        memcpy(&v, p + n - 8, 8);
        v >>= (8 - n) * 8;
    } else {
        for (size_t i = 0; i < n; i++) v |= (uint64_t)(unsigned char)p[i] << (8 * i);
    }
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static uint64_t hash_pair(uint64_t k)
{
    k ^= k >> 33; k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ull;
    return k ^ (k >> 33);
}

static int32_t find_h(const tok *t, const char *s, size_t n, uint64_t h)
{
    uint32_t i = (uint32_t)h & t->hmask, tag = (uint32_t)(h >> 32);
    for (;;) {
        const hent *e = &t->hmap[i];
        if (e->id < 0) return -1;
        if (e->tag == tag && e->len == n && memcmp(t->text + e->off, s, n) == 0) return e->id;
        i = (i + 1) & t->hmask;
    }
}

int32_t tok_find(const tok *t, const char *s, size_t n)
{
    if (!t || !t->hmap) return -1;
    return find_h(t, s, n, hash_bytes(s, n));
}

/* Many lookups at once, with the table slots and then the texts prefetched,
 * so that their cache misses overlap (building the merge table does ~3 per
 * merge, hundreds of thousands in all). */
#define FIND_BATCH 64
static void find_batch(const tok *t, size_t n, const char *const *s, const size_t *len, int32_t *out)
{
    uint64_t h[FIND_BATCH];
    const hent *cand[FIND_BATCH];
    for (size_t i = 0; i < n; i++) {
        h[i] = hash_bytes(s[i], len[i]);
        __builtin_prefetch(&t->hmap[(uint32_t)h[i] & t->hmask]);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t k = (uint32_t)h[i] & t->hmask, tag = (uint32_t)(h[i] >> 32);
        cand[i] = NULL;
        for (;; k = (k + 1) & t->hmask) {
            const hent *e = &t->hmap[k];
            if (e->id < 0) break;
            if (e->tag == tag && e->len == len[i]) { cand[i] = e; __builtin_prefetch(t->text + e->off); break; }
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!cand[i]) out[i] = -1;
        else if (memcmp(t->text + cand[i]->off, s[i], len[i]) == 0) out[i] = cand[i]->id;
        else out[i] = find_h(t, s[i], len[i], h[i]);
    }
}

static const merge_ent *merge_find(const tok *t, int32_t a, int32_t b)
{
    if (!t->mmap || a < 0 || b < 0) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)hash_pair(key) & t->mmask;
    for (;;) {
        const merge_ent *e = &t->mmap[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & t->mmask;
    }
}

static uint32_t pow2_at_least(size_t n)
{
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

/* ---- UTF-8 ------------------------------------------------------------ */

/* Length of the UTF-8 character starting with byte c (1 for stray bytes). */
static size_t utf8_len_lead(unsigned char c)
{
    static const uint8_t lens[16] = { 1,1,1,1,1,1,1,1, 1,1,1,1, 2,2, 3, 4 };
    return lens[c >> 4];
}

static size_t utf8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static uint32_t utf8_get(const unsigned char *p, size_t l)
{
    switch (l) {
    case 1: return p[0];
    case 2: return ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default: return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
                    ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    }
}

/* GPT-2 bytes_to_unicode: printable bytes stand for themselves, the others
 * for U+0100 + n in byte order. */
static uint32_t byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174))) n++;
    return 256 + n;
}

/* ---- build ------------------------------------------------------------ */

static int is_special_type(uint8_t ty) { return ty == TT_CONTROL || ty == TT_USER || ty == TT_UNKNOWN; }

static const char *const eot_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "_<EOT>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", NULL,
};
static const char *const eog_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", NULL,
};

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const tok *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    unsigned char fx = (unsigned char)t->text[t->text_off[x]], fy = (unsigned char)t->text[t->text_off[y]];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (t->text_len[x] != t->text_len[y]) return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* inv: code point (< 324) → the byte it stands for in byte-level BPE, or -1 */
static void piece_of(const tok *t, int32_t id, char *o, uint32_t *len, const int16_t *inv)
{
    const char *s = t->text + t->text_off[id];
    uint32_t n = t->text_len[id], k = 0;
    uint8_t ty = t->ttype[id];
    if (t->type == TOK_SPM) {
        unsigned v;
        if (ty == TT_BYTE && n == 6 && sscanf(s, "<0x%2X>", &v) == 1) { o[0] = (char)v; *len = 1; return; }
        if (ty == TT_NORMAL || ty == TT_USER) {
            for (uint32_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) { o[k++] = ' '; i += 3; }
                else o[k++] = s[i++];
            }
            *len = k;
            return;
        }
    } else if (ty == TT_NORMAL) {
        for (uint32_t i = 0; i < n;) {
            if (!((unsigned char)s[i] & 0x80)) { o[k++] = s[i++]; continue; }
            size_t l = utf8_len_lead((unsigned char)s[i]);
            if (i + l > n) l = n - i;
            uint32_t cp = utf8_get((const unsigned char *)s + i, l);
            if (cp < 324 && inv[cp] >= 0) o[k++] = (char)inv[cp];
            else { memcpy(o + k, s + i, l); k += (uint32_t)l; }
            i += (uint32_t)l;
        }
        *len = k;
        return;
    }
    memcpy(o, s, n);
    *len = n;
}

int tok_build(tok **out, const tok_spec *s, char *err, size_t errlen)
{
    *out = NULL;
    if (s->n_vocab <= 0) return err_set(err, errlen, "tokenizer: empty vocabulary");
    tok *t = calloc(1, sizeof *t);
    if (!t) return err_set(err, errlen, "tokenizer: out of memory");
    int32_t n = s->n_vocab;
    t->type = s->type;
    t->n = n;
    t->bos = s->bos; t->eos = s->eos; t->eot = s->eot; t->unk = s->unk;
    t->add_space_prefix = s->add_space_prefix; t->add_prefix_space = s->add_prefix_space;
    t->split_words = s->split_words; t->split_digits = s->split_digits;
    t->ignore_merges = s->ignore_merges;
    t->nfc = s->nfc;
    snprintf(t->pre_name, sizeof t->pre_name, "%s", s->pre_name ? s->pre_name : (s->type == TOK_SPM ? "spm" : "gpt-2"));
    snprintf(t->note, sizeof t->note, "%s", s->note ? s->note : "");

    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += s->text[i].n + 1;
    if (total > UINT32_MAX / 2) { tok_free(t); return err_set(err, errlen, "tokenizer: vocabulary text too large"); }
    t->text = malloc(total ? total : 1);
    t->piece = malloc(total ? total : 1);
    t->text_off = malloc(sizeof(uint32_t) * (size_t)n);
    t->text_len = malloc(sizeof(uint32_t) * (size_t)n);
    t->piece_off = malloc(sizeof(uint32_t) * (size_t)n);
    t->piece_len = malloc(sizeof(uint32_t) * (size_t)n);
    t->scores = calloc((size_t)n, sizeof(float));
    t->ttype = malloc((size_t)n);
    t->eog = calloc((size_t)n, 1);
    t->hmask = pow2_at_least((size_t)n + (size_t)n / 2) - 1;
    t->hmap = malloc(sizeof(hent) * ((size_t)t->hmask + 1));
    if (!t->text || !t->piece || !t->text_off || !t->text_len || !t->piece_off || !t->piece_len ||
        !t->scores || !t->ttype || !t->eog || !t->hmap) {
        tok_free(t);
        return err_set(err, errlen, "tokenizer: out of memory");
    }
    for (size_t i = 0; i <= t->hmask; i++) t->hmap[i].id = -1;
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        t->text_off[i] = (uint32_t)off;
        t->text_len[i] = (uint32_t)s->text[i].n;
        if (s->text[i].n) memcpy(t->text + off, s->text[i].s, s->text[i].n);
        off += s->text[i].n;
        t->text[off++] = 0;
        t->ttype[i] = s->ttype ? s->ttype[i] : TT_NORMAL;
        if (t->ttype[i] < TT_NORMAL || t->ttype[i] > TT_BYTE) t->ttype[i] = TT_NORMAL;
        if (s->scores) t->scores[i] = s->scores[i];
    }
    /* text → id; a later duplicate wins, as in llama.cpp's token_to_id */
    uint64_t *hv = malloc(sizeof(uint64_t) * (size_t)n);
    if (!hv) { tok_free(t); return err_set(err, errlen, "tokenizer: out of memory"); }
    for (int32_t i = 0; i < n; i++) hv[i] = hash_bytes(t->text + t->text_off[i], t->text_len[i]);
    for (int32_t i = 0; i < n; i++) {
        if (i + 16 < n) __builtin_prefetch(&t->hmap[(uint32_t)hv[i + 16] & t->hmask], 1);
        uint32_t len = t->text_len[i];
        const char *p = t->text + t->text_off[i];
        uint32_t h = (uint32_t)hv[i] & t->hmask, tag = (uint32_t)(hv[i] >> 32);
        for (;;) {
            hent *e = &t->hmap[h];
            if (e->id < 0 || (e->tag == tag && e->len == len && memcmp(t->text + e->off, p, len) == 0)) {
                e->id = i; e->tag = tag; e->off = t->text_off[i]; e->len = len;
                break;
            }
            h = (h + 1) & t->hmask;
        }
    }
    free(hv);
    /* byte tokens */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (t->type == TOK_SPM) {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_id[b] = tok_find(t, buf, 6);
            if (t->byte_id[b] < 0) { buf[0] = (char)b; t->byte_id[b] = tok_find(t, buf, 1); }
        } else {
            size_t l = utf8_put(buf, byte_to_cp((unsigned)b));
            t->byte_id[b] = tok_find(t, buf, l);
        }
    }
    /* merges: (left id, right id) → rank and merged id */
    if (s->n_merges) {
        t->mmask = pow2_at_least(s->n_merges + s->n_merges / 2) - 1;
        t->mmap = malloc(sizeof(merge_ent) * ((size_t)t->mmask + 1));
        char *cat = malloc((size_t)FIND_BATCH * 512);
        if (!t->mmap || !cat) { free(cat); tok_free(t); return err_set(err, errlen, "tokenizer: out of memory"); }
        for (size_t i = 0; i <= t->mmask; i++) t->mmap[i].key = UINT64_MAX;
        for (size_t r0 = 0; r0 < s->n_merges; r0 += FIND_BATCH / 2) {
            size_t nb = s->n_merges - r0 < FIND_BATCH / 2 ? s->n_merges - r0 : FIND_BATCH / 2;
            const char *q[FIND_BATCH];
            size_t ql[FIND_BATCH];
            int32_t ab[FIND_BATCH], res[FIND_BATCH / 2];
            for (size_t k = 0; k < nb; k++) {
                const tok_merge *m = &s->merges[r0 + k];
                q[2 * k] = m->a.s; ql[2 * k] = m->a.n;
                q[2 * k + 1] = m->b.s; ql[2 * k + 1] = m->b.n;
            }
            find_batch(t, 2 * nb, q, ql, ab);
            uint32_t slot[FIND_BATCH / 2];
            for (size_t k = 0; k < nb; k++) {
                uint64_t key = ((uint64_t)(uint32_t)ab[2 * k] << 32) | (uint32_t)ab[2 * k + 1];
                slot[k] = (uint32_t)hash_pair(key) & t->mmask;
                __builtin_prefetch(&t->mmap[slot[k]], 1);
            }
            size_t nc = 0;
            for (size_t k = 0; k < nb; k++) {
                const tok_merge *m = &s->merges[r0 + k];
                size_t l = m->a.n + m->b.n;
                if (ab[2 * k] < 0 || ab[2 * k + 1] < 0 || l > 1024) { res[k] = -1; continue; }
                char *c = l <= 512 ? cat + 512 * nc : NULL;
                if (!c) { res[k] = -2; continue; }    /* long: looked up on its own below */
                memcpy(c, m->a.s, m->a.n);
                memcpy(c + m->a.n, m->b.s, m->b.n);
                q[nc] = c; ql[nc] = l;
                res[k] = -3 - (int32_t)nc;
                nc++;
            }
            int32_t found[FIND_BATCH];
            find_batch(t, nc, q, ql, found);
            for (size_t k = 0; k < nb; k++) {
                int32_t id = res[k];
                if (id == -1) continue;
                if (id == -2) {
                    const tok_merge *m = &s->merges[r0 + k];
                    char *big = malloc(m->a.n + m->b.n);
                    if (!big) continue;
                    memcpy(big, m->a.s, m->a.n);
                    memcpy(big + m->a.n, m->b.s, m->b.n);
                    id = tok_find(t, big, m->a.n + m->b.n);
                    free(big);
                } else {
                    id = found[-3 - id];
                }
                if (id < 0) continue;
                uint64_t key = ((uint64_t)(uint32_t)ab[2 * k] << 32) | (uint32_t)ab[2 * k + 1];
                uint32_t h = slot[k];
                while (t->mmap[h].key != UINT64_MAX && t->mmap[h].key != key) h = (h + 1) & t->mmask;
                if (t->mmap[h].key == key) continue;   /* first (lowest) rank wins */
                t->mmap[h].key = key;
                t->mmap[h].rank = (uint32_t)(r0 + k);
                t->mmap[h].res = id;
            }
        }
        free(cat);
    }
    /* SPM: the set of adjacent character pairs inside any token. Where two
     * neighbouring characters of a text form no such pair, no merge can ever
     * cross between them, so the text is merged in independent chunks. */
    if (t->type == TOK_SPM) {
        size_t np = 0;
        for (int32_t i = 0; i < n; i++) np += t->text_len[i];
        t->pmask = pow2_at_least(np + 16) - 1;
        t->pairs = malloc(sizeof(uint64_t) * ((size_t)t->pmask + 1));
        if (!t->pairs) { tok_free(t); return err_set(err, errlen, "tokenizer: out of memory"); }
        memset(t->pairs, 0xff, sizeof(uint64_t) * ((size_t)t->pmask + 1));
        for (int32_t i = 0; i < n; i++) {
            const unsigned char *p = (const unsigned char *)t->text + t->text_off[i];
            uint32_t len = t->text_len[i], prev = UINT32_MAX;
            for (uint32_t k = 0; k < len;) {
                size_t l = utf8_len_lead(p[k]);
                if (l > len - k) l = len - k;
                uint32_t cp = utf8_get(p + k, l);
                if (prev != UINT32_MAX) {
                    uint64_t key = ((uint64_t)prev << 32) | cp;
                    uint32_t h = (uint32_t)hash_pair(key) & t->pmask;
                    while (t->pairs[h] != UINT64_MAX && t->pairs[h] != key) h = (h + 1) & t->pmask;
                    t->pairs[h] = key;
                }
                prev = cp;
                k += (uint32_t)l;
            }
        }
    }
    /* pieces (decoded pieces are never longer than the text) */
    int16_t inv[324];
    for (unsigned i = 0; i < 324; i++) inv[i] = -1;
    for (unsigned b = 0; b < 256; b++) inv[byte_to_cp(b)] = (int16_t)b;
    off = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t l;
        piece_of(t, i, t->piece + off, &l, inv);
        t->piece_off[i] = (uint32_t)off;
        t->piece_len[i] = l;
        off += l;
    }
    /* special tokens matched in text: control, user-defined, unknown */
    size_t ns = 0;
    for (int32_t i = 0; i < n; i++) if (is_special_type(t->ttype[i]) && t->text_len[i]) ns++;
    t->special = malloc(sizeof(int32_t) * (ns ? ns : 1));
    if (!t->special) { tok_free(t); return err_set(err, errlen, "tokenizer: out of memory"); }
    ns = 0;
    for (int32_t i = 0; i < n; i++) if (is_special_type(t->ttype[i]) && t->text_len[i]) t->special[ns++] = i;
    qsort_r(t->special, ns, sizeof(int32_t), cmp_special, t);
    {
        size_t j = 0;
        for (unsigned b = 0; b <= 256; b++) {
            while (j < ns && (unsigned char)t->text[t->text_off[t->special[j]]] < b) j++;
            t->sp_first[b] = (uint32_t)j;
        }
        t->sp_first[256] = (uint32_t)ns;
    }
    /* end of generation */
    if (t->eot < 0 || t->eot >= n) {
        t->eot = -1;
        for (int k = 0; eot_names[k] && t->eot < 0; k++) {
            int32_t id = tok_find(t, eot_names[k], strlen(eot_names[k]));
            if (id >= 0 && t->ttype[id] != TT_NORMAL) t->eot = id;
        }
    }
    for (int k = 0; eog_names[k]; k++) {
        int32_t id = tok_find(t, eog_names[k], strlen(eog_names[k]));
        if (id >= 0 && t->ttype[id] != TT_NORMAL) t->eog[id] = 1;
    }
    if (t->bos >= n) t->bos = -1;
    if (t->eos >= n) t->eos = -1;
    if (t->unk >= n) t->unk = -1;
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (s->eom >= 0 && s->eom < n) t->eog[s->eom] = 1;
    t->add_bos = s->add_bos && t->bos >= 0;
    /* chat template */
    t->chat_template = malloc(s->chat_template.n + 1);
    if (!t->chat_template) { tok_free(t); return err_set(err, errlen, "tokenizer: out of memory"); }
    if (s->chat_template.n) memcpy(t->chat_template, s->chat_template.s, s->chat_template.n);
    t->chat_template[s->chat_template.n] = 0;
    t->chat_template_from = s->chat_template.n && s->chat_template_from ? s->chat_template_from : "";
    /* pre-tokenizer */
    if (t->type == TOK_BPE && s->regex) {
        int ec;
        PCRE2_SIZE eo;
        t->re = pcre2_compile((PCRE2_SPTR)s->regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        if (!t->re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            tok_free(t);
            return err_set(err, errlen, "tokenizer: split regex: %s at %zu", (const char *)msg, (size_t)eo);
        }
        t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    }
    *out = t;
    return 0;
}

void tok_free(tok *t)
{
    if (!t) return;
    free(t->text); free(t->text_off); free(t->text_len);
    free(t->piece); free(t->piece_off); free(t->piece_len);
    free(t->scores); free(t->ttype); free(t->eog); free(t->hmap); free(t->mmap); free(t->pairs);
    free(t->special); free(t->chat_template);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

/* ---- accessors -------------------------------------------------------- */

int32_t tok_n_vocab(const tok *t) { return t->n; }
int32_t tok_bos(const tok *t) { return t->bos; }
int32_t tok_eos(const tok *t) { return t->eos; }
int32_t tok_eot(const tok *t) { return t->eot; }
int tok_add_bos(const tok *t) { return t->add_bos; }
int tok_is_eog(const tok *t, int32_t id) { return id >= 0 && id < t->n && t->eog[id]; }
int tok_is_control(const tok *t, int32_t id) { return id >= 0 && id < t->n && t->ttype[id] == TT_CONTROL; }
const char *tok_chat_template(const tok *t) { return t->chat_template ? t->chat_template : ""; }
const char *tok_chat_template_from(const tok *t) { return t->chat_template_from ? t->chat_template_from : ""; }
const char *tok_kind_name(const tok *t) { return t->type == TOK_SPM ? "spm" : "bpe"; }
const char *tok_pre_name(const tok *t) { return t->pre_name; }
const char *tok_note(const tok *t) { return t->note; }

const char *tok_piece(const tok *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n) { *len = 0; return ""; }
    *len = t->piece_len[id];
    return t->piece + t->piece_off[id];
}

int tok_decode(const tok *t, const int32_t *ids, size_t n, char **text, size_t *len)
{
    size_t total = 0;
    *text = NULL; *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n) return -1;
        total += t->piece_len[ids[i]];
    }
    char *o = malloc(total + 1);
    if (!o) return -1;
    size_t k = 0;
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id == t->bos || id == t->eos) continue;
        const char *p = t->piece + t->piece_off[id];
        size_t l = t->piece_len[id];
        if (first && t->type == TOK_SPM && t->add_space_prefix && l && p[0] == ' ') { p++; l--; }
        first = 0;
        memcpy(o + k, p, l);
        k += l;
    }
    o[k] = 0;
    *text = o;
    *len = k;
    return 0;
}

/* ---- encoding --------------------------------------------------------- */

typedef struct sym { int32_t id; int32_t prev, next; uint32_t off, n; } sym;
/* A candidate merge of the symbol at `left` with the one after it. key orders
 * the heap: priority (BPE rank; SPM score, higher first) above, then `left`,
 * so ties go leftmost. Whether it is still valid is read from the symbols:
 * the left one is alive and it and its right neighbour together are still
 * `size` bytes long (a symbol changes only by taking in its right neighbour,
 * which makes it longer or its left neighbour's absorbed one). 16 bytes, so
 * that a node's four children fill one cache line. */
typedef struct bigram { uint64_t key; uint32_t size; int32_t res; } bigram;

typedef struct enc {
    const tok *t;
    int32_t *out; size_t n, cap;
    sym *syms; size_t syms_cap;
    bigram *heap; size_t hn, hcap;   /* heap = heap_mem + 3: children 4i+1.. share a line */
    void *heap_mem;
    char *buf; size_t buf_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;    /* with jst: made when the default JIT stack overflows */
    pcre2_jit_stack *jst;
    int oom;
    int fail_code;                /* TOK_E* of a failure other than OOM */
} enc;

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static void emit(enc *e, int32_t id)
{
    if (id < 0) return;
    if (e->n == e->cap && grow((void **)&e->out, &e->cap, e->n + 1, sizeof(int32_t))) { e->oom = 1; return; }
    e->out[e->n++] = id;
}

/* SPM scores, higher first, as a key part that sorts ascending; -0 is 0
 * (the scores compare equal) and NaN goes last. */
static uint64_t score_key(float f)
{
    if (f != f) return UINT32_MAX;
    f += 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (uint64_t)~asc;
}

/* The heap is 4-ary: half the depth of a binary one, and the children a
 * node compares are one cache line, which is what a long pre-token (a run
 * of a million spaces is one) spends its time on. */
static int heap_reserve(enc *e, size_t need)
{
    if (need <= e->hcap) return 0;
    size_t nc = e->hcap ? e->hcap : 256;
    while (nc < need) nc *= 2;
    void *m = NULL;
    if (posix_memalign(&m, 64, (nc + 4) * sizeof(bigram))) return -1;
    bigram *h = (bigram *)m + 3;
    if (e->hn) memcpy(h, e->heap, e->hn * sizeof *h);
    free(e->heap_mem);
    e->heap_mem = m;
    e->heap = h;
    e->hcap = nc;
    return 0;
}

static void heap_push(enc *e, uint64_t key, uint32_t size, int32_t res)
{
    if (e->hn == e->hcap && heap_reserve(e, e->hn + 1)) { e->oom = 1; return; }
    size_t i = e->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (e->heap[p].key <= key) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = (bigram){ key, size, res };
}

static bigram heap_pop(enc *e)
{
    bigram top = e->heap[0], last = e->heap[--e->hn];
    size_t i = 0, n = e->hn;
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n) break;
        size_t m = c;
        uint64_t mk = e->heap[c].key;
        size_t end = c + 4 < n ? c + 4 : n;
        for (size_t k = c + 1; k < end; k++)
            if (e->heap[k].key < mk) { m = k; mk = e->heap[k].key; }
        if (mk >= last.key) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* The left symbol of a popped candidate when it can still be merged, else -1. */
static int32_t bigram_left(const enc *e, const bigram *g)
{
    int32_t l = (int32_t)(uint32_t)g->key;
    const sym *a = &e->syms[l];
    if (a->n == 0 || a->next < 0 || a->n + e->syms[a->next].n != g->size) return -1;
    return l;
}

static void spm_try(enc *e, const char *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return;
    const sym *a = &e->syms[l], *b = &e->syms[r];
    int32_t id = tok_find(e->t, s + a->off, a->n + b->n);
    if (id < 0) return;
    heap_push(e, score_key(e->t->scores[id]) << 32 | (uint32_t)l, a->n + b->n, id);
}

/* SentencePiece: merge the adjacent pair whose union is the highest-scoring
 * token until none is left; symbols that are not tokens become bytes. */
static void bpe_merge(enc *e, size_t ns);

/* e->syms: one symbol per UTF-8 character of s[0..n), linked in order (with
 * `ids`, each character's id or -1); their count, 0 when none or out of
 * memory (e->oom set). */
static size_t spm_split(enc *e, const char *s, size_t n, int ids)
{
    size_t ns = 0;
    if (grow((void **)&e->syms, &e->syms_cap, n + 1, sizeof(sym))) { e->oom = 1; return 0; }
    for (size_t off = 0; off < n;) {
        size_t l = utf8_len_lead((unsigned char)s[off]);
        if (l > n - off) l = n - off;
        sym *y = &e->syms[ns];
        if (ids) y->id = tok_find(e->t, s + off, l);
        y->off = (uint32_t)off; y->n = (uint32_t)l;
        y->prev = (int32_t)ns - 1;
        off += l;
        y->next = off == n ? -1 : (int32_t)ns + 1;
        ns++;
    }
    return ns;
}

/* SentencePiece-style text under BPE merge ranks (a tokenizer.json "BPE"
 * model with byte_fallback: Llama-2, Mistral): one symbol per character,
 * rank-ordered merges, characters outside the vocabulary as byte tokens. */
static void spm_chunk_ranked(enc *e, const char *s, size_t n)
{
    const tok *t = e->t;
    size_t ns = spm_split(e, s, n, 1);
    if (!ns) return;
    bpe_merge(e, ns);
    for (int32_t i = 0; i != -1; i = e->syms[i].next) {
        const sym *y = &e->syms[i];
        if (y->id >= 0) { emit(e, y->id); continue; }
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t b = t->byte_id[(unsigned char)s[y->off + j]];
            emit(e, b >= 0 ? b : t->unk);
        }
    }
}

static void spm_chunk(enc *e, const char *s, size_t n)
{
    if (e->t->mmap) { spm_chunk_ranked(e, s, n); return; }
    size_t ns = spm_split(e, s, n, 0);
    if (!ns) return;
    e->hn = 0;
    for (size_t i = 1; i < ns; i++) spm_try(e, s, (int32_t)i - 1, (int32_t)i);
    while (e->hn && !e->oom) {
        bigram g = heap_pop(e);
        int32_t l = bigram_left(e, &g);
        if (l < 0) continue;
        sym *a = &e->syms[l], *b = &e->syms[a->next];
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0) e->syms[b->next].prev = l;
        spm_try(e, s, a->prev, l);
        spm_try(e, s, l, a->next);
    }
    for (int32_t i = 0; i != -1; i = e->syms[i].next) {
        const sym *y = &e->syms[i];
        int32_t id = tok_find(e->t, s + y->off, y->n);
        if (id >= 0) { emit(e, id); continue; }
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t b = e->t->byte_id[(unsigned char)s[y->off + j]];
            emit(e, b >= 0 ? b : e->t->unk);
        }
    }
}

static void bpe_try(enc *e, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return;
    const sym *a = &e->syms[l], *b = &e->syms[r];
    const merge_ent *m = merge_find(e->t, a->id, b->id);
    if (!m) return;
    heap_push(e, (uint64_t)m->rank << 32 | (uint32_t)l, a->n + b->n, m->res);
}

/* Byte-level BPE on one pre-token (raw bytes): start from one symbol per
 * byte, apply the lowest-ranked merge (leftmost on ties) until none applies. */
static void bpe_word(enc *e, const char *s, size_t n)
{
    const tok *t = e->t;
    if (n == 0) return;
    if (n == 1) { emit(e, t->byte_id[(unsigned char)s[0]] >= 0 ? t->byte_id[(unsigned char)s[0]] : t->unk); return; }
    if (t->ignore_merges) {
        if (grow((void **)&e->buf, &e->buf_cap, n * 2 + 1, 1)) { e->oom = 1; return; }
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += utf8_put(e->buf + k, byte_to_cp((unsigned char)s[i]));
        int32_t id = tok_find(t, e->buf, k);
        if (id >= 0) { emit(e, id); return; }
    }
    if (grow((void **)&e->syms, &e->syms_cap, n, sizeof(sym))) { e->oom = 1; return; }
    for (size_t i = 0; i < n; i++) {
        sym *y = &e->syms[i];
        y->id = t->byte_id[(unsigned char)s[i]];
        y->off = (uint32_t)i; y->n = 1;
        y->prev = (int32_t)i - 1;
        y->next = i + 1 == n ? -1 : (int32_t)i + 1;
    }
    bpe_merge(e, n);
    for (int32_t i = 0; i != -1; i = e->syms[i].next)
        emit(e, e->syms[i].id >= 0 ? e->syms[i].id : t->unk);
}

/* Rank-ordered merges over e->syms[0..ns) (ids set, linked in order). */
static void bpe_merge(enc *e, size_t ns)
{
    e->hn = 0;
    for (size_t i = 1; i < ns; i++) bpe_try(e, (int32_t)i - 1, (int32_t)i);
    while (e->hn && !e->oom) {
        bigram g = heap_pop(e);
        int32_t l = bigram_left(e, &g);
        if (l < 0) continue;
        sym *a = &e->syms[l], *b = &e->syms[a->next];
        a->id = g.res;
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0) e->syms[b->next].prev = l;
        bpe_try(e, a->prev, l);
        bpe_try(e, l, a->next);
    }
}

/* A character NFC keeps as it is (quick-check Yes, combining class 0) and
 * that never composes with the character before it: checked for these
 * ranges against Unicode's data (ASCII/Latin up to U+02FF, Cyrillic letters,
 * kana, CJK ideographs, Hangul syllables, emoji). Text splits before such a
 * character into parts that normalize independently. */
static int nfc_safe(uint32_t cp)
{
    return cp < 0x300 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x3041 && cp <= 0x3096) ||
           (cp >= 0x30A1 && cp <= 0x30FA) || (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3) ||
           (cp >= 0x1F300 && cp <= 0x1FAFF);
}

/* NFC of valid UTF-8: *out is NULL when the text is already NFC-stable by
 * nfc_safe; otherwise a malloc'd copy in which only the parts around other
 * characters went through utf8proc. */
static int nfc_text(const char *s, size_t n, char **out, size_t *outn, char *err, size_t errlen)
{
    const unsigned char *p = (const unsigned char *)s;
    char *o = NULL;
    size_t on = 0, cap = 0, copied = 0, prev = 0, i = 0;
    *out = NULL;
    while (i < n) {
        if (p[i] < 0x80) { prev = i++; continue; }
        size_t l = utf8_len_lead(p[i]);
        if (nfc_safe(utf8_get(p + i, l))) { prev = i; i += l; continue; }
        /* from the last starter before this character to the next safe one */
        size_t r0 = prev, r1 = i + l;
        while (r1 < n) {
            size_t l2 = utf8_len_lead(p[r1]);
            if (p[r1] < 0x80 || nfc_safe(utf8_get(p + r1, l2))) break;
            r1 += l2;
        }
        utf8proc_uint8_t *m = NULL;
        utf8proc_ssize_t r = utf8proc_map(p + r0, (utf8proc_ssize_t)(r1 - r0), &m, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) { free(m); free(o); return err_set(err, errlen, "tokenizer: NFC: %s", utf8proc_errmsg(r)); }
        size_t need = on + (r0 - copied) + (size_t)r + (n - r1) + 1;
        if (need > cap) {
            size_t nc = need + need / 2 + 64;
            char *no = realloc(o, nc);
            if (!no) { free(m); free(o); return err_set(err, errlen, "tokenizer: out of memory"); }
            o = no;
            cap = nc;
        }
        memcpy(o + on, s + copied, r0 - copied);
        on += r0 - copied;
        memcpy(o + on, m, (size_t)r);
        on += (size_t)r;
        free(m);
        copied = i = prev = r1;
    }
    if (!o) return 0;
    memcpy(o + on, s + copied, n - copied);
    on += n - copied;
    *out = o;
    *outn = on;
    return 0;
}

/* The JIT's default 32 KiB stack holds a few thousand iterations of a
 * repeated group (a custom split regex such as "(?:\\p{L}|\\p{M})+"); the
 * stack it falls back to takes a whole prompt's run (some 64 bytes an
 * iteration: 1 MiB of text), reserved as address space and touched only as
 * deep as a match goes. Same pattern, same matches: the ids do not change. */
#define RE_JIT_STACK_MAX (128u << 20)

static int re_match(enc *e, const char *s, size_t n, size_t start)
{
    const tok *t = e->t;
    for (;;) {
        int rc = t->re_jit
            ? pcre2_jit_match(t->re, (PCRE2_SPTR)s, n, start, 0, e->md, e->mctx)
            : pcre2_match(t->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || e->jst) return rc;
        e->mctx = pcre2_match_context_create(NULL);
        e->jst = pcre2_jit_stack_create(32u << 10, RE_JIT_STACK_MAX, NULL);
        if (!e->mctx || !e->jst) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(e->mctx, NULL, e->jst);
    }
}

static int re_split(enc *e, const char *s, size_t n, char *err, size_t errlen)
{
    const tok *t = e->t;
    if (!t->re) {
        bpe_word(e, s, n);
    } else {
        size_t gap = 0, start = 0;
        while (start < n && !e->oom) {
            int rc = re_match(e, s, n, start);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc == PCRE2_ERROR_NOMEMORY) { e->oom = 1; return -1; }
            if (rc < 0) {
                /* match/depth/heap limit or JIT stack: the text is too much
                 * for this (custom) pattern, not malformed */
                PCRE2_UCHAR msg[120];
                pcre2_get_error_message(rc, msg, sizeof msg);
                e->fail_code = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                               rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT
                               ? TOK_ELIMIT : TOK_EINTERNAL;
                return err_set(err, errlen, "tokenizer: the split regex gave up on this text: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) {     /* empty match: step over one character, keep it in the gap */
                start = ms + utf8_len_lead((unsigned char)s[ms]);
                continue;
            }
            if (ms > gap) bpe_word(e, s + gap, ms - gap);
            bpe_word(e, s + ms, me - ms);
            gap = start = me;
        }
        if (gap < n) bpe_word(e, s + gap, n - gap);
    }
    return 0;
}

static int bpe_text(enc *e, const char *s, size_t n, char *err, size_t errlen)
{
    const tok *t = e->t;
    char *norm = NULL;
    char *pre = NULL;
    if (t->nfc) {
        size_t nn = 0;
        if (nfc_text(s, n, &norm, &nn, err, errlen)) return -1;
        if (norm) { s = norm; n = nn; }
    }
    if (t->add_prefix_space && n && s[0] != ' ') {
        pre = malloc(n + 1);
        if (!pre) { free(norm); e->oom = 1; return -1; }
        pre[0] = ' ';
        memcpy(pre + 1, s, n);
        s = pre;
        n++;
    }
    int rc = 0;
    if (!t->split_digits) {
        rc = re_split(e, s, n, err, errlen);
    } else {
        /* every numeric character is a word of its own; the rest goes through the regex */
        size_t run = 0;
        for (size_t i = 0; i < n && rc == 0;) {
            size_t l = utf8_len_lead((unsigned char)s[i]);
            utf8proc_propval_t cat = utf8proc_category(utf8_get((const unsigned char *)s + i, l));
            if (cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO) {
                if (i > run) rc = re_split(e, s + run, i - run, err, errlen);
                bpe_word(e, s + i, l);
                run = i + l;
            }
            i += l;
        }
        if (rc == 0 && run < n) rc = re_split(e, s + run, n - run, err, errlen);
    }
    free(norm);
    free(pre);
    return rc ? -1 : e->oom ? -1 : 0;
}

static int spm_pair(const tok *t, uint32_t a, uint32_t b)
{
    uint64_t key = ((uint64_t)a << 32) | b;
    uint32_t h = (uint32_t)hash_pair(key) & t->pmask;
    for (;;) {
        if (t->pairs[h] == key) return 1;
        if (t->pairs[h] == UINT64_MAX) return 0;
        h = (h + 1) & t->pmask;
    }
}

static void spm_encode(enc *e, const char *s, size_t n)
{
    size_t start = 0, i = 0;
    uint32_t prev = UINT32_MAX;
    while (i < n) {
        size_t l = utf8_len_lead((unsigned char)s[i]);
        if (l > n - i) l = n - i;
        uint32_t cp = utf8_get((const unsigned char *)s + i, l);
        if (prev != UINT32_MAX && (!spm_pair(e->t, prev, cp) || (e->t->split_words && cp == 0x2581))) {
            spm_chunk(e, s + start, i - start);
            start = i;
        }
        prev = cp;
        i += l;
    }
    spm_chunk(e, s + start, n - start);
}

static int spm_text(enc *e, const char *s, size_t n, int prefix)
{
    size_t cap = (n + 1) * 3;
    if (grow((void **)&e->buf, &e->buf_cap, cap, 1)) { e->oom = 1; return -1; }
    size_t k = 0;
    if (prefix) { memcpy(e->buf, "\xE2\x96\x81", 3); k = 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(e->buf + k, "\xE2\x96\x81", 3); k += 3; }
        else e->buf[k++] = s[i];
    }
    /* spm_encode reads e->buf while it may grow e->syms/e->heap only */
    spm_encode(e, e->buf, k);
    return e->oom ? -1 : 0;
}

/* The longest special token that starts at p and fits in [p, end). */
static int32_t special_at(const tok *t, const char *p, const char *end, int parse_special)
{
    unsigned char c = (unsigned char)*p;
    for (uint32_t j = t->sp_first[c]; j < t->sp_first[c + 1]; j++) {
        int32_t id = t->special[j];
        uint32_t l = t->text_len[id];
        if (l > (size_t)(end - p)) continue;
        if (!parse_special && t->ttype[id] != TT_USER) continue;
        if (memcmp(p, t->text + t->text_off[id], l) == 0) return id;
    }
    return -1;
}

/* prev_special: 2 at the start of the text, 1 after a special token */
static int encode_fragment(enc *e, const char *s, size_t n, int prev_special, char *err, size_t errlen)
{
    if (n == 0) return 0;
    if (e->t->type == TOK_SPM)
        return spm_text(e, s, n, e->t->add_space_prefix == 1 ? prev_special != 0
                               : e->t->add_space_prefix == 2 ? prev_special == 2 : 0);
    return bpe_text(e, s, n, err, errlen);
}

int tok_encode_segs(const tok *t, const tok_seg *segs, size_t nseg,
                    int32_t **ids, size_t *n, char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    size_t total = 0;
    for (size_t i = 0; i < nseg; i++) {
        size_t bad;
        if (!segs[i].text && segs[i].len) return err_set(err, errlen, "tokenizer: NULL text");
        if (segs[i].len && !utf8_valid(segs[i].text, segs[i].len, &bad)) {
            err_set(err, errlen, "invalid UTF-8 in text at byte %zu", total + bad);
            return TOK_EUTF8;
        }
        total += segs[i].len;
    }
    enc e = { .t = t };
    char *all = NULL;
    static const tok_seg empty_seg = { "", 0, 0 };
    if (nseg == 0) { segs = &empty_seg; nseg = 1; }
    const char *s;
    int rc = -1;
    if (nseg == 1) {
        s = segs[0].text ? segs[0].text : "";
    } else {
        all = malloc(total + 1);
        if (!all) { err_set(err, errlen, "tokenizer: out of memory"); return TOK_ENOMEM; }
        size_t k = 0;
        for (size_t i = 0; i < nseg; i++) {
            if (segs[i].len) memcpy(all + k, segs[i].text, segs[i].len);
            k += segs[i].len;
        }
        s = all;
    }
    if (t->re) {
        e.md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!e.md) { e.oom = 1; goto done; }
    }
    if (grow((void **)&e.out, &e.cap, total / 3 + 16, sizeof(int32_t))) { e.oom = 1; goto done; }
    {
        size_t frag = 0, pos = 0;
        int prev_special = 2;
        for (size_t si = 0; si < nseg; si++) {
            const char *end = s + pos + segs[si].len;
            size_t segend = pos + segs[si].len;
            while (pos < segend) {
                unsigned char c = (unsigned char)s[pos];
                int32_t id = t->sp_first[c] == t->sp_first[c + 1] ? -1
                           : special_at(t, s + pos, end, segs[si].parse_special);
                if (id < 0) { pos++; continue; }
                if (encode_fragment(&e, s + frag, pos - frag, prev_special, err, errlen)) goto done;
                emit(&e, id);
                prev_special = 1;
                pos += t->text_len[id];
                frag = pos;
            }
        }
        if (frag < total && encode_fragment(&e, s + frag, total - frag, prev_special, err, errlen)) goto done;
    }
    if (e.oom) goto done;
    *ids = e.out;
    *n = e.n;
    e.out = NULL;
    rc = 0;
done:
    if (rc && e.oom) {
        err_set(err, errlen, "tokenizer: out of memory");
        rc = TOK_ENOMEM;
    } else if (rc && e.fail_code) {
        rc = e.fail_code;
    }
    free(e.out); free(e.syms); free(e.heap_mem); free(e.buf); free(all);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.mctx) pcre2_match_context_free(e.mctx);
    if (e.jst) pcre2_jit_stack_free(e.jst);
    return rc;
}

int tok_encode(const tok *t, const char *text, size_t len, int parse_special,
               int32_t **ids, size_t *n, char *err, size_t errlen)
{
    tok_seg sg = { text, len, parse_special };
    return tok_encode_segs(t, &sg, 1, ids, n, err, errlen);
}

/* ---- GGUF ------------------------------------------------------------- */

static int gstr_eq(gguf_str s, const char *c) { return s.n == strlen(c) && memcmp(s.s, c, s.n) == 0; }

/* The special token id under key, or -1 when absent or "none" (-1, or
 * 0xffffffff as converters write it); checked by check_ids beforehand. */
static int32_t gguf_id(const gguf *g, const char *key, int32_t n)
{
    int64_t v;
    if (gguf_get_i64(g, key, &v) || v < 0 || v >= n) return -1;
    return (int32_t)v;
}

/* Every tokenizer.ggml.*_token_id present is an integer naming a token of
 * the vocabulary (or "none"): a BOS or EOS past the vocabulary would be fed
 * to the model or never recognised. */
static int check_ids(const gguf *g, int32_t n, char *err, size_t errlen)
{
    static const char pre[] = "tokenizer.ggml.", suf[] = "_token_id";
    const size_t lp = sizeof pre - 1, ls = sizeof suf - 1;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        if (kv->key.n <= lp + ls || memcmp(kv->key.s, pre, lp) || memcmp(kv->key.s + kv->key.n - ls, suf, ls)) continue;
        int k = (int)(kv->key.n > 100 ? 100 : kv->key.n);
        char key[128];
        snprintf(key, sizeof key, "%.*s", k, kv->key.s);
        gguf_vtype t = kv->type;
        int uns = t == GGUF_T_UINT8 || t == GGUF_T_UINT16 || t == GGUF_T_UINT32 || t == GGUF_T_UINT64;
        int sig = t == GGUF_T_INT8 || t == GGUF_T_INT16 || t == GGUF_T_INT32 || t == GGUF_T_INT64;
        if (!uns && !sig)
            return err_set(err, errlen, "%s: metadata key '%s' is not an integer (expected a token id below %d)",
                           g->path, key, n);
        /* "none": -1, or its unsigned 32/64-bit pattern as converters write it */
        if ((sig && kv->v.i == -1) || (t == GGUF_T_UINT32 && kv->v.u == UINT32_MAX) || kv->v.u == UINT64_MAX) continue;
        if (sig ? kv->v.i < 0 || kv->v.i >= n : kv->v.u >= (uint64_t)n)
            return err_set(err, errlen, "%s: metadata key '%s' is %lld, expected a token id below the vocabulary "
                           "size %d", g->path, key, sig ? (long long)kv->v.i : (long long)kv->v.u, n);
    }
    return 0;
}

static const char *const pre_llama3[] = { "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                          "midm-2.0", "lfm2", NULL };
static const char *const pre_llama3_regex[] = { "smaug-bpe", "dbrx", NULL };
static const char *const pre_qwen2[] = { "qwen2", "deepseek-r1-qwen", "megrez", NULL };
static const char *const pre_gpt2[] = { "gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat",
                                        "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", NULL };

static int name_in(gguf_str s, const char *const *list)
{
    for (int i = 0; list[i]; i++) if (gstr_eq(s, list[i])) return 1;
    return 0;
}

int tok_load_gguf(tok **out, const gguf *g, char *err, size_t errlen)
{
    *out = NULL;
    gguf_str model;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model))
        return err_set(err, errlen, "GGUF has no tokenizer.ggml.model");
    tok_spec sp;
    memset(&sp, 0, sizeof sp);
    if (gstr_eq(model, "llama")) sp.type = TOK_SPM;
    else if (gstr_eq(model, "gpt2")) sp.type = TOK_BPE;
    else return err_set(err, errlen, "unsupported tokenizer model '%.*s'", (int)(model.n > 40 ? 40 : model.n), model.s);

    const gguf_kv *tk = gguf_get(g, "tokenizer.ggml.tokens");
    if (!tk || tk->type != GGUF_T_ARRAY || tk->arr_type != GGUF_T_STRING || tk->arr_n == 0 || tk->arr_n > (1u << 24))
        return err_set(err, errlen, "GGUF tokenizer.ggml.tokens missing or not a string array");
    int32_t n = (int32_t)tk->arr_n;
    if (check_ids(g, n, err, errlen)) return -1;
    const gguf_kv *sc = gguf_get(g, "tokenizer.ggml.scores");
    const gguf_kv *ty = gguf_get(g, "tokenizer.ggml.token_type");
    const gguf_kv *mg = gguf_get(g, "tokenizer.ggml.merges");
    if (sc && (sc->type != GGUF_T_ARRAY || sc->arr_n != (uint64_t)n || sc->arr_type == GGUF_T_STRING || sc->arr_type == GGUF_T_ARRAY))
        return err_set(err, errlen, "GGUF tokenizer.ggml.scores: not %d numbers", n);
    if (ty && (ty->type != GGUF_T_ARRAY || ty->arr_n != (uint64_t)n || ty->arr_type == GGUF_T_STRING || ty->arr_type == GGUF_T_ARRAY))
        return err_set(err, errlen, "GGUF tokenizer.ggml.token_type: not %d numbers", n);
    if (mg && (mg->type != GGUF_T_ARRAY || mg->arr_type != GGUF_T_STRING))
        return err_set(err, errlen, "GGUF tokenizer.ggml.merges: not a string array");
    if (sp.type == TOK_BPE && !mg)
        return err_set(err, errlen, "GGUF BPE tokenizer without tokenizer.ggml.merges");

    tok_sv *text = malloc(sizeof(tok_sv) * (size_t)n);
    float *scores = sc ? malloc(sizeof(float) * (size_t)n) : NULL;
    uint8_t *types = malloc((size_t)n);
    size_t nm = mg ? (size_t)mg->arr_n : 0;
    tok_merge *merges = nm ? malloc(sizeof(tok_merge) * nm) : NULL;
    int rc = -1;
    if (!text || !types || (sc && !scores) || (nm && !merges)) { err_set(err, errlen, "tokenizer: out of memory"); goto done; }
    for (int32_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(tk, (uint64_t)i);
        text[i].s = s.s; text[i].n = (size_t)s.n;
        if (scores) scores[i] = (float)gguf_arr_f64(sc, (uint64_t)i);
        if (scores && scores[i] != scores[i]) {   /* merge ranks: NaN orders nothing */
            err_set(err, errlen, "%s: tokenizer.ggml.scores[%d] is NaN, expected a number", g->path, (int)i);
            goto done;
        }
        int64_t v = ty ? gguf_arr_i64(ty, (uint64_t)i) : TT_NORMAL;
        types[i] = (uint8_t)(v >= TT_NORMAL && v <= TT_BYTE ? v : TT_NORMAL);
    }
    size_t k = 0;
    for (size_t i = 0; i < nm; i++) {
        gguf_str s = gguf_arr_str(mg, i);
        const char *sp1 = s.n > 1 ? memchr(s.s + 1, ' ', s.n - 1) : NULL;
        if (!sp1) continue;
        merges[k].a.s = s.s; merges[k].a.n = (size_t)(sp1 - s.s);
        merges[k].b.s = sp1 + 1; merges[k].b.n = (size_t)(s.s + s.n - sp1 - 1);
        k++;
    }
    sp.n_vocab = n;
    sp.text = text;
    sp.scores = scores;
    sp.ttype = types;
    sp.merges = merges;
    sp.n_merges = k;
    sp.bos = gguf_id(g, "tokenizer.ggml.bos_token_id", n);
    sp.eos = gguf_id(g, "tokenizer.ggml.eos_token_id", n);
    sp.eot = gguf_id(g, "tokenizer.ggml.eot_token_id", n);
    sp.eom = gguf_id(g, "tokenizer.ggml.eom_token_id", n);
    sp.unk = gguf_id(g, "tokenizer.ggml.unknown_token_id", n);
    gguf_str ct;
    if (gguf_get_str(g, "tokenizer.chat_template", &ct) == 0) { sp.chat_template.s = ct.s; sp.chat_template.n = (size_t)ct.n; sp.chat_template_from = "tokenizer.chat_template"; }
    char note[160] = "";
    char pre_name[32] = "spm";
    int b;
    if (sp.type == TOK_SPM) {
        sp.add_bos = 1;
        sp.add_space_prefix = 1;
        if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0) sp.add_space_prefix = b;
    } else {
        gguf_str pre = { "default", 7 };
        gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (name_in(pre, pre_llama3)) {
            sp.regex = TOK_RE_LLAMA3; sp.ignore_merges = 1; sp.add_bos = 1;
            snprintf(pre_name, sizeof pre_name, "llama-bpe");
        } else if (name_in(pre, pre_llama3_regex)) {
            sp.regex = TOK_RE_LLAMA3;
            snprintf(pre_name, sizeof pre_name, "llama-bpe");
        } else if (gstr_eq(pre, "smollm")) {
            sp.regex = TOK_RE_GPT2; sp.split_digits = 1;
            snprintf(pre_name, sizeof pre_name, "smollm");
        } else if (name_in(pre, pre_qwen2)) {
            /* Qwen's tokenizer.json normalizes to NFC; do the same here so both
             * files of one model give the same ids */
            sp.regex = TOK_RE_QWEN2; sp.nfc = 1;
            snprintf(pre_name, sizeof pre_name, "qwen2");
        } else {
            sp.regex = TOK_RE_GPT2;
            snprintf(pre_name, sizeof pre_name, "gpt-2");
            if (!name_in(pre, pre_gpt2))
                snprintf(note, sizeof note, "unknown pre-tokenizer '%.*s': using GPT-2 rules",
                         (int)(pre.n > 60 ? 60 : pre.n), pre.s);
        }
    }
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0) sp.add_bos = b;
    sp.pre_name = pre_name;
    sp.note = note[0] ? note : NULL;
    rc = tok_build(out, &sp, err, errlen);
done:
    free(text); free(scores); free(types); free(merges);
    return rc;
}
