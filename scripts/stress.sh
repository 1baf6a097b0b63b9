#!/usr/bin/env bash
# Long runs, not in CI (issue 20, point 6): `treeattn verify` over seeded
# random trees with every planner, then the planner property tests
# (CorePlanners, PaperPlanners) at many random trees each.
#   usage: [JOBS=nproc] [FIRST=0] scripts/stress.sh [TREES=100000] [PROPERTY_TREES=10000] [BUILD=build/cpu]
# (FIRST: verify only the trees FIRST..TREES-1, to split a run; PROPERTY_TREES=0
# skips the property tests)
# Trees vary in shape (random:seed=S:nodes=N, N from 2 to 64), heads, page
# size and dtype with the seed. Verify runs 200 trees per process, JOBS
# processes at a time; any tolerance failure or error stops the run with the
# seed range in the log.
# Prints the counts it ran; docs/testing.md records the last ones.
set -euo pipefail
cd "$(dirname "$0")/.."
trees=${1:-100000}
property=${2:-10000}
build=${3:-build/cpu}
cli=$build/treeattn
[ -x "$cli" ] || { echo "stress: $cli not built (cmake --preset cpu && cmake --build --preset cpu)"; exit 2; }
jobs=${JOBS:-$(nproc)}
heads=(8/2 4/4 16/2 8/8)
pages=(1 4 16 64)
dtypes=(fp16 bf16 fp16 fp32)
batch=200
start=$(date +%s)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# one process per batch of trees [b, b + n); its log is kept only when it fails
verify_batch() {
  local b=$1 n=$2 k=$((($1 / batch) % 4)) args=() s
  for ((s = b; s < b + n; ++s)); do args+=(-w "random:seed=$s:nodes=$((2 + s % 63))"); done
  if nice -n 10 "$cli" verify "${args[@]}" --planner all --heads "${heads[$k]}" --head-dim 64 \
      --page-size "${pages[$k]}" --dtype "${dtypes[$k]}" --seed "$b" >"$logs/$b" 2>&1; then
    rm -f "$logs/$b"
  else
    echo "stress: FAIL in trees $b..$((b + n - 1)) (heads ${heads[$k]}, page ${pages[$k]}, ${dtypes[$k]})" >>"$logs/$b"
    return 1
  fi
}
failed=0 launched=0
first=${FIRST:-0}
for ((b = first; b < trees; b += batch)); do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || failed=1; done
  ((failed)) && break
  verify_batch "$b" $((trees - b < batch ? trees - b : batch)) &
  launched=$((launched + 1))
  if (((launched - 1) % 25 == 0)); then
    echo "stress: verify: batch $launched/$(((trees - first + batch - 1) / batch)) started, $jobs at a time ($(($(date +%s) - start)) s)"
  fi
done
while (($(jobs -rp | wc -l) > 0)); do wait -n || failed=1; done
if ((failed)); then
  for f in "$logs"/*; do grep -v " ok " "$f" | tail -20; done
  exit 1
fi
echo "stress: verify: trees $first..$((trees - 1)) x every planner ok in $(($(date +%s) - start)) s ($jobs processes)"
((property > 0)) || exit 0
t0=$(date +%s)
TREEATTN_PROPERTY_TREES=$property nice -n 10 "$build/tests/treeattn_tests" \
  --gtest_filter='*CorePlanners.ValidAndMatch*:PaperPlanners.ValidAndMatch*' 2>&1 | tail -3
echo "stress: property tests at $property trees each ok in $(($(date +%s) - t0)) s"
