#!/usr/bin/env python3
"""train_bench.py - a training loop with torch's caching allocator against the
same loop with every CUDA allocation on a heapd heap (issue 27), and on a heap
whose ranks decide their allocations locally (issue 28).

    HEAPD_SOCKET=... python3 bench/train_bench.py [--host] [--rounds 3] [--steps 20]
        [--warmup 5] [--time-limit 80] [--configs 1,2] [--build build-gpu]

The model: torch.nn.TransformerEncoder, 6 layers, d_model 1024, 16 heads,
dim_feedforward 4096, batch_first; a batch of 8 x 512 tokens (random inputs,
loss = mean square of the output), bf16 autocast, AdamW. Each run: --warmup
steps, then --steps timed steps (torch.cuda.synchronize after each; the step
time is the median). Three ways to run it:
  torch: torch's caching allocator; peak memory = torch.cuda.max_memory_reserved();
  heap:  heapd.torch.install_allocator() before the first CUDA allocation, then
         the whole loop (model, optimizer, data, every step) inside
         heapd.torch.use_heap(heap) on a heap of world W, chunk 256 MiB; peak
         memory = the largest heap.status().mapped seen after any step (this
         rank's mapped bytes), plus heapd's stats: collects, growths,
         eager_reclaims.
  local: the heap run on a heap made with decide="local", decide_every 64
         (--decide-every; issue 28: each rank's libheapc decides its
         allocations with a replica of the allocator, every 64th one, and
         those that need a collect, growth or trim, a round trip to heapd);
         the same figures, plus the heap's counters local_allocs and
         replica_lost (of every rank: the fewest and the most).
Configurations: 1rank (one process) and 2rank (two processes on cuda:0 at once,
each running the loop; the heap has world 2; torch's anchor is two torch
processes at once). With 2 ranks every step ends with a barrier of the ranks
(a one-element gloo all_reduce on the CPU, where DDP would all-reduce the
gradients; NCCL cannot run two ranks on one GPU): a symmetric heap reuses a
block once every rank freed it, so ranks that drift apart without ever
meeting make it grow, where real jobs meet at every collective. Every run is a fresh process (a pluggable allocator can
only be set before the first CUDA allocation); the ranks of a run start their
timed steps together (READY / GO over their pipes). A round runs every
configuration with the three modes back to back, torch in the middle and the
order flipping each round (heap, torch, local; then local, torch, heap: step
times move between runs on a shared machine; the ratio of each round is taken
within the round, its median over rounds is printed). Rounds stop early when
the next one would not fit in --time-limit (each run keeps its own timeout:
with three modes a round takes longer and fewer rounds fit).

Output: lines "train KEY VALUE" (scripts/gpu.sh copies them into gpu.log), per
configuration C: C_torch_step_ms, C_heap_step_ms, C_step_ratio (heap/torch),
C_torch_peak_mib, C_torch_allocated_peak_mib, C_heap_peak_mib, C_mem_ratio,
C_collects, C_growths, C_eager_reclaims, C_heap_allocs_per_step,
C_target_mem / C_target_step (met or missed; targets: heap mapped <= 1.15 x
torch's max reserved, step time <= 1.15 x), for the local mode C_local_step_ms,
C_local_step_ratio (local/torch), C_local_peak_mib, C_local_mem_ratio,
C_local_collects, C_local_growths, C_local_eager_reclaims,
C_local_heap_allocs_per_step, C_local_allocs (the fewest of any rank),
C_local_share (local_allocs / allocations, the smallest of any rank),
C_replica_lost (1 when a rank's replica was lost), C_local_target_mem /
C_local_target_step (targets: mapped <= 1.15 x torch's max reserved, step time
<= 1.05 x torch's), and "train C_MODE FAIL reason" for a run that failed (a
local run whose replica was lost or that decided no allocation locally fails).
Step times and peaks of a 2rank run: the slowest rank's median step, the
largest rank's peak (each rank's own memory).
--host: scripts/gpu.sh's dry run on a CPU machine: a small model on the CPU
(2 layers, d_model 64), the heap and local runs with parameters, gradients
and AdamW's moments as tensors of a host-backend heap (heap.empty; the
allocator route needs CUDA); torch's peak memory is not known there ("na").
Exit 0 when every run of every configuration gave figures."""
import argparse
import json
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 1.15
LOCAL_STEP_TARGET = 1.05    # issue 28: allocation without a message
MODES = ("torch", "heap", "local")
MIB = 1 << 20


