#!/usr/bin/env bash
# One device call for the benchmark suites: build (via device_check.sh's build
# step), then `treeattn bench --suite` for each suite named in SUITES (default
# all four; QUICK=1 for the --quick subsets) and the demo, after measuring
# forge's cost table (CALIBRATE=0 skips it; RESUME=1 keeps the configs that a
# run of the same commit cut short finished). Reports land under
# bench/results/<device>/<suite>/ and, packed as one archive, in $OUT.
# Usage: TREEATTN_COMMIT=$(git rev-parse --short=12 HEAD) scripts/device_suites.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build/device_out}
BUILD=${BUILD:-$ROOT/build/device}
SUITES=${SUITES:-"fasttree pat flashforge deft"}
LOGS="$ROOT/build/suite_logs"   # packed into $OUT/suites.tgz (the device returns at most 8 files)
mkdir -p "$OUT" "$LOGS"
STEPS=build OUT="$LOGS" BUILD="$BUILD" bash "$ROOT/scripts/device_check.sh" >"$LOGS/suites_build.log" 2>&1
[ -x "$BUILD/treeattn" ] || { tail -30 "$LOGS/suites_build.log"; exit 1; }
quick=""; [ "${QUICK:-0}" = 1 ] && quick="--quick"
resume=""; [ "${RESUME:-0}" = 1 ] && resume="--resume"  # go on from a run of the same commit cut short
if [ "${CALIBRATE:-1}" = 1 ]; then  # forge's cost table first, so the suites' forge plans use it
  echo "== calibrate"
  "$BUILD/treeattn" calibrate --heads 32/8 --out "$ROOT/data/forge_cost_h100.json" 2>&1 | tee "$LOGS/calibrate.log" | head -9
fi
for s in $SUITES; do
  echo "== suite $s $quick"
  timeout "${SUITE_TIMEOUT:-280}" "$BUILD/treeattn" bench --suite "$s" $quick $resume --verify ${VERIFY:-2} 2>"$LOGS/suite_$s.progress" |
    tee "$LOGS/suite_$s.log" | grep -A12 "^## Geometric means"
done
echo "== demo"
"$BUILD/treeattn" demo 2>&1 | tee "$LOGS/demo.log" | tail -16
# Only what this call wrote: the whole of bench/results packs to more than the
# 16 MiB the device returns per file.
(cd "$ROOT" && find bench/results data/forge_cost_h100.json -type f -newer "$LOGS/suites_build.log" -print0 |
  tar czf "$OUT/suites.tgz" --null -T - build/suite_logs)
