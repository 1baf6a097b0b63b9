#!/usr/bin/env bash
# A/B of two plannings of the same binary on the same configs, in one device
# call: variant A's and B's planner arguments alternate per round (so that
# the machine's drift falls on both sides); every run is `treeattn bench
# --json --verify 2` (L2 flushed, median of 50, CUDA events; eager and
# CUDA-graph replay). Records go to $DIR/<heads>_<round>_<A|B>.json; the
# comparison (scripts/compare_suite_runs.py: min over rounds per config,
# B / A) is printed last.
# Usage: A="-p auto --plan-opt split_sm_ctas=2" B="-p auto" ROUNDS=3 \
#          scripts/planner_ab.sh CONFIGS_FILE
#   BIN_A / BIN_B: another binary for that variant (default BIN), e.g. a base
#   commit's CLI against HEAD's with the same arguments.
#   CONFIGS_FILE: one config per line, "HEADS SPEC" (e.g. "32/8 fewshot:prompt=4000:branches=30:len=100"); # comments
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/build/device/treeattn}
ROUNDS=${ROUNDS:-3}
DIR=${DIR:-$ROOT/build/planner_ab}
CONFIGS=${1:?usage: A=... B=... scripts/planner_ab.sh CONFIGS_FILE}
mkdir -p "$DIR"
HEADS=$(grep -v '^#' "$CONFIGS" | awk 'NF >= 2 {print $1}' | sort -u)
for r in $(seq 1 "$ROUNDS"); do
  for v in A B; do
    for h in $HEADS; do
      specs=()
      while read -r hh spec; do [ "$hh" = "$h" ] && specs+=(-w "$spec"); done < <(grep -v '^#' "$CONFIGS")
      f="$DIR/${h/\//-}_${r}_$v"
      # shellcheck disable=SC2086
      bin_var=BIN_$v
      "${!bin_var:-$BIN}" bench "${specs[@]}" --heads "$h" ${!v} --verify 2 --json >"$f.json" 2>"$f.err" ||
        { echo "round $r variant $v heads $h failed:"; tail -3 "$f.err"; }
    done
  done
done
python3 "$ROOT/scripts/compare_suite_runs.py" --a "$DIR"/*_A.json --b "$DIR"/*_B.json --ignore-planner --all
