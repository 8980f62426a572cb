/* server.c — the event loop: one libev loop owns every socket; the engine's
 * worker wakes it through an ev_async and the loop takes the engine's events
 * and encodes them to their clients.
 *
 * Ownership rules that keep a disconnect from dangling anything:
 *   - A job struct is the `user` pointer of its engine job. It lives from
 *     eng_submit until the job's terminal event (DONE/ERROR) is taken, or until
 *     eng_close at exit, whichever comes first; never shorter.
 *   - A job points to its client while the client lives. When a client goes
 *     away its jobs are cancelled and orphaned (cl = NULL); their later events
 *     are dropped.
 *   - Clients are freed only from top-level callbacks, and only once no job
 *     points at them.
 *
 * Back-pressure: replies go to a per-client buffer written with non-blocking
 * sends under an EV_WRITE watcher, so a slow reader never stalls the loop.
 * Past opt.out_pause bytes of backlog the client's requests are no longer
 * read and its jobs are paused in the engine (eng_pause: they keep their KV
 * but leave the batch); both resume once the backlog is down to half of it.
 * A client that stays paused for opt.stall_timeout seconds, or whose backlog
 * passes opt.out_max anyway, has its jobs cancelled: each ends with error
 * "busy" (its remaining tokens are dropped) instead of holding memory and
 * engine slots without bound. (The engine also takes a paused job's KV
 * pages back whenever another job waits for them.)
 *
 * Nothing a client sends is worked on here beyond decoding: tokenize
 * requests, like text prompts, are encoded on the engine's tokenizer thread
 * and answered when its event comes, so a megabyte of text delays nobody's
 * ping. Connections: each uid but the daemon's own is capped
 * (opt.max_clients_per_uid: a user running aned for themselves is not);
 * root and the daemon's own user keep a reserve of slots no other uid may
 * take; a
 * connection with nothing in flight is closed after opt.idle_timeout. Log
 * lines a peer can cause at will are rate-limited per uid (rl_allow). */
#include "daemon/server_int.h"
#include "common/mem.h"
#include "common/sig.h"

#include <errno.h>
#include <ev.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *const rl_names[RL__N] = {
    "denied connection", "refused connection", "client closed", "broken stream", "job failed", "backlog",
    "request cancelled",
};

static void rl_flush(server *s, rl_ent *r)
{
    if (r->suppressed)
        log_warn("uid %lu: %u more \"%s\" line(s) suppressed in %.0f s", (unsigned long)r->uid,
                 r->suppressed, rl_names[r->kind], RL_WINDOW);
    r->kind = -1;
    r->n = r->suppressed = 0;
}

/* 1: log this line; 0: suppressed (counted for the summary). */
int rl_allow(server *s, uid_t uid, rl_kind kind)
{
    ev_tstamp now = ev_now(s->loop);
    rl_ent *r = NULL, *victim = NULL;   /* victim: a free entry, else the oldest */
    for (int i = 0; i < RL_SLOTS; i++) {
        rl_ent *x = &s->rl[i];
        if (x->kind == (int)kind && x->uid == uid) { r = x; break; }
        if (!victim || (victim->kind >= 0 && (x->kind < 0 || x->start < victim->start))) victim = x;
    }
    if (r && now - r->start >= RL_WINDOW) { rl_flush(s, r); victim = r; r = NULL; }
    if (!r) {
        if (victim->kind >= 0) rl_flush(s, victim);
        r = victim;
        r->uid = uid;
        r->kind = (int)kind;
        r->start = now;
    }
    if (r->n < RL_BURST) { r->n++; return 1; }
    r->suppressed++;
    if (!ev_is_active(&s->rl_timer)) {
        ev_timer_set(&s->rl_timer, r->start + RL_WINDOW - now + 0.01, 0.);
        ev_timer_start(s->loop, &s->rl_timer);
    }
    return 0;
}

static void on_rl_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    server *s = w->data;
    ev_tstamp now = ev_now(loop), next = 0;
    for (int i = 0; i < RL_SLOTS; i++) {
        rl_ent *r = &s->rl[i];
        if (r->kind < 0) continue;
        if (now - r->start >= RL_WINDOW) rl_flush(s, r);
        else if (r->suppressed && (!next || r->start + RL_WINDOW < next)) next = r->start + RL_WINDOW;
    }
    if (next) {
        ev_timer_set(w, next - now + 0.01, 0.);
        ev_timer_start(loop, w);
    }
}

