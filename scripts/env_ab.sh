#!/usr/bin/env bash
# A/B of kernel variants that one binary selects by an environment variable
# (an experiment's throwaway commit reads it at launch): one device call builds
# the CLI for sm_90a, times it with $ENVVAR set to each of VARIANTS in
# alternating rounds on scripts/medusa_ab.sh's sets (its --verify 2 included),
# and prints a per-config table of each variant's time against the first.
# Usage: ENVVAR=TREEATTN_MERGE_VARIANT VARIANTS="0 1 2" ROUNDS=2 SETS="medusa other" scripts/env_ab.sh
set -uo pipefail
ENVVAR=${ENVVAR:?ENVVAR=<variable the variants set>}
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT"
OUT=${OUT:-$ROOT/build/device_out}; mkdir -p "$OUT"
export TREEATTN_COMMIT=${TREEATTN_COMMIT:-$(git rev-parse --short=12 HEAD)}
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
cmake -S "$ROOT" -B build/device $GEN -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DTREEATTN_TESTS=OFF \
  -DTREEATTN_BENCHMARKS=OFF >"$OUT/build.log" 2>&1 && cmake --build build/device -j16 --target treeattn_cli >>"$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; exit 1; }
export TREEATTN_DATA_DIR="$ROOT/data"
for v in ${VARIANTS:-0 1 2 3}; do
  mkdir -p build/kv/v$v
  cat > build/kv/v$v/treeattn <<W
#!/usr/bin/env bash
$ENVVAR=$v exec "$ROOT/build/device/treeattn" "\$@"
W
  chmod +x build/kv/v$v/treeattn
done
{
  echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); commit $TREEATTN_COMMIT; $(date -u +%FT%TZ)"
  echo "command: ENVVAR=$ENVVAR VARIANTS=\"${VARIANTS:-0 1 2 3}\" ROUNDS=${ROUNDS:-2} SETS=\"${SETS:-medusa other}\" scripts/env_ab.sh"
  for set in ${SETS:-medusa other}; do ROUNDS=${ROUNDS:-2} SET=$set bash scripts/medusa_ab.sh $(for v in ${VARIANTS:-0 1 2 3}; do echo build/kv/v$v; done); done
} >"$OUT/ab.txt" 2>&1
python3 "$ROOT/scripts/ab_table.py" "$OUT/ab.txt" $(for v in ${VARIANTS:-0 1 2 3}; do echo v$v; done)
grep -E "error|Error|FAIL|[0-9]!" "$OUT/ab.txt" | head -5
