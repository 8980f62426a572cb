/* t_client.c — libaneclient without a daemon: the default socket rule,
 * connect failures, argument checks. (With a daemon: tests/integration/
 * test_aneclient.py.) */
#include "client/aneclient.h"
#include "tests/check.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static void t_default_socket(void)
{
    char buf[256], want[256];
    const char *old_ane = getenv("ANE_SOCKET");
    const char *old_xdg = getenv("XDG_RUNTIME_DIR");
    char *save_ane = old_ane ? strdup(old_ane) : NULL;
    char *save_xdg = old_xdg ? strdup(old_xdg) : NULL;

    setenv("ANE_SOCKET", "/some/where.sock", 1);
    CHECK(strcmp(ane_default_socket(buf, sizeof buf), "/some/where.sock") == 0);
    CHECK(ane_default_socket(buf, 5) == buf && buf[0] == 0);   /* does not fit */
    CHECK(strcmp(ane_default_socket(NULL, 0), "") == 0);

    setenv("ANE_SOCKET", "", 1);   /* empty counts as unset */
    setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
    struct stat st;
    int system_sock = stat(ANE_SYSTEM_SOCKET, &st) == 0 && S_ISSOCK(st.st_mode);
    ane_default_socket(buf, sizeof buf);
    if (geteuid() == 0 || system_sock) CHECK(strcmp(buf, ANE_SYSTEM_SOCKET) == 0);
    else CHECK(strcmp(buf, "/run/user/4242/aned.sock") == 0);

    unsetenv("ANE_SOCKET");
    setenv("XDG_RUNTIME_DIR", "relative/dir", 1);   /* not absolute: ignored */
    ane_default_socket(buf, sizeof buf);
    snprintf(want, sizeof want, "/tmp/aned-%u.sock", (unsigned)getuid());
    if (geteuid() == 0 || system_sock) CHECK(strcmp(buf, ANE_SYSTEM_SOCKET) == 0);
    else CHECK(strcmp(buf, want) == 0);

    if (save_ane) setenv("ANE_SOCKET", save_ane, 1); else unsetenv("ANE_SOCKET");
    if (save_xdg) setenv("XDG_RUNTIME_DIR", save_xdg, 1); else unsetenv("XDG_RUNTIME_DIR");
    free(save_ane);
    free(save_xdg);
}

