/* gw.h — what aned-http's two halves share: the options (main.c
 * parses them and listens) and the libmicrohttpd callbacks (aned-http.c
 * serves the requests). */
#ifndef ANE_HTTP_GW_H
#define ANE_HTTP_GW_H

#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>

#include <microhttpd.h>

#define GW_NAME            "aned-http"
#define GW_MAX_CHOICES     16        /* prompts × n per request (≤ PROTO_MAX_INFLIGHT) */
#define GW_MAX_JSON_DEPTH  64
#define GW_DEF_MAX_BODY    (4u << 20)
#define GW_DEF_MAX_HEADER  (32u << 10)
#define GW_DEF_MAX_CONNS   64
#define GW_DEF_IDLE_S      120
#define GW_MAX_ORIGINS     16
#define GW_MAX_HOSTS       16
#define GW_COMPLETIONS_DEF_MAX 16    /* OpenAI's default max_tokens for /v1/completions */
/* Connections past --max-connections are still taken, this many at once, to
 * be answered 503 (beyond that libmicrohttpd closes them unanswered); each
 * has GW_OVER_TIMEOUT_S seconds to send its request. */
#define GW_OVER_CONNS      32
#define GW_OVER_TIMEOUT_S  5

typedef struct gw_opts {
    const char *socket_path;      /* aned's socket; NULL = ane_default_socket() */
    uid_t daemon_uid;             /* a further uid aned may run as (0: none) */
    char listen[512];             /* HOST:PORT or unix:PATH */
    const char *api_key_file;
    char *api_key;                /* NULL: no check */
    size_t api_key_len;
    size_t max_body, max_header;
    unsigned max_conns, idle_s;
    mode_t unix_mode;
    const char *origins[GW_MAX_ORIGINS]; size_t n_origins;
    const char *hosts[GW_MAX_HOSTS]; size_t n_hosts;
    int check_host;               /* listening on TCP loopback: Host must name it */
    int verbose;
} gw_opts;

extern gw_opts G;

void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* aned-http.c: the libmicrohttpd callbacks */
enum MHD_Result gw_on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls);
void gw_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe);
void gw_on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                      enum MHD_ConnectionNotificationCode toe);
void gw_mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#endif
