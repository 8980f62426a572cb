/* aned.h — the daemon's internal interfaces (daemon/ only).
 *
 *   log.c     timestamped, levelled log lines to stderr or a file
 *   sock.c    the listening socket: path rules, stale sockets, modes, lock
 *   server.c  the event loop: clients, requests, engine events, shutdown
 *   aned.c    main: options, daemonizing, pidfile
 *
 * Conventions: 0 ok, -1 error; messages through (char *err, size_t errlen). */
#ifndef ANED_H
#define ANED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine/engine.h"

#define ANED_SERVER_NAME "aned/0.1"

/* ---- log.c ---- */
typedef enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG } log_level;

/* Lines go to stderr until log_open_file() succeeds. */
int log_open_file(const char *path, char *err, size_t errlen);
/* Reopens the file given to log_open_file (log rotation, SIGHUP). */
int log_reopen(void);
/* Points stderr at the log file, now and after each reopen (so whatever a
 * library prints lands there too). */
int log_capture_stderr(void);
void log_set_level(log_level lv);
int log_level_parse(const char *s, log_level *lv);
void log_close(void);
void log_msg(log_level lv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* ---- sock.c ---- */
#define ANED_SYSTEM_DIR    "/run/aned"
#define ANED_SYSTEM_SOCKET "/run/aned/aned.sock" /* = libaneclient's ANE_SYSTEM_SOCKET */

/* The default socket path: $ANE_SOCKET; else the system socket for root
 * (creating /run/aned); else $XDG_RUNTIME_DIR/aned.sock; else
 * /tmp/aned-$UID.sock. Written to buf (NUL-terminated). */
int sock_default_path(char *buf, size_t size, char *err, size_t errlen);

typedef struct sock_listener {
    int fd;             /* listening, non-blocking, close-on-exec */
    int lock_fd;        /* flock on "<path>.lock" held for the daemon's life; -1 if none */
    int activated;      /* 1: fd came from systemd (LISTEN_FDS); path is not ours to remove */
    char path[108];     /* sizeof sockaddr_un.sun_path */
    dev_t dev; ino_t ino; /* the socket file we created: removed only if still ours */
} sock_listener;

/* Binds and listens on path with the given mode (e.g. 0660) and group
 * ((gid_t)-1: the daemon's). A socket file nobody answers on is removed
 * first; a live one, or a path that is not a socket, is refused with a
 * message saying so. */
int sock_listen(sock_listener *l, const char *path, unsigned mode, gid_t gid, int backlog,
                char *err, size_t errlen);
/* Takes a socket passed by systemd (LISTEN_PID/LISTEN_FDS): 1 taken, 0 none
 * passed, -1 error. */
int sock_listen_activated(sock_listener *l, char *err, size_t errlen);
/* Closes the listener; removes the socket file (unless activated) and the lock. */
void sock_close(sock_listener *l);

typedef struct sock_peer { uid_t uid; gid_t gid; pid_t pid; } sock_peer;
/* Accepts one connection, non-blocking and close-on-exec, with its peer
 * credentials (SO_PEERCRED). Returns the fd, or -1 with errno set. */
int sock_accept(int lfd, sock_peer *peer);

/* ---- server.c ---- */
typedef struct server server;

typedef struct server_opts {
    eng_opts eng;            /* notify/notify_arg are set by server_open */
    int max_clients;         /* connections served at once; past it: "busy", closed */
    size_t out_pause;        /* pause a client's reading and jobs while its backlog is over this */
    size_t out_max;          /* cancel a client's jobs when its backlog passes this */
    double stall_timeout;    /* seconds a client may stay paused before its jobs are cancelled */
    double handshake_timeout; /* seconds a new connection has to send hello */
    double shutdown_grace;   /* seconds running jobs may finish after SIGTERM */
    double drain_timeout;    /* seconds to flush replies after the last job ended */
} server_opts;

void server_opts_default(server_opts *o);

/* Creates the loop and loads the model (errors name the file). */
int server_open(server **out, const server_opts *opt, char *err, size_t errlen);
/* Serves on the listener until SIGTERM/SIGINT and a clean drain. The listener
 * is closed (and its socket removed) as soon as shutdown begins. 0 ok. */
int server_run(server *s, sock_listener *l);
void server_close(server *s);
const eng_model_info *server_model(const server *s);

#endif
