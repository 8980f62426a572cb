/* main.c — aned-http's options, listening socket and main loop; the
 * requests themselves are served in aned-http.c. */
#include "client/aneclient.h"
#include "common/sig.h"
#include "http/gw.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

gw_opts G;

void logf_(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* one line per call: control bytes a client sent (in a path) cannot forge lines */
    for (char *p = line; *p; p++) if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    fprintf(stderr, GW_NAME ": %s\n", line);
}

/* ------------------------------------------------------------------ listening */

static char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static int listen_unix(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (!*path || strlen(path) >= sizeof sa.sun_path) { snprintf(err, errlen, "unix socket path too long"); return -1; }
    memcpy(sa.sun_path, path, strlen(path));
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) { snprintf(err, errlen, "%s exists and is not a socket", path); return -1; }
        int t = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = t >= 0 && connect(t, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (t >= 0) close(t);
        if (live) { snprintf(err, errlen, "%s is in use by a running server", path); return -1; }
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { snprintf(err, errlen, "socket: %s", strerror(errno)); return -1; }
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc < 0) { snprintf(err, errlen, "bind %s: %s", path, strerror(errno)); close(fd); return -1; }
    snprintf(unix_path, sizeof unix_path, "%s", path);
    if (chmod(path, G.unix_mode) < 0) { snprintf(err, errlen, "chmod %s: %s", path, strerror(errno)); close(fd); return -1; }
    if (listen(fd, 128) < 0) { snprintf(err, errlen, "listen: %s", strerror(errno)); close(fd); return -1; }
    return fd;
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

/* HOST:PORT or [V6]:PORT; port 0 picks a free one. Prints the bound address. */
static int listen_tcp(const char *spec, char *shown, size_t shownlen, char *err, size_t errlen)
{
    char host[256], port[16];
    const char *colon = strrchr(spec, ':');
    if (!colon || !colon[1]) { snprintf(err, errlen, "--listen %.200s: expected HOST:PORT or unix:PATH", spec); return -1; }
    size_t hl = (size_t)(colon - spec);
    if (hl >= sizeof host || strlen(colon + 1) >= sizeof port) { snprintf(err, errlen, "--listen %.200s: too long", spec); return -1; }
    memcpy(host, spec, hl);
    host[hl] = 0;
    snprintf(port, sizeof port, "%s", colon + 1);
    if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') { memmove(host, host + 1, hl - 2); host[hl - 2] = 0; }
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gr = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (gr) { snprintf(err, errlen, "--listen %.200s: %s", spec, gai_strerror(gr)); return -1; }
    int fd = -1;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            G.check_host = is_loopback(a->ai_addr);
            break;
        }
        snprintf(err, errlen, "bind %.200s: %s", spec, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char h[INET6_ADDRSTRLEN + 2] = "?", p[16] = "?";
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(shown, shownlen, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
    if (!G.check_host && !G.api_key)
        logf_("warning: listening on %s, beyond loopback, without --api-key-file", shown);
    return fd;
}

/* ------------------------------------------------------------------ main */

static int read_key(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) { snprintf(err, errlen, "--api-key-file %s: %s", path, strerror(errno)); return -1; }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        logf_("warning: %s is readable by other users", path);
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) buf[--n] = 0;
    char *k = buf;
    while (*k == ' ' || *k == '\t') k++;
    if (!*k || strchr(k, '\n')) { snprintf(err, errlen, "--api-key-file %s: expected one non-empty line", path); return -1; }
    G.api_key = strdup(k);
    G.api_key_len = strlen(k);
    return G.api_key ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: aned-http [options]\n"
        "An OpenAI-compatible HTTP gateway to aned.\n"
        "  --socket PATH          aned's socket (default: the usual rule, $ANE_SOCKET first)\n"
        "  --daemon-user USER     also trust an aned run by USER (name or uid); by default\n"
        "                         only one run by root or by aned-http's own user is used\n"
        "  --listen HOST:PORT     where to listen (default 127.0.0.1:8080; port 0 = any free one);\n"
        "                         TCP needs --api-key-file (or --insecure-no-key)\n"
        "  --listen unix:PATH     or on a Unix socket (mode 0600 unless --unix-mode)\n"
        "  --unix-mode OCTAL      file mode of the Unix socket\n"
        "  --api-key-file FILE    require \"Authorization: Bearer KEY\" with the key in FILE\n"
        "  --insecure-no-key      serve TCP without a key: every local user gets the daemon\n"
        "                         as aned-http's user, bypassing aned's allow-list\n"
        "  --allow-origin ORIGIN  let web pages at ORIGIN call the API (CORS; repeatable; no wildcard)\n"
        "  --allow-host NAME      accept Host: NAME besides loopback names (repeatable)\n"
        "  --max-body BYTES       request body limit (default %u)\n"
        "  --max-header BYTES     request header limit (default %u)\n"
        "  --max-connections N    open HTTP connections (default %d)\n"
        "  --idle-timeout S       close idle keep-alive connections after S seconds (default %d)\n"
        "  -v, --verbose          log every request: method, path, status, time, tokens\n"
        "  -h, --help             this text\n"
        "  -V, --version          print the version\n"
        "Exit status: 0 stopped by a signal, 1 cannot start (listening, key file),\n"
        "2 usage error.\n",
        GW_DEF_MAX_BODY, GW_DEF_MAX_HEADER, GW_DEF_MAX_CONNS, GW_DEF_IDLE_S);
}

