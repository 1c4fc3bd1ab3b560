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

int bench_run_script_peer(const char *shell_command, bench_peer_samples *samples, char *absent, size_t absent_size) {
#ifndef QMM_BENCH_JSON
    (void)shell_command, (void)samples;
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
    char *line = NULL;
    size_t line_size = 0;
    ssize_t length;
    size_t answered = 0;
    while ((length = getline(&line, &line_size, pipe)) > 0) {
        cJSON *object = cJSON_Parse(line);
        if (!cJSON_IsObject(object)) { /* not ours (a library printing to stdout): pass it on to stderr */
            fprintf(stderr, "  peer: %s", line);
            cJSON_Delete(object);
            continue;
        }
        const char *why = string_of(object, "absent");
        if (why) {
            snprintf(absent, absent_size, "%s", why);
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
             * no cell and is dropped, said on stderr), a time finite and > 0 (else the cell's peer is skipped, the
             * note saying why) */
            const double M = m->valuedouble;
            if (!(M >= 1 && M <= 65536 && M == floor(M))) {
                fprintf(stderr, "  peer %s: a line with M=%g is ignored (M must be a whole number from 1 to 65536)\n", peer, M);
                cJSON_Delete(object);
                continue;
            }
            const bool bad_time = !skipped && !(isfinite(us->valuedouble) && us->valuedouble > 0);
            bench_peer_sample sample;
            memset(&sample, 0, sizeof sample);
            snprintf(sample.peer, sizeof sample.peer, "%s", peer);
            snprintf(sample.shape, sizeof sample.shape, "%s", shape);
            snprintf(sample.dtype, sizeof sample.dtype, "%s", dtype);
            sample.M = (size_t)M;
            sample.us = skipped || bad_time ? NAN : us->valuedouble;
            if (bad_time)
                snprintf(sample.note, sizeof sample.note, "skipped: the script reported us=%g (a time must be finite and > 0)",
                         us->valuedouble);
            else
                snprintf(sample.note, sizeof sample.note, "%s", skipped ? skipped : note ? note : "");
            append(samples, &sample);
            answered++;
        }
        cJSON_Delete(object);
    }
    free(line);
    int rc = pclose(pipe);
    if (absent[0]) return 0;
    if (rc != 0 && answered == 0) {
        snprintf(absent, absent_size, "the peer script failed (exit status %d; its stderr is above)", rc);
        return 0;
    }
    return 1;
#endif
}
