"""Speculative decoding with token trees on the engine: every request's draft tree (see
drafting.py) is verified in one forward pass, all requests in one attention plan.

A verification step of sequences s_1..s_B with drafts d_1..d_B:
- queries: the B pending tokens (tokens[kv_len], as in a plain decode step), then every
  draft token; one model forward over all of them;
- KV rows: the pending token at its usual slot (tail offset kv_len - cached_len), draft j of
  a request at the slots right after it (offset + 1 + j), so drafts in preorder put the
  top-ranked path where an accepted path must end up; position kv_len + depth(j);
- attention: one plan_tree_queries over the forest of the requests' cached radix paths and
  tail nodes (shared prompts are one subtree) with draft j a one-token node under the
  request's tail node or under its draft parent: it sees the prefix, its draft ancestors
  and itself;
- greedy acceptance: from the pending token, follow the child whose token is the model's
  argmax, as long as there is one: accepted drafts a_1..a_m, then the bonus token (argmax
  after a_m). kv_len advances by 1 + m; a_k's KV row moves to offset kv_len + k only where
  it is not there already (exact: its RoPE position already is kv_len + k); the other
  drafts' rows are forgotten and the tail pages past the new kv_len freed.
With engine.graphs, a verification step replays the decode step's CUDA graph of the bucket
of its token count (pending tokens + drafts, padded); eager otherwise."""
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .contexts import DecodeContext
from .drafting import NgramIndex, check_parents, default_workloads, draft_tree, load_topology
from .engine import _check_live, _repeated
from .errors import InputError, check_program_size
from .kv import max_kv_tokens
from .programs import Program, parse_params, release_all
from .sampling import SamplingParams

SPEC_DEFAULTS = dict(prompt=4000, requests=8, question=16, repeat=0, gen=128,
                     tree="APPS_tree_size64.json", ngram=3, fill=0)


@dataclass
class Verified:
    """What verify() appended to each sequence: tokens[i] (accepted drafts, then the
    bonus token, which is the new pending one) and accepted[i] = len(tokens[i]) - 1;
    logits[i] [1 + drafts, vocab] (the pending token's row, then the drafts') when asked.
    The step's attention time, when timed: engine.attention_seconds(queries) afterwards
    (with CUDA graphs that runs the attention once more, so it is not part of verify())."""
    tokens: list
    accepted: list
    logits: list = None


def _check_drafts(engine, seqs, drafts):
    if not 0 < len(seqs) <= engine.max_batch:
        raise ValueError(f"seqs: expected 1..max_batch={engine.max_batch} sequences, "
                         f"got {len(seqs)}")
    if len(drafts) != len(seqs):
        raise ValueError(f"drafts: expected one per sequence ({len(seqs)}), got {len(drafts)}")
    repeated = _repeated(seqs)
    if repeated is not None:
        raise ValueError(f"seqs[{repeated[1]}] is seqs[{repeated[0]}]: a sequence is verified once a step")
    _check_live(seqs)
    total = len(seqs) + sum(len(d.tokens) for d in drafts)
    if total > engine.max_tokens:
        raise ValueError(f"drafts: {len(seqs)} pending tokens + {total - len(seqs)} drafts "
                         f"exceed the engine's max_tokens = max_batch + max_drafts = "
                         f"{engine.max_tokens}")
    vocab, window = engine.model.cfg.vocab_size, engine.model.cfg.sliding_window
    depths = []
    for i, d in enumerate(drafts):
        parents = check_parents(d.parents, f"drafts[{i}].parents")
        if len(d.tokens) != len(parents):
            raise ValueError(f"drafts[{i}].tokens: {len(d.tokens)} tokens for "
                             f"{len(parents)} parents")
        bad = [t for t in d.tokens if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"drafts[{i}].tokens: {bad[0]} is outside the vocabulary "
                             f"[0, {vocab})")
        depth = []
        for p in parents:                      # parents first: depth[p] is known
            depth.append(1 + (depth[p] if p >= 0 else 0))
        if window and depth and seqs[i].kv_len + max(depth) >= window:
            raise ValueError(f"drafts[{i}]: positions up to {seqs[i].kv_len + max(depth)} "
                             f"exceed the model's sliding_window {window}")
        depths.append(depth)
    return depths


