/* log.c — one line per message: "2026-01-31T12:00:00.123Z aned[123] info: ...".
 * Lines are written with one write(2) each so that concurrent writers (the
 * engine's thread may log too, through stderr) never interleave mid-line. */
#include "daemon/aned.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int log_fd = 2;
static char *log_path;
static log_level log_max = LOG_INFO;
static int log_on_stderr;  /* stderr follows the log file (detached daemon) */
static int log_dirfd = -1; /* the log file's directory: reopened relative to it */
static const char *log_base;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

int log_level_parse(const char *s, log_level *lv)
{
    for (int i = 0; i <= LOG_DEBUG; i++)
        if (strcasecmp(s, level_names[i]) == 0) { *lv = (log_level)i; return 0; }
    return -1;
}

void log_set_level(log_level lv) { log_max = lv; }

/* What a file aned opens must be: reached without following a link in its
 * last component, never blocking (a FIFO would hang start-up, or the loop on
 * SIGHUP), a regular file, and for root never a file with other names (a
 * hard link to somebody else's file would be written, or given away). */
int file_open_regular(int dirfd, const char *name, const char *shown, int flags, mode_t mode,
                      char *err, size_t errlen)
{
    int fd = openat(dirfd, name, flags | FILE_OPEN_SAFE, mode);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            snprintf(err, errlen, "%s is a symbolic link; refusing to follow it", shown);
        else if (e == ENXIO)
            snprintf(err, errlen, "%s is a FIFO or socket, not a regular file", shown);
        else
            snprintf(err, errlen, "cannot open %s: %s", shown, strerror(e));
        errno = e;
        return -1;
    }
    struct stat st;
    const char *what = NULL;
    if (fstat(fd, &st) < 0) what = "unreadable (fstat failed)";
    else if (S_ISFIFO(st.st_mode)) what = "a FIFO, not a regular file";
    else if (S_ISSOCK(st.st_mode)) what = "a socket, not a regular file";
    else if (S_ISDIR(st.st_mode)) what = "a directory, not a regular file";
    else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) what = "a device, not a regular file";
    else if (!S_ISREG(st.st_mode)) what = "not a regular file";
    else if (st.st_nlink > 1 && geteuid() == 0) what = "a file with more than one hard link; refusing it as root";
    if (what) {
        snprintf(err, errlen, "%s is %s", shown, what);
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

static int open_log(int dirfd, const char *base, const char *shown, char *err, size_t errlen)
{
    return file_open_regular(dirfd, base, shown, LOG_OPEN_FLAGS, 0640, err, errlen);
}

int log_open_file(const char *path, char *err, size_t errlen)
{
    char *p = strdup(path);
    if (!p) { snprintf(err, errlen, "out of memory"); return -1; }
    /* The directory stays open: the file is (re)opened relative to it, so a
     * directory renamed or swapped later changes nothing, and the seccomp
     * filter can allow openat on this descriptor alone. */
    char *slash = strrchr(p, '/');
    int dfd;
    if (slash == p) dfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    else if (slash) { *slash = 0; dfd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC); *slash = '/'; }
    else dfd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        snprintf(err, errlen, "cannot open the directory of log file %s: %s", path, strerror(errno));
        free(p);
        return -1;
    }
    const char *base = slash ? slash + 1 : p;
    char e2[512];
    int fd = open_log(dfd, base, path, e2, sizeof e2);
    if (fd < 0) {
        snprintf(err, errlen, "log file: %s", e2);
        close(dfd);
        free(p);
        return -1;
    }
    if (log_fd > 2) close(log_fd);
    if (log_dirfd >= 0) close(log_dirfd);
    free(log_path);
    log_fd = fd;
    log_path = p;
    log_dirfd = dfd;
    log_base = base;
    return 0;
}

int log_dir_fd(void) { return log_dirfd; }

int log_chown(uid_t uid, gid_t gid)
{
    /* By descriptor, never by path: the file checked at open is the one given. */
    return log_fd > 2 ? fchown(log_fd, uid, gid) : 0;
}

int log_reopen(void)
{
    if (!log_path) return 0;
    char err[600];
    int fd = open_log(log_dirfd, log_base, log_path, err, sizeof err);
    if (fd < 0) {
        int e = errno;
        log_error("cannot reopen the log file: %s (still writing to the file open before)", err);
        errno = e;
        return -1;
    }
    int old = log_fd;
    log_fd = fd;
    if (old > 2) close(old);
    if (log_on_stderr) dup2(log_fd, 2);
    return 0;
}

int log_capture_stderr(void)
{
    if (log_fd <= 2) return -1;
    if (dup2(log_fd, 2) < 0) return -1;
    log_on_stderr = 1;
    return 0;
}

void log_close(void)
{
    if (log_fd > 2) close(log_fd);
    log_fd = 2;
    if (log_dirfd >= 0) close(log_dirfd);
    log_dirfd = -1;
    free(log_path);
    log_path = NULL;
    log_base = NULL;
}

void log_msg(log_level lv, const char *fmt, ...)
{
    if (lv > log_max) return;
    int saved = errno;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    int k = snprintf(line + n, sizeof line - n, ".%03ldZ aned[%ld] %s: ",
                     ts.tv_nsec / 1000000, (long)getpid(), level_names[lv]);
    if (k > 0) n += (size_t)k;
    va_list ap;
    va_start(ap, fmt);
    k = vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    if (k > 0) n += (size_t)k;
    if (n > sizeof line - 2) n = sizeof line - 2;
    /* Control characters from peers (names, messages) must not forge lines. */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)line[i] < 0x20 && line[i] != '\t') line[i] = '?';
    line[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t w = write(log_fd, line + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    errno = saved;
}
