/* status.c — status names, the thread-local last-error message (DESIGN.md §4) and printable copies of untrusted
 * text for messages. */
#include "internal.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Room for a table of kernel names (select.c) and for a message that echoes a path of PATH_MAX bytes twice (the CLI
 * wraps a library message naming the path in its own) with its rule. */
static _Thread_local char last_error[16384];

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
    const int length = vsnprintf(message, sizeof message, format, args);
    va_end(args);
    if (length >= (int)sizeof message) { /* cut, marked with "…": never inside a UTF-8 character (names keep theirs) */
        static const char mark[] = "\xE2\x80\xA6";
        memcpy(message + qmm_utf8_cut(message, sizeof message - sizeof mark), mark, sizeof mark);
    }
    memcpy(last_error, message, strlen(message) + 1);
    return status;
}

/* ───────────────────────────── untrusted text in messages ───────────────────────────── */

size_t qmm_utf8_cut(const char *text, size_t length) {
    size_t lead = length;
    while (lead > 0 && ((uint8_t)text[lead - 1] & 0xC0) == 0x80) lead--; /* back over continuation bytes */
    if (lead > 0 && (uint8_t)text[lead - 1] >= 0xC0 && qmm_utf8_char(text + lead - 1, length - lead + 1, NULL) == 0)
        return lead - 1; /* that character was cut: drop what is left of it */
    return length;
}

size_t qmm_utf8_char(const char *bytes, size_t size, uint32_t *code_point) {
    const uint8_t *s = (const uint8_t *)bytes;
    if (size == 0) return 0;
    size_t length;
    uint32_t code, minimum;
    if (s[0] < 0x80) length = 1, code = s[0], minimum = 0;
    else if ((s[0] & 0xE0) == 0xC0) length = 2, code = s[0] & 0x1F, minimum = 0x80;
    else if ((s[0] & 0xF0) == 0xE0) length = 3, code = s[0] & 0x0F, minimum = 0x800;
    else if ((s[0] & 0xF8) == 0xF0) length = 4, code = s[0] & 0x07, minimum = 0x10000;
    else return 0; /* a continuation byte, or 0xF8-0xFF */
    if (size < length) return 0;
    for (size_t k = 1; k < length; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        code = (code << 6) | (s[k] & 0x3F);
    }
    if (code < minimum || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) /* overlong, past Unicode, surrogate */
        return 0;
    if (code_point) *code_point = code;
    return length;
}

/* Unicode's Default_Ignorable_Code_Point set (DerivedCoreProperties.txt): the characters a terminal shows as nothing
 * — a byte order mark, zero-width spaces and joiners, the bidirectional marks, embeddings, overrides and isolates
 * (U+061C, U+200E-F, U+202A-E, U+2066-9), soft hyphens, variation selectors, tags. In a name they make it read as
 * another name ("\xef\xbb\xbfseed" shown as "seed"), or reorder the text around it. */
static bool invisible(uint32_t code) {
    static const uint32_t ranges[][2] = {
        {0x00AD, 0x00AD},   {0x034F, 0x034F},   {0x061C, 0x061C},   {0x115F, 0x1160}, {0x17B4, 0x17B5},
        {0x180B, 0x180F},   {0x200B, 0x200F},   {0x202A, 0x202E},   {0x2060, 0x206F}, {0x3164, 0x3164},
        {0xFE00, 0xFE0F},   {0xFEFF, 0xFEFF},   {0xFFA0, 0xFFA0},   {0xFFF0, 0xFFF8}, {0x1BCA0, 0x1BCA3},
        {0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (code >= ranges[i][0] && code <= ranges[i][1]) return true;
    return false;
}

size_t qmm_printable_char(const char *bytes, size_t size) {
    uint32_t code = 0;
    const size_t length = qmm_utf8_char(bytes, size, &code);
    if (length == 0 || code < 0x20 || (code >= 0x7F && code <= 0x9F)) return 0; /* C0, DEL, C1 */
    /* the line and paragraph separators (a terminal breaks the line there), and the characters shown as nothing */
    if (code == 0x2028 || code == 0x2029 || invisible(code)) return 0;
    return length;
}

/* How untrusted text at bytes[0, size) is shown: the bytes it takes in *consumed and the bytes it is shown as (a
 * printable character as it is, a backslash doubled, any other byte as \xNN). */
static size_t shown_length(const char *bytes, size_t size, size_t *consumed) {
    const size_t length = bytes[0] == '\\' ? 0 : qmm_printable_char(bytes, size);
    *consumed = length ? length : 1;
    return length ? length : bytes[0] == '\\' ? 2 : 4;
}

/* Whether bytes[0, size) shown takes at most room bytes (only the end of a text is asked about: room is small). */
static bool shown_fits(const char *bytes, size_t size, size_t room) {
    size_t used = 0;
    for (size_t i = 0, consumed; i < size && used <= room; i += consumed)
        used += shown_length(bytes + i, size - i, &consumed);
    return used <= room;
}

const char *qmm_printable(const char *bytes, size_t size, char *buffer, size_t buffer_size) {
    static const char hex[] = "0123456789abcdef";
    size_t out = 0;
    if (buffer_size < 8) {
        if (buffer_size) buffer[0] = '\0';
        return buffer;
    }
    for (size_t i = 0; i < size;) {
        const uint8_t c = (uint8_t)bytes[i];
        size_t consumed;
        const size_t need = shown_length(bytes + i, size - i, &consumed);
        /* room for "..." and the NUL after this character, unless the rest of the text fits whole (a name exactly at
         * the limit is shown as it is, not cut) */
        if (out + need + 4 > buffer_size && !shown_fits(bytes + i, size - i, buffer_size - 1 - out)) {
            memcpy(buffer + out, "...", 3);
            out += 3;
            break;
        }
        if (consumed == need) { /* a printable character, kept as it is */
            memcpy(buffer + out, bytes + i, need);
        } else if (c == '\\') {
            buffer[out] = buffer[out + 1] = '\\';
        } else {
            buffer[out] = '\\';
            buffer[out + 1] = 'x';
            buffer[out + 2] = hex[c >> 4];
            buffer[out + 3] = hex[c & 15];
        }
        out += need;
        i += consumed;
    }
    buffer[out] = '\0';
    return buffer;
}
