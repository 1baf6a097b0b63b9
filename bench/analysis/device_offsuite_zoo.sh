#!/usr/bin/env bash
# Times node's shape variants beside auto and per-query on the offsuite suite, in one device
# call: the data an offline study of auto's cost model needs to judge the SHAPE choices
# (auto_cost_forms.py can only choose among the plans that were timed, and the offsuite runs
# timed three). Eager medians of 50 L2-flushed runs (no graph replay, no verification: the
# GPU tests check correctness), every variant through the same binary, one after another.
# Needs a built build/device (scripts/device_runtime.sh STEPS=build). Writes $OUT/zoo.tgz
# (each variant's results.json and log; ~18 s a variant on an H200) and $OUT/zoo.log.
# Usage: OUT=... TREEATTN_COMMIT=$(git rev-parse --short=12 HEAD) bench/analysis/device_offsuite_zoo.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/build/device/treeattn}
OUT=${OUT:-$ROOT/build/zoo_out}
SUITE=${SUITE:-offsuite}
export TREEATTN_COMMIT=${TREEATTN_COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT/zoo"
# name|planner|plan options (node's shape knobs, docs/planners.md "node" and "auto")
VARIANTS=(
  "auto|auto|" "per-query|per-query|" "node|node|"
  "node_tile64|node|tile_rows=64" "node_tile32|node|tile_rows=32" "node_tile16|node|tile_rows=16"
  "node_flat64|node|flat_rows=64" "node_flat128|node|flat_rows=128"
  "node_flat2048|node|flat_tokens=2048" "node_half_ctas|node|split_sm_ctas=1"
  "node_flat1024|node|flat_tokens=1024" "node_flat4096|node|flat_tokens=4096" "node_noflat|node|flat_tokens=0"
  "node_tile64_flat64|node|tile_rows=64 flat_rows=64" "node_tile32_flat128|node|tile_rows=32 flat_rows=128"
  "node_nopack|node|pack_tokens=0" "node_nofold|node|fold_tokens=0" "node_split2|node|split_scale=2"
)
T0=$(date +%s)
{
  echo "# $SUITE: node's shape variants, auto and per-query; device $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1);"
  echo "# commit $TREEATTN_COMMIT; date $(date -u +%FT%TZ); per variant: $BIN bench --suite $SUITE -p PLANNER [--plan-opt OPT] --no-graph --verify 0 --out zoo/NAME"
  for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name planner opt <<<"$v"
    args=(bench --suite "$SUITE" -p "$planner" --no-graph --verify 0 --out "$OUT/zoo/$name")
    for o in $opt; do args+=(--plan-opt "$o"); done
    if timeout "${VARIANT_TIMEOUT:-150}" "$BIN" "${args[@]}" >"$OUT/zoo/$name.log" 2>&1; then status=ok; else status=FAIL; fi
    echo "[$(( $(date +%s) - T0 ))s] $name ($planner ${opt:-default}): $status"
    (cd "$OUT" && tar czf zoo.tgz zoo/*.log zoo/*/results.json)  # after each variant: what finished comes back if the call is cut short
  done
} | tee "$OUT/zoo.log"
rm -rf "$OUT/zoo"