static int parse_size(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || v < lo || v > hi || s[0] == '-') return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    snprintf(G.listen, sizeof G.listen, "127.0.0.1:8080");
    G.max_body = GW_DEF_MAX_BODY;
    G.max_header = GW_DEF_MAX_HEADER;
    G.max_conns = GW_DEF_MAX_CONNS;
    G.idle_s = GW_DEF_IDLE_S;
    G.unix_mode = 0600;
    int no_key = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long x;
#define NEEDV() do { if (!v) { fprintf(stderr, GW_NAME ": %s needs a value\n", a); return 2; } i++; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-V") || !strcmp(a, "--version")) { printf(GW_NAME " %s (protocol %d)\n", ANE_VERSION, PROTO_VERSION); return 0; }
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) G.verbose = 1;
        else if (!strcmp(a, "--socket")) { NEEDV(); G.socket_path = v; }
        else if (!strcmp(a, "--daemon-user")) {
            NEEDV();
            char e[160];
            if (ane_parse_uid(v, &G.daemon_uid, e, sizeof e) < 0) { fprintf(stderr, GW_NAME ": --daemon-user: %s\n", e); return 2; }
        }
        else if (!strcmp(a, "--insecure-no-key")) no_key = 1;
        else if (!strcmp(a, "--listen")) {
            NEEDV();
            if (strlen(v) >= sizeof G.listen) { fprintf(stderr, GW_NAME ": --listen too long\n"); return 2; }
            snprintf(G.listen, sizeof G.listen, "%s", v);
        }
        else if (!strcmp(a, "--api-key-file")) { NEEDV(); G.api_key_file = v; }
        else if (!strcmp(a, "--allow-origin")) {
            NEEDV();
            if (!strcmp(v, "*") || !strcmp(v, "null")) { fprintf(stderr, GW_NAME ": --allow-origin takes one origin, not \"%s\"\n", v); return 2; }
            if (G.n_origins == GW_MAX_ORIGINS) { fprintf(stderr, GW_NAME ": too many --allow-origin\n"); return 2; }
            G.origins[G.n_origins++] = v;
        }
        else if (!strcmp(a, "--allow-host")) {
            NEEDV();
            if (G.n_hosts == GW_MAX_HOSTS) { fprintf(stderr, GW_NAME ": too many --allow-host\n"); return 2; }
            G.hosts[G.n_hosts++] = v;
        }
        else if (!strcmp(a, "--unix-mode")) {
            NEEDV();
            char *end;
            long m = strtol(v, &end, 8);
            if (*end || m < 0 || m > 0777) { fprintf(stderr, GW_NAME ": bad --unix-mode %s\n", v); return 2; }
            G.unix_mode = (mode_t)m;
        }
        else if (!strcmp(a, "--max-body")) {
            NEEDV();
            if (parse_size(v, 1024, 1ull << 30, &x) < 0) { fprintf(stderr, GW_NAME ": bad --max-body %s\n", v); return 2; }
            G.max_body = (size_t)x;
        }
        else if (!strcmp(a, "--max-header")) {
            NEEDV();
            if (parse_size(v, 4096, 1u << 24, &x) < 0) { fprintf(stderr, GW_NAME ": bad --max-header %s\n", v); return 2; }
            G.max_header = (size_t)x;
        }
        else if (!strcmp(a, "--max-connections")) {
            NEEDV();
            if (parse_size(v, 1, 4096, &x) < 0) { fprintf(stderr, GW_NAME ": bad --max-connections %s\n", v); return 2; }
            G.max_conns = (unsigned)x;
        }
        else if (!strcmp(a, "--idle-timeout")) {
            NEEDV();
            if (parse_size(v, 0, 86400, &x) < 0) { fprintf(stderr, GW_NAME ": bad --idle-timeout %s\n", v); return 2; }
            G.idle_s = (unsigned)x;
        }
        else { fprintf(stderr, GW_NAME ": unknown option %s\n", a); usage(stderr); return 2; }
