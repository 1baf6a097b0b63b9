"""The engine benchmark of issue 18, in one process on one GPU: Llama-3-8B shapes with random
weights (bf16), CUDA graphs on, the same engine and pool size for both attentions:

    program       what                                                   auto speed-up target
    shared        one 4000-token prompt x 64 branches (16-token questions)        >= 2.0x
    two-level     1000-token system -> 8 documents of 2000 -> 8 questions each    >= 1.8x
    sample        16 samples (temperature 1) of one 2000-token prompt             >= 1.5x
    independent   64 independent 2000-token sequences                  within 3 % (>= 0.97x)

each generating 256 tokens per sequence (the first from the prefill, 255 decode steps), with
--attention auto and per-query. Per case: decode tokens/s, TPOT median / p90, the attention
share of a step (the engine's own measure: the step's planned run()s replayed outside the
graph), and step / floor, the floor of a step being the bytes it must read at least (weights
read by a step, i.e. all parameters but the embedding table, plus the unique KV of the step's
forest) over the HBM bandwidth measured here with a large device-to-device copy (bytes read +
written). Then the reference users know: transformers.generate with the same weights (a
LlamaForCausalLM of the same config, its default attention and cache, each branch its own
sequence) on the 16-sample program and on 8 branches of the shared prompt with 64 generated
tokens, next to the engine (auto) on exactly the same work.

    python3 bench/engine/engine_bench.py --out results.json
    # CPU smoke (seconds): --model random:tiny --device cpu --steps 2 --scale 0.01 \\
    #     --count-scale 0.125 --hf-reference off
"""
import argparse
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np
import torch

from treeattn.engine import build_engine, load_model, make_program, run_program
from treeattn.engine.__main__ import pages_needed
from treeattn.engine.ops import choose_ops

# name -> (kind, parameters, minimum auto speed-up: per-query TPOT / auto TPOT)
PROGRAMS = {
    "shared": ("shared", dict(prompt=4000, branches=64, question=16, gen=256), 2.0),
    "two-level": ("two-level", dict(system=1000, docs=8, doc=2000, questions=8, question=16,
                                    gen=256), 1.8),
    "sample": ("sample", dict(prompt=2000, n=16, gen=256), 1.5),
    "independent": ("independent", dict(seqs=64, prompt=2000, gen=256), 1 / 1.03),
}
# the transformers.generate reference: (label, base program, overrides)
HF_CASES = [("sample", "sample", {}),
            ("shared-8", "shared", dict(branches=8, gen=64))]
LENGTHS = {"prompt", "system", "doc"}                       # scaled by --scale
COUNTS = {"branches", "docs", "questions", "n", "seqs"}     # scaled by --count-scale


