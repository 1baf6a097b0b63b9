#!/usr/bin/env bash
# A/B of `treeattn bench` flags in one binary (BIN, built by an earlier step
# of the same device session): a wrapper per variant adds its flags, then
# scripts/medusa_ab.sh times both in alternating rounds on its sets, and
# scripts/ab_table.py prints a per-config table of b against a (eager, and
# the graph replay where GRAPH=1). Log: $OUT/flags_ab.txt.
# Usage: A="--step-executor --no-skip-unseen" B="--step-executor" GRAPH=1 SETS=masked HEADS="32/8 64/8" \
#          BIN=build/device/treeattn scripts/flags_ab.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT"
OUT=${OUT:-$ROOT/build/device_out}; mkdir -p "$OUT"
BIN=$(realpath "${BIN:-build/device/treeattn}")
export TREEATTN_DATA_DIR="$ROOT/data"
for v in a b; do
  flags=${A-}; [[ $v == b ]] && flags=${B-}
  mkdir -p "build/flags_ab/$v"
  printf '#!/usr/bin/env bash\nexec "%s" "$@" %s\n' "$BIN" "$flags" > "build/flags_ab/$v/treeattn"
  chmod +x "build/flags_ab/$v/treeattn"
done
{
  echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); commit ${TREEATTN_COMMIT:-unknown}; $(date -u +%FT%TZ)"
  echo "command: A=\"${A-}\" B=\"${B-}\" GRAPH=${GRAPH:-0} ROUNDS=${ROUNDS:-2} SETS=\"${SETS:-masked}\" HEADS=\"${HEADS-}\" scripts/flags_ab.sh"
  for set in ${SETS:-masked}; do SET=$set bash scripts/medusa_ab.sh build/flags_ab/a build/flags_ab/b; done
} >"$OUT/flags_ab.txt" 2>&1
grep -iE "error|FAIL" "$OUT/flags_ab.txt" | head -5
echo "== eager (us), b/a"; python3 scripts/ab_table.py "$OUT/flags_ab.txt" a b
if [[ ${GRAPH:-0} == 1 ]]; then echo "== graph replay (us graph), b/a"; COLUMN=graph python3 scripts/ab_table.py "$OUT/flags_ab.txt" a b; fi