# ---- one rank (a child process) ----------------------------------------------

def _model(torch, host):
    if host:
        d, heads, ff, layers, batch, seq = 64, 4, 128, 2, 2, 32
    else:
        d, heads, ff, layers, batch, seq = 1024, 16, 4096, 6, 8, 512
    layer = torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=ff, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return model, (batch, seq, d)


def _heap_state_on(heap, model, opt, torch):
    """Host backend: parameters, gradients and AdamW's moments as heap tensors."""
    for p in model.parameters():
        h = heap.empty_like(p)
        h.copy_(p.data)
        p.data = h
        p.grad = heap.zeros_like(p)
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": heap.zeros_like(p),
                        "exp_avg_sq": heap.zeros_like(p)}


def train(a, torch, heap, ht, out, sample):
    """The model, its optimizer and data, the warm-up, READY / GO, the timed
    steps; the figures into out. heap: None (torch) or the heap (host: the
    state's tensors on it; GPU: the caller's use_heap block routes all)."""
    dev = "cpu" if a.host else "cuda"

    def sync():
        if not a.host:
            torch.cuda.synchronize()
        if a.world > 1:                     # the step's barrier (DDP: the gradients' all-reduce)
            torch.distributed.all_reduce(torch.zeros(1))
    torch.manual_seed(1234)
    model, shape = _model(torch, a.host)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if heap is not None and a.host:
        _heap_state_on(heap, model, opt, torch)
    x = torch.randn(*shape, device=dev)
    cast = torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=not a.host)

    def step():
        with cast:
            y = model(x)
        loss = y.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=not (heap is not None and a.host))
        return loss
    warm_ms = 0.0
    for _ in range(a.warmup):
        t = time.perf_counter()
        step()
        sync()
        warm_ms = (time.perf_counter() - t) * 1000.0
        sample()
    # the parent answers GO with the number of timed steps, the same for every rank
    print(f"READY {warm_ms:.3f}", flush=True)
    go = sys.stdin.readline().split()
    if len(go) != 2 or go[0] != "GO":
        raise RuntimeError(f"the parent said {' '.join(go)!r}, not GO <steps>")
    steps = out["steps"] = int(go[1])
    allocs0 = ht.allocator_counters()["heap_allocs"] if ht else 0
    ts = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = step()
        sync()
        ts.append((time.perf_counter() - t) * 1000.0)
        sample()
    out["step_ms"] = statistics.median(ts)
    out["step_ms_all"] = [round(v, 3) for v in ts]
    out["loss"] = float(loss)
    if ht:
        out["heap_allocs_per_step"] = (ht.allocator_counters()["heap_allocs"] - allocs0) / steps


