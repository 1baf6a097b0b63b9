"""Speculative decoding with token trees on the engine (issue 19, section 2), in one process
on one GPU: 8 requests sharing a 4000-token prompt (16-token questions), Llama-3-8B shapes
with random weights (bf16), --attention auto and per-query. Per attention:

- plain decode of the 8 requests: step time (median; CUDA graphs on, and eager) and its
  attention time (the step's planned run()s);
- per draft tree (the recorded Medusa trees of 32 and 64 tokens: 31 / 63 drafts + the pending
  token, and 16x16: 16 chains of 16 = 256 drafts + the pending token), every topology filled
  (fill=1: a filler token where n-gram lookup finds no candidate), so each step verifies
  8 x (1 + drafts) queries whatever is accepted: the verification step's time (median; eager,
  no CUDA graph), its attention time, and the acceptance-independent comparison with plain
  decoding: `break_even_tokens`, the tokens a request must gain per step (accepted drafts +
  the bonus token) for speculative decoding to match plain decode's tokens/s (eager verify
  step / graph decode step). The tokens/s measured with random weights (almost nothing
  accepted) is reported as well.

    python3 bench/engine/spec_bench.py --out spec_bench.json
    # CPU smoke (seconds): --model random:tiny --device cpu --prompt 40 --steps 2 \\
    #     --trees 4x4,APPS_tree_size32.json
"""
import argparse
import dataclasses
import datetime
import json
import os
import shlex
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_bench import commit, device_and_name, free_memory, sync  # noqa: E402

from treeattn.engine import build_engine, load_model, run_program  # noqa: E402
from treeattn.engine.drafting import default_workloads, load_topology  # noqa: E402
from treeattn.engine.ops import choose_ops  # noqa: E402
from treeattn.engine.speculative import (parse_spec_program, run_speculative,  # noqa: E402
                                         spec_pages_needed)


def median_ms(seconds):
    return statistics.median(seconds) * 1e3 if seconds else None


def release(engine, seqs):
    for s in seqs:
        engine.release(s, publish=False)
    engine.cache.check()


def plain_decode(engine, spec, args):
    """Plain decode steps of the spec's requests: (step ms median, attention ms median)."""
    result = run_program(engine, spec.program, steps=args.steps * 4, time_attention=True)
    release(engine, result.seqs)
    return median_ms(result.step_seconds), median_ms(result.attention_seconds)


def run_attention(model, args, attention):
    """The rows of one attention: per mode (CUDA graphs on, then off; off only on the CPU)
    plain decode, then one row per draft tree, on one engine."""
    device = model.model.embed_tokens.weight.device
    base = parse_spec_program(f"spec:prompt={args.prompt},requests={args.requests},"
                              f"question={args.question},gen={args.gen},fill=1",
                              model.cfg.vocab_size, args.seed)
    trees = {t: _tree_path(t, args.workloads) for t in args.trees}
    sizes = {t: len(load_topology(path)) for t, path in trees.items()}
    max_draft = max(sizes.values())
    pages = spec_pages_needed(base, args.page_size, max_draft)
    rows = []
    for graphs in ([True, False] if device.type == "cuda" else [False]):
        mode = "graphs" if graphs else "eager"
        engine = build_engine(model, attention, args.cache, args.page_size, pages,
                              max_batch=args.requests, graphs=graphs,
                              max_drafts=args.requests * max_draft)
        try:
            plain, attn = plain_decode(engine, base, args)
            rows.append(dict(kind="plain", attention=attention, graphs=graphs,
                             step_ms_median=plain, attention_ms_median=attn,
                             tokens_per_s=args.requests / plain * 1e3))
            print(f"[{time.perf_counter() - T0:6.1f}s] {attention} {mode} plain decode: step "
                  f"{plain:.2f} ms, attention {attn:.2f} ms", flush=True)
            for tree, path in trees.items():
                rows.append(spec_row(engine, dataclasses.replace(base, tree=path), args,
                                     dict(kind="spec", attention=attention, graphs=graphs,
                                          tree=tree, drafts=sizes[tree],
                                          queries=args.requests * (1 + sizes[tree])), plain))
                print(f"[{time.perf_counter() - T0:6.1f}s] {attention} {mode} {tree}: " + ", ".join(
                    f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in rows[-1].items() if k not in ("kind", "attention", "tree")),
                    flush=True)
        finally:
            del engine
            free_memory(device)
    return rows


def spec_row(engine, spec, args, row, plain_ms):
    """Verification steps of one tree (the first, which may capture a CUDA graph, is left
    out of the medians by running one step more)."""
    try:
        result = run_speculative(engine, spec, steps=args.steps + 1, time_attention=True)
        release(engine, result.seqs)
        summary = result.summary()
        verify = median_ms(result.verify_seconds[1:])
        row.update(verify_ms_median=verify,
                   verify_attention_ms_median=median_ms(result.attention_seconds[1:]),
                   step_ms_median=median_ms(result.step_seconds[1:]),
                   drafts_per_request_step=summary["drafts_per_request_step"],
                   tokens_per_request_step=summary["tokens_per_request_step"],
                   tokens_per_s_measured=summary["tokens_per_s"],
                   plain_step_ms=plain_ms,
                   break_even_tokens=verify / plain_ms)
    except Exception as e:   # noqa: BLE001 (report the case, keep the others)
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {e}"
    return row


