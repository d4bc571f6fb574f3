/* heapc_env.c - libheapc: heapc_attach_env, the rank, world and job from the
 * launcher's environment (torchrun, Slurm). */
#include "heapc_int.h"

/* ---- attach from the launcher's environment ------------------------------ */

/* An unsigned decimal variable into *out; 0 when set and valid, else an
 * error naming it. */
static int env_u32(heapc *c, const char *launcher, const char *name, uint32_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return hci_set_err(c, HEAPC_EINVAL,
                       "heapc_attach_env: %s is not set, but the other %s variables are: "
                       "start the job with %s, or set %s", name, launcher,
                       launcher[0] == 't' ? "torchrun" : "srun", name);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || x > UINT32_MAX || v[0] == '-')
        return hci_set_err(c, HEAPC_EINVAL, "heapc_attach_env: %s=\"%s\" is not a rank count or "
                       "rank number (want a decimal integer below 2^32)", name, v);
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

int heapc_attach_env(heapc *c, const char *heap, const heapc_params *params)
{
    if (!c)
        return HEAPC_EINVAL;
    heapc_params p;
    if (params)
        p = *params;
    else
        memset(&p, 0, sizeof p);
    uint32_t rank, world, local = 0;
    char job[128] = "", name[192];
    const char *launcher;
    int rc;
    pthread_mutex_lock(&c->mu);
    if (getenv("RANK") && *getenv("RANK")) {
        launcher = "torchrun";
        if ((rc = env_u32(c, launcher, "RANK", &rank)) || (rc = env_u32(c, launcher, "WORLD_SIZE", &world)) ||
            (rc = env_u32(c, launcher, "LOCAL_WORLD_SIZE", &local)))
            goto out;
        const char *id = getenv("TORCHELASTIC_RUN_ID");
        snprintf(job, sizeof job, "%s", id && *id ? id : "none");
        snprintf(name, sizeof name, "torch-%s", job);
    } else if (getenv("SLURM_PROCID") && *getenv("SLURM_PROCID")) {
        launcher = "Slurm";
        if ((rc = env_u32(c, launcher, "SLURM_PROCID", &rank)) ||
            (rc = env_u32(c, launcher, "SLURM_NTASKS", &world)))
            goto out;
        const char *tpn = getenv("SLURM_NTASKS_PER_NODE");
        if (tpn && *tpn) {
            if ((rc = env_u32(c, launcher, "SLURM_NTASKS_PER_NODE", &local)))
                goto out;
        } else {
            const char *list = getenv("SLURM_TASKS_PER_NODE");
            uint32_t node;
            if ((rc = env_u32(c, launcher, "SLURM_NODEID", &node)))
                goto out;
            if (!list || !(local = slurm_tasks_on_node(list, node))) {
                rc = hci_set_err(c, HEAPC_EINVAL, "heapc_attach_env: cannot tell how many Slurm tasks "
                             "run on node %" PRIu32 ": SLURM_NTASKS_PER_NODE is not set and "
                             "SLURM_TASKS_PER_NODE=\"%s\" does not say; set SLURM_NTASKS_PER_NODE",
                             node, list ? list : "(unset)");
                goto out;
            }
        }
        const char *id = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
        if (!id || !*id) {
            rc = hci_set_err(c, HEAPC_EINVAL, "heapc_attach_env: SLURM_JOB_ID is not set, but "
                         "SLURM_PROCID is: start the job with srun, or set SLURM_JOB_ID");
            goto out;
        }
        snprintf(job, sizeof job, "%s.%s", id, step && *step ? step : "0");
        snprintf(name, sizeof name, "slurm-%s", job);
    } else {
        rc = hci_set_err(c, HEAPC_EINVAL, "heapc_attach_env: no launcher environment: RANK "
                     "(torchrun: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID) and "
                     "SLURM_PROCID (srun: SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, "
                     "SLURM_JOB_ID) are both unset; start the job with torchrun or srun, or "
                     "call heapc_attach with the rank and world size");
        goto out;
    }
    if (world == 0 || rank >= world) {
        rc = hci_set_err(c, HEAPC_EINVAL, "heapc_attach_env: %s rank %" PRIu32 " is not below its "
                     "world size %" PRIu32, launcher, rank, world);
        goto out;
    }
    if (local == 0 || local > world) {
        rc = hci_set_err(c, HEAPC_EINVAL, "heapc_attach_env: %s says %" PRIu32 " rank(s) on this node "
                     "of a world of %" PRIu32 "; want 1 to the world size", launcher, local, world);
        goto out;
    }
    if (p.local_size == 0 && local < world)
        p.local_size = local;
    if (!p.job || !*p.job)
        p.job = job;
    if (!heap || !*heap) {
        const char *h = getenv("HEAPD_HEAP");
        heap = h && *h ? h : name;
    }
    rc = hci_attach_locked(c, heap, rank, world, &p);
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}