static void t_connect_fail(void)
{
    ane_client *c = (ane_client *)1;
    char err[512];
    proto_err refused = PROTO_E_BUSY;
    CHECK_EQ_INT(ane_connect(&c, "/nonexistent/dir/aned.sock", err, sizeof err), -1);
    CHECK(c == NULL);
    CHECKF(strstr(err, "/nonexistent/dir/aned.sock") && strstr(err, "cannot connect"), "%s", err);

    char longp[300];
    memset(longp, 'x', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = 0;
    ane_connect_opts o = { longp, "t", 100, 0 };
    CHECK_EQ_INT(ane_connect_with(&c, &o, &refused, err, sizeof err), -1);
    CHECK_EQ_INT(refused, PROTO_OK);
    CHECKF(strstr(err, "too long") != NULL, "%s", err);

    /* A listening socket that never answers: the handshake times out. */
    char path[108];
    snprintf(path, sizeof path, "/tmp/t_client-%d.sock", (int)getpid());
    unlink(path);
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    CHECK(ls >= 0 && bind(ls, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(ls, 4) == 0);
    ane_connect_opts o2 = { path, NULL, 200, 0 };
    CHECK_EQ_INT(ane_connect_with(&c, &o2, &refused, err, sizeof err), -1);
    CHECKF(strstr(err, "did not answer") != NULL, "%s", err);
    CHECK_EQ_INT(refused, PROTO_OK);
    /* A peer that closes at once: a clear error, not a hang. */
    int pid = fork();
    if (pid == 0) {
        int a = accept(ls, NULL, NULL);
        close(a);
        _exit(0);
    }
    ane_connect_opts o3 = { path, NULL, 5000, 0 };
    CHECK_EQ_INT(ane_connect_with(&c, &o3, &refused, err, sizeof err), -1);
    CHECKF(strstr(err, "closed") != NULL || strstr(err, "handshake") != NULL, "%s", err);
    if (pid > 0) waitpid(pid, NULL, 0);
    close(ls);
    unlink(path);
}

static void t_misc(void)
{
    char err[128];
    ane_close(NULL);
    CHECK_EQ_INT(ane_fd(NULL), -1);
    CHECK_EQ_INT(ane_in_flight(NULL), 0);
    CHECK(strcmp(ane_model_name(NULL), "") == 0);
    CHECK_EQ_INT(ane_submit_ping(NULL, err, sizeof err), 0);
    CHECK_EQ_INT(ane_cancel(NULL, 1, err, sizeof err), -1);
    proto_ev ev;
    CHECK_EQ_INT(ane_next_event(NULL, &ev, 0, err, sizeof err), -1);
    proto_type term[] = { PROTO_T_DONE, PROTO_T_ERROR, PROTO_T_TOKENS, PROTO_T_TEXT, PROTO_T_INFO_OK, PROTO_T_PONG };
    for (size_t i = 0; i < sizeof term / sizeof term[0]; i++) {
        proto_ev_init(&ev, term[i], 1);
        CHECK(ane_event_terminal(&ev));
    }
    proto_ev_init(&ev, PROTO_T_TOKEN, 1);
    CHECK(!ane_event_terminal(&ev));
    proto_ev_init(&ev, PROTO_T_LOGITS, 1);
    CHECK(!ane_event_terminal(&ev));
}


/* A socket made by another user (anyone can, in /tmp) is refused before a
 * byte is sent, unless its uid is named; parse of user names. */
static void t_peer_uid(void)
{
    uid_t u = 1;
    char err[512];
    CHECK(ane_parse_uid("root", &u, err, sizeof err) == 0 && u == 0);
    CHECK(ane_parse_uid("65534", &u, err, sizeof err) == 0 && u == 65534);
    CHECK(ane_parse_uid("no-such-user-here", &u, err, sizeof err) < 0 && strstr(err, "no-such-user-here"));
    CHECK(ane_parse_uid("12x", &u, err, sizeof err) < 0);
    if (geteuid() != 0) { fprintf(stderr, "t_peer_uid: not root, the other-user part is skipped\n"); return; }

    char dir[64], path[128];
    snprintf(dir, sizeof dir, "/tmp/t_client-peer-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/aned.sock", dir);
    CHECK(mkdir(dir, 0700) == 0 && chmod(dir, 01777) == 0);   /* like /tmp */
    int ready[2], got[2];
    CHECK(pipe(ready) == 0 && pipe(got) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        /* the impostor: uid 65534, listens, reports what each connection sent */
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
        int ls = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, path, strlen(path));
        if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 4) != 0) _exit(4);
        chmod(path, 0666);
        if (write(ready[1], "r", 1) != 1) _exit(5);
        for (int k = 0; k < 2; k++) {
            int a = accept(ls, NULL, NULL);
            struct pollfd pf = { a, POLLIN, 0 };
            int n = 0;
            char buf[512];
            if (a >= 0 && poll(&pf, 1, 1500) == 1) {
                ssize_t r = read(a, buf, sizeof buf);
                n = r > 0 ? (int)r : 0;
            }
            if (a >= 0) close(a);
            if (write(got[1], &n, sizeof n) != (ssize_t)sizeof n) _exit(6);
        }
        _exit(0);
    }
    char c;
    CHECK(pid > 0 && read(ready[0], &c, 1) == 1);
    ane_client *cl = NULL;
    int n = -1;
    /* root calling; the peer is 65534: refused, nothing sent */
    ane_connect_opts o = { path, "t", 3000, 0 };
    CHECK_EQ_INT(ane_connect_with(&cl, &o, NULL, err, sizeof err), -1);
    CHECKF(strstr(err, "uid 65534") && strstr(err, "refusing") && strstr(err, "--daemon-user"), "%s", err);
    CHECK(read(got[0], &n, sizeof n) == (ssize_t)sizeof n);
    CHECK_EQ_INT(n, 0);
    /* named: the hello goes out (the impostor then hangs up) */
    o.daemon_uid = 65534;
    CHECK_EQ_INT(ane_connect_with(&cl, &o, NULL, err, sizeof err), -1);
    CHECKF(!strstr(err, "refusing"), "%s", err);
    CHECK(read(got[0], &n, sizeof n) == (ssize_t)sizeof n);
    CHECKF(n > 0, "the named daemon got %d bytes", n);
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "impostor exit %d", st);
    close(ready[0]); close(ready[1]); close(got[0]); close(got[1]);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(t_default_socket);
    RUN(t_connect_fail);
    RUN(t_misc);
    RUN(t_peer_uid);
    return CHECK_DONE();
}
