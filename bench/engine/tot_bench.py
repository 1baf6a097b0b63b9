"""The tree-of-thoughts benchmark of issue 19: the replay of each recorded ToT file
(data/workloads/docmergeToT.json, sorting128ToT.json) with its tasks batched in one engine
step (the forest of all their trees, planned as one), Llama-3-8B shapes with random weights
(bf16), CUDA graphs on, --attention auto and per-query on the same engine sizes. The
branching, lengths and pruning follow the recorded runs; the tokens are sampled from the
model (temperature 1); each root is random token ids of the recorded root length.

Per case: decode steps, mean and widest batch (decode queries), TPOT median / p90 (a step
is a whole iteration: forks, decode, sampling, releases), end-to-end seconds (prefill +
iterations), the attention share of a step (one step in --attention-every timed: its planned
run()s replayed outside the graph). Per file: per-query / auto for end-to-end time and for
TPOT (goal >= 1.5x end-to-end). Before a file's timed cases its first two steps (every
task's prefill) run once untimed, so that neither case pays the first pass over its prompt
lengths (compilation, tuning).

    python3 bench/engine/tot_bench.py --out results.json            # all tasks, 1000 steps
    # a replay longer than one command may run: one attention per command, then
    python3 bench/engine/tot_bench.py --combine auto.json per-query.json --out both.json
    # CPU smoke (seconds): --model random:tiny --device cpu --tasks 2 --scale 0.01
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

# the engine benchmark, in the same folder
from engine_bench import (add_engine_args, append_case, free_memory, open_report, speedups,
                          sync, warm_up)
from treeattn.engine import build_engine, load_model
from treeattn.engine.ops import choose_ops
from treeattn.engine.tot import make_tot_program, run_tot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOADS = os.path.join(ROOT, "data", "workloads")
FILES = ["docmergeToT.json", "sorting128ToT.json"]
GOAL = 1.5     # per-query / auto end-to-end time


def spec_of(path, args):
    spec = f"tot:file={path},scale={args.scale},temperature={args.temperature}"
    if args.tasks:
        spec += f",tasks={args.tasks}"
    if args.max_steps:
        spec += f",max_steps={args.max_steps}"
    return spec


@contextlib.contextmanager
def sized_engine(model, program, attention, args):
    """A fresh engine sized by the schedule (the pool for its peak, max_batch for its
    widest step), freed on exit. It is handed out in a list that is emptied on exit: the
    caller's `as` name then holds no engine, so its pool (up to ~96 GB for the sorting file)
    is gone before the next engine is made."""
    holder = [build_engine(model, attention, args.cache, args.page_size,
                           program.pages_needed(args.page_size), max_batch=program.max_batch,
                           graphs=args.graphs == "on")]
    try:
        yield holder
    finally:
        holder.clear()
        free_memory(model.model.embed_tokens.weight.device)


def run_case(model, name, spec, attention, args):
    """One file with one attention on its own sized engine."""
    program = make_tot_program(spec, model.cfg.vocab_size, seed=args.seed)
    num_pages = program.pages_needed(args.page_size)
    row = dict(file=name, spec=spec, attention=attention, tasks=len(program.prompts),
               num_pages=num_pages, max_batch=program.max_batch, page_size=args.page_size,
               graphs=args.graphs)
    log(f"{name} / {attention}: {row['tasks']} tasks, {program.num_steps} steps planned, "
        f"widest step {program.max_batch} queries, {num_pages} pages")
    with sized_engine(model, program, attention, args) as holder:
        result = run_tot(holder[0], program, seed=args.seed, time_attention=True,
                         attention_every=args.attention_every)
        row.update(result.summary())
        if result.step_seconds:
            row.update(decode_s=sum(result.step_seconds),
                       tpot_ms_mean=1e3 * statistics.mean(result.step_seconds))
        del result
    log("  " + line_of(row))
    return row


def warm_up_file(model, spec, args):
    """The replay's first two steps (every task's prefill) on a throwaway engine, untimed,
    before the timed cases of a file: its prompt lengths are what the prefill compiles and
    tunes for (seconds on the first pass), so neither timed case pays for that."""
    program = make_tot_program(spec, model.cfg.vocab_size, seed=args.seed)
    with sized_engine(model, program, args.attentions[0], args) as holder:
        started = time.perf_counter()
        run_tot(holder[0], program, seed=args.seed, max_steps=2)
        sync(model.model.embed_tokens.weight.device)
        log(f"  warm-up (prefill of every task, 2 steps, untimed): {time.perf_counter() - started:.2f} s")


def line_of(row):
    if "tpot_ms_median" not in row:
        return f"{row['file']} / {row['attention']}: {row.get('error', 'no decode steps')}"
    return (f"{row['file']} / {row['attention']}: {row['steps']} steps, mean batch "
            f"{row['mean_batch']:.0f} (widest {row['widest_batch']}), prefill "
            f"{row['prefill_s']:.2f} s, end-to-end {row['end_to_end_s']:.2f} s, TPOT "
            f"{row['tpot_ms_median']:.2f} ms (p90 {row['tpot_ms_p90']:.2f}), attention "
            f"{100 * row.get('attention_share', 0):.1f} %")


def ratios(rows):
    """file -> attention -> {end_to_end, tpot_median}: per-query's over this attention's."""
    end_to_end = speedups(rows, case="file", metric="end_to_end_s")
    tpot = speedups(rows, case="file")
    return {f: {a: dict(end_to_end=up, tpot_median=tpot[f][a]) for a, up in per.items()}
            for f, per in end_to_end.items()}


def table(rows, ups):
    lines = ["| file | attention | tasks | steps | mean batch | TPOT median (ms) | TPOT p90 (ms) "
             "| end-to-end (s) | attention share | per-query / auto: end-to-end, TPOT |",
             "|" + "---|" * 10]
    for r in rows:
        if "tpot_ms_median" not in r:
            lines.append(f"| {r['file']} | {r['attention']} | {r.get('error', 'no steps')} "
                         "| | | | | | | |")
            continue
        up = ups.get(r["file"], {}).get(r["attention"])
        cell = (f"{up['end_to_end']:.2f}x ({'met' if up['end_to_end'] >= GOAL else 'NOT met'}"
                f" >= {GOAL}x), {up['tpot_median']:.2f}x" if up else "")
        lines.append(f"| {r['file']} | {r['attention']} | {r['tasks']} | {r['steps']} "
                     f"| {r['mean_batch']:.0f} | {r['tpot_ms_median']:.2f} "
                     f"| {r['tpot_ms_p90']:.2f} | {r['end_to_end_s']:.2f} "
                     f"| {100 * r.get('attention_share', float('nan')):.1f} % | {cell} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--files", default=",".join(FILES),
                   help="comma-separated ToT files (names in data/workloads, or paths)")
    p.add_argument("--tasks", type=int, default=0, help="the first N tasks of a file (0: all)")
    p.add_argument("--max-steps", type=int, default=1000,
                   help="decode steps per case (0: the whole schedule)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the recorded lengths")
    p.add_argument("--attentions", default="auto,per-query")
    p.add_argument("--attention-every", type=int, default=20,
                   help="time the attention of one step in this many")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--combine", nargs="+", metavar="JSON",
                   help="no run: merge the rows of these result files (the same device, "
                        "files and options, one attention each) and compute the ratios")
    add_engine_args(p)
    args = p.parse_args(argv)
    args.files = [f for f in args.files.split(",") if f]
    args.attentions = [a for a in args.attentions.split(",") if a]
    if args.graphs is None:
        args.graphs = "on" if torch.device(args.device).type == "cuda" else "off"
    return args


T0 = time.perf_counter()


def log(text):
    print(f"[{time.perf_counter() - T0:6.1f}s] {text}", flush=True)


# args that must agree between combined parts (the attentions differ; out, names do not matter)
SAME_ARGS = ("tasks", "max_steps", "scale", "temperature", "model", "dtype", "graphs", "cache",
             "compile", "page_size", "seed")


def combine(paths, out):
    """One report from several (each run by its own command): rows concatenated, ratios and
    goal computed as main() does. ValueError when the parts differ in device or options, or
    repeat a (file, attention) case."""
    parts = []
    for path in paths:
        with open(path) as f:
            parts.append(json.load(f))
    first = parts[0]
    seen = set()
    for path, part in zip(paths, parts):
        if part["device"] != first["device"]:
            raise ValueError(f"--combine: {path} ran on {part['device']!r}, "
                             f"{paths[0]} on {first['device']!r}")
        for key in SAME_ARGS:
            if part["args"].get(key) != first["args"].get(key):
                raise ValueError(f"--combine: {path} has {key}={part['args'].get(key)!r}, "
                                 f"{paths[0]} {key}={first['args'].get(key)!r}")
        for r in part["rows"]:
            if (r["file"], r["attention"]) in seen:
                raise ValueError(f"--combine: {path} repeats {r['file']} / {r['attention']}")
            seen.add((r["file"], r["attention"]))
    rows = [r for part in parts for r in part["rows"]]
    ups = ratios(rows)
    report = dict(device=first["device"], date=max(p["date"] for p in parts),
                  commit=",".join(dict.fromkeys(p["commit"] for p in parts)),
                  command="python3 bench/engine/tot_bench.py --combine " + " ".join(paths),
                  parts=[dict(source=path, **{k: p.get(k) for k in
                                              ("date", "commit", "command", "torch", "wall_s")})
                         for path, p in zip(paths, parts)],
                  args=first["args"], rows=rows, ratios=ups,
                  goal={f: dict(min_end_to_end=GOAL, met=u["end_to_end"] >= GOAL)
                        for f, per in ups.items() for a, u in per.items() if a == "auto"})
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=2)
    print(f"{report['device']}, parts: " + "; ".join(
        f"{p['source']} ({p['commit']}, {p['date']})" for p in report["parts"]))
    print(table(rows, ups))
    return 1 if any("error" in r for r in rows) else 0


def main(argv=None):
    global T0
    T0 = time.perf_counter()
    args = parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    device, report, save = open_report(args, argv, "bench/engine/tot_bench.py", rows=[])
    name = report["device"]
    model = load_model(args.model, device=device, dtype=args.dtype, seed=args.seed)
    model.use_ops(choose_ops(args.compile, device))
    report["compiled_ops"] = model.ops.compiled
    warm_up(model, args)
    sync(device)
    log(f"{name}, commit {report['commit']}: {args.model} {args.dtype} loaded, compiled ops "
        f"{model.ops.compiled}")
    rows = report["rows"]
    for file in args.files:
        path = file if os.path.sep in file else os.path.join(WORKLOADS, file)
        label = os.path.basename(path)
        spec = spec_of(path, args)
        warm_up_file(model, spec, args)
        for attention in args.attentions:
            append_case(rows, lambda: run_case(model, label, spec, attention, args), device,
                        file=label, spec=spec, attention=attention)
            save()
    ups = ratios(rows)
    report["ratios"] = ups
    report["goal"] = {f: dict(min_end_to_end=GOAL, met=u["end_to_end"] >= GOAL)
                      for f, per in ups.items() for a, u in per.items() if a == "auto"}
    report["wall_s"] = time.perf_counter() - T0
    save()
    print()
    print(f"{name}, {args.model} {args.dtype}, graphs {args.graphs}, page size "
          f"{args.page_size}, max steps {args.max_steps or 'all'}, commit {report['commit']}")
    print(table(rows, ups))
    print(f"wall {report['wall_s']:.0f} s" + (f"; JSON: {args.out}" if args.out else ""))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
