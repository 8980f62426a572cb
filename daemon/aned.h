/* aned.h — the daemon's internal interfaces (daemon/ only).
 *
 *   log.c     timestamped, levelled log lines to stderr or a file
 *   sock.c    the listening socket: path rules, stale sockets, modes, lock
 *   server.c  the event loop: clients, requests, engine events, shutdown
 *   privsep.c dropping root, the seccomp filter, the peer allow-list, sd_notify
 *   aned.c    main: options, daemonizing, pidfile
 *
 * Conventions: 0 ok, -1 error; messages through (char *err, size_t errlen). */
#ifndef ANED_H
#define ANED_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine/engine.h"

#define ANED_SERVER_NAME "aned/0.1.0"

/* ---- log.c ---- */
typedef enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG } log_level;

/* Every file aned opens by name (log, pidfile, lock) is opened with these
 * added: no link followed in the last component, no blocking on a FIFO. */
#define FILE_OPEN_SAFE (O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
/* openat(dirfd, name, flags | FILE_OPEN_SAFE, mode), then refuses anything
 * but a regular file (and, for root, one with other hard links), with a
 * message naming shown and what it is instead. Returns the fd, or -1. */
int file_open_regular(int dirfd, const char *name, const char *shown, int flags, mode_t mode,
                      char *err, size_t errlen);
/* How the log file is opened, at start and on SIGHUP (the seccomp filter
 * allows openat with exactly these flags on log_dir_fd() alone). */
#define LOG_OPEN_FLAGS (O_WRONLY | O_CREAT | O_APPEND | FILE_OPEN_SAFE)

/* Lines go to stderr until log_open_file() succeeds. */
int log_open_file(const char *path, char *err, size_t errlen);
/* Reopens the file given to log_open_file (log rotation, SIGHUP), relative
 * to its directory; on failure logs why (file, reason), keeps the old one. */
int log_reopen(void);
/* The log file's directory (O_PATH), which log_reopen opens relative to; -1 if none. */
int log_dir_fd(void);
/* Gives the open log file to uid:gid (before dropping root, so that the
 * daemon can still reopen it on SIGHUP). */
int log_chown(uid_t uid, gid_t gid);
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

/* ---- privsep.c ---- */
/* Sanitizer builds (tests only): their runtimes' leak check stops the world
 * with clone + ptrace, so the seccomp filter is off by default there and the
 * process stays dumpable after the drop. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ANED_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ANED_SANITIZED 1
#endif
#endif
#ifndef ANED_SANITIZED
#define ANED_SANITIZED 0
#endif

#define PRIV_MAX_GROUPS 64
typedef struct priv_user {
    uid_t uid;
    gid_t gid;
    gid_t groups[PRIV_MAX_GROUPS]; /* supplementary groups to keep */
    int n_groups;
    char name[64];
} priv_user;

/* Resolves --user (name or uid; root refused) and --group (name or gid;
 * given: no supplementary groups; absent: the user's primary group and its
 * getgrouplist). */
int priv_user_lookup(priv_user *u, const char *user, const char *group, char *err, size_t errlen);
/* setgroups, setresgid, setresuid (every thread, via glibc), then checks that
 * root cannot be regained and that every thread has the new ids; makes the
 * process non-dumpable. */
int priv_drop(const priv_user *u, char *err, size_t errlen);
/* PR_SET_NO_NEW_PRIVS on the calling thread (and threads it creates later). */
int priv_no_new_privs(void);

typedef enum priv_seccomp_mode {
    PRIV_SECCOMP_AUTO = 0, /* resolved by main: enforce on the cpu backend, else off */
    PRIV_SECCOMP_OFF,
    PRIV_SECCOMP_LOG,      /* unlisted calls allowed, logged by the kernel */
    PRIV_SECCOMP_ENFORCE,  /* unlisted calls fail with EPERM */
} priv_seccomp_mode;
int priv_seccomp_parse(const char *s, priv_seccomp_mode *m);
/* Installs the allow-list on every thread (TSYNC). openat is allowed only
 * with open_dirfd as its directory and LOG_OPEN_FLAGS as its flags (-1:
 * never): the filter cannot see the path, so alone it still lets an absolute
 * or "../" name through for writing; Landlock confines the path. */
int priv_seccomp_install(priv_seccomp_mode mode, int open_dirfd, char *err, size_t errlen);

/* Landlock on every thread of the process (each restricts itself, woken by a
 * signal; threads created later inherit it): from now on no file may be
 * read, executed or listed through a new open; files may only be created or
 * written in log_file's directory and removed in the directories of the
 * paths in remove (socket, lock, pidfile). *n_threads: threads confined.
 * Returns the Landlock ABI used, 0 when the kernel has none, -1 error. */
int priv_landlock(const char *log_file, const char *const *remove, int n_remove, int *n_threads,
                  char *err, size_t errlen);

/* Who may connect: a peer is allowed if its uid is listed, or its gid or one
 * of its supplementary groups (SO_PEERGROUPS) is. */
typedef struct acl {
    unsigned *uids; size_t n_uids;
    unsigned *gids; size_t n_gids;
} acl;
int acl_add_user(acl *a, const char *user, char *err, size_t errlen); /* name or uid */
int acl_add_group(acl *a, const char *group, char *err, size_t errlen); /* name or gid */
int acl_add_uid(acl *a, uid_t uid);
/* 1 allowed, 0 not; fd is the accepted connection. */
int acl_allows(const acl *a, int fd, const sock_peer *p);
void acl_free(acl *a);

/* systemd readiness (sd_notify protocol): notify_open reads NOTIFY_SOCKET
 * (1 opened, 0 none, -1 bad); notify_send sends one datagram such as
 * "READY=1" (no-op without a socket). */
int notify_open(void);
void notify_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void notify_close(void);

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
    const acl *allow;        /* who may connect; NULL: anyone the socket mode lets in */
    int max_jobs_per_uid;    /* jobs in flight + queued per peer uid, all its connections; 0: no limit */
    int max_clients_per_uid; /* connections per peer uid but daemon_uid; 0: no limit */
    double idle_timeout;     /* seconds a connection with nothing in flight may stay silent; 0: forever */
    uid_t daemon_uid;        /* the daemon's own user: with root, may use the slots kept in reserve */
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
