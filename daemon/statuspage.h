/* statuspage.h - heapd's writer side of the status page (common/status.h).
 *
 * One page per heap and rank: a memfd of HS_PAGE_SIZE bytes, mapped
 * read-write here and sealed against resizing; the client maps it read-only.
 * hd_status_write publishes a whole snapshot under the page's seqlock, so a
 * reader never sees a torn one. Loop thread only. */
#ifndef HEAPD_STATUSPAGE_H
#define HEAPD_STATUSPAGE_H

#include <stddef.h>

#include "status.h"

typedef struct hd_status {
    int fd; /* -1 when not created */
    hs_page *page;
} hd_status;

/* Creates the page for `rank`. Returns 0, or -1 with err filled. */
int hd_status_create(hd_status *s, uint32_t rank, char *err, size_t errlen);
void hd_status_destroy(hd_status *s);
/* Copies every field of `v` except magic, version, seq and updates. */
void hd_status_write(hd_status *s, const hs_page *v);

#endif
