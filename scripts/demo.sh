#!/usr/bin/env bash
# The main job: build treeattn (Release; the CUDA executor too when nvcc is
# present) and run `treeattn demo`. Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target treeattn_cli >/dev/null
exec build/default/treeattn demo "$@"
