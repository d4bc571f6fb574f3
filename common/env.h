/* env.h - the client side's environment variables under one prefix
 * (issue 31): HEAPD_NAME, with the older HEAPC_NAME kept as an alias
 * (HEAPD_ wins when both are set). Header only, so each library that reads
 * the environment (libheapc, libheapc_nccl, the preload library) has its own
 * copy and none exports it. */
#ifndef HEAPD_ENV_H
#define HEAPD_ENV_H

#include <stdio.h>
#include <stdlib.h>

/* getenv("HEAPD_" name), else getenv("HEAPC_" name); NULL when neither. */
static inline const char *henv_get(const char *name)
{
    char k[128];
    const char *v = NULL;
    if (snprintf(k, sizeof k, "HEAPD_%s", name) < (int)sizeof k)
        v = getenv(k);
    if (!v && snprintf(k, sizeof k, "HEAPC_%s", name) < (int)sizeof k)
        v = getenv(k);
    return v;
}

/* The variable henv_get(name) read, for messages: "HEAPD_" name when that is
 * set or neither is, else "HEAPC_" name; "" when it does not fit `len`. */
static inline const char *henv_which(const char *name, char *buf, size_t len)
{
    if (snprintf(buf, len, "HEAPD_%s", name) >= (int)len)
        return buf[0] = 0, buf;
    if (!getenv(buf)) {
        buf[4] = 'C'; /* "HEAPC_" name: the same length */
        if (!getenv(buf))
            buf[4] = 'D';
    }
    return buf;
}

#endif
