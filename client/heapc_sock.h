/* heapc_sock.h - libheapc's socket transport (issue 26), private to
 * libheapc. Prefix hcs_.
 *
 * The connection's Unix socket as an hcx transport (heapc_xport.h): blocking
 * frames (common/wire.c's hw_send_frame / hw_recv_frame), each decoded into a
 * heapd.Frame. It carries every request; the request ring wraps it. */
#ifndef HEAPC_SOCK_H
#define HEAPC_SOCK_H

#include <stddef.h>
#include <stdint.h>

#include "heapc_xport.h"
#include "wire.h"

/* fd < 0 <=> not connected (then rd holds nothing). stall_ms > 0: how long
 * the rest of a frame may take once part of it has come (heapc.h:
 * HEAPC_FRAME_TIMEOUT_MS, $HEAPC_FRAME_TIMEOUT_MS at hcs_init). */
typedef struct hcs_sock {
    int fd;
    hw_reader rd;
    int stall_ms;
} hcs_sock;

/* The operations; their data is an hcs_sock. */
extern const hcx_ops hcs_ops;

/* Not connected; stall_ms from the environment. */
void hcs_init(hcs_sock *s);
/* Connects to heapd at path: 0, or -1 with why (it names the path and the
 * fix). */
int hcs_connect(hcs_sock *s, const char *path, char *why, size_t len);
/* Closes the socket, drops what the reader holds; back to hcs_init's state. */
void hcs_close(hcs_sock *s);
/* heapd's last words: 1 if an unsolicited Error with a message is already on
 * the socket (never waits), with its ErrCode in *code and its message in msg;
 * else 0. */
int hcs_last_words(hcs_sock *s, int *code, char *msg, size_t len);

#endif
