/* pbstr.h - finds a NUL byte inside a protobuf string field.
 *
 * protobuf-c hands string fields over as C strings: "a\0b" arrives as "a",
 * so a heap name or job with an embedded NUL would silently name another
 * one. This walks the encoded message with the generated descriptors (every
 * nested message too) and reports the first string field holding a NUL.
 * Pure: no allocation, no I/O. */
#ifndef HEAPD_PBSTR_H
#define HEAPD_PBSTR_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* 1 when a string field of the message `d` encoded in data[0, len) (at any
 * depth) contains a NUL byte, with *field set to its name; 0 otherwise
 * (malformed input included: the decoder reports that). */
int hd_pbstr_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, const char **field);

#endif
