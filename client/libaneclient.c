/* libaneclient.c — one connection to aned: handshake, requests, events.
 * See aneclient.h. */
#include "common/err.h"
#include "client/aneclient.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct ane_client {
    int fd;
    int dead;                 /* sending failed or the daemon closed: no more requests */
    int eof;                  /* nothing more to read; events already buffered still come */
    uint64_t next_id;
    proto_reader *rd;
    proto_buf out;
    uint64_t *flight;         /* ids sent whose terminal event has not come */
    size_t n_flight, cap_flight;
    uint32_t version;
    char server[128];
    char model[256];
};

const char *ane_default_socket(char *buf, size_t n)
{
    if (!buf || !n) return "";
    const char *env = getenv("ANE_SOCKET");
    int k;
    struct stat st;
    if (env && *env) k = snprintf(buf, n, "%s", env);
    else if (geteuid() == 0 || (stat(ANE_SYSTEM_SOCKET, &st) == 0 && S_ISSOCK(st.st_mode)))
        k = snprintf(buf, n, "%s", ANE_SYSTEM_SOCKET);
    else if ((env = getenv("XDG_RUNTIME_DIR")) && env[0] == '/')
        k = snprintf(buf, n, "%s/aned.sock", env);
    else
        k = snprintf(buf, n, "/tmp/aned-%u.sock", (unsigned)getuid());
    if (k < 0 || (size_t)k >= n) buf[0] = 0;
    return buf;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Remaining wait from a deadline (-1 = none). */
static int left_ms(long long deadline)
{
    if (deadline < 0) return -1;
    long long d = deadline - now_ms();
    return d < 0 ? 0 : d > 1000000000 ? 1000000000 : (int)d;
}

static void fail_conn(ane_client *c)
{
    c->dead = 1;
    c->n_flight = 0;
}

/* Reads what is there into the reader. 1 bytes came, 0 nothing (EAGAIN), -1 EOF/error. */
static int read_some(ane_client *c, char *err, size_t errlen)
{
    size_t avail;
    char *p = proto_reader_space(c->rd, &avail);
    if (!p || !avail) return 0;   /* a whole message waits to be taken */
    for (;;) {
        ssize_t n = recv(c->fd, p, avail, 0);
        if (n > 0) { proto_reader_commit(c->rd, (size_t)n); return 1; }
        if (n == 0) {
            err_set(err, errlen, "aned closed the connection");
            c->eof = 1;
            fail_conn(c);
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        err_set(err, errlen, "read from aned: %s", strerror(errno));
        c->eof = 1;
        fail_conn(c);
        return -1;
    }
}

/* Sends the output buffer completely. Waits for the socket as needed, and
 * reads incoming events meanwhile so a daemon that pauses reading until we
 * drain cannot deadlock us. */
static int flush_out(ane_client *c, long long deadline, char *err, size_t errlen)
{
    size_t off = 0;
    while (off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + off, c->out.len - off, MSG_NOSIGNAL);
        if (n > 0) { off += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* Read meanwhile only while there is room: with a whole frame of
             * events not yet taken, wait for the socket alone (no spinning). */
            size_t room;
            proto_reader_space(c->rd, &room);
            struct pollfd pf = { c->fd, (short)(POLLOUT | (room && !c->eof ? POLLIN : 0)), 0 };
            int t = left_ms(deadline);
            int pr = poll(&pf, 1, t);
            if (pr < 0 && errno == EINTR) continue;
            if (pr < 0) { err_set(err, errlen, "poll: %s", strerror(errno)); goto fail; }
            if (pr == 0) { err_set(err, errlen, "timed out sending to aned"); goto fail; }
            if (pf.revents & POLLOUT) continue;
            if (pf.revents & POLLIN) {
                if (read_some(c, err, errlen) < 0) goto fail;
            } else if (pf.revents & (POLLERR | POLLHUP)) {
                err_set(err, errlen, "aned closed the connection");
                goto fail;
            }
            continue;
        }
        err_set(err, errlen, "write to aned: %s", n < 0 ? strerror(errno) : "no progress");
        goto fail;
    }
    c->out.len = 0;
    return 0;
fail:
    c->out.len = 0;
    fail_conn(c);
    return -1;
}

static int flight_add(ane_client *c, uint64_t id)
{
    if (c->n_flight == c->cap_flight) {
        size_t cap = c->cap_flight ? c->cap_flight * 2 : 16;
        uint64_t *p = realloc(c->flight, cap * sizeof *p);
        if (!p) return -1;
        c->flight = p;
        c->cap_flight = cap;
    }
    c->flight[c->n_flight++] = id;
    return 0;
}

static int flight_del(ane_client *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_flight; i++)
        if (c->flight[i] == id) { c->flight[i] = c->flight[--c->n_flight]; return 1; }
    return 0;
}

