/* wire_int.h - what the wire's files share: wire.c (codes, frames, the
 * reader), wire_write.c (the writer, the blocking helpers) and wire_sock.c
 * (the Unix sockets). Not part of wire.h's API; hidden in the client
 * libraries like every common object. */
#ifndef WIRE_INT_H
#define WIRE_INT_H

#include "wire.h"

#include <stddef.h>
#include <stdint.h>

#define HW_SCM_MAX_FD 253 /* kernel's SCM_MAX_FD */

_Static_assert(HW_FDS_PER_MSG <= HW_SCM_MAX_FD, "fd batch over the kernel cap");

/* Formats an error message into err (errlen bytes; err may be NULL);
 * errno is kept. */
__attribute__((format(printf, 3, 4))) void hw_seterr(char *err, size_t errlen, const char *fmt, ...);

/* Closes every fd >= 0 of fds[0..n); errno is kept. */
void hw_close_fds(const int *fds, size_t n);

/* The wire's limits (HW_FRAME_MAX, HW_FDS_MAX), the same on both sides: 0,
 * or HW_ETOOBIG / HW_ETOOMANYFDS with a sentence that `who` starts. */
int hw_check_limits(const char *who, uint64_t len, uint64_t nfds, char *err, size_t errlen);

static inline size_t hw_min_sz(size_t a, size_t b) { return a < b ? a : b; }

#endif
