#!/usr/bin/env bash
# One device call for the runtime, the Python package and the engine: build
# for sm_90a with the Python extension (against the machine's python3), run
# the GPU tests (C++), compute-sanitizer memcheck + racecheck on the Sanitize*
# subset, the Python tests (GPU ones included), then the steps named in STEPS
# beyond those (bench: bench/runtime/bench_runtime.py; example:
# examples/decode_loop.py; engine: scripts/engine_bench.sh; fp8: the suites
# with fp8 against fp16 K/V pools; hoststep: the planning benchmark on one
# host core, two rounds, into $OUT/host_step.txt). Logs go to $OUT;
# a summary table is printed last.
# Usage: TREEATTN_COMMIT=$(git rev-parse --short=12 HEAD) STEPS="build tests sanitize pytest bench" scripts/device_runtime.sh
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/device_sanitize.sh"
OUT=${OUT:-$ROOT/build/device_out}
BUILD=${BUILD:-$ROOT/build/device}
STEPS=${STEPS:-"build tests sanitize pytest"}
mkdir -p "$OUT" "$BUILD"
export TREEATTN_COMMIT=${TREEATTN_COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
T0=$(date +%s)
declare -A STATUS
has() { [[ " $STEPS " == *" $1 "* ]]; }
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
PY=$(command -v python3)
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

stamp "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); commit $TREEATTN_COMMIT"
if has build; then
  stamp "build (Release, sm_90a, Python extension for $($PY --version))"
  if cmake -S "$ROOT" -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DTREEATTN_PYTHON=ON -DTREEATTN_TESTS=ON -DTREEATTN_BENCHMARKS=ON -DPython_EXECUTABLE="$PY" >"$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" -j16 --target treeattn_cli treeattn_gpu_tests _treeattn >>"$OUT/build.log" 2>&1; then
    STATUS[build]=ok
    # The planning benchmark exists where Google Benchmark is installed.
    cmake --build "$BUILD" -j16 --target treeattn_planning_bench >>"$OUT/build.log" 2>&1 || echo "(no planning benchmark)"
  else
    STATUS[build]=FAIL; tail -40 "$OUT/build.log"
  fi
  grep -E "spill|error" "$OUT/build.log" | grep -v " 0 bytes spill" | sed 's/_ZN8treeattn4cuda//' | cut -c1-200 | head -8
fi
built() { [[ ${STATUS[build]:-ok} == ok ]]; }

if has tests && built; then
  stamp "GPU tests (C++)"
  if timeout 420 "$BUILD/tests/treeattn_gpu_tests" >"$OUT/tests.log" 2>&1; then STATUS[tests]=ok; else STATUS[tests]=FAIL; fi
  grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|error" "$OUT/tests.log" | head -30
fi

if has sanitize && built; then
  stamp "compute-sanitizer memcheck + racecheck (Sanitize* tests)"
  run_sanitizers "$BUILD" "$OUT" 300
fi

if has pytest && built; then
  stamp "Python tests (pytest, GPU ones included)"
  if timeout 420 "$PY" -m pytest -q -p no:cacheprovider "$ROOT/tests/python" >"$OUT/pytest.log" 2>&1; then
    STATUS[pytest]=ok; else STATUS[pytest]=FAIL; fi
  grep -E "passed|failed|Error|FAILED" "$OUT/pytest.log" | tail -15
fi

if has bench && built; then
  stamp "runtime benchmark"
  if timeout 400 "$PY" "$ROOT/bench/runtime/bench_runtime.py" --build "$BUILD" --out "$OUT/runtime_bench.json" \
      >"$OUT/bench.log" 2>&1; then STATUS[bench]=ok; else STATUS[bench]=FAIL; fi
  tail -40 "$OUT/bench.log"
fi

if has example && built; then
  stamp "examples/decode_loop.py"
  if timeout 400 "$PY" "$ROOT/examples/decode_loop.py" --json "$OUT/decode_loop.json" >"$OUT/example.log" 2>&1; then
    STATUS[example]=ok; else STATUS[example]=FAIL; fi
  tail -25 "$OUT/example.log"
fi

if has engine && built; then
  stamp "engine benchmarks"
  if timeout 500 bash "$ROOT/scripts/engine_bench.sh" "$OUT" >"$OUT/engine.log" 2>&1; then
    STATUS[engine]=ok; else STATUS[engine]=FAIL; fi
  tail -40 "$OUT/engine.log"
fi

if has fp8 && built; then
  # fp8 vs 16-bit K/V pools: the same suites, planner auto, each config
  # verified against fp64; bench/kv/compare_kv_dtypes.py compares them.
  stamp "fp8 K/V pools vs fp16 (suites ${FP8_SUITES:-fasttree pat}, planner auto)"
  STATUS[fp8]=ok
  for s in ${FP8_SUITES:-fasttree pat}; do
    for kv in fp16 fp8_e4m3; do
      timeout 200 "$BUILD/treeattn" bench --suite "$s" -p auto --kv-dtype "$kv" --verify 2 --out "$OUT/kv_$kv/$s" \
        >"$OUT/kv_${kv}_$s.log" 2>&1 || STATUS[fp8]=FAIL
    done
    "$PY" "$ROOT/bench/kv/compare_kv_dtypes.py" "$OUT/kv_fp16/$s/results.json" "$OUT/kv_fp8_e4m3/$s/results.json" \
      --json "$OUT/kv_compare_$s.json" | tail -${FP8_ROWS:-12} || STATUS[fp8]=FAIL
  done
  # At most 8 files come back from the device: the suites' outputs as one archive.
  tar czf "$OUT/kv_suites.tgz" -C "$OUT" kv_fp16 kv_fp8_e4m3 && rm -rf "$OUT/kv_fp16" "$OUT/kv_fp8_e4m3"
fi

if has hoststep && built; then
  # Host planning cost of a decode step on this machine's CPU, pinned to one core.
  BENCH="$BUILD/bench/planning/treeattn_planning_bench"
  FILTER=${HOSTSTEP_FILTER:-'runtime/(plan_tree|decode_steps)/(cpu|cuda)/1000$|runtime/decode_steps/cpu_and_pack/1000$|runtime/block_tables/|runtime/tree_queries/|plan/auto/1000$|step/(validate_tree|plan|validate_plan)/1000$|step/pack/cuda/1000$'}
  if [[ -x $BENCH ]]; then
    stamp "host planning benchmark (one core, two rounds)"
    {
      echo "# The planning benchmark on the GPU machine's CPU, one core (taskset -c 3); medians of 5 repetitions (min time 0.3 s), two rounds in one call"
      echo "# command: taskset -c 3 $BENCH --benchmark_filter='$FILTER' --benchmark_repetitions=5 --benchmark_min_time=0.3s --benchmark_report_aggregates_only=true"
      echo "# device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); date $(date -u +%FT%TZ); commit $TREEATTN_COMMIT"
      for round in 1 2; do
        echo "## round $round"
        taskset -c 3 "$BENCH" --benchmark_filter="$FILTER" --benchmark_repetitions=5 --benchmark_min_time=0.3s \
          --benchmark_report_aggregates_only=true 2>/dev/null | grep -E "^Benchmark|_median"
      done
    } >"$OUT/host_step.txt" && STATUS[hoststep]=ok || STATUS[hoststep]=FAIL
    cat "$OUT/host_step.txt"
  else
    echo "(no planning benchmark built)"; STATUS[hoststep]=FAIL
  fi
fi

stamp "summary"
for k in "${!STATUS[@]}"; do echo "  $k: ${STATUS[$k]}"; done | sort
