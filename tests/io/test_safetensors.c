/*
 * test_safetensors.c — safetensors read/write: a random round trip (every dtype, odd sizes, scalars,
 * empty tensors, metadata), the reader's validation of every header rule on hand-built bad files, and
 * the writer's "nothing left behind" guarantee when it fails.
 */
#include "check.h"
#include "internal.h"
#include "io_test_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool message_has(const char *needle) { return strstr(qmm_last_error(), needle) != NULL; }

/* ── a random round trip ── */

typedef struct sample {
    const char *name;
    qmm_dtype dtype;
    int ndim;
    int64_t shape[3];
} sample;

static void test_round_trip(const char *dir) {
    check_rng rng = check_rng_make(1);
    const sample samples[] = {
        {"model.layers.0.weight", QMM_U32, 2, {3, 5}},
        {"odd.bytes", QMM_U8, 1, {3}},
        {"norm.weight", QMM_F32, 1, {7}},
        {"emb", QMM_F16, 2, {4, 3}},
        {"bf", QMM_BF16, 3, {2, 3, 2}},
        {"scalar", QMM_I64, 0, {0}},
        {"empty", QMM_F32, 2, {0, 4}},
        {"flags", QMM_BOOL, 1, {5}},
        {"wide", QMM_F64, 1, {2}},
        {"ünïcode.名前", QMM_I16, 1, {3}},
    };
    enum { COUNT = sizeof samples / sizeof samples[0] };
    qmm_tensor tensors[COUNT];
    uint8_t *buffers[COUNT];
    for (int i = 0; i < COUNT; i++) {
        memset(&tensors[i], 0, sizeof tensors[i]);
        tensors[i].name = samples[i].name;
        tensors[i].dtype = samples[i].dtype;
        tensors[i].ndim = samples[i].ndim;
        size_t elements = 1;
        for (int d = 0; d < samples[i].ndim; d++) {
            tensors[i].shape[d] = samples[i].shape[d];
            elements *= (size_t)samples[i].shape[d];
        }
        tensors[i].nbytes = elements * qmm_dtype_size(samples[i].dtype);
        buffers[i] = malloc(tensors[i].nbytes + 1);
        for (size_t b = 0; b < tensors[i].nbytes; b++)
            buffers[i][b] = (uint8_t)check_rng_next(&rng);
        tensors[i].data = buffers[i];
    }
    const char *keys[] = {"format", "note"};
    const char *values[] = {"mlx", "round trip ✓"};
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, "round.safetensors");
    CHECK_OK(qmm_safetensors_write(path, tensors, COUNT, keys, values, 2));
    CHECK(io_count_entries(dir) == 1, "the write left %d entries in the directory, want 1", io_count_entries(dir));

    qmm_safetensors *file = NULL;
    CHECK_OK(qmm_safetensors_open(path, &file));
    if (file) {
        CHECK(qmm_safetensors_count(file) == COUNT, "count %zu, want %d", qmm_safetensors_count(file), COUNT);
        for (int i = 0; i < COUNT; i++) {
            qmm_tensor got;
            CHECK_OK(qmm_safetensors_find(file, samples[i].name, &got));
            CHECK(strcmp(got.name, samples[i].name) == 0, "name %s", got.name);
            CHECK(got.dtype == samples[i].dtype, "%s: dtype %d", samples[i].name, got.dtype);
            CHECK(got.ndim == samples[i].ndim, "%s: ndim %d", samples[i].name, got.ndim);
            for (int d = 0; d < got.ndim; d++)
                CHECK(got.shape[d] == samples[i].shape[d], "%s: shape[%d]=%lld", samples[i].name, d,
                      (long long)got.shape[d]);
            CHECK(got.nbytes == tensors[i].nbytes, "%s: nbytes %zu", samples[i].name, got.nbytes);
            CHECK(got.nbytes == 0 || memcmp(got.data, buffers[i], got.nbytes) == 0, "%s: bytes differ",
                  samples[i].name);
            /* The writer orders by element size and pads the header, so each array is aligned. */
            CHECK((uintptr_t)got.data % qmm_dtype_size(got.dtype) == 0, "%s: data misaligned", samples[i].name);
        }
        /* get() walks tensors in data-offset order. */
        const uint8_t *previous = NULL;
        for (size_t i = 0; i < qmm_safetensors_count(file); i++) {
            qmm_tensor got;
            CHECK_OK(qmm_safetensors_get(file, i, &got));
            CHECK(previous == NULL || (const uint8_t *)got.data >= previous, "tensor %zu is out of offset order", i);
            previous = got.data;
        }
        const char *format = qmm_safetensors_metadata(file, "format");
        const char *note = qmm_safetensors_metadata(file, "note");
        CHECK(format && strcmp(format, "mlx") == 0, "metadata format = %s", format ? format : "(null)");
        CHECK(note && strcmp(note, values[1]) == 0, "metadata note = %s", note ? note : "(null)");
        CHECK(qmm_safetensors_metadata(file, "absent") == NULL, "absent metadata key found");
        qmm_tensor missing;
        CHECK_STATUS(qmm_safetensors_find(file, "no.such.tensor", &missing), QMM_ERR_NOT_FOUND);
        CHECK(message_has("no.such.tensor"), "message does not name the tensor: %s", qmm_last_error());
        CHECK_STATUS(qmm_safetensors_get(file, COUNT, &missing), QMM_ERR_INVALID_ARGUMENT);
        qmm_safetensors_close(file);
    }

    /* The same bytes through open_memory. */
    size_t size = 0;
    char *bytes = io_read_file(path, &size);
    CHECK(bytes != NULL, "cannot read back %s", path);
    if (bytes) {
        CHECK_OK(qmm_safetensors_open_memory(bytes, size, &file));
        CHECK(file && qmm_safetensors_count(file) == COUNT, "open_memory count");
        qmm_safetensors_close(file);
        free(bytes);
    }
    for (int i = 0; i < COUNT; i++)
        free(buffers[i]);
    remove(path);
}

