/*
 * test_status.c — the message helpers of status.c: qmm_utf8_char, qmm_printable_char and qmm_printable (untrusted
 * text made printable: printable UTF-8 kept, control characters, invalid UTF-8 and backslashes escaped, a cut only
 * between whole characters), and qmm_error cutting an over-long message between whole characters.
 */
#include "check.h"
#include "internal.h"

#include <string.h>

/* qmm_printable of a C string into a buffer of size bytes must read want. */
static void expect_printable(const char *text, size_t size, const char *want) {
    char buffer[256];
    const char *got = qmm_printable(text, strlen(text), buffer, size);
    CHECK(got == buffer && strcmp(got, want) == 0, "qmm_printable into %zu bytes: got \"%s\", want \"%s\"", size, got,
          want);
}

static void test_utf8_char(void) {
    uint32_t code = 0;
    CHECK(qmm_utf8_char("A", 1, &code) == 1 && code == 'A', "ASCII");
    CHECK(qmm_utf8_char("\xc3\xa9", 2, &code) == 2 && code == 0xE9, "U+00E9");
    CHECK(qmm_utf8_char("\xe6\xa8\xa1", 3, &code) == 3 && code == 0x6A21, "U+6A21");
    CHECK(qmm_utf8_char("\xf0\x9f\x98\x80", 4, &code) == 4 && code == 0x1F600, "U+1F600");
    CHECK(qmm_utf8_char("\xe6\xa8\xa1", 2, NULL) == 0, "a sequence cut short by size");
    CHECK(qmm_utf8_char("\x80", 1, NULL) == 0, "a stray continuation byte");
    CHECK(qmm_utf8_char("\xc0\xaf", 2, NULL) == 0, "an overlong '/'");
    CHECK(qmm_utf8_char("\xed\xa0\x80", 3, NULL) == 0, "a surrogate");
    CHECK(qmm_utf8_char("\xf4\x90\x80\x80", 4, NULL) == 0, "past U+10FFFF");
    CHECK(qmm_utf8_char("\xff", 1, NULL) == 0, "0xFF");
    CHECK(qmm_utf8_char("", 0, NULL) == 0, "nothing");
}

static void test_printable(void) {
    char nul_name[] = "a\0b";
    char buffer[64];
    CHECK(strcmp(qmm_printable(nul_name, 3, buffer, sizeof buffer), "a\\x00b") == 0, "NUL: %s", buffer);
    expect_printable("blk.0.attn_q", 64, "blk.0.attn_q");
    expect_printable("a\\b", 64, "a\\\\b");                              /* the escape character itself */
    expect_printable("red \x1b[31m tab\tnl\n", 64, "red \\x1b[31m tab\\x09nl\\x0a"); /* C0 */
    expect_printable("del\x7f", 64, "del\\x7f");
    expect_printable("csi\xc2\x9b", 64, "csi\\xc2\\x9b");                 /* C1, well-formed UTF-8 */
    expect_printable("\xe6\xa8\xa1\xe5\x9e\x8b.weight", 64, "\xe6\xa8\xa1\xe5\x9e\x8b.weight"); /* kept */
    expect_printable("caf\xc3\xa9 \xf0\x9f\x98\x80", 64, "caf\xc3\xa9 \xf0\x9f\x98\x80");
    expect_printable("rlo\xe2\x80\xaegpj.exe", 64, "rlo\\xe2\\x80\\xaegpj.exe"); /* U+202E: reorders the display */
    expect_printable("ls\xe2\x80\xa8", 64, "ls\\xe2\\x80\\xa8");          /* U+2028 line separator */
    expect_printable("alm\xd8\x9c", 64, "alm\\xd8\\x9c");              /* U+061C arabic letter mark: bidi too */
    expect_printable("lri\xe2\x81\xa6", 64, "lri\\xe2\\x81\\xa6");        /* U+2066 left-to-right isolate */
    expect_printable("arabic \xd8\xb9", 64, "arabic \xd8\xb9");        /* U+0639, a letter: kept */
    /* characters shown as nothing (Default_Ignorable_Code_Point): a name would read as another name */
    expect_printable("\xef\xbb\xbfseed", 64, "\\xef\\xbb\\xbfseed");        /* U+FEFF byte order mark */
    expect_printable("q_proj\xe2\x80\x8b", 64, "q_proj\\xe2\\x80\\x8b");    /* U+200B zero width space */
    expect_printable("zwj\xe2\x80\x8d", 64, "zwj\\xe2\\x80\\x8d");          /* U+200D zero width joiner */
    expect_printable("soft\xc2\xad", 64, "soft\\xc2\\xad");                /* U+00AD soft hyphen */
    expect_printable("vs\xef\xb8\x8f", 64, "vs\\xef\\xb8\\x8f");            /* U+FE0F variation selector-16 */
    expect_printable("tag\xf3\xa0\x80\x81", 64, "tag\\xf3\\xa0\\x80\\x81"); /* U+E0001 language tag */
    expect_printable("filler\xe3\x85\xa4", 64, "filler\\xe3\\x85\\xa4");    /* U+3164 hangul filler */
    expect_printable("\xc2\xac \xe2\x81\xb0 \xef\xb8\x90", 64, "\xc2\xac \xe2\x81\xb0 \xef\xb8\x90"); /* their neighbours: kept */
    expect_printable("bad\xff\xfe", 64, "bad\\xff\\xfe");
    expect_printable("cut\xe6\xa8", 64, "cut\\xe6\\xa8");                 /* a character cut short */
    expect_printable("over\xc0\xaf", 64, "over\\xc0\\xaf");
    /* too long for the buffer: "..." after whole characters, never inside one */
    expect_printable("abcdefghij", 10, "abcdef...");
    expect_printable("\xe6\xa8\xa1\xe6\xa8\xa1\xe6\xa8\xa1\xe6\xa8\xa1", 12, "\xe6\xa8\xa1\xe6\xa8\xa1...");
    expect_printable("\x1b\x1b\x1b", 12, "\\x1b\\x1b...");
    expect_printable("anything", 4, ""); /* no room for a character and "..." */
    /* a text that fits exactly is shown whole: "..." is kept for a text that is cut */
    expect_printable("abcdefghi", 10, "abcdefghi");
    expect_printable("\xe6\xa8\xa1\xe6\xa8\xa1\xe6\xa8\xa1", 10, "\xe6\xa8\xa1\xe6\xa8\xa1\xe6\xa8\xa1");
    expect_printable("abcdefgh\x1b", 13, "abcdefgh\\x1b");
    expect_printable("abcdefgh\x1b", 12, "abcdefgh...");
    expect_printable("abcdef\\", 9, "abcdef\\\\");
    expect_printable("abcdef\\", 8, "abcd...");
}

