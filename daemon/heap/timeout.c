/* timeout.c - the heap wing's attach and collect timeouts: what happens
 * when a heap's timer fires. Top floor (heap_int.h), above the two waits it
 * ends: attach.c and collect.c arm the timer through registry.c
 * (hh_arm_timer), whose heap_timeout hook, installed here by
 * hd_registry_create, calls back into this file. */
#include "heap_int.h"

#include <stdio.h>

#include "log.h"

/* Lists the ranks in state `which` (0: missing from the collect, 1: waiting
 * in it, 2: not attached, 3: waiting in attach) as "0, 2, 5". */
static void rank_list(const hd_heap *h, int which, char *buf, size_t len)
{
    size_t n = 0;
    int count = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < h->world_size && n + 16 < len; i++) {
        const hd_rank *k = &h->ranks[i];
        bool match = which == 0   ? k->joined && !k->in_collect /* missing from collect */
                     : which == 1 ? k->in_collect               /* waiting in collect */
                     : which == 2 ? !k->conn                    /* never attached / gone */
                                  : k->attach_wait;             /* waiting in attach */
        if (!match)
            continue;
        n += (size_t)snprintf(buf + n, len - n, "%s%u", count ? ", " : "", i);
        count++;
    }
    if (n + 16 >= len)
        snprintf(buf + n, len - n, ", ...");
}

/* The heap's timer fired: the attach (timer_attach) or the collect it was
 * armed for fails, naming the ranks missing and those waiting. */
static void heap_timeout(uv_timer_t *t)
{
    hd_heap *h = t->data;
    char missing[400], waiting[400], msg[1400];
    msg[0] = 0;
    if (h->timer_attach) {
        if (h->formed)
            return;
        rank_list(h, 2, missing, sizeof missing);
        rank_list(h, 3, waiting, sizeof waiting);
        snprintf(msg, sizeof msg,
                 "attach to heap \"%s\" timed out after %u ms: rank(s) %s never attached (attached: %s); "
                 "start every rank, or raise collect_timeout_ms",
                 h->name, h->timeout_ms, missing, waiting);
        hd_warn("%s", msg);
        hh_attach_timed_out(h, msg); /* may destroy h */
        return;
    }
    if (!h->coll_active)
        return;
    rank_list(h, 0, missing, sizeof missing);
    rank_list(h, 1, waiting, sizeof waiting);
    snprintf(msg, sizeof msg,
             "collect on heap \"%s\" at allocation %llu timed out after %u ms: rank(s) %s never arrived "
             "(waiting: %s); check that every rank reaches the same allocation",
             h->name, (unsigned long long)h->coll_seq, h->timeout_ms, missing, waiting);
    hd_warn("%s", msg);
    hh_collect_fail(h, HEAPD__ERR_CODE__ERR_TIMEOUT, msg);
}

int hd_registry_create(uv_loop_t *loop, hb_backend *be, const hd_config *cfg, hd_registry **out)
{
    return hh_registry_new(loop, be, cfg, heap_timeout, out);
}
