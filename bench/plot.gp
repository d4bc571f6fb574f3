# plot.gp - heapd's benchmark chart (gnuplot; Debian package gnuplot-nox).
#
#     gnuplot -e "dir='build/bench'" bench/plot.gp     (writes DIR/chart.svg)
#
# Draws the series bench/summary.sh wrote into DIR (chart-*.dat); a series
# whose file is missing (its benchmark did not run) is left out.
#   left:  latency against live blocks: the allocator's ns per alloc+free
#          (both policies; alloc_bench) and the status-page memory probe
#          (nccl_bench)
#   right: collect latency against ranks: local ranks on one heapd p50/p99
#          (collect_bench) and nodes through Redis p50 (store_bench)
if (!exists("dir")) dir = "build/bench"
f(s) = sprintf("%s/chart-%s.dat", dir, s)
has(s) = system(sprintf("[ -s '%s' ] && echo 1 || echo 0", f(s))) + 0

set terminal svg size 1100,480 dynamic enhanced font "sans,12" background rgb "white"
set output sprintf("%s/chart.svg", dir)
set multiplot layout 1,2 title "heapd benchmarks (".system("date -u +%Y-%m-%d")."; ".system("nproc")." CPU(s), Linux ".system("uname -r").")"
set grid
set key top left box opaque
set logscale x 10
set logscale y 10
set format x "10^{%L}"

# ---- left: against live blocks ----
set title "latency against live blocks"
set xlabel "live blocks"
set ylabel "ns per call (log)"
set xrange [50:2e6]
set yrange [*:*]
L = ""
if (has("alloc_coalesce")) L = L . sprintf("'%s' using 1:2 with linespoints lw 2 pt 7 title 'allocator: alloc + free on every rank (coalesce)', ", f("alloc_coalesce"))
if (has("alloc_seed")) L = L . sprintf("'%s' using 1:2 with linespoints lw 2 pt 5 title 'allocator: alloc + free on every rank (seed)', ", f("alloc_seed"))
if (has("probe")) L = L . sprintf("'%s' using 1:2 with linespoints lw 2 pt 9 title 'memory probe (status page)', ", f("probe"))
if (strlen(L) > 0) { eval("plot " . L[1:strlen(L) - 2]) } else { set label 1 "no data" at graph 0.45, 0.5; plot NaN notitle; unset label 1 }

# ---- right: against ranks and nodes ----
set title "collect latency against ranks"
set xlabel "local ranks on one heapd / heapd nodes through Redis"
set ylabel "microseconds per collect (log)"
set logscale x 2
set format x "%g"
set xrange [1.5:24]
set xtics (2, 4, 8, 16)
R = ""
if (has("collect_ranks")) R = R . sprintf("'%s' using 1:2 with linespoints lw 2 pt 7 title 'local ranks, p50', '%s' using 1:3 with linespoints lw 1 dt 2 pt 6 title 'local ranks, p99', ", f("collect_ranks"), f("collect_ranks"))
if (has("collect_nodes")) R = R . sprintf("'%s' using 1:2 with linespoints lw 2 pt 5 title 'nodes (Redis), p50', ", f("collect_nodes"))
if (strlen(R) > 0) { eval("plot " . R[1:strlen(R) - 2]) } else { set label 1 "no data" at graph 0.45, 0.5; plot NaN notitle; unset label 1 }

unset multiplot
