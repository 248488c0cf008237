/*
 * wire.h - fixed-width little-endian fields of MACO's wire formats (internal).
 *
 * Everything that crosses a process boundary (unique id, hellos, frames, memory handles) is
 * written with these, byte by byte, so the format does not depend on the host's byte order
 * or struct padding (docs/design.md, "Bootstrap wire formats").
 */
#ifndef MACO_WIRE_H
#define MACO_WIRE_H

#include <stdint.h>

static inline void maco__put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void maco__put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void maco__put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t maco__get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t maco__get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static inline uint64_t maco__get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* FNV-1a over a string (nonces derived from addresses, node hashes). */
static inline uint64_t maco__fnv1a(const char *text)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = text; *p; p++) {
        h ^= (uint8_t)*p;
        h *= 1099511628211ull;
    }
    return h;
}

#endif /* MACO_WIRE_H */
