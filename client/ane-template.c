/* ane-template — renders a chat template with the given variables, as
 * Hugging Face transformers' apply_chat_template does; the tool to debug a
 * model's template with.
 *
 *   ane-template [--now TIME] FILE.jinja < vars.json
 *
 * vars.json is a JSON object: messages, tools, add_generation_prompt,
 * bos_token, eos_token and any other keys the template reads (empty input:
 * no variables). The rendered text goes to stdout as is. --now fixes what
 * strftime_now() sees: YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (local time) or
 * @SECONDS since the epoch; by default the current time.
 *
 * Exit status: 0 rendered; 3 the template raised (its own message on
 * stderr: raise_exception's text, or the error jinja2 would raise) or does
 * not parse; 1 bad usage, an unreadable file or variables that are not a
 * JSON object. */
#include "engine/text/jinja.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_TEMPLATE (16u << 20)

static int usage(void)
{
    fprintf(stderr, "usage: ane-template [--now YYYY-MM-DD[THH:MM[:SS]] | --now @SECONDS] FILE.jinja < vars.json\n");
    return 1;
}

static int parse_now(const char *s, int64_t *out)
{
    if (s[0] == '@') {
        char *end;
        errno = 0;
        long long v = strtoll(s + 1, &end, 10);
        if (errno || end == s + 1 || *end) return -1;
        *out = v;
        return 0;
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int y, mo, d, h = 0, mi = 0, sec = 0;
    char tail;
    int n = sscanf(s, "%d-%d-%d%c", &y, &mo, &d, &tail);
    if (n == 3) {
    } else if (sscanf(s, "%d-%d-%dT%d:%d:%d%c", &y, &mo, &d, &h, &mi, &sec, &tail) == 6 ||
               sscanf(s, "%d-%d-%dT%d:%d%c", &y, &mo, &d, &h, &mi, &tail) == 5) {
    } else {
        return -1;
    }
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec > 60) return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    tm.tm_isdst = -1;
    time_t t = mktime(&tm);
    if (t == (time_t)-1) return -1;
    *out = (int64_t)t;
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ane-template: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
        if (n == cap) {
            if (cap >= MAX_TEMPLATE) {
                fprintf(stderr, "ane-template: %s: larger than %u bytes\n", path, MAX_TEMPLATE);
                free(buf);
                fclose(f);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "ane-template: %s: %s\n", path, buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    int64_t now = (int64_t)time(NULL);
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--now")) {
            if (++i >= argc || parse_now(argv[i], &now)) {
                fprintf(stderr, "ane-template: --now wants YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] or @SECONDS\n");
                return 1;
            }
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return usage();
        } else if (!path) {
            path = argv[i];
        } else {
            return usage();
        }
    }
    if (!path) return usage();
    size_t len;
    char *src = read_file(path, &len);
    if (!src) return 1;
    char err[4096];
    jinja_tpl *t = jinja_parse(src, len, err, sizeof err);
    free(src);
    if (!t) {
        fprintf(stderr, "ane-template: %s: TemplateSyntaxError: %s\n", path, err);
        return 3;
    }
    /* the variables: a JSON object on stdin (nothing at all: none) */
    json_error_t jerr;
    int c = getc(stdin);
    json_t *vars;
    if (c == EOF) {
        vars = json_object();
    } else {
        ungetc(c, stdin);
        vars = json_loadf(stdin, 0, &jerr);
        if (!vars) {
            fprintf(stderr, "ane-template: variables (stdin): line %d: %s\n", jerr.line, jerr.text);
            jinja_free(t);
            return 1;
        }
    }
    if (!json_is_object(vars)) {
        fprintf(stderr, "ane-template: variables (stdin): expected a JSON object\n");
        json_decref(vars);
        jinja_free(t);
        return 1;
    }
    char *out = NULL;
    size_t out_len = 0;
    int rc = jinja_render(t, vars, now, NULL, &out, &out_len, err, sizeof err);
    json_decref(vars);
    jinja_free(t);
    if (rc != JINJA_OK) {
        if (rc == JINJA_ERAISE) fprintf(stderr, "%s\n", err);
        else fprintf(stderr, "ane-template: %s: %s\n", path, err);
        return rc == JINJA_EINPUT ? 1 : 3;
    }
    int ok = fwrite(out, 1, out_len, stdout) == out_len && fflush(stdout) == 0;
    free(out);
    if (!ok) {
        fprintf(stderr, "ane-template: writing the output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