int ane_event_terminal(const proto_ev *ev)
{
    switch (ev->type) {
    case PROTO_T_DONE: case PROTO_T_ERROR: case PROTO_T_TOKENS: case PROTO_T_TEXT:
    case PROTO_T_INFO_OK: case PROTO_T_PONG: case PROTO_T_HELLO_OK:
        return 1;
    default:
        return 0;
    }
}

/* Next event with a deadline (-1 none). Same returns as ane_next_event. */
static int next_event(ane_client *c, proto_ev *ev, long long deadline, char *err, size_t errlen)
{
    for (;;) {
        proto_err code;
        char perr[200];
        int rc = proto_reader_next_ev(c->rd, ev, &code, perr, sizeof perr);
        if (rc == 1 && code == PROTO_E_UNKNOWN_TYPE) continue;   /* newer daemon: skip */
        if (rc == 1 && code != PROTO_OK) {
            err_set(err, errlen, "aned sent an invalid event (%s): %s", proto_err_name(code), perr);
            c->eof = 1;
            fail_conn(c);
            return -1;
        }
        if (rc == 1) {
            if (ane_event_terminal(ev)) flight_del(c, ev->id);
            if (ev->type == PROTO_T_ERROR && ev->id == 0) fail_conn(c);   /* the daemon closes */
            return 1;
        }
        if (rc < 0) {
            err_set(err, errlen, "aned sent a broken stream: %s", perr);
            c->eof = 1;
            fail_conn(c);
            return -1;
        }
        if (c->eof) { err_set(err, errlen, "the connection to aned is closed"); return -1; }
        int got = read_some(c, err, errlen);
        if (got < 0) return -1;
        if (got > 0) continue;
        int t = left_ms(deadline);
        if (t == 0) return 0;
        struct pollfd pf = { c->fd, POLLIN, 0 };
        int pr = poll(&pf, 1, t);
        if (pr < 0 && errno == EINTR) return 0;
        if (pr < 0) { err_set(err, errlen, "poll: %s", strerror(errno)); c->eof = 1; fail_conn(c); return -1; }
        if (pr == 0) return 0;
        if (read_some(c, err, errlen) < 0) return -1;
    }
}

int ane_next_event(ane_client *c, proto_ev *ev, int timeout_ms, char *err, size_t errlen)
{
    if (!c) { err_set(err, errlen, "no connection"); return -1; }
    long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    return next_event(c, ev, deadline, err, errlen);
}

void ane_close(ane_client *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    proto_reader_free(c->rd);
    proto_buf_free(&c->out);
    free(c->flight);
    free(c);
}

int ane_connect(ane_client **out, const char *socket_path, char *err, size_t errlen)
{
    ane_connect_opts o = { socket_path, NULL, 0, 0 };
    return ane_connect_with(out, &o, NULL, err, errlen);
}

static void copy_str(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap) n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = 0;
}

static void user_name(uid_t uid, char *buf, size_t n)
{
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res) snprintf(buf, n, " (%s)", res->pw_name);
    else buf[0] = 0;
}

/* The daemon must be root, the caller or the named uid: see aneclient.h. */
static int check_peer(int fd, const char *path, uid_t extra, char *err, size_t errlen)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || len != sizeof cr) {
        err_set(err, errlen, "cannot check who serves %s (SO_PEERCRED): %s", path, strerror(errno));
        return -1;
    }
    if (cr.uid == 0 || cr.uid == getuid() || cr.uid == geteuid() || (extra && cr.uid == extra)) return 0;
    char who[300], me[300];
    user_name(cr.uid, who, sizeof who);
    user_name(geteuid(), me, sizeof me);
    err_set(err, errlen, "refusing %s: it is served by uid %u%s, which is neither root nor you (uid %u%s); "
           "nothing was sent. To trust a daemon run by that user, name it (--daemon-user)",
           path, (unsigned)cr.uid, who, (unsigned)geteuid(), me);
    return -1;
}

int ane_parse_uid(const char *name, uid_t *out, char *err, size_t errlen)
{
    if (!name || !*name) { err_set(err, errlen, "no user named"); return -1; }
    struct passwd pw, *res = NULL;
    char tmp[4096];
    if (getpwnam_r(name, &pw, tmp, sizeof tmp, &res) == 0 && res) { *out = res->pw_uid; return 0; }
    char *end;
    errno = 0;
    unsigned long v = strtoul(name, &end, 10);
    if (!errno && *end == 0 && name[0] >= '0' && name[0] <= '9' && v < (unsigned long)(uid_t)-1) {
        *out = (uid_t)v;
        return 0;
    }
    err_set(err, errlen, "no user \"%.100s\" (expected a user name or a uid)", name);
    return -1;
}