uid_use *uid_find(server *s, uid_t uid, int create)
{
    for (size_t i = 0; i < s->n_uids; i++)
        if (s->uids[i].uid == uid) return &s->uids[i];
    if (!create) return NULL;
    uid_use *nu = mem_grow(s->uids, &s->cap_uids, s->n_uids + 1, sizeof *nu, 8);
    if (!nu) return NULL;
    s->uids = nu;
    uid_use *u = &s->uids[s->n_uids++];
    u->uid = uid;
    u->clients = u->jobs = 0;
    return u;
}

void uid_release(server *s, uid_t uid, int clients, int jobs)
{
    uid_use *u = uid_find(s, uid, 0);
    if (!u) return;
    u->clients -= (uint32_t)clients;
    u->jobs -= (uint32_t)jobs;
    if (!u->clients && !u->jobs) *u = s->uids[--s->n_uids];
}

void server_opts_default(server_opts *o)
{
    *o = (server_opts){
        .max_clients = 256, .max_clients_per_uid = 64,
        .out_pause = 1u << 20, .out_max = 16u << 20,
        .stall_timeout = 60.0, .handshake_timeout = 10.0, .idle_timeout = 300.0,
        .shutdown_grace = 5.0, .drain_timeout = 2.0,
    };
}

/* root and the daemon's own user: the only ones who may take the last
 * reserve_slots() connections */
int privileged(const server *s, uid_t uid) { return uid == 0 || uid == s->opt.daemon_uid; }
uint32_t reserve_slots(const server *s) { return (uint32_t)s->opt.max_clients / 16; }

const eng_model_info *server_model(const server *s) { return eng_model(s->eng); }

proto_err map_eng_err(eng_err c)
{
    switch (c) {
    case ENG_OK:        return PROTO_OK;
    case ENG_EINVAL:    return PROTO_E_INVALID_VALUE;
    case ENG_ETOKEN:    return PROTO_E_INVALID_TOKEN;
    case ENG_ECTX:      return PROTO_E_CONTEXT;
    case ENG_EBUSY:     return PROTO_E_BUSY;
    case ENG_ENOMODEL:  return PROTO_E_NO_MODEL;
    case ENG_EUTF8:     return PROTO_E_INVALID_UTF8;
    case ENG_ESHUTDOWN: return PROTO_E_SHUTDOWN;
    case ENG_EMODEL_CHANGED: return PROTO_E_MODEL_CHANGED;
    case ENG_ENOMEM:
    case ENG_EINTERNAL:
    default:            return PROTO_E_INTERNAL;
    }
}

/* ---------------------------------------------------------------- output */

#define OUT_KEEP (256u << 10) /* output buffer kept between bursts */

/* After a broken stream the error is sent at once. A peer that may still be
 * writing (input waiting, or the message over 1 MiB not read to the size its
 * headers claim) has what it sends read and dropped until that message is
 * read with nothing more waiting, or it stops (end of file, or nothing for
 * DISCARD_QUIET_S), within DISCARD_MAX_S and DISCARD_MAX_BYTES: it then
 * finishes its write and reads the error instead of meeting EPIPE. A peer
 * with nothing more on its way is closed at once, as before. */
#define DISCARD_QUIET_S 0.5
#define DISCARD_MAX_S 10.0
#define DISCARD_MAX_BYTES (8u * PROTO_MAX_FRAME)

static size_t backlog(const client *cl) { return cl->out.len - cl->out_off; }

static void client_update_read(client *cl)
{
    server *s = cl->srv;
    int want = cl->state != CL_CLOSING && !cl->eof;
    if (cl->discard) {
        want = !cl->eof;   /* dropped as read: no backlog check */
    } else if (want) {
        /* hysteresis: pause past out_pause, resume at half of it */
        size_t lim = ev_is_active(&cl->rio) ? s->opt.out_pause : s->opt.out_pause / 2;
        want = backlog(cl) <= lim;
    }
    if (want && !ev_is_active(&cl->rio)) ev_io_start(s->loop, &cl->rio);
    else if (!want && ev_is_active(&cl->rio)) ev_io_stop(s->loop, &cl->rio);
}

void job_cancel(server *s, job *j)
{
    if (j->cancelled) return;
    j->cancelled = 1;
    eng_cancel(s->eng, j->eng_id);
}

static void client_overflow(client *cl, const char *why)
{
    int n = 0;
    for (job *j = cl->jobs; j; j = j->cl_next) {
        if (j->overflow) continue;
        j->overflow = 1;
        job_cancel(cl->srv, j);
        n++;
    }
    if (n)
        LOG_RL(cl->srv, cl->peer.uid, RL_OVERFLOW, LOG_WARN,
               "client %llu (uid %lu pid %ld): output backlog %zu bytes, %s: cancelled %d job(s)",
               (unsigned long long)cl->serial, (unsigned long)cl->peer.uid, (long)cl->peer.pid,
               backlog(cl), why, n);
}