/* A file as mlx.core.save_safetensors writes it: unpadded header, tensors at odd offsets. */
static void test_mlx_layout(void) {
    const char *header = "{\"__metadata__\":{\"format\":\"mlx\"},\"a\":{\"data_offsets\":[17,23],\"dtype\":\"F16\","
                         "\"shape\":[3]},\"b\":{\"data_offsets\":[1,17],\"dtype\":\"F32\",\"shape\":[2,2]},"
                         "\"c\":{\"data_offsets\":[0,1],\"dtype\":\"U8\",\"shape\":[1]}}";
    uint8_t data[23];
    for (int i = 0; i < 23; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    io_buf image = io_safetensors_image(header, data, sizeof data);
    qmm_safetensors *file = NULL;
    CHECK_OK(qmm_safetensors_open_memory(image.data, image.size, &file));
    if (file) {
        qmm_tensor t;
        CHECK_OK(qmm_safetensors_get(file, 0, &t));
        CHECK(strcmp(t.name, "c") == 0, "first by offset is %s, want c", t.name);
        CHECK_OK(qmm_safetensors_find(file, "b", &t));
        CHECK(t.nbytes == 16 && memcmp(t.data, data + 1, 16) == 0, "b's bytes differ");
        CHECK(t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 2, "b's shape");
        qmm_safetensors_close(file);
    }
    io_buf_free(&image);

    /* mlx.core.save_safetensors writes "__metadata__": null when there is no metadata. */
    image = io_safetensors_image(
        "{\"__metadata__\":null,\"c\":{\"data_offsets\":[0,1],\"dtype\":\"U8\",\"shape\":[1]}}", data, 1);
    CHECK_OK(qmm_safetensors_open_memory(image.data, image.size, &file));
    CHECK(file && qmm_safetensors_count(file) == 1 && qmm_safetensors_metadata(file, "format") == NULL,
          "null metadata");
    qmm_safetensors_close(file);
    io_buf_free(&image);
}

/* ── bad headers: each must fail with the exact status and a message naming the value ── */

typedef struct bad_case {
    const char *header;
    size_t data_size;
    qmm_status status;
    const char *needle; /* must appear in the message */
} bad_case;

/* A header over `size` bytes of data opens, and holds a tensor named `name`. */
static void check_opens_with(const char *header, const uint8_t *data, size_t size, const char *name, const char *what) {
    io_buf image = io_safetensors_image(header, data, size);
    qmm_safetensors *file = NULL;
    qmm_tensor tensor;
    CHECK_OK(qmm_safetensors_open_memory(image.data, image.size, &file));
    CHECK(file && qmm_safetensors_find(file, name, &tensor) == QMM_OK, "%s: not found", what);
    qmm_safetensors_close(file);
    io_buf_free(&image);
}

static void test_bad_headers(void) {
    static const bad_case cases[] = {
        {"[1, 2]", 0, QMM_ERR_CORRUPT, "object"},
        {"{\"a\": ", 0, QMM_ERR_CORRUPT, "JSON"},
        {"{} x", 0, QMM_ERR_CORRUPT, "after"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, QMM_ERR_CORRUPT, "\"w\""},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         16, QMM_ERR_CORRUPT, "overlap"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "needs 12"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648,2147483648],\"data_offsets\":[0,8]}}", 8,
         QMM_ERR_CORRUPT, "overflow"},
        {"{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, QMM_ERR_UNSUPPORTED, "F8_E4M3"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
         16, QMM_ERR_CORRUPT, "twice"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "negative"},
        /* a field given twice: cJSON would read the first copy, Python's json the last, serde refuses the file */
        {"{\"w\":{\"dtype\":\"I32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT,
         "\"dtype\" appears 2 times"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"data_offsets\":[8,16]}}", 16,
         QMM_ERR_CORRUPT, "\"data_offsets\" appears 2 times"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "2^53"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "shape[0]"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "shape[0]"},
        {"{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "dtype"},
        {"{\"w\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "dtype"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "shape"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 9, QMM_ERR_CORRUPT, "data_offsets"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, QMM_ERR_CORRUPT, "begin > end"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,7]}}", 8, QMM_ERR_CORRUPT, "data_offsets"},
        {"{\"w\":[1,2]}", 0, QMM_ERR_CORRUPT, "\"w\""},
        {"{\"__metadata__\":{\"k\":3}}", 0, QMM_ERR_CORRUPT, "\"k\""},
        {"{\"__metadata__\":[]}", 0, QMM_ERR_CORRUPT, "__metadata__"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, QMM_ERR_UNSUPPORTED,
         "9 dimensions"},
        {"{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, QMM_ERR_CORRUPT, "\\xff\\xfe"},
        {"{\"a\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, QMM_ERR_CORRUPT, "UTF-8"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, QMM_ERR_CORRUPT, "truncated"},
        /* Offsets must tile the data area (safetensors Metadata::validate): no gap, no leading or trailing bytes. */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, QMM_ERR_CORRUPT, "\"a\" [0, 4) and \"b\" [8, 12) are not adjacent: bytes [4, 8)"},
        {"{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, QMM_ERR_CORRUPT,
         "\"b\" begins at 4"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9, QMM_ERR_CORRUPT,
         "5 bytes after the last tensor \"w\""},
        {"{}", 3, QMM_ERR_CORRUPT, "no tensor but 3 bytes"},
        /* A name with a NUL byte (cJSON would cut both to "a" and report "a" twice): refused, escaped, with its
         * byte offset in the header. */
        {"{\"a\\u0000x.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\\u0000y.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, QMM_ERR_CORRUPT, "the string at byte 1, \"a\\\\u0000x.weight\", holds a NUL byte"},
        {"{\"__metadata__\":{\"k\":\"v\\u0000w\"}}", 0, QMM_ERR_CORRUPT, "holds a NUL byte"},
        /* whole numbers written with a fraction or an exponent (the reference implementation reads usize): refused,
         * the number and its byte offset named */
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2e0],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT,
         "the number 2e0 at byte 29 is not written as an unsigned integer"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8]}}", 8, QMM_ERR_CORRUPT, "0.0"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-0,8]}}", 8, QMM_ERR_CORRUPT, "-0"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8E0]}}", 8, QMM_ERR_CORRUPT, "8E0"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", 8, QMM_ERR_CORRUPT, "02"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[00,8]}}", 8, QMM_ERR_CORRUPT, "00"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]}}",
         4, QMM_ERR_CORRUPT, "not adjacent"},
    };
    uint8_t data[64] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        io_buf image = io_safetensors_image(cases[i].header, data, cases[i].data_size);
        qmm_safetensors *file = (qmm_safetensors *)&image; /* must be reset to NULL on failure */
        qmm_error_clear();
        qmm_status status = qmm_safetensors_open_memory(image.data, image.size, &file);
        CHECK(status == cases[i].status && qmm_last_error()[0] != '\0',
              "case %zu (%s): status %s (want %s), message \"%s\"", i, cases[i].header, qmm_status_string(status),
              qmm_status_string(cases[i].status), qmm_last_error());
        CHECK(message_has(cases[i].needle), "case %zu: message \"%s\" lacks \"%s\"", i, qmm_last_error(),
              cases[i].needle);
        CHECK(file == NULL, "case %zu: handle not NULL after failure", i);
        if (getenv("QMM_TEST_VERBOSE")) printf("case %zu: %s\n", i, qmm_last_error());
        io_buf_free(&image);
    }
    /* Numbers inside strings are text, and a field no reader knows may hold any number: a name and metadata with
     * fractions, exponents and signs, an "extra" field of -1.5 and [-1, 0.5], and a key ending in a backslash open. */
    check_opens_with("{\"__metadata__\":{\"lr\":\"-1.5e-3\",\"k\\\\\":\"[2.5]\"},\"w-2.5e1\\\"0.5\":{\"dtype\":\"F32\","
                     "\"extra\":-1.5,\"shape\":[2],\"more\":[-1,0.5],\"data_offsets\":[0,8]}}",
                     data, 8, "w-2.5e1\"0.5", "name with numbers");
    /* An escaped backslash followed by "u0000" is no NUL: the name is a\u0000 with a real backslash. */
    check_opens_with("{\"a\\\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4, "a\\u0000",
                     "name with a backslash");
}

