#!/usr/bin/python3
"""prom_check.py FILE HEAP - reads `heapctl metrics` output with
python3-prometheus-client's text parser (Debian's) and checks what issue 20
asks: conventions (units in names, _total counters, labels heap and
owner_uid), the families (issue 30's heapd_heap_state, _resident_bytes,
_host_copy_bytes, _releases_total, _restores_total too; issue 27's
_spare_bytes), the histograms (cumulative buckets ending in +Inf,
_count equal to the +Inf bucket). Prints one line per failed check; exit 1
if any."""
import sys
from prometheus_client.parser import text_string_to_metric_families

text = open(sys.argv[1], encoding="utf-8").read()   # strict UTF-8
heap = sys.argv[2]
fams = {f.name: f for f in text_string_to_metric_families(text)}
bad = []


def need(cond, what):
    if not cond:
        bad.append(what)


def samples(fam, suffix=""):
    return [s for s in fams[fam].samples if s.name == fam + suffix] if fam in fams else []


# The parser names counter families without _total; the samples keep it.
for name, typ in [("heapd_up", "gauge"), ("heapd_uptime_seconds", "gauge"), ("heapd_clients", "gauge"),
                  ("heapd_store_connected", "gauge"), ("heapd_quota_heap_bytes", "gauge"),
                  ("heapd_uid_chunk_bytes", "gauge"), ("heapd_uid_quota_bytes", "gauge"),
                  ("heapd_heap_bookkeeping_bytes", "gauge"), ("heapd_heap_mapped_bytes", "gauge"),
                  ("heapd_heap_collects", "counter"), ("heapd_heap_growths", "counter"),
                  ("heapd_heap_allocations", "counter"), ("heapd_heap_collect_wait_seconds", "histogram"),
                  ("heapd_heap_growth_seconds", "histogram"), ("heapd_rank_attached", "gauge"),
                  ("heapd_heap_detached_seconds", "gauge"), ("heapd_heap_persist_seconds", "gauge"),
                  ("heapd_heap_state", "gauge"), ("heapd_heap_resident_bytes", "gauge"),
                  ("heapd_heap_host_copy_bytes", "gauge"), ("heapd_heap_releases", "counter"),
                  ("heapd_heap_restores", "counter"), ("heapd_heap_spare_bytes", "gauge")]:
    need(name in fams and fams[name].type == typ, "family %s of type %s" % (name, typ))
need(samples("heapd_up") and samples("heapd_up")[0].value == 1, "heapd_up 1")
for fam in ("heapd_heap_collects", "heapd_heap_growths", "heapd_heap_allocations", "heapd_heap_releases",
            "heapd_heap_restores"):
    need(all(s.name.endswith("_total") for s in fams.get(fam, type("", (), {"samples": []})).samples),
         fam + " samples end in _total")
mine = [s for s in samples("heapd_heap_mapped_bytes") if s.labels.get("heap") == heap]
need(len(mine) == 1 and "owner_uid" in mine[0].labels and mine[0].value > 0,
     "heapd_heap_mapped_bytes{heap=%r,owner_uid=...} > 0" % heap)
det = [s for s in samples("heapd_heap_detached_seconds") if s.labels.get("heap") == heap]
need(len(det) == 1 and det[0].value == 0, "heapd_heap_detached_seconds{heap=%r} 0 (its ranks are attached)" % heap)
# Issue 30: an active heap (never released) has all its chunks resident.
st = [s for s in samples("heapd_heap_state") if s.labels.get("heap") == heap]
need(len(st) == 1 and st[0].value == 0, "heapd_heap_state{heap=%r} 0 (active)" % heap)
# Issue 27: the quotas' chunk bytes are the resident ones and the spares.
res = [s.value for s in samples("heapd_heap_resident_bytes") if s.labels.get("heap") == heap]
spare = [s.value for s in samples("heapd_heap_spare_bytes") if s.labels.get("heap") == heap]
chunk = [s.value for s in samples("heapd_heap_chunk_bytes") if s.labels.get("heap") == heap]
need(len(res) == 1 and len(spare) == 1 and [res[0] + spare[0]] == chunk and res[0] > 0,
     "heapd_heap_resident_bytes{heap=%r} + heapd_heap_spare_bytes = heapd_heap_chunk_bytes > 0 (got %s, %s, %s)"
     % (heap, res, spare, chunk))
for h in ("heapd_heap_collect_wait_seconds", "heapd_heap_growth_seconds"):
    b = [s for s in samples(h, "_bucket") if s.labels.get("heap") == heap]
    cnt = [s for s in samples(h, "_count") if s.labels.get("heap") == heap]
    need(b and b[-1].labels["le"] in ("+Inf", "inf"), h + ": last bucket +Inf")
    need(all(b[i].value <= b[i + 1].value for i in range(len(b) - 1)), h + ": buckets cumulative")
    need(cnt and b and cnt[0].value == b[-1].value and cnt[0].value >= 1,
         h + ": _count == +Inf bucket >= 1 (got %s)" % (cnt[0].value if cnt else None))
for line in bad:
    print("prom_check: missing or wrong:", line)
print("prom_check: %d families parsed, %d problems" % (len(fams), len(bad)))
sys.exit(1 if bad else 0)