/* Pauses or resumes the client's jobs in the engine as its backlog moves. */
static void client_update_pause(client *cl)
{
    server *s = cl->srv;
    int want;
    if (cl->state == CL_CLOSING) want = 0;
    else if (cl->paused) want = backlog(cl) > s->opt.out_pause / 2;
    else want = backlog(cl) > s->opt.out_pause;
    if (want == cl->paused) return;
    cl->paused = want;
    for (job *j = cl->jobs; j; j = j->cl_next)
        if (!j->cancelled && !j->tokenize) eng_pause(s->eng, j->eng_id, want);
    if (cl->state != CL_READY) return;
    ev_timer_stop(s->loop, &cl->timer);
    if (want) {
        log_debug("client %llu: backlog %zu bytes: jobs paused", (unsigned long long)cl->serial, backlog(cl));
        ev_timer_set(&cl->timer, s->opt.stall_timeout, 0.);
        ev_timer_start(s->loop, &cl->timer);
    }
}

/* Appends one message; never frees the client. */
void client_send(client *cl, const proto_ev *ev)
{
    size_t before = cl->out.len;
    if (proto_ev_encode(&cl->out, ev) < 0) {
        cl->out.len = before; /* drop a partial message */
        log_error("client %llu: cannot encode a %s message (over a limit or out of memory)",
                  (unsigned long long)cl->serial, proto_type_name(ev->type));
        if (ev->type == PROTO_T_ERROR) return;
        proto_ev e;
        proto_ev_init(&e, PROTO_T_ERROR, ev->id);
        e.code = PROTO_E_INTERNAL;
        e.message = "reply could not be encoded";
        e.message_len = strlen(e.message);
        if (proto_ev_encode(&cl->out, &e) < 0) cl->out.len = before;
    }
    if (backlog(cl) && !ev_is_active(&cl->wio)) ev_io_start(cl->srv->loop, &cl->wio);
    if (backlog(cl) > cl->srv->opt.out_max) client_overflow(cl, "over the backlog limit");
    client_update_pause(cl);
    client_update_read(cl);
}

void error_ev(client *cl, uint64_t id, proto_err code, const char *msg, int closing)
{
    proto_ev e;
    proto_ev_init(&e, PROTO_T_ERROR, id);
    e.code = code;
    e.message = msg ? msg : "";
    e.message_len = strlen(e.message);
    e.closing = closing;
    client_send(cl, &e);
}

/* An error that answers a request: its text starts with the request's type
 * ("generate: ...") as the decoder's own texts do. */
