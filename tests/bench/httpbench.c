/* httpbench — what aned-http adds on top of talking to aned directly.
 *
 *   httpbench [--model FILE] [--requests N] [--tokens M] [--repeat R]
 *
 * Starts bin/aned on a private socket and bin/aned-http on a free loopback
 * port, then measures the same work both ways: through libaneclient (one
 * kept connection) and through HTTP/1.1 (one kept-alive connection, a
 * minimal client written here so the figure is the gateway's, not a client
 * library's):
 *   - per request: N tokenize round trips ("Hello world"), and N one-token
 *     greedy generations (the engine's time is in both);
 *   - per streamed token: M greedy tokens streamed (SSE over chunked HTTP vs
 *     protocol events), time from the first token to the end over the tokens
 *     after the first, median of R runs; and the time to the first token.
 * Each "added" figure is HTTP minus direct. Both processes are killed at exit. */
#include "client/aneclient.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static pid_t aned_pid = -1, gw_pid = -1;
static char sock_path[128];

static void cleanup(void)
{
    if (gw_pid > 0) { kill(gw_pid, SIGTERM); waitpid(gw_pid, NULL, 0); gw_pid = -1; }
    if (aned_pid > 0) { kill(aned_pid, SIGTERM); waitpid(aned_pid, NULL, 0); aned_pid = -1; }
    if (sock_path[0]) unlink(sock_path);
}

static void die(const char *msg)
{
    fprintf(stderr, "httpbench: %s\n", msg);
    cleanup();
    exit(1);
}

/* CPU time aned-http has used (all its threads), from the scheduler, in us:
 * unlike latency on a loaded machine, this does not depend on the others. */
static double gw_cpu_us(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)gw_pid);
    DIR *d = opendir(path);
    if (!d) return 0;
    double sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char f[128];
        snprintf(f, sizeof f, "%s/%.32s/schedstat", path, e->d_name);
        FILE *fp = fopen(f, "r");
        if (!fp) continue;
        unsigned long long ns = 0;
        if (fscanf(fp, "%llu", &ns) == 1) sum += ns / 1e3;
        fclose(fp);
    }
    closedir(d);
    return sum;
}

/* ------------------------------------------------------------------ a minimal HTTP/1.1 client */

typedef struct hc {
    int fd;
    char buf[1 << 16];
    size_t start, end;
} hc;

static int hc_fill(hc *h)
{
    if (h->start == h->end) h->start = h->end = 0;
    if (h->end == sizeof h->buf) {
        memmove(h->buf, h->buf + h->start, h->end - h->start);
        h->end -= h->start;
        h->start = 0;
    }
    ssize_t n = recv(h->fd, h->buf + h->end, sizeof h->buf - h->end, 0);
    if (n <= 0) return -1;
    h->end += (size_t)n;
    return 0;
}

/* A line ending in \r\n, copied into out (without it). */
static int hc_line(hc *h, char *out, size_t cap)
{
    for (;;) {
        char *p = memchr(h->buf + h->start, '\n', h->end - h->start);
        if (p) {
            size_t n = (size_t)(p - (h->buf + h->start));
            size_t k = n && h->buf[h->start + n - 1] == '\r' ? n - 1 : n;
            if (k >= cap) k = cap - 1;
            memcpy(out, h->buf + h->start, k);
            out[k] = 0;
            h->start += n + 1;
            return 0;
        }
        if (hc_fill(h) < 0) return -1;
    }
}

