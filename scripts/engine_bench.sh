#!/usr/bin/env bash
# The engine benchmark of issue 18 on one GPU (Llama-3-8B shapes, random weights, bf16, CUDA
# graphs; shared / two-level / sample / independent x auto / per-query, then the
# transformers.generate reference): bench/engine/engine_bench.py, results as JSON in OUTDIR.
# Expects the built package on PYTHONPATH (scripts/device_runtime.sh sets it) and
# TREEATTN_COMMIT in the environment (else git's HEAD). Extra arguments go to the bench.
# Usage: scripts/engine_bench.sh OUTDIR [--programs shared,sample] [--steps N] [--hf-reference off]
# BENCH=tot runs the tree-of-thoughts replay of issue 19 instead (bench/engine/tot_bench.py:
# the recorded ToT files, all tasks batched, auto vs per-query), results in OUTDIR/tot_bench.json:
#        BENCH=tot scripts/engine_bench.sh OUTDIR [--files docmergeToT.json] [--max-steps N]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:?usage: scripts/engine_bench.sh OUTDIR [bench options]}
shift
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
export TREEATTN_COMMIT=${TREEATTN_COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader || true
BENCH=${BENCH:-engine}
exec python3 "$ROOT/bench/engine/${BENCH}_bench.py" --out "$OUTDIR/${BENCH}_bench.json" "$@"
