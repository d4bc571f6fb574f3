/* log.c - see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int log_level = HD_LOG_INFO;
static int log_journal;

static const char *const names[] = {"error", "warn", "info", "debug"};
static const int syslog_prio[] = {3, 4, 6, 7};

int hd_log_parse_level(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (name && !strcmp(name, names[i]))
            return i;
    if (name && !strcmp(name, "warning"))
        return HD_LOG_WARN;
    return -1;
}

void hd_log_set_level(int level) { log_level = level; }
int hd_log_get_level(void) { return log_level; }
void hd_log_set_journal(int journal) { log_journal = journal; }

void hd_log(int level, const char *fmt, ...)
{
    if (level > log_level || level < 0 || level > 3)
        return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log_journal)
        fprintf(stderr, "<%d>%s: %s\n", syslog_prio[level], names[level], buf);
    else
        fprintf(stderr, "heapd[%ld]: %s: %s\n", (long)getpid(), names[level], buf);
    fflush(stderr);
}
