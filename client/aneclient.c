/* aneclient — command-line client for aned. See `aneclient --help`. */
#include "client/aneclient.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#ifdef ANE_LIBEDIT
#include <editline/readline.h>
#endif

/* Exit codes: 1 runtime and 2 usage as in aned and aned-http; 3 and 4 tell
 * "no daemon" from "the daemon said no" for scripts. */
enum {
    EX_OK = 0, EX_FAIL = 1, EX_USAGE = 2, EX_CONNECT = 3, EX_REFUSED = 4, EX_INTERRUPTED = 130,
};

enum mode { M_GENERATE, M_EVAL, M_TOKENIZE, M_DETOKENIZE, M_INFO, M_PING, M_EMBED };

static volatile sig_atomic_t interrupted;
/* Connecting: nothing sent yet, so Ctrl-C has nothing to cancel. */
static volatile sig_atomic_t connecting;
/* Generated text went to a terminal and its last line is open: a newline is
 * owed before the shell's prompt, whichever way aneclient ends. */
static volatile sig_atomic_t line_open;
/* Reasoning is being shown dimmed on a terminal: the colour is reset first. */
static volatile sig_atomic_t dim_fd = -1;

static void on_sigint(int sig)
{
    (void)sig;
    if (interrupted || connecting) {   /* second Ctrl-C, or nothing to cancel yet: leave now */
        if (dim_fd >= 0) (void)!write(dim_fd, "\033[0m", 4);
        if (line_open) (void)!write(STDOUT_FILENO, "\n", 1);
        _exit(EX_INTERRUPTED);
    }
    interrupted = 1;
}

static void usage(FILE *f)
{
    char sock[256];
    ane_default_socket(sock, sizeof sock);
    fprintf(f,
"usage: aneclient [options] [PROMPT...]\n"
"Sends a prompt to aned and streams the reply. The prompt is the arguments\n"
"joined by spaces, then, when standard input is not a terminal, its text after\n"
"a blank line (cat notes.txt | aneclient \"Summarise:\"); with no arguments,\n"
"standard input alone. One trailing newline of it is dropped; empty input adds\n"
"nothing. --no-stdin never reads it (use it where standard input stays open,\n"
"as over ssh). On a terminal the reply ends with a newline; into a pipe or a\n"
"file it is written byte for byte.\n"
"\n"
"Modes (default: generate text):\n"
"      --tokens \"ID ...\"   these token ids as the prompt (stdin is not read)\n"
"      --messages FILE     a conversation as the prompt (see Conversations)\n"
"      --chat              a conversation typed line by line (see Conversations)\n"
"      --eval              print the top logits at every prompt position\n"
"      --top N             entries per position for --eval (1..%d, default 10)\n"
"      --embed             print the text's embedding (or --tokens'): a JSON array\n"
"                          of floats, unit length, pooled as aned --info says\n"
"      --tokenize          print the token ids of the text (--special, --no-bos)\n"
"      --detokenize        print the text of token ids (arguments or stdin)\n"
"      --info              print the daemon's model and load figures\n"
"      --ping              check that the daemon answers; print the round trip\n"
"\n"
"Generation:\n"
"  -n, --max-tokens N      tokens to generate (default 256; 0 = until the context\n"
"                          is full)\n"
"  -T, --temp, --temperature F  0 = greedy (default 0.8)\n"
"      --top-k N           0 = off (default 40)\n"
"      --top-p F           1 = off, 0 = the most likely token alone (default 0.95)\n"
"      --min-p F           0 = off (default 0.05)\n"
"      --repeat-penalty F  1 = off (default 1.0)\n"
"      --repeat-last-n N   window of the penalty (default 64)\n"
"      --seed N            same seed, same text (default: random)\n"
"      --stop STR          stop when STR is generated; repeatable (up to %d)\n"
"      --grammar FILE      output follows this GBNF grammar (llama.cpp's syntax)\n"
"      --json-schema FILE  output is JSON valid under this JSON Schema\n"
"      --regex RE          the whole output matches RE (classes, \\d \\w \\s, '.',\n"
"                          groups, |, * + ? {m,n})\n"
"      --choice TEXT       the output is one of the --choice texts; repeatable\n"
"      --system STR        system message, placed by the model's chat template.\n"
"                          Refused with --raw, --tokens and --messages; a model\n"
"                          without a template: aned decides (an error is shown)\n"
"      --logprobs N        print each generated token on a line of its own with its\n"
"                          log-probability and the N likeliest alternatives'\n"
"                          (0..%d), from the distribution the token was drawn from\n"
"                          (after --repeat-penalty and a grammar, before the\n"
"                          temperature): \"TOKEN\"<tab>LOGPROB<tab>| \"ALT\" LOGPROB ...\n"
"                          (bytes that are not whole UTF-8 shown as \\xNN)\n"
"      --raw               no chat template: continue the prompt as is\n"
"      --reasoning MODE    a thinking model's reasoning (<think>, gpt-oss analysis):\n"
"                          show (default): printed before the answer, dimmed, on\n"
"                          a terminal; on standard error when standard output is\n"
"                          not one, so that a pipe or file gets the answer alone;\n"
"                          hide: not printed; raw: left in the text as generated\n"
"      --keep-reasoning    the template sees earlier turns' reasoning (the\n"
"                          assistant messages' reasoning_content)\n"
"      --template-vars JSON  further variables for the chat template, a JSON\n"
"                          object, e.g. '{\"enable_thinking\": false}'\n"
"      --special           parse special tokens such as <|im_end|> in the text\n"
"      --no-bos            --tokenize: do not prepend BOS\n"
"      --no-stdin          never read standard input\n"
"\n"
"Output and connection:\n"
"      --json              one JSON object per line (see below)\n"
"  -v, --verbose           token counts and speeds on standard error\n"
"      --socket PATH       daemon socket (now: %s)\n"
"      --daemon-user USER  also trust a daemon run by USER (name or uid); by\n"
"                          default only one run by root or by you is used\n"
"  -h, --help              this text\n"
"  -V, --version           print the version\n"
"\n"
"Socket path when --socket is not given: $ANE_SOCKET if set; else\n"
"" ANE_SYSTEM_SOCKET " when run as root or when that socket exists; else\n"
"$XDG_RUNTIME_DIR/aned.sock when XDG_RUNTIME_DIR is set; else /tmp/aned-UID.sock.\n"
"\n"
"Conversations: aned keeps none between requests; each request carries the\n"
"whole conversation. --messages FILE (- = standard input) is a JSON array of\n"
"{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": \"...\"}; a PROMPT, if given,\n"
"is added as the last user message, and the reply is the assistant's next\n"
"turn. To go on, append {\"role\": \"assistant\", \"content\": REPLY} and the next\n"
"user message, and run again. Needs a model with a chat template (--info).\n"
"An assistant entry may carry \"reasoning_content\" (its reasoning).\n"
"--chat holds the conversation for you: each line read is a user message, sent\n"
"with the whole history; the reply is printed and kept (its reasoning apart,\n"
"as reasoning_content). With --messages FILE\n"
"the history starts from the file (answered at once when it ends with a user\n"
"message), with --system STR from that system message; a PROMPT is the first\n"
"line. Lines starting with / are commands: /reset (forget the conversation but\n"
"the system message), /system TEXT (set it; /system alone removes it), /quit\n"
"(or end of input), /help; //text sends /text. Ctrl-C stops a reply (what\n"
"was shown is kept) and, at the prompt, quits. On a terminal, lines are edited\n"
"and recalled as in a shell when aneclient was built with libedit.\n"
"\n"
"--json uses the protocol's event names and keys (PROTOCOL.md):\n"
"  {\"type\":\"token\",\"token\":ID,\"text\":\"...\"} per token (\"reasoning\":\"...\" too\n"
"  where it has some; with --logprobs also \"logprob\":F,\"top_logprobs\":\n"
"  [[ID,F,\"TOKEN\"],...]), then {\"type\":\"done\",\"finish\":\"...\",\"tokens\":[ID,...],\n"
"  \"text\":\"...\",(\"reasoning\":\"...\",)\"usage\":{...},\"timings\":{...}};\n"
"  --eval: {\"type\":\"done\",\"finish\":...,\"positions\":[{\"pos\":P,\"top\":[[ID,LOGIT]\n"
"  ,...]},...],\"usage\":...,\"timings\":...}, one line at the end;\n"
"  --embed {\"type\":\"done\",\"finish\":...,\"embedding\":[F,...],\"usage\":...,\n"
"  \"timings\":...};\n"
"  --tokenize {\"type\":\"tokens\",\"tokens\":[...]};\n"
"  --detokenize {\"type\":\"text\",\"text\":\"...\"};\n"
"  --info {\"type\":\"info\",...}; --ping {\"type\":\"pong\",\"ms\":F};\n"
"  errors {\"type\":\"error\",\"code\":\"...\",\"message\":\"...\"}.\n"
"Without --json, --eval prints a line per position: POS<tab>ID:LOGIT ID:LOGIT ...\n"
"\n"
"Ctrl-C cancels the request (a second one quits at once).\n"
"Exit status: 0 ok; 1 the request failed (aned answered an error, or standard\n"
"input could not be read); 2 usage error (as for aned and aned-http); 3 aned\n"
"cannot be reached or the connection was lost; 4 refused by aned (denied, busy,\n"
"version, shutting down); 130 interrupted.\n",
    PROTO_MAX_TOP, PROTO_MAX_STOP, PROTO_MAX_LOGPROBS, sock);
}

