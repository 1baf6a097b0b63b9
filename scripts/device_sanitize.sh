# Sourced by the device scripts (device_check.sh, device_runtime.sh):
# compute-sanitizer memcheck and racecheck over the GPU tests' Sanitize*
# subset, each tool's summary lines printed and its result put in the
# caller's STATUS array. racecheck skips the mutated plans (thousands of
# runs: past the timeout under it); memcheck runs them.
#   usage: run_sanitizers BUILD_DIR OUT_DIR SECONDS_PER_TOOL
run_sanitizers() {
  local build=$1 out=$2 secs=$3 tool filter
  : >"$out/sanitizer.log"
  for tool in memcheck racecheck; do
    filter='*Sanitize*'
    [[ $tool == racecheck ]] && filter='*Sanitize*:-*SanitizeMutatedPlans*'
    if timeout "$secs" compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/treeattn_gpu_tests" \
        --gtest_filter="$filter" >>"$out/sanitizer.log" 2>&1; then STATUS[$tool]=ok; else STATUS[$tool]=FAIL; fi
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$out/sanitizer.log" | tail -3
  done
}
