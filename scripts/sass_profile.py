#!/usr/bin/env python3
"""Executed instructions of one attention launch per source line, without ncu's source view.

ncu's CSV source page prints per-SASS-instruction counts but no source lines for the CUDA
view (`scripts/ncu_lines.sh` writes NAME.sass.csv.gz on the device). This maps that file onto
the kernel's source lines through a local disassembly with line info of the same
instantiation (`scripts/sass_loop.py`'s nvcc + nvdisasm -g; the same nvcc version and flags
give the same SASS: the opcodes are checked address by address), and prints the
instructions executed per warp before, in and after the K/V loop and the lines that
execute most, with their share of ncu's warp-stall samples.

  scripts/sass_profile.py attn_fp16_d128_m16 NAME.sass.csv.gz --warps 256 [--top 30] [--nvdisasm PATH]

--warps: the launch's warps (CTAs x threads / 32), to print per-warp counts. The profiled
launch must be of the kernel source in this checkout (git worktree the profiled commit).
"""
import argparse
import collections
import csv
import gzip
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_loop  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", help="instantiation file name without .cu, e.g. attn_fp16_d128_m16")
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output (optionally .gz)")
    ap.add_argument("--warps", type=float, required=True, help="warps of the profiled launch")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--nvdisasm", default=os.environ.get("NVDISASM") or shutil.which("nvdisasm"))
    a = ap.parse_args()
    if not a.nvdisasm:
        sys.exit("sass_profile: nvdisasm not found (see scripts/sass_loop.py)")
    lines, usage = sass_loop.disassemble(a.kernel, a.nvdisasm)
    insts, labels = sass_loop.parse(lines)
    loop = sass_loop.find_loop(insts, labels)
    opener = gzip.open if a.csv.endswith(".gz") else open
    rows = list(csv.reader(opener(a.csv, "rt", errors="replace")))
    head = next(i for i, r in enumerate(rows) if "Instructions Executed" in r)
    h = rows[head]
    ie, ist = h.index("Instructions Executed"), h.index("Warp Stall Sampling (All Samples)")
    data = []
    for r in rows[head + 1:]:
        if not r or not r[0].startswith("0x"):
            continue
        text = r[1].split()
        op = text[1] if text and text[0].startswith("@") else (text[0] if text else "?")
        data.append((int(r[0], 16), op, float(r[ie] or 0), float(r[ist] or 0)))
    base = data[0][0]
    local = {addr: (op, f"{s[0]}:{s[1]}" if s else None) for addr, op, s, _ in insts}
    same = sum(local.get(addr - base, ("?",))[0] == op for addr, op, _, _ in data)
    print(f"{a.kernel}: {usage[0] if usage else ''}")
    print(f"opcodes matching the local disassembly: {same}/{len(data)}"
          + ("" if same == len(data) else "  (not the same build: the per-line numbers below are not reliable)"))
    phase, per_line, stalls = collections.Counter(), collections.Counter(), collections.Counter()
    for addr, _, ex, st in data:
        off = addr - base
        phase["before the K/V loop" if off < loop[0] else "K/V loop" if off <= loop[1] else "after it"] += ex
        line = local.get(off, (None, "?"))[1] or "?"
        per_line[line] += ex
        stalls[line] += st
    total, samples = sum(per_line.values()), max(sum(stalls.values()), 1)
    print(f"instructions executed per warp: {total / a.warps:.0f} ("
          + ", ".join(f"{k} {v / a.warps:.0f}" for k, v in phase.items()) + ")")
    print(f"per source line (instructions per warp, share of all, share of the {samples:.0f} stall samples):")
    for line, ex in per_line.most_common(a.top):
        print(f"  {ex / a.warps:7.0f}  {100 * ex / total:5.1f} %  {100 * stalls[line] / samples:5.1f} %  {line}")


if __name__ == "__main__":
    main()
