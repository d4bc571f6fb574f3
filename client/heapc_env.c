/* heapc_env.c - libheapc: heapc_attach_env, the rank, world and job from the
 * launcher's environment (torchrun, Slurm). */
#include "heapc_int.h"
#include "env.h"

/* ---- attach from the launcher's environment ------------------------------ */

/* An unsigned decimal variable into *out; 0 when set and valid, else an
 * error naming it. */
static int env_u32(heapc *c, const char *launcher, const char *name, uint32_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach_env: %s is not set, but the other %s variables are: "
                           "start the job with %s, or set %s",
                           name, launcher, launcher[0] == 't' ? "torchrun" : "srun", name);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || x > UINT32_MAX || v[0] == '-')
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach_env: %s=\"%s\" is not a rank count or "
                           "rank number (want a decimal integer below 2^32)",
                           name, v);
    *out = (uint32_t)x;
    return 0;
}

/* Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of 3 nodes, then
 * 1) at node `node`; 0 when the list does not reach it. */
static uint32_t slurm_tasks_on_node(const char *list, uint32_t node)
{
    const char *p = list;
    uint64_t at = 0;
    while (*p) {
        char *end;
        unsigned long n = strtoul(p, &end, 10), rep = 1;
        if (end == p)
            return 0;
        p = end;
        if (p[0] == '(' && p[1] == 'x') {
            rep = strtoul(p + 2, &end, 10);
            if (end == p + 2 || *end != ')')
                return 0;
            p = end + 1;
        }
        if (node < at + rep)
            return (uint32_t)n;
        at += rep;
        if (*p == ',')
            p++;
        else if (*p)
            return 0;
    }
    return 0;
}

/* What the launcher says: this rank, the world size, the ranks on this node,
 * the job's id (into job[128]) and the heap's default name (into name[192]). */
typedef struct launch {
    const char *launcher;
    uint32_t rank, world, local;
    char job[128], name[192];
} launch;

/* The job id a + sep + b into job[128]. heapd takes jobs of up to 127
 * bytes: a longer id is cut (at a UTF-8 character's start) to leave room
 * for "~" and 16 hex digits of the whole id's 64-bit FNV-1a hash, so that
 * two ids that share their first bytes never make one job (or heap) name. */
static void job_id(char job[128], const char *a, const char *sep, const char *b)
{
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b), n = la + ls + lb;
    if (n <= 127) {
        snprintf(job, 128, "%s%s%s", a, sep, b);
        return;
    }
    uint64_t h = 1469598103934665603ull;
    const char *part[3] = {a, sep, b};
    for (int i = 0; i < 3; i++)
        for (const unsigned char *p = (const unsigned char *)part[i]; *p; p++)
            h = (h ^ *p) * 1099511628211ull;
    char full[128];
    snprintf(full, sizeof full, "%s%s%s", a, sep, b); /* cut at 127 */
    size_t keep = 127 - 17;
    while (keep > 0 && ((unsigned char)full[keep] & 0xc0) == 0x80)
        keep--; /* not inside a character */
    snprintf(job, 128, "%.*s~%016" PRIx64, (int)keep, full, h);
}

/* torchrun: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID. */
static int env_torchrun(heapc *c, launch *l)
{
    int rc;
    l->launcher = "torchrun";
    if ((rc = env_u32(c, l->launcher, "RANK", &l->rank)) || (rc = env_u32(c, l->launcher, "WORLD_SIZE", &l->world)) ||
        (rc = env_u32(c, l->launcher, "LOCAL_WORLD_SIZE", &l->local)))
        return rc;
    /* torchrun's run id defaults to "none" (no --rdzv-id): two jobs on one
     * node would meet in one heap. MASTER_ADDR:MASTER_PORT is unique while
     * the job runs (its rendezvous store listens there). */
    const char *id = getenv("TORCHELASTIC_RUN_ID"), *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (id && *id && strcmp(id, "none") != 0)
        job_id(l->job, id, "", "");
    else if (addr && *addr && port && *port)
        job_id(l->job, addr, "-", port);
    else
        return 0; /* no unique id: l->name stays empty (see launch_name) */
    snprintf(l->name, sizeof l->name, "torch-%s", l->job);
    return 0;
}

/* The heap's name: `heap`, else $HEAPD_HEAP, else the launcher's (l->name);
 * NULL (error set) when none is unique to the job. */
static const char *launch_name(heapc *c, const char *heap, const launch *l)
{
    if (heap && *heap)
        return heap;
    const char *h = getenv("HEAPD_HEAP");
    if (h && *h)
        return h;
    if (l->name[0])
        return l->name;
    const char *id = getenv("TORCHELASTIC_RUN_ID");
    hci_set_err(c, HEAPC_EINVAL,
                "heapc_attach_env: torchrun gave no run id (TORCHELASTIC_RUN_ID=\"%s\") and "
                "MASTER_ADDR/MASTER_PORT are not both set, so no heap name unique to this job "
                "is known; start torchrun with --rdzv-id=ID (--rdzv_id) or --standalone, or "
                "set HEAPD_HEAP to a name of the job",
                id ? id : "");
    return NULL;
}

