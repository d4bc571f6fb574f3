/* closer.h - threads that close file descriptors off the event loop.
 *
 * A descriptor a client passed can be a socket whose close() blocks for as
 * long as the client chose (SO_LINGER with unsent data). heapd's loop hands
 * every received descriptor here instead of closing it. Each descriptor is
 * tagged with its owner (a uid): at most one thread closes for a given owner
 * at a time, so one owner's blocking closes delay only its own descriptors.
 * The threads are detached: hd_closer_stop never waits for a close in
 * progress, and the last thread to leave frees the closer. It knows no loop:
 * after each close it calls `notify(arg)` (from a closer thread, under the
 * closer's lock; e.g. uv_async_send), and the owner collects the owners of
 * the closed descriptors with hd_closer_take_done. */
#ifndef HEAPD_CLOSER_H
#define HEAPD_CLOSER_H

#include <stddef.h>
#include <sys/types.h>

#define HD_CLOSER_THREADS 4

typedef struct hd_closer hd_closer;

/* Starts the threads; NULL if none could start (or out of memory). */
hd_closer *hd_closer_start(void (*notify)(void *arg), void *arg);
/* Queues fd (owned by `owner`) for closing: 0, or -1 (out of memory: the
 * caller still owns fd). */
int hd_closer_push(hd_closer *k, int fd, uid_t owner);
/* Moves up to max owners of descriptors closed since the last call into out;
 * returns how many. */
size_t hd_closer_take_done(hd_closer *k, uid_t *out, size_t max);
/* The threads leave once their current close returns; notify is not called
 * again; queued descriptors stay open (the process is about to exit: exit
 * closes them without lingering). k is freed by the last thread. */
void hd_closer_stop(hd_closer *k);

#endif