void send_error(client *cl, uint64_t id, proto_type type, proto_err code, const char *msg)
{
    const char *tn = proto_type_name(type);
    size_t tl = strlen(tn);
    if (!msg) msg = "";
    if (!tl || (strncmp(msg, tn, tl) == 0 && msg[tl] == ':')) {
        error_ev(cl, id, code, msg, 0);
        return;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s: %s", tn, msg);
    error_ev(cl, id, code, buf, 0);
}

/* The connection's last message: the client is told that it closes
 * ("closing": true); the caller closes it. */
void send_fatal(client *cl, uint64_t id, proto_err code, const char *msg)
{
    error_ev(cl, id, code, msg, 1);
}

/* For connections refused at accept: one message, best effort, then close. */
static void refuse_fd(int fd, proto_err code, const char *msg)
{
    proto_buf b = { 0 };
    proto_ev e;
    proto_ev_init(&e, PROTO_T_ERROR, 0);
    e.code = code;
    e.message = msg;
    e.message_len = strlen(msg);
    e.closing = 1;
    if (proto_ev_encode(&b, &e) == 0) {
        ssize_t w = send(fd, b.data, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
    }
    proto_buf_free(&b);
    close(fd);
}

/* ---------------------------------------------------------------- clients */

static void check_done(server *s);
int client_maybe_finish(client *cl);

static void client_free(client *cl, const char *why)
{
    server *s = cl->srv;
    for (job *j = cl->jobs, *nx; j; j = nx) {
        nx = j->cl_next;
        job_cancel(s, j);
        j->cl = NULL;
        j->cl_prev = j->cl_next = NULL;
    }
    cl->jobs = NULL;
    ev_io_stop(s->loop, &cl->rio);
    ev_io_stop(s->loop, &cl->wio);
    ev_timer_stop(s->loop, &cl->timer);
    ev_timer_stop(s->loop, &cl->idle);
    close(cl->fd);
    if (cl->prev) cl->prev->next = cl->next; else s->clients = cl->next;
    if (cl->next) cl->next->prev = cl->prev;
    s->n_clients--;
    uid_release(s, cl->peer.uid, 1, 0);
    LOG_RL(s, cl->peer.uid, RL_CLOSED, LOG_INFO,
           "client %llu (uid %lu pid %ld%s%s) closed: %s; %llu requests, %llu tokens, %.1f s",
           (unsigned long long)cl->serial, (unsigned long)cl->peer.uid, (long)cl->peer.pid,
           cl->name[0] ? " " : "", cl->name, why,
           (unsigned long long)cl->n_requests, (unsigned long long)cl->n_tokens,
           ev_now(s->loop) - cl->since);
    proto_reader_free(cl->rd);
    proto_buf_free(&cl->out);
    free(cl);
    check_done(s);
}

/* Ends the reading after a broken stream: the connection closes once its
 * error is sent (within the usual drain time). Top-level only. */
static void discard_stop(client *cl)
{
    server *s = cl->srv;
    cl->discard = 0;
    cl->eof = 1;
    client_update_read(cl);
    ev_timer_stop(s->loop, &cl->timer);
    ev_timer_set(&cl->timer, s->opt.drain_timeout, 0.);
    ev_timer_start(s->loop, &cl->timer);
    client_maybe_finish(cl);
}

static void on_client_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    client *cl = w->data;
    if (cl->discard) {   /* the peer sent nothing more for a while */
        discard_stop(cl);
        return;
    }
    if (cl->state == CL_READY) { /* stalled: paused too long */
        client_overflow(cl, "not read for the stall timeout");
        return;
    }
    if (cl->state == CL_HANDSHAKE) {
        char msg[64];
        snprintf(msg, sizeof msg, "no hello within %.0f s", cl->srv->opt.handshake_timeout);
        send_fatal(cl, 0, PROTO_E_HANDSHAKE, msg);
        client_close_soon(cl, "no hello in time");
        return;
    }
    client_free(cl, "peer did not read its last replies");
}

/* A ready connection with nothing in flight that sent no request for
 * opt.idle_timeout seconds is told so and closed; one with work is looked at
 * again a whole timeout later. */
static void on_client_idle(struct ev_loop *loop, ev_timer *w, int revents)
{
    client *cl = w->data;
    server *s = cl->srv;
    if (cl->state != CL_READY) return;
    ev_tstamp left = cl->last_active + s->opt.idle_timeout - ev_now(loop);
    if (cl->n_jobs || backlog(cl) || left > 0) {
        ev_timer_set(w, cl->n_jobs || backlog(cl) || left <= 0 ? s->opt.idle_timeout : left, 0.);
        ev_timer_start(loop, w);
        return;
    }
    char msg[96];
    snprintf(msg, sizeof msg, "closed: no request for %.0f s (idle timeout)", s->opt.idle_timeout);
    send_fatal(cl, 0, PROTO_E_BUSY, msg);
    client_close_soon(cl, "idle timeout");
    client_maybe_finish(cl);
}

/* Stop reading, cancel what runs, flush what is queued, then close (bounded). */
void client_close_soon(client *cl, const char *why)
{
    server *s = cl->srv;
    if (cl->state == CL_CLOSING) return;
    cl->state = CL_CLOSING;
    cl->why = why;
    for (job *j = cl->jobs; j; j = j->cl_next) job_cancel(s, j);
    client_update_read(cl);
    ev_timer_stop(s->loop, &cl->timer);
    ev_timer_set(&cl->timer, s->opt.drain_timeout, 0.);
    ev_timer_start(s->loop, &cl->timer);
}

/* Closes the client once nothing more is owed to it. Top-level only. */
int client_maybe_finish(client *cl)
{
    server *s = cl->srv;
    if (cl->n_jobs) return 0;
    if (cl->discard && !cl->eof) {
        if (s->phase == PH_RUN) return 0;   /* client_discard or the timer closes it */
        cl->discard = 0;                    /* shutting down: no more waiting for it */
        client_update_read(cl);
    }
    if (cl->state != CL_CLOSING) {
        if (s->phase != PH_RUN) {
            send_fatal(cl, 0, PROTO_E_SHUTDOWN, "the server is shutting down");
            client_close_soon(cl, "shutdown");
        } else if (cl->eof) {
            client_close_soon(cl, "peer finished");
        } else {
            return 0;
        }
    }
    if (backlog(cl)) return 0;
    client_free(cl, cl->why ? cl->why : "closing");
    return 1;
}

static void on_client_write(struct ev_loop *loop, ev_io *w, int revents)
{
    client *cl = w->data;
    while (backlog(cl)) {
        ssize_t n = send(cl->fd, cl->out.data + cl->out_off, backlog(cl), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            client_free(cl, errno == EPIPE || errno == ECONNRESET ? "peer went away" : strerror(errno));
            return;
        }
        cl->out_off += (size_t)n;
    }
    if (!backlog(cl)) {
        ev_io_stop(loop, &cl->wio);
        if (cl->out.cap > OUT_KEEP) proto_buf_free(&cl->out); /* a burst's memory goes back */
        else cl->out.len = 0;
        cl->out_off = 0;
    } else if (cl->out_off >= OUT_KEEP && cl->out_off >= cl->out.len / 2) {
        /* sent bytes are dropped in large steps: never a memmove per send */
        proto_buf_consume(&cl->out, cl->out_off);
        cl->out_off = 0;
    }
    client_update_pause(cl);
    client_update_read(cl);
    if (!backlog(cl)) client_maybe_finish(cl);
}

job *client_find_job(client *cl, uint64_t req_id)
{
    for (job *j = cl->jobs; j; j = j->cl_next)
        if (j->req_id == req_id) return j;
    return NULL;
}

/* 1: the peer closed both directions (gone); 0: it only shut its writing side. */
static int peer_gone(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLOUT };
    if (poll(&p, 1, 0) < 0) return 1;
    return (p.revents & (POLLHUP | POLLERR)) != 0;
}

