"""run()'s Python overhead: host time per call of TreeAttention.run() against the
bound call (TreeAttention.bind: tensors checked once) and the C++ entry with
everything prepared (the bound run's extension object called directly: the C++
run plus one nanobind call, no Python layer, no checks), on a tiny plan so the
C++ part is small. PyTorch tensors, CPU or CUDA; medians of many timeit rounds.

    PYTHONPATH=build/cpu/python python3 bench/runtime/run_overhead.py [--device cpu|cuda] [--rounds 200] [--number N] [--json]

"overhead" is run() minus the C++ entry: what the Python layer and the
binding's checks cost per call. On CUDA each call also enqueues the launches
(asynchronous: five for this runtime); the queue is drained between rounds,
and a round is 40 calls, 200 launches, so that it never fills the launch
queue (~1000 entries): a full queue blocks the host on the GPU, which then
times the GPU, not the call.
"""

import argparse
import json
import statistics
import timeit

import numpy as np
import torch

import treeattn


def setup(device):
    """A planned TreeAttention and its tensors: on the CPU the smallest plan (one
    head, one token: the C++ run is ~1 us), on CUDA bench_runtime.py's shapes
    (one 16-token node)."""
    H, HKV, D, PAGE, tokens = (1, 1, 64, 1, 1) if device == "cpu" else (32, 8, 128, 16, 16)
    pages = 1
    dt = torch.float16 if device == "cpu" else torch.bfloat16
    attn = treeattn.TreeAttention(H, HKV, D, PAGE, pages, dtype=dt, device=device, max_queries=4, max_nodes=4,
                                  max_page_refs=16, cpu_threads=1)
    attn.plan_tree(parents=np.array([-1], np.int32), num_tokens=np.array([tokens], np.int32),
                   page_offsets=np.array([0, 1], np.int32), page_ids=np.array([0], np.int32),
                   query_nodes=np.array([0], np.int32))
    q = torch.randn(1, H, D, dtype=dt, device=device)
    k = torch.randn(pages, PAGE, HKV, D, dtype=dt, device=device)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    return attn, q, k, v, out


def per_call_us(fn, rounds, number, sync):
    fn()
    sync()
    times = []
    for _ in range(rounds):
        times.append(timeit.timeit(fn, number=number) / number * 1e6)
        sync()
    return statistics.median(times)


def measure(device="cpu", rounds=200, number=None):
    """Median host microseconds per call of each case, and the overheads. On CUDA
    a round is 40 calls (the launch queue must not fill: then the host waits
    for the GPU), on the CPU 2000."""
    number = number or (2000 if device == "cpu" else 40)
    attn, q, k, v, out = setup(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    bound = attn.bind(q, k, v, out)
    stream = attn._stream(None)
    cpp = bound._impl
    lse = torch.empty(1, attn.num_qo_heads, dtype=torch.float32, device=device)
    cases = {
        "run(q, k, v, out)": lambda: attn.run(q, k, v, out),
        "run(q, k, v, out=out)": lambda: attn.run(q, k, v, out=out),
        "run(q, k, v, out, lse=lse)": lambda: attn.run(q, k, v, out, lse=lse),
        "bound()": bound,
        "C++ entry": lambda: cpp(stream),
    }
    # Interleave the cases round by round so drifts of the machine hit all alike,
    # each round starting at the next case so that no case always comes first
    # (at ff86946 on the H100 host one run read the same call 22.6 us as
    # run(q, k, v, out), measured first, and 19.1 us as run(q, k, v, out=out)).
    res = {name: [] for name in cases}
    names = list(cases)
    for r in range(max(1, rounds // 10)):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            res[name].append(per_call_us(cases[name], 10, number, sync))
    res = {name: statistics.median(t) for name, t in res.items()}
    c = res["C++ entry"]
    return dict(device=device, torch=torch.__version__, rounds=rounds, number=number, us=res, overhead_us=res["run(q, k, v, out)"] - c,
                overhead_kw_us=res["run(q, k, v, out=out)"] - c, overhead_lse_us=res["run(q, k, v, out, lse=lse)"] - c,
                bound_overhead_us=res["bound()"] - c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() and treeattn.cuda_built else "cpu")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--number", type=int, help="calls per round (default: 2000 on the CPU, 40 on CUDA)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure(a.device, a.rounds, a.number)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"device {a.device}; torch {r['torch']}; per call, median of {r['rounds']} rounds of {r['number']}")
    for name, us in r["us"].items():
        print(f"  {name:28s} {us:7.2f} us")
    print(f"overhead of run() over the C++ entry: {r['overhead_us']:.2f} us (out= keyword {r['overhead_kw_us']:.2f}, "
          f"with lse {r['overhead_lse_us']:.2f}); bound() {r['bound_overhead_us']:.2f} us")


if __name__ == "__main__":
    main()
