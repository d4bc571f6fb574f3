/*
 * wire.h - framing for the heapd Unix-socket protocol (SOCK_STREAM).
 *
 * Used by the daemon (nonblocking sockets driven by uv_poll_t: hw_read and
 * hw_writer_flush never block) and by the client library (blocking sockets:
 * hw_send_frame, hw_recv_frame). Plain sendmsg/recvmsg, no libuv here.
 *
 * Frame format
 *   8-byte header: u32 payload length, u32 fd count (both little-endian),
 *   then the payload bytes. The frame's fds travel as SCM_RIGHTS ancillary
 *   data attached to the frame's own bytes. The kernel caps fds per sendmsg
 *   (SCM_MAX_FD = 253), so the sender spreads them over several sendmsg calls
 *   (at most HW_FDS_PER_MSG per call, each call carrying at least one byte of
 *   the frame and no byte of any other frame). A Unix stream socket hands out
 *   a message's fds with the read that consumes its first bytes and ends that
 *   read at the end of that message, so fds received by one recvmsg belong to
 *   the frame that holds the last byte of that read; the receiver collects
 *   every fd that arrives while a frame's bytes are being read.
 *
 * What this module promises
 *   - Limits are checked from the header alone, before any allocation: a
 *     payload longer than HW_FRAME_MAX or more than HW_FDS_MAX fds is an error
 *     (HW_ETOOBIG, HW_ETOOMANYFDS) and nothing of that size is allocated.
 *     The sender refuses the same frames (nothing is sent).
 *   - An empty payload (length 0) is a valid frame.
 *   - Every received fd has O_CLOEXEC (MSG_CMSG_CLOEXEC).
 *   - fds never leak: if a frame completes with a different number of fds
 *     than its header announced, if fds arrive with no frame to hold them, or
 *     if the kernel truncates the ancillary data (MSG_CTRUNC), every such fd
 *     is closed and the read fails. The framing is then broken: the reader
 *     stays failed and the caller must close the connection.
 *   - Several frames in one read are kept (leftover bytes are buffered) and a
 *     frame may arrive split over any number of reads. Reads go into a 64 KiB
 *     buffer; the rest of a large payload is read straight into the frame.
 *   - Writes use MSG_NOSIGNAL (a closed peer is an EPIPE error, never SIGPIPE).
 *   - The library never prints and never exits. Every function that takes
 *     (err, errlen) writes a sentence saying what happened there on error
 *     (err may be NULL or errlen 0). On HW_ESYS errno is preserved.
 *
 * Return codes: HW_FRAME (1), HW_AGAIN (0), HW_EOF (2) are not errors; every
 * error is negative (HW_E*), so `rc < 0` is the error test. Functions that
 * return an fd return it (>= 0) or a negative HW_E* code.
 */
#ifndef HEAPD_WIRE_H
#define HEAPD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define HW_HDR_SIZE    8u          /* u32 length + u32 nfds, little-endian */
#define HW_FRAME_MAX   (4u << 20)  /* max payload bytes of one frame (4 MiB) */
#define HW_FDS_MAX     1024u       /* max fds attached to one frame */
#define HW_FDS_PER_MSG 250u        /* fds per sendmsg (kernel cap: 253) */
#define HW_READ_BUF    (64u << 10) /* reader buffer size */
/* Issue 27: most frees one Alloc carries (Alloc.frees; more: a Free). */
#define HW_ALLOC_FREES_MAX 256u
/* Issue 28: the most (size, offset) pairs of replica decisions one Alloc or
 * Free carries (Alloc.decided). */
#define HW_DECIDED_MAX 4096u

/* Every return code, one table: X(name, value, description). HW_AGAIN,
 * HW_FRAME and HW_EOF are not errors; every error is negative. The table
 * makes the constants (an enum), hw_strerror and hw_errdesc. */
#define HW_CODE_MAP(X)                                                                                                 \
    X(HW_AGAIN, 0, "need more bytes: wait for readability")                                                            \
    X(HW_FRAME, 1, "a complete frame is in *out")                                                                      \
    X(HW_EOF, 2, "peer closed cleanly between frames")                                                                 \
    X(HW_ESYS, -1, "a system call failed; errno is preserved")                                                         \
    X(HW_ENOMEM, -2, "out of memory")                                                                                  \
    X(HW_EINVAL, -3, "bad argument")                                                                                   \
    X(HW_ETOOBIG, -4, "payload longer than HW_FRAME_MAX")                                                              \
    X(HW_ETOOMANYFDS, -5, "more than HW_FDS_MAX fds in a frame")                                                       \
    X(HW_EFDS, -6, "fds do not match the frame (stray, missing, extra)")                                               \
    X(HW_ECTRUNC, -7, "ancillary data truncated (MSG_CTRUNC)")                                                         \
    X(HW_EPARTIAL, -8, "connection closed in the middle of a frame")                                                   \
    X(HW_ETIMEDOUT, -9, "hw_recv_frame: no frame within the timeout")                                                  \
    X(HW_EADDRINUSE, -10, "hw_listen_unix: the path is taken")                                                         \
    X(HW_ENAMETOOLONG, -11, "socket path does not fit sun_path")                                                       \
    X(HW_EBROKEN, -12, "reader already failed earlier")