#undef NEEDV
    }

    int tcp = strncmp(G.listen, "unix:", 5) != 0;
    if (tcp && !G.api_key_file && !no_key) {
        /* A TCP port is open to every local user, and aned sees them all as
         * aned-http's user: its per-user rules would not apply. */
        fprintf(stderr, GW_NAME ": refusing to listen on TCP %s without --api-key-file: every local user "
                "could reach it and use aned as this gateway's user, past aned's allow-list. Give "
                "--api-key-file FILE, listen on a Unix socket (--listen unix:PATH), or pass "
                "--insecure-no-key to serve without a key anyway\n", G.listen);
        return 2;
    }
    if (!tcp && no_key) { fprintf(stderr, GW_NAME ": --insecure-no-key is for TCP; a Unix socket is guarded by its mode\n"); return 2; }
    if (G.api_key_file && no_key) { fprintf(stderr, GW_NAME ": --insecure-no-key and --api-key-file exclude each other\n"); return 2; }

    char err[512];
    if (G.api_key_file && read_key(G.api_key_file, err, sizeof err) < 0) { logf_("%s", err); return 1; }

    /* Signals are taken synchronously by main; every thread inherits the mask. */
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    stop_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    char shown[600];
    int fd;
    if (!strncmp(G.listen, "unix:", 5)) {
        fd = listen_unix(G.listen + 5, err, sizeof err);
        snprintf(shown, sizeof shown, "%s", G.listen);
    } else {
        fd = listen_tcp(G.listen, shown, sizeof shown, err, sizeof err);
    }
    if (fd < 0) { logf_("%s", err); return 1; }

    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG,
        0, NULL, NULL, gw_on_request, NULL,
        /* first, or libmicrohttpd warns through its own logger that it is not */
        MHD_OPTION_EXTERNAL_LOGGER, gw_mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, G.max_conns + GW_OVER_CONNS,
        MHD_OPTION_CONNECTION_TIMEOUT, G.idle_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, G.max_header,
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
        MHD_OPTION_NOTIFY_COMPLETED, gw_on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, gw_on_connection, NULL,
        MHD_OPTION_END);
    if (!d) {
        logf_("cannot start the HTTP server on %s", shown);
        close(fd);
        if (unix_path[0]) unlink(unix_path);
        return 1;
    }
    char sockbuf[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    const char *sp = G.socket_path ? G.socket_path : ane_default_socket(sockbuf, sizeof sockbuf);
    printf("aned-http listening on %s (aned at %s)\n", shown, sp);
    fflush(stdout);

    int sig = 0;
    sigwait(&set, &sig);
    if (G.verbose) logf_("signal %d: stopping", sig);
    MHD_stop_daemon(d);
    close(fd);
    if (unix_path[0]) unlink(unix_path);
    free(G.api_key);
    return 0;
}