def _tree_path(tree, workloads):
    """WxD as is; a file as given, else in the workloads folder."""
    if "x" in tree and not tree.endswith(".json"):
        return tree
    if os.path.exists(tree) or not workloads:
        return tree
    return os.path.join(workloads, tree)


def table(rows):
    """Per tree and mode: verify step and its attention, auto vs per-query; break-even."""
    spec = [r for r in rows if r["kind"] == "spec" and "error" not in r]
    by = {(r["tree"], r["graphs"], r["attention"]): r for r in spec}
    lines = [f"{'tree':>24} {'graphs':>6} {'queries':>7} {'attention':>9} {'verify ms':>9} "
             f"{'attn ms':>8} {'break-even':>10}"]
    for (tree, graphs, attention), r in by.items():
        lines.append(f"{tree:>24} {'on' if graphs else 'off':>6} {r['queries']:>7} {attention:>9} "
                     f"{r['verify_ms_median']:>9.2f} {r['verify_attention_ms_median']:>8.3f} "
                     f"{r['break_even_tokens']:>10.2f}")
    for tree, graphs in dict.fromkeys(k[:2] for k in by):
        a, p = by.get((tree, graphs, "auto")), by.get((tree, graphs, "per-query"))
        if a and p:
            attention = p["verify_attention_ms_median"] / a["verify_attention_ms_median"]
            step = p["verify_ms_median"] / a["verify_ms_median"]
            lines.append(f"{tree}, graphs {'on' if graphs else 'off'}: verification attention "
                         f"per-query / auto = {attention:.2f}x, verify step {step:.2f}x")
    for r in rows:
        if r["kind"] == "plain":
            lines.append(f"plain decode ({r['attention']}, graphs {'on' if r['graphs'] else 'off'}): "
                         f"step {r['step_ms_median']:.2f} ms, attention {r['attention_ms_median']:.3f} ms")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--attentions", default="auto,per-query")
    p.add_argument("--trees", default="APPS_tree_size32.json,APPS_tree_size64.json,16x16",
                   help="Medusa topology files (looked up in --workloads too) or WxD")
    p.add_argument("--workloads", default=default_workloads(),
                   help="where topology files are looked up (default: $TREEATTN_WORKLOADS, "
                        "else data/workloads)")
    p.add_argument("--prompt", type=int, default=4000)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--question", type=int, default=16)
    p.add_argument("--gen", type=int, default=1024,
                   help="tokens per request: more than the steps generate (at most 1 + the "
                        "tree's depth per step), so no draft is cut short")
    p.add_argument("--steps", type=int, default=8,
                   help="verification steps per tree (plain decode: 4x as many)")
    p.add_argument("--model", default="random:llama3-8b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--cache", default="auto", choices=["auto", "cpp", "py"])
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="torch.compile the model's elementwise ops (auto: on cuda with Triton)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.attentions = [a for a in args.attentions.split(",") if a]
    args.trees = [t for t in args.trees.split(",") if t]
    return args


T0 = time.perf_counter()


def main(argv=None):
    global T0
    T0 = time.perf_counter()
    args = parse_args(argv)
    device, name = device_and_name(args.device)
    command = ["python3", "bench/engine/spec_bench.py"] + (sys.argv[1:] if argv is None else list(argv))
    report = dict(device=name, date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"),
                  commit=commit(), command=" ".join(shlex.quote(a) for a in command),
                  args=vars(args), torch=torch.__version__, rows=[])

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)

    model = load_model(args.model, device=device, dtype=args.dtype, seed=args.seed)
    model.use_ops(choose_ops(args.compile, device))
    report["compiled_ops"] = model.ops.compiled
    sync(device)
    print(f"[{time.perf_counter() - T0:6.1f}s] {name}, {args.model} {args.dtype}, compiled ops "
          f"{model.ops.compiled}, commit {report['commit']}", flush=True)
    for attention in args.attentions:
        try:
            report["rows"] += run_attention(model, args, attention)
        except Exception as e:   # noqa: BLE001
            traceback.print_exc()
            report["rows"].append(dict(kind="error", attention=attention,
                                       error=f"{type(e).__name__}: {e}"))
            free_memory(device)
        save()
    report["wall_s"] = time.perf_counter() - T0
    save()
    print()
    print(f"{name}, {args.model} {args.dtype}, {args.requests} requests x {args.prompt}-token "
          f"shared prompt, commit {report['commit']}; break-even = verify step / plain step "
          f"(tokens a request must gain per step)")
    print(table(report["rows"]))
    print(f"wall {report['wall_s']:.0f} s" + (f"; JSON: {args.out}" if args.out else ""))
    return 1 if any("error" in r for r in report["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
