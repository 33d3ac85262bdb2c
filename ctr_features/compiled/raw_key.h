/* The key of a categorical value, for C: the one definition of ctr_features/compiled/value_table.py's
 * `RawKeys` (SHORT, EMPTY_KEY) on this side. A value of up to RAW_KEY_BYTES ASCII bytes, none of them a NUL
 * or a 0x01, is its bytes as a little-endian uint64, zero-padded; "" is eight 0x01 bytes (RAW_EMPTY_KEY),
 * which no other value's key holds. The compiled table's native code (_table_native.c) looks keys up, and
 * the native scan of REST bodies (serving/codecs/_scan_native.c) produces them.
 */
#ifndef CTR_RAW_KEY_H
#define CTR_RAW_KEY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define RAW_KEY_BYTES 8
static const uint64_t RAW_EMPTY_KEY = 0x0101010101010101ULL;

/* Whether a byte may sit in a keyed value: ASCII, and neither a NUL (it would cut the value) nor a 0x01
 * (a value of them would read as ""). */
static inline int raw_key_byte(unsigned char c) { return c >= 2 && c < 0x80; }

/* The key of `len` (at most RAW_KEY_BYTES) bytes that each pass raw_key_byte. */
static inline uint64_t raw_key(const unsigned char *c, size_t len) {
    uint64_t key = 0;
    for (size_t j = 0; j < len; j++) key |= (uint64_t)c[j] << (8 * j);
    return len ? key : RAW_EMPTY_KEY;
}

/* raw_key(c, RAW_KEY_BYTES) in one load (a little-endian uint64 of the 8 bytes). */
static inline uint64_t raw_key8(const unsigned char *c) {
    uint64_t key;
    memcpy(&key, c, RAW_KEY_BYTES);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    key = __builtin_bswap64(key);
#endif
    return key;
}

#endif