int ane_connect_with(ane_client **out, const ane_connect_opts *o, proto_err *refused,
                     char *err, size_t errlen)
{
    char pathbuf[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    ane_client *c = NULL;
    *out = NULL;
    if (refused) *refused = PROTO_OK;
    const char *path = o && o->socket_path ? o->socket_path : ane_default_socket(pathbuf, sizeof pathbuf);
    int timeout = o && o->timeout_ms ? o->timeout_ms : 10000;
    long long deadline = timeout < 0 ? -1 : now_ms() + timeout;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (!*path || strlen(path) >= sizeof sa.sun_path) {
        err_set(err, errlen, "socket path \"%s\" is empty or too long", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path));

    c = calloc(1, sizeof *c);
    if (!c) { err_set(err, errlen, "out of memory"); return -1; }
    c->fd = -1;
    c->next_id = 1;
    c->rd = proto_reader_new(0);
    if (!c->rd) { err_set(err, errlen, "out of memory"); goto fail; }
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) { err_set(err, errlen, "socket: %s", strerror(errno)); goto fail; }
    while (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        if (errno == EINTR) continue;
        if (errno == ENOENT || errno == ECONNREFUSED)
            err_set(err, errlen, "cannot connect to aned at %s: %s (is aned running?)", path, strerror(errno));
        else
            err_set(err, errlen, "cannot connect to aned at %s: %s", path, strerror(errno));
        goto fail;
    }
    if (check_peer(c->fd, path, o ? o->daemon_uid : 0, err, errlen) < 0) goto fail;
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        err_set(err, errlen, "fcntl: %s", strerror(errno));
        goto fail;
    }

    proto_req q;
    proto_req_init(&q, PROTO_T_HELLO, 0);
    const char *name = o && o->client_name ? o->client_name : program_invocation_short_name;
    if (!name) name = "libaneclient";
    q.client = name;
    q.client_len = strlen(name) > PROTO_MAX_NAME ? PROTO_MAX_NAME : strlen(name);
    if (!proto_utf8_valid(q.client, q.client_len)) { q.client = "libaneclient"; q.client_len = 12; }
    if (proto_req_encode(&c->out, &q) < 0) { err_set(err, errlen, "out of memory"); goto fail; }
    char e2[256];
    /* A daemon that refuses at once (busy, denied) may close before reading
     * our hello: its error is still there to read, so read before failing. */
    int sent = flush_out(c, deadline, e2, sizeof e2);
    char e3[256];
    proto_ev ev;
    int rc;
    do rc = next_event(c, &ev, deadline, e3, sizeof e3);
    while (rc == 0 && sent == 0 && left_ms(deadline) != 0);
    if (rc == 0 && sent == 0) { err_set(err, errlen, "aned at %s did not answer the handshake", path); goto fail; }
    if (rc <= 0) {
        err_set(err, errlen, "handshake with aned at %s: %s", path, sent < 0 ? e2 : e3);
        goto fail;
    }
    if (ev.type == PROTO_T_ERROR) {
        if (refused) *refused = ev.code;
        err_set(err, errlen, "aned refused the connection (%s): %.*s", proto_err_name(ev.code),
               (int)(ev.message_len > 400 ? 400 : ev.message_len), ev.message);
        goto fail;
    }
    if (ev.type != PROTO_T_HELLO_OK) {
        err_set(err, errlen, "aned answered the handshake with \"%s\"", proto_type_name(ev.type));
        goto fail;
    }
    c->version = ev.version;
    copy_str(c->server, sizeof c->server, ev.server, ev.server_len);
    copy_str(c->model, sizeof c->model, ev.model, ev.model_len);
    *out = c;
    return 0;
fail:
    ane_close(c);
    return -1;
}

uint32_t ane_server_version(const ane_client *c) { return c ? c->version : 0; }
const char *ane_server_name(const ane_client *c) { return c ? c->server : ""; }
const char *ane_model_name(const ane_client *c) { return c ? c->model : ""; }
int ane_fd(const ane_client *c) { return c ? c->fd : -1; }
size_t ane_in_flight(const ane_client *c) { return c ? c->n_flight : 0; }

uint64_t ane_submit(ane_client *c, proto_req *req, char *err, size_t errlen)
{
    if (!c || c->dead) { err_set(err, errlen, "the connection to aned is closed"); return 0; }
    if (req->type == PROTO_T_CANCEL || req->type == PROTO_T_HELLO || req->type < PROTO_T_HELLO
        || req->type > PROTO_T_EMBED) {
        err_set(err, errlen, "ane_submit: \"%s\" is not a request to submit", proto_type_name(req->type));
        return 0;
    }
    req->id = c->next_id++;
    if (proto_req_encode(&c->out, req) < 0) {
        err_set(err, errlen, "request too large (over %u bytes) or out of memory", PROTO_MAX_FRAME);
        return 0;
    }
    if (flight_add(c, req->id) < 0) {
        c->out.len = 0;
        err_set(err, errlen, "out of memory");
        return 0;
    }
    if (flush_out(c, -1, err, errlen) < 0) return 0;
    return req->id;
}

