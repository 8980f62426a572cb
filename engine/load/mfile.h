/* mfile.h — the files a model is read from (engine-internal).
 *
 * mf_open opens a file for reading without ever blocking: O_NONBLOCK while
 * opening (a FIFO with no writer would block open() for good), then fstat,
 * and anything but a regular file (FIFO, directory, device, socket) is
 * refused with its kind named. Always O_CLOEXEC.
 *
 * mf_map maps a model file read-only and watches it. Users replace model
 * files in place while the daemon runs (cp new.gguf model.gguf truncates,
 * then writes): the mapping then shows the new bytes, and a read of a page
 * past the new end raises SIGBUS. The handler installed here answers a
 * SIGBUS whose address lies inside a watched mapping by putting zero pages
 * over that whole mapping, so the faulting thread carries on, and marks the
 * file hit; any other SIGBUS goes to the handler that was there before, or
 * takes the default action. mf_check then compares the file with what was
 * mapped (the handler's mark, size and mtime through the descriptor kept
 * open, the inode the path names now), and the engine ends the jobs that
 * used the weights. */
#ifndef ANE_MFILE_H
#define ANE_MFILE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

/* The descriptor (>= 0) of the regular file at path, opened read-only and
 * blocking again; its fstat in *st. -1 with a message naming path. */
int mf_open(const char *path, struct stat *st, char *err, size_t errlen);

/* The whole regular file at path (at most max bytes) into a malloc'd,
 * NUL-terminated *buf. 0 ok; 1 when optional and the file does not exist
 * (*buf NULL); -1 with a message naming path. */
int mf_read(const char *path, size_t max, int optional, char **buf, size_t *len, char *err, size_t errlen);

typedef struct mf_map {
    const uint8_t *map;
    size_t size;
    int fd;                  /* kept open: fstat sees the mapped file itself */
    int slot;                /* in the SIGBUS handler's table; -1 none */
    dev_t dev;
    ino_t ino;
    struct timespec mtime;
    char *path;
    atomic_llong path_due;   /* the path is looked up again from then on (ms) */
} mf_map;

/* Maps fd (from mf_open, st its fstat, st->st_size > 0) read-only and
 * watches it; takes fd in every case. 0 ok, -1 with a message. */
int mf_map_fd(mf_map *m, int fd, const struct stat *st, const char *path, char *err, size_t errlen);
/* Unmaps and closes; a zeroed or already unmapped mf_map is fine. */
void mf_unmap(mf_map *m);

enum {
    MF_SAME = 0,      /* the file is as it was mapped */
    MF_CHANGED,       /* its bytes changed (or a read faulted): the mapping no longer holds what was loaded */
    MF_REPLACED,      /* the path names another file now, or none; the mapped one is unchanged */
};
/* One of the above; for the last two a line saying what happened in why.
 * Costs an fstat and a stat; quick: the path's stat (for MF_REPLACED, which
 * is only told) at most once a second. */
int mf_check(mf_map *m, int quick, char *why, size_t n);

#endif