def spec_of(name, args, **overrides):
    kind, params, _ = PROGRAMS[name]
    params = dict(params, **overrides)
    for key, value in params.items():
        if key in LENGTHS:
            params[key] = max(1, round(value * args.scale))
        elif key in COUNTS:
            params[key] = max(1, round(value * args.count_scale))
    return kind + ":" + ",".join(f"{k}={v}" for k, v in params.items())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_bandwidth(device, nbytes, reps=10):
    """Bytes read + written per second by dst.copy_(src) of nbytes (median of reps)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    del src, dst
    free_memory(device)
    return 2 * nbytes / statistics.median(times)


def free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def weights_read_bytes(model):
    """Parameter bytes a decode step reads: all but the embedding table (a step gathers B
    of its rows), which counts when tied (the LM head reads all of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not model.cfg.tie_word_embeddings:
        w = model.model.embed_tokens.weight
        total -= w.numel() * w.element_size()
    return total


def warm_up(model, args):
    """Run two small programs of different lengths on a throwaway engine before any timed
    case: compiled ops compile for prefill and decode shapes (dynamic from the second shape
    on), so no case's prefill or first step pays for it."""
    for spec in ("shared:prompt=40,branches=3,question=5,gen=3",
                 "shared:prompt=72,branches=5,question=9,gen=3"):
        engine = build_engine(model, "auto", args.cache, args.page_size, 64, max_batch=8)
        run_program(engine, make_program(spec, model.cfg.vocab_size, seed=args.seed))
        del engine
    free_memory(model.model.embed_tokens.weight.device)


def kv_bytes_per_token(model):
    cfg = model.cfg
    w = model.model.embed_tokens.weight
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * w.element_size()


def ms(seconds):
    return [s * 1e3 for s in seconds]


def p90(values):
    v = sorted(values)
    return v[min(len(v) - 1, int(0.9 * len(v)))]


def run_case(model, name, spec, attention, args, bandwidth):
    """One program with one attention on a fresh engine; the engine (pool, graphs, plan
    buffers) is freed before returning. Returns the row of numbers."""
    device = model.model.embed_tokens.weight.device
    program = make_program(spec, model.cfg.vocab_size, seed=args.seed)
    num_pages = pages_needed(program, args.page_size)
    max_batch = len(program.prompts) * program.samples
    row = dict(program=name, spec=spec, attention=attention, num_pages=num_pages,
               page_size=args.page_size, graphs=args.graphs)
    print(f"[{time.perf_counter() - T0:6.1f}s] {name} / {attention}: {spec}, "
          f"{max_batch} sequences, {num_pages} pages", flush=True)
    engine = build_engine(model, attention, args.cache, args.page_size, num_pages,
                          max_batch=max_batch, graphs=args.graphs == "on")
    try:
        result = run_program(engine, program, seed=args.seed, steps=args.steps,
                             time_attention=True)
        row.update(result.summary())
        steps, batch = len(result.step_seconds), len(result.seqs)
        if steps:
            # the forest grows by one token per sequence a step: read its size after the
            # last step (pending tokens included) and count back
            ntok = engine.forest(result.seqs)[1]
            last = int(np.sum(ntok))
            unique = [last - (steps - i) * batch for i in range(steps)]
            floor = [(WEIGHTS + u * KV_TOKEN) / bandwidth for u in unique]
            row.update(
                unique_kv_tokens_first=unique[0], unique_kv_tokens_last=unique[-1],
                floor_ms_median=statistics.median(ms(floor)),
                step_over_floor=sum(result.step_seconds) / sum(floor),
                attention_ms_median=(statistics.median(ms(result.attention_seconds))
                                     if result.attention_seconds else None),
                tpot_ms_mean=sum(ms(result.step_seconds)) / steps)
        del result
    finally:
        del engine
        free_memory(device)
    print(f"[{time.perf_counter() - T0:6.1f}s]   " + line_of(row), flush=True)
    return row


def line_of(row):
    if "tpot_ms_median" not in row:
        return f"{row['program']} / {row['attention']}: no decode steps"
    return (f"{row['program']} / {row['attention']}: {row['steps']} steps x "
            f"{row['sequences']} seqs, prefill {row['prefill_s']:.2f} s, "
            f"{row['tokens_per_s']:.0f} tok/s, TPOT {row['tpot_ms_median']:.2f} ms "
            f"(p90 {row['tpot_ms_p90']:.2f}), attention {100 * row.get('attention_share', 0):.1f} %, "
            f"floor {row['floor_ms_median']:.2f} ms, step/floor {row['step_over_floor']:.2f}")


def speedups(rows, baseline="per-query", case="program", metric="tpot_ms_median"):
    """row[case] -> attention -> baseline's metric / the attention's (a time: TPOT median
    by default), for the rows that have the metric."""
    out = {}
    for r in rows:
        base = next((b for b in rows if b[case] == r[case]
                     and b["attention"] == baseline and metric in b), None)
        if base is not None and metric in r and r["attention"] != baseline:
            out.setdefault(r[case], {})[r["attention"]] = base[metric] / r[metric]
    return out


def table(rows, ups):
    head = ("| program | attention | tokens/s | TPOT median (ms) | TPOT p90 (ms) | attention share "
            "| step / floor | auto speed-up (target) |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        if "tpot_ms_median" not in r:
            lines.append(f"| {r['program']} | {r['attention']} | {r.get('error', 'no steps')} "
                         "| | | | | |")
            continue
        up = ups.get(r["program"], {}).get(r["attention"])
        target = PROGRAMS[r["program"]][2]
        cell = ""
        if up is not None:
            goal = (f">= {target:.1f}x" if target >= 1 else "within 3 %")
            cell = f"{up:.2f}x ({goal}: {'met' if up >= target else 'NOT met'})"
        lines.append(f"| {r['program']} | {r['attention']} | {r['tokens_per_s']:.0f} "
                     f"| {r['tpot_ms_median']:.2f} | {r['tpot_ms_p90']:.2f} "
                     f"| {100 * r.get('attention_share', float('nan')):.1f} % "
                     f"| {r['step_over_floor']:.2f} | {cell} |")
    return "\n".join(lines)


# -- transformers.generate reference ---------------------------------------------------------

def hf_model_like(model):
    """A transformers LlamaForCausalLM of the engine model's config, built on its device in
    its dtype (no CPU copy, init skipped where transformers allows), holding the same
    weights (copied: parameter names match one to one)."""
    import contextlib
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = model.cfg
    if cfg.model_type != "llama":
        raise ValueError(f"hf reference: only llama shapes, got {cfg.model_type}")
    w = model.model.embed_tokens.weight
    kwargs = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                  intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                  num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                  head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                  tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=131072)
    if cfg.rope_scaling:
        kwargs["rope_scaling"] = dict(cfg.rope_scaling)
    hf_cfg = LlamaConfig(**kwargs)
    no_init = contextlib.nullcontext
    for where in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            no_init = __import__(where, fromlist=["no_init_weights"]).no_init_weights
            break
        except (ImportError, AttributeError):
            pass
    default = torch.get_default_dtype()
    torch.set_default_dtype(w.dtype)
    try:
        with torch.device(w.device), no_init():
            hf = LlamaForCausalLM(hf_cfg)
    finally:
        torch.set_default_dtype(default)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("inv_freq")]
    if missing or unexpected:
        raise ValueError(f"hf reference: weights do not match: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")
    hf = hf.to(w.device).eval().requires_grad_(False)
    hf.generation_config.eos_token_id = None    # the engine has no stop token either
    hf.generation_config.pad_token_id = 0
    return hf


