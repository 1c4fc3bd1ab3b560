/* status.c — status names and the thread-local last-error message (DESIGN.md §4). */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024]; /* room for a table of kernel names (select.c) */

const char *qmm_status_string(qmm_status status) {
    switch (status) {
    case QMM_OK: return "ok";
    case QMM_ERR_INVALID_ARGUMENT: return "invalid argument";
    case QMM_ERR_SHAPE: return "bad shape";
    case QMM_ERR_FORMAT: return "unsupported format";
    case QMM_ERR_OVERFLOW: return "size overflow";
    case QMM_ERR_OUT_OF_MEMORY: return "out of memory";
    case QMM_ERR_IO: return "I/O error";
    case QMM_ERR_CORRUPT: return "corrupt file";
    case QMM_ERR_UNSUPPORTED: return "unsupported";
    case QMM_ERR_NOT_FOUND: return "not found";
    case QMM_ERR_NUMERIC: return "non-finite value";
    case QMM_ERR_BACKEND: return "backend error";
    }
    return "unknown status";
}

const char *qmm_last_error(void) { return last_error; }

void qmm_error_clear(void) { last_error[0] = '\0'; }

qmm_status qmm_error(qmm_status status, const char *format, ...) {
    /* Formatted into a local buffer first: an argument may be qmm_last_error() itself (re-wrapping a
     * message), and vsnprintf must not read the buffer it is writing. */
    char message[sizeof last_error];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    memcpy(last_error, message, sizeof message);
    return status;
}