enum {
#define HW_CODE_ENUM(name, value, desc) name = value,
    HW_CODE_MAP(HW_CODE_ENUM)
#undef HW_CODE_ENUM
};

/* Short name of a return code ("HW_ETOOBIG"), for logs. Never NULL
 * ("HW_E(unknown)" for a value not in the table). */
const char *hw_strerror(int code);
/* The code's one-line description (the table's); never NULL. */
const char *hw_errdesc(int code);

/* ---- received frames ------------------------------------------------- */

typedef struct hw_frame {
    unsigned char *data; /* malloc'd payload, never NULL; data[len] == 0 */
    size_t len;
    int *fds; /* malloc'd (NULL when nfds == 0); owned by the caller */
    size_t nfds;
} hw_frame;

/* Free data and fds, close every fd that is still >= 0 (to take an fd, copy
 * it and set fds[i] = -1). Leaves *f zeroed; safe on a zeroed frame. */
void hw_frame_free(hw_frame *f);

/* ---- reader ---------------------------------------------------------- */

/* Per-connection receive state. The fields are private. */
typedef struct hw_reader {
    unsigned char *buf; /* HW_READ_BUF bytes, allocated on first read */
    size_t start, end;  /* unparsed bytes are buf[start..end) */
    uint64_t pos;       /* stream offset of buf[start] */
    unsigned char hdr[HW_HDR_SIZE];
    size_t hdr_got;
    int have_hdr;
    uint32_t len, nfds; /* current frame's header */
    uint64_t frame_start, frame_end;
    unsigned char *data; /* current frame's payload */
    size_t got;
    struct hw_pfd {
        int fd;
        uint64_t pos;
    } * pfd; /* received fds not yet in a frame */
    size_t npfd, pfdcap;
    int failed;                          /* first error code; sticky */
    size_t max_len;                      /* payload limit; 0: HW_FRAME_MAX */
    size_t max_fds;                      /* fds held at once; 0: HW_FDS_MAX */
    void (*close_fd)(int fd, void *arg); /* closes received fds; NULL: close() */
    void *close_arg;
} hw_reader;

void hw_reader_init(hw_reader *r);
/* Frees buffers and closes every fd the reader still holds. */
void hw_reader_free(hw_reader *r);

/* Tighter limits than the wire's (0: the wire's own): a header announcing a
 * payload over max_len is HW_ETOOBIG; more than max_fds fds held at once
 * (for frames not yet complete, counted as they arrive, before the header is
 * known) is HW_ETOOMANYFDS. Both break the framing, as the wire's limits. */
void hw_reader_set_limits(hw_reader *r, size_t max_len, size_t max_fds);
/* Received fds the reader closes itself (stray, extra, of a broken frame)
 * go to close_fd(fd, arg) instead of close(): a received fd can be a socket
 * whose close() blocks (SO_LINGER), so a daemon hands them to a thread. */
void hw_reader_set_closer(hw_reader *r, void (*close_fd)(int fd, void *arg), void *arg);
/* Received fds the reader holds for frames not yet complete. */
size_t hw_reader_fds_held(const hw_reader *r);
/* Frees the read buffer if it holds no unparsed bytes (it is allocated again
 * at the next read): an idle connection then costs no 64 KiB buffer. */
void hw_reader_shrink(hw_reader *r);
/* 1 if bytes are buffered that hw_read has not parsed yet. */
int hw_reader_buffered(const hw_reader *r);
/* 1 if part of a frame has come (header bytes, payload, fds) and the rest
 * has not: what a reader bounds with a stall timeout. */
int hw_reader_in_frame(const hw_reader *r);

/*
 * Read what the socket has (never blocks: MSG_DONTWAIT) and return the next
 * complete frame. *out is zeroed first; on HW_FRAME it holds the frame and the
 * caller owns it (hw_frame_free). Returns HW_FRAME, HW_AGAIN (no complete
 * frame yet: wait for readability; partial data is kept), HW_EOF (peer closed
 * between frames) or a negative error: HW_ETOOBIG, HW_ETOOMANYFDS, HW_EFDS,
 * HW_ECTRUNC, HW_EPARTIAL (EOF inside a frame), HW_ENOMEM, HW_ESYS. After an
 * error the reader stays failed (HW_EBROKEN) with no fds held: close the
 * connection. After HW_FRAME call it again until HW_AGAIN: more frames may
 * already be buffered here, and the socket will not poll readable for them.
 */