class StepClock:
    """A logits processor that stamps the time (after a synchronize) each time generate()
    has the logits of a forward: the first stamp ends the prefill, the gaps are decode steps."""

    def __init__(self, device):
        self.device, self.stamps = device, []

    def __call__(self, input_ids, scores):
        sync(self.device)
        self.stamps.append(time.perf_counter())
        return scores


def hf_generate(hf, program, steps, seed):
    from transformers import LogitsProcessorList
    device = hf.model.embed_tokens.weight.device
    prompts = [p for p in program.prompts for _ in range(program.samples)]
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("hf reference: prompts of one length only (no padding)")
    ids = torch.tensor(prompts, device=device)
    new = program.gen if steps is None else min(program.gen, steps + 1)
    s = program.sampling
    sampling = (dict(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
                if s.temperature > 0 else dict(do_sample=False))
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                  **sampling)
    with torch.no_grad():   # warm-up: kernels, cuBLAS handles, allocator
        hf.generate(ids[:1, :32], attention_mask=torch.ones_like(ids[:1, :32]),
                    max_new_tokens=2, do_sample=False)
    torch.manual_seed(seed)
    clock = StepClock(device)
    sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, logits_processor=LogitsProcessorList([clock]), **kwargs)
    sync(device)
    total = time.perf_counter() - started
    gaps = np.diff(clock.stamps).tolist()
    row = dict(batch=len(prompts), prompt_tokens=len(prompts[0]), new_tokens=new,
               generated=int(out.shape[1] - ids.shape[1]), decode_steps=len(gaps),
               sampling=sampling, attn_implementation=getattr(hf.config, "_attn_implementation", None),
               prefill_s=clock.stamps[0] - started, total_s=total)
    if gaps:
        row.update(tokens_per_s=len(prompts) * len(gaps) / sum(gaps),
                   tpot_ms_median=statistics.median(ms(gaps)), tpot_ms_p90=p90(ms(gaps)))
    return row