/* "aneclient: " and the message, then `tail`; exits with `status`. The
 * buffers held at that point are not leaks and nothing is registered to
 * run at exit: _exit after the flush, so that a leak checker does not
 * count whatever the error cut short (a pointer no longer in a register
 * or on the stack reads to it as lost). */
static void vdie(int status, const char *tail, const char *fmt, va_list ap) __attribute__((noreturn));
static void vdie(int status, const char *tail, const char *fmt, va_list ap)
{
    fputs("aneclient: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(tail, stderr);
    fflush(NULL);
    _exit(status);
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdie(EX_USAGE, "\nTry 'aneclient --help'.\n", fmt, ap);
}

static void die_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdie(EX_FAIL, "\n", fmt, ap);
}

static long long parse_int(const char *opt, const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die_usage("%s: \"%s\" is not an integer in [%lld, %lld]", opt, s, lo, hi);
    return v;
}

static unsigned long long parse_u64(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    if (*s == '-') die_usage("%s: \"%s\" must not be negative", opt, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) die_usage("%s: \"%s\" is not a non-negative integer", opt, s);
    return v;
}

static float parse_float(const char *opt, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        die_usage("%s: \"%s\" is not a number in [%g, %g]", opt, s, lo, hi);
    return (float)v;
}

/* Token ids separated by spaces, commas or newlines. */
static int32_t *parse_ids(const char *what, const char *s, size_t *n)
{
    size_t cap = 64, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) die_fail("out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && !strchr(" ,\n\t\r[]", *end)))
            die_usage("%s: \"%.20s\" is not a token id", what, p);
        if (k == PROTO_MAX_TOKENS) die_usage("%s: more than %d token ids", what, PROTO_MAX_TOKENS);
        if (k == cap) {
            cap *= 2;
            int32_t *q = realloc(ids, cap * sizeof *ids);
            if (!q) die_fail("out of memory");
            ids = q;
        }
        ids[k++] = (int32_t)v;
        p = end;
    }
    *n = k;
    return ids;
}

/* All of standard input, at most max bytes. A closed descriptor 0 reads as
 * empty. */
static char *read_stdin(size_t max, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) die_fail("out of memory");
    for (;;) {
        if (n == cap) {
            if (cap > max) break;
            cap *= 2;
            char *p = realloc(buf, cap + 1);
            if (!p) die_fail("out of memory");
            buf = p;
        }
        ssize_t got = read(STDIN_FILENO, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && errno == EBADF && n == 0) break;
        if (got < 0) die_fail("reading standard input: %s", strerror(errno));
        if (got == 0) break;
        n += (size_t)got;
    }
    if (n > max) die_usage("standard input is longer than %zu bytes", max);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Drops one trailing newline (\n or \r\n). */
static void chomp(char *s, size_t *len)
{
    if (*len && s[*len - 1] == '\n') (*len)--;
    if (*len && s[*len - 1] == '\r') (*len)--;
    s[*len] = 0;
}

/* a, a blank line, b: a new string. */
static char *join2(const char *a, size_t al, const char *b, size_t bl, size_t *len)
{
    char *r = malloc(al + 2 + bl + 1);
    if (!r) die_fail("out of memory");
    memcpy(r, a, al);
    memcpy(r + al, "\n\n", 2);
    memcpy(r + al + 2, b, bl);
    *len = al + 2 + bl;
    r[*len] = 0;
    return r;
}

/* --messages FILE: a JSON array of {"role", "content"}, checked here so that
 * a mistake names the file and the entry. extra (may be NULL) is appended as
 * the last user message. The strings stay owned by *root. */
static proto_msg *load_messages(const char *path, const char *extra, size_t extra_len,
                                json_t **root, size_t *n_out)
{
    json_error_t je;
    const char *name = strcmp(path, "-") ? path : "standard input";
    json_t *a = strcmp(path, "-") ? json_load_file(path, JSON_ALLOW_NUL, &je)
                                   : json_loadf(stdin, JSON_ALLOW_NUL, &je);
    if (!a && je.line > 0) die_usage("--messages %s: %s (line %d, column %d)", name, je.text, je.line, je.column);
    if (!a) die_usage("--messages %s: %s", name, je.text);
    if (!json_is_array(a)) die_usage("--messages %s: expected a JSON array of {\"role\", \"content\"}", name);
    size_t n = json_array_size(a), total = extra ? extra_len : 0;
    if (n + (extra != NULL) == 0) die_usage("--messages %s: no messages", name);
    if (n + (extra != NULL) > PROTO_MAX_MSGS)
        die_usage("--messages %s: %zu messages; aned takes at most %d", name, n + (extra != NULL), PROTO_MAX_MSGS);
    proto_msg *m = calloc(n + 1, sizeof *m);
    if (!m) die_fail("out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(a, i), *r = json_object_get(e, "role"), *c = json_object_get(e, "content");
        if (!json_is_object(e)) die_usage("--messages %s: entry %zu is not an object", name, i);
        const char *rs = json_is_string(r) ? json_string_value(r) : "";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            die_usage("--messages %s: entry %zu: \"role\" must be \"system\", \"user\" or \"assistant\"", name, i);
        if (c && !json_is_null(c) && !json_is_string(c))
            die_usage("--messages %s: entry %zu: \"content\" must be a string", name, i);
        json_t *rc = json_object_get(e, "reasoning_content");
        if (rc && !json_is_null(rc)) {
            if (!json_is_string(rc)) die_usage("--messages %s: entry %zu: \"reasoning_content\" must be a string", name, i);
            json_t *x = json_pack("{sO}", "reasoning_content", rc);
            char *xs = x ? json_dumps(x, JSON_COMPACT) : NULL;   /* freed by msgs_free */
            json_decref(x);
            if (!xs) die_fail("out of memory");
            m[i].extra = xs;
            m[i].extra_len = strlen(xs);
        }
        m[i].role = json_string_value(r);
        m[i].role_len = json_string_length(r);
        m[i].content = json_is_string(c) ? json_string_value(c) : "";
        m[i].content_len = json_is_string(c) ? json_string_length(c) : 0;
        total += m[i].content_len;
    }
    if (total > PROTO_MAX_PROMPT)
        die_usage("--messages %s: the contents add up to %zu bytes; aned takes at most %d", name, total, PROTO_MAX_PROMPT);
    if (extra) m[n++] = (proto_msg){ "user", 4, extra, extra_len, NULL, 0 };
    *root = a;
    *n_out = n;
    return m;
}

static void msgs_free(proto_msg *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++) free((char *)m[i].extra);
    free(m);
}

/* ---- JSON output ---- */

static void json_str(FILE *f, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                fputs("\\u00", f);
                fputc(hex[c >> 4], f);
                fputc(hex[c & 15], f);
            } else if (c >= 0x80) {
                /* Whole valid characters pass through; anything else is U+FFFD. */
                size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
                if (len > 1 && i + len <= n && proto_utf8_valid(s + i, len)) {
                    fwrite(s + i, 1, len, f);
                    i += len - 1;
                } else {
                    fputs("\\ufffd", f);
                }
            } else {
                fputc(c, f);
            }
        }
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, "%.9g", v);
    else fputs("null", f);
}