static void test_bad_lengths(const char *dir) {
    qmm_safetensors *file = NULL;
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    CHECK_STATUS(qmm_safetensors_open_memory(tiny, sizeof tiny, &file), QMM_ERR_CORRUPT);
    CHECK(message_has("5 bytes"), "message: %s", qmm_last_error());
    CHECK_STATUS(qmm_safetensors_open_memory(tiny, 0, &file), QMM_ERR_CORRUPT);

    /* Header length 2^63, and one byte more than the file holds. */
    io_buf image = io_safetensors_image("{}", NULL, 0);
    for (int b = 0; b < 8; b++)
        image.data[b] = b == 7 ? 0x80 : 0;
    CHECK_STATUS(qmm_safetensors_open_memory(image.data, image.size, &file), QMM_ERR_CORRUPT);
    CHECK(message_has("9223372036854775808"), "message does not name the length: %s", qmm_last_error());
    image.data[7] = 0;
    image.data[0] = 3;
    CHECK_STATUS(qmm_safetensors_open_memory(image.data, image.size, &file), QMM_ERR_CORRUPT);
    image.data[0] = 2;
    CHECK_OK(qmm_safetensors_open_memory(image.data, image.size, &file));
    CHECK(file && qmm_safetensors_count(file) == 0, "empty header: count");
    qmm_safetensors_close(file);
    io_buf_free(&image);

    /* A header over the 100 MB limit, inside a sparse file that really is that large. */
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, "huge.safetensors");
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(fd >= 0, "cannot create %s", path);
    if (fd >= 0) {
        uint64_t length = 100000001;
        uint8_t prefix[9];
        for (int b = 0; b < 8; b++)
            prefix[b] = (uint8_t)(length >> (8 * b));
        prefix[8] = '{';
        CHECK(write(fd, prefix, 9) == 9 && ftruncate(fd, (off_t)(length + 8)) == 0, "cannot size %s", path);
        close(fd);
        CHECK_STATUS(qmm_safetensors_open(path, &file), QMM_ERR_CORRUPT);
        CHECK(message_has("100 MB"), "message: %s", qmm_last_error());
        remove(path);
    }
    CHECK_STATUS(qmm_safetensors_open(io_path(dir, "absent.safetensors"), &file), QMM_ERR_IO);
    CHECK(message_has("absent.safetensors"), "message does not name the file: %s", qmm_last_error());

    /* A FIFO: opening it for reading used to wait forever for a writer. The alarm turns a regression into
     * a failure (SIGALRM ends the test) instead of a hang. Directories are refused the same way. */
    snprintf(path, sizeof path, "%s/%s", dir, "fifo.safetensors");
    CHECK(mkfifo(path, 0644) == 0, "mkfifo %s", path);
    alarm(30);
    CHECK_STATUS(qmm_safetensors_open(path, &file), QMM_ERR_IO);
    CHECK(message_has("fifo.safetensors") && message_has("not a regular file"), "message: %s", qmm_last_error());
    alarm(0);
    remove(path);
    CHECK_STATUS(qmm_safetensors_open(dir, &file), QMM_ERR_IO);
    CHECK(message_has("not a regular file"), "message: %s", qmm_last_error());
}