def hf_reference(model, args, rows, bandwidth):
    """transformers.generate on HF_CASES, each beside the engine (auto) on the same work."""
    device = model.model.embed_tokens.weight.device
    out = []
    hf = None
    try:
        print(f"[{time.perf_counter() - T0:6.1f}s] transformers: building LlamaForCausalLM",
              flush=True)
        hf = hf_model_like(model)
        for label, base, overrides in HF_CASES:
            spec = spec_of(base, args, **overrides)
            program = make_program(spec, model.cfg.vocab_size, seed=args.seed)
            print(f"[{time.perf_counter() - T0:6.1f}s] transformers.generate {label}: {spec}",
                  flush=True)
            try:
                row = dict(label=label, spec=spec, **hf_generate(hf, program, args.steps,
                                                                  args.seed))
            except Exception as e:   # noqa: BLE001 (an OOM must not lose the engine rows)
                traceback.print_exc()
                row = dict(label=label, spec=spec, error=f"{type(e).__name__}: {e}")
                free_memory(device)
            out.append(row)
        del hf
        hf = None
        free_memory(device)
        # the engine on exactly the same work (same prompts, same seed, same steps)
        for row in out:
            same = next((r for r in rows if r["spec"] == row["spec"] and r["attention"] == "auto"
                         and "tpot_ms_median" in r), None)
            if same is None and "error" not in row:
                same = run_case(model, row["label"] if row["label"] in PROGRAMS else
                                row["spec"].split(":")[0], row["spec"], "auto", args, bandwidth)
            if same is not None and "tpot_ms_median" in same:
                row["engine_auto"] = {k: same.get(k) for k in
                                      ("tokens_per_s", "tpot_ms_median", "tpot_ms_p90", "steps")}
                if "tpot_ms_median" in row:
                    row["engine_speedup"] = row["tpot_ms_median"] / same["tpot_ms_median"]
    except Exception as e:   # noqa: BLE001
        traceback.print_exc()
        out.append(dict(label="setup", error=f"{type(e).__name__}: {e}"))
    finally:
        del hf
        free_memory(device)
    return out


def hf_lines(hf_rows):
    lines = []
    for r in hf_rows:
        if "tpot_ms_median" not in r:
            lines.append(f"transformers.generate {r['label']}: {r.get('error', 'no steps')}")
            continue
        line = (f"transformers.generate {r['label']} ({r['spec']}; {r['batch']} sequences of "
                f"{r['prompt_tokens']} prompt tokens, each its own sequence, {r['new_tokens']} new "
                f"tokens, {r['attn_implementation']} attention, "
                f"{'sampled' if r['sampling'].get('do_sample') else 'greedy'}): prefill "
                f"{r['prefill_s']:.2f} s, {r['tokens_per_s']:.0f} tok/s, TPOT "
                f"{r['tpot_ms_median']:.2f} ms (p90 {r['tpot_ms_p90']:.2f})")
        if "engine_auto" in r:
            e = r["engine_auto"]
            line += (f"; engine auto on the same work: {e['tokens_per_s']:.0f} tok/s, TPOT "
                     f"{e['tpot_ms_median']:.2f} ms (transformers TPOT / engine TPOT = "
                     f"{r['engine_speedup']:.2f}x)")
        lines.append(line)
    return lines


# -- main -------------------------------------------------------------------------------

def commit():
    if os.environ.get("TREEATTN_COMMIT"):
        return os.environ["TREEATTN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_and_name(device):
    """The torch device (cuda: the current one) and its name for the report."""
    device = torch.device(device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        return device, torch.cuda.get_device_name(device)
    return device, f"cpu ({platform.processor() or platform.machine()})"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--programs", default=",".join(PROGRAMS),
                   help=f"comma-separated subset of {list(PROGRAMS)}")
    p.add_argument("--attentions", default="auto,per-query",
                   help="attentions to run per program (speed-ups are against per-query)")
    p.add_argument("--steps", type=int, default=None,
                   help="at most this many decode steps per case (default: gen - 1 = 255)")
    p.add_argument("--hf-reference", default="on", choices=["on", "off"])
    add_engine_args(p)
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply the programs' long lengths (prompt, system, doc) by this")
    p.add_argument("--count-scale", type=float, default=1.0,
                   help="multiply the programs' counts (branches, docs, questions, n, seqs)")
    p.add_argument("--bandwidth-bytes", type=int, default=None,
                   help="size of the bandwidth copy (default 2 GiB on cuda, 64 MiB on cpu)")
    args = p.parse_args(argv)
    args.programs = [s for s in args.programs.split(",") if s]
    unknown = [s for s in args.programs if s not in PROGRAMS]
    if unknown:
        p.error(f"--programs: unknown {unknown}; known: {list(PROGRAMS)}")
    args.attentions = [s for s in args.attentions.split(",") if s]
    if args.graphs is None:
        args.graphs = "on" if torch.device(args.device).type == "cuda" else "off"
    return args


def append_case(rows, run, device, **what):
    """rows.append(run()); when it fails, a row of what and the error instead (the traceback
    printed, the device's memory freed), so that one case's failure keeps the others."""
    try:
        rows.append(run())
    except Exception as e:   # noqa: BLE001
        traceback.print_exc()
        rows.append(dict(what, error=f"{type(e).__name__}: {e}"))
        free_memory(device)


def add_engine_args(p):
    """The model and engine options every engine benchmark takes (--graphs None: on for
    cuda, off otherwise; the caller settles it after parsing)."""
    p.add_argument("--model", default="random:llama3-8b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--graphs", default=None, choices=["on", "off"],
                   help="CUDA graphs (default: on for cuda, off otherwise)")
    p.add_argument("--cache", default="auto", choices=["auto", "cpp", "py"])
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="torch.compile the model's elementwise ops (auto: on cuda with Triton)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)


def open_report(args, argv, script, **fields):
    """(device, report, save): the device args.device names (cuda: the current one), the
    report's head (device name, date, commit, the command as typed, args, torch version,
    then fields), and save(), which writes the report to args.out (if given) as JSON."""
    device, name = device_and_name(args.device)
    typed = sys.argv if argv is None else [
        sys.argv[0] if sys.argv[0].endswith(os.path.basename(script)) else script] + list(argv)
    report = dict(device=name, date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"),
                  commit=commit(), command=" ".join(shlex.quote(a) for a in ["python3"] + typed),
                  args=dict(vars(args)), torch=torch.__version__, **fields)

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)
    return device, report, save


