/* heapsim - replay an allocation trace through heapd's allocator core.
 *
 *   heapsim [--policy P] [--offsets] TRACE     (TRACE "-": stdin)
 *
 * The same code the daemon runs (daemon/alloc.h) makes every decision, so
 * a trace replayed here lands on the offsets a real job would get. The trace
 * format is in usage() below. Exit status: 0 done, 1 an allocation failed
 * (or out of memory), 2 a usage error or a bad trace line.
 */
#include "heapsim.h"
#include "size.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef HEAPD_VERSION
#define HEAPD_VERSION "unknown"
#endif

#define MAX_ID_LEN 64
/* Steps of the alloc protocol one allocation may take: collect, grow, ok. */
#define MAX_PROTOCOL_STEPS 8

static void usage(FILE *f)
{
    fprintf(f,
            "usage: heapsim [--policy P] [--reclaim R] [--offsets] TRACE\n"
            "       heapsim --compare [--reclaim R] [--worst N] TRACE...\n"
            "       heapsim --generate SEED [MAX_ALLOCS] > TRACE\n"
            "       heapsim --help | --version\n"
            "\n"
            "Replays TRACE (\"-\" reads stdin) through heapd's allocator core and prints\n"
            "one summary line:\n"
            "  mapped=BYTES growths=N collects=N live=BYTES pending=BYTES free=BYTES\n"
            "  allocs=N frees=N triggered=N overlaps=N policy=NAME empty=N skipped=N\n"
            "  reclaim=eager|collect eager_reclaims=N\n"
            "(collects counts explicit and triggered ones; triggered counts those an\n"
            "allocation asked for, before growing or on the seed policy's trigger;\n"
            "empty counts collects that reclaimed nothing; skipped counts collects\n"
            "before a growth the coalesce policy did not ask for because one had just\n"
            "run or no block existed, where the seed's rule asks; eager_reclaims counts\n"
            "blocks reclaimed at their last free, with no collect).\n"
            "\n"
            "options:\n"
            "  --policy P   allocator policy, one of: %s (the first is the default)\n"
            "  --reclaim R  collect (the default here) or eager: a block every rank\n"
            "               freed is reusable from the next allocation, with no collect\n"
            "               (heapd's default for a heap on one node; not with seed)\n"
            "  --offsets    first print \"c\" for every collect and \"a ID OFFSET\" for\n"
            "               every allocation, in order (a triggered collect comes\n"
            "               before the line of the allocation that triggered it)\n"
            "  --help       this text\n"
            "  --version    print the version\n"
            "\n"
            "trace format (one command a line; '#' starts a comment):\n"
            "  heap ranks=R chunk=SIZE initial=SIZE min_block=SIZE [va=SIZE]\n"
            "                  first line; va defaults to 64 * initial\n"
            "  a ID SIZE       every rank allocates SIZE bytes, the block is named ID\n"
            "  f RANK ID       rank RANK frees block ID (\"f * ID\": every rank frees it)\n"
            "  c               a collect on every rank\n"
            "SIZE is bytes with an optional K, M, G or T suffix (powers of 1024); an ID is\n"
            "any word of up to %d characters and can be reused once every rank freed it.\n"
            "\n"
            "exit status: 0 ok, 1 an allocation failed, 2 usage error or bad trace line\n",
            HPO_NAMES, MAX_ID_LEN);
}

/* ---- the replay --------------------------------------------------------- */

