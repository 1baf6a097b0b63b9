#!/usr/bin/env bash
# Issue 21 goal 3's small trees (read_us < 10 us at 1c2ef42): every planner
# and node's shape knobs on each, and CTA timelines of auto on four of them.
# MODE=warm instead: auto on each tree with the L2 flushed and kept warm
# (--no-flush), and the timelines of both (warm.json, cold.json, trace_warm.txt).
# Usage on the device: OUT=... [MODE=warm] scripts/small_trees.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build/small_out}; mkdir -p "$OUT"
B=$ROOT/build/device T=$ROOT/build/trace
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
common="-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTREEATTN_TESTS=OFF -DTREEATTN_BENCHMARKS=OFF"
# The CLI of an earlier step's build in $B is used as it is.
[[ -x $B/treeattn ]] || (cmake -S "$ROOT" -B "$B" $GEN $common >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j16 --target treeattn_cli >>"$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
echo "built $(date +%T)"
W16=(fasttree:N=1,256:C=256,32 fasttree:N=1,2,64:C=8,256,32 fasttree:N=1,2,4,8,16,32,64,128,1024:C=16,16,16,16,16,16,16,16,16
     fasttree:N=1,4,256:C=8,256,32 fasttree:N=1,10:C=4000,400 fasttree:N=1,16,64:C=1024,256,32
     fasttree:N=1,8,16,32,64,128,1024:C=256,128,64,16,16,16,16 fasttree:N=1,16,32,64,128,1024:C=256,128,64,16,16,16
     fasttree:N=1,4,8,256:C=8,256,256,32 fasttree:N=1,4,16,512:C=1024,256,128,32 fasttree:N=1,1024:C=2048,32)
args=(); for w in "${W16[@]}"; do args+=(-w "$w"); done
cli=$B/treeattn
TRACE() {
  (cmake -S "$ROOT" -B "$T" $GEN $common -DTREEATTN_CTA_TRACE=ON >"$OUT/tbuild.log" 2>&1 &&
   cmake --build "$T" -j16 --target treeattn_cli >>"$OUT/tbuild.log" 2>&1) || { tail -30 "$OUT/tbuild.log"; exit 1; }
}
if [[ ${MODE:-sweep} == warm ]]; then
  $cli bench "${args[@]}" --heads 16/1 -p auto --json --verify 0 >"$OUT/cold.json" 2>>"$OUT/all.err"
  $cli bench "${args[@]}" --heads 16/1 -p auto --json --verify 0 --no-flush >"$OUT/warm.json" 2>>"$OUT/all.err"
  TRACE
  for w in fasttree:N=1,256:C=256,32 fasttree:N=1,2,64:C=8,256,32 fasttree:N=1,10:C=4000,400; do
    for f in "" --no-flush; do
      echo "=== $w 16/1 auto ${f:-(L2 flushed)}"; $T/treeattn bench -w $w --heads 16/1 -p auto --trace --verify 0 --no-graph $f
    done
  done >"$OUT/trace_warm.txt" 2>&1
  exit 0
fi
$cli bench "${args[@]}" --heads 16/1 -p all --json --verify 0 >"$OUT/all_16_1.json" 2>"$OUT/all.err"
$cli bench -w fasttree:N=1,2,64:C=8,256,32 --heads 32/8 -p all --json --verify 0 >"$OUT/all_32_8.json" 2>>"$OUT/all.err"
echo "planners $(date +%T)"
for o in tile_rows=16 tile_rows=32 tile_rows=64 flat_rows=16 flat_rows=32 flat_rows=64 flat_tokens=0 split_scale=0.5 split_scale=2; do
  $cli bench "${args[@]}" --heads 16/1 -p node --plan-opt $o --json --verify 0 >"$OUT/node_$o.json" 2>>"$OUT/all.err"
done
$cli bench "${args[@]}" --heads 16/1 -p auto --no-persistent --json --verify 0 >"$OUT/auto_nopersist.json" 2>>"$OUT/all.err"
echo "knobs $(date +%T)"
TRACE
for w in fasttree:N=1,256:C=256,32 fasttree:N=1,2,64:C=8,256,32 fasttree:N=1,10:C=4000,400 fasttree:N=1,16,64:C=1024,256,32; do
  echo "=== $w 16/1 auto"; $T/treeattn bench -w $w --heads 16/1 -p auto --trace --verify 0 --no-graph
done >"$OUT/trace.txt" 2>&1
echo "trace $(date +%T)"
cd "$OUT" && tar czf knobs.tgz node_*.json auto_nopersist.json && rm -f node_*.json auto_nopersist.json
