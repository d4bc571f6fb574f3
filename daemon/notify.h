/* notify.h - the systemd notification protocol (sd_notify), without
 * libsystemd: one datagram to $NOTIFY_SOCKET. Does nothing (returns 0) when
 * NOTIFY_SOCKET is unset, so heapd runs the same outside systemd. */
#ifndef HEAPD_NOTIFY_H
#define HEAPD_NOTIFY_H

/* Sends `state` ("READY=1\nSTATUS=..."). Returns 1 if sent, 0 if there is
 * no NOTIFY_SOCKET, -1 on error (errno set). */
int hd_notify(const char *state);

#endif
