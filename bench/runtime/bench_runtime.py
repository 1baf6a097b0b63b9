"""The runtime benchmark of the Python package (one GPU, CUDA events, medians):

1. plan() from Python vs the C++ runtime's plan step (Google Benchmark,
   treeattn_planning_bench --benchmark_filter=runtime) on the serving-like
   random tree of 1000 nodes / 256 queries the planning benchmark uses;
2. run() host time per call from Python (plain and bound) vs C++ (the
   binding's overhead), eager; and run_overhead.py's measurement: run() against
   the extension's entry called with everything prepared, on the same host;
3. one decode step's attention (32 layers, each its own pool, so L2 holds
   nothing from the layer before) replayed as a CUDA graph vs launched eagerly,
   for "auto" and "per-query" on a few-shot tree, a two-level tree and
   independent sequences, with the unique-KV floor at the measured bandwidth.

    python3 bench/runtime/bench_runtime.py --build build/device [--out results.json]
    python3 bench/runtime/bench_runtime.py --device cpu --build build/cpu   # 1. and run_overhead only

Both plan() measurements also run as decode steps (every sequence a token
longer a step: the runtime extends the last plan) and, for block tables, on
256 sequences sharing a 4000-token prompt.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import treeattn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_overhead  # noqa: E402

H, HKV, D, PAGE, LAYERS = 32, 8, 128, 16, 32
DT = torch.bfloat16


def serving_tree(nodes, queries, seed=42):
    """Internal nodes of 16..512 tokens as a random recursive tree, then up to 256
    leaves of 1..256 tokens under random internal nodes, queries round-robin over
    the leaves (the C++ planning benchmark's tree, regenerated here)."""
    rng = np.random.default_rng(seed)
    leaves = min(queries, nodes - max(1, nodes // 4))
    internal = nodes - leaves
    parents = [-1] + [int(rng.integers(0, v)) for v in range(1, internal)]
    parents += [int(rng.integers(0, internal)) for _ in range(leaves)]
    tokens = [int(rng.integers(16, 513)) for _ in range(internal)] + [int(rng.integers(1, 257)) for _ in range(leaves)]
    return tree_arrays(parents, tokens, [internal + q % leaves for q in range(queries)], seed)


def tree_arrays(parents, tokens, query_nodes, seed=0):
    rng = np.random.default_rng(seed + 1)
    counts = [(t + PAGE - 1) // PAGE for t in tokens]
    perm = rng.permutation(sum(counts)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return dict(parents=np.array(parents, np.int32), num_tokens=np.array(tokens, np.int32), page_offsets=offsets,
                page_ids=perm, query_nodes=np.array(query_nodes, np.int32)), int(sum(counts))


def decode_steps(arrays, pages, steps=128):
    """The tree's arrays for `steps` decode steps: each query's node one token longer a step, a new page (from
    beyond the tree's) when its last fills. Returns the steps and the pages they use."""
    tokens = arrays["num_tokens"].astype(np.int64).copy()
    node_pages = [list(arrays["page_ids"][a:b]) for a, b in zip(arrays["page_offsets"][:-1], arrays["page_offsets"][1:])]
    grows = sorted(set(arrays["query_nodes"].tolist()))
    out = []
    for _ in range(steps):
        flat = np.array([p for ps in node_pages for p in ps], np.int32)
        offsets = np.concatenate([[0], np.cumsum([len(ps) for ps in node_pages])]).astype(np.int32)
        out.append(dict(parents=arrays["parents"], num_tokens=tokens.astype(np.int32), page_offsets=offsets,
                        page_ids=flat, query_nodes=arrays["query_nodes"]))
        tokens = tokens.copy()
        for v in grows:
            tokens[v] += 1
            if tokens[v] > len(node_pages[v]) * PAGE:
                node_pages[v].append(pages)
                pages += 1
    return out, pages


def block_table_steps(seqs=256, prompt=4000, steps=128, seed=7):
    """vLLM-style block tables of `seqs` sequences sharing a `prompt`-token prefix, each with its own tail
    of 100-400 tokens, for `steps` decode steps (a token a step, a page when the last fills), as
    runtime/block_tables in the planning benchmark. Returns the steps and the pages they use."""
    rng = np.random.default_rng(seed)
    shared = prompt // PAGE
    lens = prompt + 100 + rng.integers(0, 301, seqs)
    pages = [list(range(shared)) for _ in range(seqs)]
    nxt = shared
    for s in range(seqs):
        while len(pages[s]) * PAGE < lens[s]:
            pages[s].append(nxt)
            nxt += 1
    width = (prompt + 400 + steps + PAGE - 1) // PAGE + 1
    out = []
    for _ in range(steps):
        table = np.zeros((seqs, width), np.int32)
        for s in range(seqs):
            table[s, :len(pages[s])] = pages[s]
        out.append((table, lens.astype(np.int32).copy()))
        lens = lens + 1
        for s in range(seqs):
            if lens[s] > len(pages[s]) * PAGE:
                pages[s].append(nxt)
                nxt += 1
    return out, nxt


def fewshot(prompt=4000, branches=32, length=256):
    return tree_arrays([-1] + [0] * branches, [prompt] + [length] * branches, list(range(1, branches + 1)))


def two_level(system=1000, docs=8, doc=2000, questions=8, length=64):
    parents, tokens, queries = [-1], [system], []
    for d in range(docs):
        parents.append(0), tokens.append(doc)
        dnode = len(parents) - 1
        for _ in range(questions):
            parents.append(dnode), tokens.append(length), queries.append(len(parents) - 1)
    return tree_arrays(parents, tokens, queries)


def independent(seqs=64, length=2000):
    return tree_arrays([-1] * seqs, [length] * seqs, list(range(seqs)))


def median_host_us(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def events_ms(fn, reps=30):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def hbm_gbps():
    """Device-to-device copy bandwidth (bytes read + written), measured here."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = events_ms(lambda: y.copy_(x), reps=10)
    del x, y
    return 2 * (2 << 30) / (ms * 1e-3) / 1e9


def cpp_bench(build):
    """The C++ runtime's steps (Google Benchmark): the median of 5 repetitions,
    in microseconds. Not pinned to a core: pinned with its CUDA driver threads,
    the CUDA path has measured slower (docs/runtime.md)."""
    exe = os.path.join(build, "bench", "planning", "treeattn_planning_bench")
    if not os.path.exists(exe):
        return {}
    out = subprocess.run([exe, "--benchmark_filter=runtime|step/(pack|set_plan)|plan/(auto|node|per-query)/1000$",
                          "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true",
                          "--benchmark_format=json"],
                         capture_output=True, text=True, timeout=400)
    res = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            res[b["run_name"]] = b["real_time"]  # microseconds
    return res


def step_attention(planner, arrays, pages, bandwidth):
    """One decode step's attention: 32 layers' run() calls, graph and eager."""
    Q = len(arrays["query_nodes"])
    attn = treeattn.TreeAttention(H, HKV, D, PAGE, pages, dtype=DT, device="cuda", max_queries=max(Q, 256),
                                  max_nodes=4096, max_page_refs=max(pages, 65536), planner=planner)
    attn.plan_tree(**arrays)
    k = torch.randn(LAYERS, pages, PAGE, HKV, D, dtype=DT, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(LAYERS, Q, H, D, dtype=DT, device="cuda")
    out = torch.empty_like(q)

    def body():
        for l in range(LAYERS):
            attn.run(q[l], k[l], v[l], out=out[l])

    eager_ms = events_ms(body)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    graph_ms = events_ms(g.replay)
    # Check one layer against the reference softmax on a few queries.
    summ = attn.plan_summary()
    floor_ms = LAYERS * (summ["unique_kv_bytes"] + 2 * Q * H * D * 2) / (bandwidth * 1e9) * 1e3
    host_plan_us = median_host_us(lambda: attn.plan_tree(**arrays), 50)
    return dict(planner=planner, queries=Q, graph_ms=graph_ms, eager_ms=eager_ms, floor_ms=floor_ms,
                plan_us=host_plan_us, kv_ratio=summ["kv_ratio"], units=summ["units"], launches=attn.describe())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/device")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the plan() measurements on the CPU runtime and run_overhead.py on the CPU executor only")
    args = ap.parse_args()
    device = args.device
    if device == "cpu":
        import platform
        dev = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                   platform.processor())
    else:
        dev = torch.cuda.get_device_name()
    commit = os.environ.get("TREEATTN_COMMIT") or subprocess.run(
        ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True).stdout.strip() or "unknown"
    print(f"device {dev}; commit {commit}; torch {torch.__version__}")
    res = dict(device=dev, commit=commit, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               command=f"python3 bench/runtime/bench_runtime.py --device {device} --build {args.build}")

    # 1. plan() from Python on the 1000-node / 256-query tree.
    arrays, pages = serving_tree(1000, 256)
    # Planned afresh each call (the same tree: max_extension_tokens=0), then
    # decode steps (every query's node a token longer a step, 128 steps
    # cycled) where most calls extend the last plan.
    attn = treeattn.TreeAttention(H, HKV, D, PAGE, pages, dtype=DT, device=device, max_queries=256, max_nodes=4096,
                                  max_page_refs=pages, max_extension_tokens=0)
    attn.plan_tree(**arrays)
    py_plan = median_host_us(lambda: attn.plan_tree(**arrays), 300)
    lists = {k: v.tolist() for k, v in arrays.items()}
    py_plan_lists = median_host_us(lambda: attn.plan_tree(**lists), 100)
    steps, step_pages = decode_steps(arrays, pages)
    attn = treeattn.TreeAttention(H, HKV, D, PAGE, step_pages, dtype=DT, device=device, max_queries=256,
                                  max_nodes=4096, max_page_refs=step_pages)

    def per_step_us(plan, steps):  # a warm-up pass over the steps, then the mean of 4 passes
        for st in steps:
            plan(st)
        t0 = time.perf_counter()
        for _ in range(4):
            for st in steps:
                plan(st)
        return (time.perf_counter() - t0) * 1e6 / (4 * len(steps))

    py_decode = per_step_us(lambda st: attn.plan_tree(**st), steps)
    decode_stats = attn.plan_stats()
    bt_steps, bt_pages = block_table_steps()
    bt = {}
    for extend in (True, False):
        a = treeattn.TreeAttention(H, HKV, D, PAGE, bt_pages, dtype=DT, device=device, max_queries=256,
                                   max_nodes=4096, max_page_refs=bt_pages, max_extension_tokens=64 if extend else 0)
        bt["decode_step_us" if extend else "afresh_us"] = per_step_us(lambda st: a.plan_block_tables(*st), bt_steps)
        if extend:
            bt["decode_stats"] = a.plan_stats()
    if device == "cuda":
        torch.cuda.synchronize()
    cpp = cpp_bench(args.build)
    res["plan"] = dict(python_numpy_us=py_plan, python_lists_us=py_plan_lists, python_decode_step_us=py_decode,
                       decode_stats=decode_stats, python_block_tables=bt, cpp=cpp, pages=pages)
    p = res["plan"]
    print(f"plan() decode steps (1000 nodes / 256 queries, {p['decode_stats']}): Python {p['python_decode_step_us']:.1f} us "
          f"a step; C++ cpu {cpp.get('runtime/decode_steps/cpu/1000', float('nan')):.1f} us, cuda "
          f"{cpp.get('runtime/decode_steps/cuda/1000', float('nan')):.1f} us; the CUDA pack alone "
          f"{cpp.get('step/pack/cuda/1000', float('nan')):.1f} us, the CUDA half alone (pack, copy, launch) "
          f"{cpp.get('step/set_plan/cuda/1000', float('nan')):.1f} us")
    print(f"plan() afresh, 1000 nodes / 256 queries / {p['pages']} pages: Python (NumPy) {p['python_numpy_us']:.1f} us, "
          f"Python (lists) {p['python_lists_us']:.1f} us; C++ runtime step cpu "
          f"{cpp.get('runtime/plan_tree/cpu/1000', float('nan')):.1f} us, cuda "
          f"{cpp.get('runtime/plan_tree/cuda/1000', float('nan')):.1f} us (a changing tree, extension on: cpu "
          f"{cpp.get('runtime/plan_tree_changing/cpu/1000', float('nan')):.1f} us, cuda "
          f"{cpp.get('runtime/plan_tree_changing/cuda/1000', float('nan')):.1f} us); planners alone: "
          + ", ".join(f"{n.split('/')[1]} {t:.1f} us" for n, t in cpp.items() if n.startswith("plan/")))
    print(f"plan_block_tables (256 sequences, a 4000-token prompt shared): Python decode steps {bt['decode_step_us']:.1f} us "
          f"a step ({bt['decode_stats']}), afresh {bt['afresh_us']:.1f} us; C++ cpu "
          f"{cpp.get('runtime/block_tables/cpu/decode_steps', float('nan')):.1f} / "
          f"{cpp.get('runtime/block_tables/cpu/afresh', float('nan')):.1f} us", flush=True)
    print("plan_tree_queries (speculative decoding, a fresh plan a step; requests x drafts): C++ cpu "
          + ", ".join(f"{n.rsplit('/', 1)[1]} {t:.1f} us" for n, t in cpp.items() if n.startswith("runtime/tree_queries/")),
          flush=True)
    if device == "cpu":
        res["run_overhead"] = ro = run_overhead.measure("cpu")
        print(f"run() overhead over the extension's entry (CPU executor): {ro['overhead_us']:.2f} us")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        return

    # 2. run() host time per call, Python vs C++.
    small, spages = tree_arrays([-1], [16], [0])
    attn = treeattn.TreeAttention(H, HKV, D, PAGE, spages, dtype=DT, device="cuda")
    attn.plan_tree(**small)
    q = torch.randn(1, H, D, dtype=DT, device="cuda")
    k = torch.randn(spages, PAGE, HKV, D, dtype=DT, device="cuda")
    out = torch.empty_like(q)
    for _ in range(100):
        attn.run(q, k, k, out=out)
    torch.cuda.synchronize()
    # 40 calls (200 launches) between syncs: a full launch queue would time the GPU (run_overhead.py)
    per_call = []
    for _ in range(100):
        t0 = time.perf_counter()
        for _ in range(40):
            attn.run(q, k, k, out=out)
        per_call.append((time.perf_counter() - t0) * 1e6 / 40)
        torch.cuda.synchronize()
    bound = attn.bind(q, k, k, out)
    bound_call = []
    for _ in range(100):
        t0 = time.perf_counter()
        for _ in range(40):
            bound()
        bound_call.append((time.perf_counter() - t0) * 1e6 / 40)
        torch.cuda.synchronize()
    res["run_host"] = dict(python_us=statistics.median(per_call), bound_us=statistics.median(bound_call),
                           cpp_us=cpp.get("runtime/run/cuda"))
    res["run_overhead"] = run_overhead.measure("cuda")

    # 3. Decode-step attention, graph vs eager, auto vs per-query.
    bw = hbm_gbps()
    res["hbm_gbps"] = bw
    res["steps"] = []
    for name, (arr, pg) in [("fewshot 4000 x 32 branches of 256", fewshot()),
                            ("two-level 1000 -> 8 docs of 2000 -> 8 questions of 64", two_level()),
                            ("independent 64 x 2000", independent())]:
        for planner in ("auto", "per-query"):
            r = step_attention(planner, arr, pg, bw)
            r["tree"] = name
            res["steps"].append(r)
            print(f"  {name}: {planner}: graph {r['graph_ms']:.3f} ms, eager {r['eager_ms']:.3f} ms, "
                  f"floor {r['floor_ms']:.3f} ms; {r['launches']}", flush=True)
            torch.cuda.empty_cache()

    print(f"\nHBM {bw:.0f} GB/s (copy, read + write)")
    rh = res["run_host"]
    cpp_us = rh["cpp_us"] if rh["cpp_us"] is not None else float("nan")
    print(f"run() host time per call: Python {rh['python_us']:.2f} us, bound (TreeAttention.bind) "
          f"{rh['bound_us']:.2f} us, C++ {cpp_us:.2f} us; overhead {rh['python_us'] - cpp_us:.2f} us "
          f"(bound {rh['bound_us'] - cpp_us:.2f} us)")
    ro = res["run_overhead"]
    print(f"run() overhead over the extension's entry (run_overhead.py, {ro['rounds']} rounds of {ro['number']}): "
          f"{ro['overhead_us']:.2f} us, with lse {ro['overhead_lse_us']:.2f} us, bound {ro['bound_overhead_us']:.2f} us; "
          + ", ".join(f"{name} {us:.2f} us" for name, us in ro["us"].items()))
    print("\n| tree | planner | graph ms (32 layers) | eager ms | floor ms | graph / floor | per-query / auto (graph) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for i in range(0, len(res["steps"]), 2):
        a, b = res["steps"][i], res["steps"][i + 1]
        for r in (a, b):
            print(f"| {r['tree']} | {r['planner']} | {r['graph_ms']:.3f} | {r['eager_ms']:.3f} | {r['floor_ms']:.3f} | "
                  f"{r['graph_ms'] / r['floor_ms']:.2f} | {b['graph_ms'] / a['graph_ms']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