static void test_error_cut(void) {
    /* a message longer than the 16383 bytes kept: cut between whole characters, the cut marked with "…" */
    char name[16600];
    size_t at = 0;
    name[at++] = 'x';
    while (at + 3 < sizeof name) {
        memcpy(name + at, "\xe6\xa8\xa1", 3);
        at += 3;
    }
    name[at] = '\0';
    for (int shift = 0; shift < 3; shift++) {
        qmm_error(QMM_ERR_NOT_FOUND, "%.*s%s", shift, "ab", name);
        const char *message = qmm_last_error();
        const size_t length = strlen(message);
        CHECK(length >= 16380 && length <= 16383, "shift %d: %zu bytes kept", shift, length);
        CHECK(length >= 3 && strcmp(message + length - 3, "\xe2\x80\xa6") == 0, "shift %d: the cut ends in \"…\"", shift);
        size_t i = 0;
        while (i < length) {
            const size_t step = qmm_utf8_char(message + i, length - i, NULL);
            if (step == 0) break;
            i += step;
        }
        CHECK(i == length, "shift %d: the message is whole UTF-8 characters (stopped at byte %zu of %zu)", shift, i,
              length);
    }
    /* a path of PATH_MAX bytes and its rule fit whole (the CLI echoes paths in messages) */
    char path[4097];
    memset(path, 'p', sizeof path - 1);
    path[sizeof path - 1] = '\0';
    qmm_error(QMM_ERR_IO, "--json '%s': cannot create it: File name too long", path);
    CHECK(strstr(qmm_last_error(), "File name too long") != NULL, "a 4096-byte path keeps its rule");
    qmm_error(QMM_ERR_IO, "--json '%s': %s", path, qmm_last_error()); /* wrapped again, as the CLI does */
    CHECK(strstr(qmm_last_error(), "File name too long") != NULL, "a 4096-byte path named twice keeps its rule");
    qmm_error(QMM_ERR_NOT_FOUND, "short \xe6\xa8\xa1");
    CHECK(strcmp(qmm_last_error(), "short \xe6\xa8\xa1") == 0, "a short message is kept whole: %s", qmm_last_error());
}

int main(void) {
    test_utf8_char();
    test_printable();
    test_error_cut();
    return check_finish("test_status");
}
