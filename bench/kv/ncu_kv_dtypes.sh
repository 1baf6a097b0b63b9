#!/usr/bin/env bash
# ncu of the attention launches with fp16 and with fp8 K/V pools (the verification
# run's launches, then the first timed run's), per config; on the GPU machine:
#   TREEATTN_COMMIT=$(git rev-parse --short HEAD) OUT=dir bash bench/kv/ncu_kv_dtypes.sh
set -u
B=build/device
STEPS=build OUT=$OUT BUILD=$B bash scripts/device_check.sh > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__warps_active.avg.pct_of_peak_sustained_active
for w in "fasttree:N=1,1024:C=2048,32 --heads 32/32" "fasttree:N=1,4,16,512:C=1024,256,128,32 --heads 32/8"; do
  for kv in fp16 fp8_e4m3; do
    echo "=== $w kv $kv"
    ncu --metrics $M --kernel-name regex:'attention_kernel' --launch-count 4 --csv --print-units base \
      $B/treeattn bench -w $w -p auto --kv-dtype $kv --iters 50 --warmup 0 --verify 0 --no-graph > $OUT/ncu_tmp.csv 2>/dev/null
    python3 - $OUT/ncu_tmp.csv <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
rows = rows[next(i for i, r in enumerate(rows) if "Kernel Name" in r):]  # the bench's own output comes first
hdr = rows[0]; ki = hdr.index("Kernel Name"); mi = hdr.index("Metric Name"); vi = hdr.index("Metric Value"); ii = hdr.index("ID")
by = collections.OrderedDict()
for r in rows[1:]:
    k = (r[ii], r[ki].split("AttnTraits")[-1][:40])
    by.setdefault(k, {})[r[mi]] = r[vi]
for k, m in by.items():
    short = {n.split(".")[0]: v for n, v in m.items()}
    print(k[1], " ".join(f"{n}={v}" for n, v in short.items()))
PY
  done
done 2>&1 | tee $OUT/ncu_fp8.txt
