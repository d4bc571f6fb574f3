/* server_sink.c - a connection as a frame sink (server.h: hd_conn_sink;
 * frame_sink.h): frames and fds go to hd_conn_send, Hello to hd_conn_admit,
 * closing to hd_conn_close_after_flush. */
#include "server.h"

static void conn_sink_send(void *data, uint64_t id, const void *msg, size_t len, hd_frame_sink_pack_fn pack, int *fds,
                           size_t nfds)
{
    (void)id;
    hd_conn_send(data, msg, len, pack, fds, nfds);
}

static void conn_sink_admit(void *data) { hd_conn_admit(data); }
static void conn_sink_close(void *data) { hd_conn_close_after_flush(data); }

static const hd_frame_sink_ops conn_sink_ops = {conn_sink_send, conn_sink_admit, conn_sink_close};

hd_frame_sink hd_conn_sink(hd_conn *c) { return (hd_frame_sink){&conn_sink_ops, c}; }