/* A request of type t on the text prompt (NULL: empty). */
static void text_req(proto_req *q, proto_type t, const char *prompt)
{
    proto_req_init(q, t, 0);
    q->text = prompt ? prompt : "";
    q->text_len = strlen(q->text);
}

uint64_t ane_submit_generate(ane_client *c, const char *prompt, int32_t max_tokens, char *err, size_t errlen)
{
    proto_req q;
    text_req(&q, PROTO_T_GENERATE, prompt);
    q.max_tokens = max_tokens;
    return ane_submit(c, &q, err, errlen);
}

uint64_t ane_submit_eval(ane_client *c, const char *prompt, int32_t top, char *err, size_t errlen)
{
    proto_req q;
    text_req(&q, PROTO_T_EVAL, prompt);
    q.top = top;
    return ane_submit(c, &q, err, errlen);
}

uint64_t ane_submit_chat(ane_client *c, const proto_msg *msgs, size_t n, int32_t max_tokens,
                         char *err, size_t errlen)
{
    if (!msgs || n == 0) { err_set(err, errlen, "ane_submit_chat: no messages"); return 0; }
    if (n > PROTO_MAX_MSGS) { err_set(err, errlen, "ane_submit_chat: over %d messages", PROTO_MAX_MSGS); return 0; }
    proto_req q;
    proto_req_init(&q, PROTO_T_GENERATE, 0);
    q.msgs = msgs;
    q.n_msgs = n;
    q.max_tokens = max_tokens;
    return ane_submit(c, &q, err, errlen);
}

uint64_t ane_submit_tokenize(ane_client *c, const char *text, size_t len, int add_bos, int special,
                             char *err, size_t errlen)
{
    proto_req q;
    proto_req_init(&q, PROTO_T_TOKENIZE, 0);
    q.text = text ? text : "";
    q.text_len = text ? len : 0;
    q.add_bos = add_bos;
    q.special = special;
    return ane_submit(c, &q, err, errlen);
}

uint64_t ane_submit_detokenize(ane_client *c, const int32_t *ids, size_t n, char *err, size_t errlen)
{
    static const int32_t none[1];
    proto_req q;
    proto_req_init(&q, PROTO_T_DETOKENIZE, 0);
    q.tokens = ids ? ids : none;
    q.n_tokens = ids ? n : 0;
    return ane_submit(c, &q, err, errlen);
}

uint64_t ane_submit_info(ane_client *c, char *err, size_t errlen)
{
    proto_req q;
    proto_req_init(&q, PROTO_T_INFO, 0);
    return ane_submit(c, &q, err, errlen);
}

uint64_t ane_submit_ping(ane_client *c, char *err, size_t errlen)
{
    proto_req q;
    proto_req_init(&q, PROTO_T_PING, 0);
    return ane_submit(c, &q, err, errlen);
}

int ane_cancel(ane_client *c, uint64_t id, char *err, size_t errlen)
{
    if (!c || c->dead) { err_set(err, errlen, "the connection to aned is closed"); return -1; }
    proto_req q;
    proto_req_init(&q, PROTO_T_CANCEL, id);
    if (proto_req_encode(&c->out, &q) < 0) { err_set(err, errlen, "out of memory"); return -1; }
    return flush_out(c, -1, err, errlen);
}

int ane_run(ane_client *c, uint64_t id, ane_event_cb cb, void *arg, int timeout_ms,
            char *err, size_t errlen)
{
    if (!c) { err_set(err, errlen, "no connection"); return -1; }
    for (;;) {
        proto_ev ev;
        long long deadline = timeout_ms > 0 ? now_ms() + timeout_ms : -1;
        int rc = next_event(c, &ev, deadline, err, errlen);
        if (rc < 0) return -1;
        if (rc == 0) {
            int s = cb ? cb(NULL, arg) : 0;
            if (s) return s;
            continue;
        }
        int s = cb ? cb(&ev, arg) : 0;
        if (s) return s;
        if (ev.id == id && ane_event_terminal(&ev)) return 0;
        if (ev.type == PROTO_T_ERROR && ev.id == 0) {
            err_set(err, errlen, "aned closed the connection (%s): %.*s", proto_err_name(ev.code),
                   (int)(ev.message_len > 400 ? 400 : ev.message_len), ev.message);
            return -1;
        }
    }
}
