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
python3 - "$OUT/ab.txt" <<'PY'
import os, re, sys, collections, statistics
t = collections.defaultdict(list)
cur = None
for line in open(sys.argv[1]):
    m = re.match(r"### round \d+ bin (\S+) heads (\S+)", line)
    if m: b, h = m.groups(); continue
    m = re.match(r"([a-z]+:\S+) ", line)
    if m: cur = m.group(1).replace(os.environ["TREEATTN_DATA_DIR"] + "/workloads/", ""); continue
    m = re.match(r"\s+auto\s+\d+\s+\d+\s+([0-9.]+)", line)
    if m and cur: t[(cur, h, b)].append(float(m.group(1)))
keys = sorted({(w, h) for (w, h, b) in t})
vs = ["v" + v for v in os.environ.get("VARIANTS", "0 1 2 3").split()]
r = collections.defaultdict(list)
print(f"{'config':60s} {'heads':6s} " + " ".join(f"{v+' us':>8s}" for v in vs) + "  " + " ".join(f"{v}/v0" for v in vs[1:]))
for w, h in keys:
    x = [min(t[(w, h, v)]) if t.get((w, h, v)) else float('nan') for v in vs]
    for i in range(1, len(vs)): r[i].append(x[i] / x[0])
    print(f"{w[:60]:60s} {h:6s} " + " ".join(f"{y:8.1f}" for y in x) + "  " + " ".join(f"{x[i]/x[0]:6.3f}" for i in range(1, len(vs))))
print("geomean vs v0: " + ", ".join(f"{vs[i]} {statistics.geometric_mean(r[i]):.3f}" for i in range(1, len(vs))) + f" over {len(keys)}")
PY
grep -E "error|Error|FAIL|[0-9]!" "$OUT/ab.txt" | head -5
