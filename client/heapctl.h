/* heapctl.h - what heapctl's files share (the program's, not libheapc's). */
#ifndef HEAPCTL_H
#define HEAPCTL_H

#include "heapc.h"

#include <stdio.h>

/* heapctl_prom.c: every family of `heapctl metrics` for s to f (s NULL: heapd
 * could not be reached: heapd_up 0 only). */
void heapctl_prom_write(FILE *f, const heapc_daemon_stats *s);
/* The same into `file`, replaced atomically so that node_exporter's textfile
 * collector never reads half a file: a temporary file from mkstemp (O_EXCL:
 * never a file, link or FIFO another user planted) in file's directory,
 * chmod 0644, renamed over file. 0, or -1 after saying why on stderr. */
int heapctl_prom_file(const char *file, const heapc_daemon_stats *s);

/* heapctl_json.c: s as a JSON string on stdout (escaped; invalid UTF-8 as
 * U+FFFD), and the statistics as one JSON object (full: every figure and
 * rank; else the `heaps` list's). */
void heapctl_json_str(const char *s);
/* A heap's HEAPC_STATE_* (issue 30) as its name: "active", "releasing",
 * "released", "restoring"; "unknown" for another value. */
const char *heapctl_state_name(uint32_t state);
void heapctl_json_stats(const heapc_daemon_stats *s, int full);

#endif