/* 1: bytes are waiting to be read on fd (0 at end of file or when none). */
static int input_waiting(int fd)
{
    char b;
    ssize_t n;
    do n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT); while (n < 0 && errno == EINTR);
    return n > 0;
}

/* Takes every whole message the reader holds. */
static void client_drain(client *cl)
{
    while (cl->state != CL_CLOSING) {
        proto_req req;
        proto_err code = PROTO_OK;
        char err[256] = "";
        int rc = proto_reader_next_req(cl->rd, &req, &code, err, sizeof err);
        if (rc == 0) break;
        if (rc < 0) {
            LOG_RL(cl->srv, cl->peer.uid, RL_BROKEN, LOG_INFO, "client %llu (uid %lu): broken stream (%s: %s); closing",
                   (unsigned long long)cl->serial, (unsigned long)cl->peer.uid, proto_err_name(code), err);
            send_fatal(cl, 0, code == PROTO_OK ? PROTO_E_MALFORMED : code, err);
            client_close_soon(cl, "broken stream");
            uint64_t claim = proto_reader_claimed(cl->rd), have = proto_reader_pending(cl->rd);
            cl->discard_owed = claim > have ? claim - have : 0;
            if (!cl->eof && (cl->discard_owed || input_waiting(cl->fd))) {
                server *s = cl->srv;
                cl->discard = 1;
                cl->discard_end = ev_now(s->loop) + DISCARD_MAX_S;
                ev_timer_stop(s->loop, &cl->timer);
                ev_timer_set(&cl->timer, DISCARD_QUIET_S < s->opt.drain_timeout ? DISCARD_QUIET_S
                                                                                : s->opt.drain_timeout, 0.);
                ev_timer_start(s->loop, &cl->timer);
                client_update_read(cl);
            }
            break;
        }
        if (code != PROTO_OK) {
            cl->n_requests++;
            send_error(cl, req.id, PROTO_T_NONE, code, err);   /* the decoder's text names the type */
            continue;
        }
        dispatch(cl, &req);
    }
}

/* Reads and drops input after a broken stream (see DISCARD_MAX_S). */
static void client_discard(client *cl)
{
    server *s = cl->srv;
    char buf[65536];
    ssize_t n;
    do n = read(cl->fd, buf, sizeof buf); while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    ev_tstamp now = ev_now(s->loop);
    int done = n <= 0;
    if (n > 0) {
        cl->discarded += (size_t)n;
        if (cl->discard_owed) {   /* the message at fault read to its end, nothing after it: done */
            cl->discard_owed -= (uint64_t)n < cl->discard_owed ? (uint64_t)n : cl->discard_owed;
            done = !cl->discard_owed && !input_waiting(cl->fd);
        }
    }
    if (done || cl->discarded >= DISCARD_MAX_BYTES || now >= cl->discard_end) {
        discard_stop(cl);
        return;
    }
    ev_tstamp quiet = DISCARD_QUIET_S < s->opt.drain_timeout ? DISCARD_QUIET_S : s->opt.drain_timeout;
    if (now + quiet > cl->discard_end) quiet = cl->discard_end - now;
    ev_timer_stop(s->loop, &cl->timer);
    ev_timer_set(&cl->timer, quiet, 0.);
    ev_timer_start(s->loop, &cl->timer);
}

