#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang, ASan and UBSan (build/fuzz)
# and runs each for SECONDS (default 60) on its committed seed corpus under
# nice, FUZZ_JOBS (default 1) at a time, which also sets the build's jobs; then
# prints each target's executions and exec/s. A target is one process on one
# core, so FUZZ_JOBS up to the core count keeps each target's executions.
#   usage: [FUZZ_JOBS=N] scripts/fuzz.sh [SECONDS] [TARGET-REGEX]
# A crash, leak, sanitizer report or oracle failure fails the run; the input is
# kept under build/fuzz/fuzz/artifacts/. CI runs `FUZZ_JOBS=$(nproc) scripts/fuzz.sh 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
only=${2:-}
bash scripts/deps.sh
# clang and libFuzzer only for this script (Debian 12: clang-14).
missing=()
for p in clang-14 libfuzzer-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
    { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B build/fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$san -fsanitize=fuzzer-no-link" -DCMAKE_EXE_LINKER_FLAGS="$san" \
  -DTREEATTN_CUDA=OFF -DTREEATTN_TESTS=OFF -DTREEATTN_BENCHMARKS=OFF -DTREEATTN_FUZZ=ON \
  -DTREEATTN_FUZZ_SECONDS="$secs" >/dev/null
jobs=${FUZZ_JOBS:-1}
nice -n 10 cmake --build build/fuzz -j"$jobs" --target fuzz_json_tree fuzz_block_table \
  fuzz_workload_spec fuzz_tot fuzz_medusa fuzz_plan_mutation fuzz_runtime_plan fuzz_cost_tables
rc=0
nice -n 10 ctest --test-dir build/fuzz -L fuzz ${only:+-R "$only"} -j"$jobs" --output-on-failure || rc=$?
# Executions per target from libFuzzer's final stats in CTest's log.
awk '/^[0-9]+\/[0-9]+ Test: / {t=$3} /stat::number_of_executed_units/ {n[t]=$2}
     /stat::average_exec_per_sec/ {s[t]=$2}
     END {for (t in n) printf "fuzz: %-20s %10d executions  %6d exec/s\n", t, n[t], s[t]}' \
  build/fuzz/Testing/Temporary/LastTest.log | sort
# A failure's cause last, where a CI log's tail shows it: libFuzzer's and the
# sanitizers' reports, the oracle's message, the input (Base64 when small)
# and where it was written.
if ((rc)); then
  awk '/^[0-9]+\/[0-9]+ Test: / {t=$3}
       /fuzz oracle failed|==ERROR|^SUMMARY|deadly signal|out-of-memory|ALARM|Test unit written|^Base64:|runtime error/ {
         print "fuzz failure: " t ": " substr($0, 1, 400)}' build/fuzz/Testing/Temporary/LastTest.log
fi
exit $rc