/* A bad trace line: message, exit status 2. */
static int bad_line(const sim *s, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "heapsim: %s:%lu: ", s->name, s->line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

/* Any other failure at this line: message, exit status 1. */
static int failed_at(const sim *s, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "heapsim: %s:%lu: ", s->name, s->line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

int sim_parse_u64(const char *t, uint64_t *out)
{
    if (*t < '0' || *t > '9')
        return -1;
    uint64_t v = 0;
    for (; *t; t++) {
        if (*t < '0' || *t > '9')
            return -1;
        unsigned d = (unsigned)(*t - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

#define MAX_TOKENS 8

/* Splits line in place into at most MAX_TOKENS words, dropping a '#'
 * comment. Returns the word count, or MAX_TOKENS + 1 when there are more. */
static int split(char *line, char **tok)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    int n = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\v' || *p == '\f')
            p++;
        if (*p == '\0')
            return n;
        if (n == MAX_TOKENS)
            return MAX_TOKENS + 1;
        tok[n++] = p;
        while (*p && !(*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\v' || *p == '\f'))
            p++;
        if (*p)
            *p++ = '\0';
    }
}

static const char heap_syntax[] = "heap ranks=R chunk=SIZE initial=SIZE min_block=SIZE [va=SIZE]";

static int do_heap(sim *s, char **tok, int n)
{
    if (s->heap)
        return bad_line(s, "a second heap line: a trace describes one heap; remove this line "
                           "or split the trace");
    /* eager: heapsim is the one decider, as heapd is for a heap on one node */
    ha_params p = {.policy = s->policy, .reclaim = s->reclaim, .one_decider = s->reclaim == HA_RECLAIM_EAGER};
    int have_ranks = 0, have_chunk = 0, have_initial = 0, have_min = 0, have_va = 0;
    for (int i = 1; i < n; i++) {
        char *eq = strchr(tok[i], '=');
        if (eq == NULL)
            return bad_line(s, "'%s' is not key=value: write %s", tok[i], heap_syntax);
        *eq = '\0';
        const char *k = tok[i], *v = eq + 1;
        int *have;
        uint64_t *dst = NULL, r64 = 0;
        if (strcmp(k, "ranks") == 0) {
            have = &have_ranks;
            if (sim_parse_u64(v, &r64) != 0 || r64 == 0 || r64 > HA_MAX_RANKS)
                return bad_line(s, "ranks=%s: give a whole number of ranks from 1 to %u", v, HA_MAX_RANKS);
            p.ranks = (uint32_t)r64;
        } else if (strcmp(k, "chunk") == 0) {
            have = &have_chunk;
            dst = &p.chunk_size;
        } else if (strcmp(k, "initial") == 0) {
            have = &have_initial;
            dst = &p.initial_size;
        } else if (strcmp(k, "min_block") == 0) {
            have = &have_min;
            dst = &p.min_block;
        } else if (strcmp(k, "va") == 0) {
            have = &have_va;
            dst = &p.va_size;
        } else {
            return bad_line(s, "unknown heap key '%s': write %s", k, heap_syntax);
        }
        if (*have)
            return bad_line(s, "heap key '%s' given twice: keep one", k);
        *have = 1;
        if (dst && hsz_parse_size(v, dst) != 0)
            return bad_line(s,
                            "%s=%s is not a size: write bytes with an optional K, M, G or T "
                            "suffix, e.g. %s=256M",
                            k, v, k);
    }
    const char *missing = !have_ranks     ? "ranks"
                          : !have_chunk   ? "chunk"
                          : !have_initial ? "initial"
                          : !have_min     ? "min_block"
                                          : NULL;
    if (missing)
        return bad_line(s, "the heap line lacks %s=: write %s", missing, heap_syntax);
    if (!have_va) {
        /* 64 * initial, or initial itself when that would overflow. */
        p.va_size = p.initial_size <= UINT64_MAX / 64 ? p.initial_size * 64 : p.initial_size;
    }
    char err[256];
    if (ha_params_check(&p, err, sizeof err) != HA_OK)
        return bad_line(s, "bad heap parameters: %s", err);
    int rc = ha_create(&p, &s->heap, err, sizeof err);
    if (rc != HA_OK)
        return failed_at(s, "cannot create the heap: %s", err);
    s->ranks = p.ranks;
    s->unit = p.min_block;
    return 0;
}

/* Sets (on = 1) or clears the bits of [off, off + size); with on, returns
 * how many of them were already set (0 unless two blocks overlap). */
static uint64_t occ_mark(sim *s, uint64_t off, uint64_t size, int on)
{
    uint64_t a = off / s->unit, b = (off + size + s->unit - 1) / s->unit, hits = 0;
    size_t need = (size_t)((b + 63) / 64);
    if (need > s->occ_words) {
        size_t n = s->occ_words ? s->occ_words : 1024;
        while (n < need)
            n *= 2;
        uint64_t *o = realloc(s->occ, n * sizeof *o);
        if (o == NULL) {
            fprintf(stderr, "heapsim: out of memory for the overlap checker\n");
            exit(1);
        }
        memset(o + s->occ_words, 0, (n - s->occ_words) * sizeof *o);
        s->occ = o;
        s->occ_words = n;
    }
    for (uint64_t i = a; i < b;) {
        uint64_t w = i / 64, lo = i % 64, n = b - i < 64 - lo ? b - i : 64 - lo;
        uint64_t mask = (n == 64 ? UINT64_MAX : ((UINT64_C(1) << n) - 1)) << lo;
        if (on) {
            hits += (uint64_t)__builtin_popcountll(s->occ[w] & mask);
            s->occ[w] |= mask;
        } else {
            s->occ[w] &= ~mask;
        }
        i += n;
    }
    return hits;
}

static int collect_all(sim *s)
{
    uint64_t blocks = 0;
    int rc = ha_collect(s->heap, &blocks, NULL);
    if (rc >= 0 && blocks == 0)
        s->empty++;
    if (rc < 0)
        return failed_at(s, "collect failed: %s", ha_strerror(rc));
    for (size_t i = 0; i < s->nrel; i++)
        occ_mark(s, s->rel[2 * i], s->rel[2 * i + 1], 0);
    s->nrel = 0;
    if (s->offsets)
        fputs("c\n", stdout);
    return 0;
}

static int do_alloc(sim *s, char **tok, int n)
{
    if (n != 3)
        return bad_line(s, "'a' takes an ID and a size: write a ID SIZE");
    const char *id = tok[1];
    uint64_t size;
    if (strlen(id) > MAX_ID_LEN)
        return bad_line(s, "ID '%.20s...' is longer than %d characters: use a shorter name", id, MAX_ID_LEN);
    if (hsz_parse_size(tok[2], &size) != 0)
        return bad_line(s,
                        "'%s' is not a size: write bytes with an optional K, M, G or T "
                        "suffix, e.g. 1M",
                        tok[2]);
    if (size == 0)
        return bad_line(s, "a %s 0: an allocation needs at least 1 byte", id);
    if (idmap_find(&s->ids, id))
        return bad_line(s,
                        "ID '%s' names a block some rank still holds: free it on every rank "
                        "first (f * %s) or use another ID",
                        id, id);
    ha_alloc_result res;
    int rc = 0;
    for (int step = 0;; step++) {
        if (step == MAX_PROTOCOL_STEPS)
            return failed_at(s,
                             "a %s %s: the allocator asked for more than %d collect/grow "
                             "steps; this is a bug in the allocator core, please report it "
                             "with this trace",
                             id, tok[2], MAX_PROTOCOL_STEPS);
        memset(&res, 0, sizeof res);
        rc = ha_alloc(s->heap, size, &res);
        if (rc == HA_NEED_COLLECT) {
            s->triggered++;
            if ((rc = collect_all(s)) != 0)
                return rc;
            continue;
        }
        if (rc == HA_NEED_TRIM && (rc = ha_trim(s->heap, NULL, NULL, NULL)) == HA_OK)
            continue; /* issue 30: trim_threshold (none in traces yet) */
        if (rc == HA_NEED_GROW) {
            int g = ha_grow(s->heap, res.grow_chunks);
            if (g < 0) {
                ha_stats st;
                ha_get_stats(s->heap, &st);
                return failed_at(s,
                                 "a %s %s: growing the heap by %" PRIu32 " chunks (mapped "
                                 "%" PRIu64 " bytes) failed: %s",
                                 id, tok[2], res.grow_chunks, st.mapped, ha_strerror(g));
            }
            continue;
        }
        break;
    }
    if (rc != HA_OK) {
        ha_stats st;
        ha_get_stats(s->heap, &st);
        const ha_params *p = ha_get_params(s->heap);
        return failed_at(s,
                         "a %s %s: allocation of %" PRIu64 " bytes failed: %s (mapped %" PRIu64 ", live %" PRIu64
                         ", pending %" PRIu64 ", va=%" PRIu64 ")%s",
                         id, tok[2], size, ha_strerror(rc), st.mapped, st.live_bytes, st.pending_bytes, p->va_size,
                         rc == HA_EVA ? "; raise va= in the heap line or free more blocks "
                                        "before this line"
                                      : "");
    }
    id_entry *e = idmap_insert(&s->ids, id);
    if (e == NULL)
        return failed_at(s, "out of memory for the ID table");
    e->offset = res.offset;
    e->size = res.block_size;
    e->holders = s->ranks;
    uint64_t hits = occ_mark(s, res.offset, res.block_size, 1);
    if (hits) {
        s->overlaps++;
        fprintf(stderr,
                "heapsim: %s:%lu: a %s %s: block [%" PRIu64 ", +%" PRIu64 ") overlaps "
                "a block some rank holds or that no collect has reclaimed (%" PRIu64 " units of %" PRIu64
                " bytes); this is a bug in the allocator core\n",
                s->name, s->line, id, tok[2], res.offset, res.block_size, hits, s->unit);
    }
    if (s->offsets)
        printf("a %s %" PRIu64 "\n", id, res.offset);
    return 0;
}

static int free_one(sim *s, id_entry *e, uint32_t rank, const char *id)
{
    int rc = ha_free(s->heap, rank, e->offset);
    if (rc == HA_ENOTHELD)
        return bad_line(s, "rank %" PRIu32 " already freed '%s': free it once per rank", rank, id);
    if (rc < 0)
        return failed_at(s, "f %" PRIu32 " %s (offset %" PRIu64 ") failed: %s", rank, id, e->offset, ha_strerror(rc));
    e->holders--;
    return 0;
}

static int do_free(sim *s, char **tok, int n)
{
    if (n != 3)
        return bad_line(s, "'f' takes a rank (or *) and an ID: write f RANK ID");
    const char *id = tok[2];
    id_entry *e = idmap_find(&s->ids, id);
    if (e == NULL)
        return bad_line(s,
                        "no live block is named '%s' (never allocated, or freed by every "
                        "rank already): check the ID",
                        id);
    int rc;
    if (strcmp(tok[1], "*") == 0) {
        /* Check first, so the message names the rank that already freed it. */
        for (uint32_t r = 0; r < s->ranks; r++)
            if (!ha_rank_holds(s->heap, r, e->offset))
                return bad_line(s,
                                "f * %s: rank %" PRIu32 " already freed '%s': free it on "
                                "the remaining ranks one by one",
                                id, r, id);
        for (uint32_t r = 0; r < s->ranks; r++)
            if ((rc = free_one(s, e, r, id)) != 0)
                return rc;
    } else {
        uint64_t r;
        if (sim_parse_u64(tok[1], &r) != 0)
            return bad_line(s, "'%s' is not a rank: write a rank number or *", tok[1]);
        if (r >= s->ranks)
            return bad_line(s, "rank %s is out of range: the heap has %" PRIu32 " ranks (0..%" PRIu32 ")", tok[1],
                            s->ranks, s->ranks - 1);
        if ((rc = free_one(s, e, (uint32_t)r, id)) != 0)
            return rc;
    }
    if (e->holders == 0 && s->reclaim == HA_RECLAIM_EAGER) {
        occ_mark(s, e->offset, e->size, 0); /* reclaimed at its last free */
        idmap_remove(&s->ids, e);
    } else if (e->holders == 0) {
        if (s->nrel == s->caprel) {
            size_t nc = s->caprel ? s->caprel * 2 : 256;
            uint64_t *r = realloc(s->rel, nc * 2 * sizeof *r);
            if (r == NULL)
                return failed_at(s, "out of memory for the overlap checker");
            s->rel = r;
            s->caprel = nc;
        }
        s->rel[2 * s->nrel] = e->offset;
        s->rel[2 * s->nrel + 1] = e->size;
        s->nrel++;
        idmap_remove(&s->ids, e); /* every rank released it: the ID is free again */
    }
    return 0;
}

static int do_line(sim *s, char *line)
{
    char *tok[MAX_TOKENS];
    int n = split(line, tok);
    if (n == 0)
        return 0;
    if (n > MAX_TOKENS)
        return bad_line(s, "too many words on the line");
    if (strcmp(tok[0], "heap") == 0)
        return do_heap(s, tok, n);
    if (s->heap == NULL)
        return bad_line(s, "'%s' before the heap line: the trace must start with %s", tok[0], heap_syntax);
    if (strcmp(tok[0], "a") == 0)
        return do_alloc(s, tok, n);
    if (strcmp(tok[0], "f") == 0)
        return do_free(s, tok, n);
    if (strcmp(tok[0], "c") == 0) {
        if (n != 1)
            return bad_line(s, "'c' takes no arguments");
        return collect_all(s);
    }
    return bad_line(s, "unknown command '%s': lines are heap, a, f or c", tok[0]);
}

static int replay(sim *s, FILE *in)
{
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    errno = 0;
    while (getline(&line, &cap, in) >= 0) {
        s->line++;
        if ((rc = do_line(s, line)) != 0)
            break;
    }
    if (rc == 0 && ferror(in)) {
        fprintf(stderr, "heapsim: %s: read error after line %lu: %s\n", s->name, s->line, strerror(errno));
        rc = 1;
    }
    free(line);
    if (rc == 0 && s->heap == NULL) {
        fprintf(stderr, "heapsim: %s: no heap line: start the trace with %s\n", s->name, heap_syntax);
        rc = 2;
    }
    return rc;
}

void sim_print_summary(const sim *s)
{
    ha_stats st;
    ha_get_stats(s->heap, &st);
    printf("mapped=%" PRIu64 " growths=%" PRIu64 " collects=%" PRIu64 " live=%" PRIu64 " pending=%" PRIu64
           " free=%" PRIu64 " allocs=%" PRIu64 " frees=%" PRIu64 " triggered=%" PRIu64 " overlaps=%" PRIu64
           " policy=%s empty=%" PRIu64 " skipped=%" PRIu64 " reclaim=%s eager_reclaims=%" PRIu64 "\n",
           st.mapped, st.growths, st.collects, st.live_bytes, st.pending_bytes, st.free_bytes, st.allocs, st.frees,
           s->triggered, s->overlaps, ha_policy_name(s->policy), s->empty, st.collects_skipped,
           s->reclaim == HA_RECLAIM_EAGER ? "eager" : "collect", st.eager_reclaims);
}

void sim_free(sim *s)
{
    idmap_free(&s->ids);
    if (s->heap)
        ha_destroy(s->heap);
    free(s->occ);
    free(s->rel);
}

/* Replays the trace at path ("-": stdin) into s (fresh, policy set). */
int sim_replay_path(sim *s, const char *path)
{
    FILE *in = stdin;
    s->name = "<stdin>";
    if (strcmp(path, "-") != 0) {
        s->name = path;
        in = fopen(path, "r");
        if (in == NULL) {
            fprintf(stderr, "heapsim: cannot open trace %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    if (idmap_init(&s->ids) != 0) {
        fprintf(stderr, "heapsim: out of memory\n");
        if (in != stdin)
            fclose(in);
        return 1;
    }
    int rc = replay(s, in);
    if (in != stdin)
        fclose(in);
    if (rc == 0 && s->overlaps)
        rc = 1;
    return rc;
}

/* heapsim --generate SEED [MAX_ALLOCS] */
static int main_generate(int argc, char **argv)
{
    uint64_t seed, max_steps = UINT64_MAX;
    if (argc < 3 || argc > 4 || sim_parse_u64(argv[2], &seed) != 0 ||
        (argc == 4 && (sim_parse_u64(argv[3], &max_steps) != 0 || max_steps == 0))) {
        fprintf(stderr, "heapsim: usage: heapsim --generate SEED [MAX_ALLOCS] > TRACE (whole "
                        "numbers)\n");
        return 2;
    }
    return gen_trace(seed, max_steps, stdout);
}

/* "eager" or "collect" -> *out; -1 (a message printed) otherwise. */
static int parse_reclaim(const char *v, ha_reclaim *out)
{
    if (v && strcmp(v, "eager") == 0)
        *out = HA_RECLAIM_EAGER;
    else if (v && strcmp(v, "collect") == 0)
        *out = HA_RECLAIM_COLLECT;
    else {
        fprintf(stderr, "heapsim: --reclaim takes eager or collect, not '%s'\n", v ? v : "");
        return -1;
    }
    return 0;
}

/* heapsim --compare [--reclaim R] [--worst N] TRACE... */
static int main_compare(int argc, char **argv)
{
    int first = 2, worst = 10;
    ha_reclaim reclaim = HA_RECLAIM_COLLECT;
    while (first + 1 < argc && (strcmp(argv[first], "--worst") == 0 || strcmp(argv[first], "--reclaim") == 0)) {
        if (strcmp(argv[first], "--reclaim") == 0) {
            if (parse_reclaim(argv[first + 1], &reclaim))
                return 2;
        } else {
            uint64_t w;
            if (sim_parse_u64(argv[first + 1], &w) != 0 || w > 100000) {
                fprintf(stderr, "heapsim: --worst takes a count, not '%s'\n", argv[first + 1]);
                return 2;
            }
            worst = (int)w;
        }
        first += 2;
    }
    if (first >= argc) {
        fprintf(stderr, "heapsim: usage: heapsim --compare [--reclaim R] [--worst N] TRACE...\n");
        return 2;
    }
    return cmp_traces(argc - first, argv + first, worst, reclaim);
}

int main(int argc, char **argv)
{
    sim s = {.policy = HA_POLICY_COALESCE};
    const char *path = NULL;
    if (argc >= 2 && strcmp(argv[1], "--generate") == 0)
        return main_generate(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "--compare") == 0)
        return main_compare(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *pol = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("heapsim %s\n", HEAPD_VERSION);
            return 0;
        } else if (strcmp(a, "--offsets") == 0) {
            s.offsets = 1;
        } else if (strcmp(a, "--policy") == 0) {
            if (i + 1 == argc) {
                fprintf(stderr, "heapsim: --policy needs a value: one of %s\n", HPO_NAMES);
                return 2;
            }
            pol = argv[++i];
        } else if (strncmp(a, "--policy=", 9) == 0) {
            pol = a + 9;
        } else if (strcmp(a, "--reclaim") == 0 || strncmp(a, "--reclaim=", 10) == 0) {
            if (parse_reclaim(a[9] == '=' ? a + 10 : i + 1 < argc ? argv[++i] : NULL, &s.reclaim))
                return 2;
        } else if (strcmp(a, "--") == 0) {
            if (i + 1 < argc && path == NULL)
                path = argv[++i];
            if (i + 1 < argc) {
                fprintf(stderr, "heapsim: more than one trace given; replay one at a time\n");
                return 2;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "heapsim: unknown option '%s'; run heapsim --help for usage\n", a);
            return 2;
        } else if (path == NULL) {
            path = a;
        } else {
            fprintf(stderr,
                    "heapsim: more than one trace given ('%s' and '%s'); replay one "
                    "at a time\n",
                    path, a);
            return 2;
        }
        if (pol && ha_policy_parse(pol, &s.policy) != HA_OK) {
            fprintf(stderr, "heapsim: unknown policy '%s': use one of %s\n", pol, HPO_NAMES);
            return 2;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "heapsim: no trace given; usage: heapsim [--policy P] [--reclaim R] "
                        "[--offsets] TRACE (\"-\" for stdin)\n");
        return 2;
    }
    if (s.policy == HA_POLICY_SEED && s.reclaim == HA_RECLAIM_EAGER) {
        fprintf(stderr, "heapsim: the seed policy reclaims only at collects: drop --reclaim eager, "
                        "or use --policy coalesce\n");
        return 2;
    }
    int rc = sim_replay_path(&s, path);
    if (s.heap && (rc == 0 || s.overlaps))
        sim_print_summary(&s);
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "heapsim: cannot write the output: %s\n", strerror(errno));
        rc = 1;
    }
    sim_free(&s);
    return rc;
}
