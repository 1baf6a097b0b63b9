"""Tree programs: the batches whose prefixes are shared, parsed from a spec such as
"shared:prompt=4000,branches=64,gen=256", and run_program(), the prefill + decode loop that
runs one on an Engine and records what the CLI reports (and the logits tests compare)."""
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .engine import is_int
from .errors import InputError, check_program_size
from .sampling import SamplingParams, sample

# kind -> default parameters; every kind also takes gen, temperature, top_p, top_k
KINDS = {
    "shared": dict(prompt=4000, branches=64, question=16),                    # one prompt, branches
    "two-level": dict(system=1000, docs=8, doc=2000, questions=8, question=16),
    "fewshot": dict(shots=8, shot=250, questions=64, question=32),           # FastTree few-shot
    "sample": dict(prompt=2000, n=16),                                        # parallel sampling
    "independent": dict(seqs=64, prompt=2000),                                # no sharing
}
COMMON = dict(gen=256, temperature=0.0, top_p=1.0, top_k=0)
# parameters that count prompts or sequences (>= 1); every other integer is a length (>= 0)
COUNTS = {"branches", "docs", "questions", "shots", "n", "seqs"}


@dataclass
class Program:
    kind: str
    prompts: list            # token lists; shared prefixes are found by the radix cache
    samples: int             # sequences forked from each prompt
    gen: int                 # tokens generated per sequence
    sampling: SamplingParams


def parse_spec(spec: str) -> tuple:
    kind, _, rest = spec.partition(":")
    if kind not in KINDS:
        raise InputError(f"program: unknown kind {kind!r} in {spec!r}; known: {sorted(KINDS)}")
    params = dict(KINDS[kind], **COMMON)
    if kind == "sample":
        params["temperature"] = 1.0
    params = parse_params(kind, rest, params)
    if params["gen"] < 1:
        raise InputError(f"program: gen={params['gen']} must be >= 1")
    for key in COUNTS & params.keys():
        if params[key] < 1:
            raise InputError(f"program: {key}={params[key]} must be >= 1 (it counts prompts or sequences)")
    return kind, params


def parse_params(kind: str, rest: str, defaults: dict) -> dict:
    """"key=value,..." over defaults: only their keys, each value of its default's type."""
    params = dict(defaults)
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in params:
            raise InputError(f"program: bad parameter {item!r} for {kind!r}; "
                             f"known: {sorted(params)}")
        try:
            params[key] = type(params[key])(value)
        except ValueError as e:
            raise InputError(f"program: {key}={value!r} is not a {type(params[key]).__name__}") from e
        if type(params[key]) is int and params[key] < 0:
            raise InputError(f"program: {key}={value} must be >= 0")
    return params


def prompt_sizes(kind: str, p: dict) -> tuple:
    """(token ids the prompts' lists hold, plus one per prompt; distinct prompt tokens, the
    KV tokens the sequences hold at least) of a tree program, from its parameters."""
    if kind == "shared":
        return p["branches"] * (p["prompt"] + p["question"] + 1), p["prompt"] + p["branches"] * p["question"]
    if kind == "two-level":
        prompts = p["docs"] * p["questions"]
        return (prompts * (p["system"] + p["doc"] + p["question"] + 1),
                p["system"] + p["docs"] * p["doc"] + prompts * p["question"])
    if kind == "fewshot":
        shots = p["shots"] * p["shot"]
        return p["questions"] * (shots + p["question"] + 1), shots + p["questions"] * p["question"]
    if kind == "sample":
        return p["prompt"] + 1, p["prompt"]
    return p["seqs"] * (p["prompt"] + 1), p["seqs"] * p["prompt"]


def make_program(spec: str, vocab_size: int, seed: int = 0, max_kv_tokens: int = None) -> Program:
    """Random token ids (seeded); distinct segments so only the intended prefixes match.
    The sizes are checked first (errors.check_program_size; max_kv_tokens: the most KV
    tokens the device holds, kv.max_kv_tokens)."""
    if not isinstance(spec, str):
        raise TypeError(f"spec: expected a program spec (str), got {type(spec).__name__}")
    kind, p = parse_spec(spec)
    # token ids are int32 in the radix cache
    if not is_int(vocab_size) or not 1 <= vocab_size < 2**31:
        raise ValueError(f"vocab_size = {vocab_size!r}: expected an int in [1, 2**31)")
    _check_seed(seed)
    check_program_size(f"program {spec!r}", *prompt_sizes(kind, p), max_kv_tokens)
    if kind == "sample":   # fork() copies the prompt's token list into each of the n samples
        check_program_size(f"program {spec!r}", p["n"] * (p["prompt"] + 1), 0)
    rng = np.random.default_rng(seed)
    rand = lambda n: rng.integers(0, vocab_size, n).tolist()
    samples = 1
    if kind == "shared":
        prompt = rand(p["prompt"])
        prompts = [prompt + rand(p["question"]) for _ in range(p["branches"])]
    elif kind == "two-level":
        system = rand(p["system"])
        prompts = []
        for _ in range(p["docs"]):
            doc = system + rand(p["doc"])
            prompts += [doc + rand(p["question"]) for _ in range(p["questions"])]
    elif kind == "fewshot":
        shots = [t for _ in range(p["shots"]) for t in rand(p["shot"])]
        prompts = [shots + rand(p["question"]) for _ in range(p["questions"])]
    elif kind == "sample":
        prompts, samples = [rand(p["prompt"])], p["n"]
    else:
        prompts = [rand(p["prompt"]) for _ in range(p["seqs"])]
    sampling = SamplingParams(p["temperature"], p["top_p"], p["top_k"])
    return Program(kind, prompts, samples, p["gen"], sampling)


