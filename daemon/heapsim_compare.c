/* heapsim_compare.c - heapsim --compare: every policy over many traces,
 * side by side (prefix cmp_). */
#include "heapsim.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- --compare: every policy over many traces ----------------------------- */

/* Every policy of common/policy.h, in its order; the ratios compare the
 * default (the first) with the seed's algorithm, the reference. */
#define NPOL HA_POLICY_COUNT
#define DEF  0
#define REF  HA_POLICY_SEED

typedef struct cmp_row {
    const char *name;
    uint64_t mapped[NPOL], growths[NPOL], collects[NPOL], overlaps[NPOL];
    uint32_t ranks;
    uint64_t chunk, initial;
    double ratio; /* mapped, default / reference */
} cmp_row;

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

static int cmp_by_ratio(const void *a, const void *b)
{
    const cmp_row *x = a, *y = b;
    if (x->ratio != y->ratio)
        return x->ratio < y->ratio ? 1 : -1;
    /* ties: the higher collects ratio first */
    double cx = ratio(x->collects[DEF], x->collects[REF]);
    double cy = ratio(y->collects[DEF], y->collects[REF]);
    if (cx != cy)
        return cx < cy ? 1 : -1;
    return strcmp(x->name, y->name);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static const char *pname(int k) { return ha_policy_name((ha_policy)k); }

/* Replays path under every policy into r; the number of failed replays. */
static int cmp_replay(cmp_row *r, const char *path, ha_reclaim reclaim)
{
    int failed = 0;
    r->name = path;
    for (int k = 0; k < NPOL; k++) {
        sim s = {.policy = (ha_policy)k, .reclaim = k == DEF ? reclaim : HA_RECLAIM_COLLECT};
        int rc = sim_replay_path(&s, path);
        if (rc != 0) {
            fprintf(stderr, "heapsim: --compare: %s failed under the %s policy\n", path, pname(k));
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
    printf("\nworst %d by mapped, %s / %s (ties: by collects, %s / %s):\n\n", worst < n ? worst : n, pname(DEF),
           pname(REF), pname(DEF), pname(REF));
    printf("| trace | ranks | chunk / initial |");
    for (int k = 0; k < NPOL; k++)
        printf(" mapped %s |", pname(k));
    printf(" ratio |");
    for (int k = 0; k < NPOL; k++)
        printf(" collects %s |", pname(k));
    printf("\n|---|---|---|");
    for (int k = 0; k < 2 * NPOL + 1; k++)
        printf("---|");
    printf("\n");
    for (int i = 0; i < n && i < worst; i++) {
        const cmp_row *r = &rows[i];
        printf("| %s | %" PRIu32 " | %" PRIu64 " / %" PRIu64 " MiB |", base_name(r->name), r->ranks, r->chunk >> 20,
               r->initial >> 20);
        for (int k = 0; k < NPOL; k++)
            printf(" %.0f MiB |", (double)r->mapped[k] / 1048576.0);
        printf(" %.3f |", r->ratio);
        for (int k = 0; k < NPOL; k++)
            printf(" %" PRIu64 " |", r->collects[k]);
        printf("\n");
    }
    printf("\n");
}

/* One row of the main table: mapped, ratio, growths, collects, ratio. */
static void cmp_print_row(const char *name, const uint64_t *m, const uint64_t *g, const uint64_t *c)
{
    printf("%-24s", name);
    for (int k = 0; k < NPOL; k++)
        printf(" %12.1f", (double)m[k] / 1048576.0);
    printf(" %6.3f ", ratio(m[DEF], m[REF]));
    for (int k = 0; k < NPOL; k++)
        printf(" %7" PRIu64, g[k]);
    printf(" ");
    for (int k = 0; k < NPOL; k++)
        printf(" %8" PRIu64, c[k]);
    printf(" %6.2f\n", ratio(c[DEF], c[REF]));
}

/* The main table's two header lines. */
static void cmp_print_head(void)
{
    static const char *const label[3] = {"mapped MiB", "growths", "collects"};
    static const int width[3] = {12, 7, 8};
    for (int line = 0; line < 2; line++) {
        printf("%-24s", line ? "" : "trace");
        for (int col = 0; col < 3; col++) {
            if (col)
                printf(" ");
            for (int k = 0; k < NPOL; k++)
                printf(" %*s", width[col], line ? pname(k) : k ? "" : label[col]);
            if (col != 1)
                printf(" %6s", line ? "" : "ratio");
        }
        printf("\n");
    }
}

int cmp_traces(int n, char **paths, int worst, ha_reclaim reclaim)
{
    cmp_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "heapsim: out of memory\n");
        return 1;
    }
    int failed = 0;
    uint64_t tm[NPOL] = {0}, tg[NPOL] = {0}, tc[NPOL] = {0}, tov = 0;
    cmp_print_head();
    for (int i = 0; i < n; i++) {
        cmp_row *r = &rows[i];
        failed += cmp_replay(r, paths[i], reclaim);
        for (int k = 0; k < NPOL; k++) {
            tov += r->overlaps[k];
            tm[k] += r->mapped[k];
            tg[k] += r->growths[k];
            tc[k] += r->collects[k];
        }
        r->ratio = ratio(r->mapped[DEF], r->mapped[REF]);
        cmp_print_row(base_name(r->name), r->mapped, r->growths, r->collects);
    }
    double tr = ratio(tm[DEF], tm[REF]);
    cmp_print_row("total", tm, tg, tc);
    qsort(rows, (size_t)n, sizeof *rows, cmp_by_ratio);
    int more = 0, less = 0;
    for (int i = 0; i < n; i++) {
        more += rows[i].mapped[DEF] > rows[i].mapped[REF];
        less += rows[i].mapped[DEF] < rows[i].mapped[REF];
    }
    if (worst > 0 && n > 0)
        cmp_print_worst(rows, n, worst);
    printf("compare: traces=%d mapped_total_ratio=%.4f mapped_max_ratio=%.4f worst=%s %s_more=%d %s_less=%d", n, tr,
           n ? rows[0].ratio : 0.0, n ? base_name(rows[0].name) : "-", pname(DEF), more, pname(DEF), less);
    for (int k = 0; k < NPOL; k++)
        printf(" collects_%s=%" PRIu64, pname(k), tc[k]);
    for (int k = 0; k < NPOL; k++)
        printf(" growths_%s=%" PRIu64, pname(k), tg[k]);
    printf(" overlaps=%" PRIu64 " failed=%d reclaim=%s\n", tov, failed,
           reclaim == HA_RECLAIM_EAGER ? "eager" : "collect");
    free(rows);
    return failed || tov ? 1 : 0;
}
