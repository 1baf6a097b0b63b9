#!/usr/bin/env bash
# The engine benchmark of issue 18 on one GPU (Llama-3-8B shapes, random weights, bf16, CUDA
# graphs; shared / two-level / sample / independent x auto / per-query, then the
# transformers.generate reference): bench/engine/engine_bench.py, results as JSON in OUTDIR.
# Expects the built package on PYTHONPATH (scripts/device_runtime.sh sets it) and
# TREEATTN_COMMIT in the environment (else git's HEAD). Extra arguments go to the bench.
# Then the speculative-decoding benchmark of issue 19 (bench/engine/spec_bench.py); BENCHES="spec"
# runs it alone, BENCHES="engine" the engine bench alone.
# Usage: [BENCHES="engine spec"] scripts/engine_bench.sh OUTDIR [--programs shared,sample] [--steps N] [--hf-reference off]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:?usage: scripts/engine_bench.sh OUTDIR [bench options]}
shift
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
export TREEATTN_COMMIT=${TREEATTN_COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader || true
BENCHES=${BENCHES:-"engine spec"}   # which to run; extra arguments go to the engine bench
rc=0
if [[ " $BENCHES " == *" engine "* ]]; then
  python3 "$ROOT/bench/engine/engine_bench.py" --out "$OUTDIR/engine_bench.json" "$@" || rc=$?
fi
# issue 19 section 2: speculative decoding with token trees (8 requests x 4000-token prompt,
# draft trees of 32, 64 and 256 tokens, auto vs per-query): bench/engine/spec_bench.py
if [[ " $BENCHES " == *" spec "* ]]; then
  python3 "$ROOT/bench/engine/spec_bench.py" --out "$OUTDIR/spec_bench.json" || rc=$?
fi
exit $rc
