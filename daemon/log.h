/* log.h - heapd's log: one line per event on stderr, with a level.
 *
 * Programs only (heapd); libraries never log. Lines look like
 *   heapd[1234]: info: heap "job7" created: 4 ranks, chunk 64 MiB
 * Under systemd the "<N>" syslog prefix is added instead of the pid so that
 * journald files each line with its priority. Not thread-safe beyond what
 * stdio gives: heapd logs from its loop thread only. */
#ifndef HEAPD_LOG_H
#define HEAPD_LOG_H

enum { HD_LOG_ERROR = 0, HD_LOG_WARN = 1, HD_LOG_INFO = 2, HD_LOG_DEBUG = 3 };

/* Level names: error, warn, info, debug. Returns -1 for an unknown name. */
int hd_log_parse_level(const char *name);
void hd_log_set_level(int level);
int hd_log_get_level(void);
/* journal: 1 to print "<N>" priority prefixes (systemd), 0 for plain lines. */
void hd_log_set_journal(int journal);

void hd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define hd_error(...) hd_log(HD_LOG_ERROR, __VA_ARGS__)
#define hd_warn(...) hd_log(HD_LOG_WARN, __VA_ARGS__)
#define hd_info(...) hd_log(HD_LOG_INFO, __VA_ARGS__)
#define hd_debug(...) do { if (hd_log_get_level() >= HD_LOG_DEBUG) hd_log(HD_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
