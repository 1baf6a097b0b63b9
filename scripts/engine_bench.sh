#!/usr/bin/env bash
# The engine benchmark of issue 18 on one GPU (Llama-3-8B shapes, random weights, bf16, CUDA
# graphs; shared / two-level / sample / independent x auto / per-query, then the
# transformers.generate reference): bench/engine/engine_bench.py, results as JSON in OUTDIR.
# Expects the built package on PYTHONPATH (scripts/device_runtime.sh sets it) and
# TREEATTN_COMMIT in the environment (else git's HEAD). Extra arguments go to the bench.
# Then the benchmarks of issue 19: speculative decoding with token trees (bench/engine/spec_bench.py)
# and the tree-of-thoughts replay of the recorded ToT files, all tasks batched, auto vs per-query
# (bench/engine/tot_bench.py). BENCHES picks which run (default "engine spec tot"); extra
# arguments go to the engine bench, TOT_ARGS to the ToT bench (e.g. "--tasks 40 --max-steps 500").
# Usage: [BENCHES="engine spec tot"] [TOT_ARGS=...] scripts/engine_bench.sh OUTDIR [--programs shared,sample] [--steps N] [--hf-reference off]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:?usage: scripts/engine_bench.sh OUTDIR [bench options]}
shift
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
export TREEATTN_COMMIT=${TREEATTN_COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader || true
BENCHES=${BENCHES:-"engine spec tot"}
rc=0
if [[ " $BENCHES " == *" engine "* ]]; then
  python3 "$ROOT/bench/engine/engine_bench.py" --out "$OUTDIR/engine_bench.json" "$@" || rc=$?
fi
if [[ " $BENCHES " == *" spec "* ]]; then
  python3 "$ROOT/bench/engine/spec_bench.py" --out "$OUTDIR/spec_bench.json" || rc=$?
fi
if [[ " $BENCHES " == *" tot "* ]]; then
  # shellcheck disable=SC2086 # TOT_ARGS: words
  python3 "$ROOT/bench/engine/tot_bench.py" --out "$OUTDIR/tot_bench.json" ${TOT_ARGS:-} || rc=$?
fi
exit $rc
