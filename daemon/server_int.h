/* server_int.h — what the event loop (server.c) and the request and event
 * handlers (jobs.c) share: the connection and job records and the loop's
 * helpers. Private to daemon/. */
#ifndef ANED_SERVER_INT_H
#define ANED_SERVER_INT_H

#include "common/sig.h"
#include "daemon/aned.h"
#include "proto/proto.h"

#include <ev.h>
#include <sys/types.h>

typedef struct client client;
typedef struct job job;

typedef enum cl_state {
    CL_HANDSHAKE = 0, /* waiting for hello */
    CL_READY,         /* serving requests */
    CL_CLOSING,       /* no more reading, no jobs: flush what is queued, then close */
} cl_state;

struct job {
    client *cl;               /* NULL once the client is gone */
    job *cl_prev, *cl_next;   /* the client's jobs */
    job *all_prev, *all_next; /* every job the engine still owns */
    uint64_t eng_id, req_id;
    int started;              /* an event arrived: it left the queue */
    int cancelled;            /* eng_cancel was sent */
    int overflow;             /* cancelled for the client's backlog */
    int tokenize;             /* a tokenize request (not counted in uid_use.jobs) */
    int client_cancel;        /* the client sent cancel for it */
    proto_type type;          /* the request, for its error texts */
    uid_t uid;                /* the peer's, counted in its uid_use until the job ends */
};

struct client {
    server *srv;
    client *prev, *next;
    uint64_t serial;          /* connection number; the engine's fairness owner */
    int fd;
    cl_state state;
    int eof;                  /* peer shut its writing side: close when idle */
    int paused;               /* its jobs are paused for its backlog */
    int discard;              /* closing after a broken stream: input is read and dropped */
    size_t discarded;         /* bytes dropped so far */
    uint64_t discard_owed;    /* bytes still to come of the message over 1 MiB */
    ev_tstamp discard_end;    /* reading stops by then at the latest */
    ev_io rio, wio;
    ev_timer timer;           /* hello deadline, stall deadline, closing deadline */
    ev_timer idle;            /* idle deadline (ready, nothing in flight) */
    ev_tstamp last_active;    /* last request taken or job ended */
    proto_reader *rd;
    proto_buf out;            /* replies; bytes before out_off are already sent */
    size_t out_off;
    sock_peer peer;
    job *jobs;
    uint32_t n_jobs;
    uint64_t n_requests, n_tokens;
    ev_tstamp since;
    const char *why;          /* why it is closing, for the log */
    char name[48];            /* from hello, for the log */
};

/* Per peer uid: connections and jobs (in flight + queued) across all its
 * connections, for --max-clients-per-uid and --max-jobs-per-uid. An entry
 * goes when both reach 0; few uids share a machine, so a list will do. */
typedef struct uid_use {
    uid_t uid;
    uint32_t clients, jobs;
} uid_use;

/* Rate limit of the log lines a peer can cause at will, per (uid, kind):
 * RL_BURST lines per RL_WINDOW seconds, then one line saying how many more
 * were suppressed once the window is over. */
typedef enum rl_kind { RL_DENIED = 0, RL_REFUSED, RL_CLOSED, RL_BROKEN, RL_FAILED, RL_OVERFLOW, RL_CANCELLED,
                       RL__N } rl_kind;
#define RL_BURST 10
#define RL_WINDOW 5.0
#define RL_SLOTS 64           /* (uid, kind) pairs tracked; the oldest is summarised and reused */
typedef struct rl_ent {
    uid_t uid;
    int kind;                 /* -1: unused */
    ev_tstamp start;
    uint32_t n, suppressed;
} rl_ent;

typedef enum srv_phase {
    PH_RUN = 0,
    PH_GRACE,     /* no new connections or jobs; running jobs may finish */
    PH_CANCEL,    /* jobs cancelled; waiting for their last events and flushes */
} srv_phase;

struct server {
    struct ev_loop *loop;
    eng *eng;
    server_opts opt;
    ev_async wake;
    ev_signal sig[N_STOP_SIGS];   /* SIGTERM, SIGINT, SIGHUP */
    ev_io accept_io;
    ev_timer accept_retry;
    ev_timer phase_timer;
    ev_timer poll_timer;      /* safety net for lost wakeups while jobs run */
    sock_listener *lst;
    client *clients;
    uint32_t n_clients;
    job *jobs;
    uint32_t n_jobs;
    uint64_t next_serial;
    srv_phase phase;
    ev_tstamp started;
    uint64_t tokens_served, conns_total, requests_total;
    uint64_t seed_state;
    uid_use *uids;
    size_t n_uids, cap_uids;
    rl_ent rl[RL_SLOTS];
    ev_timer rl_timer;        /* says what was suppressed when a window ends */
};

/* A log line a peer can cause at will: rate-limited per (uid, kind). */
#define LOG_RL(s, uid, kind, lv, ...) do { if (rl_allow((s), (uid), (kind))) log_msg((lv), __VA_ARGS__); } while (0)

/* server.c */
void client_send(client *cl, const proto_ev *ev);
void send_error(client *cl, uint64_t id, proto_type type, proto_err code, const char *msg);
void send_fatal(client *cl, uint64_t id, proto_err code, const char *msg);
void error_ev(client *cl, uint64_t id, proto_err code, const char *msg, int closing);
void job_cancel(server *s, job *j);
int client_maybe_finish(client *cl);
void client_close_soon(client *cl, const char *why);
job *client_find_job(client *cl, uint64_t req_id);
uid_use *uid_find(server *s, uid_t uid, int create);
void uid_release(server *s, uid_t uid, int clients, int jobs);
int rl_allow(server *s, uid_t uid, rl_kind kind);
proto_err map_eng_err(eng_err c);
int privileged(const server *s, uid_t uid);
uint32_t reserve_slots(const server *s);

/* jobs.c */
void dispatch(client *cl, const proto_req *r);
void handle_event(server *s, const eng_event *ev);
/* logprobs.c: ev's bytes (with_bytes), logprob and alternatives into out
 * (buf: PROTO_MAX_LOGPROBS entries) */
void ev_put_logprobs(eng *e, const eng_event *ev, int with_bytes, proto_ev *out, proto_lp *buf);

#endif
