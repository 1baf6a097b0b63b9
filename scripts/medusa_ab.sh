#!/usr/bin/env bash
# Issue 21 goal 4 (tree queries): A/B of attention kernels on the tree-query
# workloads, in one device call. Each argument is a directory holding a
# `treeattn` binary (label = directory name); every binary times the same
# configs (planner auto, L2 flushed, median of 50, CUDA events) in ROUNDS
# alternating rounds, so that the machine's drift falls on both sides.
# Usage: ROUNDS=2 SET=medusa scripts/medusa_ab.sh build/h21/base build/h21/new
#   SET=medusa: Medusa 128/32 drafts on 8192 + the DeFT suite's 9 medusa configs, 32/8 and 32/32
#   SET=other:  a few configs of the other suites whose time is in 64/128-row tiles
#   SET=small:  issue 21 goal 3's small trees (short 16- and 32-row CTAs), at 16/1 and 32/8
#   SET=masked: trees whose plans run long masked units (compact subtrees of deep or random
#               trees, 64- and 128-row ones at 16/1), at 16/1 and 32/8
#   HEADS="16/1 32/8" overrides the head configs (default: 32/8 32/32; small, masked: 16/1 32/8)
#   GRAPH=1 times the CUDA-graph replay too (default: eager only; scripts/ab_table.py's
#           COLUMN=graph tabulates it)
set -uo pipefail
ROUNDS=${ROUNDS:-2}
SET=${SET:-medusa}
W=
MED=()
for s in 128 32; do MED+=(-w medusa:APPS_tree_size$s.json:record=0:step=10:prefix=8192); done
for s in 32 64 128; do for p in 1024 4096 16384; do MED+=(-w medusa:APPS_tree_size$s.json:record=0:step=10:prefix=$p); done; done
OTH=(-w pat:B=1,8,512:L=32,2048,256 -w fasttree:N=1,10:C=4000,400 -w fasttree:N=1,256:C=256,32
     -w fewshot:prompt=4000:branches=30:len=200 -w pat:B=1,4,16,512:L=32,1024,256,256 -w fasttree:N=1,1024:C=2048,32)
SMALL=(-w fasttree:N=1,256:C=256,32 -w fasttree:N=1,2,64:C=8,256,32 -w fasttree:N=1,4,256:C=8,256,32
       -w fasttree:N=1,10:C=4000,400 -w fasttree:N=1,16,64:C=1024,256,32 -w fasttree:N=1,4,8,256:C=8,256,256,32
       -w fasttree:N=1,2,4,8,16,32,64,128,1024:C=16,16,16,16,16,16,16,16,16 -w pat:B=256:L=1024
       -w tot:docmergeToT.json:task=all:iter=1000 -w tot:sorting128ToT.json:task=all:iter=300)
MASKED=(-w random:seed=211:nodes=2048:tokens=200 -w random:seed=214:nodes=512:tokens=100 -w pat:B=1,1024:L=2048,32
        -w fasttree:N=1,8,16,32,64,128,1024:C=256,128,64,16,16,16,16 -w fasttree:N=1,16,32,64,128,1024:C=256,128,64,16,16,16
        -w pat:B=1,8,16,32,64,128,1024:L=256,128,64,32,32,32,32 -w fasttree:N=1,4,8,256:C=8,256,256,32
        -w pat:B=1,4,8,256:L=32,256,256,32 -w kary:arity=8:depth=2:total=100000:leftmost=1
        -w tot:sorting128ToT.json:task=all:iter=6000)
case "$SET" in small | masked) HEADS=${HEADS:-"16/1 32/8"} ;; *) HEADS=${HEADS:-"32/8 32/32"} ;; esac
for r in $(seq 1 "$ROUNDS"); do
  for d in "$@"; do
    for h in $HEADS; do
      case "$SET" in medusa) WS=("${MED[@]}") ;; small) WS=("${SMALL[@]}") ;; masked) WS=("${MASKED[@]}") ;; *) WS=("${OTH[@]}") ;; esac
      echo "### round $r bin $(basename "$d") heads $h"
      "$d/treeattn" bench "${WS[@]}" --heads "$h" -p auto --verify 2 $([[ ${GRAPH:-0} == 1 ]] || echo --no-graph) 2>&1 |
        grep -E "^[a-z]|^  auto|error|Error|FAIL" | sed 's/^  auto/    auto/'
    done
  done
done
