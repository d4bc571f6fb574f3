/* hist.h - fixed-bucket latency histograms for heapd's metrics (collect
 * wait, growth). Cumulative counts in Prometheus' sense are made by the
 * reader (heapctl metrics); here each bucket counts the observations whose
 * value is <= its bound and > the previous bound. The last bucket is +Inf.
 * Pure: no clock, no I/O; the caller passes nanoseconds. */
#ifndef HEAPD_HIST_H
#define HEAPD_HIST_H

#include <stdint.h>

#define HD_HIST_N 12
/* Upper bounds in seconds; the +Inf bucket is implicit (index HD_HIST_N - 1). */
static const double hd_hist_bounds[HD_HIST_N - 1] = {0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30};

typedef struct hd_hist {
    uint64_t n[HD_HIST_N];
    uint64_t count;
    uint64_t sum_ns;
} hd_hist;

static inline void hd_hist_observe(hd_hist *h, uint64_t ns)
{
    double s = (double)ns / 1e9;
    int i = 0;
    while (i < HD_HIST_N - 1 && s > hd_hist_bounds[i])
        i++;
    h->n[i]++;
    h->count++;
    h->sum_ns += ns;
}

#endif
