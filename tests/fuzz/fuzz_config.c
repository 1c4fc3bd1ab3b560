/*
 * fuzz_config.c — libFuzzer target: qmm_config_parse on arbitrary bytes (not NUL-terminated: libFuzzer
 * hands over an exactly sized buffer, so any read past size is caught by AddressSanitizer). A success
 * must give 0/0 or a supported format.
 */
#include "fuzz_message.h"
#include "qmm.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int bits = -1, group_size = -1;
    qmm_status status = qmm_config_parse((const char *)data, size, &bits, &group_size);
    if (status != QMM_OK) {
        fuzz_check_message();
        return 0;
    }
    if (!(bits == 0 && group_size == 0) && qmm_format_validate(bits, group_size) != QMM_OK) abort();
    return 0;
}
