/* aneclient.h — libaneclient: talk to aned from C.
 *
 *   ane_client *c;
 *   char err[256];
 *   if (ane_connect(&c, NULL, err, sizeof err) < 0) { fprintf(stderr, "%s\n", err); ... }
 *   proto_req q;
 *   proto_req_init(&q, PROTO_T_GENERATE, 0);
 *   q.text = "Once upon a time"; q.text_len = 16;
 *   uint64_t id = ane_submit(c, &q, err, sizeof err);
 *   proto_ev ev;
 *   while (ane_next_event(c, &ev, -1, err, sizeof err) == 1) {
 *       if (ev.type == PROTO_T_TOKEN) fwrite(ev.text, 1, ev.text_len, stdout);
 *       if (ev.id == id && ane_event_terminal(&ev)) break;
 *   }
 *   ane_close(c);
 *
 * One ane_client is one connection; use it from one thread at a time.
 * Several requests may be in flight on it; their events interleave and carry
 * the request id. Events borrow their strings from the client and stay valid
 * until the next ane_next_event/ane_run call. SIGPIPE is never raised.
 * Sending reads incoming events into the client's buffer while it waits,
 * so keep taking events: with about 1 MiB of them unread a send may wait
 * for the daemon.
 *
 * Conventions: 0 ok, -1 error; messages through (char *err, size_t errlen). */
#ifndef ANE_CLIENT_H
#define ANE_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/proto.h"

#define ANE_SYSTEM_SOCKET "/run/aned/aned.sock"
/* The release: aneclient, aned-http and aned (its hello's "aned/0.1.0") share it. */
#define ANE_VERSION "0.1.0"

typedef struct ane_client ane_client;

/* The socket path used when none is given, the same rule as aned's:
 *   1. $ANE_SOCKET when set and not empty;
 *   2. /run/aned/aned.sock when running as root, or when that socket exists;
 *   3. $XDG_RUNTIME_DIR/aned.sock when XDG_RUNTIME_DIR is set (absolute);
 *   4. /tmp/aned-UID.sock.
 * Writes into buf (n bytes) and returns buf; "" if it does not fit. */
const char *ane_default_socket(char *buf, size_t n);

typedef struct ane_connect_opts {
    const char *socket_path;  /* NULL: ane_default_socket() */
    const char *client_name;  /* sent in hello; NULL: the program's name */
    int timeout_ms;           /* for connect + handshake; 0 = 10000, -1 = none */
    uid_t daemon_uid;         /* a further user the daemon may run as; 0: none */
} ane_connect_opts;

/* Whom the daemon may be. Anyone can make a socket in a shared directory
 * (/tmp), so before sending a byte the connection's peer credentials
 * (SO_PEERCRED: whoever created the listening socket) are checked: the
 * daemon must run as root, as the caller (its real or effective uid) or as
 * opts.daemon_uid. Otherwise the connection fails with a message that names
 * the uid found. (A systemd socket, or aned started as root with --user,
 * shows as root.) */

/* Looks up a user name or a decimal uid for daemon_uid. 0 ok, -1 (err). */
int ane_parse_uid(const char *name, uid_t *out, char *err, size_t errlen);

/* Connects and performs the hello handshake. */
int ane_connect(ane_client **out, const char *socket_path, char *err, size_t errlen);
/* The same with options. When the daemon answered the hello with an error
 * (denied, busy, version, shutting_down), *refused receives its code; it is
 * PROTO_OK for transport failures (no daemon, timeout). refused may be NULL. */
int ane_connect_with(ane_client **out, const ane_connect_opts *o, proto_err *refused,
                     char *err, size_t errlen);
/* Closes the connection; requests still in flight end with it. NULL is fine. */
void ane_close(ane_client *c);

/* The daemon's hello: its protocol version, server string and model name. */
uint32_t ane_server_version(const ane_client *c);
const char *ane_server_name(const ane_client *c);
const char *ane_model_name(const ane_client *c);

/* Sends a request. The library picks its id (req->id is overwritten) and
 * returns it (ids are > 0), or 0 on error (err says why; -1 style failures
 * leave the connection unusable only when the send itself failed). */
uint64_t ane_submit(ane_client *c, proto_req *req, char *err, size_t errlen);

/* Shorthands for ane_submit with the protocol defaults. */
uint64_t ane_submit_generate(ane_client *c, const char *prompt, int32_t max_tokens, char *err, size_t errlen);
uint64_t ane_submit_eval(ane_client *c, const char *prompt, int32_t top, char *err, size_t errlen);
/* A whole conversation (roles "system", "user", "assistant"), rendered with
 * the model's chat template; the reply is the assistant's next turn. */
uint64_t ane_submit_chat(ane_client *c, const proto_msg *msgs, size_t n, int32_t max_tokens,
                         char *err, size_t errlen);
uint64_t ane_submit_tokenize(ane_client *c, const char *text, size_t len, int add_bos, int special,
                             char *err, size_t errlen);
uint64_t ane_submit_detokenize(ane_client *c, const int32_t *ids, size_t n, char *err, size_t errlen);
uint64_t ane_submit_info(ane_client *c, char *err, size_t errlen);
uint64_t ane_submit_ping(ane_client *c, char *err, size_t errlen);

/* Asks the daemon to stop request id. Its terminal event is then done with
 * finish "cancelled" (or its normal end if it finished first). Cancelling an
 * id that is not in flight is harmless. */
int ane_cancel(ane_client *c, uint64_t id, char *err, size_t errlen);

/* Waits for the next event:
 *   1  *ev holds it (valid until the next call);
 *   0  nothing within timeout_ms (-1 = wait forever, 0 = do not wait), or a
 *      signal interrupted the wait (check your flags and call again);
 *  -1  the connection failed or the daemon closed it (err says which).
 * An error event with id 0 concerns the connection itself (malformed,
 * too_large, too_deep, ...); the daemon closes the connection after it. */
int ane_next_event(ane_client *c, proto_ev *ev, int timeout_ms, char *err, size_t errlen);

/* 1 when ev is the last event of its request: done, error, tokens, text,
 * info, pong (and hello). token and logits are followed by more. */
int ane_event_terminal(const proto_ev *ev);

/* Calls cb for every event that arrives (any request's) until request id
 * has had its terminal event. cb returns 0 to go on; anything else stops the
 * loop and is returned. Returns 0 after the terminal event, -1 on a
 * connection failure. A signal does not stop it unless cb says so: pass a
 * timeout_ms > 0 to have cb called with ev == NULL at least that often. */
typedef int (*ane_event_cb)(const proto_ev *ev, void *arg);
int ane_run(ane_client *c, uint64_t id, ane_event_cb cb, void *arg, int timeout_ms,
            char *err, size_t errlen);

/* The socket, for callers that poll themselves: when it is readable, call
 * ane_next_event(c, &ev, 0, ...) until it returns 0. Do not read from it or
 * change its flags. */
int ane_fd(const ane_client *c);

/* Requests sent and not yet ended (terminal event not yet returned). */
size_t ane_in_flight(const ane_client *c);

#endif