static void on_client_read(struct ev_loop *loop, ev_io *w, int revents)
{
    client *cl = w->data;
    if (cl->discard) { client_discard(cl); return; }
    size_t avail = 0;
    char *sp = proto_reader_space(cl->rd, &avail);
    if (!sp && avail) {
        client_free(cl, "out of memory for its request");
        return;
    }
    if (sp && avail) {
        if (avail > 65536) avail = 65536; /* a bounded slice per wakeup keeps clients fair */
        ssize_t n;
        do n = read(cl->fd, sp, avail); while (n < 0 && errno == EINTR);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            client_free(cl, errno == ECONNRESET ? "peer went away" : strerror(errno));
            return;
        }
        if (n == 0) {
            if (peer_gone(cl->fd)) {
                client_free(cl, cl->n_jobs ? "peer went away mid-request (its jobs cancelled)"
                                           : "closed by peer");
                return;
            }
            cl->eof = 1; /* half-closed: answer what was asked, then close */
            client_update_read(cl);
            client_maybe_finish(cl);
            return;
        }
        proto_reader_commit(cl->rd, (size_t)n);
    } else if (!sp) {
        client_free(cl, "out of memory for its request");
        return;
    }
    client_drain(cl);
    client_maybe_finish(cl);
}

static int peer_allowed(server *s, int fd, const sock_peer *p)
{
    return !s->opt.allow || acl_allows(s->opt.allow, fd, p);
}

static void client_new(server *s, int fd, const sock_peer *peer)
{
    client *cl = calloc(1, sizeof *cl);
    proto_reader *rd = cl ? proto_reader_new(PROTO_MAX_FRAME) : NULL;
    if (!cl || !rd) {
        free(cl);
        proto_reader_free(rd);
        refuse_fd(fd, PROTO_E_INTERNAL, "out of memory");
        return;
    }
    cl->srv = s;
    cl->fd = fd;
    cl->rd = rd;
    uid_use *uu = uid_find(s, peer->uid, 1);
    if (!uu) {
        proto_reader_free(rd);
        free(cl);
        refuse_fd(fd, PROTO_E_INTERNAL, "out of memory");
        return;
    }
    uu->clients++;
    cl->peer = *peer;
    cl->serial = ++s->next_serial;
    cl->since = ev_now(s->loop);
    ev_io_init(&cl->rio, on_client_read, fd, EV_READ);
    ev_io_init(&cl->wio, on_client_write, fd, EV_WRITE);
    ev_timer_init(&cl->timer, on_client_timer, s->opt.handshake_timeout, 0.);
    ev_timer_init(&cl->idle, on_client_idle, 1., 0.);
    cl->rio.data = cl->wio.data = cl->timer.data = cl->idle.data = cl;
    cl->last_active = cl->since;
    cl->next = s->clients;
    if (s->clients) s->clients->prev = cl;
    s->clients = cl;
    s->n_clients++;
    s->conns_total++;
    ev_io_start(s->loop, &cl->rio);
    ev_timer_start(s->loop, &cl->timer);
    log_debug("client %llu connected: uid %lu gid %lu pid %ld", (unsigned long long)cl->serial,
              (unsigned long)peer->uid, (unsigned long)peer->gid, (long)peer->pid);
}

/* ---------------------------------------------------------------- accept */

static void on_accept_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    server *s = w->data;
    if (s->phase == PH_RUN && s->lst) ev_io_start(loop, &s->accept_io);
}

