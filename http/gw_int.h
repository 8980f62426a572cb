/* gw_int.h — what aned-http's request-serving files share: the request
 * and job records, the growing buffer, error answers and the JSON field
 * readers. Private to http/. */
#ifndef ANE_HTTP_GW_INT_H
#define ANE_HTTP_GW_INT_H

#include "client/aneclient.h"
#include "http/gw.h"

#include <stdint.h>
#include <jansson.h>
#include <microhttpd.h>

typedef struct sbuf { char *p; size_t len, cap; int oom; } sbuf;

void sb_free(sbuf *b);
int sb_reserve(sbuf *b, size_t add);
void sb_add(sbuf *b, const char *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_json_str(sbuf *b, const char *s, size_t n);

/* One per HTTP connection (its thread). */
typedef struct gw_conn {
    ane_client *ane;              /* lazily connected; NULL after a failure */
    int fd;                       /* the HTTP socket, watched for the peer leaving */
    int over;                     /* past --max-connections: answered 503, closed */
} gw_conn;

typedef enum route {
    R_NONE = 0, R_HEALTH, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE, R_EMBEDDINGS,
} route;

typedef struct gw_lp gw_lp;
typedef struct job {
    uint64_t id;                  /* daemon request id; 0 = not submitted */
    int index;                    /* OpenAI choice index */
    int prompt_no;                /* which prompt (usage counts each once) */
    sbuf text;
    sbuf calls;                   /* non-streamed: the message's tool_calls entries, JSON */
    sbuf reasoning;               /* non-streamed: the message's reasoning_content */
    int n_calls;
    const char *finish;           /* OpenAI finish_reason once done */
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    int done;
    struct gw_lp *lp;             /* logprobs: entries not yet written (logprobs.c); NULL = none */
    int echo_ids;                 /* echo of a token prompt: its text is its tokens' bytes
                                     (1 while they come, 2 once made whole UTF-8) */
    int echo_wait;                /* streamed echo: its chunk waits for the prompt's tokens */
} job;

typedef struct gw_req {
    route rt;
    /* for the -v access log: one line per request when it ends */
    char method[16], path[160];
    long long t0_ns;
    unsigned status;              /* what was answered; 0 = nothing yet */
    int stream_failed;            /* a stream ended with an error chunk */
    const char *model_id;         /* R_MODEL: the path's id */
    gw_conn *conn;
    struct MHD_Connection *mc;
    sbuf body;
    int too_large;
    const char *origin;           /* allowed Origin to echo, or NULL */
    /* a generation */
    int chat, stream, include_usage, echo;
    char id[40];
    long long created;
    char *model_json;             /* the model name as a JSON string literal */
    job jobs[GW_MAX_CHOICES];
    int n_jobs, n_done;
    int role_sent;
    /* streaming */
    sbuf out;                     /* SSE bytes not yet handed to MHD */
    size_t out_off;
    int finished;                 /* nothing more to produce after out */
    int failed;                   /* end the stream with an error */
} gw_req;

typedef struct job_err { unsigned status; const char *code; const char *param; char msg[600]; } job_err;
typedef struct perr { unsigned status; const char *code; const char *param; char msg[512]; char pbuf[64]; } perr;

static inline int route_is_get(route r) { return r == R_HEALTH || r == R_MODELS || r == R_MODEL; }
long long mono_ns(void);
long long now_s(void);
static inline int present(json_t *v) { return v && !json_is_null(v); }
void make_id(char *out, size_t n, const char *prefix);

/* aned-http.c: the daemon side. conn_ane: connects when needed (-1, err
 * says why); conn_drop: closes (cancels what is in flight there);
 * wait_event: the next event while watching the HTTP peer (1; -1 the
 * daemon failed; -2 the HTTP client left); call_daemon: a one-shot
 * request's terminal event (0, or -1/-2); daemon_failed answers those
 * (-2: nothing), ev_error an error event. */
int conn_ane(gw_conn *c, char *err, size_t errlen);
void conn_drop(gw_conn *c);
int wait_event(gw_req *rq, proto_ev *ev, char *err, size_t errlen);
int call_daemon(gw_req *rq, proto_req *q, proto_ev *ev, char *err, size_t errlen);
/* call_daemon with a request of type t and no fields */
int ask_daemon(gw_req *rq, proto_type t, proto_ev *ev, char *err, size_t errlen);
enum MHD_Result daemon_failed(gw_req *rq, struct MHD_Connection *mc, int rc, const char *err);
enum MHD_Result ev_error(gw_req *rq, struct MHD_Connection *mc, const proto_ev *ev);
/* embeddings.c: POST /v1/embeddings */
enum MHD_Result gw_embeddings(gw_req *rq, struct MHD_Connection *mc, json_t *o);
/* util.c: answers */
void add_common_headers(gw_req *rq, struct MHD_Response *r);
enum MHD_Result send_buf(gw_req *rq, struct MHD_Connection *mc, unsigned status, const char *ctype, const char *data, size_t len);
enum MHD_Result send_json(gw_req *rq, struct MHD_Connection *mc, unsigned status, json_t *j);
/* b's JSON with status 200 (500 when b ran out of memory); frees b */
enum MHD_Result send_sb(gw_req *rq, struct MHD_Connection *mc, sbuf *b);
json_t *error_obj(unsigned status, const char *code, const char *param, const char *msg);
enum MHD_Result send_error(gw_req *rq, struct MHD_Connection *mc, unsigned status, const char *code,
                           const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void err_from_event(route rt, const proto_ev *ev, job_err *je);
/* params.c: request fields; each returns -1 with *e filled on bad input */
int json_too_deep(const char *s, size_t n, int limit);
const char *msg_param(perr *e, size_t i, const char *field);
int pfail(perr *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int unsupported(perr *e, const char *param, const char *why);
int get_int(json_t *o, const char *key, long long lo, long long hi, int *has, long long *out, perr *e);
int get_bool(json_t *o, const char *key, int def, int *out, perr *e);
int parse_sampling(json_t *o, proto_req *q, int chat, int *n_out, perr *e);
#endif
