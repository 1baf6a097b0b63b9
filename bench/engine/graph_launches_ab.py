"""Engine TPOT with CUDA graphs per attention launch set (the engine's default: run_program plans
the first step and captures the graph of its plan's launches) against one every-launch graph per
bucket (GraphRunner.prepare before the run, so that graph serves every step). Random weights of the
model's shapes, graphs on, planner auto; variants alternate, a fresh engine per run; prints each
run's median TPOT and the graphs it captured, then per program min-over-rounds ratios.

    PYTHONPATH=build/device/python:python python3 bench/engine/graph_launches_ab.py
"""
import argparse

import torch

from treeattn.engine import build_engine, load_model, make_program, run_program
from treeattn.engine.__main__ import pages_needed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="random:llama3-8b")
    p.add_argument("--programs", default="shared:prompt=4000,branches=64,question=16,gen=64;"
                                         "shared:prompt=1000,branches=16,question=8,gen=64")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    model = load_model(args.model, "cuda", "bf16")
    rows = []
    for spec in args.programs.split(";"):
        for rnd in range(args.rounds):
            for variant in ("per-set", "every"):
                program = make_program(spec, model.cfg.vocab_size)
                batch = len(program.prompts) * program.samples
                engine = build_engine(model, "auto", "auto", 16, pages_needed(program, 16), max_batch=batch,
                                      graphs=True)
                if variant == "every":
                    engine.graphs.prepare(batch)
                with torch.no_grad():
                    s = run_program(engine, program).summary()
                keys = sorted(engine.graphs.graphs)
                print(f"{spec} round {rnd} {variant:8s}: TPOT median {s['tpot_ms_median']:.3f} ms, "
                      f"p90 {s['tpot_ms_p90']:.3f}, graphs {[(b, hex(l)) for b, l in keys]}", flush=True)
                rows.append((spec, variant, s["tpot_ms_median"]))
                del engine
                torch.cuda.empty_cache()
    for spec in dict.fromkeys(r[0] for r in rows):
        a = min(t for s, v, t in rows if s == spec and v == "every")
        b = min(t for s, v, t in rows if s == spec and v == "per-set")
        print(f"{spec}: every-launch {a:.3f} ms, per launch set {b:.3f} ms, ratio {b / a:.4f}")


if __name__ == "__main__":
    main()
