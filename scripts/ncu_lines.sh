#!/usr/bin/env bash
# Where an attention launch's warps spend their time, per CUDA source line:
# ncu's warp-state sampling (SourceCounters) of one L2-flushed run of one
# planner on one tree, summed by line and printed largest first, with the
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
ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda >"$OUT/$name.source.csv" 2>"$OUT/$name.source.err"
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$OUT/$name.sass.csv" 2>>"$OUT/$name.source.err"
python3 - "$OUT/$name.source.csv" <<'PY' >"$OUT/$name.lines.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r)), None)
if head is None:
    print("no warp stall sampling column; header rows:", rows[:3]); sys.exit()
h = rows[head]
col = next(i for i, c in enumerate(h) if "Warp Stall Sampling (All" in c)
src = next((i for i, c in enumerate(h) if c.strip() == "Source"), 1)
line = next((i for i, c in enumerate(h) if c.strip() in ("#", "Line")), 0)
tot = 0; out = []
for r in rows[head + 1:]:
    if len(r) <= col: continue
    try: v = float(r[col].replace(",", "") or 0)
    except ValueError: continue
    tot += v; out.append((v, r[line], r[src].strip()[:110]))
out.sort(reverse=True)
print(f"warp stall samples: {tot:.0f}")
for v, l, s in out[:45]:
    if v > 0: print(f"{100 * v / max(tot, 1):5.1f}%  {l:>5}  {s}")
PY
cat "$OUT/$name.lines.txt"; grep -E "attention_kernel|Stall|Warp Cycles|Issued|Block Size|Grid Size|Registers|Duration" "$OUT/$name.details.txt" | cut -c1-160 | head -30
rm -f "$rep.ncu-rep"; gzip -f "$OUT/$name.sass.csv" "$OUT/$name.source.csv"