static void on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    server *s = w->data;
    for (int i = 0; i < 64; i++) {
        sock_peer peer;
        int fd = sock_accept(w->fd, &peer);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            if (e == ECONNABORTED || e == EPROTO || e == EPERM) continue;
            /* EMFILE/ENFILE/ENOBUFS/ENOMEM: the pending connection stays
             * pending; pause instead of spinning on a readable socket. */
            log_warn("accept: %s; pausing new connections for 0.5 s", strerror(e));
            ev_io_stop(loop, &s->accept_io);
            ev_timer_stop(loop, &s->accept_retry);
            ev_timer_set(&s->accept_retry, 0.5, 0.);
            ev_timer_start(loop, &s->accept_retry);
            return;
        }
        if (!peer_allowed(s, fd, &peer)) {
            LOG_RL(s, peer.uid, RL_DENIED, LOG_WARN, "denied connection from uid %lu gid %lu pid %ld: not on the allow list",
                   (unsigned long)peer.uid, (unsigned long)peer.gid, (long)peer.pid);
            refuse_fd(fd, PROTO_E_DENIED, "not allowed to use this server");
            continue;
        }
        int priv = privileged(s, peer.uid);
        uid_use *uu = uid_find(s, peer.uid, 0);
        if (peer.uid != s->opt.daemon_uid && s->opt.max_clients_per_uid > 0 && uu &&
            uu->clients >= (uint32_t)s->opt.max_clients_per_uid) {
            LOG_RL(s, peer.uid, RL_REFUSED, LOG_WARN, "refused connection from uid %lu pid %ld: %u connections of that uid already",
                   (unsigned long)peer.uid, (long)peer.pid, uu->clients);
            refuse_fd(fd, PROTO_E_BUSY, "too many connections from this user");
            continue;
        }
        uint32_t cap = (uint32_t)s->opt.max_clients - (priv ? 0 : reserve_slots(s));
        if (s->n_clients >= cap) {
            LOG_RL(s, peer.uid, RL_REFUSED, LOG_WARN, "refused connection from uid %lu pid %ld: %u clients already%s",
                   (unsigned long)peer.uid, (long)peer.pid, s->n_clients,
                   priv ? "" : " (the rest is kept for root and the daemon's user)");
            refuse_fd(fd, PROTO_E_BUSY, "too many connections");
            continue;
        }
        client_new(s, fd, &peer);
    }
}

static void take_events(server *s)
{
    eng_event *ev = eng_events_take(s->eng);
    while (ev) {
        eng_event *nx = ev->next;
        handle_event(s, ev);
        eng_event_free(ev);
        ev = nx;
    }
    if (!s->n_jobs) ev_timer_stop(s->loop, &s->poll_timer);
    check_done(s);
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents)
{
    take_events(w->data);
}

/* While jobs are in flight, events are also taken every POLL_S: a wakeup the
 * engine failed to send then costs latency, never a job that hangs. */
#define POLL_S 0.25

static void on_poll(struct ev_loop *loop, ev_timer *w, int revents)
{
    take_events(w->data);
}

/* The engine's log lines (e.g. the model file changed on disk). */
static void eng_log_line(void *arg, int warn, const char *line)
{
    (void)arg;
    if (warn) log_warn("%s", line);
    else log_error("%s", line);
}

static void notify_loop(void *arg)
{
    server *s = arg;
    ev_async_send(s->loop, &s->wake);
}

/* ---------------------------------------------------------------- shutdown */

static void check_done(server *s)
{
    if (s->phase == PH_RUN) return;
    if (s->n_jobs == 0 && s->n_clients == 0) ev_break(s->loop, EVBREAK_ALL);
}

static void cancel_all(server *s)
{
    s->phase = PH_CANCEL;
    for (job *j = s->jobs; j; j = j->all_next) job_cancel(s, j);
    ev_timer_stop(s->loop, &s->phase_timer);
    ev_timer_set(&s->phase_timer, s->opt.drain_timeout, 0.);
    ev_timer_start(s->loop, &s->phase_timer);
}

static void on_phase_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    server *s = w->data;
    if (s->phase == PH_GRACE) {
        log_info("grace period over: cancelling %u job(s)", s->n_jobs);
        cancel_all(s);
        return;
    }
    log_warn("drain timeout: leaving %u job(s) and %u client(s) unflushed", s->n_jobs, s->n_clients);
    ev_break(loop, EVBREAK_ALL);
}

