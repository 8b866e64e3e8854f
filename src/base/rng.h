/* rng.h - splitmix64 (Steele, Lea, Flood 2014): the one mixing function behind sampling
 * randomness, request ids and default seeds, and the synthetic models' weights.  Fast and
 * statistically good; not for secrets. */
#ifndef INFERD_BASE_RNG_H
#define INFERD_BASE_RNG_H

#include <stdint.h>

#define RNG_GOLDEN 0x9E3779B97F4A7C15ull

/* The splitmix64 output for state x: a pure function, so randomness can be keyed by data
 * (a seed and a position) instead of carried along. */
static inline uint64_t rng_splitmix64(uint64_t x)
{
    x += RNG_GOLDEN;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The next value of the sequence *state walks (and the step). */
static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t r = rng_splitmix64(*state);
    *state += RNG_GOLDEN;
    return r;
}

/* A uniform double in [0, 1) from 53 random bits. */
static inline double rng_unit(uint64_t bits) { return (double)(bits >> 11) * 0x1.0p-53; }

#endif
