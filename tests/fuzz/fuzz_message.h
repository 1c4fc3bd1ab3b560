/*
 * fuzz_message.h — the fuzz targets' check of a refusal's message: not empty, and printable text (internal.h's
 * qmm_printable_char for every character) — a name, key or value from the input is escaped in it, so no control
 * character, bidi mark or invalid UTF-8 from the file reaches a terminal. A message that is not aborts.
 */
#ifndef QMM_FUZZ_MESSAGE_H
#define QMM_FUZZ_MESSAGE_H

#include "internal.h"
#include "qmm.h"

#include <stdlib.h>
#include <string.h>

static inline void fuzz_check_message(void) {
    const char *message = qmm_last_error();
    const size_t length = strlen(message);
    if (length == 0) abort();
    for (size_t i = 0; i < length;) {
        const size_t step = qmm_printable_char(message + i, length - i);
        if (step == 0) abort();
        i += step;
    }
}

#endif