static void begin_shutdown(server *s, const char *why)
{
    if (s->phase != PH_RUN) {
        if (s->phase == PH_GRACE) {
            log_info("%s again: cancelling %u job(s) now", why, s->n_jobs);
            cancel_all(s);
        }
        return;
    }
    log_info("%s: shutting down (%u client(s), %u job(s))", why, s->n_clients, s->n_jobs);
    notify_send("STOPPING=1\nSTATUS=draining %u job(s)", s->n_jobs);
    s->phase = PH_GRACE;
    ev_io_stop(s->loop, &s->accept_io);
    ev_timer_stop(s->loop, &s->accept_retry);
    if (s->lst) { sock_close(s->lst); s->lst = NULL; }
    /* idle connections go now (after their replies); busy ones when their jobs end */
    for (client *c = s->clients, *nx; c; c = nx) {
        nx = c->next;
        client_maybe_finish(c);
    }
    if (s->n_jobs) {
        if (s->opt.shutdown_grace > 0) {
            ev_timer_set(&s->phase_timer, s->opt.shutdown_grace, 0.);
            ev_timer_start(s->loop, &s->phase_timer);
        } else {
            cancel_all(s);
        }
    } else {
        ev_timer_set(&s->phase_timer, s->opt.drain_timeout, 0.);
        s->phase = PH_CANCEL;
        ev_timer_start(s->loop, &s->phase_timer);
    }
    check_done(s);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    server *s = w->data;
    if (w->signum == SIGHUP) {
        if (log_reopen() < 0) log_error("SIGHUP: cannot reopen the log file");
        else log_info("SIGHUP: log file reopened");
        return;
    }
    begin_shutdown(s, w->signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---------------------------------------------------------------- lifecycle */

static void signals_stop(server *s)
{
    for (int i = 0; i < N_STOP_SIGS; i++) ev_signal_stop(s->loop, &s->sig[i]);
}

int server_open(server **out, const server_opts *opt, char *err, size_t errlen)
{
    *out = NULL;
    server *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return -1; }
    s->opt = *opt;
    s->loop = ev_default_loop(EVFLAG_AUTO);
    if (!s->loop) { snprintf(err, errlen, "cannot create the event loop"); free(s); return -1; }
    ev_async_init(&s->wake, on_wake);
    s->wake.data = s;
    ev_async_start(s->loop, &s->wake);
    ev_timer_init(&s->poll_timer, on_poll, POLL_S, POLL_S);
    s->poll_timer.data = s;
    ev_timer_init(&s->rl_timer, on_rl_timer, RL_WINDOW, 0.);
    s->rl_timer.data = s;
    for (int i = 0; i < RL_SLOTS; i++) s->rl[i].kind = -1;
    /* Watched from here on: a SIGTERM while the model loads stops the
     * daemon cleanly as soon as the loop runs. */
    for (int i = 0; i < N_STOP_SIGS; i++) {
        ev_signal_init(&s->sig[i], on_signal, stop_sig[i]);
        s->sig[i].data = s;
        ev_signal_start(s->loop, &s->sig[i]);
    }

    /* The engine's worker thread inherits this mask: signals are for the loop.
     * Unblocked here once the engine runs, whatever the caller's mask was. */
    sigset_t set;
    stop_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    eng_opts eo = opt->eng;
    eo.notify = notify_loop;
    eo.notify_arg = s;
    eo.log = eng_log_line;
    char eerr[512] = "";
    int rc = eng_open(&s->eng, &eo, eerr, sizeof eerr);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    if (rc < 0) {
        const char *p = eo.model_path ? eo.model_path : "(none)";
        if (strstr(eerr, p)) snprintf(err, errlen, "cannot load model: %s", eerr);
        else snprintf(err, errlen, "cannot load model %s: %s", p, eerr[0] ? eerr : "unknown error");
        signals_stop(s);
        ev_async_stop(s->loop, &s->wake);
        ev_loop_destroy(s->loop);
        free(s);
        return -1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->seed_state = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    *out = s;
    return 0;
}

int server_run(server *s, sock_listener *l)
{
    s->lst = l;
    s->started = ev_time();
    ev_io_init(&s->accept_io, on_accept, l->fd, EV_READ);
    s->accept_io.data = s;
    ev_timer_init(&s->accept_retry, on_accept_retry, 0.5, 0.);
    s->accept_retry.data = s;
    ev_timer_init(&s->phase_timer, on_phase_timer, 1., 0.);
    s->phase_timer.data = s;
    ev_io_start(s->loop, &s->accept_io);

    ev_run(s->loop, 0);

    signals_stop(s);
    ev_io_stop(s->loop, &s->accept_io);
    ev_timer_stop(s->loop, &s->accept_retry);
    ev_timer_stop(s->loop, &s->phase_timer);
    ev_timer_stop(s->loop, &s->poll_timer);
    if (s->lst) { sock_close(s->lst); s->lst = NULL; }
    while (s->clients) client_free(s->clients, "shutdown");
    ev_timer_stop(s->loop, &s->rl_timer);
    for (int i = 0; i < RL_SLOTS; i++)
        if (s->rl[i].kind >= 0) rl_flush(s, &s->rl[i]);
    log_info("served %llu connection(s), %llu request(s), %llu token(s)",
             (unsigned long long)s->conns_total, (unsigned long long)s->requests_total,
             (unsigned long long)s->tokens_served);
    return 0;
}

void server_close(server *s)
{
    if (!s) return;
    while (s->clients) client_free(s->clients, "shutdown");
    eng_close(s->eng); /* frees events still queued: their jobs are ours to free */
    for (job *j = s->jobs, *nx; j; j = nx) {
        nx = j->all_next;
        free(j);
    }
    signals_stop(s);
    ev_timer_stop(s->loop, &s->poll_timer);
    ev_timer_stop(s->loop, &s->rl_timer);
    ev_async_stop(s->loop, &s->wake);
    ev_loop_destroy(s->loop);
    free(s->uids);
    free(s);
}
