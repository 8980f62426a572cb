/* sock.c — every rule about the listening socket lives here.
 *
 * Start-up on a path: the path must fit sun_path; "<path>.lock" is flocked so
 * two daemons racing for one path cannot both pass the stale check; an
 * existing socket file is probed with connect(): nobody answering means a
 * crashed daemon left it (removed), somebody answering means another server
 * owns it (refused). A path that is not a socket is never removed.
 *
 * Mode and group without a race: the socket is bound inside a fresh private
 * directory (0700, the daemon's own) next to the path, given its group and
 * mode there by name with nothing else able to reach that name, and only then
 * renamed onto the path (never replacing anything). chown/chmod on the public
 * path would follow a symlink swapped in after bind() — as root, onto any
 * file — and fchmod/fchown on a socket descriptor do not reach the file. */
#include "daemon/aned.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int sock_default_path(char *buf, size_t size, char *err, size_t errlen)
{
    /* libaneclient's ane_default_socket() rule, seen from the server: root
     * serves the system socket; other users their runtime dir, else /tmp.
     * (Clients also pick the system socket when it exists; a user's daemon
     * never takes it over.) */
    const char *env = getenv("ANE_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env && *env) n = snprintf(buf, size, "%s", env);
    else if (geteuid() == 0) {
        n = snprintf(buf, size, "%s", ANED_SYSTEM_SOCKET);
        if (mkdir(ANED_SYSTEM_DIR, 0755) < 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot create %s: %s", ANED_SYSTEM_DIR, strerror(errno));
            return -1;
        }
    } else if (xdg && xdg[0] == '/') n = snprintf(buf, size, "%s/aned.sock", xdg);
    else n = snprintf(buf, size, "/tmp/aned-%lu.sock", (unsigned long)getuid());
    if (n < 0 || (size_t)n >= size) {
        snprintf(err, errlen, "socket path too long (max %zu bytes)", size - 1);
        return -1;
    }
    return 0;
}

static int path_fits(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    size_t n = strlen(path);
    if (n == 0) { snprintf(err, errlen, "empty socket path"); return -1; }
    if (n >= sizeof sa.sun_path) {
        snprintf(err, errlen, "socket path too long (%zu bytes, max %zu): %s",
                 n, sizeof sa.sun_path - 1, path);
        return -1;
    }
    return 0;
}

static void fill_addr(struct sockaddr_un *sa, const char *path)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path, path, strlen(path) + 1);
}

/* 1: a server answers on path; 0: nothing there (or removed a stale socket); -1 error. */
static int clear_stale(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket; refusing to replace it", path);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) { snprintf(err, errlen, "socket: %s", strerror(errno)); return -1; }
    struct sockaddr_un sa;
    fill_addr(&sa, path);
    int rc;
    do rc = connect(fd, (struct sockaddr *)&sa, sizeof sa); while (rc < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (rc == 0 || e == EAGAIN || e == EINPROGRESS) {
        snprintf(err, errlen, "another server is already listening on %s", path);
        return 1;
    }
    if (e == ECONNREFUSED) {
        if (unlink(path) < 0 && errno != ENOENT) {
            snprintf(err, errlen, "cannot remove stale socket %s: %s", path, strerror(errno));
            return -1;
        }
        log_warn("removed stale socket %s (no server answered)", path);
        return 0;
    }
    if (e == ENOENT) return 0;
    snprintf(err, errlen, "cannot probe existing socket %s: %s", path, strerror(e));
    return -1;
}

static int take_lock(sock_listener *l, char *err, size_t errlen)
{
    char lp[sizeof l->path + 8];
    snprintf(lp, sizeof lp, "%s.lock", l->path);
    char e2[512];
    int fd = file_open_regular(AT_FDCWD, lp, lp, O_RDWR | O_CREAT, 0600, e2, sizeof e2);
    if (fd < 0) {
        snprintf(err, errlen, "lock file: %s", e2);
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK)
            snprintf(err, errlen, "another aned is already serving %s (lock %s is held)",
                     l->path, lp);
        else
            snprintf(err, errlen, "cannot lock %s: %s", lp, strerror(e));
        return -1;
    }
    l->lock_fd = fd;
    return 0;
}

static void drop_lock(sock_listener *l)
{
    if (l->lock_fd < 0) return;
    /* Unlinked while still held: a racing starter either holds the old inode
     * (and then meets our socket or EADDRINUSE) or creates a fresh lock. */
    char lp[sizeof l->path + 8];
    snprintf(lp, sizeof lp, "%s.lock", l->path);
    unlink(lp);
    close(l->lock_fd);
    l->lock_fd = -1;
}

/* Binds fd as "s" in a new private directory of pdir, gives it gid and mode
 * there, listens, and renames it onto base. Fills l->dev/ino. */