/* --logprobs: a token's bytes quoted, what is not whole UTF-8 or printable as \xNN */
static void show_tok(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (c >= 0x80 && len > 1 && i + len <= n && proto_utf8_valid(s + i, len)) { fwrite(s + i, 1, len, f); i += len - 1; }
        else if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void print_logprobs(FILE *f, const proto_ev *ev)
{
    show_tok(f, ev->bytes ? ev->bytes : "", ev->bytes_len);
    fprintf(f, "\t%.6f", ev->has_logprob ? ev->logprob : 0.0);
    for (size_t i = 0; i < ev->n_lps; i++) {
        fputs(i ? "  " : "\t| ", f);
        show_tok(f, ev->lps[i].bytes, ev->lps[i].bytes_len);
        fprintf(f, " %.6f", ev->lps[i].logprob);
    }
    fputc('\n', f);
}

static void json_usage_timings(FILE *f, const proto_ev *ev)
{
    fprintf(f, "\"usage\":{\"prompt_tokens\":%u,\"cached_tokens\":%u,\"completion_tokens\":%u}",
            ev->prompt_tokens, ev->cached_tokens, ev->completion_tokens);
    double pre = ev->prompt_tokens > ev->cached_tokens ? ev->prompt_tokens - ev->cached_tokens : 0;
    fprintf(f, ",\"timings\":{\"queue_ms\":%.3f,\"prefill_ms\":%.3f,\"decode_ms\":%.3f,"
               "\"prefill_tps\":%.2f,\"decode_tps\":%.2f}",
            ev->queue_ms, ev->prefill_ms, ev->decode_ms,
            ev->prefill_ms > 0 ? pre * 1000.0 / ev->prefill_ms : 0.0,
            ev->decode_ms > 0 ? ev->completion_tokens * 1000.0 / ev->decode_ms : 0.0);
}

static void json_info(FILE *f, const proto_ev *e)
{
    fputs("{\"type\":\"info\",\"version\":", f);
    fprintf(f, "%u", e->version);
    fputs(",\"server\":", f); json_str(f, e->server, e->server_len);
    fputs(",\"model\":", f); json_str(f, e->model, e->model_len);
    fputs(",\"model_path\":", f); json_str(f, e->model_path, e->model_path_len);
    fputs(",\"arch\":", f); json_str(f, e->arch, e->arch_len);
    fputs(",\"backend\":", f); json_str(f, e->backend, e->backend_len);
    fputs(",\"chat_template\":", f); json_str(f, e->chat_template, e->chat_template_len);
    fputs(",\"warning\":", f); json_str(f, e->warning, e->warning_len);
    fprintf(f, ",\"n_vocab\":%d,\"n_ctx\":%d,\"n_layer\":%d,\"n_embd\":%d,\"tokenizer_only\":%s",
            e->n_vocab, e->n_ctx, e->n_layer, e->n_embd, e->tokenizer_only ? "true" : "false");
    if (e->pooling) { fputs(",\"pooling\":", f); json_str(f, e->pooling, strlen(e->pooling)); }
    if (e->pooling_source) { fputs(",\"pooling_source\":", f); json_str(f, e->pooling_source, strlen(e->pooling_source)); }
    fprintf(f, ",\"active\":%u,\"queued\":%u,\"clients\":%u", e->active, e->queued, e->clients);
    fprintf(f, ",\"jobs_done\":%llu,\"tokens_served\":%llu,\"prompt_tokens_total\":%llu",
            (unsigned long long)e->jobs_done, (unsigned long long)e->tokens_served,
            (unsigned long long)e->prompt_tokens_total);
    fprintf(f, ",\"kv_used\":%llu,\"kv_total\":%llu,\"kv_tokens\":%llu,\"swa_ring\":%u", (unsigned long long)e->kv_used,
            (unsigned long long)e->kv_total, (unsigned long long)e->kv_tokens, e->swa_ring);
    fprintf(f, ",\"weight_bytes\":%llu,\"uptime_s\":%.3f",
            (unsigned long long)e->weight_bytes, e->uptime_s);
    fputs(",\"per_client\":[", f);
    for (size_t i = 0; i < e->n_per_client; i++)
        fprintf(f, "%s{\"uid\":%u,\"pid\":%u,\"active\":%u,\"queued\":%u}", i ? "," : "",
                e->per_client[i].uid, e->per_client[i].pid, e->per_client[i].active, e->per_client[i].queued);
    fputs("]}\n", f);
}

static void text_info(FILE *f, const proto_ev *e)
{
    fprintf(f, "server:          %.*s (protocol %u)\n", (int)e->server_len, e->server, e->version);
    fprintf(f, "model:           %.*s\n", (int)e->model_len, e->model);
    if (e->model_path_len) fprintf(f, "path:            %.*s\n", (int)e->model_path_len, e->model_path);
    fprintf(f, "arch:            %.*s%s\n", (int)e->arch_len, e->arch, e->tokenizer_only ? " (tokenizer only)" : "");
    fprintf(f, "backend:         %.*s\n", (int)e->backend_len, e->backend);
    fprintf(f, "chat template:   %.*s\n", (int)e->chat_template_len, e->chat_template);
    if (e->warning_len) fprintf(f, "warning:         %.*s\n", (int)e->warning_len, e->warning);
    fprintf(f, "vocab/ctx:       %d / %d\n", e->n_vocab, e->n_ctx);
    fprintf(f, "layers/embd:     %d / %d\n", e->n_layer, e->n_embd);
    if (e->pooling) fprintf(f, "embeddings:      %s pooling (%s)\n", e->pooling, e->pooling_source ? e->pooling_source : "?");
    fprintf(f, "weights:         %.1f MiB\n", (double)e->weight_bytes / 1048576.0);
    fprintf(f, "kv cache:        %.1f / %.1f MiB (%llu tokens", (double)e->kv_used / 1048576.0,
            (double)e->kv_total / 1048576.0, (unsigned long long)e->kv_tokens);
    if (e->swa_ring) fprintf(f, "; sliding-window layers: %u per sequence", e->swa_ring);
    fputs(")\n", f);
    fprintf(f, "jobs:            %u active, %u queued, %llu done\n", e->active, e->queued,
            (unsigned long long)e->jobs_done);
    fprintf(f, "tokens:          %llu prompt, %llu generated\n",
            (unsigned long long)e->prompt_tokens_total, (unsigned long long)e->tokens_served);
    fprintf(f, "clients:         %u\n", e->clients);
    for (size_t i = 0; i < e->n_per_client; i++)
        fprintf(f, "  uid %u pid %u: %u active, %u queued\n", e->per_client[i].uid, e->per_client[i].pid,
                e->per_client[i].active, e->per_client[i].queued);
    fprintf(f, "uptime:          %.1f s\n", e->uptime_s);
}

/* ---- main ---- */

typedef struct run {
    enum mode mode;
    int json, verbose;
    int tty_out;
    int chat;                                     /* --chat: the reply's text kept in acc */
    int logprobs;                                 /* --logprobs: a line per token */
    int hide_reasoning;                           /* --reasoning hide */
    FILE *reason_out;                             /* where reasoning is being shown, or NULL */
    int reason_dim, reason_nl;                    /* ... dimmed; its last byte was a newline */
    char *racc; size_t racc_len; FILE *raccf;    /* the reply's reasoning (generate) */
    /* accumulated for --json done / --eval --json */
    char *acc; size_t acc_len; FILE *accf;       /* text (generate) or positions (eval) */
    char *toks; size_t toks_len; FILE *toksf;    /* generated ids, JSON */
    size_t n_gen;
    long long t0_ns;
    ane_client *cl;
    uint64_t id;
    int rc;                                       /* exit code once decided, else -1 */
    int cancel_sent;
    long long cancel_deadline_ns;
} run;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Closes a line of generated text left open on a terminal. */
static void end_line(void)
{
    if (!line_open) return;
    fputc('\n', stdout);
    fflush(stdout);
    line_open = 0;
}

static int is_refusal(proto_err c)
{
    return c == PROTO_E_BUSY || c == PROTO_E_DENIED || c == PROTO_E_VERSION || c == PROTO_E_SHUTDOWN;
}

static void report_error(const run *R, const char *code, const char *msg, size_t msg_len)
{
    if (R->json) {
        fputs("{\"type\":\"error\",\"code\":", stdout);
        json_str(stdout, code, strlen(code));
        fputs(",\"message\":", stdout);
        json_str(stdout, msg, msg_len);
        fputs("}\n", stdout);
        fflush(stdout);
    } else {
        end_line();
        fprintf(stderr, "aneclient: %s: %.*s\n", code, (int)msg_len, msg);
    }
}

/* Reasoning text as it comes: before the answer, dimmed where it goes to a
 * terminal; to standard error when standard output is not one (so that a
 * pipe or a file gets the answer alone). */
static void reason_show(run *R, const char *s, size_t n)
{
    if (R->hide_reasoning) return;
    if (!R->reason_out) {
        R->reason_out = R->tty_out ? stdout : stderr;
        R->reason_dim = isatty(fileno(R->reason_out));
        if (R->reason_dim) { fputs("\033[2m", R->reason_out); dim_fd = fileno(R->reason_out); }
    }
    fwrite(s, 1, n, R->reason_out);
    R->reason_nl = s[n - 1] == '\n';
    if (R->reason_out == stdout) line_open = !R->reason_nl;
    fflush(R->reason_out);
}

/* The reasoning shown is over: the colour reset; before the answer (gap) a
 * blank line after it on the terminal, a line end on standard error. */
static void reason_end(run *R, int gap)
{
    if (!R->reason_out) return;
    if (R->reason_dim) fputs("\033[0m", R->reason_out);
    dim_fd = -1;
    if (R->reason_out == stdout) {
        if (gap) fputs(R->reason_nl ? "\n" : "\n\n", stdout);
        line_open = 0;
        if (!gap && !R->reason_nl) line_open = 1;
    } else if (!R->reason_nl) {
        fputc('\n', stderr);
    }
    fflush(R->reason_out);
    R->reason_out = NULL;
}

/* Handles one event of our request; returns -1 to go on, else the exit code. */
static int on_event(run *R, const proto_ev *ev)
{
    switch (ev->type) {
    case PROTO_T_TOKEN:
        R->n_gen++;
        if (R->json) {
            fprintf(stdout, "{\"type\":\"token\",\"token\":%d,\"text\":", ev->token);
            json_str(stdout, ev->text, ev->text_len);
            if (ev->reasoning) { fputs(",\"reasoning\":", stdout); json_str(stdout, ev->reasoning, ev->reasoning_len); }
            if (ev->has_logprob) {
                fputs(",\"logprob\":", stdout);
                json_num(stdout, ev->logprob);
                fputs(",\"top_logprobs\":[", stdout);
                for (size_t i = 0; i < ev->n_lps; i++) {
                    fprintf(stdout, "%s[%d,", i ? "," : "", ev->lps[i].id);
                    json_num(stdout, ev->lps[i].logprob);
                    fputc(',', stdout);
                    json_str(stdout, ev->lps[i].bytes, ev->lps[i].bytes_len);
                    fputc(']', stdout);
                }
                fputc(']', stdout);
            }
            fputs("}\n", stdout);
            fprintf(R->toksf, "%s%d", R->n_gen > 1 ? "," : "", ev->token);
            fwrite(ev->text, 1, ev->text_len, R->accf);
        } else if (R->logprobs) {
            print_logprobs(stdout, ev);
        } else {
            if (ev->reasoning_len) reason_show(R, ev->reasoning, ev->reasoning_len);
            if (ev->text_len) {
                reason_end(R, 1);
                if (R->chat) fwrite(ev->text, 1, ev->text_len, R->accf);
                fwrite(ev->text, 1, ev->text_len, stdout);
                line_open = R->tty_out && ev->text[ev->text_len - 1] != '\n';
            }
        }
        if (ev->reasoning_len && R->raccf) fwrite(ev->reasoning, 1, ev->reasoning_len, R->raccf);
        fflush(stdout);
        return -1;
    case PROTO_T_LOGITS:
        if (R->json) {
            fprintf(R->accf, "%s{\"pos\":%d,\"top\":[", R->n_gen ? "," : "", ev->pos);
            for (size_t i = 0; i < ev->n_top; i++) {
                fprintf(R->accf, "%s[%d,", i ? "," : "", ev->top[i].id);
                json_num(R->accf, ev->top[i].logit);
                fputc(']', R->accf);
            }
            fputs("]}", R->accf);
        } else {
            fprintf(stdout, "%d", ev->pos);
            for (size_t i = 0; i < ev->n_top; i++) fprintf(stdout, "%c%d:%.6g", i ? ' ' : '\t', ev->top[i].id, ev->top[i].logit);
            fputc('\n', stdout);
            fflush(stdout);
        }
        R->n_gen++;
        return -1;
    case PROTO_T_EMBEDDING:
        fputc('[', R->accf);
        for (size_t i = 0; i < ev->n_embedding; i++) {
            if (i) fputc(',', R->accf);
            json_num(R->accf, ev->embedding[i]);
        }
        fputc(']', R->accf);
        R->n_gen++;
        return -1;
    case PROTO_T_DONE: {
        int cancelled = ev->finish_len == 9 && memcmp(ev->finish, "cancelled", 9) == 0;
        if (R->json) {
            fflush(R->accf);
            fflush(R->toksf);
            fputs("{\"type\":\"done\",\"finish\":", stdout);
            json_str(stdout, ev->finish, ev->finish_len);
            if (R->mode == M_EVAL) {
                fputs(",\"positions\":[", stdout);
                fwrite(R->acc, 1, R->acc_len, stdout);
                fputs("],", stdout);
            } else if (R->mode == M_EMBED) {
                fputs(",\"embedding\":", stdout);
                if (R->acc_len) fwrite(R->acc, 1, R->acc_len, stdout);
                else fputs("null", stdout);
                fputc(',', stdout);
            } else {
                fputs(",\"tokens\":[", stdout);
                fwrite(R->toks, 1, R->toks_len, stdout);
                fputs("],\"text\":", stdout);
                json_str(stdout, R->acc, R->acc_len);
                if (R->raccf) fflush(R->raccf);
                if (R->racc_len) { fputs(",\"reasoning\":", stdout); json_str(stdout, R->racc, R->racc_len); }
                fputc(',', stdout);
            }
            json_usage_timings(stdout, ev);
            fputs("}\n", stdout);
        } else if (R->mode == M_EMBED) {
            fflush(R->accf);
            if (R->acc_len) { fwrite(R->acc, 1, R->acc_len, stdout); fputc('\n', stdout); }
        } else {
            reason_end(R, 0);
            end_line();
        }
        fflush(stdout);
        if (R->verbose) {
            double pre = ev->prompt_tokens > ev->cached_tokens ? ev->prompt_tokens - ev->cached_tokens : 0;
            fprintf(stderr, "\n[%s] prompt %u tokens (%u cached) in %.1f ms (%.1f t/s), "
                    "%u generated in %.1f ms (%.1f t/s), queued %.1f ms, total %.1f ms\n",
                    ev->finish, ev->prompt_tokens, ev->cached_tokens, ev->prefill_ms,
                    ev->prefill_ms > 0 ? pre * 1000 / ev->prefill_ms : 0.0,
                    ev->completion_tokens, ev->decode_ms,
                    ev->decode_ms > 0 ? ev->completion_tokens * 1000.0 / ev->decode_ms : 0.0,
                    ev->queue_ms, (double)(now_ns() - R->t0_ns) / 1e6);
        }
        return cancelled && interrupted ? EX_INTERRUPTED : EX_OK;
    }
    case PROTO_T_ERROR: {
        const char *name = proto_err_name(ev->code);
        report_error(R, name, ev->message, ev->message_len);
        return is_refusal(ev->code) ? EX_REFUSED : EX_FAIL;
    }
    case PROTO_T_TOKENS:
        if (R->json) fputs("{\"type\":\"tokens\",\"tokens\":[", stdout);
        for (size_t i = 0; i < ev->n_tokens; i++) fprintf(stdout, i ? (R->json ? ",%d" : " %d") : "%d", ev->tokens[i]);
        fputs(R->json ? "]}\n" : "\n", stdout);
        fflush(stdout);
        return EX_OK;
    case PROTO_T_TEXT:
        if (R->json) {
            fputs("{\"type\":\"text\",\"text\":", stdout);
            json_str(stdout, ev->text, ev->text_len);
            fputs("}\n", stdout);
        } else {
            fwrite(ev->text, 1, ev->text_len, stdout);
            if (R->tty_out && (!ev->text_len || ev->text[ev->text_len - 1] != '\n')) fputc('\n', stdout);
        }
        fflush(stdout);
        return EX_OK;
    case PROTO_T_INFO_OK:
        if (R->json) json_info(stdout, ev);
        else text_info(stdout, ev);
        fflush(stdout);
        return EX_OK;
    case PROTO_T_PONG: {
        double ms = (double)(now_ns() - R->t0_ns) / 1e6;
        if (R->json) printf("{\"type\":\"pong\",\"ms\":%.3f}\n", ms);
        else printf("pong from aned: %.3f ms\n", ms);
        fflush(stdout);
        return EX_OK;
    }
    default:
        return -1;
    }
}

/* ane_run callback: our request's events, connection errors, and Ctrl-C. */
static int on_run_event(const proto_ev *ev, void *arg)
{
    run *R = arg;
    if (interrupted && !R->cancel_sent) {
        char err[256];
        R->cancel_sent = 1;
        R->cancel_deadline_ns = now_ns() + 2000000000LL;   /* wait briefly for done */
        if (ane_cancel(R->cl, R->id, err, sizeof err) < 0) { R->rc = EX_INTERRUPTED; return 1; }
    }
    if (R->cancel_sent && now_ns() > R->cancel_deadline_ns) { R->rc = EX_INTERRUPTED; return 1; }
    if (!ev) return 0;
    if (ev->id == 0 && ev->type == PROTO_T_ERROR) {   /* about the connection */
        report_error(R, proto_err_name(ev->code), ev->message, ev->message_len);
        R->rc = is_refusal(ev->code) ? EX_REFUSED : EX_FAIL;
        return 1;
    }
    if (ev->id != R->id) return 0;
    int r = on_event(R, ev);
    if (r >= 0) R->rc = interrupted ? EX_INTERRUPTED : r;
    return 0;   /* ane_run returns after the terminal event */
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* ---- --chat: a conversation kept here, sent whole with each turn ---- */

typedef struct hmsg {
    char *role, *content;
    size_t len;
    char *reasoning;          /* an assistant turn's reasoning (reasoning_content), or NULL */
} hmsg;

typedef struct hist {
    hmsg *m;
    size_t n, cap;
} hist;

static void hist_add(hist *h, const char *role, const char *content, size_t len)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 16;
        hmsg *q = realloc(h->m, h->cap * sizeof *q);
        if (!q) die_fail("out of memory");
        h->m = q;
    }
    hmsg *e = &h->m[h->n];
    e->role = strdup(role);
    e->content = malloc(len + 1);
    if (!e->role || !e->content) die_fail("out of memory");
    memcpy(e->content, content, len);
    e->content[len] = 0;
    e->len = len;
    e->reasoning = NULL;
    h->n++;
}