@dataclass
class RunResult:
    seqs: list
    prefill_seconds: float
    step_seconds: list = field(default_factory=list)
    attention_seconds: list = field(default_factory=list)
    batch_sizes: list = field(default_factory=list)
    logits: list = None      # per sequence: [gen, vocab] fp32 CPU rows, when recorded

    def summary(self) -> dict:
        steps = self.step_seconds
        total = sum(steps)
        out = dict(steps=len(steps), sequences=len(self.seqs),
                   prefill_s=round(self.prefill_seconds, 4))
        if steps:
            ms = sorted(s * 1e3 for s in steps)
            out.update(tokens_per_s=sum(self.batch_sizes) / total,
                       tpot_ms_median=statistics.median(ms),
                       tpot_ms_p90=ms[min(len(ms) - 1, int(0.9 * len(ms)))])
        if self.attention_seconds:
            out["attention_share"] = sum(self.attention_seconds) / total
        return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _check_seed(seed):
    """A generator seed: an int in [0, 2**63)."""
    if not is_int(seed):
        raise TypeError(f"seed: expected an int, got {seed!r}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed = {seed}: expected an int in [0, 2**63)")


def release_all(engine, seqs):
    """Release every sequence (without publishing), going on past one that fails: what a
    run does with its sequences when it stops on an error."""
    for s in seqs:
        try:
            engine.release(s, publish=False)
        except Exception:   # already released, or the cache refuses: the others still go
            pass


def run_program(engine, program, seed=0, steps=None, record_logits=False,
                time_attention=False, on_step=None) -> RunResult:
    """Prefill every prompt (forking samples), then decode all sequences together for
    min(gen - 1, steps) steps: each step samples one token per sequence."""
    if not isinstance(program, Program):
        raise TypeError(f"program: expected a Program (make_program()), got {type(program).__name__}")
    _check_seed(seed)
    gen = torch.Generator(device=engine.device).manual_seed(int(seed))
    seqs, logits_rows = [], []
    try:  # on an error the sequences made so far are released: their pages are not lost
        _sync(engine.device)
        started = time.perf_counter()
        for prompt in program.prompts:
            seq, logits = engine.add(prompt)
            seqs.append(seq)
            group = engine.fork(seq, program.samples) if program.samples > 1 else [seq]
            seqs[-1:] = group   # seq itself, or its children (fork consumed it)
            batch = logits[None].expand(len(group), -1)
            firsts = sample(batch, program.sampling, gen, engine.model.ops.race)
            for s, tok in zip(group, firsts.tolist()):
                s.tokens.append(tok)
                logits_rows.append([logits.cpu()] if record_logits else None)
        _sync(engine.device)
        result = RunResult(seqs, time.perf_counter() - started)
        num_steps = program.gen - 1 if steps is None else min(steps, program.gen - 1)
        graphs = getattr(engine, "graphs", None)
        if graphs is not None and seqs and num_steps > 0:
            engine.prepare(seqs)   # the first step's plan and its graph, outside the timed steps
        for step in range(num_steps):
            _sync(engine.device)   # a no-op after the last step's token read: nothing is queued
            # a step: from the previous step's tokens being on the host (the step's inputs) to
            # this step's tokens being on the host and appended; host work for the next step
            # done meanwhile counts here, the instrumentation below (attention timing,
            # logits rows, on_step) does not
            started = time.perf_counter()
            logits = engine.decode(seqs, time_attention=time_attention)
            # on the device: queued, no sync
            tokens = sample(logits, program.sampling, gen, engine.model.ops.race)
            if step + 1 < num_steps:
                # the next step's slots, forest and attention plan, while this one runs on the
                # GPU: they depend on the tree's shape only, not on the tokens being sampled
                engine.prepare(seqs)
            tokens = tokens.tolist()   # the step's one host sync: every sampled id in one copy
            for s, tok in zip(seqs, tokens):
                s.tokens.append(tok)
            result.step_seconds.append(time.perf_counter() - started)
            result.batch_sizes.append(len(seqs))
            if time_attention:
                result.attention_seconds.append(engine.attention_seconds(len(seqs)))
            if record_logits:
                for i in range(len(seqs)):
                    logits_rows[i].append(logits[i].cpu())
            if on_step:
                on_step(step + 1, num_steps)
    except BaseException:
        release_all(engine, seqs)
        raise
    if record_logits:
        result.logits = [torch.stack(rows) for rows in logits_rows]
    return result
