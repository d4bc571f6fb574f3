/* heapsim_compare.c - heapsim --compare: every policy over many traces,
 * side by side (prefix cmp_). */
#include "heapsim.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- --compare: every policy over many traces ----------------------------- */

#define NPOL 2
static const ha_policy cmp_pols[NPOL] = {HA_POLICY_COALESCE, HA_POLICY_SEED};

typedef struct cmp_row {
    const char *name;
    uint64_t mapped[NPOL], growths[NPOL], collects[NPOL], overlaps[NPOL];
    uint32_t ranks;
    uint64_t chunk, initial;
    double ratio; /* mapped, coalesce / seed */
} cmp_row;

static int cmp_by_ratio(const void *a, const void *b)
{
    const cmp_row *x = a, *y = b;
    if (x->ratio != y->ratio)
        return x->ratio < y->ratio ? 1 : -1;
    /* ties: the higher collects ratio first */
    double cx = x->collects[1] ? (double)x->collects[0] / (double)x->collects[1] : 0;
    double cy = y->collects[1] ? (double)y->collects[0] / (double)y->collects[1] : 0;
    if (cx != cy)
        return cx < cy ? 1 : -1;
    return strcmp(x->name, y->name);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Replays path under every policy into r; the number of failed replays. */
static int cmp_replay(cmp_row *r, const char *path)
{
    int failed = 0;
    r->name = path;
    for (int k = 0; k < NPOL; k++) {
        sim s = {.policy = cmp_pols[k]};
        int rc = sim_replay_path(&s, path);
        if (rc != 0) {
            fprintf(stderr, "heapsim: --compare: %s failed under the %s policy\n", path, ha_policy_name(cmp_pols[k]));
            failed++;
        }
        if (s.heap) {
            ha_stats st;
            ha_get_stats(s.heap, &st);
            r->mapped[k] = st.mapped;
            r->growths[k] = st.growths;
            r->collects[k] = st.collects;
            const ha_params *hp = ha_get_params(s.heap);
            r->ranks = hp->ranks;
            r->chunk = hp->chunk_size;
            r->initial = hp->initial_size;
        }
        r->overlaps[k] = s.overlaps;
        sim_free(&s);
    }
    return failed;
}

/* The markdown table of the `worst` first rows (sorted, n > 0). */
static void cmp_print_worst(const cmp_row *rows, int n, int worst)
{
    printf("\nworst %d by mapped, coalesce / seed (ties: by collects, coalesce / seed):\n\n", worst < n ? worst : n);
    printf("| trace | ranks | chunk / initial | mapped coalesce | mapped seed | ratio | collects "
           "coalesce | collects seed |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n && i < worst; i++) {
        const cmp_row *r = &rows[i];
        printf("| %s | %" PRIu32 " | %" PRIu64 " / %" PRIu64 " MiB | %.0f MiB | %.0f MiB | %.3f | %" PRIu64
               " | %" PRIu64 " |\n",
               base_name(r->name), r->ranks, r->chunk >> 20, r->initial >> 20, (double)r->mapped[0] / 1048576.0,
               (double)r->mapped[1] / 1048576.0, r->ratio, r->collects[0], r->collects[1]);
    }
    printf("\n");
}

int cmp_traces(int n, char **paths, int worst)
{
    cmp_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "heapsim: out of memory\n");
        return 1;
    }
    int failed = 0;
    uint64_t tm[NPOL] = {0}, tg[NPOL] = {0}, tc[NPOL] = {0}, tov = 0;
    printf("%-24s %12s %12s %6s  %7s %7s  %8s %8s %6s\n", "trace", "mapped MiB", "", "ratio", "growths", "", "collects",
           "", "ratio");
    printf("%-24s %12s %12s %6s  %7s %7s  %8s %8s %6s\n", "", "coalesce", "seed", "", "coalesce", "seed", "coalesce",
           "seed", "");
    for (int i = 0; i < n; i++) {
        cmp_row *r = &rows[i];
        failed += cmp_replay(r, paths[i]);
        for (int k = 0; k < NPOL; k++) {
            tov += r->overlaps[k];
            tm[k] += r->mapped[k];
            tg[k] += r->growths[k];
            tc[k] += r->collects[k];
        }
        r->ratio = r->mapped[1] ? (double)r->mapped[0] / (double)r->mapped[1] : 0;
        printf("%-24s %12.1f %12.1f %6.3f  %7" PRIu64 " %7" PRIu64 "  %8" PRIu64 " %8" PRIu64 " %6.2f\n",
               base_name(r->name), (double)r->mapped[0] / 1048576.0, (double)r->mapped[1] / 1048576.0, r->ratio,
               r->growths[0], r->growths[1], r->collects[0], r->collects[1],
               r->collects[1] ? (double)r->collects[0] / (double)r->collects[1] : 0.0);
    }
    double tr = tm[1] ? (double)tm[0] / (double)tm[1] : 0;
    printf("%-24s %12.1f %12.1f %6.3f  %7" PRIu64 " %7" PRIu64 "  %8" PRIu64 " %8" PRIu64 " %6.2f\n", "total",
           (double)tm[0] / 1048576.0, (double)tm[1] / 1048576.0, tr, tg[0], tg[1], tc[0], tc[1],
           tc[1] ? (double)tc[0] / (double)tc[1] : 0.0);
    qsort(rows, (size_t)n, sizeof *rows, cmp_by_ratio);
    int more = 0, less = 0;
    for (int i = 0; i < n; i++) {
        more += rows[i].mapped[0] > rows[i].mapped[1];
        less += rows[i].mapped[0] < rows[i].mapped[1];
    }
    if (worst > 0 && n > 0)
        cmp_print_worst(rows, n, worst);
    printf("compare: traces=%d mapped_total_ratio=%.4f mapped_max_ratio=%.4f worst=%s "
           "coalesce_more=%d coalesce_less=%d collects_coalesce=%" PRIu64 " collects_seed=%" PRIu64
           " growths_coalesce=%" PRIu64 " growths_seed=%" PRIu64 " overlaps=%" PRIu64 " failed=%d\n",
           n, tr, n ? rows[0].ratio : 0.0, n ? base_name(rows[0].name) : "-", more, less, tc[0], tc[1], tg[0], tg[1],
           tov, failed);
    free(rows);
    return failed || tov ? 1 : 0;
}
