/* hash.h - hashes for the open-addressing tables of the tokenizer and the BPE trainer. */
#ifndef INFERD_BASE_HASH_H
#define INFERD_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a over bytes, with a final fold of the high bits into the low ones: tables index by
 * the low bits (a power-of-two mask), where plain FNV-1a mixes the last bytes poorly. */
static inline uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* A 64-bit key's mix (the murmur3 finalizer's first half). */
static inline uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

#endif