/* ── written files are created 0666 and narrowed by the umask, like any other file ── */

static void test_umask(const char *dir) {
    float values[2] = {1, 2};
    qmm_tensor t = {.name = "w", .dtype = QMM_F32, .ndim = 1, .shape = {2}, .data = values, .nbytes = 8};
    const mode_t masks[3] = {022, 077, 002};
    for (int i = 0; i < 3; i++) {
        const char *path = io_path(dir, "mode.safetensors");
        mode_t old = umask(masks[i]);
        CHECK_OK(qmm_safetensors_write(path, &t, 1, NULL, NULL, 0));
        umask(old);
        struct stat info;
        CHECK(stat(path, &info) == 0 && (info.st_mode & 0777) == (0666 & ~masks[i]),
              "umask %03o: mode %03o, want %03o", (unsigned)masks[i], (unsigned)(info.st_mode & 0777),
              (unsigned)(0666 & ~masks[i]));
        remove(path);
    }
}

/* ── the writer refuses bad tensors and never leaves files behind ── */

/* A zero dimension makes an empty tensor whatever the other dimensions: written and read back with 0 bytes (the
 * product of the others used to be refused as an overflow first). */
static void test_zero_dimension(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, "empty.safetensors");
    const int64_t big = (int64_t)1 << 53;
    qmm_tensor t = {.name = "z", .dtype = QMM_F32, .ndim = 3, .shape = {big, big, 0}, .data = NULL, .nbytes = 0};
    CHECK_OK(qmm_safetensors_write(path, &t, 1, NULL, NULL, 0));
    qmm_safetensors *file = NULL;
    CHECK_OK(qmm_safetensors_open(path, &file));
    if (file) {
        qmm_tensor back;
        CHECK_OK(qmm_safetensors_find(file, "z", &back));
        CHECK(back.nbytes == 0 && back.ndim == 3 && back.shape[0] == big && back.shape[2] == 0,
              "zero dimension read back: nbytes %zu ndim %d", back.nbytes, back.ndim);
        qmm_safetensors_close(file);
    }
    remove(path);
}

