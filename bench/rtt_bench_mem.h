/* rtt_bench_mem.h - part of rtt_bench.c (included once, where it stands,
 * after the process bookkeeping it uses: g_heapd, die, wait_clients,
 * attach_1rank, MEM_BLOCKS): heapd's memory per live block and its CPU use
 * while idle. A file of its own only to keep rtt_bench.c readable. */
#ifndef RTT_BENCH_MEM_H
#define RTT_BENCH_MEM_H

/* ---- memory per live block ------------------------------------------------ */

static uint64_t proc_kib(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        die("cannot read %s: %s", path, strerror(errno));
    size_t kl = strlen(key);
    uint64_t v = UINT64_MAX;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':')
            v = strtoull(line + kl + 1, NULL, 10);
    fclose(f);
    if (v == UINT64_MAX)
        die("%s has no %s line", path, key);
    return v;
}

typedef struct mem_result {
    uint64_t rss0, rss1, anon0, anon1; /* KiB */
    double bytes_per_block, anon_bytes_per_block;
} mem_result;

static mem_result run_memory(void)
{
    heapc *c = attach_1rank("rtt-mem");
    uint64_t off;
    /* One allocation first so that lazily built per-heap state exists; the
     * delta then covers the other 10^5 - 1 blocks. */
    if (heapc_alloc(c, ALLOC_SIZE, NULL, &off) != HEAPC_OK)
        die("memory: heapc_alloc: %s", heapc_errstr(c));
    mem_result m;
    m.rss0 = proc_kib(g_heapd, "VmRSS");
    m.anon0 = proc_kib(g_heapd, "RssAnon");
    for (uint32_t i = 1; i < MEM_BLOCKS; i++)
        if (heapc_alloc(c, ALLOC_SIZE, NULL, &off) != HEAPC_OK)
            die("memory: heapc_alloc #%u: %s", i, heapc_errstr(c));
    m.rss1 = proc_kib(g_heapd, "VmRSS");
    m.anon1 = proc_kib(g_heapd, "RssAnon");
    heapc_counters k;
    heapc_get_counters(c, &k);
    if (k.collects || k.chunks_mapped != 1)
        die("memory: the heap collected or grew (%" PRIu64 " collects, %" PRIu64 " chunks)", k.collects,
            k.chunks_mapped);
    if (heapc_detach(c) != HEAPC_OK)
        die("memory: heapc_detach: %s", heapc_errstr(c));
    heapc_free_ctx(c);
    double n = MEM_BLOCKS - 1;
    m.bytes_per_block = ((double)m.rss1 - (double)m.rss0) * 1024.0 / n;
    m.anon_bytes_per_block = ((double)m.anon1 - (double)m.anon0) * 1024.0 / n;
    return m;
}

/* ---- heapd idle ------------------------------------------------------------ */

/* heapd's CPU time (utime + stime, clock ticks) from /proc/PID/stat. */
static double proc_cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        die("cannot read %s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        die("cannot parse %s", path);
    return (double)(ut + st);
}

/* heapd's CPU use in % of one core over `secs` while `n` ring clients are
 * attached and idle. */
static double idle_cpu(int n, double secs)
{
    int ready[2], hold[2];
    if (pipe(ready) || pipe(hold))
        die("pipe: %s", strerror(errno));
    for (int i = 0; i < n; i++) {
        pid_t p = fork_child();
        if (p == 0) {
            close(ready[0]);
            close(hold[1]);
            char heap[64];
            snprintf(heap, sizeof heap, "idle-%d", i);
            client_env(RING);
            heapc *c = attach_1rank(heap);
            uint64_t off;
            if (heapc_alloc(c, ALLOC_SIZE, NULL, &off) != HEAPC_OK)
                die("idle client %d: heapc_alloc: %s", i, heapc_errstr(c));
            char b = 1;
            if (write(ready[1], &b, 1) != 1 || read(hold[0], &b, 1) < 0)
                _exit(1);
            heapc_free_ctx(c);
            _exit(0);
        }
        g_kids[g_nkids++] = p;
    }
    close(ready[1]);
    close(hold[0]);
    for (int i = 0; i < n; i++) {
        char b;
        if (read(ready[0], &b, 1) != 1)
            die("an idle client failed to attach");
    }
    usleep(100000); /* the spin and back-off budgets run out */
    long hz = sysconf(_SC_CLK_TCK);
    double t0 = now_us(), c0 = proc_cpu_ticks(g_heapd);
    usleep((useconds_t)(secs * 1e6));
    double c1 = proc_cpu_ticks(g_heapd), t1 = now_us();
    close(hold[1]);
    close(ready[0]);
    wait_clients("idle clients");
    return (c1 - c0) / (double)hz / ((t1 - t0) / 1e6) * 100.0;
}

#endif
