#!/bin/sh
# summary.sh - one table of heapd's benchmark figures against their anchors.
#
#     sh bench/summary.sh [DIR]        (DIR: default $BUILD/bench, BUILD=build)
#
# Reads the JSON the benchmarks wrote into DIR (alloc_bench, rtt_bench, loaded_bench,
# collect_bench, store_bench, nccl_bench, gpu_bench; a missing or skipped
# one gives no rows) and prints ONE table, last:
#     figure | value | compared with | ratio        (ratio = value / anchor)
# It also writes, into DIR:
#     summary.json   every row, with raw numbers, plus the date and machine
#     summary.md     the table as printed (Markdown)
#     chart-*.dat    the series bench/plot.gp draws (chart.svg)
# Reads JSON with python3; without it with jq; with neither it prints a note
# and exits 0 (SUMMARY_WITH=python3|jq|none forces one path, for tests); so
# does a DIR without results (it writes nothing then). Exit 1 when DIR is
# missing or a JSON file cannot be read.
set -u
BUILD=${BUILD:-build}
DIR=${1:-$BUILD/bench}
if [ ! -d "$DIR" ]; then
    echo "summary: no folder $DIR: run the benchmarks first (make bench)" >&2
    exit 1
fi

# date | kernel | cpus | os, for summary.json and the line above the table
DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
KERNEL=$(uname -r)
CPUS=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
# shellcheck disable=SC1091 # the running system's file
OS=$( (. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-}") || true)
LOAD=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
export SUMMARY_DATE="$DATE" SUMMARY_KERNEL="$KERNEL" SUMMARY_CPUS="$CPUS" SUMMARY_OS="${OS:-unknown}"
export SUMMARY_LOAD="$LOAD"

# The rows come out of python3 or jq as tab-separated lines
#     figure  value  unit  label  anchor  anchor_unit  ratio
# (anchor and ratio empty when there is none); awk formats them.
format_table() {
    awk -F'\t' '
    function num(v, u,   a) {
        if (v == "") return "-"
        a = v < 0 ? -v : v
        if (u == "count") return sprintf("%d", v)
        if (u == "B" && a >= 1048576) return sprintf("%.1f MiB", v / 1048576)
        if (a >= 1000) s = sprintf("%.0f", v)
        else if (a >= 100) s = sprintf("%.1f", v)
        else s = sprintf("%.2f", v)
        return u == "" ? s : s " " u
    }
    BEGIN { print "| figure | value | compared with | ratio |"; print "|---|---|---|---|" }
    {
        cmp = $4
        if ($5 != "") cmp = cmp " " num($5, $6)
        r = $7 == "" ? "-" : sprintf($7 < 0.1 ? "%.3fx" : "%.2fx", $7)
        printf "| %s | %s | %s | %s |\n", $1, num($2, $3), cmp, r
    }'
}

rows_python() {
    python3 - "$DIR" <<'PY'
import json, os, sys

d = sys.argv[1]
rows = []
series = {}


def load(name):
    p = os.path.join(d, name + ".json")
    if not os.path.isfile(p):
        return None
    try:
        with open(p) as f:
            j = json.load(f)
    except (OSError, ValueError) as e:
        sys.stderr.write("summary: %s: %s\n" % (p, e))
        sys.exit(1)
    if not isinstance(j, dict) or j.get("skipped"):
        return None
    return j


def row(src, fig, val, unit, label, anchor=None, aunit=None):
    if val is None:
        return
    ratio = None
    if anchor is not None and anchor != 0:
        ratio = val / anchor
    rows.append({"source": src, "figure": fig, "value": val, "unit": unit,
                 "compared_with": label, "anchor": anchor,
                 "anchor_unit": unit if aunit is None else aunit, "ratio": ratio})


def pow10(n):
    k = 0
    m = n
    while m >= 10 and m % 10 == 0:
        m //= 10
        k += 1
    return "10^%d" % k if m == 1 and k > 0 else str(n)


def size(n):
    for u, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= u and n % u == 0:
            return "%d %s" % (n // u, s)
    return "%d B" % n


def first(o, *keys):
    for k in keys:
        if isinstance(o, dict) and o.get(k) is not None:
            return o[k]
    return None


def key_like(o, *parts):
    """First numeric key of dict o whose name contains every part."""
    for k, v in o.items():
        if all(p in k for p in parts) and isinstance(v, (int, float)) and not isinstance(v, bool):
            return v
    return None


# rtt_bench: alloc round trip vs a raw Unix-socket ping-pong; memory per block
j = load("rtt_bench")
if j:
    for r in j.get("rtt", []):
        c = r["clients"]
        cl = "%d client%s" % (c, "" if c == 1 else "s")
        row("rtt_bench", "alloc round trip p50, " + cl, r["heapd_p50_us"], "us",
            "raw Unix-socket ping-pong p50", r["pingpong_p50_us"])
    for r in j.get("rtt", []):
        c = r["clients"]
        cl = "%d client%s" % (c, "" if c == 1 else "s")
        row("rtt_bench", "alloc round trip p99, " + cl, r["heapd_p99_us"], "us",
            "raw Unix-socket ping-pong p99", r["pingpong_p99_us"])
    for r in j.get("rtt", []):
        if "ring_p50_us" not in r:
            continue
        c = r["clients"]
        cl = "%d client%s" % (c, "" if c == 1 else "s")
        row("rtt_bench", "alloc on the request ring p50, " + cl, r["ring_p50_us"], "us",
            "raw Unix-socket ping-pong p50", r["pingpong_p50_us"])
    for r in j.get("rtt", []):  # issue 28: HEAPC_DECIDE=local, every L-th a round trip
        if "local_p50_us" not in r:
            continue
        c = r["clients"]
        cl = "%d client%s" % (c, "" if c == 1 else "s")
        row("rtt_bench", "alloc decided locally (L = %d) p50, %s" % (j.get("local_every", 64), cl),
            r["local_p50_us"], "us", "raw Unix-socket ping-pong p50", r["pingpong_p50_us"])
    if "heapd_idle_cpu_pct_8_ring_clients" in j:
        row("rtt_bench", "heapd idle CPU, 8 idle ring clients", j["heapd_idle_cpu_pct_8_ring_clients"], "%",
            "one core", 100)
    m = j.get("memory")
    if m:
        bs = j.get("alloc_size", 4096)
        row("rtt_bench", "daemon memory per live block (%s live)" % pow10(m["live_blocks"]),
            m["bytes_per_live_block"], "B", "the %s block it tracks" % size(bs), bs)

# alloc_bench: ns per alloc+free against live blocks; the policies on traces
j = load("loaded_bench")
if j:
    for r in j.get("steps", []):
        row("loaded_bench", "%s p99 while another uid attacks (%d idle conns, fds, unread replies)"
            % (r["step"], j.get("idle", 0)), r["p99_loaded_us"], "us", "unloaded p99, same run",
            r["p99_unloaded_us"])

j = load("alloc_bench")
if j:
    cost = j.get("cost", [])
    ranks = j.get("ranks", 0)
    for pol in ("coalesce", "seed"):
        rs = sorted([c for c in cost if c["policy"] == pol], key=lambda c: c["live"])
        series["alloc_" + pol] = [(c["live"], c["ns_per_pair"]) for c in rs]
        if len(rs) >= 2:
            lo = rs[0]
            for hi in rs[1:]:
                row("alloc_bench", "allocator ns per alloc+free on %d ranks at %s live blocks (%s)"
                    % (ranks, pow10(hi["live"]), pol), hi["ns_per_pair"], "ns",
                    "at %s" % pow10(lo["live"]), lo["ns_per_pair"])
    top = max([c["live"] for c in cost] or [0])
    s = [c for c in cost if c["live"] == top and c["policy"] == "seed"]
    co = [c for c in cost if c["live"] == top and c["policy"] == "coalesce"]
    if s and co:
        row("alloc_bench", "allocator ns per alloc+free at %s live blocks (coalesce vs seed)"
            % pow10(top), co[0]["ns_per_pair"], "ns", "seed", s[0]["ns_per_pair"])
    for f in j.get("figures", []):
        name = f["figure"]
        trace, _, what = name.rpartition(" ")
        trace = trace.replace("model", "model ", 1) if trace.startswith("model") else trace
        if what == "collects" or (f["seed"] != f["coalesce"]):
            unit = "B" if what == "mapped" else "count"
            row("alloc_bench", "%s %s (coalesce vs seed)" % (trace, what), f["coalesce"],
                unit, "seed", f["seed"])

# collect_bench: collect latency against local ranks
j = load("collect_bench")
pp1 = None
rj = load("rtt_bench")
if rj:
    one = [r for r in rj.get("rtt", []) if r["clients"] == 1]
    pp1 = one[0]["pingpong_p50_us"] if one else None
if j:
    cs = sorted(j.get("collect", []), key=lambda r: r["ranks"])
    series["collect_ranks"] = [(r["ranks"], r["p50_us"], r["p99_us"]) for r in cs]
    if cs:
        lo = cs[0]
        if pp1 is not None:
            row("collect_bench", "collect latency p50, %d local ranks" % lo["ranks"], lo["p50_us"],
                "us", "raw Unix-socket ping-pong p50, 1 client", pp1)
        else:
            row("collect_bench", "collect latency p50, %d local ranks" % lo["ranks"], lo["p50_us"],
                "us", "-")
        for r in cs[1:]:
            row("collect_bench", "collect latency p50, %d local ranks" % r["ranks"], r["p50_us"],
                "us", "%d local ranks" % lo["ranks"], lo["p50_us"])
        if len(cs) > 1:
            hi = cs[-1]
            row("collect_bench", "collect latency p99, %d local ranks" % hi["ranks"], hi["p99_us"],
                "us", "%d local ranks" % lo["ranks"], lo["p99_us"])

# store_bench: collect latency against nodes through Redis; commands per node
j = load("store_bench")
if j:
    lst = None
    for v in j.values():
        if isinstance(v, list) and v and isinstance(v[0], dict) and "nodes" in v[0]:
            lst = v
            break
    if lst:
        lst = sorted(lst, key=lambda r: r["nodes"])
        def p50(r):
            return first(r, "p50_us", "collect_p50_us", "latency_p50_us") or key_like(r, "p50")
        def cmds(r):
            return (first(r, "commands_per_collect_per_node", "cmds_per_collect_per_node",
                          "redis_commands_per_collect_per_node")
                    or key_like(r, "command", "node") or key_like(r, "cmd", "node"))
        series["collect_nodes"] = [(r["nodes"], p50(r)) for r in lst if p50(r) is not None]
        lo, hi = lst[0], lst[-1]
        if len(lst) > 1:
            row("store_bench", "collect latency p50, %d nodes (Redis)" % hi["nodes"], p50(hi),
                "us", "%d nodes" % lo["nodes"], p50(lo))
        loc = load("collect_bench")
        if loc and p50(lo) is not None:
            lr = [r for r in loc.get("collect", []) if r["ranks"] == lo["nodes"]]
            if lr:
                row("store_bench", "collect latency p50, %d nodes (Redis)" % lo["nodes"], p50(lo),
                    "us", "%d local ranks on one heapd" % lo["nodes"], lr[0]["p50_us"])
        if cmds(hi) is not None:
            row("store_bench", "Redis commands per collect per node, %d nodes" % hi["nodes"],
                cmds(hi), "", "%d nodes" % lo["nodes"], cmds(lo))

# nccl_bench: the status-page probe against live blocks; cudaMemGetInfo
j = load("nccl_bench")
if j:
    pv = sorted(j.get("probe_vs_live", []), key=lambda r: r["live_blocks"])
    series["probe"] = [(r["live_blocks"], r["hnccl_probe_ns"]) for r in pv]
    if pv:
        lo, hi = pv[0], pv[-1]
        if len(pv) > 1:
            row("nccl_bench", "memory probe (status page) at %s live blocks" % pow10(hi["live_blocks"]),
                hi["hnccl_probe_ns"], "ns", "at %s" % pow10(lo["live_blocks"]), lo["hnccl_probe_ns"])
        cu = j.get("cuda") or {}
        if not cu.get("skipped") and cu.get("cudaMemGetInfo_ns") is not None:
            row("nccl_bench", "memory probe (status page) at %s live blocks" % pow10(hi["live_blocks"]),
                hi["hnccl_probe_ns"], "ns", "cudaMemGetInfo", cu["cudaMemGetInfo_ns"])
    ov = j.get("overhead", [])
    raw = [o for o in ov if o["call"].startswith("raw")]
    prb = [o for o in ov if o["call"] == "wrapped, probe: status page"]
    if raw and prb:
        row("nccl_bench", "wrapped collective with the probe: overhead per call", prb[0]["overhead_ns"],
            "ns", "raw call into a stub that returns at once", raw[0]["ns"])

# gpu_bench (GPU machine): heapd alloc and growth against cudaMalloc
j = load("gpu_bench")
if j:
    for r in j.get("rows", []):
        sz = size(r["size"])
        if r.get("heapd_alloc_us") is not None:
            row("gpu_bench", "GPU: heapd alloc, %s (heap does not grow)" % sz, r["heapd_alloc_us"],
                "us", "cudaMalloc", r.get("cuda_malloc_us"))
    for r in j.get("rows", []):
        sz = size(r["size"])
        if r.get("heapd_growth_us") is not None:
            row("gpu_bench", "GPU: heapd growth by one chunk, %s" % sz, r["heapd_growth_us"],
                "us", "cudaMalloc", r.get("cuda_malloc_us"))
    for r in j.get("rows", []):
        sz = size(r["size"])
        if r.get("heapd_growth_us") is not None and r.get("vmm_create_map_us") is not None:
            row("gpu_bench", "GPU: heapd growth by one chunk, %s" % sz, r["heapd_growth_us"],
                "us", "cuMemCreate+Map+SetAccess", r["vmm_create_map_us"])

if not rows:
    sys.exit(3)

e = os.environ
with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump({"date": e.get("SUMMARY_DATE"), "kernel": e.get("SUMMARY_KERNEL"),
               "cpus": int(e.get("SUMMARY_CPUS") or 0), "os": e.get("SUMMARY_OS"),
               "loadavg_1min": float(e.get("SUMMARY_LOAD") or 0),
               "ratio": "value / anchor", "rows": rows}, f, indent=1)
    f.write("\n")
for name, pts in series.items():
    with open(os.path.join(d, "chart-%s.dat" % name), "w") as f:
        for p in pts:
            f.write(" ".join("%g" % x for x in p) + "\n")


def cell(x):
    return "" if x is None else ("%.6g" % x if isinstance(x, float) else str(x))


for r in rows:
    print("\t".join([r["figure"], cell(r["value"]), r["unit"], r["compared_with"],
                     cell(r["anchor"]), r["anchor_unit"], cell(r["ratio"])]))
PY
}

# The same rows as rows_python, for machines without python3.
rows_jq() {
    set --
    found=0
    for n in rtt_bench alloc_bench collect_bench store_bench nccl_bench gpu_bench; do
        if [ -f "$DIR/$n.json" ]; then
            set -- "$@" --slurpfile "$n" "$DIR/$n.json"; found=1
        else
            set -- "$@" --argjson "$n" '[]'
        fi
    done
    # shellcheck disable=SC2016 # $names below are jq's
    out=$(jq -n "$@" '
    def get($x): ($x[0] // null) | if type == "object" and ((.skipped // false) | not) then . else null end;
    def row($src; $fig; $val; $unit; $lbl; $anchor; $aunit):
        if $val == null then empty else
        {source: $src, figure: $fig, value: $val, unit: $unit, compared_with: $lbl,
         anchor: $anchor, anchor_unit: $aunit,
         ratio: (if $anchor != null and $anchor != 0 then $val / $anchor else null end)} end;
    def row($src; $fig; $val; $unit; $lbl; $anchor): row($src; $fig; $val; $unit; $lbl; $anchor; $unit);
    def pow10: . as $n | {m: $n, k: 0} | until(.m < 10 or (.m % 10 != 0); .m = (.m / 10) | .k += 1)
        | if .m == 1 and .k > 0 then "10^\(.k)" else "\($n)" end;
    def size: . as $n |
        if $n >= 1073741824 and $n % 1073741824 == 0 then "\($n / 1073741824) GiB"
        elif $n >= 1048576 and $n % 1048576 == 0 then "\($n / 1048576) MiB"
        elif $n >= 1024 and $n % 1024 == 0 then "\($n / 1024) KiB" else "\($n) B" end;
    def cl: "\(.) client" + (if . == 1 then "" else "s" end);
    def first_of($keys): . as $o | [$keys[] | $o[.] | select(. != null)] | .[0];
    def key_like($parts): . as $o | [to_entries[] | select(.key as $k | all($parts[]; . as $p | $k | contains($p)))
        | .value | select(type == "number")] | .[0];
    get($rtt_bench) as $rtt | get($alloc_bench) as $al | get($collect_bench) as $co
    | get($store_bench) as $st | get($nccl_bench) as $nc | get($gpu_bench) as $gp
    | ($rtt // {} | [.rtt[]? | select(.clients == 1) | .pingpong_p50_us] | .[0]) as $pp1
    | ($al // {} | .cost // []) as $cost
    | ($co // {} | .collect // [] | sort_by(.ranks)) as $cs
    | ($st // {} | [.[] | select(type == "array" and length > 0 and (.[0] | type) == "object"
                                   and (.[0] | has("nodes")))] | .[0] // [] | sort_by(.nodes)) as $ns
    | def sp50: first_of(["p50_us", "collect_p50_us", "latency_p50_us"]) // key_like(["p50"]);
      def scmd: first_of(["commands_per_collect_per_node", "cmds_per_collect_per_node",
                          "redis_commands_per_collect_per_node"])
                // key_like(["command", "node"]) // key_like(["cmd", "node"]);
    ($nc // {} | .probe_vs_live // [] | sort_by(.live_blocks)) as $pv
    | ($cost | map(.live) | max) as $top
    | {
      rows: [
        ($rtt // empty | .rtt[]? | row("rtt_bench"; "alloc round trip p50, \(.clients | cl)";
            .heapd_p50_us; "us"; "raw Unix-socket ping-pong p50"; .pingpong_p50_us)),
        ($rtt // empty | .rtt[]? | row("rtt_bench"; "alloc round trip p99, \(.clients | cl)";
            .heapd_p99_us; "us"; "raw Unix-socket ping-pong p99"; .pingpong_p99_us)),
        ($rtt // empty | .rtt[]? | select(has("ring_p50_us"))
            | row("rtt_bench"; "alloc on the request ring p50, \(.clients | cl)";
                  .ring_p50_us; "us"; "raw Unix-socket ping-pong p50"; .pingpong_p50_us)),
        ($rtt // empty | (.local_every // 64) as $le | .rtt[]? | select(has("local_p50_us"))
            | row("rtt_bench"; "alloc decided locally (L = \($le)) p50, \(.clients | cl)";
                  .local_p50_us; "us"; "raw Unix-socket ping-pong p50"; .pingpong_p50_us)),
        ($rtt // empty | select(has("heapd_idle_cpu_pct_8_ring_clients"))
            | row("rtt_bench"; "heapd idle CPU, 8 idle ring clients";
                  .heapd_idle_cpu_pct_8_ring_clients; "%"; "one core"; 100)),
        ($rtt // empty | (.alloc_size // 4096) as $bs | .memory // empty
            | row("rtt_bench"; "daemon memory per live block (\(.live_blocks | pow10) live)";
                  .bytes_per_live_block; "B"; "the \($bs | size) block it tracks"; $bs)),
        ($al // empty | .ranks as $r | ("coalesce", "seed") as $pol
            | [$cost[] | select(.policy == $pol)] | sort_by(.live) | select(length >= 2)
            | .[0] as $lo | .[1:][] as $hi
            | row("alloc_bench"; "allocator ns per alloc+free on \($r) ranks at \($hi.live | pow10) live blocks (\($pol))";
                  $hi.ns_per_pair; "ns"; "at \($lo.live | pow10)"; $lo.ns_per_pair)),
        ($al // empty | [$cost[] | select(.live == $top and .policy == "seed")][0] as $s
            | [$cost[] | select(.live == $top and .policy == "coalesce")][0] as $c
            | select($s != null and $c != null)
            | row("alloc_bench"; "allocator ns per alloc+free at \($top | pow10) live blocks (coalesce vs seed)";
                  $c.ns_per_pair; "ns"; "seed"; $s.ns_per_pair)),
        ($al // empty | .figures[]? | (.figure | capture("^(?<t>.*) (?<w>[^ ]*)$")) as $m
            | select($m.w == "collects" or .seed != .coalesce)
            | row("alloc_bench"; "\($m.t | sub("^model"; "model ")) \($m.w) (coalesce vs seed)";
                  .coalesce; (if $m.w == "mapped" then "B" else "count" end); "seed"; .seed)),
        ($cs | select(length > 0) | .[0] as $lo
            | if $pp1 != null then
                row("collect_bench"; "collect latency p50, \($lo.ranks) local ranks"; $lo.p50_us; "us";
                    "raw Unix-socket ping-pong p50, 1 client"; $pp1)
              else row("collect_bench"; "collect latency p50, \($lo.ranks) local ranks"; $lo.p50_us; "us"; "-"; null) end,
              (.[1:][] | row("collect_bench"; "collect latency p50, \(.ranks) local ranks"; .p50_us; "us";
                  "\($lo.ranks) local ranks"; $lo.p50_us)),
              (select(length > 1) | .[-1] as $hi
                | row("collect_bench"; "collect latency p99, \($hi.ranks) local ranks"; $hi.p99_us; "us";
                      "\($lo.ranks) local ranks"; $lo.p99_us))),
        ($ns | select(length > 0) | .[0] as $lo | .[-1] as $hi
            | (select(length > 1) | row("store_bench"; "collect latency p50, \($hi.nodes) nodes (Redis)";
                  ($hi | sp50); "us"; "\($lo.nodes) nodes"; ($lo | sp50))),
              ([$cs[] | select(.ranks == $lo.nodes)][0] as $lr | select($lr != null)
                | row("store_bench"; "collect latency p50, \($lo.nodes) nodes (Redis)"; ($lo | sp50); "us";
                      "\($lo.nodes) local ranks on one heapd"; $lr.p50_us)),
              row("store_bench"; "Redis commands per collect per node, \($hi.nodes) nodes"; ($hi | scmd); "";
                  "\($lo.nodes) nodes"; ($lo | scmd))),
        ($pv | select(length > 1) | .[0] as $lo | .[-1] as $hi
            | row("nccl_bench"; "memory probe (status page) at \($hi.live_blocks | pow10) live blocks";
                  $hi.hnccl_probe_ns; "ns"; "at \($lo.live_blocks | pow10)"; $lo.hnccl_probe_ns)),
        ($pv | select(length > 0) | .[-1] as $hi | ($nc.cuda // {}) as $cu
            | select(($cu.skipped // false | not) and $cu.cudaMemGetInfo_ns != null)
            | row("nccl_bench"; "memory probe (status page) at \($hi.live_blocks | pow10) live blocks";
                  $hi.hnccl_probe_ns; "ns"; "cudaMemGetInfo"; $cu.cudaMemGetInfo_ns)),
        ($nc // empty | [.overhead[]? | select(.call | startswith("raw"))][0] as $raw
            | [.overhead[]? | select(.call == "wrapped, probe: status page")][0] as $prb
            | select($raw != null and $prb != null)
            | row("nccl_bench"; "wrapped collective with the probe: overhead per call"; $prb.overhead_ns; "ns";
                  "raw call into a stub that returns at once"; $raw.ns)),
        ($gp // empty | .rows[]? | row("gpu_bench"; "GPU: heapd alloc, \(.size | size) (heap does not grow)";
            .heapd_alloc_us; "us"; "cudaMalloc"; .cuda_malloc_us)),
        ($gp // empty | .rows[]? | row("gpu_bench"; "GPU: heapd growth by one chunk, \(.size | size)";
            .heapd_growth_us; "us"; "cudaMalloc"; .cuda_malloc_us)),
        ($gp // empty | .rows[]? | select(.vmm_create_map_us != null)
            | row("gpu_bench"; "GPU: heapd growth by one chunk, \(.size | size)";
                  .heapd_growth_us; "us"; "cuMemCreate+Map+SetAccess"; .vmm_create_map_us))
      ],
      series: ({}
        + (if $al then {alloc_coalesce: ([$cost[] | select(.policy == "coalesce")] | sort_by(.live) | map([.live, .ns_per_pair])),
                        alloc_seed: ([$cost[] | select(.policy == "seed")] | sort_by(.live) | map([.live, .ns_per_pair]))} else {} end)
        + (if ($cs | length) > 0 then {collect_ranks: ($cs | map([.ranks, .p50_us, .p99_us]))} else {} end)
        + (if ($ns | length) > 0 then {collect_nodes: ($ns | map([.nodes, sp50] | select(.[1] != null)))} else {} end)
        + (if ($pv | length) > 0 then {probe: ($pv | map([.live_blocks, .hnccl_probe_ns]))} else {} end))
    }') || return 1
    if [ "$found" = 0 ] || [ "$(printf '%s' "$out" | jq '.rows | length')" = 0 ]; then
        return 3
    fi
    printf '%s' "$out" | jq --arg date "$SUMMARY_DATE" --arg kernel "$SUMMARY_KERNEL" \
        --argjson cpus "${SUMMARY_CPUS:-0}" --arg os "$SUMMARY_OS" --argjson load "${SUMMARY_LOAD:-0}" \
        '{date: $date, kernel: $kernel, cpus: $cpus, os: $os, loadavg_1min: $load,
          ratio: "value / anchor", rows: .rows}' \
        >"$DIR/summary.json" || return 1
    for s in $(printf '%s' "$out" | jq -r '.series | keys[]'); do
        printf '%s' "$out" | jq -r --arg s "$s" '.series[$s][] | map(tostring) | join(" ")' \
            >"$DIR/chart-$s.dat" || return 1
    done
    printf '%s' "$out" | jq -r '.rows[] | [.figure, (.value | tostring), .unit, .compared_with,
        (.anchor // "" | tostring), .anchor_unit, (.ratio // "" | tostring)] | join("\t")'
}

rm -f "$DIR"/chart-*.dat "$DIR/summary.json" "$DIR/summary.md"
have() { # have TOOL: on PATH and not excluded by SUMMARY_WITH
    [ -z "${SUMMARY_WITH:-}" ] || [ "$SUMMARY_WITH" = "$1" ] || return 1
    command -v "$1" >/dev/null 2>&1
}
if have python3 && python3 -c 'import json' >/dev/null 2>&1; then
    rows=$(rows_python); rc=$?
elif have jq; then
    rows=$(rows_jq); rc=$?
else
    echo "summary: skipped: neither python3 nor jq is installed (apt-get install python3), so the JSON in $DIR was not read"
    exit 0
fi
if [ $rc = 3 ]; then
    echo "summary: no benchmark results in $DIR (none ran, or all skipped themselves)"
    exit 0
elif [ $rc != 0 ]; then
    echo "summary: cannot read the results in $DIR" >&2
    exit 1
fi
printf '%s\n' "$rows" | format_table >"$DIR/summary.md"
echo "bench summary: $DATE; ${OS:-unknown}, $CPUS CPU(s), Linux $KERNEL, load average $LOAD; ratio = value / anchor"
echo "(all rows: $DIR/summary.json)"
echo
cat "$DIR/summary.md"