static void test_write_errors(const char *dir) {
    float values[4] = {1, 2, 3, 4};
    qmm_tensor t = {.name = "w", .dtype = QMM_F32, .ndim = 1, .shape = {4}, .data = values, .nbytes = 16};
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, "out.safetensors");

    qmm_tensor wrong = t;
    wrong.nbytes = 12;
    CHECK_STATUS(qmm_safetensors_write(path, &wrong, 1, NULL, NULL, 0), QMM_ERR_SHAPE);
    CHECK(message_has("nbytes=12"), "message: %s", qmm_last_error());
    wrong = t;
    wrong.shape[0] = -4;
    CHECK_STATUS(qmm_safetensors_write(path, &wrong, 1, NULL, NULL, 0), QMM_ERR_SHAPE);
    wrong = t;
    wrong.name = "bad\xff";
    CHECK_STATUS(qmm_safetensors_write(path, &wrong, 1, NULL, NULL, 0), QMM_ERR_INVALID_ARGUMENT);
    wrong.name = "__metadata__";
    CHECK_STATUS(qmm_safetensors_write(path, &wrong, 1, NULL, NULL, 0), QMM_ERR_INVALID_ARGUMENT);
    qmm_tensor twice[2] = {t, t};
    CHECK_STATUS(qmm_safetensors_write(path, twice, 2, NULL, NULL, 0), QMM_ERR_INVALID_ARGUMENT);
    CHECK(message_has("twice"), "message: %s", qmm_last_error());
    const char *keys[2] = {"k", "k"}, *values_md[2] = {"1", "2"};
    CHECK_STATUS(qmm_safetensors_write(path, &t, 1, keys, values_md, 2), QMM_ERR_INVALID_ARGUMENT);
    CHECK(io_count_entries(dir) == 0, "failed writes left %d entries", io_count_entries(dir));

    /* A destination that exists as a directory or a FIFO (or a device, a socket) is refused before anything is
     * written: no temp file remains. A symbolic link is replaced, the link itself (its target keeps its bytes). */
    char blocker[1024];
    snprintf(blocker, sizeof blocker, "%s/%s", dir, "blocked.safetensors");
    CHECK(mkdir(blocker, 0755) == 0, "mkdir %s", blocker);
    CHECK(io_write_file(io_path(blocker, "inside"), "x", 1), "cannot fill %s", blocker);
    CHECK_STATUS(qmm_safetensors_write(blocker, &t, 1, NULL, NULL, 0), QMM_ERR_IO);
    CHECK(message_has("exists and is a directory, not a regular file"), "message: %s", qmm_last_error());
    CHECK(io_count_entries(dir) == 1, "after the refusal the directory has %d entries, want 1", io_count_entries(dir));
    io_remove_tree(blocker);
    char target[1024], link_path[1024], fifo[1024];
    snprintf(target, sizeof target, "%s/%s", dir, "target.txt");
    snprintf(link_path, sizeof link_path, "%s/%s", dir, "link.safetensors");
    snprintf(fifo, sizeof fifo, "%s/%s", dir, "fifo.safetensors");
    CHECK(io_write_file(target, "keep", 4), "cannot write %s", target);
    CHECK(symlink(target, link_path) == 0, "symlink %s", link_path);
    CHECK_OK(qmm_safetensors_write(link_path, &t, 1, NULL, NULL, 0));
    struct stat link_info;
    CHECK(lstat(link_path, &link_info) == 0 && S_ISREG(link_info.st_mode), "the link was replaced by the file");
    char kept[8] = "";
    FILE *target_file = fopen(target, "rb");
    CHECK(target_file && fread(kept, 1, sizeof kept, target_file) == 4 && memcmp(kept, "keep", 4) == 0,
          "the link's target keeps its bytes");
    if (target_file) fclose(target_file);
    CHECK(io_count_entries(dir) == 2, "after the write the directory has %d entries, want 2", io_count_entries(dir));
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
    CHECK_STATUS(qmm_safetensors_write(fifo, &t, 1, NULL, NULL, 0), QMM_ERR_IO);
    CHECK(message_has("exists and is a FIFO, not a regular file: writing it would replace it") && message_has(fifo),
          "message: %s", qmm_last_error());
    CHECK(io_count_entries(dir) == 3, "after the refusal the directory has %d entries, want 3", io_count_entries(dir));
    unlink(fifo);
    unlink(link_path);
    unlink(target);

    /* A directory that does not exist. */
    CHECK_STATUS(qmm_safetensors_write(io_path(dir, "no/such/dir/x.safetensors"), &t, 1, NULL, NULL, 0), QMM_ERR_IO);
    CHECK(io_count_entries(dir) == 0, "the directory has %d entries, want 0", io_count_entries(dir));

    /* A valid write over an existing file replaces it. */
    CHECK_OK(qmm_safetensors_write(path, &t, 1, NULL, NULL, 0));
    values[0] = 9;
    CHECK_OK(qmm_safetensors_write(path, &t, 1, NULL, NULL, 0));
    qmm_safetensors *file = NULL;
    CHECK_OK(qmm_safetensors_open(path, &file));
    qmm_tensor got;
    if (file && qmm_safetensors_find(file, "w", &got) == QMM_OK)
        CHECK(memcmp(got.data, values, 16) == 0, "the second write did not replace the first");
    qmm_safetensors_close(file);
    CHECK(io_count_entries(dir) == 1, "the directory has %d entries, want 1", io_count_entries(dir));
    remove(path);
}

int main(void) {
    char *dir = io_temp_dir("safetensors");
    CHECK(dir != NULL, "mkdtemp failed");
    if (dir) {
        test_round_trip(dir);
        test_mlx_layout();
        test_bad_headers();
        test_bad_lengths(dir);
        test_write_errors(dir);
        test_zero_dimension(dir);
        test_umask(dir);
        io_remove_tree(dir);
        free(dir);
    }
    return check_finish("io-safetensors");
}
