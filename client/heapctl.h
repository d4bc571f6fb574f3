/* heapctl.h - what heapctl's files share (the program's, not libheapc's). */
#ifndef HEAPCTL_H
#define HEAPCTL_H

#include "heapc.h"

#include <stdio.h>

/* heapctl_prom.c: every family of `heapctl metrics` for s to f (s NULL: heapd
 * could not be reached: heapd_up 0 only). */
void heapctl_prom_write(FILE *f, const heapc_daemon_stats *s);

#endif
