#!/usr/bin/env bash
# Long runs, not in CI (issue 20, point 6): `treeattn verify` over seeded
# random trees with every planner, then the planner property tests
# (CorePlanners, PaperPlanners) at many random trees each.
#   usage: scripts/stress.sh [TREES=100000] [PROPERTY_TREES=10000] [BUILD=build/cpu]
# Trees vary in shape (random:seed=S:nodes=N, N from 2 to 64), heads, page
# size and dtype with the seed. Verify runs 200 trees per process; any
# tolerance failure or error stops the run with the seed range in the log.
# Prints the counts it ran; docs/testing.md records the last ones.
set -euo pipefail
cd "$(dirname "$0")/.."
trees=${1:-100000}
property=${2:-10000}
build=${3:-build/cpu}
cli=$build/treeattn
[ -x "$cli" ] || { echo "stress: $cli not built (cmake --preset cpu && cmake --build --preset cpu)"; exit 2; }
heads=(8/2 4/4 16/2 8/8)
pages=(1 4 16 64)
dtypes=(fp16 bf16 fp16 fp32)
batch=200
start=$(date +%s)
done_trees=0
for ((b = 0; b < trees; b += batch)); do
  n=$((trees - b < batch ? trees - b : batch))
  k=$(((b / batch) % 4))
  args=()
  for ((s = b; s < b + n; ++s)); do args+=(-w "random:seed=$s:nodes=$((2 + s % 63))"); done
  if ! nice -n 10 "$cli" verify "${args[@]}" --planner all --heads "${heads[$k]}" --head-dim 64 \
      --page-size "${pages[$k]}" --dtype "${dtypes[$k]}" --seed "$b" >/tmp/treeattn_stress.$$ 2>&1; then
    cat /tmp/treeattn_stress.$$ | grep -v " ok " | tail -20
    echo "stress: FAIL in trees $b..$((b + n - 1)) (heads ${heads[$k]}, page ${pages[$k]}, ${dtypes[$k]})"
    exit 1
  fi
  done_trees=$((done_trees + n))
  if (((b / batch) % 25 == 0)); then
    echo "stress: verify $done_trees/$trees trees ok ($(($(date +%s) - start)) s)"
  fi
done
rm -f /tmp/treeattn_stress.$$
echo "stress: verify: $done_trees random trees x every planner ok in $(($(date +%s) - start)) s"
t0=$(date +%s)
TREEATTN_PROPERTY_TREES=$property nice -n 10 "$build/tests/treeattn_tests" \
  --gtest_filter='*CorePlanners.ValidAndMatch*:PaperPlanners.ValidAndMatch*' 2>&1 | tail -3
echo "stress: property tests at $property trees each ok in $(($(date +%s) - t0)) s"
