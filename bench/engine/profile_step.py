"""Where a decode step's time goes: one program on the engine (graphs on), then
  - the step as the engine times it (host to host, tokens read back),
  - the captured graph's replay alone (CUDA events, same plan, median of --reps),
  - the replay's kernels (torch.profiler over --reps replays): count and time per category
    (GEMM, treeattn attention, KV write, norms / RoPE / activations and other elementwise),
  - the floor: weights read by a step over the bandwidth measured here.

    python3 bench/engine/profile_step.py --program shared:prompt=4000,branches=64,gen=32
"""
import argparse
import collections
import json
import statistics
import sys
import time

import torch

from treeattn.engine import build_engine, load_model, make_program, run_program
from treeattn.engine.__main__ import pages_needed
from treeattn.engine.ops import choose_ops

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from engine_bench import commit, measure_bandwidth, weights_read_bytes  # noqa: E402

CATEGORIES = [   # first match wins; lower-case substrings of the kernel name
    ("gemm", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas")),
    ("attention", ("treeattn", "attn_kernel", "merge_kernel", "attention")),
    ("kv-write", ("index_copy", "indexcopy", "index_put")),
    ("reduce", ("reduce",)),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "cat", "copy")),
]


def category(name):
    low = name.lower()
    return next((c for c, keys in CATEGORIES if any(k in low for k in keys)), "other")


def replay_ms(graph, reps):
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernel_table(graph, reps):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])   # category -> [count, us]
    names = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        us = e.device_time if hasattr(e, "device_time") else e.cuda_time
        c = category(e.name)
        per[c][0] += 1
        per[c][1] += us
        names[e.name[:90]][0] += 1
        names[e.name[:90]][1] += us
    per = {c: dict(kernels=n / reps, us=t / reps) for c, (n, t) in per.items()}
    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:25]
    return per, [dict(name=n, kernels=k / reps, us=t / reps) for n, (k, t) in top]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random:llama3-8b")
    p.add_argument("--program", default="shared:prompt=4000,branches=64,gen=32")
    p.add_argument("--attentions", default="auto,per-query")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--out")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    model = load_model(args.model, device, "bf16")
    model.use_ops(choose_ops(args.compile, device))
    bandwidth = measure_bandwidth(device, 1 << 30)
    weights = weights_read_bytes(model)
    out = dict(model=args.model, program=args.program, compiled_ops=model.ops.compiled, device=torch.cuda.get_device_name(),
               date=time.strftime("%Y-%m-%d"), commit=commit(),
               command=" ".join(["python3"] + sys.argv), bandwidth_gbs=bandwidth / 1e9,
               weights_floor_ms=weights / bandwidth * 1e3, rows=[])
    print(f"bandwidth {bandwidth / 1e9:.0f} GB/s, weights {weights / 1e9:.2f} GB, "
          f"weights floor {weights / bandwidth * 1e3:.2f} ms", flush=True)
    for attention in args.attentions.split(","):
        program = make_program(args.program, model.cfg.vocab_size)
        num_pages = pages_needed(program, args.page_size)
        batch = len(program.prompts) * program.samples
        engine = build_engine(model, attention, "auto", args.page_size, num_pages,
                              max_batch=batch, graphs=True)
        result = run_program(engine, program, steps=args.steps)
        graph = engine.graphs.graphs[engine.graphs.graph_key(engine.graphs.bucket(batch))]   # the last step's
        row = dict(attention=attention, batch=batch,
                   tpot_ms=statistics.median(result.step_seconds) * 1e3,
                   replay_ms=replay_ms(graph, args.reps))
        row["categories"], row["top_kernels"] = kernel_table(graph, args.reps)
        row["kernels"] = sum(c["kernels"] for c in row["categories"].values())
        row["kernel_ms"] = sum(c["us"] for c in row["categories"].values()) / 1e3
        out["rows"].append(row)
        print(f"\n{attention}: TPOT {row['tpot_ms']:.2f} ms, graph replay {row['replay_ms']:.2f} ms, "
              f"{row['kernels']:.0f} kernels, {row['kernel_ms']:.2f} ms of kernel time")
        for c, v in sorted(row["categories"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"  {c:12s} {v['kernels']:6.0f} kernels {v['us'] / 1e3:7.3f} ms")
        for k in row["top_kernels"][:12]:
            print(f"    {k['us'] / 1e3:7.3f} ms {k['kernels']:5.0f}x {k['name']}")
        del engine, result, graph
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
