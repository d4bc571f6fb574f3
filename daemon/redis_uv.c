/* redis_uv.c - hiredis on a libuv loop (see redis_uv.h).
 *
 * Provenance: hiredis 0.14's adapters/libuv.h (https://github.com/redis/hiredis,
 * BSD 3-Clause license, see hiredis's COPYING: Copyright (c) 2009-2011,
 * Salvatore Sanfilippo; Copyright (c) 2010-2011, Pieter Noordhuis), changed
 * for heapd: that adapter drops libuv's error status (libuv reports POLLERR as
 * status UV_EBADF and stops the handle), so a refused connect or a reset
 * connection is never noticed and the connection hangs. Here the error is
 * handed to hiredis, which reads the socket error and fails the connection;
 * a socket that keeps failing while hiredis sees nothing is failed after 3
 * tries. Names changed to lv_* and redis_uv_attach. */
#include "redis_uv.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct lv_events {
    redisAsyncContext *ac;
    uv_poll_t handle;
    int events;
    int closing;
    int errors;   /* consecutive poll errors hiredis did not act on */
} lv_events;

static void lv_poll(uv_poll_t *handle, int status, int events)
{
    lv_events *p = handle->data;

    if (status < 0) {
        /* libuv stopped the handle. Let hiredis find the socket error: the
         * connect check (getsockopt SO_ERROR) before it is connected, a read
         * after. Either fails the connection (and frees the context). */
        if (p->ac) {
            if (!(p->ac->c.flags & REDIS_CONNECTED))
                redisAsyncHandleWrite(p->ac);
            else
                redisAsyncHandleRead(p->ac);
        }
        if (p->ac && (p->ac->c.flags & REDIS_CONNECTED) && ++p->errors > 3) {
            /* The socket keeps failing yet hiredis sees no error: give up on
             * it rather than spin. Not inside a hiredis callback here. */
            redisAsyncContext *ac = p->ac;
            ac->c.err = REDIS_ERR_IO;
            snprintf(ac->c.errstr, sizeof ac->c.errstr, "the socket reports an error (%s)",
                     uv_strerror(status));
            redisAsyncFree(ac);   /* onDisconnect tells the store */
            return;
        }
        if (p->ac && p->events && p->errors <= 3)
            uv_poll_start(&p->handle, p->events, lv_poll);
        return;
    }
    p->errors = 0;
    if (p->ac && (events & UV_READABLE))
        redisAsyncHandleRead(p->ac);
    if (p->ac && (events & UV_WRITABLE))
        redisAsyncHandleWrite(p->ac);
}

static void lv_update(lv_events *p)
{
    if (p->closing)
        return;
    if (p->events)
        uv_poll_start(&p->handle, p->events, lv_poll);
    else
        uv_poll_stop(&p->handle);
}

static void lv_add_read(void *privdata)
{
    lv_events *p = privdata;
    p->events |= UV_READABLE;
    lv_update(p);
}

static void lv_del_read(void *privdata)
{
    lv_events *p = privdata;
    p->events &= ~UV_READABLE;
    lv_update(p);
}

static void lv_add_write(void *privdata)
{
    lv_events *p = privdata;
    p->events |= UV_WRITABLE;
    lv_update(p);
}

static void lv_del_write(void *privdata)
{
    lv_events *p = privdata;
    p->events &= ~UV_WRITABLE;
    lv_update(p);
}

static void lv_closed(uv_handle_t *handle)
{
    free(handle->data);
}

static void lv_cleanup(void *privdata)
{
    lv_events *p = privdata;
    p->ac = NULL;
    if (!p->closing) {
        p->closing = 1;
        uv_close((uv_handle_t *)&p->handle, lv_closed);
    }
}

int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    lv_events *p;

    if (ac->ev.data != NULL)
        return -1;
    p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    if (uv_poll_init(loop, &p->handle, ac->c.fd) != 0) {
        free(p);
        return -1;
    }
    p->ac = ac;
    p->handle.data = p;
    ac->ev.addRead = lv_add_read;
    ac->ev.delRead = lv_del_read;
    ac->ev.addWrite = lv_add_write;
    ac->ev.delWrite = lv_del_write;
    ac->ev.cleanup = lv_cleanup;
    ac->ev.data = p;
    return 0;
}

