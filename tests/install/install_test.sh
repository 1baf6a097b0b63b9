#!/usr/bin/env bash
# The installed layout (issue 20, point 5), run by CTest (label cpu):
#   usage: install_test.sh BUILD_DIR CMAKE
# Installs BUILD_DIR into a temporary prefix, then moves the prefix, so that
# nothing can be found through a path known at build or install time, and
# checks, with TREEATTN_DATA_DIR unset and the working directory outside the
# repository:
#   - `treeattn workloads`, `treeattn plan`, `treeattn bench --help` succeed;
#   - `plan -p pat -p forge` reads the installed tile rules and cost table
#     (shown by corrupting the installed copy: the error names it);
#   - a recorded workload given by file name is found under share/treeattn;
#   - a copy of the binary alone fails with a message listing every place it
#     looked, and works again with TREEATTN_DATA_DIR;
#   - an outside CMake project finds the package with find_package(treeattn),
#     builds against it and runs.
set -euo pipefail
build=$(cd "$1" && pwd)
cmake=${2:-cmake}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/treeattn_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unset TREEATTN_DATA_DIR
cd "$tmp"

fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
expect_ok() { "$@" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "exit $? from: $*"; }; }
expect_err() {  # expect_err NEEDLE CMD...: exit code 2 and NEEDLE in the output
  local needle=$1; shift
  local rc=0; "$@" >"$tmp/out" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "$tmp/out"; fail "exit $rc (expected 2) from: $*"; }
  grep -qF -- "$needle" "$tmp/out" || { cat "$tmp/out"; fail "'$needle' not in the output of: $*"; }
}

"$cmake" --install "$build" --prefix "$tmp/stage" >/dev/null
mv "$tmp/stage" "$tmp/prefix"
p=$tmp/prefix
[ -f "$p/share/treeattn/suites/pat.suite" ] || fail "share/treeattn/suites/pat.suite not installed"
[ -f "$p/share/treeattn/pat_tile_rules.json" ] || fail "share/treeattn/pat_tile_rules.json not installed"
t=$p/bin/treeattn

expect_ok "$t" workloads
grep -q "fasttree" "$tmp/out" || fail "workloads does not list fasttree"
expect_ok "$t" plan -w fasttree:N=1,4:C=64,16 --heads 8/2
expect_ok "$t" bench --help
grep -q -- "--suite" "$tmp/out" || fail "bench --help does not mention --suite"
expect_ok "$t" plan -w medusa:APPS_tree_size32.json:record=0:step=1:prefix=64 --heads 8/2 -p node

# The installed tables are the ones read: a corrupt copy names its path.
cp "$p/share/treeattn/pat_tile_rules.json" "$tmp/rules.bak"
echo '{' >"$p/share/treeattn/pat_tile_rules.json"
expect_err "$p/share/treeattn/pat_tile_rules.json" "$t" plan -w fasttree:N=1,4:C=64,16 -p pat
cp "$tmp/rules.bak" "$p/share/treeattn/pat_tile_rules.json"

# The binary alone: every place it looked is named; TREEATTN_DATA_DIR helps.
mkdir -p "$tmp/lonely/bin"
cp "$t" "$tmp/lonely/bin/"
expect_err "$tmp/lonely/bin/../share/treeattn (no such directory)" \
  "$tmp/lonely/bin/treeattn" plan -w medusa:APPS_tree_size32.json:record=0:step=1:prefix=64
grep -qF '$TREEATTN_DATA_DIR (unset)' "$tmp/out" || { cat "$tmp/out"; fail "the message does not mention TREEATTN_DATA_DIR"; }
TREEATTN_DATA_DIR=$p/share/treeattn expect_ok "$tmp/lonely/bin/treeattn" plan \
  -w medusa:APPS_tree_size32.json:record=0:step=1:prefix=64 --heads 8/2 -p node

# An outside project: find_package(treeattn), plan a workload, validate it.
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(treeattn_consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(treeattn REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE treeattn::treeattn)
CMAKE
cat >"$tmp/consumer/main.cpp" <<'CPP'
#include <cstdio>
#include <treeattn/planner.hpp>
#include <treeattn/workloads.hpp>
int main() {
  const treeattn::Workload w = treeattn::make_workload("fewshot:prompt=256:branches=4:len=32", {});
  const treeattn::Plan p = treeattn::make_plan("node", w);
  treeattn::validate_plan(w, p);
  std::printf("consumer: %d units\n", p.num_units());
  return p.num_units() > 0 ? 0 : 1;
}
CPP
expect_ok "$cmake" -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release
expect_ok "$cmake" --build "$tmp/consumer/build" -j1
expect_ok "$tmp/consumer/build/consumer"
grep -q "units" "$tmp/out" || fail "consumer printed nothing"
echo "install_test: ok (prefix moved to $p; CLI, data lookup and find_package checked)"
