/* log.h - heapd's log: one event per call, with a level and structured fields.
 *
 * Programs only (heapd); libraries never log. Three sinks, chosen once by
 * hd_log_setup():
 *   - journal: stderr is the journal's stream (JOURNAL_STREAM names stderr's
 *     device and inode, checked with fstat; a variable inherited by a child
 *     whose stderr was redirected is ignored). Each event is one datagram of
 *     the journal's native protocol on /run/systemd/journal/socket:
 *     MESSAGE, PRIORITY, SYSLOG_IDENTIFIER=heapd, HEAPD_LEVEL and the fields
 *     of the event's context: HEAP, RANK, PID (the client's), SEQ
 *     (allocation number), ERR (error code name sent to the client), REQ
 *     (request type). `journalctl -o verbose` shows them; `journalctl
 *     HEAP=job7` selects them. Written by hand (no libsystemd), so the
 *     static GPU build has it too. If a datagram cannot be sent the event
 *     goes to stderr with a "<N>" priority prefix.
 *   - json (log_format = json, not under the journal): one JSON object per
 *     line on stderr: time, level, message and the same fields in lower
 *     case; valid UTF-8 (invalid bytes of names as U+FFFD).
 *   - text: heapd[1234]: info: heap "job7" created: 4 ranks, chunk 64 MiB
 * The context is set by the server around each request it dispatches
 * (hd_log_ctx_set); events outside requests (timers) carry none. Loop
 * thread only. */
#ifndef HEAPD_LOG_H
#define HEAPD_LOG_H

#include <stdint.h>

enum { HD_LOG_ERROR = 0, HD_LOG_WARN = 1, HD_LOG_INFO = 2, HD_LOG_DEBUG = 3 };
enum { HD_LOG_FMT_TEXT = 0, HD_LOG_FMT_JSON = 1 };

/* Level names: error, warn, info, debug. Returns -1 for an unknown name. */
int hd_log_parse_level(const char *name);
/* "text" or "json"; -1 for anything else. */
int hd_log_parse_format(const char *name);
void hd_log_set_level(int level);
int hd_log_get_level(void);
void hd_log_set_format(int format);
/* Picks the sink: the journal when JOURNAL_STREAM matches stderr (the
 * socket: $HEAPD_JOURNAL_SOCKET, for tests, else the journal's). Returns 1
 * when the journal is used. */
int hd_log_setup(void);

/* Fields of the events logged while handling one request. heap is copied;
 * err and req must be static strings. rank, pid, seq < 0: absent. */
typedef struct hd_log_ctx {
    const char *heap;
    long rank;
    long pid;
    long long seq;
    const char *err;
    const char *req;
} hd_log_ctx;
#define HD_LOG_CTX_NONE                                                                                                \
    {                                                                                                                  \
        NULL, -1, -1, -1, NULL, NULL                                                                                   \
    }
/* NULL clears. The context is copied. */
void hd_log_ctx_set(const hd_log_ctx *ctx);
/* The error code name of the event being logged (hd_conn_error), or NULL. */
void hd_log_ctx_err(const char *err);

void hd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define hd_error(...) hd_log(HD_LOG_ERROR, __VA_ARGS__)
#define hd_warn(...)  hd_log(HD_LOG_WARN, __VA_ARGS__)
#define hd_info(...)  hd_log(HD_LOG_INFO, __VA_ARGS__)
#define hd_debug(...)                                                                                                  \
    do {                                                                                                               \
        if (hd_log_get_level() >= HD_LOG_DEBUG)                                                                        \
            hd_log(HD_LOG_DEBUG, __VA_ARGS__);                                                                         \
    } while (0)

#endif