static int hc_send(hc *h, const char *path, const char *body)
{
    char req[4096];
    int n = snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s", path, strlen(body), body);
    return send(h->fd, req, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

/* Reads the status and headers; *chunked / *len describe the body. */
static int hc_head(hc *h, int *status, int *chunked, long *len)
{
    char line[1024];
    if (hc_line(h, line, sizeof line) < 0 || sscanf(line, "HTTP/1.1 %d", status) != 1) return -1;
    *chunked = 0;
    *len = -1;
    for (;;) {
        if (hc_line(h, line, sizeof line) < 0) return -1;
        if (!line[0]) return 0;
        if (!strncasecmp(line, "Content-Length:", 15)) *len = atol(line + 15);
        if (!strncasecmp(line, "Transfer-Encoding:", 18) && strstr(line, "chunked")) *chunked = 1;
    }
}

/* Consumes n body bytes, calling fn on each piece as it arrives. */
typedef void (*piece_fn)(const char *p, size_t n, void *arg);
static int hc_take(hc *h, size_t n, piece_fn fn, void *arg)
{
    while (n) {
        if (h->start == h->end && hc_fill(h) < 0) return -1;
        size_t k = h->end - h->start < n ? h->end - h->start : n;
        if (fn) fn(h->buf + h->start, k, arg);
        h->start += k;
        n -= k;
    }
    return 0;
}

static int hc_body(hc *h, int chunked, long len, piece_fn fn, void *arg)
{
    if (!chunked) return len < 0 ? -1 : hc_take(h, (size_t)len, fn, arg);
    char line[64];
    for (;;) {
        if (hc_line(h, line, sizeof line) < 0) return -1;
        size_t n = strtoul(line, NULL, 16);
        if (n == 0) return hc_line(h, line, sizeof line);   /* the empty trailer line */
        if (hc_take(h, n, fn, arg) < 0 || hc_line(h, line, sizeof line) < 0) return -1;
    }
}

static int hc_post(hc *h, const char *path, const char *body, piece_fn fn, void *arg)
{
    int status, chunked;
    long len;
    if (hc_send(h, path, body) < 0 || hc_head(h, &status, &chunked, &len) < 0) return -1;
    if (hc_body(h, chunked, len, fn, arg) < 0) return -1;
    return status;
}

/* SSE events as they arrive: the time of the first and of the last event
 * that carries text. */
typedef struct sse { int events; double first, last; char tail[8]; size_t tl; } sse;

static void sse_piece(const char *p, size_t n, void *arg)
{
    sse *s = arg;
    double t = now_us();
    for (size_t i = 0; i < n; i++) {
        /* count "\n\n" event ends (across pieces) */
        s->tail[0] = s->tail[1];
        s->tail[1] = p[i];
        if (s->tail[0] == '\n' && s->tail[1] == '\n') {
            s->events++;
            if (s->events == 1) s->first = t;
            s->last = t;
        }
    }
}

/* ------------------------------------------------------------------ start-up */

static int start_all(const char *model, int *port)
{
    snprintf(sock_path, sizeof sock_path, "/tmp/httpbench-%d.sock", (int)getpid());
    aned_pid = fork();
    if (aned_pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) { dup2(dn, 1); dup2(dn, 2); }
        execl("bin/aned", "aned", "--model", model, "--socket", sock_path, (char *)NULL);
        _exit(127);
    }
    char err[256];
    ane_client *c = NULL;
    for (int i = 0; i < 600 && !c; i++) {
        if (ane_connect(&c, sock_path, err, sizeof err) < 0) { c = NULL; usleep(50000); }
    }
    if (!c) die("aned did not start (run from the repository root after make)");
    ane_close(c);
    int pfd[2];
    if (pipe(pfd) < 0) die("pipe");
    gw_pid = fork();
    if (gw_pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        execl("bin/aned-http", "aned-http", "--socket", sock_path, "--listen", "127.0.0.1:0", "--insecure-no-key", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[512];
    size_t n = 0;
    while (n + 1 < sizeof line) {
        ssize_t k = read(pfd[0], line + n, 1);
        if (k <= 0 || line[n] == '\n') break;
        n++;
    }
    line[n] = 0;
    close(pfd[0]);
    char *colon = strstr(line, "127.0.0.1:");
    if (!colon) die("aned-http did not start");
    *port = atoi(colon + 10);
    return 0;
}

static void hc_open(hc *h, int port)
{
    memset(h, 0, sizeof *h);
    h->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(h->fd, (struct sockaddr *)&sa, sizeof sa) < 0) die("connect to aned-http");
    int one = 1;
    setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ------------------------------------------------------------------ direct */

static int direct_wait(ane_client *c, uint64_t id, int *tokens, double *first, double *last)
{
    char err[256];
    proto_ev ev;
    for (;;) {
        if (ane_next_event(c, &ev, -1, err, sizeof err) != 1) die(err);
        if (ev.type == PROTO_T_TOKEN && tokens) {
            double t = now_us();
            if ((*tokens)++ == 0) *first = t;
            *last = t;
        }
        if (ev.id == id && ane_event_terminal(&ev)) return ev.type == PROTO_T_ERROR ? -1 : 0;
    }
}

static uint64_t direct_gen(ane_client *c, int max_tokens)
{
    proto_req q;
    char err[256];
    proto_req_init(&q, PROTO_T_GENERATE, 0);
    static const int32_t bos[1] = { 1 };
    q.tokens = bos;
    q.n_tokens = 1;
    q.raw = 1;
    q.temperature = 0;
    q.max_tokens = max_tokens;
    uint64_t id = ane_submit(c, &q, err, sizeof err);
    if (!id) die(err);
    return id;
}

int main(int argc, char **argv)
{
    const char *model = "tests/fixtures/models/stories260K.gguf";
    int nreq = 500, ntok = 200, rep = 15;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) nreq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) ntok = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) rep = atoi(argv[++i]);
        else { fprintf(stderr, "usage: httpbench [--model FILE] [--requests N] [--tokens M] [--repeat R]\n"); return 2; }
    }
    if (nreq < 10) nreq = 10;
    if (ntok < 8) ntok = 8;
    if (rep < 1) rep = 1;
    signal(SIGPIPE, SIG_IGN);
    int port;
    start_all(model, &port);
    atexit(cleanup);

    char err[256];
    ane_client *c;
    if (ane_connect(&c, sock_path, err, sizeof err) < 0) die(err);
    hc h;
    hc_open(&h, port);
    double *d = malloc(sizeof *d * (size_t)(nreq > rep ? nreq : rep));
    double *x = malloc(sizeof *x * (size_t)(nreq > rep ? nreq : rep));
    if (!d || !x) die("out of memory");
    printf("httpbench: %s; %d requests, %d streamed tokens x %d\n", model, nreq, ntok, rep);
    printf("%-34s %10s %10s %10s %12s\n", "", "direct", "http", "added", "gateway cpu");

    /* tokenize round trips */
    double cpu_tok = 0, cpu_gen = 0, cpu_stream = 0, c1;
    for (int i = 0; i < nreq; i++) {
        double t = now_us();
        uint64_t id = ane_submit_tokenize(c, "Hello world", 11, 1, 0, err, sizeof err);
        if (!id || direct_wait(c, id, NULL, NULL, NULL) < 0) die("tokenize");
        d[i] = now_us() - t;
        c1 = gw_cpu_us();
        t = now_us();
        if (hc_post(&h, "/tokenize", "{\"content\":\"Hello world\"}", NULL, NULL) != 200) die("http tokenize");
        x[i] = now_us() - t;
        cpu_tok += gw_cpu_us() - c1;
    }
    double d50 = pct(d, nreq, 0.5), x50 = pct(x, nreq, 0.5), d99 = pct(d, nreq, 0.99), x99 = pct(x, nreq, 0.99);
    printf("%-34s %8.1fus %8.1fus %8.1fus %10.1fus\n", "tokenize p50", d50, x50, x50 - d50, cpu_tok / nreq);
    printf("%-34s %8.1fus %8.1fus %8.1fus\n", "tokenize p99", d99, x99, x99 - d99);

    /* one-token generations */
    const char *body1 = "{\"prompt\":[1],\"max_tokens\":1,\"temperature\":0}";
    for (int i = 0; i < nreq; i++) {
        double t = now_us();
        uint64_t id = direct_gen(c, 1);
        if (direct_wait(c, id, NULL, NULL, NULL) < 0) die("generate");
        d[i] = now_us() - t;
        c1 = gw_cpu_us();
        t = now_us();
        if (hc_post(&h, "/v1/completions", body1, NULL, NULL) != 200) die("http completions");
        x[i] = now_us() - t;
        cpu_gen += gw_cpu_us() - c1;
    }
    d50 = pct(d, nreq, 0.5); x50 = pct(x, nreq, 0.5);
    printf("%-34s %8.1fus %8.1fus %8.1fus %10.1fus\n", "1-token completion p50", d50, x50, x50 - d50, cpu_gen / nreq);

    /* streamed tokens */
    double *df = malloc(sizeof *df * (size_t)rep), *xf = malloc(sizeof *xf * (size_t)rep);
    if (!df || !xf) die("out of memory");
    char bodyn[256];
    snprintf(bodyn, sizeof bodyn, "{\"prompt\":[1],\"max_tokens\":%d,\"temperature\":0,\"stream\":true}", ntok);
    int dtoks = 0, xevents = 0;
    for (int r = 0; r < rep; r++) {
        int tokens = 0;
        double first = 0, last = 0, t = now_us();
        uint64_t id = direct_gen(c, ntok);
        if (direct_wait(c, id, &tokens, &first, &last) < 0) die("generate");
        d[r] = tokens > 1 ? (last - first) / (tokens - 1) : 0;
        df[r] = first - t;
        dtoks = tokens;
        sse s = { 0, 0, 0, {0}, 0 };
        c1 = gw_cpu_us();
        t = now_us();
        if (hc_post(&h, "/v1/completions", bodyn, sse_piece, &s) != 200) die("http stream");
        cpu_stream += (gw_cpu_us() - c1) / (tokens > 0 ? tokens : 1);
        /* events: one per token with text, the finish chunk and [DONE] */
        /* the same greedy tokens: the span over the same count of steps */
        int text_events = s.events - 2;
        x[r] = tokens > 1 ? (s.last - s.first) / (tokens - 1) : 0;
        xf[r] = s.first - t;
        xevents = text_events;
    }
    d50 = pct(d, rep, 0.5); x50 = pct(x, rep, 0.5);
    printf("%-34s %8.2fus %8.2fus %8.2fus %10.2fus\n", "per streamed token (median)", d50, x50, x50 - d50,
           cpu_stream / rep);
    d50 = pct(df, rep, 0.5); x50 = pct(xf, rep, 0.5);
    printf("%-34s %8.1fus %8.1fus %8.1fus\n", "time to first token (median)", d50, x50, x50 - d50);
    printf("(%d tokens direct, %d SSE text events per stream; gateway cpu: aned-http's own CPU time per\n"
           " request or per streamed token, which a loaded machine does not inflate as it does latency)\n",
           dtoks, xevents);
    free(d); free(x); free(df); free(xf);
    close(h.fd);
    ane_close(c);
    cleanup();
    return 0;
}
