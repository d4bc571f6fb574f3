/* ring_sink.c - a request ring in front of another frame sink (see
 * ring_sink.h). */
#include "ring_sink.h"

static void ring_sink_send(void *data, uint64_t id, const void *msg, size_t len, hd_frame_sink_pack_fn pack, int *fds,
                           size_t nfds)
{
    hd_ring_sink *rs = data;
    /* 0: in the ring (or swallowed by a stopped one); 1: the marker is in
     * the ring and the frame goes on the socket; -1: no request of the ring. */
    if (id && hd_ring_answer(rs->ring, id, msg, len, pack, nfds) == 0)
        return;
    hd_frame_sink_send(&rs->next, id, msg, len, pack, fds, nfds);
}

static void ring_sink_admit(void *data)
{
    hd_ring_sink *rs = data;
    hd_frame_sink_admit(&rs->next);
}

static void ring_sink_close(void *data)
{
    hd_ring_sink *rs = data;
    hd_frame_sink_close_after_flush(&rs->next);
}

static const hd_frame_sink_ops ring_sink_ops = {ring_sink_send, ring_sink_admit, ring_sink_close};

hd_frame_sink hd_ring_sink_init(hd_ring_sink *rs, hd_ring *r, hd_frame_sink next)
{
    rs->ring = r;
    rs->next = next;
    return (hd_frame_sink){&ring_sink_ops, rs};
}
