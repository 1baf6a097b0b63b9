"""python -m treeattn.engine: run a tree program (shared prompt, two-level sharing, few-shot,
parallel sampling, independent sequences, tree-of-thoughts) on a Llama-family model and
report tokens/s, TPOT (median, p90) and the attention share of a decode step; or speculative
decoding with token trees (spec:...), reporting the drafts accepted per step and tokens/s."""
import argparse
import json
import sys

import numpy as np
import torch

from . import build_engine, load_model, make_program
from .errors import InputError
from .kv import max_kv_tokens
from .ops import choose_ops
from .programs import KINDS
from .tot import TOT_KINDS, is_tot_spec, make_tot_program, run_tot


def _at_least(lo):
    """argparse type: an int >= lo (the error names the value and the bound)."""
    def parse(text):
        value = int(text)
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {value}")
        return value
    parse.__name__ = f"int >= {lo}"
    return parse


def _seed(text):
    """argparse type: a seed that numpy (>= 0) and torch (< 2**64) both take."""
    value = int(text)
    if not 0 <= value < 2 ** 64:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {2 ** 64 - 1}], got {value}")
    return value


def build_parser():
    p = argparse.ArgumentParser(prog="python -m treeattn.engine", description=__doc__)
    p.add_argument("--model", default="random:tiny",
                   help="Hugging Face folder or random:NAME (tiny, llama3-8b, qwen2.5-7b)")
    p.add_argument("--program", default="shared:prompt=4000,branches=64,gen=256",
                   help=f"KIND:key=value,... with KIND in {sorted(KINDS)}; all take gen, "
                        "temperature, top_p, top_k; or tree-of-thoughts, KIND in "
                        f"{sorted(TOT_KINDS)}: tot:file=RECORDED.json,tasks=N,scale=S,"
                        "max_steps=M (a recorded schedule) or tot-live:prompt=P,tasks=N,"
                        "rounds=R,width=W,k=K,budget=B (prune by log-probability); or "
                        "speculative decoding: spec:prompt=4000,requests=8,question=16,"
                        "repeat=0,gen=128,tree=FILE|WxD,ngram=3,fill=0")
    p.add_argument("--attention", default="auto",
                   help="torch-ref (PyTorch reference), auto, per-query or a treeattn planner")
    p.add_argument("--cache", default="auto", choices=["auto", "cpp", "py"])
    p.add_argument("--steps", type=_at_least(0), default=None, help="at most this many decode steps")
    p.add_argument("--graphs", default="off", choices=["on", "off"])
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="torch.compile the elementwise ops into one kernel each "
                        "(auto: on a CUDA device with Triton)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--page-size", type=_at_least(1), default=16)
    p.add_argument("--num-pages", type=_at_least(2), default=None,
                   help="KV pool pages, the last one scratch (default: what the program needs, "
                        "plus 10%%)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def pages_needed(program, page_size):
    """Unique whole prompt pages (page-aligned prefixes hashed incrementally) plus, per
    sequence, its leftover, generated tokens and one page of slack; plus the scratch page."""
    seen, pages = set(), 0
    for prompt in program.prompts:
        h = 0
        for i in range(len(prompt) // page_size):
            h = hash((h, tuple(prompt[i * page_size:(i + 1) * page_size])))
            if h not in seen:
                seen.add(h)
                pages += 1
    sequences = len(program.prompts) * program.samples
    pages += sequences * (-(-(program.gen + page_size) // page_size) + 1)
    return int(pages * 1.1) + 2


class Progress:
    """A bar redrawn in place on a terminal; a plain line every 10% otherwise."""

    def __init__(self, stream=None):
        stream = sys.stderr if stream is None else stream   # the one at call time, not at import
        self.stream, self.tty = stream, stream.isatty()

    def __call__(self, done, total):
        if self.tty:
            filled = 40 * done // max(total, 1)
            self.stream.write(f"\rdecode [{'#' * filled}{'.' * (40 - filled)}] {done}/{total}")
            if done == total:
                self.stream.write("\n")
        elif done == total or done % max(1, total // 10) == 0:
            self.stream.write(f"decode step {done}/{total}\n")
        self.stream.flush()


def check_device(parser, name):
    """--device: a device this PyTorch has (torch's own errors are an AssertionError or a
    list of every device type it knows)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        parser.error(f"--device {name}: not a device (cpu, cuda, cuda:N)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            parser.error(f"--device {name}: no CUDA device in this PyTorch ({torch.__version__})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            parser.error(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        parser.error(f"--device {name}: the engine runs on cpu or cuda")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    try:
        return run(args)
    except InputError as e:   # bad input or a refused request, named by the check that found it
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def run(args):
    torch.manual_seed(args.seed)
    model = load_model(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    model.use_ops(choose_ops(args.compile, args.device))
    kind = args.program.partition(":")[0]   # "KIND" alone takes the kind's defaults
    if kind == "spec":
        from .speculative import run_cli
        return print_report(run_cli(args, model), args.json)
    if kind not in KINDS and not is_tot_spec(args.program):
        raise InputError(f"--program: unknown kind {kind!r} in {args.program!r}; "
                         f"known: {sorted([*KINDS, *TOT_KINDS, 'spec'])}")
    kv_capacity = max_kv_tokens(model)
    if is_tot_spec(args.program):
        program = make_tot_program(args.program, model.cfg.vocab_size, seed=args.seed,
                                   max_kv_tokens=kv_capacity)
        num_pages = args.num_pages or program.pages_needed(args.page_size)
        max_batch = program.max_batch
    else:
        program = make_program(args.program, model.cfg.vocab_size, seed=args.seed,
                               max_kv_tokens=kv_capacity)
        num_pages = args.num_pages or pages_needed(program, args.page_size)
        max_batch = len(program.prompts) * program.samples
    engine = build_engine(model, args.attention, args.cache, args.page_size, num_pages,
                          max_batch=max_batch, graphs=args.graphs == "on")
    if is_tot_spec(args.program):
        result = run_tot(engine, program, seed=args.seed, max_steps=args.steps,
                         time_attention=True, on_step=Progress())
    else:
        from .programs import run_program
        result = run_program(engine, program, seed=args.seed, steps=args.steps,
                             time_attention=True, on_step=Progress())
    report = dict(model=args.model, program=args.program, attention=args.attention,
                  graphs=args.graphs, compiled=model.ops.compiled, device=str(engine.device),
                  dtype=args.dtype, page_size=args.page_size, num_pages=num_pages,
                  max_batch=max_batch, **result.summary())
    print_report(report, args.json)


def print_report(report, as_json):
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:>16}: {value:.4g}" if isinstance(value, float) else f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
