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
cmake --preset asan-ubsan >/dev/null
cmake --build --preset asan-ubsan -j"$jobs" --target treeattn_tests treeattn_cli
ctest --preset asan-ubsan -j"$jobs"

# ---- fuzzing (issue 20): each libFuzzer target of fuzz/ for 20 s under ASan +
# UBSan (CTest label `fuzz` in build/fuzz; clang-14 + libfuzzer-14-dev).
bash scripts/fuzz.sh 20