/* Drops the messages from i on. */
static void hist_cut(hist *h, size_t i)
{
    while (h->n > i) {
        h->n--;
        free(h->m[h->n].role);
        free(h->m[h->n].content);
        free(h->m[h->n].reasoning);
    }
}

static int has_system(const hist *h) { return h->n && !strcmp(h->m[0].role, "system"); }

/* Sets (text != NULL) or removes the system message, which is the first. */
static void hist_system(hist *h, const char *text, size_t len)
{
    if (has_system(h)) {
        free(h->m[0].role);
        free(h->m[0].content);
        free(h->m[0].reasoning);
        memmove(h->m, h->m + 1, (h->n - 1) * sizeof *h->m);
        h->n--;
    }
    if (!text) return;
    hist_add(h, "system", text, len);
    hmsg last = h->m[h->n - 1];
    memmove(h->m + 1, h->m, (h->n - 1) * sizeof *h->m);
    h->m[0] = last;
}

/* One line of standard input without its newline; NULL at its end. */
static char *chat_line(int tty, size_t *len)
{
#ifdef ANE_LIBEDIT
    if (tty) {
        char *l = readline("> ");
        if (!l) return NULL;
        if (*l) add_history(l);
        *len = strlen(l);
        return l;
    }
#endif
    if (tty) { fputs("> ", stdout); fflush(stdout); }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) { free(line); return NULL; }
    size_t l = (size_t)n;
    chomp(line, &l);
    *len = l;
    return line;
}