def child(a):
    """One rank: prints READY after the warm-up, waits for GO on stdin, runs
    the timed steps, prints RESULT {json}; on an error ERROR <reason>."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    heap, ht = None, None
    dev = "cpu" if a.host else "cuda"
    if a.mode in ("heap", "local"):
        import heapd
        if not a.host:
            import heapd.torch as ht
            ht.install_allocator()          # before anything touches torch's CUDA state
    if not a.host:
        torch.cuda.set_device(0)
    if a.world > 1:
        import torch.distributed
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.dist_port}",
                                             rank=a.rank, world_size=a.world)
    if a.mode in ("heap", "local"):
        kw = {"decide": "local", "decide_every": a.decide_every} if a.mode == "local" else {}
        heap = heapd.Heap(a.heap, a.rank, a.world, a.socket, chunk_size=a.chunk,
                          collect_timeout_ms=a.collect_timeout_ms, timeout_ms=a.reply_timeout_ms,
                          device=dev, **kw)
    out = {"mode": a.mode, "rank": a.rank, "world": a.world}
    if heap is not None:
        out["reclaim"] = heap.reclaim
        out["backend"] = heap.backend
    peak = [0]

    def sample():
        if heap is not None:
            peak[0] = max(peak[0], heap.status().mapped)

    if heap is not None and not a.host:
        with ht.use_heap(heap):             # raises when heapd refused an allocation
            train(a, torch, heap, ht, out, sample)
        out["allocator"] = ht.allocator_counters()
    else:
        train(a, torch, heap, ht, out, sample)
    if not a.host:
        torch.cuda.synchronize()
    if heap is not None:
        sample()
        out["peak_bytes"] = peak[0]
        ctr = heap.counters()               # this rank's client counters (issue 28)
        out.update({"local_allocs": ctr["local_allocs"], "replica_lost": ctr["replica_lost"],
                    "client_allocs": ctr["allocs"]})
        if a.rank == 0:
            st = heap.stats()
            out.update({k: st.get(k) for k in ("collects", "growths", "eager_reclaims",
                                                 "collects_skipped", "mapped")})
    elif not a.host:
        out["peak_bytes"] = torch.cuda.max_memory_reserved()
        out["allocated_peak_bytes"] = torch.cuda.max_memory_allocated()
    print("RESULT " + json.dumps(out), flush=True)
    # stay until every rank has its result: a rank that left could fail another's
    # growth (a collective) and would leave it the GPU to itself
    sys.stdin.readline()


def child_main(a):
    try:
        child(a)
    except BaseException as e:  # noqa: BLE001 - the parent needs one line, whatever it was
        import traceback
        traceback.print_exc()
        print("ERROR " + (f"{type(e).__name__}: {e}".replace("\n", " ")[:400]), flush=True)
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)     # no interpreter teardown: torch's frees after libheapc is gone


# ---- the parent ---------------------------------------------------------------

class Fail(Exception):
    def __init__(self, msg, timeout=False):
        super().__init__(msg)
        self.timeout = timeout


def _tail(path, n=3):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-600:]


def _timed_steps(a, warm_ms):
    """--steps, or fewer (at least 3) when the slowest rank's last warm-up step
    says they would take more than --timed-budget-s: the run stays in its timeout."""
    return max(3, min(a.steps, int(a.timed_budget_s * 1000.0 / max(warm_ms, 1e-3))))


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(a, mode, world, name, timeout):
    """world rank processes of one run; their RESULT dicts, or Fail(reason)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--world", str(world),
           "--heap", name, "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--chunk", a.chunk, "--collect-timeout-ms", str(a.collect_timeout_ms),
           "--reply-timeout-ms", str(a.reply_timeout_ms), "--dist-port", str(_free_port()),
           "--decide-every", str(a.decide_every)]
    if a.host:
        cmd.append("--host")
    if a.socket:
        cmd += ["--socket", a.socket]
    procs, errs = [], []
    sel = selectors.DefaultSelector()
    end = time.monotonic() + timeout
    try:
        for r in range(world):
            ef = tempfile.NamedTemporaryFile(prefix=f"train_bench.{mode}{world}.{r}.", suffix=".err",
                                             delete=False)
            errs.append(ef.name)
            p = subprocess.Popen(cmd + ["--rank", str(r)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=ef)
            ef.close()
            procs.append(p)
            sel.register(p.stdout, selectors.EVENT_READ, r)
        ready, res, buf = {}, {}, {r: b"" for r in range(world)}
        while len(res) < world:
            left = end - time.monotonic()
            if left <= 0:
                waiting = [r for r in range(world) if r not in res]
                raise Fail(f"timed out after {timeout:g} s (ranks {waiting} "
                           f"{'in the timed steps' if len(ready) == world else 'before READY'}); "
                           f"stderr: {_tail(errs[waiting[0]])}", timeout=True)
            for key, _ in sel.select(min(left, 1.0)):
                r = key.data
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    if r not in res:
                        rc = procs[r].wait(timeout=10)
                        raise Fail(f"rank {r} exited {rc} without a result; stderr: {_tail(errs[r])}")
                    continue
                buf[r] += chunk
                while b"\n" in buf[r]:
                    line, buf[r] = buf[r].split(b"\n", 1)
                    line = line.decode(errors="replace").strip()
                    if line.startswith("ERROR "):
                        raise Fail(f"rank {r}: {line[6:]}")
                    if line.startswith("READY "):
                        ready[r] = float(line[6:])
                        if len(ready) == world:
                            n = _timed_steps(a, max(ready.values()))
                            for p in procs:
                                p.stdin.write(f"GO {n}\n".encode())
                                p.stdin.flush()
                    elif line.startswith("RESULT "):
                        res[r] = json.loads(line[7:])
        for p in procs:
            p.stdin.write(b"EXIT\n")
            p.stdin.flush()
        for p in procs:     # the results are in: one that does not exit is killed below
            try:
                p.wait(timeout=max(1.0, min(10.0, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
        return [res[r] for r in range(world)]
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise Fail(f"{type(e).__name__}: {e}") from None
    finally:
        for p in procs:
            if p.poll() is None:    # by pid: they stay in our process group, which
                p.kill()            # scripts/gpu.sh's timeout kills as a whole
                p.wait()
        sel.close()
        for e in errs:
            try:
                os.unlink(e)
            except OSError:
                pass


def summarize(ranks):
    """One run: the slowest rank's median step, the largest rank's peak."""
    s = {"step_ms": max(r["step_ms"] for r in ranks), "steps": min(r["steps"] for r in ranks)}
    if all(r.get("peak_bytes") is not None for r in ranks):
        s["peak_mib"] = max(r["peak_bytes"] for r in ranks) / MIB
    if all(r.get("allocated_peak_bytes") is not None for r in ranks):
        s["allocated_peak_mib"] = max(r["allocated_peak_bytes"] for r in ranks) / MIB
    r0 = ranks[0]
    for k in ("collects", "growths", "eager_reclaims", "heap_allocs_per_step", "reclaim"):
        if r0.get(k) is not None:
            s[k] = r0[k]
    if r0.get("allocator"):       # allocations the shim served off the heap (outside use_heap)
        s["driver_allocs"] = max(r["allocator"]["driver_allocs"] for r in ranks)
    if r0.get("mode") == "local":  # issue 28: every rank's replica
        s["local_allocs"] = min(r["local_allocs"] for r in ranks)
        s["local_share"] = min(r["local_allocs"] / max(r["client_allocs"], 1) for r in ranks)
        s["replica_lost"] = max(r["replica_lost"] for r in ranks)
    s["loss"] = r0.get("loss")
    return s


def local_check(s):
    """A local run that did not decide locally: the reason, else None."""
    if s.get("replica_lost"):
        return f"replica_lost {s['replica_lost']}: a rank's replica stopped deciding"
    if not s.get("local_allocs"):
        return f"local_allocs {s.get('local_allocs')}: a rank decided no allocation locally"
    return None


def fmt(v):
    if v is None:
        return "na"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def emit(k, v):
    print(f"train {k} {fmt(v) if not isinstance(v, str) else v}", flush=True)


def report(cfg, runs, fails):
    """The figures of one configuration over the rounds; False when it lacks some."""
    t, h, lo = runs["torch"], runs["heap"], runs["local"]
    for mode in MODES:
        if fails.get(mode):
            emit(f"{cfg}_{mode}", "FAIL " + fails[mode])
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    ts, hs = [r["step_ms"] for r in t], [r["step_ms"] for r in h]
    emit(f"{cfg}_torch_step_ms", med(ts))
    emit(f"{cfg}_heap_step_ms", med(hs))
    # the ratio within each round that has both (adjacent runs), then their median
    pairs = [hh["step_ms"] / tt["step_ms"] for tt, hh in zip(t, h)]
    ratio = med(pairs)
    emit(f"{cfg}_step_ratio", ratio)
    emit(f"{cfg}_step_ratio_rounds", ",".join(f"{p:.3f}" for p in pairs) or "na")
    tp = max((r["peak_mib"] for r in t if "peak_mib" in r), default=None)
    ta = max((r["allocated_peak_mib"] for r in t if "allocated_peak_mib" in r), default=None)
    hp = max((r["peak_mib"] for r in h if "peak_mib" in r), default=None)
    emit(f"{cfg}_torch_peak_mib", tp)
    emit(f"{cfg}_torch_allocated_peak_mib", ta)
    emit(f"{cfg}_heap_peak_mib", hp)
    mratio = hp / tp if hp is not None and tp else None
    emit(f"{cfg}_mem_ratio", mratio)
    last = h[-1] if h else {}
    for k in ("collects", "growths", "eager_reclaims", "heap_allocs_per_step", "reclaim"):
        emit(f"{cfg}_{k}", last.get(k))
    for k, r in (("mem", mratio), ("step", ratio)):
        emit(f"{cfg}_target_{k}", "na" if r is None else
             f"{'met' if r <= TARGET else 'missed'} (x{r:.3f}, target <= x{TARGET})")
    # issue 28: the local mode, against the same torch runs
    emit(f"{cfg}_local_step_ms", med([r["step_ms"] for r in lo]))
    lpairs = [ll["step_ms"] / tt["step_ms"] for tt, ll in zip(t, lo)]
    lratio = med(lpairs)
    emit(f"{cfg}_local_step_ratio", lratio)
    emit(f"{cfg}_local_step_ratio_rounds", ",".join(f"{p:.3f}" for p in lpairs) or "na")
    lp = max((r["peak_mib"] for r in lo if "peak_mib" in r), default=None)
    emit(f"{cfg}_local_peak_mib", lp)
    lmratio = lp / tp if lp is not None and tp else None
    emit(f"{cfg}_local_mem_ratio", lmratio)
    last = lo[-1] if lo else {}
    for k in ("collects", "growths", "eager_reclaims", "heap_allocs_per_step"):
        emit(f"{cfg}_local_{k}", last.get(k))
    emit(f"{cfg}_local_allocs", min((r["local_allocs"] for r in lo), default=None))
    emit(f"{cfg}_local_share", min((r["local_share"] for r in lo), default=None))
    emit(f"{cfg}_replica_lost", max((r["replica_lost"] for r in lo), default=None))
    for k, r, tg in (("mem", lmratio, TARGET), ("step", lratio, LOCAL_STEP_TARGET)):
        emit(f"{cfg}_local_target_{k}", "na" if r is None else
             f"{'met' if r <= tg else 'missed'} (x{r:.3f}, target <= x{tg})")
    return bool(t and h and lo and not fails)


def run_rounds(a, cfgs, deadline):
    """The rounds that fit before deadline: ({C: {mode: [summary per round]}},
    {C: {mode: reason}}, rounds). A run cut by the deadline after the first
    round ends the rounds (not a failure: the earlier rounds count)."""
    run_tmo = a.run_timeout or (150.0 if a.host else 45.0)
    runs = {c: {m: [] for m in MODES} for c in cfgs}
    fails = {c: {} for c in cfgs}
    rounds, round_s = 0, 0.0
    for rnd in range(a.rounds):
        left = deadline - time.monotonic()
        if rnd and left < round_s * 1.2:
            emit("rounds_cut", f"{rnd} of {a.rounds} (a round took {round_s:.1f} s, {left:.1f} s left)")
            break
        rs, cut = time.monotonic(), False
        for c in cfgs:
            order = ("heap", "torch", "local") if rnd % 2 == 0 else ("local", "torch", "heap")
            for mode in order:
                if fails[c].get(mode) or cut:
                    continue
                left = deadline - time.monotonic()
                if left < 5 and rnd:
                    cut = True
                    continue
                if left < 5:
                    fails[c][mode] = f"no time left in --time-limit {a.time_limit:g} s"
                    continue
                name = f"train-bench-{os.getpid()}-{rnd}-{c}" + ("-local" if mode == "local" else "")
                ts = time.monotonic()
                try:
                    ranks = run_once(a, mode, c, name, min(run_tmo, left))
                except Fail as e:
                    if e.timeout and rnd and left < run_tmo:
                        emit(f"run {c}rank {mode} round {rnd}", f"cut by --time-limit: {e}")
                        cut = True
                        continue
                    fails[c][mode] = f"round {rnd}: {e}"
                    emit(f"run {c}rank {mode} round {rnd}", f"FAIL {e}")
                    continue
                s = summarize(ranks)
                runs[c][mode].append(s)
                emit(f"run {c}rank {mode} round {rnd}",
                     " ".join(f"{k}={fmt(v)}" for k, v in s.items()) + f" wall={time.monotonic() - ts:.1f}s")
                bad = local_check(s) if mode == "local" else None
                if bad:         # its figures count, the run fails
                    fails[c][mode] = f"round {rnd}: {bad}"
                    emit(f"run {c}rank {mode} round {rnd}", f"FAIL {bad}")
        if cut:
            emit("rounds_cut", f"in round {rnd}: the time limit came")
            break
        rounds += 1
        round_s = time.monotonic() - rs
    return runs, fails, rounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--time-limit", type=float, default=80.0,
                    help="seconds for the whole bench; rounds that would not fit are not run")
    ap.add_argument("--run-timeout", type=float, default=None, help="seconds for one run")
    ap.add_argument("--configs", default="1,2", help="world sizes, e.g. 1,2")
    ap.add_argument("--build", default=os.environ.get("HEAPD_BUILD", "build-gpu"))
    ap.add_argument("--socket", default=os.environ.get("HEAPD_SOCKET"))
    ap.add_argument("--chunk", default=None)
    ap.add_argument("--timed-budget-s", type=float, default=15.0,
                    help="seconds for a run's timed steps: a slower loop (by its last warm-up step) "
                         "times fewer of them, at least 3")
    ap.add_argument("--collect-timeout-ms", type=int, default=10000)
    ap.add_argument("--reply-timeout-ms", type=int, default=20000)
    ap.add_argument("--decide-every", type=int, default=64,
                    help="the local mode's heap: decide='local' with this decide_every")
    ap.add_argument("--child", choices=MODES, dest="mode")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--heap", default="")
    ap.add_argument("--dist-port", type=int, default=0)
    a = ap.parse_args()
    a.steps = a.steps or (5 if a.host else 20)
    a.warmup = a.warmup or (2 if a.host else 5)
    a.chunk = a.chunk or ("16M" if a.host else "256M")
    if a.mode:
        return child_main(a)
    t0 = time.monotonic()
    emit("mode", "host" if a.host else "gpu")
    if not a.socket:
        emit("result", "FAIL set HEAPD_SOCKET to a running heapd's socket")
        return 2
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    os.environ.setdefault("HEAPC_LIB", os.path.join(build, "libheapc.so"))
    os.environ.setdefault("HEAPC_TORCH_LIB", os.path.join(build, "libheapc_torch.so"))
    for v in ("HEAPD_DECIDE", "HEAPD_DECIDE_EVERY", "HEAPC_DECIDE", "HEAPC_DECIDE_EVERY"):
        os.environ.pop(v, None)     # the heap mode is heapd's way, the local mode asks for its own
    os.environ["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    try:
        cfgs = [int(x) for x in a.configs.split(",") if x]
    except ValueError:
        emit("result", f"FAIL --configs {a.configs!r}: want world sizes like 1,2")
        return 2
    emit("model", "TransformerEncoder 2 layers d64 h4 ff128, batch 2x32, fp32, cpu" if a.host else
         "TransformerEncoder 6 layers d1024 h16 ff4096, batch 8x512, bf16 autocast, AdamW, cuda:0")
    emit("steps", f"{a.warmup} warm-up + {a.steps} timed, chunk {a.chunk}")
    runs, fails, rounds = run_rounds(a, cfgs, t0 + a.time_limit)
    # each list holds the first rounds of its mode: pair as many as the modes that
    # did not fail all have (a failed mode's list stops at its failure)
    ok = True
    emit("rounds", rounds)
    for c in cfgs:
        n = min((len(v) for m, v in runs[c].items() if not fails[c].get(m)), default=0)
        if n:
            runs[c] = {m: v[:n] for m, v in runs[c].items()}
        ok = report(f"{c}rank", runs[c], fails[c]) and ok
    emit("wall_s", time.monotonic() - t0)
    nf = sum(len(f) for f in fails.values())
    emit("result", "ok" if ok else f"FAIL {nf} run kind(s) failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
