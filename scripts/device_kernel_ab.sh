#!/usr/bin/env bash
# One device call for a kernel change: build HEAD for sm_90a, its GPU tests
# and compute-sanitizer (scripts/device_check.sh STEPS="build tests
# sanitize"), build BASE's CLI beside it (its tree in build/kab/src), then time both
# binaries on the tree-query and the other wgmma-heavy configs in alternating
# rounds (scripts/medusa_ab.sh), and the fasttree and pat suites' --quick
# subsets. Logs land in $OUT; the last lines are a per-config table.
# Usage: BASE=<commit> ROUNDS=2 PHASES="build ab" scripts/device_kernel_ab.sh
#   PHASES="cli ab": both CLIs only (no GPU tests: those run at the final
#   commit); SETS="small" picks scripts/medusa_ab.sh's config sets (default:
#   "medusa other").
#   (each phase fits one 10-minute device command: run "build", then "ab" on
#   the still-warm machine, whose build/ is kept between calls). BASE's tree
#   comes from .kab/base.tar when present (`git archive BASE -o .kab/base.tar`,
#   carried), else from git. On the device machine git's HEAD may be stale:
#   pass TREEATTN_COMMIT=<hash> so that the binaries report the right commit.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build/device_out}
BASE=${BASE:?BASE=<commit> to compare against}
ROUNDS=${ROUNDS:-2}
PHASES=${PHASES:-"build ab"}
KAB="$ROOT/build/kab"
mkdir -p "$OUT"
export TREEATTN_COMMIT=${TREEATTN_COMMIT:-$(git rev-parse --short=12 HEAD)}
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
if [[ " $PHASES " == *" cli "* ]]; then
  cmake -S "$ROOT" -B build/device $GEN -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTREEATTN_TESTS=OFF \
    -DTREEATTN_BENCHMARKS=OFF >"$OUT/build.log" 2>&1 && cmake --build build/device -j16 --target treeattn_cli >>"$OUT/build.log" 2>&1 ||
    { tail -20 "$OUT/build.log"; exit 1; }
  grep -E "spill" "$OUT/build.log" | grep -v " 0 bytes spill" | sed 's/_ZN8treeattn4cuda//' | cut -c1-160 | head -8
fi
if [[ " $PHASES " == *" build "* ]]; then
  STEPS="build tests sanitize" OUT="$OUT" bash scripts/device_check.sh 2>&1 | tail -25
fi
if [[ " $PHASES " == *" build "* || " $PHASES " == *" cli "* ]]; then
  rm -rf "$KAB" && mkdir -p "$KAB/src" && { if [ -f "$ROOT/.kab/base.tar" ]; then tar -xf "$ROOT/.kab/base.tar" -C "$KAB/src"; else git archive "$BASE" | tar -x -C "$KAB/src"; fi; } || { echo "no tree for $BASE"; exit 1; }
  cmake -S "$KAB/src" -B "$KAB/src/build" $GEN -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DTREEATTN_BENCHMARKS=OFF >"$OUT/base_build.log" 2>&1 &&
    cmake --build "$KAB/src/build" -j16 --target treeattn_cli >>"$OUT/base_build.log" 2>&1 || { tail -20 "$OUT/base_build.log"; exit 1; }
  mkdir -p "$KAB/base" "$KAB/new"
  cp "$KAB/src/build/treeattn" "$KAB/base/" && cp build/device/treeattn "$KAB/new/" && echo "built base $BASE and new $TREEATTN_COMMIT"
fi
[[ " $PHASES " == *" ab "* ]] || exit 0
# The copies find their data through TREEATTN_DATA_DIR (both commits' data/ are the same files).
export TREEATTN_DATA_DIR="$ROOT/data"
{
  echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); base $BASE; new $TREEATTN_COMMIT; $(date -u +%FT%TZ)"
  echo "command: BASE=$BASE ROUNDS=$ROUNDS scripts/device_kernel_ab.sh"
  for set in ${SETS:-medusa other}; do ROUNDS=$ROUNDS SET=$set bash scripts/medusa_ab.sh "$KAB/base" "$KAB/new"; done
} >"$OUT/ab.txt" 2>&1
for b in base new; do
  for s in fasttree pat; do
    "$KAB/$b/treeattn" bench --suite $s --quick -p auto --out "$KAB/$b-$s" >"$OUT/quick_${b}_$s.log" 2>&1
  done
done
python3 "$ROOT/scripts/ab_table.py" "$OUT/ab.txt" base new