T0 = time.perf_counter()
WEIGHTS = KV_TOKEN = 0


def main(argv=None):
    global T0, WEIGHTS, KV_TOKEN
    T0 = time.perf_counter()
    args = parse_args(argv)
    device, report, save = open_report(args, argv, "bench/engine/engine_bench.py", rows=[],
                                       hf_reference=[])
    name = report["device"]
    nbytes = args.bandwidth_bytes or (2 << 30 if device.type == "cuda" else 64 << 20)
    bandwidth = measure_bandwidth(device, nbytes)
    report.update(bandwidth_bytes_per_s=bandwidth, bandwidth_copy_bytes=nbytes)
    print(f"[{time.perf_counter() - T0:6.1f}s] {name}, commit {report['commit']}: bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s (copy of {nbytes >> 20} MiB, read + written)", flush=True)

    model = load_model(args.model, device=device, dtype=args.dtype, seed=args.seed)
    model.use_ops(choose_ops(args.compile, device))
    report["compiled_ops"] = model.ops.compiled
    warm_up(model, args)
    sync(device)
    WEIGHTS, KV_TOKEN = weights_read_bytes(model), kv_bytes_per_token(model)
    report.update(model=args.model, dtype=args.dtype, weights_read_bytes=WEIGHTS,
                  kv_bytes_per_token=KV_TOKEN, weights_floor_ms=WEIGHTS / bandwidth * 1e3)
    print(f"[{time.perf_counter() - T0:6.1f}s] {args.model} {args.dtype}: {WEIGHTS / 1e9:.2f} GB "
          f"of weights read per step ({WEIGHTS / bandwidth * 1e3:.2f} ms at that bandwidth), "
          f"{KV_TOKEN / 1024:.0f} KiB of KV per token", flush=True)

    rows = report["rows"]
    for name_ in args.programs:
        spec = spec_of(name_, args)
        for attention in args.attentions:
            append_case(rows, lambda: run_case(model, name_, spec, attention, args, bandwidth),
                        device, program=name_, spec=spec, attention=attention)
            save()
    ups = speedups(rows)
    report["speedups"] = ups
    report["targets"] = {n: dict(min_speedup=PROGRAMS[n][2],
                                 met=ups.get(n, {}).get("auto", 0) >= PROGRAMS[n][2])
                         for n in args.programs if "auto" in ups.get(n, {})}
    save()

    if args.hf_reference == "on":
        report["hf_reference"] = hf_reference(model, args, rows, bandwidth)
        try:
            import transformers
            report["transformers"] = transformers.__version__
        except ImportError:
            pass
        save()
    report["wall_s"] = time.perf_counter() - T0
    save()

    print()
    print(f"{name}, {args.model} {args.dtype}, graphs {args.graphs}, compiled ops "
          f"{model.ops.compiled}, page size {args.page_size}, "
          f"bandwidth {bandwidth / 1e9:.0f} GB/s, commit {report['commit']}")
    print(table([r for r in rows if r["program"] in PROGRAMS], ups))
    for line in hf_lines(report["hf_reference"]):
        print(line)
    print(f"wall {report['wall_s']:.0f} s" + (f"; JSON: {args.out}" if args.out else ""))
    failed = [r for r in rows + report["hf_reference"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
