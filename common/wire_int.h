/* wire_int.h - what wire.c and wire_sock.c share (not part of wire.h's API;
 * hidden in the client libraries like every common object). */
#ifndef WIRE_INT_H
#define WIRE_INT_H

#include "wire.h"

#include <stddef.h>

/* Formats an error message into err (errlen bytes; err may be NULL);
 * errno is kept. */
__attribute__((format(printf, 3, 4))) void hw_seterr(char *err, size_t errlen, const char *fmt, ...);

#endif
