/*
 * bench_peers.c — the peers of `qmm bench` that run as Python scripts in bench/peers/: runs one, reads
 * its JSON lines (protocol in bench/peers/README.md) and keeps the samples. Needs cJSON; without it every
 * script peer is absent, with that reason.
 */
#include "bench.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifdef QMM_BENCH_JSON
#include <cjson/cJSON.h>
#endif

void bench_peer_samples_free(bench_peer_samples *samples) {
    free(samples->items);
    memset(samples, 0, sizeof *samples);
}

#ifdef QMM_BENCH_JSON
static const char *string_of(const cJSON *object, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

/* src into dst[size] as printable UTF-8 (qmm_printable_char, internal.h): whole characters only (a character that does
 * not fit ends the copy, so nothing is cut in the middle of one), an invalid byte or a control character (a line break,
 * an escape, a C1 control) as one '?' — a script's text goes into the table, the terminal and the JSON file. */
static void copy_text(char *dst, size_t size, const char *src) {
    const size_t length = strlen(src);
    size_t at = 0;
    for (size_t i = 0; i < length && size > 0;) {
        const size_t kept = qmm_printable_char(src + i, length - i);
        const size_t character = qmm_utf8_char(src + i, length - i, NULL); /* a control character's whole length */
        const size_t take = kept ? kept : 1;
        if (at + take >= size) break;
        if (kept) memcpy(dst + at, src + i, kept);
        else dst[at] = '?';
        at += take;
        i += character ? character : 1;
    }
    if (size > 0) dst[at] = '\0';
}

static int append(bench_peer_samples *samples, const bench_peer_sample *sample) {
    if (samples->count == samples->capacity) {
        size_t capacity = samples->capacity ? 2 * samples->capacity : 64;
        bench_peer_sample *grown = realloc(samples->items, capacity * sizeof *grown);
        if (!grown) return 0;
        samples->items = grown;
        samples->capacity = capacity;
    }
    samples->items[samples->count++] = *sample;
    return 1;
}
#endif

/* The next line of stream into line[size] (its newline dropped, NUL-terminated) and its length in *length, NUL bytes
 * in it included (fgets and strlen would end the line at one, leaving the rest of a long line to read as lines of its
 * own): 1, or 0 at the end. A line longer than size − 1 bytes is read to its end and given as empty, *too_long set. */
static int read_line(FILE *stream, char *line, size_t size, size_t *length, bool *too_long) {
    size_t n = 0;
    int c;
    *too_long = false;
    while ((c = getc(stream)) != EOF && c != '\n') {
        if (n + 1 < size) line[n++] = (char)c;
        else *too_long = true;
    }
    if (c == EOF && n == 0 && !*too_long) return 0;
    if (*too_long) n = 0;
    line[n] = '\0';
    *length = n;
    return 1;
}

int bench_run_script_peer(const char *shell_command, int deadline_s, size_t max_samples, bench_peer_samples *samples,
                          char *absent, size_t absent_size) {
#ifndef QMM_BENCH_JSON
    (void)shell_command, (void)deadline_s, (void)max_samples, (void)samples;
    snprintf(absent, absent_size, "qmm was built without cJSON, which reads the peer scripts' JSON lines");
    return 0;
#else
    absent[0] = '\0';
    fflush(stdout);
    fflush(stderr);
    FILE *pipe = popen(shell_command, "r");
    if (!pipe) {
        snprintf(absent, absent_size, "cannot start '%s'", shell_command);
        return 0;
    }
    enum { LINE_BYTES = 64 * 1024, SHOWN_BYTES = 4 * LINE_BYTES + 8 }; /* a byte escaped is 4 ("\x1b") */
    char *line = malloc(LINE_BYTES), *shown = malloc(SHOWN_BYTES);
    if (!line || !shown) {
        pclose(pipe);
        free(line);
        free(shown);
        snprintf(absent, absent_size, "no memory to read the script's lines");
        return 0;
    }
    size_t answered = 0, too_long_lines = 0, past_max = 0, length;
    bool too_long;
    while (read_line(pipe, line, LINE_BYTES, &length, &too_long)) {
        if (too_long) {
            too_long_lines++;
            continue;
        }
        if (length == 0) continue;
        /* a line holding a NUL byte is not one of ours either (its JSON would be read only up to the NUL) */
        cJSON *object = memchr(line, '\0', length) ? NULL : cJSON_Parse(line);
        if (!cJSON_IsObject(object)) { /* not ours (a library printing to stdout): pass it on to stderr, escaped */
            fprintf(stderr, "  peer: %s\n", qmm_printable(line, length, shown, SHOWN_BYTES));
            cJSON_Delete(object);
            continue;
        }
        const char *why = string_of(object, "absent");
        if (why) {
            copy_text(absent, absent_size > 64 ? absent_size - 64 : absent_size, why); /* room for "peer: absent: " */
            cJSON_Delete(object);
            continue;
        }
        const char *peer = string_of(object, "peer"), *shape = string_of(object, "shape"),
                   *dtype = string_of(object, "dtype"), *skipped = string_of(object, "skipped"),
                   *note = string_of(object, "note");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(object, "M");
        const cJSON *us = cJSON_GetObjectItemCaseSensitive(object, "us");
        if (peer && shape && dtype && cJSON_IsNumber(m) && (skipped || cJSON_IsNumber(us))) {
            /* a script's line is checked like any input: M a whole number in the bench's range (else the line names
             * no cell and is dropped, said on stderr), a time finite, from 0.001 µs to 1e9 µs (else the cell's peer is
             * skipped, the note saying why) */
            bench_peer_sample sample;
            memset(&sample, 0, sizeof sample);
            copy_text(sample.peer, sizeof sample.peer, peer);
            const double M = m->valuedouble;
            if (!(M >= 1 && M <= 65536 && M == floor(M))) {
                /* %.17g: a value that breaks the rule never prints as one that keeps it (%g: 1.0000001 as 1) */
                fprintf(stderr, "  peer %s: a line with M=%.17g is ignored (M must be a whole number from 1 to 65536)\n",
                        sample.peer, M);
                cJSON_Delete(object);
                continue;
            }
            const double time = skipped ? NAN : us->valuedouble;
            const bool bad_time = !skipped && !(isfinite(time) && time >= 1e-3 && time <= 1e9);
            copy_text(sample.shape, sizeof sample.shape, shape);
            copy_text(sample.dtype, sizeof sample.dtype, dtype);
            sample.M = (size_t)M;
            sample.us = skipped || bad_time ? NAN : time;
            if (bad_time) {
                snprintf(sample.note, sizeof sample.note,
                         "skipped: the script reported us=%.17g (a time must be finite, from 0.001 to 1e9 µs)", time);
            } else {
                copy_text(sample.note, sizeof sample.note, skipped ? skipped : note ? note : "");
            }
            if (samples->count >= max_samples) { /* more results than the run has cells for: read and dropped */
                past_max++;
                cJSON_Delete(object);
                continue;
            }
            if (!append(samples, &sample)) {
                snprintf(absent, absent_size, "no memory for the script's results");
                cJSON_Delete(object);
                break;
            }
            answered++;
        } else {
            fprintf(stderr, "  peer: a line without peer, shape, dtype, a numeric M and a numeric us (or skipped) is "
                            "ignored\n");
        }
        cJSON_Delete(object);
    }
    free(line);
    free(shown);
    const int rc = pclose(pipe);
    if (too_long_lines)
        fprintf(stderr, "  peer: %zu line%s longer than %d KiB dropped\n", too_long_lines, too_long_lines == 1 ? "" : "s",
                LINE_BYTES / 1024);
    if (past_max)
        fprintf(stderr, "  peer: %zu result line%s past the first %zu dropped (more than the run's cells allow)\n",
                past_max, past_max == 1 ? "" : "s", max_samples);
    char how[96] = "";
    if (rc == -1)
        snprintf(how, sizeof how, "its status could not be read");
    else if (deadline_s > 0 && WIFEXITED(rc) && (WEXITSTATUS(rc) == 124 || WEXITSTATUS(rc) == 137))
        snprintf(how, sizeof how, "stopped by the deadline of %d s, --peer-timeout", deadline_s);
    else if (WIFEXITED(rc) && WEXITSTATUS(rc) != 0)
        snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(rc));
    else if (WIFSIGNALED(rc))
        snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(rc));
    if (absent[0]) return 0;
    if (how[0] && answered == 0) {
        snprintf(absent, absent_size, "the peer script failed (%s; its stderr is above)", how);
        return 0;
    }
    if (how[0]) /* results, then a failure: the results are kept, and the failure said */
        fprintf(stderr, "  peer: the script ended (%s) after %zu results, which are kept (its stderr is above)\n", how,
                answered);
    if (answered == 0) {
        snprintf(absent, absent_size, "the peer script printed no results (no JSON lines, no reason)");
        return 0;
    }
    return 1;
#endif
}