def verify(engine, seqs, drafts, time_attention=False, return_logits=False):
    """One speculative step (see the module's doc): returns Verified. On an error (bad
    drafts, cache full, capacity) nothing changes: the pages reserved are freed."""
    depths = _check_drafts(engine, seqs, drafts)
    tails = [len(s.tail) for s in seqs]
    try:
        for i, (s, d) in enumerate(zip(seqs, drafts)):
            engine.reserve(s, s.kv_len + 1 + len(d), f"drafts[{i}]")
        logits, first, draft_rows = _forward(engine, seqs, drafts, depths, time_attention)
        greedy = logits.argmax(-1).tolist()     # the step's one host sync
    except BaseException:
        for s, n in zip(seqs, tails):
            engine.trim_tail(s, n)
        raise
    out = Verified([], [], [] if return_logits else None)
    src, dst = [], []
    # first: the logits row of the request's first draft
    for b, (s, d, rows) in enumerate(zip(seqs, drafts, draft_rows)):
        path = _accept(d, greedy[b], greedy[first:first + len(d)])
        tokens = [d.tokens[j] for j in path]
        tokens.append(greedy[first + path[-1]] if path else greedy[b])
        # the k-th accepted draft (0-based) must end up at offset kv_len + 1 + k, the slot
        # of draft k: it sits at draft path[k] >= k (its k ancestors come before it)
        for k, j in enumerate(path):
            if j != k:
                src.append(rows[j])
                dst.append(rows[k])
        if return_logits:
            out.logits.append(logits[[b] + list(range(first, first + len(d)))].cpu())
        s.tokens += tokens
        s.kv_len += len(tokens)                 # the pending token and the accepted drafts
        out.tokens.append(tokens)
        out.accepted.append(len(path))
        first += len(d)
    if src:
        engine.kv.copy_rows(torch.tensor(src, device=engine.device),
                            torch.tensor(dst, device=engine.device))
    for s in seqs:   # pages past the KV rows: the next step reserves what it needs
        engine.trim_tail(s, -(-(s.kv_len - s.cached_len) // engine.page_size))
    return out


def _accept(draft, first_choice, draft_choices):
    """The longest path of drafts whose tokens are the model's greedy choices: from the
    pending token (choice first_choice), a child with the chosen token, then its child with
    its own choice (draft_choices[j] after draft j), and so on. Returns draft indices."""
    child = {}
    for j, (token, parent) in enumerate(zip(draft.tokens, draft.parents)):
        child.setdefault((parent, token), j)   # the first of equal siblings
    path, node, choice = [], -1, first_choice
    while (node, choice) in child:
        node = child[(node, choice)]
        path.append(node)
        choice = draft_choices[node]
    return path


def _forward(engine, seqs, drafts, depths, time_attention):
    """Plan the step's tree queries and run the model over the pending tokens and the
    drafts: eagerly, or (engine.graphs) by replaying the graph of the bucket of their token
    count, the padding queries between the pending tokens and the drafts (plan_tree_queries
    lists query_nodes, padding included, before the drafts). Returns (logits, the logits
    row of the first draft, per request its drafts' pool rows)."""
    b = len(seqs)
    sizes = [len(d) for d in drafts]
    total = b + sum(sizes)
    bucket = engine._bucket(total)
    pad = 0 if bucket is None else bucket - total
    parents, ntok, offsets, pages, queries = engine.forest(seqs, b + pad if pad else None)
    tail_nodes = queries[:b]
    inputs = engine._inputs()            # host staging: ids, positions, slots
    inputs[0, :b] = [s.tokens[s.kv_len] for s in seqs]
    inputs[1, :b] = [s.kv_len for s in seqs]
    inputs[2, :b] = [engine.host_rows(s, s.kv_len, s.kv_len + 1)[0] for s in seqs]
    if pad:
        engine.graphs.pad(inputs, b, b + pad)
    draft_parents, draft_rows, first = [], [], 0
    for s, d, depth in zip(seqs, drafts, depths):
        rows = engine.host_rows(s, s.kv_len + 1, s.kv_len + 1 + len(d))
        at = slice(b + pad + first, b + pad + first + len(d))
        inputs[0, at] = d.tokens
        inputs[1, at] = s.kv_len + np.asarray(depth, dtype=np.int64)
        inputs[2, at] = rows
        draft_parents += [first + p if p >= 0 else -1 for p in d.parents]
        draft_rows.append(rows)
        first += len(d)
    engine.drop_prepared()               # this replaces the backend's plan
    engine.attention.plan_tree_queries(
        parents, ntok, offsets, pages, queries,
        draft_nodes=np.repeat(tail_nodes, sizes).astype(np.int32),
        draft_parents=np.asarray(draft_parents, dtype=np.int32),
        draft_rows=np.concatenate(draft_rows) if draft_rows else np.zeros(0, np.int64))
    if bucket is not None:
        return engine.graphs.replay(bucket), b + pad, draft_rows
    engine.timer.reset()
    ctx = DecodeContext(engine.attention, engine.timer if time_attention else None)
    t = engine._upload()
    return engine.model(t[0, :total], t[1, :total], t[2, :total], engine.kv, ctx), b, draft_rows


# -- programs -----------------------------------------------------------------------------

@dataclass
class SpecProgram:
    program: Program          # prompts and gen; greedy sampling
    tree: str                 # WxD or a Medusa topology file
    ngram: int                # longest n-gram looked up
    fill: bool                # fill the whole topology (acceptance-independent timing)


def parse_spec_program(spec, vocab_size, seed=0, workloads=None, max_kv_tokens=None):
    """spec:prompt=4000,requests=8,question=16,repeat=0,gen=128,tree=PATH|WxD,ngram=3,fill=0.
    requests share a `prompt`-token prompt, each with its own `question` tokens; repeat=R
    makes the prompt a random R-token segment repeated (so n-gram drafts get accepted);
    a tree file not found as given is looked up in the folder `workloads` too (the CLI:
    $TREEATTN_WORKLOADS, else the repository's data/workloads). The prompts' sizes are
    checked before they are made (errors.check_program_size; max_kv_tokens: the most KV
    tokens the device holds, kv.max_kv_tokens)."""
    kind, _, rest = spec.partition(":")
    if kind != "spec":
        raise InputError(f"program: expected spec:..., got {spec!r}")
    p = parse_params("spec", rest, dict(SPEC_DEFAULTS))
    if p["gen"] < 1 or p["requests"] < 1 or p["prompt"] < 1 or p["ngram"] < 1:
        raise InputError(f"program: gen, requests, prompt and ngram must be >= 1 in {spec!r}")
    tree = p["tree"]
    if workloads and not os.path.exists(tree) and os.path.exists(os.path.join(workloads, tree)):
        tree = os.path.join(workloads, tree)
    check_program_size(f"program {spec!r}", p["requests"] * (p["prompt"] + p["question"] + 1),
                       p["prompt"] + p["requests"] * p["question"], max_kv_tokens)
    rng = np.random.default_rng(seed)
    if p["repeat"] > 0:
        segment = rng.integers(0, vocab_size, p["repeat"])
        prompt = np.resize(segment, p["prompt"]).tolist()
    else:
        prompt = rng.integers(0, vocab_size, p["prompt"]).tolist()
    prompts = [prompt + rng.integers(0, vocab_size, p["question"]).tolist()
               for _ in range(p["requests"])]
    program = Program("spec", prompts, 1, p["gen"], SamplingParams(0.0, 1.0, 0))
    return SpecProgram(program, tree, p["ngram"], bool(p["fill"]))


@dataclass
class SpecResult:
    seqs: list
    prefill_seconds: float
    step_seconds: list = field(default_factory=list)     # drafting + verification
    verify_seconds: list = field(default_factory=list)
    attention_seconds: list = field(default_factory=list)
    accepted: list = field(default_factory=list)         # per step: drafts accepted per request
    drafted: list = field(default_factory=list)          # per step: draft tokens per request
    logits: list = None       # per step (active requests, drafts, Verified.logits), when recorded

    def summary(self):
        total = sum(self.step_seconds)
        tokens = sum(len(a) + sum(a) for a in self.accepted)   # + 1 bonus per request
        out = dict(steps=len(self.step_seconds), sequences=len(self.seqs),
                   prefill_s=round(self.prefill_seconds, 4))
        if self.step_seconds:
            out.update(tokens_per_s=tokens / total,
                       tokens_per_request_step=tokens / sum(len(a) for a in self.accepted),
                       drafts_per_request_step=sum(map(sum, self.drafted))
                       / sum(len(a) for a in self.accepted),
                       step_ms_median=statistics.median(self.step_seconds) * 1e3,
                       verify_ms_median=statistics.median(self.verify_seconds) * 1e3)
        if self.attention_seconds:
            out["verify_attention_ms_median"] = statistics.median(self.attention_seconds) * 1e3
        return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_speculative(engine, spec, steps=None, time_attention=False, on_step=None,
                    record_logits=False):
    """Prefill every prompt (first token: greedy), then speculative steps until every
    request has spec.program.gen tokens (drafts never go past that) or `steps` steps."""
    topology = load_topology(spec.tree)
    gen = spec.program.gen
    _sync(engine.device)
    started = time.perf_counter()
    seqs = []
    try:  # on an error the sequences made so far are released: their pages are not lost
        for prompt in spec.program.prompts:
            seq, logits = engine.add(prompt)
            seqs.append(seq)
            seq.tokens.append(int(logits.argmax()))
        indexes = [NgramIndex(s.tokens, spec.ngram) for s in seqs]
        _sync(engine.device)
        result = SpecResult(seqs, time.perf_counter() - started)
        if record_logits:
            result.logits = []
        while steps is None or len(result.step_seconds) < steps:
            active = [i for i, s in enumerate(seqs) if len(s.tokens) - s.prompt_len < gen]
            if not active:
                break
            _sync(engine.device)
            started = time.perf_counter()
            drafts = [draft_tree(topology, indexes[i],
                                 max_depth=gen - (len(seqs[i].tokens) - seqs[i].prompt_len) - 1,
                                 fill=spec.fill) for i in active]
            drafted = time.perf_counter()
            out = verify(engine, [seqs[i] for i in active], drafts, time_attention=time_attention,
                         return_logits=record_logits)
            for i, tokens in zip(active, out.tokens):
                indexes[i].extend(tokens)
            done = time.perf_counter()
            result.step_seconds.append(done - started)
            result.verify_seconds.append(done - drafted)
            result.accepted.append(out.accepted)
            result.drafted.append([len(d) for d in drafts])
            if time_attention:   # instrumentation, off the clock (graphs: the attention runs again)
                result.attention_seconds.append(engine.attention_seconds(len(active) + sum(map(len, drafts))))
            if record_logits:
                result.logits.append((active, drafts, out.logits))
            if on_step:
                on_step(len(result.step_seconds), out)
    except BaseException:
        release_all(engine, seqs)
        raise
    return result


def run_cli(args, model):
    """python -m treeattn.engine --program spec:...: prints the drafts accepted per request
    at each step (stderr) and returns the report."""
    spec = parse_spec_program(args.program, model.cfg.vocab_size, args.seed, default_workloads(),
                              max_kv_tokens(model))
    max_draft = len(load_topology(spec.tree))
    requests = len(spec.program.prompts)
    num_pages = args.num_pages or spec_pages_needed(spec, args.page_size, max_draft)
    from . import build_engine   # the package's factory (the package imports this lazily)
    engine = build_engine(model, args.attention, args.cache, args.page_size, num_pages,
                          max_batch=requests, max_drafts=requests * max_draft,
                          graphs=args.graphs == "on")

    def on_step(step, out):
        print(f"step {step}: accepted {out.accepted}", file=sys.stderr)
    result = run_speculative(engine, spec, steps=args.steps, time_attention=True,
                             on_step=on_step)
    return dict(model=args.model, program=args.program, tree=spec.tree, tree_size=max_draft,
                attention=args.attention, graphs=args.graphs,
                device=str(engine.device), dtype=args.dtype, page_size=args.page_size,
                num_pages=num_pages, **result.summary())


def spec_pages_needed(spec, page_size, max_draft):
    """The prompts' common prefix in whole pages once; per request the rest of its prompt,
    its generated tokens, its largest draft and a page of slack; plus 10 % and the scratch
    page."""
    prompts = spec.program.prompts
    common = 0
    while all(len(p) > common and p[common] == prompts[0][common] for p in prompts):
        common += 1
    shared = common // page_size
    rest = max(len(p) for p in prompts) - shared * page_size + spec.program.gen + max_draft + 1
    return int((shared + len(prompts) * (-(-rest // page_size) + 1)) * 1.1) + 2
