#!/usr/bin/env bash
# Instructions per call of a function, counted by callgrind: a measure of
# CPU work that machine noise does not move (the 2-core dev VMs vary by
# 20-30 % between timing rounds). Runs one Google Benchmark of a binary under
# valgrind and prints the inclusive instructions of FUNCTION divided by its
# calls (the benchmark's set-up outside the timed loop is not counted).
# Instructions are not time (cache misses, branch mispredictions): confirm a
# gain in time where it matters; use this to compare two builds of a change.
# Usage: scripts/instructions.sh BENCH_BINARY BENCHMARK_FILTER FUNCTION
#   e.g. scripts/instructions.sh build/cpu/bench/planning/treeattn_planning_bench \
#          'runtime/tree_queries/cpu/1x64$' 'TreeAttention::plan_tree_queries('
#   FUNCTION: a substring of callgrind's demangled name, unique among the
#   functions the benchmark runs. MIN_TIME (default 0.5 s of benchmark time,
#   ~50x that under valgrind) sets how many calls are counted.
set -euo pipefail
BIN=${1:?usage: scripts/instructions.sh BENCH_BINARY BENCHMARK_FILTER FUNCTION}
FILTER=${2:?benchmark filter}
FUNC=${3:?function name (substring)}
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
out=$(mktemp /tmp/callgrind.XXXXXX)
trap 'rm -f "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" --benchmark_filter="$FILTER" \
  --benchmark_min_time="${MIN_TIME:-0.5}" >/dev/null 2>&1
# In --tree=caller output a function's inclusive total is its "*" line, and
# the lines right above it are its callers with their call counts "(Nx)".
callgrind_annotate --inclusive=yes --tree=caller "$out" 2>/dev/null | python3 -c '
import re, sys
func, filt = sys.argv[1], sys.argv[2]
lines = sys.stdin.read().splitlines()
for i, line in enumerate(lines):
    m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+\*\s+(.*)", line)
    if not m or func not in m.group(2):
        continue
    calls, j = 0, i - 1
    while j >= 0 and "<" in lines[j]:
        c = re.search(r"\((\d+)x\)", lines[j])
        calls += int(c.group(1)) if c else 0
        j -= 1
    ir = int(m.group(1).replace(",", ""))
    if calls == 0:
        sys.exit(f"{func}: no call counts found")
    print(f"{filt}: {ir / calls / 1e3:.1f} k instructions per call of {func} ({calls} calls)")
    break
else:
    sys.exit(f"{func}: not among the functions the benchmark ran")
' "$FUNC" "$FILTER"