static void chat_help(void)
{
    fputs("/reset         forget the conversation (the system message stays)\n"
          "/system TEXT   set the system message; /system alone removes it\n"
          "/quit          leave (so does the end of input)\n"
          "//text         send a line that starts with /\n", stderr);
}

/* One turn: the history (ending with the user's message) to aned, the reply
 * printed and added. An exit code when the conversation cannot go on, -1
 * when it can (*failed set when this turn failed). */
static int chat_turn(ane_client *cl, run *R, proto_req *q, hist *h, int *failed)
{
    size_t total = 0;
    for (size_t i = 0; i < h->n; i++) total += h->m[i].len;
    if (h->n > PROTO_MAX_MSGS || total > PROTO_MAX_PROMPT) {
        fprintf(stderr, "aneclient: the conversation is over aned's limit (%d messages, %d bytes); "
                "/reset starts over\n", PROTO_MAX_MSGS, PROTO_MAX_PROMPT);
        *failed = 1;
        return -1;
    }
    proto_msg *m = calloc(h->n, sizeof *m);
    if (!m) die_fail("out of memory");
    for (size_t i = 0; i < h->n; i++) {
        m[i] = (proto_msg){ .role = h->m[i].role, .role_len = strlen(h->m[i].role), .content = h->m[i].content, .content_len = h->m[i].len };
        if (h->m[i].reasoning) {
            json_t *x = json_pack("{ss}", "reasoning_content", h->m[i].reasoning);
            char *xs = x ? json_dumps(x, JSON_COMPACT) : NULL;
            json_decref(x);
            if (!xs) die_fail("out of memory");
            m[i].extra = xs;
            m[i].extra_len = strlen(xs);
        }
    }
    q->type = PROTO_T_GENERATE;
    q->msgs = m;
    q->n_msgs = h->n;
    char err[512];
    proto_buf probe = {0};
    int enc = proto_req_encode(&probe, q);
    proto_buf_free(&probe);
    if (enc < 0) {
        msgs_free(m, h->n);
        fprintf(stderr, "aneclient: the conversation does not fit aned's %d-byte message limit; /reset starts over\n",
                PROTO_MAX_FRAME);
        *failed = 1;
        return -1;
    }
    free(R->acc);
    R->acc = NULL;
    R->acc_len = 0;
    R->accf = open_memstream(&R->acc, &R->acc_len);
    free(R->racc);
    R->racc = NULL;
    R->racc_len = 0;
    R->raccf = open_memstream(&R->racc, &R->racc_len);
    if (!R->accf || !R->raccf) die_fail("out of memory");
    R->n_gen = 0;
    R->rc = -1;
    R->cancel_sent = 0;
    R->t0_ns = now_ns();
    uint64_t id = ane_submit(cl, q, err, sizeof err);
    msgs_free(m, h->n);
    q->msgs = NULL;
    q->n_msgs = 0;
    if (!id) { report_error(R, "connect", err, strlen(err)); return EX_CONNECT; }
    R->id = id;
    int st = ane_run(cl, id, on_run_event, R, 100, err, sizeof err);
    fclose(R->accf);
    R->accf = NULL;
    fclose(R->raccf);
    R->raccf = NULL;
    reason_end(R, 0);
    end_line();
    if (!R->tty_out && R->acc_len && R->acc[R->acc_len - 1] != '\n') fputc('\n', stdout);
    fflush(stdout);
    if (st < 0 && !interrupted) { report_error(R, "connection", err, strlen(err)); return EX_CONNECT; }
    if (R->rc == EX_REFUSED || R->rc == EX_CONNECT) return R->rc;
    if (R->rc == EX_OK || R->rc == EX_INTERRUPTED || (R->rc < 0 && interrupted)) {
        /* kept as shown, a reply stopped with Ctrl-C too */
        hist_add(h, "assistant", R->acc ? R->acc : "", R->acc_len);
        if (R->racc_len && !(h->m[h->n - 1].reasoning = strndup(R->racc, R->racc_len))) die_fail("out of memory");
        interrupted = 0;
        return -1;
    }
    interrupted = 0;
    *failed = 1;
    hist_cut(h, h->n - 1);   /* the user's message goes with its failed turn */
    return -1;
}

