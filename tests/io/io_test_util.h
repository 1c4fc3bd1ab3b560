/*
 * io_test_util.h — helpers for the checkpoint tests: temporary directories (mkdtemp, removed at the
 * end), whole-file writes, directory listings, and a growable byte buffer for hand-built files.
 */
#ifndef QMM_IO_TEST_UTIL_H
#define QMM_IO_TEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A fresh directory under $TMPDIR (or /tmp); NULL on failure. Free with io_remove_tree + free. */
char *io_temp_dir(const char *tag);
/* Removes path and everything below it. */
void io_remove_tree(const char *path);
/* "dir/name" in a static rotating buffer (valid for the next 7 calls). */
const char *io_path(const char *dir, const char *name);
bool io_write_file(const char *path, const void *bytes, size_t size);
/* Reads a whole file (NUL-terminated); NULL on failure. */
char *io_read_file(const char *path, size_t *size);
/* Entries of dir other than "." and ".."; -1 when it cannot be listed. */
int io_count_entries(const char *dir);
bool io_exists(const char *path);

typedef struct io_buf {
    uint8_t *data;
    size_t size, capacity;
} io_buf;
void io_put(io_buf *buf, const void *bytes, size_t size);
void io_put_u8(io_buf *buf, uint8_t value);
void io_put_u16(io_buf *buf, uint16_t value);
void io_put_u32(io_buf *buf, uint32_t value);
void io_put_u64(io_buf *buf, uint64_t value);
/* GGUF string: u64 length + bytes. */
void io_put_gguf_string(io_buf *buf, const char *text);
void io_pad(io_buf *buf, size_t alignment);
void io_buf_free(io_buf *buf);

/* A safetensors image: u64 header length, the header text as given (not padded), then data. */
io_buf io_safetensors_image(const char *header, const void *data, size_t data_size);

#endif
