/* io_test_util.c — see io_test_util.h. */
#define _GNU_SOURCE
#include "io_test_util.h"

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *io_temp_dir(const char *tag) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    size_t n = strlen(base) + strlen(tag) + 32;
    char *path = malloc(n);
    if (!path) return NULL;
    snprintf(path, n, "%s/qmm-%s-XXXXXX", base, tag);
    if (!mkdtemp(path)) {
        free(path);
        return NULL;
    }
    return path;
}

static int remove_entry(const char *path, const struct stat *info, int flag, struct FTW *ftw) {
    (void)info, (void)flag, (void)ftw;
    return remove(path);
}

void io_remove_tree(const char *path) {
    if (path) nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *io_path(const char *dir, const char *name) {
    static char buffers[8][4096];
    static int next;
    char *out = buffers[next++ & 7];
    snprintf(out, sizeof buffers[0], "%s/%s", dir, name);
    return out;
}

bool io_write_file(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = size == 0 || fwrite(bytes, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

char *io_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        text = NULL;
    }
    fclose(f);
    if (text) {
        text[n] = '\0';
        if (size) *size = (size_t)n;
    }
    return text;
}

int io_count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) count++;
    closedir(d);
    return count;
}

bool io_exists(const char *path) { return access(path, F_OK) == 0; }

void io_put(io_buf *buf, const void *bytes, size_t size) {
    if (buf->size + size > buf->capacity) {
        size_t capacity = buf->capacity ? buf->capacity : 256;
        while (capacity < buf->size + size)
            capacity *= 2;
        uint8_t *grown = realloc(buf->data, capacity);
        if (!grown) abort(); /* test helper: out of memory ends the test run */
        buf->data = grown;
        buf->capacity = capacity;
    }
    if (size) memcpy(buf->data + buf->size, bytes, size);
    buf->size += size;
}
void io_put_u8(io_buf *buf, uint8_t value) { io_put(buf, &value, 1); }
void io_put_u16(io_buf *buf, uint16_t value) {
    uint8_t b[2] = {(uint8_t)value, (uint8_t)(value >> 8)};
    io_put(buf, b, 2);
}
void io_put_u32(io_buf *buf, uint32_t value) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(value >> (8 * i));
    io_put(buf, b, 4);
}
void io_put_u64(io_buf *buf, uint64_t value) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(value >> (8 * i));
    io_put(buf, b, 8);
}
void io_put_gguf_string(io_buf *buf, const char *text) {
    io_put_u64(buf, strlen(text));
    io_put(buf, text, strlen(text));
}
void io_pad(io_buf *buf, size_t alignment) {
    while (buf->size % alignment)
        io_put_u8(buf, 0);
}
void io_buf_free(io_buf *buf) {
    free(buf->data);
    buf->data = NULL;
    buf->size = buf->capacity = 0;
}

io_buf io_safetensors_image(const char *header, const void *data, size_t data_size) {
    io_buf buf = {0};
    io_put_u64(&buf, strlen(header));
    io_put(&buf, header, strlen(header));
    io_put(&buf, data, data_size);
    return buf;
}