static int bind_private(sock_listener *l, int pdir, const char *base, unsigned mode, gid_t gid,
                        int backlog, char *err, size_t errlen)
{
    char name[32];
    int made = 0;
    for (int tries = 0; tries < 64 && !made; tries++) {
        unsigned r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (unsigned)getpid() * 2654435761u + (unsigned)tries;
        snprintf(name, sizeof name, ".aned-bind.%08x", r);
        if (mkdirat(pdir, name, 0700) == 0) made = 1;
        else if (errno != EEXIST) {
            snprintf(err, errlen, "cannot create a private directory next to %s: %s", l->path, strerror(errno));
            return -1;
        }
    }
    if (!made) { snprintf(err, errlen, "cannot create a private directory next to %s", l->path); return -1; }
    int rc = -1, cwd = -1, bound = 0;
    int priv = openat(pdir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (priv < 0 || fstat(priv, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
        snprintf(err, errlen, "private directory %s next to %s was replaced while binding", name, l->path);
        goto out;
    }
    cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0 || fchdir(priv) < 0) {
        snprintf(err, errlen, "cannot enter the private directory next to %s: %s", l->path, strerror(errno));
        goto out;
    }
    struct sockaddr_un sa;
    fill_addr(&sa, "s");
    mode_t old = umask((mode_t)(~mode & 0777)); /* never wider than asked, even here */
    int b = bind(l->fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    umask(old);
    if (fchdir(cwd) < 0) {
        snprintf(err, errlen, "cannot return to the working directory: %s", strerror(errno));
        bound = b == 0;
        goto out;
    }
    if (b < 0) { snprintf(err, errlen, "cannot bind %s: %s", l->path, strerror(e)); goto out; }
    bound = 1;
    /* Only the daemon's user can reach these names: no link can be swapped in. */
    if (gid != (gid_t)-1 && fchownat(priv, "s", (uid_t)-1, gid, AT_SYMLINK_NOFOLLOW) < 0) {
        snprintf(err, errlen, "cannot give %s to group %lu: %s", l->path, (unsigned long)gid, strerror(errno));
        goto out;
    }
    if (fchmodat(priv, "s", mode, 0) < 0) {
        snprintf(err, errlen, "cannot chmod %s to %03o: %s", l->path, mode, strerror(errno));
        goto out;
    }
    if (fstatat(priv, "s", &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "cannot stat the new socket for %s", l->path);
        goto out;
    }
    if (listen(l->fd, backlog) < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", l->path, strerror(errno));
        goto out;
    }
    /* Published last, whole; never over something that appeared meanwhile. */
    int r = renameat2(priv, "s", pdir, base, RENAME_NOREPLACE);
    if (r < 0 && (errno == EINVAL || errno == ENOSYS)) { /* no RENAME_NOREPLACE here: link refuses to replace too */
        r = linkat(priv, "s", pdir, base, 0);
        if (r == 0) unlinkat(priv, "s", 0);
    }
    if (r < 0) {
        if (errno == EEXIST)
            snprintf(err, errlen, "%s appeared while the socket was being bound; refusing to replace it", l->path);
        else
            snprintf(err, errlen, "cannot move the socket to %s: %s", l->path, strerror(errno));
        goto out;
    }
    bound = 0;
    l->dev = st.st_dev;
    l->ino = st.st_ino;
    rc = 0;
out:
    if (bound && priv >= 0) unlinkat(priv, "s", 0);
    if (unlinkat(pdir, name, AT_REMOVEDIR) < 0 && rc == 0)
        log_warn("cannot remove the private directory %s next to %s: %s", name, l->path, strerror(errno));
    if (priv >= 0) close(priv);
    if (cwd >= 0) close(cwd);
    return rc;
}

int sock_listen(sock_listener *l, const char *path, unsigned mode, gid_t gid, int backlog,
                char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->lock_fd = -1;
    if (path_fits(path, err, errlen) < 0) return -1;
    memcpy(l->path, path, strlen(path) + 1);
    if (take_lock(l, err, errlen) < 0) return -1;
    if (clear_stale(path, err, errlen) != 0) goto fail;

    char dir[sizeof l->path];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (!*base) { snprintf(err, errlen, "socket path %s names a directory", path); goto fail; }
    int pdir = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (pdir < 0) {
        snprintf(err, errlen, "cannot open directory %s of socket %s: %s", dir, path, strerror(errno));
        goto fail;
    }
    l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0) { snprintf(err, errlen, "socket: %s", strerror(errno)); close(pdir); goto fail; }
    int rc = bind_private(l, pdir, base, mode & 0777, gid, backlog, err, errlen);
    close(pdir);
    if (rc < 0) goto fail_fd;
    return 0;
fail_fd:
    close(l->fd);
    l->fd = -1;
fail:
    drop_lock(l);
    return -1;
}

int sock_listen_activated(sock_listener *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->lock_fd = -1;
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    if (!pid || !fds || strtol(pid, NULL, 10) != (long)getpid()) return 0;
    long n = strtol(fds, NULL, 10);
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (n < 1) return 0;
    if (n > 1) log_warn("systemd passed %ld sockets; serving the first only", n);
    int fd = 3; /* SD_LISTEN_FDS_START */
    int type = 0, acc = 0;
    socklen_t sl = sizeof type;
    struct sockaddr_un sa;
    socklen_t al = sizeof sa;
    memset(&sa, 0, sizeof sa);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &sl) < 0 || type != SOCK_STREAM ||
        (sl = sizeof acc, getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl)) < 0 || !acc ||
        getsockname(fd, (struct sockaddr *)&sa, &al) < 0 || sa.sun_family != AF_UNIX) {
        snprintf(err, errlen, "socket passed by systemd (fd 3) is not a listening Unix stream socket");
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        snprintf(err, errlen, "fcntl on the systemd socket: %s", strerror(errno));
        return -1;
    }
    l->fd = fd;
    l->activated = 1;
    snprintf(l->path, sizeof l->path, "%.*s", (int)sizeof sa.sun_path - 1, sa.sun_path);
    return 1;
}

void sock_close(sock_listener *l)
{
    if (!l) return;
    if (l->fd >= 0) {
        close(l->fd);
        l->fd = -1;
        struct stat st;
        if (!l->activated && l->path[0] && lstat(l->path, &st) == 0 &&
            st.st_dev == l->dev && st.st_ino == l->ino)
            unlink(l->path);
    }
    drop_lock(l);
}

int sock_accept(int lfd, sock_peer *peer)
{
    int fd;
    do fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return -1;
    struct ucred uc;
    socklen_t len = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    peer->uid = uc.uid;
    peer->gid = uc.gid;
    peer->pid = uc.pid;
    return fd;
}
