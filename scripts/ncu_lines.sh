#!/usr/bin/env bash
# Where an attention launch's warps spend their time: ncu's per-instruction
# counts and warp-state samples (SourceCounters) of one run of one planner on
# one tree (NAME.sass.csv.gz, mapped onto source lines where the sources are
# by scripts/sass_profile.py), the most stalled instructions and the
# launch's warp-state breakdown. The CLI of build/device is built if missing.
# Usage on the device: OUT=... W=spec HEADS=16/1 PLANNER=auto [SKIP=5] scripts/ncu_lines.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build/ncu_out}; mkdir -p "$OUT"
B=$ROOT/build/device
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
[[ -x $B/treeattn ]] || (cmake -S "$ROOT" -B "$B" $GEN -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DTREEATTN_TESTS=OFF -DTREEATTN_BENCHMARKS=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j16 --target treeattn_cli >>"$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
name=$(echo "${W}_${HEADS}_${PLANNER}" | tr -c 'A-Za-z0-9_.-' '_')
rep="$OUT/$name"
# The first attention launch after --launch-skip of them: past the verification run and the warm-ups.
ncu --kernel-name regex:attention_kernel --launch-skip "${SKIP:-5}" --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy \
    --import-source yes -f -o "$rep" \
    "$B/treeattn" bench -w "$W" --heads "$HEADS" -p "$PLANNER" --iters 50 --warmup 5 --verify 0 --no-graph \
    >"$OUT/$name.ncu.log" 2>&1 || { tail -20 "$OUT/$name.ncu.log"; exit 1; }
ncu -i "$rep.ncu-rep" --page details --section WarpStateStats --section LaunchStats >"$OUT/$name.details.txt" 2>&1
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$OUT/$name.sass.csv" 2>"$OUT/$name.source.err"
# ncu's CUDA-source CSV carries no metrics: the per-line view is made where the
# sources are, by scripts/sass_profile.py KERNEL NAME.sass.csv.gz --warps W.
python3 - "$OUT/$name.sass.csv" <<'PY' >"$OUT/$name.lines.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next(i for i, r in enumerate(rows) if "Instructions Executed" in r)
h = rows[head]; ie = h.index("Instructions Executed"); ist = h.index("Warp Stall Sampling (All Samples)")
data = [(float(r[ie] or 0), float(r[ist] or 0), r[0], r[1]) for r in rows[head + 1:] if r and r[0].startswith("0x")]
print(f"warp instructions executed {sum(d[0] for d in data):.0f}; stall samples {sum(d[1] for d in data):.0f}")
for ex, st, addr, text in sorted(data, key=lambda d: -d[1])[:25]:
    print(f"  stall {st:6.0f}  executed {ex:9.0f}  {addr}  {text.strip()[:70]}")
PY
cat "$OUT/$name.lines.txt"; grep -E "attention_kernel|Stall|Warp Cycles|Issued|Block Size|Grid Size|Registers|Duration" "$OUT/$name.details.txt" | cut -c1-160 | head -30
rm -f "$rep.ncu-rep"; gzip -f "$OUT/$name.sass.csv"
