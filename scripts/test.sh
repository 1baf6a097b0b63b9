#!/usr/bin/env bash
# Builds everything (CUDA sources too when nvcc is present: compiled, and run
# only where a GPU is) and runs all tests. GPU tests skip themselves without a
# GPU. Then the CPU test suite once more under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
cmake --preset default >/dev/null
cmake --build --preset default -j"$jobs"
ctest --preset default -j"$jobs"

# ---- the Python package: a venv with pinned packages, `pip install .` (the
# same CMake project through scikit-build-core), then pytest. Without a GPU the
# package is built without CUDA (the CUDA sources were compiled above; its GPU
# tests skip themselves).
if [ ! -x .venv/bin/python ] && ! python3 -m venv .venv; then  # Debian's python3 needs python3-venv
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -q python3-venv python3-dev >/dev/null && python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
cuda_define=()
nvidia-smi -L >/dev/null 2>&1 || cuda_define=(-C cmake.define.TREEATTN_CUDA=OFF)
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation "${cuda_define[@]}" \
  -C build.verbose=false -C cmake.build-type=Release .
.venv/bin/python -m pytest -q -p no:cacheprovider tests/python

cmake --preset asan-ubsan >/dev/null
cmake --build --preset asan-ubsan -j"$jobs" --target treeattn_tests treeattn_cli
ctest --preset asan-ubsan -j"$jobs"

# ---- fuzzing (issue 20): each libFuzzer target of fuzz/ for 20 s under ASan +
# UBSan (CTest label `fuzz` in build/fuzz; clang-14 + libfuzzer-14-dev), as
# many at a time as there are cores.
FUZZ_JOBS=$jobs bash scripts/fuzz.sh 20
