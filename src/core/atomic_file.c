/*
 * atomic_file.c — an output file written under a unique temporary name beside its destination
 * (O_CREAT|O_EXCL, mode 0666 under the umask) and renamed into place, so that a failure never leaves a
 * partial file at the destination nor touches an existing file of the temporary's name (DESIGN.md §4).
 * Used by the checkpoint writers (src/io/) and by the CLI's file outputs (qmm bench --json, qmm tune --out).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Six name characters from a 64-bit mix of the process id, a per-process counter and the clock: unique
 * enough that O_EXCL rarely has to retry. */
static void temp_suffix(char *out) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static _Atomic uint64_t counter;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t x = ((uint64_t)getpid() << 32) ^ (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 20) ^
                 (++counter * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33; /* splitmix64 finalizer */
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    for (int i = 0; i < 6; i++, x /= 62)
        out[i] = alphabet[x % 62];
}

/* The temporary files and the created directory in progress, for qmm_atomic_remove_all (a signal handler's call):
 * fixed slots of paths and lock-free states, since a handler may neither allocate nor lock. A slot is claimed
 * (CLAIMED) by a compare-and-swap, filled, then published (ACTIVE); the handler removes only ACTIVE ones. A path too
 * long for a slot, or a ninth file, is not registered (its removal on a signal is then best effort: none). */
enum { SLOT_FREE, SLOT_CLAIMED, SLOT_ACTIVE };
#define QMM_ATOMIC_SLOTS 8
static char slot_path[QMM_ATOMIC_SLOTS + 1][PATH_MAX]; /* the last slot: the created directory */
static _Atomic int slot_state[QMM_ATOMIC_SLOTS + 1];

static int slot_claim(const char *path, int first, int last) {
    const size_t length = strlen(path);
    if (length >= PATH_MAX) return -1;
    for (int i = first; i <= last; i++) {
        int expected = SLOT_FREE;
        if (atomic_compare_exchange_strong(&slot_state[i], &expected, SLOT_CLAIMED)) {
            memcpy(slot_path[i], path, length + 1);
            atomic_store(&slot_state[i], SLOT_ACTIVE);
            return i;
        }
    }
    return -1;
}

static void slot_release(int *slot) {
    if (*slot >= 0) atomic_store(&slot_state[*slot], SLOT_FREE);
    *slot = -1;
}

void qmm_atomic_remove_all(void) {
    for (int i = 0; i <= QMM_ATOMIC_SLOTS; i++) {
        if (atomic_load(&slot_state[i]) != SLOT_ACTIVE) continue;
        if (i < QMM_ATOMIC_SLOTS) unlink(slot_path[i]);
        else rmdir(slot_path[i]); /* empty once the files are gone, unless something else is in it */
    }
}

int qmm_atomic_note_created_dir(const char *dir) { return slot_claim(dir, QMM_ATOMIC_SLOTS, QMM_ATOMIC_SLOTS); }

void qmm_atomic_forget(int note) { slot_release(&note); }

void qmm_atomic_block_signals(sigset_t *old) {
    static const int signals[] = {QMM_CLEANUP_SIGNALS};
    sigset_t block;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        sigaddset(&block, signals[i]);
    pthread_sigmask(SIG_BLOCK, &block, old);
}

void qmm_atomic_restore_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

const char *qmm_file_kind(unsigned mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

qmm_status qmm_atomic_begin(qmm_atomic_file *file, const char *path) {
    file->fd = -1;
    file->path = path;
    file->temp_path = NULL;
    file->slot = -1;
    /* The rename replaces whatever the destination is. A regular file or a symbolic link (the link itself, as the
     * checkpoint writer's --force has always done; its target is not written) may be replaced; a directory, a device
     * node (as root, /dev/full would become a file), a FIFO or a socket is refused. */
    struct stat info;
    if (lstat(path, &info) == 0 && !S_ISREG(info.st_mode) && !S_ISLNK(info.st_mode))
        return qmm_error(QMM_ERR_IO, "\"%s\" exists and is %s, not a regular file: writing it would replace it", path,
                         qmm_file_kind(info.st_mode));
    static const char suffix[] = ".qmm-tmp-XXXXXX";
    size_t length = strlen(path);
    file->temp_path = malloc(length + sizeof suffix);
    if (!file->temp_path) return qmm_error(QMM_ERR_OUT_OF_MEMORY, "cannot allocate a temporary name for \"%s\"", path);
    memcpy(file->temp_path, path, length);
    memcpy(file->temp_path + length, suffix, sizeof suffix);
    /* Not mkstemp: it creates the file 0600. A checkpoint is an ordinary file, created 0666 and
     * narrowed by the caller's umask like any other (never chmod'ed to a fixed mode). */
    int err = EEXIST;
    sigset_t signals; /* no signal between the file's creation and its registration (qmm_atomic_remove_all) */
    qmm_atomic_block_signals(&signals);
    for (int attempt = 0; attempt < 100 && file->fd < 0 && err == EEXIST; attempt++) {
        temp_suffix(file->temp_path + length + sizeof suffix - 7);
        file->fd = open(file->temp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (file->fd < 0) err = errno;
    }
    if (file->fd >= 0) file->slot = slot_claim(file->temp_path, 0, QMM_ATOMIC_SLOTS - 1);
    qmm_atomic_restore_signals(&signals);
    if (file->fd < 0) {
        free(file->temp_path);
        file->temp_path = NULL;
        return qmm_error(QMM_ERR_IO, "cannot create a temporary file beside \"%s\": %s", path, strerror(err));
    }
    return QMM_OK;
}

qmm_status qmm_atomic_write(qmm_atomic_file *file, const void *bytes, size_t size) {
    const char *p = bytes;
    while (size > 0) {
        size_t chunk = size > ((size_t)1 << 30) ? ((size_t)1 << 30) : size;
        ssize_t written = write(file->fd, p, chunk);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0)
            return qmm_error(QMM_ERR_IO, "cannot write \"%s\": %s", file->temp_path,
                             written < 0 ? strerror(errno) : "no progress");
        p += written;
        size -= (size_t)written;
    }
    return QMM_OK;
}

qmm_status qmm_atomic_finish(qmm_atomic_file *file) {
    /* fsync before rename: otherwise a crash could leave the new name pointing at unwritten blocks. */
    if (fsync(file->fd) != 0) return qmm_error(QMM_ERR_IO, "cannot fsync \"%s\": %s", file->temp_path, strerror(errno));
    int fd = file->fd;
    file->fd = -1;
    if (close(fd) != 0) return qmm_error(QMM_ERR_IO, "cannot close \"%s\": %s", file->temp_path, strerror(errno));
    return QMM_OK;
}

qmm_status qmm_atomic_rename(qmm_atomic_file *file) {
    if (rename(file->temp_path, file->path) != 0) {
        int err = errno;
        unlink(file->temp_path);
        slot_release(&file->slot);
        free(file->temp_path);
        file->temp_path = NULL;
        return qmm_error(QMM_ERR_IO, "cannot rename the temporary file onto \"%s\": %s", file->path, strerror(err));
    }
    slot_release(&file->slot);
    free(file->temp_path);
    file->temp_path = NULL;
    return QMM_OK;
}

void qmm_atomic_abort(qmm_atomic_file *file) {
    if (file->fd >= 0) close(file->fd);
    file->fd = -1;
    if (file->temp_path) {
        unlink(file->temp_path);
        slot_release(&file->slot);
        free(file->temp_path);
        file->temp_path = NULL;
    }
}
