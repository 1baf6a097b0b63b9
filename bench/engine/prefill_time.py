"""Prefill time of the engine's add(): a prompt that extends a cached 4000-token prefix by 16
tokens (a shared-prompt branch's question) and a fresh 2000-token prompt; median of 6 after
warm-up (compiled ops, cuBLAS, allocator). Llama-3-8B shapes, random weights, bf16.

    python3 bench/engine/prefill_time.py
"""
import argparse
import statistics
import time

import torch

from treeattn.engine import build_engine, load_model
from treeattn.engine.ops import choose_ops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random:llama3-8b")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--reps", type=int, default=6)
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    model = load_model(args.model, dev, "bf16")
    model.use_ops(choose_ops(args.compile, dev))
    engine = build_engine(model, "auto", "auto", 16, 2000, max_batch=64)
    gen = torch.Generator().manual_seed(0)
    rand = lambda n: torch.randint(0, model.cfg.vocab_size, (n,), generator=gen).tolist()
    prompt = rand(4000)
    for i in range(3):   # warm-up: several lengths, so the compiled ops go dynamic
        engine.add(prompt + rand(16 + i))
        engine.add(rand(1000 + i))
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, {args.model} bf16, compiled ops {model.ops.compiled}")
    for label, make in (("4000 cached + 16 new", lambda: prompt + rand(16)),
                        ("2000 new", lambda: rand(2000))):
        times = []
        for _ in range(args.reps):
            tokens = make()
            started = time.perf_counter()
            _, logits = engine.add(tokens)
            logits.max().item()
            times.append(time.perf_counter() - started)
        print(f"prefill add({label}) median {statistics.median(times) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