int hw_read(int fd, hw_reader *r, hw_frame *out, char *err, size_t errlen);

/* ---- writer ---------------------------------------------------------- */

struct hw_wframe;

/* Queue of outgoing frames for one connection. The fields are private. */
typedef struct hw_writer {
    struct hw_wframe *head, *tail;
    size_t frames; /* frames not completely sent */
    size_t bytes;  /* bytes (headers included) not yet sent */
    size_t fds;    /* fds queued and not yet sent */
    /* fds hw_writer_flush may still send (hw_writer_set_fd_budget; SIZE_MAX
     * after init); fd_stalled: the last flush stopped at it. */
    size_t fd_budget;
    int fd_stalled;
} hw_writer;

void hw_writer_init(hw_writer *w);
/* Drops unsent frames and closes the fds they own. */
void hw_writer_free(hw_writer *w);

/*
 * Queue one frame: copies the payload and takes ownership of the fds (closed
 * once sent, or by hw_writer_free). Refuses len > HW_FRAME_MAX, nfds >
 * HW_FDS_MAX and negative fds; on error nothing is queued and the caller
 * still owns the fds. Returns 0 or a negative error.
 */
int hw_writer_push(hw_writer *w, const void *data, size_t len, const int *fds, size_t nfds, char *err, size_t errlen);

/*
 * Send as much of the queue as the socket takes (never blocks). Returns 1
 * when the queue is empty, 0 when the socket would block (wait for
 * writability and call again), or a negative error (HW_ESYS: EPIPE,
 * ECONNRESET...). Frames are sent in order; fds go with their frame's bytes.
 */
int hw_writer_flush(int fd, hw_writer *w, char *err, size_t errlen);

/* Frames queued and not completely sent (0: nothing to flush). */
size_t hw_writer_pending(const hw_writer *w);
/* Bytes (headers included) queued and not yet sent. */
size_t hw_writer_pending_bytes(const hw_writer *w);
/* Fds queued and not yet sent. */
size_t hw_writer_pending_fds(const hw_writer *w);
/* hw_writer_flush sends at most `n` more fds (each sendmsg's batch whole:
 * a batch over the budget waits, the flush returns 0 and sets fd_stalled)
 * until the next call; SIZE_MAX: no budget (the default). */
void hw_writer_set_fd_budget(hw_writer *w, size_t n);

/* ---- blocking helpers (client) ---------------------------------------- */

/*
 * Send one frame, waiting (poll) while the socket is full; handles EINTR and
 * partial writes. Does not take ownership of the fds. Same limits as
 * hw_writer_push. Returns 0 or a negative error.
 */
int hw_send_frame(int fd, const void *data, size_t len, const int *fds, size_t nfds, char *err, size_t errlen);

/*
 * Wait (poll) for the next complete frame. timeout_ms < 0 waits forever; the
 * timeout bounds the whole call. Returns HW_FRAME, HW_EOF, HW_ETIMEDOUT (the
 * reader keeps any partial frame: calling again continues it) or another
 * negative error as hw_read.
 */
int hw_recv_frame(int fd, hw_reader *r, hw_frame *out, int timeout_ms, char *err, size_t errlen);

/* ---- sockets ---------------------------------------------------------- */

/* 0 if path is non-empty and fits sun_path (with its NUL), else
 * HW_EINVAL / HW_ENAMETOOLONG. */
int hw_socket_path_ok(const char *path, char *err, size_t errlen);

/*
 * Create a listening SOCK_STREAM Unix socket at path (close-on-exec,
 * blocking: use hw_set_nonblock). An existing socket file is removed only if
 * nothing answers on it (a connect is tried first); if a live listener
 * answers, returns HW_EADDRINUSE saying so. A path that exists and is not a
 * socket is never removed (HW_EADDRINUSE). Returns the fd or a negative
 * error. The file's permissions follow the umask. The check-then-bind is not
 * atomic against two daemons starting at the same instant (one then gets
 * HW_EADDRINUSE from bind, or at worst replaces the other's fresh socket):
 * guard startup with a lock file or systemd socket activation.
 */
int hw_listen_unix(const char *path, int backlog, char *err, size_t errlen);

/* Connect (blocking, close-on-exec). Returns the fd or a negative error whose
 * message names the path and suggests checking that heapd is running. */
int hw_connect_unix(const char *path, char *err, size_t errlen);

/* Set O_NONBLOCK. Returns 0 or HW_ESYS (errno set). */
int hw_set_nonblock(int fd);

#endif /* HEAPD_WIRE_H */
