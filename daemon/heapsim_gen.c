/* heapsim_gen.c - heapsim --generate: random multi-rank traces (prefix
 * gen_). */
#include "heapsim.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- --generate: random multi-rank traces --------------------------------
 *
 * One trace per seed, a pure function of the seed (splitmix64): 2-8 ranks,
 * chunk 16-256 MiB, initial extent one chunk to 256 MiB, min_block 512 or
 * 4 KiB, 1,000-3,000 allocations of 1 byte to 64 KiB..256 MiB (log-uniform,
 * a few near the maximum), a mix of scratch blocks (dead after 1-32
 * allocations) and long-lived ones (50 allocations to the end of the trace,
 * bounded in bytes), every rank freeing each dead block at its own random
 * delay (0-15 allocations), and sometimes explicit collects. */

typedef struct gen_ev {
    uint64_t t; /* allocation number at which the free happens */
    uint32_t seq, rank, id;
} gen_ev;

static uint64_t gen_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t gen_below(uint64_t *x, uint64_t n) { return n ? gen_next(x) % n : 0; }

static int ev_less(const gen_ev *a, const gen_ev *b) { return a->t != b->t ? a->t < b->t : a->seq < b->seq; }

/* The earliest event of the heap h[0..*n) (a binary min-heap), removed. */
static gen_ev gen_pop(gen_ev *h, size_t *n)
{
    gen_ev e = h[0];
    h[0] = h[--*n];
    for (size_t i = 0;;) { /* sift down */
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && ev_less(&h[l], &h[m]))
            m = l;
        if (r < *n && ev_less(&h[r], &h[m]))
            m = r;
        if (m == i)
            break;
        gen_ev tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
    return e;
}

/* Adds e to the heap *h[0..*n), growing it; -1 when out of memory. */
static int gen_push(gen_ev **hp, size_t *n, size_t *cap, gen_ev e)
{
    if (*n == *cap) {
        gen_ev *nh = realloc(*hp, *cap * 2 * sizeof *nh);
        if (!nh)
            return -1;
        *hp = nh;
        *cap *= 2;
    }
    gen_ev *h = *hp;
    size_t i = (*n)++;
    while (i && ev_less(&e, &h[(i - 1) / 2])) { /* sift up */
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
    return 0;
}

int gen_trace(uint64_t seed, uint64_t max_steps, FILE *out)
{
    uint64_t x = seed * 0x2545F4914F6CDD1Dull + 1;
    uint32_t ranks = 2 + (uint32_t)gen_below(&x, 7);
    uint64_t chunk = (UINT64_C(16) << 20) << gen_below(&x, 5);
    uint64_t initial = chunk * (1 + gen_below(&x, (UINT64_C(256) << 20) / chunk));
    uint64_t min_block = gen_below(&x, 4) == 0 ? 4096 : 512;
    uint64_t steps = 1000 + gen_below(&x, 2001);
    static const unsigned maxbits_of[4] = {16, 20, 24, 28};
    unsigned maxbits = maxbits_of[gen_below(&x, 4)];
    uint64_t p_long = gen_below(&x, 50); /* percent */
    uint64_t scratch_life = 1 + gen_below(&x, 32);
    uint64_t skew = gen_below(&x, 16);
    uint64_t p_collect = gen_below(&x, 3) == 0 ? 1 + gen_below(&x, 10) : 0; /* per 1000 */
    uint64_t long_cap = initial / 4 + gen_below(&x, 2 * initial);
    uint64_t long_bytes = 0;
    if (steps > max_steps)
        steps = max_steps; /* the same trace, cut short */
    size_t cap = 1024, n = 0;
    gen_ev *h = malloc(cap * sizeof *h);
    uint64_t *sizes = calloc(steps, sizeof *sizes);
    uint8_t *is_long = calloc(steps, 1);
    uint32_t *left = calloc(steps, sizeof *left);
    if (!h || !sizes || !is_long || !left) {
        fprintf(stderr, "heapsim: out of memory\n");
        return 1;
    }
    uint32_t seq = 0;
    fprintf(out,
            "# heapsim --generate %" PRIu64 ": ranks=%" PRIu32 " steps=%" PRIu64 " max=2^%u long=%" PRIu64
            "%% scratch<=%" PRIu64 " skew<=%" PRIu64 " collects=%" PRIu64 "/1000\n",
            seed, ranks, steps, maxbits, p_long, scratch_life, skew, p_collect);
    fprintf(out, "heap ranks=%" PRIu32 " chunk=%" PRIu64 "M initial=%" PRIu64 "M min_block=%" PRIu64 " va=1T\n", ranks,
            chunk >> 20, initial >> 20, min_block);
    for (uint64_t t = 0; t < steps; t++) {
        while (n && h[0].t <= t) {
            gen_ev e = gen_pop(h, &n);
            fprintf(out, "f %" PRIu32 " b%" PRIu32 "\n", e.rank, e.id);
            if (--left[e.id] == 0 && is_long[e.id])
                long_bytes -= sizes[e.id];
        }
        if (p_collect && gen_below(&x, 1000) < p_collect)
            fputs("c\n", out);
        uint64_t size;
        if (gen_below(&x, 50) == 0)
            size = (UINT64_C(1) << (maxbits - 2)) + gen_below(&x, UINT64_C(3) << (maxbits - 2));
        else
            size = 1 + gen_below(&x, UINT64_C(1) << gen_below(&x, maxbits + 1));
        int lng = gen_below(&x, 100) < p_long && long_bytes + size <= long_cap;
        uint64_t life = lng ? 50 + gen_below(&x, steps) : 1 + gen_below(&x, scratch_life);
        sizes[t] = size;
        is_long[t] = (uint8_t)lng;
        left[t] = ranks;
        if (lng)
            long_bytes += size;
        fprintf(out, "a b%" PRIu64 " %" PRIu64 "\n", t, size);
        for (uint32_t r = 0; r < ranks; r++) {
            gen_ev e = {t + life + gen_below(&x, skew + 1), seq++, r, (uint32_t)t};
            if (gen_push(&h, &n, &cap, e) != 0) {
                fprintf(stderr, "heapsim: out of memory\n");
                return 1;
            }
        }
    }
    free(h);
    free(sizes);
    free(is_long);
    free(left);
    if (fflush(out) != 0) {
        fprintf(stderr, "heapsim: cannot write the trace: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
