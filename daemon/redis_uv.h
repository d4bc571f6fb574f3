/* redis_uv.h - drives an async hiredis connection from a libuv loop
 * (redis_uv.c: hiredis's libuv adapter, with POLLERR handed to hiredis). */
#ifndef HEAPD_REDIS_UV_H
#define HEAPD_REDIS_UV_H

#include <hiredis/async.h>
#include <uv.h>

/* Attaches `ac` to `loop` (once per context). Returns 0, or -1 (already
 * attached, out of memory, uv_poll_init failed). */
int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop);

#endif
