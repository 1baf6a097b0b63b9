#!/usr/bin/env python3
"""Static instruction count of an attention kernel's K/V tile loop, without a GPU.

Compiles one instantiation file of src/exec/cuda/kernels/ for sm_90a (nvcc), disassembles
it (nvdisasm, e.g. from the PyPI wheel nvidia-cuda-nvdisasm: its nvidia/cu13/bin), finds the
K/V loop (the shortest backward branch that spans every HGMMA, or every HMMA for the
mma.sync tiles) and prints its instruction count, the instructions per source line of
the kernel (the largest first) and per opcode. What a change to the kernel adds or removes
per tile, before a device run measures it (ncu counts what executes; this counts what is
there, the cold masked-tile path included).

  scripts/sass_loop.py attn_fp16_d128_m128 [--top 25] [--nvdisasm PATH]
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def disassemble(name, nvdisasm):
    src = os.path.join(ROOT, "src/exec/cuda/kernels", name + ".cu")
    if not os.path.exists(src):
        sys.exit(f"sass_loop: no kernel file {src}")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        cmd = ["nvcc", "-O3", "-std=c++20", "-arch=sm_90a", "--expt-relaxed-constexpr", "-lineinfo",
               "-Xptxas=-v", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(ROOT, "src"),
               "-cubin", "-o", cubin, src]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit("sass_loop: nvcc failed:\n" + built.stderr)
        usage = [l.strip() for l in built.stderr.splitlines() if "registers" in l or "spill" in l]
        sass = subprocess.run([nvdisasm, "-c", "-g", cubin], capture_output=True, text=True, check=True).stdout
    return sass.splitlines(), usage


def parse(lines):
    """An `nvdisasm -c -g` listing as (instructions, labels): (address, opcode,
    (file, line) or None, text) per instruction, and each label's address."""
    at = re.compile(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")
    labels, insts = {}, []
    src, pending = None, []
    for l in lines:
        m = re.match(r"(\.L_x_\d+):", l)
        if m:
            pending.append(m.group(1))
            continue
        m = re.search(r'File "([^"]+)", line (\d+)', l)
        if m:
            src = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = at.match(l)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                labels[p] = addr
            pending = []
            insts.append((addr, m.group(2), src, l))
    return insts, labels


def find_loop(insts, labels):
    """(first, last) address of the K/V loop of parsed instructions: the shortest
    backward branch that spans every HGMMA (or every HMMA for the mma.sync tiles)."""
    mma = [i for i in insts if i[1].startswith("HGMMA")] or [i for i in insts if i[1].startswith("HMMA")]
    if not mma:
        sys.exit("sass_loop: no HGMMA or HMMA instruction found")
    first, last = mma[0][0], mma[-1][0]
    loop = None
    for addr, op, _, text in insts:
        m = re.search(r"BRA `\((\.L_x_\d+)\)", text)
        if m and op.startswith("BRA") and labels.get(m.group(1), 1 << 62) <= first and addr >= last:
            start = labels[m.group(1)]
            if loop is None or addr - start < loop[1] - loop[0]:
                loop = (start, addr)
    if loop is None:
        sys.exit("sass_loop: no backward branch spans the MMAs")
    return loop


def loop_counts(body):
    """(instructions, MMAs, local-memory loads and stores) of the loop's parsed
    instructions. Spills inside the loop are what the kernels' register caps are
    about: always counted, not left to the opcode list's top 20."""
    return (len(body), sum(op.startswith(("HGMMA", "HMMA")) for _, op, _, _ in body),
            sum(op.startswith(("LDL", "STL")) for _, op, _, _ in body))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", help="instantiation file name without .cu, e.g. attn_fp16_d128_m128")
    ap.add_argument("--top", type=int, default=25, help="source lines to list")
    ap.add_argument("--nvdisasm", default=os.environ.get("NVDISASM") or shutil.which("nvdisasm"))
    a = ap.parse_args()
    if not a.nvdisasm:
        sys.exit("sass_loop: nvdisasm not found: pip install nvidia-cuda-nvdisasm and pass --nvdisasm "
                 "<site-packages>/nvidia/cu13/bin/nvdisasm (or set NVDISASM)")
    lines, usage = disassemble(a.kernel, a.nvdisasm)
    insts, labels = parse(lines)
    loop = find_loop(insts, labels)
    body = [i for i in insts if loop[0] <= i[0] <= loop[1]]
    print(f"{a.kernel}: {'; '.join(usage)}")
    n, mma, local = loop_counts(body)
    print(f"K/V loop {loop[0]:#x}..{loop[1]:#x}: {n} instructions ({mma} MMA, {local} local-memory loads/stores)")
    per_line = collections.Counter(s for _, _, s, _ in body)
    print("instructions per source line:")
    for s, c in per_line.most_common(a.top):
        print(f"  {c:5d}  {s[0]}:{s[1]}" if s else f"  {c:5d}  (no line)")
    ops = collections.Counter(op.split(".")[0] for _, op, _, _ in body)
    print("per opcode: " + ", ".join(f"{o} {c}" for o, c in ops.most_common(20)))


if __name__ == "__main__":
    main()