/* Reads lines and holds the conversation; the exit code. */

/* SIGINT to on_sigint (no SA_RESTART: waits return to check the flag), then
 * the connection to aned into *cl: EX_OK, or the exit status once the
 * reason is reported. */
static int connect_aned(run *R, const char *socket_path, uid_t daemon_uid, ane_client **cl)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    char err[512];
    ane_connect_opts co = { socket_path, "aneclient", 0, daemon_uid };
    proto_err refused = PROTO_OK;
    connecting = 1;
    int rc = ane_connect_with(cl, &co, &refused, err, sizeof err);
    connecting = 0;
    if (rc >= 0) return EX_OK;
    if (interrupted) return EX_INTERRUPTED;
    report_error(R, refused ? proto_err_name(refused) : "connect", err, strlen(err));
    return refused ? EX_REFUSED : EX_CONNECT;
}

static int chat(ane_client *cl, run *R, proto_req *q, hist *h, const char *first, size_t first_len)
{
    int tty = isatty(STDIN_FILENO), failed = 0, rc;
    R->cl = cl;
    R->mode = M_GENERATE;
    R->chat = 1;
    if (h->n && !strcmp(h->m[h->n - 1].role, "user") && (rc = chat_turn(cl, R, q, h, &failed)) >= 0) return rc;
    for (;;) {
        size_t len;
        char *line;
        if (first) {
            line = malloc(first_len + 1);
            if (!line) die_fail("out of memory");
            memcpy(line, first, first_len);
            line[first_len] = 0;
            len = first_len;
            first = NULL;
        } else {
            connecting = 1;   /* nothing to cancel: Ctrl-C leaves */
            line = chat_line(tty, &len);
            connecting = 0;
            if (!line) break;
        }
        const char *text = line;
        if (!proto_utf8_valid(line, len)) {
            fputs("aneclient: the line is not valid UTF-8; not sent\n", stderr);
        } else if (line[0] == '/' && line[1] != '/') {
            char *arg = line + 1;
            size_t cl_len = strcspn(arg, " \t");
            char *rest = arg + cl_len;
            while (*rest == ' ' || *rest == '\t') rest++;
            if ((cl_len == 4 && !strncmp(arg, "quit", 4)) || (cl_len == 4 && !strncmp(arg, "exit", 4))) {
                free(line);
                break;
            } else if (cl_len == 5 && !strncmp(arg, "reset", 5)) {
                hist_cut(h, has_system(h) ? 1 : 0);
                fputs("(conversation cleared)\n", stderr);
            } else if (cl_len == 6 && !strncmp(arg, "system", 6)) {
                if (*rest) { hist_system(h, rest, strlen(rest)); fputs("(system message set)\n", stderr); }
                else { hist_system(h, NULL, 0); fputs("(system message removed)\n", stderr); }
            } else if (cl_len == 4 && !strncmp(arg, "help", 4)) {
                chat_help();
            } else {
                fprintf(stderr, "aneclient: unknown command /%.*s; /help lists them\n", (int)cl_len, arg);
            }
        } else {
            if (line[0] == '/') { text++; len--; }   /* "//text" sends "/text" */
            if (!blank(text, len)) {
                hist_add(h, "user", text, len);
                if ((rc = chat_turn(cl, R, q, h, &failed)) >= 0) { free(line); return rc; }
            }
        }
        free(line);
    }
    if (tty) end_line();
    return failed ? EX_FAIL : EX_OK;
}

/* The arguments joined by spaces, or NULL when there are none. */
static char *join_args(int argc, char **argv, int from, size_t *len)
{
    if (from >= argc) return NULL;
    size_t total = 0, n = 0;
    for (int i = from; i < argc; i++) total += strlen(argv[i]) + 1;
    char *r = malloc(total + 1);
    if (!r) die_fail("out of memory");
    for (int i = from; i < argc; i++) {
        size_t l = strlen(argv[i]);
        if (i > from) r[n++] = ' ';
        memcpy(r + n, argv[i], l);
        n += l;
    }
    r[n] = 0;
    *len = n;
    return r;
}

/* --chat: options checked; the history set up, then the conversation. */
static int chat_main(run *R, proto_req *q, const char *socket_path, uid_t daemon_uid, const char *messages_arg,
                     int argc, char **argv, int from)
{
    hist h = {0};
    json_t *root = NULL;
    if (messages_arg) {
        size_t n = 0;
        proto_msg *m = load_messages(messages_arg, NULL, 0, &root, &n);
        for (size_t i = 0; i < n; i++) {
            char role[16];
            snprintf(role, sizeof role, "%.*s", (int)m[i].role_len, m[i].role);
            hist_add(&h, role, m[i].content, m[i].content_len);
            json_t *rc = json_object_get(json_array_get(root, i), "reasoning_content");
            if (json_is_string(rc) && !(h.m[h.n - 1].reasoning = strdup(json_string_value(rc)))) die_fail("out of memory");
        }
        msgs_free(m, n);
        json_decref(root);
    }
    if (q->system) hist_add(&h, "system", q->system, q->system_len);
    q->system = NULL;
    q->system_len = 0;
    size_t first_len = 0;
    char *first = join_args(argc, argv, from, &first_len);
    if (first && !proto_utf8_valid(first, first_len)) die_usage("the prompt is not valid UTF-8");

    R->tty_out = isatty(STDOUT_FILENO);
    ane_client *cl = NULL;
    int rc = connect_aned(R, socket_path, daemon_uid, &cl);
    if (rc == EX_OK) rc = chat(cl, R, q, &h, first, first_len);
    ane_close(cl);
    hist_cut(&h, 0);
    free(h.m);
    free(first);
    free(R->acc);
    free(R->racc);
    if (fflush(stdout) != 0 && rc == EX_OK) rc = EX_FAIL;
    return rc;
}