/* srun: SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE (or
 * SLURM_TASKS_PER_NODE at SLURM_NODEID), SLURM_JOB_ID, SLURM_STEP_ID. */
static int env_slurm(heapc *c, launch *l)
{
    int rc;
    l->launcher = "Slurm";
    if ((rc = env_u32(c, l->launcher, "SLURM_PROCID", &l->rank)) ||
        (rc = env_u32(c, l->launcher, "SLURM_NTASKS", &l->world)))
        return rc;
    const char *tpn = getenv("SLURM_NTASKS_PER_NODE");
    if (tpn && *tpn) {
        if ((rc = env_u32(c, l->launcher, "SLURM_NTASKS_PER_NODE", &l->local)))
            return rc;
    } else {
        const char *list = getenv("SLURM_TASKS_PER_NODE");
        uint32_t node;
        if ((rc = env_u32(c, l->launcher, "SLURM_NODEID", &node)))
            return rc;
        if (!list || !(l->local = slurm_tasks_on_node(list, node)))
            return hci_set_err(c, HEAPC_EINVAL,
                               "heapc_attach_env: cannot tell how many Slurm tasks "
                               "run on node %" PRIu32 ": SLURM_NTASKS_PER_NODE is not set and "
                               "SLURM_TASKS_PER_NODE=\"%s\" does not say; set SLURM_NTASKS_PER_NODE",
                               node, list ? list : "(unset)");
    }
    const char *id = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (!id || !*id)
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach_env: SLURM_JOB_ID is not set, but "
                           "SLURM_PROCID is: start the job with srun, or set SLURM_JOB_ID");
    job_id(l->job, id, ".", step && *step ? step : "0");
    snprintf(l->name, sizeof l->name, "slurm-%s", l->job);
    return 0;
}

/* The launcher's variables into *l, checked. */
static int env_launch(heapc *c, launch *l)
{
    int rc;
    if (getenv("RANK") && *getenv("RANK"))
        rc = env_torchrun(c, l);
    else if (getenv("SLURM_PROCID") && *getenv("SLURM_PROCID"))
        rc = env_slurm(c, l);
    else
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach_env: no launcher environment: RANK "
                           "(torchrun: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID) and "
                           "SLURM_PROCID (srun: SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, "
                           "SLURM_JOB_ID) are both unset; start the job with torchrun or srun, or "
                           "call heapc_attach with the rank and world size");
    if (rc)
        return rc;
    if (l->world == 0 || l->rank >= l->world)
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach_env: %s rank %" PRIu32 " is not below its "
                           "world size %" PRIu32,
                           l->launcher, l->rank, l->world);
    if (l->local == 0 || l->local > l->world)
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach_env: %s says %" PRIu32 " rank(s) on this node "
                           "of a world of %" PRIu32 "; want 1 to the world size",
                           l->launcher, l->local, l->world);
    return 0;
}

/* Issue 29: $HEAPD_PERSIST (or $HEAPC_PERSIST) when the params leave
 * persist_s at 0: seconds, "none" (or -1) for none; unset or "": heapd's
 * default. 0, or an error naming the variable. */
static int env_persist(heapc *c, int32_t *persist)
{
    const char *v = henv_get("PERSIST");
    if (*persist != 0 || !v || !*v)
        return 0;
    if (strcmp(v, "none") == 0 || strcmp(v, "-1") == 0) {
        *persist = -1;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || x > INT32_MAX || v[0] == '-')
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach_env: HEAPD_PERSIST=\"%s\" is not a persist: want seconds "
                           "(a decimal integer below 2^31; 0: heapd's default) or \"none\"",
                           v);
    *persist = (int32_t)x;
    return 0;
}

int heapc_attach_env(heapc *c, const char *heap, const heapc_params *params)
{
    if (!c)
        return HEAPC_EINVAL;
    heapc_params p;
    if (params)
        p = *params;
    else
        memset(&p, 0, sizeof p);
    launch l = {0};
    pthread_mutex_lock(&c->mu);
    int rc = env_launch(c, &l);
    if (rc == 0)
        rc = env_persist(c, &p.persist_s);
    if (rc == 0) {
        if (p.local_size == 0 && l.local < l.world)
            p.local_size = l.local;
        heap = launch_name(c, heap, &l);
        if (!p.job || !*p.job)
            p.job = l.job[0] ? l.job : heap;
        rc = heap ? hci_attach_locked(c, heap, l.rank, l.world, &p) : HEAPC_EINVAL;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}