int main(int argc, char **argv)
{
    enum { O_SOCKET = 256, O_TOPK, O_TOPP, O_MINP, O_RPEN, O_RLAST, O_SEED, O_STOP, O_GRAMMAR, O_JSCHEMA, O_SYSTEM, O_RAW,
           O_SPECIAL, O_NOBOS, O_TOKENS, O_TOKENIZE, O_DETOKENIZE, O_EVAL, O_EMBED, O_TOP, O_INFO, O_PING, O_JSON, O_DUSER,
           O_NOSTDIN, O_MESSAGES, O_CHAT, O_LOGPROBS, O_REASONING, O_KEEP_REASONING, O_TVARS, O_REGEX, O_CHOICE };
    static const struct option opts[] = {
        { "socket", required_argument, 0, O_SOCKET },
        { "daemon-user", required_argument, 0, O_DUSER },
        { "max-tokens", required_argument, 0, 'n' },
        { "temperature", required_argument, 0, 'T' },
        { "temp", required_argument, 0, 'T' },
        { "top-k", required_argument, 0, O_TOPK },
        { "top-p", required_argument, 0, O_TOPP },
        { "min-p", required_argument, 0, O_MINP },
        { "repeat-penalty", required_argument, 0, O_RPEN },
        { "repeat-last-n", required_argument, 0, O_RLAST },
        { "seed", required_argument, 0, O_SEED },
        { "stop", required_argument, 0, O_STOP },
        { "grammar", required_argument, 0, O_GRAMMAR },
        { "json-schema", required_argument, 0, O_JSCHEMA },
        { "regex", required_argument, 0, O_REGEX },
        { "choice", required_argument, 0, O_CHOICE },
        { "system", required_argument, 0, O_SYSTEM },
        { "raw", no_argument, 0, O_RAW },
        { "reasoning", required_argument, 0, O_REASONING },
        { "keep-reasoning", no_argument, 0, O_KEEP_REASONING },
        { "template-vars", required_argument, 0, O_TVARS },
        { "logprobs", required_argument, 0, O_LOGPROBS },
        { "special", no_argument, 0, O_SPECIAL },
        { "no-bos", no_argument, 0, O_NOBOS },
        { "no-stdin", no_argument, 0, O_NOSTDIN },
        { "tokens", required_argument, 0, O_TOKENS },
        { "messages", required_argument, 0, O_MESSAGES },
        { "chat", no_argument, 0, O_CHAT },
        { "tokenize", no_argument, 0, O_TOKENIZE },
        { "detokenize", no_argument, 0, O_DETOKENIZE },
        { "eval", no_argument, 0, O_EVAL },
        { "embed", no_argument, 0, O_EMBED },
        { "top", required_argument, 0, O_TOP },
        { "info", no_argument, 0, O_INFO },
        { "ping", no_argument, 0, O_PING },
        { "json", no_argument, 0, O_JSON },
        { "verbose", no_argument, 0, 'v' },
        { "help", no_argument, 0, 'h' },
        { "version", no_argument, 0, 'V' },
        { 0, 0, 0, 0 },
    };
    run R;
    memset(&R, 0, sizeof R);
    R.mode = M_GENERATE;
    proto_req q;
    proto_req_init(&q, PROTO_T_GENERATE, 0);
    const char *socket_path = NULL;
    uid_t daemon_uid = 0;
    const char *tokens_arg = NULL, *messages_arg = NULL;
    int modes = 0, have_top = 0, no_stdin = 0, no_bos = 0, chat_mode = 0;

    int c;
    opterr = 0;   /* our own messages, with the usage exit code */
    while ((c = getopt_long(argc, argv, ":n:T:tvhV", opts, NULL)) != -1) {
        switch (c) {
        case O_SOCKET: socket_path = optarg; break;
        case O_DUSER: {
            char e[160];
            if (ane_parse_uid(optarg, &daemon_uid, e, sizeof e) < 0) die_usage("--daemon-user: %s", e);
            break;
        }
        case 'n': q.max_tokens = (int32_t)parse_int("--max-tokens", optarg, 0, PROTO_MAX_GEN); break;
        case 'T': q.temperature = parse_float("--temperature", optarg, 0, PROTO_MAX_TEMPERATURE); break;
        case 't': die_usage("-t is not an option of aneclient: the temperature is -T (--temp, --temperature); "
                            "-t is aned's --threads");
        case O_TOPK: q.top_k = (int32_t)parse_int("--top-k", optarg, 0, INT32_MAX); break;
        case O_TOPP: q.top_p = parse_float("--top-p", optarg, 0, 1); break;
        case O_MINP: q.min_p = parse_float("--min-p", optarg, 0, 1); break;
        case O_RPEN:
            q.repeat_penalty = parse_float("--repeat-penalty", optarg, 0, PROTO_MAX_PENALTY);
            if (q.repeat_penalty <= 0) die_usage("--repeat-penalty must be greater than 0");
            break;
        case O_RLAST: q.repeat_last_n = (int32_t)parse_int("--repeat-last-n", optarg, 0, PROTO_MAX_TOKENS); break;
        case O_SEED: q.seed = parse_u64("--seed", optarg); q.has_seed = 1; break;
        case O_STOP:
            if (q.n_stop == PROTO_MAX_STOP) die_usage("--stop: at most %d stop strings", PROTO_MAX_STOP);
            if (!*optarg || strlen(optarg) > PROTO_MAX_STOP_LEN)
                die_usage("--stop: the string must be 1..%d bytes", PROTO_MAX_STOP_LEN);
            q.stop[q.n_stop] = optarg;
            q.stop_len[q.n_stop++] = strlen(optarg);
            break;
        case O_GRAMMAR:
        case O_JSCHEMA: {
            const char *opt = c == O_GRAMMAR ? "--grammar" : "--json-schema";
            FILE *f = fopen(optarg, "rb");
            if (!f) die_usage("%s: cannot open %s: %s", opt, optarg, strerror(errno));
            char *buf = NULL; size_t len = 0, cap = 0, got;
            do {
                if (len + 65536 > cap) { cap = cap ? cap * 2 : 65536; buf = realloc(buf, cap); if (!buf) die_usage("out of memory"); }
                got = fread(buf + len, 1, cap - len, f);
                len += got;
            } while (got > 0 && len < PROTO_MAX_PROMPT);
            fclose(f);
            if (len >= PROTO_MAX_PROMPT) die_usage("%s: %s is too large", opt, optarg);
            if (c == O_GRAMMAR) { q.grammar = buf; q.grammar_len = len; }
            else { q.json_schema = buf; q.json_schema_len = len; }
            break;
        }
        case O_REGEX: q.regex = optarg; q.regex_len = strlen(optarg); break;
        case O_CHOICE:
            if (q.n_choice == PROTO_MAX_CHOICE) die_usage("--choice: at most %d", PROTO_MAX_CHOICE);
            if (!optarg[0]) die_usage("--choice: an empty text");
            q.choice[q.n_choice] = optarg;
            q.choice_len[q.n_choice++] = strlen(optarg);
            break;
        case O_SYSTEM: q.system = optarg; q.system_len = strlen(optarg); break;
        case O_RAW: q.raw = 1; break;
        case O_REASONING:
            if (!strcmp(optarg, "show")) R.hide_reasoning = 0;
            else if (!strcmp(optarg, "hide")) R.hide_reasoning = 1;
            else if (!strcmp(optarg, "raw")) q.reasoning = PROTO_REASONING_RAW;
            else die_usage("--reasoning must be show, hide or raw, not \"%s\"", optarg);
            break;
        case O_KEEP_REASONING: q.keep_reasoning = 1; break;
        case O_TVARS: {
            json_error_t je;
            json_t *tv = json_loads(optarg, 0, &je);
            int obj = json_is_object(tv);
            json_decref(tv);
            if (!obj) die_usage("--template-vars must be a JSON object, not \"%s\"", optarg);
            q.template_vars = optarg;
            q.template_vars_len = strlen(optarg);
            break;
        }
        case O_LOGPROBS:
            q.top_logprobs = (int32_t)parse_int("--logprobs", optarg, 0, PROTO_MAX_LOGPROBS);
            q.logprobs = R.logprobs = 1;
            break;
        case O_SPECIAL: q.special = 1; break;
        case O_NOBOS: q.add_bos = 0; no_bos = 1; break;
        case O_NOSTDIN: no_stdin = 1; break;
        case O_TOKENS: tokens_arg = optarg; break;
        case O_MESSAGES: messages_arg = optarg; break;
        case O_CHAT: chat_mode = 1; break;
        case O_TOKENIZE: R.mode = M_TOKENIZE; modes++; break;
        case O_DETOKENIZE: R.mode = M_DETOKENIZE; modes++; break;
        case O_EVAL: R.mode = M_EVAL; modes++; break;
        case O_EMBED: R.mode = M_EMBED; modes++; break;
        case O_TOP: q.top = (int32_t)parse_int("--top", optarg, 1, PROTO_MAX_TOP); have_top = 1; break;
        case O_INFO: R.mode = M_INFO; modes++; break;
        case O_PING: R.mode = M_PING; modes++; break;
        case O_JSON: R.json = 1; break;
        case 'v': R.verbose = 1; break;
        case 'h': usage(stdout); return EX_OK;
        case 'V': printf("aneclient %s (protocol %d)\n", ANE_VERSION, PROTO_VERSION); return EX_OK;
        case ':': die_usage("%s needs a value", argv[optind - 1]);
        default:
            if (optopt) die_usage("unknown option -%c", optopt);
            die_usage("unknown option %s", argv[optind - 1]);
        }
    }
    if (modes > 1) die_usage("--eval, --embed, --tokenize, --detokenize, --info and --ping exclude each other");
    if (R.logprobs && (chat_mode || R.mode != M_GENERATE)) die_usage("--logprobs goes with generating text, without --chat");
    if (chat_mode) {
        if (R.mode != M_GENERATE) die_usage("--chat generates text: it does not go with --eval, --tokenize, "
                                            "--detokenize, --info or --ping");
        if (tokens_arg) die_usage("--chat sends messages, not --tokens");
        if (q.raw) die_usage("--chat needs the chat template, which --raw turns off");
        if (q.special) die_usage("--special does not apply to --chat: message text is never parsed for special tokens");
        if (R.json) die_usage("--chat prints text; for JSON, run --messages FILE --json turn by turn");
        if (no_stdin) die_usage("--chat reads its lines from standard input; --no-stdin leaves none");
        if (messages_arg && !strcmp(messages_arg, "-"))
            die_usage("--chat reads its lines from standard input: give --messages a file, not -");
        if (messages_arg && q.system)
            die_usage("--system with --messages: put it in the file as the first message, "
                      "{\"role\": \"system\", \"content\": ...}, or use /system");
        if (q.system && !proto_utf8_valid(q.system, q.system_len)) die_usage("--system is not valid UTF-8");
        for (size_t i = 0; i < q.n_stop; i++)
            if (!proto_utf8_valid(q.stop[i], q.stop_len[i])) die_usage("--stop is not valid UTF-8");
        return chat_main(&R, &q, socket_path, daemon_uid, messages_arg, argc, argv, optind);
    }
    int prompt_mode = R.mode == M_GENERATE || R.mode == M_EVAL;
    if (R.mode == M_EMBED) {
        /* text as is, or token ids: no template, no conversation */
        if (messages_arg) die_usage("--embed takes a text or --tokens, not --messages");
        if (q.system) die_usage("--embed takes a text or --tokens: --system does not apply");
        if (q.raw) die_usage("--raw does not apply to --embed: its text is always used as is");
    }
    if (have_top && R.mode != M_EVAL) die_usage("--top goes with --eval");
    if (tokens_arg && !prompt_mode && R.mode != M_EMBED) die_usage("--tokens goes with generation, --eval or --embed");
    if (messages_arg && !prompt_mode) die_usage("--messages goes with generation or --eval");
    if (tokens_arg && messages_arg) die_usage("give either --tokens or --messages, not both");
    if (no_bos && R.mode != M_TOKENIZE) die_usage("--no-bos goes with --tokenize");
    /* Nothing given is dropped unsaid: --system needs the chat template. */
    if (q.system) {
        if (!prompt_mode) die_usage("--system goes with generation or --eval");
        if (q.raw) die_usage("--system needs the chat template, which --raw turns off; "
                             "put the instructions into the prompt instead");
        if (tokens_arg) die_usage("--system needs the chat template, which --tokens skips; "
                                  "put the instructions into the token ids instead");
        if (messages_arg) die_usage("--system with --messages: put it in the file as the first message, "
                                    "{\"role\": \"system\", \"content\": ...}");
        if (!proto_utf8_valid(q.system, q.system_len)) die_usage("--system is not valid UTF-8");
    }
    if (messages_arg && q.raw) die_usage("--messages needs the chat template, which --raw turns off");
    if (messages_arg && q.special) die_usage("--special does not apply to --messages: message text is never "
                                             "parsed for special tokens");
    for (size_t i = 0; i < q.n_stop; i++)
        if (!proto_utf8_valid(q.stop[i], q.stop_len[i])) die_usage("--stop is not valid UTF-8");

    /* The input: arguments, then standard input after a blank line. */
    char *input = NULL;
    size_t input_len = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    proto_msg *msgs = NULL;
    size_t n_msgs = 0;
    json_t *msgs_root = NULL;
    int text_in = prompt_mode || R.mode == M_TOKENIZE || R.mode == M_DETOKENIZE || R.mode == M_EMBED;
    if (tokens_arg) {
        if (optind < argc) die_usage("give either --tokens or a text prompt, not both");
        ids = parse_ids("--tokens", tokens_arg, &n_ids);
        if (!n_ids) die_usage("--tokens: no token ids");
        text_in = 0;
    }
    if (!text_in && optind < argc && !tokens_arg) die_usage("unexpected argument \"%s\"", argv[optind]);
    if (text_in) {
        size_t args_len = 0, in_len = 0;
        char *args = join_args(argc, argv, optind, &args_len), *in = NULL;
        int stdin_is_file = messages_arg && !strcmp(messages_arg, "-");
        if (!no_stdin && !stdin_is_file && !isatty(STDIN_FILENO)) {
            in = read_stdin(PROTO_MAX_PROMPT, &in_len);
            if (R.mode != M_DETOKENIZE) chomp(in, &in_len);
        }
        if (R.mode == M_DETOKENIZE) {
            if (args && in && !blank(in, in_len))
                die_usage("--detokenize: token ids come from the arguments or from standard input, not both "
                          "(--no-stdin ignores standard input)");
            const char *src = args ? args : in;
            if (!src) die_usage("no token ids: give them as arguments or on standard input");
            ids = parse_ids("--detokenize", src, &n_ids);
            free(args);
            free(in);
        } else {
            if (args && in && in_len) { input = join2(args, args_len, in, in_len, &input_len); free(args); free(in); }
            else if (args) { input = args; input_len = args_len; free(in); }
            else if (in) { input = in; input_len = in_len; }
            else if (!messages_arg) die_usage("no prompt: give it as arguments or on standard input");
            if (input_len > PROTO_MAX_PROMPT) die_usage("the prompt is longer than %d bytes", PROTO_MAX_PROMPT);
            if (input && !proto_utf8_valid(input, input_len)) die_usage("the prompt is not valid UTF-8");
            if (messages_arg) {
                /* the prompt, if any, is the conversation's last user message */
                int add = input && (input_len || optind < argc);
                msgs = load_messages(messages_arg, add ? input : NULL, input_len, &msgs_root, &n_msgs);
            }
        }
    }

    switch (R.mode) {
    case M_GENERATE: q.type = PROTO_T_GENERATE; break;
    case M_EVAL: q.type = PROTO_T_EVAL; break;
    case M_TOKENIZE: q.type = PROTO_T_TOKENIZE; break;
    case M_DETOKENIZE: q.type = PROTO_T_DETOKENIZE; break;
    case M_INFO: q.type = PROTO_T_INFO; break;
    case M_PING: q.type = PROTO_T_PING; break;
    case M_EMBED: q.type = PROTO_T_EMBED; break;
    }
    if (msgs) { q.msgs = msgs; q.n_msgs = n_msgs; }
    else if (ids) { q.tokens = ids; q.n_tokens = n_ids; }
    else { q.text = input ? input : ""; q.text_len = input_len; }
    {   /* what cannot be sent is said before connecting */
        proto_buf probe = {0};
        int enc = proto_req_encode(&probe, &q);
        proto_buf_free(&probe);
        if (enc < 0) die_usage("the request does not fit aned's %d-byte message limit; shorten it", PROTO_MAX_FRAME);
    }

    R.tty_out = isatty(STDOUT_FILENO);
    R.accf = open_memstream(&R.acc, &R.acc_len);
    R.toksf = open_memstream(&R.toks, &R.toks_len);
    R.raccf = open_memstream(&R.racc, &R.racc_len);
    if (!R.accf || !R.toksf || !R.raccf) die_fail("out of memory");

    /* Connect and send. */
    char err[512];
    ane_client *cl = NULL;
    R.t0_ns = now_ns();
    int rc = connect_aned(&R, socket_path, daemon_uid, &cl);
    if (rc != EX_OK) goto out;
    R.t0_ns = now_ns();
    uint64_t id = ane_submit(cl, &q, err, sizeof err);
    if (!id) {
        report_error(&R, "connect", err, strlen(err));
        rc = EX_CONNECT;
        goto out;
    }

    R.cl = cl;
    R.id = id;
    R.rc = -1;
    /* ane_run calls back at least every 100 ms so Ctrl-C is seen promptly. */
    int st = ane_run(cl, id, on_run_event, &R, 100, err, sizeof err);
    if (st < 0) {
        if (interrupted) rc = EX_INTERRUPTED;
        else { report_error(&R, "connection", err, strlen(err)); rc = EX_CONNECT; }
    } else {
        rc = R.rc >= 0 ? R.rc : EX_INTERRUPTED;
    }
out:
    reason_end(&R, 0);
    end_line();
    ane_close(cl);
    if (R.accf) fclose(R.accf);
    if (R.toksf) fclose(R.toksf);
    if (R.raccf) fclose(R.raccf);
    free(R.acc);
    free(R.toks);
    free(R.racc);
    free(input);
    free(ids);
    msgs_free(msgs, n_msgs);
    json_decref(msgs_root);
    if (fflush(stdout) != 0 && rc == EX_OK) rc = EX_FAIL;
    return rc;
}
